/* Unicode NFC for the tokenizer's NFC normalizer: canonical decomposition (Hangul algorithmic),
 * canonical ordering, canonical composition, with a quick check that passes most text through
 * untouched. Tables come from scripts/gen_nfc_tables.py (Unicode 14 via Python's unicodedata).
 * No NFD/NFKC/NFKD output, no case folding. Input must be valid UTF-8. */
#include <stdint.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "longtune/alloc.h"
#include "data/tokenizer_nfc_tables.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT
};

static int in_ranges2(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static int ccc_of(uint32_t cp) {
    if (cp < 0x300) return 0;
    size_t lo = 0, hi = N_ELEMS(nfc_ccc);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_ccc[mid][0]) hi = mid;
        else if (cp > nfc_ccc[mid][1]) lo = mid + 1;
        else return (int)nfc_ccc[mid][2];
    }
    return 0;
}

static uint32_t compose_pair(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT)
        return a + (b - TBASE);
    uint64_t key = (uint64_t)a << 21 | b;
    size_t lo = 0, hi = N_ELEMS(nfc_comp_key);
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (nfc_comp_key[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < N_ELEMS(nfc_comp_key) && nfc_comp_key[lo] == key ? nfc_comp_val[lo] : 0;
}

/* Appends the full canonical decomposition of cp to out[*n] (at most 4 code points + Hangul 3). */
static void decompose(uint32_t cp, uint32_t *out, size_t *n) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE;
        out[(*n)++] = LBASE + s / NCOUNT;
        out[(*n)++] = VBASE + (s % NCOUNT) / TCOUNT;
        if (s % TCOUNT) out[(*n)++] = TBASE + s % TCOUNT;
        return;
    }
    if (cp >= 0xC0) {
        size_t lo = 0, hi = N_ELEMS(nfc_decomp);
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (nfc_decomp[mid][0] < cp) lo = mid + 1;
            else hi = mid;
        }
        if (lo < N_ELEMS(nfc_decomp) && nfc_decomp[lo][0] == cp) {
            for (uint32_t k = 0; k < nfc_decomp[lo][2]; k++) out[(*n)++] = nfc_decomp_pool[nfc_decomp[lo][1] + k];
            return;
        }
    }
    out[(*n)++] = cp;
}

/* The code point at s[*i] (valid UTF-8), advancing *i past it. */
static inline uint32_t next_cp(const uint8_t *s, size_t *i) {
    size_t len;
    uint32_t cp = tk_utf8_decode(s + *i, &len);
    *i += len;
    return cp;
}

int lt_tok_nfc_quick(const char *s, size_t len) {
    const uint8_t *p = (const uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        /* Bytes below 0xCC never start a code point >= U+0300. */
        if (p[i] < 0xCC) {
            i++;
            continue;
        }
        uint32_t cp = next_cp(p, &i);
        if (in_ranges2(nfc_unsafe, N_ELEMS(nfc_unsafe), cp)) return 0;
    }
    return 1;
}

/* Canonical ordering: stable insertion sort of each run of non-starters by combining class. */
static void canonical_order(uint32_t *cps, size_t n) {
    for (size_t i = 1; i < n; i++) {
        int c = ccc_of(cps[i]);
        if (!c) continue;
        size_t j = i;
        uint32_t v = cps[i];
        while (j > 0) {
            int pc = ccc_of(cps[j - 1]);
            if (pc <= c) break;
            cps[j] = cps[j - 1];
            j--;
        }
        cps[j] = v;
    }
}

/* Canonical composition in place; returns the new count. */
static size_t compose(uint32_t *cps, size_t n) {
    size_t w = 0, starter = SIZE_MAX;
    int last_cc = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t c = cps[i];
        int cc = ccc_of(c);
        if (starter != SIZE_MAX) {
            int adjacent = w == starter + 1;
            if (adjacent || (last_cc != 0 && last_cc < cc)) {
                uint32_t comp = compose_pair(cps[starter], c);
                if (comp) {
                    cps[starter] = comp;
                    continue;
                }
            }
        }
        if (cc == 0) starter = w;
        cps[w++] = c;
        last_cc = cc;
    }
    return w;
}

lt_status lt_tok_nfc(lt_ctx *ctx, const char *s, size_t len, char **out, size_t *out_len, size_t *cap) {
    /* Decomposition grows a code point into at most 4 (Hangul 3): 4 per input byte bounds it. */
    size_t ncp_cap = len * 4 + 4;
    uint32_t *cps = lt_alloc(ctx, LT_DEVICE_CPU, ncp_cap * sizeof *cps, "nfc buffer");
    if (!cps) return lt_ctx_status(ctx);
    size_t n = 0;
    for (size_t i = 0; i < len;) decompose(next_cp((const uint8_t *)s, &i), cps, &n);
    canonical_order(cps, n);
    size_t w = compose(cps, n);
    /* Back to UTF-8 (never longer than 4 bytes per code point). */
    size_t need = w * 4 + 1;
    if (need > *cap) {
        char *nb = lt_alloc(ctx, LT_DEVICE_CPU, need, "nfc output");
        if (!nb) {
            lt_free(ctx, LT_DEVICE_CPU, cps, ncp_cap * sizeof *cps);
            return lt_ctx_status(ctx);
        }
        if (*out) lt_free(ctx, LT_DEVICE_CPU, *out, *cap);
        *out = nb;
        *cap = need;
    }
    size_t on = 0;
    for (size_t i = 0; i < w; i++) on += (size_t)lt_tok_utf8_put(*out + on, cps[i]);
    *out_len = on;
    lt_free(ctx, LT_DEVICE_CPU, cps, ncp_cap * sizeof *cps);
    return LT_OK;
}
