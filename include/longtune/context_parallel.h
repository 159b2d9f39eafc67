/* Context parallel attention: one long causal sequence split over the ranks of a communicator,
 * so each rank holds T/world tokens of q, k, v and of every activation. Ring attention: key/value
 * blocks travel around the ring (their gradients with them in the backward) while each rank's
 * queries stay put. A zig-zag split gives every rank chunks r and 2·world-1-r of 2·world equal
 * chunks, so under the causal mask every rank does the same work. Host f32 buffers over an MPI (or
 * self) communicator; there is no CUDA ring kernel and no packed rows (one sequence, B = 1). */
#ifndef LONGTUNE_CONTEXT_PARALLEL_H
#define LONGTUNE_CONTEXT_PARALLEL_H

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shapes; zero-initialised fields take the defaults noted. */
typedef struct lt_cp_attention_params {
    int64_t T;           /* tokens of the whole sequence, divisible by 2·world */
    int64_t H, Hkv, D;   /* H % Hkv == 0; kv head of query head h = h / (H / Hkv) */
    float scale;         /* 0 = 1/sqrt(D) */
} lt_cp_attention_params;

/* Whole-sequence position of token i (0 <= i < T/world) of `rank` in the zig-zag split: chunks of
 * c = T/(2·world) tokens, rank r holding chunk r then chunk 2·world-1-r. */
int64_t lt_cp_zigzag_position(int64_t T, int world, int rank, int64_t i);
/* Copies rank's T/world rows of row_elems floats out of full (T, row_elems) into local, or back. */
void lt_cp_zigzag_scatter(const float *full, float *local, int64_t T, int world, int rank, int64_t row_elems);
void lt_cp_zigzag_gather(const float *local, float *full, int64_t T, int world, int rank, int64_t row_elems);

/* Errors: LT_ERR_INVALID_ARG (T not divisible by 2·world, H % Hkv, non-positive shapes, bad scale;
 * named), LT_ERR_UNSUPPORTED (a communicator on device buffers). */
lt_status lt_cp_attention_check(lt_ctx *ctx, const lt_comm *comm, const lt_cp_attention_params *p);
/* Host bytes the forward (backward = 0) or backward (1) allocates through lt_alloc on each rank of
 * a world of `world`, for the planner: the key/value ring buffers (the backward's carry their
 * gradients too) and per-row statistics. SIZE_MAX on overflow. */
size_t lt_cp_attention_workspace_bytes(const lt_cp_attention_params *p, int world, int backward);

/* Forward on every rank of comm (NULL = a world of one) at once, each with its local tokens:
 *   q (T/world, H, D), k, v (T/world, Hkv, D) in; out (T/world, H, D) and lse (H, T/world) (natural
 *   log of each query's softmax denominator, scaled scores) out, every element written.
 * Causal over whole-sequence positions. Errors: those of lt_cp_attention_check, LT_ERR_OOM, and the
 * communicator's (a failed exchange leaves out undefined). */
lt_status lt_cp_attention_forward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const float *q,
                                  const float *k, const float *v, float *out, float *lse);
/* Backward: reads q, k, v, out, lse (as the forward wrote them) and dout (T/world, H, D); writes
 * every element of dq (T/world, H, D), dk and dv (T/world, Hkv, D) of this rank's tokens. */
lt_status lt_cp_attention_backward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const float *q,
                                   const float *k, const float *v, const float *out, const float *lse,
                                   const float *dout, float *dq, float *dk, float *dv);

#ifdef __cplusplus
}
#endif
#endif
