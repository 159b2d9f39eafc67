/* Fuzz target: tokenizer.json loading (model, merges, added tokens, normalizer, pre-tokenizer,
 * decoder sections) and, when a file loads, one encode/decode round of a fixed text. */
#include <stdlib.h>

#include "fuzz_util.h"
#include "longtune/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = lt_fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    lt_ctx *ctx = lt_ctx_new();
    lt_tokenizer *tok = NULL;
    if (lt_tokenizer_load_json(ctx, path, &tok) == LT_OK) {
        static const char text[] = "Hello, wörld! 12345 \xe4\xbd\xa0\xe5\xa5\xbd <s> \xff\xfe end";
        int32_t *ids = NULL;
        size_t n = 0;
        if (lt_tokenizer_encode(ctx, tok, text, sizeof text - 1, 1, &ids, &n) == LT_OK) {
            char *out = NULL;
            size_t len = 0;
            if (lt_tokenizer_decode(ctx, tok, ids, n, 0, &out, &len) == LT_OK) free(out);
            free(ids);
        }
        lt_tokenizer_free(tok);
    }
    lt_ctx_free(ctx);
    close(fd);
    return 0;
}
