/* Private layout of lt_tokenizer, shared by the tokenizer's files: the pipeline stages (added
 * tokens, normalizers, pre-tokenizers, BPE model, post-processor, decoders) as plain tables the
 * loaders fill (tokenizer_load.c from tokenizer.json, tokenizer_gguf.c from GGUF metadata), the
 * object and its tables (tokenizer.c), UTF-8 helpers (tokenizer_utf8.c), the state of one encode
 * call shared by the pipeline (tokenizer_encode.c) and the BPE model (tokenizer_bpe.c), and the
 * decoder chain (tokenizer_decode.c). Not a public API. */
#ifndef LT_DATA_TOKENIZER_INTERNAL_H
#define LT_DATA_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "longtune/tokenizer.h"

/* A hash map from byte strings (stored in the owner's blob) to int32 values. */
typedef struct tk_strmap {
    uint32_t *slots; /* index+1 into keys, 0 = empty */
    size_t cap;      /* power of two */
    struct tk_strkey {
        uint32_t off, len;
        int32_t val;
        uint32_t hash;
    } * keys;
    size_t n, keys_cap;
    char *blob;
    size_t blob_len, blob_cap;
} tk_strmap;

/* Merge table: (left id, right id) -> (rank, merged id). */
typedef struct tk_merge {
    uint64_t key; /* (uint64)left << 32 | right; UINT64_MAX = empty */
    int32_t rank, id;
} tk_merge;

enum { TK_SPLIT_ISOLATED, TK_SPLIT_REMOVED, TK_SPLIT_MERGED_PREV, TK_SPLIT_MERGED_NEXT, TK_SPLIT_CONTIGUOUS };
enum { TK_PRE_SPLIT, TK_PRE_BYTELEVEL, TK_PRE_METASPACE };
enum { TK_PREPEND_ALWAYS, TK_PREPEND_FIRST, TK_PREPEND_NEVER };

typedef struct tk_pre {
    int kind;
    pcre2_code *re; /* SPLIT; BYTELEVEL with use_regex (the GPT-2 pattern); NULL otherwise */
    int behavior;   /* TK_SPLIT_* */
    int invert;
    int add_prefix_space; /* BYTELEVEL */
    char rep[8];          /* METASPACE replacement (UTF-8) */
    int rep_len;
    int prepend_scheme; /* METASPACE */
    int split;          /* METASPACE */
} tk_pre;

enum { TK_NORM_NFC, TK_NORM_PREPEND, TK_NORM_REPLACE };
typedef struct tk_norm {
    int kind;
    char *a, *b; /* PREPEND: a; REPLACE: a -> b (literal) */
    size_t alen, blen;
} tk_norm;

enum { TK_DEC_BYTELEVEL, TK_DEC_METASPACE, TK_DEC_REPLACE, TK_DEC_BYTEFALLBACK, TK_DEC_FUSE, TK_DEC_STRIP };
typedef struct tk_dec {
    int kind;
    char *a, *b; /* REPLACE: a -> b; STRIP: a = the character */
    size_t alen, blen;
    int start, stop;    /* STRIP */
    int prepend_scheme; /* METASPACE */
} tk_dec;

typedef struct tk_added {
    int32_t id;
    uint32_t off, len; /* content in the tokenizer's blob */
    uint8_t special, lstrip, rstrip, single_word, normalized;
} tk_added;

/* Word cache: direct-mapped slots under sharded locks, filled by encode (which may run on several
 * threads at once over one tokenizer). Words longer than TK_CACHE_KEY bytes or with more than
 * TK_CACHE_IDS tokens are not cached. */
#define TK_CACHE_KEY 30
#define TK_CACHE_IDS 7
#define TK_CACHE_SLOTS 16384
#define TK_CACHE_SHARDS 64
typedef struct tk_cache_slot { /* 64 bytes: one cache line (the array is 64-byte aligned) */
    uint32_t hash;
    uint8_t klen, nids; /* klen 0 = empty */
    char key[TK_CACHE_KEY];
    int32_t ids[TK_CACHE_IDS];
} tk_cache_slot;
_Static_assert(sizeof(tk_cache_slot) == 64, "a cache slot fills one cache line");

#define TK_MAX_STAGES 8

struct lt_tokenizer {
    lt_ctx *ctx;     /* the loading context: frees go through it */
    int32_t n_vocab; /* max id + 1 over model and added tokens */
    /* Token strings by id as the tokenizer file spells them (byte-level: the mapped form). */
    char *blob;
    size_t blob_len, blob_cap;
    uint32_t *tok_off, *tok_len; /* [n_vocab]; len UINT32_MAX = no token with this id */
    uint8_t *tok_special;        /* [n_vocab] */
    tk_strmap by_string;         /* token string -> id (model vocab and added tokens) */
    tk_strmap enc;               /* what BPE looks up: raw bytes (byte-level) or the string */
    tk_merge *merges;
    size_t merges_cap; /* power of two */
    size_t n_merges;
    int byte_level;           /* the last pre-tokenizer is ByteLevel: BPE runs on raw bytes */
    int32_t byte_id[256];     /* byte-level: id of each byte's token; -1 if absent */
    int32_t fallback_id[256]; /* byte_fallback: id of "<0xXX>"; -1 if absent */
    int byte_fallback, fuse_unk, ignore_merges;
    int newline_words; /* a word of only newlines that is one token is taken whole (Gemma 4) */
    int32_t unk_id;
    tk_added *added;
    size_t n_added;
    uint8_t added_first[256]; /* bitmap-ish: 1 if some added token starts with this byte */
    int any_normalized_added;
    tk_norm norms[TK_MAX_STAGES];
    int n_norms;
    tk_pre pres[TK_MAX_STAGES];
    int n_pres;
    tk_dec decs[TK_MAX_STAGES];
    int n_decs;
    int has_decoder;
    int32_t *post_prefix, *post_suffix; /* ids added by add_special */
    int n_post_prefix, n_post_suffix;
    int32_t bos, eos, pad;
    char *chat_template;
    size_t chat_template_len;
    pcre2_general_context *gctx;
    tk_cache_slot *cache;
    pthread_mutex_t cache_lock[TK_CACHE_SHARDS];
    int cache_ready;
};

/* ---- the object and its tables (tokenizer.c) ---- */
lt_status lt_tok_new(lt_ctx *ctx, lt_tokenizer **out);
/* Registers token `s` with `id` (grows the id tables). Duplicate strings keep the first id. */
lt_status lt_tok_set_token(lt_tokenizer *t, int32_t id, const char *s, size_t len);
lt_status lt_tok_add_added(lt_tokenizer *t, int32_t id, const char *s, size_t len, int special, int lstrip, int rstrip,
                           int single_word, int normalized);
lt_status lt_tok_add_merge(lt_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* The merge of tokens a and b (by string) into the token a+b, at `rank`; *missing is set (and
 * nothing added) when one of the three is not in the vocabulary. Errors: LT_ERR_OOM. */
lt_status lt_tok_add_merge_str(lt_tokenizer *t, const char *a, size_t al, const char *b, size_t bl, int32_t rank,
                               int *missing);
/* Compiles a pre-tokenizer regex (PCRE2_UTF|PCRE2_UCP, JIT); `literal` for String patterns. */
lt_status lt_tok_compile(lt_tokenizer *t, const char *pattern, size_t len, int literal, pcre2_code **out);
/* After vocab, merges and pre-tokenizers are set: builds enc map, byte tables, cache. */
lt_status lt_tok_finish(lt_tokenizer *t);
char *lt_tok_strdup(lt_tokenizer *t, const char *s, size_t len);
lt_status lt_tok_set_post(lt_tokenizer *t, const int32_t *prefix, int np, const int32_t *suffix, int ns);

/* Grows the buffer *p of *cap elements of `elem` bytes to hold `need` (doubling from 16, contents
 * kept) through the accounting allocator. Errors: LT_ERR_OOM naming `what`. Inline for the common
 * case of enough room: encode calls it once per BPE symbol. */
lt_status lt_tok_grow_slow(lt_ctx *ctx, void **p, size_t *cap, size_t elem, size_t need, const char *what);
static inline lt_status tk_grow(lt_ctx *ctx, void **p, size_t *cap, size_t elem, size_t need, const char *what) {
    return need <= *cap ? LT_OK : lt_tok_grow_slow(ctx, p, cap, elem, need, what);
}
/* Frees p (bytes long) when it is not NULL. */
void lt_tok_release(lt_ctx *ctx, void *p, size_t bytes);

/* The hash of the string map and the word cache. */
static inline uint64_t tk_hash(const char *s, size_t n) {
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

/* The value of s in m, -1 if absent. */
static inline int32_t tk_lookup(const tk_strmap *m, const char *s, size_t len) {
    if (!m->cap) return -1;
    uint32_t h = (uint32_t)tk_hash(s, len);
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t e = m->slots[i];
        if (!e) return -1;
        const struct tk_strkey *k = &m->keys[e - 1];
        if (k->hash == h && k->len == len && !memcmp(m->blob + k->off, s, len)) return k->val;
    }
}

/* First probe of a merge key in a table of mask + 1 slots. */
static inline size_t tk_merge_slot(uint64_t key, size_t mask) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & mask;
}

/* ---- UTF-8 and GPT-2's byte map (tokenizer_utf8.c) ---- */
/* Builds the byte map once per process (thread-safe); lt_tok_finish calls it before any use. */
void lt_tok_byte_map_init(void);
/* The byte a byte-level character stands for, -1 for a character outside the map. */
int lt_tok_cp_to_byte(uint32_t cp);
/* Writes code point cp as UTF-8 into o (room for 4 bytes); returns the length. */
int lt_tok_utf8_put(char *o, uint32_t cp);
/* Length of the well-formed UTF-8 character at s[0..n) (Unicode table 3-7), or 0 with *bad set to
 * the length of its maximal ill-formed subpart (>= 1): the unit one U+FFFD replaces. */
size_t lt_tok_utf8_char(const uint8_t *s, size_t n, size_t *bad);
/* The number of bytes of s that are valid UTF-8 from the start. */
size_t lt_tok_utf8_valid_prefix(const uint8_t *s, size_t n);
/* The code point at s and its length in *len, as many bytes as the lead byte announces: s must
 * hold them (encode repairs its input to valid UTF-8 first). */
static inline uint32_t tk_utf8_decode(const uint8_t *s, size_t *len) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    if (c < 0xE0) {
        *len = 2;
        return (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F);
    }
    if (c < 0xF0) {
        *len = 3;
        return (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    }
    *len = 4;
    return (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

/* ---- one encode call ---- */
typedef struct tk_span {
    uint32_t start, end;
    uint8_t is_match;
} tk_span;

typedef struct tk_sym {
    int32_t id, prev, next;
} tk_sym;

/* Scratch of one lt_tokenizer_encode call, so concurrent calls on one tokenizer share nothing but
 * the word cache. Buffers go through the accounting allocator except ids. */
typedef struct tk_enc {
    lt_ctx *ctx;
    const lt_tokenizer *t;
    int32_t *ids; /* malloc'd: the caller owns the result */
    size_t n, cap;
    pcre2_match_data *md;
    char *scratch[TK_MAX_STAGES]; /* per pre-tokenizer level */
    size_t scratch_cap[TK_MAX_STAGES];
    tk_span *spans[TK_MAX_STAGES];
    size_t spans_cap[TK_MAX_STAGES];
    char *norm;
    size_t norm_cap;
    char *norm2;
    size_t norm2_cap;
    tk_sym *sym;
    size_t sym_cap;
    int32_t *rank;
    size_t rank_cap;
    uint64_t *heap;
    size_t heap_cap;
} tk_enc;

/* Appends one id to the result (tokenizer_bpe.c). Errors: LT_ERR_OOM. */
lt_status lt_tok_push_id(tk_enc *st, int32_t id);
/* One pre-token through the BPE model (word cache, initial symbols, merges): its ids are appended
 * to the result (tokenizer_bpe.c). Errors: LT_ERR_OOM, LT_ERR_FORMAT (a byte without a token). */
lt_status lt_tok_bpe_word(tk_enc *st, const char *w, size_t n);

extern const char *const lt_tok_gpt2_pattern;
/* NFC normalisation of valid UTF-8 (tokenizer_nfc.c). Writes into *out (lt_alloc'd, *cap grows). */
lt_status lt_tok_nfc(lt_ctx *ctx, const char *s, size_t len, char **out, size_t *out_len, size_t *cap);
int lt_tok_nfc_quick(const char *s, size_t len); /* 1 when s is certainly NFC already */

#endif
