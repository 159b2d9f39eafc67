/* The adapter of an export, read into host f32 and checked against the base: a PEFT folder
 * (adapter_config.json + adapter_model.safetensors, as longtune or PEFT writes it) or a longtune
 * training checkpoint (checkpoint.ltck, or the folder holding it; its checksum is verified and
 * its LoRA rank and alpha come from the run options it records). Every tensor's shape is checked
 * against the projection it targets; a mismatch names the tensor and both shapes. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export/export_internal.h"
#include "longtune/alloc.h"
#include "longtune/train.h"
#include "train/train_internal.h"

static void proj_shape(const lt_model_config *c, int k, int64_t *o, int64_t *i) {
    if (k == LT_PROJ_Q) *o = c->H * c->D, *i = c->C;
    else if (k == LT_PROJ_K || k == LT_PROJ_V) *o = c->Hkv * c->D, *i = c->C;
    else if (k == LT_PROJ_O) *o = c->C, *i = c->H * c->D;
    else if (k == LT_PROJ_DOWN) *o = c->C, *i = c->F;
    else *o = c->F, *i = c->C;
}

/* "…layers.<l>.<self_attn|mlp>.<proj>.lora_A" → layer, projection, factor; 0 on success. */
static int parse_name(const char *name, int64_t *layer, int *proj, int *is_b) {
    const char *l = strstr(name, "layers.");
    if (!l) return -1;
    char *e;
    long v = strtol(l + 7, &e, 10);
    if (e == l + 7 || *e != '.' || v < 0) return -1;
    *layer = v;
    for (int k = 0; k < LT_PROJ_COUNT_; k++) {
        char pat[48];
        snprintf(pat, sizeof pat, ".%s.lora_", lt_proj_name((lt_proj)k));
        const char *m = strstr(e, pat);
        if (!m) continue;
        char f = m[strlen(pat)];
        if (f != 'A' && f != 'B') return -1;
        *proj = k;
        *is_b = f == 'B';
        return 0;
    }
    return -1;
}

static lt_status alloc_adapter(lt_ctx *ctx, const lt_ex_base *b, lt_ex_adapter *a) {
    const lt_model_config *c = &b->cfg;
    a->L = c->L;
    a->ptr_bytes = (size_t)c->L * LT_PROJ_COUNT_ * sizeof(float *);
    a->a = lt_calloc(ctx, LT_DEVICE_CPU, 2 * a->ptr_bytes, "export adapter index");
    if (!a->a) return lt_ctx_status(ctx);
    a->b = a->a + c->L * LT_PROJ_COUNT_;
    size_t floats = 0;
    for (int64_t l = a->l0; l < c->L; l++)
        for (int k = 0; k < LT_PROJ_COUNT_; k++)
            if ((a->targets >> k) & 1u) {
                int64_t o, i;
                proj_shape(c, k, &o, &i);
                floats += (size_t)(a->rank * (o + i));
            }
    a->data_bytes = floats * sizeof(float);
    a->data = lt_alloc(ctx, LT_DEVICE_CPU, a->data_bytes ? a->data_bytes : 1, "export adapter");
    if (!a->data) return lt_ctx_status(ctx);
    float *p = a->data;
    for (int64_t l = a->l0; l < c->L; l++)
        for (int k = 0; k < LT_PROJ_COUNT_; k++)
            if ((a->targets >> k) & 1u) {
                int64_t o, i;
                proj_shape(c, k, &o, &i);
                a->a[l * LT_PROJ_COUNT_ + k] = p;
                p += a->rank * i;
                a->b[l * LT_PROJ_COUNT_ + k] = p;
                p += a->rank * o;
            }
    return LT_OK;
}

/* Checks one tensor (layer, proj, factor) of shape (d0, d1) against the base and returns where
 * its values go. */
static lt_status slot(lt_ctx *ctx, const char *file, const char *name, const lt_ex_base *b, const lt_ex_adapter *a,
                      int64_t l, int k, int is_b, int64_t d0, int64_t d1, float **dst) {
    const lt_model_config *c = &b->cfg;
    if (l >= c->L)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' is for layer %lld, the base has %lld layers", file, name,
                        (long long)l, (long long)c->L);
    if (!((a->targets >> k) & 1u) || l < a->l0)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' is outside the adapter's targets (%s, layers %lld..%lld)",
                        file, name, lt_proj_name((lt_proj)k), (long long)a->l0, (long long)(c->L - 1));
    int64_t o, i;
    proj_shape(c, k, &o, &i);
    int64_t w0 = is_b ? o : a->rank, w1 = is_b ? a->rank : i;
    if (d0 != w0 || d1 != w1)
        return lt_error(ctx, LT_ERR_SHAPE,
                        "%s: tensor '%s' is (%lld, %lld) but the base's %s (%lld, %lld) with rank %lld needs "
                        "(%lld, %lld): the adapter does not match this base",
                        file, name, (long long)d0, (long long)d1, lt_proj_name((lt_proj)k), (long long)o, (long long)i,
                        (long long)a->rank, (long long)w0, (long long)w1);
    *dst = is_b ? a->b[l * LT_PROJ_COUNT_ + k] : a->a[l * LT_PROJ_COUNT_ + k];
    return LT_OK;
}

static lt_status read_peft(lt_ctx *ctx, const char *dir, const lt_ex_base *b, lt_ex_adapter *a) {
    lt_lora_options lo;
    LT_TRY(lt_peft_read_config(ctx, dir, b->cfg.L, &lo));
    a->rank = lo.rank;
    a->alpha = lo.alpha;
    a->targets = lo.targets;
    a->l0 = lo.num_layers ? b->cfg.L - lo.num_layers : 0;
    char cfgp[EX_PATH_MAX + 32];
    snprintf(cfgp, sizeof cfgp, "%s/adapter_config.json", dir);
    char *text = NULL;
    size_t n = 0;
    if (lt_ex_read_file(ctx, cfgp, 1u << 22, &text, &n) == LT_OK) {
        cJSON *j = cJSON_ParseWithLength(text, n);
        const cJSON *bm = cJSON_GetObjectItemCaseSensitive(j, "base_model_name_or_path");
        if (cJSON_IsString(bm)) snprintf(a->base_model, sizeof a->base_model, "%s", bm->valuestring);
        cJSON_Delete(j);
        free(text);
    }
    LT_TRY(alloc_adapter(ctx, b, a));
    char path[EX_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    lt_safetensors *st;
    LT_TRY(lt_safetensors_open(ctx, path, &st));
    lt_status s = LT_OK;
    int64_t want = 0;
    for (int64_t l = a->l0; l < b->cfg.L; l++)
        for (int k = 0; k < LT_PROJ_COUNT_; k++) want += 2 * ((a->targets >> k) & 1u);
    int64_t count = lt_safetensors_count(st);
    for (int64_t t = 0; t < count && s == LT_OK; t++) {
        const char *name = lt_safetensors_name(st, t);
        int64_t l;
        int k, is_b;
        if (parse_name(name, &l, &k, &is_b)) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s' is not a LoRA factor of a supported projection",
                         path, name);
            break;
        }
        lt_tensor v;
        if ((s = lt_safetensors_find(ctx, st, name, &v)) != LT_OK) break;
        if (v.ndim != 2) {
            s = lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' has %d dims, not 2", path, name, v.ndim);
            break;
        }
        float *dst;
        if ((s = slot(ctx, path, name, b, a, l, k, is_b, v.shape[0], v.shape[1], &dst)) != LT_OK) break;
        int64_t ne = v.shape[0] * v.shape[1];
        for (int64_t j = 0; j < ne; j++) {
            float x = v.dtype == LT_DTYPE_F32 ? ((const float *)v.data)[j]
                : v.dtype == LT_DTYPE_BF16    ? lt_bf16_to_f32(((const uint16_t *)v.data)[j])
                                              : lt_f16_to_f32(((const uint16_t *)v.data)[j]);
            if (!isfinite(x)) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s' element %lld is not finite", path, name,
                             (long long)j);
                break;
            }
            dst[j] = x;
        }
    }
    if (s == LT_OK && count != want)
        s = lt_error(ctx, LT_ERR_SHAPE, "%s: %lld LoRA tensors, adapter_config.json's targets and layers need %lld",
                     path, (long long)count, (long long)want);
    lt_safetensors_close(ctx, st);
    return s;
}

/* ---- checkpoint.ltck (format: src/train/checkpoint.c) ---- */

typedef struct {
    const uint8_t *p;
    size_t n, at;
    const char *path;
} cursor;

static lt_status take(lt_ctx *ctx, cursor *c, void *out, size_t n, const char *what) {
    if (n > c->n - c->at)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: truncated checkpoint: %s at byte %zu", c->path, what, c->at);
    if (out) memcpy(out, c->p + c->at, n);
    c->at += n;
    return LT_OK;
}

static int option(const char *text, const char *key, char *val, size_t n) {
    size_t kl = strlen(key);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (!strncmp(l, key, kl) && l[kl] == '=') {
            const char *e = strchr(l, '\n');
            size_t vl = e ? (size_t)(e - l - (long)kl - 1) : strlen(l + kl + 1);
            if (vl >= n) return 0;
            memcpy(val, l + kl + 1, vl);
            val[vl] = 0;
            return 1;
        }
    }
    return 0;
}

static lt_status parse_ckpt(lt_ctx *ctx, cursor *c, const lt_ex_base *b, lt_ex_adapter *a) {
    if (c->n < 16 || memcmp(c->p, "LTCKPT01", 8))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a longtune checkpoint (bad magic)", c->path);
    uint64_t want, got = lt_fnv64(LT_FNV64_INIT, c->p, c->n - 8);
    memcpy(&want, c->p + c->n - 8, 8);
    if (want != got) return lt_error(ctx, LT_ERR_FORMAT, "%s: checksum mismatch (truncated or corrupted)", c->path);
    c->n -= 8;
    uint32_t version = 0, np = 0, tn = 0;
    LT_TRY(take(ctx, c, NULL, 8, "magic"));
    LT_TRY(take(ctx, c, &version, 4, "version"));
    if (version != 1)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: checkpoint version %u (this build reads 1)", c->path, version);
    LT_TRY(take(ctx, c, &np, 4, "tensor count"));
    LT_TRY(take(ctx, c, NULL, 8 + 32 + 8 + 8 + 8 + 8, "state"));
    LT_TRY(take(ctx, c, &tn, 4, "options length"));
    char text[2048], v[64];
    if (tn >= sizeof text) return lt_error(ctx, LT_ERR_FORMAT, "%s: options block of %u bytes", c->path, tn);
    LT_TRY(take(ctx, c, text, tn, "options"));
    text[tn] = 0;
    char *e;
    if (!option(text, "lora_rank", v, sizeof v) || (a->rank = strtoll(v, &e, 10)) < 1 || *e)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: checkpoint options lack a valid lora_rank", c->path);
    double alpha;
    if (!option(text, "lora_alpha", v, sizeof v) || !((alpha = strtod(v, &e)) > 0) || *e)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: checkpoint options lack a valid lora_alpha", c->path);
    a->alpha = (float)alpha;
    /* Targets and layers come from the tensor names; a first pass finds them. */
    size_t params_at = c->at;
    int64_t lmin = b->cfg.L;
    for (int pass = 0; pass < 2; pass++) {
        c->at = params_at;
        for (uint32_t i = 0; i < np; i++) {
            uint32_t nl, nd;
            char name[LT_TRAIN_NAME_MAX];
            LT_TRY(take(ctx, c, &nl, 4, "name length"));
            if (nl == 0 || nl >= sizeof name)
                return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor %u: name length %u", c->path, i, nl);
            LT_TRY(take(ctx, c, name, nl, "name"));
            name[nl] = 0;
            LT_TRY(take(ctx, c, &nd, 4, "ndim"));
            if (nd != 2) return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s' has %u dims", c->path, name, nd);
            int64_t sh[2];
            LT_TRY(take(ctx, c, sh, 16, "shape"));
            if (sh[0] < 1 || sh[1] < 1 || sh[0] > (1 << 24) || sh[1] > (1 << 24))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s': bad shape", c->path, name);
            int64_t l;
            int k, is_b;
            if (parse_name(name, &l, &k, &is_b))
                return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s' is not a LoRA factor", c->path, name);
            size_t bytes = (size_t)(sh[0] * sh[1]) * sizeof(float);
            if (pass == 0) {
                a->targets |= 1u << k;
                if (l < lmin) lmin = l;
            } else {
                float *dst;
                LT_TRY(slot(ctx, c->path, name, b, a, l, k, is_b, sh[0], sh[1], &dst));
                memcpy(dst, c->p + c->at, bytes < c->n - c->at ? bytes : 0);
            }
            LT_TRY(take(ctx, c, NULL, bytes, name));
            LT_TRY(take(ctx, c, NULL, 2 * bytes, "optimizer moments"));
        }
        if (pass == 0) {
            if (!a->targets || lmin >= b->cfg.L)
                return lt_error(ctx, LT_ERR_SHAPE, "%s: no LoRA tensors for a base of %lld layers", c->path,
                                (long long)b->cfg.L);
            a->l0 = lmin;
            LT_TRY(alloc_adapter(ctx, b, a));
        }
    }
    int64_t want_n = 0;
    for (int k = 0; k < LT_PROJ_COUNT_; k++) want_n += 2 * ((a->targets >> k) & 1u);
    want_n *= b->cfg.L - a->l0;
    if ((int64_t)np != want_n)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: %u LoRA tensors, its targets over layers %lld.. need %lld", c->path, np,
                        (long long)a->l0, (long long)want_n);
    return LT_OK;
}

static lt_status read_ckpt(lt_ctx *ctx, const char *path, const lt_ex_base *b, lt_ex_adapter *a) {
    char *buf = NULL;
    size_t n = 0;
    LT_TRY(lt_ex_read_file(ctx, path, (size_t)1 << 40, &buf, &n));
    cursor c = {(const uint8_t *)buf, n, 0, path};
    lt_status s = parse_ckpt(ctx, &c, b, a);
    free(buf);
    return s;
}

lt_status lt_ex_adapter_read(lt_ctx *ctx, const char *path, const lt_ex_base *b, lt_ex_adapter *a) {
    memset(a, 0, sizeof *a);
    struct stat sb;
    if (stat(path, &sb) != 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no such adapter file or folder", path);
    lt_status s;
    if (S_ISDIR(sb.st_mode)) {
        char p[EX_PATH_MAX + 64];
        snprintf(p, sizeof p, "%s/adapter_model.safetensors", path);
        if (stat(p, &sb) == 0) s = read_peft(ctx, path, b, a);
        else {
            snprintf(p, sizeof p, "%s/" LT_TRAIN_CHECKPOINT_FILE, path);
            if (stat(p, &sb) != 0)
                return lt_error(ctx, LT_ERR_NOT_FOUND,
                                "%s: neither adapter_model.safetensors nor " LT_TRAIN_CHECKPOINT_FILE " is there",
                                path);
            s = read_ckpt(ctx, p, b, a);
        }
    } else {
        s = read_ckpt(ctx, path, b, a);
    }
    if (s != LT_OK) {
        lt_ex_adapter_free(ctx, a);
        return s;
    }
    a->scale = a->alpha / (float)a->rank;
    return LT_OK;
}

void lt_ex_adapter_free(lt_ctx *ctx, lt_ex_adapter *a) {
    if (a->a) lt_free(ctx, LT_DEVICE_CPU, a->a, 2 * a->ptr_bytes);
    if (a->data) lt_free(ctx, LT_DEVICE_CPU, a->data, a->data_bytes ? a->data_bytes : 1);
    a->a = a->b = NULL;
    a->data = NULL;
}

int lt_ex_adapter_has(const lt_ex_adapter *a, int64_t l, int k) {
    return a && a->a && l >= 0 && l < a->L && a->a[l * LT_PROJ_COUNT_ + k] != NULL;
}

void lt_ex_adapter_add_row(const lt_ex_adapter *a, int64_t l, int k, int64_t r, int64_t in, float *row) {
    if (!lt_ex_adapter_has(a, l, k)) return;
    const float *A = a->a[l * LT_PROJ_COUNT_ + k], *B = a->b[l * LT_PROJ_COUNT_ + k] + r * a->rank;
    for (int64_t j = 0; j < a->rank; j++) {
        float s = a->scale * B[j];
        if (s == 0.0f) continue;
        const float *Aj = A + j * in;
        for (int64_t i = 0; i < in; i++) row[i] += s * Aj[i];
    }
}
