/* `longtune bench grouped --backend cuda`: the experts' grouped products (lt_backend.grouped_matmul, one
 * launch for all experts, f32 x and y, W in any dtype decoded in the tile loads) at a Qwen3-30B-A3B
 * MoE layer (E = 128 experts, k = 8 per token, C = 2048, moe_F = 768) over n tokens routed at
 * random, for the four products of a layer's step (gate/up forward, down forward, down backward,
 * gate/up backward), against the same products as one cuBLASLt bf16 GEMM per expert with the row
 * counts known on the host and operands already in bf16 (what a host-synchronised loop would run
 * at). Medians over repeats, device synchronised around each call; TFLOP/s = 2·nk·C·moe_F / time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench.h"
#include "longtune/alloc.h"
#include "longtune/log.h"

#if LT_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

static int usage(const char *msg, const char *arg) {
    fprintf(stderr, "longtune bench grouped: %s '%s'\nusage: longtune bench grouped --backend cuda [options]\n", msg,
            arg);
    return 2;
}

#if LT_HAVE_CUDA
static uint64_t xs(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static float unif(uint64_t *s) { return (float)((double)(xs(s) >> 11) * 0x1.0p-52 - 1.0); }

/* n bytes of device memory filled from host bytes made by fill (NULL: left as allocated). */
static void *dev_fill(lt_ctx *ctx, size_t bytes, void (*fill)(void *h, size_t bytes, uint64_t *s), uint64_t *s,
                      const char *what) {
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, bytes, what);
    if (!d || !fill) return d;
    void *h = malloc(bytes);
    if (!h) {
        lt_free(ctx, LT_DEVICE_CUDA, d, bytes);
        return NULL;
    }
    fill(h, bytes, s);
    cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
    free(h);
    return d;
}

static void fill_f32(void *h, size_t bytes, uint64_t *s) {
    for (size_t i = 0; i < bytes / 4; i++) ((float *)h)[i] = unif(s);
}

static void fill_bf16(void *h, size_t bytes, uint64_t *s) {
    for (size_t i = 0; i < bytes / 2; i++) ((uint16_t *)h)[i] = lt_f32_to_bf16(0.05f * unif(s));
}

/* The stacked expert weights (rows, in) in dtype dt from uniform floats of scale 0.05. */
static void *make_weight(lt_ctx *ctx, lt_dtype dt, int64_t rows, int64_t in, uint64_t *s, size_t *bytes) {
    const size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    *bytes = rb * (size_t)rows;
    uint8_t *h = malloc(*bytes);
    float *row = malloc((size_t)in * sizeof *row);
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, *bytes, "bench grouped weight");
    if (!h || !row || !d) {
        free(h), free(row);
        if (d) lt_free(ctx, LT_DEVICE_CUDA, d, *bytes);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < in; c++) row[c] = 0.05f * unif(s);
        uint8_t *dst = h + rb * (size_t)r;
        if (dt == LT_DTYPE_F32) memcpy(dst, row, rb);
        else if (dt == LT_DTYPE_BF16)
            for (int64_t c = 0; c < in; c++) ((uint16_t *)dst)[c] = lt_f32_to_bf16(row[c]);
        else if (dt == LT_DTYPE_F16)
            for (int64_t c = 0; c < in; c++) ((uint16_t *)dst)[c] = lt_f32_to_f16(row[c]);
        else lt_quantize_row(dt, row, dst, in);
    }
    cudaMemcpy(d, h, *bytes, cudaMemcpyHostToDevice);
    free(h), free(row);
    return d;
}

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
#endif

int lt_bench_grouped(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    int64_t n = 8192, E = 128, k = 8, C = 2048, F = 768;
    lt_dtype dts[16];
    int ndts = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: longtune bench grouped --backend cuda [options]\n\n"
                   "The experts' grouped products (one launch for all experts) at a Qwen3-30B-A3B MoE layer\n"
                   "(E = 128, k = 8, C = 2048, moe_F = 768) over n tokens routed at random: gate/up and down\n"
                   "forward (NT), down and gate/up backward (NN), median ms and TFLOP/s, against one\n"
                   "cuBLASLt bf16 GEMM per expert on bf16 operands with host-known row counts.\n\n"
                   "options:\n"
                   "  --n N            tokens (default 8192: nk = 65536 assignments)\n"
                   "  --dtypes LIST    expert weight dtypes (default bf16,q8_0,q4_0,q4_k,q6_k)\n" LT_BENCH_COMMON_HELP);
            return 0;
        }
        int r = lt_bench_common_flag(&c, argc, argv, &i);
        if (r < 0) return usage("bad value for", a);
        if (r > 0) continue;
        if (!v) return usage("missing value for", a);
        i++;
        if (!strcmp(a, "--n")) {
            char *e;
            long long nn = strtoll(v, &e, 10);
            if (*e || nn < 1 || nn > (1 << 20)) return usage("bad --n", v);
            n = nn;
        } else if (!strcmp(a, "--dtypes")) {
            char buf[128];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok && ndts < 16; tok = strtok(NULL, ","))
                if (lt_dtype_parse(tok, &dts[ndts++]) != LT_OK || dts[ndts - 1] == LT_DTYPE_I32)
                    return usage("bad dtype", tok);
            if (!ndts) return usage("bad dtype list", v);
        } else {
            return usage("unknown option", a);
        }
    }
#if !LT_HAVE_CUDA
    (void)n, (void)E, (void)k, (void)C, (void)F, (void)dts;
    fprintf(stderr, "longtune bench grouped: this build has no CUDA backend\n");
    return 1;
#else
    if (strcmp(c.backend, "cuda")) return usage("measures the CUDA backend only: --backend cuda, not", c.backend);
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
    int rc = 1;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    /* Random routing: k distinct experts a token, grouped by expert on the host. */
    int32_t *off = calloc((size_t)(E + 1), sizeof(int32_t));
    double *t = malloc(sizeof(double) * (size_t)c.repeats);
    void *x = NULL, *y = NULL, *doff = NULL, *xb = NULL, *wb = NULL, *pws = NULL;
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
    cJSON_AddStringToObject(cfg, "measures",
                            "lt_backend.grouped_matmul (one launch, f32 x and y, W decoded in the tile loads) vs "
                            "E cuBLASLt bf16 GEMMs on bf16 operands; TFLOP/s = 2*nk*C*moe_F / time");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    if (!off || !t || !res) goto done;
    for (int64_t tok = 0; tok < n; tok++) {
        int32_t pick[64];
        for (int64_t j = 0; j < k && j < 64; j++) {
            int dup;
            do {
                pick[j] = (int32_t)(xs(&s) % (uint64_t)E);
                dup = 0;
                for (int64_t q = 0; q < j; q++) dup |= pick[q] == pick[j];
            } while (dup);
            off[pick[j] + 1]++;
        }
    }
    for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
    x = dev_fill(ctx, (size_t)(nk * X) * 4, fill_f32, &s, "bench grouped x");
    y = dev_fill(ctx, (size_t)(nk * X) * 4, NULL, &s, "bench grouped y");
    doff = dev_fill(ctx, (size_t)(E + 1) * 4, NULL, &s, "bench grouped offsets");
    xb = dev_fill(ctx, (size_t)(nk * X) * 2, fill_bf16, &s, "bench grouped peer x");
    wb = dev_fill(ctx, (size_t)(E * C * F) * 2, fill_bf16, &s, "bench grouped peer w");
    pws = dev_fill(ctx, pwsb, NULL, &s, "bench grouped peer workspace");
    if (!x || !y || !doff || !xb || !wb || !pws) goto done;
    cudaMemcpy(doff, off, (size_t)(E + 1) * 4, cudaMemcpyHostToDevice);
    const double flop = 2.0 * (double)nk * (double)C * (double)F;
    /* The four products: W (E·out, in) with (out, in) = (F, C) for gate/up, (C, F) for down. */
    static const struct {
        const char *name;
        int nn, down;
    } prods[4] = {{"gate_up_fwd", 0, 0}, {"down_fwd", 0, 1}, {"down_bwd", 1, 1}, {"gate_up_bwd", 1, 0}};
    rc = 0;
    for (int pi = 0; pi < 4; pi++) {
        const int64_t out = prods[pi].down ? C : F, in = prods[pi].down ? F : C;
        const double pms = peer_ms(off, E, prods[pi].nn, out, in, wb, xb, y, pws, pwsb, c.warmup, c.repeats);
        char name[96];
        snprintf(name, sizeof name, "cublaslt-per-expert-%s", prods[pi].name);
        cJSON *pa = cJSON_CreateObject();
        cJSON_AddStringToObject(pa, "name", name);
        cJSON_AddNumberToObject(pa, "median_ms", pms);
        cJSON_AddNumberToObject(pa, "tflops", pms > 0 ? flop / (pms * 1e9) : 0);
        cJSON_AddItemToArray(arms, pa);
        fprintf(stderr, "%-40s %9.3f ms %7.1f TFLOP/s\n", name, pms, pms > 0 ? flop / (pms * 1e9) : 0.0);
        for (int di = 0; di < ndts; di++) {
            const lt_dtype dt = dts[di];
            if (lt_dtype_row_bytes(dt, in) < 0) continue; /* in not a multiple of the block */
            size_t wbytes = 0;
            void *w = make_weight(ctx, dt, E * out, in, &s, &wbytes);
            if (!w) {
                rc = 1;
                goto done;
            }
            int64_t shape[2] = {E * out, in};
            lt_tensor wt = lt_tensor_view(w, dt, LT_DEVICE_CUDA, 2, shape);
            const size_t wsb = be->grouped_matmul_workspace_bytes(dt, E, out, in, nk, 0);
            void *ws = wsb ? lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "bench grouped workspace") : NULL;
            for (int r = -c.warmup; r < c.repeats; r++) {
                be->synchronize(ctx);
                double t0 = lt_time_now();
                be->grouped_matmul(ctx, prods[pi].nn ? LT_MATMUL_NN : LT_MATMUL_NT, &wt, E, doff, x, nk, 0.0f, y, ws);
                be->synchronize(ctx);
                if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
            }
            const double ms = lt_bench_median(t, c.repeats), tf = flop / (ms * 1e9);
            snprintf(name, sizeof name, "grouped-%s-%s", lt_dtype_name(dt), prods[pi].name);
            cJSON *arm = cJSON_CreateObject();
            cJSON_AddStringToObject(arm, "name", name);
            cJSON_AddNumberToObject(arm, "median_ms", ms);
            cJSON_AddNumberToObject(arm, "tflops", tf);
            cJSON_AddNumberToObject(arm, "tokens_per_s", (double)n / (ms * 1e-3));
            cJSON_AddNumberToObject(arm, "workspace_bytes", (double)wsb);
            if (pms > 0) cJSON_AddNumberToObject(arm, "ratio_to_cublaslt_per_expert", pms / ms);
            cJSON_AddItemToArray(arms, arm);
            fprintf(stderr, "%-40s %9.3f ms %7.1f TFLOP/s  %.2fx the per-expert cuBLASLt time\n", name, ms, tf,
                    pms > 0 ? pms / ms : 0.0);
            if (ws) lt_free(ctx, LT_DEVICE_CUDA, ws, wsb);
            lt_free(ctx, LT_DEVICE_CUDA, w, wbytes);
        }
    }
done:
    if (x) lt_free(ctx, LT_DEVICE_CUDA, x, (size_t)(nk * X) * 4);
    if (y) lt_free(ctx, LT_DEVICE_CUDA, y, (size_t)(nk * X) * 4);
    if (doff) lt_free(ctx, LT_DEVICE_CUDA, doff, (size_t)(E + 1) * 4);
    if (xb) lt_free(ctx, LT_DEVICE_CUDA, xb, (size_t)(nk * X) * 2);
    if (wb) lt_free(ctx, LT_DEVICE_CUDA, wb, (size_t)(E * C * F) * 2);
    if (pws) lt_free(ctx, LT_DEVICE_CUDA, pws, pwsb);
    if (rc) lt_log(LT_LOG_ERROR, "bench grouped failed: %s", lt_ctx_error(ctx));
    free(off), free(t);
    lt_ctx_free(ctx);
    if (rc || !res) {
        cJSON_Delete(res);
        return 1;
    }
    return lt_bench_write(&c, res, "cuda");
#endif
}
