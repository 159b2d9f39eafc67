/* Fused CPU linear cross-entropy: token × vocabulary tiles with an online log-sum-exp. Token tiles
 * (tile_n non-ignored tokens, gathered into an f32 tile) run one after another; inside one, the
 * vocabulary tiles are split across threads, each running single-threaded sgemm on its tile (W
 * dequantised to f32 in the thread's own buffer) and folding the logits into private per-token
 * statistics, merged in thread order at the end of the token tile. The backward recomputes the
 * logit tile from the saved lse, turns it into ∂loss/∂logits in cache, and feeds it straight into
 * the grad-hidden (and grad-W) GEMMs. Memory O(N + threads·tile); the (N, V) logits never exist.
 * Ignored tokens are skipped entirely, so masked prompt tokens cost nothing. */
#include <cblas.h>
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/lce_cpu.h"
#include "backend/cpu/ops_matmul_bf16.h"
#include "core/fastmath.h"
#include "core/parallel.h"

typedef struct {
    size_t rows, tile_target, tile_lse, tile_coef, ran, hconv;
    size_t wconv, logits, stats, dhp; /* per thread, `per_thread` bytes apart */
    size_t per_thread, end;
} fused_layout;

static fused_layout layout(const lce_problem *P) {
    fused_layout L = {0};
    size_t c = 0, tn = (size_t)P->tile_n, tv = (size_t)P->tile_v, C = (size_t)P->C, T = (size_t)P->threads;
    L.rows = lce_take(&c, (size_t)P->N * sizeof(int64_t));
    L.tile_target = lce_take(&c, tn * sizeof(int32_t));
    L.tile_lse = lce_take(&c, P->backward ? tn * sizeof(float) : 0);
    L.tile_coef = lce_take(&c, P->backward ? tn * sizeof(float) : 0);
    L.ran = lce_take(&c, T * sizeof(int));
    L.hconv = lce_take(&c, tn * C * sizeof(float));
    size_t t = 0;
    L.wconv = lce_take(&t, P->w_dtype == LT_DTYPE_F32 ? 0 : tv * C * sizeof(float));
    L.logits = lce_take(&t, tn * tv * sizeof(float));
    L.stats = lce_take(&t, P->backward ? 0 : tn * sizeof(lce_stat));
    L.dhp = lce_take(&t, P->backward ? tn * C * sizeof(float) : 0);
    L.per_thread = t;
    L.wconv += c;
    L.logits += c;
    L.stats += c;
    L.dhp += c;
    L.end = c + T * t;
    return L;
}

size_t lt_cpu_lce_fused_workspace(const lce_problem *P) { return layout(P).end; }

typedef struct {
    const lce_problem *P;
    fused_layout L;
    char *ws;
    const float *hf; /* (nr, C) gathered f32 tile */
    int64_t nr;
    const int32_t *target;   /* (nr) */
    const float *lse, *coef; /* (nr), backward */
    float *dw;
} tile_job;

/* f32 rows v0..v0+nv of W: a pointer into W when it is f32, else dequantised into buf. */
static const float *w_tile(const lce_problem *P, float *buf, int64_t v0, int64_t nv) {
    if (P->w_dtype == LT_DTYPE_F32) return (const float *)P->w + v0 * P->C;
    lt_cpu_lce_rows_to_f32(P->w_dtype, P->w, P->w_row_bytes, v0, nv, P->C, buf);
    return buf;
}

static void fwd_range(void *arg, int64_t begin, int64_t end, int thread) {
    const tile_job *j = arg;
    const lce_problem *P = j->P;
    char *mine = j->ws + (size_t)thread * j->L.per_thread;
    float *wbuf = (float *)(mine + j->L.wconv), *z = (float *)(mine + j->L.logits);
    lce_stat *st = (lce_stat *)(mine + j->L.stats);
    for (int64_t r = 0; r < j->nr; r++) lt_cpu_lce_stat_init(&st[r]);
    for (int64_t vt = begin; vt < end; vt++) {
        int64_t v0 = vt * P->tile_v, nv = P->V - v0 < P->tile_v ? P->V - v0 : P->tile_v;
        const float *wf = w_tile(P, wbuf, v0, nv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->nr, (int)nv, (int)P->C, 1.0f, j->hf, (int)P->C, wf,
                    (int)P->C, 0.0f, z, (int)nv);
        for (int64_t r = 0; r < j->nr; r++) {
            lt_fast_softcap(z + r * nv, nv, (float)P->softcap);
            lt_cpu_lce_stat_update(&st[r], z + r * nv, nv, v0, j->target[r]);
        }
    }
    ((int *)(j->ws + j->L.ran))[thread] = 1;
}

static void bwd_range(void *arg, int64_t begin, int64_t end, int thread) {
    const tile_job *j = arg;
    const lce_problem *P = j->P;
    char *mine = j->ws + (size_t)thread * j->L.per_thread;
    float *wbuf = (float *)(mine + j->L.wconv), *g = (float *)(mine + j->L.logits);
    float *dhp = (float *)(mine + j->L.dhp);
    for (int64_t vt = begin; vt < end; vt++) {
        int64_t v0 = vt * P->tile_v, nv = P->V - v0 < P->tile_v ? P->V - v0 : P->tile_v;
        const float *wf = w_tile(P, wbuf, v0, nv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->nr, (int)nv, (int)P->C, 1.0f, j->hf, (int)P->C, wf,
                    (int)P->C, 0.0f, g, (int)nv);
        for (int64_t r = 0; r < j->nr; r++)
            lt_cpu_lce_grad_row(P, g + r * nv, nv, v0, j->target[r], j->lse[r], j->coef[r]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)j->nr, (int)P->C, (int)nv, 1.0f, g, (int)nv, wf,
                    (int)P->C, vt == begin ? 0.0f : 1.0f, dhp, (int)P->C);
        if (j->dw)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nv, (int)P->C, (int)j->nr, 1.0f, g, (int)nv,
                        j->hf, (int)P->C, 1.0f, j->dw + v0 * P->C, (int)P->C);
    }
    ((int *)(j->ws + j->L.ran))[thread] = 1;
}

/* Lists the non-ignored tokens; returns their count. */
static int64_t active_rows(const lce_problem *P, int64_t *rows) {
    int64_t n = 0;
    for (int64_t i = 0; i < P->N; i++)
        if (!lce_ignored(P, i)) rows[n++] = i;
    return n;
}

/* Gathers tile rows into the f32 h tile and their targets; clears the per-thread flags. */
static void tile_begin(tile_job *j, const int64_t *rows) {
    const lce_problem *P = j->P;
    float *hf = (float *)(j->ws + j->L.hconv);
    int32_t *tt = (int32_t *)(j->ws + j->L.tile_target);
    int64_t hrow = P->h_dtype == LT_DTYPE_F32 ? P->C * 4 : P->C * 2;
    for (int64_t r = 0; r < j->nr; r++) {
        lt_cpu_lce_rows_to_f32(P->h_dtype, P->h, hrow, rows[r], 1, P->C, hf + r * P->C);
        tt[r] = P->targets[rows[r]];
    }
    memset(j->ws + j->L.ran, 0, (size_t)P->threads * sizeof(int));
    j->hf = hf;
    j->target = tt;
}

void lt_cpu_lce_fused_forward(const lce_problem *P, char *ws, float *lse, double *row_loss) {
    tile_job j = {P, layout(P), ws, NULL, 0, NULL, NULL, NULL, NULL};
    int64_t *rows = (int64_t *)(ws + j.L.rows);
    int64_t na = active_rows(P, rows), nvt = (P->V + P->tile_v - 1) / P->tile_v;
    for (int64_t i = 0; i < P->N; i++)
        if (lce_ignored(P, i)) {
            lse[i] = 0;
            row_loss[i] = 0;
        }
    const int *ran = (const int *)(ws + j.L.ran);
    for (int64_t k0 = 0; k0 < na; k0 += j.nr) {
        j.nr = na - k0 < P->tile_n ? na - k0 : P->tile_n;
        tile_begin(&j, rows + k0);
        lt_parallel_for(P->threads, nvt, 1, fwd_range, &j);
        for (int64_t r = 0; r < j.nr; r++) {
            lce_stat st;
            lt_cpu_lce_stat_init(&st);
            for (int t = 0; t < P->threads; t++)
                if (ran[t])
                    lt_cpu_lce_stat_merge(&st, (const lce_stat *)(ws + (size_t)t * j.L.per_thread + j.L.stats) + r);
            row_loss[rows[k0 + r]] = lt_cpu_lce_finish_row(P, rows[k0 + r], &st, lse);
        }
    }
}

typedef struct {
    const tile_job *j;
    const int64_t *rows;
    void *dh;
} merge_job;

/* dh row = Σ over threads (in thread order) of their partial grad-hidden rows. */
static void merge_range(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const merge_job *m = arg;
    const tile_job *j = m->j;
    const lce_problem *P = j->P;
    const int *ran = (const int *)(j->ws + j->L.ran);
    for (int64_t r = begin; r < end; r++) {
        float *d0 = (float *)(j->ws + j->L.dhp) + r * P->C;
        for (int t = 1; t < P->threads; t++) {
            if (!ran[t]) continue;
            const float *dt = (const float *)(j->ws + (size_t)t * j->L.per_thread + j->L.dhp) + r * P->C;
            for (int64_t c = 0; c < P->C; c++) d0[c] += dt[c];
        }
        lt_cpu_lce_rows_from_f32(P->dh_dtype, m->dh, m->rows[r], 1, P->C, d0);
    }
}

void lt_cpu_lce_fused_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh,
                               float *dw) {
    tile_job j = {P, layout(P), ws, NULL, 0, NULL, NULL, NULL, dw};
    int64_t *rows = (int64_t *)(ws + j.L.rows);
    int64_t na = active_rows(P, rows), nvt = (P->V + P->tile_v - 1) / P->tile_v;
    for (int64_t i = 0; i < P->N; i++)
        if (lce_ignored(P, i)) lt_cpu_lce_rows_zero(P->dh_dtype, dh, i, 1, P->C);
    float *tl = (float *)(ws + j.L.tile_lse), *tc = (float *)(ws + j.L.tile_coef);
    j.lse = tl;
    j.coef = tc;
    for (int64_t k0 = 0; k0 < na; k0 += j.nr) {
        j.nr = na - k0 < P->tile_n ? na - k0 : P->tile_n;
        int any = 0;
        for (int64_t r = 0; r < j.nr; r++) {
            tl[r] = lse[rows[k0 + r]];
            tc[r] = coef[rows[k0 + r]];
            any |= tc[r] != 0;
        }
        if (!any) { /* zero upstream gradient or weights: nothing flows */
            for (int64_t r = 0; r < j.nr; r++) lt_cpu_lce_rows_zero(P->dh_dtype, dh, rows[k0 + r], 1, P->C);
            continue;
        }
        tile_begin(&j, rows + k0);
        lt_parallel_for(P->threads, nvt, 1, bwd_range, &j);
        merge_job m = {&j, rows + k0, dh};
        lt_parallel_for(P->threads, j.nr, 16, merge_range, &m);
    }
}

/* ---- forward_backward in one pass (lce.h) ----
 * The same token × vocabulary tiling, with the logits made once: each thread keeps, for the rows
 * of the token tile, its running max m, Σ exp(z − m) and an f32 grad-hidden accumulator
 * Σ_j exp(z_j − m)·cap'(z_j)·W_j (rescaled when m grows), fed by a second GEMM straight from the
 * tile. Merging the threads' partials (rescaled to the common max) gives lse; the softmax
 * normaliser, z-loss factor, label-smoothing term (ε/V·Σ_j W_j, summed during the first token
 * tile) and target row are applied per token at the end. */

typedef struct {
    size_t rows, tile_target, tile_coef, ran, hconv, colsum, hb;
    size_t wconv, logits, stats, acc, colpart, zb, wb, spad; /* per thread, `per_thread` bytes apart */
    size_t per_thread, end;
} fb_layout;

static fb_layout fb_layout_of(const lce_problem *P) {
    fb_layout L = {0};
    size_t c = 0, tn = (size_t)P->tile_n, tv = (size_t)P->tile_v, C = (size_t)P->C, T = (size_t)P->threads;
    size_t cs = P->eps > 0 ? C * sizeof(double) : 0;
    L.rows = lce_take(&c, (size_t)P->N * sizeof(int64_t));
    L.tile_target = lce_take(&c, tn * sizeof(int32_t));
    L.tile_coef = lce_take(&c, tn * sizeof(float));
    L.ran = lce_take(&c, T * sizeof(int));
    L.hconv = lce_take(&c, tn * C * sizeof(float));
    L.colsum = lce_take(&c, cs);
    L.hb = lce_take(&c, P->bf16x ? tn * C * sizeof(uint16_t) : 0); /* the h tile rounded to bf16 */
    size_t t = 0;
    /* The merge dequantises a target row into wconv, so it is at least C floats. */
    L.wconv = lce_take(&t, P->w_dtype == LT_DTYPE_F32 ? 0 : tv * C * sizeof(float));
    L.logits = lce_take(&t, tn * tv * sizeof(float));
    L.stats = lce_take(&t, tn * sizeof(lce_stat));
    L.acc = lce_take(&t, tn * C * sizeof(float));
    L.colpart = lce_take(&t, cs);
    L.zb = lce_take(&t, P->bf16x ? tn * tv * sizeof(uint16_t) : 0); /* the logit weights rounded */
    /* a quantized head's tile, dequantized (into wconv) and rounded to bf16 */
    L.wb = lce_take(&t, P->bf16x && P->w_dtype != LT_DTYPE_BF16 ? tv * C * sizeof(uint16_t) : 0);
    L.spad = lce_take(&t, P->bf16x ? P->bf16x_spad : 0);
    L.per_thread = t;
    L.wconv += c;
    L.logits += c;
    L.stats += c;
    L.acc += c;
    L.colpart += c;
    L.zb += c;
    L.wb += c;
    L.spad += c;
    L.end = c + T * t;
    return L;
}

size_t lt_cpu_lce_fused_fb_workspace(const lce_problem *P) { return fb_layout_of(P).end; }

typedef struct {
    const lce_problem *P;
    fb_layout L;
    char *ws;
    const float *hf; /* (nr, C) gathered f32 tile */
    int64_t nr;
    const int32_t *target; /* (nr) */
    const float *coef;     /* (nr) */
    const int64_t *rows;   /* (nr) token index of each tile row */
    int first_tile;        /* sum the columns of W for label smoothing */
    float *lse;
    void *dh;
    double *row_loss;
    /* bf16 products of this token tile (P->bf16x), by vocabulary tile kind (full, last): the
     * logits, and the grad-hidden product writing (first tile of a thread) or accumulating */
    const uint16_t *hb;
    const lt_cpu_bf16x_gemm *logit[2], *grad[2][2];
} fb_job;

static void fb_range(void *arg, int64_t begin, int64_t end, int thread) {
    const fb_job *j = arg;
    const lce_problem *P = j->P;
    char *mine = j->ws + (size_t)thread * j->L.per_thread;
    float *wbuf = (float *)(mine + j->L.wconv), *z = (float *)(mine + j->L.logits);
    float *acc = (float *)(mine + j->L.acc);
    lce_stat *st = (lce_stat *)(mine + j->L.stats);
    double *colpart = (double *)(mine + j->L.colpart);
    const int sum_cols = j->first_tile && P->eps > 0;
    for (int64_t r = 0; r < j->nr; r++) lt_cpu_lce_stat_init(&st[r]);
    if (sum_cols) memset(colpart, 0, (size_t)P->C * sizeof(double));
    for (int64_t vt = begin; vt < end; vt++) {
        int64_t v0 = vt * P->tile_v, nv = P->V - v0 < P->tile_v ? P->V - v0 : P->tile_v;
        const int kind = nv != P->tile_v;
        if (j->hb && j->logit[kind] && j->grad[kind][vt != begin]) {      /* bf16 products */
            const void *wt = (const uint8_t *)P->w + v0 * P->w_row_bytes; /* a bf16 head's rows as they lie */
            if (P->w_dtype != LT_DTYPE_BF16) {
                uint16_t *wb = (uint16_t *)(mine + j->L.wb);
                lt_cpu_to_bf16_serial(w_tile(P, wbuf, v0, nv), wb, nv * P->C);
                wt = wb;
            }
            uint16_t *zb = (uint16_t *)(mine + j->L.zb);
            void *spad = mine + j->L.spad;
            lt_cpu_bf16x_gemm_run(P->ctx, j->logit[kind], thread, j->hb, wt, z, spad);
            for (int64_t r = 0; r < j->nr; r++)
                lt_cpu_lce_fb_row(P, &st[r], z + r * nv, nv, v0, j->target[r], vt == begin ? NULL : acc + r * P->C);
            lt_cpu_to_bf16_serial(z, zb, j->nr * nv);
            lt_cpu_bf16x_gemm_run(P->ctx, j->grad[kind][vt != begin], thread, zb, wt, acc, spad);
            if (sum_cols) {
                const float *wf = P->w_dtype == LT_DTYPE_BF16 ? w_tile(P, wbuf, v0, nv) : wbuf; /* dequantized above */
                for (int64_t v = 0; v < nv; v++)
                    for (int64_t c = 0; c < P->C; c++) colpart[c] += wf[v * P->C + c];
            }
            continue;
        }
        const float *wf = w_tile(P, wbuf, v0, nv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->nr, (int)nv, (int)P->C, 1.0f, j->hf, (int)P->C, wf,
                    (int)P->C, 0.0f, z, (int)nv);
        for (int64_t r = 0; r < j->nr; r++)
            lt_cpu_lce_fb_row(P, &st[r], z + r * nv, nv, v0, j->target[r], vt == begin ? NULL : acc + r * P->C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)j->nr, (int)P->C, (int)nv, 1.0f, z, (int)nv, wf,
                    (int)P->C, vt == begin ? 0.0f : 1.0f, acc, (int)P->C);
        if (sum_cols)
            for (int64_t v = 0; v < nv; v++)
                for (int64_t c = 0; c < P->C; c++) colpart[c] += wf[v * P->C + c];
    }
    ((int *)(j->ws + j->L.ran))[thread] = 1;
}

/* Per tile row: the threads' partials merged in thread order, then loss, lse and the dh row. */
static void fb_merge_range(void *arg, int64_t begin, int64_t end, int thread) {
    const fb_job *j = arg;
    const lce_problem *P = j->P;
    const int *ran = (const int *)(j->ws + j->L.ran);
    const double *colsum = (const double *)(j->ws + j->L.colsum);
    float *wrow = (float *)(j->ws + (size_t)thread * j->L.per_thread + j->L.wconv);
    for (int64_t r = begin; r < end; r++) {
        lce_stat tot;
        lt_cpu_lce_stat_init(&tot);
        for (int t = 0; t < P->threads; t++)
            if (ran[t])
                lt_cpu_lce_stat_merge(&tot, (const lce_stat *)(j->ws + (size_t)t * j->L.per_thread + j->L.stats) + r);
        const int64_t i = j->rows[r];
        j->row_loss[i] = lt_cpu_lce_finish_row(P, i, &tot, j->lse);
        float *out = NULL;
        for (int t = 0; t < P->threads; t++) {
            if (!ran[t]) continue;
            const lce_stat *s = (const lce_stat *)(j->ws + (size_t)t * j->L.per_thread + j->L.stats) + r;
            float *a = (float *)(j->ws + (size_t)t * j->L.per_thread + j->L.acc) + r * P->C;
            float f = (float)exp((double)s->m - (double)tot.m);
            if (!out) {
                out = a;
                for (int64_t c = 0; c < P->C; c++) out[c] *= f;
            } else {
                for (int64_t c = 0; c < P->C; c++) out[c] += f * a[c];
            }
        }
        const float coef = j->coef[r];
        if (coef == 0) {
            lt_cpu_lce_rows_zero(P->dh_dtype, j->dh, i, 1, P->C);
            continue;
        }
        const double l = (double)tot.m + log(tot.s);
        const float A = (float)(coef * (1.0 + 2.0 * P->z_loss * l) / tot.s);
        const double th = P->softcap > 0 ? tot.zt / P->softcap : 0.0;
        const float T = (float)(coef * (1.0 - P->eps) * (1.0 - th * th));
        const float B = (float)(coef * P->eps / (double)P->V);
        const float *wt = P->w_dtype == LT_DTYPE_F32 ? (const float *)P->w + (int64_t)j->target[r] * P->C : wrow;
        if (P->w_dtype != LT_DTYPE_F32)
            lt_cpu_lce_rows_to_f32(P->w_dtype, P->w, P->w_row_bytes, j->target[r], 1, P->C, wrow);
        for (int64_t c = 0; c < P->C; c++) out[c] = A * out[c] - T * wt[c];
        if (P->eps > 0)
            for (int64_t c = 0; c < P->C; c++) out[c] -= B * (float)colsum[c];
        lt_cpu_lce_rows_from_f32(P->dh_dtype, j->dh, i, 1, P->C, out);
    }
}

/* The bf16 products of a token tile: h rounded, and the four products for its row count, each
 * only where its scratchpad fits the planned one (else that vocabulary tile kind runs in f32). */
static void bf16x_tile(const lce_problem *P, fb_job *j, char *ws) {
    uint16_t *hb = (uint16_t *)(ws + j->L.hb);
    lt_cpu_to_bf16_serial(j->hf, hb, j->nr * P->C);
    j->hb = hb;
    const int64_t rem = P->V % P->tile_v, nvs[2] = {P->tile_v, rem ? rem : P->tile_v};
    for (int k = 0; k < 2; k++) {
        const lt_cpu_bf16x_gemm *g[3] = {lt_cpu_bf16x_gemm_get(P->ctx, j->nr, P->C, nvs[k], 0, 0.0f, P->threads),
                                         lt_cpu_bf16x_gemm_get(P->ctx, j->nr, nvs[k], P->C, 1, 0.0f, P->threads),
                                         lt_cpu_bf16x_gemm_get(P->ctx, j->nr, nvs[k], P->C, 1, 1.0f, P->threads)};
        for (int i = 0; i < 3; i++)
            if (g[i] && lt_cpu_bf16x_gemm_spad_of(g[i]) > P->bf16x_spad) g[i] = NULL;
        j->logit[k] = g[0], j->grad[k][0] = g[1], j->grad[k][1] = g[2];
    }
}

void lt_cpu_lce_fused_forward_backward(const lce_problem *P, char *ws, float *lse, double *row_loss, const float *coef,
                                       void *dh) {
    fb_job j;
    memset(&j, 0, sizeof j);
    j.P = P;
    j.L = fb_layout_of(P);
    j.ws = ws;
    j.lse = lse;
    j.dh = dh;
    j.row_loss = row_loss;
    int64_t *rows = (int64_t *)(ws + j.L.rows);
    int64_t na = active_rows(P, rows), nvt = (P->V + P->tile_v - 1) / P->tile_v;
    for (int64_t i = 0; i < P->N; i++)
        if (lce_ignored(P, i)) {
            lse[i] = 0;
            row_loss[i] = 0;
            lt_cpu_lce_rows_zero(P->dh_dtype, dh, i, 1, P->C);
        }
    float *hf = (float *)(ws + j.L.hconv), *tc = (float *)(ws + j.L.tile_coef);
    int32_t *tt = (int32_t *)(ws + j.L.tile_target);
    int64_t hrow = P->h_dtype == LT_DTYPE_F32 ? P->C * 4 : P->C * 2;
    const int *ran = (const int *)(ws + j.L.ran);
    j.hf = hf;
    j.target = tt;
    j.coef = tc;
    for (int64_t k0 = 0; k0 < na; k0 += j.nr) {
        j.nr = na - k0 < P->tile_n ? na - k0 : P->tile_n;
        j.rows = rows + k0;
        j.first_tile = k0 == 0;
        for (int64_t r = 0; r < j.nr; r++) {
            lt_cpu_lce_rows_to_f32(P->h_dtype, P->h, hrow, rows[k0 + r], 1, P->C, hf + r * P->C);
            tt[r] = P->targets[rows[k0 + r]];
            tc[r] = coef[rows[k0 + r]];
        }
        memset(ws + j.L.ran, 0, (size_t)P->threads * sizeof(int));
        if (P->bf16x && P->ctx) bf16x_tile(P, &j, ws);
        lt_parallel_for(P->threads, nvt, 1, fb_range, &j);
        if (j.first_tile && P->eps > 0) { /* Σ_j W_j in thread order (vocabulary order) */
            double *cs = (double *)(ws + j.L.colsum);
            memset(cs, 0, (size_t)P->C * sizeof(double));
            for (int t = 0; t < P->threads; t++) {
                if (!ran[t]) continue;
                const double *cp = (const double *)(ws + (size_t)t * j.L.per_thread + j.L.colpart);
                for (int64_t c = 0; c < P->C; c++) cs[c] += cp[c];
            }
        }
        lt_parallel_for(P->threads, j.nr, 16, fb_merge_range, &j);
    }
}
