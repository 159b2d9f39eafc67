/* The memory planner: its arithmetic (sum of the model's size table and the optimizer state,
 * monotone in B and T, naive arms costlier, exact search, JSON form), and the bar it exists for:
 * the accounting allocator's measured high-water over model load + one training step lies within
 * [0.97, 1.00] of the plan, across tiny Llama / Qwen2 / Qwen3 models with random weights, lengths,
 * batch sizes, recompute policies and both attention and loss implementations on the CPU. Also
 * the fault-injection walk: failing each allocation in turn gives a clean LT_ERR_OOM, no leak. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
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
#include <cjson/cJSON.h>

#include "helpers/test_util.h"
#include "helpers/train_data.h"
#include "longtune/alloc.h"
#include "longtune/context_parallel.h"
#include "longtune/log.h"
#include "longtune/plan.h"
#include "longtune/safetensors.h"
#include "longtune/train.h"
#include "train/train_internal.h"

/* Measured high-water over plan must land in [BAR_LO, BAR_HI]. */
#define BAR_LO 0.97
#define BAR_HI 1.00

static uint64_t rng;

typedef struct tiny {
    const char *name;
    lt_model_arch arch;
    int64_t V, C, F, L, H, Hkv, D;
    int tied;
    char dir[256];
} tiny;

static tiny tinies[] = {
    {"llama", LT_ARCH_LLAMA, 384, 64, 192, 2, 4, 2, 16, 0, ""}, /* rows of 64k: quantizable */
    {"qwen2", LT_ARCH_QWEN2, 320, 48, 128, 2, 4, 1, 12, 1, ""},
    {"qwen3", LT_ARCH_QWEN3, 352, 64, 96, 2, 4, 2, 32, 0, ""}, /* H·D = 128 != C */
};
#define N_TINY (sizeof tinies / sizeof tinies[0])

/* One tensor of random f32 values, scaled like an initialised layer. */
typedef struct wbuf {
    char name[128];
    float *data;
    int64_t shape[2];
    int ndim;
} wbuf;

static void add_tensor(wbuf *w, int *n, const char *name, int64_t rows, int64_t cols, float scale, float offset) {
    wbuf *t = &w[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = cols ? 2 : 1;
    t->shape[0] = rows;
    t->shape[1] = cols;
    int64_t n_el = rows * (cols ? cols : 1);
    t->data = malloc((size_t)n_el * sizeof(float));
    assert_non_null(t->data);
    lt_test_fill_normal(&rng, t->data, n_el, scale);
    for (int64_t i = 0; i < n_el; i++) t->data[i] += offset;
}

/* Writes an HF folder (config.json + model.safetensors, f32 random weights) for t. */
static void write_tiny(tiny *t) {
    char tmpl[] = "/tmp/lt_plan_model_XXXXXX";
    assert_non_null(mkdtemp(tmpl));
    snprintf(t->dir, sizeof t->dir, "%s", tmpl);
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", t->dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    static const char *const arch_names[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
    static const char *const types[] = {"llama", "qwen2", "qwen3"};
    fprintf(f,
            "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": %lld, "
            "\"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, "
            "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
            "\"rms_norm_eps\": 1e-6, \"rope_theta\": 10000.0, \"max_position_embeddings\": 8192, "
            "\"tie_word_embeddings\": %s, \"torch_dtype\": \"float32\", \"bos_token_id\": 1, "
            "\"eos_token_id\": 2}\n",
            arch_names[t->arch], types[t->arch], (long long)t->V, (long long)t->C, (long long)t->F, (long long)t->L,
            (long long)t->H, (long long)t->Hkv, (long long)t->D, t->tied ? "true" : "false");
    fclose(f);

    int cap = 16 + 16 * (int)t->L, n = 0;
    wbuf *w = calloc((size_t)cap, sizeof *w);
    assert_non_null(w);
    float s = 0.08f;
    add_tensor(w, &n, "model.embed_tokens.weight", t->V, t->C, s, 0);
    add_tensor(w, &n, "model.norm.weight", t->C, 0, 0.05f, 1);
    if (!t->tied) add_tensor(w, &n, "lm_head.weight", t->V, t->C, s, 0);
    for (int64_t l = 0; l < t->L; l++) {
        char nm[128];
#define LAYER(suffix) (snprintf(nm, sizeof nm, "model.layers.%lld.%s", (long long)l, suffix), nm)
        add_tensor(w, &n, LAYER("self_attn.q_proj.weight"), t->H * t->D, t->C, s, 0);
        add_tensor(w, &n, LAYER("self_attn.k_proj.weight"), t->Hkv * t->D, t->C, s, 0);
        add_tensor(w, &n, LAYER("self_attn.v_proj.weight"), t->Hkv * t->D, t->C, s, 0);
        add_tensor(w, &n, LAYER("self_attn.o_proj.weight"), t->C, t->H * t->D, s, 0);
        add_tensor(w, &n, LAYER("mlp.gate_proj.weight"), t->F, t->C, s, 0);
        add_tensor(w, &n, LAYER("mlp.up_proj.weight"), t->F, t->C, s, 0);
        add_tensor(w, &n, LAYER("mlp.down_proj.weight"), t->C, t->F, s, 0);
        add_tensor(w, &n, LAYER("input_layernorm.weight"), t->C, 0, 0.05f, 1);
        add_tensor(w, &n, LAYER("post_attention_layernorm.weight"), t->C, 0, 0.05f, 1);
        if (t->arch == LT_ARCH_QWEN2) {
            add_tensor(w, &n, LAYER("self_attn.q_proj.bias"), t->H * t->D, 0, 0.02f, 0);
            add_tensor(w, &n, LAYER("self_attn.k_proj.bias"), t->Hkv * t->D, 0, 0.02f, 0);
            add_tensor(w, &n, LAYER("self_attn.v_proj.bias"), t->Hkv * t->D, 0, 0.02f, 0);
        }
        if (t->arch == LT_ARCH_QWEN3) {
            add_tensor(w, &n, LAYER("self_attn.q_norm.weight"), t->D, 0, 0.05f, 1);
            add_tensor(w, &n, LAYER("self_attn.k_norm.weight"), t->D, 0, 0.05f, 1);
        }
#undef LAYER
    }
    assert_true(n <= cap);
    lt_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    assert_non_null(e);
    for (int i = 0; i < n; i++) {
        e[i].name = w[i].name;
        e[i].tensor = lt_tensor_view(w[i].data, LT_DTYPE_F32, LT_DEVICE_CPU, w[i].ndim, w[i].shape);
    }
    lt_ctx *ctx = lt_ctx_new();
    snprintf(path, sizeof path, "%s/model.safetensors", t->dir);
    const char *meta[] = {"format", "pt"};
    assert_int_equal(lt_safetensors_write(ctx, path, e, n, meta, 1), LT_OK);
    lt_ctx_free(ctx);
    for (int i = 0; i < n; i++) free(w[i].data);
    free(w);
    free(e);
}

static int setup(void **state) {
    (void)state;
    rng = lt_test_seed();
    for (size_t i = 0; i < N_TINY; i++) write_tiny(&tinies[i]);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < N_TINY; i++) lt_test_rm_model_dir(tinies[i].dir);
    return 0;
}

static lt_model_config config_of_q(lt_ctx *ctx, const tiny *t, int quantize) {
    lt_model_config cfg;
    lt_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.quantize_dtype = quantize ? LT_DTYPE_INT4_G64 : LT_DTYPE_F32;
    assert_int_equal(lt_model_inspect(ctx, t->dir, &mo, &cfg), LT_OK);
    assert_int_equal(cfg.L, t->L);
    assert_int_equal(cfg.V, t->V);
    return cfg;
}

static lt_model_config config_of(lt_ctx *ctx, const tiny *t) { return config_of_q(ctx, t, 0); }

/* ---- arithmetic of the plan ---- */

static void plan_is_the_size_table_plus_optimizer(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (size_t i = 0; i < N_TINY; i++) {
        lt_model_config cfg = config_of(ctx, &tinies[i]);
        lt_plan_options po;
        memset(&po, 0, sizeof po);
        po.run.B = 2;
        po.run.T = 256;
        po.lora.rank = 4;
        lt_plan p;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_OK);
        lt_model_sizes ms;
        assert_int_equal(lt_model_size_table(ctx, &cfg, &p.options.lora, &p.options.run, &ms), LT_OK);
        size_t sum = 0;
        for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) {
            assert_int_equal(p.bytes[c], ms.bytes[c]);
            sum += ms.bytes[c];
        }
        assert_int_equal(sum, ms.total);
        assert_int_equal(p.n_lora_params, ms.n_lora_params);
        assert_int_equal(p.bytes[LT_PLAN_OPTIMIZER],
                         2 * lt_alloc_accounted_size(LT_DEVICE_CPU, (size_t)ms.n_lora_params * 4));
        assert_int_equal(p.bytes[LT_PLAN_HELD], 0);
        assert_int_equal(p.peak_bytes, sum + p.bytes[LT_PLAN_OPTIMIZER]);
        /* What the caller holds is carried through as its own class. */
        lt_plan_options ph = po;
        ph.held_bytes = 12345;
        lt_plan h;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &ph, &h), LT_OK);
        assert_int_equal(h.bytes[LT_PLAN_HELD], 12345);
        assert_int_equal(h.peak_bytes, p.peak_bytes + 12345);
        /* Defaults resolved in the echo of the options. */
        assert_int_equal(p.options.run.attention, LT_ATTENTION_FLASH);
        assert_int_equal(p.options.run.loss, LT_LCE_FUSED);
        /* LoRA on every projection of every layer: r·(in + out) per projection. */
        const tiny *t = &tinies[i];
        int64_t qd = t->H * t->D, kvd = t->Hkv * t->D;
        int64_t per_layer = 4 * ((t->C + qd) + 2 * (t->C + kvd) + (qd + t->C) + 2 * (t->C + t->F) + (t->F + t->C));
        assert_int_equal(p.n_lora_params, per_layer * t->L);
        /* A CUDA plan prices the CUDA kernels' workspaces, so it needs a build that has them, and
         * head dims the CUDA attention serves (these tiny ones have none); with D = 64 its classes
         * are the CUDA size table, every block rounded to 256 bytes. */
        lt_plan_options pc = po;
        pc.device = LT_DEVICE_CUDA;
        lt_plan q;
        lt_status qs = lt_plan_compute(ctx, &cfg, &pc, &q);
        assert_int_equal(qs, LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), LT_HAVE_CUDA ? "head dim" : "no CUDA backend"));
#if LT_HAVE_CUDA
        lt_model_config c64 = cfg;
        c64.D = 64;
        assert_int_equal(lt_plan_compute(ctx, &c64, &pc, &q), LT_OK);
        assert_int_equal(q.device, LT_DEVICE_CUDA);
        lt_model_sizes mc;
        assert_int_equal(lt_model_size_table(ctx, &c64, &q.options.lora, &q.options.run, &mc), LT_OK);
        assert_int_equal(q.options.run.device, LT_DEVICE_CUDA);
        for (int c = 0; c < LT_PLAN_HELD; c++) {
            assert_int_equal(q.bytes[c] % 256, 0);
            if (c < LT_MEM_CLASS_COUNT_) assert_int_equal(q.bytes[c], mc.bytes[c]);
        }
        assert_int_equal(q.bytes[LT_PLAN_OPTIMIZER], lt_plan_optimizer_bytes(LT_DEVICE_CUDA, q.n_lora_params));
#endif
    }
    lt_ctx_free(ctx);
}

static void plan_grows_with_shape_and_naive_arms_cost_more(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg = config_of(ctx, &tinies[0]);
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.run.B = 1;
    size_t last = 0;
    for (int64_t T = 64; T <= 8192; T *= 2) {
        po.run.T = T;
        lt_plan p;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_OK);
        assert_true(p.peak_bytes > last);
        last = p.peak_bytes;
        /* Weights and LoRA classes do not depend on the run shape. */
        lt_plan_options o2 = po;
        o2.run.B = 3;
        lt_plan p2;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &o2, &p2), LT_OK);
        assert_true(p2.peak_bytes > p.peak_bytes);
        for (int c = LT_PLAN_WEIGHTS; c <= LT_PLAN_GRADS; c++) assert_int_equal(p2.bytes[c], p.bytes[c]);
        assert_int_equal(p2.bytes[LT_PLAN_OPTIMIZER], p.bytes[LT_PLAN_OPTIMIZER]);
        /* Recompute trades activations for transients; keeping everything saves the most. */
        lt_plan pr;
        o2 = po;
        o2.run.recompute = LT_RECOMPUTE_EVERY;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &o2, &pr), LT_OK);
        assert_true(pr.bytes[LT_PLAN_ACTIVATIONS] < p.bytes[LT_PLAN_ACTIVATIONS]);
        if (T >= 1024) {
            /* The naive paths' (T, T) scores and (N, V) logits dwarf the fused workspaces. */
            o2 = po;
            o2.run.attention = LT_ATTENTION_NAIVE;
            lt_plan pa;
            assert_int_equal(lt_plan_compute(ctx, &cfg, &o2, &pa), LT_OK);
            assert_true(pa.peak_bytes > p.peak_bytes + (size_t)T * (size_t)T * 4);
            o2 = po;
            o2.run.loss = LT_LCE_NAIVE;
            lt_plan pl;
            assert_int_equal(lt_plan_compute(ctx, &cfg, &o2, &pl), LT_OK);
            /* The naive loss's workspace holds the fp32 (T, V) logits; the fused one only tiles,
             * so the naive arm costs more overall once the logits outgrow the fused run's whole
             * workspace class (the loss's workspace shares its place with the chunk buffers). */
            assert_true(pl.bytes[LT_PLAN_WORKSPACE] >= (size_t)T * (size_t)cfg.V * 4);
            if ((size_t)T * (size_t)cfg.V * 4 > p.bytes[LT_PLAN_WORKSPACE]) assert_true(pl.peak_bytes > p.peak_bytes);
        }
    }
    po.run.T = 0;
    lt_plan p;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "sequence length"));
    /* A size that overflows size_t is refused, not wrapped. */
    po.run.T = 1ll << 40;
    po.run.B = 1ll << 20;
    assert_int_not_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_OK);
    lt_ctx_free(ctx);
}

static void search_finds_the_exact_largest_value(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (size_t i = 0; i < N_TINY; i++) {
        lt_model_config cfg = config_of(ctx, &tinies[i]);
        lt_plan_options po;
        memset(&po, 0, sizeof po);
        po.run.B = 1;
        po.run.T = 1024;
        lt_plan base;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &base), LT_OK);
        /* A budget somewhere between T = 1024 and T = 4096. */
        lt_plan_options o4 = po;
        o4.run.T = 4096;
        lt_plan p4;
        assert_int_equal(lt_plan_compute(ctx, &cfg, &o4, &p4), LT_OK);
        size_t budget =
            base.peak_bytes + (size_t)(lt_test_uniform(&rng, 0.1, 0.9) * (double)(p4.peak_bytes - base.peak_bytes));
        for (int what = 0; what < 2; what++) {
            int64_t best = 0;
            int found = 0;
            assert_int_equal(lt_plan_search_max(ctx, &cfg, &po, (lt_plan_search)what, 1 << 16, budget, &best, &found),
                             LT_OK);
            assert_true(found);
            lt_plan_options o = po;
            lt_plan p;
            if (what == LT_PLAN_SEARCH_SEQ) {
                assert_true(best >= 1024 && best < 4096);
                o.run.T = best;
            } else {
                o.run.B = best;
            }
            assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &p), LT_OK);
            assert_true(p.peak_bytes <= budget);
            if (what == LT_PLAN_SEARCH_SEQ) o.run.T = best + 1;
            else o.run.B = best + 1;
            assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &p), LT_OK);
            assert_true(p.peak_bytes > budget);
        }
        /* Nothing fits a budget below the weights. */
        int64_t best = 7;
        int found = 1;
        assert_int_equal(lt_plan_search_max(ctx, &cfg, &po, LT_PLAN_SEARCH_SEQ, 1 << 16,
                                            base.bytes[LT_PLAN_WEIGHTS] / 2, &best, &found),
                         LT_OK);
        assert_false(found);
        assert_int_equal(best, 0);
        /* A saturated search returns the upper bound. */
        assert_int_equal(lt_plan_search_max(ctx, &cfg, &po, LT_PLAN_SEARCH_BATCH, 64, SIZE_MAX, &best, &found), LT_OK);
        assert_true(found);
        assert_int_equal(best, 64);
    }
    lt_ctx_free(ctx);
}

static void json_form_and_policy_names(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg = config_of(ctx, &tinies[2]);
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.run.B = 2;
    po.run.T = 300;
    po.lora.rank = 16;
    assert_int_equal(lt_plan_recompute_parse(ctx, "every:3", &po.run.recompute, &po.run.recompute_k), LT_OK);
    assert_int_equal(po.run.recompute, LT_RECOMPUTE_EVERY_K);
    assert_int_equal(po.run.recompute_k, 3);
    lt_plan p;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_OK);
    char buf[2048];
    assert_int_equal(lt_plan_to_json(ctx, &p, buf, sizeof buf), LT_OK);
    cJSON *o = cJSON_Parse(buf);
    assert_non_null(o);
    assert_string_equal(cJSON_GetObjectItem(o, "recompute")->valuestring, "every:3");
    assert_string_equal(cJSON_GetObjectItem(o, "attention")->valuestring, "flash");
    assert_string_equal(cJSON_GetObjectItem(o, "loss")->valuestring, "fused");
    assert_int_equal(cJSON_GetObjectItem(o, "batch")->valueint, 2);
    assert_int_equal(cJSON_GetObjectItem(o, "seq_len")->valueint, 300);
    assert_int_equal(cJSON_GetObjectItem(o, "lora_rank")->valueint, 16);
    cJSON *cl = cJSON_GetObjectItem(o, "classes");
    double sum = 0;
    for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++) {
        cJSON *v = cJSON_GetObjectItem(cl, lt_plan_class_name((lt_plan_class)c));
        assert_non_null(v);
        assert_true(v->valuedouble == (double)p.bytes[c]);
        sum += v->valuedouble;
    }
    assert_true(cJSON_GetObjectItem(o, "peak_bytes")->valuedouble == sum);
    cJSON_Delete(o);
    assert_int_equal(lt_plan_to_json(ctx, &p, buf, 100), LT_ERR_INVALID_ARG);
    lt_recompute r;
    int64_t k;
    assert_int_equal(lt_plan_recompute_parse(ctx, "all", &r, &k), LT_OK);
    assert_int_equal(r, LT_RECOMPUTE_EVERY);
    assert_int_equal(lt_plan_recompute_parse(ctx, "none", &r, &k), LT_OK);
    assert_int_equal(r, LT_RECOMPUTE_NONE);
    const char *bad[] = {"", "every:", "every:0", "every:x", "some", "every:2x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(lt_plan_recompute_parse(ctx, bad[i], &r, &k), LT_ERR_INVALID_ARG);
        assert_non_null(strstr(lt_ctx_error(ctx), "recompute"));
    }
    lt_ctx_free(ctx);
}

/* ---- the bar: measured high-water against the plan ---- */

typedef struct step_buffers {
    int32_t *tokens, *targets, *offsets;
    int64_t B, T, S;
} step_buffers;

/* Random tokens in packed rows of 1..3 sequences, with some ignored targets. Test scratch. */
static step_buffers make_batch(int64_t B, int64_t T, int64_t V) {
    step_buffers sb = {0};
    sb.B = B;
    sb.T = T;
    sb.S = 3;
    sb.tokens = malloc((size_t)(B * T) * sizeof(int32_t));
    sb.targets = malloc((size_t)(B * T) * sizeof(int32_t));
    sb.offsets = malloc((size_t)(B * (sb.S + 1)) * sizeof(int32_t));
    assert_true(sb.tokens && sb.targets && sb.offsets);
    for (int64_t i = 0; i < B * T; i++) {
        sb.tokens[i] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
        sb.targets[i] =
            lt_test_rand_u64(&rng) % 8 == 0 ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)V);
    }
    for (int64_t b = 0; b < B; b++) {
        int32_t *o = sb.offsets + b * (sb.S + 1);
        int32_t cut1 = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)T);
        int32_t cut2 = cut1 + (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)(T - cut1 + 1));
        o[0] = 0;
        o[1] = cut1;
        o[2] = cut2;
        o[3] = (int32_t)T;
    }
    return sb;
}

static void free_batch(step_buffers *sb) {
    free(sb->tokens);
    free(sb->targets);
    free(sb->offsets);
}

/* Model load + prepare + the optimizer state + one forward/backward + one AdamW update, all
 * through the accounting allocator, as the trainer runs it. Returns the first failure; frees
 * everything either way. */
static lt_status load_and_step(lt_ctx *ctx, const tiny *t, const lt_plan_options *po, const step_buffers *sb,
                               int quantize) {
    lt_model_options mo;
    memset(&mo, 0, sizeof mo);
    mo.quantize_dtype = quantize ? LT_DTYPE_INT4_G64 : LT_DTYPE_F32;
    lt_model *m = NULL;
    float *adam_m = NULL, *adam_v = NULL;
    int64_t n = 0;
    lt_status s = lt_model_load(ctx, t->dir, &mo, &po->lora, &m);
    if (s != LT_OK) goto fail;
    if ((s = lt_model_prepare(ctx, m, &po->run)) != LT_OK) goto fail;
    float *theta = lt_model_lora_params(m, &n);
    adam_m = lt_calloc(ctx, LT_DEVICE_CPU, (size_t)n * sizeof(float), "adamw m");
    if (!adam_m) {
        s = LT_ERR_OOM;
        goto fail;
    }
    adam_v = lt_calloc(ctx, LT_DEVICE_CPU, (size_t)n * sizeof(float), "adamw v");
    if (!adam_v) {
        s = LT_ERR_OOM;
        goto fail;
    }
    lt_model_batch b;
    memset(&b, 0, sizeof b);
    b.B = sb->B;
    b.T = sb->T;
    b.tokens = sb->tokens;
    b.targets = sb->targets;
    b.seq_offsets = sb->offsets;
    b.S = sb->S;
    lt_model_zero_grads(m);
    lt_model_result res;
    if ((s = lt_model_forward_backward(ctx, m, &b, 0, &res, NULL)) != LT_OK) goto fail;
    if (!(res.loss_sum > 0) || res.n_tokens <= 0) {
        s = lt_error(ctx, LT_ERR_INVALID_ARG, "step produced loss %g over %lld tokens", res.loss_sum,
                     (long long)res.n_tokens);
        goto fail;
    }
    int64_t ng = 0;
    const float *g = lt_model_lora_grads(m, &ng);
    for (int64_t i = 0; i < n; i++) { /* one AdamW step at step 1 (bias-corrected) */
        adam_m[i] = 0.1f * g[i];
        adam_v[i] = 0.001f * g[i] * g[i];
        theta[i] -= 1e-3f * (adam_m[i] / 0.1f) / (sqrtf(adam_v[i] / 0.001f) + 1e-8f);
    }
    s = LT_OK;
fail:
    lt_free(ctx, LT_DEVICE_CPU, adam_v, (size_t)n * sizeof(float));
    lt_free(ctx, LT_DEVICE_CPU, adam_m, (size_t)n * sizeof(float));
    lt_model_free(ctx, m);
    return s;
}

typedef struct arm_case {
    size_t tiny;
    int64_t B, T;
    const char *recompute;
    lt_attention_impl att;
    lt_lce_impl loss;
    int threads;  /* workspaces are sized per thread, so the plan must use the run's count */
    int quantize; /* QLoRA: projections held as INT4_G64 */
} arm_case;

static void check_case(const arm_case *c, double *worst_lo, double *worst_hi) {
    const tiny *t = &tinies[c->tiny];
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, c->threads);
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.run.B = c->B;
    po.run.T = c->T;
    po.run.attention = c->att;
    po.run.loss = c->loss;
    po.lora.rank = 4;
    assert_int_equal(lt_plan_recompute_parse(ctx, c->recompute, &po.run.recompute, &po.run.recompute_k), LT_OK);
    lt_model_config cfg = config_of_q(ctx, t, c->quantize);
    assert_int_equal(cfg.proj_dtype[LT_PROJ_DOWN], c->quantize ? LT_DTYPE_INT4_G64 : LT_DTYPE_F32);
    lt_plan p;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_OK);
    step_buffers sb = make_batch(c->B, c->T, t->V);
    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
    double t0 = lt_time_now();
    lt_status s = load_and_step(ctx, t, &po, &sb, c->quantize);
    double dt = lt_time_now() - t0;
    if (s != LT_OK) fail_msg("%s B=%lld T=%lld: %s", t->name, (long long)c->B, (long long)c->T, lt_ctx_error(ctx));
    lt_mem_stats ms = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
    assert_int_equal(ms.used_bytes, 0);
    double ratio = (double)ms.peak_bytes / (double)p.peak_bytes;
    fprintf(stderr,
            "  %-5s%s B=%lld T=%-5lld recompute=%-7s attention=%-5s loss=%-5s plan %10zu "
            "measured %10zu ratio %.4f (%d threads, %.2f s)\n",
            t->name, c->quantize ? "+q4" : "   ", (long long)c->B, (long long)c->T, c->recompute,
            lt_plan_attention_name(c->att), lt_plan_loss_name(c->loss), p.peak_bytes, ms.peak_bytes, ratio, c->threads,
            dt);
    if (ratio < *worst_lo) *worst_lo = ratio;
    if (ratio > *worst_hi) *worst_hi = ratio;
    free_batch(&sb);
    lt_ctx_free(ctx);
    if (ratio < BAR_LO || ratio > BAR_HI) fail_msg("measured/plan %.4f outside [%.2f, %.2f]", ratio, BAR_LO, BAR_HI);
}

static void measured_high_water_matches_plan(void **state) {
    (void)state;
    static const char *const policies[] = {"none", "all", "every:2"};
    static const lt_attention_impl atts[] = {LT_ATTENTION_FLASH, LT_ATTENTION_NAIVE};
    static const lt_lce_impl losses[] = {LT_LCE_FUSED, LT_LCE_NAIVE};
    double lo = 1e9, hi = 0;
    int n = 0;
    /* Every combination at a short length, on every architecture (one thread: the machine that
     * runs CI has two cores shared with other jobs). */
    for (size_t i = 0; i < N_TINY; i++)
        for (int pi = 0; pi < 3; pi++)
            for (int a = 0; a < 2; a++)
                for (int l = 0; l < 2; l++) {
                    arm_case c = {i, 2, 128, policies[pi], atts[a], losses[l], 1, 0};
                    check_case(&c, &lo, &hi);
                    n++;
                }
    /* Longer rows on each architecture, policies and impls rotated; two threads on some, so the
     * per-thread workspaces are priced at another count. The naive (T, T) attention is slow at
     * 2048 on the CPU, so that length runs the flash path. */
    for (size_t i = 0; i < N_TINY; i++) {
        arm_case c512 = {i, 2, 512, policies[i % 3], atts[i % 2], losses[(i + 1) % 2], 1 + (int)(i % 2), 0};
        check_case(&c512, &lo, &hi);
        arm_case c2k = {i, 1, 2048, policies[(i + 1) % 3], LT_ATTENTION_FLASH, losses[i % 2], 2 - (int)(i % 2), 0};
        check_case(&c2k, &lo, &hi);
        n += 2;
    }
    /* QLoRA: the Llama's projections quantized at load, priced at the int4 block size. */
    for (int pi = 0; pi < 3; pi++) {
        arm_case cq = {0, 2, pi == 2 ? 1024 : 256, policies[pi], atts[pi % 2], losses[(pi + 1) % 2], 1, 1};
        check_case(&cq, &lo, &hi);
        n++;
    }
    fprintf(stderr, "measured/plan over %d runs: min %.4f max %.4f\n", n, lo, hi);
}

/* The real SmolLM2-135M (Q4_1 GGUF, scripts/setup.sh) at one length: quantized weights priced at
 * their block size, a real vocabulary. Skipped when the file is absent. */
static void real_smollm2_measured_matches_plan(void **state) {
    (void)state;
    const char *c = getenv("LONGTUNE_CACHE"), *home = getenv("HOME");
    tiny t;
    memset(&t, 0, sizeof t);
    t.name = "smol2";
    if (c) snprintf(t.dir, sizeof t.dir, "%s/smollm2-135m-instruct-q4_1.gguf", c);
    else snprintf(t.dir, sizeof t.dir, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", home ? home : "");
    /* One CPU step of a 135M model takes about a minute on a busy two-core machine: opt-in. */
    const char *slow = getenv("LONGTUNE_SLOW_TESTS");
    if (!slow || strcmp(slow, "1")) {
        fprintf(stderr, "skipped: set LONGTUNE_SLOW_TESTS=1 to measure the real SmolLM2\n");
        skip();
    }
    if (access(t.dir, R_OK)) {
        fprintf(stderr, "skipped: %s is absent (run scripts/setup.sh)\n", t.dir);
        skip();
    }
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 2);
    lt_model_config cfg;
    lt_model_options mo;
    memset(&mo, 0, sizeof mo);
    assert_int_equal(lt_model_inspect(ctx, t.dir, &mo, &cfg), LT_OK);
    assert_int_equal(cfg.V, 49152);
    assert_int_equal(cfg.L, 30);
    t.V = cfg.V;
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.run.B = 1;
    po.run.T = 256;
    po.run.recompute = LT_RECOMPUTE_EVERY;
    lt_plan p;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &p), LT_OK);
    step_buffers sb = make_batch(1, 256, t.V);
    double t0 = lt_time_now();
    lt_status s = load_and_step(ctx, &t, &po, &sb, 0);
    if (s != LT_OK) fail_msg("SmolLM2 step: %s", lt_ctx_error(ctx));
    lt_mem_stats ms = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
    double ratio = (double)ms.peak_bytes / (double)p.peak_bytes;
    fprintf(stderr, "  SmolLM2-135M Q4_1 B=1 T=256 recompute=all: plan %zu measured %zu ratio %.4f (%.1f s)\n",
            p.peak_bytes, ms.peak_bytes, ratio, lt_time_now() - t0);
    assert_int_equal(ms.used_bytes, 0);
    free_batch(&sb);
    lt_ctx_free(ctx);
    if (ratio < BAR_LO || ratio > BAR_HI) fail_msg("measured/plan %.4f outside [%.2f, %.2f]", ratio, BAR_LO, BAR_HI);
}

/* ---- fault injection ---- */

static void every_failed_allocation_is_a_clean_oom(void **state) {
    (void)state;
    const tiny *t = &tinies[1];
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.run.B = 2;
    po.run.T = 64;
    po.run.recompute = LT_RECOMPUTE_EVERY_K;
    po.lora.rank = 2;
    step_buffers sb = make_batch(2, 64, t->V);
    lt_ctx *ctx = lt_ctx_new();
    lt_ctx_set_threads(ctx, 1);
    assert_int_equal(load_and_step(ctx, t, &po, &sb, 0), LT_OK);
    uint64_t total = lt_mem_get_stats(ctx, LT_DEVICE_CPU).n_allocs;
    assert_true(total > 10);
    lt_ctx_free(ctx);
    for (uint64_t k = 1; k <= total + 1; k++) {
        ctx = lt_ctx_new();
        lt_ctx_set_threads(ctx, 1);
        lt_mem_fail_nth(ctx, k);
        lt_status s = load_and_step(ctx, t, &po, &sb, 0);
        if (k <= total) {
            if (s != LT_ERR_OOM)
                fail_msg("failing allocation %llu of %llu gave %s: %s", (unsigned long long)k,
                         (unsigned long long)total, lt_status_str(s), lt_ctx_error(ctx));
            assert_non_null(strstr(lt_ctx_error(ctx), "fault injection"));
        } else {
            assert_int_equal(s, LT_OK); /* past the last allocation: nothing fails */
        }
        lt_mem_stats ms = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
        if (ms.used_bytes) fail_msg("failing allocation %llu leaked %zu bytes", (unsigned long long)k, ms.used_bytes);
        lt_ctx_free(ctx);
    }
    fprintf(stderr, "fault injection: %llu allocations, each failed once, cleanly\n", (unsigned long long)total);
    free_batch(&sb);
}

/* Several ranks: a data-parallel rank is priced as the run with its ceil(B/dp) rows; a
 * context-parallel rank as its T'/cp tokens (T' padded to a multiple of 2·cp) plus exactly one ring
 * attention backward's blocks in the workspace; the longest context grows with cp. */
static void per_rank_plans(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg = config_of(ctx, &tinies[0]);
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    po.run.B = 5;
    po.run.T = 301;
    po.run.recompute = LT_RECOMPUTE_EVERY;
    lt_plan whole, rank, ref;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &whole), LT_OK);
    lt_plan_options o = po;
    o.dp_size = 2;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &rank), LT_OK);
    o = po;
    o.run.B = 3;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &ref), LT_OK);
    assert_int_equal(rank.peak_bytes, ref.peak_bytes);
    assert_true(rank.peak_bytes < whole.peak_bytes);
    o = po;
    o.cp_size = 3; /* T' = 306: 102 tokens per rank */
    assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &rank), LT_OK);
    o = po;
    o.run.T = 102;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &ref), LT_OK);
    lt_cp_attention_params cp = {306, cfg.H, cfg.Hkv, cfg.D, 0, LT_ATTENTION_AUTO, LT_DTYPE_F32};
    for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++)
        assert_int_equal(rank.bytes[c],
                         ref.bytes[c] + (c == LT_PLAN_WORKSPACE ? lt_cp_attention_workspace_bytes(&cp, 3, 1) : 0));
    char buf[2048];
    assert_int_equal(lt_plan_to_json(ctx, &rank, buf, sizeof buf), LT_OK);
    assert_non_null(strstr(buf, "\"cp_size\": 3"));
    /* The search stays exact with padding (plans are monotone in T), and cp = 4 reaches further. */
    int64_t t1 = 0, t4 = 0;
    int f1 = 0, f4 = 0;
    size_t budget = whole.peak_bytes * 2;
    assert_int_equal(lt_plan_search_max(ctx, &cfg, &po, LT_PLAN_SEARCH_SEQ, 1 << 20, budget, &t1, &f1), LT_OK);
    o = po;
    o.cp_size = 4;
    assert_int_equal(lt_plan_search_max(ctx, &cfg, &o, LT_PLAN_SEARCH_SEQ, 1 << 20, budget, &t4, &f4), LT_OK);
    assert_true(f1 && f4 && t4 > t1);
    o.run.T = t4;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &rank), LT_OK);
    assert_true(rank.peak_bytes <= budget);
    o.run.T = t4 + 1;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &o, &rank), LT_OK);
    assert_true(rank.peak_bytes > budget);
    lt_ctx_free(ctx);
}

/* A training run's plan (lt_train_plan): the planner's plan of the options lt_train_plan_options
 * derives, with the held class made of what the caller holds, the trainer's buffers at the shape,
 * the metrics log and the larger of the packing high-water and the packing plans plus the adapter
 * export's index; the search follows the shape. */
static void train_plan_adds_the_runs_own_bytes(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg = config_of(ctx, &tinies[0]);
    lt_train_options in, o;
    memset(&in, 0, sizeof in);
    assert_int_equal(lt_train_options_set(ctx, &in, "model", "m"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "data", "d"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "max-seq-length", "96"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "batch-size", "3"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "grad-accum", "2"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "recompute", "all"), LT_OK);
    assert_int_equal(lt_train_options_set(ctx, &in, "lora-targets", "q,v"), LT_OK);
    assert_int_equal(lt_train_options_resolve(ctx, &in, &o), LT_OK);
    lt_plan_options po;
    assert_int_equal(lt_train_plan_options(ctx, &o, 1, 1, &po), LT_OK);
    assert_int_equal(po.run.B, 3);
    assert_int_equal(po.run.T, 96);
    assert_int_equal(po.run.recompute, LT_RECOMPUTE_EVERY);
    assert_int_equal(po.lora.targets, (1u << LT_PROJ_Q) | (1u << LT_PROJ_V));
    lt_plan bare, p;
    assert_int_equal(lt_plan_compute(ctx, &cfg, &po, &bare), LT_OK);
    const size_t A = 64; /* host alignment */
#define UP(x) (((size_t)(x) + A - 1) / A * A)
    int64_t n_tensors = 2 * 2 * cfg.L; /* A and B of two targets in every layer */
    size_t buffers = UP(n_tensors * sizeof(lt_train_param)) + UP((3 * 3 * 96 + 3 * 97 + 3) * 4) + UP(3 * 16);
    assert_int_equal(lt_train_buffer_bytes(&o, 3, 96, n_tensors, 1), buffers);
    size_t metrics = UP(lt_metrics_bytes()), export = UP(lt_peft_export_bytes((int)n_tensors));
    /* Export over the packing high-water, then the packing high-water over the export. */
    lt_train_held held[2] = {{1000, 640, 320, 0}, {1000, 1 << 20, 4096, 0}};
    size_t late[2] = {320 + export, 1 << 20};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(lt_train_plan(ctx, &o, &cfg, &po, &held[k], &p), LT_OK);
        assert_int_equal(p.bytes[LT_PLAN_HELD], 1000 + buffers + metrics + late[k]);
        assert_int_equal(p.peak_bytes, bare.peak_bytes + p.bytes[LT_PLAN_HELD]);
    }
    /* The data's loading high-water is the peak only where it tops the step's sum; the classes
     * stay as they are. */
    const size_t sum = p.peak_bytes;
    lt_train_held loading = held[1];
    loading.load_peak_bytes = sum + 12345;
    assert_int_equal(lt_train_plan(ctx, &o, &cfg, &po, &loading, &p), LT_OK);
    assert_int_equal(p.peak_bytes, sum + 12345);
    assert_int_equal(p.bytes[LT_PLAN_HELD], 1000 + buffers + metrics + late[1]);
    loading.load_peak_bytes = sum - 1;
    assert_int_equal(lt_train_plan(ctx, &o, &cfg, &po, &loading, &p), LT_OK);
    assert_int_equal(p.peak_bytes, sum);
    /* No measurement: the trainer's own bytes still count. */
    assert_int_equal(lt_train_plan(ctx, &o, &cfg, &po, NULL, &p), LT_OK);
    assert_int_equal(p.bytes[LT_PLAN_HELD], buffers + metrics + export);
    /* The search is exact with the buffers following T. */
    int64_t best = 0;
    int found = 0;
    size_t budget = p.peak_bytes * 3;
    assert_int_equal(lt_train_plan_search(ctx, &o, &cfg, &po, &held[0], LT_PLAN_SEARCH_SEQ, 1 << 20, budget, &best,
                                          &found),
                     LT_OK);
    assert_true(found && best > 96);
    lt_plan_options at = po;
    at.run.T = best;
    assert_int_equal(lt_train_plan(ctx, &o, &cfg, &at, &held[0], &p), LT_OK);
    assert_true(p.peak_bytes <= budget);
    at.run.T = best + 1;
    assert_int_equal(lt_train_plan(ctx, &o, &cfg, &at, &held[0], &p), LT_OK);
    assert_true(p.peak_bytes > budget);
#undef UP
    lt_ctx_free(ctx);
}

int main(void) {
    lt_log_set_level(LT_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plan_is_the_size_table_plus_optimizer),
        cmocka_unit_test(plan_grows_with_shape_and_naive_arms_cost_more),
        cmocka_unit_test(search_finds_the_exact_largest_value),
        cmocka_unit_test(json_form_and_policy_names),
        cmocka_unit_test(measured_high_water_matches_plan),
        cmocka_unit_test(real_smollm2_measured_matches_plan),
        cmocka_unit_test(every_failed_allocation_is_a_clean_oom),
        cmocka_unit_test(per_rank_plans),
        cmocka_unit_test(train_plan_adds_the_runs_own_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
