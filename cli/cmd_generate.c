/* `longtune generate`: answers a prompt with a base model, optionally with a PEFT LoRA adapter, so
 * a user can compare before and after a fine-tune. The model's chat template is applied unless
 * --no-chat-template. Greedy by default; --temp samples. Prints only the generated text on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "longtune/chat.h"
#include "longtune/log.h"
#include "longtune/train.h"

static const char *usage =
    "longtune generate --model M [--adapter DIR] --prompt TEXT [--system TEXT] [--max-tokens N] [--temp T] "
    "[--top-p P] [--seed S] [--chat-template NAME | --no-chat-template] [--threads N]";

typedef struct {
    lt_ctx *ctx;
    const lt_tokenizer *tok;
    int32_t ids[4096];
    size_t n;
    size_t printed;
} stream;

/* Decodes everything so far and prints the new bytes, so multi-byte characters split across
 * tokens come out whole. */
static void on_token(void *arg, int32_t id) {
    stream *st = arg;
    if (st->n >= sizeof st->ids / sizeof st->ids[0]) return;
    st->ids[st->n++] = id;
    char *text = NULL;
    size_t len = 0;
    if (lt_tokenizer_decode(st->ctx, st->tok, st->ids, st->n, 1, &text, &len) == LT_OK && len > st->printed) {
        fwrite(text + st->printed, 1, len - st->printed, stdout);
        fflush(stdout);
        st->printed = len;
    }
    free(text);
}

int lt_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *prompt = NULL, *system = NULL, *tmpl_name = NULL;
    int no_template = 0, threads = 0;
    lt_generate_options go = {256, 0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: %s\n\nGenerates a reply to --prompt with the model M (HF folder or .gguf), plus the PEFT\n"
                   "adapter in DIR when given (as written by longtune train). Greedy unless --temp > 0.\n"
                   "  --max-tokens N  new tokens at most [256]\n  --temp T  sampling temperature [0]\n"
                   "  --top-p P  nucleus mass [1]\n  --seed S  sampling seed [0]\n"
                   "  --system TEXT  a system message\n  --chat-template NAME  override the detected "
                   "template\n  --no-chat-template  feed the prompt as plain text (with BOS)\n",
                   usage);
            return LT_EXIT_OK;
        }
        if (!strcmp(a, "--no-chat-template")) {
            no_template = 1;
            continue;
        }
        const char *flags[] = {"--model", "--adapter", "--prompt", "--system",        "--max-tokens",
                               "--temp",  "--top-p",   "--seed",   "--chat-template", "--threads"};
        int k = -1;
        for (int j = 0; j < 10; j++)
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
            if (lt_cli_parse_i64(v, 1, 4000, &iv))
                return lt_cli_usage_error("generate", usage, "bad --max-tokens '%s'", v);
            go.max_tokens = iv;
            break;
        case 5:
            if (lt_cli_parse_f64(v, 0, 100, &dv)) return lt_cli_usage_error("generate", usage, "bad --temp '%s'", v);
            go.temp = dv;
            break;
        case 6:
            if (lt_cli_parse_f64(v, 0, 1, &dv) || dv <= 0)
                return lt_cli_usage_error("generate", usage, "bad --top-p '%s' (0 < P <= 1)", v);
            go.top_p = dv;
            break;
        case 7:
            if (lt_cli_parse_i64(v, 0, INT64_MAX, &iv))
                return lt_cli_usage_error("generate", usage, "bad --seed '%s'", v);
            go.seed = (uint64_t)iv;
            break;
        case 8: tmpl_name = v; break;
        case 9:
            if (lt_cli_parse_i64(v, 0, 4096, &iv))
                return lt_cli_usage_error("generate", usage, "bad --threads '%s'", v);
            threads = (int)iv;
            break;
        }
    }
    if (!model) return lt_cli_usage_error("generate", usage, "--model is required");
    if (!prompt) return lt_cli_usage_error("generate", usage, "--prompt is required");

    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_ctx_set_threads(ctx, threads);
    lt_tokenizer *tok = NULL;
    lt_model *m = NULL;
    lt_chat_text chat;
    memset(&chat, 0, sizeof chat);
    int32_t *ids = NULL, *out = NULL;
    size_t n_ids = 0;
    int rc = LT_EXIT_OK;
    lt_status s = lt_tokenizer_load(ctx, model, &tok);
    if (s != LT_OK) goto fail;
    if (no_template) {
        s = lt_tokenizer_encode(ctx, tok, prompt, strlen(prompt), 1, &ids, &n_ids);
    } else {
        lt_chat_format fmt;
        s = tmpl_name ? lt_chat_format_parse(ctx, tmpl_name, &fmt)
                      : lt_chat_detect(ctx, lt_tokenizer_chat_template(tok), &fmt);
        if (s != LT_OK) goto fail;
        lt_chat_message msgs[2];
        size_t nm = 0;
        if (system) msgs[nm++] = (lt_chat_message){"system", system};
        msgs[nm++] = (lt_chat_message){"user", prompt};
        lt_chat_options co;
        memset(&co, 0, sizeof co);
        co.add_generation_prompt = 1;
        if ((s = lt_chat_render(ctx, fmt, &co, msgs, nm, &chat)) != LT_OK) goto fail;
        s = lt_tokenizer_encode(ctx, tok, chat.text, chat.len, 0, &ids, &n_ids);
    }
    if (s != LT_OK) goto fail;

    lt_model_options mo = {LT_DEVICE_CPU, 0};
    lt_lora_options lora;
    memset(&lora, 0, sizeof lora);
    if (adapter) {
        lt_model_config cfg;
        if ((s = lt_model_inspect(ctx, model, &mo, &cfg)) != LT_OK) goto fail;
        if ((s = lt_peft_read_config(ctx, adapter, cfg.L, &lora)) != LT_OK) goto fail;
    } else {
        /* The model always carries LoRA; rank 1 on one projection of the last layer, with B = 0,
           leaves the base's outputs unchanged at the least cost. */
        lora.targets = 1u << LT_PROJ_Q;
        lora.num_layers = 1;
        lora.rank = 1;
    }
    if ((s = lt_model_load(ctx, model, &mo, &lora, &m)) != LT_OK) goto fail;
    if (adapter && (s = lt_peft_load(ctx, adapter, m)) != LT_OK) goto fail;

    int32_t stops[4 + LT_MAX_EOS];
    int n_stop = 0;
    const char *stop_tokens[] = {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>"};
    if (lt_tokenizer_eos(tok) >= 0) stops[n_stop++] = lt_tokenizer_eos(tok);
    for (int i = 0; i < 3; i++) {
        int32_t id = lt_tokenizer_token_id(tok, stop_tokens[i]);
        if (id >= 0 && n_stop < 4) stops[n_stop++] = id;
    }
    const lt_model_config *mcfg = lt_model_get_config(m); /* the model's EOS list (generation_config, GGUF eot) */
    for (int i = 0; i < mcfg->n_eos; i++) {
        int seen = 0;
        for (int k = 0; k < n_stop; k++) seen |= stops[k] == mcfg->eos_ids[i];
        if (!seen) stops[n_stop++] = mcfg->eos_ids[i];
    }
    stream st = {ctx, tok, {0}, 0, 0};
    out = malloc((size_t)go.max_tokens * sizeof(int32_t));
    if (!out) {
        s = lt_error(ctx, LT_ERR_OOM, "cannot allocate the output ids");
        goto fail;
    }
    int64_t n_out = 0;
    double t0 = lt_time_now();
    if ((s = lt_generate(ctx, m, ids, (int64_t)n_ids, stops, n_stop, &go, out, &n_out, on_token, &st)) != LT_OK)
        goto fail;
    double dt = lt_time_now() - t0;
    printf("\n");
    fflush(stdout);
    fprintf(stderr, "longtune generate: %lld prompt tokens, %lld new tokens in %.1f s\n", (long long)n_ids,
            (long long)n_out, dt);
    goto done;
fail:
    rc = lt_cli_fail("generate", ctx, s);
done:
    free(out);
    free(ids);
    lt_chat_text_free(ctx, &chat);
    if (m) lt_model_free(ctx, m);
    if (tok) lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return rc;
}
