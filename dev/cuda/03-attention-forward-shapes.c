/* Forward-only timer of the library's CUDA attention over a sweep of shapes: for each shape
 * (B, T, H, Hkv, D, causal; optional packed row of ~84-token sequences) the median forward time
 * over CUDA events and TFLOP/s by the bench's convention (4·B·H·D·pairs, pairs = T²/2 causal,
 * Σ len²/2 packed), one JSON object per line: the table the forward variant choice is read from.
 * Not part of the build (dev/cuda/README.md says how to compile it against an installed
 * longtune); `longtune bench attention --backend cuda` is the reported bench. */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/tensor.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static double urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1.0p-53;
}

static void *dev_random_bf16(lt_ctx *ctx, size_t n) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = lt_f32_to_bf16((float)(urand() * 3.4641 - 1.7320));
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, n * 2, "attnf_shapes");
    if (d) cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void shape(lt_ctx *ctx, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, int packed, int reps) {
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = B;
    p.T = T;
    p.H = H;
    p.Hkv = Hkv;
    p.D = D;
    p.dtype = LT_DTYPE_BF16;
    p.device = LT_DEVICE_CUDA;
    int32_t *off = NULL;
    double pairs = (double)B * (double)T * (double)T / 2;
    if (packed) {
        /* One row (B = 1) of short sequences, mean ~44 tokens, packed full. */
        off = malloc(sizeof(int32_t) * (size_t)(T + 1));
        int64_t s = 0, t = 0;
        pairs = 0;
        off[0] = 0;
        while (t < T) {
            int64_t len = 4 + (int64_t)(160.0 * urand() * urand());
            if (t + len > T) len = T - t;
            pairs += (double)len * (double)len / 2;
            t += len;
            off[++s] = (int32_t)t;
        }
        p.seq_offsets = off;
        p.S = s;
    }
    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = dev_random_bf16(ctx, (size_t)nq);
    a.k = dev_random_bf16(ctx, (size_t)nk);
    a.v = dev_random_bf16(ctx, (size_t)nk);
    a.out = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nq * 2, "out");
    a.lse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(B * H * T) * 4, "lse");
    const size_t wsb = lt_attention_workspace_bytes(&p, 0, 0);
    a.workspace = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "ws");
    a.workspace_size = wsb;
    if (!a.q || !a.k || !a.v || !a.out || !a.lse || !a.workspace) {
        fprintf(stderr, "allocation failed: %s\n", lt_ctx_error(ctx));
        exit(1);
    }
    float *ms = malloc(sizeof(float) * (size_t)reps);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    int ok = lt_attention_forward(ctx, &p, &a) == LT_OK; /* warm-up */
    for (int r = 0; r < reps && ok; r++) {
        cudaEventRecord(e0, 0);
        ok = lt_attention_forward(ctx, &p, &a) == LT_OK;
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms[r], e0, e1);
    }
    if (!ok || cudaDeviceSynchronize() != cudaSuccess) {
        printf("{\"B\": %lld, \"T\": %lld, \"H\": %lld, \"Hkv\": %lld, \"D\": %lld, \"packed\": %d, "
               "\"error\": \"%s\"}\n",
               (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D, packed, lt_ctx_error(ctx));
    } else {
        qsort(ms, (size_t)reps, sizeof *ms, cmpf);
        const float med = ms[reps / 2];
        printf("{\"B\": %lld, \"T\": %lld, \"H\": %lld, \"Hkv\": %lld, \"D\": %lld, \"packed\": %d, "
               "\"fwd_ms\": %.4f, \"fwd_tflops\": %.1f}\n",
               (long long)B, (long long)T, (long long)H, (long long)Hkv, (long long)D, packed, med,
               4.0 * (double)(H * D) * pairs / ((double)med * 1e9));
    }
    fflush(stdout);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    free(ms);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.q, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.k, (size_t)nk * 2);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.v, (size_t)nk * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.out, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.lse, (size_t)(B * H * T) * 4);
    lt_free(ctx, LT_DEVICE_CUDA, a.workspace, wsb);
    free(off);
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 10;
    lt_ctx *ctx = lt_ctx_new();
    /* Qwen3-8B heads (32 / 8, D = 128) over T; SmolLM2-135M heads (9 / 3, D = 64); D = 64 with
     * 32 heads; a packed row. */
    static const int64_t Ts[] = {512, 1024, 2048, 4096, 8192, 16384, 32768};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) shape(ctx, 1, Ts[i], 32, 8, 128, 0, reps);
    shape(ctx, 4, 2048, 32, 8, 128, 0, reps);
    static const int64_t Ts2[] = {1024, 2048, 8192, 32768};
    for (size_t i = 0; i < sizeof Ts2 / sizeof Ts2[0]; i++) shape(ctx, 1, Ts2[i], 9, 3, 64, 0, reps);
    shape(ctx, 1, 8192, 32, 32, 64, 0, reps);
    shape(ctx, 1, 8192, 32, 8, 128, 1, reps);
    lt_ctx_free(ctx);
    return 0;
}
