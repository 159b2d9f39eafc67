/* Hugging Face config.json → lt_model_config for the families the one model implements (Llama
 * and SmolLM2, Qwen2, Qwen3, Mistral, Phi-3), as transformers 4.x and 5.x write it: the shape keys
 * every family shares, the family's own reader (the layer features lt_model_describe_layer
 * expands), RoPE from rope_parameters or rope_scaling, the text_config of a multimodal wrapper,
 * and the EOS list of generation_config.json. Anything it cannot honour exactly is refused with a
 * typed error naming the key and value rather than approximated. Weight dtypes are left to the
 * loaders. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/model_internal.h"
#include "io/json_nul.h"
#include "model/config_bounds.h"

static lt_status get_int(lt_ctx *ctx, const char *path, const cJSON *root, const char *key, int required,
                         int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return lt_error(ctx, LT_ERR_FORMAT, "%s: missing key \"%s\"", path, key);
        return LT_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 || v->valuedouble > 4.0e15)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" must be a non-negative integer", path, key);
    *out = (int64_t)v->valuedouble;
    return LT_OK;
}

static lt_status get_num(lt_ctx *ctx, const char *path, const cJSON *root, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return LT_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    *out = v->valuedouble;
    return LT_OK;
}

static lt_status get_bool(lt_ctx *ctx, const char *path, const cJSON *root, const char *key, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return LT_OK;
    if (!cJSON_IsBool(v)) return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(v);
    return LT_OK;
}

static lt_status refuse_true(lt_ctx *ctx, const char *path, const cJSON *root, const char *key, const char *what) {
    int flag = 0;
    LT_TRY(get_bool(ctx, path, root, key, &flag));
    if (flag) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: %s is not supported", path, what);
    return LT_OK;
}

/* ---- the families: each fills the layer features of its model_type ---- */

static lt_status family_llama(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_LLAMA;
    LT_TRY(refuse_true(ctx, path, root, "attention_bias", "llama with attention_bias"));
    return refuse_true(ctx, path, root, "mlp_bias", "mlp_bias");
}

static lt_status family_qwen2(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_QWEN2;
    cfg->qkv_bias = 1;
    return refuse_true(ctx, path, root, "use_sliding_window", "use_sliding_window=true");
}

static lt_status family_qwen3(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_QWEN3;
    cfg->qk_norm = 1;
    LT_TRY(refuse_true(ctx, path, root, "attention_bias", "qwen3 with attention_bias"));
    return refuse_true(ctx, path, root, "use_sliding_window", "use_sliding_window=true");
}

/* sliding_window: null (v0.2, v0.3, Nemo) is full attention, W > 0 every layer slides over W. */
static lt_status read_window(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->sliding_window = 0;
    LT_TRY(get_int(ctx, path, root, "sliding_window", 0, &cfg->sliding_window));
    cfg->sliding_period = 0;
    return LT_OK;
}

/* Mistral 7B v0.1 (sliding_window 4096), v0.2/v0.3 (null), Nemo (explicit head_dim, H*D != C):
 * the Llama block with an optional window on every layer. */
static lt_status family_mistral(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_MISTRAL;
    LT_TRY(refuse_true(ctx, path, root, "attention_bias", "mistral with attention_bias"));
    return read_window(ctx, path, root, cfg);
}

/* Phi-3 / 3.5-mini: fused qkv_proj and gate_up_proj (split at load), longrope, optional window. */
static lt_status family_phi3(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_PHI3;
    LT_TRY(refuse_true(ctx, path, root, "attention_bias", "phi3 with attention_bias"));
    return read_window(ctx, path, root, cfg);
}

/* ---- mixture of experts: Qwen3-MoE and Mixtral ---- */

/* The router's load-balancing loss enters the loss as transformers adds it: router_aux_loss_coef
 * when output_router_logits is true, else not at all. */
static lt_status moe_aux(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    int out_logits = 0;
    LT_TRY(get_bool(ctx, path, root, "output_router_logits", &out_logits));
    double coef = 0.001;
    LT_TRY(get_num(ctx, path, root, "router_aux_loss_coef", &coef));
    if (!(coef >= 0 && coef <= 1e6))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"router_aux_loss_coef\" = %g must be in [0, 1e6]", path, coef);
    cfg->moe_aux_coef = out_logits ? (float)coef : 0.0f;
    return LT_OK;
}

/* The expert count (under either key transformers writes), experts per token and the expert
 * width, checked: typed errors for zero experts, more than LT_MOE_MAX_EXPERTS, top-k outside
 * 1..experts, a width <= 0. */
static lt_status moe_counts(lt_ctx *ctx, const char *path, const cJSON *root, const char *experts_key,
                            const char *width_key, lt_model_config *cfg) {
    int64_t E = -1, k = -1, F = -1;
    LT_TRY(get_int(ctx, path, root, experts_key, 0, &E));
    if (E < 0) LT_TRY(get_int(ctx, path, root, "num_local_experts", 0, &E));
    if (E < 0) return lt_error(ctx, LT_ERR_FORMAT, "%s: missing key \"%s\"", path, experts_key);
    LT_TRY(get_int(ctx, path, root, "num_experts_per_tok", 1, &k));
    if (width_key) {
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(root, width_key);
        if (cJSON_IsNumber(w) && w->valuedouble <= 0)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" = %g must be positive", path, width_key, w->valuedouble);
        LT_TRY(get_int(ctx, path, root, width_key, 1, &F));
    } else {
        F = cfg->F;
    }
    if (E == 0 || E > LT_MOE_MAX_EXPERTS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %lld experts (\"%s\") is outside 1..%d", path, (long long)E,
                        experts_key, LT_MOE_MAX_EXPERTS);
    if (k < 1 || k > E)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"num_experts_per_tok\" = %lld must be in 1..%lld (the experts)", path,
                        (long long)k, (long long)E);
    if (F <= 0 || F > LT_MODEL_MAX_MLP)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" = %lld is outside [1, %d]", path,
                        width_key ? width_key : "intermediate_size", (long long)F, LT_MODEL_MAX_MLP);
    cfg->n_experts = E;
    cfg->n_experts_used = k;
    cfg->moe_F = F;
    return moe_aux(ctx, path, root, cfg);
}

/* Qwen3-MoE: Qwen3's attention; layer l is sparse unless listed in mlp_only_layers, when
 * num_experts > 0 and (l + 1) % decoder_sparse_step == 0; those use moe_intermediate_size, the
 * dense ones intermediate_size. norm_topk_prob renormalises the top-k weights. */
static lt_status family_qwen3_moe(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    LT_TRY(family_qwen3(ctx, path, root, cfg));
    cfg->arch = LT_ARCH_QWEN3_MOE;
    LT_TRY(moe_counts(ctx, path, root, "num_experts", "moe_intermediate_size", cfg));
    cfg->moe_norm_topk = 0;
    LT_TRY(get_bool(ctx, path, root, "norm_topk_prob", &cfg->moe_norm_topk));
    int64_t step = 1;
    LT_TRY(get_int(ctx, path, root, "decoder_sparse_step", 0, &step));
    if (step < 1 || step > LT_MODEL_MAX_LAYERS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"decoder_sparse_step\" = %lld must be >= 1", path, (long long)step);
    cfg->moe_every = step;
    const cJSON *dense = cJSON_GetObjectItemCaseSensitive(root, "mlp_only_layers");
    if (dense && !cJSON_IsNull(dense)) {
        if (!cJSON_IsArray(dense))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list of layer indices", path);
        const cJSON *it;
        cJSON_ArrayForEach(it, dense) {
            if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
                it->valuedouble >= (double)cfg->L)
                return lt_error(ctx, LT_ERR_FORMAT, "%s: \"mlp_only_layers\" holds %g, not a layer in 0..%lld", path,
                                cJSON_IsNumber(it) ? it->valuedouble : -1.0, (long long)cfg->L - 1);
            if (it->valuedouble >= LT_MODEL_MAX_MIXED_LAYERS)
                return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: \"mlp_only_layers\" names layer %g (at most %d)", path,
                                it->valuedouble, LT_MODEL_MAX_MIXED_LAYERS - 1);
            cfg->moe_dense[(int)it->valuedouble] = 1;
        }
    }
    return LT_OK;
}

/* Mixtral: Mistral's attention with an optional window, every layer sparse with experts of width
 * intermediate_size, the top-k weights always renormalised. */
static lt_status family_mixtral(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    LT_TRY(family_mistral(ctx, path, root, cfg));
    cfg->arch = LT_ARCH_MIXTRAL;
    LT_TRY(moe_counts(ctx, path, root, "num_local_experts", NULL, cfg));
    double jitter = 0;
    LT_TRY(get_num(ctx, path, root, "router_jitter_noise", &jitter));
    if (jitter != 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: \"router_jitter_noise\" = %g is not supported (0)", path, jitter);
    cfg->moe_norm_topk = 1;
    cfg->moe_every = 1;
    return LT_OK;
}

/* Qwen2-MoE: Qwen2's attention (q/k/v biases unless qkv_bias is false), Qwen3-MoE's routing keys,
 * and a shared expert of width shared_expert_intermediate_size on every token of an MoE layer,
 * its output scaled by sigmoid(shared_expert_gate · h). */
static lt_status family_qwen2_moe(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    LT_TRY(family_qwen3_moe(ctx, path, root, cfg));
    cfg->arch = LT_ARCH_QWEN2_MOE;
    cfg->qk_norm = 0;
    cfg->qkv_bias = 1;
    LT_TRY(get_bool(ctx, path, root, "qkv_bias", &cfg->qkv_bias));
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(root, "shared_expert_intermediate_size");
    if (cJSON_IsNumber(w) && w->valuedouble <= 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"shared_expert_intermediate_size\" = %g must be positive", path,
                        w->valuedouble);
    LT_TRY(get_int(ctx, path, root, "shared_expert_intermediate_size", 1, &cfg->moe_shared_F));
    if (cfg->moe_shared_F > LT_MODEL_MAX_MLP)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"shared_expert_intermediate_size\" = %lld is above %d", path,
                        (long long)cfg->moe_shared_F, LT_MODEL_MAX_MLP);
    return LT_OK;
}

/* ---- Gemma 2 and Gemma 3 (text): GeGLU, sandwich norms with (1 + w) weights, sqrt(C) embedding
 * scale, query_pre_attn_scalar, softcaps, alternating sliding and global layers; Gemma 3 adds
 * q/k norms and a second RoPE base for its sliding layers. ---- */

static lt_status gemma_num(lt_ctx *ctx, const char *path, const cJSON *root, const char *key, double lo, double *out) {
    LT_TRY(get_num(ctx, path, root, key, out));
    if (!(*out >= lo)) return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" = %g must be >= %g", path, key, *out, lo);
    return LT_OK;
}

/* One entry of transformers 5's rope_parameters (the object itself for Gemma 2, per layer type for
 * Gemma 3): its base into *theta. The global layers' scaling is read by the shared RoPE reader
 * (every type); the sliding layers' table is plain RoPE, so a rope_type there other than
 * "default" is refused. */
static lt_status gemma_rope_entry(lt_ctx *ctx, const char *path, const cJSON *rp, const char *what, int sliding,
                                  double *theta) {
    if (!cJSON_IsObject(rp)) return lt_error(ctx, LT_ERR_FORMAT, "%s: %s must be an object", path, what);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (sliding && t && !cJSON_IsNull(t) && !(cJSON_IsString(t) && !strcmp(t->valuestring, "default")))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: %s.rope_type \"%s\" is not supported for Gemma (default)", path,
                        what, cJSON_IsString(t) ? t->valuestring : "?");
    LT_TRY(get_num(ctx, path, rp, "rope_theta", theta));
    if (!(*theta > 0)) return lt_error(ctx, LT_ERR_FORMAT, "%s: %s.rope_theta must be positive", path, what);
    return LT_OK;
}

/* The layer kinds: `layer_types` when present (every entry "sliding_attention" or "full_attention",
 * which must follow one period: layer l global exactly when l % p == p - 1), else every
 * `default_period`-th layer global. Without a sliding window every layer is global. */
static lt_status gemma_layers(lt_ctx *ctx, const char *path, const cJSON *root, int64_t default_period,
                              lt_model_config *cfg) {
    LT_TRY(get_int(ctx, path, root, "sliding_window", 0, &cfg->sliding_window));
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
    if (!lt || cJSON_IsNull(lt)) {
        cfg->sliding_period = default_period;
        return LT_OK;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != (int)cfg->L)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"layer_types\" must list one type per layer (%lld)", path,
                        (long long)cfg->L);
    int64_t first_full = -1, n_full = 0;
    for (int64_t l = 0; l < cfg->L; l++) {
        const cJSON *e = cJSON_GetArrayItem(lt, (int)l);
        int full = cJSON_IsString(e) && !strcmp(e->valuestring, "full_attention");
        if (!full && !(cJSON_IsString(e) && !strcmp(e->valuestring, "sliding_attention")))
            return lt_error(ctx, LT_ERR_FORMAT,
                            "%s: layer_types[%lld] must be \"sliding_attention\" or \"full_attention\"", path,
                            (long long)l);
        if (full && first_full < 0) first_full = l;
        n_full += full;
    }
    if (n_full == cfg->L) { /* every layer global */
        cfg->sliding_window = cfg->sliding_period = 0;
        return LT_OK;
    }
    if (cfg->sliding_window == 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: layer_types has sliding layers but no sliding_window", path);
    /* every layer sliding: period 0; else the period the first global layer gives */
    int64_t p = first_full < 0 ? 0 : first_full + 1;
    for (int64_t l = 0; l < cfg->L; l++) {
        int full = !strcmp(cJSON_GetArrayItem(lt, (int)l)->valuestring, "full_attention");
        if (full != (p > 0 && l % p == p - 1))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "%s: layer_types[%lld] is %s, which no period of global layers gives (period %lld from "
                            "the first global layer)",
                            path, (long long)l, full ? "full_attention" : "sliding_attention", (long long)p);
    }
    cfg->sliding_period = p;
    return LT_OK;
}

/* The keys Gemma 2 and Gemma 3 share. */
static lt_status gemma_common(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_activation");
    if (!act || cJSON_IsNull(act)) act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) &&
        !(cJSON_IsString(act) &&
          (!strcmp(act->valuestring, "gelu_pytorch_tanh") || !strcmp(act->valuestring, "gelu_new"))))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: Gemma hidden_activation must be \"gelu_pytorch_tanh\"", path);
    LT_TRY(refuse_true(ctx, path, root, "attention_bias", "gemma with attention_bias"));
    LT_TRY(refuse_true(ctx, path, root, "use_bidirectional_attention", "use_bidirectional_attention=true"));
    cfg->tie_embeddings = 1; /* Gemma's default: a config.json may leave it out */
    LT_TRY(get_bool(ctx, path, root, "tie_word_embeddings", &cfg->tie_embeddings));
    cfg->mlp = LT_MLP_KIND_GEGLU;
    cfg->norm_place = LT_NORM_PLACE_SANDWICH;
    cfg->norm_plus_one = 1;
    cfg->embed_scale = (float)sqrt((double)cfg->C);
    double qs = (double)cfg->D;
    LT_TRY(gemma_num(ctx, path, root, "query_pre_attn_scalar", 1e-30, &qs));
    cfg->query_scale = 1.0 / sqrt(qs);
    double cap = 0;
    LT_TRY(gemma_num(ctx, path, root, "attn_logit_softcapping", 0, &cap));
    cfg->attn_softcap = (float)cap;
    cap = 0;
    LT_TRY(gemma_num(ctx, path, root, "final_logit_softcapping", 0, &cap));
    cfg->final_softcap = (float)cap;
    return LT_OK;
}

static lt_status family_gemma2(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_GEMMA2;
    LT_TRY(gemma_common(ctx, path, root, cfg));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) LT_TRY(gemma_rope_entry(ctx, path, rp, "rope_parameters", 0, &cfg->rope_theta));
    return gemma_layers(ctx, path, root, 2, cfg);
}

static lt_status family_gemma3(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->arch = LT_ARCH_GEMMA3;
    cfg->qk_norm = 1;
    LT_TRY(gemma_common(ctx, path, root, cfg));
    cfg->rope_local_theta = 10000.0;
    LT_TRY(get_num(ctx, path, root, "rope_local_base_freq", &cfg->rope_local_theta));
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *slide = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (full || slide) {
            if (full) LT_TRY(gemma_rope_entry(ctx, path, full, "rope_parameters.full_attention", 0, &cfg->rope_theta));
            if (slide)
                LT_TRY(
                    gemma_rope_entry(ctx, path, slide, "rope_parameters.sliding_attention", 1, &cfg->rope_local_theta));
        } else {
            LT_TRY(gemma_rope_entry(ctx, path, rp, "rope_parameters", 0, &cfg->rope_theta));
        }
    }
    if (!(cfg->rope_local_theta > 0))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: rope_local_base_freq must be positive", path);
    int64_t period = 6;
    LT_TRY(get_int(ctx, path, root, "sliding_window_pattern", 0, &period));
    LT_TRY(get_int(ctx, path, root, "_sliding_window_pattern", 0, &period));
    return gemma_layers(ctx, path, root, period, cfg);
}

/* Gemma3ForConditionalGeneration's config.json: the text model's keys live in "text_config" (its
 * model_type gemma3_text), which lists only what differs from Gemma3TextConfig's defaults, so
 * those are filled in first; the vision tower is not read. Returns root itself for any other
 * config, else a copy the caller deletes (*owned), or NULL with *st set. */
static const cJSON *gemma3_text_root(lt_ctx *ctx, const char *path, const cJSON *root, cJSON **owned, lt_status *st) {
    static const struct {
        const char *key;
        double value;
    } defaults[] = {{"vocab_size", 262208},      {"hidden_size", 2304},
                    {"intermediate_size", 9216}, {"num_hidden_layers", 26},
                    {"num_attention_heads", 8},  {"num_key_value_heads", 4},
                    {"head_dim", 256},           {"max_position_embeddings", 131072},
                    {"rms_norm_eps", 1e-6},      {"query_pre_attn_scalar", 256},
                    {"sliding_window", 4096},    {"rope_local_base_freq", 10000},
                    {"bos_token_id", 2},         {"eos_token_id", 1}};
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    *st = LT_OK;
    *owned = NULL;
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gemma3")) return root;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tc)) {
        *st = lt_error(ctx, LT_ERR_FORMAT, "%s: model_type \"gemma3\" needs a \"text_config\" object", path);
        return NULL;
    }
    cJSON *t = cJSON_Duplicate(tc, 1);
    int ok = t != NULL;
    for (size_t i = 0; ok && i < sizeof defaults / sizeof defaults[0]; i++)
        if (!cJSON_GetObjectItemCaseSensitive(t, defaults[i].key))
            ok = cJSON_AddNumberToObject(t, defaults[i].key, defaults[i].value) != NULL;
    if (ok && !cJSON_GetObjectItemCaseSensitive(t, "rope_theta") &&
        !cJSON_GetObjectItemCaseSensitive(t, "rope_parameters"))
        ok = cJSON_AddNumberToObject(t, "rope_theta", 1e6) != NULL;
    if (ok && !cJSON_GetObjectItemCaseSensitive(t, "tie_word_embeddings"))
        ok = cJSON_AddBoolToObject(t, "tie_word_embeddings", 1) != NULL;
    if (!ok) {
        cJSON_Delete(t);
        *st = lt_error(ctx, LT_ERR_OOM, "%s: text_config copy", path);
        return NULL;
    }
    *owned = t;
    return t;
}

static const struct {
    const char *model_type;
    lt_status (*read)(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg);
} families[] = {{"llama", family_llama},        {"qwen2", family_qwen2},         {"qwen3", family_qwen3},
                {"mistral", family_mistral},    {"phi3", family_phi3},           {"gemma2", family_gemma2},
                {"gemma3_text", family_gemma3}, {"qwen3_moe", family_qwen3_moe}, {"mixtral", family_mixtral},
                {"qwen2_moe", family_qwen2_moe}};

/* ---- keys every family shares ---- */

static lt_status read_shape(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    LT_TRY(get_int(ctx, path, root, "vocab_size", 1, &cfg->V));
    LT_TRY(get_int(ctx, path, root, "hidden_size", 1, &cfg->C));
    LT_TRY(get_int(ctx, path, root, "intermediate_size", 1, &cfg->F));
    LT_TRY(get_int(ctx, path, root, "num_hidden_layers", 1, &cfg->L));
    LT_TRY(get_int(ctx, path, root, "num_attention_heads", 1, &cfg->H));
    cfg->Hkv = cfg->H;
    LT_TRY(get_int(ctx, path, root, "num_key_value_heads", 0, &cfg->Hkv));
    if (cfg->H <= 0 || cfg->C <= 0) return lt_error(ctx, LT_ERR_FORMAT, "%s: zero heads or width", path);
    cfg->D = cfg->C / cfg->H;
    LT_TRY(get_int(ctx, path, root, "head_dim", 0, &cfg->D));
    cfg->max_positions = 2048;
    LT_TRY(get_int(ctx, path, root, "max_position_embeddings", 0, &cfg->max_positions));
    double eps = 1e-6;
    LT_TRY(get_num(ctx, path, root, "rms_norm_eps", &eps));
    if (!(eps > 0 && eps <= LT_MODEL_MAX_RMS_EPS)) /* before the float conversion */
        return lt_error(ctx, LT_ERR_FORMAT, "%s: rms_norm_eps = %g is outside (0, %g]", path, eps,
                        LT_MODEL_MAX_RMS_EPS);
    cfg->rms_eps = (float)eps;
    cfg->tie_embeddings = 0;
    LT_TRY(get_bool(ctx, path, root, "tie_word_embeddings", &cfg->tie_embeddings));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    int gemma = cJSON_IsString(mt) && !strncmp(mt->valuestring, "gemma", 5); /* gemma_common reads it */
    if (act && !gemma &&
        !(cJSON_IsString(act) && (!strcmp(act->valuestring, "silu") || !strcmp(act->valuestring, "swish"))))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: hidden_act %s is not supported (\"silu\")", path,
                        cJSON_IsString(act) ? act->valuestring : "(not a string)");
    /* torch_dtype (transformers 4) / dtype (5): only informational (the tensors carry theirs),
     * but a value longtune does not know is refused rather than ignored. */
    static const char *const dkeys[2] = {"dtype", "torch_dtype"};
    for (int k = 0; k < 2; k++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(root, dkeys[k]);
        if (!d || cJSON_IsNull(d)) continue;
        if (!cJSON_IsString(d) ||
            (strcmp(d->valuestring, "float32") && strcmp(d->valuestring, "float16") &&
             strcmp(d->valuestring, "bfloat16") && strcmp(d->valuestring, "auto")))
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: %s %s is not supported (float32, float16, bfloat16)", path,
                            dkeys[k], cJSON_IsString(d) ? d->valuestring : "(not a string)");
    }
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    if (q && !cJSON_IsNull(q)) {
        const cJSON *qm = cJSON_IsObject(q) ? cJSON_GetObjectItemCaseSensitive(q, "quant_method") : NULL;
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: quantization_config (quant_method %s) is not supported; load the unquantized "
                        "weights (and --quantize) or a GGUF",
                        path, cJSON_IsString(qm) ? qm->valuestring : "unknown");
    }
    return LT_OK;
}

/* ---- RoPE: rope_theta, and the scaling in rope_parameters (transformers 5) or rope_scaling
 * (transformers 4, keyed "type" or "rope_type"), with transformers' own defaults
 * (modeling_rope_utils.standardize_rope_params) ---- */

static const struct {
    const char *name;
    lt_rope_scaling kind;
} rope_types[] = {{"default", LT_ROPE_SCALING_NONE},    {"linear", LT_ROPE_SCALING_LINEAR},
                  {"dynamic", LT_ROPE_SCALING_DYNAMIC}, {"yarn", LT_ROPE_SCALING_YARN},
                  {"llama3", LT_ROPE_SCALING_LLAMA3},   {"longrope", LT_ROPE_SCALING_LONGROPE}};

lt_status lt_rope_scaling_parse(lt_ctx *ctx, const char *name, lt_rope_scaling *out) {
    for (size_t i = 0; i < sizeof rope_types / sizeof rope_types[0]; i++)
        if (!strcmp(name, rope_types[i].name)) {
            *out = rope_types[i].kind;
            return LT_OK;
        }
    return lt_error(ctx, LT_ERR_UNSUPPORTED,
                    "rope scaling type \"%s\" is not supported (default, linear, dynamic, yarn, llama3, longrope)",
                    name);
}

static lt_status get_factors(lt_ctx *ctx, const char *path, const cJSON *rs, const char *key, int64_t half,
                             float *out) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(rs, key);
    if (!cJSON_IsArray(a)) return lt_error(ctx, LT_ERR_FORMAT, "%s: longrope needs a list \"%s\"", path, key);
    if ((int64_t)cJSON_GetArraySize(a) != half || half > LT_ROPE_MAX_FACTORS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" has %d entries, the head needs %lld (at most %d)", path, key,
                        cJSON_GetArraySize(a), (long long)half, LT_ROPE_MAX_FACTORS);
    int i = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !(v->valuedouble > 0))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\"[%d] must be a positive number", path, key, i);
        out[i++] = (float)v->valuedouble;
    }
    return LT_OK;
}

static lt_status read_rope(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cfg->rope_theta = 10000.0;
    LT_TRY(get_num(ctx, path, root, "rope_theta", &cfg->rope_theta));
    double prf = 1.0;
    LT_TRY(get_num(ctx, path, root, "partial_rotary_factor", &prf));
    const char *rkey = "rope_scaling";
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, rkey);
    if (!rs || cJSON_IsNull(rs)) { /* transformers: rope_scaling, when given, wins */
        rkey = "rope_parameters";
        rs = cJSON_GetObjectItemCaseSensitive(root, rkey);
    }
    cfg->rope_scaling = LT_ROPE_SCALING_NONE;
    if (cfg->arch == LT_ARCH_GEMMA3 && cJSON_IsObject(rs) &&
        cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(rs, "full_attention"))) {
        /* transformers 5 per layer type (Gemma 3): the global layers' entry is the model's RoPE;
         * the sliding layers' base is the family reader's (rope_local_theta) */
        rkey = "rope_parameters.full_attention";
        rs = cJSON_GetObjectItemCaseSensitive(rs, "full_attention");
    }
    if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs)) return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" must be an object", path, rkey);
        LT_TRY(get_num(ctx, path, rs, "rope_theta", &cfg->rope_theta));
        LT_TRY(get_num(ctx, path, rs, "partial_rotary_factor", &prf));
    }
    if (prf != 1.0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: partial_rotary_factor %g is not supported (1.0: RoPE over the whole head)", path, prf);
    if (!rs || cJSON_IsNull(rs)) return LT_OK;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t || cJSON_IsNull(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    const cJSON *member;
    cJSON_ArrayForEach(member, rs) { /* transformers 5 nests one object per layer type (Gemma 3) */
        if (cJSON_IsObject(member))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "%s: %s.%s: RoPE parameters per layer type are not supported for this model_type", path,
                            rkey, member->string);
    }
    if (t && !cJSON_IsString(t)) return lt_error(ctx, LT_ERR_FORMAT, "%s: %s.rope_type must be a string", path, rkey);
    const char *type = t ? t->valuestring : "default";
    if (cfg->arch == LT_ARCH_PHI3 && (!strcmp(type, "su") || !strcmp(type, "yarn"))) type = "longrope"; /* Phi3Config */
    if (lt_rope_scaling_parse(ctx, type, &cfg->rope_scaling) != LT_OK)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: %s.rope_type \"%s\" is not supported (default, linear, dynamic, yarn, llama3, longrope)",
                        path, rkey, type);
    if (cfg->rope_scaling == LT_ROPE_SCALING_NONE) return LT_OK;
    /* The pretraining context: Phi-3 keeps it at the top level, which then wins; else the
     * scaling's own, else max_position_embeddings. */
    cfg->rope_original_ctx = cfg->max_positions;
    LT_TRY(get_int(ctx, path, rs, "original_max_position_embeddings", 0, &cfg->rope_original_ctx));
    LT_TRY(get_int(ctx, path, root, "original_max_position_embeddings", 0, &cfg->rope_original_ctx));
    if (cfg->rope_scaling == LT_ROPE_SCALING_DYNAMIC) cfg->rope_original_ctx = cfg->max_positions;
    if (cfg->rope_original_ctx <= 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: original_max_position_embeddings must be positive", path);
    cfg->rope_factor = 0;
    LT_TRY(get_num(ctx, path, rs, "factor", &cfg->rope_factor));
    LT_TRY(get_num(ctx, path, rs, "attention_factor", &cfg->rope_attn_factor));
    switch (cfg->rope_scaling) {
    case LT_ROPE_SCALING_LINEAR:
    case LT_ROPE_SCALING_DYNAMIC:
        if (!cJSON_GetObjectItemCaseSensitive(rs, "factor"))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: %s type \"%s\" needs \"factor\"", path, rkey, type);
        break;
    case LT_ROPE_SCALING_YARN: {
        if (cfg->rope_factor == 0) cfg->rope_factor = (double)cfg->max_positions / (double)cfg->rope_original_ctx;
        double ms = 0, msa = 0;
        LT_TRY(get_num(ctx, path, rs, "mscale", &ms));
        LT_TRY(get_num(ctx, path, rs, "mscale_all_dim", &msa));
        if (cfg->rope_attn_factor == 0 && ms != 0 && msa != 0) {
            double f = cfg->rope_factor;
            double a = f <= 1 ? 1.0 : 0.1 * ms * log(f) + 1.0, b = f <= 1 ? 1.0 : 0.1 * msa * log(f) + 1.0;
            cfg->rope_attn_factor = a / b;
        }
        LT_TRY(get_num(ctx, path, rs, "beta_fast", &cfg->rope_beta_fast));
        LT_TRY(get_num(ctx, path, rs, "beta_slow", &cfg->rope_beta_slow));
        int truncate = 1;
        LT_TRY(get_bool(ctx, path, rs, "truncate", &truncate));
        cfg->rope_yarn_no_truncate = !truncate;
        break;
    }
    case LT_ROPE_SCALING_LLAMA3:
        cfg->rope_low_freq = 1.0;
        cfg->rope_high_freq = 4.0;
        LT_TRY(get_num(ctx, path, rs, "low_freq_factor", &cfg->rope_low_freq));
        LT_TRY(get_num(ctx, path, rs, "high_freq_factor", &cfg->rope_high_freq));
        if (cfg->rope_factor == 0) cfg->rope_factor = 8.0;
        break;
    case LT_ROPE_SCALING_LONGROPE:
        if (cfg->rope_factor == 0) cfg->rope_factor = (double)cfg->max_positions / (double)cfg->rope_original_ctx;
        cfg->rope_n_factors = cfg->D / 2;
        LT_TRY(get_factors(ctx, path, rs, "short_factor", cfg->D / 2, cfg->rope_short_factor));
        LT_TRY(get_factors(ctx, path, rs, "long_factor", cfg->D / 2, cfg->rope_long_factor));
        break;
    default: break;
    }
    char where[600];
    snprintf(where, sizeof where, "%s: %s", path, rkey);
    return lt_model_rope_check(ctx, where, cfg);
}

/* Adds one end-of-sequence id to the list (once). */
static lt_status add_eos(lt_ctx *ctx, const char *path, const char *key, int64_t id, lt_model_config *cfg) {
    if (id > INT32_MAX)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" %lld is out of range", path, key, (long long)id);
    for (int i = 0; i < cfg->n_eos; i++)
        if (cfg->eos_ids[i] == (int32_t)id) return LT_OK;
    if (cfg->n_eos == LT_MAX_EOS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" lists more than %d ids", path, key, LT_MAX_EOS);
    cfg->eos_ids[cfg->n_eos++] = (int32_t)id;
    if (cfg->eos_id < 0) cfg->eos_id = (int32_t)id;
    return LT_OK;
}

/* eos_token_id: an integer or a list of integers (Llama 3, generation_config.json). */
static lt_status read_eos(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (!e || cJSON_IsNull(e)) return LT_OK;
    if (cJSON_IsNumber(e)) {
        int64_t id = -1;
        LT_TRY(get_int(ctx, path, root, "eos_token_id", 0, &id));
        return add_eos(ctx, path, "eos_token_id", id, cfg);
    }
    if (!cJSON_IsArray(e))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: \"eos_token_id\" must be an integer or a list of integers", path);
    const cJSON *v;
    cJSON_ArrayForEach(v, e) {
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: \"eos_token_id\" must list non-negative integers", path);
        LT_TRY(add_eos(ctx, path, "eos_token_id", (int64_t)v->valuedouble, cfg));
    }
    return LT_OK;
}

static lt_status read_token_ids(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    int64_t id = -1;
    cfg->bos_id = cfg->eos_id = -1;
    cfg->n_eos = 0;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (cJSON_IsNumber(b)) {
        LT_TRY(get_int(ctx, path, root, "bos_token_id", 0, &id));
        if (id > INT32_MAX) return lt_error(ctx, LT_ERR_FORMAT, "%s: \"bos_token_id\" is out of range", path);
        cfg->bos_id = (int32_t)id;
    }
    return read_eos(ctx, path, root, cfg);
}

static lt_status check_shape(lt_ctx *ctx, const char *path, const lt_model_config *cfg) {
    LT_TRY(lt_model_config_check_bounds(ctx, path, cfg, NULL));
    if (cfg->V <= 0 || cfg->C <= 0 || cfg->F <= 0 || cfg->L <= 0 || cfg->Hkv <= 0 || cfg->D <= 0 ||
        cfg->H % cfg->Hkv != 0 || cfg->D % 2 != 0 || cfg->V > INT32_MAX)
        return lt_error(ctx, LT_ERR_FORMAT,
                        "%s: inconsistent shape (V=%lld C=%lld F=%lld L=%lld H=%lld Hkv=%lld D=%lld)", path,
                        (long long)cfg->V, (long long)cfg->C, (long long)cfg->F, (long long)cfg->L, (long long)cfg->H,
                        (long long)cfg->Hkv, (long long)cfg->D);
    if (!(cfg->rms_eps > 0) || !(cfg->rope_theta > 0))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: rms_norm_eps and rope_theta must be positive", path);
    return LT_OK;
}

/* A multimodal wrapper (Mistral 3, LLaVA-style) keeps the language model's config in
 * text_config: read that when the top level is not a family longtune knows. */
static const cJSON *text_root(const cJSON *root) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (!cJSON_IsObject(tc)) return root;
    if (cJSON_IsString(mt))
        for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
            if (!strcmp(mt->valuestring, families[f].model_type)) return root;
    return tc;
}

static lt_status parse(lt_ctx *ctx, const char *path, const cJSON *top, lt_model_config *cfg) {
    const cJSON *root = text_root(top);
    const char *where = root == top ? "" : " text_config";
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) return lt_error(ctx, LT_ERR_FORMAT, "%s:%s missing string \"model_type\"", path, where);
    size_t f = 0, nf = sizeof families / sizeof families[0];
    while (f < nf && strcmp(mt->valuestring, families[f].model_type)) f++;
    if (f == nf)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s:%s model_type \"%s\" is not supported (llama, qwen2, qwen3, mistral, phi3, gemma2, "
                        "gemma3_text, gemma3, qwen3_moe, qwen2_moe, mixtral)",
                        path, where, mt->valuestring);
    LT_TRY(read_shape(ctx, path, root, cfg));
    LT_TRY(families[f].read(ctx, path, root, cfg));
    LT_TRY(read_rope(ctx, path, root, cfg));
    LT_TRY(read_token_ids(ctx, path, root, cfg));
    if (root != top && cfg->n_eos == 0) LT_TRY(read_token_ids(ctx, path, top, cfg));
    LT_TRY(check_shape(ctx, path, cfg));
    for (int p = 0; p < LT_PROJ_COUNT_; p++) cfg->proj_dtype[p] = LT_DTYPE_F32;
    cfg->embed_dtype = cfg->head_dtype = LT_DTYPE_F32;
    return LT_OK;
}

/* parse, on the text model's keys (gemma3: text_config with its defaults). */
static lt_status parse_text(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    cJSON *owned;
    lt_status st;
    const cJSON *text = gemma3_text_root(ctx, path, root, &owned, &st);
    if (!text) return st;
    if (text != root) { /* the text model's type picks the family; "gemma3" names the wrapper */
        const cJSON *tmt = cJSON_GetObjectItemCaseSensitive(text, "model_type");
        if (!tmt) cJSON_AddStringToObject(owned, "model_type", "gemma3_text");
        else if (!cJSON_IsString(tmt) || strcmp(tmt->valuestring, "gemma3_text"))
            st = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: text_config.model_type must be \"gemma3_text\"", path);
    }
    if (st == LT_OK) st = parse(ctx, path, text, cfg);
    cJSON_Delete(owned);
    return st;
}

/* The parsed object of a JSON file of at most 1 MiB, or NULL with the error set. */
static cJSON *read_json(lt_ctx *ctx, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(1 << 20); /* transient: config files are a few KB */
    if (!buf) {
        fclose(f);
        lt_error(ctx, LT_ERR_OOM, "%s: read buffer", path);
        return NULL;
    }
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    int big = !feof(f);
    fclose(f);
    if (big) {
        free(buf);
        lt_error(ctx, LT_ERR_FORMAT, "%s: larger than 1 MiB", path);
        return NULL;
    }
    buf[n] = 0;
    int64_t nul = lt_json_nul_line(buf, n);
    if (nul) {
        free(buf);
        lt_error(ctx, LT_ERR_FORMAT, "%s: line %lld: string contains U+0000", path, (long long)nul);
        return NULL;
    }
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        lt_error(ctx, LT_ERR_FORMAT, "%s: not a JSON object", path);
        return NULL;
    }
    return root;
}

/* generation_config.json beside config.json: its eos_token_id (an id or a list) joins the
 * config's list (generation stops at any of them). A missing file is no error. */
static lt_status read_generation_config(lt_ctx *ctx, const char *config_path, lt_model_config *cfg) {
    char gp[4200];
    const char *slash = strrchr(config_path, '/');
    int dlen = slash ? (int)(slash - config_path) : 1;
    snprintf(gp, sizeof gp, "%.*s/generation_config.json", dlen, slash ? config_path : ".");
    FILE *f = fopen(gp, "rb");
    if (!f) return LT_OK;
    fclose(f);
    cJSON *root = read_json(ctx, gp);
    if (!root) return lt_ctx_status(ctx);
    lt_status s = read_eos(ctx, gp, root, cfg);
    cJSON_Delete(root);
    return s;
}

lt_status lt_model_config_read_hf(lt_ctx *ctx, const char *path, lt_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root = read_json(ctx, path);
    if (!root) return lt_ctx_status(ctx);
    lt_status s = parse_text(ctx, path, root, cfg);
    cJSON_Delete(root);
    if (s == LT_OK) s = read_generation_config(ctx, path, cfg);
    return s;
}
