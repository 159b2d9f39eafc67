/* Op profiler: where a step's time goes, per phase (first forward, loss, recompute, backward) and
 * per op, on any backend. It wraps a backend's op table (lt_backend_profiled), so with the
 * profiler off nothing is timed and nothing is paid: lt_backend_get hands out the plain table.
 * Timestamps are CUDA events on the stream the ops run on (read once the step has finished) or,
 * on the CPU, the wall clock (CPU ops are synchronous). It does not look inside an op, except
 * where the op marks a nested part itself (the CUDA matmul's bf16 conversions); one host thread. */
#ifndef LT_BACKEND_PROF_H
#define LT_BACKEND_PROF_H

#include <stdint.h>

#include "backend/backend.h"

typedef enum lt_prof_phase {
    LT_PROF_OTHER = 0, /* outside a model step: optimizer, zeroing, inputs */
    LT_PROF_FORWARD,   /* the first pass through the layers */
    LT_PROF_LOSS,      /* final norm and the fused loss (forward and its gradient) */
    LT_PROF_RECOMPUTE, /* the checkpointed layers' forward again */
    LT_PROF_BACKWARD,  /* layer backward passes */
    LT_PROF_PHASE_COUNT_
} lt_prof_phase;

typedef enum lt_prof_op {
    LT_PROF_MATMUL = 0,       /* weight product, conversions excluded */
    LT_PROF_MATMUL_CVT,       /* nested in matmul: x (f32) to bf16 */
    LT_PROF_MATMUL_DEQUANT,   /* nested in matmul: a weight tile to bf16, or an fp8 W transposed */
    LT_PROF_MATMUL_FP8_SCALE, /* nested in matmul: the scales of an fp8 product that cuBLASLt could not scale */
    LT_PROF_GEMM,             /* f32 GEMMs (LoRA factors) */
    LT_PROF_ATTN_FWD,
    LT_PROF_ATTN_BWD,
    LT_PROF_LCE,
    LT_PROF_RMSNORM_FWD,
    LT_PROF_RMSNORM_BWD,
    LT_PROF_ROPE,
    LT_PROF_SWIGLU_FWD,
    LT_PROF_SWIGLU_BWD,
    LT_PROF_EMBEDDING,
    LT_PROF_ADD,
    LT_PROF_ADD_BIAS,
    LT_PROF_DROPOUT,
    LT_PROF_ADAMW,
    LT_PROF_ZERO,
    LT_PROF_SCALE,
    LT_PROF_SUMSQ,
    LT_PROF_COPY,
    LT_PROF_SYNC,
    LT_PROF_SAVED_CVT,      /* to_bf16 / from_bf16: checkpoints and kept outputs to and from bf16 */
    LT_PROF_MOE_ROUTE,      /* moe_route / moe_route_bwd */
    LT_PROF_MOE_DISPATCH,   /* moe_sort, moe_gather, moe_combine and their backwards */
    LT_PROF_GROUPED_MATMUL, /* the experts' grouped products */
    LT_PROF_OP_COUNT_
} lt_prof_op;

/* Milliseconds and calls accumulated by lt_prof_collect. op_ms excludes nested parts (a matmul's
 * conversions are in LT_PROF_MATMUL_CVT, not in LT_PROF_MATMUL); phase_ms is the device (or wall)
 * time from one phase change to the next, so phase_ms minus the ops of that phase is time
 * between ops (launch gaps, host work the device waited for). dropped: records lost because the
 * mark pool was full (the totals then undercount). */
typedef struct lt_prof_totals {
    double op_ms[LT_PROF_PHASE_COUNT_][LT_PROF_OP_COUNT_];
    int64_t calls[LT_PROF_PHASE_COUNT_][LT_PROF_OP_COUNT_];
    double phase_ms[LT_PROF_PHASE_COUNT_];
    int64_t steps, dropped;
} lt_prof_totals;

/* Nonzero while profiling (checked inline by the hooks: the cost of a hook when off). */
extern int lt_prof_active;

/* Turns profiling on or off for tables handed out from now on (lt_backend_get wraps when on);
 * LONGTUNE_PROFILE=1 in the environment turns it on at the first lt_backend_get. */
void lt_prof_enable(int on);

/* The profiling wrapper of be (the CPU or CUDA table); be itself when be is not one of them. */
const lt_backend *lt_backend_profiled(const lt_backend *be);

/* Hooks (no-ops when profiling is off). set_phase starts a phase at this point of dev's queue.
 * begin opens an op record and returns its handle (-1 when off or the pool is full); end closes
 * it. A record opened inside another is nested: its time is taken out of the outer one. */
void lt_prof_set_phase(lt_device dev, lt_prof_phase ph);
int lt_prof_begin(lt_device dev, lt_prof_op op);
void lt_prof_end(int handle);

/* Waits for dev's queued work, adds every closed record since the last collect into *tot (one
 * step), and starts over. Returns LT_ERR_CUDA when the device reports a failure. */
lt_status lt_prof_collect(lt_ctx *ctx, lt_device dev, lt_prof_totals *tot);

const char *lt_prof_op_name(lt_prof_op op);
const char *lt_prof_phase_name(lt_prof_phase ph);

/* CUDA side of the clock (src/backend/cuda/prof_cuda.cu): records an event in pool slot `slot`
 * (created on first use) on the ops' stream; elapsed milliseconds between two recorded slots
 * after lt_cuda_prof_wait. Return 0 / LT_OK, or nonzero / LT_ERR_CUDA on failure. */
#if LT_HAVE_CUDA
int lt_cuda_prof_record(int slot);
lt_status lt_cuda_prof_wait(lt_ctx *ctx);
float lt_cuda_prof_ms(int a, int b);
#endif

#endif
