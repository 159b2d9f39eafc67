/* Small single-threaded GEMMs on operands already in cache: the tiles of the CPU flash attention
 * (tens to a few hundred rows, D = 64 or 128 deep), where OpenBLAS's per-call packing of both
 * operands costs as much as the product. Private to src/backend/cpu. */
#ifndef LT_BACKEND_CPU_TILE_GEMM_H
#define LT_BACKEND_CPU_TILE_GEMM_H

#include <stddef.h>
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

/* The same product on op(A) and B rounded to bf16 (nearest even) with f32 sums, as the CUDA
 * kernels multiply (tile_gemm_bf16.c): on AMX tiles where the CPU has them and the OS grants them,
 * else on AVX512-BF16 dot products where the CPU has those, else on the f32 path over rounded
 * copies. `pack` is scratch of
 * lt_cpu_tile_gemm_bf16_pack_bytes(M, N, K) bytes (any alignment). Each element of C is summed
 * over k in ascending chunks whatever M and N, so a caller may split its tiles freely. */
size_t lt_cpu_tile_gemm_bf16_pack_bytes(int64_t M, int64_t N, int64_t K);
void lt_cpu_tile_gemm_bf16(int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *pack);
/* The paths: _has(path) whether one runs on this CPU, _path() the one the calls above take (AMX,
 * else DP, else ROUNDED); for tests, _on(path, ...) takes a given one that runs here. */
enum { LT_TILE_BF16_ROUNDED = 0, LT_TILE_BF16_AMX = 1, LT_TILE_BF16_DP = 2 };
int lt_cpu_tile_gemm_bf16_has(int path);
int lt_cpu_tile_gemm_bf16_path(void);
void lt_cpu_tile_gemm_bf16_on(int path, int trans_a, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc, void *pack);

/* Operands packed once for several products, for the AMX and DP paths (call these only when
 * lt_cpu_tile_gemm_bf16_path() is not LT_TILE_BF16_ROUNDED).
 * - lt_cpu_bf16_pack_a writes op(A) (M, K; trans_a as above) rounded to bf16 into `rows` rows of
 *   `cols` elements at dst (row stride ldd >= cols), zeros beyond M and K; cols a multiple of 32.
 * - lt_cpu_bf16_pack_b writes B (K, N) as VNNI panels of 16 columns (each up32(K)/2 pair rows of
 *   32 bf16, lt_cpu_bf16_panel_elems(K) elements), lt_cpu_bf16_pack_b_elems(N, K) in all.
 * - lt_cpu_bf16_pack_b_rows writes B (K, N) as VNNI pair rows one after the other: pair row kk at
 *   dst + kk·ldd, column n at element 2n; kpairs pair rows of ncols columns, zeros beyond K and N.
 * - The product reads up32(M) rows of A at stride lda and up32(K) of its columns (columns past K
 *   meet B's zero pair rows, so must hold finite values), and B's pair rows at b_row elements
 *   from one to the next, its 16-column groups at b_panel: panels are (b_panel, b_row) =
 *   (lt_cpu_bf16_panel_elems(K), 32), pair rows (32, ldd). up32(K)/2 pair rows and up32(N)
 *   columns of B must be readable, the pair rows from K on zero. */
size_t lt_cpu_bf16_pack_b_elems(int64_t N, int64_t K);
int64_t lt_cpu_bf16_panel_elems(int64_t K);
void lt_cpu_bf16_pack_a(int trans_a, const float *A, int64_t lda, int64_t M, int64_t K, uint16_t *dst, int64_t ldd,
                        int64_t rows, int64_t cols);
void lt_cpu_bf16_pack_b(const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst);
void lt_cpu_bf16_pack_b_rows(const float *B, int64_t ldb, int64_t N, int64_t K, uint16_t *dst, int64_t ldd,
                             int64_t kpairs, int64_t ncols);
void lt_cpu_tile_gemm_bf16_packed(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *pa, int64_t lda,
                                  const uint16_t *pb, int64_t b_panel, int64_t b_row, float beta, float *C,
                                  int64_t ldc);
/* The same on a given path (LT_TILE_BF16_AMX or _DP, one that runs here), for tests. */
void lt_cpu_tile_gemm_bf16_packed_on(int path, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t *pa,
                                     int64_t lda, const uint16_t *pb, int64_t b_panel, int64_t b_row, float beta,
                                     float *C, int64_t ldc);

#endif
