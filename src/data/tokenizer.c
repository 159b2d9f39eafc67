/* The tokenizer object: the tables every loader fills (token strings by id, the string maps, the
 * merge table, added tokens, the post-processor's ids), the step that readies them for encoding
 * (lt_tok_finish), freeing, and the accessors. Encoding lives in tokenizer_encode.c and
 * tokenizer_bpe.c, decoding in tokenizer_decode.c, loading in tokenizer_load.c (tokenizer.json)
 * and tokenizer_gguf.c (GGUF metadata). */
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "longtune/alloc.h"

const char *const lt_tok_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- small growable buffers through the accounting allocator ----------------------------- */

lt_status lt_tok_grow_slow(lt_ctx *ctx, void **p, size_t *cap, size_t elem, size_t need, const char *what) {
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

void lt_tok_release(lt_ctx *ctx, void *p, size_t bytes) {
    if (p) lt_free(ctx, LT_DEVICE_CPU, p, bytes);
}

/* ---- the string map ---------------------------------------------------------------------- */

static lt_status map_rehash(lt_ctx *ctx, tk_strmap *m, size_t cap) {
    uint32_t *slots = lt_calloc(ctx, LT_DEVICE_CPU, cap * sizeof *slots, "tokenizer hash slots");
    if (!slots) return lt_ctx_status(ctx);
    for (size_t k = 0; k < m->n; k++) {
        size_t i = m->keys[k].hash & (cap - 1);
        while (slots[i]) i = (i + 1) & (cap - 1);
        slots[i] = (uint32_t)(k + 1);
    }
    lt_tok_release(ctx, m->slots, m->cap * sizeof *m->slots);
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
    LT_TRY(tk_grow(ctx, (void **)&m->keys, &m->keys_cap, sizeof *m->keys, m->n + 1, "tokenizer keys"));
    LT_TRY(tk_grow(ctx, (void **)&m->blob, &m->blob_cap, 1, m->blob_len + len + 1, "tokenizer strings"));
    memcpy(m->blob + m->blob_len, s, len);
    uint32_t h = (uint32_t)tk_hash(s, len);
    m->keys[m->n] = (struct tk_strkey){(uint32_t)m->blob_len, (uint32_t)len, val, h};
    m->blob_len += len;
    size_t i = h & (m->cap - 1);
    while (m->slots[i]) i = (i + 1) & (m->cap - 1);
    m->slots[i] = (uint32_t)(m->n + 1);
    m->n++;
    return LT_OK;
}

static void map_free(lt_ctx *ctx, tk_strmap *m) {
    lt_tok_release(ctx, m->slots, m->cap * sizeof *m->slots);
    lt_tok_release(ctx, m->keys, m->keys_cap * sizeof *m->keys);
    lt_tok_release(ctx, m->blob, m->blob_cap);
    memset(m, 0, sizeof *m);
}

/* ---- construction ------------------------------------------------------------------------ */

lt_status lt_tok_new(lt_ctx *ctx, lt_tokenizer **out) {
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

char *lt_tok_strdup(lt_tokenizer *t, const char *s, size_t len) {
    char *p = lt_alloc(t->ctx, LT_DEVICE_CPU, len + 1, "tokenizer string");
    if (!p) return NULL;
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

/* Capacity of a table grown by doubling from `first` that holds n entries (0 when n is 0). */
static size_t pow2_cap(size_t n, size_t first) {
    if (!n) return 0;
    size_t cap = first;
    while (cap < n) cap *= 2;
    return cap;
}

/* tok_off, tok_len and tok_special hold n_vocab entries in a capacity of pow2_cap(n_vocab, 1024). */
static size_t tok_cap(const lt_tokenizer *t) { return pow2_cap((size_t)t->n_vocab, 1024); }

/* Grows the id tables to hold ids up to `id`; new ids have no token. */
static lt_status grow_ids(lt_tokenizer *t, int32_t id) {
    lt_ctx *ctx = t->ctx;
    size_t n = (size_t)t->n_vocab, old_cap = tok_cap(t), cap = pow2_cap((size_t)id + 1, 1024);
    if (cap > old_cap) {
        uint32_t *no = lt_alloc(ctx, LT_DEVICE_CPU, cap * 4, "token offsets");
        uint32_t *nl = lt_alloc(ctx, LT_DEVICE_CPU, cap * 4, "token lengths");
        uint8_t *ns = lt_calloc(ctx, LT_DEVICE_CPU, cap, "token flags");
        if (!no || !nl || !ns) {
            lt_tok_release(ctx, no, cap * 4);
            lt_tok_release(ctx, nl, cap * 4);
            lt_tok_release(ctx, ns, cap);
            return lt_ctx_status(ctx);
        }
        if (n) {
            memcpy(no, t->tok_off, n * 4);
            memcpy(nl, t->tok_len, n * 4);
            memcpy(ns, t->tok_special, n);
        }
        lt_tok_release(ctx, t->tok_off, old_cap * 4);
        lt_tok_release(ctx, t->tok_len, old_cap * 4);
        lt_tok_release(ctx, t->tok_special, old_cap);
        t->tok_off = no;
        t->tok_len = nl;
        t->tok_special = ns;
    }
    for (size_t i = n; i <= (size_t)id; i++) t->tok_len[i] = UINT32_MAX;
    t->n_vocab = id + 1;
    return LT_OK;
}

lt_status lt_tok_set_token(lt_tokenizer *t, int32_t id, const char *s, size_t len) {
    lt_ctx *ctx = t->ctx;
    if (id < 0) return lt_error(ctx, LT_ERR_FORMAT, "negative token id %d", id);
    if (id >= t->n_vocab) LT_TRY(grow_ids(t, id));
    if (t->tok_len[id] != UINT32_MAX) {
        /* Same id twice: keep the first unless strings agree (added tokens repeat vocab entries). */
        if (t->tok_len[id] == len && !memcmp(t->blob + t->tok_off[id], s, len)) return LT_OK;
        return lt_error(ctx, LT_ERR_FORMAT, "token id %d is given to two different strings", id);
    }
    if (t->blob_len + len > UINT32_MAX) return lt_error(ctx, LT_ERR_FORMAT, "tokenizer strings exceed 4 GiB");
    LT_TRY(tk_grow(ctx, (void **)&t->blob, &t->blob_cap, 1, t->blob_len + len + 1, "token strings"));
    memcpy(t->blob + t->blob_len, s, len);
    t->tok_off[id] = (uint32_t)t->blob_len;
    t->tok_len[id] = (uint32_t)len;
    t->blob_len += len;
    return map_put(ctx, &t->by_string, s, len, id, NULL);
}

/* The added-token array holds n_added entries in a capacity of added_cap(n_added). */
static size_t added_cap(size_t n) { return pow2_cap(n, 16); }

lt_status lt_tok_add_added(lt_tokenizer *t, int32_t id, const char *s, size_t len, int special, int lstrip, int rstrip,
                           int single_word, int normalized) {
    if (len == 0) return lt_error(t->ctx, LT_ERR_FORMAT, "added token %d has empty content", id);
    LT_TRY(lt_tok_set_token(t, id, s, len));
    size_t have = added_cap(t->n_added);
    if (t->n_added + 1 > have) {
        size_t nc = have ? have * 2 : 16;
        tk_added *na = lt_alloc(t->ctx, LT_DEVICE_CPU, nc * sizeof *na, "added tokens");
        if (!na) return lt_ctx_status(t->ctx);
        if (t->n_added) memcpy(na, t->added, t->n_added * sizeof *na);
        lt_tok_release(t->ctx, t->added, have * sizeof *na);
        t->added = na;
    }
    tk_added *a = &t->added[t->n_added++];
    a->id = id;
    a->off = t->tok_off[id];
    a->len = (uint32_t)len;
    a->special = (uint8_t) !!special;
    a->lstrip = (uint8_t) !!lstrip;
    a->rstrip = (uint8_t) !!rstrip;
    a->single_word = (uint8_t) !!single_word;
    a->normalized = (uint8_t) !!normalized;
    if (special) t->tok_special[id] = 1;
    t->added_first[(uint8_t)s[0]] = 1;
    if (normalized) t->any_normalized_added = 1;
    return LT_OK;
}

lt_status lt_tok_add_merge(lt_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged) {
    if ((t->n_merges + 1) * 2 > t->merges_cap) {
        size_t nc = t->merges_cap ? t->merges_cap * 2 : 4096;
        tk_merge *nm = lt_alloc(t->ctx, LT_DEVICE_CPU, nc * sizeof *nm, "merge table");
        if (!nm) return lt_ctx_status(t->ctx);
        for (size_t i = 0; i < nc; i++) nm[i].key = UINT64_MAX;
        for (size_t i = 0; i < t->merges_cap; i++) {
            if (t->merges[i].key == UINT64_MAX) continue;
            size_t j = tk_merge_slot(t->merges[i].key, nc - 1);
            while (nm[j].key != UINT64_MAX) j = (j + 1) & (nc - 1);
            nm[j] = t->merges[i];
        }
        lt_tok_release(t->ctx, t->merges, t->merges_cap * sizeof *nm);
        t->merges = nm;
        t->merges_cap = nc;
    }
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t j = tk_merge_slot(key, t->merges_cap - 1);
    while (t->merges[j].key != UINT64_MAX) {
        if (t->merges[j].key == key) return LT_OK; /* a repeated merge keeps its first (best) rank */
        j = (j + 1) & (t->merges_cap - 1);
    }
    t->merges[j] = (tk_merge){key, rank, merged};
    t->n_merges++;
    return LT_OK;
}

lt_status lt_tok_add_merge_str(lt_tokenizer *t, const char *a, size_t al, const char *b, size_t bl, int32_t rank,
                               int *missing) {
    int32_t ia = tk_lookup(&t->by_string, a, al), ib = tk_lookup(&t->by_string, b, bl);
    char stackbuf[256];
    char *cat = al + bl <= sizeof stackbuf ? stackbuf : lt_alloc(t->ctx, LT_DEVICE_CPU, al + bl, "merge scratch");
    if (!cat) return lt_ctx_status(t->ctx);
    memcpy(cat, a, al);
    memcpy(cat + al, b, bl);
    int32_t ic = tk_lookup(&t->by_string, cat, al + bl);
    if (cat != stackbuf) lt_free(t->ctx, LT_DEVICE_CPU, cat, al + bl);
    *missing = ia < 0 || ib < 0 || ic < 0;
    return *missing ? LT_OK : lt_tok_add_merge(t, ia, ib, rank, ic);
}

lt_status lt_tok_compile(lt_tokenizer *t, const char *pattern, size_t len, int literal, pcre2_code **out) {
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

/* Replaces *dst (*dn ids) with a copy of src (n ids). */
static lt_status set_ids(lt_tokenizer *t, int32_t **dst, int *dn, const int32_t *src, int n) {
    lt_tok_release(t->ctx, *dst, (size_t)*dn * 4);
    *dst = NULL;
    *dn = 0;
    if (!n) return LT_OK;
    *dst = lt_alloc(t->ctx, LT_DEVICE_CPU, (size_t)n * 4, "post-processor ids");
    if (!*dst) return lt_ctx_status(t->ctx);
    memcpy(*dst, src, (size_t)n * 4);
    *dn = n;
    return LT_OK;
}

lt_status lt_tok_set_post(lt_tokenizer *t, const int32_t *prefix, int np, const int32_t *suffix, int ns) {
    LT_TRY(set_ids(t, &t->post_prefix, &t->n_post_prefix, prefix, np));
    return set_ids(t, &t->post_suffix, &t->n_post_suffix, suffix, ns);
}

/* Byte-level spelling s (len bytes, e.g. "Ġthe") back to raw bytes in out (room for len);
 * returns the length, or -1 for a token byte-level input can never produce (a character outside
 * the byte map, e.g. unmapped added text). */
static ptrdiff_t unmap_bytes(const char *s, size_t len, char *out) {
    size_t o = 0, i = 0;
    while (i < len) {
        size_t bad = 1, k = lt_tok_utf8_char((const uint8_t *)s + i, len - i, &bad);
        if (!k) return -1;
        size_t cl;
        int b = lt_tok_cp_to_byte(tk_utf8_decode((const uint8_t *)s + i, &cl));
        if (b < 0) return -1;
        out[o++] = (char)b;
        i += k;
    }
    return (ptrdiff_t)o;
}

/* The map BPE consults: byte-level vocabularies are stored mapped (e.g. "Ġthe"); encode works on
 * raw bytes, so each entry is translated back once here, and single bytes fill byte_id. */
static lt_status build_enc_map(lt_tokenizer *t) {
    lt_ctx *ctx = t->ctx;
    char *tmp = NULL;
    size_t tmp_cap = 0;
    lt_status st = LT_OK;
    for (int32_t id = 0; id < t->n_vocab && st == LT_OK; id++) {
        uint32_t len = t->tok_len[id];
        if (len == UINT32_MAX) continue;
        const char *s = t->blob + t->tok_off[id];
        if (!t->byte_level) {
            st = map_put(ctx, &t->enc, s, len, id, NULL);
            continue;
        }
        if ((st = tk_grow(ctx, (void **)&tmp, &tmp_cap, 1, len + 1, "tokenizer scratch")) != LT_OK) break;
        ptrdiff_t o = unmap_bytes(s, len, tmp);
        if (o < 0) continue;
        st = map_put(ctx, &t->enc, tmp, (size_t)o, id, NULL);
        if (o == 1 && t->byte_id[(uint8_t)tmp[0]] < 0) t->byte_id[(uint8_t)tmp[0]] = id;
    }
    lt_tok_release(ctx, tmp, tmp_cap);
    return st;
}

lt_status lt_tok_finish(lt_tokenizer *t) {
    lt_ctx *ctx = t->ctx;
    lt_tok_byte_map_init();
    if (t->n_pres && t->pres[t->n_pres - 1].kind == TK_PRE_BYTELEVEL) t->byte_level = 1;
    for (int i = 0; i < t->n_pres - 1; i++)
        if (t->pres[i].kind == TK_PRE_BYTELEVEL)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "a ByteLevel pre-tokenizer must come last in the sequence");
    LT_TRY(build_enc_map(t));
    if (t->byte_fallback) {
        static const char hex[] = "0123456789ABCDEF";
        for (int b = 0; b < 256; b++) {
            const char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
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
    lt_tok_release(ctx, t->tok_off, cap * 4);
    lt_tok_release(ctx, t->tok_len, cap * 4);
    lt_tok_release(ctx, t->tok_special, cap);
    lt_tok_release(ctx, t->blob, t->blob_cap);
    map_free(ctx, &t->by_string);
    map_free(ctx, &t->enc);
    lt_tok_release(ctx, t->merges, t->merges_cap * sizeof *t->merges);
    lt_tok_release(ctx, t->added, added_cap(t->n_added) * sizeof *t->added);
    for (int i = 0; i < t->n_norms; i++) {
        if (t->norms[i].a) lt_tok_release(ctx, t->norms[i].a, t->norms[i].alen + 1);
        if (t->norms[i].b) lt_tok_release(ctx, t->norms[i].b, t->norms[i].blen + 1);
    }
    for (int i = 0; i < t->n_pres; i++)
        if (t->pres[i].re) pcre2_code_free(t->pres[i].re);
    for (int i = 0; i < t->n_decs; i++) {
        if (t->decs[i].a) lt_tok_release(ctx, t->decs[i].a, t->decs[i].alen + 1);
        if (t->decs[i].b) lt_tok_release(ctx, t->decs[i].b, t->decs[i].blen + 1);
    }
    lt_tok_release(ctx, t->post_prefix, (size_t)t->n_post_prefix * 4);
    lt_tok_release(ctx, t->post_suffix, (size_t)t->n_post_suffix * 4);
    if (t->chat_template) lt_tok_release(ctx, t->chat_template, t->chat_template_len + 1);
    if (t->cache_ready)
        for (int i = 0; i < TK_CACHE_SHARDS; i++) pthread_mutex_destroy(&t->cache_lock[i]);
    lt_tok_release(ctx, t->cache, (size_t)TK_CACHE_SLOTS * sizeof *t->cache);
    lt_free(ctx, LT_DEVICE_CPU, t, sizeof *t);
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
