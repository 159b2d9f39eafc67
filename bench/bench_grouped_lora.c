/* `longtune bench grouped_lora --backend cuda`: the expert-LoRA products of one MoE layer at the
 * Qwen3-30B-A3B shape (E = 128 experts, k = 8 per token, C = 2048, moe_F = 768) over n tokens routed
 * at random, rank r: the thin grouped products (lt_backend.grouped_matmul with an f32 rank-r stack:
 * u = xg·A_guᵀ, G += us·B_gateᵀ, dus = dG·B_gate, dxg += du·A_gu) and the weight gradients
 * (lt_backend.grouped_matmul_wgrad: gA_gu, gB_gate, gA_d, gB_d). Medians over repeats, device
 * synchronised around each call; GB/s = the bytes the op must move (inputs read once, output
 * written, and read too when accumulated) / time, against the device's memory bandwidth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench.h"
#include "bench_buffers.h"
#include "longtune/alloc.h"
#include "longtune/log.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

int lt_bench_grouped_lora(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    int64_t n = 4096, r = 16;
    const int64_t E = 128, k = 8, C = 2048, F = 768;
    const lt_bench_arg flags[] = {
        LT_BENCH_I64("--n", &n, 1, 1 << 20),
        LT_BENCH_I64("--r", &r, 1, 64),
    };
    const int parsed =
        lt_bench_parse_args("grouped_lora", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench grouped_lora --backend cuda [options]\n\n"
               "The expert-LoRA products of one MoE layer (E = 128, k = 8, C = 2048, moe_F = 768) over n\n"
               "tokens routed at random: the thin grouped products with a rank-r f32 stack and the\n"
               "experts' weight gradients (grouped_matmul_wgrad), median ms and GB/s moved.\n\n"
               "options:\n"
               "  --n N            tokens (default 4096: nk = 32768 assignments, one dispatch chunk)\n"
               "  --r R            LoRA rank, 1..64 (default 16)\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
#if !LT_HAVE_CUDA
    (void)n, (void)r, (void)E, (void)k, (void)C, (void)F;
    fprintf(stderr, "longtune bench grouped_lora: this build has no CUDA backend\n");
    return 1;
#else
    if (strcmp(c.backend, "cuda"))
        return lt_bench_usage_error("grouped_lora", "longtune bench grouped_lora --backend cuda [options]",
                                    "measures the CUDA backend only: --backend cuda, not '%s'", c.backend);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "longtune bench grouped_lora: no CUDA device\n");
        return 1;
    }
    const lt_backend *be = lt_backend_get(LT_DEVICE_CUDA);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    const int64_t nk = n * k;
    int rc = 1;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    int32_t *off = calloc((size_t)(E + 1), sizeof(int32_t));
    double *t = malloc(sizeof(double) * (size_t)c.repeats);
    /* wide (nk, C), mid (nk, F), thin (nk, r) rows; A (E·r, C); B (E·F, r); gradients alike */
    float *wide = NULL, *mid = NULL, *thin = NULL, *thin2 = NULL, *A = NULL, *B = NULL, *gA = NULL, *gB = NULL;
    void *doff = NULL;
    cJSON *res = lt_bench_result_new("grouped_lora");
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(cfg, "backend", "cuda");
    cJSON_AddNumberToObject(cfg, "n", (double)n);
    cJSON_AddNumberToObject(cfg, "E", (double)E);
    cJSON_AddNumberToObject(cfg, "k", (double)k);
    cJSON_AddNumberToObject(cfg, "C", (double)C);
    cJSON_AddNumberToObject(cfg, "moe_F", (double)F);
    cJSON_AddNumberToObject(cfg, "r", (double)r);
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    cJSON_AddStringToObject(cfg, "measures",
                            "lt_backend.grouped_matmul with f32 rank-r stacks and lt_backend.grouped_matmul_wgrad, "
                            "one launch each; GB/s = bytes read and written once / time");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    if (!off || !t || !res) goto done;
    for (int64_t tok = 0; tok < n; tok++) {
        int32_t pick[8];
        for (int64_t j = 0; j < k; j++) {
            int dup;
            do {
                pick[j] = (int32_t)(lt_bench_rand_u64(&s) % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++) dup |= pick[q] == pick[j];
            } while (dup);
            off[pick[j] + 1]++;
        }
    }
    for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
        /* every operand uniform in [-0.05, 0.05) */
#define RAND(count)                                                                          \
    lt_bench_rand_buf(ctx, lt_backend_get(LT_DEVICE_CUDA), (count), LT_DTYPE_F32, 0.05f, &s, \
                      "bench grouped_lora buffer")
    wide = RAND(nk * C), mid = RAND(nk * F), thin = RAND(nk * r), thin2 = RAND(nk * r);
    A = RAND(E * r * C), B = RAND(E * F * r), gA = RAND(E * r * C), gB = RAND(E * C * r);
#undef RAND
    doff = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(E + 1) * 4, "bench grouped_lora offsets");
    if (!wide || !mid || !thin || !thin2 || !A || !B || !gA || !gB || !doff) goto done;
    cudaMemcpy(doff, off, (size_t)(E + 1) * 4, cudaMemcpyHostToDevice);
    const int64_t shA[2] = {E * r, C}, shB[2] = {E * F, r};
    const lt_tensor tA = lt_tensor_view(A, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, shA),
                    tB = lt_tensor_view(B, LT_DTYPE_F32, LT_DEVICE_CUDA, 2, shB);
    for (int ai = 0; ai < 8; ai++) {
        const char *name = "";
        double bytes = 0;
        for (int rep = -c.warmup; rep < c.repeats; rep++) {
            be->synchronize(ctx);
            double t0 = lt_time_now();
            switch (ai) {
            case 0: /* u (nk, r) = xg·A_guᵀ */
                name = "thin-nt-xg-Agu", bytes = (double)nk * (double)(C + r) * 4 + (double)(E * r * C) * 4;
                be->grouped_matmul(ctx, LT_MATMUL_NT, &tA, E, doff, wide, nk, 0.0f, thin, NULL);
                break;
            case 1: /* G (nk, F) += us·B_gateᵀ */
                name = "thin-nt-us-Bgate", bytes = (double)nk * (double)(2 * F + r) * 4 + (double)(E * F * r) * 4;
                be->grouped_matmul(ctx, LT_MATMUL_NT, &tB, E, doff, thin, nk, 1.0f, mid, NULL);
                break;
            case 2: /* dus (nk, r) = dG·B_gate */
                name = "thin-nn-dG-Bgate", bytes = (double)nk * (double)(F + r) * 4 + (double)(E * F * r) * 4;
                be->grouped_matmul(ctx, LT_MATMUL_NN, &tB, E, doff, mid, nk, 0.0f, thin, NULL);
                break;
            case 3: /* dxg (nk, C) += du·A_gu */
                name = "thin-nn-du-Agu", bytes = (double)nk * (double)(2 * C + r) * 4 + (double)(E * r * C) * 4;
                be->grouped_matmul(ctx, LT_MATMUL_NN, &tA, E, doff, thin, nk, 1.0f, wide, NULL);
                break;
            case 4: /* gA_gu (E·r, C) += duᵀ·xg */
                name = "wgrad-gAgu", bytes = (double)nk * (double)(C + r) * 4 + 2.0 * (double)(E * r * C) * 4;
                be->grouped_matmul_wgrad(ctx, E, doff, thin, r, wide, C, nk, 1.0f, gA);
                break;
            case 5: /* gB_gate (E·F, r) += dGᵀ·us */
                name = "wgrad-gBgate", bytes = (double)nk * (double)(F + r) * 4 + 2.0 * (double)(E * F * r) * 4;
                be->grouped_matmul_wgrad(ctx, E, doff, mid, F, thin2, r, nk, 1.0f, gB);
                break;
            case 6: /* gA_d (E·r, F) += dudᵀ·Act */
                name = "wgrad-gAd", bytes = (double)nk * (double)(F + r) * 4 + 2.0 * (double)(E * r * F) * 4;
                be->grouped_matmul_wgrad(ctx, E, doff, thin, r, mid, F, nk, 1.0f, gA);
                break;
            default: /* gB_d (E·C, r) += dYgᵀ·uds */
                name = "wgrad-gBd", bytes = (double)nk * (double)(C + r) * 4 + 2.0 * (double)(E * C * r) * 4;
                be->grouped_matmul_wgrad(ctx, E, doff, wide, C, thin2, r, nk, 1.0f, gB);
                break;
            }
            be->synchronize(ctx);
            if (rep >= 0) t[rep] = (lt_time_now() - t0) * 1e3;
        }
        const double ms = lt_bench_median(t, c.repeats), gbs = bytes / (ms * 1e6);
        cJSON *arm = cJSON_CreateObject();
        cJSON_AddStringToObject(arm, "name", name);
        cJSON_AddNumberToObject(arm, "median_ms", ms);
        cJSON_AddNumberToObject(arm, "gb_per_s", gbs);
        cJSON_AddItemToArray(arms, arm);
        fprintf(stderr, "%-24s %9.3f ms %8.1f GB/s\n", name, ms, gbs);
    }
    rc = cudaGetLastError() != cudaSuccess;
done:
    if (wide) lt_free(ctx, LT_DEVICE_CUDA, wide, (size_t)(nk * C) * 4);
    if (mid) lt_free(ctx, LT_DEVICE_CUDA, mid, (size_t)(nk * F) * 4);
    if (thin) lt_free(ctx, LT_DEVICE_CUDA, thin, (size_t)(nk * r) * 4);
    if (thin2) lt_free(ctx, LT_DEVICE_CUDA, thin2, (size_t)(nk * r) * 4);
    if (A) lt_free(ctx, LT_DEVICE_CUDA, A, (size_t)(E * r * C) * 4);
    if (B) lt_free(ctx, LT_DEVICE_CUDA, B, (size_t)(E * F * r) * 4);
    if (gA) lt_free(ctx, LT_DEVICE_CUDA, gA, (size_t)(E * r * C) * 4);
    if (gB) lt_free(ctx, LT_DEVICE_CUDA, gB, (size_t)(E * C * r) * 4);
    if (doff) lt_free(ctx, LT_DEVICE_CUDA, doff, (size_t)(E + 1) * 4);
    if (rc) lt_log(LT_LOG_ERROR, "bench grouped_lora failed: %s", lt_ctx_error(ctx));
    free(off), free(t);
    lt_ctx_free(ctx);
    if (rc || !res) {
        cJSON_Delete(res);
        return 1;
    }
    return lt_bench_write(&c, res, "cuda");
#endif
}
