/* `longtune bench context`: the longest context one training step (batch 1, LoRA r=8 on all seven
 * projections, recompute every layer, flash attention, fused loss, AdamW) fits in this machine's
 * memory. The planner answers first (bisection over T against the memory guard's ceiling), the
 * answer is confirmed by allocating the run under the guard (the model allocates everything at
 * prepare time, so a length that does not fit fails there) and by real steps at the longest length
 * whose step fits the time budget (or at a given length); the CUDA peers' ceilings (transformers +
 * PEFT, and with Liger-Kernel; real steps, by bisection or at given lengths) run first, in their own
 * processes, on an untouched device. The recompute policy is every layer unless --recompute names
 * another (every:K keeps one checkpoint per K layers: the same recompute work, fewer checkpoints). The result also carries peak
 * memory against context for both arms (scripts/context_chart.py draws it). Reimplements no op. */
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

/* The run state one length is tried with. */
typedef struct ctx_run {
    lt_ctx *ctx;
    lt_model *m;
    lt_device dev;
    const lt_backend *be;
    lt_lora_options lo;
    int threads;
    float *mom_m, *mom_v;
    size_t mom_bytes;
    int32_t *tok; /* host batch of 2·Tmax ids (the model copies a batch in itself) */
    size_t tok_bytes;
    size_t held_extra; /* accounted bytes the bench holds besides model, optimizer and batch */
    lt_guard *guard;
    uint64_t seed;
    int64_t adam_step;
    int offload;        /* --offload-checkpoints */
    lt_recompute rc;    /* --recompute (every layer by default) */
    int64_t rc_k;       /* its K for every:K */
    size_t host_budget; /* with offload: host bytes the offloaded checkpoints may take */
    int64_t prepared_T; /* the length the model is prepared at now (0: none) */
} ctx_run;

static lt_model_run_options run_opts(const ctx_run *r, int64_t T) {
    /* Least memory: the recompute reruns attention rather than keeping its output. */
    lt_model_run_options ro = {.B = 1,
                               .T = T,
                               .recompute = r->rc,
                               .recompute_k = r->rc_k,
                               .recompute_attention = 1,
                               .attention = LT_ATTENTION_FLASH,
                               .loss = LT_LCE_FUSED,
                               .threads = r->threads,
                               .offload_ckpt = r->offload};
    return ro;
}

static lt_status plan_at(ctx_run *r, const lt_model_config *cfg, int64_t T, lt_plan *p) {
    lt_plan_options po = {.device = r->dev,
                          .lora = r->lo,
                          .run = run_opts(r, T),
                          .held_bytes = (r->dev == LT_DEVICE_CPU ? lt_alloc_accounted_size(r->dev, r->tok_bytes) : 0) +
                              r->held_extra};
    return lt_plan_compute(r->ctx, cfg, &po, p);
}

/* Allocates the run at T (lt_model_prepare under the guard's limit). 1 = fits, 0 = out of memory,
 * -1 = another error (in ctx). *peak: the bytes held right after, which is the run's high-water
 * since the model allocates nothing inside a step; the peak counter is reset to it. */
static int alloc_at(ctx_run *r, int64_t T, size_t *peak) {
    lt_model_run_options ro = run_opts(r, T);
    double t0 = lt_time_now();
    lt_status st = lt_model_prepare(r->ctx, r->m, &ro);
    if (r->offload && r->dev != LT_DEVICE_CPU)
        fprintf(stderr, "  prepare T=%lld with %.2f GiB pinned host memory: %.1f s\n", (long long)T,
                (double)lt_mem_get_pinned_stats(r->ctx).used_bytes / 1073741824.0, lt_time_now() - t0);
    lt_mem_reset_peak(r->ctx, r->dev);
    *peak = lt_mem_get_stats(r->ctx, r->dev).used_bytes;
    r->prepared_T = st == LT_OK ? T : 0;
    if (st == LT_OK) return 1;
    return st == LT_ERR_OOM ? 0 : -1;
}

/* One real step at T (prepared). Returns its milliseconds, or < 0 on failure (status in ctx). */
static double step_at(ctx_run *r, int64_t T, double *loss) {
    double ms = lt_bench_random_step(r->ctx, r->m, r->be, r->mom_m, r->mom_v, r->tok, T, &r->seed, &r->adam_step, loss);
    if (ms >= 0 && r->guard && lt_guard_tripped(r->guard)) {
        lt_guard_breach gb = lt_guard_get_breach(r->guard);
        lt_error(r->ctx, LT_ERR_OOM, "memory guard: %s at %llu bytes passed the ceiling %llu at T=%lld", gb.source,
                 (unsigned long long)gb.observed_bytes, (unsigned long long)gb.ceiling_bytes, (long long)T);
        return -1;
    }
    return ms;
}

/* With offload: the host side of a point, planned and measured (pinned bytes held now). */
static cJSON *host_side(cJSON *q, const ctx_run *r, const lt_plan *p, int allocated) {
    if (!r->offload || r->dev == LT_DEVICE_CPU) return q; /* a CPU plan counts it in its peak */
    cJSON_AddNumberToObject(q, "host_plan_bytes", (double)p->offload_bytes);
    if (allocated) cJSON_AddNumberToObject(q, "pinned_bytes", (double)lt_mem_get_pinned_stats(r->ctx).used_bytes);
    return q;
}

static cJSON *point(int64_t T, const char *how, int ok, double plan, double peak) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddNumberToObject(p, "T", (double)T);
    cJSON_AddStringToObject(p, "by", how);
    cJSON_AddBoolToObject(p, "ok", ok);
    if (plan > 0) cJSON_AddNumberToObject(p, "plan_bytes", plan);
    if (peak > 0) cJSON_AddNumberToObject(p, "peak_bytes", peak);
    if (plan > 0 && peak > 0) cJSON_AddNumberToObject(p, "plan_over_measured", plan / peak);
    return p;
}

int lt_bench_context(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    int64_t step = 0, tmax = 0, peer_max = 0, threads = 0, confirm_T = 0, peer_points[8];
    int n_peer_points = 0;
    double confirm_s = 120;
    uint64_t ceiling = 0, host_margin = (uint64_t)4 << 30;
    int peers = 1, plain = 1, liger = 1, offload = 0;
    const char *shape_name = "qwen3-8b", *weights = NULL, *peer_path = getenv("LONGTUNE_PEER_PATH"), *recompute = "all";
    if (!peer_path) peer_path = "/tmp/lt-peer";
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--no-peer", &peers, 0),
        LT_BENCH_SET("--no-liger", &liger, 0),
        LT_BENCH_SET("--no-plain-peer", &plain, 0),
        LT_BENCH_STR("--recompute", &recompute),
        LT_BENCH_I64("--confirm-T", &confirm_T, 2, (int64_t)1 << 26),
        LT_BENCH_LIST("--peer-points", peer_points, &n_peer_points, 8, 2, (int64_t)1 << 26),
        LT_BENCH_SET("--offload-checkpoints", &offload, 1),
        LT_BENCH_FN("--shape", &shape_name, lt_bench_parse_shape),
        LT_BENCH_CHOICE("--weights", &weights, "random-bf16|random-f32"),
        LT_BENCH_I64("--step", &step, 1, 1 << 20),
        LT_BENCH_I64("--max", &tmax, 2, (int64_t)1 << 26),
        LT_BENCH_I64("--peer-max", &peer_max, 2, (int64_t)1 << 26),
        LT_BENCH_I64("--threads", &threads, 1, 4096),
        LT_BENCH_BYTES("--memory-ceiling", &ceiling),
        LT_BENCH_BYTES("--host-margin", &host_margin),
        LT_BENCH_F64("--confirm-seconds", &confirm_s, 0, 1000000000),
        LT_BENCH_STR("--peer-path", &peer_path),
    };
    const int parsed =
        lt_bench_parse_args("context", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench context [options]\n\n"
               "Longest trainable context (batch 1, LoRA r=8 on all seven projections, recompute every layer\n"
               "or --recompute's policy, attention rerun, flash attention, fused loss, AdamW): the planner's\n"
               "answer against the memory guard's ceiling, confirmed by allocating the run under the guard\n"
               "and by real steps at the longest length whose step fits --confirm-seconds (or at\n"
               "--confirm-T); on CUDA the peers' ceilings (transformers + PEFT, and with Liger-Kernel) by\n"
               "real steps (bisection, or --peer-points). Writes peak memory against context for all arms\n"
               "(python3 scripts/context_chart.py RESULT.json draws it as SVG).\n\n"
               "options:\n"
               "  --shape S            %s (default qwen3-8b)\n"
               "  --weights W          random-bf16 (cuda default) | random-f32 (cpu default)\n"
               "  --step N             resolution in tokens (default 8192 on cuda, 256 on cpu)\n"
               "  --max N              longest T searched (default 4194304)\n"
               "  --memory-ceiling B   ceiling instead of the guard's rule (\"64M\", \"120G\")\n"
               "  --confirm-seconds S  time budget of the confirming step (default 120; 0 = allocation only)\n"
               "  --confirm-T N        the confirming step at N tokens instead (at most the longest length\n"
               "                       that allocated), with no rate step first and on the search's\n"
               "                       allocation when it is at N (its time then includes the first\n"
               "                       step's one-time setup)\n"
               "  --recompute P        all (default: every layer) | every:K (one checkpoint per K layers,\n"
               "                       the same recompute work), as train takes them\n"
               "  --offload-checkpoints  keep the layer checkpoints in pinned host memory (two slots on\n"
               "                       the device): the longest T then also fits the host's memory\n"
               "                       (the guard's host ceiling less --host-margin)\n"
               "  --host-margin B      host memory left to the process besides the offloaded\n"
               "                       checkpoints (default 4G)\n"
               "  --threads N          CPU threads\n"
               "  --no-peer            skip the peer\n"
               "  --no-liger           skip the second peer, transformers + PEFT with Liger-Kernel\n"
               "  --no-plain-peer      skip the first peer, plain transformers + PEFT\n"
               "  --peer-points LIST   the peers try these lengths only (comma list, in order), no search;\n"
               "                       their ceiling is the longest success below the first failure\n"
               "  --peer-max N         longest T the peer tries (default 1048576)\n"
               "  --peer-path DIR      searched first for torch, transformers, peft (default\n"
               "                       $LONGTUNE_PEER_PATH or /tmp/lt-peer)\n"
               "  --json, --out DIR, --backend cpu|cuda as every bench\n",
               lt_bench_shape_names());
        return 0;
    }
    if (parsed) return parsed;
    const lt_bench_shape *shape = lt_bench_shape_find(shape_name);
    int cuda = !strcmp(c.backend, "cuda");
    lt_device dev = cuda ? LT_DEVICE_CUDA : LT_DEVICE_CPU;
    if (!weights) weights = cuda ? "random-bf16" : "random-f32";
    lt_dtype wdt = !strcmp(weights, "random-bf16") ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    if (!step) step = cuda ? 8192 : 256;
    if (!tmax) tmax = (int64_t)1 << 22;
    if (!peer_max) peer_max = (int64_t)1 << 20;
    if (tmax < step)
        return lt_bench_usage_error("context", NULL, "--max %lld is below --step %lld", (long long)tmax,
                                    (long long)step);
    lt_recompute rc_policy = LT_RECOMPUTE_EVERY;
    int64_t rc_k = 0;
    int prc = lt_bench_parse_recompute("context", recompute, 0, &rc_policy, &rc_k);
    if (prc) return prc;
    char rc_name[32];
    lt_plan_recompute_name(rc_policy, rc_k, rc_name, sizeof rc_name);
    signal(SIGPIPE, SIG_IGN);

    /* The peer first, in its own process, before this one creates a CUDA context. */
    cJSON *peer_lines = NULL, *liger_lines = NULL;
    char failure[2][640] = {"", ""}; /* the plain and the Liger peer's reasons, when they did not start */
    if (peers && cuda) {
        char args[512];
        int n = snprintf(args, sizeof args,
                         "--shape %s --ceiling --ceiling-step %lld --ceiling-start %lld --ceiling-max %lld",
                         shape->name, (long long)step, (long long)step, (long long)peer_max);
        for (int i = 0; i < n_peer_points && n > 0 && (size_t)n < sizeof args; i++)
            n += snprintf(args + n, sizeof args - (size_t)n, "%s%lld", i ? "," : " --ceiling-points ",
                          (long long)peer_points[i]);
        double t0 = lt_time_now();
        if (plain) {
            peer_lines = lt_bench_gpu_peer_run(peer_path, args);
            if (!peer_lines) snprintf(failure[0], sizeof failure[0], "%s", lt_bench_peer_failure());
            fprintf(stderr, "peer ceiling search took %.0f s\n", lt_time_now() - t0);
        }
        if (liger) {
            char largs[600];
            snprintf(largs, sizeof largs, "%s --liger", args);
            t0 = lt_time_now();
            liger_lines = lt_bench_gpu_peer_run(peer_path, largs);
            if (!liger_lines) snprintf(failure[1], sizeof failure[1], "%s", lt_bench_peer_failure());
            fprintf(stderr, "Liger peer ceiling search took %.0f s\n", lt_time_now() - t0);
        }
    } else if (peers) {
        fprintf(stderr, "peer: the context ceiling peer runs on CUDA only (CPU steps at these lengths take hours)\n");
    }
    if (cuda && lt_sys_cuda().count == 0) {
        fprintf(stderr, "longtune bench context: --backend cuda: no CUDA device (or a build without CUDA)\n");
        cJSON_Delete(peer_lines);
        cJSON_Delete(liger_lines);
        return 1;
    }

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    if (threads > 0) lt_ctx_set_threads(ctx, (int)threads);
    ctx_run R;
    memset(&R, 0, sizeof R);
    R.ctx = ctx;
    R.dev = dev;
    R.be = lt_backend_get(dev);
    R.threads = lt_bench_threads(ctx);
    R.lo = (lt_lora_options){.targets = LT_LORA_ALL_TARGETS, .rank = 8, .alpha = 16, .seed = 1};
    R.seed = 0xc0de;
    R.offload = offload;
    R.rc = rc_policy;
    R.rc_k = rc_k;
    int rc = 1;
    cJSON *res = NULL;
    lt_status st = LT_OK;
    lt_model_config cfg = lt_bench_shape_config(shape, wdt);
    R.tok_bytes = 2 * (size_t)tmax * sizeof(int32_t);

    /* 1. the planner, against the guard's ceiling for this device (nothing allocated yet) */
    lt_guard_options go = {.device = dev, .ceiling_bytes = ceiling};
    lt_guard_ceiling gc;
    if ((st = lt_guard_measure(ctx, dev, &go, &gc)) != LT_OK) goto fail;
    int64_t t_plan = 0;
    int found = 0;
    /* on the host, memory held outside the allocator (code, libraries, thread stacks) counts
     * against the ceiling as the guard counts it, so the planner gets what the allocator will */
    uint64_t budget = gc.ceiling_bytes;
    if (!cuda) {
        uint64_t rss = lt_sys_process_rss(), used = lt_mem_get_stats(ctx, dev).used_bytes;
        uint64_t outside = rss > used ? rss - used : 0;
        budget = budget > outside ? budget - outside : 0;
    }
    /* with offload the checkpoints take host memory: the host's guard ceiling less a margin for
     * the rest of the process (the CPU's own run counts them in its one budget) */
    lt_guard_ceiling hc;
    memset(&hc, 0, sizeof hc);
    if (offload && cuda) {
        lt_guard_options gh = {.device = LT_DEVICE_CPU};
        if ((st = lt_guard_measure(ctx, LT_DEVICE_CPU, &gh, &hc)) != LT_OK) goto fail;
        uint64_t rss = lt_sys_process_rss(), keep = rss + host_margin;
        R.host_budget = hc.ceiling_bytes > keep ? (size_t)(hc.ceiling_bytes - keep) : 1;
        fprintf(stderr,
                "host: ceiling %.3f GiB, process %.3f GiB, margin %.3f GiB -> %.3f GiB for offloaded checkpoints\n",
                (double)hc.ceiling_bytes / 1073741824.0, (double)rss / 1073741824.0, (double)host_margin / 1073741824.0,
                (double)R.host_budget / 1073741824.0);
    }
    {
        lt_plan_options po = {.device = dev,
                              .lora = R.lo,
                              .run = run_opts(&R, step),
                              .held_bytes = cuda ? 0 : lt_alloc_accounted_size(dev, R.tok_bytes),
                              .host_budget_bytes = R.host_budget};
        if ((st = lt_plan_search_max(ctx, &cfg, &po, LT_PLAN_SEARCH_SEQ, tmax, budget, &t_plan, &found)) != LT_OK)
            goto fail;
    }
    int64_t t_cand = t_plan / step * step;
    fprintf(
        stderr,
        "planner: ceiling %.3f GiB, %.3f GiB for the allocator (%s) -> longest T %lld, tried at %lld (multiple of %lld)\n",
        (double)gc.ceiling_bytes / 1073741824.0, (double)budget / 1073741824.0, ceiling ? "given" : "guard rule",
        (long long)t_plan, (long long)t_cand, (long long)step);

    res = lt_bench_result_new("context");
    cJSON *jc = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(jc, "backend", c.backend);
    cJSON_AddStringToObject(jc, "shape", shape->name);
    cJSON_AddStringToObject(jc, "model", shape->title);
    cJSON_AddStringToObject(jc, "weights", weights);
    {
        char run[256];
        snprintf(run, sizeof run,
                 "batch 1, LoRA r=8 alpha 16 on q,k,v,o,gate,up,down of all layers, recompute %s (attention "
                 "rerun), flash attention, fused loss, AdamW",
                 rc_policy == LT_RECOMPUTE_EVERY ? "every layer" : rc_name);
        cJSON_AddStringToObject(jc, "run", run);
    }
    cJSON_AddStringToObject(jc, "recompute", rc_name);
    cJSON_AddStringToObject(jc, "saved",
                            dev == LT_DEVICE_CUDA ? "checkpoints and attention tensors in bf16 (the CUDA default)"
                                                  : "checkpoints in f32 (the CPU default)");
    cJSON_AddNumberToObject(jc, "chunk_rows", (double)LT_MODEL_CHUNK_ROWS);
    cJSON_AddBoolToObject(jc, "offload_checkpoints", offload);
    if (offload && cuda) {
        cJSON_AddNumberToObject(jc, "host_total_bytes", (double)hc.total_bytes);
        cJSON_AddNumberToObject(jc, "host_ceiling_bytes", (double)hc.ceiling_bytes);
        cJSON_AddNumberToObject(jc, "host_margin_bytes", (double)host_margin);
        cJSON_AddNumberToObject(jc, "host_offload_budget_bytes", (double)R.host_budget);
    }
    cJSON_AddNumberToObject(jc, "step", (double)step);
    cJSON_AddNumberToObject(jc, "max", (double)tmax);
    cJSON_AddNumberToObject(jc, "memory_total_bytes", (double)gc.total_bytes);
    cJSON_AddNumberToObject(jc, "memory_available_bytes", (double)gc.available_bytes);
    cJSON_AddNumberToObject(jc, "ceiling_bytes", (double)gc.ceiling_bytes);
    cJSON_AddNumberToObject(jc, "planner_budget_bytes", (double)budget);
    cJSON_AddStringToObject(jc, "ceiling_rule",
                            ceiling ? "--memory-ceiling"
                                    : "memory guard: min(0.90 total, in_use + available - cushion)");
    cJSON_AddNumberToObject(jc, "confirm_seconds", confirm_s);
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    cJSON *ours = cJSON_CreateObject();
    cJSON_AddItemToArray(arms, ours);
    cJSON_AddStringToObject(ours, "name", "longtune");
    cJSON_AddNumberToObject(ours, "plan_max_T", (double)t_plan);
    cJSON *pts = cJSON_AddArrayToObject(ours, "points");
    /* the planner's curve at every multiple of step up to its answer (pure, so cheap) */
    cJSON *curve = cJSON_AddArrayToObject(ours, "plan_curve");
    {
        int64_t stride = step * ((t_cand / step + 63) / 64); /* at most ~64 points */
        for (int64_t T = stride; T <= t_cand && stride > 0; T += stride) {
            lt_plan p;
            if (plan_at(&R, &cfg, T, &p) != LT_OK) break;
            cJSON *q = cJSON_CreateObject();
            cJSON_AddNumberToObject(q, "T", (double)T);
            cJSON_AddNumberToObject(q, "plan_bytes", (double)p.peak_bytes);
            if (R.offload && cuda) cJSON_AddNumberToObject(q, "host_plan_bytes", (double)p.offload_bytes);
            cJSON_AddItemToArray(curve, q);
        }
    }
    if (!found || t_cand < step) {
        fprintf(stderr, "planner: not even T=%lld fits the ceiling\n", (long long)step);
        cJSON_AddNumberToObject(ours, "ceiling_T", 0);
        goto peer;
    }

    /* 2. the model under the guard, then allocation at the planner's answer and one step past it */
    if ((st = lt_bench_load_random(ctx, shape, wdt, dev, &R.lo, R.threads, &R.m)) != LT_OK) goto fail;
    {
        int64_t n = 0;
        lt_model_lora_params(R.m, &n);
        R.mom_bytes = (size_t)n * sizeof(float);
        R.mom_m = lt_alloc(ctx, dev, R.mom_bytes, "bench context AdamW m");
        R.mom_v = lt_alloc(ctx, dev, R.mom_bytes, "bench context AdamW v");
        if (R.mom_m) R.be->zero(ctx, R.mom_m, R.mom_bytes);
        if (R.mom_v) R.be->zero(ctx, R.mom_v, R.mom_bytes);
        R.tok = lt_alloc(ctx, LT_DEVICE_CPU, R.tok_bytes, "bench context batch (host)");
        if (!R.mom_m || !R.mom_v || !R.tok) {
            st = LT_ERR_OOM;
            goto fail;
        }
    }
    {
        lt_guard_options g2 = {.device = dev, .ceiling_bytes = gc.ceiling_bytes};
        size_t before = lt_mem_get_stats(ctx, dev).used_bytes;
        if ((st = lt_guard_start(ctx, &g2, &R.guard)) != LT_OK) goto fail;
        R.held_extra = lt_mem_get_stats(ctx, dev).used_bytes - before;
    }
    size_t peak = 0;
    int64_t lo = 0, hi = 0; /* longest T that allocated, shortest that did not (multiples of step) */
    int fits = alloc_at(&R, t_cand, &peak);
    if (fits < 0) goto fail_st;
    {
        lt_plan p;
        if ((st = plan_at(&R, &cfg, t_cand, &p)) != LT_OK) goto fail;
        cJSON_AddItemToArray(pts,
                             host_side(point(t_cand, "allocation", fits, (double)p.peak_bytes, fits ? (double)peak : 0),
                                       &R, &p, fits));
        fprintf(stderr, "allocate T=%lld: %s (plan %.3f GiB, measured %.3f GiB)\n", (long long)t_cand,
                fits ? "fits" : "out of memory", (double)p.peak_bytes / 1073741824.0, (double)peak / 1073741824.0);
    }
    if (fits) {
        lo = t_cand;
        /* upward until a length does not allocate: shows whether the planner left memory unused */
        for (int64_t T = t_cand + step; T <= tmax; T += step) {
            lt_plan p;
            if (plan_at(&R, &cfg, T, &p) != LT_OK) break;
            if (R.offload && p.offload_bytes > R.host_budget) {
                /* pinning past the host's budget would starve the machine: the planner's answer */
                cJSON_AddItemToArray(pts,
                                     host_side(point(T, "planner: will not fit in host memory", 0, (double)p.peak_bytes,
                                                     0),
                                               &R, &p, 0));
                fprintf(stderr, "T=%lld will not fit in host memory: %.3f GiB of offloaded checkpoints > %.3f GiB\n",
                        (long long)T, (double)p.offload_bytes / 1073741824.0, (double)R.host_budget / 1073741824.0);
                hi = T;
                break;
            }
            int f = alloc_at(&R, T, &peak);
            if (f < 0) goto fail_st;
            cJSON_AddItemToArray(pts,
                                 host_side(point(T, "allocation", f, (double)p.peak_bytes, f ? (double)peak : 0), &R,
                                           &p, f));
            fprintf(stderr, "allocate T=%lld: %s\n", (long long)T, f ? "fits" : "out of memory");
            if (!f) {
                hi = T;
                break;
            }
            lo = T;
        }
    } else {
        /* the planner was optimistic: bisect down in steps */
        hi = t_cand;
        while (hi - lo > step) {
            int64_t mid = (lo + hi) / 2 / step * step;
            if (mid <= lo) mid = lo + step;
            int f = alloc_at(&R, mid, &peak);
            if (f < 0) goto fail_st;
            lt_plan p;
            if (plan_at(&R, &cfg, mid, &p) != LT_OK) break;
            cJSON_AddItemToArray(pts,
                                 host_side(point(mid, "allocation", f, (double)p.peak_bytes, f ? (double)peak : 0), &R,
                                           &p, f));
            if (f) lo = mid;
            else hi = mid;
        }
    }
    cJSON_AddNumberToObject(ours, "alloc_ceiling_T", (double)lo);
    if (hi) cJSON_AddNumberToObject(ours, "alloc_fails_T", (double)hi);

    /* 3. real steps: one at `step` to measure the rate, then at the longest length whose
     * estimated step time fits the budget (the ceiling itself when it does). With --confirm-T
     * the one step at that length, with no rate step first, on the allocation the search left
     * when it is at that length (preparing a long offloaded run pins ~100 GiB, most of a minute). */
    int64_t stepped = 0;
    if (confirm_s > 0 && lo >= step) {
        double loss = 0, ms = 0;
        int64_t T = lo;
        lt_plan p;
        cJSON *q;
        if (confirm_T) {
            T = confirm_T <= lo ? confirm_T : lo;
            if (confirm_T > lo)
                fprintf(stderr, "--confirm-T %lld is past the longest length that allocated; stepping at %lld\n",
                        (long long)confirm_T, (long long)lo);
            fprintf(stderr, "step at T=%lld (--confirm-T)\n", (long long)T);
        } else {
            int f = alloc_at(&R, step, &peak);
            if (f != 1) goto fail_st;
            ms = step_at(&R, step, &loss);
            if (ms < 0) goto fail_st;
            ms = step_at(&R, step, &loss); /* the first step pays one-time setup */
            if (ms < 0) goto fail_st;
            peak = lt_mem_get_stats(ctx, dev).peak_bytes;
            if ((st = plan_at(&R, &cfg, step, &p)) != LT_OK) goto fail;
            q = host_side(point(step, "step", 1, (double)p.peak_bytes, (double)peak), &R, &p, 1);
            cJSON_AddNumberToObject(q, "ms", ms);
            cJSON_AddNumberToObject(q, "loss", loss);
            cJSON_AddItemToArray(pts, q);
            stepped = step;
            /* the estimate scales the short step by FLOPs and doubles it: at long T attention,
             * which runs at a lower rate than the projections, takes most of the step */
            const double rate = lt_bench_hw_flops(&cfg, R.lo.rank, step, 1, 0) / (ms * 1e-3);
            while (T > step && 2.0 * lt_bench_hw_flops(&cfg, R.lo.rank, T, 1, 0) / rate > confirm_s) T -= step;
            if (T > step)
                fprintf(stderr, "step at T=%lld (estimated %.0f s from the T=%lld step)\n", (long long)T,
                        2.0 * lt_bench_hw_flops(&cfg, R.lo.rank, T, 1, 0) / rate, (long long)step);
        }
        if (T > stepped) {
            if (R.prepared_T != T) {
                int f = alloc_at(&R, T, &peak);
                if (f != 1) goto fail_st;
            } else {
                lt_mem_reset_peak(ctx, dev);
            }
            ms = step_at(&R, T, &loss);
            if (ms < 0) goto fail_st;
            peak = lt_mem_get_stats(ctx, dev).peak_bytes;
            if ((st = plan_at(&R, &cfg, T, &p)) != LT_OK) goto fail;
            q = host_side(point(T, "step", 1, (double)p.peak_bytes, (double)peak), &R, &p, 1);
            cJSON_AddNumberToObject(q, "ms", ms);
            cJSON_AddNumberToObject(q, "loss", loss);
            cJSON_AddNumberToObject(q, "tokens_per_s", (double)T / (ms * 1e-3));
            cJSON_AddItemToArray(pts, q);
            fprintf(stderr, "step T=%lld: %.1f s, loss %.4f, peak %.3f GiB (plan %.3f GiB)\n", (long long)T, ms * 1e-3,
                    loss, (double)peak / 1073741824.0, (double)p.peak_bytes / 1073741824.0);
            stepped = T;
        }
    }
    cJSON_AddNumberToObject(ours, "step_confirmed_T", (double)stepped);
    cJSON_AddNumberToObject(ours, "ceiling_T", (double)lo);
    cJSON_AddStringToObject(ours, "ceiling_by",
                            stepped == lo ? "planner, allocation and a real step"
                                          : "planner and allocation (real step at step_confirmed_T)");
    fprintf(stderr, "longtune: longest T %lld (planner %lld, allocation %lld, real step at %lld)\n", (long long)lo,
            (long long)t_plan, (long long)lo, (long long)stepped);

peer:
    for (int pl = 0; pl < 2; pl++) {
        const cJSON *lines = pl ? liger_lines : peer_lines;
        if (!lines) {
            if (failure[pl][0]) { /* run and failed (not skipped) */
                cJSON *pa = cJSON_CreateObject();
                cJSON_AddStringToObject(pa, "name", pl ? "torch-peft-liger" : "torch-peft");
                cJSON_AddStringToObject(pa, "error", failure[pl]);
                cJSON_AddItemToArray(arms, pa);
            }
            continue;
        }
        const cJSON *ready = lt_bench_peer_find(lines, "ready", 0);
        const cJSON *cl = cJSON_GetObjectItem(lt_bench_peer_find(lines, "ceiling", 0), "ceiling");
        cJSON *pa = cJSON_CreateObject();
        cJSON_AddStringToObject(pa, "name", pl ? "torch-peft-liger" : "torch-peft");
        if (ready) cJSON_AddItemToObject(pa, "peer", cJSON_Duplicate(ready, 1));
        if (cl) {
            cJSON_AddNumberToObject(pa, "ceiling_T", cJSON_GetNumberValue(cJSON_GetObjectItem(cl, "fits_T")));
            cJSON_AddItemToObject(pa, "fails_T", cJSON_Duplicate(cJSON_GetObjectItem(cl, "fails_T"), 1));
            cJSON_AddItemToObject(pa, "points", cJSON_Duplicate(cJSON_GetObjectItem(cl, "tries"), 1));
            double ours_T = cJSON_GetNumberValue(cJSON_GetObjectItem(ours, "ceiling_T"));
            double theirs_T = cJSON_GetNumberValue(cJSON_GetObjectItem(cl, "fits_T"));
            if (theirs_T > 0 && ours_T > 0) cJSON_AddNumberToObject(pa, "longtune_ceiling_ratio", ours_T / theirs_T);
            /* a length the peer failed at bounds its ceiling from above: the ratios to it are lower bounds */
            const cJSON *ft = cJSON_GetObjectItem(cl, "fails_T");
            double stepped_T = cJSON_GetNumberValue(cJSON_GetObjectItem(ours, "step_confirmed_T"));
            if (cJSON_IsNumber(ft) && cJSON_GetNumberValue(ft) > 0) {
                double f = cJSON_GetNumberValue(ft);
                if (ours_T > 0) cJSON_AddNumberToObject(pa, "longtune_ceiling_over_peer_fails_T", ours_T / f);
                if (stepped_T > 0) cJSON_AddNumberToObject(pa, "longtune_step_over_peer_fails_T", stepped_T / f);
                fprintf(stderr, "%s: fails at T %.0f -> longtune's ceiling %.2fx, its real step %.2fx that length\n",
                        pl ? "Liger peer" : "peer", f, ours_T / f, stepped_T / f);
            }
            int capped = !cJSON_IsNumber(cJSON_GetObjectItem(cl, "fails_T"));
            cJSON_AddBoolToObject(pa, "search_capped", capped); /* no failure up to --peer-max */
            fprintf(stderr, "%s: longest T %.0f%s -> longtune %.2fx%s\n", pl ? "Liger peer" : "peer", theirs_T,
                    capped ? " (search capped by --peer-max)" : "", theirs_T > 0 ? ours_T / theirs_T : NAN,
                    capped ? " at most" : "");
        }
        cJSON_AddItemToArray(arms, pa);
    }
    char tag[128];
    char rc_tag[40];
    lt_bench_recompute_tag(rc_policy, rc_k, rc_tag, sizeof rc_tag);
    snprintf(tag, sizeof tag, "%s-%s%s%s", c.backend, shape->name, offload ? "-offload" : "", rc_tag);
    rc = lt_bench_write(&c, res, tag) == 0 ? 0 : 1;
    res = NULL;
    goto out;
fail_st:
    st = lt_ctx_status(ctx);
fail:
    fprintf(stderr, "longtune bench context: %s\n", st != LT_OK ? lt_ctx_error(ctx) : "failed");
out:
    if (R.guard) lt_guard_stop(R.guard);
    cJSON_Delete(res);
    cJSON_Delete(peer_lines);
    cJSON_Delete(liger_lines);
    if (R.mom_m) lt_free(ctx, dev, R.mom_m, R.mom_bytes);
    if (R.mom_v) lt_free(ctx, dev, R.mom_v, R.mom_bytes);
    if (R.tok) lt_free(ctx, LT_DEVICE_CPU, R.tok, R.tok_bytes);
    lt_model_free(ctx, R.m);
    lt_ctx_free(ctx);
    return rc;
}
