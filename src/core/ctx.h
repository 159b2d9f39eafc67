/* Private layout of lt_ctx, shared by the core files that read or update it. */
#ifndef LT_CORE_CTX_H
#define LT_CORE_CTX_H

#include <stdatomic.h>
#include "longtune/status.h"

struct lt_mem_dev {
    atomic_size_t used;
    atomic_size_t peak;
    size_t limit;
    atomic_uint_fast64_t n_allocs;
    atomic_uint_fast64_t n_failed;
};

struct lt_ctx {
    lt_status status;
    char error[1024];
    int threads;
    struct lt_mem_dev mem[LT_DEVICE_COUNT_];
    struct lt_mem_dev pinned;           /* the part of mem[LT_DEVICE_CPU] that is page-locked */
    atomic_uint_fast64_t alloc_counter; /* allocations attempted since fail_nth was armed */
    uint64_t fail_nth;                  /* 0 = off */
    size_t bf16x;                       /* lt_ctx_set_bf16x: the workspace bytes of bf16 products */
    /* One backend instance state per device (core/ctx_state.h), made on first use by that
     * backend and freed with the context. */
    void *backend_state[LT_DEVICE_COUNT_];
    void (*backend_state_free[LT_DEVICE_COUNT_])(void *state);
};

#endif
