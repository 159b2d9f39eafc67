/* Fuzz target: the GGUF reader — open, walk every metadata key the loaders read and every tensor
 * lookup, on arbitrary bytes. Any crash, hang, leak or sanitizer report is a bug. */
#include <stdlib.h>

#include "fuzz_util.h"
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    int fd = lt_fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    lt_ctx *ctx = lt_ctx_new();
    lt_gguf *g = NULL;
    if (lt_gguf_open(ctx, path, &g) == LT_OK) {
        uint64_t u;
        const char *s;
        size_t len;
        lt_gguf_get_str(ctx, g, "general.architecture", &s, &len);
        lt_gguf_get_u64(ctx, g, "llama.block_count", &u);
        lt_gguf_type et;
        uint64_t count;
        if (lt_gguf_get_array(ctx, g, "tokenizer.ggml.tokens", &et, &count) == LT_OK && count)
            lt_gguf_array_str(ctx, g, "tokenizer.ggml.tokens", count - 1, &s, &len);
        for (int64_t i = 0; i < lt_gguf_tensor_count(g); i++) {
            lt_tensor t;
            const char *name = lt_gguf_tensor_name(g, i);
            if (name && lt_gguf_find_tensor(ctx, g, name, &t) == LT_OK) {
                int64_t nb = lt_tensor_nbytes(&t);
                if (nb > 0) { /* touch first and last byte: they must be inside the mapping */
                    volatile uint8_t x = ((const uint8_t *)t.data)[0];
                    x = ((const uint8_t *)t.data)[nb - 1];
                    (void)x;
                }
            }
        }
        lt_tokenizer *tok = NULL;
        if (lt_tokenizer_load_gguf(ctx, g, &tok) == LT_OK) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (lt_tokenizer_encode(ctx, tok, "Hello world 123", 15, 1, &ids, &n) == LT_OK) free(ids);
            lt_tokenizer_free(tok);
        }
        lt_gguf_close(g);
    }
    lt_ctx_free(ctx);
    close(fd);
    return 0;
}
