/* The ops of KV-cache decoding against float64 references on fresh random inputs (the test helpers'
 * seed, replayable with LONGTUNE_TEST_SEED):
 * decode attention on every backend present (GQA, sliding windows, softcap, rows of different
 * lengths, poisoned outputs), and the CPU matmul's decode path (LT_MATMUL_NT_DECODE) for the block
 * formats it dots directly (Q4_0, Q4_1, Q8_0: within the bound of x's 8-bit or 16-bit rounding) and for those
 * it widens a row at a time (int4_g64, bf16, f16: f32 tolerance), with beta accumulation. */
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
#include "helpers/test_util.h"
#include "longtune/alloc.h"

static uint64_t g_seed;

static double unif(uint64_t *r) { return lt_test_uniform(r, -1.0, 1.0); }

typedef struct dcase {
    int64_t n, H, Hkv, D, B, ctx, window;
    float softcap;
} dcase;

static void ref_decode(const dcase *c, const int32_t *seq, const int32_t *len, const float *q, const float *kc,
                       const float *vc, double *out) {
    double scale = 1.0 / sqrt((double)c->D);
    for (int64_t i = 0; i < c->n; i++)
        for (int64_t h = 0; h < c->H; h++) {
            int64_t kvh = h / (c->H / c->Hkv), L = len[i], lo = c->window && L > c->window ? L - c->window : 0;
            double mx = -INFINITY, *sc = malloc((size_t)L * sizeof(double)), sum = 0;
            for (int64_t j = lo; j < L; j++) {
                const float *k = kc + ((seq[i] * c->ctx + j) * c->Hkv + kvh) * c->D;
                double s = 0;
                for (int64_t d = 0; d < c->D; d++) s += (double)q[(i * c->H + h) * c->D + d] * k[d];
                s *= scale;
                if (c->softcap > 0) s = c->softcap * tanh(s / c->softcap);
                sc[j] = s;
                if (s > mx) mx = s;
            }
            for (int64_t j = lo; j < L; j++) sum += sc[j] = exp(sc[j] - mx);
            for (int64_t d = 0; d < c->D; d++) {
                double o = 0;
                for (int64_t j = lo; j < L; j++) o += sc[j] * vc[((seq[i] * c->ctx + j) * c->Hkv + kvh) * c->D + d];
                out[(i * c->H + h) * c->D + d] = o / sum;
            }
            free(sc);
        }
}

static void run_decode(lt_device dev, const dcase *c, uint64_t *r) {
    const lt_backend *be = lt_backend_get(dev);
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 2);
    size_t nq = (size_t)(c->n * c->H * c->D), nkv = (size_t)(c->B * c->ctx * c->Hkv * c->D);
    float *q = malloc(nq * 4), *kc = malloc(nkv * 4), *vc = malloc(nkv * 4), *o = malloc(nq * 4);
    int32_t *seq = malloc((size_t)c->n * 4), *len = malloc((size_t)c->n * 4);
    double *ref = malloc(nq * sizeof(double));
    for (size_t i = 0; i < nq; i++) q[i] = (float)unif(r) * 2;
    for (size_t i = 0; i < nkv; i++) kc[i] = (float)unif(r) * 2, vc[i] = (float)unif(r);
    for (int64_t i = 0; i < c->n; i++) {
        seq[i] = (int32_t)(i % c->B);
        len[i] = (int32_t)(1 + lt_test_rand_u64(r) % (uint64_t)c->ctx);
    }
    ref_decode(c, seq, len, q, kc, vc, ref);
    lt_op_query qu = {LT_OP_DECODE_ATTENTION, LT_DTYPE_F32, LT_DTYPE_F32, 0, c->D, c->window, c->softcap};
    assert_int_equal(be->supports(ctx, &qu), LT_OK);
    lt_decode_attention_params p;
    memset(&p, 0, sizeof p);
    p.n = c->n, p.H = c->H, p.Hkv = c->Hkv, p.D = c->D, p.ctx = c->ctx, p.max_len = c->ctx;
    p.scale = 1.0f / sqrtf((float)c->D), p.softcap = c->softcap, p.window = c->window;
    size_t wsb = be->decode_attention_workspace_bytes(&p, 2);
    void *dq = lt_alloc(ctx, dev, nq * 4, "q"), *dk = lt_alloc(ctx, dev, nkv * 4, "k"),
         *dv = lt_alloc(ctx, dev, nkv * 4, "v"), *dout = lt_alloc(ctx, dev, nq * 4, "out"),
         *ds = lt_alloc(ctx, dev, (size_t)c->n * 4, "seq"), *dl = lt_alloc(ctx, dev, (size_t)c->n * 4, "len"),
         *dw = wsb ? lt_alloc(ctx, dev, wsb, "ws") : NULL;
    assert_int_equal(be->copy_to_device(ctx, dq, q, nq * 4), LT_OK);
    assert_int_equal(be->copy_to_device(ctx, dk, kc, nkv * 4), LT_OK);
    assert_int_equal(be->copy_to_device(ctx, dv, vc, nkv * 4), LT_OK);
    assert_int_equal(be->copy_to_device(ctx, ds, seq, (size_t)c->n * 4), LT_OK);
    assert_int_equal(be->copy_to_device(ctx, dl, len, (size_t)c->n * 4), LT_OK);
    for (size_t i = 0; i < nq; i++) o[i] = NAN; /* poison: every element must be written */
    assert_int_equal(be->copy_to_device(ctx, dout, o, nq * 4), LT_OK);
    p.q = dq, p.kc = dk, p.vc = dv, p.out = dout, p.seq = ds, p.len = dl, p.workspace = dw;
    assert_int_equal(be->decode_attention(ctx, &p), LT_OK);
    assert_int_equal(be->copy_to_host(ctx, o, dout, nq * 4), LT_OK);
    double tol = lt_test_tol_for(LT_DTYPE_F32, c->ctx + c->D), worst = 0;
    for (size_t i = 0; i < nq; i++) {
        double e = fabs((double)o[i] - ref[i]);
        if (!(e <= tol)) {
            fprintf(stderr,
                    "decode %s n=%lld H=%lld Hkv=%lld D=%lld W=%lld cap=%g: out[%zu] = %g, want %g (seed %llu)\n",
                    lt_test_backend_name(dev), (long long)c->n, (long long)c->H, (long long)c->Hkv, (long long)c->D,
                    (long long)c->window, c->softcap, i, o[i], ref[i], (unsigned long long)g_seed);
            fail();
        }
        if (e > worst) worst = e;
    }
    printf("decode %s n=%lld H=%lld/%lld D=%lld W=%lld cap=%g: max err %.2e (tol %.2e)\n", lt_test_backend_name(dev),
           (long long)c->n, (long long)c->H, (long long)c->Hkv, (long long)c->D, (long long)c->window, c->softcap,
           worst, tol);
    lt_free(ctx, dev, dq, nq * 4), lt_free(ctx, dev, dk, nkv * 4), lt_free(ctx, dev, dv, nkv * 4);
    lt_free(ctx, dev, dout, nq * 4), lt_free(ctx, dev, ds, (size_t)c->n * 4), lt_free(ctx, dev, dl, (size_t)c->n * 4);
    if (dw) lt_free(ctx, dev, dw, wsb);
    free(q), free(kc), free(vc), free(o), free(seq), free(len), free(ref);
    lt_ctx_free(ctx);
}

static void test_decode_attention(void **st) {
    (void)st;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const dcase cases[] = {
        {3, 4, 2, 64, 3, 50, 0, 0},     {5, 9, 3, 64, 2, 700, 0, 0},    {4, 8, 8, 128, 4, 300, 17, 0},
        {2, 6, 2, 32, 1, 90, 0, 30.0f}, {7, 4, 1, 64, 7, 33, 8, 20.0f}, {1, 2, 2, 256, 1, 1500, 0, 0},
    };
    for (int d = 0; d < nd; d++) {
        uint64_t r = g_seed;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_decode(devs[d], &cases[i], &r);
    }
}

static void test_decode_attention_refusals(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    lt_op_query q = {LT_OP_DECODE_ATTENTION, LT_DTYPE_BF16, LT_DTYPE_F32, 0, 64, 0, 0};
    assert_int_equal(lt_backend_cpu_supports(ctx, &q), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "bf16"));
    q.dtype = LT_DTYPE_F32, q.head_dim = 512;
    assert_int_equal(lt_backend_cpu_supports(ctx, &q), LT_ERR_UNSUPPORTED);
    assert_int_equal(lt_backend_cuda_supports(ctx, &q), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "head dim"));
    lt_ctx_free(ctx);
}

/* y = x·Wᵀ + beta·y0 through LT_MATMUL_NT_DECODE against float64 over the dequantized W. With
 * x rounded to 8 bits per block of 32 (block32 formats), each output may differ by at most
 * Σ_i |w_i|·(amax_b/127)/2 + an f32 accumulation term. */
static void run_matvec(lt_dtype dt, int64_t out, int64_t in, int64_t N, float beta, uint64_t *r) {
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 2);
    size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    uint8_t *W = malloc(rb * (size_t)out);
    float *wf = malloc((size_t)(out * in) * 4), *x = malloc((size_t)(N * in) * 4), *y = malloc((size_t)(N * out) * 4);
    float *y0 = malloc((size_t)(N * out) * 4);
    for (int64_t i = 0; i < out * in; i++) wf[i] = (float)unif(r);
    for (int64_t o = 0; o < out; o++) {
        lt_quantize_row(dt, wf + o * in, W + (size_t)o * rb, in);
        lt_dequantize_row(dt, W + (size_t)o * rb, wf + o * in, in); /* the exact weights */
    }
    for (int64_t i = 0; i < N * in; i++) x[i] = (float)(unif(r) * (double)(1 + (i % 7)));
    for (int64_t i = 0; i < N * out; i++) y0[i] = y[i] = (float)unif(r);
    int64_t sh[2] = {out, in};
    lt_tensor w = lt_tensor_view(W, dt, LT_DEVICE_CPU, 2, sh);
    size_t wsb = lt_backend_cpu.matmul_workspace_bytes(dt, out, in, N, 2);
    void *ws = malloc(wsb);
    lt_backend_cpu.matmul(ctx, LT_MATMUL_NT_DECODE, &w, x, N, beta, y, ws);
    int b32 = dt == LT_DTYPE_Q4_0 || dt == LT_DTYPE_Q4_1 || dt == LT_DTYPE_Q8_0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < out; o++) {
            double ref = beta * (double)y0[n * out + o], mag = fabs(beta * (double)y0[n * out + o]), bound = 0;
            for (int64_t b = 0; b < in / 32; b++) {
                double amax = 0;
                for (int i = 0; i < 32; i++) amax = fmax(amax, fabs(x[n * in + b * 32 + i]));
                for (int i = 0; i < 32; i++) {
                    double wv = wf[o * in + b * 32 + i], xv = x[n * in + b * 32 + i];
                    ref += wv * xv;
                    mag += fabs(wv * xv);
                    bound += fabs(wv) * amax / (dt == LT_DTYPE_Q8_0 ? 32767.0 : 127.0) / 2.0;
                }
            }
            double tol = (b32 ? bound * 1.001 : 0) + lt_test_tol_for(LT_DTYPE_F32, in) * (mag + 1e-30);
            double e = fabs((double)y[n * out + o] - ref);
            if (!(e <= tol)) {
                fprintf(stderr, "matvec %s (%lld, %lld) N=%lld: y[%lld, %lld] = %g, want %g, tol %g (seed %llu)\n",
                        lt_dtype_name(dt), (long long)out, (long long)in, (long long)N, (long long)n, (long long)o,
                        y[n * out + o], ref, tol, (unsigned long long)g_seed);
                fail();
            }
        }
    free(W), free(wf), free(x), free(y), free(y0), free(ws);
    lt_ctx_free(ctx);
}

static void test_matvec(void **st) {
    (void)st;
    uint64_t r = g_seed ^ 0x55;
    const lt_dtype dts[] = {LT_DTYPE_Q4_1,     LT_DTYPE_Q4_0, LT_DTYPE_Q8_0,
                            LT_DTYPE_INT4_G64, LT_DTYPE_BF16, LT_DTYPE_F16};
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        run_matvec(dts[i], 77, 256, 1, 0.0f, &r);
        run_matvec(dts[i], 130, 512, 3, 1.0f, &r);
        run_matvec(dts[i], 33, 768, LT_MATVEC_MAX_N, 0.5f, &r);
        if (dts[i] != LT_DTYPE_INT4_G64) run_matvec(dts[i], 20, 96, 2, 0.0f, &r); /* odd block count: loop tails */
    }
}

int main(void) {
    g_seed = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_attention),
        cmocka_unit_test(test_decode_attention_refusals),
        cmocka_unit_test(test_matvec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
