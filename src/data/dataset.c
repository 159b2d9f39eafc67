/* Tokenised datasets (dataset.h): streams a JSONL file record by record, turns each record into
 * token ids and a supervision mask following mlx-lm's rules, and appends them to growable
 * accounted arrays laid out as pack.h input. Prompt masking maps the chat renderer's byte spans to
 * tokens through each token's decoded bytes, falling back to tokenising prefixes (mlx-lm's own
 * method) when decoding does not reproduce the text exactly. It does not shuffle, pack or cache. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/dataset.h"
#include "longtune/tokenizer.h"

struct lt_dataset {
    int32_t *tokens;
    uint8_t *mask;
    int64_t *offsets;
    size_t tok_cap, mask_cap, off_cap; /* elements */
    lt_dataset_stats st;
};

/* Growable accounted array: doubles; `elem` bytes per element. */
static lt_status grow(lt_ctx *ctx, void **p, size_t *cap, size_t need, size_t elem, const char *what) {
    if (need <= *cap) return LT_OK;
    size_t c = *cap ? *cap : 1024;
    while (c < need) {
        if (c > SIZE_MAX / 2 / elem) return lt_error(ctx, LT_ERR_OOM, "%s: %zu elements is too many", what, need);
        c *= 2;
    }
    void *q = lt_alloc(ctx, LT_DEVICE_CPU, c * elem, what);
    if (!q) return LT_ERR_OOM;
    if (*cap) memcpy(q, *p, *cap * elem);
    lt_free(ctx, LT_DEVICE_CPU, *p, *cap * elem);
    *p = q;
    *cap = c;
    return LT_OK;
}

void lt_dataset_free(lt_ctx *ctx, lt_dataset *ds) {
    if (!ds) return;
    lt_free(ctx, LT_DEVICE_CPU, ds->tokens, ds->tok_cap * sizeof *ds->tokens);
    lt_free(ctx, LT_DEVICE_CPU, ds->mask, ds->mask_cap);
    lt_free(ctx, LT_DEVICE_CPU, ds->offsets, ds->off_cap * sizeof *ds->offsets);
    lt_free(ctx, LT_DEVICE_CPU, ds, sizeof *ds);
}

lt_pack_input lt_dataset_input(const lt_dataset *ds) {
    lt_pack_input in = {ds->tokens, ds->mask, ds->offsets, ds->st.records};
    return in;
}

lt_dataset_stats lt_dataset_get_stats(const lt_dataset *ds) { return ds->st; }

/* Appends ids (and mask, or all-ones when mask is NULL) as the tokens of the open record. */
static lt_status append(lt_ctx *ctx, lt_dataset *ds, const int32_t *ids, const uint8_t *mask, uint8_t fill, size_t n) {
    if (n == 0) return LT_OK; /* an empty piece: nothing to copy (the arrays may not exist yet) */
    size_t used = (size_t)ds->st.tokens;
    void *t = ds->tokens, *m = ds->mask;
    lt_status s = grow(ctx, &t, &ds->tok_cap, used + n, sizeof *ds->tokens, "dataset tokens");
    ds->tokens = t;
    if (s != LT_OK) return s;
    s = grow(ctx, &m, &ds->mask_cap, used + n, 1, "dataset mask");
    ds->mask = m;
    if (s != LT_OK) return s;
    memcpy(ds->tokens + used, ids, n * sizeof *ids);
    if (mask) memcpy(ds->mask + used, mask, n);
    else memset(ds->mask + used, fill, n);
    ds->st.tokens += (int64_t)n;
    return LT_OK;
}

/* Closes the open record: one more offset. */
static lt_status close_record(lt_ctx *ctx, lt_dataset *ds, int64_t start) {
    void *o = ds->offsets;
    LT_TRY(grow(ctx, &o, &ds->off_cap, (size_t)ds->st.records + 2, sizeof *ds->offsets, "dataset offsets"));
    ds->offsets = o;
    ds->st.records++;
    ds->offsets[ds->st.records] = ds->st.tokens;
    int64_t len = ds->st.tokens - start;
    if (len > ds->st.max_len) ds->st.max_len = len;
    if (ds->st.records == 1 || len < ds->st.min_len) ds->st.min_len = len;
    for (int64_t j = start; j < ds->st.tokens; j++) ds->st.supervised += ds->mask[j];
    return LT_OK;
}

/* Token strings of the tokenizer's bos/eos (for templates that write bos_token / eos_token). */
static char *token_text(lt_ctx *ctx, const lt_tokenizer *tok, int32_t id) {
    if (id < 0) return NULL;
    char *s = NULL;
    size_t n = 0;
    if (lt_tokenizer_decode(ctx, tok, &id, 1, 0, &s, &n) != LT_OK) {
        lt_ctx_clear_error(ctx);
        return NULL;
    }
    return s;
}

/* Byte offset where each token starts in `text` (n+1 entries), from each token's decoded bytes.
 * Returns 0 if the decoded tokens do not spell `text` exactly (e.g. SentencePiece's leading-space
 * handling), so the caller falls back to prefix tokenisation. */
static int token_starts_by_decoding(lt_ctx *ctx, const lt_tokenizer *tok, const int32_t *ids, size_t n,
                                    const char *text, size_t len, size_t *starts) {
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        char *s = NULL;
        size_t k = 0;
        if (lt_tokenizer_decode(ctx, tok, ids + i, 1, 0, &s, &k) != LT_OK) {
            lt_ctx_clear_error(ctx);
            return 0;
        }
        int ok = pos + k <= len && !memcmp(text + pos, s, k);
        free(s);
        if (!ok) return 0;
        starts[i] = pos;
        pos += k;
    }
    starts[n] = pos;
    return pos == len;
}

/* Tokens of text[0:bytes] (no added special tokens). */
static lt_status prefix_count(lt_ctx *ctx, const lt_tokenizer *tok, const char *text, size_t bytes, size_t *count) {
    int32_t *ids = NULL;
    size_t n = 0;
    LT_TRY(lt_tokenizer_encode(ctx, tok, text, bytes, 0, &ids, &n));
    free(ids);
    *count = n;
    return LT_OK;
}

typedef struct load_state {
    const lt_tokenizer *tok;
    const lt_dataset_options *opt;
    lt_chat_format fmt; /* resolved lazily */
    int fmt_resolved;
    lt_chat_options chat;
    char *bos, *eos;
    lt_chat_text rendered;
    size_t *starts;
    size_t starts_cap;
    uint8_t *mask;
    size_t mask_cap;
} load_state;

static lt_status resolve_format(lt_ctx *ctx, load_state *ls, int need) {
    if (ls->fmt_resolved) return ls->fmt == LT_CHAT_NONE && need ? LT_ERR_NOT_FOUND : LT_OK;
    ls->fmt_resolved = 1;
    if (ls->opt->chat_format != LT_CHAT_NONE) {
        ls->fmt = ls->opt->chat_format;
        return LT_OK;
    }
    const char *t = lt_tokenizer_chat_template(ls->tok);
    if (!t && !need) return LT_OK; /* completions without a template: plain concatenation */
    return lt_chat_detect(ctx, t, &ls->fmt);
}

static lt_status tokenize_chat(lt_ctx *ctx, load_state *ls, lt_dataset *ds, const lt_chat_message *msgs,
                               size_t n_msgs) {
    LT_TRY(lt_chat_render(ctx, ls->fmt, &ls->chat, msgs, n_msgs, &ls->rendered));
    const lt_chat_text *r = &ls->rendered;
    int32_t *ids = NULL;
    size_t n = 0;
    LT_TRY(lt_tokenizer_encode(ctx, ls->tok, r->text, r->len, 0, &ids, &n));
    lt_status s = LT_OK;
    const uint8_t *mask = NULL;
    if (ls->opt->mask_prompt) {
        void *sp = ls->starts, *mp = ls->mask;
        if ((s = grow(ctx, &sp, &ls->starts_cap, n + 1, sizeof *ls->starts, "token offsets")) != LT_OK) goto done;
        ls->starts = sp;
        if ((s = grow(ctx, &mp, &ls->mask_cap, n + 1, 1, "token mask")) != LT_OK) goto done;
        ls->mask = mp;
        if (token_starts_by_decoding(ctx, ls->tok, ids, n, r->text, r->len, ls->starts)) {
            lt_dataset_mask_from_spans(ls->starts, n, r->spans, r->n_spans, ls->mask);
        } else {
            /* mlx-lm's method: a span covers tokens [|enc(text[:begin])|, |enc(text[:end])|). */
            memset(ls->mask, 0, n);
            for (size_t k = 0; k < r->n_spans; k++) {
                size_t a, b;
                if ((s = prefix_count(ctx, ls->tok, r->text, r->spans[k].begin, &a)) != LT_OK) goto done;
                if ((s = prefix_count(ctx, ls->tok, r->text, r->spans[k].end, &b)) != LT_OK) goto done;
                for (size_t i = a; i < b && i < n; i++) ls->mask[i] = 1;
            }
        }
        mask = ls->mask;
    }
    s = append(ctx, ds, ids, mask, 1, n);
done:
    free(ids);
    return s;
}

static lt_status tokenize_record(lt_ctx *ctx, load_state *ls, lt_dataset *ds, const lt_record *rec, const char *file,
                                 int64_t line_no) {
    const int32_t eos = lt_tokenizer_eos(ls->tok);
    int32_t *ids = NULL;
    size_t n = 0;
    lt_status s;
    switch (rec->kind) {
    case LT_RECORD_TEXT:
        LT_TRY(lt_tokenizer_encode(ctx, ls->tok, rec->text, strlen(rec->text), 1, &ids, &n));
        s = append(ctx, ds, ids, NULL, 1, n);
        if (s == LT_OK && eos >= 0 && (n == 0 || ids[n - 1] != eos)) s = append(ctx, ds, &eos, NULL, 1, 1);
        free(ids);
        return s;
    case LT_RECORD_COMPLETION:
        s = resolve_format(ctx, ls, 0);
        if (s != LT_OK) return s;
        if (ls->fmt != LT_CHAT_NONE) {
            lt_chat_message m[2] = {{"user", rec->prompt}, {"assistant", rec->completion}};
            return tokenize_chat(ctx, ls, ds, m, 2);
        }
        LT_TRY(lt_tokenizer_encode(ctx, ls->tok, rec->prompt, strlen(rec->prompt), 1, &ids, &n));
        s = append(ctx, ds, ids, NULL, ls->opt->mask_prompt ? 0 : 1, n);
        free(ids);
        if (s != LT_OK) return s;
        LT_TRY(lt_tokenizer_encode(ctx, ls->tok, rec->completion, strlen(rec->completion), 0, &ids, &n));
        s = append(ctx, ds, ids, NULL, 1, n);
        free(ids);
        if (s == LT_OK && eos >= 0) s = append(ctx, ds, &eos, NULL, 1, 1);
        return s;
    case LT_RECORD_CHAT:
        s = resolve_format(ctx, ls, 1);
        if (s == LT_ERR_NOT_FOUND || s == LT_ERR_UNSUPPORTED) {
            /* keep the detector's advice (--chat-template NAME) and say where it was needed */
            char msg[768];
            snprintf(msg, sizeof msg, "%s", lt_ctx_error(ctx));
            if (!*msg) snprintf(msg, sizeof msg, "the model has no chat template; pass --chat-template NAME");
            return lt_error(ctx, s, "%s:%lld: chat record: %s", file, (long long)line_no, msg);
        }
        if (s != LT_OK) return s;
        s = tokenize_chat(ctx, ls, ds, rec->messages, rec->n_messages);
        if (s != LT_OK && (s == LT_ERR_UNSUPPORTED || s == LT_ERR_FORMAT)) {
            char msg[768];
            snprintf(msg, sizeof msg, "%s", lt_ctx_error(ctx));
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: %s", file, (long long)line_no, msg);
        }
        return s;
    }
    return lt_error(ctx, LT_ERR_INVALID_ARG, "dataset: unknown record kind");
}

lt_status lt_dataset_load(lt_ctx *ctx, const char *path, const lt_tokenizer *tok, const lt_dataset_options *opt_in,
                          lt_dataset **out) {
    *out = NULL;
    lt_dataset_options opt;
    memset(&opt, 0, sizeof opt);
    if (opt_in) opt = *opt_in;
    if (!tok) return lt_error(ctx, LT_ERR_INVALID_ARG, "dataset: no tokenizer");
    lt_jsonl *r = NULL;
    LT_TRY(lt_jsonl_open(ctx, path, opt.max_line_bytes, &r));
    lt_dataset *ds = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *ds, "dataset");
    load_state ls;
    memset(&ls, 0, sizeof ls);
    ls.tok = tok;
    ls.opt = &opt;
    ls.chat = opt.chat;
    lt_record rec;
    memset(&rec, 0, sizeof rec);
    lt_status s = LT_OK;
    if (!ds) {
        s = LT_ERR_OOM;
        goto fail;
    }
    ls.bos = token_text(ctx, tok, lt_tokenizer_bos(tok));
    ls.eos = token_text(ctx, tok, lt_tokenizer_eos(tok));
    if (!ls.chat.bos_token) ls.chat.bos_token = ls.bos;
    if (!ls.chat.eos_token) ls.chat.eos_token = ls.eos;
    {
        void *o = NULL;
        if ((s = grow(ctx, &o, &ds->off_cap, 1, sizeof *ds->offsets, "dataset offsets")) != LT_OK) goto fail;
        ds->offsets = o;
        ds->offsets[0] = 0;
    }
    for (;;) {
        if (opt.max_records && ds->st.records >= opt.max_records) break;
        const char *line;
        size_t len;
        int64_t line_no = 0;
        s = lt_jsonl_next(ctx, r, &line, &len, &line_no);
        if (s == LT_ERR_FORMAT && opt.skip_bad_lines) {
            ds->st.skipped_lines++;
            lt_ctx_clear_error(ctx);
            continue;
        }
        if (s != LT_OK) goto fail;
        if (!line) break;
        s = lt_record_parse(ctx, line, len, path, line_no, &rec);
        if (s == LT_OK) {
            int64_t start = ds->st.tokens;
            s = tokenize_record(ctx, &ls, ds, &rec, path, line_no);
            if (s == LT_OK) s = close_record(ctx, ds, start);
            if (s == LT_OK) {
                ds->st.text_records += rec.kind == LT_RECORD_TEXT;
                ds->st.completion_records += rec.kind == LT_RECORD_COMPLETION;
                ds->st.chat_records += rec.kind == LT_RECORD_CHAT;
            } else {
                ds->st.tokens = start; /* drop the partial record */
            }
        }
        if (s == LT_ERR_FORMAT && opt.skip_bad_lines) {
            ds->st.skipped_lines++;
            lt_ctx_clear_error(ctx);
            continue;
        }
        if (s != LT_OK) goto fail;
    }
    ds->st.chat_format = ls.fmt;
    lt_record_free(ctx, &rec);
    lt_chat_text_free(ctx, &ls.rendered);
    lt_free(ctx, LT_DEVICE_CPU, ls.starts, ls.starts_cap * sizeof *ls.starts);
    lt_free(ctx, LT_DEVICE_CPU, ls.mask, ls.mask_cap);
    free(ls.bos);
    free(ls.eos);
    lt_jsonl_close(ctx, r);
    *out = ds;
    return LT_OK;
fail:
    if (s == LT_OK) s = lt_ctx_status(ctx);
    lt_record_free(ctx, &rec);
    lt_chat_text_free(ctx, &ls.rendered);
    lt_free(ctx, LT_DEVICE_CPU, ls.starts, ls.starts_cap * sizeof *ls.starts);
    lt_free(ctx, LT_DEVICE_CPU, ls.mask, ls.mask_cap);
    free(ls.bos);
    free(ls.eos);
    lt_jsonl_close(ctx, r);
    lt_dataset_free(ctx, ds);
    return s;
}

lt_status lt_dataset_load_split(lt_ctx *ctx, const char *dir, const char *split, const lt_tokenizer *tok,
                                const lt_dataset_options *opt, lt_dataset **out) {
    *out = NULL;
    if (!dir || !split) return lt_error(ctx, LT_ERR_INVALID_ARG, "dataset: directory and split are required");
    if (strcmp(split, "train") && strcmp(split, "valid") && strcmp(split, "test"))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "dataset: split '%s' is not train, valid or test", split);
    size_t n = strlen(dir) + strlen(split) + 8;
    char *path = malloc(n);
    if (!path) return lt_error(ctx, LT_ERR_OOM, "dataset: path");
    snprintf(path, n, "%s/%s.jsonl", dir, split);
    lt_status s = lt_dataset_load(ctx, path, tok, opt, out);
    free(path);
    return s;
}
