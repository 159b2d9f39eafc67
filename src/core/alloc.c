/* The accounting allocator (see alloc.h). Accounting uses atomics so kernels may allocate from
 * worker threads; the error message is written to the context only by the failing call. */
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "longtune/alloc.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

size_t lt_alloc_accounted_size(lt_device dev, size_t bytes) {
    size_t a = dev == LT_DEVICE_CPU ? LT_ALLOC_ALIGN_HOST : LT_ALLOC_ALIGN_DEVICE;
    if (bytes > SIZE_MAX - (a - 1)) return SIZE_MAX;
    return (bytes + a - 1) / a * a;
}

static int reserve(lt_ctx *ctx, lt_device dev, size_t sz) {
    struct lt_mem_dev *m = &ctx->mem[dev];
    size_t old = atomic_load(&m->used);
    for (;;) {
        if (sz > SIZE_MAX - old) return 0;
        if (m->limit && old + sz > m->limit) return 0;
        if (atomic_compare_exchange_weak(&m->used, &old, old + sz)) break;
    }
    size_t now = old + sz, peak = atomic_load(&m->peak);
    while (now > peak && !atomic_compare_exchange_weak(&m->peak, &peak, now)) {}
    return 1;
}

static const char *dev_name(lt_device dev) { return dev == LT_DEVICE_CPU ? "host" : "device"; }

/* The accounting half of an allocation: counts the attempt (fault injection) and reserves the
 * accounted size of `bytes` on dev under its limit. 1 = reserved (*sz set); 0 = refused with
 * LT_ERR_OOM in ctx. `kind` ("", "pinned ") goes into the messages. */
static int admit(lt_ctx *ctx, lt_device dev, size_t bytes, const char *what, const char *kind, size_t *sz) {
    struct lt_mem_dev *m = &ctx->mem[dev];
    uint64_t nth = atomic_fetch_add(&ctx->alloc_counter, 1) + 1;
    *sz = lt_alloc_accounted_size(dev, bytes);
    if (ctx->fail_nth && nth == ctx->fail_nth) {
        atomic_fetch_add(&m->n_failed, 1);
        lt_error(ctx, LT_ERR_OOM,
                 "out of %s memory: allocation %llu (%zu %sbytes for %s) failed by "
                 "fault injection",
                 dev_name(dev), (unsigned long long)nth, bytes, kind, what);
        return 0;
    }
    if (*sz == SIZE_MAX || !reserve(ctx, dev, *sz)) {
        atomic_fetch_add(&m->n_failed, 1);
        lt_error(ctx, LT_ERR_OOM,
                 "out of %s memory: %zu %sbytes for %s with %zu in use would pass "
                 "the limit of %zu bytes",
                 dev_name(dev), bytes, kind, what, atomic_load(&m->used), m->limit);
        return 0;
    }
    return 1;
}

/* Gives back a reservation whose memory the system refused (the caller says why). */
static void unreserve(lt_ctx *ctx, lt_device dev, size_t sz) {
    atomic_fetch_sub(&ctx->mem[dev].used, sz);
    atomic_fetch_add(&ctx->mem[dev].n_failed, 1);
}

void *lt_alloc(lt_ctx *ctx, lt_device dev, size_t bytes, const char *what) {
    if (!what) what = "buffer";
    if ((unsigned)dev >= LT_DEVICE_COUNT_ || bytes == 0) {
        lt_error(ctx, LT_ERR_INVALID_ARG, "allocation of %zu bytes for %s on device %d refused", bytes, what, (int)dev);
        return NULL;
    }
    size_t sz;
    if (!admit(ctx, dev, bytes, what, "", &sz)) return NULL;
    void *p = NULL;
    if (dev == LT_DEVICE_CPU) {
        p = aligned_alloc(LT_ALLOC_ALIGN_HOST, sz);
    } else {
#if LT_HAVE_CUDA
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            p = NULL;
        }
#else
        unreserve(ctx, dev, sz);
        lt_error(ctx, LT_ERR_UNSUPPORTED, "device allocation for %s: this build has no CUDA", what);
        return NULL;
#endif
    }
    if (!p) {
        unreserve(ctx, dev, sz);
        lt_error(ctx, LT_ERR_OOM, "out of %s memory: the system refused %zu bytes for %s", dev_name(dev), bytes, what);
        return NULL;
    }
    atomic_fetch_add(&ctx->mem[dev].n_allocs, 1);
    return p;
}

void *lt_calloc(lt_ctx *ctx, lt_device dev, size_t bytes, const char *what) {
    void *p = lt_alloc(ctx, dev, bytes, what);
    if (!p) return NULL;
    if (dev == LT_DEVICE_CPU) {
        memset(p, 0, bytes);
    } else {
#if LT_HAVE_CUDA
        if (cudaMemset(p, 0, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            lt_free(ctx, dev, p, bytes);
            lt_error(ctx, LT_ERR_CUDA, "cudaMemset of %zu bytes for %s failed", bytes, what);
            return NULL;
        }
#endif
    }
    return p;
}

void lt_free(lt_ctx *ctx, lt_device dev, void *ptr, size_t bytes) {
    if (!ptr) return;
    size_t sz = lt_alloc_accounted_size(dev, bytes);
    LT_ASSERT((unsigned)dev < LT_DEVICE_COUNT_);
    LT_ASSERT(atomic_load(&ctx->mem[dev].used) >= sz);
    atomic_fetch_sub(&ctx->mem[dev].used, sz);
    if (dev == LT_DEVICE_CPU) {
        free(ptr);
    } else {
#if LT_HAVE_CUDA
        cudaFree(ptr);
#endif
    }
}

void *lt_alloc_pinned(lt_ctx *ctx, size_t bytes, const char *what) {
    if (!what) what = "pinned buffer";
#if LT_HAVE_CUDA
    if (bytes == 0) {
        lt_error(ctx, LT_ERR_INVALID_ARG, "pinned allocation of 0 bytes for %s refused", what);
        return NULL;
    }
    size_t sz;
    if (!admit(ctx, LT_DEVICE_CPU, bytes, what, "pinned ", &sz)) return NULL;
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        unreserve(ctx, LT_DEVICE_CPU, sz);
        lt_error(ctx, LT_ERR_OOM, "out of host memory: the CUDA driver refused to pin %zu bytes for %s", bytes, what);
        return NULL;
    }
    atomic_fetch_add(&ctx->mem[LT_DEVICE_CPU].n_allocs, 1);
    struct lt_mem_dev *pm = &ctx->pinned;
    size_t now = atomic_fetch_add(&pm->used, sz) + sz, peak = atomic_load(&pm->peak);
    while (now > peak && !atomic_compare_exchange_weak(&pm->peak, &peak, now)) {}
    atomic_fetch_add(&pm->n_allocs, 1);
    return p;
#else
    (void)bytes;
    lt_error(ctx, LT_ERR_UNSUPPORTED, "pinned host memory for %s: this build has no CUDA", what);
    return NULL;
#endif
}

void lt_free_pinned(lt_ctx *ctx, void *ptr, size_t bytes) {
    if (!ptr) return;
    size_t sz = lt_alloc_accounted_size(LT_DEVICE_CPU, bytes);
    LT_ASSERT(atomic_load(&ctx->mem[LT_DEVICE_CPU].used) >= sz && atomic_load(&ctx->pinned.used) >= sz);
    atomic_fetch_sub(&ctx->mem[LT_DEVICE_CPU].used, sz);
    atomic_fetch_sub(&ctx->pinned.used, sz);
#if LT_HAVE_CUDA
    cudaFreeHost(ptr);
#endif
}

lt_mem_stats lt_mem_get_pinned_stats(const lt_ctx *ctx) {
    lt_mem_stats s = {0};
    if (!ctx) return s;
    s.used_bytes = atomic_load(&ctx->pinned.used);
    s.peak_bytes = atomic_load(&ctx->pinned.peak);
    s.n_allocs = atomic_load(&ctx->pinned.n_allocs);
    return s;
}

lt_mem_stats lt_mem_get_stats(const lt_ctx *ctx, lt_device dev) {
    lt_mem_stats s = {0};
    if (!ctx || (unsigned)dev >= LT_DEVICE_COUNT_) return s;
    const struct lt_mem_dev *m = &ctx->mem[dev];
    s.used_bytes = atomic_load(&m->used);
    s.peak_bytes = atomic_load(&m->peak);
    s.limit_bytes = m->limit;
    s.n_allocs = atomic_load(&m->n_allocs);
    s.n_failed = atomic_load(&m->n_failed);
    return s;
}

void lt_mem_reset_peak(lt_ctx *ctx, lt_device dev) {
    atomic_store(&ctx->mem[dev].peak, atomic_load(&ctx->mem[dev].used));
    if (dev == LT_DEVICE_CPU) atomic_store(&ctx->pinned.peak, atomic_load(&ctx->pinned.used));
}

void lt_mem_set_limit(lt_ctx *ctx, lt_device dev, size_t limit_bytes) { ctx->mem[dev].limit = limit_bytes; }

void lt_mem_fail_nth(lt_ctx *ctx, uint64_t n) {
    atomic_store(&ctx->alloc_counter, 0);
    ctx->fail_nth = n;
}
