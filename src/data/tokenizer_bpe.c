/* The BPE model of encode: one pre-token becomes ids through the shared word cache, its initial
 * symbols (raw bytes for byte-level vocabularies; characters with byte fallback or unk
 * otherwise) and rank-ordered merging (lowest rank first, leftmost on ties, as Hugging Face's
 * BPE). No pre-tokenisation or normalisation (tokenizer_encode.c). */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"

lt_status lt_tok_push_id(tk_enc *st, int32_t id) {
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

static lt_status sym_push(tk_enc *st, size_t *ns, int32_t id) {
    LT_TRY(tk_grow(st->ctx, (void **)&st->sym, &st->sym_cap, sizeof *st->sym, *ns + 1, "bpe symbols"));
    st->sym[*ns] = (tk_sym){id, (int32_t)*ns - 1, (int32_t)*ns + 1};
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

static inline const tk_merge *merge_find(const lt_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges_cap) return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = t->merges_cap - 1;
    for (size_t j = tk_merge_slot(key, mask);; j = (j + 1) & mask) {
        const tk_merge *m = &t->merges[j];
        if (m->key == key) return m;
        if (m->key == UINT64_MAX) return NULL;
    }
}

/* Rank of the merge of symbol i with its successor, INT32_MAX when there is none. */
static inline int32_t pair_rank(const lt_tokenizer *t, const tk_sym *s, int32_t i) {
    if (s[i].next < 0) return INT32_MAX;
    const tk_merge *m = merge_find(t, s[i].id, s[s[i].next].id);
    return m ? m->rank : INT32_MAX;
}

/* Merges symbol i with its successor (which the merge table holds a merge for). */
static inline void merge_at(const lt_tokenizer *t, tk_sym *s, int32_t i) {
    int32_t j = s[i].next;
    s[i].id = merge_find(t, s[i].id, s[j].id)->id;
    s[i].next = s[j].next;
    if (s[j].next >= 0) s[s[j].next].prev = i;
}

/* Short words: scan the pair ranks for the lowest (leftmost on ties) before each merge. */
static lt_status merge_by_scan(tk_enc *st, size_t ns) {
    const lt_tokenizer *t = st->t;
    tk_sym *s = st->sym;
    LT_TRY(tk_grow(st->ctx, (void **)&st->rank, &st->rank_cap, sizeof *st->rank, ns, "bpe ranks"));
    int32_t *r = st->rank;
    for (size_t i = 0; i < ns; i++) r[i] = pair_rank(t, s, (int32_t)i);
    for (;;) {
        int32_t best = INT32_MAX, bi = -1;
        for (int32_t i = 0; i >= 0; i = s[i].next)
            if (r[i] < best) {
                best = r[i];
                bi = i;
            }
        if (bi < 0) break;
        merge_at(t, s, bi);
        r[bi] = pair_rank(t, s, bi);
        if (s[bi].prev >= 0) r[s[bi].prev] = pair_rank(t, s, s[bi].prev);
    }
    return LT_OK;
}

/* Long words: a heap of (rank << 32 | position) with stale entries skipped, O(n log n). */
static lt_status merge_by_heap(tk_enc *st, size_t ns) {
    const lt_tokenizer *t = st->t;
    tk_sym *s = st->sym;
    LT_TRY(tk_grow(st->ctx, (void **)&st->heap, &st->heap_cap, sizeof *st->heap, 2 * ns + 4, "bpe heap"));
    LT_TRY(tk_grow(st->ctx, (void **)&st->rank, &st->rank_cap, sizeof *st->rank, ns, "bpe ranks"));
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
        alive[s[i].next] = 0;
        merge_at(t, s, i);
        /* At most two new pairs per merge, so 2*ns bounds the heap. */
        if (hn + 2 > st->heap_cap) {
            LT_TRY(tk_grow(st->ctx, (void **)&st->heap, &st->heap_cap, sizeof *st->heap, hn + 2, "bpe heap"));
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

/* Applies merges to the symbol list until none applies: lowest rank first, leftmost on ties.
 * Short words scan their pairs; long ones use a heap so adversarial inputs stay O(n log n). */
static lt_status bpe_merge(tk_enc *st, size_t ns) {
    st->sym[ns - 1].next = -1;
    if (ns < 2 || !st->t->n_merges) return LT_OK;
    return ns <= 48 ? merge_by_scan(st, ns) : merge_by_heap(st, ns);
}

/* Byte-level initial symbols: the token of each byte, else unk. */
static lt_status byte_symbols(tk_enc *st, const char *w, size_t n, size_t *ns) {
    const lt_tokenizer *t = st->t;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(uint8_t)w[i]];
        if (id < 0) id = t->unk_id;
        if (id < 0)
            return lt_error(st->ctx, LT_ERR_FORMAT, "byte 0x%02X has no token and the tokenizer has no unk token",
                            (uint8_t)w[i]);
        LT_TRY(sym_push(st, ns, id));
    }
    return LT_OK;
}

/* Character initial symbols; unknown ones fall back to <0xXX> bytes or to (fused) unk, as HF's
 * BPE. Without an unk token HF drops the character. */
static lt_status char_symbols(tk_enc *st, const char *w, size_t n, size_t *ns) {
    const lt_tokenizer *t = st->t;
    int32_t unk_pending = 0;
    for (size_t i = 0; i < n;) {
        size_t cl;
        tk_utf8_decode((const uint8_t *)w + i, &cl);
        if (cl > n - i) cl = n - i;
        int32_t id = tk_lookup(&t->enc, w + i, cl);
        int fallback = id < 0 && t->byte_fallback;
        for (size_t k = 0; fallback && k < cl; k++) fallback = t->fallback_id[(uint8_t)w[i + k]] >= 0;
        if (id >= 0 || fallback) {
            if (unk_pending) {
                LT_TRY(sym_push(st, ns, t->unk_id));
                unk_pending = 0;
            }
            if (id >= 0) LT_TRY(sym_push(st, ns, id));
            else
                for (size_t k = 0; k < cl; k++) LT_TRY(sym_push(st, ns, t->fallback_id[(uint8_t)w[i + k]]));
        } else if (t->unk_id >= 0) {
            if (unk_pending && !t->fuse_unk) LT_TRY(sym_push(st, ns, t->unk_id));
            unk_pending = 1;
        }
        i += cl;
    }
    if (unk_pending) LT_TRY(sym_push(st, ns, t->unk_id));
    return LT_OK;
}

static int all_newlines(const char *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (w[i] != '\n') return 0;
    return 1;
}

lt_status lt_tok_bpe_word(tk_enc *st, const char *w, size_t n) {
    const lt_tokenizer *t = st->t;
    if (!n) return LT_OK;
    if (t->ignore_merges || (t->newline_words && all_newlines(w, n))) {
        int32_t id = tk_lookup(&t->enc, w, n);
        if (id >= 0) return lt_tok_push_id(st, id);
    }
    uint32_t h = 0;
    if (n <= TK_CACHE_KEY) {
        h = (uint32_t)tk_hash(w, n);
        int32_t ids[TK_CACHE_IDS];
        int k = cache_get(t, w, n, h, ids);
        if (k) {
            for (int i = 0; i < k; i++) LT_TRY(lt_tok_push_id(st, ids[i]));
            return LT_OK;
        }
    }
    size_t ns = 0;
    LT_TRY(t->byte_level ? byte_symbols(st, w, n, &ns) : char_symbols(st, w, n, &ns));
    if (!ns) return LT_OK;
    LT_TRY(bpe_merge(st, ns));
    int32_t out[TK_CACHE_IDS];
    int k = 0;
    for (int32_t i = 0; i >= 0; i = st->sym[i].next) {
        LT_TRY(lt_tok_push_id(st, st->sym[i].id));
        if (k <= TK_CACHE_IDS - 1) out[k] = st->sym[i].id;
        k++;
    }
    /* Cached results must not depend on unk fusing across words, which they do not. */
    if (n <= TK_CACHE_KEY && k <= TK_CACHE_IDS) cache_put(t, w, n, h, out, k);
    return LT_OK;
}
