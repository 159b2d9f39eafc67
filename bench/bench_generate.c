/* `longtune bench generate`: longtune's KV-cache prefill (pp: a prompt of --pp tokens into an empty
 * cache) and decode (tg: --tg single-token steps from an empty cache, logits to the host each
 * step), on the CPU or (--backend cuda) one CUDA device, against llama.cpp's llama-bench on the
 * same GGUF with the same threads (its pp and tg tests; CPU only), in the same invocation and
 * interleaved round by round, so both see the same machine load. Setup is reported apart from the
 * rates: the model load, the cache allocation and the first prefill (which also pays the
 * backend's one-time start: kernels, handles, workspaces); then --warmup untimed rounds, then
 * --repeats timed rounds of one prefill and one decode each. Reports tokens/s (median over rounds,
 * with every round's figure) and the ratios longtune / llama.cpp. llama-bench comes from
 * --llama-bench, $LLAMA_BENCH, or /work/cache/llama-build/bin/llama-bench; without it only
 * longtune's arms are measured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench.h"
#include "longtune/alloc.h"
#include "longtune/kv_cache.h"
#include "longtune/log.h"
#include "longtune/model.h"

#define MAX_ROUNDS 64

typedef struct gen_bench {
    lt_ctx *ctx;
    lt_model *m;
    lt_kv_cache *c;
    int32_t *prompt;
    float *logits;
    int64_t pp, tg;
} gen_bench;

static int run_pp(gen_bench *g, double *s) {
    if (lt_kv_cache_truncate(g->ctx, g->c, 0, 0) != LT_OK) return -1;
    int64_t row = 0;
    const int32_t *t = g->prompt;
    double t0 = lt_time_now();
    if (lt_kv_cache_extend(g->ctx, g->c, 1, &row, &t, &g->pp, g->logits) != LT_OK) return -1;
    *s = lt_time_now() - t0;
    return 0;
}

static int run_tg(gen_bench *g, double *s) {
    if (lt_kv_cache_truncate(g->ctx, g->c, 0, 0) != LT_OK) return -1;
    int64_t row = 0, one = 1;
    double t0 = lt_time_now();
    for (int64_t i = 0; i < g->tg; i++) {
        const int32_t *t = g->prompt + i;
        if (lt_kv_cache_extend(g->ctx, g->c, 1, &row, &t, &one, g->logits) != LT_OK) return -1;
    }
    *s = lt_time_now() - t0;
    return 0;
}

/* One llama-bench run of pp and tg (one repetition each); tokens/s into *pp_ts, *tg_ts. */
static int llama_round(const char *exe, const char *model, int threads, int64_t pp, int64_t tg, double *pp_ts,
                       double *tg_ts) {
    char cmd[4096];
    int n = snprintf(cmd, sizeof cmd, "'%s' -m '%s' -t %d -p %lld -n %lld -r 1 -o json 2>/dev/null", exe, model,
                     threads, (long long)pp, (long long)tg);
    if (n < 0 || (size_t)n >= sizeof cmd || strchr(model, '\'') || strchr(exe, '\'')) return -1;
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        pclose(f);
        return -1;
    }
    size_t got;
    while (len + 1 < cap && (got = fread(buf + len, 1, cap - 1 - len, f)) > 0) len += got;
    buf[len] = 0;
    int rc = pclose(f);
    cJSON *j = rc == 0 ? cJSON_Parse(buf) : NULL;
    free(buf);
    *pp_ts = *tg_ts = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        const cJSON *np = cJSON_GetObjectItem(it, "n_prompt"), *ng = cJSON_GetObjectItem(it, "n_gen"),
                    *ts = cJSON_GetObjectItem(it, "avg_ts");
        if (!cJSON_IsNumber(np) || !cJSON_IsNumber(ng) || !cJSON_IsNumber(ts)) continue;
        if (np->valuedouble > 0 && ng->valuedouble == 0) *pp_ts = ts->valuedouble;
        if (np->valuedouble == 0 && ng->valuedouble > 0) *tg_ts = ts->valuedouble;
    }
    cJSON_Delete(j);
    return *pp_ts > 0 && *tg_ts > 0 ? 0 : -1;
}

/* An arm: the median of the n rounds' tokens/s (v is sorted in place) and every round's figure in
 * round order. */
static cJSON *arm(const char *name, double *v, int n, int64_t tokens) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "name", name);
    cJSON_AddNumberToObject(a, "tokens", (double)tokens);
    cJSON *rounds = cJSON_AddArrayToObject(a, "rounds_tokens_per_s");
    for (int k = 0; k < n; k++) cJSON_AddItemToArray(rounds, cJSON_CreateNumber(v[k]));
    double ts = lt_bench_median(v, n);
    cJSON_AddNumberToObject(a, "tokens_per_s", ts);
    cJSON_AddNumberToObject(a, "median_ms", ts > 0 ? 1e3 * (double)tokens / ts : 0);
    return a;
}

int lt_bench_generate(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    c.repeats = 5;
    const char *home = getenv("HOME"), *llama = getenv("LLAMA_BENCH"), *model = NULL;
    char def_model[1024];
    snprintf(def_model, sizeof def_model, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", home ? home : ".");
    model = def_model;
    if (!llama) llama = "/work/cache/llama-build/bin/llama-bench";
    int threads = 2;
    int64_t pp = 512, tg = 128;
    int bf16x = 0; /* --bf16-products */
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--bf16-products", &bf16x, 1), LT_BENCH_STR("--model", &model),
        LT_BENCH_STR("--llama-bench", &llama),      LT_BENCH_INT("--threads", &threads, 1, 4096),
        LT_BENCH_I64("--pp", &pp, 1, 65536),        LT_BENCH_I64("--tg", &tg, 1, 65536),
    };
    const int parsed =
        lt_bench_parse_args("generate", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench generate [--model GGUF] [--threads N] [--pp N] [--tg N] [--llama-bench PATH] "
               "[options]\n\nKV-cache prefill and decode tokens/s vs llama-bench (pp, tg) on the same model and "
               "threads.\n  --model GGUF  [~/.cache/longtune/smollm2-135m-instruct-q4_1.gguf]\n"
               "  --threads N  [2]\n  --pp N  prompt tokens [512]\n  --tg N  generated tokens [128]\n"
               "  --llama-bench PATH  [$LLAMA_BENCH or /work/cache/llama-build/bin/llama-bench; CPU only]\n"
               "  --bf16-products  prefill on bf16 products (generate --bf16-products)\n"
               "options:\n" LT_BENCH_COMMON_HELP "  (--repeats: rounds, each one longtune pp, tg and one "
               "llama-bench run [5]; --warmup: untimed rounds after the first prefill [1])\n");
        return 0;
    }
    if (parsed) return parsed;
    if (c.repeats > MAX_ROUNDS) c.repeats = MAX_ROUNDS;
    lt_device dev = strcmp(c.backend, "cuda") ? LT_DEVICE_CPU : LT_DEVICE_CUDA;
    struct stat sb;
    /* llama-bench is the CPU build: beside a CUDA run it would compare two devices */
    int have_llama = dev == LT_DEVICE_CPU && stat(llama, &sb) == 0 && (sb.st_mode & S_IXUSR);
    gen_bench g;
    memset(&g, 0, sizeof g);
    g.pp = pp, g.tg = tg;
    g.ctx = lt_ctx_new();
    lt_ctx_set_threads(g.ctx, threads);
    int rc = 1;
    if (dev != LT_DEVICE_CPU && lt_model_device_available(g.ctx, dev) != LT_OK) {
        fprintf(stderr, "longtune bench generate: --backend cuda: %s\n", lt_ctx_error(g.ctx));
        goto done;
    }
    lt_model_options mo = {.device = dev};
    lt_lora_options lo;
    memset(&lo, 0, sizeof lo);
    lo.targets = 1u << LT_PROJ_Q, lo.num_layers = 1, lo.rank = 1; /* B = 0: the base model */
    double t_load = lt_time_now();
    if (lt_model_load(g.ctx, model, &mo, &lo, &g.m) != LT_OK) {
        fprintf(stderr, "longtune bench generate: %s\n", lt_ctx_error(g.ctx));
        goto done;
    }
    const lt_model_config *cf = lt_model_get_config(g.m);
    int64_t ctx_len = pp > tg ? pp : tg;
    size_t cache_bytes = 0;
    double t_cache = lt_time_now();
    t_load = t_cache - t_load;
    const lt_kv_cache_options ko = {.B = 1, .ctx_len = ctx_len, .n_max = pp, .bf16_products = bf16x};
    if (lt_kv_cache_create(g.ctx, g.m, &ko, &g.c, &cache_bytes) != LT_OK) {
        fprintf(stderr, "longtune bench generate: %s\n", lt_ctx_error(g.ctx));
        goto done;
    }
    t_cache = lt_time_now() - t_cache;
    g.prompt = malloc((size_t)ctx_len * sizeof(int32_t));
    g.logits = malloc((size_t)cf->V * sizeof(float));
    if (!g.prompt || !g.logits) goto done;
    uint64_t r = 1;
    for (int64_t j = 0; j < ctx_len; j++) g.prompt[j] = (int32_t)(lt_bench_rand_u64(&r) % (uint64_t)cf->V);
    double lpp[MAX_ROUNDS], ltg[MAX_ROUNDS], cpp[MAX_ROUNDS], ctg[MAX_ROUNDS], s, t_first;
    int n_llama = 0;
    if (run_pp(&g, &t_first)) goto done; /* the first call: the backend's one-time start with it */
    fprintf(stderr, "setup: model load %.3f s, kv cache %.3f s, first prefill of %lld tokens %.3f s\n", t_load, t_cache,
            (long long)pp, t_first);
    for (int w = 0; w < c.warmup; w++)
        if (run_pp(&g, &s) || run_tg(&g, &s)) goto done;
    for (int k = 0; k < c.repeats; k++) {
        if (run_pp(&g, &s)) goto done;
        lpp[k] = (double)pp / s;
        if (run_tg(&g, &s)) goto done;
        ltg[k] = (double)tg / s;
        if (have_llama && llama_round(llama, model, threads, pp, tg, &cpp[n_llama], &ctg[n_llama]) == 0) n_llama++;
        fprintf(stderr, "round %d: longtune pp %.1f tg %.1f tok/s%s", k + 1, lpp[k], ltg[k],
                n_llama && have_llama ? "" : "\n");
        if (have_llama && n_llama)
            fprintf(stderr, ", llama.cpp pp %.1f tg %.1f tok/s\n", cpp[n_llama - 1], ctg[n_llama - 1]);
    }
    cJSON *res = lt_bench_result_new("generate");
    cJSON *cfg = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(cfg, "model", model);
    cJSON_AddStringToObject(cfg, "device", dev == LT_DEVICE_CPU ? "cpu" : "cuda");
    cJSON_AddNumberToObject(cfg, "threads", threads);
    cJSON_AddNumberToObject(cfg, "pp", (double)pp);
    cJSON_AddNumberToObject(cfg, "tg", (double)tg);
    cJSON_AddBoolToObject(cfg, "bf16_products", bf16x);
    cJSON_AddNumberToObject(cfg, "rounds", c.repeats);
    cJSON_AddNumberToObject(cfg, "kv_cache_bytes", (double)cache_bytes);
    cJSON_AddNumberToObject(cfg, "warmup_rounds", c.warmup);
    cJSON_AddStringToObject(cfg, "llama_bench", n_llama ? llama : "");
    cJSON *su = cJSON_AddObjectToObject(res, "setup");
    cJSON_AddNumberToObject(su, "model_load_s", t_load);
    cJSON_AddNumberToObject(su, "kv_cache_new_s", t_cache);
    cJSON_AddNumberToObject(su, "first_prefill_s", t_first);
    cJSON_AddNumberToObject(su, "first_prefill_tokens_per_s", (double)pp / t_first);
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    cJSON_AddItemToArray(arms, arm("longtune-pp", lpp, c.repeats, pp));
    cJSON_AddItemToArray(arms, arm("longtune-tg", ltg, c.repeats, tg));
    double mpp = lt_bench_median(lpp, c.repeats), mtg = lt_bench_median(ltg, c.repeats), mcpp = 0, mctg = 0;
    if (n_llama) {
        cJSON_AddItemToArray(arms, arm("llama.cpp-pp", cpp, n_llama, pp));
        cJSON_AddItemToArray(arms, arm("llama.cpp-tg", ctg, n_llama, tg));
        mcpp = lt_bench_median(cpp, n_llama), mctg = lt_bench_median(ctg, n_llama);
        cJSON *ra = cJSON_AddObjectToObject(res, "ratios");
        cJSON_AddNumberToObject(ra, "prefill", mpp / mcpp);
        cJSON_AddNumberToObject(ra, "decode", mtg / mctg);
        cJSON_AddBoolToObject(ra, "prefill_bar_0.8", mpp / mcpp >= 0.8);
        cJSON_AddBoolToObject(ra, "decode_bar_1.0", mtg / mctg >= 1.0);
        fprintf(
            stderr,
            "median: longtune pp %.1f tg %.1f tok/s; llama.cpp pp %.1f tg %.1f tok/s; ratios prefill %.2f decode %.2f\n",
            mpp, mtg, mcpp, mctg, mpp / mcpp, mtg / mctg);
    } else {
        fprintf(stderr, "median: longtune pp %.1f tg %.1f tok/s (%s)\n", mpp, mtg,
                dev == LT_DEVICE_CPU ? "no llama-bench found" : "llama-bench is the CPU build: not run beside CUDA");
    }
    rc = lt_bench_write(&c, res,
                        dev == LT_DEVICE_CPU ? (bf16x ? "cpu-bf16-products" : "cpu")
                                             : "cuda-kvcache"); /* beside generate-cuda.json */
done:
    free(g.prompt);
    free(g.logits);
    lt_kv_cache_free(g.ctx, g.c);
    if (g.m) lt_model_free(g.ctx, g.m);
    lt_ctx_free(g.ctx);
    return rc;
}
