#include "helpers/backends.h"

#include <math.h>
#include <stdio.h>

#include "backend/backend.h"
#include "helpers/test_util.h"
#include "longtune/sysinfo.h"

int lt_test_cuda_present(void) { return lt_backend_get(LT_DEVICE_CUDA) != NULL && lt_sys_cuda().count > 0; }

int lt_test_backends(lt_device *devs) {
    int n = 0;
    devs[n++] = LT_DEVICE_CPU;
    if (lt_test_cuda_present()) devs[n++] = LT_DEVICE_CUDA;
    else printf("cuda: skipped: no CUDA device%s\n", LT_HAVE_CUDA ? "" : " (this build has no CUDA)");
    return n;
}

const char *lt_test_backend_name(lt_device dev) { return dev == LT_DEVICE_CUDA ? "cuda" : "cpu"; }

lt_dtype lt_test_input_dtype(lt_device dev) { return dev == LT_DEVICE_CUDA ? LT_DTYPE_BF16 : LT_DTYPE_F32; }

double lt_test_tol_for(lt_dtype dt, int64_t k) {
    const double u_f32 = 0x1.0p-24;
    const double u = dt == LT_DTYPE_BF16 ? 0x1.0p-9 : dt == LT_DTYPE_F16 ? 0x1.0p-12 : u_f32;
    const double t = 2.0 * (3.0 * u + 4.0 * u_f32 * sqrt((double)(k > 1 ? k : 1)));
    return t > LT_TOL_F32_REL ? t : LT_TOL_F32_REL;
}
