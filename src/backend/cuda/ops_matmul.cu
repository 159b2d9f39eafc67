/* CUDA GEMMs through cuBLASLt. `gemm` is the f32 product of the LoRA factors (CUBLAS_COMPUTE_32F,
 * no TF32, so the CUDA trainer can be compared tightly with the CPU one). `matmul` is the weight
 * product: x is rounded to bf16 in the workspace, W is used directly when bf16 and otherwise
 * converted to bf16 a tile of rows at a time (f32, f16, and every block format: Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, IQ4_NL, INT4_G64, the 256-weight super-blocks of Q2_K..Q6_K and IQ4_XS), and one
 * bf16 cuBLASLt GEMM per tile accumulates in fp32 into the f32 output (beta honoured). There is
 * no fused dequantising GEMM: the tile conversion is a separate memory-bound pass.
 * Row-major products are column-major ones with the operands swapped: C = A·B ⇔ Cᵀ = Bᵀ·Aᵀ. */
#include <string.h>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_state.cuh"

extern "C" {
#include "backend/prof.h"
}

/* cuBLASLt workspace inside the matmul workspace (NVIDIA recommends 32 MiB on Hopper; 4 MiB lost
 * ~3% at 8192 x 4096 x 14336 in the fused loss's measurements). */
#define MM_BLAS_WS ((size_t)32 << 20)
/* Weight elements converted to bf16 per tile: 64M (128 MiB) holds a whole 14336 x 4096 projection,
 * so every 8B layer takes one tile and x is converted once per chunk. With 32M the MLP layers took
 * two tiles, and with several x chunks each tile re-converted x: Q4_0 NN at N = 32768 ran at 0.80
 * of the cuBLASLt bf16 rate against 0.93 for bf16 W (H200, bench matmul). Tile rows are a
 * multiple of 128 so every sub-matrix pointer stays 256-byte aligned. */
#define MM_TILE_ELEMS ((int64_t)1 << 26)
/* Rows of x converted to bf16 at a time: at most MM_X_ROWS, and at most MM_X_ELEMS elements of
 * bf16 x (224 MiB), so 8B MLP layers (max(out, in) = 14336) take 8192-row chunks and keep each GEMM
 * large enough to run at full rate (8192 x 4096 x 14336 is 0.96 TFLOP), while a vocabulary-wide
 * head (out = 151936) takes 773-row chunks instead of a 2.5 GB copy. Never fewer than 128 rows. */
#define MM_X_ROWS ((int64_t)8192)
/* FP8 products accumulate in the tensor cores' fast mode (no periodic promotion to full fp32). */
#ifndef MM_FP8_FAST_ACCUM
#define MM_FP8_FAST_ACCUM 1
#endif
#define MM_X_ELEMS ((int64_t)8192 * 14336)
/* Where cuBLASLt cannot scale an FP8 product by rows and columns itself, an accumulating product
 * (beta != 0) leaves its unscaled sums in the workspace first, at most this many floats (64 MiB)
 * at a time; a product that overwrites its output is scaled in place. */
#define MM_FP8_SUM_ELEMS ((int64_t)1 << 24)

/* ---- cuBLASLt plans: the context's state holds the handle and the plan cache ---- */

typedef lt_cuda_blas_key blas_key;
typedef lt_cuda_blas_plan blas_plan;

static int ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 1 && (a & (uintptr_t)(al - 1))) al >>= 1;
    return al;
}

static void plan_free(blas_plan *p) {
    if (p->cd) cublasLtMatrixLayoutDestroy(p->cd);
    if (p->bd) cublasLtMatrixLayoutDestroy(p->bd);
    if (p->ad) cublasLtMatrixLayoutDestroy(p->ad);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

#define BLAS_OK(call, what)                                                                             \
    do {                                                                                                \
        cublasStatus_t bs_ = (call);                                                                    \
        if (bs_ != CUBLAS_STATUS_SUCCESS)                                                               \
            LT_ABORT("cuBLASLt %s failed (%d) for %lld x %lld x %lld", what, (int)bs_, (long long)k->m, \
                     (long long)k->n, (long long)k->k);                                                 \
    } while (0)

/* A plan for key k. A kind-2 key that cuBLASLt has no algorithm for (outer-vector scales are not
 * offered on every GPU and library) leaves the plan without a descriptor (op NULL): the caller then
 * takes kind 3 and scales the sums itself. Any other key without an algorithm aborts. */
static void plan_make(cublasLtHandle_t handle, blas_plan *p, const blas_key *k) {
    memset(p, 0, sizeof *p);
    p->key = *k;
    cudaDataType_t ab = k->kind >= 2 ? CUDA_R_8F_E4M3 : k->kind ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BLAS_OK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "descriptor");
    BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "descriptor");
    BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "descriptor");
    if (k->kind == 2) { /* a scale per row of D (A's) and per column (B's), applied to the f32 sums */
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode),
                "descriptor");
        BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode),
                "descriptor");
    }
    if (k->kind >= 2) {
        const int8_t fast = MM_FP8_FAST_ACCUM;
        BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast),
                "descriptor");
    }
    BLAS_OK(cublasLtMatrixLayoutCreate(&p->ad, ab, (uint64_t)(k->ta ? k->k : k->m), (uint64_t)(k->ta ? k->m : k->k),
                                       k->lda),
            "layout");
    BLAS_OK(cublasLtMatrixLayoutCreate(&p->bd, ab, (uint64_t)(k->tb ? k->n : k->k), (uint64_t)(k->tb ? k->k : k->n),
                                       k->ldb),
            "layout");
    BLAS_OK(cublasLtMatrixLayoutCreate(&p->cd, k->c16 ? CUDA_R_16BF : CUDA_R_32F, (uint64_t)k->m, (uint64_t)k->n,
                                       k->ldc),
            "layout");
    cublasLtMatmulPreference_t pref = NULL;
    BLAS_OK(cublasLtMatmulPreferenceCreate(&pref), "preference");
    uint32_t aa = (uint32_t)k->align_a, ba = (uint32_t)k->align_b, ca = (uint32_t)k->align_c;
    BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &k->ws, sizeof k->ws),
            "preference");
    BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa),
            "preference");
    BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ba, sizeof ba),
            "preference");
    BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ca, sizeof ca),
            "preference");
    BLAS_OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ca, sizeof ca),
            "preference");
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(handle, p->op, p->ad, p->bd, p->cd, p->cd, pref, 1, &res, &nres);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((s != CUBLAS_STATUS_SUCCESS || nres < 1) && k->kind == 2) { /* kept as "no kind-2 algorithm" */
        plan_free(p);
        p->key = *k;
        return;
    }
    if (s != CUBLAS_STATUS_SUCCESS || nres < 1)
        LT_ABORT("cuBLASLt has no algorithm for %s %lld x %lld x %lld (status %d)",
                 k->kind >= 2  ? "fp8"
                     : k->kind ? "bf16"
                               : "f32",
                 (long long)k->m, (long long)k->n, (long long)k->k, (int)s);
    p->algo = res.algo;
}

/* Column-major D (m, n, ldc, f32, or bf16 with c16) = alpha·op(A)·op(B) + beta·D on ctx's stream;
 * ws NULL with wsb > 0 is the state's gemm workspace. Kind 2 (e4m3) multiplies D's row i by sa[i] and column j by
 * sb[j] before alpha and beta; where cuBLASLt has no algorithm for that, it runs nothing and
 * returns 0 (every other call returns 1). */
static blas_key key_of(int kind, int c16, int ta, int tb, int64_t m, int64_t n, int64_t kk, const void *A, int64_t lda,
                       const void *B, int64_t ldb, const void *C, int64_t ldc, size_t wsb) {
    blas_key key;
    memset(&key, 0, sizeof key); /* padding too: keys are compared with memcmp */
    key.kind = kind, key.c16 = c16, key.ta = ta, key.tb = tb;
    key.m = m, key.n = n, key.k = kk, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.align_a = ptr_align(A), key.align_b = ptr_align(B), key.align_c = ptr_align(C);
    key.ws = wsb;
    return key;
}

/* The plan for key, made on first use (the caller holds st->blas_mu). */
static blas_plan *plan_get(lt_cuda_state *st, const blas_key *key) {
    cublasLtHandle_t handle = lt_cuda_blas_handle(st);
    for (int i = 0; i < st->nplans; i++)
        if (!memcmp(&st->plans[i].key, key, sizeof *key)) return &st->plans[i];
    int slot = st->nplans < LT_CUDA_BLAS_PLANS ? st->nplans++ : (st->next_plan++ % LT_CUDA_BLAS_PLANS);
    plan_free(&st->plans[slot]);
    plan_make(handle, &st->plans[slot], key);
    return &st->plans[slot];
}

static int blas_run_any(lt_ctx *ctx, int kind, int c16, int ta, int tb, int64_t m, int64_t n, int64_t kk, float alpha,
                        const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *C, int64_t ldc,
                        void *ws, size_t wsb, const float *sa, const float *sb) {
    LT_ASSERT(!c16 || kind == 1);
    const blas_key key = key_of(kind, c16, ta, tb, m, n, kk, A, lda, B, ldb, C, ldc, wsb);
    const blas_key *k = &key;
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    LT_ASSERT(st != NULL); /* cuBLASLt plans live in a context's state */
    pthread_mutex_lock(&st->blas_mu);
    cublasLtHandle_t handle = lt_cuda_blas_handle(st);
    if (ws == NULL && wsb) ws = st->gemm_ws; /* the f32 gemm's fixed workspace */
    blas_plan *p = plan_get(st, &key);
    if (p->op == NULL) { /* kind 2 without an algorithm: nothing run */
        pthread_mutex_unlock(&st->blas_mu);
        return 0;
    }
    if (kind == 2) {
        BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa), "scales");
        BLAS_OK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb), "scales");
    }
    cublasStatus_t bs = cublasLtMatmul(handle, p->op, &alpha, A, p->ad, B, p->bd, &beta, C, p->cd, C, p->cd, &p->algo,
                                       ws, wsb, st->stream);
    /* While a step is being captured, a failed matmul marks the capture failed (the trainer then
     * runs the step eagerly), as failed launches do (LT_CUDA_LAUNCHED); otherwise it aborts. */
    if (bs != CUBLAS_STATUS_SUCCESS && st->cap.active) {
        lt_cuda_capture_fail(ctx, "cuBLASLt matmul", cudaErrorUnknown);
        bs = CUBLAS_STATUS_SUCCESS;
    }
    pthread_mutex_unlock(&st->blas_mu);
    BLAS_OK(bs, "matmul");
    return 1;
}

static int blas_run_scaled(lt_ctx *ctx, int kind, int ta, int tb, int64_t m, int64_t n, int64_t kk, float alpha,
                           const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc,
                           void *ws, size_t wsb, const float *sa, const float *sb) {
    return blas_run_any(ctx, kind, 0, ta, tb, m, n, kk, alpha, A, lda, B, ldb, beta, C, ldc, ws, wsb, sa, sb);
}

static void blas_run(lt_ctx *ctx, int kind, int ta, int tb, int64_t m, int64_t n, int64_t kk, float alpha,
                     const void *A, int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc,
                     void *ws, size_t wsb) {
    blas_run_any(ctx, kind, 0, ta, tb, m, n, kk, alpha, A, lda, B, ldb, beta, C, ldc, ws, wsb, NULL, NULL);
}

/* ---- f32 GEMM ---- */

/* The context's fixed gemm workspace (made with its cuBLASLt handle). */
static void *gemm_workspace(lt_ctx *ctx) {
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    LT_ASSERT(st != NULL);
    pthread_mutex_lock(&st->blas_mu);
    (void)lt_cuda_blas_handle(st);
    void *p = st->gemm_ws;
    pthread_mutex_unlock(&st->blas_mu);
    return p;
}

static __global__ void scale_c_k(float *C, int64_t M, int64_t N, int64_t ldc, float beta) {
    for (int64_t i = blockIdx.y; i < M; i += gridDim.y)
        for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < N; j += (int64_t)gridDim.x * blockDim.x)
            C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

void lt_cuda_gemm(lt_ctx *ctx, int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) { /* no product: C = beta·C, as the CPU op */
        dim3 grid((unsigned)((N + 255) / 256), (unsigned)(M < 65535 ? M : 65535));
        scale_c_k<<<grid, 256, 0, lt_cuda_stream(ctx)>>>(C, M, N, ldc, beta);
        LT_CUDA_LAUNCHED(ctx, "gemm (K = 0)");
        return;
    }
    /* the LoRA products with a rank-r side that stream a whole activation: one pass here */
    if (lt_cuda_gemm_skinny(ctx, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, gemm_workspace(ctx),
                            LT_CUDA_GEMM_WS_BYTES))
        return;
    /* row-major C (M, N) = op(A)·op(B) is column-major Cᵀ (N, M) = op(B)ᵀ·op(A)ᵀ */
    blas_run(ctx, 0, trans_b, trans_a, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc, NULL, LT_CUDA_GEMM_WS_BYTES);
}

/* ---- weight matmul ---- */

typedef struct mm_layout {
    int64_t tile_rows; /* rows of W per tile (out when W is bf16 or fp8: no tile) */
    int64_t x_rows;    /* rows of x per bf16 chunk */
    size_t off_tile, off_x, total;
    size_t off_x8, off_sx, off_one; /* fp8: e4m3 x, its row scales, a vector of ones (NN's A scales) */
    size_t off_sum;                 /* fp8: unscaled sums of up to sum_rows rows (see fp8_product) */
    size_t off_qt;                  /* fp8: W transposed (in, out) for an NN product (fp8_transpose) */
    int64_t sum_rows;
} mm_layout;

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

static mm_layout mm_plan(lt_dtype dt, int64_t out, int64_t in, int64_t N_max) {
    mm_layout l;
    memset(&l, 0, sizeof l);
    if (dt == LT_DTYPE_BF16 || dt == LT_DTYPE_FP8) {
        l.tile_rows = out;
    } else {
        int64_t r = MM_TILE_ELEMS / (in > 0 ? in : 1) / 128 * 128;
        if (r < 128) r = 128;
        l.tile_rows = r < out ? r : out;
    }
    l.off_tile = align256(MM_BLAS_WS);
    size_t tile = dt == LT_DTYPE_BF16 || dt == LT_DTYPE_FP8 ? 0 : align256((size_t)l.tile_rows * (size_t)in * 2);
    l.off_x = l.off_tile + tile;
    const int64_t xcols = in > out ? in : out;
    l.x_rows = MM_X_ELEMS / (xcols > 0 ? xcols : 1);
    if (l.x_rows > MM_X_ROWS) l.x_rows = MM_X_ROWS;
    if (l.x_rows < 128) l.x_rows = 128;
    int64_t rows = N_max < l.x_rows ? N_max : l.x_rows;
    if (rows < 0) rows = 0;
    l.total = l.off_x + align256((size_t)rows * (size_t)xcols * 2);
    if (dt == LT_DTYPE_FP8) { /* beside the bf16 x the LoRA products read: its e4m3 copy and scales */
        l.off_x8 = l.total;
        l.off_sx = l.off_x8 + align256((size_t)rows * (size_t)xcols);
        l.off_one = l.off_sx + align256((size_t)rows * 4);
        l.off_sum = l.off_one + align256((size_t)xcols * 4);
        l.sum_rows = MM_FP8_SUM_ELEMS / (xcols > 0 ? xcols : 1);
        if (l.sum_rows > rows) l.sum_rows = rows;
        if (l.sum_rows < 1) l.sum_rows = 1;
        l.off_qt = l.off_sum + align256((size_t)l.sum_rows * (size_t)xcols * 4);
        l.total = l.off_qt + align256((size_t)out * (size_t)in);
    }
    return l;
}

size_t lt_cuda_matmul_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads) {
    (void)threads;
    return mm_plan(wdtype, out, in, N_max).total;
}

static __global__ void to_bf16_k(const float *x, __nv_bfloat16 *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

static __device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Eight floats in (two 16-byte loads), eight bf16 out (one 16-byte store). */
static __global__ void to_bf16_vec_k(const float4 *x, uint4 *y, int64_t n8) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 a = x[2 * i], b = x[2 * i + 1];
        y[i] = make_uint4(bf16x2_bits(a.x, a.y), bf16x2_bits(a.z, a.w), bf16x2_bits(b.x, b.y), bf16x2_bits(b.z, b.w));
    }
}

/* n f32 → bf16 (dst 16-byte aligned): vector loads when src allows, then the tail. */
static void to_bf16(lt_ctx *ctx, const float *x, __nv_bfloat16 *y, int64_t n) {
    int64_t n8 = ((uintptr_t)x % 16) ? 0 : n / 8;
    if (n8) {
        to_bf16_vec_k<<<lt_cuda_grid(n8, 256), 256, 0, lt_cuda_stream(ctx)>>>((const float4 *)x, (uint4 *)y, n8);
        LT_CUDA_LAUNCHED(ctx, "matmul: x to bf16");
    }
    if (n - 8 * n8) {
        to_bf16_k<<<lt_cuda_grid(n - 8 * n8, 256), 256, 0, lt_cuda_stream(ctx)>>>(x + 8 * n8, y + 8 * n8, n - 8 * n8);
        LT_CUDA_LAUNCHED(ctx, "matmul: x to bf16");
    }
}

/* ---- fp8 staging ----
 * One block a row of x (width a multiple of 4): the row's bf16 copy for the LoRA products and its
 * e4m3 copy for the FP8 product, scaled as lt_fp8_row_scale scales (inv = 448 / amax by IEEE
 * division, so both backends round the same products). NN passes W's row scales (colscale): the
 * e4m3 copy then holds x·colscale per column, which folds W's scales into x. */
#define FP8_STAGE_THREADS 256

static __device__ __forceinline__ uint32_t fp8x4_bits(float a, float b, float c, float d) {
    const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    return (uint32_t)lo | ((uint32_t)hi << 16);
}

static __global__ void __launch_bounds__(FP8_STAGE_THREADS)
    fp8_stage_k(const float *x, int64_t width, const float *colscale, __nv_bfloat16 *xb, uint32_t *x8, float *sx,
                float *one, int64_t n_one) {
    const int64_t r = blockIdx.x, w4 = width / 4;
    const float4 *row = (const float4 *)(x + r * width);
    const float4 *cs = (const float4 *)colscale;
    float amax = 0.0f;
    for (int64_t i = threadIdx.x; i < w4; i += FP8_STAGE_THREADS) {
        float4 v = row[i];
        if (cs) {
            const float4 c = cs[i];
            v.x *= c.x, v.y *= c.y, v.z *= c.z, v.w *= c.w;
        }
        if (isnan(v.x) || isnan(v.y) || isnan(v.z) || isnan(v.w) || isnan(amax)) amax = __int_as_float(0x7fc00000);
        else amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    __shared__ float red[FP8_STAGE_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = isnan(t) ? t : fmaxf(amax, t);
    }
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = red[0];
    for (int k = 1; k < FP8_STAGE_THREADS / 32; k++) amax = isnan(red[k]) ? red[k] : fmaxf(amax, red[k]);
    const float inv = amax > 0.0f ? __fdiv_rn(LT_FP8_MAX, amax) : 0.0f;
    if (threadIdx.x == 0) sx[r] = amax > 0.0f ? __fdiv_rn(amax, LT_FP8_MAX) : (amax == 0.0f ? 0.0f : amax);
    uint2 *xbr = (uint2 *)(xb + r * width);
    uint32_t *x8r = x8 + r * w4;
    for (int64_t i = threadIdx.x; i < w4; i += FP8_STAGE_THREADS) {
        const float4 v = row[i];
        xbr[i] = make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
        float4 u = v;
        if (cs) {
            const float4 c = cs[i];
            u.x *= c.x, u.y *= c.y, u.z *= c.z, u.w *= c.w;
        }
        x8r[i] = fp8x4_bits(u.x * inv, u.y * inv, u.z * inv, u.w * inv);
    }
    if (r == 0)
        for (int64_t i = threadIdx.x; i < n_one; i += FP8_STAGE_THREADS) one[i] = 1.0f;
}

/* Rows [r0, r0 + rows) of W (plain dtype) into a bf16 (rows, in) tile, one element a thread. */
static __global__ void dequant_tile_k(lt_dtype t, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t rows,
                                      int64_t in, __nv_bfloat16 *tile) {
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const uint8_t *row = w + (size_t)(r0 + r) * row_bytes;
        for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < in; c += (int64_t)gridDim.x * blockDim.x)
            tile[r * in + c] = __float2bfloat16_rn(lt_dq_plain(t, row, c));
    }
}

/* The same for block formats, one 32-weight group a thread: the scale is read once per group and
 * the 64 output bytes leave as four 16-byte stores (in is a multiple of the block, 32, 64 or 256,
 * so groups never straddle rows or super-blocks and every group start is 64-byte aligned in the
 * tile). The tile and x sizes do not depend on the format: the workspace is the same for all. EXT
 * selects the formats beyond Q4_1 (lt_dq_group32_ext), in their own instantiation so that Q8_0,
 * Q4_0, Q4_1 and INT4_G64 keep the kernel (and register count) they were measured with. */
template <bool EXT>
static __global__ void dequant_groups_k(lt_dtype t, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t rows,
                                        int64_t in, __nv_bfloat16 *tile) {
    const int64_t gpr = in / 32, total = rows * gpr;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / gpr, g = i - r * gpr;
        float v[32];
        if (EXT) lt_dq_group32_ext(t, w + (size_t)(r0 + r) * row_bytes, g, v);
        else lt_dq_group32(t, w + (size_t)(r0 + r) * row_bytes, g, v);
        uint4 *dst = (uint4 *)(tile + r * in + g * 32);
#pragma unroll
        for (int q = 0; q < 4; q++)
            dst[q] = make_uint4(bf16x2_bits(v[8 * q], v[8 * q + 1]), bf16x2_bits(v[8 * q + 2], v[8 * q + 3]),
                                bf16x2_bits(v[8 * q + 4], v[8 * q + 5]), bf16x2_bits(v[8 * q + 6], v[8 * q + 7]));
    }
}

/* Whether the workspace holds all of x (N rows of width xin) staged for a layout l: bf16, and for
 * fp8 its e4m3 copy scaled by colscale. */
static int mm_x_cached(const lt_cuda_xcache &mm_last, const void *ws, const float *x, int64_t N, int64_t xin,
                       const mm_layout *l, const float *colscale) {
    return N <= l->x_rows && mm_last.ws == ws && mm_last.x == x && mm_last.N == N && mm_last.width == xin &&
        mm_last.off_x == l->off_x && mm_last.off_x8 == l->off_x8 && mm_last.colscale == colscale;
}

/* Records that the workspace of layout l holds all N rows of x (width xin) staged, for colscale. */
static void mm_x_remember(lt_cuda_xcache &mm_last, const void *ws, const float *x, int64_t N, int64_t xin,
                          const mm_layout *l, const float *colscale) {
    mm_last.ws = ws, mm_last.x = x, mm_last.N = N, mm_last.width = xin;
    mm_last.off_x = l->off_x, mm_last.off_x8 = l->off_x8, mm_last.colscale = colscale;
}

/* W's row scales (fp8) when mode is NN (the e4m3 copy of x is scaled by them), else NULL. */
static const float *fp8_colscale(lt_matmul_mode mode, const lt_tensor *w) {
    if (w->dtype != LT_DTYPE_FP8 || mode != LT_MATMUL_NN) return NULL;
    return lt_fp8_scales(w->data, w->shape[0], w->shape[1]);
}

/* Rows [0, n) of x (width xin) into the workspace: bf16, and for an fp8 W also e4m3 with its
 * scales (colscale: see fp8_stage_k). */
static void stage_rows(lt_ctx *ctx, const mm_layout *l, void *ws, const float *x, int64_t n, int64_t xin, int fp8,
                       const float *colscale, int64_t n_one) {
    char *wsc = (char *)ws;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)(wsc + l->off_x);
    const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_MATMUL_CVT);
    if (fp8) {
        /* float4 rows: activations are 16-byte aligned and fp8 sides multiples of 16 (the load's check) */
        LT_ASSERT(((uintptr_t)x & 15) == 0 && xin % 4 == 0);
        fp8_stage_k<<<(unsigned)n, FP8_STAGE_THREADS, 0, lt_cuda_stream(ctx)>>>(x, xin, colscale, xb,
                                                                                (uint32_t *)(wsc + l->off_x8),
                                                                                (float *)(wsc + l->off_sx),
                                                                                (float *)(wsc + l->off_one), n_one);
        LT_CUDA_LAUNCHED(ctx, "matmul: x to bf16 and fp8");
    } else {
        to_bf16(ctx, x, xb, n * xin);
    }
    lt_prof_end(ph);
}

/* y (row j at y + j·ldy, m wide) = sa[i]·sb[j]·d[j·ldd + i] + beta·y (y not read when beta is 0;
 * sa NULL: ones). d may be y. Four columns a thread: m and both strides are multiples of 4. */
static __global__ void fp8_scale_sums_k(const float *d, int64_t ldd, float *y, int64_t ldy, int64_t m, int64_t n,
                                        const float *sa, const float *sb, float beta) {
    const int64_t m4 = m / 4, total = m4 * n;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = t / m4, i = 4 * (t - j * m4);
        const float4 v = *(const float4 *)(d + j * ldd + i);
        const float4 a = sa ? *(const float4 *)(sa + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        const float b = sb[j];
        float4 r = make_float4(v.x * a.x * b, v.y * a.y * b, v.z * a.z * b, v.w * a.w * b);
        float4 *yo = (float4 *)(y + j * ldy + i);
        if (beta != 0.0f) {
            const float4 o = *yo;
            r.x += beta * o.x, r.y += beta * o.y, r.z += beta * o.z, r.w += beta * o.w;
        }
        *yo = r;
    }
}

/* qt (in, out) = q (out, in)ᵀ for e4m3 bytes, both sides multiples of 16 (the load's check): 64 x 64
 * tiles through shared memory, 4-byte words on both sides (each thread four words in, four out).
 * Hopper's FP8 GEMMs take both operands K-major, so an NN product (the input gradient) reads W
 * transposed; making it here for each product keeps the base at one byte a weight. */
#define FP8_T_TILE 64
static __global__ void __launch_bounds__(256) fp8_transpose_k(const uint8_t *q, int64_t out, int64_t in, uint8_t *qt) {
    __shared__ __align__(4) uint8_t t[FP8_T_TILE][FP8_T_TILE + 4];
    const int64_t i0 = (int64_t)blockIdx.x * FP8_T_TILE, o0 = (int64_t)blockIdx.y * FP8_T_TILE;
    for (int w = threadIdx.x; w < FP8_T_TILE * FP8_T_TILE / 4; w += blockDim.x) {
        const int r = w / (FP8_T_TILE / 4), c = 4 * (w % (FP8_T_TILE / 4)); /* row of q, byte column */
        if (o0 + r < out && i0 + c < in) *(uint32_t *)&t[r][c] = *(const uint32_t *)(q + (o0 + r) * in + i0 + c);
    }
    __syncthreads();
    for (int w = threadIdx.x; w < FP8_T_TILE * FP8_T_TILE / 4; w += blockDim.x) {
        const int i = w / (FP8_T_TILE / 4), c = 4 * (w % (FP8_T_TILE / 4)); /* row of qt, byte column */
        if (i0 + i < in && o0 + c < out)
            *(uint32_t *)(qt + (i0 + i) * out + o0 + c) = (uint32_t)t[c][i] | (uint32_t)t[c + 1][i] << 8 |
                (uint32_t)t[c + 2][i] << 16 | (uint32_t)t[c + 3][i] << 24;
    }
}

static void fp8_transpose(lt_ctx *ctx, const uint8_t *q, int64_t out, int64_t in, uint8_t *qt) {
    const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_MATMUL_DEQUANT);
    const dim3 grid((unsigned)((in + FP8_T_TILE - 1) / FP8_T_TILE), (unsigned)((out + FP8_T_TILE - 1) / FP8_T_TILE));
    fp8_transpose_k<<<grid, 256, 0, lt_cuda_stream(ctx)>>>(q, out, in, qt);
    LT_CUDA_LAUNCHED(ctx, "matmul: fp8 W transposed");
    lt_prof_end(ph);
}

/* Column-major D (m, n) at y (ldc) = diag(sa)·Aᵀ·B·diag(sb) + beta·D for e4m3 A (k, m; lda) and B
 * (k, n; ldb): in cuBLASLt's epilogue where it offers outer-vector scales for the shape, else as
 * unscaled sums (kind 3) that fp8_scale_sums_k scales: in place when beta is 0, through the
 * workspace's sum buffer (l->sum_rows columns of D at a time) when the product accumulates. */
static void fp8_product(lt_ctx *ctx, const mm_layout *l, char *wsc, int64_t m, int64_t n, int64_t kk, const uint8_t *A,
                        int64_t lda, const uint8_t *B, int64_t ldb, float beta, float *y, int64_t ldc, const float *sa,
                        const float *sb) {
    if (blas_run_scaled(ctx, 2, 1, 0, m, n, kk, 1.0f, A, lda, B, ldb, beta, y, ldc, wsc, MM_BLAS_WS, sa, sb)) return;
    const int64_t step = beta == 0.0f ? n : l->sum_rows;
    float *sum = (float *)(wsc + l->off_sum);
    for (int64_t j0 = 0; j0 < n; j0 += step) {
        const int64_t nj = n - j0 < step ? n - j0 : step;
        float *d = beta == 0.0f ? y + j0 * ldc : sum;
        const int64_t ldd = beta == 0.0f ? ldc : m;
        blas_run_scaled(ctx, 3, 1, 0, m, nj, kk, 1.0f, A, lda, B + j0 * ldb, ldb, 0.0f, d, ldd, wsc, MM_BLAS_WS, NULL,
                        NULL);
        /* a profile counts these calls: the products the unscaled path served, and its extra pass */
        const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_MATMUL_FP8_SCALE);
        fp8_scale_sums_k<<<lt_cuda_grid(m / 4 * nj, 256), 256, 0, lt_cuda_stream(ctx)>>>(d, ldd, y + j0 * ldc, ldc, m,
                                                                                         nj, sa, sb + j0, beta);
        LT_CUDA_LAUNCHED(ctx, "matmul: fp8 row and column scales");
        lt_prof_end(ph);
    }
}

const void *lt_cuda_matmul_stage_x(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N,
                                   void *ws, int same_x) {
    const int64_t out = w->shape[0], in = w->shape[1];
    const mm_layout l = mm_plan(w->dtype, out, in, N);
    const int64_t xin = mode == LT_MATMUL_NN ? out : in;
    if (N <= 0 || N > l.x_rows || xin % 8) return NULL;
    __nv_bfloat16 *xb = (__nv_bfloat16 *)((char *)ws + l.off_x);
    lt_cuda_xcache &mm_last = lt_cuda_state_of(ctx)->xcache;
    const float *cs = fp8_colscale(mode, w);
    if (!(same_x && mm_x_cached(mm_last, ws, x, N, xin, &l, cs))) {
        stage_rows(ctx, &l, ws, x, N, xin, w->dtype == LT_DTYPE_FP8, cs, mode == LT_MATMUL_NN ? in : 0);
        mm_x_remember(mm_last, ws, x, N, xin, &l, cs);
    }
    return xb;
}

/* The matmul of x (f32, staged into the workspace) or of xh (bf16, read in place: every row in
 * one chunk; not for an fp8 W, whose e4m3 copy is made from the f32 x), into the f32 y or (with
 * xh, yh non-NULL) the bf16 yh. */
static void matmul_core(lt_ctx *ctx, lt_matmul_mode mode_in, const lt_tensor *w, const float *x,
                        const __nv_bfloat16 *xh, int64_t N, float beta, float *y, __nv_bfloat16 *yh, void *ws,
                        int same_x) {
    const int64_t out = w->shape[0], in = w->shape[1];
    if (N <= 0 || out <= 0 || in <= 0) return;
    const lt_matmul_mode mode = mode_in == LT_MATMUL_NN ? LT_MATMUL_NN : LT_MATMUL_NT;
    LT_ASSERT(ws != NULL); /* the CUDA matmul always needs its workspace (cuBLASLt + bf16 x) */
    const lt_dtype dt = w->dtype;
    LT_ASSERT(!xh || dt != LT_DTYPE_FP8);
    LT_ASSERT(!yh || xh);
    const mm_layout l = mm_plan(dt, out, in, N);
    char *wsc = (char *)ws;
    const __nv_bfloat16 *xb = xh ? xh : (const __nv_bfloat16 *)(wsc + l.off_x);
    __nv_bfloat16 *tile = (__nv_bfloat16 *)(wsc + l.off_tile);
    const int64_t xin = mode == LT_MATMUL_NT ? in : out;
    const size_t row_bytes = (size_t)lt_dtype_row_bytes(dt, in);
    const int64_t XR = xh ? N : l.x_rows, nchunks = (N + XR - 1) / XR;
    /* one chunk: x is converted once for every tile, and not at all when the caller says this x
     * is the previous call's and that call left all of it in this workspace */
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    LT_ASSERT(st != NULL);
    lt_cuda_xcache &mm_last = st->xcache;
    const float *cs = fp8_colscale(mode, w);
    int x_ready = xh || (same_x && nchunks == 1 && mm_x_cached(mm_last, ws, x, N, xin, &l, cs));
    if (!x_ready) mm_last.x = NULL;
    if (dt == LT_DTYPE_FP8) { /* e4m3 W (NT) or W transposed in the workspace (NN), scaled per row of D */
        const uint8_t *q = (const uint8_t *)w->data, *qt = (const uint8_t *)(wsc + l.off_qt);
        const float *wscale = lt_fp8_scales(q, out, in);
        if (mode == LT_MATMUL_NN) fp8_transpose(ctx, q, out, in, (uint8_t *)qt);
        const uint8_t *x8 = (const uint8_t *)(wsc + l.off_x8);
        const float *sx = (const float *)(wsc + l.off_sx), *one = (const float *)(wsc + l.off_one);
        for (int64_t n0 = 0; n0 < N; n0 += XR) {
            const int64_t nr = N - n0 < XR ? N - n0 : XR;
            if (!(x_ready && nchunks == 1)) {
                stage_rows(ctx, &l, ws, x + n0 * xin, nr, xin, 1, cs, mode == LT_MATMUL_NN ? in : 0);
                if (nchunks == 1) mm_x_remember(mm_last, ws, x, N, xin, &l, cs);
            }
            if (mode == LT_MATMUL_NT) /* yᵀ (out, nr) = diag(scale)·q·x8ᵀ·diag(sx) */
                fp8_product(ctx, &l, wsc, out, nr, in, q, in, x8, in, beta, y + n0 * out, out, wscale, sx);
            else /* dxᵀ (in, nr) = qᵀ·(x·diag(scale))8ᵀ·diag(sx), qᵀ read from its transposed copy */
                fp8_product(ctx, &l, wsc, in, nr, out, qt, out, x8, out, beta, y + n0 * in, in, one, sx);
        }
        return;
    }
    for (int64_t r0 = 0; r0 < out; r0 += l.tile_rows) {
        const int64_t rows = out - r0 < l.tile_rows ? out - r0 : l.tile_rows;
        const __nv_bfloat16 *wt;
        if (dt == LT_DTYPE_BF16) {
            wt = (const __nv_bfloat16 *)w->data;
        } else {
            const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_MATMUL_DEQUANT);
            if (lt_dtype_is_quantized(dt)) {
                auto *k = lt_dq_ext(dt) ? dequant_groups_k<true> : dequant_groups_k<false>;
                k<<<lt_cuda_grid(rows * (in / 32), 256), 256, 0, lt_cuda_stream(ctx)>>>(dt, (const uint8_t *)w->data,
                                                                                        row_bytes, r0, rows, in, tile);
            } else {
                dim3 grid((unsigned)((in + 255) / 256), (unsigned)(rows < 65535 ? rows : 65535));
                dequant_tile_k<<<grid, 256, 0, lt_cuda_stream(ctx)>>>(dt, (const uint8_t *)w->data, row_bytes, r0, rows,
                                                                      in, tile);
            }
            LT_CUDA_LAUNCHED(ctx, "matmul: weight tile to bf16");
            lt_prof_end(ph);
            wt = tile;
        }
        for (int64_t n0 = 0; n0 < N; n0 += XR) {
            const int64_t nr = N - n0 < XR ? N - n0 : XR;
            if (!(x_ready && nchunks == 1)) {
                const int ph = lt_prof_begin(LT_DEVICE_CUDA, LT_PROF_MATMUL_CVT);
                to_bf16(ctx, x + n0 * xin, (__nv_bfloat16 *)xb, nr * xin);
                lt_prof_end(ph);
                x_ready = 1;
                if (nchunks == 1) mm_x_remember(mm_last, ws, x, N, xin, &l, cs);
            }
            const int64_t yo = mode == LT_MATMUL_NT ? n0 * out + r0 : n0 * in;
            void *yt = yh ? (void *)(yh + yo) : (void *)(y + yo);
            if (mode == LT_MATMUL_NT) /* yᵀ[r0:r0+rows, n0:] = W_tile (rows, in) · xᵀ */
                blas_run_any(ctx, 1, yh != NULL, 1, 0, rows, nr, in, 1.0f, wt, in, xb, in, beta, yt, out, ws,
                             MM_BLAS_WS, NULL, NULL);
            else /* yᵀ[:, n0:] += W_tileᵀ (in, rows) · xᵀ[r0:r0+rows, :] */
                blas_run_any(ctx, 1, yh != NULL, 0, 0, in, nr, rows, 1.0f, wt, in, xb + r0, out, r0 == 0 ? beta : 1.0f,
                             yt, in, ws, MM_BLAS_WS, NULL, NULL);
        }
    }
}

void lt_cuda_matmul_reuse(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                          float *y, void *ws, int same_x) {
    matmul_core(ctx, mode, w, x, NULL, N, beta, y, NULL, ws, same_x);
}

void lt_cuda_matmul_bf16x(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const uint16_t *xh, int64_t N,
                          float beta, float *y, void *ws) {
    matmul_core(ctx, mode, w, NULL, (const __nv_bfloat16 *)xh, N, beta, y, NULL, ws, 0);
}

void lt_cuda_matmul_bf16xy(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const uint16_t *xh, int64_t N,
                           float beta, uint16_t *yh, void *ws) {
    matmul_core(ctx, mode, w, NULL, (const __nv_bfloat16 *)xh, N, beta, NULL, (__nv_bfloat16 *)yh, ws, 0);
}

void lt_cuda_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                    float *y, void *ws) {
    lt_cuda_matmul_reuse(ctx, mode, w, x, N, beta, y, ws, mode == LT_MATMUL_NT_SAME_X);
}

void *lt_cuda_gemm_workspace(lt_ctx *ctx, size_t *bytes) {
    *bytes = LT_CUDA_GEMM_WS_BYTES;
    return gemm_workspace(ctx);
}

unsigned *lt_cuda_tickets(lt_ctx *ctx) {
    (void)gemm_workspace(ctx); /* made with it */
    return lt_cuda_state_of(ctx)->tickets;
}
