/* Kernel lab timer: times the library's CUDA attention (forward, backward) and linear
 * cross-entropy through their public entry points at the Qwen3-8B shapes (H=32, Hkv=8, D=128; loss
 * N=8192, V=151936, C=4096) with CUDA events, and prints one JSON object per line. Not built by
 * default (dev/cuda/README.md says how to compile it against an installed longtune);
 * `longtune bench attention|lce --backend cuda` is the reported bench. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/lce.h"
#include "longtune/tensor.h"

static uint64_t rng = 0x12345678abcdefULL;
static float urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void *dev_random_bf16(lt_ctx *ctx, size_t n, float amp) {
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = lt_f32_to_bf16(urand() * amp);
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, n * 2, "bench");
    cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}
static float median(float *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmpf);
    return v[n / 2];
}

/* Alpaca-like packing: sequence lengths uniform in [64, 512] until the row is full. */
static int32_t *alpaca_offsets(int64_t T, int64_t *S) {
    int32_t *o = malloc(sizeof(int32_t) * (size_t)(T + 1));
    int64_t s = 0, t = 0;
    o[0] = 0;
    while (t < T) {
        int64_t len = 64 + (int64_t)((urand() + 1.0f) * 224.0f);
        t = t + len > T ? T : t + len;
        o[++s] = (int32_t)t;
    }
    *S = s;
    return o;
}

static void bench_attention(lt_ctx *ctx, int64_t T, int64_t H, int64_t Hkv, int64_t D, int packed, int reps) {
    const int64_t B = 1, nq = B * T * H * D, nk = B * T * Hkv * D;
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
    if (packed) {
        off = alpaca_offsets(T, &p.S);
        p.seq_offsets = off;
    }
    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = dev_random_bf16(ctx, (size_t)nq, 1.0f);
    a.k = dev_random_bf16(ctx, (size_t)nk, 1.0f);
    a.v = dev_random_bf16(ctx, (size_t)nk, 1.0f);
    a.dout = dev_random_bf16(ctx, (size_t)nq, 1.0f);
    a.out = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nq * 2, "out");
    a.dq = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nq * 2, "dq");
    a.dk = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nk * 2, "dk");
    a.dv = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nk * 2, "dv");
    a.lse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(B * H * T) * 4, "lse");
    size_t wsb = lt_attention_workspace_bytes(&p, 1, 0);
    a.workspace = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "ws");
    a.workspace_size = wsb;
    cudaEvent_t e0, e1, e2;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    float tf[64], tb[64];
    lt_status st = LT_OK;
    for (int r = -2; r < reps && st == LT_OK; r++) {
        cudaEventRecord(e0, 0);
        st = lt_attention_forward(ctx, &p, &a);
        cudaEventRecord(e1, 0);
        if (st == LT_OK) st = lt_attention_backward(ctx, &p, &a);
        cudaEventRecord(e2, 0);
        cudaEventSynchronize(e2);
        if (r >= 0) {
            cudaEventElapsedTime(&tf[r], e0, e1);
            cudaEventElapsedTime(&tb[r], e1, e2);
        }
    }
    if (st != LT_OK) {
        printf("{\"bench\":\"attention\",\"error\":\"%s\"}\n", lt_ctx_error(ctx));
        return;
    }
    float mf = median(tf, reps), mb = median(tb, reps);
    /* FlashAttention's convention: forward 4·B·H·T²·D, halved for causal; backward 2.5x. */
    double ff = 4.0 * (double)B * (double)H * (double)T * (double)T * (double)D / 2.0;
    printf("{\"bench\":\"attention\",\"T\":%lld,\"H\":%lld,\"Hkv\":%lld,\"D\":%lld,\"packed\":%d,"
           "\"S\":%lld,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,"
           "\"fwdbwd_tflops\":%.1f,\"workspace_bytes\":%zu}\n",
           (long long)T, (long long)H, (long long)Hkv, (long long)D, packed, (long long)p.S, mf, mb, ff / mf / 1e9,
           2.5 * ff / mb / 1e9, 3.5 * ff / (mf + mb) / 1e9, wsb);
    fflush(stdout);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.q, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.k, (size_t)nk * 2);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.v, (size_t)nk * 2);
    lt_free(ctx, LT_DEVICE_CUDA, (void *)a.dout, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.out, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.dq, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.dk, (size_t)nk * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.dv, (size_t)nk * 2);
    lt_free(ctx, LT_DEVICE_CUDA, a.lse, (size_t)(B * H * T) * 4);
    lt_free(ctx, LT_DEVICE_CUDA, a.workspace, wsb);
    free(off);
}

static void bench_lce(lt_ctx *ctx, int64_t N, int64_t V, int64_t C, int reps) {
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_lce_args a;
    memset(&a, 0, sizeof a);
    void *h = dev_random_bf16(ctx, (size_t)(N * C), 1.0f);
    void *w = dev_random_bf16(ctx, (size_t)(V * C), 0.03f);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) t[i] = (int32_t)((urand() + 1.0f) * 0.5f * (float)(V - 1));
    int32_t *dt = lt_alloc(ctx, LT_DEVICE_CUDA, sizeof(int32_t) * (size_t)N, "targets");
    cudaMemcpy(dt, t, sizeof(int32_t) * (size_t)N, cudaMemcpyHostToDevice);
    float one = 1.0f;
    float *dl = lt_alloc(ctx, LT_DEVICE_CUDA, 4, "dloss");
    cudaMemcpy(dl, &one, 4, cudaMemcpyHostToDevice);
    float *loss = lt_alloc(ctx, LT_DEVICE_CUDA, 4, "loss");
    float *lse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)N * 4, "lse");
    void *dh = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(N * C) * 2, "dh");
    lt_tensor tdh = lt_tensor_view(dh, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.h = lt_tensor_view(h, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    a.w = lt_tensor_view(w, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, ws);
    a.targets = dt;
    a.loss = loss;
    a.lse = lse;
    a.dloss = dl;
    a.dh = &tdh;
    size_t used0 = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
    lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
    cudaEvent_t e0, e1, e2;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventCreate(&e2);
    float tf[64], tb[64];
    lt_status st = LT_OK;
    for (int r = -1; r < reps && st == LT_OK; r++) {
        cudaEventRecord(e0, 0);
        st = lt_lce_forward(ctx, NULL, &a);
        cudaEventRecord(e1, 0);
        if (st == LT_OK) st = lt_lce_backward(ctx, NULL, &a);
        cudaEventRecord(e2, 0);
        cudaEventSynchronize(e2);
        if (r >= 0) {
            cudaEventElapsedTime(&tf[r], e0, e1);
            cudaEventElapsedTime(&tb[r], e1, e2);
        }
    }
    if (st != LT_OK) {
        printf("{\"bench\":\"lce\",\"error\":\"%s\"}\n", lt_ctx_error(ctx));
        return;
    }
    size_t extra = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes - used0;
    float loss_h = 0;
    cudaMemcpy(&loss_h, loss, 4, cudaMemcpyDeviceToHost);
    float mf = median(tf, reps), mb = median(tb, reps);
    double gemm = 2.0 * (double)N * (double)V * (double)C;
    printf("{\"bench\":\"lce\",\"N\":%lld,\"V\":%lld,\"C\":%lld,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,"
           "\"total_ms\":%.3f,\"extra_bytes\":%zu,\"loss\":%.5f,\"gemm_tflops_effective\":%.1f}\n",
           (long long)N, (long long)V, (long long)C, mf, mb, mf + mb, extra, loss_h, 3.0 * gemm / (mf + mb) / 1e9);
    fflush(stdout);
    free(t);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    int reps = argc > 2 ? atoi(argv[2]) : 10;
    if (reps > 64) reps = 64;
    lt_ctx *ctx = lt_ctx_new();
    if (!strcmp(what, "all") || !strcmp(what, "attention")) {
        const int64_t Ts[3] = {2048, 8192, 32768};
        for (int i = 0; i < 3; i++) bench_attention(ctx, Ts[i], 32, 8, 128, 0, reps);
        bench_attention(ctx, 8192, 32, 32, 64, 0, reps);
        bench_attention(ctx, 8192, 32, 8, 128, 1, reps);
        bench_attention(ctx, 8192, 32, 8, 96, 0, reps);
    }
    if (!strcmp(what, "attn8k")) bench_attention(ctx, 8192, 32, 8, 128, 0, reps);
    if (!strcmp(what, "d64")) bench_attention(ctx, 8192, 32, 32, 64, 0, reps);
    /* The D = 128 rows and the packed row: what a kernel change moves. */
    if (!strcmp(what, "d128")) {
        const int64_t Ts[3] = {2048, 8192, 32768};
        for (int i = 0; i < 3; i++) bench_attention(ctx, Ts[i], 32, 8, 128, 0, reps);
        bench_attention(ctx, 8192, 32, 8, 128, 1, reps);
    }
    if (!strcmp(what, "all") || !strcmp(what, "lce")) bench_lce(ctx, 8192, 151936, 4096, reps > 5 ? 5 : reps);
    lt_ctx_free(ctx);
    return 0;
}
