/* `longtune plan`: will this training run fit? Prints the planner's bytes per lifetime class, the
 * peak, and fits / does not fit against a budget (given, or measured as the memory guard would);
 * optionally searches the longest sequence or largest batch that fits, and prices the naive
 * attention and loss arms so the saving of the fused paths is visible. Reads no weights: a GGUF's
 * metadata or an HF folder's config.json and safetensors headers only. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longtune/guard.h"
#include "longtune/plan.h"
#include "longtune/sysinfo.h"

static const char *usage =
    "longtune plan (--model PATH | --config config.json) [--batch B] [--seq-len T] [--lora-rank r]\n"
    "       [--lora-layers K] [--attention flash|naive] [--loss fused|chunked|naive]\n"
    "       [--recompute none|all|every:K] [--recompute-attention] [--saved f32|bf16]\n"
    "       [--chunk-rows N] [--offload-checkpoints] [--host-budget BYTES|auto]\n"
    "       [--backend cpu|cuda] [--budget BYTES|auto]\n"
    "       [--max-seq | --max-batch] [--quantize] [--weights-dtype f32|bf16|f16] [--threads N]\n"
    "       [--dp K] [--cp K] [--json]";

static void print_help(void) {
    printf("usage: %s\n\n"
           "Plans the memory of a LoRA training run without reading weights: bytes per lifetime class\n"
           "(frozen weights, LoRA parameters and gradients, optimizer state, saved activations,\n"
           "per-layer transients, workspaces), the peak, and whether it fits the budget.\n\n"
           "  --model PATH        HF folder (config.json + safetensors headers) or .gguf (metadata)\n"
           "  --config FILE       an HF config.json alone (weights taken as --weights-dtype, f32 default)\n"
           "  --batch B           rows per step (1)            --seq-len T   tokens per row (2048)\n"
           "  --lora-rank r       LoRA rank (8)                --lora-layers K  LoRA on the last K layers\n"
           "  --attention IMPL    flash (default) or naive     --loss IMPL   fused (default), chunked, naive\n"
           "  --recompute POLICY  none (default), all, every:K (keep every K-th layer's input)\n"
           "  --recompute-attention  under a recompute policy, rerun each layer's attention instead of\n"
           "                      keeping its output and log-sum-exp with the checkpoints\n"
           "  --saved DTYPE       dtype of checkpoints and kept attention outputs (default: the\n"
           "                      backend's, f32 on cpu and bf16 on cuda)\n"
           "  --chunk-rows N      rows per chunk of the position-wise work (default 8192)\n"
           "  --offload-checkpoints  keep the layer checkpoints in (pinned) host memory, two slots on\n"
           "                      the device; the host side is planned and checked on its own\n"
           "  --host-budget BYTES|auto  host memory for the offloaded checkpoints of a cuda plan\n"
           "                      (auto, the default: the guard's host ceiling less this process)\n"
           "  --backend DEV       cpu (default) or cuda\n"
           "  --budget BYTES|auto bytes (\"12G\", \"512MiB\") or auto (default): the memory guard's\n"
           "                      ceiling, i.e. min(0.90 x total, available - cushion) of host memory\n"
           "                      (cgroup limits honoured) or of the CUDA device\n"
           "  --max-seq           search the longest T that fits the budget (B fixed)\n"
           "  --max-batch         search the largest B that fits the budget (T fixed)\n"
           "  --quantize          QLoRA: projection weights held as int4 (group 64)\n"
           "  --threads N         CPU threads the run will use (workspaces scale with it)\n"
           "  --dp K, --cp K      plan one rank of K data-parallel ranks (each takes ceil(B/K) rows)\n"
           "                      or of K context-parallel ranks (each holds T/K tokens of every row,\n"
           "                      T padded to a multiple of 2K, plus the context-parallel attention's\n"
           "                      buffers: Ulysses when K divides the key/value heads, else the ring)\n"
           "  --json              one JSON object on stdout instead of the table\n\n"
           "Exit status: 0 when planned (whether it fits or not: see \"fits\"), 1 on failure, 2 usage.\n",
           usage);
}

static int parse_dtype(const char *s, lt_dtype *out) {
    if (!strcmp(s, "f32")) *out = LT_DTYPE_F32;
    else if (!strcmp(s, "bf16")) *out = LT_DTYPE_BF16;
    else if (!strcmp(s, "f16")) *out = LT_DTYPE_F16;
    else return -1;
    return 0;
}

/* The budget the memory guard would give the allocator in this process (see guard.h). */
static lt_status auto_budget(lt_ctx *ctx, lt_device dev, uint64_t *out, char *how, size_t n) {
    lt_guard_options go;
    memset(&go, 0, sizeof go);
    go.device = dev;
    lt_guard_ceiling c;
    LT_TRY(lt_guard_measure(ctx, dev, &go, &c));
    uint64_t outside = dev == LT_DEVICE_CPU ? c.in_use_bytes : 0;
    *out = c.ceiling_bytes > outside ? c.ceiling_bytes - outside : 0;
    snprintf(how, n, "auto: min(%.2f x %llu total, %llu available + %llu in use - %llu cushion)%s",
             LT_GUARD_DEFAULT_SHARE, (unsigned long long)c.total_bytes,
             (unsigned long long)c.available_bytes, (unsigned long long)c.in_use_bytes,
             (unsigned long long)c.cushion_bytes, outside ? " - resident set" : "");
    return LT_OK;
}

typedef struct arm {
    const char *name;
    lt_attention_impl attention;
    lt_lce_impl loss;
    int ok;
    lt_plan plan;
} arm;

int lt_cmd_plan(int argc, char **argv) {
    const char *model = NULL, *config = NULL, *budget_s = "auto", *host_budget_s = "auto";
    int offload = 0;
    int64_t B = 1, T = 2048, rank = 8, layers = 0, threads = 0, dp = 1, cp = 1;
    lt_attention_impl att = LT_ATTENTION_FLASH;
    lt_lce_impl loss = LT_LCE_FUSED;
    const char *recompute_s = "none";
    int recompute_attention = 0, saved = 0;
    int64_t chunk_rows = 0;
    lt_device dev = LT_DEVICE_CPU;
    int max_seq = 0, max_batch = 0, json = 0, quantize = 0;
    lt_dtype wdtype = LT_DTYPE_F32;
    int have_wdtype = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                                  \
    do {                                                                              \
        if (!v) return lt_cli_usage_error("plan", usage, "%s needs a value", a);      \
        i++;                                                                          \
    } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_help();
            return LT_EXIT_OK;
        } else if (!strcmp(a, "--model")) {
            NEED_VALUE();
            model = v;
        } else if (!strcmp(a, "--config")) {
            NEED_VALUE();
            config = v;
        } else if (!strcmp(a, "--batch")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, 1 << 20, &B))
                return lt_cli_usage_error("plan", usage, "--batch '%s': expected 1..%d", v, 1 << 20);
        } else if (!strcmp(a, "--seq-len")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, 1ll << 30, &T))
                return lt_cli_usage_error("plan", usage, "--seq-len '%s': expected 1..2^30", v);
        } else if (!strcmp(a, "--dp")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, 1 << 20, &dp))
                return lt_cli_usage_error("plan", usage, "--dp '%s': expected 1..%d ranks", v, 1 << 20);
        } else if (!strcmp(a, "--cp")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, 1 << 20, &cp))
                return lt_cli_usage_error("plan", usage, "--cp '%s': expected 1..%d ranks", v, 1 << 20);
        } else if (!strcmp(a, "--lora-rank")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, 65536, &rank))
                return lt_cli_usage_error("plan", usage, "--lora-rank '%s': expected 1..65536", v);
        } else if (!strcmp(a, "--lora-layers")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 0, 1 << 20, &layers))
                return lt_cli_usage_error("plan", usage, "--lora-layers '%s': expected >= 0", v);
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, 4096, &threads))
                return lt_cli_usage_error("plan", usage, "--threads '%s': expected 1..4096", v);
        } else if (!strcmp(a, "--attention")) {
            NEED_VALUE();
            if (!strcmp(v, "flash")) att = LT_ATTENTION_FLASH;
            else if (!strcmp(v, "naive")) att = LT_ATTENTION_NAIVE;
            else return lt_cli_usage_error("plan", usage, "--attention '%s': expected flash or naive", v);
        } else if (!strcmp(a, "--loss")) {
            NEED_VALUE();
            if (!strcmp(v, "fused")) loss = LT_LCE_FUSED;
            else if (!strcmp(v, "chunked")) loss = LT_LCE_CHUNKED;
            else if (!strcmp(v, "naive")) loss = LT_LCE_NAIVE;
            else return lt_cli_usage_error("plan", usage, "--loss '%s': expected fused, chunked or naive", v);
        } else if (!strcmp(a, "--recompute")) {
            NEED_VALUE();
            recompute_s = v;
        } else if (!strcmp(a, "--recompute-attention")) {
            recompute_attention = 1;
        } else if (!strcmp(a, "--saved")) {
            NEED_VALUE();
            if (!strcmp(v, "f32")) saved = -1;
            else if (!strcmp(v, "bf16")) saved = 1;
            else return lt_cli_usage_error("plan", usage, "--saved '%s': expected f32 or bf16", v);
        } else if (!strcmp(a, "--offload-checkpoints")) {
            offload = 1;
        } else if (!strcmp(a, "--host-budget")) {
            NEED_VALUE();
            host_budget_s = v;
        } else if (!strcmp(a, "--chunk-rows")) {
            NEED_VALUE();
            if (lt_cli_parse_i64(v, 1, INT32_MAX, &chunk_rows))
                return lt_cli_usage_error("plan", usage, "--chunk-rows '%s': expected a positive integer", v);
        } else if (!strcmp(a, "--backend")) {
            NEED_VALUE();
            if (!strcmp(v, "cpu")) dev = LT_DEVICE_CPU;
            else if (!strcmp(v, "cuda")) dev = LT_DEVICE_CUDA;
            else return lt_cli_usage_error("plan", usage, "--backend '%s': expected cpu or cuda", v);
        } else if (!strcmp(a, "--budget")) {
            NEED_VALUE();
            budget_s = v;
        } else if (!strcmp(a, "--weights-dtype")) {
            NEED_VALUE();
            if (parse_dtype(v, &wdtype))
                return lt_cli_usage_error("plan", usage, "--weights-dtype '%s': expected f32, bf16 or f16", v);
            have_wdtype = 1;
        } else if (!strcmp(a, "--max-seq")) {
            max_seq = 1;
        } else if (!strcmp(a, "--max-batch")) {
            max_batch = 1;
        } else if (!strcmp(a, "--quantize")) {
            quantize = 1;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else {
            return lt_cli_usage_error("plan", usage, "unknown option '%s'", a);
        }
#undef NEED_VALUE
    }
    if (!model == !config)
        return lt_cli_usage_error("plan", usage, "give exactly one of --model and --config");
    if (max_seq && max_batch)
        return lt_cli_usage_error("plan", usage, "--max-seq and --max-batch exclude each other");
    if (have_wdtype && model)
        return lt_cli_usage_error("plan", usage, "--weights-dtype applies to --config only (a model's "
                                                 "files say their dtypes)");
    uint64_t budget = 0;
    int budget_auto = !strcmp(budget_s, "auto");
    if (!budget_auto && (lt_cli_parse_bytes(budget_s, &budget) || budget == 0))
        return lt_cli_usage_error("plan", usage, "--budget '%s': expected a byte size (\"12G\") or auto",
                                  budget_s);
    uint64_t host_budget = 0;
    int host_auto = !strcmp(host_budget_s, "auto");
    if (!host_auto && (lt_cli_parse_bytes(host_budget_s, &host_budget) || host_budget == 0))
        return lt_cli_usage_error("plan", usage, "--host-budget '%s': expected a byte size (\"100G\") or auto",
                                  host_budget_s);

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    int rc = LT_EXIT_FAIL;
    cJSON *out = NULL;
    lt_status s;
    lt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    lt_plan_options po;
    memset(&po, 0, sizeof po);
    if ((s = lt_plan_recompute_parse(ctx, recompute_s, &po.run.recompute, &po.run.recompute_k))) {
        rc = lt_cli_usage_error("plan", usage, "%s", lt_ctx_error(ctx));
        goto done;
    }
    if (threads) lt_ctx_set_threads(ctx, (int)threads);
    if (model) {
        lt_model_options mo;
        memset(&mo, 0, sizeof mo);
        mo.device = dev;
        mo.quantize = quantize;
        s = lt_model_inspect(ctx, model, &mo, &cfg);
    } else {
        s = lt_model_config_read_hf(ctx, config, &cfg);
        if (s == LT_OK) {
            cfg.embed_dtype = cfg.head_dtype = wdtype;
            for (int p = 0; p < LT_PROJ_COUNT_; p++)
                cfg.proj_dtype[p] = quantize ? LT_DTYPE_INT4_G64 : wdtype;
        }
    }
    if (s != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        goto done;
    }
    po.device = dev;
    po.lora.rank = rank;
    po.lora.num_layers = layers;
    po.run.B = B;
    po.run.T = T;
    po.run.attention = att;
    po.run.recompute_attention = recompute_attention;
    po.run.saved_bf16 = saved;
    po.run.chunk_rows = chunk_rows;
    po.run.offload_ckpt = offload;
    po.run.loss = loss;
    po.run.threads = (int)threads;
    po.dp_size = dp;
    po.cp_size = cp;

    char how[256] = "given";
    if (budget_auto && (s = auto_budget(ctx, dev, &budget, how, sizeof how)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        fprintf(stderr, "longtune plan: pass --budget BYTES to plan without measuring this machine\n");
        goto done;
    }

    /* The host side of a device plan with offload: its own budget and its own answer. */
    int host_check = offload && dev != LT_DEVICE_CPU;
    char host_how[256] = "given";
    if (host_check && host_auto && (s = auto_budget(ctx, LT_DEVICE_CPU, &host_budget, host_how, sizeof host_how)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        fprintf(stderr, "longtune plan: pass --host-budget BYTES to plan without measuring this machine\n");
        goto done;
    }
    if (host_check) po.host_budget_bytes = host_budget;

    lt_plan plan;
    if ((s = lt_plan_compute(ctx, &cfg, &po, &plan)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        goto done;
    }
    int fits_host = !host_check || plan.offload_bytes <= host_budget;
    int fits = plan.peak_bytes <= budget && fits_host;

    /* The naive arms: what the same run would need without the fused kernels. */
    arm arms[3];
    memset(arms, 0, sizeof arms);
    arms[0].name = "naive_attention";
    arms[0].attention = LT_ATTENTION_NAIVE;
    arms[0].loss = loss;
    arms[1].name = "naive_loss";
    arms[1].attention = att;
    arms[1].loss = LT_LCE_NAIVE;
    arms[2].name = "naive_both";
    arms[2].attention = LT_ATTENTION_NAIVE;
    arms[2].loss = LT_LCE_NAIVE;
    for (int k = 0; k < 3; k++) {
        lt_plan_options ao = po;
        ao.run.attention = arms[k].attention;
        ao.run.loss = arms[k].loss;
        arms[k].ok = lt_plan_compute(ctx, &cfg, &ao, &arms[k].plan) == LT_OK;
        if (!arms[k].ok) lt_ctx_clear_error(ctx);
    }

    int64_t best = 0;
    int found = 0;
    if (max_seq || max_batch) {
        lt_plan_search what = max_seq ? LT_PLAN_SEARCH_SEQ : LT_PLAN_SEARCH_BATCH;
        int64_t hi = max_seq ? (1ll << 24) : (1ll << 16);
        if ((s = lt_plan_search_max(ctx, &cfg, &po, what, hi, budget, &best, &found)) != LT_OK) {
            rc = lt_cli_fail("plan", ctx, s);
            goto done;
        }
    }

    char pj[4096];
    if ((s = lt_plan_to_json(ctx, &plan, pj, sizeof pj)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        goto done;
    }
    if (json) {
        out = cJSON_Parse(pj);
        if (!out) {
            fprintf(stderr, "longtune plan: out of memory\n");
            goto done;
        }
        cJSON_AddStringToObject(out, "source", model ? model : config);
        cJSON_AddNumberToObject(out, "budget_bytes", (double)budget);
        cJSON_AddStringToObject(out, "budget_source", budget_auto ? "auto" : "given");
        cJSON_AddBoolToObject(out, "fits", fits);
        if (host_check) {
            cJSON_AddNumberToObject(out, "host_budget_bytes", (double)host_budget);
            cJSON_AddStringToObject(out, "host_budget_source", host_auto ? "auto" : "given");
            cJSON_AddBoolToObject(out, "fits_device", plan.peak_bytes <= budget);
            cJSON_AddBoolToObject(out, "fits_host", fits_host);
        }
        cJSON *na = cJSON_AddObjectToObject(out, "naive_arms");
        for (int k = 0; k < 3; k++) {
            if (arms[k].ok)
                cJSON_AddNumberToObject(na, arms[k].name, (double)arms[k].plan.peak_bytes);
            else
                cJSON_AddNullToObject(na, arms[k].name);
        }
        const char *key = max_seq ? "max_seq_len" : "max_batch";
        if (max_seq || max_batch) {
            if (found)
                cJSON_AddNumberToObject(out, key, (double)best);
            else
                cJSON_AddNullToObject(out, key);
        }
        char *text = cJSON_Print(out);
        if (!text) {
            fprintf(stderr, "longtune plan: out of memory\n");
            goto done;
        }
        printf("%s\n", text);
        cJSON_free(text);
        rc = LT_EXIT_OK;
        goto done;
    }

    char b1[32], b2[32], rec[32];
    printf("model: %s (L=%lld C=%lld F=%lld H=%lld Hkv=%lld D=%lld V=%lld%s)\n", model ? model : config,
           (long long)cfg.L, (long long)cfg.C, (long long)cfg.F, (long long)cfg.H, (long long)cfg.Hkv,
           (long long)cfg.D, (long long)cfg.V, cfg.tie_embeddings ? ", tied head" : "");
    printf("run: %s, batch %lld x %lld tokens, LoRA r=%lld (%lld params), recompute %s, attention %s, "
           "loss %s\n", dev == LT_DEVICE_CUDA ? "cuda" : "cpu", (long long)B, (long long)T,
           (long long)plan.options.lora.rank, (long long)plan.n_lora_params,
           lt_plan_recompute_name(plan.options.run.recompute, plan.options.run.recompute_k, rec,
                                  sizeof rec),
           lt_plan_attention_name(att), lt_plan_loss_name(loss));
    if (plan.options.run.recompute != LT_RECOMPUTE_NONE)
        printf("kept for the backward: %s%s, in %s; position-wise work in chunks of %lld rows\n",
               recompute_attention    ? "layer inputs"
               : dev == LT_DEVICE_CPU ? "layer inputs and attention halves (q, k, v, output, x_mid)"
                                      : "layer inputs and attention outputs",
               recompute_attention ? " (attention rerun)" : "",
               saved > 0 || (!saved && dev == LT_DEVICE_CUDA) ? "bf16" : "f32",
               (long long)(chunk_rows ? chunk_rows : LT_MODEL_CHUNK_ROWS));
    if (offload && plan.options.run.recompute != LT_RECOMPUTE_NONE)
        printf("checkpoints offloaded to %s host memory: two slots stay on the device\n",
               dev == LT_DEVICE_CPU ? "(on the cpu: the same)" : "pinned");
    if (dp > 1 || cp > 1)
        printf("per rank: one of %lld data-parallel x %lld context-parallel ranks\n", (long long)dp, (long long)cp);
    for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++)
        if (c != LT_PLAN_HELD || plan.bytes[c]) /* nothing is held for a bare plan */
            printf("  %-17s %12s  (%zu bytes)\n", lt_plan_class_name((lt_plan_class)c),
                   lt_cli_fmt_bytes(plan.bytes[c], b1, 32), plan.bytes[c]);
    printf("  %-17s %12s  (%zu bytes)\n", "peak", lt_cli_fmt_bytes(plan.peak_bytes, b1, 32),
           plan.peak_bytes);
    printf("budget: %s (%s)\n", lt_cli_fmt_bytes(budget, b1, 32), how);
    if (plan.peak_bytes <= budget)
        printf("fits: %s, %s to spare%s\n", fits ? "yes" : "on the device", lt_cli_fmt_bytes(budget - plan.peak_bytes, b2, 32),
               fits ? "" : " (but not in host memory, below)");
    else
        printf("fits: NO, %s over\n", lt_cli_fmt_bytes(plan.peak_bytes - budget, b2, 32));
    if (host_check) {
        printf("host (pinned)     %12s  (%zu bytes) of offloaded checkpoints\n", lt_cli_fmt_bytes(plan.offload_bytes, b1, 32),
               plan.offload_bytes);
        printf("host budget: %s (%s)\n", lt_cli_fmt_bytes(host_budget, b1, 32), host_how);
        if (fits_host)
            printf("host: fits, %s to spare\n", lt_cli_fmt_bytes(host_budget - plan.offload_bytes, b2, 32));
        else
            printf("host: NO, will not fit in host memory (%s over)\n",
                   lt_cli_fmt_bytes(plan.offload_bytes - host_budget, b2, 32));
    }
    printf("naive arms (what the fused paths save):\n");
    for (int k = 0; k < 3; k++) {
        if (!arms[k].ok) {
            printf("  %-17s cannot be planned for this run\n", arms[k].name);
            continue;
        }
        size_t pk = arms[k].plan.peak_bytes;
        printf("  %-17s %12s  (%s%s)%s\n", arms[k].name, lt_cli_fmt_bytes(pk, b1, 32),
               pk >= plan.peak_bytes ? "+" : "-",
               lt_cli_fmt_bytes(pk >= plan.peak_bytes ? pk - plan.peak_bytes : plan.peak_bytes - pk, b2, 32),
               pk <= budget ? "" : ", does not fit");
    }
    if (max_seq || max_batch) {
        const char *what = max_seq ? "longest sequence" : "largest batch";
        if (found)
            printf("%s that fits: %lld%s\n", what, (long long)best,
                   max_seq && cfg.max_positions && best > cfg.max_positions
                       ? " (beyond max_position_embeddings)" : "");
        else
            printf("%s that fits: none (even 1 does not fit)\n", what);
    }
    rc = LT_EXIT_OK;
done:
    cJSON_Delete(out);
    lt_ctx_free(ctx);
    return rc;
}
