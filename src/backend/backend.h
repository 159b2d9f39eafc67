/* The op table every backend fills. The model calls ops only through it, so there is one model
 * file for every backend and precision. Ops validate nothing: the model and the public boundary
 * functions (lt_attention_*, lt_lce_*) have checked shapes before calling. Tensors carry their
 * device; a backend only ever sees its own device's memory. */
#ifndef LT_BACKEND_H
#define LT_BACKEND_H

#include "longtune/tensor.h"

typedef struct lt_backend {
    const char *name;
    lt_device device;
    /* Copies `bytes` between host and this backend's memory (or within it). */
    lt_status (*copy_to_device)(lt_ctx *ctx, void *dst, const void *src_host, size_t bytes);
    lt_status (*copy_to_host)(lt_ctx *ctx, void *dst_host, const void *src, size_t bytes);
    /* Waits for queued work (no-op on CPU). */
    lt_status (*synchronize)(lt_ctx *ctx);
} lt_backend;

/* The backend of a device; NULL when this build lacks it (CUDA without nvcc). */
const lt_backend *lt_backend_get(lt_device dev);

extern const lt_backend lt_backend_cpu;
#if LT_HAVE_CUDA
extern const lt_backend lt_backend_cuda;
#endif

#endif
