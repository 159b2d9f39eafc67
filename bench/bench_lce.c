/* `longtune bench lce`: the linear cross-entropy arms (naive, chunked, fused: lt_lce_forward then
 * lt_lce_backward; fused-fb: one lt_lce_forward_backward call) on one shape — forward and
 * forward+backward median milliseconds (wall and process CPU time), extra peak bytes seen by the
 * accounting allocator (inputs and outputs excluded), the GFLOP/s of the GEMM work each arm
 * executes and its ratio to OpenBLAS sgemm measured in the same run. It does not run PyTorch peers
 * (bench/peers/ does). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "bench.h"
#include "bench_cuda.h"
#include "longtune/alloc.h"
#include "longtune/lce.h"
#include "longtune/log.h"

typedef struct {
    int64_t N, V, C;
    lt_dtype hidden, head;
    int dw;
} lce_case;

/* Uniform in [-a, a): the distribution does not matter for speed, the scale keeps logits sane. */
static void fill_uniform(uint64_t *s, float *x, int64_t n, float a) {
    for (int64_t k = 0; k < n; k++) x[k] = a * ((float)(lt_bench_rand_u64(s) >> 40) * 0x1.0p-23f - 1.0f);
}

/* A (rows, C) matrix in dtype t through the accounting allocator. */
static void *make_matrix(lt_ctx *ctx, uint64_t *s, lt_dtype t, int64_t rows, int64_t C, float a, size_t *bytes) {
    int64_t rb = lt_dtype_row_bytes(t, C);
    *bytes = (size_t)(rows * rb);
    uint8_t *m = lt_alloc(ctx, LT_DEVICE_CPU, *bytes, "bench matrix");
    float *row = malloc((size_t)C * sizeof(float));
    if (!m || !row) {
        free(row);
        if (m) lt_free(ctx, LT_DEVICE_CPU, m, *bytes);
        return NULL;
    }
    for (int64_t r = 0; r < rows; r++) {
        fill_uniform(s, row, C, a);
        if (t == LT_DTYPE_F32) memcpy(m + r * rb, row, (size_t)rb);
        else if (t == LT_DTYPE_BF16)
            for (int64_t c = 0; c < C; c++) ((uint16_t *)(m + r * rb))[c] = lt_f32_to_bf16(row[c]);
        else lt_quantize_row(t, row, m + r * rb, C);
    }
    free(row);
    return m;
}

/* OpenBLAS sgemm (n x n x n) GFLOP per second of process CPU time: on a shared machine the wall
 * rate measures the scheduler, the CPU-time rate the work; the arms are compared with both. */
static double sgemm_cpu_gflops(int n, int repeats) {
    size_t sz = (size_t)n * (size_t)n;
    float *a = malloc(sz * 4), *b = malloc(sz * 4), *cm = malloc(sz * 4);
    double g = 0;
    if (a && b && cm) {
        for (size_t i = 0; i < sz; i++) {
            a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, cm, n);
        clock_t c0 = clock();
        for (int r = 0; r < repeats; r++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, cm, n);
        double sec = (double)(clock() - c0) / CLOCKS_PER_SEC;
        g = sec > 0 ? 2.0 * n * (double)n * n * repeats / sec * 1e-9 : 0;
    }
    free(a);
    free(b);
    free(cm);
    return g;
}

/* --shape: small, large or N,V,C; the tag names the result file. */
typedef struct shape_arg {
    lce_case *k;
    const char *tag;
} shape_arg;

static const char *parse_shape(const char *v, void *dst) {
    shape_arg *s = dst;
    long long n, vv, cc;
    char end;
    if (!strcmp(v, "small")) s->k->N = 2048, s->k->V = 32000, s->k->C = 1024;
    else if (!strcmp(v, "large")) s->k->N = 8192, s->k->V = 151936, s->k->C = 4096;
    else if (sscanf(v, "%lld,%lld,%lld%c", &n, &vv, &cc, &end) == 3 && n > 0 && vv > 0 && cc > 0)
        s->k->N = n, s->k->V = vv, s->k->C = cc;
    else return "small, large or N,V,C (three positive whole numbers)";
    s->tag = v;
    return NULL;
}

static const char *parse_dtype(const char *v, void *dst) {
    return lt_dtype_parse(v, dst) == LT_OK ? NULL : "a dtype (f32, bf16, q8_0, q4_0, q4_1, int4_g64, ...)";
}

/* --arms: a comma list of naive, chunked, fused, fused-fb into a bit mask. */
static const char *parse_arms(const char *v, void *dst) {
    int *mask = dst;
    *mask = 0;
    for (const char *t = v; *t;) {
        const char *e = strchr(t, ',');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        int bit = n == 5 && !strncmp(t, "naive", n) ? 1
            : n == 7 && !strncmp(t, "chunked", n)   ? 2
            : n == 5 && !strncmp(t, "fused", n)     ? 4
            : n == 8 && !strncmp(t, "fused-fb", n)  ? 8
                                                    : 0;
        if (!bit) return "a comma list of naive, chunked, fused, fused-fb";
        *mask |= bit;
        t += n + (e != NULL);
    }
    return *mask ? NULL : "a comma list of naive, chunked, fused, fused-fb";
}

int lt_bench_lce(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    lce_case k = {2048, 32000, 1024, LT_DTYPE_F32, LT_DTYPE_F32, 0};
    int head_set = 0, arms_mask = 15, tile_n = 0, tile_v = 0, threads = 0, shape_set = 0, peers = 1;
    int hidden_set = 0, arms_set = 0, threads_set = 0;
    const char *tag = "small";
    shape_arg sa = {&k, tag};
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--dw", &k.dw, 1),
        LT_BENCH_SET("--no-peers", &peers, 0),
        {.name = "--shape", .kind = LT_BENCH_ARG_FN, .dst = &sa, .parse = parse_shape, .seen = &shape_set},
        {.name = "--hidden", .kind = LT_BENCH_ARG_FN, .dst = &k.hidden, .parse = parse_dtype, .seen = &hidden_set},
        {.name = "--head", .kind = LT_BENCH_ARG_FN, .dst = &k.head, .parse = parse_dtype, .seen = &head_set},
        {.name = "--arms", .kind = LT_BENCH_ARG_FN, .dst = &arms_mask, .parse = parse_arms, .seen = &arms_set},
        LT_BENCH_INT("--tile-n", &tile_n, 0, 1 << 20),
        LT_BENCH_INT("--tile-v", &tile_v, 0, 1 << 20),
        {.name = "--threads", .kind = LT_BENCH_ARG_INT, .dst = &threads, .lo = 0, .hi = 4096, .seen = &threads_set},
    };
    const int parsed =
        lt_bench_parse_args("lce", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench lce [options]\n\n"
               "Linear cross-entropy arms naive, chunked, fused, fused-fb: forward and forward+backward (grad\n"
               "hidden, plus grad W with --dw) median ms, extra peak bytes, GFLOP/s vs OpenBLAS sgemm.\n\n"
               "options:\n"
               "  --shape S        small (N=2048 V=32000 C=1024, default), large (N=8192 V=151936\n"
               "                   C=4096: the naive arm needs ~5 GB), or N,V,C\n"
               "  --hidden T       f32 (default) | bf16\n"
               "  --head T         f32 | bf16 | q8_0 | q4_0 | q4_1 | int4_g64 (default: as --hidden)\n"
               "  --arms LIST      comma list of naive,chunked,fused,fused-fb (default all; fused-fb is\n"
               "                   lt_lce_forward_backward: loss and grads in one call)\n"
               "  --dw             also accumulate grad W in the backward (dense heads)\n"
               "  --tile-n N, --tile-v N   fused/chunked tiles (default: the library's)\n"
               "  --threads N      worker threads (default: OpenMP's)\n"
               "  --no-peers       (cuda) skip the PyTorch peers of bench/peers/lce_torch.py\n"
               "With --backend cuda: bf16 h and head, forward + grad of h, default shape large, with\n"
               "PyTorch naive bf16 / fp32-upcast and the bf16 GEMM rate measured alongside; its arms are\n"
               "chunked (lt_lce_forward then lt_lce_backward) and fused-fb (the one call with bf16 logit\n"
               "tiles, with fp32 ones, and replayed from a CUDA graph); --hidden, --head, --dw and\n"
               "--threads are the CPU arms' options.\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
    tag = sa.tag;
    if (!strcmp(c.backend, "cuda")) { /* its own arms: bench/bench_lce_cuda.c */
        if (hidden_set || head_set || k.dw || threads_set) {
            fprintf(stderr,
                    "longtune bench lce: --hidden, --head, --dw and --threads are CPU options; --backend cuda "
                    "runs bf16 h and head, forward + grad of h (see --help)\n");
            return 2;
        }
        if (arms_set && (arms_mask & 5)) {
            fprintf(stderr, "longtune bench lce: --backend cuda has the arms chunked and fused-fb, not %s\n",
                    arms_mask & 1 ? "naive" : "fused");
            return 2;
        }
        return shape_set ? lt_bench_lce_cuda(&c, k.N, k.V, k.C, peers, tile_n, tile_v, arms_mask)
                         : lt_bench_lce_cuda(&c, 8192, 151936, 4096, peers, tile_n, tile_v, arms_mask);
    }
    if (!head_set) k.head = k.hidden;
    if (strchr(tag, ',')) tag = "custom";

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    if (threads > 0) lt_ctx_set_threads(ctx, threads);
    double sgemm = lt_bench_sgemm_gflops(2048, 3, threads), sgemm_cpu = sgemm_cpu_gflops(2048, 3);
    fprintf(
        stderr,
        "lce N=%lld V=%lld C=%lld hidden %s head %s%s; OpenBLAS sgemm (n=2048) %.1f GFLOP/s wall, %.1f per CPU-second\n",
        (long long)k.N, (long long)k.V, (long long)k.C, lt_dtype_name(k.hidden), lt_dtype_name(k.head),
        k.dw ? " +dw" : "", sgemm, sgemm_cpu);

    uint64_t seed = 0x5eedULL;
    size_t hb, wb, dhb = (size_t)(k.N * k.C) * (k.hidden == LT_DTYPE_F32 ? 4 : 2), dwb = (size_t)(k.V * k.C) * 4;
    void *h = make_matrix(ctx, &seed, k.hidden, k.N, k.C, 1.0f, &hb);
    void *w = make_matrix(ctx, &seed, k.head, k.V, k.C, (float)(4.0 / sqrt((double)k.C)), &wb);
    int32_t *targets = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)k.N * 4, "bench targets");
    float *lse = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)k.N * 4, "bench lse");
    float *lse0 = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)k.N * 4, "bench lse of the first arm");
    void *dh = lt_alloc(ctx, LT_DEVICE_CPU, dhb, "bench dh");
    float *dw = k.dw ? lt_calloc(ctx, LT_DEVICE_CPU, dwb, "bench dw") : NULL;
    if (!h || !w || !targets || !lse || !lse0 || !dh || (k.dw && !dw)) {
        fprintf(stderr, "longtune bench lce: %s\n", lt_ctx_error(ctx));
        return 1;
    }
    for (int64_t i = 0; i < k.N; i++) targets[i] = (int32_t)(lt_bench_rand_u64(&seed) % (uint64_t)k.V);

    int64_t hs[2] = {k.N, k.C}, ws[2] = {k.V, k.C};
    lt_tensor dht = lt_tensor_view(dh, k.hidden, LT_DEVICE_CPU, 2, hs);
    lt_tensor dwt = lt_tensor_view(dw, LT_DTYPE_F32, LT_DEVICE_CPU, 2, ws);
    float loss = 0, loss0 = 0, dloss = 1;
    lt_lce_args args;
    memset(&args, 0, sizeof args);
    args.h = lt_tensor_view(h, k.hidden, LT_DEVICE_CPU, 2, hs);
    args.w = lt_tensor_view(w, k.head, LT_DEVICE_CPU, 2, ws);
    args.targets = targets;
    args.loss = &loss;
    args.lse = lse;
    args.dloss = &dloss;
    args.dh = &dht;
    args.dw = k.dw ? &dwt : NULL;

    cJSON *res = lt_bench_result_new("lce");
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddNumberToObject(cfg, "N", (double)k.N);
    cJSON_AddNumberToObject(cfg, "V", (double)k.V);
    cJSON_AddNumberToObject(cfg, "C", (double)k.C);
    cJSON_AddStringToObject(cfg, "hidden", lt_dtype_name(k.hidden));
    cJSON_AddStringToObject(cfg, "head", lt_dtype_name(k.head));
    cJSON_AddStringToObject(cfg, "backward", k.dw ? "grad hidden + grad W" : "grad hidden");
    cJSON_AddNumberToObject(cfg, "threads", lt_bench_threads(ctx));
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    cJSON_AddNumberToObject(cfg, "warmup", c.warmup);
    cJSON_AddNumberToObject(cfg, "sgemm_gflops", sgemm);
    cJSON_AddNumberToObject(cfg, "sgemm_gflops_per_cpu_second", sgemm_cpu);
    cJSON_AddStringToObject(cfg, "openblas_core", openblas_get_corename());
    cJSON_AddStringToObject(cfg, "openblas_config", openblas_get_config());
    cJSON_AddStringToObject(cfg, "flops",
                            "GEMM work executed: forward 2NVC; backward 4NVC (+2NVC with grad W); "
                            "fused-fb 4NVC (6NVC + 2NVC with grad W: it runs both passes then)");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");

    double flops_f = 2.0 * (double)k.N * (double)k.V * (double)k.C, flops_b = flops_f * (k.dw ? 3.0 : 2.0);
    double naive_fb = 0, naive_peak = 0, fused_fb = 0, fused_peak = 0, naive_cpu = 0, fused_cpu = 0;
    double one_fb = 0, one_peak = 0, one_cpu = 0;
    int first = 1, failed = 0;
    double *tf = malloc(sizeof(double) * (size_t)(c.repeats + 1)),
           *tb = malloc(sizeof(double) * (size_t)(c.repeats + 1));
    double *cb = malloc(sizeof(double) * (size_t)(c.repeats + 1));
    const lt_lce_impl impls[] = {LT_LCE_NAIVE, LT_LCE_CHUNKED, LT_LCE_FUSED, LT_LCE_FUSED};
    static const char *names[] = {"naive", "chunked", "fused", "fused-fb"};
    for (int ai = 0; ai < 4 && !failed; ai++) {
        if (!(arms_mask & (1 << ai))) continue;
        const int one = ai == 3; /* lt_lce_forward_backward */
        lt_lce_options o = {.impl = impls[ai], .tile_n = tile_n, .tile_v = tile_v};
        size_t peak_f = 0, peak_b = 0;
        for (int r = -c.warmup; r < c.repeats; r++) {
            lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
            size_t base = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
            /* process CPU time too: on a shared machine it shows the work done apart from waiting */
            clock_t c0 = clock();
            double t0 = lt_time_now();
            lt_status st = one ? LT_OK : lt_lce_forward(ctx, &o, &args);
            double t1 = lt_time_now();
            size_t pf = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes - base;
            lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
            if (st == LT_OK) st = one ? lt_lce_forward_backward(ctx, &o, &args) : lt_lce_backward(ctx, &o, &args);
            double t2 = lt_time_now();
            clock_t c2 = clock();
            size_t pb = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes - base;
            if (st != LT_OK) {
                fprintf(stderr, "longtune bench lce: %s: %s\n", names[ai], lt_ctx_error(ctx));
                failed = 1;
                break;
            }
            if (r < 0) continue;
            tf[r] = (t1 - t0) * 1e3;
            tb[r] = (t2 - t0) * 1e3;
            cb[r] = (double)(c2 - c0) * 1e3 / CLOCKS_PER_SEC;
            peak_f = pf > peak_f ? pf : peak_f;
            peak_b = pb > peak_b ? pb : peak_b;
        }
        if (failed) break;
        double mf = lt_bench_median(tf, c.repeats), mb = lt_bench_median(tb, c.repeats);
        double mc = lt_bench_median(cb, c.repeats);
        /* agreement with the first arm run: the same loss and lse to fp32 accuracy */
        double dl = 0, dlse = 0;
        if (first) {
            loss0 = loss;
            memcpy(lse0, lse, (size_t)k.N * 4);
        } else {
            dl = fabs((double)loss - loss0) / fmax(fabs((double)loss0), 1e-30);
            for (int64_t i = 0; i < k.N; i++) dlse = fmax(dlse, fabs((double)lse[i] - lse0[i]));
        }
        first = 0;
        size_t peak = peak_f > peak_b ? peak_f : peak_b;
        /* GEMM work executed: fused-fb makes the logits once unless it falls back (dw). */
        double exec = one && !k.dw ? 2 * flops_f : flops_f + flops_b;
        double gf = one ? 0 : flops_f / (mf * 1e-3) * 1e-9, gfb = exec / (mb * 1e-3) * 1e-9;
        cJSON *arm = cJSON_CreateObject();
        cJSON_AddStringToObject(arm, "name", names[ai]);
        cJSON_AddNumberToObject(arm, "median_ms", mb);
        if (!one) cJSON_AddNumberToObject(arm, "fwd_ms", mf);
        cJSON_AddNumberToObject(arm, "fwd_bwd_ms", mb);
        cJSON_AddNumberToObject(arm, "fwd_bwd_cpu_ms", mc);
        cJSON_AddNumberToObject(arm, "tokens_per_s", (double)k.N / (mb * 1e-3));
        cJSON_AddNumberToObject(arm, "peak_bytes", (double)peak);
        cJSON_AddNumberToObject(arm, "fwd_peak_bytes", (double)peak_f);
        cJSON_AddNumberToObject(arm, "bwd_peak_bytes", (double)peak_b);
        if (one) {
            cJSON_AddNumberToObject(arm, "workspace_bytes_fwd_bwd",
                                    (double)lt_lce_workspace_bytes(&o, &args, LT_LCE_PASS_FORWARD_BACKWARD,
                                                                   lt_ctx_threads(ctx)));
        } else {
            cJSON_AddNumberToObject(arm, "workspace_bytes_fwd",
                                    (double)lt_lce_workspace_bytes(&o, &args, 0, lt_ctx_threads(ctx)));
            cJSON_AddNumberToObject(arm, "workspace_bytes_bwd",
                                    (double)lt_lce_workspace_bytes(&o, &args, 1, lt_ctx_threads(ctx)));
            cJSON_AddNumberToObject(arm, "fwd_gflops", gf);
        }
        cJSON_AddNumberToObject(arm, "fwd_bwd_gflops", gfb);
        cJSON_AddNumberToObject(arm, "fwd_bwd_vs_sgemm", gfb / sgemm);
        const double gcpu = exec / (mc * 1e-3) * 1e-9;
        cJSON_AddNumberToObject(arm, "fwd_bwd_gflops_per_cpu_second", gcpu);
        cJSON_AddNumberToObject(arm, "fwd_bwd_vs_sgemm_cpu", sgemm_cpu > 0 ? gcpu / sgemm_cpu : 0);
        cJSON_AddNumberToObject(arm, "loss", loss);
        cJSON_AddNumberToObject(arm, "loss_rel_diff_vs_first_arm", dl);
        cJSON_AddNumberToObject(arm, "lse_max_abs_diff_vs_first_arm", dlse);
        cJSON_AddItemToArray(arms, arm);
        fprintf(
            stderr,
            "  %-8s fwd %9.1f ms  fwd+bwd %9.1f ms (cpu %9.1f ms)  extra peak %8.1f MiB  %6.1f GFLOP/s (%.2fx sgemm; by CPU time %.2fx)  loss %.6f\n",
            names[ai], one ? 0.0 : mf, mb, mc, (double)peak / 1048576.0, gfb, gfb / sgemm,
            sgemm_cpu > 0 ? exec / (mc * 1e-3) * 1e-9 / sgemm_cpu : 0.0, (double)loss);
        if (ai == 0) naive_fb = mb, naive_peak = (double)peak, naive_cpu = mc;
        if (ai == 2) fused_fb = mb, fused_peak = (double)peak, fused_cpu = mc;
        if (ai == 3) one_fb = mb, one_peak = (double)peak, one_cpu = mc;
    }
    free(tf);
    free(tb);
    free(cb);
    if (naive_fb > 0 && fused_fb > 0) {
        cJSON *sum = cJSON_AddObjectToObject(res, "summary");
        cJSON_AddNumberToObject(sum, "fused_speedup_fwd_bwd_vs_naive", naive_fb / fused_fb);
        cJSON_AddNumberToObject(sum, "fused_speedup_fwd_bwd_cpu_time_vs_naive", naive_cpu / fused_cpu);
        cJSON_AddNumberToObject(sum, "fused_extra_memory_fraction_of_naive", fused_peak / naive_peak);
        fprintf(stderr, "fused vs naive (fwd+bwd): %.2fx by wall time, %.2fx by CPU time; %.3f%% of the extra memory\n",
                naive_fb / fused_fb, naive_cpu / fused_cpu, 100.0 * fused_peak / naive_peak);
    }
    if (naive_fb > 0 && one_fb > 0) {
        cJSON *sum = cJSON_GetObjectItem(res, "summary");
        if (!sum) sum = cJSON_AddObjectToObject(res, "summary");
        cJSON_AddNumberToObject(sum, "fused_fb_speedup_vs_naive", naive_fb / one_fb);
        cJSON_AddNumberToObject(sum, "fused_fb_speedup_cpu_time_vs_naive", naive_cpu / one_cpu);
        cJSON_AddNumberToObject(sum, "fused_fb_extra_memory_fraction_of_naive", one_peak / naive_peak);
        fprintf(stderr,
                "fused-fb vs naive (fwd+bwd): %.2fx by wall time, %.2fx by CPU time; %.3f%% of the extra memory\n",
                naive_fb / one_fb, naive_cpu / one_cpu, 100.0 * one_peak / naive_peak);
    }
    lt_free(ctx, LT_DEVICE_CPU, h, hb);
    lt_free(ctx, LT_DEVICE_CPU, w, wb);
    lt_free(ctx, LT_DEVICE_CPU, targets, (size_t)k.N * 4);
    lt_free(ctx, LT_DEVICE_CPU, lse, (size_t)k.N * 4);
    lt_free(ctx, LT_DEVICE_CPU, lse0, (size_t)k.N * 4);
    lt_free(ctx, LT_DEVICE_CPU, dh, dhb);
    if (dw) lt_free(ctx, LT_DEVICE_CPU, dw, dwb);
    lt_ctx_free(ctx);
    if (failed) {
        cJSON_Delete(res);
        return 1;
    }
    char full[96];
    snprintf(full, sizeof full, "%s-%s-%s%s", tag, lt_dtype_name(k.hidden), lt_dtype_name(k.head), k.dw ? "-dw" : "");
    return lt_bench_write(&c, res, full);
}
