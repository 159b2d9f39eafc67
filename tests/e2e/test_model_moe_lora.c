/* LoRA on the experts of mixture-of-experts layers (targets experts.gate_up_proj and
 * experts.down_proj) against transformers + PEFT fixtures (tests/oracle/gen_moe_fixtures.py,
 * target_parameters on transformers 5's fused expert stacks; the <case>/xlora* subfolders): logits,
 * the cross entropy, the router's load-balancing loss and every LoRA gradient, the experts' included
 * (PEFT's (r·E, in) and (out, r·E) layouts mapped element by element), from HF folders and GGUF files,
 * on every backend present (CPU; CUDA on the head-dim-64 cases when the build and machine have it);
 * dispatch chunks and recompute policies give the same numbers; a gradient against finite
 * differences; the enumeration's names and shapes; quantized experts equal their f32 values; the
 * KV cache's generation includes the adapters; the size table equals the allocations; bad
 * targets are refused by name. */
#define _GNU_SOURCE
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
#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/kv_cache.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"

#define ORACLE_REL 1e-4
#define SAME_REL 1e-5
#define BF16_U 0x1.0p-8
#define CUDA_REL_LOSS (8 * BF16_U)
#define CUDA_REL_GRAD (32 * BF16_U)

typedef lt_test_fixture fixture;

static void case_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/moe/%s", lt_test_source_dir(), c);
}

/* Target bits of a --lora-targets list ("q_proj,...,experts.down_proj"). */
static unsigned targets_of(const char *list) {
    unsigned t = 0;
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        for (int k = 0; k < LT_PROJ_COUNT_; k++)
            if (strlen(lt_proj_name((lt_proj)k)) == n && !strncmp(p, lt_proj_name((lt_proj)k), n)) t |= 1u << k;
        if (n == 20 && !strncmp(p, "experts.gate_up_proj", n)) t |= LT_LORA_EXPERTS_GATE_UP;
        if (n == 17 && !strncmp(p, "experts.down_proj", n)) t |= LT_LORA_EXPERTS_DOWN;
        p = e ? e + 1 : p + n;
    }
    return t;
}

/* The storage element of PEFT's element i (model.h's layout, written out independently): A and plain
 * matrices element for element; an expert B [o, j·E + e] is expert e's row o (gate_up: the gate stack
 * for o < moe_F, the up stack after it), column j. */
static int64_t peft_to_storage(const lt_lora_tensor *t, int64_t i, int64_t r, int64_t moe_F) {
    if (!t->experts || !t->is_b) return i;
    int64_t E = t->experts, o = i / (r * E), col = i % (r * E), j = col / E, e = col % E;
    if (t->proj == LT_PROJ_DOWN) return (e * t->peft_rows + o) * r + j;
    int64_t up = o >= moe_F, oo = o - up * moe_F;
    return up * E * moe_F * r + (e * moe_F + oo) * r + j;
}

static lt_lora_options options_of(lt_ctx *ctx, const fixture *f) {
    lt_lora_options lo = {0};
    lo.rank = f->rank, lo.alpha = f->alpha, lo.num_layers = f->num_layers, lo.seed = 7;
    const char *t = lt_safetensors_metadata(f->exp, "targets");
    if (!t) {
        fprintf(stderr, "fixture without targets (%s)\n", lt_ctx_error(ctx));
        fail();
    }
    lo.targets = targets_of(t);
    return lo;
}

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

/* A fixture tensor in longtune's storage order. */
static float *to_storage(lt_ctx *ctx, const fixture *f, const lt_model *m, const lt_lora_tensor *t, const char *key) {
    int64_t n = 0, want = lt_tensor_numel(&t->value);
    const float *v = lt_test_fixture_tensor(ctx, f, key, &n);
    assert_int_equal(n, want);
    assert_int_equal(t->peft_rows * t->peft_cols, want);
    float *s = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) s[i] = LT_TEST_POISON;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = peft_to_storage(t, i, lt_model_get_lora(m)->rank, lt_model_get_config(m)->moe_F);
        assert_int_equal(k, lt_lora_tensor_peft_index(t, i)); /* the library's map is the same */
        s[k] = v[i];
    }
    for (int64_t i = 0; i < n; i++) assert_true(s[i] != LT_TEST_POISON); /* a permutation */
    return s;
}

static lt_model *load_on(lt_ctx *ctx, const char *model_path, const fixture *f, lt_device dev) {
    lt_lora_options lo = options_of(ctx, f);
    lt_model_options mo = {0};
    mo.device = dev;
    lt_model *m = NULL;
    if (lt_model_load(ctx, model_path, &mo, &lo, &m) != LT_OK) {
        fprintf(stderr, "%s: %s\n", model_path, lt_ctx_error(ctx));
        fail();
    }
    int64_t count = lt_model_lora_count(m), total = 0;
    assert_int_equal(count, (int64_t)strtoll(lt_safetensors_metadata(f->exp, "n_lora"), NULL, 10));
    for (int64_t i = 0; i < count; i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        float *s = to_storage(ctx, f, m, &t, t.name);
        int64_t n = lt_tensor_numel(&t.value);
        assert_int_equal(t.offset, total); /* the tensors tile the flat buffer in order */
        total += n;
        assert_int_equal(lt_model_lora_set(ctx, m, t.offset, n, s), LT_OK);
        free(s);
    }
    int64_t np = 0;
    lt_model_lora_params(m, &np);
    assert_int_equal(total, np);
    return m;
}

/* One fixture (sub: the xlora folder of case c; file: the model file in c's folder or NULL) on dev:
 * the recompute policies x dispatch chunks of all, 1 and 3 tokens against the oracle, and against
 * the first shape. */
static void check_case(const char *c, const char *sub, const char *file, lt_device dev) {
    char dir[1024], fdir[1100], mpath[1200];
    case_dir(c, dir, sizeof dir);
    snprintf(fdir, sizeof fdir, "%s/%s", dir, sub);
    snprintf(mpath, sizeof mpath, "%s%s%s", dir, file ? "/" : "", file ? file : "");
    if (!device_serves(mpath, dev)) return;
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    lt_test_fixture_open(ctx, fdir, &f);
    lt_model *m = load_on(ctx, mpath, &f, dev);
    const lt_model_config *cfg = lt_model_get_config(m);
    int with_aux = cfg->moe_aux_coef > 0;
    float coef = strtof(lt_safetensors_metadata(f.exp, "aux_coef"), NULL);
    int cuda = dev != LT_DEVICE_CPU;
    double rel_loss = cuda ? CUDA_REL_LOSS : ORACLE_REL, rel_grad = cuda ? CUDA_REL_GRAD : ORACLE_REL;
    int64_t N = f.B * f.T, ng = 0;
    lt_model_batch b = lt_test_fixture_batch(&f);
    const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K};
    const int64_t chunks[3] = {0, 1, 3};
    float *first = NULL, *g = NULL, tl[64];
    lt_model_lora_grads(m, &ng);
    g = malloc((size_t)ng * 4);
    int n_expert_checked = 0;
    for (int pi = 0; pi < 3; pi++)
        for (int ci = 0; ci < 3; ci++) {
            char what[400];
            lt_model_run_options ro = {0};
            ro.B = f.B, ro.T = f.T, ro.recompute = pol[pi], ro.recompute_k = 2, ro.moe_chunk_tokens = chunks[ci];
            ro.chunk_rows = ci == 2 ? 7 : 0;
            assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
            if (ci == 0) {
                snprintf(what, sizeof what, "%s/%s %s %s logits (policy %d)", c, sub, file ? file : "",
                         lt_test_backend_name(dev), pi);
                lt_test_fixture_check_logits(ctx, m, &f, what, rel_loss);
            }
            lt_model_zero_grads(m);
            lt_model_result r;
            if (lt_model_forward_backward(ctx, m, &b, 0.0f, &r, tl) != LT_OK) {
                fprintf(stderr, "%s: %s\n", c, lt_ctx_error(ctx));
                fail();
            }
            snprintf(what, sizeof what, "%s/%s %s ce (policy %d, moe chunk %lld)", c, sub, lt_test_backend_name(dev),
                     pi, (long long)chunks[ci]);
            float ce = (float)(r.loss_sum / (double)r.n_tokens);
            lt_test_compare(what, &ce, lt_test_fixture_tensor(ctx, &f, "loss_ce", NULL), 1, rel_loss);
            lt_test_compare(what, tl, lt_test_fixture_tensor(ctx, &f, "token_loss", NULL), N, rel_loss);
            if (with_aux) {
                float aux = (float)r.aux_loss;
                lt_test_compare(what, &aux, lt_test_fixture_tensor(ctx, &f, "aux_loss", NULL), 1, rel_loss);
            }
            for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
                lt_lora_tensor t;
                assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
                char key[200];
                int64_t n = lt_tensor_numel(&t.grad);
                snprintf(key, sizeof key, "%s.grad", t.name);
                float *want = to_storage(ctx, &f, m, &t, key);
                snprintf(key, sizeof key, "%s.grad_aux", t.name);
                float *wa = to_storage(ctx, &f, m, &t, key), *got = malloc((size_t)n * 4);
                for (int64_t e = 0; e < n; e++) want[e] = with_aux ? want[e] : want[e] - coef * wa[e];
                assert_int_equal(lt_model_lora_get(ctx, m, 1, t.offset, n, got), LT_OK);
                snprintf(what, sizeof what, "%s/%s %s %s %s.grad (policy %d, moe chunk %lld)", c, sub, file ? file : "",
                         lt_test_backend_name(dev), t.name, pi, (long long)chunks[ci]);
                lt_test_compare(what, got, want, n, rel_grad);
                if (t.experts) {
                    double mx = 0;
                    for (int64_t e = 0; e < n; e++) mx = fmax(mx, fabs(want[e]));
                    assert_true(mx > 1e-4); /* a gradient the comparison can tell from zero */
                    n_expert_checked++;
                }
                free(want);
                free(wa);
                free(got);
            }
            assert_int_equal(lt_model_lora_get(ctx, m, 1, 0, ng, g), LT_OK);
            if (!first) {
                first = malloc((size_t)ng * 4);
                memcpy(first, g, (size_t)ng * 4);
            } else {
                snprintf(what, sizeof what, "%s/%s %s grads (policy %d, moe chunk %lld) vs unchunked", c, sub,
                         lt_test_backend_name(dev), pi, (long long)chunks[ci]);
                lt_test_compare(what, g, first, ng, cuda ? rel_grad : SAME_REL);
            }
            lt_model_result rf;
            assert_int_equal(lt_model_forward(ctx, m, &b, &rf, NULL), LT_OK);
            float cef = (float)(rf.loss_sum / (double)rf.n_tokens);
            snprintf(what, sizeof what, "%s/%s %s forward-only ce", c, sub, lt_test_backend_name(dev));
            lt_test_compare(what, &cef, &ce, 1, cuda ? rel_loss : SAME_REL);
        }
    assert_true(n_expert_checked > 0);
    free(first);
    free(g);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void matches_transformers_peft(void **state) {
    (void)state;
    static const char *const cases[][2] = {{"qwen3moe", "xlora"},      {"qwen3moe", "xlora_gu"},
                                           {"mixtral", "xlora"},       {"qwen2moe_shared", "xlora"},
                                           {"qwen3moe_hd64", "xlora"}, {"mixtral_hd64", "xlora"}};
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    for (int d = 0; d < nd; d++) {
        if (devs[d] != LT_DEVICE_CPU) printf("expert LoRA on %s\n", lt_test_backend_name(devs[d]));
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_case(cases[i][0], cases[i][1], NULL, devs[d]);
    }
    if (nd < 2) printf("expert LoRA: no CUDA device in this build or machine; the CUDA arm is skipped\n");
}

/* GGUF files (experts stacked as blk.N.ffn_*_exps) with the same adapters. */
static void gguf_matches_transformers_peft(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    for (int d = 0; d < nd; d++) {
        check_case("qwen3moe", "xlora", "model.gguf", devs[d]);
        check_case("mixtral", "xlora", "model.gguf", devs[d]);
        check_case("qwen2moe_shared", "xlora", "model.gguf", devs[d]);
        check_case("mixtral_hd64", "xlora", "model.gguf", devs[d]);
    }
}

/* The enumeration: PEFT's names in PEFT's order and shapes, the storage shapes of model.h. */
static void enumeration_names_and_shapes(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    case_dir("qwen3moe_dense1", dir, sizeof dir); /* layers 0 and 2 MoE, 1 dense */
    for (int v = 0; v < 3; v++) {
        lt_lora_options lo = {0};
        lo.rank = 4;
        lo.targets = (1u << LT_PROJ_Q) |
            (v == 0       ? LT_LORA_EXPERT_TARGETS
                 : v == 1 ? LT_LORA_EXPERTS_GATE_UP
                          : LT_LORA_EXPERTS_DOWN);
        lt_model *m = NULL;
        assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
        const lt_model_config *c = lt_model_get_config(m);
        int64_t E = c->n_experts, F = c->moe_F, C = c->C, nx = v == 0 ? 2 : 1;
        assert_int_equal(lt_model_lora_count(m), 3 * 2 + 2 * 2 * nx);
        int64_t i = 0, off = 0;
        for (int64_t l = 0; l < 3; l++) {
            lt_lora_tensor t;
            for (int ab = 0; ab < 2; ab++, i++) { /* q_proj */
                assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
                assert_true(t.experts == 0 && t.layer == l && t.proj == LT_PROJ_Q && t.is_b == ab);
                assert_int_equal(t.peft_rows, ab ? c->H * c->D : 4);
                assert_int_equal(t.peft_cols, ab ? 4 : C);
                assert_int_equal(t.offset, off);
                off += t.peft_rows * t.peft_cols;
            }
            if (l == 1) continue;
            for (int w = 0; w < 2; w++) {
                if ((v == 1 && w == 1) || (v == 2 && w == 0)) continue;
                for (int ab = 0; ab < 2; ab++, i++) {
                    assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
                    assert_true(t.experts == E && t.layer == l && t.is_b == ab);
                    assert_int_equal(t.proj, w ? LT_PROJ_DOWN : LT_PROJ_GATE);
                    int64_t in = w ? F : C, out = w ? C : 2 * F;
                    assert_int_equal(t.peft_rows, ab ? out : 4 * E);
                    assert_int_equal(t.peft_cols, ab ? 4 * E : in);
                    assert_int_equal(lt_tensor_numel(&t.value), t.peft_rows * t.peft_cols);
                    assert_int_equal(t.value.shape[0], ab ? out * 4 * E : 4 * E);
                    assert_int_equal(t.offset, off);
                    off += t.peft_rows * t.peft_cols;
                    char want[160];
                    snprintf(want, sizeof want, "base_model.model.model.layers.%lld.mlp.experts%s.lora_%c.weight",
                             (long long)l, v == 0 && w == 0 ? ".base_layer" : "", ab ? 'B' : 'A');
                    assert_string_equal(t.name, want);
                    /* A from PEFT's kaiming bound 1/sqrt(in), B zero */
                    float *val = malloc((size_t)lt_tensor_numel(&t.value) * 4);
                    assert_int_equal(lt_model_lora_get(ctx, m, 0, t.offset, lt_tensor_numel(&t.value), val), LT_OK);
                    double mx = 0;
                    for (int64_t k = 0; k < lt_tensor_numel(&t.value); k++) mx = fmax(mx, fabs(val[k]));
                    if (ab) assert_true(mx == 0);
                    else assert_true(mx > 0.5 / sqrt((double)in) && mx <= 1.0 / sqrt((double)in));
                    free(val);
                }
            }
        }
        int64_t np = 0;
        lt_model_lora_params(m, &np);
        assert_int_equal(off, np);
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_ERR_INVALID_ARG);
        lt_model_free(ctx, m);
    }
    lt_ctx_free(ctx);
}

/* The total loss (cross entropy + coef·aux) of one forward. */
static double loss_of(lt_ctx *ctx, lt_model *m, const lt_model_batch *b) {
    lt_model_result r;
    assert_int_equal(lt_model_forward(ctx, m, b, &r, NULL), LT_OK);
    return r.loss_sum / (double)r.n_tokens + (double)lt_model_get_config(m)->moe_aux_coef * r.aux_loss;
}

/* d loss / d (one element of each expert tensor) against a central difference, on the CPU: the
 * element of largest gradient in each expert A and B of the first MoE layer. */
static void gradient_matches_finite_differences(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024], fdir[1100];
    case_dir("qwen3moe", dir, sizeof dir);
    snprintf(fdir, sizeof fdir, "%s/xlora", dir);
    fixture f;
    lt_test_fixture_open(ctx, fdir, &f);
    lt_model *m = load_on(ctx, dir, &f, LT_DEVICE_CPU);
    lt_model_batch b = lt_test_fixture_batch(&f);
    lt_model_run_options ro = {0};
    ro.B = f.B, ro.T = f.T, ro.moe_chunk_tokens = 5;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    lt_model_zero_grads(m);
    lt_model_result r;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0.0f, &r, NULL), LT_OK);
    int checked = 0;
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        if (!t.experts || t.layer != 0) continue;
        int64_t n = lt_tensor_numel(&t.grad), best = 0;
        float *g = malloc((size_t)n * 4);
        assert_int_equal(lt_model_lora_get(ctx, m, 1, t.offset, n, g), LT_OK);
        for (int64_t k = 1; k < n; k++)
            if (fabsf(g[k]) > fabsf(g[best])) best = k;
        float v0;
        assert_int_equal(lt_model_lora_get(ctx, m, 0, t.offset + best, 1, &v0), LT_OK);
        const float h = 1e-2f;
        float vp = v0 + h, vm = v0 - h;
        assert_int_equal(lt_model_lora_set(ctx, m, t.offset + best, 1, &vp), LT_OK);
        double lp = loss_of(ctx, m, &b);
        assert_int_equal(lt_model_lora_set(ctx, m, t.offset + best, 1, &vm), LT_OK);
        double lm = loss_of(ctx, m, &b);
        assert_int_equal(lt_model_lora_set(ctx, m, t.offset + best, 1, &v0), LT_OK);
        double fd = (lp - lm) / (double)(vp - vm);
        if (fabs(fd - g[best]) > 2e-2 * fabs(g[best]) + 1e-5) {
            fprintf(stderr, "%s[%lld]: gradient %g, finite difference %g\n", t.name, (long long)best, (double)g[best],
                    fd);
            fail();
        }
        assert_true(fabsf(g[best]) > 1e-3);
        checked++;
        free(g);
    }
    assert_int_equal(checked, 4);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    lt_ctx_free(ctx);
}

/* Random nonzero values in every LoRA tensor of m (the same for the same seed). */
static void randomize_lora(lt_ctx *ctx, lt_model *m, uint64_t seed) {
    int64_t n = 0;
    lt_model_lora_params(m, &n);
    float *v = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) v[i] = 0.2f * ((float)(lt_test_rand_u64(&seed) >> 40) * 0x1.0p-24f - 0.5f);
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, v), LT_OK);
    free(v);
}

/* Block-quantized experts (Q4_0 gate/up, Q8_0 down) with expert adapters give what their f32 values
 * give: logits, loss and every gradient (the experts' adapters' included). */
static void quantized_experts(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const char *const folders[2] = {"quant", "quant_hd64"};
    for (int di = 0; di < nd; di++)
        for (int fi = 0; fi < 2; fi++) {
            char q[1200], fp[1200];
            snprintf(q, sizeof q, "%s/tests/fixtures/moe/%s/model_q.gguf", lt_test_source_dir(), folders[fi]);
            snprintf(fp, sizeof fp, "%s/tests/fixtures/moe/%s/model_f32.gguf", lt_test_source_dir(), folders[fi]);
            if (!device_serves(q, devs[di])) continue;
            lt_ctx *ctx = lt_ctx_new();
            lt_model_options mo = {0};
            mo.device = devs[di];
            lt_lora_options lo = {0};
            lo.rank = 4, lo.seed = 3, lo.targets = (1u << LT_PROJ_V) | LT_LORA_EXPERT_TARGETS;
            lt_model *mq = NULL, *mf = NULL;
            assert_int_equal(lt_model_load(ctx, q, &mo, &lo, &mq), LT_OK);
            assert_int_equal(lt_model_load(ctx, fp, &mo, &lo, &mf), LT_OK);
            const lt_model_config *cq = lt_model_get_config(mq);
            assert_int_equal(cq->proj_dtype[LT_PROJ_GATE], LT_DTYPE_Q4_0);
            int32_t tok[32], tgt[32];
            uint64_t rs = 11;
            for (int i = 0; i < 32; i++) tok[i] = (int32_t)(lt_test_rand_u64(&rs) % (uint64_t)cq->V);
            for (int i = 0; i < 32; i++) tgt[i] = i == 31 ? LT_IGNORE_INDEX : tok[i + 1];
            lt_model_batch b = {0};
            b.B = 2, b.T = 16, b.tokens = tok, b.targets = tgt;
            lt_model_run_options ro = {0};
            ro.B = 2, ro.T = 16, ro.moe_chunk_tokens = 5;
            lt_model *ms[2] = {mq, mf};
            float *ls[2], *grads[2];
            int64_t ng = 0;
            for (int i = 0; i < 2; i++) {
                randomize_lora(ctx, ms[i], 99);
                ls[i] = malloc(32 * (size_t)cq->V * 4);
                assert_int_equal(lt_model_prepare(ctx, ms[i], &ro), LT_OK);
                assert_int_equal(lt_model_logits(ctx, ms[i], &b, ls[i]), LT_OK);
                lt_model_zero_grads(ms[i]);
                lt_model_result r;
                assert_int_equal(lt_model_forward_backward(ctx, ms[i], &b, 0, &r, NULL), LT_OK);
                lt_model_lora_grads(ms[i], &ng);
                grads[i] = malloc((size_t)ng * 4);
                assert_int_equal(lt_model_lora_get(ctx, ms[i], 1, 0, ng, grads[i]), LT_OK);
            }
            int cuda = devs[di] != LT_DEVICE_CPU;
            lt_test_compare("quantized experts + expert LoRA: logits vs f32", ls[0], ls[1], 32 * cq->V,
                            cuda ? CUDA_REL_LOSS : SAME_REL);
            lt_test_compare("quantized experts + expert LoRA: grads vs f32", grads[0], grads[1], ng,
                            cuda ? CUDA_REL_GRAD : 1e-4);
            lt_lora_tensor t; /* the last tensor is layer 1's down B: a nonzero gradient */
            assert_int_equal(lt_model_lora_tensor(ctx, mq, lt_model_lora_count(mq) - 1, &t), LT_OK);
            assert_true(t.experts > 0 && t.is_b);
            double mx = 0;
            for (int64_t k = 0; k < lt_tensor_numel(&t.grad); k++) mx = fmax(mx, fabs(grads[0][t.offset + k]));
            assert_true(mx > 1e-4);
            for (int i = 0; i < 2; i++) {
                free(grads[i]);
                free(ls[i]);
                lt_model_free(ctx, ms[i]);
            }
            lt_ctx_free(ctx);
        }
}

/* Generation's KV cache runs the expert adapters: prefill and decoded tokens give the logits
 * lt_model_logits_last gives, and those differ from the model without the expert adapters. */
static void kv_cache_includes_adapters(void **state) {
    (void)state;
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    const char *const cases[3] = {"qwen3moe_dense1", "qwen2moe_shared", "qwen3moe_hd64"};
    for (int di = 0; di < nd; di++)
        for (int ci = 0; ci < 3; ci++) {
            char dir[1024];
            case_dir(cases[ci], dir, sizeof dir);
            if (!device_serves(dir, devs[di])) continue;
            lt_ctx *ctx = lt_ctx_new();
            lt_model_options mo = {0};
            mo.device = devs[di];
            lt_lora_options lo = {0};
            lo.rank = 4, lo.seed = 5, lo.targets = (1u << LT_PROJ_Q) | LT_LORA_EXPERT_TARGETS;
            lt_model *m = NULL, *plain = NULL;
            assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
            lo.targets = 1u << LT_PROJ_Q;
            assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &plain), LT_OK);
            randomize_lora(ctx, m, 31);
            int64_t V = lt_model_get_config(m)->V;
            lt_kv_cache *kv = NULL;
            assert_int_equal(lt_kv_cache_new(ctx, m, 1, 16, 0, &kv, NULL), LT_OK);
            int32_t tok[12];
            uint64_t rs = 17 + (uint64_t)ci;
            for (int i = 0; i < 12; i++) tok[i] = (int32_t)(4 + lt_test_rand_u64(&rs) % (uint64_t)(V - 4));
            float *got = malloc((size_t)V * 4), *want = malloc((size_t)V * 4), *base = malloc((size_t)V * 4);
            int64_t seq = 0;
            for (int64_t len = 8; len <= 12; len++) {
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
                snprintf(what, sizeof what, "%s %s kv cache + expert LoRA at length %lld", cases[ci],
                         lt_test_backend_name(devs[di]), (long long)len);
                lt_test_compare(what, got, want, V, devs[di] == LT_DEVICE_CPU ? SAME_REL : CUDA_REL_LOSS);
                if (len == 12) { /* the adapters change the output */
                    assert_int_equal(lt_model_prepare(ctx, plain, &ro), LT_OK);
                    assert_int_equal(lt_model_logits_last(ctx, plain, &b, base), LT_OK);
                    double d = 0;
                    for (int64_t i = 0; i < V; i++) d = fmax(d, fabs((double)got[i] - base[i]));
                    assert_true(d > 1e-3);
                }
            }
            free(got);
            free(want);
            free(base);
            lt_kv_cache_free(ctx, kv);
            lt_model_free(ctx, plain);
            lt_model_free(ctx, m);
            lt_ctx_free(ctx);
        }
}

/* The size table equals the allocations with expert adapters (per-layer LoRA sizes, the dispatch
 * chunk's adapter rows), and a step allocates nothing; the adapters' bytes are E·r·(C + 2·moe_F) +
 * E·r·(moe_F + C) floats per MoE layer. */
static void size_table_equals_allocations(void **state) {
    (void)state;
    const lt_recompute pol[3] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K};
    const char *const cases[3] = {"qwen3moe_dense1", "qwen2moe_shared", "qwen3moe_hd64"};
    lt_device devs[LT_TEST_MAX_BACKENDS];
    int nd = lt_test_backends(devs);
    for (int di = 0; di < nd; di++)
        for (int ci = 0; ci < 3; ci++) {
            char dir[1024];
            case_dir(cases[ci], dir, sizeof dir);
            if (!device_serves(dir, devs[di])) continue;
            for (int pi = 0; pi < 3; pi++)
                for (int fo = 0; fo < 2; fo++) {
                    lt_ctx *ctx = lt_ctx_new();
                    lt_lora_options lo = {0};
                    lo.rank = 4, lo.targets = (1u << LT_PROJ_K) | LT_LORA_EXPERT_TARGETS;
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
                    lt_model_sizes want, plain;
                    assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
                    lt_lora_options lp = lo;
                    lp.targets = 1u << LT_PROJ_K;
                    assert_int_equal(lt_model_size_table(ctx, &cfg, &lp, &ro, &plain), LT_OK);
                    int64_t n_moe = 0;
                    for (int64_t l = 0; l < cfg.L; l++) {
                        lt_layer_desc d;
                        lt_model_describe_layer(&cfg, l, &d);
                        n_moe += d.mlp == LT_MLP_KIND_MOE;
                    }
                    int64_t per = cfg.n_experts * 4 * (cfg.C + 2 * cfg.moe_F) + cfg.n_experts * 4 * (cfg.moe_F + cfg.C);
                    assert_int_equal(want.n_lora_params - plain.n_lora_params, n_moe * per);
                    assert_true(want.bytes[LT_MEM_WORKSPACE] > plain.bytes[LT_MEM_WORKSPACE]);
                    lt_model *m = NULL;
                    assert_int_equal(lt_model_load(ctx, dir, &mo, &lo, &m), LT_OK);
                    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                    lt_model_sizes got = lt_model_get_sizes(m);
                    for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
                    assert_int_equal(got.n_lora_params, want.n_lora_params);
                    assert_int_equal(lt_mem_get_stats(ctx, dev).used_bytes, want.total);
                    fixture f;
                    lt_test_fixture_open(ctx, dir, &f);
                    randomize_lora(ctx, m, 3);
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
}

/* Expert targets with dropout, on a model without experts, or where no LoRA layer is an MoE layer,
 * and gate/up/down on an MoE layer: typed errors naming the target. */
static void bad_targets_are_refused(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    case_dir("qwen3moe_dense1", dir, sizeof dir);
    lt_model_config c;
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &c), LT_OK);
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = 8;
    lt_model_sizes sz;
    lt_lora_options lo = {0};
    lo.targets = LT_LORA_EXPERT_TARGETS, lo.dropout = 0.1f;
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "experts.gate_up_proj: LoRA dropout"));
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_ERR_UNSUPPORTED);
    assert_null(m);
    lo.dropout = 0, lo.targets = LT_LORA_EXPERTS_DOWN;
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_OK);
    /* no MoE layer among the LoRA layers: layer 2 dense, LoRA on the last one */
    lt_model_config d2 = c;
    d2.moe_dense[2] = 1;
    lo.num_layers = 1;
    assert_int_equal(lt_model_size_table(ctx, &d2, &lo, &ro, &sz), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "experts.down_proj: none of the last 1 layers"));
    lo.num_layers = 2; /* layer 1 dense, layer 2 MoE */
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_OK);
    /* a model without experts */
    lt_model_config dense = c;
    dense.n_experts = dense.n_experts_used = dense.moe_F = dense.moe_shared_F = 0;
    lo.num_layers = 0;
    assert_int_equal(lt_model_size_table(ctx, &dense, &lo, &ro, &sz), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "experts.down_proj: the model has no mixture-of-experts layer"));
    /* gate/up/down on an MoE layer point to the expert targets */
    lo.targets = 1u << LT_PROJ_DOWN;
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "experts.gate_up_proj and experts.down_proj"));
    /* rank beyond the grouped weight gradient's */
    lo.targets = LT_LORA_EXPERTS_GATE_UP, lo.rank = LT_MOE_WGRAD_MAX_RANK + 1;
    assert_int_equal(lt_model_size_table(ctx, &c, &lo, &ro, &sz), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "rank 257"));
    /* expert bits alone keep the model's default projections (attention on MoE models) */
    lo.rank = 4, lo.targets = LT_LORA_EXPERTS_GATE_UP;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
    assert_int_equal(lt_model_get_lora(m)->targets, 0xfu | LT_LORA_EXPERTS_GATE_UP);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
}

typedef struct ranges {
    int n;
    int64_t off[16], count[16];
} ranges;

static lt_status record_range(void *arg, int64_t offset, int64_t count) {
    ranges *r = arg;
    if (r->n < 16) r->off[r->n] = offset, r->count[r->n] = count;
    r->n++;
    return LT_OK;
}

/* The grad-ready hook (data parallel's overlap) gets each LoRA layer's slice, last layer first:
 * MoE layers' slices are larger by their expert adapters, and the slices tile the buffer. */
static void grad_ready_slices_per_layer(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1024];
    case_dir("qwen3moe_dense1", dir, sizeof dir);
    lt_lora_options lo = {0};
    lo.rank = 4, lo.targets = (1u << LT_PROJ_Q) | (1u << LT_PROJ_O) | LT_LORA_EXPERT_TARGETS;
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
    randomize_lora(ctx, m, 5);
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = 8, ro.recompute = LT_RECOMPUTE_EVERY;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    ranges r = {0};
    lt_model_set_grad_ready(m, record_range, &r);
    int32_t tok[8] = {5, 9, 13, 17, 21, 25, 29, 33}, tgt[8] = {9, 13, 17, 21, 25, 29, 33, LT_IGNORE_INDEX};
    lt_model_batch b = {0};
    b.B = 1, b.T = 8, b.tokens = tok, b.targets = tgt;
    lt_model_result res;
    assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &res, NULL), LT_OK);
    assert_int_equal(r.n, 3);
    int64_t span[3][2] = {{INT64_MAX, 0}, {INT64_MAX, 0}, {INT64_MAX, 0}};
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        int64_t *sp = span[t.layer];
        if (t.offset < sp[0]) sp[0] = t.offset;
        if (t.offset + lt_tensor_numel(&t.value) > sp[1]) sp[1] = t.offset + lt_tensor_numel(&t.value);
    }
    for (int k = 0; k < 3; k++) { /* layer 2 first */
        assert_int_equal(r.off[k], span[2 - k][0]);
        assert_int_equal(r.count[k], span[2 - k][1] - span[2 - k][0]);
    }
    assert_true(r.count[1] < r.count[0]); /* layer 1 is dense */
    int64_t np = 0;
    lt_model_lora_params(m, &np);
    assert_int_equal(r.off[2], 0);
    assert_int_equal(r.off[0] + r.count[0], np);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(enumeration_names_and_shapes),        cmocka_unit_test(bad_targets_are_refused),
        cmocka_unit_test(matches_transformers_peft),           cmocka_unit_test(gguf_matches_transformers_peft),
        cmocka_unit_test(gradient_matches_finite_differences), cmocka_unit_test(quantized_experts),
        cmocka_unit_test(kv_cache_includes_adapters),          cmocka_unit_test(size_table_equals_allocations),
        cmocka_unit_test(grad_ready_slices_per_layer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
