/* The LoRA projections of a layer over a chunk of rows: y = x·Wᵀ (+ bias) + s·(drop(x)·Aᵀ)·Bᵀ and
 * its backward, through the backend's fused lora_fwd / lora_bwd, or one projection at a time
 * under LoRA dropout (which masks the input per projection). Dropout masks are a pure function of
 * the step's seed, the layer, the projection and the element's place in the whole batch. */
#include <string.h>

#include "core/ctx_state.h"
#include "model/step.h"

static uint64_t drop_offset(int64_t layer, int p) { return ((uint64_t)layer * LT_PROJ_COUNT_ + (uint64_t)p) << 40; }
/* Counter base of the mask on projection p's input (in features per token) from row r0 on: the
 * projection's stream plus this batch's place in the whole batch, so a data-parallel share (and
 * every chunk of rows) draws the same masks. */
static uint64_t drop_at(const lt_step *s, int64_t l, int p, int64_t in, int64_t r0) {
    /* a fused module's projections share one mask, as PEFT drops the module's one input */
    int o = (int)lt_model_lora_owner(&s->m->cfg, (lt_proj)p);
    return drop_offset(l, o) + (s->drop_row0 + (uint64_t)r0) * (uint64_t)in;
}

/* The matmul workspace for the base products that follow. With the run's bf16 products the
 * layout sized it for them, and the context holds its bytes until mm_end: only these calls take
 * that path (other users of the context plan their workspaces without it). */
static void *mm_begin(const lt_step *s) {
    if (s->m->lay.bf16x) lt_ctx_set_bf16x(s->ctx, s->m->lay.mm_ws_bytes);
    return lt_step_ws(s, s->m->lay.mm_ws);
}

static void mm_end(const lt_step *s) {
    if (s->m->lay.bf16x) lt_ctx_set_bf16x(s->ctx, 0);
}

/* Row r0 of the (N, r) LoRA product of projection p in st (NULL when p carries no LoRA). */
static float *lu_at(const lt_step *s, const lt_store *st, lt_proj p, int64_t r0) {
    return st->lu[p] ? st->lu[p] + r0 * s->m->lora.rank : NULL;
}

/* Projection p's bias: q, k and v carry one when the layer's description says so. */
static const float *bias_of(const lt_layer *L, lt_proj p) {
    return L->desc.qkv_bias && p <= LT_PROJ_V ? L->bias[p] : NULL;
}

/* Over the n rows from row r0 (x, y, lu point at that row): y (n, out) = beta·y + x·Wᵀ (+ bias)
 * (+ s·(drop(x)·Aᵀ)·Bᵀ), saving lu = drop(x)·Aᵀ. beta = 1 adds the projection onto a residual
 * already in y. y = NULL computes only lu (a recompute that needs the saved LoRA product but not
 * the output). */
static void proj_fwd_mode(const lt_step *s, int64_t l, lt_proj p, int64_t r0, int64_t n, const float *x, float *y,
                          float *lu, const float *bias, float beta, lt_matmul_mode mode) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    const lt_tensor *w = &L->w[p];
    int64_t out = w->shape[0], in = w->shape[1], r = m->lora.rank;
    if (y) {
        s->be->matmul(s->ctx, mode, w, x, n, beta, y, mm_begin(s));
        mm_end(s);
    }
    if (y && bias) s->be->add_bias(s->ctx, y, bias, n, out);
    if (!L->lora_a[p]) return;
    const float *src = x;
    if (s->train && m->lora.dropout > 0) {
        float *scr = lt_step_ws(s, m->lay.scratch);
        s->be->dropout(s->ctx, x, scr, n * in, m->lora.dropout, s->drop_seed, drop_at(s, l, p, in, r0));
        src = scr;
    }
    s->be->gemm(s->ctx, 0, 1, n, r, in, 1.0f, src, in, L->lora_a[p], in, 0.0f, lu, r);
    if (y) s->be->gemm(s->ctx, 0, 1, n, out, r, m->lora_scale, lu, r, L->lora_b[p], r, 1.0f, y, out);
}

/* The backend's description of projections ps[0..G) of layer l over the rows from r0 (outputs
 * and gradients left to the caller; the bias is read by the forward only). */
static void group_projs(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0,
                        lt_lora_proj *pp) {
    const lt_layer *L = &s->m->layers[l];
    memset(pp, 0, sizeof *pp * (size_t)G);
    for (int g = 0; g < G; g++) {
        lt_proj p = ps[g];
        pp[g].w = &L->w[p];
        pp[g].a = L->lora_a[p], pp[g].b = L->lora_b[p];
        pp[g].bias = bias_of(L, p);
        pp[g].lu = lu_at(s, st, p, r0);
    }
}

/* The projections ps[0..G) of one input x over the n rows from row r0 (q, k, v; gate, up; or one
 * alone), each into y[g] as proj_fwd (beta, the layer's q/k/v biases; y = NULL: lu only), through
 * the backend's fused lora_fwd — or proj_fwd one by one under LoRA dropout, which masks x. */
void lt_step_group_fwd(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                       lt_act x, float *const *y, float beta) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    if (s->train && m->lora.dropout > 0) {
        LT_ASSERT(x.f); /* mlp_bf16 is off under dropout */
        for (int g = 0; g < G; g++) {
            proj_fwd_mode(s, l, ps[g], r0, n, x.f, y[g], lu_at(s, st, ps[g], r0), bias_of(L, ps[g]), beta,
                          g && y[g - 1] ? LT_MATMUL_NT_SAME_X : LT_MATMUL_NT);
        }
        return;
    }
    lt_lora_proj pp[3];
    group_projs(s, l, st, G, ps, r0, pp);
    for (int g = 0; g < G; g++) pp[g].y = y[g];
    if (x.h) s->be->lora_fwd_bf16(s->ctx, pp, G, NULL, x.h, n, m->lora.rank, m->lora_scale, beta, mm_begin(s));
    else s->be->lora_fwd(s->ctx, pp, G, x.f, n, m->lora.rank, m->lora_scale, beta, mm_begin(s));
    mm_end(s);
}

void lt_step_proj_add(const lt_step *s, int64_t l, const lt_store *st, const lt_proj *p, int64_t r0, int64_t n,
                      lt_act x, const float *yc, float *y) {
    lt_model *m = s->m;
    if (s->train && m->lora.dropout > 0) {
        if (yc != y) {
            lt_status cs =
                s->be->copy_to_device(s->ctx, y, yc, sizeof(float) * (size_t)(n * m->layers[l].w[*p].shape[0]));
            LT_ASSERT(cs == LT_OK); /* within the device's memory */
        }
        lt_step_group_fwd(s, l, st, 1, p, r0, n, x, &y, 1.0f);
        return;
    }
    lt_lora_proj pp;
    group_projs(s, l, st, 1, p, r0, &pp);
    pp.y = y, pp.yc = yc;
    if (x.h) s->be->lora_fwd_bf16(s->ctx, &pp, 1, NULL, x.h, n, m->lora.rank, m->lora_scale, 1.0f, mm_begin(s));
    else s->be->lora_fwd(s->ctx, &pp, 1, x.f, n, m->lora.rank, m->lora_scale, 1.0f, mm_begin(s));
    mm_end(s);
}

void lt_step_group_fwd_h(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0,
                         int64_t n, const uint16_t *xh, uint16_t *const *yh) {
    lt_model *m = s->m;
    LT_ASSERT(xh && G <= 3 && !(s->train && m->lora.dropout > 0)); /* gu_bf16 comes with mlp_bf16 */
    lt_lora_proj pp[3];
    group_projs(s, l, st, G, ps, r0, pp);
    for (int g = 0; g < G; g++) pp[g].yh = yh[g];
    s->be->lora_fwd_bf16(s->ctx, pp, G, NULL, xh, n, m->lora.rank, m->lora_scale, 0.0f, mm_begin(s));
    mm_end(s);
}

/* Over the n rows from row r0, given dy (n, out) of projection p with input x: accumulates LoRA
 * grads and adds the input gradient into dx (n, in) (beta: 0 overwrites with the base part
 * first, 1 accumulates). dx = NULL skips the input gradient (nobody below needs it). */
static void proj_bwd(const lt_step *s, int64_t l, lt_proj p, int64_t r0, int64_t n, const float *x, const float *dy,
                     const float *lu, float *dx, float beta) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    const lt_tensor *w = &L->w[p];
    int64_t out = w->shape[0], in = w->shape[1], r = m->lora.rank;
    if (dx) {
        s->be->matmul(s->ctx, LT_MATMUL_NN, w, dy, n, beta, dx, mm_begin(s));
        mm_end(s);
    }
    if (!L->lora_a[p]) return;
    float sc = m->lora_scale, *dlu = lt_step_ws(s, m->lay.dlu), *scr = lt_step_ws(s, m->lay.scratch);
    int drop = m->lora.dropout > 0;
    uint64_t doff = drop_at(s, l, p, in, r0);
    /* dB += s·dyᵀ·lu ; dlu = s·dy·B ; dA += dluᵀ·drop(x) ; dx += drop'(dlu·A) */
    s->be->gemm(s->ctx, 1, 0, out, r, n, sc, dy, out, lu, r, 1.0f, L->grad_b[p], r);
    s->be->gemm(s->ctx, 0, 0, n, r, out, sc, dy, out, L->lora_b[p], r, 0.0f, dlu, r);
    const float *src = x;
    if (drop) {
        s->be->dropout(s->ctx, x, scr, n * in, m->lora.dropout, s->drop_seed, doff);
        src = scr;
    }
    s->be->gemm(s->ctx, 1, 0, r, in, n, 1.0f, dlu, r, src, in, 1.0f, L->grad_a[p], in);
    if (!dx) return;
    if (!drop) {
        s->be->gemm(s->ctx, 0, 0, n, in, r, 1.0f, dlu, r, L->lora_a[p], in, 1.0f, dx, in);
    } else {
        s->be->gemm(s->ctx, 0, 0, n, in, r, 1.0f, dlu, r, L->lora_a[p], in, 0.0f, scr, in);
        s->be->dropout(s->ctx, scr, scr, n * in, m->lora.dropout, s->drop_seed, doff);
        s->be->add(s->ctx, dx, scr, 1.0f, n * in);
    }
}

/* The backend's fused lora_bwd of projections ps[0..G) from dy[g] (f32 or bf16): dx (n, in) =
 * beta·dx + the group's input gradient, or (dxh, one projection, beta 0) that gradient in bf16;
 * LoRA grads accumulated. */
static void fused_bwd(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                      lt_act x, const lt_act *dy, float *dx, uint16_t *dxh, float beta) {
    lt_model *m = s->m;
    const lt_layer *L = &m->layers[l];
    lt_lora_proj pp[3];
    group_projs(s, l, st, G, ps, r0, pp);
    int any_h = x.h != NULL || dxh != NULL;
    for (int g = 0; g < G; g++) {
        pp[g].ga = L->grad_a[ps[g]], pp[g].gb = L->grad_b[ps[g]];
        pp[g].dy = dy[g].f, pp[g].dyh = dy[g].h;
        any_h |= dy[g].h != NULL;
    }
    float *dlu = lt_step_ws(s, m->lay.dlu);
    if (any_h)
        s->be->lora_bwd_bf16(s->ctx, pp, G, x.f, x.h, n, m->lora.rank, m->lora_scale, dx, dxh, beta, dlu, mm_begin(s));
    else s->be->lora_bwd(s->ctx, pp, G, x.f, n, m->lora.rank, m->lora_scale, dx, beta, dlu, mm_begin(s));
    mm_end(s);
}

/* The backward of group_fwd: dy[g] for each projection; dx (n, in) = beta·dx + the group's input
 * gradient (NULL: skipped), LoRA grads accumulated. The backend's fused lora_bwd, or proj_bwd one
 * by one under LoRA dropout. */
void lt_step_group_bwd(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                       lt_act x, const lt_act *dy, float *dx, float beta) {
    if (s->m->lora.dropout > 0) {
        for (int g = 0; g < G; g++) {
            LT_ASSERT(x.f && dy[g].f); /* mlp_bf16 is off under dropout */
            proj_bwd(s, l, ps[g], r0, n, x.f, dy[g].f, lu_at(s, st, ps[g], r0), dx, g ? 1.0f : beta);
        }
        return;
    }
    fused_bwd(s, l, st, G, ps, r0, n, x, dy, dx, NULL, beta);
}

void lt_step_proj_bwd_h(const lt_step *s, int64_t l, const lt_store *st, const lt_proj *p, int64_t r0, int64_t n,
                        lt_act x, const uint16_t *dyh, uint16_t *dxh) {
    LT_ASSERT(dyh && s->m->lora.dropout == 0); /* gu_bf16 comes with mlp_bf16 */
    const lt_act dy = lt_act_bf16(dyh);
    fused_bwd(s, l, st, 1, p, r0, n, x, &dy, NULL, dxh, 0.0f);
}
