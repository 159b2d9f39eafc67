/* See lora_check.h. Buffers live in the backend's memory (copied there and back through the op
 * table), outputs start poisoned unless the op accumulates into them, and the reference runs the
 * op's definition in float64 on the very weights the backend sees (bf16-rounded for bf16 W). */
#include "helpers/lora_check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/tensor.h"

static void *dev_copy(lt_ctx *ctx, const lt_backend *be, const void *h, size_t bytes) {
    void *d = lt_alloc(ctx, be->device, bytes, "lora test buffer");
    if (d && h) be->copy_to_device(ctx, d, h, bytes);
    return d;
}

static void host_copy(lt_ctx *ctx, const lt_backend *be, void *h, const void *d, size_t bytes) {
    be->copy_to_host(ctx, h, d, bytes);
}

static double worst(double a, double b) { return a > b || a != a ? a : b; }

static uint16_t *bf16_of(const float *x, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = lt_f32_to_bf16(x[i]);
    return h;
}

/* Elements of the device buffers got and want (n f32 each) whose bits differ. */
static int64_t bits_differ(lt_ctx *ctx, const lt_backend *be, const void *got, const void *want, int64_t n) {
    float *g = malloc((size_t)n * 4), *w = malloc((size_t)n * 4);
    host_copy(ctx, be, g, got, (size_t)n * 4);
    host_copy(ctx, be, w, want, (size_t)n * 4);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) k += memcmp(&g[i], &w[i], 4) != 0;
    free(g), free(w);
    return k;
}

/* The inputs of one case and the f32 ops' device results, for the bf16-input variants. */
typedef struct f32_run {
    const lt_lora_case *c;
    const float *x, *const *y0, *const *dy, *const *ga0, *const *gb0, *dx0;
    const lt_lora_proj *pp; /* the f32 run's projections (weights, factors, bias; its outputs) */
    const float *ddx;       /* its dx */
    void *ws;
} f32_run;

/* lora_fwd_bf16 + lora_bwd_bf16 with x in bf16 (v = 1), every dy in bf16 (v = 2) or both (v = 3),
 * on fresh copies of the accumulated outputs: the elements whose bits differ from the f32 run's. */
static int64_t bf16_variant(lt_ctx *ctx, const lt_backend *be, const f32_run *f, int v) {
    const lt_lora_case *c = f->c;
    const int G = c->G;
    const int64_t in = c->in, n = c->n, r = c->r;
    uint16_t *xh = bf16_of(f->x, n * in);
    void *dxh = dev_copy(ctx, be, xh, (size_t)(n * in) * 2);
    float *dxv = dev_copy(ctx, be, f->x, (size_t)(n * in) * 4);
    lt_lora_proj pp[3];
    memcpy(pp, f->pp, sizeof pp);
    void *dyh[3] = {NULL, NULL, NULL};
    for (int g = 0; g < G; g++) {
        const int64_t out = c->out[g];
        uint16_t *h = bf16_of(f->dy[g], n * out);
        dyh[g] = dev_copy(ctx, be, h, (size_t)(n * out) * 2);
        free(h);
        pp[g].y = c->lu_only ? NULL : dev_copy(ctx, be, f->y0[g], (size_t)(n * out) * 4);
        pp[g].ga = dev_copy(ctx, be, f->ga0[g], (size_t)(r * in) * 4);
        pp[g].gb = dev_copy(ctx, be, f->gb0[g], (size_t)(out * r) * 4);
        float *lp = lt_test_poisoned(n * r);
        pp[g].lu = dev_copy(ctx, be, lp, (size_t)(n * r) * 4);
        free(lp);
        if (v & 2) pp[g].dy = NULL, pp[g].dyh = dyh[g];
    }
    float *ddx = dev_copy(ctx, be, f->dx0, (size_t)(n * in) * 4);
    float *ddlu = dev_copy(ctx, be, NULL, (size_t)(n * 3 * r) * 4);
    const float *xf = v & 1 ? NULL : dxv;
    const uint16_t *xb = v & 1 ? dxh : NULL;
    be->lora_fwd_bf16(ctx, pp, G, xf, xb, n, r, c->s, c->beta, f->ws);
    be->lora_bwd_bf16(ctx, pp, G, xf, xb, n, r, c->s, c->no_dx ? NULL : ddx, NULL, c->beta, ddlu, f->ws);
    int64_t bad = 0;
    for (int g = 0; g < G; g++) {
        const int64_t out = c->out[g];
        const lt_lora_proj *P = &f->pp[g];
        if (P->a) {
            bad += bits_differ(ctx, be, pp[g].lu, P->lu, n * r);
            bad += bits_differ(ctx, be, pp[g].ga, P->ga, r * in);
            bad += bits_differ(ctx, be, pp[g].gb, P->gb, out * r);
        }
        if (!c->lu_only) bad += bits_differ(ctx, be, pp[g].y, P->y, n * out);
        if (pp[g].y) lt_free(ctx, be->device, pp[g].y, (size_t)(n * out) * 4);
        lt_free(ctx, be->device, pp[g].ga, (size_t)(r * in) * 4);
        lt_free(ctx, be->device, pp[g].gb, (size_t)(out * r) * 4);
        lt_free(ctx, be->device, pp[g].lu, (size_t)(n * r) * 4);
        lt_free(ctx, be->device, dyh[g], (size_t)(n * out) * 2);
    }
    if (!c->no_dx) bad += bits_differ(ctx, be, ddx, f->ddx, n * in);
    lt_free(ctx, be->device, ddx, (size_t)(n * in) * 4), lt_free(ctx, be->device, ddlu, (size_t)(n * 3 * r) * 4);
    lt_free(ctx, be->device, dxh, (size_t)(n * in) * 2), lt_free(ctx, be->device, dxv, (size_t)(n * in) * 4);
    free(xh);
    return bad;
}

/* lora_fwd_bf16 of the bf16 x with every output in bf16 (yh[g], device buffers the caller
 * compares and frees): the elements of lu whose bits differ from the f32 run's. */
static int64_t bf16_out_variant(lt_ctx *ctx, const lt_backend *be, const f32_run *f, uint16_t **yh) {
    const lt_lora_case *c = f->c;
    const int64_t in = c->in, n = c->n, r = c->r;
    uint16_t *xh = bf16_of(f->x, n * in);
    void *dxh = dev_copy(ctx, be, xh, (size_t)(n * in) * 2);
    lt_lora_proj pp[3];
    memcpy(pp, f->pp, sizeof pp);
    float *lp = lt_test_poisoned(n * r);
    for (int g = 0; g < c->G; g++) {
        const int64_t out = c->out[g];
        uint16_t *ph = malloc((size_t)(n * out) * 2);
        memset(ph, 0xff, (size_t)(n * out) * 2); /* NaN patterns: an element left unwritten shows */
        yh[g] = dev_copy(ctx, be, ph, (size_t)(n * out) * 2);
        free(ph);
        pp[g].y = NULL, pp[g].yh = yh[g];
        pp[g].lu = dev_copy(ctx, be, lp, (size_t)(n * r) * 4);
    }
    be->lora_fwd_bf16(ctx, pp, c->G, NULL, dxh, n, r, c->s, 0.0f, f->ws);
    int64_t bad = 0;
    for (int g = 0; g < c->G; g++) {
        if (f->pp[g].a) bad += bits_differ(ctx, be, pp[g].lu, f->pp[g].lu, n * r);
        lt_free(ctx, be->device, pp[g].lu, (size_t)(n * r) * 4);
    }
    lt_free(ctx, be->device, dxh, (size_t)(n * in) * 2);
    free(xh), free(lp);
    return bad;
}

/* lora_bwd_bf16 of one projection from the bf16 x and dy with its input gradient written in bf16
 * (dxh, a device buffer the caller compares and frees), on fresh copies of the accumulated
 * gradients: the elements of ga and gb whose bits differ from the f32 run's. */
static int64_t bf16_dx_variant(lt_ctx *ctx, const lt_backend *be, const f32_run *f, uint16_t **dxh) {
    const lt_lora_case *c = f->c;
    const int64_t in = c->in, n = c->n, r = c->r, out = c->out[0];
    uint16_t *xh = bf16_of(f->x, n * in), *dyh = bf16_of(f->dy[0], n * out);
    void *d_xh = dev_copy(ctx, be, xh, (size_t)(n * in) * 2), *d_dyh = dev_copy(ctx, be, dyh, (size_t)(n * out) * 2);
    lt_lora_proj P = f->pp[0];
    P.y = NULL, P.dy = NULL, P.dyh = d_dyh;
    P.ga = dev_copy(ctx, be, f->ga0[0], (size_t)(r * in) * 4);
    P.gb = dev_copy(ctx, be, f->gb0[0], (size_t)(out * r) * 4);
    uint16_t *ph = malloc((size_t)(n * in) * 2);
    memset(ph, 0xff, (size_t)(n * in) * 2); /* NaN patterns: an element left unwritten shows */
    *dxh = dev_copy(ctx, be, ph, (size_t)(n * in) * 2);
    float *ddlu = dev_copy(ctx, be, NULL, (size_t)(n * 3 * r) * 4);
    be->lora_bwd_bf16(ctx, &P, 1, NULL, d_xh, n, r, c->s, NULL, *dxh, 0.0f, ddlu, f->ws);
    int64_t bad = 0;
    if (P.a) bad = bits_differ(ctx, be, P.ga, f->pp[0].ga, r * in) + bits_differ(ctx, be, P.gb, f->pp[0].gb, out * r);
    lt_free(ctx, be->device, P.ga, (size_t)(r * in) * 4), lt_free(ctx, be->device, P.gb, (size_t)(out * r) * 4);
    lt_free(ctx, be->device, ddlu, (size_t)(n * 3 * r) * 4);
    lt_free(ctx, be->device, d_xh, (size_t)(n * in) * 2), lt_free(ctx, be->device, d_dyh, (size_t)(n * out) * 2);
    free(xh), free(dyh), free(ph);
    return bad;
}

/* lora_fwd with each y's prior value read from yc (a copy of y0) into a poisoned y: the elements
 * whose bits differ from pp's in-place run (whose y it leaves alone). */
static int64_t yc_variant(lt_ctx *ctx, const lt_backend *be, const lt_lora_case *c, const lt_lora_proj *pp0,
                          const float *dxv, const float *const *y0, void *ws) {
    const int64_t n = c->n, r = c->r;
    lt_lora_proj pp[3];
    memcpy(pp, pp0, sizeof pp);
    float *yc[3] = {NULL, NULL, NULL};
    for (int g = 0; g < c->G; g++) {
        const int64_t out = c->out[g];
        float *p = lt_test_poisoned(n * out);
        pp[g].y = dev_copy(ctx, be, p, (size_t)(n * out) * 4);
        free(p);
        yc[g] = dev_copy(ctx, be, y0[g], (size_t)(n * out) * 4);
        pp[g].yc = yc[g];
        pp[g].lu = dev_copy(ctx, be, NULL, (size_t)(n * r) * 4);
    }
    be->lora_fwd(ctx, pp, c->G, dxv, n, r, c->s, c->beta, ws);
    int64_t bad = 0;
    for (int g = 0; g < c->G; g++) {
        const int64_t out = c->out[g];
        bad += bits_differ(ctx, be, pp[g].y, pp0[g].y, n * out);
        lt_free(ctx, be->device, pp[g].y, (size_t)(n * out) * 4),
            lt_free(ctx, be->device, yc[g], (size_t)(n * out) * 4);
        lt_free(ctx, be->device, pp[g].lu, (size_t)(n * r) * 4);
    }
    return bad;
}

void lt_lora_check_run(const lt_backend *be, uint64_t *rng, const lt_lora_case *c, lt_lora_errors *err) {
    lt_ctx *ctx = lt_ctx_new();
    const int G = c->G;
    const int64_t in = c->in, n = c->n, r = c->r;
    memset(err, 0, sizeof *err);
    float *x = lt_test_fresh(rng, n * in, 1.0f);
    float *wv[3], *A[3], *B[3], *bias[3], *y0[3], *dy[3], *ga0[3], *gb0[3];
    void *wh[3];
    size_t wbytes[3];
    lt_tensor wt[3];
    void *dw[3];
    float *dA[3], *dB[3], *dbias[3], *dyv[3], *ddy[3], *dga[3], *dgb[3], *dlu[3];
    size_t ws_bytes = 0;
    for (int g = 0; g < G; g++) {
        const int64_t out = c->out[g];
        wv[g] = lt_test_fresh(rng, out * in, 1.0f / sqrtf((float)in));
        wbytes[g] = (size_t)(out * in) * (c->wdtype == LT_DTYPE_BF16 ? 2 : 4);
        wh[g] = malloc(wbytes[g]);
        if (c->wdtype == LT_DTYPE_BF16) {
            uint16_t *h = wh[g];
            for (int64_t i = 0; i < out * in; i++) h[i] = lt_f32_to_bf16(wv[g][i]), wv[g][i] = lt_bf16_to_f32(h[i]);
        } else {
            memcpy(wh[g], wv[g], wbytes[g]);
        }
        A[g] = lt_test_fresh(rng, r * in, 1.0f / sqrtf((float)in));
        B[g] = lt_test_fresh(rng, out * r, 0.5f);
        bias[g] = lt_test_fresh(rng, out, 1.0f);
        y0[g] = c->beta != 0 ? lt_test_fresh(rng, n * out, 1.0f) : lt_test_poisoned(n * out);
        dy[g] = lt_test_fresh(rng, n * out, 1.0f);
        ga0[g] = lt_test_fresh(rng, r * in, 1.0f);
        gb0[g] = lt_test_fresh(rng, out * r, 1.0f);
        int64_t shape[2] = {out, in};
        dw[g] = dev_copy(ctx, be, wh[g], wbytes[g]);
        wt[g] = lt_tensor_view(dw[g], c->wdtype, be->device, 2, shape);
        dA[g] = dev_copy(ctx, be, A[g], (size_t)(r * in) * 4);
        dB[g] = dev_copy(ctx, be, B[g], (size_t)(out * r) * 4);
        dbias[g] = dev_copy(ctx, be, bias[g], (size_t)out * 4);
        dyv[g] = dev_copy(ctx, be, y0[g], (size_t)(n * out) * 4);
        ddy[g] = dev_copy(ctx, be, dy[g], (size_t)(n * out) * 4);
        dga[g] = dev_copy(ctx, be, ga0[g], (size_t)(r * in) * 4);
        dgb[g] = dev_copy(ctx, be, gb0[g], (size_t)(out * r) * 4);
        float *lp = lt_test_poisoned(n * r);
        dlu[g] = dev_copy(ctx, be, lp, (size_t)(n * r) * 4);
        free(lp);
        size_t w = be->matmul_workspace_bytes(c->wdtype, out, in, n, lt_ctx_threads(ctx));
        if (w > ws_bytes) ws_bytes = w;
    }
    if (be->lora_workspace_bytes) {
        int64_t out_max = 0;
        for (int g = 0; g < G; g++) out_max = c->out[g] > out_max ? c->out[g] : out_max;
        size_t lw = be->lora_workspace_bytes(G, r, in, out_max, lt_ctx_threads(ctx));
        if (lw > ws_bytes) ws_bytes = lw;
    }
    void *ws = ws_bytes ? dev_copy(ctx, be, NULL, ws_bytes) : NULL;
    float *dx0 = c->beta != 0 ? lt_test_fresh(rng, n * in, 1.0f) : lt_test_poisoned(n * in);
    float *ddx = dev_copy(ctx, be, dx0, (size_t)(n * in) * 4);
    float *ddlu = dev_copy(ctx, be, NULL, (size_t)(n * 3 * r) * 4);
    float *dxv = dev_copy(ctx, be, x, (size_t)(n * in) * 4);

    lt_lora_proj pp[3];
    memset(pp, 0, sizeof pp);
    for (int g = 0; g < G; g++) {
        pp[g].w = &wt[g];
        pp[g].a = c->adapted[g] ? dA[g] : NULL;
        pp[g].b = dB[g];
        pp[g].ga = dga[g], pp[g].gb = dgb[g];
        pp[g].bias = c->bias ? dbias[g] : NULL;
        pp[g].y = c->lu_only ? NULL : dyv[g];
        pp[g].dy = ddy[g];
        pp[g].lu = dlu[g];
    }
    be->lora_fwd(ctx, pp, G, dxv, n, r, c->s, c->beta, ws);
    be->lora_bwd(ctx, pp, G, dxv, n, r, c->s, c->no_dx ? NULL : ddx, c->beta, ddlu, ws);
    err->yc_mismatch = c->beta != 0 && !c->lu_only ? yc_variant(ctx, be, c, pp, dxv, (const float *const *)y0, ws) : -1;

    uint16_t *yh[3] = {NULL, NULL, NULL}, *dxh = NULL; /* the bf16-output runs' y and dx, where they ran */
    err->y_bf16 = err->dx_bf16 = -1;
    int takes = be->lora_bf16_takes != NULL;
    for (int g = 0; g < G && takes; g++) takes = be->lora_bf16_takes(c->wdtype, c->out[g], in, c->adapted[g] ? r : 0);
    if (takes) {
        const f32_run f = {c,
                           x,
                           (const float *const *)y0,
                           (const float *const *)dy,
                           (const float *const *)ga0,
                           (const float *const *)gb0,
                           dx0,
                           pp,
                           ddx,
                           ws};
        for (int v = 1; v <= 3; v++) err->bf16_mismatch += bf16_variant(ctx, be, &f, v);
        err->bf16_variants = 3;
        if (c->beta == 0 && !c->bias && !c->lu_only) err->bf16_mismatch += bf16_out_variant(ctx, be, &f, yh);
        if (G == 1 && c->beta == 0 && !c->no_dx) err->bf16_mismatch += bf16_dx_variant(ctx, be, &f, &dxh);
    }

    /* float64 reference, and the comparisons */
    double *lu = malloc(sizeof(double) * (size_t)(n * r)), *dlur = malloc(sizeof(double) * (size_t)(n * r));
    double *dxr = malloc(sizeof(double) * (size_t)(n * in));
    for (int64_t i = 0; i < n * in; i++) dxr[i] = c->beta != 0 ? (double)c->beta * dx0[i] : 0.0;
    for (int g = 0; g < G; g++) {
        const int64_t out = c->out[g];
        const int ad = c->adapted[g];
        for (int64_t i = 0; i < n; i++)
            for (int j = 0; j < r; j++) {
                double a = 0;
                for (int64_t k = 0; k < in; k++) a += (double)x[i * in + k] * A[g][j * in + k];
                lu[i * r + j] = a;
                double d = 0;
                for (int64_t o = 0; o < out; o++) d += (double)dy[g][i * out + o] * B[g][o * r + j];
                dlur[i * r + j] = c->s * d;
            }
        float *got = malloc(sizeof(float) * (size_t)(n * (out > in ? out : in)));
        double *ref = malloc(sizeof(double) * (size_t)(n * (out > in ? out : in)));
        if (ad) {
            host_copy(ctx, be, got, dlu[g], (size_t)(n * r) * 4);
            err->lu = worst(err->lu, lt_test_rel_err_f(got, lu, n * r));
        }
        if (!c->lu_only) {
            for (int64_t i = 0; i < n; i++)
                for (int64_t o = 0; o < out; o++) {
                    double v = c->beta != 0 ? (double)c->beta * y0[g][i * out + o] : 0.0;
                    for (int64_t k = 0; k < in; k++) v += (double)x[i * in + k] * wv[g][o * in + k];
                    if (c->bias) v += bias[g][o];
                    if (ad)
                        for (int j = 0; j < r; j++) v += c->s * lu[i * r + j] * B[g][o * r + j];
                    ref[i * out + o] = v;
                }
            host_copy(ctx, be, got, dyv[g], (size_t)(n * out) * 4);
            err->y = worst(err->y, lt_test_rel_err_f(got, ref, n * out));
            if (yh[g]) {
                uint16_t *h = malloc((size_t)(n * out) * 2);
                host_copy(ctx, be, h, yh[g], (size_t)(n * out) * 2);
                for (int64_t i = 0; i < n * out; i++) got[i] = lt_bf16_to_f32(h[i]);
                free(h);
                err->y_bf16 = worst(err->y_bf16 < 0 ? 0 : err->y_bf16, lt_test_rel_err_f(got, ref, n * out));
                lt_free(ctx, be->device, yh[g], (size_t)(n * out) * 2);
            }
        }
        if (ad) {
            for (int j = 0; j < r; j++)
                for (int64_t k = 0; k < in; k++) {
                    double v = ga0[g][j * in + k];
                    for (int64_t i = 0; i < n; i++) v += dlur[i * r + j] * x[i * in + k];
                    ref[j * in + k] = v;
                }
            host_copy(ctx, be, got, dga[g], (size_t)(r * in) * 4);
            err->ga = worst(err->ga, lt_test_rel_err_f(got, ref, r * in));
            for (int64_t o = 0; o < out; o++)
                for (int j = 0; j < r; j++) {
                    double v = gb0[g][o * r + j];
                    for (int64_t i = 0; i < n; i++) v += c->s * (double)dy[g][i * out + o] * lu[i * r + j];
                    ref[o * r + j] = v;
                }
            host_copy(ctx, be, got, dgb[g], (size_t)(out * r) * 4);
            err->gb = worst(err->gb, lt_test_rel_err_f(got, ref, out * r));
        }
        for (int64_t i = 0; i < n; i++)
            for (int64_t k = 0; k < in; k++) {
                double v = 0;
                for (int64_t o = 0; o < out; o++) v += (double)dy[g][i * out + o] * wv[g][o * in + k];
                if (ad)
                    for (int j = 0; j < r; j++) v += dlur[i * r + j] * A[g][j * in + k];
                dxr[i * in + k] += v;
            }
        free(got), free(ref);
    }
    if (!c->no_dx) {
        float *got = malloc(sizeof(float) * (size_t)(n * in));
        host_copy(ctx, be, got, ddx, (size_t)(n * in) * 4);
        err->dx = lt_test_rel_err_f(got, dxr, n * in);
        if (dxh) {
            uint16_t *h = malloc((size_t)(n * in) * 2);
            host_copy(ctx, be, h, dxh, (size_t)(n * in) * 2);
            for (int64_t i = 0; i < n * in; i++) got[i] = lt_bf16_to_f32(h[i]);
            free(h);
            err->dx_bf16 = lt_test_rel_err_f(got, dxr, n * in);
            lt_free(ctx, be->device, dxh, (size_t)(n * in) * 2);
        }
        free(got);
    }

    for (int g = 0; g < G; g++) {
        const int64_t out = c->out[g];
        lt_free(ctx, be->device, dw[g], wbytes[g]);
        lt_free(ctx, be->device, dA[g], (size_t)(r * in) * 4), lt_free(ctx, be->device, dB[g], (size_t)(out * r) * 4);
        lt_free(ctx, be->device, dbias[g], (size_t)out * 4), lt_free(ctx, be->device, dyv[g], (size_t)(n * out) * 4);
        lt_free(ctx, be->device, ddy[g], (size_t)(n * out) * 4), lt_free(ctx, be->device, dga[g], (size_t)(r * in) * 4);
        lt_free(ctx, be->device, dgb[g], (size_t)(out * r) * 4), lt_free(ctx, be->device, dlu[g], (size_t)(n * r) * 4);
        free(wv[g]), free(wh[g]), free(A[g]), free(B[g]), free(bias[g]), free(y0[g]), free(dy[g]), free(ga0[g]);
        free(gb0[g]);
    }
    if (ws) lt_free(ctx, be->device, ws, ws_bytes);
    lt_free(ctx, be->device, ddx, (size_t)(n * in) * 4), lt_free(ctx, be->device, ddlu, (size_t)(n * 3 * r) * 4);
    lt_free(ctx, be->device, dxv, (size_t)(n * in) * 4);
    free(x), free(dx0), free(lu), free(dlur), free(dxr);
    lt_ctx_free(ctx);
}
