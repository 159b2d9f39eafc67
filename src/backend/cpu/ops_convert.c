/* CPU conversions between f32 activations and bf16 storage (the model's optional bf16 checkpoints
 * and kept attention outputs). Rounding is the library's scalar lt_f32_to_bf16 (nearest even, NaN
 * kept), so CPU and CUDA round the same way. Nothing else is converted here. */
#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

#define CV_GRAIN 16384

typedef struct cv_job {
    const float *f;
    const uint16_t *h;
    float *fo;
    uint16_t *ho;
} cv_job;

LT_CPU_CLONES static void to_bf16_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const cv_job *j = arg;
    for (int64_t i = i0; i < i1; i++) j->ho[i] = lt_f32_to_bf16(j->f[i]);
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
