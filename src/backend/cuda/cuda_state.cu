/* The CUDA backend's per-context state (cuda_state.cuh): made on first use of a context, stored in
 * the context's CUDA slot (core/ctx_state.h) and freed with it. It launches no kernels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_state.cuh"

extern "C" {
#include "core/ctx_state.h"
}

static void state_free(void *p) {
    lt_cuda_state *st = (lt_cuda_state *)p;
    for (int i = 0; i < st->nplans; i++) {
        lt_cuda_blas_plan *pl = &st->plans[i];
        if (pl->cd) cublasLtMatrixLayoutDestroy(pl->cd);
        if (pl->bd) cublasLtMatrixLayoutDestroy(pl->bd);
        if (pl->ad) cublasLtMatrixLayoutDestroy(pl->ad);
        if (pl->op) cublasLtMatmulDescDestroy(pl->op);
    }
    if (st->blas) cublasLtDestroy(st->blas);
    if (st->gemm_ws) cudaFree(st->gemm_ws); /* waits for the work that may still read it */
    if (st->sumsq) cudaFree(st->sumsq);
    if (st->tickets) cudaFree(st->tickets);
    if (st->stream) cudaStreamDestroy(st->stream);
    (void)cudaGetLastError();
    pthread_mutex_destroy(&st->blas_mu);
    free(st);
}

lt_cuda_state *lt_cuda_state_of(lt_ctx *ctx) {
    if (!ctx) return NULL;
    lt_cuda_state *st = (lt_cuda_state *)lt_ctx_backend_state(ctx, LT_DEVICE_CUDA);
    if (st) return st;
    /* a few KiB of host memory, outside the accounting like the CUDA runtime's own */
    st = (lt_cuda_state *)calloc(1, sizeof *st);
    if (!st) LT_ABORT("CUDA backend: cannot allocate the context's state (%zu bytes)", sizeof *st);
    pthread_mutex_init(&st->blas_mu, NULL);
    if (cudaGetDevice(&st->device) != cudaSuccess ||
        cudaDeviceGetAttribute(&st->sm_count, cudaDevAttrMultiProcessorCount, st->device) != cudaSuccess) {
        (void)cudaGetLastError();
        st->sm_count = 0;
    }
    lt_ctx_set_backend_state(ctx, LT_DEVICE_CUDA, st, state_free);
    return st;
}

cublasLtHandle_t lt_cuda_blas_handle(lt_cuda_state *st) {
    if (!st->blas) {
        cublasStatus_t s = cublasLtCreate(&st->blas);
        if (s != CUBLAS_STATUS_SUCCESS) LT_ABORT("cuBLASLt handle creation failed (%d)", (int)s);
    }
    if (!st->gemm_ws) {
        cudaError_t e = cudaMalloc(&st->gemm_ws, LT_CUDA_GEMM_WS_BYTES);
        if (e != cudaSuccess) LT_ABORT("gemm workspace: cudaMalloc: %s", cudaGetErrorString(e));
    }
    if (!st->sumsq) {
        cudaError_t e = cudaMalloc((void **)&st->sumsq, (LT_CUDA_SUMSQ_PARTS + 1) * sizeof(double));
        if (e != cudaSuccess) LT_ABORT("sumsq partials: cudaMalloc: %s", cudaGetErrorString(e));
    }
    if (!st->tickets) { /* zeroed on the legacy stream, which the context's blocking stream waits for */
        cudaError_t e = cudaMalloc((void **)&st->tickets, LT_CUDA_TICKETS * sizeof(unsigned));
        if (e == cudaSuccess) e = cudaMemset(st->tickets, 0, LT_CUDA_TICKETS * sizeof(unsigned));
        if (e != cudaSuccess) LT_ABORT("slice tickets: %s", cudaGetErrorString(e));
    }
    return st->blas;
}

extern "C" cudaStream_t lt_cuda_stream(lt_ctx *ctx) {
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    return st ? st->stream : (cudaStream_t)0;
}

extern "C" int lt_cuda_sm_count(lt_ctx *ctx) {
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    return st ? st->sm_count : 0;
}

extern "C" int lt_cuda_capturing(lt_ctx *ctx) {
    lt_cuda_state *st = ctx ? (lt_cuda_state *)lt_ctx_backend_state(ctx, LT_DEVICE_CUDA) : NULL;
    return st ? st->cap.active : 0;
}

extern "C" void lt_cuda_capture_fail(lt_ctx *ctx, const char *what, cudaError_t e) {
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    if (st && !st->cap.fail[0]) snprintf(st->cap.fail, sizeof st->cap.fail, "%s: %s", what, cudaGetErrorString(e));
}
