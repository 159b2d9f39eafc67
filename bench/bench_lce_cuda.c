/* `longtune bench lce --backend cuda`: the library's CUDA linear cross-entropy (bf16 h and dense
 * bf16 head, mean reduction) forward + grad of h at N tokens, V vocabulary, C width, in three
 * arms: lt_lce_forward then lt_lce_backward (three GEMMs), lt_lce_forward_backward (one call, two
 * GEMMs, second stream) and the same on one stream. Median time (device synchronised), extra
 * device bytes from the accounting allocator (workspace), agreement of loss and dh with the first
 * arm, and ratios to the PyTorch peers of bench/peers/lce_torch.py run in the same invocation
 * (naive bf16 logits, fp32 upcast), to the GEMM floor 2·2·N·V·C and to the bf16 GEMM rate
 * measured there (executed GEMM FLOPs: 6NVC for the two calls, 4NVC for the one). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"
#include "longtune/alloc.h"
#include "longtune/lce.h"
#include "longtune/log.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>

static void *dev_uniform(lt_ctx *ctx, size_t n, float amp, uint64_t *s) {
    uint16_t *h = malloc(n * 2);
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, n * 2, "bench lce tensor");
    if (!h || !d) {
        free(h);
        lt_free(ctx, LT_DEVICE_CUDA, d, n * 2);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        h[i] = lt_f32_to_bf16(amp * (float)((double)(*s >> 11) * 0x1.0p-52 - 1.0));
    }
    cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

static double peer_value(const cJSON *peers, const char *peer, const char *key) {
    const cJSON *p;
    cJSON_ArrayForEach(p, peers) {
        const cJSON *n = cJSON_GetObjectItem(p, "peer");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, peer))
            return cJSON_GetNumberValue(cJSON_GetObjectItem(p, key));
    }
    return 0;
}

static double dh_max_diff(const void *d, const uint16_t *ref, size_t n, uint16_t *tmp) {
    cudaMemcpy(tmp, d, n * 2, cudaMemcpyDeviceToHost);
    double m = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double a = lt_bf16_to_f32(tmp[i]), b = lt_bf16_to_f32(ref[i]);
        m = fmax(m, fabs(a - b));
        scale = fmax(scale, fabs(b));
    }
    return scale > 0 ? m / scale : m;
}

int lt_bench_lce_cuda(const lt_bench_common *c, int64_t N, int64_t V, int64_t C, int peers, int tile_n,
                      int tile_v) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "longtune bench lce: no CUDA device\n");
        return 1;
    }
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    int rc = 1;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    const size_t hb = (size_t)(N * C) * 2, wb = (size_t)(V * C) * 2;
    void *h = dev_uniform(ctx, (size_t)(N * C), 1.7f, &s), *w = dev_uniform(ctx, (size_t)(V * C), 0.05f, &s);
    void *dh = lt_alloc(ctx, LT_DEVICE_CUDA, hb, "bench lce dh");
    int32_t *tg = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)N * 4, "bench lce targets");
    float *lse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)N * 4, "bench lce lse");
    float *loss = lt_alloc(ctx, LT_DEVICE_CUDA, 8, "bench lce loss");
    int32_t *ht = malloc((size_t)N * 4);
    uint16_t *dh0 = malloc(hb), *dht = malloc(hb);
    double *tt = malloc(sizeof(double) * (size_t)c->repeats), *tf = malloc(sizeof(double) * (size_t)c->repeats);
    cJSON *r = NULL, *arms = NULL, *arm_objs[3] = {NULL, NULL, NULL};
    double arm_ms[3] = {0, 0, 0};
    if (!h || !w || !dh || !tg || !lse || !loss || !ht || !dh0 || !dht || !tt || !tf) goto done;
    for (int64_t i = 0; i < N; i++) ht[i] = (int32_t)((uint64_t)(i * 2654435761u) % (uint64_t)V);
    cudaMemcpy(tg, ht, (size_t)N * 4, cudaMemcpyHostToDevice);
    const float one = 1.0f;
    cudaMemcpy(loss + 1, &one, 4, cudaMemcpyHostToDevice);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(dh, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    lt_lce_args a = {.h = lt_tensor_view(h, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs),
                     .w = lt_tensor_view(w, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, ws),
                     .targets = tg, .loss = loss, .lse = lse, .dloss = loss + 1, .dh = &tdh};
    lt_lce_options o = {.tile_n = tile_n, .tile_v = tile_v};

    r = lt_bench_result_new("lce");
    cJSON *cfg = cJSON_AddObjectToObject(r, "config");
    cJSON_AddStringToObject(cfg, "backend", "cuda");
    cJSON_AddNumberToObject(cfg, "N", (double)N);
    cJSON_AddNumberToObject(cfg, "V", (double)V);
    cJSON_AddNumberToObject(cfg, "C", (double)C);
    cJSON_AddStringToObject(cfg, "dtype", "bf16");
    cJSON_AddStringToObject(cfg, "measures", "forward + grad of h (head frozen), mean reduction");
    cJSON_AddNumberToObject(cfg, "repeats", c->repeats);
    cJSON_AddNumberToObject(cfg, "tile_n", tile_n);
    cJSON_AddNumberToObject(cfg, "tile_v", tile_v);
    arms = cJSON_AddArrayToObject(r, "arms");
    static const char *names[3] = {"cuda-chunked-cublaslt", "cuda-fused-fb", "cuda-fused-fb-one-stream"};
    for (int ai = 0; ai < 3; ai++) {
        if (ai == 2) setenv("LONGTUNE_LCE_ONE_STREAM", "1", 1);
        const size_t used = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
        lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
        for (int k = -c->warmup; k < c->repeats; k++) {
            cudaMemset(dh, 0xff, hb);
            cudaDeviceSynchronize();
            double t0 = lt_time_now(), t1 = t0;
            if (ai == 0) {
                if (lt_lce_forward(ctx, &o, &a) != LT_OK) goto done;
                cudaDeviceSynchronize();
                t1 = lt_time_now();
                if (lt_lce_backward(ctx, &o, &a) != LT_OK) goto done;
            } else if (lt_lce_forward_backward(ctx, &o, &a) != LT_OK) {
                goto done;
            }
            cudaDeviceSynchronize();
            double t2 = lt_time_now();
            if (k >= 0) {
                tf[k] = (t1 - t0) * 1e3;
                tt[k] = (t2 - t0) * 1e3;
            }
        }
        unsetenv("LONGTUNE_LCE_ONE_STREAM");
        const size_t extra = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes - used;
        const double ms = lt_bench_median(tt, c->repeats), fwd = lt_bench_median(tf, c->repeats);
        float lv = 0;
        cudaMemcpy(&lv, loss, 4, cudaMemcpyDeviceToHost);
        double ddh = 0;
        if (ai == 0) cudaMemcpy(dh0, dh, hb, cudaMemcpyDeviceToHost);
        else ddh = dh_max_diff(dh, dh0, (size_t)(N * C), dht);
        cJSON *arm = cJSON_CreateObject();
        cJSON_AddStringToObject(arm, "name", names[ai]);
        cJSON_AddNumberToObject(arm, "median_ms", ms);
        if (ai == 0) cJSON_AddNumberToObject(arm, "fwd_ms", fwd);
        cJSON_AddNumberToObject(arm, "gemms", ai == 0 ? 3 : 2);
        cJSON_AddNumberToObject(arm, "tokens_per_s", (double)N / (ms * 1e-3));
        cJSON_AddNumberToObject(arm, "peak_bytes", (double)extra);
        cJSON_AddNumberToObject(arm, "workspace_bytes",
                                (double)lt_lce_workspace_bytes(&o, &a, ai == 0 ? 1 : LT_LCE_PASS_FORWARD_BACKWARD, 0));
        cJSON_AddNumberToObject(arm, "loss", lv);
        if (ai) cJSON_AddNumberToObject(arm, "dh_max_diff_vs_first_arm_scaled", ddh);
        cJSON_AddItemToArray(arms, arm);
        arm_objs[ai] = arm;
        arm_ms[ai] = ms;
        fprintf(stderr, "cuda lce %-26s N=%lld V=%lld C=%lld: %.2f ms%s, extra %.1f MiB, loss %.5f, dh diff %.2g\n",
                names[ai], (long long)N, (long long)V, (long long)C, ms, ai == 0 ? " (two calls)" : "",
                (double)extra / (1 << 20), (double)lv, ddh);
    }
    if (peers) {
        char args[64];
        snprintf(args, sizeof args, "%d %lld %lld %lld", c->repeats, (long long)N, (long long)V, (long long)C);
        cJSON *pl = lt_bench_run_peers("bench/peers/lce_torch.py", args);
        cJSON_AddItemToObject(r, "peers", pl);
        const double naive = peer_value(pl, "torch_naive_bf16", "total_ms");
        const double up = peer_value(pl, "torch_fp32_upcast", "total_ms");
        const double gemm = peer_value(pl, "torch_gemm_bf16", "tflops");
        for (int ai = 0; ai < 3; ai++) {
            cJSON *arm = arm_objs[ai];
            const double ms = arm_ms[ai];
            if (naive > 0) cJSON_AddNumberToObject(arm, "speedup_vs_torch_naive_bf16", naive / ms);
            if (up > 0) cJSON_AddNumberToObject(arm, "speedup_vs_torch_fp32_upcast", up / ms);
            if (gemm > 0) {
                /* The floor: two GEMMs (logits and grad of h) at the measured bf16 rate;
                 * and the rate of the GEMM FLOPs the arm actually executes against that rate. */
                const double floor_ms = 2.0 * 2.0 * (double)N * (double)V * (double)C / (gemm * 1e9);
                const double exec = (ai == 0 ? 6.0 : 4.0) * (double)N * (double)V * (double)C / (ms * 1e-3) / 1e12;
                cJSON_AddNumberToObject(arm, "gemm_floor_ms", floor_ms);
                cJSON_AddNumberToObject(arm, "fraction_of_gemm_floor", floor_ms / ms);
                cJSON_AddNumberToObject(arm, "executed_gemm_tflops", exec);
                cJSON_AddNumberToObject(arm, "fraction_of_gemm_rate", exec / gemm);
                fprintf(stderr, "  %-26s GEMM floor %.2f ms at %.0f TFLOP/s: %.2fx of it; executed GEMMs at %.0f TFLOP/s (%.2f of the rate)\n",
                        names[ai], floor_ms, gemm, ms / floor_ms, exec, exec / gemm);
            }
            if (naive > 0)
                fprintf(stderr, "  %-26s vs torch naive bf16 %.2f ms: %.2fx; vs fp32 upcast %.2f ms: %.2fx\n", names[ai],
                        naive, naive / ms, up, up > 0 ? up / ms : 0);
        }
    }
    rc = 0;
done:
    if (rc) lt_log(LT_LOG_ERROR, "cuda lce arm failed: %s", lt_ctx_error(ctx));
    lt_free(ctx, LT_DEVICE_CUDA, h, hb);
    lt_free(ctx, LT_DEVICE_CUDA, w, wb);
    lt_free(ctx, LT_DEVICE_CUDA, dh, hb);
    lt_free(ctx, LT_DEVICE_CUDA, tg, (size_t)N * 4);
    lt_free(ctx, LT_DEVICE_CUDA, lse, (size_t)N * 4);
    lt_free(ctx, LT_DEVICE_CUDA, loss, 8);
    free(ht);
    free(dh0);
    free(dht);
    free(tt);
    free(tf);
    lt_ctx_free(ctx);
    if (r) {
        char tag[64];
        if (tile_n || tile_v) snprintf(tag, sizeof tag, "cuda-bf16-t%dx%d", tile_n, tile_v);
        else snprintf(tag, sizeof tag, "cuda-bf16");
        int wr = lt_bench_write(c, r, tag);
        if (!rc) rc = wr;
    }
    return rc;
}

#else
int lt_bench_lce_cuda(const lt_bench_common *c, int64_t N, int64_t V, int64_t C, int peers, int tile_n,
                      int tile_v) {
    (void)c; (void)N; (void)V; (void)C; (void)peers; (void)tile_n; (void)tile_v;
    fprintf(stderr, "longtune bench lce: this build has no CUDA backend\n");
    return 1;
}
#endif
