/* Backend lookup by device; the op profiler's wrapper table instead when profiling is on. */
#include <stdlib.h>

#include "backend.h"
#include "prof.h"

static const lt_backend *plain(lt_device dev) {
    switch (dev) {
    case LT_DEVICE_CPU:
        return &lt_backend_cpu;
#if LT_HAVE_CUDA
    case LT_DEVICE_CUDA:
        return &lt_backend_cuda;
#endif
    default:
        return NULL;
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
