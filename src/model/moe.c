/* The mixture-of-experts MLP (Qwen3-MoE, Mixtral): the config's checks, the stacked experts'
 * shapes, the dispatch buffers' layout, and the layer's forward and backward over chunks of
 * tokens. Per chunk of n tokens, h the MLP norm's output (n, C):
 *   logits = h·Rᵀ; route → idx, w (+ the load-balancing statistics); sort by expert; xg = gather(h);
 *   G, U = grouped products with the stacked gate and up; A = silu(G)·U; Yg = grouped down(A);
 *   y += combine(Yg, w).
 * The backward reruns a chunk's forward from h and differentiates it (the experts and the
 * router are frozen: only the input gradient flows), so gathered rows and the experts'
 * activations exist for one chunk at a time. Every operation is a backend op. */
#include <string.h>

#include "core/ctx_state.h"
#include "model/step.h"

void lt_model_layer_proj_shape(const lt_model_config *c, int64_t l, lt_proj p, int64_t *out, int64_t *in) {
    lt_model_proj_shape(c, p, out, in);
    if (p < LT_PROJ_GATE || !lt_model_layer_is_moe(c, l)) return;
    if (p == LT_PROJ_DOWN) *out = c->n_experts * c->C, *in = c->moe_F;
    else *out = c->n_experts * c->moe_F, *in = c->C;
}

int64_t lt_model_dense_F(const lt_model_config *c) {
    for (int64_t l = 0; l < c->L; l++)
        if (!lt_model_layer_is_moe(c, l)) return c->F;
    return 0;
}

lt_status lt_model_check_moe(lt_ctx *ctx, const lt_model_config *c) {
    if (c->n_experts == 0 && c->n_experts_used == 0 && c->moe_F == 0 && c->moe_shared_F == 0) return LT_OK;
    if (c->n_experts < 1 || c->n_experts > LT_MOE_MAX_EXPERTS)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: n_experts = %lld is outside 1..%d", (long long)c->n_experts,
                        LT_MOE_MAX_EXPERTS);
    if (c->n_experts_used < 1 || c->n_experts_used > c->n_experts)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: %lld experts per token (top-k) is outside 1..%lld experts",
                        (long long)c->n_experts_used, (long long)c->n_experts);
    if (c->moe_F <= 0 || c->moe_F > (1 << 22))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: expert width moe_F = %lld is outside 1..%d",
                        (long long)c->moe_F, 1 << 22);
    if (c->moe_every < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: moe_every = %lld is negative", (long long)c->moe_every);
    if (!(c->moe_aux_coef >= 0 && c->moe_aux_coef <= 1e6f))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: moe_aux_coef = %g is outside [0, 1e6]",
                        (double)c->moe_aux_coef);
    if (c->moe_shared_F < 0 || c->moe_shared_F > (1 << 22))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: shared expert width moe_shared_F = %lld is outside 0..%d",
                        (long long)c->moe_shared_F, 1 << 22);
    /* the stacked experts' rows and the dispatch's int32 offsets */
    if (c->n_experts * c->moe_F > INT32_MAX || c->n_experts * c->C > INT32_MAX)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: %lld experts of width %lld stack beyond 2^31 rows",
                        (long long)c->n_experts, (long long)c->moe_F);
    return LT_OK;
}

lt_status lt_model_check_moe_lora(lt_ctx *ctx, const lt_model_config *c, const lt_lora_options *lo) {
    const unsigned mlp = (1u << LT_PROJ_GATE) | (1u << LT_PROJ_UP) | (1u << LT_PROJ_DOWN);
    if (lo->targets & mlp)
        for (int64_t l = c->L - lo->num_layers; l < c->L; l++)
            if (lt_model_layer_is_moe(c, l))
                return lt_error(ctx, LT_ERR_UNSUPPORTED,
                                "lora: layer %lld is a mixture-of-experts layer: its gate, up and down projections "
                                "are the experts' stacks; adapt them with the targets experts.gate_up_proj and "
                                "experts.down_proj (or target q, k, v, o only)",
                                (long long)l);
    if (!(lo->targets & LT_LORA_EXPERT_TARGETS)) return LT_OK;
    const char *which = (lo->targets & LT_LORA_EXPERTS_GATE_UP) ? "experts.gate_up_proj" : "experts.down_proj";
    if (c->n_experts == 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "lora: target %s: the model has no mixture-of-experts layer (no experts to adapt)", which);
    int64_t n_moe = 0;
    for (int64_t l = c->L - lo->num_layers; l < c->L; l++) n_moe += lt_model_layer_is_moe(c, l);
    if (!n_moe)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "lora: target %s: none of the last %lld layers (the LoRA layers) is a mixture-of-experts "
                        "layer",
                        which, (long long)lo->num_layers);
    if (lo->dropout > 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "lora: target %s: LoRA dropout %g on the experts is not supported (PEFT refuses dropout on "
                        "target_parameters too); use dropout 0",
                        which, (double)lo->dropout);
    if (lo->rank > LT_MOE_WGRAD_MAX_RANK)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lora: target %s: rank %lld exceeds %d on the experts", which,
                        (long long)lo->rank, LT_MOE_WGRAD_MAX_RANK);
    return LT_OK;
}

/* LoRA elements of layer l's expert adapters under lo (0 for a dense layer or without the expert
 * targets): gate_up A (E·r, C) and B (2·E·moe_F, r); down A (E·r, moe_F) and B (E·C, r). */
int64_t lt_model_moe_lora_elems(const lt_model_config *c, const lt_lora_options *lo, int64_t l) {
    if (!(lo->targets & LT_LORA_EXPERT_TARGETS) || !lt_model_layer_is_moe(c, l)) return 0;
    int64_t E = c->n_experts, r = lo->rank, n = 0;
    if (lo->targets & LT_LORA_EXPERTS_GATE_UP) n += E * r * (c->C + 2 * c->moe_F);
    if (lo->targets & LT_LORA_EXPERTS_DOWN) n += E * r * (c->moe_F + c->C);
    return n;
}

/* ---- the dispatch buffers ---- */

static size_t carve_al(size_t *cur, size_t bytes, size_t al) {
    size_t a = (*cur + al - 1) / al * al;
    if (*cur == SIZE_MAX || a < *cur || bytes > SIZE_MAX - a) {
        *cur = SIZE_MAX;
        return 0;
    }
    *cur = a + bytes;
    return a;
}

static size_t nbytes(int64_t n, size_t es) {
    if (n < 0 || (n && (uint64_t)n > SIZE_MAX / es)) return SIZE_MAX;
    return (size_t)n * es;
}

lt_status lt_model_moe_layout(lt_ctx *ctx, const lt_model_config *c, const lt_lora_options *lo,
                              const lt_model_run_options *run, const lt_backend *be, int64_t rows_chunk, int train,
                              int bf16x, int threads, size_t al, size_t *cur, lt_moe_layout *o) {
    memset(o, 0, sizeof *o);
    int64_t n_moe = 0;
    for (int64_t l = 0; l < c->L; l++) n_moe += lt_model_layer_is_moe(c, l);
    if (run->moe_chunk_tokens < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model run: moe_chunk_tokens %lld is negative",
                        (long long)run->moe_chunk_tokens);
    if (!n_moe) return LT_OK;
    if (!be->moe_route || !be->moe_route_bwd || !be->moe_sort || !be->moe_gather || !be->moe_gather_bwd ||
        !be->moe_combine || !be->moe_combine_bwd || !be->grouped_matmul || !be->grouped_matmul_workspace_bytes)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model run: the %s backend has no mixture-of-experts ops", be->name);
    o->n_layers = n_moe;
    int64_t ch = run->moe_chunk_tokens ? run->moe_chunk_tokens : LT_MODEL_MOE_CHUNK_TOKENS;
    if (ch > rows_chunk) ch = rows_chunk;
    o->chunk = ch;
    int64_t E = c->n_experts, k = c->n_experts_used, F = c->moe_F, C = c->C, nk = ch * k;
    o->logits = carve_al(cur, nbytes(ch * E, 4), al);
    o->idx = carve_al(cur, nbytes(nk, 4), al);
    o->w = carve_al(cur, nbytes(nk, 4), al);
    o->off = carve_al(cur, nbytes(E + 1, 4), al);
    o->rows = carve_al(cur, nbytes(nk, 4), al);
    o->slot = carve_al(cur, nbytes(nk, 4), al);
    o->xg = carve_al(cur, nbytes(nk * C, 4), al);
    o->g = carve_al(cur, nbytes(nk * F, 4), al);
    o->u = carve_al(cur, nbytes(nk * F, 4), al);
    o->a = carve_al(cur, nbytes(nk * F, 4), al);
    o->yg = carve_al(cur, nbytes(nk * C, 4), al);
    if (c->moe_aux_coef > 0) o->stats = carve_al(cur, nbytes(2 * E, 4), al);
    if (train) {
        o->dw = carve_al(cur, nbytes(nk, 4), al);
        o->dlogits = carve_al(cur, nbytes(ch * E, 4), al);
    }
    /* the grouped products' workspace: the largest over the MoE layers' expert dtypes */
    size_t gw = 0;
    for (int64_t l = 0; l < c->L; l++) {
        if (!lt_model_layer_is_moe(c, l)) continue;
        for (int p = LT_PROJ_GATE; p <= LT_PROJ_DOWN; p++) {
            lt_dtype dt = lt_model_proj_dtype(c, l, (lt_proj)p);
            int64_t out = p == LT_PROJ_DOWN ? C : F, in = p == LT_PROJ_DOWN ? F : C;
            size_t w = be->grouped_matmul_workspace_bytes(dt, E, out, in, nk, threads);
            if (w > gw) gw = w;
            /* with bf16 products each expert's product is one bf16x matmul of at most nk rows */
            if (bf16x && (w = be->matmul_bf16x_workspace_bytes(dt, out, in, nk, threads)) > gw) gw = w;
        }
    }
    o->bf16x = bf16x;
    /* the expert adapters: their products' rows (n·k, r) and the f32 stacks' workspaces */
    unsigned xt = 0;
    for (int64_t l = c->L - lo->num_layers; l < c->L; l++)
        if (lt_model_moe_lora_elems(c, lo, l)) xt = lo->targets & LT_LORA_EXPERT_TARGETS;
    if (xt) {
        if (train && !be->grouped_matmul_wgrad)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "model run: the %s backend has no grouped weight gradient (LoRA on the experts)", be->name);
        int64_t r = lo->rank;
        if (xt & LT_LORA_EXPERTS_GATE_UP) o->lus = carve_al(cur, nbytes(nk * r, 4), al);
        if (xt & LT_LORA_EXPERTS_DOWN) o->lds = carve_al(cur, nbytes(nk * r, 4), al);
        if (train) o->ldu = carve_al(cur, nbytes(nk * r, 4), al);
        /* (out, in) of A_gu, B_gate / B_up, A_d, B_d */
        const int64_t sh[4][2] = {{r, C}, {F, r}, {r, F}, {C, r}};
        for (int i = 0; i < 4; i++) {
            if (!(xt & (i < 2 ? LT_LORA_EXPERTS_GATE_UP : LT_LORA_EXPERTS_DOWN))) continue;
            size_t w = be->grouped_matmul_workspace_bytes(LT_DTYPE_F32, E, sh[i][0], sh[i][1], nk, threads);
            if (w > gw) gw = w;
        }
    }
    o->gm_ws_bytes = gw;
    o->gm_ws = carve_al(cur, gw, al);
    int64_t S = c->moe_shared_F;
    if (S > 0) { /* the shared expert and its gate as a two-way combine */
        o->sg = carve_al(cur, nbytes(ch * S, 4), al);
        o->su = carve_al(cur, nbytes(ch * S, 4), al);
        o->sa = carve_al(cur, nbytes(ch * S, 4), al);
        o->sy = carve_al(cur, nbytes(2 * ch * C, 4), al);
        o->slogits = carve_al(cur, nbytes(2 * ch, 4), al);
        o->sidx = carve_al(cur, nbytes(2 * ch, 4), al);
        o->sw = carve_al(cur, nbytes(2 * ch, 4), al);
        o->soff = carve_al(cur, nbytes(3, 4), al);
        o->srows = carve_al(cur, nbytes(2 * ch, 4), al);
        o->sslot = carve_al(cur, nbytes(2 * ch, 4), al);
        if (train) {
            o->sdg = carve_al(cur, nbytes(ch * S, 4), al);
            o->sdu = carve_al(cur, nbytes(ch * S, 4), al);
            o->sdy = carve_al(cur, nbytes(2 * ch * C, 4), al);
            o->sdw = carve_al(cur, nbytes(2 * ch, 4), al);
            o->sdlogits = carve_al(cur, nbytes(2 * ch, 4), al);
        }
        size_t a = be->matmul_workspace_bytes(LT_DTYPE_F32, S, C, ch, threads),
               b = be->matmul_workspace_bytes(LT_DTYPE_F32, C, S, ch, threads);
        o->mm_ws_bytes = a > b ? a : b;
    }
    return LT_OK;
}

/* ---- the layer ---- */

/* Where one MoE forward or backward runs: the backend, the dispatch buffers at `base` with the
 * layout's offsets, the matmul workspace (shared expert), and the step it belongs to (token runs,
 * statistics, the aux gradient) or NULL (generation's KV cache: every token real, nothing
 * collected). */
typedef struct moe_run {
    lt_ctx *ctx;
    const lt_backend *be;
    const lt_model_config *c;
    int64_t rank;  /* of the LoRA adapters */
    float scale;   /* alpha / r */
    lt_device dev; /* where the adapters live */
    const lt_moe_layout *o;
    uint8_t *base;
    void *mm_ws;
    const lt_step *s;
} moe_run;

typedef struct moe_bufs {
    float *logits, *w, *xg, *g, *u, *a, *yg, *dw, *dg, *du, *dlogits, *stats;
    float *lus, *lds, *ldu; /* LoRA on the experts: s·xg·A_guᵀ, s·A·A_dᵀ, a gradient of one of them */
    int32_t *idx, *off, *rows, *slot;
    void *gm_ws;
} moe_bufs;

static float *wsf(const moe_run *x, size_t off) { return (float *)(x->base + off); }

static moe_bufs bufs_of(const moe_run *x, int train) {
    const lt_moe_layout *o = x->o;
    moe_bufs b;
    memset(&b, 0, sizeof b);
    b.logits = wsf(x, o->logits);
    b.idx = (int32_t *)wsf(x, o->idx);
    b.w = wsf(x, o->w);
    b.off = (int32_t *)wsf(x, o->off);
    b.rows = (int32_t *)wsf(x, o->rows);
    b.slot = (int32_t *)wsf(x, o->slot);
    b.xg = wsf(x, o->xg);
    b.g = wsf(x, o->g);
    b.u = wsf(x, o->u);
    b.a = wsf(x, o->a);
    b.yg = wsf(x, o->yg);
    if (o->stats) b.stats = wsf(x, o->stats);
    if (train) {
        b.dw = wsf(x, o->dw);
        b.dg = b.g; /* the glu backward writes the gate and up gradients over g and u */
        b.du = b.u;
        b.dlogits = wsf(x, o->dlogits);
    }
    if (o->lus) b.lus = wsf(x, o->lus);
    if (o->lds) b.lds = wsf(x, o->lds);
    if (train && o->ldu) b.ldu = wsf(x, o->ldu);
    b.gm_ws = o->gm_ws_bytes ? (void *)wsf(x, o->gm_ws) : NULL;
    return b;
}

/* One grouped product of the experts: with the run's bf16 products the context holds gm_ws's bytes
 * around it (the adapters' f32 stacks keep their f32 products on that path). */
static void gmm(const moe_run *x, lt_matmul_mode mode, const lt_tensor *w, const moe_bufs *b, const float *in,
                int64_t nk, float beta, float *y) {
    if (x->o->bf16x) lt_ctx_set_bf16x(x->ctx, x->o->gm_ws_bytes);
    x->be->grouped_matmul(x->ctx, mode, w, x->c->n_experts, b->off, in, nk, beta, y, b->gm_ws);
    if (x->o->bf16x) lt_ctx_set_bf16x(x->ctx, 0);
}

static moe_run run_of_step(const lt_step *s) {
    const lt_model *m = s->m;
    moe_run x = {s->ctx,
                 s->be,
                 &m->cfg,
                 m->lora.rank,
                 m->lora_scale,
                 m->opt.device,
                 &m->lay.moe,
                 m->block[LT_MEM_WORKSPACE],
                 lt_step_ws(s, m->lay.mm_ws),
                 s};
    return x;
}

/* The end of the run of tokens from token g (a batch index) on that are all real or all padding,
 * at most `end`; *real says which. */
static int64_t token_run(const lt_step *s, int64_t g, int64_t end, int *real) {
    if (s && s->cp_real) return lt_step_moe_cp_run(s, g, end, real);
    if (!s || !s->real_seqs) {
        *real = 1;
        return end;
    }
    int64_t row = g / s->T, re = row * s->T + s->seq_offsets[row * (s->S + 1) + s->real_seqs[row]];
    int64_t stop = g < re ? re : (row + 1) * s->T;
    *real = g < re;
    return stop < end ? stop : end;
}

/* Routing of the n tokens of h from batch token g0 on: logits, idx, w; the statistics of the
 * load-balancing loss accumulated over the real ones when the step collects them. Then the
 * grouping and the gathered rows. */
static void route_and_gather(const moe_run *x, const lt_layer *L, const moe_bufs *b, int64_t g0, const float *h,
                             int64_t n) {
    const lt_model_config *c = x->c;
    const lt_backend *be = x->be;
    int64_t E = c->n_experts, k = c->n_experts_used;
    int collect = x->s && x->s->moe_collect;
    /* the router in f32 on every backend (gemm: no bf16 rounding of its inputs), so a device's
     * top-k choices are the host's */
    be->gemm(x->ctx, 0, 1, n, E, c->C, 1.0f, h, c->C, (const float *)L->router.data, c->C, 0.0f, b->logits, E);
    for (int64_t t = 0; t < n;) { /* padding routes too, outside the statistics */
        int real = 0;             /* one call unless collecting */
        int64_t e = collect ? token_run(x->s, g0 + t, g0 + n, &real) - g0 : n;
        be->moe_route(x->ctx, b->logits + t * E, e - t, E, k, c->moe_norm_topk, b->idx + t * k, b->w + t * k,
                      collect && real ? b->stats : NULL);
        t = e;
    }
    be->moe_sort(x->ctx, b->idx, n, k, E, b->off, b->rows, b->slot);
    be->moe_gather(x->ctx, h, b->rows, n * k, k, c->C, b->xg);
}

/* An expert adapter's stack as the grouped products take it: (E·out, in) f32. */
static lt_tensor stack(const moe_run *x, const float *p, int64_t out, int64_t in) {
    int64_t sh[2] = {x->c->n_experts * out, in};
    return lt_tensor_view((void *)(uintptr_t)p, LT_DTYPE_F32, x->dev, 2, sh);
}

/* The experts over the gathered rows: G, U, A = silu(G)·U, Yg = down(A); with LoRA on the experts
 * G += s·(xg·A_guᵀ)·B_gateᵀ, U += s·(xg·A_guᵀ)·B_upᵀ, Yg += s·(A·A_dᵀ)·B_dᵀ, keeping the scaled
 * down-products lus, lds for the backward. */
static void experts_fwd(const moe_run *x, const lt_layer *L, const moe_bufs *b, int64_t nk) {
    const lt_backend *be = x->be;
    const lt_model_config *c = x->c;
    int64_t E = c->n_experts, F = c->moe_F, C = c->C, r = x->rank;
    gmm(x, LT_MATMUL_NT, &L->w[LT_PROJ_GATE], b, b->xg, nk, 0.0f, b->g);
    gmm(x, LT_MATMUL_NT, &L->w[LT_PROJ_UP], b, b->xg, nk, 0.0f, b->u);
    if (L->ex_a[0]) {
        lt_tensor a = stack(x, L->ex_a[0], r, C), bg = stack(x, L->ex_b[0], F, r),
                  bu = stack(x, L->ex_b[0] + E * F * r, F, r);
        gmm(x, LT_MATMUL_NT, &a, b, b->xg, nk, 0.0f, b->lus);
        be->scale(x->ctx, b->lus, x->scale, nk * r);
        gmm(x, LT_MATMUL_NT, &bg, b, b->lus, nk, 1.0f, b->g);
        gmm(x, LT_MATMUL_NT, &bu, b, b->lus, nk, 1.0f, b->u);
    }
    be->swiglu_fwd(x->ctx, b->g, b->u, nk * F, b->a);
    gmm(x, LT_MATMUL_NT, &L->w[LT_PROJ_DOWN], b, b->a, nk, 0.0f, b->yg);
    if (L->ex_a[1]) {
        lt_tensor a = stack(x, L->ex_a[1], r, F), bd = stack(x, L->ex_b[1], C, r);
        gmm(x, LT_MATMUL_NT, &a, b, b->a, nk, 0.0f, b->lds);
        be->scale(x->ctx, b->lds, x->scale, nk * r);
        gmm(x, LT_MATMUL_NT, &bd, b, b->lds, nk, 1.0f, b->yg);
    }
}

/* ---- the shared expert (Qwen2-MoE): y += sigmoid(h·gᵀ)·down(silu(gate(h))·up(h)) ----
 * The sigmoid gate is the routing of two "experts", the shared one and a zero one, over logits
 * (h·gᵀ, 0): softmax gives (sigmoid, 1 - sigmoid), top-2 keeps both, and the combine of the shared
 * output beside zero rows is the gated output; its backward is the routing's. Every token picks
 * both, so the shared expert's grouped rows are the tokens in order: rows [0, n) of sy. */

static void shared_route(const moe_run *x, const lt_layer *L, const float *h, int64_t n) {
    const lt_moe_layout *o = x->o;
    const lt_backend *be = x->be;
    int64_t C = x->c->C;
    float *lg = wsf(x, o->slogits);
    be->zero(x->ctx, lg, (size_t)(2 * n) * sizeof(float));
    be->gemm(x->ctx, 0, 1, n, 1, C, 1.0f, h, C, (const float *)L->shared_gate.data, C, 0.0f, lg, 2);
    be->moe_route(x->ctx, lg, n, 2, 2, 0, (int32_t *)wsf(x, o->sidx), wsf(x, o->sw), NULL);
    be->moe_sort(x->ctx, (int32_t *)wsf(x, o->sidx), n, 2, 2, (int32_t *)wsf(x, o->soff), (int32_t *)wsf(x, o->srows),
                 (int32_t *)wsf(x, o->sslot));
}

/* sy rows [0, n) = the shared expert's output on h, rows [n, 2n) zero; sg, su, sa kept. */
static void shared_mlp(const moe_run *x, const lt_layer *L, const float *h, int64_t n) {
    const lt_moe_layout *o = x->o;
    const lt_backend *be = x->be;
    int64_t C = x->c->C, S = x->c->moe_shared_F;
    float *sy = wsf(x, o->sy);
    be->matmul(x->ctx, LT_MATMUL_NT, &L->shared[0], h, n, 0.0f, wsf(x, o->sg), x->mm_ws);
    be->matmul(x->ctx, LT_MATMUL_NT, &L->shared[1], h, n, 0.0f, wsf(x, o->su), x->mm_ws);
    be->swiglu_fwd(x->ctx, wsf(x, o->sg), wsf(x, o->su), n * S, wsf(x, o->sa));
    be->matmul(x->ctx, LT_MATMUL_NT, &L->shared[2], wsf(x, o->sa), n, 0.0f, sy, x->mm_ws);
    be->zero(x->ctx, sy + n * C, (size_t)(n * C) * sizeof(float));
}

static void shared_fwd(const moe_run *x, const lt_layer *L, const float *h, int64_t n, float *y) {
    const lt_moe_layout *o = x->o;
    shared_route(x, L, h, n);
    shared_mlp(x, L, h, n);
    x->be->moe_combine(x->ctx, wsf(x, o->sy), wsf(x, o->sw), (int32_t *)wsf(x, o->sslot), n, 2, x->c->C, 1.0f, y);
}

/* dh (n, C) += ∂/∂h of the gated shared expert given dy. */
static void shared_bwd(const moe_run *x, const lt_layer *L, const float *h, const float *dy, int64_t n, float *dh) {
    const lt_moe_layout *o = x->o;
    const lt_backend *be = x->be;
    int64_t C = x->c->C, S = x->c->moe_shared_F;
    shared_route(x, L, h, n);
    shared_mlp(x, L, h, n);
    float *sdy = wsf(x, o->sdy), *sdl = wsf(x, o->sdlogits);
    be->moe_combine_bwd(x->ctx, dy, wsf(x, o->sy), wsf(x, o->sw), (int32_t *)wsf(x, o->sslot), n, 2, C, sdy,
                        wsf(x, o->sdw));
    /* rows [0, n) of sdy: the shared output's gradient; sa takes ∂/∂sa (dead after the forward) */
    be->matmul(x->ctx, LT_MATMUL_NN, &L->shared[2], sdy, n, 0.0f, wsf(x, o->sa), x->mm_ws);
    be->swiglu_bwd(x->ctx, wsf(x, o->sa), wsf(x, o->sg), wsf(x, o->su), n * S, wsf(x, o->sdg), wsf(x, o->sdu));
    be->matmul(x->ctx, LT_MATMUL_NN, &L->shared[0], wsf(x, o->sdg), n, 1.0f, dh, x->mm_ws);
    be->matmul(x->ctx, LT_MATMUL_NN, &L->shared[1], wsf(x, o->sdu), n, 1.0f, dh, x->mm_ws);
    be->moe_route_bwd(x->ctx, wsf(x, o->slogits), (int32_t *)wsf(x, o->sidx), wsf(x, o->sdw), n, 2, 2, 0, NULL, NULL,
                      sdl);
    /* the gate logit is column 0 of (n, 2) */
    be->gemm(x->ctx, 0, 0, n, C, 1, 1.0f, sdl, 2, (const float *)L->shared_gate.data, C, 1.0f, dh, C);
}

static void moe_fwd(const moe_run *x, const lt_layer *L, int64_t r0, const float *h, int64_t n, float *y) {
    const lt_model_config *c = x->c;
    moe_bufs b = bufs_of(x, 0);
    int64_t ch = x->o->chunk, k = c->n_experts_used, C = c->C;
    for (int64_t t0 = 0; t0 < n; t0 += ch) {
        int64_t m = n - t0 < ch ? n - t0 : ch;
        route_and_gather(x, L, &b, r0 + t0, h + t0 * C, m);
        experts_fwd(x, L, &b, m * k);
        x->be->moe_combine(x->ctx, b.yg, b.w, b.slot, m, k, C, 1.0f, y + t0 * C);
        if (c->moe_shared_F > 0) shared_fwd(x, L, h + t0 * C, m, y + t0 * C);
    }
}

void lt_step_moe_fwd(const lt_step *s, int64_t l, int64_t r0, const float *h, int64_t n, float *y) {
    moe_run x = run_of_step(s);
    moe_fwd(&x, &s->m->layers[l], r0, h, n, y);
}

void lt_model_moe_forward(lt_ctx *ctx, const lt_model *m, const lt_moe_layout *o, uint8_t *base, void *mm_ws, int64_t l,
                          const float *h, int64_t n, float *y) {
    moe_run x = {ctx, m->be, &m->cfg, m->lora.rank, m->lora_scale, m->opt.device, o, base, mm_ws, NULL};
    moe_fwd(&x, &m->layers[l], 0, h, n, y);
}

/* The down adapter's backward given dYg (nk, C), A in b->a and lds = s·A·A_dᵀ: gB_d += dYgᵀ·lds;
 * ldu = s·dYg·B_d (∂/∂(A·A_dᵀ)); gA_d += lduᵀ·A. The caller adds ldu·A_d into dA. */
static void down_lora_bwd(const moe_run *x, const lt_layer *L, const moe_bufs *b, const float *dyg, int64_t nk) {
    const lt_backend *be = x->be;
    int64_t E = x->c->n_experts, C = x->c->C, F = x->c->moe_F, r = x->rank;
    lt_tensor bd = stack(x, L->ex_b[1], C, r);
    gmm(x, LT_MATMUL_NN, &bd, b, dyg, nk, 0.0f, b->ldu);
    be->grouped_matmul_wgrad(x->ctx, E, b->off, dyg, C, b->lds, r, nk, 1.0f, L->ex_gb[1]);
    be->scale(x->ctx, b->ldu, x->scale, nk * r);
    be->grouped_matmul_wgrad(x->ctx, E, b->off, b->ldu, r, b->a, F, nk, 1.0f, L->ex_ga[1]);
}

/* The gate_up adapter's backward given dG, dU (b->dg, b->du), xg in b->xg and lus = s·xg·A_guᵀ:
 * gB_gate += dGᵀ·lus, gB_up += dUᵀ·lus; ldu = s·(dG·B_gate + dU·B_up); gA_gu += lduᵀ·xg;
 * dxg (nk, C) += ldu·A_gu. */
static void gate_up_lora_bwd(const moe_run *x, const lt_layer *L, const moe_bufs *b, float *dxg, int64_t nk) {
    const lt_backend *be = x->be;
    int64_t E = x->c->n_experts, C = x->c->C, F = x->c->moe_F, r = x->rank;
    lt_tensor a = stack(x, L->ex_a[0], r, C), bg = stack(x, L->ex_b[0], F, r),
              bu = stack(x, L->ex_b[0] + E * F * r, F, r);
    gmm(x, LT_MATMUL_NN, &bg, b, b->dg, nk, 0.0f, b->ldu);
    gmm(x, LT_MATMUL_NN, &bu, b, b->du, nk, 1.0f, b->ldu);
    be->grouped_matmul_wgrad(x->ctx, E, b->off, b->dg, F, b->lus, r, nk, 1.0f, L->ex_gb[0]);
    be->grouped_matmul_wgrad(x->ctx, E, b->off, b->du, F, b->lus, r, nk, 1.0f, L->ex_gb[0] + E * F * r);
    be->scale(x->ctx, b->ldu, x->scale, nk * r);
    be->grouped_matmul_wgrad(x->ctx, E, b->off, b->ldu, r, b->xg, C, nk, 1.0f, L->ex_ga[0]);
    gmm(x, LT_MATMUL_NN, &a, b, b->ldu, nk, 1.0f, dxg);
}

void lt_step_moe_bwd(const lt_step *s, int64_t l, int64_t r0, const float *h, const float *dy, int64_t n, float *dh) {
    moe_run x = run_of_step(s);
    const lt_model_config *c = x.c;
    const lt_layer *L = &s->m->layers[l];
    const lt_backend *be = s->be;
    moe_bufs b = bufs_of(&x, 1);
    int64_t ch = x.o->chunk, E = c->n_experts, k = c->n_experts_used, C = c->C, F = c->moe_F, r = x.rank;
    for (int64_t t0 = 0; t0 < n; t0 += ch) {
        int64_t m = n - t0 < ch ? n - t0 : ch, nk = m * k;
        route_and_gather(&x, L, &b, r0 + t0, h + t0 * C, m);
        experts_fwd(&x, L, &b, nk);
        float *dyg = b.xg, *da = b.a, *dxg = b.yg; /* each dead once its gradient is made */
        be->moe_combine_bwd(s->ctx, dy + t0 * C, b.yg, b.w, b.slot, m, k, C, dyg, b.dw);
        if (L->ex_a[1]) /* the down adapter, while A is still in its buffer */
            down_lora_bwd(&x, L, &b, dyg, nk);
        gmm(&x, LT_MATMUL_NN, &L->w[LT_PROJ_DOWN], &b, dyg, nk, 0.0f, da);
        if (L->ex_a[1]) { /* dA += s·(dYg·B_d)·A_d */
            lt_tensor a = stack(&x, L->ex_a[1], r, F);
            gmm(&x, LT_MATMUL_NN, &a, &b, b.ldu, nk, 1.0f, da);
        }
        be->swiglu_bwd(s->ctx, da, b.g, b.u, nk * F, b.dg, b.du);
        gmm(&x, LT_MATMUL_NN, &L->w[LT_PROJ_GATE], &b, b.dg, nk, 0.0f, dxg);
        gmm(&x, LT_MATMUL_NN, &L->w[LT_PROJ_UP], &b, b.du, nk, 1.0f, dxg);
        if (L->ex_a[0]) { /* dYg is dead: the gathered rows again for A_gu's gradient */
            be->moe_gather(s->ctx, h + t0 * C, b.rows, nk, k, C, b.xg);
            gate_up_lora_bwd(&x, L, &b, dxg, nk);
        }
        be->moe_gather_bwd(s->ctx, dxg, b.slot, m, k, C, 0.0f, dh + t0 * C);
        for (int64_t t = 0; t < m;) { /* the aux term's gradient reaches the real tokens only */
            int real = 0;
            int64_t e = s->moe_has_dp ? token_run(s, r0 + t0 + t, r0 + t0 + m, &real) - (r0 + t0) : m;
            be->moe_route_bwd(s->ctx, b.logits + t * E, b.idx + t * k, b.dw + t * k, e - t, E, k, c->moe_norm_topk,
                              s->moe_has_dp && real ? b.stats : NULL, s->moe_scale, b.dlogits + t * E);
            t = e;
        }
        be->gemm(s->ctx, 0, 0, m, C, E, 1.0f, b.dlogits, E, (const float *)L->router.data, C, 1.0f, dh + t0 * C, C);
        if (c->moe_shared_F > 0) shared_bwd(&x, L, h + t0 * C, dy + t0 * C, m, dh + t0 * C);
    }
}

/* ---- the load-balancing loss over the whole forward ---- */

lt_status lt_step_moe_check(lt_step *s, const lt_model_batch *b) {
    const lt_moe_layout *o = &s->m->lay.moe;
    const lt_model_config *c = &s->m->cfg;
    s->real_seqs = s->seq_offsets ? b->real_seqs : NULL;
    s->n_real = s->N;
    if (s->real_seqs) {
        s->n_real = 0;
        for (int64_t r = 0; r < s->B; r++) {
            if (s->real_seqs[r] < 0 || s->real_seqs[r] > s->S)
                return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: real_seqs[%lld] = %d is outside 0..S = %lld",
                                (long long)r, (int)s->real_seqs[r], (long long)s->S);
            s->n_real += s->seq_offsets[r * (s->S + 1) + s->real_seqs[r]];
        }
    }
    /* transformers' load_balancing_loss_func over every MoE layer's tokens together: aux =
     * E/M²·Σ_e count_e·Σ_t p[t, e]; ∂(w·aux)/∂p[t, e] = w·E·count_e/M² with the loss's own weight
     * w = coef·dloss·n_tok (coef with the default mean loss) */
    int64_t group = 0;
    LT_TRY(lt_step_moe_group_real(s, b, &group));
    double M = (double)o->n_layers * (double)group;
    s->aux_norm = o->stats && M > 0 ? (double)c->n_experts / (M * M) : 0.0;
    s->aux_scale = s->train ? (float)((double)c->moe_aux_coef * (double)s->dloss * (double)s->n_tok * s->aux_norm) : 0;
    s->m->moe_aux_norm = s->aux_norm;
    return LT_OK;
}

void lt_step_moe_bind(lt_step *s) {
    s->moe_scale = s->scalars ? s->scalars + 2 : &s->moe_host[0];
    s->moe_sum = s->scalars ? s->scalars + 3 : &s->moe_host[1];
    s->moe_host[0] = s->aux_scale;
    s->moe_host[1] = 0;
}

void lt_step_moe_begin(lt_step *s) {
    const lt_moe_layout *o = &s->m->lay.moe;
    s->moe_collect = o->stats != 0;
    s->moe_has_dp = 0;
    if (o->stats) s->be->zero(s->ctx, lt_step_ws(s, o->stats), (size_t)(2 * s->m->cfg.n_experts) * sizeof(float));
}

void lt_step_moe_end(lt_step *s) {
    const lt_moe_layout *o = &s->m->lay.moe;
    s->moe_collect = 0;
    if (!o->stats) return;
    int64_t E = s->m->cfg.n_experts;
    const float *st = lt_step_ws(s, o->stats);
    /* (1, 1) = counts (1, E) · Σp (1, E)ᵀ, fp32 on every backend */
    s->be->gemm(s->ctx, 0, 1, 1, 1, E, 1.0f, st, E, st + E, E, 0.0f, s->moe_sum, 1);
    /* the gradient's scale is data (scalars [2]): a captured step reads each batch's */
    s->moe_has_dp = s->train;
}
