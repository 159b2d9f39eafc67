/* Tokenizers against the Hugging Face `tokenizers` library: for each committed family
 * (tests/fixtures/tokenizer/<family>/, written by tests/oracle/gen_tokenizer_fixtures.py) every
 * corpus record must encode to the same ids, with and without special tokens, and decode to the
 * same text; decode(encode(s)) == s for valid UTF-8 wherever HF round-trips too, and always for
 * the byte-level families on random text. SmolLM2 is checked through the real GGUF when it is
 * installed. Also: typed errors for unsupported or malformed files, allocation failures, threads. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

typedef struct record {
    char *bytes;
    size_t len;
    int valid_utf8; /* a "text" record (not raw hex) */
} record;

typedef struct expect {
    int skip; /* the family leaves this record out */
    int32_t *ids, *ids_sp;
    size_t n, n_sp;
    char *decoded;
} expect;

static record *corpus;
static size_t n_corpus;

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    if (len) *len = (size_t)n;
    return b;
}

static void fixture_path(char *out, size_t cap, const char *rel) {
    snprintf(out, cap, "%s/tests/fixtures/tokenizer/%s", lt_test_source_dir(), rel);
}

/* Calls fn(line, ctx) for each line of a JSONL file. */
static size_t for_each_line(const char *path, void (*fn)(cJSON *, size_t, void *), void *arg) {
    char *buf = slurp(path, NULL);
    if (!buf) fail_msg("cannot read %s", path);
    size_t i = 0;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"), i++) {
        cJSON *j = cJSON_Parse(line);
        if (!j) fail_msg("%s:%zu: bad JSON", path, i + 1);
        fn(j, i, arg);
        cJSON_Delete(j);
    }
    free(buf);
    return i;
}

static void add_corpus(cJSON *j, size_t i, void *arg) {
    (void)arg;
    corpus = realloc(corpus, (i + 1) * sizeof *corpus);
    record *r = &corpus[i];
    const cJSON *t = cJSON_GetObjectItem(j, "text"), *h = cJSON_GetObjectItem(j, "hex");
    if (cJSON_IsString(t)) {
        /* (cJSON strings end at U+0000, so the corpus holds none.) */
        r->len = strlen(t->valuestring);
        r->bytes = malloc(r->len + 1);
        memcpy(r->bytes, t->valuestring, r->len + 1);
        r->valid_utf8 = 1;
    } else {
        assert_true(cJSON_IsString(h));
        size_t n = strlen(h->valuestring) / 2;
        r->bytes = malloc(n + 1);
        for (size_t k = 0; k < n; k++) {
            unsigned v;
            sscanf(h->valuestring + 2 * k, "%2x", &v);
            r->bytes[k] = (char)v;
        }
        r->len = n;
        r->valid_utf8 = 0;
    }
    n_corpus = i + 1;
}

static int32_t *json_ids(const cJSON *a, size_t *n) {
    *n = (size_t)cJSON_GetArraySize(a);
    int32_t *v = malloc((*n + 1) * sizeof *v);
    size_t k = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) v[k++] = (int32_t)e->valuedouble;
    return v;
}

static void add_expect(cJSON *j, size_t i, void *arg) {
    expect **ex = arg;
    *ex = realloc(*ex, (i + 1) * sizeof **ex);
    expect *e = &(*ex)[i];
    memset(e, 0, sizeof *e);
    if (cJSON_IsTrue(cJSON_GetObjectItem(j, "skip"))) {
        e->skip = 1;
        return;
    }
    e->ids = json_ids(cJSON_GetObjectItem(j, "ids"), &e->n);
    e->ids_sp = json_ids(cJSON_GetObjectItem(j, "ids_special"), &e->n_sp);
    e->decoded = strdup(cJSON_GetObjectItem(j, "decoded")->valuestring);
}

static int setup_corpus(void **state) {
    (void)state;
    char path[1024];
    fixture_path(path, sizeof path, "corpus.jsonl");
    for_each_line(path, add_corpus, NULL);
    return n_corpus > 40 ? 0 : -1;
}

static int teardown_corpus(void **state) {
    (void)state;
    for (size_t i = 0; i < n_corpus; i++) free(corpus[i].bytes);
    free(corpus);
    return 0;
}

static void report_diff(const char *family, size_t rec, const char *what, const int32_t *want, size_t nw,
                        const int32_t *got, size_t ng) {
    size_t k = 0;
    while (k < nw && k < ng && want[k] == got[k]) k++;
    fprintf(stderr, "%s record %zu (%s): first difference at token %zu of %zu/%zu\n  want:", family, rec, what, k, nw,
            ng);
    for (size_t i = k > 3 ? k - 3 : 0; i < nw && i < k + 6; i++) fprintf(stderr, " %d", want[i]);
    fprintf(stderr, "\n  got: ");
    for (size_t i = k > 3 ? k - 3 : 0; i < ng && i < k + 6; i++) fprintf(stderr, " %d", got[i]);
    fprintf(stderr, "\n");
}

static int has(const record *r, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= r->len; i++)
        if (!memcmp(r->bytes + i, needle, k)) return 1;
    return 0;
}

/* Checks one loaded tokenizer against <family>/expected.jsonl; returns the mismatch count.
 * Records containing `skip` (when not NULL) are left out. */
static int check_family_skip(lt_ctx *ctx, const lt_tokenizer *tok, const char *family, int always_round_trip,
                             const char *skip) {
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "%s/expected.jsonl", family);
    fixture_path(path, sizeof path, rel);
    expect *ex = NULL;
    size_t n = for_each_line(path, add_expect, &ex);
    assert_int_equal(n, n_corpus);
    int bad = 0;
    size_t total_ids = 0, skipped = 0;
    for (size_t i = 0; i < n; i++) {
        if (ex[i].skip || (skip && has(&corpus[i], skip))) {
            skipped++;
            continue;
        }
        int32_t *ids;
        size_t k;
        assert_int_equal(lt_tokenizer_encode(ctx, tok, corpus[i].bytes, corpus[i].len, 0, &ids, &k), LT_OK);
        total_ids += k;
        if (k != ex[i].n || memcmp(ids, ex[i].ids, k * sizeof *ids)) {
            report_diff(family, i, "encode", ex[i].ids, ex[i].n, ids, k);
            bad++;
        }
        int32_t *ids2;
        size_t k2;
        assert_int_equal(lt_tokenizer_encode(ctx, tok, corpus[i].bytes, corpus[i].len, 1, &ids2, &k2), LT_OK);
        if (k2 != ex[i].n_sp || memcmp(ids2, ex[i].ids_sp, k2 * sizeof *ids2)) {
            report_diff(family, i, "encode add_special", ex[i].ids_sp, ex[i].n_sp, ids2, k2);
            bad++;
        }
        free(ids2);
        /* Decode the oracle's ids (so a decode bug is not masked by an encode bug). */
        char *text;
        size_t tl;
        assert_int_equal(lt_tokenizer_decode(ctx, tok, ex[i].ids, ex[i].n, 0, &text, &tl), LT_OK);
        if (tl != strlen(ex[i].decoded) || memcmp(text, ex[i].decoded, tl)) {
            fprintf(stderr, "%s record %zu: decode differs:\n  want: %s\n  got:  %.*s\n", family, i, ex[i].decoded,
                    (int)tl, text);
            bad++;
        }
        free(text);
        /* Round trip of our own encoding, for valid UTF-8 wherever HF round-trips as well. */
        int hf_rt = corpus[i].valid_utf8 && strlen(ex[i].decoded) == corpus[i].len &&
            !memcmp(ex[i].decoded, corpus[i].bytes, corpus[i].len);
        if (always_round_trip && corpus[i].valid_utf8 && !hf_rt && memchr(corpus[i].bytes, 0, corpus[i].len) == NULL) {
            fprintf(stderr, "%s record %zu: HF itself does not round-trip this valid UTF-8\n", family, i);
            bad++;
        }
        if (hf_rt) {
            assert_int_equal(lt_tokenizer_decode(ctx, tok, ids, k, 0, &text, &tl), LT_OK);
            if (tl != corpus[i].len || memcmp(text, corpus[i].bytes, tl)) {
                fprintf(stderr, "%s record %zu: decode(encode(s)) != s\n", family, i);
                bad++;
            }
            free(text);
        }
        free(ids);
    }
    fprintf(stderr, "%s: %zu records (%zu skipped), %zu ids, %d mismatches\n", family, n, skipped, total_ids, bad);
    for (size_t i = 0; i < n; i++) {
        free(ex[i].ids);
        free(ex[i].ids_sp);
        free(ex[i].decoded);
    }
    free(ex);
    return bad;
}

static int check_family(lt_ctx *ctx, const lt_tokenizer *tok, const char *family, int always_round_trip) {
    return check_family_skip(ctx, tok, family, always_round_trip, NULL);
}

static void json_family(const char *family, int always_round_trip) {
    lt_ctx *ctx = lt_ctx_new();
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "%s/tokenizer.json", family);
    fixture_path(path, sizeof path, rel);
    lt_tokenizer *tok = NULL;
    lt_status s = lt_tokenizer_load_json(ctx, path, &tok);
    if (s != LT_OK) fail_msg("%s: %s", lt_status_str(s), lt_ctx_error(ctx));
    assert_int_equal(check_family(ctx, tok, family, always_round_trip), 0);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* The bpe-nfc vocabulary under other pre-tokenizers: each Split behaviour and invert, Whitespace,
 * WhitespaceSplit, Digits runs, GPT-2's add_prefix_space, RobertaProcessing. */
static void pre_tokenizer_variants_match_hf(void **state) {
    (void)state;
    json_family("v-gpt2", 0);
    json_family("v-behaviors", 0);
    json_family("v-invert", 0);
    json_family("v-ws", 0);
}

static void bpe_nfc_matches_hf(void **state) {
    (void)state;
    json_family("bpe-nfc", 0);
    /* tokenizer_config.json beside it sets eos/pad and the chat template. */
    lt_ctx *ctx = lt_ctx_new();
    char path[1024];
    fixture_path(path, sizeof path, "bpe-nfc/tokenizer.json");
    lt_tokenizer *tok;
    assert_int_equal(lt_tokenizer_load_json(ctx, path, &tok), LT_OK);
    assert_int_equal(lt_tokenizer_eos(tok), lt_tokenizer_token_id(tok, "<|im_end|>"));
    assert_int_equal(lt_tokenizer_pad(tok), lt_tokenizer_token_id(tok, "<|endoftext|>"));
    assert_int_equal(lt_tokenizer_bos(tok), -1);
    assert_true(lt_tokenizer_token_id(tok, "<|im_end|>") >= 0);
    assert_int_equal(lt_tokenizer_token_id(tok, "<|no such token|>"), -1);
    assert_non_null(lt_tokenizer_chat_template(tok));
    assert_non_null(strstr(lt_tokenizer_chat_template(tok), "<|im_start|>"));
    lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
}

static void bpe_ignore_merges_matches_hf(void **state) {
    (void)state;
    json_family("bpe-im", 0);
}

static void spm_json_matches_hf(void **state) {
    (void)state;
    json_family("spm", 0);
}

static void spm_metaspace_matches_hf(void **state) {
    (void)state;
    json_family("spm-meta", 0);
}

static void spm_metaspace_split_matches_hf(void **state) {
    (void)state;
    json_family("spm-split", 0);
}

static void spm_gguf_matches_hf(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char path[1024];
    fixture_path(path, sizeof path, "spm/tokenizer.gguf");
    lt_gguf *g;
    assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
    lt_tokenizer *tok;
    lt_status s = lt_tokenizer_load_gguf(ctx, g, &tok);
    if (s != LT_OK) fail_msg("%s: %s", lt_status_str(s), lt_ctx_error(ctx));
    lt_gguf_close(g);
    assert_int_equal(lt_tokenizer_bos(tok), 1);
    assert_int_equal(lt_tokenizer_eos(tok), 2);
    assert_int_equal(check_family(ctx, tok, "spm", 0), 0);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* The byte-level families as GGUF metadata (pre = qwen2 and llama-bpe). GGUF cannot carry the
 * lstrip/rstrip flags of their <mask> token, so records containing it are left out. */
static void byte_level_gguf(const char *family) {
    lt_ctx *ctx = lt_ctx_new();
    char path[1024], rel[256];
    snprintf(rel, sizeof rel, "%s/tokenizer.gguf", family);
    fixture_path(path, sizeof path, rel);
    lt_gguf *g;
    assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
    lt_tokenizer *tok;
    lt_status s = lt_tokenizer_load_gguf(ctx, g, &tok);
    if (s != LT_OK) fail_msg("%s: %s", lt_status_str(s), lt_ctx_error(ctx));
    lt_gguf_close(g);
    assert_int_equal(check_family_skip(ctx, tok, family, 0, "<mask>"), 0);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void qwen2_gguf_matches_hf(void **state) {
    (void)state;
    byte_level_gguf("bpe-nfc");
}

static void llama_bpe_gguf_matches_hf(void **state) {
    (void)state;
    byte_level_gguf("bpe-im");
}

/* llama.cpp's own vocabulary tests (models/ggml-vocab-NAME.gguf with .inp/.out, reduced to the
 * tokens those inputs pass through by tests/oracle/gen_tokenizer_fixtures.py --llama-cpp): each
 * input, split as llama.cpp's test-tokenizer-0 splits the .inp file, must encode (without special
 * tokens) to the ids of its .out line, and those ids must decode to the input again. Covers the
 * SentencePiece models (Llama 2, Phi-3), Gemma 4's BPE and the byte-level pre-tokenizers of GPT-2,
 * StarCoder, Llama 3, Qwen2, Qwen3.5, DeepSeek, Command-R and Refact. */
static void llama_cpp_vocab_tests_match(void **state) {
    (void)state;
    static const char *const names[] = {"llama-spm",      "phi-3",     "gpt-2",  "starcoder",
                                        "llama-bpe",      "qwen2",     "qwen35", "deepseek-llm",
                                        "deepseek-coder", "command-r", "refact", "gemma-4"};
    static const char sep[] = "\n__ggml_vocab_test__\n";
    lt_ctx *ctx = lt_ctx_new();
    size_t n_checked = 0;
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        char path[1024], rel[256];
        snprintf(rel, sizeof rel, "llama.cpp/%s.gguf", names[v]);
        fixture_path(path, sizeof path, rel);
        lt_gguf *g;
        assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
        lt_tokenizer *tok;
        lt_status s = lt_tokenizer_load_gguf(ctx, g, &tok);
        if (s != LT_OK) fail_msg("%s: %s: %s", rel, lt_status_str(s), lt_ctx_error(ctx));
        lt_gguf_close(g);
        size_t ni, no;
        snprintf(rel, sizeof rel, "llama.cpp/%s.inp", names[v]);
        fixture_path(path, sizeof path, rel);
        char *inp = slurp(path, &ni);
        snprintf(rel, sizeof rel, "llama.cpp/%s.out", names[v]);
        fixture_path(path, sizeof path, rel);
        char *out = slurp(path, &no);
        assert_non_null(inp);
        assert_non_null(out);
        char *ip = inp, *op = out;
        size_t k = 0;
        while (ip < inp + ni) {
            char *next = strstr(ip, sep);
            size_t len = next ? (size_t)(next - ip) : strlen(ip);
            char *eol = strchr(op, '\n');
            if (!eol) fail_msg("%s: .out has fewer lines than .inp has tests", names[v]);
            *eol = '\0';
            int32_t want[4096];
            size_t nw = 0;
            for (char *q = op, *e; *q; q = e) {
                long id = strtol(q, &e, 10);
                if (e == q) break;
                assert_true(nw < 4096);
                want[nw++] = (int32_t)id;
            }
            int32_t *ids;
            size_t n;
            assert_int_equal(lt_tokenizer_encode(ctx, tok, ip, len, 0, &ids, &n), LT_OK);
            if (n != nw || memcmp(ids, want, n * sizeof *ids)) {
                report_diff(names[v], k, "llama.cpp ids", want, nw, ids, n);
                fail_msg("%s: test %zu ('%.*s') differs from llama.cpp", names[v], k, (int)(len > 60 ? 60 : len), ip);
            }
            char *text;
            size_t tl;
            assert_int_equal(lt_tokenizer_decode(ctx, tok, ids, n, 0, &text, &tl), LT_OK);
            if (tl != len || memcmp(text, ip, len))
                fail_msg("%s: test %zu ('%.*s') decodes to '%s'", names[v], k, (int)(len > 60 ? 60 : len), ip, text);
            free(text);
            free(ids);
            op = eol + 1;
            ip = next ? next + strlen(sep) : inp + ni;
            k++;
            n_checked++;
        }
        assert_true(k >= 46);
        free(inp);
        free(out);
        lt_tokenizer_free(tok);
    }
    assert_int_equal(n_checked, 11 * 46 + 50);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* The later families' layouts (tests/fixtures/tokenizer/{gemma,tekken,qwen35}/): Gemma's
 * tokenizer.json (Replace normalizer, no prefix space, Split on " ", byte fallback) and the same
 * vocabulary as a Gemma GGUF (model llama, add_space_prefix false); Mistral Nemo's Tekken and
 * Qwen3.5's byte-level layouts, as tokenizer.json and as GGUF (pre = tekken, qwen35). */
static void gemma_matches_hf(void **state) {
    (void)state;
    json_family("gemma", 0);
    lt_ctx *ctx = lt_ctx_new();
    char path[1024];
    fixture_path(path, sizeof path, "gemma/tokenizer.gguf");
    lt_gguf *g;
    assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
    lt_tokenizer *tok;
    lt_status s = lt_tokenizer_load_gguf(ctx, g, &tok);
    if (s != LT_OK) fail_msg("%s: %s", lt_status_str(s), lt_ctx_error(ctx));
    lt_gguf_close(g);
    assert_int_equal(check_family(ctx, tok, "gemma", 0), 0);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void tekken_matches_hf(void **state) {
    (void)state;
    json_family("tekken", 0);
    byte_level_gguf("tekken");
}

static void qwen35_matches_hf(void **state) {
    (void)state;
    json_family("qwen35", 0);
    byte_level_gguf("qwen35");
}

static void encode_str(lt_ctx *ctx, const lt_tokenizer *tok, const char *s, int32_t **ids, size_t *n) {
    assert_int_equal(lt_tokenizer_encode(ctx, tok, s, strlen(s), 0, ids, n), LT_OK);
}

static int same_ids(lt_ctx *ctx, const lt_tokenizer *tok, const char *a, const char *b) {
    int32_t *x, *y;
    size_t nx, ny;
    encode_str(ctx, tok, a, &x, &nx);
    encode_str(ctx, tok, b, &y, &ny);
    int same = nx == ny && !memcmp(x, y, nx * sizeof *x);
    free(x);
    free(y);
    return same;
}

/* A Phi-3 GGUF (general.name "Phi3") gets llama.cpp's rstrip on its special tokens, as Phi-3's
 * tokenizer.json has them: the newlines after <|user|>, <|end|> and <|assistant|> join the token,
 * those after <|endoftext|> and <s> stay; other models keep whitespace after special tokens. */
static void phi3_special_tokens_rstrip(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *files[] = {"llama.cpp/phi-3.gguf", "llama.cpp/llama-spm.gguf"};
    for (int f = 0; f < 2; f++) {
        char path[1024];
        fixture_path(path, sizeof path, files[f]);
        lt_gguf *g;
        assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
        lt_tokenizer *tok;
        assert_int_equal(lt_tokenizer_load_gguf(ctx, g, &tok), LT_OK);
        lt_gguf_close(g);
        if (f == 0) {
            assert_true(same_ids(ctx, tok, "<|user|>\nHi<|end|>\n<|assistant|>\n", "<|user|>Hi<|end|><|assistant|>"));
            int32_t *ids;
            size_t n;
            encode_str(ctx, tok, "<|user|>\nHi<|end|>\n<|assistant|>\n", &ids, &n);
            assert_true(n >= 4);
            assert_int_equal(ids[0], lt_tokenizer_token_id(tok, "<|user|>"));
            assert_int_equal(ids[n - 2], lt_tokenizer_token_id(tok, "<|end|>"));
            assert_int_equal(ids[n - 1], lt_tokenizer_token_id(tok, "<|assistant|>"));
            free(ids);
            assert_false(same_ids(ctx, tok, "<|endoftext|>\nHi", "<|endoftext|>Hi"));
            assert_false(same_ids(ctx, tok, "<s>\nHi", "<s>Hi"));
        } else {
            assert_false(same_ids(ctx, tok, "</s>\nHi", "</s>Hi"));
        }
        lt_tokenizer_free(tok);
    }
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Without tokenizer.ggml.add_bos_token, BOS is added as llama.cpp adds it: for the Llama 3 (and
 * Tekken) pre-tokenizers and SentencePiece models, not for GPT-2's or Qwen2's. */
static void gguf_add_bos_defaults(void **state) {
    (void)state;
    static const struct {
        const char *file;
        int bos_first;
    } cases[] = {{"llama.cpp/llama-bpe.gguf", 1}, {"llama.cpp/gpt-2.gguf", 0}, {"llama.cpp/qwen2.gguf", 0}};
    lt_ctx *ctx = lt_ctx_new();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024];
        fixture_path(path, sizeof path, cases[i].file);
        lt_gguf *g;
        assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
        int has_key = 0;
        assert_int_equal(lt_gguf_get_bool(ctx, g, "tokenizer.ggml.add_bos_token", &has_key), LT_ERR_NOT_FOUND);
        lt_tokenizer *tok;
        assert_int_equal(lt_tokenizer_load_gguf(ctx, g, &tok), LT_OK);
        lt_gguf_close(g);
        int32_t *ids, *plain;
        size_t n, np;
        assert_int_equal(lt_tokenizer_encode(ctx, tok, "Hi there", 8, 1, &ids, &n), LT_OK);
        assert_int_equal(lt_tokenizer_encode(ctx, tok, "Hi there", 8, 0, &plain, &np), LT_OK);
        assert_int_equal(n, np + (size_t)cases[i].bos_first);
        if (cases[i].bos_first) assert_int_equal(ids[0], lt_tokenizer_bos(tok));
        assert_memory_equal(ids + cases[i].bos_first, plain, np * sizeof *plain);
        free(ids);
        free(plain);
        lt_tokenizer_free(tok);
    }
    lt_ctx_free(ctx);
}

static const char *model_path(char *buf, size_t cap) {
    const char *cache = getenv("LONGTUNE_CACHE"), *home = getenv("HOME");
    if (cache) snprintf(buf, cap, "%s/smollm2-135m-instruct-q4_1.gguf", cache);
    else snprintf(buf, cap, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", home ? home : "");
    return access(buf, R_OK) == 0 ? buf : NULL;
}

static lt_tokenizer *load_smollm2(lt_ctx *ctx) {
    char buf[1024];
    const char *p = model_path(buf, sizeof buf);
    if (!p) return NULL;
    lt_gguf *g;
    assert_int_equal(lt_gguf_open(ctx, p, &g), LT_OK);
    lt_tokenizer *tok;
    lt_status s = lt_tokenizer_load_gguf(ctx, g, &tok);
    if (s != LT_OK) fail_msg("%s: %s", lt_status_str(s), lt_ctx_error(ctx));
    lt_gguf_close(g);
    return tok;
}

static void smollm2_gguf_matches_hf(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_tokenizer *tok = load_smollm2(ctx);
    if (!tok) {
        fprintf(stderr, "skipped: SmolLM2 GGUF absent (run scripts/setup.sh to install the model)\n");
        lt_ctx_free(ctx);
        skip();
    }
    assert_int_equal(lt_tokenizer_vocab_size(tok), 49152);
    assert_int_equal(lt_tokenizer_bos(tok), 1);
    assert_int_equal(lt_tokenizer_eos(tok), 2);
    assert_int_equal(lt_tokenizer_pad(tok), 2);
    assert_int_equal(lt_tokenizer_token_id(tok, "<|im_start|>"), 1);
    assert_non_null(strstr(lt_tokenizer_chat_template(tok), "SmolLM"));
    assert_int_equal(check_family(ctx, tok, "smollm2", 1), 0);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Random valid UTF-8 from a mix of scripts, whitespace, digits, emoji and combining marks. */
static size_t random_text(uint64_t *rng, char *buf, size_t cap) {
    static const uint32_t pools[][2] = {{0x20, 0x7E},     {0x20, 0x20},     {0x0A, 0x0A},       {0x30, 0x39},
                                        {0xA0, 0xFF},     {0x300, 0x36F},   {0x400, 0x4FF},     {0x4E00, 0x4FFF},
                                        {0x3040, 0x30FF}, {0xAC00, 0xAD00}, {0x1F600, 0x1F64F}, {0x09, 0x0D},
                                        {0x660, 0x669}};
    size_t n = 0, want = 1 + lt_test_rand_u64(rng) % 120;
    for (size_t i = 0; i < want && n + 4 < cap; i++) {
        const uint32_t *p = pools[lt_test_rand_u64(rng) % (sizeof pools / sizeof pools[0])];
        uint32_t cp = p[0] + (uint32_t)(lt_test_rand_u64(rng) % (p[1] - p[0] + 1));
        if (cp < 0x80) buf[n++] = (char)cp;
        else if (cp < 0x800) {
            buf[n++] = (char)(0xC0 | (cp >> 6));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            buf[n++] = (char)(0xE0 | (cp >> 12));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            buf[n++] = (char)(0xF0 | (cp >> 18));
            buf[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            buf[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            buf[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    return n;
}

static void round_trip_random(lt_ctx *ctx, const lt_tokenizer *tok, uint64_t *rng, int iters) {
    char buf[1024];
    for (int it = 0; it < iters; it++) {
        size_t n = random_text(rng, buf, sizeof buf);
        int32_t *ids;
        size_t k;
        assert_int_equal(lt_tokenizer_encode(ctx, tok, buf, n, 0, &ids, &k), LT_OK);
        char *text;
        size_t tl;
        assert_int_equal(lt_tokenizer_decode(ctx, tok, ids, k, 0, &text, &tl), LT_OK);
        if (tl != n || memcmp(text, buf, n)) fail_msg("round trip failed for %zu random bytes (iteration %d)", n, it);
        /* Encoding is deterministic, also when the cache already holds the words. */
        int32_t *ids2;
        size_t k2;
        assert_int_equal(lt_tokenizer_encode(ctx, tok, buf, n, 0, &ids2, &k2), LT_OK);
        assert_int_equal(k2, k);
        assert_memory_equal(ids2, ids, k * sizeof *ids);
        free(ids2);
        free(ids);
        free(text);
    }
}

static void byte_level_round_trips_random_text(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    char path[1024];
    fixture_path(path, sizeof path, "bpe-im/tokenizer.json");
    lt_tokenizer *tok;
    assert_int_equal(lt_tokenizer_load_json(ctx, path, &tok), LT_OK);
    round_trip_random(ctx, tok, &rng, 300);
    lt_tokenizer_free(tok);
    tok = load_smollm2(ctx);
    if (tok) {
        round_trip_random(ctx, tok, &rng, 300);
        lt_tokenizer_free(tok);
    } else {
        fprintf(stderr, "SmolLM2 GGUF absent: random round trip only on bpe-im\n");
    }
    lt_ctx_free(ctx);
}

/* Writes a tokenizer.json variant of spm/ with one top-level key replaced. */
static const char *write_variant(const char *key, const char *json_value) {
    static char out[256];
    char path[1024];
    fixture_path(path, sizeof path, "spm/tokenizer.json");
    char *src = slurp(path, NULL);
    assert_non_null(src);
    cJSON *j = cJSON_Parse(src);
    free(src);
    cJSON *v = cJSON_Parse(json_value);
    assert_non_null(v);
    if (!strcmp(key, "model.merges")) {
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "model"), "merges", v);
    } else if (!strcmp(key, "model.type")) {
        cJSON_ReplaceItemInObject(cJSON_GetObjectItem(j, "model"), "type", v);
    } else {
        cJSON_ReplaceItemInObject(j, key, v);
    }
    char *txt = cJSON_PrintUnformatted(j);
    snprintf(out, sizeof out, "/tmp/lt_test_tok_%d.json", (int)getpid());
    FILE *f = fopen(out, "wb");
    fputs(txt, f);
    fclose(f);
    free(txt);
    cJSON_Delete(j);
    return out;
}

static void expect_load_error(lt_ctx *ctx, const char *key, const char *value, lt_status want, const char *needle) {
    const char *p = write_variant(key, value);
    lt_tokenizer *tok = NULL;
    lt_status s = lt_tokenizer_load_json(ctx, p, &tok);
    unlink(p);
    if (s != want)
        fail_msg("%s=%s: expected %s, got %s (%s)", key, value, lt_status_str(want), lt_status_str(s),
                 lt_ctx_error(ctx));
    assert_null(tok);
    if (!strstr(lt_ctx_error(ctx), needle)) fail_msg("error '%s' does not name '%s'", lt_ctx_error(ctx), needle);
}

static void unsupported_and_malformed_files_are_typed_errors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    expect_load_error(ctx, "normalizer", "{\"type\":\"NFKC\"}", LT_ERR_UNSUPPORTED, "NFKC");
    expect_load_error(ctx, "normalizer", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Lowercase\"}]}",
                      LT_ERR_UNSUPPORTED, "Lowercase");
    expect_load_error(ctx, "pre_tokenizer", "{\"type\":\"BertPreTokenizer\"}", LT_ERR_UNSUPPORTED, "BertPreTokenizer");
    expect_load_error(
        ctx, "pre_tokenizer",
        "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\",\"invert\":false}",
        LT_ERR_UNSUPPORTED, "(unclosed");
    expect_load_error(ctx, "pre_tokenizer",
                      "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Sideways\",\"invert\":false}",
                      LT_ERR_UNSUPPORTED, "Sideways");
    expect_load_error(ctx, "decoder", "{\"type\":\"WordPiece\"}", LT_ERR_UNSUPPORTED, "WordPiece");
    expect_load_error(ctx, "post_processor", "{\"type\":\"Mystery\"}", LT_ERR_UNSUPPORTED, "Mystery");
    expect_load_error(ctx, "model.type", "\"Unigram\"", LT_ERR_UNSUPPORTED, "Unigram");
    expect_load_error(ctx, "model.merges", "[\"zzzq qqqz\"]", LT_ERR_FORMAT, "merge 0");
    expect_load_error(ctx, "model.merges", "[\"nospace\"]", LT_ERR_FORMAT, "merge 0");
    lt_tokenizer *tok = NULL;
    assert_int_equal(lt_tokenizer_load_json(ctx, "/nonexistent/tokenizer.json", &tok), LT_ERR_NOT_FOUND);
    const char *p = "/tmp/lt_test_tok_bad.json";
    FILE *f = fopen(p, "wb");
    fputs("{\"model\": ", f);
    fclose(f);
    assert_int_equal(lt_tokenizer_load_json(ctx, p, &tok), LT_ERR_FORMAT);
    unlink(p);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);

    /* Decoding an id outside the vocabulary names the position. */
    char path[1024];
    fixture_path(path, sizeof path, "spm/tokenizer.json");
    assert_int_equal(lt_tokenizer_load_json(ctx, path, &tok), LT_OK);
    int32_t ids[3] = {5, 6, 1 << 30};
    char *text;
    size_t tl;
    assert_int_equal(lt_tokenizer_decode(ctx, tok, ids, 3, 0, &text, &tl), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "position 2"));
    ids[2] = -1;
    assert_int_equal(lt_tokenizer_decode(ctx, tok, ids, 3, 0, &text, &tl), LT_ERR_INVALID_ARG);
    /* Empty input: no ids, a valid (non-NULL) array; add_special adds BOS. */
    int32_t *out;
    size_t n;
    assert_int_equal(lt_tokenizer_encode(ctx, tok, "", 0, 0, &out, &n), LT_OK);
    assert_int_equal(n, 0);
    free(out);
    assert_int_equal(lt_tokenizer_encode(ctx, tok, "", 0, 1, &out, &n), LT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(out[0], 1);
    free(out);
    /* skip_special drops BOS in decode. */
    int32_t with_bos[2] = {1, lt_tokenizer_token_id(tok, "\xE2\x96\x81the")};
    assert_true(with_bos[1] > 0);
    assert_int_equal(lt_tokenizer_decode(ctx, tok, with_bos, 2, 1, &text, &tl), LT_OK);
    assert_string_equal(text, "the");
    free(text);
    lt_tokenizer_free(tok);

    /* A GGUF whose tokenizer model is not supported. */
    {
        const char *gp = "/tmp/lt_test_tok_bad.gguf";
        f = fopen(gp, "wb");
        uint32_t u32;
        uint64_t u64;
        fwrite("GGUF", 1, 4, f);
        u32 = 3;
        fwrite(&u32, 4, 1, f);
        u64 = 0;
        fwrite(&u64, 8, 1, f);
        u64 = 1;
        fwrite(&u64, 8, 1, f);
        const char *key = "tokenizer.ggml.model", *val = "bert";
        u64 = strlen(key);
        fwrite(&u64, 8, 1, f);
        fwrite(key, 1, strlen(key), f);
        u32 = LT_GGUF_STRING;
        fwrite(&u32, 4, 1, f);
        u64 = strlen(val);
        fwrite(&u64, 8, 1, f);
        fwrite(val, 1, strlen(val), f);
        fclose(f);
        lt_gguf *g;
        assert_int_equal(lt_gguf_open(ctx, gp, &g), LT_OK);
        assert_int_equal(lt_tokenizer_load_gguf(ctx, g, &tok), LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), "bert"));
        lt_gguf_close(g);
        unlink(gp);
    }
    /* A tokenizer.ggml.pre value longtune does not know is named in the error. */
    {
        char gp[1024];
        fixture_path(gp, sizeof gp, "llama.cpp/unknown-pre.gguf");
        lt_gguf *g;
        assert_int_equal(lt_gguf_open(ctx, gp, &g), LT_OK);
        assert_int_equal(lt_tokenizer_load_gguf(ctx, g, &tok), LT_ERR_UNSUPPORTED);
        assert_null(tok);
        assert_non_null(strstr(lt_ctx_error(ctx), "'mystery-pre'"));
        assert_non_null(strstr(lt_ctx_error(ctx), "tekken"));
        lt_gguf_close(g);
    }
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Every allocation failure while loading is LT_ERR_OOM with nothing leaked. */
static void allocation_failures_are_clean(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char path[1024];
    fixture_path(path, sizeof path, "spm/tokenizer.json");
    int oom = 0;
    for (uint64_t nth = 1; nth < 400; nth += 7) {
        lt_mem_fail_nth(ctx, nth);
        lt_tokenizer *tok = NULL;
        lt_status s = lt_tokenizer_load_json(ctx, path, &tok);
        assert_true(s == LT_OK || s == LT_ERR_OOM);
        if (s == LT_ERR_OOM) oom++;
        if (s == LT_OK) {
            /* The armed failure may land inside encode instead. */
            int32_t *ids;
            size_t n;
            s = lt_tokenizer_encode(ctx, tok, "Hello world, caf\xC3\xA9!", 15, 1, &ids, &n);
            assert_true(s == LT_OK || s == LT_ERR_OOM);
            if (s == LT_OK) free(ids);
            lt_tokenizer_free(tok);
        }
        lt_mem_fail_nth(ctx, 0);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    }
    assert_true(oom > 10);
    lt_ctx_free(ctx);
}

/* Several threads encoding with one tokenizer (and its shared word cache) agree with one thread. */
static void concurrent_encodes_agree(void **state) {
    (void)state;
    char path[1024];
    fixture_path(path, sizeof path, "bpe-nfc/tokenizer.json");
    lt_ctx *ctx = lt_ctx_new();
    lt_tokenizer *tok;
    assert_int_equal(lt_tokenizer_load_json(ctx, path, &tok), LT_OK);
    size_t *want_n = calloc(n_corpus, sizeof *want_n);
    int32_t **want = calloc(n_corpus, sizeof *want);
    for (size_t i = 0; i < n_corpus; i++)
        assert_int_equal(lt_tokenizer_encode(ctx, tok, corpus[i].bytes, corpus[i].len, 0, &want[i], &want_n[i]), LT_OK);
    int bad = 0;
#pragma omp parallel for num_threads(4) reduction(+ : bad) schedule(dynamic)
    for (int it = 0; it < 8 * (int)n_corpus; it++) {
        size_t i = (size_t)it % n_corpus;
        lt_ctx *tctx = lt_ctx_new();
        int32_t *ids;
        size_t k;
        if (lt_tokenizer_encode(tctx, tok, corpus[i].bytes, corpus[i].len, 0, &ids, &k) != LT_OK) bad++;
        else {
            if (k != want_n[i] || memcmp(ids, want[i], k * sizeof *ids)) bad++;
            free(ids);
        }
        lt_ctx_free(tctx);
    }
    assert_int_equal(bad, 0);
    for (size_t i = 0; i < n_corpus; i++) free(want[i]);
    free(want);
    free(want_n);
    lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(smollm2_gguf_matches_hf),
        cmocka_unit_test(bpe_nfc_matches_hf),
        cmocka_unit_test(bpe_ignore_merges_matches_hf),
        cmocka_unit_test(pre_tokenizer_variants_match_hf),
        cmocka_unit_test(spm_json_matches_hf),
        cmocka_unit_test(spm_metaspace_matches_hf),
        cmocka_unit_test(spm_metaspace_split_matches_hf),
        cmocka_unit_test(spm_gguf_matches_hf),
        cmocka_unit_test(qwen2_gguf_matches_hf),
        cmocka_unit_test(llama_bpe_gguf_matches_hf),
        cmocka_unit_test(llama_cpp_vocab_tests_match),
        cmocka_unit_test(phi3_special_tokens_rstrip),
        cmocka_unit_test(gguf_add_bos_defaults),
        cmocka_unit_test(gemma_matches_hf),
        cmocka_unit_test(tekken_matches_hf),
        cmocka_unit_test(qwen35_matches_hf),
        cmocka_unit_test(byte_level_round_trips_random_text),
        cmocka_unit_test(unsupported_and_malformed_files_are_typed_errors),
        cmocka_unit_test(allocation_failures_are_clean),
        cmocka_unit_test(concurrent_encodes_agree),
    };
    return cmocka_run_group_tests(tests, setup_corpus, teardown_corpus);
}
