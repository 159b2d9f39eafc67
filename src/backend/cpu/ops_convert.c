/* CPU conversions between f32 activations and bf16 storage (the model's optional bf16 checkpoints
 * and kept attention outputs, the bf16 products' inputs). Rounding is the library's lt_f32_to_bf16
 * (nearest even, NaN kept quiet), written here branch-free so the loops vectorise, so CPU and CUDA
 * round the same way. Nothing else is converted here. */
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

#define CV_GRAIN 16384

typedef struct cv_job {
    const float *f;
    const uint16_t *h;
    float *fo;
    uint16_t *ho;
} cv_job;

/* lt_f32_to_bf16's bits, with a select where it branches. */
static inline uint16_t to_bf16_one(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

LT_CPU_CLONES void lt_cpu_to_bf16_serial(const float *x, uint16_t *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = to_bf16_one(x[i]);
}

static void to_bf16_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const cv_job *j = arg;
    lt_cpu_to_bf16_serial(j->f + i0, j->ho + i0, i1 - i0);
}

LT_CPU_CLONES static void from_bf16_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const cv_job *j = arg;
    for (int64_t i = i0; i < i1; i++) j->fo[i] = lt_bf16_to_f32(j->h[i]);
}

void lt_cpu_to_bf16(lt_ctx *ctx, const float *x, uint16_t *y, int64_t n) {
    cv_job j = {.f = x, .ho = y};
    lt_parallel_for(lt_ctx_threads(ctx), n, CV_GRAIN, to_bf16_f, &j);
}

void lt_cpu_from_bf16(lt_ctx *ctx, const uint16_t *x, float *y, int64_t n) {
    cv_job j = {.h = x, .fo = y};
    lt_parallel_for(lt_ctx_threads(ctx), n, CV_GRAIN, from_bf16_f, &j);
}
