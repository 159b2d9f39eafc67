/* Small single-threaded GEMMs on operands already in cache: the tiles of the CPU flash attention
 * (tens to a few hundred rows, D = 64 or 128 deep), where OpenBLAS's per-call packing of both
 * operands costs as much as the product. Private to src/backend/cpu. */
#ifndef LT_BACKEND_CPU_TILE_GEMM_H
#define LT_BACKEND_CPU_TILE_GEMM_H

#include <stdint.h>

/* C (M, N) = alpha·op(A)·B + beta·C, row-major, on the calling thread. op(A) is A (M, K), row
 * stride lda, or with trans_a the transpose of A stored (K, M); B is (K, N), row stride ldb.
 * beta = 0 never reads C. With AVX2 + FMA each element of C is one sum over k in ascending order,
 * whatever M and N, so results do not depend on how a caller splits its tiles. */
void lt_cpu_tile_gemm(int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* The paths lt_cpu_tile_gemm can take: the best this CPU has (lt_cpu_tile_gemm_path) or, for
 * tests, one named (a path the CPU lacks falls back to the next: AVX-512, AVX2, OpenBLAS). */
enum { LT_TILE_PATH_BLAS = 0, LT_TILE_PATH_AVX2 = 1, LT_TILE_PATH_AVX512 = 2 };
int lt_cpu_tile_gemm_path(void);
void lt_cpu_tile_gemm_on(int path, int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

#endif
