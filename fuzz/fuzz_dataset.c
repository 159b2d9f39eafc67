/* Fuzz target: arbitrary bytes as a dataset JSONL file read end to end (line reader, record parser,
 * chat template, tokenizer, prompt masking) with the bpe-nfc fixture tokenizer (it has a ChatML
 * template). The first byte picks the options (mask_prompt, skip_bad_lines, a small line limit, a
 * forced chat format). A dataset that loads must be consistent: offsets non-decreasing from 0 to N,
 * every token id inside the vocabulary, stats that add up. Never a crash, a hang or a leak. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "longtune/alloc.h"
#include "longtune/dataset.h"
#include "longtune/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lt_tokenizer *tok;
static lt_ctx *tok_ctx;

static void load_tokenizer(void) {
    /* The fixture lives beside this file's folder: <src>/fuzz/fuzz_dataset.c. */
    char root[1024];
    snprintf(root, sizeof root, "%s", __FILE__);
    char *slash = strrchr(root, '/');
    if (slash) *slash = '\0';
    slash = strrchr(root, '/');
    if (slash) *slash = '\0';
    else snprintf(root, sizeof root, ".");
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/bpe-nfc/tokenizer.json", root);
    tok_ctx = lt_ctx_new();
    if (lt_tokenizer_load_json(tok_ctx, path, &tok) != LT_OK) {
        fprintf(stderr, "fuzz_dataset: %s\n", lt_ctx_error(tok_ctx));
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok) load_tokenizer();
    if (size < 1) return 0;
    uint8_t sel = data[0];
    char path[64];
    int fd = lt_fuzz_memfile(data + 1, size - 1, path, sizeof path);
    if (fd < 0) return 0;
    lt_ctx *ctx = lt_ctx_new();
    lt_dataset_options opt;
    memset(&opt, 0, sizeof opt);
    opt.mask_prompt = sel & 1;
    opt.skip_bad_lines = (sel >> 1) & 1;
    opt.max_line_bytes = (sel >> 2) & 1 ? 48 : 0;
    int fmt = (sel >> 3) % (int)LT_CHAT_FORMAT_COUNT_;
    opt.chat_format = (lt_chat_format)fmt;
    opt.chat.date = "01 Jan 2025";
    opt.max_records = (sel & 0x80) ? 3 : 0;
    lt_dataset *ds = NULL;
    if (lt_dataset_load(ctx, path, tok, &opt, &ds) == LT_OK) {
        lt_pack_input in = lt_dataset_input(ds);
        lt_dataset_stats st = lt_dataset_get_stats(ds);
        int64_t vocab = lt_tokenizer_vocab_size(tok);
        if (in.n_seqs != st.records || in.offsets[0] != 0 || in.offsets[in.n_seqs] != st.tokens) abort();
        if (st.text_records + st.completion_records + st.chat_records != st.records) abort();
        int64_t sup = 0;
        for (int64_t i = 0; i < in.n_seqs; i++)
            if (in.offsets[i + 1] < in.offsets[i]) abort();
        for (int64_t i = 0; i < st.tokens; i++) {
            if (in.tokens[i] < 0 || in.tokens[i] >= vocab) abort();
            if (!in.supervised || in.supervised[i]) sup++;
        }
        if (sup != st.supervised) abort();
        if (opt.max_records && st.records > opt.max_records) abort();
        lt_dataset_free(ctx, ds);
    }
    if (lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes != 0) abort();
    lt_ctx_free(ctx);
    close(fd);
    return 0;
}
