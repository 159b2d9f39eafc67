/* The memory guard on a CUDA device: the device ceiling rule from cudaMemGetInfo, the device
 * allocator limit it sets, and the watchdog catching a cudaMalloc that bypassed the allocator.
 * The watchdog reads the whole device's used bytes, so ctest runs this test alone (RUN_SERIAL):
 * another test's device memory would move what it measures. Skipped (exit 77) without a device. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/sysinfo.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>

static int failures;
#define CHECK(cond) LT_TEST_CHECK(failures, cond)
#endif

#define MIB (1024ull * 1024ull)

int main(void) {
    lt_cuda_device_info cu = lt_sys_cuda();
    if (!cu.count) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
#if LT_HAVE_CUDA
    lt_log_set_level(LT_LOG_ERROR);
    lt_ctx *ctx = lt_ctx_new();
    lt_guard_ceiling c;
    CHECK(lt_guard_measure(ctx, LT_DEVICE_CUDA, NULL, &c) == LT_OK);
    CHECK(c.total_bytes == cu.total_bytes);
    CHECK(c.ceiling_bytes <= c.static_bytes && c.ceiling_bytes > 0);
    printf("device %s: total %llu, free %llu, cushion %llu, ceiling %llu\n", cu.name, (unsigned long long)c.total_bytes,
           (unsigned long long)c.available_bytes, (unsigned long long)c.cushion_bytes,
           (unsigned long long)c.ceiling_bytes);

    lt_guard_options o;
    memset(&o, 0, sizeof o);
    o.device = LT_DEVICE_CUDA;
    o.ceiling_bytes = 256 * MIB;
    o.allow_low_memory = 1;
    o.interval_s = 0.02;
    lt_guard *g = NULL;
    CHECK(lt_guard_start(ctx, &o, &g) == LT_OK);
    if (!g) return 1;
    CHECK(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).limit_bytes == 256 * MIB);
    CHECK(lt_guard_get_ceiling(g, LT_DEVICE_CPU).ceiling_bytes > 0); /* host guarded too */
    void *big = lt_alloc(ctx, LT_DEVICE_CUDA, 512 * MIB, "device activations");
    CHECK(big == NULL && lt_ctx_status(ctx) == LT_ERR_OOM);
    void *small = lt_alloc(ctx, LT_DEVICE_CUDA, 64 * MIB, "fits");
    CHECK(small != NULL);
    lt_free(ctx, LT_DEVICE_CUDA, small, 64 * MIB);
    /* Quiet for a while, then 1 GiB straight from cudaMalloc. */
    struct timespec ts = {0, 200000000};
    nanosleep(&ts, NULL);
    CHECK(!lt_guard_tripped(g));
    void *outside = NULL;
    CHECK(cudaMalloc(&outside, 1024 * MIB) == cudaSuccess);
    CHECK(cudaMemset(outside, 1, 1024 * MIB) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    for (int i = 0; i < 250 && !lt_guard_tripped(g); i++) {
        ts.tv_nsec = 20000000;
        nanosleep(&ts, NULL);
    }
    lt_guard_breach b = lt_guard_get_breach(g);
    CHECK(b.tripped && b.device == LT_DEVICE_CUDA);
    CHECK(b.source && !strcmp(b.source, "device_used"));
    CHECK(b.observed_bytes >= 1024 * MIB && b.ceiling_bytes == 256 * MIB);
    printf("breach: %s observed %llu > ceiling %llu after %.3f s\n", b.source ? b.source : "?",
           (unsigned long long)b.observed_bytes, (unsigned long long)b.ceiling_bytes, b.elapsed_s);
    cudaFree(outside);
    lt_guard_stop(g);
    CHECK(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).limit_bytes == 0);
    lt_ctx_free(ctx);
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
#else
    return 77;
#endif
}
