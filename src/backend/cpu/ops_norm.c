/* RMSNorm forward and backward on the CPU, rows split across threads. Sums run in double so the
 * result is at least as accurate as PyTorch's fp32 reduction; the weight is frozen in the model,
 * so the weight gradient (tests only) is a plain serial accumulation. */
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

typedef struct norm_job {
    const float *x, *w, *dy, *rstd;
    float *y, *r, *dx;
    float eps;
    int64_t C;
} norm_job;

LT_CPU_CLONES static void fwd_rows(void *arg, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const norm_job *j = arg;
    const float *w = j->w; /* in a local: the stores through y could alias j's fields */
    for (int64_t n = n0; n < n1; n++) {
        const float *x = j->x + n * j->C;
        float *y = j->y + n * j->C;
        double ss = 0;
        /* simd: the double sum in vector lanes (a fixed order for a given build), not one chain */
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < j->C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / (double)j->C + (double)j->eps));
        if (j->r) j->r[n] = r;
#pragma omp simd
        for (int64_t c = 0; c < j->C; c++) y[c] = w[c] * (x[c] * r);
    }
}

void lt_cpu_rmsnorm_fwd(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                        float *rstd) {
    norm_job j = {.x = x, .w = w, .y = y, .r = rstd, .eps = eps, .C = C};
    lt_parallel_for(lt_ctx_threads(ctx), N, 16, fwd_rows, &j);
}

/* y_c = w_c·x_c·r, r = (mean x² + eps)^-1/2  ⇒  dx_c = r·(w_c·dy_c) − x_c·r³/C · Σ_k w_k·dy_k·x_k */
LT_CPU_CLONES static void bwd_rows(void *arg, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const norm_job *j = arg;
    const float *w = j->w; /* in a local: the stores through dx could alias j's fields */
    for (int64_t n = n0; n < n1; n++) {
        const float *x = j->x + n * j->C, *dy = j->dy + n * j->C;
        float *dx = j->dx + n * j->C;
        double r = j->rstd[n], dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t c = 0; c < j->C; c++) dot += (double)w[c] * dy[c] * x[c];
        /* the two factors rounded once, the elementwise pass in float: sixteen lanes, not eight */
        const float rf = (float)r, kf = (float)(dot * r * r * r / (double)j->C);
#pragma omp simd
        for (int64_t c = 0; c < j->C; c++) dx[c] = rf * w[c] * dy[c] - x[c] * kf;
    }
}

void lt_cpu_rmsnorm_bwd(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                        int64_t C, float *dx, float *dw) {
    norm_job j = {.x = x, .w = w, .dy = dy, .rstd = rstd, .dx = dx, .C = C};
    if (dw)
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) dw[c] += dy[n * C + c] * x[n * C + c] * rstd[n];
    lt_parallel_for(lt_ctx_threads(ctx), N, 16, bwd_rows, &j);
}
