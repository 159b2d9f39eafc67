/* The CPU's bf16 products through oneDNN (ops_matmul_bf16.c). Private to src/backend/cpu. */
#ifndef LT_BACKEND_CPU_OPS_MATMUL_BF16_H
#define LT_BACKEND_CPU_OPS_MATMUL_BF16_H

#include <stddef.h>

#include "backend/backend.h"

/* Workspace bytes of the bf16 products of a bf16 W (out, in) over at most N_max rows on `threads`
 * threads: x rounded to bf16 (N_max rows of the wider side) and oneDNN's scratchpad. 0 for other
 * dtypes, and in a build without oneDNN. */
size_t lt_cpu_bf16x_workspace_bytes(lt_dtype wdtype, int64_t out, int64_t in, int64_t N_max, int threads);

/* lt_matmul with x rounded to bf16 when W is bf16 (NT, NT_SAME_X, NN); ws holds ws_bytes. Returns
 * 0, having done nothing, where it does not apply: another dtype, a decode, no oneDNN, or a
 * workspace too small for this call (the caller then runs the f32 path). */
int lt_cpu_bf16x_matmul(lt_ctx *ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta,
                        float *y, void *ws, size_t ws_bytes);

#endif
