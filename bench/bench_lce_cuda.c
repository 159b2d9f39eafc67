/* `longtune bench lce --backend cuda`: the library's CUDA linear cross-entropy (bf16 h and dense
 * bf16 head, mean reduction) forward + grad of h at N tokens, V vocabulary, C width, in three
 * arms: lt_lce_forward then lt_lce_backward (three GEMMs), lt_lce_forward_backward (one call, two
 * GEMMs, bf16 logit tiles: the default), the same with fp32 logit tiles, and the default one call
 * captured into a CUDA graph and replayed, as the trainer's step graph runs it (its targets checked
 * on the host, as the model's batch check does). Median time (device synchronised), extra
 * device bytes from the accounting allocator (workspace), agreement of loss and dh with the first
 * arm, and ratios to the PyTorch peers of bench/peers/lce_torch.py run in the same invocation
 * (naive bf16 logits, fp32 upcast), to the GEMM floor 2·2·N·V·C and to the bf16 GEMM rate
 * measured there (executed GEMM FLOPs: 6NVC for the two calls, 4NVC for the one). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"
#include "longtune/alloc.h"
#include "longtune/lce.h"
#include "backend/backend.h"
#include "backend/lce_impl.h"
#include "longtune/log.h"

#if LT_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

static double peer_value(const cJSON *peers, const char *peer, const char *key) {
    const cJSON *p;
    cJSON_ArrayForEach(p, peers) {
        const cJSON *n = cJSON_GetObjectItem(p, "peer");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, peer))
            return cJSON_GetNumberValue(cJSON_GetObjectItem(p, key));
    }
    return 0;
}

/* Milliseconds of one cuBLASLt bf16 GEMM (fp32 accumulate), C (m x n, col-major, fp32 or bf16
 * output) = op(A)·op(B) + beta·C with A, B of uniform random values (a GEMM's power draw, and with it
 * the clock a card holds, depends on how many of its operands' bits toggle: constant operands
 * toggle almost none) and C zeroed, 4 MiB of cuBLASLt workspace as the library uses: the same-run
 * ceiling of the library's own GEMMs. reps timed after one warm-up, CUDA events; 0 when cuBLASLt
 * refuses or the operands cannot be made. */
static double lt_gemm_ms(cublasLtHandle_t lt, void *ws, int64_t m, int64_t n, int64_t k, int ta, int tb, int c_bf16,
                         float beta, int reps) {
    void *A = NULL, *B = NULL, *Cm = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t ad = NULL, bd = NULL, cd = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double ms = 0;
    size_t wsb = (size_t)4 << 20;
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    float alpha = 1.0f;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (cudaMalloc(&A, (size_t)(m * k) * 2) != cudaSuccess || cudaMalloc(&B, (size_t)(k * n) * 2) != cudaSuccess ||
        cudaMalloc(&Cm, (size_t)(m * n) * 4) != cudaSuccess)
        goto out;
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    if (!lt_bench_cuda_fill_uniform_bf16(A, (size_t)(m * k), (size_t)1 << 22, 1.0f, &seed) ||
        !lt_bench_cuda_fill_uniform_bf16(B, (size_t)(k * n), (size_t)1 << 22, 1.0f, &seed) ||
        cudaMemset(Cm, 0, (size_t)(m * n) * 4) != cudaSuccess)
        goto out;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto out;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtMatrixLayoutCreate(&ad, CUDA_R_16BF, (uint64_t)(ta ? k : m), (uint64_t)(ta ? m : k), ta ? k : m);
    cublasLtMatrixLayoutCreate(&bd, CUDA_R_16BF, (uint64_t)(tb ? n : k), (uint64_t)(tb ? k : n), tb ? n : k);
    cublasLtMatrixLayoutCreate(&cd, c_bf16 ? CUDA_R_16BF : CUDA_R_32F, (uint64_t)m, (uint64_t)n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    if (cublasLtMatmulAlgoGetHeuristic(lt, op, ad, bd, cd, cd, pref, 1, &res, &nres) != CUBLAS_STATUS_SUCCESS ||
        nres < 1)
        goto out;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cublasLtMatmul(lt, op, &alpha, A, ad, B, bd, &beta, Cm, cd, Cm, cd, &res.algo, ws, wsb, 0);
    cudaEventRecord(e0, 0);
    for (int r = 0; r < reps; r++)
        cublasLtMatmul(lt, op, &alpha, A, ad, B, bd, &beta, Cm, cd, Cm, cd, &res.algo, ws, wsb, 0);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    ms = (double)t / reps;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (cd) cublasLtMatrixLayoutDestroy(cd);
    if (bd) cublasLtMatrixLayoutDestroy(bd);
    if (ad) cublasLtMatrixLayoutDestroy(ad);
    if (op) cublasLtMatmulDescDestroy(op);
    cudaFree(A);
    cudaFree(B);
    cudaFree(Cm);
    (void)cudaGetLastError();
    return ms;
}

/* An arm's result object with the fields every arm has, appended to arms; the caller adds its own. */
static cJSON *add_arm(cJSON *arms, const char *name, double ms, int gemms, int64_t N, size_t extra, size_t ws_bytes,
                      const char *tiles, float loss) {
    cJSON *arm = cJSON_CreateObject();
    cJSON_AddStringToObject(arm, "name", name);
    cJSON_AddNumberToObject(arm, "median_ms", ms);
    cJSON_AddNumberToObject(arm, "gemms", gemms);
    cJSON_AddNumberToObject(arm, "tokens_per_s", (double)N / (ms * 1e-3));
    cJSON_AddNumberToObject(arm, "peak_bytes", (double)extra);
    cJSON_AddNumberToObject(arm, "workspace_bytes", (double)ws_bytes);
    cJSON_AddStringToObject(arm, "logit_tiles", tiles);
    cJSON_AddNumberToObject(arm, "loss", loss);
    cJSON_AddItemToArray(arms, arm);
    return arm;
}

/* The GEMM-only time of the one call at tiles nc x vc: (N/nc)·(V/vc) tiles of GEMM 1 (logits,
 * fp32 or bf16 out) and GEMM 2 (accumulator, fp32, beta 1), timed here at those tile shapes (the
 * ragged last tiles counted as full ones); and the rate of one N x V x C GEMM. */
static void gemm_ceiling(cJSON *r, const char *key, int64_t N, int64_t V, int64_t C, int64_t nc, int64_t vc,
                         int zbf16) {
    cublasLtHandle_t lt = NULL;
    void *ws = NULL;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS || cudaMalloc(&ws, (size_t)4 << 20) != cudaSuccess) {
        if (lt) cublasLtDestroy(lt);
        return;
    }
    const double full = lt_gemm_ms(lt, ws, V, N, C, 1, 0, 1, 0.0f, 5);
    const double g1 = lt_gemm_ms(lt, ws, vc, nc, C, 1, 0, zbf16, 0.0f, 20);
    const double g2 = lt_gemm_ms(lt, ws, C, nc, vc, 0, 0, 0, 1.0f, 20);
    const double tiles = (double)((N + nc - 1) / nc) * (double)((V + vc - 1) / vc);
    const double fN = (double)N, fV = (double)V, fC = (double)C, fnc = (double)nc, fvc = (double)vc;
    cJSON *o = cJSON_AddObjectToObject(r, key);
    cJSON_AddNumberToObject(o, "full_gemm_ms", full);
    cJSON_AddNumberToObject(o, "full_gemm_tflops", full > 0 ? 2.0 * fN * fV * fC / (full * 1e9) : 0);
    cJSON_AddNumberToObject(o, "tile_n", (double)nc);
    cJSON_AddNumberToObject(o, "tile_v", (double)vc);
    cJSON_AddNumberToObject(o, "gemm1_tile_ms", g1);
    cJSON_AddNumberToObject(o, "gemm2_tile_ms", g2);
    cJSON_AddNumberToObject(o, "fb_gemm_only_ms", tiles * (g1 + g2));
    fprintf(
        stderr,
        "  cuBLASLt (%s): %lldx%lldx%lld GEMM %.2f ms (%.0f TFLOP/s); tiles %lldx%lld: GEMM 1 %.3f ms (%.0f TFLOP/s), "
        "GEMM 2 %.3f ms (%.0f TFLOP/s), x%.0f tiles = %.2f ms of GEMMs for the one call\n",
        key, (long long)N, (long long)V, (long long)C, full, full > 0 ? 2.0 * fN * fV * fC / (full * 1e9) : 0,
        (long long)nc, (long long)vc, g1, g1 > 0 ? 2.0 * fnc * fvc * fC / (g1 * 1e9) : 0, g2,
        g2 > 0 ? 2.0 * fnc * fvc * fC / (g2 * 1e9) : 0, tiles, tiles * (g1 + g2));
    cudaFree(ws);
    cublasLtDestroy(lt);
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

int lt_bench_lce_cuda(const lt_bench_common *c, int64_t N, int64_t V, int64_t C, int peers, int tile_n, int tile_v,
                      int arm_mask) {
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
    void *h = lt_bench_cuda_uniform_bf16(ctx, (size_t)(N * C), 1.7f, &s, "bench lce tensor"),
         *w = lt_bench_cuda_uniform_bf16(ctx, (size_t)(V * C), 0.05f, &s, "bench lce tensor");
    void *dh = lt_alloc(ctx, LT_DEVICE_CUDA, hb, "bench lce dh");
    int32_t *tg = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)N * 4, "bench lce targets");
    float *lse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)N * 4, "bench lce lse");
    float *loss = lt_alloc(ctx, LT_DEVICE_CUDA, 8, "bench lce loss");
    int32_t *ht = malloc((size_t)N * 4);
    uint16_t *dh0 = malloc(hb), *dht = malloc(hb);
    double *tt = malloc(sizeof(double) * (size_t)c->repeats), *tf = malloc(sizeof(double) * (size_t)c->repeats);
    cJSON *r = NULL, *arms = NULL, *arm_objs[4] = {NULL, NULL, NULL, NULL};
    double arm_ms[4] = {0, 0, 0, 0};
    uint16_t *dh1 = malloc(hb); /* the eager one call's dh, which the graph's replay must match bit for bit */
    lt_graph *graph = NULL;
    const lt_backend *be = lt_backend_get(LT_DEVICE_CUDA);
    void *lws = NULL; /* the arm's loss workspace */
    size_t lwsb = 0;
    if (!h || !w || !dh || !tg || !lse || !loss || !ht || !dh0 || !dh1 || !dht || !tt || !tf) goto done;
    for (int64_t i = 0; i < N; i++) ht[i] = (int32_t)((uint64_t)(i * 2654435761u) % (uint64_t)V);
    cudaMemcpy(tg, ht, (size_t)N * 4, cudaMemcpyHostToDevice);
    const float one = 1.0f;
    cudaMemcpy(loss + 1, &one, 4, cudaMemcpyHostToDevice);
    int64_t hs[2] = {N, C}, ws[2] = {V, C};
    lt_tensor tdh = lt_tensor_view(dh, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs);
    lt_lce_args a = {.h = lt_tensor_view(h, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, hs),
                     .w = lt_tensor_view(w, LT_DTYPE_BF16, LT_DEVICE_CUDA, 2, ws),
                     .targets = tg,
                     .loss = loss,
                     .lse = lse,
                     .dloss = loss + 1,
                     .dh = &tdh};
    lt_lce_options o = {.tile_n = tile_n, .tile_v = tile_v};

    r = lt_bench_result_new("lce");
    cJSON *cfg = cJSON_AddObjectToObject(r, "config");
    cJSON_AddStringToObject(cfg, "backend", "cuda");
    cJSON_AddNumberToObject(cfg, "N", (double)N);
    cJSON_AddNumberToObject(cfg, "V", (double)V);
    cJSON_AddNumberToObject(cfg, "C", (double)C);
    cJSON_AddStringToObject(cfg, "dtype", "bf16");
    cJSON_AddStringToObject(cfg, "measures", "forward + grad of h (head frozen), mean reduction");
    cJSON_AddStringToObject(cfg, "workspace", "the caller's, allocated once per arm (as the training step passes it)");
    cJSON_AddNumberToObject(cfg, "repeats", c->repeats);
    cJSON_AddNumberToObject(cfg, "tile_n", tile_n);
    cJSON_AddNumberToObject(cfg, "tile_v", tile_v);
    arms = cJSON_AddArrayToObject(r, "arms");
    static const char *names[4] = {"cuda-chunked-cublaslt", "cuda-fused-fb", "cuda-fused-fb-fp32-logits",
                                   "cuda-fused-fb-graph"};
    const int run_two = (arm_mask & 2) != 0, run_one = (arm_mask & 8) != 0;
    for (int ai = 0; ai < 3; ai++) {
        if (ai == 0 ? !run_two : !run_one) continue;
        o.fp32_logit_tiles = ai == 2;
        const size_t used = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
        lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
        /* The workspace is the caller's, allocated once per arm (inside the arm's peak), as the
         * training step passes the model's: the calls time the loss, not a cudaMalloc/cudaFree. */
        lwsb = lt_lce_workspace_bytes(&o, &a, ai == 0 ? 0 : LT_LCE_PASS_FORWARD_BACKWARD, 0);
        const size_t bwd_bytes = ai == 0 ? lt_lce_workspace_bytes(&o, &a, 1, 0) : 0; /* the second call */
        if (bwd_bytes > lwsb) lwsb = bwd_bytes;
        lws = lwsb ? lt_alloc(ctx, LT_DEVICE_CUDA, lwsb, "bench lce workspace") : NULL;
        if (lwsb && !lws) goto done;
        a.workspace = lws;
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
        const size_t extra = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes - used;
        a.workspace = NULL;
        if (lws) lt_free(ctx, LT_DEVICE_CUDA, lws, lwsb);
        lws = NULL;
        const double ms = lt_bench_median(tt, c->repeats), fwd = lt_bench_median(tf, c->repeats);
        float lv = 0;
        cudaMemcpy(&lv, loss, 4, cudaMemcpyDeviceToHost);
        double ddh = 0;
        if (ai == 0) cudaMemcpy(dh0, dh, hb, cudaMemcpyDeviceToHost);
        else if (run_two) ddh = dh_max_diff(dh, dh0, (size_t)(N * C), dht);
        if (ai == 1) cudaMemcpy(dh1, dh, hb, cudaMemcpyDeviceToHost);
        cJSON *arm = add_arm(arms, names[ai], ms, ai == 0 ? 3 : 2, N, extra,
                             lt_lce_workspace_bytes(&o, &a, ai == 0 ? 1 : LT_LCE_PASS_FORWARD_BACKWARD, 0),
                             ai == 1 ? "bf16" : "fp32", lv);
        if (ai == 0) cJSON_AddNumberToObject(arm, "fwd_ms", fwd);
        if (ai && run_two) cJSON_AddNumberToObject(arm, "dh_max_diff_vs_first_arm_scaled", ddh);
        arm_objs[ai] = arm;
        arm_ms[ai] = ms;
        char diff[48] = "";
        if (ai && run_two) snprintf(diff, sizeof diff, ", dh diff %.2g", ddh);
        fprintf(stderr, "cuda lce %-26s N=%lld V=%lld C=%lld: %.2f ms%s, extra %.1f MiB, loss %.5f%s\n", names[ai],
                (long long)N, (long long)V, (long long)C, ms, ai == 0 ? " (two calls)" : "", (double)extra / (1 << 20),
                (double)lv, diff);
    }
    /* The default one call captured into a CUDA graph and replayed: the trainer captures its whole
     * step (the loss included) and replays it, so the 200-odd dependent launches of the call go out
     * without the host in between. Targets are checked on the host first, as the model does before
     * its upload (a device-side check waits for the device, which a capture may not). */
    if (run_one && be && be->graph_begin && be->graph_end && be->graph_launch && be->graph_free) {
        o.fp32_logit_tiles = 0;
        const size_t used = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
        lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
        lwsb = lt_lce_workspace_bytes(&o, &a, LT_LCE_PASS_FORWARD_BACKWARD, 0);
        lws = lwsb ? lt_alloc(ctx, LT_DEVICE_CUDA, lwsb, "bench lce workspace") : NULL;
        if (lwsb && !lws) goto done;
        a.workspace = lws;
        a.targets_checked = 1;
        cudaMemset(dh, 0xff, hb);
        cudaDeviceSynchronize();
        if (be->graph_begin(ctx) != LT_OK) goto done;
        const lt_status cs = lt_lce_forward_backward(ctx, &o, &a);
        const lt_status es = be->graph_end(ctx, &graph);
        if (cs != LT_OK || es != LT_OK) goto done;
        /* Each replay alternates with the same call run eagerly (tf), so both see the same clocks. */
        for (int k = -c->warmup; k < c->repeats; k++) {
            cudaMemset(dh, 0xff, hb);
            cudaDeviceSynchronize();
            const double t0 = lt_time_now();
            if (lt_lce_forward_backward(ctx, &o, &a) != LT_OK) goto done;
            cudaDeviceSynchronize();
            const double t1 = lt_time_now();
            cudaMemset(dh, 0xff, hb);
            cudaDeviceSynchronize();
            const double t2 = lt_time_now();
            if (be->graph_launch(ctx, graph, NULL) != LT_OK) goto done;
            cudaDeviceSynchronize();
            if (k >= 0) tf[k] = (t1 - t0) * 1e3, tt[k] = (lt_time_now() - t2) * 1e3;
        }
        const size_t extra = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes - used;
        a.workspace = NULL;
        a.targets_checked = 0;
        if (lws) lt_free(ctx, LT_DEVICE_CUDA, lws, lwsb);
        lws = NULL;
        const double ms = lt_bench_median(tt, c->repeats), eager = lt_bench_median(tf, c->repeats);
        float lv = 0;
        cudaMemcpy(&lv, loss, 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(dht, dh, hb, cudaMemcpyDeviceToHost);
        const int same = memcmp(dht, dh1, hb) == 0;
        cJSON *arm = add_arm(arms, names[3], ms, 2, N, extra, lwsb, "bf16", lv);
        cJSON_AddStringToObject(arm, "launch", "one CUDA graph replay of the captured call");
        cJSON_AddNumberToObject(arm, "eager_alternated_ms", eager);
        cJSON_AddBoolToObject(arm, "dh_bits_equal_to_eager_call", same);
        arm_objs[3] = arm;
        arm_ms[3] = ms;
        fprintf(stderr,
                "cuda lce %-26s N=%lld V=%lld C=%lld: %.2f ms (the eager call alternated with it: %.2f ms), extra "
                "%.1f MiB, loss %.5f, dh %s the eager call's\n",
                names[3], (long long)N, (long long)V, (long long)C, ms, eager, (double)extra / (1 << 20), (double)lv,
                same ? "bit-identical to" : "DIFFERENT from");
        if (!same) {
            lt_log(LT_LOG_ERROR, "cuda lce: the graph replay's dh differs from the eager call's");
            goto done;
        }
    }
    /* Same-run cuBLASLt ceilings at the tile shapes the one call takes (the library's choice for
     * bf16 and for fp32 logit tiles; tile flags override). */
    for (int zbf = 1; zbf >= 0; zbf--) {
        lt_lce_options to = {.tile_n = tile_n, .tile_v = tile_v, .fp32_logit_tiles = !zbf};
        int64_t nc = 0, vc = 0;
        lt_lce_cuda_fb_tiles(&to, N, V, C, 0, &nc, &vc);
        gemm_ceiling(r, zbf ? "cublaslt_bf16_logits" : "cublaslt_fp32_logits", N, V, C, nc, vc, zbf);
    }
    if (peers) {
        char args[64];
        snprintf(args, sizeof args, "%d %lld %lld %lld", c->repeats, (long long)N, (long long)V, (long long)C);
        cJSON *pl = lt_bench_run_peers("bench/peers/lce_torch.py", args);
        cJSON_AddItemToObject(r, "peers", pl);
        const double naive = peer_value(pl, "torch_naive_bf16", "total_ms");
        const double up = peer_value(pl, "torch_fp32_upcast", "total_ms");
        const double gemm = peer_value(pl, "torch_gemm_bf16", "tflops");
        for (int ai = 0; ai < 4; ai++) {
            cJSON *arm = arm_objs[ai];
            const double ms = arm_ms[ai];
            if (!arm) continue;
            if (naive > 0) cJSON_AddNumberToObject(arm, "speedup_vs_torch_naive_bf16", naive / ms);
            if (up > 0) cJSON_AddNumberToObject(arm, "speedup_vs_torch_fp32_upcast", up / ms);
            if (gemm > 0) {
                /* The floor: two GEMMs (logits and grad of h) at the peer's measured bf16 rate;
                 * and the rate of the GEMM FLOPs the arm actually executes against that rate. */
                const double floor_ms = 2.0 * 2.0 * (double)N * (double)V * (double)C / (gemm * 1e9);
                const double exec = (ai == 0 ? 6.0 : 4.0) * (double)N * (double)V * (double)C / (ms * 1e-3) / 1e12;
                cJSON_AddNumberToObject(arm, "gemm_floor_ms", floor_ms);
                cJSON_AddNumberToObject(arm, "fraction_of_gemm_floor", floor_ms / ms);
                cJSON_AddNumberToObject(arm, "executed_gemm_tflops", exec);
                cJSON_AddNumberToObject(arm, "fraction_of_gemm_rate", exec / gemm);
                fprintf(
                    stderr,
                    "  %-26s GEMM floor %.2f ms at %.0f TFLOP/s: %.2fx of it; executed GEMMs at %.0f TFLOP/s (%.2f of the rate)\n",
                    names[ai], floor_ms, gemm, ms / floor_ms, exec, exec / gemm);
            }
            if (naive > 0)
                fprintf(stderr, "  %-26s vs torch naive bf16 %.2f ms: %.2fx; vs fp32 upcast %.2f ms: %.2fx\n",
                        names[ai], naive, naive / ms, up, up > 0 ? up / ms : 0);
        }
    }
    rc = 0;
done:
    if (rc) lt_log(LT_LOG_ERROR, "cuda lce arm failed: %s", lt_ctx_error(ctx));
    if (graph) be->graph_free(graph);
    if (lws) lt_free(ctx, LT_DEVICE_CUDA, lws, lwsb);
    lt_free(ctx, LT_DEVICE_CUDA, h, hb);
    lt_free(ctx, LT_DEVICE_CUDA, w, wb);
    lt_free(ctx, LT_DEVICE_CUDA, dh, hb);
    lt_free(ctx, LT_DEVICE_CUDA, tg, (size_t)N * 4);
    lt_free(ctx, LT_DEVICE_CUDA, lse, (size_t)N * 4);
    lt_free(ctx, LT_DEVICE_CUDA, loss, 8);
    free(ht);
    free(dh0);
    free(dh1);
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
int lt_bench_lce_cuda(const lt_bench_common *c, int64_t N, int64_t V, int64_t C, int peers, int tile_n, int tile_v,
                      int arm_mask) {
    (void)c;
    (void)N;
    (void)V;
    (void)C;
    (void)peers;
    (void)tile_n;
    (void)tile_v;
    (void)arm_mask;
    fprintf(stderr, "longtune bench lce: this build has no CUDA backend\n");
    return 1;
}
#endif
