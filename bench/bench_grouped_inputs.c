/* The host-side inputs of `longtune bench grouped` (see bench_grouped.h): routing, activations and
 * stacked expert weights, made on all threads from per-row generators. No device code: the bench
 * copies what this makes. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_grouped.h"

/* xorshift64 from row r's own state: SplitMix64 of the seed and the row, never zero. */
static uint64_t row_state(uint64_t seed, int64_t r) {
    uint64_t s = seed ^ ((uint64_t)r * 0xd1b54a32d192ed03ULL);
    s = lt_bench_rand_u64(&s);
    return s ? s : 1;
}

static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float unif(uint64_t *s) { return (float)((double)(xs(s) >> 11) * 0x1.0p-52 - 1.0); }

void lt_bench_grouped_route(int64_t n, int64_t E, int64_t k, uint64_t seed, int32_t *off) {
    uint64_t s = row_state(seed, -1);
    memset(off, 0, sizeof *off * (size_t)(E + 1));
    for (int64_t tok = 0; tok < n; tok++) {
        int32_t pick[64];
        for (int64_t j = 0; j < k && j < 64; j++) {
            int dup;
            do {
                pick[j] = (int32_t)(xs(&s) % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++) dup |= pick[q] == pick[j];
            } while (dup);
            off[pick[j] + 1]++;
        }
    }
    for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
}

typedef struct fill_job {
    float *f32;
    uint16_t *bf16;
    int64_t cols;
    float amp;
    uint64_t seed;
} fill_job;

static void fill_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const fill_job *j = arg;
    for (int64_t r = begin; r < end; r++) {
        uint64_t s = row_state(j->seed, r);
        const size_t o = (size_t)r * (size_t)j->cols;
        for (int64_t c = 0; c < j->cols; c++) {
            const float v = j->amp * unif(&s);
            if (j->f32) j->f32[o + (size_t)c] = v;
            if (j->bf16) j->bf16[o + (size_t)c] = lt_f32_to_bf16(v);
        }
    }
}

void lt_bench_grouped_fill(float *f32, uint16_t *bf16, int64_t rows, int64_t cols, float amp, uint64_t seed,
                           int threads) {
    fill_job j = {f32, bf16, cols, amp, seed};
    lt_bench_parallel_for(threads, rows, 64, fill_rows, &j);
}

int lt_bench_grouped_dtype_ok(lt_dtype dt) {
    return dt == LT_DTYPE_F32 || dt == LT_DTYPE_BF16 || dt == LT_DTYPE_F16 || lt_dtype_is_quantized(dt);
}

typedef struct weight_job {
    lt_dtype dt;
    int64_t in;
    size_t rb;
    uint64_t seed;
    const float *f32; /* LT_BENCH_GROUPED_POOL_ROWS rows of random values */
    uint8_t *pool;    /* the same rows encoded */
    uint8_t *h;       /* the stacked weights */
} weight_job;

static void encode_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const weight_job *j = arg;
    const size_t bb = (size_t)lt_dtype_block_bytes(j->dt);
    for (int64_t r = begin; r < end; r++) {
        const float *row = j->f32 + (size_t)r * (size_t)j->in;
        uint8_t *dst = j->pool + j->rb * (size_t)r;
        if (j->dt == LT_DTYPE_IQ4_NL || j->dt == LT_DTYPE_IQ4_XS) { /* no encoder: random levels, scale ~0.05 */
            uint64_t s = row_state(j->seed ^ 0x5bd1e995u, r);
            const uint16_t sc = lt_f32_to_f16(j->dt == LT_DTYPE_IQ4_NL ? 0.05f / 127 : 0.05f / (127 * 24));
            for (size_t b = 0; b < j->rb; b++) dst[b] = (uint8_t)xs(&s);
            for (size_t b = 0; b < j->rb; b += bb) memcpy(dst + b, &sc, 2);
        } else {
            lt_quantize_row(j->dt, row, dst, j->in);
        }
    }
}

/* Repeats the pool over rows [begin, end) of the stacked weights. */
static void repeat_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const weight_job *j = arg;
    const int64_t P = LT_BENCH_GROUPED_POOL_ROWS;
    for (int64_t r = begin; r < end;) {
        const int64_t p = r % P, m = P - p < end - r ? P - p : end - r;
        memcpy(j->h + j->rb * (size_t)r, j->pool + j->rb * (size_t)p, j->rb * (size_t)m);
        r += m;
    }
}

int lt_bench_grouped_weight(lt_dtype dt, int64_t rows, int64_t in, uint64_t seed, int threads, void *h) {
    const int64_t rb = lt_dtype_row_bytes(dt, in), P = LT_BENCH_GROUPED_POOL_ROWS;
    if (!lt_bench_grouped_dtype_ok(dt) || rb <= 0 || rows < 1) return -1;
    float *f32 = malloc((size_t)(P * in) * sizeof *f32);
    uint8_t *pool = malloc((size_t)(rb * P));
    if (!f32 || !pool) {
        free(f32), free(pool);
        return -1;
    }
    lt_bench_grouped_fill(f32, NULL, P, in, 0.05f, seed, threads);
    weight_job j = {dt, in, (size_t)rb, seed, f32, pool, h};
    lt_bench_parallel_for(threads, P, 8, encode_rows, &j);
    lt_bench_parallel_for(threads, rows, 1024, repeat_rows, &j);
    free(f32), free(pool);
    return 0;
}
