/* RMSNorm forward and backward on CUDA: one block per row, fp32 sums with warp shuffles and one
 * shared-memory step; 1/rms itself is taken in float64 as the CPU op does. The weight gradient
 * (the model's norm weights are frozen; tests use it) is a separate column-sum kernel. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

/* 256 threads per row: C = 4096 gives 16 elements a thread (tried 128: same time at C = 4096,
 * slower at C = 8192; 512: more idle threads at C = 576). */
#define NORM_THREADS 256

static __device__ float block_sum_f(float v, float *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* sh may still be read from a previous call */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) t += sh[i];
    return t; /* every thread gets the same sum */
}

__global__ void rms_fwd_k(const float *x, const float *w, float eps, int64_t N, int64_t C, float *y, float *rstd) {
    __shared__ float sh[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float ss = 0;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
        ss = block_sum_f(ss, sh);
        float r = (float)(1.0 / sqrt((double)ss / (double)C + (double)eps));
        if (rstd && threadIdx.x == 0) rstd[n] = r;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) y[n * C + c] = w[c] * (xr[c] * r);
    }
}

void lt_cuda_rmsnorm_fwd(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                         float *rstd) {
    (void)ctx;
    if (N <= 0) return;
    rms_fwd_k<<<(unsigned)(N < 65535 * 16 ? N : 65535 * 16), NORM_THREADS>>>(x, w, eps, N, C, y, rstd);
    LT_CUDA_LAUNCHED("rmsnorm_fwd");
}

/* dx_c = r·w_c·dy_c − x_c·r³/C·Σ_k w_k·dy_k·x_k (the CPU op's formula). */
__global__ void rms_bwd_k(const float *dy, const float *x, const float *w, const float *rstd, int64_t N, int64_t C,
                          float *dx) {
    __shared__ float sh[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C, *dr = dy + n * C;
        float dot = 0;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dr[c] * xr[c];
        dot = block_sum_f(dot, sh);
        float r = rstd[n];
        float k = dot * r * r * r / (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dx[n * C + c] = r * w[c] * dr[c] - xr[c] * k;
    }
}

/* dw_c += Σ_n dy·x·r: blocks of 32 columns × 8 row lanes, lanes combined in shared memory. */
__global__ void rms_dw_k(const float *dy, const float *x, const float *rstd, int64_t N, int64_t C, float *dw) {
    __shared__ float sh[8][33];
    int64_t c = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (c < C)
        for (int64_t n = threadIdx.y; n < N; n += 8) s += dy[n * C + c] * x[n * C + c] * rstd[n];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0;
        for (int i = 0; i < 8; i++) t += sh[i][threadIdx.x];
        dw[c] += t;
    }
}

void lt_cuda_rmsnorm_bwd(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                         int64_t C, float *dx, float *dw) {
    (void)ctx;
    if (N <= 0) return;
    if (dw) {
        rms_dw_k<<<(unsigned)((C + 31) / 32), dim3(32, 8)>>>(dy, x, rstd, N, C, dw);
        LT_CUDA_LAUNCHED("rmsnorm_bwd dw");
    }
    rms_bwd_k<<<(unsigned)(N < 65535 * 16 ? N : 65535 * 16), NORM_THREADS>>>(dy, x, w, rstd, N, C, dx);
    LT_CUDA_LAUNCHED("rmsnorm_bwd");
}
