/* The op profiler's CUDA clock (backend/prof.h): a pool of timing events, created on first use
 * and kept for the process, recorded on the legacy default stream. Every context's stream is
 * either that stream or a blocking one, which the legacy stream is ordered with both ways, so a
 * mark falls between the ops queued before and after it whichever context queued them (the
 * profiler's hooks take no context). Only the profiler calls these; with profiling off no event
 * exists. */
#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/prof.h"
}

#define PROF_EVENTS 65536 /* prof.c's mark pool */

static cudaEvent_t events[PROF_EVENTS];

extern "C" int lt_cuda_prof_record(int slot) {
    if (slot < 0 || slot >= PROF_EVENTS) return -1;
    if (!events[slot] && cudaEventCreate(&events[slot]) != cudaSuccess) {
        (void)cudaGetLastError();
        events[slot] = NULL;
        return -1;
    }
    if (cudaEventRecord(events[slot], cudaStreamLegacy) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return 0;
}

/* Profiling only (graph capture is off then): the marks are read once the step has finished. */
extern "C" lt_status lt_cuda_prof_wait(lt_ctx *ctx) {
    return lt_cuda_check(ctx, cudaDeviceSynchronize(), "profiler: cudaDeviceSynchronize");
}

extern "C" float lt_cuda_prof_ms(int a, int b) {
    float ms = 0;
    if (a < 0 || b < 0 || a >= PROF_EVENTS || b >= PROF_EVENTS || !events[a] || !events[b]) return 0;
    if (cudaEventElapsedTime(&ms, events[a], events[b]) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return ms;
}
