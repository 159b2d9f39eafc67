/* The KV cache and the incremental forward (include/longtune/kv_cache.h): the layer list run over
 * only the new tokens of each row, through the backend's ops as layer.c runs a layer (norm, q/k/v
 * with biases and LoRA, the per-head q/k norm, RoPE from the layer's table, attention with the
 * layer's window, softcap and query scale, o, the SwiGLU or GeGLU MLP, and with sandwich norms the
 * post-attention and post-MLP norms of the blocks' outputs), the embedding rows scaled as the
 * model's are, and the keys and values of every layer written into the cache rows after RoPE.
 * Fresh prompts attend with the flash attention of training over the packed prompts; anything
 * after cached positions with decode attention over the cache. Only the last new token of each
 * row goes through the final norm, the head and the final-logit softcap. Not a training path: no
 * stores, no backward. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/ctx_state.h"
#include "core/fastmath.h"
#include "longtune/alloc.h"
#include "longtune/kv_cache.h"
#include "model/model_internal.h"

struct lt_kv_cache {
    lt_model *m;
    const lt_backend *be;
    lt_device dev;
    int64_t B, ctx_len, n_max;
    int threads;
    int64_t *len; /* (B) host */
    uint8_t *kv;  /* (L, 2, B, ctx, Hkv, D) f32 on the device */
    size_t kv_bytes;
    uint8_t *scr; /* scratch on the device, carved below */
    size_t scr_bytes;
    float *x, *h, *q, *k, *v, *att, *lse, *g, *u, *a, *lu, *rstd, *rstd_qk, *logits;
    int32_t *d_tok, *d_pos, *d_seq, *d_len, *d_offs;
    void *mm_ws, *attn_ws, *dec_ws;
    lt_moe_layout moe; /* MoE layers' dispatch buffers in the scratch block (offsets from scr) */
    size_t attn_ws_bytes, mm_ws_bytes;
    int bf16x;       /* prefill passes: bf16 products (lt_kv_cache_options.bf16_products) */
    int32_t *h_ints; /* host staging of tok, pos, seq, len, offs: (4·n_max + B + 1) */
    size_t h_ints_bytes;
};

static size_t up(size_t b) { return (b + 255) & ~(size_t)255; }

lt_status lt_kv_cache_bytes(lt_ctx *ctx, const lt_model_config *c, int64_t B, int64_t ctx_len, size_t *bytes) {
    if (B < 1 || ctx_len < 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: rows %lld and context %lld must be >= 1", (long long)B,
                        (long long)ctx_len);
    double d = (double)c->L * 2.0 * (double)B * (double)ctx_len * (double)c->Hkv * (double)c->D * 4.0;
    if (d > 1e18 || c->L < 1 || c->Hkv < 1 || c->D < 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: %lld rows of %lld positions overflow", (long long)B,
                        (long long)ctx_len);
    *bytes = (size_t)c->L * 2 * (size_t)B * (size_t)ctx_len * (size_t)c->Hkv * (size_t)c->D * sizeof(float);
    return LT_OK;
}

/* The flash attention parameters of one packed pass of n tokens in S prompts of layer desc d. */
static lt_attention_params prefill_params(const lt_kv_cache *c, const lt_layer_desc *d, int64_t n, int64_t S,
                                          const int32_t *offs_host) {
    const lt_model_config *cf = &c->m->cfg;
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = 1, ap.T = n, ap.H = cf->H, ap.Hkv = cf->Hkv, ap.D = d->D;
    ap.dtype = LT_DTYPE_F32;
    ap.device = c->dev;
    ap.impl = LT_ATTENTION_AUTO;
    ap.window = d->window;
    ap.softcap = d->softcap;
    ap.scale = (float)cf->query_scale; /* 0: 1/sqrt(D) */
    ap.seq_offsets = offs_host;
    ap.seq_offsets_device = c->dev == LT_DEVICE_CPU ? NULL : c->d_offs;
    ap.S = S;
    ap.bf16_products = c->bf16x;
    return ap;
}

static lt_decode_attention_params decode_params(const lt_kv_cache *c, const lt_layer_desc *d, int64_t n) {
    const lt_model_config *cf = &c->m->cfg;
    lt_decode_attention_params p;
    memset(&p, 0, sizeof p);
    p.n = n, p.H = cf->H, p.Hkv = cf->Hkv, p.D = d->D, p.ctx = c->ctx_len, p.max_len = c->ctx_len;
    p.scale = cf->query_scale != 0 ? (float)cf->query_scale : 1.0f / sqrtf((float)d->D);
    p.softcap = d->softcap;
    p.window = d->window;
    p.seq = c->d_seq, p.len = c->d_len;
    p.workspace = c->dec_ws;
    return p;
}

lt_status lt_kv_cache_new(lt_ctx *ctx, lt_model *m, int64_t B, int64_t ctx_len, int64_t n_max, lt_kv_cache **out,
                          size_t *out_bytes) {
    const lt_kv_cache_options o = {.B = B, .ctx_len = ctx_len, .n_max = n_max};
    return lt_kv_cache_create(ctx, m, &o, out, out_bytes);
}

lt_status lt_kv_cache_create(lt_ctx *ctx, lt_model *m, const lt_kv_cache_options *opt, lt_kv_cache **out,
                             size_t *out_bytes) {
    *out = NULL;
    const int64_t B = opt->B, ctx_len = opt->ctx_len;
    int64_t n_max = opt->n_max;
    int bf16x;
    LT_TRY(lt_model_bf16x(ctx, "kv cache", opt->bf16_products, m->opt.device, m->be, &bf16x));
    const lt_model_config *cf = &m->cfg;
    size_t kvb;
    LT_TRY(lt_kv_cache_bytes(ctx, cf, B, ctx_len, &kvb));
    if (ctx_len > INT32_MAX / 2)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: context %lld exceeds the int32 positions",
                        (long long)ctx_len);
    if (cf->max_positions > 0 && ctx_len > cf->max_positions)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: context %lld exceeds the model's max_positions %lld",
                        (long long)ctx_len, (long long)cf->max_positions);
    if (n_max <= 0) n_max = ctx_len;
    if (n_max > ctx_len * B) n_max = ctx_len * B;
    const lt_backend *be = m->be;
    for (int64_t l = 0; l < cf->L; l++) {
        const lt_layer_desc *d = &m->layers[l].desc;
        if ((d->mlp != LT_MLP_KIND_SWIGLU && d->mlp != LT_MLP_KIND_GEGLU && d->mlp != LT_MLP_KIND_MOE) ||
            (d->norm != LT_NORM_PLACE_PRE && d->norm != LT_NORM_PLACE_SANDWICH) ||
            (d->mlp == LT_MLP_KIND_MOE && d->norm != LT_NORM_PLACE_PRE) || (d->rope != 0 && d->rope != 1) ||
            (d->rope == 1 && !m->inv_freq_local))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "kv cache: generation does not run layer %lld's %s MLP, %s norms or RoPE table %d "
                            "(train and eval do)",
                            (long long)l, lt_mlp_kind_name(d->mlp), lt_norm_place_name(d->norm), d->rope);
        lt_op_query q = {LT_OP_DECODE_ATTENTION, LT_DTYPE_F32, LT_DTYPE_F32, 0, d->D, d->window, d->softcap};
        LT_TRY(lt_backend_supports(ctx, m->opt.device, &q));
    }
    lt_kv_cache *c = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *c, "kv cache");
    if (!c) return lt_ctx_status(ctx);
    c->m = m, c->be = be, c->dev = m->opt.device, c->B = B, c->ctx_len = ctx_len, c->n_max = n_max;
    c->threads = lt_ctx_threads(ctx);
    c->bf16x = bf16x;
    lt_status s = LT_OK;
    int64_t n = n_max, C = cf->C, F = cf->F, qd = cf->H * cf->D, kvd = cf->Hkv * cf->D, r = m->lora.rank;
    /* the scratch pieces: f32 activations, then int32 inputs, then the workspaces */
    size_t off = 0, o_x, o_h, o_q, o_k, o_v, o_att, o_lse, o_g, o_u, o_a, o_lu, o_rstd, o_rqk, o_lg, o_ints, o_mm, o_at,
           o_dec;
    size_t f = sizeof(float);
#define PIECE(o, bytes) (o = off, off += up(bytes))
    PIECE(o_x, (size_t)(n * C) * f);
    PIECE(o_h, (size_t)(n * C) * f);
    PIECE(o_q, (size_t)(n * qd + qd + 2 * kvd) * f); /* + room for q, k, v of one token side by side */
    PIECE(o_k, (size_t)(n * kvd) * f);
    PIECE(o_v, (size_t)(n * kvd) * f);
    PIECE(o_att, (size_t)(n * qd) * f);
    PIECE(o_lse, (size_t)(n * cf->H) * f);
    PIECE(o_g, (size_t)((n + 1) * F) * f); /* + room for gate and up of one token side by side */
    PIECE(o_u, (size_t)(n * F) * f);
    PIECE(o_a, (size_t)(n * F) * f);
    PIECE(o_lu, (size_t)(n * (r > 0 ? r : 1)) * f);
    PIECE(o_rstd, (size_t)n * f);
    PIECE(o_rqk, (size_t)(n * cf->H) * f);
    PIECE(o_lg, (size_t)(B * cf->V) * f);
    size_t n_ints = (size_t)(4 * n + B + 1);
    PIECE(o_ints, n_ints * sizeof(int32_t));
    size_t mmb =
        be->matmul_workspace_bytes(cf->tie_embeddings ? cf->embed_dtype : cf->head_dtype, cf->V, C, n, c->threads);
    for (int p = 0; p < LT_PROJ_COUNT_; p++) {
        int64_t po, pi;
        lt_model_proj_shape(cf, (lt_proj)p, &po, &pi);
        size_t b = be->matmul_workspace_bytes(cf->proj_dtype[p], po, pi, n, c->threads);
        if (b > mmb) mmb = b;
        if (c->bf16x && n > LT_MATVEC_MAX_N &&
            (b = be->matmul_bf16x_workspace_bytes(cf->proj_dtype[p], po, pi, n, c->threads)) > mmb)
            mmb = b;
    }
    /* the fused one-token groups (proj_group): q, k, v and gate, up as one weight */
    int64_t oq, ok, ov, og, ou, iq, ig;
    lt_model_proj_shape(cf, LT_PROJ_Q, &oq, &iq), lt_model_proj_shape(cf, LT_PROJ_K, &ok, &iq);
    lt_model_proj_shape(cf, LT_PROJ_V, &ov, &iq), lt_model_proj_shape(cf, LT_PROJ_GATE, &og, &ig);
    lt_model_proj_shape(cf, LT_PROJ_UP, &ou, &ig);
    size_t fb = be->matmul_workspace_bytes(cf->proj_dtype[LT_PROJ_Q], oq + ok + ov, iq, 1, c->threads);
    if (fb > mmb) mmb = fb;
    fb = be->matmul_workspace_bytes(cf->proj_dtype[LT_PROJ_GATE], og + ou, ig, 1, c->threads);
    if (fb > mmb) mmb = fb;
    lt_model_run_options mro = {0}; /* MoE layers: the dispatch buffers for n tokens, forward only */
    off = up(off);
    if ((s = lt_model_moe_layout(ctx, cf, &m->lora, &mro, be, n, 0, 0, c->threads, 256, &off, &c->moe)) != LT_OK) {
        lt_kv_cache_free(ctx, c);
        return s;
    }
    off = up(off);
    if (c->moe.mm_ws_bytes > mmb) mmb = c->moe.mm_ws_bytes;
    PIECE(o_mm, mmb);
    int32_t offs_probe[2] = {0, (int32_t)n};
    size_t atb = 0, decb = 0;
    for (int64_t l = 0; l < cf->L; l++) {
        lt_attention_params ap = prefill_params(c, &m->layers[l].desc, n, 1, offs_probe);
        size_t b = lt_attention_workspace_bytes(&ap, 0, c->threads);
        if (b > atb) atb = b;
        lt_decode_attention_params dp = decode_params(c, &m->layers[l].desc, n);
        b = be->decode_attention_workspace_bytes(&dp, c->threads);
        if (b > decb) decb = b;
    }
    PIECE(o_at, atb);
    PIECE(o_dec, decb);
#undef PIECE
    c->attn_ws_bytes = atb;
    c->kv_bytes = kvb, c->scr_bytes = off;
    c->h_ints_bytes = n_ints * sizeof(int32_t);
    if (!(c->len = lt_calloc(ctx, LT_DEVICE_CPU, (size_t)B * sizeof(int64_t), "kv cache lengths")) ||
        !(c->h_ints = lt_alloc(ctx, LT_DEVICE_CPU, c->h_ints_bytes, "kv cache input staging")) ||
        !(c->kv = lt_alloc(ctx, c->dev, kvb, "kv cache")) ||
        !(c->scr = lt_alloc(ctx, c->dev, c->scr_bytes, "kv cache scratch"))) {
        s = lt_ctx_status(ctx);
        lt_kv_cache_free(ctx, c);
        return s;
    }
    uint8_t *S0 = c->scr;
    c->x = (float *)(S0 + o_x), c->h = (float *)(S0 + o_h), c->q = (float *)(S0 + o_q), c->k = (float *)(S0 + o_k);
    c->v = (float *)(S0 + o_v), c->att = (float *)(S0 + o_att), c->lse = (float *)(S0 + o_lse);
    c->g = (float *)(S0 + o_g), c->u = (float *)(S0 + o_u), c->a = (float *)(S0 + o_a), c->lu = (float *)(S0 + o_lu);
    c->rstd = (float *)(S0 + o_rstd), c->rstd_qk = (float *)(S0 + o_rqk), c->logits = (float *)(S0 + o_lg);
    int32_t *ints = (int32_t *)(S0 + o_ints);
    c->d_tok = ints, c->d_pos = ints + n, c->d_seq = ints + 2 * n, c->d_len = ints + 3 * n, c->d_offs = ints + 4 * n;
    c->mm_ws = mmb ? S0 + o_mm : NULL;
    c->mm_ws_bytes = mmb;
    c->attn_ws = atb ? S0 + o_at : NULL;
    c->dec_ws = decb ? S0 + o_dec : NULL;
    if (out_bytes)
        *out_bytes = lt_alloc_accounted_size(c->dev, kvb) + lt_alloc_accounted_size(c->dev, c->scr_bytes) +
            lt_alloc_accounted_size(LT_DEVICE_CPU, c->h_ints_bytes) +
            lt_alloc_accounted_size(LT_DEVICE_CPU, (size_t)B * sizeof(int64_t)) +
            lt_alloc_accounted_size(LT_DEVICE_CPU, sizeof *c);
    *out = c;
    return LT_OK;
}

void lt_kv_cache_free(lt_ctx *ctx, lt_kv_cache *c) {
    if (!c) return;
    if (c->scr) lt_free(ctx, c->dev, c->scr, c->scr_bytes);
    if (c->kv) lt_free(ctx, c->dev, c->kv, c->kv_bytes);
    if (c->h_ints) lt_free(ctx, LT_DEVICE_CPU, c->h_ints, c->h_ints_bytes);
    if (c->len) lt_free(ctx, LT_DEVICE_CPU, c->len, (size_t)c->B * sizeof(int64_t));
    lt_free(ctx, LT_DEVICE_CPU, c, sizeof *c);
}

int64_t lt_kv_cache_length(const lt_kv_cache *c, int64_t seq) { return seq >= 0 && seq < c->B ? c->len[seq] : 0; }
int64_t lt_kv_cache_context(const lt_kv_cache *c) { return c->ctx_len; }
const lt_model_config *lt_kv_cache_config(const lt_kv_cache *c) { return &c->m->cfg; }

lt_status lt_kv_cache_truncate(lt_ctx *ctx, lt_kv_cache *c, int64_t seq, int64_t len) {
    if (seq < 0 || seq >= c->B || len < 0 || len > c->len[seq])
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: truncating row %lld to %lld (rows %lld, length %lld)",
                        (long long)seq, (long long)len, (long long)c->B,
                        seq >= 0 && seq < c->B ? (long long)c->len[seq] : -1LL);
    c->len[seq] = len;
    return LT_OK;
}

/* Layer l's key and value cache (B, ctx, Hkv, D). */
static float *kv_at(const lt_kv_cache *c, int64_t l, int which) {
    const lt_model_config *cf = &c->m->cfg;
    size_t row = (size_t)(c->B * c->ctx_len * cf->Hkv * cf->D);
    return (float *)c->kv + ((size_t)l * 2 + (size_t)which) * row;
}

/* y (n, out) = beta·y + x·Wᵀ (+ bias) + s·(x·Aᵀ)·Bᵀ for projection p of layer l. */
static void proj(const lt_kv_cache *c, lt_ctx *ctx, int64_t l, lt_proj p, const float *x, int64_t n, float *y,
                 float beta) {
    const lt_model *m = c->m;
    const lt_layer *L = &m->layers[l];
    const lt_backend *be = c->be;
    const lt_tensor *w = &L->w[p];
    int64_t out = w->shape[0], in = w->shape[1], r = m->lora.rank;
    /* a prefill pass with bf16 products: the context holds the workspace's bytes for the call */
    const int bf16x = c->bf16x && n > LT_MATVEC_MAX_N;
    if (bf16x) lt_ctx_set_bf16x(ctx, c->mm_ws_bytes);
    be->matmul(ctx, n <= LT_MATVEC_MAX_N ? LT_MATMUL_NT_DECODE : LT_MATMUL_NT, w, x, n, beta, y, c->mm_ws);
    if (bf16x) lt_ctx_set_bf16x(ctx, 0);
    if (L->desc.qkv_bias && p <= LT_PROJ_V) be->add_bias(ctx, y, L->bias[p], n, out);
    if (!L->lora_a[p]) return;
    be->gemm(ctx, 0, 1, n, r, in, 1.0f, x, in, L->lora_a[p], in, 0.0f, c->lu, r);
    be->gemm(ctx, 0, 1, n, out, r, m->lora_scale, c->lu, r, L->lora_b[p], r, 1.0f, y, out);
}

/* The projections ps[0..G) of layer l as one (Σ out, in) weight when their tensors lie back to
 * back in the weights block with one dtype and width (the carve order puts q, k, v and gate, up
 * next to each other): one matmul reads them all, so a one-token decode step makes one parallel
 * pass over the group's rows instead of G. 0 when they do not. */
static int fused_view(const lt_layer *L, const lt_proj *ps, int G, lt_tensor *out) {
    const lt_tensor *w0 = &L->w[ps[0]];
    if (w0->ndim != 2) return 0;
    size_t rb = (size_t)lt_dtype_row_bytes(w0->dtype, w0->shape[1]);
    int64_t rows = 0;
    for (int g = 0; g < G; g++) {
        const lt_tensor *w = &L->w[ps[g]];
        if (w->ndim != 2 || w->dtype != w0->dtype || w->shape[1] != w0->shape[1] ||
            (const uint8_t *)w->data != (const uint8_t *)w0->data + (size_t)rows * rb)
            return 0;
        rows += w->shape[0];
    }
    *out = *w0;
    out->shape[0] = rows;
    return 1;
}

/* The group ps[0..G) of one input x (n rows) into y[g]: one fused matmul for a single token when
 * the weights allow it (the outputs then lie side by side from y[0], as the caller arranged), else
 * projection by projection; biases and LoRA per projection either way. */
static void proj_group(const lt_kv_cache *c, lt_ctx *ctx, int64_t l, const lt_proj *ps, int G, const float *x,
                       int64_t n, float *const *y) {
    const lt_layer *L = &c->m->layers[l];
    lt_tensor fw;
    if (n != 1 || !fused_view(L, ps, G, &fw)) {
        for (int g = 0; g < G; g++) proj(c, ctx, l, ps[g], x, n, y[g], 0.0f);
        return;
    }
    c->be->matmul(ctx, LT_MATMUL_NT_DECODE, &fw, x, 1, 0.0f, y[0], c->mm_ws);
    const lt_model *m = c->m;
    for (int g = 0; g < G; g++) {
        lt_proj p = ps[g];
        int64_t out = L->w[p].shape[0], in = L->w[p].shape[1], r = m->lora.rank;
        if (L->desc.qkv_bias && p <= LT_PROJ_V) c->be->add_bias(ctx, y[g], L->bias[p], 1, out);
        if (!L->lora_a[p]) continue;
        c->be->gemm(ctx, 0, 1, 1, r, in, 1.0f, x, in, L->lora_a[p], in, 0.0f, c->lu, r);
        c->be->gemm(ctx, 0, 1, 1, out, r, m->lora_scale, c->lu, r, L->lora_b[p], r, 1.0f, y[g], out);
    }
}

/* The residual x (n, C) += proj p(in) of layer l: directly, or with sandwich norms through the
 * block's post-norm (the projection into h, free between the norm that fed the block and the next). */
static void block_out(const lt_kv_cache *c, lt_ctx *ctx, int64_t l, lt_proj p, const float *post_norm, const float *in,
                      int64_t n) {
    const lt_model_config *cf = &c->m->cfg;
    if (c->m->layers[l].desc.norm != LT_NORM_PLACE_SANDWICH) {
        proj(c, ctx, l, p, in, n, c->x, 1.0f);
        return;
    }
    proj(c, ctx, l, p, in, n, c->h, 0.0f);
    c->be->rmsnorm_fwd(ctx, c->h, post_norm, cf->rms_eps, n, cf->C, c->h, c->rstd);
    c->be->add(ctx, c->x, c->h, 1.0f, n * cf->C);
}

/* One pass over n tokens (staged in c's int32 inputs): rows[i] holds a run of tokens of one row
 * starting at position p0[i], nr runs; fresh = every run starts at 0 (flash attention). */
static lt_status pass(lt_ctx *ctx, lt_kv_cache *c, int64_t n, int64_t nr, const int64_t *rows, const int64_t *p0,
                      const int64_t *cnt, int fresh, const int32_t *offs_host, int64_t n_out, const int64_t *last,
                      float *logits_host, int64_t out_row0) {
    lt_model *m = c->m;
    const lt_model_config *cf = &m->cfg;
    const lt_backend *be = c->be;
    int64_t C = cf->C, F = cf->F, qd = cf->H * cf->D, kvd = cf->Hkv * cf->D;
    be->embedding(ctx, &m->embed, c->d_tok, n, c->x);
    if (cf->embed_scale > 0 && cf->embed_scale != 1.0f) be->scale(ctx, c->x, cf->embed_scale, n * C);
    /* one token: q, k, v side by side in q's piece, gate and up in g's (what a fused group writes) */
    float *q = c->q, *k = n == 1 ? c->q + qd : c->k, *v = n == 1 ? c->q + qd + kvd : c->v;
    float *gt = c->g, *up = n == 1 ? c->g + F : c->u;
    float *qkv[3] = {q, k, v}, *gu[2] = {gt, up};
    for (int64_t l = 0; l < cf->L; l++) {
        const lt_layer *L = &m->layers[l];
        be->rmsnorm_fwd(ctx, c->x, L->attn_norm, cf->rms_eps, n, C, c->h, c->rstd);
        proj_group(c, ctx, l, lt_proj_group_qkv, 3, c->h, n, qkv);
        if (L->desc.qk_norm) {
            be->rmsnorm_fwd(ctx, q, L->q_norm, cf->rms_eps, n * cf->H, cf->D, q, c->rstd_qk);
            be->rmsnorm_fwd(ctx, k, L->k_norm, cf->rms_eps, n * cf->Hkv, cf->D, k, c->rstd_qk);
        }
        const float *inv_freq = L->desc.rope ? m->inv_freq_local : m->inv_freq;
        be->rope(ctx, q, c->d_pos, inv_freq, n, cf->H, cf->D, 0);
        be->rope(ctx, k, c->d_pos, inv_freq, n, cf->Hkv, cf->D, 0);
        float *kc = kv_at(c, l, 0), *vc = kv_at(c, l, 1);
        int64_t t0 = 0;
        for (int64_t i = 0; i < nr; i++) { /* each run is contiguous in its cache row */
            size_t at = (size_t)((rows[i] * c->ctx_len + p0[i]) * kvd), bytes = (size_t)(cnt[i] * kvd) * sizeof(float);
            LT_TRY(be->copy_to_device(ctx, kc + at, k + t0 * kvd, bytes));
            LT_TRY(be->copy_to_device(ctx, vc + at, v + t0 * kvd, bytes));
            t0 += cnt[i];
        }
        if (fresh) {
            lt_attention_params ap = prefill_params(c, &L->desc, n, nr, offs_host);
            lt_attention_args aa;
            memset(&aa, 0, sizeof aa);
            aa.q = q, aa.k = k, aa.v = v, aa.out = c->att, aa.lse = c->lse;
            aa.workspace = c->attn_ws, aa.workspace_size = c->attn_ws_bytes;
            LT_TRY(lt_attention_forward(ctx, &ap, &aa));
        } else {
            lt_decode_attention_params dp = decode_params(c, &L->desc, n);
            dp.q = q, dp.kc = kc, dp.vc = vc, dp.out = c->att;
            LT_TRY(be->decode_attention(ctx, &dp));
        }
        block_out(c, ctx, l, LT_PROJ_O, L->post_attn_norm, c->att, n);
        be->rmsnorm_fwd(ctx, c->x, L->mlp_norm, cf->rms_eps, n, C, c->h, c->rstd);
        if (L->desc.mlp == LT_MLP_KIND_MOE) { /* the routed experts, as the training step runs them */
            lt_model_moe_forward(ctx, m, &c->moe, c->scr, c->mm_ws, l, c->h, n, c->x);
            continue;
        }
        proj_group(c, ctx, l, lt_proj_group_gate_up, 2, c->h, n, gu);
        if (L->desc.mlp == LT_MLP_KIND_GEGLU) be->geglu_fwd(ctx, gt, up, n * F, c->a);
        else be->swiglu_fwd(ctx, gt, up, n * F, c->a);
        block_out(c, ctx, l, LT_PROJ_DOWN, L->post_mlp_norm, c->a, n);
    }
    if (!n_out) return LT_OK;
    /* the last token of each finished row, gathered into a's rows (F >= C), then norm and head */
    for (int64_t i = 0; i < n_out; i++)
        LT_TRY(be->copy_to_device(ctx, c->a + i * C, c->x + last[i] * C, (size_t)C * sizeof(float)));
    be->rmsnorm_fwd(ctx, c->a, m->final_norm, cf->rms_eps, n_out, C, c->h, c->rstd);
    be->matmul(ctx, n_out <= LT_MATVEC_MAX_N ? LT_MATMUL_NT_DECODE : LT_MATMUL_NT, &m->head, c->h, n_out, 0.0f,
               c->logits, c->mm_ws);
    float *out = logits_host + out_row0 * cf->V;
    LT_TRY(be->copy_to_host(ctx, out, c->logits, (size_t)(n_out * cf->V) * sizeof(float)));
    lt_fast_softcap(out, n_out * cf->V, cf->final_softcap); /* as lt_model_logits gives them */
    return LT_OK;
}

/* Stages the int32 inputs of a pass (tokens, positions, rows, lengths, packed offsets) and copies
 * them to the device once. */
static lt_status stage(lt_ctx *ctx, lt_kv_cache *c, int64_t n, int64_t nr, const int64_t *rows, const int64_t *p0,
                       const int64_t *cnt, const int32_t *const *tok) {
    int32_t *t = c->h_ints, *pos = t + c->n_max, *sq = t + 2 * c->n_max, *ln = t + 3 * c->n_max, *of = t + 4 * c->n_max;
    int64_t k = 0;
    of[0] = 0;
    for (int64_t i = 0; i < nr; i++) {
        for (int64_t j = 0; j < cnt[i]; j++, k++) {
            t[k] = tok[i][j];
            pos[k] = (int32_t)(p0[i] + j);
            sq[k] = (int32_t)rows[i];
            ln[k] = (int32_t)(p0[i] + j + 1);
        }
        of[i + 1] = (int32_t)k;
    }
    (void)n;
    return c->be->copy_to_device(ctx, c->d_tok, c->h_ints, c->h_ints_bytes);
}

lt_status lt_kv_cache_extend(lt_ctx *ctx, lt_kv_cache *c, int64_t n_seq, const int64_t *seq,
                             const int32_t *const *tokens, const int64_t *n_tokens, float *logits) {
    const lt_model_config *cf = &c->m->cfg;
    if (n_seq < 1 || n_seq > c->B)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: %lld rows in one call (the cache has %lld)",
                        (long long)n_seq, (long long)c->B);
    if (lt_ctx_threads(ctx) > c->threads && lt_ctx_threads(ctx) > 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: context runs %d threads, the cache was sized for %d",
                        lt_ctx_threads(ctx), c->threads);
    int64_t total = 0, all_fresh = 1;
    for (int64_t i = 0; i < n_seq; i++) {
        int64_t r = seq[i];
        if (r < 0 || r >= c->B)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: row %lld outside [0, %lld)", (long long)r,
                            (long long)c->B);
        for (int64_t j = 0; j < i; j++)
            if (seq[j] == r) return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: row %lld given twice", (long long)r);
        if (n_tokens[i] < 1)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: row %lld gets no tokens", (long long)r);
        if (n_tokens[i] > c->ctx_len - c->len[r])
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "kv cache: row %lld holds %lld positions; %lld more exceed its context of %lld",
                            (long long)r, (long long)c->len[r], (long long)n_tokens[i], (long long)c->ctx_len);
        for (int64_t j = 0; j < n_tokens[i]; j++)
            if (tokens[i][j] < 0 || tokens[i][j] >= cf->V)
                return lt_error(ctx, LT_ERR_INVALID_ARG, "kv cache: token %d at %lld of row %lld outside [0, %lld)",
                                (int)tokens[i][j], (long long)j, (long long)r, (long long)cf->V);
        total += n_tokens[i];
        all_fresh &= c->len[r] == 0;
    }
    int64_t rows[LT_KV_MAX_RUNS], p0[LT_KV_MAX_RUNS], cnt[LT_KV_MAX_RUNS], last[LT_KV_MAX_RUNS];
    const int32_t *tp[LT_KV_MAX_RUNS];
    if (total <= c->n_max && n_seq <= LT_KV_MAX_RUNS) { /* one pass over every row */
        int64_t k = 0;
        for (int64_t i = 0; i < n_seq; i++) {
            rows[i] = seq[i], p0[i] = c->len[seq[i]], cnt[i] = n_tokens[i], tp[i] = tokens[i];
            k += cnt[i];
            last[i] = k - 1;
        }
        LT_TRY(stage(ctx, c, total, n_seq, rows, p0, cnt, tp));
        LT_TRY(pass(ctx, c, total, n_seq, rows, p0, cnt, (int)all_fresh, c->h_ints + 4 * c->n_max, n_seq, last, logits,
                    0));
        for (int64_t i = 0; i < n_seq; i++) c->len[seq[i]] += n_tokens[i];
        return LT_OK;
    }
    /* row by row, in passes of at most n_max tokens (the first of a fresh row by flash attention) */
    for (int64_t i = 0; i < n_seq; i++) {
        for (int64_t j0 = 0; j0 < n_tokens[i]; j0 += c->n_max) {
            int64_t nn = n_tokens[i] - j0 < c->n_max ? n_tokens[i] - j0 : c->n_max;
            rows[0] = seq[i], p0[0] = c->len[seq[i]], cnt[0] = nn, tp[0] = tokens[i] + j0, last[0] = nn - 1;
            int fin = j0 + nn == n_tokens[i];
            LT_TRY(stage(ctx, c, nn, 1, rows, p0, cnt, tp));
            LT_TRY(pass(ctx, c, nn, 1, rows, p0, cnt, p0[0] == 0, c->h_ints + 4 * c->n_max, fin, last, logits, i));
            c->len[seq[i]] += nn;
        }
    }
    return LT_OK;
}
