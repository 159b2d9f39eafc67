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

static const struct {
    const char *model_type;
    lt_status (*read)(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg);
} families[] = {{"llama", family_llama}, {"qwen2", family_qwen2}, {"qwen3", family_qwen3}};

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
    if (!(eps > 0 && eps <= LT_MODEL_MAX_RMS_EPS)) /* before the float conversion */
        return lt_error(ctx, LT_ERR_FORMAT, "%s: rms_norm_eps = %g is outside (0, %g]", path, eps,
                        LT_MODEL_MAX_RMS_EPS);
    cfg->rms_eps = (float)eps;
    cfg->tie_embeddings = 0;
    LT_TRY(get_bool(ctx, path, root, "tie_word_embeddings", &cfg->tie_embeddings));
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !(cJSON_IsString(act) && (!strcmp(act->valuestring, "silu") || !strcmp(act->valuestring, "swish"))))
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

static lt_status parse(lt_ctx *ctx, const char *path, const cJSON *root, lt_model_config *cfg) {
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (!cJSON_IsString(mt)) return lt_error(ctx, LT_ERR_FORMAT, "%s: missing string \"model_type\"", path);
    size_t f = 0, nf = sizeof families / sizeof families[0];
    while (f < nf && strcmp(mt->valuestring, families[f].model_type)) f++;
    if (f == nf)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: model_type \"%s\" is not supported (llama, qwen2, qwen3)", path,
                        mt->valuestring);
    LT_TRY(read_shape(ctx, path, root, cfg));
    LT_TRY(families[f].read(ctx, path, root, cfg));
    LT_TRY(read_rope_scaling(ctx, path, root, cfg));
    LT_TRY(read_token_ids(ctx, path, root, cfg));
    LT_TRY(check_shape(ctx, path, cfg));
    for (int p = 0; p < LT_PROJ_COUNT_; p++) cfg->proj_dtype[p] = LT_DTYPE_F32;
    cfg->embed_dtype = cfg->head_dtype = LT_DTYPE_F32;
    return LT_OK;
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
    int64_t nul = lt_json_nul_line(buf, n);
    if (nul) {
        free(buf);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: line %lld: string contains U+0000", path, (long long)nul);
    }
    cJSON *root = cJSON_ParseWithLength(buf, n);
    free(buf);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    lt_status s = parse(ctx, path, root, cfg);
    cJSON_Delete(root);
    return s;
}
