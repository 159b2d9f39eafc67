/* The adapter of an export, read into host f32 and checked against the base: a PEFT folder
 * (adapter_config.json + adapter_model.safetensors, as longtune or PEFT writes it) or a longtune
 * training checkpoint (checkpoint.ltck, or the folder holding it; its checksum is verified and
 * its LoRA rank and alpha come from the run options it records). Every tensor's shape is checked
 * against the projection it targets; a mismatch names the tensor and both shapes. LoRA on the
 * experts of MoE layers comes in PEFT's shapes from a PEFT folder (reordered into longtune's
 * storage through lt_lora_tensor_peft_index) and in the storage's from a checkpoint. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export/export_internal.h"
#include "longtune/alloc.h"
#include "model/model_internal.h"
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

/* Elements of layer l's expert stack w (0 gate_up, 1 down): A and B; 0 when not adapted. */
static void expert_elems(const lt_model_config *c, const lt_ex_adapter *a, int64_t l, int w, int64_t *na, int64_t *nb) {
    *na = *nb = 0;
    unsigned bit = w ? LT_LORA_EXPERTS_DOWN : LT_LORA_EXPERTS_GATE_UP;
    if (!(a->targets & bit) || l < a->l0 || !lt_model_layer_is_moe(c, l)) return;
    int64_t E = c->n_experts, r = a->rank;
    *na = E * r * (w ? c->moe_F : c->C);
    *nb = w ? E * c->C * r : 2 * E * c->moe_F * r;
}

/* A plain projection takes LoRA in layer l (the MLP's of an MoE layer are the expert stacks). */
static int plain_target(const lt_model_config *c, const lt_ex_adapter *a, int64_t l, int k) {
    return ((a->targets >> k) & 1u) && !(k >= LT_PROJ_GATE && lt_model_layer_is_moe(c, l));
}

static lt_status alloc_adapter(lt_ctx *ctx, const lt_ex_base *b, lt_ex_adapter *a) {
    const lt_model_config *c = &b->cfg;
    a->L = c->L;
    a->ptr_bytes = (size_t)c->L * (LT_PROJ_COUNT_ + 2) * sizeof(float *);
    a->a = lt_calloc(ctx, LT_DEVICE_CPU, 2 * a->ptr_bytes, "export adapter index");
    if (!a->a) return lt_ctx_status(ctx);
    a->b = a->a + c->L * LT_PROJ_COUNT_;
    a->xa = a->b + c->L * LT_PROJ_COUNT_;
    a->xb = a->xa + c->L * 2;
    size_t floats = 0;
    for (int64_t l = a->l0; l < c->L; l++) {
        for (int k = 0; k < LT_PROJ_COUNT_; k++)
            if (plain_target(c, a, l, k)) {
                int64_t o, i;
                proj_shape(c, k, &o, &i);
                floats += (size_t)(a->rank * (o + i));
            }
        for (int w = 0; w < 2; w++) {
            int64_t na, nb;
            expert_elems(c, a, l, w, &na, &nb);
            floats += (size_t)(na + nb);
        }
    }
    a->data_bytes = floats * sizeof(float);
    a->data = lt_alloc(ctx, LT_DEVICE_CPU, a->data_bytes ? a->data_bytes : 1, "export adapter");
    if (!a->data) return lt_ctx_status(ctx);
    float *p = a->data;
    for (int64_t l = a->l0; l < c->L; l++) {
        for (int k = 0; k < LT_PROJ_COUNT_; k++)
            if (plain_target(c, a, l, k)) {
                int64_t o, i;
                proj_shape(c, k, &o, &i);
                a->a[l * LT_PROJ_COUNT_ + k] = p;
                p += a->rank * i;
                a->b[l * LT_PROJ_COUNT_ + k] = p;
                p += a->rank * o;
            }
        for (int w = 0; w < 2; w++) {
            int64_t na, nb;
            expert_elems(c, a, l, w, &na, &nb);
            if (!na) continue;
            a->xa[l * 2 + w] = p;
            p += na;
            a->xb[l * 2 + w] = p;
            p += nb;
        }
    }
    return LT_OK;
}

/* Tensors the adapter holds: 2 per adapted plain projection and per adapted expert stack. */
static int64_t adapter_tensors(const lt_model_config *c, const lt_ex_adapter *a) {
    int64_t n = 0;
    for (int64_t l = a->l0; l < c->L; l++) {
        for (int k = 0; k < LT_PROJ_COUNT_; k++) n += 2 * plain_target(c, a, l, k);
        for (int w = 0; w < 2; w++) {
            int64_t na, nb;
            expert_elems(c, a, l, w, &na, &nb);
            n += 2 * (na > 0);
        }
    }
    return n;
}

/* "…layers.<l>.mlp.experts[.base_layer].lora_A|B" → layer, stack w (0 gate_up, 1 down) and
 * factor; 0 on success. PEFT nests the first target parameter (gate_up) under base_layer when
 * both are adapted; alone, either has the plain name. */
static int parse_expert_name(const char *name, unsigned targets, int64_t *layer, int *w, int *is_b) {
    const char *l = strstr(name, "layers.");
    if (!l) return -1;
    char *e;
    long v = strtol(l + 7, &e, 10);
    if (e == l + 7 || v < 0 || strncmp(e, ".mlp.experts.", 13)) return -1;
    const char *f = e + 13;
    int nested = !strncmp(f, "base_layer.", 11);
    if (nested) f += 11;
    if (strncmp(f, "lora_", 5) || (f[5] != 'A' && f[5] != 'B') || (f[6] && strcmp(f + 6, ".weight"))) return -1;
    *layer = v;
    *is_b = f[5] == 'B';
    int both = (targets & LT_LORA_EXPERT_TARGETS) == LT_LORA_EXPERT_TARGETS;
    if (nested && !both) return -1;
    *w = nested ? 0 : both ? 1 : (targets & LT_LORA_EXPERTS_GATE_UP) ? 0 : 1;
    return 0;
}

/* The lt_lora_tensor describing PEFT's shape of an expert stack (for lt_lora_tensor_peft_index). */
static lt_lora_tensor expert_desc(const lt_model_config *c, int64_t r, int w, int is_b) {
    lt_lora_tensor t;
    memset(&t, 0, sizeof t);
    int64_t E = c->n_experts, in = w ? c->moe_F : c->C, o = w ? c->C : 2 * c->moe_F;
    t.proj = w ? LT_PROJ_DOWN : LT_PROJ_GATE;
    t.is_b = is_b;
    t.experts = E;
    t.peft_rows = is_b ? o : r * E;
    t.peft_cols = is_b ? r * E : in;
    return t;
}

/* Checks expert tensor (layer l, stack w, factor) of shape (d0, d1) — PEFT's (peft = 1) or the
 * storage's — and returns where its values go. */
static lt_status expert_slot(lt_ctx *ctx, const char *file, const char *name, const lt_ex_base *b,
                             const lt_ex_adapter *a, int64_t l, int w, int is_b, int peft, int64_t d0, int64_t d1,
                             float **dst) {
    const lt_model_config *c = &b->cfg;
    if (l >= c->L)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' is for layer %lld, the base has %lld layers", file, name,
                        (long long)l, (long long)c->L);
    if (c->n_experts < 1)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: tensor '%s' adapts the experts of a mixture-of-experts layer; the base has none", file,
                        name);
    int64_t na, nb;
    expert_elems(c, a, l, w, &na, &nb);
    if (!na)
        return lt_error(ctx, LT_ERR_SHAPE,
                        "%s: tensor '%s' is outside the adapter's targets (layer %lld: %s, LoRA layers %lld..%lld)",
                        file, name, (long long)l, lt_model_layer_is_moe(c, l) ? "an MoE layer" : "a dense layer",
                        (long long)a->l0, (long long)(c->L - 1));
    lt_lora_tensor t = expert_desc(c, a->rank, w, is_b);
    int64_t w0 = t.peft_rows, w1 = t.peft_cols;
    if (!peft && is_b) w0 = t.peft_rows * t.peft_cols, w1 = 1;
    if (d0 != w0 || d1 != w1)
        return lt_error(ctx, LT_ERR_SHAPE,
                        "%s: tensor '%s' is (%lld, %lld) but %s of %lld experts with rank %lld needs (%lld, %lld): "
                        "the adapter does not match this base",
                        file, name, (long long)d0, (long long)d1, w ? "experts.down_proj" : "experts.gate_up_proj",
                        (long long)c->n_experts, (long long)a->rank, (long long)w0, (long long)w1);
    *dst = is_b ? a->xb[l * 2 + w] : a->xa[l * 2 + w];
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
    if (!plain_target(c, a, l, k) || l < a->l0)
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
    int64_t want = adapter_tensors(&b->cfg, a);
    int64_t count = lt_safetensors_count(st);
    for (int64_t t = 0; t < count && s == LT_OK; t++) {
        const char *name = lt_safetensors_name(st, t);
        int64_t l;
        int k, is_b;
        if (strstr(name, ".mlp.experts.")) {
            int w;
            lt_tensor v;
            float *dst;
            if (parse_expert_name(name, a->targets, &l, &w, &is_b)) {
                s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                             "%s: tensor '%s' is not a LoRA factor of the expert parameters adapter_config.json's "
                             "target_parameters name",
                             path, name);
                break;
            }
            if ((s = lt_safetensors_find(ctx, st, name, &v)) != LT_OK) break;
            if (v.ndim != 2) {
                s = lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' has %d dims, not 2", path, name, v.ndim);
                break;
            }
            if ((s = expert_slot(ctx, path, name, b, a, l, w, is_b, 1, v.shape[0], v.shape[1], &dst)) != LT_OK) break;
            lt_lora_tensor d = expert_desc(&b->cfg, a->rank, w, is_b);
            int64_t ne = v.shape[0] * v.shape[1];
            for (int64_t j = 0; j < ne && s == LT_OK; j++) {
                float x = v.dtype == LT_DTYPE_F32 ? ((const float *)v.data)[j]
                    : v.dtype == LT_DTYPE_BF16    ? lt_bf16_to_f32(((const uint16_t *)v.data)[j])
                                                  : lt_f16_to_f32(((const uint16_t *)v.data)[j]);
                if (!isfinite(x))
                    s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s' element %lld is not finite", path, name,
                                 (long long)j);
                dst[lt_lora_tensor_peft_index(&d, j)] = x;
            }
            continue;
        }
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
        if (v.dtype != LT_DTYPE_F32 && v.dtype != LT_DTYPE_BF16 && v.dtype != LT_DTYPE_F16) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s' is %s (f32, bf16 or f16 expected)", path, name,
                         lt_dtype_name(v.dtype));
            break;
        }
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
    /* Which expert stacks the run adapted (their names alone do not say when one is). */
    char tg[1024];
    unsigned ex = 0;
    if (option(text, "lora_targets", tg, sizeof tg)) {
        ex |= strstr(tg, "experts.gate_up_proj") ? LT_LORA_EXPERTS_GATE_UP : 0u;
        ex |= strstr(tg, "experts.down_proj") ? LT_LORA_EXPERTS_DOWN : 0u;
    }
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
            int k, is_b, w;
            size_t bytes = (size_t)(sh[0] * sh[1]) * sizeof(float);
            if (strstr(name, ".mlp.experts.")) {
                if (parse_expert_name(name, ex, &l, &w, &is_b))
                    return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                    "%s: tensor '%s' is not a LoRA factor of the expert stacks its options name",
                                    c->path, name);
                if (pass == 0) {
                    a->targets |= w ? LT_LORA_EXPERTS_DOWN : LT_LORA_EXPERTS_GATE_UP;
                    if (l < lmin) lmin = l;
                } else {
                    float *dst;
                    LT_TRY(expert_slot(ctx, c->path, name, b, a, l, w, is_b, 0, sh[0], sh[1], &dst));
                    memcpy(dst, c->p + c->at, bytes < c->n - c->at ? bytes : 0);
                }
                LT_TRY(take(ctx, c, NULL, bytes, name));
                LT_TRY(take(ctx, c, NULL, 2 * bytes, "optimizer moments"));
                continue;
            }
            if (parse_name(name, &l, &k, &is_b))
                return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s' is not a LoRA factor", c->path, name);
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
    int64_t want_n = adapter_tensors(&b->cfg, a);
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
    a->a = a->b = a->xa = a->xb = NULL;
    a->data = NULL;
}

int lt_ex_adapter_has(const lt_ex_adapter *a, int64_t l, int k) {
    return a && a->a && l >= 0 && l < a->L && a->a[l * LT_PROJ_COUNT_ + k] != NULL;
}

int lt_ex_adapter_has_expert(const lt_ex_adapter *a, int64_t l, int which) {
    return a && a->xa && l >= 0 && l < a->L && a->xa[l * 2 + (which == LT_PROJ_DOWN)] != NULL;
}

int lt_ex_piece_merged(const lt_ex_adapter *a, const lt_ex_piece *p) {
    if (p->kind == EX_PROJ) return lt_ex_adapter_has(a, p->layer, p->which);
    if (p->kind == EX_EXPERT) return lt_ex_adapter_has_expert(a, p->layer, p->which);
    return 0;
}

void lt_ex_adapter_add_expert_row(const lt_ex_adapter *a, const lt_model_config *c, int64_t l, int which, int64_t e,
                                  int64_t o, float *row) {
    if (!lt_ex_adapter_has_expert(a, l, which)) return;
    int w = which == LT_PROJ_DOWN;
    int64_t r = a->rank, in = w ? c->moe_F : c->C, rows = w ? c->C : c->moe_F;
    const float *A = a->xa[l * 2 + w] + e * r * in;
    const float *B = a->xb[l * 2 + w] + (which == LT_PROJ_UP ? c->n_experts * c->moe_F * r : 0) + (e * rows + o) * r;
    for (int64_t j = 0; j < r; j++) {
        float s = a->scale * B[j];
        if (s == 0.0f) continue;
        const float *Aj = A + j * in;
        for (int64_t i = 0; i < in; i++) row[i] += s * Aj[i];
    }
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
