/* Private: the CUDA fused linear cross-entropy entry points, called by src/backend/lce.c after
 * the boundary checks. bf16 h; dense bf16 (or tied) and Q8_0 / Q4_0 / Q4_1 / INT4_G64 heads. */
#ifndef LT_LCE_CUDA_H
#define LT_LCE_CUDA_H

#include "longtune/lce.h"

#ifdef __cplusplus
extern "C" {
#endif

/* All pointers of args on the device. LT_ERR_UNSUPPORTED names what is not implemented;
 * LT_ERR_INVALID_ARG names the first target outside [0, V). */
lt_status lt_lce_cuda_forward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
lt_status lt_lce_cuda_backward(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a);
/* Device workspace for these shapes (covers quantized heads too): about 56 MiB at most whatever
 * N·V is, plus O(N) row statistics. */
size_t lt_lce_cuda_workspace_bytes(const lt_lce_options *opt, int64_t N, int64_t V, int64_t C,
                                   int backward);

#ifdef __cplusplus
}
#endif
#endif
