/* CUDA linear cross-entropy (bf16 h; bf16 and block-quantized heads) against float64 and the CPU
 * backend, on fresh random inputs with poisoned outputs: mean / sum / none reductions, label
 * smoothing, z-loss, softcap, ignored targets, token weights, small tiles (many chunks), dW
 * accumulation, and the error naming a bad target; each through lt_lce_forward + lt_lce_backward
 * and through lt_lce_forward_backward (one pass: two GEMMs per tile, bf16 and fp32 logit tiles,
 * running max moved late; and its two-call fallback for dw, softcap with smoothing), with
 * the workspace bound and the bytes the allocator saw. Tolerance: twice the error of a naive bf16
 * implementation (bf16 logits and logit gradients, emulated here) against the float64 reference.
 * Without a CUDA device (or build) it prints "skipped: no CUDA device" and exits 77. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/lce.h"
#include "longtune/tensor.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>

#define TOL_BF16_FLOOR 0x1.0p-8

typedef struct lcase {
    int64_t N, C, V;
    lt_dtype wdtype;
    lt_lce_options opt;
    int ignore_every;  /* every k-th target ignored (0 = none) */
    int weights;
    int dh_f32;
    int with_dw;
    int with_cpu;
    int one_call;      /* lt_lce_forward_backward instead of forward then backward */
    int late_max;      /* the last quarter of the vocabulary gets 6x larger logits */
} lcase;

/* Float64 loss, lse, per-token loss and gradients; emu rounds logits, logit gradients and dh to
 * bf16 as a naive bf16 implementation would. */
static void reference(const lcase *c, const float *h, const float *w, const int32_t *tgt,
                      const float *tw, const float *dloss, int emu, double *loss, double *lse,
                      double *tl, double *dh, double *dw) {
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
            double g = coef * ((1 + 2 * zl * lse[i]) * exp(s - lse[i]) - eps / (double)V -
                               (j == tgt[i] ? 1 - eps : 0)) * fj;
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
    reference(c, h, w, tgt, tw, dloss, 0, r_loss, r_lse, r_tl, r_dh, r_dw);
    reference(c, h, w, tgt, tw, dloss, 1, e_loss, e_lse, e_tl, e_dh, e_dw);

    struct { const char *name; const float *got; const double *ref, *emu; int64_t n; } chk[5] = {
        {"loss", g_loss, r_loss, e_loss, nl}, {"lse", g_lse, r_lse, e_lse, N},
        {"token_loss", g_tl, r_tl, e_tl, N}, {"dh", g_dh, r_dh, e_dh, N * C}, {"dw", NULL, NULL, NULL, 0}};
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
                lt_dtype_name(c->wdtype), (int)c->opt.reduction, (double)c->opt.label_smoothing,
                (double)c->opt.z_loss, (double)c->opt.softcap, c->opt.tile_n, c->opt.tile_v, chk[i].name,
                err, tol);
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
    free(h); free(w); free(hb); free(wq); free(tgt); free(tw); free(dloss); free(w0);
    free(g_loss); free(g_lse); free(g_tl); free(g_dh); free(g_dw);
    free(r_loss); free(r_lse); free(r_tl); free(r_dh); free(e_loss); free(e_lse); free(e_tl); free(e_dh);
    free(r_dw); free(e_dw);
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
/* The shape (N=8192, V=151936, C=4096): the one-pass workspace is at most 64 MiB. */
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

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    /* A subset for slow runs (compute-sanitizer): a cmocka name pattern such as "fb_*". */
    const char *filter = getenv("LONGTUNE_TEST_FILTER");
    if (filter && filter[0]) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
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
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) { return lt_test_cuda_skip(); }
#endif
