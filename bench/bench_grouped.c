/* `longtune bench grouped --backend cuda`: the experts' grouped products (lt_backend.grouped_matmul, one
 * launch for all experts, f32 x and y, W in any dtype decoded in the tile loads) at a Qwen3-30B-A3B
 * MoE layer (E = 128 experts, k = 8 per token, C = 2048, moe_F = 768) over n tokens routed at
 * random, for the four products of a layer's step (gate/up and down, forward and backward), against
 * the same products as one cuBLASLt bf16 GEMM per expert with the row counts known on the host and
 * operands already in bf16 (what a host-synchronised loop would run at). Medians over repeats, device
 * synchronised around each call; TFLOP/s = 2·nk·C·moe_F / time. The inputs are made on the host on
 * all threads (bench_grouped_inputs.c) once per dtype and weight shape, into buffers reused across
 * them, so the setup stays seconds for every dtype. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench.h"
#include "bench_grouped.h"
#include "longtune/alloc.h"
#include "longtune/log.h"

#if LT_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

#define SYNOPSIS "longtune bench grouped --backend cuda [options]"

/* --dtypes: a comma list of weight dtypes, or all of them. */
typedef struct dtype_list {
    lt_dtype dt[LT_DTYPE_COUNT_];
    int n;
} dtype_list;

static const char *parse_dtypes(const char *v, void *dst) {
    dtype_list *l = dst;
    l->n = 0;
    if (!strcmp(v, "all")) {
        for (int d = 0; d < LT_DTYPE_COUNT_; d++)
            if (lt_bench_grouped_dtype_ok((lt_dtype)d)) l->dt[l->n++] = (lt_dtype)d;
        return NULL;
    }
    char buf[256];
    if (strlen(v) >= sizeof buf) return "a shorter dtype list";
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (l->n == LT_DTYPE_COUNT_ || lt_dtype_parse(tok, &l->dt[l->n]) != LT_OK ||
            !lt_bench_grouped_dtype_ok(l->dt[l->n]))
            return "all, or a comma list of weight dtypes (f32, bf16, f16, q8_0, q4_0, ..., iq4_xs)";
        l->n++;
    }
    return l->n ? NULL : "all, or a comma list of weight dtypes";
}

#if LT_HAVE_CUDA
/* The peer: per expert e with m_e rows, one cuBLASLt bf16 GEMM (fp32 accumulate, f32 out), plans
 * made before timing. Row-major y_e = x_e·W_eᵀ (NT) or x_e·W_e (NN) is column-major
 * y_eᵀ = op(W_e)·x_eᵀ. Median ms of the E calls together; < 0 when cuBLASLt refuses a shape. */
static double peer_ms(const int32_t *off, int64_t E, int nn, int64_t out, int64_t in, const void *W, const void *X,
                      float *Y, void *ws, size_t wsb, int warmup, int repeats) {
    const int64_t K = nn ? out : in, N = nn ? in : out;
    double ms = -1, *t = malloc(sizeof(double) * (size_t)repeats);
    cublasLtHandle_t h = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t *bd = calloc((size_t)E, sizeof *bd), *cd = calloc((size_t)E, sizeof *cd), ad = NULL;
    cublasLtMatmulAlgo_t *algo = calloc((size_t)E, sizeof *algo);
    cublasLtMatmulPreference_t pref = NULL;
    const float one = 1.0f, zero = 0.0f;
    cublasOperation_t opa = nn ? CUBLAS_OP_N : CUBLAS_OP_T, opb = CUBLAS_OP_N;
    if (!t || !bd || !cd || !algo || cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) goto done;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto done;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    /* W_e row-major (out, in) is column-major (in, out), ld in */
    cublasLtMatrixLayoutCreate(&ad, CUDA_R_16BF, (uint64_t)in, (uint64_t)out, in);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    for (int64_t e = 0; e < E; e++) {
        const int64_t m = off[e + 1] - off[e];
        if (!m) continue;
        cublasLtMatrixLayoutCreate(&bd[e], CUDA_R_16BF, (uint64_t)K, (uint64_t)m, K);
        cublasLtMatrixLayoutCreate(&cd[e], CUDA_R_32F, (uint64_t)N, (uint64_t)m, N);
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        if (cublasLtMatmulAlgoGetHeuristic(h, op, ad, bd[e], cd[e], cd[e], pref, 1, &res, &nres) !=
                CUBLAS_STATUS_SUCCESS ||
            nres < 1)
            goto done;
        algo[e] = res.algo;
    }
    for (int r = -warmup; r < repeats; r++) {
        cudaDeviceSynchronize();
        double t0 = lt_time_now();
        for (int64_t e = 0; e < E; e++) {
            if (off[e + 1] == off[e]) continue;
            const char *We = (const char *)W + (size_t)(e * out * in) * 2;
            const char *Xe = (const char *)X + (size_t)off[e] * (size_t)K * 2;
            float *Ye = Y + (size_t)off[e] * (size_t)N;
            cublasLtMatmul(h, op, &one, We, ad, Xe, bd[e], &zero, Ye, cd[e], Ye, cd[e], &algo[e], ws, wsb, 0);
        }
        cudaDeviceSynchronize();
        if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
    }
    if (cudaGetLastError() == cudaSuccess) ms = lt_bench_median(t, repeats);
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    for (int64_t e = 0; bd && cd && e < E; e++) {
        if (bd[e]) cublasLtMatrixLayoutDestroy(bd[e]);
        if (cd[e]) cublasLtMatrixLayoutDestroy(cd[e]);
    }
    if (ad) cublasLtMatrixLayoutDestroy(ad);
    if (op) cublasLtMatmulDescDestroy(op);
    if (h) cublasLtDestroy(h);
    free(bd), free(cd), free(algo), free(t);
    return ms;
}

/* The four products of a layer's step; W (E·out, in) with (out, in) = (F, C) for gate/up, (C, F)
 * for down, so each weight serves its forward (NT) and backward (NN) product. */
static const struct {
    const char *name;
    int nn, down;
} prods[4] = {{"gate_up_fwd", 0, 0}, {"gate_up_bwd", 1, 0}, {"down_fwd", 0, 1}, {"down_bwd", 1, 1}};

static cJSON *arm_new(cJSON *arms, const char *name, const char *dtype, const char *product, double ms, double flop) {
    cJSON *arm = cJSON_CreateObject();
    cJSON_AddStringToObject(arm, "name", name);
    cJSON_AddStringToObject(arm, "dtype", dtype);
    cJSON_AddStringToObject(arm, "product", product);
    cJSON_AddNumberToObject(arm, "median_ms", ms);
    cJSON_AddNumberToObject(arm, "tflops", ms > 0 ? flop / (ms * 1e9) : 0);
    cJSON_AddItemToArray(arms, arm);
    return arm;
}
#endif

int lt_bench_grouped(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    int64_t n = 8192, E = 128, k = 8, C = 2048, F = 768;
    dtype_list dl = {.n = 0};
    const lt_bench_arg flags[] = {
        LT_BENCH_I64("--n", &n, 1, 1 << 20),
        LT_BENCH_FN("--dtypes", &dl, parse_dtypes),
    };
    const int parsed =
        lt_bench_parse_args("grouped", SYNOPSIS, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf(
            "usage: " SYNOPSIS "\n\n"
            "The experts' grouped products (one launch for all experts) at a Qwen3-30B-A3B MoE layer\n"
            "(E = 128, k = 8, C = 2048, moe_F = 768) over n tokens routed at random: gate/up and down\n"
            "forward (NT), gate/up and down backward (NN), median ms and TFLOP/s, against one\n"
            "cuBLASLt bf16 GEMM per expert on bf16 operands with host-known row counts.\n\n"
            "options:\n"
            "  --n N            tokens (default 8192: nk = 65536 assignments)\n"
            "  --dtypes LIST    expert weight dtypes, or all (default bf16,q8_0,q4_0,q4_k,q6_k)\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
    lt_dtype *dts = dl.dt;
    int ndts = dl.n;
#if !LT_HAVE_CUDA
    (void)n, (void)E, (void)k, (void)C, (void)F, (void)dts, (void)ndts;
    fprintf(stderr, "longtune bench grouped: this build has no CUDA backend\n");
    return 1;
#else
    if (strcmp(c.backend, "cuda"))
        return lt_bench_usage_error("grouped", SYNOPSIS, "measures the CUDA backend only: --backend cuda, not '%s'",
                                    c.backend);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        fprintf(stderr, "longtune bench grouped: no CUDA device\n");
        return 1;
    }
    if (!ndts)
        dts[ndts++] = LT_DTYPE_BF16, dts[ndts++] = LT_DTYPE_Q8_0, dts[ndts++] = LT_DTYPE_Q4_0,
        dts[ndts++] = LT_DTYPE_Q4_K, dts[ndts++] = LT_DTYPE_Q6_K;
    const lt_backend *be = lt_backend_get(LT_DEVICE_CUDA);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    const int64_t nk = n * k, X = C > F ? C : F;
    const uint64_t seed = 0x9e3779b97f4a7c15ULL;
    const double t_setup = lt_time_now();
    int rc = 1;
    /* One host staging buffer, one device weight and one workspace, each as large as the largest
     * dtype and shape needs, reused across them; the bf16 peer weight is staged there first. */
    size_t wmax = (size_t)(E * C * F) * 2, wsmax = 0;
    for (int di = 0; di < ndts; di++)
        for (int down = 0; down < 2; down++) {
            const int64_t out = down ? C : F, in = down ? F : C, rb = lt_dtype_row_bytes(dts[di], in);
            if (rb < 0) continue;
            if ((size_t)(rb * E * out) > wmax) wmax = (size_t)(rb * E * out);
            const size_t wsb = be->grouped_matmul_workspace_bytes(dts[di], E, out, in, nk, 0);
            if (wsb > wsmax) wsmax = wsb;
        }
    int32_t *off = calloc((size_t)(E + 1), sizeof(int32_t));
    double *t = malloc(sizeof(double) * (size_t)c.repeats), pms[4];
    float *hx = malloc((size_t)(nk * X) * 4);
    uint16_t *hxb = malloc((size_t)(nk * X) * 2);
    uint8_t *hw = malloc(wmax);
    void *x = NULL, *y = NULL, *doff = NULL, *xb = NULL, *wb = NULL, *pws = NULL, *w = NULL, *ws = NULL;
    const size_t pwsb = (size_t)32 << 20;
    cJSON *res = lt_bench_result_new("grouped");
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(cfg, "backend", "cuda");
    cJSON_AddNumberToObject(cfg, "n", (double)n);
    cJSON_AddNumberToObject(cfg, "E", (double)E);
    cJSON_AddNumberToObject(cfg, "k", (double)k);
    cJSON_AddNumberToObject(cfg, "C", (double)C);
    cJSON_AddNumberToObject(cfg, "moe_F", (double)F);
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    cJSON_AddNumberToObject(cfg, "warmup", c.warmup);
    cJSON_AddNumberToObject(cfg, "weight_pool_rows", LT_BENCH_GROUPED_POOL_ROWS);
    cJSON_AddStringToObject(cfg, "measures",
                            "lt_backend.grouped_matmul (one launch, f32 x and y, W decoded in the tile loads) vs "
                            "E cuBLASLt bf16 GEMMs on bf16 operands; TFLOP/s = 2*nk*C*moe_F / time; weights "
                            "repeat weight_pool_rows random rows (the time does not depend on the values)");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    if (!off || !t || !hx || !hxb || !hw || !res) goto done;
    lt_bench_grouped_route(n, E, k, seed, off);
    lt_bench_grouped_fill(hx, hxb, nk, X, 1.0f, seed + 1, 0);
    if (lt_bench_grouped_weight(LT_DTYPE_BF16, E * F, C, seed + 2, 0, hw)) goto done;
    x = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(nk * X) * 4, "bench grouped x");
    y = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(nk * X) * 4, "bench grouped y");
    doff = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(E + 1) * 4, "bench grouped offsets");
    xb = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(nk * X) * 2, "bench grouped peer x");
    wb = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(E * C * F) * 2, "bench grouped peer w");
    pws = lt_alloc(ctx, LT_DEVICE_CUDA, pwsb, "bench grouped peer workspace");
    w = lt_alloc(ctx, LT_DEVICE_CUDA, wmax, "bench grouped weight");
    ws = wsmax ? lt_alloc(ctx, LT_DEVICE_CUDA, wsmax, "bench grouped workspace") : NULL;
    if (!x || !y || !doff || !xb || !wb || !pws || !w || (wsmax && !ws)) goto done;
    if (cudaMemcpy(x, hx, (size_t)(nk * X) * 4, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(xb, hxb, (size_t)(nk * X) * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(wb, hw, (size_t)(E * C * F) * 2, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(doff, off, (size_t)(E + 1) * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
        lt_log(LT_LOG_ERROR, "bench grouped: copying the inputs to the device failed");
        goto done;
    }
    double setup_s = lt_time_now() - t_setup;
    fprintf(stderr, "inputs (routing, x, peer weights) made and copied in %.2f s\n", setup_s);
    const double flop = 2.0 * (double)nk * (double)C * (double)F;
    for (int pi = 0; pi < 4; pi++) {
        const int64_t out = prods[pi].down ? C : F, in = prods[pi].down ? F : C;
        pms[pi] = peer_ms(off, E, prods[pi].nn, out, in, wb, xb, y, pws, pwsb, c.warmup, c.repeats);
        char name[96];
        snprintf(name, sizeof name, "cublaslt-per-expert-%s", prods[pi].name);
        arm_new(arms, name, "bf16", prods[pi].name, pms[pi], flop);
        fprintf(stderr, "%-40s %9.3f ms %7.1f TFLOP/s\n", name, pms[pi], pms[pi] > 0 ? flop / (pms[pi] * 1e9) : 0.0);
    }
    for (int di = 0; di < ndts; di++)
        for (int down = 0; down < 2; down++) {
            const lt_dtype dt = dts[di];
            const int64_t out = down ? C : F, in = down ? F : C, rb = lt_dtype_row_bytes(dt, in);
            if (rb < 0) continue; /* in not a multiple of the block */
            const double tw = lt_time_now();
            const size_t wbytes = (size_t)(rb * E * out);
            if (lt_bench_grouped_weight(dt, E * out, in, seed + 3 + (uint64_t)(2 * di + down), 0, hw) ||
                cudaMemcpy(w, hw, wbytes, cudaMemcpyHostToDevice) != cudaSuccess) {
                lt_log(LT_LOG_ERROR, "bench grouped: making the %s weights failed", lt_dtype_name(dt));
                goto done;
            }
            setup_s += lt_time_now() - tw;
            int64_t shape[2] = {E * out, in};
            lt_tensor wt = lt_tensor_view(w, dt, LT_DEVICE_CUDA, 2, shape);
            const size_t wsb = be->grouped_matmul_workspace_bytes(dt, E, out, in, nk, 0);
            for (int pi = 0; pi < 4; pi++) {
                if (prods[pi].down != down) continue;
                for (int r = -c.warmup; r < c.repeats; r++) {
                    be->synchronize(ctx);
                    double t0 = lt_time_now();
                    be->grouped_matmul(ctx, prods[pi].nn ? LT_MATMUL_NN : LT_MATMUL_NT, &wt, E, doff, x, nk, 0.0f, y,
                                       wsb ? ws : NULL);
                    be->synchronize(ctx);
                    if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
                }
                const double ms = lt_bench_median(t, c.repeats), tf = flop / (ms * 1e9);
                char name[96];
                snprintf(name, sizeof name, "grouped-%s-%s", lt_dtype_name(dt), prods[pi].name);
                cJSON *arm = arm_new(arms, name, lt_dtype_name(dt), prods[pi].name, ms, flop);
                cJSON_AddNumberToObject(arm, "tokens_per_s", (double)n / (ms * 1e-3));
                cJSON_AddNumberToObject(arm, "workspace_bytes", (double)wsb);
                if (pms[pi] > 0) cJSON_AddNumberToObject(arm, "ratio_to_cublaslt_per_expert", pms[pi] / ms);
                fprintf(stderr, "%-40s %9.3f ms %7.1f TFLOP/s  %.2fx the per-expert cuBLASLt time\n", name, ms, tf,
                        pms[pi] > 0 ? pms[pi] / ms : 0.0);
            }
        }
    cJSON_AddNumberToObject(cfg, "setup_s", setup_s);
    cJSON_AddNumberToObject(cfg, "total_s", lt_time_now() - t_setup);
    fprintf(stderr, "host setup %.2f s of %.2f s in all\n", setup_s, lt_time_now() - t_setup);
    rc = 0;
done:
    if (x) lt_free(ctx, LT_DEVICE_CUDA, x, (size_t)(nk * X) * 4);
    if (y) lt_free(ctx, LT_DEVICE_CUDA, y, (size_t)(nk * X) * 4);
    if (doff) lt_free(ctx, LT_DEVICE_CUDA, doff, (size_t)(E + 1) * 4);
    if (xb) lt_free(ctx, LT_DEVICE_CUDA, xb, (size_t)(nk * X) * 2);
    if (wb) lt_free(ctx, LT_DEVICE_CUDA, wb, (size_t)(E * C * F) * 2);
    if (pws) lt_free(ctx, LT_DEVICE_CUDA, pws, pwsb);
    if (w) lt_free(ctx, LT_DEVICE_CUDA, w, wmax);
    if (ws) lt_free(ctx, LT_DEVICE_CUDA, ws, wsmax);
    if (rc) lt_log(LT_LOG_ERROR, "bench grouped failed: %s", lt_ctx_error(ctx));
    free(off), free(t), free(hx), free(hxb), free(hw);
    lt_ctx_free(ctx);
    if (rc || !res) {
        cJSON_Delete(res);
        return 1;
    }
    return lt_bench_write(&c, res, "cuda");
#endif
}
