/* The CUDA copy queue of checkpoint offload (backend.h, xfer_*): one non-blocking copy stream whose
 * copies are ordered against the compute stream, lt_cuda_stream(ctx), by events, so a checkpoint moves
 * to or from page-locked host memory while layers compute. Nothing here blocks the host except
 * closing the queue; the pinned memory itself comes from lt_alloc_pinned (core/alloc.c). */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

struct lt_cuda_xfer {
    cudaStream_t copy;               /* non-blocking: no implicit order with the legacy stream */
    cudaEvent_t issued;              /* recorded on the compute stream at each xfer_copy */
    cudaEvent_t done[LT_XFER_MARKS]; /* recorded on the copy stream after a copy naming the mark */
};

extern "C" void lt_cuda_xfer_close(lt_ctx *ctx, void *q) {
    lt_cuda_xfer *x = (lt_cuda_xfer *)q;
    if (!x) return;
    if (x->copy) cudaStreamSynchronize(x->copy); /* the buffers may be freed right after */
    for (int i = 0; i < LT_XFER_MARKS; i++)
        if (x->done[i]) cudaEventDestroy(x->done[i]);
    if (x->issued) cudaEventDestroy(x->issued);
    if (x->copy) cudaStreamDestroy(x->copy);
    (void)cudaGetLastError();
    lt_free(ctx, LT_DEVICE_CPU, x, sizeof *x);
}

extern "C" lt_status lt_cuda_xfer_open(lt_ctx *ctx, void **q) {
    *q = NULL;
    lt_cuda_xfer *x = (lt_cuda_xfer *)lt_calloc(ctx, LT_DEVICE_CPU, sizeof *x, "offload copy queue");
    if (!x) return lt_ctx_status(ctx);
    lt_status s =
        lt_cuda_check(ctx, cudaStreamCreateWithFlags(&x->copy, cudaStreamNonBlocking), "offload: copy stream");
    if (s == LT_OK)
        s = lt_cuda_check(ctx, cudaEventCreateWithFlags(&x->issued, cudaEventDisableTiming), "offload: event");
    for (int i = 0; s == LT_OK && i < LT_XFER_MARKS; i++)
        s = lt_cuda_check(ctx, cudaEventCreateWithFlags(&x->done[i], cudaEventDisableTiming), "offload: event");
    if (s != LT_OK) {
        lt_cuda_xfer_close(ctx, x);
        return s;
    }
    *q = x;
    return LT_OK;
}

extern "C" lt_status lt_cuda_xfer_copy(lt_ctx *ctx, void *q, int mark, void *dst, const void *src, size_t bytes) {
    lt_cuda_xfer *x = (lt_cuda_xfer *)q;
    if (mark < 0 || mark >= LT_XFER_MARKS) return lt_error(ctx, LT_ERR_INVALID_ARG, "offload: mark %d", mark);
    LT_TRY(
        lt_cuda_check(ctx, cudaEventRecord(x->issued, lt_cuda_stream(ctx)), "offload: record on the compute stream"));
    LT_TRY(lt_cuda_check(ctx, cudaStreamWaitEvent(x->copy, x->issued, 0), "offload: copy waits for compute"));
    if (bytes)
        LT_TRY(lt_cuda_check(ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, x->copy),
                             "offload: cudaMemcpyAsync"));
    return lt_cuda_check(ctx, cudaEventRecord(x->done[mark], x->copy), "offload: record on the copy stream");
}

extern "C" lt_status lt_cuda_xfer_wait(lt_ctx *ctx, void *q, int mark) {
    lt_cuda_xfer *x = (lt_cuda_xfer *)q;
    if (mark < 0 || mark >= LT_XFER_MARKS) return lt_error(ctx, LT_ERR_INVALID_ARG, "offload: mark %d", mark);
    return lt_cuda_check(ctx, cudaStreamWaitEvent(lt_cuda_stream(ctx), x->done[mark], 0),
                         "offload: compute waits for a copy");
}
