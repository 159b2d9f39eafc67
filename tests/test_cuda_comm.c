/* The NCCL transport with the world one GPU allows (one rank): the communicator comes up with
 * NVLink multicast off (NCCL_NVLS_ENABLE=0 in the environment), and sum all-reduce (f32, f64,
 * bucketed), broadcast, send/receive to itself and barrier run through NCCL on device buffers and
 * return the exact bits a world of one must (the sum of one contribution), also through the gradient
 * reducer's buckets started on the stream as ranges are marked; bad roots are typed
 * errors and ring attention refuses device buffers. Several ranks need several GPUs: not run here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/comm.h"
#include "longtune/context_parallel.h"
#include "longtune/log.h"
#include "longtune/sysinfo.h"

#if LT_HAVE_NCCL
#include <cuda_runtime.h>

static int failures;
#define CHECK(cond) LT_TEST_CHECK(failures, cond)

/* Host to a fresh device buffer (NULL on failure). */
static void *to_dev(const void *h, size_t n) {
    void *d = NULL;
    if (cudaMalloc(&d, n) != cudaSuccess) return NULL;
    cudaMemcpy(d, h, n, cudaMemcpyHostToDevice);
    return d;
}

static int same_as_host(const void *d, const void *h, size_t n) {
    void *b = malloc(n);
    cudaMemcpy(b, d, n, cudaMemcpyDeviceToHost);
    int eq = !memcmp(b, h, n);
    free(b);
    return eq;
}
#endif

int main(void) {
    lt_cuda_device_info cu = lt_sys_cuda();
    if (!cu.count) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
#if !LT_HAVE_NCCL
    printf("skipped: this build has no NCCL\n");
    return 77;
#else
    lt_log_set_level(LT_LOG_WARN);
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed();
    unsetenv("NCCL_NVLS_ENABLE");
    lt_comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = LT_COMM_NCCL;
    lt_comm *c = NULL;
    lt_status s = lt_comm_init(ctx, &o, &c);
    if (s != LT_OK) {
        fprintf(stderr, "lt_comm_init(NCCL): %s\n", lt_ctx_error(ctx));
        return 1;
    }
    const char *nvls = getenv("NCCL_NVLS_ENABLE");
    CHECK(nvls && !strcmp(nvls, "0"));
    CHECK(lt_comm_rank(c) == 0 && lt_comm_size(c) == 1);
    CHECK(lt_comm_device(c) == LT_DEVICE_CUDA);
    CHECK(lt_comm_get_backend(c) == LT_COMM_NCCL);

    const int64_t n = ((int64_t)1 << 20) + 7;
    float *h = malloc((size_t)n * sizeof *h);
    lt_test_fill_normal(&rng, h, n, 1.0f);
    float *d = to_dev(h, (size_t)n * sizeof *h);
    CHECK(d != NULL);
    CHECK(lt_comm_allreduce_sum(ctx, c, d, n, LT_COMM_F32) == LT_OK);
    CHECK(same_as_host(d, h, (size_t)n * sizeof *h));
    CHECK(lt_comm_allreduce_sum_bucketed(ctx, c, d, n, 65536 + 3) == LT_OK);
    CHECK(same_as_host(d, h, (size_t)n * sizeof *h));
    /* The gradient reducer on the NCCL stream: buckets started as ranges are marked, then waited. */
    lt_comm_reducer *red = NULL;
    CHECK(lt_comm_reducer_init(ctx, c, d, n, 100003, &red) == LT_OK);
    if (red) {
        for (int64_t end = n; end > 0; end -= 250000) {
            int64_t len = end > 250000 ? 250000 : end;
            CHECK(lt_comm_reducer_ready(ctx, red, end - len, len) == LT_OK);
        }
        CHECK(lt_comm_reducer_finish(ctx, red) == LT_OK);
        CHECK(lt_comm_reducer_early_buckets(red) > 0);
        CHECK(same_as_host(d, h, (size_t)n * sizeof *h));
        lt_comm_reducer_free(ctx, red);
    }
    double h64[1001];
    for (int i = 0; i < 1001; i++) h64[i] = lt_test_normal(&rng);
    double *d64 = to_dev(h64, sizeof h64);
    CHECK(lt_comm_allreduce_sum(ctx, c, d64, 1001, LT_COMM_F64) == LT_OK);
    CHECK(same_as_host(d64, h64, sizeof h64));
    /* Host statistics over the device communicator: staged through its 4 KiB buffer in pieces. */
    double hs[1500], hs0[1500];
    for (int i = 0; i < 1500; i++) hs[i] = hs0[i] = lt_test_normal(&rng);
    CHECK(lt_comm_allreduce_sum_host(ctx, c, hs, 1500, LT_COMM_F64) == LT_OK);
    CHECK(!memcmp(hs, hs0, sizeof hs));
    /* Broadcast of an odd byte count; a root outside the world is refused before NCCL. */
    CHECK(lt_comm_broadcast(ctx, c, d, 12345, 0) == LT_OK);
    CHECK(same_as_host(d, h, (size_t)n * sizeof *h));
    CHECK(lt_comm_broadcast(ctx, c, d, 12345, 1) == LT_ERR_INVALID_ARG);
    /* Send/receive to itself (NCCL point-to-point with peer = self) copies into another buffer. */
    void *e = NULL;
    CHECK(cudaMalloc(&e, 40000) == cudaSuccess);
    CHECK(cudaMemset(e, 0xab, 40000) == cudaSuccess);
    CHECK(lt_comm_sendrecv(ctx, c, d, 40000, 0, e, 40000, 0) == LT_OK);
    CHECK(same_as_host(e, h, 40000));
    CHECK(lt_comm_barrier(ctx, c) == LT_OK);
    /* Ring attention runs on host buffers only. */
    lt_cp_attention_params p = {8, 2, 1, 8, 0, LT_ATTENTION_AUTO};
    CHECK(lt_cp_attention_check(ctx, c, &p) == LT_ERR_UNSUPPORTED);
    /* One timing for the record: all-reduce of a 64 MiB f32 gradient in a world of one. */
    const int64_t big = (int64_t)16 << 20;
    float *g = NULL;
    if (cudaMalloc((void **)&g, (size_t)big * sizeof *g) == cudaSuccess) {
        cudaMemset(g, 0, (size_t)big * sizeof *g);
        CHECK(lt_comm_allreduce_sum(ctx, c, g, big, LT_COMM_F32) == LT_OK);
        double t0 = lt_time_now();
        for (int r = 0; r < 5; r++) CHECK(lt_comm_allreduce_sum_bucketed(ctx, c, g, big, 0) == LT_OK);
        printf("NCCL world of one on %s: 64 MiB bucketed all-reduce %.3f ms (mean of 5)\n", cu.name,
               (lt_time_now() - t0) / 5 * 1e3);
        cudaFree(g);
    }
    cudaFree(d), cudaFree(d64), cudaFree(e);
    free(h);
    lt_comm_free(ctx, c);
    CHECK(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes == 0);
    lt_ctx_free(ctx);
    printf("%s\n", failures ? "FAILED" : "ok: NCCL world of one");
    return failures ? 1 : 0;
#endif
}
