/* Internals shared by the model's source files in src/model/ and its tests: the model struct,
 * the memory layout (one block per lifetime class, carved by a pure layout function that the size
 * table and the allocator both use) and the RoPE frequency table. Not a public API. */
#ifndef LT_MODEL_INTERNAL_H
#define LT_MODEL_INTERNAL_H

#include "backend/backend.h"
#include "longtune/model.h"

/* Alignment of every piece carved from a class block (cache line, and what lce/attention require
 * of their workspaces). */
#define LT_MODEL_ALIGN 64

/* inv_freq (D/2) for rotate-half RoPE: theta^(-2i/D) in fp32 as transformers computes it, then
 * the llama3 piecewise rescaling when cfg->rope_llama3 (factor, low/high frequency factors,
 * original context), exactly as transformers' _compute_llama3_parameters. */
void lt_model_rope_inv_freq(const lt_model_config *cfg, float *inv_freq);

/* Shapes (out, in) of projection p. */
void lt_model_proj_shape(const lt_model_config *cfg, lt_proj p, int64_t *out, int64_t *in);

/* Defaults resolved (targets, rank, alpha, num_layers clamped to L). */
lt_lora_options lt_model_resolve_lora(const lt_model_config *cfg, const lt_lora_options *in);

/* The frozen tensors in the order they are carved from the weights block. */
typedef enum lt_wkind {
    LT_W_EMBED = 0, LT_W_HEAD, LT_W_FINAL_NORM, LT_W_INV_FREQ, LT_W_PROJ, LT_W_BIAS, LT_W_ATTN_NORM,
    LT_W_MLP_NORM, LT_W_Q_NORM, LT_W_K_NORM
} lt_wkind;

typedef struct lt_wpiece {
    lt_wkind kind;
    int64_t layer;        /* -1 for model-level tensors */
    int which;            /* lt_proj for LT_W_PROJ; 0/1/2 = q/k/v for LT_W_BIAS */
    lt_dtype dtype;       /* in memory */
    int ndim;
    int64_t shape[2];
    size_t offset, bytes; /* in the weights block */
} lt_wpiece;

/* Calls fn on every frozen tensor of cfg in carve order (fn may be NULL) and returns the block's
 * total bytes, or 0 when a size overflows or a row is not a whole number of blocks. */
size_t lt_model_weights_walk(const lt_model_config *cfg, void (*fn)(void *arg, const lt_wpiece *p), void *arg);

/* Everything one layer saves for its backward; offsets (bytes) inside a store, or pointers. */
typedef struct lt_store {
    float *x_in;             /* (N, C) layer input */
    float *h1;               /* (N, C) attention-norm output */
    float *q_raw, *k_raw;    /* (N, H·D), (N, Hkv·D) before the per-head norm (Qwen3 only) */
    float *q, *k, *v;        /* after norm and RoPE: (N, H·D), (N, Hkv·D), (N, Hkv·D) */
    float *att;              /* (N, H·D) attention output */
    float *lse;              /* (B, H, T) attention log-sum-exp */
    float *x_mid;            /* (N, C) residual after attention */
    float *h2;               /* (N, C) MLP-norm output */
    float *g, *u;            /* (N, F) gate and up projections */
    float *rstd1, *rstd2;    /* (N) */
    float *rstd_q, *rstd_k;  /* (N·H), (N·Hkv), Qwen3 only */
    float *lu[LT_PROJ_COUNT_]; /* (N, r) LoRA down-projections x·Aᵀ of targeted projections */
} lt_store;

/* Byte offsets of the pieces of each class block, and the class sizes. */
typedef struct lt_layout {
    size_t store_bytes;              /* one lt_store */
    lt_store store_off;              /* offsets within a store, as pointers from NULL */
    int64_t n_act_stores, n_tr_stores, n_ckpt;
    size_t act_stores, ckpt;         /* offsets in the activation block */
    /* Kept attention (recompute without recompute_attention): per LoRA layer an (N, H·D) output
     * and a (B·H·T) lse in the activation block, `att_stride` / `lse_stride` bytes apart; 0 = none. */
    int keep_attn;
    size_t keep_att, keep_lse, att_stride, lse_stride;
    size_t tr_stores, xa, xb, xf, hf, rstd_f, lse_f, pos, tloss; /* transient block */
    /* Device runs only (in_bytes = 0 on the host): the step's inputs as one transient piece at
     * `inputs`, staged on the host in the same layout and copied in once per step. Offsets
     * within it: tokens (N), targets (N), positions (N) int32, and scalars (4) f32: [0] the loss
     * the loss kernel writes, [1] the upstream gradient dloss it reads. */
    size_t inputs, in_bytes, in_tokens, in_targets, in_pos, in_scalars;
    size_t dx, dh, da, dg, du, dq, dk, dv, datt, dlu, scratch, mm_ws, attn_ws, lce_ws; /* workspace */
    size_t mm_ws_bytes, attn_ws_bytes, lce_ws_bytes;
    size_t weights_bytes, lora_bytes;
    size_t class_bytes[LT_MEM_CLASS_COUNT_]; /* raw bytes requested per class (0 = no block) */
    int64_t n_lora;
    int threads;
    lt_device device;                /* of the run part */
    size_t align;                    /* of the run pieces: 64 host, 256 device (cudaMalloc's) */
} lt_layout;

/* Pure: the layout for (cfg, lora, run). run may be NULL (weights, LoRA and grads only). */
lt_status lt_model_layout(lt_ctx *ctx, const lt_model_config *cfg, const lt_lora_options *lora,
                          const lt_model_run_options *run, lt_layout *out);

/* The store whose block starts at base, with the layout's offsets. */
void lt_model_store_at(const lt_layout *lay, uint8_t *base, lt_store *out);

typedef struct lt_layer {
    lt_tensor w[LT_PROJ_COUNT_];       /* frozen (out, in) */
    float *bias[3];                    /* q, k, v biases (Qwen2), f32 */
    float *attn_norm, *mlp_norm;       /* (C) */
    float *q_norm, *k_norm;            /* (D), Qwen3 */
    int has_lora;
    float *lora_a[LT_PROJ_COUNT_], *lora_b[LT_PROJ_COUNT_];  /* NULL when not targeted */
    float *grad_a[LT_PROJ_COUNT_], *grad_b[LT_PROJ_COUNT_];
} lt_layer;

struct lt_model {
    lt_model_config cfg;
    lt_lora_options lora;
    lt_model_options opt;
    const lt_backend *be;
    lt_layer *layers;       /* (L), host bookkeeping (accounted) */
    lt_tensor embed, head;  /* head aliases embed when tied */
    float *final_norm;      /* (C) */
    float *inv_freq;        /* (D/2) */
    float lora_scale;       /* alpha / r */
    int64_t l0;             /* first LoRA layer */
    lt_layout lay;          /* of the prepared run (weights/lora fields valid from load) */
    lt_model_run_options run;
    int prepared;
    uint8_t *block[LT_MEM_CLASS_COUNT_];
    size_t block_bytes[LT_MEM_CLASS_COUNT_];
    float *lora_params, *lora_grads;
    uint8_t *host_inputs;   /* device runs: host staging of the inputs piece (lay.in_bytes) */
    struct lt_comm *cp;     /* context parallel over this world (NULL = off) */
    int cp_kind;            /* lt_cp_kind: ring (host) or Ulysses (all-to-all over heads) */
    void *cp_ws;            /* Ulysses workspace for the prepared run, on the model's device */
    size_t cp_ws_bytes;
    lt_model_grad_ready_fn grad_ready; /* lt_model_set_grad_ready */
    void *grad_ready_arg;
};

/* Host bookkeeping of a loaded model (the struct and its layer table), counted in the weights
 * class of the size table. */
size_t lt_model_meta_bytes(const lt_model_config *cfg);

#endif
