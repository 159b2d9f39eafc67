/* Flash attention for decoder training: causal always, grouped-query heads, optional sliding
 * window and logit softcap, and packed rows (several sequences per row, each attending only to
 * its own earlier tokens). Saved state is O(T): the output and the per-row log-sum-exp. The device
 * of the tensors selects the backend (CPU reference or CUDA). KV caches, non-causal and arbitrary
 * additive masks are deliberately not offered. */
#ifndef LONGTUNE_ATTENTION_H
#define LONGTUNE_ATTENTION_H

#include "export.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_attention_impl {
    LT_ATTENTION_AUTO = 0, /* flash where supported, else LT_ERR_UNSUPPORTED naming the reason */
    LT_ATTENTION_FLASH,
    LT_ATTENTION_NAIVE, /* materialises (T, T) scores per head: the oracle */
} lt_attention_impl;

/* Strides in elements of a (B, T, heads, D) tensor; the D dimension is contiguous. Zero strides
 * mean the contiguous layout. */
typedef struct lt_attention_layout {
    int64_t batch, token, head;
} lt_attention_layout;

typedef struct lt_attention_batch lt_attention_batch;

/* Shapes and options; zero-initialised fields take the defaults noted. */
typedef struct lt_attention_params {
    int64_t B, T, H, Hkv, D; /* H % Hkv == 0; kv head of query head h = h / (H / Hkv) */
    lt_dtype dtype;          /* f32 | bf16, for q, k, v, out, dout, dq, dk, dv */
    lt_device device;
    lt_attention_impl impl;
    float scale;    /* 0 = 1/sqrt(D) */
    int64_t window; /* sliding window: a token sees at most the previous `window` keys
                                 including itself; 0 = unlimited */
    float softcap;  /* scores -> cap·tanh(s/cap); 0 = off */
    /* Packed rows: (B, S+1) int32 per-row sequence offsets, row b's offsets at
     * seq_offsets[b*(S+1) .. b*(S+1)+S], starting at 0, non-decreasing, ending at T (repeated T
     * pads a row with fewer sequences). NULL = one sequence per row. */
    const int32_t *seq_offsets;
    int64_t S;
    /* Optional, device calls only: the same offsets already in device memory. seq_offsets (host)
     * is still what the boundary validates; the kernels then read this copy instead, so the call
     * queues nothing that depends on the host array (a captured step replays with new offsets). */
    const int32_t *seq_offsets_device;
    /* Optional: what lt_attention_batch_prepare made for this batch and window. The call then
     * skips the offsets' validation and the device kernels read its key bounds; it must match
     * (B, T, S, window, device and both offsets pointers), else LT_ERR_INVALID_ARG. NULL = the
     * call prepares its own. */
    const lt_attention_batch *batch;
    /* q_layout covers q and dq, kv_layout k, v, dk and dv, o_layout out and dout. A layout of all
     * zeros is the contiguous (B, T, heads, D) one; otherwise every stride of a dimension longer
     * than 1 must be at least D (rows of D elements never overlap) and the token stride must fit
     * in an int (it is a BLAS leading dimension). */
    lt_attention_layout q_layout, kv_layout, o_layout;
    /* 1: the CPU flash kernels multiply their tiles on operands rounded to bf16 (nearest even)
     * with f32 sums, as the CUDA kernels multiply bf16 attention: on AMX tiles where the CPU has
     * them. The softmax, its statistics and the outputs stay f32. The naive implementation and
     * the CUDA kernels ignore it: CUDA multiplies bf16 operands at every dtype (f32 attention runs
     * the bf16 kernels on rounded copies). */
    int bf16_products;
} lt_attention_params;

typedef struct lt_attention_args {
    const void *q;     /* (B, T, H, D) */
    const void *k, *v; /* (B, T, Hkv, D), kv_layout */
    void *out;         /* forward out / backward in: (B, T, H, D) */
    float *lse;        /* forward out / backward in: (B, H, T) fp32, natural log */
    /* Backward only. */
    const void *dout;      /* (B, T, H, D) */
    void *dq;              /* out (B, T, H, D), q_layout */
    void *dk, *dv;         /* out (B, T, Hkv, D), kv_layout */
    void *workspace;       /* optional, lt_attention_workspace_bytes() bytes on the device, aligned
                           like lt_alloc's blocks (64 bytes host, 256 device); NULL = allocated
                           and freed through the accounting allocator */
    size_t workspace_size; /* bytes at `workspace`; smaller than needed is LT_ERR_INVALID_ARG */
} lt_attention_args;

/* Errors for every entry point: LT_ERR_INVALID_ARG (H % Hkv, offsets not monotone / not covering
 * the row, negative window, bad scale), LT_ERR_UNSUPPORTED (head dim, dtype or impl the backend
 * lacks; the message names it), LT_ERR_OOM (workspace). */
LT_API lt_status lt_attention_check(lt_ctx *ctx, const lt_attention_params *p);

/* Per-batch preparation: what depends only on the batch and the window, not on the layer — the
 * packed offsets validated and, on a device, the per-token key bounds (B, T) int32 computed into
 * the caller's buffer — done once and shared by every call on that batch (set params.batch).
 * Filled by lt_attention_batch_prepare; read-only afterwards; the buffer must outlive its use and
 * its offsets stay unchanged while it is used. */
struct lt_attention_batch {
    int64_t B, T, S, window;
    lt_device device;
    const int32_t *seq_offsets, *seq_offsets_device;
    void *bounds; /* the key bounds in the caller's buffer; NULL where the device needs none (CPU) */
};

/* Bytes of buffer lt_attention_batch_prepare needs for p on p->device (0 on the CPU). */
LT_API size_t lt_attention_batch_bytes(const lt_attention_params *p);
/* Validates p as lt_attention_check does (p->batch ignored) and prepares *out for it, queueing the
 * key bounds' computation into buffer (bytes >= lt_attention_batch_bytes(p), aligned like lt_alloc's
 * blocks) on a device. Errors: those of lt_attention_check, LT_ERR_INVALID_ARG (buffer missing,
 * small or misaligned), a device error. */
LT_API lt_status lt_attention_batch_prepare(lt_ctx *ctx, const lt_attention_params *p, void *buffer, size_t bytes,
                                            lt_attention_batch *out);

/* Bytes of workspace one forward (backward = 0) or backward (1) call needs on p->device when the
 * context runs `threads` threads (the value given to lt_ctx_set_threads, 0 = default). This is
 * exactly the size the call allocates through lt_alloc when args.workspace is NULL, so the planner
 * can price it. p must have passed lt_attention_check; 0 when the device has no attention; SIZE_MAX
 * when the size overflows (the allocation then fails with LT_ERR_OOM). */
LT_API size_t lt_attention_workspace_bytes(const lt_attention_params *p, int backward, int threads);

/* Forward: reads q, k, v; writes every element of out and lse. */
LT_API lt_status lt_attention_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
/* Backward: reads q, k, v, out, lse (as the forward wrote them) and dout; writes every element of
 * dq, dk and dv (overwritten, not accumulated into; sums over the query heads of a group are
 * taken in fp32). */
LT_API lt_status lt_attention_backward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);

#ifdef __cplusplus
}
#endif
#endif
