/* `longtune chat`: an interactive conversation over stdin, one line per user turn (/reset starts
 * over, /quit or end of input ends). The history is rendered through the model's chat template
 * every turn; the KV cache keeps the tokens of the previous turns, and only the tokens after the
 * longest prefix shared with what it holds are run again. Replies stream to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gen_common.h"
#include "longtune/chat.h"
#include "longtune/log.h"
#include "longtune/train.h"

static const char *usage =
    "longtune chat --model M [--adapter DIR] [--system TEXT] [--max-tokens N] [--ctx N] [--temp T] [--top-k K] "
    "[--top-p P] [--min-p P] [--repeat-penalty R] [--seed S] [--stop STRING]... [--chat-template NAME] "
    "[--device cpu|cuda] [--threads N] [--stats] [--bf16-products]";

#define MAX_TURNS 4096
#define CHAT_PASS_TOKENS 1024

typedef struct chat_state {
    lt_gen_stream st;
    int32_t *gen; /* this turn's generated ids */
    size_t n_gen, cap_gen;
} chat_state;

static int on_token(void *arg, int64_t i, int32_t id) {
    (void)i;
    chat_state *c = arg;
    if (c->n_gen == c->cap_gen) {
        size_t cap = c->cap_gen ? 2 * c->cap_gen : 256;
        int32_t *p = realloc(c->gen, cap * sizeof(int32_t));
        if (!p) return 1;
        c->gen = p, c->cap_gen = cap;
    }
    c->gen[c->n_gen++] = id;
    int end = 0;
    for (int k = 0; k < c->st.n_stop_ids; k++) end |= id == c->st.stop_ids[k];
    return lt_gen_stream_push(&c->st, id) || end;
}

int lt_cmd_chat(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *system = NULL, *tmpl_name = NULL, *stops[LT_GEN_MAX_STOP];
    int threads = 0, n_stops = 0, stats = 0;
    int64_t ctx_len = 4096;
    lt_device dev = LT_DEVICE_CPU;
    lt_generate_request req;
    memset(&req, 0, sizeof req);
    req.max_tokens = 512;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: %s\n\nReads user turns from stdin, one per line, and answers each with the model M (and\n"
                   "the PEFT adapter in DIR). /reset forgets the conversation, /quit (or end of input) ends it.\n"
                   "  --ctx N  positions the conversation may hold [4096, at most the model's]\n"
                   "  --max-tokens N  tokens per reply at most [512]\n"
                   "  --stats  after each reply, print on stderr the prompt tokens, how many the cache\n"
                   "           already held, the new tokens and the decode rate\n"
                   "  --bf16-products  prefill each turn on bf16 products, as `generate --bf16-products`\n"
                   "  sampling as `generate` (greedy unless --temp > 0)\n",
                   usage);
            return LT_EXIT_OK;
        }
        if (!strcmp(a, "--stats")) {
            stats = 1;
            continue;
        }
        if (!strcmp(a, "--bf16-products")) {
            req.bf16_products = 1;
            continue;
        }
        if (i + 1 >= argc) return lt_cli_usage_error("chat", usage, "option '%s' needs a value (or is unknown)", a);
        const char *v = argv[++i];
        int64_t iv;
        double dv;
        int bad = 0;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--adapter")) adapter = v;
        else if (!strcmp(a, "--system")) system = v;
        else if (!strcmp(a, "--chat-template")) tmpl_name = v;
        else if (!strcmp(a, "--max-tokens")) bad = lt_cli_parse_i64(v, 1, 1 << 20, &req.max_tokens);
        else if (!strcmp(a, "--ctx")) bad = lt_cli_parse_i64(v, 2, 1 << 24, &ctx_len);
        else if (!strcmp(a, "--temp")) bad = lt_cli_parse_f64(v, -1e300, 1e300, &req.sample.temperature);
        else if (!strcmp(a, "--top-k")) bad = lt_cli_parse_i64(v, INT64_MIN, INT64_MAX, &req.sample.top_k);
        else if (!strcmp(a, "--top-p"))
            bad = lt_cli_parse_f64(v, -1e300, 1e300, &req.sample.top_p) || req.sample.top_p == 0;
        else if (!strcmp(a, "--min-p")) bad = lt_cli_parse_f64(v, -1e300, 1e300, &req.sample.min_p);
        else if (!strcmp(a, "--repeat-penalty")) bad = lt_cli_parse_f64(v, -1e300, 1e300, &req.sample.repeat_penalty);
        else if (!strcmp(a, "--seed")) {
            bad = lt_cli_parse_i64(v, 0, INT64_MAX, &iv);
            req.sample.seed = (uint64_t)iv;
        } else if (!strcmp(a, "--threads")) {
            bad = lt_cli_parse_i64(v, 0, 4096, &iv);
            threads = (int)iv;
        } else if (!strcmp(a, "--stop")) {
            bad = !*v || n_stops == LT_GEN_MAX_STOP;
            if (!bad) stops[n_stops++] = v;
        } else if (!strcmp(a, "--device")) {
            dev = !strcmp(v, "cuda") ? LT_DEVICE_CUDA : LT_DEVICE_CPU;
            bad = strcmp(v, "cuda") && strcmp(v, "cpu");
        } else return lt_cli_usage_error("chat", usage, "unknown option '%s'", a);
        (void)dv;
        if (bad) return lt_cli_usage_error("chat", usage, "bad %s '%s'", a, v);
    }
    if (!model) return lt_cli_usage_error("chat", usage, "--model is required");

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_ctx_set_threads(ctx, threads);
    lt_tokenizer *tok = NULL;
    lt_model *m = NULL;
    lt_kv_cache *c = NULL;
    lt_chat_message *msgs = calloc(MAX_TURNS, sizeof *msgs);
    size_t nm = 0, n_sys = 0, n_cached = 0, cap_cached = 0;
    int32_t *cached = NULL; /* the ids the cache row holds */
    char *line = NULL;
    size_t line_cap = 0;
    chat_state cs;
    memset(&cs, 0, sizeof cs);
    int rc = LT_EXIT_OK;
    lt_status s = LT_OK;
    if (!msgs) {
        s = lt_error(ctx, LT_ERR_OOM, "chat: cannot allocate the history");
        goto fail;
    }
    if ((s = lt_sample_check(ctx, &req.sample)) != LT_OK) goto fail;
    if ((s = lt_model_device_available(ctx, dev)) != LT_OK) goto fail;
    if ((s = lt_gen_open(ctx, model, adapter, dev, &tok, &m)) != LT_OK) goto fail;
    lt_chat_format fmt;
    s = tmpl_name ? lt_chat_format_parse(ctx, tmpl_name, &fmt)
                  : lt_chat_detect(ctx, lt_tokenizer_chat_template(tok), &fmt);
    if (s != LT_OK) goto fail;
    const lt_model_config *cf = lt_model_get_config(m);
    if (cf->max_positions > 0 && ctx_len > cf->max_positions) ctx_len = cf->max_positions;
    /* turns longer than CHAT_PASS_TOKENS prefill in passes of that many (the scratch's size) */
    const lt_kv_cache_options ko = {.B = 1,
                                    .ctx_len = ctx_len,
                                    .n_max = ctx_len < CHAT_PASS_TOKENS ? ctx_len : CHAT_PASS_TOKENS,
                                    .bf16_products = req.bf16_products};
    if ((s = lt_kv_cache_create(ctx, m, &ko, &c, NULL)) != LT_OK) goto fail;
    int32_t stop_ids[16];
    int n_stop_ids = lt_gen_stop_ids(tok, m, stop_ids, 16);
    req.stop_ids = stop_ids, req.n_stop = n_stop_ids;
    if (system) msgs[nm++] = (lt_chat_message){"system", strdup(system)};
    n_sys = nm;
    uint64_t rng = req.sample.seed;
    ssize_t got;
    while ((got = getline(&line, &line_cap, stdin)) >= 0) {
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!got) continue;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            for (size_t k = n_sys; k < nm; k++) free((char *)msgs[k].content);
            nm = n_sys;
            n_cached = 0;
            lt_kv_cache_truncate(ctx, c, 0, 0);
            fprintf(stderr, "(conversation reset)\n");
            continue;
        }
        if (nm + 2 > MAX_TURNS) {
            fprintf(stderr, "longtune chat: the conversation holds %d messages; /reset to go on\n", MAX_TURNS);
            continue;
        }
        msgs[nm++] = (lt_chat_message){"user", strdup(line)};
        lt_chat_options co;
        memset(&co, 0, sizeof co);
        co.add_generation_prompt = 1;
        lt_chat_text text;
        memset(&text, 0, sizeof text);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        s = lt_chat_render(ctx, fmt, &co, msgs, nm, &text);
        if (s == LT_OK) s = lt_tokenizer_encode(ctx, tok, text.text, text.len, 0, &ids, &n_ids);
        lt_chat_text_free(ctx, &text);
        size_t p = 0;
        while (s == LT_OK && p < n_cached && p < n_ids && cached[p] == ids[p]) p++;
        if (s == LT_OK && p == n_ids) p = n_ids - 1; /* at least one token yields the next logits */
        if (s == LT_OK && (int64_t)n_ids >= ctx_len)
            s = lt_error(ctx, LT_ERR_INVALID_ARG,
                         "chat: the conversation is %zu tokens; the context holds %lld (/reset to start over)", n_ids,
                         (long long)ctx_len);
        if (s == LT_OK) s = lt_kv_cache_truncate(ctx, c, 0, (int64_t)p);
        cs.n_gen = 0;
        lt_gen_stream_free(&cs.st);
        memset(&cs.st, 0, sizeof cs.st);
        cs.st.ctx = ctx, cs.st.tok = tok, cs.st.out = stdout;
        cs.st.stops = stops, cs.st.n_stops = n_stops, cs.st.stop_ids = stop_ids, cs.st.n_stop_ids = n_stop_ids;
        int64_t row = 0, n_new = (int64_t)(n_ids - p);
        const int32_t *feed = ids + p;
        lt_generate_stats gs;
        memset(&gs, 0, sizeof gs);
        if (s == LT_OK) s = lt_generate_rows(ctx, c, 1, &row, &feed, &n_new, &req, &rng, on_token, &cs, &gs);
        if (s != LT_OK) {
            lt_cli_fail("chat", ctx, s);
            lt_ctx_clear_error(ctx);
            free((char *)msgs[--nm].content);
            free(ids);
            n_cached = (size_t)lt_kv_cache_length(c, 0) < n_cached ? (size_t)lt_kv_cache_length(c, 0) : n_cached;
            s = LT_OK;
            continue;
        }
        lt_gen_stream_finish(&cs.st);
        printf("\n");
        fflush(stdout);
        if (stats)
            fprintf(stderr, "chat: %zu prompt tokens, %zu reused from the cache, %lld new tokens (%.1f tok/s)\n", n_ids,
                    p, (long long)gs.new_tokens, gs.decode_s > 0 ? (double)(gs.new_tokens - 1) / gs.decode_s : 0.0);
        /* the cache now holds the prompt and every generated id but the last */
        size_t need = n_ids + cs.n_gen;
        if (need > cap_cached) {
            int32_t *q = realloc(cached, need * sizeof(int32_t));
            if (!q) {
                free(ids);
                s = lt_error(ctx, LT_ERR_OOM, "chat: cannot keep the cached ids");
                goto fail;
            }
            cached = q, cap_cached = need;
        }
        memcpy(cached, ids, n_ids * sizeof(int32_t));
        memcpy(cached + n_ids, cs.gen, cs.n_gen * sizeof(int32_t));
        n_cached = (size_t)lt_kv_cache_length(c, 0);
        free(ids);
        msgs[nm++] = (lt_chat_message){"assistant", strdup(cs.st.text ? cs.st.text : "")};
    }
    goto done;
fail:
    rc = lt_cli_fail("chat", ctx, s);
done:
    free(line);
    free(cached);
    free(cs.gen);
    lt_gen_stream_free(&cs.st);
    for (size_t k = 0; k < nm; k++) free((char *)msgs[k].content);
    free(msgs);
    lt_kv_cache_free(ctx, c);
    if (m) lt_model_free(ctx, m);
    if (tok) lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return rc;
}
