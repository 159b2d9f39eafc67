/* Decode: token strings through the decoder chain (ByteLevel, ByteFallback, Fuse, Replace, Strip,
 * Metaspace) as lists of pieces, as Hugging Face's decoders pass them along, joined at the end
 * (nothing between pieces after a decoder, a space without one). Byte-level output is read as
 * lossy UTF-8. No streaming decode. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_internal.h"

/* A list of byte strings (offsets into one buffer), what HF's decoders pass along. */
typedef struct piece_list {
    char *buf;
    size_t len, cap;
    size_t *off; /* n+1 entries */
    size_t n, off_cap;
} piece_list;

static lt_status pl_add(lt_ctx *ctx, piece_list *pl, const char *s, size_t n) {
    LT_TRY(tk_grow(ctx, (void **)&pl->buf, &pl->cap, 1, pl->len + n + 1, "decode buffer"));
    LT_TRY(tk_grow(ctx, (void **)&pl->off, &pl->off_cap, sizeof *pl->off, pl->n + 2, "decode pieces"));
    if (!pl->n) pl->off[0] = 0;
    memcpy(pl->buf + pl->len, s, n);
    pl->len += n;
    pl->off[++pl->n] = pl->len;
    return LT_OK;
}

/* Appends to the last piece (creating one if none). */
static lt_status pl_append(lt_ctx *ctx, piece_list *pl, const char *s, size_t n) {
    if (!pl->n) return pl_add(ctx, pl, s, n);
    LT_TRY(tk_grow(ctx, (void **)&pl->buf, &pl->cap, 1, pl->len + n + 1, "decode buffer"));
    memcpy(pl->buf + pl->len, s, n);
    pl->len += n;
    pl->off[pl->n] = pl->len;
    return LT_OK;
}

static void pl_free(lt_ctx *ctx, piece_list *pl) {
    lt_tok_release(ctx, pl->buf, pl->cap);
    lt_tok_release(ctx, pl->off, pl->off_cap * sizeof *pl->off);
    memset(pl, 0, sizeof *pl);
}

/* Appends s with invalid UTF-8 replaced by U+FFFD (Rust's from_utf8_lossy). */
static lt_status append_lossy(lt_ctx *ctx, piece_list *pl, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t v = i + lt_tok_utf8_valid_prefix((const uint8_t *)s + i, n - i);
        if (v > i) LT_TRY(pl_append(ctx, pl, s + i, v - i));
        if (v >= n) break;
        size_t bad = 1;
        lt_tok_utf8_char((const uint8_t *)s + v, n - v, &bad);
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

/* The i-th piece of pl and its length. */
static const char *piece(const piece_list *pl, size_t i, size_t *n) {
    *n = pl->off[i + 1] - pl->off[i];
    return pl->buf + pl->off[i];
}

/* Appends token p (n bytes) mapped back to bytes, or as it is when it holds a character outside
 * the byte map. */
static lt_status unmap_token(lt_ctx *ctx, piece_list *raw, const char *p, size_t n) {
    char tmp[64]; /* mapped in chunks */
    size_t tn = 0, mark = raw->len, cl;
    for (size_t j = 0; j < n; j += cl) {
        int b = lt_tok_cp_to_byte(tk_utf8_decode((const uint8_t *)p + j, &cl));
        if (b < 0) {
            raw->len = mark; /* drop the partial mapping */
            if (raw->n) raw->off[raw->n] = mark;
            return pl_append(ctx, raw, p, n);
        }
        tmp[tn++] = (char)b;
        if (tn == sizeof tmp) {
            LT_TRY(pl_append(ctx, raw, tmp, tn));
            tn = 0;
        }
    }
    return tn ? pl_append(ctx, raw, tmp, tn) : LT_OK;
}

/* ByteLevel: all tokens to bytes, then the concatenation read as lossy UTF-8: one piece. */
static lt_status dec_bytelevel(lt_ctx *ctx, const piece_list *in, piece_list *out) {
    piece_list raw = {0};
    lt_status s = LT_OK;
    for (size_t i = 0; i < in->n && s == LT_OK; i++) {
        size_t n;
        const char *p = piece(in, i, &n);
        s = unmap_token(ctx, &raw, p, n);
    }
    if (s == LT_OK) s = append_lossy(ctx, out, raw.buf ? raw.buf : "", raw.len);
    pl_free(ctx, &raw);
    return s;
}

/* ByteFallback: runs of <0xXX> tokens become their bytes when those are valid UTF-8, else one
 * U+FFFD per byte. */
static lt_status dec_bytefallback(lt_ctx *ctx, const piece_list *in, piece_list *out) {
    piece_list acc = {0};
    lt_status s = LT_OK;
    for (size_t i = 0; i <= in->n && s == LT_OK; i++) {
        size_t n = 0;
        const char *p = i < in->n ? piece(in, i, &n) : NULL;
        uint8_t b;
        if (p && is_byte_token(p, n, &b)) {
            char c = (char)b;
            s = pl_append(ctx, &acc, &c, 1);
            continue;
        }
        if (acc.len) {
            if (lt_tok_utf8_valid_prefix((const uint8_t *)acc.buf, acc.len) == acc.len)
                s = pl_add(ctx, out, acc.buf, acc.len);
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

/* Replace and Metaspace: every occurrence of a (alen > 0) in each piece becomes b; in the first
 * piece it becomes first_b (first_blen bytes) instead. */
static lt_status replace_pieces(lt_ctx *ctx, const piece_list *in, piece_list *out, const char *a, size_t alen,
                                const char *b, size_t blen, size_t first_blen) {
    for (size_t i = 0; i < in->n; i++) {
        size_t n;
        const char *p = piece(in, i, &n);
        size_t bl = i == 0 ? first_blen : blen;
        LT_TRY(pl_add(ctx, out, "", 0));
        for (size_t j = 0; j < n;) {
            if (alen && j + alen <= n && !memcmp(p + j, a, alen)) {
                if (bl) LT_TRY(pl_append(ctx, out, b, bl));
                j += alen;
            } else {
                LT_TRY(pl_append(ctx, out, p + j, 1));
                j++;
            }
        }
    }
    return LT_OK;
}

/* Strip: up to `start` copies of the character from the front of each piece, `stop` from the back. */
static lt_status dec_strip(lt_ctx *ctx, const tk_dec *d, const piece_list *in, piece_list *out) {
    for (size_t i = 0; i < in->n; i++) {
        size_t n, a = 0;
        const char *p = piece(in, i, &n);
        size_t e = n;
        for (int k = 0; k < d->start && a + d->alen <= e && !memcmp(p + a, d->a, d->alen); k++) a += d->alen;
        for (int k = 0; k < d->stop && e >= a + d->alen && !memcmp(p + e - d->alen, d->a, d->alen); k++) e -= d->alen;
        LT_TRY(pl_add(ctx, out, p + a, e - a));
    }
    return LT_OK;
}

static lt_status decode_step(lt_ctx *ctx, const tk_dec *d, const piece_list *in, piece_list *out) {
    switch (d->kind) {
    case TK_DEC_BYTELEVEL: return dec_bytelevel(ctx, in, out);
    case TK_DEC_BYTEFALLBACK: return dec_bytefallback(ctx, in, out);
    case TK_DEC_FUSE: return pl_add(ctx, out, in->buf ? in->buf : "", in->len);
    case TK_DEC_REPLACE: return replace_pieces(ctx, in, out, d->a, d->alen, d->b, d->blen, d->blen);
    case TK_DEC_STRIP: return dec_strip(ctx, d, in, out);
    case TK_DEC_METASPACE:
        /* The replacement becomes a space; in the first piece it is dropped unless the scheme is never. */
        return replace_pieces(ctx, in, out, d->a, d->alen, " ", 1, d->prepend_scheme != TK_PREPEND_NEVER ? 0 : 1);
    }
    return LT_OK;
}

/* Joins the pieces into one malloc'd NUL-terminated string: nothing between pieces after a
 * decoder, a space without one (HF). */
static lt_status join(lt_ctx *ctx, const piece_list *a, int spaced, char **text, size_t *len) {
    size_t total = a->len + (!spaced || !a->n ? 0 : a->n - 1);
    char *o = malloc(total + 1);
    if (!o) return lt_error(ctx, LT_ERR_OOM, "decoded text of %zu bytes", total);
    size_t w = 0;
    for (size_t i = 0; i < a->n; i++) {
        if (i && spaced) o[w++] = ' ';
        size_t pn;
        const char *p = piece(a, i, &pn);
        memcpy(o + w, p, pn);
        w += pn;
    }
    o[w] = '\0';
    *text = o;
    *len = w;
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
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "token id %d at position %zu is not in the vocabulary (size %d)", id,
                         i, tok->n_vocab);
            goto done;
        }
        if (skip_special && tok->tok_special[id]) continue;
        if ((s = pl_add(ctx, &a, tok->blob + tok->tok_off[id], tok->tok_len[id])) != LT_OK) goto done;
    }
    for (int k = 0; tok->has_decoder && k < tok->n_decs; k++) {
        if ((s = decode_step(ctx, &tok->decs[k], &a, &b)) != LT_OK) goto done;
        pl_free(ctx, &a);
        a = b;
        memset(&b, 0, sizeof b);
    }
    s = join(ctx, &a, !tok->has_decoder, text, len);
done:
    pl_free(ctx, &a);
    pl_free(ctx, &b);
    return s;
}
