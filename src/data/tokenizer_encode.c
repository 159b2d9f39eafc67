/* Encode: UTF-8 repair of the input, added tokens (matched first, leftmost-longest), the
 * normalizers, the pre-tokenizers (PCRE2 splits with Hugging Face's five delimiter behaviours,
 * ByteLevel, Metaspace) and the post-processor's ids around the result; each pre-token goes to
 * the BPE model (tokenizer_bpe.c). Semantics follow the Hugging Face `tokenizers` library step by
 * step so encodings are equal token for token. No offsets, no pairs. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"
#include "longtune/alloc.h"

static lt_status pre_apply(tk_enc *st, int level, const char *p, size_t n, int at_start);

/* Finds regex matches of `re` in p[0..n) and records spans covering all of it (gaps are
 * non-matches), as HF's Pattern::find_matches; empty matches are skipped. */
static lt_status find_spans(tk_enc *st, int level, const pcre2_code *re, const char *p, size_t n, int invert,
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
            tk_utf8_decode((const uint8_t *)p + ms, &cl);
            pos = ms + cl;
            continue;
        }
        LT_TRY(tk_grow(st->ctx, (void **)&st->spans[level], &st->spans_cap[level], sizeof(tk_span), k + 2,
                       "pre-token spans"));
        if (ms > prev) st->spans[level][k++] = (tk_span){(uint32_t)prev, (uint32_t)ms, (uint8_t)invert};
        st->spans[level][k++] = (tk_span){(uint32_t)ms, (uint32_t)me, (uint8_t)!invert};
        prev = pos = me;
    }
    if (prev < n) {
        LT_TRY(tk_grow(st->ctx, (void **)&st->spans[level], &st->spans_cap[level], sizeof(tk_span), k + 1,
                       "pre-token spans"));
        st->spans[level][k++] = (tk_span){(uint32_t)prev, (uint32_t)n, (uint8_t)invert};
    }
    *count = k;
    return LT_OK;
}

/* Applies a split behaviour (HF SplitDelimiterBehavior) to the k spans in place; returns how
 * many pieces remain. */
static size_t apply_behavior(tk_span *sp, size_t k, int behavior) {
    size_t m = 0; /* compacted output spans */
    int prev_match = 0;
    switch (behavior) {
    case TK_SPLIT_ISOLATED: return k;
    case TK_SPLIT_REMOVED:
        for (size_t i = 0; i < k; i++)
            if (!sp[i].is_match) sp[m++] = sp[i];
        return m;
    case TK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < k; i++) {
            tk_span s = sp[i];
            if (s.is_match && !prev_match && m) sp[m - 1].end = s.end;
            else sp[m++] = (tk_span){s.start, s.end, 0};
            prev_match = s.is_match;
        }
        return m;
    case TK_SPLIT_MERGED_NEXT: {
        /* Walk backwards: a match joins the following piece unless that piece is a match. */
        size_t w = k; /* write from the end */
        for (size_t i = k; i-- > 0;) {
            tk_span s = sp[i];
            if (s.is_match && !prev_match && w < k) sp[w].start = s.start;
            else sp[--w] = (tk_span){s.start, s.end, 0};
            prev_match = s.is_match;
        }
        memmove(sp, sp + w, (k - w) * sizeof *sp);
        return k - w;
    }
    case TK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < k; i++) {
            tk_span s = sp[i];
            if (m && s.is_match == prev_match) sp[m - 1].end = s.end;
            else sp[m++] = s;
            prev_match = s.is_match;
        }
        return m;
    }
    return 0;
}

/* Applies a split behaviour to the spans of `level` and sends each resulting piece to the next
 * stage. */
static lt_status split_and_send(tk_enc *st, int level, int behavior, const char *p, size_t k, int at_start) {
    size_t m = apply_behavior(st->spans[level], k, behavior);
    for (size_t i = 0; i < m; i++) {
        tk_span s = st->spans[level][i]; /* re-read: deeper stages use other levels' arrays */
        if (s.end > s.start) LT_TRY(pre_apply(st, level + 1, p + s.start, s.end - s.start, at_start && s.start == 0));
    }
    return LT_OK;
}

/* Metaspace: spaces become the replacement; prepend per scheme; optionally split before each. */
static lt_status metaspace(tk_enc *st, int level, const tk_pre *pre, const char *p, size_t n, int at_start) {
    size_t spaces = 0, k;
    for (size_t i = 0; i < n; i++) spaces += p[i] == ' ';
    size_t rl = (size_t)pre->rep_len, cap = n + spaces * rl + rl;
    LT_TRY(tk_grow(st->ctx, (void **)&st->scratch[level], &st->scratch_cap[level], 1, cap, "pre-token scratch"));
    char *o = st->scratch[level];
    size_t on = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == ' ') {
            memcpy(o + on, pre->rep, rl);
            on += rl;
        } else o[on++] = p[i];
    }
    int starts = on >= rl && !memcmp(o, pre->rep, rl);
    if (!starts &&
        (pre->prepend_scheme == TK_PREPEND_ALWAYS || (pre->prepend_scheme == TK_PREPEND_FIRST && at_start))) {
        memmove(o + rl, o, on);
        memcpy(o, pre->rep, rl);
        on += rl;
    }
    if (!pre->split) return pre_apply(st, level + 1, o, on, at_start);
    LT_TRY(find_spans(st, level, pre->re, o, on, 0, &k));
    return split_and_send(st, level, TK_SPLIT_MERGED_NEXT, o, k, at_start);
}

/* Pre-tokenizer `level` over one piece; past the last, the piece is a word for the model. */
static lt_status pre_apply(tk_enc *st, int level, const char *p, size_t n, int at_start) {
    const lt_tokenizer *t = st->t;
    if (!n) return LT_OK;
    if (level == t->n_pres) return lt_tok_bpe_word(st, p, n);
    const tk_pre *pre = &t->pres[level];
    size_t k;
    switch (pre->kind) {
    case TK_PRE_SPLIT:
        LT_TRY(find_spans(st, level, pre->re, p, n, pre->invert, &k));
        return split_and_send(st, level, pre->behavior, p, k, at_start);
    case TK_PRE_BYTELEVEL:
        if (pre->add_prefix_space && p[0] != ' ') {
            LT_TRY(
                tk_grow(st->ctx, (void **)&st->scratch[level], &st->scratch_cap[level], 1, n + 1, "pre-token scratch"));
            st->scratch[level][0] = ' ';
            memcpy(st->scratch[level] + 1, p, n);
            p = st->scratch[level];
            n++;
        }
        if (!pre->re) return pre_apply(st, level + 1, p, n, at_start);
        LT_TRY(find_spans(st, level, pre->re, p, n, 0, &k));
        return split_and_send(st, level, TK_SPLIT_ISOLATED, p, k, at_start);
    case TK_PRE_METASPACE: return metaspace(st, level, pre, p, n, at_start);
    }
    return LT_OK;
}

/* Replace (literal) of a by b over cur[0..cn) into *buf; *changed = 0 (and nothing written) when
 * a does not occur. */
static lt_status replace_literal(tk_enc *st, const tk_norm *nm, const char *cur, size_t cn, char **buf, size_t *bcap,
                                 size_t *on, int *changed) {
    size_t cnt = 0;
    for (size_t j = 0; j + nm->alen <= cn;) {
        if (!memcmp(cur + j, nm->a, nm->alen)) {
            cnt++;
            j += nm->alen;
        } else j++;
    }
    *changed = cnt > 0;
    if (!cnt) return LT_OK;
    size_t need = cn + cnt * nm->blen;
    LT_TRY(tk_grow(st->ctx, (void **)buf, bcap, 1, need + 1, "normalizer buffer"));
    char *o = *buf;
    size_t w = 0;
    for (size_t j = 0; j < cn;) {
        if (j + nm->alen <= cn && !memcmp(cur + j, nm->a, nm->alen)) {
            memcpy(o + w, nm->b, nm->blen);
            w += nm->blen;
            j += nm->alen;
        } else {
            o[w++] = cur[j++];
        }
    }
    *on = w;
    return LT_OK;
}

/* Normalizers over one piece; the result is in *out (one of the state's buffers or the input). */
static lt_status normalize(tk_enc *st, const char *p, size_t n, const char **out, size_t *out_n) {
    const lt_tokenizer *t = st->t;
    const char *cur = p;
    size_t cn = n;
    int which = 0; /* alternate between the two buffers */
    for (int i = 0; i < t->n_norms; i++) {
        const tk_norm *nm = &t->norms[i];
        char **buf = which ? &st->norm2 : &st->norm;
        size_t *bcap = which ? &st->norm2_cap : &st->norm_cap;
        size_t on = 0;
        if (nm->kind == TK_NORM_NFC) {
            if (lt_tok_nfc_quick(cur, cn)) continue;
            LT_TRY(lt_tok_nfc(st->ctx, cur, cn, buf, &on, bcap));
        } else if (nm->kind == TK_NORM_PREPEND) {
            if (!cn) continue;
            LT_TRY(tk_grow(st->ctx, (void **)buf, bcap, 1, cn + nm->alen, "normalizer buffer"));
            memcpy(*buf, nm->a, nm->alen);
            memcpy(*buf + nm->alen, cur, cn);
            on = cn + nm->alen;
        } else { /* REPLACE (literal) */
            int changed;
            LT_TRY(replace_literal(st, nm, cur, cn, buf, bcap, &on, &changed));
            if (!changed) continue;
        }
        cur = *buf;
        cn = on;
        which ^= 1;
    }
    *out = cur;
    *out_n = cn;
    return LT_OK;
}

static int is_ws(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
static int is_word(uint8_t c) {
    return c >= 0x80 || c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
}

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
 * 2: pre-tokenize). at_start: p begins the input (for Metaspace's "first" scheme). */
static lt_status text_stage(tk_enc *st, int stage, const char *p, size_t n, int at_start);

static lt_status added_split(tk_enc *st, int stage, int normalized, const char *p, size_t n, int at_start) {
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
        LT_TRY(lt_tok_push_id(st, ad->id));
        pos = me;
        if (ad->rstrip)
            while (pos < n && is_ws((uint8_t)p[pos])) pos++;
    }
    if (pos < n) LT_TRY(text_stage(st, stage, p + pos, n - pos, at_start && pos == 0));
    return LT_OK;
}

static lt_status text_stage(tk_enc *st, int stage, const char *p, size_t n, int at_start) {
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

static void enc_release(tk_enc *st) {
    for (int i = 0; i < TK_MAX_STAGES; i++) {
        lt_tok_release(st->ctx, st->scratch[i], st->scratch_cap[i]);
        lt_tok_release(st->ctx, st->spans[i], st->spans_cap[i] * sizeof(tk_span));
    }
    lt_tok_release(st->ctx, st->norm, st->norm_cap);
    lt_tok_release(st->ctx, st->norm2, st->norm2_cap);
    lt_tok_release(st->ctx, st->sym, st->sym_cap * sizeof *st->sym);
    lt_tok_release(st->ctx, st->rank, st->rank_cap * sizeof *st->rank);
    lt_tok_release(st->ctx, st->heap, st->heap_cap * sizeof *st->heap);
    if (st->md) pcre2_match_data_free(st->md);
}

/* Invalid UTF-8 becomes U+FFFD per maximal ill-formed subpart, as Python's
 * bytes.decode('utf-8', 'replace') does before HF sees a str. Valid text is left in place
 * (*fixed stays NULL); otherwise *fixed holds the repaired copy of *n bytes. */
static lt_status repair_utf8(lt_ctx *ctx, const char *text, size_t len, char **fixed, size_t *fixed_cap, size_t *n) {
    size_t valid = lt_tok_utf8_valid_prefix((const uint8_t *)text, len);
    *n = len;
    if (valid == len) return LT_OK;
    LT_TRY(tk_grow(ctx, (void **)fixed, fixed_cap, 1, len * 3 + 1, "utf-8 repair buffer"));
    char *o = *fixed;
    memcpy(o, text, valid);
    size_t w = valid;
    for (size_t i = valid; i < len;) {
        size_t bad = 1, k = lt_tok_utf8_char((const uint8_t *)text + i, len - i, &bad);
        if (k) {
            memcpy(o + w, text + i, k);
            w += k;
            i += k;
        } else {
            w += (size_t)lt_tok_utf8_put(o + w, 0xFFFD);
            i += bad;
        }
    }
    *n = w;
    return LT_OK;
}

lt_status lt_tokenizer_encode(lt_ctx *ctx, const lt_tokenizer *tok, const char *text, size_t len, int add_special,
                              int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!tok || (!text && len)) return lt_error(ctx, LT_ERR_INVALID_ARG, "lt_tokenizer_encode: NULL argument");
    if (len > UINT32_MAX / 4)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "text of %zu bytes is too long to encode at once", len);
    tk_enc st;
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
    const char *src = text;
    size_t n = len;
    if ((s = repair_utf8(ctx, text, len, &fixed, &fixed_cap, &n)) != LT_OK) goto fail;
    if (fixed) src = fixed;
    if (add_special)
        for (int i = 0; i < tok->n_post_prefix; i++)
            if ((s = lt_tok_push_id(&st, tok->post_prefix[i])) != LT_OK) goto fail;
    s = added_split(&st, 1, 0, src, n, 1);
    if (s != LT_OK) goto fail;
    if (add_special)
        for (int i = 0; i < tok->n_post_suffix; i++)
            if ((s = lt_tok_push_id(&st, tok->post_suffix[i])) != LT_OK) goto fail;
    enc_release(&st);
    lt_tok_release(ctx, fixed, fixed_cap);
    if (!st.ids) {
        st.ids = malloc(sizeof(int32_t));
        if (!st.ids) return lt_error(ctx, LT_ERR_OOM, "token id buffer");
    }
    *ids = st.ids;
    *n_ids = st.n;
    return LT_OK;
fail:
    enc_release(&st);
    lt_tok_release(ctx, fixed, fixed_cap);
    free(st.ids);
    return s;
}
