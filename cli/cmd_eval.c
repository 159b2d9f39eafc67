/* `longtune eval`: mean loss and perplexity of a model (plus an optional adapter) on a data split,
 * read, masked and packed exactly as `train` reads its validation split (train's option parser
 * resolves the shared flags), forward only. --json prints one object with mean_loss, ppl and the
 * token counts, for comparing with other tools (llama-perplexity, mlx-lm). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gen_common.h"
#include "longtune/dataset.h"
#include "longtune/log.h"
#include "longtune/train.h"

static const char *usage =
    "longtune eval --model M [--adapter DIR] --data DIR [--split test|valid|train] [--max-seq-length T] "
    "[--batch-size B] [--max-batches N] [--mask-prompt] [--device cpu|cuda] [--threads N] [--bf16-products] "
    "[--json]\n"
    "       longtune eval --model M [--adapter DIR] --text FILE --ctx N [--max-batches N] [--device cpu|cuda] "
    "[--bf16-products] [--json]";

/* The raw text of path, NUL-terminated (malloc'd), at most 1 GiB. */
static lt_status read_text(lt_ctx *ctx, const char *path, char **out, size_t *n) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, LT_ERR_NOT_FOUND, "%s: cannot open the text file", path);
    size_t cap = 1 << 16, len = 0, got;
    char *b = malloc(cap + 1);
    while (b && (got = fread(b + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            char *nb = cap < ((size_t)1 << 30) ? realloc(b, 2 * cap + 1) : NULL;
            if (!nb) {
                free(b);
                fclose(f);
                return lt_error(ctx, cap < ((size_t)1 << 30) ? LT_ERR_OOM : LT_ERR_INVALID_ARG,
                                "%s: the text file is over 1 GiB or memory ran out", path);
            }
            b = nb, cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!b) return lt_error(ctx, LT_ERR_OOM, "%s: no memory for the text", path);
    if (err) {
        free(b);
        return lt_error(ctx, LT_ERR_IO, "%s: read error", path);
    }
    b[len] = 0;
    *out = b, *n = len;
    return LT_OK;
}

/* --text: the file tokenized whole as llama-perplexity does (with the tokenizer's special tokens,
 * BOS when it adds one) and scored in its windows (lt_eval_windows). */
static lt_status eval_text(lt_ctx *ctx, lt_tokenizer *tok, lt_model *m, const char *path, int64_t window,
                           int64_t max_windows, int bf16_products, int json) {
    char *text = NULL;
    size_t n = 0, ne = 0;
    int32_t *ids = NULL, *empty = NULL;
    LT_TRY(read_text(ctx, path, &text, &n));
    lt_status s = lt_tokenizer_encode(ctx, tok, text, n, 1, &ids, &ne);
    free(text);
    size_t n0 = 0;
    if (s == LT_OK) s = lt_tokenizer_encode(ctx, tok, "", 0, 1, &empty, &n0);
    int32_t bos = s == LT_OK && n0 > 0 && empty[0] == lt_tokenizer_bos(tok) ? lt_tokenizer_bos(tok) : -1;
    free(empty);
    lt_eval_result ev;
    if (s == LT_OK) s = lt_eval_windows(ctx, m, ids, (int64_t)ne, window, bos, max_windows, bf16_products, &ev);
    free(ids);
    if (s != LT_OK) return s;
    if (json)
        printf("{\"text\":\"%s\",\"mean_loss\":%.6f,\"ppl\":%.6f,\"n_tokens\":%lld,\"text_tokens\":%lld,"
               "\"windows\":%lld,\"ctx\":%lld,\"bos\":%d,\"scoring\":\"llama-perplexity: second half of each "
               "window\"}\n",
               strchr(path, '"') || strchr(path, '\\') ? "(path)" : path, ev.mean_loss, ev.ppl, (long long)ev.n_tokens,
               (long long)ne, (long long)ev.n_seqs, (long long)window, (int)bos);
    else
        printf("%s: mean loss %.4f, perplexity %.4f over %lld tokens (%lld windows of %lld, the second half of each "
               "scored as llama-perplexity does)\n",
               path, ev.mean_loss, ev.ppl, (long long)ev.n_tokens, (long long)ev.n_seqs, (long long)window);
    return LT_OK;
}

int lt_cmd_eval(int argc, char **argv) {
    const char *adapter = NULL, *split = "test", *text = NULL;
    int json = 0;
    int64_t max_batches = -1, window = 0;
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_train_options opt;
    memset(&opt, 0, sizeof opt);
    int rc = LT_EXIT_OK;
    lt_status s = LT_OK;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: %s\n\nScores DIR/<split>.jsonl (train's formats: text, prompt/completion, chat) with the\n"
                   "model M and the PEFT adapter in DIR when given: mean token loss (nats), perplexity and\n"
                   "the scored token count, with train's packing (rows of --max-seq-length [2048], --batch-size\n"
                   "rows [4]) and masking (--mask-prompt).\n"
                   "  --split NAME  test | valid | train [test]\n  --max-batches N  at most N batches [all]\n"
                   "  --json  print {\"mean_loss\", \"ppl\", \"n_tokens\", ...} on stdout\n"
                   "  --bf16-products  products on bf16-rounded inputs, as train --bf16-products (the CPU:\n"
                   "                   oneDNN, and AMX or AVX512-BF16 where it has them)\n"
                   "With --text FILE --ctx N (instead of --data) the raw file is scored as llama.cpp's\n"
                   "llama-perplexity -c N scores it: tokenized whole (BOS when the tokenizer adds one), cut into\n"
                   "windows of N tokens, each window's first token made BOS, the second half of each window\n"
                   "scored; --max-batches N then means at most N windows (llama-perplexity's --chunks).\n",
                   usage);
            lt_ctx_free(ctx);
            return LT_EXIT_OK;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--mask-prompt")) {
            opt.mask_prompt = 1;
            continue;
        }
        if (!strcmp(a, "--bf16-products")) {
            opt.bf16_products = 1;
            continue;
        }
        if (i + 1 >= argc) {
            lt_ctx_free(ctx);
            return lt_cli_usage_error("eval", usage, "option '%s' needs a value (or is unknown)", a);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--adapter")) {
            adapter = v;
        } else if (!strcmp(a, "--text")) {
            text = v;
        } else if (!strcmp(a, "--ctx")) {
            if (lt_cli_parse_i64(v, 4, (int64_t)1 << 30, &window)) {
                lt_ctx_free(ctx);
                return lt_cli_usage_error("eval", usage, "bad --ctx '%s' (an integer in [4, 2^30])", v);
            }
        } else if (!strcmp(a, "--split")) {
            if (strcmp(v, "test") && strcmp(v, "valid") && strcmp(v, "train")) {
                lt_ctx_free(ctx);
                return lt_cli_usage_error("eval", usage, "bad --split '%s' (test, valid, train)", v);
            }
            split = v;
        } else if (!strcmp(a, "--max-batches")) {
            if (lt_cli_parse_i64(v, 1, INT64_MAX, &max_batches)) {
                lt_ctx_free(ctx);
                return lt_cli_usage_error("eval", usage, "bad --max-batches '%s'", v);
            }
        } else if (!strcmp(a, "--model") || !strcmp(a, "--data") || !strcmp(a, "--max-seq-length") ||
                   !strcmp(a, "--batch-size") || !strcmp(a, "--device") || !strcmp(a, "--threads")) {
            if ((s = lt_train_options_set(ctx, &opt, a + 2, v)) != LT_OK) {
                rc = lt_cli_usage_error("eval", usage, "%s", lt_ctx_error(ctx));
                lt_ctx_free(ctx);
                return rc;
            }
        } else {
            lt_ctx_free(ctx);
            return lt_cli_usage_error("eval", usage, "unknown option '%s'", a);
        }
    }
    if (text && (opt.data[0] || !window)) {
        lt_ctx_free(ctx);
        return lt_cli_usage_error("eval", usage, "--text takes --ctx N and no --data");
    }
    if (window && !text) {
        lt_ctx_free(ctx);
        return lt_cli_usage_error("eval", usage, "--ctx goes with --text");
    }
    if (text) snprintf(opt.data, sizeof opt.data, "-"); /* the resolver's required data folder: unused */
    if (!opt.model[0] || !opt.data[0]) {
        lt_ctx_free(ctx);
        return lt_cli_usage_error("eval", usage, "--model and --data are required");
    }
    lt_tokenizer *tok = NULL;
    lt_model *m = NULL;
    lt_dataset *ds = NULL;
    lt_train_options r;
    if ((s = lt_train_options_resolve(ctx, &opt, &r)) != LT_OK) goto fail;
    if (r.threads > 0) lt_ctx_set_threads(ctx, r.threads);
    if ((s = lt_model_device_available(ctx, r.device)) != LT_OK) goto fail;
    if ((s = lt_gen_open(ctx, r.model, adapter, r.device, &tok, &m)) != LT_OK) goto fail;
    if (text) {
        if ((s = eval_text(ctx, tok, m, text, window, max_batches, r.bf16_products, json)) != LT_OK) goto fail;
        goto done;
    }
    lt_dataset_options dopt;
    memset(&dopt, 0, sizeof dopt);
    dopt.mask_prompt = r.mask_prompt;
    if ((s = lt_dataset_load_split(ctx, r.data, split, tok, &dopt, &ds)) != LT_OK) goto fail;
    lt_pack_input in = lt_dataset_input(ds);
    lt_eval_result ev;
    if ((s = lt_train_evaluate(ctx, &r, m, &in, max_batches, &ev)) != LT_OK) goto fail;
    if (json)
        printf("{\"split\":\"%s\",\"mean_loss\":%.6f,\"ppl\":%.6f,\"n_tokens\":%lld,\"n_seqs\":%lld,\"n_batches\":%lld,"
               "\"max_seq_length\":%lld,\"batch_size\":%lld}\n",
               split, ev.mean_loss, ev.ppl, (long long)ev.n_tokens, (long long)ev.n_seqs, (long long)ev.n_batches,
               (long long)r.max_seq_length, (long long)r.batch_size);
    else
        printf("%s: mean loss %.4f, perplexity %.4f over %lld tokens (%lld sequences, %lld batches)\n", split,
               ev.mean_loss, ev.ppl, (long long)ev.n_tokens, (long long)ev.n_seqs, (long long)ev.n_batches);
    goto done;
fail:
    rc = lt_cli_fail("eval", ctx, s);
done:
    if (ds) lt_dataset_free(ctx, ds);
    if (m) lt_model_free(ctx, m);
    if (tok) lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return rc;
}
