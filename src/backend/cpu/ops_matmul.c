/* CPU GEMM and weight matmuls. f32 weights go straight to OpenBLAS; bf16, f16 and block-quantized
 * weights are dequantized LT_MATMUL_TILE rows at a time into a per-thread f32 workspace and
 * multiplied there, so a quantized base never exists in f32 as a whole (QLoRA). The OpenMP build
 * of OpenBLAS runs single-threaded inside our parallel regions, so threads never oversubscribe. */
#include <cblas.h>
#include <string.h>

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

/* Weight rows dequantized per tile: 64 rows × in ≤ 64 × 16K floats = 4 MiB per thread at the
 * widest layers we target, small enough for L2/L3 residency at C ≤ 4096 (also tried 32: more
 * GEMM calls for no gain at N ≥ 256; 256: larger workspace, no gain). */
#define LT_MATMUL_TILE 64

/* Tokens per thread chunk in the NN mode, where threads split the rows of x instead of W. */
#define LT_MATMUL_NN_ROWS 32

void lt_cpu_gemm(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    (void)ctx;
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* BLAS would not touch C when K = 0 with beta 1; make beta explicit */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

size_t lt_cpu_matmul_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads) {
    (void)out, (void)N_max;
    if (wdtype == LT_DTYPE_F32) return 0;
    return (size_t)lt_parallel_threads(threads) * LT_MATMUL_TILE * (size_t)in * sizeof(float);
}

typedef struct mm_job {
    const lt_tensor *w;
    const float *x;
    float *y;
    float *ws;
    int64_t N, out, in;
    float beta;
    size_t row_bytes;
} mm_job;

static void dequant_rows(const mm_job *j, int64_t r0, int64_t r1, float *dst) {
    const uint8_t *base = j->w->data;
    for (int64_t r = r0; r < r1; r++)
        lt_dequantize_row(j->w->dtype, base + (size_t)r * j->row_bytes, dst + (r - r0) * j->in, j->in);
}

/* NT: threads own tiles of W's rows, i.e. column blocks of y. */
static void nt_tiles(void *arg, int64_t t0, int64_t t1, int thread) {
    const mm_job *j = arg;
    float *tile = j->ws + (size_t)thread * LT_MATMUL_TILE * (size_t)j->in;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r0 = t * LT_MATMUL_TILE, r1 = r0 + LT_MATMUL_TILE < j->out ? r0 + LT_MATMUL_TILE : j->out;
        dequant_rows(j, r0, r1, tile);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (blasint)j->N, (blasint)(r1 - r0), (blasint)j->in, 1.0f,
                    j->x, (blasint)j->in, tile, (blasint)j->in, j->beta, j->y + r0, (blasint)j->out);
    }
}

/* NN: threads own chunks of x's rows and walk every tile of W, accumulating into their rows of y. */
static void nn_rows(void *arg, int64_t c0, int64_t c1, int thread) {
    const mm_job *j = arg;
    float *tile = j->ws + (size_t)thread * LT_MATMUL_TILE * (size_t)j->in;
    int64_t n0 = c0 * LT_MATMUL_NN_ROWS, n1 = c1 * LT_MATMUL_NN_ROWS < j->N ? c1 * LT_MATMUL_NN_ROWS : j->N;
    for (int64_t r0 = 0; r0 < j->out; r0 += LT_MATMUL_TILE) {
        int64_t r1 = r0 + LT_MATMUL_TILE < j->out ? r0 + LT_MATMUL_TILE : j->out;
        dequant_rows(j, r0, r1, tile);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)(n1 - n0), (blasint)j->in, (blasint)(r1 - r0),
                    1.0f, j->x + n0 * j->out + r0, (blasint)j->out, tile, (blasint)j->in, r0 == 0 ? j->beta : 1.0f,
                    j->y + n0 * j->in, (blasint)j->in);
    }
}

void lt_cpu_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                   float *y, void *ws) {
    int64_t out = w->shape[0], in = w->shape[1];
    if (N <= 0) return;
    if (w->dtype == LT_DTYPE_F32) {
        const float *W = w->data;
        if (mode != LT_MATMUL_NN) /* NT or NT_SAME_X: nothing to reuse here */
            lt_cpu_gemm(ctx, 0, 1, N, out, in, 1.0f, x, in, W, in, beta, y, out);
        else
            lt_cpu_gemm(ctx, 0, 0, N, in, out, 1.0f, x, out, W, in, beta, y, in);
        return;
    }
    mm_job j = {w, x, y, ws, N, out, in, beta, (size_t)lt_dtype_row_bytes(w->dtype, in)};
    int threads = lt_ctx_threads(ctx);
    if (mode != LT_MATMUL_NN) {
        lt_parallel_for(threads, (out + LT_MATMUL_TILE - 1) / LT_MATMUL_TILE, 1, nt_tiles, &j);
    } else {
        lt_parallel_for(threads, (N + LT_MATMUL_NN_ROWS - 1) / LT_MATMUL_NN_ROWS, 1, nn_rows, &j);
    }
}
