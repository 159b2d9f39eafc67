/* Internals shared by the model's source files in src/model/ and its tests: the model struct,
 * the memory layout (one block per lifetime class, carved by a pure layout function that the size
 * table and the allocator both use) and the RoPE frequency table. Not a public API. */
#ifndef LT_MODEL_INTERNAL_H
#define LT_MODEL_INTERNAL_H

#include "backend/backend.h"
#include "longtune/context_parallel.h"
#include "longtune/model.h"

/* Alignment of every piece carved from a class block (cache line, and what lce/attention require
 * of their workspaces). */
#define LT_MODEL_ALIGN 64

/* Distinct attention windows the layers of one model may have (a window per layer kind). */
#define LT_MODEL_ATTN_WINDOWS_MAX 4

/* Floats of a RoPE table for head dim D: D/2 inverse frequencies, then the attention factor the
 * rope op multiplies cos and sin by (1 unless YaRN or longrope). */
#define LT_ROPE_TABLE_LEN(D) ((D) / 2 + 1)

/* The RoPE table (LT_ROPE_TABLE_LEN(cfg->D) floats) for a run of T tokens per row: theta^(-2i/D)
 * and cfg->rope_scaling exactly as transformers' ROPE_INIT_FUNCTIONS compute it (in float64,
 * then rounded). T matters to dynamic NTK (its seq_len: max(T, original context)) and longrope
 * (long factors when T exceeds the original context); 0 = the table at load. */
void lt_model_rope_table(const lt_model_config *cfg, int64_t T, float *table);
/* lt_model_rope_table at T = 0 (the table at load). */
void lt_model_rope_inv_freq(const lt_model_config *cfg, float *inv_freq);
/* The attention factor of the config's scaling (transformers' attention_scaling). */
double lt_model_rope_attn_factor(const lt_model_config *cfg);
/* 1 when the table depends on the run's T (dynamic, longrope). */
int lt_model_rope_depends_on_T(const lt_model_config *cfg);
/* The consistency check of cfg's RoPE fields; `where` prefixes the message (file: key). Errors:
 * LT_ERR_INVALID_ARG naming the field and value. */
lt_status lt_model_rope_check(lt_ctx *ctx, const char *where, const lt_model_config *cfg);
/* Recomputes m's RoPE table for T tokens per row into its place in the weights block. */
lt_status lt_model_rope_refresh(lt_ctx *ctx, lt_model *m, int64_t T);

/* Phi-3's fused modules carry LoRA as PEFT puts it, one adapter per module: qkv_proj's A is q's
 * (k and v use it) and its B is q's, k's and v's B rows one after another in memory, one (q + k + v
 * rows, r) matrix; gate_up_proj likewise with gate and up. The projection whose A p uses: p
 * itself for every other projection and family. */
lt_proj lt_model_lora_owner(const lt_model_config *cfg, lt_proj p);
/* The projections that share an input and run as one group (lt_backend.lora_fwd / lora_bwd):
 * q, k, v on the normed hidden state and gate, up on the normed mid-layer state; o and down
 * run alone. */
extern const lt_proj lt_proj_group_qkv[3], lt_proj_group_gate_up[2];
/* PEFT's module name of owner p ("qkv_proj" and "gate_up_proj" for Phi-3, else lt_proj_name). */
const char *lt_model_lora_module(const lt_model_config *cfg, lt_proj p);
/* LT_OK when targets takes every fused module whole (q, k, v together; gate and up together), else
 * LT_ERR_UNSUPPORTED naming the module. */
lt_status lt_model_check_lora_targets(lt_ctx *ctx, const lt_model_config *cfg, unsigned targets);

/* Shapes (out, in) of projection p. */
void lt_model_proj_shape(const lt_model_config *cfg, lt_proj p, int64_t *out, int64_t *in);

/* ---- mixture of experts (moe.c) ---- */

/* 1 when layer l's MLP is the routed experts (lt_model_config's rule: n_experts, moe_dense,
 * moe_every). */
int lt_model_layer_is_moe(const lt_model_config *cfg, int64_t l);
/* Shapes (out, in) of layer l's projection p: an MoE layer's gate, up and down are the stacked
 * experts (E·moe_F, C) and (E·C, moe_F); else lt_model_proj_shape. */
void lt_model_layer_proj_shape(const lt_model_config *cfg, int64_t l, lt_proj p, int64_t *out, int64_t *in);
/* A run's bf16_products request on device dev with backend be (where: the message's prefix):
 * LT_ERR_INVALID_ARG outside 0..1, LT_ERR_UNSUPPORTED on a CPU build without oneDNN; *on = 1
 * when the backend's bf16 products path runs (CUDA multiplies bf16 either way: 0 there). */
lt_status lt_model_bf16x(lt_ctx *ctx, const char *where, int requested, lt_device dev, const lt_backend *be, int *on);
/* The MoE fields' consistency: LT_OK for a dense model (n_experts 0 and no MoE field set), else
 * LT_ERR_INVALID_ARG naming the field (experts outside 1..LT_MOE_MAX_EXPERTS, top-k outside
 * 1..experts, expert width <= 0, a negative period or coefficient) or LT_ERR_UNSUPPORTED (a shared
 * expert). */
lt_status lt_model_check_moe(lt_ctx *ctx, const lt_model_config *cfg);
/* The LoRA targets against the MoE layers (lo resolved): gate, up or down on an MoE layer among
 * the LoRA layers is LT_ERR_UNSUPPORTED naming it (its experts take the expert targets); the
 * expert targets need a model with experts (LT_ERR_UNSUPPORTED), an MoE layer among the LoRA
 * layers (LT_ERR_INVALID_ARG), no dropout and rank <= LT_MOE_WGRAD_MAX_RANK (LT_ERR_UNSUPPORTED). */
lt_status lt_model_check_moe_lora(lt_ctx *ctx, const lt_model_config *cfg, const lt_lora_options *lo);
/* LoRA elements of layer l's expert adapters (lt_lora_tensor's storage): E·r·(C + 2·moe_F) for
 * gate_up, E·r·(moe_F + C) for down, on MoE layers with those targets; else 0. */
int64_t lt_model_moe_lora_elems(const lt_model_config *cfg, const lt_lora_options *lo, int64_t l);
/* cfg->F when some layer runs a dense MLP, else 0 (what the dense MLP's buffers are sized by). */
int64_t lt_model_dense_F(const lt_model_config *cfg);

/* Defaults resolved (targets, rank, alpha, num_layers clamped to L). */
lt_lora_options lt_model_resolve_lora(const lt_model_config *cfg, const lt_lora_options *in);

/* The frozen tensors in the order they are carved from the weights block. */
typedef enum lt_wkind {
    LT_W_EMBED = 0,
    LT_W_HEAD,
    LT_W_FINAL_NORM,
    LT_W_INV_FREQ,
    LT_W_PROJ,
    LT_W_BIAS,
    LT_W_ATTN_NORM,
    LT_W_MLP_NORM,
    LT_W_Q_NORM,
    LT_W_K_NORM,
    LT_W_INV_FREQ_LOCAL, /* RoPE table 1 (sliding layers of Gemma 3), when cfg->rope_local_theta > 0 */
    LT_W_POST_ATTN_NORM, /* sandwich norms: on the attention block's output */
    LT_W_POST_MLP_NORM,  /* and on the MLP's output */
    LT_W_ROUTER,         /* MoE layers: the router (n_experts, C), f32 */
    LT_W_SHARED,         /* moe_shared_F > 0: the shared expert's gate, up (which 0, 1: (shared_F, C)) and
                            down (2: (C, shared_F)), f32 */
    LT_W_SHARED_GATE     /* and its gate (C), f32 (HF (1, C), GGUF 1-D) */
} lt_wkind;

typedef struct lt_wpiece {
    lt_wkind kind;
    int64_t layer;  /* -1 for model-level tensors */
    int which;      /* lt_proj for LT_W_PROJ; 0/1/2 = q/k/v for LT_W_BIAS */
    lt_dtype dtype; /* in memory */
    int ndim;
    int64_t shape[2];
    size_t offset, bytes; /* in the weights block */
} lt_wpiece;

/* Calls fn on every frozen tensor of cfg in carve order (fn may be NULL) and returns the block's
 * total bytes, or 0 when a size overflows or a row is not a whole number of blocks. */
size_t lt_model_weights_walk(const lt_model_config *cfg, void (*fn)(void *arg, const lt_wpiece *p), void *arg);

/* Everything one layer keeps for its backward: what attention reads and writes over the whole
 * batch, plus the residual inputs of the two blocks. The norms' outputs are not kept: the
 * position-wise work reruns them a chunk of rows at a time. Offsets (bytes) inside a store, or
 * pointers. */
typedef struct lt_store {
    float *x_in;          /* (N, C) layer input; NULL when the layer's checkpoint is its input
                                (lt_layout.resid_ckpt) or in a forward-only run (in place) */
    float *q_raw, *k_raw; /* (N, H·D), (N, Hkv·D) before the per-head norm (desc.qk_norm; bf16
                                elements under attn_bf16, read only by the norm's backward) */
    /* Attention's inputs and output hold bf16 elements when the layout's attn_bf16 says so (the
     * attention reads and writes them directly), else f32. */
    float *q, *k, *v;          /* after norm and RoPE: (N, H·D), (N, Hkv·D), (N, Hkv·D) */
    float *att;                /* (N, H·D) attention output */
    float *lse;                /* (B, H, T) attention log-sum-exp */
    float *x_mid;              /* (N, C) residual after attention (bf16 under attn_bf16) */
    float *g, *u;              /* (N, F) gate and up projections: only without recompute (the
                                stores of every layer live through the step, so the backward
                                reads them instead of rerunning two GEMMs); NULL otherwise */
    float *rstd1, *rstd2;      /* (N) */
    float *rstd_q, *rstd_k;    /* (N·H), (N·Hkv), desc.qk_norm only */
    float *lu[LT_PROJ_COUNT_]; /* (N, r) LoRA down-projections x·Aᵀ of targeted projections */
} lt_store;

/* The MoE layers' dispatch buffers in the workspace (moe.c), for one chunk of `chunk` tokens (n):
 * logits (n, E), idx, w (n·k), off (E + 1), rows, slot (n·k) int32, the gathered rows xg (n·k, C),
 * the experts' G, U, A (n·k, moe_F) and outputs yg (n·k, C); training adds dw (n·k) and dlogits
 * (n, E) (the gradients reuse dead forward buffers: dG, dU go over G, U); stats (2, E) the
 * load-balancing loss's sums over the step (moe_aux_coef > 0); gm_ws the grouped products'
 * workspace. chunk = 0: no MoE layer (nothing carved). */
typedef struct lt_moe_layout {
    int64_t chunk, n_layers;
    size_t logits, idx, w, off, rows, slot, xg, g, u, a, yg, stats, dw, dlogits, gm_ws;
    /* moe_shared_F > 0 (n = chunk, S = moe_shared_F): the shared expert's sg, su, sa (n, S) and, as two
     * "experts" the combine weighs by softmax([gate logit, 0]) = (sigmoid, 1 - sigmoid), its output
     * beside zero rows sy (2n, C), with slogits (n, 2), sidx, sw (2n), soff (3), srows, sslot (2n);
     * training adds sdg, sdu (n, S), sdy (2n, C), sdw (2n), sdlogits (n, 2). */
    size_t sg, su, sa, sy, slogits, sidx, sw, soff, srows, sslot, sdg, sdu, sdy, sdw, sdlogits;
    size_t gm_ws_bytes, mm_ws_bytes; /* mm_ws_bytes: the shared expert's matmuls at the chunk (in mm_ws) */
    /* the routed experts' base products on bf16 inputs (the run's bf16 products): gm_ws is sized for
     * them and the context holds its bytes around each grouped product */
    int bf16x;
    /* LoRA on the experts (r the rank, n·k rows): lus = s·xg·A_guᵀ (gate_up adapted) and lds =
     * s·A·A_dᵀ (down adapted), each (n·k, r); training adds ldu (n·k, r), the gradient of one of
     * them at a time. 0 = absent. */
    size_t lus, lds, ldu;
} lt_moe_layout;

/* Carves the MoE buffers from *cur (alignment al) for a run whose position-wise chunk is
 * rows_chunk (the MoE chunk is run->moe_chunk_tokens, default LT_MODEL_MOE_CHUNK_TOKENS, at most
 * rows_chunk), with the expert adapters of lo (resolved). Errors: LT_ERR_INVALID_ARG (a negative
 * chunk), LT_ERR_UNSUPPORTED (a backend without the MoE ops, or without grouped_matmul_wgrad when
 * a training run adapts the experts). bf16x: the run's bf16 products (lt_model_bf16x) reach the
 * routed experts' base products. */
lt_status lt_model_moe_layout(lt_ctx *ctx, const lt_model_config *c, const lt_lora_options *lo,
                              const lt_model_run_options *run, const lt_backend *be, int64_t rows_chunk, int train,
                              int bf16x, int threads, size_t al, size_t *cur, lt_moe_layout *o);

/* y (n, C) += layer l's MoE MLP on h (n, C), outside a training step (generation's KV cache): the
 * dispatch buffers at base with o's offsets (lt_model_moe_layout, forward), mm_ws the matmul
 * workspace for the shared expert's products at o->chunk rows. */
struct lt_model;
void lt_model_moe_forward(lt_ctx *ctx, const struct lt_model *m, const lt_moe_layout *o, uint8_t *base, void *mm_ws,
                          int64_t l, const float *h, int64_t n, float *y);

/* Byte offsets of the pieces of each class block, and the class sizes. */
typedef struct lt_layout {
    /* The recompute policy resolved (NONE in a forward-only run) and its segment cap: every LoRA
     * layer is kept or recomputed (lt_model_recomputes_layer); runs of consecutive recomputed
     * layers split into segments of at most rc_k layers, each with one checkpoint (its input);
     * n_rec layers are recomputed. */
    lt_recompute rc;
    int64_t rc_k, n_rec;
    int64_t rc_rerun; /* recomputed layers that rerun attention (lt_model_rc_walk's rerun; -1: all) */
    /* Store slots (the transient block: a segment's recomputed layers, slot = place in the
     * segment; a forward-only run's one) and kept stores (the activation block: one per kept
     * layer, with x_in and the MLP's g and u, as without recompute); offsets within a store as
     * pointers from NULL. */
    size_t store_bytes, act_store_bytes;
    lt_store store_off, act_off;
    int64_t n_act_stores, n_tr_stores, n_ckpt;
    /* Checkpoints: n_ckpt layer inputs (N, C) of `saved_dtype` (f32 or bf16), `ckpt_stride`
     * bytes apart, at `ckpt` in the activation block. A layer always runs on the f32 x_in of its
     * store slot; checkpoints are copied (rounded) out of it and back. */
    size_t act_stores, ckpt, ckpt_stride;
    lt_dtype saved_dtype;
    /* Offload (run->offload_ckpt with n_ckpt > 2): the activation block holds only two checkpoint
     * slots at `ckpt` (checkpoint i lives in slot i % 2 while in use), and a separate host block
     * of offload_bytes (pinned on a device) holds checkpoints 0 .. n_ckpt - 3, ckpt_stride apart
     * (the last two are never overwritten in their slots, so they never travel). */
    int offload;
    size_t offload_bytes;
    /* resid_ckpt (every segment one layer: recompute all, or a by-kind policy with segments of
     * one): a recomputed LoRA layer reads its residual input straight from its checkpoint, and
     * every layer writes its output into the next layer's input (that layer's checkpoint when it is
     * recomputed, its kept store's x_in when kept, xf after the last), so the slots hold no x_in;
     * with bf16 checkpoints the residual stream is rounded at those boundaries, the forward and the
     * recompute see the same inputs, and xc (chunk, C) f32 holds a chunk of rows in flight. */
    int resid_ckpt;
    size_t xc;
    /* attn_bf16 (with bf16 saved_dtype): attention's q, k, v, output and their gradients are
     * bf16 tensors (the stores' q, k, v, att; the workspace's datt, dq, dk, dv), made and read a
     * chunk at a time through f32 chunk buffers: qc (chunk, H·D + 2·Hkv·D) for q, k, v or their
     * gradients, ac (chunk, H·D) for the output, or (chunk, H·D + Hkv·D) to widen the stores'
     * bf16 q_raw, k_raw for the per-head norm's backward. The stores' x_mid is bf16 too, mc
     * (chunk, C) its f32 rows: the forward rounds it before the MLP reads it, so forward,
     * recompute and backward see the same values. */
    int attn_bf16;
    size_t qc, ac, mc;
    /* mlp_bf16: the dense MLPs' gated activation and its gradients are bf16 (the backend's
     * glu_*_bf16 and lora_*_bf16 ops), in dg's buffer: the activation (chunk, F) in its first
     * half, then the backward's gate and up gradients in its two halves. Set where the backend
     * has those ops, LoRA has no dropout, and lora_bf16_takes accepts every dense layer's gate,
     * up and down projections; the values are the f32 path's bit for bit. Under mlp_bf16 the
     * dense layers' MLP norm writes its output h in bf16 (in h's buffer), and so does the
     * attention norm under qkv_bf16 (q, k, v take bf16 inputs). o_bf16 (with attn_bf16): the o
     * projection reads attention's bf16 output rows in place, forward and backward, instead of
     * their f32 widening in ac. */
    int mlp_bf16, qkv_bf16, o_bf16;
    /* gu_bf16 (with mlp_bf16): the dense MLPs' F-wide products are bf16: the gate and up outputs
     * g, u (lora_fwd_bf16's yh; the store's g, u and the chunk buffers half the f32 size) and the
     * down projection's input gradient da (lora_bwd_bf16's dxh, from its dy rounded into h's
     * second half), read by the glu ops widened. Unlike the flags above it changes the values:
     * they are rounded (bf16 noise). Off under the run's gu_f32 or act_f32. */
    int gu_bf16;
    /* Kept attention (recompute without recompute_attention): per recomputed layer that keeps it
     * (n_katt of them, lt_rc_place.katt their slots) an (N, H·D) output of saved_dtype (the store's
     * att then points there) and a (B·H·T) f32 lse in the activation block, `att_stride` /
     * `lse_stride` bytes apart; 0 = none. */
    int keep_attn;
    int64_t n_katt;
    size_t keep_att, keep_lse, att_stride, lse_stride;
    /* Kept q/k/v (keep_attn on the host): per layer with kept attention also the attention half of its store
     * (q_raw, k_raw, rstd_q, rstd_k with the per-head norm; q, k, v after norm and RoPE; x_mid; the
     * LoRA products of q, k, v, o) at `keep_store`, `kept_stride` bytes apart, with offsets
     * `kept_off` (the fields it holds non-NULL), so the recompute runs only the MLP it needs for
     * the next layer's input. */
    int keep_qkv;
    size_t keep_store, kept_stride;
    lt_store kept_off;
    size_t tr_stores, rstd_f, lse_f, pos, tloss; /* transient block */
    /* The step's per-batch attention preparations (lt_attention_batch_prepare), one per distinct
     * window among the layers (attn_window[0 .. n_attn_batch)), each with its buffer of
     * attn_batch_bytes at attn_batch + i·attn_batch_bytes in the transient block (0 bytes where
     * the device needs none: the CPU). */
    int n_attn_batch;
    int64_t attn_window[LT_MODEL_ATTN_WINDOWS_MAX];
    size_t attn_batch, attn_batch_bytes;
    /* The final norm's input xf and output hf (N, C), in block `final_class`: the transients of a
     * forward-only run, else the workspace's datt and dq pieces (dead until a layer's backward).
     * hf_bf16 (training with mlp_bf16): hf is bf16 (rmsnorm_fwd_bf16, the rounding the loss's
     * products apply to an f32 h) and lies where the chunk buffers start, the loss's workspace
     * after it: the chunk buffers hold nothing live while the loss runs, and xf alone is smaller
     * than attention's gradients, so the two f32 tensors no longer set that region's size. */
    lt_mem_class final_class;
    size_t xf, hf;
    int hf_bf16;
    /* Device runs only (in_bytes = 0 on the host): the step's inputs as one transient piece at
     * `inputs`, staged on the host in the same layout and copied in once per step. Offsets
     * within it: tokens (N), targets (N), positions (N) int32, and scalars (4) f32: [0] the loss
     * the loss kernel writes, [1] the upstream gradient dloss it reads, [2] the MoE load-balancing
     * gradient's scale moe_route_bwd reads, [3] Σ_e count_e·Σp_e of the router statistics the step
     * writes (the aux loss before its E/M²); then the packed rows'
     * sequence offsets (B·(S+1) int32 used of B·(T+1)), which attention reads on the device. */
    size_t inputs, in_bytes, in_tokens, in_targets, in_pos, in_scalars, in_offs;
    /* Workspace. Whole-batch (training only): dx (N, C) the residual gradient (also where the
     * loss writes ∂/∂h), datt, dq (N, H·D), dk, dv (N, Hkv·D) of saved_dtype, sharing a region
     * with xf and hf. Chunk-sized (`chunk`
     * rows): h (C) a norm output, g, u (F, absent when the stores keep them), dg (F) the SwiGLU
     * output and then its gate gradient (both bf16 under mlp_bf16, the up gradient beside it), da
     * (F) (the up gradient goes over u, or over the store's u when the stores keep it), dh (C), scratch (max(C, F, H·D)) for LoRA dropout (absent
     * without), dlu (3·r: a group of three projections). */
    int64_t chunk;
    size_t dx, datt, dq, dk, dv, h, g, u, dg, da, dh, scratch, dlu, mm_ws, attn_ws, lce_ws;
    /* Sandwich norms only (else 0): pn (chunk, C) a block's output before its post-norm, prs
     * (chunk) that norm's row statistics (rebuilt wherever they are needed). */
    size_t pn, prs;
    size_t mm_ws_bytes, attn_ws_bytes, lce_ws_bytes;
    lt_moe_layout moe; /* MoE layers' dispatch buffers (workspace) */
    size_t weights_bytes, lora_bytes;
    /* LoRA elements of each LoRA layer's projections; an MoE layer's expert adapters add
     * lt_model_moe_lora_elems after them (the layers' slices follow one another in layer order). */
    int64_t lora_plain;
    size_t class_bytes[LT_MEM_CLASS_COUNT_]; /* raw bytes requested per class (0 = no block) */
    int64_t n_lora;
    int threads;
    int bf16x;        /* the run's bf16 products, on a backend that has them: mm_ws is sized for them */
    lt_device device; /* of the run part */
    size_t align;     /* of the run pieces: 64 host, 256 device (cudaMalloc's) */
} lt_layout;

/* Pure: the layout for (cfg, lora, run). run may be NULL (weights, LoRA and grads only). */
lt_status lt_model_layout(lt_ctx *ctx, const lt_model_config *cfg, const lt_lora_options *lora,
                          const lt_model_run_options *run, lt_layout *out);

/* The store whose block starts at base, with the layout's offsets: a store slot, or with kept = 1
 * a kept layer's store. */
void lt_model_store_at(const lt_layout *lay, uint8_t *base, int kept, lt_store *out);

/* Where LoRA layer j's activations live under a recompute policy. */
typedef struct lt_rc_place {
    int32_t rec;  /* recomputed in the backward from its segment's checkpoint; 0: kept */
    int32_t seg;  /* recomputed: its segment, which is its checkpoint's index */
    int32_t pos;  /* recomputed: its place in the segment, which is its store slot */
    int32_t idx;  /* kept: its store among the kept ones; recomputed: its place among the
                     recomputed layers */
    int32_t last; /* recomputed: the segment's last layer (where the backward enters it) */
    int32_t katt; /* recomputed and keeping its attention output: that output's slot among the kept
                     ones; -1 otherwise (a kept layer, or one whose recompute reruns attention) */
} lt_rc_place;

typedef struct lt_rc_counts {
    int64_t n_rec, n_kept, n_seg, max_len; /* max_len: layers of the longest segment */
    int64_t n_katt;                        /* recomputed layers that keep their attention output */
} lt_rc_counts;

/* Pure: the K LoRA layers (model layers L - K .. L - 1) under policy r with segments of at most
 * cap layers: each one's place into out (K entries; may be NULL) and the counts. `rerun` of the
 * recomputed layers rerun their attention (negative: all of them): the sliding-window ones first,
 * then the others, each kind from the bottom; the rest keep their attention outputs. */
void lt_model_rc_walk(const lt_model_config *cfg, lt_recompute r, int64_t cap, int64_t K, int64_t rerun,
                      lt_rc_place *out, lt_rc_counts *n);

/* Points the fields of st that the layout's kept_off holds at the kept pieces at base. */
void lt_model_kept_at(const lt_layout *lay, uint8_t *base, lt_store *st);

/* Closes the offload copy queue (waiting for its copies) and frees the host block of offloaded
 * checkpoints; no-op without them. The run's release and lt_model_free call it first. */
void lt_model_release_offload(lt_ctx *ctx, struct lt_model *m);

typedef struct lt_layer {
    lt_layer_desc desc;                    /* what the layer is (lt_model_describe_layer at load) */
    lt_tensor w[LT_PROJ_COUNT_];           /* frozen (out, in) */
    float *bias[3];                        /* q, k, v biases (desc.qkv_bias), f32; else NULL */
    float *attn_norm, *mlp_norm;           /* (C) */
    float *q_norm, *k_norm;                /* (D), desc.qk_norm; else NULL */
    float *post_attn_norm, *post_mlp_norm; /* (C), desc.norm == LT_NORM_PLACE_SANDWICH; else NULL */
    lt_tensor router;                      /* (n_experts, C) f32, desc.mlp == LT_MLP_KIND_MOE; else empty */
    lt_tensor shared[3], shared_gate;      /* the shared expert's gate, up, down and its (C) gate (f32),
                                              MoE layers with moe_shared_F > 0; else empty */
    int has_lora;
    float *lora_a[LT_PROJ_COUNT_], *lora_b[LT_PROJ_COUNT_]; /* NULL when not targeted */
    float *grad_a[LT_PROJ_COUNT_], *grad_b[LT_PROJ_COUNT_];
    /* MoE layers with the expert targets (else NULL), [0] gate_up, [1] down, in the flat buffers as
     * lt_lora_tensor describes them: ex_a[0] (E·r, C), ex_b[0] the gate stack (E·moe_F, r) then the
     * up stack (E·moe_F, r); ex_a[1] (E·r, moe_F), ex_b[1] (E·C, r); ex_ga, ex_gb their gradients. */
    float *ex_a[2], *ex_b[2], *ex_ga[2], *ex_gb[2];
} lt_layer;

/* How every layer's attention runs, chosen once (lt_model_prepare, lt_model_set_context_parallel). */
typedef enum lt_attn_path {
    LT_ATTN_PATH_KERNEL = 0, /* the device's lt_attention_forward / _backward */
    LT_ATTN_PATH_RING,       /* context parallel: ring attention over the communicator (host) */
    LT_ATTN_PATH_ULYSSES,    /* context parallel: all-to-all over heads around the device's kernel */
    LT_ATTN_PATH_COUNT_
} lt_attn_path;

struct lt_model {
    lt_model_config cfg;
    lt_lora_options lora;
    lt_model_options opt;
    const lt_backend *be;
    lt_layer *layers;      /* (L), host bookkeeping (accounted) */
    lt_tensor embed, head; /* head aliases embed when tied */
    float *final_norm;     /* (C) */
    float *inv_freq;       /* (LT_ROPE_TABLE_LEN(D)): inverse frequencies + attention factor */
    int rope_file_factors; /* the table is divided by a GGUF's rope_freqs.weight */
    float *inv_freq_local; /* (LT_ROPE_TABLE_LEN(D)): RoPE table 1 (cfg.rope_local_theta, unscaled),
                              else NULL */
    float lora_scale;      /* alpha / r */
    int64_t l0;            /* first LoRA layer */
    lt_layout lay;         /* of the prepared run (weights/lora fields valid from load) */
    lt_model_run_options run;
    int prepared;
    uint8_t *block[LT_MEM_CLASS_COUNT_];
    size_t block_bytes[LT_MEM_CLASS_COUNT_];
    float *lora_params, *lora_grads;
    uint8_t *host_inputs;       /* device runs: host staging of the inputs piece (lay.in_bytes) */
    double moe_aux_norm;        /* the last checked batch's E/M² (MoE aux loss = it · scalars[3]) */
    uint8_t *host_inputs_block; /* the lt_alloc block (host_inputs_bytes) holding it on whole pages of
                                   its own: pinned by the backend (host_register), a range must not
                                   share a page with another pinned range */
    size_t host_inputs_bytes;
    struct lt_comm *cp;     /* context parallel over this world (NULL = off) */
    int cp_kind;            /* lt_cp_kind: ring (host) or Ulysses (all-to-all over heads) */
    lt_attn_path attn_path; /* from cp and cp_kind */
    void *cp_ws;            /* Ulysses workspace for the prepared run, on the model's device */
    size_t cp_ws_bytes;
    lt_model_grad_ready_fn grad_ready; /* lt_model_set_grad_ready */
    void *grad_ready_arg;
    uint8_t *offload; /* lay.offload: the host block of offloaded checkpoints */
    void *xfer;       /* lay.offload: the backend's copy queue */
};

/* Host bookkeeping of a loaded model (the struct and its layer table), counted in the weights
 * class of the size table. */
size_t lt_model_meta_bytes(const lt_model_config *cfg);

/* The context-parallel attention parameters of a step of T_local tokens per rank. */
lt_cp_attention_params lt_model_cp_params(const lt_model *m, int64_t T_local);

/* The union of every layer's description's per-token pieces (q/k norm, biases): a store slot
 * serves any layer, so the layout sizes it for this. */
lt_layer_desc lt_model_widest_layer(const lt_model_config *cfg);

/* Unpins and frees the input staging (model.c; also called by lt_model_free). */
void lt_model_free_inputs(lt_ctx *ctx, lt_model *m);

#endif
