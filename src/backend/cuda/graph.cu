/* Whole-step CUDA graphs: the backend's own stream, stream capture of everything the ops queue on
 * it, instantiation, and replay with the one host value a fixed-shape step changes (AdamW's
 * learning rate and bias corrections, written into the captured optimizer node). Inputs reach a
 * replay through copies from pinned host memory captured as graph nodes. It decides nothing about
 * when a step may be captured (the trainer does) and keeps no graph of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

struct lt_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    /* The captured AdamW launch (node NULL when the step had none) and its buffers. */
    cudaGraphNode_t adamw;
    float *p, *m, *v;
    const float *g;
    int64_t n;
};

/* Capture state: one capture at a time, from the thread that runs the backend (as every op). */
static int g_capturing;
static char g_fail[256];
static struct lt_graph g_pending;
static int g_adamw_count;

extern "C" int lt_cuda_capturing(void) { return g_capturing; }

extern "C" void lt_cuda_capture_fail(const char *what, cudaError_t e) {
    if (!g_fail[0]) snprintf(g_fail, sizeof g_fail, "%s: %s", what, cudaGetErrorString(e));
}

void lt_cuda_graph_note_adamw(float *p, const float *g, float *m, float *v, int64_t n) {
    cudaStreamCaptureStatus cs;
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(lt_cuda_stream(), &cs, NULL, NULL, &deps, NULL, &nd);
    if (e != cudaSuccess) {
        lt_cuda_capture_fail("adamw: cudaStreamGetCaptureInfo", e);
        return;
    }
    if (cs != cudaStreamCaptureStatusActive || nd != 1 || ++g_adamw_count > 1) {
        if (!g_fail[0])
            snprintf(g_fail, sizeof g_fail, "a captured step may hold one AdamW launch (%d seen)",
                     g_adamw_count);
        return;
    }
    g_pending.adamw = deps[0];
    g_pending.p = p, g_pending.g = g, g_pending.m = m, g_pending.v = v, g_pending.n = n;
}

/* The backend's own stream, made once for the process: blocking (no cudaStreamNonBlocking), so
 * work anyone still queues on the legacy stream stays ordered with it; under capture such work
 * fails loudly (cudaErrorStreamCaptureImplicit) instead of silently running outside the graph. */
static lt_status own_stream(lt_ctx *ctx) {
    if (lt_cuda_stream()) return LT_OK;
    cudaStream_t s;
    LT_TRY(lt_cuda_check(ctx, cudaStreamCreate(&s), "graph: cudaStreamCreate"));
    lt_cuda_set_stream(s);
    return LT_OK;
}

extern "C" lt_status lt_cuda_graph_begin(lt_ctx *ctx) {
    if (g_capturing) return lt_error(ctx, LT_ERR_INVALID_ARG, "graph: a capture is already running");
    LT_TRY(own_stream(ctx));
    /* Work queued before the capture must be done: a replay must not overlap the eager steps. */
    LT_TRY(lt_cuda_check(ctx, cudaStreamSynchronize(lt_cuda_stream()), "graph: cudaStreamSynchronize"));
    memset(&g_pending, 0, sizeof g_pending);
    g_fail[0] = '\0';
    g_adamw_count = 0;
    /* Thread-local mode: a call of this thread that would wait on or allocate for the device while
     * we capture fails (and the capture with it) instead of changing what a replay means; other
     * threads (the memory guard's watchdog reads cudaMemGetInfo) stay free. Work queued on the
     * legacy stream meanwhile fails in any mode, as our stream is a blocking one. */
    LT_TRY(lt_cuda_check(ctx, cudaStreamBeginCapture(lt_cuda_stream(), cudaStreamCaptureModeThreadLocal),
                         "graph: cudaStreamBeginCapture"));
    g_capturing = 1;
    return LT_OK;
}

extern "C" lt_status lt_cuda_graph_end(lt_ctx *ctx, lt_graph **out) {
    *out = NULL;
    if (!g_capturing) return lt_error(ctx, LT_ERR_INVALID_ARG, "graph: no capture is running");
    g_capturing = 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(lt_cuda_stream(), &graph);
    (void)cudaGetLastError();
    if (e != cudaSuccess || !graph || g_fail[0]) {
        if (graph) cudaGraphDestroy(graph);
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "graph: the step could not be captured (%s)",
                        g_fail[0] ? g_fail : cudaGetErrorString(e));
    }
    lt_graph *g = (lt_graph *)calloc(1, sizeof *g); /* a handle of a few pointers, outside the planner's device
                                                       and host classes like the graph itself */
    if (!g) {
        cudaGraphDestroy(graph);
        return lt_error(ctx, LT_ERR_OOM, "graph: handle");
    }
    *g = g_pending;
    g->graph = graph;
    e = cudaGraphInstantiate(&g->exec, graph, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        cudaGraphDestroy(graph);
        free(g);
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "graph: cudaGraphInstantiate: %s", cudaGetErrorString(e));
    }
    *out = g;
    return LT_OK;
}

extern "C" lt_status lt_cuda_graph_launch(lt_ctx *ctx, lt_graph *g, const lt_adamw_params *hp) {
    if (g->adamw && hp)
        LT_TRY(lt_cuda_adamw_node_params(ctx, g->exec, g->adamw, g->p, g->g, g->m, g->v, g->n, hp));
    return lt_cuda_check(ctx, cudaGraphLaunch(g->exec, lt_cuda_stream()), "graph: cudaGraphLaunch");
}

extern "C" void lt_cuda_graph_free(lt_graph *g) {
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}
