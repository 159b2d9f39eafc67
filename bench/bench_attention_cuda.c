/* `longtune bench attention --backend cuda`: the library's CUDA flash attention (bf16, causal) at
 * B=1, H=32, Hkv=8, D=128 over a list of T, D=64 with H=Hkv=32 at T=8192, D=96 (Phi-3's head dim)
 * and Gemma 2/3's D=256 with H=16, Hkv=8 at T=8192, SmolLM2-135M's heads (H=9, Hkv=3, D=64) at
 * T=32768, and one packed row
 * against one causal sequence of the same length; forward and backward medians (device
 * synchronised around each call), TFLOP/s in FlashAttention's convention, extra device bytes from
 * the accounting allocator, and ratios to PyTorch SDPA's FlashAttention-2 and cuDNN backends
 * (bench/peers/attention_sdpa.py) run in the same invocation. It copies no kernel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_cuda.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/log.h"

cJSON *lt_bench_run_peers(const char *script, const char *args) {
    cJSON *out = cJSON_CreateArray();
    const char *dir = getenv("LONGTUNE_SOURCE_DIR");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "python3 %s%s%s %s 2>/dev/null", dir ? dir : "", dir ? "/" : "", script, args);
    FILE *f = popen(cmd, "r");
    if (!f) return out;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        if (j) cJSON_AddItemToArray(out, j);
    }
    pclose(f);
    return out;
}

#if LT_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/attention/tuning.h"

typedef struct {
    double fwd_ms, bwd_ms;
    size_t extra_bytes;
    int ok;
} cuda_timing;

int lt_bench_cuda_fill_uniform_bf16(void *dev, size_t n, size_t period, float amp, uint64_t *s) {
    const size_t m = n < period ? n : period;
    uint16_t *h = malloc((m ? m : 1) * 2);
    if (!h) return 0;
    for (size_t i = 0; i < m; i++) {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        h[i] = lt_f32_to_bf16(amp * (float)((double)(*s >> 11) * 0x1.0p-52 - 1.0));
    }
    int ok = 1;
    for (size_t off = 0; off < n && ok; off += m) {
        const size_t c = n - off < m ? n - off : m;
        ok = cudaMemcpy((uint16_t *)dev + off, h, c * 2, cudaMemcpyHostToDevice) == cudaSuccess;
    }
    free(h);
    return ok;
}

void *lt_bench_cuda_uniform_bf16(lt_ctx *ctx, size_t n, float amp, uint64_t *s, const char *what) {
    void *d = lt_alloc(ctx, LT_DEVICE_CUDA, n * 2, what);
    if (d && !lt_bench_cuda_fill_uniform_bf16(d, n, n, amp, s)) {
        lt_free(ctx, LT_DEVICE_CUDA, d, n * 2);
        return NULL;
    }
    return d;
}

static cuda_timing time_cuda(lt_ctx *ctx, const lt_attention_params *p, int warmup, int repeats, uint64_t seed) {
    cuda_timing t = {0};
    const size_t nq = (size_t)(p->B * p->T * p->H * p->D), nk = (size_t)(p->B * p->T * p->Hkv * p->D);
    const size_t nl = (size_t)(p->B * p->H * p->T) * 4;
    const size_t sizes[8] = {nq * 2, nk * 2, nk * 2, nq * 2, nq * 2, nq * 2, nk * 2, nk * 2};
    void *buf[8] = {0}, *ws = NULL;
    size_t ws_bytes = 0;
    float *lse = NULL;
    double *tf = malloc(sizeof(double) * (size_t)repeats), *tb = malloc(sizeof(double) * (size_t)repeats);
    uint64_t s = seed | 1;
    for (int i = 0; i < 8; i++) {
        const int input = i == 0 || i == 1 || i == 2 || i == 4; /* q, k, v, dout: unit variance */
        buf[i] = input ? lt_bench_cuda_uniform_bf16(ctx, sizes[i] / 2, 1.7320508f, &s, "bench attention tensor")
                       : lt_alloc(ctx, LT_DEVICE_CUDA, sizes[i], "bench attention out");
        if (!buf[i]) goto fail;
    }
    if (!(lse = lt_alloc(ctx, LT_DEVICE_CUDA, nl, "bench attention lse")) || !tf || !tb) goto fail;
    lt_attention_args a = {.q = buf[0],
                           .k = buf[1],
                           .v = buf[2],
                           .out = buf[3],
                           .lse = lse,
                           .dout = buf[4],
                           .dq = buf[5],
                           .dk = buf[6],
                           .dv = buf[7]};
    const size_t used = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes;
    lt_mem_reset_peak(ctx, LT_DEVICE_CUDA);
    /* One workspace for every call, as a training step holds it (the planner prices it): the
     * timed region is the kernels, not cudaMalloc/cudaFree. It still counts in peak_bytes. */
    const size_t wf = lt_attention_workspace_bytes(p, 0, 0), wb = lt_attention_workspace_bytes(p, 1, 0);
    ws_bytes = wf > wb ? wf : wb;
    if (!(ws = lt_alloc(ctx, LT_DEVICE_CUDA, ws_bytes, "bench attention workspace"))) goto fail;
    a.workspace = ws;
    a.workspace_size = ws_bytes;
    for (int r = -warmup; r < repeats; r++) {
        cudaDeviceSynchronize();
        double t0 = lt_time_now();
        if (lt_attention_forward(ctx, p, &a) != LT_OK) goto fail;
        cudaDeviceSynchronize();
        double t1 = lt_time_now();
        if (lt_attention_backward(ctx, p, &a) != LT_OK) goto fail;
        cudaDeviceSynchronize();
        double t2 = lt_time_now();
        if (r >= 0) {
            tf[r] = (t1 - t0) * 1e3;
            tb[r] = (t2 - t1) * 1e3;
        }
    }
    if (cudaGetLastError() != cudaSuccess) goto fail;
    t.extra_bytes = lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes - used;
    t.fwd_ms = lt_bench_median(tf, repeats);
    t.bwd_ms = lt_bench_median(tb, repeats);
    t.ok = 1;
fail:
    if (!t.ok) lt_log(LT_LOG_ERROR, "cuda attention arm failed: %s", lt_ctx_error(ctx));
    free(tf);
    free(tb);
    for (int i = 0; i < 8; i++) lt_free(ctx, LT_DEVICE_CUDA, buf[i], sizes[i]);
    lt_free(ctx, LT_DEVICE_CUDA, lse, nl);
    lt_free(ctx, LT_DEVICE_CUDA, ws, ws_bytes);
    return t;
}

static cJSON *cuda_arm(cJSON *arms, const char *name, const lt_attention_params *p, const cuda_timing *t,
                       double pairs) {
    const double ff = 4.0 * (double)(p->B * p->H * p->D) * pairs, fb = 2.5 * ff;
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "name", name);
    cJSON_AddNumberToObject(a, "T", (double)p->T);
    cJSON_AddNumberToObject(a, "H", (double)p->H);
    cJSON_AddNumberToObject(a, "Hkv", (double)p->Hkv);
    cJSON_AddNumberToObject(a, "D", (double)p->D);
    cJSON_AddNumberToObject(a, "median_ms", t->fwd_ms + t->bwd_ms);
    cJSON_AddNumberToObject(a, "fwd_ms", t->fwd_ms);
    cJSON_AddNumberToObject(a, "bwd_ms", t->bwd_ms);
    cJSON_AddNumberToObject(a, "tokens_per_s", (double)(p->B * p->T) / ((t->fwd_ms + t->bwd_ms) * 1e-3));
    cJSON_AddNumberToObject(a, "peak_bytes", (double)t->extra_bytes);
    cJSON_AddNumberToObject(a, "fwd_tflops", ff / (t->fwd_ms * 1e9));
    cJSON_AddNumberToObject(a, "bwd_tflops", fb / (t->bwd_ms * 1e9));
    const double all = (ff + fb) / ((t->fwd_ms + t->bwd_ms) * 1e9);
    cJSON_AddNumberToObject(a, "fwdbwd_tflops", all);
    cJSON_AddItemToArray(arms, a);
    fprintf(stderr, "%-24s fwd %8.3f ms  bwd %8.3f ms  %6.1f TFLOP/s  workspace %.1f MiB\n", name, t->fwd_ms, t->bwd_ms,
            all, (double)t->extra_bytes / (1 << 20));
    return a;
}

/* Ratios of our fwd+bwd TFLOP/s to each peer line with the same shape. */
static void add_ratios(cJSON *arm, const cJSON *peers) {
    const cJSON *pl;
    cJSON_ArrayForEach(pl, peers) {
        const cJSON *name = cJSON_GetObjectItem(pl, "peer"), *tf = cJSON_GetObjectItem(pl, "fwdbwd_tflops");
        if (!cJSON_IsString(name) || !cJSON_IsNumber(tf)) continue;
        const char *keys[4] = {"T", "H", "Hkv", "D"};
        int same = 1;
        for (int k = 0; k < 4; k++)
            same &= cJSON_GetNumberValue(cJSON_GetObjectItem(pl, keys[k])) ==
                cJSON_GetNumberValue(cJSON_GetObjectItem(arm, keys[k]));
        if (!same) continue;
        char key[96];
        snprintf(key, sizeof key, "ratio_to_%s", name->valuestring);
        double ours = cJSON_GetNumberValue(cJSON_GetObjectItem(arm, "fwdbwd_tflops"));
        cJSON_AddNumberToObject(arm, key, ours / tf->valuedouble);
        snprintf(key, sizeof key, "%s_tflops", name->valuestring);
        cJSON_AddNumberToObject(arm, key, tf->valuedouble);
        fprintf(stderr, "    vs %-12s %6.1f TFLOP/s: %.2fx\n", name->valuestring, tf->valuedouble,
                ours / tf->valuedouble);
    }
}

/* The index of name in names[0..n), or -1 after naming the flag's choices on stderr. */
static int kind_index(const char *flag, const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (!strcmp(name, names[i])) return i;
    fprintf(stderr, "longtune bench attention: %s got '%s'; one of:", flag, name);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", names[i]);
    fprintf(stderr, "\n");
    return -1;
}

int lt_bench_attention_cuda(const lt_bench_common *c, const int64_t *Ts, int nT, int64_t packed_T,
                            const int32_t *packed_offs, int64_t packed_S, int peers, const lt_bench_attn_force *f) {
    static const char *const fwd_names[] = LT_ATTN_FWD_KIND_NAMES, *const bwd_names[] = LT_ATTN_BWD_KIND_NAMES,
                             *const dq_names[] = LT_ATTN_DQ_KIND_NAMES;
    lt_attn_cuda_tuning force_in = {0, 0, 0, 0, 0, 0, 0};
    force_in.fwd = kind_index("--kernel-fwd", f->fwd, fwd_names, LT_ATTN_FWD_KINDS_);
    force_in.bwd = kind_index("--kernel-bwd", f->bwd, bwd_names, (int)(sizeof bwd_names / sizeof bwd_names[0]));
    force_in.dq = kind_index("--kernel-dq", f->dq, dq_names, (int)(sizeof dq_names / sizeof dq_names[0]));
    if (force_in.fwd < 0 || force_in.bwd < 0 || force_in.dq < 0) return 2;
    force_in.bwd_bn = f->bwd_bn;
    force_in.split = f->split;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "longtune bench attention: no CUDA device\n");
        return 1;
    }
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    cJSON *r = lt_bench_result_new("attention");
    cJSON *cfg = cJSON_AddObjectToObject(r, "config");
    cJSON_AddStringToObject(cfg, "backend", "cuda");
    cJSON_AddNumberToObject(cfg, "B", 1);
    cJSON_AddStringToObject(cfg, "dtype", "bf16");
    cJSON_AddStringToObject(cfg, "mask", "causal");
    cJSON_AddNumberToObject(cfg, "repeats", c->repeats);
    /* The forced kernels (src/backend/cuda/attention/tuning.h), for provenance; restored at the end. */
    const lt_attn_cuda_tuning was = lt_attn_cuda_tuning_get();
    lt_attn_cuda_tuning_set(&force_in);
    cJSON_AddStringToObject(cfg, "kernel_fwd", f->fwd);
    cJSON_AddStringToObject(cfg, "kernel_bwd", f->bwd);
    cJSON_AddStringToObject(cfg, "kernel_dq", f->dq);
    cJSON_AddNumberToObject(cfg, "bwd_bn", f->bwd_bn);
    cJSON_AddNumberToObject(cfg, "split", f->split);
    cJSON_AddStringToObject(cfg, "flop_convention",
                            "fwd 4*B*H*D*pairs, pairs = T^2/2 causal (sum len^2/2 packed); bwd 2.5 x fwd");
    cJSON *arms = cJSON_AddArrayToObject(r, "arms");
    cJSON *pl = peers ? lt_bench_run_peers("bench/peers/attention_sdpa.py", "10") : cJSON_CreateArray();
    cJSON_AddItemToObject(r, "peers", pl); /* owned by r from here */
    int rc = 0;
    char name[64];
    /* After the causal list at D = 128 (H = 32, Hkv = 8): D = 64 with H = Hkv = 32 at 8k; D = 96 (Phi-3)
     * with H = 32, Hkv = 8 at 8k; D = 256 with H = 16, Hkv = 8 (Gemma 2 9B, Gemma 3 12B) at 8k;
     * SmolLM2-135M's heads (H = 9, Hkv = 3, D = 64) at 32k, most of that model's long-context training
     * step. Each has its row in the peers' table (bench/peers/attention_sdpa.py). */
    static const struct {
        int64_t T, H, Hkv, D;
    } extra[] = {{8192, 32, 32, 64}, {8192, 32, 8, 96}, {8192, 16, 8, 256}, {32768, 9, 3, 64}};
    const int n_extra = (int)(sizeof extra / sizeof extra[0]);
    for (int i = 0; i < nT + n_extra; i++) {
        const int x = i - nT;
        lt_attention_params p = {.B = 1,
                                 .T = x < 0 ? Ts[i] : extra[x].T,
                                 .H = x < 0 ? 32 : extra[x].H,
                                 .Hkv = x < 0 ? 8 : extra[x].Hkv,
                                 .D = x < 0 ? 128 : extra[x].D,
                                 .dtype = LT_DTYPE_BF16,
                                 .device = LT_DEVICE_CUDA};
        cuda_timing t = time_cuda(ctx, &p, c->warmup, c->repeats, 77 + (uint64_t)i);
        if (!t.ok) {
            rc = 1;
            continue;
        }
        snprintf(name, sizeof name, "cuda-flash-T%lld-D%lld", (long long)p.T, (long long)p.D);
        add_ratios(cuda_arm(arms, name, &p, &t, (double)p.T * (double)p.T / 2), pl);
    }
    if (packed_offs && packed_T > 0) {
        double sum2 = 0;
        for (int64_t s = 0; s < packed_S; s++)
            sum2 += (double)(packed_offs[s + 1] - packed_offs[s]) * (double)(packed_offs[s + 1] - packed_offs[s]);
        lt_attention_params p =
            {.B = 1, .T = packed_T, .H = 32, .Hkv = 8, .D = 128, .dtype = LT_DTYPE_BF16, .device = LT_DEVICE_CUDA};
        cuda_timing single = time_cuda(ctx, &p, c->warmup, c->repeats, 5);
        p.seq_offsets = packed_offs;
        p.S = packed_S;
        cuda_timing packed = time_cuda(ctx, &p, c->warmup, c->repeats, 5);
        if (single.ok && packed.ok) {
            snprintf(name, sizeof name, "cuda-packed-T%lld", (long long)packed_T);
            cJSON *a = cuda_arm(arms, name, &p, &packed, sum2 / 2);
            cJSON_AddNumberToObject(a, "sequences", (double)packed_S);
            const double speedup = (single.fwd_ms + single.bwd_ms) / (packed.fwd_ms + packed.bwd_ms);
            cJSON_AddNumberToObject(a, "speedup_over_one_causal_sequence", speedup);
            cJSON_AddNumberToObject(a, "causal_same_T_ms", single.fwd_ms + single.bwd_ms);
            fprintf(stderr, "packed row: %lld sequences, %.1fx faster than one causal sequence of %lld tokens\n",
                    (long long)packed_S, speedup, (long long)packed_T);
        } else {
            rc = 1;
        }
    }
    lt_ctx_free(ctx);
    int wr = lt_bench_write(c, r, "cuda-bf16");
    lt_attn_cuda_tuning_set(&was);
    return rc ? rc : wr;
}

#else
int lt_bench_attention_cuda(const lt_bench_common *c, const int64_t *Ts, int nT, int64_t packed_T,
                            const int32_t *packed_offs, int64_t packed_S, int peers, const lt_bench_attn_force *f) {
    (void)f;
    (void)c;
    (void)Ts;
    (void)nT;
    (void)packed_T;
    (void)packed_offs;
    (void)packed_S;
    (void)peers;
    fprintf(stderr, "longtune bench attention: this build has no CUDA backend\n");
    return 1;
}
#endif
