/* What the machine has: host memory (honouring a cgroup v1/v2 limit), the process's resident set,
 * the CPU model, and CUDA devices when the build has them. Used by the planner's auto budget, the
 * memory guard and benchmark provenance. Reads /proc and /sys only; no side effects. */
#ifndef LONGTUNE_SYSINFO_H
#define LONGTUNE_SYSINFO_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_host_memory {
    uint64_t total_bytes;     /* min(MemTotal, cgroup limit) */
    uint64_t available_bytes; /* min(MemAvailable, cgroup limit - cgroup usage) */
    uint64_t cgroup_limit;    /* 0 when no limit is set */
} lt_host_memory;

LT_API lt_status lt_sys_host_memory(lt_ctx *ctx, lt_host_memory *out);
/* Resident set size of this process in bytes (0 if /proc is unreadable). */
LT_API uint64_t lt_sys_process_rss(void);
/* CPU model name and logical core count. */
LT_API void lt_sys_cpu(char *name, int n, int *cores);
/* 1 when this CPU makes the bf16 products (bf16_products, train --bf16-products): a build with
 * oneDNN on a CPU oneDNN makes them on (AVX-512 and up); 0 where the option is refused. */
LT_API int lt_sys_cpu_bf16_products(void);

/* OpenBLAS picks its kernels from the CPU model it recognises; on CPUs newer than the library
 * (e.g. Sapphire/Emerald Rapids with OpenBLAS 0.3.21) it falls back to generic SSE3 "Prescott"
 * kernels, 3-4x slower. Returns the OPENBLAS_CORETYPE to use ("SkylakeX" with AVX-512, "Haswell"
 * with AVX2+FMA) when the loaded kernels are weaker than what the CPU supports, else NULL. The
 * variable is read when OpenBLAS loads, so callers must set it and re-execute (the CLI does). */
LT_API const char *lt_sys_blas_coretype_hint(void);

typedef struct lt_cuda_device_info {
    int count;      /* 0 when no device or no CUDA in the build */
    char name[256]; /* device 0 */
    uint64_t total_bytes, free_bytes;
    int driver_version, runtime_version, cc_major, cc_minor;
} lt_cuda_device_info;

/* Never fails: a build without CUDA or a machine without a device reports count 0. */
LT_API lt_cuda_device_info lt_sys_cuda(void);

#ifdef __cplusplus
}
#endif
#endif
