/* `longtune bench scaling --backend cuda`: several GPUs of one host, one process per GPU over NCCL
 * (this command re-run K times with RANK/WORLD_SIZE/LOCAL_RANK and a rendezvous file, as torchrun
 * starts ranks). Each rank loads the shape's random bf16 checkpoint once, then measures, in one
 * invocation so every figure shares the build, weights and machine:
 *   1. data parallel at --seq: tokens/s of one GPU (rank 0 alone) and of K GPUs (each rank its
 *      rows of the same global batch, gradient buckets all-reduced as the backward completes them);
 *   2. the longest context per GPU count: the planner's longest T for one GPU and for K GPUs with
 *      context parallel (Ulysses), each confirmed by allocating the run under the same ceiling;
 *   3. optionally (--cp-seq) one timed context-parallel step per length on K GPUs and, where it
 *      fits, one on a single GPU.
 * Model-level steps (forward/backward, bucketed all-reduce, AdamW), not the trainer's data path. */
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "bench_model.h"
#include "bench_scaling.h"
#include "bench.h"
#include "backend/backend.h"
#include "longtune/alloc.h"
#include "longtune/comm.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/plan.h"
#include "longtune/sysinfo.h"

#define TAG "LT_SCALING_CUDA "
#define MAX_CP 8

typedef struct opts {
    const lt_bench_shape *shape;
    int64_t seq, batch, repeats, warmup, step, tmax;
    int64_t cp_seq[MAX_CP];
    int n_cp;
    int worlds; /* largest world (GPUs used) */
    lt_device dev;
} opts;

typedef struct rank_state {
    lt_ctx *ctx;
    lt_comm *comm;
    int rank, world;
    lt_device dev;
    const lt_backend *be;
    lt_model *m;
    lt_model_config cfg;
    lt_lora_options lo;
    float *mom_m, *mom_v;
    size_t mom_bytes;
    int32_t *tok;
    size_t tok_bytes;
    uint64_t seed;
    int64_t adam_step;
    lt_comm_reducer *red;
} rank_state;

#define SYNOPSIS "longtune bench scaling --backend cuda [options] (--help)"

static int usage(const char *msg) { return lt_bench_usage_error("scaling", SYNOPSIS, "%s", msg); }

static lt_model_run_options run_opts(int64_t B, int64_t T, int least_memory) {
    lt_model_run_options ro = {.B = B,
                               .T = T,
                               .recompute = LT_RECOMPUTE_EVERY,
                               .recompute_attention = least_memory,
                               .attention = LT_ATTENTION_FLASH,
                               .loss = LT_LCE_FUSED,
                               .threads = 0};
    return ro;
}

static lt_status reducer_ready(void *arg, int64_t offset, int64_t count) {
    rank_state *r = arg;
    return lt_comm_reducer_ready(r->ctx, r->red, offset, count);
}

/* One optimizer step on B rows of T random tokens (prepared for them); comm != NULL reduces the
 * gradients over it as the backward completes layers. Returns milliseconds (this rank's wall time,
 * device synchronised at both ends) or < 0 on failure. */
static double step(rank_state *r, int64_t B, int64_t T, lt_comm *comm) {
    int32_t *x = r->tok, *y = r->tok + B * T;
    for (int64_t i = 0; i < B * T; i++) x[i] = (int32_t)(3 + lt_bench_rand_u64(&r->seed) % (uint64_t)(r->cfg.V - 3));
    for (int64_t i = 0; i < B * T; i++) y[i] = (i + 1) % T ? x[i + 1] : LT_IGNORE_INDEX;
    lt_model_batch b = {.B = B, .T = T, .tokens = x, .targets = y};
    int64_t n = 0;
    float *params = lt_model_lora_params(r->m, &n), *grads = lt_model_lora_grads(r->m, &n);
    lt_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = ++r->adam_step};
    if (r->be->synchronize(r->ctx) != LT_OK) return -1;
    double t0 = lt_time_now();
    lt_model_zero_grads(r->m);
    if (comm && r->red) lt_model_set_grad_ready(r->m, reducer_ready, r);
    lt_model_result mr;
    lt_status s = lt_model_forward_backward(r->ctx, r->m, &b, 0.0f, &mr, NULL);
    lt_model_set_grad_ready(r->m, NULL, NULL);
    if (s != LT_OK) return -1;
    if (comm && r->red && lt_comm_reducer_finish(r->ctx, r->red) != LT_OK) return -1;
    r->be->adamw(r->ctx, params, grads, r->mom_m, r->mom_v, n, &hp);
    if (r->be->synchronize(r->ctx) != LT_OK) return -1;
    return (lt_time_now() - t0) * 1e3;
}

/* The largest of every rank's value (times: a step lasts as long as its slowest rank). */
static double world_max(rank_state *r, lt_comm *comm, double v) {
    int K = lt_comm_size(comm);
    double all[64];
    memset(all, 0, sizeof all);
    if (K > 64) return v;
    all[lt_comm_rank(comm)] = v;
    if (lt_comm_allreduce_sum_host(r->ctx, comm, all, K, LT_COMM_F64) != LT_OK) return -1;
    double mx = all[0];
    for (int i = 1; i < K; i++) mx = all[i] > mx ? all[i] : mx;
    for (int i = 0; i < K; i++)
        if (all[i] < 0) return -1;
    return mx;
}

static cJSON *arm(const char *name, int gpus) {
    cJSON *a = cJSON_CreateObject();
    cJSON_AddStringToObject(a, "name", name);
    cJSON_AddNumberToObject(a, "gpus", gpus);
    return a;
}

/* Data parallel on `gpus` GPUs (1: rank 0 alone, the others wait at a barrier): median step time of
 * `repeats` steps after `warmup`, global batch of o->batch rows. */
static lt_status dp_arm(rank_state *r, const opts *o, int gpus, cJSON *arms) {
    int active = gpus == 1 ? r->rank == 0 : 1;
    lt_comm *comm = gpus == 1 ? NULL : r->comm;
    int64_t B = gpus == 1 ? o->batch : o->batch / gpus;
    double ms[64];
    int n = 0;
    lt_status s = LT_OK;
    size_t peak = 0;
    if (active) {
        lt_model_run_options ro = run_opts(B, o->seq, 0);
        s = lt_model_prepare(r->ctx, r->m, &ro);
        lt_mem_reset_peak(r->ctx, r->dev);
        for (int64_t i = 0; s == LT_OK && i < o->warmup + o->repeats && n < 64; i++) {
            double t = step(r, B, o->seq, comm);
            if (comm) t = world_max(r, comm, t);
            if (t < 0) s = lt_ctx_status(r->ctx) != LT_OK ? lt_ctx_status(r->ctx) : LT_ERR_CUDA;
            else if (i >= o->warmup) ms[n++] = t;
        }
        peak = lt_mem_get_stats(r->ctx, r->dev).peak_bytes;
    }
    double ok = s == LT_OK ? 0 : 1;
    LT_TRY(lt_comm_allreduce_sum_host(r->ctx, r->comm, &ok, 1, LT_COMM_F64));
    if (ok > 0)
        return s != LT_OK ? s : lt_error(r->ctx, LT_ERR_CUDA, "data parallel on %d GPUs failed on another rank", gpus);
    if (r->rank == 0) {
        char name[64];
        snprintf(name, sizeof name, "data parallel, %d GPU%s", gpus, gpus > 1 ? "s" : "");
        cJSON *a = arm(name, gpus);
        double med = lt_bench_median(ms, n);
        cJSON_AddNumberToObject(a, "rows_per_gpu", (double)B);
        cJSON_AddNumberToObject(a, "seq_len", (double)o->seq);
        cJSON_AddNumberToObject(a, "median_ms", med);
        cJSON_AddNumberToObject(a, "tokens_per_s", (double)(o->batch * o->seq) / (med / 1e3));
        cJSON_AddNumberToObject(a, "peak_bytes", (double)peak);
        cJSON_AddItemToArray(arms, a);
        fprintf(stderr, "data parallel, %d GPU(s): %.1f ms per step of %lld x %lld tokens\n", gpus, med,
                (long long)o->batch, (long long)o->seq);
    }
    return LT_OK;
}

/* Prepares the run for a context of T on `gpus` GPUs (1: no context parallel, rank 0 alone).
 * Returns 1 when every participating rank allocated it, 0 when some rank ran out of memory, -1 on
 * another error. */
static int cp_alloc(rank_state *r, int gpus, int64_t T, size_t *peak) {
    int active = gpus == 1 ? r->rank == 0 : 1;
    double res[2] = {0, 0}; /* out of memory, other failure */
    *peak = 0;
    if (active) {
        /* Release the previous run first: switching context parallel on sizes its workspace for the
         * run prepared at that moment, which must not be the last (largest) one. */
        lt_model_run_options small = run_opts(1, 2 * gpus, 1), ro = run_opts(1, T / gpus, 1);
        lt_status s = lt_model_set_context_parallel(r->ctx, r->m, NULL);
        if (s == LT_OK) s = lt_model_prepare(r->ctx, r->m, &small);
        if (s == LT_OK) s = lt_model_set_context_parallel(r->ctx, r->m, gpus == 1 ? NULL : r->comm);
        if (s == LT_OK) s = lt_model_prepare(r->ctx, r->m, &ro);
        lt_mem_reset_peak(r->ctx, r->dev);
        *peak = lt_mem_get_stats(r->ctx, r->dev).used_bytes;
        if (s == LT_ERR_OOM) res[0] = 1;
        else if (s != LT_OK) res[1] = 1, fprintf(stderr, "rank %d: %s\n", r->rank, lt_ctx_error(r->ctx));
    }
    if (lt_comm_allreduce_sum_host(r->ctx, r->comm, res, 2, LT_COMM_F64) != LT_OK) return -1;
    return res[1] > 0 ? -1 : res[0] > 0 ? 0 : 1;
}

static lt_status plan_max(rank_state *r, const opts *o, int gpus, uint64_t budget, int64_t *T) {
    lt_plan_options po = {.device = r->dev, .lora = r->lo, .run = run_opts(1, o->step, 1), .cp_size = gpus};
    int found = 0;
    LT_TRY(lt_plan_search_max(r->ctx, &r->cfg, &po, LT_PLAN_SEARCH_SEQ, o->tmax, budget, T, &found));
    *T = found ? *T / o->step * o->step : 0;
    return LT_OK;
}

static double plan_peak(rank_state *r, int gpus, int64_t T) {
    lt_plan_options po = {.device = r->dev, .lora = r->lo, .run = run_opts(1, T, 1), .cp_size = gpus};
    lt_plan p;
    return lt_plan_compute(r->ctx, &r->cfg, &po, &p) == LT_OK ? (double)p.peak_bytes : -1;
}

/* The longest context on `gpus` GPUs: the planner's answer, confirmed by allocation, then one
 * step length further (which should not fit). */
static lt_status ceiling_arm(rank_state *r, const opts *o, int gpus, uint64_t budget, cJSON *arms, int64_t *out) {
    int64_t T = 0;
    LT_TRY(plan_max(r, o, gpus, budget, &T));
    int64_t lo = 0;
    cJSON *pts = cJSON_CreateArray();
    for (int64_t t = T; t > 0 && t <= T + o->step; t += o->step) {
        size_t peak = 0;
        int f = cp_alloc(r, gpus, t, &peak);
        if (f < 0) {
            cJSON_Delete(pts);
            return lt_error(r->ctx, LT_ERR_CUDA, "allocating a context of %lld on %d GPUs failed", (long long)t, gpus);
        }
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "T", (double)t);
        cJSON_AddBoolToObject(p, "allocated", f);
        cJSON_AddNumberToObject(p, "plan_bytes", plan_peak(r, gpus, t));
        if (f) cJSON_AddNumberToObject(p, "rank0_bytes", (double)peak);
        cJSON_AddItemToArray(pts, p);
        if (r->rank == 0)
            fprintf(stderr, "context %lld on %d GPU(s): %s\n", (long long)t, gpus, f ? "allocated" : "out of memory");
        if (!f) break;
        lo = t;
    }
    *out = lo;
    if (r->rank == 0) {
        char name[64];
        snprintf(name, sizeof name, "longest context, %d GPU%s", gpus, gpus > 1 ? "s (Ulysses)" : "");
        cJSON *a = arm(name, gpus);
        cJSON_AddNumberToObject(a, "planner_T", (double)T);
        cJSON_AddNumberToObject(a, "ceiling_T", (double)lo);
        cJSON_AddItemToObject(a, "points", pts);
        cJSON_AddItemToArray(arms, a);
    } else {
        cJSON_Delete(pts);
    }
    return LT_OK;
}

/* One timed step at context T on `gpus` GPUs (after one untimed step at the same shape). */
static lt_status cp_step_arm(rank_state *r, int gpus, int64_t T, cJSON *arms) {
    size_t peak = 0;
    int f = cp_alloc(r, gpus, T, &peak);
    if (f < 0)
        return lt_error(r->ctx, LT_ERR_CUDA, "allocating a context of %lld on %d GPUs failed", (long long)T, gpus);
    double ms = -1;
    int active = gpus == 1 ? r->rank == 0 : 1;
    if (f && active) {
        for (int i = 0; i < 2; i++) {
            ms = step(r, 1, T / gpus, NULL);
            if (gpus > 1) ms = world_max(r, r->comm, ms);
            if (ms < 0) break;
        }
    }
    double bad = f && active && ms < 0;
    LT_TRY(lt_comm_allreduce_sum_host(r->ctx, r->comm, &bad, 1, LT_COMM_F64));
    if (bad > 0) return lt_error(r->ctx, LT_ERR_CUDA, "a step at context %lld on %d GPUs failed", (long long)T, gpus);
    if (r->rank == 0) {
        char name[80];
        snprintf(name, sizeof name, "context %lld, %d GPU%s", (long long)T, gpus, gpus > 1 ? "s (Ulysses)" : "");
        cJSON *a = arm(name, gpus);
        cJSON_AddNumberToObject(a, "seq_len", (double)T);
        if (f) {
            cJSON_AddNumberToObject(a, "median_ms", ms);
            cJSON_AddNumberToObject(a, "tokens_per_s", (double)T / (ms / 1e3));
            cJSON_AddNumberToObject(a, "peak_bytes", (double)lt_mem_get_stats(r->ctx, r->dev).peak_bytes);
        } else {
            cJSON_AddStringToObject(a, "not_run", "out of memory at allocation");
        }
        cJSON_AddItemToArray(arms, a);
        fprintf(stderr, "context %lld on %d GPU(s): %s %.0f ms\n", (long long)T, gpus, f ? "step" : "does not fit", ms);
    }
    return LT_OK;
}

static int child(const opts *o) {
    lt_log_set_level(LT_LOG_WARN);
    rank_state R;
    memset(&R, 0, sizeof R);
    lt_ctx *ctx = R.ctx = lt_ctx_new();
    if (!ctx) return 1;
    lt_comm_options co;
    memset(&co, 0, sizeof co);
    co.backend = o->dev == LT_DEVICE_CUDA ? LT_COMM_NCCL : LT_COMM_AUTO;
    lt_status s = lt_comm_init(ctx, &co, &R.comm);
    cJSON *arms = cJSON_CreateArray();
    lt_guard *guard = NULL;
    if (s != LT_OK) goto fail;
    R.rank = lt_comm_rank(R.comm), R.world = lt_comm_size(R.comm), R.dev = o->dev;
    R.be = lt_backend_get(R.dev);
    R.seed = 0x5ca1e + (uint64_t)R.rank;
    R.lo = (lt_lora_options){.targets = LT_LORA_ALL_TARGETS, .rank = 8, .alpha = 16, .seed = 1};
    R.cfg = lt_bench_shape_config(o->shape, LT_DTYPE_BF16);
    R.lo.num_layers = R.cfg.L;
    /* The ceiling before the weights arrive (as bench context measures it), NCCL's buffers in. */
    lt_guard_options go = {.device = R.dev};
    lt_guard_ceiling gc;
    if ((s = lt_guard_measure(ctx, R.dev, &go, &gc)) != LT_OK) goto fail;
    {
        /* The parent wrote the checkpoint; rank 0 checks it (a cheap stamp read) for children started
         * another way (mpirun with --device cpu), the others wait. The seed is the one
         * lt_bench_load_random asks for, so the loads below reuse the folder, never rewrite it. */
        char dir[1024];
        int written = 0;
        double bad = 0;
        lt_bench_random_dir(o->shape, LT_DTYPE_BF16, dir, sizeof dir);
        if (R.rank == 0)
            bad = lt_bench_random_checkpoint(ctx, dir, o->shape, LT_DTYPE_BF16, 0x7ea1ULL, lt_bench_threads(NULL),
                                             &written) != 0;
        if ((s = lt_comm_allreduce_sum_host(ctx, R.comm, &bad, 1, LT_COMM_F64)) != LT_OK) goto fail;
        if (bad > 0) {
            s = lt_error(ctx, LT_ERR_IO, "the random checkpoint in %s could not be written", dir);
            goto fail;
        }
    }
    if ((s = lt_bench_load_random(ctx, o->shape, LT_DTYPE_BF16, R.dev, &R.lo, 1, &R.m)) != LT_OK) goto fail;
    int64_t n = 0;
    float *grads = lt_model_lora_grads(R.m, &n);
    R.mom_bytes = (size_t)n * sizeof(float);
    R.mom_m = lt_alloc(ctx, R.dev, R.mom_bytes, "bench scaling AdamW m");
    R.mom_v = lt_alloc(ctx, R.dev, R.mom_bytes, "bench scaling AdamW v");
    int64_t tok_max = o->batch * o->seq;
    for (int i = 0; i < o->n_cp; i++) tok_max = o->cp_seq[i] > tok_max ? o->cp_seq[i] : tok_max;
    R.tok_bytes = 2 * (size_t)tok_max * sizeof(int32_t);
    R.tok = lt_alloc(ctx, LT_DEVICE_CPU, R.tok_bytes, "bench scaling batch");
    if (!R.mom_m || !R.mom_v || !R.tok) {
        s = LT_ERR_OOM;
        goto fail;
    }
    R.be->zero(ctx, R.mom_m, R.mom_bytes);
    R.be->zero(ctx, R.mom_v, R.mom_bytes);
    /* Buckets of whole layers, about 4 MiB, as the trainer cuts them. */
    int64_t per = n / R.cfg.L, bucket = per * ((1 << 20) / per > 0 ? (1 << 20) / per : 1);
    if ((s = lt_comm_reducer_init(ctx, R.comm, grads, n, bucket, &R.red)) != LT_OK) goto fail;

    if ((s = dp_arm(&R, o, 1, arms)) != LT_OK) goto fail;
    if (R.world > 1 && (s = dp_arm(&R, o, R.world, arms)) != LT_OK) goto fail;
    /* The allocator's limit at the guard's ceiling, so an allocation past it fails as OOM. */
    lt_guard_options g2 = {.device = R.dev, .ceiling_bytes = gc.ceiling_bytes, .no_watchdog = 1};
    if ((s = lt_guard_start(ctx, &g2, &guard)) != LT_OK) goto fail;
    /* Every rank plans against the smallest ceiling of the world (rank 0's device also holds the
     * parent's CUDA context), so all ranks try the same lengths. */
    double least = 0, all[64];
    memset(all, 0, sizeof all);
    if (R.world <= 64) {
        all[R.rank] = (double)gc.ceiling_bytes;
        if (lt_comm_allreduce_sum_host(ctx, R.comm, all, R.world, LT_COMM_F64) == LT_OK)
            for (int i = 0; i < R.world; i++) least = i == 0 || all[i] < least ? all[i] : least;
    }
    if (!(least > 0)) {
        s = lt_error(ctx, LT_ERR_CUDA, "the ranks' memory ceilings could not be exchanged");
        goto fail;
    }
    int64_t c1 = 0, cK = 0;
    if ((s = ceiling_arm(&R, o, 1, (uint64_t)least, arms, &c1)) != LT_OK) goto fail;
    if (R.world > 1 && (s = ceiling_arm(&R, o, R.world, (uint64_t)least, arms, &cK)) != LT_OK) goto fail;
    for (int i = 0; i < o->n_cp; i++) {
        if (R.world > 1 && (s = cp_step_arm(&R, R.world, o->cp_seq[i], arms)) != LT_OK) goto fail;
        if (o->cp_seq[i] <= c1 && (s = cp_step_arm(&R, 1, o->cp_seq[i], arms)) != LT_OK) goto fail;
    }
    if (R.rank == 0) {
        char *text = cJSON_PrintUnformatted(arms);
        printf(TAG "{\"ceiling_bytes\": %.0f, \"arms\": %s}\n", least, text ? text : "[]");
        fflush(stdout);
        cJSON_free(text);
    }
    cJSON_Delete(arms);
    lt_guard_stop(guard);
    lt_model_set_context_parallel(ctx, R.m, NULL);
    lt_comm_reducer_free(ctx, R.red);
    lt_free(ctx, R.dev, R.mom_m, R.mom_bytes);
    lt_free(ctx, R.dev, R.mom_v, R.mom_bytes);
    lt_free(ctx, LT_DEVICE_CPU, R.tok, R.tok_bytes);
    lt_model_free(ctx, R.m);
    lt_comm_free(ctx, R.comm);
    lt_ctx_free(ctx);
    return 0;
fail:
    fprintf(stderr, "longtune bench scaling: rank %d: %s\n", R.rank, lt_ctx_error(ctx));
    cJSON_Delete(arms);
    lt_comm_abort(R.comm, 1);
    return 1;
}

int lt_bench_scaling_cuda(int argc, char **argv) {
    lt_bench_common bc;
    lt_bench_common_init(&bc);
    bc.repeats = 3;
    opts o;
    memset(&o, 0, sizeof o);
    o.seq = 8192, o.batch = 0, o.step = 8192, o.tmax = (int64_t)1 << 21, o.dev = LT_DEVICE_CUDA;
    int is_child = 0;
    int64_t gpus = 0;
    int64_t parent_pid = 0;
    const char *shape_name = "qwen3-8b", *device = "cuda";
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--child", &is_child, 1),
        LT_BENCH_I64("--parent-pid", &parent_pid, 1, INT32_MAX),
        LT_BENCH_FN("--shape", &shape_name, lt_bench_parse_shape),
        LT_BENCH_I64("--gpus", &gpus, 1, 8),
        LT_BENCH_I64("--seq", &o.seq, 16, 1 << 20),
        LT_BENCH_I64("--batch", &o.batch, 1, 4096),
        LT_BENCH_I64("--step", &o.step, 16, 1 << 20),
        LT_BENCH_I64("--max", &o.tmax, 16, (int64_t)1 << 26),
        LT_BENCH_LIST("--cp-seq", o.cp_seq, &o.n_cp, MAX_CP, 16, (int64_t)1 << 24),
        LT_BENCH_CHOICE("--device", &device, "cpu|cuda"), /* children: cpu runs the same phases on the host */
    };
    const int parsed =
        lt_bench_parse_args("scaling", SYNOPSIS, argc, argv, &bc, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench scaling --backend cuda [options]\n\n"
               "Several GPUs of this host, one process per GPU over NCCL (NVLink multicast off): data-parallel\n"
               "tokens/s on 1 and K GPUs, and the longest context on 1 and K GPUs (planner answer confirmed by\n"
               "allocation; context parallel = Ulysses), all in one invocation on the shape's random bf16\n"
               "checkpoint ($LONGTUNE_BENCH_WEIGHTS).\n\n"
               "options:\n"
               "  --shape NAME     %s (default qwen3-8b)\n"
               "  --gpus K         GPUs to use (default: all visible, at most 8)\n"
               "  --seq T          data-parallel row length (default 8192)\n"
               "  --batch B        data-parallel global rows per step (default K)\n"
               "  --step S         granularity of the context search (default 8192)\n"
               "  --max T          longest context tried (default 2097152)\n"
               "  --cp-seq LIST    also time one context-parallel step at each length (default none)\n"
               "Repeats count timed data-parallel steps (default 3, after --warmup steps).\n" LT_BENCH_COMMON_HELP,
               lt_bench_shape_names());
        return 0;
    }
    if (parsed) return parsed;
    if (o.step % 16) return usage("bad --step: want a multiple of 16");
    o.shape = lt_bench_shape_find(shape_name);
    o.dev = strcmp(device, "cpu") ? LT_DEVICE_CUDA : LT_DEVICE_CPU;
    if (parent_pid) {
        /* A rank started by the parent below dies with it (a timeout that kills the parent must
         * not leave ranks holding the GPUs). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != (pid_t)parent_pid) return 1; /* the parent is already gone */
    }
    o.repeats = bc.repeats, o.warmup = bc.warmup;
    if (is_child) {
        int K = 1;
        lt_comm_env_world(NULL, &K, NULL);
        const char *ws = getenv("WORLD_SIZE");
        if (ws) K = atoi(ws);
        if (!o.batch) o.batch = K;
        if (o.batch % K) return usage("--batch must be a multiple of the GPU count");
        return child(&o);
    }
    lt_cuda_device_info cu = lt_sys_cuda();
    if (!cu.count) {
        fprintf(stderr, "longtune bench scaling: no CUDA device\n");
        return 1;
    }
    int K = gpus ? (int)gpus : (cu.count < 8 ? cu.count : 8);
    if (K > cu.count) return usage("--gpus asks for more GPUs than are visible");
    if (!o.batch) o.batch = K;
    if (o.batch % K) return usage("--batch must be a multiple of the GPU count");
    lt_log_set_level(LT_LOG_WARN);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    /* The checkpoint once, before the ranks start (they only read it). */
    char dir[1024];
    lt_bench_random_dir(o.shape, LT_DTYPE_BF16, dir, sizeof dir);
    int written = 0;
    if (lt_bench_random_checkpoint(ctx, dir, o.shape, LT_DTYPE_BF16, 0x7ea1ULL, lt_bench_threads(NULL), &written)) {
        lt_ctx_free(ctx);
        return 1;
    }
    char self[1024], rdv[] = "/tmp/lt-scaling-XXXXXX", cmd[8192], rest[4096] = "";
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0 || !mkdtemp(rdv)) {
        lt_ctx_free(ctx);
        return 1;
    }
    self[sl] = '\0';
    size_t used = 0;
    used += (size_t)snprintf(rest + used, sizeof rest - used,
                             " --shape %s --seq %lld --batch %lld --step %lld --max %lld --repeats %lld --warmup %lld",
                             o.shape->name, (long long)o.seq, (long long)o.batch, (long long)o.step, (long long)o.tmax,
                             (long long)o.repeats, (long long)o.warmup);
    for (int i = 0; i < o.n_cp && used < sizeof rest; i++)
        used +=
            (size_t)snprintf(rest + used, sizeof rest - used, "%s%lld", i ? "," : " --cp-seq ", (long long)o.cp_seq[i]);
    FILE *p[8] = {NULL};
    for (int r = K - 1; r >= 0; r--) {
        snprintf(
            cmd, sizeof cmd,
            "RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LONGTUNE_RENDEZVOUS='%s/nccl.id' NCCL_NVLS_ENABLE=0 exec '%s' bench "
            "scaling --backend cuda --child --parent-pid %ld%s%s",
            r, K, r, rdv, self, (long)getpid(), rest, r ? " >&2" : "");
        p[r] = popen(cmd, "r");
    }
    char line[1 << 16];
    cJSON *got = NULL;
    while (p[0] && fgets(line, sizeof line, p[0]))
        if (!got && !strncmp(line, TAG, strlen(TAG))) got = cJSON_Parse(line + strlen(TAG));
    int bad = 0;
    for (int r = 0; r < K; r++) bad |= !p[r] || pclose(p[r]) != 0;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", rdv);
    if (system(cmd) != 0) fprintf(stderr, "longtune bench scaling: could not remove %s\n", rdv);
    if (bad || !got) {
        fprintf(stderr, "longtune bench scaling: a rank failed\n");
        cJSON_Delete(got);
        lt_ctx_free(ctx);
        return 1;
    }
    cJSON *result = lt_bench_result_new("scaling");
    cJSON *config = cJSON_AddObjectToObject(result, "config");
    cJSON_AddStringToObject(config, "shape", o.shape->title);
    cJSON_AddStringToObject(config, "weights", "random bf16 checkpoint (LONGTUNE_BENCH_WEIGHTS)");
    cJSON_AddNumberToObject(config, "gpus", K);
    cJSON_AddNumberToObject(config, "dp_seq_len", (double)o.seq);
    cJSON_AddNumberToObject(config, "dp_global_rows", (double)o.batch);
    cJSON_AddNumberToObject(config, "timed_steps", (double)o.repeats);
    cJSON_AddStringToObject(config, "lora", "r=8 on all seven projections of every layer, AdamW");
    cJSON_AddStringToObject(config, "data_parallel",
                            "recompute every layer, attention output kept; gradient buckets "
                            "(whole layers, ~4 MiB) all-reduced on NCCL's stream as the "
                            "backward completes them; a step lasts as long as its slowest rank");
    cJSON_AddStringToObject(config, "context",
                            "least memory (recompute every layer and its attention); context parallel = Ulysses "
                            "(all-to-all over heads, zig-zag split); ceiling = planner's longest T under the memory "
                            "guard's ceiling (multiples of --step), confirmed by allocating the run under that limit");
    cJSON_AddNumberToObject(config, "step", (double)o.step);
    cJSON_AddStringToObject(config, "transport", "NCCL, one process per GPU, NCCL_NVLS_ENABLE=0");
    const cJSON *cb = cJSON_GetObjectItem(got, "ceiling_bytes");
    if (cJSON_IsNumber(cb)) cJSON_AddNumberToObject(config, "ceiling_bytes", cb->valuedouble);
    cJSON *arms = cJSON_DetachItemFromObject(got, "arms");
    cJSON_AddItemToObject(result, "arms", arms);
    /* The bars: data-parallel efficiency and context growth against one GPU. */
    double tps1 = 0, tpsK = 0, c1 = 0, cK = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, arms) {
        const cJSON *g = cJSON_GetObjectItem(a, "gpus"), *t = cJSON_GetObjectItem(a, "tokens_per_s"),
                    *c = cJSON_GetObjectItem(a, "ceiling_T"), *nm = cJSON_GetObjectItem(a, "name");
        int dp = cJSON_IsString(nm) && !strncmp(nm->valuestring, "data parallel", 13);
        if (dp && cJSON_IsNumber(t)) *(g->valueint == 1 ? &tps1 : &tpsK) = t->valuedouble;
        if (cJSON_IsNumber(c)) *(g->valueint == 1 ? &c1 : &cK) = c->valuedouble;
    }
    cJSON *sum = cJSON_AddObjectToObject(result, "summary");
    if (K > 1 && tps1 > 0 && tpsK > 0) {
        cJSON_AddNumberToObject(sum, "dp_efficiency", tpsK / (K * tps1));
        cJSON_AddStringToObject(sum, "dp_bar", ">= 0.90");
    }
    if (K > 1 && c1 > 0) {
        cJSON_AddNumberToObject(sum, "context_ratio_vs_K_times_one_gpu", cK / (K * c1));
        cJSON_AddStringToObject(sum, "context_bar", ">= 0.80");
    }
    cJSON_Delete(got);
    char tag[64];
    snprintf(tag, sizeof tag, "cuda-%s-%dgpu", o.shape->name, K);
    int rc = lt_bench_write(&bc, result, tag) ? 1 : 0;
    lt_ctx_free(ctx);
    return rc;
}
