/* Mistral and Phi-3 against transformers + PEFT fixtures (tests/oracle/gen_family_fixtures.py):
 * logits, loss, per-token loss and every LoRA gradient of a packed batch for Mistral v0.1 (sliding
 * window 4), v0.3 (no window), Nemo-style (head_dim with H·D != C), Phi-3-mini (fused qkv_proj and
 * gate_up_proj split at load, LoRA per fused module as PEFT puts it) and Phi-3 with longrope (long
 * factors and attention factor) and a window, from the transformers folders and, for mistral_v01 and phi3_longrope, from GGUF files
 * written as llama.cpp writes them. The configs read into the described layers, RoPE scaling and
 * EOS lists. On a CUDA device, the same families at a CUDA head dim match the CPU (skipped without
 * one). */
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

#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"

/* fp32 end to end against fp32 PyTorch: differences are summation order only, relative to the
 * largest magnitude of the tensor compared. */
#define ORACLE_REL 1e-4

static const char *const CASES[] = {"mistral_v01", "mistral_v03", "mistral_nemo", "phi3_mini", "phi3_longrope"};

static void case_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/family/%s", lt_test_source_dir(), c);
}

static void check_case(const char *c, const char *file) {
    lt_ctx *ctx = lt_ctx_new();
    lt_test_fixture f;
    char dir[1024], what[1200];
    case_dir(c, dir, sizeof dir);
    snprintf(what, sizeof what, "%s%s%s", dir, file ? "/" : "", file ? file : "");
    lt_test_fixture_open(ctx, dir, &f);
    lt_model *m = lt_test_fixture_model_in(ctx, dir, file, what, &f, 0);
    assert_int_equal(lt_model_lora_count(m), atoll(lt_safetensors_metadata(f.exp, "n_lora")));
    for (int pol = 0; pol < 2; pol++) {
        lt_model_run_options ro = {0};
        ro.B = f.B, ro.T = f.T, ro.recompute = pol ? LT_RECOMPUTE_EVERY : LT_RECOMPUTE_NONE;
        if (lt_model_prepare(ctx, m, &ro) != LT_OK) fail_msg("%s: prepare: %s", what, lt_ctx_error(ctx));
        lt_test_fixture_check_step(ctx, m, &f, what, ORACLE_REL);
    }
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void matches_transformers_peft(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) check_case(CASES[i], NULL);
}

static void gguf_matches_transformers_peft(void **state) {
    (void)state;
    check_case("mistral_v01", "model.gguf");
    check_case("phi3_longrope", "model.gguf");
}

/* What each family's config reads into: arch, window per layer, head dim, RoPE scaling, EOS. */
static void configs_describe_the_families(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    static const struct {
        const char *c, *file;
        lt_model_arch arch;
        int64_t window, D;
        lt_rope_scaling rope;
        int n_eos;
    } want[] = {
        {"mistral_v01", NULL, LT_ARCH_MISTRAL, 4, 8, LT_ROPE_SCALING_NONE, 1},
        {"mistral_v01", "model.gguf", LT_ARCH_MISTRAL, 4, 8, LT_ROPE_SCALING_NONE, 2},
        {"mistral_v03", NULL, LT_ARCH_MISTRAL, 0, 8, LT_ROPE_SCALING_NONE, 1},
        {"mistral_nemo", NULL, LT_ARCH_MISTRAL, 0, 12, LT_ROPE_SCALING_NONE, 1},
        {"phi3_mini", NULL, LT_ARCH_PHI3, 0, 8, LT_ROPE_SCALING_NONE, 1},
        {"phi3_longrope", NULL, LT_ARCH_PHI3, 6, 8, LT_ROPE_SCALING_LONGROPE, 1},
        {"phi3_longrope", "model.gguf", LT_ARCH_PHI3, 6, 8, LT_ROPE_SCALING_LONGROPE, 2},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char path[1200];
        case_dir(want[i].c, path, sizeof path);
        if (want[i].file) strcat(strcat(path, "/"), want[i].file);
        lt_model_config cfg;
        if (lt_model_inspect(ctx, path, NULL, &cfg) != LT_OK) fail_msg("%s: %s", path, lt_ctx_error(ctx));
        assert_int_equal(cfg.arch, want[i].arch);
        assert_int_equal(cfg.sliding_window, want[i].window);
        assert_int_equal(cfg.D, want[i].D);
        assert_int_equal(cfg.rope_scaling, want[i].rope);
        assert_int_equal(cfg.n_eos, want[i].n_eos);
        assert_int_equal(cfg.eos_id, 2);
        if (want[i].n_eos == 2) assert_int_equal(cfg.eos_ids[1], 3); /* GGUF eot */
        for (int64_t l = 0; l < cfg.L; l++) {
            lt_layer_desc d;
            lt_model_describe_layer(&cfg, l, &d);
            assert_int_equal(d.attn, want[i].window ? LT_ATTN_KIND_SLIDING : LT_ATTN_KIND_FULL);
            assert_int_equal(d.window, want[i].window);
        }
        if (want[i].rope == LT_ROPE_SCALING_LONGROPE) {
            /* max_position_embeddings 64 over original 4: factor 16, sqrt(1 + ln 16 / ln 4) */
            assert_int_equal(cfg.rope_original_ctx, 4);
            assert_true(fabs(cfg.rope_factor - 16) < 1e-12);
            assert_true(fabs(cfg.rope_long_factor[3] - 15.0f) < 1e-6);
            double af = cfg.rope_attn_factor > 0 ? cfg.rope_attn_factor : sqrt(3.0);
            assert_true(fabs(af - sqrt(3.0)) < 1e-6);
        }
    }
    lt_ctx_free(ctx);
}

/* Phi-3's LoRA is one adapter per fused module, named as PEFT names it; a target list that splits
 * a fused module is refused naming it. */
static void phi3_lora_is_per_fused_module(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[1200];
    case_dir("phi3_mini", dir, sizeof dir);
    lt_lora_options lo = {0};
    lo.rank = 4;
    lo.targets = 1u << LT_PROJ_Q | 1u << LT_PROJ_K; /* q and k without v */
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "qkv_proj is one module of this model (q, k and v)"));
    lo.targets = 1u << LT_PROJ_UP;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "gate_up_proj"));
    lo.targets = 1u << LT_PROJ_Q | 1u << LT_PROJ_K | 1u << LT_PROJ_V | 1u << LT_PROJ_GATE | 1u << LT_PROJ_UP;
    assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
    assert_int_equal(lt_model_lora_count(m), 2 * 2 * 2); /* 2 modules x (A, B) x 2 layers */
    lt_lora_tensor t;
    assert_int_equal(lt_model_lora_tensor(ctx, m, 1, &t), LT_OK);
    assert_string_equal(t.name, "base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight");
    assert_int_equal(t.value.shape[0], 32 + 2 * 16); /* q + k + v rows */
    assert_int_equal(lt_model_lora_tensor(ctx, m, 3, &t), LT_OK);
    assert_string_equal(t.name, "base_model.model.model.layers.0.mlp.gate_up_proj.lora_B.weight");
    assert_int_equal(t.value.shape[0], 2 * 64);
    int64_t n;
    lt_model_lora_params(m, &n);
    assert_int_equal(n, 2 * (4 * 32 + 64 * 4 + 4 * 32 + 128 * 4));
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
}

/* Fused tensors of the wrong size are shape errors naming the tensor. */
static void bad_fused_tensor_is_named(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[] = "/tmp/lt_family_XXXXXX", src[1200], p[1300];
    assert_non_null(mkdtemp(dir));
    case_dir("phi3_mini", src, sizeof src);
    snprintf(p, sizeof p, "cp %s/config.json %s/", src, dir);
    assert_int_equal(system(p), 0);
    float w[64 * 32];
    memset(w, 0, sizeof w);
    int64_t sh_e[2] = {64, 32}, sh_qkv[2] = {40, 32};
    lt_safetensors_entry e[2] = {
        {"model.embed_tokens.weight", lt_tensor_view(w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh_e)},
        {"model.layers.0.self_attn.qkv_proj.weight", lt_tensor_view(w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh_qkv)},
    };
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, p, e, 2, NULL, 0), LT_OK);
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &cfg), LT_ERR_SHAPE);
    assert_non_null(strstr(lt_ctx_error(ctx), "model.layers.0.self_attn.qkv_proj.weight"));
    assert_non_null(strstr(lt_ctx_error(ctx), "expected 64"));
    assert_int_equal(lt_test_rm_tree(dir), 0);
    lt_ctx_free(ctx);
}

/* GGUF metadata the loader refuses, named (tests/fixtures/family/bad, written by the generator). */
static void bad_gguf_metadata_is_named(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    static const struct {
        const char *file, *needle;
        lt_status want;
    } cases[] = {
        {"rope_type_su.gguf", "metadata 'phi3.rope.scaling.type' = 'su' is not supported", LT_ERR_UNSUPPORTED},
        {"rope_factors_short_list.gguf", "'rope_factors_long.weight' must hold 4 f32 factors", LT_ERR_FORMAT},
        {"eot_negative.gguf", "metadata 'tokenizer.ggml.eot_token_id' must be a token id", LT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char p[1200];
        snprintf(p, sizeof p, "%s/tests/fixtures/family/bad/%s", lt_test_source_dir(), cases[i].file);
        lt_model_config cfg;
        lt_status s = lt_model_inspect(ctx, p, NULL, &cfg);
        if (s != cases[i].want || !strstr(lt_ctx_error(ctx), cases[i].needle))
            fail_msg("%s: status %d, '%s'", cases[i].file, (int)s, lt_ctx_error(ctx));
    }
    lt_ctx_free(ctx);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* config.json as transformers 4.x and 5.x write it: a multimodal wrapper's text_config, dtype or
 * torch_dtype, EOS lists in the config and in generation_config.json; keys longtune reads but does
 * not run are errors naming key and value. */
static void configs_as_transformers_writes_them(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[] = "/tmp/lt_family_cfg_XXXXXX", p[600];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/config.json", dir);
    const char *text_model = "\"model_type\": \"mistral\", \"vocab_size\": 64, \"hidden_size\": 32, "
                             "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                             "\"head_dim\": 16, \"sliding_window\": null, \"rope_theta\": 1000000000.0";
    char cfgtext[2048];
    snprintf(cfgtext, sizeof cfgtext,
             "{\"model_type\": \"mistral3\", \"architectures\": [\"Mistral3ForConditionalGeneration\"], "
             "\"dtype\": \"bfloat16\", \"vision_config\": {\"model_type\": \"pixtral\"}, \"eos_token_id\": 2, "
             "\"text_config\": {%s}}",
             text_model);
    write_file(dir, "config.json", cfgtext);
    write_file(dir, "generation_config.json", "{\"bos_token_id\": 1, \"eos_token_id\": [2, 7, 9]}");
    lt_model_config c;
    if (lt_model_config_read_hf(ctx, p, &c) != LT_OK) fail_msg("%s", lt_ctx_error(ctx));
    assert_int_equal(c.arch, LT_ARCH_MISTRAL);
    assert_int_equal(c.D, 16);
    assert_true(c.rope_theta == 1e9);
    assert_int_equal(c.n_eos, 3);
    assert_int_equal(c.eos_id, 2);
    assert_int_equal(c.eos_ids[1], 7);
    assert_int_equal(c.eos_ids[2], 9);
    /* Llama 3 style: a list in the config, generation_config adds nothing new */
    snprintf(cfgtext, sizeof cfgtext, "{%s, \"torch_dtype\": \"float16\", \"eos_token_id\": [9, 8]}", text_model);
    write_file(dir, "config.json", cfgtext);
    assert_int_equal(lt_model_config_read_hf(ctx, p, &c), LT_OK);
    assert_int_equal(c.n_eos, 4);
    assert_int_equal(c.eos_id, 9);
    assert_int_equal(c.eos_ids[1], 8);
    assert_int_equal(c.eos_ids[2], 2);
    assert_int_equal(c.eos_ids[3], 7);
    static const struct {
        const char *extra, *needle;
        lt_status want;
    } bad[] = {
        {", \"hidden_act\": \"gelu\"", "hidden_act gelu is not supported", LT_ERR_UNSUPPORTED},
        {", \"dtype\": \"float8_e4m3fn\"", "dtype float8_e4m3fn is not supported", LT_ERR_UNSUPPORTED},
        {", \"torch_dtype\": 16", "torch_dtype (not a string) is not supported", LT_ERR_UNSUPPORTED},
        {", \"quantization_config\": {\"quant_method\": \"gptq\"}", "quantization_config (quant_method gptq)",
         LT_ERR_UNSUPPORTED},
        {", \"eos_token_id\": \"</s>\"", "\"eos_token_id\" must be an integer or a list", LT_ERR_FORMAT},
        {", \"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9]", "lists more than 8 ids", LT_ERR_FORMAT},
        {", \"attention_bias\": true", "mistral with attention_bias is not supported", LT_ERR_UNSUPPORTED},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cfgtext, sizeof cfgtext, "{%s%s}", text_model, bad[i].extra);
        write_file(dir, "config.json", cfgtext);
        lt_status s = lt_model_config_read_hf(ctx, p, &c);
        if (s != bad[i].want || !strstr(lt_ctx_error(ctx), bad[i].needle))
            fail_msg("%s: status %d, '%s'", bad[i].extra, (int)s, lt_ctx_error(ctx));
    }
    write_file(dir, "config.json", "{\"model_type\": \"llava\", \"text_config\": {\"model_type\": \"gemma\"}}");
    assert_int_equal(lt_model_config_read_hf(ctx, p, &c), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "text_config model_type \"gemma\""));
    write_file(dir, "generation_config.json", "{\"eos_token_id\": [2, -1]}");
    snprintf(cfgtext, sizeof cfgtext, "{%s}", text_model);
    write_file(dir, "config.json", cfgtext);
    assert_int_equal(lt_model_config_read_hf(ctx, p, &c), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "generation_config.json"));
    assert_int_equal(lt_test_rm_tree(dir), 0);
    lt_ctx_free(ctx);
}

/* ---- CUDA against the CPU, at a CUDA head dim ---- */

/* The CUDA step rounds matmul inputs to bf16 and runs attention in bf16 (unit roundoff 2^-8);
 * the bounds are test_cuda_train's: a few u on the loss, 32 u of the largest gradient. */
#define BF16_U 0x1.0p-8
#define TOL_LOSS (8 * BF16_U)
#define TOL_GRAD (32 * BF16_U)

static double rel_err(const float *got, const float *want, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)got[i] - want[i]));
    return scale > 0 ? worst / scale : worst;
}

/* A random HF folder of the family at D = 64 (C = 128, H = 2, Hkv = 1): Mistral with a window of
 * 24, or Phi-3 with fused tensors, longrope past its original context of 32 and a window of 40. */
static void write_twin(lt_ctx *ctx, const char *dir, int phi, uint64_t *rng) {
    const int64_t V = 64, C = 128, F = 128, L = 2, H = 2, Hkv = 1, D = 64;
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f,
            "{\"model_type\": \"%s\", \"vocab_size\": %lld, \"hidden_size\": %lld, \"intermediate_size\": %lld, "
            "\"num_hidden_layers\": %lld, \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, "
            "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, "
            "\"bos_token_id\": 1, \"eos_token_id\": 2",
            phi ? "phi3" : "mistral", (long long)V, (long long)C, (long long)F, (long long)L, (long long)H,
            (long long)Hkv);
    if (phi) {
        fprintf(f,
                ", \"sliding_window\": 40, \"original_max_position_embeddings\": 32, \"rope_parameters\": "
                "{\"rope_type\": \"longrope\", \"rope_theta\": 10000.0, \"short_factor\": [");
        for (int i = 0; i < 32; i++) fprintf(f, "%s%.3f", i ? ", " : "", 1.0 + 0.01 * i);
        fprintf(f, "], \"long_factor\": [");
        for (int i = 0; i < 32; i++) fprintf(f, "%s%.3f", i ? ", " : "", 1.0 + 0.5 * i);
        fprintf(f, "]}}");
    } else {
        fprintf(f, ", \"sliding_window\": 24, \"rope_theta\": 1000000.0}");
    }
    fclose(f);
    const int64_t qkv = (H + 2 * Hkv) * D;
    struct {
        char name[96];
        int64_t r, c;
        int norm;
    } t[32];
    int nt = 0;
    snprintf(t[nt].name, 96, "model.embed_tokens.weight"), t[nt].r = V, t[nt].c = C, t[nt++].norm = 0;
    snprintf(t[nt].name, 96, "lm_head.weight"), t[nt].r = V, t[nt].c = C, t[nt++].norm = 0;
    snprintf(t[nt].name, 96, "model.norm.weight"), t[nt].r = 1, t[nt].c = C, t[nt++].norm = 1;
    for (int64_t l = 0; l < L; l++) {
        const char *pre = "model.layers";
        snprintf(t[nt].name, 96, "%s.%lld.input_layernorm.weight", pre, (long long)l), t[nt].r = 1, t[nt].c = C,
                                                                                       t[nt++].norm = 1;
        snprintf(t[nt].name, 96, "%s.%lld.post_attention_layernorm.weight", pre, (long long)l),
            t[nt].r = 1, t[nt].c = C, t[nt++].norm = 1;
        if (phi) {
            snprintf(t[nt].name, 96, "%s.%lld.self_attn.qkv_proj.weight", pre, (long long)l),
                t[nt].r = qkv, t[nt].c = C, t[nt++].norm = 0;
            snprintf(t[nt].name, 96, "%s.%lld.mlp.gate_up_proj.weight", pre, (long long)l),
                t[nt].r = 2 * F, t[nt].c = C, t[nt++].norm = 0;
        } else {
            static const char *const qkvn[3] = {"q", "k", "v"};
            for (int k = 0; k < 3; k++)
                snprintf(t[nt].name, 96, "%s.%lld.self_attn.%s_proj.weight", pre, (long long)l, qkvn[k]),
                    t[nt].r = k ? Hkv * D : H * D, t[nt].c = C, t[nt++].norm = 0;
            snprintf(t[nt].name, 96, "%s.%lld.mlp.gate_proj.weight", pre, (long long)l), t[nt].r = F, t[nt].c = C,
                                                                                         t[nt++].norm = 0;
            snprintf(t[nt].name, 96, "%s.%lld.mlp.up_proj.weight", pre, (long long)l), t[nt].r = F, t[nt].c = C,
                                                                                       t[nt++].norm = 0;
        }
        snprintf(t[nt].name, 96, "%s.%lld.self_attn.o_proj.weight", pre, (long long)l), t[nt].r = C, t[nt].c = H * D,
                                                                                        t[nt++].norm = 0;
        snprintf(t[nt].name, 96, "%s.%lld.mlp.down_proj.weight", pre, (long long)l), t[nt].r = C, t[nt].c = F,
                                                                                     t[nt++].norm = 0;
    }
    lt_safetensors_entry e[32];
    float *buf[32];
    for (int i = 0; i < nt; i++) {
        int64_t n = t[i].r * t[i].c;
        buf[i] = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++)
            buf[i][k] = t[i].norm ? (float)(1 + 0.1 * lt_test_normal(rng)) : (float)(0.08 * lt_test_normal(rng));
        int64_t sh[2] = {t[i].r, t[i].c};
        e[i].name = t[i].name;
        e[i].tensor = t[i].r == 1 ? lt_tensor_view(buf[i], LT_DTYPE_F32, LT_DEVICE_CPU, 1, sh + 1)
                                  : lt_tensor_view(buf[i], LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh);
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, p, e, nt, NULL, 0), LT_OK);
    for (int i = 0; i < nt; i++) free(buf[i]);
}

static void cuda_matches_cpu(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    if (lt_model_device_available(ctx, LT_DEVICE_CUDA) != LT_OK) {
        printf("skipped: no CUDA device (%s)\n", lt_ctx_error(ctx));
        lt_ctx_free(ctx);
        skip();
    }
    uint64_t rng = lt_test_seed() + 77;
    for (int phi = 0; phi < 2; phi++) {
        char dir[] = "/tmp/lt_family_cuda_XXXXXX";
        assert_non_null(mkdtemp(dir));
        write_twin(ctx, dir, phi, &rng);
        lt_lora_options lo = {0};
        lo.rank = 8, lo.alpha = 16, lo.seed = 9;
        lt_model_options oc = {0}, og = {0};
        og.device = LT_DEVICE_CUDA;
        lt_model *mc = NULL, *mg = NULL;
        if (lt_model_load(ctx, dir, &oc, &lo, &mc) != LT_OK || lt_model_load(ctx, dir, &og, &lo, &mg) != LT_OK)
            fail_msg("%s: %s", dir, lt_ctx_error(ctx));
        int64_t n;
        lt_model_lora_params(mc, &n);
        float *p = malloc((size_t)n * 4), *gc = malloc((size_t)n * 4), *gg = malloc((size_t)n * 4);
        lt_test_fill_normal(&rng, p, n, 0.05f); /* B != 0: every gradient is live */
        assert_int_equal(lt_model_lora_set(ctx, mc, 0, n, p), LT_OK);
        assert_int_equal(lt_model_lora_set(ctx, mg, 0, n, p), LT_OK);
        /* two rows of 96 tokens, three sequences each: past the window and (Phi-3) the original
         * context, so the long factors, the attention factor and the window all act */
        int32_t tok[192], tgt[192], pos[192], off[8] = {0, 50, 80, 96, 0, 20, 96, 96};
        for (int r = 0; r < 2; r++)
            for (int s = 0; s < 3; s++)
                for (int32_t i = off[r * 4 + s]; i < off[r * 4 + s + 1]; i++) {
                    tok[r * 96 + i] = (int32_t)(lt_test_rand_u64(&rng) % 64);
                    tgt[r * 96 + i] =
                        i + 1 == off[r * 4 + s + 1] ? LT_IGNORE_INDEX : (int32_t)(lt_test_rand_u64(&rng) % 64);
                    pos[r * 96 + i] = i - off[r * 4 + s];
                }
        lt_model_batch b = {0};
        b.B = 2, b.T = 96, b.S = 3, b.tokens = tok, b.targets = tgt, b.positions = pos, b.seq_offsets = off;
        lt_model_run_options ro = {0};
        ro.B = 2, ro.T = 96;
        lt_model_result rc, rg;
        assert_int_equal(lt_model_prepare(ctx, mc, &ro), LT_OK);
        if (lt_model_prepare(ctx, mg, &ro) != LT_OK) fail_msg("cuda prepare: %s", lt_ctx_error(ctx));
        lt_model_zero_grads(mc);
        lt_model_zero_grads(mg);
        assert_int_equal(lt_model_forward_backward(ctx, mc, &b, 0.0f, &rc, NULL), LT_OK);
        if (lt_model_forward_backward(ctx, mg, &b, 0.0f, &rg, NULL) != LT_OK) fail_msg("cuda: %s", lt_ctx_error(ctx));
        assert_int_equal(lt_model_lora_get(ctx, mc, 1, 0, n, gc), LT_OK);
        assert_int_equal(lt_model_lora_get(ctx, mg, 1, 0, n, gg), LT_OK);
        float lc = (float)(rc.loss_sum / (double)rc.n_tokens), lg = (float)(rg.loss_sum / (double)rg.n_tokens);
        double el = rel_err(&lg, &lc, 1), eg = rel_err(gg, gc, n);
        printf("  %s: loss %.6f (cuda %.6f, rel %.3g), grads rel %.3g\n", phi ? "phi3 longrope" : "mistral window",
               (double)lc, (double)lg, el, eg);
        if (!(el <= TOL_LOSS) || !(eg <= TOL_GRAD)) fail_msg("cuda differs from cpu beyond bf16 bounds");
        free(p), free(gc), free(gg);
        lt_model_free(ctx, mc);
        lt_model_free(ctx, mg);
        assert_int_equal(lt_test_rm_tree(dir), 0);
    }
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(configs_describe_the_families),       cmocka_unit_test(matches_transformers_peft),
        cmocka_unit_test(gguf_matches_transformers_peft),      cmocka_unit_test(phi3_lora_is_per_fused_module),
        cmocka_unit_test(bad_fused_tensor_is_named),           cmocka_unit_test(bad_gguf_metadata_is_named),
        cmocka_unit_test(configs_as_transformers_writes_them), cmocka_unit_test(cuda_matches_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
