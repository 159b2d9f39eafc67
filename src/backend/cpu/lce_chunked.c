/* Chunked CPU linear cross-entropy: walks the vocabulary in chunks of tile_v rows of W, each chunk
 * producing (N, tile_v) logits with one threaded sgemm, folded into per-token running statistics
 * (online log-sum-exp). Memory O(N·tile_v + N·C); this is the shape of Liger's and MLX's chunked
 * losses. It does not tile tokens: that is the fused implementation's job. */
#include <cblas.h>

#include "backend/cpu/lce_cpu.h"
#include "core/fastmath.h"
#include "core/parallel.h"

typedef struct {
    size_t hconv, wconv, logits, stats, dhacc, end;
} chunked_layout;

static chunked_layout layout(const lce_problem *P) {
    chunked_layout L = {0};
    size_t c = 0;
    L.hconv = lce_take(&c, P->h_dtype == LT_DTYPE_F32 ? 0 : (size_t)(P->N * P->C) * sizeof(float));
    L.wconv = lce_take(&c, P->w_dtype == LT_DTYPE_F32 ? 0 : (size_t)P->tile_v * (size_t)P->C * sizeof(float));
    L.logits = lce_take(&c, (size_t)P->N * (size_t)P->tile_v * sizeof(float));
    L.stats = lce_take(&c, P->backward ? 0 : (size_t)P->N * sizeof(lce_stat));
    L.dhacc = lce_take(&c, P->backward && P->dh_dtype != LT_DTYPE_F32 ? (size_t)(P->N * P->C) * sizeof(float) : 0);
    L.end = c;
    return L;
}

size_t lt_cpu_lce_chunked_workspace(const lce_problem *P) { return layout(P).end; }

typedef struct {
    const lce_problem *P;
    float *z; /* (N, nv) */
    int64_t v0, nv;
    lce_stat *stats;
    const float *lse, *coef;
    double *row_loss;
    float *lse_out;
} chunk_job;

static void fwd_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const chunk_job *j = arg;
    for (int64_t i = begin; i < end; i++) {
        if (lce_ignored(j->P, i)) continue;
        float *zi = j->z + i * j->nv;
        lt_fast_softcap(zi, j->nv, (float)j->P->softcap);
        lt_cpu_lce_stat_update(&j->stats[i], zi, j->nv, j->v0, j->P->targets[i]);
    }
}

static void finish_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const chunk_job *j = arg;
    for (int64_t i = begin; i < end; i++) j->row_loss[i] = lt_cpu_lce_finish_row(j->P, i, &j->stats[i], j->lse_out);
}

/* f32 h (converted once) and a chunk of W as f32 (pointer into W, or dequantised into ws). */
static const float *h_f32(const lce_problem *P, char *ws) {
    if (P->h_dtype == LT_DTYPE_F32) return P->h;
    float *hf = (float *)(ws + layout(P).hconv);
    lt_cpu_lce_rows_to_f32_parallel(P->threads, P->h_dtype, P->h, P->C * 2, 0, P->N, P->C, hf);
    return hf;
}

static const float *w_chunk(const lce_problem *P, char *ws, int64_t v0, int64_t nv) {
    if (P->w_dtype == LT_DTYPE_F32) return (const float *)P->w + v0 * P->C;
    float *wf = (float *)(ws + layout(P).wconv);
    lt_cpu_lce_rows_to_f32_parallel(P->threads, P->w_dtype, P->w, P->w_row_bytes, v0, nv, P->C, wf);
    return wf;
}

void lt_cpu_lce_chunked_forward(const lce_problem *P, char *ws, float *lse, double *row_loss) {
    chunked_layout L = layout(P);
    const float *hf = h_f32(P, ws);
    chunk_job j = {P, (float *)(ws + L.logits), 0, 0, (lce_stat *)(ws + L.stats), NULL, NULL, row_loss, lse};
    for (int64_t i = 0; i < P->N; i++) lt_cpu_lce_stat_init(&j.stats[i]);
    for (j.v0 = 0; j.v0 < P->V; j.v0 += j.nv) {
        j.nv = P->V - j.v0 < P->tile_v ? P->V - j.v0 : P->tile_v;
        const float *wf = w_chunk(P, ws, j.v0, j.nv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)P->N, (int)j.nv, (int)P->C, 1.0f, hf, (int)P->C, wf,
                    (int)P->C, 0.0f, j.z, (int)j.nv);
        lt_parallel_for(P->threads, P->N, 16, fwd_rows, &j);
    }
    lt_parallel_for(P->threads, P->N, 64, finish_rows, &j);
}

static void bwd_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const chunk_job *j = arg;
    for (int64_t i = begin; i < end; i++)
        lt_cpu_lce_grad_row(j->P, j->z + i * j->nv, j->nv, j->v0, j->P->targets[i], j->lse[i], j->coef[i]);
}

void lt_cpu_lce_chunked_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh,
                                 float *dw) {
    chunked_layout L = layout(P);
    const float *hf = h_f32(P, ws);
    float *acc = P->dh_dtype == LT_DTYPE_F32 ? dh : (float *)(ws + L.dhacc);
    chunk_job j = {P, (float *)(ws + L.logits), 0, 0, NULL, lse, coef, NULL, NULL};
    for (j.v0 = 0; j.v0 < P->V; j.v0 += j.nv) {
        j.nv = P->V - j.v0 < P->tile_v ? P->V - j.v0 : P->tile_v;
        const float *wf = w_chunk(P, ws, j.v0, j.nv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)P->N, (int)j.nv, (int)P->C, 1.0f, hf, (int)P->C, wf,
                    (int)P->C, 0.0f, j.z, (int)j.nv);
        lt_parallel_for(P->threads, P->N, 16, bwd_rows, &j);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)P->N, (int)P->C, (int)j.nv, 1.0f, j.z, (int)j.nv,
                    wf, (int)P->C, j.v0 ? 1.0f : 0.0f, acc, (int)P->C);
        if (dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)j.nv, (int)P->C, (int)P->N, 1.0f, j.z, (int)j.nv,
                        hf, (int)P->C, 1.0f, dw + j.v0 * P->C, (int)P->C);
    }
    if (P->dh_dtype != LT_DTYPE_F32) lt_cpu_lce_rows_from_f32(P->dh_dtype, dh, 0, P->N, P->C, acc);
    for (int64_t i = 0; i < P->N; i++)
        if (lce_ignored(P, i)) lt_cpu_lce_rows_zero(P->dh_dtype, dh, i, 1, P->C);
}
