/* The CPU backend's op table: the reference every other backend is checked against. */
#include <string.h>

#include "backend/backend.h"

static lt_status cpu_copy(lt_ctx *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes) memmove(dst, src, bytes);
    return LT_OK;
}

static lt_status cpu_sync(lt_ctx *ctx) {
    (void)ctx;
    return LT_OK;
}

const lt_backend lt_backend_cpu = {
    .name = "cpu",
    .device = LT_DEVICE_CPU,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_sync,
};
