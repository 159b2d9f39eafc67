/* Gemma 2 and Gemma 3 on CUDA against the same models on the CPU (the fixtures of
 * tests/oracle/gen_gemma_fixtures.py with head dim 64, from their HF folders and GGUF files): loss,
 * per-token loss, logits and every LoRA gradient under each recompute policy (by layer kind too),
 * with the softcaps, sliding and global layers, sandwich norms, GeGLU and the two RoPE tables
 * running on the device; the CUDA size table equals what the device allocator holds, and a step
 * allocates nothing. Without a CUDA build or device it prints "skipped: no CUDA device" and exits
 * 77. */
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
#include "longtune/model.h"
#include "longtune/safetensors.h"
#include "longtune/sysinfo.h"

#if LT_HAVE_CUDA

/* As tests/e2e/test_cuda_train.c: the CUDA step reads matmul and attention inputs in bf16 (unit
 * roundoff u = 2^-8); the loss carries a few u, gradients (through every layer's rounded inputs
 * twice) up to 32 u of the largest one. Structural mistakes give errors of order 1. */
#define BF16_U 0x1.0p-8
#define TOL_LOSS (8 * BF16_U)
#define TOL_GRAD (32 * BF16_U)

static const char *const CASES[][2] = {{"gemma2", NULL},
                                       {"gemma3", NULL},
                                       {"gemma2", "model.gguf"},
                                       {"gemma3", "model.gguf"}};

typedef struct fixture {
    lt_safetensors *exp;
    int64_t B, T, S, rank, num_layers;
    float alpha;
    int32_t tokens[64], targets[64], positions[64], offsets[16];
} fixture;

static void case_path(const char *c, const char *file, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/gemma/%s%s%s", lt_test_source_dir(), c, file ? "/" : "", file ? file : "");
}

static const float *ftensor(lt_ctx *ctx, const fixture *f, const char *name, int64_t *numel) {
    lt_tensor t;
    if (lt_safetensors_find(ctx, f->exp, name, &t) != LT_OK) {
        fprintf(stderr, "fixture: %s\n", lt_ctx_error(ctx));
        fail();
    }
    if (numel) *numel = lt_tensor_numel(&t);
    return t.data;
}

static void ints(lt_ctx *ctx, const fixture *f, const char *name, int32_t *out, int64_t want) {
    int64_t n;
    const float *x = ftensor(ctx, f, name, &n);
    assert_int_equal(n, want);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)x[i];
}

static void open_fixture(lt_ctx *ctx, const char *c, fixture *f) {
    char dir[1024], p[1200];
    case_path(c, NULL, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/expected.safetensors", dir);
    memset(f, 0, sizeof *f);
    assert_int_equal(lt_safetensors_open(ctx, p, &f->exp), LT_OK);
    f->B = atoll(lt_safetensors_metadata(f->exp, "B"));
    f->T = atoll(lt_safetensors_metadata(f->exp, "T"));
    f->S = atoll(lt_safetensors_metadata(f->exp, "S"));
    f->rank = atoll(lt_safetensors_metadata(f->exp, "rank"));
    f->num_layers = atoll(lt_safetensors_metadata(f->exp, "num_layers"));
    f->alpha = (float)atof(lt_safetensors_metadata(f->exp, "alpha"));
    ints(ctx, f, "tokens", f->tokens, f->B * f->T);
    ints(ctx, f, "targets", f->targets, f->B * f->T);
    ints(ctx, f, "positions", f->positions, f->B * f->T);
    ints(ctx, f, "seq_offsets", f->offsets, f->B * (f->S + 1));
}

static lt_lora_options lora_of(const fixture *f) {
    lt_lora_options lo = {0};
    lo.rank = f->rank, lo.alpha = f->alpha, lo.num_layers = f->num_layers, lo.seed = 7;
    return lo;
}

/* The model at path on dev with the fixture's adapter values. */
static lt_model *load(lt_ctx *ctx, const char *path, const fixture *f, lt_device dev) {
    lt_lora_options lo = lora_of(f);
    lt_model_options mo = {0};
    mo.device = dev;
    lt_model *m = NULL;
    if (lt_model_load(ctx, path, &mo, &lo, &m) != LT_OK) {
        fprintf(stderr, "%s on %s: %s\n", path, dev ? "cuda" : "cpu", lt_ctx_error(ctx));
        fail();
    }
    int64_t n = 0;
    (void)lt_model_lora_params(m, &n);
    float *p = malloc((size_t)n * 4);
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        int64_t k;
        const float *v = ftensor(ctx, f, t.name, &k);
        assert_int_equal(k, lt_tensor_numel(&t.value));
        memcpy(p + t.offset, v, (size_t)k * 4);
    }
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, p), LT_OK);
    free(p);
    return m;
}

/* Largest |got - want| over the largest |want|; fails above tol. */
static double compare(const char *what, const float *got, const float *want, int64_t n, double tol) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e;
    }
    double rel = worst / (scale > 0 ? scale : 1);
    if (!(rel <= tol)) {
        fprintf(stderr, "%s: error %.3g of the largest magnitude %.3g > %.3g\n", what, rel, scale, tol);
        fail();
    }
    return rel;
}

static void prepare(lt_ctx *ctx, lt_model *m, const fixture *f, lt_recompute rc, int rerun) {
    lt_model_run_options ro = {0};
    ro.B = f->B, ro.T = f->T, ro.recompute = rc, ro.recompute_k = rc == LT_RECOMPUTE_EVERY_K ? 2 : 0;
    ro.recompute_attention = rerun;
    ro.chunk_rows = rerun ? 5 : 0;
    if (lt_model_prepare(ctx, m, &ro) != LT_OK) {
        fprintf(stderr, "prepare: %s\n", lt_ctx_error(ctx));
        fail();
    }
}

static void step_matches_cpu(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) {
        lt_ctx *ctx = lt_ctx_new();
        fixture f;
        open_fixture(ctx, CASES[ci][0], &f);
        char path[1200];
        case_path(CASES[ci][0], CASES[ci][1], path, sizeof path);
        lt_model *mc = load(ctx, path, &f, LT_DEVICE_CPU), *mg = load(ctx, path, &f, LT_DEVICE_CUDA);
        lt_model_batch b = {0};
        b.B = f.B, b.T = f.T, b.S = f.S;
        b.tokens = f.tokens, b.targets = f.targets, b.positions = f.positions, b.seq_offsets = f.offsets;
        int64_t N = f.B * f.T, V = lt_model_get_config(mc)->V, n = 0;
        (void)lt_model_lora_params(mc, &n);
        float *gc = malloc((size_t)n * 4), *g = malloc((size_t)n * 4);
        float *lc = malloc((size_t)(N * V) * 4), *lg = malloc((size_t)(N * V) * 4);
        prepare(ctx, mc, &f, LT_RECOMPUTE_NONE, 0);
        lt_model_result rc, rg;
        float tl_c[64], tl_g[64];
        assert_int_equal(lt_model_logits(ctx, mc, &b, lc), LT_OK);
        lt_model_zero_grads(mc);
        assert_int_equal(lt_model_forward_backward(ctx, mc, &b, 0.0f, &rc, tl_c), LT_OK);
        memcpy(gc, lt_model_lora_grads(mc, NULL), (size_t)n * 4);
        /* the last three rerun attention in the recompute */
        const lt_recompute pol[8] = {LT_RECOMPUTE_NONE,    LT_RECOMPUTE_EVERY,  LT_RECOMPUTE_EVERY_K,
                                     LT_RECOMPUTE_SLIDING, LT_RECOMPUTE_GLOBAL, LT_RECOMPUTE_EVERY,
                                     LT_RECOMPUTE_SLIDING, LT_RECOMPUTE_GLOBAL};
        for (int pi = 0; pi < 8; pi++) {
            char what[1600];
            prepare(ctx, mg, &f, pol[pi], pi >= 5);
            if (pi == 0) {
                for (int64_t i = 0; i < N * V; i++) lg[i] = LT_TEST_POISON;
                assert_int_equal(lt_model_logits(ctx, mg, &b, lg), LT_OK);
                snprintf(what, sizeof what, "%s %s logits", path, "cuda");
                compare(what, lg, lc, N * V, TOL_LOSS);
            }
            for (int64_t i = 0; i < N; i++) tl_g[i] = LT_TEST_POISON;
            lt_model_zero_grads(mg);
            lt_status s = lt_model_forward_backward(ctx, mg, &b, 0.0f, &rg, tl_g);
            if (s != LT_OK) fprintf(stderr, "%s cuda step: %s\n", path, lt_ctx_error(ctx));
            assert_int_equal(s, LT_OK);
            assert_int_equal(rg.n_tokens, rc.n_tokens);
            float lossg = (float)(rg.loss_sum / (double)rg.n_tokens),
                  lossc = (float)(rc.loss_sum / (double)rc.n_tokens);
            snprintf(what, sizeof what, "%s loss (recompute %d)", path, pi);
            double el = compare(what, &lossg, &lossc, 1, TOL_LOSS);
            snprintf(what, sizeof what, "%s token_loss (recompute %d)", path, pi);
            compare(what, tl_g, tl_c, N, TOL_LOSS);
            assert_int_equal(lt_model_lora_get(ctx, mg, 1, 0, n, g), LT_OK);
            double eg = 0;
            for (int64_t i = 0; i < lt_model_lora_count(mg); i++) {
                lt_lora_tensor t;
                assert_int_equal(lt_model_lora_tensor(ctx, mg, i, &t), LT_OK);
                snprintf(what, sizeof what, "%s %s grad (recompute %d)", path, t.name, pi);
                eg = fmax(eg, compare(what, g + t.offset, gc + t.offset, lt_tensor_numel(&t.grad), TOL_GRAD));
            }
            fprintf(stderr, "  %s recompute %d: loss %.6f vs %.6f (rel %.2e), worst grad rel %.2e\n", path, pi,
                    (double)lossg, (double)lossc, el, eg);
        }
        free(gc), free(g), free(lc), free(lg);
        lt_model_free(ctx, mg);
        lt_model_free(ctx, mc);
        lt_safetensors_close(ctx, f.exp);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The CUDA plan of the Gemma layer list is the device's allocation byte for byte, and a step
 * allocates nothing on the device. */
static void size_table_equals_device_allocations(void **state) {
    (void)state;
    const lt_recompute pol[5] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K, LT_RECOMPUTE_SLIDING,
                                 LT_RECOMPUTE_GLOBAL};
    for (size_t ci = 0; ci < 2; ci++)
        for (int pi = 0; pi < 5; pi++) {
            lt_ctx *ctx = lt_ctx_new();
            fixture f;
            open_fixture(ctx, CASES[ci][0], &f);
            char path[1200];
            case_path(CASES[ci][0], NULL, path, sizeof path);
            lt_lora_options lo = lora_of(&f);
            lt_model_options mo = {0};
            mo.device = LT_DEVICE_CUDA;
            lt_model_config cfg;
            assert_int_equal(lt_model_inspect(ctx, path, &mo, &cfg), LT_OK);
            lt_model_run_options ro = {0};
            ro.B = f.B, ro.T = f.T, ro.recompute = pol[pi], ro.recompute_k = 2, ro.device = LT_DEVICE_CUDA;
            lt_model_sizes want;
            assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
            lt_model *m = load(ctx, path, &f, LT_DEVICE_CUDA);
            assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
            lt_model_sizes got = lt_model_get_sizes(m);
            for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, want.total);
            lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
            lt_model_batch b = {0};
            b.B = f.B, b.T = f.T, b.S = f.S;
            b.tokens = f.tokens, b.targets = f.targets, b.positions = f.positions, b.seq_offsets = f.offsets;
            lt_model_result r;
            assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0.0f, &r, NULL), LT_OK);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes, want.total);
            lt_model_free(ctx, m);
            lt_safetensors_close(ctx, f.exp);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
            lt_ctx_free(ctx);
        }
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(step_matches_cpu),
        cmocka_unit_test(size_table_equals_device_allocations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else
int main(void) { return lt_test_cuda_skip(); }
#endif
