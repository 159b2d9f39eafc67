/* The host-side inputs of `longtune bench grouped` (bench_grouped_inputs.c): the random routing, the
 * activations and the stacked expert weights in any dtype, made on all threads with every row from
 * its own seeded generator, so the bytes do not depend on the thread count. Nothing here touches a
 * device, so the setup is timed and tested on any build. */
#ifndef LT_BENCH_GROUPED_H
#define LT_BENCH_GROUPED_H

#include <stdint.h>

#include "longtune/tensor.h"

/* Distinct random weight rows a stacked weight is made of; the E·out rows repeat them (row r is pool
 * row r mod this). The kernels' time does not depend on the values, and encoding 1024 rows instead
 * of E·out keeps the K-quant encoders (about a microsecond a weight) out of the setup. */
#define LT_BENCH_GROUPED_POOL_ROWS 1024

/* Routes each of n tokens to k distinct experts of E at random (1 <= k <= E, k <= 64) and writes the
 * grouped offsets off (E + 1): expert e's rows are [off[e], off[e + 1]), off[E] = n·k. */
void lt_bench_grouped_route(int64_t n, int64_t E, int64_t k, uint64_t seed, int32_t *off);

/* rows × cols values amp·(2u − 1), u uniform in [0, 1), into f32 (may be NULL) and the same values
 * rounded into bf16 (may be NULL), on up to `threads` threads (0 = the OpenMP default). */
void lt_bench_grouped_fill(float *f32, uint16_t *bf16, int64_t rows, int64_t cols, float amp, uint64_t seed,
                           int threads);

/* 1 when lt_bench_grouped_weight can make weights of dtype dt: the float dtypes and every block format
 * (the two without an encoder, IQ4_NL and IQ4_XS, from random levels and a fixed scale). */
int lt_bench_grouped_dtype_ok(lt_dtype dt);

/* The stacked weights (rows, in) in dtype dt into h (rows · lt_dtype_row_bytes(dt, in) bytes), of
 * scale 0.05: LT_BENCH_GROUPED_POOL_ROWS random rows encoded on all threads, repeated over the rows.
 * Returns 0, or -1 when dt fails lt_bench_grouped_dtype_ok, in is not a whole number of its blocks
 * or the pool cannot be allocated. */
int lt_bench_grouped_weight(lt_dtype dt, int64_t rows, int64_t in, uint64_t seed, int threads, void *h);

#endif
