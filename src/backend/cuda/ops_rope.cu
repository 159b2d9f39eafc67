/* Rotate-half RoPE on CUDA, in place, or from f32 rows into bf16 ones and back (rope_cvt). One thread per (token, frequency) pair walks every head, so
 * each angle is computed once. The angle is pos·inv_freq in fp32 as on the CPU, but its sine and
 * cosine are taken in float64: the build uses --use_fast_math, whose sinf/cosf lose accuracy at
 * the angles long contexts reach (|angle| up to ~1e6 rad). The table is the model's: D/2
 * frequencies, then the attention factor cos and sin are multiplied by. */
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

#define ROPE_THREADS 256

static __device__ __forceinline__ float ld(const float *p) { return *p; }
static __device__ __forceinline__ float ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ void st(float *p, float v) { *p = v; }
static __device__ __forceinline__ void st(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }

/* y = the rotation of x (the same array for the in-place op; rope_cvt reads and writes either
 * dtype, widening bf16 on the load and rounding to bf16 on the store, so its values are those of
 * widen, rotate in place, round). */
template <typename X, typename Y>
static __global__ void rope_k(const X *x, Y *y, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads,
                              int64_t D, float sign) {
    int64_t half = D / 2, total = N * half;
    const float scale = inv_freq[half];
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = t / half, i = t - n * half;
        float ang = __fmul_rn((float)pos[n], inv_freq[i]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        float c = scale * (float)cd, s = scale * sign * (float)sd;
        const X *v = x + n * heads * D + i;
        Y *w = y + n * heads * D + i;
        for (int64_t h = 0; h < heads; h++, v += D, w += D) {
            float a = ld(v), b = ld(v + half);
            st(w, a * c - b * s);
            st(w + half, b * c + a * s);
        }
    }
}

template <typename X, typename Y>
static void rope_launch(lt_ctx *ctx, const X *x, Y *y, const int32_t *pos, const float *inv_freq, int64_t N,
                        int64_t heads, int64_t D, int inverse) {
    if (N <= 0 || heads <= 0 || D < 2) return;
    rope_k<X, Y>
        <<<lt_cuda_grid(N * (D / 2), ROPE_THREADS), ROPE_THREADS, 0, lt_cuda_stream(ctx)>>>(x, y, pos, inv_freq, N,
                                                                                            heads, D,
                                                                                            inverse ? -1.0f : 1.0f);
    LT_CUDA_LAUNCHED(ctx, "rope");
}

void lt_cuda_rope(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                  int inverse) {
    rope_launch(ctx, (const float *)x, x, pos, inv_freq, N, heads, D, inverse);
}

void lt_cuda_rope_cvt(lt_ctx *ctx, const void *x, int x_bf16, void *y, int y_bf16, const int32_t *pos,
                      const float *inv_freq, int64_t N, int64_t heads, int64_t D, int inverse) {
    typedef __nv_bfloat16 h;
    if (x_bf16 && y_bf16) rope_launch(ctx, (const h *)x, (h *)y, pos, inv_freq, N, heads, D, inverse);
    else if (x_bf16) rope_launch(ctx, (const h *)x, (float *)y, pos, inv_freq, N, heads, D, inverse);
    else if (y_bf16) rope_launch(ctx, (const float *)x, (h *)y, pos, inv_freq, N, heads, D, inverse);
    else rope_launch(ctx, (const float *)x, (float *)y, pos, inv_freq, N, heads, D, inverse);
}
