/* Benchmark shapes and streamed random checkpoints (see bench_model.h). The values are a counter
 * hash of (seed, tensor, index), so any chunk can be generated on any thread in any order and the
 * file is the same for every thread count. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_lib.h"
#include "bench_model.h"
#include "longtune/alloc.h"
#include "longtune/log.h"
#include "longtune/plan.h"
#include "longtune/tensor.h"

static const lt_bench_shape shapes[] = {
    {"qwen3-8b", "Qwen3-8B (L=36 C=4096 F=12288 H=32 Hkv=8 D=128 V=151936, untied)", LT_ARCH_QWEN3, 151936, 4096, 12288,
     36, 32, 8, 128, 1000000.0, 1e-6, 0, 40960, 0, 0, 0, 0, 0.0},
    {"smollm2-135m", "SmolLM2-135M (L=30 C=576 F=1536 H=9 Hkv=3 D=64 V=49152, tied)", LT_ARCH_LLAMA, 49152, 576, 1536,
     30, 9, 3, 64, 100000.0, 1e-5, 1, 8192, 0, 0, 0, 0, 0.0},
    {"tiny", "tiny Qwen3-style test shape (L=2 C=64 F=128 H=4 Hkv=2 D=16 V=512, untied)", LT_ARCH_QWEN3, 512, 64, 128,
     2, 4, 2, 16, 10000.0, 1e-6, 0, 4096, 0, 0, 0, 0, 0.0},
    /* Qwen3-30B-A3B's published config.json with 4 of its 48 layers */
    {"qwen3-30b-a3b-l4",
     "Qwen3-30B-A3B with 4 layers (L=4 C=2048 H=32 Hkv=4 D=128 E=128 K=8 moe_F=768 V=151936, untied)", LT_ARCH_QWEN3,
     151936, 2048, 6144, 4, 32, 4, 128, 1000000.0, 1e-6, 0, 40960, 128, 8, 768, 1, 0.001},
    {"tiny-moe", "tiny Qwen3-MoE test shape (L=2 C=64 H=4 Hkv=2 D=16 E=8 K=2 moe_F=32 V=512, untied)", LT_ARCH_QWEN3,
     512, 64, 128, 2, 4, 2, 16, 10000.0, 1e-6, 0, 4096, 8, 2, 32, 1, 0.001},
};

const lt_bench_shape *lt_bench_shape_find(const char *name) {
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (name && !strcmp(name, shapes[i].name)) return &shapes[i];
    return NULL;
}

const char *lt_bench_shape_names(void) { return "qwen3-8b|smollm2-135m|tiny"; }

const char *lt_bench_moe_shape_names(void) { return "qwen3-30b-a3b-l4|tiny-moe"; }

const char *lt_bench_parse_shape(const char *v, void *dst) {
    if (!lt_bench_shape_find(v)) return "a shape: qwen3-8b|smollm2-135m|tiny|qwen3-30b-a3b-l4|tiny-moe";
    *(const char **)dst = v;
    return NULL;
}

const char *lt_bench_parse_moe_shape(const char *v, void *dst) {
    const lt_bench_shape *s = lt_bench_shape_find(v);
    if (!s || s->E <= 0) return "a mixture-of-experts shape: qwen3-30b-a3b-l4|tiny-moe";
    *(const char **)dst = v;
    return NULL;
}

lt_model_config lt_bench_shape_config(const lt_bench_shape *s, lt_dtype dt) {
    lt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = s->arch;
    c.V = s->V, c.C = s->C, c.F = s->F, c.L = s->L, c.H = s->H, c.Hkv = s->Hkv, c.D = s->D;
    c.max_positions = s->max_positions;
    c.rope_theta = s->rope_theta;
    c.rms_eps = (float)s->rms_eps;
    c.tie_embeddings = s->tied;
    c.qk_norm = s->arch == LT_ARCH_QWEN3;
    c.bos_id = -1, c.eos_id = -1;
    for (int p = 0; p < LT_PROJ_COUNT_; p++) c.proj_dtype[p] = dt;
    c.embed_dtype = dt;
    c.head_dtype = dt;
    if (s->E > 0) {
        c.mlp = LT_MLP_KIND_MOE;
        c.n_experts = s->E, c.n_experts_used = s->K, c.moe_F = s->moe_F, c.moe_every = 1;
        c.moe_norm_topk = s->norm_topk;
        c.moe_aux_coef = (float)s->aux_coef;
    }
    return c;
}

/* One tensor of the checkpoint, in file order. */
typedef struct tdesc {
    char name[96];
    int64_t r, c; /* c = 0: a 1-d norm of r ones (f32) */
} tdesc;

static int64_t list_tensors(const lt_bench_shape *s, tdesc *out) {
    int64_t n = 0;
#define ADD(R, Cc, ...)                                             \
    do {                                                            \
        if (out) {                                                  \
            snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__); \
            out[n].r = (R), out[n].c = (Cc);                        \
        }                                                           \
        n++;                                                        \
    } while (0)
    int64_t q = s->H * s->D, kv = s->Hkv * s->D;
    ADD(s->V, s->C, "model.embed_tokens.weight");
    if (!s->tied) ADD(s->V, s->C, "lm_head.weight");
    ADD(s->C, 0, "model.norm.weight");
    for (int64_t l = 0; l < s->L; l++) {
        long long ll = (long long)l;
        ADD(s->C, 0, "model.layers.%lld.input_layernorm.weight", ll);
        ADD(q, s->C, "model.layers.%lld.self_attn.q_proj.weight", ll);
        ADD(kv, s->C, "model.layers.%lld.self_attn.k_proj.weight", ll);
        ADD(kv, s->C, "model.layers.%lld.self_attn.v_proj.weight", ll);
        ADD(s->C, q, "model.layers.%lld.self_attn.o_proj.weight", ll);
        if (s->arch == LT_ARCH_QWEN3) {
            ADD(s->D, 0, "model.layers.%lld.self_attn.q_norm.weight", ll);
            ADD(s->D, 0, "model.layers.%lld.self_attn.k_norm.weight", ll);
        }
        ADD(s->C, 0, "model.layers.%lld.post_attention_layernorm.weight", ll);
        if (s->E > 0) {
            ADD(s->E, s->C, "model.layers.%lld.mlp.gate.weight", ll);
            for (int64_t e = 0; e < s->E; e++) {
                long long ee = (long long)e;
                ADD(s->moe_F, s->C, "model.layers.%lld.mlp.experts.%lld.gate_proj.weight", ll, ee);
                ADD(s->moe_F, s->C, "model.layers.%lld.mlp.experts.%lld.up_proj.weight", ll, ee);
                ADD(s->C, s->moe_F, "model.layers.%lld.mlp.experts.%lld.down_proj.weight", ll, ee);
            }
            continue;
        }
        ADD(s->F, s->C, "model.layers.%lld.mlp.gate_proj.weight", ll);
        ADD(s->F, s->C, "model.layers.%lld.mlp.up_proj.weight", ll);
        ADD(s->C, s->F, "model.layers.%lld.mlp.down_proj.weight", ll);
    }
#undef ADD
    return n;
}

int64_t lt_bench_shape_params(const lt_bench_shape *s) {
    int64_t n = list_tensors(s, NULL), total = 0;
    tdesc *t = calloc((size_t)n, sizeof *t);
    if (!t) return 0;
    list_tensors(s, t);
    for (int64_t i = 0; i < n; i++) total += t[i].c ? t[i].r * t[i].c : t[i].r;
    free(t);
    return total;
}

void lt_bench_random_dir(const lt_bench_shape *s, lt_dtype dt, char *buf, size_t n) {
    const char *root = getenv("LONGTUNE_BENCH_WEIGHTS");
    snprintf(buf, n, "%s/%s-%s", root && *root ? root : "/tmp/longtune-bench-weights", s->name,
             dt == LT_DTYPE_BF16 ? "bf16" : "f32");
}

static int mkdirs(const char *dir) {
    char p[1024];
    snprintf(p, sizeof p, "%s", dir);
    for (char *q = p + 1; *q; q++) {
        if (*q != '/') continue;
        *q = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) return -1;
        *q = '/';
    }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

typedef struct fill_job {
    void *buf;
    int bf16, norm;
    uint64_t key;  /* seed and tensor index */
    int64_t first; /* element index of buf[0] within the tensor */
} fill_job;

static void fill_range(void *arg, int64_t b, int64_t e, int thread) {
    (void)thread;
    const fill_job *j = arg;
    const float a = 0.02f * 1.7320508f; /* uniform(-a, a) has std 0.02 */
    for (int64_t i = b; i < e; i++) {
        float x = 1.0f;
        if (!j->norm) {
            uint64_t z = j->key + (uint64_t)(j->first + i) * 0x9e3779b97f4a7c15ULL;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            z ^= z >> 31;
            x = a * ((float)(z >> 40) * 0x1.0p-23f - 1.0f);
        }
        if (j->bf16) ((uint16_t *)j->buf)[i] = lt_f32_to_bf16(x);
        else ((float *)j->buf)[i] = x;
    }
}

static int write_all(FILE *f, const void *p, size_t n) { return fwrite(p, 1, n, f) == n ? 0 : -1; }

static int write_file_text(const char *path, const char *text) {
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

int lt_bench_random_checkpoint(lt_ctx *ctx, const char *dir, const lt_bench_shape *s, lt_dtype dt, uint64_t seed,
                               int threads, int *written) {
    *written = 0;
    int bf16 = dt == LT_DTYPE_BF16;
    char path[1200], stamp[256], want[256];
    snprintf(want, sizeof want, "shape=%s dtype=%s seed=%llu format=1\n", s->name, bf16 ? "bf16" : "f32",
             (unsigned long long)seed);
    snprintf(path, sizeof path, "%s/longtune-random", dir);
    FILE *f = fopen(path, "rb");
    if (f) {
        size_t k = fread(stamp, 1, sizeof stamp - 1, f);
        stamp[k] = 0;
        fclose(f);
        if (!strcmp(stamp, want)) return 0;
    }
    unlink(path); /* the stamp goes last: a folder without it is never trusted */
    if (mkdirs(dir) != 0) {
        fprintf(stderr, "random checkpoint: cannot create %s: %s\n", dir, strerror(errno));
        return -1;
    }

    char cfg[2048], moe[512] = "";
    /* the MoE keys as Qwen3-30B-A3B's published config.json spells them */
    if (s->E > 0)
        snprintf(moe, sizeof moe,
                 " \"num_experts\": %lld, \"num_experts_per_tok\": %lld, \"moe_intermediate_size\": %lld,"
                 " \"norm_topk_prob\": %s, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
                 " \"output_router_logits\": %s, \"router_aux_loss_coef\": %g,",
                 (long long)s->E, (long long)s->K, (long long)s->moe_F, s->norm_topk ? "true" : "false",
                 s->aux_coef > 0 ? "true" : "false", s->aux_coef);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"vocab_size\": %lld, \"hidden_size\": %lld,"
             " \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, \"num_attention_heads\": %lld,"
             " \"num_key_value_heads\": %lld, \"head_dim\": %lld, \"max_position_embeddings\": %lld,%s"
             " \"rms_norm_eps\": %g, \"rope_theta\": %.1f, \"tie_word_embeddings\": %s, \"hidden_act\": \"silu\","
             " \"attention_bias\": false, \"torch_dtype\": \"%s\"}\n",
             s->E > 0                       ? "Qwen3MoeForCausalLM"
                 : s->arch == LT_ARCH_QWEN3 ? "Qwen3ForCausalLM"
                                            : "LlamaForCausalLM",
             s->E > 0                       ? "qwen3_moe"
                 : s->arch == LT_ARCH_QWEN3 ? "qwen3"
                                            : "llama",
             (long long)s->V, (long long)s->C, (long long)s->F, (long long)s->L, (long long)s->H, (long long)s->Hkv,
             (long long)s->D, (long long)s->max_positions, moe, s->rms_eps, s->rope_theta, s->tied ? "true" : "false",
             bf16 ? "bfloat16" : "float32");
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (write_file_text(path, cfg) != 0) {
        fprintf(stderr, "random checkpoint: cannot write %s\n", path);
        return -1;
    }

    int64_t nt = list_tensors(s, NULL);
    tdesc *t = calloc((size_t)nt, sizeof *t);
    size_t hcap = (size_t)nt * 160 + 256;
    char *hdr = malloc(hcap);
    enum { CHUNK = 8 << 20 }; /* elements per write */
    void *buf = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)CHUNK * 4, "random checkpoint chunk");
    FILE *out = NULL;
    int rc = -1;
    char tmp[1300];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!t || !hdr || !buf) {
        fprintf(stderr, "random checkpoint: out of host memory\n");
        goto done;
    }
    list_tensors(s, t);
    /* header: {"__metadata__": {...}, name: {dtype, shape, data_offsets}, ...}, space-padded to 8 */
    size_t hl =
        (size_t)snprintf(hdr, hcap, "{\"__metadata__\":{\"format\":\"pt\",\"longtune\":\"random %s\"}", s->name);
    uint64_t off = 0;
    for (int64_t i = 0; i < nt; i++) {
        int norm = t[i].c == 0;
        uint64_t n = (uint64_t)(norm ? t[i].r : t[i].r * t[i].c), bytes = n * (norm || !bf16 ? 4u : 2u);
        char shape[64];
        if (norm) snprintf(shape, sizeof shape, "[%lld]", (long long)t[i].r);
        else snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)t[i].r, (long long)t[i].c);
        hl += (size_t)snprintf(hdr + hl, hcap - hl,
                               ",\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}", t[i].name,
                               norm || !bf16 ? "F32" : "BF16", shape, (unsigned long long)off,
                               (unsigned long long)(off + bytes));
        off += bytes;
    }
    hl += (size_t)snprintf(hdr + hl, hcap - hl, "}");
    while (hl % 8) hdr[hl++] = ' ';
    out = fopen(tmp, "wb");
    if (!out) {
        fprintf(stderr, "random checkpoint: cannot create %s: %s\n", tmp, strerror(errno));
        goto done;
    }
    uint8_t len8[8];
    for (int k = 0; k < 8; k++) len8[k] = (uint8_t)((uint64_t)hl >> (8 * k));
    if (write_all(out, len8, 8) || write_all(out, hdr, hl)) goto io_fail;
    for (int64_t i = 0; i < nt; i++) {
        int norm = t[i].c == 0;
        int64_t n = norm ? t[i].r : t[i].r * t[i].c;
        int b16 = bf16 && !norm;
        for (int64_t first = 0; first < n; first += CHUNK) {
            int64_t k = n - first < CHUNK ? n - first : CHUNK;
            fill_job j = {buf, b16, norm, seed * 0xd1b54a32d192ed03ULL + ((uint64_t)i << 40), first};
            lt_bench_parallel_for(threads, k, 1 << 16, fill_range, &j);
            if (write_all(out, buf, (size_t)k * (b16 ? 2u : 4u))) goto io_fail;
        }
    }
    /* no fsync: this is a cache that any run regenerates, and forcing 16 GB to disk would cost a
     * benchmark run half a minute; the stamp still goes last, after the rename */
    if (fflush(out) != 0) goto io_fail;
    if (fclose(out) != 0) {
        out = NULL;
        goto io_fail;
    }
    out = NULL;
    if (rename(tmp, path) != 0) goto io_fail;
    snprintf(path, sizeof path, "%s/longtune-random", dir);
    if (write_file_text(path, want) != 0) goto io_fail;
    *written = 1;
    rc = 0;
    goto done;
io_fail:
    fprintf(stderr, "random checkpoint: writing %s failed: %s\n", tmp, strerror(errno));
    if (out) fclose(out);
    out = NULL;
    unlink(tmp);
done:
    free(t);
    free(hdr);
    lt_free(ctx, LT_DEVICE_CPU, buf, (size_t)CHUNK * 4);
    return rc;
}

cJSON *lt_bench_gpu_peer_run(const char *peer_path, const char *args) {
    return lt_bench_gpu_peer_run_script(peer_path, "bench/peers/train_peft_gpu.py", args);
}

/* Why the last peer run failed, for the result files. */
static char peer_failure[640] = "failed to start";

const char *lt_bench_peer_failure(void) { return peer_failure; }

cJSON *lt_bench_gpu_peer_run_script(const char *peer_path, const char *script, const char *args) {
    const char *src = getenv("LONGTUNE_SOURCE_DIR");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "PYTHONPATH='%s'${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 python3 '%s/%s' %s",
             peer_path, src && *src ? src : ".", script, args);
    fprintf(stderr, "peer: %s\n", cmd);
    fflush(NULL);
    FILE *p = popen(cmd, "r");
    if (!p) {
        snprintf(peer_failure, sizeof peer_failure, "failed to start: cannot start python3: %s", strerror(errno));
        fprintf(stderr, "peer: %s\n", peer_failure);
        return NULL;
    }
    cJSON *lines = cJSON_CreateArray();
    char line[1 << 16];
    int ready = 0;
    while (fgets(line, sizeof line, p)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        if (cJSON_IsTrue(cJSON_GetObjectItem(j, "ready"))) ready = 1;
        if (cJSON_IsNumber(cJSON_GetObjectItem(j, "T"))) { /* progress: the first 300 bytes of a result line */
            int len = (int)strcspn(line, "\n");
            fprintf(stderr, "peer: %.*s\n", len > 300 ? 300 : len, line);
        }
        cJSON_AddItemToArray(lines, j);
    }
    int st = pclose(p);
    if (!ready) {
        /* the peer's own reason, where it gave one ({"ready": false, "error": ...}) */
        const cJSON *why = NULL, *l;
        cJSON_ArrayForEach(l, lines) if (cJSON_IsString(cJSON_GetObjectItem(l, "error"))) why = l;
        if (why)
            snprintf(peer_failure, sizeof peer_failure, "failed to start: %s",
                     cJSON_GetStringValue(cJSON_GetObjectItem(why, "error")));
        else
            snprintf(peer_failure, sizeof peer_failure,
                     "failed to start: no ready line (exit status %d; torch, transformers and peft must import)", st);
        fprintf(stderr, "peer: %s\n", peer_failure);
        cJSON_Delete(lines);
        return NULL;
    }
    return lines;
}

const cJSON *lt_bench_peer_find(const cJSON *lines, const char *key, int64_t T) {
    const cJSON *j;
    cJSON_ArrayForEach(j, lines) {
        if (!cJSON_GetObjectItem(j, key)) continue;
        const cJSON *t = cJSON_GetObjectItem(j, "T");
        if (T <= 0 || (cJSON_IsNumber(t) && (int64_t)t->valuedouble == T)) return j;
    }
    return NULL;
}

lt_status lt_bench_load_random(lt_ctx *ctx, const lt_bench_shape *s, lt_dtype dt, lt_device dev,
                               const lt_lora_options *lo, int threads, lt_model **out) {
    lt_model_options mo = {.device = dev};
    return lt_bench_load_random_as(ctx, s, dt, &mo, lo, threads, out);
}

lt_status lt_bench_load_random_as(lt_ctx *ctx, const lt_bench_shape *s, lt_dtype dt, const lt_model_options *mo,
                                  const lt_lora_options *lo, int threads, lt_model **out) {
    char dir[1024];
    lt_bench_random_dir(s, dt, dir, sizeof dir);
    double t0 = lt_time_now();
    int written = 0;
    if (lt_bench_random_checkpoint(ctx, dir, s, dt, 0x7ea1ULL, threads, &written) != 0)
        return lt_error(ctx, LT_ERR_IO, "bench: cannot write the random %s checkpoint into %s", s->name, dir);
    fprintf(stderr, "random %s (%s) %s %s in %.1f s\n", s->name, dt == LT_DTYPE_BF16 ? "bf16" : "f32",
            written ? "written to" : "reused from", dir, lt_time_now() - t0);
    t0 = lt_time_now();
    lt_status st = lt_model_load(ctx, dir, mo, lo, out);
    if (st == LT_OK)
        fprintf(stderr, "loaded on %s in %.1f s\n", mo->device == LT_DEVICE_CUDA ? "cuda" : "cpu", lt_time_now() - t0);
    return st;
}

static void flop_terms(const lt_model_config *cfg, int64_t r, int64_t T, double *P, double *R, double *A) {
    double C = (double)cfg->C, F = (double)cfg->F, qd = (double)(cfg->H * cfg->D), kvd = (double)(cfg->Hkv * cfg->D);
    double t = (double)T;
    *P = C * qd + 2 * C * kvd + qd * C + 3 * C * F;
    *R = (double)r * ((C + qd) + 2 * (C + kvd) + (qd + C) + 2 * (C + F) + (F + C));
    *A = 2.0 * (double)cfg->H * t * t * (double)cfg->D;
}

double lt_bench_model_flops(const lt_model_config *cfg, int64_t r, int64_t T) {
    double P, R, A, t = (double)T;
    flop_terms(cfg, r, T, &P, &R, &A);
    return (double)cfg->L * (4.0 * P * t + 6.0 * R * t + 3.0 * A) + 4.0 * (double)cfg->V * (double)cfg->C * t;
}

double lt_bench_hw_flops(const lt_model_config *cfg, int64_t r, int64_t T, double rerun, int kept_qkv) {
    double P, R, A, t = (double)T, CF = (double)cfg->C * (double)cfg->F;
    flop_terms(cfg, r, T, &P, &R, &A);
    double attn = (3.5 + rerun) * A;
    double C = (double)cfg->C, qd = (double)(cfg->H * cfg->D), kvd = (double)(cfg->Hkv * cfg->D);
    double Pa = 2 * C * qd + 2 * C * kvd, Ra = (double)r * (2 * (C + qd) + 2 * (C + kvd));
    double kept = kept_qkv ? (1.0 - rerun) * 2.0 * (Pa + Ra) * t : 0.0;
    return (double)cfg->L * (4.0 * P * t + 2.0 * (P - CF) * t + 10.0 * R * t + attn - kept) +
        4.0 * (double)cfg->V * (double)cfg->C * t;
}

const char *const lt_bench_flops_note =
    "per step of T tokens, B=1: model_flops = L*(4*P*T + 6*R*T + 3*A) + 4*V*C*T (MFU); hw_flops = "
    "L*(4*P*T + 2*(P - C*F)*T + 10*R*T + (3.5 + k)*A) + 4*V*C*T (HFU: adds the recomputed layer forward "
    "without the down projection's base product, k = the share of the layers whose recompute reruns attention "
    "(the others keep its output with the checkpoints; the last segment's stores survive from the forward); on the CPU, keeping it also keeps q, k, v and x_mid, so the recompute skips "
    "the q,k,v,o projections: minus L*2*(Pa + Ra)*T, their shares of P and R; attention backward 2.5*A as FlashAttention counts it). P = weight elements of one layer's q,k,v,o,gate,up,down; "
    "R = r*sum(in+out) over the 7 adapters; A = causal attention forward 2*H*T^2*D. Frozen base: "
    "no weight-gradient GEMMs. Head: forward + input gradient. Norms, RoPE, SwiGLU, AdamW not counted.";

int lt_bench_parse_recompute(const char *bench, const char *value, int allow_none, lt_recompute *r, int64_t *k) {
    lt_ctx *pc = lt_ctx_new();
    if (!pc) return 1;
    lt_status ps = lt_plan_recompute_parse(pc, value, r, k);
    if (ps == LT_OK && *r != LT_RECOMPUTE_EVERY && *r != LT_RECOMPUTE_EVERY_K &&
        (!allow_none || *r != LT_RECOMPUTE_NONE))
        ps = lt_error(pc, LT_ERR_INVALID_ARG, "recompute policy '%s': this bench takes %sall or every:K", value,
                      allow_none ? "none, " : "");
    int rc = ps == LT_OK ? 0 : lt_bench_usage_error(bench, NULL, "--recompute: %s", lt_ctx_error(pc));
    lt_ctx_free(pc);
    return rc;
}

void lt_bench_recompute_tag(lt_recompute r, int64_t k, char *buf, size_t n) {
    if (r == LT_RECOMPUTE_EVERY_K) snprintf(buf, n, "-every%lld", (long long)(k > 0 ? k : 2));
    else if (r == LT_RECOMPUTE_NONE) snprintf(buf, n, "-norecompute");
    else if (n) buf[0] = '\0';
}
