/* The memory planner: "will this run fit?" answered before a single weight is read. It adds up the
 * same size tables the model (lt_model_size_table) and the trainer allocate from, each entry
 * rounded exactly as the accounting allocator rounds it, so the plan and the allocator's measured
 * high-water can be compared byte for byte. It does not measure anything and never allocates
 * tensors; a fitted or calibrated formula has no place here. */
#ifndef LONGTUNE_PLAN_H
#define LONGTUNE_PLAN_H

#include "export.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Lifetime classes of a training run's memory on the run's device. The first six are the model's
 * (lt_mem_class, same order); the optimizer state and step inputs are the trainer's. */
typedef enum lt_plan_class {
    LT_PLAN_WEIGHTS = 0, /* frozen base weights, quantized ones at their block size */
    LT_PLAN_LORA,        /* LoRA A and B, f32 */
    LT_PLAN_GRADS,       /* LoRA gradients, f32 */
    LT_PLAN_ACTIVATIONS, /* saved across layers for the backward (checkpoints or full stores) */
    LT_PLAN_TRANSIENTS,  /* one recompute segment's per-layer stores and the step's buffers */
    LT_PLAN_WORKSPACE,   /* dequantization tiles, attention and loss workspaces, scratch */
    LT_PLAN_OPTIMIZER,   /* AdamW first and second moments, f32, one block each */
    LT_PLAN_HELD,        /* what the caller holds through the run besides the model: tokenizer,
                             tokenized data set, the trainer's buffers (lt_plan_options.held_bytes) */
    LT_PLAN_CLASS_COUNT_
} lt_plan_class;

/* "frozen_weights", "lora_params", "lora_grads", "activations", "transients", "workspace",
 * "optimizer_state", "held" (the keys of the JSON form). */
LT_API const char *lt_plan_class_name(lt_plan_class c);

/* Zero-initialised = defaults (the model's and the trainer's). */
typedef struct lt_plan_options {
    lt_device device;         /* CPU or CUDA: where the classes above live */
    lt_lora_options lora;     /* rank, targets, layers */
    lt_model_run_options run; /* B, T (a packed row's length), recompute policy, attention and
                                  loss impls, threads */
    size_t held_bytes;        /* accounted bytes the caller holds on `device` through the run
                                  besides the model and optimizer (a CPU training run: tokenizer,
                                  data set, packing plans and the trainer's buffers, which
                                  lt_train_plan adds up) */
    /* Several ranks: the plan is then one rank's memory. run.B and run.T stay the whole step's. */
    int64_t dp_size;          /* data-parallel ranks sharing each batch's rows: a rank holds
                                  ceil(B / dp_size) rows [0 = 1] */
    int64_t cp_size;          /* context-parallel ranks sharing each row (zig-zag split): a rank
                                  holds T' / cp_size tokens of a row padded to T', the next multiple
                                  of 2·cp_size, plus in the workspace class the attention's buffers
                                  of the kind lt_cp_choose picks: Ulysses' workspace
                                  (lt_cp_ulysses_workspace_bytes) or one ring attention call's
                                  blocks (lt_cp_attention_workspace_bytes, backward) [0 = 1] */
    size_t host_budget_bytes; /* lt_plan_search_max only: with run.offload_ckpt, a value whose
                                  offloaded checkpoints (lt_plan.offload_bytes) exceed this many
                                  host bytes does not fit either; 0 = host not checked */
} lt_plan_options;

typedef struct lt_plan {
    size_t bytes[LT_PLAN_CLASS_COUNT_]; /* accounted bytes per class on `device` */
    size_t peak_bytes;                  /* Σ bytes: every class is allocated once and lives
                                           through the step, so the sum is the high-water
                                           (lt_train_plan: or the data loading's, when larger) */
    int64_t n_lora_params;              /* trainable scalars */
    size_t offload_bytes;               /* run.offload_ckpt: the checkpoints kept in host memory
                                           (page-locked on CUDA), accounted as the host allocator
                                           rounds; on a CPU plan also inside the activations class
                                           and peak_bytes (the host is the device), on a device
                                           plan in neither: check it against host memory */
    lt_device device;
    lt_plan_options options; /* with the defaults resolved (rank, impls, ...) */
} lt_plan;

/* Pure: the plan for training `cfg` with `opt`. Nothing is read from disk and nothing is allocated.
 * Errors: LT_ERR_INVALID_ARG (shapes, rank, batch or length out of range; named),
 * LT_ERR_UNSUPPORTED (a combination the model cannot run, named), LT_ERR_OOM when a size overflows
 * size_t (the run could never be allocated). */
LT_API lt_status lt_plan_compute(lt_ctx *ctx, const lt_model_config *cfg, const lt_plan_options *opt, lt_plan *out);

/* Bytes of the trainer's AdamW state for n trainable scalars on dev: two f32 blocks of n, each
 * rounded as the allocator rounds it. The trainer allocates exactly this. */
LT_API size_t lt_plan_optimizer_bytes(lt_device dev, int64_t n_params);

typedef enum lt_plan_search {
    LT_PLAN_SEARCH_SEQ = 0, /* largest T with B fixed */
    LT_PLAN_SEARCH_BATCH,   /* largest B with T fixed */
} lt_plan_search;

/* Largest value in [1, hi] of T (or B) whose plan's peak is <= budget_bytes (and, when
 * opt->host_budget_bytes is set, whose offload_bytes are <= it), by bisection (every class is
 * non-decreasing in B and T), checked at the answer and one past it. *found = 0 and
 * *out = 0 when even 1 does not fit. Errors: those of lt_plan_compute at 1 (other values that
 * fail to plan count as not fitting). */
LT_API lt_status lt_plan_search_max(lt_ctx *ctx, const lt_model_config *cfg, const lt_plan_options *opt,
                                    lt_plan_search what, int64_t hi, size_t budget_bytes, int64_t *out, int *found);

/* Writes the plan as one JSON object into buf (NUL-terminated):
 *   {"device", "batch", "seq_len", "lora_rank", "recompute", "attention", "loss",
 *    "n_lora_params", "dp_size", "cp_size", "classes": {<class name>: bytes, ...}, "peak_bytes",
 *    "offload_checkpoints": bool, "host_offload_bytes"}
 * Errors: LT_ERR_INVALID_ARG when buf is too small (n < 1024 always is). */
LT_API lt_status lt_plan_to_json(lt_ctx *ctx, const lt_plan *p, char *buf, size_t n);

/* Text names of the options, for messages and the JSON form ("none", "all", "every:2", "sliding",
 * "global:2"; "flash", "naive"; "fused", "chunked", "naive"; "cpu", "cuda"). */
LT_API const char *lt_plan_attention_name(lt_attention_impl a);
LT_API const char *lt_plan_loss_name(lt_lce_impl l);
/* Writes the policy name into buf of n bytes and returns buf. */
LT_API const char *lt_plan_recompute_name(lt_recompute r, int64_t k, char *buf, size_t n);
/* Parses "none", "all" (alias "every"), "every:K", "sliding", "sliding:K", "global", "global:K"
 * (K >= 1: layers per segment). LT_ERR_INVALID_ARG names the text. */
LT_API lt_status lt_plan_recompute_parse(lt_ctx *ctx, const char *s, lt_recompute *r, int64_t *k);

#ifdef __cplusplus
}
#endif
#endif
