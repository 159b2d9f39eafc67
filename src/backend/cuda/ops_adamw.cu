/* AdamW on CUDA, one thread per parameter, the CPU op's formula (torch.optim.AdamW: decoupled
 * decay, bias-corrected moments, eps outside the square root). Division and square root are the
 * IEEE-rounded intrinsics because the build's --use_fast_math would otherwise approximate them;
 * the bias corrections are computed on the host exactly as the CPU op does. */
#include <math.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_ops.h"

#define ADAMW_THREADS 256

__global__ void adamw_k(float *p, const float *g, float *m, float *v, int64_t n, lt_adamw_params h, float bc1,
                        float bc2) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float pi = p[i] * (1.0f - h.lr * h.weight_decay);
        float mi = h.beta1 * m[i] + (1.0f - h.beta1) * gi;
        float vi = h.beta2 * v[i] + (1.0f - h.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - h.lr * __fdiv_rn(__fdiv_rn(mi, bc1), __fsqrt_rn(__fdiv_rn(vi, bc2)) + h.eps);
    }
}

void lt_cuda_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp) {
    (void)ctx;
    if (n <= 0) return;
    float bc1 = (float)(1.0 - pow((double)hp->beta1, (double)hp->step));
    float bc2 = (float)(1.0 - pow((double)hp->beta2, (double)hp->step));
    adamw_k<<<lt_cuda_grid(n, ADAMW_THREADS), ADAMW_THREADS>>>(p, g, m, v, n, *hp, bc1, bc2);
    LT_CUDA_LAUNCHED("adamw");
}
