/* The layout of the CUDA backend's per-context state (cuda_state.h has the accessors): the stream,
 * the cuBLASLt handle with its plan cache, the f32 gemm's split-K workspace and the sum of squares
 * partials, the SM count, what the matmul workspace's bf16 x area holds, and the graph-capture
 * state. Private to src/backend/cuda/; it holds no kernels. */
#ifndef LT_CUDA_STATE_CUH
#define LT_CUDA_STATE_CUH

#include <pthread.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_state.h"

/* One cuBLASLt plan: the descriptors and algorithm of one problem shape. */
typedef struct lt_cuda_blas_key {
    int kind; /* 0: f32 A, B, C; 1: bf16 A, B, f32 C; 2: e4m3 A, B with per-row and per-column f32
                 scales, f32 C (LT_DTYPE_FP8 weights); 3: e4m3 A, B unscaled, f32 C (the scales
                 then applied by the caller, where cuBLASLt has no kind-2 algorithm) */
    int c16;  /* C and D in bf16 (kind 1 only) */
    int ta, tb;
    int64_t m, n, k, lda, ldb, ldc;
    int align_a, align_b, align_c;
    size_t ws;
} lt_cuda_blas_key;

typedef struct lt_cuda_blas_plan {
    lt_cuda_blas_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t ad, bd, cd;
    cublasLtMatmulAlgo_t algo;
} lt_cuda_blas_plan;

/* Plans are per shape; a model uses ~20 distinct shapes, so 128 slots never evict in practice
 * (eviction is round-robin when they do). */
#define LT_CUDA_BLAS_PLANS 128

/* What the bf16 x area of a matmul workspace holds: all of x (one chunk) from the call that filled
 * it, or nothing (x == NULL). */
typedef struct lt_cuda_xcache {
    const void *ws;
    const float *x;
    int64_t N, width;
    size_t off_x, off_x8;
    const void *colscale; /* fp8 NN: the weight row scales its e4m3 copy of x was scaled by */
} lt_cuda_xcache;

/* One capture at a time per context, from the thread that runs its ops. */
typedef struct lt_cuda_capture {
    int active;
    char fail[256]; /* the first failure seen while capturing, "" when none */
    int adamw_count;
    /* the captured AdamW launch (node NULL when none) and its buffers */
    cudaGraphNode_t adamw;
    float *p, *m, *v;
    const float *g;
    int64_t n;
} lt_cuda_capture;

typedef struct lt_cuda_state {
    int device; /* CUDA device ordinal current when the state was made */
    int sm_count;
    cudaStream_t stream; /* NULL: the legacy default stream, until graph_begin makes one */
    pthread_mutex_t blas_mu;
    cublasLtHandle_t blas; /* made on first use; shared by matmul, gemm and lce */
    void *gemm_ws;         /* LT_CUDA_GEMM_WS_BYTES of device memory, made with the handle */
    double *sumsq;         /* LT_CUDA_SUMSQ_PARTS partials + the total, made with the handle */
    unsigned *tickets;     /* LT_CUDA_TICKETS counters, zero between launches, made with the handle */
    lt_cuda_blas_plan plans[LT_CUDA_BLAS_PLANS];
    int nplans, next_plan;
    lt_cuda_xcache xcache;
    lt_cuda_capture cap;
} lt_cuda_state;

/* The f32 gemm has no workspace argument, but its LoRA products with a long reduction over the
 * tokens (dA = duᵀ·x: 8 x 4096 outputs, K = 8192) need split-K, which needs workspace: without
 * any they ran at 1.6 TFLOP/s on an H200 (bench matmul). Each context's state holds a fixed 4 MiB
 * of device memory for it, made with its cuBLASLt handle and, like the handle's own memory,
 * outside the accounting allocator (the planner prices model memory only). */
#define LT_CUDA_GEMM_WS_BYTES ((size_t)4 << 20)

/* sumsq and clip_norm reduce in two passes through this many float64 partials (ops_elementwise.cu). */
#define LT_CUDA_SUMSQ_PARTS 512

/* The tensor-core LoRA products (ops_gemm_skinny.cu) cut a long reduction into slices over
 * blocks; the last block of an output block to finish adds the slices' sums in order (a ticket
 * counter per output block, taken after the block's sums are written and put back to zero by the
 * last one), so no separate kernel adds them. Only grids of fewer output blocks than this are
 * sliced. */
#define LT_CUDA_TICKETS 4096

/* ctx's state, made on first use; NULL only for ctx NULL. Aborts when the host cannot allocate
 * the small state itself. */
lt_cuda_state *lt_cuda_state_of(lt_ctx *ctx);
/* Makes the state's cuBLASLt handle and device scratch (gemm workspace, sumsq partials, tickets) unless
 * made already, aborting on failure as a failed cuBLASLt call inside an op does; call it with
 * blas_mu held. Ops call it on first use; graph_begin before a capture starts, since nothing may
 * allocate while one runs. Returns the handle. */
cublasLtHandle_t lt_cuda_blas_handle(lt_cuda_state *st);

#endif
