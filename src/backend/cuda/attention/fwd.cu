/* lt_attention_cuda_forward: checks the call, prepares the parameter block and key bounds, asks
 * the heuristic for the variant (heuristics.cu; variant table in tuning.h) and launches it. On
 * compute capability 9.0, D = 64, 128 or 256: long rows take the warp-specialised TMA kernel
 * (fwd_ws.cu) or the one-warpgroup wgmma kernel (fwd_wg.cu), rows that see few keys the wgmma
 * kernel with one K/V slot; D = 96 the same kernels of D = 128, padded; elsewhere (other GPUs)
 * the mma.sync kernel (fwd_mma.cu). */
#include "backend/cuda/attention/launch.h"
#include "backend/cuda/cuda_common.cuh"

extern "C" lt_status lt_attention_cuda_forward(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    LT_TRY(lt_attn_cuda_supported(ctx, p, p->H)); /* the query heads span a grid axis */
    if (p->T == 0 || p->B == 0) return LT_OK;
    const cudaStream_t stream = lt_cuda_stream(ctx);
    size_t ws_bytes = lt_attention_cuda_workspace_bytes(p, 0, 0);
    void *ws = a->workspace;
    if (!ws) {
        ws = lt_alloc(ctx, LT_DEVICE_CUDA, ws_bytes, "attention forward workspace");
        if (!ws) return lt_ctx_status(ctx);
    }
    lt_attn_dev d;
    size_t used = 0;
    lt_status st = lt_attn_cuda_prepare(ctx, p, a, ws, &d, &used, stream);
    if (st == LT_OK) {
        const int B = (int)p->B, D = (int)p->D;
        const lt_attn_cuda_tuning force = lt_attn_cuda_tuning_get();
        const lt_attn_fwd_kind v =
            LT_ATTN_FWD_WG_HEAD_DIM(D) ? lt_attn_fwd_choose(p, lt_attn_cuda_device(), &force) : LT_ATTN_FWD_MMA;
        switch (v) {
        case LT_ATTN_FWD_WS2:
        case LT_ATTN_FWD_WS3:
            st = lt_attn_fwd_ws_launch(ctx, d, B, D, v == LT_ATTN_FWD_WS3 ? 3 : 2, !force.fwd_ws_no_pingpong, stream);
            break;
        case LT_ATTN_FWD_WG1: st = lt_attn_fwd_wg_launch(ctx, d, B, D, 1, stream); break;
        case LT_ATTN_FWD_WG2: st = lt_attn_fwd_wg_launch(ctx, d, B, D, 2, stream); break;
        default: st = lt_attn_fwd_mma_launch(ctx, d, B, D, stream); break;
        }
    }
    if (!a->workspace) lt_free(ctx, LT_DEVICE_CUDA, ws, ws_bytes); /* cudaFree waits for the kernel */
    return st;
}
