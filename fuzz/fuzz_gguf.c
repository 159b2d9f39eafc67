/* Fuzz target: arbitrary bytes as a GGUF file. Whatever opens must be fully readable (every key,
 * every array element, every tensor's first and last byte) and, when it carries tokenizer.ggml.*
 * metadata, must load as a tokenizer or fail with a typed error. Never a crash or a leak. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longtune/alloc.h"
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

static void read_everything(lt_ctx *ctx, const lt_gguf *g) {
    for (int64_t i = 0; i < lt_gguf_kv_count(g); i++) {
        const char *k;
        size_t kl;
        lt_gguf_type t;
        if (lt_gguf_kv_key(ctx, g, i, &k, &kl, &t) != LT_OK) abort();
        char key[256];
        if (kl >= sizeof key || memchr(k, 0, kl)) continue;
        memcpy(key, k, kl);
        key[kl] = '\0';
        uint64_t u, n;
        int64_t v;
        double f;
        const char *s;
        size_t sl;
        lt_gguf_type et;
        (void)lt_gguf_get_u64(ctx, g, key, &u);
        (void)lt_gguf_get_i64(ctx, g, key, &v);
        (void)lt_gguf_get_f64(ctx, g, key, &f);
        if (lt_gguf_get_str(ctx, g, key, &s, &sl) == LT_OK && sl && (s[0] == 1 && s[sl - 1] == 2)) abort();
        if (lt_gguf_get_array(ctx, g, key, &et, &n) == LT_OK)
            for (uint64_t e = 0; e < n && e < 4096; e++) {
                (void)lt_gguf_array_str(ctx, g, key, e, &s, &sl);
                (void)lt_gguf_array_i64(ctx, g, key, e, &v);
                (void)lt_gguf_array_f64(ctx, g, key, e, &f);
            }
    }
    for (int64_t i = 0; i < lt_gguf_tensor_count(g); i++) {
        lt_tensor t;
        if (lt_gguf_find_tensor(ctx, g, lt_gguf_tensor_name(g, i), &t) != LT_OK) continue;
        int64_t nb = lt_tensor_nbytes(&t);
        if (nb > 0) {
            volatile uint8_t x = ((const uint8_t *)t.data)[0];
            x ^= ((const uint8_t *)t.data)[nb - 1];
            (void)x;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/lt_fuzz_gguf_%d", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    if (size) fwrite(data, 1, size, f);
    fclose(f);
    lt_ctx *ctx = lt_ctx_new();
    lt_gguf *g = NULL;
    if (lt_gguf_open(ctx, path, &g) == LT_OK) {
        read_everything(ctx, g);
        lt_tokenizer *tok = NULL;
        if (lt_tokenizer_load_gguf(ctx, g, &tok) == LT_OK) {
            int32_t *ids;
            size_t n;
            static const char text[] = "Hello world 123 caf\xC3\xA9 \xF0\x9F\x98\x80";
            if (lt_tokenizer_encode(ctx, tok, text, sizeof text - 1, 1, &ids, &n) == LT_OK) {
                char *out;
                size_t ol;
                if (lt_tokenizer_decode(ctx, tok, ids, n, 0, &out, &ol) == LT_OK) free(out);
                free(ids);
            }
            lt_tokenizer_free(tok);
        }
        lt_gguf_close(g);
    }
    if (lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes != 0) abort();
    lt_ctx_free(ctx);
    unlink(path);
    return 0;
}
