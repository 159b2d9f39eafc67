#include "bench_buffers.h"

#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/log.h"
#include "longtune/tensor.h"

void *lt_bench_rand_buf(lt_ctx *ctx, const lt_backend *be, int64_t n, lt_dtype dt, float amp, uint64_t *s,
                        const char *what) {
    const int bf16 = dt == LT_DTYPE_BF16;
    if (!bf16 && dt != LT_DTYPE_F32) {
        lt_error(ctx, LT_ERR_INVALID_ARG, "%s: random buffers are f32 or bf16, not %s", what, lt_dtype_name(dt));
        return NULL;
    }
    const size_t bytes = (size_t)n * (bf16 ? 2 : 4);
    void *h = malloc(bytes), *d = lt_alloc(ctx, be->device, bytes, what);
    if (!h || !d) {
        free(h);
        if (d) {
            lt_free(ctx, be->device, d, bytes);
            lt_error(ctx, LT_ERR_OOM, "%s: %zu bytes of host staging", what, bytes);
        }
        return NULL;
    }
    if (amp == 0.0f) memset(h, 0, bytes);
    else
        for (int64_t i = 0; i < n; i++) {
            const float v = lt_bench_unif(s, amp);
            if (bf16) ((uint16_t *)h)[i] = lt_f32_to_bf16(v);
            else ((float *)h)[i] = v;
        }
    const lt_status st = be->copy_to_device(ctx, d, h, bytes);
    free(h);
    if (st != LT_OK) {
        lt_free(ctx, be->device, d, bytes);
        return NULL;
    }
    return d;
}
