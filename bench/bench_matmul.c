/* `longtune bench matmul`: the backend's weight matmul (lt_backend.matmul: f32 x and y, W in any
 * dtype) at Llama-8B layer shapes, both modes (NT: the forward y = x·Wᵀ; NN: the backward
 * dx = dy·W), against the machine's GEMM ceiling measured in the same run: on CUDA a cuBLASLt bf16
 * GEMM on operands already in bf16 (what the op would run at if x were bf16 and W never needed
 * converting), on the CPU OpenBLAS sgemm. It measures the op as the model calls it, conversions
 * included; it does not measure the model. On the CPU each dequantizing arm runs on every
 * instruction set's dequantizers asked for (--isa; by default the one LONGTUNE_CPU_ISA or the CPU
 * picks), the same weights each time, with its time relative to the f32 product of that shape. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "bench.h"
#include "bench_buffers.h"
#include "core/quant_internal.h"
#include "longtune/alloc.h"
#include "longtune/log.h"

#if LT_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

typedef struct mm_shape {
    int64_t out, in;
} mm_shape;

static int usage(const char *msg, const char *arg) {
    fprintf(stderr, "longtune bench matmul: %s '%s'\nusage: longtune bench matmul [options]\n", msg, arg);
    return 2;
}

/* W (out, in) in dtype dt on dev, from uniform random floats; NULL on failure (ctx says why). */
static void *make_weight(lt_ctx *ctx, const lt_backend *be, lt_dtype dt, int64_t out, int64_t in, uint64_t *s,
                         size_t *bytes) {
    size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    *bytes = rb * (size_t)out;
    uint8_t *h = malloc(*bytes);
    float *row = malloc((size_t)in * sizeof *row);
    void *d = lt_alloc(ctx, be->device, *bytes, "bench matmul weight");
    if (!h || !row || !d) goto fail;
    for (int64_t r = 0; r < out; r++) {
        for (int64_t c = 0; c < in; c++) row[c] = lt_bench_unif(s, 0.05f);
        uint8_t *dst = h + rb * (size_t)r;
        if (dt == LT_DTYPE_F32) memcpy(dst, row, rb);
        else if (dt == LT_DTYPE_BF16)
            for (int64_t c = 0; c < in; c++) ((uint16_t *)dst)[c] = lt_f32_to_bf16(row[c]);
        else if (dt == LT_DTYPE_F16)
            for (int64_t c = 0; c < in; c++) ((uint16_t *)dst)[c] = lt_f32_to_f16(row[c]);
        else if (dt == LT_DTYPE_IQ4_NL || dt == LT_DTYPE_IQ4_XS) /* no quantizer: random levels, scale ~0.05 */
            for (size_t k = 0; k < rb; k++) {
                dst[k] = (uint8_t)lt_bench_rand_u64(s);
                if (k % (size_t)lt_dtype_block_bytes(dt) == 0) {
                    uint16_t sc = lt_f32_to_f16(dt == LT_DTYPE_IQ4_NL ? 0.05f / 127 : 0.05f / (127 * 24));
                    memcpy(dst + k, &sc, 2), k++;
                }
            }
        else lt_quantize_row(dt, row, dst, in);
    }
    if (be->copy_to_device(ctx, d, h, *bytes) != LT_OK) goto fail;
    free(h), free(row);
    return d;
fail:
    free(h), free(row);
    if (d) lt_free(ctx, be->device, d, *bytes);
    return NULL;
}

#if LT_HAVE_CUDA
/* The ceiling: cuBLASLt bf16 × bf16 → f32 (fp32 accumulate) at (m, n, k), median ms of `repeats`
 * calls with 32 MiB of workspace; < 0 when cuBLASLt refuses. Column-major, as the op runs it. */
static double cublaslt_bf16_ms(lt_ctx *ctx, int64_t m, int64_t n, int64_t k, int ta, int repeats) {
    double ms = -1;
    size_t wsb = (size_t)32 << 20;
    size_t ab = (size_t)(m * k) * 2, bb = (size_t)(k * n) * 2, cb = (size_t)(m * n) * 4;
    /* random operands: tensor cores run measurably faster on zeros (less power, higher clocks) */
    uint64_t s = 0x2545f4914f6cdd1dULL ^ (uint64_t)(m * k);
    const lt_backend *be = lt_backend_get(LT_DEVICE_CUDA);
    void *A = lt_bench_rand_buf(ctx, be, m * k, LT_DTYPE_BF16, 1.0f, &s, "ceiling operand"),
         *B = lt_bench_rand_buf(ctx, be, k * n, LT_DTYPE_BF16, 1.0f, &s, "ceiling operand");
    void *C = lt_alloc(ctx, LT_DEVICE_CUDA, cb, "ceiling C"), *W = lt_alloc(ctx, LT_DEVICE_CUDA, wsb, "ceiling ws");
    cublasLtHandle_t h = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t ad = NULL, bd = NULL, cd = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    double *t = malloc(sizeof(double) * (size_t)repeats);
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = CUBLAS_OP_N;
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    if (!A || !B || !C || !W || !t || cublasLtCreate(&h) != CUBLAS_STATUS_SUCCESS) goto done;
    if (cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) goto done;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtMatrixLayoutCreate(&ad, CUDA_R_16BF, (uint64_t)(ta ? k : m), (uint64_t)(ta ? m : k), ta ? k : m);
    cublasLtMatrixLayoutCreate(&bd, CUDA_R_16BF, (uint64_t)k, (uint64_t)n, k);
    cublasLtMatrixLayoutCreate(&cd, CUDA_R_32F, (uint64_t)m, (uint64_t)n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    if (cublasLtMatmulAlgoGetHeuristic(h, op, ad, bd, cd, cd, pref, 1, &res, &nres) != CUBLAS_STATUS_SUCCESS ||
        nres < 1)
        goto done;
    const float one = 1.0f, zero = 0.0f;
    for (int r = -1; r < repeats; r++) {
        cudaDeviceSynchronize();
        double t0 = lt_time_now();
        cublasLtMatmul(h, op, &one, A, ad, B, bd, &zero, C, cd, C, cd, &res.algo, W, wsb, 0);
        cudaDeviceSynchronize();
        if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
    }
    ms = lt_bench_median(t, repeats);
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (cd) cublasLtMatrixLayoutDestroy(cd);
    if (bd) cublasLtMatrixLayoutDestroy(bd);
    if (ad) cublasLtMatrixLayoutDestroy(ad);
    if (op) cublasLtMatmulDescDestroy(op);
    if (h) cublasLtDestroy(h);
    lt_free(ctx, LT_DEVICE_CUDA, A, ab), lt_free(ctx, LT_DEVICE_CUDA, B, bb);
    lt_free(ctx, LT_DEVICE_CUDA, C, cb), lt_free(ctx, LT_DEVICE_CUDA, W, wsb);
    free(t);
    return ms;
}
#endif

/* --shapes: out x in pairs; --dtypes: W dtypes (lt_bench_arg parsers). */
typedef struct shape_list {
    mm_shape *s;
    int *n;
} shape_list;

static const char *parse_shapes(const char *v, void *dst) {
    shape_list *l = dst;
    *l->n = 0;
    for (const char *p = v; *p;) {
        long long o, in;
        int used = 0;
        if (*l->n == 8 || sscanf(p, "%lldx%lld%n", &o, &in, &used) != 2 || o < 1 || in < 1 || o > (1 << 20) ||
            in > (1 << 20))
            return "up to 8 comma-separated OUTxIN pairs, each side 1 to 1048576";
        l->s[(*l->n)++] = (mm_shape){o, in};
        p += used;
        if (*p == ',') p++;
        else if (*p) return "up to 8 comma-separated OUTxIN pairs, each side 1 to 1048576";
    }
    return *l->n ? NULL : "up to 8 comma-separated OUTxIN pairs";
}

typedef struct dtype_list {
    lt_dtype *dt;
    int *n;
} dtype_list;

static const char *parse_dtypes(const char *v, void *dst) {
    dtype_list *l = dst;
    char buf[128];
    if (strlen(v) >= sizeof buf) return "a shorter dtype list";
    snprintf(buf, sizeof buf, "%s", v);
    *l->n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        /* fp8 weights are packed a whole matrix at a time (lt_fp8_pack), not row by row as here */
        if (*l->n == 16 || lt_dtype_parse(tok, &l->dt[*l->n]) != LT_OK || l->dt[*l->n] == LT_DTYPE_I32 ||
            l->dt[*l->n] == LT_DTYPE_FP8)
            return "a comma list of W dtypes (f32, bf16, q4_0, q4_k, iq4_xs, ...)";
        (*l->n)++;
    }
    return *l->n ? NULL : "a comma list of W dtypes";
}

/* One one-thread arm "<what>-<dtype>-<rows>x<in>-<isa>": its median ms and rate (key, printed in
 * unit with fmt), in arms and on stderr. */
static void one_thread_arm(cJSON *arms, const char *what, lt_dtype dt, int64_t rows, int64_t in, lt_cpu_isa isa,
                           double ms, const char *key, double rate, const char *fmt) {
    char name[64];
    snprintf(name, sizeof name, "%s-%s-%lldx%lld-%s", what, lt_dtype_name(dt), (long long)rows, (long long)in,
             lt_cpu_isa_name(isa));
    cJSON *arm = cJSON_CreateObject();
    cJSON_AddStringToObject(arm, "name", name);
    cJSON_AddStringToObject(arm, "isa", lt_cpu_isa_name(isa));
    cJSON_AddNumberToObject(arm, "median_ms", ms);
    cJSON_AddNumberToObject(arm, key, rate);
    cJSON_AddItemToArray(arms, arm);
    fprintf(stderr, "%-34s %9.3f ms ", name, ms);
    fprintf(stderr, fmt, rate);
    fputs(" (one thread)\n", stderr);
}

/* The dequantizer alone: every row of w through lt_dequantize_row on one thread into a tile of
 * 64 rows (as the matmul's workspace holds them), per instruction set. Arms "dequant-<dtype>-
 * <out>x<in>-<isa>" with the median ms and weights per ns. Non-zero on allocation failure. */
static int dequant_arms(lt_ctx *ctx, const lt_bench_common *c, const lt_tensor *w, const lt_cpu_isa *isas, int nisas,
                        double *t, cJSON *arms) {
    const int64_t out = w->shape[0], in = w->shape[1];
    const size_t rb = (size_t)lt_dtype_row_bytes(w->dtype, in);
    float *tile = malloc((size_t)(64 * in) * sizeof *tile);
    if (!tile) return lt_error(ctx, LT_ERR_OOM, "bench matmul: dequant tile"), 1;
    for (int k = 0; k < nisas; k++) {
        if (lt_cpu_isa_select(ctx, isas[k]) != LT_OK) break;
        for (int r = -c->warmup; r < c->repeats; r++) {
            double t0 = lt_time_now();
            for (int64_t o = 0; o < out; o++)
                lt_dequantize_row(w->dtype, (const uint8_t *)w->data + rb * (size_t)o, tile + (o % 64) * in, in);
            if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
        }
        const double ms = lt_bench_median(t, c->repeats);
        one_thread_arm(arms, "dequant", w->dtype, out, in, isas[k], ms, "weights_per_ns",
                       (double)(out * in) / (ms * 1e6), "%7.2f weights/ns");
    }
    free(tile);
    return 0;
}

/* The encoder: `rows` rows of `in` uniform random weights through lt_quantize_row on one thread,
 * per instruction set (the K-quant encoders have an AVX2 path). Arms "encode-<dtype>-<rows>x<in>-
 * <isa>" with the median ms and weights per second. Non-zero on allocation failure. */
static int encode_arms(lt_ctx *ctx, const lt_bench_common *c, lt_dtype dt, int64_t rows, int64_t in,
                       const lt_cpu_isa *isas, int nisas, double *t, uint64_t *s, cJSON *arms) {
    const size_t rb = (size_t)lt_dtype_row_bytes(dt, in);
    float *x = malloc((size_t)(rows * in) * sizeof *x);
    uint8_t *q = malloc(rb * (size_t)rows);
    if (!x || !q) {
        free(x), free(q);
        return lt_error(ctx, LT_ERR_OOM, "bench matmul: encode buffers"), 1;
    }
    for (int64_t i = 0; i < rows * in; i++) x[i] = lt_bench_unif(s, 0.05f);
    for (int k = 0; k < nisas; k++) {
        if (lt_cpu_isa_select(ctx, isas[k]) != LT_OK) break;
        for (int r = -c->warmup; r < c->repeats; r++) {
            double t0 = lt_time_now();
            for (int64_t o = 0; o < rows; o++) lt_quantize_row(dt, x + o * in, q + rb * (size_t)o, in);
            if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
        }
        const double ms = lt_bench_median(t, c->repeats);
        one_thread_arm(arms, "encode", dt, rows, in, isas[k], ms, "weights_per_s", (double)(rows * in) / (ms * 1e-3),
                       "%9.3g weights/s");
    }
    free(x), free(q);
    return 0;
}

int lt_bench_matmul(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    int64_t N = 0;
    mm_shape shapes[8] = {{4096, 4096}, {14336, 4096}};
    int nshapes = 2;
    lt_dtype dts[16];
    int ndts = 0; /* 0: the backend's default list */
    const char *isa_arg = NULL;
    int64_t encode_rows = 0;
    int encode_only = 0;
    shape_list sl = {shapes, &nshapes};
    dtype_list dl = {dts, &ndts};
    const lt_bench_arg flags[] = {
        LT_BENCH_I64("--n", &N, 1, 1 << 24),
        LT_BENCH_FN("--shapes", &sl, parse_shapes),
        LT_BENCH_FN("--dtypes", &dl, parse_dtypes),
        LT_BENCH_STR("--isa", &isa_arg),
        LT_BENCH_I64("--encode", &encode_rows, 0, 1 << 20),
        LT_BENCH_SET("--encode-only", &encode_only, 1),
    };
    const int parsed =
        lt_bench_parse_args("matmul", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf(
            "usage: longtune bench matmul [options]\n\n"
            "The backend's weight matmul (f32 x, W of any dtype) at Llama-8B layer shapes, forward\n"
            "(NT) and backward (NN), median ms and TFLOP/s, against the GEMM ceiling measured in\n"
            "the same run (CUDA: cuBLASLt bf16 on bf16 operands; CPU: OpenBLAS sgemm).\n\n"
            "options:\n"
            "  --n N            rows of x (default 8192 on cuda, 64 on cpu)\n"
            "  --shapes LIST    out x in pairs, e.g. 4096x4096,14336x4096 (default)\n"
            "  --dtypes LIST    W dtypes (default: cuda bf16,q4_0; cpu f32,bf16,f16 and every GGUF\n"
            "                   block format)\n"
            "  --isa LIST       cpu: the dequantizers to time each arm on, scalar,avx2,avx512 or all\n"
            "                   (default: the one in use, LONGTUNE_CPU_ISA or the widest the CPU has)\n"
            "  --encode ROWS    cpu: also time lt_quantize_row on ROWS rows of each shape's in, per\n"
            "                   dtype with an encoder and per --isa path (default 0: not timed)\n"
            "  --encode-only    cpu: time the encoders alone (needs --encode), no matmul or gemm arms\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
    const int cuda = !strcmp(c.backend, "cuda");
    if (!cuda && strcmp(c.backend, "cpu")) return usage("unknown backend", c.backend);
    const lt_backend *be = lt_backend_get(cuda ? LT_DEVICE_CUDA : LT_DEVICE_CPU);
    if (!be) {
        fprintf(stderr, "longtune bench matmul: this build has no %s backend\n", c.backend);
        return 1;
    }
#if LT_HAVE_CUDA
    int ndev = 0;
    if (cuda && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)) {
        fprintf(stderr, "longtune bench matmul: no CUDA device\n");
        return 1;
    }
#endif
    if (encode_only && (cuda || !encode_rows)) {
        fprintf(stderr, "longtune bench matmul: --encode-only needs --encode ROWS and the cpu backend\n");
        return 2;
    }
    if (!N) N = cuda ? 8192 : 64;
    if (!ndts) {
        /* the CPU list: the dense ceilings and every format a K_M file holds its projections in */
        static const lt_dtype cpu_list[] = {LT_DTYPE_F32,  LT_DTYPE_BF16,   LT_DTYPE_F16,   LT_DTYPE_Q8_0,
                                            LT_DTYPE_Q4_0, LT_DTYPE_Q4_1,   LT_DTYPE_Q5_0,  LT_DTYPE_Q5_1,
                                            LT_DTYPE_Q2_K, LT_DTYPE_Q3_K,   LT_DTYPE_Q4_K,  LT_DTYPE_Q5_K,
                                            LT_DTYPE_Q6_K, LT_DTYPE_IQ4_NL, LT_DTYPE_IQ4_XS};
        if (cuda) dts[ndts++] = LT_DTYPE_BF16, dts[ndts++] = LT_DTYPE_Q4_0;
        else
            for (size_t k = 0; k < sizeof cpu_list / sizeof cpu_list[0]; k++) dts[ndts++] = cpu_list[k];
    }
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    /* the CPU dequantizers to time: the list asked for, or the one in use */
    lt_cpu_isa isas[LT_CPU_ISA_COUNT_];
    int nisas = 0;
    if (!cuda && isa_arg) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s", isa_arg);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            int found = 0;
            for (int k = 0; k < LT_CPU_ISA_COUNT_; k++) {
                const char *why;
                if (strcmp(tok, "all") && strcmp(tok, lt_cpu_isa_name((lt_cpu_isa)k))) continue;
                found = 1;
                if (!lt_cpu_isa_available((lt_cpu_isa)k, &why)) {
                    if (!strcmp(tok, "all")) continue;
                    fprintf(stderr, "longtune bench matmul: --isa %s: %s\n", tok, why);
                    lt_ctx_free(ctx);
                    return 1;
                }
                int dup = 0; /* each path once, in the order first named */
                for (int q = 0; q < nisas; q++) dup |= isas[q] == (lt_cpu_isa)k;
                if (!dup) isas[nisas++] = (lt_cpu_isa)k;
            }
            if (!found) {
                lt_ctx_free(ctx);
                return usage("unknown --isa (scalar, avx2, avx512, all)", tok);
            }
        }
    } else if (!cuda) {
        if (lt_cpu_isa_from_env(ctx, &isas[0]) != LT_OK) {
            fprintf(stderr, "longtune bench matmul: %s\n", lt_ctx_error(ctx));
            lt_ctx_free(ctx);
            return 1;
        }
        nisas = 1;
    }
    const lt_cpu_isa isa_before = cuda ? LT_CPU_ISA_SCALAR : lt_cpu_isa_active();
    int rc = 1;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    double *t = malloc(sizeof(double) * (size_t)c.repeats);
    cJSON *res = lt_bench_result_new("matmul");
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(cfg, "backend", c.backend);
    cJSON_AddNumberToObject(cfg, "N", (double)N);
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    if (!cuda) {
        cJSON_AddNumberToObject(cfg, "threads", lt_bench_threads(ctx));
        cJSON *il = cJSON_AddArrayToObject(cfg, "isa");
        for (int k = 0; k < nisas; k++) cJSON_AddItemToArray(il, cJSON_CreateString(lt_cpu_isa_name(isas[k])));
        if (encode_rows) cJSON_AddNumberToObject(cfg, "encode_rows", (double)encode_rows);
        if (encode_only) cJSON_AddBoolToObject(cfg, "encode_only", 1);
    }
    cJSON_AddStringToObject(cfg, "measures",
                            "lt_backend.matmul, f32 x and y, conversions included; TFLOP/s = 2·N·out·in / time; "
                            "vs_f32 = time / the f32 arm's time at the same shape and mode");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    double cpu_ceiling = cuda || encode_only ? 0 : lt_bench_sgemm_gflops(1024, 3, lt_ctx_threads(ctx));
    if (!t) goto done;
    if (!cuda && encode_rows)
        for (int si = 0; si < nshapes; si++)
            for (int di = 0; di < ndts; di++)
                if (lt_quantize_has_encoder(dts[di]) && lt_dtype_row_bytes(dts[di], shapes[si].in) >= 0 &&
                    encode_arms(ctx, &c, dts[di], encode_rows, shapes[si].in, isas, nisas, t, &s, arms))
                    goto done;
    for (int si = 0; si < nshapes && !encode_only; si++) {
        const int64_t out = shapes[si].out, in = shapes[si].in;
        const double flop = 2.0 * (double)N * (double)out * (double)in;
        const int64_t xmax = out > in ? out : in;
        void *x = lt_bench_rand_buf(ctx, be, N * xmax, LT_DTYPE_F32, 1.0f, &s, "bench matmul x"),
             *y = lt_bench_rand_buf(ctx, be, N * xmax, LT_DTYPE_F32, 1.0f, &s, "bench matmul y");
        if (!x || !y) {
            if (x) lt_free(ctx, be->device, x, (size_t)(N * xmax) * 4);
            if (y) lt_free(ctx, be->device, y, (size_t)(N * xmax) * 4);
            goto done;
        }
        for (int mode = 0; mode < 2; mode++) {
            double ceil_tflops = cpu_ceiling * 1e-3, f32_ms = 0;
#if LT_HAVE_CUDA
            if (cuda) {
                /* the GEMM each mode runs: NT is (out, N, in) with A transposed, NN is (in, N, out) */
                double cms = mode == 0 ? cublaslt_bf16_ms(ctx, out, N, in, 1, c.repeats)
                                       : cublaslt_bf16_ms(ctx, in, N, out, 0, c.repeats);
                ceil_tflops = cms > 0 ? flop / (cms * 1e-3) * 1e-12 : 0;
                cJSON *arm = cJSON_CreateObject();
                char name[64];
                snprintf(name, sizeof name, "cublaslt-bf16-%s-%lldx%lld", mode ? "nn" : "nt", (long long)out,
                         (long long)in);
                cJSON_AddStringToObject(arm, "name", name);
                cJSON_AddNumberToObject(arm, "median_ms", cms);
                cJSON_AddNumberToObject(arm, "tflops", ceil_tflops);
                cJSON_AddItemToArray(arms, arm);
                fprintf(stderr, "%-34s %9.3f ms %7.1f TFLOP/s\n", name, cms, ceil_tflops);
            }
#endif
            for (int di = 0; di < ndts; di++) {
                const lt_dtype dt = dts[di];
                if (lt_dtype_row_bytes(dt, in) < 0) continue; /* in not a multiple of the block */
                size_t wb = 0;
                void *wd = make_weight(ctx, be, dt, out, in, &s, &wb);
                if (!wd) {
                    if (x) lt_free(ctx, be->device, x, (size_t)(N * xmax) * 4);
                    if (y) lt_free(ctx, be->device, y, (size_t)(N * xmax) * 4);
                    goto done;
                }
                int64_t shape[2] = {out, in};
                lt_tensor w = lt_tensor_view(wd, dt, be->device, 2, shape);
                size_t wsb = be->matmul_workspace_bytes(dt, out, in, N, lt_ctx_threads(ctx));
                void *ws = wsb ? lt_alloc(ctx, be->device, wsb, "bench matmul workspace") : NULL;
                if (wsb && !ws) {
                    lt_free(ctx, be->device, wd, wb);
                    lt_free(ctx, be->device, x, (size_t)(N * xmax) * 4);
                    lt_free(ctx, be->device, y, (size_t)(N * xmax) * 4);
                    goto done;
                }
                /* the f32 product dequantizes nothing: timed once */
                const int runs = cuda || dt == LT_DTYPE_F32 ? 1 : nisas;
                for (int k = 0; k < runs; k++) {
                    const int tag_isa = !cuda && dt != LT_DTYPE_F32;
                    if (tag_isa && lt_cpu_isa_select(ctx, isas[k]) != LT_OK) break;
                    for (int r = -c.warmup; r < c.repeats; r++) {
                        be->synchronize(ctx);
                        double t0 = lt_time_now();
                        be->matmul(ctx, (lt_matmul_mode)mode, &w, x, N, 0.0f, y, ws);
                        be->synchronize(ctx);
                        if (r >= 0) t[r] = (lt_time_now() - t0) * 1e3;
                    }
                    const double ms = lt_bench_median(t, c.repeats), tf = flop / (ms * 1e-3) * 1e-12;
                    if (dt == LT_DTYPE_F32) f32_ms = ms;
                    char name[64];
                    snprintf(name, sizeof name, "%s-%s-%lldx%lld%s%s", lt_dtype_name(dt), mode ? "nn" : "nt",
                             (long long)out, (long long)in, tag_isa ? "-" : "",
                             tag_isa ? lt_cpu_isa_name(isas[k]) : "");
                    cJSON *arm = cJSON_CreateObject();
                    cJSON_AddStringToObject(arm, "name", name);
                    if (tag_isa) cJSON_AddStringToObject(arm, "isa", lt_cpu_isa_name(isas[k]));
                    cJSON_AddNumberToObject(arm, "median_ms", ms);
                    cJSON_AddNumberToObject(arm, "tflops", tf);
                    cJSON_AddNumberToObject(arm, "workspace_bytes", (double)wsb);
                    if (ceil_tflops > 0) cJSON_AddNumberToObject(arm, "fraction_of_ceiling", tf / ceil_tflops);
                    if (f32_ms > 0 && dt != LT_DTYPE_F32) cJSON_AddNumberToObject(arm, "vs_f32", ms / f32_ms);
                    cJSON_AddItemToArray(arms, arm);
                    fprintf(stderr, "%-34s %9.3f ms %7.1f TFLOP/s  %.2f of the ceiling, workspace %.1f MiB", name, ms,
                            tf, ceil_tflops > 0 ? tf / ceil_tflops : 0.0, (double)wsb / (1 << 20));
                    if (f32_ms > 0 && dt != LT_DTYPE_F32) fprintf(stderr, ", %.2fx the f32 time", ms / f32_ms);
                    fputc('\n', stderr);
                }
                if (!cuda && mode == 0 && dt != LT_DTYPE_F32 && dequant_arms(ctx, &c, &w, isas, nisas, t, arms))
                    goto done;
                if (ws) lt_free(ctx, be->device, ws, wsb);
                lt_free(ctx, be->device, wd, wb);
            }
        }
        lt_free(ctx, be->device, x, (size_t)(N * xmax) * 4);
        lt_free(ctx, be->device, y, (size_t)(N * xmax) * 4);
    }
    /* The LoRA products (f32 gemm, rank 8, C = 4096): forward u = x·A (the dy·B shape), grads
     * dA = duᵀ·x and dB = dyᵀ·u (long reductions over N into a small output) and the input grad
     * dx += du·A. They are memory-bound: gbps counts the (N, C) operand (read, or read and written
     * for dx) over the time. */
    if (!encode_only) {
        const int64_t C = 4096, r = 8;
        struct {
            const char *name;
            int ta;
            int64_t M, Nn, K;
        } g[4] = {{"gemm-f32-lora-fwd", 0, N, r, C},
                  {"gemm-f32-lora-dA", 1, r, C, N},
                  {"gemm-f32-lora-dB", 1, C, r, N},
                  {"gemm-f32-lora-dx", 0, N, C, r}};
        void *x = lt_bench_rand_buf(ctx, be, N * C, LT_DTYPE_F32, 1.0f, &s, "bench gemm x"),
             *u = lt_bench_rand_buf(ctx, be, N * C, LT_DTYPE_F32, 1.0f, &s, "bench gemm u");
        void *o = lt_bench_rand_buf(ctx, be, N * C, LT_DTYPE_F32, 1.0f, &s, "bench gemm out");
        if (!x || !u || !o) goto gemm_done;
        for (int k = 0; k < 4; k++) {
            const float *A = x, *B = u;
            int64_t lda = g[k].ta ? g[k].M : g[k].K, ldb = g[k].Nn;
            for (int rr = -c.warmup; rr < c.repeats; rr++) {
                be->synchronize(ctx);
                double t0 = lt_time_now();
                be->gemm(ctx, g[k].ta, 0, g[k].M, g[k].Nn, g[k].K, 1.0f, A, lda, B, ldb, 0.0f, o, g[k].Nn);
                be->synchronize(ctx);
                if (rr >= 0) t[rr] = (lt_time_now() - t0) * 1e3;
            }
            const double ms = lt_bench_median(t, c.repeats);
            const double tf = 2.0 * (double)g[k].M * (double)g[k].Nn * (double)g[k].K / (ms * 1e-3) * 1e-12;
            cJSON *arm = cJSON_CreateObject();
            cJSON_AddStringToObject(arm, "name", g[k].name);
            cJSON_AddNumberToObject(arm, "median_ms", ms);
            cJSON_AddNumberToObject(arm, "tflops", tf);
            const double gbps = (k == 3 ? 2.0 : 1.0) * (double)(N * C) * 4.0 / (ms * 1e-3) * 1e-9;
            cJSON_AddNumberToObject(arm, "gbps", gbps);
            cJSON_AddItemToArray(arms, arm);
            fprintf(stderr, "%-34s %9.3f ms %7.2f TFLOP/s %6.0f GB/s (M=%lld N=%lld K=%lld)\n", g[k].name, ms, tf, gbps,
                    (long long)g[k].M, (long long)g[k].Nn, (long long)g[k].K);
        }
    gemm_done:
        if (x) lt_free(ctx, be->device, x, (size_t)(N * C) * 4);
        if (u) lt_free(ctx, be->device, u, (size_t)(N * C) * 4);
        if (o) lt_free(ctx, be->device, o, (size_t)(N * C) * 4);
    }
    if (!cuda) cJSON_AddNumberToObject(cfg, "sgemm_gflops_ceiling", cpu_ceiling);
    rc = 0;
done:
    if (rc) lt_log(LT_LOG_ERROR, "bench matmul failed: %s", lt_ctx_error(ctx));
    if (!cuda) lt_cpu_isa_select(ctx, isa_before);
    free(t);
    lt_ctx_free(ctx);
    if (!rc) rc = lt_bench_write(&c, res, cuda ? "cuda" : "cpu");
    else cJSON_Delete(res);
    return rc;
}
