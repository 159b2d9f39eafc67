/* The timed optimizer step on random tokens (bench_step.h). */
#include "bench_step.h"

#include <math.h>

#include "bench_lib.h"
#include "longtune/log.h"

double lt_bench_random_step(lt_ctx *ctx, lt_model *m, const lt_backend *be, float *mom_m, float *mom_v, int32_t *tok,
                            int64_t T, uint64_t *seed, int64_t *adam_step, double *loss) {
    const lt_model_config *cfg = lt_model_get_config(m);
    int32_t *x = tok, *y = tok + T;
    for (int64_t i = 0; i < T; i++) x[i] = (int32_t)(lt_bench_rand_u64(seed) % (uint64_t)cfg->V);
    for (int64_t i = 0; i + 1 < T; i++) y[i] = x[i + 1];
    y[T - 1] = LT_IGNORE_INDEX;
    lt_model_batch b = {.B = 1, .T = T, .tokens = x, .targets = y};
    lt_model_result mr;
    int64_t n = 0;
    float *params = lt_model_lora_params(m, &n), *grads = lt_model_lora_grads(m, &n);
    lt_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = ++*adam_step};
    if (be->synchronize(ctx) != LT_OK) return -1;
    double t0 = lt_time_now();
    lt_model_zero_grads(m);
    if (lt_model_forward_backward(ctx, m, &b, 0.0f, &mr, NULL) != LT_OK) return -1;
    be->adamw(ctx, params, grads, mom_m, mom_v, n, &hp);
    if (be->synchronize(ctx) != LT_OK) return -1;
    *loss = mr.n_tokens > 0 ? mr.loss_sum / (double)mr.n_tokens : NAN;
    return (lt_time_now() - t0) * 1e3;
}
