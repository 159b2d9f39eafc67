/* Backend lookup by device. */
#include "backend.h"

const lt_backend *lt_backend_get(lt_device dev) {
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
