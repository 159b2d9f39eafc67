/* Internals of one step shared by the step's source files (step.c drives it, layer.c runs a layer,
 * proj.c the LoRA projections, offload.c the checkpoint copies): the per-call state, the views of
 * the prepared blocks it reads, and the residual-stream helper type. Not a public API. */
#ifndef LT_MODEL_STEP_H
#define LT_MODEL_STEP_H

#include "model/model_internal.h"

typedef struct lt_step {
    lt_ctx *ctx;
    lt_model *m;
    const lt_backend *be;
    int64_t B, T, N;
    const int32_t *tokens, *targets; /* (N) in the model's memory */
    const int32_t *pos;
    const int32_t *seq_offsets;     /* host (the attention boundary validates them there) */
    const int32_t *seq_offsets_dev; /* device runs: their copy in the inputs piece */
    int64_t n_tok;                  /* non-ignored targets */
    float dloss;                    /* upstream gradient of the summed loss */
    float *scalars;                 /* device runs: [0] loss, [1] dloss, [2] aux scale, [3] aux sum (device) */
    int defer_loss;                 /* leave the loss on the device (lt_model_batch.defer_loss) */
    int64_t S;
    /* The batch's attention preparations (kernel path), one per window of the layout's
     * attn_window: the offsets validated and any device key bounds computed once for the step. */
    lt_attention_batch attn_batch[LT_MODEL_ATTN_WINDOWS_MAX];
    int n_attn_batch;
    uint64_t drop_seed; /* 0 bits mean dropout off (evaluation) */
    uint64_t drop_row0; /* tokens before this batch's row 0 in the whole (data-parallel) batch */
    int train;
    /* Offload: the checkpoint each device slot holds (-1 none) and whether a copy into it is
     * still to be waited for. */
    int64_t slot_has[2];
    int slot_pending[2];
    /* MoE: the forward accumulates the load-balancing statistics (moe_collect; not in a
     * recompute), then the backward's routing gradient adds scale·count_e (moe_has_dp), read by
     * moe_route_bwd from the backend's memory: moe_scale and moe_sum point at scalars [2] and [3]
     * on a device, at moe_host on the host. aux_scale = coef·E·dloss·n_tok/M² and aux_norm = E/M²
     * (M = MoE layers × real tokens, of the whole row under context parallel, where lt_step_moe_reduce
     * sums the statistics and the scale over the group) are known on the host before the step. */
    int moe_collect, moe_has_dp;
    const int32_t *real_seqs; /* host (lt_model_batch.real_seqs), validated; NULL = all real */
    int64_t n_real;           /* real tokens of the batch */
    int64_t cp_real;          /* context parallel: real tokens of the whole row (lt_model_batch.cp_real) */
    float aux_scale;
    double aux_norm;
    float *moe_scale, *moe_sum;
    float moe_host[2];
    /* Training: each LoRA layer's place under the recompute policy (lt_model_rc_walk). */
    const lt_rc_place *rc;
} lt_step;

static inline uint8_t *lt_step_blk(const lt_step *s, lt_mem_class c, size_t off) { return s->m->block[c] + off; }
static inline float *lt_step_ws(const lt_step *s, size_t off) { return (float *)lt_step_blk(s, LT_MEM_WORKSPACE, off); }
/* The final norm's input (N, C) and output (N, C). */
static inline float *lt_step_xf(const lt_step *s) {
    return (float *)lt_step_blk(s, s->m->lay.final_class, s->m->lay.xf);
}
static inline float *lt_step_hf(const lt_step *s) {
    return (float *)lt_step_blk(s, s->m->lay.final_class, s->m->lay.hf);
}

/* A layer's residual input or output (N, C): f32 rows, or a bf16 checkpoint read or written in
 * place (h). */
typedef struct lt_resid {
    float *f;
    uint16_t *h;
} lt_resid;

static inline lt_resid lt_resid_f32(float *f) {
    lt_resid r = {f, NULL};
    return r;
}

/* Rows of the position-wise chunk starting at row r0 (the layout's chunk rows, fewer at the end). */
static inline int64_t lt_step_chunk_rows(const lt_step *s, int64_t r0) {
    int64_t ch = s->m->lay.chunk;
    return s->N - r0 < ch ? s->N - r0 : ch;
}

/* Row r0 of a whole-batch tensor t (N, width) held in the layout's attention dtype (attention's
 * inputs, output and gradients, q_raw, k_raw, x_mid): bf16 under attn_bf16, else f32. */
static inline void *lt_step_at_row(const lt_step *s, void *t, int64_t r0, int64_t width) {
    return (uint8_t *)t + (size_t)(r0 * width) * (s->m->lay.attn_bf16 ? 2 : 4);
}

/* Rows [r0, r0 + n) of such a tensor as f32: in place for f32, widened into `buf` for bf16. */
static inline float *lt_step_att_rows(const lt_step *s, void *t, int64_t r0, int64_t n, int64_t width, float *buf) {
    if (!s->m->lay.attn_bf16) return (float *)lt_step_at_row(s, t, r0, width);
    s->be->from_bf16(s->ctx, (const uint16_t *)lt_step_at_row(s, t, r0, width), buf, n * width);
    return buf;
}

/* Rows [r0, r0 + n) of a residual x as f32: in place, or widened into buf. */
static inline const float *lt_resid_rows(const lt_step *s, lt_resid x, int64_t r0, int64_t n, float *buf) {
    int64_t C = s->m->cfg.C;
    if (x.f) return x.f + r0 * C;
    s->be->from_bf16(s->ctx, x.h + r0 * C, buf, n * C);
    return buf;
}

/* ---- offload.c: checkpoints and their copies ---- */

/* Checkpoint seg: an (N, C) layer input of the layout's saved dtype; under offload, its slot
 * (which holds it only between the calls below that say so). */
void *lt_step_ckpt(const lt_step *s, int64_t seg);
/* Before checkpoint i is written: waits for the copy out of its slot's previous tenant. */
lt_status lt_step_ckpt_will_write(const lt_step *s, int64_t i);
/* After its writer is queued: copies checkpoint i out to the host (unless it stays). */
lt_status lt_step_ckpt_written(lt_step *s, int64_t i);
/* Before checkpoint i is read in the backward: it is in its slot, and i - 1 is on its way. */
lt_status lt_step_ckpt_need(lt_step *s, int64_t i);
/* Copies the f32 x (n elements) into `saved` (a checkpoint of the layout's saved dtype, rounded
 * when bf16), or back = 1: `saved` into x. */
lt_status lt_step_saved_copy(const lt_step *s, void *saved, float *x, int64_t n, int back);

/* ---- proj.c: the LoRA projections ---- */

/* A projection group's input or an output's gradient: f32 rows, or (h, under the layout's
 * mlp_bf16) their bf16 rounding; one of the two is set. */
typedef struct lt_act {
    const float *f;
    const uint16_t *h;
} lt_act;

static inline lt_act lt_act_f32(const float *f) {
    lt_act a = {f, NULL};
    return a;
}

static inline lt_act lt_act_bf16(const uint16_t *h) {
    lt_act a = {NULL, h};
    return a;
}

/* The projections ps[0..G) of one input x over the n rows from row r0 (q, k, v; gate, up; or one
 * alone), each into y[g] (n, out) = beta·y[g] + x·Wᵀ (+ the layer's q/k/v bias) + LoRA, saving
 * the LoRA product into st; y[g] = NULL computes only the LoRA product. */
void lt_step_group_fwd(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                       lt_act x, float *const *y, float beta);
/* y (n, out) = yc + projection p of x over the n rows from r0 (yc may be y): a residual added
 * onto as the projection's output is written, without a copy of it into y first. */
void lt_step_proj_add(const lt_step *s, int64_t l, const lt_store *st, const lt_proj *p, int64_t r0, int64_t n,
                      lt_act x, const float *yc, float *y);
/* The backward of projection p alone from its output gradient in bf16 (dyh), the input gradient
 * written in bf16 to dxh (n, in), LoRA grads accumulated (the layout's gu_bf16: the down
 * projection's). */
void lt_step_proj_bwd_h(const lt_step *s, int64_t l, const lt_store *st, const lt_proj *p, int64_t r0, int64_t n,
                        lt_act x, const uint16_t *dyh, uint16_t *dxh);
/* lt_step_group_fwd of a bf16 input into bf16 outputs yh[g] (beta 0; the layout's gu_bf16). */
void lt_step_group_fwd_h(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0,
                         int64_t n, const uint16_t *xh, uint16_t *const *yh);
/* The backward of lt_step_group_fwd: dy[g] for each projection; dx (n, in) = beta·dx + the
 * group's input gradient (NULL: skipped), LoRA grads accumulated. */
void lt_step_group_bwd(const lt_step *s, int64_t l, const lt_store *st, int G, const lt_proj *ps, int64_t r0, int64_t n,
                       lt_act x, const lt_act *dy, float *dx, float beta);

/* ---- layer.c: one layer ---- */

/* The attention parameters of a layer of description d in this step (the kernel path), with the
 * step's preparation for d's window when it has one. */
lt_attention_params lt_step_attn_params(const lt_step *s, const lt_layer_desc *d);

/* Layer l: x_out = layer(x_in), filling st; see layer.c for the recompute forms (x_out empty,
 * att_kept). */
lt_status lt_step_layer_fwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in, lt_resid x_out,
                            int att_kept);
/* dx (N, C) holds ∂/∂x_out on entry and ∂/∂x_in on return (∂/∂x_mid when need_dx = 0). */
lt_status lt_step_layer_bwd(const lt_step *s, int64_t l, const lt_store *st, lt_resid x_in, float *dx, int need_dx);

/* ---- moe.c: the mixture-of-experts MLP ---- */

/* y (n, C) += the MoE MLP of layer l on h (n, C) (the MLP norm's output of batch rows [r0, r0 + n)),
 * chunk by chunk. */
void lt_step_moe_fwd(const lt_step *s, int64_t l, int64_t r0, const float *h, int64_t n, float *y);
/* dh (n, C) = ∂/∂h given dy (n, C), rerunning the forward from h a chunk at a time. */
void lt_step_moe_bwd(const lt_step *s, int64_t l, int64_t r0, const float *h, const float *dy, int64_t n, float *dh);
/* While the batch is checked, before its inputs are staged: validates real_seqs, counts the real
 * tokens and sets the aux loss's host factors (aux_scale, aux_norm; m->moe_aux_norm). Errors:
 * LT_ERR_INVALID_ARG (real_seqs outside 0..S), named by row. */
lt_status lt_step_moe_check(lt_step *s, const lt_model_batch *b);
/* Where the aux scale and sum live (scalars [2], [3] on a device, moe_host on the host), once the
 * inputs are staged; the host's scale is written here. */
void lt_step_moe_bind(lt_step *s);
/* Before the forward: zeroes the statistics and starts collecting them (moe_aux_coef > 0). */
void lt_step_moe_begin(lt_step *s);
/* After the forward: Σ_e count_e·Σp_e of the statistics into moe_sum on the device (queued, no
 * wait; the aux loss is it times aux_norm, read with the loss) and, training, the routing
 * backward's aux gradient switched on. */
void lt_step_moe_end(lt_step *s);
/* Context parallel (moe_aux.c). In the check: validates cp_real (0..T·world; 0 without context
 * parallel), counts this rank's real tokens into n_real and the group's into *group (n_real
 * without context parallel). Errors: LT_ERR_INVALID_ARG naming cp_real. */
lt_status lt_step_moe_group_real(lt_step *s, const lt_model_batch *b, int64_t *group);
/* The end of the run of local tokens from g on (at most end) that are all real or all padding
 * under cp_real (> 0); *real says which. */
int64_t lt_step_moe_cp_run(const lt_step *s, int64_t g, int64_t end, int *real);
/* Between the forward and moe_end: the statistics and the aux scale summed over the group
 * (queued on the device, no wait; nothing without context parallel or aux). Errors: the
 * communicator's. */
lt_status lt_step_moe_reduce(lt_step *s);
/* The batch's load-balancing loss from the sum the step wrote (sum read by the caller). */
static inline double lt_step_moe_aux(double norm, float sum) { return norm * (double)sum; }

#endif
