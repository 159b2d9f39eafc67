/* Backend lookup by device (the op profiler's wrapper table instead when profiling is on), the
 * supports query of a device whose backend may be missing from this build, and whether the CPU
 * makes the bf16 products. */
#include <stdlib.h>

#include "backend.h"
#include "longtune/sysinfo.h"
#include "prof.h"

static const lt_backend *plain(lt_device dev) {
    switch (dev) {
    case LT_DEVICE_CPU: return &lt_backend_cpu;
#if LT_HAVE_CUDA
    case LT_DEVICE_CUDA: return &lt_backend_cuda;
#endif
    default: return NULL;
    }
}

const lt_backend *lt_backend_get(lt_device dev) {
    static int env_read;
    if (!env_read) {
        const char *e = getenv("LONGTUNE_PROFILE");
        if (e && *e && *e != '0') lt_prof_enable(1);
        env_read = 1;
    }
    const lt_backend *be = plain(dev);
    return be && lt_prof_active ? lt_backend_profiled(be) : be;
}

lt_status lt_backend_supports(lt_ctx *ctx, lt_device dev, const lt_op_query *q) {
    const lt_backend *be = plain(dev);
    if (be) return be->supports(ctx, q);
    /* not in this build: that backend's refusals (which end with saying so) */
    if (dev == LT_DEVICE_CUDA) return lt_backend_cuda_supports(ctx, q);
    return lt_error(ctx, LT_ERR_UNSUPPORTED, "backend of device %d is not in this build", (int)dev);
}

int lt_sys_cpu_bf16_products(void) {
    const lt_backend *be = plain(LT_DEVICE_CPU);
    return be && be->matmul_bf16x_workspace_bytes && be->matmul_bf16x_available && be->matmul_bf16x_available();
}
