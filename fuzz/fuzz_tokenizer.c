/* Fuzz target: arbitrary bytes as text through the committed fixture tokenizers (SentencePiece-
 * style, byte-level with NFC, byte-level with ignore_merges). Encode and decode must succeed; for
 * the byte-level tokenizer without a normalizer, valid UTF-8 without its strip-marked added token
 * must round-trip exactly. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/tokenizer.h"

static lt_ctx *ctx;
static lt_tokenizer *toks[3];

static void load_all(void) {
    /* The fixtures live beside this file's folder: <src>/fuzz/fuzz_tokenizer.c. */
    char root[1024];
    snprintf(root, sizeof root, "%s", __FILE__);
    char *slash = strrchr(root, '/');
    if (slash) *slash = '\0';
    slash = strrchr(root, '/');
    if (slash) *slash = '\0';
    else snprintf(root, sizeof root, ".");
    static const char *const fam[3] = {"spm", "bpe-nfc", "bpe-im"};
    ctx = lt_ctx_new();
    for (int i = 0; i < 3; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/%s/tokenizer.json", root, fam[i]);
        if (lt_tokenizer_load_json(ctx, path, &toks[i]) != LT_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s\n", lt_ctx_error(ctx));
            abort();
        }
    }
}

static int contains(const uint8_t *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) return 1;
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k = c < 0x80            ? 1
            : (c >= 0xC2 && c <= 0xDF) ? 2
            : (c >= 0xE0 && c <= 0xEF) ? 3
            : (c >= 0xF0 && c <= 0xF4) ? 4
                                       : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        uint32_t cp = k == 1 ? c
            : k == 2         ? (uint32_t)(c & 0x1F) << 6 | (s[i + 1] & 0x3F)
            : k == 3         ? (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[i + 1] & 0x3F) << 6 | (s[i + 2] & 0x3F)
                             : (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[i + 1] & 0x3F) << 12 |
                (uint32_t)(s[i + 2] & 0x3F) << 6 | (s[i + 3] & 0x3F);
        if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += k;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!ctx) load_all();
    for (int i = 0; i < 3; i++) {
        int32_t *ids;
        size_t n;
        if (lt_tokenizer_encode(ctx, toks[i], (const char *)data, size, i == 0, &ids, &n) != LT_OK) abort();
        char *out;
        size_t ol;
        if (lt_tokenizer_decode(ctx, toks[i], ids, n, 0, &out, &ol) != LT_OK) abort();
        if (i == 2 && valid_utf8(data, size) && !memchr(data, 0, size) && !contains(data, size, "<mask>") &&
            (ol != size || memcmp(out, data, size)))
            abort();
        free(out);
        free(ids);
    }
    return 0;
}
