/* The CUDA backend's compute ops (src/backend/cuda/ops_*.cu), gathered into lt_backend_cuda's table
 * in cuda_backend.cu. Semantics are documented once, on the table in backend/backend.h; every
 * pointer is device memory and every kernel runs on the context's stream (lt_cuda_stream(ctx)). Ops return nothing,
 * so a failed launch or library call is a broken invariant: LT_CUDA_LAUNCHED aborts through the
 * abort hook with file:line and CUDA's message (after clearing the sticky error). */
#ifndef LT_BACKEND_CUDA_OPS_H
#define LT_BACKEND_CUDA_OPS_H

#include <cuda_runtime.h>

#include "backend/cuda/cuda_state.h"

extern "C" {
#include "backend/backend.h"
}

/* Aborts when the last launch failed (no synchronisation: only launch-time errors are seen here;
 * asynchronous faults surface at the next synchronising call, which returns LT_ERR_CUDA). While
 * the stream is being captured into a graph a failure marks the capture failed instead: the
 * trainer then drops the graph and runs the step eagerly. */
#define LT_CUDA_LAUNCHED(ctx, what)                                                  \
    do {                                                                             \
        cudaError_t lt_e_ = cudaGetLastError();                                      \
        if (lt_e_ != cudaSuccess) {                                                  \
            if (lt_cuda_capturing(ctx)) lt_cuda_capture_fail(ctx, what, lt_e_);      \
            else LT_ABORT("%s: launch failed: %s", what, cudaGetErrorString(lt_e_)); \
        }                                                                            \
    } while (0)

/* The same for runtime calls made inside an op (memset, copies): the message also lands in ctx
 * for the abort hook's benefit. */
static inline void lt_cuda_check_abort(lt_ctx *ctx, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    if (lt_cuda_capturing(ctx)) {
        lt_cuda_capture_fail(ctx, what, e);
        return;
    }
    lt_error(ctx, LT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
    LT_ABORT("%s: %s", what, cudaGetErrorString(e));
}

/* Blocks of `threads` for a grid-stride loop over n items (at least 1, at most 65535·16). */
static inline unsigned lt_cuda_grid(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535 * 16) b = 65535 * 16;
    return (unsigned)b;
}

extern "C" {
/* Decode attention (attention/decode.cu): split over keys, then a combine kernel. */
size_t lt_cuda_decode_attention_workspace_bytes(const lt_decode_attention_params *p, int threads);
lt_status lt_cuda_decode_attention(lt_ctx *ctx, const lt_decode_attention_params *p);
/* The copy queue of checkpoint offload (ops_offload.cu). */
lt_status lt_cuda_xfer_open(lt_ctx *ctx, void **q);
void lt_cuda_xfer_close(lt_ctx *ctx, void *q);
lt_status lt_cuda_xfer_copy(lt_ctx *ctx, void *q, int mark, void *dst, const void *src, size_t bytes);
lt_status lt_cuda_xfer_wait(lt_ctx *ctx, void *q, int mark);
void lt_cuda_gemm(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The skinny f32 products (ops_gemm_skinny.cu): 1 when it ran C = alpha·op(A)·op(B) + beta·C
 * itself (a rank <= 16 side and a long streamed operand), 0 to leave it to cuBLASLt. */
int lt_cuda_gemm_skinny(lt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                        int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *ws,
                        size_t ws_bytes);
void lt_cuda_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                    float *y, void *ws);
size_t lt_cuda_matmul_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);
/* lt_cuda_matmul with the x-reuse rule of LT_MATMUL_NT_SAME_X for any mode: same_x = 1 says x
 * (pointer, rows, contents) is the one the workspace's bf16 area was last filled from. */
void lt_cuda_matmul_reuse(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                          float *y, void *ws, int same_x);
/* lt_cuda_matmul of an x given in bf16 (xh: N rows, read in place whatever N), for any W but an
 * fp8 one. */
void lt_cuda_matmul_bf16x(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const uint16_t *xh, int64_t N,
                          float beta, float *y, void *ws);
/* lt_cuda_matmul_bf16x with y in bf16 too (yh: cuBLASLt reads beta·yh and writes the rounded sum). */
void lt_cuda_matmul_bf16xy(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const uint16_t *xh, int64_t N,
                           float beta, uint16_t *yh, void *ws);
/* Fills the workspace's bf16 x area with x (N rows of w's input width for NT, output width for
 * NN) as the matmul would, unless same_x and it already holds it; returns the bf16 rows (row
 * stride = that width), or NULL when x does not fit one chunk (the matmul then converts x
 * piecewise itself). */
const void *lt_cuda_matmul_stage_x(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N,
                                   void *ws, int same_x);
/* The f32 gemm's fixed device workspace of ctx's state and its size. */
void *lt_cuda_gemm_workspace(lt_ctx *ctx, size_t *bytes);
/* ctx's LT_CUDA_TICKETS slice counters (cuda_state.cuh), all zero between launches. */
unsigned *lt_cuda_tickets(lt_ctx *ctx);
/* Skinny products with a bf16 activation (ops_gemm_skinny.cu), 1 when run, 0 when the shape or
 * alignment is not theirs: C (M, N <= 16) = alpha·A (M, K, bf16)·op(B) + beta·C (tb: B (N, K),
 * else B (K, N)); C (P, n) or (n, P) = alpha·Xᵀ·U + beta·C over K rows of X (K, P; bf16, or f32
 * rounded to bf16 when x_f32) and U (K, n <= 16) (c_pj as the f32 tall reduction); the rank update
 * C (M, N) = alpha·U (M, K <= 32)·V + beta·C with V stacked from pieces of kb rows (vt: each piece
 * is (N, kb), read transposed). Both products run on the tensor cores, the f32 factor split into
 * bf16 hi and lo parts as it is loaded (skinny_h_n's B (K, N) by a split into ws first); ws is
 * scratch for that split and the K slices' partial sums (too small: fewer slices). skinny_h_n
 * takes ws = NULL, K % 32 != 0 or, for B (K, N), no room for the split on its CUDA-core path.
 * skinny_h_n with a_f32 reads an f32 A rounded to bf16 (tensor-core path only; 0 otherwise). */
int lt_cuda_skinny_h_n(lt_ctx *ctx, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A, int a_f32,
                       int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *ws,
                       size_t ws_bytes);
int lt_cuda_skinny_h_tall(lt_ctx *ctx, int64_t P, int64_t n, int64_t K, float alpha, const void *X, int x_f32,
                          int64_t ldx, const float *U, int64_t ldu, float beta, float *C, int64_t ldc, int c_pj,
                          void *ws, size_t ws_bytes);
/* The same products for the members of a projection group at once (one launch, grid.z a member:
 * the short per-member passes of a narrow model, latency-bound one by one, run side by side).
 * Every product of a batch has the shared sizes (skinny_h_n: M, N, tb, a_f32; skinny_h_tall: n,
 * K, x_f32, c_pj) and its own operands; k is skinny_h_n's K or skinny_h_tall's P. Each is cut
 * into the slices it would be alone, so the results are the same bits as G calls of the single
 * op; when the workspace cannot hold their split factors and partial sums together they run one
 * after another. 1 when all ran, 0 when one of them is not a shape the kernels take (none ran). */
#define LT_CUDA_SKINNY_BATCH 3
typedef struct lt_cuda_skinny_op {
    const void *a; /* A (M, k) of skinny_h_n; X (K, k) of skinny_h_tall */
    int64_t lda;
    const float *f; /* skinny_h_n's B; skinny_h_tall's U (K, n) */
    int64_t ldf;
    float *c;
    int64_t ldc;
    int64_t k;
    float alpha, beta;
} lt_cuda_skinny_op;
int lt_cuda_skinny_h_n_batch(lt_ctx *ctx, int tb, int G, const lt_cuda_skinny_op *ops, int64_t M, int64_t N, int a_f32,
                             void *ws, size_t ws_bytes);
int lt_cuda_skinny_h_tall_batch(lt_ctx *ctx, int G, const lt_cuda_skinny_op *ops, int64_t n, int64_t K, int x_f32,
                                int c_pj, void *ws, size_t ws_bytes);
/* One rank update of a batch: C (M, n) = alpha·U·V + beta·C0 (c0 NULL: C itself), V from the
 * pieces v (ldv) as lt_cuda_rank_update takes them; C f32, or bf16 with the batch's c_bf16. The
 * updates of a batch share M, K, kb, vt, alpha and beta and run in one launch (the same bits as
 * one by one). */
typedef struct lt_cuda_rank_op {
    const float *u;
    int64_t ldu;
    const float *v[3];
    int64_t ldv;
    const void *c0;
    void *c;
    int64_t n, ldc;
} lt_cuda_rank_op;
int lt_cuda_rank_update_batch(lt_ctx *ctx, int G, const lt_cuda_rank_op *ops, int64_t M, int K, int kb, int vt,
                              float alpha, float beta, int c_bf16);
int lt_cuda_rank_update(lt_ctx *ctx, int64_t M, int64_t N, int K, float alpha, const float *U, int64_t ldu,
                        const float *const *pieces, int kb, int vt, int64_t ld, float beta, const float *C0, float *C,
                        int64_t ldc);
/* (lt_cuda_rank_update: beta·C0 with C0 NULL is beta·C.) The rank update into a bf16 C (read
 * widened when beta != 0, the result rounded to nearest even). */
int lt_cuda_rank_update_h(lt_ctx *ctx, int64_t M, int64_t N, int K, float alpha, const float *U, int64_t ldu,
                          const float *const *pieces, int kb, int vt, int64_t ld, float beta, uint16_t *C, int64_t ldc);
void lt_cuda_lora_fwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                      float beta, void *ws);
void lt_cuda_lora_bwd(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s,
                      float *dx, float beta, float *dlu, void *ws);
int lt_cuda_lora_bf16_takes(lt_dtype wdtype, int64_t out, int64_t in, int64_t r);
void lt_cuda_lora_fwd_bf16(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                           int64_t r, float s, float beta, void *ws);
void lt_cuda_lora_bwd_bf16(lt_ctx *ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n,
                           int64_t r, float s, float *dx, uint16_t *dxh, float beta, float *dlu, void *ws);
void lt_cuda_rmsnorm_fwd(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                         float *rstd);
void lt_cuda_rmsnorm_fwd_bf16(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, uint16_t *y,
                              float *rstd);
void lt_cuda_rmsnorm_bwd_add(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                             int64_t C, float *dx);
void lt_cuda_rmsnorm_bwd(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                         int64_t C, float *dx, float *dw);
void lt_cuda_rope(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                  int inverse);
void lt_cuda_rope_cvt(lt_ctx *ctx, const void *x, int x_bf16, void *y, int y_bf16, const int32_t *pos,
                      const float *inv_freq, int64_t N, int64_t heads, int64_t D, int inverse);
void lt_cuda_swiglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
void lt_cuda_swiglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
void lt_cuda_geglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a);
void lt_cuda_geglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du);
void lt_cuda_glu_fwd_bf16(lt_ctx *ctx, int gelu, const void *g, const void *u, int gu_bf16, int64_t n, uint16_t *a);
void lt_cuda_glu_bwd_bf16(lt_ctx *ctx, int gelu, const void *da, const void *g, const void *u, int gu_bf16, int64_t n,
                          uint16_t *dg, uint16_t *du);
void lt_cuda_embedding(lt_ctx *ctx, const lt_tensor *table, const int32_t *ids, int64_t N, float *out);
void lt_cuda_add(lt_ctx *ctx, float *y, const float *x, float alpha, int64_t n);
void lt_cuda_add_bias(lt_ctx *ctx, float *y, const float *b, int64_t N, int64_t C);
void lt_cuda_dropout(lt_ctx *ctx, const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset);
void lt_cuda_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp);
void lt_cuda_zero(lt_ctx *ctx, void *p, size_t bytes);
void lt_cuda_scale(lt_ctx *ctx, float *x, float a, int64_t n);
float lt_cuda_sumsq(lt_ctx *ctx, const float *x, int64_t n);
void lt_cuda_to_bf16(lt_ctx *ctx, const float *x, uint16_t *y, int64_t n);
void lt_cuda_from_bf16(lt_ctx *ctx, const uint16_t *x, float *y, int64_t n);
void lt_cuda_clip_norm(lt_ctx *ctx, float *g, int64_t n, double max_norm, double *sumsq_host);
/* Mixture of experts: routing and dispatch (moe.cu), the grouped products (grouped_matmul.cu) and
 * their weight gradients (grouped_wgrad.cu). */
void lt_cuda_moe_route(lt_ctx *ctx, const float *logits, int64_t n, int64_t E, int64_t k, int norm_topk, int32_t *idx,
                       float *w, float *stats);
void lt_cuda_moe_route_bwd(lt_ctx *ctx, const float *logits, const int32_t *idx, const float *dw, int64_t n, int64_t E,
                           int64_t k, int norm_topk, const float *stats, const float *scale, float *dlogits);
void lt_cuda_moe_sort(lt_ctx *ctx, const int32_t *idx, int64_t n, int64_t k, int64_t E, int32_t *off, int32_t *rows,
                      int32_t *slot);
void lt_cuda_moe_gather(lt_ctx *ctx, const float *x, const int32_t *rows, int64_t nk, int64_t k, int64_t C, float *xg);
void lt_cuda_moe_gather_bwd(lt_ctx *ctx, const float *dxg, const int32_t *slot, int64_t n, int64_t k, int64_t C,
                            float beta, float *dx);
void lt_cuda_moe_combine(lt_ctx *ctx, const float *yg, const float *w, const int32_t *slot, int64_t n, int64_t k,
                         int64_t C, float beta, float *y);
void lt_cuda_moe_combine_bwd(lt_ctx *ctx, const float *dy, const float *yg, const float *w, const int32_t *slot,
                             int64_t n, int64_t k, int64_t C, float *dyg, float *dw);
void lt_cuda_grouped_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E, const int32_t *off,
                            const float *x, int64_t nk, float beta, float *y, void *ws);
size_t lt_cuda_grouped_matmul_workspace_bytes(lt_dtype wdtype, int64_t E, int64_t out, int64_t in, int64_t nk_max,
                                              int threads);
void lt_cuda_grouped_matmul_wgrad(lt_ctx *ctx, int64_t E, const int32_t *off, const float *dy, int64_t out,
                                  const float *x, int64_t in, int64_t nk, float beta, float *dw);
/* The native stream of ctx for lt_backend.native_stream (cuda_backend.cu). */
void *lt_cuda_native_stream(lt_ctx *ctx);
/* Step graphs (graph.cu). */
lt_status lt_cuda_graph_begin(lt_ctx *ctx);
lt_status lt_cuda_graph_end(lt_ctx *ctx, lt_graph **out);
lt_status lt_cuda_graph_launch(lt_ctx *ctx, lt_graph *g, const lt_adamw_params *hp);
void lt_cuda_graph_free(lt_graph *g);
/* adamw under capture hands its kernel node to graph.cu (one per graph); graph.cu re-points the
 * node at new hyper-parameters before each replay through lt_cuda_adamw_node_params. */
void lt_cuda_graph_note_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n);
lt_status lt_cuda_adamw_node_params(lt_ctx *ctx, cudaGraphExec_t exec, cudaGraphNode_t node, float *p, const float *g,
                                    float *m, float *v, int64_t n, const lt_adamw_params *hp);
}

#endif
