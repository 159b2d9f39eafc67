/* The CPU backend's op table: the reference every other backend is checked against. */
#include <stdint.h>
#include <string.h>

#include "backend/attention_impl.h"
#include "backend/backend.h"
#include "backend/lce_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/ops_matmul_bf16.h"
#include "core/parallel.h"

/* Copies of at least COPY_SPLIT_BYTES between disjoint ranges run in contiguous pieces on the
 * context's threads (one core does not reach the memory bandwidth of two). */
#define COPY_SPLIT_BYTES ((size_t)1 << 20)
#define COPY_GRAIN ((int64_t)1 << 16)

typedef struct {
    char *dst;
    const char *src;
    size_t bytes;
} copy_job;

static void copy_pieces(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const copy_job *j = arg;
    const size_t lo = (size_t)b * (size_t)COPY_GRAIN, hi = (size_t)e * (size_t)COPY_GRAIN;
    memcpy(j->dst + lo, j->src + lo, (hi < j->bytes ? hi : j->bytes) - lo);
}

static lt_status cpu_copy(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    if (!bytes) return LT_OK;
    const uintptr_t d = (uintptr_t)dst, sp = (uintptr_t)src;
    if (bytes >= COPY_SPLIT_BYTES && (d + bytes <= sp || sp + bytes <= d)) {
        copy_job j = {dst, src, bytes};
        lt_parallel_for(lt_ctx_threads(ctx), (int64_t)((bytes + (size_t)COPY_GRAIN - 1) / (size_t)COPY_GRAIN), 1,
                        copy_pieces, &j);
        return LT_OK;
    }
    memmove(dst, src, bytes);
    return LT_OK;
}

/* The copy queue of the CPU: every op has finished when the next is called, so a copy runs at
 * once and a mark is always set. The handle only has to be non-NULL. */
static int cpu_xfer_handle;

static lt_status cpu_xfer_open(lt_ctx *ctx, void **q) {
    (void)ctx;
    *q = &cpu_xfer_handle;
    return LT_OK;
}

static void cpu_xfer_close(lt_ctx *ctx, void *q) { (void)ctx, (void)q; }

static lt_status cpu_xfer_copy(lt_ctx *ctx, void *q, int mark, void *dst, const void *src, size_t bytes) {
    (void)q, (void)mark;
    return cpu_copy(ctx, dst, src, bytes);
}

static lt_status cpu_xfer_wait(lt_ctx *ctx, void *q, int mark) {
    (void)ctx, (void)q, (void)mark;
    return LT_OK;
}

static lt_status cpu_sync(lt_ctx *ctx) {
    (void)ctx;
    return LT_OK;
}

/* CPU ops run on the calling thread: there is no stream to order against. */
static void *cpu_native_stream(lt_ctx *ctx) {
    (void)ctx;
    return NULL;
}

/* The CPU kernels look the packed sequences up themselves: a batch needs only the boundary's
 * validation. */
static size_t cpu_attention_batch_bytes(const lt_attention_params *p) {
    (void)p;
    return 0;
}

static lt_status cpu_attention_batch_prepare(lt_ctx *ctx, const lt_attention_params *p, lt_attention_batch *b) {
    (void)ctx, (void)p, (void)b;
    return LT_OK;
}

const lt_backend lt_backend_cpu = {
    .name = "cpu",
    .device = LT_DEVICE_CPU,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_sync,
    .xfer_open = cpu_xfer_open,
    .xfer_close = cpu_xfer_close,
    .xfer_copy = cpu_xfer_copy,
    .xfer_wait = cpu_xfer_wait,
    .supports = lt_backend_cpu_supports,
    .native_stream = cpu_native_stream,
    .gemm = lt_cpu_gemm,
    .matmul = lt_cpu_matmul,
    .matmul_workspace_bytes = lt_cpu_matmul_workspace_bytes,
#if LT_HAVE_ONEDNN
    .matmul_bf16x_workspace_bytes = lt_cpu_bf16x_workspace_bytes,
    .matmul_bf16x_available = lt_cpu_bf16x_available,
#endif
    .rmsnorm_fwd = lt_cpu_rmsnorm_fwd,
    .rmsnorm_bwd = lt_cpu_rmsnorm_bwd,
    .rope = lt_cpu_rope,
    .swiglu_fwd = lt_cpu_swiglu_fwd,
    .swiglu_bwd = lt_cpu_swiglu_bwd,
    .geglu_fwd = lt_cpu_geglu_fwd,
    .geglu_bwd = lt_cpu_geglu_bwd,
    .embedding = lt_cpu_embedding,
    .add = lt_cpu_add,
    .add_bias = lt_cpu_add_bias,
    .dropout = lt_cpu_dropout,
    .adamw = lt_cpu_adamw,
    .zero = lt_cpu_zero,
    .scale = lt_cpu_scale,
    .sumsq = lt_cpu_sumsq,
    .to_bf16 = lt_cpu_to_bf16,
    .from_bf16 = lt_cpu_from_bf16,
    .saved_dtype = LT_DTYPE_F32,
    .lora_fwd = lt_cpu_lora_fwd,
    .lora_bwd = lt_cpu_lora_bwd,
    .lora_workspace_bytes = lt_cpu_lora_workspace_bytes,
    .attention_workspace_bytes = lt_attention_cpu_workspace_bytes,
    .attention_fwd = lt_attention_cpu_forward,
    .attention_bwd = lt_attention_cpu_backward,
    .attention_batch_bytes = cpu_attention_batch_bytes,
    .attention_batch_prepare = cpu_attention_batch_prepare,
    .decode_attention_workspace_bytes = lt_cpu_decode_attention_workspace_bytes,
    .decode_attention = lt_cpu_decode_attention,
    .lce_workspace_bytes = lt_lce_cpu_workspace_bytes,
    .lce_fwd = lt_lce_cpu_forward,
    .lce_bwd = lt_lce_cpu_backward,
    .lce_fwd_bwd = lt_lce_cpu_forward_backward,
    .moe_route = lt_cpu_moe_route,
    .moe_route_bwd = lt_cpu_moe_route_bwd,
    .moe_sort = lt_cpu_moe_sort,
    .moe_gather = lt_cpu_moe_gather,
    .moe_gather_bwd = lt_cpu_moe_gather_bwd,
    .moe_combine = lt_cpu_moe_combine,
    .moe_combine_bwd = lt_cpu_moe_combine_bwd,
    .grouped_matmul = lt_cpu_grouped_matmul,
    .grouped_matmul_workspace_bytes = lt_cpu_grouped_matmul_workspace_bytes,
    .grouped_matmul_wgrad = lt_cpu_grouped_matmul_wgrad,
};
