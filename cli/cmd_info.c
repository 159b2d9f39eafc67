/* `longtune info`: what this build and machine offer (features, CPU, memory, CUDA devices). */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "longtune/sysinfo.h"

static const char *usage = "longtune info [--help]";

int lt_cmd_info(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s\n\nPrints the build's features (CUDA, OpenMP, OpenBLAS, oneDNN), the CPU, host "
                   "memory (honouring a cgroup limit) and CUDA devices.\n",
                   usage);
            return LT_EXIT_OK;
        }
        return lt_cli_usage_error("info", usage, "unknown option '%s'", argv[i]);
    }
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    char cpu[256], b1[32], b2[32];
    int cores;
    lt_sys_cpu(cpu, sizeof cpu, &cores);
    printf("longtune %s\n", LT_VERSION_STRING);
    printf("features: cuda=%d openmp=%d openblas=%d onednn=%d cpu_bf16_products=%d\n", LT_HAVE_CUDA, LT_HAVE_OPENMP,
           LT_HAVE_OPENBLAS, LT_HAVE_ONEDNN, lt_sys_cpu_bf16_products());
    printf("cpu: %s (%d logical cores)\n", cpu, cores);
    lt_host_memory hm;
    lt_status s = lt_sys_host_memory(ctx, &hm);
    if (s != LT_OK) {
        int rc = lt_cli_fail("info", ctx, s);
        lt_ctx_free(ctx);
        return rc;
    }
    printf("host memory: %s total, %s available%s\n", lt_cli_fmt_bytes(hm.total_bytes, b1, 32),
           lt_cli_fmt_bytes(hm.available_bytes, b2, 32), hm.cgroup_limit ? " (cgroup limit)" : "");
    lt_cuda_device_info cu = lt_sys_cuda();
    if (cu.count)
        printf("cuda: %d device(s); 0: %s sm_%d%d, %s total, %s free, driver %d, runtime %d\n", cu.count, cu.name,
               cu.cc_major, cu.cc_minor, lt_cli_fmt_bytes(cu.total_bytes, b1, 32),
               lt_cli_fmt_bytes(cu.free_bytes, b2, 32), cu.driver_version, cu.runtime_version);
    else printf("cuda: %s\n", LT_HAVE_CUDA ? "no device" : "not built");
    lt_ctx_free(ctx);
    return LT_EXIT_OK;
}
