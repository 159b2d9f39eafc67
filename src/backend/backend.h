/* The op table every backend fills. The model calls ops only through it, so there is one model
 * file for every backend and precision. Ops validate nothing: the model and the public boundary
 * functions (lt_attention_*, lt_lce_*) have checked shapes before calling. Every pointer an op
 * receives (including embedding's ids, rope's pos and inv_freq, matmul's workspace and the weight
 * tensor's data) lives in that backend's memory: device memory for CUDA. The CUDA backend queues
 * all work on its one stream (the legacy default stream until a graph capture makes its own), in
 * call order; no op waits for the device except sumsq and copy_to_host (and synchronize). */
#ifndef LT_BACKEND_H
#define LT_BACKEND_H

#include "longtune/tensor.h"

/* AdamW hyper-parameters of one optimizer step (PyTorch's AdamW: decoupled weight decay,
 * bias-corrected moments, eps added outside the square root). step counts from 1. */
typedef struct lt_adamw_params {
    float lr, beta1, beta2, eps, weight_decay;
    int64_t step;
} lt_adamw_params;

/* Weight products: W is (out, in) in any dtype (f32, bf16, f16 or a block format, dequantized
 * tile by tile into the workspace); x, y are f32 row-major.
 *   LT_MATMUL_NT: y (N, out) = x (N, in) · Wᵀ + beta·y
 *   LT_MATMUL_NN: y (N, in)  = x (N, out) · W  + beta·y
 *   LT_MATMUL_NT_SAME_X: NT, and x is the very input of the previous matmul call on this workspace
 *     (same pointer, N and width, contents unchanged since): a backend may reuse what it derived
 *     from x then (CUDA: the bf16 copy of x, when all of x fitted in one chunk). For projections
 *     that share an input (q, k, v; gate, up). */
typedef enum lt_matmul_mode { LT_MATMUL_NT = 0, LT_MATMUL_NN = 1, LT_MATMUL_NT_SAME_X = 2 } lt_matmul_mode;

/* A captured training step (CUDA graph), owned by the backend that made it. */
typedef struct lt_graph lt_graph;

typedef struct lt_backend {
    const char *name;
    lt_device device;
    /* Copies `bytes` between host and this backend's memory (or within it). To the device: from
     * pageable host memory the call returns once the source has been read; from memory pinned with
     * host_register it is only queued (the source must stay unchanged until the next synchronising
     * call), which is what lets a captured step read its inputs afresh at every replay. To the
     * host: returns when the data is there (waits for the queued work). */
    lt_status (*copy_to_device)(lt_ctx *ctx, void *dst, const void *src_host, size_t bytes);
    lt_status (*copy_to_host)(lt_ctx *ctx, void *dst_host, const void *src, size_t bytes);
    /* Waits for queued work (no-op on CPU). */
    lt_status (*synchronize)(lt_ctx *ctx);

    /* ---- compute ops (f32 activations; threads from ctx) ---- */
    /* Row-major f32 GEMM: C (M, N) = alpha·op(A)·op(B) + beta·C, op(A) (M, K), op(B) (K, N).
     * CUDA: cuBLASLt in fp32 (no TF32) with a fixed 4 MiB static device workspace for split-K. */
    void (*gemm)(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* See lt_matmul_mode. ws: matmul_workspace_bytes(w dtype, out, in, N_max, threads) bytes, for
     * any N <= N_max and either mode (may be NULL when that size is 0). */
    void (*matmul)(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                   float *y, void *ws);
    /* Exact workspace bytes of matmul with a W of this dtype and shape (out, in), called with at
     * most N_max rows of x, on `threads` threads (CPU: per-thread f32 tiles, independent of N_max;
     * CUDA: the cuBLASLt workspace, a bf16 tile of W and a bf16 copy of a chunk of x). */
    size_t (*matmul_workspace_bytes)(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);
    /* y = x / rms(x) · w over rows of C (y may alias x); rstd (N) = 1/sqrt(mean(x²) + eps). */
    void (*rmsnorm_fwd)(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                        float *rstd);
    /* dx (N, C) = ∂/∂x given dy, x, w, rstd from the forward; dw (C) accumulated when non-NULL. */
    void (*rmsnorm_bwd)(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                        int64_t C, float *dx, float *dw);
    /* Rotate-half RoPE in place on x (N, heads, D): pair (i, i + D/2) rotated by pos[n]·inv_freq[i]
     * (inv_freq (D/2), theta and llama3 scaling already applied). inverse = 1 rotates by −angle,
     * which is the backward (the rotation is orthogonal). */
    void (*rope)(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads,
                 int64_t D, int inverse);
    /* a = silu(g)·u elementwise; backward gives dg, du from da. */
    void (*swiglu_fwd)(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
    void (*swiglu_bwd)(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
    /* out (N, C) = rows ids[n] of table (V, C), any dtype, as f32. */
    void (*embedding)(lt_ctx *ctx, const lt_tensor *table, const int32_t *ids, int64_t N, float *out);
    /* y += alpha·x over n elements. */
    void (*add)(lt_ctx *ctx, float *y, const float *x, float alpha, int64_t n);
    /* y (N, C) += b (C) on every row. */
    void (*add_bias)(lt_ctx *ctx, float *y, const float *b, int64_t N, int64_t C);
    /* y = x·keep/(1−p), keep drawn from a counter hash of (seed, offset + i); the same call on dy
     * is the backward. p = 0 copies. y may alias x. */
    void (*dropout)(lt_ctx *ctx, const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset);
    /* One AdamW step over n parameters (m, v: first and second moments, updated in place). hp is
     * host memory (read at call time). */
    void (*adamw)(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp);
    /* p[0..bytes) = 0 (any buffer of this backend's memory). */
    void (*zero)(lt_ctx *ctx, void *p, size_t bytes);
    /* x *= a over n elements. */
    void (*scale)(lt_ctx *ctx, float *x, float a, int64_t n);
    /* Σ x² over n elements, accumulated in float64 and returned to the host rounded to float; waits
     * for queued work (the one compute op that synchronises). */
    float (*sumsq)(lt_ctx *ctx, const float *x, int64_t n);
    /* y (n) = x rounded to bf16 (round to nearest even, NaN kept) / y (n) = x widened to f32; the
     * model's bf16 checkpoints and kept attention outputs are stored and read back with these. */
    void (*to_bf16)(lt_ctx *ctx, const float *x, uint16_t *y, int64_t n);
    void (*from_bf16)(lt_ctx *ctx, const uint16_t *x, float *y, int64_t n);
    /* The dtype the model stores checkpoints (layer inputs kept across the step) and kept
     * attention outputs in unless a run option says otherwise: f32 on the CPU (the reference),
     * bf16 on CUDA, whose matmuls and attention read their inputs in bf16 anyway. */
    lt_dtype saved_dtype;

    /* ---- device-only hooks: NULL on the CPU, whose ops never wait or queue ---- */
    /* Pins (on = 1) or unpins (0) host memory the caller allocated with lt_alloc (no bytes are
     * allocated; the accounting stays with the caller). Errors: LT_ERR_CUDA. */
    lt_status (*host_register)(lt_ctx *ctx, void *p, size_t bytes, int on);
    /* Global-norm clipping with no host wait: norm = sqrt(Σ g²) (float64 sum rounded to float, as
     * sumsq returns it) and, when norm > max_norm, g *= (float)(max_norm / norm): bit for bit what
     * sumsq on the host followed by scale computes, decided on the device. */
    void (*clip_norm)(lt_ctx *ctx, float *g, int64_t n, double max_norm);
    /* Whole-step graphs. graph_begin starts capturing everything queued from now on (the backend's
     * own stream; nothing may wait, allocate or copy from pageable memory until graph_end).
     * graph_end stops and instantiates it: LT_OK with *out set, or a typed error saying why the step
     * could not be captured (*out NULL; the work queued meanwhile was not run, so the caller runs
     * the step again eagerly). A captured step may hold one adamw call; graph_launch replays the
     * graph with hp as that call's hyper-parameters (the one host value a fixed-shape step
     * changes; inputs come through copies from pinned memory, read at replay). Errors: LT_ERR_CUDA,
     * LT_ERR_UNSUPPORTED (graph_end: what broke the capture). */
    lt_status (*graph_begin)(lt_ctx *ctx);
    lt_status (*graph_end)(lt_ctx *ctx, lt_graph **out);
    lt_status (*graph_launch)(lt_ctx *ctx, lt_graph *g, const lt_adamw_params *hp);
    void (*graph_free)(lt_graph *g);
} lt_backend;

/* The backend of a device; NULL when this build lacks it (CUDA without nvcc). */
const lt_backend *lt_backend_get(lt_device dev);

extern const lt_backend lt_backend_cpu;
#if LT_HAVE_CUDA
extern const lt_backend lt_backend_cuda;
#endif

#endif
