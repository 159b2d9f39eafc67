/* The trainer of one lt_train_fit call, shared by its files: train_setup.c (everything before the
 * first step, and the teardown), train_batch.c (a step's batches and this rank's share of them)
 * and train_loop.c (the steps, evaluation, reports, saves). Not part of the public API. */
#ifndef LT_TRAIN_TRAINER_H
#define LT_TRAIN_TRAINER_H

#include "backend/backend.h"
#include "train/step_graph.h"
#include "train/train_internal.h"

typedef struct lt_trainer {
    lt_ctx *ctx;
    const lt_train_options *o;
    lt_model *m;
    const lt_backend *be; /* the model's */
    lt_device dev;
    /* LoRA parameters, gradients (the model's) and AdamW moments (ours), flat, n floats each, in
     * the model's memory; a device run's host mirror of params, m and v (3n) for checkpoints. */
    int64_t n;
    float *params, *grads, *mom_m, *mom_v;
    float *host;
    lt_train_param *tp;
    int n_tp;
    /* Data: the epoch's packing plan, the validation plan, one batch's buffers (B, T_cap). */
    const lt_pack_input *train, *valid;
    lt_pack_options popt;
    lt_pack_plan *plan;
    int64_t plan_epoch;
    lt_pack_plan *vplan;
    int64_t B, T;
    int32_t *ids, *tgt, *pos, *offs, *pieces;
    size_t batch_bytes;
    lt_train_state st;
    lt_metrics *metrics;
    char ckpt_path[LT_TRAIN_PATH_MAX + 32];
    char base_repo[256];   /* lt_peft_base_model_name's buffer */
    const char *base_name; /* the adapter's base_model_name_or_path, resolved at setup */
    /* Data parallel: this rank of `world`; red holds one step's per-micro-batch loss sums and the
     * stop flag for their all-reduce (grad_accum + 1 doubles). stop_world: some rank was asked to
     * stop during the last step (all ranks agree on it, so all stop after the same step). */
    lt_comm *comm;
    int rank, world;
    /* Context parallel: one row split over the world; this rank's tokens, targets and positions
     * (T / world each) are gathered here from the filled row. */
    int cp;
    int32_t *cp_ids, *cp_tgt, *cp_pos;
    size_t cp_bytes;
    double *red;
    size_t red_bytes;
    int stop_world;
    lt_comm_reducer *reducer; /* gradient buckets, started from the model's grad-ready hook */
    int dist;                 /* reductions run: a world of several ranks, or NCCL even for one (its
                                 transport path, exercised on a single GPU) */
    lt_step_graph *sg;        /* device runs of one micro-batch per step on one rank: the step
                                 queued without waits, captured into a CUDA graph when its shape
                                 repeats (step_graph.h) */
    double t0, elapsed0;      /* this call's start (lt_time_now) and the run's elapsed_s then */
    int lock_fd;              /* adapter_path's lock file, held for the run (rank 0; -1: none) */
    int64_t saved_step;       /* the step of the checkpoint and adapter on disk (-1: none) */
    const char *bad_what;     /* set by a step whose loss or gradient norm is not finite */
    double bad_value;
    double step_aux;  /* the last step's MoE load-balancing loss (mean over its micro-batches), 0 without */
    size_t load_peak; /* lt_train_fit_loaded's: the data loading's host high-water, 0 unknown */
} lt_trainer;

/* ---- train_setup.c ---- */
/* Fills the fixed fields (model, backend, data, communicator) of a zeroed trainer. Errors:
 * LT_ERR_UNSUPPORTED for a device without a backend or a communicator that cannot reduce the
 * model's gradients. */
lt_status lt_trainer_init(lt_trainer *t, lt_ctx *ctx, const lt_train_options *opt, lt_model *m,
                          const lt_pack_input *train, const lt_pack_input *valid, lt_comm *comm);
/* lt_train_fit with the host high-water of the data's loading (lt_train_run: its context's peak
 * once the tokenizer and splits are read, before the model), which the run's plan takes as its
 * peak where the step holds less; 0 when the caller loaded the data. */
lt_status lt_train_fit_loaded(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *train,
                              const lt_pack_input *valid, size_t load_peak, FILE *progress, lt_train_result *res);
/* Everything before the first step, in the order the planner prices it: parameters and moments,
 * batch buffers, reducer, context-parallel share, the plan (res->plan_bytes), the prepared model
 * and step graph, the resumed checkpoint (res->start_step) and the metrics log. */
lt_status lt_trainer_setup(lt_trainer *t, lt_train_result *res);
/* Frees what setup allocated (safe after a failed setup) and logs the reducer and graph counts. */
void lt_trainer_free(lt_trainer *t);
/* The checkpoint's RNG keys as a function of seed, step and epoch. */
void lt_trainer_set_rng_keys(lt_trainer *t);

/* ---- train_batch.c ---- */
/* Fills batch `index` of `plan` into the buffers and describes it in *b; *ntok = trained targets,
 * *nreal (optional) = positions holding real tokens (the throughput count, as mlx-lm's). */
lt_status lt_trainer_fill(lt_trainer *t, const lt_pack_plan *plan, const lt_pack_input *in, int64_t index,
                          lt_model_batch *b, int64_t *ntok, int64_t *nreal);
/* This rank's share of batch b: data parallel, rows [B·rank/world, B·(rank+1)/world) as views into
 * b's buffers; context parallel, its zig-zag tokens of the one row, gathered into the cp buffers.
 * *ntok: the trained targets in the share (0 when it has no rows). */
lt_status lt_trainer_shard(lt_trainer *t, const lt_model_batch *b, lt_model_batch *out, int64_t *ntok);
/* The next training batch at the data cursor, building the epoch's packing plan when the epoch
 * changes. Errors: LT_ERR_INVALID_ARG when the training set yields no batches. */
lt_status lt_trainer_next_batch(lt_trainer *t, lt_model_batch *b, int64_t *ntok, int64_t *nreal);

#endif
