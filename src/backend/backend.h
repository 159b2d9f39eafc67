/* The op table every backend fills, and the only way the model and the public boundary functions
 * reach compute (attention and the loss included). A backend is an instance: this const interface
 * plus a per-context state the backend makes on first use and keeps in the context (core/ctx_state.h;
 * CUDA: its stream, cuBLASLt handle, plans and workspace, SM count, graph-capture state), so every
 * op takes the context first. Ops validate nothing: the model and the public boundary functions
 * (lt_attention_*, lt_lce_*) have checked shapes, and asked `supports`, before calling. Every
 * pointer an op receives (including embedding's ids, rope's pos and inv_freq, matmul's workspace
 * and the weight tensor's data) lives in that backend's memory: device memory for CUDA. The CUDA
 * backend queues all work of a context on that context's stream (the legacy default stream until a
 * graph capture makes its own), in call order; no op waits for the device except sumsq and
 * copy_to_host (and synchronize).
 *
 * Adding an op: one slot here, with its contract in the comment above it (shapes, dtypes, what is
 * overwritten or accumulated); one implementation per backend, named in that backend's table with a
 * designated initialiser (a slot a backend leaves NULL must be one the callers test for, as the
 * device-only hooks below); a refusal it can make goes into the backend's `supports` (an lt_op kind
 * and the query fields it reads); the profiler's wrapper in prof.c when the op should be timed;
 * and one row in the op test matrix under tests/ (the case, its float64 reference and the dtype
 * rule), which then runs on every backend in the build.
 * Adding a backend: a device in lt_device, a table `const lt_backend lt_backend_<name>` filled with
 * designated initialisers (every compute slot set), its `supports` in supports.c, a case in
 * lt_backend_get, and its state (if any) made on first use through lt_ctx_set_backend_state with a
 * free function, so lt_ctx_free releases it. */
#ifndef LT_BACKEND_H
#define LT_BACKEND_H

#include "longtune/attention.h"
#include "longtune/lce.h"
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
typedef enum lt_matmul_mode {
    LT_MATMUL_NT = 0,
    LT_MATMUL_NN = 1,
    LT_MATMUL_NT_SAME_X = 2,
    /* NT for a decode step (a few rows of x, LT_MATVEC_MAX_N at most on the CPU's direct path): a
     * backend may round x to 8 bits per block of 32 and dot it with quantized rows directly (CPU:
     * Q4_0, Q4_1, Q8_0), trading that rounding for reading every weight row once. */
    LT_MATMUL_NT_DECODE = 3
} lt_matmul_mode;

/* A captured training step (CUDA graph), owned by the backend that made it. */
typedef struct lt_graph lt_graph;
/* One LoRA-adapted projection of a group that shares its input x (n, in): q, k, v; gate, up; or
 * one alone. Shapes: W (out, in) any matmul dtype; A (r, in), B (out, r), their gradients, lu
 * (n, r), y and dy (n, out), bias (out) — all f32 in the backend's memory. a = NULL: the
 * projection carries no adapter (b, ga, gb, lu unused). */
typedef struct lt_lora_proj {
    const lt_tensor *w;
    const float *a, *b;
    float *ga, *gb;    /* backward: accumulated (+=) */
    const float *bias; /* forward: added to y, or NULL */
    float *y;          /* forward: the output, or NULL: compute lu only */
    /* forward with beta != 0: y's prior value read from yc (n, out; may be y) instead of y, so a
     * residual is added onto without first being copied into y; NULL: y */
    const float *yc;
    const float *dy; /* backward: the output's gradient */
    float *lu;       /* x·Aᵀ: written by lora_fwd, read by lora_bwd */
    /* lora_bwd_bf16 only: the output's gradient rounded to bf16, read instead of dy (NULL: dy) */
    const uint16_t *dyh;
    /* lora_fwd_bf16 only: the output rounded to bf16, written instead of y (NULL: y). Beta 0 and
     * no bias; the LoRA term is rounded to bf16 before the base product adds onto it. */
    uint16_t *yh;
} lt_lora_proj;

/* What `supports` is asked: one op kind and the properties of a request that a backend may lack.
 * Fields an op does not have stay 0. The public boundaries fill it after validating the request
 * (so every value is one the op accepts) and before any work. */
typedef enum lt_op {
    LT_OP_ATTENTION = 0,    /* attention_fwd / attention_bwd */
    LT_OP_LCE,              /* lce_fwd / lce_bwd / lce_fwd_bwd */
    LT_OP_DECODE_ATTENTION, /* decode_attention (dtype f32, head_dim, window, softcap) */
    LT_OP_COUNT_
} lt_op;

typedef struct lt_op_query {
    lt_op op;
    lt_dtype dtype;   /* attention: q, k, v, out; lce: h */
    lt_dtype wdtype;  /* lce: the head w */
    int impl;         /* lt_attention_impl / lt_lce_impl as requested (AUTO included) */
    int64_t head_dim; /* attention: D */
    int64_t window;   /* attention: sliding window, 0 = none */
    float softcap;    /* attention or lce softcap, 0 = off */
} lt_op_query;

/* ---- decode attention: one query row per token over the keys a KV cache holds ----
 * n query tokens, each of cache row seq[i] (0 <= seq < B_cache) seeing cache positions
 * [max(0, len[i] − window), len[i]) (window 0: from 0), len[i] >= 1. q, out (n, H, D); kc, vc the
 * layer's cache (B_cache, ctx, Hkv, D), positions already rotated; all f32. Scores
 * cap·tanh(scale·q·k/cap) when softcap > 0 (as the prefill kernels); GQA: query head h reads kv head
 * h / (H / Hkv). seq and len live in the backend's memory. The workspace holds the per-split
 * partial results of the split over keys (flash-decoding) where a backend splits. */
typedef struct lt_decode_attention_params {
    int64_t n, H, Hkv, D, ctx;
    int64_t max_len; /* >= every len[i]: bounds the splits */
    float scale, softcap;
    int64_t window;
    const int32_t *seq, *len;
    const float *q, *kc, *vc;
    float *out;
    void *workspace;
} lt_decode_attention_params;
#define LT_MATVEC_MAX_N 8         /* rows of x the CPU's direct quantized matmul path serves */
#define LT_MOE_MAX_EXPERTS 512    /* experts of one MoE layer the routing ops serve */
#define LT_MOE_WGRAD_MAX_RANK 256 /* the narrow side of grouped_matmul_wgrad */

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
    /* Checkpoint offload (lt_model_run_options.offload_ckpt): a copy queue beside the compute
     * work, with LT_XFER_MARKS completion marks. xfer_copy queues a copy of `bytes` between host
     * and this backend's memory (either way) that starts once every op queued before the call has
     * finished, and sets `mark` when it is done; xfer_wait makes every op queued after the call
     * wait until `mark` was set by the latest xfer_copy naming it.
     * CUDA: a non-blocking copy stream ordered against the context's stream by events (the host side
     * must be page-locked, lt_alloc_pinned, for the copy to run asynchronously); CPU: the copy runs
     * at once (memcpy) and waiting is free, so the CPU reference runs the same schedule. */
#define LT_XFER_MARKS 4 /* completion marks of one copy queue */
    lt_status (*xfer_open)(lt_ctx *ctx, void **q);
    /* Waits for the queue's copies and frees it; NULL is a no-op. */
    void (*xfer_close)(lt_ctx *ctx, void *q);
    lt_status (*xfer_copy)(lt_ctx *ctx, void *q, int mark, void *dst, const void *src, size_t bytes);
    lt_status (*xfer_wait)(lt_ctx *ctx, void *q, int mark);
    /* Whether this backend serves a request of this kind: LT_OK, or LT_ERR_UNSUPPORTED with a
     * message in ctx (may be NULL) naming what is refused (head dim, dtype, impl, ...). The one
     * place a backend's refusals of a valid request are decided (supports.c). */
    lt_status (*supports)(lt_ctx *ctx, const lt_op_query *q);
    /* The native stream the ops of ctx are queued on (CUDA: its cudaStream_t, NULL meaning the
     * legacy default stream), for communicators that order their own stream against it; NULL
     * everywhere on the CPU. */
    void *(*native_stream)(lt_ctx *ctx);

    /* ---- compute ops (f32 activations; threads from ctx) ---- */
    /* Row-major f32 GEMM: C (M, N) = alpha·op(A)·op(B) + beta·C, op(A) (M, K), op(B) (K, N).
     * CUDA: cuBLASLt in fp32 (no TF32) with a fixed 4 MiB device workspace for split-K, owned by
     * the context's backend state. */
    void (*gemm)(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
    /* See lt_matmul_mode. ws: matmul_workspace_bytes(w dtype, out, in, N_max, threads) bytes, for
     * any N <= N_max and either mode (may be NULL when that size is 0). */
    void (*matmul)(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                   float *y, void *ws);
    /* Exact workspace bytes of matmul with a W of this dtype and shape (out, in), called with at
     * most N_max rows of x, on `threads` threads (CPU: per-thread f32 tiles, independent of N_max;
     * CUDA: the cuBLASLt workspace, a bf16 tile of W and a bf16 copy of a chunk of x). */
    size_t (*matmul_workspace_bytes)(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);
    /* What matmul needs instead when the run asks for bf16 products (lt_model_run_options
     * .bf16_products; lt_ctx_set_bf16x holds the workspace's bytes during the calls): CPU, a bf16
     * W's products on x rounded to bf16 through oneDNN; 0 for dtypes that keep their path. NULL:
     * the backend has no such products (CUDA's are bf16 already; a CPU build without oneDNN). */
    size_t (*matmul_bf16x_workspace_bytes)(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);
    /* Whether this machine makes those products (set with matmul_bf16x_workspace_bytes): the CPU's
     * oneDNN makes none without AVX-512, and bf16_products is then refused by name. */
    int (*matmul_bf16x_available)(void);
    /* y = x / rms(x) · w over rows of C (y may alias x); rstd (N) = 1/sqrt(mean(x²) + eps). */
    void (*rmsnorm_fwd)(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                        float *rstd);
    /* dx (N, C) = ∂/∂x given dy, x, w, rstd from the forward; dw (C) accumulated when non-NULL. */
    void (*rmsnorm_bwd)(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                        int64_t C, float *dx, float *dw);
    /* Rotate-half RoPE in place on x (N, heads, D): pair (i, i + D/2) rotated by pos[n]·inv_freq[i]
     * and scaled by inv_freq[D/2] (the table: D/2 frequencies with the scaling applied, then the
     * attention factor cos and sin are multiplied by). inverse = 1 rotates by −angle,
     * which is the backward (the rotation is orthogonal). */
    void (*rope)(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                 int inverse);
    /* a = silu(g)·u elementwise; backward gives dg, du from da. In both glu backwards dg may be
     * g and du may be u (each element is read before it is written). */
    void (*swiglu_fwd)(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
    void (*swiglu_bwd)(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
    /* a = gelu_tanh(g)·u elementwise (GELU's tanh approximation, PyTorch's approximate="tanh");
     * backward gives dg, du from da. */
    void (*geglu_fwd)(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
    void (*geglu_bwd)(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
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

    /* ---- attention and the fused loss: the contracts of include/longtune/attention.h and lce.h,
     * called by their public boundaries (attention.c, lce.c) after validation, `supports`, and
     * resolution: layouts explicit, scale set, impl never AUTO, seq_offsets the copy this
     * backend reads; lce options resolved (impl, ignore index). The workspace arrives set (the
     * boundary allocates it when the caller passed none) for attention; lce receives a->workspace
     * as the caller gave it (NULL: the implementation allocates one block through lt_alloc). Sizes
     * are exact: what the call uses, so the planner can price them. ---- */
    size_t (*attention_workspace_bytes)(const lt_attention_params *p, int backward, int threads);
    lt_status (*attention_fwd)(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
    lt_status (*attention_bwd)(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a);
    /* The per-batch part of attention (lt_attention_batch_prepare): b arrives filled, b->bounds
     * the caller's buffer of attention_batch_bytes(p) (NULL when that is 0); the slot computes
     * what its attention calls then read from b instead (CUDA: the (B, T) key bounds, queued). A
     * backend that needs nothing has 0 bytes and a slot that returns LT_OK (the boundary has
     * validated the offsets). */
    size_t (*attention_batch_bytes)(const lt_attention_params *p);
    lt_status (*attention_batch_prepare)(lt_ctx *ctx, const lt_attention_params *p, lt_attention_batch *b);
    /* pass: LT_LCE_PASS_FORWARD, _BACKWARD or _FORWARD_BACKWARD. */
    size_t (*lce_workspace_bytes)(const lt_lce_options *o, const lt_lce_args *a, int pass, int threads);
    lt_status (*lce_fwd)(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a);
    lt_status (*lce_bwd)(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a);
    lt_status (*lce_fwd_bwd)(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a);

    /* ---- mixture of experts: routing, dispatch and the experts' grouped products ----
     * n tokens, E experts (E <= LT_MOE_MAX_EXPERTS), k experts per token (1 <= k <= E), nk = n·k
     * assignments, assignment a = t·k + j being token t's j-th expert. Every pointer in the
     * backend's memory; nothing here waits for the device (counts and offsets stay on it). */
    /* Routing: p = softmax(logits[t]) over E (f32, max-subtracted), idx[t] (k, int32) the k
     * largest p in descending order (ties to the lower expert, as torch.topk on equal values), w[t]
     * (k, f32) those p, divided by their sum when norm_topk. stats (2, E) f32 when non-NULL is
     * accumulated (+=): row 0 the number of tokens choosing each expert, row 1 Σ_t p[t, e] (the
     * load-balancing loss's statistics; summed in a fixed order, so the same call gives the same
     * bits: each expert's count and Σ_t p of one call are summed in float64 over a fixed partition
     * of the tokens, then rounded to f32 and added). */
    void (*moe_route)(lt_ctx *ctx, const float *logits, int64_t n, int64_t E, int64_t k, int norm_topk, int32_t *idx,
                      float *w, float *stats);
    /* The routing's backward with the choice held: dlogits (n, E) = ∂/∂logits of Σ_{t,j} dw[t,j]·w[t,j]
     * (through the normalisation when norm_topk and the softmax) plus, when stats is non-NULL, of
     * Σ_{t,e} dp[e]·p[t, e] with dp[e] = scale[0]·stats[e] (f32 products): the load-balancing
     * loss's gradient per probability, the same for every token, from moe_route's accumulated
     * statistics (2, E) (row 0, the counts, is read) and one f32 scale (coef·E/M² times the loss's
     * upstream gradient), both in the backend's memory and read by the op itself, so nothing
     * waits for the device and a captured graph reads each step's values. Overwrites dlogits. */
    void (*moe_route_bwd)(lt_ctx *ctx, const float *logits, const int32_t *idx, const float *dw, int64_t n, int64_t E,
                          int64_t k, int norm_topk, const float *stats, const float *scale, float *dlogits);
    /* Groups the assignments by expert: off (E + 1) int32, off[0] = 0, off[E] = nk, expert e's
     * grouped rows [off[e], off[e + 1]); rows (nk) int32 the assignment at each grouped row
     * (increasing within an expert: deterministic); slot (nk) int32 its inverse (the grouped row of
     * assignment a). */
    void (*moe_sort)(lt_ctx *ctx, const int32_t *idx, int64_t n, int64_t k, int64_t E, int32_t *off, int32_t *rows,
                     int32_t *slot);
    /* xg (nk, C): grouped row i = x row rows[i] / k. */
    void (*moe_gather)(lt_ctx *ctx, const float *x, const int32_t *rows, int64_t nk, int64_t k, int64_t C, float *xg);
    /* Its backward: dx (n, C) = beta·dx + Σ_j dxg[slot[t·k + j]] (j in order: the k terms are
     * summed first, then added to beta·dx). beta 0 overwrites dx without reading it (here, in
     * moe_combine and in grouped_matmul: poison or NaN in the output is never read). */
    void (*moe_gather_bwd)(lt_ctx *ctx, const float *dxg, const int32_t *slot, int64_t n, int64_t k, int64_t C,
                           float beta, float *dx);
    /* y (n, C) = beta·y + Σ_j w[t, j]·yg[slot[t·k + j]] (j in order). */
    void (*moe_combine)(lt_ctx *ctx, const float *yg, const float *w, const int32_t *slot, int64_t n, int64_t k,
                        int64_t C, float beta, float *y);
    /* Its backward: dyg[slot[t·k + j]] = w[t, j]·dy[t] and dw[t, j] = dy[t]·yg[slot[t·k + j]]
     * (dw may be NULL: skipped). */
    void (*moe_combine_bwd)(lt_ctx *ctx, const float *dy, const float *yg, const float *w, const int32_t *slot,
                            int64_t n, int64_t k, int64_t C, float *dyg, float *dw);
    /* The experts' products, all experts in one call: W holds E matrices stacked (E·out, in),
     * expert e's (out, in) at rows [e·out, (e + 1)·out), any matmul dtype; for every e, over
     * grouped rows [off[e], off[e + 1]) of x and y (nk rows in all, off in the backend's memory):
     *   LT_MATMUL_NT: y_e (m_e, out) = x_e (m_e, in)·W_eᵀ + beta·y_e
     *   LT_MATMUL_NN: y_e (m_e, in)  = x_e (m_e, out)·W_e + beta·y_e
     * ws: grouped_matmul_workspace_bytes(w dtype, E, out, in, nk_max, threads) bytes for any
     * nk <= nk_max (NULL when 0). LT_MATMUL_NT_SAME_X and LT_MATMUL_NT_DECODE compute NT (CPU:
     * passed on to matmul per expert). CPU: each expert's slice through matmul; CUDA: one grouped
     * launch per call (no host wait for the offsets; capturable in a graph), x rounded to bf16
     * and W to bf16 (block formats decoded) in the tile loads, fp32 accumulate. */
    void (*grouped_matmul)(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E, const int32_t *off,
                           const float *x, int64_t nk, float beta, float *y, void *ws);
    size_t (*grouped_matmul_workspace_bytes)(lt_dtype wdtype, int64_t E, int64_t out, int64_t in, int64_t nk_max,
                                             int threads);
    /* The experts' weight gradients (LoRA on the experts), all experts in one call: for every e,
     * over grouped rows [off[e], off[e + 1]) of dy (nk, out) and x (nk, in), all f32 in the
     * backend's memory:
     *   dw_e (out, in) = beta·dw_e + dy_eᵀ·x_e,   dw (E·out, in), expert e's at rows [e·out, (e + 1)·out)
     * beta 0 overwrites without reading; an expert with no rows gets beta·dw_e. One of out, in is
     * a LoRA rank (1..LT_MOE_WGRAD_MAX_RANK), the other any width. Each element is one sum in a fixed
     * order, so the same call gives the same bits. CPU: per expert through gemm; CUDA: one launch,
     * the offsets read on the device (no host wait; capturable in a graph), inputs may be rounded to
     * bf16 as the grouped products round theirs, fp32 accumulate. */
    void (*grouped_matmul_wgrad)(lt_ctx *ctx, int64_t E, const int32_t *off, const float *dy, int64_t out,
                                 const float *x, int64_t in, int64_t nk, float beta, float *dw);

    /* ---- device-only hooks: NULL on the CPU, whose ops never wait or queue ---- */
    /* Pins (on = 1) or unpins (0) host memory the caller allocated with lt_alloc (no bytes are
     * allocated; the accounting stays with the caller). Errors: LT_ERR_CUDA. */
    lt_status (*host_register)(lt_ctx *ctx, void *p, size_t bytes, int on);
    /* Global-norm clipping with no host wait: norm = sqrt(Σ g²) (float64 sum rounded to float, as
     * sumsq returns it) and, when norm > max_norm, g *= (float)(max_norm / norm): bit for bit what
     * sumsq on the host followed by scale computes, decided on the device. max_norm = INFINITY
     * only measures. sumsq_host: NULL, or page-locked host memory (lt_alloc_pinned) that gets the
     * float64 Σ g² (before clipping) through a copy queued behind the reduction; it is there after
     * the next call that waits (copy_to_host, synchronize), so a step that reads its loss back
     * reads the norm with it, and a captured step copies it at every replay. */
    void (*clip_norm)(lt_ctx *ctx, float *g, int64_t n, double max_norm, double *sumsq_host);
    /* Whole-step graphs. graph_begin starts capturing everything queued from now on (the context's
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
    /* The G (1..3) projections p[0..G) of one input x (n, in), LoRA rank r, scale s, no dropout:
     *   lu_g = x·A_gᵀ;  y_g = beta·y_g + x·W_gᵀ + bias_g + s·lu_g·B_gᵀ   (y_g = NULL: lu_g only).
     * ws: the matmul workspace (sized for every W of the group at n rows). CPU: exactly matmul
     * then gemm, projection by projection (the reference); CUDA: the LoRA products may read x in
     * bf16 (fp32 accumulate) and run before the base product, which then accumulates onto y. */
    void (*lora_fwd)(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float beta, void *ws);
    /* The backward of lora_fwd over the same group, given dy_g and the forward's lu_g:
     *   dlu_g = s·dy_g·B_g;  gb_g += s·dy_gᵀ·lu_g;  ga_g += dlu_gᵀ·x;
     *   dx = beta·dx + Σ_g (dy_g·W_g + dlu_g·A_g)   (dx = NULL: skipped).
     * dlu: (n, G·r) f32 scratch; ws as for lora_fwd, and at least lora_workspace_bytes. CUDA may
     * read dy_g in bf16 for dlu_g and gb_g. */
    void (*lora_bwd)(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                     float *dx, float beta, float *dlu, void *ws);
    /* Exact bytes of ws that lora_bwd of G adapters of rank r over `in` inputs, the widest output
     * out_max, needs for itself (the caller's ws is the larger of this and the matmul workspace;
     * CPU: the stacked A copies or dluᵀ·x, or a transposed dB product). NULL: none. */
    size_t (*lora_workspace_bytes)(int G, int64_t r, int64_t in, int64_t out_max, int threads);
    /* Decode attention (lt_decode_attention_params); workspace bytes for n queries of at most
     * max_len keys (0 where the backend needs none). Refusals: supports with LT_OP_DECODE_ATTENTION. */
    size_t (*decode_attention_workspace_bytes)(const lt_decode_attention_params *p, int threads);
    lt_status (*decode_attention)(lt_ctx *ctx, const lt_decode_attention_params *p);
    /* bf16 activations between the MLP's ops, for a backend whose products round their inputs
     * to bf16 anyway (NULL where it has none: the CPU's products read f32). The model runs a
     * layer's products through them where lora_bf16_takes accepts the projections, so an
     * activation (the MLP's gated one and its gradients, the norms' outputs, attention's output)
     * is written once in bf16 instead of in f32 and then again as the products' bf16 copy.
     * lora_bf16_takes: whether lora_fwd_bf16 / lora_bwd_bf16 serve a W (out, in) of wdtype with
     * an adapter of rank r (r = 0: none) at every row count.
     * rmsnorm_fwd_bf16: rmsnorm_fwd with y rounded to bf16 (nearest even), for a norm whose
     * output only feeds such products.
     * rope_cvt: rope from rows x into rows y (not overlapping), each f32 or (x_bf16, y_bf16)
     * bf16: bf16 rows are widened on the load and the result rounded to nearest even on the
     * store, the in-place op's values otherwise; attention's bf16 q and k, and their gradients,
     * without conversion passes of their own.
     * glu_fwd_bf16: a = act(g)·u rounded to bf16 (nearest even), act SiLU or, gelu = 1, GELU's
     * tanh form, computed as swiglu_fwd / geglu_fwd compute it; glu_bwd_bf16: dg and du of
     * swiglu_bwd / geglu_bwd rounded the same way. g, u and da are f32, or all three bf16 with
     * gu_bf16 (the gate and up products written in bf16 by lora_fwd_bf16's yh, the down
     * projection's input gradient by lora_bwd_bf16's dxh), widened on the load.
     * lora_fwd_bf16 / lora_bwd_bf16: lora_fwd / lora_bwd with the group's input given either as
     * x (f32) or as xh (bf16; exactly one of the two non-NULL), and in the backward each dy_g as
     * p[g].dyh (bf16) where it is non-NULL. Given the bf16 roundings of the f32 ops' x and dy,
     * they produce the f32 ops' results bit for bit (those round x and dy for every product).
     * lora_fwd_bf16 also writes an output in bf16 where p[g].yh is set (then y is ignored): the
     * adapter's term s·lu·Bᵀ rounded to bf16, the base product added onto it in f32 and the sum
     * rounded again, at half the f32 output's traffic. lora_bwd_bf16 likewise writes the input
     * gradient in bf16 into dxh where it is non-NULL (one projection, dy in bf16, dx NULL, beta
     * 0): dlu·A rounded, then the base product added onto it and the sum rounded. */
    int (*lora_bf16_takes)(lt_dtype wdtype, int64_t out, int64_t in, int64_t r);
    void (*rmsnorm_fwd_bf16)(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, uint16_t *y,
                             float *rstd);
    void (*rope_cvt)(lt_ctx *ctx, const void *x, int x_bf16, void *y, int y_bf16, const int32_t *pos,
                     const float *inv_freq, int64_t N, int64_t heads, int64_t D, int inverse);
    /* dx += the input gradient rmsnorm_bwd would write (no dw), rounded as rmsnorm_bwd into a
     * buffer and then add (alpha 1) would round it; NULL: those two ops. */
    void (*rmsnorm_bwd_add)(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                            int64_t C, float *dx);
    void (*glu_fwd_bf16)(lt_ctx *ctx, int gelu, const void *g, const void *u, int gu_bf16, int64_t n, uint16_t *a);
    void (*glu_bwd_bf16)(lt_ctx *ctx, int gelu, const void *da, const void *g, const void *u, int gu_bf16, int64_t n,
                         uint16_t *dg, uint16_t *du);
    void (*lora_fwd_bf16)(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                          int64_t r, float s, float beta, void *ws);
    void (*lora_bwd_bf16)(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                          int64_t r, float s, float *dx, uint16_t *dxh, float beta, float *dlu, void *ws);
} lt_backend;

/* The reference composition of lora_fwd / lora_bwd from be's matmul and gemm ops (the CPU
 * backend's implementation; other backends fall back to it for shapes their fused paths skip). */
void lt_lora_fwd_ref(const lt_backend *be, lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n,
                     int64_t r, float s, float beta, void *ws);
void lt_lora_bwd_ref(const lt_backend *be, lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n,
                     int64_t r, float s, float *dx, float beta, float *dlu, void *ws);

/* The backend of a device; NULL when this build lacks it (CUDA without nvcc). */
const lt_backend *lt_backend_get(lt_device dev);

/* `supports` of dev's backend; for a device whose backend this build lacks, that backend's own
 * refusals still come first (supports.c), then LT_ERR_UNSUPPORTED "... is not in this build". */
lt_status lt_backend_supports(lt_ctx *ctx, lt_device dev, const lt_op_query *q);

/* The refusals of each backend (supports.c), compiled in every build. */
lt_status lt_backend_cpu_supports(lt_ctx *ctx, const lt_op_query *q);
lt_status lt_backend_cuda_supports(lt_ctx *ctx, const lt_op_query *q);

extern const lt_backend lt_backend_cpu;
#if LT_HAVE_CUDA
extern const lt_backend lt_backend_cuda;
#endif

#endif
