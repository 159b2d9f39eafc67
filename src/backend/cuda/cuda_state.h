/* The CUDA backend's instance state, reached through the context: accessors for C and CUDA
 * callers alike. Each context gets its own state on first use (cuda_state.cu), freed by
 * lt_ctx_free; the state's layout is private to src/backend/cuda/ (cuda_state.cuh). Callers outside
 * the backend reach the stream through lt_backend.native_stream instead of this header. */
#ifndef LT_CUDA_STATE_H
#define LT_CUDA_STATE_H

#include <cuda_runtime_api.h>

#include "longtune/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The stream every kernel launch, cuBLASLt call and async copy of ctx's ops is queued on. Null
 * (the legacy default stream) until graph_begin makes the context its own (a blocking stream, kept
 * until lt_ctx_free, so stray legacy-stream work stays ordered with it) and for ctx NULL; code
 * must pass lt_cuda_stream(ctx) rather than 0 so a step can be captured into a CUDA graph. */
cudaStream_t lt_cuda_stream(lt_ctx *ctx);
/* Streaming multiprocessors of the device the context's state was made on. */
int lt_cuda_sm_count(lt_ctx *ctx);
/* Nonzero while ctx's stream is being captured into a graph: launch and runtime failures then
 * mark the capture failed (the caller falls back to running the step eagerly) instead of
 * aborting, and nothing may synchronise or allocate. 0 for ctx NULL. */
int lt_cuda_capturing(lt_ctx *ctx);
/* Records a failure seen while capturing (the first one's text is kept for graph_end's message). */
void lt_cuda_capture_fail(lt_ctx *ctx, const char *what, cudaError_t e);

#ifdef __cplusplus
}
#endif
#endif
