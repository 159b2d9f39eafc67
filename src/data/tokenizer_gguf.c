/* Loads a tokenizer from GGUF metadata (tokenizer.ggml.*) into the same tables a tokenizer.json
 * fills, spelled the way Hugging Face's converters spell these tokenizers, so the encodings agree
 * with `tokenizers` on the equivalent tokenizer.json and with llama.cpp on the GGUF:
 *   model "gpt2"   -> byte-level BPE with the merges; `pre` picks the pre-tokenizer;
 *   model "llama"  -> SentencePiece-style BPE with byte fallback, merges derived from the scores
 *                     as transformers' SentencePieceExtractor does (Gemma 2/3: no space prefix);
 *   model "gemma4" -> BPE over characters with the GGUF's merges and byte fallback.
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

static const char *const qwen35_pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const tekken_pattern =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}"
    "\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* DeepSeek's letters (Latin, Greek, Cyrillic, Armenian, ... cased scripts), punctuation and CJK runs. */
static const char *const ds_letters =
    "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}"
    "\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}"
    "\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}"
    "\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
    "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}"
    "\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-"
    "\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}"
    "\\x{2102}\\x{2107}\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}"
    "\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}"
    "\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}"
    "\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}"
    "\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}"
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-"
    "\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+";
static const char *const ds_punct =
    "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+";
static const char *const ds_cjk = "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";

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

/* The pre-tokenizer of each `pre` value, as the models' tokenizer.json files spell it (Split
 * stages with HF's regexes, then ByteLevel with the GPT-2 regex or without one), under the
 * llama.cpp names that share it, with the flags that go with it: NFC normalisation,
 * ignore_merges (a whole word found in the vocabulary skips the merges) and add_bos on by default
 * (as llama.cpp; the GGUF's tokenizer.ggml.add_bos_token overrides it). */
typedef struct pre_spec {
    const char *names; /* space-separated llama.cpp names */
    int nfc, ignore_merges, add_bos, gpt2_regex;
    const char *regex[6]; /* the Split stages, in order */
} pre_spec;

static const pre_spec pre_specs[] = {
    {"default gpt-2 gpt2 phi-2", 0, 0, 0, 1, {NULL}},
    {"smollm starcoder refact command-r", 0, 0, 0, 1, {"\\p{N}"}},
    {"llama-bpe llama3 llama-v3 pixtral", 0, 1, 1, 0, {llama3_pattern}},
    {"qwen2 deepseek-r1-qwen", 1, 0, 0, 0, {qwen2_pattern}},
    {"qwen35", 0, 0, 0, 0, {qwen35_pattern}}, /* no NFC: combining marks stay apart */
    {"tekken", 0, 1, 1, 0, {tekken_pattern}},
    {"deepseek-llm", 0, 0, 0, 0, {"[\\r\\n]", ds_letters, ds_punct, "\\s+$", ds_cjk, "\\p{N}+"}},
    {"deepseek-coder", 0, 0, 0, 0, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", ds_cjk, "\\p{N}"}},
};

static int name_in(const char *names, const char *s, size_t n) {
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ' ');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && !memcmp(p, s, n)) return 1;
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static lt_status set_pre(lt_tokenizer *t, const char *pre, size_t n, int *add_bos) {
    for (size_t i = 0; i < sizeof pre_specs / sizeof pre_specs[0]; i++) {
        const pre_spec *ps = &pre_specs[i];
        if (!name_in(ps->names, pre, n)) continue;
        if (ps->nfc) LT_TRY(set_norm(t, TK_NORM_NFC, NULL, NULL));
        for (int k = 0; k < 6 && ps->regex[k]; k++) LT_TRY(pre_split(t, ps->regex[k], TK_SPLIT_ISOLATED));
        t->ignore_merges = ps->ignore_merges;
        if (ps->add_bos) *add_bos = 1;
        return pre_bytelevel(t, ps->gpt2_regex);
    }
    return lt_error(t->ctx, LT_ERR_UNSUPPORTED,
                    "GGUF tokenizer.ggml.pre '%.*s' is not supported (supported: default, gpt-2, smollm, starcoder, "
                    "refact, command-r, llama-bpe, pixtral, qwen2, qwen35, tekken, deepseek-llm, deepseek-coder)",
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
        /* Split at the first space after the first byte, as llama.cpp reads them. */
        const char *sp = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
        if (!sp || sp == m + n - 1)
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
static lt_status gpt2_pipeline(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t, int *add_bos) {
    const char *pre = "default";
    size_t pre_len = 7;
    lt_status s = lt_gguf_get_str(ctx, g, "tokenizer.ggml.pre", &pre, &pre_len);
    if (s == LT_ERR_NOT_FOUND) lt_ctx_clear_error(ctx);
    else if (s != LT_OK) return s;
    LT_TRY(set_pre(t, pre, pre_len, add_bos));
    LT_TRY(bpe_merges(ctx, g, t));
    return set_dec(t, TK_DEC_BYTELEVEL, NULL, NULL, 0, 0);
}

/* Model gemma4: BPE over UTF-8 characters (not bytes) with the GGUF's merges, spaces replaced by
 * "▁" before it, the text split into newline runs and the rest, a run of newlines that is one
 * token taken whole, unknown characters as <0xXX> byte tokens; decoders undo the "▁". */
static lt_status gemma4_pipeline(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t, int32_t n_vocab) {
    t->byte_fallback = 1;
    t->unk_id = -1;
    t->newline_words = 1;
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.unknown_token_id", n_vocab, &t->unk_id));
    LT_TRY(set_norm(t, TK_NORM_REPLACE, " ", "\xE2\x96\x81"));
    LT_TRY(pre_split(t, "[^\\n]+|[\\n]+", TK_SPLIT_ISOLATED));
    LT_TRY(bpe_merges(ctx, g, t));
    LT_TRY(set_dec(t, TK_DEC_REPLACE, "\xE2\x96\x81", " ", 0, 0));
    LT_TRY(set_dec(t, TK_DEC_BYTEFALLBACK, NULL, NULL, 0, 0));
    return set_dec(t, TK_DEC_FUSE, NULL, NULL, 0, 0);
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

/* 1 when s[0..n) contains the lower-case ASCII literal `lit`, ignoring ASCII case. */
static int ci_contains(const char *s, size_t n, const char *lit) {
    size_t m = strlen(lit);
    for (size_t i = 0; i + m <= n; i++) {
        size_t k = 0;
        while (k < m && (s[i + k] >= 'A' && s[i + k] <= 'Z' ? s[i + k] + 32 : s[i + k]) == lit[k]) k++;
        if (k == m) return 1;
    }
    return 0;
}

/* Phi-3's tokenizer.json marks its special tokens rstrip (whitespace after <|end|>, <|user|>, ...
 * joins the token), except <unk>, <s> and <|endoftext|>; its GGUFs cannot say so, and llama.cpp
 * restores it for a general.name containing "phi-3" or "phi3" (any case). So does this. */
static lt_status phi3_rstrip(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t) {
    const char *name;
    size_t len;
    lt_status s = lt_gguf_get_str(ctx, g, "general.name", &name, &len);
    if (s == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (s != LT_OK) return s;
    if (!ci_contains(name, len, "phi-3") && !ci_contains(name, len, "phi3")) return LT_OK;
    for (size_t a = 0; a < t->n_added; a++) {
        tk_added *ad = &t->added[a];
        const char *c = t->blob + ad->off;
        int keep = streq(c, ad->len, "<unk>") || streq(c, ad->len, "<s>") || streq(c, ad->len, "<|endoftext|>");
        ad->rstrip = (uint8_t)!keep;
    }
    return LT_OK;
}

static lt_status load(lt_ctx *ctx, const lt_gguf *g, lt_tokenizer *t) {
    const char *model;
    size_t model_len;
    LT_TRY(lt_gguf_get_str(ctx, g, KEY_MODEL, &model, &model_len));
    int is_gpt2 = streq(model, model_len, "gpt2"), is_llama = streq(model, model_len, "llama"),
        is_gemma4 = streq(model, model_len, "gemma4");
    if (!is_gpt2 && !is_llama && !is_gemma4)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "GGUF tokenizer model '%.*s' is not supported (supported: gpt2, llama, gemma4)",
                        (int)(model_len > 64 ? 64 : model_len), model);
    int32_t n_vocab = 0;
    LT_TRY(load_vocab(ctx, g, t, &n_vocab));
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.bos_token_id", n_vocab, &t->bos));
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.eos_token_id", n_vocab, &t->eos));
    LT_TRY(opt_id(ctx, g, "tokenizer.ggml.padding_token_id", n_vocab, &t->pad));
    /* Defaults as llama.cpp's: SentencePiece vocabularies add BOS and a space prefix, and so do
     * (BOS only) the Llama 3, Tekken and Gemma 4 pre-tokenizers; the GGUF keys override. */
    int add_bos = is_llama || is_gemma4, add_eos = 0, add_space_prefix = is_llama;
    if (is_gpt2) LT_TRY(gpt2_pipeline(ctx, g, t, &add_bos));
    LT_TRY(opt_bool(ctx, g, "tokenizer.ggml.add_bos_token", &add_bos));
    LT_TRY(opt_bool(ctx, g, "tokenizer.ggml.add_eos_token", &add_eos));
    LT_TRY(opt_bool(ctx, g, "tokenizer.ggml.add_space_prefix", &add_space_prefix));
    if (is_gemma4) {
        add_bos = 1; /* llama.cpp overrides a false add_bos_token for Gemma 4 */
        LT_TRY(gemma4_pipeline(ctx, g, t, n_vocab));
    }
    if (is_llama) LT_TRY(llama_pipeline(ctx, g, t, n_vocab, add_space_prefix));
    LT_TRY(phi3_rstrip(ctx, g, t));
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
