/* The LoRA/QLoRA trainer: run options (mirroring mlx-lm's `lora` flags, plus a JSON config form),
 * the learning-rate schedule, checkpoints that resume a run bit for bit on CPU, PEFT adapter
 * export, the metrics log, and the stop request that SIGINT/SIGTERM handlers raise.
 * It does not parse argv (cli/ does, through lt_train_options_set) and never exits the process: a
 * stopped run saves a checkpoint and returns LT_ERR_INTERRUPTED. */
#ifndef LONGTUNE_TRAIN_H
#define LONGTUNE_TRAIN_H

#include <stdio.h>
#include "export.h"
#include "attention.h"
#include "comm.h"
#include "lce.h"
#include "model.h"
#include "pack.h"
#include "plan.h"
#include "status.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_TRAIN_PATH_MAX 1024
#define LT_TRAIN_NAME_MAX 160
#define LT_TRAIN_MAX_STAGES 16 /* stages of a sequence-length curriculum */
/* The record a diverged run leaves in its adapter folder (see lt_train_fit). */
#define LT_TRAIN_DIVERGED_FILE "diverged.json"

typedef enum lt_lr_schedule {
    LT_LR_SCHEDULE_CONSTANT = 0, /* lr after warmup */
    LT_LR_SCHEDULE_COSINE,       /* lr → min_lr along half a cosine over the steps after warmup */
} lt_lr_schedule;

/* Every option of a run. Zero-initialised = defaults: lt_train_options_resolve fills each zero
 * field that was not given (see `given`) with the default in brackets and validates the result. Flag names are the field names
 * with '-' for '_' ("--learning-rate"); the config file uses the same keys (either spelling). */
typedef struct lt_train_options {
    char model[LT_TRAIN_PATH_MAX];               /* HF folder or .gguf file (required) */
    char data[LT_TRAIN_PATH_MAX];                /* folder with train.jsonl [+ valid.jsonl] (required) */
    char adapter_path[LT_TRAIN_PATH_MAX];        /* output folder ["adapters"] */
    char resume_adapter_file[LT_TRAIN_PATH_MAX]; /* checkpoint (or the adapter folder holding it) to
                                                    resume from ["" = fresh run] */
    int64_t iters;                               /* optimizer steps [1000] */
    int64_t batch_size;                          /* rows per micro-batch [4] */
    int64_t max_seq_length;                      /* tokens per row; longer examples are truncated [2048] */
    char seq_len_curriculum[256];                /* "0:2048,0.3:8192,0.7:32768": from the fraction p of iters
                                      on, rows hold the stage's tokens (a staircase; p strictly
                                      rising from 0, lengths non-decreasing). max_seq_length is the
                                      last stage's; each stage change starts a new pass over the
                                      training set packed at the new length ["" = off] */
    int n_stages;                                /* resolved curriculum: stage k from step stage_step[k] on */
    int64_t stage_step[LT_TRAIN_MAX_STAGES];     /* with rows of stage_len[k] tokens */
    int64_t stage_len[LT_TRAIN_MAX_STAGES];      /* (both filled by lt_train_options_resolve) */
    double learning_rate;                        /* peak lr [1e-5] */
    double min_lr;                               /* cosine floor [0] */
    int64_t num_layers;                          /* LoRA on the last K layers [0 or -1 = all] */
    int mask_prompt;                             /* loss only on completion/assistant tokens */
    int grad_checkpoint;                         /* shorthand for recompute = all */
    int64_t save_every;                          /* checkpoint + adapter every N steps [100] */
    int64_t steps_per_eval;                      /* validation every N steps [200] */
    int64_t steps_per_report;                    /* metrics line every N steps [10] */
    int64_t val_batches;                         /* batches per validation [25]; -1 = the whole set */
    uint64_t seed;                               /* init, dropout and shuffling [0] */
    int64_t lora_rank;                           /* r [8] */
    double lora_alpha;                           /* scale = alpha / r [16] */
    double lora_dropout;                         /* dropout on the LoRA input, in [0, 1) [0] */
    char lora_targets[256];                      /* comma list of projections [q_proj,k_proj,v_proj,o_proj,
                                      gate_proj,up_proj,down_proj]; short forms q,k,v,o,gate,up,down */
    lt_lr_schedule lr_schedule;                  /* [constant] */
    int64_t warmup;                              /* linear warmup steps [0] */
    double weight_decay;                         /* AdamW decoupled decay [0] */
    double beta1, beta2, eps;                    /* [0.9, 0.999, 1e-8] */
    int64_t grad_accum;                          /* micro-batches per optimizer step [1] */
    double grad_clip;                            /* global L2 norm clip, 0 = off [0] */
    lt_recompute recompute;                      /* none | all (LT_RECOMPUTE_EVERY: every layer) | every:K
                                      (LT_RECOMPUTE_EVERY_K) | sliding[:K] | global[:K] (the
                                      sliding-window or the full-attention layers only)
                                      [none, or all with grad_checkpoint] */
    int64_t recompute_every;                     /* K of "every:K", "sliding:K", "global:K" */
    int recompute_auto;                          /* "auto": the least recompute whose plan fits the memory
                                      budget, chosen by lt_train_choose_recompute before the run
                                      (`longtune train` uses the memory guard's ceiling) [0] */
    int recompute_attention;                     /* under a recompute policy, rerun each layer's attention in
                                      the backward instead of keeping its output, lse (and, on the
                                      CPU, q/k/v and the mid-layer residual): less memory, more time;
                                      lt_model_run_options.recompute_attention [0] */
    int64_t recompute_attention_layers;          /* without recompute_attention: rerun the attention of this
                                      many recomputed layers only (of those below the last segment,
                                      which needs neither), sliding-window ones first (between
                                      the two settings' memory and time; recompute auto chooses it
                                      itself); lt_model_run_options.recompute_attention_layers [0] */
    int offload_checkpoints;                     /* keep the checkpoints in pinned host memory (a device run;
                                      needs a recompute policy): lt_model_run_options.offload_ckpt
                                      [0] */
    int64_t moe_chunk_tokens;                    /* MoE models: tokens whose experts run together (the dispatch
                                      chunk, recomputed in the backward): lt_model_run_options
                                      .moe_chunk_tokens [LT_MODEL_MOE_CHUNK_TOKENS] */
    int64_t chunk_rows;                          /* rows per chunk of the position-wise work (norms, projections,
                                      MLP): lt_model_run_options.chunk_rows; smaller chunks hold less
                                      and launch more [0: LT_MODEL_CHUNK_ROWS, or what recompute
                                      auto chooses] */
    int bf16_products;                           /* products of bf16, f16 and quantized weights on x and W rounded
                                      to bf16, and attention's tiles on bf16 operands, as CUDA runs
                                      them: lt_model_run_options.bf16_products (the CPU runs them
                                      through oneDNN and on AMX where it has it) [0] */
    lt_attention_impl attention;                 /* [flash] */
    lt_lce_impl loss;                            /* [fused] */
    int no_pack;                                 /* one example per row instead of packing */
    char pack_algorithm[32];                     /* packing algorithm name, passed to the data module ["" = its
                                      default] */
    char quantize[16];                           /* quantize a dense base at load: "int4_g64" | "q4_1" | ... */
    char base_dtype[8];                          /* "fp8": every projection of the base held in FP8 E4M3 with
                                      per-row scales, its products FP8 GEMMs with activations
                                      scaled per row (faster, not smaller than bf16); "file" or
                                      "": as the file holds it (or --quantize) */
    char fp8_skip[64];                           /* with base_dtype "fp8": comma list of projections held as
                                      the file holds them, their products unchanged (q,k,v,o,
                                      gate,up,down or *_proj) [""] */
    int threads;                                 /* CPU threads [0 = all] */
    lt_device device;                            /* cpu | cuda: where the model, LoRA state and optimizer live
                                      [cpu]; cuda in a build or on a machine without one is
                                      LT_ERR_UNSUPPORTED from the run */
    char distributed[8];                         /* "auto": data parallel over the world an MPI launcher started
                                      (mpirun -np K; MPI for a CPU model, NCCL for a CUDA one), one
                                      process otherwise; "nccl": an NCCL world even without MPI
                                      (RANK/WORLD_SIZE + LONGTUNE_RENDEZVOUS, or a world of one);
                                      "off": one process whatever the launcher ["auto"]. Read by the
                                      caller that makes the communicator (lt_train_result.comm) */
    int context_parallel;                        /* with a world of K > 1 ranks: context parallel instead of data
                                      parallel -- every row is split over the K ranks (zig-zag) and
                                      attention is ring attention. Needs batch_size 1, no_pack and
                                      max_seq_length a multiple of 2K; dropout masks then follow each
                                      rank's local token index (not those of one process) */
    char cuda_graph[8];                          /* "on" | "off": on a CUDA model, capture the whole step (forward,
                                      loss, backward, clipping, AdamW) into a CUDA graph once the
                                      batch shape has been seen twice and replay it while it stays
                                      the same; any other run, a shape change, or a step that
                                      cannot be captured runs eagerly (the log says why, once).
                                      Results are bit-identical either way ["on"] */
    /* RoPE scaling to extend the model's context (replaces the model's own; lt_rope_override):
     * --rope-scaling linear|dynamic|yarn|llama3|longrope with --rope-factor F (required),
     * --original-max-position N [the model's max_position_embeddings], --yarn-beta-fast X,
     * --yarn-beta-slow Y [32, 1], --rope-attn-factor A [the type's default] */
    lt_rope_scaling rope_scaling;
    double rope_factor;
    int64_t original_max_position;
    double yarn_beta_fast, yarn_beta_slow, rope_attn_factor;
    char chat_template[LT_TRAIN_PATH_MAX]; /* a chat format name (chatml, llama3, ...) or a file
                                              holding a Jinja template, recognised as one of
                                              them ["" = the tokenizer's own template] */
    int test;                              /* after training, evaluate the data folder's test.jsonl (as
                                      mlx-lm's --test): lt_train_result.test_loss [0] */
    int64_t test_batches;                  /* batches of that evaluation [500]; -1 = the whole set */
    uint64_t given;                        /* bit i: the i-th option was given through lt_train_options_set
                                      (flags, config file), so lt_train_options_resolve honours or
                                      refuses a given 0 instead of defaulting it [0: none given] */
    char memory_ceiling[32];               /* the memory guard's options, so a --config file can hold
                                              them: `longtune train` guards the run (a flag wins over
                                              the file); the library itself runs no guard ["" = the
                                              rule] */
    int allow_low_memory, no_memory_guard; /* likewise [0] */
    int overwrite;                         /* lt_train_run: a fresh run (no resume_adapter_file) into an
                                      adapter_path that holds adapter_model.safetensors is refused
                                      unless set [0] */
} lt_train_options;

/* Kind of an option key, so argv parsing knows whether a value follows. Key: a flag name without
 * the leading dashes, '-' or '_' ("learning-rate"). */
typedef enum lt_train_option_kind {
    LT_TRAIN_OPTION_UNKNOWN = 0,
    LT_TRAIN_OPTION_BOOL,  /* a bare flag sets it; "true"/"false"/"1"/"0" as a value */
    LT_TRAIN_OPTION_VALUE, /* takes one value */
} lt_train_option_kind;
LT_API lt_train_option_kind lt_train_option_kind_of(const char *key);

/* Sets one option from its text form. Errors: LT_ERR_NOT_FOUND for an unknown key,
 * LT_ERR_INVALID_ARG for a value that does not parse or is out of range (message names both). */
LT_API lt_status lt_train_options_set(lt_ctx *ctx, lt_train_options *opt, const char *key, const char *value);

/* Applies a JSON config file (an object of option keys; values are numbers, strings, booleans, or
 * for lora_targets an array of strings). Keys already set by later flags win because the CLI
 * applies the file first. Errors: LT_ERR_IO, LT_ERR_FORMAT (bad JSON, names path and the key),
 * LT_ERR_NOT_FOUND (unknown key), LT_ERR_INVALID_ARG. */
LT_API lt_status lt_train_options_load_json(lt_ctx *ctx, lt_train_options *opt, const char *path);

/* Copies `in` to `out` with defaults filled in and validates ranges and combinations.
 * LT_ERR_INVALID_ARG names the offending option. */
LT_API lt_status lt_train_options_resolve(lt_ctx *ctx, const lt_train_options *in, lt_train_options *out);

/* The model options a run loads its base with: the device, quantize_dtype (LT_DTYPE_FP8 for
 * base_dtype "fp8", the quantize format when one is set, else LT_DTYPE_F32: the file's dtypes) and
 * fp8_skip (fp8_skip's projections). Errors: LT_ERR_INVALID_ARG for a quantize that names no
 * dtype, a base_dtype other than "", "file" and "fp8", or an fp8_skip entry that names no
 * projection. */
LT_API lt_status lt_train_model_options(lt_ctx *ctx, const lt_train_options *opt, lt_model_options *out);

/* Learning rate of optimizer step `step` (0-based) of a resolved run: linear warmup from
 * lr/warmup to lr over the first `warmup` steps, then constant or cosine from lr to min_lr over
 * the remaining iters - warmup steps (reaching min_lr one step after the last). */
LT_API double lt_train_lr(const lt_train_options *opt, int64_t step);

/* Tokens per row at optimizer step `step` (0-based) of a resolved run: the curriculum stage's
 * length, or max_seq_length without a curriculum. */
LT_API int64_t lt_train_seq_len_at(const lt_train_options *opt, int64_t step);

/* One trainable tensor as the trainer, checkpoints and adapter export see it: host f32, row-major,
 * contiguous. `name` is the module path without the PEFT prefix, e.g.
 * "model.layers.3.self_attn.q_proj.lora_A" (A: (r, in)) or "...lora_B" (B: (out, r)).
 * m and v are the AdamW moments (same shape); grad may be NULL where not needed. Not owned. */
typedef struct lt_train_param {
    char name[LT_TRAIN_NAME_MAX];
    int ndim;
    int64_t shape[2];
    float *data;
    float *grad;
    float *m;
    float *v;
} lt_train_param;

LT_API int64_t lt_train_param_numel(const lt_train_param *p);

/* Everything besides the tensors that a bit-exact resume needs. */
typedef struct lt_train_state {
    int64_t step;        /* optimizer steps completed */
    uint64_t rng[4];     /* the random streams' keys: {seed, next dropout micro-step, shuffle
                              epoch, 0}. Dropout masks and shuffles are pure functions of these
                              counters (no sequential generator), so they are the whole RNG state */
    int64_t data_epoch;  /* pass over the training set */
    int64_t data_cursor; /* next batch within the epoch's order */
    int64_t tokens_seen; /* trained (non-masked) tokens so far */
    double elapsed_s;    /* training wall time so far (informational) */
} lt_train_state;

/* Writes a checkpoint (state, the run options that must match on resume, every param's data, m
 * and v, and a checksum over all of it) to `path` atomically: temp file in the same folder, fsync,
 * rename. Errors: LT_ERR_IO (names the path), LT_ERR_INVALID_ARG for a param without m/v. */
LT_API lt_status lt_checkpoint_save(lt_ctx *ctx, const char *path, const lt_train_options *opt,
                                    const lt_train_state *st, const lt_train_param *params, int n_params);

/* Reads a checkpoint into `st` and the params' data, m and v (which must be allocated with the
 * shapes they will be checked against). Validates everything before writing anything: magic,
 * version, size, checksum (LT_ERR_FORMAT: truncated or corrupted, names the path and what), the
 * run options that change the trajectory (LT_ERR_INVALID_ARG names the option and both values),
 * and the param set (LT_ERR_INVALID_ARG names a missing, extra or mis-shaped tensor). */
LT_API lt_status lt_checkpoint_load(lt_ctx *ctx, const char *path, const lt_train_options *opt, lt_train_state *st,
                                    lt_train_param *params, int n_params);

/* Saves a PEFT LoRA adapter into folder `dir` (created if absent): adapter_config.json and
 * adapter_model.safetensors with keys "base_model.model.<name>.weight" in f32, each written
 * atomically. base_model names the base in the config (a path or hub id). target_modules and
 * layers_to_transform are derived from the param names. Errors: LT_ERR_IO, LT_ERR_INVALID_ARG for a
 * name that is not "<module>.lora_A|lora_B" or a shape that does not agree with the rank. */
/* base_model_name_or_path for `base`: for a .gguf file the Hugging Face repository it says it was
 * converted from ("org/name", from general.source.repo_url, general.source.url, general.repo_url
 * or general.url on huggingface.co), written into buf (n bytes); else base itself. lt_peft_save
 * applies it. */
LT_API const char *lt_peft_base_model_name(lt_ctx *ctx, const char *base, char *buf, size_t n);
LT_API lt_status lt_peft_save(lt_ctx *ctx, const char *dir, const char *base_model, const lt_train_options *opt,
                              const lt_train_param *params, int n_params);

/* Reads a PEFT LoRA folder's adapter_config.json into the model's LoRA options for a base of L
 * layers (r, lora_alpha, target_modules; layers_to_transform must be the last K layers or null).
 * Errors: LT_ERR_IO, LT_ERR_FORMAT (names the key), LT_ERR_UNSUPPORTED (DoRA, rsLoRA, other
 * modules or layer sets, named). */
LT_API lt_status lt_peft_read_config(lt_ctx *ctx, const char *dir, int64_t L, lt_lora_options *out);
/* Copies adapter_model.safetensors of `dir` (F32/BF16/F16) into the LoRA tensors of m, which must
 * have been loaded with lt_peft_read_config's options. A value that is not finite is refused before
 * the tensor reaches the model (the one check of a loaded adapter's values). Errors:
 * LT_ERR_NOT_FOUND (a tensor, named), LT_ERR_SHAPE, LT_ERR_FORMAT (also a non-finite element: the
 * file, tensor, index and nan/inf) and those of the safetensors reader. */
LT_API lt_status lt_peft_load(lt_ctx *ctx, const char *dir, lt_model *m);

/* One metrics record; NAN (or a negative value for the byte counts) leaves a field out, except a
 * measured train_loss (train_loss_measured = 1): a non-finite one is written as
 * "train_loss":null with "train_loss_non_finite":"nan" | "inf" | "-inf". */
typedef struct lt_metrics_record {
    int64_t step;
    double train_loss;
    double val_loss;
    double learning_rate;
    double tokens_per_s; /* real (non-padding) input tokens per second over the report window */
    int64_t tokens;      /* trained (supervised target) tokens so far */
    double elapsed_s;
    int64_t peak_bytes;      /* accounting allocator high-water on the run's device */
    int64_t plan_bytes;      /* what the planner predicted for the run (same device) */
    int64_t host_peak_bytes; /* device runs: the host high-water besides; 0 (left out) on CPU */
    int64_t seq_len;         /* a curriculum's row length at this step (and stage, 1-based);
                                0 (left out) without a curriculum */
    int stage;
    int train_loss_measured; /* train_loss is this window's measured loss, finite or not */
    double aux_loss;         /* MoE models with the router's load-balancing loss: the window's mean
                                aux loss (unweighted, beside the cross entropy train_loss); written
                                when > 0, 0 leaves it out */
} lt_metrics_record;

typedef struct lt_metrics lt_metrics;

/* Opens `path` (JSON lines) for appending. keep_until_step >= 0 (a resume) first rewrites the file
 * atomically without the records after that step, so the log matches the resumed trajectory; < 0
 * starts a new file. Errors: LT_ERR_IO, LT_ERR_OOM. */
LT_API lt_status lt_metrics_open(lt_ctx *ctx, const char *path, int64_t keep_until_step, lt_metrics **out);
/* Appends one line and flushes it. Errors: LT_ERR_IO. */
LT_API lt_status lt_metrics_write(lt_ctx *ctx, lt_metrics *m, const lt_metrics_record *r);
LT_API void lt_metrics_close(lt_ctx *ctx, lt_metrics *m);

/* The model's LoRA choice for a resolved run (targets, last-K layers, rank, alpha, dropout, seed). */
LT_API lt_status lt_train_lora_options(lt_ctx *ctx, const lt_train_options *opt, lt_lora_options *out);
/* The RoPE override the rope options ask for (scaling NONE when none). */
LT_API lt_rope_override lt_train_rope_override(const lt_train_options *opt);

/* ---- The plan of a training run: one function (lt_train_plan) for `longtune plan`, the memory
 * guard and the trainer, so the three agree for the same options. ---- */

/* What a run holds on its device besides the model, the optimizer state and the trainer's own
 * buffers (which lt_train_plan adds). */
typedef struct lt_train_held {
    size_t caller_bytes;       /* held by the caller through the run: the tokenizer and tokenized
                                  splits (lt_train_run loads them), the CLI's memory guard */
    size_t packing_peak_bytes; /* the packing plans' high-water: the validation plan and the first
                                  epoch's training plan, built one after the other */
    size_t packing_held_bytes; /* the two packing plans once built */
    size_t load_peak_bytes;    /* the high-water while the tokenizer and the splits are read (the
                                  readers' buffers and caches included), before the model loads:
                                  the run's peak when its step holds less (a tiny model) */
} lt_train_held;

/* The planner's options for a resolved run on one of dp_size data-parallel or cp_size
 * context-parallel ranks (1 each for one process). The caller may refine what the run options
 * leave to defaults (saved dtype, chunk rows) before lt_train_plan. */
LT_API lt_status lt_train_plan_options(lt_ctx *ctx, const lt_train_options *opt, int64_t dp_size, int64_t cp_size,
                                       lt_plan_options *out);

/* The plan of the run: lt_plan_compute of popt with, on a CPU run, the held class made of
 * held->caller_bytes, the trainer's buffers (lt_train_buffer_bytes), its metrics log, and the
 * larger of the packing plans' high-water and the packing plans plus the adapter export's index
 * (the save at the end) -- or, resuming, the checkpoint file read when that is larger -- at
 * popt's B and T, and a peak that is the larger of the classes' sum and held->load_peak_bytes
 * (the data loading's high-water, before any class is allocated); on a device run
 * held->caller_bytes alone (the rest is host memory).
 * held may be NULL (nothing measured: no data). Errors: those of lt_plan_compute. */
LT_API lt_status lt_train_plan(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                               const lt_plan_options *popt, const lt_train_held *held, lt_plan *out);

/* recompute auto: the cheapest candidate by estimated cost whose plan (lt_train_plan with `held`)
 * is <= budget_bytes. The candidates: none; the LoRA layers' full-attention ones (global),
 * their sliding-window ones (sliding; both only where the LoRA layers mix the two kinds), every
 * layer -- each keeping the attention outputs, over segments of k = 1, 2, 4, ... layers below its
 * longest run of recomputed layers (the same work with fewer checkpoints); then the same rerunning
 * attention (recompute_attention). Their work is the recomputed layers' projection FLOPs plus,
 * rerunning attention, each one's attention FLOPs (a sliding layer's over its window); equal work
 * keeps that order. Unless opt->chunk_rows is set, each also runs at halved chunks of the
 * position-wise work (fewer than B·T rows, at least 1,024), which hold less and launch more. The
 * cost of a candidate: its recompute work over the step's own (the frozen projections' forward and
 * input gradient, attention's forward and backward, the head), plus 0.08·log2(k) for segments
 * of k layers and 0.03·(c0/c - 1) for a chunk of c rows against the run's c0 (both measured on
 * the H200). A candidate that keeps attention and does not fit also offers attention rerun in as
 * few of its recomputed layers as fit (recompute_attention_layers, bisected: the memory falls as
 * the count grows), at its cost plus those layers' attention work; where a candidate rerunning it
 * in every recomputed layer is the first to fit, the same count is taken. *out = opt with the chosen policy (and chunk_rows) and
 * recompute_auto cleared; plan (may be NULL) its plan. opt without recompute_auto is copied as is. Errors: LT_ERR_OOM when no candidate
 * fits (the message names the smallest plan and the budget), those of lt_train_plan. */
LT_API lt_status lt_train_choose_recompute(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                                           const lt_plan_options *popt, const lt_train_held *held, size_t budget_bytes,
                                           lt_train_options *out, lt_plan *plan);

/* Host bytes of the trainer's buffers allocated before its first step: the LoRA tensor index
 * (n_lora_tensors entries), one batch of B rows of T tokens (ids, targets, positions, offsets and
 * piece counts), the step's loss sums (opt->grad_accum), and with cp_size > 1 this rank's share
 * of the row. */
LT_API size_t lt_train_buffer_bytes(const lt_train_options *opt, int64_t B, int64_t T, int64_t n_lora_tensors,
                                    int64_t cp_size);

/* lt_plan_search_max through lt_train_plan: the largest T (or B) in [1, hi] whose plan fits
 * budget_bytes (and popt->host_budget_bytes when set), the trainer's buffers following the shape
 * and `held` (measured at the given shape) staying; with opt->recompute_auto a length fits when one
 * of lt_train_choose_recompute's candidates does there (the policy may differ along the search).
 * Errors: those of lt_train_plan at 1. */
LT_API lt_status lt_train_plan_search(lt_ctx *ctx, const lt_train_options *opt, const lt_model_config *cfg,
                                      const lt_plan_options *popt, const lt_train_held *held, lt_plan_search what,
                                      int64_t hi, size_t budget_bytes, int64_t *out, int *found);

/* The packing options the trainer packs opt's data with (cp_size > 1: context parallel rows). */
LT_API lt_status lt_train_pack_options(lt_ctx *ctx, const lt_train_options *opt, int64_t cp_size, lt_pack_options *out);

/* Builds the validation plan (valid may be NULL) and the first epoch's training plan in a scratch
 * context and sets held->packing_peak_bytes and packing_held_bytes from its accounting; with a
 * curriculum (opt->n_stages), the training plan of each stage's length in turn, each freed before
 * the next as the trainer does, and the largest of them. */
LT_API lt_status lt_train_packing_bytes(lt_ctx *ctx, const lt_train_options *opt, const lt_pack_options *popt,
                                        const lt_pack_input *train, const lt_pack_input *valid, lt_train_held *held);

/* Loads opt's tokenizer and data folder as lt_train_run does, in a scratch context, and fills
 * *held: caller_bytes with what they hold (no guard) and the packing bytes of their plans. */
LT_API lt_status lt_train_measure_data(lt_ctx *ctx, const lt_train_options *opt, int64_t cp_size, lt_train_held *held);

/* What a run did. step_loss, when the caller sets it, receives the training loss (token mean over
 * the step's micro-batches) of every step run by this call, indexed by step (iters entries). */
typedef struct lt_train_result {
    int64_t steps;         /* optimizer steps completed, resumed ones included */
    int64_t start_step;    /* the step this call started from (0, or the checkpoint's) */
    double first_val_loss; /* the first validation of this call (NAN when none) */
    double last_val_loss;
    double last_train_loss;
    double test_loss;       /* opt->test: mean token loss over the test split (NAN otherwise) */
    int64_t test_tokens;    /* its scored tokens */
    int64_t tokens;         /* trained tokens, resumed ones included */
    double elapsed_s;       /* this call's wall time */
    size_t peak_bytes;      /* high-water of the accounting allocator on the run's device */
    size_t plan_bytes;      /* lt_plan_compute for the run on that device, held bytes included */
    size_t host_peak_bytes; /* host high-water (the same as peak_bytes on a CPU run) */
    double *step_loss;      /* optional, caller-owned (iters) */
    int64_t stop_at;        /* optional input: act as if a stop were requested once this step
                                 is done (checkpoint, LT_ERR_INTERRUPTED); 0 = never */
    struct lt_comm *comm;   /* optional input: data parallel over this host (MPI) world. Every
                                 rank calls lt_train_fit/lt_train_run with the same options and
                                 data; each trains its share of every micro-batch's rows, LoRA
                                 gradients are summed over ranks before clipping and AdamW, and
                                 only rank 0 writes checkpoints, metrics and the adapter. NULL or
                                 a world of one = a single process */
    int64_t start_tokens;   /* trained tokens of the checkpoint this call resumed from (0 fresh):
                                 this call trained tokens - start_tokens */
} lt_train_result;

/* Trains the LoRA parameters of a loaded model on tokenised sequences (train, and valid for
 * evaluation; valid may be NULL or empty). `opt` must be resolved. Packs rows of max_seq_length
 * tokens (first-fit; one sequence per row with no_pack), accumulates grad_accum micro-batches per
 * step, clips, applies AdamW through the backend op, evaluates every steps_per_eval steps (and
 * before the first and after the last), writes metrics, checkpoints and the PEFT adapter into
 * adapter_path every save_every steps and at the end, and resumes from resume_adapter_file.
 * A stop request (lt_train_request_stop) saves a checkpoint and returns LT_ERR_INTERRUPTED.
 * A non-finite loss or gradient norm stops the run with LT_ERR_DIVERGED (the message names the
 * step and the quantity): nothing more is saved, so the last good checkpoint and adapter stay,
 * the step's metrics line holds "train_loss":null with its flag, and adapter_path gets
 * LT_TRAIN_DIVERGED_FILE (status, step, quantity, value, last_good_step, checkpoint); a save
 * whose parameters are not finite is refused the same way. The next successful save removes an
 * earlier record. progress: where the progress display goes (NULL = stderr). Errors: those of the model, packing,
 * checkpoint and file writers, all with messages. */
LT_API lt_status lt_train_fit(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *train,
                              const lt_pack_input *valid, FILE *progress, lt_train_result *res);

/* The whole command: loads opt->model (a quantized GGUF stays quantized; opt->quantize quantizes a
 * dense base), its tokenizer, and the dataset folder opt->data (train.jsonl, valid.jsonl when
 * present; chat template applied, prompts masked with mask_prompt), then runs lt_train_fit.
 * opt must be resolved. Errors: those of the loaders and of lt_train_fit. */
LT_API lt_status lt_train_run(lt_ctx *ctx, const lt_train_options *opt, FILE *progress, lt_train_result *res);

/* Text generation of one prompt over a KV cache (generate.h has the batched form and every
 * sampling option). */
typedef struct lt_generate_options {
    int64_t max_tokens; /* new tokens at most [256] */
    double temp;        /* 0 = greedy (argmax, lowest id on ties); > 0 samples softmax(z/temp) */
    double top_p;       /* nucleus sampling mass, (0, 1]; 0 = 1 */
    uint64_t seed;      /* sampling RNG */
} lt_generate_options;

/* Appends up to max_tokens tokens to prompt (n_prompt ids) into out (capacity >= max_tokens),
 * stopping after any id in stop_ids (included in out). on_token, when set, sees each new id as it is
 * chosen (for streaming). Runs a KV cache of n_prompt + max_tokens positions. Errors: those of the
 * model; LT_ERR_INVALID_ARG for an empty prompt, ids out of range or a prompt past the model's context; LT_ERR_OOM. */
LT_API lt_status lt_generate(lt_ctx *ctx, lt_model *m, const int32_t *prompt, int64_t n_prompt, const int32_t *stop_ids,
                             int n_stop, const lt_generate_options *opt, int32_t *out, int64_t *n_out,
                             void (*on_token)(void *arg, int32_t id), void *arg);

/* Evaluation of a data split the way training reads it: the same packing (rows of
 * max_seq_length, batch_size rows per batch, no_pack), masking (done by the data set: mask_prompt)
 * and forward as the trainer's validation, on the loaded model as it is. At most max_batches
 * batches (-1 or 0 = all). */
typedef struct lt_eval_result {
    double loss_sum;  /* Σ token losses (nats) */
    int64_t n_tokens; /* scored targets */
    int64_t n_batches, n_seqs;
    double mean_loss, ppl; /* loss_sum / n_tokens and exp of it (NAN without tokens) */
} lt_eval_result;
/* opt resolved (batch_size, max_seq_length, no_pack, pack_algorithm, attention, loss and
 * bf16_products are read).
 * Prepares m forward-only for (batch_size, max_seq_length). Errors: those of the packer and the
 * model; LT_ERR_INVALID_ARG when the split yields no scored token. */
LT_API lt_status lt_train_evaluate(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *data,
                                   int64_t max_batches, lt_eval_result *res);
/* Perplexity of a token stream in llama.cpp's llama-perplexity windows: the n tokens cut into
 * floor(n / window) windows of `window` tokens (a tail shorter than a window is left out), each
 * window's first token replaced by bos when bos >= 0 (the tokenizer adds one), each window one
 * forward from position 0, and only its second half scored: the targets at positions
 * window/2 + 1 .. window - 1, predicted from window/2 .. window - 2. At most max_windows windows
 * (<= 0: all). res->n_seqs and n_batches count the windows. Prepares m forward-only for
 * (1, window), with bf16 products when bf16_products is 1 (lt_model_run_options.bf16_products).
 * Errors: LT_ERR_INVALID_ARG for a window below 4 or fewer than 2·window tokens
 * (llama-perplexity's minimum, counts named), ids outside the vocabulary; those of the model. */
LT_API lt_status lt_eval_windows(lt_ctx *ctx, lt_model *m, const int32_t *tokens, int64_t n, int64_t window,
                                 int32_t bos, int64_t max_windows, int bf16_products, lt_eval_result *res);

/* Checkpoint file name inside adapter_path. */
#define LT_TRAIN_CHECKPOINT_FILE "checkpoint.ltck"

/* Stop request, async-signal-safe: a SIGINT/SIGTERM handler calls lt_train_request_stop(signo);
 * the trainer checks between steps, saves a checkpoint and returns LT_ERR_INTERRUPTED. */
LT_API void lt_train_request_stop(int signo);
/* The signal number of the pending request, 0 when none. */
LT_API int lt_train_stop_requested(void);
LT_API void lt_train_clear_stop(void);
/* 1 while a stop request is answered with a checkpoint: from lt_train_fit's first step (its
 * first validation included) to its last save; 0 before, while the tokenizer, data and model
 * load, and after. A signal handler that sees 0 has nothing to save and ends the process at once
 * (async-signal-safe, as the request). */
LT_API int lt_train_stop_saves(void);
LT_API void lt_train_set_stop_saves(int on);

#ifdef __cplusplus
}
#endif
#endif
