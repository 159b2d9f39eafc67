/* The tiny random model writer (tiny_model.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "helpers/tiny_model.h"
#include "longtune/safetensors.h"

static void *tensor(const lt_test_tiny *t, int64_t rows, int64_t cols, int kind, uint64_t *rng) {
    int64_t n = cols ? rows * cols : rows;
    float *f = malloc((size_t)n * sizeof(float));
    assert_non_null(f);
    for (int64_t i = 0; i < n; i++) {
        double z = lt_test_normal(rng);
        f[i] = (float)(kind == 1 ? 1.0 + 0.1 * z : kind == 3 ? z : 0.6 * z / sqrt((double)cols));
    }
    if (t->dtype == LT_DTYPE_F32) return f;
    uint16_t *b = malloc((size_t)n * sizeof(uint16_t));
    assert_non_null(b);
    for (int64_t i = 0; i < n; i++) b[i] = lt_f32_to_bf16(f[i]);
    free(f);
    return b;
}

/* window > 0: the Gemma 3 form (lt_test_tiny_write_gemma3). */
static void write_model(const lt_test_tiny *t, int64_t window, int64_t period, const char *dir, uint64_t *rng) {
    mkdir(dir, 0755);
    char path[1200], cfg[1400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": %lld, \"hidden_size\": %lld,"
             " \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, \"num_attention_heads\": %lld,"
             " \"num_key_value_heads\": %lld, \"head_dim\": %lld, \"max_position_embeddings\": 512,"
             " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"tie_word_embeddings\": false,"
             " \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             t->qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM", t->qk_norm ? "qwen3" : "llama", (long long)t->V,
             (long long)t->C, (long long)t->F, (long long)t->L, (long long)t->H, (long long)t->Hkv, (long long)t->D);
    int gemma = window > 0;
    if (gemma)
        snprintf(cfg, sizeof cfg,
                 "{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", \"vocab_size\": %lld,"
                 " \"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld,"
                 " \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld,"
                 " \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0,"
                 " \"rope_local_base_freq\": 10000.0, \"query_pre_attn_scalar\": %lld, \"sliding_window\": %lld,"
                 " \"sliding_window_pattern\": %lld, \"final_logit_softcapping\": 30.0,"
                 " \"hidden_activation\": \"gelu_pytorch_tanh\", \"tie_word_embeddings\": true,"
                 " \"bos_token_id\": 2, \"eos_token_id\": 1}",
                 (long long)t->V, (long long)t->C, (long long)t->F, (long long)t->L, (long long)t->H, (long long)t->Hkv,
                 (long long)t->D, (long long)t->D, (long long)window, (long long)period);
    FILE *fc = fopen(path, "wb");
    assert_non_null(fc);
    fputs(cfg, fc);
    fclose(fc);
    int max = 3 + 13 * (int)t->L, n = 0;
    lt_safetensors_entry *e = calloc((size_t)max, sizeof *e);
    char(*names)[96] = calloc((size_t)max, sizeof *names);
    void **bufs = calloc((size_t)max, sizeof *bufs);
    assert_true(e && names && bufs);
    int64_t qd = t->H * t->D, kvd = t->Hkv * t->D;
    /* one tensor: name, rows, cols (0 = a vector), kind (0 matrix, 1 norm, 3 embedding) */
#define ADD(r, c, kind)                                                                      \
    do {                                                                                     \
        assert_true(n < max);                                                                \
        bufs[n] = tensor(t, r, c, kind, rng);                                                \
        int64_t shape_[2] = {r, c};                                                          \
        e[n].name = names[n];                                                                \
        e[n].tensor = lt_tensor_view(bufs[n], t->dtype, LT_DEVICE_CPU, (c) ? 2 : 1, shape_); \
        n++;                                                                                 \
    } while (0)
    snprintf(names[n], 96, "model.embed_tokens.weight");
    ADD(t->V, t->C, 3);
    snprintf(names[n], 96, "model.norm.weight");
    ADD(t->C, 0, 1);
    if (!gemma) {
        snprintf(names[n], 96, "lm_head.weight");
        ADD(t->V, t->C, 0);
    }
    static const char *const part[9] = {"input_layernorm",  "post_attention_layernorm",
                                        "self_attn.q_proj", "self_attn.k_proj",
                                        "self_attn.v_proj", "self_attn.o_proj",
                                        "mlp.gate_proj",    "mlp.up_proj",
                                        "mlp.down_proj"};
    for (int64_t l = 0; l < t->L; l++) {
        const int64_t rows[9] = {t->C, t->C, qd, kvd, kvd, t->C, t->F, t->F, t->C};
        const int64_t cols[9] = {0, 0, t->C, t->C, t->C, qd, t->C, t->C, t->F};
        for (int i = 0; i < 9; i++) {
            snprintf(names[n], 96, "model.layers.%lld.%s.weight", (long long)l, part[i]);
            ADD(rows[i], cols[i], i < 2);
        }
        if (gemma) { /* the sandwich: the MLP's input norm and the two blocks' output norms */
            snprintf(names[n], 96, "model.layers.%lld.pre_feedforward_layernorm.weight", (long long)l);
            ADD(t->C, 0, 1);
            snprintf(names[n], 96, "model.layers.%lld.post_feedforward_layernorm.weight", (long long)l);
            ADD(t->C, 0, 1);
        }
        if (t->qk_norm || gemma) {
            snprintf(names[n], 96, "model.layers.%lld.self_attn.q_norm.weight", (long long)l);
            ADD(t->D, 0, 1);
            snprintf(names[n], 96, "model.layers.%lld.self_attn.k_norm.weight", (long long)l);
            ADD(t->D, 0, 1);
        }
    }
#undef ADD
    lt_ctx *ctx = lt_ctx_new();
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    lt_status s = lt_safetensors_write(ctx, path, e, n, NULL, 0);
    if (s != LT_OK) fprintf(stderr, "tiny model %s: %s\n", dir, lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    lt_ctx_free(ctx);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs), free(names), free(e);
}

void lt_test_tiny_write(const lt_test_tiny *t, const char *dir, uint64_t *rng) { write_model(t, 0, 0, dir, rng); }

void lt_test_tiny_write_gemma3(const lt_test_tiny *t, int64_t window, int64_t period, const char *dir, uint64_t *rng) {
    write_model(t, window, period, dir, rng);
}
