/* `longtune bench train`: whole LoRA training steps of SmolLM2-135M on the CPU at T = 512 and 2048
 * (batch 1, LoRA r=8 on all seven projections of every layer, recompute every layer, flash
 * attention, fused loss, AdamW) — median step time, real tokens/s, peak bytes of the accounting
 * allocator against the planner, and MFU against the OpenBLAS sgemm rate measured in the same run —
 * with the PyTorch + transformers + PEFT peer (bench/peers/train_torch_cpu.py) driven step by step
 * in the same run, interleaved with ours so a loaded machine slows both alike. Weights are random
 * with the real shape (written as a safetensors folder both arms load) or a real file (ours only).
 * It calls the library's model and planner; it does not reimplement any op. */
#define _DEFAULT_SOURCE /* getloadavg */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "bench_util.h"
#include "backend/backend.h"
#include "core/parallel.h"
#include "longtune/alloc.h"
#include "longtune/log.h"
#include "longtune/model.h"
#include "longtune/plan.h"
#include "longtune/safetensors.h"

#define MAX_SEQS 8

/* SmolLM2-135M(-Instruct)'s config.json values that the model reads. */
enum { S_V = 49152, S_C = 576, S_F = 1536, S_L = 30, S_H = 9, S_HKV = 3, S_D = 64 };

static uint64_t next_u64(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int usage(const char *msg, const char *arg) {
    fprintf(stderr, "longtune bench train: %s '%s'\nusage: longtune bench train [options]\n", msg, arg);
    return 2;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

/* A random SmolLM2-135M folder (config.json + model.safetensors, tied embeddings) in dir: weights
 * uniform with std 0.02 (transformers' initializer_range), norms 1, in dtype t (f32 or bf16). */
static lt_status make_random_model(lt_ctx *ctx, const char *dir, lt_dtype t, uint64_t seed) {
    char path[1200], cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %d,"
             " \"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d,"
             " \"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d,"
             " \"max_position_embeddings\": 8192, \"rms_norm_eps\": 1e-5, \"rope_theta\": 100000.0,"
             " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"bos_token_id\": 1,"
             " \"eos_token_id\": 2, \"torch_dtype\": \"%s\"}",
             S_V, S_C, S_F, S_L, S_H, S_HKV, S_D, t == LT_DTYPE_BF16 ? "bfloat16" : "float32");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_text(path, cfg) != 0) return lt_error(ctx, LT_ERR_IO, "%s: cannot write", path);

    enum { NT = 2 + 9 * S_L };
    static const struct { const char *fmt; int64_t r, c; } per_layer[9] = {
        {"model.layers.%d.input_layernorm.weight", S_C, 0},
        {"model.layers.%d.self_attn.q_proj.weight", S_H * S_D, S_C},
        {"model.layers.%d.self_attn.k_proj.weight", S_HKV * S_D, S_C},
        {"model.layers.%d.self_attn.v_proj.weight", S_HKV * S_D, S_C},
        {"model.layers.%d.self_attn.o_proj.weight", S_C, S_H * S_D},
        {"model.layers.%d.post_attention_layernorm.weight", S_C, 0},
        {"model.layers.%d.mlp.gate_proj.weight", S_F, S_C},
        {"model.layers.%d.mlp.up_proj.weight", S_F, S_C},
        {"model.layers.%d.mlp.down_proj.weight", S_C, S_F},
    };
    lt_safetensors_entry *e = calloc(NT, sizeof *e);
    char(*names)[96] = calloc(NT, sizeof *names);
    void **bufs = calloc(NT, sizeof *bufs);
    size_t *sizes = calloc(NT, sizeof *sizes);
    lt_status s = LT_OK;
    if (!e || !names || !bufs || !sizes) {
        s = lt_error(ctx, LT_ERR_OOM, "bench train: tensor table");
        goto done;
    }
    const float a = 0.02f * 1.7320508f; /* uniform(-a, a) has std 0.02 */
    for (int k = 0; k < NT; k++) {
        int64_t r, c;
        if (k == 0) {
            snprintf(names[k], 96, "model.embed_tokens.weight");
            r = S_V, c = S_C;
        } else if (k == 1) {
            snprintf(names[k], 96, "model.norm.weight");
            r = S_C, c = 0;
        } else {
            snprintf(names[k], 96, per_layer[(k - 2) % 9].fmt, (k - 2) / 9);
            r = per_layer[(k - 2) % 9].r, c = per_layer[(k - 2) % 9].c;
        }
        int norm = c == 0;
        int64_t n = norm ? r : r * c;
        lt_dtype dt = norm ? LT_DTYPE_F32 : t;
        sizes[k] = (size_t)n * (dt == LT_DTYPE_F32 ? 4u : 2u);
        bufs[k] = lt_alloc(ctx, LT_DEVICE_CPU, sizes[k], "bench train random weights");
        if (!bufs[k]) {
            s = LT_ERR_OOM;
            goto done;
        }
        for (int64_t i = 0; i < n; i++) {
            float x = norm ? 1.0f : a * ((float)(next_u64(&seed) >> 40) * 0x1.0p-23f - 1.0f);
            if (dt == LT_DTYPE_F32)
                ((float *)bufs[k])[i] = x;
            else
                ((uint16_t *)bufs[k])[i] = lt_f32_to_bf16(x);
        }
        int64_t shape[2] = {r, c};
        e[k].name = names[k];
        e[k].tensor = lt_tensor_view(bufs[k], dt, LT_DEVICE_CPU, norm ? 1 : 2, shape);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    s = lt_safetensors_write(ctx, path, e, NT, NULL, 0);
done:
    if (bufs)
        for (int k = 0; k < NT; k++)
            if (bufs[k]) lt_free(ctx, LT_DEVICE_CPU, bufs[k], sizes[k]);
    free(e);
    free(names);
    free(bufs);
    free(sizes);
    return s;
}

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

static void peer_close(peer *p) {
    if (p->to) {
        fputs("quit\n", p->to);
        fclose(p->to);
    }
    if (p->from) fclose(p->from);
    if (p->pid > 0) waitpid(p->pid, NULL, 0);
    cJSON_Delete(p->hello);
    memset(p, 0, sizeof *p);
}

/* Starts the peer on model_dir with PYTHONPATH = peer_path first; 0 once it reported ready. */
static int peer_open(peer *p, const char *script, const char *peer_path, const char *model_dir, int threads,
                     int rank, double alpha, uint64_t seed) {
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
        execlp("python3", "python3", script, model_dir, th, rk, al, sd, (char *)NULL);
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
    snprintf(cmd, sizeof cmd, "PYTHONPATH='%s'${PYTHONPATH:+:$PYTHONPATH} python3 -c 'import torch, transformers, peft' >/dev/null 2>&1",
             peer_path);
    return system(cmd) == 0;
}

/* FLOPs of one step of T tokens (B = 1), the convention written into the result:
 *   projections  6·P·T   P = Σ weight-matrix elements of the L layers (q,k,v,o,gate,up,down):
 *                        forward 2PT, the recompute of the forward 2PT (checkpointing), and the
 *                        backward to the inputs 2PT (the frozen base has no weight gradient)
 *   LoRA         Σ over the 7·L adapters of r·(in + out)·T·(2 fwd + 2 recompute + 6 bwd)
 *                        (backward: input gradient 2 + A and B gradients 4)
 *   head         4·V·C·T  (tied head: logits forward 2 and input gradient 2; no recompute)
 *   attention    FlashAttention's convention: forward 4·H·T²·D / 2 (causal), backward 2.5×
 *                forward, plus the recomputed forward: 4.5 × the causal forward.
 * RMSNorm, RoPE, SwiGLU and the optimizer are left out (memory-bound, O(T·C)). */
static double step_flops(const lt_model_config *cfg, int64_t r, int64_t T) {
    double C = (double)cfg->C, F = (double)cfg->F, qd = (double)(cfg->H * cfg->D), kvd = (double)(cfg->Hkv * cfg->D);
    double P = C * qd + 2 * C * kvd + qd * C + 3 * C * F;
    double lora = (double)r * ((C + qd) + 2 * (C + kvd) + (qd + C) + 2 * (C + F) + (F + C));
    double L = (double)cfg->L, t = (double)T;
    double attn_fwd = 4.0 * (double)cfg->H * t * t * (double)cfg->D / 2.0;
    return L * (6.0 * P * t + 10.0 * lora * t + 4.5 * attn_fwd) + 4.0 * (double)cfg->V * C * t;
}

static int parse_seqs(const char *v, int64_t *seqs, int *n) {
    *n = 0;
    const char *q = v;
    while (*q) {
        char *end;
        long long x = strtoll(q, &end, 10);
        if (end == q || x < 2 || x > 1 << 20 || *n == MAX_SEQS) return -1;
        seqs[(*n)++] = x;
        q = end;
        if (*q == ',') q++;
        else if (*q) return -1;
    }
    return *n > 0 ? 0 : -1;
}

static int remove_tree(const char *dir) {
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    return rmdir(dir);
}

int lt_bench_train(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    c.repeats = 3;
    c.warmup = 2;
    int64_t seqs[MAX_SEQS] = {512, 2048};
    int n_seqs = 2, threads = 0, rank = 8, peers = 1;
    const char *weights = "random-f32", *peer_path = getenv("LONGTUNE_PEER_PATH");
    if (!peer_path) peer_path = "/tmp/lt-peer";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help")) {
            printf("usage: longtune bench train [options]\n\n"
                   "LoRA training steps of SmolLM2-135M (batch 1, r=8 on q,k,v,o,gate,up,down of every layer,\n"
                   "recompute every layer, flash attention, fused loss, AdamW): median step ms, tokens/s,\n"
                   "peak bytes vs the plan, MFU vs OpenBLAS sgemm measured in the same run, and the PyTorch +\n"
                   "transformers + PEFT peer on the same weights, interleaved step by step.\n\n"
                   "options:\n"
                   "  --seq LIST       tokens per step, comma list (default 512,2048)\n"
                   "  --weights W      random-f32 (default) | random-bf16: random weights of the real shape,\n"
                   "                   written as a safetensors folder that the peer loads too; or a path\n"
                   "                   (.gguf or HF folder, e.g. ~/.cache/longtune/smollm2-135m-instruct-q4_1.gguf\n"
                   "                   for QLoRA): longtune only\n"
                   "  --rank N         LoRA rank (default 8; alpha = 2r)\n"
                   "  --threads N      threads of both arms (default: the context's)\n"
                   "  --no-peer        skip the PyTorch peer\n"
                   "  --peer-path DIR  where torch, transformers and peft are installed (default\n"
                   "                   $LONGTUNE_PEER_PATH or /tmp/lt-peer; install once with\n"
                   "                   pip install --target DIR torch transformers peft)\n"
                   "Repeats and warmup count steps per arm and length (default 3 timed after 2 warmup).\n"
                   LT_BENCH_COMMON_HELP);
            return 0;
        }
        int r = lt_bench_common_flag(&c, argc, argv, &i);
        if (r < 0) return usage("bad value for", a);
        if (r > 0) continue;
        if (!strcmp(a, "--no-peer")) {
            peers = 0;
            continue;
        }
        if (!v) return usage("missing value for", a);
        i++;
        if (!strcmp(a, "--seq")) {
            if (parse_seqs(v, seqs, &n_seqs) != 0) return usage("bad length list", v);
        } else if (!strcmp(a, "--weights")) {
            weights = v;
        } else if (!strcmp(a, "--rank")) {
            rank = atoi(v);
            if (rank < 1 || rank > 1024) return usage("bad rank", v);
        } else if (!strcmp(a, "--threads")) {
            threads = atoi(v);
            if (threads < 1) return usage("bad thread count", v);
        } else if (!strcmp(a, "--peer-path")) {
            peer_path = v;
        } else {
            return usage("bad option", a);
        }
    }
    if (strcmp(c.backend, "cpu") != 0) return usage("this bench runs on the CPU backend only, not", c.backend);
    if (c.repeats < 1) return usage("needs at least one timed step, not", "--repeats 0");
    int random_w = !strcmp(weights, "random-f32") || !strcmp(weights, "random-bf16");

    /* a peer that dies must not take the bench down with SIGPIPE on its next write */
    signal(SIGPIPE, SIG_IGN);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    if (threads > 0) lt_ctx_set_threads(ctx, threads);
    int nthreads = lt_parallel_threads(lt_ctx_threads(ctx));
    double sgemm = lt_bench_sgemm_gflops(1024, 5, nthreads);
    fprintf(stderr, "bench train: %d threads; OpenBLAS sgemm (n=1024) %.1f GFLOP/s\n", nthreads, sgemm);

    int rc = 1;
    lt_model *m = NULL;
    peer pr;
    memset(&pr, 0, sizeof pr);
    float *mom = NULL;
    int32_t *tok = NULL;
    size_t mom_bytes = 0, tok_bytes = 0;
    cJSON *res = NULL;
    char dir[] = "/tmp/lt-bench-train-XXXXXX";
    int have_dir = 0;
    const char *model_path = weights;
    lt_status st = LT_OK;
    if (random_w) {
        if (!mkdtemp(dir)) {
            fprintf(stderr, "longtune bench train: mkdtemp: %s\n", strerror(errno));
            goto out;
        }
        have_dir = 1;
        model_path = dir;
        double t0 = lt_time_now();
        st = make_random_model(ctx, dir, strcmp(weights, "random-bf16") ? LT_DTYPE_F32 : LT_DTYPE_BF16, 0x7ea1ULL);
        if (st != LT_OK) goto fail;
        fprintf(stderr, "random SmolLM2-135M (%s) written to %s in %.1f s\n", weights, dir, lt_time_now() - t0);
    }
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_lora_options lo = {.targets = LT_LORA_ALL_TARGETS, .rank = rank, .alpha = (float)(2 * rank), .seed = 1};
    st = lt_model_load(ctx, model_path, &mo, &lo, &m);
    if (st != LT_OK) goto fail;
    const lt_model_config *cfg = lt_model_get_config(m);
    int64_t n_params = 0;
    float *params = lt_model_lora_params(m, &n_params);
    float *grads = lt_model_lora_grads(m, &n_params);
    mom_bytes = 2 * (size_t)n_params * sizeof(float);
    mom = lt_calloc(ctx, LT_DEVICE_CPU, mom_bytes, "bench train AdamW moments");
    int64_t Tmax = 0;
    for (int k = 0; k < n_seqs; k++) Tmax = seqs[k] > Tmax ? seqs[k] : Tmax;
    tok_bytes = 2 * (size_t)Tmax * sizeof(int32_t);
    tok = lt_alloc(ctx, LT_DEVICE_CPU, tok_bytes, "bench train batch");
    if (!mom || !tok) {
        st = LT_ERR_OOM;
        goto fail;
    }
    const lt_backend *be = lt_backend_get(LT_DEVICE_CPU);

    if (peers && !random_w) {
        fprintf(stderr, "peer skipped: it runs on the random-weight folders only (--weights random-f32|random-bf16)\n");
        peers = 0;
    }
    if (peers && !python_imports_peer(peer_path)) {
        fprintf(stderr, "peer skipped: python3 cannot import torch, transformers, peft (looked in %s first;\n"
                        "install once with: pip install --target %s torch transformers peft)\n", peer_path, peer_path);
        peers = 0;
    }
    if (peers) {
        const char *src = getenv("LONGTUNE_SOURCE_DIR");
        char script[1200];
        snprintf(script, sizeof script, "%s/bench/peers/train_torch_cpu.py", src ? src : ".");
        double t0 = lt_time_now();
        if (peer_open(&pr, script, peer_path, dir, nthreads, rank, 2.0 * rank, 1) != 0) {
            fprintf(stderr, "peer skipped: %s did not start\n", script);
            peers = 0;
        } else {
            fprintf(stderr, "peer ready in %.1f s\n", lt_time_now() - t0);
        }
    }

    res = lt_bench_result_new("train");
    cJSON *jc = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(jc, "model", "SmolLM2-135M (L=30 C=576 F=1536 H=9 Hkv=3 D=64 V=49152, tied)");
    cJSON_AddStringToObject(jc, "weights", weights);
    cJSON_AddStringToObject(jc, "proj_dtype", lt_dtype_name(cfg->proj_dtype[LT_PROJ_Q]));
    cJSON_AddNumberToObject(jc, "batch", 1);
    cJSON_AddNumberToObject(jc, "lora_rank", rank);
    cJSON_AddNumberToObject(jc, "lora_alpha", 2 * rank);
    cJSON_AddStringToObject(jc, "lora_targets", "q,k,v,o,gate,up,down of all layers");
    cJSON_AddNumberToObject(jc, "n_lora_params", (double)n_params);
    cJSON_AddStringToObject(jc, "recompute", "every layer");
    cJSON_AddStringToObject(jc, "attention", "flash");
    cJSON_AddStringToObject(jc, "loss", "fused");
    cJSON_AddStringToObject(jc, "optimizer", "AdamW (both arms; timed in the step)");
    cJSON_AddNumberToObject(jc, "threads", nthreads);
    cJSON_AddNumberToObject(jc, "repeats", c.repeats);
    cJSON_AddNumberToObject(jc, "warmup", c.warmup);
    cJSON_AddNumberToObject(jc, "sgemm_gflops", sgemm);
    cJSON_AddNumberToObject(jc, "sgemm_n", 1024);
    cJSON_AddStringToObject(jc, "openblas_core", openblas_get_corename());
    cJSON_AddStringToObject(jc, "schedule", "steps interleaved: ours, peer, ours, peer ... (shared machine: medians)");
    double load[1];
    if (getloadavg(load, 1) == 1) cJSON_AddNumberToObject(jc, "loadavg_1min_at_start", load[0]);
    cJSON_AddStringToObject(jc, "flops",
                            "per step of T tokens: L*(6*P*T + 10*r*(in+out summed over the 7 adapters)*T + "
                            "4.5*2*H*T^2*D) + 4*V*C*T; P = weight elements of one layer's 7 projections "
                            "(fwd 2 + recompute 2 + input-grad 2), attention = FlashAttention's causal "
                            "convention fwd 2HT^2D, bwd 2.5x, plus the recomputed fwd; head fwd + input grad");
    if (peers && pr.hello) cJSON_AddItemToObject(jc, "peer", cJSON_Duplicate(pr.hello, 1));
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");

    uint64_t seed = 0xbe7cULL;
    int64_t adam_step = 0;
    for (int si = 0; si < n_seqs; si++) {
        int64_t T = seqs[si];
        lt_model_run_options ro = {.B = 1, .T = T, .recompute = LT_RECOMPUTE_EVERY, .attention = LT_ATTENTION_FLASH,
                                   .loss = LT_LCE_FUSED, .threads = nthreads};
        lt_plan_options po = {.device = LT_DEVICE_CPU, .lora = lo, .run = ro};
        lt_plan plan;
        lt_model_sizes sizes;
        st = lt_model_prepare(ctx, m, &ro);
        if (st == LT_OK) st = lt_plan_compute(ctx, cfg, &po, &plan);
        if (st == LT_OK) st = lt_model_size_table(ctx, cfg, &lo, &ro, &sizes);
        if (st != LT_OK) goto fail;
        lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
        int n = c.warmup + c.repeats;
        /* wall and process CPU milliseconds per step: on a shared machine the CPU time shows the
         * work done apart from waiting for a core */
        double *ours = calloc((size_t)n, sizeof(double)), *theirs = calloc((size_t)n, sizeof(double));
        double *ours_cpu = calloc((size_t)n, sizeof(double)), *theirs_cpu = calloc((size_t)n, sizeof(double));
        double loss = 0, peer_loss = NAN, peer_rss = 0;
        int peer_ok = peers;
        for (int r = 0; r < n && st == LT_OK; r++) {
            int32_t *x = tok, *y = tok + T;
            for (int64_t i = 0; i < T; i++) x[i] = (int32_t)(next_u64(&seed) % (uint64_t)cfg->V);
            for (int64_t i = 0; i + 1 < T; i++) y[i] = x[i + 1];
            y[T - 1] = LT_IGNORE_INDEX;
            lt_model_batch b = {.B = 1, .T = T, .tokens = x, .targets = y, .step = (uint64_t)r};
            lt_model_result mr;
            lt_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = ++adam_step};
            clock_t c0 = clock();
            double t0 = lt_time_now();
            lt_model_zero_grads(m);
            st = lt_model_forward_backward(ctx, m, &b, 0.0f, &mr, NULL);
            if (st != LT_OK) break;
            be->adamw(ctx, params, grads, mom, mom + n_params, n_params, &hp);
            ours[r] = (lt_time_now() - t0) * 1e3;
            ours_cpu[r] = (double)(clock() - c0) * 1e3 / CLOCKS_PER_SEC;
            loss = mr.loss_sum / (double)mr.n_tokens;
            if (peer_ok) {
                theirs[r] = peer_step(&pr, T, &theirs_cpu[r], &peer_loss, &peer_rss);
                if (theirs[r] < 0) {
                    fprintf(stderr, "peer failed at T=%lld; continuing without it\n", (long long)T);
                    peer_ok = peers = 0;
                }
            }
            fprintf(stderr, "  T=%-5lld %s %d: longtune %8.0f ms (cpu %8.0f, loss %.4f)", (long long)T,
                    r < c.warmup ? "warmup" : "step  ", r < c.warmup ? r + 1 : r - c.warmup + 1, ours[r], ours_cpu[r], loss);
            if (peer_ok) fprintf(stderr, "   peer %8.0f ms (cpu %8.0f, loss %.4f)", theirs[r], theirs_cpu[r], peer_loss);
            fputc('\n', stderr);
        }
        if (st != LT_OK) {
            free(ours);
            free(theirs);
            free(ours_cpu);
            free(theirs_cpu);
            goto fail;
        }
        size_t peak = lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes;
        double ms = lt_bench_median(ours + c.warmup, c.repeats);
        double cms = lt_bench_median(ours_cpu + c.warmup, c.repeats);
        double fl = step_flops(cfg, rank, T), gf = fl / (ms * 1e-3) * 1e-9;
        cJSON *arm = cJSON_CreateObject();
        char name[64];
        snprintf(name, sizeof name, "longtune-T%lld", (long long)T);
        cJSON_AddStringToObject(arm, "name", name);
        cJSON_AddNumberToObject(arm, "T", (double)T);
        cJSON_AddNumberToObject(arm, "median_ms", ms);
        cJSON_AddNumberToObject(arm, "tokens_per_s", (double)T / (ms * 1e-3));
        cJSON_AddNumberToObject(arm, "cpu_ms", cms);
        cJSON_AddNumberToObject(arm, "peak_bytes", (double)peak);
        cJSON_AddNumberToObject(arm, "plan_bytes", (double)plan.peak_bytes);
        cJSON_AddNumberToObject(arm, "size_table_bytes", (double)sizes.total);
        cJSON_AddNumberToObject(arm, "bench_buffers_bytes", (double)tok_bytes);
        cJSON_AddNumberToObject(arm, "step_gflop", fl * 1e-9);
        cJSON_AddNumberToObject(arm, "gflops", gf);
        cJSON_AddNumberToObject(arm, "mfu_vs_sgemm", gf / sgemm);
        cJSON_AddNumberToObject(arm, "last_loss", loss);
        cJSON *ctimes = cJSON_AddArrayToObject(arm, "step_cpu_ms");
        for (int r = c.warmup; r < n; r++) cJSON_AddItemToArray(ctimes, cJSON_CreateNumber(ours_cpu[r]));
        cJSON *times = cJSON_AddArrayToObject(arm, "step_ms");
        for (int r = c.warmup; r < n; r++) cJSON_AddItemToArray(times, cJSON_CreateNumber(ours[r]));
        cJSON_AddItemToArray(arms, arm);
        fprintf(stderr, "T=%lld longtune: %.0f ms/step, %.0f tokens/s, peak %.1f MiB (plan %.1f MiB), %.1f GFLOP/s = %.2f of sgemm\n",
                (long long)T, ms, (double)T / (ms * 1e-3), (double)peak / 1048576.0, (double)plan.peak_bytes / 1048576.0,
                gf, gf / sgemm);
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
            cJSON_AddNumberToObject(pa, "gflops", fl / (pms * 1e-3) * 1e-9);
            cJSON_AddNumberToObject(pa, "mfu_vs_sgemm", fl / (pms * 1e-3) * 1e-9 / sgemm);
            cJSON_AddNumberToObject(pa, "last_loss", peer_loss);
            cJSON_AddNumberToObject(pa, "longtune_speedup", pms / ms);
            cJSON_AddNumberToObject(pa, "longtune_speedup_cpu_time", pcms / cms);
            times = cJSON_AddArrayToObject(pa, "step_ms");
            for (int r = c.warmup; r < n; r++) cJSON_AddItemToArray(times, cJSON_CreateNumber(theirs[r]));
            cJSON_AddItemToArray(arms, pa);
            fprintf(stderr, "T=%lld peer:     %.0f ms/step, %.0f tokens/s, max RSS %.1f MiB -> longtune %.2fx the peer's tokens/s"
                            " (%.2fx by CPU time)\n",
                    (long long)T, pms, (double)T / (pms * 1e-3), peer_rss / 1048576.0, pms / ms, pcms / cms);
        }
        free(ours);
        free(theirs);
        free(ours_cpu);
        free(theirs_cpu);
    }
    peer_close(&pr);
    if (getloadavg(load, 1) == 1) cJSON_AddNumberToObject(jc, "loadavg_1min_at_end", load[0]);
    char tag[64];
    snprintf(tag, sizeof tag, "cpu-%s", random_w ? weights : "file");
    rc = lt_bench_write(&c, res, tag) == 0 ? 0 : 1;
    res = NULL;
    goto out;
fail:
    fprintf(stderr, "longtune bench train: %s\n", lt_ctx_error(ctx));
out:
    peer_close(&pr);
    cJSON_Delete(res);
    if (mom) lt_free(ctx, LT_DEVICE_CPU, mom, mom_bytes);
    if (tok) lt_free(ctx, LT_DEVICE_CPU, tok, tok_bytes);
    lt_model_free(ctx, m);
    if (have_dir) remove_tree(dir);
    lt_ctx_free(ctx);
    return rc;
}
