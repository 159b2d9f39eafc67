/* AdamW on the CPU, as torch.optim.AdamW (decoupled decay p ← p − lr·wd·p, bias-corrected moments,
 * eps outside the square root). The trainer owns the moments and the schedule; this is one step. */
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

typedef struct adamw_job {
    float *p, *m, *v;
    const float *g;
    lt_adamw_params hp;
    float bc1, bc2;
} adamw_job;

LT_CPU_CLONES static void adamw_range(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const adamw_job *j = arg;
    const lt_adamw_params *h = &j->hp;
    for (int64_t i = i0; i < i1; i++) {
        float g = j->g[i];
        float p = j->p[i] * (1.0f - h->lr * h->weight_decay);
        float m = h->beta1 * j->m[i] + (1.0f - h->beta1) * g;
        float v = h->beta2 * j->v[i] + (1.0f - h->beta2) * g * g;
        j->m[i] = m;
        j->v[i] = v;
        j->p[i] = p - h->lr * (m / j->bc1) / (sqrtf(v / j->bc2) + h->eps);
    }
}

void lt_cpu_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp) {
    adamw_job j = {p, m, v, g, *hp, 0, 0};
    j.bc1 = (float)(1.0 - pow((double)hp->beta1, (double)hp->step));
    j.bc2 = (float)(1.0 - pow((double)hp->beta2, (double)hp->step));
    lt_parallel_for(lt_ctx_threads(ctx), n, 4096, adamw_range, &j);
}
