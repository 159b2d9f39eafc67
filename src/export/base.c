/* The base of an export: its configuration (lt_model_inspect, so exactly what the model would
 * load), its tensor readers, the list of pieces of the one decoder with their HF and GGUF names,
 * and row access in rotate-half order. It never copies a whole tensor. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "export/export_internal.h"

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static const char *const arch_names[] = {"llama", "qwen2", "qwen3"};

lt_status lt_ex_base_open(lt_ctx *ctx, const char *path, lt_ex_base *b) {
    memset(b, 0, sizeof *b);
    b->path = path;
    struct stat sb;
    if (stat(path, &sb) != 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no such file or folder", path);
    LT_TRY(lt_model_inspect(ctx, path, NULL, &b->cfg));
    if ((int)b->cfg.arch < 0 || b->cfg.arch > LT_ARCH_QWEN3)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: export handles llama, qwen2 and qwen3 bases", path);
    snprintf(b->arch, sizeof b->arch, "%s", arch_names[b->cfg.arch]);
    if (ends_with(path, ".gguf")) {
        LT_TRY(lt_gguf_open(ctx, path, &b->gg));
        b->permute_qk = b->cfg.arch == LT_ARCH_LLAMA;
        lt_tensor t;
        b->has_rope_freqs = lt_gguf_find_tensor(ctx, b->gg, "rope_freqs.weight", &t) == LT_OK;
        lt_ctx_clear_error(ctx);
        const char *slash = strrchr(path, '/');
        if (slash) snprintf(b->dir, sizeof b->dir, "%.*s", (int)(slash - path), path);
        else snprintf(b->dir, sizeof b->dir, ".");
        return LT_OK;
    }
    snprintf(b->dir, sizeof b->dir, "%s", path);
    if (!S_ISDIR(sb.st_mode)) {
        char *slash = strrchr(b->dir, '/');
        if (slash) *slash = 0;
        else snprintf(b->dir, sizeof b->dir, ".");
    }
    return lt_safetensors_open(ctx, S_ISDIR(sb.st_mode) ? b->dir : path, &b->st);
}

void lt_ex_base_close(lt_ctx *ctx, lt_ex_base *b) {
    if (b->gg) lt_gguf_close(b->gg);
    if (b->st) lt_safetensors_close(ctx, b->st);
    b->gg = NULL;
    b->st = NULL;
}

static void piece(lt_ex_piece *out, int64_t cap, int64_t *n, lt_ex_kind k, int64_t l, int which, int ndim, int64_t s0,
                  int64_t s1) {
    if (out && *n < cap) out[*n] = (lt_ex_piece){k, l, which, ndim, {s0, s1}};
    (*n)++;
}

int64_t lt_ex_pieces(const lt_ex_base *b, int with_rope_freqs, lt_ex_piece *out, int64_t cap) {
    const lt_model_config *c = &b->cfg;
    int64_t n = 0;
    piece(out, cap, &n, EX_EMBED, -1, 0, 2, c->V, c->C);
    for (int64_t l = 0; l < c->L; l++) {
        piece(out, cap, &n, EX_ATTN_NORM, l, 0, 1, c->C, 0);
        for (int k = 0; k < LT_PROJ_COUNT_; k++) {
            int64_t o, i;
            if (k == LT_PROJ_Q) o = c->H * c->D, i = c->C;
            else if (k == LT_PROJ_K || k == LT_PROJ_V) o = c->Hkv * c->D, i = c->C;
            else if (k == LT_PROJ_O) o = c->C, i = c->H * c->D;
            else if (k == LT_PROJ_DOWN) o = c->C, i = c->F;
            else o = c->F, i = c->C;
            piece(out, cap, &n, EX_PROJ, l, k, 2, o, i);
            if (c->qkv_bias && k <= LT_PROJ_V)
                piece(out, cap, &n, EX_BIAS, l, k, 1, k ? c->Hkv * c->D : c->H * c->D, 0);
            if (c->qk_norm && k == LT_PROJ_K) {
                piece(out, cap, &n, EX_Q_NORM, l, 0, 1, c->D, 0);
                piece(out, cap, &n, EX_K_NORM, l, 0, 1, c->D, 0);
            }
        }
        piece(out, cap, &n, EX_MLP_NORM, l, 0, 1, c->C, 0);
    }
    piece(out, cap, &n, EX_FINAL_NORM, -1, 0, 1, c->C, 0);
    if (!c->tie_embeddings) piece(out, cap, &n, EX_HEAD, -1, 0, 2, c->V, c->C);
    if (with_rope_freqs) piece(out, cap, &n, EX_ROPE_FREQS, -1, 0, 1, c->D / 2, 0);
    return n;
}

static const char *const gguf_proj[LT_PROJ_COUNT_] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                      "ffn_gate", "ffn_up", "ffn_down"};

void lt_ex_gguf_name(const lt_ex_piece *p, char *buf, size_t n) {
    long long l = (long long)p->layer;
    static const char qkv[3] = {'q', 'k', 'v'};
    switch (p->kind) {
    case EX_EMBED: snprintf(buf, n, "token_embd.weight"); break;
    case EX_HEAD: snprintf(buf, n, "output.weight"); break;
    case EX_FINAL_NORM: snprintf(buf, n, "output_norm.weight"); break;
    case EX_ROPE_FREQS: snprintf(buf, n, "rope_freqs.weight"); break;
    case EX_PROJ: snprintf(buf, n, "blk.%lld.%s.weight", l, gguf_proj[p->which]); break;
    case EX_BIAS: snprintf(buf, n, "blk.%lld.attn_%c.bias", l, qkv[p->which]); break;
    case EX_ATTN_NORM: snprintf(buf, n, "blk.%lld.attn_norm.weight", l); break;
    case EX_MLP_NORM: snprintf(buf, n, "blk.%lld.ffn_norm.weight", l); break;
    case EX_Q_NORM: snprintf(buf, n, "blk.%lld.attn_q_norm.weight", l); break;
    case EX_K_NORM: snprintf(buf, n, "blk.%lld.attn_k_norm.weight", l); break;
    }
}

void lt_ex_hf_name(const lt_ex_piece *p, char *buf, size_t n) {
    long long l = (long long)p->layer;
    static const char qkv[3] = {'q', 'k', 'v'};
    switch (p->kind) {
    case EX_EMBED: snprintf(buf, n, "model.embed_tokens.weight"); break;
    case EX_HEAD: snprintf(buf, n, "lm_head.weight"); break;
    case EX_FINAL_NORM: snprintf(buf, n, "model.norm.weight"); break;
    case EX_ROPE_FREQS: snprintf(buf, n, "rope_freqs.weight"); break;
    case EX_PROJ:
        snprintf(buf, n, "model.layers.%lld.%s.%s.weight", l, p->which <= LT_PROJ_O ? "self_attn" : "mlp",
                 lt_proj_name((lt_proj)p->which));
        break;
    case EX_BIAS: snprintf(buf, n, "model.layers.%lld.self_attn.%c_proj.bias", l, qkv[p->which]); break;
    case EX_ATTN_NORM: snprintf(buf, n, "model.layers.%lld.input_layernorm.weight", l); break;
    case EX_MLP_NORM: snprintf(buf, n, "model.layers.%lld.post_attention_layernorm.weight", l); break;
    case EX_Q_NORM: snprintf(buf, n, "model.layers.%lld.self_attn.q_norm.weight", l); break;
    case EX_K_NORM: snprintf(buf, n, "model.layers.%lld.self_attn.k_norm.weight", l); break;
    }
}

const char *lt_ex_class_name(const lt_ex_piece *p) {
    switch (p->kind) {
    case EX_EMBED: return "token_embd";
    case EX_HEAD: return "output";
    case EX_PROJ: return gguf_proj[p->which];
    case EX_BIAS: return "bias";
    case EX_ROPE_FREQS: return "rope_freqs";
    default: return "norm";
    }
}

lt_status lt_ex_find(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_piece *p, lt_tensor *t) {
    char name[160];
    memset(t, 0, sizeof *t);
    if (p->kind == EX_ROPE_FREQS && !b->has_rope_freqs) return LT_OK; /* computed from the config */
    if (b->gg) lt_ex_gguf_name(p, name, sizeof name);
    else lt_ex_hf_name(p, name, sizeof name);
    lt_status s = b->gg ? lt_gguf_find_tensor(ctx, b->gg, name, t) : lt_safetensors_find(ctx, b->st, name, t);
    if (s == LT_ERR_NOT_FOUND) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: tensor '%s' is missing", b->path, name);
    if (s != LT_OK) return s;
    int64_t want = p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
    int ok = p->ndim == 1 ? lt_tensor_numel(t) == want
                          : t->ndim == 2 && t->shape[0] == p->shape[0] && t->shape[1] == p->shape[1];
    if (!ok)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' has %lld elements (dim 0 %lld), expected (%lld, %lld)",
                        b->path, name, (long long)lt_tensor_numel(t), (long long)t->shape[0], (long long)p->shape[0],
                        (long long)(p->ndim > 1 ? p->shape[1] : 1));
    if (p->ndim == 1 && t->dtype != LT_DTYPE_F32 && t->dtype != LT_DTYPE_F16 && t->dtype != LT_DTYPE_BF16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s' is %s (a vector must be f32, f16 or bf16)", b->path,
                        name, lt_dtype_name(t->dtype));
    return LT_OK;
}

int64_t lt_ex_interleaved_row(int64_t r, int64_t D) {
    int64_t h = r / D, w = r % D, s = w / (D / 2), i = w % (D / 2);
    return h * D + 2 * i + s;
}

void lt_ex_read_row(const lt_ex_base *b, const lt_ex_piece *p, const lt_tensor *t, int64_t r, float *out) {
    int64_t cols = p->ndim == 2 ? p->shape[1] : p->shape[0];
    if (p->kind == EX_ROPE_FREQS && !t->data) {
        lt_ex_llama3_rope_factors(&b->cfg, out);
        return;
    }
    int64_t sr = r;
    if (b->permute_qk && p->kind == EX_PROJ && (p->which == LT_PROJ_Q || p->which == LT_PROJ_K))
        sr = lt_ex_interleaved_row(r, b->cfg.D);
    int64_t rb = lt_dtype_row_bytes(t->dtype, cols);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)sr * (size_t)rb;
    switch (t->dtype) {
    case LT_DTYPE_F32: memcpy(out, src, (size_t)cols * sizeof(float)); break;
    case LT_DTYPE_F16:
        for (int64_t i = 0; i < cols; i++) out[i] = lt_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    case LT_DTYPE_BF16:
        for (int64_t i = 0; i < cols; i++) out[i] = lt_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    default: lt_dequantize_row(t->dtype, src, out, cols);
    }
}

void lt_ex_llama3_rope_factors(const lt_model_config *c, float *out) {
    const double pi = 3.14159265358979323846;
    double old = (double)c->rope_original_ctx;
    double low_wl = old / c->rope_low_freq, high_wl = old / c->rope_high_freq;
    for (int64_t i = 0; i < c->D / 2; i++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->D), wl = 2 * pi / f, g = 1.0;
        if (wl > low_wl) g = c->rope_factor;
        else if (wl >= high_wl) {
            double smooth = (old / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
            g = 1.0 / ((1 - smooth) / c->rope_factor + smooth);
        }
        out[i] = (float)g;
    }
}
