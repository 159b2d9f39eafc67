/* Naive CPU linear cross-entropy: materialises the whole fp32 (N, V) logit matrix with one
 * threaded OpenBLAS sgemm, then works row by row. It is the simple oracle the tiled versions are
 * compared with in tests and benchmarks, and what a stock trainer does; it is not meant to be
 * used for large vocabularies (4.98 GB of logits at N = 8192, V = 151936). */
#include <cblas.h>

#include "backend/cpu/lce_cpu.h"
#include "core/fastmath.h"
#include "core/parallel.h"

typedef struct {
    size_t hconv, wconv, logits, dhacc, end;
} naive_layout;

/* Whole-matrix f32 copies of h and W when they are not f32 already; the logits; and an f32
 * grad-hidden accumulator when dh is bf16. */
static naive_layout layout(const lce_problem *P) {
    naive_layout L = {0};
    size_t c = 0;
    L.hconv = lce_take(&c, P->h_dtype == LT_DTYPE_F32 ? 0 : (size_t)(P->N * P->C) * sizeof(float));
    L.wconv = lce_take(&c, P->w_dtype == LT_DTYPE_F32 ? 0 : (size_t)(P->V * P->C) * sizeof(float));
    L.logits = lce_take(&c, (size_t)(P->N * P->V) * sizeof(float));
    L.dhacc = lce_take(&c, P->backward && P->dh_dtype != LT_DTYPE_F32 ? (size_t)(P->N * P->C) * sizeof(float) : 0);
    L.end = c;
    return L;
}

size_t lt_cpu_lce_naive_workspace(const lce_problem *P) { return layout(P).end; }

/* Logits (N, V) = h · Wᵀ in ws; returns them and the f32 h and W used. */
static float *logits(const lce_problem *P, char *ws, const float **hf, const float **wf) {
    naive_layout L = layout(P);
    *hf = P->h;
    *wf = P->w;
    if (P->h_dtype != LT_DTYPE_F32) {
        lt_cpu_lce_rows_to_f32_parallel(P->threads, P->h_dtype, P->h, P->C * 2, 0, P->N, P->C, (float *)(ws + L.hconv));
        *hf = (const float *)(ws + L.hconv);
    }
    if (P->w_dtype != LT_DTYPE_F32) {
        lt_cpu_lce_rows_to_f32_parallel(P->threads, P->w_dtype, P->w, P->w_row_bytes, 0, P->V, P->C,
                                        (float *)(ws + L.wconv));
        *wf = (const float *)(ws + L.wconv);
    }
    float *z = (float *)(ws + L.logits);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)P->N, (int)P->V, (int)P->C, 1.0f, *hf, (int)P->C, *wf,
                (int)P->C, 0.0f, z, (int)P->V);
    return z;
}

typedef struct {
    const lce_problem *P;
    float *z;
    float *lse;
    double *row_loss;
    const float *coef;
} rows_job;

static void fwd_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = arg;
    const lce_problem *P = j->P;
    for (int64_t i = begin; i < end; i++) {
        float *zi = j->z + i * P->V;
        lce_stat st;
        lt_cpu_lce_stat_init(&st);
        if (!lce_ignored(P, i)) {
            lt_fast_softcap(zi, P->V, (float)P->softcap);
            lt_cpu_lce_stat_update(&st, zi, P->V, 0, P->targets[i]);
        }
        j->row_loss[i] = lt_cpu_lce_finish_row(P, i, &st, j->lse);
    }
}

void lt_cpu_lce_naive_forward(const lce_problem *P, char *ws, float *lse, double *row_loss) {
    const float *hf, *wf;
    rows_job j = {P, logits(P, ws, &hf, &wf), lse, row_loss, NULL};
    lt_parallel_for(P->threads, P->N, 16, fwd_rows, &j);
}

static void bwd_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const rows_job *j = arg;
    const lce_problem *P = j->P;
    for (int64_t i = begin; i < end; i++)
        lt_cpu_lce_grad_row(P, j->z + i * P->V, P->V, 0, P->targets[i], j->lse[i], j->coef[i]);
}

void lt_cpu_lce_naive_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh,
                               float *dw) {
    const float *hf, *wf;
    rows_job j = {P, logits(P, ws, &hf, &wf), (float *)lse, NULL, coef};
    lt_parallel_for(P->threads, P->N, 16, bwd_rows, &j);
    float *acc = P->dh_dtype == LT_DTYPE_F32 ? dh : (float *)(ws + layout(P).dhacc);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)P->N, (int)P->C, (int)P->V, 1.0f, j.z, (int)P->V, wf,
                (int)P->C, 0.0f, acc, (int)P->C);
    if (P->dh_dtype != LT_DTYPE_F32) lt_cpu_lce_rows_from_f32(P->dh_dtype, dh, 0, P->N, P->C, acc);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)P->V, (int)P->C, (int)P->N, 1.0f, j.z, (int)P->V, hf,
                    (int)P->C, 1.0f, dw, (int)P->C);
    /* Ignored rows of G are exact zeros, so their dh rows are too unless W holds inf/NaN; write
     * them anyway so the contract does not depend on W. */
    for (int64_t i = 0; i < P->N; i++)
        if (lce_ignored(P, i)) lt_cpu_lce_rows_zero(P->dh_dtype, dh, i, 1, P->C);
}
