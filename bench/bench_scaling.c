/* `longtune bench scaling`: data-parallel training throughput of the library's trainer
 * (lt_train_fit) at each world size asked for: world 1 in this process, world K by re-running
 * this command under `mpirun -np K` (rank 0 reports back one JSON line). All ranks of one host
 * share its cores (the thread total is fixed), so the ideal speedup here is 1.0: the figure shows
 * the data-parallel overhead, not scaling with added hardware. The model is a random small Llama
 * (or --model PATH). Several GPUs: --backend cuda, in bench_scaling_cuda.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_scaling.h"
#include "bench.h"
#include "longtune/alloc.h"
#include "longtune/comm.h"
#include "longtune/log.h"
#include "longtune/safetensors.h"
#include "longtune/train.h"

#define MAX_WORLDS 8
#define ARM_TAG "LT_SCALING_ARM "

typedef struct shape {
    int64_t V, C, F, L, H, Hkv, D;
} shape;

typedef struct cfg {
    shape s;
    int64_t seq, batch, steps, warmup;
    int threads;      /* threads of the whole world (each rank gets threads / K) */
    char model[1024]; /* given model, or the random one written into tmp */
} cfg;

#define SYNOPSIS "longtune bench scaling [options] (--help)"

/* --worlds: a comma list of world sizes 1..1024. */
typedef struct world_list {
    int *w, *n;
} world_list;

static const char *parse_worlds(const char *v, void *dst) {
    world_list *l = dst;
    int64_t w[MAX_WORLDS];
    const int n = lt_bench_parse_i64_list(v, w, MAX_WORLDS, 1, 1024);
    if (n < 0) return "a comma list of world sizes from 1 to 1024";
    for (int i = 0; i < n; i++) l->w[i] = (int)w[i];
    *l->n = n;
    return NULL;
}

/* A random Llama folder (config.json + f32 model.safetensors, tied embeddings) of shape s. */
static lt_status write_model(lt_ctx *ctx, const char *dir, const shape *s) {
    char path[1200], text[1024];
    snprintf(text, sizeof text,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": %lld,"
             " \"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld,"
             " \"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld,"
             " \"max_position_embeddings\": 65536, \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0,"
             " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\", \"bos_token_id\": 1, \"eos_token_id\": 2}",
             (long long)s->V, (long long)s->C, (long long)s->F, (long long)s->L, (long long)s->H, (long long)s->Hkv,
             (long long)s->D);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fputs(text, f) < 0 || fclose(f)) return lt_error(ctx, LT_ERR_IO, "%s: cannot write", path);
    const int64_t per = 9, n = 2 + per * s->L;
    lt_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    char(*names)[96] = calloc((size_t)n, sizeof *names);
    float **bufs = calloc((size_t)n, sizeof *bufs);
    size_t *bytes = calloc((size_t)n, sizeof *bytes);
    lt_status st = LT_OK;
    if (!e || !names || !bufs || !bytes) {
        st = lt_error(ctx, LT_ERR_OOM, "bench scaling: tensor table");
        goto done;
    }
    const int64_t q = s->H * s->D, kv = s->Hkv * s->D;
    const int64_t rows[9] = {s->C, q, kv, kv, s->C, s->C, s->F, s->F, s->C};
    const int64_t cols[9] = {0, s->C, s->C, s->C, q, 0, s->C, s->C, s->F};
    static const char *const fmt[9] = {"model.layers.%lld.input_layernorm.weight",
                                       "model.layers.%lld.self_attn.q_proj.weight",
                                       "model.layers.%lld.self_attn.k_proj.weight",
                                       "model.layers.%lld.self_attn.v_proj.weight",
                                       "model.layers.%lld.self_attn.o_proj.weight",
                                       "model.layers.%lld.post_attention_layernorm.weight",
                                       "model.layers.%lld.mlp.gate_proj.weight",
                                       "model.layers.%lld.mlp.up_proj.weight",
                                       "model.layers.%lld.mlp.down_proj.weight"};
    uint64_t seed = 0x5ca1e;
    for (int64_t k = 0; k < n; k++) {
        int64_t r, c;
        if (k < 2) {
            snprintf(names[k], 96, k ? "model.norm.weight" : "model.embed_tokens.weight");
            r = k ? s->C : s->V, c = k ? 0 : s->C;
        } else {
            snprintf(names[k], 96, fmt[(k - 2) % per], (long long)((k - 2) / per));
            r = rows[(k - 2) % per], c = cols[(k - 2) % per];
        }
        int64_t cnt = c ? r * c : r;
        bytes[k] = (size_t)cnt * sizeof(float);
        bufs[k] = lt_alloc(ctx, LT_DEVICE_CPU, bytes[k], "bench scaling random weights");
        if (!bufs[k]) {
            st = LT_ERR_OOM;
            goto done;
        }
        /* Uniform with std 0.02 (transformers' initializer_range); norms 1. */
        for (int64_t i = 0; i < cnt; i++)
            bufs[k][i] = c ? 0.0346f * ((float)(lt_bench_rand_u64(&seed) >> 40) * 0x1.0p-23f - 1.0f) : 1.0f;
        int64_t shp[2] = {r, c};
        e[k].name = names[k];
        e[k].tensor = lt_tensor_view(bufs[k], LT_DTYPE_F32, LT_DEVICE_CPU, c ? 2 : 1, shp);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    st = lt_safetensors_write(ctx, path, e, n, NULL, 0);
done:
    if (bufs)
        for (int64_t k = 0; k < n; k++)
            if (bufs[k]) lt_free(ctx, LT_DEVICE_CPU, bufs[k], bytes[k]);
    free(e), free(names), free(bufs), free(bytes);
    return st;
}

/* One world's measurement through the trainer: warmup + steps optimizer steps on synthetic
 * sequences (the same on every rank), each step's wall time read back from the metrics log rank 0
 * writes (one record per step). Fills the median step time and tokens/s of the timed steps. */
static lt_status measure(lt_ctx *ctx, lt_comm *comm, const cfg *c, const char *adapters, double *step_ms,
                         double *tokens_per_s, size_t *peak) {
    lt_train_options o;
    memset(&o, 0, sizeof o);
    char v[64];
    LT_TRY(lt_train_options_set(ctx, &o, "model", c->model));
    LT_TRY(lt_train_options_set(ctx, &o, "data", "(in memory)"));
    LT_TRY(lt_train_options_set(ctx, &o, "adapter_path", adapters));
    snprintf(v, sizeof v, "%lld", (long long)(c->steps + c->warmup));
    LT_TRY(lt_train_options_set(ctx, &o, "iters", v));
    snprintf(v, sizeof v, "%lld", (long long)c->batch);
    LT_TRY(lt_train_options_set(ctx, &o, "batch_size", v));
    snprintf(v, sizeof v, "%lld", (long long)c->seq);
    LT_TRY(lt_train_options_set(ctx, &o, "max_seq_length", v));
    LT_TRY(lt_train_options_set(ctx, &o, "learning_rate", "1e-4"));
    LT_TRY(lt_train_options_set(ctx, &o, "steps_per_report", "1"));
    LT_TRY(lt_train_options_set(ctx, &o, "steps_per_eval", "1000000000"));
    LT_TRY(lt_train_options_set(ctx, &o, "save_every", "1000000000"));
    LT_TRY(lt_train_options_set(ctx, &o, "grad_checkpoint", "true"));
    int threads = c->threads / lt_comm_size(comm);
    snprintf(v, sizeof v, "%d", threads > 0 ? threads : 1);
    LT_TRY(lt_train_options_set(ctx, &o, "threads", v));
    lt_train_options ro;
    LT_TRY(lt_train_options_resolve(ctx, &o, &ro));
    lt_ctx_set_threads(ctx, ro.threads);

    /* Synthetic data: sequences of 3/4 of a row (so packing has something to do), random ids. */
    int64_t len = c->seq * 3 / 4 > 2 ? c->seq * 3 / 4 : 2, nseq = 4 * c->batch * (c->steps + c->warmup) + 8;
    size_t tb = (size_t)(nseq * len) * sizeof(int32_t), ob = (size_t)(nseq + 1) * sizeof(int64_t);
    int32_t *tok = lt_alloc(ctx, LT_DEVICE_CPU, tb, "bench scaling tokens");
    int64_t *off = lt_alloc(ctx, LT_DEVICE_CPU, ob, "bench scaling offsets");
    lt_model *m = NULL;
    lt_status s = LT_OK;
    if (!tok || !off) {
        s = LT_ERR_OOM;
        goto done;
    }
    lt_lora_options lora;
    if ((s = lt_train_lora_options(ctx, &ro, &lora)) != LT_OK) goto done;
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    if ((s = lt_model_load(ctx, c->model, &mo, &lora, &m)) != LT_OK) goto done;
    uint64_t seed = 0xda7a, V = (uint64_t)lt_model_get_config(m)->V;
    for (int64_t i = 0; i < nseq * len; i++) tok[i] = (int32_t)(3 + lt_bench_rand_u64(&seed) % (V - 3));
    for (int64_t i = 0; i <= nseq; i++) off[i] = i * len;
    lt_pack_input in = {tok, NULL, off, nseq};
    lt_train_result res;
    memset(&res, 0, sizeof res);
    res.comm = comm;
    FILE *quiet = fopen("/dev/null", "w");
    s = lt_train_fit(ctx, &ro, m, &in, NULL, quiet, &res);
    if (quiet) fclose(quiet);
    if (s != LT_OK) goto done;
    *peak = res.peak_bytes;
    if (lt_comm_rank(comm) == 0) {
        char path[1200], line[1024];
        snprintf(path, sizeof path, "%s/metrics.jsonl", adapters);
        FILE *f = fopen(path, "r");
        if (!f) {
            s = lt_error(ctx, LT_ERR_IO, "%s: cannot read the step log", path);
            goto done;
        }
        double prev = 0, dt[4096], tps[4096];
        int n = 0;
        while (fgets(line, sizeof line, f) && n < 4096) {
            cJSON *r = cJSON_Parse(line);
            const cJSON *st = cJSON_GetObjectItem(r, "step"), *el = cJSON_GetObjectItem(r, "elapsed_s");
            const cJSON *tp = cJSON_GetObjectItem(r, "tokens_per_s");
            if (cJSON_IsNumber(st) && cJSON_IsNumber(el) && cJSON_IsNumber(tp) && st->valuedouble >= 1) {
                if (st->valuedouble > (double)c->warmup) {
                    dt[n] = (el->valuedouble - prev) * 1e3;
                    tps[n] = tp->valuedouble;
                    n++;
                }
                prev = el->valuedouble;
            }
            cJSON_Delete(r);
        }
        fclose(f);
        if (n < 1) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: no timed steps", path);
            goto done;
        }
        *step_ms = lt_bench_median(dt, n);
        *tokens_per_s = lt_bench_median(tps, n);
    }
done:
    if (m) lt_model_free(ctx, m);
    if (tok) lt_free(ctx, LT_DEVICE_CPU, tok, tb);
    if (off) lt_free(ctx, LT_DEVICE_CPU, off, ob);
    return s;
}

static void remove_tree(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "longtune bench scaling: could not remove %s\n", dir);
}

/* World K > 1: this command again under mpirun; rank 0's tagged line carries the arm back. */
static cJSON *run_world(const cfg *c, int K, const char *tmp) {
    char self[1024], cmd[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return NULL;
    self[n] = '\0';
    snprintf(cmd, sizeof cmd,
             "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader OMP_NUM_THREADS=%d mpirun "
             "--allow-run-as-root --oversubscribe --bind-to none -np %d '%s' bench scaling --child --model '%s' "
             "--seq %lld --batch %lld --repeats %lld --warmup %lld --threads %d --adapters '%s/dp%d'",
             c->threads / K > 0 ? c->threads / K : 1, K, self, c->model, (long long)c->seq, (long long)c->batch,
             (long long)c->steps, (long long)c->warmup, c->threads, tmp, K);
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    char line[8192];
    cJSON *arm = NULL;
    while (fgets(line, sizeof line, p))
        if (!arm && !strncmp(line, ARM_TAG, strlen(ARM_TAG))) arm = cJSON_Parse(line + strlen(ARM_TAG));
    int rc = pclose(p);
    if (rc != 0 && arm) {
        cJSON_Delete(arm);
        arm = NULL;
    }
    return arm;
}

static cJSON *new_result(const cfg *c, int random_model) {
    cJSON *result = lt_bench_result_new("scaling");
    cJSON *config = cJSON_AddObjectToObject(result, "config");
    cJSON_AddStringToObject(config, "model", random_model ? "random llama" : c->model);
    if (random_model) {
        cJSON_AddNumberToObject(config, "hidden", (double)c->s.C);
        cJSON_AddNumberToObject(config, "layers", (double)c->s.L);
        cJSON_AddNumberToObject(config, "vocab", (double)c->s.V);
    }
    cJSON_AddNumberToObject(config, "seq_len", (double)c->seq);
    cJSON_AddNumberToObject(config, "global_batch", (double)c->batch);
    cJSON_AddNumberToObject(config, "timed_steps", (double)c->steps);
    cJSON_AddNumberToObject(config, "threads_total", c->threads);
    cJSON_AddStringToObject(config, "lora", "r=8 on all seven projections, recompute every layer, AdamW");
    cJSON_AddStringToObject(config, "transport", "MPI (Open MPI, shared memory) on one host");
    cJSON_AddStringToObject(config, "note",
                            "all ranks share one host's cores with a fixed thread total: the ideal speedup is 1.0 "
                            "and the figure is the data-parallel overhead (gradient all-reduce after the backward, "
                            "every rank packing the whole batch), not scaling with added hardware");
    cJSON_AddStringToObject(result, "gpu_points", "longtune bench scaling --backend cuda (one process per GPU, NCCL)");
    return result;
}

static cJSON *arm_json(int world, double ms, double tps, size_t peak, int threads) {
    cJSON *a = cJSON_CreateObject();
    char name[32];
    snprintf(name, sizeof name, "data-parallel world %d", world);
    cJSON_AddStringToObject(a, "name", name);
    cJSON_AddNumberToObject(a, "world", world);
    cJSON_AddNumberToObject(a, "threads_per_rank", threads);
    cJSON_AddNumberToObject(a, "median_ms", ms);
    cJSON_AddNumberToObject(a, "tokens_per_s", tps);
    cJSON_AddNumberToObject(a, "peak_bytes", (double)peak);
    return a;
}

int lt_bench_scaling(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--backend") && !strcmp(argv[i + 1], "cuda")) return lt_bench_scaling_cuda(argc, argv);
    lt_bench_common bc;
    lt_bench_common_init(&bc);
    bc.repeats = 3;
    cfg c;
    memset(&c, 0, sizeof c);
    c.s = (shape){4096, 256, 768, 4, 4, 2, 64};
    c.seq = 512, c.batch = 4;
    int child = 0, worlds[MAX_WORLDS], nworlds = 0;
    const char *adapters = NULL;
    int64_t threads = 0;
    world_list wl = {worlds, &nworlds};
    const char *model = NULL;
    const lt_bench_arg flags[] = {
        LT_BENCH_SET("--child", &child, 1),
        LT_BENCH_FN("--worlds", &wl, parse_worlds),
        LT_BENCH_STR("--model", &model),
        LT_BENCH_STR("--adapters", &adapters),
        LT_BENCH_I64("--seq", &c.seq, 2, 1 << 20),
        LT_BENCH_I64("--batch", &c.batch, 1, 4096),
        LT_BENCH_I64("--threads", &threads, 1, 4096),
        LT_BENCH_I64("--hidden", &c.s.C, 64, 8192),
        LT_BENCH_I64("--layers", &c.s.L, 1, 256),
        LT_BENCH_I64("--vocab", &c.s.V, 16, 1 << 20),
    };
    const int parsed =
        lt_bench_parse_args("scaling", SYNOPSIS, argc, argv, &bc, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench scaling [options]\n\n"
               "Data-parallel training throughput of the trainer at each world size: world 1 in this\n"
               "process, world K > 1 as `mpirun -np K longtune bench scaling` (Open MPI). Ranks of one host\n"
               "share its cores (the thread total stays fixed), so the ideal speedup is 1.0 and the figure\n"
               "is the data-parallel overhead. Several GPUs (NCCL, one process per GPU): --backend cuda\n"
               "(see `longtune bench scaling --backend cuda --help`).\n\n"
               "options:\n"
               "  --worlds LIST    world sizes, comma list (default 1, plus 2 when mpirun is installed)\n"
               "  --model PATH     HF folder or .gguf to train (default: a random Llama of --hidden,\n"
               "                   --layers, --vocab: 256, 4, 4096)\n"
               "  --seq T          tokens per row (default 512)   --batch B  rows per step, all ranks (4)\n"
               "  --threads N      threads of the whole world (default: all cores)\n"
               "Repeats count timed optimizer steps (default 3, after --warmup steps).\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
    if (c.s.C % 64)
        return lt_bench_usage_error("scaling", SYNOPSIS, "bad value '%lld' for --hidden: want a multiple of 64",
                                    (long long)c.s.C);
    if (model) snprintf(c.model, sizeof c.model, "%s", model);
    if (strcmp(bc.backend, "cpu"))
        return lt_bench_usage_error(
            "scaling", SYNOPSIS, "the data-parallel trainer runs on the CPU backend in this build; no --backend '%s'",
            bc.backend);
    c.steps = bc.repeats, c.warmup = bc.warmup;
    c.s.H = c.s.C / 64, c.s.Hkv = c.s.H > 1 ? c.s.H / 2 : 1, c.s.D = 64, c.s.F = 3 * c.s.C;
    c.threads = threads > 0 ? (int)threads : lt_bench_threads(NULL);
    lt_log_set_level(LT_LOG_WARN);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    int rc = 1;
    lt_comm *comm = NULL;
    lt_status s;

    if (child) {
        /* One rank of a world K run started by the parent below. */
        if ((s = lt_comm_init(ctx, NULL, &comm)) != LT_OK || !adapters || !c.model[0]) {
            fprintf(stderr, "longtune bench scaling: child: %s\n",
                    s != LT_OK ? lt_ctx_error(ctx) : "needs --adapters and --model");
            goto done;
        }
        double ms = 0, tps = 0;
        size_t peak = 0;
        if ((s = measure(ctx, comm, &c, adapters, &ms, &tps, &peak)) != LT_OK) {
            fprintf(stderr, "longtune bench scaling: rank %d: %s\n", lt_comm_rank(comm), lt_ctx_error(ctx));
            lt_comm_abort(comm, 1);
            goto done;
        }
        if (lt_comm_rank(comm) == 0) {
            cJSON *a = arm_json(lt_comm_size(comm), ms, tps, peak, c.threads / lt_comm_size(comm));
            char *text = cJSON_PrintUnformatted(a);
            printf(ARM_TAG "%s\n", text ? text : "{}");
            fflush(stdout);
            cJSON_free(text);
            cJSON_Delete(a);
        }
        rc = 0;
        goto done;
    }

    int env_size = 1;
    if (lt_comm_env_world(NULL, &env_size, NULL) && env_size > 1) {
        /* Started as `mpirun -np K longtune bench scaling`: measure world K only. Rank 0 writes the
         * random model and tells the others where; rank 0 writes the result. */
        if ((s = lt_comm_init(ctx, NULL, &comm)) != LT_OK) {
            fprintf(stderr, "longtune bench scaling: %s\n", lt_ctx_error(ctx));
            goto done;
        }
        int rank = lt_comm_rank(comm), K = lt_comm_size(comm), random_model = !c.model[0];
        char dir[64] = "/tmp/lt-bench-scaling-XXXXXX", ad[1100];
        double bad = 0;
        if (rank == 0) {
            if (!mkdtemp(dir)) bad = 1;
            if (bad == 0.0 && random_model) {
                snprintf(c.model, sizeof c.model, "%s/model", dir);
                mkdir(c.model, 0755);
                if (write_model(ctx, c.model, &c.s) != LT_OK) bad = 1;
            }
        }
        if (lt_comm_broadcast(ctx, comm, dir, sizeof dir, 0) != LT_OK ||
            lt_comm_broadcast(ctx, comm, c.model, sizeof c.model, 0) != LT_OK ||
            lt_comm_allreduce_sum(ctx, comm, &bad, 1, LT_COMM_F64) != LT_OK || bad > 0) {
            fprintf(stderr, "longtune bench scaling: rank %d: setting up: %s\n", rank, lt_ctx_error(ctx));
            lt_comm_abort(comm, 1);
            goto done;
        }
        snprintf(ad, sizeof ad, "%s/dp%d", dir, K);
        double ms = 0, tps = 0;
        size_t peak = 0;
        if ((s = measure(ctx, comm, &c, ad, &ms, &tps, &peak)) != LT_OK) {
            fprintf(stderr, "longtune bench scaling: rank %d: %s\n", rank, lt_ctx_error(ctx));
            lt_comm_abort(comm, 1);
            goto done;
        }
        lt_comm_barrier(ctx, comm);
        rc = 0;
        if (rank == 0) {
            cJSON *result = new_result(&c, random_model);
            cJSON_AddItemToArray(cJSON_AddArrayToObject(result, "arms"), arm_json(K, ms, tps, peak, c.threads / K));
            char tag[32];
            snprintf(tag, sizeof tag, "cpu-world%d", K);
            rc = lt_bench_write(&bc, result, tag) ? 1 : 0;
            remove_tree(dir);
        }
        goto done;
    }
    int have_mpirun = LT_HAVE_MPI && system("command -v mpirun >/dev/null 2>&1") == 0;
    if (!nworlds) {
        worlds[nworlds++] = 1;
        if (have_mpirun) worlds[nworlds++] = 2;
    }
    char tmp[] = "/tmp/lt-bench-scaling-XXXXXX";
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "longtune bench scaling: cannot make a temporary folder\n");
        goto done;
    }
    int random_model = !c.model[0];
    if (random_model) {
        snprintf(c.model, sizeof c.model, "%s/model", tmp);
        mkdir(c.model, 0755);
        if ((s = write_model(ctx, c.model, &c.s)) != LT_OK) {
            fprintf(stderr, "longtune bench scaling: %s\n", lt_ctx_error(ctx));
            goto cleanup;
        }
    }
    cJSON *result = new_result(&c, random_model);
    cJSON *arms = cJSON_AddArrayToObject(result, "arms");
    double tps1 = 0;
    int ok = 1;
    for (int w = 0; w < nworlds; w++) {
        cJSON *arm = NULL;
        if (worlds[w] == 1) {
            char ad[1100];
            snprintf(ad, sizeof ad, "%s/dp1", tmp);
            double ms = 0, tps = 0;
            size_t peak = 0;
            if ((s = measure(ctx, NULL, &c, ad, &ms, &tps, &peak)) != LT_OK) {
                fprintf(stderr, "longtune bench scaling: world 1: %s\n", lt_ctx_error(ctx));
                ok = 0;
                continue;
            }
            arm = arm_json(1, ms, tps, peak, c.threads);
        } else if (!have_mpirun) {
            arm = cJSON_CreateObject();
            char name[48];
            snprintf(name, sizeof name, "data-parallel world %d", worlds[w]);
            cJSON_AddStringToObject(arm, "name", name);
            cJSON_AddNumberToObject(arm, "world", worlds[w]);
            cJSON_AddStringToObject(arm, "not_run", LT_HAVE_MPI ? "mpirun not found" : "this build has no MPI");
        } else if (!(arm = run_world(&c, worlds[w], tmp))) {
            fprintf(stderr, "longtune bench scaling: world %d under mpirun failed\n", worlds[w]);
            ok = 0;
            continue;
        }
        const cJSON *t = cJSON_GetObjectItem(arm, "tokens_per_s");
        if (worlds[w] == 1 && cJSON_IsNumber(t)) tps1 = t->valuedouble;
        cJSON_AddItemToArray(arms, arm);
        fprintf(stderr, "world %d: %s\n", worlds[w],
                cJSON_IsNumber(t) ? "measured" : cJSON_GetObjectItem(arm, "not_run")->valuestring);
    }
    /* Speedup against world 1 of the same thread total (1.0 is ideal on one host). */
    cJSON *a;
    cJSON_ArrayForEach(a, arms) {
        const cJSON *t = cJSON_GetObjectItem(a, "tokens_per_s");
        if (tps1 > 0 && cJSON_IsNumber(t)) cJSON_AddNumberToObject(a, "speedup_vs_world1", t->valuedouble / tps1);
    }
    if (ok && !lt_bench_write(&bc, result, "cpu")) rc = 0;
    else if (!ok) cJSON_Delete(result);
cleanup:
    remove_tree(tmp);
done:
    lt_comm_free(ctx, comm);
    lt_ctx_free(ctx);
    return rc;
}
