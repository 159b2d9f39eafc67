/* The base of an export: its configuration (lt_model_inspect, so exactly what the model would
 * load), its tensor readers, the list of pieces of the one decoder with their HF and GGUF names,
 * and row access in rotate-half order. It never copies a whole tensor. */
#include <math.h>
#include <string.h>
#include <sys/stat.h>

#include "export/export_internal.h"
#include "model/model_internal.h"

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* The GGUF architecture of each exported one (Mixtral is llama.cpp's llama with experts). */
static const char *gguf_arch(lt_model_arch a) {
    switch (a) {
    case LT_ARCH_LLAMA:
    case LT_ARCH_MIXTRAL: return "llama";
    case LT_ARCH_QWEN2: return "qwen2";
    case LT_ARCH_QWEN3: return "qwen3";
    case LT_ARCH_QWEN3_MOE: return "qwen3moe";
    case LT_ARCH_QWEN2_MOE: return "qwen2moe";
    default: return NULL;
    }
}

lt_status lt_ex_base_open(lt_ctx *ctx, const char *path, lt_ex_base *b) {
    memset(b, 0, sizeof *b);
    b->path = path;
    struct stat sb;
    if (stat(path, &sb) != 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no such file or folder", path);
    LT_TRY(lt_model_inspect(ctx, path, NULL, &b->cfg));
    const char *ga = gguf_arch(b->cfg.arch);
    if (!ga)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: export handles llama, qwen2, qwen3, qwen3_moe, qwen2_moe and mixtral bases", path);
    snprintf(b->arch, sizeof b->arch, "%s", ga);
    if (ends_with(path, ".gguf")) {
        LT_TRY(lt_gguf_open(ctx, path, &b->gg));
        b->permute_qk = !strcmp(ga, "llama");
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
    if (out && *n < cap) out[*n] = (lt_ex_piece){k, l, which, ndim, {s0, s1}, 0};
    (*n)++;
}

void lt_ex_expert_shape(const lt_model_config *c, int which, int64_t *rows, int64_t *cols) {
    if (which == LT_PROJ_DOWN) *rows = c->C, *cols = c->moe_F;
    else *rows = c->moe_F, *cols = c->C;
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
            if (k >= LT_PROJ_GATE && lt_model_layer_is_moe(c, l)) {
                if (k > LT_PROJ_GATE) continue;
                /* The router, then every expert's gate, up and down (a GGUF stack each). */
                piece(out, cap, &n, EX_ROUTER, l, 0, 2, c->n_experts, c->C);
                for (int w = LT_PROJ_GATE; w <= LT_PROJ_DOWN; w++)
                    for (int64_t e = 0; e < c->n_experts; e++) {
                        int64_t er, ec;
                        lt_ex_expert_shape(c, w, &er, &ec);
                        if (out && n < cap) out[n] = (lt_ex_piece){EX_EXPERT, l, w, 2, {er, ec}, e};
                        n++;
                    }
                if (c->moe_shared_F > 0) { /* Qwen2-MoE's shared expert and its gate */
                    for (int w = LT_PROJ_GATE; w <= LT_PROJ_DOWN; w++)
                        piece(out, cap, &n, EX_SHEXP, l, w, 2, w == LT_PROJ_DOWN ? c->C : c->moe_shared_F,
                              w == LT_PROJ_DOWN ? c->moe_shared_F : c->C);
                    piece(out, cap, &n, EX_SHEXP_GATE, l, 0, 2, 1, c->C);
                }
                continue;
            }
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
static const char *const gguf_exps[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
/* Mixtral's per-expert names: w1 gate, w3 up, w2 down. */
static const char *const mixtral_w[3] = {"w1", "w3", "w2"};

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
    case EX_ROUTER: snprintf(buf, n, "blk.%lld.ffn_gate_inp.weight", l); break;
    case EX_EXPERT: snprintf(buf, n, "blk.%lld.%s.weight", l, gguf_exps[p->which - LT_PROJ_GATE]); break;
    case EX_SHEXP: snprintf(buf, n, "blk.%lld.%s_shexp.weight", l, gguf_proj[p->which]); break;
    case EX_SHEXP_GATE: snprintf(buf, n, "blk.%lld.ffn_gate_inp_shexp.weight", l); break;
    }
}

/* HF names of MoE pieces: Qwen3-MoE "mlp.gate" / "mlp.experts.<e>.<gate|up|down>_proj", Mixtral
 * "block_sparse_moe.gate" / "block_sparse_moe.experts.<e>.<w1|w3|w2>" (the Hub's per-expert files,
 * which transformers 4 and 5 both read). */
void lt_ex_hf_name(const lt_ex_base *b, const lt_ex_piece *p, char *buf, size_t n) {
    long long l = (long long)p->layer;
    int mixtral = b->cfg.arch == LT_ARCH_MIXTRAL;
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
    case EX_ROUTER:
        snprintf(buf, n, "model.layers.%lld.%s.gate.weight", l, mixtral ? "block_sparse_moe" : "mlp");
        break;
    case EX_SHEXP:
        snprintf(buf, n, "model.layers.%lld.mlp.shared_expert.%s.weight", l, lt_proj_name((lt_proj)p->which));
        break;
    case EX_SHEXP_GATE: snprintf(buf, n, "model.layers.%lld.mlp.shared_expert_gate.weight", l); break;
    case EX_EXPERT:
        if (mixtral)
            snprintf(buf, n, "model.layers.%lld.block_sparse_moe.experts.%lld.%s.weight", l, (long long)p->expert,
                     mixtral_w[p->which - LT_PROJ_GATE]);
        else
            snprintf(buf, n, "model.layers.%lld.mlp.experts.%lld.%s.weight", l, (long long)p->expert,
                     lt_proj_name((lt_proj)p->which));
        break;
    }
}

const char *lt_ex_class_name(const lt_ex_piece *p) {
    switch (p->kind) {
    case EX_EMBED: return "token_embd";
    case EX_HEAD: return "output";
    case EX_PROJ: return gguf_proj[p->which];
    case EX_BIAS: return "bias";
    case EX_ROPE_FREQS: return "rope_freqs";
    case EX_ROUTER: return "ffn_gate_inp";
    case EX_EXPERT: return gguf_exps[p->which - LT_PROJ_GATE];
    case EX_SHEXP: return "ffn_shexp";
    case EX_SHEXP_GATE: return "ffn_gate_inp_shexp";
    default: return "norm";
    }
}

/* One expert's matrix as a view of the source: a row range of the GGUF stack (E, rows, cols), of
 * transformers 5's fused gate_up_proj (E, 2·moe_F, C) (gate rows, then up rows) or down_proj
 * (E, C, moe_F), or the per-expert tensor itself. */
static lt_status find_expert(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_piece *p, lt_tensor *t) {
    const lt_model_config *c = &b->cfg;
    int64_t rows = p->shape[0], cols = p->shape[1], E = c->n_experts, skip = 0, per = rows;
    char name[192];
    lt_status s;
    if (b->gg) {
        lt_ex_gguf_name(p, name, sizeof name);
        s = lt_gguf_find_tensor(ctx, b->gg, name, t);
    } else {
        lt_ex_hf_name(b, p, name, sizeof name);
        s = lt_safetensors_find(ctx, b->st, name, t);
        if (s == LT_ERR_NOT_FOUND && c->arch != LT_ARCH_MIXTRAL) {
            lt_ctx_clear_error(ctx);
            snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.%s", (long long)p->layer,
                     p->which == LT_PROJ_DOWN ? "down_proj" : "gate_up_proj");
            s = lt_safetensors_find(ctx, b->st, name, t);
            if (p->which != LT_PROJ_DOWN) per = 2 * rows, skip = p->which == LT_PROJ_UP ? rows : 0;
        } else if (s == LT_OK) {
            E = 1; /* one expert's own tensor */
        }
    }
    if (s == LT_ERR_NOT_FOUND) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: tensor '%s' is missing", b->path, name);
    if (s != LT_OK) return s;
    int ok = E == 1 ? t->ndim == 2 && t->shape[0] == rows && t->shape[1] == cols
                    : t->ndim == 3 && t->shape[0] == E && t->shape[1] == per && t->shape[2] == cols;
    if (!ok)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' is not (%s%lld, %lld)", b->path, name, E == 1 ? "" : "E, ",
                        (long long)per, (long long)cols);
    int64_t rb = lt_dtype_row_bytes(t->dtype, cols);
    if (rb < 0)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s': %lld columns are not whole %s blocks", b->path, name,
                        (long long)cols, lt_dtype_name(t->dtype));
    int64_t first = E == 1 ? 0 : p->expert * per + skip, shape[2] = {rows, cols};
    *t = lt_tensor_view((uint8_t *)t->data + (size_t)first * (size_t)rb, t->dtype, LT_DEVICE_CPU, 2, shape);
    return LT_OK;
}

lt_status lt_ex_find(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_piece *p, lt_tensor *t) {
    char name[160];
    memset(t, 0, sizeof *t);
    if (p->kind == EX_ROPE_FREQS && !b->has_rope_freqs) return LT_OK; /* computed from the config */
    if (p->kind == EX_EXPERT) return find_expert(ctx, b, p, t);
    if (b->gg) lt_ex_gguf_name(p, name, sizeof name);
    else lt_ex_hf_name(b, p, name, sizeof name);
    lt_status s = b->gg ? lt_gguf_find_tensor(ctx, b->gg, name, t) : lt_safetensors_find(ctx, b->st, name, t);
    if (s == LT_ERR_NOT_FOUND) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: tensor '%s' is missing", b->path, name);
    if (s != LT_OK) return s;
    int64_t want = p->ndim == 2 ? p->shape[0] * p->shape[1] : p->shape[0];
    int ok = p->ndim == 1 || p->kind == EX_SHEXP_GATE
        ? lt_tensor_numel(t) == want
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
