/* The CPU backend's compute ops against float64 references on fresh random inputs (poisoned
 * outputs, odd shapes that do not divide the tiles), and every backward against central finite
 * differences of the float64 reference forward. Called through the op table, as the model does. */
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
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "model/model_internal.h"

static const lt_backend *be(void) { return lt_backend_get(LT_DEVICE_CPU); }

/* Every transpose combination, at a generic shape and at the thin ones of the LoRA adapters (one
 * side or the inner dimension <= 16, which the CPU backend runs outside OpenBLAS), with padded leading dimensions and beta
 * 0 (C poisoned: it must be overwritten) or 0.5. */
static void gemm_matches_float64(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    static const int64_t shapes[][3] = {{37, 29, 53}, {70, 8, 53},  {70, 13, 100}, {8, 83, 130}, {16, 16, 17},
                                        {3, 5, 2},    {130, 16, 7}, {11, 40, 300}, {45, 83, 8},  {21, 40, 16}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bz = 0; bz < 2; bz++) {
                    const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                    const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 1, ldc = N + 2;
                    const float beta = bz ? 0.0f : 0.5f;
                    float *A = lt_test_fresh(&rng, (ta ? K : M) * lda, 1), *B = lt_test_fresh(&rng, (tb ? N : K) * ldb, 1);
                    float *C = lt_test_fresh(&rng, M * ldc, 1);
                    if (bz)
                        for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;
                    float *C0 = malloc((size_t)(M * ldc) * 4);
                    memcpy(C0, C, (size_t)(M * ldc) * 4);
                    be()->gemm(ctx, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, beta, C, ldc);
                    for (int64_t i = 0; i < M; i++) {
                        for (int64_t j = 0; j < N; j++) {
                            double sum = 0, sa = 0;
                            for (int64_t k = 0; k < K; k++) {
                                double a = ta ? A[k * lda + i] : A[i * lda + k], b = tb ? B[j * ldb + k] : B[k * ldb + j];
                                sum += a * b;
                                sa += fabs(a * b);
                            }
                            const double want = 0.75 * sum + (bz ? 0.0 : 0.5 * C0[i * ldc + j]);
                            lt_test_close_to(C[i * ldc + j], want, sa + fabs(want), 1e-5, "gemm", i * ldc + j);
                        }
                        for (int64_t j = N; j < ldc; j++) /* the padding is not C's */
                            assert_memory_equal(&C[i * ldc + j], &C0[i * ldc + j], 4);
                    }
                    free(A), free(B), free(C), free(C0);
                }
    lt_ctx_free(ctx);
}

static void matmul_every_weight_dtype(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 1;
    lt_ctx *ctx = lt_ctx_new();
    const lt_dtype types[] = {LT_DTYPE_F32, LT_DTYPE_BF16, LT_DTYPE_F16, LT_DTYPE_Q8_0,
                              LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    int64_t out = 150, in = 128, N = 70; /* out is not a multiple of the tile, N not of the row chunk */
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        lt_dtype dt = types[ti];
        float *wf = lt_test_fresh(&rng, out * in, 0.5f), *wd = malloc((size_t)(out * in) * 4);
        size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
        uint8_t *wq = malloc(rb * (size_t)out);
        for (int64_t r = 0; r < out; r++) {
            uint8_t *row = wq + rb * (size_t)r;
            if (dt == LT_DTYPE_F32) memcpy(row, wf + r * in, rb);
            else if (dt == LT_DTYPE_BF16)
                for (int64_t c = 0; c < in; c++) ((uint16_t *)row)[c] = lt_f32_to_bf16(wf[r * in + c]);
            else if (dt == LT_DTYPE_F16)
                for (int64_t c = 0; c < in; c++) ((uint16_t *)row)[c] = lt_f32_to_f16(wf[r * in + c]);
            else lt_quantize_row(dt, wf + r * in, row, in);
            lt_dequantize_row(dt, row, wd + r * in, in); /* the exact weights the op must use */
        }
        int64_t shape[2] = {out, in};
        lt_tensor w = lt_tensor_view(wq, dt, LT_DEVICE_CPU, 2, shape);
        size_t wsb = be()->matmul_workspace_bytes(dt, out, in, N, lt_ctx_threads(ctx));
        void *ws = wsb ? lt_alloc(ctx, LT_DEVICE_CPU, wsb, "ws") : NULL;
        for (int mode = 0; mode < 2; mode++) {
            int64_t xin = mode == LT_MATMUL_NT ? in : out, yout = mode == LT_MATMUL_NT ? out : in;
            float *x = lt_test_fresh(&rng, N * xin, 1), *y = lt_test_poisoned(N * yout);
            float beta = 0;
            if (ti % 2) { /* accumulate into a fresh y on half the dtypes */
                lt_test_fill_normal(&rng, y, N * yout, 1);
                beta = 1;
            }
            float *y0 = malloc((size_t)(N * yout) * 4);
            memcpy(y0, y, (size_t)(N * yout) * 4);
            be()->matmul(ctx, (lt_matmul_mode)mode, &w, x, N, beta, y, ws);
            for (int64_t n = 0; n < N; n++)
                for (int64_t j = 0; j < yout; j++) {
                    double s = 0, sa = 0;
                    for (int64_t k = 0; k < xin; k++) {
                        double wv = mode == LT_MATMUL_NT ? wd[j * in + k] : wd[k * in + j];
                        s += x[n * xin + k] * wv;
                        sa += fabs(x[n * xin + k] * wv);
                    }
                    lt_test_close_to(y[n * yout + j], s + (beta != 0.0f ? y0[n * yout + j] : 0), sa, 1e-5, lt_dtype_name(dt),
                             n * yout + j);
                }
            if (mode == LT_MATMUL_NT) { /* the shared-input flag changes nothing on the host */
                float *y2 = malloc((size_t)(N * yout) * 4);
                memcpy(y2, y0, (size_t)(N * yout) * 4);
                be()->matmul(ctx, LT_MATMUL_NT_SAME_X, &w, x, N, beta, y2, ws);
                assert_memory_equal(y2, y, (size_t)(N * yout) * 4);
                free(y2);
            }
            free(x), free(y), free(y0);
        }
        if (ws) lt_free(ctx, LT_DEVICE_CPU, ws, wsb);
        free(wf), free(wd), free(wq);
    }
    lt_ctx_free(ctx);
}

static double rms_ref(const double *x, const float *w, double eps, int64_t C, int64_t c) {
    double ss = 0;
    for (int64_t k = 0; k < C; k++) ss += x[k] * x[k];
    return w[c] * x[c] / sqrt(ss / (double)C + eps);
}

static void rmsnorm_forward_and_backward(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 2;
    lt_ctx *ctx = lt_ctx_new();
    int64_t N = 9, C = 40;
    float eps = 1e-5f;
    float *x = lt_test_fresh(&rng, N * C, 1.5f), *w = lt_test_fresh(&rng, C, 1), *dy = lt_test_fresh(&rng, N * C, 1);
    float *y = lt_test_poisoned(N * C), *r = lt_test_poisoned(N), *dx = lt_test_poisoned(N * C), *dw = calloc((size_t)C, 4);
    be()->rmsnorm_fwd(ctx, x, w, eps, N, C, y, r);
    be()->rmsnorm_bwd(ctx, dy, x, w, r, N, C, dx, dw);
    double *xd = malloc((size_t)C * 8);
    for (int64_t n = 0; n < N; n++) {
        for (int64_t c = 0; c < C; c++) xd[c] = x[n * C + c];
        for (int64_t c = 0; c < C; c++) lt_test_close_to(y[n * C + c], rms_ref(xd, w, eps, C, c), 0, 1e-5, "rms y", c);
        /* d/dx_c of Σ_k dy_k·y_k, central differences in float64 */
        for (int64_t c = 0; c < C; c++) {
            double h = 1e-6, lp = 0, lm = 0;
            xd[c] += h;
            for (int64_t k = 0; k < C; k++) lp += dy[n * C + k] * rms_ref(xd, w, eps, C, k);
            xd[c] -= 2 * h;
            for (int64_t k = 0; k < C; k++) lm += dy[n * C + k] * rms_ref(xd, w, eps, C, k);
            xd[c] += h;
            lt_test_close_to(dx[n * C + c], (lp - lm) / (2 * h), 1e-3, 1e-4, "rms dx", n * C + c);
        }
    }
    for (int64_t c = 0; c < C; c++) {
        double s = 0;
        for (int64_t n = 0; n < N; n++) s += dy[n * C + c] * x[n * C + c] * (double)r[n];
        lt_test_close_to(dw[c], s, 1e-3, 1e-5, "rms dw", c);
    }
    free(x), free(w), free(dy), free(y), free(r), free(dx), free(dw), free(xd);
    lt_ctx_free(ctx);
}

static void rope_forward_inverse_and_llama3_table(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 3;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.D = 32;
    cfg.rope_theta = 500000.0;
    cfg.rope_llama3 = 1;
    cfg.rope_factor = 8;
    cfg.rope_low_freq = 1;
    cfg.rope_high_freq = 4;
    cfg.rope_original_ctx = 64; /* small so all three bands appear at D = 32 */
    float inv[16], plain[16];
    lt_model_rope_inv_freq(&cfg, inv);
    cfg.rope_llama3 = 0;
    lt_model_rope_inv_freq(&cfg, plain);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 16; i++) {
        double f = pow(500000.0, -2.0 * i / 32.0), wl = 2 * 3.14159265358979323846 / f;
        lt_test_close_to(plain[i], f, 0, 1e-6, "inv_freq", i);
        double want = wl < 64 / 4.0 ? f : wl > 64 / 1.0 ? f / 8 : 0;
        if (want == 0) {
            double s = (64 / wl - 1) / (4 - 1);
            want = (1 - s) * f / 8 + s * f;
        }
        bands[wl < 16 ? 0 : wl > 64 ? 2 : 1]++;
        lt_test_close_to(inv[i], want, 0, 1e-6, "llama3 inv_freq", i);
    }
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);

    int64_t N = 11, Hh = 3, D = 32;
    int32_t pos[11];
    for (int i = 0; i < N; i++) pos[i] = (int32_t)(lt_test_rand_u64(&rng) % 5000);
    float *x = lt_test_fresh(&rng, N * Hh * D, 1), *y = malloc((size_t)(N * Hh * D) * 4);
    memcpy(y, x, (size_t)(N * Hh * D) * 4);
    be()->rope(ctx, y, pos, inv, N, Hh, D, 0);
    for (int64_t n = 0; n < N; n++)
        for (int64_t h = 0; h < Hh; h++)
            for (int64_t i = 0; i < D; i++) {
                const float *v = x + (n * Hh + h) * D;
                int64_t k = i % 16;
                double ang = (double)((float)pos[n] * inv[k]);
                double want = i < 16 ? v[i] * cos(ang) - v[i + 16] * sin(ang) : v[i] * cos(ang) + v[i - 16] * sin(ang);
                lt_test_close_to(y[(n * Hh + h) * D + i], want, 1, 1e-5, "rope", i);
            }
    /* The backward is the inverse rotation: rope⁻¹(rope(x)) = x, and since the map is orthogonal,
     * ⟨dy, rope(x)⟩ = ⟨rope⁻¹(dy), x⟩ for any dy. */
    float *dy = lt_test_fresh(&rng, N * Hh * D, 1), *dx = malloc((size_t)(N * Hh * D) * 4);
    memcpy(dx, dy, (size_t)(N * Hh * D) * 4);
    be()->rope(ctx, dx, pos, inv, N, Hh, D, 1);
    double lhs = 0, rhs = 0;
    for (int64_t i = 0; i < N * Hh * D; i++) lhs += (double)dy[i] * y[i], rhs += (double)dx[i] * x[i];
    lt_test_close_to(lhs, rhs, fabs(lhs) + 10, 1e-5, "rope adjoint", 0);
    be()->rope(ctx, y, pos, inv, N, Hh, D, 1);
    for (int64_t i = 0; i < N * Hh * D; i++) lt_test_close_to(y[i], x[i], 1, 1e-5, "rope inverse", i);
    free(x), free(y), free(dy), free(dx);
    lt_ctx_free(ctx);
}

static double silu(double g) { return g / (1 + exp(-g)); }

static void swiglu_forward_and_backward(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 4;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 10007;
    float *g = lt_test_fresh(&rng, n, 3), *u = lt_test_fresh(&rng, n, 1), *da = lt_test_fresh(&rng, n, 1);
    float *a = lt_test_poisoned(n), *dg = lt_test_poisoned(n), *du = lt_test_poisoned(n);
    be()->swiglu_fwd(ctx, g, u, n, a);
    be()->swiglu_bwd(ctx, da, g, u, n, dg, du);
    for (int64_t i = 0; i < n; i++) {
        lt_test_close_to(a[i], silu(g[i]) * u[i], 0, 1e-5, "swiglu", i);
        double h = 1e-6;
        double fdg = da[i] * u[i] * (silu(g[i] + h) - silu(g[i] - h)) / (2 * h);
        double fdu = da[i] * silu(g[i]);
        lt_test_close_to(dg[i], fdg, 1e-4, 1e-4, "swiglu dg", i);
        lt_test_close_to(du[i], fdu, 0, 1e-5, "swiglu du", i);
    }
    free(g), free(u), free(da), free(a), free(dg), free(du);
    lt_ctx_free(ctx);
}

static void embedding_add_bias_dropout(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 5;
    lt_ctx *ctx = lt_ctx_new();
    int64_t V = 50, C = 64, N = 23;
    float *tf = lt_test_fresh(&rng, V * C, 1);
    uint8_t *tq = malloc((size_t)lt_dtype_row_bytes(LT_DTYPE_Q8_0, C) * (size_t)V);
    for (int64_t v = 0; v < V; v++) lt_quantize_row(LT_DTYPE_Q8_0, tf + v * C, tq + v * 68, C);
    int64_t sh[2] = {V, C};
    lt_tensor tables[2] = {lt_tensor_view(tf, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh),
                           lt_tensor_view(tq, LT_DTYPE_Q8_0, LT_DEVICE_CPU, 2, sh)};
    int32_t ids[23];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
    float *out = lt_test_poisoned(N * C), row[64];
    for (int t = 0; t < 2; t++) {
        be()->embedding(ctx, &tables[t], ids, N, out);
        for (int64_t n = 0; n < N; n++) {
            lt_dequantize_row(tables[t].dtype, (const uint8_t *)tables[t].data + (size_t)ids[n] * (t ? 68 : 256), row, C);
            assert_memory_equal(out + n * C, row, sizeof row);
        }
    }
    float *b = lt_test_fresh(&rng, C, 1), *y = lt_test_fresh(&rng, N * C, 1), *y0 = malloc((size_t)(N * C) * 4);
    memcpy(y0, y, (size_t)(N * C) * 4);
    be()->add_bias(ctx, y, b, N, C);
    for (int64_t i = 0; i < N * C; i++) lt_test_close_to(y[i], (double)y0[i] + b[i % C], 0, 1e-6, "bias", i);
    be()->add(ctx, y, out, -0.5f, N * C);
    for (int64_t i = 0; i < N * C; i++) lt_test_close_to(y[i], (double)y0[i] + b[i % C] - 0.5 * out[i], 1, 1e-6, "add", i);

    int64_t n = 200000;
    float *x = lt_test_fresh(&rng, n, 1), *d1 = lt_test_poisoned(n), *d2 = lt_test_poisoned(n), *d3 = lt_test_poisoned(n);
    float p = 0.3f;
    be()->dropout(ctx, x, d1, n, p, 42, 1000);
    be()->dropout(ctx, x, d2, n, p, 42, 1000);
    be()->dropout(ctx, x, d3, n, p, 42, 1000 + (uint64_t)n);
    int64_t kept = 0, same3 = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(d1[i] == d2[i]);
        if (d1[i] != 0) {
            kept++;
            lt_test_close_to(d1[i], x[i] / (1 - p), 0, 1e-6, "dropout scale", i);
        }
        same3 += (d1[i] != 0) == (d3[i] != 0);
    }
    /* Binomial(n, 0.7): 6 standard deviations is ±1230. */
    assert_true(llabs(kept - (int64_t)(0.7 * (double)n)) < 1230);
    assert_true(same3 < n - 1000); /* another offset draws another mask */
    be()->dropout(ctx, x, d3, n, 0.0f, 42, 0);
    assert_memory_equal(d3, x, (size_t)n * 4);
    free(tf), free(tq), free(out), free(b), free(y), free(y0), free(x), free(d1), free(d2), free(d3);
    lt_ctx_free(ctx);
}

static void adamw_matches_torch_formula(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 6;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 5003;
    float *p = lt_test_fresh(&rng, n, 1), *m = calloc((size_t)n, 4), *v = calloc((size_t)n, 4);
    double *pd = malloc((size_t)n * 8), *md = calloc((size_t)n, 8), *vd = calloc((size_t)n, 8);
    for (int64_t i = 0; i < n; i++) pd[i] = p[i];
    lt_adamw_params hp = {1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 0};
    for (int step = 1; step <= 3; step++) {
        float *g = lt_test_fresh(&rng, n, 1);
        hp.step = step;
        be()->adamw(ctx, p, g, m, v, n, &hp);
        for (int64_t i = 0; i < n; i++) {
            pd[i] *= 1 - (double)hp.lr * hp.weight_decay;
            md[i] = 0.9 * md[i] + 0.1 * g[i];
            vd[i] = 0.999 * vd[i] + 0.001 * (double)g[i] * g[i];
            double mh = md[i] / (1 - pow(0.9, step)), vh = vd[i] / (1 - pow(0.999, step));
            pd[i] -= (double)hp.lr * mh / (sqrt(vh) + 1e-8);
            lt_test_close_to(p[i], pd[i], 1e-2, 1e-5, "adamw p", i);
            lt_test_close_to(m[i], md[i], 1e-2, 1e-5, "adamw m", i);
        }
        free(g);
    }
    free(p), free(m), free(v), free(pd), free(md), free(vd);
    lt_ctx_free(ctx);
}

static void zero_scale_sumsq(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 7;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 100003; /* several parallel chunks, not a multiple of any */
    float *x = lt_test_fresh(&rng, n, 2), *x0 = malloc((size_t)n * 4);
    memcpy(x0, x, (size_t)n * 4);
    be()->scale(ctx, x, -0.37f, n);
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(x[i] == x0[i] * -0.37f); /* one float multiply, exactly */
        ss += (double)x[i] * x[i];
    }
    lt_test_close_to(be()->sumsq(ctx, x, n), ss, 0, 1e-6, "sumsq", 0);
    lt_test_close_to(be()->sumsq(ctx, x, 1), (double)x[0] * x[0], 0, 1e-6, "sumsq 1", 0);
    assert_true(be()->sumsq(ctx, x, 0) == 0.0f);
    /* zero an odd byte range in the middle; the bytes around it stay */
    uint8_t *b = (uint8_t *)x;
    be()->zero(ctx, b + 3, 4001);
    for (size_t i = 0; i < 4001; i++) assert_int_equal(b[3 + i], 0);
    float want0 = x0[0] * -0.37f;
    assert_memory_equal(b, &want0, 3);
    for (int64_t i = (3 + 4001 + 3) / 4; i < n; i++) assert_true(x[i] == x0[i] * -0.37f);
    free(x), free(x0);
    lt_ctx_free(ctx);
}

/* bf16 storage conversions: round to nearest even (ties, the largest finite values, infinities
 * and NaN included) against the scalar lt_f32_to_bf16, and widening back exactly. */
static void bf16_conversions(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 8;
    lt_ctx *ctx = lt_ctx_new();
    int64_t n = 70001; /* several parallel chunks, not a multiple of any */
    float *x = lt_test_fresh(&rng, n, 3), *back = malloc((size_t)n * 4);
    uint16_t *h = malloc((size_t)n * 2);
    const uint32_t special[6] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u};
    for (int i = 0; i < 6; i++) memcpy(&x[i], &special[i], 4);
    for (int64_t i = 0; i < n; i++) h[i] = 0xdead;
    be()->to_bf16(ctx, x, h, n);
    for (int64_t i = 0; i < n; i++) assert_int_equal(h[i], lt_f32_to_bf16(x[i]));
    assert_int_equal(h[0], 0x3f80); /* a tie rounds to even: down */
    assert_int_equal(h[1], 0x3f82); /* and up */
    for (int64_t i = 0; i < n; i++) back[i] = LT_TEST_POISON;
    be()->from_bf16(ctx, h, back, n);
    for (int64_t i = 0; i < n; i++) {
        float w = lt_bf16_to_f32(h[i]);
        assert_memory_equal(&back[i], &w, 4);
    }
    free(x), free(back), free(h);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gemm_matches_float64),
        cmocka_unit_test(matmul_every_weight_dtype),
        cmocka_unit_test(rmsnorm_forward_and_backward),
        cmocka_unit_test(rope_forward_inverse_and_llama3_table),
        cmocka_unit_test(swiglu_forward_and_backward),
        cmocka_unit_test(embedding_add_bias_dropout),
        cmocka_unit_test(adamw_matches_torch_formula),
        cmocka_unit_test(zero_scale_sumsq),
        cmocka_unit_test(bf16_conversions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
