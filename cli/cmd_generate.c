/* `longtune generate`: answers a prompt (or every prompt of a file, batched through one KV cache)
 * with a base model, optionally with a PEFT LoRA adapter, so a user can compare before and after
 * a fine-tune. The model's chat template is applied unless --no-chat-template. Greedy by default;
 * --temp samples (top-k, top-p, min-p, repetition penalty, seed). One prompt streams its text to
 * stdout as it is generated; a prompts file prints one JSON line per prompt, in file order, once the
 * batch is done. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gen_common.h"
#include "longtune/alloc.h"
#include "longtune/chat.h"
#include "longtune/dataset.h"
#include "longtune/log.h"
#include "longtune/train.h"

static const char *usage =
    "longtune generate --model M [--adapter DIR] (--prompt TEXT | --prompts FILE) [--system TEXT] [--max-tokens N] "
    "[--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--repeat-last-n N] [--seed S] "
    "[--stop STRING]... [--chat | --no-chat-template] [--chat-template NAME] [--device cpu|cuda] [--threads N] "
    "[--bf16-products]";

#define MAX_PROMPTS LT_KV_MAX_RUNS

typedef struct gen_rows {
    lt_gen_stream st[MAX_PROMPTS];
    char *prompt_text[MAX_PROMPTS];
    int64_t n_new[MAX_PROMPTS];
    int json; /* print a JSON line per finished row */
} gen_rows;

static void print_row(gen_rows *g, int64_t i) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "index", (double)i);
    cJSON_AddStringToObject(o, "prompt", g->prompt_text[i]);
    cJSON_AddStringToObject(o, "completion", g->st[i].text ? g->st[i].text : "");
    cJSON_AddNumberToObject(o, "new_tokens", (double)g->n_new[i]);
    char *s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    fflush(stdout);
    free(s);
    cJSON_Delete(o);
}

static int on_token(void *arg, int64_t i, int32_t id) {
    gen_rows *g = arg;
    g->n_new[i]++;
    int stop = lt_gen_stream_push(&g->st[i], id);
    int is_end = 0;
    for (int k = 0; k < g->st[i].n_stop_ids; k++) is_end |= id == g->st[i].stop_ids[k];
    return stop || is_end;
}

/* One prompt per line: a JSON string or an object with a string "prompt". */
static lt_status read_prompts(lt_ctx *ctx, const char *path, char **out, int64_t *n) {
    lt_jsonl *r = NULL;
    *n = 0;
    LT_TRY(lt_jsonl_open(ctx, path, 1u << 24, &r));
    const char *line;
    size_t len;
    int64_t no;
    lt_status s;
    while ((s = lt_jsonl_next(ctx, r, &line, &len, &no)) == LT_OK && line) {
        cJSON *j = cJSON_ParseWithLength(line, len);
        const cJSON *p = cJSON_IsString(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "prompt");
        if (!j || !cJSON_IsString(p)) {
            cJSON_Delete(j);
            s = lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: expected a JSON string or an object with a string \"prompt\"",
                         path, (long long)no);
            break;
        }
        if (*n == MAX_PROMPTS) {
            cJSON_Delete(j);
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: more than %d prompts", path, MAX_PROMPTS);
            break;
        }
        out[(*n)++] = strdup(p->valuestring);
        cJSON_Delete(j);
    }
    lt_jsonl_close(ctx, r);
    if (s == LT_OK && *n == 0) s = lt_error(ctx, LT_ERR_FORMAT, "%s: no prompts", path);
    return s;
}

/* The ids of one prompt: rendered through the chat template (with the system message), or the
 * plain text with BOS. */
static lt_status encode_prompt(lt_ctx *ctx, const lt_tokenizer *tok, int templ, lt_chat_format fmt, const char *system,
                               const char *prompt, int32_t **ids, size_t *n) {
    if (!templ) return lt_tokenizer_encode(ctx, tok, prompt, strlen(prompt), 1, ids, n);
    lt_chat_message msgs[2];
    size_t nm = 0;
    if (system) msgs[nm++] = (lt_chat_message){"system", system};
    msgs[nm++] = (lt_chat_message){"user", prompt};
    lt_chat_options co;
    memset(&co, 0, sizeof co);
    co.add_generation_prompt = 1;
    lt_chat_text chat;
    memset(&chat, 0, sizeof chat);
    LT_TRY(lt_chat_render(ctx, fmt, &co, msgs, nm, &chat));
    lt_status s = lt_tokenizer_encode(ctx, tok, chat.text, chat.len, 0, ids, n);
    lt_chat_text_free(ctx, &chat);
    return s;
}

int lt_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *prompt = NULL, *prompts_file = NULL, *system = NULL, *tmpl_name = NULL,
               *stops[LT_GEN_MAX_STOP];
    int no_template = 0, threads = 0, n_stops = 0;
    lt_device dev = LT_DEVICE_CPU;
    lt_generate_request req;
    memset(&req, 0, sizeof req);
    req.max_tokens = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf(
                "usage: %s\n\nGenerates a reply to --prompt (or to each line of --prompts FILE: a JSON string or\n"
                "{\"prompt\": ...}, batched through one KV cache, one JSON line out per prompt) with the\n"
                "model M (HF folder or .gguf), plus the PEFT adapter in DIR when given. Greedy unless --temp > 0.\n"
                "  --max-tokens N  new tokens at most [256]\n  --temp T  sampling temperature [0]\n"
                "  --top-k K  keep the K most likely ids [0 = all]\n  --top-p P  nucleus mass (0, 1] [1]\n"
                "  --min-p P  keep ids with p >= P * p_max [0]\n  --repeat-penalty R  penalise recent ids [1]\n"
                "  --repeat-last-n N  tokens the penalty looks back over [64]\n  --seed S  sampling seed [0]\n"
                "  --stop STRING  end a reply where STRING appears (not printed; repeatable)\n"
                "  --system TEXT  a system message\n  --chat  apply the model's chat template (the default)\n"
                "  --chat-template NAME  override the detected template\n"
                "  --no-chat-template  feed the prompt as plain text (with BOS)\n"
                "  --device cpu|cuda  where the model runs [cpu]\n"
                "  --bf16-products  prefill the prompt on bf16 products, as train --bf16-products (the CPU:\n"
                "                   oneDNN, and AMX or AVX512-BF16 where it has them); decoding keeps its products\n",
                usage);
            return LT_EXIT_OK;
        }
        if (!strcmp(a, "--no-chat-template")) {
            no_template = 1;
            continue;
        }
        if (!strcmp(a, "--chat")) {
            no_template = 0;
            continue;
        }
        if (!strcmp(a, "--bf16-products")) {
            req.bf16_products = 1;
            continue;
        }
        const char *flags[] = {"--model",   "--adapter", "--prompt",         "--system",        "--max-tokens",
                               "--temp",    "--top-p",   "--seed",           "--chat-template", "--threads",
                               "--top-k",   "--min-p",   "--repeat-penalty", "--repeat-last-n", "--stop",
                               "--prompts", "--device",  "--temperature"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof flags / sizeof flags[0]); j++)
            if (!strcmp(a, flags[j])) k = j;
        if (k < 0) return lt_cli_usage_error("generate", usage, "unknown option '%s'", a);
        if (i + 1 >= argc) return lt_cli_usage_error("generate", usage, "option '%s' needs a value", a);
        const char *v = argv[++i];
        int64_t iv;
        double dv;
        switch (k) {
        case 0: model = v; break;
        case 1: adapter = v; break;
        case 2: prompt = v; break;
        case 3: system = v; break;
        case 4:
            if (lt_cli_parse_i64(v, 1, 1 << 20, &iv))
                return lt_cli_usage_error("generate", usage, "bad --max-tokens '%s'", v);
            req.max_tokens = iv;
            break;
        case 5:
        case 17:
            if (lt_cli_parse_f64(v, -1e300, 1e300, &dv))
                return lt_cli_usage_error("generate", usage, "bad --temp '%s'", v);
            req.sample.temperature = dv;
            break;
        case 6:
            if (lt_cli_parse_f64(v, -1e300, 1e300, &dv) || dv == 0)
                return lt_cli_usage_error("generate", usage, "bad --top-p '%s' (0 < P <= 1)", v);
            req.sample.top_p = dv;
            break;
        case 7:
            if (lt_cli_parse_i64(v, 0, INT64_MAX, &iv))
                return lt_cli_usage_error("generate", usage, "bad --seed '%s'", v);
            req.sample.seed = (uint64_t)iv;
            break;
        case 8: tmpl_name = v; break;
        case 9:
            if (lt_cli_parse_i64(v, 0, 4096, &iv))
                return lt_cli_usage_error("generate", usage, "bad --threads '%s'", v);
            threads = (int)iv;
            break;
        case 10:
            if (lt_cli_parse_i64(v, INT64_MIN, INT64_MAX, &iv))
                return lt_cli_usage_error("generate", usage, "bad --top-k '%s'", v);
            req.sample.top_k = iv;
            break;
        case 11:
            if (lt_cli_parse_f64(v, -1e300, 1e300, &dv))
                return lt_cli_usage_error("generate", usage, "bad --min-p '%s'", v);
            req.sample.min_p = dv;
            break;
        case 12:
            if (lt_cli_parse_f64(v, -1e300, 1e300, &dv))
                return lt_cli_usage_error("generate", usage, "bad --repeat-penalty '%s'", v);
            req.sample.repeat_penalty = dv;
            break;
        case 13:
            if (lt_cli_parse_i64(v, INT64_MIN, INT64_MAX, &iv))
                return lt_cli_usage_error("generate", usage, "bad --repeat-last-n '%s'", v);
            req.sample.repeat_last_n = iv;
            break;
        case 14:
            if (!*v) return lt_cli_usage_error("generate", usage, "--stop needs a non-empty string");
            if (n_stops == LT_GEN_MAX_STOP)
                return lt_cli_usage_error("generate", usage, "at most %d --stop strings", LT_GEN_MAX_STOP);
            stops[n_stops++] = v;
            break;
        case 15: prompts_file = v; break;
        case 16:
            if (!strcmp(v, "cpu")) dev = LT_DEVICE_CPU;
            else if (!strcmp(v, "cuda")) dev = LT_DEVICE_CUDA;
            else return lt_cli_usage_error("generate", usage, "bad --device '%s' (cpu, cuda)", v);
            break;
        }
    }
    if (!model) return lt_cli_usage_error("generate", usage, "--model is required");
    if (!prompt == !prompts_file)
        return lt_cli_usage_error("generate", usage, "--prompt or --prompts is required (one)");

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_ctx_set_threads(ctx, threads);
    lt_tokenizer *tok = NULL;
    lt_model *m = NULL;
    gen_rows *g = calloc(1, sizeof *g);
    int32_t *ids[MAX_PROMPTS] = {0};
    int64_t n_ids[MAX_PROMPTS], n = 0;
    int rc = LT_EXIT_OK;
    lt_status s = LT_OK;
    if (!g) {
        s = lt_error(ctx, LT_ERR_OOM, "generate: cannot allocate the rows");
        goto fail;
    }
    if ((s = lt_sample_check(ctx, &req.sample)) != LT_OK) goto fail;
    if (prompts_file) {
        if ((s = read_prompts(ctx, prompts_file, g->prompt_text, &n)) != LT_OK) goto fail;
    } else {
        g->prompt_text[0] = strdup(prompt);
        n = 1;
    }
    if ((s = lt_model_device_available(ctx, dev)) != LT_OK) goto fail;
    if ((s = lt_gen_open(ctx, model, adapter, dev, &tok, &m)) != LT_OK) goto fail;
    lt_chat_format fmt = LT_CHAT_NONE;
    if (!no_template) {
        s = tmpl_name ? lt_chat_format_parse(ctx, tmpl_name, &fmt)
                      : lt_chat_detect(ctx, lt_tokenizer_chat_template(tok), &fmt);
        if (s != LT_OK) goto fail;
    }
    for (int64_t i = 0; i < n; i++) {
        size_t len = 0;
        if ((s = encode_prompt(ctx, tok, !no_template, fmt, system, g->prompt_text[i], &ids[i], &len)) != LT_OK)
            goto fail;
        n_ids[i] = (int64_t)len;
    }
    int32_t stop_ids[16];
    int n_stop_ids = lt_gen_stop_ids(tok, m, stop_ids, 16);
    req.stop_ids = stop_ids, req.n_stop = n_stop_ids;
    g->json = prompts_file != NULL;
    for (int64_t i = 0; i < n; i++) {
        lt_gen_stream *st = &g->st[i];
        st->ctx = ctx, st->tok = tok, st->out = g->json ? NULL : stdout;
        st->stops = stops, st->n_stops = n_stops;
        st->stop_ids = stop_ids, st->n_stop_ids = n_stop_ids;
    }
    lt_generate_stats gs;
    if ((s = lt_generate_batch(ctx, m, n, (const int32_t *const *)ids, n_ids, &req, on_token, g, &gs)) != LT_OK)
        goto fail;
    for (int64_t i = 0; i < n; i++) {
        lt_gen_stream_finish(&g->st[i]);
        if (g->json) print_row(g, i);
    }
    if (!g->json) printf("\n");
    fflush(stdout);
    fprintf(stderr,
            "longtune generate: %lld prompt tokens in %.2f s (%.1f tok/s, the backend's first-call start included), "
            "%lld new tokens in %.2f s (%.1f tok/s), kv cache %.1f MiB\n",
            (long long)gs.prompt_tokens, gs.prefill_s, gs.prefill_s > 0 ? (double)gs.prompt_tokens / gs.prefill_s : 0,
            (long long)gs.new_tokens, gs.decode_s, gs.decode_s > 0 ? (double)(gs.new_tokens - n) / gs.decode_s : 0.0,
            (double)gs.cache_bytes / 1048576.0);
    goto done;
fail:
    rc = lt_cli_fail("generate", ctx, s);
done:
    for (int64_t i = 0; i < n && g; i++) {
        free(ids[i]);
        free(g->prompt_text[i]);
        lt_gen_stream_free(&g->st[i]);
    }
    free(g);
    if (m) lt_model_free(ctx, m);
    if (tok) lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return rc;
}
