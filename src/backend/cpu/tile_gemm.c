/* The attention tiles' GEMMs (tile_gemm.h), with no packing: the tiles are already in L1/L2. C is
 * cut into register blocks whose accumulators stay in registers while k runs over the whole depth,
 * each step one broadcast of op(A) per row against the vectors of B's row k read in place; column
 * blocks outermost, so one panel of B stays in L1 across all row blocks. Ragged edges use narrower
 * blocks and masked loads and stores.
 * - AVX-512 (F, VL): blocks of 8 rows x 32 columns, 16 of the 32 zmm registers accumulating. On the
 *   2-core AMD EPYC (Zen 4) VM, flash attention at T = 2048 (H = 8, Hkv = 2, fwd + bwd, runs
 *   alternated) took 111-119 ms against 125-140 ms with the AVX2 blocks, 65-70 % of the same run's
 *   sgemm rate against 59-60 %. Also tried: 12-row blocks (24 accumulators), no faster.
 *   Every 64 full columns go in blocks of 6 rows x 64 columns first (the same block code with four
 *   vectors: 24 accumulators, each broadcast of op(A) feeding four FMAs where the 32-wide blocks
 *   feed two; k unrolled by 4, which left the 8 x 32 blocks' rate as it was): the attention
 *   tiles are 64 keys or D = 64 / 128 wide. On the 2-core Xeon (Sapphire Rapids) VM, `bench
 *   attention --T 2048 --packed-T 0 --threads 2` with the 8 x 32 blocks alone against these, three
 *   alternated pairs: forward 21.8-22.5 ms -> 20.4-21.3, backward 46.1-47.5 -> 40.5-42.4; in the
 *   SmolLM2-135M T = 2048 training step (`bench train --profile`, two pairs) attention went from
 *   795 / 820 ms forward and 1,622 / 1,707 backward to 760 / 755 and 1,505 / 1,490.
 * - AVX2 + FMA: blocks of 6 rows x 16 columns, 12 of the 16 ymm registers accumulating.
 * Both sum each element of C over k in ascending order with one FMA per term and apply alpha and
 * beta the same way, so the two give the same bits. Elsewhere the product goes to OpenBLAS. */
#include "backend/cpu/tile_gemm.h"

#include <cblas.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LT_TILE_AVX2 1
#define TILE_FN __attribute__((target("avx2,fma")))
#endif

#if defined(LT_TILE_AVX2)
#define MR 6

static int tile_avx2(void) {
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return have;
}

/* One block: mr rows (<= MR) x nv vectors of 8 columns, the last one masked when `masked`. */
TILE_FN static inline __attribute__((always_inline)) void block(const int ta, const int mr, const int nv,
                                                                const int masked, int64_t K, const float *A,
                                                                int64_t lda, const float *B, int64_t ldb, float alpha,
                                                                float beta, float *C, int64_t ldc, __m256i mask) {
    __m256 acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) acc[i][v] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        __m256 bv[2];
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++)
            bv[v] = masked && v == nv - 1 ? _mm256_maskload_ps(b + 8 * v, mask) : _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 6
        for (int i = 0; i < mr; i++) {
            const __m256 a = _mm256_broadcast_ss(ta ? A + k * lda + i : A + i * lda + k);
#pragma GCC unroll 2
            for (int v = 0; v < nv; v++) acc[i][v] = _mm256_fmadd_ps(a, bv[v], acc[i][v]);
        }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            float *c = C + i * ldc + 8 * v;
            const int mk = masked && v == nv - 1;
            __m256 r = alpha == 1.0f ? acc[i][v] : _mm256_mul_ps(va, acc[i][v]);
            if (beta != 0.0f) {
                const __m256 old = mk ? _mm256_maskload_ps(c, mask) : _mm256_loadu_ps(c);
                r = beta == 1.0f ? _mm256_add_ps(r, old) : _mm256_fmadd_ps(vb, old, r);
            }
            if (mk) _mm256_maskstore_ps(c, mask, r);
            else _mm256_storeu_ps(c, r);
        }
}

/* The instantiations: row count 1..MR by column shape (two full vectors; one full; two, the second
 * masked; one masked). */
#define TILE_ROWS(TA, NV, MASKED)                                                           \
    switch (mr) {                                                                           \
    case 6: block(TA, 6, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 5: block(TA, 5, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 4: block(TA, 4, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 3: block(TA, 3, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 2: block(TA, 2, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    default: block(TA, 1, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break; \
    }

#define TILE_SHAPES(TA)                 \
    switch (shape) {                    \
    case 0: TILE_ROWS(TA, 2, 0) break;  \
    case 1: TILE_ROWS(TA, 1, 0) break;  \
    case 2: TILE_ROWS(TA, 2, 1) break;  \
    default: TILE_ROWS(TA, 1, 1) break; \
    }

TILE_FN static void block_n(int ta, int mr, int shape, int64_t K, const float *A, int64_t lda, const float *B,
                            int64_t ldb, float alpha, float beta, float *C, int64_t ldc, __m256i mask) {
    if (ta) {
        TILE_SHAPES(1)
    } else {
        TILE_SHAPES(0)
    }
}

TILE_FN static void tile_avx2_gemm(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                                   const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t j = 0; j < N; j += 16) {
        const int64_t w = N - j < 16 ? N - j : 16;
        /* shape: 0 = 16 columns, 1 = 8, 2 = 9..15 (second vector masked), 3 = 1..7 (masked) */
        const int shape = w == 16 ? 0 : w == 8 ? 1 : w > 8 ? 2 : 3;
        const int tail = (int)(w > 8 ? w - 8 : w);
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), lane);
        for (int64_t i = 0; i < M; i += MR) {
            const int mr = (int)(M - i < MR ? M - i : MR);
            const float *Ai = ta ? A + i : A + i * lda;
            block_n(ta, mr, shape, K, Ai, lda, B + j, ldb, alpha, beta, C + i * ldc + j, ldc, mask);
        }
    }
}

#define MR16 8
#define TILE16_FN __attribute__((target("avx512f,avx512vl,fma")))

static int tile_avx512(void) {
    static int have = -1;
    if (have < 0) have = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    return have;
}

/* One block: mr rows (<= MR16; <= MR64 when nv = 4) x nv (<= 4) vectors of 16 columns, the last
 * one under `mask` when `masked`; the same sums, alpha and beta as block(). k unrolled by 4. */
#define MR64 6
TILE16_FN static inline __attribute__((always_inline)) void
block16(const int ta, const int mr, const int nv, const int masked, int64_t K, const float *A, int64_t lda,
        const float *B, int64_t ldb, float alpha, float beta, float *C, int64_t ldc, __mmask16 mask) {
    __m512 acc[MR16][4];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) acc[i][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = masked && v == nv - 1 ? _mm512_maskz_loadu_ps(mask, b + 16 * v) : _mm512_loadu_ps(b + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            const __m512 a = _mm512_set1_ps(ta ? A[k * lda + i] : A[i * lda + k]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) acc[i][v] = _mm512_fmadd_ps(a, bv[v], acc[i][v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            float *c = C + i * ldc + 16 * v;
            const int mk = masked && v == nv - 1;
            __m512 r = alpha == 1.0f ? acc[i][v] : _mm512_mul_ps(va, acc[i][v]);
            if (beta != 0.0f) {
                const __m512 old = mk ? _mm512_maskz_loadu_ps(mask, c) : _mm512_loadu_ps(c);
                r = beta == 1.0f ? _mm512_add_ps(r, old) : _mm512_fmadd_ps(vb, old, r);
            }
            if (mk) _mm512_mask_storeu_ps(c, mask, r);
            else _mm512_storeu_ps(c, r);
        }
}

#define TILE64_ROWS(TA)                                                              \
    switch (mr) {                                                                    \
    case 6: block16(TA, 6, 4, 0, K, A, lda, B, ldb, alpha, beta, C, ldc, 0); break;  \
    case 5: block16(TA, 5, 4, 0, K, A, lda, B, ldb, alpha, beta, C, ldc, 0); break;  \
    case 4: block16(TA, 4, 4, 0, K, A, lda, B, ldb, alpha, beta, C, ldc, 0); break;  \
    case 3: block16(TA, 3, 4, 0, K, A, lda, B, ldb, alpha, beta, C, ldc, 0); break;  \
    case 2: block16(TA, 2, 4, 0, K, A, lda, B, ldb, alpha, beta, C, ldc, 0); break;  \
    default: block16(TA, 1, 4, 0, K, A, lda, B, ldb, alpha, beta, C, ldc, 0); break; \
    }

TILE16_FN static void block64_n(int ta, int mr, int64_t K, const float *A, int64_t lda, const float *B, int64_t ldb,
                                float alpha, float beta, float *C, int64_t ldc) {
    if (ta) {
        TILE64_ROWS(1)
    } else {
        TILE64_ROWS(0)
    }
}

#define TILE16_ROWS(TA, NV, MASKED)                                                           \
    switch (mr) {                                                                             \
    case 8: block16(TA, 8, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 7: block16(TA, 7, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 6: block16(TA, 6, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 5: block16(TA, 5, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 4: block16(TA, 4, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 3: block16(TA, 3, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    case 2: block16(TA, 2, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break;  \
    default: block16(TA, 1, NV, MASKED, K, A, lda, B, ldb, alpha, beta, C, ldc, mask); break; \
    }

#define TILE16_SHAPES(TA)                 \
    switch (shape) {                      \
    case 0: TILE16_ROWS(TA, 2, 0) break;  \
    case 1: TILE16_ROWS(TA, 1, 0) break;  \
    case 2: TILE16_ROWS(TA, 2, 1) break;  \
    default: TILE16_ROWS(TA, 1, 1) break; \
    }

TILE16_FN static void block16_n(int ta, int mr, int shape, int64_t K, const float *A, int64_t lda, const float *B,
                                int64_t ldb, float alpha, float beta, float *C, int64_t ldc, __mmask16 mask) {
    if (ta) {
        TILE16_SHAPES(1)
    } else {
        TILE16_SHAPES(0)
    }
}

TILE16_FN static void tile_avx512_gemm(int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                                       int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int64_t j0 = 0;
    for (; j0 + 64 <= N; j0 += 64)
        for (int64_t i = 0; i < M; i += MR64) {
            const int mr = (int)(M - i < MR64 ? M - i : MR64);
            block64_n(ta, mr, K, ta ? A + i : A + i * lda, lda, B + j0, ldb, alpha, beta, C + i * ldc + j0, ldc);
        }
    for (int64_t j = j0; j < N; j += 32) {
        const int64_t w = N - j < 32 ? N - j : 32;
        /* shape: 0 = 32 columns, 1 = 16, 2 = 17..31 (second vector masked), 3 = 1..15 (masked) */
        const int shape = w == 32 ? 0 : w == 16 ? 1 : w > 16 ? 2 : 3;
        const int tail = (int)(w > 16 ? w - 16 : w);
        const __mmask16 mask = (__mmask16)((1u << tail) - 1u);
        for (int64_t i = 0; i < M; i += MR16) {
            const int mr = (int)(M - i < MR16 ? M - i : MR16);
            const float *Ai = ta ? A + i : A + i * lda;
            block16_n(ta, mr, shape, K, Ai, lda, B + j, ldb, alpha, beta, C + i * ldc + j, ldc, mask);
        }
    }
}
#endif

int lt_cpu_tile_gemm_path(void) {
#if defined(LT_TILE_AVX2)
    if (tile_avx512()) return LT_TILE_PATH_AVX512;
    if (tile_avx2()) return LT_TILE_PATH_AVX2;
#endif
    return LT_TILE_PATH_BLAS;
}

void lt_cpu_tile_gemm_on(int path, int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return;
#if defined(LT_TILE_AVX2)
    if (path == LT_TILE_PATH_AVX512 && tile_avx512()) {
        tile_avx512_gemm(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    if (path != LT_TILE_PATH_BLAS && tile_avx2()) {
        tile_avx2_gemm(trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#else
    (void)path;
#endif
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
        return;
    }
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K,
                alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

void lt_cpu_tile_gemm(int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    static int path = -1;
    if (path < 0) path = lt_cpu_tile_gemm_path();
    lt_cpu_tile_gemm_on(path, trans_a, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
