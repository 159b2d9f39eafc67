/* Host and device facts (see sysinfo.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longtune/sysinfo.h"

#include <cblas.h>
#include <strings.h>

#if LT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

static int read_u64_file(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char buf[64];
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || !strncmp(buf, "max", 3)) return 0;
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf) return 0;
    *out = v;
    return 1;
}

static uint64_t meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    size_t klen = strlen(key);
    uint64_t v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            v = strtoull(line + klen + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

lt_status lt_sys_host_memory(lt_ctx *ctx, lt_host_memory *out) {
    memset(out, 0, sizeof *out);
    uint64_t total = meminfo_kb("MemTotal") * 1024, avail = meminfo_kb("MemAvailable") * 1024;
    if (!total) return lt_error(ctx, LT_ERR_IO, "/proc/meminfo: cannot read MemTotal");
    uint64_t limit = 0, usage = 0;
    int have =
        read_u64_file("/sys/fs/cgroup/memory.max", &limit) && read_u64_file("/sys/fs/cgroup/memory.current", &usage);
    if (!have)
        have = read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes", &limit) &&
            read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes", &usage);
    if (have && limit < total) {
        out->cgroup_limit = limit;
        total = limit;
        uint64_t left = limit > usage ? limit - usage : 0;
        if (left < avail) avail = left;
    }
    out->total_bytes = total;
    out->available_bytes = avail;
    return LT_OK;
}

uint64_t lt_sys_process_rss(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f) return 0;
    unsigned long long size = 0, rss = 0;
    int n = fscanf(f, "%llu %llu", &size, &rss);
    fclose(f);
    return n == 2 ? rss * (uint64_t)sysconf(_SC_PAGESIZE) : 0;
}

void lt_sys_cpu(char *name, int n, int *cores) {
    snprintf(name, (size_t)n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *p = strchr(line, ':');
                if (p) {
                    p++;
                    while (*p == ' ') p++;
                    p[strcspn(p, "\n")] = '\0';
                    snprintf(name, (size_t)n, "%s", p);
                }
                break;
            }
        fclose(f);
    }
    *cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
}

lt_cuda_device_info lt_sys_cuda(void) {
    lt_cuda_device_info info;
    memset(&info, 0, sizeof info);
#if LT_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
        (void)cudaGetLastError();
        return info;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        (void)cudaGetLastError();
        return info;
    }
    info.count = count;
    snprintf(info.name, sizeof info.name, "%s", prop.name);
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        info.free_bytes = fr;
        info.total_bytes = tot;
    }
    cudaDriverGetVersion(&info.driver_version);
    cudaRuntimeGetVersion(&info.runtime_version);
#endif
    return info;
}

const char *lt_sys_blas_coretype_hint(void) {
#if defined(__x86_64__)
    const char *core = openblas_get_corename();
    if (!core) return NULL;
    __builtin_cpu_init();
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    static const char *const avx512_cores[] = {"skylakex", "cooperlake", "sapphirerapids", "zen"};
    static const char *const weak_cores[] = {"prescott",    "core2", "penryn", "dunnington", "nehalem",
                                             "sandybridge", "atom",  "katmai", "coppermine", "northwood"};
    if (avx512) {
        for (size_t i = 0; i < sizeof avx512_cores / sizeof *avx512_cores; i++)
            if (!strcasecmp(core, avx512_cores[i])) return NULL;
        return "SkylakeX";
    }
    if (avx2)
        for (size_t i = 0; i < sizeof weak_cores / sizeof *weak_cores; i++)
            if (!strcasecmp(core, weak_cores[i])) return "Haswell";
#endif
    return NULL;
}
