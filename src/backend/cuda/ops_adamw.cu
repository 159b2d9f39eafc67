/* AdamW on CUDA, one thread per parameter, the CPU op's formula (torch.optim.AdamW: decoupled
 * decay, bias-corrected moments, eps outside the square root). Every operation is an IEEE-rounded
 * intrinsic (the build's --use_fast_math would otherwise approximate division and square root, and
 * nvcc would fuse multiply-adds), and the bias corrections are computed on the host as the CPU op
 * does, so the two backends agree to the bit when the host does not contract either. */
#include <math.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define ADAMW_THREADS 256

static __global__ void adamw_k(float *p, const float *g, float *m, float *v, int64_t n, lt_adamw_params h, float bc1,
                               float bc2) {
    /* every operation rounded separately, in the CPU op's order: no multiply-add is fused, so the
     * result matches a host compiled without FP contraction bit for bit */
    const float decay = __fsub_rn(1.0f, __fmul_rn(h.lr, h.weight_decay));
    const float c1 = __fsub_rn(1.0f, h.beta1), c2 = __fsub_rn(1.0f, h.beta2);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gi = g[i];
        float pi = __fmul_rn(p[i], decay);
        float mi = __fadd_rn(__fmul_rn(h.beta1, m[i]), __fmul_rn(c1, gi));
        float vi = __fadd_rn(__fmul_rn(h.beta2, v[i]), __fmul_rn(__fmul_rn(c2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float den = __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, bc2)), h.eps);
        p[i] = __fsub_rn(pi, __fdiv_rn(__fmul_rn(h.lr, __fdiv_rn(mi, bc1)), den));
    }
}

static void bias_corrections(const lt_adamw_params *hp, float *bc1, float *bc2) {
    *bc1 = (float)(1.0 - pow((double)hp->beta1, (double)hp->step));
    *bc2 = (float)(1.0 - pow((double)hp->beta2, (double)hp->step));
}

void lt_cuda_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp) {
    if (n <= 0) return;
    float bc1, bc2;
    bias_corrections(hp, &bc1, &bc2);
    adamw_k<<<lt_cuda_grid(n, ADAMW_THREADS), ADAMW_THREADS, 0, lt_cuda_stream(ctx)>>>(p, g, m, v, n, *hp, bc1, bc2);
    LT_CUDA_LAUNCHED(ctx, "adamw");
    /* The learning rate and step change every step: a captured step's node gets them per replay. */
    if (lt_cuda_capturing(ctx)) lt_cuda_graph_note_adamw(ctx, p, g, m, v, n);
}

/* The same launch as lt_cuda_adamw, written into a graph's kernel node (same grid, new values). */
lt_status lt_cuda_adamw_node_params(lt_ctx *ctx, cudaGraphExec_t exec, cudaGraphNode_t node, float *p, const float *g,
                                    float *m, float *v, int64_t n, const lt_adamw_params *hp) {
    lt_adamw_params h = *hp;
    float bc1, bc2;
    bias_corrections(hp, &bc1, &bc2);
    void *args[] = {&p, &g, &m, &v, &n, &h, &bc1, &bc2};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)adamw_k;
    kp.gridDim = dim3(lt_cuda_grid(n, ADAMW_THREADS));
    kp.blockDim = dim3(ADAMW_THREADS);
    kp.sharedMemBytes = 0;
    kp.kernelParams = args;
    return lt_cuda_check(ctx, cudaGraphExecKernelNodeSetParams(exec, node, &kp), "adamw: graph node parameters");
}
