/* `longtune bench train`: whole LoRA training steps (batch 1, LoRA r=8 on all seven projections of
 * every layer, recompute every layer, flash attention, fused loss, AdamW) of a model shape —
 * SmolLM2-135M (default) or Qwen3-8B, random weights of the real shape or a real file — on the CPU
 * or CUDA backend: median step time, real tokens/s, the accounting allocator's peak against the
 * planner's prediction, and MFU (FLOP count in bench_model.h). The peer runs in the same
 * invocation: on the CPU PyTorch + transformers + PEFT (bench/peers/train_torch_cpu.py) step by
 * step, interleaved with ours so a loaded machine slows both alike; on CUDA
 * bench/peers/train_peft_gpu.py after our arm has freed the device. It calls the library's model
 * and planner; it does not reimplement any op. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "bench_model.h"
#include "bench.h"
#include "backend/backend.h"
#include "backend/prof.h"
#include "train/step_graph.h"
#include "longtune/alloc.h"
#include "longtune/guard.h"
#include "longtune/log.h"
#include "longtune/model.h"
#include "longtune/plan.h"
#include "longtune/train.h"
#include "longtune/sysinfo.h"

#define MAX_SEQS 8

/* The peer process: stdin/stdout pipes to bench/peers/train_torch_cpu.py. */
typedef struct peer {
    pid_t pid;
    FILE *to, *from;
    cJSON *hello; /* its "ready" line */
} peer;

static cJSON *peer_read(peer *p) {
    char line[4096];
    while (fgets(line, sizeof line, p->from)) {
        cJSON *j = cJSON_Parse(line);
        if (j) return j;
    }
    return NULL;
}

#define PEER_EXIT_MS 3000

static void peer_close(peer *p) {
    if (p->to) {
        fputs("quit\n", p->to);
        fclose(p->to);
    }
    if (p->from) fclose(p->from);
    if (p->pid > 0) {
        /* Its steps are done; give the interpreter PEER_EXIT_MS to exit, then end it: on the
         * device the peer had not exited 15 s after its last step, and a bench
         * under a time cap then lost its result file. */
        int waited = 0;
        while (waitpid(p->pid, NULL, WNOHANG) == 0) {
            if (waited >= PEER_EXIT_MS) {
                kill(p->pid, SIGKILL);
                waitpid(p->pid, NULL, 0);
                break;
            }
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
            waited += 50;
        }
    }
    cJSON_Delete(p->hello);
    memset(p, 0, sizeof *p);
}

/* Starts the peer on model_dir with PYTHONPATH = peer_path first; 0 once it reported ready. */
static int peer_open(peer *p, const char *script, const char *peer_path, const char *model_dir, int ckpt, int threads,
                     int rank, double alpha, uint64_t seed, int bf16) {
    memset(p, 0, sizeof *p);
    int in[2], out[2];
    if (pipe(in) != 0) return -1;
    if (pipe(out) != 0) {
        close(in[0]), close(in[1]);
        return -1;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]), close(in[1]), close(out[0]), close(out[1]);
        char pp[4096], th[16], rk[16], al[32], sd[32];
        const char *old = getenv("PYTHONPATH");
        snprintf(pp, sizeof pp, "%s%s%s", peer_path, old && *old ? ":" : "", old && *old ? old : "");
        setenv("PYTHONPATH", pp, 1);
        snprintf(th, sizeof th, "%d", threads);
        setenv("OMP_NUM_THREADS", th, 1);
        snprintf(rk, sizeof rk, "%d", rank);
        snprintf(al, sizeof al, "%g", alpha);
        snprintf(sd, sizeof sd, "%llu", (unsigned long long)seed);
        execlp("python3", "python3", script, model_dir, th, rk, al, sd, ckpt ? "checkpointing" : "no-checkpointing",
               bf16 ? "bf16" : "f32", (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->pid = pid;
    p->to = fdopen(in[1], "w");
    p->from = fdopen(out[0], "r");
    if (!p->to || !p->from) {
        peer_close(p);
        return -1;
    }
    p->hello = peer_read(p);
    if (!cJSON_IsTrue(cJSON_GetObjectItem(p->hello, "ready"))) {
        peer_close(p);
        return -1;
    }
    return 0;
}

/* One peer step of T tokens: its milliseconds (< 0 when the peer failed), process CPU ms, loss and
 * max RSS. */
static double peer_step(peer *p, int64_t T, double *cpu_ms, double *loss, double *rss) {
    if (fprintf(p->to, "%lld\n", (long long)T) < 0 || fflush(p->to) != 0) return -1;
    cJSON *j = peer_read(p);
    const cJSON *ms = cJSON_GetObjectItem(j, "ms");
    double r = cJSON_IsNumber(ms) ? ms->valuedouble : -1;
    const cJSON *l = cJSON_GetObjectItem(j, "loss"), *m = cJSON_GetObjectItem(j, "max_rss_bytes");
    const cJSON *cm = cJSON_GetObjectItem(j, "cpu_ms");
    *cpu_ms = cJSON_IsNumber(cm) ? cm->valuedouble : NAN;
    if (cJSON_IsNumber(l)) *loss = l->valuedouble;
    if (cJSON_IsNumber(m)) *rss = fmax(*rss, m->valuedouble);
    cJSON_Delete(j);
    return r;
}

static int python_imports_peer(const char *peer_path) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "PYTHONPATH='%s'${PYTHONPATH:+:$PYTHONPATH} python3 -c 'import torch, transformers, peft' >/dev/null 2>&1",
             peer_path);
    return system(cmd) == 0;
}

/* The op profiler's totals of `steps` timed steps into arm["profile"] (ms per step per phase and
 * per op of each phase) and a table on stderr, ops sorted by their time over all phases. */
static void add_profile(cJSON *arm, const lt_prof_totals *t, double step_ms) {
    double per = t->steps ? 1.0 / (double)t->steps : 0.0;
    cJSON *jp = cJSON_AddObjectToObject(arm, "profile");
    cJSON_AddNumberToObject(jp, "steps", (double)t->steps);
    cJSON_AddNumberToObject(jp, "dropped_records", (double)t->dropped);
    cJSON_AddStringToObject(jp, "units",
                            "device milliseconds per step (CUDA events around every op; phases from "
                            "one phase change to the next, so phase minus its ops = gaps)");
    cJSON *ph = cJSON_AddObjectToObject(jp, "phases");
    cJSON *ops = cJSON_AddObjectToObject(jp, "ops");
    double op_total[LT_PROF_OP_COUNT_] = {0};
    int64_t op_calls[LT_PROF_OP_COUNT_] = {0};
    fprintf(stderr, "  profile (ms/step over %lld steps; step %.1f ms):", (long long)t->steps, step_ms);
    for (int p = 0; p < LT_PROF_PHASE_COUNT_; p++) {
        double sum = 0;
        cJSON *o = cJSON_AddObjectToObject(ops, lt_prof_phase_name((lt_prof_phase)p));
        for (int k = 0; k < LT_PROF_OP_COUNT_; k++) {
            if (!t->calls[p][k]) continue;
            cJSON *e = cJSON_AddObjectToObject(o, lt_prof_op_name((lt_prof_op)k));
            cJSON_AddNumberToObject(e, "ms", t->op_ms[p][k] * per);
            cJSON_AddNumberToObject(e, "calls", (double)t->calls[p][k] * per);
            sum += t->op_ms[p][k];
            op_total[k] += t->op_ms[p][k] * per;
            op_calls[k] += t->calls[p][k];
        }
        cJSON *e = cJSON_AddObjectToObject(ph, lt_prof_phase_name((lt_prof_phase)p));
        cJSON_AddNumberToObject(e, "ms", t->phase_ms[p] * per);
        cJSON_AddNumberToObject(e, "ops_ms", sum * per);
        fprintf(stderr, " %s %.1f (ops %.1f)", lt_prof_phase_name((lt_prof_phase)p), t->phase_ms[p] * per, sum * per);
    }
    fputc('\n', stderr);
    int order[LT_PROF_OP_COUNT_];
    for (int k = 0; k < LT_PROF_OP_COUNT_; k++) order[k] = k;
    for (int a = 1; a < LT_PROF_OP_COUNT_; a++)
        for (int b = a; b > 0 && op_total[order[b]] > op_total[order[b - 1]]; b--) {
            int x = order[b];
            order[b] = order[b - 1], order[b - 1] = x;
        }
    for (int i = 0; i < LT_PROF_OP_COUNT_; i++) {
        int k = order[i];
        if (!op_calls[k]) continue;
        fprintf(stderr, "    %-15s %9.2f ms %6.1f%%  %7.0f calls  [", lt_prof_op_name((lt_prof_op)k), op_total[k],
                step_ms > 0 ? 100.0 * op_total[k] / step_ms : 0.0, (double)op_calls[k] * per);
        for (int p = 0; p < LT_PROF_PHASE_COUNT_; p++)
            if (t->calls[p][k]) fprintf(stderr, " %s %.2f", lt_prof_phase_name((lt_prof_phase)p), t->op_ms[p][k] * per);
        fprintf(stderr, " ]\n");
    }
}

/* Adds the CUDA peer's arms (one per T it ran) to `arms`, with ratios against our arm of the same T. */
static void add_gpu_peer_arms(cJSON *arms, const cJSON *lines, const char *prefix, const lt_model_config *cfg,
                              int64_t rank, const int64_t *seqs, int n_seqs) {
    for (int si = 0; si < n_seqs; si++) {
        const cJSON *j = lt_bench_peer_find(lines, "median_ms", seqs[si]);
        char name[64];
        snprintf(name, sizeof name, "%s-T%lld", prefix, (long long)seqs[si]);
        cJSON *pa = cJSON_CreateObject();
        cJSON_AddStringToObject(pa, "name", name);
        cJSON_AddNumberToObject(pa, "T", (double)seqs[si]);
        if (!j) {
            cJSON_AddBoolToObject(pa, "oom", lt_bench_peer_find(lines, "oom", seqs[si]) != NULL);
            cJSON_AddItemToArray(arms, pa);
            continue;
        }
        double ms = cJSON_GetObjectItem(j, "median_ms")->valuedouble;
        const char *keys[] = {"median_ms", "tokens_per_s", "max_allocated_bytes", "max_reserved_bytes", "loss"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            const cJSON *v = cJSON_GetObjectItem(j, keys[k]);
            if (cJSON_IsNumber(v)) cJSON_AddNumberToObject(pa, keys[k], v->valuedouble);
        }
        cJSON_AddItemToObject(pa, "step_ms", cJSON_Duplicate(cJSON_GetObjectItem(j, "step_ms"), 1));
        double mf = lt_bench_model_flops(cfg, rank, seqs[si]) / (ms * 1e-3);
        cJSON_AddNumberToObject(pa, "tflops", mf * 1e-12);
        cJSON_AddNumberToObject(pa, "mfu", mf / LT_BENCH_H200_BF16_PEAK);
        cJSON_AddNumberToObject(pa, "peak_bytes", cJSON_GetNumberValue(cJSON_GetObjectItem(j, "max_allocated_bytes")));
        /* ratios against our arm of the same T */
        const cJSON *a;
        char ours[64];
        snprintf(ours, sizeof ours, "longtune-T%lld", (long long)seqs[si]);
        cJSON_ArrayForEach(a, arms) {
            if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(a, "name"))
                           ? cJSON_GetStringValue(cJSON_GetObjectItem(a, "name"))
                           : "",
                       ours))
                continue;
            double oms = cJSON_GetNumberValue(cJSON_GetObjectItem(a, "median_ms"));
            double opk = cJSON_GetNumberValue(cJSON_GetObjectItem(a, "peak_bytes"));
            double ppk = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "max_allocated_bytes"));
            cJSON_AddNumberToObject(pa, "longtune_speedup", ms / oms);
            if (ppk > 0) cJSON_AddNumberToObject(pa, "longtune_memory_ratio", opk / ppk);
            fprintf(
                stderr,
                "T=%lld %s: %.0f ms/step, %.0f tokens/s, peak %.2f GiB -> longtune %.2fx its tokens/s, %.2fx its memory\n",
                (long long)seqs[si], prefix, ms, (double)seqs[si] / (ms * 1e-3), ppk / 1073741824.0, ms / oms,
                ppk > 0 ? opk / ppk : NAN);
        }
        cJSON_AddItemToArray(arms, pa);
    }
}

int lt_bench_train(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    c.repeats = 3;
    c.warmup = 2;
    int offload_lo = 0, offload_hi = 0; /* checkpoint offload off and/or on, per length */
    int64_t seqs[MAX_SEQS];
    int bf16x = 0; /* --bf16-products */
    int n_seqs = 0, threads = 0, rank = 8, peers = 1, liger = 1, guard_off = 0, profile = 0, recompute_attn = -1,
        graph = 1;
    int64_t rerun_layers = 0; /* --recompute-attention-layers */
    const char *weights = NULL, *shape_name = "smollm2-135m", *peer_path = getenv("LONGTUNE_PEER_PATH");
    if (!peer_path) peer_path = "/tmp/lt-peer";
    int offload_mode = 0;          /* 1: --offload-checkpoints, 2: --offload-both */
    int64_t chunk_rows = 0;        /* 0: the library's LT_MODEL_CHUNK_ROWS */
    const char *recompute = "all"; /* both arms checkpoint every layer unless --recompute says otherwise */
    const char *graph_arg = "on";
    const char *base_arg = "file", *fp8_skip = NULL;
    const char *act_arg = "auto"; /* --activations */
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--no-peer", &peers, 0),
        LT_BENCH_SET("--no-liger", &liger, 0),
        LT_BENCH_SET("--profile", &profile, 1),
        LT_BENCH_SET("--no-memory-guard", &guard_off, 1),
        LT_BENCH_SET("--offload-checkpoints", &offload_mode, 1),
        LT_BENCH_SET("--offload-both", &offload_mode, 2),
        LT_BENCH_SET("--bf16-products", &bf16x, 1),
        LT_BENCH_LIST("--seq", seqs, &n_seqs, MAX_SEQS, 2, 1 << 22),
        LT_BENCH_FN("--shape", &shape_name, lt_bench_parse_shape),
        LT_BENCH_STR("--weights", &weights),
        LT_BENCH_INT("--rank", &rank, 1, 1024),
        LT_BENCH_INT("--threads", &threads, 1, 4096),
        LT_BENCH_STR("--peer-path", &peer_path),
        LT_BENCH_CHOICE("--cuda-graph", &graph_arg, "on|off"),
        LT_BENCH_CHOICE("--base-dtype", &base_arg, "file|fp8"),
        LT_BENCH_CHOICE("--activations", &act_arg, "auto|f32|gu-f32"),
        LT_BENCH_STR("--fp8-skip", &fp8_skip),
        LT_BENCH_INT("--recompute-attention", &recompute_attn, 0, 1),
        LT_BENCH_I64("--recompute-attention-layers", &rerun_layers, 0, 1 << 16),
        LT_BENCH_I64("--chunk-rows", &chunk_rows, 1, 1 << 22),
        LT_BENCH_STR("--recompute", &recompute),
    };
    const int parsed =
        lt_bench_parse_args("train", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf(
            "usage: longtune bench train [options]\n\n"
            "LoRA training steps (batch 1, r=8 on q,k,v,o,gate,up,down of every layer, recompute every\n"
            "layer, flash attention, fused loss, AdamW): median step ms, tokens/s, peak bytes vs the\n"
            "plan, MFU, and the PyTorch + transformers + PEFT peer on the same shape in the same run\n"
            "(CPU: interleaved step by step on the same weights; CUDA: bench/peers/train_peft_gpu.py\n"
            "after our arm, bf16, SDPA, gradient checkpointing).\n\n"
            "options:\n"
            "  --shape S        %s (default smollm2-135m)\n"
            "  --seq LIST       tokens per step, comma list (default: cpu 512,2048; cuda smollm2-135m\n"
            "                   2048,8192,32768, qwen3-8b 8192,32768)\n"
            "  --weights W      random-f32 (cpu default) | random-bf16 (cuda default): random weights of\n"
            "                   the real shape, streamed once into $LONGTUNE_BENCH_WEIGHTS (default\n"
            "                   /tmp/longtune-bench-weights) and reused; or a path (.gguf or HF folder):\n"
            "                   longtune only\n"
            "  --rank N         LoRA rank (default 8; alpha = 2r)\n"
            "  --threads N      CPU threads of both arms (default: the context's)\n"
            "  --no-peer        skip the PyTorch peer\n"
            "  --no-liger       CUDA: skip the second peer arm, transformers + PEFT with Liger-Kernel's\n"
            "                   fused kernels (its wheel on --peer-path; run after the plain peer)\n"
            "  --no-memory-guard  run without the memory guard (allocator limit + watchdog)\n"
            "  --offload-checkpoints  keep the layer checkpoints in pinned host memory (copied out\n"
            "                   and back on a copy stream while layers compute)\n"
            "  --offload-both   every length twice: checkpoints on the device, then offloaded\n"
            "  --recompute-attention 0|1  rerun attention's forward in the backward (1) or keep its\n"
            "                   output + lse with the checkpoints (0, the default)\n"
            "  --recompute-attention-layers N  rerun it in N of the layers only (train's option)\n"
            "  --chunk-rows N   rows per chunk of the position-wise work (default: the library's, %d)\n"
            "  --base-dtype file|fp8  hold the base as written (default) or in fp8 (train --base-dtype)\n"
            "  --activations auto|f32|gu-f32  the activations the backend hands its products in bf16\n"
            "                   as it chooses (auto), all in f32 (the run option act_f32), or only the\n"
            "                   MLP's gate and up outputs in f32 (gu_f32): for A/B comparisons\n"
            "  --fp8-skip LIST  with --base-dtype fp8: projections held as written (train --fp8-skip)\n"
            "  --bf16-products  CPU: the base's products and the fused loss's on x and W rounded to bf16\n"
            "                   through oneDNN, flash attention's tiles on bf16 operands (AMX, AVX512-BF16) (train\n"
            "                   --bf16-products; f32 weights keep theirs: use --weights random-bf16 or a\n"
            "                   file); the peer then holds the model in bf16 (adapters in f32, as PEFT\n"
            "                   keeps them)\n"
            "  --recompute P    all (default: both arms checkpoint every layer) | every:K | none (no\n"
            "                   recompute here, no gradient checkpointing in the peers)\n"
            "  --cuda-graph on|off  CUDA: replay the step (zero, forward, loss, backward, AdamW) from a\n"
            "                   CUDA graph captured at the second step of each length (default on; the\n"
            "                   profiler turns it off)\n"
            "  --profile        time every op (CUDA events; also LONGTUNE_PROFILE=1): ms per step by\n"
            "                   phase and op, on stderr and in each arm's \"profile\"\n"
            "  --peer-path DIR  searched first for torch, transformers and peft (default\n"
            "                   $LONGTUNE_PEER_PATH or /tmp/lt-peer; pip install --target DIR ...)\n"
            "Repeats and warmup count steps per arm and length (default 3 timed after 2 warmup).\n" LT_BENCH_COMMON_HELP,
            lt_bench_shape_names(), LT_MODEL_CHUNK_ROWS);
        return 0;
    }
    if (parsed) return parsed;
    graph = !strcmp(graph_arg, "on");
    const int base_fp8 = !strcmp(base_arg, "fp8");
    const int act_f32 = !strcmp(act_arg, "f32"), gu_f32 = !strcmp(act_arg, "gu-f32");
    if (fp8_skip && !base_fp8) return lt_bench_usage_error("train", NULL, "--fp8-skip needs --base-dtype fp8");
    if (fp8_skip && strlen(fp8_skip) >= sizeof((lt_train_options *)0)->fp8_skip)
        return lt_bench_usage_error("train", NULL, "--fp8-skip: the list is longer than 63 characters");
    offload_hi = offload_mode > 0;
    offload_lo = offload_mode == 1;
    const lt_bench_shape *shape = lt_bench_shape_find(shape_name);
    int cuda = !strcmp(c.backend, "cuda");
    lt_device dev = cuda ? LT_DEVICE_CUDA : LT_DEVICE_CPU;
    if (!weights) weights = cuda ? "random-bf16" : "random-f32";
    int random_w = !strcmp(weights, "random-f32") || !strcmp(weights, "random-bf16");
    lt_dtype wdt = !strcmp(weights, "random-bf16") ? LT_DTYPE_BF16 : LT_DTYPE_F32;
    if (bf16x && !strcmp(weights, "random-f32"))
        return lt_bench_usage_error(
            "train", NULL, "--bf16-products leaves f32 weights' products as they are: add --weights random-bf16");
    if (n_seqs == 0) {
        if (!cuda) seqs[0] = 512, seqs[1] = 2048, n_seqs = 2;
        else if (!strcmp(shape->name, "qwen3-8b")) seqs[0] = 8192, seqs[1] = 32768, n_seqs = 2;
        else seqs[0] = 2048, seqs[1] = 8192, seqs[2] = 32768, n_seqs = 3;
    }
    /* Keeping attention's output + lse is the faster setting on both backends (H200, measured
     * when it was chosen: 8k step 1.28 -> 1.16 s, 32k 8.06 -> 7.05 s) and, with bf16 kept
     * outputs, plans 43.2 GiB at 32k (Qwen3-8B), under half the peer's 90 GiB. */
    if (recompute_attn < 0) recompute_attn = 0;
    lt_recompute rc_policy = LT_RECOMPUTE_EVERY;
    int64_t rc_k = 0;
    int prc = lt_bench_parse_recompute("train", recompute, 1, &rc_policy, &rc_k);
    if (prc) return prc;
    if (rc_policy == LT_RECOMPUTE_NONE && (recompute_attn || rerun_layers))
        return lt_bench_usage_error("train", NULL,
                                    "--recompute none: --recompute-attention 1 and --recompute-attention-layers "
                                    "need a recompute policy");
    if (recompute_attn && rerun_layers)
        return lt_bench_usage_error("train", NULL,
                                    "--recompute-attention 1 reruns attention in every layer: drop "
                                    "--recompute-attention-layers");
    char rc_name[32];
    lt_plan_recompute_name(rc_policy, rc_k, rc_name, sizeof rc_name);
    if (profile) lt_prof_enable(1); /* before the model takes its op table */
    if (cuda && lt_sys_cuda().count == 0) {
        fprintf(stderr, "longtune bench train: --backend cuda: no CUDA device (or a build without CUDA)\n");
        return 1;
    }

    /* a peer that dies must not take the bench down with SIGPIPE on its next write */
    signal(SIGPIPE, SIG_IGN);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    if (threads > 0) lt_ctx_set_threads(ctx, threads);
    lt_model_options mo; /* the dtypes the base is held in, as train takes them from its options */
    {
        lt_train_options to;
        memset(&to, 0, sizeof to);
        snprintf(to.base_dtype, sizeof to.base_dtype, "%s", base_arg);
        snprintf(to.fp8_skip, sizeof to.fp8_skip, "%s", fp8_skip ? fp8_skip : "");
        if (lt_train_model_options(ctx, &to, &mo) != LT_OK) {
            fprintf(stderr, "longtune bench train: %s\n", lt_ctx_error(ctx));
            lt_ctx_free(ctx);
            return 2;
        }
        mo.device = dev;
    }
    int nthreads = lt_bench_threads(ctx);
    double sgemm = 0;
    if (!cuda) {
        sgemm = lt_bench_sgemm_gflops(1024, 5, nthreads);
        fprintf(stderr, "bench train: %d threads; OpenBLAS sgemm (n=1024) %.1f GFLOP/s\n", nthreads, sgemm);
    }

    int rc = 1;
    lt_model *m = NULL;
    peer pr;
    memset(&pr, 0, sizeof pr);
    float *mom_m = NULL, *mom_v = NULL;
    int32_t *tok = NULL; /* host on every device: the model copies a batch in itself */
    size_t mom_bytes = 0, tok_bytes = 0;
    cJSON *res = NULL, *peer_lines = NULL;
    lt_guard *guard = NULL;
    lt_step_graph *sg = NULL;
    size_t guard_bytes = 0;
    char dir[1024] = "";
    lt_status st = LT_OK;
    lt_lora_options lo = {.targets = LT_LORA_ALL_TARGETS, .rank = rank, .alpha = (float)(2 * rank), .seed = 1};
    if (random_w) {
        lt_bench_random_dir(shape, wdt, dir, sizeof dir);
        st = lt_bench_load_random_as(ctx, shape, wdt, &mo, &lo, nthreads, &m);
    } else {
        st = lt_model_load(ctx, weights, &mo, &lo, &m);
    }
    if (st != LT_OK) goto fail;
    const lt_model_config *cfg = lt_model_get_config(m);
    /* the share of the layers that rerun attention, for HFU: those the step reruns it in (every
     * LoRA layer is recomputed here, the last segment from its forward's stores, rerunning none) */
    int64_t rerun_sl = 0, rerun_other = 0;
    if (rc_policy != LT_RECOMPUTE_NONE && (recompute_attn || rerun_layers))
        lt_model_attention_rerun_split(cfg, rc_policy, lt_model_recompute_cap(rc_policy, rc_k), cfg->L,
                                       recompute_attn ? -1 : rerun_layers, &rerun_sl, &rerun_other);
    const double rerun_share = (double)(rerun_sl + rerun_other) / (double)cfg->L;
    int64_t n_params = 0;
    float *params = lt_model_lora_params(m, &n_params);
    float *grads = lt_model_lora_grads(m, &n_params);
    /* the optimizer state exactly as the planner counts it: two blocks of n f32 */
    mom_bytes = (size_t)n_params * sizeof(float);
    mom_m = lt_alloc(ctx, dev, mom_bytes, "bench train AdamW m");
    mom_v = lt_alloc(ctx, dev, mom_bytes, "bench train AdamW v");
    int64_t Tmax = 0;
    for (int k = 0; k < n_seqs; k++) Tmax = seqs[k] > Tmax ? seqs[k] : Tmax;
    tok_bytes = 2 * (size_t)Tmax * sizeof(int32_t);
    tok = lt_alloc(ctx, LT_DEVICE_CPU, tok_bytes, "bench train batch (host)");
    if (!mom_m || !mom_v || !tok) {
        st = LT_ERR_OOM;
        goto fail;
    }
    const lt_backend *be = lt_backend_get(dev);
    be->zero(ctx, mom_m, mom_bytes);
    be->zero(ctx, mom_v, mom_bytes);

    if (peers && !random_w) { /* the peers build the shape's random model, not this file's */
        fprintf(stderr, "peer skipped: it runs on the random-weight folders only (--weights random-f32|random-bf16)\n");
        peers = 0;
    }
    if (peers && !cuda && !python_imports_peer(peer_path)) {
        fprintf(stderr,
                "peer skipped: python3 cannot import torch, transformers, peft (looked in %s first;\n"
                "install once with: pip install --target %s torch transformers peft)\n",
                peer_path, peer_path);
        peers = 0;
    }
    if (peers && !cuda) {
        const char *src = getenv("LONGTUNE_SOURCE_DIR");
        char script[1200];
        snprintf(script, sizeof script, "%s/bench/peers/train_torch_cpu.py", src ? src : ".");
        double t0 = lt_time_now();
        if (peer_open(&pr, script, peer_path, dir, rc_policy != LT_RECOMPUTE_NONE, nthreads, rank, 2.0 * rank, 1,
                      bf16x) != 0) {
            fprintf(stderr, "peer skipped: %s did not start\n", script);
            peers = 0;
        } else {
            fprintf(stderr, "peer ready in %.1f s\n", lt_time_now() - t0);
        }
    }

    if (!guard_off) {
        lt_model_run_options ro = {.B = 1,
                                   .T = Tmax,
                                   .recompute = rc_policy,
                                   .recompute_k = rc_k,
                                   .attention = LT_ATTENTION_FLASH,
                                   .loss = LT_LCE_FUSED,
                                   .threads = nthreads,
                                   .recompute_attention = recompute_attn,
                                   .recompute_attention_layers = rerun_layers,
                                   .chunk_rows = chunk_rows,
                                   .bf16_products = bf16x,
                                   .act_f32 = act_f32,
                                   .gu_f32 = gu_f32,
                                   .offload_ckpt = offload_lo};
        lt_plan_options po = {.device = dev,
                              .lora = lo,
                              .run = ro,
                              .held_bytes = cuda ? 0 : lt_alloc_accounted_size(dev, tok_bytes)};
        lt_plan plan;
        lt_guard_options go = {.device = dev, .no_watchdog = 0};
        if (lt_plan_compute(ctx, cfg, &po, &plan) == LT_OK) go.plan_bytes = plan.peak_bytes;
        size_t before = lt_mem_get_stats(ctx, dev).used_bytes;
        if ((st = lt_guard_start(ctx, &go, &guard)) != LT_OK) goto fail;
        guard_bytes = lt_mem_get_stats(ctx, dev).used_bytes - before; /* its own bookkeeping */
    }

    res = lt_bench_result_new("train");
    cJSON *jc = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(jc, "backend", c.backend);
    cJSON_AddStringToObject(jc, "shape", random_w ? shape->name : "the file's own (config of --weights)");
    cJSON_AddStringToObject(jc, "model", random_w ? shape->title : weights);
    cJSON_AddStringToObject(jc, "weights", weights);
    cJSON_AddStringToObject(jc, "proj_dtype", lt_dtype_name(cfg->proj_dtype[LT_PROJ_Q]));
    cJSON_AddNumberToObject(jc, "batch", 1);
    cJSON_AddNumberToObject(jc, "lora_rank", rank);
    cJSON_AddNumberToObject(jc, "lora_alpha", 2 * rank);
    cJSON_AddStringToObject(jc, "lora_targets", "q,k,v,o,gate,up,down of all layers");
    cJSON_AddNumberToObject(jc, "n_lora_params", (double)n_params);
    cJSON_AddStringToObject(jc, "recompute", rc_policy == LT_RECOMPUTE_EVERY ? "every layer" : rc_name);
    cJSON_AddStringToObject(jc, "attention", "flash");
    cJSON_AddStringToObject(jc, "loss", "fused");
    cJSON_AddStringToObject(jc, "optimizer", "AdamW (both arms; timed in the step)");
    cJSON_AddStringToObject(jc, "memory_guard", guard ? "on" : "off");
    cJSON_AddNumberToObject(jc, "threads", nthreads);
    cJSON_AddNumberToObject(jc, "repeats", c.repeats);
    cJSON_AddNumberToObject(jc, "warmup", c.warmup);
    cJSON_AddBoolToObject(jc, "recompute_attention", recompute_attn);
    cJSON_AddNumberToObject(jc, "recompute_attention_layers", (double)rerun_layers);
    cJSON_AddStringToObject(jc, "base_dtype", base_fp8 ? "fp8 (e4m3, per-row scales; activations per row)" : "file");
    if (fp8_skip) cJSON_AddStringToObject(jc, "fp8_skip", fp8_skip);
    cJSON_AddNumberToObject(jc, "chunk_rows", (double)(chunk_rows ? chunk_rows : LT_MODEL_CHUNK_ROWS));
    cJSON_AddBoolToObject(jc, "bf16_products", bf16x);
    cJSON_AddStringToObject(jc, "activations", act_arg);
    cJSON_AddStringToObject(jc, "offload_checkpoints",
                            offload_lo       ? "on"
                                : offload_hi ? "off, then on (arms longtune-offload-T*)"
                                             : "off");
    cJSON_AddBoolToObject(jc, "profiled", lt_prof_active);
    if (cuda) cJSON_AddStringToObject(jc, "cuda_graph", graph ? "on" : "off");
    cJSON_AddStringToObject(jc, "flops", lt_bench_flops_note);
    if (cuda) {
        cJSON_AddNumberToObject(jc, "peak_flops", LT_BENCH_H200_BF16_PEAK);
        cJSON_AddStringToObject(jc, "peak_flops_note", "H200/H100 SXM dense bf16 tensor-core peak (MFU denominator)");
        cJSON_AddStringToObject(jc, "schedule", "our steps for every T, then the peer process (device freed between)");
        cJSON_AddStringToObject(jc, "peak_bytes_note",
                                "longtune: accounting allocator high-water on the device; peer: "
                                "torch.cuda.max_memory_allocated (reserved reported too)");
    } else {
        cJSON_AddNumberToObject(jc, "sgemm_gflops", sgemm);
        cJSON_AddNumberToObject(jc, "sgemm_n", 1024);
        cJSON_AddStringToObject(jc, "openblas_core", openblas_get_corename());
        cJSON_AddStringToObject(jc, "schedule",
                                "steps interleaved: ours, peer, ours, peer ... (shared machine: medians)");
        /* How idle OpenMP threads wait (libgomp reads these at start-up; the peer inherits them). */
        const char *wp = getenv("OMP_WAIT_POLICY"), *sc = getenv("GOMP_SPINCOUNT");
        cJSON_AddStringToObject(jc, "omp_wait_policy", wp ? wp : "(unset)");
        cJSON_AddStringToObject(jc, "gomp_spincount", sc ? sc : "(unset)");
    }
    double load[1];
    if (getloadavg(load, 1) == 1) cJSON_AddNumberToObject(jc, "loadavg_1min_at_start", load[0]);
    if (peers && pr.hello) cJSON_AddItemToObject(jc, "peer", cJSON_Duplicate(pr.hello, 1));
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");

    uint64_t seed = 0xbe7cULL;
    int64_t adam_step = 0;
    for (int sv = 0; sv < n_seqs * (1 + offload_hi - offload_lo); sv++) {
        int si = sv / (1 + offload_hi - offload_lo), offload = offload_lo + sv % (1 + offload_hi - offload_lo);
        int64_t T = seqs[si];
        /* attention output + lse are kept with the checkpoints unless --recompute-attention 1 */
        lt_model_run_options ro = {.B = 1,
                                   .T = T,
                                   .recompute = rc_policy,
                                   .recompute_k = rc_k,
                                   .attention = LT_ATTENTION_FLASH,
                                   .loss = LT_LCE_FUSED,
                                   .threads = nthreads,
                                   .recompute_attention = recompute_attn,
                                   .recompute_attention_layers = rerun_layers,
                                   .chunk_rows = chunk_rows,
                                   .bf16_products = bf16x,
                                   .act_f32 = act_f32,
                                   .gu_f32 = gu_f32,
                                   .offload_ckpt = offload};
        lt_plan_options po = {.device = dev,
                              .lora = lo,
                              .run = ro,
                              .held_bytes = (cuda ? 0 : lt_alloc_accounted_size(dev, tok_bytes)) + guard_bytes};
        lt_plan plan;
        lt_model_sizes sizes;
        double tp = lt_time_now();
        st = lt_model_prepare(ctx, m, &ro);
        /* A device step queued without waits (the loss read ends it), replayed from a CUDA graph
         * from its second run on unless --cuda-graph off; a new one per length (prepare moved the
         * buffers a graph points at). */
        lt_step_graph_free(ctx, sg);
        sg = NULL;
        lt_step_optim so = {params, grads, mom_m, mom_v, n_params, 0.0};
        if (st == LT_OK && cuda) st = lt_step_graph_init(ctx, m, &so, 1, T, graph, &sg);
        if (st == LT_OK) st = lt_plan_compute(ctx, cfg, &po, &plan);
        if (st == LT_OK) st = lt_model_size_table(ctx, cfg, &lo, &ro, &sizes);
        if (st != LT_OK) goto fail;
        lt_mem_reset_peak(ctx, dev);
        lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
        if (offload)
            fprintf(stderr, "T=%lld prepared with %.2f GiB of pinned host memory in %.2f s\n", (long long)T,
                    (double)lt_mem_get_pinned_stats(ctx).used_bytes / 1073741824.0, lt_time_now() - tp);
        int n = c.warmup + c.repeats;
        /* wall and process CPU milliseconds per step: on a shared machine the CPU time shows the
         * work done apart from waiting for a core */
        double *ours = calloc((size_t)n, sizeof(double)), *theirs = calloc((size_t)n, sizeof(double));
        double *ours_cpu = calloc((size_t)n, sizeof(double)), *theirs_cpu = calloc((size_t)n, sizeof(double));
        double loss = 0, peer_loss = NAN, peer_rss = 0;
        int peer_ok = peers && !cuda && offload == offload_lo; /* once per length */
        lt_prof_totals prof, prof_warm;
        memset(&prof, 0, sizeof prof);
        for (int r = 0; r < n && st == LT_OK; r++) {
            int32_t *x = tok, *y = tok + T;
            for (int64_t i = 0; i < T; i++) x[i] = (int32_t)(lt_bench_rand_u64(&seed) % (uint64_t)cfg->V);
            for (int64_t i = 0; i + 1 < T; i++) y[i] = x[i + 1];
            y[T - 1] = LT_IGNORE_INDEX;
            lt_model_batch b = {.B = 1, .T = T, .tokens = x, .targets = y, .step = (uint64_t)r};
            lt_model_result mr;
            lt_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = ++adam_step};
            if ((st = be->synchronize(ctx)) != LT_OK) break;
            clock_t c0 = clock();
            double t0 = lt_time_now();
            if (sg) {
                st = lt_step_graph_run(ctx, sg, &b, 0.0f, &hp, &mr);
            } else {
                lt_model_zero_grads(m);
                st = lt_model_forward_backward(ctx, m, &b, 0.0f, &mr, NULL);
                if (st == LT_OK) be->adamw(ctx, params, grads, mom_m, mom_v, n_params, &hp);
            }
            if (st != LT_OK || (st = be->synchronize(ctx)) != LT_OK) break;
            ours[r] = (lt_time_now() - t0) * 1e3;
            ours_cpu[r] = (double)(clock() - c0) * 1e3 / CLOCKS_PER_SEC;
            if (lt_prof_active) {
                memset(&prof_warm, 0, sizeof prof_warm);
                if ((st = lt_prof_collect(ctx, dev, r < c.warmup ? &prof_warm : &prof)) != LT_OK) break;
            }
            loss = mr.loss_sum / (double)mr.n_tokens;
            if (guard && lt_guard_tripped(guard)) {
                lt_guard_breach gb = lt_guard_get_breach(guard);
                st = lt_error(ctx, LT_ERR_OOM, "memory guard: %s at %.2f GiB passed the ceiling %.2f GiB at T=%lld",
                              gb.source, (double)gb.observed_bytes / 1073741824.0,
                              (double)gb.ceiling_bytes / 1073741824.0, (long long)T);
                break;
            }
            if (peer_ok) {
                theirs[r] = peer_step(&pr, T, &theirs_cpu[r], &peer_loss, &peer_rss);
                if (theirs[r] < 0) {
                    fprintf(stderr, "peer failed at T=%lld; continuing without it\n", (long long)T);
                    peer_ok = peers = 0;
                }
            }
            fprintf(stderr, "  T=%-6lld %s %d: longtune %8.1f ms (cpu %8.0f, loss %.4f)", (long long)T,
                    r < c.warmup ? "warmup" : "step  ", r < c.warmup ? r + 1 : r - c.warmup + 1, ours[r], ours_cpu[r],
                    loss);
            if (peer_ok)
                fprintf(stderr, "   peer %8.0f ms (cpu %8.0f, loss %.4f)", theirs[r], theirs_cpu[r], peer_loss);
            fputc('\n', stderr);
        }
        if (st != LT_OK) {
            free(ours);
            free(theirs);
            free(ours_cpu);
            free(theirs_cpu);
            goto fail;
        }
        size_t peak = lt_mem_get_stats(ctx, dev).peak_bytes;
        double ms = lt_bench_median(ours + c.warmup, c.repeats);
        double cms = lt_bench_median(ours_cpu + c.warmup, c.repeats);
        double mfl = lt_bench_model_flops(cfg, rank, T);
        /* without recompute the hardware does the model's FLOPs; every:K reruns each layer once as all does */
        double hfl =
            rc_policy == LT_RECOMPUTE_NONE ? mfl : lt_bench_hw_flops(cfg, rank, T, rerun_share, dev == LT_DEVICE_CPU);
        double mrate = mfl / (ms * 1e-3), hrate = hfl / (ms * 1e-3);
        cJSON *arm = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "longtune-%sT%lld", offload ? "offload-" : "", (long long)T);
        cJSON_AddStringToObject(arm, "name", name);
        cJSON_AddNumberToObject(arm, "T", (double)T);
        cJSON_AddBoolToObject(arm, "offload_checkpoints", offload);
        if (offload) {
            cJSON_AddNumberToObject(arm, "host_offload_plan_bytes", (double)plan.offload_bytes);
            cJSON_AddNumberToObject(arm, "pinned_peak_bytes", (double)lt_mem_get_pinned_stats(ctx).peak_bytes);
        }
        cJSON_AddNumberToObject(arm, "median_ms", ms);
        cJSON_AddNumberToObject(arm, "tokens_per_s", (double)T / (ms * 1e-3));
        cJSON_AddNumberToObject(arm, "cpu_ms", cms);
        cJSON_AddNumberToObject(arm, "peak_bytes", (double)peak);
        cJSON_AddNumberToObject(arm, "plan_bytes", (double)plan.peak_bytes);
        cJSON_AddNumberToObject(arm, "plan_over_measured", peak ? (double)plan.peak_bytes / (double)peak : NAN);
        cJSON_AddNumberToObject(arm, "size_table_bytes", (double)sizes.total);
        cJSON_AddNumberToObject(arm, "bench_buffers_bytes", (double)tok_bytes);
        cJSON_AddNumberToObject(arm, "model_gflop", mfl * 1e-9);
        cJSON_AddNumberToObject(arm, "hw_gflop", hfl * 1e-9);
        if (cuda) {
            lt_cuda_device_info di = lt_sys_cuda();
            cJSON_AddNumberToObject(arm, "tflops", mrate * 1e-12);
            cJSON_AddNumberToObject(arm, "mfu", mrate / LT_BENCH_H200_BF16_PEAK);
            cJSON_AddNumberToObject(arm, "hfu", hrate / LT_BENCH_H200_BF16_PEAK);
            cJSON_AddNumberToObject(arm, "device_used_bytes", (double)(di.total_bytes - di.free_bytes));
        } else {
            cJSON_AddNumberToObject(arm, "gflops", hrate * 1e-9);
            cJSON_AddNumberToObject(arm, "mfu_vs_sgemm", hrate * 1e-9 / sgemm);
            cJSON_AddNumberToObject(arm, "model_gflops", mrate * 1e-9);
        }
        cJSON_AddNumberToObject(arm, "last_loss", loss);
        if (sg) {
            lt_step_graph_stats gs = lt_step_graph_get_stats(sg);
            cJSON *jg = cJSON_AddObjectToObject(arm, "cuda_graph");
            cJSON_AddNumberToObject(jg, "replays", (double)gs.replays);
            cJSON_AddNumberToObject(jg, "captures", (double)gs.captures);
            cJSON_AddNumberToObject(jg, "eager", (double)gs.eager);
            if (gs.why_off[0]) cJSON_AddStringToObject(jg, "off_because", gs.why_off);
            fprintf(stderr, "T=%lld cuda graph: %lld replayed, %lld captured, %lld eager%s%s\n", (long long)T,
                    (long long)gs.replays, (long long)gs.captures, (long long)gs.eager, gs.why_off[0] ? "; off: " : "",
                    gs.why_off);
        }
        cJSON *ctimes = cJSON_AddArrayToObject(arm, "step_cpu_ms");
        for (int r = c.warmup; r < n; r++) cJSON_AddItemToArray(ctimes, cJSON_CreateNumber(ours_cpu[r]));
        cJSON *times = cJSON_AddArrayToObject(arm, "step_ms");
        for (int r = c.warmup; r < n; r++) cJSON_AddItemToArray(times, cJSON_CreateNumber(ours[r]));
        if (lt_prof_active) add_profile(arm, &prof, ms);
        cJSON_AddItemToArray(arms, arm);
        if (offload)
            fprintf(stderr, "T=%lld offloaded checkpoints: %.1f MiB pinned host memory (plan %.1f MiB)\n", (long long)T,
                    (double)lt_mem_get_pinned_stats(ctx).peak_bytes / 1048576.0,
                    (double)plan.offload_bytes / 1048576.0);
        fprintf(stderr, "T=%lld longtune%s: %.1f ms/step, %.0f tokens/s, peak %.1f MiB (plan %.1f MiB, %.4f), ",
                (long long)T, offload ? " (offload)" : "", ms, (double)T / (ms * 1e-3), (double)peak / 1048576.0,
                (double)plan.peak_bytes / 1048576.0, peak ? (double)plan.peak_bytes / (double)peak : NAN);
        if (cuda)
            fprintf(stderr, "%.1f TFLOP/s = MFU %.3f (HFU %.3f)\n", mrate * 1e-12, mrate / LT_BENCH_H200_BF16_PEAK,
                    hrate / LT_BENCH_H200_BF16_PEAK);
        else fprintf(stderr, "%.1f GFLOP/s = %.2f of sgemm\n", hrate * 1e-9, hrate * 1e-9 / sgemm);
        if (peer_ok) {
            double pms = lt_bench_median(theirs + c.warmup, c.repeats);
            double pcms = lt_bench_median(theirs_cpu + c.warmup, c.repeats);
            cJSON *pa = cJSON_CreateObject();
            snprintf(name, sizeof name, "torch-peft-T%lld", (long long)T);
            cJSON_AddStringToObject(pa, "name", name);
            cJSON_AddNumberToObject(pa, "T", (double)T);
            cJSON_AddNumberToObject(pa, "median_ms", pms);
            cJSON_AddNumberToObject(pa, "tokens_per_s", (double)T / (pms * 1e-3));
            cJSON_AddNumberToObject(pa, "cpu_ms", pcms);
            cJSON_AddNumberToObject(pa, "max_rss_bytes", peer_rss);
            /* the peer's checkpointing reruns the whole layer forward: attention and the down
             * projection's base product included */
            double phfl = rc_policy == LT_RECOMPUTE_NONE ? mfl
                                                         : lt_bench_hw_flops(cfg, rank, T, 1, 0) +
                    2.0 * (double)cfg->L * (double)cfg->C * (double)cfg->F * (double)T;
            cJSON_AddNumberToObject(pa, "gflops", phfl / (pms * 1e-3) * 1e-9);
            cJSON_AddNumberToObject(pa, "mfu_vs_sgemm", phfl / (pms * 1e-3) * 1e-9 / sgemm);
            cJSON_AddNumberToObject(pa, "last_loss", peer_loss);
            cJSON_AddNumberToObject(pa, "longtune_speedup", pms / ms);
            cJSON_AddNumberToObject(pa, "longtune_speedup_cpu_time", pcms / cms);
            times = cJSON_AddArrayToObject(pa, "step_ms");
            for (int r = c.warmup; r < n; r++) cJSON_AddItemToArray(times, cJSON_CreateNumber(theirs[r]));
            cJSON_AddItemToArray(arms, pa);
            fprintf(
                stderr,
                "T=%lld peer:     %.0f ms/step, %.0f tokens/s, max RSS %.1f MiB -> longtune %.2fx the peer's tokens/s"
                " (%.2fx by CPU time)\n",
                (long long)T, pms, (double)T / (pms * 1e-3), peer_rss / 1048576.0, pms / ms, pcms / cms);
        }
        free(ours);
        free(theirs);
        free(ours_cpu);
        free(theirs_cpu);
    }
    peer_close(&pr);
    if (guard) {
        lt_guard_stop(guard);
        guard = NULL;
    }
    lt_step_graph_free(ctx, sg);
    sg = NULL;
    if (peers && cuda) {
        /* the device is handed to the peer empty of our blocks */
        lt_free(ctx, dev, mom_m, mom_bytes);
        lt_free(ctx, dev, mom_v, mom_bytes);
        mom_m = mom_v = NULL;
        lt_model_free(ctx, m);
        m = NULL;
        char args[512], list[160] = "";
        for (int k = 0; k < n_seqs; k++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%lld", k ? "," : "", (long long)seqs[k]);
        snprintf(args, sizeof args, "--shape %s --seq %s --steps %d --warmup %d --rank %d%s", shape->name, list,
                 c.repeats, c.warmup, rank, rc_policy == LT_RECOMPUTE_NONE ? " --no-grad-checkpointing" : "");
        lt_model_config pc = lt_bench_shape_config(shape, wdt);
        peer_lines = lt_bench_gpu_peer_run(peer_path, args);
        if (peer_lines) {
            cJSON_AddItemToObject(jc, "peer", cJSON_Duplicate(lt_bench_peer_find(peer_lines, "ready", 0), 1));
            add_gpu_peer_arms(arms, peer_lines, "torch-peft", &pc, rank, seqs, n_seqs);
        } else {
            cJSON_AddStringToObject(jc, "peer", lt_bench_peer_failure());
        }
        if (liger) {
            /* the strongest peer people pick: the same script with Liger-Kernel patched in */
            char largs[600];
            snprintf(largs, sizeof largs, "%s --liger", args);
            cJSON *ll = lt_bench_gpu_peer_run(peer_path, largs);
            if (ll) {
                cJSON_AddItemToObject(jc, "peer_liger", cJSON_Duplicate(lt_bench_peer_find(ll, "ready", 0), 1));
                add_gpu_peer_arms(arms, ll, "torch-peft-liger", &pc, rank, seqs, n_seqs);
                cJSON_Delete(ll);
            } else {
                cJSON_AddStringToObject(jc, "peer_liger", lt_bench_peer_failure());
            }
        }
    }
    if (getloadavg(load, 1) == 1) cJSON_AddNumberToObject(jc, "loadavg_1min_at_end", load[0]);
    char tag[240], chunk_tag[40] = "", rc_tag[40];
    lt_bench_recompute_tag(rc_policy, rc_k, rc_tag, sizeof rc_tag);
    if (chunk_rows && chunk_rows != LT_MODEL_CHUNK_ROWS)
        snprintf(chunk_tag, sizeof chunk_tag, "-chunk%lld", (long long)chunk_rows);
    /* runs off the default configuration never overwrite the published file */
    char fp8_tag[64] = ""; /* -fp8, then -skip and the skipped projections' short names */
    if (base_fp8) {
        size_t u = (size_t)snprintf(fp8_tag, sizeof fp8_tag, "-fp8%s", mo.fp8_skip ? "-skip" : "");
        for (int p = 0; p < LT_PROJ_COUNT_; p++)
            if (mo.fp8_skip >> p & 1u) {
                const char *name = lt_proj_name((lt_proj)p);
                u += (size_t)snprintf(fp8_tag + u, sizeof fp8_tag - u, "-%.*s", (int)strcspn(name, "_"), name);
            }
    }
    char rerun_tag[40] = "", act_tag[16] = "";
    if (act_f32 || gu_f32) snprintf(act_tag, sizeof act_tag, "-%s", act_arg);
    if (recompute_attn) snprintf(rerun_tag, sizeof rerun_tag, "-recompute-attn");
    else if (rerun_layers) snprintf(rerun_tag, sizeof rerun_tag, "-recompute-attn%lld", (long long)rerun_layers);
    snprintf(tag, sizeof tag, "%s-%s-%s%s%s%s%s%s%s%s%s%s", c.backend, random_w ? shape->name : "file",
             random_w ? weights : "weights", rc_tag, rerun_tag,
             offload_hi ? (offload_lo ? "-offload" : "-offload-both") : "", lt_prof_active ? "-profile" : "",
             cuda && !graph ? "-nograph" : "", chunk_tag, fp8_tag, bf16x ? "-bf16-products" : "", act_tag);
    rc = lt_bench_write(&c, res, tag) == 0 ? 0 : 1;
    res = NULL;
    goto out;
fail:
    fprintf(stderr, "longtune bench train: %s\n", lt_ctx_error(ctx));
out:
    if (guard) lt_guard_stop(guard);
    lt_step_graph_free(ctx, sg);
    peer_close(&pr);
    cJSON_Delete(res);
    cJSON_Delete(peer_lines);
    if (mom_m) lt_free(ctx, dev, mom_m, mom_bytes);
    if (mom_v) lt_free(ctx, dev, mom_v, mom_bytes);
    if (tok) lt_free(ctx, LT_DEVICE_CPU, tok, tok_bytes);
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
    return rc;
}
