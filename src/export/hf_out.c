/* The HF folder output: config.json (the base's own, or converted from GGUF metadata),
 * model.safetensors or shards of at most max_shard_bytes of tensors with
 * model.safetensors.index.json, the tokenizer files (copied from an HF base; converted from a
 * GGUF base's vocabulary) and generation_config.json. Each file is written to a temporary in the
 * folder, fsynced and renamed; files of an earlier export that would shadow the new one (a
 * single model.safetensors beside a new index, or the reverse, stale shards) are removed. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export/export_internal.h"
#include "export/pipeline.h"
#include "longtune/alloc.h"
#include "train/train_internal.h"

#define EX_DEFAULT_SHARD 5000000000ull

static const char *st_dtype(lt_dtype t) { return t == LT_DTYPE_F32 ? "F32" : t == LT_DTYPE_F16 ? "F16" : "BF16"; }
static const char *torch_dtype(lt_dtype t) {
    return t == LT_DTYPE_F32 ? "float32" : t == LT_DTYPE_F16 ? "float16" : "bfloat16";
}

/* A float32 metadata value as the decimal a config would carry (1e-05, not 9.99999974e-06). */
static double f2d(double v) {
    char b[32];
    snprintf(b, sizeof b, "%.7g", v);
    return strtod(b, NULL);
}

static lt_status write_json(lt_ctx *ctx, const char *dir, const char *file, cJSON *j, lt_export_report *rep) {
    char path[EX_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *text = cJSON_Print(j);
    if (!text) return lt_error(ctx, LT_ERR_OOM, "%s: cannot print", path);
    size_t n = strlen(text);
    lt_status s = lt_ex_write_file(ctx, path, text, n);
    free(text);
    if (s == LT_OK) {
        rep->bytes += n;
        rep->n_files++;
    }
    return s;
}

/* Llama 3 RoPE scaling from a GGUF's rope_freqs.weight: the factors are 1 in the high-frequency
 * band, `factor` in the low one and interpolated between, with low_freq_factor 1 and
 * high_freq_factor 4 in every Llama 3.x; the original context follows from an interpolated
 * entry, else from the band edges. The result is accepted only if it regenerates every factor. */
static int recover_llama3(const float *fr, lt_model_config *c) {
    const double pi = 3.14159265358979323846, low = 1.0, high = 4.0;
    int64_t half = c->D / 2;
    double factor = 1, lo_old = 0, hi_old = INFINITY, old = -1;
    for (int64_t i = 0; i < half; i++) factor = fmax(factor, fr[i]);
    if (!(factor > 1)) return 0;
    for (int64_t i = 0; i < half; i++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->D), wl = 2 * pi / f;
        if (fabs(fr[i] - 1.0) < 1e-6) lo_old = fmax(lo_old, high * wl);
        else if (fabs(fr[i] - factor) < 1e-6 * factor) hi_old = fmin(hi_old, low * wl);
        else if (old < 0) {
            double smooth = (1.0 / fr[i] - 1.0 / factor) / (1.0 - 1.0 / factor);
            old = wl * (smooth * (high - low) + low);
        }
    }
    if (old < 0)
        old = isfinite(hi_old) && lo_old > 0 ? sqrt(lo_old * hi_old) : isfinite(hi_old) ? hi_old / 2 : lo_old * 2;
    lt_model_config t = *c;
    t.rope_factor = factor, t.rope_low_freq = low, t.rope_high_freq = high, t.rope_original_ctx = (int64_t)llround(old);
    if (t.rope_original_ctx < 1) return 0;
    float regen[LT_ROPE_MAX_FACTORS];
    if (half > LT_ROPE_MAX_FACTORS) return 0;
    lt_ex_llama3_rope_factors(&t, regen);
    for (int64_t i = 0; i < half; i++)
        if (fabs(regen[i] - fr[i]) > 1e-5 * fabs(fr[i])) return 0;
    *c = t;
    c->rope_scaling = LT_ROPE_SCALING_LLAMA3;
    return 1;
}

/* config.json's RoPE scaling from cfg: rope_scaling as lt_model_config_rope_json writes
 * it (transformers 4.x reads rope_scaling, 5.x takes it as rope_parameters), null without scaling;
 * any rope_parameters of a copied config removed so no stale one wins. */
static lt_status set_rope(lt_ctx *ctx, cJSON *j, const lt_model_config *c) {
    cJSON_DeleteItemFromObjectCaseSensitive(j, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "rope_parameters");
    if (c->rope_scaling == LT_ROPE_SCALING_NONE) {
        cJSON_AddNullToObject(j, "rope_scaling");
        return LT_OK;
    }
    size_t cap = 16384;
    char *buf = malloc(cap);
    if (!buf) return lt_error(ctx, LT_ERR_OOM, "config.json rope_scaling");
    lt_status s = lt_model_config_rope_json(ctx, c, buf, cap);
    cJSON *rs = s == LT_OK ? cJSON_Parse(buf) : NULL;
    free(buf);
    if (s != LT_OK) return s;
    if (!rs) return lt_error(ctx, LT_ERR_OOM, "config.json rope_scaling");
    cJSON_AddItemToObject(j, "rope_scaling", rs);
    return LT_OK;
}

static lt_status config_from_gguf(lt_ctx *ctx, const lt_ex_base *b, lt_dtype dt, cJSON **out) {
    lt_model_config cfg = b->cfg, *c = &cfg;
    if (b->has_rope_freqs) {
        lt_tensor f;
        if (lt_gguf_find_tensor(ctx, b->gg, "rope_freqs.weight", &f) != LT_OK || f.dtype != LT_DTYPE_F32 ||
            lt_tensor_numel(&f) != c->D / 2 || !recover_llama3(f.data, c))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "%s: rope_freqs.weight is not a Llama 3 RoPE scaling, so it has no config.json form; "
                            "export this base with --format gguf",
                            b->path);
    }
    const char *cls = "LlamaForCausalLM", *type = "llama";
    if (c->arch == LT_ARCH_QWEN2) cls = "Qwen2ForCausalLM", type = "qwen2";
    else if (c->arch == LT_ARCH_QWEN3) cls = "Qwen3ForCausalLM", type = "qwen3";
    else if (c->arch == LT_ARCH_QWEN3_MOE) cls = "Qwen3MoeForCausalLM", type = "qwen3_moe";
    else if (c->arch == LT_ARCH_MIXTRAL) cls = "MixtralForCausalLM", type = "mixtral";
    else if (c->arch == LT_ARCH_QWEN2_MOE) cls = "Qwen2MoeForCausalLM", type = "qwen2_moe";
    cJSON *j = cJSON_CreateObject();
    if (!j) return lt_error(ctx, LT_ERR_OOM, "config.json");
    cJSON *ar = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(ar, cJSON_CreateString(cls));
    cJSON_AddStringToObject(j, "model_type", type);
    cJSON_AddNumberToObject(j, "vocab_size", (double)c->V);
    cJSON_AddNumberToObject(j, "hidden_size", (double)c->C);
    cJSON_AddNumberToObject(j, "intermediate_size", (double)(c->arch == LT_ARCH_MIXTRAL ? c->moe_F : c->F));
    if (c->arch == LT_ARCH_QWEN3_MOE || c->arch == LT_ARCH_QWEN2_MOE) { /* the published configs' spelling */
        cJSON_AddNumberToObject(j, "num_experts", (double)c->n_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", (double)c->n_experts_used);
        cJSON_AddNumberToObject(j, "moe_intermediate_size", (double)c->moe_F);
        cJSON_AddBoolToObject(j, "norm_topk_prob", c->moe_norm_topk);
        cJSON_AddNumberToObject(j, "decoder_sparse_step", (double)(c->moe_every > 1 ? c->moe_every : 1));
        cJSON *dense = cJSON_AddArrayToObject(j, "mlp_only_layers");
        for (int64_t l = 0; l < c->L && l < LT_MODEL_MAX_MIXED_LAYERS; l++)
            if (c->moe_dense[l]) cJSON_AddItemToArray(dense, cJSON_CreateNumber((double)l));
        cJSON_AddFalseToObject(j, "output_router_logits");
        if (c->arch == LT_ARCH_QWEN2_MOE) {
            cJSON_AddNumberToObject(j, "shared_expert_intermediate_size", (double)c->moe_shared_F);
            cJSON_AddBoolToObject(j, "qkv_bias", c->qkv_bias);
        }
    } else if (c->arch == LT_ARCH_MIXTRAL) {
        cJSON_AddNumberToObject(j, "num_local_experts", (double)c->n_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", (double)c->n_experts_used);
        cJSON_AddNullToObject(j, "sliding_window");
        cJSON_AddFalseToObject(j, "output_router_logits");
    }
    cJSON_AddNumberToObject(j, "num_hidden_layers", (double)c->L);
    cJSON_AddNumberToObject(j, "num_attention_heads", (double)c->H);
    cJSON_AddNumberToObject(j, "num_key_value_heads", (double)c->Hkv);
    cJSON_AddNumberToObject(j, "head_dim", (double)c->D);
    cJSON_AddNumberToObject(j, "max_position_embeddings", (double)c->max_positions);
    cJSON_AddNumberToObject(j, "rms_norm_eps", f2d(c->rms_eps));
    cJSON_AddNumberToObject(j, "rope_theta", f2d(c->rope_theta));
    lt_status s = set_rope(ctx, j, c);
    if (s != LT_OK) {
        cJSON_Delete(j);
        return s;
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    if (c->arch != LT_ARCH_QWEN2) {
        cJSON_AddFalseToObject(j, "attention_bias");
    } else {
        cJSON_AddFalseToObject(j, "use_sliding_window");
    }
    if (c->arch == LT_ARCH_LLAMA) cJSON_AddFalseToObject(j, "mlp_bias");
    if (c->arch == LT_ARCH_QWEN3_MOE || c->arch == LT_ARCH_QWEN2_MOE) cJSON_AddFalseToObject(j, "use_sliding_window");
    cJSON_AddNumberToObject(j, "attention_dropout", 0);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", c->bos_id);
    if (c->eos_id >= 0) cJSON_AddNumberToObject(j, "eos_token_id", c->eos_id);
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype(dt));
    cJSON_AddTrueToObject(j, "use_cache");
    *out = j;
    return LT_OK;
}

/* A top-level number the file spelled as a float (0.0, 1e-05) stays one: cJSON would print an
 * integral double as an integer, which transformers' typed configs refuse for float fields
 * (Mixtral's router_jitter_noise). The value's literal in text decides. */
static void keep_float_spelling(cJSON *j, const char *text) {
    for (cJSON *it = j ? j->child : NULL, *next; it; it = next) {
        next = it->next;
        if (!cJSON_IsNumber(it) || !it->string || it->valuedouble != floor(it->valuedouble) ||
            fabs(it->valuedouble) > 1e15)
            continue;
        char key[160];
        int kl = snprintf(key, sizeof key, "\"%s\"", it->string);
        if (kl <= 0 || (size_t)kl >= sizeof key) continue;
        for (const char *p = strstr(text, key); p; p = strstr(p + 1, key)) {
            const char *v = p + kl;
            v += strspn(v, " \t\r\n");
            if (*v != ':') continue;
            v++;
            v += strspn(v, " \t\r\n");
            size_t len = strspn(v, "+-0123456789.eE");
            int is_float = len && (memchr(v, '.', len) || memchr(v, 'e', len) || memchr(v, 'E', len));
            if (is_float) {
                char lit[48];
                snprintf(lit, sizeof lit, "%.1f", it->valuedouble);
                char name[160];
                snprintf(name, sizeof name, "%s", it->string);
                cJSON *raw = cJSON_CreateRaw(lit);
                if (raw) cJSON_ReplaceItemInObjectCaseSensitive(j, name, raw);
            }
            break;
        }
    }
}

static lt_status read_json(lt_ctx *ctx, const char *path, cJSON **out) {
    char *text;
    size_t n;
    LT_TRY(lt_ex_read_file(ctx, path, (size_t)64 << 20, &text, &n));
    *out = cJSON_ParseWithLength(text, n);
    if (*out) keep_float_spelling(*out, text);
    free(text);
    if (!*out) return lt_error(ctx, LT_ERR_FORMAT, "%s: not JSON", path);
    return LT_OK;
}

static lt_status write_config(lt_ctx *ctx, const lt_ex_base *b, lt_dtype dt, const char *dir, lt_export_report *rep) {
    cJSON *j = NULL;
    if (b->gg) LT_TRY(config_from_gguf(ctx, b, dt, &j));
    else {
        char p[EX_PATH_MAX + 32];
        snprintf(p, sizeof p, "%s/config.json", b->dir);
        LT_TRY(read_json(ctx, p, &j));
        cJSON_DeleteItemFromObjectCaseSensitive(j, "torch_dtype");
        cJSON_DeleteItemFromObjectCaseSensitive(j, "quantization_config");
        cJSON_AddStringToObject(j, "torch_dtype", torch_dtype(dt));
        if (b->rope_override) { /* the extended context and its scaling replace the base's */
            cJSON_DeleteItemFromObjectCaseSensitive(j, "max_position_embeddings");
            cJSON_AddNumberToObject(j, "max_position_embeddings", (double)b->cfg.max_positions);
            lt_status s = set_rope(ctx, j, &b->cfg);
            if (s != LT_OK) {
                cJSON_Delete(j);
                return s;
            }
        }
    }
    lt_status s = write_json(ctx, dir, "config.json", j, rep);
    cJSON_Delete(j);
    return s;
}

static lt_status copy_file(lt_ctx *ctx, const char *from_dir, const char *name, const char *to_dir,
                           lt_export_report *rep, int *copied) {
    char src[EX_PATH_MAX + 64], dst[EX_PATH_MAX + 64];
    snprintf(src, sizeof src, "%s/%s", from_dir, name);
    snprintf(dst, sizeof dst, "%s/%s", to_dir, name);
    *copied = 0;
    char *text;
    size_t n;
    lt_status s = lt_ex_read_file(ctx, src, (size_t)256 << 20, &text, &n);
    if (s == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (s != LT_OK) return s;
    s = lt_ex_write_file(ctx, dst, text, n);
    free(text);
    if (s == LT_OK) {
        rep->bytes += n;
        rep->n_files++;
        *copied = 1;
    }
    return s;
}

static lt_status write_tokenizer(lt_ctx *ctx, const lt_ex_base *b, const char *dir, lt_export_report *rep) {
    if (!b->gg) {
        static const char *const files[] = {"tokenizer.json",
                                            "tokenizer_config.json",
                                            "special_tokens_map.json",
                                            "tokenizer.model",
                                            "vocab.json",
                                            "merges.txt",
                                            "added_tokens.json",
                                            "chat_template.jinja",
                                            "chat_template.json",
                                            "generation_config.json"};
        int any = 0, c;
        for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
            LT_TRY(copy_file(ctx, b->dir, files[i], dir, rep, &c));
            if (i < 2) any += c;
        }
        rep->tokenizer_converted = any == 2;
        if (any < 2)
            snprintf(rep->note, sizeof rep->note, "the base folder has no tokenizer.json/tokenizer_config.json");
        return LT_OK;
    }
    char *tj = NULL;
    cJSON *tc = NULL;
    lt_status s = lt_ex_tokenizer_from_gguf(ctx, b, &tj, &tc);
    if (s == LT_ERR_UNSUPPORTED) {
        snprintf(rep->note, sizeof rep->note, "tokenizer not converted: %s", lt_ctx_error(ctx));
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (s != LT_OK) return s;
    char p[EX_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    s = lt_ex_write_file(ctx, p, tj, strlen(tj));
    if (s == LT_OK) {
        rep->bytes += strlen(tj);
        rep->n_files++;
        s = write_json(ctx, dir, "tokenizer_config.json", tc, rep);
    }
    free(tj);
    cJSON_Delete(tc);
    rep->tokenizer_converted = s == LT_OK;
    return s;
}

static lt_status write_generation(lt_ctx *ctx, const lt_ex_base *b, const char *dir, lt_export_report *rep) {
    char p[EX_PATH_MAX + 48];
    snprintf(p, sizeof p, "%s/generation_config.json", dir);
    struct stat sb;
    if (stat(p, &sb) == 0 && !b->gg) return LT_OK; /* copied with the tokenizer files */
    cJSON *j = cJSON_CreateObject();
    if (!j) return lt_error(ctx, LT_ERR_OOM, "generation_config.json");
    cJSON_AddTrueToObject(j, "_from_model_config");
    if (b->cfg.bos_id >= 0) cJSON_AddNumberToObject(j, "bos_token_id", b->cfg.bos_id);
    if (b->cfg.eos_id >= 0) cJSON_AddNumberToObject(j, "eos_token_id", b->cfg.eos_id);
    lt_status s = write_json(ctx, dir, "generation_config.json", j, rep);
    cJSON_Delete(j);
    return s;
}

/* ---- safetensors shards ---- */

typedef struct shard_sink {
    lt_atomic_file af;
} shard_sink;

static lt_status to_file(lt_ctx *ctx, void *arg, const void *data, size_t n) {
    return lt_atomic_write(ctx, &((shard_sink *)arg)->af, data, n);
}

/* Removes files an earlier export left that the new one does not replace but a loader would
 * prefer or list: the single file when sharding, the index when not, and other shards. */
static void remove_stale(const char *dir, int sharded, int n_shards) {
    char p[EX_PATH_MAX + 64];
    snprintf(p, sizeof p, "%s/%s", dir, sharded ? "model.safetensors" : "model.safetensors.index.json");
    unlink(p);
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int a, b;
        char tail[32];
        if (sscanf(e->d_name, "model-%5d-of-%5d.safetensor%31s", &a, &b, tail) == 3 && !strcmp(tail, "s") &&
            (!sharded || b != n_shards)) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
    }
    closedir(d);
}

lt_status lt_ex_write_hf(lt_ctx *ctx, lt_ex_base *b, const lt_ex_adapter *a, const char *out,
                         const lt_export_options *opt, lt_export_report *rep) {
    int64_t np = lt_ex_pieces(b, 0, NULL, 0);
    size_t pbytes =
        (size_t)np * (sizeof(lt_ex_piece) + sizeof(lt_tensor) + sizeof(lt_dtype) + sizeof(int) + sizeof(uint64_t)) + 8;
    lt_ex_piece *ps = lt_alloc(ctx, LT_DEVICE_CPU, pbytes, "export pieces");
    if (!ps) return lt_ctx_status(ctx);
    lt_tensor *ts = (lt_tensor *)(ps + np);
    lt_dtype *dts = (lt_dtype *)(ts + np);
    uint64_t *nb = (uint64_t *)(void *)(((uintptr_t)(dts + np) + 7) & ~(uintptr_t)7);
    int *shard = (int *)(nb + np);
    lt_ex_pieces(b, 0, ps, np);
    lt_ex_rows rows = {0};
    cJSON *index = NULL, **headers = NULL;
    size_t hbytes = 0;
    lt_status s = LT_OK;
    uint64_t max_shard = opt->max_shard_bytes ? opt->max_shard_bytes : EX_DEFAULT_SHARD, total = 0, cur = 0;
    int n_shards = 1;
    lt_dtype main = LT_DTYPE_F32;
    for (int64_t i = 0; i < np; i++) {
        if ((s = lt_ex_find(ctx, b, &ps[i], &ts[i])) != LT_OK) goto done;
        if ((s = lt_ex_pick_dtype(ctx, b, a, &ps[i], &ts[i], opt, &dts[i])) != LT_OK) goto done;
        if (i == 0) main = dts[i];
        int64_t cols = ps[i].ndim == 2 ? ps[i].shape[1] : ps[i].shape[0], nr = ps[i].ndim == 2 ? ps[i].shape[0] : 1;
        nb[i] = (uint64_t)lt_dtype_row_bytes(dts[i], cols) * (uint64_t)nr;
        if (cur > 0 && cur + nb[i] > max_shard) {
            n_shards++;
            cur = 0;
        }
        shard[i] = n_shards - 1;
        cur += nb[i];
        total += nb[i];
    }
    if ((s = lt_ex_check_space(ctx, out, total + (uint64_t)np * 256 + ((uint64_t)64 << 20))) != LT_OK) goto done;
    if ((s = lt_train_mkdir(ctx, out)) != LT_OK) goto done;
    /* Headers, one per shard, in the order tensors are written. */
    hbytes = (size_t)n_shards * sizeof(cJSON *);
    headers = lt_calloc(ctx, LT_DEVICE_CPU, hbytes, "export shard headers");
    if (!headers) {
        s = lt_ctx_status(ctx);
        goto done;
    }
    index = cJSON_CreateObject();
    cJSON *wm = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    cJSON_AddItemToObject(index, "weight_map", wm);
    uint64_t off = 0;
    for (int64_t i = 0; i < np; i++) {
        int sh = shard[i];
        if (!headers[sh]) {
            headers[sh] = cJSON_CreateObject();
            cJSON *m = cJSON_AddObjectToObject(headers[sh], "__metadata__");
            cJSON_AddStringToObject(m, "format", "pt");
            off = 0;
        }
        char name[160], file[64];
        lt_ex_hf_name(b, &ps[i], name, sizeof name);
        cJSON *e = cJSON_AddObjectToObject(headers[sh], name);
        cJSON_AddStringToObject(e, "dtype", st_dtype(dts[i]));
        cJSON *shp = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < ps[i].ndim; d++) cJSON_AddItemToArray(shp, cJSON_CreateNumber((double)ps[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + nb[i])));
        off += nb[i];
        if (n_shards == 1) snprintf(file, sizeof file, "model.safetensors");
        else snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        cJSON_AddStringToObject(wm, name, file);
    }
    if ((s = lt_ex_rows_init(ctx, &rows, b)) != LT_OK) goto done;
    int64_t i = 0;
    for (int sh = 0; sh < n_shards && s == LT_OK; sh++) {
        char path[EX_PATH_MAX + 64];
        if (n_shards == 1) snprintf(path, sizeof path, "%s/model.safetensors", out);
        else snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", out, sh + 1, n_shards);
        char *hj = cJSON_PrintUnformatted(headers[sh]);
        if (!hj) {
            s = lt_error(ctx, LT_ERR_OOM, "%s: header", path);
            break;
        }
        size_t hl = strlen(hj), padded = (hl + 7) / 8 * 8;
        shard_sink sk;
        if ((s = lt_atomic_open(ctx, &sk.af, path)) != LT_OK) {
            free(hj);
            break;
        }
        uint64_t hl64 = padded;
        s = lt_atomic_write(ctx, &sk.af, &hl64, 8);
        if (s == LT_OK) s = lt_atomic_write(ctx, &sk.af, hj, hl);
        if (s == LT_OK) s = lt_atomic_write(ctx, &sk.af, "        ", padded - hl);
        rep->bytes += 8 + padded;
        free(hj);
        for (; s == LT_OK && i < np && shard[i] == sh; i++) {
            s = lt_ex_stream_piece(ctx, b, a, &ps[i], &ts[i], dts[i], 0, &rows, to_file, &sk, rep);
            rep->bytes += nb[i];
        }
        if (s != LT_OK) {
            lt_atomic_abort(&sk.af);
            break;
        }
        if ((s = lt_atomic_commit(ctx, &sk.af)) != LT_OK) break;
        rep->n_files++;
        rep->n_shards++;
    }
    if (s != LT_OK) goto done;
    if (n_shards > 1 && (s = write_json(ctx, out, "model.safetensors.index.json", index, rep)) != LT_OK) goto done;
    remove_stale(out, n_shards > 1, n_shards);
    if ((s = write_config(ctx, b, main, out, rep)) != LT_OK) goto done;
    if ((s = write_tokenizer(ctx, b, out, rep)) != LT_OK) goto done;
    s = write_generation(ctx, b, out, rep);
done:
    lt_ex_rows_free(ctx, &rows);
    if (headers) {
        for (int sh = 0; sh < n_shards; sh++) cJSON_Delete(headers[sh]);
        lt_free(ctx, LT_DEVICE_CPU, headers, hbytes);
    }
    cJSON_Delete(index);
    lt_free(ctx, LT_DEVICE_CPU, ps, pbytes);
    return s;
}
