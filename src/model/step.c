/* One step over the layer list: the batch's validation and staging (once per step), the
 * embedding and frozen layers, the LoRA layers with gradient checkpointing by segments, the final
 * norm and the fused loss, the backward from the top (recomputing a segment from its checkpoint
 * as it is entered), and the forward-only and logits entry points. No op is called directly and
 * nothing is allocated inside a step (the logits calls of a device model excepted). */
#include <math.h>
#include <string.h>

#include "backend/prof.h"
#include "core/fastmath.h"
#include "core/parallel.h"
#include "longtune/alloc.h"
#include "model/config_bounds.h"
#include "model/step.h"

/* The scratch store of the LoRA-free layers: slot 0, or the first kept store when there are no
 * slots (no recompute). */
static lt_store scratch_store(const lt_step *s) {
    const lt_layout *y = &s->m->lay;
    lt_store st;
    if (y->n_tr_stores) lt_model_store_at(y, lt_step_blk(s, LT_MEM_TRANSIENTS, y->tr_stores), 0, &st);
    else lt_model_store_at(y, lt_step_blk(s, LT_MEM_ACTIVATIONS, y->act_stores), 1, &st);
    return st;
}

/* The store of LoRA layer j: its own in the activation block when kept, else its segment's slot
 * for its place in the segment. */
static lt_store store_of(const lt_step *s, int64_t j) {
    const lt_layout *y = &s->m->lay;
    const lt_rc_place *p = &s->rc[j];
    lt_store st;
    if (!p->rec)
        lt_model_store_at(y, lt_step_blk(s, LT_MEM_ACTIVATIONS, y->act_stores + (size_t)p->idx * y->act_store_bytes), 1,
                          &st);
    else
        lt_model_store_at(y, lt_step_blk(s, LT_MEM_TRANSIENTS, y->tr_stores + (size_t)p->pos * y->store_bytes), 0, &st);
    return st;
}

/* The batch's shape against the prepared run, and the step's state from it (nothing read yet
 * from the token arrays). */
static lt_status begin_step(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, lt_step *s, int train) {
    if (!m->prepared) return lt_error(ctx, LT_ERR_INVALID_ARG, "model: lt_model_prepare was not called");
    if (train && m->run.forward_only)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: prepared forward_only; backward needs a training prepare");
    if (!b || !b->tokens || b->B <= 0 || b->T <= 0 || b->B > m->run.B || b->T > m->run.T ||
        b->B * b->T > m->run.B * m->run.T)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: batch (%lld, %lld) exceeds the prepared (%lld, %lld)",
                        b ? (long long)b->B : 0LL, b ? (long long)b->T : 0LL, (long long)m->run.B, (long long)m->run.T);
    if (lt_parallel_threads(lt_ctx_threads(ctx)) > lt_parallel_threads(m->lay.threads))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: context runs %d threads, workspaces were sized for %d",
                        lt_parallel_threads(lt_ctx_threads(ctx)), lt_parallel_threads(m->lay.threads));
    memset(s, 0, sizeof *s);
    s->ctx = ctx, s->m = m, s->be = m->be;
    s->B = b->B, s->T = b->T, s->N = b->B * b->T;
    s->seq_offsets = b->seq_offsets, s->S = b->seq_offsets ? b->S : 0;
    if (b->seq_offsets && (b->S < 1 || b->S > b->T))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: S = %lld sequences per row is outside 1..T = %lld",
                        (long long)b->S, (long long)b->T);
    s->train = train;
    s->drop_seed = m->lora.seed ^ ((b->step + 1) * 0x9e3779b97f4a7c15ULL);
    if (b->first_row < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: negative first_row %lld", (long long)b->first_row);
    s->drop_row0 = (uint64_t)(b->first_row * b->T);
    if (m->attn_path == LT_ATTN_PATH_RING && m->lay.attn_bf16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "model: context parallel ring attention takes f32 tensors; prepare "
                        "with saved_bf16 = -1");
    if (m->cp && (b->B != 1 || b->seq_offsets))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "model: context parallel steps take one row (B = 1) without seq_offsets");
    s->tokens = b->tokens;
    s->targets = b->targets;
    s->defer_loss = b->defer_loss;
    return LT_OK;
}

/* Tokens, positions (into pos) and targets checked on the host, before any upload: the kernels
 * then need no check of their own on the device (which would wait for it). Counts the targets. */
static lt_status check_tokens(lt_step *s, const lt_model_batch *b, int32_t *pos) {
    const int64_t V = s->m->cfg.V;
    for (int64_t i = 0; i < s->N; i++)
        if (b->tokens[i] < 0 || b->tokens[i] >= V)
            return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: token %d at position %lld is outside [0, %lld)",
                            (int)b->tokens[i], (long long)i, (long long)V);
    for (int64_t i = 0; i < s->N; i++) {
        int32_t p = b->positions ? b->positions[i] : (int32_t)(i % b->T);
        if (p < 0)
            return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: negative position %d at %lld", (int)p, (long long)i);
        pos[i] = p;
    }
    s->pos = pos;
    if (!b->targets) return LT_OK;
    for (int64_t i = 0; i < s->N; i++) {
        int32_t t = b->targets[i];
        if (t == LT_IGNORE_INDEX) continue;
        if (t < 0 || t >= V)
            return lt_error(s->ctx, LT_ERR_INVALID_ARG,
                            "model: target %d at position %lld is outside [0, %lld) "
                            "and is not the ignore index %d",
                            (int)t, (long long)i, (long long)V, LT_IGNORE_INDEX);
        s->n_tok++;
    }
    return LT_OK;
}

/* A device run: tokens, targets, positions (already at stage), dloss and the offsets into the
 * host block laid out as the device's inputs piece, copied in with one transfer (upload = 0
 * leaves the copy to a captured step's replay); the step then reads the device copies. */
static lt_status stage_inputs(lt_step *s, const lt_model_batch *b, int upload) {
    const lt_model *m = s->m;
    const lt_layout *y = &m->lay;
    uint8_t *stage = m->host_inputs;
    size_t nb = (size_t)s->N * sizeof(int32_t);
    memcpy(stage + y->in_tokens, b->tokens, nb);
    if (b->targets) memcpy(stage + y->in_targets, b->targets, nb);
    float scal[4] = {0.0f, s->dloss, s->aux_scale, 0.0f};
    memcpy(stage + y->in_scalars, scal, sizeof scal);
    if (s->seq_offsets) memcpy(stage + y->in_offs, s->seq_offsets, (size_t)(s->B * (s->S + 1)) * sizeof(int32_t));
    uint8_t *dev = lt_step_blk(s, LT_MEM_TRANSIENTS, y->inputs);
    if (upload) LT_TRY(m->be->copy_to_device(s->ctx, dev, stage, y->in_bytes));
    s->tokens = (const int32_t *)(dev + y->in_tokens);
    s->targets = b->targets ? (const int32_t *)(dev + y->in_targets) : NULL;
    s->pos = (const int32_t *)(dev + y->in_pos);
    s->scalars = (float *)(dev + y->in_scalars);
    if (s->seq_offsets) s->seq_offsets_dev = (const int32_t *)(dev + y->in_offs);
    return LT_OK;
}

/* Attention's part of the batch (the device's kernel path): per distinct window of the layers,
 * the offsets validated and, with prepare, the backend's key bounds made into the layout's buffer
 * for every layer's forward and backward to read; without (a captured step's staging, whose
 * replay recomputes them), the validation alone. */
static lt_status prepare_attention(lt_step *s, int prepare) {
    const lt_model *m = s->m;
    const lt_layout *y = &m->lay;
    if (m->attn_path != LT_ATTN_PATH_KERNEL) return LT_OK;
    for (int i = 0; i < y->n_attn_batch; i++) {
        const lt_layer_desc *d = NULL;
        for (int64_t l = 0; l < m->cfg.L && !d; l++)
            if (m->layers[l].desc.attn != LT_ATTN_KIND_NONE && m->layers[l].desc.window == y->attn_window[i])
                d = &m->layers[l].desc;
        if (!d)
            return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: no layer has the layout's window %lld",
                            (long long)y->attn_window[i]);
        lt_attention_params ap = lt_step_attn_params(s, d);
        if (!prepare) {
            LT_TRY(lt_attention_check(s->ctx, &ap));
            continue;
        }
        void *buf = y->attn_batch_bytes
            ? lt_step_blk(s, LT_MEM_TRANSIENTS, y->attn_batch + (size_t)i * y->attn_batch_bytes)
            : NULL;
        LT_TRY(lt_attention_batch_prepare(s->ctx, &ap, buf, y->attn_batch_bytes, &s->attn_batch[i]));
        s->n_attn_batch = i + 1;
    }
    return LT_OK;
}

/* The per-batch preparation, once per step: validates the batch on the host, makes its inputs
 * visible to the backend (the caller's arrays in place on the host; one staged upload on a
 * device) and prepares attention's part of it. */
static lt_status check_batch(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, lt_step *s, int train, float grad_scale,
                             int upload) {
    LT_TRY(begin_step(ctx, m, b, s, train));
    const lt_layout *y = &m->lay;
    int32_t *pos =
        m->host_inputs ? (int32_t *)(m->host_inputs + y->in_pos) : (int32_t *)lt_step_blk(s, LT_MEM_TRANSIENTS, y->pos);
    LT_TRY(check_tokens(s, b, pos));
    s->dloss = grad_scale != 0 ? grad_scale : (s->n_tok ? 1.0f / (float)s->n_tok : 0.0f);
    LT_TRY(lt_step_moe_check(s, b));
    if (m->host_inputs) LT_TRY(stage_inputs(s, b, upload));
    lt_step_moe_bind(s);
    return prepare_attention(s, upload);
}

/* Device runs: the loss, the MoE aux loss's sum (and per-token losses) come back to the host once,
 * after the whole step is queued. The one read inside a step. */
static lt_status read_loss(const lt_step *s, lt_model_result *res, float *token_loss) {
    if (!s->scalars) {
        res->aux_loss = lt_step_moe_aux(s->aux_norm, s->moe_host[1]);
        return LT_OK;
    }
    if (s->defer_loss) return LT_OK;
    float sc[4] = {0, 0, 0, 0};
    LT_TRY(s->be->copy_to_host(s->ctx, sc, s->scalars, sizeof sc));
    res->loss_sum = sc[0];
    res->aux_loss = lt_step_moe_aux(s->aux_norm, sc[3]);
    if (token_loss)
        LT_TRY(s->be->copy_to_host(s->ctx, token_loss, lt_step_blk(s, LT_MEM_TRANSIENTS, s->m->lay.tloss),
                                   (size_t)s->N * sizeof(float)));
    return LT_OK;
}

/* Embedding and the frozen layers below the first LoRA layer, into `out` (N, C), in place (the
 * layers take x_out = x_in). The LoRA-free layers use store slot 0 as scratch; `upto` is the
 * first layer not run. */
static lt_status run_plain(const lt_step *s, int64_t upto, float *out) {
    lt_model *m = s->m;
    s->be->embedding(s->ctx, &m->embed, s->tokens, s->N, out);
    /* Gemma: the rows times sqrt(C) rounded to f32 (transformers' normalizer in the hidden dtype) */
    if (m->cfg.embed_scale > 0 && m->cfg.embed_scale != 1.0f)
        s->be->scale(s->ctx, out, m->cfg.embed_scale, s->N * m->cfg.C);
    lt_store st = scratch_store(s);
    for (int64_t l = 0; l < upto; l++) LT_TRY(lt_step_layer_fwd(s, l, &st, lt_resid_f32(out), lt_resid_f32(out), 0));
    return LT_OK;
}

static lt_status final_loss(const lt_step *s, const lt_model_batch *b, int backward, float grad_scale,
                            lt_model_result *res, float *token_loss) {
    lt_model *m = s->m;
    const lt_model_config *c = &m->cfg;
    const lt_layout *y = &m->lay;
    float *xf = lt_step_xf(s), *hf = lt_step_hf(s);
    float *rstd = (float *)lt_step_blk(s, LT_MEM_TRANSIENTS, y->rstd_f);
    if (y->hf_bf16) s->be->rmsnorm_fwd_bf16(s->ctx, xf, m->final_norm, c->rms_eps, s->N, c->C, (uint16_t *)hf, rstd);
    else s->be->rmsnorm_fwd(s->ctx, xf, m->final_norm, c->rms_eps, s->N, c->C, hf, rstd);
    if (!b->targets) return lt_error(s->ctx, LT_ERR_INVALID_ARG, "model: batch has no targets");
    int64_t n_tok = s->n_tok;
    lt_lce_options lo;
    memset(&lo, 0, sizeof lo);
    lo.impl = m->run.loss;
    lo.reduction = LT_REDUCTION_SUM;
    lo.softcap = c->final_softcap; /* Gemma's final-logit softcap, inside the fused loss */
    lo.bf16_products = m->lay.bf16x;
    float loss = 0;
    int64_t hs[2] = {s->N, c->C};
    lt_lce_args la;
    memset(&la, 0, sizeof la);
    la.h = lt_tensor_view(hf, y->hf_bf16 ? LT_DTYPE_BF16 : LT_DTYPE_F32, m->opt.device, 2, hs);
    la.w = m->head;
    la.targets = s->targets;
    la.loss = s->scalars ? s->scalars : &loss; /* a device loss is read back by read_loss */
    la.lse = (float *)lt_step_blk(s, LT_MEM_TRANSIENTS, y->lse_f);
    la.token_loss = s->scalars && token_loss ? (float *)lt_step_blk(s, LT_MEM_TRANSIENTS, y->tloss) : token_loss;
    la.workspace = lt_step_blk(s, LT_MEM_WORKSPACE, y->lce_ws);
    la.targets_checked = 1; /* check_batch did, on the host */
    res->n_tokens = n_tok;
    if (!backward) {
        LT_TRY(lt_lce_forward(s->ctx, &lo, &la));
        res->loss_sum = loss;
        return LT_OK;
    }
    /* Training: the upstream gradient is known before the loss, so loss and grad h come from one
     * call (the fused loss makes the logits once: two GEMMs instead of three). */
    (void)grad_scale; /* s->dloss, which check_batch derived from it (and staged on a device) */
    float dloss = s->dloss;
    /* ∂/∂h goes into dx, which the final norm's backward then turns into ∂/∂x in place. */
    float *dx = lt_step_ws(s, y->dx);
    lt_tensor dht = lt_tensor_view(dx, LT_DTYPE_F32, m->opt.device, 2, hs);
    la.dloss = s->scalars ? s->scalars + 1 : &dloss;
    la.dh = &dht;
    LT_TRY(lt_lce_forward_backward(s->ctx, &lo, &la));
    res->loss_sum = loss;
    s->be->rmsnorm_bwd(s->ctx, dx, xf, m->final_norm, rstd, s->N, c->C, dx, NULL);
    return LT_OK;
}

/* LoRA layer j's residual input: under resid_ckpt a recomputed layer's checkpoint, else its
 * store's x_in (for the first layer of a segment, a copy of the segment's checkpoint). */
static lt_resid lora_in(const lt_step *s, int64_t j, const lt_store *st) {
    const lt_layout *y = &s->m->lay;
    if (!y->resid_ckpt || !s->rc[j].rec) return lt_resid_f32(st->x_in);
    lt_resid r = {NULL, NULL};
    if (y->saved_dtype == LT_DTYPE_BF16) r.h = (uint16_t *)lt_step_ckpt(s, s->rc[j].seg);
    else r.f = (float *)lt_step_ckpt(s, s->rc[j].seg);
    return r;
}

/* Its output: xf for the last LoRA layer, else the next layer's input (in place when one slot
 * serves the segment). */
static lt_resid lora_out(const lt_step *s, int64_t j) {
    if (j + 1 == s->m->lora.num_layers) return lt_resid_f32(lt_step_xf(s));
    lt_store nx = store_of(s, j + 1);
    return lora_in(s, j + 1, &nx);
}

/* The store of LoRA layer j; a recomputed layer's with kept attention has its att and lse at the
 * layer's kept ones, and with kept q/k/v the rest of its attention half too. */
static lt_store slot_of(const lt_step *s, int64_t j) {
    const lt_layout *y = &s->m->lay;
    lt_store st = store_of(s, j);
    if (!s->rc[j].rec || s->rc[j].katt < 0) return st;
    size_t i = (size_t)s->rc[j].katt;
    st.att = (float *)lt_step_blk(s, LT_MEM_ACTIVATIONS, y->keep_att + i * y->att_stride);
    st.lse = (float *)lt_step_blk(s, LT_MEM_ACTIVATIONS, y->keep_lse + i * y->lse_stride);
    if (y->keep_qkv) lt_model_kept_at(y, lt_step_blk(s, LT_MEM_ACTIVATIONS, y->keep_store + i * y->kept_stride), &st);
    return st;
}

/* The embedding, the frozen layers and the LoRA layers, saving each segment's input as its
 * checkpoint (under resid_ckpt the layer before a recomputed one writes it). */
static lt_status forward_layers(lt_step *s) {
    const lt_layout *y = &s->m->lay;
    const lt_rc_place *rc = s->rc;
    int64_t K = s->m->lora.num_layers, l0 = s->m->l0, NC = s->N * s->m->cfg.C;
    lt_store st = slot_of(s, 0);
    if (y->resid_ckpt && rc[0].rec) { /* the embedding and frozen layers run on xf, then become checkpoint 0 */
        LT_TRY(run_plain(s, l0, lt_step_xf(s)));
        LT_TRY(lt_step_ckpt_will_write(s, 0));
        LT_TRY(lt_step_saved_copy(s, lt_step_ckpt(s, 0), lt_step_xf(s), NC, 0));
        LT_TRY(lt_step_ckpt_written(s, 0));
    } else {
        LT_TRY(run_plain(s, l0, st.x_in));
    }
    for (int64_t j = 0; j < K; j++) {
        st = slot_of(s, j);
        if (rc[j].rec && !y->resid_ckpt && rc[j].pos == 0) {
            LT_TRY(lt_step_ckpt_will_write(s, rc[j].seg));
            LT_TRY(lt_step_saved_copy(s, lt_step_ckpt(s, rc[j].seg), st.x_in, NC, 0));
            LT_TRY(lt_step_ckpt_written(s, rc[j].seg));
        }
        /* under resid_ckpt the layer below a recomputed one writes its checkpoint */
        int64_t writes = y->resid_ckpt && j + 1 < K && rc[j + 1].rec ? rc[j + 1].seg : -1;
        if (writes >= 0) LT_TRY(lt_step_ckpt_will_write(s, writes));
        LT_TRY(lt_step_layer_fwd(s, l0 + j, &st, lora_in(s, j, &st), lora_out(s, j), 0));
        if (writes >= 0) LT_TRY(lt_step_ckpt_written(s, writes));
    }
    return LT_OK;
}

/* Entering segment seg from the top at its last layer j: its stores rebuilt from its checkpoint
 * (kept attention is not rerun; the last layer's output is not needed). */
static lt_status recompute_segment(lt_step *s, int64_t seg, int64_t j) {
    const lt_layout *y = &s->m->lay;
    int64_t j0 = j - s->rc[j].pos, l0 = s->m->l0;
    lt_store st = slot_of(s, j0);
    if (!y->resid_ckpt) {
        LT_TRY(lt_step_ckpt_need(s, seg));
        LT_TRY(lt_step_saved_copy(s, lt_step_ckpt(s, seg), st.x_in, s->N * s->m->cfg.C, 1));
    }
    for (int64_t i = j0; i <= j; i++) {
        st = slot_of(s, i);
        lt_resid out = i == j ? lt_resid_f32(NULL) : lora_out(s, i);
        LT_TRY(lt_step_layer_fwd(s, l0 + i, &st, lora_in(s, i, &st), out, s->rc[i].katt >= 0));
    }
    return LT_OK;
}

/* The LoRA layers' backward from the top, dx (N, C) holding ∂loss/∂xf on entry; each layer's
 * gradient slice is announced to the grad-ready hook as soon as it is final. The last segment's
 * stores are still those of the forward: only the others are recomputed. */
static lt_status backward_layers(lt_step *s) {
    lt_model *m = s->m;
    const lt_layout *y = &m->lay;
    const lt_device dev = m->opt.device;
    int64_t K = m->lora.num_layers, last_seg = y->n_ckpt - 1;
    float *dx = lt_step_ws(s, y->dx);
    int64_t lend = y->n_lora; /* the end of layer j's slice of the flat buffer */
    for (int64_t j = K - 1; j >= 0; j--) {
        const lt_rc_place *p = &s->rc[j];
        /* A recomputed layer's checkpoint is its input under resid_ckpt, read by its recompute and backward. */
        if (y->resid_ckpt && p->rec) LT_TRY(lt_step_ckpt_need(s, p->seg));
        if (p->rec && p->last && p->seg != last_seg) {
            lt_prof_set_phase(dev, LT_PROF_RECOMPUTE);
            LT_TRY(recompute_segment(s, p->seg, j));
        }
        lt_prof_set_phase(dev, LT_PROF_BACKWARD);
        lt_store st = slot_of(s, j);
        LT_TRY(lt_step_layer_bwd(s, m->l0 + j, &st, lora_in(s, j, &st), dx, j > 0));
        /* LoRA layers hold consecutive slices of the flat buffer (load.c's init order), the MoE
         * layers' with their expert adapters */
        int64_t nl = y->lora_plain + lt_model_moe_lora_elems(&m->cfg, &m->lora, m->l0 + j);
        lend -= nl;
        if (m->grad_ready) LT_TRY(m->grad_ready(m->grad_ready_arg, lend, nl));
    }
    return LT_OK;
}

lt_status lt_model_forward_backward(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float grad_scale,
                                    lt_model_result *res, float *token_loss) {
    lt_step s;
    lt_model_result r = {0, 0, 0};
    LT_TRY(check_batch(ctx, m, b, &s, 1, grad_scale, 1));
    const lt_device dev = m->opt.device;
    lt_rc_place rc[LT_MODEL_MAX_LAYERS];
    lt_rc_counts n;
    LT_ASSERT(m->lora.num_layers <= LT_MODEL_MAX_LAYERS);
    lt_model_rc_walk(&m->cfg, m->lay.rc, m->lay.rc_k, m->lora.num_layers, m->lay.rc_rerun, rc, &n);
    s.rc = rc;
    s.slot_has[0] = s.slot_has[1] = -1;
    lt_prof_set_phase(dev, LT_PROF_FORWARD);
    lt_step_moe_begin(&s);
    LT_TRY(forward_layers(&s));
    LT_TRY(lt_step_moe_reduce(&s));
    lt_step_moe_end(&s);
    lt_prof_set_phase(dev, LT_PROF_LOSS);
    LT_TRY(final_loss(&s, b, 1, grad_scale, &r, token_loss));
    LT_TRY(backward_layers(&s));
    lt_prof_set_phase(dev, LT_PROF_OTHER);
    LT_TRY(read_loss(&s, &r, token_loss));
    if (res) *res = r;
    return LT_OK;
}

lt_status lt_model_stage_batch(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float grad_scale,
                               lt_model_result *res) {
    if (!m->host_inputs)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: staging a batch needs a prepared device model");
    lt_step s;
    LT_TRY(check_batch(ctx, m, b, &s, 1, grad_scale, 0));
    res->loss_sum = 0;
    res->n_tokens = s.n_tok;
    return LT_OK;
}

lt_status lt_model_read_loss(lt_ctx *ctx, lt_model *m, lt_model_result *res) {
    if (!m->host_inputs)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "model: the loss stays on the device only for a prepared device model");
    float sc[4] = {0, 0, 0, 0};
    LT_TRY(m->be->copy_to_host(ctx, sc, m->block[LT_MEM_TRANSIENTS] + m->lay.inputs + m->lay.in_scalars, sizeof sc));
    res->loss_sum = sc[0];
    res->aux_loss = lt_step_moe_aux(m->moe_aux_norm, sc[3]);
    return LT_OK;
}

static lt_status forward_all(lt_step *s) {
    lt_model *m = s->m;
    return run_plain(s, m->cfg.L, lt_step_xf(s));
}

lt_status lt_model_forward(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, lt_model_result *res, float *token_loss) {
    lt_step s;
    lt_model_result r = {0, 0, 0};
    LT_TRY(check_batch(ctx, m, b, &s, 0, 0.0f, 1));
    lt_step_moe_begin(&s);
    LT_TRY(forward_all(&s));
    LT_TRY(lt_step_moe_reduce(&s));
    lt_step_moe_end(&s);
    LT_TRY(final_loss(&s, b, 0, 0, &r, token_loss));
    LT_TRY(read_loss(&s, &r, token_loss));
    if (res) *res = r;
    return LT_OK;
}

static lt_status logits_rows(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits, int last_only) {
    lt_step s;
    LT_TRY(check_batch(ctx, m, b, &s, 0, 0.0f, 1));
    LT_TRY(forward_all(&s));
    const lt_model_config *c = &m->cfg;
    float *xf = lt_step_xf(&s), *hf = lt_step_hf(&s);
    float *rstd = (float *)lt_step_blk(&s, LT_MEM_TRANSIENTS, m->lay.rstd_f);
    /* A training layout's hf holds the loss's bf16 rows: the head's f32 product takes a copy of
     * this call's own. */
    const size_t hf_bytes = m->lay.hf_bf16 ? (size_t)s.N * (size_t)c->C * sizeof(float) : 0;
    if (hf_bytes && !(hf = lt_alloc(ctx, m->opt.device, hf_bytes, "logits final norm output")))
        return lt_ctx_status(ctx);
    m->be->rmsnorm_fwd(ctx, xf, m->final_norm, c->rms_eps, s.N, c->C, hf, rstd);
    /* A device model writes the logits into a device buffer of this call's own (tests and
     * generation, not the training step), then copies them out. The head's matmul gets a
     * workspace of this call's own too: the layout sizes the step's for the projections at the
     * chunk only (a training step multiplies by the head inside the loss). */
    int64_t rows = last_only ? s.B : s.N;
    size_t bytes = (size_t)rows * (size_t)c->V * sizeof(float);
    size_t wsb = m->be->matmul_workspace_bytes(m->head.dtype, c->V, c->C, last_only ? 1 : s.N, m->lay.threads);
    void *ws = NULL;
    float *out = logits;
    if (m->opt.device != LT_DEVICE_CPU && !(out = lt_alloc(ctx, m->opt.device, bytes, "logits"))) {
        if (hf_bytes) lt_free(ctx, m->opt.device, hf, hf_bytes);
        return lt_ctx_status(ctx);
    }
    if (wsb && !(ws = lt_alloc(ctx, m->opt.device, wsb, "logits matmul workspace"))) {
        if (out != logits) lt_free(ctx, m->opt.device, out, bytes);
        if (hf_bytes) lt_free(ctx, m->opt.device, hf, hf_bytes);
        return lt_ctx_status(ctx);
    }
    if (!last_only) m->be->matmul(ctx, LT_MATMUL_NT, &m->head, hf, s.N, 0.0f, out, ws);
    else
        for (int64_t r = 0; r < s.B; r++)
            m->be->matmul(ctx, LT_MATMUL_NT, &m->head, hf + ((r + 1) * s.T - 1) * c->C, 1, 0.0f, out + r * c->V, ws);
    lt_status st = LT_OK;
    if (out != logits) st = m->be->copy_to_host(ctx, logits, out, bytes);
    if (ws) lt_free(ctx, m->opt.device, ws, wsb);
    if (out != logits) lt_free(ctx, m->opt.device, out, bytes);
    if (hf_bytes) lt_free(ctx, m->opt.device, hf, hf_bytes);
    if (st == LT_OK) lt_fast_softcap(logits, rows * c->V, c->final_softcap); /* as the loss sees them */
    return st;
}

lt_status lt_model_logits(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits) {
    return logits_rows(ctx, m, b, logits, 0);
}

lt_status lt_model_logits_last(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits) {
    return logits_rows(ctx, m, b, logits, 1);
}
