/* Whole-step CUDA graphs: the backend's own stream, stream capture of everything the ops queue on
 * it, instantiation, and replay with the one host value a fixed-shape step changes (AdamW's
 * learning rate and bias corrections, written into the captured optimizer node). Inputs reach a
 * replay through copies from pinned host memory captured as graph nodes. The capture state lives in
 * the context's backend state (cuda_state.cuh). It decides nothing about when a step may be
 * captured (the trainer does) and keeps no graph of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_state.cuh"

struct lt_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    /* The captured AdamW launch (node NULL when the step had none) and its buffers. */
    cudaGraphNode_t adamw;
    float *p, *m, *v;
    const float *g;
    int64_t n;
};

void lt_cuda_graph_note_adamw(lt_ctx *ctx, float *p, const float *g, float *m, float *v, int64_t n) {
    lt_cuda_capture *cap = &lt_cuda_state_of(ctx)->cap;
    cudaStreamCaptureStatus cs;
    const cudaGraphNode_t *deps = NULL;
    size_t nd = 0;
    cudaError_t e = cudaStreamGetCaptureInfo(lt_cuda_stream(ctx), &cs, NULL, NULL, &deps, NULL, &nd);
    if (e != cudaSuccess) {
        lt_cuda_capture_fail(ctx, "adamw: cudaStreamGetCaptureInfo", e);
        return;
    }
    if (cs != cudaStreamCaptureStatusActive || nd != 1 || ++cap->adamw_count > 1) {
        if (!cap->fail[0])
            snprintf(cap->fail, sizeof cap->fail, "a captured step may hold one AdamW launch (%d seen)",
                     cap->adamw_count);
        return;
    }
    cap->adamw = deps[0];
    cap->p = p, cap->g = g, cap->m = m, cap->v = v, cap->n = n;
}

/* The context's own stream, made once for its state: blocking (no cudaStreamNonBlocking), so
 * work anyone still queues on the legacy stream stays ordered with it; under capture such work
 * fails loudly (cudaErrorStreamCaptureImplicit) instead of silently running outside the graph.
 * The cuBLASLt handle and the gemm workspace are made here too: nothing may allocate while the
 * capture runs. */
static lt_status own_stream(lt_ctx *ctx, lt_cuda_state *st) {
    pthread_mutex_lock(&st->blas_mu);
    (void)lt_cuda_blas_handle(st);
    pthread_mutex_unlock(&st->blas_mu);
    if (st->stream) return LT_OK;
    cudaStream_t s;
    LT_TRY(lt_cuda_check(ctx, cudaStreamCreate(&s), "graph: cudaStreamCreate"));
    st->stream = s;
    return LT_OK;
}

extern "C" lt_status lt_cuda_graph_begin(lt_ctx *ctx) {
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    if (!st) return lt_error(ctx, LT_ERR_INVALID_ARG, "graph: a capture needs a context");
    lt_cuda_capture *cap = &st->cap;
    if (cap->active) return lt_error(ctx, LT_ERR_INVALID_ARG, "graph: a capture is already running");
    LT_TRY(own_stream(ctx, st));
    /* Work queued before the capture must be done: a replay must not overlap the eager steps. */
    LT_TRY(lt_cuda_check(ctx, cudaStreamSynchronize(st->stream), "graph: cudaStreamSynchronize"));
    memset(cap, 0, sizeof *cap);
    /* Thread-local mode: a call of this thread that would wait on or allocate for the device while
     * we capture fails (and the capture with it) instead of changing what a replay means; other
     * threads (the memory guard's watchdog reads cudaMemGetInfo) stay free. Work queued on the
     * legacy stream meanwhile fails in any mode, as our stream is a blocking one. */
    LT_TRY(lt_cuda_check(ctx, cudaStreamBeginCapture(st->stream, cudaStreamCaptureModeThreadLocal),
                         "graph: cudaStreamBeginCapture"));
    cap->active = 1;
    return LT_OK;
}

extern "C" lt_status lt_cuda_graph_end(lt_ctx *ctx, lt_graph **out) {
    *out = NULL;
    lt_cuda_state *st = lt_cuda_state_of(ctx);
    if (!st || !st->cap.active) return lt_error(ctx, LT_ERR_INVALID_ARG, "graph: no capture is running");
    lt_cuda_capture *cap = &st->cap;
    cap->active = 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(st->stream, &graph);
    (void)cudaGetLastError();
    if (e != cudaSuccess || !graph || cap->fail[0]) {
        if (graph) cudaGraphDestroy(graph);
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "graph: the step could not be captured (%s)",
                        cap->fail[0] ? cap->fail : cudaGetErrorString(e));
    }
    lt_graph *g = (lt_graph *)calloc(1, sizeof *g); /* a handle of a few pointers, outside the planner's device
                                                       and host classes like the graph itself */
    if (!g) {
        cudaGraphDestroy(graph);
        return lt_error(ctx, LT_ERR_OOM, "graph: handle");
    }
    g->adamw = cap->adamw;
    g->p = cap->p, g->g = cap->g, g->m = cap->m, g->v = cap->v, g->n = cap->n;
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
    if (g->adamw && hp) LT_TRY(lt_cuda_adamw_node_params(ctx, g->exec, g->adamw, g->p, g->g, g->m, g->v, g->n, hp));
    return lt_cuda_check(ctx, cudaGraphLaunch(g->exec, lt_cuda_stream(ctx)), "graph: cudaGraphLaunch");
}

extern "C" void lt_cuda_graph_free(lt_graph *g) {
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}
