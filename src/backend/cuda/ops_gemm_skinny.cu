/* f32 GEMMs with one side of rank r <= 16: the LoRA products that read or reduce a whole
 * activation (x·Aᵀ, dy·B, dyᵀ·lu, dluᵀ·x). They are memory-bound, and cuBLASLt's f32 kernels ran
 * them at a third of the H200's bandwidth (bench matmul: x·Aᵀ at N = 8192, in = 4096
 * took 148 us for 128 MiB). Here each one is a single pass over the big operand with float4 loads,
 * fp32 accumulation in a fixed order (deterministic; no atomics); the rank-r update dlu·A into dx
 * is one float4 read-modify-write pass over C. lu·Bᵀ into y stays with cuBLASLt here (see small_k_k);
 * the fused LoRA ops (ops_lora.cu) use the bf16-input variants and the rank update at the end. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_state.cuh"

/* One output element: C = alpha·sum + beta·C (C is not read when beta is zero). */
static __device__ __forceinline__ void store_ab(float *c, float alpha, float sum, float beta) {
    *c = beta == 0.0f ? alpha * sum : alpha * sum + beta * *c;
}

/* Σ_q part[q·stride] over the K slices' partial sums, in slice order (deterministic), read
 * through L2 (__ldcg: other blocks wrote them). */
static __device__ __forceinline__ float slice_sum(const float *part, unsigned slices, int64_t stride) {
    float s = 0.0f;
    for (unsigned q = 0; q < slices; q++) s += __ldcg(part + (int64_t)q * stride);
    return s;
}

/* ---- small n: C (M, n) = alpha·A (M, K)·op(B) + beta·C, A rows contiguous in k ----
 * One warp owns SN_ROWS rows; lanes stride k four floats at a time (one float4 of each row),
 * load the matching 4 x R block of op(B) once (L1-resident: B is r x K) and reuse it for the warp's
 * rows; the lanes' partial sums meet by butterfly shuffles. 4 warps a block keep 512 blocks in
 * flight at M = 8192 (8 warps x 8 rows left SMs idle at 128 blocks). */
#define SN_WARPS 4
/* Rows per warp: each lane's 4 x R block of op(B) is reused for SN_ROWS(R) rows. 4 rows at R = 8
 * streamed all of B through L2 per 64 KiB of A (the x·Aᵀ paths took 61 ms of an 8k step); 8 halves
 * that and still leaves 256 blocks at M = 8192. R = 16 keeps 4 (register budget). */
#define SN_ROWS(R) ((R) <= 8 ? 8 : 4)

/* A warp's per-lane partial sums of ROWS rows x R columns, added across the lanes by butterfly
 * shuffles; lane j stores column j of each row (rows below M, columns below n). */
template <int ROWS, int R>
static __device__ __forceinline__ void warp_rows_store(const float (&acc)[ROWS][R], int64_t m0, int64_t M, int n,
                                                       int lane, float alpha, float beta, float *C, int64_t ldc) {
#pragma unroll
    for (int i = 0; i < ROWS; i++) {
        float mine = 0.0f;
#pragma unroll
        for (int j = 0; j < R; j++) {
            float v = acc[i][j];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
            if (lane == j) mine = v;
        }
        const int64_t m = m0 + i;
        if (m < M && lane < n) store_ab(C + m * ldc + lane, alpha, mine, beta);
    }
}

/* B_T = 1: B is (n, K), op(B)[k][j] = B[j·ldb + k]; 0: B is (K, n), op(B)[k][j] = B[k·ldb + j].
 * VB: B read as float4 (16-byte aligned, ldb % 4 == 0, and for B_T = 0 n % 4 == 0): scalar loads
 * of a 4 x R block touch four times the L1 lines, which capped the pass near HBM speed. */
template <int R, int B_T, int VB>
__global__ void __launch_bounds__(SN_WARPS * 32)
    small_n_k(int64_t M, int n, int64_t K, float alpha, const float *__restrict__ A, int64_t lda,
              const float *__restrict__ B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int ROWS = SN_ROWS(R);
    const int64_t per_block = SN_WARPS * ROWS;
    for (int64_t m0 = blockIdx.x * per_block + warp * ROWS; m0 < M; m0 += (int64_t)gridDim.x * per_block) {
        float acc[ROWS][R];
#pragma unroll
        for (int i = 0; i < ROWS; i++)
#pragma unroll
            for (int j = 0; j < R; j++) acc[i][j] = 0.0f;
        for (int64_t k = lane * 4; k < K; k += 128) { /* K % 4 == 0 */
            float b[4][R];
            if (VB && B_T) {
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const float4 v = j < n ? __ldg((const float4 *)(B + j * ldb + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
                    b[0][j] = v.x, b[1][j] = v.y, b[2][j] = v.z, b[3][j] = v.w;
                }
            } else if (VB) {
#pragma unroll
                for (int t = 0; t < 4; t++)
#pragma unroll
                    for (int q = 0; q < R / 4; q++) {
                        const float4 v = 4 * q < n ? __ldg((const float4 *)(B + (k + t) * ldb + 4 * q))
                                                   : make_float4(0.f, 0.f, 0.f, 0.f);
                        b[t][4 * q] = v.x, b[t][4 * q + 1] = v.y, b[t][4 * q + 2] = v.z, b[t][4 * q + 3] = v.w;
                    }
            } else {
#pragma unroll
                for (int t = 0; t < 4; t++)
#pragma unroll
                    for (int j = 0; j < R; j++)
                        b[t][j] = j < n ? __ldg(B_T ? B + j * ldb + k + t : B + (k + t) * ldb + j) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < ROWS; i++) {
                if (m0 + i >= M) break;
                const float4 a = __ldg((const float4 *)(A + (m0 + i) * lda + k));
#pragma unroll
                for (int j = 0; j < R; j++) acc[i][j] += a.x * b[0][j] + a.y * b[1][j] + a.z * b[2][j] + a.w * b[3][j];
            }
        }
        warp_rows_store(acc, m0, M, n, lane, alpha, beta, C, ldc);
    }
}

/* ---- small k: C (M, N) = alpha·A (M, K)·B (K, N) + beta·C, K <= 16: a rank-K update streaming C ----
 * One thread per four consecutive columns of a row (float4 read-modify-write of C): the thread
 * takes the row's K values of A (the same for the whole row: broadcast loads) and a K x 4 block of
 * B (float4 rows, coalesced across the warp, L2-resident: B is K x N). Only B untransposed
 * (dlu·A into dx): with B transposed ((N, K), lu·Bᵀ into y) a thread's four B rows sit 4·ldb
 * floats apart, so every lane of a load touched its own cache line (32 L1 wavefronts per load);
 * that version made the whole 8k step 1.76 s instead of ~1.15 s, and lu·Bᵀ stays with
 * cuBLASLt. */
template <int KMAX>
__global__ void small_k_k(int64_t M, int64_t N, int K, float alpha, const float *__restrict__ A, int64_t lda,
                          const float *__restrict__ B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int64_t N4 = N / 4, total = M * N4;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t m = i / N4, c = 4 * (i - m * N4);
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < KMAX; j++) {
            if (j >= K) break;
            const float u = __ldg(A + m * lda + j);
            const float4 v = __ldg((const float4 *)(B + (int64_t)j * ldb + c));
            o.x += u * v.x, o.y += u * v.y, o.z += u * v.z, o.w += u * v.w;
        }
        float4 *cp = (float4 *)(C + m * ldc + c);
        if (beta == 0.0f) {
            *cp = make_float4(alpha * o.x, alpha * o.y, alpha * o.z, alpha * o.w);
        } else {
            const float4 c0 = *cp;
            *cp = make_float4(alpha * o.x + beta * c0.x, alpha * o.y + beta * c0.y, alpha * o.z + beta * c0.z,
                              alpha * o.w + beta * c0.w);
        }
    }
}

/* ---- tall reduction: out[p][j] = Σ_k X[k][p]·U[k][j], P wide, n <= R, K long ----
 * A block takes 512 columns of X (four per thread, float4) and one slice of k; its two thread
 * groups take alternate rows and meet in shared memory. Each slice's partial (R, P) goes to the
 * workspace; a second kernel adds the slices in order and applies alpha, beta and C's layout. */
#define TR_THREADS 128
#define TR_GROUPS 2
#define TR_COLS (TR_THREADS * 4)

/* Four consecutive elements of X: one 16-byte load. */
static __device__ __forceinline__ float4 ld4(const float *p) { return __ldg((const float4 *)p); }

template <int R, typename XT>
__global__ void __launch_bounds__(TR_THREADS *TR_GROUPS)
    tall_k(int64_t P, int n, int64_t K, int64_t kslice, const XT *__restrict__ X, int64_t ldx,
           const float *__restrict__ U, int64_t ldu, float *__restrict__ part) {
    __shared__ float red[R][TR_COLS];
    const int g = threadIdx.x / TR_THREADS, t = threadIdx.x % TR_THREADS;
    const int64_t p = (int64_t)blockIdx.x * TR_COLS + 4 * t;
    const int64_t k0 = (int64_t)blockIdx.y * kslice, k1 = k0 + kslice < K ? k0 + kslice : K;
    float acc[4][R];
#pragma unroll
    for (int c = 0; c < 4; c++)
#pragma unroll
        for (int j = 0; j < R; j++) acc[c][j] = 0.0f;
    if (p < P) { /* P % 4 == 0 */
#pragma unroll 4
        for (int64_t k = k0 + g; k < k1; k += TR_GROUPS) {
            const float4 x = ld4(X + k * ldx + p);
#pragma unroll
            for (int j = 0; j < R; j++) {
                const float u = j < n ? __ldg(U + k * ldu + j) : 0.0f;
                acc[0][j] += x.x * u, acc[1][j] += x.y * u, acc[2][j] += x.z * u, acc[3][j] += x.w * u;
            }
        }
    }
    if (g == 1)
#pragma unroll
        for (int j = 0; j < R; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) red[j][4 * t + c] = acc[c][j];
    __syncthreads();
    if (g == 0 && p < P)
#pragma unroll
        for (int j = 0; j < R; j++)
            if (j < n)
                *(float4 *)(part + ((int64_t)blockIdx.y * R + j) * P + p) =
                    make_float4(acc[0][j] + red[j][4 * t], acc[1][j] + red[j][4 * t + 1], acc[2][j] + red[j][4 * t + 2],
                                acc[3][j] + red[j][4 * t + 3]);
}

/* c_pj = 1: C[p·ldc + j] (the result is (P, n)); 0: C[j·ldc + p] (it is (n, P)). */
static __global__ void tall_reduce_k(int64_t P, int n, int R, int splits, const float *__restrict__ part, float alpha,
                                     float beta, float *C, int64_t ldc, int c_pj) {
    const int64_t total = (int64_t)n * P;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i / P, p = i - j * P;
        const float sum = slice_sum(part + j * P + p, (unsigned)splits, (int64_t)R * P);
        store_ab(c_pj ? C + p * ldc + j : C + j * ldc + p, alpha, sum, beta);
    }
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* Blocks that fill an H200 (132 SMs) a few times over. */
#define SKINNY_TARGET_BLOCKS 528

template <typename XT>
static void tall(lt_ctx *ctx, int64_t P, int n, int64_t K, float alpha, const XT *X, int64_t ldx, const float *U,
                 int64_t ldu, float beta, float *C, int64_t ldc, int c_pj, void *ws, size_t ws_bytes) {
    const int R = n <= 8 ? 8 : 16;
    const int64_t colblocks = (P + TR_COLS - 1) / TR_COLS;
    int64_t splits = (SKINNY_TARGET_BLOCKS + colblocks - 1) / colblocks;
    const int64_t most = (int64_t)(ws_bytes / ((size_t)R * (size_t)P * sizeof(float)));
    if (splits > most) splits = most;
    if (splits > K / 64) splits = K / 64; /* at least 64 rows a slice */
    if (splits < 1) splits = 1;
    const int64_t kslice = (K + splits - 1) / splits;
    splits = (K + kslice - 1) / kslice;
    dim3 grid((unsigned)colblocks, (unsigned)splits);
    float *part = (float *)ws;
    if (R == 8)
        tall_k<8, XT><<<grid, TR_THREADS * TR_GROUPS, 0, lt_cuda_stream(ctx)>>>(P, n, K, kslice, X, ldx, U, ldu, part);
    else
        tall_k<16, XT><<<grid, TR_THREADS * TR_GROUPS, 0, lt_cuda_stream(ctx)>>>(P, n, K, kslice, X, ldx, U, ldu, part);
    LT_CUDA_LAUNCHED(ctx, "gemm: tall reduction");
    tall_reduce_k<<<lt_cuda_grid((int64_t)n * P, 256), 256, 0, lt_cuda_stream(ctx)>>>(P, n, R, (int)splits, part, alpha,
                                                                                      beta, C, ldc, c_pj);
    LT_CUDA_LAUNCHED(ctx, "gemm: tall reduction sum");
}

/* Runs the row-major gemm C (M, N) = alpha·op(A)·op(B) + beta·C here when it is one of the skinny
 * shapes above (K > 0) and returns 1; 0 leaves it to cuBLASLt. ws: at least ws_bytes of device
 * scratch (the gemm's fixed workspace). */
extern "C" int lt_cuda_gemm_skinny(lt_ctx *ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                                   const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                   int64_t ldc, void *ws, size_t ws_bytes) {
    if (!ta && N <= 16 && M >= 64 && K >= 128 && K % 4 == 0 && lda % 4 == 0 && aligned16(A)) {
        /* x·Aᵀ (tb = 1) and dy·B (tb = 0): one pass over A's rows */
        const int64_t per_block = SN_WARPS * SN_ROWS(N <= 8 ? 8 : 16);
        int64_t blocks = (M + per_block - 1) / per_block;
        if (blocks > 65535) blocks = 65535;
        const int n = (int)N;
        const int vb = aligned16(B) && ldb % 4 == 0 && (tb || n % 4 == 0);
        const unsigned g = (unsigned)blocks, th = SN_WARPS * 32;
#define SMALL_N(R_, T_, V_) \
    small_n_k<R_, T_, V_><<<g, th, 0, lt_cuda_stream(ctx)>>>(M, n, K, alpha, A, lda, B, ldb, beta, C, ldc)
        if (N <= 8) {
            if (tb) vb ? SMALL_N(8, 1, 1) : SMALL_N(8, 1, 0);
            else vb ? SMALL_N(8, 0, 1) : SMALL_N(8, 0, 0);
        } else {
            if (tb) vb ? SMALL_N(16, 1, 1) : SMALL_N(16, 1, 0);
            else vb ? SMALL_N(16, 0, 1) : SMALL_N(16, 0, 0);
        }
#undef SMALL_N
        LT_CUDA_LAUNCHED(ctx, "gemm: small n");
        return 1;
    }
    if (!ta && !tb && K <= 16 && M >= 64 && N % 4 == 0 && ldc % 4 == 0 && ldb % 4 == 0 && aligned16(C) &&
        aligned16(B)) {
        /* dlu·A into dx: one pass over C */
        const unsigned g = lt_cuda_grid(M * (N / 4), 256);
        if (K <= 8) small_k_k<8><<<g, 256, 0, lt_cuda_stream(ctx)>>>(M, N, (int)K, alpha, A, lda, B, ldb, beta, C, ldc);
        else small_k_k<16><<<g, 256, 0, lt_cuda_stream(ctx)>>>(M, N, (int)K, alpha, A, lda, B, ldb, beta, C, ldc);
        LT_CUDA_LAUNCHED(ctx, "gemm: small k");
        return 1;
    }
    if (ta && !tb && K >= 1024) {
        /* dluᵀ·x (M = r): X = B (K, N), U = A (K, M), C (M, N) */
        if (M <= 16 && N % 4 == 0 && ldb % 4 == 0 && aligned16(B) &&
            (size_t)16 * (size_t)N * sizeof(float) <= ws_bytes) {
            tall(ctx, N, (int)M, K, alpha, B, ldb, A, lda, beta, C, ldc, 0, ws, ws_bytes);
            return 1;
        }
        /* dyᵀ·lu (N = r): X = A (K, M), U = B (K, N), C (M, N) */
        if (N <= 16 && M % 4 == 0 && lda % 4 == 0 && aligned16(A) &&
            (size_t)16 * (size_t)M * sizeof(float) <= ws_bytes) {
            tall(ctx, M, (int)N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, ws, ws_bytes);
            return 1;
        }
    }
    return 0;
}

/* ---- bf16 x, f32 factors: C (M, n) = alpha·A (M, K, bf16)·op(B) + beta·C, n <= R ----
 * small_n_k's scheme with A read as bf16, eight elements (16 bytes) a lane per step, so the pass
 * over an activation moves half the bytes: the LoRA down-products x·Aᵀ (B_T = 1, B = A (r, K))
 * and dy·B (B_T = 0, B (K, r)) read the bf16 copy the weight matmul made of x or dy. B stays f32
 * (fp32 accumulate); only the activation is rounded, as the base product already rounds it. */
#define SNH_ROWS(R) ((R) <= 8 ? 4 : 2)

template <int R, int B_T>
__global__ void __launch_bounds__(SN_WARPS * 32)
    small_n_h_k(int64_t M, int n, int64_t K, float alpha, const __nv_bfloat16 *__restrict__ A, int64_t lda,
                const float *__restrict__ B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr int ROWS = SNH_ROWS(R);
    const int64_t per_block = SN_WARPS * ROWS;
    for (int64_t m0 = blockIdx.x * per_block + warp * ROWS; m0 < M; m0 += (int64_t)gridDim.x * per_block) {
        float acc[ROWS][R];
#pragma unroll
        for (int i = 0; i < ROWS; i++)
#pragma unroll
            for (int j = 0; j < R; j++) acc[i][j] = 0.0f;
        for (int64_t k = lane * 8; k < K; k += 256) { /* K % 8 == 0 */
            float b[8][R];
            if (B_T) {
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const float4 v0 =
                        j < n ? __ldg((const float4 *)(B + j * ldb + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
                    const float4 v1 =
                        j < n ? __ldg((const float4 *)(B + j * ldb + k + 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
                    b[0][j] = v0.x, b[1][j] = v0.y, b[2][j] = v0.z, b[3][j] = v0.w;
                    b[4][j] = v1.x, b[5][j] = v1.y, b[6][j] = v1.z, b[7][j] = v1.w;
                }
            } else {
#pragma unroll
                for (int t = 0; t < 8; t++)
#pragma unroll
                    for (int q = 0; q < R / 4; q++) {
                        const float4 v = 4 * q < n ? __ldg((const float4 *)(B + (k + t) * ldb + 4 * q))
                                                   : make_float4(0.f, 0.f, 0.f, 0.f);
                        b[t][4 * q] = v.x, b[t][4 * q + 1] = v.y, b[t][4 * q + 2] = v.z, b[t][4 * q + 3] = v.w;
                    }
            }
#pragma unroll
            for (int i = 0; i < ROWS; i++) {
                if (m0 + i >= M) break;
                const uint4 raw = __ldg((const uint4 *)(A + (m0 + i) * lda + k));
                const uint32_t w4[4] = {raw.x, raw.y, raw.z, raw.w};
                float a[8];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w4[q]));
                    a[2 * q] = f.x, a[2 * q + 1] = f.y;
                }
#pragma unroll
                for (int j = 0; j < R; j++) {
                    float t = acc[i][j];
#pragma unroll
                    for (int e = 0; e < 8; e++) t += a[e] * b[e][j];
                    acc[i][j] = t;
                }
            }
        }
        warp_rows_store(acc, m0, M, n, lane, alpha, beta, C, ldc);
    }
}

/* ---- the same products on the tensor cores: C (M, n <= 16) = alpha·A (M, K, bf16)·Bᵀ + beta·C ----
 * small_n_h_k reads its f32 factor block once per warp for every four rows of A: four times the
 * bytes of A through L1/L2 at r = 8, which held x·Aᵀ near a third and dy·B (B read across its
 * rows) near a sixth of the H200's bandwidth (52 and 122 us for 64-90 MiB of bf16 activation in an
 * 8k Qwen3-8B step). Here the f32 factor is split into bf16 hi and lo parts (hi = bf16(B),
 * lo = bf16(B - hi): B to ~16 bits, the products and sums in fp32 on the tensor cores), as it is
 * loaded or, read down its columns, by split_bt_k first. A block of SM_WARPS warps takes SM_ROWS
 * rows of A and one of KS slices of K, which its warps share out 32 columns at a time; each warp
 * runs mma.sync m16n8k16 over its rows with the factor fragment reused for SM_MT row tiles, and
 * the warps' sums meet in shared memory. The KS
 * slices' sums go to the workspace, and the last block of a row block to finish adds them in order
 * (KS > 1 keeps enough loads in flight: one block per 64 rows left the SMs at 8 warps and a third
 * of the bandwidth). Everything is summed in a fixed order (deterministic). The k order inside a
 * 32-wide step is permuted identically for A and B (a lane loads 16 contiguous bytes of a row of
 * A and 32 of B's), so every load of A is a 16-byte one. */
#define SM_WARPS 8
#define SM_MT 4
#define SM_ROWS (16 * SM_MT)

/* Eight consecutive elements of an activation row (A of the small-n kernel, X of the tall
 * reduction) as bf16 (16 bytes): one load, or two f32 loads rounded to nearest. */
static __device__ __forceinline__ uint4 ld8_bf16(const __nv_bfloat16 *p) { return __ldg((const uint4 *)p); }
static __device__ __forceinline__ uint4 ld8_bf16(const float *p) {
    const float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)(p + 4));
    return make_uint4(lt_pack_bf16(a.x, a.y), lt_pack_bf16(a.z, a.w), lt_pack_bf16(b.x, b.y), lt_pack_bf16(b.z, b.w));
}

/* The bf16 hi and lo parts of two f32 values, each as one pair (the first value in the low half):
 * hi = bf16(v) and lo = bf16(v - hi), both rounded to nearest. */
static __device__ __forceinline__ void split2(float a, float b, uint32_t &hi, uint32_t &lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    const float2 back = __bfloat1622float2(h);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = lt_pack_bf16(a - back.x, b - back.y);
}

/* Whether this block is the last of the `blocks` slices of its output block to finish (tickets
 * from lt_cuda_tickets, one per output block). Every thread's partial sums are written before the
 * ticket is taken; the last block puts the ticket back to zero and then reads the other slices'
 * sums through L2 (__ldcg). */
static __device__ __forceinline__ bool last_slice(unsigned *ticket, unsigned blocks) {
    __shared__ unsigned last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(ticket, 1u) == blocks - 1;
        if (last) atomicExch(ticket, 0u);
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* One product of a batch of small_n_mma_k (grid.z picks it): its activation A (M, K), factor B
 * (or its hi/lo rows Bh, Bl), output C, its own K and the slices its K is cut into (ks of them,
 * slice k-steps each; part and tickets its own share of the workspace and counters). */
typedef struct sn_prob {
    const void *A;
    const float *B;
    const __nv_bfloat16 *Bh, *Bl;
    float *C, *part;
    unsigned *tickets;
    int64_t lda, ldb, ldc, K, slice, ks;
    float alpha, beta;
} sn_prob;
typedef struct sn_batch {
    sn_prob p[LT_CUDA_SKINNY_BATCH];
} sn_batch;

/* hi/lo (rows, Kp) bf16 of B (K, n) transposed; rows n.. and columns K.. zero. */
static __global__ void split_bt_k(int n, int rows, int64_t K, int64_t Kp, const float *__restrict__ B, int64_t ldb,
                                  __nv_bfloat16 *__restrict__ hi, __nv_bfloat16 *__restrict__ lo) {
    const int64_t total = (int64_t)rows * Kp;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i / Kp, k = i - j * Kp;
        const float v = j < n && k < K ? B[k * ldb + j] : 0.0f;
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[i] = h;
        lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
}

/* part == NULL: C = alpha·sum + beta·C here; else the slice's sums go to part[blockIdx.y] (8·NT, M),
 * and the last slice of the row block to finish adds them all into C. XT = float: A is f32,
 * rounded to bf16 as it is loaded (to nearest, as the matmul's staging copy rounds it: a
 * recompute's lu from the f32 x takes the same values as the forward's from that copy).
 * PRE = 0: the factor is B (n, K) in f32, op(B)ᵀ row j = B's row j (x·Aᵀ), read as two float4 a
 * step and split here. PRE = 1: B (K, n) (dy·B), whose column j would take eight scalar loads a
 * step (on an H100 that made the Qwen3-8B-wide dy·B passes slower than a separate split launch):
 * split_bt_k has laid it out as bf16 hi/lo rows Bh, Bl (8·NT, K) first. */
template <int NT, typename XT, int PRE>
__global__ void __launch_bounds__(SM_WARPS * 32) small_n_mma_k(const __grid_constant__ sn_batch bt, int64_t M, int n) {
    const sn_prob &pb = bt.p[blockIdx.z];
    if ((int64_t)blockIdx.y >= pb.ks) return; /* a product of the batch cut into fewer slices */
    const int64_t K = pb.K, slice = pb.slice, lda = pb.lda, ldb = pb.ldb, ldc = pb.ldc;
    const float alpha = pb.alpha, beta = pb.beta;
    const XT *__restrict__ A = (const XT *)pb.A;
    const float *__restrict__ B = pb.B;
    const __nv_bfloat16 *__restrict__ Bh = pb.Bh, *__restrict__ Bl = pb.Bl;
    float *C = pb.C, *__restrict__ part = pb.part;
    unsigned *tickets = pb.tickets;
    __shared__ float red[SM_WARPS][SM_ROWS][8 * NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t m0 = (int64_t)blockIdx.x * SM_ROWS;
    float acc[SM_MT][NT][4];
#pragma unroll
    for (int i = 0; i < SM_MT; i++)
#pragma unroll
        for (int q = 0; q < NT; q++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][q][e] = 0.0f;
    /* rows past M read row M - 1 (their sums are never stored), so the loads need no predicate */
    const XT *arow[SM_MT][2];
#pragma unroll
    for (int i = 0; i < SM_MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t row = m0 + 16 * i + g + 8 * h;
            arow[i][h] = A + (row < M ? row : M - 1) * lda + 8 * t;
        }
    /* factor row j = 8q + g of op(B)ᵀ from k = 8t on; rows past n are zero (PRE = 0: read as row 0,
     * PRE = 1: split_bt_k wrote zeros there) */
    const float *brow[NT];                        /* PRE = 0 */
    bool bok[NT];                                 /* PRE = 0 */
    const __nv_bfloat16 *bh_row[NT], *bl_row[NT]; /* PRE = 1 */
#pragma unroll
    for (int q = 0; q < NT; q++) {
        const int j = 8 * q + g;
        if constexpr (PRE) {
            bh_row[q] = Bh + (int64_t)j * K + 8 * t, bl_row[q] = Bl + (int64_t)j * K + 8 * t;
        } else {
            bok[q] = j < n;
            brow[q] = B + (int64_t)(bok[q] ? j : 0) * ldb + 8 * t;
        }
    }
    const int64_t steps = K / 32; /* K % 32 == 0 */
    const int64_t s_end = ((int64_t)blockIdx.y + 1) * slice < steps ? ((int64_t)blockIdx.y + 1) * slice : steps;
    for (int64_t s = (int64_t)blockIdx.y * slice + warp; s < s_end; s += SM_WARPS) {
        const int64_t k = s * 32;
        uint4 a[SM_MT][2];
        uint32_t bh[NT][4], bl[NT][4];
#pragma unroll
        for (int i = 0; i < SM_MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) a[i][h] = ld8_bf16(arow[i][h] + k);
#pragma unroll
        for (int q = 0; q < NT; q++) {
            if constexpr (PRE) {
                const uint4 h = __ldg((const uint4 *)(bh_row[q] + k)), l = __ldg((const uint4 *)(bl_row[q] + k));
                bh[q][0] = h.x, bh[q][1] = h.y, bh[q][2] = h.z, bh[q][3] = h.w;
                bl[q][0] = l.x, bl[q][1] = l.y, bl[q][2] = l.z, bl[q][3] = l.w;
            } else {
                const float4 b0 = __ldg((const float4 *)(brow[q] + k)), b1 = __ldg((const float4 *)(brow[q] + k + 4));
                const float v[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
                for (int e = 0; e < 4; e++)
                    split2(bok[q] ? v[2 * e] : 0.0f, bok[q] ? v[2 * e + 1] : 0.0f, bh[q][e], bl[q][e]);
            }
        }
#pragma unroll
        for (int i = 0; i < SM_MT; i++) {
            /* row g / g+8, physical k 8t..8t+3 as logical (2t, 2t+1 | 2t+8, 2t+9), then 8t+4..8t+7 */
            const uint32_t f0[4] = {a[i][0].x, a[i][1].x, a[i][0].y, a[i][1].y};
            const uint32_t f1[4] = {a[i][0].z, a[i][1].z, a[i][0].w, a[i][1].w};
#pragma unroll
            for (int q = 0; q < NT; q++) {
                lt_mma16816(acc[i][q], f0, bh[q][0], bh[q][1]);
                lt_mma16816(acc[i][q], f0, bl[q][0], bl[q][1]);
                lt_mma16816(acc[i][q], f1, bh[q][2], bh[q][3]);
                lt_mma16816(acc[i][q], f1, bl[q][2], bl[q][3]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < SM_MT; i++)
#pragma unroll
        for (int q = 0; q < NT; q++) {
            const int r = 16 * i + g, c = 8 * q + 2 * t;
            red[warp][r][c] = acc[i][q][0], red[warp][r][c + 1] = acc[i][q][1];
            red[warp][r + 8][c] = acc[i][q][2], red[warp][r + 8][c + 1] = acc[i][q][3];
        }
    __syncthreads();
    for (int e = threadIdx.x; e < SM_ROWS * 8 * NT; e += SM_WARPS * 32) {
        const int r = e / (8 * NT), j = e - r * (8 * NT);
        const int64_t m = m0 + r;
        if (m >= M || j >= n) continue;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < SM_WARPS; w++) sum += red[w][r][j];
        if (part) part[((int64_t)blockIdx.y * (8 * NT) + j) * M + m] = sum;
        else store_ab(C + m * ldc + j, alpha, sum, beta);
    }
    if (!part || !last_slice(tickets + blockIdx.x, (unsigned)pb.ks)) return;
    for (int e = threadIdx.x; e < SM_ROWS * 8 * NT; e += SM_WARPS * 32) {
        const int r = e / (8 * NT), j = e - r * (8 * NT);
        const int64_t m = m0 + r;
        if (m < M && j < n)
            store_ab(C + m * ldc + j, alpha, slice_sum(part + j * M + m, (unsigned)pb.ks, 8 * NT * M), beta);
    }
}

/* Blocks of the tensor-core kernels the H200 keeps resident with room to spare (132 SMs, 2-3 a SM).
 * A grid is cut into slices only below this many output blocks, so each has a ticket. */
#define MMA_TARGET_BLOCKS 396
static_assert(MMA_TARGET_BLOCKS <= LT_CUDA_TICKETS, "a ticket for every output block of a sliced grid");

/* How many slices a tensor-core kernel's grid cuts K into, for `blocks` blocks along the other
 * side and `steps` k-steps shared by `warps` warps a block: enough slices for MMA_TARGET_BLOCKS,
 * at least two steps for every warp of a slice, the slices' partial sums (slice_bytes each)
 * within `room`; one when no split fits. *slice_steps: the k-steps of a slice. */
static int64_t k_slices(int64_t blocks, int64_t steps, int warps, size_t slice_bytes, size_t room,
                        int64_t *slice_steps) {
    int64_t ks = (MMA_TARGET_BLOCKS + blocks - 1) / blocks;
    if (ks > steps / (2 * warps)) ks = steps / (2 * warps);
    if (ks > 1 && (size_t)ks * slice_bytes > room) ks = (int64_t)(room / slice_bytes);
    if (ks < 1 || blocks > 65535) ks = 1;
    *slice_steps = (steps + ks - 1) / ks;
    return (steps + *slice_steps - 1) / *slice_steps;
}

/* Whether skinny_h_n takes one product of K columns (its A, B and strides). */
static int sn_takes(int tb, int64_t N, const lt_cuda_skinny_op &o) {
    return o.k >= 8 && o.k % 8 == 0 && o.lda % 8 == 0 && (uintptr_t)o.a % 16 == 0 && aligned16(o.f) && o.ldf % 4 == 0 &&
        (tb || N % 4 == 0);
}

/* The CUDA-core kernel (bf16 A) for one product. */
static void sn_cuda_cores(cudaStream_t st, int tb, int64_t M, int n, const lt_cuda_skinny_op &o) {
    const __nv_bfloat16 *a = (const __nv_bfloat16 *)o.a;
    const int64_t per_block = SN_WARPS * SNH_ROWS(n <= 8 ? 8 : 16);
    int64_t blocks = (M + per_block - 1) / per_block;
    if (blocks > 65535) blocks = 65535;
    const unsigned g = (unsigned)blocks, th = SN_WARPS * 32;
    if (n <= 8) {
        if (tb) small_n_h_k<8, 1><<<g, th, 0, st>>>(M, n, o.k, o.alpha, a, o.lda, o.f, o.ldf, o.beta, o.c, o.ldc);
        else small_n_h_k<8, 0><<<g, th, 0, st>>>(M, n, o.k, o.alpha, a, o.lda, o.f, o.ldf, o.beta, o.c, o.ldc);
    } else {
        if (tb) small_n_h_k<16, 1><<<g, th, 0, st>>>(M, n, o.k, o.alpha, a, o.lda, o.f, o.ldf, o.beta, o.c, o.ldc);
        else small_n_h_k<16, 0><<<g, th, 0, st>>>(M, n, o.k, o.alpha, a, o.lda, o.f, o.ldf, o.beta, o.c, o.ldc);
    }
}

extern "C" int lt_cuda_skinny_h_n_batch(lt_ctx *ctx, int tb, int G, const lt_cuda_skinny_op *ops, int64_t M, int64_t N,
                                        int a_f32, void *ws, size_t ws_bytes) {
    if (G < 1 || G > LT_CUDA_SKINNY_BATCH || M <= 0 || N <= 0 || N > 16) return 0;
    const int n = (int)N, nt = N <= 8 ? 1 : 2;
    const int64_t mb = (M + SM_ROWS - 1) / SM_ROWS;
    const size_t slice_row = (size_t)M * (size_t)(8 * nt) * sizeof(float);
    sn_batch bt;
    memset(&bt, 0, sizeof bt);
    size_t used = 0; /* the batch's split factors and partial sums, laid out one after another */
    int every_mma = 1, ks_max = 1;
    for (int g = 0; g < G; g++) {
        const lt_cuda_skinny_op &o = ops[g];
        if (!sn_takes(tb, N, o)) return 0;
        /* dy·B (tb = 0): B laid out as bf16 hi/lo rows, then the slices */
        const size_t half = tb ? 0 : (size_t)(8 * nt) * (size_t)o.k * sizeof(__nv_bfloat16);
        const int mma = o.k % 32 == 0 && ws && ((uintptr_t)ws % 16) == 0 && 2 * half <= ws_bytes;
        if (!mma && a_f32) return 0; /* the CUDA-core kernel reads bf16 only */
        every_mma &= mma;
        if (!mma) continue;
        sn_prob &p = bt.p[g];
        p.ks = k_slices(mb, o.k / 32, SM_WARPS, slice_row, ws_bytes - 2 * half, &p.slice);
        p.Bh = (const __nv_bfloat16 *)((char *)ws + used);
        p.Bl = (const __nv_bfloat16 *)((char *)ws + used + half);
        used += 2 * half;
        p.part = p.ks > 1 ? (float *)((char *)ws + used) : NULL;
        used += p.ks > 1 ? (size_t)p.ks * slice_row : 0;
        p.A = o.a, p.B = o.f, p.C = o.c, p.lda = o.lda, p.ldb = o.ldf, p.ldc = o.ldc, p.K = o.k;
        p.alpha = o.alpha, p.beta = o.beta;
        /* ks > 1 only below MMA_TARGET_BLOCKS row blocks: G of them fit LT_CUDA_TICKETS */
        p.tickets = p.part ? lt_cuda_tickets(ctx) + (size_t)g * (size_t)mb : NULL;
        if (p.ks > ks_max) ks_max = (int)p.ks;
    }
    cudaStream_t st = lt_cuda_stream(ctx);
    if (G > 1 && (!every_mma || used > ws_bytes)) { /* one after another, each with the whole workspace */
        for (int g = 0; g < G; g++) lt_cuda_skinny_h_n_batch(ctx, tb, 1, &ops[g], M, N, a_f32, ws, ws_bytes);
        return 1;
    }
    if (!every_mma) {
        sn_cuda_cores(st, tb, M, n, ops[0]);
        LT_CUDA_LAUNCHED(ctx, "lora: small n (bf16)");
        return 1;
    }
    for (int g = 0; g < G && !tb; g++) {
        const sn_prob &p = bt.p[g];
        split_bt_k<<<lt_cuda_grid((int64_t)(8 * nt) * p.K, 256), 256, 0, st>>>(n, 8 * nt, p.K, p.K, p.B, p.ldb,
                                                                               (__nv_bfloat16 *)p.Bh,
                                                                               (__nv_bfloat16 *)p.Bl);
        LT_CUDA_LAUNCHED(ctx, "lora: factor to bf16 hi/lo");
    }
    dim3 grid((unsigned)mb, (unsigned)ks_max, (unsigned)G);
#define SMALL_N_MMA(NT_, XT_, PRE_) small_n_mma_k<NT_, XT_, PRE_><<<grid, SM_WARPS * 32, 0, st>>>(bt, M, n)
#define SMALL_N_MMA_TB(NT_, XT_) tb ? SMALL_N_MMA(NT_, XT_, 0) : SMALL_N_MMA(NT_, XT_, 1)
    if (a_f32) nt == 1 ? SMALL_N_MMA_TB(1, float) : SMALL_N_MMA_TB(2, float);
    else nt == 1 ? SMALL_N_MMA_TB(1, __nv_bfloat16) : SMALL_N_MMA_TB(2, __nv_bfloat16);
#undef SMALL_N_MMA_TB
#undef SMALL_N_MMA
    LT_CUDA_LAUNCHED(ctx, "lora: small n (tensor cores)");
    return 1;
}

extern "C" int lt_cuda_skinny_h_n(lt_ctx *ctx, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                                  int a_f32, int64_t lda, const float *B, int64_t ldb, float beta, float *C,
                                  int64_t ldc, void *ws, size_t ws_bytes) {
    const lt_cuda_skinny_op o = {A, lda, B, ldb, C, ldc, K, alpha, beta};
    return lt_cuda_skinny_h_n_batch(ctx, tb, 1, &o, M, N, a_f32, ws, ws_bytes);
}
/* ---- the tall reduction on the tensor cores: C (P, n) or (n, P) = alpha·Xᵀ·U + beta·C ----
 * tall_k streams X four columns (8 bytes of bf16) a thread with two k-groups a block: a few loads
 * in flight per SM, and 75-90 us for 64-170 MiB in an 8k Qwen3-8B step, three to four times the
 * bytes over the bandwidth. Here Cᵀ (16, P) = Uᵀ·X runs as mma.sync m16n8k16 with Uᵀ (split into
 * bf16 hi and lo parts as it is loaded, as small_n_mma_k does with its factor; zero past n and
 * past K) as the A operand and X as B: a lane loads 16 bytes (8 columns) of four X rows, and byte
 * permutes pair the rows' elements column by column into the B fragments of eight 8-column tiles,
 * so a warp covers 64 columns with coalesced 16-byte loads and no shared-memory transpose (the
 * rows inside a 16-step are permuted identically for U). f32 X is read as f32 and rounded to bf16,
 * as the activation of every LoRA product on this backend is. A block's warps split K and meet in
 * shared memory; the slices of K over blocks go to the workspace, and the last slice of a column
 * block to finish adds them in order. */
#define TM_WARPS 8
#define TM_COLS 64

/* Element e of each of two rows' eight, as one bf16 pair (the first row's in the low half). */
static __device__ __forceinline__ uint32_t pair_col(const uint4 &r0, const uint4 &r1, int e) {
    const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
    return __byte_perm(w0[e >> 1], w1[e >> 1], (e & 1) ? 0x7632 : 0x5410);
}

/* U (K, n) f32; K is walked in 16-steps up to Kp = K rounded up to 16. part == NULL: C written
 * here; else as small_n_mma_k (part[blockIdx.y] is (16, P)). UNR: the k loop unrolled that many
 * times (two steps' loads in flight a warp), where each warp has enough steps of its slice. */
/* One product of a batch of tall_mma_k (grid.z picks it): X (K, P), U, C, its P (cb column
 * blocks) and its own slicing of K (ks slices of `slice` rows; part and tickets its share). */
typedef struct tall_prob {
    const void *X;
    const float *U;
    float *C, *part;
    unsigned *tickets;
    int64_t P, cb, ldx, ldu, ldc, slice, ks;
    float alpha, beta;
} tall_prob;
typedef struct tall_batch {
    tall_prob p[LT_CUDA_SKINNY_BATCH];
} tall_batch;

template <typename XT, int U2, int UNR>
__global__ void __launch_bounds__(TM_WARPS * 32)
    tall_mma_k(const __grid_constant__ tall_batch bt, int n, int64_t K, int64_t Kp, int c_pj) {
    const tall_prob &pb = bt.p[blockIdx.z];
    if ((int64_t)blockIdx.x >= pb.cb || (int64_t)blockIdx.y >= pb.ks) return; /* a narrower or less cut product */
    const int64_t P = pb.P, slice = pb.slice, ldx = pb.ldx, ldu = pb.ldu, ldc = pb.ldc;
    const float alpha = pb.alpha, beta = pb.beta;
    const XT *__restrict__ X = (const XT *)pb.X;
    const float *__restrict__ U = pb.U;
    float *C = pb.C, *__restrict__ part = pb.part;
    unsigned *tickets = pb.tickets;
    __shared__ float red[TM_WARPS][16][TM_COLS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int64_t p0 = (int64_t)blockIdx.x * TM_COLS;
    /* column groups past P read the last group (P % 8 == 0); their sums are never stored */
    const int64_t pc = p0 + 8 * g < P ? p0 + 8 * g : P - 8;
    /* Uᵀ rows g and g + 8 are U's columns g and g + 8 (zero past n, read as column 0; U2 = 0: n <= 8,
     * the second never read) */
    const bool u0 = g < n, u1 = g + 8 < n;
    const float *uc0 = U + (u0 ? g : 0), *uc1 = U + (u1 ? g + 8 : 0);
    float acc[8][4];
#pragma unroll
    for (int e = 0; e < 8; e++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[e][c] = 0.0f;
    const int64_t k_end = ((int64_t)blockIdx.y + 1) * slice < Kp ? ((int64_t)blockIdx.y + 1) * slice : Kp;
#pragma unroll UNR
    for (int64_t k0 = (int64_t)blockIdx.y * slice + 16 * warp; k0 < k_end; k0 += 16 * TM_WARPS) {
        uint4 x[4];
        float v0[4], v1[4];
#pragma unroll
        for (int i = 0; i < 4; i++) { /* rows past K read row K - 1 of X; U is zero there */
            const int64_t k = k0 + 4 * t + i, kk = k < K ? k : K - 1;
            x[i] = ld8_bf16(X + kk * ldx + pc);
            const float a = __ldg(uc0 + kk * ldu), b = U2 ? __ldg(uc1 + kk * ldu) : 0.0f;
            v0[i] = u0 && k < K ? a : 0.0f, v1[i] = u1 && k < K ? b : 0.0f;
        }
        /* A = Uᵀ: rows g and g + 8, physical k 4t..4t+3 as logical (2t, 2t+1 | 2t+8, 2t+9) */
        uint32_t ah[4], al[4];
        split2(v0[0], v0[1], ah[0], al[0]);
        split2(v1[0], v1[1], ah[1], al[1]);
        split2(v0[2], v0[3], ah[2], al[2]);
        split2(v1[2], v1[3], ah[3], al[3]);
#pragma unroll
        for (int e = 0; e < 8; e++) { /* tile e: column c of the tile is X column p0 + 8c + e */
            const uint32_t b0 = pair_col(x[0], x[1], e), b1 = pair_col(x[2], x[3], e);
            lt_mma16816(acc[e], ah, b0, b1);
            lt_mma16816(acc[e], al, b0, b1);
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++) {
        red[warp][g][16 * t + e] = acc[e][0], red[warp][g][16 * t + 8 + e] = acc[e][1];
        red[warp][g + 8][16 * t + e] = acc[e][2], red[warp][g + 8][16 * t + 8 + e] = acc[e][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < 16 * TM_COLS; i += TM_WARPS * 32) {
        const int j = i / TM_COLS, c = i - j * TM_COLS;
        const int64_t p = p0 + c;
        if (j >= n || p >= P) continue;
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < TM_WARPS; w++) sum += red[w][j][c];
        if (part) part[((int64_t)blockIdx.y * 16 + j) * P + p] = sum;
        else store_ab(c_pj ? C + p * ldc + j : C + j * ldc + p, alpha, sum, beta);
    }
    if (!part || !last_slice(tickets + blockIdx.x, (unsigned)pb.ks)) return;
    for (int i = threadIdx.x; i < 16 * TM_COLS; i += TM_WARPS * 32) {
        const int j = i / TM_COLS, c = i - j * TM_COLS;
        const int64_t p = p0 + c;
        if (j < n && p < P)
            store_ab(c_pj ? C + p * ldc + j : C + j * ldc + p, alpha,
                     slice_sum(part + j * P + p, (unsigned)pb.ks, 16 * P), beta);
    }
}

extern "C" int lt_cuda_skinny_h_tall_batch(lt_ctx *ctx, int G, const lt_cuda_skinny_op *ops, int64_t n, int64_t K,
                                           int x_f32, int c_pj, void *ws, size_t ws_bytes) {
    if (G < 1 || G > LT_CUDA_SKINNY_BATCH || n <= 0 || n > 16 || K < 1 || (uintptr_t)ws % 16) return 0;
    for (int g = 0; g < G; g++)
        if (ops[g].k <= 0 || ops[g].k % 8 || ops[g].lda % 8 || (uintptr_t)ops[g].a % 16) return 0;
    const int64_t Kp = (K + 15) / 16 * 16;
    tall_batch bt;
    memset(&bt, 0, sizeof bt);
    size_t used = 0; /* the batch's partial sums, one product's after another's */
    int64_t cb_max = 1, ks_max = 1, tick = 0;
    int unr = 1;
    for (int g = 0; g < G; g++) {
        const lt_cuda_skinny_op &o = ops[g];
        tall_prob &p = bt.p[g];
        const size_t slice_bytes = (size_t)16 * (size_t)o.k * sizeof(float);
        int64_t slice_steps;
        p.cb = (o.k + TM_COLS - 1) / TM_COLS;
        p.ks = k_slices(p.cb, Kp / 16, TM_WARPS, slice_bytes, ws ? ws_bytes : 0, &slice_steps);
        p.slice = 16 * slice_steps;
        p.part = p.ks > 1 ? (float *)((char *)ws + used) : NULL;
        used += p.ks > 1 ? (size_t)p.ks * slice_bytes : 0;
        /* ks > 1 only below MMA_TARGET_BLOCKS column blocks: G of them fit LT_CUDA_TICKETS */
        p.tickets = p.part ? lt_cuda_tickets(ctx) + tick : NULL;
        tick += p.part ? p.cb : 0;
        p.X = o.a, p.U = o.f, p.C = o.c, p.P = o.k, p.ldx = o.lda, p.ldu = o.ldf, p.ldc = o.ldc;
        p.alpha = o.alpha, p.beta = o.beta;
        /* Unrolled only where a warp runs at least four steps of its slice: at Qwen3-8B's widths (9
         * a warp) the x-in-f32 pass went 88.6 -> 78.6 us on an H100; at SmolLM2-135M's (two a warp,
         * the slices short) the unrolled loop made it slower, 23.4 -> 25.4 us. */
        unr &= slice_steps >= 4 * TM_WARPS;
        if (p.cb > cb_max) cb_max = p.cb;
        if (p.ks > ks_max) ks_max = p.ks;
    }
    if (G > 1 && used > ws_bytes) { /* one after another, each with the whole workspace */
        for (int g = 0; g < G; g++) lt_cuda_skinny_h_tall_batch(ctx, 1, &ops[g], n, K, x_f32, c_pj, ws, ws_bytes);
        return 1;
    }
    cudaStream_t st = lt_cuda_stream(ctx);
    dim3 grid((unsigned)cb_max, (unsigned)ks_max, (unsigned)G);
#define TALL_MMA(XT_, U2_, UNR_) tall_mma_k<XT_, U2_, UNR_><<<grid, TM_WARPS * 32, 0, st>>>(bt, (int)n, K, Kp, c_pj)
#define TALL_MMA_U(XT_, U2_) unr ? TALL_MMA(XT_, U2_, 2) : TALL_MMA(XT_, U2_, 1)
    if (x_f32) n > 8 ? TALL_MMA_U(float, 1) : TALL_MMA_U(float, 0);
    else n > 8 ? TALL_MMA_U(__nv_bfloat16, 1) : TALL_MMA_U(__nv_bfloat16, 0);
#undef TALL_MMA_U
#undef TALL_MMA
    LT_CUDA_LAUNCHED(ctx, "lora: tall reduction (tensor cores)");
    return 1;
}

extern "C" int lt_cuda_skinny_h_tall(lt_ctx *ctx, int64_t P, int64_t n, int64_t K, float alpha, const void *X,
                                     int x_f32, int64_t ldx, const float *U, int64_t ldu, float beta, float *C,
                                     int64_t ldc, int c_pj, void *ws, size_t ws_bytes) {
    const lt_cuda_skinny_op o = {X, ldx, U, ldu, C, ldc, P, alpha, beta};
    return lt_cuda_skinny_h_tall_batch(ctx, 1, &o, n, K, x_f32, c_pj, ws, ws_bytes);
}
/* ---- rank update: C (M, N) = alpha·U (M, K)·V + beta·C0, K <= 32 (a multiple of 4), C0 = C or
 * another matrix of C's shape and stride (a residual added on its way into C) ----
 * V (K, N) is given by up to three pieces of kb rows each (the A's of q, k, v stacked: dx +=
 * dlu·[A_q; A_k; A_v]), or transposed (vt: piece g is (N, kb), V[j][c] = p_g[c·ld + j], the B of
 * lu·Bᵀ). A thread owns four consecutive columns and keeps their K x 4 block of V in registers
 * (read once, however V is laid out), then streams rows RB at a time: the RB rows of U (broadcast
 * float4 loads, L2-resident) and of C (when beta != 0) are all loaded before the first store (C,
 * U and V do not alias), so the read-modify-write updates of dx keep RB rows in flight a thread
 * rather than waiting on one load a row. So the LoRA up-products write y once, coalesced,
 * whatever B's layout (the transposed small_k_k lost ~0.6 s a step to uncoalesced B loads). */
typedef struct rank_src {
    const float *p[3];
    int64_t ld;
    int kb, vt;
} rank_src;

#define RU_THREADS 128
/* Rows in flight a thread: fewer as the V block takes more registers. */
#define RU_RB(KMAX) ((KMAX) <= 8 ? 4 : (KMAX) <= 24 ? 2 : 1)

/* C's four columns at a row: f32, or bf16 widened on the load and rounded (nearest even) on the store. */
static __device__ __forceinline__ float4 ru_load4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ float4 ru_load4(const __nv_bfloat16 *p) {
    const uint2 v = *(const uint2 *)p;
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162 *>(&v.x),
                         hi = *reinterpret_cast<const __nv_bfloat162 *>(&v.y);
    const float2 a = __bfloat1622float2(lo), b = __bfloat1622float2(hi);
    return make_float4(a.x, a.y, b.x, b.y);
}
static __device__ __forceinline__ void ru_store4(float *p, float4 v) { *(float4 *)p = v; }
static __device__ __forceinline__ void ru_store4(__nv_bfloat16 *p, float4 v) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    *(uint2 *)p = make_uint2(*reinterpret_cast<uint32_t *>(&lo), *reinterpret_cast<uint32_t *>(&hi));
}

/* One update of a batch (grid.z picks it): its U, V, C0, C, width N and its grid's share
 * (colblocks x ys blocks of rows_per rows). */
typedef struct ru_prob {
    const float *U;
    rank_src V;
    const void *C0;
    void *C;
    int64_t N, ldu, ldc, colblocks, ys, rows_per;
} ru_prob;
typedef struct ru_batch {
    ru_prob p[LT_CUDA_SKINNY_BATCH];
} ru_batch;

template <int KMAX, typename TC>
__global__ void __launch_bounds__(RU_THREADS)
    rank_upd_k(const __grid_constant__ ru_batch bt, int64_t M, int K, float alpha, float beta) {
    const ru_prob &pb = bt.p[blockIdx.z];
    if ((int64_t)blockIdx.x >= pb.colblocks || (int64_t)blockIdx.y >= pb.ys) return;
    constexpr int RB = RU_RB(KMAX), KQ = KMAX / 4;
    const int64_t N = pb.N, ldu = pb.ldu, ldc = pb.ldc, rows_per = pb.rows_per;
    const rank_src &V = pb.V;
    const float *__restrict__ U = pb.U;
    const TC *C0 = (const TC *)pb.C0;
    TC *C = (TC *)pb.C;
    const int64_t c = 4 * ((int64_t)blockIdx.x * RU_THREADS + threadIdx.x);
    if (c >= N) return; /* N % 4 == 0 */
    float v[KMAX][4];
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        if (j < K) {
            const int g = j / V.kb, jj = j - g * V.kb;
            const float *p = V.p[g];
#pragma unroll
            for (int i = 0; i < 4; i++) v[j][i] = V.vt ? p[(c + i) * V.ld + jj] : p[jj * V.ld + c + i];
        } else {
#pragma unroll
            for (int i = 0; i < 4; i++) v[j][i] = 0.0f;
        }
    }
    const int64_t m0 = (int64_t)blockIdx.y * rows_per, m1 = m0 + rows_per < M ? m0 + rows_per : M;
    for (int64_t m = m0; m < m1; m += RB) {
        float4 u[RB][KQ], c0[RB];
#pragma unroll
        for (int r = 0; r < RB; r++) {
            /* rows past m1 repeat row m (never stored): the loads need no predicate */
            const int64_t row = m + r < m1 ? m + r : m;
#pragma unroll
            for (int q = 0; q < KQ; q++)
                u[r][q] = 4 * q < K ? __ldg((const float4 *)(U + row * ldu + 4 * q)) : make_float4(0.f, 0.f, 0.f, 0.f);
            c0[r] = beta != 0.0f ? ru_load4(C0 + row * ldc + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int r = 0; r < RB; r++) {
            if (m + r >= m1) break;
            float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int q = 0; q < KQ; q++) {
                const float uu[4] = {u[r][q].x, u[r][q].y, u[r][q].z, u[r][q].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = 4 * q + e;
                    o.x += uu[e] * v[j][0], o.y += uu[e] * v[j][1], o.z += uu[e] * v[j][2], o.w += uu[e] * v[j][3];
                }
            }
            TC *cp = C + (m + r) * ldc + c;
            if (beta == 0.0f) ru_store4(cp, make_float4(alpha * o.x, alpha * o.y, alpha * o.z, alpha * o.w));
            else
                ru_store4(cp,
                          make_float4(alpha * o.x + beta * c0[r].x, alpha * o.y + beta * c0[r].y,
                                      alpha * o.z + beta * c0[r].z, alpha * o.w + beta * c0[r].w));
        }
    }
}

/* One wave: as many blocks as the SMs hold at once, each streaming rows_per rows of its 512
 * columns (blocks live for the whole pass, so a partial second wave would leave most SMs idle
 * while it runs); a batch's updates share the wave, the same rows a block in each. */
template <int KMAX, typename TC>
static void ru_launch(lt_ctx *ctx, cudaStream_t st, int G, ru_batch &bt, int64_t M, int K, float alpha, float beta) {
    static int per_sm = 0; /* the same for every device of one architecture; a benign race */
    if (!per_sm &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, rank_upd_k<KMAX, TC>, RU_THREADS, 0) != cudaSuccess)
        per_sm = 1;
    const int sms = lt_cuda_sm_count(ctx) > 0 ? lt_cuda_sm_count(ctx) : 132;
    int64_t colblocks = 0, cb_max = 1;
    for (int g = 0; g < G; g++) {
        ru_prob &p = bt.p[g];
        p.colblocks = (p.N / 4 + RU_THREADS - 1) / RU_THREADS;
        colblocks += p.colblocks;
        if (p.colblocks > cb_max) cb_max = p.colblocks;
    }
    int64_t ys = (int64_t)per_sm * sms / colblocks;
    if (ys < 1) ys = 1;
    if (ys > M) ys = M;
    if (ys > 65535) ys = 65535;
    const int64_t rows_per = (M + ys - 1) / ys;
    ys = (M + rows_per - 1) / rows_per;
    for (int g = 0; g < G; g++) bt.p[g].ys = ys, bt.p[g].rows_per = rows_per;
    dim3 grid((unsigned)cb_max, (unsigned)ys, (unsigned)G);
    rank_upd_k<KMAX, TC><<<grid, RU_THREADS, 0, st>>>(bt, M, K, alpha, beta);
}

template <typename TC>
static int rank_update(lt_ctx *ctx, int G, const lt_cuda_rank_op *ops, int64_t M, int K, int kb, int vt, float alpha,
                       float beta) {
    if (G < 1 || G > LT_CUDA_SKINNY_BATCH || M <= 0 || K <= 0 || K > 32 || K % 4 || kb <= 0 || (K + kb - 1) / kb > 3)
        return 0;
    ru_batch bt;
    memset(&bt, 0, sizeof bt);
    for (int g = 0; g < G; g++) {
        const lt_cuda_rank_op &o = ops[g];
        const void *c0 = o.c0 ? o.c0 : o.c;
        if (o.n <= 0 || o.n % 4 || o.ldc % 4 || o.ldu % 4 || !aligned16(o.c) || !aligned16(c0) || !aligned16(o.u))
            return 0;
        ru_prob &p = bt.p[g];
        p.U = o.u, p.C0 = c0, p.C = o.c, p.N = o.n, p.ldu = o.ldu, p.ldc = o.ldc;
        p.V.p[0] = o.v[0], p.V.p[1] = K > kb ? o.v[1] : NULL, p.V.p[2] = K > 2 * kb ? o.v[2] : NULL;
        p.V.ld = o.ldv, p.V.kb = kb, p.V.vt = vt;
    }
    cudaStream_t st = lt_cuda_stream(ctx);
    if (K <= 8) ru_launch<8, TC>(ctx, st, G, bt, M, K, alpha, beta);
    else if (K <= 16) ru_launch<16, TC>(ctx, st, G, bt, M, K, alpha, beta);
    else if (K <= 24) ru_launch<24, TC>(ctx, st, G, bt, M, K, alpha, beta);
    else ru_launch<32, TC>(ctx, st, G, bt, M, K, alpha, beta);
    LT_CUDA_LAUNCHED(ctx, "lora: rank update");
    return 1;
}

extern "C" int lt_cuda_rank_update_batch(lt_ctx *ctx, int G, const lt_cuda_rank_op *ops, int64_t M, int K, int kb,
                                         int vt, float alpha, float beta, int c_bf16) {
    return c_bf16 ? rank_update<__nv_bfloat16>(ctx, G, ops, M, K, kb, vt, alpha, beta)
                  : rank_update<float>(ctx, G, ops, M, K, kb, vt, alpha, beta);
}

extern "C" int lt_cuda_rank_update(lt_ctx *ctx, int64_t M, int64_t N, int K, float alpha, const float *U, int64_t ldu,
                                   const float *const *pieces, int kb, int vt, int64_t ld, float beta, const float *C0,
                                   float *C, int64_t ldc) {
    const lt_cuda_rank_op o = {U, ldu, {pieces[0], K > kb ? pieces[1] : NULL, K > 2 * kb ? pieces[2] : NULL}, ld, C0, C,
                               N, ldc};
    return rank_update<float>(ctx, 1, &o, M, K, kb, vt, alpha, beta);
}

extern "C" int lt_cuda_rank_update_h(lt_ctx *ctx, int64_t M, int64_t N, int K, float alpha, const float *U, int64_t ldu,
                                     const float *const *pieces, int kb, int vt, int64_t ld, float beta, uint16_t *C,
                                     int64_t ldc) {
    const lt_cuda_rank_op o = {U,  ldu,  {pieces[0], K > kb ? pieces[1] : NULL, K > 2 * kb ? pieces[2] : NULL},
                               ld, NULL, C,
                               N,  ldc};
    return rank_update<__nv_bfloat16>(ctx, 1, &o, M, K, kb, vt, alpha, beta);
}
