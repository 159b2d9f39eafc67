/* Context parallel attention: one long causal sequence split over the ranks of a communicator,
 * so each rank holds T/world tokens of q, k, v and of every activation. A zig-zag split gives
 * every rank chunks r and 2·world-1-r of 2·world equal chunks. Two ways to attend over it:
 *  - Ulysses (any device the communicator serves: host over MPI, CUDA over NCCL): an all-to-all
 *    over heads gives each rank all T tokens of H/world query heads and their Hkv/world key/value
 *    heads, the device's own attention kernel runs unchanged, and an all-to-all returns the output.
 *    Needs Hkv % world == 0.
 *  - Ring (host f32 over MPI or self only): key/value blocks travel around the ring (their gradients
 *    with them in the backward) while each rank's queries stay put; under the causal mask the
 *    zig-zag split gives every rank the same work. Any head count.
 * No packed rows (one sequence, B = 1). */
#ifndef LONGTUNE_CONTEXT_PARALLEL_H
#define LONGTUNE_CONTEXT_PARALLEL_H

#include "export.h"
#include "attention.h"
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Shapes; zero-initialised fields take the defaults noted. */
typedef struct lt_cp_attention_params {
    int64_t T;              /* tokens of the whole sequence, divisible by 2·world */
    int64_t H, Hkv, D;      /* H % Hkv == 0; kv head of query head h = h / (H / Hkv) */
    float scale;            /* 0 = 1/sqrt(D) */
    lt_attention_impl impl; /* Ulysses: the kernel run on each rank's heads (AUTO = flash) */
    lt_dtype dtype;         /* Ulysses: of q, k, v, out, dout, dq, dk, dv: f32 (0) or bf16 (halves the
                            exchanges and the workspace); lse stays f32. The ring takes f32 only. */
} lt_cp_attention_params;

typedef enum lt_cp_kind { LT_CP_RING = 0, LT_CP_ULYSSES = 1 } lt_cp_kind;

/* Which attention a world of `world` ranks whose buffers live on `dev` uses for these heads:
 * Ulysses when Hkv % world == 0, else ring on the host; LONGTUNE_CP=ring or =ulysses in the
 * environment forces one (for tests and comparisons). -1 when none applies (a CUDA world whose
 * Hkv is not a multiple of world). Reads only p->Hkv. */
LT_API int lt_cp_choose(const lt_cp_attention_params *p, int world, lt_device dev);
/* 1 when LONGTUNE_CP names a kind: the model and trainer then run context parallel even over a
 * world of one (its exchanges copy to itself), so a single GPU can check the whole path. */
LT_API int lt_cp_env_forced(void);

/* Whole-sequence position of token i (0 <= i < T/world) of `rank` in the zig-zag split: chunks of
 * c = T/(2·world) tokens, rank r holding chunk r then chunk 2·world-1-r. */
LT_API int64_t lt_cp_zigzag_position(int64_t T, int world, int rank, int64_t i);
/* Copies rank's T/world rows of row_elems floats out of full (T, row_elems) into local, or back. */
LT_API void lt_cp_zigzag_scatter(const float *full, float *local, int64_t T, int world, int rank, int64_t row_elems);
LT_API void lt_cp_zigzag_gather(const float *local, float *full, int64_t T, int world, int rank, int64_t row_elems);

/* Errors: LT_ERR_INVALID_ARG (T not divisible by 2·world, H % Hkv, non-positive shapes, bad scale;
 * named), LT_ERR_UNSUPPORTED (a communicator on device buffers). */
LT_API lt_status lt_cp_attention_check(lt_ctx *ctx, const lt_comm *comm, const lt_cp_attention_params *p);
/* Host bytes the forward (backward = 0) or backward (1) allocates through lt_alloc on each rank of
 * a world of `world`, for the planner: the key/value ring buffers (the backward's carry their
 * gradients too) and per-row statistics. SIZE_MAX on overflow. */
LT_API size_t lt_cp_attention_workspace_bytes(const lt_cp_attention_params *p, int world, int backward);

/* Forward on every rank of comm (NULL = a world of one) at once, each with its local tokens:
 *   q (T/world, H, D), k, v (T/world, Hkv, D) in; out (T/world, H, D) and lse (H, T/world) (natural
 *   log of each query's softmax denominator, scaled scores) out, every element written.
 * Causal over whole-sequence positions. Errors: those of lt_cp_attention_check, LT_ERR_OOM, and the
 * communicator's (a failed exchange leaves out undefined). */
LT_API lt_status lt_cp_attention_forward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const float *q,
                                         const float *k, const float *v, float *out, float *lse);
/* Backward: reads q, k, v, out, lse (as the forward wrote them) and dout (T/world, H, D); writes
 * every element of dq (T/world, H, D), dk and dv (T/world, Hkv, D) of this rank's tokens. */
LT_API lt_status lt_cp_attention_backward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const float *q,
                                          const float *k, const float *v, const float *out, const float *lse,
                                          const float *dout, float *dq, float *dk, float *dv);

/* ---- Ulysses ---- */

/* Errors: LT_ERR_INVALID_ARG (T not a multiple of 2·world, H % Hkv, non-positive or too large
 * shapes; named), LT_ERR_UNSUPPORTED (Hkv not a multiple of world), the attention check's for the
 * per-rank shape (1, T, H/world, Hkv/world, D) on the communicator's device. */
LT_API lt_status lt_cp_ulysses_check(lt_ctx *ctx, const lt_comm *comm, const lt_cp_attention_params *p);
/* Bytes of the workspace the forward and backward take on each rank (on `dev`, the communicator's
 * device; threads as the attention workspace counts them): head-layout q, k, v, out and their
 * gradients for all T tokens of the rank's heads (transposes stage through whichever of them is dead)
 * and the attention kernel's workspace at the per-rank shape, each 256-byte aligned. About
 * (4·H + 8·Hkv)·D·T/world·(4 or 2 for bf16) bytes plus the kernel's. SIZE_MAX when the shape or
 * dtype does not apply. */
LT_API size_t lt_cp_ulysses_workspace_bytes(const lt_cp_attention_params *p, int world, lt_device dev, int threads);
/* Forward on every rank at once, buffers on lt_comm_device(comm) in p->dtype, ws of
 * lt_cp_ulysses_workspace_bytes (256-aligned):
 *   q (T/world, H, D), k, v (T/world, Hkv, D) in, this rank's zig-zag tokens; out (T/world, H, D)
 *   out, every element; lse (H/world, T) out: the rank's heads over the whole sequence in order
 *   (the same number of floats as the ring's (H, T/world); only the backward reads it).
 * Device work is queued in order with the backend's (NCCL: events), without a host wait. Errors:
 * those of lt_cp_ulysses_check, LT_ERR_INVALID_ARG (workspace too small), the communicator's and the
 * attention kernel's. */
LT_API lt_status lt_cp_ulysses_forward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const void *q,
                                       const void *k, const void *v, void *out, float *lse, void *ws, size_t ws_bytes,
                                       int threads);
/* Backward: reads q, k, v, out, lse (as the forward wrote them) and dout (T/world, H, D); writes every
 * element of dq (T/world, H, D), dk and dv (T/world, Hkv, D). Exchanges q, k, v, out and dout again
 * rather than keeping the forward's head layout. */
LT_API lt_status lt_cp_ulysses_backward(lt_ctx *ctx, lt_comm *comm, const lt_cp_attention_params *p, const void *q,
                                        const void *k, const void *v, const void *out, const float *lse,
                                        const void *dout, void *dq, void *dk, void *dv, void *ws, size_t ws_bytes,
                                        int threads);

#ifdef __cplusplus
}
#endif
#endif
