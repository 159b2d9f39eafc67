/* PEFT adapter export: adapter_config.json + adapter_model.safetensors with PEFT's key names
 * ("base_model.model.<module>.lora_A.weight" (r, in), "...lora_B.weight" (out, r)), so
 * `PeftModel.from_pretrained(base, dir)` loads what longtune trained. LoRA on the experts of
 * mixture-of-experts layers ("...mlp.experts[.base_layer].lora_A|B") is written in PEFT's shapes
 * and element order (A (r·E, in), B (out, r·E), through lt_lora_tensor_peft_index) with the
 * adapted expert parameters as the config's target_parameters. Tensors are written as F32
 * through the safetensors writer, each file atomically. Reading adapters back is peft_load.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/gguf.h"
#include "longtune/safetensors.h"
#include "train/train_internal.h"

#define PEFT_PREFIX "base_model.model."

/* Splits "model.layers.3.self_attn.q_proj.lora_A" into the projection ("q_proj"), the layer (3)
 * and which factor (0 = A, 1 = B). Returns 0 on success. */
static int split_name(const char *name, char *proj, size_t cap, long *layer, int *which) {
    size_t n = strlen(name);
    if (n < 8) return -1;
    if (!strcmp(name + n - 7, ".lora_A")) *which = 0;
    else if (!strcmp(name + n - 7, ".lora_B")) *which = 1;
    else return -1;
    const char *end = name + n - 7, *start = end;
    while (start > name && start[-1] != '.') start--;
    if (start == end || (size_t)(end - start) >= cap) return -1;
    memcpy(proj, start, (size_t)(end - start));
    proj[end - start] = '\0';
    const char *l = strstr(name, "layers.");
    *layer = -1;
    if (l) {
        char *e;
        long v = strtol(l + 7, &e, 10);
        if (e != l + 7 && *e == '.' && v >= 0) *layer = v;
    }
    return 0;
}

static int is_expert_name(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

/* The model's tensor that param i is (the trainer binds them in the model's order; the name
 * decides). */
static lt_status expert_tensor(lt_ctx *ctx, const lt_model *m, const lt_train_param *p, int i, lt_lora_tensor *out) {
    if (!m)
        return lt_error(
            ctx, LT_ERR_INVALID_ARG,
            "adapter tensor '%s' adapts the experts: its PEFT layout needs the model (saved by the trainer)", p->name);
    char want[LT_TRAIN_NAME_MAX + 32];
    snprintf(want, sizeof want, PEFT_PREFIX "%s.weight", p->name);
    int64_t count = lt_model_lora_count(m);
    for (int64_t k = 0; k < count; k++) {
        int64_t j = (i + k) % count;
        LT_TRY(lt_model_lora_tensor(ctx, m, j, out));
        if (!strcmp(out->name, want)) {
            if (out->experts < 1 || out->peft_rows * out->peft_cols != lt_train_param_numel(p))
                return lt_error(ctx, LT_ERR_INVALID_ARG,
                                "adapter tensor '%s': %lld values, the model's expert stack holds (%lld, %lld)",
                                p->name, (long long)lt_train_param_numel(p), (long long)out->peft_rows,
                                (long long)out->peft_cols);
            return LT_OK;
        }
    }
    return lt_error(ctx, LT_ERR_INVALID_ARG, "adapter tensor '%s' is not one of the model's LoRA tensors", p->name);
}

static lt_status check_params(lt_ctx *ctx, const lt_train_options *opt, const lt_train_param *params, int n,
                              const lt_model *m) {
    for (int i = 0; i < n; i++) {
        const lt_train_param *p = &params[i];
        char proj[64];
        long layer;
        int which;
        if (is_expert_name(p->name)) {
            lt_lora_tensor t;
            LT_TRY(expert_tensor(ctx, m, p, i, &t));
            int64_t rE = t.is_b ? t.peft_cols : t.peft_rows;
            if (!p->data || rE != opt->lora_rank * t.experts)
                return lt_error(
                    ctx, LT_ERR_INVALID_ARG,
                    "adapter tensor '%s': PEFT shape (%lld, %lld) disagrees with rank %lld over %lld experts", p->name,
                    (long long)t.peft_rows, (long long)t.peft_cols, (long long)opt->lora_rank, (long long)t.experts);
            continue;
        }
        if (split_name(p->name, proj, sizeof proj, &layer, &which))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "adapter tensor '%s' is not '<module>.lora_A|lora_B'", p->name);
        if (p->ndim != 2 || !p->data || p->shape[0] < 1 || p->shape[1] < 1 || p->shape[which ? 1 : 0] != opt->lora_rank)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "adapter tensor '%s': shape (%lld, %lld) disagrees with rank %lld",
                            p->name, (long long)p->shape[0], (long long)p->shape[1], (long long)opt->lora_rank);
    }
    return LT_OK;
}

size_t lt_peft_export_bytes(int n) {
    return (size_t)(n > 0 ? n : 0) * (sizeof(lt_safetensors_entry) + LT_TRAIN_NAME_MAX + 32);
}

/* With expert stacks the file is streamed: its header first, then each tensor, the stacks
 * reordered into PEFT's order a chunk at a time (no copy of a whole stack). */
static lt_status write_streamed(lt_ctx *ctx, const char *path, const lt_train_param *params, int n, const lt_model *m) {
    cJSON *h = cJSON_CreateObject(), *meta = h ? cJSON_AddObjectToObject(h, "__metadata__") : NULL;
    if (!meta || !cJSON_AddStringToObject(meta, "format", "pt")) {
        cJSON_Delete(h);
        return lt_error(ctx, LT_ERR_OOM, "%s: cannot build the header", path);
    }
    lt_status s = LT_OK;
    uint64_t off = 0;
    for (int i = 0; i < n && s == LT_OK; i++) {
        int64_t d0 = params[i].shape[0], d1 = params[i].ndim > 1 ? params[i].shape[1] : 1;
        if (is_expert_name(params[i].name)) {
            lt_lora_tensor t;
            if ((s = expert_tensor(ctx, m, &params[i], i, &t)) != LT_OK) break;
            d0 = t.peft_rows, d1 = t.peft_cols;
        }
        char key[LT_TRAIN_NAME_MAX + 32];
        snprintf(key, sizeof key, PEFT_PREFIX "%s.weight", params[i].name);
        cJSON *e = cJSON_AddObjectToObject(h, key), *sh = e ? cJSON_AddArrayToObject(e, "shape") : NULL,
              *of = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        uint64_t nb = (uint64_t)(d0 * d1) * sizeof(float);
        if (!of || !cJSON_AddStringToObject(e, "dtype", "F32")) {
            s = lt_error(ctx, LT_ERR_OOM, "%s: cannot build the header", path);
            break;
        }
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)d0));
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)d1));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + nb)));
        off += nb;
    }
    char *hj = s == LT_OK ? cJSON_PrintUnformatted(h) : NULL;
    cJSON_Delete(h);
    if (s != LT_OK) return s;
    if (!hj) return lt_error(ctx, LT_ERR_OOM, "%s: cannot print the header", path);
    size_t hl = strlen(hj), padded = (hl + 7) / 8 * 8;
    uint64_t hl64 = padded;
    lt_atomic_file af;
    if ((s = lt_atomic_open(ctx, &af, path)) != LT_OK) {
        free(hj);
        return s;
    }
    s = lt_atomic_write(ctx, &af, &hl64, 8);
    if (s == LT_OK) s = lt_atomic_write(ctx, &af, hj, hl);
    if (s == LT_OK) s = lt_atomic_write(ctx, &af, "        ", padded - hl);
    free(hj);
    float chunk[1024];
    for (int i = 0; i < n && s == LT_OK; i++) {
        if (!is_expert_name(params[i].name)) {
            s = lt_atomic_write(ctx, &af, params[i].data, (size_t)lt_train_param_numel(&params[i]) * sizeof(float));
            continue;
        }
        lt_lora_tensor t;
        if ((s = expert_tensor(ctx, m, &params[i], i, &t)) != LT_OK) break;
        int64_t ne = t.peft_rows * t.peft_cols;
        for (int64_t j0 = 0; j0 < ne && s == LT_OK; j0 += 1024) {
            int64_t k = ne - j0 < 1024 ? ne - j0 : 1024;
            for (int64_t j = 0; j < k; j++) chunk[j] = params[i].data[lt_lora_tensor_peft_index(&t, j0 + j)];
            s = lt_atomic_write(ctx, &af, chunk, (size_t)k * sizeof(float));
        }
    }
    if (s != LT_OK) {
        lt_atomic_abort(&af);
        return s;
    }
    return lt_atomic_commit(ctx, &af);
}

static lt_status write_safetensors(lt_ctx *ctx, const char *path, const lt_train_param *params, int n,
                                   const lt_model *m) {
    for (int i = 0; i < n; i++)
        if (is_expert_name(params[i].name)) return write_streamed(ctx, path, params, n, m);
    size_t bytes = lt_peft_export_bytes(n);
    lt_safetensors_entry *e = lt_alloc(ctx, LT_DEVICE_CPU, bytes, "adapter export index");
    if (!e) return LT_ERR_OOM;
    char *names = (char *)(e + n);
    for (int i = 0; i < n; i++) {
        char *key = names + (size_t)i * (LT_TRAIN_NAME_MAX + 32);
        snprintf(key, LT_TRAIN_NAME_MAX + 32, PEFT_PREFIX "%s.weight", params[i].name);
        e[i].name = key;
        e[i].tensor = lt_tensor_view(params[i].data, LT_DTYPE_F32, LT_DEVICE_CPU, params[i].ndim, params[i].shape);
    }
    static const char *const meta[] = {"format", "pt"};
    lt_status s = lt_safetensors_write(ctx, path, e, n, meta, 1);
    lt_free(ctx, LT_DEVICE_CPU, e, bytes);
    return s;
}

/* base_model_name_or_path for a GGUF base: transformers cannot load a .gguf path by itself, so
 * the Hugging Face repository the GGUF says it was converted from ("org/name", from
 * general.source.repo_url, general.source.url, general.repo_url or general.url when one points at
 * huggingface.co) when it names one, else the path as given (docs/export.md shows how to load
 * the adapter onto a GGUF base then). */
const char *lt_peft_base_model_name(lt_ctx *ctx, const char *base, char *buf, size_t n) {
    size_t bl = base ? strlen(base) : 0;
    if (bl < 5 || strcmp(base + bl - 5, ".gguf")) return base;
    lt_gguf *g;
    if (lt_gguf_open(ctx, base, &g) != LT_OK) {
        lt_ctx_clear_error(ctx);
        return base;
    }
    static const char *const keys[] = {"general.source.repo_url", "general.source.url", "general.repo_url",
                                       "general.url"};
    const char *found = NULL;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0] && !found; k++) {
        const char *v;
        size_t vl;
        if (lt_gguf_get_str(ctx, g, keys[k], &v, &vl) != LT_OK) continue;
        const char *host = "huggingface.co/";
        size_t hl = strlen(host);
        for (size_t i = 0; i + hl <= vl; i++) {
            if (memcmp(v + i, host, hl)) continue;
            const char *r = v + i + hl, *end = v + vl;
            const char *slash = memchr(r, '/', (size_t)(end - r));
            if (!slash || slash == r) break;
            const char *e = slash + 1;
            while (e < end && *e != '/' && *e != '?' && *e != '#') e++;
            if (e == slash + 1 || (size_t)(e - r) >= n) break;
            memcpy(buf, r, (size_t)(e - r));
            buf[e - r] = '\0';
            found = buf;
            break;
        }
    }
    lt_ctx_clear_error(ctx);
    lt_gguf_close(g);
    return found ? found : base;
}

static lt_status write_config(lt_ctx *ctx, const char *path, const char *base_model, const lt_train_options *opt,
                              const lt_train_param *params, int n, const lt_model *m) {
    cJSON *c = cJSON_CreateObject();
    lt_status s = LT_OK;
    char *json = NULL;
    if (!c) return lt_error(ctx, LT_ERR_OOM, "%s: cannot build the config", path);
    /* Targets in first-seen order and the sorted set of layers, from the tensor names. */
    char targets[16][64];
    int nt = 0;
    long layers[4096];
    int nl = 0;
    unsigned experts = 0; /* LT_LORA_EXPERTS_* adapted */
    for (int i = 0; i < n; i++) {
        char proj[64];
        long layer;
        int which;
        split_name(params[i].name, proj, sizeof proj, &layer, &which);
        if (is_expert_name(params[i].name)) {
            lt_lora_tensor t;
            if ((s = expert_tensor(ctx, m, &params[i], i, &t)) != LT_OK) {
                cJSON_Delete(c);
                return s;
            }
            experts |= t.proj == LT_PROJ_GATE ? LT_LORA_EXPERTS_GATE_UP : LT_LORA_EXPERTS_DOWN;
            continue; /* PEFT's layers_to_transform does not apply to target_parameters */
        }
        int seen = 0;
        for (int t = 0; t < nt; t++) seen |= !strcmp(targets[t], proj);
        if (!seen && nt < 16) snprintf(targets[nt++], 64, "%s", proj);
        int have = layer < 0;
        for (int t = 0; t < nl; t++) have |= layers[t] == layer;
        if (!have && nl < 4096) {
            int at = nl++;
            while (at > 0 && layers[at - 1] > layer) layers[at] = layers[at - 1], at--;
            layers[at] = layer;
        }
    }
    cJSON *tm = cJSON_CreateArray(), *lt = cJSON_CreateArray(), *tp = experts ? cJSON_CreateArray() : NULL;
    if (!tm || !lt || (experts && !tp)) {
        cJSON_Delete(tm);
        cJSON_Delete(lt);
        cJSON_Delete(tp);
        goto oom;
    }
    /* PEFT nests the first listed parameter innermost: gate_up first names it ".base_layer". */
    if (experts & LT_LORA_EXPERTS_GATE_UP) cJSON_AddItemToArray(tp, cJSON_CreateString("mlp.experts.gate_up_proj"));
    if (experts & LT_LORA_EXPERTS_DOWN) cJSON_AddItemToArray(tp, cJSON_CreateString("mlp.experts.down_proj"));
    for (int t = 0; t < nt; t++) cJSON_AddItemToArray(tm, cJSON_CreateString(targets[t]));
    for (int t = 0; t < nl; t++) cJSON_AddItemToArray(lt, cJSON_CreateNumber((double)layers[t]));
    cJSON_AddItemToObject(c, "alpha_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(c, "auto_mapping");
    cJSON_AddStringToObject(c, "base_model_name_or_path", base_model ? base_model : "");
    cJSON_AddStringToObject(c, "bias", "none");
    cJSON_AddFalseToObject(c, "fan_in_fan_out");
    cJSON_AddTrueToObject(c, "inference_mode");
    cJSON_AddTrueToObject(c, "init_lora_weights");
    cJSON_AddNullToObject(c, "layers_pattern");
    if (nl) cJSON_AddItemToObject(c, "layers_to_transform", lt);
    else {
        cJSON_Delete(lt);
        cJSON_AddNullToObject(c, "layers_to_transform");
    }
    cJSON_AddNumberToObject(c, "lora_alpha", opt->lora_alpha);
    /* PEFT refuses dropout on target_parameters (it cannot be factored out of B·A·x there), and
     * dropout plays no part in inference: an adapter with expert stacks records 0. */
    cJSON_AddNumberToObject(c, "lora_dropout", experts ? 0.0 : opt->lora_dropout);
    cJSON_AddNullToObject(c, "modules_to_save");
    cJSON_AddStringToObject(c, "peft_type", "LORA");
    cJSON_AddNumberToObject(c, "r", (double)opt->lora_rank);
    cJSON_AddItemToObject(c, "rank_pattern", cJSON_CreateObject());
    cJSON_AddNullToObject(c, "revision");
    cJSON_AddItemToObject(c, "target_modules", tm);
    if (tp) cJSON_AddItemToObject(c, "target_parameters", tp);
    cJSON_AddStringToObject(c, "task_type", "CAUSAL_LM");
    cJSON_AddFalseToObject(c, "use_dora");
    cJSON_AddFalseToObject(c, "use_rslora");
    json = cJSON_Print(c);
    if (!json) goto oom;
    lt_atomic_file af;
    if ((s = lt_atomic_open(ctx, &af, path)) != LT_OK) goto done;
    s = lt_atomic_write(ctx, &af, json, strlen(json));
    if (s == LT_OK) s = lt_atomic_write(ctx, &af, "\n", 1);
    if (s != LT_OK) {
        lt_atomic_abort(&af);
        goto done;
    }
    s = lt_atomic_commit(ctx, &af);
    goto done;
oom:
    s = lt_error(ctx, LT_ERR_OOM, "%s: cannot build the config", path);
done:
    free(json);
    cJSON_Delete(c);
    return s;
}

lt_status lt_peft_save(lt_ctx *ctx, const char *dir, const char *base_model, const lt_train_options *opt,
                       const lt_train_param *params, int n_params) {
    char repo[256];
    return lt_peft_save_named(ctx, dir, lt_peft_base_model_name(ctx, base_model, repo, sizeof repo), opt, params,
                              n_params, NULL);
}

lt_status lt_peft_save_named(lt_ctx *ctx, const char *dir, const char *base_model, const lt_train_options *opt,
                             const lt_train_param *params, int n_params, const lt_model *m) {
    if (n_params < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "adapter export: no LoRA tensors");
    LT_TRY(check_params(ctx, opt, params, n_params, m));
    LT_TRY(lt_train_mkdir(ctx, dir));
    char path[LT_TRAIN_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    LT_TRY(write_safetensors(ctx, path, params, n_params, m));
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    return write_config(ctx, path, base_model, opt, params, n_params, m);
}
