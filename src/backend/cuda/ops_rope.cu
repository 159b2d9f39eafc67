/* Rotate-half RoPE on CUDA, in place. One thread per (token, frequency) pair walks every head, so
 * each angle is computed once. The angle is pos·inv_freq in fp32 as on the CPU, but its sine and
 * cosine are taken in float64: the build uses --use_fast_math, whose sinf/cosf lose accuracy at
 * the angles long contexts reach (|angle| up to ~1e6 rad). The table is the model's: D/2
 * frequencies, then the attention factor cos and sin are multiplied by. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

#define ROPE_THREADS 256

static __global__ void rope_k(float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                              float sign) {
    int64_t half = D / 2, total = N * half;
    const float scale = inv_freq[half];
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total; t += (int64_t)gridDim.x * blockDim.x) {
        int64_t n = t / half, i = t - n * half;
        float ang = __fmul_rn((float)pos[n], inv_freq[i]);
        double sd, cd;
        sincos((double)ang, &sd, &cd);
        float c = scale * (float)cd, s = scale * sign * (float)sd;
        float *v = x + n * heads * D + i;
        for (int64_t h = 0; h < heads; h++, v += D) {
            float a = v[0], b = v[half];
            v[0] = a * c - b * s;
            v[half] = b * c + a * s;
        }
    }
}

void lt_cuda_rope(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                  int inverse) {
    if (N <= 0 || heads <= 0 || D < 2) return;
    rope_k<<<lt_cuda_grid(N * (D / 2), ROPE_THREADS), ROPE_THREADS, 0, lt_cuda_stream(ctx)>>>(x, pos, inv_freq, N,
                                                                                              heads, D,
                                                                                              inverse ? -1.0f : 1.0f);
    LT_CUDA_LAUNCHED(ctx, "rope");
}
