/* The CPU's bf16 products through oneDNN (ops_matmul_bf16.c). Private to src/backend/cpu. */
#ifndef LT_BACKEND_CPU_OPS_MATMUL_BF16_H
#define LT_BACKEND_CPU_OPS_MATMUL_BF16_H

#include <stddef.h>

#include "backend/backend.h"

/* 1 when oneDNN makes the bf16 products on this CPU (AVX-512 and up; oneDNN has none for a CPU
 * with AVX2 alone), 0 when not or in a build without oneDNN; probed once. */
int lt_cpu_bf16x_available(void);

/* Workspace bytes of the bf16 products of W (out, in) over at most N_max rows on `threads` threads:
 * x rounded to bf16 (N_max rows of the wider side), W rounded to bf16 unless held so (with a row of
 * f32 per thread for its dequantization) and oneDNN's scratchpad. 0 for f32 and FP8 W, which keep
 * their products, and in a build without oneDNN. */
size_t lt_cpu_bf16x_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);

/* lt_matmul with x and W rounded to bf16 (NT, NT_SAME_X, NN); ws holds ws_bytes. Returns 0,
 * having done nothing, where it does not apply: f32 or FP8 W, a decode, no oneDNN, or a
 * workspace too small for this call (the caller then runs the f32 path). */
int lt_cpu_bf16x_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                        float *y, void *ws, size_t ws_bytes);

/* Single-threaded products for a caller that shares its work out over its own threads (the fused
 * loss's vocabulary tiles): y (M, N) f32 = beta·y + a (M, K) bf16 · B, B bf16 either (N, K) read
 * transposed (nn = 0) or (K, N) (nn = 1), all row-major and contiguous. */
typedef struct bf16x_prim lt_cpu_bf16x_gemm;
/* Scratchpad bytes one such product needs (planning; 0 without oneDNN). */
size_t lt_cpu_bf16x_gemm_spad(int64_t M, int64_t K, int64_t N, int nn, float beta);
/* The product, made or found in ctx's cache, with streams for `threads` threads; NULL when oneDNN
 * takes no such product (the caller keeps its f32 path). Outside parallel regions only. */
const lt_cpu_bf16x_gemm *lt_cpu_bf16x_gemm_get(lt_ctx *ctx, int64_t M, int64_t K, int64_t N, int nn, float beta,
                                               int threads);
/* Its scratchpad bytes (at most what lt_cpu_bf16x_gemm_spad said for the same arguments). */
size_t lt_cpu_bf16x_gemm_spad_of(const lt_cpu_bf16x_gemm *g);
/* Runs it on the calling thread, `thread` < the threads given to _get, each thread with its own
 * scratchpad (spad, lt_cpu_bf16x_gemm_spad_of bytes). */
void lt_cpu_bf16x_gemm_run(lt_ctx *ctx, const lt_cpu_bf16x_gemm *g, int thread, const uint16_t *a, const void *b,
                           float *y, void *spad);

#endif
