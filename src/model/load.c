/* Loading the one model: an HF folder (config.json + safetensors, sharded or not) or a GGUF file
 * (llama incl. Mistral / qwen2 / qwen3 / phi3 architectures; Phi-3's fused qkv and gate_up
 * tensors are read as row ranges of the fused tensor). Weights are copied once into the accounted
 * weights block in the layout's carve order: norms and biases as f32, projections in their file
 * dtype, per tensor where a file mixes them across layers (or quantized with opt->quantize_dtype),
 * f16 embeddings/heads widened to f32 (the loss reads f32, bf16 and block heads; on a GPU f32/f16
 * ones are held as bf16). llama-arch GGUF Q/K rows are un-permuted back to rotate-half order.
 * A device model converts rows into a bounded host staging buffer and copies it over chunk by
 * chunk, so the host never holds a second copy of the weights. LoRA A gets PEFT's
 * kaiming-uniform init from a seeded generator, B zeros. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "longtune/alloc.h"
#include "longtune/gguf.h"
#include "longtune/log.h"
#include "longtune/safetensors.h"
#include "longtune/sysinfo.h"
#include "model/model_internal.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "model/config_bounds.h"

typedef struct source {
    const char *path;
    lt_safetensors *st;
    lt_gguf *gg;
    int permute_qk;        /* llama-arch GGUF: Q/K rows stored for interleaved RoPE */
    int has_rope_factors;  /* GGUF rope_freqs.weight (Llama 3.1 style frequency factors) */
    int fused;             /* Phi-3: q/k/v rows of one qkv tensor, gate/up rows of one gate_up */
    int sandwich;          /* the config has sandwich norms (Gemma): HF names its norms differently */
    const char *hf_prefix; /* HF names' "model." as a multimodal checkpoint spells it, or NULL */
    int moe_fused;         /* HF MoE experts as transformers 5 holds them in memory: one (E, 2F, C)
                              mlp.experts.gate_up_proj and one (E, C, F) mlp.experts.down_proj */
    const lt_model_config *cfg;
} source;

static void close_source(lt_ctx *ctx, source *s) {
    if (s->st) lt_safetensors_close(ctx, s->st);
    if (s->gg) lt_gguf_close(s->gg);
    s->st = NULL;
    s->gg = NULL;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static const char *const gguf_proj[LT_PROJ_COUNT_] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                      "ffn_gate", "ffn_up", "ffn_down"};

/* Phi-3's fused projections: the tensor holding projection k and the rows [*r0, *r0 + *rows) of
 * it that are k's (q, k, v of qkv_proj; gate, up of gate_up_proj, gate first). 0 when k is a
 * tensor of its own. */
static int fused_rows(const source *s, int k, int64_t *r0, int64_t *rows, int64_t *total) {
    if (!s->fused || k == LT_PROJ_O || k == LT_PROJ_DOWN) return 0;
    const lt_model_config *c = s->cfg;
    int64_t q = c->H * c->D, kv = c->Hkv * c->D;
    if (k <= LT_PROJ_V) {
        *r0 = k == LT_PROJ_Q ? 0 : k == LT_PROJ_K ? q : q + kv;
        *rows = k == LT_PROJ_Q ? q : kv;
        *total = q + 2 * kv;
    } else {
        *r0 = k == LT_PROJ_GATE ? 0 : c->F;
        *rows = c->F;
        *total = 2 * c->F;
    }
    return 1;
}

static void piece_name(const source *s, const lt_wpiece *p, char *buf, size_t n) {
    long long l = (long long)p->layer;
    static const char qkv[3] = {'q', 'k', 'v'};
    int64_t r0, rows, total;
    if (p->kind == LT_W_PROJ && fused_rows(s, p->which, &r0, &rows, &total)) {
        int attn = p->which <= LT_PROJ_V;
        if (s->gg) snprintf(buf, n, "blk.%lld.%s.weight", l, attn ? "attn_qkv" : "ffn_up");
        else
            snprintf(buf, n, "model.layers.%lld.%s", l, attn ? "self_attn.qkv_proj.weight" : "mlp.gate_up_proj.weight");
        return;
    }
    if (s->gg) {
        switch (p->kind) {
        case LT_W_EMBED: snprintf(buf, n, "token_embd.weight"); break;
        case LT_W_HEAD: snprintf(buf, n, "output.weight"); break;
        case LT_W_FINAL_NORM: snprintf(buf, n, "output_norm.weight"); break;
        case LT_W_PROJ:
            snprintf(buf, n, "blk.%lld.%s%s.weight", l, gguf_proj[p->which],
                     p->which >= LT_PROJ_GATE && lt_model_layer_is_moe(s->cfg, p->layer) ? "_exps" : "");
            break;
        case LT_W_BIAS: snprintf(buf, n, "blk.%lld.attn_%c.bias", l, qkv[p->which]); break;
        case LT_W_ATTN_NORM: snprintf(buf, n, "blk.%lld.attn_norm.weight", l); break;
        case LT_W_MLP_NORM: snprintf(buf, n, "blk.%lld.ffn_norm.weight", l); break;
        case LT_W_Q_NORM: snprintf(buf, n, "blk.%lld.attn_q_norm.weight", l); break;
        case LT_W_K_NORM: snprintf(buf, n, "blk.%lld.attn_k_norm.weight", l); break;
        case LT_W_POST_ATTN_NORM: snprintf(buf, n, "blk.%lld.post_attention_norm.weight", l); break;
        case LT_W_POST_MLP_NORM: snprintf(buf, n, "blk.%lld.post_ffw_norm.weight", l); break;
        case LT_W_ROUTER: snprintf(buf, n, "blk.%lld.ffn_gate_inp.weight", l); break;
        case LT_W_SHARED: snprintf(buf, n, "blk.%lld.%s_shexp.weight", l, gguf_proj[LT_PROJ_GATE + p->which]); break;
        case LT_W_SHARED_GATE: snprintf(buf, n, "blk.%lld.ffn_gate_inp_shexp.weight", l); break;
        default: buf[0] = 0;
        }
        return;
    }
    switch (p->kind) {
    case LT_W_EMBED: snprintf(buf, n, "model.embed_tokens.weight"); break;
    case LT_W_HEAD: snprintf(buf, n, "lm_head.weight"); break;
    case LT_W_FINAL_NORM: snprintf(buf, n, "model.norm.weight"); break;
    case LT_W_PROJ:
        snprintf(buf, n, "model.layers.%lld.%s.%s.weight", l, p->which <= LT_PROJ_O ? "self_attn" : "mlp",
                 lt_proj_name((lt_proj)p->which));
        break;
    case LT_W_BIAS: snprintf(buf, n, "model.layers.%lld.self_attn.%c_proj.bias", l, qkv[p->which]); break;
    case LT_W_ATTN_NORM: snprintf(buf, n, "model.layers.%lld.input_layernorm.weight", l); break;
    case LT_W_MLP_NORM: /* sandwich norms (Gemma): the MLP's input norm is pre_feedforward_layernorm */
        snprintf(buf, n, "model.layers.%lld.%s.weight", l,
                 s->sandwich ? "pre_feedforward_layernorm" : "post_attention_layernorm");
        break;
    case LT_W_POST_ATTN_NORM: snprintf(buf, n, "model.layers.%lld.post_attention_layernorm.weight", l); break;
    case LT_W_POST_MLP_NORM: snprintf(buf, n, "model.layers.%lld.post_feedforward_layernorm.weight", l); break;
    case LT_W_Q_NORM: snprintf(buf, n, "model.layers.%lld.self_attn.q_norm.weight", l); break;
    case LT_W_K_NORM: snprintf(buf, n, "model.layers.%lld.self_attn.k_norm.weight", l); break;
    case LT_W_ROUTER:
        snprintf(buf, n, "model.layers.%lld.%s.gate.weight", l,
                 s->cfg->arch == LT_ARCH_MIXTRAL ? "block_sparse_moe" : "mlp");
        break;
    case LT_W_SHARED:
        snprintf(buf, n, "model.layers.%lld.mlp.shared_expert.%s.weight", l,
                 lt_proj_name((lt_proj)(LT_PROJ_GATE + p->which)));
        break;
    case LT_W_SHARED_GATE: snprintf(buf, n, "model.layers.%lld.mlp.shared_expert_gate.weight", l); break;
    default: buf[0] = 0;
    }
    if (p->kind == LT_W_PROJ && p->which >= LT_PROJ_GATE && lt_model_layer_is_moe(s->cfg, p->layer)) {
        /* expert 0's tensor (per-expert files), or the fused stack (transformers 5's layout) */
        static const char *const mixtral[3] = {"w1", "w3", "w2"};
        if (s->moe_fused)
            snprintf(buf, n, "model.layers.%lld.mlp.experts.%s", l,
                     p->which == LT_PROJ_DOWN ? "down_proj" : "gate_up_proj");
        else if (s->cfg->arch == LT_ARCH_MIXTRAL)
            snprintf(buf, n, "model.layers.%lld.block_sparse_moe.experts.0.%s.weight", l,
                     mixtral[p->which - LT_PROJ_GATE]);
        else snprintf(buf, n, "model.layers.%lld.mlp.experts.0.%s.weight", l, lt_proj_name((lt_proj)p->which));
    }
    if (s->hf_prefix && !strncmp(buf, "model.", 6)) { /* the text model inside a multimodal checkpoint */
        char t[256];
        snprintf(t, sizeof t, "%s%s", s->hf_prefix, buf + 6);
        snprintf(buf, n, "%s", t);
    }
}

static lt_status find(lt_ctx *ctx, const source *s, const char *name, lt_tensor *t) {
    lt_status st = s->gg ? lt_gguf_find_tensor(ctx, s->gg, name, t) : lt_safetensors_find(ctx, s->st, name, t);
    if (st == LT_ERR_NOT_FOUND) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: tensor '%s' is missing", s->path, name);
    return st;
}

/* The tensor of piece p (named `name` by piece_name): for a fused projection, the view of its
 * rows in the fused tensor, whose row count is checked first. */
static lt_status find_piece(lt_ctx *ctx, const source *s, const lt_wpiece *p, const char *name, lt_tensor *t) {
    LT_TRY(find(ctx, s, name, t));
    int64_t r0, rows, total;
    if (p->kind != LT_W_PROJ || !fused_rows(s, p->which, &r0, &rows, &total)) return LT_OK;
    if (t->ndim != 2 || t->shape[0] != total)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: fused tensor '%s' has %lld rows, expected %lld", s->path, name,
                        (long long)t->shape[0], (long long)total);
    int64_t rb = lt_dtype_row_bytes(t->dtype, t->shape[1]);
    if (rb < 0)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s': %lld columns are not whole %s blocks", s->path, name,
                        (long long)t->shape[1], lt_dtype_name(t->dtype));
    t->data = (uint8_t *)t->data + (size_t)r0 * (size_t)rb;
    t->shape[0] = rows;
    return LT_OK;
}

/* An MoE layer's gate, up or down piece: the experts' matrices stacked (E·rows, cols). */
static int expert_piece(const source *s, const lt_wpiece *p) {
    return p->kind == LT_W_PROJ && p->which >= LT_PROJ_GATE && lt_model_layer_is_moe(s->cfg, p->layer);
}

/* The file's blocks of an expert piece p (named by piece_name into name): base[e] the first of
 * expert e's rows (rows = p's rows / E, in the file's dtype); t a view of expert 0's block
 * shaped as the piece. GGUF: one (E, rows, cols) tensor, the stack itself; HF per-expert
 * tensors (each checked: shape and dtype as expert 0's); HF fused (E, 2F, C) gate_up, gate rows
 * first, and (E, C, F) down. Errors: LT_ERR_NOT_FOUND naming a missing expert's tensor,
 * LT_ERR_SHAPE / LT_ERR_FORMAT naming one that disagrees. */
static lt_status find_experts(lt_ctx *ctx, const source *s, const lt_wpiece *p, char *name, size_t nn, lt_tensor *t,
                              const uint8_t **base) {
    const lt_model_config *c = s->cfg;
    int64_t E = c->n_experts, rows = p->shape[0] / E, cols = p->shape[1];
    LT_TRY(find(ctx, s, name, t));
    int fused3 = s->gg || s->moe_fused;
    int64_t per = rows, skip = 0; /* fused gate_up: 2F rows per expert, up's after gate's */
    if (s->moe_fused && p->which != LT_PROJ_DOWN) per = 2 * rows, skip = p->which == LT_PROJ_UP ? rows : 0;
    if (fused3 && (t->ndim != 3 || t->shape[0] != E || t->shape[1] != per || t->shape[2] != cols))
        return lt_error(ctx, LT_ERR_SHAPE,
                        "%s: tensor '%s' has %d dims (%lld, %lld, %lld), expected (%lld, %lld, %lld)", s->path, name,
                        t->ndim, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                        (long long)(t->ndim > 2 ? t->shape[2] : 0), (long long)E, (long long)per, (long long)cols);
    if (!fused3 && (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols))
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' has shape (%lld, %lld), expected (%lld, %lld)", s->path,
                        name, (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0), (long long)rows,
                        (long long)cols);
    int64_t rb = lt_dtype_row_bytes(t->dtype, cols);
    if (rb < 0)
        return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s': %lld columns are not whole %s blocks", s->path, name,
                        (long long)cols, lt_dtype_name(t->dtype));
    lt_dtype dt = t->dtype;
    const uint8_t *data0 = t->data;
    for (int64_t e = 0; e < E; e++) {
        if (fused3) {
            base[e] = data0 + (size_t)(e * per + skip) * (size_t)rb;
            continue;
        }
        char *at = strstr(name, ".experts.");
        if (!at) return lt_error(ctx, LT_ERR_FORMAT, "%s: expert tensor name '%s'", s->path, name);
        char tail[96];
        const char *dot = strchr(at + 9, '.');
        snprintf(tail, sizeof tail, "%s", dot ? dot : "");
        snprintf(at, nn - (size_t)(at - name), ".experts.%lld%s", (long long)e, tail);
        lt_tensor te;
        LT_TRY(find(ctx, s, name, &te));
        if (te.ndim != 2 || te.shape[0] != rows || te.shape[1] != cols || te.dtype != dt)
            return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' is %s (%lld, %lld), expert 0's is %s (%lld, %lld)",
                            s->path, name, lt_dtype_name(te.dtype), (long long)te.shape[0],
                            (long long)(te.ndim > 1 ? te.shape[1] : 0), lt_dtype_name(dt), (long long)rows,
                            (long long)cols);
        base[e] = te.data;
    }
    *t = lt_tensor_view((void *)base[0], dt, LT_DEVICE_CPU, 2, p->shape);
    return LT_OK;
}

/* ---- config from GGUF metadata ---- */

static lt_status gg_int(lt_ctx *ctx, const source *s, const char *arch, const char *key, int required, int64_t *out) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    lt_status st = lt_gguf_get_i64(ctx, s->gg, k, out);
    if (st == LT_ERR_NOT_FOUND && !required) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (st != LT_OK) {
        char msg[512]; /* the reader's message, copied: lt_error formats into the same buffer */
        snprintf(msg, sizeof msg, "%s", lt_ctx_error(ctx));
        return lt_error(ctx, st, "%s: metadata '%s': %s", s->path, k, msg);
    }
    return LT_OK;
}

static lt_status gg_num(lt_ctx *ctx, const source *s, const char *arch, const char *key, double *out) {
    char k[160];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    lt_status st = lt_gguf_get_f64(ctx, s->gg, k, out);
    if (st == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (st != LT_OK) {
        char msg[512]; /* the reader's message, copied: lt_error formats into the same buffer */
        snprintf(msg, sizeof msg, "%s", lt_ctx_error(ctx));
        return lt_error(ctx, st, "%s: metadata '%s': %s", s->path, k, msg);
    }
    return LT_OK;
}

static lt_status gguf_rope(lt_ctx *ctx, source *s, const char *arch, lt_model_config *c);
static lt_status gguf_token_ids(lt_ctx *ctx, const source *s, lt_model_config *c);
/* Gemma 2 / Gemma 3 metadata as llama.cpp's converter writes it and llama.cpp reads it: softcaps
 * (Gemma 2 defaults 50 and 30 when absent, Gemma 3 none), the sliding window (Gemma 2 default
 * 4096; Gemma 3 slides only with one) and its period (attention.sliding_window_pattern, default 2
 * and 6), the sliding layers' RoPE base (rope.freq_base_swa, default 10000 for Gemma 3). The norm
 * weights are stored with the 1 already added, so nothing is added at load. The file has no
 * query_pre_attn_scalar: as llama.cpp, the score scale is 1/sqrt(C/H) for the 27B models (46 and
 * 62 layers) and 1/sqrt(D) otherwise. */
static lt_status gemma_from_gguf(lt_ctx *ctx, source *s, const char *arch, lt_model_config *c) {
    int g2 = c->arch == LT_ARCH_GEMMA2;
    double cap = g2 ? 50.0 : 0.0, fcap = g2 ? 30.0 : 0.0;
    LT_TRY(gg_num(ctx, s, arch, "attn_logit_softcapping", &cap));
    LT_TRY(gg_num(ctx, s, arch, "final_logit_softcapping", &fcap));
    if (!(cap >= 0) || !(fcap >= 0))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %s softcaps %g, %g must be >= 0", s->path, arch, cap, fcap);
    c->attn_softcap = (float)cap;
    c->final_softcap = (float)fcap;
    c->sliding_window = g2 ? 4096 : 0;
    LT_TRY(gg_int(ctx, s, arch, "attention.sliding_window", 0, &c->sliding_window));
    char k[160];
    snprintf(k, sizeof k, "%s.attention.sliding_window_pattern", arch);
    lt_gguf_type ty;
    if (lt_gguf_get_type(ctx, s->gg, k, &ty) == LT_OK && ty == LT_GGUF_ARRAY)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: '%s' as a per-layer list is not supported (a period)", s->path,
                        k);
    lt_ctx_clear_error(ctx);
    c->sliding_period = g2 ? 2 : 6;
    LT_TRY(gg_int(ctx, s, arch, "attention.sliding_window_pattern", 0, &c->sliding_period));
    if (!g2 && c->sliding_window > 0) {
        c->rope_local_theta = 10000.0;
        LT_TRY(gg_num(ctx, s, arch, "rope.freq_base_swa", &c->rope_local_theta));
        if (!(c->rope_local_theta > 0))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: %s.rope.freq_base_swa must be positive", s->path, arch);
    }
    c->mlp = LT_MLP_KIND_GEGLU;
    c->norm_place = LT_NORM_PLACE_SANDWICH;
    c->norm_plus_one = 0;
    c->embed_scale = (float)sqrt((double)c->C);
    int big = c->L == (g2 ? 46 : 62);
    c->query_scale = 1.0 / sqrt(big ? (double)(c->C / c->H) : (double)c->D);
    return LT_OK;
}

/* Experts as llama.cpp's converter writes them: {arch}.expert_count, expert_used_count and
 * expert_feed_forward_length (default feed_forward_length: Mixtral), the top-k weights
 * renormalised as llama.cpp runs both families; a llama-arch file with experts is Mixtral. A
 * layer without blk.N.ffn_gate_inp.weight keeps a dense MLP. The file carries no aux-loss
 * coefficient (0). */
static lt_status gguf_moe(lt_ctx *ctx, source *s, const char *arch, lt_model_config *c) {
    int64_t E = 0, k = 0, F = c->F;
    LT_TRY(gg_int(ctx, s, arch, "expert_count", 0, &E));
    if (E == 0) {
        if (c->arch == LT_ARCH_QWEN3_MOE || c->arch == LT_ARCH_QWEN2_MOE)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s.expert_count' is missing or 0", s->path, arch);
        return LT_OK;
    }
    LT_TRY(gg_int(ctx, s, arch, "expert_used_count", 1, &k));
    LT_TRY(gg_int(ctx, s, arch, "expert_feed_forward_length", 0, &F));
    if (E > LT_MOE_MAX_EXPERTS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s.expert_count' = %lld is above %d", s->path, arch,
                        (long long)E, LT_MOE_MAX_EXPERTS);
    if (k < 1 || k > E)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s.expert_used_count' = %lld is outside 1..%lld", s->path,
                        arch, (long long)k, (long long)E);
    if (F <= 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s.expert_feed_forward_length' = %lld must be positive",
                        s->path, arch, (long long)F);
    if (c->arch == LT_ARCH_LLAMA || c->arch == LT_ARCH_MISTRAL) c->arch = LT_ARCH_MIXTRAL;
    else if (c->arch != LT_ARCH_QWEN3_MOE && c->arch != LT_ARCH_QWEN2_MOE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: GGUF architecture '%s' with experts is not supported", s->path,
                        arch);
    c->n_experts = E, c->n_experts_used = k, c->moe_F = F, c->moe_norm_topk = 1, c->moe_every = 1;
    if (c->arch == LT_ARCH_QWEN2_MOE) { /* llama.cpp's qwen2moe: no renormalisation, a gated shared expert */
        c->moe_norm_topk = 0;
        LT_TRY(gg_int(ctx, s, arch, "expert_shared_feed_forward_length", 1, &c->moe_shared_F));
    }
    if (c->L > LT_MODEL_MAX_LAYERS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s.block_count' = %lld is above %d", s->path, arch,
                        (long long)c->L, LT_MODEL_MAX_LAYERS);
    for (int64_t l = 0; l < c->L; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)l);
        lt_tensor t;
        if (lt_gguf_find_tensor(ctx, s->gg, name, &t) == LT_OK) continue;
        lt_ctx_clear_error(ctx);
        if (l >= LT_MODEL_MAX_MIXED_LAYERS)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: layer %lld has no router '%s' (dense layers only below %d)",
                            s->path, (long long)l, name, LT_MODEL_MAX_MIXED_LAYERS);
        c->moe_dense[l] = 1;
    }
    return LT_OK;
}

static lt_status config_from_gguf(lt_ctx *ctx, source *s, lt_model_config *c) {
    const char *a;
    size_t alen;
    LT_TRY(lt_gguf_get_str(ctx, s->gg, "general.architecture", &a, &alen));
    char arch[32];
    if (alen >= sizeof arch) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: architecture name too long", s->path);
    memcpy(arch, a, alen);
    arch[alen] = 0;
    if (!strcmp(arch, "llama")) c->arch = LT_ARCH_LLAMA;
    else if (!strcmp(arch, "qwen2")) c->arch = LT_ARCH_QWEN2;
    else if (!strcmp(arch, "qwen3")) c->arch = LT_ARCH_QWEN3;
    else if (!strcmp(arch, "phi3")) c->arch = LT_ARCH_PHI3;
    else if (!strcmp(arch, "gemma2")) c->arch = LT_ARCH_GEMMA2;
    else if (!strcmp(arch, "gemma3")) c->arch = LT_ARCH_GEMMA3;
    else if (!strcmp(arch, "qwen3moe")) c->arch = LT_ARCH_QWEN3_MOE;
    else if (!strcmp(arch, "qwen2moe")) c->arch = LT_ARCH_QWEN2_MOE;
    else
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: GGUF architecture '%s' is not supported (llama, qwen2, qwen3, phi3, gemma2, gemma3, "
                        "qwen3moe, qwen2moe)",
                        s->path, arch);
    LT_TRY(gg_int(ctx, s, arch, "block_count", 1, &c->L));
    LT_TRY(gg_int(ctx, s, arch, "embedding_length", 1, &c->C));
    LT_TRY(gg_int(ctx, s, arch, "feed_forward_length", 1, &c->F));
    LT_TRY(gg_int(ctx, s, arch, "attention.head_count", 1, &c->H));
    c->Hkv = c->H;
    LT_TRY(gg_int(ctx, s, arch, "attention.head_count_kv", 0, &c->Hkv));
    if (c->H <= 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s.attention.head_count' = %lld: no attention heads",
                        s->path, arch, (long long)c->H);
    c->D = c->C / c->H;
    LT_TRY(gg_int(ctx, s, arch, "attention.key_length", 0, &c->D));
    if (c->D <= 0)
        return lt_error(ctx, LT_ERR_FORMAT,
                        "%s: head dim %lld (metadata '%s.attention.key_length', or embedding_length %lld / head_count "
                        "%lld) is not positive",
                        s->path, (long long)c->D, arch, (long long)c->C, (long long)c->H);
    int64_t rope_dim = c->D;
    LT_TRY(gg_int(ctx, s, arch, "rope.dimension_count", 0, &rope_dim));
    if (rope_dim != c->D)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: partial RoPE (%lld of the head's %lld dims) is not supported",
                        s->path, (long long)rope_dim, (long long)c->D);
    c->max_positions = 2048;
    LT_TRY(gg_int(ctx, s, arch, "context_length", 0, &c->max_positions));
    c->rope_theta = 10000.0;
    LT_TRY(gg_num(ctx, s, arch, "rope.freq_base", &c->rope_theta));
    double eps = 1e-6;
    LT_TRY(gg_num(ctx, s, arch, "attention.layer_norm_rms_epsilon", &eps));
    if (!(eps > 0 && eps <= LT_MODEL_MAX_RMS_EPS)) /* before the float conversion */
        return lt_error(ctx, LT_ERR_FORMAT,
                        "%s: metadata '%s.attention.layer_norm_rms_epsilon' = %g is outside (0, %g]", s->path, arch,
                        eps, LT_MODEL_MAX_RMS_EPS);
    c->rms_eps = (float)eps;
    /* A sliding window (Mistral v0.1 as llama, Phi-3); 0 = full attention. A llama-arch GGUF with
     * one is Mistral. */
    LT_TRY(gg_int(ctx, s, arch, "attention.sliding_window", 0, &c->sliding_window));
    if (c->arch == LT_ARCH_LLAMA && c->sliding_window > 0) c->arch = LT_ARCH_MISTRAL;
    LT_TRY(gguf_moe(ctx, s, arch, c));
    c->qkv_bias = c->arch == LT_ARCH_QWEN2 || c->arch == LT_ARCH_QWEN2_MOE;
    c->qk_norm = c->arch == LT_ARCH_QWEN3 || c->arch == LT_ARCH_GEMMA3 || c->arch == LT_ARCH_QWEN3_MOE;
    if (c->arch == LT_ARCH_GEMMA2 || c->arch == LT_ARCH_GEMMA3) LT_TRY(gemma_from_gguf(ctx, s, arch, c));
    s->permute_qk = c->arch == LT_ARCH_LLAMA || c->arch == LT_ARCH_MISTRAL || c->arch == LT_ARCH_MIXTRAL;
    s->fused = c->arch == LT_ARCH_PHI3;
    LT_TRY(gguf_rope(ctx, s, arch, c));
    LT_TRY(gguf_token_ids(ctx, s, c));
    lt_tensor t;
    LT_TRY(find(ctx, s, "token_embd.weight", &t));
    c->V = t.shape[0];
    c->tie_embeddings = lt_gguf_find_tensor(ctx, s->gg, "output.weight", &t) == LT_ERR_NOT_FOUND;
    lt_ctx_clear_error(ctx);
    s->has_rope_factors = lt_gguf_find_tensor(ctx, s->gg, "rope_freqs.weight", &t) == LT_OK;
    lt_ctx_clear_error(ctx);
    char kn[9][96];
    static const char *const sfx[9] =
        {"embedding_length",     "feed_forward_length",     "block_count",
         "attention.head_count", "attention.head_count_kv", "attention.key_length",
         "context_length",       "rope.freq_base",          "attention.layer_norm_rms_epsilon"};
    lt_model_config_keys keys = {{"the rows of 'token_embd.weight' (vocab)"}};
    for (int i = 0; i < 9; i++) {
        snprintf(kn[i], sizeof kn[i], "metadata '%s.%s'", arch, sfx[i]);
        keys.name[i + 1] = kn[i];
    }
    LT_TRY(lt_model_config_check_bounds(ctx, s->path, c, &keys));
    return LT_OK;
}

/* ---- RoPE scaling and token ids from GGUF metadata ---- */

/* rope_factors_short/long.weight (Phi-3 longrope): D/2 f32 factors each. */
static lt_status gguf_factors(lt_ctx *ctx, const source *s, const char *name, int64_t half, float *out) {
    lt_tensor t;
    LT_TRY(find(ctx, s, name, &t));
    if (t.dtype != LT_DTYPE_F32 || lt_tensor_numel(&t) != half || half > LT_ROPE_MAX_FACTORS)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: '%s' must hold %lld f32 factors (at most %d)", s->path, name,
                        (long long)half, LT_ROPE_MAX_FACTORS);
    for (int64_t i = 0; i < half; i++) {
        out[i] = ((const float *)t.data)[i];
        if (!(out[i] > 0) || !isfinite(out[i]))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: '%s'[%lld] = %g must be positive", s->path, name, (long long)i,
                            (double)out[i]);
    }
    return LT_OK;
}

/* {arch}.rope.scaling.*: none, linear, yarn (factor, original context, attention factor, betas),
 * longrope; Phi-3's longrope is its factor tensors without a scaling type (as llama.cpp writes
 * it). */
static lt_status gguf_rope(lt_ctx *ctx, source *s, const char *arch, lt_model_config *c) {
    char k[160];
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
    const char *st = "none";
    size_t sl = 4;
    lt_status r = lt_gguf_get_str(ctx, s->gg, k, &st, &sl);
    if (r != LT_OK && r != LT_ERR_NOT_FOUND) return r;
    lt_ctx_clear_error(ctx);
    lt_tensor t;
    int longrope = lt_gguf_find_tensor(ctx, s->gg, "rope_factors_long.weight", &t) == LT_OK;
    lt_ctx_clear_error(ctx);
    if (longrope && r == LT_ERR_NOT_FOUND) {
        st = "longrope";
        sl = 8;
    }
    c->rope_scaling = LT_ROPE_SCALING_NONE;
    if (sl == 4 && !memcmp(st, "none", 4)) return LT_OK;
    if (sl == 6 && !memcmp(st, "linear", 6)) c->rope_scaling = LT_ROPE_SCALING_LINEAR;
    else if (sl == 4 && !memcmp(st, "yarn", 4)) c->rope_scaling = LT_ROPE_SCALING_YARN;
    else if (sl == 8 && !memcmp(st, "longrope", 8)) c->rope_scaling = LT_ROPE_SCALING_LONGROPE;
    else
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: metadata '%s' = '%.*s' is not supported (none, linear, yarn, longrope)", s->path, k,
                        (int)sl, st);
    c->rope_original_ctx = c->max_positions;
    LT_TRY(gg_int(ctx, s, arch, "rope.scaling.original_context_length", 0, &c->rope_original_ctx));
    c->rope_factor = 0;
    LT_TRY(gg_num(ctx, s, arch, "rope.scaling.factor", &c->rope_factor));
    if (c->rope_factor == 0 && c->rope_original_ctx > 0)
        c->rope_factor = (double)c->max_positions / (double)c->rope_original_ctx;
    LT_TRY(gg_num(ctx, s, arch, "rope.scaling.attn_factor", &c->rope_attn_factor));
    if (c->rope_scaling == LT_ROPE_SCALING_YARN) {
        /* llama.cpp multiplies rope.scaling.attn_factor onto YaRN's own 0.1·ln(factor) + 1 */
        if (c->rope_attn_factor > 0 && c->rope_factor > 1) c->rope_attn_factor *= 0.1 * log(c->rope_factor) + 1.0;
        LT_TRY(gg_num(ctx, s, arch, "rope.scaling.yarn_beta_fast", &c->rope_beta_fast));
        LT_TRY(gg_num(ctx, s, arch, "rope.scaling.yarn_beta_slow", &c->rope_beta_slow));
        double mul = 0;
        LT_TRY(gg_num(ctx, s, arch, "rope.scaling.yarn_log_multiplier", &mul));
        if (mul != 0 && c->rope_attn_factor == 0)
            c->rope_attn_factor = c->rope_factor <= 1 ? 1 : 1 + mul * log(c->rope_factor);
    }
    if (c->rope_scaling == LT_ROPE_SCALING_LONGROPE) {
        c->rope_n_factors = c->D / 2;
        LT_TRY(gguf_factors(ctx, s, "rope_factors_long.weight", c->D / 2, c->rope_long_factor));
        LT_TRY(gguf_factors(ctx, s, "rope_factors_short.weight", c->D / 2, c->rope_short_factor));
    }
    char where[4300];
    snprintf(where, sizeof where, "%s: %s.rope.scaling", s->path, arch);
    return lt_model_rope_check(ctx, where, c);
}

/* bos, and every end id the metadata names: eos, eot (end of turn), eom (end of message). */
static lt_status gguf_token_ids(lt_ctx *ctx, const source *s, lt_model_config *c) {
    static const char *const keys[3] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                        "tokenizer.ggml.eom_token_id"};
    int64_t id;
    c->bos_id = c->eos_id = -1;
    c->n_eos = 0;
    lt_status r = lt_gguf_get_i64(ctx, s->gg, "tokenizer.ggml.bos_token_id", &id);
    if (r == LT_OK && id >= 0 && id <= INT32_MAX) c->bos_id = (int32_t)id;
    lt_ctx_clear_error(ctx);
    for (int k = 0; k < 3; k++) {
        r = lt_gguf_get_i64(ctx, s->gg, keys[k], &id);
        lt_ctx_clear_error(ctx);
        if (r == LT_ERR_NOT_FOUND) continue;
        if (r != LT_OK || id < 0 || id > INT32_MAX)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata '%s' must be a token id", s->path, keys[k]);
        int seen = 0;
        for (int i = 0; i < c->n_eos; i++) seen |= c->eos_ids[i] == (int32_t)id;
        if (!seen && c->n_eos < LT_MAX_EOS) c->eos_ids[c->n_eos++] = (int32_t)id;
    }
    if (c->n_eos) c->eos_id = c->eos_ids[0];
    return LT_OK;
}

static int64_t proj_in(const lt_model_config *c, lt_proj k) {
    int64_t o, in;
    lt_model_proj_shape(c, k, &o, &in);
    return in;
}

/* Dtype a projection tensor is held in, from the file's: dense ones quantized under q (not
 * LT_DTYPE_F32), block ones as they are; under LT_DTYPE_FP8 every one not skipped as fp8. */
static lt_dtype held_proj(lt_dtype file, lt_dtype q, int64_t in, int skipped) {
    if (q == LT_DTYPE_FP8) return skipped ? file : LT_DTYPE_FP8; /* from any dtype the load reads */
    if (q != LT_DTYPE_F32 && (file == LT_DTYPE_F32 || file == LT_DTYPE_BF16 || file == LT_DTYPE_F16))
        return lt_dtype_quantize_target(q, in);
    return file;
}

/* The formats --quantize offers (lt_quantize_row has a quantizer for each). */
static int quantize_dtype_ok(lt_dtype q) {
    return q == LT_DTYPE_F32 || q == LT_DTYPE_INT4_G64 || q == LT_DTYPE_Q4_0 || q == LT_DTYPE_Q4_1 ||
        q == LT_DTYPE_Q8_0 || q == LT_DTYPE_Q4_K || q == LT_DTYPE_Q5_K || q == LT_DTYPE_Q6_K || q == LT_DTYPE_FP8;
}
/* The embedding and head: f16 is widened to f32 on the host (its loss reads f32, bf16 and block
 * heads). The CUDA loss reads bf16 and block heads and its GEMMs round the head to bf16 anyway,
 * so a device model holds an f32 or f16 embedding/head as bf16 (half the bytes, same products). */
static lt_dtype held_head(lt_dtype file, lt_device dev) {
    if (dev != LT_DEVICE_CPU && (file == LT_DTYPE_F32 || file == LT_DTYPE_F16)) return LT_DTYPE_BF16;
    return file == LT_DTYPE_F16 ? LT_DTYPE_F32 : file;
}

/* Gemma3ForConditionalGeneration checkpoints hold the text model under "language_model.model."
 * (transformers 4) or "model.language_model." (transformers 5) beside the vision tower, which is
 * not read; a Gemma3ForCausalLM one under "model.". */
static lt_status gemma3_prefix(lt_ctx *ctx, source *s) {
    static const char *const prefixes[] = {"language_model.model.", "model.language_model."};
    lt_tensor t;
    if (lt_safetensors_find(ctx, s->st, "model.embed_tokens.weight", &t) == LT_OK) return LT_OK;
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (lt_safetensors_find(ctx, s->st, name, &t) == LT_OK) {
            lt_ctx_clear_error(ctx);
            s->hf_prefix = prefixes[i];
            return LT_OK;
        }
    }
    lt_ctx_clear_error(ctx);
    return LT_OK; /* the missing tensor is then named by the load */
}

static lt_status open_source(lt_ctx *ctx, const char *path, const lt_model_options *opt, source *s,
                             lt_model_config *c) {
    memset(s, 0, sizeof *s);
    memset(c, 0, sizeof *c);
    s->path = path;
    s->cfg = c;
    struct stat sb;
    if (stat(path, &sb) != 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no such file or folder", path);
    if (ends_with(path, ".gguf")) {
        LT_TRY(lt_gguf_open(ctx, path, &s->gg));
        LT_TRY(config_from_gguf(ctx, s, c));
    } else {
        char dir[4096], cfgp[4200];
        snprintf(dir, sizeof dir, "%s", path);
        if (!S_ISDIR(sb.st_mode)) { /* a .safetensors or index inside the folder */
            char *slash = strrchr(dir, '/');
            if (slash) *slash = 0;
            else snprintf(dir, sizeof dir, ".");
        }
        snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
        LT_TRY(lt_model_config_read_hf(ctx, cfgp, c));
        s->fused = c->arch == LT_ARCH_PHI3;
        s->sandwich = c->norm_place == LT_NORM_PLACE_SANDWICH;
        LT_TRY(lt_safetensors_open(ctx, S_ISDIR(sb.st_mode) ? dir : path, &s->st));
        if (c->arch == LT_ARCH_GEMMA3) LT_TRY(gemma3_prefix(ctx, s));
    }
    /* Dtypes from the tensors: one per projection kind, or per (layer, kind) where the file mixes
     * them across layers (every _K_M file does); each tensor is held in its own type. */
    lt_dtype q = opt ? opt->quantize_dtype : LT_DTYPE_F32;
    if (!quantize_dtype_ok(q))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "%s: cannot quantize to %s (int4_g64, q4_0, q4_1, q8_0, q4_k, q5_k, q6_k or fp8)", path,
                        lt_dtype_name(q));
    if (q == LT_DTYPE_FP8 && c->n_experts > 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: an fp8 base is for dense models; this one has %lld experts", path,
                        (long long)c->n_experts);
    char name[256];
    lt_wpiece p;
    memset(&p, 0, sizeof p);
    lt_tensor t;
    p.kind = LT_W_PROJ;
    LT_TRY(lt_model_check_moe(ctx, c));
    if (s->st && c->n_experts > 0) { /* transformers 5's fused experts, or one tensor per expert */
        int64_t l = 0;
        while (l < c->L && !lt_model_layer_is_moe(c, l)) l++;
        snprintf(name, sizeof name, "model.layers.%lld.mlp.experts.gate_up_proj", (long long)l);
        s->moe_fused = l < c->L && lt_safetensors_find(ctx, s->st, name, &t) == LT_OK;
        lt_ctx_clear_error(ctx);
    }
    for (int k = 0; k < LT_PROJ_COUNT_; k++) {
        p.which = k;
        for (int64_t l = 0; l < c->L; l++) {
            int64_t o, in;
            lt_model_layer_proj_shape(c, l, (lt_proj)k, &o, &in);
            p.layer = l;
            p.shape[0] = o, p.shape[1] = in;
            piece_name(s, &p, name, sizeof name);
            const uint8_t *exb[LT_MOE_MAX_EXPERTS];
            LT_TRY(expert_piece(s, &p) ? find_experts(ctx, s, &p, name, sizeof name, &t, exb)
                                       : find_piece(ctx, s, &p, name, &t));
            lt_dtype held = held_proj(t.dtype, q, in, opt && (opt->fp8_skip >> k & 1u));
            if (held == LT_DTYPE_FP8 && (o % 16 || in % 16))
                return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                "%s: an fp8 base needs projections whose sides are multiples of 16; tensor '%s' is "
                                "(%lld, %lld)",
                                path, name, (long long)o, (long long)in);
            if (held == LT_DTYPE_COUNT_)
                return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                "%s: --quantize %s: tensor '%s' has rows of %lld weights, not whole %s blocks (%lld)",
                                path, lt_dtype_name(q), name, (long long)in, lt_dtype_name(q),
                                (long long)lt_dtype_block_elems(q));
            if (l == 0) {
                c->proj_dtype[k] = held;
            } else if (held != c->proj_dtype[k]) {
                if (l >= LT_MODEL_MAX_MIXED_LAYERS)
                    return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                    "%s: '%s' is %s but layer 0's is %s: dtypes can change across the first %d layers "
                                    "only",
                                    path, name, lt_dtype_name(held), lt_dtype_name(c->proj_dtype[k]),
                                    LT_MODEL_MAX_MIXED_LAYERS);
                c->layer_proj_dtype[l][k] = (uint8_t)(held + 1);
            }
        }
    }
    p.kind = LT_W_ROUTER; /* the routers' shapes, so the planner refuses what the load would */
    for (int64_t l = 0; l < c->L; l++) {
        if (!lt_model_layer_is_moe(c, l)) continue;
        p.layer = l;
        piece_name(s, &p, name, sizeof name);
        LT_TRY(find(ctx, s, name, &t));
        if (t.ndim != 2 || t.shape[0] != c->n_experts || t.shape[1] != c->C)
            return lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' has shape (%lld, %lld), expected (%lld, %lld)", path,
                            name, (long long)t.shape[0], (long long)(t.ndim > 1 ? t.shape[1] : 0),
                            (long long)c->n_experts, (long long)c->C);
    }
    p.kind = LT_W_EMBED;
    p.layer = -1;
    piece_name(s, &p, name, sizeof name);
    LT_TRY(find(ctx, s, name, &t));
    lt_device dev = opt ? opt->device : LT_DEVICE_CPU;
    c->embed_dtype = held_head(t.dtype, dev);
    c->head_dtype = c->embed_dtype;
    if (!c->tie_embeddings) {
        p.kind = LT_W_HEAD;
        piece_name(s, &p, name, sizeof name);
        LT_TRY(find(ctx, s, name, &t));
        c->head_dtype = held_head(t.dtype, dev);
    }
    return LT_OK;
}

lt_status lt_model_inspect(lt_ctx *ctx, const char *path, const lt_model_options *opt, lt_model_config *cfg) {
    source s;
    lt_status st = open_source(ctx, path, opt, &s, cfg);
    close_source(ctx, &s);
    return st;
}

/* ---- copying the weights ---- */

/* Host staging of a device load: whole rows of one piece at a time, at most this many bytes
 * (or one row when a row is larger). Large enough that a transfer's fixed cost is negligible. */
#define LOAD_STAGE_BYTES ((size_t)16 << 20)
/* Threads that encode the rows of one piece for --quantize (each with its own f32 row). */
#define LOAD_MAX_THREADS 64

typedef struct copy_job {
    lt_ctx *ctx;
    source *src;
    lt_model *m;
    uint8_t *block;
    float *row; /* widest row, for conversions: `threads` of them, row_stride floats apart */
    int64_t row_stride;
    int threads;
    uint8_t *stage; /* device loads: stage_bytes of host staging; NULL = write in place */
    size_t stage_bytes;
    lt_status status;
} copy_job;

/* Where rows [r0, r0 + n) of a piece of row size rb are converted: in place on the host, else
 * the staging buffer, which flush() then copies to the device. */
static uint8_t *rows_at(copy_job *j, uint8_t *dst, int64_t r0, size_t rb) {
    return j->stage ? j->stage : dst + (size_t)r0 * rb;
}

static void flush(copy_job *j, uint8_t *dst, int64_t r0, int64_t n, size_t rb) {
    if (!j->stage || j->status != LT_OK) return;
    j->status = j->m->be->copy_to_device(j->ctx, dst + (size_t)r0 * rb, j->stage, (size_t)n * rb);
}

/* Points the model's field for piece p at its place in the weights block. */
static void wire_piece(lt_model *m, const lt_wpiece *p, uint8_t *dst) {
    lt_tensor view = lt_tensor_view(dst, p->dtype, m->opt.device, p->ndim, p->shape);
    switch (p->kind) {
    case LT_W_EMBED:
        m->embed = view;
        if (m->cfg.tie_embeddings) m->head = view;
        break;
    case LT_W_HEAD: m->head = view; break;
    case LT_W_FINAL_NORM: m->final_norm = (float *)dst; break;
    case LT_W_INV_FREQ: m->inv_freq = (float *)dst; break;
    case LT_W_PROJ: m->layers[p->layer].w[p->which] = view; break;
    case LT_W_BIAS: m->layers[p->layer].bias[p->which] = (float *)dst; break;
    case LT_W_ATTN_NORM: m->layers[p->layer].attn_norm = (float *)dst; break;
    case LT_W_MLP_NORM: m->layers[p->layer].mlp_norm = (float *)dst; break;
    case LT_W_Q_NORM: m->layers[p->layer].q_norm = (float *)dst; break;
    case LT_W_K_NORM: m->layers[p->layer].k_norm = (float *)dst; break;
    case LT_W_INV_FREQ_LOCAL: m->inv_freq_local = (float *)dst; break;
    case LT_W_POST_ATTN_NORM: m->layers[p->layer].post_attn_norm = (float *)dst; break;
    case LT_W_POST_MLP_NORM: m->layers[p->layer].post_mlp_norm = (float *)dst; break;
    case LT_W_ROUTER: m->layers[p->layer].router = view; break;
    case LT_W_SHARED: m->layers[p->layer].shared[p->which] = view; break;
    case LT_W_SHARED_GATE: m->layers[p->layer].shared_gate = view; break;
    }
}

/* The RoPE table, computed (and divided by a GGUF's rope_freqs.weight when it has one). */
static void copy_inv_freq(copy_job *j, const lt_wpiece *p, uint8_t *dst) {
    const lt_model_config *c = &j->m->cfg;
    float *inv = (float *)rows_at(j, dst, 0, p->bytes);
    lt_model_rope_inv_freq(c, inv);
    j->m->rope_file_factors = j->src->has_rope_factors;
    if (j->src->has_rope_factors) {
        lt_tensor f;
        if ((j->status = find(j->ctx, j->src, "rope_freqs.weight", &f)) != LT_OK) return;
        if (f.dtype != LT_DTYPE_F32 || lt_tensor_numel(&f) != c->D / 2) {
            j->status = lt_error(j->ctx, LT_ERR_FORMAT, "%s: rope_freqs.weight must be f32 (%lld)", j->src->path,
                                 (long long)(c->D / 2));
            return;
        }
        for (int64_t i = 0; i < c->D / 2; i++) {
            float fi = ((const float *)f.data)[i];
            if (!(isfinite(fi) && fi > 0)) {
                j->status =
                    lt_error(j->ctx, LT_ERR_FORMAT,
                             "%s: rope_freqs.weight[%lld] = %g (a frequency factor must be finite and positive)",
                             j->src->path, (long long)i, (double)fi);
                return;
            }
            inv[i] /= fi;
        }
    }
    for (int64_t i = 0; i < c->D / 2; i++)
        if (!(isfinite(inv[i]) && inv[i] > 0)) {
            j->status = lt_error(j->ctx, LT_ERR_FORMAT, "%s: RoPE inverse frequency %lld is %g (rope_theta %g)",
                                 j->src->path, (long long)i, (double)inv[i], c->rope_theta);
            return;
        }
    flush(j, dst, 0, 1, p->bytes);
}

/* One row of cols elements from the file's dtype into the held one (d); 0 when it cannot. */
static int convert_row(float *row, lt_dtype from, lt_dtype to, const uint8_t *src, uint8_t *d, int64_t cols,
                       size_t bytes) {
    if (from == to) {
        memcpy(d, src, bytes);
    } else if (to == LT_DTYPE_F32) {
        lt_dequantize_row(from, src, (float *)d, cols);
    } else if (lt_dtype_is_quantized(to) && !lt_dtype_is_quantized(from)) { /* --quantize */
        lt_dequantize_row(from, src, row, cols);
        lt_quantize_row(to, row, d, cols);
    } else if (to == LT_DTYPE_BF16) {
        lt_dequantize_row(from, src, row, cols);
        for (int64_t i = 0; i < cols; i++) ((uint16_t *)d)[i] = lt_f32_to_bf16(row[i]);
    } else {
        return 0;
    }
    return 1;
}

/* The first non-finite element of a converted row held as `to` (cols elements), or -1. */
static int64_t nonfinite_at(float *row, lt_dtype to, const uint8_t *d, int64_t cols) {
    const float *x = (const float *)d;
    if (to != LT_DTYPE_F32) {
        lt_dequantize_row(to, d, row, cols);
        x = row;
    }
    for (int64_t i = 0; i < cols; i++)
        if (!isfinite(x[i])) return i;
    return -1;
}

/* The rows of one piece's staging round, converted on one thread or (--quantize's encodings) on
 * the load's threads, a float row each; per thread the first failing row of its range. */
typedef struct rows_job {
    copy_job *j;
    lt_dtype from, to;
    const uint8_t *data;       /* the file's tensor (not experts) */
    const uint8_t *const *exb; /* the experts' tensors, erows rows each (experts) */
    int experts, permute, check, plus_one;
    int64_t erows, D, cols, srb, drb, r0;
    uint8_t *out; /* row r0's destination */
    int failed[LOAD_MAX_THREADS];
    int64_t bad_row[LOAD_MAX_THREADS], bad_col[LOAD_MAX_THREADS];
} rows_job;

/* Row r's source: rotate-half row (h, half s, i) was stored at (h, 2i + s) when permuted. */
static const uint8_t *row_source(const rows_job *q, int64_t r) {
    int64_t sr = r;
    if (q->permute) {
        int64_t h = r / q->D, w = r % q->D, s = w / (q->D / 2), i = w % (q->D / 2);
        sr = h * q->D + 2 * i + s;
    }
    return q->experts ? q->exb[sr / q->erows] + (size_t)(sr % q->erows) * (size_t)q->srb
                      : q->data + (size_t)sr * (size_t)q->srb;
}

static void convert_rows(void *arg, int64_t begin, int64_t end, int thread) {
    rows_job *q = arg;
    float *row = q->j->row + (size_t)thread * (size_t)q->j->row_stride;
    for (int64_t k = begin; k < end; k++) {
        int64_t r = q->r0 + k;
        uint8_t *d = q->out + (size_t)k * (size_t)q->drb;
        if (!convert_row(row, q->from, q->to, row_source(q, r), d, q->cols, (size_t)q->drb)) {
            q->failed[thread] = 1;
            return;
        }
        int64_t bad = q->check ? nonfinite_at(row, q->to, d, q->cols) : -1;
        if (bad >= 0) {
            q->bad_row[thread] = r;
            q->bad_col[thread] = bad;
            return;
        }
        if (q->plus_one) /* (1 + w) once, in f32 as transformers' Gemma RMSNorm computes it */
            for (int64_t i = 0; i < q->cols; i++) ((float *)d)[i] += 1.0f;
    }
}

/* After a round of convert_rows: the first failing row's error into j->status (threads hold
 * rising ranges, so the first thread that failed has it); 1 when one failed. */
static int rows_failed(copy_job *j, const rows_job *q, int threads, const char *name) {
    for (int th = 0; th < threads; th++) {
        if (q->failed[th]) {
            j->status = lt_error(j->ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s': cannot hold %s as %s", j->src->path,
                                 name, lt_dtype_name(q->from), lt_dtype_name(q->to));
            return 1;
        }
        if (q->bad_row[th] >= 0) {
            j->status = lt_error(j->ctx, LT_ERR_FORMAT, "%s: tensor '%s': element [%lld, %lld] is not finite (%s data)",
                                 j->src->path, name, (long long)q->bad_row[th], (long long)q->bad_col[th],
                                 lt_dtype_name(q->from));
            return 1;
        }
    }
    return 0;
}

/* An fp8 projection: every row to f32 on the load's threads, then packed (lt_fp8_pack, the rows
 * on the same threads) and copied to the device in one go. */
static void copy_fp8(copy_job *j, rows_job *q, const char *name, uint8_t *dst, int64_t rows, int64_t cols) {
    lt_ctx *ctx = j->ctx;
    const size_t fb = (size_t)rows * (size_t)cols * sizeof(float),
                 pb = (size_t)rows * (size_t)lt_dtype_row_bytes(LT_DTYPE_FP8, cols);
    float *w = lt_alloc(ctx, LT_DEVICE_CPU, fb, "fp8 base: one matrix in f32");
    uint8_t *packed = j->stage && w ? lt_alloc(ctx, LT_DEVICE_CPU, pb, "fp8 base: one packed matrix") : dst;
    if (!w || !packed) {
        j->status = lt_ctx_status(ctx);
    } else {
        q->to = LT_DTYPE_F32, q->drb = cols * (int64_t)sizeof(float), q->r0 = 0, q->out = (uint8_t *)w;
        for (int th = 0; th < j->threads; th++) q->failed[th] = 0, q->bad_row[th] = -1;
        lt_parallel_for(j->threads, rows, 4, convert_rows, q);
        if (!rows_failed(j, q, j->threads, name)) {
            lt_fp8_pack(w, rows, cols, packed);
            if (j->stage) j->status = j->m->be->copy_to_device(ctx, dst, packed, pb);
        }
    }
    if (packed && packed != dst) lt_free(ctx, LT_DEVICE_CPU, packed, pb);
    if (w) lt_free(ctx, LT_DEVICE_CPU, w, fb);
}

static void copy_piece(void *arg, const lt_wpiece *p) {
    copy_job *j = arg;
    if (j->status != LT_OK) return;
    lt_ctx *ctx = j->ctx;
    uint8_t *dst = j->block + p->offset;
    wire_piece(j->m, p, dst); /* first: the head may be tied and never read */
    if (p->kind == LT_W_INV_FREQ) {
        copy_inv_freq(j, p, dst);
        return;
    }
    if (p->kind == LT_W_INV_FREQ_LOCAL) { /* the sliding layers' base, unscaled (Gemma 3) */
        lt_model_config lc = j->m->cfg;
        lc.rope_theta = lc.rope_local_theta;
        lc.rope_scaling = LT_ROPE_SCALING_NONE;
        lt_model_rope_inv_freq(&lc, (float *)rows_at(j, dst, 0, p->bytes));
        flush(j, dst, 0, 1, p->bytes);
        return;
    }
    char name[256];
    piece_name(j->src, p, name, sizeof name);
    lt_tensor t;
    const uint8_t *exb[LT_MOE_MAX_EXPERTS];
    int experts = expert_piece(j->src, p);
    j->status =
        experts ? find_experts(ctx, j->src, p, name, sizeof name, &t, exb) : find_piece(ctx, j->src, p, name, &t);
    if (j->status != LT_OK) return;
    int64_t erows = experts ? p->shape[0] / j->m->cfg.n_experts : 1;
    /* Shape: 1-D pieces must hold exactly their elements; matrices match (out, in). */
    int ok = p->ndim == 1 ? lt_tensor_numel(&t) == p->shape[0]
                          : t.ndim == 2 && t.shape[0] == p->shape[0] && t.shape[1] == p->shape[1];
    if (!ok) {
        char dims[160] = "";
        for (int k = 0, u = 0; k < t.ndim && u < (int)sizeof dims; k++) /* every dim, not the first two */
            u += snprintf(dims + u, sizeof dims - (size_t)u, "%s%lld", k ? ", " : "", (long long)t.shape[k]);
        j->status =
            lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s' has shape (%s), expected (%lld%s%.0lld)", j->src->path, name,
                     dims, (long long)p->shape[0], p->ndim > 1 ? ", " : "", (long long)(p->ndim > 1 ? p->shape[1] : 0));
        return;
    }
    int64_t rows = p->ndim == 2 ? p->shape[0] : 1, cols = p->ndim == 2 ? p->shape[1] : p->shape[0];
    int64_t srb = lt_dtype_row_bytes(t.dtype, cols), drb = lt_dtype_row_bytes(p->dtype, cols);
    if (srb < 0 || drb < 0) {
        j->status = lt_error(ctx, LT_ERR_SHAPE, "%s: tensor '%s': %lld columns are not whole %s blocks", j->src->path,
                             name, (long long)cols, lt_dtype_name(t.dtype));
        return;
    }
    int permute = j->src->permute_qk && p->kind == LT_W_PROJ && (p->which == LT_PROJ_Q || p->which == LT_PROJ_K);
    int norm_plus_one = j->m->cfg.norm_plus_one &&
        (p->kind == LT_W_FINAL_NORM || p->kind == LT_W_ATTN_NORM || p->kind == LT_W_MLP_NORM ||
         p->kind == LT_W_Q_NORM || p->kind == LT_W_K_NORM || p->kind == LT_W_POST_ATTN_NORM ||
         p->kind == LT_W_POST_MLP_NORM);
    int64_t D = j->m->cfg.D;
    int64_t chunk = rows; /* rows per staging round */
    if (j->stage)
        chunk = (int64_t)(j->stage_bytes / (size_t)drb) < rows ? (int64_t)(j->stage_bytes / (size_t)drb) : rows;
    rows_job q;
    memset(&q, 0, sizeof q);
    q.j = j, q.from = t.dtype, q.to = p->dtype, q.data = (const uint8_t *)t.data, q.exb = exb;
    q.experts = experts, q.permute = permute, q.plus_one = norm_plus_one;
    /* Every row of the norms, biases, embedding and head (one pass at load): a NaN or Inf there
     * reaches every logit. The projections are left to the loss's own check. */
    q.check = p->kind != LT_W_PROJ;
    q.erows = erows, q.D = D, q.cols = cols, q.srb = srb, q.drb = drb;
    /* --quantize's encodings go over the load's threads (the same bytes); other conversions are copies */
    if (p->dtype == LT_DTYPE_FP8) {
        copy_fp8(j, &q, name, dst, rows, cols);
        return;
    }
    const int threads = lt_dtype_is_quantized(p->dtype) && !lt_dtype_is_quantized(t.dtype) ? j->threads : 1;
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) { /* a staging round at a time */
        const int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        q.r0 = r0;
        q.out = rows_at(j, dst, r0, (size_t)drb);
        for (int th = 0; th < threads; th++) q.failed[th] = 0, q.bad_row[th] = -1;
        lt_parallel_for(threads, n, 4, convert_rows, &q);
        if (rows_failed(j, &q, threads, name)) return;
        flush(j, dst, r0, n, (size_t)drb);
        if (j->status != LT_OK) return;
    }
}

/* Wires every LoRA layer's A/B (and gradient) pointers into the flat buffers and initialises
 * the values: A uniform in [-b, b) from splitmix64 (PEFT: kaiming_uniform_(a=√5) gives bound
 * 1/√fan_in), B zeros. On a device each A is drawn into host `stage` (the largest A's size)
 * and copied over; on the host stage is NULL and A is drawn in place. */
/* n values uniform in [-bound, bound) from the stream st into dst (on the model's device), a
 * stage of stage_n floats at a time on a device (stage NULL: in place on the host). */
static lt_status draw_uniform(lt_ctx *ctx, lt_model *m, float *dst, int64_t n, float bound, uint64_t st, float *stage,
                              int64_t stage_n) {
    for (int64_t i0 = 0; i0 < n;) {
        int64_t k = stage ? (n - i0 < stage_n ? n - i0 : stage_n) : n;
        float *a = stage ? stage : dst + i0;
        for (int64_t i = 0; i < k; i++)
            a[i] = (float)(((double)(lt_splitmix64(&st) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * bound);
        if (stage) LT_TRY(m->be->copy_to_device(ctx, dst + i0, stage, (size_t)k * sizeof(float)));
        i0 += k;
    }
    return LT_OK;
}

/* Layer l's expert adapters from *p on (lt_lora_tensor's storage): gate_up A, B, then down A, B;
 * A as PEFT's kaiming_uniform_(a=√5) over fan_in = in, B zeros. */
static lt_status init_expert_lora(lt_ctx *ctx, lt_model *m, int64_t l, float **p, float *stage, int64_t stage_n) {
    const lt_model_config *c = &m->cfg;
    if (!lt_model_moe_lora_elems(c, &m->lora, l)) return LT_OK;
    lt_layer *L = &m->layers[l];
    int64_t E = c->n_experts, r = m->lora.rank;
    for (int w = 0; w < 2; w++) {
        if (!(m->lora.targets & (w ? LT_LORA_EXPERTS_DOWN : LT_LORA_EXPERTS_GATE_UP))) continue;
        int64_t in = w ? c->moe_F : c->C, nb = w ? E * c->C * r : 2 * E * c->moe_F * r;
        L->ex_a[w] = *p;
        L->ex_ga[w] = m->lora_grads + (*p - m->lora_params);
        uint64_t st = m->lora.seed ^ (((uint64_t)l << 8 | (uint64_t)(LT_PROJ_COUNT_ + w)) * 0xd1b54a32d192ed03ULL);
        LT_TRY(draw_uniform(ctx, m, *p, E * r * in, 1.0f / sqrtf((float)in), st, stage, stage_n));
        *p += E * r * in;
        L->ex_b[w] = *p;
        L->ex_gb[w] = m->lora_grads + (*p - m->lora_params);
        m->be->zero(ctx, *p, (size_t)nb * sizeof(float));
        *p += nb;
    }
    return LT_OK;
}

static lt_status init_lora(lt_ctx *ctx, lt_model *m, float *stage, size_t stage_bytes) {
    float *p = m->lora_params;
    for (int64_t l = m->l0; l < m->cfg.L; l++) {
        lt_layer *L = &m->layers[l];
        L->has_lora = 1;
        for (int k = 0; k < LT_PROJ_COUNT_; k++) {
            if (!((m->lora.targets >> k) & 1u)) continue;
            int64_t out, in, r = m->lora.rank;
            lt_model_proj_shape(&m->cfg, (lt_proj)k, &out, &in);
            int64_t off = p - m->lora_params;
            lt_proj own = lt_model_lora_owner(&m->cfg, (lt_proj)k);
            if (own != (lt_proj)k) { /* a fused module's member: the owner's A, B rows after the owner's */
                L->lora_a[k] = L->lora_a[own];
                L->grad_a[k] = L->grad_a[own];
                L->lora_b[k] = p;
                L->grad_b[k] = m->lora_grads + off;
                m->be->zero(ctx, p, (size_t)(out * r) * sizeof(float));
                p += out * r;
                continue;
            }
            L->lora_a[k] = p;
            L->grad_a[k] = m->lora_grads + off;
            uint64_t st = m->lora.seed ^ (((uint64_t)l << 8 | (uint64_t)k) * 0xd1b54a32d192ed03ULL);
            float bound = 1.0f / sqrtf((float)in), *a = stage ? stage : p;
            for (int64_t i = 0; i < r * in; i++)
                a[i] = (float)(((double)(lt_splitmix64(&st) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * bound);
            if (stage) LT_TRY(m->be->copy_to_device(ctx, p, stage, (size_t)(r * in) * sizeof(float)));
            p += r * in;
            L->lora_b[k] = p;
            L->grad_b[k] = m->lora_grads + (p - m->lora_params);
            m->be->zero(ctx, p, (size_t)(out * r) * sizeof(float));
            p += out * r;
        }
        LT_TRY(init_expert_lora(ctx, m, l, &p, stage, (int64_t)(stage_bytes / sizeof(float))));
    }
    return LT_OK;
}

void lt_model_free(lt_ctx *ctx, lt_model *m) {
    if (!m) return;
    lt_model_release_offload(ctx, m);
    for (int c = 0; c < LT_MEM_CLASS_COUNT_; c++)
        if (m->block[c]) lt_free(ctx, m->opt.device, m->block[c], m->block_bytes[c]);
    lt_model_free_inputs(ctx, m);
    lt_free(ctx, LT_DEVICE_CPU, m, lt_model_meta_bytes(&m->cfg));
}

lt_status lt_model_device_available(lt_ctx *ctx, lt_device dev) {
    if ((unsigned)dev >= LT_DEVICE_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: unknown device %d", (int)dev);
    if (dev == LT_DEVICE_CPU) return LT_OK;
    if (!lt_backend_get(dev))
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "model: device cuda requested, but this build has no CUDA backend "
                        "(it was configured without nvcc)");
    if (lt_sys_cuda().count <= 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "model: device cuda requested, but no CUDA device is visible on this "
                        "machine (driver missing or CUDA_VISIBLE_DEVICES empty)");
    return LT_OK;
}

/* The load's host buffers: one f32 row of the widest piece for conversions and, on a device, the
 * bounded staging (one such row and the largest LoRA A (r, in) always fit). */
static lt_status alloc_load_buffers(lt_ctx *ctx, const lt_model *m, int threads, float **row, size_t *row_bytes,
                                    uint8_t **stage, size_t *stage_bytes) {
    const lt_model_config *c = &m->cfg;
    int64_t widest = c->C > c->F ? c->C : c->F;
    if (c->H * c->D > widest) widest = c->H * c->D;
    if (c->moe_F > widest) widest = c->moe_F;
    if (c->moe_shared_F > widest) widest = c->moe_shared_F;
    const size_t one = (size_t)widest * sizeof(float);
    *row_bytes = one * (size_t)threads;
    if (!(*row = lt_alloc(ctx, LT_DEVICE_CPU, *row_bytes, "model load rows"))) return lt_ctx_status(ctx);
    if (m->opt.device == LT_DEVICE_CPU) return LT_OK;
    size_t sb = LOAD_STAGE_BYTES;
    if (one > sb) sb = one;
    if ((size_t)(m->lora.rank * widest) * sizeof(float) > sb) sb = (size_t)(m->lora.rank * widest) * sizeof(float);
    *stage_bytes = sb;
    if (!(*stage = lt_alloc(ctx, LT_DEVICE_CPU, sb, "model load staging"))) return lt_ctx_status(ctx);
    return LT_OK;
}

lt_status lt_model_load(lt_ctx *ctx, const char *path, const lt_model_options *opt_in, const lt_lora_options *lora,
                        lt_model **out) {
    *out = NULL;
    lt_model_options opt;
    memset(&opt, 0, sizeof opt);
    if (opt_in) opt = *opt_in;
    LT_TRY(lt_model_device_available(ctx, opt.device));
    source src;
    lt_model_config cfg;
    lt_model *m = NULL;
    float *row = NULL;
    size_t row_bytes = 0, stage_bytes = 0;
    uint8_t *stage = NULL;
    lt_status s = open_source(ctx, path, &opt, &src, &cfg);
    if (s != LT_OK) goto fail;
    if (opt.quantize_dtype != LT_DTYPE_F32)
        for (int k = 0; k < LT_PROJ_COUNT_; k++) {
            lt_dtype held = cfg.proj_dtype[k];
            if (lt_dtype_is_quantized(held) && held != opt.quantize_dtype &&
                held == lt_dtype_quantize_target(opt.quantize_dtype, proj_in(&cfg, (lt_proj)k)))
                LT_INFO("--quantize %s: %s rows of %lld weights are not whole %s blocks; held as %s",
                        lt_dtype_name(opt.quantize_dtype), lt_proj_name((lt_proj)k),
                        (long long)proj_in(&cfg, (lt_proj)k), lt_dtype_name(opt.quantize_dtype), lt_dtype_name(held));
        }
    if (opt.quantize_dtype == LT_DTYPE_FP8 && opt.fp8_skip)
        for (int k = 0; k < LT_PROJ_COUNT_; k++)
            if (opt.fp8_skip >> k & 1u) {
                int mixed = 0;
                for (int l = 0; l < LT_MODEL_MAX_MIXED_LAYERS; l++) mixed |= cfg.layer_proj_dtype[l][k] != 0;
                LT_INFO("fp8 base: %s held as the file holds it (%s%s)", lt_proj_name((lt_proj)k),
                        lt_dtype_name(cfg.proj_dtype[k]), mixed ? " in layer 0, others by layer" : "");
            }
    lt_layout lay;
    if ((s = lt_model_layout(ctx, &cfg, lora, NULL, &lay)) != LT_OK) goto fail;
    m = lt_calloc(ctx, LT_DEVICE_CPU, lt_model_meta_bytes(&cfg), "model bookkeeping");
    if (!m) {
        s = lt_ctx_status(ctx);
        goto fail;
    }
    m->cfg = cfg;
    m->layers = (lt_layer *)(m + 1);
    for (int64_t l = 0; l < cfg.L; l++) lt_model_describe_layer(&cfg, l, &m->layers[l].desc);
    m->opt = opt;
    m->be = lt_backend_get(opt.device);
    m->lora = lt_model_resolve_lora(&cfg, lora);
    m->lora_scale = m->lora.alpha / (float)m->lora.rank;
    m->l0 = cfg.L - m->lora.num_layers;
    m->lay = lay;
    static const char *const what[3] = {"model weights", "lora parameters", "lora gradients"};
    for (int c = 0; c < 3; c++) {
        m->block[c] = lt_alloc(ctx, opt.device, lay.class_bytes[c] ? lay.class_bytes[c] : 1, what[c]);
        if (!m->block[c]) {
            s = lt_ctx_status(ctx);
            goto fail;
        }
        m->block_bytes[c] = lay.class_bytes[c] ? lay.class_bytes[c] : 1;
    }
    m->lora_params = (float *)m->block[LT_MEM_LORA];
    m->lora_grads = (float *)m->block[LT_MEM_GRADS];
    /* one conversion row per thread when --quantize encodes rows on the load's threads */
    int load_threads = opt.quantize_dtype != LT_DTYPE_F32 ? lt_parallel_threads(lt_ctx_threads(ctx)) : 1;
    if (load_threads > LOAD_MAX_THREADS) load_threads = LOAD_MAX_THREADS;
    if (load_threads < 1) load_threads = 1;
    if ((s = alloc_load_buffers(ctx, m, load_threads, &row, &row_bytes, &stage, &stage_bytes)) != LT_OK) goto fail;
    copy_job job = {ctx,
                    &src,
                    m,
                    m->block[LT_MEM_WEIGHTS],
                    row,
                    (int64_t)(row_bytes / sizeof(float)) / load_threads,
                    load_threads,
                    stage,
                    stage_bytes,
                    LT_OK};
    lt_model_weights_walk(&m->cfg, copy_piece, &job);
    if ((s = job.status) != LT_OK) goto fail;
    if ((s = init_lora(ctx, m, (float *)stage, stage_bytes)) != LT_OK) goto fail;
    lt_model_zero_grads(m);
    if ((s = m->be->synchronize(ctx)) != LT_OK) goto fail;
    lt_free(ctx, LT_DEVICE_CPU, row, row_bytes);
    if (stage) lt_free(ctx, LT_DEVICE_CPU, stage, stage_bytes);
    close_source(ctx, &src);
    *out = m;
    return LT_OK;
fail:
    if (row) lt_free(ctx, LT_DEVICE_CPU, row, row_bytes);
    if (stage) lt_free(ctx, LT_DEVICE_CPU, stage, stage_bytes);
    close_source(ctx, &src);
    lt_model_free(ctx, m);
    return s;
}
