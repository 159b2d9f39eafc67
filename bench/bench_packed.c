/* `longtune bench packed`: real tokens per second of LoRA training on Alpaca-shaped instruction
 * data (bench/data/alpaca-eval, made by scripts/prepare_alpaca.py) with sequence packing against
 * one unpadded sequence per step (unpacked batch 1) and batches of 8 padded to their longest
 * sequence (padded batch 8). Only positions holding real tokens count, never padding. The model is
 * SmolLM2-135M's real GGUF by default (CPU) or a random checkpoint of a bench shape (CUDA); every
 * arm runs the same model, LoRA (r=8 on all seven projections), recompute policy and AdamW.
 * Tokenised data can be saved to and read from a small cache file, so a machine without the
 * tokenizer's model file can run the bench on the same token ids. Reimplements no op. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_model.h"
#include "bench.h"
#include "backend/backend.h"
#include "longtune/alloc.h"
#include "longtune/dataset.h"
#include "longtune/gguf.h"
#include "longtune/log.h"
#include "longtune/model.h"
#include "longtune/pack.h"
#include "longtune/sysinfo.h"
#include "longtune/tokenizer.h"

/* ---- the token cache: "LTTOKv1\0", n_seqs u64, n_tokens u64, pad_id i32, 4 zero bytes,
 * offsets (n_seqs+1) i64, tokens (N) i32, supervised (N) u8; little-endian, as this machine ---- */

static const char tok_magic[8] = {'L', 'T', 'T', 'O', 'K', 'v', '1', 0};

typedef struct tokset {
    int64_t n_seqs, n_tokens;
    int32_t pad_id;
    int64_t *offsets;
    int32_t *tokens;
    uint8_t *supervised;
    size_t bytes; /* one accounted block holding the three arrays */
    void *block;
} tokset;

static lt_status tokset_alloc(lt_ctx *ctx, tokset *t) {
    t->bytes = (size_t)(t->n_seqs + 1) * 8 + (size_t)t->n_tokens * 5;
    t->block = lt_alloc(ctx, LT_DEVICE_CPU, t->bytes, "bench packed tokens");
    if (!t->block) return LT_ERR_OOM;
    t->offsets = t->block;
    t->tokens = (int32_t *)(t->offsets + t->n_seqs + 1);
    t->supervised = (uint8_t *)(t->tokens + t->n_tokens);
    return LT_OK;
}

static void tokset_free(lt_ctx *ctx, tokset *t) {
    if (t->block) lt_free(ctx, LT_DEVICE_CPU, t->block, t->bytes);
    memset(t, 0, sizeof *t);
}

static lt_status tokset_read(lt_ctx *ctx, const char *path, tokset *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: %s", path, strerror(errno));
    char magic[8];
    uint64_t n[2];
    int32_t pad[2];
    lt_status s = LT_OK;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, tok_magic, 8) || fread(n, 8, 2, f) != 2 ||
        fread(pad, 4, 2, f) != 2) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: not a longtune token cache (bad header)", path);
        goto done;
    }
    if (n[0] < 1 || n[0] > ((uint64_t)1 << 32) || n[1] > ((uint64_t)1 << 36)) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: implausible sizes (%llu sequences, %llu tokens)", path,
                     (unsigned long long)n[0], (unsigned long long)n[1]);
        goto done;
    }
    t->n_seqs = (int64_t)n[0], t->n_tokens = (int64_t)n[1], t->pad_id = pad[0];
    if ((s = tokset_alloc(ctx, t)) != LT_OK) goto done;
    if (fread(t->offsets, 8, (size_t)t->n_seqs + 1, f) != (size_t)t->n_seqs + 1 ||
        fread(t->tokens, 4, (size_t)t->n_tokens, f) != (size_t)t->n_tokens ||
        fread(t->supervised, 1, (size_t)t->n_tokens, f) != (size_t)t->n_tokens) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: truncated", path);
        goto done;
    }
    if (fgetc(f) != EOF) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: trailing bytes after the supervision mask", path);
        goto done;
    }
    lt_pack_input in = {t->tokens, t->supervised, t->offsets, t->n_seqs};
    if (t->offsets[t->n_seqs] != t->n_tokens) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: offsets end at %lld, not at the token count %lld", path,
                     (long long)t->offsets[t->n_seqs], (long long)t->n_tokens);
        goto done;
    }
    if (lt_pack_input_check(ctx, &in) != LT_OK) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: %s", path, lt_ctx_error(ctx));
        goto done;
    }
    for (int64_t i = 0; i < t->n_tokens; i++)
        if (t->tokens[i] < 0) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: token %lld is negative (%d)", path, (long long)i, t->tokens[i]);
            goto done;
        }
done:
    fclose(f);
    if (s != LT_OK) tokset_free(ctx, t);
    return s;
}

static lt_status tokset_write(lt_ctx *ctx, const char *path, const tokset *t) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return lt_error(ctx, LT_ERR_IO, "%s: %s", tmp, strerror(errno));
    uint64_t n[2] = {(uint64_t)t->n_seqs, (uint64_t)t->n_tokens};
    int32_t pad[2] = {t->pad_id, 0};
    int ok = fwrite(tok_magic, 1, 8, f) == 8 && fwrite(n, 8, 2, f) == 2 && fwrite(pad, 4, 2, f) == 2 &&
        fwrite(t->offsets, 8, (size_t)t->n_seqs + 1, f) == (size_t)t->n_seqs + 1 &&
        fwrite(t->tokens, 4, (size_t)t->n_tokens, f) == (size_t)t->n_tokens &&
        fwrite(t->supervised, 1, (size_t)t->n_tokens, f) == (size_t)t->n_tokens && fflush(f) == 0 &&
        fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return lt_error(ctx, LT_ERR_IO, "%s: cannot write the token cache", path);
    }
    return LT_OK;
}

/* Tokenises dir/train.jsonl with the tokenizer (and chat template) of a GGUF or tokenizer.json. */
static lt_status tokset_from_data(lt_ctx *ctx, const char *tok_path, const char *data, tokset *t, char *tmpl,
                                  size_t tmpl_n) {
    memset(t, 0, sizeof *t);
    lt_tokenizer *tok = NULL;
    lt_gguf *g = NULL;
    lt_dataset *ds = NULL;
    size_t n = strlen(tok_path);
    lt_status s;
    if (n > 5 && !strcmp(tok_path + n - 5, ".json")) {
        s = lt_tokenizer_load_json(ctx, tok_path, &tok);
    } else {
        s = lt_gguf_open(ctx, tok_path, &g);
        if (s == LT_OK) s = lt_tokenizer_load_gguf(ctx, g, &tok);
        if (g) lt_gguf_close(g);
    }
    if (s != LT_OK) return s;
    lt_dataset_options dopt = {.mask_prompt = 1};
    s = lt_dataset_load_split(ctx, data, "train", tok, &dopt, &ds);
    if (s == LT_OK) {
        lt_pack_input in = lt_dataset_input(ds);
        lt_dataset_stats st = lt_dataset_get_stats(ds);
        snprintf(tmpl, tmpl_n, "%s", lt_chat_format_name(st.chat_format));
        t->n_seqs = in.n_seqs, t->n_tokens = in.offsets[in.n_seqs];
        t->pad_id = lt_tokenizer_pad(tok) >= 0 ? lt_tokenizer_pad(tok)
            : lt_tokenizer_eos(tok) >= 0       ? lt_tokenizer_eos(tok)
                                               : 0;
        s = tokset_alloc(ctx, t);
        if (s == LT_OK) {
            memcpy(t->offsets, in.offsets, (size_t)(t->n_seqs + 1) * 8);
            memcpy(t->tokens, in.tokens, (size_t)t->n_tokens * 4);
            if (in.supervised) memcpy(t->supervised, in.supervised, (size_t)t->n_tokens);
            else memset(t->supervised, 1, (size_t)t->n_tokens);
        }
    }
    lt_dataset_free(ctx, ds);
    lt_tokenizer_free(tok);
    return s;
}

/* ---- the arms ---- */

typedef struct arm_spec {
    const char *name;
    lt_pack_algorithm alg;
    int64_t batch;
} arm_spec;

/* the largest batch an arm takes (the step buffers and the row lengths are sized for it) */
#define ARM_MAX_BATCH 8

static const arm_spec arm_specs[] = {
    {"packed", LT_PACK_FIRST_FIT, 1},
    {"unpacked-b1", LT_PACK_NONE, 1},
    {"padded-b8", LT_PACK_NONE, 8},
};

typedef struct step_bufs {
    int32_t *host; /* ids, targets, positions (B·T each), offsets (B·(T+1)), pieces (B); host
                            memory on every device: the model copies a batch in itself */
    size_t bytes;
    int64_t B, T;
} step_bufs;

/* The peer's kind of input for each arm (bench/peers/packed_peft_gpu.py): packed rows go in
 * flattened with position ids, batch-1 sequences alone, batches of 8 padded with a mask. */
static const char *const arm_kinds[] = {"packed", "unpadded", "padded"};

/* Fills batch bi of plan into sb; the row lengths (real tokens, the first ones of each row) into
 * lens, and returns the supervised targets' count through *ntgt. */
static lt_status fill_batch(lt_ctx *ctx, const lt_pack_plan *plan, const lt_pack_input *in, int64_t bi,
                            const step_bufs *sb, lt_pack_batch *pb, int64_t *B, int64_t *T, int64_t *S, int32_t *lens,
                            int64_t *ntgt) {
    lt_pack_batch_shape(plan, bi, B, T, S);
    if (*B > ARM_MAX_BATCH)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "bench packed: a batch of %lld rows (at most %d)", (long long)*B,
                        ARM_MAX_BATCH);
    int32_t *h = sb->host;
    size_t bt = (size_t)(*B * *T), bo = (size_t)(*B * (*S + 1));
    *pb = (lt_pack_batch){h, h + bt, h + 2 * bt, h + 3 * bt, h + 3 * bt + bo};
    LT_TRY(lt_pack_fill(ctx, plan, in, bi, pb));
    int64_t n = 0;
    for (int64_t row = 0; row < *B; row++) lens[row] = pb->seq_offsets[row * (*S + 1) + pb->n_pieces[row]];
    for (size_t q = 0; q < bt; q++) n += pb->targets[q] != LT_PACK_IGNORE;
    *ntgt = n;
    return LT_OK;
}

/* Every arm's batches, in the order the timed loop takes them, for the peer: "LTBATv1\0", u64
 * records; per record i32 arm, B, T, 0, B row lengths, then ids, targets, positions (B*T i32). */
static lt_status write_batches(lt_ctx *ctx, const char *path, const lt_pack_input *in, int64_t L, int32_t pad_id,
                               const step_bufs *sb) {
    FILE *f = fopen(path, "wb");
    if (!f) return lt_error(ctx, LT_ERR_IO, "%s: %s", path, strerror(errno));
    lt_status st = LT_OK;
    uint64_t n = 0;
    int ok = fwrite("LTBATv1", 1, 8, f) == 8 && fwrite(&n, 8, 1, f) == 1;
    for (size_t ai = 0; ok && st == LT_OK && ai < sizeof arm_specs / sizeof arm_specs[0]; ai++) {
        lt_pack_options po = {.row_len = L,
                              .batch_size = arm_specs[ai].batch,
                              .algorithm = arm_specs[ai].alg,
                              .seed = 7,
                              .pad_multiple = 1,
                              .pad_id = pad_id};
        lt_pack_plan *plan = NULL;
        if ((st = lt_pack_plan_build(ctx, in, &po, &plan)) != LT_OK) break;
        for (int64_t bi = 0; ok && bi < lt_pack_plan_batches(plan); bi++) {
            int64_t B, T, S, ntgt = 0;
            int32_t lens[ARM_MAX_BATCH];
            lt_pack_batch pb;
            if ((st = fill_batch(ctx, plan, in, bi, sb, &pb, &B, &T, &S, lens, &ntgt)) != LT_OK) break;
            int32_t head[4] = {(int32_t)ai, (int32_t)B, (int32_t)T, 0};
            size_t bt = (size_t)(B * T);
            ok = fwrite(head, 4, 4, f) == 4 && fwrite(lens, 4, (size_t)B, f) == (size_t)B &&
                fwrite(pb.input_ids, 4, bt, f) == bt && fwrite(pb.targets, 4, bt, f) == bt &&
                fwrite(pb.position_ids, 4, bt, f) == bt;
            n++;
        }
        lt_pack_plan_free(ctx, plan);
    }
    if (ok && st == LT_OK) ok = fseek(f, 8, SEEK_SET) == 0 && fwrite(&n, 8, 1, f) == 1;
    if (fclose(f) != 0) ok = 0;
    if (st == LT_OK && !ok) st = lt_error(ctx, LT_ERR_IO, "%s: cannot write the peer's batches", path);
    if (st != LT_OK) unlink(path);
    return st;
}

/* The peer's arm of the same name (its lines carry "arm"), or NULL. */
static const cJSON *peer_arm(const cJSON *lines, const char *name) {
    const cJSON *j;
    cJSON_ArrayForEach(j, lines) {
        const char *a = cJSON_GetStringValue(cJSON_GetObjectItem(j, "arm"));
        if (a && !strcmp(a, name)) return j;
    }
    return NULL;
}

/* Adds one peer run's arms (prefix-packed, ...) to arms, each with longtune's same-kind arm's rate
 * over its own; returns the peer's best real tokens/s over its arms (0 when none ran). */
static double add_peer_arms(cJSON *arms, const cJSON *lines, const char *prefix) {
    double best = 0;
    /* the peer's own check that its packed rows keep their sequences apart */
    const cJSON *chk = cJSON_GetObjectItem(lt_bench_peer_find(lines, "ready", 0), "packing_check");
    int isolated = cJSON_IsTrue(cJSON_GetObjectItem(chk, "isolated"));
    cJSON *out = cJSON_CreateArray();
    const cJSON *ours;
    cJSON_ArrayForEach(ours, arms) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(ours, "name"));
        const cJSON *j = name ? peer_arm(lines, name) : NULL;
        if (!j) continue;
        char pn[96];
        snprintf(pn, sizeof pn, "%s-%s", prefix, name);
        cJSON *pa = cJSON_Duplicate(j, 1);
        cJSON_DeleteItemFromObject(pa, "arm");
        cJSON_AddItemToObject(pa, "name", cJSON_CreateString(pn));
        double r = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "real_tokens_per_s"));
        double o = cJSON_GetNumberValue(cJSON_GetObjectItem(ours, "real_tokens_per_s"));
        if (!strcmp(name, "packed") && !isolated) {
            /* attention across sequences: not the same training, so not a rate to compare with */
            cJSON_AddBoolToObject(pa, "sequences_not_isolated", 1);
            fprintf(stderr, "%s: the peer's packed rows attend across sequences (its packing_check); not compared\n",
                    pn);
            cJSON_AddItemToArray(out, pa);
            continue;
        }
        if (r > 0) {
            double pk = cJSON_GetNumberValue(cJSON_GetObjectItem(j, "max_allocated_bytes"));
            double opk = cJSON_GetNumberValue(cJSON_GetObjectItem(ours, "peak_bytes"));
            cJSON_AddNumberToObject(pa, "longtune_speedup", o / r);
            if (pk > 0) cJSON_AddNumberToObject(pa, "longtune_memory_ratio", opk / pk);
            if (r > best) best = r;
            fprintf(stderr, "%-28s %9.0f real tokens/s -> longtune %.2fx its speed", pn, r, o / r);
            if (pk > 0) fprintf(stderr, "; peak %.2f GiB -> longtune %.2fx its memory", pk / 1073741824.0, opk / pk);
            fputc('\n', stderr);
        } else {
            fprintf(stderr, "%-28s out of memory\n", pn);
        }
        cJSON_AddItemToArray(out, pa);
    }
    cJSON *a;
    while ((a = cJSON_DetachItemFromArray(out, 0)) != NULL) cJSON_AddItemToArray(arms, a);
    cJSON_Delete(out);
    return best;
}

int lt_bench_packed(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    c.warmup = 1;
    int64_t L = 0, threads = 0, max_steps = 0;
    double seconds = 0;
    const char *model_path = NULL, *weights = NULL, *shape_name = "smollm2-135m", *data = NULL;
    const char *tokens_path = NULL, *save_tokens = NULL, *tokenizer = NULL, *peer_path = getenv("LONGTUNE_PEER_PATH");
    int peers = 1, liger = 1;
    if (!peer_path) peer_path = "/tmp/lt-peer";
    const lt_bench_arg flags[] = {
        LT_BENCH_STR("--model", &model_path),
        LT_BENCH_CHOICE("--weights", &weights, "random-bf16|random-f32"),
        LT_BENCH_FN("--shape", &shape_name, lt_bench_parse_shape),
        LT_BENCH_STR("--data", &data),
        LT_BENCH_STR("--tokenizer", &tokenizer),
        LT_BENCH_STR("--tokens", &tokens_path),
        LT_BENCH_STR("--save-tokens", &save_tokens),
        LT_BENCH_I64("--seq", &L, 16, 1 << 20),
        LT_BENCH_FN("--seconds", &seconds, lt_bench_parse_seconds),
        LT_BENCH_I64("--max-steps", &max_steps, 1, INT64_MAX),
        LT_BENCH_I64("--threads", &threads, 1, 4096),
        LT_BENCH_SET("--no-peer", &peers, 0),
        LT_BENCH_SET("--no-liger", &liger, 0),
        LT_BENCH_STR("--peer-path", &peer_path),
    };
    const int parsed =
        lt_bench_parse_args("packed", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, flags, LT_BENCH_NARGS(flags));
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench packed [options]\n\n"
               "Real tokens/s of LoRA training (r=8 on all seven projections, recompute every layer,\n"
               "AdamW) on Alpaca-shaped data: packed rows of --seq tokens (batch 1) vs one sequence per\n"
               "step (unpacked batch 1) vs batches of 8 padded to their longest sequence. Only real\n"
               "tokens count. Each arm runs for --seconds (after --warmup steps).\n\n"
               "options:\n"
               "  --model PATH       weights (default on cpu: $LONGTUNE_CACHE or ~/.cache/longtune\n"
               "                     /smollm2-135m-instruct-q4_1.gguf, real SmolLM2-135M, QLoRA)\n"
               "  --weights W        random-bf16 | random-f32: a random checkpoint of --shape instead\n"
               "                     (default on cuda: random-bf16)\n"
               "  --shape S          %s for --weights (default smollm2-135m)\n"
               "  --data DIR         folder with train.jsonl (default bench/data/alpaca-eval)\n"
               "  --tokenizer PATH   GGUF or tokenizer.json to tokenise with (default: --model, else the\n"
               "                     SmolLM2 GGUF)\n"
               "  --tokens FILE      read token ids from a cache written by --save-tokens instead (default\n"
               "                     when the SmolLM2 GGUF is absent: DIR/smollm2-tokens.bin)\n"
               "  --save-tokens FILE tokenise, write the cache and stop\n"
               "  --seq L            packed row length and longest sequence (default cpu 256, cuda 2048)\n"
               "  --seconds S        timed seconds per arm (default cpu 20, cuda 10)\n"
               "  --max-steps N      at most N timed steps per arm (default: no limit)\n"
               "  --threads N        CPU threads\n"
               "  --no-peer          skip the peers: with --weights, transformers + PEFT trains the same\n"
               "                     batches after longtune's arms (bench/peers/packed_peft_gpu.py: packed\n"
               "                     rows flattened with position ids, padded batches with a mask), then\n"
               "                     the same with Liger-Kernel's fused kernels\n"
               "  --no-liger         skip the second peer, transformers + PEFT + Liger-Kernel\n"
               "  --peer-path DIR    searched first for torch, transformers, peft and liger_kernel\n"
               "                     (default $LONGTUNE_PEER_PATH or /tmp/lt-peer)\n"
               "  --warmup N, --json, --out DIR, --backend cpu|cuda as every bench\n",
               lt_bench_shape_names());
        return 0;
    }
    if (parsed) return parsed;
    if (model_path && weights) return lt_bench_usage_error("packed", NULL, "give --model or --weights, not both");
    int cuda = !strcmp(c.backend, "cuda");
    lt_device dev = cuda ? LT_DEVICE_CUDA : LT_DEVICE_CPU;
    if (!L) L = cuda ? 2048 : 256;
    if (!(seconds > 0)) seconds = cuda ? 10 : 20;
    if (cuda && !model_path && !weights) weights = "random-bf16";
    char gguf_default[1024], data_default[1200];
    const char *cache = getenv("LONGTUNE_CACHE"), *home = getenv("HOME");
    if (cache && *cache) snprintf(gguf_default, sizeof gguf_default, "%s/smollm2-135m-instruct-q4_1.gguf", cache);
    else
        snprintf(gguf_default, sizeof gguf_default, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf",
                 home ? home : "");
    if (!model_path && !weights) model_path = gguf_default;
    if (!data) {
        const char *src = getenv("LONGTUNE_SOURCE_DIR");
        snprintf(data_default, sizeof data_default, "%s/bench/data/alpaca-eval", src && *src ? src : ".");
        data = data_default;
    }
    if (!tokenizer) tokenizer = model_path && strcmp(model_path, gguf_default) ? model_path : gguf_default;
    /* without the SmolLM2 GGUF (a GPU box with random weights), the committed token cache made
     * from it stands in: the same ids */
    char cache_default[1300];
    snprintf(cache_default, sizeof cache_default, "%s/smollm2-tokens.bin", data);
    if (!tokens_path && !save_tokens && !strcmp(tokenizer, gguf_default) && access(gguf_default, R_OK) != 0 &&
        access(cache_default, R_OK) == 0) {
        fprintf(stderr, "data: %s not found; using the token cache %s\n", gguf_default, cache_default);
        tokens_path = cache_default;
    }

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    if (threads > 0) lt_ctx_set_threads(ctx, (int)threads);
    int nthreads = lt_bench_threads(ctx);
    int rc = 1;
    tokset ts;
    memset(&ts, 0, sizeof ts);
    lt_model *m = NULL;
    float *mom = NULL;
    size_t mom_bytes = 0;
    step_bufs sb;
    memset(&sb, 0, sizeof sb);
    cJSON *res = NULL;
    lt_pack_plan *plan = NULL;
    char tmpl[64] = "from the token cache";
    lt_status st;

    double t0 = lt_time_now();
    st = tokens_path ? tokset_read(ctx, tokens_path, &ts)
                     : tokset_from_data(ctx, tokenizer, data, &ts, tmpl, sizeof tmpl);
    if (st != LT_OK) goto fail;
    fprintf(stderr, "data: %lld sequences, %lld tokens (%s) in %.1f s\n", (long long)ts.n_seqs, (long long)ts.n_tokens,
            tokens_path ? tokens_path : tokenizer, lt_time_now() - t0);
    if (save_tokens) {
        if ((st = tokset_write(ctx, save_tokens, &ts)) != LT_OK) goto fail;
        fprintf(stderr, "wrote %s\n", save_tokens);
        rc = 0;
        goto out;
    }
    if (cuda && lt_sys_cuda().count == 0) {
        lt_error(ctx, LT_ERR_UNSUPPORTED, "--backend cuda: no CUDA device (or a build without CUDA)");
        st = LT_ERR_UNSUPPORTED;
        goto fail;
    }

    lt_lora_options lo = {.targets = LT_LORA_ALL_TARGETS, .rank = 8, .alpha = 16, .seed = 1};
    const lt_bench_shape *shape = lt_bench_shape_find(shape_name);
    if (weights) {
        st = lt_bench_load_random(ctx, shape, strcmp(weights, "random-bf16") ? LT_DTYPE_F32 : LT_DTYPE_BF16, dev, &lo,
                                  nthreads, &m);
    } else {
        lt_model_options mo = {.device = dev};
        st = lt_model_load(ctx, model_path, &mo, &lo, &m);
    }
    if (st != LT_OK) goto fail;
    const lt_model_config *cfg = lt_model_get_config(m);
    for (int64_t i = 0; i < ts.n_tokens; i++)
        if (ts.tokens[i] >= cfg->V) {
            st = lt_error(ctx, LT_ERR_INVALID_ARG, "token %lld (id %d) is outside the model's vocabulary of %lld",
                          (long long)i, ts.tokens[i], (long long)cfg->V);
            goto fail;
        }
    /* prepared for the largest arm first (batches of 8 rows of up to L tokens), then for each arm's
     * own batch before it runs, as train prepares for its batch; attention output + lse kept with
     * the checkpoints, as bench train does by default */
    lt_model_run_options ro = {.B = ARM_MAX_BATCH,
                               .T = L,
                               .recompute = LT_RECOMPUTE_EVERY,
                               .attention = LT_ATTENTION_FLASH,
                               .loss = LT_LCE_FUSED,
                               .threads = nthreads,
                               .recompute_attention = 0};
    if ((st = lt_model_prepare(ctx, m, &ro)) != LT_OK) goto fail;
    int64_t n_params = 0;
    float *params = lt_model_lora_params(m, &n_params), *grads = lt_model_lora_grads(m, &n_params);
    mom_bytes = 2 * (size_t)n_params * sizeof(float);
    sb.B = ARM_MAX_BATCH, sb.T = L;
    sb.bytes = (size_t)(3 * ARM_MAX_BATCH * L + ARM_MAX_BATCH * (L + 1) + ARM_MAX_BATCH) * sizeof(int32_t);
    sb.host = lt_alloc(ctx, LT_DEVICE_CPU, sb.bytes, "bench packed batch (host)");
    mom = lt_alloc(ctx, dev, mom_bytes, "bench packed AdamW moments");
    if (!sb.host || !mom) {
        st = LT_ERR_OOM;
        goto fail;
    }
    const lt_backend *be = lt_backend_get(dev);
    be->zero(ctx, mom, mom_bytes);

    res = lt_bench_result_new("packed");
    cJSON *jc = cJSON_AddObjectToObject(res, "config");
    cJSON_AddStringToObject(jc, "backend", c.backend);
    cJSON_AddStringToObject(jc, "model", weights ? shape->title : model_path);
    cJSON_AddStringToObject(jc, "weights", weights ? weights : "file");
    cJSON_AddStringToObject(jc, "proj_dtype", lt_dtype_name(cfg->proj_dtype[LT_PROJ_Q]));
    cJSON_AddStringToObject(jc, "data", tokens_path ? tokens_path : data);
    cJSON_AddStringToObject(jc, "data_source",
                            "AlpacaEval example/outputs.json (PyPI alpaca-eval 0.6.6), 805 "
                            "instruction/output pairs as chat records, prompts masked");
    cJSON_AddStringToObject(jc, "chat_template", tmpl);
    cJSON_AddNumberToObject(jc, "sequences", (double)ts.n_seqs);
    cJSON_AddNumberToObject(jc, "tokens", (double)ts.n_tokens);
    cJSON_AddNumberToObject(jc, "seq", (double)L);
    cJSON_AddNumberToObject(jc, "seconds_per_arm", seconds);
    cJSON_AddNumberToObject(jc, "warmup", c.warmup);
    cJSON_AddNumberToObject(jc, "threads", nthreads);
    cJSON_AddStringToObject(jc, "run",
                            "LoRA r=8 alpha 16 on q,k,v,o,gate,up,down of all layers, recompute every "
                            "layer, flash attention (packed rows: per-sequence segments), fused loss, AdamW");
    cJSON_AddStringToObject(jc, "count",
                            "real tokens: positions holding a data token (padding never counted), "
                            "summed over timed steps / their summed wall time");
    cJSON_AddStringToObject(jc, "arms_note",
                            "packed: first-fit rows of --seq, batch 1; unpacked-b1: one sequence per "
                            "step, no padding; padded-b8: 8 sequences of similar length (sorted by "
                            "length, batch order shuffled) padded to the longest");
    cJSON *arms = cJSON_AddArrayToObject(res, "arms");
    lt_pack_input in = {ts.tokens, ts.supervised, ts.offsets, ts.n_seqs};
    double base_rate = 0;
    int64_t adam_step = 0;
    for (size_t ai = 0; ai < sizeof arm_specs / sizeof arm_specs[0]; ai++) {
        const arm_spec *as = &arm_specs[ai];
        lt_pack_options po = {.row_len = L,
                              .batch_size = as->batch,
                              .algorithm = as->alg,
                              .seed = 7,
                              .pad_multiple = 1,
                              .pad_id = ts.pad_id};
        if ((st = lt_pack_plan_build(ctx, &in, &po, &plan)) != LT_OK) goto fail;
        lt_pack_stats ps = lt_pack_plan_stats(plan);
        ro.B = as->batch;
        if ((st = lt_model_prepare(ctx, m, &ro)) != LT_OK) goto fail;
        params = lt_model_lora_params(m, &n_params), grads = lt_model_lora_grads(m, &n_params);
        lt_mem_reset_peak(ctx, dev);
        int64_t nb = lt_pack_plan_batches(plan), steps = 0, real = 0, cap = 0, tgts = 0;
        double secs = 0;
        double *ms = calloc((size_t)(max_steps ? max_steps : 20000) + 1, sizeof(double));
        if (!ms) {
            st = lt_error(ctx, LT_ERR_OOM, "bench packed: step times");
            goto fail;
        }
        for (int64_t k = 0;; k++) {
            int64_t B, T, S, ntgt = 0, nreal = 0;
            int32_t lens[ARM_MAX_BATCH];
            lt_pack_batch pb;
            if ((st = fill_batch(ctx, plan, &in, k % nb, &sb, &pb, &B, &T, &S, lens, &ntgt)) != LT_OK) break;
            int32_t *h = sb.host;
            size_t bt = (size_t)(B * T);
            for (int64_t row = 0; row < B; row++) nreal += lens[row];
            lt_model_batch b = {.B = B,
                                .T = T,
                                .tokens = h,
                                .targets = h + bt,
                                .positions = h + 2 * bt,
                                .seq_offsets = h + 3 * bt,
                                .S = S,
                                .step = (uint64_t)k};
            lt_model_result mr;
            lt_adamw_params hp = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = ++adam_step};
            if ((st = be->synchronize(ctx)) != LT_OK) break;
            double s0 = lt_time_now();
            lt_model_zero_grads(m);
            if (ntgt > 0 && (st = lt_model_forward_backward(ctx, m, &b, 0.0f, &mr, NULL)) != LT_OK) break;
            be->adamw(ctx, params, grads, mom, mom + n_params, n_params, &hp);
            if ((st = be->synchronize(ctx)) != LT_OK) break;
            double dt = lt_time_now() - s0;
            if (k < c.warmup) continue;
            ms[steps++] = dt * 1e3;
            secs += dt;
            real += nreal;
            cap += B * T;
            tgts += ntgt;
            if (secs >= seconds || (max_steps && steps >= max_steps) || steps >= 20000) break;
        }
        lt_pack_plan_free(ctx, plan);
        plan = NULL;
        if (st != LT_OK) {
            free(ms);
            goto fail;
        }
        double rate = (double)real / secs;
        if (ai == 1) base_rate = rate;
        cJSON *arm = cJSON_CreateObject();
        cJSON_AddStringToObject(arm, "name", as->name);
        cJSON_AddNumberToObject(arm, "batch", (double)as->batch);
        cJSON_AddNumberToObject(arm, "real_tokens_per_s", rate);
        cJSON_AddNumberToObject(arm, "targets_per_s", (double)tgts / secs);
        cJSON_AddNumberToObject(arm, "steps", (double)steps);
        cJSON_AddNumberToObject(arm, "seconds", secs);
        cJSON_AddNumberToObject(arm, "median_ms", lt_bench_median(ms, (int)steps));
        cJSON_AddNumberToObject(arm, "real_tokens", (double)real);
        cJSON_AddNumberToObject(arm, "computed_tokens", (double)cap);
        cJSON_AddNumberToObject(arm, "utilisation_timed", cap ? (double)real / (double)cap : 0);
        cJSON_AddNumberToObject(arm, "plan_batches", (double)nb);
        cJSON_AddNumberToObject(arm, "plan_utilisation", ps.utilisation);
        cJSON_AddNumberToObject(arm, "plan_seqs_per_row", ps.seqs_per_row);
        cJSON_AddNumberToObject(arm, "truncated_sequences", (double)ps.truncated);
        /* everything the arm held on the device (weights, LoRA, optimizer, the run's buffers) */
        cJSON_AddNumberToObject(arm, "peak_bytes", (double)lt_mem_get_stats(ctx, dev).peak_bytes);
        cJSON_AddItemToArray(arms, arm);
        free(ms);
        fprintf(stderr, "%-12s %6lld steps in %5.1f s: %9.0f real tokens/s (%.1f%% of computed positions real)\n",
                as->name, (long long)steps, secs, rate, cap ? 100.0 * (double)real / (double)cap : 0);
    }
    {
        cJSON *a;
        cJSON_ArrayForEach(a, arms) {
            double r = cJSON_GetNumberValue(cJSON_GetObjectItem(a, "real_tokens_per_s"));
            if (base_rate > 0) cJSON_AddNumberToObject(a, "speedup_vs_unpacked_b1", r / base_rate);
        }
        cJSON *p = cJSON_GetArrayItem(arms, 0);
        fprintf(stderr, "packed: %.2fx unpacked batch 1, %.2fx padded batch 8\n",
                cJSON_GetNumberValue(cJSON_GetObjectItem(p, "speedup_vs_unpacked_b1")),
                cJSON_GetNumberValue(cJSON_GetObjectItem(p, "real_tokens_per_s")) /
                    cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(arms, 2), "real_tokens_per_s")));
    }
    if (peers && !weights) {
        fprintf(stderr,
                "peer skipped: it builds a shape's random model (--weights random-bf16|random-f32), not "
                "this file's\n");
        cJSON_AddStringToObject(jc, "peer", "skipped: weights from a file");
    } else if (peers && shape->E > 0) {
        fprintf(stderr, "peer skipped: no mixture-of-experts model in the packed peer\n");
        cJSON_AddStringToObject(jc, "peer", "skipped: mixture-of-experts shape");
    } else if (peers) {
        /* the device is handed to the peers empty of our blocks */
        lt_free(ctx, dev, mom, mom_bytes);
        mom = NULL;
        lt_model_free(ctx, m);
        m = NULL;
        const char *td = getenv("TMPDIR");
        char bpath[1100];
        snprintf(bpath, sizeof bpath, "%s/longtune-packed-XXXXXX", td && *td ? td : "/tmp");
        int fd = mkstemp(bpath);
        if (fd < 0) {
            st = lt_error(ctx, LT_ERR_IO, "%s: %s", bpath, strerror(errno));
            goto fail;
        }
        close(fd);
        if ((st = write_batches(ctx, bpath, &in, L, ts.pad_id, &sb)) != LT_OK) goto fail;
        char args[2048], names[160] = "", kinds[160] = "";
        for (size_t ai = 0; ai < sizeof arm_specs / sizeof arm_specs[0]; ai++) {
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", ai ? "," : "", arm_specs[ai].name);
            snprintf(kinds + strlen(kinds), sizeof kinds - strlen(kinds), "%s%s", ai ? "," : "", arm_kinds[ai]);
        }
        snprintf(args, sizeof args,
                 "--shape %s --batches '%s' --arms %s --kinds %s --seconds %g --warmup %d --max-steps %lld "
                 "--device %s",
                 shape->name, bpath, names, kinds, seconds, c.warmup, (long long)max_steps, cuda ? "cuda" : "cpu");
        const char *script = "bench/peers/packed_peft_gpu.py";
        double best[2] = {0, 0};
        for (int pi = 0; pi < 1 + liger; pi++) {
            char full[2100];
            snprintf(full, sizeof full, "%s%s", args, pi ? " --liger" : "");
            cJSON *lines = lt_bench_gpu_peer_run_script(peer_path, script, full);
            const char *key = pi ? "peer_liger" : "peer";
            if (!lines) {
                cJSON_AddStringToObject(jc, key, lt_bench_peer_failure());
                continue;
            }
            cJSON_AddItemToObject(jc, key, cJSON_Duplicate(lt_bench_peer_find(lines, "ready", 0), 1));
            best[pi] = add_peer_arms(arms, lines, pi ? "torch-peft-liger" : "torch-peft");
            cJSON_Delete(lines);
        }
        unlink(bpath);
        double ours = cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(arms, 0), "real_tokens_per_s"));
        for (int pi = 0; pi < 2; pi++) {
            if (!(best[pi] > 0)) continue;
            cJSON_AddNumberToObject(res, pi ? "packed_vs_best_liger_arm" : "packed_vs_best_peft_arm", ours / best[pi]);
            fprintf(stderr, "longtune packed: %.2fx the best %s arm\n", ours / best[pi],
                    pi ? "transformers + PEFT + Liger" : "transformers + PEFT");
        }
    }
    char tag[160];
    snprintf(tag, sizeof tag, "%s-%s-%s", c.backend, weights ? shape->name : "smollm2-135m-gguf",
             weights ? weights : "q4_1");
    rc = lt_bench_write(&c, res, tag) == 0 ? 0 : 1;
    res = NULL;
    goto out;
fail:
    fprintf(stderr, "longtune bench packed: %s\n", lt_ctx_error(ctx));
out:
    lt_pack_plan_free(ctx, plan);
    cJSON_Delete(res);
    if (mom) lt_free(ctx, dev, mom, mom_bytes);
    if (sb.host) lt_free(ctx, LT_DEVICE_CPU, sb.host, sb.bytes);
    lt_model_free(ctx, m);
    tokset_free(ctx, &ts);
    lt_ctx_free(ctx);
    return rc;
}
