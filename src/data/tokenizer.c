/* Tokenizer runtime: the tables every loader fills, encode (UTF-8 repair, added tokens, normalizers,
 * pre-tokenizers through PCRE2, BPE with rank-ordered merging and a shared word cache, the
 * post-processor) and decode (the decoder chain). Semantics follow the Hugging Face `tokenizers`
 * library step by step so encodings are equal token for token. Loading lives in tokenizer_load.c
 * (tokenizer.json) and tokenizer_gguf.c (GGUF metadata). No training, no offsets, no pairs. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "longtune/alloc.h"

const char *const tk_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- small growable buffers through the accounting allocator ----------------------------- */

static lt_status grow(lt_ctx *ctx, void **p, size_t *cap, size_t elem, size_t need, const char *what) {
    if (need <= *cap) return LT_OK;
    size_t nc = *cap ? *cap : 16;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem) return lt_error(ctx, LT_ERR_OOM, "%s: size overflow", what);
        nc *= 2;
    }
    void *np = lt_alloc(ctx, LT_DEVICE_CPU, nc * elem, what);
    if (!np) return lt_ctx_status(ctx);
    if (*p) {
        memcpy(np, *p, *cap * elem);
        lt_free(ctx, LT_DEVICE_CPU, *p, *cap * elem);
    }
    *p = np;
    *cap = nc;
    return LT_OK;
}

static void release(lt_ctx *ctx, void *p, size_t bytes) {
    if (p) lt_free(ctx, LT_DEVICE_CPU, p, bytes);
}

/* ---- hashing and the string map ---------------------------------------------------------- */

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    /* The tail with at most two loads (overlapping when 4 <= n < 8): copying it bytewise into a
     * u64 stalls on store forwarding, which showed up as the hottest spot of encode. */
    uint64_t v = 0;
    if (n >= 4) {
        uint32_t a, b;
        memcpy(&a, s, 4);
        memcpy(&b, s + n - 4, 4);
        v = (uint64_t)a << 32 | b;
    } else if (n) {
        v = (uint64_t)(uint8_t)s[0] << 16 | (uint64_t)(uint8_t)s[n / 2] << 8 | (uint8_t)s[n - 1];
    }
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    return h;
}

int32_t tk_lookup(const tk_strmap *m, const char *s, size_t len) {
    if (!m->cap) return -1;
    uint32_t h = (uint32_t)hash_bytes(s, len);
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t e = m->slots[i];
        if (!e) return -1;
        const struct tk_strkey *k = &m->keys[e - 1];
        if (k->hash == h && k->len == len && !memcmp(m->blob + k->off, s, len)) return k->val;
    }
}

static lt_status map_rehash(lt_ctx *ctx, tk_strmap *m, size_t cap) {
    uint32_t *slots = lt_calloc(ctx, LT_DEVICE_CPU, cap * sizeof *slots, "tokenizer hash slots");
    if (!slots) return lt_ctx_status(ctx);
    for (size_t k = 0; k < m->n; k++) {
        size_t i = m->keys[k].hash & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)(k + 1);
    }
    release(ctx, m->slots, m->cap * sizeof *m->slots);
    m->slots = slots;
    m->cap = cap;
    return LT_OK;
}

/* Inserts s -> val unless present; *existing gets the old value (or -1). */
static lt_status map_put(lt_ctx *ctx, tk_strmap *m, const char *s, size_t len, int32_t val, int32_t *existing) {
    int32_t old = tk_lookup(m, s, len);
    if (existing) *existing = old;
    if (old >= 0) return LT_OK;
    if (len > UINT32_MAX / 2 || m->blob_len + len > UINT32_MAX)
        return lt_error(ctx, LT_ERR_FORMAT, "tokenizer strings exceed 4 GiB");
    if ((m->n + 1) * 2 > m->cap) LT_TRY(map_rehash(ctx, m, m->cap ? m->cap * 2 : 1024));
    LT_TRY(grow(ctx, (void **)&m->keys, &m->keys_cap, sizeof *m->keys, m->n + 1, "tokenizer keys"));
    LT_TRY(grow(ctx, (void **)&m->blob, &m->blob_cap, 1, m->blob_len + len + 1, "tokenizer strings"));
    memcpy(m->blob + m->blob_len, s, len);
    uint32_t h = (uint32_t)hash_bytes(s, len);
    m->keys[m->n] = (struct tk_strkey){(uint32_t)m->blob_len, (uint32_t)len, val, h};
    m->blob_len += len;
    size_t i = h & (m->cap - 1);
    while (m->slots[i]) i = (i + 1) & (m->cap - 1);
    m->slots[i] = (uint32_t)(m->n + 1);
    m->n++;
    return LT_OK;
}

static void map_free(lt_ctx *ctx, tk_strmap *m) {
    release(ctx, m->slots, m->cap * sizeof *m->slots);
    release(ctx, m->keys, m->keys_cap * sizeof *m->keys);
    release(ctx, m->blob, m->blob_cap);
    memset(m, 0, sizeof *m);
}

/* ---- construction ------------------------------------------------------------------------ */

lt_status tk_new(lt_ctx *ctx, lt_tokenizer **out) {
    lt_tokenizer *t = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *t, "tokenizer");
    if (!t) return lt_ctx_status(ctx);
    t->ctx = ctx;
    t->unk_id = t->bos = t->eos = t->pad = -1;
    for (int i = 0; i < 256; i++) t->byte_id[i] = t->fallback_id[i] = -1;
    /* PCRE2's own allocations (compiled patterns, JIT) stay outside the accounting allocator:
     * they are small and PCRE2 frees without sizes. */
    *out = t;
    return LT_OK;
}

char *tk_strdup(lt_tokenizer *t, const char *s, size_t len) {
    char *p = lt_alloc(t->ctx, LT_DEVICE_CPU, len + 1, "tokenizer string");
    if (!p) return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

lt_status tk_set_token(lt_tokenizer *t, int32_t id, const char *s, size_t len) {
    lt_ctx *ctx = t->ctx;
    if (id < 0) return lt_error(ctx, LT_ERR_FORMAT, "negative token id %d", id);
    if (id >= t->n_vocab) {
        size_t old_cap = 0, n = (size_t)t->n_vocab;
        /* tok_off/tok_len/tok_special grow together to capacity >= id+1. */
        size_t cap = 1024;
        while (cap < (size_t)id + 1) cap *= 2;
        size_t cur = 1024;
        while (cur < n) cur *= 2;
        old_cap = n ? cur : 0;
        if (cap > old_cap) {
            uint32_t *no = lt_alloc(ctx, LT_DEVICE_CPU, cap * 4, "token offsets");
            uint32_t *nl = lt_alloc(ctx, LT_DEVICE_CPU, cap * 4, "token lengths");
            uint8_t *ns = lt_calloc(ctx, LT_DEVICE_CPU, cap, "token flags");
            if (!no || !nl || !ns) {
                release(ctx, no, cap * 4);
                release(ctx, nl, cap * 4);
                release(ctx, ns, cap);
                return lt_ctx_status(ctx);
            }
            if (n) {
                memcpy(no, t->tok_off, n * 4);
                memcpy(nl, t->tok_len, n * 4);
                memcpy(ns, t->tok_special, n);
            }
            release(ctx, t->tok_off, old_cap * 4);
            release(ctx, t->tok_len, old_cap * 4);
            release(ctx, t->tok_special, old_cap);
            t->tok_off = no;
            t->tok_len = nl;
            t->tok_special = ns;
        }
        for (size_t i = n; i <= (size_t)id; i++) t->tok_len[i] = UINT32_MAX;
        t->n_vocab = id + 1;
    }
    if (t->tok_len[id] != UINT32_MAX) {
        /* Same id twice: keep the first unless strings agree (added tokens repeat vocab entries). */
        if (t->tok_len[id] == len && !memcmp(t->blob + t->tok_off[id], s, len)) return LT_OK;
        return lt_error(ctx, LT_ERR_FORMAT, "token id %d is given to two different strings", id);
    }
    if (t->blob_len + len > UINT32_MAX) return lt_error(ctx, LT_ERR_FORMAT, "tokenizer strings exceed 4 GiB");
    LT_TRY(grow(ctx, (void **)&t->blob, &t->blob_cap, 1, t->blob_len + len + 1, "token strings"));
    memcpy(t->blob + t->blob_len, s, len);
    t->tok_off[id] = (uint32_t)t->blob_len;
    t->tok_len[id] = (uint32_t)len;
    t->blob_len += len;
    return map_put(ctx, &t->by_string, s, len, id, NULL);
}

static size_t tok_cap(const lt_tokenizer *t) {
    if (!t->n_vocab) return 0;
    size_t cur = 1024;
    while (cur < (size_t)t->n_vocab) cur *= 2;
    return cur;
}

lt_status tk_add_added(lt_tokenizer *t, int32_t id, const char *s, size_t len, int special, int lstrip,
                       int rstrip, int single_word, int normalized) {
    if (len == 0) return lt_error(t->ctx, LT_ERR_FORMAT, "added token %d has empty content", id);
    LT_TRY(tk_set_token(t, id, s, len));
    size_t cap = t->n_added;
    size_t have = 0;
    /* Capacity tracked implicitly: grow to the next power of two. */
    if (cap) {
        have = 16;
        while (have < cap) have *= 2;
    }
    if (t->n_added + 1 > have) {
        size_t nc = have ? have * 2 : 16;
        tk_added *na = lt_alloc(t->ctx, LT_DEVICE_CPU, nc * sizeof *na, "added tokens");
        if (!na) return lt_ctx_status(t->ctx);
        if (t->n_added) memcpy(na, t->added, t->n_added * sizeof *na);
        release(t->ctx, t->added, have * sizeof *na);
        t->added = na;
    }
    tk_added *a = &t->added[t->n_added++];
    a->id = id;
    a->off = t->tok_off[id];
    a->len = (uint32_t)len;
    a->special = (uint8_t)!!special;
    a->lstrip = (uint8_t)!!lstrip;
    a->rstrip = (uint8_t)!!rstrip;
    a->single_word = (uint8_t)!!single_word;
    a->normalized = (uint8_t)!!normalized;
    if (special) t->tok_special[id] = 1;
    t->added_first[(uint8_t)s[0]] = 1;
    if (normalized) t->any_normalized_added = 1;
    return LT_OK;
}

static size_t added_cap(size_t n) {
    if (!n) return 0;
    size_t have = 16;
    while (have < n) have *= 2;
    return have;
}

static inline size_t merge_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

lt_status tk_add_merge(lt_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    if ((t->n_merges + 1) * 2 > t->merges_cap) {
        size_t nc = t->merges_cap ? t->merges_cap * 2 : 4096;
        tk_merge *nm = lt_alloc(t->ctx, LT_DEVICE_CPU, nc * sizeof *nm, "merge table");
        if (!nm) return lt_ctx_status(t->ctx);
        for (size_t i = 0; i < nc; i++) nm[i].key = UINT64_MAX;
        for (size_t i = 0; i < t->merges_cap; i++) {
            if (t->merges[i].key == UINT64_MAX) continue;
            size_t j = merge_slot(t->merges[i].key, nc - 1);
            while (nm[j].key != UINT64_MAX) j = (j + 1) & (nc - 1);
            nm[j] = t->merges[i];
        }
        release(t->ctx, t->merges, t->merges_cap * sizeof *nm);
        t->merges = nm;
        t->merges_cap = nc;
    }
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t j = merge_slot(key, t->merges_cap - 1);
    while (t->merges[j].key != UINT64_MAX) {
        if (t->merges[j].key == key) return LT_OK; /* a repeated merge keeps its first (best) rank */
        j = (j + 1) & (t->merges_cap - 1);
    }
    t->merges[j] = (tk_merge){key, rank, merged};
    t->n_merges++;
    return LT_OK;
}

static inline const tk_merge *merge_find(const lt_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges_cap) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->merges_cap - 1;
    for (size_t j = merge_slot(key, mask);; j = (j + 1) & mask) {
        const tk_merge *m = &t->merges[j];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

lt_status tk_compile(lt_tokenizer *t, const char *pattern, size_t len, int literal, pcre2_code **out) {
    int err;
    PCRE2_SIZE off;
    /* PCRE2_LITERAL refuses PCRE2_UCP (it has no classes to apply it to). */
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, opts, &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return lt_error(t->ctx, LT_ERR_UNSUPPORTED, "pre-tokenizer regex /%.*s/ does not compile at offset %zu: %s",
                        (int)(len > 200 ? 200 : len), pattern, (size_t)off, (const char *)msg);
    }
    /* JIT may be unavailable on some platforms; pcre2_match then interprets the same pattern. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return LT_OK;
}

lt_status tk_set_post(lt_tokenizer *t, const int32_t *prefix, int np, const int32_t *suffix, int ns) {
    release(t->ctx, t->post_prefix, (size_t)t->n_post_prefix * 4);
    release(t->ctx, t->post_suffix, (size_t)t->n_post_suffix * 4);
    t->post_prefix = t->post_suffix = NULL;
    t->n_post_prefix = t->n_post_suffix = 0;
    if (np) {
        t->post_prefix = lt_alloc(t->ctx, LT_DEVICE_CPU, (size_t)np * 4, "post-processor ids");
        if (!t->post_prefix) return lt_ctx_status(t->ctx);
        memcpy(t->post_prefix, prefix, (size_t)np * 4);
        t->n_post_prefix = np;
    }
    if (ns) {
        t->post_suffix = lt_alloc(t->ctx, LT_DEVICE_CPU, (size_t)ns * 4, "post-processor ids");
        if (!t->post_suffix) return lt_ctx_status(t->ctx);
        memcpy(t->post_suffix, suffix, (size_t)ns * 4);
        t->n_post_suffix = ns;
    }
    return LT_OK;
}

/* GPT-2's reversible byte <-> character map: printable Latin-1 bytes stand for themselves, the
 * other 68 bytes take code points 256.. in order. */
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

static int cp_to_byte(uint32_t cp) { return cp < 324 ? cp_to_byte_table[cp] : -1; }

static int utf8_put(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the well-formed UTF-8 character at s[0..n) (Unicode table 3-7), or 0 with *bad set to
 * the length of its maximal ill-formed subpart (>= 1): the unit one U+FFFD replaces. */
static size_t utf8_char(const uint8_t *s, size_t n, size_t *bad) {
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) { need = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) { need = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) { need = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) { need = 3; hi = 0x8F; }
    else { *bad = 1; return 0; }
    size_t i = 1;
    for (; i <= need; i++) {
        if (i >= n) { *bad = i; return 0; }
        uint8_t x = s[i];
        if (x < lo || x > hi) { *bad = i; return 0; }
        lo = 0x80;
        hi = 0xBF;
    }
    return need + 1;
}

static uint32_t utf8_decode(const uint8_t *s, size_t *len) {
    uint8_t c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c < 0xE0) { *len = 2; return (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F); }
    if (c < 0xF0) { *len = 3; return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F); }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

/* Returns the number of bytes of s that are valid UTF-8 from the start. */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (v & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) { i++; continue; }
        size_t bad = 1;
        size_t k = utf8_char(s + i, n - i, &bad);
        if (!k) return i;
        i += k;
    }
    return n;
}

lt_status tk_finish(lt_tokenizer *t) {
    lt_ctx *ctx = t->ctx;
    static pthread_once_t tables_once = PTHREAD_ONCE_INIT;
    pthread_once(&tables_once, init_byte_tables);
    if (t->n_pres && t->pres[t->n_pres - 1].kind == TK_PRE_BYTELEVEL) t->byte_level = 1;
    for (int i = 0; i < t->n_pres - 1; i++)
        if (t->pres[i].kind == TK_PRE_BYTELEVEL)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "a ByteLevel pre-tokenizer must come last in the sequence");
    /* The map BPE consults: byte-level vocabularies are stored mapped (e.g. "Ġthe"); encode works
     * on raw bytes, so each entry is translated back once here. */
    char *tmp = NULL;
    size_t tmp_cap = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        uint32_t len = t->tok_len[id];
        if (len == UINT32_MAX) continue;
        const char *s = t->blob + t->tok_off[id];
        if (!t->byte_level) {
            LT_TRY(map_put(ctx, &t->enc, s, len, id, NULL));
            continue;
        }
        lt_status st = grow(ctx, (void **)&tmp, &tmp_cap, 1, len + 1, "tokenizer scratch");
        if (st != LT_OK) return st;
        size_t o = 0, i = 0;
        int ok = 1;
        while (i < len) {
            size_t bad = 1, k = utf8_char((const uint8_t *)s + i, len - i, &bad);
            if (!k) { ok = 0; break; }
            size_t cl;
            int b = cp_to_byte(utf8_decode((const uint8_t *)s + i, &cl));
            if (b < 0) { ok = 0; break; }
            tmp[o++] = (char)b;
            i += k;
        }
        if (!ok) continue; /* a token byte-level input can never produce (e.g. unmapped added text) */
        int32_t existing;
        st = map_put(ctx, &t->enc, tmp, o, id, &existing);
        if (st != LT_OK) {
            release(ctx, tmp, tmp_cap);
            return st;
        }
        if (o == 1 && t->byte_id[(uint8_t)tmp[0]] < 0) t->byte_id[(uint8_t)tmp[0]] = id;
    }
    release(ctx, tmp, tmp_cap);
    if (t->byte_fallback) {
        for (int b = 0; b < 256; b++) {
            char name[8];
            static const char hex[] = "0123456789ABCDEF";
            name[0] = '<'; name[1] = '0'; name[2] = 'x'; name[3] = hex[b >> 4]; name[4] = hex[b & 15]; name[5] = '>';
            t->fallback_id[b] = tk_lookup(&t->by_string, name, 6);
        }
    }
    t->cache = lt_calloc(ctx, LT_DEVICE_CPU, (size_t)TK_CACHE_SLOTS * sizeof *t->cache, "tokenizer word cache");
    if (!t->cache) return lt_ctx_status(ctx);
    for (int i = 0; i < TK_CACHE_SHARDS; i++) pthread_mutex_init(&t->cache_lock[i], NULL);
    t->cache_ready = 1;
    return LT_OK;
}

void lt_tokenizer_free(lt_tokenizer *t) {
    if (!t) return;
    lt_ctx *ctx = t->ctx;
    size_t cap = tok_cap(t);
    release(ctx, t->tok_off, cap * 4);
    release(ctx, t->tok_len, cap * 4);
    release(ctx, t->tok_special, cap);
    release(ctx, t->blob, t->blob_cap);
    map_free(ctx, &t->by_string);
    map_free(ctx, &t->enc);
    release(ctx, t->merges, t->merges_cap * sizeof *t->merges);
    release(ctx, t->added, added_cap(t->n_added) * sizeof *t->added);
    for (int i = 0; i < t->n_norms; i++) {
        if (t->norms[i].a) release(ctx, t->norms[i].a, t->norms[i].alen + 1);
        if (t->norms[i].b) release(ctx, t->norms[i].b, t->norms[i].blen + 1);
    }
    for (int i = 0; i < t->n_pres; i++)
        if (t->pres[i].re) pcre2_code_free(t->pres[i].re);
    for (int i = 0; i < t->n_decs; i++) {
        if (t->decs[i].a) release(ctx, t->decs[i].a, t->decs[i].alen + 1);
        if (t->decs[i].b) release(ctx, t->decs[i].b, t->decs[i].blen + 1);
    }
    release(ctx, t->post_prefix, (size_t)t->n_post_prefix * 4);
    release(ctx, t->post_suffix, (size_t)t->n_post_suffix * 4);
    if (t->chat_template) release(ctx, t->chat_template, t->chat_template_len + 1);
    if (t->cache_ready)
        for (int i = 0; i < TK_CACHE_SHARDS; i++) pthread_mutex_destroy(&t->cache_lock[i]);
    release(ctx, t->cache, (size_t)TK_CACHE_SLOTS * sizeof *t->cache);
    lt_free(ctx, LT_DEVICE_CPU, t, sizeof *t);
}

/* ---- encode ------------------------------------------------------------------------------ */

typedef struct tk_span {
    uint32_t start, end;
    uint8_t is_match;
} tk_span;

typedef struct bpe_sym {
    int32_t id, prev, next;
} bpe_sym;

typedef struct enc_state {
    lt_ctx *ctx;
    const lt_tokenizer *t;
    int32_t *ids; /* malloc'd: the caller owns the result */
    size_t n, cap;
    pcre2_match_data *md;
    char *scratch[TK_MAX_STAGES];
    size_t scratch_cap[TK_MAX_STAGES];
    tk_span *spans[TK_MAX_STAGES];
    size_t spans_cap[TK_MAX_STAGES];
    char *norm;
    size_t norm_cap;
    char *norm2;
    size_t norm2_cap;
    bpe_sym *sym;
    size_t sym_cap;
    int32_t *rank;
    size_t rank_cap;
    uint64_t *heap;
    size_t heap_cap;
} enc_state;

static lt_status push_id(enc_state *st, int32_t id) {
    if (st->n == st->cap) {
        size_t nc = st->cap ? st->cap * 2 : 256;
        int32_t *p = realloc(st->ids, nc * sizeof *p);
        if (!p) return lt_error(st->ctx, LT_ERR_OOM, "token id buffer of %zu entries", nc);
        st->ids = p;
        st->cap = nc;
    }
    st->ids[st->n++] = id;
    return LT_OK;
}

/* The word cache: key -> up to TK_CACHE_IDS ids. */
static int cache_get(const lt_tokenizer *t, const char *w, size_t n, uint32_t h, int32_t *ids) {
    size_t slot = h & (TK_CACHE_SLOTS - 1);
    pthread_mutex_t *lk = (pthread_mutex_t *)&t->cache_lock[slot & (TK_CACHE_SHARDS - 1)];
    pthread_mutex_lock(lk);
    const tk_cache_slot *c = &t->cache[slot];
    int k = 0;
    if (c->klen == n && c->hash == h && !memcmp(c->key, w, n)) {
        k = c->nids;
        memcpy(ids, c->ids, (size_t)k * sizeof *ids);
    }
    pthread_mutex_unlock(lk);
    return k;
}

static void cache_put(const lt_tokenizer *t, const char *w, size_t n, uint32_t h, const int32_t *ids, int k) {
    size_t slot = h & (TK_CACHE_SLOTS - 1);
    pthread_mutex_t *lk = (pthread_mutex_t *)&t->cache_lock[slot & (TK_CACHE_SHARDS - 1)];
    pthread_mutex_lock(lk);
    tk_cache_slot *c = (tk_cache_slot *)&t->cache[slot];
    c->hash = h;
    c->klen = (uint8_t)n;
    c->nids = (uint8_t)k;
    memcpy(c->key, w, n);
    memcpy(c->ids, ids, (size_t)k * sizeof *ids);
    pthread_mutex_unlock(lk);
}

static lt_status sym_push(enc_state *st, size_t *ns, int32_t id) {
    LT_TRY(grow(st->ctx, (void **)&st->sym, &st->sym_cap, sizeof *st->sym, *ns + 1, "bpe symbols"));
    st->sym[*ns] = (bpe_sym){id, (int32_t)*ns - 1, (int32_t)*ns + 1};
    (*ns)++;
    return LT_OK;
}

/* Heap of (rank << 32 | position): lowest rank first, then leftmost, as HF's BPE. */
static void heap_push(uint64_t *h, size_t *n, uint64_t v) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, size_t *n) {
    uint64_t top = h[0], v = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = v;
    return top;
}

static inline int32_t pair_rank(const lt_tokenizer *t, const bpe_sym *s, int32_t i) {
    if (s[i].next < 0) return INT32_MAX;
    const tk_merge *m = merge_find(t, s[i].id, s[s[i].next].id);
    return m ? m->rank : INT32_MAX;
}

/* Applies merges to the symbol list until none applies: lowest rank first, leftmost on ties.
 * Short words scan their pairs; long ones use a heap so adversarial inputs stay O(n log n). */
static lt_status bpe_merge(enc_state *st, size_t ns) {
    const lt_tokenizer *t = st->t;
    bpe_sym *s = st->sym;
    s[ns - 1].next = -1;
    if (ns < 2 || !t->n_merges) return LT_OK;
    if (ns <= 48) {
        LT_TRY(grow(st->ctx, (void **)&st->rank, &st->rank_cap, sizeof *st->rank, ns, "bpe ranks"));
        int32_t *r = st->rank;
        for (size_t i = 0; i < ns; i++) r[i] = pair_rank(t, s, (int32_t)i);
        for (;;) {
            int32_t best = INT32_MAX, bi = -1;
            for (int32_t i = 0; i >= 0; i = s[i].next)
                if (r[i] < best) { best = r[i]; bi = i; }
            if (bi < 0) break;
            int32_t j = s[bi].next;
            s[bi].id = merge_find(t, s[bi].id, s[j].id)->id;
            s[bi].next = s[j].next;
            if (s[j].next >= 0) s[s[j].next].prev = bi;
            r[bi] = pair_rank(t, s, bi);
            if (s[bi].prev >= 0) r[s[bi].prev] = pair_rank(t, s, s[bi].prev);
        }
        return LT_OK;
    }
    LT_TRY(grow(st->ctx, (void **)&st->heap, &st->heap_cap, sizeof *st->heap, 2 * ns + 4, "bpe heap"));
    LT_TRY(grow(st->ctx, (void **)&st->rank, &st->rank_cap, sizeof *st->rank, ns, "bpe ranks"));
    uint64_t *h = st->heap;
    int32_t *alive = st->rank; /* 1 while the symbol exists */
    size_t hn = 0;
    for (size_t i = 0; i < ns; i++) {
        alive[i] = 1;
        int32_t r = pair_rank(t, s, (int32_t)i);
        if (r != INT32_MAX) heap_push(h, &hn, (uint64_t)(uint32_t)r << 32 | i);
    }
    while (hn) {
        uint64_t top = heap_pop(h, &hn);
        int32_t r = (int32_t)(top >> 32), i = (int32_t)(top & 0xffffffffu);
        if (!alive[i] || pair_rank(t, s, i) != r) continue; /* stale entry */
        int32_t j = s[i].next;
        s[i].id = merge_find(t, s[i].id, s[j].id)->id;
        s[i].next = s[j].next;
        if (s[j].next >= 0) s[s[j].next].prev = i;
        alive[j] = 0;
        /* At most two new pairs per merge, so 2*ns bounds the heap. */
        if (hn + 2 > st->heap_cap) {
            LT_TRY(grow(st->ctx, (void **)&st->heap, &st->heap_cap, sizeof *st->heap, hn + 2, "bpe heap"));
            h = st->heap;
        }
        int32_t nr = pair_rank(t, s, i);
        if (nr != INT32_MAX) heap_push(h, &hn, (uint64_t)(uint32_t)nr << 32 | (uint32_t)i);
        if (s[i].prev >= 0) {
            int32_t p = s[i].prev, pr = pair_rank(t, s, p);
            if (pr != INT32_MAX) heap_push(h, &hn, (uint64_t)(uint32_t)pr << 32 | (uint32_t)p);
        }
    }
    return LT_OK;
}

/* One pre-token through the model: ignore_merges, cache, initial symbols, merges. */
static lt_status bpe_word(enc_state *st, const char *w, size_t n) {
    const lt_tokenizer *t = st->t;
    if (!n) return LT_OK;
    if (t->ignore_merges) {
        int32_t id = tk_lookup(&t->enc, w, n);
        if (id >= 0) return push_id(st, id);
    }
    uint32_t h = 0;
    if (n <= TK_CACHE_KEY) {
        h = (uint32_t)hash_bytes(w, n);
        int32_t ids[TK_CACHE_IDS];
        int k = cache_get(t, w, n, h, ids);
        if (k) {
            for (int i = 0; i < k; i++) LT_TRY(push_id(st, ids[i]));
            return LT_OK;
        }
    }
    size_t ns = 0;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[(uint8_t)w[i]];
            if (id < 0) id = t->unk_id;
            if (id < 0)
                return lt_error(st->ctx, LT_ERR_FORMAT, "byte 0x%02X has no token and the tokenizer has no unk token",
                                (uint8_t)w[i]);
            LT_TRY(sym_push(st, &ns, id));
        }
    } else {
        /* Characters; unknown ones fall back to <0xXX> bytes or to (fused) unk, as HF's BPE. */
        int32_t unk_pending = 0;
        for (size_t i = 0; i < n;) {
            size_t cl;
            utf8_decode((const uint8_t *)w + i, &cl);
            if (cl > n - i) cl = n - i;
            int32_t id = tk_lookup(&t->enc, w + i, cl);
            if (id >= 0) {
                if (unk_pending) { LT_TRY(sym_push(st, &ns, t->unk_id)); unk_pending = 0; }
                LT_TRY(sym_push(st, &ns, id));
                i += cl;
                continue;
            }
            if (t->byte_fallback) {
                int all = 1;
                for (size_t k = 0; k < cl; k++) all &= t->fallback_id[(uint8_t)w[i + k]] >= 0;
                if (all) {
                    if (unk_pending) { LT_TRY(sym_push(st, &ns, t->unk_id)); unk_pending = 0; }
                    for (size_t k = 0; k < cl; k++) LT_TRY(sym_push(st, &ns, t->fallback_id[(uint8_t)w[i + k]]));
                    i += cl;
                    continue;
                }
            }
            if (t->unk_id >= 0) {
                if (unk_pending && !t->fuse_unk) LT_TRY(sym_push(st, &ns, t->unk_id));
                unk_pending = 1;
            }
            /* Without an unk token HF drops the character. */
            i += cl;
        }
        if (unk_pending) LT_TRY(sym_push(st, &ns, t->unk_id));
        if (!ns) return LT_OK;
    }
    LT_TRY(bpe_merge(st, ns));
    int32_t out[TK_CACHE_IDS];
    int k = 0;
    for (int32_t i = 0; i >= 0; i = st->sym[i].next) {
        LT_TRY(push_id(st, st->sym[i].id));
        if (k <= TK_CACHE_IDS - 1) out[k] = st->sym[i].id;
        k++;
    }
    /* Cached results must not depend on unk fusing across words, which they do not. */
    if (n <= TK_CACHE_KEY && k <= TK_CACHE_IDS) cache_put(t, w, n, h, out, k);
    return LT_OK;
}

static lt_status pre_apply(enc_state *st, int level, const char *p, size_t n, int at_start);

/* Finds regex matches of `re` in p[0..n) and records spans covering all of it (gaps are
 * non-matches), as HF's Pattern::find_matches; empty matches are skipped. */
static lt_status find_spans(enc_state *st, int level, const pcre2_code *re, const char *p, size_t n, int invert,
                            size_t *count) {
    size_t k = 0, prev = 0, pos = 0;
    pcre2_match_data *md = st->md;
    while (pos <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)p, n, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return lt_error(st->ctx, LT_ERR_UNSUPPORTED, "pre-tokenizer regex failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* Empty match: advance one character. */
            if (ms >= n) break;
            size_t cl;
            utf8_decode((const uint8_t *)p + ms, &cl);
            pos = ms + cl;
            continue;
        }
        LT_TRY(grow(st->ctx, (void **)&st->spans[level], &st->spans_cap[level], sizeof(tk_span), k + 2, "pre-token spans"));
        if (ms > prev) st->spans[level][k++] = (tk_span){(uint32_t)prev, (uint32_t)ms, (uint8_t)invert};
        st->spans[level][k++] = (tk_span){(uint32_t)ms, (uint32_t)me, (uint8_t)!invert};
        prev = pos = me;
    }
    if (prev < n) {
        LT_TRY(grow(st->ctx, (void **)&st->spans[level], &st->spans_cap[level], sizeof(tk_span), k + 1, "pre-token spans"));
        st->spans[level][k++] = (tk_span){(uint32_t)prev, (uint32_t)n, (uint8_t)invert};
    }
    *count = k;
    return LT_OK;
}

/* Applies a split behaviour (HF SplitDelimiterBehavior) to the spans and sends each resulting
 * piece to the next stage. */
static lt_status split_and_send(enc_state *st, int level, int behavior, const char *p, size_t k, int at_start) {
    tk_span *sp = st->spans[level];
    size_t m = 0; /* compacted output spans */
    switch (behavior) {
    case TK_SPLIT_ISOLATED:
        m = k;
        break;
    case TK_SPLIT_REMOVED:
        for (size_t i = 0; i < k; i++)
            if (!sp[i].is_match) sp[m++] = sp[i];
        break;
    case TK_SPLIT_MERGED_PREV: {
        int prev_match = 0;
        for (size_t i = 0; i < k; i++) {
            tk_span s = sp[i];
            if (s.is_match && !prev_match && m) sp[m - 1].end = s.end;
            else sp[m++] = (tk_span){s.start, s.end, 0};
            prev_match = s.is_match;
        }
        break;
    }
    case TK_SPLIT_MERGED_NEXT: {
        /* Walk backwards: a match joins the following piece unless that piece is a match. */
        int prev_match = 0;
        size_t w = k; /* write from the end */
        for (size_t i = k; i-- > 0;) {
            tk_span s = sp[i];
            if (s.is_match && !prev_match && w < k) sp[w].start = s.start;
            else sp[--w] = (tk_span){s.start, s.end, 0};
            prev_match = s.is_match;
        }
        memmove(sp, sp + w, (k - w) * sizeof *sp);
        m = k - w;
        break;
    }
    case TK_SPLIT_CONTIGUOUS: {
        int prev_match = 0;
        for (size_t i = 0; i < k; i++) {
            tk_span s = sp[i];
            if (m && s.is_match == prev_match) sp[m - 1].end = s.end;
            else sp[m++] = s;
            prev_match = s.is_match;
        }
        break;
    }
    }
    for (size_t i = 0; i < m; i++) {
        tk_span s = st->spans[level][i]; /* re-read: deeper stages use other levels' arrays */
        if (s.end > s.start)
            LT_TRY(pre_apply(st, level + 1, p + s.start, s.end - s.start, at_start && s.start == 0));
    }
    return LT_OK;
}

static lt_status pre_apply(enc_state *st, int level, const char *p, size_t n, int at_start) {
    const lt_tokenizer *t = st->t;
    if (!n) return LT_OK;
    if (level == t->n_pres) return bpe_word(st, p, n);
    const tk_pre *pre = &t->pres[level];
    size_t k;
    switch (pre->kind) {
    case TK_PRE_SPLIT:
        LT_TRY(find_spans(st, level, pre->re, p, n, pre->invert, &k));
        return split_and_send(st, level, pre->behavior, p, k, at_start);
    case TK_PRE_BYTELEVEL:
        if (pre->add_prefix_space && p[0] != ' ') {
            LT_TRY(grow(st->ctx, (void **)&st->scratch[level], &st->scratch_cap[level], 1, n + 1, "pre-token scratch"));
            st->scratch[level][0] = ' ';
            memcpy(st->scratch[level] + 1, p, n);
            p = st->scratch[level];
            n++;
        }
        if (!pre->re) return pre_apply(st, level + 1, p, n, at_start);
        LT_TRY(find_spans(st, level, pre->re, p, n, 0, &k));
        return split_and_send(st, level, TK_SPLIT_ISOLATED, p, k, at_start);
    case TK_PRE_METASPACE: {
        /* Spaces become the replacement; prepend per scheme; optionally split before each. */
        size_t spaces = 0;
        for (size_t i = 0; i < n; i++) spaces += p[i] == ' ';
        size_t rl = (size_t)pre->rep_len, cap = n + spaces * rl + rl;
        LT_TRY(grow(st->ctx, (void **)&st->scratch[level], &st->scratch_cap[level], 1, cap, "pre-token scratch"));
        char *o = st->scratch[level];
        size_t on = 0;
        for (size_t i = 0; i < n; i++) {
            if (p[i] == ' ') { memcpy(o + on, pre->rep, rl); on += rl; }
            else o[on++] = p[i];
        }
        int starts = on >= rl && !memcmp(o, pre->rep, rl);
        if (!starts && (pre->prepend_scheme == TK_PREPEND_ALWAYS || (pre->prepend_scheme == TK_PREPEND_FIRST && at_start))) {
            memmove(o + rl, o, on);
            memcpy(o, pre->rep, rl);
            on += rl;
        }
        if (!pre->split) return pre_apply(st, level + 1, o, on, at_start);
        LT_TRY(find_spans(st, level, pre->re, o, on, 0, &k));
        return split_and_send(st, level, TK_SPLIT_MERGED_NEXT, o, k, at_start);
    }
    }
    return LT_OK;
}

/* Normalizers over one piece; the result is in *out (one of the state's buffers or the input). */
static lt_status normalize(enc_state *st, const char *p, size_t n, const char **out, size_t *out_n) {
    const lt_tokenizer *t = st->t;
    const char *cur = p;
    size_t cn = n;
    int which = 0; /* alternate between the two buffers */
    for (int i = 0; i < t->n_norms; i++) {
        const tk_norm *nm = &t->norms[i];
        char **buf = which ? &st->norm2 : &st->norm;
        size_t *bcap = which ? &st->norm2_cap : &st->norm_cap;
        if (nm->kind == TK_NORM_NFC) {
            if (tk_nfc_quick(cur, cn)) continue;
            size_t on;
            LT_TRY(tk_nfc(st->ctx, cur, cn, buf, &on, bcap));
            cur = *buf;
            cn = on;
        } else if (nm->kind == TK_NORM_PREPEND) {
            if (!cn) continue;
            LT_TRY(grow(st->ctx, (void **)buf, bcap, 1, cn + nm->alen, "normalizer buffer"));
            memcpy(*buf, nm->a, nm->alen);
            memcpy(*buf + nm->alen, cur, cn);
            cur = *buf;
            cn += nm->alen;
        } else { /* REPLACE (literal) */
            size_t cnt = 0;
            for (size_t j = 0; j + nm->alen <= cn;) {
                if (!memcmp(cur + j, nm->a, nm->alen)) { cnt++; j += nm->alen; }
                else j++;
            }
            if (!cnt) continue;
            size_t need = cn + cnt * nm->blen;
            LT_TRY(grow(st->ctx, (void **)buf, bcap, 1, need + 1, "normalizer buffer"));
            char *o = *buf;
            size_t on = 0;
            for (size_t j = 0; j < cn;) {
                if (j + nm->alen <= cn && !memcmp(cur + j, nm->a, nm->alen)) {
                    memcpy(o + on, nm->b, nm->blen);
                    on += nm->blen;
                    j += nm->alen;
                } else {
                    o[on++] = cur[j++];
                }
            }
            cur = o;
            cn = on;
        }
        which ^= 1;
    }
    *out = cur;
    *out_n = cn;
    return LT_OK;
}

static int is_ws(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_word(uint8_t c) { return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z'); }

/* Leftmost-longest match of an added token (of the given normalized-ness) in p[from..n). */
static int added_find(const lt_tokenizer *t, const char *p, size_t n, size_t from, int normalized, size_t *ms,
                      size_t *me, const tk_added **which) {
    for (size_t i = from; i < n; i++) {
        if (!t->added_first[(uint8_t)p[i]]) continue;
        const tk_added *best = NULL;
        for (size_t a = 0; a < t->n_added; a++) {
            const tk_added *ad = &t->added[a];
            if (ad->normalized != normalized || ad->len > n - i || (best && ad->len <= best->len)) continue;
            if (memcmp(p + i, t->blob + ad->off, ad->len)) continue;
            if (ad->single_word) {
                if (i > 0 && is_word((uint8_t)p[i - 1])) continue;
                if (i + ad->len < n && is_word((uint8_t)p[i + ad->len])) continue;
            }
            best = ad;
        }
        if (best) {
            *ms = i;
            *me = i + best->len;
            *which = best;
            return 1;
        }
    }
    return 0;
}

/* Splits p on added tokens of one kind; text pieces go to `stage` (1: normalize then phase 2;
 * 2: pre-tokenize). `orig` is the piece's offset in the original input (for Metaspace "first"). */
static lt_status text_stage(enc_state *st, int stage, const char *p, size_t n, int at_start);

static lt_status added_split(enc_state *st, int stage, int normalized, const char *p, size_t n, int at_start) {
    const lt_tokenizer *t = st->t;
    size_t pos = 0;
    for (;;) {
        size_t ms, me;
        const tk_added *ad;
        if (!t->n_added || !added_find(t, p, n, pos, normalized, &ms, &me, &ad)) break;
        size_t text_end = ms;
        if (ad->lstrip)
            while (text_end > pos && is_ws((uint8_t)p[text_end - 1])) text_end--;
        if (text_end > pos) LT_TRY(text_stage(st, stage, p + pos, text_end - pos, at_start && pos == 0));
        LT_TRY(push_id(st, ad->id));
        pos = me;
        if (ad->rstrip)
            while (pos < n && is_ws((uint8_t)p[pos])) pos++;
    }
    if (pos < n) LT_TRY(text_stage(st, stage, p + pos, n - pos, at_start && pos == 0));
    return LT_OK;
}

static lt_status text_stage(enc_state *st, int stage, const char *p, size_t n, int at_start) {
    if (stage == 1) {
        const char *q;
        size_t qn;
        LT_TRY(normalize(st, p, n, &q, &qn));
        if (st->t->any_normalized_added) {
            /* Phase 2 may re-enter normalize() for nothing else; copy out of its buffers. */
            char *copy = lt_alloc(st->ctx, LT_DEVICE_CPU, qn + 1, "normalized piece");
            if (!copy) return lt_ctx_status(st->ctx);
            memcpy(copy, q, qn);
            lt_status s = added_split(st, 2, 1, copy, qn, at_start);
            lt_free(st->ctx, LT_DEVICE_CPU, copy, qn + 1);
            return s;
        }
        return pre_apply(st, 0, q, qn, at_start);
    }
    return pre_apply(st, 0, p, n, at_start);
}

static void enc_release(enc_state *st) {
    for (int i = 0; i < TK_MAX_STAGES; i++) {
        release(st->ctx, st->scratch[i], st->scratch_cap[i]);
        release(st->ctx, st->spans[i], st->spans_cap[i] * sizeof(tk_span));
    }
    release(st->ctx, st->norm, st->norm_cap);
    release(st->ctx, st->norm2, st->norm2_cap);
    release(st->ctx, st->sym, st->sym_cap * sizeof *st->sym);
    release(st->ctx, st->rank, st->rank_cap * sizeof *st->rank);
    release(st->ctx, st->heap, st->heap_cap * sizeof *st->heap);
    if (st->md) pcre2_match_data_free(st->md);
}

lt_status lt_tokenizer_encode(lt_ctx *ctx, const lt_tokenizer *tok, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!tok || (!text && len)) return lt_error(ctx, LT_ERR_INVALID_ARG, "lt_tokenizer_encode: NULL argument");
    if (len > UINT32_MAX / 4) return lt_error(ctx, LT_ERR_INVALID_ARG, "text of %zu bytes is too long to encode at once", len);
    enc_state st;
    memset(&st, 0, sizeof st);
    st.ctx = ctx;
    st.t = tok;
    lt_status s = LT_OK;
    char *fixed = NULL;
    size_t fixed_cap = 0;
    st.md = pcre2_match_data_create(4, NULL);
    if (!st.md) {
        s = lt_error(ctx, LT_ERR_OOM, "PCRE2 match data");
        goto fail;
    }
    /* Invalid UTF-8 becomes U+FFFD per maximal ill-formed subpart, as Python's
     * bytes.decode('utf-8', 'replace') does before HF sees a str. */
    size_t valid = utf8_valid_prefix((const uint8_t *)text, len);
    const char *src = text;
    size_t n = len;
    if (valid < len) {
        size_t o = 0;
        s = grow(ctx, (void **)&fixed, &fixed_cap, 1, len * 3 + 1, "utf-8 repair buffer");
        if (s != LT_OK) goto fail;
        memcpy(fixed, text, valid);
        o = valid;
        for (size_t i = valid; i < len;) {
            size_t bad = 1, k = utf8_char((const uint8_t *)text + i, len - i, &bad);
            if (k) {
                memcpy(fixed + o, text + i, k);
                o += k;
                i += k;
            } else {
                o += (size_t)utf8_put(fixed + o, 0xFFFD);
                i += bad;
            }
        }
        src = fixed;
        n = o;
    }
    if (add_special)
        for (int i = 0; i < tok->n_post_prefix; i++)
            if ((s = push_id(&st, tok->post_prefix[i])) != LT_OK) goto fail;
    s = added_split(&st, 1, 0, src, n, 1);
    if (s != LT_OK) goto fail;
    if (add_special)
        for (int i = 0; i < tok->n_post_suffix; i++)
            if ((s = push_id(&st, tok->post_suffix[i])) != LT_OK) goto fail;
    enc_release(&st);
    release(ctx, fixed, fixed_cap);
    if (!st.ids) {
        st.ids = malloc(sizeof(int32_t));
        if (!st.ids) return lt_error(ctx, LT_ERR_OOM, "token id buffer");
    }
    *ids = st.ids;
    *n_ids = st.n;
    return LT_OK;
fail:
    enc_release(&st);
    release(ctx, fixed, fixed_cap);
    free(st.ids);
    return s;
}

/* ---- decode ------------------------------------------------------------------------------ */

/* A list of byte strings (offsets into one buffer), what HF's decoders pass along. */
typedef struct piece_list {
    char *buf;
    size_t len, cap;
    size_t *off; /* n+1 entries */
    size_t n, off_cap;
} piece_list;

static lt_status pl_add(lt_ctx *ctx, piece_list *pl, const char *s, size_t n) {
    LT_TRY(grow(ctx, (void **)&pl->buf, &pl->cap, 1, pl->len + n + 1, "decode buffer"));
    LT_TRY(grow(ctx, (void **)&pl->off, &pl->off_cap, sizeof *pl->off, pl->n + 2, "decode pieces"));
    if (!pl->n) pl->off[0] = 0;
    memcpy(pl->buf + pl->len, s, n);
    pl->len += n;
    pl->off[++pl->n] = pl->len;
    return LT_OK;
}

/* Appends to the last piece (creating one if none). */
static lt_status pl_append(lt_ctx *ctx, piece_list *pl, const char *s, size_t n) {
    if (!pl->n) return pl_add(ctx, pl, s, n);
    LT_TRY(grow(ctx, (void **)&pl->buf, &pl->cap, 1, pl->len + n + 1, "decode buffer"));
    memcpy(pl->buf + pl->len, s, n);
    pl->len += n;
    pl->off[pl->n] = pl->len;
    return LT_OK;
}

static void pl_free(lt_ctx *ctx, piece_list *pl) {
    release(ctx, pl->buf, pl->cap);
    release(ctx, pl->off, pl->off_cap * sizeof *pl->off);
    memset(pl, 0, sizeof *pl);
}

/* Appends s with invalid UTF-8 replaced by U+FFFD (Rust's from_utf8_lossy). */
static lt_status append_lossy(lt_ctx *ctx, piece_list *pl, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t v = i + utf8_valid_prefix((const uint8_t *)s + i, n - i);
        if (v > i) LT_TRY(pl_append(ctx, pl, s + i, v - i));
        if (v >= n) break;
        size_t bad = 1;
        utf8_char((const uint8_t *)s + v, n - v, &bad);
        LT_TRY(pl_append(ctx, pl, "\xEF\xBF\xBD", 3));
        i = v + bad;
    }
    if (!pl->n) LT_TRY(pl_add(ctx, pl, "", 0));
    return LT_OK;
}

static int is_byte_token(const char *s, size_t n, uint8_t *b) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return 0;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'f') ? (c | 32) - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return 1;
}

static lt_status decode_step(lt_ctx *ctx, const tk_dec *d, const piece_list *in, piece_list *out) {
    switch (d->kind) {
    case TK_DEC_BYTELEVEL: {
        /* All tokens to bytes (a token with a character outside the byte map stays as is), then
         * the concatenation is read as lossy UTF-8: one piece. */
        piece_list raw = {0};
        lt_status s = LT_OK;
        for (size_t i = 0; i < in->n && s == LT_OK; i++) {
            const char *p = in->buf + in->off[i];
            size_t n = in->off[i + 1] - in->off[i], j = 0, cl;
            char tmp[64];
            size_t tn = 0;
            int all = 1;
            /* Map in chunks through tmp. */
            size_t mark = raw.len;
            while (j < n) {
                uint32_t cp = utf8_decode((const uint8_t *)p + j, &cl);
                int b = cp_to_byte(cp);
                if (b < 0) { all = 0; break; }
                tmp[tn++] = (char)b;
                j += cl;
                if (tn == sizeof tmp) {
                    s = pl_append(ctx, &raw, tmp, tn);
                    tn = 0;
                    if (s != LT_OK) break;
                }
            }
            if (s != LT_OK) break;
            if (all) {
                if (tn) s = pl_append(ctx, &raw, tmp, tn);
            } else {
                raw.len = mark; /* drop the partial mapping */
                if (raw.n) raw.off[raw.n] = mark;
                s = pl_append(ctx, &raw, p, n);
            }
        }
        if (s == LT_OK) s = append_lossy(ctx, out, raw.buf ? raw.buf : "", raw.len);
        pl_free(ctx, &raw);
        return s;
    }
    case TK_DEC_BYTEFALLBACK: {
        /* Runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one U+FFFD
         * per byte (HF's ByteFallback). */
        piece_list acc = {0};
        lt_status s = LT_OK;
        for (size_t i = 0; i <= in->n && s == LT_OK; i++) {
            const char *p = i < in->n ? in->buf + in->off[i] : NULL;
            size_t n = i < in->n ? in->off[i + 1] - in->off[i] : 0;
            uint8_t b;
            if (p && is_byte_token(p, n, &b)) {
                char c = (char)b;
                s = pl_append(ctx, &acc, &c, 1);
                continue;
            }
            if (acc.len) {
                if (utf8_valid_prefix((const uint8_t *)acc.buf, acc.len) == acc.len) s = pl_add(ctx, out, acc.buf, acc.len);
                else
                    for (size_t k = 0; k < acc.len && s == LT_OK; k++) s = pl_add(ctx, out, "\xEF\xBF\xBD", 3);
                acc.len = 0;
                if (acc.n) acc.off[acc.n] = 0;
            }
            if (p && s == LT_OK) s = pl_add(ctx, out, p, n);
        }
        pl_free(ctx, &acc);
        return s;
    }
    case TK_DEC_FUSE:
        LT_TRY(pl_add(ctx, out, in->buf ? in->buf : "", in->len));
        return LT_OK;
    case TK_DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *p = in->buf + in->off[i];
            size_t n = in->off[i + 1] - in->off[i];
            LT_TRY(pl_add(ctx, out, "", 0));
            for (size_t j = 0; j < n;) {
                if (d->alen && j + d->alen <= n && !memcmp(p + j, d->a, d->alen)) {
                    LT_TRY(pl_append(ctx, out, d->b, d->blen));
                    j += d->alen;
                } else {
                    LT_TRY(pl_append(ctx, out, p + j, 1));
                    j++;
                }
            }
        }
        return LT_OK;
    case TK_DEC_STRIP:
        for (size_t i = 0; i < in->n; i++) {
            const char *p = in->buf + in->off[i];
            size_t n = in->off[i + 1] - in->off[i], a = 0, e = n;
            for (int k = 0; k < d->start && a + d->alen <= e && !memcmp(p + a, d->a, d->alen); k++) a += d->alen;
            for (int k = 0; k < d->stop && e >= a + d->alen && !memcmp(p + e - d->alen, d->a, d->alen); k++) e -= d->alen;
            LT_TRY(pl_add(ctx, out, p + a, e - a));
        }
        return LT_OK;
    case TK_DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            const char *p = in->buf + in->off[i];
            size_t n = in->off[i + 1] - in->off[i];
            LT_TRY(pl_add(ctx, out, "", 0));
            for (size_t j = 0; j < n;) {
                if (j + d->alen <= n && !memcmp(p + j, d->a, d->alen)) {
                    if (!(i == 0 && d->prepend_scheme != TK_PREPEND_NEVER)) LT_TRY(pl_append(ctx, out, " ", 1));
                    j += d->alen;
                } else {
                    LT_TRY(pl_append(ctx, out, p + j, 1));
                    j++;
                }
            }
        }
        return LT_OK;
    }
    return LT_OK;
}

lt_status lt_tokenizer_decode(lt_ctx *ctx, const lt_tokenizer *tok, const int32_t *ids, size_t n_ids, int skip_special,
                              char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    piece_list a = {0}, b = {0};
    lt_status s = LT_OK;
    for (size_t i = 0; i < n_ids; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->n_vocab || tok->tok_len[id] == UINT32_MAX) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "token id %d at position %zu is not in the vocabulary (size %d)", id, i,
                         tok->n_vocab);
            goto done;
        }
        if (skip_special && tok->tok_special[id]) continue;
        if ((s = pl_add(ctx, &a, tok->blob + tok->tok_off[id], tok->tok_len[id])) != LT_OK) goto done;
    }
    if (tok->has_decoder) {
        for (int k = 0; k < tok->n_decs; k++) {
            if ((s = decode_step(ctx, &tok->decs[k], &a, &b)) != LT_OK) goto done;
            pl_free(ctx, &a);
            a = b;
            memset(&b, 0, sizeof b);
        }
    }
    /* Join: nothing between pieces after a decoder, a space without one (HF). */
    size_t total = a.len + (tok->has_decoder || !a.n ? 0 : a.n - 1);
    char *o = malloc(total + 1);
    if (!o) {
        s = lt_error(ctx, LT_ERR_OOM, "decoded text of %zu bytes", total);
        goto done;
    }
    size_t w = 0;
    for (size_t i = 0; i < a.n; i++) {
        if (i && !tok->has_decoder) o[w++] = ' ';
        size_t pn = a.off[i + 1] - a.off[i];
        memcpy(o + w, a.buf + a.off[i], pn);
        w += pn;
    }
    o[w] = '\0';
    *text = o;
    *len = w;
done:
    pl_free(ctx, &a);
    pl_free(ctx, &b);
    return s;
}

/* ---- accessors --------------------------------------------------------------------------- */

int32_t lt_tokenizer_vocab_size(const lt_tokenizer *tok) { return tok->n_vocab; }
int32_t lt_tokenizer_bos(const lt_tokenizer *tok) { return tok->bos; }
int32_t lt_tokenizer_eos(const lt_tokenizer *tok) { return tok->eos; }
int32_t lt_tokenizer_pad(const lt_tokenizer *tok) { return tok->pad; }
int32_t lt_tokenizer_token_id(const lt_tokenizer *tok, const char *token) {
    return tk_lookup(&tok->by_string, token, strlen(token));
}
const char *lt_tokenizer_chat_template(const lt_tokenizer *tok) { return tok->chat_template; }
