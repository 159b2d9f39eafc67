/* The CUDA backend's ops against float64 references and the CPU backend, on fresh random inputs
 * with poisoned outputs, called through the op table as the model calls them: f32 gemm (every
 * transpose, unaligned operands, K = 0), the bf16 weight matmul for every W dtype (several weight
 * tiles and x chunks, workspace guard bytes), RMSNorm, RoPE at long-context angles, SwiGLU,
 * embedding (bit-identical to the CPU gather), add, bias, dropout (masks identical to the CPU
 * ones), AdamW, zero, scale, sumsq and copies; and f32 attention and linear cross-entropy on the
 * device, which must equal the bf16 kernels on the rounded inputs (their accuracy is checked in
 * test_cuda_attention and test_cuda_lce) and land near the CPU's f32 results. Without a CUDA device (or build) it prints
 * "skipped: no CUDA device" and exits 77. */
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
#include "backend/prof.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/lce.h"
#include "longtune/tensor.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>

/* Half an ulp of bf16 at 1: the least relative error a bf16 result can carry. */
#define TOL_BF16_FLOOR 0x1.0p-8

static const lt_backend *gpu(void) { return lt_backend_get(LT_DEVICE_CUDA); }
static const lt_backend *cpu(void) { return lt_backend_get(LT_DEVICE_CPU); }

/* Device buffer holding a copy of host bytes. */
static void *up(lt_ctx *ctx, const void *h, size_t bytes) {
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, bytes, "test buffer");
    assert_non_null(d);
    assert_int_equal(gpu()->copy_to_device(ctx, d, h, bytes), LT_OK);
    return d;
}

static void down(lt_ctx *ctx, void *h, const void *d, size_t bytes) {
    assert_int_equal(gpu()->copy_to_host(ctx, h, d, bytes), LT_OK);
}

static void dfree(lt_ctx *ctx, void *d, size_t bytes) { lt_free(ctx, LT_DEVICE_CUDA, d, bytes); }

#define F4(n) ((size_t)(n) * sizeof(float))

/* |got - want| <= ADAMW_ULPS float epsilons of (|want| + scale): fp32 rounding of the same
 * formula, where the device may fuse a multiply-add the host rounds twice. */
#define ADAMW_ULPS 4
static void ulps_close(double got, double want, double scale, const char *what, int64_t i) {
    double tol = ADAMW_ULPS * 0x1.0p-23 * (fabs(want) + scale);
    if (!(fabs(got - want) <= tol)) {
        fprintf(stderr, "%s[%lld]: got %.9g want %.9g (tol %.3g)\n", what, (long long)i, got, want, tol);
        fail();
    }
}

/* ---- gemm ---- */

static void gemm_case(lt_ctx *ctx, uint64_t *rng, int ta, int tb, int64_t M, int64_t N, int64_t K, int64_t pad,
                      float beta) {
    /* operands start `pad` floats into their buffers and rows are `pad` longer than needed, so
     * pad = 1 gives 4-byte-aligned pointers and odd leading dimensions */
    int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    int64_t na = (ta ? K : M) * lda + pad, nb = (tb ? N : K) * ldb + pad, nc = M * ldc + pad;
    if (na < 1) na = 1; /* K = 0: empty operands, but buffers to point at */
    if (nb < 1) nb = 1;
    float *A = lt_test_fresh(rng, na, 1), *B = lt_test_fresh(rng, nb, 1), *C = lt_test_fresh(rng, nc, 1);
    if (beta == 0)
        for (int64_t i = 0; i < nc; i++) C[i] = LT_TEST_POISON;
    float *dA = up(ctx, A, F4(na)), *dB = up(ctx, B, F4(nb)), *dC = up(ctx, C, F4(nc));
    float *got = malloc(F4(nc));
    gpu()->gemm(ctx, ta, tb, M, N, K, 0.75f, dA + pad, lda, dB + pad, ldb, beta, dC + pad, ldc);
    down(ctx, got, dC, F4(nc));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[pad + k * lda + i] : A[pad + i * lda + k];
                double b = tb ? B[pad + j * ldb + k] : B[pad + k * ldb + j];
                s += a * b;
                sa += fabs(a * b);
            }
            double c0 = beta == 0 ? 0 : C[pad + i * ldc + j];
            lt_test_close_to(got[pad + i * ldc + j], 0.75 * s + beta * c0, sa + fabs(c0), LT_TOL_F32_REL, "gemm",
                     i * N + j);
        }
    /* the padding between rows is never written */
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++) assert_memory_equal(&got[pad + i * ldc + j], &C[pad + i * ldc + j], 4);
    dfree(ctx, dA, F4(na)), dfree(ctx, dB, F4(nb)), dfree(ctx, dC, F4(nc));
    free(A), free(B), free(C), free(got);
}

static void gemm_f32_every_transpose(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(ctx, &rng, ta, tb, 37, 29, 53, 0, 0.5f);
            gemm_case(ctx, &rng, ta, tb, 37, 29, 53, 1, 0.0f);
            gemm_case(ctx, &rng, ta, tb, 8, 300, 1000, 0, 1.0f); /* LoRA-like: rank 8 */
        }
    /* the skinny LoRA products (ops_gemm_skinny.cu): rank 8 and 13 (the R = 16 kernels), K not a
     * multiple of the 128-float stride, M not of the rows a block takes; pad = 1 leaves them to
     * cuBLASLt (unaligned), pad = 4 keeps 16-byte alignment with padded leading dimensions */
    const int64_t ranks[2] = {8, 13};
    for (int ri = 0; ri < 2; ri++) {
        int64_t r = ranks[ri];
        for (int64_t pad = 0; pad <= 4; pad += 4) {
            gemm_case(ctx, &rng, 0, 1, 333, r, 1060, pad, 0.0f);  /* lu = x·Aᵀ */
            gemm_case(ctx, &rng, 0, 0, 333, r, 1060, pad, 0.5f);  /* dlu = dy·B */
            gemm_case(ctx, &rng, 1, 0, r, 300, 2100, pad, 1.0f);  /* dA += dluᵀ·x */
            gemm_case(ctx, &rng, 1, 0, 260, r, 2100, pad, 0.0f);  /* dB = dyᵀ·lu */
            gemm_case(ctx, &rng, 0, 1, 333, 300, r, pad, 1.0f);   /* y += lu·Bᵀ */
            gemm_case(ctx, &rng, 0, 0, 333, 300, r, pad, 0.0f);   /* dx = dlu·A */
        }
    }
    gemm_case(ctx, &rng, 0, 1, 100, 8, 1000, 1, 0.0f); /* unaligned: cuBLASLt */
    gemm_case(ctx, &rng, 0, 0, 5, 7, 0, 0, 0.5f); /* K = 0: C = beta·C */
    gemm_case(ctx, &rng, 0, 0, 5, 7, 0, 0, 0.0f);
    lt_ctx_free(ctx);
}

/* ---- weight matmul ---- */

/* W (out, in) of dtype dt built from random floats; wd gets the exact weights the op must use. */
static uint8_t *make_weight(uint64_t *rng, lt_dtype dt, int64_t out, int64_t in, float *wd) {
    size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    uint8_t *wq = malloc(rb * (size_t)out);
    float *wf = lt_test_fresh(rng, in, 0.5f);
    for (int64_t r = 0; r < out; r++) {
        lt_test_fill_normal(rng, wf, in, 0.5f);
        uint8_t *row = wq + rb * (size_t)r;
        if (dt == LT_DTYPE_F32) memcpy(row, wf, rb);
        else if (dt == LT_DTYPE_BF16)
            for (int64_t c = 0; c < in; c++) ((uint16_t *)row)[c] = lt_f32_to_bf16(wf[c]);
        else if (dt == LT_DTYPE_F16)
            for (int64_t c = 0; c < in; c++) ((uint16_t *)row)[c] = lt_f32_to_f16(wf[c]);
        else lt_quantize_row(dt, wf, row, in);
        lt_dequantize_row(dt, row, wd + r * in, in);
    }
    free(wf);
    return wq;
}

#define WS_GUARD 4096

static void matmul_case(lt_ctx *ctx, uint64_t *rng, lt_dtype dt, int64_t out, int64_t in, int64_t N, int mode,
                        float beta) {
    float *wd = malloc(F4(out * in));
    uint8_t *wq = make_weight(rng, dt, out, in, wd);
    size_t wbytes = (size_t)lt_dtype_row_bytes(dt, in) * (size_t)out;
    int64_t shape[2] = {out, in};
    lt_tensor w = lt_tensor_view(up(ctx, wq, wbytes), dt, LT_DEVICE_CUDA, 2, shape);
    size_t wsb = gpu()->matmul_workspace_bytes(dt, out, in, N, 1);
    /* guard bytes after the workspace catch a workspace size smaller than what the op uses */
    uint8_t *guard = malloc(wsb + WS_GUARD);
    memset(guard, 0xa5, wsb + WS_GUARD);
    uint8_t *ws = up(ctx, guard, wsb + WS_GUARD);
    int64_t xin = mode == LT_MATMUL_NT ? in : out, yout = mode == LT_MATMUL_NT ? out : in;
    float *x = lt_test_fresh(rng, N * xin, 1), *y0 = beta ? lt_test_fresh(rng, N * yout, 1) : lt_test_poisoned(N * yout);
    float *dx = up(ctx, x, F4(N * xin)), *dy = up(ctx, y0, F4(N * yout)), *y = malloc(F4(N * yout));
    gpu()->matmul(ctx, (lt_matmul_mode)mode, &w, dx, N, beta, dy, ws);
    down(ctx, y, dy, F4(N * yout));
    uint8_t *after = malloc(WS_GUARD);
    down(ctx, after, ws + wsb, WS_GUARD);
    for (int i = 0; i < WS_GUARD; i++) assert_int_equal(after[i], 0xa5);
    /* float64 reference on the exact inputs; the naive bf16 arm rounds x, W and y to bf16 */
    double *ref = malloc(sizeof(double) * (size_t)(N * yout)), *naive = malloc(sizeof(double) * (size_t)(N * yout));
    double *got = malloc(sizeof(double) * (size_t)(N * yout));
    float *xr = malloc(F4(N * xin)), *wr = malloc(F4(out * in)); /* bf16-rounded copies */
    for (int64_t i = 0; i < N * xin; i++) xr[i] = (float)lt_test_bf16_round(x[i]);
    for (int64_t i = 0; i < out * in; i++) wr[i] = (float)lt_test_bf16_round(wd[i]);
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < yout; j++) {
            double s = 0, sb = 0;
            for (int64_t k = 0; k < xin; k++) {
                int64_t wi = mode == LT_MATMUL_NT ? j * in + k : k * in + j;
                s += (double)x[n * xin + k] * wd[wi];
                sb += (double)xr[n * xin + k] * wr[wi];
            }
            double acc = beta ? y0[n * yout + j] : 0;
            ref[n * yout + j] = s + acc;
            naive[n * yout + j] = lt_test_bf16_round(lt_test_bf16_round(sb) + acc);
            got[n * yout + j] = y[n * yout + j];
        }
    double err = lt_test_rel_err_d(got, ref, N * yout), tol = fmax(2 * lt_test_rel_err_d(naive, ref, N * yout), TOL_BF16_FLOOR);
    fprintf(stderr, "  matmul %-8s %s out=%lld in=%lld N=%lld beta=%g: err %.3g (tol %.3g)\n", lt_dtype_name(dt),
            mode == LT_MATMUL_NT ? "NT" : "NN", (long long)out, (long long)in, (long long)N, (double)beta, err, tol);
    assert_true(err <= tol);
    dfree(ctx, w.data, wbytes), dfree(ctx, ws, wsb + WS_GUARD), dfree(ctx, dx, F4(N * xin)),
        dfree(ctx, dy, F4(N * yout));
    free(wd), free(wq), free(guard), free(x), free(y0), free(y), free(after), free(ref), free(naive), free(got), free(xr), free(wr);
}

static void matmul_every_weight_dtype(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 1;
    lt_ctx *ctx = lt_ctx_new();
    const lt_dtype types[] = {LT_DTYPE_F32, LT_DTYPE_BF16, LT_DTYPE_F16, LT_DTYPE_Q8_0,
                              LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (int mode = 0; mode < 2; mode++) matmul_case(ctx, &rng, types[ti], 150, 192, 70, mode, (ti + mode) % 2 ? 1.0f : 0.0f);
    /* two weight tiles (the second short): 16512 rows of 4096 > the 64M-element tile */
    matmul_case(ctx, &rng, LT_DTYPE_Q4_0, 16512, 4096, 3, LT_MATMUL_NT, 0.0f);
    matmul_case(ctx, &rng, LT_DTYPE_Q4_0, 16512, 4096, 3, LT_MATMUL_NN, 1.0f);
    /* one row (generation) */
    matmul_case(ctx, &rng, LT_DTYPE_Q4_1, 200, 256, 1, LT_MATMUL_NT, 0.0f);
    matmul_case(ctx, &rng, LT_DTYPE_BF16, 200, 256, 1, LT_MATMUL_NN, 1.0f);
    /* two chunks of x rows (8192 + 9) */
    matmul_case(ctx, &rng, LT_DTYPE_BF16, 96, 64, 8201, LT_MATMUL_NT, 1.0f);
    matmul_case(ctx, &rng, LT_DTYPE_Q8_0, 96, 64, 8201, LT_MATMUL_NN, 0.0f);
    lt_ctx_free(ctx);
}

/* ---- RMSNorm ---- */

static void rmsnorm_case(uint64_t seed, int64_t N, int64_t C) {
    uint64_t rng = seed;
    lt_ctx *ctx = lt_ctx_new();
    float eps = 1e-5f;
    float *x = lt_test_fresh(&rng, N * C, 1.5f), *w = lt_test_fresh(&rng, C, 1), *dy = lt_test_fresh(&rng, N * C, 1);
    float *dw0 = lt_test_fresh(&rng, C, 1);
    float *P = lt_test_poisoned(N * C);
    float *dxx = up(ctx, x, F4(N * C)), *dw_ = up(ctx, w, F4(C)), *ddy = up(ctx, dy, F4(N * C));
    float *dyo = up(ctx, P, F4(N * C)), *dr = up(ctx, P, F4(N)), *ddx = up(ctx, P, F4(N * C)), *ddw = up(ctx, dw0, F4(C));
    gpu()->rmsnorm_fwd(ctx, dxx, dw_, eps, N, C, dyo, dr);
    gpu()->rmsnorm_bwd(ctx, ddy, dxx, dw_, dr, N, C, ddx, ddw);
    float *y = malloc(F4(N * C)), *r = malloc(F4(N)), *gx = malloc(F4(N * C)), *gw = malloc(F4(C));
    down(ctx, y, dyo, F4(N * C)), down(ctx, r, dr, F4(N)), down(ctx, gx, ddx, F4(N * C)), down(ctx, gw, ddw, F4(C));
    for (int64_t n = 0; n < N; n++) {
        double ss = 0, dot = 0, dota = 0;
        for (int64_t c = 0; c < C; c++) {
            ss += (double)x[n * C + c] * x[n * C + c];
            dot += (double)w[c] * dy[n * C + c] * x[n * C + c];
            dota += fabs((double)w[c] * dy[n * C + c] * x[n * C + c]);
        }
        double rr = 1.0 / sqrt(ss / (double)C + eps);
        lt_test_close_to(r[n], rr, 0, LT_TOL_F32_REL, "rstd", n);
        for (int64_t c = 0; c < C; c++) {
            lt_test_close_to(y[n * C + c], w[c] * x[n * C + c] * rr, 0, LT_TOL_F32_REL, "rms y", n * C + c);
            double k = dot * rr * rr * rr / (double)C;
            double want = rr * w[c] * dy[n * C + c] - x[n * C + c] * k;
            double scale = fabs(rr * w[c] * dy[n * C + c]) + fabs(x[n * C + c] * dota * rr * rr * rr / (double)C);
            lt_test_close_to(gx[n * C + c], want, scale, LT_TOL_F32_REL, "rms dx", n * C + c);
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double s = dw0[c], sa = fabs(dw0[c]);
        for (int64_t n = 0; n < N; n++) {
            double t = (double)dy[n * C + c] * x[n * C + c] * r[n];
            s += t;
            sa += fabs(t);
        }
        lt_test_close_to(gw[c], s, sa, LT_TOL_F32_REL, "rms dw", c);
    }
    dfree(ctx, dxx, F4(N * C)), dfree(ctx, dw_, F4(C)), dfree(ctx, ddy, F4(N * C)), dfree(ctx, dyo, F4(N * C));
    dfree(ctx, dr, F4(N)), dfree(ctx, ddx, F4(N * C)), dfree(ctx, ddw, F4(C));
    free(x), free(w), free(dy), free(dw0), free(P), free(y), free(r), free(gx), free(gw);
    lt_ctx_free(ctx);
}

/* C = 1000 and 128 (the per-head norm) take the warp-per-row kernels (rows 16-byte aligned),
 * C = 998 the block-per-row ones; no C is a multiple of a block's threads. */
static void rmsnorm_forward_and_backward(void **state) {
    (void)state;
    rmsnorm_case(lt_test_seed() + 2, 70, 1000);
    rmsnorm_case(lt_test_seed() + 3, 70, 998);
    rmsnorm_case(lt_test_seed() + 4, 300, 128);
}

/* ---- RoPE ---- */

static void rope_long_context_angles(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 3;
    lt_ctx *ctx = lt_ctx_new();
    int64_t N = 37, Hh = 5, D = 128, n = N * Hh * D;
    float inv[64];
    for (int i = 0; i < 64; i++) inv[i] = (float)pow(1000000.0, -2.0 * i / 128.0);
    int32_t pos[37];
    for (int i = 0; i < N; i++) pos[i] = (int32_t)(lt_test_rand_u64(&rng) % 300000); /* angles up to 3e5 rad */
    float *x = lt_test_fresh(&rng, n, 1), *y = malloc(F4(n)), *yc = malloc(F4(n));
    float *dx = up(ctx, x, F4(n)), *dinv = up(ctx, inv, sizeof inv);
    int32_t *dpos = up(ctx, pos, sizeof pos);
    for (int inverse = 0; inverse < 2; inverse++) {
        assert_int_equal(gpu()->copy_to_device(ctx, dx, x, F4(n)), LT_OK);
        gpu()->rope(ctx, dx, dpos, dinv, N, Hh, D, inverse);
        down(ctx, y, dx, F4(n));
        memcpy(yc, x, F4(n));
        cpu()->rope(ctx, yc, pos, inv, N, Hh, D, inverse);
        double sg = inverse ? -1 : 1;
        for (int64_t t = 0; t < N; t++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t i = 0; i < D; i++) {
                    const float *v = x + (t * Hh + h) * D;
                    double ang = (double)((float)pos[t] * inv[i % 64]); /* fp32 angle, as transformers */
                    double c = cos(ang), s = sg * sin(ang);
                    double want = i < 64 ? v[i] * c - v[i + 64] * s : v[i] * c + v[i - 64] * s;
                    int64_t k = (t * Hh + h) * D + i;
                    lt_test_close_to(y[k], want, 1, LT_TOL_F32_REL, "rope", k);
                    lt_test_close_to(y[k], yc[k], 1, LT_TOL_F32_REL, "rope vs cpu", k);
                }
    }
    dfree(ctx, dx, F4(n)), dfree(ctx, dinv, sizeof inv), dfree(ctx, dpos, sizeof pos);
    free(x), free(y), free(yc);
    lt_ctx_free(ctx);
}

/* ---- SwiGLU ---- */

static double silu(double g) { return g / (1 + exp(-g)); }

static void swiglu_forward_and_backward(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 4;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 100003;
    float *g = lt_test_fresh(&rng, n, 3), *u = lt_test_fresh(&rng, n, 1), *da = lt_test_fresh(&rng, n, 1), *P = lt_test_poisoned(n);
    float *dg_ = up(ctx, g, F4(n)), *du_ = up(ctx, u, F4(n)), *dda = up(ctx, da, F4(n));
    float *oa = up(ctx, P, F4(n)), *odg = up(ctx, P, F4(n)), *odu = up(ctx, P, F4(n));
    gpu()->swiglu_fwd(ctx, dg_, du_, n, oa);
    gpu()->swiglu_bwd(ctx, dda, dg_, du_, n, odg, odu);
    float *a = malloc(F4(n)), *gg = malloc(F4(n)), *gu = malloc(F4(n));
    down(ctx, a, oa, F4(n)), down(ctx, gg, odg, F4(n)), down(ctx, gu, odu, F4(n));
    {   /* n % 4 == 0 takes the float4 kernel: the scalar one's values */
        const int64_t n4 = n - n % 4;
        float *o4 = up(ctx, P, F4(n)), *a4 = malloc(F4(n));
        gpu()->swiglu_fwd(ctx, dg_, du_, n4, o4);
        down(ctx, a4, o4, F4(n));
        for (int64_t i = 0; i < n4; i++) lt_test_close_to(a4[i], a[i], 0, LT_TOL_F32_REL, "swiglu float4", i);
        dfree(ctx, o4, F4(n));
        free(a4);
    }
    for (int64_t i = 0; i < n; i++) {
        double s = 1 / (1 + exp(-(double)g[i]));
        lt_test_close_to(a[i], silu(g[i]) * u[i], 0, LT_TOL_F32_REL, "swiglu", i);
        double want = (double)da[i] * u[i] * s * (1 + g[i] * (1 - s));
        double scale = fabs((double)da[i] * u[i] * s) * (1 + fabs(g[i] * (1 - s)));
        lt_test_close_to(gg[i], want, scale, LT_TOL_F32_REL, "swiglu dg", i);
        lt_test_close_to(gu[i], (double)da[i] * silu(g[i]), 0, LT_TOL_F32_REL, "swiglu du", i);
    }
    dfree(ctx, dg_, F4(n)), dfree(ctx, du_, F4(n)), dfree(ctx, dda, F4(n));
    dfree(ctx, oa, F4(n)), dfree(ctx, odg, F4(n)), dfree(ctx, odu, F4(n));
    free(g), free(u), free(da), free(P), free(a), free(gg), free(gu);
    lt_ctx_free(ctx);
}

/* ---- embedding, add, bias, scale ---- */

static void embedding_every_dtype_bit_identical(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 5;
    lt_ctx *ctx = lt_ctx_new();
    const lt_dtype types[] = {LT_DTYPE_F32, LT_DTYPE_BF16, LT_DTYPE_F16, LT_DTYPE_Q8_0,
                              LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    int64_t V = 300, C = 576, N = 41;
    int32_t ids[41];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
    ids[0] = 0, ids[1] = (int32_t)V - 1;
    int32_t *dids = up(ctx, ids, sizeof ids);
    float *P = lt_test_poisoned(N * C), *want = malloc(F4(N * C)), *got = malloc(F4(N * C));
    float *dout = up(ctx, P, F4(N * C));
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        lt_dtype dt = types[ti];
        float *wd = malloc(F4(V * C));
        uint8_t *tq = make_weight(&rng, dt, V, C, wd);
        size_t tb = (size_t)lt_dtype_row_bytes(dt, C) * (size_t)V;
        int64_t sh[2] = {V, C};
        lt_tensor ht = lt_tensor_view(tq, dt, LT_DEVICE_CPU, 2, sh);
        lt_tensor dt_ = lt_tensor_view(up(ctx, tq, tb), dt, LT_DEVICE_CUDA, 2, sh);
        assert_int_equal(gpu()->copy_to_device(ctx, dout, P, F4(N * C)), LT_OK);
        gpu()->embedding(ctx, &dt_, dids, N, dout);
        cpu()->embedding(ctx, &ht, ids, N, want);
        down(ctx, got, dout, F4(N * C));
        if (memcmp(got, want, F4(N * C))) {
            for (int64_t i = 0; i < N * C; i++)
                if (memcmp(&got[i], &want[i], 4))
                    fprintf(stderr, "embedding %s [%lld]: %.9g vs cpu %.9g\n", lt_dtype_name(dt), (long long)i,
                            (double)got[i], (double)want[i]);
            fail();
        }
        dfree(ctx, dt_.data, tb);
        free(wd), free(tq);
    }
    dfree(ctx, dids, sizeof ids), dfree(ctx, dout, F4(N * C));
    free(P), free(want), free(got);
    lt_ctx_free(ctx);
}

static void add_bias_scale(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 6;
    lt_ctx *ctx = lt_ctx_new();
    int64_t N = 67, C = 300, n = N * C;
    float *y = lt_test_fresh(&rng, n, 1), *x = lt_test_fresh(&rng, n, 1), *b = lt_test_fresh(&rng, C, 1), *got = malloc(F4(n));
    float *dy = up(ctx, y, F4(n)), *dx = up(ctx, x, F4(n)), *db = up(ctx, b, F4(C));
    gpu()->add_bias(ctx, dy, db, N, C);
    down(ctx, got, dy, F4(n));
    for (int64_t i = 0; i < n; i++) assert_true(got[i] == y[i] + b[i % C]); /* one rounded add */
    gpu()->add(ctx, dy, dx, -0.37f, n);
    down(ctx, got, dy, F4(n));
    for (int64_t i = 0; i < n; i++) {
        double yb = (double)(y[i] + b[i % C]);
        lt_test_close_to(got[i], yb - 0.37 * (double)x[i], fabs(0.37 * x[i]), 1e-7, "add", i);
    }
    float *before = malloc(F4(n));
    memcpy(before, got, F4(n));
    gpu()->scale(ctx, dy, 1.7f, n);
    down(ctx, got, dy, F4(n));
    for (int64_t i = 0; i < n; i++) assert_true(got[i] == before[i] * 1.7f);
    dfree(ctx, dy, F4(n)), dfree(ctx, dx, F4(n)), dfree(ctx, db, F4(C));
    free(y), free(x), free(b), free(got), free(before);
    lt_ctx_free(ctx);
}

/* ---- dropout ---- */

static void dropout_masks_identical_to_cpu(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 7;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 200003;
    float *x = lt_test_fresh(&rng, n, 1), *P = lt_test_poisoned(n), *got = malloc(F4(n)), *want = malloc(F4(n));
    float *dx = up(ctx, x, F4(n)), *dy = up(ctx, P, F4(n));
    const float ps[] = {0.3f, 0.05f, 0.0f};
    const uint64_t offs[] = {0, 1000, (uint64_t)1 << 40};
    for (int pi = 0; pi < 3; pi++)
        for (int oi = 0; oi < 3; oi++) {
            uint64_t seed = lt_test_rand_u64(&rng);
            gpu()->dropout(ctx, dx, dy, n, ps[pi], seed, offs[oi]);
            cpu()->dropout(ctx, x, want, n, ps[pi], seed, offs[oi]);
            down(ctx, got, dy, F4(n));
            assert_memory_equal(got, want, F4(n));
        }
    /* in place (y aliases x), as the backward runs it */
    uint64_t seed = lt_test_rand_u64(&rng);
    gpu()->dropout(ctx, dx, dx, n, 0.2f, seed, 77);
    cpu()->dropout(ctx, x, x, n, 0.2f, seed, 77);
    down(ctx, got, dx, F4(n));
    assert_memory_equal(got, x, F4(n));
    dfree(ctx, dx, F4(n)), dfree(ctx, dy, F4(n));
    free(x), free(P), free(got), free(want);
    lt_ctx_free(ctx);
}

/* ---- AdamW ---- */

static void adamw_matches_cpu(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 8;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 50003;
    float *p = lt_test_fresh(&rng, n, 1), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    float *dp = up(ctx, p, F4(n)), *dm = up(ctx, m, F4(n)), *dv = up(ctx, v, F4(n));
    float *gp = malloc(F4(n)), *gm = malloc(F4(n)), *gv = malloc(F4(n));
    lt_adamw_params hp = {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 0};
    for (int step = 1; step <= 5; step++) {
        float *g = lt_test_fresh(&rng, n, step == 3 ? 1e-3f : 1.0f);
        float *dg = up(ctx, g, F4(n));
        hp.step = step;
        gpu()->adamw(ctx, dp, dg, dm, dv, n, &hp);
        cpu()->adamw(ctx, p, g, m, v, n, &hp);
        down(ctx, gp, dp, F4(n)), down(ctx, gm, dm, F4(n)), down(ctx, gv, dv, F4(n));
        /* the update is at most ~lr·|m̂|/√v̂, so p is compared on the scale of 10·lr */
        int64_t exact = 0;
        for (int64_t i = 0; i < n; i++) {
            exact += gp[i] == p[i] && gm[i] == m[i] && gv[i] == v[i];
            ulps_close(gm[i], m[i], 0.1 * fabs(g[i]), "adamw m", i);
            ulps_close(gv[i], v[i], 1e-3 * g[i] * g[i], "adamw v", i);
            ulps_close(gp[i], p[i], 10 * hp.lr, "adamw p", i);
        }
        fprintf(stderr, "  adamw step %d: %lld of %lld parameters bit-identical to the CPU\n", step, (long long)exact,
                (long long)n);
        /* continue both from the CPU state so differences do not compound */
        assert_int_equal(gpu()->copy_to_device(ctx, dp, p, F4(n)), LT_OK);
        assert_int_equal(gpu()->copy_to_device(ctx, dm, m, F4(n)), LT_OK);
        assert_int_equal(gpu()->copy_to_device(ctx, dv, v, F4(n)), LT_OK);
        dfree(ctx, dg, F4(n));
        free(g);
    }
    dfree(ctx, dp, F4(n)), dfree(ctx, dm, F4(n)), dfree(ctx, dv, F4(n));
    free(p), free(m), free(v), free(gp), free(gm), free(gv);
    lt_ctx_free(ctx);
}

/* ---- zero, sumsq, copies ---- */

static void zero_sumsq_copies(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 9;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 1000003;
    float *x = lt_test_fresh(&rng, n, 2), *got = malloc(F4(n));
    float *dx = up(ctx, x, F4(n)), *dz = lt_alloc(ctx, LT_DEVICE_CUDA, F4(n), "copy");
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float s1 = gpu()->sumsq(ctx, dx, n), s2 = gpu()->sumsq(ctx, dx, n);
    lt_test_close_to(s1, ss, 0, 1e-7, "sumsq", 0);
    assert_true(s1 == s2); /* deterministic */
    lt_test_close_to(gpu()->sumsq(ctx, dx + 5, 1), (double)x[5] * x[5], 0, 1e-7, "sumsq 1", 0);
    assert_true(gpu()->sumsq(ctx, dx, 0) == 0.0f);
    /* device-to-device through copy_to_device, then zero an odd byte range of the copy */
    assert_int_equal(gpu()->copy_to_device(ctx, dz, dx, F4(n)), LT_OK);
    gpu()->zero(ctx, (uint8_t *)dz + 3, 4001);
    down(ctx, got, dz, F4(n));
    const uint8_t *b = (const uint8_t *)got, *b0 = (const uint8_t *)x;
    for (size_t i = 0; i < F4(n); i++) assert_int_equal(b[i], i >= 3 && i < 4004 ? 0 : b0[i]);
    assert_int_equal(gpu()->synchronize(ctx), LT_OK);
    dfree(ctx, dx, F4(n)), dfree(ctx, dz, F4(n));
    free(x), free(got);
    lt_ctx_free(ctx);
}

/* bf16 storage conversions: bit-identical to the CPU ops (round to nearest even, ties, overflow
 * to infinity and NaN included), and widening back exactly. */
static void bf16_conversions_match_cpu(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 10;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 1000003;
    float *x = lt_test_fresh(&rng, n, 3), *back = malloc(F4(n)), *want = malloc(F4(n));
    uint16_t *h = malloc((size_t)n * 2), *hc = malloc((size_t)n * 2);
    const uint32_t special[6] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u};
    for (int i = 0; i < 6; i++) memcpy(&x[i], &special[i], 4);
    float *dx = up(ctx, x, F4(n)), *db = lt_alloc(ctx, LT_DEVICE_CUDA, F4(n), "back");
    uint16_t *dh = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)n * 2, "bf16");
    assert_true(db && dh);
    gpu()->to_bf16(ctx, dx, dh, n);
    down(ctx, h, dh, (size_t)n * 2);
    cpu()->to_bf16(ctx, x, hc, n);
    for (int64_t i = 6; i < n; i++) assert_int_equal(h[i], hc[i]);
    for (int i = 0; i < 5; i++) assert_int_equal(h[i], hc[i]);
    assert_true((h[5] & 0x7f80) == 0x7f80 && (h[5] & 0x7f)); /* a NaN stays a NaN */
    gpu()->from_bf16(ctx, dh, db, n);
    down(ctx, back, db, F4(n));
    cpu()->from_bf16(ctx, h, want, n);
    assert_memory_equal(back, want, F4(n));
    dfree(ctx, dx, F4(n)), dfree(ctx, db, F4(n));
    lt_free(ctx, LT_DEVICE_CUDA, dh, (size_t)n * 2);
    free(x), free(back), free(want), free(h), free(hc);
    lt_ctx_free(ctx);
}

/* ---- f32 attention and linear cross-entropy ---- */

static void round_bf16(const float *x, float *xf, uint16_t *xb, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        xb[i] = lt_f32_to_bf16(x[i]);
        xf[i] = lt_bf16_to_f32(xb[i]);
    }
}

static void bf16_to_f32_n(const uint16_t *b, float *f, int64_t n) {
    for (int64_t i = 0; i < n; i++) f[i] = lt_bf16_to_f32(b[i]);
}

static double rel_err_ff(const float *x, const float *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)x[i] - ref[i]));
        r = fmax(r, fabs((double)ref[i]));
    }
    return r > 0 ? e / r : e;
}

/* Gross bound against the CPU f32 result: the f32 path's accuracy is the bf16 kernels' (tested
 * with dtype-derived tolerances elsewhere); this catches layout, stride and conversion mistakes,
 * which give errors of order 1. */
#define TOL_F32_PATH_VS_CPU 0x1.0p-4

/* q, k, v fused in one (B, T, H + 2·Hkv, D) buffer (strided layouts), packed rows in batch 0. */
static void attention_case(lt_ctx *ctx, uint64_t *rng, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                           int64_t window, int packed) {
    const int64_t W3 = H + 2 * Hkv, nf = B * T * W3 * D, no = B * T * H * D, nl = B * H * T;
    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = B, p.T = T, p.H = H, p.Hkv = Hkv, p.D = D, p.window = window, p.device = LT_DEVICE_CUDA;
    p.q_layout = (lt_attention_layout){T * W3 * D, W3 * D, D};
    p.kv_layout = p.q_layout;
    int32_t off[2 * 4];
    if (packed) {
        for (int64_t b = 0; b < B; b++) {
            off[b * 4] = 0, off[b * 4 + 3] = (int32_t)T;
            off[b * 4 + 1] = b ? 0 : (int32_t)(T / 3); /* row 1: an empty first sequence */
            off[b * 4 + 2] = (int32_t)(T / 3 + T / 4);
        }
        p.seq_offsets = off, p.S = 3;
    }
    float *qkv = lt_test_fresh(rng, nf, 1), *g = lt_test_fresh(rng, no, 1), *P = lt_test_poisoned(nf);
    float *rq = malloc(F4(nf)), *rg = malloc(F4(no)); /* rounded values (the bf16 arm's inputs) */
    uint16_t *bq = malloc((size_t)nf * 2), *bg = malloc((size_t)no * 2);
    round_bf16(qkv, rq, bq, nf);
    round_bf16(g, rg, bg, no);
    /* f32 on the device */
    float *d_qkv = up(ctx, qkv, F4(nf)), *d_g = up(ctx, g, F4(no)), *d_o = up(ctx, P, F4(no));
    float *d_lse = up(ctx, P, F4(nl)), *d_dqkv = up(ctx, P, F4(nf));
    lt_attention_args a = {d_qkv, d_qkv + H * D, d_qkv + (H + Hkv) * D, d_o, d_lse, d_g,
                           d_dqkv, d_dqkv + H * D, d_dqkv + (H + Hkv) * D, NULL, 0};
    p.dtype = LT_DTYPE_F32;
    assert_int_equal(lt_attention_forward(ctx, &p, &a), LT_OK);
    assert_int_equal(lt_attention_backward(ctx, &p, &a), LT_OK);
    float *o32 = malloc(F4(no)), *lse32 = malloc(F4(nl)), *dqkv32 = malloc(F4(nf));
    down(ctx, o32, d_o, F4(no)), down(ctx, lse32, d_lse, F4(nl)), down(ctx, dqkv32, d_dqkv, F4(nf));
    /* bf16 on the device, same (rounded) values */
    uint16_t *d_bq = up(ctx, bq, (size_t)nf * 2), *d_bg = up(ctx, bg, (size_t)no * 2);
    uint16_t *d_bo = up(ctx, P, (size_t)no * 2), *d_bd = up(ctx, P, (size_t)nf * 2);
    lt_attention_args ab = {d_bq, d_bq + H * D, d_bq + (H + Hkv) * D, d_bo, d_lse, d_bg,
                            d_bd, d_bd + H * D, d_bd + (H + Hkv) * D, NULL, 0};
    p.dtype = LT_DTYPE_BF16;
    assert_int_equal(lt_attention_forward(ctx, &p, &ab), LT_OK);
    assert_int_equal(lt_attention_backward(ctx, &p, &ab), LT_OK);
    uint16_t *ob = malloc((size_t)no * 2), *db = malloc((size_t)nf * 2);
    float *o16 = malloc(F4(no)), *lse16 = malloc(F4(nl)), *d16 = malloc(F4(nf));
    down(ctx, ob, d_bo, (size_t)no * 2), down(ctx, lse16, d_lse, F4(nl)), down(ctx, db, d_bd, (size_t)nf * 2);
    bf16_to_f32_n(ob, o16, no);
    bf16_to_f32_n(db, d16, nf);
    /* the forward is deterministic: identical; the backward's fp32 dQ sums may be ordered
     * differently between launches, so one bf16 rounding step apart at most */
    assert_memory_equal(o32, o16, F4(no));
    assert_memory_equal(lse32, lse16, F4(nl));
    double e_same = rel_err_ff(dqkv32, d16, nf);
    assert_true(e_same <= TOL_BF16_FLOOR);
    /* the CPU in f32 on the original inputs */
    lt_attention_params pc = p;
    pc.device = LT_DEVICE_CPU, pc.dtype = LT_DTYPE_F32;
    float *co = malloc(F4(no)), *clse = malloc(F4(nl)), *cd = malloc(F4(nf));
    memcpy(cd, P, F4(nf));
    lt_attention_args ac = {qkv, qkv + H * D, qkv + (H + Hkv) * D, co, clse, g, cd, cd + H * D, cd + (H + Hkv) * D,
                            NULL, 0};
    assert_int_equal(lt_attention_forward(ctx, &pc, &ac), LT_OK);
    assert_int_equal(lt_attention_backward(ctx, &pc, &ac), LT_OK);
    double eo = rel_err_ff(o32, co, no), el = rel_err_ff(lse32, clse, nl), ed = rel_err_ff(dqkv32, cd, nf);
    fprintf(stderr, "  attention f32 T=%lld D=%lld H=%lld/%lld win=%lld packed=%d: vs bf16 path dqkv %.3g; vs cpu "
            "out %.3g lse %.3g dqkv %.3g\n", (long long)T, (long long)D, (long long)H, (long long)Hkv,
            (long long)window, packed, e_same, eo, el, ed);
    assert_true(eo <= TOL_F32_PATH_VS_CPU && el <= TOL_F32_PATH_VS_CPU && ed <= TOL_F32_PATH_VS_CPU);
    /* the workspace the boundary allocated was counted exactly: nothing is left allocated */
    dfree(ctx, d_qkv, F4(nf)), dfree(ctx, d_g, F4(no)), dfree(ctx, d_o, F4(no)), dfree(ctx, d_lse, F4(nl));
    dfree(ctx, d_dqkv, F4(nf)), dfree(ctx, d_bq, (size_t)nf * 2), dfree(ctx, d_bg, (size_t)no * 2);
    dfree(ctx, d_bo, (size_t)no * 2), dfree(ctx, d_bd, (size_t)nf * 2);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    free(qkv), free(g), free(P), free(rq), free(rg), free(bq), free(bg), free(o32), free(lse32), free(dqkv32);
    free(ob), free(db), free(o16), free(lse16), free(d16), free(co), free(clse), free(cd);
}

static void attention_f32_on_device(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 10;
    lt_ctx *ctx = lt_ctx_new();
    attention_case(ctx, &rng, 2, 77, 4, 2, 64, 0, 1);
    attention_case(ctx, &rng, 1, 130, 4, 4, 128, 50, 0);
    lt_ctx_free(ctx);
}

static void lce_f32_on_device(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 11;
    lt_ctx *ctx = lt_ctx_new();
    const int64_t N = 61, C = 128, V = 1000;
    float *h = lt_test_fresh(&rng, N * C, 1), *wf = lt_test_fresh(&rng, V * C, 0.05f), *rh = malloc(F4(N * C));
    uint16_t *hb = malloc((size_t)(N * C) * 2), *wb = malloc((size_t)(V * C) * 2);
    float *wr = malloc(F4(V * C));
    round_bf16(h, rh, hb, N * C);
    round_bf16(wf, wr, wb, V * C); /* the head is bf16 on the device; the CPU gets the same values */
    int32_t tgt[61];
    for (int i = 0; i < N; i++) tgt[i] = i % 7 == 3 ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
    float one = 1.0f, P1 = LT_TEST_POISON;
    float *Pn = lt_test_poisoned(N * C);
    float *d_h = up(ctx, h, F4(N * C)), *d_dh = up(ctx, Pn, F4(N * C)), *d_lse = up(ctx, Pn, F4(N));
    float *d_loss = up(ctx, &P1, 4), *d_dl = up(ctx, &one, 4);
    uint16_t *d_hb = up(ctx, hb, (size_t)(N * C) * 2), *d_w = up(ctx, wb, (size_t)(V * C) * 2);
    int32_t *d_t = up(ctx, tgt, sizeof tgt);
    int64_t hs[2] = {N, C}, wsh[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(d_dh, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, hs);
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(d_h, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(d_w, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, wsh);
    a.targets = d_t, a.loss = d_loss, a.lse = d_lse, a.dloss = d_dl, a.dh = &tdh;
    lt_lce_options opt;
    memset(&opt, 0, sizeof opt);
    /* with a caller workspace of exactly the reported size, then with none */
    size_t wsb = lt_lce_workspace_bytes(&opt, &a, 1, 0), wsf = lt_lce_workspace_bytes(&opt, &a, 0, 0);
    if (wsf > wsb) wsb = wsf;
    assert_true(wsb >= (size_t)(N * C) * 2);
    void *ws = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "lce ws");
    a.workspace = ws;
    assert_int_equal(lt_lce_forward(ctx, &opt, &a), LT_OK);
    assert_int_equal(lt_lce_backward(ctx, &opt, &a), LT_OK);
    float loss32, *lse32 = malloc(F4(N)), *dh32 = malloc(F4(N * C));
    down(ctx, &loss32, d_loss, 4), down(ctx, lse32, d_lse, F4(N)), down(ctx, dh32, d_dh, F4(N * C));
    a.workspace = NULL;
    assert_int_equal(gpu()->copy_to_device(ctx, d_dh, Pn, F4(N * C)), LT_OK);
    assert_int_equal(lt_lce_forward(ctx, &opt, &a), LT_OK);
    assert_int_equal(lt_lce_backward(ctx, &opt, &a), LT_OK);
    float loss32b, *dh32b = malloc(F4(N * C));
    down(ctx, &loss32b, d_loss, 4), down(ctx, dh32b, d_dh, F4(N * C));
    assert_true(loss32 == loss32b);
    assert_memory_equal(dh32, dh32b, F4(N * C));
    /* the bf16 h path on the rounded values gives the same numbers */
    a.h = lt_tensor_view(d_hb, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    assert_int_equal(gpu()->copy_to_device(ctx, d_dh, Pn, F4(N * C)), LT_OK);
    assert_int_equal(lt_lce_forward(ctx, &opt, &a), LT_OK);
    assert_int_equal(lt_lce_backward(ctx, &opt, &a), LT_OK);
    float loss16, *lse16 = malloc(F4(N)), *dh16 = malloc(F4(N * C));
    down(ctx, &loss16, d_loss, 4), down(ctx, lse16, d_lse, F4(N)), down(ctx, dh16, d_dh, F4(N * C));
    assert_true(loss32 == loss16);
    assert_memory_equal(lse32, lse16, F4(N));
    assert_memory_equal(dh32, dh16, F4(N * C));
    /* the one-call forward_backward with f32 h, sized by its own pass: the two-call results within
     * bf16 rounding (its fused path rescales a grad-hidden accumulator instead of re-making logits) */
    a.h = lt_tensor_view(d_h, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, hs);
    size_t wfb = lt_lce_workspace_bytes(&opt, &a, LT_LCE_PASS_FORWARD_BACKWARD, 0);
    assert_true(wfb >= (size_t)(N * C) * 2);
    void *wsfb = lt_alloc(ctx, LT_DEVICE_CUDA, wfb, "lce fb ws");
    a.workspace = wsfb;
    assert_int_equal(gpu()->copy_to_device(ctx, d_dh, Pn, F4(N * C)), LT_OK);
    assert_int_equal(lt_lce_forward_backward(ctx, &opt, &a), LT_OK);
    float lossfb, *dhfb = malloc(F4(N * C));
    down(ctx, &lossfb, d_loss, 4), down(ctx, dhfb, d_dh, F4(N * C));
    double efl = fabs((double)lossfb - loss32) / fabs((double)loss32), efd = rel_err_ff(dhfb, dh32, N * C);
    fprintf(stderr, "  lce f32 h forward_backward vs two calls: loss %.3g dh %.3g\n", efl, efd);
    assert_true(efl <= TOL_BF16_FLOOR && efd <= TOL_BF16_FLOOR);
    a.workspace = NULL;
    lt_free(ctx, LT_DEVICE_CUDA, wsfb, wfb);
    free(dhfb);
    /* the CPU in f32 on the original h and the same head values */
    lt_lce_args c = a;
    float closs, *clse = malloc(F4(N)), *cdh = malloc(F4(N * C));
    lt_tensor tcdh = lt_tensor_view(cdh, LT_DTYPE_F32, LT_DEVICE_CPU, 2, hs);
    c.h = lt_tensor_view(h, LT_DTYPE_F32, LT_DEVICE_CPU, 2, hs);
    c.w = lt_tensor_view(wr, LT_DTYPE_F32, LT_DEVICE_CPU, 2, wsh);
    c.targets = tgt, c.loss = &closs, c.lse = clse, c.dloss = &one, c.dh = &tcdh, c.workspace = NULL;
    assert_int_equal(lt_lce_forward(ctx, &opt, &c), LT_OK);
    assert_int_equal(lt_lce_backward(ctx, &opt, &c), LT_OK);
    /* lse of ignored tokens is left out: only the kept tokens' values are compared here (what each
     * backend stores for ignored rows is test_cuda_lce's business) */
    for (int64_t i = 0; i < N; i++)
        if (tgt[i] == LT_IGNORE_INDEX) lse32[i] = clse[i] = 0;
    double el = fabs((double)loss32 - closs) / fabs((double)closs), ee = rel_err_ff(lse32, clse, N),
           ed = rel_err_ff(dh32, cdh, N * C);
    fprintf(stderr, "  lce f32 h N=%lld C=%lld V=%lld vs cpu: loss %.3g lse %.3g dh %.3g\n", (long long)N,
            (long long)C, (long long)V, el, ee, ed);
    assert_true(el <= TOL_F32_PATH_VS_CPU && ee <= TOL_F32_PATH_VS_CPU && ed <= TOL_F32_PATH_VS_CPU);
    lt_free(ctx, LT_DEVICE_CUDA, ws, wsb);
    dfree(ctx, d_h, F4(N * C)), dfree(ctx, d_dh, F4(N * C)), dfree(ctx, d_lse, F4(N)), dfree(ctx, d_loss, 4);
    dfree(ctx, d_dl, 4), dfree(ctx, d_hb, (size_t)(N * C) * 2), dfree(ctx, d_w, (size_t)(V * C) * 2);
    dfree(ctx, d_t, sizeof tgt);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    free(h), free(wf), free(rh), free(hb), free(wb), free(wr), free(Pn), free(lse32), free(dh32), free(dh32b);
    free(lse16), free(dh16), free(clse), free(cdh);
    lt_ctx_free(ctx);
}

/* ---- op profiler ---- */

/* The profiled table computes the plain table's bits; events bracket each op, the matmul's x
 * conversion is a nested record taken out of the matmul's own time, and phases cover their ops. */
static void profiler_times_device_ops(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 20;
    lt_ctx *ctx = lt_ctx_new();
    lt_prof_enable(1);
    const lt_backend *pb = lt_backend_profiled(&lt_backend_cuda);
    assert_ptr_not_equal(pb, &lt_backend_cuda);
    int64_t out = 256, in = 384, N = 1000;
    float *wd = malloc(F4(out * in));
    uint8_t *wq = make_weight(&rng, LT_DTYPE_BF16, out, in, wd);
    int64_t shape[2] = {out, in};
    lt_tensor w = lt_tensor_view(up(ctx, wq, (size_t)(out * in) * 2), LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, shape);
    size_t wsb = pb->matmul_workspace_bytes(LT_DTYPE_BF16, out, in, N, 1);
    void *ws = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "test workspace");
    float *x = lt_test_fresh(&rng, N * in, 1), *y1 = malloc(F4(N * out)), *y2 = malloc(F4(N * out));
    float *dx = up(ctx, x, F4(N * in)), *dy = lt_alloc(ctx, LT_DEVICE_CUDA, F4(N * out), "test y");
    lt_prof_totals t;
    memset(&t, 0, sizeof t);
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CUDA, &t), LT_OK);
    memset(&t, 0, sizeof t);
    lt_prof_set_phase(LT_DEVICE_CUDA, LT_PROF_FORWARD);
    pb->matmul(ctx, LT_MATMUL_NT, &w, dx, N, 0.0f, dy, ws);
    pb->scale(ctx, dy, 0.5f, N * out);
    down(ctx, y1, dy, F4(N * out));
    lt_prof_set_phase(LT_DEVICE_CUDA, LT_PROF_BACKWARD);
    pb->rmsnorm_fwd(ctx, dx, dx, 1e-5f, N, in, dx, dy); /* any work: timed, not checked */
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CUDA, &t), LT_OK);
    lt_prof_enable(0);
    assert_int_equal(lt_backend_cuda.copy_to_device(ctx, dx, x, F4(N * in)), LT_OK);
    lt_backend_cuda.matmul(ctx, LT_MATMUL_NT, &w, dx, N, 0.0f, dy, ws);
    lt_backend_cuda.scale(ctx, dy, 0.5f, N * out);
    down(ctx, y2, dy, F4(N * out));
    assert_memory_equal(y1, y2, F4(N * out));
    assert_int_equal(t.steps, 1);
    assert_int_equal(t.dropped, 0);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_MATMUL], 1);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_MATMUL_CVT], 1);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_SCALE], 1);
    assert_int_equal(t.calls[LT_PROF_FORWARD][LT_PROF_COPY], 1);
    assert_int_equal(t.calls[LT_PROF_BACKWARD][LT_PROF_RMSNORM_FWD], 1);
    assert_true(t.op_ms[LT_PROF_FORWARD][LT_PROF_MATMUL] > 0);
    assert_true(t.op_ms[LT_PROF_FORWARD][LT_PROF_MATMUL_CVT] > 0);
    double ops = 0;
    for (int k = 0; k < LT_PROF_OP_COUNT_; k++) ops += t.op_ms[LT_PROF_FORWARD][k];
    assert_true(t.phase_ms[LT_PROF_FORWARD] >= ops * 0.999);
    fprintf(stderr, "  profiler: matmul %.3f ms (x to bf16 %.3f ms), forward phase %.3f ms\n",
            t.op_ms[LT_PROF_FORWARD][LT_PROF_MATMUL], t.op_ms[LT_PROF_FORWARD][LT_PROF_MATMUL_CVT],
            t.phase_ms[LT_PROF_FORWARD]);
    dfree(ctx, w.data, (size_t)(out * in) * 2), dfree(ctx, ws, wsb), dfree(ctx, dx, F4(N * in)), dfree(ctx, dy, F4(N * out));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    free(wd), free(wq), free(x), free(y1), free(y2);
    lt_ctx_free(ctx);
}

/* NT_SAME_X after an NT on the same x gives the bits of a plain NT, without converting x again
 * (the profiler counts the conversions); with x changed in between, the caller broke the
 * contract, so only the pointer case is checked: a different x pointer is converted afresh. */
static void matmul_same_x_reuses_conversion(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 21;
    lt_ctx *ctx = lt_ctx_new();
    int64_t in = 384, o1 = 256, o2 = 128, N = 1000;
    float *wd = malloc(F4(o1 * in));
    uint8_t *w1q = make_weight(&rng, LT_DTYPE_BF16, o1, in, wd), *w2q = make_weight(&rng, LT_DTYPE_BF16, o2, in, wd);
    int64_t s1[2] = {o1, in}, s2[2] = {o2, in};
    lt_tensor w1 = lt_tensor_view(up(ctx, w1q, (size_t)(o1 * in) * 2), LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, s1);
    lt_tensor w2 = lt_tensor_view(up(ctx, w2q, (size_t)(o2 * in) * 2), LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, s2);
    size_t wsb = lt_backend_cuda.matmul_workspace_bytes(LT_DTYPE_BF16, o1, in, N, 1);
    void *ws = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "test workspace");
    float *x = lt_test_fresh(&rng, N * in, 1), *x2 = lt_test_fresh(&rng, N * in, 1);
    float *dx = up(ctx, x, F4(N * in)), *dx2 = up(ctx, x2, F4(N * in));
    float *dy1 = lt_alloc(ctx, LT_DEVICE_CUDA, F4(N * o1), "y1"), *dy2 = lt_alloc(ctx, LT_DEVICE_CUDA, F4(N * o2), "y2");
    float *want = malloc(F4(N * o2)), *got = malloc(F4(N * o2)), *want2 = malloc(F4(N * o2));
    lt_backend_cuda.matmul(ctx, LT_MATMUL_NT, &w2, dx, N, 0.0f, dy2, ws);
    down(ctx, want, dy2, F4(N * o2));
    lt_backend_cuda.matmul(ctx, LT_MATMUL_NT, &w2, dx2, N, 0.0f, dy2, ws);
    down(ctx, want2, dy2, F4(N * o2));
    lt_prof_enable(1);
    const lt_backend *pb = lt_backend_profiled(&lt_backend_cuda);
    lt_prof_totals t;
    memset(&t, 0, sizeof t);
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CUDA, &t), LT_OK);
    memset(&t, 0, sizeof t);
    pb->matmul(ctx, LT_MATMUL_NT, &w1, dx, N, 0.0f, dy1, ws);
    pb->matmul(ctx, LT_MATMUL_NT_SAME_X, &w2, dx, N, 0.0f, dy2, ws);
    assert_int_equal(lt_prof_collect(ctx, LT_DEVICE_CUDA, &t), LT_OK);
    lt_prof_enable(0);
    down(ctx, got, dy2, F4(N * o2));
    assert_memory_equal(got, want, F4(N * o2));
    assert_int_equal(t.calls[LT_PROF_OTHER][LT_PROF_MATMUL], 2);
    assert_int_equal(t.calls[LT_PROF_OTHER][LT_PROF_MATMUL_CVT], 1);
    /* another x under the flag: converted, not reused */
    lt_backend_cuda.matmul(ctx, LT_MATMUL_NT_SAME_X, &w2, dx2, N, 0.0f, dy2, ws);
    down(ctx, got, dy2, F4(N * o2));
    assert_memory_equal(got, want2, F4(N * o2));
    dfree(ctx, w1.data, (size_t)(o1 * in) * 2), dfree(ctx, w2.data, (size_t)(o2 * in) * 2), dfree(ctx, ws, wsb);
    dfree(ctx, dx, F4(N * in)), dfree(ctx, dx2, F4(N * in)), dfree(ctx, dy1, F4(N * o1)), dfree(ctx, dy2, F4(N * o2));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    free(wd), free(w1q), free(w2q), free(x), free(x2), free(want), free(got), free(want2);
    lt_ctx_free(ctx);
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemm_f32_every_transpose),
        cmocka_unit_test(matmul_every_weight_dtype),
        cmocka_unit_test(rmsnorm_forward_and_backward),
        cmocka_unit_test(rope_long_context_angles),
        cmocka_unit_test(swiglu_forward_and_backward),
        cmocka_unit_test(embedding_every_dtype_bit_identical),
        cmocka_unit_test(add_bias_scale),
        cmocka_unit_test(dropout_masks_identical_to_cpu),
        cmocka_unit_test(adamw_matches_cpu),
        cmocka_unit_test(zero_sumsq_copies),
        cmocka_unit_test(bf16_conversions_match_cpu),
        cmocka_unit_test(attention_f32_on_device),
        cmocka_unit_test(lce_f32_on_device),
        cmocka_unit_test(profiler_times_device_ops),
        cmocka_unit_test(matmul_same_x_reuses_conversion),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) { return lt_test_cuda_skip(); }
#endif
