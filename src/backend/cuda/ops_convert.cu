/* CUDA conversions between f32 activations and bf16 storage (the model's bf16 checkpoints and
 * kept attention outputs): grid-stride loops on the default stream, rounding to nearest even as
 * the CPU op does. Nothing else is converted here (the matmul and attention keep their own bf16
 * staging). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

#define CV_THREADS 256

__global__ void cv_to_bf16_k(const float *x, __nv_bfloat16 *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

__global__ void cv_from_bf16_k(const __nv_bfloat16 *x, float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

void lt_cuda_to_bf16(lt_ctx *ctx, const float *x, uint16_t *y, int64_t n) {
    (void)ctx;
    if (n <= 0) return;
    cv_to_bf16_k<<<lt_cuda_grid(n, CV_THREADS), CV_THREADS, 0, lt_cuda_stream()>>>(x, (__nv_bfloat16 *)y, n);
    LT_CUDA_LAUNCHED("to_bf16");
}

void lt_cuda_from_bf16(lt_ctx *ctx, const uint16_t *x, float *y, int64_t n) {
    (void)ctx;
    if (n <= 0) return;
    cv_from_bf16_k<<<lt_cuda_grid(n, CV_THREADS), CV_THREADS, 0, lt_cuda_stream()>>>((const __nv_bfloat16 *)x, y, n);
    LT_CUDA_LAUNCHED("from_bf16");
}
