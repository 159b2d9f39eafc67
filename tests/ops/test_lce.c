/* Linear cross-entropy, every backend in the build. Cases of every backend: the public entry
 * points against the float64 reference (tests/helpers/ref_ops.h) with the op matrix's tolerance
 * rule, on the CPU always and on CUDA when the build has it and a device is found (else "cuda:
 * skipped: no CUDA device"). CPU cases: every implementation (naive, chunked, fused) against a
 * float64 reference computed here from the same quantised/rounded inputs — loss, lse, grad h,
 * grad W — across head dtypes, reductions, options and ignore patterns; bf16 against twice the
 * error of a naive bf16 computation; float64 finite differences; exact zeros for ignored rows;
 * workspace accounting; typed errors; each numeric check through lt_lce_forward then
 * lt_lce_backward and through lt_lce_forward_backward (dloss given up front). CUDA cases (bf16 h;
 * bf16 and block-quantized heads; they need a device and are skipped with a message without one):
 * mean / sum / none reductions, label smoothing, z-loss, softcap, ignored targets, token weights,
 * small tiles (many chunks), dW accumulation, the error naming a bad target; each through
 * lt_lce_forward + lt_lce_backward and through lt_lce_forward_backward (one pass: two GEMMs per
 * tile, bf16 and fp32 logit tiles, running max moved late; and its two-call fallback for dw,
 * softcap with smoothing), with the workspace bound and the bytes the allocator saw, against
 * float64 with twice the error of a naive bf16 implementation (bf16 logits and logit gradients,
 * emulated here), some also against the CPU backend. LONGTUNE_TEST_FILTER=pattern runs the
 * matching cases only (cmocka's glob, e.g. "fb_*" for slow compute-sanitizer runs). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "helpers/backends.h"
#include "helpers/ref_ops.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/lce.h"
#include "longtune/tensor.h"

/* ---- CPU cases ------------------------------------------------------------------------------ */

/* ---- inputs ---- */

typedef struct {
    int64_t N, V, C;
    lt_dtype hdt, wdt;
    void *h, *w;     /* library inputs */
    double *hx, *wx; /* their exact values (after rounding / quantisation) */
    int32_t *targets;
    float *weight; /* NULL or (N) */
} problem;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

/* Fills a (rows, C) matrix of dtype t from N(0, sd) and records its exact values in x. */
static void *make_matrix(uint64_t *rng, lt_dtype t, int64_t rows, int64_t C, float sd, double *x) {
    float *f = xmalloc((size_t)(rows * C) * sizeof(float)), *back = xmalloc((size_t)C * sizeof(float));
    lt_test_fill_normal(rng, f, rows * C, sd);
    int64_t rb = lt_dtype_row_bytes(t, C);
    uint8_t *m = xmalloc((size_t)(rows * rb));
    for (int64_t r = 0; r < rows; r++) {
        float *src = f + r * C;
        if (t == LT_DTYPE_F32) {
            memcpy(m + r * rb, src, (size_t)rb);
            for (int64_t c = 0; c < C; c++) x[r * C + c] = src[c];
        } else if (t == LT_DTYPE_BF16) {
            uint16_t *d = (uint16_t *)(m + r * rb);
            for (int64_t c = 0; c < C; c++) {
                d[c] = lt_f32_to_bf16(src[c]);
                x[r * C + c] = lt_bf16_to_f32(d[c]);
            }
        } else {
            lt_quantize_row(t, src, m + r * rb, C);
            lt_dequantize_row(t, m + r * rb, back, C);
            for (int64_t c = 0; c < C; c++) x[r * C + c] = back[c];
        }
    }
    free(f);
    free(back);
    return m;
}

enum { IGN_NONE, IGN_SOME, IGN_ALL };

static problem make_problem(uint64_t *rng, int64_t N, int64_t V, int64_t C, lt_dtype hdt, lt_dtype wdt, int ignore,
                            int weights, int32_t ignore_index) {
    problem p = {N, V, C, hdt, wdt, NULL, NULL, NULL, NULL, NULL, NULL};
    p.hx = xmalloc((size_t)(N * C) * sizeof(double));
    p.wx = xmalloc((size_t)(V * C) * sizeof(double));
    p.h = make_matrix(rng, hdt, N, C, 1.0f, p.hx);
    /* logits with standard deviation ~2.5: peaked enough that lse and the target matter */
    p.w = make_matrix(rng, wdt, V, C, (float)(2.5 / sqrt((double)C)), p.wx);
    p.targets = xmalloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++) {
        p.targets[i] = (int32_t)(lt_test_rand_u64(rng) % (uint64_t)V);
        if (ignore == IGN_ALL || (ignore == IGN_SOME && lt_test_rand_u64(rng) % 3 == 0)) p.targets[i] = ignore_index;
    }
    if (ignore == IGN_SOME) p.targets[0] = ignore_index; /* at least one, and at a tile edge */
    if (weights) {
        p.weight = xmalloc((size_t)N * sizeof(float));
        for (int64_t i = 0; i < N; i++) p.weight[i] = (float)lt_test_uniform(rng, 0.25, 2.0);
    }
    return p;
}

static void free_problem(problem *p) {
    free(p->h);
    free(p->w);
    free(p->hx);
    free(p->wx);
    free(p->targets);
    free(p->weight);
}

/* ---- float64 reference ---- */

typedef struct {
    double loss; /* reduced (mean/sum); for NONE unused */
    double *tok; /* (N) weighted per-token loss */
    double *lse; /* (N) */
    double *dh;  /* (N, C) */
    double *dw;  /* (V, C) */
    /* The largest Σ of the gradients' terms in magnitude with the softcap's derivative left out
     * (Σ_j |∂loss/∂z_ij|·|W_jc| for dh, Σ_i |∂loss/∂z_ij|·|h_ic| for dw): the scale an fp32 error
     * of dh and dw is bounded by. With saturating logits the softcap's derivative, 1 - tanh², is
     * formed from the capped logit in fp32, so its absolute error is a few ulp of 1 however small
     * it is: dh and dw there are small, their errors are not. */
    double dh_mag, dw_mag;
} reference;

/* Straight from the definitions in lce.h: z = softcap(h·Wᵀ); per-token
 * (1-ε)(lse - z_t) + ε·mean_j(lse - z_j) + zl·lse², weighted; and its derivative by the chain
 * rule through the softmax and the softcap. dloss: (1) or (N). */
static reference ref_compute(const problem *p, const lt_lce_options *o, const double *dloss) {
    int64_t N = p->N, V = p->V, C = p->C;
    int32_t ign = o->ignore_index ? o->ignore_index : LT_IGNORE_INDEX;
    double eps = o->label_smoothing, zl = o->z_loss, cap = o->softcap;
    reference r = {0,
                   xmalloc((size_t)N * 8),
                   xmalloc((size_t)N * 8),
                   xmalloc((size_t)(N * C) * 8),
                   xmalloc((size_t)(V * C) * 8),
                   0,
                   0};
    memset(r.dh, 0, (size_t)(N * C) * 8);
    memset(r.dw, 0, (size_t)(V * C) * 8);
    double *s = xmalloc((size_t)V * 8), *z = xmalloc((size_t)V * 8), *g = xmalloc((size_t)V * 8);
    double *ga = xmalloc((size_t)V * 8), *dh_mag = xmalloc((size_t)(N * C) * 8), *dw_mag = xmalloc((size_t)(V * C) * 8);
    memset(dh_mag, 0, (size_t)(N * C) * 8);
    memset(dw_mag, 0, (size_t)(V * C) * 8);
    double total = 0, den = 0;
    for (int64_t i = 0; i < N; i++) {
        double wi = p->weight ? p->weight[i] : 1.0;
        if (p->targets[i] != ign) den += wi;
    }
    for (int64_t i = 0; i < N; i++) {
        int32_t t = p->targets[i];
        double wi = p->weight ? p->weight[i] : 1.0;
        if (t == ign) {
            r.tok[i] = 0;
            r.lse[i] = 0;
            continue;
        }
        double mx = -INFINITY;
        for (int64_t j = 0; j < V; j++) {
            double acc = 0;
            for (int64_t c = 0; c < C; c++) acc += p->hx[i * C + c] * p->wx[j * C + c];
            s[j] = acc;
            z[j] = cap > 0 ? cap * tanh(acc / cap) : acc;
            mx = fmax(mx, z[j]);
        }
        double se = 0, mean_nll = 0;
        for (int64_t j = 0; j < V; j++) se += exp(z[j] - mx);
        double lse = mx + log(se);
        for (int64_t j = 0; j < V; j++) mean_nll += (lse - z[j]) / (double)V;
        r.lse[i] = lse;
        r.tok[i] = wi * ((1 - eps) * (lse - z[t]) + eps * mean_nll + zl * lse * lse);
        total += r.tok[i];
        double up = o->reduction == LT_REDUCTION_NONE ? dloss[i]
            : o->reduction == LT_REDUCTION_SUM        ? dloss[0]
                                                      : dloss[0] / den;
        for (int64_t j = 0; j < V; j++) {
            double pj = exp(z[j] - lse);
            double dz = (1 - eps) * (pj - (j == t)) + eps * (pj - 1.0 / (double)V) + 2 * zl * lse * pj;
            double ds = cap > 0 ? 1 - tanh(s[j] / cap) * tanh(s[j] / cap) : 1;
            g[j] = up * wi * dz * ds;
            ga[j] = fabs(up * wi * dz);
        }
        for (int64_t j = 0; j < V; j++)
            for (int64_t c = 0; c < C; c++) {
                r.dh[i * C + c] += g[j] * p->wx[j * C + c];
                r.dw[j * C + c] += g[j] * p->hx[i * C + c];
                dh_mag[i * C + c] += ga[j] * fabs(p->wx[j * C + c]);
                dw_mag[j * C + c] += ga[j] * fabs(p->hx[i * C + c]);
            }
    }
    for (int64_t k = 0; k < N * C; k++) r.dh_mag = fmax(r.dh_mag, dh_mag[k]);
    for (int64_t k = 0; k < V * C; k++) r.dw_mag = fmax(r.dw_mag, dw_mag[k]);
    free(ga);
    free(dh_mag);
    free(dw_mag);
    r.loss = o->reduction == LT_REDUCTION_SUM ? total : den > 0 ? total / den : 0;
    free(s);
    free(z);
    free(g);
    return r;
}

static void free_ref(reference *r) {
    free(r->tok);
    free(r->lse);
    free(r->dh);
    free(r->dw);
}

/* ---- comparison ---- */

/* A tensor's scale: max |ref|, at least 1e-30. */
static double ref_scale(const double *ref, int64_t n) {
    double scale = 1e-30;
    for (int64_t k = 0; k < n; k++) scale = fmax(scale, fabs(ref[k]));
    return scale;
}

/* Largest error of got against ref relative to the tensor's scale (ref_scale). */
static double scaled_err(const float *got, const double *ref, int64_t n) {
    const double scale = ref_scale(ref, n);
    double worst = 0;
    for (int64_t k = 0; k < n; k++) {
        double e = fabs((double)got[k] - ref[k]);
        if (!(e <= worst)) worst = e; /* NaN (and the poison) propagate as failures */
    }
    return worst / scale;
}

/* tol (relative to max |ref|) plus the error the softcap's derivative brings when it is formed
 * in fp32 from the capped logit: a few ulp of 1 in absolute terms, so 8u of mag (the size of the
 * terms ref sums without that derivative, reference.dh_mag / dw_mag) relative to max |ref|. mag 0
 * (no softcap) leaves tol as it is. */
static double tol_softcap(double tol, const double *ref, int64_t n, double mag) {
    return mag > 0 ? tol + 8.0 * 0x1.0p-24 * mag / ref_scale(ref, n) : tol;
}

static void check_close(const char *what, const char *ctxs, const float *got, const double *ref, int64_t n,
                        double tol) {
    double e = scaled_err(got, ref, n);
    if (!(e <= tol)) {
        fprintf(stderr, "%s: %s scaled error %.3g > %.3g\n", ctxs, what, e, tol);
        fail();
    }
}

static float *dh_as_f32(const void *dh, lt_dtype t, int64_t n) {
    float *f = xmalloc((size_t)n * sizeof(float));
    for (int64_t k = 0; k < n; k++)
        f[k] = t == LT_DTYPE_F32 ? ((const float *)dh)[k] : lt_bf16_to_f32(((const uint16_t *)dh)[k]);
    return f;
}

/* ---- running the library ---- */

typedef struct {
    float *loss, *lse, *tok, *dh32, *dw;
    void *dh;
    float *dw0; /* dw before the backward (accumulation check) */
} outputs;

static void fill_poison(float *x, int64_t n) {
    for (int64_t k = 0; k < n; k++) x[k] = LT_TEST_POISON;
}

/* Through the public API: forward then backward (one_call = 0) or lt_lce_forward_backward (1);
 * dh in dh_dtype, dw when want_dw. Every output starts poisoned. */
static outputs run_lib_mode(lt_ctx *ctx, const problem *p, const lt_lce_options *o, const float *dloss,
                            lt_dtype dh_dtype, int want_dw, uint64_t *rng, int one_call) {
    int64_t N = p->N, V = p->V, C = p->C;
    outputs out = {0};
    int64_t nloss = o->reduction == LT_REDUCTION_NONE ? N : 1;
    out.loss = xmalloc((size_t)nloss * 4);
    out.lse = xmalloc((size_t)N * 4);
    out.tok = xmalloc((size_t)N * 4);
    fill_poison(out.loss, nloss);
    fill_poison(out.lse, N);
    fill_poison(out.tok, N);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(p->h, p->hdt, LT_DEVICE_CPU, 2, hs);
    a.w = lt_tensor_view(p->w, p->wdt, LT_DEVICE_CPU, 2, ws);
    a.targets = p->targets;
    a.token_weight = p->weight;
    a.loss = out.loss;
    a.lse = out.lse;
    a.token_loss = out.tok;
    lt_status st = LT_OK;
    if (!one_call) {
        st = lt_lce_forward(ctx, o, &a);
        if (st != LT_OK) fprintf(stderr, "forward: %s\n", lt_ctx_error(ctx));
        assert_int_equal(st, LT_OK);
    }

    size_t dhb = (size_t)(N * C) * (dh_dtype == LT_DTYPE_F32 ? 4 : 2);
    out.dh = xmalloc(dhb);
    memset(out.dh, 0xff, dhb); /* NaN in both f32 and bf16 */
    lt_tensor dh = lt_tensor_view(out.dh, dh_dtype, LT_DEVICE_CPU, 2, hs), dw;
    a.dh = &dh;
    if (want_dw) {
        out.dw = xmalloc((size_t)(V * C) * 4);
        out.dw0 = xmalloc((size_t)(V * C) * 4);
        lt_test_fill_normal(rng, out.dw0, V * C, 0.1f);
        memcpy(out.dw, out.dw0, (size_t)(V * C) * 4);
        dw = lt_tensor_view(out.dw, LT_DTYPE_F32, LT_DEVICE_CPU, 2, ws);
        a.dw = &dw;
    }
    a.dloss = dloss;
    st = one_call ? lt_lce_forward_backward(ctx, o, &a) : lt_lce_backward(ctx, o, &a);
    if (st != LT_OK) fprintf(stderr, "%s: %s\n", one_call ? "forward_backward" : "backward", lt_ctx_error(ctx));
    assert_int_equal(st, LT_OK);
    out.dh32 = dh_as_f32(out.dh, dh_dtype, N * C);
    if (want_dw)
        for (int64_t k = 0; k < V * C; k++) out.dw[k] -= out.dw0[k]; /* the accumulated part */
    return out;
}

static outputs run_lib(lt_ctx *ctx, const problem *p, const lt_lce_options *o, const float *dloss, lt_dtype dh_dtype,
                       int want_dw, uint64_t *rng) {
    return run_lib_mode(ctx, p, o, dloss, dh_dtype, want_dw, rng, 0);
}

static void free_outputs(outputs *o) {
    free(o->loss);
    free(o->lse);
    free(o->tok);
    free(o->dh);
    free(o->dh32);
    free(o->dw);
    free(o->dw0);
}

/* Ignored tokens: lse, token loss and every dh element exactly 0. */
static void check_ignored_exact(const problem *p, const lt_lce_options *o, const outputs *out) {
    int32_t ign = o->ignore_index ? o->ignore_index : LT_IGNORE_INDEX;
    for (int64_t i = 0; i < p->N; i++) {
        if (p->targets[i] != ign) continue;
        assert_true(out->lse[i] == 0.0f && out->tok[i] == 0.0f);
        for (int64_t c = 0; c < p->C; c++) assert_true(out->dh32[i * p->C + c] == 0.0f);
    }
}

static const char *impl_name(lt_lce_impl i) {
    return i == LT_LCE_NAIVE ? "naive" : i == LT_LCE_CHUNKED ? "chunked" : i == LT_LCE_FUSED ? "fused" : "auto";
}

typedef struct {
    const char *name;
    float eps, zl, cap;
    int weights;
} option_set;

static const option_set option_sets[] = {
    {"plain", 0, 0, 0, 0},
    {"smoothing", 0.1f, 0, 0, 0},
    {"z-loss", 0, 1e-3f, 0, 0},
    {"softcap", 0, 0, 3.0f, 0},
    {"weights", 0, 0, 0, 1},
    {"all", 0.2f, 5e-3f, 4.0f, 1},
    {"saturating softcap", 0, 0, 0.5f, 0},
};
#define N_OPTION_SETS ((int)(sizeof option_sets / sizeof option_sets[0]))

static float *make_dloss(uint64_t *rng, const lt_lce_options *o, int64_t N, double **dl64) {
    int64_t n = o->reduction == LT_REDUCTION_NONE ? N : 1;
    float *d = xmalloc((size_t)n * 4);
    *dl64 = xmalloc((size_t)n * 8);
    for (int64_t k = 0; k < n; k++) {
        d[k] = (float)lt_test_uniform(rng, 0.5, 1.5);
        (*dl64)[k] = d[k];
    }
    return d;
}

/* One problem through one impl, compared with float64 at fp32 tolerance. */
static void check_f32_case(lt_ctx *ctx, uint64_t *rng, lt_dtype wdt, lt_lce_impl impl, lt_reduction red,
                           const option_set *os, int ignore, int tile_n, int tile_v, int64_t N, int64_t V, int64_t C) {
    lt_lce_options o = {.impl = impl,
                        .reduction = red,
                        .label_smoothing = os->eps,
                        .z_loss = os->zl,
                        .softcap = os->cap,
                        .tile_n = tile_n,
                        .tile_v = tile_v};
    if (ignore == IGN_SOME && os->weights) o.ignore_index = -1; /* a non-default ignore index too */
    problem p =
        make_problem(rng, N, V, C, LT_DTYPE_F32, wdt, ignore, os->weights, o.ignore_index ? o.ignore_index : -100);
    double *dl64;
    float *dl = make_dloss(rng, &o, N, &dl64);
    reference r = ref_compute(&p, &o, dl64);
    int dense = wdt == LT_DTYPE_F32 || wdt == LT_DTYPE_BF16;
    /* forward_backward: without dw (the one-pass path for fused and auto), and with dw for auto */
    for (int one_call = 0; one_call < 2; one_call++) {
        int want_dw = dense && (!one_call || impl == LT_LCE_AUTO);
        outputs out = run_lib_mode(ctx, &p, &o, dl, LT_DTYPE_F32, want_dw, rng, one_call);
        char desc[180];
        snprintf(desc, sizeof desc, "%s head %s impl %s reduction %d options %s ignore %d tiles %dx%d dw %d",
                 one_call ? "forward_backward" : "forward+backward", lt_dtype_name(wdt), impl_name(impl), (int)red,
                 os->name, ignore, tile_n, tile_v, want_dw);
        double tol = LT_TOL_F32_REL;
        if (red == LT_REDUCTION_NONE) {
            check_close("loss", desc, out.loss, r.tok, N, tol);
        } else {
            double e = fabs((double)out.loss[0] - r.loss) / fmax(fabs(r.loss), 1e-30);
            if (ignore == IGN_ALL) e = out.loss[0] == 0.0f ? 0 : 1;
            if (!(e <= tol)) {
                fprintf(stderr, "%s: loss %.9g vs %.9g\n", desc, (double)out.loss[0], r.loss);
                fail();
            }
        }
        check_close("token loss", desc, out.tok, r.tok, N, tol);
        check_close("lse", desc, out.lse, r.lse, N, tol);
        const int capped = o.softcap > 0.0f;
        check_close("dh", desc, out.dh32, r.dh, N * C, tol_softcap(tol, r.dh, N * C, capped ? r.dh_mag : 0));
        if (want_dw) check_close("dw", desc, out.dw, r.dw, V * C, tol_softcap(tol, r.dw, V * C, capped ? r.dw_mag : 0));
        check_ignored_exact(&p, &o, &out);
        if (ignore == IGN_ALL) {
            for (int64_t k = 0; k < N * C; k++) assert_true(out.dh32[k] == 0.0f);
            if (want_dw)
                for (int64_t k = 0; k < V * C; k++) assert_true(out.dw[k] == 0.0f);
        }
        free_outputs(&out);
    }
    free_ref(&r);
    free(dl);
    free(dl64);
    free_problem(&p);
}

static void every_head_impl_reduction_option_and_ignore_pattern(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    const lt_dtype heads[] = {LT_DTYPE_F32,  LT_DTYPE_BF16, LT_DTYPE_Q8_0,
                              LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    const lt_lce_impl impls[] = {LT_LCE_NAIVE, LT_LCE_CHUNKED, LT_LCE_FUSED, LT_LCE_AUTO};
    /* Every head × impl × reduction × ignore pattern; the option set rotates so that each head and
     * each impl meets every option set (for a fixed head, (ii + red + ig) covers 0..5). */
    for (int hi = 0; hi < 6; hi++)
        for (int ii = 0; ii < 4; ii++)
            for (int red = 0; red < 3; red++)
                for (int ig = 0; ig < 3; ig++) {
                    int os = (hi + ii + red + ig) % N_OPTION_SETS;
                    /* ragged tiles: 13 tokens in tiles of 4, 203 vocabulary rows in tiles of 48 */
                    int tn = impls[ii] == LT_LCE_AUTO ? 0 : 4, tv = impls[ii] == LT_LCE_AUTO ? 0 : 48;
                    check_f32_case(ctx, &rng, heads[hi], impls[ii], (lt_reduction)red, &option_sets[os], ig, tn, tv, 13,
                                   203, 64);
                }
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Default tiles on a shape with more than one default token tile (512) and several vocabulary
 * tiles, with 1 thread and with an odd thread count that splits the vocabulary tiles unevenly. */
static void default_tiles_and_three_threads(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 11;
    lt_ctx *ctx = lt_ctx_new();
    for (int threads = 1; threads <= 3; threads += 2) {
        lt_ctx_set_threads(ctx, threads);
        check_f32_case(ctx, &rng, LT_DTYPE_F32, LT_LCE_FUSED, LT_REDUCTION_MEAN, &option_sets[5], IGN_SOME, 0, 0, 600,
                       1100, 32);
        check_f32_case(ctx, &rng, LT_DTYPE_Q4_1, LT_LCE_CHUNKED, LT_REDUCTION_SUM, &option_sets[0], IGN_NONE, 0, 0, 600,
                       1100, 32);
    }
    lt_ctx_free(ctx);
}

/* bf16 hidden and head: the library's error against float64 is at most twice that of a naive
 * bf16 computation (logits rounded to bf16, softmax in f32, logit gradients rounded to bf16,
 * grad h rounded to bf16) against the same reference. */
typedef struct {
    float *tok, *lse, *dh, *dw;
} naive_bf16;

static float bf(double x) { return lt_bf16_to_f32(lt_f32_to_bf16((float)x)); }

static naive_bf16 naive_bf16_compute(const problem *p, const lt_lce_options *o, const double *dloss) {
    int64_t N = p->N, V = p->V, C = p->C;
    int32_t ign = o->ignore_index ? o->ignore_index : LT_IGNORE_INDEX;
    float eps = o->label_smoothing, zl = o->z_loss, cap = o->softcap;
    naive_bf16 r = {xmalloc((size_t)N * 4), xmalloc((size_t)N * 4), xmalloc((size_t)(N * C) * 4),
                    xmalloc((size_t)(V * C) * 4)};
    memset(r.dw, 0, (size_t)(V * C) * 4);
    float *z = xmalloc((size_t)V * 4), *g = xmalloc((size_t)V * 4);
    float den = 0;
    for (int64_t i = 0; i < N; i++)
        if (p->targets[i] != ign) den += p->weight ? p->weight[i] : 1.0f;
    for (int64_t i = 0; i < N; i++) {
        int32_t t = p->targets[i];
        float wi = p->weight ? p->weight[i] : 1.0f;
        for (int64_t c = 0; c < C; c++) r.dh[i * C + c] = 0;
        if (t == ign) {
            r.tok[i] = r.lse[i] = 0;
            continue;
        }
        float mx = -INFINITY;
        for (int64_t j = 0; j < V; j++) {
            float acc = 0;
            for (int64_t c = 0; c < C; c++) acc += (float)p->hx[i * C + c] * (float)p->wx[j * C + c];
            z[j] = bf(cap > 0 ? bf(acc) > 0 ? cap * tanhf(bf(acc) / cap) : cap * tanhf(bf(acc) / cap) : acc);
            mx = fmaxf(mx, z[j]);
        }
        float se = 0, sz = 0;
        for (int64_t j = 0; j < V; j++) {
            se += expf(z[j] - mx);
            sz += z[j];
        }
        float lse = mx + logf(se);
        r.lse[i] = lse;
        r.tok[i] = wi * ((1 - eps) * (lse - z[t]) + eps * (lse - sz / (float)V) + zl * lse * lse);
        float up = o->reduction == LT_REDUCTION_NONE ? (float)dloss[i]
            : o->reduction == LT_REDUCTION_SUM       ? (float)dloss[0]
                                                     : (float)dloss[0] / den;
        for (int64_t j = 0; j < V; j++) {
            float pj = expf(z[j] - lse);
            float dz = (1 + 2 * zl * lse) * pj - eps / (float)V - (j == t ? 1 - eps : 0);
            float th = cap > 0 ? z[j] / cap : 0;
            g[j] = bf(up * wi * dz * (1 - th * th));
        }
        for (int64_t c = 0; c < C; c++) {
            float acc = 0;
            for (int64_t j = 0; j < V; j++) acc += g[j] * (float)p->wx[j * C + c];
            r.dh[i * C + c] = bf(acc);
        }
        for (int64_t j = 0; j < V; j++)
            for (int64_t c = 0; c < C; c++) r.dw[j * C + c] += g[j] * (float)p->hx[i * C + c];
    }
    free(z);
    free(g);
    return r;
}

static void bf16_within_twice_the_naive_bf16_error(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 22;
    lt_ctx *ctx = lt_ctx_new();
    const lt_lce_impl impls[] = {LT_LCE_NAIVE, LT_LCE_CHUNKED, LT_LCE_FUSED};
    for (int ii = 0; ii < 3; ii++)
        for (int red = 0; red < 3; red++)
            for (int os = 0; os < N_OPTION_SETS; os++) {
                lt_lce_options o = {.impl = impls[ii],
                                    .reduction = (lt_reduction)red,
                                    .label_smoothing = option_sets[os].eps,
                                    .z_loss = option_sets[os].zl,
                                    .softcap = option_sets[os].cap,
                                    .tile_n = 5,
                                    .tile_v = 64};
                int64_t N = 17, V = 150, C = 64;
                problem p = make_problem(&rng, N, V, C, LT_DTYPE_BF16, LT_DTYPE_BF16, IGN_SOME, option_sets[os].weights,
                                         LT_IGNORE_INDEX);
                double *dl64;
                float *dl = make_dloss(&rng, &o, N, &dl64);
                reference r = ref_compute(&p, &o, dl64);
                naive_bf16 nb = naive_bf16_compute(&p, &o, dl64);
                for (int one_call = 0; one_call < 2; one_call++) {
                    outputs out = run_lib_mode(ctx, &p, &o, dl, LT_DTYPE_BF16, !one_call, &rng, one_call);
                    char desc[128];
                    snprintf(desc, sizeof desc, "bf16 %s impl %s reduction %d options %s",
                             one_call ? "forward_backward" : "forward+backward", impl_name(impls[ii]), red,
                             option_sets[os].name);
                    /* floor: one bf16 half-ulp of the scale, for a naive error that happens to be tiny */
                    const double floor = 0x1.0p-9;
                    check_close("token loss", desc, out.tok, r.tok, N, fmax(2 * scaled_err(nb.tok, r.tok, N), floor));
                    check_close("lse", desc, out.lse, r.lse, N, fmax(2 * scaled_err(nb.lse, r.lse, N), floor));
                    check_close("dh", desc, out.dh32, r.dh, N * C, fmax(2 * scaled_err(nb.dh, r.dh, N * C), floor));
                    if (!one_call)
                        check_close("dw", desc, out.dw, r.dw, V * C, fmax(2 * scaled_err(nb.dw, r.dw, V * C), floor));
                    check_ignored_exact(&p, &o, &out);
                    free_outputs(&out);
                }
                free(nb.tok);
                free(nb.lse);
                free(nb.dh);
                free(nb.dw);
                free_ref(&r);
                free(dl);
                free(dl64);
                free_problem(&p);
            }
    lt_ctx_free(ctx);
}

/* ---- finite differences ---- */

static double ref_loss_only(const problem *p, const lt_lce_options *o, const double *dloss) {
    reference r = ref_compute(p, o, dloss);
    double l = 0;
    if (o->reduction == LT_REDUCTION_NONE)
        for (int64_t i = 0; i < p->N; i++) l += dloss[i] * r.tok[i];
    else l = dloss[0] * r.loss;
    free_ref(&r);
    return l;
}

/* The fp32 gradients are sums of products g_ij·W_jc (dh) or g_ij·h_ic (dw) with g = ∂loss/∂z;
 * their rounding error is relative to Σ|g||W|, not to the result, which can be much smaller when
 * terms cancel (a tiny problem with a near one-hot softmax). This bounds Σ_j|g_ij| per token by
 * 2·(1 + 2·zl·|lse_i|)·w_i·dloss_i (softmax and one-hot parts; the softcap's slope is ≤ 1), and
 * returns the largest Σ|g|·max|x| over rows (dh) or the sum over rows (dw). */
static double summand_scale(const problem *p, const lt_lce_options *o, const double *dl64, const reference *r,
                            int which) {
    double wsum = 0, xmax = 0, best = 0, total = 0;
    const double *x = which ? p->hx : p->wx;
    int64_t nx = which ? p->N * p->C : p->V * p->C;
    for (int64_t k = 0; k < nx; k++) xmax = fmax(xmax, fabs(x[k]));
    for (int64_t i = 0; i < p->N; i++)
        if (p->targets[i] != LT_IGNORE_INDEX) wsum += p->weight ? p->weight[i] : 1.0;
    for (int64_t i = 0; i < p->N; i++) {
        if (p->targets[i] == LT_IGNORE_INDEX) continue;
        double w = p->weight ? p->weight[i] : 1.0;
        double d = o->reduction == LT_REDUCTION_NONE ? dl64[i]
            : o->reduction == LT_REDUCTION_SUM       ? dl64[0]
                                                     : dl64[0] / (wsum > 0 ? wsum : 1.0);
        double g = 2.0 * (1.0 + 2.0 * o->z_loss * fabs(r->lse[i])) * w * fabs(d);
        best = fmax(best, g * xmax);
        total += g * xmax;
    }
    return which ? total : best;
}

static void check_close_scaled(const char *what, const char *ctxs, const float *got, const double *ref, int64_t n,
                               double scale, double tol) {
    double worst = 0, mx = 1e-30;
    for (int64_t k = 0; k < n; k++) mx = fmax(mx, fabs(ref[k]));
    scale = fmax(scale, mx);
    for (int64_t k = 0; k < n; k++) {
        double e = fabs((double)got[k] - ref[k]);
        if (!(e <= worst)) worst = e;
    }
    if (!(worst / scale <= tol)) {
        fprintf(stderr, "%s: %s error %.3g of the summand scale %.3g > %.3g\n", ctxs, what, worst / scale, scale, tol);
        fail();
    }
}

/* The float64 analytic gradient (and with it the formulas the library implements) against central
 * differences of the float64 loss, then the library's fp32 gradients against the same differences. */
static void gradients_match_finite_differences(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 33;
    lt_ctx *ctx = lt_ctx_new();
    for (int red = 0; red < 3; red++)
        for (int os = 0; os < N_OPTION_SETS; os++) {
            lt_lce_options o = {.impl = LT_LCE_FUSED,
                                .reduction = (lt_reduction)red,
                                .label_smoothing = option_sets[os].eps,
                                .z_loss = option_sets[os].zl,
                                .softcap = option_sets[os].cap,
                                .tile_n = 2,
                                .tile_v = 4};
            int64_t N = 5, V = 11, C = 8;
            problem p = make_problem(&rng, N, V, C, LT_DTYPE_F32, LT_DTYPE_F32, IGN_SOME, option_sets[os].weights,
                                     LT_IGNORE_INDEX);
            double *dl64;
            float *dl = make_dloss(&rng, &o, N, &dl64);
            reference r = ref_compute(&p, &o, dl64);
            double *fd_h = xmalloc((size_t)(N * C) * 8), *fd_w = xmalloc((size_t)(V * C) * 8);
            const double step = 1e-5;
            for (int which = 0; which < 2; which++) {
                double *x = which ? p.wx : p.hx, *fd = which ? fd_w : fd_h;
                int64_t n = which ? V * C : N * C;
                for (int64_t k = 0; k < n; k++) {
                    double x0 = x[k];
                    x[k] = x0 + step;
                    double lp = ref_loss_only(&p, &o, dl64);
                    x[k] = x0 - step;
                    double lm = ref_loss_only(&p, &o, dl64);
                    x[k] = x0;
                    fd[k] = (lp - lm) / (2 * step);
                }
            }
            float *a64 = xmalloc((size_t)(V * C) * 4);
            for (int64_t k = 0; k < N * C; k++) a64[k] = (float)r.dh[k];
            check_close("f64 dh vs FD", option_sets[os].name, a64, fd_h, N * C, 1e-6);
            for (int64_t k = 0; k < V * C; k++) a64[k] = (float)r.dw[k];
            check_close("f64 dw vs FD", option_sets[os].name, a64, fd_w, V * C, 1e-6);
            outputs out = run_lib(ctx, &p, &o, dl, LT_DTYPE_F32, 1, &rng);
            double sh = summand_scale(&p, &o, dl64, &r, 0), sw = summand_scale(&p, &o, dl64, &r, 1);
            check_close_scaled("dh vs FD", option_sets[os].name, out.dh32, fd_h, N * C, sh, LT_TOL_F32_REL);
            check_close_scaled("dw vs FD", option_sets[os].name, out.dw, fd_w, V * C, sw, LT_TOL_F32_REL);
            free_outputs(&out);
            out = run_lib_mode(ctx, &p, &o, dl, LT_DTYPE_F32, 0, &rng, 1);
            check_close_scaled("forward_backward dh vs FD", option_sets[os].name, out.dh32, fd_h, N * C, sh,
                               LT_TOL_F32_REL);
            free(a64);
            free_outputs(&out);
            free(fd_h);
            free(fd_w);
            free_ref(&r);
            free(dl);
            free(dl64);
            free_problem(&p);
        }
    lt_ctx_free(ctx);
}

/* ---- workspace accounting ---- */

static lt_status call(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a, int pass) {
    return pass == LT_LCE_PASS_FORWARD ? lt_lce_forward(ctx, o, a)
        : pass == LT_LCE_PASS_BACKWARD ? lt_lce_backward(ctx, o, a)
                                       : lt_lce_forward_backward(ctx, o, a);
}

static void workspace_is_exactly_what_is_allocated(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 44;
    lt_ctx *ctx = lt_ctx_new();
    const lt_dtype hds[] = {LT_DTYPE_F32, LT_DTYPE_BF16};
    const lt_dtype wds[] = {LT_DTYPE_F32, LT_DTYPE_BF16, LT_DTYPE_Q4_0};
    for (int hi = 0; hi < 2; hi++)
        for (int wi = 0; wi < 3; wi++)
            for (int ii = 0; ii < 4; ii++) {
                lt_lce_options o = {.impl = (lt_lce_impl)ii};
                int64_t N = 40, V = 300, C = 64;
                problem p = make_problem(&rng, N, V, C, hds[hi], wds[wi], IGN_SOME, 0, LT_IGNORE_INDEX);
                int64_t hs[2] = {N, C}, wsh[2] = {V, C};
                float loss, *lse = xmalloc((size_t)N * 4), dloss = 1;
                void *dhd = xmalloc((size_t)(N * C) * 4);
                float *dwd = xmalloc((size_t)(V * C) * 4);
                memset(dwd, 0, (size_t)(V * C) * 4);
                lt_tensor dh = lt_tensor_view(dhd, hds[hi], LT_DEVICE_CPU, 2, hs);
                lt_tensor dw = lt_tensor_view(dwd, LT_DTYPE_F32, LT_DEVICE_CPU, 2, wsh);
                lt_lce_args a;
                memset(&a, 0, sizeof a);
                a.h = lt_tensor_view(p.h, p.hdt, LT_DEVICE_CPU, 2, hs);
                a.w = lt_tensor_view(p.w, p.wdt, LT_DEVICE_CPU, 2, wsh);
                a.targets = p.targets;
                a.loss = &loss;
                a.lse = lse;
                a.dloss = &dloss;
                a.dh = &dh;
                for (int bw = 0; bw < 4; bw++) { /* 3: forward_backward with dw (two calls inside) */
                    int pass = bw < 3 ? bw : LT_LCE_PASS_FORWARD_BACKWARD;
                    a.dw = bw == 3 && wds[wi] != LT_DTYPE_Q4_0 ? &dw : NULL;
                    size_t want = lt_lce_workspace_bytes(&o, &a, pass, lt_ctx_threads(ctx));
                    assert_true(want > 0);
                    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
                    lt_mem_stats before = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
                    assert_int_equal(call(ctx, &o, &a, pass), LT_OK);
                    lt_mem_stats after = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
                    assert_int_equal(after.peak_bytes - before.used_bytes,
                                     lt_alloc_accounted_size(LT_DEVICE_CPU, want));
                    assert_int_equal(after.n_allocs - before.n_allocs, 1);
                    assert_int_equal(after.used_bytes, before.used_bytes);
                    /* a caller-provided workspace: no allocation at all */
                    a.workspace = lt_alloc(ctx, LT_DEVICE_CPU, want, "test workspace");
                    before = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
                    assert_int_equal(call(ctx, &o, &a, pass), LT_OK);
                    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).n_allocs, before.n_allocs);
                    lt_free(ctx, LT_DEVICE_CPU, a.workspace, want);
                    a.workspace = NULL;
                    /* allocation failure is LT_ERR_OOM with nothing leaked */
                    lt_mem_fail_nth(ctx, 1);
                    assert_int_equal(call(ctx, &o, &a, pass), LT_ERR_OOM);
                    lt_mem_fail_nth(ctx, 0);
                    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
                }
                free(lse);
                free(dhd);
                free(dwd);
                free_problem(&p);
            }
    lt_ctx_free(ctx);
}

/* The fused workspace does not grow with V (it is O(N + threads·tile)); naive's is N·V floats. */
static void fused_memory_does_not_scale_with_vocabulary(void **state) {
    (void)state;
    int64_t hs[2] = {4096, 1024}, ws1[2] = {32000, 1024}, ws2[2] = {151936, 1024};
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CPU, 2, hs);
    lt_tensor dh = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CPU, 2, hs);
    a.dh = &dh;
    lt_lce_options fused = {.impl = LT_LCE_FUSED}, naive = {.impl = LT_LCE_NAIVE};
    a.w = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CPU, 2, ws1);
    size_t f1 = lt_lce_workspace_bytes(&fused, &a, 1, 2);
    a.w = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CPU, 2, ws2);
    size_t f2 = lt_lce_workspace_bytes(&fused, &a, 1, 2), n2 = lt_lce_workspace_bytes(&naive, &a, 1, 2);
    assert_true(f1 == f2 && f1 > 0);
    assert_true(n2 >= (size_t)4096 * 151936 * 4);
    assert_true(f2 * 100 <= n2);
    /* The large shape (N=8192, V=151936, C=4096, 2 threads): the one-pass
     * forward_backward, f32 and bf16 hidden and head, stays within 1% of naive's two calls. */
    int64_t hl[2] = {8192, 4096}, wl[2] = {151936, 4096};
    const lt_dtype dts[] = {LT_DTYPE_F32, LT_DTYPE_BF16};
    for (int k = 0; k < 2; k++) {
        a.h = lt_tensor_view(NULL, dts[k], LT_DEVICE_CPU, 2, hl);
        a.w = lt_tensor_view(NULL, dts[k], LT_DEVICE_CPU, 2, wl);
        dh = lt_tensor_view(NULL, dts[k], LT_DEVICE_CPU, 2, hl);
        size_t fb = lt_lce_workspace_bytes(&fused, &a, LT_LCE_PASS_FORWARD_BACKWARD, 2);
        size_t nfb = lt_lce_workspace_bytes(&naive, &a, LT_LCE_PASS_FORWARD_BACKWARD, 2);
        assert_true(fb > 0 && fb * 100 <= nfb);
    }
}

/* forward_backward's running max moves by a lot: the last vocabulary tiles hold logits ~8x larger
 * than the first, so every token's max (and accumulator scale) is replaced late; f32 and bf16. */
static void forward_backward_rescales_when_the_max_jumps(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 66;
    lt_ctx *ctx = lt_ctx_new();
    for (int k = 0; k < 2; k++) {
        lt_lce_options o = {.impl = LT_LCE_FUSED,
                            .reduction = LT_REDUCTION_MEAN,
                            .z_loss = 1e-3f,
                            .label_smoothing = 0.1f,
                            .tile_n = 3,
                            .tile_v = 32};
        int64_t N = 9, V = 160, C = 32;
        problem p = make_problem(&rng, N, V, C, LT_DTYPE_F32, LT_DTYPE_F32, IGN_SOME, 0, LT_IGNORE_INDEX);
        float *w = p.w;
        for (int64_t j = V - 40; j < V; j++)
            for (int64_t c = 0; c < C; c++) {
                w[j * C + c] *= 8.0f;
                p.wx[j * C + c] = w[j * C + c];
            }
        if (k) o.tile_v = 0; /* default tiles: one vocabulary tile */
        double *dl64;
        float *dl = make_dloss(&rng, &o, N, &dl64);
        reference r = ref_compute(&p, &o, dl64);
        outputs out = run_lib_mode(ctx, &p, &o, dl, LT_DTYPE_F32, 0, &rng, 1);
        check_close("lse", "late max", out.lse, r.lse, N, LT_TOL_F32_REL);
        check_close("token loss", "late max", out.tok, r.tok, N, LT_TOL_F32_REL);
        check_close("dh", "late max", out.dh32, r.dh, N * C, LT_TOL_F32_REL);
        check_ignored_exact(&p, &o, &out);
        free_outputs(&out);
        free_ref(&r);
        free(dl);
        free(dl64);
        free_problem(&p);
    }
    lt_ctx_free(ctx);
}

/* ---- typed errors ---- */

static void bad_input_gets_typed_errors(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 55;
    lt_ctx *ctx = lt_ctx_new();
    int64_t N = 6, V = 50, C = 64;
    problem p = make_problem(&rng, N, V, C, LT_DTYPE_F32, LT_DTYPE_F32, IGN_NONE, 0, LT_IGNORE_INDEX);
    int64_t hs[2] = {N, C}, wsh[2] = {V, C};
    float loss = 0, lse[6], dloss = 1, dhd[6 * 64], dwd[50 * 64];
    lt_tensor dh = lt_tensor_view(dhd, LT_DTYPE_F32, LT_DEVICE_CPU, 2, hs);
    lt_tensor dw = lt_tensor_view(dwd, LT_DTYPE_F32, LT_DEVICE_CPU, 2, wsh);
    lt_lce_args good;
    memset(&good, 0, sizeof good);
    good.h = lt_tensor_view(p.h, LT_DTYPE_F32, LT_DEVICE_CPU, 2, hs);
    good.w = lt_tensor_view(p.w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, wsh);
    good.targets = p.targets;
    good.loss = &loss;
    good.lse = lse;
    good.dloss = &dloss;
    good.dh = &dh;
    lt_lce_options o = {0};
    assert_int_equal(lt_lce_forward(ctx, &o, &good), LT_OK);
    assert_int_equal(lt_lce_forward(ctx, NULL, &good), LT_OK);

    lt_lce_args a = good;
    int64_t wrong_c[2] = {V, 32};
    a.w = lt_tensor_view(p.w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, wrong_c);
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_SHAPE);
    assert_non_null(strstr(lt_ctx_error(ctx), "w is (50, 32)"));

    a = good;
    a.h.dtype = LT_DTYPE_F16;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_DTYPE);
    a = good;
    a.w.dtype = LT_DTYPE_I32;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_DTYPE);
    a = good;
    lt_tensor dh_i32 = dh;
    dh_i32.dtype = LT_DTYPE_I32;
    a.dh = &dh_i32;
    assert_int_equal(lt_lce_backward(ctx, &o, &a), LT_ERR_DTYPE);
    a = good;
    int64_t wrong_n[2] = {N - 1, C};
    lt_tensor dh_short = lt_tensor_view(dhd, LT_DTYPE_F32, LT_DEVICE_CPU, 2, wrong_n);
    a.dh = &dh_short;
    assert_int_equal(lt_lce_backward(ctx, &o, &a), LT_ERR_SHAPE);

    /* forward_backward needs dloss and loss up front */
    a = good;
    a.dloss = NULL;
    assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "dloss"));
    a = good;
    a.loss = NULL;
    assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_lce_workspace_bytes(&o, &good, 3, 1), 0);

    /* C not a multiple of the quantized block */
    int64_t hs48[2] = {N, 48}, ws48[2] = {V, 48};
    a = good;
    a.h = lt_tensor_view(p.h, LT_DTYPE_F32, LT_DEVICE_CPU, 2, hs48);
    a.w = lt_tensor_view(p.w, LT_DTYPE_INT4_G64, LT_DEVICE_CPU, 2, ws48);
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_SHAPE);
    assert_non_null(strstr(lt_ctx_error(ctx), "multiple of the int4_g64 block"));

    /* the first bad target is named */
    int32_t saved[6];
    memcpy(saved, p.targets, sizeof saved);
    p.targets[3] = (int32_t)V;
    p.targets[5] = -5;
    assert_int_equal(lt_lce_forward(ctx, &o, &good), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "position 3"));
    p.targets[3] = -100;
    assert_int_equal(lt_lce_backward(ctx, &o, &good), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "position 5"));
    memcpy(p.targets, saved, sizeof saved);

    float wbad[6] = {1, 1, NAN, 1, 1, 1};
    a = good;
    a.token_weight = wbad;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_INVALID_ARG);

    /* options */
    lt_lce_options bad = {.label_smoothing = 1.0f};
    assert_int_equal(lt_lce_forward(ctx, &bad, &good), LT_ERR_INVALID_ARG);
    bad = (lt_lce_options){.z_loss = -1};
    assert_int_equal(lt_lce_forward(ctx, &bad, &good), LT_ERR_INVALID_ARG);
    bad = (lt_lce_options){.softcap = NAN};
    assert_int_equal(lt_lce_forward(ctx, &bad, &good), LT_ERR_INVALID_ARG);
    bad = (lt_lce_options){.ignore_index = 7};
    assert_int_equal(lt_lce_forward(ctx, &bad, &good), LT_ERR_INVALID_ARG);
    bad = (lt_lce_options){.impl = (lt_lce_impl)9};
    assert_int_equal(lt_lce_forward(ctx, &bad, &good), LT_ERR_INVALID_ARG);
    bad = (lt_lce_options){.tile_v = -1};
    assert_int_equal(lt_lce_forward(ctx, &bad, &good), LT_ERR_INVALID_ARG);

    /* grad of a quantized head is refused, not silently skipped */
    double *qx = xmalloc((size_t)(V * C) * 8);
    uint8_t *q = make_matrix(&rng, LT_DTYPE_Q8_0, V, C, 0.1f, qx);
    a = good;
    a.w = lt_tensor_view(q, LT_DTYPE_Q8_0, LT_DEVICE_CPU, 2, wsh);
    a.dw = &dw;
    assert_int_equal(lt_lce_backward(ctx, &o, &a), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "q8_0"));
    free(q);
    free(qx);

    /* missing pointers, CUDA tensors, misaligned workspace */
    a = good;
    a.lse = NULL;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_lce_forward(ctx, &o, NULL), LT_ERR_INVALID_ARG);
    a = good;
    a.h.device = LT_DEVICE_CUDA;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_INVALID_ARG); /* w still on CPU */
    a.w.device = LT_DEVICE_CUDA;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "CUDA"));
    a = good;
    a.workspace = (char *)dwd + 4;
    assert_int_equal(lt_lce_forward(ctx, &o, &a), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_lce_workspace_bytes(&bad, &good, 0, 1), 0);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    free_problem(&p);
    lt_ctx_free(ctx);
}

/* ---- every backend present: the public entry points against the float64 reference ---------- */

/* A case of the backend-independent part: shapes, head dtype and options every backend supports;
 * every 7th target is ignored. */
typedef struct every_case {
    int64_t N, C, V;
    lt_dtype wdt;
    lt_reduction red;
    double eps, zl, cap;
    int weights;
} every_case;

static const every_case every_cases[] = {
    {53, 128, 900, LT_DTYPE_BF16, LT_REDUCTION_MEAN, 0, 0, 0, 0},
    {40, 64, 333, LT_DTYPE_BF16, LT_REDUCTION_SUM, 0.1, 0.01, 0, 1},
    {35, 128, 420, LT_DTYPE_Q8_0, LT_REDUCTION_NONE, 0, 0, 30, 0},
    {31, 64, 512, LT_DTYPE_BF16, LT_REDUCTION_MEAN, 0, 0.01, 30, 1},
};

static void *dev_up(lt_ctx *ctx, const lt_backend *be, const void *h, size_t bytes) {
    void *d = lt_alloc(ctx, be->device, bytes, "lce test buffer");
    assert_non_null(d);
    if (h) assert_int_equal(be->copy_to_device(ctx, d, h, bytes), LT_OK);
    return d;
}

static void every_case_on(const every_case *c, lt_device dev, uint64_t *rng) {
    const lt_backend *be = lt_backend_get(dev);
    assert_non_null(be);
    lt_ctx *ctx = lt_ctx_new();
    const lt_dtype dt = lt_test_input_dtype(dev);
    const int64_t N = c->N, C = c->C, V = c->V, nloss = c->red == LT_REDUCTION_NONE ? N : 1;
    /* h: values of the backend's input dtype in f32 storage; the head: stored in c->wdt, the
     * reference reads the exact stored values */
    float *hf = xmalloc(4 * (size_t)(N * C)), *wf = xmalloc(4 * (size_t)(V * C));
    double *hd = xmalloc(sizeof(double) * (size_t)(N * C)), *wd = xmalloc(sizeof(double) * (size_t)(V * C));
    for (int64_t i = 0; i < N * C; i++) {
        const double r = lt_test_normal(rng);
        hd[i] = dt == LT_DTYPE_BF16 ? lt_test_bf16_round(r) : (double)(float)r;
        hf[i] = (float)hd[i];
    }
    for (int64_t i = 0; i < V * C; i++) wf[i] = (float)(0.1 * lt_test_normal(rng));
    const size_t rb = (size_t)lt_dtype_row_bytes(c->wdt, C), wb = rb * (size_t)V;
    uint8_t *wq = xmalloc(wb);
    for (int64_t r = 0; r < V; r++) {
        uint8_t *row = wq + rb * (size_t)r;
        if (c->wdt == LT_DTYPE_BF16)
            for (int64_t k = 0; k < C; k++) ((uint16_t *)row)[k] = lt_f32_to_bf16(wf[r * C + k]);
        else lt_quantize_row(c->wdt, wf + r * C, row, C);
        lt_dequantize_row(c->wdt, row, wf + r * C, C);
        for (int64_t k = 0; k < C; k++) wd[r * C + k] = wf[r * C + k];
    }
    int32_t *tgt = xmalloc(4 * (size_t)N);
    float *twf = xmalloc(4 * (size_t)N), *dlf = xmalloc(4 * (size_t)nloss);
    double *tw = xmalloc(sizeof(double) * (size_t)N), *dl = xmalloc(sizeof(double) * (size_t)nloss);
    for (int64_t i = 0; i < N; i++) {
        tgt[i] = i % 7 == 3 ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(rng) % (uint64_t)V);
        twf[i] = (float)lt_test_uniform(rng, 0.25, 2.0), tw[i] = twf[i];
    }
    for (int64_t i = 0; i < nloss; i++)
        dlf[i] = nloss > 1 ? (float)lt_test_uniform(rng, 0.5, 1.5) : 1.0f, dl[i] = dlf[i];
    lt_ref_lce_opts ro = {c->red, c->eps, c->zl, c->cap, c->weights ? tw : NULL};
    double *loss = xmalloc(sizeof(double) * (size_t)nloss), *lse = xmalloc(sizeof(double) * (size_t)N);
    double *dh = xmalloc(sizeof(double) * (size_t)(N * C));
    lt_ref_lce(hd, wd, tgt, N, C, V, &ro, dl, loss, lse, dh);
    float *Pn = lt_test_poisoned(N * C);
    float *d_h = dev_up(ctx, be, hf, 4 * (size_t)(N * C)), *d_dh = dev_up(ctx, be, Pn, 4 * (size_t)(N * C));
    float *d_lse = dev_up(ctx, be, Pn, 4 * (size_t)N), *d_loss = dev_up(ctx, be, Pn, 4 * (size_t)nloss);
    float *d_dl = dev_up(ctx, be, dlf, 4 * (size_t)nloss), *d_tw = dev_up(ctx, be, twf, 4 * (size_t)N);
    void *d_w = dev_up(ctx, be, wq, wb);
    int32_t *d_t = dev_up(ctx, be, tgt, 4 * (size_t)N);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(d_dh, LT_DTYPE_F32, dev, 2, hs);
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(d_h, LT_DTYPE_F32, dev, 2, hs);
    a.w = lt_tensor_view(d_w, c->wdt, dev, 2, ws);
    a.targets = d_t, a.loss = d_loss, a.lse = d_lse, a.dloss = d_dl, a.dh = &tdh;
    a.token_weight = c->weights ? d_tw : NULL;
    lt_lce_options o;
    memset(&o, 0, sizeof o);
    o.reduction = c->red, o.label_smoothing = (float)c->eps, o.z_loss = (float)c->zl, o.softcap = (float)c->cap;
    lt_status st = lt_lce_forward(ctx, &o, &a);
    if (st == LT_ERR_UNSUPPORTED) {
        fprintf(stderr, "    %s: unsupported here: %s\n", be->name, lt_ctx_error(ctx));
    } else {
        assert_int_equal(st, LT_OK);
        assert_int_equal(lt_lce_backward(ctx, &o, &a), LT_OK);
        float *g = xmalloc(4 * (size_t)(N * C));
        double *got = xmalloc(sizeof(double) * (size_t)(N * C)), *lref = xmalloc(sizeof(double) * (size_t)N);
        const double tf = lt_test_tol_for(dt, C), tb = 2 * lt_test_tol_for(dt, V);
        for (int pass = 0; pass < 2; pass++) { /* forward then backward; then forward_backward */
            if (pass) {
                assert_int_equal(be->copy_to_device(ctx, d_dh, Pn, 4 * (size_t)(N * C)), LT_OK);
                assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_OK);
            }
            assert_int_equal(be->copy_to_host(ctx, g, d_loss, 4 * (size_t)nloss), LT_OK);
            for (int64_t i = 0; i < nloss; i++) got[i] = g[i];
            const double el = lt_test_rel_err_d(got, loss, nloss);
            assert_int_equal(be->copy_to_host(ctx, g, d_lse, 4 * (size_t)N), LT_OK);
            for (int64_t i = 0; i < N; i++) /* the lse of ignored tokens is not compared */
                got[i] = tgt[i] == LT_IGNORE_INDEX ? 0 : g[i], lref[i] = tgt[i] == LT_IGNORE_INDEX ? 0 : lse[i];
            const double es = lt_test_rel_err_d(got, lref, N);
            assert_int_equal(be->copy_to_host(ctx, g, d_dh, 4 * (size_t)(N * C)), LT_OK);
            for (int64_t i = 0; i < N * C; i++) got[i] = g[i];
            const double eh = lt_test_rel_err_d(got, dh, N * C);
            fprintf(stderr, "    %s %s %lldx%lldx%lld%s: loss %.2e lse %.2e (tol %.2e) dh %.2e (tol %.2e)\n", be->name,
                    lt_dtype_name(c->wdt), (long long)N, (long long)C, (long long)V, pass ? " forward_backward" : "",
                    el, es, tf, eh, tb);
            assert_true(el <= tf && es <= tf && eh <= tb);
            for (int64_t i = 0; i < N; i++)
                for (int64_t k = 0; k < C && tgt[i] == LT_IGNORE_INDEX; k++) assert_true(g[i * C + k] == 0.0f);
        }
        free(g), free(got), free(lref);
    }
    lt_free(ctx, dev, d_h, 4 * (size_t)(N * C)), lt_free(ctx, dev, d_dh, 4 * (size_t)(N * C));
    lt_free(ctx, dev, d_lse, 4 * (size_t)N), lt_free(ctx, dev, d_loss, 4 * (size_t)nloss);
    lt_free(ctx, dev, d_dl, 4 * (size_t)nloss), lt_free(ctx, dev, d_tw, 4 * (size_t)N);
    lt_free(ctx, dev, d_w, wb), lt_free(ctx, dev, d_t, 4 * (size_t)N);
    assert_int_equal(lt_mem_get_stats(ctx, dev).used_bytes, 0);
    free(hf), free(wf), free(hd), free(wd), free(wq), free(tgt), free(twf), free(dlf), free(tw), free(dl);
    free(loss), free(lse), free(dh), free(Pn);
    lt_ctx_free(ctx);
}

/* Each case on every backend present, h in the input dtype that backend computes the loss in (f32
 * on the CPU, bf16 on CUDA), with the op matrix's tolerance rule; through lt_lce_forward +
 * lt_lce_backward and through lt_lce_forward_backward. */
static void every_backend_matches_float64_reference(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_device devs[LT_TEST_MAX_BACKENDS];
    const int nd = lt_test_backends(devs);
    for (int d = 0; d < nd; d++)
        for (size_t i = 0; i < sizeof every_cases / sizeof every_cases[0]; i++)
            every_case_on(&every_cases[i], devs[d], &rng);
}

#if LT_HAVE_CUDA
/* ---- CUDA cases (kernel paths; need a device) ------------------------------------------------ */

#include <cuda_runtime.h>

#define TOL_BF16_FLOOR 0x1.0p-8

typedef struct lcase {
    int64_t N, C, V;
    lt_dtype wdtype;
    lt_lce_options opt;
    int ignore_every; /* every k-th target ignored (0 = none) */
    int weights;
    int dh_f32;
    int with_dw;
    int with_cpu;
    int one_call; /* lt_lce_forward_backward instead of forward then backward */
    int late_max; /* the last quarter of the vocabulary gets 6x larger logits */
} lcase;

/* Float64 loss, lse, per-token loss and gradients; emu rounds logits, logit gradients and dh to
 * bf16 as a naive bf16 implementation would. */
static void cuda_reference(const lcase *c, const float *h, const float *w, const int32_t *tgt, const float *tw,
                           const float *dloss, int emu, double *loss, double *lse, double *tl, double *dh, double *dw) {
    const int64_t N = c->N, C = c->C, V = c->V;
    const lt_lce_options *o = &c->opt;
    const int32_t ign = o->ignore_index ? o->ignore_index : LT_IGNORE_INDEX;
    const double eps = o->label_smoothing, zl = o->z_loss, cap = o->softcap;
    double *z = malloc(sizeof(double) * (size_t)V), *f = malloc(sizeof(double) * (size_t)V);
    double sl = 0, sw = 0;
    for (int64_t i = 0; i < N; i++) {
        double m = -INFINITY, sz = 0;
        for (int64_t j = 0; j < V; j++) {
            double s = 0;
            for (int64_t k = 0; k < C; k++) s += (double)h[i * C + k] * w[j * C + k];
            if (emu) s = lt_test_bf16_round(s);
            f[j] = 1;
            if (cap > 0) {
                double t = tanh(s / cap);
                s = cap * t;
                f[j] = 1 - t * t;
            }
            z[j] = s;
            sz += s;
            if (s > m) m = s;
        }
        double l = 0;
        for (int64_t j = 0; j < V; j++) l += exp(z[j] - m);
        lse[i] = m + log(l);
        double li = 0, wi = 0;
        if (tgt[i] != ign) {
            wi = tw ? tw[i] : 1.0;
            li = wi * ((1 - eps) * (lse[i] - z[tgt[i]]) + eps * (lse[i] - sz / (double)V) + zl * lse[i] * lse[i]);
        }
        tl[i] = li;
        if (tgt[i] == ign) lse[i] = 0; /* lce.h: lse is 0 for ignored tokens */
        sl += li;
        sw += wi;
        (void)f;
    }
    if (o->reduction == LT_REDUCTION_MEAN) loss[0] = sw > 0 ? sl / sw : 0;
    else if (o->reduction == LT_REDUCTION_SUM) loss[0] = sl;
    else memcpy(loss, tl, sizeof(double) * (size_t)N);
    /* Backward. */
    memset(dh, 0, sizeof(double) * (size_t)(N * C));
    if (dw) memset(dw, 0, sizeof(double) * (size_t)(V * C));
    for (int64_t i = 0; i < N; i++) {
        if (tgt[i] == ign) continue;
        double wi = tw ? tw[i] : 1.0, coef;
        if (o->reduction == LT_REDUCTION_NONE) coef = dloss[i] * wi;
        else if (o->reduction == LT_REDUCTION_SUM) coef = dloss[0] * wi;
        else coef = dloss[0] * wi / sw;
        for (int64_t j = 0; j < V; j++) {
            double s = 0;
            for (int64_t k = 0; k < C; k++) s += (double)h[i * C + k] * w[j * C + k];
            if (emu) s = lt_test_bf16_round(s);
            double fj = 1;
            if (cap > 0) {
                double t = tanh(s / cap);
                s = cap * t;
                fj = 1 - t * t;
            }
            double g =
                coef * ((1 + 2 * zl * lse[i]) * exp(s - lse[i]) - eps / (double)V - (j == tgt[i] ? 1 - eps : 0)) * fj;
            if (emu) g = lt_test_bf16_round(g);
            for (int64_t k = 0; k < C; k++) {
                dh[i * C + k] += g * w[j * C + k];
                if (dw) dw[j * C + k] += g * h[i * C + k];
            }
        }
    }
    if (emu && !c->dh_f32)
        for (int64_t n = 0; n < N * C; n++) dh[n] = lt_test_bf16_round(dh[n]);
    free(z);
    free(f);
}

static void *dev_copy(lt_ctx *ctx, const void *host, size_t bytes) {
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, bytes, "test buffer");
    assert_non_null(d);
    if (host) assert_int_equal(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    else assert_int_equal(cudaMemset(d, 0xFF, bytes), cudaSuccess); /* poison: NaN */
    return d;
}

static void run_case(const lcase *c) {
    uint64_t rng = lt_test_seed() ^ (uint64_t)(c->wdtype * 977 + c->opt.reduction * 31 + c->N);
    const int64_t N = c->N, C = c->C, V = c->V;
    float *h = malloc(sizeof(float) * (size_t)(N * C)), *w = malloc(sizeof(float) * (size_t)(V * C));
    lt_test_fill_normal(&rng, h, N * C, 1.0f);
    lt_test_fill_normal(&rng, w, V * C, (float)(2.0 / sqrt((double)C)));
    if (c->late_max)
        for (int64_t k = (V - V / 4) * C; k < V * C; k++) w[k] *= 6.0f;
    uint16_t *hb = malloc((size_t)(N * C) * 2);
    for (int64_t i = 0; i < N * C; i++) {
        hb[i] = lt_f32_to_bf16(h[i]);
        h[i] = lt_bf16_to_f32(hb[i]);
    }
    const int64_t row_bytes = lt_dtype_row_bytes(c->wdtype, C);
    uint8_t *wq = malloc((size_t)(V * row_bytes));
    for (int64_t j = 0; j < V; j++) {
        if (c->wdtype == LT_DTYPE_BF16) {
            uint16_t *r = (uint16_t *)(wq + j * row_bytes);
            for (int64_t k = 0; k < C; k++) r[k] = lt_f32_to_bf16(w[j * C + k]);
        } else {
            lt_quantize_row(c->wdtype, w + j * C, wq + j * row_bytes, C);
        }
        lt_dequantize_row(c->wdtype, wq + j * row_bytes, w + j * C, C);
    }
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)N);
    float *tw = c->weights ? malloc(sizeof(float) * (size_t)N) : NULL;
    const int32_t ign = c->opt.ignore_index ? c->opt.ignore_index : LT_IGNORE_INDEX;
    for (int64_t i = 0; i < N; i++) {
        tgt[i] = (int32_t)lt_test_uniform(&rng, 0, (double)V);
        if (c->ignore_every && i % c->ignore_every == 3) tgt[i] = ign;
        if (tw) tw[i] = (float)lt_test_uniform(&rng, 0.25, 2.0);
    }
    const int none = c->opt.reduction == LT_REDUCTION_NONE;
    const int64_t nl = none ? N : 1;
    float *dloss = malloc(sizeof(float) * (size_t)nl);
    for (int64_t i = 0; i < nl; i++) dloss[i] = (float)lt_test_uniform(&rng, 0.5, 1.5);

    lt_ctx *ctx = lt_ctx_new();
    void *d_h = dev_copy(ctx, hb, (size_t)(N * C) * 2);
    void *d_w = dev_copy(ctx, wq, (size_t)(V * row_bytes));
    int32_t *d_t = dev_copy(ctx, tgt, sizeof(int32_t) * (size_t)N);
    float *d_tw = tw ? dev_copy(ctx, tw, sizeof(float) * (size_t)N) : NULL;
    float *d_dl = dev_copy(ctx, dloss, sizeof(float) * (size_t)nl);
    float *d_loss = dev_copy(ctx, NULL, sizeof(float) * (size_t)nl);
    float *d_lse = dev_copy(ctx, NULL, sizeof(float) * (size_t)N);
    float *d_tl = dev_copy(ctx, NULL, sizeof(float) * (size_t)N);
    const size_t dh_bytes = (size_t)(N * C) * (c->dh_f32 ? 4 : 2);
    void *d_dh = dev_copy(ctx, NULL, dh_bytes);
    float *w0 = NULL, *d_dw = NULL;
    if (c->with_dw) {
        /* dW accumulates: start from random values and check dW - dW0. */
        w0 = malloc(sizeof(float) * (size_t)(V * C));
        lt_test_fill_normal(&rng, w0, V * C, 0.01f);
        d_dw = dev_copy(ctx, w0, sizeof(float) * (size_t)(V * C));
    }

    lt_lce_args a;
    memset(&a, 0, sizeof a);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    a.h = lt_tensor_view(d_h, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(d_w, c->wdtype, LT_DEVICE_CUDA, 2, ws);
    lt_tensor tdh = lt_tensor_view(d_dh, c->dh_f32 ? LT_DTYPE_F32 : LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    lt_tensor tdw = lt_tensor_view(d_dw, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, ws);
    a.targets = d_t;
    a.token_weight = d_tw;
    a.loss = d_loss;
    a.lse = d_lse;
    a.token_loss = d_tl;
    a.dloss = d_dl;
    a.dh = &tdh;
    a.dw = c->with_dw ? &tdw : NULL;
    const size_t used0 = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
    lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
    lt_status st = LT_OK;
    if (c->one_call) {
        st = lt_lce_forward_backward(ctx, &c->opt, &a);
        if (st != LT_OK) fprintf(stderr, "forward_backward: %s\n", lt_ctx_error(ctx));
        assert_int_equal(st, LT_OK);
    } else {
        st = lt_lce_forward(ctx, &c->opt, &a);
        if (st != LT_OK) fprintf(stderr, "forward: %s\n", lt_ctx_error(ctx));
        assert_int_equal(st, LT_OK);
        st = lt_lce_backward(ctx, &c->opt, &a);
        if (st != LT_OK) fprintf(stderr, "backward: %s\n", lt_ctx_error(ctx));
        assert_int_equal(st, LT_OK);
    }
    /* The extra memory stays bounded: workspace only, through the allocator, and for the one call
     * exactly the advertised block. */
    size_t wsb = lt_lce_workspace_bytes(&c->opt, &a, c->one_call ? LT_LCE_PASS_FORWARD_BACKWARD : 1, 0);
    assert_true(wsb > 0 && wsb <= ((size_t)64 << 20) + (size_t)N * 64);
    if (c->one_call)
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes - used0,
                         lt_alloc_accounted_size(LT_DEVICE_CUDA, wsb));

    float *g_loss = malloc(sizeof(float) * (size_t)nl), *g_lse = malloc(sizeof(float) * (size_t)N);
    float *g_tl = malloc(sizeof(float) * (size_t)N), *g_dh = malloc(sizeof(float) * (size_t)(N * C));
    assert_int_equal(cudaMemcpy(g_loss, d_loss, sizeof(float) * (size_t)nl, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(g_lse, d_lse, sizeof(float) * (size_t)N, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(g_tl, d_tl, sizeof(float) * (size_t)N, cudaMemcpyDeviceToHost), cudaSuccess);
    if (c->dh_f32) {
        assert_int_equal(cudaMemcpy(g_dh, d_dh, dh_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
        uint16_t *t = malloc(dh_bytes);
        assert_int_equal(cudaMemcpy(t, d_dh, dh_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t i = 0; i < N * C; i++) g_dh[i] = lt_bf16_to_f32(t[i]);
        free(t);
    }

    double *r_loss = malloc(sizeof(double) * (size_t)N), *r_lse = malloc(sizeof(double) * (size_t)N);
    double *r_tl = malloc(sizeof(double) * (size_t)N), *r_dh = malloc(sizeof(double) * (size_t)(N * C));
    double *e_loss = malloc(sizeof(double) * (size_t)N), *e_lse = malloc(sizeof(double) * (size_t)N);
    double *e_tl = malloc(sizeof(double) * (size_t)N), *e_dh = malloc(sizeof(double) * (size_t)(N * C));
    double *r_dw = c->with_dw ? malloc(sizeof(double) * (size_t)(V * C)) : NULL;
    double *e_dw = c->with_dw ? malloc(sizeof(double) * (size_t)(V * C)) : NULL;
    cuda_reference(c, h, w, tgt, tw, dloss, 0, r_loss, r_lse, r_tl, r_dh, r_dw);
    cuda_reference(c, h, w, tgt, tw, dloss, 1, e_loss, e_lse, e_tl, e_dh, e_dw);

    struct {
        const char *name;
        const float *got;
        const double *ref, *emu;
        int64_t n;
    } chk[5] = {{"loss", g_loss, r_loss, e_loss, nl},
                {"lse", g_lse, r_lse, e_lse, N},
                {"token_loss", g_tl, r_tl, e_tl, N},
                {"dh", g_dh, r_dh, e_dh, N * C},
                {"dw", NULL, NULL, NULL, 0}};
    float *g_dw = NULL;
    if (c->with_dw) {
        g_dw = malloc(sizeof(float) * (size_t)(V * C));
        assert_int_equal(cudaMemcpy(g_dw, d_dw, sizeof(float) * (size_t)(V * C), cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t i = 0; i < V * C; i++) g_dw[i] -= w0[i];
        chk[4].got = g_dw;
        chk[4].ref = r_dw;
        chk[4].emu = e_dw;
        chk[4].n = V * C;
    }
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        if (!chk[i].n) continue;
        double tol = fmax(2 * lt_test_rel_err_d(chk[i].emu, chk[i].ref, chk[i].n), TOL_BF16_FLOOR);
        double err = lt_test_rel_err_f(chk[i].got, chk[i].ref, chk[i].n);
        fprintf(stderr, "  %s%s %s red=%d eps=%g zl=%g cap=%g tiles=%d/%d %-10s cuda err %.3g (tol %.3g)\n",
                c->one_call ? "fb" : "f+b", c->one_call && c->opt.fp32_logit_tiles ? "(fp32 logits)" : "",
                lt_dtype_name(c->wdtype), (int)c->opt.reduction, (double)c->opt.label_smoothing, (double)c->opt.z_loss,
                (double)c->opt.softcap, c->opt.tile_n, c->opt.tile_v, chk[i].name, err, tol);
        bad += !(err <= tol); /* every check is printed before the case fails */
    }
    assert_int_equal(bad, 0);
    /* Ignored tokens: dh rows exactly zero. */
    for (int64_t i = 0; i < N; i++)
        if (tgt[i] == ign) {
            for (int64_t k = 0; k < C; k++) assert_true(g_dh[i * C + k] == 0.0f);
            assert_true(g_tl[i] == 0.0f);
        }

    if (c->with_cpu) {
        lt_lce_args ac = a;
        float cl[1], *clse = malloc(sizeof(float) * (size_t)N);
        ac.h = lt_tensor_view(hb, LT_DTYPE_BF16, LT_DEVICE_CPU, 2, hs);
        ac.w = lt_tensor_view(wq, c->wdtype, LT_DEVICE_CPU, 2, ws);
        ac.targets = tgt;
        ac.token_weight = tw;
        ac.loss = cl;
        ac.lse = clse;
        ac.token_loss = NULL;
        assert_int_equal(lt_lce_forward(ctx, &c->opt, &ac), LT_OK);
        double ecpu = fabs(cl[0] - r_loss[0]) / fabs(r_loss[0]), ecuda = fabs(g_loss[0] - r_loss[0]) / fabs(r_loss[0]);
        fprintf(stderr, "  loss: cpu backend rel err %.3g, cuda %.3g\n", ecpu, ecuda);
        assert_true(ecuda <= fmax(2 * ecpu, TOL_BF16_FLOOR));
        free(clse);
    }

    lt_free(ctx, LT_DEVICE_CUDA, d_h, (size_t)(N * C) * 2);
    lt_free(ctx, LT_DEVICE_CUDA, d_w, (size_t)(V * row_bytes));
    lt_free(ctx, LT_DEVICE_CUDA, d_t, sizeof(int32_t) * (size_t)N);
    if (d_tw) lt_free(ctx, LT_DEVICE_CUDA, d_tw, sizeof(float) * (size_t)N);
    lt_free(ctx, LT_DEVICE_CUDA, d_dl, sizeof(float) * (size_t)nl);
    lt_free(ctx, LT_DEVICE_CUDA, d_loss, sizeof(float) * (size_t)nl);
    lt_free(ctx, LT_DEVICE_CUDA, d_lse, sizeof(float) * (size_t)N);
    lt_free(ctx, LT_DEVICE_CUDA, d_tl, sizeof(float) * (size_t)N);
    lt_free(ctx, LT_DEVICE_CUDA, d_dh, dh_bytes);
    if (d_dw) lt_free(ctx, LT_DEVICE_CUDA, d_dw, sizeof(float) * (size_t)(V * C));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
    free(h);
    free(w);
    free(hb);
    free(wq);
    free(tgt);
    free(tw);
    free(dloss);
    free(w0);
    free(g_loss);
    free(g_lse);
    free(g_tl);
    free(g_dh);
    free(g_dw);
    free(r_loss);
    free(r_lse);
    free(r_tl);
    free(r_dh);
    free(e_loss);
    free(e_lse);
    free(e_tl);
    free(e_dh);
    free(r_dw);
    free(e_dw);
}

static void mean_dense(void **s) {
    (void)s;
    lcase c = {300, 256, 1000, LT_DTYPE_BF16, {0}, 0, 0, 0, 0, 1, 0, 0};
    run_case(&c);
}
static void sum_smoothing_zloss_softcap_weights_dw_small_tiles(void **s) {
    (void)s;
    lcase c = {300, 256, 1000, LT_DTYPE_BF16, {0}, 7, 1, 1, 1, 0, 0, 0};
    c.opt.reduction = LT_REDUCTION_SUM;
    c.opt.label_smoothing = 0.1f;
    c.opt.z_loss = 1e-3f;
    c.opt.softcap = 20.0f;
    c.opt.tile_n = 128;
    c.opt.tile_v = 256;
    run_case(&c);
}
static void none_ignored(void **s) {
    (void)s;
    lcase c = {257, 128, 777, LT_DTYPE_BF16, {0}, 5, 0, 0, 0, 0, 0, 0};
    c.opt.reduction = LT_REDUCTION_NONE;
    c.opt.ignore_index = -1;
    run_case(&c);
}
static void quantized_heads(void **s) {
    (void)s;
    const lt_dtype q[4] = {LT_DTYPE_Q8_0, LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    for (int i = 0; i < 4; i++) {
        lcase c = {200, 256, 600, q[i], {0}, 9, 0, 0, 0, 0, 0, 0};
        c.opt.tile_v = 256;
        run_case(&c);
    }
}
/* ---- forward_backward ---- */

/* Each one-call case with the default bf16 logit tile and with fp32 logit tiles. */
static void run_fb(const lcase *c) {
    run_case(c);
    lcase f = *c;
    f.opt.fp32_logit_tiles = 1;
    run_case(&f);
}

static void fb_mean_dense_and_cpu(void **s) {
    (void)s;
    lcase c = {300, 256, 1000, LT_DTYPE_BF16, {0}, 0, 0, 0, 0, 1, 1, 0};
    run_fb(&c);
    c.dh_f32 = 1;
    c.with_cpu = 0;
    c.opt.tile_n = 64; /* five token chunks, four vocabulary tiles: both logit buffers reused */
    c.opt.tile_v = 256;
    run_fb(&c);
}
static void fb_sum_smoothing_zloss_weights_small_tiles(void **s) {
    (void)s;
    lcase c = {300, 256, 1000, LT_DTYPE_BF16, {0}, 7, 1, 0, 0, 0, 1, 0};
    c.opt.reduction = LT_REDUCTION_SUM;
    c.opt.label_smoothing = 0.1f;
    c.opt.z_loss = 1e-3f;
    c.opt.tile_n = 128;
    c.opt.tile_v = 256;
    run_fb(&c);
}
static void fb_softcap_zloss_none_ignored(void **s) {
    (void)s;
    lcase c = {257, 128, 777, LT_DTYPE_BF16, {0}, 5, 0, 0, 0, 0, 1, 0};
    c.opt.reduction = LT_REDUCTION_NONE;
    c.opt.ignore_index = -1;
    c.opt.softcap = 5.0f;
    c.opt.z_loss = 2e-3f;
    c.opt.tile_v = 128;
    run_fb(&c);
}
/* dw, and softcap with smoothing, need the final lse inside each tile: the call runs the forward
 * and the backward (lce.h); same results. */
static void fb_fallbacks_dw_and_softcap_with_smoothing(void **s) {
    (void)s;
    lcase c = {300, 256, 1000, LT_DTYPE_BF16, {0}, 7, 1, 1, 1, 0, 1, 0};
    c.opt.reduction = LT_REDUCTION_SUM;
    c.opt.label_smoothing = 0.1f;
    c.opt.z_loss = 1e-3f;
    c.opt.softcap = 20.0f;
    c.opt.tile_n = 128;
    c.opt.tile_v = 256;
    run_fb(&c);
    c.with_dw = 0;
    run_fb(&c);
}
static void fb_quantized_heads(void **s) {
    (void)s;
    const lt_dtype q[4] = {LT_DTYPE_Q8_0, LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    for (int i = 0; i < 4; i++) {
        lcase c = {200, 256, 600, q[i], {0}, 9, 0, 0, 0, 0, 1, 0};
        c.opt.tile_v = 256;
        c.opt.label_smoothing = i == 1 ? 0.05f : 0.0f;
        run_fb(&c);
    }
}
/* The running max is set by the first tile and replaced (with the accumulator rescaled) when a
 * later tile exceeds it by the margin: both call forms, tiles of 256 and the default width. */
static void fb_late_max_rescales(void **s) {
    (void)s;
    lcase c = {300, 256, 1000, LT_DTYPE_BF16, {0}, 11, 0, 0, 0, 0, 1, 1};
    c.opt.tile_v = 256;
    run_fb(&c);
    c.one_call = 0;
    run_case(&c);
    c.one_call = 1;
    c.opt.tile_n = 100;
    c.opt.tile_v = 0;
    run_fb(&c);
}
/* The Qwen3-8B head's shape (N=8192, V=151936, C=4096): the one-pass workspace is at most 64 MiB. */
static void fb_workspace_at_the_large_shape(void **s) {
    (void)s;
    int64_t hs[2] = {8192, 4096}, ws[2] = {151936, 4096};
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, ws);
    lt_tensor dh = lt_tensor_view(NULL, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.dh = &dh;
    size_t b = lt_lce_workspace_bytes(NULL, &a, LT_LCE_PASS_FORWARD_BACKWARD, 0);
    fprintf(stderr, "  forward_backward workspace at N=8192 V=151936 C=4096: %.1f MiB\n", (double)b / (1 << 20));
    assert_true(b > 0 && b <= ((size_t)64 << 20));
    lt_lce_options q = {.label_smoothing = 0.1f};
    a.w.dtype = LT_DTYPE_Q4_0;
    b = lt_lce_workspace_bytes(&q, &a, LT_LCE_PASS_FORWARD_BACKWARD, 0);
    assert_true(b > 0 && b <= ((size_t)64 << 20));
}

/* Allocation failure is LT_ERR_OOM with nothing leaked; a caller's workspace means no allocation
 * and the same (deterministic) results. */
static void fb_oom_and_caller_workspace(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed() + 5;
    const int64_t N = 40, C = 64, V = 300;
    uint16_t hb[40 * 64], wb[300 * 64];
    float f;
    for (int i = 0; i < N * C; i++) {
        lt_test_fill_normal(&rng, &f, 1, 1.0f);
        hb[i] = lt_f32_to_bf16(f);
    }
    for (int i = 0; i < V * C; i++) {
        lt_test_fill_normal(&rng, &f, 1, 0.2f);
        wb[i] = lt_f32_to_bf16(f);
    }
    int32_t tgt[40];
    for (int i = 0; i < N; i++) tgt[i] = i % 7 == 2 ? LT_IGNORE_INDEX : (int32_t)lt_test_uniform(&rng, 0, (double)V);
    const float one = 1.0f;
    void *d_h = dev_copy(ctx, hb, sizeof hb), *d_w = dev_copy(ctx, wb, sizeof wb);
    int32_t *d_t = dev_copy(ctx, tgt, sizeof tgt);
    float *d_loss = dev_copy(ctx, NULL, 4), *d_lse = dev_copy(ctx, NULL, 4 * N), *d_dl = dev_copy(ctx, &one, 4);
    void *d_dh = dev_copy(ctx, NULL, sizeof hb);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(d_dh, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(d_h, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(d_w, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, ws);
    a.targets = d_t;
    a.loss = d_loss;
    a.lse = d_lse;
    a.dloss = d_dl;
    a.dh = &tdh;
    lt_lce_options o = {.tile_n = 16, .tile_v = 128};
    const size_t used = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
    lt_mem_fail_nth(ctx, 1);
    assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_ERR_OOM);
    lt_mem_fail_nth(ctx, 0);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, used);
    assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_OK);
    float l1 = 0, l2 = 0;
    uint16_t dh1[40 * 64], dh2[40 * 64];
    assert_int_equal(cudaMemcpy(&l1, d_loss, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(dh1, d_dh, sizeof dh1, cudaMemcpyDeviceToHost), cudaSuccess);
    size_t wsb = lt_lce_workspace_bytes(&o, &a, LT_LCE_PASS_FORWARD_BACKWARD, 0);
    a.workspace = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "test workspace");
    assert_non_null(a.workspace);
    assert_int_equal(cudaMemset(d_dh, 0xff, sizeof hb), cudaSuccess);
    const uint64_t n0 = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).n_allocs;
    assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_OK);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).n_allocs, n0);
    assert_int_equal(cudaMemcpy(&l2, d_loss, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(dh2, d_dh, sizeof dh2, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(l1 == l2 && isfinite(l1));
    assert_memory_equal(dh1, dh2, sizeof dh1);
    lt_free(ctx, LT_DEVICE_CUDA, a.workspace, wsb);
    a.workspace = NULL;
    /* fp32 logit tiles (the shared-memory staging path): the same loss to bf16 logit accuracy */
    o.fp32_logit_tiles = 1;
    assert_int_equal(lt_lce_forward_backward(ctx, &o, &a), LT_OK);
    assert_int_equal(cudaMemcpy(&l2, d_loss, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_true(fabs((double)l2 - l1) <= 4e-3 * fabs((double)l1));
    lt_free(ctx, LT_DEVICE_CUDA, d_h, sizeof hb);
    lt_free(ctx, LT_DEVICE_CUDA, d_w, sizeof wb);
    lt_free(ctx, LT_DEVICE_CUDA, d_t, sizeof tgt);
    lt_free(ctx, LT_DEVICE_CUDA, d_loss, 4);
    lt_free(ctx, LT_DEVICE_CUDA, d_lse, 4 * N);
    lt_free(ctx, LT_DEVICE_CUDA, d_dl, 4);
    lt_free(ctx, LT_DEVICE_CUDA, d_dh, sizeof hb);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void bad_target_is_named(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    const int64_t N = 8, C = 64, V = 100;
    uint16_t hb[8 * 64], wb[100 * 64];
    for (int i = 0; i < N * C; i++) hb[i] = lt_f32_to_bf16(0.01f * (float)i);
    for (int i = 0; i < V * C; i++) wb[i] = lt_f32_to_bf16(0.02f);
    int32_t tgt[8] = {1, 2, 3, 4, 5, 100, 7, -100};
    void *d_h = dev_copy(ctx, hb, sizeof hb), *d_w = dev_copy(ctx, wb, sizeof wb);
    int32_t *d_t = dev_copy(ctx, tgt, sizeof tgt);
    float *d_loss = dev_copy(ctx, NULL, 4), *d_lse = dev_copy(ctx, NULL, 4 * N);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(d_h, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(d_w, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, ws);
    a.targets = d_t;
    a.loss = d_loss;
    a.lse = d_lse;
    assert_int_equal(lt_lce_forward(ctx, NULL, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "5"));
    float one = 1.0f, *d_dl = dev_copy(ctx, &one, 4);
    void *d_dh = dev_copy(ctx, NULL, sizeof hb);
    lt_tensor tdh = lt_tensor_view(d_dh, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.dloss = d_dl;
    a.dh = &tdh;
    assert_int_equal(lt_lce_forward_backward(ctx, NULL, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "5"));
    lt_free(ctx, LT_DEVICE_CUDA, d_dl, 4);
    lt_free(ctx, LT_DEVICE_CUDA, d_dh, sizeof hb);
    lt_free(ctx, LT_DEVICE_CUDA, d_h, sizeof hb);
    lt_free(ctx, LT_DEVICE_CUDA, d_w, sizeof wb);
    lt_free(ctx, LT_DEVICE_CUDA, d_t, sizeof tgt);
    lt_free(ctx, LT_DEVICE_CUDA, d_loss, 4);
    lt_free(ctx, LT_DEVICE_CUDA, d_lse, 4 * N);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
}

#endif

int main(void) {
    static const struct CMUnitTest cpu_tests[] = {
        cmocka_unit_test(every_backend_matches_float64_reference),
        cmocka_unit_test(every_head_impl_reduction_option_and_ignore_pattern),
        cmocka_unit_test(default_tiles_and_three_threads),
        cmocka_unit_test(bf16_within_twice_the_naive_bf16_error),
        cmocka_unit_test(gradients_match_finite_differences),
        cmocka_unit_test(workspace_is_exactly_what_is_allocated),
        cmocka_unit_test(fused_memory_does_not_scale_with_vocabulary),
        cmocka_unit_test(forward_backward_rescales_when_the_max_jumps),
        cmocka_unit_test(bad_input_gets_typed_errors),
    };
#if LT_HAVE_CUDA
    static const struct CMUnitTest cuda_tests[] = {
        cmocka_unit_test(mean_dense),
        cmocka_unit_test(sum_smoothing_zloss_softcap_weights_dw_small_tiles),
        cmocka_unit_test(none_ignored),
        cmocka_unit_test(quantized_heads),
        cmocka_unit_test(fb_mean_dense_and_cpu),
        cmocka_unit_test(fb_sum_smoothing_zloss_weights_small_tiles),
        cmocka_unit_test(fb_softcap_zloss_none_ignored),
        cmocka_unit_test(fb_fallbacks_dw_and_softcap_with_smoothing),
        cmocka_unit_test(fb_quantized_heads),
        cmocka_unit_test(fb_late_max_rescales),
        cmocka_unit_test(fb_workspace_at_the_large_shape),
        cmocka_unit_test(fb_oom_and_caller_workspace),
        cmocka_unit_test(bad_target_is_named),
    };
    const size_t ncuda = lt_test_cuda_present() ? sizeof cuda_tests / sizeof cuda_tests[0] : 0;
#else
    const size_t ncuda = 0;
#endif
    const size_t ncpu = sizeof cpu_tests / sizeof cpu_tests[0];
    static struct CMUnitTest tests[64];
    assert_true(ncpu + ncuda <= sizeof tests / sizeof tests[0]);
    memcpy(tests, cpu_tests, sizeof cpu_tests);
#if LT_HAVE_CUDA
    if (ncuda) memcpy(tests + ncpu, cuda_tests, sizeof cuda_tests);
#endif
    if (!ncuda) printf("cuda cases: skipped: no CUDA device%s\n", LT_HAVE_CUDA ? "" : " (this build has no CUDA)");
    const char *filter = getenv("LONGTUNE_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return _cmocka_run_group_tests("lce", tests, ncpu + ncuda, NULL, NULL);
}
