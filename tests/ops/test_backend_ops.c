/* The op x backend matrix: one table of cases (op, shapes, dtypes, options), each run on every
 * backend in the build (the CPU always; CUDA when built and a device is present, else the CUDA
 * column reports "skipped: no CUDA device") against a float64 reference computed here on the host,
 * with the tolerance of one rule (lt_test_tol_for, tests/helpers/backends.c: from the input dtype the
 * backend computes the op in and the op's reduction length). Inputs are fresh random (seeded, printed), outputs start poisoned, and
 * every backward is checked against the analytic float64 gradient, which is itself checked against
 * central finite differences of the float64 forward. Attention and the fused loss go through their
 * public entry points (lt_attention_*, lt_lce_*). Adding an op, or a shape of one, is one row. */
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
#include "core/ctx_state.h"
#include "helpers/backends.h"
#include "helpers/lora_check.h"
#include "helpers/ref_ops.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/lce.h"
#include "longtune/sysinfo.h"
#include "longtune/tensor.h"

/* ---- the dtype rule ---- */

#define U_F32 0x1.0p-24 /* unit roundoff of f32 */

/* The dtype a backend reads an op's inputs in: the CPU reference computes in f32 throughout; the
 * CUDA backend's weight products, LoRA products, attention and loss read their inputs in bf16
 * (fp32 accumulate). Its gemm and elementwise ops are f32. */
typedef enum op_precision { PREC_F32 = 0, PREC_INPUTS } op_precision;

static lt_dtype input_dtype(const lt_backend *be, op_precision p) {
    return p == PREC_INPUTS && be->device == LT_DEVICE_CUDA ? LT_DTYPE_BF16 : LT_DTYPE_F32;
}

/* |got - want| <= tol·(|want| + scale) + LT_TOL_F32_ABS, else a message naming what[i]; returns 1
 * on a failure (counted, the case goes on so every bad element class is printed once). */
static int bad(double got, double want, double scale, double tol, const char *what, int64_t i) {
    if (fabs(got - want) <= tol * (fabs(want) + scale) + LT_TOL_F32_ABS) return 0;
    fprintf(stderr, "    %s[%lld]: got %.9g want %.9g (tol %.3g)\n", what, (long long)i, got, want, tol);
    return 1;
}

/* ---- one backend's memory ---- */

typedef struct env {
    const lt_backend *be;
    lt_ctx *ctx;
    uint64_t rng;
    int64_t failures;
} env;

static void *up(env *e, const void *h, size_t bytes) {
    void *d = lt_alloc(e->ctx, e->be->device, bytes ? bytes : 1, "op test buffer");
    assert_non_null(d);
    if (h && bytes) assert_int_equal(e->be->copy_to_device(e->ctx, d, h, bytes), LT_OK);
    return d;
}
static void down(env *e, void *h, const void *d, size_t bytes) {
    assert_int_equal(e->be->copy_to_host(e->ctx, h, d, bytes), LT_OK);
}
static void dfree(env *e, void *d, size_t bytes) { lt_free(e->ctx, e->be->device, d, bytes ? bytes : 1); }
#define F4(n) ((size_t)(n) * sizeof(float))
#define CHECK(e, x) ((e)->failures += (x) ? 1 : 0)

/* ---- the table ---- */

typedef struct op_case op_case;
struct op_case {
    const char *op;
    void (*run)(const op_case *c, env *e);
    int64_t s[4]; /* shapes, per op (named in each run function) */
    lt_dtype dt;  /* the weight / table / head dtype, where the op has one */
    int opt;      /* per-op options (bits named in each run function) */
};

/* ---- gemm: s = {M, N, K, pad}; every transpose combination, each with beta = 0 (C poisoned:
 * overwritten, never scaled) and beta = opt / 2 when opt > 0 ---- */

static void gemm_one(const op_case *c, env *e, int ta, int tb, float beta) {
    const int64_t M = c->s[0], N = c->s[1], K = c->s[2], pad = c->s[3];
    /* operands start `pad` floats into their buffers and rows are `pad` longer than needed */
    const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    int64_t na = (ta ? K : M) * lda + pad, nb = (tb ? N : K) * ldb + pad, nc = M * ldc + pad;
    if (na < 1) na = 1;
    if (nb < 1) nb = 1;
    float *A = lt_test_fresh(&e->rng, na, 1), *B = lt_test_fresh(&e->rng, nb, 1), *C = lt_test_fresh(&e->rng, nc, 1);
    if (beta == 0)
        for (int64_t i = 0; i < nc; i++) C[i] = NAN; /* must be overwritten, not scaled */
    float *dA = up(e, A, F4(na)), *dB = up(e, B, F4(nb)), *dC = up(e, C, F4(nc)), *got = malloc(F4(nc));
    e->be->gemm(e->ctx, ta, tb, M, N, K, 0.75f, dA + pad, lda, dB + pad, ldb, beta, dC + pad, ldc);
    down(e, got, dC, F4(nc));
    const double tol = lt_test_tol_for(LT_DTYPE_F32, K);
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[pad + k * lda + i] : A[pad + i * lda + k];
                double b = tb ? B[pad + j * ldb + k] : B[pad + k * ldb + j];
                s += a * b, sa += fabs(a * b);
            }
            double c0 = beta == 0 ? 0 : C[pad + i * ldc + j];
            CHECK(e, bad(got[pad + i * ldc + j], 0.75 * s + beta * c0, sa + fabs(c0), tol, "gemm", i * N + j));
        }
        for (int64_t j = N; j < ldc; j++) /* the padding between rows is never written */
            CHECK(e, memcmp(&got[pad + i * ldc + j], &C[pad + i * ldc + j], 4) != 0);
    }
    dfree(e, dA, F4(na)), dfree(e, dB, F4(nb)), dfree(e, dC, F4(nc));
    free(A), free(B), free(C), free(got);
}

static void run_gemm(const op_case *c, env *e) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_one(c, e, ta, tb, 0.0f);
            if (c->opt > 0) gemm_one(c, e, ta, tb, (float)c->opt * 0.5f);
        }
}

/* ---- weight products ---- */

/* W (out, in) of dtype dt from fresh floats; wd gets the exact weights the op must use. */
static uint8_t *make_weight(uint64_t *rng, lt_dtype dt, int64_t out, int64_t in, float *wd) {
    size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    uint8_t *wq = malloc(rb * (size_t)out);
    if (dt == LT_DTYPE_FP8) { /* the whole matrix packed; wd = q·scale */
        float *w = malloc(F4(out * in));
        lt_test_fill_normal(rng, w, out * in, 0.5f);
        lt_fp8_pack(w, out, in, wq);
        const float *scale = lt_fp8_scales(wq, out, in);
        for (int64_t i = 0; i < out * in; i++) wd[i] = lt_fp8_to_f32(wq[i]) * scale[i / in];
        free(w);
        return wq;
    }
    float *wf = malloc(F4(in));
    for (int64_t r = 0; r < out; r++) {
        lt_test_fill_normal(rng, wf, in, 0.5f);
        uint8_t *row = wq + rb * (size_t)r;
        if (dt == LT_DTYPE_F32) memcpy(row, wf, rb);
        else if (dt == LT_DTYPE_BF16)
            for (int64_t k = 0; k < in; k++) ((uint16_t *)row)[k] = lt_f32_to_bf16(wf[k]);
        else if (dt == LT_DTYPE_F16)
            for (int64_t k = 0; k < in; k++) ((uint16_t *)row)[k] = lt_f32_to_f16(wf[k]);
        else lt_quantize_row(dt, wf, row, in);
        lt_dequantize_row(dt, row, wd + r * in, in);
    }
    free(wf);
    return wq;
}

#define WS_GUARD 4096 /* bytes after the workspace that must stay untouched */

/* matmul: s = {out, in, N}; opt bit 0 mode NN (else NT), bit 1 beta = 1 (else 0, y poisoned), bit 2
 * the run's bf16 products (lt_ctx_set_bf16x with the workspace sized for them): the product is then
 * defined on x rounded to bf16, which the CPU must multiply to f32 accuracy. */
static void run_matmul(const op_case *c, env *e) {
    const lt_dtype dt = c->dt;
    const int mode = c->opt & 1 ? LT_MATMUL_NN : LT_MATMUL_NT;
    const float beta = c->opt & 2 ? 1.0f : 0.0f;
    const int bf16x = (c->opt & 4) != 0;
    const int64_t out = c->s[0], in = c->s[1], N = c->s[2];
    if (bf16x && e->be->device == LT_DEVICE_CPU && !lt_sys_cpu_bf16_products()) {
        printf("      skipped: no bf16 products on this CPU (a build without oneDNN, or a CPU without AVX-512)\n");
        return;
    }
    float *wd = malloc(F4(out * in));
    uint8_t *wq = make_weight(&e->rng, dt, out, in, wd);
    size_t wbytes = (size_t)lt_dtype_row_bytes(dt, in) * (size_t)out;
    int64_t shape[2] = {out, in};
    lt_tensor w = lt_tensor_view(up(e, wq, wbytes), dt, e->be->device, 2, shape);
    size_t wsb = e->be->matmul_workspace_bytes(dt, out, in, N, lt_ctx_threads(e->ctx));
    if (bf16x && e->be->matmul_bf16x_workspace_bytes) {
        size_t b = e->be->matmul_bf16x_workspace_bytes(dt, out, in, N, lt_ctx_threads(e->ctx));
        if (b > wsb) wsb = b;
        lt_ctx_set_bf16x(e->ctx, wsb);
    }
    uint8_t *guard = malloc(wsb + WS_GUARD);
    memset(guard, 0xa5, wsb + WS_GUARD);
    uint8_t *ws = up(e, guard, wsb + WS_GUARD);
    const int64_t xin = mode == LT_MATMUL_NT ? in : out, yout = mode == LT_MATMUL_NT ? out : in;
    float *x = lt_test_fresh(&e->rng, N * xin, 1);
    float *y0 = beta != 0 ? lt_test_fresh(&e->rng, N * yout, 1) : lt_test_poisoned(N * yout);
    float *dx = up(e, x, F4(N * xin)), *dy = up(e, y0, F4(N * yout)), *y = malloc(F4(N * yout));
    e->be->matmul(e->ctx, (lt_matmul_mode)mode, &w, dx, N, beta, dy, ws);
    down(e, y, dy, F4(N * yout));
    uint8_t *after = malloc(WS_GUARD);
    down(e, after, ws + wsb, WS_GUARD);
    for (int i = 0; i < WS_GUARD; i++) CHECK(e, after[i] != 0xa5);
    /* bf16 products: the CPU multiplies x rounded to bf16 to f32 accuracy (CUDA's matmul rounds x
     * the same way and keeps its own tolerance) */
    /* bf16 products take bf16, f16 and block-format W (the latter two rounded to bf16 whole, as
     * CUDA converts them); f32 and FP8 keep their products */
    const int rounded = bf16x && dt != LT_DTYPE_F32 && dt != LT_DTYPE_FP8;
    const double tol =
        lt_test_tol_for(rounded && e->be->device == LT_DEVICE_CPU ? LT_DTYPE_F32 : input_dtype(e->be, PREC_INPUTS),
                        xin);
    /* fp8: the product is defined on x rounded per row to e4m3 (lt_fp8_row_scale); NN first folds
     * W's row scales into x, so the reference then multiplies by q alone */
    float *xr = x;
    if (dt == LT_DTYPE_FP8) {
        const float *scale = lt_fp8_scales(wq, out, in);
        xr = malloc(F4(N * xin));
        for (int64_t n = 0; n < N; n++) {
            float *r = xr + n * xin, inv, sc;
            for (int64_t k = 0; k < xin; k++) r[k] = x[n * xin + k] * (mode == LT_MATMUL_NN ? scale[k] : 1.0f);
            (void)lt_fp8_row_scale(r, xin, &inv, &sc);
            for (int64_t k = 0; k < xin; k++) r[k] = lt_fp8_to_f32(lt_f32_to_fp8(r[k] * inv)) * sc;
        }
        if (mode == LT_MATMUL_NN)
            for (int64_t i = 0; i < out * in; i++) wd[i] = lt_fp8_to_f32(wq[i]);
    } else if (rounded) {
        xr = malloc(F4(N * xin));
        for (int64_t i = 0; i < N * xin; i++) xr[i] = lt_bf16_to_f32(lt_f32_to_bf16(x[i]));
        if (e->be->device == LT_DEVICE_CPU)
            for (int64_t i = 0; i < out * in; i++) wd[i] = lt_bf16_to_f32(lt_f32_to_bf16(wd[i]));
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < yout; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < xin; k++) {
                double t = (double)xr[n * xin + k] * wd[mode == LT_MATMUL_NT ? j * in + k : k * in + j];
                s += t, sa += fabs(t);
            }
            double acc = beta != 0 ? y0[n * yout + j] : 0;
            CHECK(e, bad(y[n * yout + j], s + acc, sa, tol, lt_dtype_name(dt), n * yout + j));
        }
    if (mode == LT_MATMUL_NT) { /* the shared-input flag right after the same x: the same bits */
        assert_int_equal(e->be->copy_to_device(e->ctx, dy, y0, F4(N * yout)), LT_OK);
        e->be->matmul(e->ctx, LT_MATMUL_NT_SAME_X, &w, dx, N, beta, dy, ws);
        float *y2 = malloc(F4(N * yout));
        down(e, y2, dy, F4(N * yout));
        CHECK(e, memcmp(y2, y, F4(N * yout)) != 0);
        free(y2);
    }
    lt_ctx_set_bf16x(e->ctx, 0);
    dfree(e, w.data, wbytes), dfree(e, ws, wsb + WS_GUARD), dfree(e, dx, F4(N * xin)), dfree(e, dy, F4(N * yout));
    if (xr != x) free(xr);
    free(wd), free(wq), free(guard), free(x), free(y0), free(y), free(after);
}

/* lora_fwd + lora_bwd: s = {G, in, n, r}; the out widths, adapters and flags come from the
 * lt_lora_case of row c->opt in lora_rows (the shared runner in helpers/lora_check.c). */
static const lt_lora_case lora_rows[] = {
    {3, {48, 16, 16}, {1, 1, 1}, 64, 37, 4, 2.0f, 0.0f, 1, 0, 0, LT_DTYPE_F32},
    {3, {48, 16, 16}, {1, 0, 1}, 64, 37, 4, 2.0f, 1.0f, 1, 0, 0, LT_DTYPE_F32}, /* k without an adapter */
    {1, {40, 0, 0}, {1, 0, 0}, 96, 29, 8, 0.5f, 1.0f, 0, 0, 0, LT_DTYPE_BF16},
    {1, {40, 0, 0}, {1, 0, 0}, 96, 29, 8, 0.5f, 0.0f, 0, 0, 1, LT_DTYPE_BF16}, /* no dx */
    {2, {72, 72, 0}, {1, 1, 0}, 32, 17, 3, 1.5f, 0.0f, 0, 1, 0, LT_DTYPE_F32}, /* lu only */
    /* the CUDA fused kernels: bf16 down-products, the rank update first, the tall reduction */
    {3, {256, 64, 64}, {1, 1, 1}, 256, 1100, 8, 2.0f, 0.0f, 1, 0, 0, LT_DTYPE_BF16},
    {3, {256, 64, 64}, {1, 0, 1}, 256, 1100, 8, 2.0f, 1.0f, 1, 0, 0, LT_DTYPE_BF16},
    {1, {512, 0, 0}, {1, 0, 0}, 128, 1030, 16, 0.5f, 1.0f, 0, 0, 0, LT_DTYPE_BF16},
    {1, {512, 0, 0}, {1, 0, 0}, 128, 1030, 16, 0.5f, 0.0f, 0, 0, 0, LT_DTYPE_BF16},
    {2, {384, 384, 0}, {1, 1, 0}, 128, 700, 4, 1.0f, 0.0f, 0, 0, 1, LT_DTYPE_F32},
    /* and the shapes the CUDA table leaves to the reference composition */
    {2, {96, 96, 0}, {1, 1, 0}, 64, 300, 6, 2.0f, 0.0f, 0, 0, 0, LT_DTYPE_BF16}, /* rank 6 */
    {1, {64, 0, 0}, {1, 0, 0}, 36, 200, 8, 2.0f, 1.0f, 1, 0, 0, LT_DTYPE_F32},   /* in % 8 != 0 */
    {1, {128, 0, 0}, {1, 0, 0}, 64, 500, 8, 1.0f, 0.0f, 0, 1, 0, LT_DTYPE_BF16}, /* lu only */
    /* the CPU's grouped backward: outputs of 1024 and more (dB as (luᵀ·dy)ᵀ), and a wide input
     * (the stacked copies of 2048 inputs in the workspace) */
    {2, {1100, 1030, 0}, {1, 1, 0}, 72, 90, 8, 2.0f, 1.0f, 0, 0, 0, LT_DTYPE_F32},
    {3, {64, 32, 32}, {1, 1, 1}, 2048, 40, 8, 1.0f, 0.0f, 0, 0, 0, LT_DTYPE_F32},
    /* the tensor-core down-products over several passes of a block's warps (K = 1024 and 512),
     * and a rank that leaves zero rows in the second 8-wide factor tile (r = 12) */
    {2, {512, 512, 0}, {1, 1, 0}, 1024, 300, 8, 1.0f, 0.0f, 0, 0, 0, LT_DTYPE_BF16},
    {1, {384, 0, 0}, {1, 0, 0}, 640, 333, 12, 0.5f, 1.0f, 1, 0, 0, LT_DTYPE_BF16},
    /* rank 16 on two members sharing dx: the rank update's widest V block (K = 32) onto dx */
    {2, {256, 128, 0}, {1, 1, 0}, 128, 333, 16, 1.0f, 1.0f, 0, 0, 0, LT_DTYPE_BF16},
    /* rank 16 with K = 1024 both ways: the two-tile down-products cut into K slices, whose sums
     * the last block of each row block adds */
    {1, {1024, 0, 0}, {1, 0, 0}, 1024, 300, 16, 0.5f, 1.0f, 0, 0, 0, LT_DTYPE_BF16},
    /* a group whose members' dy·B run in one launch cut into different numbers of K slices (two
     * for out = 1024, one for 512): each member's own slices and counters */
    {3, {1024, 1024, 512}, {1, 1, 1}, 256, 200, 8, 1.0f, 0.0f, 0, 0, 0, LT_DTYPE_BF16},
    /* a group whose dyᵀ·lu partial sums do not fit the CUDA gemm workspace together (13 K slices
     * of 2048 columns, 1.7 MB a member, 5.1 MB for three against 4 MiB): its members one after
     * another, each with the whole workspace, the bits of the one-by-one calls */
    {3, {2048, 2048, 2048}, {1, 1, 1}, 32, 3456, 8, 1.0f, 0.0f, 0, 0, 0, LT_DTYPE_BF16},
};

static void run_lora(const op_case *c, env *e) {
    const lt_lora_case *lc = &lora_rows[c->opt];
    lt_lora_errors er;
    lt_lora_check_run(e->be, &e->rng, lc, &er);
    /* the longest sums: x·Aᵀ and x·Wᵀ over in, dx over out + r, the gradients over n */
    int64_t k = lc->in > lc->n ? lc->in : lc->n;
    for (int g = 0; g < lc->G; g++) k = lc->out[g] + lc->r > k ? lc->out[g] + lc->r : k;
    const double tol = lt_test_tol_for(input_dtype(e->be, PREC_INPUTS), k);
    fprintf(stderr, "    y %.2e lu %.2e dx %.2e ga %.2e gb %.2e (tol %.2e)\n", er.y, er.lu, er.dx, er.ga, er.gb, tol);
    CHECK(e, !(er.y <= tol && er.lu <= tol && er.dx <= tol && er.ga <= tol && er.gb <= tol));
    if (er.bf16_variants)
        fprintf(stderr, "    bf16 inputs (x, dy, both): %lld elements differ from the f32 ops'\n",
                (long long)er.bf16_mismatch);
    CHECK(e, er.bf16_mismatch != 0);
    if (er.yc_mismatch >= 0)
        fprintf(stderr, "    y onto a residual read from yc: %lld elements differ from in place\n",
                (long long)er.yc_mismatch);
    CHECK(e, er.yc_mismatch > 0);
    /* y and dx in bf16: rounded twice (the adapter's term, then the sum), on bf16 inputs */
    const double tol_h = lt_test_tol_for(LT_DTYPE_BF16, 1) + tol;
    if (er.y_bf16 >= 0) {
        fprintf(stderr, "    y in bf16: %.2e (tol %.2e)\n", er.y_bf16, tol_h);
        CHECK(e, !(er.y_bf16 <= tol_h));
    }
    if (er.dx_bf16 >= 0) {
        fprintf(stderr, "    dx in bf16: %.2e (tol %.2e)\n", er.dx_bf16, tol_h);
        CHECK(e, !(er.dx_bf16 <= tol_h));
    }
}

/* ---- rmsnorm: s = {N, C} ---- */

static double rms_ref(const double *x, const float *w, double eps, int64_t C, int64_t c) {
    double ss = 0;
    for (int64_t k = 0; k < C; k++) ss += x[k] * x[k];
    return w[c] * x[c] / sqrt(ss / (double)C + eps);
}

static void run_rmsnorm(const op_case *c, env *e) {
    const int64_t N = c->s[0], C = c->s[1];
    const float eps = 1e-5f;
    float *x = lt_test_fresh(&e->rng, N * C, 1.5f), *w = lt_test_fresh(&e->rng, C, 1);
    float *dy = lt_test_fresh(&e->rng, N * C, 1), *dw0 = lt_test_fresh(&e->rng, C, 1), *P = lt_test_poisoned(N * C);
    float *d_x = up(e, x, F4(N * C)), *d_w = up(e, w, F4(C)), *d_dy = up(e, dy, F4(N * C));
    float *d_y = up(e, P, F4(N * C)), *d_r = up(e, P, F4(N)), *d_dx = up(e, P, F4(N * C)), *d_dw = up(e, dw0, F4(C));
    e->be->rmsnorm_fwd(e->ctx, d_x, d_w, eps, N, C, d_y, d_r);
    e->be->rmsnorm_bwd(e->ctx, d_dy, d_x, d_w, d_r, N, C, d_dx, d_dw);
    float *y = malloc(F4(N * C)), *r = malloc(F4(N)), *gx = malloc(F4(N * C)), *gw = malloc(F4(C));
    down(e, y, d_y, F4(N * C)), down(e, r, d_r, F4(N)), down(e, gx, d_dx, F4(N * C)), down(e, gw, d_dw, F4(C));
    const double tol = lt_test_tol_for(LT_DTYPE_F32, C);
    double *xd = malloc(sizeof(double) * (size_t)C);
    for (int64_t n = 0; n < N; n++) {
        double ss = 0, dot = 0, dota = 0;
        for (int64_t k = 0; k < C; k++) {
            xd[k] = x[n * C + k];
            ss += xd[k] * xd[k];
            dot += (double)w[k] * dy[n * C + k] * xd[k], dota += fabs((double)w[k] * dy[n * C + k] * xd[k]);
        }
        const double rr = 1.0 / sqrt(ss / (double)C + eps), k3 = rr * rr * rr / (double)C;
        CHECK(e, bad(r[n], rr, 0, tol, "rstd", n));
        for (int64_t k = 0; k < C; k++) {
            const int64_t i = n * C + k;
            CHECK(e, bad(y[i], w[k] * xd[k] * rr, 0, tol, "rms y", i));
            const double want = rr * w[k] * dy[i] - xd[k] * dot * k3;
            CHECK(e, bad(gx[i], want, fabs(rr * w[k] * dy[i]) + fabs(xd[k] * dota * k3), tol, "rms dx", i));
            if (n == 0) { /* the analytic gradient against central differences of the forward */
                double h = 1e-6, lp = 0, lm = 0;
                xd[k] += h;
                for (int64_t j = 0; j < C; j++) lp += dy[j] * rms_ref(xd, w, eps, C, j);
                xd[k] -= 2 * h;
                for (int64_t j = 0; j < C; j++) lm += dy[j] * rms_ref(xd, w, eps, C, j);
                xd[k] += h;
                CHECK(e, bad(want, (lp - lm) / (2 * h), 1e-3, 1e-4, "rms dx fd", k));
            }
        }
    }
    for (int64_t k = 0; k < C; k++) {
        double s = dw0[k], sa = fabs(dw0[k]);
        for (int64_t n = 0; n < N; n++) {
            double t = (double)dy[n * C + k] * x[n * C + k] * r[n];
            s += t, sa += fabs(t);
        }
        CHECK(e, bad(gw[k], s, sa, lt_test_tol_for(LT_DTYPE_F32, N), "rms dw", k));
    }
    if (e->be->rmsnorm_bwd_add) { /* dx += the gradient: rmsnorm_bwd into a buffer, then add, bit for bit */
        float *acc = lt_test_fresh(&e->rng, N * C, 1), *want = malloc(F4(N * C)), *got = malloc(F4(N * C));
        float *d_acc = up(e, acc, F4(N * C)), *d_t = up(e, NULL, F4(N * C));
        e->be->rmsnorm_bwd(e->ctx, d_dy, d_x, d_w, d_r, N, C, d_t, NULL);
        e->be->add(e->ctx, d_acc, d_t, 1.0f, N * C);
        down(e, want, d_acc, F4(N * C));
        assert_int_equal(e->be->copy_to_device(e->ctx, d_acc, acc, F4(N * C)), LT_OK);
        e->be->rmsnorm_bwd_add(e->ctx, d_dy, d_x, d_w, d_r, N, C, d_acc);
        down(e, got, d_acc, F4(N * C));
        const int same = memcmp(got, want, F4(N * C)) == 0;
        if (!same) fprintf(stderr, "    rmsnorm_bwd_add differs from rmsnorm_bwd then add\n");
        CHECK(e, !same);
        dfree(e, d_acc, F4(N * C)), dfree(e, d_t, F4(N * C));
        free(acc), free(want), free(got);
    }
    if (e->be->rmsnorm_fwd_bf16) { /* the bf16 output: each element the f32 op's rounded to nearest even */
        const size_t hb = (size_t)(N * C) * 2;
        uint16_t *pz = malloc(hb), *yh = malloc(hb);
        memset(pz, 0xff, hb);
        uint16_t *d_yh = up(e, pz, hb);
        e->be->rmsnorm_fwd_bf16(e->ctx, d_x, d_w, eps, N, C, d_yh, d_r);
        down(e, yh, d_yh, hb);
        int64_t nb = 0;
        for (int64_t i = 0; i < N * C; i++) nb += yh[i] != lt_f32_to_bf16(y[i]);
        fprintf(stderr, "    rmsnorm bf16 output: %lld of %lld elements differ from the f32 op's rounded\n",
                (long long)nb, (long long)(N * C));
        CHECK(e, nb != 0);
        dfree(e, d_yh, hb);
        free(pz), free(yh);
    }
    dfree(e, d_x, F4(N * C)), dfree(e, d_w, F4(C)), dfree(e, d_dy, F4(N * C)), dfree(e, d_y, F4(N * C));
    dfree(e, d_r, F4(N)), dfree(e, d_dx, F4(N * C)), dfree(e, d_dw, F4(C));
    free(x), free(w), free(dy), free(dw0), free(P), free(y), free(r), free(gx), free(gw), free(xd);
}

/* ---- rope: s = {N, heads, D, max position} ---- */

/* A backend's rope_cvt (where it has one) from f32 or bf16 rows into the other dtype or bf16 ones:
 * each element that of widening the input, rotating in place with rope and rounding the result
 * to nearest even where the output is bf16, bit for bit. */
static void check_rope_cvt(env *e, const float *x, const int32_t *d_pos, const float *d_inv, int64_t N, int64_t Hh,
                           int64_t D) {
    if (!e->be->rope_cvt) return;
    const int64_t n = N * Hh * D;
    uint16_t *xh = malloc((size_t)n * 2), *gh = malloc((size_t)n * 2);
    float *xw = malloc(F4(n)), *want = malloc(F4(n)), *got = malloc(F4(n));
    for (int64_t i = 0; i < n; i++) xh[i] = lt_f32_to_bf16(x[i]), xw[i] = lt_bf16_to_f32(xh[i]);
    float *d_w = up(e, xw, F4(n)), *d_f = up(e, x, F4(n)), *d_y = up(e, NULL, F4(n));
    uint16_t *d_h = up(e, xh, (size_t)n * 2);
    static const int kinds[3][2] = {{0, 1}, {1, 0}, {1, 1}};
    for (int inverse = 0; inverse < 2; inverse++)
        for (int k = 0; k < 3; k++) {
            const int xb = kinds[k][0], yb = kinds[k][1];
            assert_int_equal(e->be->copy_to_device(e->ctx, d_w, xb ? xw : x, F4(n)), LT_OK);
            e->be->rope(e->ctx, d_w, d_pos, d_inv, N, Hh, D, inverse);
            down(e, want, d_w, F4(n));
            e->be->rope_cvt(e->ctx, xb ? (const void *)d_h : (const void *)d_f, xb, d_y, yb, d_pos, d_inv, N, Hh, D,
                            inverse);
            int64_t nb = 0;
            if (yb) {
                down(e, gh, d_y, (size_t)n * 2);
                for (int64_t i = 0; i < n; i++) nb += gh[i] != lt_f32_to_bf16(want[i]);
            } else {
                down(e, got, d_y, F4(n));
                nb = memcmp(got, want, F4(n)) != 0;
            }
            if (nb)
                fprintf(stderr, "    rope_cvt %s -> %s%s: %lld elements differ\n", xb ? "bf16" : "f32",
                        yb ? "bf16" : "f32", inverse ? " (inverse)" : "", (long long)nb);
            CHECK(e, nb != 0);
        }
    dfree(e, d_w, F4(n)), dfree(e, d_f, F4(n)), dfree(e, d_y, F4(n)), dfree(e, d_h, (size_t)n * 2);
    free(xh), free(gh), free(xw), free(want), free(got);
}

static void run_rope(const op_case *c, env *e) {
    const int64_t N = c->s[0], Hh = c->s[1], D = c->s[2], n = N * Hh * D, half = D / 2;
    float *inv = malloc(F4(half + 1)); /* the model's table: frequencies, then the attention factor */
    for (int64_t i = 0; i < half; i++) inv[i] = (float)pow(1000000.0, -2.0 * (double)i / (double)D);
    inv[half] = 1.0f + (float)(lt_test_rand_u64(&e->rng) % 4) * 0.125f;
    int32_t *pos = malloc((size_t)N * 4);
    for (int64_t t = 0; t < N; t++) pos[t] = (int32_t)(lt_test_rand_u64(&e->rng) % (uint64_t)c->s[3]);
    float *x = lt_test_fresh(&e->rng, n, 1), *y = malloc(F4(n)), *dy = lt_test_fresh(&e->rng, n, 1);
    float *dx = malloc(F4(n));
    float *d_x = up(e, x, F4(n)), *d_inv = up(e, inv, F4(half + 1));
    int32_t *d_pos = up(e, pos, (size_t)N * 4);
    const double tol = lt_test_tol_for(LT_DTYPE_F32, 2);
    for (int inverse = 0; inverse < 2; inverse++) {
        assert_int_equal(e->be->copy_to_device(e->ctx, d_x, x, F4(n)), LT_OK);
        e->be->rope(e->ctx, d_x, d_pos, d_inv, N, Hh, D, inverse);
        down(e, y, d_x, F4(n));
        const double sg = inverse ? -1 : 1;
        for (int64_t t = 0; t < N; t++)
            for (int64_t h = 0; h < Hh; h++)
                for (int64_t i = 0; i < D; i++) {
                    const float *v = x + (t * Hh + h) * D;
                    const double ang = (double)((float)pos[t] * inv[i % half]); /* fp32 angle, as transformers */
                    const double co = inv[half] * cos(ang), si = inv[half] * sg * sin(ang);
                    const double want = i < half ? v[i] * co - v[i + half] * si : v[i] * co + v[i - half] * si;
                    CHECK(e,
                          bad(y[(t * Hh + h) * D + i], want, 1, tol, inverse ? "rope inverse" : "rope",
                              (t * Hh + h) * D + i));
                }
    }
    check_rope_cvt(e, x, d_pos, d_inv, N, Hh, D);
    /* the backward is the inverse rotation by the same factor s, the adjoint of the forward:
     * ⟨dy, rope(x)⟩ = ⟨rope⁻¹(dy), x⟩, and rope⁻¹(rope(x)) = s² x */
    assert_int_equal(e->be->copy_to_device(e->ctx, d_x, x, F4(n)), LT_OK);
    e->be->rope(e->ctx, d_x, d_pos, d_inv, N, Hh, D, 0);
    down(e, y, d_x, F4(n));
    e->be->rope(e->ctx, d_x, d_pos, d_inv, N, Hh, D, 1);
    float *back = malloc(F4(n));
    down(e, back, d_x, F4(n));
    assert_int_equal(e->be->copy_to_device(e->ctx, d_x, dy, F4(n)), LT_OK);
    e->be->rope(e->ctx, d_x, d_pos, d_inv, N, Hh, D, 1);
    down(e, dx, d_x, F4(n));
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < n; i++) lhs += (double)dy[i] * y[i], rhs += (double)dx[i] * x[i];
    CHECK(e, bad(lhs, rhs, fabs(lhs) + sqrt((double)n), tol, "rope adjoint", 0));
    for (int64_t i = 0; i < n; i++)
        CHECK(e, bad(back[i], (double)inv[half] * inv[half] * x[i], 1, tol, "rope round trip", i));
    dfree(e, d_x, F4(n)), dfree(e, d_inv, F4(half + 1)), dfree(e, d_pos, (size_t)N * 4);
    free(inv), free(pos), free(x), free(y), free(dy), free(dx), free(back);
}

/* The glu backwards with dg written over g and du over u (as the MLP's backward calls them):
 * bit-identical to the out-of-place results gg, gu. */
static void check_glu_bwd_in_place(env *e, int geglu, const float *g, const float *u, const float *d_da,
                                   const float *gg, const float *gu, int64_t n) {
    float *d_g = up(e, g, F4(n)), *d_u = up(e, u, F4(n));
    if (geglu) e->be->geglu_bwd(e->ctx, d_da, d_g, d_u, n, d_g, d_u);
    else e->be->swiglu_bwd(e->ctx, d_da, d_g, d_u, n, d_g, d_u);
    float *ig = malloc(F4(n)), *iu = malloc(F4(n));
    down(e, ig, d_g, F4(n)), down(e, iu, d_u, F4(n));
    const int same = memcmp(ig, gg, F4(n)) == 0 && memcmp(iu, gu, F4(n)) == 0;
    if (!same) fprintf(stderr, "    %s backward in place differs from out of place\n", geglu ? "geglu" : "swiglu");
    CHECK(e, !same);
    dfree(e, d_g, F4(n)), dfree(e, d_u, F4(n));
    free(ig), free(iu);
}

/* The bf16-output glu ops (a backend's glu_fwd_bf16 / glu_bwd_bf16, where it has them) from
 * d_g, d_u, d_da (f32, or bf16 with gu_bf16): each element the f32 op's value a, gg, gu (on the
 * same input values) rounded to nearest even, bit for bit. */
static void glu_bf16_matches(env *e, int geglu, const void *d_g, const void *d_u, const void *d_da, int gu_bf16,
                             const float *a, const float *gg, const float *gu, int64_t n) {
    const size_t hb = (size_t)n * 2;
    uint16_t *pz = malloc(hb);
    memset(pz, 0xff, hb); /* NaN patterns: an element left unwritten cannot match */
    uint16_t *d_a = up(e, pz, hb), *d_dg = up(e, pz, hb), *d_du = up(e, pz, hb);
    e->be->glu_fwd_bf16(e->ctx, geglu, d_g, d_u, gu_bf16, n, d_a);
    e->be->glu_bwd_bf16(e->ctx, geglu, d_da, d_g, d_u, gu_bf16, n, d_dg, d_du);
    uint16_t *ha = malloc(hb), *hg = malloc(hb), *hu = malloc(hb);
    down(e, ha, d_a, hb), down(e, hg, d_dg, hb), down(e, hu, d_du, hb);
    int64_t bad_a = 0, bad_g = 0, bad_u = 0;
    for (int64_t i = 0; i < n; i++) {
        bad_a += ha[i] != lt_f32_to_bf16(a[i]);
        bad_g += hg[i] != lt_f32_to_bf16(gg[i]);
        bad_u += hu[i] != lt_f32_to_bf16(gu[i]);
    }
    fprintf(stderr,
            "    %s bf16 outputs (g, u, da in %s): %lld / %lld / %lld of %lld elements differ from the f32 op's "
            "rounded\n",
            geglu ? "geglu" : "swiglu", gu_bf16 ? "bf16" : "f32", (long long)bad_a, (long long)bad_g, (long long)bad_u,
            (long long)n);
    CHECK(e, bad_a || bad_g || bad_u);
    dfree(e, d_a, hb), dfree(e, d_dg, hb), dfree(e, d_du, hb);
    free(pz), free(ha), free(hg), free(hu);
}

/* glu_bf16_matches from the f32 g, u, da (the f32 op's outputs a, gg, gu given), then from their
 * bf16 roundings (the f32 op rerun on the widened roundings for the reference). */
static void check_glu_bf16(env *e, int geglu, const float *g, const float *u, const float *da, const float *d_g,
                           const float *d_u, const float *d_da, const float *a, const float *gg, const float *gu,
                           int64_t n) {
    if (!e->be->glu_fwd_bf16) return;
    glu_bf16_matches(e, geglu, d_g, d_u, d_da, 0, a, gg, gu, n);
    const size_t hb = (size_t)n * 2;
    uint16_t *gh = malloc(hb), *uh = malloc(hb), *dh = malloc(hb);
    float *gw = malloc(F4(n)), *uw = malloc(F4(n)), *dw = malloc(F4(n));
    for (int64_t i = 0; i < n; i++) {
        gh[i] = lt_f32_to_bf16(g[i]), uh[i] = lt_f32_to_bf16(u[i]), dh[i] = lt_f32_to_bf16(da[i]);
        gw[i] = lt_bf16_to_f32(gh[i]), uw[i] = lt_bf16_to_f32(uh[i]), dw[i] = lt_bf16_to_f32(dh[i]);
    }
    float *d_gw = up(e, gw, F4(n)), *d_uw = up(e, uw, F4(n)), *d_dw = up(e, dw, F4(n)), *d_a = up(e, gw, F4(n)),
          *d_dg = up(e, gw, F4(n)), *d_du = up(e, gw, F4(n));
    if (geglu) {
        e->be->geglu_fwd(e->ctx, d_gw, d_uw, n, d_a);
        e->be->geglu_bwd(e->ctx, d_dw, d_gw, d_uw, n, d_dg, d_du);
    } else {
        e->be->swiglu_fwd(e->ctx, d_gw, d_uw, n, d_a);
        e->be->swiglu_bwd(e->ctx, d_dw, d_gw, d_uw, n, d_dg, d_du);
    }
    float *a2 = malloc(F4(n)), *gg2 = malloc(F4(n)), *gu2 = malloc(F4(n));
    down(e, a2, d_a, F4(n)), down(e, gg2, d_dg, F4(n)), down(e, gu2, d_du, F4(n));
    uint16_t *d_gh = up(e, gh, hb), *d_uh = up(e, uh, hb), *d_dh = up(e, dh, hb);
    glu_bf16_matches(e, geglu, d_gh, d_uh, d_dh, 1, a2, gg2, gu2, n);
    dfree(e, d_gh, hb), dfree(e, d_uh, hb), dfree(e, d_dh, hb);
    dfree(e, d_gw, F4(n)), dfree(e, d_uw, F4(n)), dfree(e, d_dw, F4(n)), dfree(e, d_a, F4(n));
    dfree(e, d_dg, F4(n)), dfree(e, d_du, F4(n));
    free(gh), free(uh), free(dh), free(gw), free(uw), free(dw), free(a2), free(gg2), free(gu2);
}

/* ---- swiglu: s = {n} ---- */

static double silu(double g) { return g / (1 + exp(-g)); }

static void run_swiglu(const op_case *c, env *e) {
    const int64_t n = c->s[0];
    float *g = lt_test_fresh(&e->rng, n, 3), *u = lt_test_fresh(&e->rng, n, 1), *da = lt_test_fresh(&e->rng, n, 1);
    float *P = lt_test_poisoned(n);
    float *d_g = up(e, g, F4(n)), *d_u = up(e, u, F4(n)), *d_da = up(e, da, F4(n));
    float *d_a = up(e, P, F4(n)), *d_dg = up(e, P, F4(n)), *d_du = up(e, P, F4(n));
    e->be->swiglu_fwd(e->ctx, d_g, d_u, n, d_a);
    e->be->swiglu_bwd(e->ctx, d_da, d_g, d_u, n, d_dg, d_du);
    float *a = malloc(F4(n)), *gg = malloc(F4(n)), *gu = malloc(F4(n));
    down(e, a, d_a, F4(n)), down(e, gg, d_dg, F4(n)), down(e, gu, d_du, F4(n));
    const double tol = lt_test_tol_for(LT_DTYPE_F32, 4);
    for (int64_t i = 0; i < n; i++) {
        const double s = 1 / (1 + exp(-(double)g[i]));
        CHECK(e, bad(a[i], silu(g[i]) * u[i], 0, tol, "swiglu", i));
        const double want = (double)da[i] * u[i] * s * (1 + g[i] * (1 - s));
        const double scale = fabs((double)da[i] * u[i] * s) * (1 + fabs(g[i] * (1 - s)));
        CHECK(e, bad(gg[i], want, scale, tol, "swiglu dg", i));
        CHECK(e, bad(gu[i], (double)da[i] * silu(g[i]), 0, tol, "swiglu du", i));
        if (i < 1000) { /* the analytic dg against central differences */
            const double h = 1e-6, fd = da[i] * u[i] * (silu(g[i] + h) - silu(g[i] - h)) / (2 * h);
            CHECK(e, bad(want, fd, 1e-4, 1e-4, "swiglu dg fd", i));
        }
    }
    check_glu_bwd_in_place(e, 0, g, u, d_da, gg, gu, n);
    check_glu_bf16(e, 0, g, u, da, d_g, d_u, d_da, a, gg, gu, n);
    dfree(e, d_g, F4(n)), dfree(e, d_u, F4(n)), dfree(e, d_da, F4(n));
    dfree(e, d_a, F4(n)), dfree(e, d_dg, F4(n)), dfree(e, d_du, F4(n));
    free(g), free(u), free(da), free(P), free(a), free(gg), free(gu);
}

/* ---- geglu: s = {n}: GELU's tanh approximation times u ---- */

static double gelu_tanh(double g) {
    const double k = sqrt(2.0 / 3.14159265358979323846);
    return 0.5 * g * (1 + tanh(k * (g + 0.044715 * g * g * g)));
}

static void run_geglu(const op_case *c, env *e) {
    const int64_t n = c->s[0];
    const double k = sqrt(2.0 / 3.14159265358979323846);
    float *g = lt_test_fresh(&e->rng, n, 3), *u = lt_test_fresh(&e->rng, n, 1), *da = lt_test_fresh(&e->rng, n, 1);
    float *P = lt_test_poisoned(n);
    float *d_g = up(e, g, F4(n)), *d_u = up(e, u, F4(n)), *d_da = up(e, da, F4(n));
    float *d_a = up(e, P, F4(n)), *d_dg = up(e, P, F4(n)), *d_du = up(e, P, F4(n));
    e->be->geglu_fwd(e->ctx, d_g, d_u, n, d_a);
    e->be->geglu_bwd(e->ctx, d_da, d_g, d_u, n, d_dg, d_du);
    float *a = malloc(F4(n)), *gg = malloc(F4(n)), *gu = malloc(F4(n));
    down(e, a, d_a, F4(n)), down(e, gg, d_dg, F4(n)), down(e, gu, d_du, F4(n));
    const double tol = lt_test_tol_for(LT_DTYPE_F32, 4);
    for (int64_t i = 0; i < n; i++) {
        const double x = g[i], t = tanh(k * (x + 0.044715 * x * x * x));
        /* the tanh's argument carries the input's rounding times its slope: scale by its size */
        const double targ = fabs(k * (x + 0.044715 * x * x * x)) * (1 - t * t);
        CHECK(e, bad(a[i], gelu_tanh(x) * u[i], fabs(0.5 * x * u[i]) * (1 + targ), tol, "geglu", i));
        const double dgl = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
        const double want = (double)da[i] * u[i] * dgl;
        const double scale = fabs((double)da[i] * u[i]) * (1 + fabs(0.5 * x * k * (1 + 3 * 0.044715 * x * x)));
        CHECK(e, bad(gg[i], want, scale, tol, "geglu dg", i));
        CHECK(e, bad(gu[i], (double)da[i] * gelu_tanh(x), fabs(0.5 * x * da[i]) * (1 + targ), tol, "geglu du", i));
        if (i < 1000) { /* the analytic dg against central differences */
            const double h = 1e-6, fd = da[i] * u[i] * (gelu_tanh(x + h) - gelu_tanh(x - h)) / (2 * h);
            CHECK(e, bad(want, fd, 1e-4, 1e-4, "geglu dg fd", i));
        }
    }
    check_glu_bwd_in_place(e, 1, g, u, d_da, gg, gu, n);
    check_glu_bf16(e, 1, g, u, da, d_g, d_u, d_da, a, gg, gu, n);
    dfree(e, d_g, F4(n)), dfree(e, d_u, F4(n)), dfree(e, d_da, F4(n));
    dfree(e, d_a, F4(n)), dfree(e, d_dg, F4(n)), dfree(e, d_du, F4(n));
    free(g), free(u), free(da), free(P), free(a), free(gg), free(gu);
}

/* ---- embedding: s = {V, C, N}: bit-identical to the dequantized rows ---- */

static void run_embedding(const op_case *c, env *e) {
    const int64_t V = c->s[0], C = c->s[1], N = c->s[2];
    float *wd = malloc(F4(V * C));
    uint8_t *tq = make_weight(&e->rng, c->dt, V, C, wd);
    const size_t tb = (size_t)lt_dtype_row_bytes(c->dt, C) * (size_t)V;
    int32_t *ids = malloc((size_t)N * 4);
    for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)(lt_test_rand_u64(&e->rng) % (uint64_t)V);
    ids[0] = 0, ids[N - 1] = (int32_t)V - 1;
    int64_t sh[2] = {V, C};
    lt_tensor t = lt_tensor_view(up(e, tq, tb), c->dt, e->be->device, 2, sh);
    float *P = lt_test_poisoned(N * C), *got = malloc(F4(N * C));
    int32_t *d_ids = up(e, ids, (size_t)N * 4);
    float *d_out = up(e, P, F4(N * C));
    e->be->embedding(e->ctx, &t, d_ids, N, d_out);
    down(e, got, d_out, F4(N * C));
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < C; k++)
            if (memcmp(&got[n * C + k], &wd[ids[n] * C + k], 4)) {
                fprintf(stderr, "    embedding %s [%lld]: %.9g want %.9g\n", lt_dtype_name(c->dt),
                        (long long)(n * C + k), (double)got[n * C + k], (double)wd[ids[n] * C + k]);
                e->failures++;
                n = N;
                break;
            }
    dfree(e, t.data, tb), dfree(e, d_ids, (size_t)N * 4), dfree(e, d_out, F4(N * C));
    free(wd), free(tq), free(ids), free(P), free(got);
}

/* ---- add, add_bias, scale: s = {N, C} ---- */

static void run_add_bias_scale(const op_case *c, env *e) {
    const int64_t N = c->s[0], C = c->s[1], n = N * C;
    float *y = lt_test_fresh(&e->rng, n, 1), *x = lt_test_fresh(&e->rng, n, 1), *b = lt_test_fresh(&e->rng, C, 1);
    float *got = malloc(F4(n)), *before = malloc(F4(n));
    float *d_y = up(e, y, F4(n)), *d_x = up(e, x, F4(n)), *d_b = up(e, b, F4(C));
    e->be->add_bias(e->ctx, d_y, d_b, N, C);
    down(e, got, d_y, F4(n));
    for (int64_t i = 0; i < n; i++) CHECK(e, got[i] != y[i] + b[i % C]); /* one rounded add */
    e->be->add(e->ctx, d_y, d_x, -0.37f, n);
    memcpy(before, got, F4(n));
    down(e, got, d_y, F4(n));
    for (int64_t i = 0; i < n; i++)
        CHECK(e,
              bad(got[i], (double)before[i] - 0.37 * (double)x[i], fabs(0.37 * x[i]), lt_test_tol_for(LT_DTYPE_F32, 2),
                  "add", i));
    memcpy(before, got, F4(n));
    e->be->scale(e->ctx, d_y, 1.7f, n);
    down(e, got, d_y, F4(n));
    for (int64_t i = 0; i < n; i++) CHECK(e, got[i] != before[i] * 1.7f); /* one rounded multiply */
    dfree(e, d_y, F4(n)), dfree(e, d_x, F4(n)), dfree(e, d_b, F4(C));
    free(y), free(x), free(b), free(got), free(before);
}

/* ---- dropout: s = {n}: kept elements scaled by 1/(1-p), the mask a function of (seed, offset + i)
 * (the same on every backend: other backends are compared with the CPU's), p = 0 copies ---- */

static void run_dropout(const op_case *c, env *e) {
    const int64_t n = c->s[0];
    const lt_backend *cpu = lt_backend_get(LT_DEVICE_CPU);
    float *x = lt_test_fresh(&e->rng, n, 1), *P = lt_test_poisoned(n), *got = malloc(F4(n)), *want = malloc(F4(n));
    float *d_x = up(e, x, F4(n)), *d_y = up(e, P, F4(n));
    const float ps[] = {0.3f, 0.05f, 0.0f};
    const uint64_t offs[] = {0, 1000, (uint64_t)1 << 40};
    for (int pi = 0; pi < 3; pi++)
        for (int oi = 0; oi < 3; oi++) {
            const uint64_t seed = lt_test_rand_u64(&e->rng);
            const float p = ps[pi];
            e->be->dropout(e->ctx, d_x, d_y, n, p, seed, offs[oi]);
            down(e, got, d_y, F4(n));
            int64_t kept = 0;
            for (int64_t i = 0; i < n; i++) {
                if (got[i] != 0 || x[i] == 0) {
                    kept++;
                    CHECK(e, bad(got[i], x[i] / (1 - (double)p), 0, 1e-6, "dropout scale", i));
                }
            }
            /* Binomial(n, 1-p): within 6 standard deviations */
            const double mean = (1 - (double)p) * (double)n, sd = sqrt((double)n * p * (1 - (double)p));
            CHECK(e, fabs((double)kept - mean) > 6 * sd + 1);
            if (p == 0) CHECK(e, memcmp(got, x, F4(n)) != 0);
            e->be->dropout(e->ctx, d_x, d_y, n, p, seed, offs[oi]);
            down(e, want, d_y, F4(n));
            CHECK(e, memcmp(got, want, F4(n)) != 0); /* deterministic */
            if (p > 0) {                             /* another offset draws another mask */
                e->be->dropout(e->ctx, d_x, d_y, n, p, seed, offs[oi] + (uint64_t)n);
                down(e, want, d_y, F4(n));
                int64_t same = 0;
                for (int64_t i = 0; i < n; i++) same += (got[i] != 0) == (want[i] != 0);
                CHECK(e, same >= n - n / 200);
            }
            if (e->be != cpu) {
                cpu->dropout(e->ctx, x, want, n, p, seed, offs[oi]);
                CHECK(e, memcmp(got, want, F4(n)) != 0);
            }
        }
    /* in place (y aliases x), as the backward runs it */
    const uint64_t seed = lt_test_rand_u64(&e->rng);
    e->be->dropout(e->ctx, d_x, d_x, n, 0.2f, seed, 77);
    down(e, got, d_x, F4(n));
    cpu->dropout(e->ctx, x, want, n, 0.2f, seed, 77);
    CHECK(e, memcmp(got, want, F4(n)) != 0);
    dfree(e, d_x, F4(n)), dfree(e, d_y, F4(n));
    free(x), free(P), free(got), free(want);
}

/* ---- adamw: s = {n, steps}: PyTorch's formula in float64; other backends also within a few
 * ulps of the CPU's f32 rounding of the same formula, step by step ---- */

#define ADAMW_ULPS 4

static void run_adamw(const op_case *c, env *e) {
    const int64_t n = c->s[0];
    const lt_backend *cpu = lt_backend_get(LT_DEVICE_CPU);
    float *p = lt_test_fresh(&e->rng, n, 1), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    float *cp = malloc(F4(n)), *cm = malloc(F4(n)), *cv = malloc(F4(n));
    double *pd = malloc(sizeof(double) * (size_t)n), *md = calloc((size_t)n, 8), *vd = calloc((size_t)n, 8);
    for (int64_t i = 0; i < n; i++) pd[i] = p[i];
    float *d_p = up(e, p, F4(n)), *d_m = up(e, m, F4(n)), *d_v = up(e, v, F4(n));
    lt_adamw_params hp = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0};
    for (int step = 1; step <= c->s[1]; step++) {
        float *g = lt_test_fresh(&e->rng, n, step == 3 ? 1e-3f : 1.0f);
        float *d_g = up(e, g, F4(n));
        memcpy(cp, p, F4(n)), memcpy(cm, m, F4(n)), memcpy(cv, v, F4(n));
        hp.step = step;
        e->be->adamw(e->ctx, d_p, d_g, d_m, d_v, n, &hp);
        down(e, p, d_p, F4(n)), down(e, m, d_m, F4(n)), down(e, v, d_v, F4(n));
        cpu->adamw(e->ctx, cp, g, cm, cv, n, &hp); /* the CPU's step from the same state */
        const double ulps = ADAMW_ULPS * 2 * U_F32;
        for (int64_t i = 0; i < n; i++) {
            pd[i] *= 1 - (double)hp.lr * hp.weight_decay;
            md[i] = 0.9 * md[i] + 0.1 * g[i];
            vd[i] = 0.999 * vd[i] + 0.001 * (double)g[i] * g[i];
            const double mh = md[i] / (1 - pow(0.9, step)), vh = vd[i] / (1 - pow(0.999, step));
            pd[i] -= (double)hp.lr * mh / (sqrt(vh) + 1e-8);
            CHECK(e, bad(p[i], pd[i], 1e-2, 1e-5, "adamw p", i));
            CHECK(e, bad(m[i], md[i], 1e-2, 1e-5, "adamw m", i));
            if (e->be != cpu) {
                CHECK(e, bad(m[i], cm[i], 0.1 * fabs(g[i]), ulps, "adamw m vs cpu", i));
                CHECK(e, bad(v[i], cv[i], 1e-3 * g[i] * g[i], ulps, "adamw v vs cpu", i));
                CHECK(e, bad(p[i], cp[i], 10 * hp.lr, ulps, "adamw p vs cpu", i));
            }
        }
        dfree(e, d_g, F4(n));
        free(g);
    }
    dfree(e, d_p, F4(n)), dfree(e, d_m, F4(n)), dfree(e, d_v, F4(n));
    free(p), free(m), free(v), free(cp), free(cm), free(cv), free(pd), free(md), free(vd);
}

/* ---- zero, sumsq and copies: s = {n} ---- */

static void run_zero_sumsq(const op_case *c, env *e) {
    const int64_t n = c->s[0];
    float *x = lt_test_fresh(&e->rng, n, 2), *got = malloc(F4(n));
    float *d_x = up(e, x, F4(n)), *d_z = up(e, NULL, F4(n));
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float s1 = e->be->sumsq(e->ctx, d_x, n), s2 = e->be->sumsq(e->ctx, d_x, n);
    CHECK(e, bad(s1, ss, 0, 1e-6, "sumsq", 0));
    CHECK(e, s1 != s2); /* deterministic */
    CHECK(e, bad(e->be->sumsq(e->ctx, d_x + 5, 1), (double)x[5] * x[5], 0, 1e-6, "sumsq 1", 0));
    CHECK(e, e->be->sumsq(e->ctx, d_x, 0) != 0.0f);
    /* a copy within the backend's memory, then zero an odd byte range of it: the bytes around stay */
    assert_int_equal(e->be->copy_to_device(e->ctx, d_z, d_x, F4(n)), LT_OK);
    e->be->zero(e->ctx, (uint8_t *)d_z + 3, 4001);
    down(e, got, d_z, F4(n));
    const uint8_t *b = (const uint8_t *)got, *b0 = (const uint8_t *)x;
    for (size_t i = 0; i < F4(n); i++) CHECK(e, b[i] != (i >= 3 && i < 4004 ? 0 : b0[i]));
    assert_int_equal(e->be->synchronize(e->ctx), LT_OK);
    dfree(e, d_x, F4(n)), dfree(e, d_z, F4(n));
    free(x), free(got);
}

/* ---- to_bf16 / from_bf16: s = {n}: round to nearest even (ties, the largest finite values,
 * infinities; a NaN stays a NaN) and widening back exactly ---- */

static void run_bf16(const op_case *c, env *e) {
    const int64_t n = c->s[0];
    float *x = lt_test_fresh(&e->rng, n, 3), *back = malloc(F4(n));
    uint16_t *h = malloc((size_t)n * 2);
    const uint32_t special[6] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u};
    for (int i = 0; i < 6; i++) memcpy(&x[i], &special[i], 4);
    float *d_x = up(e, x, F4(n)), *d_back = up(e, NULL, F4(n));
    uint16_t *d_h = up(e, NULL, (size_t)n * 2);
    e->be->to_bf16(e->ctx, d_x, d_h, n);
    down(e, h, d_h, (size_t)n * 2);
    for (int64_t i = 0; i < n; i++)
        if (i != 5) CHECK(e, h[i] != lt_f32_to_bf16(x[i]));
    CHECK(e, h[0] != 0x3f80); /* a tie rounds to even: down */
    CHECK(e, h[1] != 0x3f82); /* and up */
    CHECK(e, !((h[5] & 0x7f80) == 0x7f80 && (h[5] & 0x7f)));
    e->be->from_bf16(e->ctx, d_h, d_back, n);
    down(e, back, d_back, F4(n));
    for (int64_t i = 0; i < n; i++) {
        const float w = lt_bf16_to_f32(h[i]);
        CHECK(e, memcmp(&back[i], &w, 4) != 0);
    }
    dfree(e, d_x, F4(n)), dfree(e, d_back, F4(n)), dfree(e, d_h, (size_t)n * 2);
    free(x), free(back), free(h);
}

/* ---- clip_norm (a device-only hook): s = {n}; opt 1: a max_norm below the norm (clips), 0:
 * above (leaves g). Bit for bit what sumsq then scale computes; the sum of squares it copies to
 * pinned memory is sumsq's (before clipping), and max_norm = INFINITY only measures. ---- */

static void run_clip_norm(const op_case *c, env *e) {
    if (!e->be->clip_norm) {
        fprintf(stderr, "    %s: no clip_norm (a device-only hook; the host runs sumsq + scale)\n", e->be->name);
        return;
    }
    const int64_t n = c->s[0];
    float *g = lt_test_fresh(&e->rng, n, 1), *got = malloc(F4(n)), *want = malloc(F4(n));
    float *d_g = up(e, g, F4(n));
    const float ss = e->be->sumsq(e->ctx, d_g, n);
    const double norm = sqrt((double)ss), max_norm = c->opt ? 0.5 * norm : 2 * norm;
    double ref = 0;
    for (int64_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    CHECK(e, bad(norm, sqrt(ref), 0, 1e-6, "clip norm", 0));
    double *host_ss = lt_alloc_pinned(e->ctx, sizeof *host_ss, "clip_norm sum of squares");
    assert_non_null(host_ss);
    *host_ss = -1;
    e->be->clip_norm(e->ctx, d_g, n, max_norm, host_ss);
    down(e, got, d_g, F4(n));        /* waits: the queued copy of the sum of squares has landed too */
    CHECK(e, (float)*host_ss != ss); /* the pre-clip sum, as sumsq rounds it */
    lt_free_pinned(e->ctx, host_ss, sizeof *host_ss);
    /* the trainer's host rule: norm from sumsq's float, then one scale by (float)(max_norm / norm) */
    const float f = (float)(max_norm / norm);
    for (int64_t i = 0; i < n; i++) want[i] = norm > max_norm ? g[i] * f : g[i];
    CHECK(e, memcmp(got, want, F4(n)) != 0);
    /* max_norm = INFINITY measures only: g unchanged, the sum still copied */
    double *pin = lt_alloc_pinned(e->ctx, sizeof *pin, "clip_norm sum of squares");
    assert_non_null(pin);
    *pin = -1;
    e->be->clip_norm(e->ctx, d_g, n, INFINITY, pin);
    assert_int_equal(e->be->synchronize(e->ctx), LT_OK);
    const double ss2 = *pin;
    lt_free_pinned(e->ctx, pin, sizeof *pin);
    down(e, want, d_g, F4(n));
    CHECK(e, memcmp(got, want, F4(n)) != 0);
    CHECK(e, (float)ss2 != e->be->sumsq(e->ctx, d_g, n));
    dfree(e, d_g, F4(n));
    free(g), free(got), free(want);
}

/* ---- attention through lt_attention_*: s = {B, T, H, Hkv}; dt unused; opt: D in bits 0-8,
 * bit 9 packed rows (row 0: an empty first sequence and three more), bit 10 window T/3, bit 11
 * softcap 20, bit 12 q, k, v (and dq, dk, dv) interleaved in one (B, T, H + 2·Hkv, D) buffer
 * (strided layouts). q, k, v in the backend's input dtype (bf16 on CUDA, rounded for the reference). ---- */

/* Host values (rounded to dt) into the backend's dtype. */
static void *to_dtype(const double *x, int64_t n, lt_dtype dt) {
    if (dt == LT_DTYPE_BF16) {
        uint16_t *h = malloc((size_t)n * 2);
        for (int64_t i = 0; i < n; i++) h[i] = lt_f32_to_bf16((float)x[i]);
        return h;
    }
    float *f = malloc(F4(n));
    for (int64_t i = 0; i < n; i++) f[i] = (float)x[i];
    return f;
}
static void from_dtype(const void *src, double *x, int64_t n, lt_dtype dt) {
    for (int64_t i = 0; i < n; i++)
        x[i] = dt == LT_DTYPE_BF16 ? lt_bf16_to_f32(((const uint16_t *)src)[i]) : ((const float *)src)[i];
}
static double *fresh_in(uint64_t *rng, int64_t n, lt_dtype dt) { /* already representable in dt */
    double *x = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        x[i] = lt_test_normal(rng);
        if (dt == LT_DTYPE_BF16) x[i] = lt_test_bf16_round(x[i]);
        else x[i] = (float)x[i];
    }
    return x;
}

static double max_err(const double *got, const double *ref, int64_t n) { return lt_test_rel_err_d(got, ref, n); }

static void run_attention(const op_case *c, env *e) {
    const lt_dtype dt = input_dtype(e->be, PREC_INPUTS);
    const size_t es = dt == LT_DTYPE_BF16 ? 2 : 4;
    lt_ref_attn a = {c->s[0], c->s[1], c->s[2], c->s[3], c->opt & 0x1ff, 0, 0, 0, NULL, 0};
    a.scale = 1.0 / sqrt((double)a.D);
    if (c->opt & (1 << 10)) a.window = a.T / 3;
    if (c->opt & (1 << 11)) a.cap = 20;
    int32_t off[4 * 5];
    if (c->opt & (1 << 9)) {
        for (int64_t b = 0; b < a.B; b++) {
            int32_t *o = off + b * 5;
            o[0] = 0, o[1] = b ? 1 : 0, o[2] = (int32_t)(a.T / 3), o[3] = (int32_t)(a.T / 3 + 1), o[4] = (int32_t)a.T;
        }
        a.off = off, a.S = 4;
    }
    const int64_t nq = a.B * a.T * a.H * a.D, nk = a.B * a.T * a.Hkv * a.D, nl = a.B * a.H * a.T;
    double *q = fresh_in(&e->rng, nq, dt), *k = fresh_in(&e->rng, nk, dt), *v = fresh_in(&e->rng, nk, dt);
    double *g = fresh_in(&e->rng, nq, dt);
    double *o = malloc(sizeof(double) * (size_t)nq), *lse = malloc(sizeof(double) * (size_t)nl);
    double *dq = malloc(sizeof(double) * (size_t)nq), *dk = malloc(sizeof(double) * (size_t)nk);
    double *dv = malloc(sizeof(double) * (size_t)nk);
    lt_ref_attn_forward(&a, q, k, v, o, lse);
    lt_ref_attn_backward(&a, q, k, v, o, lse, g, dq, dk, dv);
    /* the analytic gradient against central differences of the forward, on a few coordinates */
    {
        double *o2 = malloc(sizeof(double) * (size_t)nq), *l2 = malloc(sizeof(double) * (size_t)nl);
        double *xs[3] = {q, k, v}, *gs[3] = {dq, dk, dv};
        const int64_t ns[3] = {nq, nk, nk};
        for (int w = 0; w < 3; w++)
            for (int r = 0; r < 4; r++) {
                const int64_t i = (int64_t)(lt_test_rand_u64(&e->rng) % (uint64_t)ns[w]);
                const double x0 = xs[w][i], h = 1e-5;
                xs[w][i] = x0 + h;
                const double lp = lt_ref_attn_loss(&a, q, k, v, g, o2, l2);
                xs[w][i] = x0 - h;
                const double lm = lt_ref_attn_loss(&a, q, k, v, g, o2, l2);
                xs[w][i] = x0;
                CHECK(e, bad(gs[w][i], (lp - lm) / (2 * h), 1e-3, 1e-5, "attention grad fd", i));
            }
        free(o2), free(l2);
    }
    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = a.B, p.T = a.T, p.H = a.H, p.Hkv = a.Hkv, p.D = a.D, p.dtype = dt, p.device = e->be->device;
    p.window = a.window, p.softcap = (float)a.cap, p.seq_offsets = a.off, p.S = a.S;
    void *hq = to_dtype(q, nq, dt), *hk = to_dtype(k, nk, dt), *hv = to_dtype(v, nk, dt), *hg = to_dtype(g, nq, dt);
    float *P = lt_test_poisoned(nq > nk ? nq : nk);
    const int fused = (c->opt >> 12) & 1;
    const int64_t W3 = a.H + 2 * a.Hkv, nf = a.B * a.T * W3 * a.D;
    uint8_t *hf = NULL, *d_f = NULL, *d_fg = NULL;
    void *d_q, *d_k, *d_v, *d_dq, *d_dk, *d_dv;
    if (fused) { /* one row of a token: H query heads, Hkv key heads, Hkv value heads */
        hf = malloc(es * (size_t)nf);
        const void *src[3] = {hq, hk, hv};
        const int64_t heads[3] = {a.H, a.Hkv, a.Hkv}, at[3] = {0, a.H, a.H + a.Hkv};
        for (int w = 0; w < 3; w++)
            for (int64_t bt = 0; bt < a.B * a.T; bt++)
                memcpy(hf + es * (size_t)((bt * W3 + at[w]) * a.D),
                       (const uint8_t *)src[w] + es * (size_t)(bt * heads[w] * a.D), es * (size_t)(heads[w] * a.D));
        float *Pf = lt_test_poisoned(nf);
        d_f = up(e, hf, es * (size_t)nf), d_fg = up(e, Pf, es * (size_t)nf);
        free(Pf);
        d_q = d_f, d_k = d_f + es * (size_t)(a.H * a.D), d_v = d_f + es * (size_t)((a.H + a.Hkv) * a.D);
        d_dq = d_fg, d_dk = d_fg + es * (size_t)(a.H * a.D), d_dv = d_fg + es * (size_t)((a.H + a.Hkv) * a.D);
        p.q_layout = (lt_attention_layout){a.T * W3 * a.D, W3 * a.D, a.D};
        p.kv_layout = p.q_layout;
    } else {
        d_q = up(e, hq, es * (size_t)nq), d_k = up(e, hk, es * (size_t)nk), d_v = up(e, hv, es * (size_t)nk);
        d_dq = up(e, P, es * (size_t)nq), d_dk = up(e, P, es * (size_t)nk), d_dv = up(e, P, es * (size_t)nk);
    }
    void *d_g = up(e, hg, es * (size_t)nq), *d_o = up(e, P, es * (size_t)nq);
    float *d_lse = up(e, P, F4(nl));
    lt_attention_args args = {d_q, d_k, d_v, d_o, d_lse, d_g, d_dq, d_dk, d_dv, NULL, 0};
    lt_status st = lt_attention_check(e->ctx, &p);
    if (st == LT_ERR_UNSUPPORTED) {
        fprintf(stderr, "    %s: unsupported here: %s\n", e->be->name, lt_ctx_error(e->ctx));
    } else {
        assert_int_equal(st, LT_OK);
        assert_int_equal(lt_attention_forward(e->ctx, &p, &args), LT_OK);
        assert_int_equal(lt_attention_backward(e->ctx, &p, &args), LT_OK);
        void *buf = malloc(es * (size_t)(nq > nk ? nq : nk));
        float *gl = malloc(F4(nl));
        double *got = malloc(sizeof(double) * (size_t)(nq > nl ? (nq > nk ? nq : nk) : nl));
        /* out is rounded to dt; the backward chains two products (dP = dO·Vᵀ, then dS·K) */
        const double tf = lt_test_tol_for(dt, a.T), tb = 2 * lt_test_tol_for(dt, a.T);
        down(e, buf, d_o, es * (size_t)nq), from_dtype(buf, got, nq, dt);
        const double eo = max_err(got, o, nq);
        down(e, gl, d_lse, F4(nl));
        for (int64_t i = 0; i < nl; i++) got[i] = gl[i];
        const double el = max_err(got, lse, nl);
        double eg[3];
        const double *gref[3] = {dq, dk, dv};
        const int64_t heads[3] = {a.H, a.Hkv, a.Hkv}, at[3] = {0, a.H, a.H + a.Hkv};
        uint8_t *fb = fused ? malloc(es * (size_t)nf) : NULL;
        if (fused) down(e, fb, d_fg, es * (size_t)nf);
        for (int w = 0; w < 3; w++) {
            const int64_t n = a.B * a.T * heads[w] * a.D;
            if (fused) {
                for (int64_t bt = 0; bt < a.B * a.T; bt++)
                    memcpy((uint8_t *)buf + es * (size_t)(bt * heads[w] * a.D),
                           fb + es * (size_t)((bt * W3 + at[w]) * a.D), es * (size_t)(heads[w] * a.D));
            } else {
                down(e, buf, w == 0 ? d_dq : w == 1 ? d_dk : d_dv, es * (size_t)n);
            }
            from_dtype(buf, got, n, dt);
            eg[w] = max_err(got, gref[w], n);
        }
        free(fb);
        const double eq = eg[0], ek = eg[1], ev = eg[2];
        fprintf(stderr, "    out %.2e lse %.2e (tol %.2e) dq %.2e dk %.2e dv %.2e (tol %.2e)\n", eo, el, tf, eq, ek, ev,
                tb);
        CHECK(e, !(eo <= tf && el <= tf && eq <= tb && ek <= tb && ev <= tb));
        free(buf), free(gl), free(got);
    }
    if (fused) {
        dfree(e, d_f, es * (size_t)nf), dfree(e, d_fg, es * (size_t)nf);
    } else {
        dfree(e, d_q, es * (size_t)nq), dfree(e, d_k, es * (size_t)nk), dfree(e, d_v, es * (size_t)nk);
        dfree(e, d_dq, es * (size_t)nq), dfree(e, d_dk, es * (size_t)nk), dfree(e, d_dv, es * (size_t)nk);
    }
    dfree(e, d_g, es * (size_t)nq), dfree(e, d_o, es * (size_t)nq), dfree(e, d_lse, F4(nl));
    free(q), free(k), free(v), free(g), free(o), free(lse), free(dq), free(dk), free(dv);
    free(hq), free(hk), free(hv), free(hg), free(P), free(hf);
}

/* ---- the fused loss through lt_lce_*: s = {N, C, V}; dt: the head's dtype; opt: bits 0-1 the
 * reduction (lt_reduction), bit 2 label smoothing 0.1, bit 3 z-loss 0.01, bit 4 softcap 30, bit 5
 * per-token weights. h holds values of the backend's input dtype (f32 storage), every 7th target
 * is ignored. Checked: loss, the lse of kept tokens and dh against float64, dh's rows of ignored
 * tokens exactly zero, the analytic dh against central differences of the float64 loss, and
 * lt_lce_forward_backward against the same references. ---- */

static void run_lce(const op_case *c, env *e) {
    /* opt bit 64: bf16 products (the CPU's one-pass forward_backward on a bf16 or block-format head
     * rounds h, the head's tiles and the logit weights to bf16, as the CUDA loss does): checked with
     * the bf16-derived tolerance */
    const int bf16x = (c->opt & 64) != 0;
    const int cpu_bf16x =
        bf16x && e->be->device == LT_DEVICE_CPU && LT_HAVE_ONEDNN && c->dt != LT_DTYPE_F32 && c->dt != LT_DTYPE_F16;
    const lt_dtype dt = cpu_bf16x ? LT_DTYPE_BF16 : input_dtype(e->be, PREC_INPUTS);
    const int64_t N = c->s[0], C = c->s[1], V = c->s[2];
    lt_ref_lce_opts o = {(lt_reduction)(c->opt & 3), c->opt & 4 ? 0.1 : 0, c->opt & 8 ? 0.01 : 0, c->opt & 16 ? 30 : 0,
                         NULL};
    const int64_t nloss = o.red == LT_REDUCTION_NONE ? N : 1;
    double *hd = fresh_in(&e->rng, N * C, dt), *wd = malloc(sizeof(double) * (size_t)(V * C));
    /* the head: fresh values scaled to keep logits O(1), stored in c->dt; the reference uses the
     * exact stored values */
    float *wf = malloc(F4(V * C));
    for (int64_t i = 0; i < V * C; i++) wf[i] = (float)(0.1 * lt_test_normal(&e->rng));
    const size_t rb = (size_t)lt_dtype_row_bytes(c->dt, C), wb = rb * (size_t)V;
    uint8_t *wq = malloc(wb);
    for (int64_t r = 0; r < V; r++) {
        uint8_t *row = wq + rb * (size_t)r;
        if (c->dt == LT_DTYPE_F32) memcpy(row, wf + r * C, F4(C));
        else if (c->dt == LT_DTYPE_BF16)
            for (int64_t k = 0; k < C; k++) ((uint16_t *)row)[k] = lt_f32_to_bf16(wf[r * C + k]);
        else lt_quantize_row(c->dt, wf + r * C, row, C);
        lt_dequantize_row(c->dt, row, wf + r * C, C);
        for (int64_t k = 0; k < C; k++) wd[r * C + k] = wf[r * C + k];
    }
    int32_t *tgt = malloc((size_t)N * 4);
    float *twf = malloc(F4(N)), *dlf = malloc(F4(nloss));
    double *tw = malloc(sizeof(double) * (size_t)N), *dl = malloc(sizeof(double) * (size_t)nloss);
    for (int64_t i = 0; i < N; i++) {
        tgt[i] = i % 7 == 3 ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&e->rng) % (uint64_t)V);
        twf[i] = (float)lt_test_uniform(&e->rng, 0.25, 2.0), tw[i] = twf[i];
    }
    for (int64_t i = 0; i < nloss; i++)
        dlf[i] = nloss > 1 ? (float)lt_test_uniform(&e->rng, 0.5, 1.5) : 1.0f, dl[i] = dlf[i];
    if (c->opt & 32) o.tw = tw;
    double *loss = malloc(sizeof(double) * (size_t)nloss), *lse = malloc(sizeof(double) * (size_t)N);
    double *dh = malloc(sizeof(double) * (size_t)(N * C)), *l2 = malloc(sizeof(double) * (size_t)nloss);
    lt_ref_lce(hd, wd, tgt, N, C, V, &o, dl, loss, lse, dh);
    for (int r = 0; r < 6; r++) { /* the analytic dh against central differences of the loss */
        const int64_t i = (int64_t)(lt_test_rand_u64(&e->rng) % (uint64_t)(N * C));
        const double x0 = hd[i], st = 1e-5;
        hd[i] = x0 + st;
        const double lp = lt_ref_lce(hd, wd, tgt, N, C, V, &o, dl, l2, NULL, NULL);
        hd[i] = x0 - st;
        const double lm = lt_ref_lce(hd, wd, tgt, N, C, V, &o, dl, l2, NULL, NULL);
        hd[i] = x0;
        CHECK(e, bad(dh[i], (lp - lm) / (2 * st), 1e-3, 1e-5, "lce dh fd", i));
    }
    float *hf = malloc(F4(N * C)), *Pn = lt_test_poisoned(N * C);
    for (int64_t i = 0; i < N * C; i++) hf[i] = (float)hd[i];
    float *d_h = up(e, hf, F4(N * C)), *d_dh = up(e, Pn, F4(N * C)), *d_lse = up(e, Pn, F4(N));
    float *d_loss = up(e, Pn, F4(nloss)), *d_dl = up(e, dlf, F4(nloss)), *d_tw = up(e, twf, F4(N));
    void *d_w = up(e, wq, wb);
    int32_t *d_t = up(e, tgt, (size_t)N * 4);
    int64_t hs[2] = {N, C}, wsh[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(d_dh, LT_DTYPE_F32, e->be->device, 2, hs);
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    a.h = lt_tensor_view(d_h, LT_DTYPE_F32, e->be->device, 2, hs);
    a.w = lt_tensor_view(d_w, c->dt, e->be->device, 2, wsh);
    a.targets = d_t, a.loss = d_loss, a.lse = d_lse, a.dloss = d_dl, a.dh = &tdh;
    a.token_weight = o.tw ? d_tw : NULL;
    lt_lce_options opt;
    memset(&opt, 0, sizeof opt);
    opt.reduction = o.red, opt.label_smoothing = (float)o.eps, opt.z_loss = (float)o.zl, opt.softcap = (float)o.cap;
    opt.bf16_products = bf16x;
    lt_status st = lt_lce_forward(e->ctx, &opt, &a);
    if (st == LT_ERR_UNSUPPORTED) {
        fprintf(stderr, "    %s: unsupported here: %s\n", e->be->name, lt_ctx_error(e->ctx));
    } else {
        assert_int_equal(st, LT_OK);
        assert_int_equal(lt_lce_backward(e->ctx, &opt, &a), LT_OK);
        float *gloss = malloc(F4(nloss)), *glse = malloc(F4(N)), *gdh = malloc(F4(N * C));
        double *got = malloc(sizeof(double) * (size_t)(N * C)), *lref = malloc(sizeof(double) * (size_t)N);
        const double tf = lt_test_tol_for(dt, C), tb = 2 * lt_test_tol_for(dt, V);
        double err[6];
        float *gdh0 = malloc(F4(N * C));       /* the two calls' dh: f32 products whatever bf16_products says */
        for (int pass = 0; pass < 2; pass++) { /* two calls, then forward_backward */
            if (pass) {
                assert_int_equal(e->be->copy_to_device(e->ctx, d_dh, Pn, F4(N * C)), LT_OK);
                assert_int_equal(lt_lce_forward_backward(e->ctx, &opt, &a), LT_OK);
            }
            down(e, gloss, d_loss, F4(nloss)), down(e, glse, d_lse, F4(N)), down(e, gdh, d_dh, F4(N * C));
            for (int64_t i = 0; i < nloss; i++) got[i] = gloss[i];
            err[pass * 3] = max_err(got, loss, nloss);
            for (int64_t i = 0; i < N; i++) /* the lse of ignored tokens is not compared */
                got[i] = tgt[i] == LT_IGNORE_INDEX ? 0 : glse[i], lref[i] = tgt[i] == LT_IGNORE_INDEX ? 0 : lse[i];
            err[pass * 3 + 1] = max_err(got, lref, N);
            for (int64_t i = 0; i < N * C; i++) got[i] = gdh[i];
            err[pass * 3 + 2] = max_err(got, dh, N * C);
            if (!pass) memcpy(gdh0, gdh, F4(N * C));
            else if (cpu_bf16x) CHECK(e, memcmp(gdh0, gdh, F4(N * C)) == 0); /* the bf16 products ran */
            for (int64_t i = 0; i < N; i++)
                for (int64_t k = 0; k < C && tgt[i] == LT_IGNORE_INDEX; k++) CHECK(e, gdh[i * C + k] != 0);
        }
        fprintf(stderr,
                "    loss %.2e lse %.2e (tol %.2e) dh %.2e (tol %.2e); forward_backward loss %.2e lse %.2e"
                " dh %.2e\n",
                err[0], err[1], tf, err[2], tb, err[3], err[4], err[5]);
        for (int pass = 0; pass < 2; pass++)
            CHECK(e, !(err[pass * 3] <= tf && err[pass * 3 + 1] <= tf && err[pass * 3 + 2] <= tb));
        free(gloss), free(glse), free(gdh), free(got), free(lref), free(gdh0);
    }
    dfree(e, d_h, F4(N * C)), dfree(e, d_dh, F4(N * C)), dfree(e, d_lse, F4(N)), dfree(e, d_loss, F4(nloss));
    dfree(e, d_dl, F4(nloss)), dfree(e, d_tw, F4(N)), dfree(e, d_w, wb), dfree(e, d_t, (size_t)N * 4);
    free(hd), free(wd), free(wf), free(wq), free(tgt), free(twf), free(dlf), free(tw), free(dl), free(loss), free(lse);
    free(dh), free(l2), free(hf), free(Pn);
}

/* ---- the matrix ---- */

#define NT 0
#define NN 1
#define ACC 2
#define BF16X 4
#define ATTN(D, packed, window, cap) ((D) | (packed) << 9 | (window) << 10 | (cap) << 11)
#define FUSED (1 << 12)

static const op_case cases[] = {
    /* gemm {M, N, K, pad}, beta·2: a generic shape, the thin LoRA shapes (one side or the inner
     * dimension <= 16) at ranks 8 and 13 with 16-byte-aligned (pad 0, 4) and 4-byte-aligned
     * (pad 1, 3) operands and padded leading dimensions, K = 0 */
    {"gemm", run_gemm, {37, 29, 53, 0}, 0, 1},
    {"gemm", run_gemm, {37, 29, 53, 1}, 0, 2},
    {"gemm", run_gemm, {70, 8, 53, 3}, 0, 1},
    {"gemm", run_gemm, {70, 13, 100, 2}, 0, 1},
    {"gemm", run_gemm, {8, 83, 130, 0}, 0, 1},
    {"gemm", run_gemm, {16, 16, 17, 1}, 0, 1},
    {"gemm", run_gemm, {3, 5, 2, 0}, 0, 1},
    {"gemm", run_gemm, {130, 16, 7, 0}, 0, 1},
    {"gemm", run_gemm, {11, 40, 300, 1}, 0, 1},
    {"gemm", run_gemm, {45, 83, 8, 0}, 0, 1},
    {"gemm", run_gemm, {21, 40, 16, 0}, 0, 1},
    {"gemm", run_gemm, {8, 300, 1000, 0}, 0, 2},
    {"gemm", run_gemm, {333, 8, 1060, 0}, 0, 1}, /* lu = x·Aᵀ, dlu = dy·B */
    {"gemm", run_gemm, {333, 13, 1060, 4}, 0, 1},
    {"gemm", run_gemm, {8, 300, 2100, 4}, 0, 2}, /* dA += dluᵀ·x */
    {"gemm", run_gemm, {13, 300, 2100, 0}, 0, 2},
    {"gemm", run_gemm, {260, 8, 2100, 4}, 0, 1}, /* dB = dyᵀ·lu */
    {"gemm", run_gemm, {260, 13, 2100, 0}, 0, 1},
    {"gemm", run_gemm, {333, 300, 8, 4}, 0, 2}, /* y += lu·Bᵀ, dx = dlu·A */
    {"gemm", run_gemm, {333, 300, 13, 0}, 0, 2},
    {"gemm", run_gemm, {100, 8, 1000, 1}, 0, 1}, /* unaligned */
    {"gemm", run_gemm, {5, 7, 0, 0}, 0, 1},      /* K = 0: C = beta·C */
    /* matmul {out, in, N}: every weight dtype both ways (out not a multiple of a tile, N not of a
     * chunk), accumulating on half; two weight tiles; one row; two chunks of x rows */
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_F32, NT},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_F32, NN | ACC},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_BF16, NT | ACC},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_BF16, NN},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_F16, NT},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_F16, NN | ACC},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q8_0, NT | ACC},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q8_0, NN},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q4_0, NT},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q4_0, NN | ACC},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q4_1, NT | ACC},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q4_1, NN},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_INT4_G64, NT},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_INT4_G64, NN | ACC},
    {"matmul", run_matmul, {150, 128, 70}, LT_DTYPE_INT4_G64, NT | ACC},
    {"matmul", run_matmul, {16512, 4096, 3}, LT_DTYPE_Q4_0, NT}, /* two weight tiles */
    {"matmul", run_matmul, {16512, 4096, 3}, LT_DTYPE_Q4_0, NN | ACC},
    {"matmul", run_matmul, {200, 256, 1}, LT_DTYPE_Q4_1, NT}, /* one row */
    {"matmul", run_matmul, {200, 256, 1}, LT_DTYPE_BF16, NN | ACC},
    {"matmul", run_matmul, {96, 64, 8201}, LT_DTYPE_BF16, NT | ACC}, /* two chunks of x */
    /* the run's bf16 products (the CPU through oneDNN) */
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_BF16, NT | ACC | BF16X},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_BF16, NN | BF16X},
    {"matmul", run_matmul, {576, 1536, 512}, LT_DTYPE_BF16, NT | BF16X},
    {"matmul", run_matmul, {576, 1536, 512}, LT_DTYPE_BF16, NN | ACC | BF16X},
    {"matmul", run_matmul, {200, 256, 1}, LT_DTYPE_BF16, NN | ACC | BF16X}, /* one row */
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_Q4_1, NT | BF16X},      /* W dequantized and rounded first */
    {"matmul", run_matmul, {512, 256, 70}, LT_DTYPE_Q4_K, NN | ACC | BF16X},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_F16, NT | BF16X},
    {"matmul", run_matmul, {150, 192, 70}, LT_DTYPE_F32, NT | BF16X}, /* f32 and fp8 keep their products */
    {"matmul", run_matmul, {160, 192, 70}, LT_DTYPE_FP8, NN | BF16X},
    {"matmul", run_matmul, {96, 64, 8201}, LT_DTYPE_Q8_0, NN},
    /* fp8: e4m3 W with row scales, x rounded per row (sides multiples of 16, as the load requires) */
    {"matmul", run_matmul, {160, 192, 70}, LT_DTYPE_FP8, NT},
    {"matmul", run_matmul, {160, 192, 70}, LT_DTYPE_FP8, NN | ACC},
    {"matmul", run_matmul, {96, 64, 8201}, LT_DTYPE_FP8, NT | ACC}, /* two chunks of x */
    {"matmul", run_matmul, {64, 96, 8201}, LT_DTYPE_FP8, NN},
    /* lora_fwd + lora_bwd {G, in, n, r} of lora_rows[opt] */
    {"lora", run_lora, {3, 64, 37, 4}, LT_DTYPE_F32, 0},
    {"lora", run_lora, {3, 64, 37, 4}, LT_DTYPE_F32, 1},
    {"lora", run_lora, {1, 96, 29, 8}, LT_DTYPE_BF16, 2},
    {"lora", run_lora, {1, 96, 29, 8}, LT_DTYPE_BF16, 3},
    {"lora", run_lora, {2, 32, 17, 3}, LT_DTYPE_F32, 4},
    {"lora", run_lora, {3, 256, 1100, 8}, LT_DTYPE_BF16, 5},
    {"lora", run_lora, {3, 256, 1100, 8}, LT_DTYPE_BF16, 6},
    {"lora", run_lora, {1, 128, 1030, 16}, LT_DTYPE_BF16, 7},
    {"lora", run_lora, {1, 128, 1030, 16}, LT_DTYPE_BF16, 8},
    {"lora", run_lora, {2, 128, 700, 4}, LT_DTYPE_F32, 9},
    {"lora", run_lora, {2, 64, 300, 6}, LT_DTYPE_BF16, 10},
    {"lora", run_lora, {1, 36, 200, 8}, LT_DTYPE_F32, 11},
    {"lora", run_lora, {1, 64, 500, 8}, LT_DTYPE_BF16, 12},
    {"lora", run_lora, {2, 72, 90, 8}, LT_DTYPE_F32, 13},
    {"lora", run_lora, {3, 2048, 40, 8}, LT_DTYPE_F32, 14},
    {"lora", run_lora, {2, 1024, 300, 8}, LT_DTYPE_BF16, 15},
    {"lora", run_lora, {1, 640, 333, 12}, LT_DTYPE_BF16, 16},
    {"lora", run_lora, {2, 128, 333, 16}, LT_DTYPE_BF16, 17},
    {"lora", run_lora, {1, 1024, 300, 16}, LT_DTYPE_BF16, 18},
    {"lora", run_lora, {3, 256, 200, 8}, LT_DTYPE_BF16, 19},
    {"lora", run_lora, {3, 2048, 3456, 8}, LT_DTYPE_BF16, 20},
    /* rmsnorm {N, C}: C = 1000 and 128 (the per-head norm) row-aligned, 998 not, 40 small */
    {"rmsnorm", run_rmsnorm, {9, 40}, 0, 0},
    {"rmsnorm", run_rmsnorm, {70, 1000}, 0, 0},
    {"rmsnorm", run_rmsnorm, {70, 998}, 0, 0},
    {"rmsnorm", run_rmsnorm, {300, 128}, 0, 0},
    /* rope {N, heads, D, positions}: short and long-context angles (up to 3e5 rad) */
    {"rope", run_rope, {11, 3, 32, 5000}, 0, 0},
    {"rope", run_rope, {37, 5, 128, 300000}, 0, 0},
    {"rope", run_rope, {9, 2, 64, 131072}, 0, 0},
    /* swiglu {n}: odd lengths and one the vectorised path takes whole */
    {"swiglu", run_swiglu, {10007}, 0, 0},
    {"swiglu", run_swiglu, {100003}, 0, 0},
    {"swiglu", run_swiglu, {100000}, 0, 0},
    /* geglu {n}: odd lengths */
    {"geglu", run_geglu, {10007}, 0, 0},
    {"geglu", run_geglu, {100003}, 0, 0},
    {"geglu", run_geglu, {100000}, 0, 0},
    /* embedding {V, C, N}: every table dtype, bit-identical rows */
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_F32, 0},
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_BF16, 0},
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_F16, 0},
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_Q8_0, 0},
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_Q4_0, 0},
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_Q4_1, 0},
    {"embedding", run_embedding, {300, 576, 41}, LT_DTYPE_INT4_G64, 0},
    {"embedding", run_embedding, {50, 64, 23}, LT_DTYPE_Q8_0, 0},
    /* add, add_bias, scale {N, C} */
    {"add_bias_scale", run_add_bias_scale, {67, 300}, 0, 0},
    {"add_bias_scale", run_add_bias_scale, {23, 64}, 0, 0},
    {"add_bias_scale", run_add_bias_scale, {7, 33}, 0, 0}, /* odd length: the CUDA add's scalar loop */
    /* dropout {n} */
    {"dropout", run_dropout, {200003}, 0, 0},
    /* adamw {n, steps} */
    {"adamw", run_adamw, {5003, 3}, 0, 0},
    {"adamw", run_adamw, {50003, 5}, 0, 0},
    /* zero, sumsq, copies {n}: several parallel chunks, not a multiple of any */
    {"zero_sumsq", run_zero_sumsq, {100003}, 0, 0},
    {"zero_sumsq", run_zero_sumsq, {1000003}, 0, 0},
    /* to_bf16 / from_bf16 {n} */
    {"bf16", run_bf16, {70001}, 0, 0},
    {"bf16", run_bf16, {1000003}, 0, 0},
    /* clip_norm {n}: opt 1 clips, 0 leaves g */
    {"clip_norm", run_clip_norm, {100003}, 0, 1},
    {"clip_norm", run_clip_norm, {100003}, 0, 0},
    /* attention {B, T, H, Hkv}, D and options in opt */
    {"attention", run_attention, {2, 77, 4, 2}, 0, ATTN(64, 1, 0, 0)},
    {"attention", run_attention, {1, 130, 4, 4}, 0, ATTN(128, 0, 1, 0)},
    {"attention", run_attention, {1, 96, 6, 2}, 0, ATTN(96, 0, 0, 1)},
    {"attention", run_attention, {1, 40, 2, 1}, 0, ATTN(64, 1, 1, 1)},
    {"attention", run_attention, {2, 200, 4, 2}, 0, ATTN(64, 0, 0, 0)},
    {"attention", run_attention, {1, 333, 8, 2}, 0, ATTN(128, 0, 1, 1)},
    {"attention", run_attention, {1, 130, 2, 2}, 0, ATTN(128, 1, 1, 0) | FUSED},
    {"attention", run_attention, {2, 96, 4, 2}, 0, ATTN(64, 0, 0, 1) | FUSED},
    /* the fused loss {N, C, V}, head dtype; opt: reduction | 4 smoothing | 8 z-loss | 16 softcap |
     * 32 token weights */
    {"lce", run_lce, {61, 128, 1000}, LT_DTYPE_BF16, LT_REDUCTION_MEAN},
    {"lce", run_lce, {40, 64, 300}, LT_DTYPE_BF16, LT_REDUCTION_SUM | 32},
    {"lce", run_lce, {33, 128, 500}, LT_DTYPE_Q8_0, LT_REDUCTION_MEAN},
    {"lce", run_lce, {45, 64, 700}, LT_DTYPE_BF16, LT_REDUCTION_NONE},
    {"lce", run_lce, {50, 128, 600}, LT_DTYPE_BF16, LT_REDUCTION_MEAN | 4 | 8},
    {"lce", run_lce, {37, 64, 400}, LT_DTYPE_BF16, LT_REDUCTION_MEAN | 16 | 32},
    {"lce", run_lce, {29, 128, 350}, LT_DTYPE_Q4_1, LT_REDUCTION_SUM | 4 | 16},
    /* bf16 products: tiles of 512 with a short last one in both directions, z-loss and label
     * smoothing (one pass), token weights, a q8_0 head (its tiles dequantized and rounded) */
    {"lce", run_lce, {700, 96, 1100}, LT_DTYPE_BF16, LT_REDUCTION_MEAN | 64},
    {"lce", run_lce, {45, 64, 700}, LT_DTYPE_BF16, LT_REDUCTION_SUM | 4 | 8 | 32 | 64},
    {"lce", run_lce, {33, 128, 500}, LT_DTYPE_Q8_0, LT_REDUCTION_MEAN | 64},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* One cmocka test per (case, backend). */
typedef struct cell {
    const op_case *c;
    lt_device dev;
    uint64_t seed;
    char name[128];
} cell;

static void run_cell(void **state) {
    const cell *k = *state;
    env e = {lt_backend_get(k->dev), lt_ctx_new(), k->seed, 0};
    assert_non_null(e.be);
    k->c->run(k->c, &e);
    /* nothing of the op (workspaces included) is left allocated */
    assert_int_equal(lt_mem_get_stats(e.ctx, k->dev).used_bytes, 0);
    lt_ctx_free(e.ctx);
    if (e.failures) fprintf(stderr, "    %lld checks failed\n", (long long)e.failures);
    assert_int_equal(e.failures, 0);
}

static void describe(const op_case *c, const char *be, char *out, size_t n) {
    int w = snprintf(out, n, "%s/%s", be, c->op);
    if (c->run == run_gemm) {
        snprintf(out + w, n - (size_t)w, " %lldx%lldx%lld pad %lld beta %g", (long long)c->s[0], (long long)c->s[1],
                 (long long)c->s[2], (long long)c->s[3], c->opt * 0.5);
        return;
    }
    for (int i = 0; i < 4 && c->s[i]; i++)
        w += snprintf(out + w, n - (size_t)w, "%s%lld", i ? "x" : " ", (long long)c->s[i]);
    if (c->dt != LT_DTYPE_F32 || c->run == run_matmul || c->run == run_embedding)
        w += snprintf(out + w, n - (size_t)w, " %s", lt_dtype_name(c->dt));
    if (c->run == run_attention)
        snprintf(out + w, n - (size_t)w, " D%d%s%s%s%s", c->opt & 0x1ff, c->opt & 1 << 9 ? " packed" : "",
                 c->opt & 1 << 10 ? " window" : "", c->opt & 1 << 11 ? " softcap" : "",
                 c->opt & 1 << 12 ? " fused-qkv" : "");
    else if (c->opt) snprintf(out + w, n - (size_t)w, " opt %d", c->opt);
}

int main(void) {
    const uint64_t seed = lt_test_seed();
    lt_device devs[2] = {LT_DEVICE_CPU, LT_DEVICE_CUDA};
    int ndev = 1;
    if (lt_backend_get(LT_DEVICE_CUDA) && lt_sys_cuda().count > 0) ndev = 2;
    else printf("cuda: skipped: no CUDA device%s\n", LT_HAVE_CUDA ? "" : " (this build has no CUDA)");
    static cell cells[2 * NCASES];
    static struct CMUnitTest tests[2 * NCASES];
    size_t nt = 0;
    for (int d = 0; d < ndev; d++)
        for (size_t i = 0; i < NCASES; i++) {
            cell *k = &cells[nt];
            k->c = &cases[i], k->dev = devs[d], k->seed = seed + i;
            describe(k->c, d ? "cuda" : "cpu", k->name, sizeof k->name);
            tests[nt] = (struct CMUnitTest){k->name, run_cell, NULL, NULL, k};
            nt++;
        }
    /* LONGTUNE_OPS_FILTER="cuda/matmul*" runs the matching cells only (cmocka's glob) */
    const char *filter = getenv("LONGTUNE_OPS_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return _cmocka_run_group_tests("backend_ops", tests, nt, NULL, NULL);
}
