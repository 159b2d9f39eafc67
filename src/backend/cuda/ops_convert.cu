/* CUDA conversions between f32 activations and bf16 storage (the model's bf16 checkpoints and
 * kept attention outputs): grid-stride loops on the backend's stream, rounding to nearest even as
 * the CPU op does. Aligned arrays move eight elements a thread per step (two 16-byte f32 loads,
 * one 16-byte bf16 store, or the reverse); the scalar loop takes misaligned arrays and the tail.
 * Nothing else is converted here (the matmul and attention keep their own bf16 staging). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define CV_THREADS 256

static __global__ void cv_to_bf16_k(const float *x, __nv_bfloat16 *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

static __global__ void cv_from_bf16_k(const __nv_bfloat16 *x, float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __bfloat162float(x[i]);
}

static __device__ __forceinline__ uint32_t cv_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

static __device__ __forceinline__ float2 cv_unpack(uint32_t u) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
}

static __global__ void cv_to_bf16_vec_k(const float4 *__restrict__ x, uint4 *__restrict__ y, int64_t n8) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 a = x[2 * i], b = x[2 * i + 1];
        y[i] = make_uint4(cv_pack(a.x, a.y), cv_pack(a.z, a.w), cv_pack(b.x, b.y), cv_pack(b.z, b.w));
    }
}

static __global__ void cv_from_bf16_vec_k(const uint4 *__restrict__ x, float4 *__restrict__ y, int64_t n8) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x) {
        const uint4 v = x[i];
        const float2 a = cv_unpack(v.x), b = cv_unpack(v.y), c = cv_unpack(v.z), d = cv_unpack(v.w);
        y[2 * i] = make_float4(a.x, a.y, b.x, b.y);
        y[2 * i + 1] = make_float4(c.x, c.y, d.x, d.y);
    }
}

/* Eight-element steps when both arrays are 16-byte aligned, else none (the scalar loop does all). */
static int64_t cv_vec_count(const void *f32, const void *b16, int64_t n) {
    return ((uintptr_t)f32 % 16 || (uintptr_t)b16 % 16) ? 0 : n / 8;
}

void lt_cuda_to_bf16(lt_ctx *ctx, const float *x, uint16_t *y, int64_t n) {
    if (n <= 0) return;
    const int64_t n8 = cv_vec_count(x, y, n);
    if (n8) {
        cv_to_bf16_vec_k<<<lt_cuda_grid(n8, CV_THREADS), CV_THREADS, 0, lt_cuda_stream(ctx)>>>((const float4 *)x,
                                                                                               (uint4 *)y, n8);
        LT_CUDA_LAUNCHED(ctx, "to_bf16");
    }
    if (n > 8 * n8) {
        cv_to_bf16_k<<<lt_cuda_grid(n - 8 * n8, CV_THREADS), CV_THREADS, 0, lt_cuda_stream(ctx)>>>(x + 8 * n8,
                                                                                                   (__nv_bfloat16 *)y +
                                                                                                       8 * n8,
                                                                                                   n - 8 * n8);
        LT_CUDA_LAUNCHED(ctx, "to_bf16");
    }
}

void lt_cuda_from_bf16(lt_ctx *ctx, const uint16_t *x, float *y, int64_t n) {
    if (n <= 0) return;
    const int64_t n8 = cv_vec_count(y, x, n);
    if (n8) {
        cv_from_bf16_vec_k<<<lt_cuda_grid(n8, CV_THREADS), CV_THREADS, 0, lt_cuda_stream(ctx)>>>((const uint4 *)x,
                                                                                                 (float4 *)y, n8);
        LT_CUDA_LAUNCHED(ctx, "from_bf16");
    }
    if (n > 8 * n8) {
        cv_from_bf16_k<<<lt_cuda_grid(n - 8 * n8, CV_THREADS), CV_THREADS, 0,
                         lt_cuda_stream(ctx)>>>((const __nv_bfloat16 *)x + 8 * n8, y + 8 * n8, n - 8 * n8);
        LT_CUDA_LAUNCHED(ctx, "from_bf16");
    }
}
