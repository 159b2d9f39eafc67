/* The CUDA backend's stream, declared for C and CUDA callers alike (the NCCL transport in
 * src/comm orders its own stream against it). It holds no kernels; cuda_backend.cu defines it.
 * Plain C: no CUDA headers beyond the runtime API. */
#ifndef LT_CUDA_STREAM_H
#define LT_CUDA_STREAM_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The stream every kernel launch, cuBLASLt call and async copy of the backend is queued on. Null
 * (the legacy default stream) until the backend makes its own (lt_backend.graph_begin does, for
 * the rest of the process: a blocking stream, so stray legacy-stream work stays ordered with it);
 * code must pass lt_cuda_stream() rather than 0 so a step can be captured into a CUDA graph. */
cudaStream_t lt_cuda_stream(void);
void lt_cuda_set_stream(cudaStream_t s);

/* Nonzero while the backend's stream is being captured into a graph: launch and runtime failures
 * then mark the capture failed (the caller falls back to running the step eagerly) instead of
 * aborting, and nothing may synchronise or allocate. */
int lt_cuda_capturing(void);
/* Records a failure seen while capturing (the first one's text is kept for the log). */
void lt_cuda_capture_fail(const char *what, cudaError_t e);

#ifdef __cplusplus
}
#endif
#endif
