/* `longtune bench attention`: the library's attention (naive oracle and flash, CPU) at B=1, H=8,
 * Hkv=2, D=64 over a list of T, plus one packed row of Alpaca-like sequences against one causal
 * sequence of the same length. Reports forward and backward medians, extra peak bytes from the
 * accounting allocator, GFLOP/s in FlashAttention's convention and the ratio to OpenBLAS sgemm
 * measured in the same run. It times library symbols only; no kernel is copied here. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "bench_cuda.h"
#include "bench.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/log.h"

typedef struct {
    int64_t Ts[8];
    int nT;
    int64_t naive_max_T, packed_T;
    int naive_repeats, threads;
    int64_t window, sgemm_n;
    float softcap;
    uint64_t seed;
    lt_dtype dtype;
    int bf16_products; /* also run flash with bf16 products, beside the f32 products */
} opts;

static double unif(uint64_t *s) { return ((double)(lt_bench_rand_u64(s) >> 11) + 0.5) * 0x1.0p-53; }
static double normal(uint64_t *s) { return sqrt(-2 * log(unif(s))) * cos(6.283185307179586 * unif(s)); }

/* Alpaca-like lengths (prompt + response tokens): log-normal with median ~61 and mean ~84 tokens
 * (mu = 4.11, sigma = 0.8), clamped to [4, 1024]; the last sequence takes what is left of T. */
static int64_t pack_offsets(int64_t T, uint64_t seed, int32_t *offs, int64_t cap) {
    uint64_t s = seed;
    int64_t n = 0, x = 0;
    offs[0] = 0;
    while (x < T && n + 1 < cap) {
        int64_t len = (int64_t)lround(exp(4.11 + 0.8 * normal(&s)));
        len = len < 4 ? 4 : len > 1024 ? 1024 : len;
        if (len > T - x || n + 2 == cap) len = T - x;
        x += len;
        offs[++n] = (int32_t)x;
    }
    return n;
}

typedef struct {
    double fwd_ms, bwd_ms;
    size_t peak_fwd, peak_bwd;
    int ok;
} timing;

static void fill(lt_ctx *ctx, void *p, size_t n, lt_dtype dt, uint64_t *s) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        float x = (float)normal(s);
        if (dt == LT_DTYPE_F32) ((float *)p)[i] = x;
        else ((uint16_t *)p)[i] = lt_f32_to_bf16(x);
    }
}

static timing run_arm(lt_ctx *ctx, const lt_attention_params *p, int warmup, int repeats, uint64_t seed) {
    timing t = {0};
    const size_t es = p->dtype == LT_DTYPE_F32 ? 4 : 2;
    const size_t nq = (size_t)(p->B * p->T * p->H * p->D), nk = (size_t)(p->B * p->T * p->Hkv * p->D);
    const size_t nl = (size_t)(p->B * p->H * p->T) * sizeof(float);
    const size_t sizes[8] = {nq * es, nk * es, nk * es, nq * es, nq * es, nq * es, nk * es, nk * es};
    void *buf[8] = {0};
    float *lse = NULL;
    void *ws = NULL;
    size_t ws_bytes = 0;
    double *tf = NULL, *tb = NULL;
    for (int i = 0; i < 8; i++)
        if (!(buf[i] = lt_alloc(ctx, LT_DEVICE_CPU, sizes[i], "bench attention tensor"))) goto fail;
    if (!(lse = lt_alloc(ctx, LT_DEVICE_CPU, nl, "bench attention lse"))) goto fail;
    uint64_t s = seed;
    fill(ctx, buf[0], nq, p->dtype, &s);
    fill(ctx, buf[1], nk, p->dtype, &s);
    fill(ctx, buf[2], nk, p->dtype, &s);
    fill(ctx, buf[4], nq, p->dtype, &s);
    lt_attention_args a = {.q = buf[0],
                           .k = buf[1],
                           .v = buf[2],
                           .out = buf[3],
                           .lse = lse,
                           .dout = buf[4],
                           .dq = buf[5],
                           .dk = buf[6],
                           .dv = buf[7]};
    /* One workspace for every call, as a training step holds it (the planner prices it): the timed
     * region is the kernels, not the pages of a fresh allocation. It counts in the arm's extra peak,
     * beside whatever a call allocates beyond it. */
    const int thr = lt_ctx_threads(ctx);
    const size_t wf = lt_attention_workspace_bytes(p, 0, thr), wb = lt_attention_workspace_bytes(p, 1, thr);
    ws_bytes = wf > wb ? wf : wb;
    if (ws_bytes && !(ws = lt_alloc(ctx, LT_DEVICE_CPU, ws_bytes, "bench attention workspace"))) goto fail;
    a.workspace = ws;
    a.workspace_size = ws_bytes;
    tf = malloc(sizeof(double) * (size_t)repeats);
    tb = malloc(sizeof(double) * (size_t)repeats);
    if (!tf || !tb) goto fail;
    for (int r = -warmup; r < repeats; r++) {
        size_t used = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
        lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
        double t0 = lt_time_now();
        if (lt_attention_forward(ctx, p, &a) != LT_OK) goto fail;
        double t1 = lt_time_now();
        size_t pf = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes - used;
        lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
        double t2 = lt_time_now();
        if (lt_attention_backward(ctx, p, &a) != LT_OK) goto fail;
        double t3 = lt_time_now();
        size_t pb = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes - used;
        t.peak_fwd = ws_bytes + pf > t.peak_fwd ? ws_bytes + pf : t.peak_fwd;
        t.peak_bwd = ws_bytes + pb > t.peak_bwd ? ws_bytes + pb : t.peak_bwd;
        if (r >= 0) {
            tf[r] = (t1 - t0) * 1e3;
            tb[r] = (t3 - t2) * 1e3;
        }
    }
    t.fwd_ms = lt_bench_median(tf, repeats);
    t.bwd_ms = lt_bench_median(tb, repeats);
    t.ok = 1;
fail:
    if (!t.ok) lt_log(LT_LOG_ERROR, "attention arm failed: %s", lt_ctx_error(ctx));
    free(tf);
    free(tb);
    for (int i = 0; i < 8; i++) lt_free(ctx, LT_DEVICE_CPU, buf[i], sizes[i]);
    lt_free(ctx, LT_DEVICE_CPU, lse, nl);
    lt_free(ctx, LT_DEVICE_CPU, ws, ws_bytes);
    return t;
}

/* The sgemm ceiling right before an arm: on a shared machine the load moves between arms, so each
 * arm's ratio is taken against a rate measured next to it. */
static double sgemm_now(const opts *o) { return lt_bench_sgemm_gflops((int)o->sgemm_n, 2, o->threads); }

/* Adds one arm; `pairs` is the number of (query, key) pairs attended, sum of len^2 / 2 in
 * FlashAttention's causal convention (fwd FLOPs = 4 * H * D * pairs, bwd = 2.5 x fwd). */
static cJSON *add_arm(cJSON *arms, const char *name, const lt_attention_params *p, const timing *t, double pairs,
                      double sgemm) {
    const double fwd_flop = 4.0 * (double)(p->B * p->H * p->D) * pairs, bwd_flop = 2.5 * fwd_flop;
    const double fwd_g = fwd_flop / (t->fwd_ms * 1e6), bwd_g = bwd_flop / (t->bwd_ms * 1e6);
    const double all_g = (fwd_flop + bwd_flop) / ((t->fwd_ms + t->bwd_ms) * 1e6);
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "name", name);
    cJSON_AddStringToObject(a, "impl", p->impl == LT_ATTENTION_NAIVE ? "naive" : "flash");
    cJSON_AddBoolToObject(a, "bf16_products", p->bf16_products);
    cJSON_AddNumberToObject(a, "T", (double)p->T);
    cJSON_AddNumberToObject(a, "median_ms", t->fwd_ms + t->bwd_ms);
    cJSON_AddNumberToObject(a, "fwd_ms", t->fwd_ms);
    cJSON_AddNumberToObject(a, "bwd_ms", t->bwd_ms);
    cJSON_AddNumberToObject(a, "tokens_per_s", (double)(p->B * p->T) / ((t->fwd_ms + t->bwd_ms) * 1e-3));
    size_t peak = t->peak_fwd > t->peak_bwd ? t->peak_fwd : t->peak_bwd;
    cJSON_AddNumberToObject(a, "peak_bytes", (double)peak);
    cJSON_AddNumberToObject(a, "peak_bytes_fwd", (double)t->peak_fwd);
    cJSON_AddNumberToObject(a, "peak_bytes_bwd", (double)t->peak_bwd);
    cJSON_AddNumberToObject(a, "fwd_gflops", fwd_g);
    cJSON_AddNumberToObject(a, "bwd_gflops", bwd_g);
    cJSON_AddNumberToObject(a, "fwdbwd_gflops", all_g);
    cJSON_AddNumberToObject(a, "sgemm_gflops", sgemm);
    cJSON_AddNumberToObject(a, "ratio_to_sgemm", all_g / sgemm);
    cJSON_AddItemToArray(arms, a);
    fprintf(stderr, "%-22s fwd %9.2f ms  bwd %9.2f ms  %7.1f GFLOP/s (%.0f%% of sgemm)  extra peak %.1f MiB\n", name,
            t->fwd_ms, t->bwd_ms, all_g, 100 * all_g / sgemm, (double)peak / (1 << 20));
    return a;
}

/* (query, key) pairs of one sequence of length n: n^2/2 by FlashAttention's causal convention, or
 * the exact count sum_i min(i+1, window) when a window cuts the band. */
static double seq_pairs(double n, int64_t window) {
    const double w = (double)window;
    if (window <= 0 || w >= n) return n * n / 2;
    return w * (w + 1) / 2 + (n - w) * w;
}

/* --dtype: f32 or bf16. */
static const char *parse_dtype(const char *v, void *dst) {
    lt_dtype *dt = dst;
    if (lt_dtype_parse(v, dt) != LT_OK || (*dt != LT_DTYPE_F32 && *dt != LT_DTYPE_BF16)) return "f32 or bf16";
    return NULL;
}

/* --kernel-fwd / --kernel-bwd / --kernel-dq (CUDA): kept as given; the CUDA arm checks the name. */
static const char *parse_name(const char *v, void *dst) {
    *(const char **)dst = v;
    return NULL;
}

/* --bwd-bn (CUDA): 0 (the heuristic's) or 128. */
static const char *parse_bwd_bn(const char *v, void *dst) {
    if (strcmp(v, "0") && strcmp(v, "128")) return "0 or 128";
    *(int *)dst = atoi(v);
    return NULL;
}

int lt_bench_attention(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    opts o = {.Ts = {512, 2048, 8192},
              .nT = 3,
              .naive_max_T = 8192,
              .packed_T = 4096,
              .naive_repeats = 1,
              .sgemm_n = 2048,
              .seed = 1234,
              .dtype = LT_DTYPE_F32};
    int t_given = 0, packed_given = 0, peers = 1; /* the CUDA arm has its own defaults */
    lt_bench_attn_force force = {.fwd = "default", .bwd = "default", .dq = "default"};
    double softcap = 0;
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--no-peers", &peers, 0),
        {.name = "--T",
         .kind = LT_BENCH_ARG_LIST,
         .dst = o.Ts,
         .count = &o.nT,
         .max = 8,
         .lo = 1,
         .hi = 1 << 20,
         .seen = &t_given},
        LT_BENCH_I64("--naive-max-T", &o.naive_max_T, 0, 1 << 20),
        LT_BENCH_INT("--naive-repeats", &o.naive_repeats, 1, 1000),
        {.name = "--packed-T",
         .kind = LT_BENCH_ARG_I64,
         .dst = &o.packed_T,
         .lo = 0,
         .hi = 1 << 20,
         .seen = &packed_given},
        LT_BENCH_INT("--threads", &o.threads, 0, 4096),
        LT_BENCH_U64("--seed", &o.seed, 0, INT64_MAX),
        LT_BENCH_I64("--sgemm-n", &o.sgemm_n, 16, 8192),
        LT_BENCH_I64("--window", &o.window, 0, INT32_MAX),
        LT_BENCH_F64("--softcap", &softcap, 0, 1000000),
        LT_BENCH_FN("--dtype", &o.dtype, parse_dtype),
        LT_BENCH_SET("--bf16-products", &o.bf16_products, 1),
        LT_BENCH_FN("--kernel-fwd", &force.fwd, parse_name),
        LT_BENCH_FN("--kernel-bwd", &force.bwd, parse_name),
        LT_BENCH_FN("--kernel-dq", &force.dq, parse_name),
        LT_BENCH_FN("--bwd-bn", &force.bwd_bn, parse_bwd_bn),
        LT_BENCH_INT("--split", &force.split, 0, 64),
    };
    const int parsed =
        lt_bench_parse_args("attention", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf(
            "usage: longtune bench attention [options]\n\nNaive and flash attention (CPU) at B=1, H=8, Hkv=2, D=64, causal, and a packed row of\n"
            "Alpaca-like sequences (log-normal lengths, mean ~84 tokens) against one causal sequence.\n\n"
            "options:\n"
            "  --T LIST         comma-separated sequence lengths (default 512,2048,8192)\n"
            "  --naive-max-T N  skip the naive arm above this T (default 8192)\n"
            "  --naive-repeats N timed repetitions of the naive arm, no warmup (default 1)\n"
            "  --packed-T N     length of the packed row (default 4096; 0 skips it)\n"
            "  --threads N      threads (default: OpenMP's)\n"
            "  --seed N         seed of the packed lengths and the inputs (default 1234)\n"
            "  --dtype D        f32 | bf16 (default f32)\n"
            "  --bf16-products  also run flash with its tiles multiplied on bf16-rounded operands (AMX\n"
            "                   where the CPU has it), beside the f32 products, and report the ratio\n"
            "  --window W       sliding window (default 0 = none)\n"
            "  --softcap C      logit softcap (default 0 = off)\n"
            "  --sgemm-n N      size of the sgemm ceiling measured before each arm (default 2048)\n"
            "  --no-peers       (cuda) skip the PyTorch SDPA peers of bench/peers/attention_sdpa.py\n"
            "  --kernel-fwd K   (cuda) force a forward kernel: default (the heuristic), mma, wg, wg1, ws, ws3\n"
            "  --kernel-bwd K   (cuda) force a backward kernel: default, mma (mma.sync), wg (wgmma, never\n"
            "                   the warp-specialised one); what a head dim lacks falls back as the\n"
            "                   heuristic would (src/backend/cuda/attention/README.md)\n"
            "  --kernel-dq Q    (cuda) force the wgmma backward's dQ: default, atomic (fp32 atomics in\n"
            "                   the main kernel), sep (its own kernel)\n"
            "  --bwd-bn N       (cuda) 128: 128 keys per main-kernel CTA even with the dQ kernel (0: the\n"
            "                   heuristic's)\n"
            "  --split N        (cuda) CTAs sharing a kv head's query heads, a divisor of H / Hkv (0: the\n"
            "                   heuristic's)\n"
            "With --backend cuda: bf16, B=1, H=32, Hkv=8, D=128 at T = 2048,8192,32768 (--T replaces\n"
            "this list), D=64 H=Hkv=32, D=96 H=32 Hkv=8 and D=256 H=16 Hkv=8 at T=8192, D=64 H=9 Hkv=3\n"
            "(SmolLM2-135M) at T=32768, and a packed row of T=8192; PyTorch SDPA (FlashAttention-2,\n"
            "cuDNN) run alongside.\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
    o.softcap = (float)softcap;
    if (!strcmp(c.backend, "cuda") && o.bf16_products) {
        fprintf(stderr,
                "longtune bench attention: --bf16-products is a CPU option (the CUDA kernels multiply bf16 "
                "operands already)\n");
        return 2;
    }
    if (!strcmp(c.backend, "cuda")) {
        static const int64_t cuda_Ts[3] = {2048, 8192, 32768};
        const int64_t T = packed_given ? o.packed_T : 8192;
        int32_t *offs = T > 0 ? malloc(sizeof(int32_t) * (size_t)(T + 2)) : NULL;
        const int64_t S = offs ? pack_offsets(T, o.seed, offs, T + 2) : 0;
        int rc = lt_bench_attention_cuda(&c, t_given ? o.Ts : cuda_Ts, t_given ? o.nT : 3, T, offs, S, peers, &force);
        free(offs);
        return rc;
    }
    if (strcmp(c.backend, "cpu")) {
        fprintf(stderr, "longtune bench attention: backend '%s' has no attention in this build\n", c.backend);
        return 1;
    }
    if (strcmp(force.fwd, "default") || strcmp(force.bwd, "default") || strcmp(force.dq, "default") || force.bwd_bn ||
        force.split) {
        fprintf(stderr,
                "longtune bench attention: --kernel-fwd, --kernel-bwd, --kernel-dq, --bwd-bn and --split need "
                "--backend cuda\n");
        return 2;
    }
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    lt_ctx_set_threads(ctx, o.threads);
    const double sgemm = lt_bench_sgemm_gflops((int)o.sgemm_n, 3, o.threads);
    fprintf(stderr, "OpenBLAS (%s) sgemm n=%lld: %.1f GFLOP/s\n", openblas_get_corename(), (long long)o.sgemm_n, sgemm);

    cJSON *r = lt_bench_result_new("attention");
    cJSON *cfg = cJSON_AddObjectToObject(r, "config");
    cJSON_AddNumberToObject(cfg, "B", 1);
    cJSON_AddNumberToObject(cfg, "H", 8);
    cJSON_AddNumberToObject(cfg, "Hkv", 2);
    cJSON_AddNumberToObject(cfg, "D", 64);
    cJSON_AddStringToObject(cfg, "dtype", lt_dtype_name(o.dtype));
    cJSON_AddStringToObject(cfg, "mask", "causal");
    cJSON_AddNumberToObject(cfg, "window", (double)o.window);
    cJSON_AddNumberToObject(cfg, "softcap", o.softcap);
    cJSON_AddBoolToObject(cfg, "bf16_products", o.bf16_products);
    cJSON_AddNumberToObject(cfg, "threads", o.threads);
    cJSON_AddNumberToObject(cfg, "repeats", c.repeats);
    cJSON_AddNumberToObject(cfg, "naive_repeats", o.naive_repeats);
    cJSON_AddNumberToObject(cfg, "sgemm_n", (double)o.sgemm_n);
    cJSON_AddNumberToObject(cfg, "sgemm_gflops", sgemm);
    double load[1] = {0};
    if (getloadavg(load, 1) == 1) cJSON_AddNumberToObject(cfg, "loadavg_1min_at_start", load[0]);
    /* OpenBLAS picks its kernels from the CPU it detects (OPENBLAS_CORETYPE overrides); on a VM that
     * hides the model it may fall back to an SSE3 kernel, which lowers sgemm and attention alike. */
    cJSON_AddStringToObject(cfg, "openblas_core", openblas_get_corename());
    cJSON_AddStringToObject(
        cfg, "flop_convention",
        "fwd 4*B*H*D*pairs, pairs = T^2/2 causal (sum len^2/2 packed; exact band count with a window); bwd 2.5 x fwd");
    cJSON *arms = cJSON_AddArrayToObject(r, "arms");
    cJSON *targets = cJSON_AddObjectToObject(r, "targets");

    int rc = 0;
    double flash_peak[8] = {0}, naive_peak[8] = {0}, flash_ratio[8] = {0};
    for (int ti = 0; ti < o.nT; ti++) {
        const int64_t T = o.Ts[ti];
        lt_attention_params p =
            {.B = 1, .T = T, .H = 8, .Hkv = 2, .D = 64, .dtype = o.dtype, .window = o.window, .softcap = o.softcap};
        char name[64];
        double flash_ms = 0;
        /* arm 0: flash, 1: naive, 2: flash with bf16 products */
        for (int arm = 0; arm < 2 + o.bf16_products; arm++) {
            const int naive = arm == 1;
            if (naive && T > o.naive_max_T) continue;
            p.impl = naive ? LT_ATTENTION_NAIVE : LT_ATTENTION_FLASH;
            p.bf16_products = arm == 2;
            const double sg = sgemm_now(&o);
            timing t =
                run_arm(ctx, &p, naive ? 0 : c.warmup, naive ? o.naive_repeats : c.repeats, o.seed + (uint64_t)T);
            if (!t.ok) {
                rc = 1;
                continue;
            }
            snprintf(name, sizeof name, "%s-T%lld",
                     naive     ? "naive"
                         : arm ? "flash-bf16-products"
                               : "flash",
                     (long long)T);
            cJSON *a = add_arm(arms, name, &p, &t, seq_pairs((double)T, o.window), sg);
            double peak = cJSON_GetNumberValue(cJSON_GetObjectItem(a, "peak_bytes"));
            if (naive) naive_peak[ti] = peak;
            else if (arm == 0) {
                flash_peak[ti] = peak;
                flash_ratio[ti] = cJSON_GetNumberValue(cJSON_GetObjectItem(a, "ratio_to_sgemm"));
                flash_ms = t.fwd_ms + t.bwd_ms;
            } else if (flash_ms > 0) {
                const double x = flash_ms / (t.fwd_ms + t.bwd_ms);
                cJSON_AddNumberToObject(a, "speedup_over_f32_products", x);
                fprintf(stderr, "T=%lld: bf16 products %.2fx the f32 products' speed\n", (long long)T, x);
            }
        }
    }
    /* Targets: flash memory per doubling of T, flash vs naive memory at the largest T both ran,
     * flash fwd+bwd rate at T=2048. */
    cJSON *growth = cJSON_AddArrayToObject(targets, "flash_peak_growth_per_doubling");
    for (int ti = 1; ti < o.nT; ti++) {
        if (flash_peak[ti] == 0.0 || flash_peak[ti - 1] == 0.0 || o.Ts[ti] <= o.Ts[ti - 1]) continue;
        double doublings = log2((double)o.Ts[ti] / (double)o.Ts[ti - 1]);
        cJSON_AddItemToArray(growth, cJSON_CreateNumber(pow(flash_peak[ti] / flash_peak[ti - 1], 1 / doublings)));
    }
    for (int ti = o.nT - 1; ti >= 0; ti--)
        if (flash_peak[ti] != 0.0 && naive_peak[ti] != 0.0) {
            cJSON_AddNumberToObject(targets, "flash_over_naive_peak_T", (double)o.Ts[ti]);
            cJSON_AddNumberToObject(targets, "flash_over_naive_peak", flash_peak[ti] / naive_peak[ti]);
            break;
        }
    for (int ti = 0; ti < o.nT; ti++)
        if (o.Ts[ti] == 2048 && flash_ratio[ti] > 0)
            cJSON_AddNumberToObject(targets, "flash_fwdbwd_ratio_to_sgemm_T2048", flash_ratio[ti]);

    if (o.packed_T > 0) {
        const int64_t T = o.packed_T, cap = T + 1;
        int32_t *offs = malloc(sizeof(int32_t) * (size_t)(cap + 1));
        if (!offs) {
            cJSON_Delete(r);
            lt_ctx_free(ctx);
            return 1;
        }
        const int64_t S = pack_offsets(T, o.seed, offs, cap + 1);
        double sum2 = 0, pairs = 0;
        for (int64_t s = 0; s < S; s++) {
            const double len = (double)(offs[s + 1] - offs[s]);
            sum2 += len * len;
            pairs += seq_pairs(len, o.window);
        }
        lt_attention_params p =
            {.B = 1, .T = T, .H = 8, .Hkv = 2, .D = 64, .dtype = o.dtype, .window = o.window, .softcap = o.softcap};
        char name[64];
        const double sg_single = sgemm_now(&o);
        timing single = run_arm(ctx, &p, c.warmup, c.repeats, o.seed + 1);
        p.seq_offsets = offs;
        p.S = S;
        const double sg_packed = sgemm_now(&o);
        timing packed = run_arm(ctx, &p, c.warmup, c.repeats, o.seed + 1);
        if (single.ok && packed.ok) {
            p.seq_offsets = NULL;
            snprintf(name, sizeof name, "flash-causal-T%lld", (long long)T);
            add_arm(arms, name, &p, &single, seq_pairs((double)T, o.window), sg_single);
            p.seq_offsets = offs;
            snprintf(name, sizeof name, "flash-packed-T%lld", (long long)T);
            cJSON *a = add_arm(arms, name, &p, &packed, pairs, sg_packed);
            cJSON_AddNumberToObject(a, "sequences", (double)S);
            cJSON_AddNumberToObject(a, "mean_len", (double)T / (double)S);
            cJSON_AddNumberToObject(a, "sum_len2", sum2);
            const double speedup = (single.fwd_ms + single.bwd_ms) / (packed.fwd_ms + packed.bwd_ms);
            cJSON_AddNumberToObject(targets, "packed_speedup_over_causal", speedup);
            cJSON_AddNumberToObject(targets, "packed_ideal_speedup_T2_over_sum_len2", (double)T * (double)T / sum2);
            fprintf(stderr,
                    "packed row: %lld sequences, mean %.1f tokens, %.1fx faster than one causal sequence "
                    "(ideal T^2/sum len^2 = %.1fx)\n",
                    (long long)S, (double)T / (double)S, speedup, (double)T * (double)T / sum2);
        } else {
            rc = 1;
        }
        free(offs);
    }
    lt_ctx_free(ctx);
    if (getloadavg(load, 1) == 1) cJSON_AddNumberToObject(cfg, "loadavg_1min_at_end", load[0]);
    char tag[64];
    snprintf(tag, sizeof tag, "cpu-%s%s", lt_dtype_name(o.dtype), o.bf16_products ? "-bf16-products" : "");
    int wr = lt_bench_write(&c, r, tag);
    return rc ? rc : wr;
}
