/* The CUDA backend's op table: memory movement here, kernels in one file per op family beside
 * this one (ops_*.cu, attention_*.cu, lce.cu). Everything is queued on the legacy default stream. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

static cudaStream_t g_stream; /* null: the legacy default stream */

cudaStream_t lt_cuda_stream(void) { return g_stream; }
void lt_cuda_set_stream(cudaStream_t s) { g_stream = s; }

static lt_status cuda_status(lt_ctx *ctx, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return LT_OK;
    (void)cudaGetLastError(); /* clear the sticky error before reporting */
    return lt_error(ctx, LT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

/* Device-to-device copies stay queued; a copy from host memory returns once the source has been
 * read (the caller may free it), as cudaMemcpy does. */
static lt_status cuda_to_device(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (!bytes) return LT_OK;
    cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, src);
    if (e != cudaSuccess) return cuda_status(ctx, e, "copy to device: cudaPointerGetAttributes");
    if (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged)
        return cuda_status(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0),
                           "copy within the device");
    return cuda_status(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy to device");
}

static lt_status cuda_to_host(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (!bytes) return LT_OK;
    return cuda_status(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy to host");
}

static lt_status cuda_sync(lt_ctx *ctx) {
    return cuda_status(ctx, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

extern "C" const lt_backend lt_backend_cuda = {
    /* .name */ "cuda",
    /* .device */ LT_DEVICE_CUDA,
    /* .copy_to_device */ cuda_to_device,
    /* .copy_to_host */ cuda_to_host,
    /* .synchronize */ cuda_sync,
    /* .xfer_open */ lt_cuda_xfer_open,
    /* .xfer_close */ lt_cuda_xfer_close,
    /* .xfer_copy */ lt_cuda_xfer_copy,
    /* .xfer_wait */ lt_cuda_xfer_wait,
    /* .gemm */ lt_cuda_gemm,
    /* .matmul */ lt_cuda_matmul,
    /* .matmul_workspace_bytes */ lt_cuda_matmul_workspace_bytes,
    /* .rmsnorm_fwd */ lt_cuda_rmsnorm_fwd,
    /* .rmsnorm_bwd */ lt_cuda_rmsnorm_bwd,
    /* .rope */ lt_cuda_rope,
    /* .swiglu_fwd */ lt_cuda_swiglu_fwd,
    /* .swiglu_bwd */ lt_cuda_swiglu_bwd,
    /* .embedding */ lt_cuda_embedding,
    /* .add */ lt_cuda_add,
    /* .add_bias */ lt_cuda_add_bias,
    /* .dropout */ lt_cuda_dropout,
    /* .adamw */ lt_cuda_adamw,
    /* .zero */ lt_cuda_zero,
    /* .scale */ lt_cuda_scale,
    /* .sumsq */ lt_cuda_sumsq,
    /* .to_bf16 */ lt_cuda_to_bf16,
    /* .from_bf16 */ lt_cuda_from_bf16,
    /* .saved_dtype */ LT_DTYPE_BF16,
};
