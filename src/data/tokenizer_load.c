/* Loads a Hugging Face tokenizer.json (+ tokenizer_config.json beside it) into the tokenizer
 * tables. Supported: model BPE (byte_fallback, fuse_unk, ignore_merges, unk_token); normalizers
 * NFC, Prepend, Replace (string pattern), Sequence; pre-tokenizers ByteLevel, Split, Digits,
 * Metaspace, Whitespace, WhitespaceSplit, Sequence; post-processors TemplateProcessing, ByteLevel,
 * Bert/Roberta, Sequence; decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
 * Sequence. Anything else is LT_ERR_UNSUPPORTED naming it; nothing is silently ignored. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/tokenizer_internal.h"
#include "longtune/alloc.h"
#include "io/json_nul.h"

typedef struct load_ctx {
    lt_tokenizer *t;
    const char *path;
    int64_t id_limit; /* ids lie in [0, entries of model.vocab + added_tokens): the table is dense, so
                         a larger id would only size it for ids nothing names */
} load_ctx;

static lt_status read_file(lt_ctx *ctx, const char *path, char **buf, size_t *len) {
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return lt_error(ctx, LT_ERR_IO, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    char *b = lt_alloc(ctx, LT_DEVICE_CPU, n + 1, "tokenizer file");
    if (!b) {
        fclose(f);
        return lt_ctx_status(ctx);
    }
    if (n && fread(b, 1, n, f) != n) {
        fclose(f);
        lt_free(ctx, LT_DEVICE_CPU, b, n + 1);
        return lt_error(ctx, LT_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    b[n] = '\0';
    *buf = b;
    *len = n;
    return LT_OK;
}

static const char *jstr(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int jbool(const cJSON *o, const char *key, int dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return dflt;
}

static int jint(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= (double)lo && d <= (double)hi) || floor(d) != d) return 0;
    *out = (int64_t)d;
    return 1;
}

static const char *jtype(const cJSON *o) {
    const char *s = jstr(o, "type");
    return s ? s : "(no type)";
}

/* A Split/Replace pattern: {"String": s} or {"Regex": r}. */
static int jpattern(const cJSON *o, const char **s, int *is_regex) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    if (!cJSON_IsObject(p)) return 0;
    const char *v = jstr(p, "String");
    if (v) {
        *s = v;
        *is_regex = 0;
        return 1;
    }
    v = jstr(p, "Regex");
    if (v) {
        *s = v;
        *is_regex = 1;
        return 1;
    }
    return 0;
}

static lt_status add_norm(load_ctx *L, const cJSON *n) {
    lt_tokenizer *t = L->t;
    lt_ctx *ctx = t->ctx;
    if (cJSON_IsNull(n) || !n) return LT_OK;
    const char *type = jtype(n);
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) LT_TRY(add_norm(L, e));
        return LT_OK;
    }
    if (t->n_norms >= TK_MAX_STAGES)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: more than %d normalizers", L->path, TK_MAX_STAGES);
    tk_norm *nm = &t->norms[t->n_norms];
    memset(nm, 0, sizeof *nm);
    if (!strcmp(type, "NFC")) {
        nm->kind = TK_NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p) return lt_error(ctx, LT_ERR_FORMAT, "%s: normalizer Prepend without 'prepend'", L->path);
        nm->kind = TK_NORM_PREPEND;
        nm->alen = strlen(p);
        if (!(nm->a = lt_tok_strdup(t, p, nm->alen))) return lt_ctx_status(ctx);
    } else if (!strcmp(type, "Replace")) {
        const char *pat, *content = jstr(n, "content");
        int is_regex;
        if (!jpattern(n, &pat, &is_regex) || !content)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: normalizer Replace needs 'pattern' and 'content'", L->path);
        if (is_regex) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: normalizer Replace with a Regex pattern", L->path);
        if (!*pat) return lt_error(ctx, LT_ERR_FORMAT, "%s: normalizer Replace with an empty pattern", L->path);
        nm->kind = TK_NORM_REPLACE;
        nm->alen = strlen(pat);
        nm->blen = strlen(content);
        if (!(nm->a = lt_tok_strdup(t, pat, nm->alen)) || !(nm->b = lt_tok_strdup(t, content, nm->blen))) {
            t->n_norms++; /* so free() releases what was made */
            return lt_ctx_status(ctx);
        }
    } else {
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: normalizer '%s' is not supported (supported: NFC, Prepend, "
                        "Replace, Sequence)",
                        L->path, type);
    }
    t->n_norms++;
    return LT_OK;
}

static lt_status new_pre(load_ctx *L, tk_pre **out) {
    if (L->t->n_pres >= TK_MAX_STAGES)
        return lt_error(L->t->ctx, LT_ERR_UNSUPPORTED, "%s: more than %d pre-tokenizers", L->path, TK_MAX_STAGES);
    *out = &L->t->pres[L->t->n_pres++];
    memset(*out, 0, sizeof **out);
    return LT_OK;
}

static int parse_behavior(const char *b) {
    if (!b) return -1;
    if (!strcmp(b, "Isolated")) return TK_SPLIT_ISOLATED;
    if (!strcmp(b, "Removed")) return TK_SPLIT_REMOVED;
    if (!strcmp(b, "MergedWithPrevious")) return TK_SPLIT_MERGED_PREV;
    if (!strcmp(b, "MergedWithNext")) return TK_SPLIT_MERGED_NEXT;
    if (!strcmp(b, "Contiguous")) return TK_SPLIT_CONTIGUOUS;
    return -1;
}

static int parse_prepend_scheme(const cJSON *o) {
    const char *s = jstr(o, "prepend_scheme");
    if (s) {
        if (!strcmp(s, "always")) return TK_PREPEND_ALWAYS;
        if (!strcmp(s, "first")) return TK_PREPEND_FIRST;
        if (!strcmp(s, "never")) return TK_PREPEND_NEVER;
        return -1;
    }
    /* Files older than prepend_scheme carry add_prefix_space. */
    return jbool(o, "add_prefix_space", 1) ? TK_PREPEND_ALWAYS : TK_PREPEND_NEVER;
}

/* Split: a regex or string pattern, one of the five behaviours, invert. */
static lt_status pre_split(load_ctx *L, const cJSON *p) {
    lt_ctx *ctx = L->t->ctx;
    const char *pat;
    int is_regex;
    if (!jpattern(p, &pat, &is_regex))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: pre-tokenizer Split without a pattern", L->path);
    int b = parse_behavior(jstr(p, "behavior"));
    if (b < 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: Split behavior '%s' is not supported", L->path,
                        jstr(p, "behavior") ? jstr(p, "behavior") : "(none)");
    tk_pre *pre = NULL;
    LT_TRY(new_pre(L, &pre));
    pre->kind = TK_PRE_SPLIT;
    pre->behavior = b;
    pre->invert = jbool(p, "invert", 0);
    return lt_tok_compile(L->t, pat, strlen(pat), !is_regex, &pre->re);
}

/* Metaspace: a one-character replacement, the prepend scheme, split. */
static lt_status pre_metaspace(load_ctx *L, const cJSON *p) {
    lt_ctx *ctx = L->t->ctx;
    const char *rep = jstr(p, "replacement");
    if (!rep || !*rep || strlen(rep) > 4)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: Metaspace needs a one-character 'replacement'", L->path);
    int scheme = parse_prepend_scheme(p);
    if (scheme < 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme '%s'", L->path,
                        jstr(p, "prepend_scheme"));
    tk_pre *pre = NULL;
    LT_TRY(new_pre(L, &pre));
    pre->kind = TK_PRE_METASPACE;
    pre->rep_len = (int)strlen(rep);
    memcpy(pre->rep, rep, (size_t)pre->rep_len);
    pre->prepend_scheme = scheme;
    pre->split = jbool(p, "split", 1);
    if (pre->split) return lt_tok_compile(L->t, rep, strlen(rep), 1, &pre->re);
    return LT_OK;
}

static lt_status add_pre(load_ctx *L, const cJSON *p) {
    lt_tokenizer *t = L->t;
    lt_ctx *ctx = t->ctx;
    if (cJSON_IsNull(p) || !p) return LT_OK;
    const char *type = jtype(p);
    tk_pre *pre = NULL;
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) LT_TRY(add_pre(L, e));
        return LT_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        LT_TRY(new_pre(L, &pre));
        pre->kind = TK_PRE_BYTELEVEL;
        pre->add_prefix_space = jbool(p, "add_prefix_space", 1);
        if (jbool(p, "use_regex", 1))
            LT_TRY(lt_tok_compile(t, lt_tok_gpt2_pattern, strlen(lt_tok_gpt2_pattern), 0, &pre->re));
        return LT_OK;
    }
    if (!strcmp(type, "Split")) return pre_split(L, p);
    if (!strcmp(type, "Digits")) {
        /* HF splits on char::is_numeric (Nd, Nl, No): one piece per digit or per run. */
        LT_TRY(new_pre(L, &pre));
        pre->kind = TK_PRE_SPLIT;
        int individual = jbool(p, "individual_digits", 0);
        pre->behavior = individual ? TK_SPLIT_ISOLATED : TK_SPLIT_CONTIGUOUS;
        return lt_tok_compile(t, "\\p{N}", 5, 0, &pre->re);
    }
    if (!strcmp(type, "Whitespace")) {
        LT_TRY(new_pre(L, &pre));
        pre->kind = TK_PRE_SPLIT;
        pre->behavior = TK_SPLIT_REMOVED;
        pre->invert = 1;
        /* HF runs \w+|[^\w\s]+ through Rust's regex crate, whose \w is Alphabetic, marks, Nd, Pc
         * and Join_Control and whose \s is White_Space; PCRE2's \w lacks the marks. */
        const char *pat = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]+"
                          "|[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\p{White_Space}]+";
        return lt_tok_compile(t, pat, strlen(pat), 0, &pre->re);
    }
    if (!strcmp(type, "WhitespaceSplit")) {
        LT_TRY(new_pre(L, &pre));
        pre->kind = TK_PRE_SPLIT;
        pre->behavior = TK_SPLIT_REMOVED;
        /* char::is_whitespace is the White_Space property. */
        return lt_tok_compile(t, "\\p{White_Space}", 15, 0, &pre->re);
    }
    if (!strcmp(type, "Metaspace")) return pre_metaspace(L, p);
    return lt_error(ctx, LT_ERR_UNSUPPORTED,
                    "%s: pre-tokenizer '%s' is not supported (supported: ByteLevel, Split, "
                    "Digits, Metaspace, Whitespace, WhitespaceSplit, Sequence)",
                    L->path, type);
}

/* Replace: a string pattern and its content. */
static lt_status dec_replace(load_ctx *L, const cJSON *d, tk_dec *dec) {
    lt_ctx *ctx = L->t->ctx;
    const char *pat, *content = jstr(d, "content");
    int is_regex;
    if (!jpattern(d, &pat, &is_regex) || !content)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: decoder Replace needs 'pattern' and 'content'", L->path);
    if (is_regex) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: decoder Replace with a Regex pattern", L->path);
    dec->kind = TK_DEC_REPLACE;
    dec->alen = strlen(pat);
    dec->blen = strlen(content);
    if (!(dec->a = lt_tok_strdup(L->t, pat, dec->alen))) return lt_ctx_status(ctx);
    if (!(dec->b = lt_tok_strdup(L->t, content, dec->blen))) return lt_ctx_status(ctx);
    return LT_OK;
}

/* Strip: the character and how many of it to strip from the start and the stop. */
static lt_status dec_strip(load_ctx *L, const cJSON *d, tk_dec *dec) {
    const char *c = jstr(d, "content");
    int64_t a = 0, b = 0;
    if (!c || !jint(cJSON_GetObjectItemCaseSensitive(d, "start"), 0, 1 << 20, &a) ||
        !jint(cJSON_GetObjectItemCaseSensitive(d, "stop"), 0, 1 << 20, &b))
        return lt_error(L->t->ctx, LT_ERR_FORMAT, "%s: decoder Strip needs 'content', 'start' and 'stop'", L->path);
    dec->kind = TK_DEC_STRIP;
    dec->start = (int)a;
    dec->stop = (int)b;
    dec->alen = strlen(c);
    if (!(dec->a = lt_tok_strdup(L->t, c, dec->alen))) return lt_ctx_status(L->t->ctx);
    return LT_OK;
}

/* Metaspace: the replacement and the prepend scheme. */
static lt_status dec_metaspace(load_ctx *L, const cJSON *d, tk_dec *dec) {
    const char *rep = jstr(d, "replacement");
    int scheme = parse_prepend_scheme(d);
    if (!rep || !*rep || scheme < 0)
        return lt_error(L->t->ctx, LT_ERR_FORMAT,
                        "%s: decoder Metaspace needs 'replacement' and a known prepend_scheme", L->path);
    dec->kind = TK_DEC_METASPACE;
    dec->prepend_scheme = scheme;
    dec->alen = strlen(rep);
    if (!(dec->a = lt_tok_strdup(L->t, rep, dec->alen))) return lt_ctx_status(L->t->ctx);
    return LT_OK;
}

static lt_status add_dec(load_ctx *L, const cJSON *d) {
    lt_tokenizer *t = L->t;
    lt_ctx *ctx = t->ctx;
    if (cJSON_IsNull(d) || !d) return LT_OK;
    const char *type = jtype(d);
    t->has_decoder = 1;
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) LT_TRY(add_dec(L, e));
        return LT_OK;
    }
    if (t->n_decs >= TK_MAX_STAGES)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: more than %d decoders", L->path, TK_MAX_STAGES);
    /* Counted before its strings exist: after an error, freeing the tokenizer releases them. */
    tk_dec *dec = &t->decs[t->n_decs++];
    memset(dec, 0, sizeof *dec);
    if (!strcmp(type, "ByteLevel")) dec->kind = TK_DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) dec->kind = TK_DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) dec->kind = TK_DEC_FUSE;
    else if (!strcmp(type, "Replace")) return dec_replace(L, d, dec);
    else if (!strcmp(type, "Strip")) return dec_strip(L, d, dec);
    else if (!strcmp(type, "Metaspace")) return dec_metaspace(L, d, dec);
    else
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: decoder '%s' is not supported (supported: ByteLevel, "
                        "Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)",
                        L->path, type);
    return LT_OK;
}

/* TemplateProcessing's single-sequence template: special tokens before the Sequence item go to
 * pre, those after it to suf (16 at most each). */
static lt_status post_template(load_ctx *L, const cJSON *p, int32_t *pre, int *np, int32_t *suf, int *ns) {
    lt_ctx *ctx = L->t->ctx;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    int seen_seq = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, single) {
        if (cJSON_GetObjectItemCaseSensitive(item, "Sequence")) {
            seen_seq = 1;
            continue;
        }
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        const char *name = sp ? jstr(sp, "id") : NULL;
        if (!name)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: TemplateProcessing item is neither Sequence nor SpecialToken",
                            L->path);
        const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(def, "ids");
        if (!cJSON_IsArray(ids))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: TemplateProcessing special token '%s' has no ids", L->path, name);
        const cJSON *idv;
        cJSON_ArrayForEach(idv, ids) {
            int64_t id;
            if (!jint(idv, 0, INT32_MAX, &id))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: TemplateProcessing '%s': bad id", L->path, name);
            int32_t *dst = seen_seq ? suf : pre;
            int *cnt = seen_seq ? ns : np;
            if (*cnt >= 16) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: more than 16 template tokens", L->path);
            dst[(*cnt)++] = (int32_t)id;
        }
    }
    return LT_OK;
}

static lt_status add_post(load_ctx *L, const cJSON *p, int32_t *pre, int *np, int32_t *suf, int *ns) {
    lt_tokenizer *t = L->t;
    lt_ctx *ctx = t->ctx;
    if (!p || cJSON_IsNull(p)) return LT_OK;
    const char *type = jtype(p);
    if (!strcmp(type, "ByteLevel")) return LT_OK; /* only adjusts offsets */
    if (!strcmp(type, "Sequence")) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(p, "processors");
        const cJSON *e;
        cJSON_ArrayForEach(e, arr) LT_TRY(add_post(L, e, pre, np, suf, ns));
        return LT_OK;
    }
    if (!strcmp(type, "TemplateProcessing")) return post_template(L, p, pre, np, suf, ns);
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls"),
                    *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
        int64_t c, s;
        if (!jint(cJSON_GetArrayItem(cls, 1), 0, INT32_MAX, &c) || !jint(cJSON_GetArrayItem(sep, 1), 0, INT32_MAX, &s))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: %s needs cls and sep", L->path, type);
        if (*np >= 16 || *ns >= 16) return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: too many template tokens", L->path);
        pre[(*np)++] = (int32_t)c;
        suf[(*ns)++] = (int32_t)s;
        return LT_OK;
    }
    return lt_error(ctx, LT_ERR_UNSUPPORTED,
                    "%s: post-processor '%s' is not supported (supported: "
                    "TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing, Sequence)",
                    L->path, type);
}

/* "a b" or ["a", "b"]. */
static int merge_parts(const cJSON *m, const char **a, size_t *al, const char **b, size_t *bl) {
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' ')) return 0;
        *a = s;
        *al = (size_t)(sp - s);
        *b = sp + 1;
        *bl = strlen(sp + 1);
        return *al && *bl;
    }
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2) {
        const cJSON *x = cJSON_GetArrayItem(m, 0), *y = cJSON_GetArrayItem(m, 1);
        if (!cJSON_IsString(x) || !cJSON_IsString(y)) return 0;
        *a = x->valuestring;
        *al = strlen(*a);
        *b = y->valuestring;
        *bl = strlen(*b);
        return 1;
    }
    return 0;
}

/* model.vocab: token string -> id. */
static lt_status load_vocab(load_ctx *L, const cJSON *vocab) {
    if (!cJSON_IsObject(vocab)) return lt_error(L->t->ctx, LT_ERR_FORMAT, "%s: model.vocab is not an object", L->path);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        int64_t id;
        if (!jint(e, 0, INT32_MAX - 1, &id))
            return lt_error(L->t->ctx, LT_ERR_FORMAT, "%s: model.vocab['%.80s'] is not a valid id", L->path, e->string);
        if (id >= L->id_limit)
            return lt_error(L->t->ctx, LT_ERR_FORMAT,
                            "%s: model.vocab['%.80s'] has id %lld, past the vocabulary's %lld entries (model.vocab and "
                            "added_tokens)",
                            L->path, e->string, (long long)id, (long long)L->id_limit);
        LT_TRY(lt_tok_set_token(L->t, (int32_t)id, e->string, strlen(e->string)));
    }
    return LT_OK;
}

/* model.merges ("a b" strings or [a, b] pairs, rank = index) into the merge table. */
static lt_status load_merges(load_ctx *L, const cJSON *merges) {
    lt_ctx *ctx = L->t->ctx;
    if (merges && !cJSON_IsArray(merges))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: model.merges is not an array", L->path);
    int32_t rank = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t al, bl;
        if (!merge_parts(e, &a, &al, &b, &bl))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: merge %d is not 'a b' or [a, b]", L->path, rank);
        int missing;
        LT_TRY(lt_tok_add_merge_str(L->t, a, al, b, bl, rank, &missing));
        if (missing)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: merge %d ('%.*s' '%.*s') uses a token missing from the vocabulary",
                            L->path, rank, (int)(al > 60 ? 60 : al), a, (int)(bl > 60 ? 60 : bl), b);
        rank++;
    }
    return LT_OK;
}

static lt_status load_model(load_ctx *L, const cJSON *model) {
    lt_tokenizer *t = L->t;
    lt_ctx *ctx = t->ctx;
    if (!cJSON_IsObject(model)) return lt_error(ctx, LT_ERR_FORMAT, "%s: no 'model' object", L->path);
    const char *type = jstr(model, "type");
    if (type && strcmp(type, "BPE"))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", L->path, type);
    const cJSON *drop = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(drop) && drop->valuedouble != 0.0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", L->path);
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow))
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported", L->path);
    t->byte_fallback = jbool(model, "byte_fallback", 0);
    t->fuse_unk = jbool(model, "fuse_unk", 0);
    t->ignore_merges = jbool(model, "ignore_merges", 0);
    LT_TRY(load_vocab(L, cJSON_GetObjectItemCaseSensitive(model, "vocab")));
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        t->unk_id = tk_lookup(&t->by_string, unk, strlen(unk));
        if (t->unk_id < 0)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: unk_token '%s' is not in the vocabulary", L->path, unk);
    }
    return load_merges(L, cJSON_GetObjectItemCaseSensitive(model, "merges"));
}

static lt_status load_added(load_ctx *L, const cJSON *added) {
    lt_tokenizer *t = L->t;
    const cJSON *e;
    int i = 0;
    cJSON_ArrayForEach(e, added) {
        int64_t id;
        const char *content = jstr(e, "content");
        if (!content || !jint(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, INT32_MAX - 1, &id))
            return lt_error(t->ctx, LT_ERR_FORMAT, "%s: added_tokens[%d] needs 'id' and 'content'", L->path, i);
        if (id >= L->id_limit)
            return lt_error(t->ctx, LT_ERR_FORMAT,
                            "%s: added_tokens[%d] '%.80s' has id %lld, past the vocabulary's %lld entries (model.vocab "
                            "and added_tokens)",
                            L->path, i, content, (long long)id, (long long)L->id_limit);
        int special = jbool(e, "special", 0);
        LT_TRY(lt_tok_add_added(t, (int32_t)id, content, strlen(content), special, jbool(e, "lstrip", 0),
                                jbool(e, "rstrip", 0), jbool(e, "single_word", 0), jbool(e, "normalized", !special)));
        i++;
    }
    return LT_OK;
}

/* A token in tokenizer_config.json: "str" or {"content": "str", ...}. */
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) return jstr(v, "content");
    return NULL;
}

/* bos/eos/pad tokens and the chat template (a string, or the "default" of named templates) of a
 * parsed tokenizer_config.json at `path`. */
static lt_status apply_config(lt_tokenizer *t, const cJSON *cfg, const char *path) {
    lt_ctx *ctx = t->ctx;
    lt_status s = LT_OK;
    struct {
        const char *key;
        int32_t *dst;
    } toks[] = {{"bos_token", &t->bos}, {"eos_token", &t->eos}, {"pad_token", &t->pad}};
    for (int i = 0; i < 3 && s == LT_OK; i++) {
        const char *name = config_token(cfg, toks[i].key);
        if (!name) continue;
        int32_t id = tk_lookup(&t->by_string, name, strlen(name));
        if (id < 0) s = lt_error(ctx, LT_ERR_FORMAT, "%s: %s '%s' is not a token", path, toks[i].key, name);
        else *toks[i].dst = id;
    }
    const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    const char *tpl_s = cJSON_IsString(tpl) ? tpl->valuestring : NULL;
    if (cJSON_IsArray(tpl)) {
        /* Named templates: take "default". */
        const cJSON *e;
        cJSON_ArrayForEach(e, tpl) {
            const char *nm = jstr(e, "name");
            if (nm && !strcmp(nm, "default")) tpl_s = jstr(e, "template");
        }
    }
    if (s == LT_OK && tpl_s) {
        t->chat_template_len = strlen(tpl_s);
        t->chat_template = lt_tok_strdup(t, tpl_s, t->chat_template_len);
        if (!t->chat_template) s = lt_ctx_status(ctx);
    }
    return s;
}

/* transformers 5 saves the chat template as chat_template.jinja beside tokenizer_config.json;
 * it is read when the config carries none. A missing file is no error. */
static lt_status load_template_file(lt_tokenizer *t, const char *json_path, size_t dir) {
    lt_ctx *ctx = t->ctx;
    size_t plen = dir + sizeof "chat_template.jinja";
    char *path = lt_alloc(ctx, LT_DEVICE_CPU, plen, "template path");
    if (!path) return lt_ctx_status(ctx);
    memcpy(path, json_path, dir);
    memcpy(path + dir, "chat_template.jinja", sizeof "chat_template.jinja");
    char *buf;
    size_t len;
    lt_status s = read_file(ctx, path, &buf, &len);
    lt_free(ctx, LT_DEVICE_CPU, path, plen);
    if (s == LT_ERR_NOT_FOUND) {
        lt_ctx_clear_error(ctx);
        return LT_OK;
    }
    if (s != LT_OK) return s;
    t->chat_template_len = strlen(buf); /* up to a NUL, as a JSON string would hold */
    t->chat_template = lt_tok_strdup(t, buf, t->chat_template_len);
    lt_free(ctx, LT_DEVICE_CPU, buf, len + 1);
    return t->chat_template ? LT_OK : lt_ctx_status(ctx);
}

static lt_status load_config(lt_tokenizer *t, const char *json_path) {
    lt_ctx *ctx = t->ctx;
    const char *slash = strrchr(json_path, '/');
    size_t dir = slash ? (size_t)(slash - json_path + 1) : 0;
    size_t plen = dir + sizeof "tokenizer_config.json";
    char *path = lt_alloc(ctx, LT_DEVICE_CPU, plen, "config path");
    if (!path) return lt_ctx_status(ctx);
    memcpy(path, json_path, dir);
    memcpy(path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    char *buf;
    size_t len;
    cJSON *cfg = NULL;
    lt_status s = read_file(ctx, path, &buf, &len);
    if (s == LT_ERR_NOT_FOUND) { /* the config is optional */
        lt_ctx_clear_error(ctx);
        s = LT_OK;
        goto done;
    }
    if (s != LT_OK) goto done;
    int64_t nul = lt_json_nul_line(buf, len);
    if (nul) {
        lt_free(ctx, LT_DEVICE_CPU, buf, len + 1);
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: line %lld: string contains U+0000", path, (long long)nul);
        goto done;
    }
    cfg = cJSON_ParseWithLength(buf, len);
    lt_free(ctx, LT_DEVICE_CPU, buf, len + 1);
    if (!cJSON_IsObject(cfg)) s = lt_error(ctx, LT_ERR_FORMAT, "%s: not a JSON object", path);
    else s = apply_config(t, cfg, path);
done:
    cJSON_Delete(cfg);
    lt_free(ctx, LT_DEVICE_CPU, path, plen);
    if (s == LT_OK && !t->chat_template) s = load_template_file(t, json_path, dir);
    return s;
}

lt_status lt_tokenizer_load_json(lt_ctx *ctx, const char *path, lt_tokenizer **out) {
    *out = NULL;
    char *buf;
    size_t len;
    LT_TRY(read_file(ctx, path, &buf, &len));
    int64_t nul = lt_json_nul_line(buf, len);
    if (nul) {
        lt_free(ctx, LT_DEVICE_CPU, buf, len + 1);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: line %lld: string contains U+0000", path, (long long)nul);
    }
    cJSON *root = cJSON_ParseWithLength(buf, len);
    lt_free(ctx, LT_DEVICE_CPU, buf, len + 1);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    lt_tokenizer *t;
    lt_status s = lt_tok_new(ctx, &t);
    if (s != LT_OK) {
        cJSON_Delete(root);
        return s;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model"), *added;
    added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *vocab = cJSON_IsObject(model) ? cJSON_GetObjectItemCaseSensitive(model, "vocab") : NULL;
    load_ctx L = {t, path,
                  (int64_t)(cJSON_IsObject(vocab) || cJSON_IsArray(vocab) ? cJSON_GetArraySize(vocab) : 0) +
                      (cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0)};
    int32_t pre[16], suf[16];
    int np = 0, ns = 0;
    if ((s = load_model(&L, cJSON_GetObjectItemCaseSensitive(root, "model"))) != LT_OK) goto fail;
    if ((s = load_added(&L, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"))) != LT_OK) goto fail;
    if ((s = add_norm(&L, cJSON_GetObjectItemCaseSensitive(root, "normalizer"))) != LT_OK) goto fail;
    if ((s = add_pre(&L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"))) != LT_OK) goto fail;
    if ((s = add_dec(&L, cJSON_GetObjectItemCaseSensitive(root, "decoder"))) != LT_OK) goto fail;
    if ((s = add_post(&L, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), pre, &np, suf, &ns)) != LT_OK)
        goto fail;
    for (int i = 0; i < np + ns; i++) {
        int32_t id = i < np ? pre[i] : suf[i - np];
        if (id >= t->n_vocab || t->tok_len[id] == UINT32_MAX) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: post-processor token id %d is not in the vocabulary", path, id);
            goto fail;
        }
    }
    if ((s = lt_tok_set_post(t, pre, np, suf, ns)) != LT_OK) goto fail;
    if (np) t->bos = pre[0];
    if ((s = load_config(t, path)) != LT_OK) goto fail;
    if ((s = lt_tok_finish(t)) != LT_OK) goto fail;
    cJSON_Delete(root);
    *out = t;
    return LT_OK;
fail:
    cJSON_Delete(root);
    lt_tokenizer_free(t);
    return s;
}
