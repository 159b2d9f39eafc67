/* One decoder layer, forward and backward, run from its lt_layer_desc: the attention half (norm,
 * q/k/v projections, the per-head q/k norm when the desc has it, RoPE, attention as the model's
 * attention path runs it) and the MLP half, the position-wise work a chunk of rows at a time.
 * Only attention's tensors span the batch. Nothing here allocates or chooses a mode: the layout
 * and the prepared attention path did. */
#include <string.h>

#include "longtune/context_parallel.h"
#include "model/step.h"

/* The projection groups that share an input. */
static const lt_proj O_PROJ = LT_PROJ_O, DOWN_PROJ = LT_PROJ_DOWN;

/* ---- q and k after their projections: per-head norm (desc->qk_norm) and RoPE ---- */

static const float *rope_freqs(const lt_step *s, const lt_layer *L) {
    return L->desc.rope ? s->m->inv_freq_local : s->m->inv_freq;
}

/* The per-head norm of q, k (n rows from row r0) into qo, ko (may alias q, k), when the layer has it. */
static void qk_norm_fwd(const lt_step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n, const float *q,
                        const float *k, float *qo, float *ko) {
    const lt_model_config *c = &s->m->cfg;
    if (!L->desc.qk_norm) return;
    s->be->rmsnorm_fwd(s->ctx, q, L->q_norm, c->rms_eps, n * c->H, c->D, qo, st->rstd_q + r0 * c->H);
    s->be->rmsnorm_fwd(s->ctx, k, L->k_norm, c->rms_eps, n * c->Hkv, c->D, ko, st->rstd_k + r0 * c->Hkv);
}

/* Over rows [r0, r0 + n): q, k (n rows) hold the projections on entry (f32 rows of the stores or of
 * the chunk buffer) and qo, ko receive the result (may alias q, k). */
static void qk_finish(const lt_step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n, float *q,
                      float *k, float *qo, float *ko) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    qk_norm_fwd(s, L, st, r0, n, q, k, qo, ko);
    be->rope(s->ctx, qo, s->pos + r0, rope_freqs(s, L), n, c->H, c->D, 0);
    be->rope(s->ctx, ko, s->pos + r0, rope_freqs(s, L), n, c->Hkv, c->D, 0);
}

/* qk_finish under attn_bf16 on the chunk buffer's f32 rows q, k (normed in place), the rotated rows
 * rounded into the stores' q, k: through the backend's rope_cvt where it has one, else in place
 * and then rounded. */
static void qk_finish_into_stores(const lt_step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n,
                                  float *q, float *k) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    int64_t qd = c->H * c->D, kvd = c->Hkv * c->D;
    void *qs = lt_step_at_row(s, st->q, r0, qd), *ks = lt_step_at_row(s, st->k, r0, kvd);
    if (!be->rope_cvt) {
        qk_finish(s, L, st, r0, n, q, k, q, k);
        be->to_bf16(s->ctx, q, (uint16_t *)qs, n * qd);
        be->to_bf16(s->ctx, k, (uint16_t *)ks, n * kvd);
        return;
    }
    qk_norm_fwd(s, L, st, r0, n, q, k, q, k);
    be->rope_cvt(s->ctx, q, 0, qs, 1, s->pos + r0, rope_freqs(s, L), n, c->H, c->D, 0);
    be->rope_cvt(s->ctx, k, 0, ks, 1, s->pos + r0, rope_freqs(s, L), n, c->Hkv, c->D, 0);
}

/* The per-head norm's backward over rows [r0, r0 + n): dq, dk (n rows, f32) in place. Its inputs
 * are the stores' q_raw, k_raw rows, widened into buf (n, H·D + Hkv·D) when bf16. */
static void qk_norm_bwd(const lt_step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n, float *dq,
                        float *dk, float *buf) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    int64_t qd = c->H * c->D, kvd = c->Hkv * c->D;
    const float *qr = lt_step_att_rows(s, st->q_raw, r0, n, qd, buf);
    const float *kr = lt_step_att_rows(s, st->k_raw, r0, n, kvd, buf ? buf + n * qd : NULL);
    be->rmsnorm_bwd(s->ctx, dq, qr, L->q_norm, st->rstd_q + r0 * c->H, n * c->H, c->D, dq, NULL);
    be->rmsnorm_bwd(s->ctx, dk, kr, L->k_norm, st->rstd_k + r0 * c->Hkv, n * c->Hkv, c->D, dk, NULL);
}

/* The backward of qk_finish over rows [r0, r0 + n): dq, dk (n rows, f32) in place. The norm's
 * inputs are the stores' q_raw, k_raw rows, widened into buf (n, H·D + Hkv·D) when bf16. */
static void qk_finish_bwd(const lt_step *s, const lt_layer *L, const lt_store *st, int64_t r0, int64_t n, float *dq,
                          float *dk, float *buf) {
    const lt_model_config *c = &s->m->cfg;
    s->be->rope(s->ctx, dq, s->pos + r0, rope_freqs(s, L), n, c->H, c->D, 1);
    s->be->rope(s->ctx, dk, s->pos + r0, rope_freqs(s, L), n, c->Hkv, c->D, 1);
    if (L->desc.qk_norm) qk_norm_bwd(s, L, st, r0, n, dq, dk, buf);
}

/* ---- attention, by the path lt_model_prepare chose (the device's kernel, ring or Ulysses) ---- */

typedef struct attn_grads {
    void *dout, *dq, *dk, *dv;
} attn_grads;

lt_attention_params lt_step_attn_params(const lt_step *s, const lt_layer_desc *d) {
    const lt_model_config *c = &s->m->cfg;
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = s->B, ap.T = s->T, ap.H = c->H, ap.Hkv = c->Hkv, ap.D = d->D;
    ap.dtype = s->m->lay.attn_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    ap.device = s->m->opt.device;
    ap.impl = s->m->run.attention;
    ap.window = d->window;
    ap.softcap = d->softcap;
    ap.scale = (float)c->query_scale; /* 0: the boundary's 1/sqrt(D) */
    ap.bf16_products = s->m->lay.bf16x;
    ap.seq_offsets = s->seq_offsets;
    ap.seq_offsets_device = s->seq_offsets_dev;
    ap.S = s->S;
    for (int i = 0; i < s->n_attn_batch; i++)
        if (s->attn_batch[i].window == d->window) ap.batch = &s->attn_batch[i];
    return ap;
}

static lt_attention_args attn_args(const lt_step *s, const lt_store *st, const attn_grads *g) {
    lt_attention_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = st->q, aa.k = st->k, aa.v = st->v, aa.out = st->att, aa.lse = st->lse;
    if (g) aa.dout = g->dout, aa.dq = g->dq, aa.dk = g->dk, aa.dv = g->dv;
    aa.workspace = lt_step_blk(s, LT_MEM_WORKSPACE, s->m->lay.attn_ws);
    aa.workspace_size = s->m->lay.attn_ws_bytes;
    return aa;
}

static lt_status kernel_fwd(const lt_step *s, const lt_layer *L, const lt_store *st) {
    lt_attention_params ap = lt_step_attn_params(s, &L->desc);
    lt_attention_args aa = attn_args(s, st, NULL);
    return lt_attention_forward(s->ctx, &ap, &aa);
}

static lt_status kernel_bwd(const lt_step *s, const lt_layer *L, const lt_store *st, const attn_grads *g) {
    lt_attention_params ap = lt_step_attn_params(s, &L->desc);
    lt_attention_args aa = attn_args(s, st, g);
    return lt_attention_backward(s->ctx, &ap, &aa);
}

static lt_status ring_fwd(const lt_step *s, const lt_layer *L, const lt_store *st) {
    (void)L;
    lt_cp_attention_params cp = lt_model_cp_params(s->m, s->T);
    return lt_cp_attention_forward(s->ctx, s->m->cp, &cp, st->q, st->k, st->v, st->att, st->lse);
}

static lt_status ring_bwd(const lt_step *s, const lt_layer *L, const lt_store *st, const attn_grads *g) {
    (void)L;
    lt_cp_attention_params cp = lt_model_cp_params(s->m, s->T);
    return lt_cp_attention_backward(s->ctx, s->m->cp, &cp, st->q, st->k, st->v, st->att, st->lse, g->dout, g->dq, g->dk,
                                    g->dv);
}

static lt_status ulysses_fwd(const lt_step *s, const lt_layer *L, const lt_store *st) {
    (void)L;
    const lt_model *m = s->m;
    lt_cp_attention_params cp = lt_model_cp_params(m, s->T);
    return lt_cp_ulysses_forward(s->ctx, m->cp, &cp, st->q, st->k, st->v, st->att, st->lse, m->cp_ws, m->cp_ws_bytes,
                                 m->lay.threads);
}

static lt_status ulysses_bwd(const lt_step *s, const lt_layer *L, const lt_store *st, const attn_grads *g) {
    (void)L;
    const lt_model *m = s->m;
    lt_cp_attention_params cp = lt_model_cp_params(m, s->T);
    return lt_cp_ulysses_backward(s->ctx, m->cp, &cp, st->q, st->k, st->v, st->att, st->lse, g->dout, g->dq, g->dk,
                                  g->dv, m->cp_ws, m->cp_ws_bytes, m->lay.threads);
}

static const struct {
    lt_status (*fwd)(const lt_step *s, const lt_layer *L, const lt_store *st);
    lt_status (*bwd)(const lt_step *s, const lt_layer *L, const lt_store *st, const attn_grads *g);
} attn_paths[LT_ATTN_PATH_COUNT_] = {
    [LT_ATTN_PATH_KERNEL] = {kernel_fwd, kernel_bwd},
    [LT_ATTN_PATH_RING] = {ring_fwd, ring_bwd},
    [LT_ATTN_PATH_ULYSSES] = {ulysses_fwd, ulysses_bwd},
};

static lt_status attn_fwd(const lt_step *s, const lt_layer *L, const lt_store *st) {
    return attn_paths[s->m->attn_path].fwd(s, L, st);
}

static lt_status attn_bwd(const lt_step *s, const lt_layer *L, const lt_store *st, const attn_grads *g) {
    return attn_paths[s->m->attn_path].bwd(s, L, st, g);
}

/* ---- forward ---- */

/* The norm of the n rows x (C wide) that feeds a projection group: f32 rows in h, or with bf16
 * (the layout's qkv_bf16, or mlp_bf16 in a dense layer) their bf16 rounding in h's buffer. */
static lt_act group_norm(const lt_step *s, const float *x, const float *w, int64_t n, float *h, float *rstd, int bf16) {
    const lt_model_config *c = &s->m->cfg;
    if (bf16) {
        s->be->rmsnorm_fwd_bf16(s->ctx, x, w, c->rms_eps, n, c->C, (uint16_t *)h, rstd);
        return lt_act_bf16((const uint16_t *)h);
    }
    s->be->rmsnorm_fwd(s->ctx, x, w, c->rms_eps, n, c->C, h, rstd);
    return lt_act_f32(h);
}

/* Attention's inputs of the whole batch: per chunk the norm and the q, k, v projections, into the
 * stores' f32 pieces (q_raw, k_raw with the per-head norm, else q, k; and v), or under attn_bf16
 * into the chunk buffer, normed, rotated and rounded into the stores a chunk at a time. */
static void qkv_fwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in) {
    const lt_model_config *c = &s->m->cfg;
    const lt_layer *L = &s->m->layers[l];
    const lt_backend *be = s->be;
    const lt_layout *y = &s->m->lay;
    int64_t qd = c->H * c->D, kvd = c->Hkv * c->D;
    int ab = y->attn_bf16, qn = L->desc.qk_norm;
    float *h = lt_step_ws(s, y->h), *qc = ab ? lt_step_ws(s, y->qc) : NULL, *xc = y->xc ? lt_step_ws(s, y->xc) : NULL;
    for (int64_t r0 = 0; r0 < s->N; r0 += y->chunk) {
        int64_t n = lt_step_chunk_rows(s, r0);
        float *qp = ab ? qc : (qn ? st->q_raw : st->q) + r0 * qd;
        float *kp = ab ? qc + n * qd : (qn ? st->k_raw : st->k) + r0 * kvd;
        float *vp = ab ? qc + n * (qd + kvd) : st->v + r0 * kvd;
        lt_act ha = group_norm(s, lt_resid_rows(s, x_in, r0, n, xc), L->attn_norm, n, h, st->rstd1 + r0, y->qkv_bf16);
        float *qkv[3] = {qp, kp, vp};
        lt_step_group_fwd(s, l, st, 3, lt_proj_group_qkv, r0, n, ha, qkv, 0.0f);
        if (!ab) continue;
        if (qn) { /* keep the norm's inputs (rounded) for its backward, then norm in place */
            be->to_bf16(s->ctx, qp, (uint16_t *)lt_step_at_row(s, st->q_raw, r0, qd), n * qd);
            be->to_bf16(s->ctx, kp, (uint16_t *)lt_step_at_row(s, st->k_raw, r0, kvd), n * kvd);
        }
        qk_finish_into_stores(s, L, st, r0, n, qp, kp);
        be->to_bf16(s->ctx, vp, (uint16_t *)lt_step_at_row(s, st->v, r0, kvd), n * kvd);
    }
    if (!ab) qk_finish(s, L, st, 0, s->N, qn ? st->q_raw : st->q, qn ? st->k_raw : st->k, st->q, st->k);
}

/* ---- the blocks' outputs onto the residual: y += proj(x), or with sandwich norms
 * y += norm(proj(x)) (the post-norm's input rebuilt in the backward, not kept) ---- */

static int sandwich(const lt_layer *L) { return L->desc.norm == LT_NORM_PLACE_SANDWICH; }

/* y (n, C) = the residual yc (n, C; may be y) + the block output proj(x) of rows [r0, r0 + n),
 * through post_norm when sandwiched. */
static lt_status block_out_fwd(const lt_step *s, int64_t l, const lt_store *st, const lt_proj *proj,
                               const float *post_norm, int64_t r0, int64_t n, lt_act x, const float *yc, float *y) {
    const lt_layout *lay = &s->m->lay;
    if (!sandwich(&s->m->layers[l])) {
        lt_step_proj_add(s, l, st, proj, r0, n, x, yc, y);
        return LT_OK;
    }
    const lt_model_config *c = &s->m->cfg;
    if (yc != y) LT_TRY(s->be->copy_to_device(s->ctx, y, yc, (size_t)(n * c->C) * 4));
    float *pn = lt_step_ws(s, lay->pn);
    lt_step_group_fwd(s, l, st, 1, proj, r0, n, x, &pn, 0.0f);
    s->be->rmsnorm_fwd(s->ctx, pn, post_norm, c->rms_eps, n, c->C, pn, lt_step_ws(s, lay->prs));
    s->be->add(s->ctx, y, pn, 1.0f, n * c->C);
    return LT_OK;
}

/* The gradient at the projection's output for rows [r0, r0 + n) given dy (n, C), the residual's:
 * dy itself, or through the post-norm (its input proj(x) rerun into pn, the result in the
 * workspace's dh). */
static const float *block_out_grad(const lt_step *s, int64_t l, const lt_store *st, const lt_proj *proj,
                                   const float *post_norm, int64_t r0, int64_t n, lt_act x, const float *dy) {
    if (!sandwich(&s->m->layers[l])) return dy;
    const lt_model_config *c = &s->m->cfg;
    const lt_layout *lay = &s->m->lay;
    float *pn = lt_step_ws(s, lay->pn), *dh = lt_step_ws(s, lay->dh), *rs = lt_step_ws(s, lay->prs);
    lt_step_group_fwd(s, l, st, 1, proj, r0, n, x, &pn, 0.0f);
    s->be->rmsnorm_fwd(s->ctx, pn, post_norm, c->rms_eps, n, c->C, dh, rs);
    s->be->rmsnorm_bwd(s->ctx, dy, pn, post_norm, rs, n, c->C, dh, NULL);
    return dh;
}

/* Attention's output rows [r0, r0 + n), the o projection's input: the store's bf16 rows in place
 * under o_bf16, else f32 (in place, or widened into ac under attn_bf16). */
static lt_act o_input(const lt_step *s, const lt_store *st, int64_t r0, int64_t n) {
    const lt_layout *y = &s->m->lay;
    int64_t qd = s->m->cfg.H * s->m->cfg.D;
    if (y->o_bf16) return lt_act_bf16((const uint16_t *)lt_step_at_row(s, st->att, r0, qd));
    return lt_act_f32(lt_step_att_rows(s, st->att, r0, n, qd, y->attn_bf16 ? lt_step_ws(s, y->ac) : NULL));
}

/* x_mid = x_in + o_proj(att) over rows [r0, r0 + n), in the store's x_mid (f32) or, under
 * attn_bf16, in the chunk buffer mc, with the store keeping it rounded and the rows going on with
 * the rounded values the backward will read. Returns the f32 rows. */
static lt_status mid_fwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in, int64_t r0, int64_t n,
                         float **xm_out) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    const lt_layout *y = &s->m->lay;
    int64_t C = c->C;
    int ab = y->attn_bf16;
    float *xm = ab ? lt_step_ws(s, y->mc) : st->x_mid + r0 * C;
    lt_act att = o_input(s, st, r0, n);
    const float *xi = xm; /* the residual the o projection adds onto: x_in's rows, read in place when f32 */
    if (x_in.f) xi = x_in.f + r0 * C;
    else be->from_bf16(s->ctx, x_in.h + r0 * C, xm, n * C);
    LT_TRY(block_out_fwd(s, l, st, &O_PROJ, s->m->layers[l].post_attn_norm, r0, n, att, xi, xm));
    if (ab) {
        uint16_t *xm16 = (uint16_t *)lt_step_at_row(s, st->x_mid, r0, C);
        be->to_bf16(s->ctx, xm, xm16, n * C);
        be->from_bf16(s->ctx, xm16, xm, n * C);
    }
    *xm_out = xm;
    return LT_OK;
}

/* Rows [r0, ...) of the gate or up output: the store's (kept, no recompute) or the chunk buffer
 * at ws_off; f32, or bf16 under gu_bf16. */
static void *gu_rows(const lt_step *s, float *kept, size_t ws_off, int64_t r0) {
    if (!kept) return lt_step_ws(s, ws_off);
    return (char *)kept + (size_t)(r0 * s->m->cfg.F) * (s->m->lay.gu_bf16 ? 2 : 4);
}

/* g, u = gate(h2), up(h2) over the n rows from r0, in bf16 under gu_bf16. */
static void gate_up_fwd(const lt_step *s, int64_t l, const lt_store *st, int64_t r0, int64_t n, lt_act ha, void *g,
                        void *u) {
    if (s->m->lay.gu_bf16) {
        uint16_t *gu[2] = {(uint16_t *)g, (uint16_t *)u};
        lt_step_group_fwd_h(s, l, st, 2, lt_proj_group_gate_up, r0, n, ha.h, gu);
        return;
    }
    float *gu[2] = {(float *)g, (float *)u};
    lt_step_group_fwd(s, l, st, 2, lt_proj_group_gate_up, r0, n, ha, gu, 0.0f);
}

/* The gated activation of the layer's MLP kind, a = act(g)·u (SiLU or GELU's tanh form), into
 * buf (n f32 elements): f32, or under mlp_bf16 bf16 in its first half. */
static lt_act glu_fwd(const lt_step *s, const lt_layer *L, const void *g, const void *u, int64_t n, float *buf) {
    int gelu = L->desc.mlp == LT_MLP_KIND_GEGLU;
    const lt_layout *y = &s->m->lay;
    if (y->mlp_bf16) {
        s->be->glu_fwd_bf16(s->ctx, gelu, g, u, y->gu_bf16, n, (uint16_t *)buf);
        return lt_act_bf16((const uint16_t *)buf);
    }
    if (gelu) s->be->geglu_fwd(s->ctx, (const float *)g, (const float *)u, n, buf);
    else s->be->swiglu_fwd(s->ctx, (const float *)g, (const float *)u, n, buf);
    return lt_act_f32(buf);
}

/* Its backward from da (bf16, with g and u, under gu_bf16): dg, du into buf's two halves in bf16
 * under mlp_bf16, else f32 dg into buf and du over u (read for the last time there). */
static void glu_bwd(const lt_step *s, const lt_layer *L, const void *da, const void *g, void *u, int64_t n, float *buf,
                    lt_act *dgu) {
    int gelu = L->desc.mlp == LT_MLP_KIND_GEGLU;
    const lt_layout *y = &s->m->lay;
    if (y->mlp_bf16) {
        uint16_t *dg = (uint16_t *)buf, *du = dg + n;
        s->be->glu_bwd_bf16(s->ctx, gelu, da, g, u, y->gu_bf16, n, dg, du);
        dgu[0] = lt_act_bf16(dg), dgu[1] = lt_act_bf16(du);
        return;
    }
    const float *df = (const float *)da;
    float *gf = (float *)g, *uf = (float *)u;
    if (gelu) s->be->geglu_bwd(s->ctx, df, gf, uf, n, buf, uf);
    else s->be->swiglu_bwd(s->ctx, df, gf, uf, n, buf, uf);
    dgu[0] = lt_act_f32(buf), dgu[1] = lt_act_f32(uf);
}

/* x_out = x_mid + down(glu(gate(h2), up(h2))), h2 = norm(x_mid), over rows [r0, r0 + n); with
 * sandwich norms the down projection's output goes through the post-MLP norm first. */
static lt_status mlp_fwd(const lt_step *s, int64_t l, const lt_store *st, const float *xm, lt_resid x_out, int64_t r0,
                         int64_t n) {
    const lt_model_config *c = &s->m->cfg;
    const lt_layer *L = &s->m->layers[l];
    const lt_backend *be = s->be;
    const lt_layout *y = &s->m->lay;
    int64_t C = c->C, F = c->F;
    float *h = lt_step_ws(s, y->h);
    int moe = L->desc.mlp == LT_MLP_KIND_MOE;
    lt_act ha = group_norm(s, xm, L->mlp_norm, n, h, st->rstd2 + r0, y->mlp_bf16 && !moe);
    if (moe) { /* the routed experts (moe.c) onto the residual */
        float *xo = x_out.f ? x_out.f + r0 * C : y->xc ? lt_step_ws(s, y->xc) : NULL;
        LT_TRY(be->copy_to_device(s->ctx, xo, xm, (size_t)(n * C) * 4));
        lt_step_moe_fwd(s, l, r0, h, n, xo);
        if (!x_out.f) be->to_bf16(s->ctx, xo, x_out.h + r0 * C, n * C);
        return LT_OK;
    }
    void *g = gu_rows(s, st->g, y->g, r0), *u = gu_rows(s, st->u, y->u, r0);
    gate_up_fwd(s, l, st, r0, n, ha, g, u);
    lt_act a = glu_fwd(s, L, g, u, n * F, lt_step_ws(s, y->dg));
    float *xo = x_out.f ? x_out.f + r0 * C : y->xc ? lt_step_ws(s, y->xc) : NULL;
    LT_TRY(block_out_fwd(s, l, st, &DOWN_PROJ, L->post_mlp_norm, r0, n, a, xm, xo));
    if (!x_out.f) be->to_bf16(s->ctx, xo, x_out.h + r0 * C, n * C);
    return LT_OK;
}

/* Layer l: x_out = layer(x_in), filling st (whose x_in field is ignored: x_in is passed). An f32
 * x_out may alias x_in (a chunk of rows is read before the same rows are written, and no later
 * chunk reads them). x_out empty is the recompute before the layer's own backward, which needs the
 * attention half's stores and x_mid but not the MLP: the backward reruns the MLP chunk by chunk.
 * att_kept = 1: st->att and st->lse hold this layer's attention from the first pass (kept with the
 * checkpoints, bit-identical to a rerun), so it is not rerun; with the layout's keep_qkv the whole
 * attention half is kept (x_mid included), and only the MLP runs, when x_out is wanted. */
lt_status lt_step_layer_fwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in, lt_resid x_out,
                            int att_kept) {
    const lt_layout *y = &s->m->lay;
    int half_kept = att_kept && y->keep_qkv, want_out = x_out.f || x_out.h;
    if (half_kept && !want_out) return LT_OK;
    if (!half_kept) qkv_fwd(s, l, st, x_in);
    if (!att_kept) LT_TRY(attn_fwd(s, &s->m->layers[l], st));
    for (int64_t r0 = 0; r0 < s->N; r0 += y->chunk) {
        int64_t n = lt_step_chunk_rows(s, r0);
        float *xm;
        if (half_kept) /* x_mid kept from the first pass (rounded there under attn_bf16) */
            xm = lt_step_att_rows(s, st->x_mid, r0, n, s->m->cfg.C, y->attn_bf16 ? lt_step_ws(s, y->mc) : NULL);
        else LT_TRY(mid_fwd(s, l, st, x_in, r0, n, &xm));
        if (want_out) LT_TRY(mlp_fwd(s, l, st, xm, x_out, r0, n));
    }
    return LT_OK;
}

/* ---- backward ---- */

/* dx (n, C) += the norm's input gradient from dy (n, C; overwritten where the backend has no fused
 * op, which then runs the norm's backward in place and adds). */
static void norm_bwd_add(const lt_step *s, float *dy, const float *x, const float *w, const float *rstd, int64_t n,
                         float *dx) {
    int64_t C = s->m->cfg.C;
    if (s->be->rmsnorm_bwd_add) {
        s->be->rmsnorm_bwd_add(s->ctx, dy, x, w, rstd, n, C, dx);
        return;
    }
    s->be->rmsnorm_bwd(s->ctx, dy, x, w, rstd, n, C, dy, NULL);
    s->be->add(s->ctx, dx, dy, 1.0f, n * C);
}

/* The MLP over rows [r0, r0 + n): its norm, gate and up projections (unless the store kept them)
 * and the gated activation are rerun from x_mid, then differentiated; dx += ∂/∂x_mid through the MLP, so
 * nothing F-wide spans the batch. */
static void mlp_bwd(const lt_step *s, int64_t l, const lt_store *st, float *dx, int64_t r0, int64_t n) {
    const lt_model_config *c = &s->m->cfg;
    const lt_layer *L = &s->m->layers[l];
    const lt_layout *y = &s->m->lay;
    int64_t C = c->C, F = c->F;
    float *h = lt_step_ws(s, y->h), *da = lt_step_ws(s, y->da), *dg = lt_step_ws(s, y->dg);
    float *dh = lt_step_ws(s, y->dh);
    float *xm = lt_step_att_rows(s, st->x_mid, r0, n, C, y->attn_bf16 ? lt_step_ws(s, y->mc) : NULL),
          *dxc = dx + r0 * C;
    int moe = L->desc.mlp == LT_MLP_KIND_MOE;
    lt_act ha = group_norm(s, xm, L->mlp_norm, n, h, st->rstd2 + r0, y->mlp_bf16 && !moe);
    if (moe) { /* the routed experts (moe.c), rerun from h */
        lt_step_moe_bwd(s, l, r0, h, dxc, n, dh);
        norm_bwd_add(s, dh, xm, L->mlp_norm, st->rstd2 + r0, n, dxc);
        return;
    }
    void *g = gu_rows(s, st->g, y->g, r0), *u = gu_rows(s, st->u, y->u, r0);
    if (!st->g) gate_up_fwd(s, l, st, r0, n, ha, g, u);
    /* the activation goes into dg's buffer, which the glu backward then overwrites */
    lt_act a = glu_fwd(s, L, g, u, n * F, dg);
    float *no_y = NULL;
    /* its LoRA product (the sandwich's post-norm gradient reruns the whole projection instead) */
    if (!st->g && !sandwich(L)) lt_step_group_fwd(s, l, st, 1, &DOWN_PROJ, r0, n, a, &no_y, 1.0f);
    const float *dyd = block_out_grad(s, l, st, &DOWN_PROJ, L->post_mlp_norm, r0, n, a, dxc);
    if (y->gu_bf16) { /* dy rounded into h's second half (h holds the bf16 norm output in its first) */
        uint16_t *dyh = (uint16_t *)h + n * C;
        s->be->to_bf16(s->ctx, dyd, dyh, n * C);
        lt_step_proj_bwd_h(s, l, st, &DOWN_PROJ, r0, n, a, dyh, (uint16_t *)da);
    } else {
        lt_act dyc = lt_act_f32(dyd);
        lt_step_group_bwd(s, l, st, 1, &DOWN_PROJ, r0, n, a, &dyc, da, 0.0f);
    }
    lt_act dgu[2];
    glu_bwd(s, L, da, g, u, n * F, dg, dgu);
    lt_step_group_bwd(s, l, st, 2, lt_proj_group_gate_up, r0, n, ha, dgu, dh, 0.0f);
    norm_bwd_add(s, dh, xm, L->mlp_norm, st->rstd2 + r0, n, dxc); /* dx = ∂/∂x_mid on these rows */
}

/* The o projection over rows [r0, r0 + n): ∂/∂att into the whole-batch datt (rounded through the
 * chunk buffer under attn_bf16). */
static void o_bwd(const lt_step *s, int64_t l, const lt_store *st, const float *dx, void *datt, int64_t r0, int64_t n) {
    const lt_layout *y = &s->m->lay;
    int64_t qd = s->m->cfg.H * s->m->cfg.D;
    int ab = y->attn_bf16;
    lt_act att = o_input(s, st, r0, n);
    float *dattc = ab ? lt_step_ws(s, y->qc) : (float *)lt_step_at_row(s, datt, r0, qd);
    lt_act dyo = lt_act_f32(
        block_out_grad(s, l, st, &O_PROJ, s->m->layers[l].post_attn_norm, r0, n, att, dx + r0 * s->m->cfg.C));
    lt_step_group_bwd(s, l, st, 1, &O_PROJ, r0, n, att, &dyo, dattc, 0.0f);
    if (ab) s->be->to_bf16(s->ctx, dattc, (uint16_t *)lt_step_at_row(s, datt, r0, qd), n * qd);
}

/* Under attn_bf16, the gradients at the q, k, v projections' outputs over rows [r0, r0 + n) from
 * attention's bf16 dq, dk, dv, through RoPE's and the per-head norm's backward: f32 rows in the
 * chunk buffer qc, or where the q/k/v products take bf16 inputs (qkv_bf16) and the backend has
 * rope_cvt, bf16 rows (dv read in place; without the per-head norm, dq and dk rotated from bf16
 * into bf16). */
static void qkv_grads_bf16(const lt_step *s, const lt_layer *L, const lt_store *st, const attn_grads *g, int64_t r0,
                           int64_t n, lt_act *d) {
    const lt_model_config *c = &s->m->cfg;
    const lt_backend *be = s->be;
    const lt_layout *y = &s->m->lay;
    int64_t qd = c->H * c->D, kvd = c->Hkv * c->D;
    float *qc = lt_step_ws(s, y->qc), *ac = lt_step_ws(s, y->ac);
    const void *dq = lt_step_at_row(s, g->dq, r0, qd), *dk = lt_step_at_row(s, g->dk, r0, kvd);
    const void *dv = lt_step_at_row(s, g->dv, r0, kvd);
    int h = y->qkv_bf16 && be->rope_cvt, qn = L->desc.qk_norm;
    const float *fr = rope_freqs(s, L);
    if (h) d[2] = lt_act_bf16((const uint16_t *)dv);
    else d[2] = lt_act_f32(lt_step_att_rows(s, g->dv, r0, n, kvd, qc + n * (qd + kvd)));
    if (!be->rope_cvt) {
        float *dqc = lt_step_att_rows(s, g->dq, r0, n, qd, qc);
        float *dkc = lt_step_att_rows(s, g->dk, r0, n, kvd, qc + n * qd);
        qk_finish_bwd(s, L, st, r0, n, dqc, dkc, ac);
        d[0] = lt_act_f32(dqc), d[1] = lt_act_f32(dkc);
        return;
    }
    if (h && !qn) { /* bf16 to bf16, in qc's buffer */
        uint16_t *q16 = (uint16_t *)qc, *k16 = q16 + n * qd;
        be->rope_cvt(s->ctx, dq, 1, q16, 1, s->pos + r0, fr, n, c->H, c->D, 1);
        be->rope_cvt(s->ctx, dk, 1, k16, 1, s->pos + r0, fr, n, c->Hkv, c->D, 1);
        d[0] = lt_act_bf16(q16), d[1] = lt_act_bf16(k16);
        return;
    }
    be->rope_cvt(s->ctx, dq, 1, qc, 0, s->pos + r0, fr, n, c->H, c->D, 1);
    be->rope_cvt(s->ctx, dk, 1, qc + n * qd, 0, s->pos + r0, fr, n, c->Hkv, c->D, 1);
    if (qn) qk_norm_bwd(s, L, st, r0, n, qc, qc + n * qd, ac);
    d[0] = lt_act_f32(qc), d[1] = lt_act_f32(qc + n * qd);
}

/* q, k, v back to the layer input over rows [r0, r0 + n): RoPE and the per-head norm (here under
 * attn_bf16, else done once over the batch), the projections' LoRA grads, and with need_dx
 * dx += ∂/∂x_in through the attention half. */
static void qkv_bwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in, const attn_grads *g, float *dx,
                    int need_dx, int64_t r0, int64_t n) {
    const lt_model_config *c = &s->m->cfg;
    const lt_layer *L = &s->m->layers[l];
    const lt_layout *y = &s->m->lay;
    int64_t C = c->C, qd = c->H * c->D, kvd = c->Hkv * c->D;
    float *h = lt_step_ws(s, y->h), *dh = lt_step_ws(s, y->dh);
    lt_act dqkv[3];
    if (y->attn_bf16) {
        qkv_grads_bf16(s, L, st, g, r0, n, dqkv);
    } else { /* the whole batch's f32 rows, RoPE's and the norm's backward already run */
        dqkv[0] = lt_act_f32((const float *)lt_step_at_row(s, g->dq, r0, qd));
        dqkv[1] = lt_act_f32((const float *)lt_step_at_row(s, g->dk, r0, kvd));
        dqkv[2] = lt_act_f32((const float *)lt_step_at_row(s, g->dv, r0, kvd));
    }
    const float *xr = lt_resid_rows(s, x_in, r0, n, y->xc ? lt_step_ws(s, y->xc) : NULL);
    lt_act ha = group_norm(s, xr, L->attn_norm, n, h, st->rstd1 + r0, y->qkv_bf16);
    lt_step_group_bwd(s, l, st, 3, lt_proj_group_qkv, r0, n, ha, dqkv, need_dx ? dh : NULL, 0.0f);
    if (!need_dx) return;
    norm_bwd_add(s, dh, xr, L->attn_norm, st->rstd1 + r0, n, dx + r0 * C);
}

/* dx (N, C) holds ∂/∂x_out on entry and ∂/∂x_in on return. x_in is the layer's input. need_dx = 0
 * (the first LoRA layer: everything below it, the embedding included, is frozen) skips the
 * attention block's input gradient and leaves dx at ∂/∂x_mid. */
lt_status lt_step_layer_bwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in, float *dx, int need_dx) {
    const lt_layout *y = &s->m->lay;
    const lt_layer *L = &s->m->layers[l];
    for (int64_t r0 = 0; r0 < s->N; r0 += y->chunk) mlp_bwd(s, l, st, dx, r0, lt_step_chunk_rows(s, r0));
    /* Attention: x_mid = x_in + o(attn(rope(norm?(q(h1))), ...)), h1 = norm(x_in) */
    attn_grads g = {lt_step_ws(s, y->datt), lt_step_ws(s, y->dq), lt_step_ws(s, y->dk), lt_step_ws(s, y->dv)};
    for (int64_t r0 = 0; r0 < s->N; r0 += y->chunk) o_bwd(s, l, st, dx, g.dout, r0, lt_step_chunk_rows(s, r0));
    LT_TRY(attn_bwd(s, L, st, &g));
    if (!y->attn_bf16) qk_finish_bwd(s, L, st, 0, s->N, g.dq, g.dk, NULL);
    for (int64_t r0 = 0; r0 < s->N; r0 += y->chunk)
        qkv_bwd(s, l, st, x_in, &g, dx, need_dx, r0, lt_step_chunk_rows(s, r0));
    return LT_OK;
}
