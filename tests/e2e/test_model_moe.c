/* Mixture-of-experts models (Qwen3-MoE, Qwen2-MoE with its shared expert, Mixtral) against transformers + PEFT fixtures
 * (tests/oracle/gen_moe_fixtures.py): logits, the cross entropy, the router's load-balancing loss and
 * every LoRA gradient (the aux term's included) of a packed batch, from HF folders (one tensor per
 * expert, and transformers 5's fused gate_up_proj / down_proj stacks) and from GGUF
 * files written as llama.cpp's converter writes them, on every backend present (CPU; CUDA when the
 * build and the machine have it); dispatch chunks of 1, 3 and all tokens and every recompute policy
 * give the same numbers; the size table equals what the allocator holds and a step allocates
 * nothing; with bf16 products (CPU) the quantized experts take them; bad configs and files are
 * refused by name. */
#define _GNU_SOURCE
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "helpers/backends.h"
#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/kv_cache.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"
#include "longtune/sysinfo.h"

/* fp32 against fp32 PyTorch: summation order only. The CUDA step reads its matmul and attention
 * inputs in bf16 (unit roundoff 2^-8), as tests/e2e/test_cuda_gemma.c allows. */
#define ORACLE_REL 1e-4
#define SAME_REL 1e-5
#define BF16_U 0x1.0p-8
#define CUDA_REL_LOSS (8 * BF16_U)
#define CUDA_REL_GRAD (32 * BF16_U)
#define LT_MOE_MAX_EXPERTS_TEST 512 /* the routing ops' limit (backend.h) */

/* Head dims 16 and 8 (the first cases) run on the CPU; the _hd64 cases (head_dim 64, top-k margins
 * of 1e-2) are the ones a CUDA device's attention kernels serve. */
static const char *const CASES[] = {"qwen3moe",       "qwen3moe_dense1", "qwen3moe_nonorm", "mixtral",
                                    "qwen3moe_fused", "qwen2moe_shared", "qwen3moe_hd64",   "mixtral_hd64"};

typedef lt_test_fixture fixture;

static void case_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/moe/%s", lt_test_source_dir(), c);
}

static float meta_f(lt_ctx *ctx, const fixture *f, const char *key) {
    const char *v = lt_safetensors_metadata(f->exp, key);
    if (!v) {
        fprintf(stderr, "fixture: no metadata %s (%s)\n", key, lt_ctx_error(ctx));
        fail();
    }
    return strtof(v, NULL);
}

/* Whether dev's backend serves the attention of the model at path (its head dim, asked through the
 * backend's supports); prints why not and returns 0 when it does not. */
static int device_serves(const char *path, lt_device dev) {
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config c;
    lt_model_options mo = {0};
    mo.device = dev;
    if (lt_model_inspect(ctx, path, &mo, &c) != LT_OK) {
        fprintf(stderr, "%s: %s\n", path, lt_ctx_error(ctx));
        fail();
    }
    lt_op_query q;
    memset(&q, 0, sizeof q);
    q.op = LT_OP_ATTENTION;
    q.dtype = lt_test_input_dtype(dev);
    q.head_dim = c.D;
    int ok = lt_backend_supports(ctx, dev, &q) == LT_OK;
    if (!ok)
        printf("%s: skipped on %s (head dim %lld): %s\n", path, lt_test_backend_name(dev), (long long)c.D,
               lt_ctx_error(ctx));
    lt_ctx_free(ctx);
    return ok;
}

/* Loads case c (file: a model file in its folder, or NULL) on dev with the fixture's adapter. */
static lt_model *load_on(lt_ctx *ctx, const char *c, const char *file, const fixture *f, lt_device dev) {
    char path[1200];
    case_dir(c, path, sizeof path);
    if (file) {
        strcat(path, "/");
        strcat(path, file);
    }
    lt_lora_options lo = {0};
    lo.rank = f->rank, lo.alpha = f->alpha, lo.num_layers = f->num_layers, lo.seed = 7;
    lt_model_options mo = {0};
    mo.device = dev;
    lt_model *m = NULL;
    if (lt_model_load(ctx, path, &mo, &lo, &m) != LT_OK) {
        fprintf(stderr, "%s: %s\n", c, lt_ctx_error(ctx));
        fail();
    }
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        int64_t n;
        const float *v = lt_test_fixture_tensor(ctx, f, t.name, &n);
        assert_int_equal(n, lt_tensor_numel(&t.value));
        assert_int_equal(lt_model_lora_set(ctx, m, t.offset, n, v), LT_OK);
    }
    return m;
}

/* Every run shape of one case on one device against the oracle: the three recompute policies,
 * dispatch chunks of 1, 3 and all tokens, forward-only logits; gradients equal across shapes.
 * with_aux = 0 (GGUF files carry no coefficient): the gradients are the cross entropy's alone,
 * grad - aux_coef · grad_aux of the fixture. */
static void check_case(const char *c, const char *file, lt_device dev) {
    char dir[1024], mpath[1200];
    case_dir(c, dir, sizeof dir);
    snprintf(mpath, sizeof mpath, "%s%s%s", dir, file ? "/" : "", file ? file : "");
    if (!device_serves(mpath, dev)) return;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    lt_test_fixture_open(ctx, dir, &f);
    lt_model *m = load_on(ctx, c, file, &f, dev);
    const lt_model_config *cfg = lt_model_get_config(m);
    int with_aux = cfg->moe_aux_coef > 0;
    float coef = meta_f(ctx, &f, "aux_coef");
    if (with_aux) assert_true(fabsf(cfg->moe_aux_coef - coef) < 1e-9f);
    int cuda = dev != LT_DEVICE_CPU;
    double rel_loss = cuda ? CUDA_REL_LOSS : ORACLE_REL, rel_grad = cuda ? CUDA_REL_GRAD : ORACLE_REL;
    int64_t N = f.B * f.T, ng = 0;
    lt_model_batch b = lt_test_fixture_batch(&f);
    const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K};
    const int64_t chunks[3] = {0, 1, 3};
    float *first = NULL, *g = NULL, tl[64];
    lt_model_lora_grads(m, &ng);
    g = malloc((size_t)ng * 4);
    for (int pi = 0; pi < 3; pi++)
        for (int ci = 0; ci < 3; ci++) {
            char what[300];
            lt_model_run_options ro = {0};
            ro.B = f.B, ro.T = f.T, ro.recompute = pol[pi], ro.recompute_k = 2, ro.moe_chunk_tokens = chunks[ci];
            ro.chunk_rows = ci == 2 ? 7 : 0; /* position-wise chunks that cut dispatch chunks */
            assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
            if (ci == 0) {
                snprintf(what, sizeof what, "%s%s%s %s logits (policy %d)", c, file ? " " : "", file ? file : "",
                         lt_test_backend_name(dev), pi);
                lt_test_fixture_check_logits(ctx, m, &f, what, rel_loss);
            }
            lt_model_zero_grads(m);
            lt_model_result r;
            if (lt_model_forward_backward(ctx, m, &b, 0.0f, &r, tl) != LT_OK) {
                fprintf(stderr, "%s: %s\n", c, lt_ctx_error(ctx));
                fail();
            }
            snprintf(what, sizeof what, "%s %s ce (policy %d, moe chunk %lld)", c, lt_test_backend_name(dev), pi,
                     (long long)chunks[ci]);
            float ce = (float)(r.loss_sum / (double)r.n_tokens);
            lt_test_compare(what, &ce, lt_test_fixture_tensor(ctx, &f, "loss_ce", NULL), 1, rel_loss);
            lt_test_compare(what, tl, lt_test_fixture_tensor(ctx, &f, "token_loss", NULL), N, rel_loss);
            if (with_aux) {
                float aux = (float)r.aux_loss, total = ce + coef * aux;
                snprintf(what, sizeof what, "%s %s aux_loss", c, lt_test_backend_name(dev));
                lt_test_compare(what, &aux, lt_test_fixture_tensor(ctx, &f, "aux_loss", NULL), 1, rel_loss);
                lt_test_compare(what, &total, lt_test_fixture_tensor(ctx, &f, "loss", NULL), 1, rel_loss);
            } else {
                assert_true(r.aux_loss == 0);
            }
            for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
                lt_lora_tensor t;
                assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
                char key[200];
                int64_t n = lt_tensor_numel(&t.grad);
                snprintf(key, sizeof key, "%s.grad", t.name);
                const float *want = lt_test_fixture_tensor(ctx, &f, key, NULL);
                float *w = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
                snprintf(key, sizeof key, "%s.grad_aux", t.name);
                const float *wa = lt_test_fixture_tensor(ctx, &f, key, NULL);
                for (int64_t e = 0; e < n; e++) w[e] = with_aux ? want[e] : want[e] - coef * wa[e];
                assert_int_equal(lt_model_lora_get(ctx, m, 1, t.offset, n, got), LT_OK);
                snprintf(what, sizeof what, "%s %s %s.grad (policy %d, moe chunk %lld)", c, lt_test_backend_name(dev),
                         t.name, pi, (long long)chunks[ci]);
                lt_test_compare(what, got, w, n, rel_grad);
                free(w);
                free(got);
            }
            assert_int_equal(lt_model_lora_get(ctx, m, 1, 0, ng, g), LT_OK);
            if (!first) {
                first = malloc((size_t)ng * 4);
                memcpy(first, g, (size_t)ng * 4);
            } else { /* dispatch chunks and recompute change memory, never numbers */
                snprintf(what, sizeof what, "%s %s grads (policy %d, moe chunk %lld) vs unchunked", c,
                         lt_test_backend_name(dev), pi, (long long)chunks[ci]);
                lt_test_compare(what, g, first, ng, cuda ? rel_grad : SAME_REL);
            }
            /* evaluation: the same cross entropy and aux loss */
            lt_model_result rf;
            assert_int_equal(lt_model_forward(ctx, m, &b, &rf, NULL), LT_OK);
            float cef = (float)(rf.loss_sum / (double)rf.n_tokens);
            snprintf(what, sizeof what, "%s %s forward-only ce", c, lt_test_backend_name(dev));
            lt_test_compare(what, &cef, &ce, 1, cuda ? rel_loss : SAME_REL);
            float auxf = (float)rf.aux_loss, aux = (float)r.aux_loss;
            lt_test_compare(what, &auxf, &aux, 1, cuda ? rel_loss : SAME_REL);
        }
    free(first);
    free(g);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void matches_transformers_peft(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    for (int d = 0; d < nd; d++)
        for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) check_case(CASES[ci], NULL, devs[d]);
}

/* The GGUF files (experts stacked as blk.N.ffn_*_exps, the router as ffn_gate_inp; Mixtral as
 * arch llama with permuted Q/K rows) give the same model. */
static void gguf_matches_transformers_peft(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    for (int d = 0; d < nd; d++) {
        check_case("qwen3moe", "model.gguf", devs[d]);
        check_case("mixtral", "model.gguf", devs[d]);
        check_case("qwen2moe_shared", "model.gguf", devs[d]);
        check_case("mixtral_hd64", "model.gguf", devs[d]);
    }
}

/* What the readers make of the fixtures: experts, top-k, widths, the dense layer, the
 * normalisation, the aux coefficient; the per-layer MLP kinds. */
static void configs_and_layers(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1200];
    lt_model_config c;
    case_dir("qwen3moe_dense1", dir, sizeof dir);
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    assert_true(c.arch == LT_ARCH_QWEN3_MOE && c.n_experts == 8 && c.n_experts_used == 2 && c.moe_F == 16 &&
                c.F == 40 && c.moe_norm_topk && c.qk_norm && fabsf(c.moe_aux_coef - 0.02f) < 1e-9f);
    for (int64_t l = 0; l < 3; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(&c, l, &d);
        assert_int_equal(d.mlp, l == 1 ? LT_MLP_KIND_SWIGLU : LT_MLP_KIND_MOE);
    }
    case_dir("qwen3moe_nonorm", dir, sizeof dir); /* "num_experts", "rope_theta" spelling */
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    assert_true(c.n_experts == 8 && !c.moe_norm_topk);
    case_dir("qwen2moe_shared", dir, sizeof dir);
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    assert_true(c.arch == LT_ARCH_QWEN2_MOE && c.n_experts == 4 && c.moe_shared_F == 24 && c.qkv_bias && !c.qk_norm &&
                !c.moe_norm_topk);
    case_dir("mixtral", dir, sizeof dir);
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    assert_true(c.arch == LT_ARCH_MIXTRAL && c.n_experts == 4 && c.n_experts_used == 2 && c.moe_F == 16 &&
                c.moe_norm_topk && c.sliding_window == 0);
    strcat(dir, "/model.gguf");
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    assert_true(c.arch == LT_ARCH_MIXTRAL && c.n_experts == 4 && c.moe_F == 16 && c.moe_aux_coef == 0);
    case_dir("qwen3moe", dir, sizeof dir);
    strcat(dir, "/model.gguf");
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    assert_true(c.arch == LT_ARCH_QWEN3_MOE && c.n_experts == 8 && c.moe_F == 16 && c.qk_norm);
    lt_ctx_free(ctx);
}

/* The planner's numbers are the allocator's for MoE layer lists (the dispatch buffers at the
 * chunk, the stacked experts, the routers, the shared expert), on every backend present, and a
 * step allocates nothing. */
static void size_table_equals_allocations(void **state) {
    (void)state;
    const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K};
    const char *const cases[5] = {"qwen3moe_dense1", "mixtral", "qwen2moe_shared", "qwen3moe_hd64", "mixtral_hd64"};
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    for (int di = 0; di < nd; di++)
        for (int ci = 0; ci < 5; ci++) {
            char dir[1024];
            case_dir(cases[ci], dir, sizeof dir);
            if (!device_serves(dir, devs[di])) continue;
            for (int pi = 0; pi < 3; pi++)
                for (int fo = 0; fo < 2; fo++) {
                    lt_ctx *ctx = lt_ctx_new();
                    lt_lora_options lo = {0};
                    lo.rank = 4;
                    lt_device dev = devs[di];
                    lt_model_options mo = {0};
                    mo.device = dev;
                    lt_model_config cfg;
                    assert_int_equal(lt_model_inspect(ctx, dir, &mo, &cfg), LT_OK);
                    lt_model_run_options ro = {0};
                    ro.B = 2, ro.T = 12, ro.recompute = pol[pi], ro.recompute_k = 2, ro.forward_only = fo;
                    ro.device = dev;
                    ro.moe_chunk_tokens = pi == 1 ? 5 : 0;
                    ro.chunk_rows = pi == 2 ? 7 : 0;
                    lt_model_sizes want;
                    assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
                    lt_model *m = NULL;
                    assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
                    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                    lt_model_sizes got = lt_model_get_sizes(m);
                    for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
                    assert_int_equal(lt_mem_get_stats(ctx, dev).used_bytes, want.total);
                    fixture f;
                    lt_test_fixture_open(ctx, dir, &f);
                    size_t before = lt_mem_get_stats(ctx, dev).used_bytes;
                    lt_mem_reset_peak(ctx, dev);
                    lt_model_batch b = lt_test_fixture_batch(&f);
                    lt_model_result r;
                    if (fo) assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
                    else assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
                    assert_int_equal(lt_mem_get_stats(ctx, dev).peak_bytes, before);
                    lt_safetensors_close(ctx, f.exp);
                    lt_model_free(ctx, m);
                    assert_int_equal(lt_mem_get_stats(ctx, dev).used_bytes, 0);
                    lt_ctx_free(ctx);
                }
        }
    /* a smaller dispatch chunk takes less workspace */
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    case_dir("mixtral", dir, sizeof dir);
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &cfg), LT_OK);
    lt_model_run_options ro = {0};
    ro.B = 2, ro.T = 12;
    lt_model_sizes full, small;
    assert_int_equal(lt_model_size_table(ctx, &cfg, NULL, &ro, &full), LT_OK);
    ro.moe_chunk_tokens = 2;
    assert_int_equal(lt_model_size_table(ctx, &cfg, NULL, &ro, &small), LT_OK);
    assert_true(small.bytes[LT_MEM_WORKSPACE] < full.bytes[LT_MEM_WORKSPACE]);
    ro.moe_chunk_tokens = -1;
    assert_int_equal(lt_model_size_table(ctx, &cfg, NULL, &ro, &small), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "moe_chunk_tokens"));
    lt_ctx_free(ctx);
}

static void expect_load_error(lt_ctx *ctx, const char *rel, lt_status want, const char *needle) {
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/fixtures/moe/%s", lt_test_source_dir(), rel);
    lt_model *m = NULL;
    lt_status s = lt_model_load(ctx, path, NULL, NULL, &m);
    if (s != want || !strstr(lt_ctx_error(ctx), needle)) {
        fprintf(stderr, "%s: status %d (want %d): %s (want \"%s\")\n", rel, (int)s, (int)want, lt_ctx_error(ctx),
                needle);
        fail();
    }
    assert_null(m);
}

/* Bad files and configs: typed errors naming the key or tensor. */
static void bad_inputs_are_refused(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    expect_load_error(ctx, "bad/topk_gt_experts", LT_ERR_FORMAT,
                      "\"num_experts_per_tok\" = 5 must be in 1..4 (the experts)");
    expect_load_error(ctx, "bad/missing_expert", LT_ERR_NOT_FOUND,
                      "tensor 'model.layers.0.mlp.experts.3.up_proj.weight' is missing");
    expect_load_error(ctx, "bad/router_shape", LT_ERR_SHAPE,
                      "tensor 'model.layers.0.mlp.gate.weight' has shape (3, 32), expected (4, 32)");
    expect_load_error(ctx, "bad/router_shape_cols", LT_ERR_SHAPE,
                      "tensor 'model.layers.0.mlp.gate.weight' has shape (4, 31), expected (4, 32)");
    expect_load_error(ctx, "bad/topk_gt_experts.gguf", LT_ERR_FORMAT,
                      "metadata 'qwen3moe.expert_used_count' = 5 is outside 1..4");
    expect_load_error(ctx, "bad/missing_expert.gguf", LT_ERR_NOT_FOUND, "tensor 'blk.0.ffn_up_exps.weight' is missing");
    expect_load_error(ctx, "bad/expert_shape.gguf", LT_ERR_SHAPE,
                      "tensor 'blk.0.ffn_up_exps.weight' has 3 dims (3, 8, 32), expected (4, 8, 32)");
    expect_load_error(ctx, "bad/router_shape.gguf", LT_ERR_SHAPE,
                      "tensor 'blk.0.ffn_gate_inp.weight' has shape (3, 32), expected (4, 32)");
    { /* the planner's inspect refuses a router of the wrong shape as the load does */
        char path[1200];
        lt_model_config ic;
        snprintf(path, sizeof path, "%s/tests/fixtures/moe/bad/router_shape", lt_test_source_dir());
        assert_int_equal(lt_model_inspect(ctx, path, NULL, &ic), LT_ERR_SHAPE);
        assert_non_null(strstr(lt_ctx_error(ctx), "tensor 'model.layers.0.mlp.gate.weight' has shape (3, 32)"));
    }
    /* hand-made configs through the size table */
    char dir[1024];
    case_dir("mixtral", dir, sizeof dir);
    lt_model_config good, c;
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &good), LT_OK);
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = 8;
    lt_model_sizes sz;
    c = good, c.n_experts_used = 5;
    assert_int_equal(lt_model_size_table(ctx, &c, NULL, &ro, &sz), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "top-k"));
    c = good, c.n_experts = 0;
    assert_int_equal(lt_model_size_table(ctx, &c, NULL, &ro, &sz), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "n_experts"));
    c = good, c.n_experts = LT_MOE_MAX_EXPERTS_TEST + 1, c.n_experts_used = 2;
    assert_int_equal(lt_model_size_table(ctx, &c, NULL, &ro, &sz), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "n_experts"));
    c = good, c.moe_F = 0;
    assert_int_equal(lt_model_size_table(ctx, &c, NULL, &ro, &sz), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "moe_F"));
    c = good, c.moe_shared_F = -1;
    assert_int_equal(lt_model_size_table(ctx, &c, NULL, &ro, &sz), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "shared expert width moe_shared_F = -1"));
    /* LoRA on the experts names the layer */
    lt_lora_options lo = {0};
    lo.targets = 1u << LT_PROJ_UP;
    assert_int_equal(lt_model_size_table(ctx, &good, &lo, &ro, &sz), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "lora: layer 0 is a mixture-of-experts layer"));
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_ERR_UNSUPPORTED);
    assert_null(m);
    /* ... but not on a dense layer of a model with experts */
    case_dir("qwen3moe_dense1", dir, sizeof dir);
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    lo.targets = 1u << LT_PROJ_UP | 1u << LT_PROJ_Q, lo.num_layers = 3;
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "layer 0"));
    c.moe_dense[2] = 1; /* layers 1 and 2 dense: LoRA on the last two takes their MLPs */
    lo.num_layers = 2;
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_OK);
    /* config.json refusals */
#define W ", \"moe_intermediate_size\": 16"
    static const struct {
        const char *json, *needle;
        lt_status st;
    } bad[] = {
        {"\"num_experts\": 0, \"num_experts_per_tok\": 1" W, "experts (\"num_experts\") is outside 1..512",
         LT_ERR_FORMAT},
        {"\"num_experts\": 600, \"num_experts_per_tok\": 2" W, "experts (\"num_experts\") is outside 1..512",
         LT_ERR_FORMAT},
        {"\"num_experts\": 4, \"num_experts_per_tok\": 0" W, "num_experts_per_tok", LT_ERR_FORMAT},
        {"\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 0",
         "\"moe_intermediate_size\" = 0 must be positive", LT_ERR_FORMAT},
        {"\"num_experts\": 4, \"num_experts_per_tok\": 2, \"mlp_only_layers\": [7]" W, "\"mlp_only_layers\" holds 7",
         LT_ERR_FORMAT},
        {"\"num_experts\": 4, \"num_experts_per_tok\": 2, \"decoder_sparse_step\": 0" W,
         "\"decoder_sparse_step\" = 0 must be >= 1", LT_ERR_FORMAT},
        {"\"num_experts_per_tok\": 2" W, "num_experts", LT_ERR_FORMAT},
        {"\"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": -3",
         "\"moe_intermediate_size\" = -3 must be positive", LT_ERR_FORMAT},
    };
#undef W
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char d2[] = "/tmp/lt_moe_cfg_XXXXXX", p[128];
        assert_non_null(mkdtemp(d2));
        snprintf(p, sizeof p, "%s/config.json", d2);
        FILE *fp = fopen(p, "w");
        assert_non_null(fp);
        fprintf(fp,
                "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32, \"intermediate_size\": 40, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                "\"num_key_value_heads\": 2, \"head_dim\": 8, %s}",
                bad[i].json);
        fclose(fp);
        lt_status s = lt_model_config_read_hf(ctx, p, &c);
        unlink(p);
        rmdir(d2);
        if (s != bad[i].st || !strstr(lt_ctx_error(ctx), bad[i].needle)) {
            fprintf(stderr, "case %zu: status %d: %s\n", i, (int)s, lt_ctx_error(ctx));
            fail();
        }
    }
    lt_ctx_free(ctx);
}

/* transformers' load_balancing_loss_func from the fixture's router logits over the real tokens
 * (real[i] != 0): p = softmax, f_e = top-k picks of e / M, P_e = Σ p / M, aux = E Σ f_e P_e. */
static double aux_reference(lt_ctx *ctx, const fixture *f, int64_t L, int64_t E, int64_t k, const uint8_t *real) {
    int64_t N = f->B * f->T;
    double cnt[64] = {0}, psum[64] = {0}, M = 0;
    for (int64_t l = 0; l < L; l++) {
        char key[64];
        snprintf(key, sizeof key, "router_logits.%lld", (long long)l);
        const float *lg = lt_test_fixture_tensor(ctx, f, key, NULL);
        for (int64_t t = 0; t < N; t++) {
            if (!real[t]) continue;
            double mx = -INFINITY, z = 0, p[64];
            for (int64_t e = 0; e < E; e++) mx = fmax(mx, lg[t * E + e]);
            for (int64_t e = 0; e < E; e++) z += p[e] = exp(lg[t * E + e] - mx);
            int used[64] = {0};
            for (int64_t e = 0; e < E; e++) psum[e] += p[e] / z;
            for (int64_t j = 0; j < k; j++) {
                int64_t best = -1;
                for (int64_t e = 0; e < E; e++)
                    if (!used[e] && (best < 0 || p[e] > p[best])) best = e;
                used[best] = 1;
                cnt[best] += 1;
            }
            M += 1;
        }
    }
    double aux = 0;
    for (int64_t e = 0; e < E; e++) aux += (cnt[e] / M) * (psum[e] / M);
    return aux * (double)E;
}

/* Padding (real_seqs: a row's trailing segments) stays out of the router's statistics, as
 * transformers' attention_mask keeps padded tokens out; without real_seqs every token counts. */
static void aux_leaves_padding_out(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    char dir[1024];
    case_dir("qwen3moe", dir, sizeof dir);
    lt_test_fixture_open(ctx, dir, &f);
    lt_model *m = load_on(ctx, "qwen3moe", NULL, &f, LT_DEVICE_CPU);
    const lt_model_config *c = lt_model_get_config(m);
    lt_model_run_options ro = {0};
    ro.B = f.B, ro.T = f.T, ro.moe_chunk_tokens = 4;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    lt_model_batch b = lt_test_fixture_batch(&f);
    uint8_t real[64];
    memset(real, 1, sizeof real);
    lt_model_result r;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
    double want = aux_reference(ctx, &f, c->L, c->n_experts, c->n_experts_used, real);
    assert_true(fabs(r.aux_loss - want) <= 1e-5 * want);
    /* row 0's second document as padding */
    int32_t rs[2] = {1, 1};
    b.real_seqs = rs;
    for (int64_t t = f.offsets[1]; t < f.T; t++) real[t] = 0;
    double pad = aux_reference(ctx, &f, c->L, c->n_experts, c->n_experts_used, real);
    assert_true(fabs(pad - want) > 1e-4 * want); /* the case tells them apart */
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
    assert_true(fabs(r.aux_loss - pad) <= 1e-5 * pad);
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
    assert_true(fabs(r.aux_loss - pad) <= 1e-5 * pad);
    rs[1] = 3; /* beyond S */
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "real_seqs[1] = 3 is outside 0..S = 2"));
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    lt_ctx_free(ctx);
}

/* Block-quantized experts (a GGUF's Q4_0 gate/up and Q8_0 down stacks, tests/oracle/
 * gen_moe_quant_fixtures.py) are held as they are stored and give what the same values in f32 give;
 * --quantize turns f32 experts into blocks like any projection. */
static void quantized_experts(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const char *const folders[2] = {"quant", "quant_hd64"}; /* head dims 32 and 64 */
    for (int di = 0; di < nd; di++)
        for (int fi = 0; fi < 2; fi++) {
            char q[1200], f[1200];
            snprintf(q, sizeof q, "%s/tests/fixtures/moe/%s/model_q.gguf", lt_test_source_dir(), folders[fi]);
            snprintf(f, sizeof f, "%s/tests/fixtures/moe/%s/model_f32.gguf", lt_test_source_dir(), folders[fi]);
            if (!device_serves(q, devs[di])) continue;
            lt_ctx *ctx = lt_ctx_new();
            lt_model_options mo = {0};
            mo.device = devs[di];
            lt_lora_options lo = {0};
            lo.rank = 4, lo.seed = 3;
            lt_model *mq = NULL, *mf = NULL, *m8 = NULL;
            assert_int_equal(lt_model_load(ctx, q, &mo, &lo, &mq), LT_OK);
            assert_int_equal(lt_model_load(ctx, f, &mo, &lo, &mf), LT_OK);
            mo.quantize_dtype = LT_DTYPE_FP8; /* an fp8 base is for dense models: refused, named */
            assert_int_equal(lt_model_load(ctx, f, &mo, &lo, &m8), LT_ERR_UNSUPPORTED);
            assert_non_null(strstr(lt_ctx_error(ctx), "an fp8 base is for dense models"));
            assert_null(m8);
            mo.quantize_dtype = LT_DTYPE_Q8_0;
            assert_int_equal(lt_model_load(ctx, f, &mo, &lo, &m8), LT_OK);
            const lt_model_config *cq = lt_model_get_config(mq);
            assert_int_equal(cq->proj_dtype[LT_PROJ_GATE], LT_DTYPE_Q4_0);
            assert_int_equal(cq->proj_dtype[LT_PROJ_DOWN], LT_DTYPE_Q8_0);
            assert_int_equal(lt_model_get_config(m8)->proj_dtype[LT_PROJ_UP], LT_DTYPE_Q8_0);
            assert_true(lt_model_get_sizes(mq).bytes[LT_MEM_WEIGHTS] < lt_model_get_sizes(mf).bytes[LT_MEM_WEIGHTS]);
            int32_t tok[32], tgt[32];
            uint64_t rs = 11;
            for (int i = 0; i < 32; i++) tok[i] = (int32_t)(lt_test_rand_u64(&rs) % (uint64_t)cq->V);
            for (int i = 0; i < 32; i++) tgt[i] = i == 31 ? LT_IGNORE_INDEX : tok[i + 1];
            lt_model_batch b = {0};
            b.B = 2, b.T = 16, b.tokens = tok, b.targets = tgt;
            lt_model_run_options ro = {0};
            ro.B = 2, ro.T = 16, ro.moe_chunk_tokens = 5;
            float *lq = malloc(32 * (size_t)cq->V * 4), *lf = malloc(32 * (size_t)cq->V * 4),
                  *l8 = malloc(32 * (size_t)cq->V * 4);
            lt_model *ms[3] = {mq, mf, m8};
            float *ls[3] = {lq, lf, l8};
            double loss[3];
            float *grads[3];
            int64_t ng = 0;
            for (int i = 0; i < 3; i++) {
                assert_int_equal(lt_model_prepare(ctx, ms[i], &ro), LT_OK);
                assert_int_equal(lt_model_logits(ctx, ms[i], &b, ls[i]), LT_OK);
                lt_model_result r;
                assert_int_equal(lt_model_forward_backward(ctx, ms[i], &b, 0, &r, NULL), LT_OK);
                loss[i] = r.loss_sum / (double)r.n_tokens;
                lt_model_lora_grads(ms[i], &ng);
                grads[i] = malloc((size_t)ng * 4);
                assert_int_equal(lt_model_lora_get(ctx, ms[i], 1, 0, ng, grads[i]), LT_OK);
            }
            int cuda = devs[di] != LT_DEVICE_CPU;
            lt_test_compare("quantized experts' logits vs their f32 values", lq, lf, 32 * cq->V,
                            cuda ? CUDA_REL_LOSS : SAME_REL);
            lt_test_compare("quantized experts' LoRA grads vs their f32 values", grads[0], grads[1], ng,
                            cuda ? CUDA_REL_GRAD : 1e-4);
            assert_true(fabs(loss[0] - loss[1]) <= 1e-4 * fabs(loss[1]));
            /* --quantize q8_0: close to f32, not equal */
            lt_test_compare("--quantize q8_0 logits vs f32", l8, lf, 32 * cq->V, 0.05);
            for (int i = 0; i < 3; i++) {
                free(grads[i]);
                free(ls[i]);
                lt_model_free(ctx, ms[i]);
            }
            lt_ctx_free(ctx);
        }
}

/* bf16 products reach the routed experts (CPU, oneDNN): with them the quantized experts' products
 * take x and the dequantized W rounded to bf16, as any projection's do, so their logits move from
 * those of the same values held in f32 (whose f32 experts keep f32 products) by more than the
 * summation order, and stay within bf16 rounding of their own f32-product logits; the step
 * allocates nothing and the size table holds the workspace it used. */
static void bf16_products_experts(void **state) {
    (void)state;
    char q[1200], f[1200];
    snprintf(q, sizeof q, "%s/tests/fixtures/moe/quant/model_q.gguf", lt_test_source_dir());
    snprintf(f, sizeof f, "%s/tests/fixtures/moe/quant/model_f32.gguf", lt_test_source_dir());
    if (!device_serves(q, LT_DEVICE_CPU)) return;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_options mo = {0};
    mo.device = LT_DEVICE_CPU;
    lt_lora_options lo = {0};
    lo.rank = 4, lo.seed = 3;
    lt_model *mq = NULL, *mf = NULL;
    assert_int_equal(lt_model_load(ctx, q, &mo, &lo, &mq), LT_OK);
    assert_int_equal(lt_model_load(ctx, f, &mo, &lo, &mf), LT_OK);
    const int64_t V = lt_model_get_config(mq)->V;
    int32_t tok[32], tgt[32];
    uint64_t rs = 17;
    for (int i = 0; i < 32; i++) tok[i] = (int32_t)(lt_test_rand_u64(&rs) % (uint64_t)V);
    for (int i = 0; i < 32; i++) tgt[i] = i == 31 ? LT_IGNORE_INDEX : tok[i + 1];
    lt_model_batch b = {0};
    b.B = 2, b.T = 16, b.tokens = tok, b.targets = tgt;
    lt_model_run_options ro = {0};
    ro.B = 2, ro.T = 16, ro.moe_chunk_tokens = 5, ro.bf16_products = 1;
    if (!lt_sys_cpu_bf16_products()) {
        assert_int_equal(lt_model_prepare(ctx, mq, &ro), LT_ERR_UNSUPPORTED);
        printf("      bf16 products refused: none on this CPU (no oneDNN, or no AVX-512)\n");
    } else {
        float *lq = malloc(32 * (size_t)V * 4), *lf = malloc(32 * (size_t)V * 4), *l0 = malloc(32 * (size_t)V * 4);
        lt_model *ms[2] = {mq, mf};
        float *ls[2] = {lq, lf};
        for (int i = 0; i < 2; i++) {
            assert_int_equal(lt_model_prepare(ctx, ms[i], &ro), LT_OK);
            lt_model_sizes want;
            assert_int_equal(lt_model_size_table(ctx, lt_model_get_config(ms[i]), lt_model_get_lora(ms[i]), &ro, &want),
                             LT_OK);
            assert_int_equal(lt_model_get_sizes(ms[i]).bytes[LT_MEM_WORKSPACE], want.bytes[LT_MEM_WORKSPACE]);
            assert_int_equal(lt_model_logits(ctx, ms[i], &b, ls[i]), LT_OK);
            size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
            lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
            lt_model_result r;
            assert_int_equal(lt_model_forward_backward(ctx, ms[i], &b, 0, &r, NULL), LT_OK);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes, before);
        }
        ro.bf16_products = 0;
        assert_int_equal(lt_model_prepare(ctx, mq, &ro), LT_OK);
        assert_int_equal(lt_model_logits(ctx, mq, &b, l0), LT_OK);
        double scale = 0, moved = 0, off = 0;
        for (int64_t i = 0; i < 32 * V; i++) {
            scale = fmax(scale, fabs((double)l0[i]));
            moved = fmax(moved, fabs((double)lq[i] - lf[i]));
            off = fmax(off, fabs((double)lq[i] - l0[i]));
        }
        printf("      bf16 products on the experts: quantized vs their f32 values %.3g, vs f32 products %.3g of the "
               "largest logit\n",
               moved / scale, off / scale);
        assert_true(moved > SAME_REL * scale);
        assert_true(off <= 8 * BF16_U * scale);
        free(lq), free(lf), free(l0);
    }
    lt_model_free(ctx, mq);
    lt_model_free(ctx, mf);
    lt_ctx_free(ctx);
}

/* Generation's KV cache runs the MoE layers: a prompt's prefill and each decoded token give the
 * logits lt_model_logits_last gives on the whole prefix (the shared expert and a dense layer
 * included), on every backend present. */
static void kv_cache_generates(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const char *const cases[5] = {"qwen3moe_dense1", "mixtral", "qwen2moe_shared", "qwen3moe_hd64", "mixtral_hd64"};
    for (int di = 0; di < nd; di++)
        for (int ci = 0; ci < 5; ci++) {
            char dir[1024];
            case_dir(cases[ci], dir, sizeof dir);
            if (!device_serves(dir, devs[di])) continue;
            lt_ctx *ctx = lt_ctx_new();
            lt_model_options mo = {0};
            mo.device = devs[di];
            lt_lora_options lo = {0};
            lo.rank = 4, lo.seed = 5;
            lt_model *m = NULL;
            assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
            const lt_model_config *c = lt_model_get_config(m);
            int64_t V = c->V;
            lt_kv_cache *kv = NULL;
            if (lt_kv_cache_new(ctx, m, 1, 16, 0, &kv, NULL) != LT_OK) {
                fprintf(stderr, "%s: %s\n", cases[ci], lt_ctx_error(ctx));
                fail();
            }
            int32_t tok[12];
            uint64_t rs = 17 + (uint64_t)ci;
            for (int i = 0; i < 12; i++) tok[i] = (int32_t)(4 + lt_test_rand_u64(&rs) % (uint64_t)(V - 4));
            float *got = malloc((size_t)V * 4), *want = malloc((size_t)V * 4);
            int64_t seq = 0;
            for (int64_t len = 8; len <= 12; len++) { /* a prefill of 8, then one token at a time */
                const int32_t *tp = len == 8 ? tok : tok + len - 1;
                int64_t nt = len == 8 ? 8 : 1;
                assert_int_equal(lt_kv_cache_extend(ctx, kv, 1, &seq, &tp, &nt, got), LT_OK);
                lt_model_run_options ro = {0};
                ro.B = 1, ro.T = len, ro.forward_only = 1;
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                lt_model_batch b = {0};
                b.B = 1, b.T = len, b.tokens = tok;
                assert_int_equal(lt_model_logits_last(ctx, m, &b, want), LT_OK);
                char what[200];
                snprintf(what, sizeof what, "%s %s kv cache logits at length %lld", cases[ci],
                         lt_test_backend_name(devs[di]), (long long)len);
                lt_test_compare(what, got, want, V, devs[di] == LT_DEVICE_CPU ? SAME_REL : CUDA_REL_LOSS);
            }
            free(got);
            free(want);
            lt_kv_cache_free(ctx, kv);
            lt_model_free(ctx, m);
            lt_ctx_free(ctx);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(configs_and_layers),
        cmocka_unit_test(matches_transformers_peft),
        cmocka_unit_test(gguf_matches_transformers_peft),
        cmocka_unit_test(aux_leaves_padding_out),
        cmocka_unit_test(quantized_experts),
        cmocka_unit_test(bf16_products_experts),
        cmocka_unit_test(kv_cache_generates),
        cmocka_unit_test(size_table_equals_allocations),
        cmocka_unit_test(bad_inputs_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
