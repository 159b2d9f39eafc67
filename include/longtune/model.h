/* The one decoder model (Llama, Llama 3.x, Qwen2/2.5, Qwen3, SmolLM2, Mistral, Phi-3, Gemma 2/3 and
 * the mixture-of-experts Qwen3-MoE, Qwen2-MoE and Mixtral: families
 * whose config readers fill a per-layer description; RoPE scaling as transformers has it) with
 * LoRA adapters: loading (HF folder of config.json + safetensors, or GGUF),
 * forward and backward of a batch of packed rows, gradient checkpointing, and the size tables the
 * planner sums. The base weights are frozen; only LoRA parameters get gradients. The optimizer,
 * schedules and adapter files belong to the trainer (train.h); generation's KV cache is kv_cache.h. */
#ifndef LONGTUNE_MODEL_H
#define LONGTUNE_MODEL_H

#include "export.h"
#include "attention.h"
#include "comm.h"
#include "lce.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_model_arch {
    LT_ARCH_LLAMA = 0, /* Llama 1/2/3.x, SmolLM2, TinyLlama, Mistral-style without sliding window */
    LT_ARCH_QWEN2,     /* q/k/v biases */
    LT_ARCH_QWEN3,     /* per-head q/k RMSNorm, explicit head_dim */
    LT_ARCH_MISTRAL,   /* Llama layout, optional sliding window, explicit head_dim (Nemo) */
    LT_ARCH_GEMMA2,    /* GeGLU, sandwich norms, (1+w) RMSNorm, softcaps, alternating windows */
    LT_ARCH_GEMMA3,    /* Gemma 2's block with q/k norms, 5 local : 1 global, two RoPE bases */
    LT_ARCH_PHI3,      /* fused qkv and gate_up (split at load), longrope scaling */
    LT_ARCH_QWEN3_MOE, /* Qwen3's attention, routed-expert MLPs (dense ones in mlp_only_layers) */
    LT_ARCH_MIXTRAL,   /* Mistral's attention, routed-expert MLPs, top-k always renormalised */
    LT_ARCH_QWEN2_MOE, /* Qwen2's attention, routed experts beside a sigmoid-gated shared expert */
} lt_model_arch;

/* RoPE frequency scaling, with Hugging Face's semantics (modeling_rope_utils). */
typedef enum lt_rope_scaling {
    LT_ROPE_SCALING_NONE = 0,
    LT_ROPE_SCALING_LINEAR,
    LT_ROPE_SCALING_DYNAMIC,
    LT_ROPE_SCALING_YARN,
    LT_ROPE_SCALING_LLAMA3,
    LT_ROPE_SCALING_LONGROPE,
} lt_rope_scaling;

#define LT_MAX_EOS 8                  /* end-of-sequence ids a model may list */
#define LT_ROPE_MAX_FACTORS 256       /* longrope short/long factors: one per frequency (D/2) */
#define LT_MODEL_MAX_MIXED_LAYERS 256 /* layers whose projections may change dtype (lt_model_config) */

/* Projections that can carry LoRA; bit masks for lt_lora_options.targets. */
typedef enum lt_proj {
    LT_PROJ_Q = 0,
    LT_PROJ_K,
    LT_PROJ_V,
    LT_PROJ_O,
    LT_PROJ_GATE,
    LT_PROJ_UP,
    LT_PROJ_DOWN,
    LT_PROJ_COUNT_
} lt_proj;
#define LT_LORA_ALL_TARGETS 0x7fu
/* LoRA on the experts of mixture-of-experts layers (bits of lt_lora_options.targets beside the
 * projections', never part of LT_LORA_ALL_TARGETS), as PEFT's `target_parameters`
 * "mlp.experts.gate_up_proj" and "mlp.experts.down_proj" adapt transformers' fused expert stacks:
 * per expert e one A_e (r, C) shared by its gate and up rows and one B_e (2·moe_F, r); for down one
 * A_e (r, moe_F) and B_e (C, r); scale alpha / r, no dropout. Names on the command line and in
 * configs: "experts.gate_up_proj", "experts.down_proj". Dense layers among the LoRA layers take
 * neither (as PEFT, which finds no such parameter there). */
#define LT_LORA_EXPERTS_GATE_UP (1u << 7)
#define LT_LORA_EXPERTS_DOWN (1u << 8)
#define LT_LORA_EXPERT_TARGETS (LT_LORA_EXPERTS_GATE_UP | LT_LORA_EXPERTS_DOWN)

/* PEFT / HF module names of the projections ("q_proj", ..., "down_proj"). */
LT_API const char *lt_proj_name(lt_proj p);

/* ---- per-layer description ----
 * What kind of block each layer is, expanded from the config (lt_model_describe_layer) at load and
 * by the planner: the model runs the list, the layout prices it. Zero values are the pre-norm
 * SwiGLU decoder layer with full causal attention that every family read today has. */
typedef enum lt_attn_kind {
    LT_ATTN_KIND_FULL = 0, /* causal over every earlier token of the sequence */
    LT_ATTN_KIND_SLIDING,  /* causal over the last `window` tokens, the token itself included */
    LT_ATTN_KIND_NONE,     /* no attention block (refused: nothing runs it yet) */
} lt_attn_kind;

typedef enum lt_norm_place {
    LT_NORM_PLACE_PRE = 0,  /* x + f(norm(x)) */
    LT_NORM_PLACE_POST,     /* norm(x + f(x)) (refused: nothing runs it yet) */
    LT_NORM_PLACE_SANDWICH, /* x + norm(f(norm(x))) (Gemma 2 / 3) */
} lt_norm_place;

typedef enum lt_mlp_kind {
    LT_MLP_KIND_SWIGLU = 0, /* down(silu(gate(h)) * up(h)) */
    LT_MLP_KIND_GEGLU,      /* down(gelu_tanh(gate(h)) * up(h)) (Gemma 2 / 3) */
    LT_MLP_KIND_MOE,        /* routed experts: a router's top-k over n_experts SwiGLU experts */
} lt_mlp_kind;

typedef struct lt_layer_desc {
    lt_attn_kind attn;
    int64_t window; /* LT_ATTN_KIND_SLIDING: W keys per query; 0 otherwise */
    int64_t D;      /* head dim of q, k, v */
    float softcap;  /* attention scores -> cap * tanh(s / cap); 0 = off */
    int qk_norm;    /* per-head RMSNorm of q and k over D before RoPE (Qwen3) */
    int qkv_bias;   /* q, k, v projections carry biases (Qwen2) */
    lt_norm_place norm;
    lt_mlp_kind mlp;
    int rope; /* which RoPE table the layer rotates by: 0 (rope_theta and its scaling) or, with
                 rope_local_theta, 1 for sliding layers (Gemma 3) */
} lt_layer_desc;

LT_API const char *lt_attn_kind_name(lt_attn_kind k);
LT_API const char *lt_norm_place_name(lt_norm_place p);
LT_API const char *lt_mlp_kind_name(lt_mlp_kind k);

/* Architecture hyper-parameters plus the dtypes the frozen weights are held in (what the size
 * tables need). Filled by the loaders (lt_model_inspect) or by hand for planning. */
typedef struct lt_model_config {
    lt_model_arch arch;
    int64_t V;             /* vocabulary */
    int64_t C;             /* model width (hidden_size) */
    int64_t F;             /* MLP width (intermediate_size) */
    int64_t L;             /* layers */
    int64_t H, Hkv, D;     /* query heads, key/value heads, head dim (H*D need not equal C) */
    int64_t max_positions; /* max_position_embeddings (informational) */
    double rope_theta;
    double rope_local_theta; /* RoPE base of sliding-window layers (Gemma 3
                                rope_local_base_freq); 0 = rope_theta */
    /* RoPE scaling (rope_parameters / rope_scaling) with transformers' semantics: the factor, the
     * pretraining context (original_max_position_embeddings; max_position_embeddings for
     * dynamic), llama3's low/high frequency factors, YaRN's beta_fast/beta_slow (0 = 32 / 1) and
     * truncate flag (stored negated: 0 = truncate, the default), the attention factor cos and sin
     * are multiplied by (YaRN, longrope; 0 = its default from the factor), longrope's
     * per-frequency factors. */
    lt_rope_scaling rope_scaling;
    double rope_factor, rope_low_freq, rope_high_freq;
    int64_t rope_original_ctx;
    double rope_beta_fast, rope_beta_slow, rope_attn_factor;
    int rope_yarn_no_truncate;
    int64_t rope_n_factors; /* longrope: entries of rope_short/long_factor (D/2) */
    float rope_short_factor[LT_ROPE_MAX_FACTORS], rope_long_factor[LT_ROPE_MAX_FACTORS];
    float rms_eps;
    int tie_embeddings; /* lm head = embedding matrix */
    int qkv_bias;       /* Qwen2 */
    int qk_norm;        /* Qwen3 */
    /* Layer kinds beyond the uniform decoder (all zero for Llama, SmolLM2, Qwen2, Qwen3): the
     * family's config reader sets them, lt_model_describe_layer expands them per layer. */
    int64_t sliding_window; /* W > 0: layers attend over their last W tokens; 0 = full attention */
    int64_t sliding_period; /* with sliding_window: layer l keeps full attention when
                               l % period == period - 1 (alternating local/global); 0 = every
                               layer slides */
    float attn_softcap;     /* attention logit softcap of every layer; 0 = off */
    lt_norm_place norm_place;
    lt_mlp_kind mlp;
    /* Gemma: */
    float final_softcap;         /* final logits -> cap * tanh(z / cap); 0 = off */
    float embed_scale;           /* embedding rows multiplied by this (sqrt(C) rounded to the
                             activations' dtype as transformers does); 0 = 1 */
    double query_scale;          /* attention score scale; 0 = 1/sqrt(D) (query_pre_attn_scalar^-0.5) */
    int norm_plus_one;           /* RMSNorm weights stored as w - 1 (the loader adds 1 once) */
    int32_t bos_id, eos_id;      /* -1 when unknown */
    int32_t eos_ids[LT_MAX_EOS]; /* every end-of-sequence id (eos_id first; generation_config.json
                                    lists), n_eos of them */
    int n_eos;
    /* Mixture of experts (Qwen3-MoE, Mixtral; all zero for a dense model). Layer l is an MoE
     * layer when n_experts > 0, moe_dense[l] is 0 (Qwen3-MoE's mlp_only_layers) and (l + 1) %
     * moe_every == 0 (decoder_sparse_step; 0 = every layer). An MoE layer's router (n_experts, C)
     * gives per token softmax probabilities over the experts; the n_experts_used largest are kept
     * (torch.topk's order), renormalised to sum 1 when moe_norm_topk, and weight the outputs of
     * those experts, each a SwiGLU MLP of width moe_F. In an MoE layer the projections gate, up
     * and down are the experts' matrices stacked: gate and up (n_experts·moe_F, C), down
     * (n_experts·C, moe_F), expert e's rows at [e·rows, (e + 1)·rows); their dtypes are
     * proj_dtype / layer_proj_dtype as for any projection. moe_shared_F > 0: a shared expert of
     * that width runs on every token, its output scaled by sigmoid(shared gate · h) (Qwen2-MoE).
     * moe_aux_coef: the weight of transformers' load-balancing loss added to the loss
     * (router_aux_loss_coef when the config sets output_router_logits, else 0). */
    int64_t n_experts, n_experts_used, moe_F, moe_shared_F, moe_every;
    int moe_norm_topk;
    float moe_aux_coef;
    uint8_t moe_dense[LT_MODEL_MAX_MIXED_LAYERS];
    /* In-memory dtypes of the frozen weights (after --quantize). proj_dtype per lt_proj; embed
     * (V, C) and, untied only, head (V, C): f16 ones widened to f32 on the CPU, f32 and f16 ones
     * held as bf16 on a GPU (lt_model_inspect with the device). Norm weights and biases are always
     * held as f32. */
    lt_dtype proj_dtype[LT_PROJ_COUNT_];
    lt_dtype embed_dtype, head_dtype;
    /* Files whose projections change dtype across layers (llama.cpp's _K_M mixes hold attn_v and
     * ffn_down as Q6_K in some layers, Q4_K in the rest): proj_dtype is layer 0's and
     * layer_proj_dtype[l][p] is 1 + layer l's dtype where it differs, 0 where it is proj_dtype[p]
     * (so a zeroed table means one dtype per projection). Read it through lt_model_proj_dtype. */
    uint8_t layer_proj_dtype[LT_MODEL_MAX_MIXED_LAYERS][LT_PROJ_COUNT_];
} lt_model_config;

/* Pure: the in-memory dtype of layer l's projection p (proj_dtype[p] unless the layer's differs). */
LT_API lt_dtype lt_model_proj_dtype(const lt_model_config *cfg, int64_t l, lt_proj p);

/* Pure: the description of layer l (0 <= l < cfg->L) that cfg implies. */
LT_API void lt_model_describe_layer(const lt_model_config *cfg, int64_t l, lt_layer_desc *out);

/* The one check of the layer list: LT_OK when the model can run every layer's description,
 * else LT_ERR_UNSUPPORTED naming the first layer and the kind it cannot run (no attention, post
 * norms, an MoE block without experts or with sandwich norms, a head dim other than the model's
 * one, a RoPE table it does not have) or LT_ERR_INVALID_ARG (a negative window or softcap; a
 * negative or non-finite final softcap, embedding scale, query scale or local RoPE base; MoE fields
 * out of range: experts outside 1..512, top-k outside 1..experts, an expert width <= 0). lt_model_load and the size table (so the
 * planner) call it. */
LT_API lt_status lt_model_check_layers(lt_ctx *ctx, const lt_model_config *cfg);

/* Reads a Hugging Face config.json as transformers 4.x or 5.x writes it (model_type llama, qwen2,
 * qwen3, mistral, phi3, gemma2, gemma3_text, qwen3_moe, qwen2_moe, mixtral; or a multimodal
 * wrapper's text_config of one, such as gemma3's), RoPE from rope_parameters or rope_scaling, and the EOS ids of generation_config.json
 * beside it. Dtypes are set to f32; the loaders overwrite them from the tensors. Errors: LT_ERR_IO,
 * LT_ERR_FORMAT (bad JSON or a key of the wrong type, named), LT_ERR_UNSUPPORTED (another
 * architecture, a rope type, dtype, activation or quantization_config longtune does not run,
 * naming key and value). */
LT_API lt_status lt_model_config_read_hf(lt_ctx *ctx, const char *config_json_path, lt_model_config *cfg);

/* The lt_rope_scaling of a transformers rope_type name ("default", "linear", "dynamic", "yarn",
 * "llama3", "longrope"). Errors: LT_ERR_UNSUPPORTED naming the value. */
LT_API lt_status lt_rope_scaling_parse(lt_ctx *ctx, const char *name, lt_rope_scaling *out);
/* The transformers rope_type name of s ("default" for none). */
LT_API const char *lt_rope_scaling_name(lt_rope_scaling s);

/* cfg's RoPE as the rope_parameters object transformers 5 reads ({"rope_type": ..., "rope_theta":
 * ..., "factor": ..., ...}; longrope with its factor lists), NUL-terminated into buf. The one
 * serialisation of the RoPE config for every file longtune writes. Errors: LT_ERR_INVALID_ARG
 * when cap is too small (the needed size named). */
LT_API lt_status lt_model_config_rope_json(lt_ctx *ctx, const lt_model_config *cfg, char *buf, size_t cap);

/* RoPE scaling requested on top of the model's own (the CLI's --rope-scaling): replaces the
 * config's scaling (lt_model_config_apply_rope on an inspected config, lt_model_set_rope on a
 * loaded model). original_ctx 0 = the model's max_position_embeddings; beta_fast/slow and
 * attn_factor 0 = transformers' defaults. The model's max_positions becomes original_ctx ×
 * factor. */
typedef struct lt_rope_override {
    lt_rope_scaling scaling; /* NONE = no override */
    double factor;
    int64_t original_ctx;
    double beta_fast, beta_slow, attn_factor;
} lt_rope_override;

/* Applies ov to cfg (nothing when ov->scaling is NONE).
 * Errors: LT_ERR_INVALID_ARG (factor <= 0, NaN or < 1, an original context longer than the
 * extended one or than the model's own, negative betas or attention factor, longrope without the
 * model's factor lists), named. */
LT_API lt_status lt_model_config_apply_rope(lt_ctx *ctx, lt_model_config *cfg, const lt_rope_override *ov);

typedef struct lt_lora_options {
    unsigned targets;   /* bits (1u << lt_proj) and LT_LORA_EXPERT_TARGETS; no projection bit = all
                           projections (LT_LORA_ALL_TARGETS) */
    int64_t num_layers; /* LoRA on the last K layers; 0 or > L = all */
    int64_t rank;       /* r; 0 = 8 */
    float alpha;        /* scaling = alpha / r; 0 = 16 */
    float dropout;      /* on the LoRA input, in [0, 1) */
    uint64_t seed;      /* init (A kaiming-uniform as PEFT, B = 0) and dropout masks */
} lt_lora_options;

/* Which LoRA layers the backward recomputes. A recomputed layer keeps only its segment's input
 * (a checkpoint; with recompute_attention unset, also its attention output); a kept layer keeps
 * its full activations, as without recompute. Segments are runs of consecutive recomputed layers
 * of at most recompute_k layers each, one checkpoint per segment. */
typedef enum lt_recompute {
    LT_RECOMPUTE_NONE = 0, /* keep every layer's activations */
    LT_RECOMPUTE_EVERY,    /* keep each layer's input, recompute the layer in backward */
    LT_RECOMPUTE_EVERY_K,  /* keep every k-th layer's input, recompute segments of k layers */
    LT_RECOMPUTE_SLIDING,  /* recompute the sliding-window layers only (segments of recompute_k
                              of them, 0 = 1); full-attention layers keep their activations */
    LT_RECOMPUTE_GLOBAL,   /* recompute the full-attention layers only; sliding ones keep theirs */
} lt_recompute;

/* Pure: 1 when policy r recomputes layer l (0 <= l < cfg->L) of cfg in the backward, by its
 * description's attention kind for the by-kind policies; 0 for none and for layers outside. */
LT_API int lt_model_recomputes_layer(const lt_model_config *cfg, lt_recompute r, int64_t l);

/* Pure: the most layers one segment of policy r holds when recompute_k is k (0: the policy's
 * default): 1 for every layer, k where given, 2 for every:K. */
LT_API int64_t lt_model_recompute_cap(lt_recompute r, int64_t k);

/* Pure: when `rerun` of the recomputed ones among the K LoRA layers (model layers L - K .. L - 1)
 * rerun their attention under policy r with segments of at most cap layers (negative or more than
 * there are: all), how many of them have sliding windows (*sliding, taken first: their attention
 * is the cheaper to rerun) and how many not (*other); each kind's reruns are its lowest recomputed
 * layers. The last segment counts for neither: the backward reads its stores from the forward, so
 * it neither reruns nor keeps attention. */
LT_API void lt_model_attention_rerun_split(const lt_model_config *cfg, lt_recompute r, int64_t cap, int64_t K,
                                           int64_t rerun, int64_t *sliding, int64_t *other);

/* Shapes of the step and execution choices: everything the activation and workspace classes
 * depend on. Zero-initialised fields take the defaults noted. */
typedef struct lt_model_run_options {
    int64_t B, T;     /* rows per batch and tokens per row (maximum; a batch may be smaller) */
    lt_device device; /* where the run's memory lives, for the size table (the planner
                                 sets it from lt_plan_options.device); lt_model_prepare always
                                 uses the model's device */
    lt_recompute recompute;
    int64_t recompute_k;                /* layers per segment: LT_RECOMPUTE_EVERY_K's k (0 = 2); the
                                 by-kind policies' cap on a run of consecutive recomputed layers
                                 (0 = 1, a checkpoint per recomputed layer) */
    int recompute_attention;            /* under a recompute policy: 0 (default) keeps each LoRA layer's
                                 attention output (N, H·D) and row log-sum-exp (B·H·T) with the
                                 checkpoints, so the recompute skips the attention forward (the
                                 largest per-layer cost at long T); on the CPU also q, k, v, the
                                 mid-layer residual and the q/k/v/o LoRA products, so the recompute
                                 runs no attention projection either; 1 reruns it and keeps only the
                                 layer inputs (least memory, e.g. for the longest context) */
    int64_t recompute_attention_layers; /* with recompute_attention 0: how many of the recomputed
                                 layers rerun their attention all the same, keeping only their
                                 inputs (0 = none; the number of recomputed layers below the last
                                 segment or more = all, as recompute_attention 1: the last
                                 segment's stores survive from the forward, so it neither keeps
                                 nor reruns attention). The sliding-window layers go first
                                 (their attention is the cheaper to rerun), then the others from
                                 the bottom: a dial between the two settings' memory and time */
    lt_attention_impl attention;        /* AUTO = flash */
    lt_lce_impl loss;                   /* AUTO = fused */
    int threads;                        /* CPU threads; 0 = the context's */
    int forward_only;                   /* 1: evaluation / generation only (no saved activations, no
                                 backward buffers); lt_model_forward_backward is then refused */
    int saved_bf16;                     /* checkpoints (and the kept attention outputs) in bf16: 0 = the
                                 backend's choice (CUDA bf16, CPU f32), 1 = bf16, -1 = f32. bf16
                                 halves the largest activation class; the recompute then starts
                                 from the rounded layer inputs (the forward itself runs on f32) */
    int bf16_products;                  /* 1: the products of weights held in bf16, f16 or a block format
                                 (QLoRA) take x and W rounded to bf16, with f32 sums, as the CUDA
                                 products do, and so does the fused loss on a bf16 or quantized
                                 head; on the CPU they run through oneDNN (AMX or AVX512-BF16 tiles
                                 where the CPU has them, several times the f32 GEMMs' rate), in the
                                 workspace the plan counts. Flash attention's tiles multiply bf16
                                 operands too (lt_attention_params.bf16_products; AMX tiles where
                                 the CPU has them). f32 and FP8 weights keep their products. 0 (default): the CPU multiplies the weights as held with
                                 f32 x exactly; CUDA's products are bf16 either way. A CPU build
                                 without oneDNN refuses 1 */
    int act_f32;                        /* 1: the activations the backend would hand its products in
                                 bf16 (CUDA: the dense MLPs' gated activation and its gradients,
                                 attention's output into the o projection) stay f32. The products
                                 round them to bf16 either way, so the results are the same bits
                                 and only the memory traffic differs: for comparisons. 0 = the
                                 backend's choice */
    int gu_f32;                         /* 1: the dense MLPs' F-wide products (the gate and up outputs,
                                 the down projection's input gradient) stay f32 where the
                                 backend would write them in bf16 (CUDA, with the bf16
                                 activations above: half their memory and traffic, each rounded
                                 to bf16 as transformers' bf16 models hold them). Then act_f32 = 0
                                 gives act_f32 = 1's results bit for bit. act_f32 = 1 implies it.
                                 0 = the backend's choice */
    int64_t chunk_rows;                 /* rows per chunk of the position-wise work (norms, projections,
                                 LoRA, the MLP) in forward, recompute and backward, so their
                                 buffers are O(chunk) and only attention's inputs and outputs span
                                 the whole batch; 0 = LT_MODEL_CHUNK_ROWS */
    int offload_ckpt;                   /* 1: keep the checkpoints (layer inputs saved across the step) in
                                 host memory, page-locked on a device (lt_alloc_pinned): two
                                 device slots remain; a layer's checkpoint is copied out while the
                                 next layer computes, and in the backward the one below is copied
                                 back into the free slot while the current layer's backward runs
                                 (a copy stream ordered by events; same results, bit for bit). The
                                 two newest checkpoints never leave the slots, so the host holds
                                 n_ckpt - 2 of them (lt_model_sizes.offload_bytes). Needs a
                                 recompute policy (there are no checkpoints without one); ignored
                                 by a forward_only run. On the CPU the same schedule runs between
                                 two host blocks (the reference of the schedule; it saves nothing
                                 there). Kept attention outputs stay on the device. */
    int64_t moe_chunk_tokens;           /* MoE layers: tokens whose experts run together (routing runs
                                 once over the batch; gathered rows, the experts' activations
                                 and their gradients exist for one chunk at a time, recomputed in
                                 the backward), so an MoE layer's extra memory is bounded by the
                                 chunk; 0 = LT_MODEL_MOE_CHUNK_TOKENS, >= N = unchunked */
} lt_model_run_options;

/* Default tokens per MoE dispatch chunk. */
#define LT_MODEL_MOE_CHUNK_TOKENS 4096

/* Default rows per position-wise chunk: the CUDA matmul's own x-chunk, so no GEMM gets smaller. */
#define LT_MODEL_CHUNK_ROWS 8192

/* Lifetime classes of the model's memory, each allocated once. */
typedef enum lt_mem_class {
    LT_MEM_WEIGHTS = 0, /* frozen base weights (quantized stays quantized) + host bookkeeping */
    LT_MEM_LORA,        /* LoRA A and B, f32 */
    LT_MEM_GRADS,       /* LoRA gradients, f32 (same layout as LT_MEM_LORA) */
    LT_MEM_ACTIVATIONS, /* saved for backward across layers (checkpoints or full stores) */
    LT_MEM_TRANSIENTS,  /* one recompute segment's per-layer stores + step buffers */
    LT_MEM_WORKSPACE,   /* dequant tiles, attention and loss workspaces, backward scratch */
    LT_MEM_CLASS_COUNT_
} lt_mem_class;

LT_API const char *lt_mem_class_name(lt_mem_class c);

typedef struct lt_model_sizes {
    size_t bytes[LT_MEM_CLASS_COUNT_]; /* accounted bytes (lt_alloc_accounted_size) per class */
    size_t total;
    int64_t n_lora_params; /* trainable scalars */
    size_t offload_bytes;  /* offloaded checkpoints (run->offload_ckpt): accounted bytes
                                          in host memory (pinned on a device run), NOT in bytes[]
                                          or total unless the run's device is the host: a CPU
                                          run's offload block counts in bytes[LT_MEM_ACTIVATIONS] */
} lt_model_sizes;

/* Pure: the bytes each class takes for this config, LoRA choice and run shape on run->device
 * (that device's kernel workspaces and allocator rounding; the model's small host bookkeeping is
 * counted in the weights class only on the CPU), equal to what lt_model_load + lt_model_prepare
 * allocate there (the optimizer state is the trainer's). Errors: LT_ERR_INVALID_ARG (bad
 * shapes/options, named; a by-kind recompute policy whose kind the model, or its LoRA layers,
 * has no layer of: "recompute sliding: the model has no sliding-window layers"), LT_ERR_UNSUPPORTED (a layer kind the model cannot run, as
 * lt_model_check_layers; a device this build lacks, a head dim, window or impl the device's
 * kernels do not serve). */
LT_API lt_status lt_model_size_table(lt_ctx *ctx, const lt_model_config *cfg, const lt_lora_options *lora,
                                     const lt_model_run_options *run, lt_model_sizes *out);

typedef struct lt_model_options {
    lt_device device;        /* where weights, LoRA state and activations live: LT_DEVICE_CPU, or
                          LT_DEVICE_CUDA (the build and the machine must have it) */
    lt_dtype quantize_dtype; /* block format f32/bf16/f16 projection weights are quantized to at
                          load (QLoRA): int4_g64, q4_0, q4_1, q8_0, q4_k, q5_k or q6_k;
                          LT_DTYPE_F32 (0) keeps the file's dtypes. A projection whose rows are
                          not whole K-quant super-blocks (C = 576) takes llama.cpp's fallback,
                          named in the log: q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0. Embeddings and
                          the head keep their dtype. LT_DTYPE_FP8: every projection in FP8
                          E4M3 with a scale per row (LT_DTYPE_FP8), from any dtype the file has. */
    unsigned fp8_skip;       /* with quantize_dtype LT_DTYPE_FP8: bit p set (1u << lt_proj) holds
                          projection p as the file holds it */
} lt_model_options;

typedef struct lt_model lt_model;

/* LT_OK when a model can live on dev in this build on this machine. Errors: LT_ERR_UNSUPPORTED
 * saying what is missing (a CUDA backend in the build, or a visible CUDA device),
 * LT_ERR_INVALID_ARG for an unknown device. */
LT_API lt_status lt_model_device_available(lt_ctx *ctx, lt_device dev);

/* Reads only headers (config.json + safetensors headers, or GGUF metadata and tensor infos) and
 * fills cfg as lt_model_load would, without touching weight data: the planner's entry point.
 * `path` is an HF folder, a .safetensors file inside one, or a .gguf file. */
LT_API lt_status lt_model_inspect(lt_ctx *ctx, const char *path, const lt_model_options *opt, lt_model_config *cfg);

/* Loads the model and creates LoRA parameters (A kaiming-uniform(a=sqrt 5) from lora->seed as
 * PEFT, B zero) and their zeroed gradients. Weights are copied into accounted memory on
 * opt->device (the file mappings are closed before return; a device load stages through a
 * bounded host buffer, never a second full copy); llama-arch GGUF Q/K rows are un-permuted to
 * rotate-half. Errors: LT_ERR_IO, LT_ERR_FORMAT (names the tensor/key), LT_ERR_NOT_FOUND (a
 * missing tensor, named), LT_ERR_SHAPE, LT_ERR_UNSUPPORTED (architecture, layer kind, dtype; a CUDA device in
 * a build without CUDA or on a machine without a GPU), LT_ERR_OOM, LT_ERR_CUDA. */
LT_API lt_status lt_model_load(lt_ctx *ctx, const char *path, const lt_model_options *opt, const lt_lora_options *lora,
                               lt_model **out);
LT_API void lt_model_free(lt_ctx *ctx, lt_model *m);

LT_API const lt_model_config *lt_model_get_config(const lt_model *m);
/* Replaces the loaded model's RoPE scaling (lt_model_config_apply_rope) and recomputes its RoPE
 * table; call before lt_model_prepare. Errors: as lt_model_config_apply_rope; LT_ERR_UNSUPPORTED
 * for a GGUF whose RoPE comes as a rope_freqs.weight tensor. */
LT_API lt_status lt_model_set_rope(lt_ctx *ctx, lt_model *m, const lt_rope_override *ov);
LT_API const lt_lora_options *lt_model_get_lora(const lt_model *m); /* with defaults resolved */
LT_API lt_device lt_model_get_device(const lt_model *m);
/* Layer l's description (as lt_model_describe_layer gave it at load); NULL outside [0, L). */
LT_API const lt_layer_desc *lt_model_get_layer(const lt_model *m, int64_t l);
/* Bytes currently held per class (weights/lora/grads always; the rest after lt_model_prepare). */
LT_API lt_model_sizes lt_model_get_sizes(const lt_model *m);

/* Allocates activations, transients and workspaces for this run shape (replacing earlier ones).
 * Every later step with B' <= B, T' <= T runs without allocating. Errors: LT_ERR_INVALID_ARG,
 * LT_ERR_UNSUPPORTED (attention/loss impl cannot serve the shapes, named), LT_ERR_OOM. */
LT_API lt_status lt_model_prepare(lt_ctx *ctx, lt_model *m, const lt_model_run_options *run);

/* LoRA parameters: one contiguous f32 buffer of all A and B matrices (the optimizer's view) and
 * its gradient buffer of the same layout, both n_lora_params long, owned by the model, in the
 * model's device memory (read and write a CUDA model's through lt_model_lora_get/set). */
LT_API float *lt_model_lora_params(lt_model *m, int64_t *n);
LT_API float *lt_model_lora_grads(lt_model *m, int64_t *n);
/* Zeroes the gradient buffer (gradients accumulate across lt_model_forward_backward calls). */
LT_API void lt_model_zero_grads(lt_model *m);
/* Copies n values from element `offset` of the parameters (grads = 0) or gradients (1) into host
 * dst, or host src into the parameters; any device (a memcpy on the CPU). Waits for queued work.
 * Errors: LT_ERR_INVALID_ARG (range outside n_lora_params), LT_ERR_CUDA. */
LT_API lt_status lt_model_lora_get(lt_ctx *ctx, const lt_model *m, int grads, int64_t offset, int64_t n, float *dst);
LT_API lt_status lt_model_lora_set(lt_ctx *ctx, lt_model *m, int64_t offset, int64_t n, const float *src);

/* One LoRA matrix, named as PEFT saves it:
 * "base_model.model.model.layers.<l>.self_attn.q_proj.lora_A.weight" (mlp.* for gate/up/down).
 * Phi-3 has one adapter per fused module as PEFT does: self_attn.qkv_proj (proj LT_PROJ_Q; B is
 * (q + k + v rows, r), k and v share its A) and mlp.gate_up_proj (LT_PROJ_GATE).
 * A is (r, in), B is (out, r); value/grad are views into the buffers above. */
/* Expert stacks (experts = E > 0; proj LT_PROJ_GATE for gate_up, LT_PROJ_DOWN for down), named as
 * PEFT saves its target_parameters: "base_model.model.model.layers.<l>.mlp.experts.lora_A.weight",
 * with ".base_layer" before ".lora_" for gate_up when down is adapted too (PEFT nests the first
 * listed parameter innermost). PEFT's shapes: A (r·E, in), B (out, r·E) with out 2·moe_F (gate
 * rows, then up rows) or C. longtune's storage, per-expert contiguous for the grouped products:
 *   A (E·r, in), expert e's (r, in) at rows [e·r, (e + 1)·r): PEFT's A element for element;
 *   gate_up B: the gate stack (E·moe_F, r) then the up stack (E·moe_F, r), expert e's (moe_F, r) at
 *   rows [e·moe_F, (e + 1)·moe_F) of each; down B: (E·C, r), expert e's (C, r) at rows [e·C, ...).
 * PEFT's B element [o, j·E + e] is expert e's row o (gate_up: o < moe_F in the gate stack, else row
 * o - moe_F of the up stack), column j; lt_lora_tensor_peft_index maps it. value and grad are
 * views of the storage (shape (numel, 1) for an expert B: it is no single matrix). */
typedef struct lt_lora_tensor {
    char name[128];
    int64_t layer;
    lt_proj proj;
    int is_b;
    lt_tensor value, grad;
    int64_t offset;               /* element offset in the flat buffers */
    int64_t experts;              /* 0: a plain matrix, A (r, in), B (out, r); E: an expert stack (above) */
    int64_t peft_rows, peft_cols; /* the shape PEFT saves: (r, in)/(out, r), or (r·E, in)/(out, r·E) */
} lt_lora_tensor;
/* The storage element (0 <= result < numel, relative to t->offset) holding element i of t in PEFT's
 * row-major (peft_rows, peft_cols) order; i itself for a plain matrix and an expert A. Pure. */
LT_API int64_t lt_lora_tensor_peft_index(const lt_lora_tensor *t, int64_t i);
/* The tensors in order, layer by layer: A then B of each adapted projection (projection order),
 * then on an MoE layer A then B of its expert stacks (gate_up, then down), each layer's slice of the
 * flat buffers following the previous one's. */
LT_API int64_t lt_model_lora_count(const lt_model *m);
LT_API lt_status lt_model_lora_tensor(lt_ctx *ctx, const lt_model *m, int64_t i, lt_lora_tensor *out);

/* A batch of packed rows. Rows hold one or more sequences; a token attends only to earlier
 * tokens of its own sequence. */
typedef struct lt_model_batch {
    int64_t B, T;
    const int32_t *tokens;      /* (B, T) in [0, V) */
    const int32_t *targets;     /* (B, T) next-token ids or LT_IGNORE_INDEX */
    const int32_t *positions;   /* (B, T) RoPE positions (restarting per sequence); NULL = 0..T-1 */
    const int32_t *seq_offsets; /* (B, S+1) as lt_attention_params.seq_offsets; NULL = one per row */
    int64_t S;
    uint64_t step;            /* selects the LoRA dropout masks (same step → same masks) */
    int64_t first_row;        /* index of row 0 within the whole batch when this is one rank's
                                   share of it (data parallel): rows draw the dropout masks of
                                   their place in the whole batch; 0 otherwise */
    const int32_t *real_seqs; /* optional (B), with seq_offsets: row b's first real_seqs[b] sequences are
                                 documents, the rest of the row (from seq_offsets[b·(S+1) +
                                 real_seqs[b]]) padding, which the MoE router's load-balancing
                                 statistics leave out as transformers' attention_mask does; NULL =
                                 every token is real */
    int64_t cp_real;          /* context parallel: the whole row's real tokens (its first ones, at
                                 zig-zag places on the ranks; the rest padding, which the MoE
                                 router's statistics leave out as real_seqs does); 0 = every token */
    int defer_loss;           /* device models: leave the loss on the device (the result gets
                                   n_tokens only; lt_model_read_loss reads loss_sum later), so the
                                   call queues the step without waiting -- what a step captured
                                   into a CUDA graph needs */
} lt_model_batch;

typedef struct lt_model_result {
    double loss_sum;  /* Σ token losses over non-ignored targets (nats) */
    int64_t n_tokens; /* non-ignored targets */
    double aux_loss;  /* MoE models with moe_aux_coef > 0: transformers' load-balancing loss of the
                         batch (unweighted; the gradient adds moe_aux_coef times it, scaled by
                         grad_scale · n_tokens: with the default mean loss exactly transformers'
                         loss + router_aux_loss_coef · aux_loss); under context parallel the whole
                         row's, the same on every rank, its gradient scaled by grad_scale times
                         the group's targets; 0 otherwise */
} lt_model_result;

/* Forward + backward: accumulates grad_scale · ∂(Σ token losses)/∂θ into the LoRA gradient
 * buffer. grad_scale 0 means 1/n_tokens of this batch (mean loss). token_loss: optional (B, T)
 * host out, 0 at ignored targets. The batch's arrays are host memory on every device (a device
 * model copies them in once per call and reads only the loss back). Requires lt_model_prepare
 * with a shape covering the batch. Errors:
 * LT_ERR_INVALID_ARG (shapes, token or target out of range, bad offsets; named by index),
 * LT_ERR_UNSUPPORTED / LT_ERR_OOM from attention and loss. */
LT_API lt_status lt_model_forward_backward(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float grad_scale,
                                           lt_model_result *res, float *token_loss);
/* Replaying a captured step: validates b exactly as lt_model_forward_backward does and writes its
 * inputs into the model's pinned staging block (no device work; the captured step's copy reads
 * them), with res->n_tokens set. Only between steps (the previous step's loss has been read).
 * lt_model_read_loss then reads the summed loss the step left on the device into res->loss_sum
 * and an MoE model's aux loss into res->aux_loss (one wait for the queued work). Device models
 * only. Errors: as lt_model_forward_backward; LT_ERR_INVALID_ARG on a host model. */
LT_API lt_status lt_model_stage_batch(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float grad_scale,
                                      lt_model_result *res);
LT_API lt_status lt_model_read_loss(lt_ctx *ctx, lt_model *m, lt_model_result *res);
/* Forward only (evaluation): no dropout, nothing saved. */
LT_API lt_status lt_model_forward(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, lt_model_result *res,
                                  float *token_loss);
/* Context parallel: from now on every step of m is this rank's share of one sequence split over
 * the ranks of comm (lt_cp_zigzag_position: batches of B = 1 row of T/world tokens, no seq_offsets,
 * positions of their places in the whole row), and attention runs over comm as lt_cp_choose picks:
 * Ulysses (all-to-all over heads, the device's own kernel; host over MPI or CUDA over NCCL) when
 * Hkv is a multiple of the world, else ring attention (host only); an MoE router's load-balancing
 * statistics are summed over comm, so its aux loss is the whole row's. Every rank must run the same
 * steps. comm NULL or a world of one turns it off (unless LONGTUNE_CP forces it: lt_cp_env_forced). The Ulysses workspace is allocated with the
 * prepared run (now, if already prepared; freed with it); the ring's blocks per call (both priced
 * by the planner's cp_size). Errors: LT_ERR_UNSUPPORTED (communicator and model on different
 * devices, a CUDA world that does not divide Hkv, a layer with a sliding window or softcap), LT_ERR_OOM. */
LT_API lt_status lt_model_set_context_parallel(lt_ctx *ctx, lt_model *m, struct lt_comm *comm);
/* The lt_cp_kind in use (LT_CP_RING 0, LT_CP_ULYSSES 1), or -1 when context parallel is off. */
LT_API int lt_model_cp_kind(const lt_model *m);

/* Gradient-ready hook: while fn is set, lt_model_forward_backward calls fn(arg, offset, count) right
 * after the backward of each LoRA layer (last layer first) with the range of the flat gradient
 * buffer (lt_model_lora_grads) that layer owns (an MoE layer's with its expert adapters, so the
 * ranges may differ in size), whose values are then final for this call, so a
 * data-parallel trainer can start reducing them while earlier layers run their backward. A failing
 * fn fails the call with its status. NULL turns it off. */
typedef lt_status (*lt_model_grad_ready_fn)(void *arg, int64_t offset, int64_t count);
LT_API void lt_model_set_grad_ready(lt_model *m, lt_model_grad_ready_fn fn, void *arg);

/* Full logits (B*T, V) f32 into `logits` (caller's host buffer), for tests; targets may be NULL.
 * A device model allocates a (rows, V) device buffer for the call (not a training path). */
LT_API lt_status lt_model_logits(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits);
/* Logits (B, V) of the last position of each row only, recomputing the whole prefix (generation
 * runs over the KV cache of kv_cache.h instead). */
LT_API lt_status lt_model_logits_last(lt_ctx *ctx, lt_model *m, const lt_model_batch *b, float *logits);

#ifdef __cplusplus
}
#endif
#endif
