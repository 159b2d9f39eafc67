/* The host side shared by the CUDA attention files: the checks and the preparation every entry
 * point runs (prepare.cu), and each variant's launcher (one per kernel file). Every launcher
 * queues its work on the stream it is given, which the entry point (fwd.cu, bwd.cu) obtains once.
 * D is one of LT_ATTENTION_CUDA_HEAD_DIMS and, for the wgmma and TMA variants, 64 or 128 (the
 * one-warpgroup wgmma forward with one K/V slot and the wgmma backward of bwd_wg256.cu also 256;
 * every one also 96, run on the D = 128 kernels padded).
 * Private to src/backend/cuda/attention/. */
#ifndef LT_ATTN_LAUNCH_H
#define LT_ATTN_LAUNCH_H

#include <cuda_runtime.h>

#include "backend/cuda/attention/heuristics.h"
#include "backend/cuda/attention/params.h"
#include "backend/cuda/cuda_common.cuh"

/* The specialisations every launcher implements (bf16, the head dims of tuning.h, not the naive
 * oracle) and CUDA's grid limits (grid_heads: the heads one launch spreads over a grid axis):
 * LT_OK, or LT_ERR_UNSUPPORTED naming the reason. */
lt_status lt_attn_cuda_supported(lt_ctx *ctx, const lt_attention_params *p, int64_t grid_heads);

/* Fills the common part of the parameter block, queues the key-bounds kernel into the workspace on
 * `stream` (or, when p->batch carries bounds, points the block at those and queues nothing) and
 * returns the first unused workspace byte offset in *used (the same either way). */
lt_status lt_attn_cuda_prepare(lt_ctx *ctx, const lt_attention_params *p, const lt_attention_args *a, void *workspace,
                               lt_attn_dev *d, size_t *used, cudaStream_t stream);

/* Raises the kernel's dynamic shared-memory limit to smem and queues it on `stream`; smem_what and
 * launch_what name the two steps in an error. */
template <typename... P, typename... A>
static inline lt_status lt_attn_launch(lt_ctx *ctx, void (*kernel)(P...), dim3 grid, unsigned threads, size_t smem,
                                       cudaStream_t stream, const char *smem_what, const char *launch_what,
                                       const A &...args) {
    LT_TRY(lt_cuda_check(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                         smem_what));
    kernel<<<grid, threads, smem, stream>>>(args...);
    return lt_cuda_check(ctx, cudaGetLastError(), launch_what);
}

/* Forward kernels: out and lse. */
lt_status lt_attn_fwd_mma_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream);
/* slots: K/V buffers, 2 (WG2) or 1 (WG1). */
lt_status lt_attn_fwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int slots, cudaStream_t stream);
/* stages: 2 (WS2) or 3 (WS3); pingpong: the consumers take turns issuing MMAs. */
lt_status lt_attn_fwd_ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int stages, int pingpong,
                                cudaStream_t stream);

/* Backward pieces; bwd.cu sequences them. */
/* delta = rowsum(dO·O) by its own pass. */
lt_status lt_attn_bwd_delta_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream);
/* The mma.sync main kernel: dK, dV, and dQ into d.dq_acc by atomics. */
lt_status lt_attn_bwd_mma_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream);
/* The wgmma main kernel: dK, dV (or their fp32 sums when d.nsplit > 1), and dQ into d.dq_acc by
 * atomics unless d.no_dq; bn = 64 only with d.no_dq. */
lt_status lt_attn_bwd_wg_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int bn, cudaStream_t stream);
/* The D = 256 wgmma kernel (bwd_wg256.cu): dK, dV, and dQ into d.dq_acc by atomics unless
 * d.no_dq; one CTA per 64 keys of a kv head (d.nsplit 1). */
lt_status lt_attn_bwd_wg256_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, cudaStream_t stream);
/* The dQ kernel (no atomics; forms delta first when `delta`). */
lt_status lt_attn_bwd_dq_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, int delta, cudaStream_t stream);
/* The D = 256 dQ kernel (bwd_dq256.cu: 128 query rows a CTA over two warpgroups), which
 * lt_attn_bwd_dq_launch runs at D = 256. */
lt_status lt_attn_bwd_dq256_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int delta, cudaStream_t stream);
/* The warp-specialised kernel and its dQ conversion. d.delta must hold rowsum(dO·O) and d.dq_acc
 * (B·H·T·D fp32, the kernel's own tile order) must be zero. */
lt_status lt_attn_bwd_ws_launch(lt_ctx *ctx, const lt_attn_dev &d, int B, int D, cudaStream_t stream);

#endif
