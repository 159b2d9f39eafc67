/* The accounting allocator: every host and device allocation of the library goes through it.
 * It keeps used and high-water bytes per device in the context, enforces a hard limit per device
 * (the allocation fails cleanly with LT_ERR_OOM) and can fail the n-th allocation on purpose so
 * tests can walk every failure path. It does not pool or cache: a free returns memory at once. */
#ifndef LONGTUNE_ALLOC_H
#define LONGTUNE_ALLOC_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment of every host block; sizes are accounted rounded up to it (device: 256 bytes, as
 * cudaMalloc). lt_alloc_accounted_size is the number the planner must add up. */
#define LT_ALLOC_ALIGN_HOST 64
#define LT_ALLOC_ALIGN_DEVICE 256
LT_API size_t lt_alloc_accounted_size(lt_device dev, size_t bytes);

/* Allocates `bytes` on dev (CPU: 64-byte aligned host memory; CUDA: cudaMalloc). `what` names
 * the buffer in error messages. bytes == 0 is LT_ERR_INVALID_ARG. On failure returns NULL and records LT_ERR_OOM (or LT_ERR_UNSUPPORTED for CUDA in a CPU-only
 * build) in ctx, with the requested size and the limit in the message. */
LT_API void *lt_alloc(lt_ctx *ctx, lt_device dev, size_t bytes, const char *what);
/* Same, zero-filled. */
LT_API void *lt_calloc(lt_ctx *ctx, lt_device dev, size_t bytes, const char *what);
/* Frees a block from lt_alloc; `bytes` must be the size it was allocated with. NULL is a no-op. */
LT_API void lt_free(lt_ctx *ctx, lt_device dev, void *ptr, size_t bytes);

typedef struct lt_mem_stats {
    size_t used_bytes;  /* accounted bytes currently live */
    size_t peak_bytes;  /* high-water of used_bytes since the context was made or reset */
    size_t limit_bytes; /* hard limit, 0 = none */
    uint64_t n_allocs;  /* successful allocations so far */
    uint64_t n_failed;  /* refused allocations (limit, injection or the system) */
} lt_mem_stats;

LT_API lt_mem_stats lt_mem_get_stats(const lt_ctx *ctx, lt_device dev);

/* Page-locked ("pinned") host memory, for buffers a device copies to and from while it computes
 * (the model's offloaded checkpoints): cudaHostAlloc in a CUDA build. It is host RAM, so it is
 * accounted on LT_DEVICE_CPU (the host's limit, high-water and the guard see it, rounded as any
 * host block) and counted once more on its own (lt_mem_get_pinned_stats), so a plan's host side
 * can be compared with it exactly. Fault injection counts it like any allocation. Errors (NULL
 * returned, status in ctx): LT_ERR_INVALID_ARG for 0 bytes, LT_ERR_OOM (host limit, injection,
 * or the driver refused), LT_ERR_UNSUPPORTED in a build without CUDA. */
LT_API void *lt_alloc_pinned(lt_ctx *ctx, size_t bytes, const char *what);
/* Frees a block from lt_alloc_pinned of `bytes`. NULL is a no-op. */
LT_API void lt_free_pinned(lt_ctx *ctx, void *ptr, size_t bytes);
/* The pinned blocks alone (used, high-water since the context was made or the host peak reset;
 * limit_bytes is 0: the host limit applies to them). */
LT_API lt_mem_stats lt_mem_get_pinned_stats(const lt_ctx *ctx);
/* Peak := current used (on LT_DEVICE_CPU, the pinned high-water too). */
LT_API void lt_mem_reset_peak(lt_ctx *ctx, lt_device dev);
/* Hard limit on accounted bytes for dev; 0 removes it. */
LT_API void lt_mem_set_limit(lt_ctx *ctx, lt_device dev, size_t limit_bytes);
/* Fault injection: the n-th allocation from now on (1-based, any device) fails with LT_ERR_OOM;
 * n = 0 disables. The counter is per context. */
LT_API void lt_mem_fail_nth(lt_ctx *ctx, uint64_t n);

#ifdef __cplusplus
}
#endif
#endif
