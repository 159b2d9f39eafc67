/* `longtune bench moe`: LoRA training steps (batch 1, LoRA r=8 on q,k,v,o of every layer, experts and
 * routers frozen, recompute every layer, flash attention, fused loss, the router's load-balancing
 * loss, AdamW) of a mixture-of-experts shape — Qwen3-30B-A3B's published config with four layers,
 * random weights — with the expert dispatch chunked (--moe-chunk-tokens, the default) and unchunked
 * (one chunk of all T tokens), at each T of --seq: median step time, tokens/s, the accounting
 * allocator's peak beside the planner's prediction for the same run. Then the longest trainable T of
 * each: candidates (powers of 2 and their midpoints up to --max) allocated in order until one does
 * not fit (the model allocates everything at prepare time), the planner's own answer for the
 * device's memory beside it, and one real step at the longest that allocated. On CUDA the peer,
 * transformers + PEFT on the same shape (bench/peers/train_moe_peft_gpu.py: LoRA on attention,
 * gradient checkpointing, bf16, random init from the config), runs first in its own process on an
 * untouched device: the same --seq lengths and its own longest T, stopping at its first OOM.
 * It calls the library's model and planner; it reimplements no op. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_model.h"
#include "bench.h"
#include "bench_step.h"
#include "backend/backend.h"
#include "longtune/alloc.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/model.h"
#include "longtune/plan.h"
#include "longtune/sysinfo.h"

#define MAX_SEQS 8
#define MAX_CAND 40
#define ATTN_TARGETS ((1u << LT_PROJ_Q) | (1u << LT_PROJ_K) | (1u << LT_PROJ_V) | (1u << LT_PROJ_O))

typedef struct moe_run {
    lt_ctx *ctx;
    lt_model *m;
    lt_device dev;
    const lt_backend *be;
    lt_lora_options lo;
    int threads;
    float *mom_m, *mom_v;
    size_t mom_bytes;
    int32_t *tok; /* host batch of 2·Tmax ids */
    size_t tok_bytes;
    uint64_t seed;
    int64_t adam_step;
} moe_run;

/* chunk: the run's moe_chunk_tokens (0 = the model's default, >= T = one chunk). A dispatch chunk
 * never exceeds the position-wise chunk (chunk_rows), so an unchunked run widens that to the chunk
 * too: every token of the batch is dispatched at once, as transformers does. */
static int64_t rows_for(int64_t chunk) { return chunk > LT_MODEL_CHUNK_ROWS ? chunk : 0; }

static lt_model_run_options run_opts(int64_t T, int64_t chunk, int threads) {
    lt_model_run_options ro = {.B = 1,
                               .chunk_rows = rows_for(chunk),
                               .T = T,
                               .recompute = LT_RECOMPUTE_EVERY,
                               .attention = LT_ATTENTION_FLASH,
                               .loss = LT_LCE_FUSED,
                               .threads = threads,
                               .moe_chunk_tokens = chunk};
    return ro;
}

static lt_plan_options plan_opts(const moe_run *r, int64_t T, int64_t chunk) {
    lt_plan_options po = {.device = r->dev,
                          .lora = r->lo,
                          .run = run_opts(T, chunk, r->threads),
                          .held_bytes = r->dev == LT_DEVICE_CPU ? lt_alloc_accounted_size(r->dev, r->tok_bytes) : 0};
    return po;
}

/* The plan's peak and classes into q (plan_bytes, plan_classes); 0 = planned. */
static int add_plan(moe_run *r, const lt_model_config *cfg, int64_t T, int64_t chunk, cJSON *q, size_t *peak) {
    lt_plan_options po = plan_opts(r, T, chunk);
    lt_plan p;
    *peak = 0;
    if (lt_plan_compute(r->ctx, cfg, &po, &p) != LT_OK) {
        cJSON_AddStringToObject(q, "plan_error", lt_ctx_error(r->ctx));
        return -1;
    }
    *peak = p.peak_bytes;
    cJSON_AddNumberToObject(q, "plan_bytes", (double)p.peak_bytes);
    cJSON *cl = cJSON_AddObjectToObject(q, "plan_classes");
    for (int k = 0; k < LT_PLAN_CLASS_COUNT_; k++)
        cJSON_AddNumberToObject(cl, lt_plan_class_name((lt_plan_class)k), (double)p.bytes[k]);
    return 0;
}

/* lt_model_prepare at (T, chunk): 1 = allocated, 0 = out of memory, -1 = another error (in ctx). */
static int prepare_at(moe_run *r, int64_t T, int64_t chunk) {
    lt_model_run_options ro = run_opts(T, chunk, r->threads);
    lt_status st = lt_model_prepare(r->ctx, r->m, &ro);
    lt_mem_reset_peak(r->ctx, r->dev);
    if (st == LT_OK) return 1;
    return st == LT_ERR_OOM ? 0 : -1;
}

/* One real step at T (prepared): its milliseconds, or < 0 on failure (status in ctx). */
static double step_at(moe_run *r, int64_t T, double *loss) {
    return lt_bench_random_step(r->ctx, r->m, r->be, r->mom_m, r->mom_v, r->tok, T, &r->seed, &r->adam_step, loss);
}

/* Powers of 2 and their midpoints (1.5x) in [lo, hi], ascending (the peer's candidates too). */
static int candidates(int64_t lo, int64_t hi, int64_t *out) {
    int n = 0;
    int64_t p = 1;
    while (p * 2 <= lo) p *= 2;
    for (; p <= hi && n + 2 <= MAX_CAND; p *= 2) {
        if (p >= lo) out[n++] = p;
        if (p + p / 2 >= lo && p + p / 2 <= hi) out[n++] = p + p / 2;
    }
    return n;
}

/* One arm's timed points: returns 0, or -1 when the model failed other than by running out of
 * memory (the message is in the arm's "error"). */
static int timed_points(moe_run *r, const lt_model_config *cfg, const lt_bench_common *c, const int64_t *seqs,
                        int n_seqs, int chunked, int64_t chunk, cJSON *arm) {
    cJSON *pts = cJSON_AddArrayToObject(arm, "points");
    for (int i = 0; i < n_seqs; i++) {
        int64_t T = seqs[i], ch = chunked ? chunk : T;
        cJSON *q = cJSON_CreateObject();
        cJSON_AddItemToArray(pts, q);
        cJSON_AddNumberToObject(q, "T", (double)T);
        cJSON_AddNumberToObject(q, "moe_chunk_tokens", (double)(ch > 0 ? ch : LT_MODEL_MOE_CHUNK_TOKENS));
        cJSON_AddNumberToObject(q, "chunk_rows", (double)(rows_for(ch) ? rows_for(ch) : LT_MODEL_CHUNK_ROWS));
        size_t plan = 0;
        add_plan(r, cfg, T, ch, q, &plan);
        int f = prepare_at(r, T, ch);
        if (f < 0) {
            cJSON_AddStringToObject(arm, "error", lt_ctx_error(r->ctx));
            cJSON_AddBoolToObject(q, "ok", 0);
            return -1;
        }
        if (!f) {
            cJSON_AddBoolToObject(q, "ok", 0);
            cJSON_AddBoolToObject(q, "oom", 1);
            fprintf(stderr, "%s T=%lld: out of memory at allocation (plan %.3f GiB)\n",
                    chunked ? "chunked" : "unchunked", (long long)T, (double)plan / 1073741824.0);
            continue;
        }
        double ms[64], loss = 0;
        int nrep = c->repeats < 64 ? c->repeats : 64;
        for (int k = 0; k < c->warmup + nrep; k++) {
            double t = step_at(r, T, &loss);
            if (t < 0) {
                cJSON_AddStringToObject(arm, "error", lt_ctx_error(r->ctx));
                cJSON_AddBoolToObject(q, "ok", 0);
                return -1;
            }
            if (k >= c->warmup) ms[k - c->warmup] = t;
        }
        cJSON *sm = cJSON_AddArrayToObject(q, "step_ms");
        for (int k = 0; k < nrep; k++) cJSON_AddItemToArray(sm, cJSON_CreateNumber(ms[k]));
        double med = lt_bench_median(ms, nrep);
        size_t peak = lt_mem_get_stats(r->ctx, r->dev).peak_bytes;
        cJSON_AddBoolToObject(q, "ok", 1);
        cJSON_AddNumberToObject(q, "median_ms", med);
        cJSON_AddNumberToObject(q, "tokens_per_s", (double)T / (med * 1e-3));
        cJSON_AddNumberToObject(q, "peak_bytes", (double)peak);
        if (plan > 0) cJSON_AddNumberToObject(q, "plan_over_measured", (double)plan / (double)peak);
        cJSON_AddNumberToObject(q, "loss", loss);
        fprintf(stderr, "%s T=%lld: %.1f ms, %.0f tokens/s, peak %.3f GiB (plan %.3f GiB), loss %.4f\n",
                chunked ? "chunked" : "unchunked", (long long)T, med, (double)T / (med * 1e-3),
                (double)peak / 1073741824.0, (double)plan / 1073741824.0, loss);
    }
    return 0;
}

/* One arm's longest T: candidates allocated in order until one does not fit, the planner's answer
 * for `budget` bytes, one real step at the longest that allocated when confirm. */
static int ceiling(moe_run *r, const lt_model_config *cfg, int chunked, int64_t chunk, int64_t lo_T, int64_t hi_T,
                   size_t budget, int confirm, cJSON *arm) {
    cJSON *cj = cJSON_AddObjectToObject(arm, "ceiling");
    int64_t cand[MAX_CAND];
    int nc = candidates(lo_T, hi_T, cand);
    cJSON *ca = cJSON_AddArrayToObject(cj, "candidates");
    for (int i = 0; i < nc; i++) cJSON_AddItemToArray(ca, cJSON_CreateNumber((double)cand[i]));
    /* the planner's longest T for the device memory this process found free before loading;
     * unchunked means moe_chunk_tokens >= T at every T, which any chunk of hi_T tokens is */
    lt_plan_options po = plan_opts(r, lo_T, chunked ? chunk : hi_T);
    int64_t t_plan = 0;
    int found = 0;
    if (lt_plan_search_max(r->ctx, cfg, &po, LT_PLAN_SEARCH_SEQ, hi_T, budget, &t_plan, &found) == LT_OK)
        cJSON_AddNumberToObject(cj, "plan_max_T", found ? (double)t_plan : 0);
    else cJSON_AddStringToObject(cj, "plan_error", lt_ctx_error(r->ctx));
    cJSON_AddNumberToObject(cj, "plan_budget_bytes", (double)budget);
    cJSON *tries = cJSON_AddArrayToObject(cj, "tries");
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < nc; i++) {
        int64_t T = cand[i], ch = chunked ? chunk : T;
        cJSON *q = cJSON_CreateObject();
        cJSON_AddItemToArray(tries, q);
        cJSON_AddNumberToObject(q, "T", (double)T);
        size_t plan = 0;
        add_plan(r, cfg, T, ch, q, &plan);
        int f = prepare_at(r, T, ch);
        if (f < 0) {
            cJSON_AddStringToObject(cj, "error", lt_ctx_error(r->ctx));
            return -1;
        }
        cJSON_AddBoolToObject(q, "allocated", f);
        if (f) cJSON_AddNumberToObject(q, "allocated_bytes", (double)lt_mem_get_stats(r->ctx, r->dev).used_bytes);
        fprintf(stderr, "%s ceiling: T=%lld %s (plan %.3f GiB)\n", chunked ? "chunked" : "unchunked", (long long)T,
                f ? "allocates" : "out of memory", (double)plan / 1073741824.0);
        if (!f) {
            hi = T;
            break;
        }
        lo = T;
    }
    cJSON_AddNumberToObject(cj, "alloc_ceiling_T", (double)lo);
    if (hi) cJSON_AddNumberToObject(cj, "alloc_fails_T", (double)hi);
    else cJSON_AddBoolToObject(cj, "search_capped", 1); /* every candidate up to --max allocated */
    int64_t stepped = 0;
    if (confirm && lo > 0) {
        double loss = 0, ms = -1;
        if (prepare_at(r, lo, chunked ? chunk : lo) == 1) ms = step_at(r, lo, &loss);
        if (ms >= 0) {
            stepped = lo;
            cJSON_AddNumberToObject(cj, "step_ms", ms);
            cJSON_AddNumberToObject(cj, "step_peak_bytes", (double)lt_mem_get_stats(r->ctx, r->dev).peak_bytes);
            cJSON_AddNumberToObject(cj, "step_loss", loss);
            fprintf(stderr, "%s ceiling: step at T=%lld in %.1f s, loss %.4f\n", chunked ? "chunked" : "unchunked",
                    (long long)lo, ms * 1e-3, loss);
        } else {
            cJSON_AddStringToObject(cj, "step_error", lt_ctx_error(r->ctx));
            fprintf(stderr, "%s ceiling: the step at T=%lld failed: %s\n", chunked ? "chunked" : "unchunked",
                    (long long)lo, lt_ctx_error(r->ctx));
        }
    }
    cJSON_AddNumberToObject(cj, "step_confirmed_T", (double)stepped);
    cJSON_AddNumberToObject(cj, "ceiling_T", (double)(confirm ? stepped : lo));
    cJSON_AddStringToObject(cj, "ceiling_by", confirm ? "allocation and a real step" : "allocation");
    return 0;
}

/* The peer's lines as an arm. */
static cJSON *peer_arm(const cJSON *lines, const int64_t *seqs, int n_seqs) {
    cJSON *pa = cJSON_CreateObject();
    cJSON_AddStringToObject(pa, "name", "torch-peft");
    if (!lines) {
        cJSON_AddStringToObject(pa, "error", lt_bench_peer_failure());
        return pa;
    }
    const cJSON *ready = lt_bench_peer_find(lines, "ready", 0);
    if (ready) cJSON_AddItemToObject(pa, "peer", cJSON_Duplicate(ready, 1));
    cJSON *pts = cJSON_AddArrayToObject(pa, "points");
    for (int i = 0; i < n_seqs; i++) {
        const cJSON *l = lt_bench_peer_find(lines, "T", seqs[i]);
        if (l) cJSON_AddItemToArray(pts, cJSON_Duplicate(l, 1));
    }
    const cJSON *cl = cJSON_GetObjectItem(lt_bench_peer_find(lines, "ceiling", 0), "ceiling");
    if (cl) {
        cJSON *cj = cJSON_Duplicate(cl, 1);
        cJSON_AddNumberToObject(cj, "ceiling_T", cJSON_GetNumberValue(cJSON_GetObjectItem(cl, "fits_T")));
        cJSON_AddBoolToObject(cj, "search_capped", !cJSON_IsNumber(cJSON_GetObjectItem(cl, "fails_T")));
        cJSON_AddStringToObject(cj, "ceiling_by", "real steps, stopping at the first out-of-memory");
        cJSON_AddItemToObject(pa, "ceiling", cj);
    }
    return pa;
}

static const cJSON *arm_point(const cJSON *arm, int64_t T) {
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItem(arm, "points")) {
        if ((int64_t)cJSON_GetNumberValue(cJSON_GetObjectItem(p, "T")) == T) return p;
    }
    return NULL;
}

static double num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

/* Per T: chunked against unchunked and the peer (ratios of tokens/s and of peak memory). */
static void compare(cJSON *res, const cJSON *ch, const cJSON *un, const cJSON *peer, const int64_t *seqs, int n) {
    cJSON *cmp = cJSON_AddArrayToObject(res, "comparison");
    for (int i = 0; i < n; i++) {
        const cJSON *a = arm_point(ch, seqs[i]), *b = arm_point(un, seqs[i]), *p = peer ? arm_point(peer, seqs[i]) : 0;
        cJSON *q = cJSON_CreateObject();
        cJSON_AddNumberToObject(q, "T", (double)seqs[i]);
        double pa = num(a, "peak_bytes"), pb = num(b, "peak_bytes"), pp = num(p, "max_allocated_bytes");
        double ta = num(a, "tokens_per_s"), tb = num(b, "tokens_per_s"), tp = num(p, "tokens_per_s");
        if (isfinite(pa) && isfinite(pb)) cJSON_AddNumberToObject(q, "unchunked_minus_chunked_peak_bytes", pb - pa);
        if (isfinite(ta) && isfinite(tb)) cJSON_AddNumberToObject(q, "chunked_over_unchunked_tokens_per_s", ta / tb);
        if (isfinite(ta) && isfinite(tp)) cJSON_AddNumberToObject(q, "chunked_over_peer_tokens_per_s", ta / tp);
        if (isfinite(pa) && isfinite(pp)) cJSON_AddNumberToObject(q, "peer_over_chunked_peak", pp / pa);
        cJSON_AddItemToArray(cmp, q);
    }
}

int lt_bench_moe(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    c.repeats = 3;
    int64_t seqs[MAX_SEQS], chunk = 0, tmax = 0, peer_max = 0, threads = 0, rank = 8;
    int n_seqs = 0, peers = 1, do_ceiling = 1, confirm = 1, peer_cpu = 0;
    const char *shape_name = NULL, *weights = NULL, *peer_path = getenv("LONGTUNE_PEER_PATH");
    if (!peer_path) peer_path = "/tmp/lt-peer";
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--no-peer", &peers, 0),
        LT_BENCH_SET("--peer-cpu", &peer_cpu, 1),
        LT_BENCH_SET("--no-ceiling", &do_ceiling, 0),
        LT_BENCH_SET("--no-confirm", &confirm, 0),
        LT_BENCH_FN("--shape", &shape_name, lt_bench_parse_moe_shape),
        LT_BENCH_LIST("--seq", seqs, &n_seqs, MAX_SEQS, 2, (int64_t)1 << 24),
        LT_BENCH_I64("--moe-chunk-tokens", &chunk, 1, (int64_t)1 << 30),
        LT_BENCH_CHOICE("--weights", &weights, "random-bf16|random-f32"),
        LT_BENCH_I64("--max", &tmax, 2, (int64_t)1 << 24),
        LT_BENCH_I64("--peer-max", &peer_max, 2, (int64_t)1 << 24),
        LT_BENCH_I64("--rank", &rank, 1, 1024),
        LT_BENCH_I64("--threads", &threads, 1, 4096),
        LT_BENCH_STR("--peer-path", &peer_path),
    };
    const int parsed =
        lt_bench_parse_args("moe", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench moe [options]\n\n"
               "Mixture-of-experts LoRA training steps (batch 1, LoRA on q,k,v,o, recompute every layer,\n"
               "flash attention, fused loss, the router's load-balancing loss, AdamW) with the expert\n"
               "dispatch chunked (--moe-chunk-tokens) and unchunked: median step time, tokens/s, peak\n"
               "memory beside the planner's prediction at each --seq length; the longest trainable T\n"
               "of each (allocation over powers of 2 and midpoints up to --max, a real step at the\n"
               "longest); on CUDA transformers + PEFT on the same shape in the same invocation.\n\n"
               "options:\n"
               "  --shape S            %s (default qwen3-30b-a3b-l4 on cuda, tiny-moe on cpu)\n"
               "  --seq LIST           tokens per step (default 8192,16384,32768,65536 on cuda, 256,512 on cpu)\n"
               "  --moe-chunk-tokens N the chunked arm's tokens per dispatch chunk (default %d)\n"
               "  --max N              longest T the ceiling search tries (default 262144 on cuda, 2048 on cpu)\n"
               "  --no-ceiling         skip the longest-T search\n"
               "  --no-confirm         the ceiling by allocation only (no real step at it)\n"
               "  --weights W          random-bf16 (cuda default) | random-f32 (cpu default)\n"
               "  --rank R             LoRA rank (default 8, alpha 2R)\n"
               "  --threads N          CPU threads\n"
               "  --no-peer            skip the peer\n"
               "  --peer-max N         longest T the peer tries (default --max)\n"
               "  --peer-cpu           run the peer on the CPU too (checks the pipeline on a machine\n"
               "                       without a GPU; not a measurement)\n"
               "  --peer-path DIR      searched first for torch, transformers, peft (default\n"
               "                       $LONGTUNE_PEER_PATH or /tmp/lt-peer)\n" LT_BENCH_COMMON_HELP
               "(default here: --repeats 3)\n",
               lt_bench_moe_shape_names(), LT_MODEL_MOE_CHUNK_TOKENS);
        return 0;
    }
    if (parsed) return parsed;
    int cuda = !strcmp(c.backend, "cuda");
    lt_device dev = cuda ? LT_DEVICE_CUDA : LT_DEVICE_CPU;
    if (!shape_name) shape_name = cuda ? "qwen3-30b-a3b-l4" : "tiny-moe";
    const lt_bench_shape *shape = lt_bench_shape_find(shape_name);
    if (!weights) weights = cuda ? "random-bf16" : "random-f32";
    lt_dtype wdt = !strcmp(weights, "random-bf16") ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    if (!n_seqs) {
        const int64_t dflt_cuda[] = {8192, 16384, 32768, 65536}, dflt_cpu[] = {256, 512};
        n_seqs = cuda ? 4 : 2;
        memcpy(seqs, cuda ? dflt_cuda : dflt_cpu, (size_t)n_seqs * sizeof seqs[0]);
    }
    if (!tmax) tmax = cuda ? (int64_t)1 << 18 : 2048;
    if (!peer_max) peer_max = tmax;
    int64_t Tmax = tmax;
    for (int i = 0; i < n_seqs; i++) Tmax = seqs[i] > Tmax ? seqs[i] : Tmax;
    int64_t c_lo = seqs[0];
    for (int i = 0; i < n_seqs; i++) c_lo = seqs[i] < c_lo ? seqs[i] : c_lo;
    signal(SIGPIPE, SIG_IGN);

    /* The peer first, in its own process, before this one creates a CUDA context. */
    cJSON *peer_lines = NULL;
    int peer_ran = 0;
    if (peers && (cuda || peer_cpu)) {
        char list[256], args[600];
        size_t o = 0;
        for (int i = 0; i < n_seqs; i++)
            o += (size_t)snprintf(list + o, sizeof list - o, "%s%lld", i ? "," : "", (long long)seqs[i]);
        snprintf(args, sizeof args,
                 "--shape %s --seq %s --steps %d --warmup %d --rank %lld%s --ceiling-start %lld --ceiling-max %lld%s",
                 shape->name, list, c.repeats, c.warmup, (long long)rank, do_ceiling ? " --ceiling" : "",
                 (long long)c_lo, (long long)peer_max, cuda ? "" : " --device cpu");
        double t0 = lt_time_now();
        peer_lines = lt_bench_gpu_peer_run_script(peer_path, "bench/peers/train_moe_peft_gpu.py", args);
        peer_ran = 1;
        fprintf(stderr, "peer took %.0f s\n", lt_time_now() - t0);
    } else if (peers) {
        fprintf(stderr,
                "peer: the transformers + PEFT peer of this bench runs on CUDA (--peer-cpu to check it here)\n");
    }
    if (cuda && lt_sys_cuda().count == 0) {
        fprintf(stderr, "longtune bench moe: --backend cuda: no CUDA device (or a build without CUDA)\n");
        cJSON_Delete(peer_lines);
        return 1;
    }

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) {
        cJSON_Delete(peer_lines);
        return 1;
    }
    if (threads > 0) lt_ctx_set_threads(ctx, (int)threads);
    moe_run R;
    memset(&R, 0, sizeof R);
    R.ctx = ctx;
    R.dev = dev;
    R.be = lt_backend_get(dev);
    R.threads = lt_bench_threads(ctx);
    R.lo = (lt_lora_options){.targets = ATTN_TARGETS, .rank = rank, .alpha = 2.0f * (float)rank, .seed = 1};
    R.seed = 0x5eed;
    R.tok_bytes = 2 * (size_t)Tmax * sizeof(int32_t);
    int rc = 1, ours_ok = 0;

    cJSON *res = lt_bench_result_new("moe");
    cJSON *jc = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(jc, "backend", c.backend);
    cJSON_AddStringToObject(jc, "shape", shape->name);
    cJSON_AddStringToObject(jc, "model", shape->title);
    cJSON_AddStringToObject(jc, "weights", weights);
    cJSON_AddStringToObject(jc, "run",
                            "batch 1, LoRA on q,k,v,o of all layers (experts and routers frozen), recompute every "
                            "layer, flash attention, fused loss, router load-balancing loss, AdamW");
    cJSON_AddNumberToObject(jc, "lora_rank", (double)rank);
    cJSON_AddNumberToObject(jc, "aux_coef", shape->aux_coef);
    cJSON_AddNumberToObject(jc, "moe_chunk_tokens", (double)(chunk > 0 ? chunk : LT_MODEL_MOE_CHUNK_TOKENS));
    cJSON_AddNumberToObject(jc, "repeats", c.repeats);
    cJSON_AddNumberToObject(jc, "warmup", c.warmup);
    cJSON_AddNumberToObject(jc, "max", (double)tmax);
    cJSON_AddStringToObject(jc, "peak_bytes",
                            "the accounting allocator's high-water over the timed steps (torch: "
                            "max_memory_allocated); plan_bytes: lt_plan_compute for the same run");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    cJSON *ch = cJSON_CreateObject(), *un = cJSON_CreateObject();
    cJSON_AddItemToArray(arms, ch);
    cJSON_AddItemToArray(arms, un);
    cJSON_AddStringToObject(ch, "name", "longtune-chunked");
    cJSON_AddStringToObject(un, "name", "longtune-unchunked");

    lt_status st;
    lt_guard_options go = {.device = dev};
    lt_guard_ceiling gc;
    memset(&gc, 0, sizeof gc);
    if ((st = lt_guard_measure(ctx, dev, &go, &gc)) != LT_OK) {
        cJSON_AddStringToObject(ch, "error", lt_ctx_error(ctx));
        goto peer;
    }
    cJSON_AddNumberToObject(jc, "memory_total_bytes", (double)gc.total_bytes);
    cJSON_AddNumberToObject(jc, "memory_available_bytes", (double)gc.available_bytes);
    if ((st = lt_bench_load_random(ctx, shape, wdt, dev, &R.lo, R.threads, &R.m)) != LT_OK) {
        fprintf(stderr, "longtune bench moe: %s\n", lt_ctx_error(ctx));
        cJSON_AddStringToObject(ch, "error", lt_ctx_error(ctx));
        cJSON_AddStringToObject(un, "error", lt_ctx_error(ctx));
        goto peer;
    }
    {
        int64_t n = 0;
        lt_model_lora_params(R.m, &n);
        R.mom_bytes = (size_t)n * sizeof(float);
        R.mom_m = lt_alloc(ctx, dev, R.mom_bytes, "bench moe AdamW m");
        R.mom_v = lt_alloc(ctx, dev, R.mom_bytes, "bench moe AdamW v");
        if (R.mom_m) R.be->zero(ctx, R.mom_m, R.mom_bytes);
        if (R.mom_v) R.be->zero(ctx, R.mom_v, R.mom_bytes);
        R.tok = lt_alloc(ctx, LT_DEVICE_CPU, R.tok_bytes, "bench moe batch (host)");
        if (!R.mom_m || !R.mom_v || !R.tok) {
            cJSON_AddStringToObject(ch, "error", "out of memory for the optimizer state or the batch");
            goto peer;
        }
        cJSON_AddNumberToObject(jc, "n_lora_params", (double)n);
    }
    {
        const lt_model_config *cfg = lt_model_get_config(R.m);
        if (cfg->n_experts <= 0) {
            cJSON_AddStringToObject(ch, "error", "the loaded model has no mixture-of-experts layers");
            goto peer;
        }
        if (timed_points(&R, cfg, &c, seqs, n_seqs, 1, chunk, ch) != 0) {
            fprintf(stderr, "longtune bench moe: %s\n", lt_ctx_error(ctx));
            cJSON_AddStringToObject(un, "error", "not run: the chunked arm failed (its \"error\")");
            goto peer;
        }
        if (timed_points(&R, cfg, &c, seqs, n_seqs, 0, chunk, un) != 0) {
            fprintf(stderr, "longtune bench moe: %s\n", lt_ctx_error(ctx));
            goto peer;
        }
        if (do_ceiling) {
            if (ceiling(&R, cfg, 1, chunk, c_lo, tmax, gc.available_bytes, confirm, ch) != 0 ||
                ceiling(&R, cfg, 0, chunk, c_lo, tmax, gc.available_bytes, confirm, un) != 0)
                goto peer;
        }
        ours_ok = 1;
    }

peer:
    if (peer_ran) {
        cJSON *pa = peer_arm(peer_lines, seqs, n_seqs);
        cJSON_AddItemToArray(arms, pa);
        compare(res, ch, un, pa, seqs, n_seqs);
        const cJSON *pc = cJSON_GetObjectItem(pa, "ceiling"), *oc = cJSON_GetObjectItem(ch, "ceiling");
        double theirs = num(pc, "ceiling_T"), ours = num(oc, "ceiling_T");
        if (theirs > 0 && ours > 0) cJSON_AddNumberToObject(res, "ceiling_chunked_over_peer", ours / theirs);
    } else {
        compare(res, ch, un, NULL, seqs, n_seqs);
    }
    {
        char tag[128];
        if (cuda && !strcmp(shape->name, "qwen3-30b-a3b-l4")) snprintf(tag, sizeof tag, "cuda");
        else snprintf(tag, sizeof tag, "%s-%s", c.backend, shape->name);
        int w = lt_bench_write(&c, res, tag);
        rc = w == 0 && ours_ok ? 0 : 1;
    }
    if (!ours_ok)
        fprintf(stderr, "longtune bench moe: the longtune arms did not complete (see \"error\" in the result)\n");
    cJSON_Delete(peer_lines);
    if (R.mom_m) lt_free(ctx, dev, R.mom_m, R.mom_bytes);
    if (R.mom_v) lt_free(ctx, dev, R.mom_v, R.mom_bytes);
    if (R.tok) lt_free(ctx, LT_DEVICE_CPU, R.tok, R.tok_bytes);
    lt_model_free(ctx, R.m);
    lt_ctx_free(ctx);
    return rc;
}
