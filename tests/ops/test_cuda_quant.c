/* The CUDA backend on the GGUF block formats beyond Q4_1 (Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K,
 * Q6_K, IQ4_NL, IQ4_XS), each from random valid blocks (random quant bytes and sub-block scales,
 * f16 scales drawn for weights of order 0.5) decoded on the host by tests/helpers/ref_quant.c,
 * a decoder written from ggml's layouts independently of src/core: the embedding gather returns
 * the decoded weights bit for bit (the device decoder's arithmetic is the host's), the weight
 * matmul (its bf16 tile conversion, both modes, with and without accumulation) lands within the
 * op matrix's bf16 tolerance of a float64 product of the decoded weights, and the fused loss with
 * the head kept in that format (forward, backward, forward_backward) within the tolerance of the
 * float64 loss over the decoded head. Without a CUDA device (or build) it prints "skipped: no
 * CUDA device" and exits 77. */
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
#include "helpers/ref_quant.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/lce.h"
#include "longtune/tensor.h"

#if LT_HAVE_CUDA

#define F4(n) ((size_t)(n) * sizeof(float))

static uint64_t seed;

static const lt_backend *gpu(void) { return lt_backend_get(LT_DEVICE_CUDA); }

static void *up(lt_ctx *ctx, const void *h, size_t bytes) {
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, bytes ? bytes : 1, "quant test buffer");
    assert_non_null(d);
    if (h && bytes) assert_int_equal(gpu()->copy_to_device(ctx, d, h, bytes), LT_OK);
    return d;
}
static void down(lt_ctx *ctx, void *h, const void *d, size_t bytes) {
    assert_int_equal(gpu()->copy_to_host(ctx, h, d, bytes), LT_OK);
}
static void dfree(lt_ctx *ctx, void *d, size_t bytes) { lt_free(ctx, LT_DEVICE_CUDA, d, bytes ? bytes : 1); }

/* (rows, cols) random blocks of dtype t; wd gets the host decoder's weights. */
static uint8_t *random_weight(uint64_t *rng, lt_dtype t, int64_t rows, int64_t cols, double mag, float *wd) {
    const size_t rb = (size_t)lt_dtype_row_bytes(t, cols);
    uint8_t *w = malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        lt_ref_random_row(rng, t, w + rb * (size_t)r, cols, mag);
        lt_ref_dequant_row(t, w + rb * (size_t)r, wd + r * cols, cols);
    }
    return w;
}

/* The embedding gather decodes rows on the device with lt_dq_elem: bit-identical to the host. */
static void embedding_rows_are_bit_identical(void **state) {
    (void)state;
    const int64_t V = 37, C = 768, N = 29;
    for (int k = 0; k < lt_ref_quant_ntypes; k++) {
        const lt_dtype t = lt_ref_quant_types[k];
        uint64_t rng = seed + (uint64_t)k;
        lt_ctx *ctx = lt_ctx_new();
        float *wd = malloc(F4(V * C)), *got = malloc(F4(N * C)), *P = lt_test_poisoned(N * C);
        uint8_t *w = random_weight(&rng, t, V, C, 0.5, wd);
        const size_t wb = (size_t)lt_dtype_row_bytes(t, C) * (size_t)V;
        int32_t *ids = malloc((size_t)N * 4);
        for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
        ids[0] = 0, ids[N - 1] = (int32_t)V - 1;
        int64_t sh[2] = {V, C};
        lt_tensor tt = lt_tensor_view(up(ctx, w, wb), t, LT_DEVICE_CUDA, 2, sh);
        int32_t *d_ids = up(ctx, ids, (size_t)N * 4);
        float *d_out = up(ctx, P, F4(N * C));
        gpu()->embedding(ctx, &tt, d_ids, N, d_out);
        down(ctx, got, d_out, F4(N * C));
        int64_t bad = 0, first = -1;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++)
                if (memcmp(&got[n * C + c], &wd[ids[n] * C + c], 4)) bad++, first = first < 0 ? n * C + c : first;
        fprintf(stderr, "  embedding %-6s: %lld of %lld weights differ\n", lt_dtype_name(t), (long long)bad,
                (long long)(N * C));
        if (bad)
            fprintf(stderr, "    first [%lld]: got %.9g want %.9g\n", (long long)first, (double)got[first],
                    (double)wd[ids[first / C] * C + first % C]);
        assert_int_equal(bad, 0);
        dfree(ctx, tt.data, wb), dfree(ctx, d_ids, (size_t)N * 4), dfree(ctx, d_out, F4(N * C));
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
        lt_ctx_free(ctx);
        free(wd), free(got), free(P), free(w), free(ids);
    }
}

#define WS_GUARD 4096 /* bytes after the workspace that must stay untouched */

/* y = x·Wᵀ (NT, y poisoned, beta 0) and y = x·W + y (NN, beta 1) against float64. */
static int64_t matmul_case(lt_ctx *ctx, uint64_t *rng, lt_dtype t, int64_t out, int64_t in, int64_t N, int nn) {
    const lt_matmul_mode mode = nn ? LT_MATMUL_NN : LT_MATMUL_NT;
    const float beta = nn ? 1.0f : 0.0f;
    float *wd = malloc(F4(out * in));
    uint8_t *w = random_weight(rng, t, out, in, 0.5, wd);
    const size_t wb = (size_t)lt_dtype_row_bytes(t, in) * (size_t)out;
    int64_t shape[2] = {out, in};
    lt_tensor tw = lt_tensor_view(up(ctx, w, wb), t, LT_DEVICE_CUDA, 2, shape);
    const size_t wsb = gpu()->matmul_workspace_bytes(t, out, in, N, 1);
    uint8_t *guard = malloc(wsb + WS_GUARD);
    memset(guard, 0xa5, wsb + WS_GUARD);
    uint8_t *ws = up(ctx, guard, wsb + WS_GUARD);
    const int64_t xin = nn ? out : in, yout = nn ? in : out;
    float *x = lt_test_fresh(rng, N * xin, 1);
    float *y0 = nn ? lt_test_fresh(rng, N * yout, 1) : lt_test_poisoned(N * yout);
    float *dx = up(ctx, x, F4(N * xin)), *dy = up(ctx, y0, F4(N * yout)), *y = malloc(F4(N * yout));
    gpu()->matmul(ctx, mode, &tw, dx, N, beta, dy, ws);
    down(ctx, y, dy, F4(N * yout));
    down(ctx, guard, ws + wsb, WS_GUARD);
    int64_t fails = 0;
    for (int i = 0; i < WS_GUARD; i++) fails += guard[i] != 0xa5;
    const double tol = lt_test_tol_for(LT_DTYPE_BF16, xin);
    double worst = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < yout; j++) {
            double s = 0, sa = 0;
            for (int64_t kk = 0; kk < xin; kk++) {
                const double p = (double)x[n * xin + kk] * wd[nn ? kk * in + j : j * in + kk];
                s += p, sa += fabs(p);
            }
            const double want = s + (nn ? y0[n * yout + j] : 0), got = y[n * yout + j];
            const double err = fabs(got - want) / (fabs(want) + sa);
            worst = err > worst ? err : worst;
            if (!(fabs(got - want) <= tol * (fabs(want) + sa) + LT_TOL_F32_ABS)) {
                if (!fails) fprintf(stderr, "    y[%lld]: got %.9g want %.9g\n", (long long)(n * yout + j), got, want);
                fails++;
            }
        }
    fprintf(stderr, "  matmul %-6s %s %lldx%lldx%lld: worst %.2e (tol %.2e)\n", lt_dtype_name(t), nn ? "NN" : "NT",
            (long long)out, (long long)in, (long long)N, worst, tol);
    dfree(ctx, tw.data, wb), dfree(ctx, ws, wsb + WS_GUARD), dfree(ctx, dx, F4(N * xin)), dfree(ctx, dy, F4(N * yout));
    free(wd), free(w), free(guard), free(x), free(y0), free(y);
    return fails;
}

/* out not a multiple of a tile of 128 rows, in two super-blocks (and 24 of the 32-weight blocks
 * of Q5_0/Q5_1/IQ4_NL), N not a multiple of anything; one token row. */
static void matmul_matches_float64(void **state) {
    (void)state;
    for (int k = 0; k < lt_ref_quant_ntypes; k++) {
        const lt_dtype t = lt_ref_quant_types[k];
        uint64_t rng = seed + 100 + (uint64_t)k;
        lt_ctx *ctx = lt_ctx_new();
        int64_t fails = matmul_case(ctx, &rng, t, 150, 768, 37, 0) + matmul_case(ctx, &rng, t, 150, 768, 37, 1) +
            matmul_case(ctx, &rng, t, 200, 256, 1, 0);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
        lt_ctx_free(ctx);
        assert_int_equal(fails, 0);
    }
}

/* The fused loss with the head in t: mean reduction with label smoothing on one half of the
 * types, sum with softcap on the other; ignored tokens every 7th. */
static void lce_head_case(lt_dtype t, uint64_t rng) {
    const int64_t N = 41, C = 256, V = 333;
    lt_ctx *ctx = lt_ctx_new();
    const int odd = (int)t & 1;
    lt_ref_lce_opts o = {odd ? LT_REDUCTION_SUM : LT_REDUCTION_MEAN, odd ? 0 : 0.1, 0, odd ? 30 : 0, NULL};
    float *wf = malloc(F4(V * C));
    uint8_t *w = random_weight(&rng, t, V, C, 0.1, wf);
    const size_t wb = (size_t)lt_dtype_row_bytes(t, C) * (size_t)V;
    double *wd = malloc(sizeof(double) * (size_t)(V * C)), *hd = malloc(sizeof(double) * (size_t)(N * C));
    float *hf = malloc(F4(N * C));
    for (int64_t i = 0; i < V * C; i++) wd[i] = wf[i];
    for (int64_t i = 0; i < N * C; i++) hd[i] = lt_test_bf16_round(lt_test_normal(&rng)), hf[i] = (float)hd[i];
    int32_t *tgt = malloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++)
        tgt[i] = i % 7 == 3 ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
    const double one = 1.0;
    double loss, *lse = malloc(sizeof(double) * (size_t)N), *dh = malloc(sizeof(double) * (size_t)(N * C));
    lt_ref_lce(hd, wd, tgt, N, C, V, &o, &one, &loss, lse, dh);

    float *Pn = lt_test_poisoned(N * C), dl1 = 1.0f;
    float *d_h = up(ctx, hf, F4(N * C)), *d_dh = up(ctx, Pn, F4(N * C)), *d_lse = up(ctx, Pn, F4(N));
    float *d_loss = up(ctx, Pn, F4(1)), *d_dl = up(ctx, &dl1, F4(1));
    void *d_w = up(ctx, w, wb);
    int32_t *d_t = up(ctx, tgt, (size_t)N * 4);
    int64_t hs[2] = {N, C}, wsh[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(d_dh, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, hs);
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(d_h, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(d_w, t, LT_DEVICE_CUDA, 2, wsh);
    a.targets = d_t, a.loss = d_loss, a.lse = d_lse, a.dloss = d_dl, a.dh = &tdh;
    lt_lce_options opt;
    memset(&opt, 0, sizeof opt);
    opt.reduction = o.red, opt.label_smoothing = (float)o.eps, opt.softcap = (float)o.cap;
    lt_status st = lt_lce_forward(ctx, &opt, &a);
    if (st != LT_OK) fprintf(stderr, "    lce %s: %s\n", lt_dtype_name(t), lt_ctx_error(ctx));
    assert_int_equal(st, LT_OK);
    assert_int_equal(lt_lce_backward(ctx, &opt, &a), LT_OK);
    const double tf = lt_test_tol_for(LT_DTYPE_BF16, C), tb = 2 * lt_test_tol_for(LT_DTYPE_BF16, V);
    float gloss, *glse = malloc(F4(N)), *gdh = malloc(F4(N * C));
    double *got = malloc(sizeof(double) * (size_t)(N * C)), *lref = malloc(sizeof(double) * (size_t)N);
    for (int pass = 0; pass < 2; pass++) { /* two calls, then forward_backward */
        if (pass) {
            assert_int_equal(gpu()->copy_to_device(ctx, d_dh, Pn, F4(N * C)), LT_OK);
            assert_int_equal(lt_lce_forward_backward(ctx, &opt, &a), LT_OK);
        }
        down(ctx, &gloss, d_loss, F4(1)), down(ctx, glse, d_lse, F4(N)), down(ctx, gdh, d_dh, F4(N * C));
        got[0] = gloss;
        const double el = lt_test_rel_err_d(got, &loss, 1);
        for (int64_t i = 0; i < N; i++) /* the lse of ignored tokens is not compared */
            got[i] = tgt[i] == LT_IGNORE_INDEX ? 0 : glse[i], lref[i] = tgt[i] == LT_IGNORE_INDEX ? 0 : lse[i];
        const double es = lt_test_rel_err_d(got, lref, N);
        for (int64_t i = 0; i < N * C; i++) got[i] = gdh[i];
        const double eg = lt_test_rel_err_d(got, dh, N * C);
        int64_t ign_bad = 0;
        for (int64_t i = 0; i < N; i++)
            for (int64_t c = 0; c < C && tgt[i] == LT_IGNORE_INDEX; c++) ign_bad += gdh[i * C + c] != 0;
        fprintf(stderr, "  lce %-6s %s: loss %.2e lse %.2e (tol %.2e) dh %.2e (tol %.2e)\n", lt_dtype_name(t),
                pass ? "forward_backward" : "forward+backward", el, es, tf, eg, tb);
        assert_true(el <= tf && es <= tf && eg <= tb);
        assert_int_equal(ign_bad, 0);
    }
    dfree(ctx, d_h, F4(N * C)), dfree(ctx, d_dh, F4(N * C)), dfree(ctx, d_lse, F4(N)), dfree(ctx, d_loss, F4(1));
    dfree(ctx, d_dl, F4(1)), dfree(ctx, d_w, wb), dfree(ctx, d_t, (size_t)N * 4);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
    free(wf), free(w), free(wd), free(hd), free(hf), free(tgt), free(lse), free(dh), free(Pn), free(glse), free(gdh);
    free(got), free(lref);
}

static void lce_reads_the_head_in_its_format(void **state) {
    (void)state;
    for (int k = 0; k < lt_ref_quant_ntypes; k++) lce_head_case(lt_ref_quant_types[k], seed + 200 + (uint64_t)k);
}

/* The supports query admits every format as a CUDA loss head. */
static void supports_every_head_format(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (int k = 0; k < lt_ref_quant_ntypes; k++) {
        lt_op_query q;
        memset(&q, 0, sizeof q);
        q.op = LT_OP_LCE, q.wdtype = lt_ref_quant_types[k];
        lt_status st = lt_backend_cuda_supports(ctx, &q);
        if (st != LT_OK) fprintf(stderr, "    %s: %s\n", lt_dtype_name(q.wdtype), lt_ctx_error(ctx));
        assert_int_equal(st, LT_OK);
    }
    lt_ctx_free(ctx);
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    seed = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(supports_every_head_format),
        cmocka_unit_test(embedding_rows_are_bit_identical),
        cmocka_unit_test(matmul_matches_float64),
        cmocka_unit_test(lce_reads_the_head_in_its_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) { return lt_test_cuda_skip(); }
#endif
