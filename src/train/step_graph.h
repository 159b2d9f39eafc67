/* One training step of a device model -- zero the LoRA gradients, forward and backward of one batch,
 * the gradients' global norm and clipping, AdamW -- queued without a host wait and, while the batch
 * keeps one shape, captured once into a CUDA graph and replayed. Shared by the trainer and `bench train`. It does not
 * pack batches, reduce over ranks or accumulate micro-batches (those steps stay eager in the
 * trainer). Private to the library and its benches. */
#ifndef LT_TRAIN_STEP_GRAPH_H
#define LT_TRAIN_STEP_GRAPH_H

#include "backend/backend.h"
#include "longtune/model.h"

/* The optimizer's buffers: n floats each, in the model's device memory (params and grads are the
 * model's flat LoRA buffers). grad_clip: global L2 norm, 0 = off. */
typedef struct lt_step_optim {
    float *params, *grads, *mom_m, *mom_v;
    int64_t n;
    double grad_clip;
} lt_step_optim;

typedef struct lt_step_graph lt_step_graph;

/* Counters for logs and benchmarks. */
typedef struct lt_step_graph_stats {
    int64_t eager, captures, replays;
    int enabled;       /* capture allowed at all (see why_off) */
    char why_off[200]; /* why capture is off or was given up, "" while it is on */
} lt_step_graph_stats;

/* For a prepared device model m (prepare again = a new lt_step_graph: a graph holds the buffers'
 * addresses) and batches of at most B rows of T tokens. enable = 0 runs every step eagerly. Capture
 * is also off (said once in the log) with the op profiler on, LoRA dropout (its masks are drawn
 * from a per-step seed passed by value) or a backend without graphs. Host bookkeeping: one
 * (B, T+1) buffer of padded offsets, through lt_alloc, and with clip_norm one pinned float64 (the
 * gradients' sum of squares), through lt_alloc_pinned. Errors: LT_ERR_INVALID_ARG (a host model),
 * LT_ERR_OOM. */
lt_status lt_step_graph_init(lt_ctx *ctx, lt_model *m, const lt_step_optim *o, int64_t B, int64_t T, int enable,
                             lt_step_graph **out);
void lt_step_graph_free(lt_ctx *ctx, lt_step_graph *g);

/* One step on batch b (host arrays; grad_scale as lt_model_forward_backward's) with AdamW's hp.
 * Packed rows' offsets are padded with empty sequences to a power-of-two S first (the same
 * tokens; attention reads the offsets from device memory, so only S is part of the shape). The
 * first batch of a shape runs eagerly; the same shape (B, T, S; for an MoE model with the router's
 * load-balancing loss also each row's end of real tokens, real_seqs) at the next step is captured
 * and launched, and replayed while it lasts; a step that cannot be captured runs eagerly and
 * capture stays off for the rest of the run (the log says why, once). Either way the results are
 * bit-identical, and the only wait is the loss read at the end: res gets the summed loss, the aux
 * loss of an MoE model and the trained-token count. Errors: as lt_model_forward_backward,
 * LT_ERR_CUDA. */
lt_status lt_step_graph_run(lt_ctx *ctx, lt_step_graph *g, const lt_model_batch *b, float grad_scale,
                            const lt_adamw_params *hp, lt_model_result *res);

/* The global L2 norm of the last step's LoRA gradients before clipping: sqrt of the float64 sum of
 * squares rounded to float, as sumsq hands it to the host (NaN or inf when a gradient is not
 * finite or the sum passes float's range). With the backend's clip_norm the step measures it on
 * the device and its copy comes back with the loss read, so reading it adds no wait; a backend
 * without clip_norm measures it after the step with sumsq (one more wait, after clipping). NaN
 * before the first step. */
double lt_step_graph_grad_norm(const lt_step_graph *g);

lt_step_graph_stats lt_step_graph_get_stats(const lt_step_graph *g);

#endif
