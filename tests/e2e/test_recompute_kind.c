/* The recompute policy by layer kind (recompute sliding / global, with segments of K): on the CPU
 * the loss, per-token losses and every LoRA gradient are bit-identical to recompute none on the
 * Gemma 2 and Gemma 3 fixtures and on a tiny random Gemma 3 of eight layers (runs of sliding layers
 * between global ones, a frozen layer below the LoRA ones), with f32 and bf16 checkpoints (bf16:
 * against themselves), kept or rerun attention, row chunks
 * and offloaded checkpoints; the size table equals the allocations for every by-kind policy on a
 * Gemma-2-shaped and a Gemma-3-shaped config; a kind the model lacks is a typed error naming it;
 * sliding on a model whose every layer slides is recompute all, byte for byte; recompute auto
 * takes the by-kind policies in order of recompute work; the option and policy names parse.
 * Attention rerun in only some recomputed layers (recompute_attention_layers) picks the sliding
 * ones first, equals recompute none bit for bit at every count, plans what it allocates with each
 * count's kept outputs a fixed size less, and is what recompute auto takes where rerunning
 * attention everywhere fits and keeping it everywhere does not: the fewest layers that fit. */
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

#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "helpers/tiny_model.h"
#include "helpers/train_data.h"
#include "longtune/alloc.h"
#include "longtune/plan.h"
#include "longtune/train.h"
#include "model/model_internal.h"

static uint64_t rng;
static char tiny_dir[256];
/* Eight layers S S G S S G S S (a global layer every third), window 5, head dim 32. */
static const lt_test_tiny tiny = {96, 64, 128, 8, 2, 1, 32, 1, LT_DTYPE_F32};

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    snprintf(tiny_dir, sizeof tiny_dir, "/tmp/lt_test_recompute_kind_%ld", (long)getpid());
    lt_test_tiny_write_gemma3(&tiny, 5, 3, tiny_dir, &rng);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    lt_test_rm_model_dir(tiny_dir);
    return 0;
}

static void fixture_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/gemma/%s", lt_test_source_dir(), c);
}

/* Options a resolve accepts: a model and a data set named. */
static lt_train_options base_options(void) {
    lt_train_options o;
    memset(&o, 0, sizeof o);
    snprintf(o.model, sizeof o.model, "m.gguf");
    snprintf(o.data, sizeof o.data, "d");
    return o;
}

enum { B = 2, T = 24, N = B * T, S = 2 };

typedef struct batch {
    int32_t tokens[N], targets[N], positions[N], offsets[B * (S + 1)];
} batch;

/* Two packed rows of two sequences each, random tokens below V. */
static lt_model_batch make_batch(batch *b, int64_t V) {
    const int32_t cuts[B][S + 1] = {{0, 10, 24}, {0, 17, 24}};
    for (int r = 0; r < B; r++)
        for (int q = 0; q < S; q++) {
            b->offsets[r * (S + 1) + q] = cuts[r][q];
            b->offsets[r * (S + 1) + q + 1] = cuts[r][q + 1];
            for (int32_t i = cuts[r][q]; i < cuts[r][q + 1]; i++) {
                int k = r * T + i;
                b->tokens[k] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
                b->positions[k] = i - cuts[r][q];
                b->targets[k] =
                    i + 1 == cuts[r][q + 1] ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
            }
        }
    lt_model_batch mb = {0};
    mb.B = B, mb.T = T, mb.S = S, mb.step = 1;
    mb.tokens = b->tokens, mb.targets = b->targets, mb.positions = b->positions, mb.seq_offsets = b->offsets;
    return mb;
}

static lt_model *load(lt_ctx *ctx, const char *dir, int64_t num_layers) {
    lt_lora_options lo = {0};
    lo.rank = 4, lo.alpha = 8, lo.seed = 3, lo.num_layers = num_layers;
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, dir, NULL, &lo, &m);
    if (s != LT_OK) fprintf(stderr, "load %s: %s\n", dir, lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    int64_t n = 0;
    float *p = lt_model_lora_params(m, &n);
    lt_test_fill_normal(&rng, p, n, 0.1f); /* B != 0 so every gradient is live */
    return m;
}

/* One step's loss, token losses and gradients under ro. */
static void step(lt_ctx *ctx, lt_model *m, const lt_model_batch *mb, const lt_model_run_options *ro, double *loss,
                 float *tl, float *g) {
    lt_status s = lt_model_prepare(ctx, m, ro);
    if (s != LT_OK) fprintf(stderr, "prepare: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    lt_model_result r;
    for (int i = 0; i < N; i++) tl[i] = LT_TEST_POISON;
    lt_model_zero_grads(m);
    s = lt_model_forward_backward(ctx, m, mb, 0.0f, &r, tl);
    if (s != LT_OK) fprintf(stderr, "step: %s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    *loss = r.loss_sum;
    int64_t n = 0;
    const float *grads = lt_model_lora_grads(m, &n);
    memcpy(g, grads, (size_t)n * 4);
}

typedef struct policy {
    lt_recompute r;
    int64_t k;
} policy;

static const policy KIND_POLICIES[] = {
    {LT_RECOMPUTE_SLIDING, 0}, {LT_RECOMPUTE_SLIDING, 2}, {LT_RECOMPUTE_SLIDING, 3},
    {LT_RECOMPUTE_GLOBAL, 0},  {LT_RECOMPUTE_GLOBAL, 2},
};
#define N_KIND (sizeof KIND_POLICIES / sizeof KIND_POLICIES[0])

/* Model dirs and LoRA layers: the fixtures (S G S and S S G, all three layers), the tiny Gemma 3
 * with LoRA on all eight layers and on the last seven (layer 0 frozen). */
typedef struct model_case {
    char dir[1024];
    int64_t num_layers;
} model_case;

static int model_cases(model_case *mc) {
    fixture_dir("gemma2", mc[0].dir, sizeof mc[0].dir);
    fixture_dir("gemma3", mc[1].dir, sizeof mc[1].dir);
    snprintf(mc[2].dir, sizeof mc[2].dir, "%s", tiny_dir);
    snprintf(mc[3].dir, sizeof mc[3].dir, "%s", tiny_dir);
    mc[0].num_layers = mc[1].num_layers = mc[2].num_layers = 0;
    mc[3].num_layers = 7;
    return 4;
}

static void same_bits(const char *what, const char *dir, const policy *p, int v, const void *got, const void *want,
                      size_t bytes) {
    if (!memcmp(got, want, bytes)) return;
    char name[32];
    fprintf(stderr, "%s: %s under recompute %s (variant %d) differs from the reference\n", dir, what,
            lt_plan_recompute_name(p->r, p->k, name, sizeof name), v);
    fail();
}

/* f32 checkpoints: every by-kind policy equals recompute none bit for bit, kept or rerun attention,
 * with and without offloaded checkpoints, in one chunk or 7-row chunks (against none in the same
 * chunks). bf16 checkpoints round the residual at the recomputed layers' inputs: there each policy
 * equals itself with offloaded checkpoints (and, with segments of one layer, kept attention equals
 * the rerun) and stays near the f32 step. */
static void kind_policies_equal_recompute_none(void **state) {
    (void)state;
    model_case mc[4];
    int n_cases = model_cases(mc);
    for (int ci = 0; ci < n_cases; ci++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = load(ctx, mc[ci].dir, mc[ci].num_layers);
        batch b;
        lt_model_batch mb = make_batch(&b, lt_model_get_config(m)->V);
        int64_t n = 0;
        (void)lt_model_lora_grads(m, &n);
        float *g0 = malloc((size_t)n * 4), *g = malloc((size_t)n * 4),
              *gb[2] = {malloc((size_t)n * 4), malloc((size_t)n * 4)};
        assert_true(g0 && g && gb[0] && gb[1]);
        float tl0[N], tl[N], tlb[2][N];
        for (int chunk = 0; chunk <= 7; chunk += 7) {
            double l0, l, lb[2] = {0, 0};
            lt_model_run_options ro = {0};
            ro.B = B, ro.T = T, ro.recompute = LT_RECOMPUTE_NONE, ro.chunk_rows = chunk;
            step(ctx, m, &mb, &ro, &l0, tl0, g0);
            double gmax = 0;
            for (int64_t i = 0; i < n; i++) gmax = fabs(g0[i]) > gmax ? fabs(g0[i]) : gmax;
            assert_true(gmax > 0);
            for (size_t pi = 0; pi < N_KIND; pi++) {
                const policy *p = &KIND_POLICIES[pi];
                for (int v = 0; v < 8; v++) {
                    lt_model_run_options rk = ro;
                    int rerun = v & 1, offload = (v >> 1) & 1, bf16 = (v >> 2) & 1;
                    rk.recompute = p->r, rk.recompute_k = p->k;
                    rk.recompute_attention = rerun, rk.offload_ckpt = offload, rk.saved_bf16 = bf16 ? 1 : -1;
                    step(ctx, m, &mb, &rk, &l, tl, g);
                    if (!bf16) {
                        same_bits("loss", mc[ci].dir, p, v, &l, &l0, sizeof l);
                        same_bits("token losses", mc[ci].dir, p, v, tl, tl0, sizeof tl);
                        same_bits("gradients", mc[ci].dir, p, v, g, g0, (size_t)n * 4);
                        continue;
                    }
                    if (!offload) { /* this policy's bf16 reference, kept or rerun attention */
                        lb[rerun] = l;
                        memcpy(tlb[rerun], tl, sizeof tl);
                        memcpy(gb[rerun], g, (size_t)n * 4);
                        assert_true(fabs(l - l0) < 1e-2 * fabs(l0));
                        double e2 = 0, n2 = 0;
                        for (int64_t i = 0; i < n; i++)
                            e2 += (g[i] - g0[i]) * (double)(g[i] - g0[i]), n2 += g0[i] * (double)g0[i];
                        assert_true(sqrt(e2 / n2) < 0.2); /* bf16 attention tensors and stream */
                        /* Segments of one layer start from their rounded checkpoints in the
                         * forward too, so the kept attention is the rerun's (longer segments'
                         * forward runs on the unrounded input, as every:K's does). */
                        if (rerun && p->k <= 1) {
                            same_bits("bf16 loss", mc[ci].dir, p, v, &lb[1], &lb[0], sizeof l);
                            same_bits("bf16 gradients", mc[ci].dir, p, v, gb[1], gb[0], (size_t)n * 4);
                        }
                        continue;
                    }
                    same_bits("bf16 loss", mc[ci].dir, p, v, &l, &lb[rerun], sizeof l);
                    same_bits("bf16 token losses", mc[ci].dir, p, v, tl, tlb[rerun], sizeof tl);
                    same_bits("bf16 gradients", mc[ci].dir, p, v, g, gb[rerun], (size_t)n * 4);
                }
            }
        }
        free(g0), free(g), free(gb[0]), free(gb[1]);
        lt_model_free(ctx, m);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The planner's numbers are the allocator's for every by-kind policy: f32 and bf16 checkpoints,
 * kept and rerun attention, offloaded checkpoints; a step allocates nothing. */
static void size_table_equals_allocations(void **state) {
    (void)state;
    model_case mc[4];
    int n_cases = model_cases(mc);
    for (int ci = 0; ci < n_cases; ci++)
        for (size_t pi = 0; pi < N_KIND; pi++)
            for (int v = 0; v < 8; v++) {
                lt_ctx *ctx = lt_ctx_new();
                lt_lora_options lo = {0};
                lo.rank = 4, lo.num_layers = mc[ci].num_layers;
                lt_model_config cfg;
                assert_int_equal(lt_model_inspect(ctx, mc[ci].dir, NULL, &cfg), LT_OK);
                lt_model_run_options ro = {0};
                ro.B = B, ro.T = T, ro.recompute = KIND_POLICIES[pi].r, ro.recompute_k = KIND_POLICIES[pi].k;
                ro.saved_bf16 = v & 1 ? 1 : -1, ro.recompute_attention = (v >> 1) & 1, ro.offload_ckpt = (v >> 2) & 1;
                lt_model_sizes want;
                assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
                lt_model *m = NULL;
                assert_int_equal(lt_model_load(ctx, mc[ci].dir, NULL, &lo, &m), LT_OK);
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                lt_model_sizes got = lt_model_get_sizes(m);
                for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, want.total);
                batch b;
                lt_model_batch mb = make_batch(&b, cfg.V);
                size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
                lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
                lt_model_result r;
                assert_int_equal(lt_model_forward_backward(ctx, m, &mb, 0, &r, NULL), LT_OK);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, before);
                lt_model_free(ctx, m);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
                lt_ctx_free(ctx);
            }
}

/* Activation bytes of cfg's run under (r, k) at B x T, rerunning attention or not (0 on error). */
static size_t act_bytes(lt_ctx *ctx, const lt_model_config *cfg, int64_t layers, lt_recompute r, int64_t k, int64_t Bq,
                        int64_t Tq, lt_device dev, lt_model_sizes *all) {
    lt_lora_options lo = {0};
    lo.num_layers = layers;
    lt_model_run_options ro = {0};
    ro.B = Bq, ro.T = Tq, ro.recompute = r, ro.recompute_k = k, ro.device = dev;
    lt_model_sizes s;
    if (lt_model_size_table(ctx, cfg, &lo, &ro, &s) != LT_OK) return 0;
    if (all) *all = s;
    return s.bytes[LT_MEM_ACTIVATIONS] + s.bytes[LT_MEM_TRANSIENTS];
}

/* A Gemma-2-shaped (alternating) and a Gemma-3-shaped (5 local : 1 global) config at 8k tokens:
 * by-kind policies sit between none and all, a kept layer costs what it costs without recompute,
 * and the size table prices exactly the per-layer choice: kept stores + checkpoints + slots. */
static void by_kind_prices_between_none_and_all(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    for (int g = 0; g < 2; g++) {
        lt_model_config cfg;
        fixture_dir(g ? "gemma3" : "gemma2", dir, sizeof dir);
        assert_int_equal(lt_model_inspect(ctx, dir, NULL, &cfg), LT_OK);
        cfg.L = g ? 12 : 8; /* Gemma 2: S G S G ...; Gemma 3: period 6 */
        cfg.F = 8 * cfg.C;  /* an MLP as wide as a real model's relative to its attention */
        if (g) cfg.sliding_period = 6;
        int64_t n_sliding = 0;
        for (int64_t l = 0; l < cfg.L; l++) n_sliding += lt_model_recomputes_layer(&cfg, LT_RECOMPUTE_SLIDING, l);
        assert_int_equal(n_sliding, g ? 10 : 4);
        for (int64_t l = 0; l < cfg.L; l++)
            assert_int_equal(lt_model_recomputes_layer(&cfg, LT_RECOMPUTE_GLOBAL, l) +
                                 lt_model_recomputes_layer(&cfg, LT_RECOMPUTE_SLIDING, l),
                             1);
        {
            size_t none = act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_NONE, 0, 1, 8192, LT_DEVICE_CPU, NULL);
            size_t all = act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_EVERY, 0, 1, 8192, LT_DEVICE_CPU, NULL);
            size_t sl = act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_SLIDING, 0, 1, 8192, LT_DEVICE_CPU, NULL);
            size_t gl = act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_GLOBAL, 0, 1, 8192, LT_DEVICE_CPU, NULL);
            assert_true(none && all && sl && gl);
            assert_true(all < sl && sl < none);
            assert_true(all < gl && gl < none);
            if (g) assert_true(sl < gl); /* more layers recomputed, less kept */
            /* A kept layer's store is what recompute none keeps per layer: none minus the
             * transients is L of them (plus the same step buffers). The by-kind activations are
             * then the kept layers' stores plus the recomputed layers' checkpoints and kept
             * attention; the transients one slot, as recompute all. */
            lt_model_sizes sn, sa, ss;
            memset(&sn, 0, sizeof sn), memset(&sa, 0, sizeof sa), memset(&ss, 0, sizeof ss);
            assert_true(act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_NONE, 0, 1, 8192, LT_DEVICE_CPU, &sn));
            assert_true(act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_EVERY, 0, 1, 8192, LT_DEVICE_CPU, &sa));
            assert_true(act_bytes(ctx, &cfg, 0, LT_RECOMPUTE_SLIDING, 0, 1, 8192, LT_DEVICE_CPU, &ss));
            assert_int_equal(ss.bytes[LT_MEM_TRANSIENTS], sa.bytes[LT_MEM_TRANSIENTS]);
            assert_int_equal(ss.bytes[LT_MEM_WORKSPACE], sa.bytes[LT_MEM_WORKSPACE]);
            /* all keeps L checkpoints and, below the top layer (the last segment, whose stores
             * the backward reads from the forward), L - 1 attention outputs */
            lt_model_sizes sr;
            lt_lora_options lo0 = {0};
            lt_model_run_options rr = {0};
            rr.B = 1, rr.T = 8192, rr.recompute = LT_RECOMPUTE_EVERY, rr.recompute_attention = 1;
            rr.device = LT_DEVICE_CPU;
            assert_int_equal(lt_model_size_table(ctx, &cfg, &lo0, &rr, &sr), LT_OK);
            size_t per_kept = sn.bytes[LT_MEM_ACTIVATIONS] / (size_t)cfg.L;
            size_t per_ckpt = sr.bytes[LT_MEM_ACTIVATIONS] / (size_t)cfg.L;
            size_t per_att = (sa.bytes[LT_MEM_ACTIVATIONS] - sr.bytes[LT_MEM_ACTIVATIONS]) / (size_t)(cfg.L - 1);
            size_t want = (size_t)(cfg.L - n_sliding) * per_kept + (size_t)n_sliding * per_ckpt +
                (size_t)(n_sliding - 1) * per_att;
            /* pieces are rounded to 64 bytes; the allocator adds one rounding per block */
            assert_true(ss.bytes[LT_MEM_ACTIVATIONS] + 4096 >= want && ss.bytes[LT_MEM_ACTIVATIONS] <= want + 4096);
        }
    }
    lt_ctx_free(ctx);
}

/* A kind the model lacks is a typed error naming it (size table and prepare alike); LoRA layers
 * without the kind are named; a model whose every layer slides runs recompute sliding as recompute
 * all, and one with no window recompute global as all, byte for byte. */
static void missing_kinds_and_uniform_models(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char llama[1024], mistral[1024], gemma3[1024];
    snprintf(llama, sizeof llama, "%s/tests/fixtures/model/llama3_untied", lt_test_source_dir());
    snprintf(mistral, sizeof mistral, "%s/tests/fixtures/family/mistral_v01", lt_test_source_dir());
    fixture_dir("gemma3", gemma3, sizeof gemma3);
    lt_model_config cl, cm, cg;
    assert_int_equal(lt_model_inspect(ctx, llama, NULL, &cl), LT_OK);
    assert_int_equal(lt_model_inspect(ctx, mistral, NULL, &cm), LT_OK);
    assert_int_equal(lt_model_inspect(ctx, gemma3, NULL, &cg), LT_OK);
    assert_true(cm.sliding_window > 0 && cm.sliding_period == 0);
    lt_lora_options lo = {0};
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = 16, ro.recompute = LT_RECOMPUTE_SLIDING;
    lt_model_sizes s, a;
    assert_int_equal(lt_model_size_table(ctx, &cl, &lo, &ro, &s), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "the model has no sliding-window layers"));
    ro.recompute = LT_RECOMPUTE_GLOBAL;
    assert_int_equal(lt_model_size_table(ctx, &cm, &lo, &ro, &s), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "the model has no full-attention (global) layers"));
    /* LoRA on the last layer of S S G: no sliding layer among the LoRA ones */
    lo.num_layers = 1, ro.recompute = LT_RECOMPUTE_SLIDING;
    assert_int_equal(lt_model_size_table(ctx, &cg, &lo, &ro, &s), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "none of the LoRA layers (the last 1 of 3)"));
    lo.num_layers = 0;
    /* prepare refuses the same way */
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, llama, NULL, &lo, &m), LT_OK);
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "no sliding-window layers"));
    lt_model_free(ctx, m);
    /* uniform models: the by-kind policy of their one kind is recompute all */
    const lt_model_config *uni[2] = {&cm, &cl};
    const lt_recompute kind[2] = {LT_RECOMPUTE_SLIDING, LT_RECOMPUTE_GLOBAL};
    for (int u = 0; u < 2; u++)
        for (int k = 1; k <= 2; k++) {
            ro.recompute = kind[u], ro.recompute_k = k;
            assert_int_equal(lt_model_size_table(ctx, uni[u], &lo, &ro, &s), LT_OK);
            ro.recompute = k == 1 ? LT_RECOMPUTE_EVERY : LT_RECOMPUTE_EVERY_K;
            assert_int_equal(lt_model_size_table(ctx, uni[u], &lo, &ro, &a), LT_OK);
            assert_memory_equal(&s, &a, sizeof s);
        }
    /* options: a negative segment cap and an unknown policy are refused */
    ro.recompute = LT_RECOMPUTE_SLIDING, ro.recompute_k = -1;
    assert_int_equal(lt_model_size_table(ctx, &cg, &lo, &ro, &s), LT_ERR_INVALID_ARG);
    ro.recompute = (lt_recompute)99, ro.recompute_k = 0;
    assert_int_equal(lt_model_size_table(ctx, &cg, &lo, &ro, &s), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

/* The Gemma-3-shaped config of the auto tests (the fixture at twelve layers, a global one every
 * sixth, F = 8·C), recompute auto's resolved options and their plan options at one row of 8k. */
static void gemma3_auto(lt_ctx *ctx, lt_model_config *cfg, lt_train_options *opt, lt_plan_options *po) {
    char dir[1024];
    fixture_dir("gemma3", dir, sizeof dir);
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, cfg), LT_OK);
    cfg->L = 12, cfg->sliding_period = 6, cfg->F = 8 * cfg->C;
    lt_train_options in = base_options();
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "auto"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, opt), LT_OK);
    assert_true(opt->recompute_auto);
    assert_int_equal(lt_train_plan_options(ctx, opt, 1, 1, po), LT_OK);
    po->run.B = 1, po->run.T = 8192;
}

/* recompute auto over a Gemma-3-shaped config at 8k tokens: a budget that holds recompute none
 * takes it (no recompute at all); a smaller one the least work that fits: global (two of twelve
 * layers), then sliding (ten), then all; a uniform model never gets a by-kind candidate. */
static void auto_orders_by_kind_by_work(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg;
    lt_train_options opt;
    lt_plan_options po;
    gemma3_auto(ctx, &cfg, &opt, &po);
    /* none; global (2 of 12 layers); sliding (10); all (12), each keeping attention */
    const policy order[4] = {{LT_RECOMPUTE_NONE, 0},
                             {LT_RECOMPUTE_GLOBAL, 0},
                             {LT_RECOMPUTE_SLIDING, 0},
                             {LT_RECOMPUTE_EVERY, 0}};
    size_t peak[4];
    for (int i = 0; i < 4; i++) {
        lt_train_options c = opt;
        c.recompute_auto = 0, c.recompute = order[i].r;
        lt_plan_options p = po;
        p.run.recompute = order[i].r;
        lt_plan pl;
        assert_int_equal(lt_train_plan(ctx, &c, &cfg, &p, NULL, &pl), LT_OK);
        peak[i] = pl.peak_bytes;
    }
    /* more layers recomputed, less memory */
    assert_true(peak[0] > peak[1] && peak[1] > peak[2] && peak[2] > peak[3]);
    /* A budget of none's, global's or sliding's plan takes that policy: nothing with less work fits. */
    for (int b = 0; b < 3; b++) {
        lt_train_options chosen;
        lt_plan pl;
        assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cfg, &po, NULL, peak[b], &chosen, &pl), LT_OK);
        assert_int_equal(chosen.recompute, order[b].r);
        assert_int_equal(chosen.recompute_every, 0);
        assert_int_equal(chosen.recompute_auto, 0);
        assert_int_equal(chosen.recompute_attention, 0);
        assert_int_equal(pl.peak_bytes, peak[b]);
    }
    /* All's budget: the sliding layers over longer segments or rerunning their (4-key) attention is
     * less work than recomputing every layer, and may fit; whatever is taken fits and is not less
     * recompute than sliding. */
    lt_train_options ch;
    lt_plan pc;
    assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cfg, &po, NULL, peak[3], &ch, &pc), LT_OK);
    assert_true(pc.peak_bytes <= peak[3]);
    assert_true(ch.recompute == LT_RECOMPUTE_SLIDING || ch.recompute == LT_RECOMPUTE_EVERY ||
                ch.recompute == LT_RECOMPUTE_EVERY_K);
    assert_true(ch.recompute != LT_RECOMPUTE_SLIDING || ch.recompute_every > 1 || ch.recompute_attention ||
                ch.recompute_attention_layers > 0);
    /* a big budget: nothing recomputed */
    lt_train_options chosen;
    assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cfg, &po, NULL, (size_t)1 << 40, &chosen, NULL), LT_OK);
    assert_int_equal(chosen.recompute, LT_RECOMPUTE_NONE);
    /* below every candidate: a typed OOM naming the smallest plan */
    assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cfg, &po, NULL, 1, &chosen, NULL), LT_ERR_OOM);
    assert_non_null(strstr(lt_ctx_error(ctx), "recompute auto: no policy fits"));
    /* Mistral, every layer sliding: just below none's plan takes all (sliding would be the same),
     * the chunk given (else a halved chunk would let none fit first) */
    char mistral[1024];
    snprintf(mistral, sizeof mistral, "%s/tests/fixtures/family/mistral_v01", lt_test_source_dir());
    lt_model_config cm;
    assert_int_equal(lt_model_inspect(ctx, mistral, NULL, &cm), LT_OK);
    lt_train_options c = opt;
    c.recompute_auto = 0;
    lt_plan pn;
    assert_int_equal(lt_train_plan(ctx, &c, &cm, &po, NULL, &pn), LT_OK);
    lt_train_options given = opt;
    given.chunk_rows = LT_MODEL_CHUNK_ROWS;
    assert_int_equal(lt_train_choose_recompute(ctx, &given, &cm, &po, NULL, pn.peak_bytes - 1, &chosen, NULL), LT_OK);
    assert_int_equal(chosen.recompute, LT_RECOMPUTE_EVERY);
    /* not given: none at a halved chunk would come first (cheaper than recomputing every layer)
     * where it fits; this model's chunk buffers are smaller than attention's and the loss's
     * workspaces, which share their place, so no halving shrinks its plan and all is taken again
     * (test_train's recompute_auto_halves_the_chunk has a model whose halved chunk fits) */
    lt_train_options half = opt;
    half.recompute_auto = 0, half.chunk_rows = LT_MODEL_CHUNK_ROWS / 2;
    lt_plan ph;
    assert_int_equal(lt_train_plan(ctx, &half, &cm, &po, NULL, &ph), LT_OK);
    assert_int_equal(ph.peak_bytes, pn.peak_bytes);
    assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cm, &po, NULL, pn.peak_bytes - 1, &chosen, NULL), LT_OK);
    assert_int_equal(chosen.recompute, LT_RECOMPUTE_EVERY);
    lt_ctx_free(ctx);
}

/* recompute auto over the SmolLM2-135M shape at 32k tokens, with the plan of every:2 at 4,096-row
 * chunks as the budget: every layer keeping its attention does not fit, and rerunning attention in
 * a few of them costs less than longer segments and a halved chunk (on an H100, attention rerun in
 * 9 of 30 layers made this step 5 % slower; every:2 at 4,096 rows 11 % on an H200), so auto takes
 * that partial rerun though every:2 at 4,096 rows fits too: the fewest reruns that fit. */
static void auto_prefers_a_partial_rerun_to_longer_segments(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/plan/smollm2-135m-config.json", lt_test_source_dir());
    lt_model_config cfg;
    assert_int_equal(lt_model_config_read_hf(ctx, path, &cfg), LT_OK);
    lt_train_options in = base_options(), opt;
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "auto"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &opt), LT_OK);
    lt_plan_options po;
    assert_int_equal(lt_train_plan_options(ctx, &opt, 1, 1, &po), LT_OK);
    po.run.B = 1, po.run.T = 32768;
    lt_plan p2, pa, pc;
    lt_train_options e2 = opt, all = opt, ch;
    e2.recompute_auto = 0, e2.recompute = LT_RECOMPUTE_EVERY_K, e2.recompute_every = 2, e2.chunk_rows = 4096;
    lt_plan_options pe = po;
    pe.run.recompute = LT_RECOMPUTE_EVERY_K, pe.run.recompute_k = 2, pe.run.chunk_rows = 4096;
    assert_int_equal(lt_train_plan(ctx, &e2, &cfg, &pe, NULL, &p2), LT_OK);
    all.recompute_auto = 0, all.recompute = LT_RECOMPUTE_EVERY;
    lt_plan_options pl = po;
    pl.run.recompute = LT_RECOMPUTE_EVERY;
    assert_int_equal(lt_train_plan(ctx, &all, &cfg, &pl, NULL, &pa), LT_OK);
    const size_t budget = p2.peak_bytes;
    assert_true(pa.peak_bytes > budget);
    assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cfg, &po, NULL, budget, &ch, &pc), LT_OK);
    assert_int_equal(ch.recompute, LT_RECOMPUTE_EVERY);
    assert_int_equal(ch.recompute_every, 0);
    assert_int_equal(ch.recompute_attention, 0);
    assert_int_equal(ch.chunk_rows, opt.chunk_rows);
    assert_true(ch.recompute_attention_layers > 0 && ch.recompute_attention_layers < cfg.L);
    assert_true(pc.peak_bytes <= budget);
    lt_train_options fewer = ch;
    fewer.recompute_attention_layers--;
    lt_plan_options pf = po;
    pf.run.recompute = LT_RECOMPUTE_EVERY, pf.run.recompute_attention_layers = fewer.recompute_attention_layers;
    lt_plan pp;
    assert_int_equal(lt_train_plan(ctx, &fewer, &cfg, &pf, NULL, &pp), LT_OK);
    assert_true(pp.peak_bytes > budget);
    lt_ctx_free(ctx);
}

/* The option and the planner's policy names: sliding[:K] and global[:K] parse, name themselves
 * back, and bad values are refused naming the value. */
static void names_and_options(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *good[5] = {"sliding", "global", "sliding:3", "global:2", "every:2"};
    const lt_recompute want[5] = {LT_RECOMPUTE_SLIDING, LT_RECOMPUTE_GLOBAL, LT_RECOMPUTE_SLIDING, LT_RECOMPUTE_GLOBAL,
                                  LT_RECOMPUTE_EVERY_K};
    const int64_t wk[5] = {0, 0, 3, 2, 2};
    for (int i = 0; i < 5; i++) {
        lt_recompute r;
        int64_t k;
        char buf[32];
        assert_int_equal(lt_plan_recompute_parse(ctx, good[i], &r, &k), LT_OK);
        assert_int_equal(r, want[i]);
        assert_int_equal(k, wk[i]);
        assert_string_equal(lt_plan_recompute_name(r, k, buf, sizeof buf), good[i]);
        lt_train_options in = base_options(), o;
        assert_int_equal(lt_train_options_set(ctx, &in, "recompute", good[i]), LT_OK);
        assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
        assert_int_equal(o.recompute, want[i]);
        assert_int_equal(o.recompute_every, wk[i]);
        lt_plan_options po;
        assert_int_equal(lt_train_plan_options(ctx, &o, 1, 1, &po), LT_OK);
        assert_int_equal(po.run.recompute, want[i]);
        assert_int_equal(po.run.recompute_k, wk[i]);
    }
    const char *bad[6] = {"sliding:0", "slidingx", "global:", "sliding:2x", "local", "global:-1"};
    for (int i = 0; i < 6; i++) {
        lt_recompute r;
        int64_t k;
        assert_int_equal(lt_plan_recompute_parse(ctx, bad[i], &r, &k), LT_ERR_INVALID_ARG);
        assert_non_null(strstr(lt_ctx_error(ctx), bad[i]));
        lt_train_options in = base_options();
        assert_int_equal(lt_train_options_set(ctx, &in, "recompute", bad[i]), LT_ERR_INVALID_ARG);
        assert_non_null(strstr(lt_ctx_error(ctx), bad[i]));
    }
    lt_ctx_free(ctx);
}

/* The recomputed LoRA layers of a model case under a policy. */
static int64_t recomputed_layers(const lt_model_config *cfg, int64_t num_layers, lt_recompute r) {
    int64_t K = num_layers > 0 ? num_layers : cfg->L, n = 0;
    for (int64_t l = cfg->L - K; l < cfg->L; l++) n += lt_model_recomputes_layer(cfg, r, l);
    return n;
}

/* Which layers rerun attention: on the tiny Gemma 3 (S S G S S G S S) every layer recomputed, the
 * top layer (the last segment, whose stores the backward reads from the forward) neither reruns
 * nor keeps it; of the seven below, a count of 3 reruns the first three sliding layers (0, 1, 3),
 * 6 all five sliding ones and the first global one (2); the others keep their outputs in slots
 * numbered from the bottom. */
static void partial_rerun_takes_sliding_layers_first(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, tiny_dir, NULL, &cfg), LT_OK);
    const int64_t K = cfg.L;
    assert_int_equal(K, 8);
    const struct {
        int64_t rerun;
        int32_t katt[8];
        int64_t n_katt;
    } want[] = {
        {0, {0, 1, 2, 3, 4, 5, 6, -1}, 7},         {3, {-1, -1, 0, -1, 1, 2, 3, -1}, 4},
        {5, {-1, -1, 0, -1, -1, 1, -1, -1}, 2},    {6, {-1, -1, -1, -1, -1, 0, -1, -1}, 1},
        {7, {-1, -1, -1, -1, -1, -1, -1, -1}, 0},  {-1, {-1, -1, -1, -1, -1, -1, -1, -1}, 0},
        {99, {-1, -1, -1, -1, -1, -1, -1, -1}, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        lt_rc_place pl[8];
        lt_rc_counts n;
        lt_model_rc_walk(&cfg, LT_RECOMPUTE_EVERY, 1, K, want[i].rerun, pl, &n);
        assert_int_equal(n.n_katt, want[i].n_katt);
        for (int64_t j = 0; j < K; j++) assert_int_equal(pl[j].katt, want[i].katt[j]);
    }
    /* recompute global: only layers 2 and 5 are recomputed, 5 as the last segment; without reruns
     * layer 2 keeps its output, one rerun is layer 2's */
    lt_rc_place pl[8];
    lt_rc_counts n;
    lt_model_rc_walk(&cfg, LT_RECOMPUTE_GLOBAL, 1, K, 0, pl, &n);
    assert_int_equal(n.n_rec, 2);
    assert_int_equal(n.n_katt, 1);
    for (int64_t j = 0; j < K; j++) assert_int_equal(pl[j].katt, j == 2 ? 0 : -1);
    lt_model_rc_walk(&cfg, LT_RECOMPUTE_GLOBAL, 1, K, 1, pl, &n);
    assert_int_equal(n.n_katt, 0);
    for (int64_t j = 0; j < K; j++) assert_int_equal(pl[j].katt, -1);
    /* segments of two: the last one (layers 6, 7) keeps nothing; two reruns are layers 0 and 1 */
    lt_model_rc_walk(&cfg, LT_RECOMPUTE_EVERY_K, 2, K, 2, pl, &n);
    assert_int_equal(n.n_seg, 4);
    assert_int_equal(n.n_katt, 4);
    for (int64_t j = 0; j < K; j++) assert_int_equal(pl[j].katt, j < 2 || j > 5 ? -1 : (int32_t)(j - 2));
    int64_t sl = -1, other = -1;
    lt_model_attention_rerun_split(&cfg, LT_RECOMPUTE_EVERY_K, 2, K, -1, &sl, &other);
    assert_int_equal(sl, 4); /* 0, 1, 3, 4: 6 and 7 are the last segment */
    assert_int_equal(other, 2);
    lt_ctx_free(ctx);
}

static const policy RERUN_POLICIES[] = {
    {LT_RECOMPUTE_EVERY, 0},
    {LT_RECOMPUTE_EVERY_K, 2},
    {LT_RECOMPUTE_SLIDING, 0},
    {LT_RECOMPUTE_GLOBAL, 0},
};
#define N_RERUN (sizeof RERUN_POLICIES / sizeof RERUN_POLICIES[0])

/* At every count of layers rerunning attention, f32 checkpoints: loss, token losses and gradients
 * equal recompute none's bit for bit; bf16 checkpoints with segments of one layer: equal to keeping
 * attention everywhere (the rerun starts from the same rounded inputs). */
static void partial_rerun_equals_recompute_none(void **state) {
    (void)state;
    model_case mc[4];
    int n_cases = model_cases(mc);
    for (int ci = 0; ci < n_cases; ci++) {
        lt_ctx *ctx = lt_ctx_new();
        lt_model *m = load(ctx, mc[ci].dir, mc[ci].num_layers);
        const lt_model_config *cfg = lt_model_get_config(m);
        batch b;
        lt_model_batch mb = make_batch(&b, cfg->V);
        int64_t n = 0;
        (void)lt_model_lora_grads(m, &n);
        float *g0 = malloc((size_t)n * 4), *g = malloc((size_t)n * 4), *gk = malloc((size_t)n * 4);
        assert_true(g0 && g && gk);
        float tl0[N], tl[N], tlk[N];
        double l0, l, lk;
        lt_model_run_options ro = {0};
        ro.B = B, ro.T = T, ro.recompute = LT_RECOMPUTE_NONE;
        step(ctx, m, &mb, &ro, &l0, tl0, g0);
        for (size_t pi = 0; pi < N_RERUN; pi++) {
            const policy *p = &RERUN_POLICIES[pi];
            const int64_t n_rec = recomputed_layers(cfg, mc[ci].num_layers, p->r);
            lt_model_run_options rk = ro;
            rk.recompute = p->r, rk.recompute_k = p->k;
            for (int64_t cnt = 1; cnt < n_rec; cnt++) {
                rk.recompute_attention_layers = cnt, rk.saved_bf16 = -1;
                step(ctx, m, &mb, &rk, &l, tl, g);
                same_bits("loss", mc[ci].dir, p, (int)cnt, &l, &l0, sizeof l);
                same_bits("token losses", mc[ci].dir, p, (int)cnt, tl, tl0, sizeof tl);
                same_bits("gradients", mc[ci].dir, p, (int)cnt, g, g0, (size_t)n * 4);
                if (p->k > 1) continue;
                rk.saved_bf16 = 1;
                step(ctx, m, &mb, &rk, &l, tl, g);
                lt_model_run_options kept = rk;
                kept.recompute_attention_layers = 0;
                step(ctx, m, &mb, &kept, &lk, tlk, gk);
                same_bits("bf16 loss", mc[ci].dir, p, (int)cnt, &l, &lk, sizeof l);
                same_bits("bf16 gradients", mc[ci].dir, p, (int)cnt, g, gk, (size_t)n * 4);
            }
        }
        free(g0), free(g), free(gk);
        lt_model_free(ctx, m);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The size table is the allocations at every count; each layer that reruns attention keeps the
 * same bytes less (its output, lse and on the CPU its q/k/v half); rerunning in all of them plans
 * as recompute_attention; a negative count is a typed error. */
static void partial_rerun_plans_what_it_allocates(void **state) {
    (void)state;
    model_case mc[4];
    int n_cases = model_cases(mc);
    for (int ci = 0; ci < n_cases; ci++)
        for (size_t pi = 0; pi < N_RERUN; pi++) {
            lt_ctx *ctx = lt_ctx_new();
            lt_lora_options lo = {0};
            lo.rank = 4, lo.num_layers = mc[ci].num_layers;
            lt_model_config cfg;
            assert_int_equal(lt_model_inspect(ctx, mc[ci].dir, NULL, &cfg), LT_OK);
            const policy *p = &RERUN_POLICIES[pi];
            const int64_t n_rec = recomputed_layers(&cfg, mc[ci].num_layers, p->r);
            /* the layers that can rerun attention: the recomputed ones below the last segment */
            int64_t e_sl = 0, e_other = 0;
            lt_model_attention_rerun_split(&cfg, p->r, lt_model_recompute_cap(p->r, p->k),
                                           mc[ci].num_layers > 0 ? mc[ci].num_layers : cfg.L, -1, &e_sl, &e_other);
            const int64_t n_rerun = e_sl + e_other;
            lt_model_run_options ro = {0};
            ro.B = B, ro.T = T, ro.recompute = p->r, ro.recompute_k = p->k, ro.saved_bf16 = -1;
            size_t act[16];
            assert_true(n_rec < 16);
            lt_model *m = NULL;
            assert_int_equal(lt_model_load(ctx, mc[ci].dir, NULL, &lo, &m), LT_OK);
            batch b;
            lt_model_batch mb = make_batch(&b, cfg.V);
            assert_true(n_rerun < n_rec);
            for (int64_t cnt = 0; cnt <= n_rerun; cnt++) {
                ro.recompute_attention_layers = cnt;
                lt_model_sizes want;
                assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                lt_model_sizes got = lt_model_get_sizes(m);
                for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
                size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
                lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
                lt_model_result r;
                assert_int_equal(lt_model_forward_backward(ctx, m, &mb, 0, &r, NULL), LT_OK);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, before);
                act[cnt] = want.bytes[LT_MEM_ACTIVATIONS];
                if (cnt > 0) {
                    assert_true(act[cnt] < act[cnt - 1]);
                    assert_int_equal(act[cnt - 1] - act[cnt], act[0] - act[1]);
                }
            }
            lt_model_run_options all = ro;
            all.recompute_attention_layers = 0, all.recompute_attention = 1;
            lt_model_sizes sa;
            assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &all, &sa), LT_OK);
            assert_int_equal(sa.bytes[LT_MEM_ACTIVATIONS], act[n_rerun]);
            ro.recompute_attention_layers = n_rec + 5; /* more than there are: all of them */
            lt_model_sizes more;
            assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &more), LT_OK);
            assert_int_equal(more.total, sa.total);
            ro.recompute_attention_layers = -1;
            assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &more), LT_ERR_INVALID_ARG);
            assert_non_null(strstr(lt_ctx_error(ctx), "recompute_attention_layers"));
            lt_model_free(ctx, m);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
            lt_ctx_free(ctx);
        }
}

/* recompute auto on the Gemma-3-shaped config at 8k tokens, budgets between all's plan rerunning
 * attention everywhere and keeping it everywhere: each choice fits; one rerunning attention in
 * some layers reruns it in the fewest that fit (one fewer does not); some budget takes such a
 * choice. The option is refused with auto, without a recompute policy and beside
 * recompute_attention. */
static void auto_reruns_attention_in_the_fewest_layers(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg;
    lt_train_options opt;
    lt_plan_options po;
    gemma3_auto(ctx, &cfg, &opt, &po);
    size_t ends[2];
    for (int rerun = 0; rerun <= 1; rerun++) {
        lt_train_options c = opt;
        c.recompute_auto = 0, c.recompute = LT_RECOMPUTE_EVERY, c.recompute_attention = rerun;
        lt_plan_options p = po;
        p.run.recompute = LT_RECOMPUTE_EVERY, p.run.recompute_attention = rerun;
        lt_plan pl;
        assert_int_equal(lt_train_plan(ctx, &c, &cfg, &p, NULL, &pl), LT_OK);
        ends[rerun] = pl.peak_bytes;
    }
    assert_true(ends[1] < ends[0]);
    int partial = 0;
    for (int i = 0; i <= 8; i++) {
        const size_t budget = ends[1] + (ends[0] - ends[1]) * (size_t)i / 8;
        lt_train_options ch;
        lt_plan pc;
        assert_int_equal(lt_train_choose_recompute(ctx, &opt, &cfg, &po, NULL, budget, &ch, &pc), LT_OK);
        assert_true(pc.peak_bytes <= budget);
        if (ch.recompute_attention_layers == 0) continue;
        partial = 1;
        assert_int_equal(ch.recompute_attention, 0);
        lt_train_options fewer = ch;
        fewer.recompute_attention_layers--;
        lt_plan_options fp = po;
        fp.run.recompute = fewer.recompute, fp.run.recompute_k = fewer.recompute_every;
        fp.run.chunk_rows = fewer.chunk_rows;
        fp.run.recompute_attention_layers = fewer.recompute_attention_layers;
        lt_plan pf;
        assert_int_equal(lt_train_plan(ctx, &fewer, &cfg, &fp, NULL, &pf), LT_OK);
        assert_true(pf.peak_bytes > budget);
    }
    assert_true(partial);
    /* the option's neighbours */
    const char *with[3][2] = {{"recompute", "auto"}, {"recompute", "none"}, {"recompute_attention", "true"}};
    for (int i = 0; i < 3; i++) {
        lt_train_options o = base_options(), r;
        if (i == 2) assert_int_equal(lt_train_options_set(ctx, &o, "recompute", "all"), LT_OK);
        assert_int_equal(lt_train_options_set(ctx, &o, with[i][0], with[i][1]), LT_OK);
        assert_int_equal(lt_train_options_set(ctx, &o, "recompute_attention_layers", "4"), LT_OK);
        assert_int_equal(lt_train_options_resolve(ctx, &o, &r), LT_ERR_INVALID_ARG);
        assert_non_null(strstr(lt_ctx_error(ctx), "recompute_attention_layers"));
    }
    lt_train_options o = base_options(), r;
    assert_int_equal(lt_train_options_set(ctx, &o, "recompute", "all"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &o, "recompute_attention_layers", "4"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &o, &r), LT_OK);
    lt_plan_options rp;
    assert_int_equal(lt_train_plan_options(ctx, &r, 1, 1, &rp), LT_OK);
    assert_int_equal(rp.run.recompute_attention_layers, 4);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kind_policies_equal_recompute_none),
        cmocka_unit_test(size_table_equals_allocations),
        cmocka_unit_test(by_kind_prices_between_none_and_all),
        cmocka_unit_test(missing_kinds_and_uniform_models),
        cmocka_unit_test(auto_orders_by_kind_by_work),
        cmocka_unit_test(names_and_options),
        cmocka_unit_test(partial_rerun_takes_sliding_layers_first),
        cmocka_unit_test(partial_rerun_equals_recompute_none),
        cmocka_unit_test(partial_rerun_plans_what_it_allocates),
        cmocka_unit_test(auto_reruns_attention_in_the_fewest_layers),
        cmocka_unit_test(auto_prefers_a_partial_rerun_to_longer_segments),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
