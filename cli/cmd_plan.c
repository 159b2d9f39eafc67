/* `longtune plan`: will this training run fit? Reads train's flags through train's option table
 * (old names as aliases) and prints the plan `longtune train` makes for them (lt_cli_train_plan):
 * bytes per lifetime class, the peak, and fits / does not fit against a budget (given, or
 * measured as the memory guard would); optionally searches the longest sequence or largest batch
 * that fits, and prices the naive attention and loss arms so the saving of the fused paths is
 * visible. Reads no weights: a GGUF's metadata or an HF folder's config.json and safetensors
 * headers, and with --data the tokenizer and the data set. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longtune/guard.h"
#include "longtune/plan.h"
#include "longtune/sysinfo.h"
#include "longtune/train.h"
#include "train_guard.h"

static const char *usage = "longtune plan (--model PATH | --config config.json) [--data DIR] [train flags]\n"
                           "       [--budget BYTES|auto] [--host-budget BYTES|auto] [--max-seq | --max-batch]\n"
                           "       [--saved f32|bf16] [--weights-dtype f32|bf16|f16] [--dp K] [--cp K] [--json]";

static void print_help(void) {
    printf("usage: %s\n\n"
           "Plans the memory of a LoRA training run without reading weights: bytes per lifetime class\n"
           "(frozen weights, LoRA parameters and gradients, optimizer state, saved activations,\n"
           "per-layer transients, workspaces, and what the run holds besides: tokenizer, data set,\n"
           "the trainer's buffers), the peak, and whether it fits the budget.\n\n"
           "Every `longtune train` flag is read as train reads it, with train's defaults, so a train\n"
           "command line pasted after `longtune plan` plans that run; flags that change no memory\n"
           "(learning rate, schedules, paths, ...) are accepted and ignored. Those that do:\n"
           "  --model PATH        HF folder (config.json + safetensors headers) or .gguf (metadata)\n"
           "  --data DIR          the run's data folder: tokenized (with the model's tokenizer) and\n"
           "                      packed as train does, to count what a CPU run holds of them\n"
           "                      [none: not counted]\n"
           "  --config FILE       train's options file (JSON), or an HF config.json alone (a file with\n"
           "                      \"hidden_size\" or \"model_type\"; weights taken as --weights-dtype)\n"
           "  --batch-size B      rows per step [4] (alias --batch)\n"
           "  --max-seq-length T  tokens per row [2048] (alias --seq-len); --seq-len-curriculum S\n"
           "                      prices its longest stage\n"
           "  --lora-rank r, --lora-targets LIST, --num-layers K (alias --lora-layers)\n"
           "  --recompute P       none | all | every:K | sliding[:K] | global[:K] | auto [none]\n"
           "                      (sliding/global: only the sliding-window / full-attention layers;\n"
           "                      auto: what train would choose for the budget); --grad-checkpoint = all\n"
           "  --recompute-attention, --recompute-attention-layers N, --offload-checkpoints,\n"
           "                      --moe-chunk-tokens N, --attention flash|naive, --loss fused|chunked|naive,\n"
           "                      --grad-accum K, --quantize FMT, --base-dtype file|fp8, --fp8-skip LIST,\n"
           "                      --threads N, --bf16-products,\n"
           "  --chunk-rows N      rows per chunk of the position-wise work [8192; auto may halve it]\n"
           "  --device cpu|cuda   (alias --backend), --no-pack, --pack-algorithm, --mask-prompt,\n"
           "                      --context-parallel (with --cp K), --no-memory-guard\n"
           "  --rope-scaling linear|dynamic|yarn|llama3|longrope --rope-factor F [--original-max-position N]\n"
           "                      [--yarn-beta-fast X --yarn-beta-slow Y] [--rope-attn-factor A]: extend\n"
           "                      the context as train would (checked, and the plan's model extended)\n"
           "Plan-only flags:\n"
           "  --saved DTYPE       dtype of checkpoints and kept attention outputs (default: the\n"
           "                      backend's, f32 on cpu and bf16 on cuda)\n"
           "  --host-budget BYTES|auto  host memory for the offloaded checkpoints of a cuda plan\n"
           "                      (auto, the default: the guard's host ceiling less this process)\n"
           "  --budget BYTES|auto bytes (\"12G\", \"512MiB\") or auto (default): the memory guard's\n"
           "                      ceiling, i.e. min(0.90 x total, available - cushion) of host memory\n"
           "                      (cgroup limits honoured) or of the CUDA device\n"
           "  --max-seq           search the longest T that fits the budget (B fixed)\n"
           "  --max-batch         search the largest B that fits the budget (T fixed)\n"
           "  --weights-dtype D   f32, bf16 or f16: the weights of an HF config.json alone\n"
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
             LT_GUARD_DEFAULT_SHARE, (unsigned long long)c.total_bytes, (unsigned long long)c.available_bytes,
             (unsigned long long)c.in_use_bytes, (unsigned long long)c.cushion_bytes, outside ? " - resident set" : "");
    return LT_OK;
}

/* 1 when FILE is an HF model config.json (an object with "hidden_size" or "model_type"), 0 when
 * it is some other JSON object (train's options file), -1 when it cannot be read as JSON. */
static int is_hf_config(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char *text = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    int r = -1;
    if (n >= 0 && n <= (1L << 24) && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
        fread(text, 1, (size_t)n, f) == (size_t)n) {
        text[n] = '\0';
        cJSON *root = cJSON_ParseWithLength(text, (size_t)n);
        if (cJSON_IsObject(root))
            r = cJSON_GetObjectItemCaseSensitive(root, "hidden_size") ||
                cJSON_GetObjectItemCaseSensitive(root, "model_type");
        cJSON_Delete(root);
    }
    free(text);
    fclose(f);
    return r;
}

/* Plan-only names of train flags. */
static const char *train_key(const char *key) {
    if (!strcmp(key, "seq-len") || !strcmp(key, "seq_len")) return "max_seq_length";
    if (!strcmp(key, "batch")) return "batch_size";
    if (!strcmp(key, "backend")) return "device";
    if (!strcmp(key, "lora-layers") || !strcmp(key, "lora_layers")) return "num_layers";
    return key;
}

typedef struct arm {
    const char *name;
    lt_attention_impl attention;
    lt_lce_impl loss;
    int ok;
    lt_plan plan;
} arm;

int lt_cmd_plan(int argc, char **argv) {
    const char *hf_config = NULL, *budget_s = "auto", *host_budget_s = "auto";
    int64_t dp = 1, cp = 1;
    int saved = 0, max_seq = 0, max_batch = 0, json = 0;
    lt_dtype wdtype = LT_DTYPE_F32;
    int have_wdtype = 0;
    lt_train_options opt;
    memset(&opt, 0, sizeof opt);
    lt_cli_guard guard; /* only its flags: whether the run will hold a guard */
    memset(&guard, 0, sizeof guard);
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    int rc = LT_EXIT_FAIL;
    cJSON *out = NULL;
    lt_status s;
#define USAGE(...)                                           \
    do {                                                     \
        rc = lt_cli_usage_error("plan", usage, __VA_ARGS__); \
        goto done;                                           \
    } while (0)
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help();
            rc = LT_EXIT_OK;
            goto done;
        }
    /* --config first (an options file is applied under the flags, as train does). */
    for (int i = 1; i < argc; i++) {
        const char *file = NULL;
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) USAGE("--config needs a file");
            file = argv[i + 1];
        } else if (!strncmp(argv[i], "--config=", 9)) {
            file = argv[i] + 9;
        }
        if (!file) continue;
        int hf = is_hf_config(file);
        if (hf == 0) {
            if ((s = lt_train_options_load_json(ctx, &opt, file)) != LT_OK) {
                rc = lt_cli_fail("plan", ctx, s);
                goto done;
            }
        } else {
            hf_config = file; /* unreadable: the HF reader names the problem */
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2]) USAGE("unexpected argument '%s'", a);
        char key[64];
        const char *eq = strchr(a, '=');
        size_t kl = eq ? (size_t)(eq - a - 2) : strlen(a + 2);
        if (kl >= sizeof key) USAGE("unknown option '%s'", a);
        memcpy(key, a + 2, kl);
        key[kl] = '\0';
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        const char *v = eq ? eq + 1 : next;
        int takes = 1; /* a plan-only flag with a value consumes it */
        if (!strcmp(key, "config") || !strcmp(key, "train")) {
            takes = !strcmp(key, "config");
        } else if (!strcmp(key, "budget") || !strcmp(key, "host-budget") || !strcmp(key, "dp") || !strcmp(key, "cp") ||
                   !strcmp(key, "saved") || !strcmp(key, "weights-dtype")) {
            if (!v) USAGE("%s needs a value", a);
            if (!strcmp(key, "budget")) budget_s = v;
            else if (!strcmp(key, "host-budget")) host_budget_s = v;
            else if (!strcmp(key, "dp") && lt_cli_parse_i64(v, 1, 1 << 20, &dp))
                USAGE("--dp '%s': expected 1..%d ranks", v, 1 << 20);
            else if (!strcmp(key, "cp") && lt_cli_parse_i64(v, 1, 1 << 20, &cp))
                USAGE("--cp '%s': expected 1..%d ranks", v, 1 << 20);
            else if (!strcmp(key, "saved")) {
                if (!strcmp(v, "f32")) saved = -1;
                else if (!strcmp(v, "bf16")) saved = 1;
                else USAGE("--saved '%s': expected f32 or bf16", v);
            } else if (!strcmp(key, "weights-dtype")) {
                if (parse_dtype(v, &wdtype)) USAGE("--weights-dtype '%s': expected f32, bf16 or f16", v);
                have_wdtype = 1;
            }
        } else if (!strcmp(key, "max-seq") || !strcmp(key, "max-batch") || !strcmp(key, "json")) {
            takes = 0;
            if (eq) USAGE("%s takes no value", key);
            if (!strcmp(key, "max-seq")) max_seq = 1;
            else if (!strcmp(key, "max-batch")) max_batch = 1;
            else json = 1;
        } else {
            int used = 0, gf = lt_cli_guard_flag(&guard, usage, key, v, &used);
            if (gf < 0) {
                rc = LT_EXIT_USAGE;
                goto done;
            }
            if (gf) {
                i += used && !eq;
                continue;
            }
            const char *tk = train_key(key);
            lt_train_option_kind kind = lt_train_option_kind_of(tk);
            if (kind == LT_TRAIN_OPTION_UNKNOWN) USAGE("unknown option '%s'", a);
            if (kind == LT_TRAIN_OPTION_BOOL && !eq) {
                v = "true";
                takes = 0;
            } else if (!v) {
                USAGE("option '%s' needs a value", a);
            }
            if ((s = lt_train_options_set(ctx, &opt, tk, v)) != LT_OK) USAGE("%s", lt_ctx_error(ctx));
        }
        i += takes && !eq;
    }
    if (!opt.model[0] == !hf_config) USAGE("give exactly one of --model and an HF --config");
    if (max_seq && max_batch) USAGE("--max-seq and --max-batch exclude each other");
    if (have_wdtype && !hf_config)
        USAGE("--weights-dtype applies to an HF --config only (a model's files say their dtypes)");
    if (hf_config && opt.data[0]) USAGE("--data needs --model: the data set is tokenized with the model's tokenizer");
    uint64_t budget = 0;
    int budget_auto = !strcmp(budget_s, "auto");
    if (!budget_auto && (lt_cli_parse_bytes(budget_s, &budget) || budget == 0))
        USAGE("--budget '%s': expected a byte size (\"12G\") or auto", budget_s);
    uint64_t host_budget = 0;
    int host_auto = !strcmp(host_budget_s, "auto");
    if (!host_auto && (lt_cli_parse_bytes(host_budget_s, &host_budget) || host_budget == 0))
        USAGE("--host-budget '%s': expected a byte size (\"100G\") or auto", host_budget_s);

    /* Train's defaults and checks; a plan needs neither a data folder nor (with an HF config) a
     * model path, so stand-ins pass the resolver's "required" checks and are taken out again. */
    int no_data = !opt.data[0];
    if (no_data) snprintf(opt.data, sizeof opt.data, "-");
    if (hf_config) snprintf(opt.model, sizeof opt.model, "%s", hf_config);
    lt_train_options ro;
    if ((s = lt_train_options_resolve(ctx, &opt, &ro)) != LT_OK) USAGE("%s", lt_ctx_error(ctx));
    if (no_data) ro.data[0] = '\0';
    if (ro.context_parallel && dp > 1) USAGE("--context-parallel splits rows over --cp ranks, not --dp");
    if (ro.threads) lt_ctx_set_threads(ctx, ro.threads);

    lt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (!hf_config) {
        lt_model_options mo;
        (void)lt_train_model_options(ctx, &ro, &mo); /* validated with the options */
        s = lt_model_inspect(ctx, ro.model, &mo, &cfg);
    } else {
        s = lt_model_config_read_hf(ctx, hf_config, &cfg);
        if (s == LT_OK) {
            cfg.embed_dtype = cfg.head_dtype = wdtype;
            lt_model_options mo;
            (void)lt_train_model_options(ctx, &ro, &mo); /* validated with the options */
            lt_dtype qd = mo.quantize_dtype == LT_DTYPE_F32 ? wdtype : mo.quantize_dtype; /* none: the config's */
            for (int p = 0; p < LT_PROJ_COUNT_; p++) cfg.proj_dtype[p] = mo.fp8_skip >> p & 1u ? wdtype : qd;
        }
    }
    lt_rope_override rope = lt_train_rope_override(&ro);
    if (s == LT_OK) s = lt_model_config_apply_rope(ctx, &cfg, &rope);
    if (s != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        goto done;
    }
    lt_device dev = ro.device;
    int offload = ro.offload_checkpoints;
    lt_plan_options po;
    if ((s = lt_train_plan_options(ctx, &ro, dp, cp, &po)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        goto done;
    }
    po.run.saved_bf16 = saved;

    char how[256] = "given";
    if (budget_auto && (s = auto_budget(ctx, dev, &budget, how, sizeof how)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        fprintf(stderr, "longtune plan: pass --budget BYTES to plan without measuring this machine\n");
        goto done;
    }

    /* The host side of a device plan with offload: its own budget and its own answer. */
    int host_check = offload && dev != LT_DEVICE_CPU;
    char host_how[256] = "given";
    if (host_check && host_auto &&
        (s = auto_budget(ctx, LT_DEVICE_CPU, &host_budget, host_how, sizeof host_how)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        fprintf(stderr, "longtune plan: pass --host-budget BYTES to plan without measuring this machine\n");
        goto done;
    }
    if (host_check) po.host_budget_bytes = host_budget;

    lt_plan plan;
    lt_train_held held;
    if ((s = lt_cli_train_plan(ctx, &ro, &cfg, &po, !guard.off, &held, &plan)) != LT_OK) {
        rc = lt_cli_fail("plan", ctx, s);
        goto done;
    }
    /* --recompute auto: the policy train would choose against this budget. */
    int auto_fit = 1;
    const lt_train_options ro_asked = ro; /* --max-seq / --max-batch search with auto's choice at each length */
    if (ro.recompute_auto) {
        lt_train_options chosen;
        lt_plan chosen_plan;
        s = lt_train_choose_recompute(ctx, &ro, &cfg, &po, &held, (size_t)budget, &chosen, &chosen_plan);
        if (s == LT_OK) {
            ro = chosen;
            po.run.recompute = ro.recompute;
            po.run.recompute_k = ro.recompute_every;
            po.run.recompute_attention = ro.recompute_attention;
            po.run.recompute_attention_layers = ro.recompute_attention_layers;
            po.run.chunk_rows = ro.chunk_rows;
            plan = chosen_plan;
        } else if (s == LT_ERR_OOM) {
            fprintf(stderr, "longtune plan: %s\n", lt_ctx_error(ctx));
            lt_ctx_clear_error(ctx);
            auto_fit = 0; /* the plan shown stays recompute none */
        } else {
            rc = lt_cli_fail("plan", ctx, s);
            goto done;
        }
    }
    int fits_host = !host_check || plan.offload_bytes <= host_budget;
    int fits = plan.peak_bytes <= budget && fits_host && auto_fit;
    lt_attention_impl att = plan.options.run.attention;
    lt_lce_impl loss = plan.options.run.loss;
    int64_t B = plan.options.run.B, T = plan.options.run.T;
    int recompute_attention = plan.options.run.recompute_attention;

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
        lt_plan_options ao = plan.options;
        ao.run.attention = arms[k].attention;
        ao.run.loss = arms[k].loss;
        arms[k].ok = lt_plan_compute(ctx, &cfg, &ao, &arms[k].plan) == LT_OK;
        if (!arms[k].ok) lt_ctx_clear_error(ctx);
    }

    int64_t best = 0;
    int found = 0;
    char best_policy[96] = "";
    if (max_seq || max_batch) {
        lt_plan_search what = max_seq ? LT_PLAN_SEARCH_SEQ : LT_PLAN_SEARCH_BATCH;
        int64_t hi = max_seq ? (1ll << 24) : (1ll << 16);
        if ((s = lt_train_plan_search(ctx, &ro_asked, &cfg, &po, &held, what, hi, budget, &best, &found)) != LT_OK) {
            rc = lt_cli_fail("plan", ctx, s);
            goto done;
        }
        if (found && ro_asked.recompute_auto) { /* the policy auto takes at the answer */
            lt_plan_options ao = po;
            if (max_seq) ao.run.T = best;
            else ao.run.B = best;
            lt_train_options at;
            if ((s = lt_train_choose_recompute(ctx, &ro_asked, &cfg, &ao, &held, (size_t)budget, &at, NULL)) != LT_OK) {
                rc = lt_cli_fail("plan", ctx, s);
                goto done;
            }
            lt_cli_recompute_desc(at.recompute, at.recompute_every, at.recompute_attention,
                                  at.recompute_attention_layers, at.chunk_rows, ro_asked.chunk_rows, best_policy,
                                  sizeof best_policy);
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
        cJSON_AddStringToObject(out, "source", hf_config ? hf_config : ro.model);
        cJSON *hj = cJSON_AddObjectToObject(out, "held_parts");
        cJSON_AddNumberToObject(hj, "data_and_guard", (double)held.caller_bytes);
        cJSON_AddNumberToObject(hj, "packing_peak", (double)held.packing_peak_bytes);
        cJSON_AddNumberToObject(hj, "load_peak", (double)held.load_peak_bytes);
        cJSON_AddNumberToObject(hj, "trainer",
                                (double)(plan.bytes[LT_PLAN_HELD] - (dev == LT_DEVICE_CPU ? held.caller_bytes : 0)));
        cJSON_AddBoolToObject(out, "data_counted", ro.data[0] != 0 && dev == LT_DEVICE_CPU);
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
            if (arms[k].ok) cJSON_AddNumberToObject(na, arms[k].name, (double)arms[k].plan.peak_bytes);
            else cJSON_AddNullToObject(na, arms[k].name);
        }
        const char *key = max_seq ? "max_seq_len" : "max_batch";
        if (max_seq || max_batch) {
            if (found) cJSON_AddNumberToObject(out, key, (double)best);
            else cJSON_AddNullToObject(out, key);
            if (found && best_policy[0]) cJSON_AddStringToObject(out, "recompute_at_max", best_policy);
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
    printf("model: %s (L=%lld C=%lld F=%lld H=%lld Hkv=%lld D=%lld V=%lld%s)\n", hf_config ? hf_config : ro.model,
           (long long)cfg.L, (long long)cfg.C, (long long)cfg.F, (long long)cfg.H, (long long)cfg.Hkv, (long long)cfg.D,
           (long long)cfg.V, cfg.tie_embeddings ? ", tied head" : "");
    printf("run: %s, batch %lld x %lld tokens, LoRA r=%lld (%lld params), recompute %s, attention %s, "
           "loss %s\n",
           dev == LT_DEVICE_CUDA ? "cuda" : "cpu", (long long)B, (long long)T, (long long)plan.options.lora.rank,
           (long long)plan.n_lora_params,
           lt_plan_recompute_name(plan.options.run.recompute, plan.options.run.recompute_k, rec, sizeof rec),
           lt_plan_attention_name(att), lt_plan_loss_name(loss));
    char rerun[96] = "";
    int64_t att_layers = plan.options.run.recompute_attention_layers, n_recomputed = 0;
    int64_t K = plan.options.lora.num_layers; /* the LoRA layers, the last K of the model */
    if (K <= 0 || K > cfg.L) K = cfg.L;
    if (att_layers > 0) { /* as the step counts them: more than there are reruns it in all */
        const int64_t cap = lt_model_recompute_cap(plan.options.run.recompute, plan.options.run.recompute_k);
        int64_t sl = 0, ot = 0;
        lt_model_attention_rerun_split(&cfg, plan.options.run.recompute, cap, K, -1, &sl, &ot);
        n_recomputed = sl + ot;
        lt_model_attention_rerun_split(&cfg, plan.options.run.recompute, cap, K, att_layers, &sl, &ot);
        att_layers = sl + ot;
    }
    const int rerun_all = recompute_attention || (att_layers > 0 && att_layers == n_recomputed);
    if (rerun_all) snprintf(rerun, sizeof rerun, " (attention rerun)");
    else if (att_layers > 0)
        snprintf(rerun, sizeof rerun, " (attention rerun in %lld of the recomputed layers, which keep only inputs)",
                 (long long)att_layers);
    if (plan.options.run.recompute != LT_RECOMPUTE_NONE)
        printf("kept for the backward: %s%s, in %s; position-wise work in chunks of %lld rows\n",
               rerun_all                  ? "layer inputs"
                   : dev == LT_DEVICE_CPU ? "layer inputs and attention halves (q, k, v, output, x_mid)"
                                          : "layer inputs and attention outputs",
               rerun, saved > 0 || (!saved && dev == LT_DEVICE_CUDA) ? "bf16" : "f32",
               (long long)(plan.options.run.chunk_rows ? plan.options.run.chunk_rows : LT_MODEL_CHUNK_ROWS));
    lt_recompute pol = plan.options.run.recompute;
    if (pol == LT_RECOMPUTE_SLIDING || pol == LT_RECOMPUTE_GLOBAL) {
        /* Which LoRA layers the by-kind policy recomputes: those of its attention kind. */
        int64_t n_rec = 0;
        for (int64_t l = cfg.L - K; l < cfg.L; l++) n_rec += lt_model_recomputes_layer(&cfg, pol, l);
        printf("recomputed in the backward: %lld of %lld LoRA layers (the %s ones); the other %lld %s full "
               "activations\n",
               (long long)n_rec, (long long)K, pol == LT_RECOMPUTE_SLIDING ? "sliding-window" : "full-attention",
               (long long)(K - n_rec), K - n_rec == 1 ? "keeps its" : "keep their");
    }
    if (offload && plan.options.run.recompute != LT_RECOMPUTE_NONE)
        printf("checkpoints offloaded to %s host memory: two slots stay on the device\n",
               dev == LT_DEVICE_CPU ? "(on the cpu: the same)" : "pinned");
    if (dp > 1 || cp > 1)
        printf("per rank: one of %lld data-parallel x %lld context-parallel ranks\n", (long long)dp, (long long)cp);
    for (int c = 0; c < LT_PLAN_CLASS_COUNT_; c++)
        if (c != LT_PLAN_HELD || plan.bytes[c]) /* a device plan holds nothing else there */
            printf("  %-17s %12s  (%zu bytes)\n", lt_plan_class_name((lt_plan_class)c),
                   lt_cli_fmt_bytes(plan.bytes[c], b1, 32), plan.bytes[c]);
    if (dev == LT_DEVICE_CPU && held.load_peak_bytes && held.load_peak_bytes == plan.peak_bytes)
        printf("  %-17s %12s  (reading the data, before the model: more than the step holds)\n", "loading",
               lt_cli_fmt_bytes(held.load_peak_bytes, b1, 32));
    printf("  %-17s %12s  (%zu bytes)\n", "peak", lt_cli_fmt_bytes(plan.peak_bytes, b1, 32), plan.peak_bytes);
    printf("budget: %s (%s)\n", lt_cli_fmt_bytes(budget, b1, 32), how);
    if (plan.peak_bytes <= budget)
        printf("fits: %s, %s to spare%s\n", fits ? "yes" : "on the device",
               lt_cli_fmt_bytes(budget - plan.peak_bytes, b2, 32), fits ? "" : " (but not in host memory, below)");
    else printf("fits: NO, %s over\n", lt_cli_fmt_bytes(plan.peak_bytes - budget, b2, 32));
    if (host_check) {
        printf("host (pinned)     %12s  (%zu bytes) of offloaded checkpoints\n",
               lt_cli_fmt_bytes(plan.offload_bytes, b1, 32), plan.offload_bytes);
        printf("host budget: %s (%s)\n", lt_cli_fmt_bytes(host_budget, b1, 32), host_how);
        if (fits_host) printf("host: fits, %s to spare\n", lt_cli_fmt_bytes(host_budget - plan.offload_bytes, b2, 32));
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
            printf("%s that fits: %lld%s%s%s%s\n", what, (long long)best,
                   max_seq && cfg.max_positions && best > cfg.max_positions ? " (beyond max_position_embeddings)" : "",
                   best_policy[0] ? " (recompute auto takes " : "", best_policy, best_policy[0] ? " there)" : "");
        else printf("%s that fits: none (even 1 does not fit)\n", what);
    }
    if (!ro.data[0] && dev == LT_DEVICE_CPU)
        printf("held: the trainer's buffers only; --data DIR counts the tokenizer and data set too\n");
    rc = LT_EXIT_OK;
done:
#undef USAGE
    cJSON_Delete(out);
    lt_ctx_free(ctx);
    return rc;
}
