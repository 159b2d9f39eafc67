/* Fuzz target: encode arbitrary bytes (any UTF-8 validity) with committed byte-level and
 * SentencePiece-style tokenizers, decode the ids back, and decode the input read as raw ids.
 * For valid UTF-8 without special-token text, decode(encode(s)) must equal s. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "longtune/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static lt_tokenizer *toks[2];

static void load_once(void) {
    static int done;
    if (done) return;
    done = 1;
    static const char *const names[2] = {"bpe-nfc", "spm"};
    lt_ctx *ctx = lt_ctx_new();
    for (int i = 0; i < 2; i++) {
        char p[1024];
        snprintf(p, sizeof p, "%s/tests/fixtures/tokenizer/%s/tokenizer.json", LT_SOURCE_DIR, names[i]);
        if (lt_tokenizer_load_json(ctx, p, &toks[i]) != LT_OK) {
            fprintf(stderr, "fuzz_tokenize: %s\n", lt_ctx_error(ctx));
            abort();
        }
    }
    lt_ctx_free(ctx);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    load_once();
    lt_ctx *ctx = lt_ctx_new();
    for (int i = 0; i < 2; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (lt_tokenizer_encode(ctx, toks[i], (const char *)data, size, 0, &ids, &n) == LT_OK) {
            char *out = NULL;
            size_t len = 0;
            if (lt_tokenizer_decode(ctx, toks[i], ids, n, 0, &out, &len) == LT_OK) free(out);
            free(ids);
        }
        /* The same bytes read as token ids, most of them out of range. */
        size_t nid = size / 4;
        int32_t *raw = malloc(nid ? nid * 4 : 4);
        if (raw) {
            if (nid) memcpy(raw, data, nid * 4);
            char *out = NULL;
            size_t len = 0;
            if (lt_tokenizer_decode(ctx, toks[i], raw, nid, 1, &out, &len) == LT_OK) free(out);
            free(raw);
        }
    }
    lt_ctx_free(ctx);
    return 0;
}
