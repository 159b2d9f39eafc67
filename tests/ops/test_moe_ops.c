/* The mixture-of-experts ops on every backend present against float64 references on fresh random
 * inputs (seed printed), outputs poisoned: routing (exact ties broken to the lower expert, k = 1 and
 * k = E, with and without renormalisation, the load-balancing statistics accumulated and
 * bit-reproducible), its backward (against the float64 derivative and against central differences
 * of the backend's own forward), the counting sort (experts with no rows, several thousand
 * assignments), gather / combine and their backwards (beta 0 over poison and beta ≠ 0), and the
 * grouped products in both modes for every weight dtype (row counts that are no tile multiple,
 * empty experts; tolerances from the dtype the backend reads: f32 on the CPU, bf16 on CUDA), the
 * thin f32 products of LoRA on the experts (one side a rank of 1..64), and the experts' weight
 * gradients (ranks 1..64 on either side, widths that are no tile multiple, experts with no rows
 * and one expert holding every row, nk = 0, beta 0 over NaN and beta 1, bit-reproducible, and on
 * CUDA captured once and replayed for new offsets). */
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
#include "core/rng.h"
#include "helpers/backends.h"
#include "helpers/ref_quant.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"

static uint64_t g_seed;

static double unif(uint64_t *r) { return (double)(lt_splitmix64(r) >> 11) * 0x1.0p-53 * 2.0 - 1.0; }

/* A device copy of a host buffer (or poison when host is NULL: NaN bytes). */
typedef struct dbuf {
    void *p;
    size_t bytes;
} dbuf;

static dbuf put(const lt_backend *be, lt_ctx *ctx, lt_device dev, const void *host, size_t bytes) {
    dbuf b = {lt_alloc(ctx, dev, bytes ? bytes : 4, "moe test"), bytes};
    assert_non_null(b.p);
    if (bytes) {
        void *tmp = NULL;
        if (!host) {
            tmp = malloc(bytes);
            memset(tmp, 0xff, bytes); /* NaN as f32, -1 as int32 */
            host = tmp;
        }
        assert_int_equal(be->copy_to_device(ctx, b.p, host, bytes), LT_OK);
        free(tmp);
    }
    return b;
}

static void get(const lt_backend *be, lt_ctx *ctx, void *host, dbuf b) {
    if (b.bytes) assert_int_equal(be->copy_to_host(ctx, host, b.p, b.bytes), LT_OK);
}

static void drop(lt_ctx *ctx, lt_device dev, dbuf b) { lt_free(ctx, dev, b.p, b.bytes ? b.bytes : 4); }

static lt_ctx *new_ctx(void) {
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 2);
    return ctx;
}

/* ---- routing ---- */

static void ref_softmax(const float *l, int64_t E, double *p) {
    double m = l[0], s = 0;
    for (int64_t e = 1; e < E; e++) m = fmax(m, (double)l[e]);
    for (int64_t e = 0; e < E; e++) s += p[e] = exp((double)l[e] - m);
    for (int64_t e = 0; e < E; e++) p[e] /= s;
}

/* The k largest p, ties to the lower expert. */
static void ref_topk(const double *p, int64_t E, int64_t k, int32_t *idx) {
    unsigned char taken[LT_MOE_MAX_EXPERTS] = {0};
    for (int64_t j = 0; j < k; j++) {
        int64_t b = -1;
        for (int64_t e = 0; e < E; e++)
            if (!taken[e] && (b < 0 || p[e] > p[b])) b = e;
        taken[b] = 1;
        idx[j] = (int32_t)b;
    }
}

typedef struct rcase {
    int64_t n, E, k;
    int norm, ties; /* ties: logits drawn from 4 levels, so most rows hold exact ties */
} rcase;

static void fill_logits(const rcase *c, float *l, uint64_t *r) {
    for (int64_t i = 0; i < c->n * c->E; i++)
        l[i] = c->ties ? (float)((int)(lt_splitmix64(r) % 4) - 1) * 0.75f : (float)(unif(r) * 3.0);
}

static void run_route(lt_device dev, const rcase *c, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = new_ctx();
    const int64_t n = c->n, E = c->E, k = c->k;
    float *l = malloc((size_t)(n * E) * 4), *w = malloc((size_t)(n * k) * 4), *st = malloc((size_t)(2 * E) * 4),
          *st2 = malloc((size_t)(2 * E) * 4);
    int32_t *idx = malloc((size_t)(n * k) * 4), *ridx = malloc((size_t)k * 4);
    double *p = malloc((size_t)E * sizeof(double)), *cnt = calloc((size_t)E, sizeof(double)),
           *ps = calloc((size_t)E, sizeof(double));
    fill_logits(c, l, r);
    for (int64_t e = 0; e < 2 * E; e++) st[e] = 1.5f; /* accumulated onto */
    dbuf dl = put(be, ctx, dev, l, (size_t)(n * E) * 4), di = put(be, ctx, dev, NULL, (size_t)(n * k) * 4),
         dw = put(be, ctx, dev, NULL, (size_t)(n * k) * 4), ds = put(be, ctx, dev, st, (size_t)(2 * E) * 4),
         ds2 = put(be, ctx, dev, st, (size_t)(2 * E) * 4);
    be->moe_route(ctx, dl.p, n, E, k, c->norm, di.p, dw.p, ds.p);
    be->moe_route(ctx, dl.p, n, E, k, c->norm, di.p, dw.p, ds.p); /* twice: += */
    be->moe_route(ctx, dl.p, n, E, k, c->norm, di.p, dw.p, ds2.p);
    be->moe_route(ctx, dl.p, n, E, k, c->norm, di.p, dw.p, ds2.p);
    get(be, ctx, idx, di), get(be, ctx, w, dw), get(be, ctx, st, ds), get(be, ctx, st2, ds2);
    const double tol = lt_test_tol_for(LT_DTYPE_F32, E);
    for (int64_t t = 0; t < n; t++) {
        ref_softmax(l + t * E, E, p);
        ref_topk(p, E, k, ridx);
        double z = 0;
        for (int64_t j = 0; j < k; j++) z += p[ridx[j]];
        for (int64_t e = 0; e < E; e++) ps[e] += p[e];
        for (int64_t j = 0; j < k; j++) {
            int32_t g = idx[t * k + j], want = ridx[j];
            /* A choice may differ from float64's only between probabilities f32 cannot tell apart
             * (never between exact ties, which both order by expert). */
            int ok = g == want || (g >= 0 && g < E && p[g] != p[want] && fabs(p[g] - p[want]) < 1e-6);
            if (!ok) {
                fprintf(stderr, "route %s n=%lld E=%lld k=%lld: idx[%lld, %lld] = %d, want %d (seed %llu)\n",
                        lt_test_backend_name(dev), (long long)n, (long long)E, (long long)k, (long long)t, (long long)j,
                        g, want, (unsigned long long)g_seed);
                fail();
            }
            cnt[want] += 1;
            double wref = p[want] / (c->norm ? z : 1.0);
            if (!(fabs(w[t * k + j] - wref) <= tol * (fabs(wref) + 1e-30) + 1e-7 * (g != want))) {
                fprintf(stderr, "route %s: w[%lld, %lld] = %g, want %g (seed %llu)\n", lt_test_backend_name(dev),
                        (long long)t, (long long)j, w[t * k + j], wref, (unsigned long long)g_seed);
                fail();
            }
        }
    }
    for (int64_t e = 0; e < E; e++) {
        assert_true(fabs((double)st[e] - (1.5 + 2.0 * cnt[e])) <= 1.0); /* near-tie picks may move one */
        double want = 1.5 + 2.0 * ps[e];
        if (!(fabs((double)st[E + e] - want) <= 4e-6 * fmax(want, 1.0))) {
            fprintf(stderr, "route %s: stats[1, %lld] = %.8g, want %.8g (seed %llu)\n", lt_test_backend_name(dev),
                    (long long)e, st[E + e], want, (unsigned long long)g_seed);
            fail();
        }
    }
    assert_memory_equal(st, st2, (size_t)(2 * E) * 4); /* the same calls give the same bits */
    printf("route %s n=%lld E=%lld k=%lld norm=%d ties=%d: ok\n", lt_test_backend_name(dev), (long long)n, (long long)E,
           (long long)k, c->norm, c->ties);
    drop(ctx, dev, dl), drop(ctx, dev, di), drop(ctx, dev, dw), drop(ctx, dev, ds), drop(ctx, dev, ds2);
    free(l), free(w), free(st), free(st2), free(idx), free(ridx), free(p), free(cnt), free(ps);
    lt_ctx_free(ctx);
}

static void test_route(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const rcase cases[] = {
        {37, 8, 2, 1, 1},  {50, 8, 1, 0, 1},   {20, 6, 6, 1, 1},  {33, 128, 8, 1, 0},   {9, 5, 5, 0, 0},
        {64, 60, 4, 0, 1}, {300, 16, 3, 1, 0}, {5, 512, 8, 1, 1}, {2000, 128, 8, 1, 0},
    };
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_route(devs[d], &cases[i], &r);
    }
}

/* f(l) = Σ_j dw_j·w_j(l) + Σ_e dp_e·p_e(l) for one token with the choice idx held, in float64. */
static double ref_route_obj(const float *l, const int32_t *idx, const float *dw, const float *dp, int64_t E, int64_t k,
                            int norm, double *p) {
    ref_softmax(l, E, p);
    double z = 0, f = 0;
    for (int64_t j = 0; j < k; j++) z += p[idx[j]];
    for (int64_t j = 0; j < k; j++) f += (double)dw[j] * p[idx[j]] / (norm ? z : 1.0);
    if (dp)
        for (int64_t e = 0; e < E; e++) f += (double)dp[e] * p[e];
    return f;
}

/* The float64 derivative of ref_route_obj. */
static void ref_route_grad(const float *l, const int32_t *idx, const float *dw, const float *dp, int64_t E, int64_t k,
                           int norm, double *p, double *g, double *dl) {
    ref_softmax(l, E, p);
    for (int64_t e = 0; e < E; e++) g[e] = dp ? dp[e] : 0.0;
    double z = 0, c = 0;
    for (int64_t j = 0; j < k; j++) z += p[idx[j]];
    for (int64_t j = 0; j < k; j++) c += (double)dw[j] * p[idx[j]] / z;
    for (int64_t j = 0; j < k; j++) g[idx[j]] += norm ? ((double)dw[j] - c) / z : (double)dw[j];
    double dot = 0;
    for (int64_t e = 0; e < E; e++) dot += p[e] * g[e];
    for (int64_t e = 0; e < E; e++) dl[e] = p[e] * (g[e] - dot);
}

static void run_route_bwd(lt_device dev, const rcase *c, int with_dp, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = new_ctx();
    const int64_t n = c->n, E = c->E, k = c->k;
    float *l = malloc((size_t)(n * E) * 4), *dw = malloc((size_t)(n * k) * 4), *dp = malloc((size_t)E * 4),
          *dl = malloc((size_t)(n * E) * 4);
    int32_t *idx = malloc((size_t)(n * k) * 4);
    double *p = malloc((size_t)E * 8), *g = malloc((size_t)E * 8), *ref = malloc((size_t)E * 8);
    fill_logits(c, l, r);
    for (int64_t i = 0; i < n * k; i++) dw[i] = (float)unif(r);
    /* the aux gradient as the op takes it: dp[e] = scale·stats[e] (f32), from the statistics'
     * counts (row 0) and a scale, both in the backend's memory; row 1 holds NaN, which must not be
     * read */
    float *stats = malloc((size_t)(2 * E) * 4), scale = (float)(unif(r) * 0.01 + 1e-3);
    for (int64_t e = 0; e < E; e++) stats[e] = (float)(lt_splitmix64(r) % (uint64_t)(n * k + 1));
    for (int64_t e = 0; e < E; e++) stats[E + e] = NAN;
    for (int64_t e = 0; e < E; e++) dp[e] = scale * stats[e];
    for (int64_t t = 0; t < n; t++) {
        ref_softmax(l + t * E, E, p);
        ref_topk(p, E, k, idx + t * k);
    }
    dbuf dL = put(be, ctx, dev, l, (size_t)(n * E) * 4), dI = put(be, ctx, dev, idx, (size_t)(n * k) * 4),
         dW = put(be, ctx, dev, dw, (size_t)(n * k) * 4), dD = put(be, ctx, dev, NULL, (size_t)(n * E) * 4),
         dS = put(be, ctx, dev, stats, (size_t)(2 * E) * 4), dC = put(be, ctx, dev, &scale, 4);
    be->moe_route_bwd(ctx, dL.p, dI.p, dW.p, n, E, k, c->norm, with_dp ? dS.p : NULL, dC.p, dD.p);
    get(be, ctx, dl, dD);
    const double tol = lt_test_tol_for(LT_DTYPE_F32, E + k);
    for (int64_t t = 0; t < n; t++) {
        ref_route_grad(l + t * E, idx + t * k, dw + t * k, with_dp ? dp : NULL, E, k, c->norm, p, g, ref);
        double mag = 0;
        for (int64_t e = 0; e < E; e++) mag += p[e] * (fabs(g[e]) + 1.0);
        for (int64_t e = 0; e < E; e++) {
            double err = fabs((double)dl[t * E + e] - ref[e]);
            if (!(err <= tol * mag)) {
                fprintf(stderr, "route_bwd %s n=%lld E=%lld k=%lld: dl[%lld, %lld] = %g, want %g (seed %llu)\n",
                        lt_test_backend_name(dev), (long long)n, (long long)E, (long long)k, (long long)t, (long long)e,
                        dl[t * E + e], ref[e], (unsigned long long)g_seed);
                fail();
            }
        }
        /* The float64 derivative is the derivative: central differences of the float64 forward. */
        if (t < 3)
            for (int64_t e = 0; e < E; e++) {
                float *lt = l + t * E, keep = lt[e];
                const float h = 1.0f / 1024; /* exact in f32, so the step is exactly ±h */
                lt[e] = keep + h;
                double fp = ref_route_obj(lt, idx + t * k, dw + t * k, with_dp ? dp : NULL, E, k, c->norm, p);
                lt[e] = keep - h;
                double fm = ref_route_obj(lt, idx + t * k, dw + t * k, with_dp ? dp : NULL, E, k, c->norm, p);
                lt[e] = keep;
                ref_route_grad(lt, idx + t * k, dw + t * k, with_dp ? dp : NULL, E, k, c->norm, p, g, ref);
                assert_true(fabs((fp - fm) / (2.0 * h) - ref[e]) <= 1e-5);
            }
    }
    printf("route_bwd %s n=%lld E=%lld k=%lld norm=%d dp=%d: ok\n", lt_test_backend_name(dev), (long long)n,
           (long long)E, (long long)k, c->norm, with_dp);
    drop(ctx, dev, dL), drop(ctx, dev, dI), drop(ctx, dev, dW), drop(ctx, dev, dD), drop(ctx, dev, dS);
    drop(ctx, dev, dC);
    free(l), free(dw), free(dp), free(dl), free(idx), free(p), free(g), free(ref), free(stats);
    lt_ctx_free(ctx);
}

/* Central differences of the backend's own f32 forward: Σ dw·w + Σ dp·p through moe_route (the
 * statistics' row 1 is Σ_t p, so dp·stats gives the second term) against its backward, on logits
 * spread apart so the choice stays put under the step; dp = scale·counts as the backward takes it
 * (the counts of a statistics block and a scale, in the backend's memory). */
static void run_route_fd(lt_device dev, int norm, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = new_ctx();
    const int64_t n = 3, E = 7, k = 3;
    float l[3 * 7], dw[3 * 3], dp[7], dl[3 * 7], w[3 * 3], st[2 * 7], cnt[2 * 7], scale = (float)(unif(r) + 0.1);
    int32_t idx[3 * 3], idx2[3 * 3];
    for (int64_t t = 0; t < n; t++)
        for (int64_t e = 0; e < E; e++) l[t * E + e] = (float)((double)((e * 5 + t * 3) % E) * 0.4 + unif(r) * 0.05);
    for (int64_t i = 0; i < n * k; i++) dw[i] = (float)unif(r);
    for (int64_t e = 0; e < E; e++) cnt[e] = (float)(lt_splitmix64(r) % 10), cnt[E + e] = (float)unif(r);
    for (int64_t e = 0; e < E; e++) dp[e] = scale * cnt[e];
    dbuf dN = put(be, ctx, dev, cnt, sizeof cnt), dC = put(be, ctx, dev, &scale, sizeof scale);
    dbuf dL = put(be, ctx, dev, l, sizeof l), dI = put(be, ctx, dev, NULL, sizeof idx),
         dW = put(be, ctx, dev, NULL, sizeof w), dS = put(be, ctx, dev, NULL, sizeof st),
         dG = put(be, ctx, dev, dw, sizeof dw), dD = put(be, ctx, dev, NULL, sizeof dl);
    be->moe_route(ctx, dL.p, n, E, k, norm, dI.p, dW.p, NULL);
    get(be, ctx, idx, dI);
    be->moe_route_bwd(ctx, dL.p, dI.p, dG.p, n, E, k, norm, dN.p, dC.p, dD.p);
    get(be, ctx, dl, dD);
    /* h large enough that the f32 rounding of the sums (|f| up to ~30) stays far below the
     * tolerance after the division by 2h, small enough that the curvature term is negligible;
     * the logits are 0.4 apart, so no choice flips. */
    const float h = 1.0f / 64;
    for (int64_t i = 0; i < n * E; i++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            float lp[3 * 7];
            memcpy(lp, l, sizeof l);
            lp[i] += s ? -h : h;
            assert_int_equal(be->copy_to_device(ctx, dL.p, lp, sizeof lp), LT_OK);
            memset(st, 0, sizeof st);
            assert_int_equal(be->copy_to_device(ctx, dS.p, st, sizeof st), LT_OK);
            be->moe_route(ctx, dL.p, n, E, k, norm, dI.p, dW.p, dS.p);
            get(be, ctx, idx2, dI), get(be, ctx, w, dW), get(be, ctx, st, dS);
            assert_memory_equal(idx, idx2, sizeof idx);
            f[s] = 0;
            for (int64_t j = 0; j < n * k; j++) f[s] += (double)dw[j] * w[j];
            for (int64_t e = 0; e < E; e++) f[s] += (double)dp[e] * st[E + e];
        }
        double fd = (f[0] - f[1]) / (2.0 * h);
        if (!(fabs(fd - dl[i]) <= 2e-3)) {
            fprintf(stderr, "route_bwd fd %s: dl[%lld] = %g, differences %g (seed %llu)\n", lt_test_backend_name(dev),
                    (long long)i, dl[i], fd, (unsigned long long)g_seed);
            fail();
        }
    }
    drop(ctx, dev, dL), drop(ctx, dev, dI), drop(ctx, dev, dW), drop(ctx, dev, dS), drop(ctx, dev, dG);
    drop(ctx, dev, dD), drop(ctx, dev, dN), drop(ctx, dev, dC);
    lt_ctx_free(ctx);
}

static void test_route_bwd(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const rcase cases[] = {{37, 8, 2, 1, 1},   {50, 8, 1, 0, 0}, {20, 6, 6, 1, 0},
                           {33, 128, 8, 1, 0}, {9, 5, 5, 0, 1},  {40, 512, 8, 1, 0}};
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed ^ 0x11;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            for (int dp = 0; dp < 2; dp++) run_route_bwd(devs[d], &cases[i], dp, &r);
        run_route_fd(devs[d], 1, &r);
        run_route_fd(devs[d], 0, &r);
    }
}

/* ---- dispatch: sort, gather, combine ---- */

/* Each token's k distinct experts drawn from the first E − skip (the rest get no rows), except
 * that expert 0 gets none either when skip > 0. */
static void random_idx(int64_t n, int64_t E, int64_t k, int64_t skip, int32_t *idx, uint64_t *r) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(lt_splitmix64(r) % (uint64_t)(E - skip));
                if (skip && e == 0) e = (int32_t)(E - skip);
                dup = 0;
                for (int64_t q = 0; q < j; q++) dup |= idx[t * k + q] == e;
            } while (dup);
            idx[t * k + j] = e;
        }
}

static void ref_sort(const int32_t *idx, int64_t nk, int64_t E, int32_t *off, int32_t *rows, int32_t *slot) {
    off[0] = 0;
    int64_t i = 0;
    for (int64_t e = 0; e < E; e++) {
        for (int64_t a = 0; a < nk; a++)
            if (idx[a] == e) rows[i] = (int32_t)a, slot[a] = (int32_t)i++;
        off[e + 1] = (int32_t)i;
    }
}

typedef struct dcase {
    int64_t n, E, k, skip, C;
} dcase;

static void run_dispatch(lt_device dev, const dcase *c, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = new_ctx();
    const int64_t n = c->n, E = c->E, k = c->k, C = c->C, nk = n * k;
    int32_t *idx = malloc((size_t)nk * 4), *off = malloc((size_t)(E + 1) * 4), *rows = malloc((size_t)nk * 4),
            *slot = malloc((size_t)nk * 4), *roff = malloc((size_t)(E + 1) * 4), *rrows = malloc((size_t)nk * 4),
            *rslot = malloc((size_t)nk * 4);
    random_idx(n, E, k, c->skip, idx, r);
    ref_sort(idx, nk, E, roff, rrows, rslot);
    dbuf dI = put(be, ctx, dev, idx, (size_t)nk * 4), dO = put(be, ctx, dev, NULL, (size_t)(E + 1) * 4),
         dR = put(be, ctx, dev, NULL, (size_t)nk * 4), dS = put(be, ctx, dev, NULL, (size_t)nk * 4);
    be->moe_sort(ctx, dI.p, n, k, E, dO.p, dR.p, dS.p);
    get(be, ctx, off, dO), get(be, ctx, rows, dR), get(be, ctx, slot, dS);
    assert_memory_equal(off, roff, (size_t)(E + 1) * 4);
    assert_memory_equal(rows, rrows, (size_t)nk * 4);
    assert_memory_equal(slot, rslot, (size_t)nk * 4);

    size_t xb = (size_t)(n * C) * 4, gb = (size_t)(nk * C) * 4;
    float *x = malloc(xb), *xg = malloc(gb), *w = malloc((size_t)nk * 4), *y = malloc(xb), *y0 = malloc(xb),
          *dyg = malloc(gb), *dw = malloc((size_t)nk * 4);
    for (int64_t i = 0; i < n * C; i++) x[i] = (float)unif(r), y0[i] = (float)unif(r);
    for (int64_t i = 0; i < nk; i++) w[i] = (float)(unif(r) * 0.5 + 0.5);
    dbuf dX = put(be, ctx, dev, x, xb), dG = put(be, ctx, dev, NULL, gb), dWt = put(be, ctx, dev, w, (size_t)nk * 4),
         dY = put(be, ctx, dev, NULL, xb), dDG = put(be, ctx, dev, NULL, gb),
         dDW = put(be, ctx, dev, NULL, (size_t)nk * 4);
    be->moe_gather(ctx, dX.p, dR.p, nk, k, C, dG.p);
    get(be, ctx, xg, dG);
    for (int64_t i = 0; i < nk; i++) assert_memory_equal(xg + i * C, x + (rows[i] / k) * C, (size_t)C * 4);
    /* xg now holds random rows to combine: make them distinct per slot. */
    for (int64_t i = 0; i < nk * C; i++) xg[i] = (float)unif(r);
    assert_int_equal(be->copy_to_device(ctx, dG.p, xg, gb), LT_OK);
    const double tol = lt_test_tol_for(LT_DTYPE_F32, k + 1);
    for (int pass = 0; pass < 4; pass++) {
        /* pass 0, 1: combine with beta 0 (over poison), 0.5; 2, 3: gather_bwd likewise. */
        float beta = pass & 1 ? 0.5f : 0.0f;
        int comb = pass < 2;
        if (beta != 0) {
            assert_int_equal(be->copy_to_device(ctx, dY.p, y0, xb), LT_OK);
        } else {
            memset(y, 0xff, xb); /* poison: beta 0 must not read y */
            assert_int_equal(be->copy_to_device(ctx, dY.p, y, xb), LT_OK);
        }
        if (comb) be->moe_combine(ctx, dG.p, dWt.p, dS.p, n, k, C, beta, dY.p);
        else be->moe_gather_bwd(ctx, dG.p, dS.p, n, k, C, beta, dY.p);
        get(be, ctx, y, dY);
        for (int64_t t = 0; t < n; t++)
            for (int64_t cc = 0; cc < C; cc++) {
                double s = beta * (double)y0[t * C + cc], mag = fabs(s);
                for (int64_t j = 0; j < k; j++) {
                    double v = (comb ? w[t * k + j] : 1.0) * xg[(int64_t)slot[t * k + j] * C + cc];
                    s += v, mag += fabs(v);
                }
                if (!(fabs(y[t * C + cc] - s) <= tol * mag)) {
                    fprintf(stderr, "%s %s beta=%g: y[%lld, %lld] = %g, want %g (seed %llu)\n",
                            comb ? "combine" : "gather_bwd", lt_test_backend_name(dev), beta, (long long)t,
                            (long long)cc, y[t * C + cc], s, (unsigned long long)g_seed);
                    fail();
                }
            }
    }
    /* combine_bwd: dy = y0, yg = xg. */
    assert_int_equal(be->copy_to_device(ctx, dY.p, y0, xb), LT_OK);
    for (int with_dw = 0; with_dw < 2; with_dw++) {
        be->moe_combine_bwd(ctx, dY.p, dG.p, dWt.p, dS.p, n, k, C, dDG.p, with_dw ? dDW.p : NULL);
        get(be, ctx, dyg, dDG);
        if (with_dw) get(be, ctx, dw, dDW);
        const double tolc = lt_test_tol_for(LT_DTYPE_F32, C);
        for (int64_t t = 0; t < n; t++)
            for (int64_t j = 0; j < k; j++) {
                int64_t s = slot[t * k + j];
                double acc = 0, mag = 0;
                for (int64_t cc = 0; cc < C; cc++) {
                    double want = (double)w[t * k + j] * y0[t * C + cc];
                    assert_true(fabs(dyg[s * C + cc] - want) <= 1e-6 * fabs(want));
                    acc += (double)y0[t * C + cc] * xg[s * C + cc];
                    mag += fabs((double)y0[t * C + cc] * xg[s * C + cc]);
                }
                if (with_dw && !(fabs(dw[t * k + j] - acc) <= tolc * mag)) {
                    fprintf(stderr, "combine_bwd %s: dw[%lld, %lld] = %g, want %g (seed %llu)\n",
                            lt_test_backend_name(dev), (long long)t, (long long)j, dw[t * k + j], acc,
                            (unsigned long long)g_seed);
                    fail();
                }
            }
    }
    printf("dispatch %s n=%lld E=%lld k=%lld C=%lld: ok\n", lt_test_backend_name(dev), (long long)n, (long long)E,
           (long long)k, (long long)C);
    drop(ctx, dev, dI), drop(ctx, dev, dO), drop(ctx, dev, dR), drop(ctx, dev, dS), drop(ctx, dev, dX);
    drop(ctx, dev, dG), drop(ctx, dev, dWt), drop(ctx, dev, dY), drop(ctx, dev, dDG), drop(ctx, dev, dDW);
    free(idx), free(off), free(rows), free(slot), free(roff), free(rrows), free(rslot);
    free(x), free(xg), free(w), free(y), free(y0), free(dyg), free(dw);
    lt_ctx_free(ctx);
}

static void test_dispatch(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const dcase cases[] = {{1, 4, 1, 0, 8},     {17, 8, 2, 3, 24},      {10, 5, 5, 0, 33},
                           {300, 16, 4, 5, 64}, {3000, 128, 8, 40, 16}, {64, 512, 8, 100, 40}};
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed ^ 0x22;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_dispatch(devs[d], &cases[i], &r);
    }
}

/* ---- grouped products ---- */

typedef struct gcase {
    int64_t E, out, in, nk, empty; /* empty: experts 1 and E − 1 get no rows */
} gcase;

static void make_weights(lt_dtype dt, int64_t rows, int64_t in, uint8_t *W, float *wf, uint64_t *r) {
    size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    int ext = 0;
    for (int i = 0; i < lt_ref_quant_ntypes; i++) ext |= lt_ref_quant_types[i] == dt;
    for (int64_t o = 0; o < rows; o++) {
        uint8_t *row = W + (size_t)o * rb;
        if (ext) {
            lt_ref_random_row(r, dt, row, in, 0.5);
        } else {
            for (int64_t i = 0; i < in; i++) wf[o * in + i] = (float)unif(r);
            if (dt == LT_DTYPE_F32) memcpy(row, wf + o * in, (size_t)in * 4);
            else if (dt == LT_DTYPE_BF16)
                for (int64_t i = 0; i < in; i++) ((uint16_t *)row)[i] = lt_f32_to_bf16(wf[o * in + i]);
            else if (dt == LT_DTYPE_F16)
                for (int64_t i = 0; i < in; i++) ((uint16_t *)row)[i] = lt_f32_to_f16(wf[o * in + i]);
            else lt_quantize_row(dt, wf + o * in, row, in);
        }
        lt_dequantize_row(dt, row, wf + o * in, in); /* the exact weights (plain dtypes: widened) */
    }
}

static void run_grouped(lt_device dev, lt_dtype dt, const gcase *c, lt_matmul_mode mode, float beta, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = new_ctx();
    const int64_t E = c->E, out = c->out, in = c->in, nk = c->nk;
    const int nn = mode == LT_MATMUL_NN;
    const int64_t xw = nn ? out : in, yw = nn ? in : out;
    size_t rb = (size_t)lt_dtype_row_bytes(dt, in), wb = rb * (size_t)(E * out);
    uint8_t *W = malloc(wb);
    float *wf = malloc((size_t)(E * out * in) * 4), *x = malloc((size_t)(nk * xw) * 4),
          *y = malloc((size_t)(nk * yw) * 4), *y0 = malloc((size_t)(nk * yw) * 4);
    int32_t *off = malloc((size_t)(E + 1) * 4);
    make_weights(dt, E * out, in, W, wf, r);
    for (int64_t i = 0; i < nk * xw; i++) x[i] = (float)unif(r);
    for (int64_t i = 0; i < nk * yw; i++) y0[i] = (float)unif(r);
    /* Random row counts summing to nk, experts 1 and E − 1 empty when asked. */
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t));
    for (int64_t i = 0; i < nk; i++) {
        int64_t e;
        do e = (int64_t)(lt_splitmix64(r) % (uint64_t)E);
        while (c->empty && E > 2 && (e == 1 || e == E - 1));
        cnt[e]++;
    }
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + (int32_t)cnt[e];
    int64_t sh[2] = {E * out, in};
    dbuf dW = put(be, ctx, dev, W, wb), dX = put(be, ctx, dev, x, (size_t)(nk * xw) * 4),
         dY = put(be, ctx, dev, beta != 0 ? y0 : NULL, (size_t)(nk * yw) * 4),
         dO = put(be, ctx, dev, off, (size_t)(E + 1) * 4);
    lt_tensor w = lt_tensor_view(dW.p, dt, dev, 2, sh);
    size_t wsb = be->grouped_matmul_workspace_bytes(dt, E, out, in, nk, 2);
    dbuf dWs = {wsb ? lt_alloc(ctx, dev, wsb, "ws") : NULL, wsb};
    be->grouped_matmul(ctx, mode, &w, E, dO.p, dX.p, nk, beta, dY.p, dWs.p);
    get(be, ctx, y, dY);
    const int64_t K = nn ? out : in;
    const double tol = lt_test_tol_for(lt_test_input_dtype(dev), K);
    double worst = 0;
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = off[e]; i < off[e + 1]; i++)
            for (int64_t o = 0; o < yw; o++) {
                double s = beta * (double)y0[i * yw + o], mag = fabs(s);
                for (int64_t q = 0; q < K; q++) {
                    double wv = nn ? wf[(e * out + q) * in + o] : wf[(e * out + o) * in + q];
                    double v = wv * x[i * xw + q];
                    s += v, mag += fabs(v);
                }
                double err = fabs(y[i * yw + o] - s);
                if (!(err <= tol * mag)) {
                    fprintf(stderr,
                            "grouped %s %s %s E=%lld out=%lld in=%lld nk=%lld beta=%g: y[%lld, %lld] (expert %lld) = "
                            "%g, want %g, tol %g (seed %llu)\n",
                            lt_test_backend_name(dev), lt_dtype_name(dt), nn ? "NN" : "NT", (long long)E,
                            (long long)out, (long long)in, (long long)nk, beta, (long long)i, (long long)o,
                            (long long)e, y[i * yw + o], s, tol * mag, (unsigned long long)g_seed);
                    fail();
                }
                if (err / (mag + 1e-30) > worst) worst = err / (mag + 1e-30);
            }
    printf("grouped %s %-7s %s E=%lld (%lld, %lld) nk=%lld beta=%g: max rel err %.2e (tol %.2e)\n",
           lt_test_backend_name(dev), lt_dtype_name(dt), nn ? "NN" : "NT", (long long)E, (long long)out, (long long)in,
           (long long)nk, beta, worst, tol);
    if (dWs.p) lt_free(ctx, dev, dWs.p, wsb);
    drop(ctx, dev, dW), drop(ctx, dev, dX), drop(ctx, dev, dY), drop(ctx, dev, dO);
    free(W), free(wf), free(x), free(y), free(y0), free(off), free(cnt);
    lt_ctx_free(ctx);
}

static void test_grouped_matmul(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const lt_dtype dts[] = {LT_DTYPE_F32,  LT_DTYPE_BF16, LT_DTYPE_F16,      LT_DTYPE_Q8_0,
                            LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64, LT_DTYPE_Q5_0,
                            LT_DTYPE_Q5_1, LT_DTYPE_Q2_K, LT_DTYPE_Q3_K,     LT_DTYPE_Q4_K,
                            LT_DTYPE_Q5_K, LT_DTYPE_Q6_K, LT_DTYPE_IQ4_NL,   LT_DTYPE_IQ4_XS};
    const gcase cases[] = {{5, 72, 256, 150, 1}, {1, 40, 256, 33, 0}, {8, 136, 512, 701, 1}};
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed ^ 0x33;
        for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++)
            for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
                run_grouped(devs[d], dts[i], &cases[ci], LT_MATMUL_NT, ci == 1 ? 1.0f : 0.0f, &r);
                run_grouped(devs[d], dts[i], &cases[ci], LT_MATMUL_NN, ci == 2 ? 0.5f : 0.0f, &r);
            }
        /* Many experts, a few rows each (the decode-like end) and a larger product. */
        const gcase big[] = {{64, 96, 256, 200, 0}, {16, 384, 1024, 2100, 1}};
        for (size_t ci = 0; ci < 2; ci++) {
            run_grouped(devs[d], LT_DTYPE_BF16, &big[ci], LT_MATMUL_NT, 0.0f, &r);
            run_grouped(devs[d], LT_DTYPE_Q4_K, &big[ci], LT_MATMUL_NN, 1.0f, &r);
        }
    }
}

/* The device backends' sort and grouped product captured once into a graph and replayed for
 * routings that differ from the captured one: the offsets are read on the device at every replay,
 * never fixed at capture time. */
static void test_graph_replay(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs), ran = 0;
    for (int d = 0; d < nd; d++) {
        const lt_backend *be = lt_backend_get(devs[d]);
        if (!be->graph_begin) continue;
        ran = 1;
        lt_ctx *ctx = new_ctx();
        uint64_t r = g_seed ^ 0x44;
        const int64_t n = 50, k = 2, E = 6, out = 40, in = 64, nk = n * k;
        const lt_dtype dt = LT_DTYPE_Q8_0;
        size_t rb = (size_t)lt_dtype_row_bytes(dt, in), wb = rb * (size_t)(E * out);
        uint8_t *W = malloc(wb);
        float *wf = malloc((size_t)(E * out * in) * 4), *x = malloc((size_t)(nk * in) * 4),
              *y = malloc((size_t)(nk * out) * 4);
        int32_t *idx = malloc((size_t)nk * 4), *off = malloc((size_t)(E + 1) * 4), *rows = malloc((size_t)nk * 4),
                *slot = malloc((size_t)nk * 4);
        make_weights(dt, E * out, in, W, wf, &r);
        for (int64_t i = 0; i < nk * in; i++) x[i] = (float)unif(&r);
        int64_t sh[2] = {E * out, in};
        dbuf dW = put(be, ctx, devs[d], W, wb), dX = put(be, ctx, devs[d], x, (size_t)(nk * in) * 4),
             dY = put(be, ctx, devs[d], NULL, (size_t)(nk * out) * 4), dI = put(be, ctx, devs[d], NULL, (size_t)nk * 4),
             dO = put(be, ctx, devs[d], NULL, (size_t)(E + 1) * 4), dR = put(be, ctx, devs[d], NULL, (size_t)nk * 4),
             dS = put(be, ctx, devs[d], NULL, (size_t)nk * 4);
        lt_tensor w = lt_tensor_view(dW.p, dt, devs[d], 2, sh);
        size_t wsb = be->grouped_matmul_workspace_bytes(dt, E, out, in, nk, 2);
        dbuf dWs = {wsb ? lt_alloc(ctx, devs[d], wsb, "ws") : NULL, wsb};
        random_idx(n, E, k, 0, idx, &r);
        assert_int_equal(be->copy_to_device(ctx, dI.p, idx, (size_t)nk * 4), LT_OK);
        lt_graph *g = NULL;
        assert_int_equal(be->graph_begin(ctx), LT_OK);
        be->moe_sort(ctx, dI.p, n, k, E, dO.p, dR.p, dS.p);
        be->grouped_matmul(ctx, LT_MATMUL_NT, &w, E, dO.p, dX.p, nk, 0.0f, dY.p, dWs.p);
        assert_int_equal(be->graph_end(ctx, &g), LT_OK);
        const double tol = lt_test_tol_for(lt_test_input_dtype(devs[d]), in);
        for (int rep = 0; rep < 3; rep++) {
            random_idx(n, E, k, rep == 1 ? 2 : 0, idx, &r); /* rep 1: experts 0 and 5 get no rows */
            assert_int_equal(be->copy_to_device(ctx, dI.p, idx, (size_t)nk * 4), LT_OK);
            assert_int_equal(be->graph_launch(ctx, g, NULL), LT_OK);
            get(be, ctx, y, dY);
            ref_sort(idx, nk, E, off, rows, slot);
            for (int64_t e = 0; e < E; e++)
                for (int64_t i = off[e]; i < off[e + 1]; i++)
                    for (int64_t o = 0; o < out; o++) {
                        double s = 0, mag = 0;
                        for (int64_t q = 0; q < in; q++) {
                            double v = (double)wf[(e * out + o) * in + q] * x[i * in + q];
                            s += v, mag += fabs(v);
                        }
                        if (!(fabs(y[i * out + o] - s) <= tol * mag)) {
                            fprintf(stderr, "graph replay %d %s: y[%lld, %lld] = %g, want %g (seed %llu)\n", rep,
                                    lt_test_backend_name(devs[d]), (long long)i, (long long)o, y[i * out + o], s,
                                    (unsigned long long)g_seed);
                            fail();
                        }
                    }
        }
        printf("graph replay %s: 3 routings through one captured sort + grouped product: ok\n",
               lt_test_backend_name(devs[d]));
        be->graph_free(g);
        if (dWs.p) lt_free(ctx, devs[d], dWs.p, wsb);
        drop(ctx, devs[d], dW), drop(ctx, devs[d], dX), drop(ctx, devs[d], dY), drop(ctx, devs[d], dI);
        drop(ctx, devs[d], dO), drop(ctx, devs[d], dR), drop(ctx, devs[d], dS);
        free(W), free(wf), free(x), free(y), free(idx), free(off), free(rows), free(slot);
        lt_ctx_free(ctx);
    }
    if (!ran) printf("graph replay: skipped: no backend with graphs in this run\n");
}

/* LoRA on the experts: f32 stacks with one side a rank r. A (E·r, C): NT gives (nk, r), NN gives
 * (nk, C) from (nk, r); B (E·F, r): NT gives (nk, F) from (nk, r), NN gives (nk, r) from (nk, F). */
static void test_grouped_thin(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const gcase cases[] = {{6, 16, 776, 300, 1}, {6, 776, 16, 300, 1}, {4, 1, 200, 150, 0},   {4, 200, 1, 150, 1},
                           {5, 8, 40, 77, 1},    {5, 40, 8, 77, 0},    {4, 16, 201, 150, 1},  {4, 45, 8, 77, 0},
                           {3, 64, 200, 260, 0}, {3, 200, 64, 260, 1}, {8, 16, 2048, 1100, 1}};
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed ^ 0x55;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            run_grouped(devs[d], LT_DTYPE_F32, &cases[ci], LT_MATMUL_NT, ci % 2 ? 1.0f : 0.0f, &r);
            run_grouped(devs[d], LT_DTYPE_F32, &cases[ci], LT_MATMUL_NN, ci % 2 ? 0.0f : 1.0f, &r);
        }
    }
}

/* ---- the experts' weight gradients ---- */

/* Offsets of nk rows over E experts: spread at random with experts 1 and E − 1 empty (spread 0),
 * or every row in expert `all` (spread 1). */
static void wgrad_offsets(int64_t E, int64_t nk, int spread_all, int64_t all, int32_t *off, uint64_t *r) {
    int64_t *cnt = calloc((size_t)E, sizeof(int64_t));
    for (int64_t i = 0; i < nk; i++) {
        int64_t e = all;
        if (!spread_all) do
                e = (int64_t)(lt_splitmix64(r) % (uint64_t)E);
            while (E > 2 && (e == 1 || e == E - 1));
        cnt[e]++;
    }
    off[0] = 0;
    for (int64_t e = 0; e < E; e++) off[e + 1] = off[e] + (int32_t)cnt[e];
    free(cnt);
}

/* Checks dw (E·out, in) against the float64 dw_e = beta·dw0_e + dy_eᵀ·x_e; returns the worst
 * relative error. */
static double wgrad_check(lt_device dev, const char *what, int64_t E, const int32_t *off, const float *dy, int64_t out,
                          const float *x, int64_t in, float beta, const float *dw0, const float *dw) {
    double worst = 0;
    for (int64_t e = 0; e < E; e++) {
        const double tol = lt_test_tol_for(lt_test_input_dtype(dev), off[e + 1] - off[e] + 1);
        for (int64_t o = 0; o < out; o++)
            for (int64_t i = 0; i < in; i++) {
                const int64_t at = (e * out + o) * in + i;
                double s = beta != 0 ? beta * (double)dw0[at] : 0.0, mag = fabs(s);
                for (int64_t m = off[e]; m < off[e + 1]; m++) {
                    double v = (double)dy[m * out + o] * x[m * in + i];
                    s += v, mag += fabs(v);
                }
                double err = fabs(dw[at] - s);
                if (!(err <= tol * mag)) {
                    fprintf(stderr,
                            "wgrad %s %s E=%lld out=%lld in=%lld beta=%g: dw[%lld, %lld] (expert %lld, %d rows) = %g, "
                            "want %g, tol %g (seed %llu)\n",
                            lt_test_backend_name(dev), what, (long long)E, (long long)out, (long long)in, beta,
                            (long long)(e * out + o), (long long)i, (long long)e, off[e + 1] - off[e], dw[at], s,
                            tol * mag, (unsigned long long)g_seed);
                    fail();
                }
                if (err / (mag + 1e-30) > worst) worst = err / (mag + 1e-30);
            }
    }
    return worst;
}

typedef struct wcase {
    int64_t E, out, in, nk;
    int all; /* every row in expert E / 2 */
} wcase;

static void run_wgrad(lt_device dev, const wcase *c, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = new_ctx();
    const int64_t E = c->E, out = c->out, in = c->in, nk = c->nk;
    const size_t yb = (size_t)(nk * out) * 4, xb = (size_t)(nk * in) * 4, wb = (size_t)(E * out * in) * 4;
    float *dy = malloc(yb ? yb : 4), *x = malloc(xb ? xb : 4), *dw0 = malloc(wb), *dw = malloc(wb), *dw2 = malloc(wb);
    int32_t *off = malloc((size_t)(E + 1) * 4);
    for (int64_t i = 0; i < nk * out; i++) dy[i] = (float)unif(r);
    for (int64_t i = 0; i < nk * in; i++) x[i] = (float)unif(r);
    for (int64_t i = 0; i < E * out * in; i++) dw0[i] = (float)unif(r);
    wgrad_offsets(E, nk, c->all, E / 2, off, r);
    dbuf dDY = put(be, ctx, dev, dy, yb), dX = put(be, ctx, dev, x, xb),
         dO = put(be, ctx, dev, off, (size_t)(E + 1) * 4), dW = put(be, ctx, dev, NULL, wb),
         dW2 = put(be, ctx, dev, NULL, wb);
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float beta = pass ? 1.0f : 0.0f; /* pass 0 over NaN poison */
        if (pass) {
            assert_int_equal(be->copy_to_device(ctx, dW.p, dw0, wb), LT_OK);
            assert_int_equal(be->copy_to_device(ctx, dW2.p, dw0, wb), LT_OK);
        }
        be->grouped_matmul_wgrad(ctx, E, dO.p, dDY.p, out, dX.p, in, nk, beta, dW.p);
        be->grouped_matmul_wgrad(ctx, E, dO.p, dDY.p, out, dX.p, in, nk, beta, dW2.p);
        get(be, ctx, dw, dW), get(be, ctx, dw2, dW2);
        double w = wgrad_check(dev, "", E, off, dy, out, x, in, beta, dw0, dw);
        worst = w > worst ? w : worst;
        if (memcmp(dw, dw2, wb) != 0) {
            fprintf(stderr, "wgrad %s E=%lld out=%lld in=%lld beta=%g: two calls differ (seed %llu)\n",
                    lt_test_backend_name(dev), (long long)E, (long long)out, (long long)in, beta,
                    (unsigned long long)g_seed);
            fail();
        }
    }
    printf("wgrad %s E=%lld (%lld, %lld) nk=%lld%s: max rel err %.2e, reproducible\n", lt_test_backend_name(dev),
           (long long)E, (long long)out, (long long)in, (long long)nk, c->all ? " (one expert)" : "", worst);
    drop(ctx, dev, dDY), drop(ctx, dev, dX), drop(ctx, dev, dO), drop(ctx, dev, dW), drop(ctx, dev, dW2);
    free(dy), free(x), free(dw0), free(dw), free(dw2), free(off);
    lt_ctx_free(ctx);
}

static void test_grouped_wgrad(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    /* Widths 40, 200, 776 take CUDA's 16-byte copies, 45, 201, 777 and ranks 1, 5 its 4-byte ones;
     * rank 256 is LT_MOE_WGRAD_MAX_RANK. */
    const wcase cases[] = {{5, 16, 200, 700, 0},    {8, 200, 16, 700, 0}, {3, 1, 776, 300, 1},   {6, 776, 1, 300, 0},
                           {4, 8, 40, 333, 0},      {4, 40, 8, 333, 1},   {3, 64, 200, 500, 0},  {3, 200, 64, 500, 1},
                           {4, 16, 40, 0, 0},       {2, 16, 776, 0, 1},   {1, 16, 776, 2100, 0}, {16, 16, 776, 6000, 0},
                           {3, 16, 776, 9000, 1},   {4, 16, 201, 333, 0}, {3, 45, 8, 300, 1},    {5, 777, 1, 200, 0},
                           {4, 5, 201, 333, 0},     {4, 777, 5, 333, 1},  {3, 16, 16, 100, 0},   {2, 256, 777, 130, 0},
                           {128, 16, 2048, 8192, 0}};
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed ^ 0x66;
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) run_wgrad(devs[d], &cases[ci], &r);
    }
}

/* The device backends' weight gradient captured once into a graph and replayed with offsets that
 * differ from the captured ones (copied in between replays). */
static void test_wgrad_graph(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs), ran = 0;
    for (int d = 0; d < nd; d++) {
        const lt_backend *be = lt_backend_get(devs[d]);
        if (!be->graph_begin) continue;
        ran = 1;
        lt_ctx *ctx = new_ctx();
        uint64_t r = g_seed ^ 0x77;
        const int64_t E = 7, out = 200, in = 16, nk = 900;
        const size_t yb = (size_t)(nk * out) * 4, xb = (size_t)(nk * in) * 4, wb = (size_t)(E * out * in) * 4;
        float *dy = malloc(yb), *x = malloc(xb), *dw = malloc(wb);
        int32_t *off = malloc((size_t)(E + 1) * 4);
        for (int64_t i = 0; i < nk * out; i++) dy[i] = (float)unif(&r);
        for (int64_t i = 0; i < nk * in; i++) x[i] = (float)unif(&r);
        wgrad_offsets(E, nk, 0, 0, off, &r);
        dbuf dDY = put(be, ctx, devs[d], dy, yb), dX = put(be, ctx, devs[d], x, xb),
             dO = put(be, ctx, devs[d], off, (size_t)(E + 1) * 4), dW = put(be, ctx, devs[d], NULL, wb);
        lt_graph *g = NULL;
        assert_int_equal(be->graph_begin(ctx), LT_OK);
        be->grouped_matmul_wgrad(ctx, E, dO.p, dDY.p, out, dX.p, in, nk, 0.0f, dW.p);
        assert_int_equal(be->graph_end(ctx, &g), LT_OK);
        for (int rep = 0; rep < 3; rep++) {
            wgrad_offsets(E, nk, rep == 1, rep == 1 ? 3 : 0, off, &r); /* rep 1: every row in expert 3 */
            assert_int_equal(be->copy_to_device(ctx, dO.p, off, (size_t)(E + 1) * 4), LT_OK);
            assert_int_equal(be->graph_launch(ctx, g, NULL), LT_OK);
            get(be, ctx, dw, dW);
            wgrad_check(devs[d], "graph replay", E, off, dy, out, x, in, 0.0f, NULL, dw);
        }
        printf("wgrad graph replay %s: 3 offset sets through one captured call: ok\n", lt_test_backend_name(devs[d]));
        be->graph_free(g);
        drop(ctx, devs[d], dDY), drop(ctx, devs[d], dX), drop(ctx, devs[d], dO), drop(ctx, devs[d], dW);
        free(dy), free(x), free(dw), free(off);
        lt_ctx_free(ctx);
    }
    if (!ran) printf("wgrad graph replay: skipped: no backend with graphs in this run\n");
}

int main(void) {
    g_seed = lt_test_seed(); /* a failure's printed seed reruns it (LONGTUNE_TEST_SEED) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route),          cmocka_unit_test(test_route_bwd),    cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_grouped_matmul), cmocka_unit_test(test_graph_replay), cmocka_unit_test(test_grouped_thin),
        cmocka_unit_test(test_grouped_wgrad),  cmocka_unit_test(test_wgrad_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
