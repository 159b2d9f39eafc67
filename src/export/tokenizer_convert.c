/* Tokenizer conversions between GGUF metadata and Hugging Face tokenizer files, for the two BPE
 * kinds: byte-level ("gpt2": the smollm, qwen2, llama-bpe and gpt-2 pre-tokenizers) and
 * SentencePiece with byte fallback ("llama"). GGUF → tokenizer.json + tokenizer_config.json
 * (vocabulary, merges -- derived from the piece scores for SentencePiece --, added and special
 * tokens, normalizer / pre-tokenizer / decoder, chat template) and tokenizer.json →
 * tokenizer.ggml.* keys as convert_hf_to_gguf.py writes them (SentencePiece scores derived from
 * the merge ranks). Other vocabularies (WordPiece, Unigram, other pre-tokenizers) are refused with
 * LT_ERR_UNSUPPORTED naming the kind, so the caller can say what was not carried over. */
#include <stdlib.h>
#include <string.h>

#include "export/export_internal.h"
#include "longtune/alloc.h"

#define RE_QWEN2                                                                                                      \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|" \
    "\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                                                            \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

static cJSON *byte_level(int add_prefix_space, int trim_offsets, int use_regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

static cJSON *split_then_bytes(const char *re) {
    cJSON *seq = cJSON_CreateObject();
    cJSON_AddStringToObject(seq, "type", "Sequence");
    cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
    cJSON *sp = cJSON_CreateObject();
    cJSON_AddStringToObject(sp, "type", "Split");
    cJSON *pat = cJSON_AddObjectToObject(sp, "pattern");
    cJSON_AddStringToObject(pat, "Regex", re);
    cJSON_AddStringToObject(sp, "behavior", "Isolated");
    cJSON_AddFalseToObject(sp, "invert");
    cJSON_AddItemToArray(list, sp);
    cJSON_AddItemToArray(list, byte_level(0, 0, 0));
    return seq;
}

/* The pre-tokenizer of a llama.cpp pre name; NULL when longtune has no mapping for it. */
static cJSON *pre_tokenizer(const char *pre, int *ignore_merges) {
    *ignore_merges = 0;
    if (!strcmp(pre, "smollm")) {
        cJSON *seq = cJSON_CreateObject();
        cJSON_AddStringToObject(seq, "type", "Sequence");
        cJSON *list = cJSON_AddArrayToObject(seq, "pretokenizers");
        cJSON *dg = cJSON_CreateObject();
        cJSON_AddStringToObject(dg, "type", "Digits");
        cJSON_AddTrueToObject(dg, "individual_digits");
        cJSON_AddItemToArray(list, dg);
        cJSON_AddItemToArray(list, byte_level(0, 1, 1));
        return seq;
    }
    if (!strcmp(pre, "qwen2")) return split_then_bytes(RE_QWEN2);
    if (!strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3")) {
        *ignore_merges = 1;
        return split_then_bytes(RE_LLAMA3);
    }
    if (!strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2") || !strcmp(pre, "default")) return byte_level(0, 1, 1);
    return NULL;
}

/* ---- SentencePiece BPE ("llama" vocabularies), laid out as transformers' LlamaTokenizerFast ---- */

static cJSON *replace(const char *from, const char *to) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Replace");
    cJSON *p = cJSON_AddObjectToObject(o, "pattern");
    cJSON_AddStringToObject(p, "String", from);
    cJSON_AddStringToObject(o, "content", to);
    return o;
}

static cJSON *spm_normalizer(int add_space) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Sequence");
    cJSON *l = cJSON_AddArrayToObject(o, "normalizers");
    if (add_space) {
        cJSON *pre = cJSON_CreateObject();
        cJSON_AddStringToObject(pre, "type", "Prepend");
        cJSON_AddStringToObject(pre, "prepend", "\xe2\x96\x81");
        cJSON_AddItemToArray(l, pre);
    }
    cJSON_AddItemToArray(l, replace(" ", "\xe2\x96\x81"));
    return o;
}

static cJSON *spm_decoder(int add_space) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Sequence");
    cJSON *l = cJSON_AddArrayToObject(o, "decoders");
    cJSON_AddItemToArray(l, replace("\xe2\x96\x81", " "));
    cJSON *bf = cJSON_CreateObject(), *fu = cJSON_CreateObject();
    cJSON_AddStringToObject(bf, "type", "ByteFallback");
    cJSON_AddStringToObject(fu, "type", "Fuse");
    cJSON_AddItemToArray(l, bf);
    cJSON_AddItemToArray(l, fu);
    if (add_space) {
        cJSON *st = cJSON_CreateObject();
        cJSON_AddStringToObject(st, "type", "Strip");
        cJSON_AddStringToObject(st, "content", " ");
        cJSON_AddNumberToObject(st, "start", 1);
        cJSON_AddNumberToObject(st, "stop", 0);
        cJSON_AddItemToArray(l, st);
    }
    return o;
}

typedef struct piece_ref {
    const char *s;
    size_t n;
} piece_ref;

typedef struct spm_merge {
    int32_t l, r;
    float score;
    int64_t order;
} spm_merge;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return h;
}

static int32_t lookup(const piece_ref *p, const int32_t *table, size_t cap, const char *s, size_t n) {
    for (size_t h = (size_t)hash_bytes(s, n) & (cap - 1);; h = (h + 1) & (cap - 1)) {
        int32_t id = table[h];
        if (id < 0) return -1;
        if (p[id].n == n && !memcmp(p[id].s, s, n)) return id;
    }
}

static int cmp_local(const void *a, const void *b) {
    const spm_merge *x = a, *y = b;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return (x->r > y->r) - (x->r < y->r);
}

static int cmp_score(const void *a, const void *b) { /* score descending, then generation order */
    const spm_merge *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

/* The merges a SentencePiece BPE model implies, as transformers' SentencePieceExtractor derives
 * them: every split of every piece (at character boundaries) whose two halves are pieces, ranked
 * by the merged piece's score (ties: piece order, then the halves' ids). */
static lt_status spm_merges(lt_ctx *ctx, const lt_gguf *g, uint64_t n, cJSON *out) {
    size_t cap = 1;
    while (cap < 2 * n) cap <<= 1;
    size_t bytes = (size_t)n * (sizeof(piece_ref) + sizeof(float)) + cap * sizeof(int32_t);
    piece_ref *p = lt_alloc(ctx, LT_DEVICE_CPU, bytes, "tokenizer pieces");
    if (!p) return lt_ctx_status(ctx);
    float *score = (float *)(p + n);
    int32_t *table = (int32_t *)(score + n);
    memset(table, 0xff, cap * sizeof(int32_t));
    spm_merge *m = NULL;
    size_t nm = 0, mcap = 0, mbytes = 0;
    lt_status s = LT_OK;
    for (uint64_t i = 0; i < n && s == LT_OK; i++) {
        s = lt_gguf_array_str(ctx, g, "tokenizer.ggml.tokens", i, &p[i].s, &p[i].n);
        double sc = 0;
        if (s == LT_OK && lt_gguf_array_f64(ctx, g, "tokenizer.ggml.scores", i, &sc) != LT_OK) {
            s = lt_error(ctx, LT_ERR_FORMAT, "tokenizer.ggml.scores lacks entry %llu", (unsigned long long)i);
            break;
        }
        score[i] = (float)sc;
        if (s == LT_OK && lookup(p, table, cap, p[i].s, p[i].n) < 0) {
            size_t h = (size_t)hash_bytes(p[i].s, p[i].n) & (cap - 1);
            while (table[h] >= 0) h = (h + 1) & (cap - 1);
            table[h] = (int32_t)i;
        }
    }
    for (uint64_t i = 0; i < n && s == LT_OK; i++) {
        size_t first = nm;
        for (size_t k = 1; k < p[i].n; k++) {
            if (((uint8_t)p[i].s[k] & 0xc0) == 0x80) continue; /* inside a UTF-8 character */
            int32_t l = lookup(p, table, cap, p[i].s, k), r = lookup(p, table, cap, p[i].s + k, p[i].n - k);
            if (l < 0 || r < 0) continue;
            if (nm == mcap) {
                size_t nc = mcap ? 2 * mcap : 1024, nb = nc * sizeof *m;
                spm_merge *nmv = lt_alloc(ctx, LT_DEVICE_CPU, nb, "tokenizer merges");
                if (!nmv) {
                    s = lt_ctx_status(ctx);
                    break;
                }
                if (m) {
                    memcpy(nmv, m, nm * sizeof *m);
                    lt_free(ctx, LT_DEVICE_CPU, m, mbytes);
                }
                m = nmv;
                mcap = nc;
                mbytes = nb;
            }
            m[nm++] = (spm_merge){l, r, score[i], 0};
        }
        if (nm > first) qsort(m + first, nm - first, sizeof *m, cmp_local);
        for (size_t k = first; k < nm; k++) m[k].order = (int64_t)k;
    }
    if (s == LT_OK && nm) qsort(m, nm, sizeof *m, cmp_score);
    for (size_t k = 0; k < nm && s == LT_OK; k++) {
        cJSON *pair = cJSON_CreateArray();
        char *a = malloc(p[m[k].l].n + 1), *b = malloc(p[m[k].r].n + 1); /* transient */
        if (!pair || !a || !b) s = lt_error(ctx, LT_ERR_OOM, "tokenizer merges");
        else {
            memcpy(a, p[m[k].l].s, p[m[k].l].n);
            a[p[m[k].l].n] = 0;
            memcpy(b, p[m[k].r].s, p[m[k].r].n);
            b[p[m[k].r].n] = 0;
            cJSON_AddItemToArray(pair, cJSON_CreateString(a));
            cJSON_AddItemToArray(pair, cJSON_CreateString(b));
            cJSON_AddItemToArray(out, pair);
            pair = NULL;
        }
        cJSON_Delete(pair);
        free(a);
        free(b);
    }
    if (m) lt_free(ctx, LT_DEVICE_CPU, m, mbytes);
    lt_free(ctx, LT_DEVICE_CPU, p, bytes);
    return s;
}

static int gguf_id(lt_ctx *ctx, const lt_gguf *g, const char *key) {
    int64_t v;
    if (lt_gguf_get_i64(ctx, g, key, &v) != LT_OK) {
        lt_ctx_clear_error(ctx);
        return -1;
    }
    return v >= 0 && v < INT32_MAX ? (int)v : -1;
}

lt_status lt_ex_tokenizer_from_gguf(lt_ctx *ctx, const lt_ex_base *b, char **tokenizer_json, cJSON **tokenizer_config) {
    const lt_gguf *g = b->gg;
    char model[32] = "", pre[64] = "default";
    *tokenizer_json = NULL;
    *tokenizer_config = NULL;
    if (!lt_ex_gguf_str(ctx, g, "tokenizer.ggml.model", model, sizeof model))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s has no tokenizer.ggml.model", b->path);
    int spm = !strcmp(model, "llama");
    if (strcmp(model, "gpt2") && !spm)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "the GGUF vocabulary is '%s'; byte-level BPE ('gpt2') and SentencePiece BPE ('llama') convert "
                        "to tokenizer.json",
                        model);
    lt_ex_gguf_str(ctx, g, "tokenizer.ggml.pre", pre, sizeof pre);
    int ignore_merges = 0, add_space = 1;
    cJSON *pt = spm ? cJSON_CreateNull() : pre_tokenizer(pre, &ignore_merges);
    if (!pt)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "the GGUF pre-tokenizer '%s' has no tokenizer.json form here", pre);
    if (spm && lt_gguf_get_bool(ctx, g, "tokenizer.ggml.add_space_prefix", &add_space) != LT_OK) add_space = 1;
    lt_ctx_clear_error(ctx);
    lt_gguf_type et;
    uint64_t n = 0, nm = 0, ntt = 0;
    lt_status s = lt_gguf_get_array(ctx, g, "tokenizer.ggml.tokens", &et, &n);
    if (s != LT_OK || et != LT_GGUF_STRING || n == 0 || n > INT32_MAX) {
        cJSON_Delete(pt);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: tokenizer.ggml.tokens is not a string array", b->path);
    }
    if (lt_gguf_get_array(ctx, g, "tokenizer.ggml.merges", &et, &nm) != LT_OK || et != LT_GGUF_STRING) nm = 0;
    if (lt_gguf_get_array(ctx, g, "tokenizer.ggml.token_type", &et, &ntt) != LT_OK) ntt = 0;
    lt_ctx_clear_error(ctx);
    cJSON *root = cJSON_CreateObject(), *tc = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddItemToObject(root, "normalizer", spm ? spm_normalizer(add_space) : cJSON_CreateNull());
    cJSON_AddItemToObject(root, "pre_tokenizer", pt);
    int bos = gguf_id(ctx, g, "tokenizer.ggml.bos_token_id"), eos = gguf_id(ctx, g, "tokenizer.ggml.eos_token_id");
    int unk = gguf_id(ctx, g, "tokenizer.ggml.unknown_token_id"),
        pad = gguf_id(ctx, g, "tokenizer.ggml.padding_token_id");
    int add_bos = 0;
    if (lt_gguf_get_bool(ctx, g, "tokenizer.ggml.add_bos_token", &add_bos) != LT_OK) add_bos = 0;
    lt_ctx_clear_error(ctx);
    cJSON *model_o = cJSON_CreateObject();
    cJSON_AddStringToObject(model_o, "type", "BPE");
    cJSON_AddNullToObject(model_o, "dropout");
    cJSON_AddNullToObject(model_o, "unk_token"); /* SentencePiece: replaced by the unknown token below */
    cJSON_AddNullToObject(model_o, "continuing_subword_prefix");
    cJSON_AddNullToObject(model_o, "end_of_word_suffix");
    cJSON_AddBoolToObject(model_o, "fuse_unk", spm);
    cJSON_AddBoolToObject(model_o, "byte_fallback", spm);
    cJSON_AddBoolToObject(model_o, "ignore_merges", ignore_merges);
    cJSON *vocab = cJSON_AddObjectToObject(model_o, "vocab");
    char *tmp = NULL;
    size_t tmp_cap = 0;
    const char *bos_s = NULL, *eos_s = NULL, *unk_s = NULL, *pad_s = NULL;
    for (uint64_t i = 0; i < n && s == LT_OK; i++) {
        const char *t;
        size_t tl;
        if ((s = lt_gguf_array_str(ctx, g, "tokenizer.ggml.tokens", i, &t, &tl)) != LT_OK) break;
        if (tl + 1 > tmp_cap) {
            free(tmp);
            tmp_cap = tl + 64;
            tmp = malloc(tmp_cap); /* transient: one token at a time */
            if (!tmp) {
                s = lt_error(ctx, LT_ERR_OOM, "tokenizer conversion");
                break;
            }
        }
        memcpy(tmp, t, tl);
        tmp[tl] = 0;
        cJSON *item = cJSON_CreateNumber((double)i);
        cJSON_AddItemToObject(vocab, tmp, item);
        int64_t type = 1;
        if (i < ntt && lt_gguf_array_i64(ctx, g, "tokenizer.ggml.token_type", i, &type) != LT_OK) type = 1;
        if (type == 3 || type == 4 || (spm && type == 2)) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", tmp);
            cJSON_AddFalseToObject(a, "single_word");
            cJSON_AddFalseToObject(a, "lstrip");
            cJSON_AddFalseToObject(a, "rstrip");
            cJSON_AddBoolToObject(a, "normalized", type == 4);
            cJSON_AddBoolToObject(a, "special", type != 4);
            cJSON_AddItemToArray(added, a);
        }
        if ((int64_t)i == bos) bos_s = cJSON_GetArrayItem(vocab, cJSON_GetArraySize(vocab) - 1)->string;
        if ((int64_t)i == eos) eos_s = cJSON_GetArrayItem(vocab, cJSON_GetArraySize(vocab) - 1)->string;
        if ((int64_t)i == unk) unk_s = cJSON_GetArrayItem(vocab, cJSON_GetArraySize(vocab) - 1)->string;
        if ((int64_t)i == pad) pad_s = cJSON_GetArrayItem(vocab, cJSON_GetArraySize(vocab) - 1)->string;
    }
    free(tmp);
    cJSON *merges = cJSON_AddArrayToObject(model_o, "merges");
    if (spm && s == LT_OK) s = spm_merges(ctx, g, n, merges);
    for (uint64_t i = 0; i < nm && s == LT_OK && !spm; i++) {
        const char *t;
        size_t tl;
        if ((s = lt_gguf_array_str(ctx, g, "tokenizer.ggml.merges", i, &t, &tl)) != LT_OK) break;
        char *m = malloc(tl + 1); /* transient */
        if (!m) {
            s = lt_error(ctx, LT_ERR_OOM, "tokenizer conversion");
            break;
        }
        memcpy(m, t, tl);
        m[tl] = 0;
        cJSON_AddItemToArray(merges, cJSON_CreateString(m));
        free(m);
    }
    if (add_bos && bos_s) {
        cJSON *tp = cJSON_CreateObject();
        cJSON_AddStringToObject(tp, "type", "TemplateProcessing");
        for (int pair = 0; pair < 2; pair++) {
            cJSON *arr = cJSON_AddArrayToObject(tp, pair ? "pair" : "single");
            for (int part = 0; part < 1 + pair; part++) {
                cJSON *st = cJSON_CreateObject(), *sto = cJSON_AddObjectToObject(st, "SpecialToken");
                cJSON_AddStringToObject(sto, "id", bos_s);
                cJSON_AddNumberToObject(sto, "type_id", part);
                cJSON_AddItemToArray(arr, st);
                cJSON *sq = cJSON_CreateObject(), *sqo = cJSON_AddObjectToObject(sq, "Sequence");
                cJSON_AddStringToObject(sqo, "id", part ? "B" : "A");
                cJSON_AddNumberToObject(sqo, "type_id", part);
                cJSON_AddItemToArray(arr, sq);
            }
        }
        cJSON *sp = cJSON_AddObjectToObject(tp, "special_tokens"), *e = cJSON_AddObjectToObject(sp, bos_s);
        cJSON_AddStringToObject(e, "id", bos_s);
        cJSON *ids = cJSON_AddArrayToObject(e, "ids");
        cJSON_AddItemToArray(ids, cJSON_CreateNumber(bos));
        cJSON *toks = cJSON_AddArrayToObject(e, "tokens");
        cJSON_AddItemToArray(toks, cJSON_CreateString(bos_s));
        cJSON_AddItemToObject(root, "post_processor", tp);
    } else {
        cJSON_AddItemToObject(root, "post_processor", spm ? cJSON_CreateNull() : byte_level(1, 0, 1));
    }
    cJSON_AddItemToObject(root, "decoder", spm ? spm_decoder(add_space) : byte_level(1, 1, 1));
    if (spm && unk_s) cJSON_ReplaceItemInObjectCaseSensitive(model_o, "unk_token", cJSON_CreateString(unk_s));
    cJSON_AddItemToObject(root, "model", model_o);
    cJSON_AddBoolToObject(tc, "add_bos_token", add_bos);
    cJSON_AddFalseToObject(tc, "add_eos_token");
    if (bos_s) cJSON_AddStringToObject(tc, "bos_token", bos_s);
    if (eos_s) cJSON_AddStringToObject(tc, "eos_token", eos_s);
    if (unk_s) cJSON_AddStringToObject(tc, "unk_token", unk_s);
    if (pad_s) cJSON_AddStringToObject(tc, "pad_token", pad_s);
    cJSON_AddFalseToObject(tc, "clean_up_tokenization_spaces");
    cJSON_AddNumberToObject(tc, "model_max_length", (double)b->cfg.max_positions);
    cJSON_AddStringToObject(tc, "tokenizer_class", "PreTrainedTokenizerFast");
    const char *tpl;
    size_t tpl_len;
    if (lt_gguf_get_str(ctx, g, "tokenizer.chat_template", &tpl, &tpl_len) == LT_OK) {
        char *t = malloc(tpl_len + 1); /* transient */
        if (t) {
            memcpy(t, tpl, tpl_len);
            t[tpl_len] = 0;
            cJSON_AddStringToObject(tc, "chat_template", t);
            free(t);
        }
    }
    lt_ctx_clear_error(ctx);
    if (s == LT_OK) {
        *tokenizer_json = cJSON_PrintUnformatted(root);
        if (!*tokenizer_json) s = lt_error(ctx, LT_ERR_OOM, "tokenizer.json");
    }
    cJSON_Delete(root);
    if (s != LT_OK) {
        cJSON_Delete(tc);
        return s;
    }
    *tokenizer_config = tc;
    return LT_OK;
}

/* ---- HF → GGUF ---- */

/* SentencePiece scores for llama.cpp's SPM tokenizer, which merges the adjacent pair whose
 * concatenation is the highest-scoring piece: a piece made by merge i of tokenizer.json scores -i
 * (earlier merges win, as SentencePiece's scores order them); pieces no merge makes score 0 (they
 * are never a merge result, so their score is not compared). */
static lt_status spm_scores(lt_ctx *ctx, const char *const *toks, int64_t V, const cJSON *merges, lt_gguf_writer *w) {
    size_t cap = 1;
    while (cap < 2 * (size_t)V) cap <<= 1;
    size_t bytes = (size_t)V * (sizeof(piece_ref) + sizeof(float) + 1) + cap * sizeof(int32_t);
    piece_ref *p = lt_alloc(ctx, LT_DEVICE_CPU, bytes, "tokenizer scores");
    if (!p) return lt_ctx_status(ctx);
    int32_t *table = (int32_t *)(p + V);
    float *score = (float *)(table + cap);
    uint8_t *set = (uint8_t *)(score + V);
    memset(table, 0xff, cap * sizeof(int32_t));
    memset(set, 0, (size_t)V);
    for (int64_t i = 0; i < V; i++) {
        p[i].s = toks[i];
        p[i].n = strlen(toks[i]);
        score[i] = 0;
        if (lookup(p, table, cap, p[i].s, p[i].n) < 0) {
            size_t h = (size_t)hash_bytes(p[i].s, p[i].n) & (cap - 1);
            while (table[h] >= 0) h = (h + 1) & (cap - 1);
            table[h] = (int32_t)i;
        }
    }
    lt_status s = LT_OK;
    char buf[1024];
    int64_t rank = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *x = NULL, *y = NULL;
        const char *sp = cJSON_IsString(e) ? strchr(e->valuestring, ' ') : NULL;
        size_t lx, ly;
        if (sp) x = e->valuestring, lx = (size_t)(sp - x), y = sp + 1, ly = strlen(y);
        else if (cJSON_IsArray(e)) {
            x = cJSON_GetStringValue(cJSON_GetArrayItem(e, 0));
            y = cJSON_GetStringValue(cJSON_GetArrayItem(e, 1));
            lx = x ? strlen(x) : 0;
            ly = y ? strlen(y) : 0;
        }
        if (!x || !y) {
            s = lt_error(ctx, LT_ERR_FORMAT, "tokenizer.json: merge %lld is neither \"a b\" nor [a, b]",
                         (long long)rank);
            break;
        }
        if (lx + ly < sizeof buf) {
            memcpy(buf, x, lx);
            memcpy(buf + lx, y, ly);
            int32_t id = lookup(p, table, cap, buf, lx + ly);
            if (id >= 0 && !set[id]) score[id] = -(float)rank, set[id] = 1;
        }
        rank++;
    }
    if (s == LT_OK) s = lt_gguf_writer_set_array(ctx, w, "tokenizer.ggml.scores", LT_GGUF_F32, score, (uint64_t)V);
    lt_free(ctx, LT_DEVICE_CPU, p, bytes);
    return s;
}

static const char *token_text(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
    return cJSON_IsString(c) ? c->valuestring : NULL;
}

static const char *detect_pre(const cJSON *pt) {
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pt, "type"));
    if (!type) return NULL;
    if (!strcmp(type, "ByteLevel")) return "gpt-2";
    if (strcmp(type, "Sequence")) return NULL;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers"), *e;
    int digits = 0, bytes = 0;
    const char *re = NULL;
    cJSON_ArrayForEach(e, list) {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "type"));
        if (!t) return NULL;
        if (!strcmp(t, "Digits") && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "individual_digits"))) digits = 1;
        else if (!strcmp(t, "ByteLevel")) bytes = 1;
        else if (!strcmp(t, "Split"))
            re = cJSON_GetStringValue(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "pattern"), "Regex"));
        else return NULL;
    }
    if (!bytes) return NULL;
    if (digits && !re) return "smollm";
    if (re && !strcmp(re, RE_QWEN2)) return "qwen2";
    if (re && !strcmp(re, RE_LLAMA3)) return "llama-bpe";
    return NULL;
}

/* Whether the post-processor puts a special token first (a TemplateProcessing, alone or in a
 * Sequence), which is how a tokenizer.json without tokenizer_config.json adds BOS. */
static int template_bos_id(const cJSON *tj, const cJSON *vocab, const cJSON *added);
static int find_id(const cJSON *vocab, const cJSON *added, const char *tok);

static int template_adds_bos(const cJSON *tj) {
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(tj, "post_processor"), *e;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(pp, "type"));
    if (type && !strcmp(type, "Sequence")) {
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "type"));
            if (t && !strcmp(t, "TemplateProcessing")) pp = e, type = t;
        }
    }
    if (!type || strcmp(type, "TemplateProcessing")) return 0;
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(pp, "single"), 0);
    return cJSON_GetObjectItemCaseSensitive(first, "SpecialToken") != NULL;
}

/* The id of that first special token, or -1. */
static int template_bos_id(const cJSON *tj, const cJSON *vocab, const cJSON *added) {
    if (!template_adds_bos(tj)) return -1;
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(tj, "post_processor"), *e, *tp = pp;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(pp, "processors")) {
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "type"));
        if (t && !strcmp(t, "TemplateProcessing")) tp = e;
    }
    const cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(tp, "single"), 0);
    const char *tok = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(first, "SpecialToken"), "id"));
    return find_id(vocab, added, tok);
}

static int find_id(const cJSON *vocab, const cJSON *added, const char *tok) {
    if (!tok) return -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, added) {
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "content"));
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (c && cJSON_IsNumber(id) && !strcmp(c, tok)) return id->valueint;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(vocab, tok);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}

lt_status lt_ex_tokenizer_to_gguf(lt_ctx *ctx, const lt_ex_base *b, lt_gguf_writer *w, char *note, size_t note_n) {
    char p[EX_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/tokenizer.json", b->dir);
    char *text;
    size_t n;
    LT_TRY(lt_ex_read_file(ctx, p, (size_t)256 << 20, &text, &n));
    cJSON *tj = cJSON_ParseWithLength(text, n);
    free(text);
    if (!tj) return lt_error(ctx, LT_ERR_FORMAT, "%s: not JSON", p);
    cJSON *tc = NULL;
    char pc[EX_PATH_MAX + 32];
    snprintf(pc, sizeof pc, "%s/tokenizer_config.json", b->dir);
    if (lt_ex_read_file(ctx, pc, (size_t)64 << 20, &text, &n) == LT_OK) {
        tc = cJSON_ParseWithLength(text, n);
        free(text);
    }
    lt_ctx_clear_error(ctx);
    lt_status s = LT_OK;
    const char **toks = NULL;
    int32_t *types = NULL;
    size_t tbytes = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(tj, "added_tokens");
    const char *mtype = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(model, "type"));
    const char *pre = detect_pre(cJSON_GetObjectItemCaseSensitive(tj, "pre_tokenizer"));
    int spm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    if (!mtype || strcmp(mtype, "BPE") || !cJSON_IsObject(vocab) || !cJSON_IsArray(merges)) {
        s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                     "%s: only BPE tokenizers (byte-level or SentencePiece with byte fallback) convert to GGUF "
                     "metadata, not model type %s",
                     p, mtype ? mtype : "?");
        goto done;
    }
    if (!pre && !spm) {
        s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: the pre-tokenizer matches none of gpt-2, smollm, qwen2, llama-bpe",
                     p);
        goto done;
    }
    int64_t V = b->cfg.V;
    tbytes = (size_t)V * (sizeof(char *) + sizeof(int32_t) + 16);
    toks = lt_calloc(ctx, LT_DEVICE_CPU, tbytes, "tokenizer conversion");
    if (!toks) {
        s = lt_ctx_status(ctx);
        goto done;
    }
    types = (int32_t *)(toks + V);
    char *pads = (char *)(types + V);
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (double)V) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: vocab entry '%s' has an id outside [0, %lld)", p, e->string,
                         (long long)V);
            goto done;
        }
        toks[e->valueint] = e->string;
        types[e->valueint] = 1;
    }
    cJSON_ArrayForEach(e, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        const char *c = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "content"));
        if (!cJSON_IsNumber(id) || !c || id->valuedouble < 0 || id->valuedouble >= (double)V) continue;
        toks[id->valueint] = c;
        types[id->valueint] = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "special")) ? 3 : 4;
        if ((cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "lstrip")) ||
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "rstrip")) ||
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "single_word"))) &&
            !note[0])
            snprintf(note, note_n,
                     "added token '%.64s' strips or matches whole words (lstrip/rstrip/single_word), which GGUF "
                     "metadata cannot carry: text around it may tokenize differently",
                     c);
    }
    for (int64_t i = 0; i < V; i++)
        if (!toks[i]) { /* the embedding is larger than the vocabulary: convert_hf_to_gguf pads */
            snprintf(pads + 16 * i, 16, "[PAD%d]", (int)i);
            toks[i] = pads + 16 * i;
            types[i] = 5;
        }
    if (spm) {
        const char *unk = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(model, "unk_token"));
        for (int64_t i = 0; i < V; i++) {
            size_t l = strlen(toks[i]);
            if (types[i] == 1 && l == 6 && !strncmp(toks[i], "<0x", 3) && toks[i][5] == '>') types[i] = 6;
            if (unk && !strcmp(toks[i], unk)) types[i] = 2;
        }
        if ((s = lt_gguf_writer_set_str(ctx, w, "tokenizer.ggml.model", "llama", 5)) != LT_OK) goto done;
        if ((s = lt_gguf_writer_set_array_str(ctx, w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)V)) != LT_OK)
            goto done;
        if ((s = spm_scores(ctx, toks, V, merges, w)) != LT_OK) goto done;
        if ((s = lt_gguf_writer_set_array(ctx, w, "tokenizer.ggml.token_type", LT_GGUF_I32, types, (uint64_t)V)) !=
            LT_OK)
            goto done;
        int prepend = 0;
        const cJSON *nz = cJSON_GetObjectItemCaseSensitive(tj, "normalizer");
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(nz, "normalizers")) {
            const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "type"));
            if (t && !strcmp(t, "Prepend")) prepend = 1;
        }
        if ((s = lt_gguf_writer_set_bool(ctx, w, "tokenizer.ggml.add_space_prefix", prepend)) != LT_OK) goto done;
    } else {
        if ((s = lt_gguf_writer_set_str(ctx, w, "tokenizer.ggml.model", "gpt2", 4)) != LT_OK) goto done;
        if ((s = lt_gguf_writer_set_str(ctx, w, "tokenizer.ggml.pre", pre, strlen(pre))) != LT_OK) goto done;
        if ((s = lt_gguf_writer_set_array_str(ctx, w, "tokenizer.ggml.tokens", toks, NULL, (uint64_t)V)) != LT_OK)
            goto done;
        if ((s = lt_gguf_writer_set_array(ctx, w, "tokenizer.ggml.token_type", LT_GGUF_I32, types, (uint64_t)V)) !=
            LT_OK)
            goto done;
    }
    if (!spm) {
        int64_t nm = cJSON_GetArraySize(merges), i = 0;
        size_t mbytes = (size_t)nm * sizeof(char *);
        const char **ms = lt_calloc(ctx, LT_DEVICE_CPU, mbytes ? mbytes : 1, "tokenizer merges");
        char **owned = NULL;
        size_t obytes = (size_t)nm * sizeof(char *);
        if (ms) owned = lt_calloc(ctx, LT_DEVICE_CPU, obytes ? obytes : 1, "tokenizer merges");
        if (!ms || !owned) {
            s = lt_ctx_status(ctx);
            if (ms) lt_free(ctx, LT_DEVICE_CPU, ms, mbytes ? mbytes : 1);
            goto done;
        }
        cJSON_ArrayForEach(e, merges) {
            if (cJSON_IsString(e)) ms[i] = e->valuestring;
            else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2) { /* tokenizers >= 0.20: ["a", "b"] */
                const char *x = cJSON_GetStringValue(cJSON_GetArrayItem(e, 0)),
                           *y = cJSON_GetStringValue(cJSON_GetArrayItem(e, 1));
                if (x && y && (owned[i] = malloc(strlen(x) + strlen(y) + 2))) { /* transient */
                    sprintf(owned[i], "%s %s", x, y);
                    ms[i] = owned[i];
                }
            }
            if (!ms[i]) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: merge %lld is neither \"a b\" nor [a, b]", p, (long long)i);
                break;
            }
            i++;
        }
        if (s == LT_OK) s = lt_gguf_writer_set_array_str(ctx, w, "tokenizer.ggml.merges", ms, NULL, (uint64_t)nm);
        for (int64_t j = 0; j < nm; j++) free(owned[j]);
        lt_free(ctx, LT_DEVICE_CPU, owned, obytes ? obytes : 1);
        lt_free(ctx, LT_DEVICE_CPU, ms, mbytes ? mbytes : 1);
        if (s != LT_OK) goto done;
    }
    {
        static const char *const keys[4][2] = {{"bos_token", "tokenizer.ggml.bos_token_id"},
                                               {"eos_token", "tokenizer.ggml.eos_token_id"},
                                               {"unk_token", "tokenizer.ggml.unknown_token_id"},
                                               {"pad_token", "tokenizer.ggml.padding_token_id"}};
        for (int k = 0; k < 4; k++) {
            int id = find_id(vocab, added, token_text(cJSON_GetObjectItemCaseSensitive(tc, keys[k][0])));
            if (id < 0 && k == 0) id = template_bos_id(tj, vocab, added);
            if (id < 0 && k == 0) id = b->cfg.bos_id;
            if (id < 0 && k == 1) id = b->cfg.eos_id;
            if (id >= 0 && (s = lt_gguf_writer_set_u32(ctx, w, keys[k][1], (uint32_t)id)) != LT_OK) goto done;
        }
        const cJSON *ab = cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token");
        int add_bos = cJSON_IsBool(ab) ? cJSON_IsTrue(ab) : template_adds_bos(tj);
        if ((s = lt_gguf_writer_set_bool(ctx, w, "tokenizer.ggml.add_bos_token", add_bos)) != LT_OK) goto done;
        const char *tpl = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(tc, "chat_template"));
        char *jinja = NULL;
        size_t jl = 0;
        if (!tpl) {
            char pj[EX_PATH_MAX + 32];
            snprintf(pj, sizeof pj, "%s/chat_template.jinja", b->dir);
            if (lt_ex_read_file(ctx, pj, (size_t)1 << 24, &jinja, &jl) == LT_OK) tpl = jinja;
            lt_ctx_clear_error(ctx);
        }
        if (tpl) s = lt_gguf_writer_set_str(ctx, w, "tokenizer.chat_template", tpl, strlen(tpl));
        else if (!note[0]) snprintf(note, note_n, "the base has no chat template");
        free(jinja);
    }
done:
    if (toks) lt_free(ctx, LT_DEVICE_CPU, toks, tbytes);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    return s;
}
