/* The NCCL transport with the world one GPU allows (one rank): the communicator comes up with
 * NVLink multicast off (NCCL_NVLS_ENABLE=0 in the environment), and sum all-reduce (f32, f64,
 * bucketed), broadcast, send/receive to itself and barrier run through NCCL on device buffers and
 * return the exact bits a world of one must (the sum of one contribution), also through the gradient
 * reducer's buckets started on the stream as ranges are marked; the grouped exchange and the
 * transpose put every byte where the host versions do; Ulysses attention in a world of one (f32
 * and bf16 tensors) gives what the device attention it wraps gives, within the kernel's own
 * run-to-run differences; bad roots are typed errors and
 * ring attention refuses device buffers. Several ranks need several GPUs: not run here. */
#include <math.h>
#include <stdint.h>
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
/* Element i of a downloaded buffer of dtype dt (lse is always f32). */
static float elem(const void *h, size_t i, int bf16) {
    return bf16 ? lt_bf16_to_f32(((const uint16_t *)h)[i]) : ((const float *)h)[i];
}

/* Ulysses in a world of one: the zig-zag split of one rank is the natural order and the all-to-all
 * moves whole heads, so forward and backward must give what the device kernel gives on the same
 * inputs, up to the kernel's own run-to-run differences (its backward accumulates dQ with atomics):
 * every element within two bf16 ulps of the buffer's largest magnitude, and written (NaN poison). */
static void ulysses_vs_kernel(lt_ctx *ctx, lt_comm *c, lt_dtype dt, uint64_t *rng) {
    const int bf = dt == LT_DTYPE_BF16;
    const size_t es = bf ? 2 : 4;
    lt_cp_attention_params up = {512, 8, 2, 128, 0, LT_ATTENTION_AUTO, dt};
    const size_t nq = (size_t)(up.T * up.H * up.D), nk = (size_t)(up.T * up.Hkv * up.D), nl = (size_t)(up.T * up.H);
    void *in[4];
    size_t ns[4] = {nq, nk, nk, nq};
    for (int t = 0; t < 4; t++) {
        float *h = malloc(ns[t] * 4);
        lt_test_fill_normal(rng, h, (int64_t)ns[t], 1.0f);
        if (bf) {
            uint16_t *b = malloc(ns[t] * 2);
            for (size_t i = 0; i < ns[t]; i++) b[i] = lt_f32_to_bf16(h[i]);
            in[t] = to_dev(b, ns[t] * 2);
            free(b);
        } else {
            in[t] = to_dev(h, ns[t] * 4);
        }
        free(h);
    }
    void *bufs[10];
    size_t sizes[10] = {nq, nl, nq, nk, nk, nq, nl, nq, nk, nk};
    for (int i = 0; i < 10; i++) {
        size_t b = sizes[i] * (i % 5 == 1 ? 4 : es);
        bufs[i] = NULL;
        CHECK(cudaMalloc(&bufs[i], b) == cudaSuccess);
        cudaMemset(bufs[i], 0xff, b); /* NaN poison: every element must be written */
    }
    size_t wb = lt_cp_ulysses_workspace_bytes(&up, 1, LT_DEVICE_CUDA, 1);
    void *ws = NULL;
    CHECK(wb != SIZE_MAX && cudaMalloc(&ws, wb) == cudaSuccess);
    CHECK(lt_cp_ulysses_forward(ctx, c, &up, in[0], in[1], in[2], bufs[0], bufs[1], ws, wb, 1) == LT_OK);
    CHECK(lt_cp_ulysses_backward(ctx, c, &up, in[0], in[1], in[2], bufs[0], bufs[1], in[3], bufs[2], bufs[3], bufs[4],
                                 ws, wb, 1) == LT_OK);
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = 1, ap.T = up.T, ap.H = up.H, ap.Hkv = up.Hkv, ap.D = up.D, ap.dtype = dt;
    ap.device = LT_DEVICE_CUDA;
    lt_attention_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = in[0], aa.k = in[1], aa.v = in[2], aa.out = bufs[5], aa.lse = bufs[6], aa.dout = in[3];
    aa.dq = bufs[7], aa.dk = bufs[8], aa.dv = bufs[9];
    CHECK(lt_attention_forward(ctx, &ap, &aa) == LT_OK);
    CHECK(lt_attention_backward(ctx, &ap, &aa) == LT_OK);
    static const char *const names[5] = {"out", "lse", "dq", "dk", "dv"};
    char line[256];
    int at =
        snprintf(line, sizeof line, "Ulysses world of one (%s) vs kernel, error / tolerance:", bf ? "bf16" : "f32");
    for (int i = 0; i < 5; i++) {
        size_t b = sizes[i] * (i == 1 ? 4 : es);
        void *u = malloc(b), *k = malloc(b);
        cudaMemcpy(u, bufs[i], b, cudaMemcpyDeviceToHost);
        cudaMemcpy(k, bufs[5 + i], b, cudaMemcpyDeviceToHost);
        int b16 = bf && i != 1;
        double mag = 0, e = 0;
        for (size_t j = 0; j < sizes[i]; j++) mag = fmax(mag, fabs(elem(k, j, b16)));
        for (size_t j = 0; j < sizes[i]; j++) {
            float x = elem(u, j, b16), y = elem(k, j, b16);
            e = x == x && y == y ? fmax(e, fabs(x - y)) : INFINITY;
        }
        double r = e / (2.0 * 0x1p-8 * fmax(mag, 1e-6));
        CHECK(r <= 1);
        at += snprintf(line + at, sizeof line - (size_t)at, " %s %.3g", names[i], r);
        free(u), free(k);
    }
    printf("%s\n", line);
    /* One timing for the record: Ulysses forward + backward against the bare kernel (world of one:
     * the all-to-all is a device copy). */
    cudaDeviceSynchronize();
    double t0 = lt_time_now();
    for (int r = 0; r < 5; r++) {
        lt_cp_ulysses_forward(ctx, c, &up, in[0], in[1], in[2], bufs[0], bufs[1], ws, wb, 1);
        lt_cp_ulysses_backward(ctx, c, &up, in[0], in[1], in[2], bufs[0], bufs[1], in[3], bufs[2], bufs[3], bufs[4], ws,
                               wb, 1);
    }
    cudaDeviceSynchronize();
    double t1 = lt_time_now();
    for (int r = 0; r < 5; r++) {
        lt_attention_forward(ctx, &ap, &aa);
        lt_attention_backward(ctx, &ap, &aa);
    }
    cudaDeviceSynchronize();
    printf("Ulysses world of one (%s), T=%lld H=%lld Hkv=%lld D=%lld: fwd+bwd %.3f ms, bare kernel %.3f ms\n",
           bf ? "bf16" : "f32", (long long)up.T, (long long)up.H, (long long)up.Hkv, (long long)up.D,
           (t1 - t0) / 5 * 1e3, (lt_time_now() - t1) / 5 * 1e3);
    for (int i = 0; i < 10; i++) cudaFree(bufs[i]);
    for (int t = 0; t < 4; t++) cudaFree(in[t]);
    cudaFree(ws);
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
    lt_cp_attention_params p = {8, 2, 1, 8, 0, LT_ATTENTION_AUTO, LT_DTYPE_F32};
    CHECK(lt_cp_attention_check(ctx, c, &p) == LT_ERR_UNSUPPORTED);
    /* Transpose and exchange on the device: the same bytes as the host versions. */
    {
        int32_t src[3 * 5 * 2], want[30], got[30];
        for (int i = 0; i < 30; i++) src[i] = i * 3 + 1;
        CHECK(lt_comm_transpose(ctx, NULL, want, src, 3, 5, 8) == LT_OK);
        void *ds = to_dev(src, sizeof src), *dd = NULL;
        CHECK(cudaMalloc(&dd, sizeof src) == cudaSuccess);
        CHECK(lt_comm_transpose(ctx, c, dd, ds, 3, 5, 8) == LT_OK);
        CHECK(same_as_host(dd, want, sizeof want));
        CHECK(lt_comm_transpose(ctx, c, dd, ds, 5, 3, 8) == LT_OK);
        CHECK(lt_comm_transpose(ctx, NULL, got, src, 5, 3, 8) == LT_OK);
        CHECK(same_as_host(dd, got, sizeof got));
        lt_comm_piece sp[2] = {{0, 0, 40}, {0, 40, 80}}, rp[2] = {{0, 80, 40}, {0, 0, 80}};
        CHECK(lt_comm_exchange(ctx, c, ds, sizeof src, sp, 2, dd, sizeof src, rp, 2) == LT_OK);
        CHECK(lt_comm_exchange(ctx, NULL, src, sizeof src, sp, 2, got, sizeof got, rp, 2) == LT_OK);
        CHECK(same_as_host(dd, got, sizeof got));
        cudaFree(ds), cudaFree(dd);
    }
    /* Ulysses in a world of one on the GPU, f32 and bf16 tensors, against the bare kernel. */
    ulysses_vs_kernel(ctx, c, LT_DTYPE_F32, &rng);
    ulysses_vs_kernel(ctx, c, LT_DTYPE_BF16, &rng);
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
