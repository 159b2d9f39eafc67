/* Fused CPU linear cross-entropy: token × vocabulary tiles with an online log-sum-exp. Token tiles
 * (tile_n non-ignored tokens, gathered into an f32 tile) run one after another; inside one, the
 * vocabulary tiles are split across threads, each running single-threaded sgemm on its tile (W
 * dequantised to f32 in the thread's own buffer) and folding the logits into private per-token
 * statistics, merged in thread order at the end of the token tile. The backward recomputes the
 * logit tile from the saved lse, turns it into ∂loss/∂logits in cache, and feeds it straight into
 * the grad-hidden (and grad-W) GEMMs. Memory O(N + threads·tile); the (N, V) logits never exist.
 * Ignored tokens are skipped entirely, so masked prompt tokens cost nothing. */
#include <cblas.h>

#include "backend/cpu/lce_cpu.h"
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

size_t lce_fused_workspace(const lce_problem *P) { return layout(P).end; }

typedef struct {
    const lce_problem *P;
    fused_layout L;
    char *ws;
    const float *hf;  /* (nr, C) gathered f32 tile */
    int64_t nr;
    const int32_t *target; /* (nr) */
    const float *lse, *coef; /* (nr), backward */
    float *dw;
} tile_job;

/* f32 rows v0..v0+nv of W: a pointer into W when it is f32, else dequantised into buf. */
static const float *w_tile(const lce_problem *P, float *buf, int64_t v0, int64_t nv) {
    if (P->w_dtype == LT_DTYPE_F32) return (const float *)P->w + v0 * P->C;
    lce_rows_to_f32(P->w_dtype, P->w, P->w_row_bytes, v0, nv, P->C, buf);
    return buf;
}

static void fwd_range(void *arg, int64_t begin, int64_t end, int thread) {
    const tile_job *j = arg;
    const lce_problem *P = j->P;
    char *mine = j->ws + (size_t)thread * j->L.per_thread;
    float *wbuf = (float *)(mine + j->L.wconv), *z = (float *)(mine + j->L.logits);
    lce_stat *st = (lce_stat *)(mine + j->L.stats);
    for (int64_t r = 0; r < j->nr; r++) lce_stat_init(&st[r]);
    for (int64_t vt = begin; vt < end; vt++) {
        int64_t v0 = vt * P->tile_v, nv = P->V - v0 < P->tile_v ? P->V - v0 : P->tile_v;
        const float *wf = w_tile(P, wbuf, v0, nv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->nr, (int)nv, (int)P->C, 1.0f, j->hf, (int)P->C,
                    wf, (int)P->C, 0.0f, z, (int)nv);
        for (int64_t r = 0; r < j->nr; r++) {
            lce_softcap_row(z + r * nv, nv, P->softcap);
            lce_stat_update(&st[r], z + r * nv, nv, v0, j->target[r]);
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)j->nr, (int)nv, (int)P->C, 1.0f, j->hf, (int)P->C,
                    wf, (int)P->C, 0.0f, g, (int)nv);
        for (int64_t r = 0; r < j->nr; r++) lce_grad_row(P, g + r * nv, nv, v0, j->target[r], j->lse[r], j->coef[r]);
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
        lce_rows_to_f32(P->h_dtype, P->h, hrow, rows[r], 1, P->C, hf + r * P->C);
        tt[r] = P->targets[rows[r]];
    }
    memset(j->ws + j->L.ran, 0, (size_t)P->threads * sizeof(int));
    j->hf = hf;
    j->target = tt;
}

void lce_fused_forward(const lce_problem *P, char *ws, float *lse, double *row_loss) {
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
            lce_stat_init(&st);
            for (int t = 0; t < P->threads; t++)
                if (ran[t]) lce_stat_merge(&st, (const lce_stat *)(ws + (size_t)t * j.L.per_thread + j.L.stats) + r);
            row_loss[rows[k0 + r]] = lce_finish_row(P, rows[k0 + r], &st, lse);
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
        lce_rows_from_f32(P->dh_dtype, m->dh, m->rows[r], 1, P->C, d0);
    }
}

void lce_fused_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh, float *dw) {
    tile_job j = {P, layout(P), ws, NULL, 0, NULL, NULL, NULL, dw};
    int64_t *rows = (int64_t *)(ws + j.L.rows);
    int64_t na = active_rows(P, rows), nvt = (P->V + P->tile_v - 1) / P->tile_v;
    for (int64_t i = 0; i < P->N; i++)
        if (lce_ignored(P, i)) lce_rows_zero(P->dh_dtype, dh, i, 1, P->C);
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
            for (int64_t r = 0; r < j.nr; r++) lce_rows_zero(P->dh_dtype, dh, rows[k0 + r], 1, P->C);
            continue;
        }
        tile_begin(&j, rows + k0);
        lt_parallel_for(P->threads, nvt, 1, bwd_range, &j);
        merge_job m = {&j, rows + k0, dh};
        lt_parallel_for(P->threads, j.nr, 16, merge_range, &m);
    }
}
