/* Fused linear cross-entropy: loss and gradients of cross_entropy(h · Wᵀ, targets) without ever
 * building the (N, V) logits. Forward saves only the per-token log-sum-exp (fp32, (N)); backward
 * recomputes logit tiles from it. The same entry points serve every backend: the device of h
 * selects the implementation (CPU reference, or CUDA on Hopper).
 *
 * Per token i with logits z = softcap(h_i · Wᵀ) (softcap: cap·tanh(z/cap) when cap > 0):
 *   lse_i  = log Σ_j exp(z_j)
 *   loss_i = (1-ε)(lse_i - z_t) + ε(lse_i - mean_j z_j) + zl·lse_i²      (ε smoothing, zl z-loss)
 * times the optional per-token weight. Targets equal to ignore_index contribute nothing, and
 * their rows of grad h are exactly zero. */
#ifndef LONGTUNE_LCE_H
#define LONGTUNE_LCE_H

#include "export.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LT_IGNORE_INDEX (-100)

typedef enum lt_lce_impl {
    LT_LCE_AUTO = 0, /* fused where the backend supports the request, else LT_ERR_UNSUPPORTED */
    LT_LCE_FUSED,    /* token × vocabulary tiles, online log-sum-exp: O(N + threads·tile) */
    LT_LCE_CHUNKED,  /* vocabulary tiles over all tokens: O(N · tile) */
    LT_LCE_NAIVE,    /* materialises fp32 (N, V) logits: the oracle */
} lt_lce_impl;

typedef enum lt_reduction {
    LT_REDUCTION_MEAN = 0, /* Σ loss_i / Σ w_i over non-ignored tokens (w_i = 1 without weights);
                              an all-ignored batch returns 0 with zero gradients */
    LT_REDUCTION_SUM,
    LT_REDUCTION_NONE, /* per-token loss (N); ignored tokens get 0 */
} lt_reduction;

/* Zero-initialised = defaults. */
typedef struct lt_lce_options {
    lt_lce_impl impl;
    lt_reduction reduction;
    int32_t ignore_index;  /* must be negative; 0 means LT_IGNORE_INDEX (-100) */
    float label_smoothing; /* ε in [0, 1) */
    float z_loss;          /* coefficient of lse² (PaLM's z-loss), >= 0 */
    float softcap;         /* final-logit softcap (Gemma 2), 0 = off */
    int tile_n, tile_v;    /* tokens and vocabulary entries per tile (fused: both; chunked: tile_v;
                               naive: neither); 0 = tuned defaults of the backend */
    int fp32_logit_tiles;  /* CUDA lt_lce_forward_backward only: keep each logit tile in fp32
                               (lse and loss to ~1e-7 relative, ~6% slower on an H200) instead of
                               rounding it to bf16 as a naive bf16 layer rounds its logits (error
                               then within twice that layer's). CPU tiles are always fp32. */
    int bf16_products;     /* CPU lt_lce_forward_backward in one pass (fused) with a bf16 or
                               block-format head: the logit and grad-hidden products take h, the
                               head's tiles and the logit weights rounded to bf16, f32 sums,
                               through oneDNN (AMX where the CPU has it), as the CUDA loss's bf16
                               GEMMs do (lt_model_run_options.bf16_products); 0: f32 products.
                               Other passes, f32 heads and CUDA ignore it. */
} lt_lce_options;

typedef struct lt_lce_args {
    lt_tensor h;               /* (N, C) f32 | bf16 */
    lt_tensor w;               /* (V, C) f32 | bf16 | q8_0 | q4_0 | q4_1 | int4_g64; dense or tied */
    const int32_t *targets;    /* (N) in [0, V) or ignore_index, on h's device */
    const float *token_weight; /* (N) optional per-token weight (finite, >= 0), NULL = 1 */
    float *loss;               /* out: (1) for mean/sum, (N) for none */
    float *lse;                /* out (forward) / in (backward): (N) fp32, of the softcapped
                                    logits; 0 for ignored tokens (not computed) */
    float *token_loss;         /* optional out: (N) per-token loss, weighted, before reduction
                                    (0 for ignored tokens) */
    /* Backward and forward_backward only. */
    const float *dloss;  /* (1) for mean/sum, (N) for none: upstream gradient */
    lt_tensor *dh;       /* out (N, C) f32 | bf16: overwritten */
    lt_tensor *dw;       /* optional out (V, C) f32, dense heads only: accumulated (+=) so a
                                    tied embedding's gradient can be summed into */
    void *workspace;     /* optional: lt_lce_workspace_bytes() bytes on h's device,
                                    64-byte aligned, sized with the same options, shapes and the
                                    context's thread count (a smaller one is overrun);
                                    NULL = allocated and freed through the accounting allocator */
    int targets_checked; /* 1: the caller has checked targets (and token_weight) on the host
                                    already, as the model's batch check does before the upload; the
                                    CUDA impl then skips its own check of the device copy, which
                                    waits for the device (one host synchronisation per call).
                                    0 = checked here (the errors below) */
} lt_lce_args;

/* Which call a workspace is sized for (the `pass` argument of lt_lce_workspace_bytes). */
enum {
    LT_LCE_PASS_FORWARD = 0,
    LT_LCE_PASS_BACKWARD = 1,
    LT_LCE_PASS_FORWARD_BACKWARD = 2,
};

/* Bytes of workspace lt_lce_forward (pass 0), lt_lce_backward (1) or lt_lce_forward_backward (2)
 * will use for this request: exactly what the call allocates through lt_alloc when a->workspace
 * is NULL (one block), so the planner can price it. Reads only the options and a's tensor dtypes,
 * shapes and device (h, w, and for passes 1 and 2 dh and whether dw is set); no data pointer is
 * touched, so views with NULL data are fine. threads: CPU worker threads the call will run with
 * (0 = default; pass the context's lt_ctx_threads). Returns 0 when the request is invalid (the
 * call would fail) or needs no workspace. */
LT_API size_t lt_lce_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass, int threads);

/* Forward: writes loss, lse and (if set) token_loss. Errors: LT_ERR_SHAPE / LT_ERR_DTYPE on
 * mismatch, LT_ERR_INVALID_ARG for a target outside [0, V) (message names the first bad position)
 * or bad options, LT_ERR_UNSUPPORTED when the impl cannot serve the request (message says why),
 * LT_ERR_OOM when the workspace cannot be allocated. */
LT_API lt_status lt_lce_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);

/* Backward: needs h, w, targets, lse (from the forward with the same options), dloss; writes dh
 * and accumulates dw. Same errors as the forward; dw with a quantized head is LT_ERR_UNSUPPORTED. */
LT_API lt_status lt_lce_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);

/* Forward and backward in one call, for a training step that knows its upstream gradient before
 * the loss: needs h, w, targets, dloss ((1) for mean/sum, (N) for none, given up front), dh;
 * writes loss, lse, token_loss (if set) and dh exactly as lt_lce_forward followed by
 * lt_lce_backward would (within rounding), and accumulates dw when set.
 * Fused (and AUTO) make the logits once: each vocabulary tile's logits feed both the online
 * log-sum-exp and, as exp(z - m) with the running max m, a grad-hidden accumulator that is
 * rescaled when m moves; the softmax normaliser, z-loss factor, label-smoothing column sum of W
 * and target row are applied per token at the end. Two GEMMs' worth of FLOPs (logits, dh) where
 * the two calls spend three. Two requests cannot be served that way, because their gradient needs
 * the final lse inside each tile: dw (grad of W is Gᵀ·h over the whole vocabulary) and softcap
 * together with label smoothing; for them the fused impl runs its forward then its backward inside
 * this call (three GEMMs, plus dw's), which lt_lce_workspace_bytes prices. Naive and chunked always
 * run forward then backward. Errors: those of lt_lce_forward and lt_lce_backward. */
LT_API lt_status lt_lce_forward_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);

#ifdef __cplusplus
}
#endif
#endif
