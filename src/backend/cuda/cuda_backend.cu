/* The CUDA backend's op table: memory movement on the default stream. Kernels live in one file
 * per op family beside this one. */
#include <cuda_runtime.h>

extern "C" {
#include "backend/backend.h"
}

static lt_status cuda_status(lt_ctx *ctx, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return LT_OK;
    (void)cudaGetLastError(); /* clear the sticky error before reporting */
    return lt_error(ctx, LT_ERR_CUDA, "%s: %s", what, cudaGetErrorString(e));
}

static lt_status cuda_to_device(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    return cuda_status(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy to device");
}

static lt_status cuda_to_host(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    return cuda_status(ctx, cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy to host");
}

static lt_status cuda_sync(lt_ctx *ctx) {
    return cuda_status(ctx, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

extern "C" const lt_backend lt_backend_cuda = {
    "cuda", LT_DEVICE_CUDA, cuda_to_device, cuda_to_host, cuda_sync,
};
