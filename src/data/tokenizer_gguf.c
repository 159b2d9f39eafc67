/* Loads a tokenizer from GGUF metadata (tokenizer.ggml.*) into the same tables a tokenizer.json
 * fills, spelled the way Hugging Face's converters spell these tokenizers, so the encodings agree
 * with `tokenizers` on the equivalent tokenizer.json:
 *   model "gpt2"  -> byte-level BPE with the merges; `pre` picks the pre-tokenizer;
 *   model "llama" -> SentencePiece-style BPE with byte fallback, merges derived from the scores
 *                    as transformers' SentencePieceExtractor does.
 * Unknown and control tokens (types 2, 3) are special added tokens, user-defined ones (type 4)
 * plain added ones.
 * Other models (bert, t5, rwkv, ...) and unknown `pre` values are LT_ERR_UNSUPPORTED. */
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "longtune/alloc.h"
#include "longtune/gguf.h"

#define KEY_MODEL "tokenizer.ggml.model"
#define KEY_TOKENS "tokenizer.ggml.tokens"

static const char *const llama3_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const qwen2_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static int streq(const char *s, size_t n, const char *lit) { return strlen(lit) == n && !memcmp(s, lit, n); }

static lt_status opt_id(lt_ctx *ctx, const lt_gguf *g, const char *key, int32_t n_vocab, int32_t *out) {
    int64_t v;
    lt_status s = lt_gguf_get_i64(ctx, g, key, &v);
    if (s == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (s != LT_OK) return s;
    if (v < 0 || v >= n_vocab) {
        /* llama.cpp writes -1 (as u32 0xFFFFFFFF) for "none" in some files. */
        if (v == -1 || v == 0xFFFFFFFFll) return LT_OK;
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF %s = %lld is outside the vocabulary (%d tokens)", key, (long long)v,
                        n_vocab);
    }
    *out = (int32_t)v;
    return LT_OK;
}

static lt_status opt_bool(lt_ctx *ctx, const lt_gguf *g, const char *key, int *out) {
    lt_status s = lt_gguf_get_bool(ctx, g, key, out);
    if (s == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    return s;
}

static lt_status pre_split(lt_tokenizer *t, const char *pattern, int behavior) {
    tk_pre *p = &t->pres[t->n_pres++];
    memset(p, 0, sizeof *p);
    p->kind = TK_PRE_SPLIT;
    p->behavior = behavior;
    return lt_tok_compile(t, pattern, strlen(pattern), 0, &p->re);
}

static lt_status pre_bytelevel(lt_tokenizer *t, int use_regex) {
    tk_pre *p = &t->pres[t->n_pres++];
    memset(p, 0, sizeof *p);
    p->kind = TK_PRE_BYTELEVEL;
    if (use_regex) return lt_tok_compile(t, lt_tok_gpt2_pattern, strlen(lt_tok_gpt2_pattern), 0, &p->re);
    return LT_OK;
}

/* The pre-tokenizer of each `pre` value, as in the models' tokenizer.json files. */
static lt_status set_pre(lt_tokenizer *t, const char *pre, size_t n) {
    if (streq(pre, n, "default") || streq(pre, n, "gpt-2") || streq(pre, n, "gpt2")) return pre_bytelevel(t, 1);
    if (streq(pre, n, "smollm") || streq(pre, n, "starcoder")) {
        LT_TRY(pre_split(t, "\\p{N}", TK_SPLIT_ISOLATED)); /* Digits(individual_digits=true) */
        return pre_bytelevel(t, 1);
    }
    if (streq(pre, n, "llama-bpe") || streq(pre, n, "llama3")) {
        LT_TRY(pre_split(t, llama3_pattern, TK_SPLIT_ISOLATED));
        t->ignore_merges = 1; /* Llama 3's tokenizer.json sets it */
        return pre_bytelevel(t, 0);
    }
    if (streq(pre, n, "qwen2")) {
        tk_norm *nm = &t->norms[t->n_norms++];
        memset(nm, 0, sizeof *nm);
        nm->kind = TK_NORM_NFC; /* Qwen2's tokenizer.json normalizes to NFC */
        LT_TRY(pre_split(t, qwen2_pattern, TK_SPLIT_ISOLATED));
        return pre_bytelevel(t, 0);
    }
    return lt_error(t->ctx, LT_ERR_UNSUPPORTED,
                    "GGUF tokenizer.ggml.pre '%.*s' is not supported (supported: default, "
                    "gpt-2, smollm, starcoder, llama-bpe, qwen2)",
                    (int)(n > 64 ? 64 : n), pre);
}

typedef struct spm_pair {
    float score;
    int32_t lenl, lenr; /* in characters, as Python's len() */
    int32_t t, l, r;
} spm_pair;

static int cmp_pair(const void *a, const void *b) {
    const spm_pair *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    if (x->lenl != y->lenl) return x->lenl > y->lenl ? -1 : 1;
    if (x->lenr != y->lenr) return x->lenr > y->lenr ? -1 : 1;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

static int32_t utf8_chars(const char *s, size_t n) {
    int32_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((uint8_t)s[i] & 0xC0) != 0x80;
    return c;
}

/* Merges of a SentencePiece vocabulary: every split of every piece into two pieces, ordered by
 * the piece's score (highest first), then longer left part, longer right part, then vocabulary
 * order (transformers' generate_merges). */
static lt_status spm_merges(lt_tokenizer *t, const lt_gguf *g, int32_t n_vocab) {
    lt_ctx *ctx = t->ctx;
    size_t cap = 0, n = 0;
    spm_pair *pairs = NULL;
    lt_status s = LT_OK;
    for (int32_t id = 0; id < n_vocab && s == LT_OK; id++) {
        uint32_t len = t->tok_len[id];
        if (len == UINT32_MAX || len < 2) continue;
        const char *p = t->blob + t->tok_off[id];
        double score = 0;
        if ((s = lt_gguf_array_f64(ctx, g, "tokenizer.ggml.scores", (uint64_t)id, &score)) != LT_OK) break;
        for (uint32_t k = 1; k < len; k++) {
            if (((uint8_t)p[k] & 0xC0) == 0x80) continue; /* split at character boundaries */
            int32_t l = tk_lookup(&t->by_string, p, k), r = tk_lookup(&t->by_string, p + k, len - k);
            if (l < 0 || r < 0) continue;
            if (n == cap) {
                size_t nc = cap ? cap * 2 : 4096;
                spm_pair *np = lt_alloc(ctx, LT_DEVICE_CPU, nc * sizeof *np, "spm merges");
                if (!np) {
                    s = lt_ctx_status(ctx);
                    break;
                }
                if (pairs) {
                    memcpy(np, pairs, n * sizeof *np);
                    lt_free(ctx, LT_DEVICE_CPU, pairs, cap * sizeof *np);
                }
                pairs = np;
                cap = nc;
            }
            pairs[n++] = (spm_pair){(float)score, utf8_chars(p, k), utf8_chars(p + k, len - k), id, l, r};
        }
    }
    if (s == LT_OK && n) {
        qsort(pairs, n, sizeof *pairs, cmp_pair);
        for (size_t i = 0; i < n && s == LT_OK; i++)
            s = lt_tok_add_merge(t, pairs[i].l, pairs[i].r, (int32_t)i, pairs[i].t);
    }
    if (pairs) lt_free(ctx, LT_DEVICE_CPU, pairs, cap * sizeof *pairs);
    return s;
}

/* A copy of the literal s (when not NULL) into *dst, its length into *len. */
static lt_status dup_lit(lt_tokenizer *t, const char *s, char **dst, size_t *len) {
    if (!s) return LT_OK;
    *len = strlen(s);
    return (*dst = lt_tok_strdup(t, s, *len)) ? LT_OK : lt_ctx_status(t->ctx);
}

static lt_status set_norm(lt_tokenizer *t, int kind, const char *a, const char *b) {
    tk_norm *nm = &t->norms[t->n_norms++];
    memset(nm, 0, sizeof *nm);
    nm->kind = kind;
    LT_TRY(dup_lit(t, a, &nm->a, &nm->alen));
    return dup_lit(t, b, &nm->b, &nm->blen);
}

static lt_status set_dec(lt_tokenizer *t, int kind, const char *a, const char *b, int start, int stop) {
    tk_dec *d = &t->decs[t->n_decs++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    d->start = start;
    d->stop = stop;
    t->has_decoder = 1;
    LT_TRY(dup_lit(t, a, &d->a, &d->alen));
    return dup_lit(t, b, &d->b, &d->blen);
}

/* tokenizer.ggml.tokens (with token_type: unknown, control and user-defined tokens become added
 * tokens) into the id tables; *n_vocab gets the count. */
static lt_status load_vocab(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t, int32_t *n_vocab) {
    lt_gguf_type et;
    uint64_t n_tok;
    LT_TRY(lt_gguf_get_array(ctx, g, KEY_TOKENS, &et, &n_tok));
    if (et != LT_GGUF_STRING || n_tok == 0 || n_tok > INT32_MAX / 2)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF %s must be a non-empty string array", KEY_TOKENS);
    *n_vocab = (int32_t)n_tok;
    uint64_t n_types = 0;
    int have_types = lt_gguf_get_array(ctx, g, "tokenizer.ggml.token_type", &et, &n_types) == LT_OK;
    if (!have_types) lt_ctx_clear_error(ctx);
    else if (n_types != n_tok)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF tokenizer.ggml.token_type has %llu entries for %llu tokens",
                        (unsigned long long)n_types, (unsigned long long)n_tok);
    for (int32_t id = 0; id < *n_vocab; id++) {
        const char *s;
        size_t n;
        LT_TRY(lt_gguf_array_str(ctx, g, KEY_TOKENS, (uint64_t)id, &s, &n));
        int64_t type = 1;
        if (have_types) LT_TRY(lt_gguf_array_i64(ctx, g, "tokenizer.ggml.token_type", (uint64_t)id, &type));
        if (n == 0) {
            /* Empty pieces exist in some vocabularies; they can never be produced or matched. */
            LT_TRY(lt_tok_set_token(t, id, "", 0));
            continue;
        }
        /* Unknown (2) and control (3) tokens are special, as in HF's converted files. */
        if (type == 2 || type == 3 || type == 4) LT_TRY(lt_tok_add_added(t, id, s, n, type != 4, 0, 0, 0, 0));
        else LT_TRY(lt_tok_set_token(t, id, s, n));
    }
    return LT_OK;
}

/* tokenizer.ggml.merges ("a b" strings, rank = index) into the merge table. */
static lt_status bpe_merges(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t) {
    lt_gguf_type et;
    uint64_t n_merges;
    LT_TRY(lt_gguf_get_array(ctx, g, "tokenizer.ggml.merges", &et, &n_merges));
    if (et != LT_GGUF_STRING || n_merges > INT32_MAX)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF tokenizer.ggml.merges must be a string array");
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *m;
        size_t n;
        LT_TRY(lt_gguf_array_str(ctx, g, "tokenizer.ggml.merges", i, &m, &n));
        const char *sp = memchr(m, ' ', n);
        if (!sp || sp == m || sp == m + n - 1 || memchr(sp + 1, ' ', n - (size_t)(sp - m) - 1))
            return lt_error(ctx, LT_ERR_FORMAT, "GGUF tokenizer.ggml.merges[%llu] is not 'a b'", (unsigned long long)i);
        size_t al = (size_t)(sp - m), bl = n - al - 1;
        int missing;
        LT_TRY(lt_tok_add_merge_str(t, m, al, sp + 1, bl, (int32_t)i, &missing));
        if (missing)
            return lt_error(ctx, LT_ERR_FORMAT,
                            "GGUF tokenizer.ggml.merges[%llu] ('%.*s') uses a token missing "
                            "from the vocabulary",
                            (unsigned long long)i, (int)(n > 80 ? 80 : n), m);
    }
    return LT_OK;
}

/* Model gpt2: the pre-tokenizers of tokenizer.ggml.pre, the merges, a ByteLevel decoder. */
static lt_status gpt2_pipeline(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t) {
    const char *pre = "default";
    size_t pre_len = 7;
    lt_status s = lt_gguf_get_str(ctx, g, "tokenizer.ggml.pre", &pre, &pre_len);
    if (s == LT_ERR_NOT_FOUND) lt_ctx_clear_error(ctx);
    else if (s != LT_OK) return s;
    LT_TRY(set_pre(t, pre, pre_len));
    LT_TRY(bpe_merges(ctx, g, t));
    return set_dec(t, TK_DEC_BYTELEVEL, NULL, NULL, 0, 0);
}

/* Model llama: SentencePiece-style BPE as HF's Llama converter writes it -- normalizer
 * Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte fallback, fused unk, merges from the
 * scores, and the decoders that undo it. */
static lt_status llama_pipeline(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t, int32_t n_vocab, int add_space_prefix) {
    lt_gguf_type et;
    uint64_t n_scores;
    LT_TRY(lt_gguf_get_array(ctx, g, "tokenizer.ggml.scores", &et, &n_scores));
    if (n_scores != (uint64_t)n_vocab || (et != LT_GGUF_F32 && et != LT_GGUF_F64))
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF tokenizer.ggml.scores must be %llu floats",
                        (unsigned long long)n_vocab);
    t->byte_fallback = 1;
    t->fuse_unk = 1;
    t->unk_id = 0;
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.unknown_token_id", n_vocab, &t->unk_id));
    if (t->unk_id >= 0 && t->tok_len[t->unk_id] == UINT32_MAX) t->unk_id = -1;
    if (add_space_prefix) LT_TRY(set_norm(t, TK_NORM_PREPEND, "\xE2\x96\x81", NULL));
    LT_TRY(set_norm(t, TK_NORM_REPLACE, " ", "\xE2\x96\x81"));
    LT_TRY(spm_merges(t, g, n_vocab));
    LT_TRY(set_dec(t, TK_DEC_REPLACE, "\xE2\x96\x81", " ", 0, 0));
    LT_TRY(set_dec(t, TK_DEC_BYTEFALLBACK, NULL, NULL, 0, 0));
    LT_TRY(set_dec(t, TK_DEC_FUSE, NULL, NULL, 0, 0));
    if (add_space_prefix) LT_TRY(set_dec(t, TK_DEC_STRIP, " ", NULL, 1, 0));
    return LT_OK;
}

/* tokenizer.chat_template, when present. */
static lt_status chat_template(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t) {
    const char *tpl;
    size_t tpl_len;
    lt_status s = lt_gguf_get_str(ctx, g, "tokenizer.chat_template", &tpl, &tpl_len);
    if (s == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (s != LT_OK) return s;
    t->chat_template_len = tpl_len;
    if (!(t->chat_template = lt_tok_strdup(t, tpl, tpl_len))) return lt_ctx_status(ctx);
    return LT_OK;
}

static lt_status load(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t) {
    const char *model;
    size_t model_len;
    LT_TRY(lt_gguf_get_str(ctx, g, KEY_MODEL, &model, &model_len));
    int is_gpt2 = streq(model, model_len, "gpt2"), is_llama = streq(model, model_len, "llama");
    if (!is_gpt2 && !is_llama)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "GGUF tokenizer model '%.*s' is not supported (supported: gpt2, llama)",
                        (int)(model_len > 64 ? 64 : model_len), model);
    int32_t n_vocab = 0;
    LT_TRY(load_vocab(ctx, g, t, &n_vocab));
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.bos_token_id", n_vocab, &t->bos));
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.eos_token_id", n_vocab, &t->eos));
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.padding_token_id", n_vocab, &t->pad));
    int add_bos = is_llama, add_eos = 0, add_space_prefix = is_llama;
    LT_TRY(opt_bool(ctx, g, "tokenizer.ggml.add_bos_token", &add_bos));
    LT_TRY(opt_bool(ctx, g, "tokenizer.ggml.add_eos_token", &add_eos));
    LT_TRY(opt_bool(ctx, g, "tokenizer.ggml.add_space_prefix", &add_space_prefix));
    LT_TRY(is_gpt2 ? gpt2_pipeline(ctx, g, t) : llama_pipeline(ctx, g, t, n_vocab, add_space_prefix));
    int32_t prefix[1], suffix[1];
    int np = 0, ns = 0;
    if (add_bos && t->bos >= 0) prefix[np++] = t->bos;
    if (add_eos && t->eos >= 0) suffix[ns++] = t->eos;
    LT_TRY(lt_tok_set_post(t, prefix, np, suffix, ns));
    LT_TRY(chat_template(ctx, g, t));
    return lt_tok_finish(t);
}

lt_status lt_tokenizer_load_gguf(lt_ctx *ctx, const struct lt_gguf *g, lt_tokenizer **out) {
    *out = NULL;
    lt_tokenizer *t;
    LT_TRY(lt_tok_new(ctx, &t));
    lt_status s = load(ctx, g, t);
    if (s != LT_OK) {
        lt_tokenizer_free(t);
        return s;
    }
    *out = t;
    return LT_OK;
}
