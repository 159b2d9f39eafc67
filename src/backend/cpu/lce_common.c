/* CPU linear cross-entropy: entry points called by lce.c (resolve the problem, carve or allocate
 * the one workspace block, run the chosen implementation, reduce) and the per-row math and tile
 * conversions the three implementations share. The formulas are derived in docs/lce.md. Input
 * was validated by lce.c; nothing here checks it again. */
/* The clamps and selects of the branch-free exp (lt_fast_exp) and of the masks become vector
 * selects only when GCC may assume no floating-point traps: with its default -ftrapping-math each
 * stays a branch and these loops run one lane at a time. No arithmetic is reordered or contracted,
 * so the results are the same, lane by lane, as the scalar code. Before every include, so inlined
 * helpers carry the same options. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <math.h>

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/lce_cpu.h"
#include "backend/cpu/ops_matmul_bf16.h"
#include "backend/lce_impl.h"
#include "core/parallel.h"
#include "longtune/alloc.h"

/* Defaults chosen with `longtune bench lce` (process CPU time, since wall time on the shared 2-core
 * dev machine was dominated by other jobs; see docs/lce.md). OpenBLAS repacks both operands on
 * every tile GEMM, so the packing cost per FLOP is (1/tile_n + 1/tile_v)/2: 256×512 spent ~14% of
 * its time packing, 512×512 less. 512 tokens keep the per-thread grad-hidden partial at 8 MB for
 * C = 4096 (the whole fused workspace stays under 1% of naive's at N=8192, V=151936), and a
 * 512×512 logit tile (1 MB) stays in L2. Chunked: 4096-row vocabulary chunks, as Liger's and MLX's
 * chunked losses use a few thousand. */
void lt_lce_cpu_default_tiles(lt_lce_impl impl, int *tile_n, int *tile_v) {
    *tile_n = impl == LT_LCE_FUSED ? 512 : 0;
    *tile_v = impl == LT_LCE_FUSED ? 512 : impl == LT_LCE_CHUNKED ? 4096 : 0;
}

static void problem_init(lce_problem *P, const lt_lce_options *o, const lt_lce_args *a, int backward, int threads) {
    memset(P, 0, sizeof *P);
    P->N = a->h.shape[0];
    P->C = a->h.shape[1];
    P->V = a->w.shape[0];
    P->h_dtype = a->h.dtype;
    P->w_dtype = a->w.dtype;
    P->backward = backward;
    P->dh_dtype = backward && a->dh ? a->dh->dtype : LT_DTYPE_F32;
    P->want_dw = backward && a->dw != NULL;
    P->threads = lt_parallel_threads(threads);
    int tn, tv;
    lt_lce_cpu_default_tiles(o->impl, &tn, &tv);
    if (o->tile_n > 0) tn = o->tile_n;
    if (o->tile_v > 0) tv = o->tile_v;
    P->tile_n = (int)(tn > P->N ? P->N : tn);
    P->tile_v = (int)(tv > P->V ? P->V : tv);
    P->ignore_index = o->ignore_index;
    P->eps = o->label_smoothing;
    P->z_loss = o->z_loss;
    P->softcap = o->softcap;
    P->reduction = o->reduction;
    P->h = a->h.data;
    P->w = a->w.data;
    P->w_row_bytes = lt_dtype_row_bytes(a->w.dtype, P->C);
    P->targets = a->targets;
    P->weight = a->token_weight;
    P->bf16x = LT_HAVE_ONEDNN && o->bf16_products && backward == LT_LCE_PASS_FORWARD_BACKWARD &&
        a->w.dtype != LT_DTYPE_F32 && a->w.dtype != LT_DTYPE_F16;
    if (P->bf16x) { /* the tile products: logits (tile_n, tile_v) = h·Wᵀ, then grad-hidden (tile_n, C) += g·W */
        const int64_t rem = P->V % P->tile_v, nvs[2] = {P->tile_v, rem ? rem : P->tile_v};
        for (int k = 0; k < 2; k++) {
            size_t s1 = lt_cpu_bf16x_gemm_spad(P->tile_n, P->C, nvs[k], 0, 0.0f);
            size_t s2 = lt_cpu_bf16x_gemm_spad(P->tile_n, nvs[k], P->C, 1, 0.0f);
            size_t s3 = lt_cpu_bf16x_gemm_spad(P->tile_n, nvs[k], P->C, 1, 1.0f);
            if (s1 > P->bf16x_spad) P->bf16x_spad = s1;
            if (s2 > P->bf16x_spad) P->bf16x_spad = s2;
            if (s3 > P->bf16x_spad) P->bf16x_spad = s3;
        }
    }
}

/* Bytes at the head of the workspace: the forward keeps one double of loss per token (reduced in
 * a fixed order afterwards), the backward one float of upstream coefficient per token, the
 * one-pass forward_backward both. */
static size_t head_bytes(const lce_problem *P) {
    size_t cursor = 0;
    if (P->backward != 1) lce_take(&cursor, (size_t)P->N * sizeof(double));
    if (P->backward) lce_take(&cursor, (size_t)P->N * sizeof(float));
    return cursor;
}

static size_t impl_workspace(const lce_problem *P, lt_lce_impl impl) {
    size_t cursor = head_bytes(P);
    size_t own = P->backward == 2 ? lt_cpu_lce_fused_fb_workspace(P)
        : impl == LT_LCE_NAIVE    ? lt_cpu_lce_naive_workspace(P)
        : impl == LT_LCE_CHUNKED  ? lt_cpu_lce_chunked_workspace(P)
                                  : lt_cpu_lce_fused_workspace(P);
    return cursor + own;
}

/* forward_backward runs in one pass when the impl is fused and the gradient does not need the
 * final lse inside each tile (lce.h); otherwise it is the forward then the backward. */
static int fb_one_pass(const lt_lce_options *o, const lt_lce_args *a) {
    return o->impl == LT_LCE_FUSED && !a->dw && !(o->softcap > 0 && o->label_smoothing > 0);
}

size_t lt_lce_cpu_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads) {
    lce_problem P;
    if (pass == LT_LCE_PASS_FORWARD_BACKWARD && !fb_one_pass(opt, a)) {
        size_t f = lt_lce_cpu_workspace_bytes(opt, a, LT_LCE_PASS_FORWARD, threads);
        size_t b = lt_lce_cpu_workspace_bytes(opt, a, LT_LCE_PASS_BACKWARD, threads);
        return f > b ? f : b;
    }
    problem_init(&P, opt, a, pass, threads);
    return impl_workspace(&P, opt->impl);
}

/* a->workspace, or one accounted block of exactly the advertised size. */
static lt_status workspace_get(lt_ctx *ctx, const lt_lce_args *a, size_t bytes, char **ws, int *owned) {
    *owned = 0;
    *ws = a->workspace;
    if (*ws || bytes == 0) return LT_OK;
    *ws = lt_alloc(ctx, LT_DEVICE_CPU, bytes, "linear cross-entropy workspace");
    if (!*ws) return lt_ctx_status(ctx);
    *owned = 1;
    return LT_OK;
}

/* loss (and token_loss) from the per-token weighted losses. Fixed-order double sums: the result
 * does not depend on the thread split. */
static void reduce_loss(const lce_problem *P, lt_lce_args *a, const double *row_loss) {
    double total = 0, den = 0;
    for (int64_t i = 0; i < P->N; i++) {
        total += row_loss[i];
        if (!lce_ignored(P, i)) den += P->weight ? P->weight[i] : 1.0;
        if (a->token_loss) a->token_loss[i] = (float)row_loss[i];
        if (P->reduction == LT_REDUCTION_NONE) a->loss[i] = (float)row_loss[i];
    }
    if (P->reduction == LT_REDUCTION_SUM) a->loss[0] = (float)total;
    if (P->reduction == LT_REDUCTION_MEAN) a->loss[0] = den > 0 ? (float)(total / den) : 0.0f;
}

/* coef (N): upstream gradient × weight per token (mean divides by the weight total), 0 ignored. */
static void upstream_coef(const lce_problem *P, const float *dloss, float *coef) {
    double den = 0;
    for (int64_t i = 0; i < P->N; i++)
        if (!lce_ignored(P, i)) den += P->weight ? P->weight[i] : 1.0;
    for (int64_t i = 0; i < P->N; i++) {
        double up = P->reduction == LT_REDUCTION_NONE ? dloss[i]
            : P->reduction == LT_REDUCTION_SUM        ? dloss[0]
            : den > 0                                 ? dloss[0] / den
                                                      : 0.0;
        coef[i] = lce_ignored(P, i) ? 0.0f : (float)(up * (P->weight ? P->weight[i] : 1.0));
    }
}

lt_status lt_lce_cpu_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    lce_problem P;
    problem_init(&P, opt, a, 0, lt_ctx_threads(ctx));
    size_t bytes = impl_workspace(&P, opt->impl);
    char *ws;
    int owned;
    LT_TRY(workspace_get(ctx, a, bytes, &ws, &owned));
    double *row_loss = (double *)ws;
    char *own = ws + head_bytes(&P);
    switch (opt->impl) {
    case LT_LCE_NAIVE: lt_cpu_lce_naive_forward(&P, own, a->lse, row_loss); break;
    case LT_LCE_CHUNKED: lt_cpu_lce_chunked_forward(&P, own, a->lse, row_loss); break;
    default: lt_cpu_lce_fused_forward(&P, own, a->lse, row_loss); break;
    }
    reduce_loss(&P, a, row_loss);
    if (owned) lt_free(ctx, LT_DEVICE_CPU, ws, bytes);
    return LT_OK;
}

lt_status lt_lce_cpu_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    lce_problem P;
    problem_init(&P, opt, a, 1, lt_ctx_threads(ctx));
    size_t bytes = impl_workspace(&P, opt->impl);
    char *ws;
    int owned;
    LT_TRY(workspace_get(ctx, a, bytes, &ws, &owned));
    float *coef = (float *)ws;
    char *own = ws + head_bytes(&P);
    upstream_coef(&P, a->dloss, coef);
    float *dw = P.want_dw ? (float *)a->dw->data : NULL;
    switch (opt->impl) {
    case LT_LCE_NAIVE: lt_cpu_lce_naive_backward(&P, own, a->lse, coef, a->dh->data, dw); break;
    case LT_LCE_CHUNKED: lt_cpu_lce_chunked_backward(&P, own, a->lse, coef, a->dh->data, dw); break;
    default: lt_cpu_lce_fused_backward(&P, own, a->lse, coef, a->dh->data, dw); break;
    }
    if (owned) lt_free(ctx, LT_DEVICE_CPU, ws, bytes);
    return LT_OK;
}

lt_status lt_lce_cpu_forward_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a) {
    const int threads = lt_ctx_threads(ctx);
    size_t bytes = lt_lce_cpu_workspace_bytes(opt, a, LT_LCE_PASS_FORWARD_BACKWARD, threads);
    char *ws;
    int owned;
    LT_TRY(workspace_get(ctx, a, bytes, &ws, &owned));
    lt_status st = LT_OK;
    if (!fb_one_pass(opt, a)) {
        lt_lce_args b = *a; /* both calls share the one block, sized for the larger */
        b.workspace = ws;
        st = lt_lce_cpu_forward(ctx, opt, &b);
        if (st == LT_OK) st = lt_lce_cpu_backward(ctx, opt, &b);
    } else {
        lce_problem P;
        problem_init(&P, opt, a, LT_LCE_PASS_FORWARD_BACKWARD, threads);
        P.ctx = ctx;
        double *row_loss = (double *)ws;
        float *coef = (float *)(ws + (size_t)P.N * sizeof(double));
        upstream_coef(&P, a->dloss, coef);
        lt_cpu_lce_fused_forward_backward(&P, ws + head_bytes(&P), a->lse, row_loss, coef, a->dh->data);
        reduce_loss(&P, a, row_loss);
    }
    if (owned) lt_free(ctx, LT_DEVICE_CPU, ws, bytes);
    return st;
}

/* ---- per-row math ---- */

/* exp here is core/fastmath.h's branch-free lt_fast_exp, so the row loops vectorise without
 * -ffast-math: inputs below -87 (-inf included) give exp(-87) ≈ 1.6e-38, which is 0 for every sum
 * it enters; above 88 exp(88); a NaN input returns NaN, so a non-finite logit reaches the loss as
 * NaN. The softcap is lt_fast_softcap (its tanh within 3 ulp of tanhf): libm's tanhf would be a
 * call per logit, one per vocabulary entry and token, forward and backward. */

void lt_cpu_lce_stat_init(lce_stat *st) {
    st->m = -INFINITY;
    st->zt = 0;
    st->s = 0;
    st->sz = 0;
}

#define LANES 16 /* independent accumulators: one AVX-512 register, or two AVX2 ones */

/* Max and sum of z[0..n) in LANES independent accumulators (so the compiler vectorises), folded
 * in a fixed order: the same float result on every call, which the stat paths rely on. */
static inline void row_max_sum(const float *z, int64_t n, float *max, double *sum) {
    float mx[LANES], sm[LANES];
    for (int l = 0; l < LANES; l++) {
        mx[l] = -INFINITY;
        sm[l] = 0;
    }
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) {
            float v = z[j + l];
            mx[l] = v > mx[l] ? v : mx[l];
            sm[l] += v;
        }
    float m = -INFINITY;
    double sz = 0;
    for (int l = 0; l < LANES; l++) {
        m = mx[l] > m ? mx[l] : m;
        sz += sm[l];
    }
    for (; j < n; j++) {
        m = z[j] > m ? z[j] : m;
        sz += z[j];
    }
    *max = m;
    *sum = sz;
}

LT_CPU_CLONES void lt_cpu_lce_stat_update(lce_stat *st, const float *z, int64_t n, int64_t v0, int32_t target) {
    float m;
    double sz;
    row_max_sum(z, n, &m, &sz);
    float es[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) es[l] += lt_fast_exp(z[j + l] - m);
    double s = 0;
    for (int l = 0; l < LANES; l++) s += es[l];
    for (; j < n; j++) s += lt_fast_exp(z[j] - m);
    if (target >= v0 && target < v0 + n) st->zt = z[target - v0];
    st->sz += sz;
    if (m > st->m) {
        st->s = st->s * exp((double)st->m - (double)m) + s;
        st->m = m;
    } else {
        st->s += s * exp((double)m - (double)st->m);
    }
}

void lt_cpu_lce_stat_merge(lce_stat *a, const lce_stat *b) {
    if (b->s == 0) return; /* b saw nothing */
    a->zt += b->zt;        /* exactly one side captured the target; the other holds 0 */
    a->sz += b->sz;
    if (b->m > a->m) {
        a->s = a->s * exp((double)a->m - (double)b->m) + b->s;
        a->m = b->m;
    } else {
        a->s += b->s * exp((double)b->m - (double)a->m);
    }
}

double lt_cpu_lce_finish_row(const lce_problem *P, int64_t i, const lce_stat *st, float *lse) {
    if (lce_ignored(P, i)) {
        lse[i] = 0;
        return 0;
    }
    double l = (double)st->m + log(st->s);
    lse[i] = (float)l;
    double loss = l - (1 - P->eps) * st->zt - P->eps * st->sz / (double)P->V + P->z_loss * l * l;
    return P->weight ? loss * P->weight[i] : loss;
}

LT_CPU_CLONES void lt_cpu_lce_grad_row(const lce_problem *P, float *s, int64_t n, int64_t v0, int32_t target, float lse,
                                       float coef) {
    if (coef == 0) {
        memset(s, 0, (size_t)n * sizeof(float));
        return;
    }
    /* ∂loss/∂z_j = coef·[(1 + 2·zl·lse)·p_j − ε/V − (1−ε)·[j = target]], p_j = exp(z_j − lse);
     * with a softcap z = cap·tanh(s/cap), times ∂z/∂s = 1 − tanh². */
    float a = (float)(coef * (1.0 + 2.0 * P->z_loss * lse));
    float b = (float)(coef * P->eps / (double)P->V);
    float hit = (float)(coef * (1.0 - P->eps));
    int64_t t = target >= v0 && target < v0 + n ? target - v0 : -1;
    if (P->softcap > 0) {
        float c = (float)P->softcap, ic = (float)(1.0 / P->softcap);
#pragma omp simd
        for (int64_t j = 0; j < n; j++) {
            float th = lt_fast_tanh(s[j] * ic);
            float g = a * lt_fast_exp(c * th - lse) - b - (j == t ? hit : 0.0f);
            s[j] = g * (1.0f - th * th);
        }
    } else {
        float st = t >= 0 ? s[t] : 0;
        for (int64_t j = 0; j < n; j++) s[j] = a * lt_fast_exp(s[j] - lse) - b;
        if (t >= 0) s[t] = a * lt_fast_exp(st - lse) - b - hit;
    }
}

LT_CPU_CLONES void lt_cpu_lce_fb_row(const lce_problem *P, lce_stat *st, float *z, int64_t n, int64_t v0,
                                     int32_t target, float *acc_row) {
    lt_fast_softcap(z, n, (float)P->softcap);
    float m;
    double sz;
    row_max_sum(z, n, &m, &sz);
    if (target >= v0 && target < v0 + n) st->zt = z[target - v0];
    st->sz += sz;
    if (m > st->m) {
        double f = st->m == -INFINITY ? 0.0 : exp((double)st->m - (double)m);
        st->s *= f;
        if (acc_row) {
            float ff = (float)f;
            for (int64_t c = 0; c < P->C; c++) acc_row[c] *= ff;
        }
        st->m = m;
    }
    const float ref = st->m;
    float es[LANES] = {0};
    int64_t j = 0;
    if (P->softcap > 0) {
        const float ic = (float)(1.0 / P->softcap);
        for (; j < n; j++) {
            float e = lt_fast_exp(z[j] - ref), th = z[j] * ic;
            es[j % LANES] += e;
            z[j] = e * (1.0f - th * th);
        }
    } else {
        for (; j + LANES <= n; j += LANES)
            for (int l = 0; l < LANES; l++) {
                float e = lt_fast_exp(z[j + l] - ref);
                es[l] += e;
                z[j + l] = e;
            }
        for (; j < n; j++) {
            float e = lt_fast_exp(z[j] - ref);
            es[0] += e;
            z[j] = e;
        }
    }
    double s = 0;
    for (int l = 0; l < LANES; l++) s += es[l];
    st->s += s;
}

/* ---- conversions ---- */

void lt_cpu_lce_rows_to_f32(lt_dtype t, const void *base, int64_t row_bytes, int64_t r0, int64_t nr, int64_t C,
                            float *out) {
    const uint8_t *p = (const uint8_t *)base + r0 * row_bytes;
    for (int64_t r = 0; r < nr; r++) lt_dequantize_row(t, p + r * row_bytes, out + r * C, C);
}

typedef struct {
    lt_dtype t;
    const void *base;
    int64_t row_bytes, r0, C;
    float *out;
} conv_job;

static void conv_range(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const conv_job *j = arg;
    lt_cpu_lce_rows_to_f32(j->t, j->base, j->row_bytes, j->r0 + begin, end - begin, j->C, j->out + begin * j->C);
}

void lt_cpu_lce_rows_to_f32_parallel(int threads, lt_dtype t, const void *base, int64_t row_bytes, int64_t r0,
                                     int64_t nr, int64_t C, float *out) {
    conv_job j = {t, base, row_bytes, r0, C, out};
    lt_parallel_for(threads, nr, 16, conv_range, &j);
}

void lt_cpu_lce_rows_from_f32(lt_dtype t, void *base, int64_t r0, int64_t nr, int64_t C, const float *src) {
    if (t == LT_DTYPE_F32) {
        memcpy((float *)base + r0 * C, src, (size_t)(nr * C) * sizeof(float));
        return;
    }
    uint16_t *d = (uint16_t *)base + r0 * C;
    for (int64_t k = 0; k < nr * C; k++) d[k] = lt_f32_to_bf16(src[k]);
}

void lt_cpu_lce_rows_zero(lt_dtype t, void *base, int64_t r0, int64_t nr, int64_t C) {
    size_t es = t == LT_DTYPE_F32 ? sizeof(float) : sizeof(uint16_t);
    memset((char *)base + (size_t)(r0 * C) * es, 0, (size_t)(nr * C) * es); /* bf16 0 is all-zero bits */
}
