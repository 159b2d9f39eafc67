/* The KV-cache forward against the full-sequence forward: on each tiny fixture model (GQA in all
 * of them), with random LoRA weights, the logits of a prompt prefilled through the cache and of
 * every token decoded after it equal lt_model_logits over the whole sequence at each position;
 * likewise with sliding windows put on some layers, for two rows of different lengths decoded
 * together, for a multi-token continuation after cached positions (decode attention with several
 * queries), after a truncation, for prompts longer than one pass's scratch. On the Gemma 2 and
 * Gemma 3 fixtures (sandwich norms, GeGLU, scaled embeddings and queries, attention and
 * final-logit softcaps, their own sliding windows, Gemma 3's second RoPE table) the same
 * comparison at every step, and greedy generation through the cache picks the tokens a greedy
 * loop over the full forward picks. On CUDA when present: two random models of head dim 64 (the
 * CUDA attention's smallest; the llama/qwen fixtures' are below it) and the Gemma fixtures of head
 * dim 64. Bad requests are typed errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/rng.h"
#include "helpers/test_util.h"
#include "helpers/tiny_model.h"
#include "helpers/train_data.h"
#include "longtune/alloc.h"
#include "longtune/kv_cache.h"
#include "longtune/model.h"
#include "longtune/sysinfo.h"
#include "longtune/train.h"
#include "model/model_internal.h"

/* f32 end to end on the CPU; the two paths differ in summation order (flash vs decode attention,
 * one row vs many in a GEMM). Relative to the largest logit magnitude of the position. On CUDA the
 * matmuls read x in bf16 (fp32 accumulate) on both paths, and x reaches them by different sums, so
 * an input may round to the neighbouring bf16 value: a few bf16 ulps (2^-8) of a logit. A wrong
 * position, cache row or key range moves logits by O(1), far above either bound. */
#define KV_REL 2e-4
#define KV_REL_CUDA 2e-2
static double g_rel = KV_REL;

static const char *const CASES[] = {"llama_tied", "llama3_untied", "qwen2_untied", "qwen3_tied",
                                    "llama_tied/model.gguf"};
#define T_ALL 24

static lt_model *load_dir(lt_ctx *ctx, const char *dir, const char *name, lt_device dev, uint64_t seed);

static lt_model *load(lt_ctx *ctx, const char *name, lt_device dev, uint64_t seed) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/model/%s", lt_test_source_dir(), name);
    return load_dir(ctx, dir, name, dev, seed);
}

static lt_model *load_dir(lt_ctx *ctx, const char *dir, const char *name, lt_device dev, uint64_t seed) {
    lt_model_options mo = {.device = dev};
    lt_lora_options lo;
    memset(&lo, 0, sizeof lo);
    lo.rank = 4;
    lt_model *m = NULL;
    if (lt_model_load(ctx, dir, &mo, &lo, &m) != LT_OK) {
        fprintf(stderr, "load %s: %s\n", name, lt_ctx_error(ctx));
        fail();
    }
    int64_t n;
    lt_model_lora_params(m, &n);
    float *p = malloc((size_t)n * sizeof(float));
    uint64_t r = seed;
    for (int64_t i = 0; i < n; i++) p[i] = (float)((double)(lt_splitmix64(&r) >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, p), LT_OK);
    free(p);
    return m;
}

static void full_logits(lt_ctx *ctx, lt_model *m, const int32_t *tok, int64_t T, float *out) {
    lt_model_run_options run;
    memset(&run, 0, sizeof run);
    run.B = 1, run.T = T, run.forward_only = 1;
    run.saved_bf16 = -1; /* attention in f32 on every device, as the cache's */
    assert_int_equal(lt_model_prepare(ctx, m, &run), LT_OK);
    lt_model_batch b;
    memset(&b, 0, sizeof b);
    b.B = 1, b.T = T, b.tokens = tok;
    assert_int_equal(lt_model_logits(ctx, m, &b, out), LT_OK);
}

static double row_err(const float *a, const float *b, int64_t V) {
    double mx = 0, e = 0;
    for (int64_t j = 0; j < V; j++) {
        if (fabs(b[j]) > mx) mx = fabs(b[j]);
        if (fabs((double)a[j] - b[j]) > e) e = fabs((double)a[j] - b[j]);
    }
    return e / (mx > 0 ? mx : 1);
}

static void check_row(const char *what, int64_t pos, const float *got, const float *want, int64_t V) {
    double e = row_err(got, want, V);
    if (e > g_rel) {
        fprintf(stderr, "%s: position %lld relative error %.3g > %.3g\n", what, (long long)pos, e, g_rel);
        fail();
    }
}

/* Sequence a (T_ALL tokens) and b (T_ALL - 12) in rows 1 and 0: prefill both, decode both together,
 * a three-token continuation on row 1, truncation and re-extension on row 0. */
static void run_case(lt_ctx *ctx, lt_model *m, const char *what) {
    const lt_model_config *cf = lt_model_get_config(m);
    int64_t V = cf->V;
    int32_t a[T_ALL], bq[T_ALL];
    uint64_t r = 7;
    for (int i = 0; i < T_ALL; i++) a[i] = (int32_t)(lt_splitmix64(&r) % (uint64_t)V);
    for (int i = 0; i < T_ALL; i++) bq[i] = (int32_t)(lt_splitmix64(&r) % (uint64_t)V);
    int64_t Ta = T_ALL, Tb = T_ALL - 12;
    float *fa = malloc((size_t)(Ta * V) * 4), *fb = malloc((size_t)(Tb * V) * 4), *lg = malloc((size_t)(2 * V) * 4);
    full_logits(ctx, m, a, Ta, fa);
    full_logits(ctx, m, bq, Tb, fb);
    lt_kv_cache *c = NULL;
    size_t bytes = 0;
    assert_int_equal(lt_kv_cache_new(ctx, m, 2, 32, 0, &c, &bytes), LT_OK);
    size_t kvb = 0;
    assert_int_equal(lt_kv_cache_bytes(ctx, cf, 2, 32, &kvb), LT_OK);
    assert_int_equal(kvb, (size_t)(cf->L * 2 * 2 * 32 * cf->Hkv * cf->D * 4));
    assert_true(bytes > kvb);
    /* prefill: a's first 9, b's first 5, packed in one flash pass */
    int64_t rows[2] = {1, 0}, np[2] = {9, 5};
    const int32_t *tp[2] = {a, bq};
    assert_int_equal(lt_kv_cache_extend(ctx, c, 2, rows, tp, np, lg), LT_OK);
    check_row(what, 8, lg, fa + 8 * V, V);
    check_row(what, 4, lg + V, fb + 4 * V, V);
    int64_t pa = 9, pb = 5;
    /* decode both, one token each, until b is done */
    while (pb < Tb) {
        const int32_t *t2[2] = {a + pa, bq + pb};
        int64_t ones[2] = {1, 1};
        assert_int_equal(lt_kv_cache_extend(ctx, c, 2, rows, t2, ones, lg), LT_OK);
        check_row(what, pa, lg, fa + pa * V, V);
        check_row(what, pb, lg + V, fb + pb * V, V);
        pa++, pb++;
    }
    /* a continues by three tokens in one call (decode attention with three queries), then singly */
    int64_t three = 3, row1 = 1;
    const int32_t *t3 = a + pa;
    assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row1, &t3, &three, lg), LT_OK);
    pa += 3;
    check_row(what, pa - 1, lg, fa + (pa - 1) * V, V);
    for (int i = (int)pa; i < T_ALL; i++) {
        const int32_t *t1 = &a[i];
        int64_t one = 1;
        assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row1, &t1, &one, lg), LT_OK);
        check_row(what, i, lg, fa + (int64_t)i * V, V);
    }
    /* row 0 back to 3 positions, then the rest of b again in one continuation */
    int64_t row0 = 0, rest = Tb - 3;
    assert_int_equal(lt_kv_cache_truncate(ctx, c, 0, 3), LT_OK);
    assert_int_equal(lt_kv_cache_length(c, 0), 3);
    const int32_t *tr = bq + 3;
    assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row0, &tr, &rest, lg), LT_OK);
    check_row(what, Tb - 1, lg, fb + (Tb - 1) * V, V);
    /* bad requests */
    int64_t too_many = 40;
    assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row0, &tr, &too_many, lg), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "context"));
    int64_t bad_row = 2, one = 1;
    assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &bad_row, &tr, &one, lg), LT_ERR_INVALID_ARG);
    int32_t bad_tok = (int32_t)V;
    const int32_t *tb = &bad_tok;
    assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row0, &tb, &one, lg), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_kv_cache_truncate(ctx, c, 0, 100), LT_ERR_INVALID_ARG);
    lt_kv_cache_free(ctx, c);
    /* scratch for 4 tokens per pass: both prompts prefill in passes (flash, then decode attention) */
    assert_int_equal(lt_kv_cache_new(ctx, m, 2, 32, 4, &c, NULL), LT_OK);
    int64_t np2[2] = {Ta, Tb};
    assert_int_equal(lt_kv_cache_extend(ctx, c, 2, rows, tp, np2, lg), LT_OK);
    check_row(what, Ta - 1, lg, fa + (Ta - 1) * V, V);
    check_row(what, Tb - 1, lg + V, fb + (Tb - 1) * V, V);
    lt_kv_cache_free(ctx, c);
    free(fa), free(fb), free(lg);
}

/* dirs == NULL: the fixtures; else n folders of random models. */
static void each_case_in(lt_device dev, int windows, const char *const *dirs, size_t n) {
    g_rel = dev == LT_DEVICE_CPU ? KV_REL : KV_REL_CUDA;
    if (!dirs) n = sizeof CASES / sizeof CASES[0];
    for (size_t i = 0; i < n; i++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = dirs ? load_dir(ctx, dirs[i], dirs[i], dev, 11 + i) : load(ctx, CASES[i], dev, 11 + i);
        char what[128];
        snprintf(what, sizeof what, "%s%s (%s)", dirs ? dirs[i] : CASES[i], windows ? " windowed" : "",
                 dev == LT_DEVICE_CPU ? "cpu" : "cuda");
        if (windows) /* layer 0 slides over 5 keys, layer 1 keeps full attention */
            for (int64_t l = 0; l < m->cfg.L; l += 2) {
                m->layers[l].desc.attn = LT_ATTN_KIND_SLIDING;
                m->layers[l].desc.window = 5;
            }
        run_case(ctx, m, what);
        lt_model_free(ctx, m);
        lt_ctx_free(ctx);
    }
}

static void each_case(lt_device dev, int windows) { each_case_in(dev, windows, NULL, 0); }

/* Two random models of head dim 64 (Llama GQA; Qwen3 with q/k norms) in folders under /tmp. */
static void write_d64(char dirs[2][256]) {
    uint64_t rng = 5;
    for (int k = 0; k < 2; k++) {
        snprintf(dirs[k], sizeof dirs[k], "/tmp/lt_test_kv_cache_%ld_d64_%d", (long)getpid(), k);
        lt_test_tiny t =
            {.V = 128, .C = 128, .F = 192, .L = 2, .H = 4, .Hkv = 2, .D = 64, .qk_norm = k, .dtype = LT_DTYPE_F32};
        lt_test_tiny_write(&t, dirs[k], &rng);
    }
}

static void rm_d64(char dirs[2][256]) {
    for (int k = 0; k < 2; k++) lt_test_rm_model_dir(dirs[k]);
}

/* The Gemma fixtures; the first two have head dim 64, which the CUDA attention serves. */
static const char *const GEMMA[] = {"gemma2", "gemma3", "gemma3_d256"};

static lt_model *load_gemma_on(lt_ctx *ctx, const char *name, lt_device dev, uint64_t seed) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/gemma/%s", lt_test_source_dir(), name);
    return load_dir(ctx, dir, name, dev, seed);
}

static lt_model *load_gemma(lt_ctx *ctx, const char *name, uint64_t seed) {
    return load_gemma_on(ctx, name, LT_DEVICE_CPU, seed);
}

static void test_cpu(void **st) {
    (void)st;
    each_case(LT_DEVICE_CPU, 0);
}

static void test_cpu_window(void **st) {
    (void)st;
    each_case(LT_DEVICE_CPU, 1);
}

static void test_cuda(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    if (lt_model_device_available(ctx, LT_DEVICE_CUDA) != LT_OK) {
        lt_ctx_free(ctx);
        skip();
    }
    lt_ctx_free(ctx);
    char dirs[2][256];
    write_d64(dirs);
    const char *d[2] = {dirs[0], dirs[1]};
    each_case_in(LT_DEVICE_CPU, 0, d, 2); /* the same models' CPU path, as a reference run */
    each_case_in(LT_DEVICE_CUDA, 0, d, 2);
    each_case_in(LT_DEVICE_CUDA, 1, d, 2);
    rm_d64(dirs);
    g_rel = KV_REL_CUDA;
    for (size_t i = 0; i < 2; i++) {
        lt_ctx *c2 = lt_ctx_new();
        lt_model *m = load_gemma_on(c2, GEMMA[i], LT_DEVICE_CUDA, 31 + i);
        char what[64];
        snprintf(what, sizeof what, "%s (cuda)", GEMMA[i]);
        run_case(c2, m, what);
        lt_model_free(c2, m);
        lt_ctx_free(c2);
    }
}

static void test_cpu_gemma(void **st) {
    (void)st;
    g_rel = KV_REL;
    /* which of the Gemma features the fixtures, together, put through the comparison */
    int embed = 0, qscale = 0, final_cap = 0, attn_cap = 0, sliding = 0, sandwich = 0, geglu = 0, local = 0;
    for (size_t i = 0; i < sizeof GEMMA / sizeof GEMMA[0]; i++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = load_gemma(ctx, GEMMA[i], 31 + i);
        const lt_model_config *cf = lt_model_get_config(m);
        embed |= cf->embed_scale > 1, final_cap |= cf->final_softcap > 0;
        qscale |= cf->query_scale != 0 && fabs(cf->query_scale * sqrt((double)cf->D) - 1) > 1e-3;
        for (int64_t l = 0; l < cf->L; l++) {
            const lt_layer_desc *d = &m->layers[l].desc;
            sliding |= d->window > 0, sandwich |= d->norm == LT_NORM_PLACE_SANDWICH, attn_cap |= d->softcap > 0;
            geglu |= d->mlp == LT_MLP_KIND_GEGLU, local |= d->rope == 1;
        }
        char what[64];
        snprintf(what, sizeof what, "%s (cpu)", GEMMA[i]);
        run_case(ctx, m, what);
        lt_model_free(ctx, m);
        lt_ctx_free(ctx);
    }
    assert_true(embed && qscale && final_cap && attn_cap && sliding && sandwich && geglu && local);
}

static int32_t argmax_row(const float *z, int64_t V) {
    int64_t b = 0;
    for (int64_t j = 1; j < V; j++)
        if (z[j] > z[b]) b = j;
    return (int32_t)b;
}

/* Greedy generation through the cache against argmax over the full forward, token by token. */
static void test_gemma_greedy(void **st) {
    (void)st;
    enum { P = 6, N = 16 };
    int distinct = 0; /* some fixture's greedy run moves between tokens, so positions matter */
    for (size_t i = 0; i < sizeof GEMMA / sizeof GEMMA[0]; i++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = load_gemma(ctx, GEMMA[i], 41 + i);
        int64_t V = lt_model_get_config(m)->V;
        int32_t seq[P + N], out[N];
        uint64_t r = 3 + i;
        for (int k = 0; k < P; k++) seq[k] = (int32_t)(lt_splitmix64(&r) % (uint64_t)V);
        lt_generate_options go = {N, 0.0, 0.0, 1};
        int64_t n_out = 0;
        assert_int_equal(lt_generate(ctx, m, seq, P, NULL, 0, &go, out, &n_out, NULL, NULL), LT_OK);
        assert_int_equal(n_out, N);
        float *z = malloc((size_t)((P + N) * V) * 4);
        for (int k = 0; k < N; k++) {
            full_logits(ctx, m, seq, P + k, z);
            seq[P + k] = argmax_row(z + (P + k - 1) * V, V);
            if (seq[P + k] != out[k])
                fprintf(stderr, "%s: greedy token %d: cache %d, full forward %d\n", GEMMA[i], k, out[k], seq[P + k]);
            assert_int_equal(out[k], seq[P + k]);
            distinct |= k > 0 && out[k] != out[0];
        }
        free(z);
        lt_model_free(ctx, m);
        lt_ctx_free(ctx);
    }
    assert_true(distinct);
}

static void test_bad_new(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx, "llama_tied", LT_DEVICE_CPU, 1);
    lt_kv_cache *c = NULL;
    /* the fixture's max_position_embeddings is 64 */
    assert_int_equal(lt_kv_cache_new(ctx, m, 1, 65, 0, &c, NULL), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "max_positions"));
    assert_int_equal(lt_kv_cache_new(ctx, m, 0, 8, 0, &c, NULL), LT_ERR_INVALID_ARG);
    assert_null(c);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
}

/* A bf16 model's prompt prefilled with bf16 products (projections and attention tiles on bf16
 * inputs; 20 tokens, past the decode path's 8): the last position's logits against the full f32
 * forward, further than the f32 paths' bound (the products did round) and within a bf16 one
 * (2^-5 of the largest logit); the decode steps after it keep theirs. A build without oneDNN
 * refuses the option by name; a value other than 0 or 1 is refused. */
static void test_cpu_bf16_products(void **st) {
    (void)st;
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/lt_test_kv_cache_%ld_bf16", (long)getpid());
    uint64_t rng = 9;
    lt_test_tiny t = {.V = 128, .C = 64, .F = 96, .L = 2, .H = 4, .Hkv = 2, .D = 16, .dtype = LT_DTYPE_BF16};
    lt_test_tiny_write(&t, dir, &rng);
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load_dir(ctx, dir, dir, LT_DEVICE_CPU, 13);
    const int64_t V = m->cfg.V, T = 20;
    int32_t tok[24];
    uint64_t r = 3;
    for (int i = 0; i < 24; i++) tok[i] = (int32_t)(lt_splitmix64(&r) % (uint64_t)V);
    float *full = malloc((size_t)(24 * V) * 4), *lg = malloc((size_t)V * 4);
    full_logits(ctx, m, tok, 24, full);
    lt_kv_cache *c = NULL;
    lt_kv_cache_options o = {.B = 1, .ctx_len = 32, .n_max = 0, .bf16_products = 1};
    lt_status s = lt_kv_cache_create(ctx, m, &o, &c, NULL);
    if (!lt_sys_cpu_bf16_products()) {
        assert_int_equal(s, LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), "bf16_products"));
        printf("      bf16 products refused: none on this CPU (no oneDNN, or no AVX-512)\n");
    } else {
        assert_int_equal(s, LT_OK);
        int64_t row = 0, n = T;
        const int32_t *tp = tok;
        assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row, &tp, &n, lg), LT_OK);
        const double e = row_err(lg, full + (T - 1) * V, V);
        if (e <= KV_REL || e > 0x1p-5)
            fail_msg("bf16 prefill: relative error %.3g outside (%g, %g]", e, KV_REL, 0x1p-5);
        for (int64_t i = T; i < 24; i++) { /* decode: one token at a time */
            int64_t one = 1;
            tp = tok + i;
            assert_int_equal(lt_kv_cache_extend(ctx, c, 1, &row, &tp, &one, lg), LT_OK);
            assert_true(row_err(lg, full + i * V, V) <= 0x1p-5);
        }
        lt_kv_cache_free(ctx, c);
    }
    o.bf16_products = 2;
    assert_int_equal(lt_kv_cache_create(ctx, m, &o, &c, NULL), LT_ERR_INVALID_ARG);
    free(full), free(lg);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
    lt_test_rm_model_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu),
        cmocka_unit_test(test_cpu_window),
        cmocka_unit_test(test_cuda),
        cmocka_unit_test(test_cpu_gemma),
        cmocka_unit_test(test_gemma_greedy),
        cmocka_unit_test(test_bad_new),
        cmocka_unit_test(test_cpu_bf16_products),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
