/* RMSNorm forward and backward on CUDA: one warp per row with float4 loads when rows are 16-byte
 * aligned (C % 4 == 0), else one block per row; fp32 sums with warp shuffles, 1/rms itself in
 * float64 as the CPU op does; the forward also writes its output rounded to bf16 for the products
 * that read it (rmsnorm_fwd_bf16). The weight gradient (the model's norm weights are frozen; tests use
 * it) is a separate column-sum kernel. */
#include <cuda_bf16.h>
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

/* The output's stores: f32, or rounded to bf16 (nearest even) for rmsnorm_fwd_bf16. */
static __device__ __forceinline__ void put1(float *y, int64_t i, float v) { y[i] = v; }
static __device__ __forceinline__ void put1(__nv_bfloat16 *y, int64_t i, float v) { y[i] = __float2bfloat16_rn(v); }
static __device__ __forceinline__ void put4(float *y, int64_t i4, float4 v) { ((float4 *)y)[i4] = v; }
static __device__ __forceinline__ void put4(__nv_bfloat16 *y, int64_t i4, float4 v) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    ((uint2 *)y)[i4] = make_uint2(*reinterpret_cast<uint32_t *>(&lo), *reinterpret_cast<uint32_t *>(&hi));
}

template <typename Y>
static __global__ void rms_fwd_k(const float *x, const float *w, float eps, int64_t N, int64_t C, Y *y, float *rstd) {
    __shared__ float sh[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float ss = 0;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
        ss = block_sum_f(ss, sh);
        float r = (float)(1.0 / sqrt((double)ss / (double)C + (double)eps));
        if (rstd && threadIdx.x == 0) rstd[n] = r;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) put1(y, n * C + c, w[c] * (xr[c] * r));
    }
}

/* One warp per row, float4 over the row (x, y, w 16-byte aligned, C % 4 == 0). The block-per-row
 * kernel spent most of its time in two barriers per row on the Qwen3 per-head norms (rows of
 * D = 128: 262,144 rows per 8k step), 63 ms of a 1.28 s step on an H200 (profile). */
#define WROW_THREADS 256

static __device__ __forceinline__ float warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename Y>
static __global__ void rms_fwd_warp_k(const float4 *x, const float4 *w, float eps, int64_t N, int64_t C4, Y *y,
                                      float *rstd) {
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (WROW_THREADS / 32);
    for (int64_t n = blockIdx.x * (int64_t)(WROW_THREADS / 32) + (threadIdx.x >> 5); n < N; n += step) {
        const float4 *xr = x + n * C4;
        float ss = 0;
#pragma unroll 4
        for (int64_t c = lane; c < C4; c += 32) {
            const float4 v = xr[c];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warp_sum_f(ss);
        const float r = (float)(1.0 / sqrt((double)ss / (double)(4 * C4) + (double)eps));
        if (rstd && lane == 0) rstd[n] = r;
#pragma unroll 4
        for (int64_t c = lane; c < C4; c += 32) {
            const float4 v = xr[c], g = w[c];
            put4(y, n * C4 + c, make_float4(g.x * (v.x * r), g.y * (v.y * r), g.z * (v.z * r), g.w * (v.w * r)));
        }
    }
}

/* ACC: dx += the gradient (rmsnorm_bwd_add), rounded as rmsnorm_bwd into a buffer and then add
 * would round it: the gradient, then one rounded sum. */
template <bool ACC>
static __global__ void rms_bwd_warp_k(const float4 *dy, const float4 *x, const float4 *w, const float *rstd, int64_t N,
                                      int64_t C4, float4 *dx) {
    const int lane = threadIdx.x & 31;
    const int64_t step = (int64_t)gridDim.x * (WROW_THREADS / 32);
    for (int64_t n = blockIdx.x * (int64_t)(WROW_THREADS / 32) + (threadIdx.x >> 5); n < N; n += step) {
        const float4 *xr = x + n * C4, *dr = dy + n * C4;
        float dot = 0;
#pragma unroll 4
        for (int64_t c = lane; c < C4; c += 32) {
            const float4 a = xr[c], d = dr[c], g = w[c];
            dot += g.x * d.x * a.x + g.y * d.y * a.y + g.z * d.z * a.z + g.w * d.w * a.w;
        }
        dot = warp_sum_f(dot);
        const float r = rstd[n];
        const float k = dot * r * r * r / (float)(4 * C4);
        float4 *o = dx + n * C4;
#pragma unroll 4
        for (int64_t c = lane; c < C4; c += 32) { /* dx may alias dy: each element is read, then written */
            const float4 a = xr[c], d = dr[c], g = w[c];
            float4 v = make_float4(r * g.x * d.x - a.x * k, r * g.y * d.y - a.y * k, r * g.z * d.z - a.z * k,
                                   r * g.w * d.w - a.w * k);
            if (ACC) {
                const float4 p = o[c];
                v = make_float4(__fadd_rn(p.x, v.x), __fadd_rn(p.y, v.y), __fadd_rn(p.z, v.z), __fadd_rn(p.w, v.w));
            }
            o[c] = v;
        }
    }
}

static int rows16(const void *a, const void *b, const void *c, const void *d, int64_t C) {
    return C % 4 == 0 && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) & 15);
}

static unsigned warp_rows_grid(int64_t N) {
    int64_t b = (N + WROW_THREADS / 32 - 1) / (WROW_THREADS / 32);
    return (unsigned)(b < 65535 * 16 ? b : 65535 * 16);
}

/* y as f32 or bf16 (Y): the warp kernel where rows are 16-byte aligned (y's 8-byte for bf16). */
template <typename Y>
static void rms_fwd(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, Y *y, float *rstd) {
    if (N <= 0) return;
    if (rows16(x, w, NULL, NULL, C) && !((uintptr_t)y % (4 * sizeof(Y)))) {
        rms_fwd_warp_k<Y><<<warp_rows_grid(N), WROW_THREADS, 0, lt_cuda_stream(ctx)>>>((const float4 *)x,
                                                                                       (const float4 *)w, eps, N, C / 4,
                                                                                       y, rstd);
        LT_CUDA_LAUNCHED(ctx, "rmsnorm_fwd");
        return;
    }
    rms_fwd_k<Y><<<(unsigned)(N < 65535 * 16 ? N : 65535 * 16), NORM_THREADS, 0, lt_cuda_stream(ctx)>>>(x, w, eps, N, C,
                                                                                                        y, rstd);
    LT_CUDA_LAUNCHED(ctx, "rmsnorm_fwd");
}

void lt_cuda_rmsnorm_fwd(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y,
                         float *rstd) {
    rms_fwd(ctx, x, w, eps, N, C, y, rstd);
}

void lt_cuda_rmsnorm_fwd_bf16(lt_ctx *ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, uint16_t *y,
                              float *rstd) {
    rms_fwd(ctx, x, w, eps, N, C, (__nv_bfloat16 *)y, rstd);
}

/* dx_c = r·w_c·dy_c − x_c·r³/C·Σ_k w_k·dy_k·x_k (the CPU op's formula). */
template <bool ACC>
static __global__ void rms_bwd_k(const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                                 int64_t C, float *dx) {
    __shared__ float sh[32];
    for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C, *dr = dy + n * C;
        float dot = 0;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dot += w[c] * dr[c] * xr[c];
        dot = block_sum_f(dot, sh);
        float r = rstd[n];
        float k = dot * r * r * r / (float)C;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            const float v = r * w[c] * dr[c] - xr[c] * k;
            dx[n * C + c] = ACC ? __fadd_rn(dx[n * C + c], v) : v;
        }
    }
}

/* dw_c += Σ_n dy·x·r: blocks of 32 columns × 8 row lanes, lanes combined in shared memory. */
static __global__ void rms_dw_k(const float *dy, const float *x, const float *rstd, int64_t N, int64_t C, float *dw) {
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

template <bool ACC>
static void rms_bwd(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                    int64_t C, float *dx) {
    if (rows16(dy, x, w, dx, C)) {
        rms_bwd_warp_k<ACC><<<warp_rows_grid(N), WROW_THREADS, 0, lt_cuda_stream(ctx)>>>((const float4 *)dy,
                                                                                         (const float4 *)x,
                                                                                         (const float4 *)w, rstd, N,
                                                                                         C / 4, (float4 *)dx);
        LT_CUDA_LAUNCHED(ctx, "rmsnorm_bwd");
        return;
    }
    rms_bwd_k<ACC><<<(unsigned)(N < 65535 * 16 ? N : 65535 * 16), NORM_THREADS, 0, lt_cuda_stream(ctx)>>>(dy, x, w,
                                                                                                          rstd, N, C,
                                                                                                          dx);
    LT_CUDA_LAUNCHED(ctx, "rmsnorm_bwd");
}

void lt_cuda_rmsnorm_bwd(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                         int64_t C, float *dx, float *dw) {
    if (N <= 0) return;
    if (dw) {
        rms_dw_k<<<(unsigned)((C + 31) / 32), dim3(32, 8), 0, lt_cuda_stream(ctx)>>>(dy, x, rstd, N, C, dw);
        LT_CUDA_LAUNCHED(ctx, "rmsnorm_bwd dw");
    }
    rms_bwd<false>(ctx, dy, x, w, rstd, N, C, dx);
}

void lt_cuda_rmsnorm_bwd_add(lt_ctx *ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N,
                             int64_t C, float *dx) {
    if (N > 0) rms_bwd<true>(ctx, dy, x, w, rstd, N, C, dx);
}
