/* Hugging Face config.json → lt_model_config for the families the one model implements (Llama
 * incl. llama3 rope scaling and SmolLM2, Qwen2, Qwen3): the shape keys every family shares, then
 * the family's own reader, which fills the layer features lt_model_describe_layer expands per
 * layer. Anything it cannot honour exactly (other model types, other rope scalings, sliding
 * windows, non-SiLU activations) is refused with a typed error rather than approximated. Weight
 * dtypes are left to the loaders. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/model_internal.h"

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

/* ---- Gemma 2 and Gemma 3 (text): GeGLU, sandwich norms with (1 + w) weights, sqrt(C) embedding
 * scale, query_pre_attn_scalar, softcaps, alternating sliding and global layers; Gemma 3 adds
 * q/k norms and a second RoPE base for its sliding layers. ---- */

static lt_status gemma_num(lt_ctx *ctx, const char *path, const cJSON *root, const char *key, double lo, double *out) {
    LT_TRY(get_num(ctx, path, root, key, out));
    if (!(*out >= lo)) return lt_error(ctx, LT_ERR_FORMAT, "%s: \"%s\" = %g must be >= %g", path, key, *out, lo);
    return LT_OK;
}

/* One entry of transformers 5's rope_parameters (the object itself for Gemma 2, per layer type for
 * Gemma 3): its base into *theta; any rope_type but "default" is refused. */
static lt_status gemma_rope_entry(lt_ctx *ctx, const char *path, const cJSON *rp, const char *what, double *theta) {
    if (!cJSON_IsObject(rp)) return lt_error(ctx, LT_ERR_FORMAT, "%s: %s must be an object", path, what);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rp, "rope_type");
    if (t && !cJSON_IsNull(t) && !(cJSON_IsString(t) && !strcmp(t->valuestring, "default")))
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
    if (rp && !cJSON_IsNull(rp)) LT_TRY(gemma_rope_entry(ctx, path, rp, "rope_parameters", &cfg->rope_theta));
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
            if (full) LT_TRY(gemma_rope_entry(ctx, path, full, "rope_parameters.full_attention", &cfg->rope_theta));
            if (slide)
                LT_TRY(gemma_rope_entry(ctx, path, slide, "rope_parameters.sliding_attention", &cfg->rope_local_theta));
        } else {
            LT_TRY(gemma_rope_entry(ctx, path, rp, "rope_parameters", &cfg->rope_theta));
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
} families[] = {{"llama", family_llama},
                {"qwen2", family_qwen2},
                {"qwen3", family_qwen3},
                {"gemma2", family_gemma2},
                {"gemma3_text", family_gemma3}};

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
    cfg->rope_theta = 10000.0;
    LT_TRY(get_num(ctx, path, root, "rope_theta", &cfg->rope_theta));
    double eps = 1e-6;
    LT_TRY(get_num(ctx, path, root, "rms_norm_eps", &eps));
    cfg->rms_eps = (float)eps;
    cfg->tie_embeddings = 0;
    LT_TRY(get_bool(ctx, path, root, "tie_word_embeddings", &cfg->tie_embeddings));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    int gemma = cJSON_IsString(mt) && !strncmp(mt->valuestring, "gemma", 5); /* gemma_common reads it */
    if (act && !gemma &&
        !(cJSON_IsString(act) && (!strcmp(act->valuestring, "silu") || !strcmp(act->valuestring, "swish"))))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: hidden_act must be \"silu\"", path);
    return LT_OK;
}

static lt_status read_rope_scaling(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    cfg->rope_llama3 = 0;
    if (!rs || cJSON_IsNull(rs)) return LT_OK;
    if (!cJSON_IsObject(rs)) return lt_error(ctx, LT_ERR_FORMAT, "%s: rope_scaling must be an object", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) return lt_error(ctx, LT_ERR_FORMAT, "%s: rope_scaling.rope_type missing", path);
    if (!strcmp(t->valuestring, "default")) return LT_OK;
    if (strcmp(t->valuestring, "llama3"))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported (llama3)", path,
                        t->valuestring);
    cfg->rope_llama3 = 1;
    cfg->rope_factor = 8.0;
    cfg->rope_low_freq = 1.0;
    cfg->rope_high_freq = 4.0;
    cfg->rope_original_ctx = 8192;
    LT_TRY(get_num(ctx, path, rs, "factor", &cfg->rope_factor));
    LT_TRY(get_num(ctx, path, rs, "low_freq_factor", &cfg->rope_low_freq));
    LT_TRY(get_num(ctx, path, rs, "high_freq_factor", &cfg->rope_high_freq));
    LT_TRY(get_int(ctx, path, rs, "original_max_position_embeddings", 0, &cfg->rope_original_ctx));
    if (cfg->rope_factor <= 0 || cfg->rope_high_freq <= cfg->rope_low_freq || cfg->rope_original_ctx <= 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: inconsistent llama3 rope_scaling", path);
    return LT_OK;
}

static lt_status read_token_ids(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    int64_t id = -1;
    cfg->bos_id = cfg->eos_id = -1;
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(root, "bos_token_id");
    if (cJSON_IsNumber(b)) {
        LT_TRY(get_int(ctx, path, root, "bos_token_id", 0, &id));
        cfg->bos_id = (int32_t)id;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsNumber(e)) {
        LT_TRY(get_int(ctx, path, root, "eos_token_id", 0, &id));
        cfg->eos_id = (int32_t)id;
    } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) > 0 && cJSON_IsNumber(cJSON_GetArrayItem(e, 0))) {
        cfg->eos_id = (int32_t)cJSON_GetArrayItem(e, 0)->valueint;
    }
    return LT_OK;
}

static lt_status check_shape(lt_ctx *ctx, const char *path, const lt_model_config *cfg) {
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

static lt_status parse(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) return lt_error(ctx, LT_ERR_FORMAT, "%s: missing string \"model_type\"", path);
    size_t f = 0, nf = sizeof families / sizeof families[0];
    while (f < nf && strcmp(mt->valuestring, families[f].model_type)) f++;
    if (f == nf)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: model_type \"%s\" is not supported (llama, qwen2, qwen3, gemma2, gemma3_text, gemma3)",
                        path, mt->valuestring);
    LT_TRY(read_shape(ctx, path, root, cfg));
    LT_TRY(families[f].read(ctx, path, root, cfg));
    LT_TRY(read_rope_scaling(ctx, path, root, cfg));
    LT_TRY(read_token_ids(ctx, path, root, cfg));
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

lt_status lt_model_config_read_hf(lt_ctx *ctx, const char *path, lt_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = malloc(1 << 20); /* transient: config.json files are a few KB */
    if (!buf) {
        fclose(f);
        return lt_error(ctx, LT_ERR_OOM, "%s: read buffer", path);
    }
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    int big = !feof(f);
    fclose(f);
    if (big) {
        free(buf);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: larger than 1 MiB", path);
    }
    buf[n] = 0;
    cJSON *root = cJSON_Parse(buf);
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    lt_status s = parse_text(ctx, path, root, cfg);
    cJSON_Delete(root);
    return s;
}
