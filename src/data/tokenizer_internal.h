/* Private layout of lt_tokenizer, shared by the tokenizer's files: the pipeline stages (added
 * tokens, normalizers, pre-tokenizers, BPE model, post-processor, decoders) as plain tables the
 * loaders fill (tokenizer_load.c from tokenizer.json, tokenizer_gguf.c from GGUF metadata) and
 * the encoder/decoder (tokenizer.c) runs. Not a public API. */
#ifndef LT_DATA_TOKENIZER_INTERNAL_H
#define LT_DATA_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdint.h>

#include "longtune/tokenizer.h"

/* A hash map from byte strings (stored in the owner's blob) to int32 values. */
typedef struct tk_strmap {
    uint32_t *slots; /* index+1 into keys, 0 = empty */
    size_t cap;      /* power of two */
    struct tk_strkey { uint32_t off, len; int32_t val; uint32_t hash; } *keys;
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
    int prepend_scheme;   /* METASPACE */
    int split;            /* METASPACE */
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
    int start, stop;      /* STRIP */
    int prepend_scheme;   /* METASPACE */
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
    lt_ctx *ctx; /* the loading context: frees go through it */
    int32_t n_vocab;      /* max id + 1 over model and added tokens */
    /* Token strings by id as the tokenizer file spells them (byte-level: the mapped form). */
    char *blob;
    size_t blob_len, blob_cap;
    uint32_t *tok_off, *tok_len; /* [n_vocab]; len UINT32_MAX = no token with this id */
    uint8_t *tok_special;        /* [n_vocab] */
    tk_strmap by_string;         /* token string -> id (model vocab and added tokens) */
    tk_strmap enc;               /* what BPE looks up: raw bytes (byte-level) or the string */
    tk_merge *merges;
    size_t merges_cap;           /* power of two */
    size_t n_merges;
    int byte_level;              /* the last pre-tokenizer is ByteLevel: BPE runs on raw bytes */
    int32_t byte_id[256];        /* byte-level: id of each byte's token; -1 if absent */
    int32_t fallback_id[256];    /* byte_fallback: id of "<0xXX>"; -1 if absent */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    tk_added *added;
    size_t n_added;
    uint8_t added_first[256];    /* bitmap-ish: 1 if some added token starts with this byte */
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

/* ---- shared helpers (tokenizer.c) ---- */
lt_status tk_new(lt_ctx *ctx, lt_tokenizer **out);
/* Registers token `s` with `id` (grows the id tables). Duplicate strings keep the first id. */
lt_status tk_set_token(lt_tokenizer *t, int32_t id, const char *s, size_t len);
lt_status tk_add_added(lt_tokenizer *t, int32_t id, const char *s, size_t len, int special, int lstrip,
                       int rstrip, int single_word, int normalized);
lt_status tk_add_merge(lt_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t merged);
/* Compiles a pre-tokenizer regex (PCRE2_UTF|PCRE2_UCP, JIT); `literal` for String patterns. */
lt_status tk_compile(lt_tokenizer *t, const char *pattern, size_t len, int literal, pcre2_code **out);
/* After vocab, merges and pre-tokenizers are set: builds enc map, byte tables, cache. */
lt_status tk_finish(lt_tokenizer *t);
int32_t tk_lookup(const tk_strmap *m, const char *s, size_t len);
char *tk_strdup(lt_tokenizer *t, const char *s, size_t len);
lt_status tk_set_post(lt_tokenizer *t, const int32_t *prefix, int np, const int32_t *suffix, int ns);

extern const char *const tk_gpt2_pattern;
/* NFC normalisation of valid UTF-8 (tokenizer_nfc.c). Writes into *out (lt_alloc'd, *cap grows). */
lt_status tk_nfc(lt_ctx *ctx, const char *s, size_t len, char **out, size_t *out_len, size_t *cap);
int tk_nfc_quick(const char *s, size_t len); /* 1 when s is certainly NFC already */

#endif
