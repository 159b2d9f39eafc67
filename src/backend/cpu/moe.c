/* CPU mixture-of-experts ops: routing (softmax, top-k, renormalisation, the load-balancing
 * statistics) and its backward, the counting sort of assignments by expert, the gather / combine
 * of token rows and their backwards, the experts' grouped products as one matmul call per expert
 * over a view of its rows of the stacked weight, and their weight gradients as one gemm call per
 * expert. Results do not depend on the thread
 * count: every output element is one fixed-order sum. */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

/* Token chunks of the routing when it accumulates statistics: each chunk sums its tokens' picks
 * and probabilities into its own float64 row on the caller's stack, and the rows are added in
 * chunk order, so the sum's order depends on n only (not on the threads). 8 rows of E doubles and
 * counts stay under 50 KiB of stack at E = LT_MOE_MAX_EXPERTS. */
#define MOE_STAT_CHUNKS 8
#define MOE_ROW_GRAIN 64

typedef struct moe_job {
    const float *logits, *dw, *stats, *x, *yg, *w, *dy;
    const int32_t *idx, *rows, *slot;
    int32_t *idx_out;
    float *w_out, *dlogits, *out, *dyg, *dw_out;
    int64_t n, E, k, C;
    int norm_topk;
    float beta, scale;
    double *psum;  /* (MOE_STAT_CHUNKS, E) */
    int32_t *pcnt; /* (MOE_STAT_CHUNKS, E) */
} moe_job;

/* p = softmax(l) over E in f32, max-subtracted (the routing's probabilities). */
static void softmax_row(const float *l, int64_t E, float *p) {
    float m = l[0], s = 0.0f;
    for (int64_t e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int64_t e = 0; e < E; e++) s += p[e] = expf(l[e] - m);
    float inv = 1.0f / s;
    for (int64_t e = 0; e < E; e++) p[e] = p[e] * inv;
}

/* The k largest of p in descending order, ties to the lower expert (a strict comparison in
 * increasing expert order), written to idx; w gets those p, renormalised when norm_topk. */
static void topk_row(const float *p, int64_t E, int64_t k, int norm_topk, int32_t *idx, float *w) {
    unsigned char taken[LT_MOE_MAX_EXPERTS];
    memset(taken, 0, (size_t)E);
    float s = 0.0f;
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = 1;
        idx[j] = (int32_t)best;
        w[j] = p[best];
        s += w[j];
    }
    if (norm_topk)
        for (int64_t j = 0; j < k; j++) w[j] = w[j] / s;
}

static void route_f(void *arg, int64_t c0, int64_t c1, int thread) {
    (void)thread;
    const moe_job *j = arg;
    float p[LT_MOE_MAX_EXPERTS];
    for (int64_t c = c0; c < c1; c++) {
        /* With statistics, c is one of MOE_STAT_CHUNKS token chunks; without, one token. */
        int64_t t0 = c, t1 = c + 1;
        if (j->psum) t0 = c * j->n / MOE_STAT_CHUNKS, t1 = (c + 1) * j->n / MOE_STAT_CHUNKS;
        for (int64_t t = t0; t < t1; t++) {
            softmax_row(j->logits + t * j->E, j->E, p);
            topk_row(p, j->E, j->k, j->norm_topk, j->idx_out + t * j->k, j->w_out + t * j->k);
            if (!j->psum) continue;
            double *ps = j->psum + c * j->E;
            int32_t *pc = j->pcnt + c * j->E;
            for (int64_t e = 0; e < j->E; e++) ps[e] += (double)p[e];
            for (int64_t q = 0; q < j->k; q++) pc[j->idx_out[t * j->k + q]]++;
        }
    }
}

void lt_cpu_moe_route(lt_ctx *ctx, const float *logits, int64_t n, int64_t E, int64_t k, int norm_topk, int32_t *idx,
                      float *w, float *stats) {
    moe_job j = {.logits = logits, .idx_out = idx, .w_out = w, .n = n, .E = E, .k = k, .norm_topk = norm_topk};
    if (n <= 0) return;
    if (!stats) {
        lt_parallel_for(lt_ctx_threads(ctx), n, MOE_ROW_GRAIN, route_f, &j);
        return;
    }
    double psum[MOE_STAT_CHUNKS * LT_MOE_MAX_EXPERTS];
    int32_t pcnt[MOE_STAT_CHUNKS * LT_MOE_MAX_EXPERTS];
    memset(psum, 0, sizeof(double) * MOE_STAT_CHUNKS * (size_t)E);
    memset(pcnt, 0, sizeof(int32_t) * MOE_STAT_CHUNKS * (size_t)E);
    j.psum = psum, j.pcnt = pcnt;
    lt_parallel_for(lt_ctx_threads(ctx), MOE_STAT_CHUNKS, 1, route_f, &j);
    for (int64_t e = 0; e < E; e++) {
        double s = 0.0;
        int64_t cnt = 0;
        for (int c = 0; c < MOE_STAT_CHUNKS; c++) s += psum[c * E + e], cnt += pcnt[c * E + e];
        stats[e] += (float)cnt;
        stats[E + e] += (float)s;
    }
}

static void route_bwd_f(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const moe_job *j = arg;
    float p[LT_MOE_MAX_EXPERTS], g[LT_MOE_MAX_EXPERTS];
    const int64_t E = j->E, k = j->k;
    for (int64_t t = t0; t < t1; t++) {
        softmax_row(j->logits + t * E, E, p);
        for (int64_t e = 0; e < E; e++) g[e] = j->stats ? j->scale * j->stats[e] : 0.0f;
        const int32_t *id = j->idx + t * k;
        const float *dw = j->dw + t * k;
        if (j->norm_topk) {
            /* w_j = p_j / Z, Z = Σ p over the chosen: ∂/∂p_j = (dw_j − Σ_i dw_i·w_i) / Z. */
            float Z = 0.0f;
            for (int64_t q = 0; q < k; q++) Z += p[id[q]];
            double c = 0.0;
            for (int64_t q = 0; q < k; q++) c += (double)dw[q] * (double)(p[id[q]] / Z);
            for (int64_t q = 0; q < k; q++) g[id[q]] += (float)(((double)dw[q] - c) / (double)Z);
        } else {
            for (int64_t q = 0; q < k; q++) g[id[q]] += dw[q];
        }
        double dot = 0.0;
        for (int64_t e = 0; e < E; e++) dot += (double)p[e] * (double)g[e];
        float *dl = j->dlogits + t * E;
        for (int64_t e = 0; e < E; e++) dl[e] = p[e] * (g[e] - (float)dot);
    }
}

void lt_cpu_moe_route_bwd(lt_ctx *ctx, const float *logits, const int32_t *idx, const float *dw, int64_t n, int64_t E,
                          int64_t k, int norm_topk, const float *stats, const float *scale, float *dlogits) {
    moe_job j = {.logits = logits,
                 .idx = idx,
                 .dw = dw,
                 .stats = stats,
                 .scale = stats ? scale[0] : 0.0f,
                 .dlogits = dlogits,
                 .n = n,
                 .E = E,
                 .k = k,
                 .norm_topk = norm_topk};
    lt_parallel_for(lt_ctx_threads(ctx), n, MOE_ROW_GRAIN, route_bwd_f, &j);
}

/* A counting sort: one pass counts, a scan gives the offsets, a second pass in assignment order
 * places each assignment (stable, so rows increase within an expert). Linear and memory-bound:
 * one thread. */
void lt_cpu_moe_sort(lt_ctx *ctx, const int32_t *idx, int64_t n, int64_t k, int64_t E, int32_t *off, int32_t *rows,
                     int32_t *slot) {
    (void)ctx;
    int32_t cur[LT_MOE_MAX_EXPERTS];
    const int64_t nk = n * k;
    memset(cur, 0, sizeof(int32_t) * (size_t)E);
    for (int64_t a = 0; a < nk; a++) cur[idx[a]]++;
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        off[e + 1] = off[e] + cur[e];
        cur[e] = off[e];
    }
    for (int64_t a = 0; a < nk; a++) {
        int32_t i = cur[idx[a]]++;
        rows[i] = (int32_t)a;
        slot[a] = i;
    }
}

static void gather_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const moe_job *j = arg;
    for (int64_t i = i0; i < i1; i++)
        memcpy(j->out + i * j->C, j->x + (j->rows[i] / j->k) * j->C, sizeof(float) * (size_t)j->C);
}

void lt_cpu_moe_gather(lt_ctx *ctx, const float *x, const int32_t *rows, int64_t nk, int64_t k, int64_t C, float *xg) {
    moe_job j = {.x = x, .rows = rows, .out = xg, .k = k, .C = C};
    lt_parallel_for(lt_ctx_threads(ctx), nk, MOE_ROW_GRAIN, gather_f, &j);
}

/* out[t] = beta·out[t] + Σ_j (w ? w[t, j] : 1)·src[slot[t·k + j]], the sum in j order first; beta 0
 * overwrites (out is not read). */
static void combine_f(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const moe_job *j = arg;
    const int64_t k = j->k, C = j->C;
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->out + t * C;
        for (int64_t c = 0; c < C; c++) {
            float s = 0.0f;
            for (int64_t q = 0; q < k; q++) {
                float v = j->yg[(int64_t)j->slot[t * k + q] * C + c];
                s += j->w ? j->w[t * k + q] * v : v;
            }
            o[c] = j->beta == 0.0f ? s : j->beta * o[c] + s;
        }
    }
}

void lt_cpu_moe_gather_bwd(lt_ctx *ctx, const float *dxg, const int32_t *slot, int64_t n, int64_t k, int64_t C,
                           float beta, float *dx) {
    moe_job j = {.yg = dxg, .slot = slot, .out = dx, .k = k, .C = C, .beta = beta};
    lt_parallel_for(lt_ctx_threads(ctx), n, MOE_ROW_GRAIN, combine_f, &j);
}

void lt_cpu_moe_combine(lt_ctx *ctx, const float *yg, const float *w, const int32_t *slot, int64_t n, int64_t k,
                        int64_t C, float beta, float *y) {
    moe_job j = {.yg = yg, .w = w, .slot = slot, .out = y, .k = k, .C = C, .beta = beta};
    lt_parallel_for(lt_ctx_threads(ctx), n, MOE_ROW_GRAIN, combine_f, &j);
}

static void combine_bwd_f(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const moe_job *j = arg;
    const int64_t k = j->k, C = j->C;
    for (int64_t t = t0; t < t1; t++) {
        const float *dy = j->dy + t * C;
        for (int64_t q = 0; q < k; q++) {
            int64_t s = j->slot[t * k + q];
            float wv = j->w[t * k + q], *d = j->dyg + s * C;
            for (int64_t c = 0; c < C; c++) d[c] = wv * dy[c];
            if (j->dw_out) {
                const float *yg = j->yg + s * C;
                double acc = 0.0;
                for (int64_t c = 0; c < C; c++) acc += (double)dy[c] * (double)yg[c];
                j->dw_out[t * k + q] = (float)acc;
            }
        }
    }
}

void lt_cpu_moe_combine_bwd(lt_ctx *ctx, const float *dy, const float *yg, const float *w, const int32_t *slot,
                            int64_t n, int64_t k, int64_t C, float *dyg, float *dw) {
    moe_job j = {.dy = dy, .yg = yg, .w = w, .slot = slot, .dyg = dyg, .dw_out = dw, .k = k, .C = C};
    lt_parallel_for(lt_ctx_threads(ctx), n, MOE_ROW_GRAIN, combine_bwd_f, &j);
}

/* Expert e's (out, in) matrix is the view of rows [e·out, (e + 1)·out) of the stack: whole rows,
 * so a block format's view starts on a block. Each expert's call runs on all threads (matmul
 * splits W's tiles or x's rows); an expert with no rows is skipped. */
void lt_cpu_grouped_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E, const int32_t *off,
                           const float *x, int64_t nk, float beta, float *y, void *ws) {
    (void)nk;
    const int64_t out = w->shape[0] / E, in = w->shape[1];
    const size_t row_bytes = (size_t)lt_dtype_row_bytes(w->dtype, in);
    const int64_t xw = mode == LT_MATMUL_NN ? out : in, yw = mode == LT_MATMUL_NN ? in : out;
    const int64_t sh[2] = {out, in};
    for (int64_t e = 0; e < E; e++) {
        int64_t r0 = off[e], m = off[e + 1] - r0;
        if (m <= 0) continue;
        lt_tensor we = lt_tensor_view((uint8_t *)w->data + (size_t)(e * out) * row_bytes, w->dtype, w->device, 2, sh);
        lt_cpu_matmul(ctx, mode, &we, x + r0 * xw, m, beta, y + r0 * yw, ws);
    }
}

size_t lt_cpu_grouped_matmul_workspace_bytes(lt_dtype wdtype, int64_t E, int64_t out, int64_t in, int64_t nk_max,
                                             int threads) {
    (void)E;
    return lt_cpu_matmul_workspace_bytes(wdtype, out, in, nk_max, threads);
}

/* dw_e = beta·dw_e + dy_eᵀ·x_e, one gemm per expert (Aᵀ·B over the expert's rows: the thin column
 * sums when a side is at most 16 wide, else OpenBLAS, whose threads split the output, never the
 * reduction). An expert with no rows is a K = 0 gemm, which writes beta·dw_e (0 for beta 0). */
void lt_cpu_grouped_matmul_wgrad(lt_ctx *ctx, int64_t E, const int32_t *off, const float *dy, int64_t out,
                                 const float *x, int64_t in, int64_t nk, float beta, float *dw) {
    (void)nk;
    for (int64_t e = 0; e < E; e++) {
        const int64_t r0 = off[e], m = off[e + 1] - r0;
        lt_cpu_gemm(ctx, 1, 0, out, in, m, 1.0f, dy + r0 * out, out, x + r0 * in, in, beta, dw + e * out * in, in);
    }
}
