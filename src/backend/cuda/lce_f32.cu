/* f32 hidden states for the CUDA linear cross-entropy (the model keeps f32 activations): h is
 * rounded to a bf16 copy at the start of the workspace and the bf16 kernels of lce.cu run on it
 * with the rest of the workspace; dh may already be f32 there. Nothing here computes the loss. */
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/lce_impl.h"
}

static lt_lce_args bf16_args(const lt_lce_args *a, void *hb) {
    lt_lce_args b = *a;
    b.h = lt_tensor_view(hb, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, a->h.shape);
    return b;
}

static size_t h_bytes(const lt_lce_args *a) { return lt_cuda_align((size_t)a->h.shape[0] * (size_t)a->h.shape[1] * 2); }

extern "C" size_t lt_lce_cuda_f32_workspace_bytes(const lt_lce_options *opt, const lt_lce_args *a, int pass,
                                                  int threads) {
    lt_lce_args b = bf16_args(a, NULL);
    return h_bytes(a) + lt_lce_cuda_workspace_bytes(opt, &b, pass, threads);
}

static __global__ void lce_h_to_bf16(const float *h, __nv_bfloat16 *hb, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        hb[i] = __float2bfloat16_rn(h[i]);
}

extern "C" lt_status lt_lce_cuda_f32_run(lt_ctx *ctx, const lt_lce_options *opt, lt_lce_args *a, int pass) {
    /* refuse what lce.cu refuses before allocating anything for the copy */
    if (a->w.dtype == LT_DTYPE_F32 || a->w.dtype == LT_DTYPE_F16)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "lce (CUDA): head dtype %s; implemented: bf16 and every block format",
                        lt_dtype_name(a->w.dtype));
    const size_t total = lt_lce_cuda_f32_workspace_bytes(opt, a, pass, 0);
    char *ws = (char *)a->workspace;
    if (!ws) {
        ws = (char *)lt_alloc(ctx, LT_DEVICE_CUDA, total, "lce workspace (f32 h)");
        if (!ws) return lt_ctx_status(ctx);
    }
    const int64_t n = a->h.shape[0] * a->h.shape[1];
    int64_t blocks = (n + 255) / 256;
    if (blocks > 65535 * 16) blocks = 65535 * 16;
    lce_h_to_bf16<<<(unsigned)(blocks < 1 ? 1 : blocks), 256, 0, lt_cuda_stream(ctx)>>>((const float *)a->h.data,
                                                                                        (__nv_bfloat16 *)ws, n);
    lt_status st = lt_cuda_check(ctx, cudaGetLastError(), "lce (CUDA f32): h to bf16");
    if (st == LT_OK) {
        lt_lce_args b = bf16_args(a, ws);
        b.workspace = ws + h_bytes(a);
        st = pass == LT_LCE_PASS_FORWARD_BACKWARD ? lt_lce_cuda_forward_backward(ctx, opt, &b)
            : pass == LT_LCE_PASS_BACKWARD        ? lt_lce_cuda_backward(ctx, opt, &b)
                                                  : lt_lce_cuda_forward(ctx, opt, &b);
    }
    if (!a->workspace) lt_free(ctx, LT_DEVICE_CUDA, ws, total); /* cudaFree waits for the kernels */
    return st;
}
