/* The CUDA backend's op table: memory movement here, the per-context state (stream, cuBLASLt,
 * capture state) in cuda_state.cu, step graphs in graph.cu, kernels in one file per op family
 * beside this one (ops_*.cu, attention_*.cu, lce.cu). Everything a context queues goes to its
 * stream, lt_cuda_stream(ctx), in call order. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

extern "C" {
#include "backend/attention_impl.h"
#include "backend/lce_impl.h"
}

extern "C" void *lt_cuda_native_stream(lt_ctx *ctx) { return (void *)lt_cuda_stream(ctx); }

static lt_status cuda_status(lt_ctx *ctx, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return LT_OK;
    (void)cudaGetLastError(); /* clear the sticky error before reporting */
    return lt_error(ctx, LT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

/* Every copy is queued on the stream. From pageable host memory the runtime stages the source
 * before cudaMemcpyAsync returns (the caller may free it, as with cudaMemcpy) but no wait for the
 * device happens; from pinned memory the copy stays queued, and under capture it becomes a graph
 * node that reads the pinned source at every replay. cudaPointerGetAttributes is a host-side
 * table lookup (no device wait, legal while capturing); it routes device sources to a D2D copy. */
static lt_status cuda_to_device(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (!bytes) return LT_OK;
    cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, src);
    if (e != cudaSuccess) return cuda_status(ctx, e, "copy to device: cudaPointerGetAttributes");
    if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged)
        return cuda_status(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, lt_cuda_stream(ctx)),
                           "copy within the device");
    if (at.type != cudaMemoryTypeHost && lt_cuda_capturing(ctx))
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "copy to device from pageable host memory while capturing a graph "
                        "(the copy would not be replayed)");
    return cuda_status(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, lt_cuda_stream(ctx)),
                       "cudaMemcpyAsync to device");
}

/* The loss read: the one wait of a step. */
static lt_status cuda_to_host(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (!bytes) return LT_OK;
    if (lt_cuda_capturing(ctx))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "copy to the host while capturing a graph (a step may not wait)");
    LT_TRY(cuda_status(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, lt_cuda_stream(ctx)),
                       "cudaMemcpyAsync to host"));
    return cuda_status(ctx, cudaStreamSynchronize(lt_cuda_stream(ctx)), "copy to host: cudaStreamSynchronize");
}

static lt_status cuda_sync(lt_ctx *ctx) {
    if (lt_cuda_capturing(ctx))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "synchronize while capturing a graph (a step may not wait)");
    return cuda_status(ctx, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

static lt_status cuda_host_register(lt_ctx *ctx, void *p, size_t bytes, int on) {
    if (!p || !bytes) return LT_OK;
    if (on) return cuda_status(ctx, cudaHostRegister(p, bytes, cudaHostRegisterDefault), "cudaHostRegister");
    return cuda_status(ctx, cudaHostUnregister(p), "cudaHostUnregister");
}

/* f32 tensors take the conversion wrappers around the bf16 kernels (attention/f32.cu, lce_f32.cu). */
static size_t cuda_attention_ws(const lt_attention_params *p, int backward, int threads) {
    return p->dtype == LT_DTYPE_F32 ? lt_attention_cuda_f32_workspace_bytes(p, backward, threads)
                                    : lt_attention_cuda_workspace_bytes(p, backward, threads);
}

static lt_status cuda_attention_fwd(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return p->dtype == LT_DTYPE_F32 ? lt_attention_cuda_f32_forward(ctx, p, a) : lt_attention_cuda_forward(ctx, p, a);
}

static lt_status cuda_attention_bwd(lt_ctx *ctx, const lt_attention_params *p, lt_attention_args *a) {
    return p->dtype == LT_DTYPE_F32 ? lt_attention_cuda_f32_backward(ctx, p, a) : lt_attention_cuda_backward(ctx, p, a);
}

static size_t cuda_lce_ws(const lt_lce_options *o, const lt_lce_args *a, int pass, int threads) {
    return a->h.dtype == LT_DTYPE_F32 ? lt_lce_cuda_f32_workspace_bytes(o, a, pass, threads)
                                      : lt_lce_cuda_workspace_bytes(o, a, pass, threads);
}

static lt_status cuda_lce_fwd(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a) {
    return a->h.dtype == LT_DTYPE_F32 ? lt_lce_cuda_f32_run(ctx, o, a, LT_LCE_PASS_FORWARD)
                                      : lt_lce_cuda_forward(ctx, o, a);
}

static lt_status cuda_lce_bwd(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a) {
    return a->h.dtype == LT_DTYPE_F32 ? lt_lce_cuda_f32_run(ctx, o, a, LT_LCE_PASS_BACKWARD)
                                      : lt_lce_cuda_backward(ctx, o, a);
}

static lt_status cuda_lce_fwd_bwd(lt_ctx *ctx, const lt_lce_options *o, lt_lce_args *a) {
    return a->h.dtype == LT_DTYPE_F32 ? lt_lce_cuda_f32_run(ctx, o, a, LT_LCE_PASS_FORWARD_BACKWARD)
                                      : lt_lce_cuda_forward_backward(ctx, o, a);
}

/* Designated initialisers in the order of lt_backend's fields (C++ requires it). */
extern "C" const lt_backend lt_backend_cuda = {
    .name = "cuda",
    .device = LT_DEVICE_CUDA,
    .copy_to_device = cuda_to_device,
    .copy_to_host = cuda_to_host,
    .synchronize = cuda_sync,
    .xfer_open = lt_cuda_xfer_open,
    .xfer_close = lt_cuda_xfer_close,
    .xfer_copy = lt_cuda_xfer_copy,
    .xfer_wait = lt_cuda_xfer_wait,
    .supports = lt_backend_cuda_supports,
    .native_stream = lt_cuda_native_stream,
    .gemm = lt_cuda_gemm,
    .matmul = lt_cuda_matmul,
    .matmul_workspace_bytes = lt_cuda_matmul_workspace_bytes,
    .rmsnorm_fwd = lt_cuda_rmsnorm_fwd,
    .rmsnorm_bwd = lt_cuda_rmsnorm_bwd,
    .rope = lt_cuda_rope,
    .swiglu_fwd = lt_cuda_swiglu_fwd,
    .swiglu_bwd = lt_cuda_swiglu_bwd,
    .geglu_fwd = lt_cuda_geglu_fwd,
    .geglu_bwd = lt_cuda_geglu_bwd,
    .embedding = lt_cuda_embedding,
    .add = lt_cuda_add,
    .add_bias = lt_cuda_add_bias,
    .dropout = lt_cuda_dropout,
    .adamw = lt_cuda_adamw,
    .zero = lt_cuda_zero,
    .scale = lt_cuda_scale,
    .sumsq = lt_cuda_sumsq,
    .to_bf16 = lt_cuda_to_bf16,
    .from_bf16 = lt_cuda_from_bf16,
    .saved_dtype = LT_DTYPE_BF16,
    .attention_workspace_bytes = cuda_attention_ws,
    .attention_fwd = cuda_attention_fwd,
    .attention_bwd = cuda_attention_bwd,
    .attention_batch_bytes = lt_attention_cuda_batch_bytes,
    .attention_batch_prepare = lt_attention_cuda_batch_prepare,
    .lce_workspace_bytes = cuda_lce_ws,
    .lce_fwd = cuda_lce_fwd,
    .lce_bwd = cuda_lce_bwd,
    .lce_fwd_bwd = cuda_lce_fwd_bwd,
    .moe_route = lt_cuda_moe_route,
    .moe_route_bwd = lt_cuda_moe_route_bwd,
    .moe_sort = lt_cuda_moe_sort,
    .moe_gather = lt_cuda_moe_gather,
    .moe_gather_bwd = lt_cuda_moe_gather_bwd,
    .moe_combine = lt_cuda_moe_combine,
    .moe_combine_bwd = lt_cuda_moe_combine_bwd,
    .grouped_matmul = lt_cuda_grouped_matmul,
    .grouped_matmul_workspace_bytes = lt_cuda_grouped_matmul_workspace_bytes,
    .grouped_matmul_wgrad = lt_cuda_grouped_matmul_wgrad,
    .host_register = cuda_host_register,
    .clip_norm = lt_cuda_clip_norm,
    .graph_begin = lt_cuda_graph_begin,
    .graph_end = lt_cuda_graph_end,
    .graph_launch = lt_cuda_graph_launch,
    .graph_free = lt_cuda_graph_free,
    .lora_fwd = lt_cuda_lora_fwd,
    .lora_bwd = lt_cuda_lora_bwd,
    .decode_attention_workspace_bytes = lt_cuda_decode_attention_workspace_bytes,
    .decode_attention = lt_cuda_decode_attention,
    .lora_bf16_takes = lt_cuda_lora_bf16_takes,
    .rmsnorm_fwd_bf16 = lt_cuda_rmsnorm_fwd_bf16,
    .rope_cvt = lt_cuda_rope_cvt,
    .rmsnorm_bwd_add = lt_cuda_rmsnorm_bwd_add,
    .glu_fwd_bf16 = lt_cuda_glu_fwd_bf16,
    .glu_bwd_bf16 = lt_cuda_glu_bwd_bf16,
    .lora_fwd_bf16 = lt_cuda_lora_fwd_bf16,
    .lora_bwd_bf16 = lt_cuda_lora_bwd_bf16,
};
