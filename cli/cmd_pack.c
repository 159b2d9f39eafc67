/* `longtune pack`: reads a dataset split with the model's tokenizer, packs it into rows of
 * --max-seq-length tokens and prints what packing achieves (rows, sequences per row, utilisation,
 * padding, truncations), as text or JSON. It writes nothing; the trainer packs the same way. */
#include <stdio.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "cli.h"
#include "longtune/dataset.h"
#include "longtune/pack.h"
#include "longtune/tokenizer.h"

static const char *usage =
    "longtune pack --model M --data DIR --max-seq-length L [--algorithm first-fit|bfd|none] [--batch-size B] "
    "[--split train|valid|test] [--overflow truncate|split] [--mask-prompt] [--chat-template NAME] "
    "[--skip-bad-lines] [--seed N] [--epoch N] [--json]";

static void help(void) {
    printf("usage: %s\n\n"
           "Tokenises DIR/<split>.jsonl (mlx-lm layout: {\"text\"}, {\"prompt\",\"completion\"} or "
           "{\"messages\"} per line)\nwith the model's tokenizer and chat template, packs it and prints the "
           "statistics.\n\n"
           "  --model M            GGUF file, tokenizer.json, or a folder holding tokenizer.json\n"
           "  --data DIR           dataset folder (train.jsonl, valid.jsonl, test.jsonl)\n"
           "  --max-seq-length L   row length in tokens\n"
           "  --algorithm A        first-fit (seeded shuffle, default) | bfd (best-fit decreasing) |\n"
           "                       none (one sequence per row, padded to the batch's longest)\n"
           "  --batch-size B       rows per batch (default 1)\n"
           "  --split S            train (default) | valid | test\n"
           "  --overflow O         truncate (default) | split sequences longer than L\n"
           "  --mask-prompt        supervise only completion / assistant tokens\n"
           "  --chat-template NAME chatml, smollm2, qwen2, qwen2.5, qwen3, llama3, llama3.1, llama3.2,\n"
           "                       mistral, mistral-v0.1, mistral-v0.3, mistral-nemo, gemma, gemma3, phi3,\n"
           "                       phi3-mini (default: recognised from the model)\n"
           "  --skip-bad-lines     count and skip malformed lines instead of failing\n"
           "  --seed N, --epoch N  shuffle of the first-fit order / row order (default 0, 0)\n"
           "  --json               print the statistics as JSON\n",
           usage);
}

int lt_cmd_pack(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *split = "train", *alg_name = "first-fit", *overflow = "truncate";
    const char *chat_name = NULL;
    int64_t L = 0, B = 1, seed = 0, epoch = 0;
    int json = 0, mask_prompt = 0, skip_bad = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            help();
            return LT_EXIT_OK;
        }
        if (!strcmp(a, "--json")) {
            json = 1;
            continue;
        }
        if (!strcmp(a, "--mask-prompt")) {
            mask_prompt = 1;
            continue;
        }
        if (!strcmp(a, "--skip-bad-lines")) {
            skip_bad = 1;
            continue;
        }
        const char **str = !strcmp(a, "--model") ? &model
            : !strcmp(a, "--data")               ? &data
            : !strcmp(a, "--split")              ? &split
            : !strcmp(a, "--algorithm")          ? &alg_name
            : !strcmp(a, "--overflow")           ? &overflow
            : !strcmp(a, "--chat-template")      ? &chat_name
                                                 : NULL;
        int64_t *num = !strcmp(a, "--max-seq-length") ? &L
            : !strcmp(a, "--batch-size")              ? &B
            : !strcmp(a, "--seed")                    ? &seed
            : !strcmp(a, "--epoch")                   ? &epoch
                                                      : NULL;
        if (!str && !num) return lt_cli_usage_error("pack", usage, "unknown option '%s'", a);
        if (i + 1 >= argc) return lt_cli_usage_error("pack", usage, "%s needs a value", a);
        if (str) {
            *str = argv[++i];
        } else {
            int64_t lo = num == &L ? 2 : num == &B ? 1 : 0;
            int64_t hi = num == &L ? (int64_t)1 << 30 : num == &B ? 1 << 20 : INT64_MAX;
            if (lt_cli_parse_i64(argv[++i], lo, hi, num))
                return lt_cli_usage_error("pack", usage, "bad value '%s' for %s", argv[i], a);
        }
    }
    if (!model || !data || !L)
        return lt_cli_usage_error("pack", usage, "--model, --data and --max-seq-length are required");
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return LT_EXIT_FAIL;
    lt_pack_options po = {0};
    po.row_len = L;
    po.batch_size = B;
    po.seed = (uint64_t)seed;
    po.epoch = (uint64_t)epoch;
    lt_dataset_options dopt = {0};
    dopt.mask_prompt = mask_prompt;
    dopt.skip_bad_lines = skip_bad;
    if (lt_pack_algorithm_parse(ctx, alg_name, &po.algorithm) != LT_OK) {
        int rc = lt_cli_usage_error("pack", usage, "%s", lt_ctx_error(ctx));
        lt_ctx_free(ctx);
        return rc;
    }
    if (!strcmp(overflow, "split")) po.overflow = LT_PACK_SPLIT;
    else if (strcmp(overflow, "truncate")) {
        lt_ctx_free(ctx);
        return lt_cli_usage_error("pack", usage, "--overflow is truncate or split, not '%s'", overflow);
    }
    if (chat_name && lt_chat_format_parse(ctx, chat_name, &dopt.chat_format) != LT_OK) {
        int rc = lt_cli_usage_error("pack", usage, "%s", lt_ctx_error(ctx));
        lt_ctx_free(ctx);
        return rc;
    }

    lt_tokenizer *tok = NULL;
    lt_dataset *ds = NULL;
    lt_pack_plan *plan = NULL;
    lt_status s = lt_tokenizer_load(ctx, model, &tok);
    if (s == LT_OK) s = lt_dataset_load_split(ctx, data, split, tok, &dopt, &ds);
    lt_pack_input in;
    if (s == LT_OK) {
        in = lt_dataset_input(ds);
        po.pad_id = lt_tokenizer_pad(tok) >= 0 ? lt_tokenizer_pad(tok)
            : lt_tokenizer_eos(tok) >= 0       ? lt_tokenizer_eos(tok)
                                               : 0;
        s = lt_pack_plan_build(ctx, &in, &po, &plan);
    }
    if (s != LT_OK) {
        int rc = lt_cli_fail("pack", ctx, s);
        lt_pack_plan_free(ctx, plan);
        lt_dataset_free(ctx, ds);
        lt_tokenizer_free(tok);
        lt_ctx_free(ctx);
        return rc;
    }
    lt_dataset_stats d = lt_dataset_get_stats(ds);
    lt_pack_stats p = lt_pack_plan_stats(plan);
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON *cfg = cJSON_AddObjectToObject(o, "config");
        cJSON_AddStringToObject(cfg, "model", model);
        cJSON_AddStringToObject(cfg, "data", data);
        cJSON_AddStringToObject(cfg, "split", split);
        cJSON_AddNumberToObject(cfg, "max_seq_length", (double)L);
        cJSON_AddNumberToObject(cfg, "batch_size", (double)B);
        cJSON_AddStringToObject(cfg, "algorithm", lt_pack_algorithm_name(po.algorithm));
        cJSON_AddStringToObject(cfg, "overflow", overflow);
        cJSON_AddBoolToObject(cfg, "mask_prompt", mask_prompt);
        cJSON_AddNumberToObject(cfg, "seed", (double)seed);
        cJSON_AddNumberToObject(cfg, "epoch", (double)epoch);
        cJSON *dj = cJSON_AddObjectToObject(o, "dataset");
        cJSON_AddNumberToObject(dj, "records", (double)d.records);
        cJSON_AddNumberToObject(dj, "text_records", (double)d.text_records);
        cJSON_AddNumberToObject(dj, "completion_records", (double)d.completion_records);
        cJSON_AddNumberToObject(dj, "chat_records", (double)d.chat_records);
        cJSON_AddNumberToObject(dj, "skipped_lines", (double)d.skipped_lines);
        cJSON_AddNumberToObject(dj, "tokens", (double)d.tokens);
        cJSON_AddNumberToObject(dj, "supervised_tokens", (double)d.supervised);
        cJSON_AddNumberToObject(dj, "min_len", (double)d.min_len);
        cJSON_AddNumberToObject(dj, "max_len", (double)d.max_len);
        cJSON_AddStringToObject(dj, "chat_template", lt_chat_format_name(d.chat_format));
        cJSON *pj = cJSON_AddObjectToObject(o, "pack");
        cJSON_AddNumberToObject(pj, "rows", (double)p.rows);
        cJSON_AddNumberToObject(pj, "empty_rows", (double)p.empty_rows);
        cJSON_AddNumberToObject(pj, "batches", (double)p.batches);
        cJSON_AddNumberToObject(pj, "pieces", (double)p.pieces);
        cJSON_AddNumberToObject(pj, "seqs_per_row", p.seqs_per_row);
        cJSON_AddNumberToObject(pj, "max_segments", (double)p.max_segments);
        cJSON_AddNumberToObject(pj, "real_tokens", (double)p.real_tokens);
        cJSON_AddNumberToObject(pj, "capacity_tokens", (double)p.capacity_tokens);
        cJSON_AddNumberToObject(pj, "padding_tokens", (double)p.padding_tokens);
        cJSON_AddNumberToObject(pj, "targets", (double)p.targets);
        cJSON_AddNumberToObject(pj, "utilisation", p.utilisation);
        cJSON_AddNumberToObject(pj, "padding_waste", p.padding_waste);
        cJSON_AddNumberToObject(pj, "truncated", (double)p.truncated);
        cJSON_AddNumberToObject(pj, "split", (double)p.split);
        cJSON_AddNumberToObject(pj, "dropped_tokens", (double)p.dropped_tokens);
        cJSON_AddNumberToObject(pj, "empty_sequences", (double)p.empty_sequences);
        char *txt = cJSON_Print(o);
        if (txt) printf("%s\n", txt);
        cJSON_free(txt);
        cJSON_Delete(o);
    } else {
        printf("dataset   %s/%s.jsonl: %lld records (%lld text, %lld completion, %lld chat), %lld skipped lines\n",
               data, split, (long long)d.records, (long long)d.text_records, (long long)d.completion_records,
               (long long)d.chat_records, (long long)d.skipped_lines);
        printf("tokens    %lld (%lld supervised%s), per record %lld..%lld, chat template %s\n", (long long)d.tokens,
               (long long)d.supervised, mask_prompt ? ", prompt masked" : "", (long long)d.min_len,
               (long long)d.max_len, lt_chat_format_name(d.chat_format));
        printf("packing   %s, rows of %lld, batch %lld: %lld rows (+%lld empty) in %lld batches, %.2f sequences/row, "
               "up to %lld segments\n",
               lt_pack_algorithm_name(po.algorithm), (long long)L, (long long)B, (long long)p.rows,
               (long long)p.empty_rows, (long long)p.batches, p.seqs_per_row, (long long)p.max_segments);
        printf("tokens    %lld real of %lld: utilisation %.2f%%, padding waste %.2f%%, %lld targets\n",
               (long long)p.real_tokens, (long long)p.capacity_tokens, 100.0 * p.utilisation, 100.0 * p.padding_waste,
               (long long)p.targets);
        printf("overflow  %lld truncated (%lld tokens dropped), %lld split\n", (long long)p.truncated,
               (long long)p.dropped_tokens, (long long)p.split);
    }
    lt_pack_plan_free(ctx, plan);
    lt_dataset_free(ctx, ds);
    lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
    return LT_EXIT_OK;
}
