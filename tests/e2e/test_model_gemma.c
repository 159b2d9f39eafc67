/* Gemma 2 and Gemma 3 (text) against transformers + PEFT fixtures (tests/oracle/gen_gemma_fixtures.py):
 * logits, loss, per-token loss and every LoRA gradient of a packed batch with sliding and global
 * layers, softcaps, sandwich (1 + w) norms, GeGLU, the sqrt(C) embedding scale, q/k norms, two RoPE
 * bases and head dim 256, from HF folders and from GGUF files written as llama.cpp's converter
 * writes them; every recompute policy, bf16 checkpoints and small chunks give the same numbers; the
 * size table equals what the allocator measured; the config readers' Gemma keys and refusals. */
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

#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"

/* fp32 end to end against fp32 PyTorch: differences are summation order only. Relative to the
 * largest magnitude of the tensor compared. */
#define ORACLE_REL 1e-4
#define SAME_REL 1e-5

static const char *const CASES[] = {"gemma2", "gemma3", "gemma3_d256"};

typedef lt_test_fixture fixture;

static void case_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/gemma/%s", lt_test_source_dir(), c);
}

#define ftensor lt_test_fixture_tensor
#define fixture_batch lt_test_fixture_batch
#define compare lt_test_compare

static void open_fixture(lt_ctx *ctx, const char *c, fixture *f) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    lt_test_fixture_open(ctx, dir, f);
}

/* Case c's model (file: a model file inside its folder, or an absolute path elsewhere). */
static lt_model *load_case_file(lt_ctx *ctx, const char *c, const fixture *f, int quantize, const char *file) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    return lt_test_fixture_model_in(ctx, dir, file, c, f, quantize);
}

static lt_model *load_case(lt_ctx *ctx, const char *c, const fixture *f, int quantize) {
    return load_case_file(ctx, c, f, quantize, NULL);
}

static void check_against_oracle(const char *c, const char *file) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    lt_test_fixture_check_oracle(dir, file, c, ORACLE_REL, SAME_REL);
}

static void matches_pytorch_peft(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) check_against_oracle(CASES[ci], NULL);
}

/* The same models as llama.cpp's converter writes them (norm weights with the 1 added, metadata
 * for the softcaps, window, period and the sliding layers' RoPE base) give the same numbers. */
static void gguf_matches_pytorch_peft(void **state) {
    (void)state;
    check_against_oracle("gemma2", "model.gguf");
    check_against_oracle("gemma3", "model.gguf");
}

/* The gemma3 fixture as a Gemma3ForConditionalGeneration checkpoint: config.json with the text
 * model's keys in text_config, the tensors renamed under `prefix` (and a vision tensor beside them,
 * which is not read); written to a scratch folder, `dir` receives its path. */
static void write_multimodal(const char *prefix, char *dir) {
    lt_ctx *ctx = lt_ctx_new();
    char src[1024], p[1300];
    case_dir("gemma3", src, sizeof src);
    snprintf(p, sizeof p, "%s/config.json", src);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    strcpy(dir, "/tmp/lt_gemma_mm_XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/config.json", dir);
    f = fopen(p, "wb");
    assert_non_null(f);
    fprintf(f,
            "{\"model_type\": \"gemma3\", \"architectures\": [\"Gemma3ForConditionalGeneration\"], "
            "\"text_config\": %s}",
            text);
    fclose(f);
    lt_safetensors *st;
    snprintf(p, sizeof p, "%s/model.safetensors", src);
    assert_int_equal(lt_safetensors_open(ctx, p, &st), LT_OK);
    int64_t k = lt_safetensors_count(st);
    lt_safetensors_entry *e = calloc((size_t)k + 1, sizeof *e);
    char(*names)[160] = calloc((size_t)k + 1, sizeof *names);
    for (int64_t i = 0; i < k; i++) {
        const char *nm = lt_safetensors_name(st, i);
        assert_int_equal(strncmp(nm, "model.", 6), 0);
        snprintf(names[i], sizeof names[i], "%s%s", prefix, nm + 6);
        e[i].name = names[i];
        assert_int_equal(lt_safetensors_find(ctx, st, nm, &e[i].tensor), LT_OK);
    }
    static float patch[4];
    int64_t ps[1] = {4};
    e[k].name = "vision_tower.vision_model.embeddings.patch_embedding.weight";
    e[k].tensor = lt_tensor_view(patch, LT_DTYPE_F32, LT_DEVICE_CPU, 1, ps);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, p, e, k + 1, NULL, 0), LT_OK);
    free(e);
    free(names);
    lt_safetensors_close(ctx, st);
    lt_ctx_free(ctx);
}

static void remove_dir(const char *dir) {
    char p[300];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    rmdir(dir);
}

/* Gemma3ForConditionalGeneration checkpoints as transformers 4 ("language_model.model.") and 5
 * ("model.language_model.") name them train the text model to the same numbers. */
static void multimodal_checkpoint_matches(void **state) {
    (void)state;
    static const char *const prefixes[] = {"language_model.model.", "model.language_model."};
    for (int i = 0; i < 2; i++) {
        char dir[64];
        write_multimodal(prefixes[i], dir);
        check_against_oracle("gemma3", dir);
        remove_dir(dir);
    }
}

/* Kept attention equals rerunning it in the recompute bit for bit, over 5-row chunks (the chunked
 * sandwich norms), with bf16 checkpoints (every layer recomputed, so forward and recompute both
 * start from the rounded inputs; the bf16 attention tensors) and f32 ones over segments of two
 * layers; the bf16 step stays close to the f32 one. */
static void chunks_bf16_and_kept_attention(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++) {
        lt_ctx *ctx = lt_ctx_new();
        fixture f;
        open_fixture(ctx, CASES[ci], &f);
        lt_model *m = load_case(ctx, CASES[ci], &f, 0);
        lt_model_batch b = fixture_batch(&f);
        double loss[4];
        for (int bf = 0; bf < 2; bf++) {
            float *gk = NULL;
            for (int rerun = 0; rerun < 2; rerun++) {
                lt_model_run_options ro = {0};
                ro.B = f.B, ro.T = f.T, ro.recompute = bf ? LT_RECOMPUTE_EVERY : LT_RECOMPUTE_EVERY_K;
                ro.recompute_k = 2, ro.saved_bf16 = bf ? 1 : -1, ro.chunk_rows = 5, ro.recompute_attention = rerun;
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                lt_model_zero_grads(m);
                lt_model_result r;
                assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0.0f, &r, NULL), LT_OK);
                loss[2 * bf + rerun] = r.loss_sum / (double)r.n_tokens;
                int64_t n;
                float *g = lt_model_lora_grads(m, &n);
                if (!rerun) {
                    gk = malloc((size_t)n * 4);
                    memcpy(gk, g, (size_t)n * 4);
                } else if (memcmp(gk, g, (size_t)n * 4)) {
                    fprintf(stderr, "%s: kept attention differs from the rerun (bf16 %d)\n", CASES[ci], bf);
                    fail();
                }
            }
            free(gk);
        }
        assert_true(loss[0] == loss[1] && loss[2] == loss[3]);
        assert_true(fabs(loss[2] - loss[0]) < 1e-2 * fabs(loss[0])); /* bf16 rounding of the stream */
        lt_model_free(ctx, m);
        lt_safetensors_close(ctx, f.exp);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
        lt_ctx_free(ctx);
    }
}

/* The planner's numbers are the allocator's numbers for the Gemma layer list (sandwich buffers,
 * the second RoPE table, the post norms), under every recompute policy, by layer kind too. */
static void size_table_equals_allocations(void **state) {
    (void)state;
    const lt_recompute pol[5] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K, LT_RECOMPUTE_SLIDING,
                                 LT_RECOMPUTE_GLOBAL};
    for (size_t ci = 0; ci < sizeof CASES / sizeof *CASES; ci++)
        for (int pi = 0; pi < 5; pi++)
            for (int fo = 0; fo < 2; fo++) {
                lt_ctx *ctx = lt_ctx_new();
                char dir[1024];
                case_dir(CASES[ci], dir, sizeof dir);
                lt_lora_options lo = {0};
                lo.rank = 4;
                lt_model_config cfg;
                assert_int_equal(lt_model_inspect(ctx, dir, NULL, &cfg), LT_OK);
                lt_model_run_options ro = {0};
                ro.B = 2, ro.T = 12, ro.recompute = pol[pi], ro.recompute_k = 2, ro.forward_only = fo;
                ro.chunk_rows = pi == 2 ? 7 : 0;
                lt_model_sizes want;
                assert_int_equal(lt_model_size_table(ctx, &cfg, &lo, &ro, &want), LT_OK);
                lt_model *m = NULL;
                assert_int_equal(lt_model_load(ctx, dir, NULL, &lo, &m), LT_OK);
                assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
                lt_model_sizes got = lt_model_get_sizes(m);
                for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++) assert_int_equal(got.bytes[c], want.bytes[c]);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, want.total);
                fixture f;
                open_fixture(ctx, CASES[ci], &f);
                size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
                lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
                lt_model_batch b = fixture_batch(&f);
                lt_model_result r;
                if (fo) assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
                else assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes,
                                 before); /* a step allocates nothing */
                lt_safetensors_close(ctx, f.exp);
                lt_model_free(ctx, m);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
                lt_ctx_free(ctx);
            }
}

static void read_config(lt_ctx *ctx, const char *c, const char *file, lt_model_config *cfg) {
    char dir[1024];
    case_dir(c, dir, sizeof dir);
    if (file) {
        strcat(dir, "/");
        strcat(dir, file);
    }
    if (lt_model_inspect(ctx, dir, NULL, cfg) != LT_OK) {
        fprintf(stderr, "%s: %s\n", c, lt_ctx_error(ctx));
        fail();
    }
}

/* What the HF and GGUF readers make of each fixture, and the per-layer descriptions. */
static void configs_and_layer_descriptions(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (int gg = 0; gg < 2; gg++) {
        lt_model_config c;
        read_config(ctx, "gemma2", gg ? "model.gguf" : NULL, &c);
        assert_int_equal(c.arch, LT_ARCH_GEMMA2);
        assert_int_equal(c.sliding_window, 5);
        assert_int_equal(c.sliding_period, 2);
        assert_true(c.attn_softcap == 1.0f && c.final_softcap == 2.0f && c.embed_scale == 8.0f);
        assert_true(fabs(c.query_scale - 1.0 / sqrt(64.0)) < 1e-12);
        assert_int_equal(c.norm_plus_one, !gg); /* the GGUF holds 1 + w already */
        assert_int_equal(c.mlp, LT_MLP_KIND_GEGLU);
        assert_int_equal(c.norm_place, LT_NORM_PLACE_SANDWICH);
        assert_true(c.rope_local_theta == 0 && c.rope_theta == 10000.0 && !c.qk_norm && c.tie_embeddings);
        for (int64_t l = 0; l < c.L; l++) {
            lt_layer_desc d;
            lt_model_describe_layer(&c, l, &d);
            assert_int_equal(d.attn, l % 2 ? LT_ATTN_KIND_FULL : LT_ATTN_KIND_SLIDING);
            assert_int_equal(d.window, l % 2 ? 0 : 5);
            assert_int_equal(d.rope, 0);
            assert_true(d.softcap == 1.0f);
        }
        read_config(ctx, "gemma3", gg ? "model.gguf" : NULL, &c);
        assert_int_equal(c.arch, LT_ARCH_GEMMA3);
        assert_true(c.qk_norm && c.sliding_window == 4 && c.sliding_period == 3 && c.attn_softcap == 0);
        assert_true(c.final_softcap == 2.5f && c.rope_theta == 1e6 && c.rope_local_theta == 1e4);
        for (int64_t l = 0; l < c.L; l++) {
            lt_layer_desc d;
            lt_model_describe_layer(&c, l, &d);
            assert_int_equal(d.attn, l == 2 ? LT_ATTN_KIND_FULL : LT_ATTN_KIND_SLIDING);
            assert_int_equal(d.rope, l == 2 ? 0 : 1); /* sliding layers rotate by the local base */
            assert_true(d.qk_norm && d.norm == LT_NORM_PLACE_SANDWICH && d.mlp == LT_MLP_KIND_GEGLU);
        }
        assert_int_equal(lt_model_check_layers(ctx, &c), LT_OK);
    }
    lt_model_config c;
    read_config(ctx, "gemma3_d256", NULL, &c);
    assert_true(c.D == 256 && fabs(c.query_scale - 1.0 / sqrt(48.0)) < 1e-12 && c.final_softcap == 0);
    lt_ctx_free(ctx);
}

/* Writes `json` as config.json of a scratch folder and reads it. */
static lt_status read_json(lt_ctx *ctx, const char *json, lt_model_config *cfg) {
    char dir[] = "/tmp/lt_gemma_cfg_XXXXXX", p[128];
    assert_non_null(mkdtemp(dir));
    snprintf(p, sizeof p, "%s/config.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(json, f);
    fclose(f);
    lt_status s = lt_model_config_read_hf(ctx, p, cfg);
    unlink(p);
    rmdir(dir);
    return s;
}

#define GEMMA3_KEYS                                                                                             \
    "\"vocab_size\": 96, \"hidden_size\": 64, \"intermediate_size\": 64, \"num_hidden_layers\": 12, "           \
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 32, \"query_pre_attn_scalar\": 32, " \
    "\"rms_norm_eps\": 1e-6, \"hidden_activation\": \"gelu_pytorch_tanh\", \"sliding_window\": 512"

/* Gemma3ForConditionalGeneration's text_config, the transformers 4 keys (rope_local_base_freq,
 * sliding_window_pattern), and what cannot be expressed or run is refused by name. */
static void config_variants_and_refusals(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config c;
    assert_int_equal(
        read_json(ctx,
                  "{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", " GEMMA3_KEYS
                  ", \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0, "
                  "\"sliding_window_pattern\": 6}}",
                  &c),
        LT_OK);
    assert_true(c.arch == LT_ARCH_GEMMA3 && c.C == 64 && c.L == 12 && c.sliding_period == 6 &&
                c.rope_local_theta == 1e4 && c.rope_theta == 1e6 && c.sliding_window == 512);
    lt_layer_desc d;
    lt_model_describe_layer(&c, 5, &d);
    assert_int_equal(d.attn, LT_ATTN_KIND_FULL);
    lt_model_describe_layer(&c, 6, &d);
    assert_true(d.attn == LT_ATTN_KIND_SLIDING && d.rope == 1);
    /* A Hub-style sparse text_config (Gemma 3 4B's keys): the rest are Gemma3TextConfig's defaults;
     * its linear RoPE scaling is refused by name. */
    static const char sparse[] = "{\"model_type\": \"gemma3\", \"text_config\": {\"hidden_size\": 2560, "
                                 "\"intermediate_size\": 10240, \"model_type\": \"gemma3_text\", "
                                 "\"num_hidden_layers\": 34, \"sliding_window\": 1024%s}}";
    char sp[600];
    snprintf(sp, sizeof sp, sparse, "");
    assert_int_equal(read_json(ctx, sp, &c), LT_OK);
    assert_true(c.V == 262208 && c.C == 2560 && c.F == 10240 && c.L == 34 && c.H == 8 && c.Hkv == 4 && c.D == 256);
    assert_true(c.tie_embeddings && c.sliding_window == 1024 && c.sliding_period == 6 && c.rope_theta == 1e6 &&
                c.rope_local_theta == 1e4 && fabs(c.query_scale - 1.0 / 16) < 1e-12 && c.bos_id == 2 && c.eos_id == 1);
    /* Gemma 3 4B's linear scaling applies to the global layers' table; the sliding layers keep
     * plain RoPE at rope_local_base_freq. */
    snprintf(sp, sizeof sp, sparse, ", \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"}");
    assert_int_equal(read_json(ctx, sp, &c), LT_OK);
    assert_true(c.rope_scaling == LT_ROPE_SCALING_LINEAR && c.rope_factor == 8.0 && c.rope_local_theta == 1e4);
    /* layer_types with no period */
    char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"gemma3_text\", " GEMMA3_KEYS ", \"num_hidden_layers\": 3, \"layer_types\": "
             "[\"sliding_attention\", \"full_attention\", \"sliding_attention\"]}");
    /* (the duplicate num_hidden_layers: cJSON takes the first, 12, so the list length is wrong) */
    assert_int_equal(read_json(ctx, buf, &c), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "layer_types"));
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"gemma2\", \"vocab_size\": 96, \"hidden_size\": 64, \"intermediate_size\": 64, "
             "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"head_dim\": 32, \"sliding_window\": 8, "
             "\"layer_types\": [\"sliding_attention\", \"full_attention\", \"full_attention\", "
             "\"sliding_attention\"]}");
    assert_int_equal(read_json(ctx, buf, &c), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "layer_types[2]"));
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"gemma2\", \"vocab_size\": 96, \"hidden_size\": 64, \"intermediate_size\": 64, "
             "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"head_dim\": 32, \"hidden_activation\": "
             "\"silu\"}");
    assert_int_equal(read_json(ctx, buf, &c), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "hidden_activation"));
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"gemma2\", \"vocab_size\": 96, \"hidden_size\": 64, \"intermediate_size\": 64, "
             "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"head_dim\": 32, \"final_logit_softcapping\": "
             "-1}");
    assert_int_equal(read_json(ctx, buf, &c), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "final_logit_softcapping"));
    assert_int_equal(read_json(ctx, "{\"model_type\": \"gemma3\"}", &c), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "text_config"));
    snprintf(buf, sizeof buf,
             "{\"model_type\": \"gemma3_text\", " GEMMA3_KEYS ", \"rope_parameters\": {\"sliding_attention\": "
             "{\"rope_type\": \"yarn\", \"rope_theta\": 1e4}}}");
    assert_int_equal(read_json(ctx, buf, &c), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "rope_type"));
    lt_ctx_free(ctx);
}

int main(int argc, char **argv) {
    (void)argc;
    lt_test_omp_passive(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(matches_pytorch_peft),          cmocka_unit_test(gguf_matches_pytorch_peft),
        cmocka_unit_test(multimodal_checkpoint_matches), cmocka_unit_test(chunks_bf16_and_kept_attention),
        cmocka_unit_test(size_table_equals_allocations), cmocka_unit_test(configs_and_layer_descriptions),
        cmocka_unit_test(config_variants_and_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
