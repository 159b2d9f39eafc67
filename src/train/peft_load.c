/* PEFT adapter import for inference and inspection: adapter_config.json → the model's LoRA options,
 * adapter_model.safetensors → the model's LoRA tensors (F32/BF16/F16 converted to f32). Only plain
 * LoRA on the last K layers is accepted; DoRA, rsLoRA and arbitrary layer sets are refused.
 * target_parameters "mlp.experts.gate_up_proj" / "mlp.experts.down_proj" (PEFT's LoRA on the
 * fused expert stacks of mixture-of-experts layers) become LT_LORA_EXPERTS_*; their tensors come
 * in PEFT's shapes (A (r·E, in), B (out, r·E)) and are reordered into the model's storage through
 * lt_lora_tensor_peft_index. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/safetensors.h"
#include "train/train_internal.h"

static lt_status read_text(lt_ctx *ctx, const char *path, char **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, LT_ERR_IO, "%s: cannot open", path);
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || size > (1L << 22)) {
        fclose(f);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: unreadable or larger than 4 MiB", path);
    }
    rewind(f);
    char *b = malloc((size_t)size + 1); /* transient parse buffer */
    if (!b) {
        fclose(f);
        return lt_error(ctx, LT_ERR_OOM, "%s: cannot buffer", path);
    }
    size_t got = fread(b, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(b);
        return lt_error(ctx, LT_ERR_IO, "%s: short read", path);
    }
    b[size] = '\0';
    *out = b;
    *n = (size_t)size;
    return LT_OK;
}

lt_status lt_peft_read_config(lt_ctx *ctx, const char *dir, int64_t L, lt_lora_options *out) {
    char path[LT_TRAIN_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *text = NULL;
    size_t n = 0;
    LT_TRY(read_text(ctx, path, &text, &n));
    cJSON *c = cJSON_ParseWithLength(text, n);
    free(text);
    if (!c || !cJSON_IsObject(c)) {
        cJSON_Delete(c);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    lt_status s = LT_OK;
    memset(out, 0, sizeof *out);
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(c, "peft_type");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(c, "r");
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(c, "lora_alpha");
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(c, "target_modules");
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(c, "layers_to_transform");
    const cJSON *e;
    if (!cJSON_IsString(pt) || strcmp(pt->valuestring, "LORA")) {
        s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: peft_type is not \"LORA\"", path);
        goto done;
    }
    if (!cJSON_IsNumber(r) || r->valuedouble < 1 || r->valuedouble > 4096 || r->valuedouble != floor(r->valuedouble)) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: key 'r' must be an integer in [1, 4096]", path);
        goto done;
    }
    if (!cJSON_IsNumber(alpha) || !(alpha->valuedouble > 0)) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: key 'lora_alpha' must be a positive number", path);
        goto done;
    }
    if (cJSON_GetObjectItemCaseSensitive(c, "use_dora") &&
        cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "use_dora"))) {
        s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: DoRA adapters are not supported", path);
        goto done;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "use_rslora"))) {
        s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: rsLoRA scaling is not supported", path);
        goto done;
    }
    out->rank = (int64_t)r->valuedouble;
    out->alpha = (float)alpha->valuedouble;
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(c, "target_parameters");
    if (tp && !cJSON_IsNull(tp)) {
        if (!cJSON_IsArray(tp)) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: key 'target_parameters' must be a list", path);
            goto done;
        }
        cJSON_ArrayForEach(e, tp) {
            const char *v = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(v, "mlp.experts.gate_up_proj") || !strcmp(v, "experts.gate_up_proj"))
                out->targets |= LT_LORA_EXPERTS_GATE_UP;
            else if (!strcmp(v, "mlp.experts.down_proj") || !strcmp(v, "experts.down_proj"))
                out->targets |= LT_LORA_EXPERTS_DOWN;
            else {
                s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                             "%s: target parameter %s is not one longtune adapts (mlp.experts.gate_up_proj, "
                             "mlp.experts.down_proj)",
                             path, cJSON_IsString(e) ? e->valuestring : "(not a string)");
                goto done;
            }
        }
    }
    if (!cJSON_IsArray(tm) || cJSON_GetArraySize(tm) < 1) {
        if (out->targets && cJSON_IsArray(tm))
            s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                         "%s: LoRA on the experts alone (empty target_modules) has no longtune form; the model's "
                         "LoRA always includes projections",
                         path);
        else s = lt_error(ctx, LT_ERR_FORMAT, "%s: key 'target_modules' must be a non-empty list", path);
        goto done;
    }
    cJSON_ArrayForEach(e, tm) {
        int found = 0;
        for (int k = 0; cJSON_IsString(e) && k < LT_PROJ_COUNT_; k++)
            if (!strcmp(e->valuestring, lt_proj_name((lt_proj)k))) out->targets |= 1u << k, found = 1;
        if (!found) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: target module %s is not a supported projection", path,
                         cJSON_IsString(e) ? e->valuestring : "(not a string)");
            goto done;
        }
    }
    if (lt && !cJSON_IsNull(lt)) {
        /* The model puts LoRA on the last K layers: the list must be exactly that tail. */
        int64_t k = cJSON_GetArraySize(lt), i = 0;
        if (!cJSON_IsArray(lt) || k < 1 || k > L) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: key 'layers_to_transform' must list 1..%lld layers", path,
                         (long long)L);
            goto done;
        }
        cJSON_ArrayForEach(e, lt) {
            if (!cJSON_IsNumber(e) || e->valuedouble != (double)(L - k + i)) {
                s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                             "%s: layers_to_transform must be the last %lld layers of %lld in order", path,
                             (long long)k, (long long)L);
                goto done;
            }
            i++;
        }
        out->num_layers = k;
    }
done:
    cJSON_Delete(c);
    return s;
}

lt_status lt_peft_load(lt_ctx *ctx, const char *dir, lt_model *m) {
    char path[LT_TRAIN_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    lt_safetensors *st = NULL;
    LT_TRY(lt_safetensors_open(ctx, path, &st));
    lt_status s = LT_OK;
    float *row = NULL;
    size_t row_bytes = 0;
    int64_t count = lt_model_lora_count(m), n_experts = 0;
    for (int64_t i = 0; i < count && s == LT_OK; i++) {
        lt_lora_tensor lt;
        if ((s = lt_model_lora_tensor(ctx, m, i, &lt)) == LT_OK && lt.experts > 0) n_experts++;
    }
    if (s != LT_OK) goto done;
    for (int64_t i = 0; i < lt_safetensors_count(st) && !n_experts; i++) {
        const char *name = lt_safetensors_name(st, i);
        if (strstr(name, ".mlp.experts.") && strstr(name, ".lora_")) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                         "%s: tensor %s adapts the experts of a mixture-of-experts layer, which this model's LoRA "
                         "does not have (no MoE layers, or no expert targets)",
                         path, name);
            goto done;
        }
    }
    /* A tensor the model's LoRA has no place for, named (e.g. PEFT's expert adapters on layers
       outside layers_to_transform, which PEFT does not apply to target_parameters). */
    for (int64_t i = 0; i < lt_safetensors_count(st) && s == LT_OK; i++) {
        const char *name = lt_safetensors_name(st, i);
        int found = 0;
        for (int64_t j = 0; j < count && !found && s == LT_OK; j++) {
            lt_lora_tensor lt;
            if ((s = lt_model_lora_tensor(ctx, m, (i + j) % count, &lt)) == LT_OK) found = !strcmp(lt.name, name);
        }
        if (s == LT_OK && !found)
            s = lt_error(ctx, LT_ERR_FORMAT,
                         "%s: tensor %s is not one of the model's LoRA tensors (its targets and LoRA layers, from "
                         "adapter_config.json; longtune puts every target on the same last layers)",
                         path, name);
    }
    if (s != LT_OK) goto done;
    if (lt_safetensors_count(st) != count) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: %lld tensors, the model's LoRA layout has %lld", path,
                     (long long)lt_safetensors_count(st), (long long)count);
        goto done;
    }
    for (int64_t i = 0; i < count && s == LT_OK; i++) {
        lt_lora_tensor lt;
        lt_tensor src;
        if ((s = lt_model_lora_tensor(ctx, m, i, &lt)) != LT_OK) break;
        if ((s = lt_safetensors_find(ctx, st, lt.name, &src)) != LT_OK) {
            s = lt_error(ctx, LT_ERR_NOT_FOUND, "%s: tensor %s is missing", path, lt.name);
            break;
        }
        int64_t want0 = lt.experts ? lt.peft_rows : lt.value.shape[0],
                want1 = lt.experts ? lt.peft_cols : lt.value.shape[1];
        if (src.ndim != 2 || src.shape[0] != want0 || src.shape[1] != want1) {
            s = lt_error(ctx, LT_ERR_SHAPE, "%s: tensor %s is (%lld, %lld), the model needs (%lld, %lld)", path,
                         lt.name, (long long)src.shape[0], (long long)(src.ndim > 1 ? src.shape[1] : 1),
                         (long long)want0, (long long)want1);
            break;
        }
        if (src.dtype != LT_DTYPE_F32 && src.dtype != LT_DTYPE_BF16 && src.dtype != LT_DTYPE_F16) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor %s is %s (f32, bf16 or f16 expected)", path, lt.name,
                         lt_dtype_name(src.dtype));
            break;
        }
        /* Converted on the host, then copied into the model (wherever it lives) in one call. */
        int64_t n = lt_tensor_numel(&lt.value);
        if ((size_t)(2 * n) * sizeof(float) > row_bytes) {
            if (row) lt_free(ctx, LT_DEVICE_CPU, row, row_bytes);
            row_bytes = (size_t)(2 * n) * sizeof(float);
            if (!(row = lt_alloc(ctx, LT_DEVICE_CPU, row_bytes, "adapter tensor"))) {
                row_bytes = 0;
                s = lt_ctx_status(ctx);
                break;
            }
        }
        for (int64_t j = 0; j < n; j++) {
            if (src.dtype == LT_DTYPE_F32) row[j] = ((const float *)src.data)[j];
            else if (src.dtype == LT_DTYPE_BF16) row[j] = lt_bf16_to_f32(((const uint16_t *)src.data)[j]);
            else row[j] = lt_f16_to_f32(((const uint16_t *)src.data)[j]);
        }
        /* A diverged adapter would only turn every logit into NaN. */
        for (int64_t j = 0; j < n; j++)
            if (!isfinite(row[j])) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor %s: element %lld is %s (not finite)", path, lt.name,
                             (long long)j,
                             isnan(row[j])    ? "nan"
                                 : row[j] > 0 ? "inf"
                                              : "-inf");
                goto done;
            }
        if (lt.experts) { /* PEFT's order → the storage's */
            float *st_order = row + n;
            for (int64_t j = 0; j < n; j++) st_order[lt_lora_tensor_peft_index(&lt, j)] = row[j];
            s = lt_model_lora_set(ctx, m, lt.offset, n, st_order);
        } else {
            s = lt_model_lora_set(ctx, m, lt.offset, n, row);
        }
    }
done:
    if (row) lt_free(ctx, LT_DEVICE_CPU, row, row_bytes);
    lt_safetensors_close(ctx, st);
    return s;
}
