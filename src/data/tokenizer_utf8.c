/* UTF-8 for the tokenizer: well-formedness by Unicode table 3-7 (what one U+FFFD replaces), the
 * valid prefix of a buffer, encoding a code point, and GPT-2's reversible byte <-> character map
 * that byte-level vocabularies are spelled in. No normalisation (tokenizer_nfc.c). */
#include <pthread.h>

#include "data/tokenizer_internal.h"

/* GPT-2's byte map: printable Latin-1 bytes stand for themselves, the other 68 bytes take code
 * points 256.. in order. */
static int byte_to_cp(int b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) n++;
    return 256 + n;
}

static int cp_to_byte_table[324];

static void init_byte_tables(void) {
    for (int i = 0; i < 324; i++) cp_to_byte_table[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte_table[byte_to_cp(b)] = b;
}

void lt_tok_byte_map_init(void) {
    static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
    pthread_once(&tables_once, init_byte_tables);
}

int lt_tok_cp_to_byte(uint32_t cp) { return cp < 324 ? cp_to_byte_table[cp] : -1; }

int lt_tok_utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t lt_tok_utf8_char(const uint8_t *s, size_t n, size_t *bad) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) {
        need = 2;
        lo = 0xA0;
    } else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) {
        need = 2;
        hi = 0x9F;
    } else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) {
        need = 3;
        lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) {
        need = 3;
        hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n) {
            *bad = i;
            return 0;
        }
        uint8_t x = s[i];
        if (x < lo || x > hi) {
            *bad = i;
            return 0;
        }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

size_t lt_tok_utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad = 1;
        size_t k = lt_tok_utf8_char(s + i, n - i, &bad);
        if (!k) return i;
        i += k;
    }
    return n;
}
