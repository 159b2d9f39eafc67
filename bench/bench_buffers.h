/* Random operand buffers of the op-level benches (matmul, lora, grouped_lora): values uniform in
 * [-amp, amp) from the benches' seeded generator, made on the host and copied into a backend's
 * memory through its op table. */
#ifndef LT_BENCH_BUFFERS_H
#define LT_BENCH_BUFFERS_H

#include <stdint.h>

#include "backend/backend.h"
#include "bench_lib.h"

/* One value uniform in [-amp, amp) from lt_bench_rand_u64's stream. */
static inline float lt_bench_unif(uint64_t *s, float amp) {
    return amp * (float)((double)(lt_bench_rand_u64(s) >> 11) * 0x1.0p-52 - 1.0);
}

/* n values of dt (LT_DTYPE_F32 or LT_DTYPE_BF16) uniform in [-amp, amp), zeros for amp 0, in
 * be's memory, accounted as `what`; NULL with the context's error when allocating or copying
 * fails. Free with lt_free(ctx, be->device, p, n * lt_dtype_size(dt)). */
void *lt_bench_rand_buf(lt_ctx *ctx, const lt_backend *be, int64_t n, lt_dtype dt, float amp, uint64_t *s,
                        const char *what);

#endif
