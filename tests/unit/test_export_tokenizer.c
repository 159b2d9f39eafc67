/* The tokenizer conversions of `longtune export`: a GGUF vocabulary (SentencePiece BPE "llama",
 * byte-level BPE "gpt2" with the Llama 3 pre-tokenizer) written as tokenizer.json encodes every
 * corpus text to the same ids (special tokens added and not) and decodes to the same text as the
 * GGUF itself; and a tokenizer.json turned into tokenizer.ggml.* metadata and read back as a GGUF
 * does the same. Both sides are longtune's tokenizer, which tests/unit/test_tokenizer.c holds to
 * HF tokenizers' ids. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "export/export_internal.h"
#include "helpers/test_util.h"
#include "longtune/tokenizer.h"

static char dir[256];

static void must(lt_ctx *ctx, lt_status s, const char *what) {
    if (s != LT_OK) {
        fprintf(stderr, "%s: %s: %s\n", what, lt_status_str(s), lt_ctx_error(ctx));
        fail();
    }
}

/* Every corpus text through both tokenizers: ids with and without specials, and the decode. */
static void same_tokenizers(lt_ctx *ctx, const lt_tokenizer *a, const lt_tokenizer *b, const char *skip) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/corpus.jsonl", lt_test_source_dir());
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        cJSON *j = cJSON_Parse(line);
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(j, "text"));
        if (text && skip && strstr(text, skip)) text = NULL;
        for (int sp = 0; text && sp < 2; sp++) {
            int32_t *ia, *ib;
            size_t na, nb;
            must(ctx, lt_tokenizer_encode(ctx, a, text, strlen(text), sp, &ia, &na), "encode");
            must(ctx, lt_tokenizer_encode(ctx, b, text, strlen(text), sp, &ib, &nb), "encode");
            if (na != nb || memcmp(ia, ib, na * sizeof *ia)) {
                fprintf(stderr, "ids differ (add_special %d) for: %s\n", sp, text);
                fail();
            }
            char *da, *db;
            size_t la, lb;
            must(ctx, lt_tokenizer_decode(ctx, a, ia, na, 0, &da, &la), "decode");
            must(ctx, lt_tokenizer_decode(ctx, b, ib, nb, 0, &db, &lb), "decode");
            assert_true(la == lb && !memcmp(da, db, la));
            free(ia), free(ib), free(da), free(db);
            n++;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    assert_true(n > 100);
    assert_int_equal(lt_tokenizer_bos(a), lt_tokenizer_bos(b));
    assert_int_equal(lt_tokenizer_eos(a), lt_tokenizer_eos(b));
}

static void gguf_to_json(const char *fixture) {
    lt_ctx *ctx = lt_ctx_new();
    char path[1024], sub[400], out[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/%s/tokenizer.gguf", lt_test_source_dir(), fixture);
    lt_ex_base b;
    memset(&b, 0, sizeof b);
    b.path = path;
    b.cfg.max_positions = 2048;
    must(ctx, lt_gguf_open(ctx, path, &b.gg), path);
    char *tj;
    cJSON *tc;
    must(ctx, lt_ex_tokenizer_from_gguf(ctx, &b, &tj, &tc), "convert");
    snprintf(sub, sizeof sub, "%s/%s", dir, fixture);
    assert_int_equal(mkdir(sub, 0755), 0);
    snprintf(out, sizeof out, "%s/tokenizer_config.json", sub);
    char *tcs = cJSON_Print(tc);
    must(ctx, lt_ex_write_file(ctx, out, tcs, strlen(tcs)), out);
    free(tcs);
    snprintf(out, sizeof out, "%s/tokenizer.json", sub);
    must(ctx, lt_ex_write_file(ctx, out, tj, strlen(tj)), out);
    free(tj);
    assert_non_null(cJSON_GetObjectItemCaseSensitive(tc, "add_bos_token"));
    cJSON_Delete(tc);
    lt_tokenizer *a, *c;
    must(ctx, lt_tokenizer_load_gguf(ctx, b.gg, &a), "gguf tokenizer");
    must(ctx, lt_tokenizer_load_json(ctx, out, &c), "converted tokenizer.json");
    same_tokenizers(ctx, a, c, NULL);
    lt_tokenizer_free(a);
    lt_tokenizer_free(c);
    lt_gguf_close(b.gg);
    lt_ctx_free(ctx);
}

static void test_spm_gguf_to_json(void **s) {
    (void)s;
    gguf_to_json("spm");
}

static void test_bpe_gguf_to_json(void **s) {
    (void)s;
    gguf_to_json("bpe-im");
}

static void json_to_gguf(const char *fixture, const char *model, const char *pre, const char *skip) {
    lt_ctx *ctx = lt_ctx_new();
    lt_ex_base b;
    memset(&b, 0, sizeof b);
    snprintf(b.dir, sizeof b.dir, "%s/tests/fixtures/tokenizer/%s", lt_test_source_dir(), fixture);
    char json[EX_PATH_MAX + 32], out[512], note[256] = "";
    snprintf(json, sizeof json, "%s/tokenizer.json", b.dir);
    lt_tokenizer *a, *c;
    must(ctx, lt_tokenizer_load_json(ctx, json, &a), json);
    b.cfg.V = lt_tokenizer_vocab_size(a);
    if (lt_tokenizer_token_id(a, "<mask>") >= b.cfg.V) b.cfg.V = lt_tokenizer_token_id(a, "<mask>") + 1;
    b.cfg.bos_id = b.cfg.eos_id = -1;
    lt_gguf_writer *w;
    must(ctx, lt_gguf_writer_new(ctx, &w), "writer");
    must(ctx, lt_gguf_writer_set_str(ctx, w, "general.architecture", "llama", 5), "arch");
    must(ctx, lt_ex_tokenizer_to_gguf(ctx, &b, w, note, sizeof note), "to gguf");
    snprintf(out, sizeof out, "%s/%s.gguf", dir, fixture);
    must(ctx, lt_gguf_writer_begin(ctx, w, out), out);
    must(ctx, lt_gguf_writer_finish(ctx, w), out);
    lt_gguf_writer_free(w);
    lt_gguf *g;
    must(ctx, lt_gguf_open(ctx, out, &g), out);
    char got[32];
    assert_true(lt_ex_gguf_str(ctx, g, "tokenizer.ggml.model", got, sizeof got));
    assert_string_equal(got, model);
    if (pre) {
        assert_true(lt_ex_gguf_str(ctx, g, "tokenizer.ggml.pre", got, sizeof got));
        assert_string_equal(got, pre);
    }
    must(ctx, lt_tokenizer_load_gguf(ctx, g, &c), "gguf tokenizer");
    /* bpe-im's <mask> strips the spaces around it, which GGUF cannot say: the export notes it and
     * the texts holding it are left out. */
    if (skip) assert_non_null(strstr(note, skip));
    same_tokenizers(ctx, a, c, skip);
    lt_tokenizer_free(a);
    lt_tokenizer_free(c);
    lt_gguf_close(g);
    lt_ctx_free(ctx);
}

static void test_bpe_json_to_gguf(void **s) {
    (void)s;
    json_to_gguf("bpe-im", "gpt2", "llama-bpe", "<mask>");
}

static void test_spm_json_to_gguf(void **s) {
    (void)s;
    json_to_gguf("spm", "llama", NULL, NULL);
}

static int setup(void **s) {
    (void)s;
    snprintf(dir, sizeof dir, "/tmp/lt_test_export_tok.XXXXXX");
    return mkdtemp(dir) ? 0 : 1;
}

static int teardown(void **s) {
    (void)s;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_spm_gguf_to_json), cmocka_unit_test(test_bpe_gguf_to_json),
                                       cmocka_unit_test(test_bpe_json_to_gguf),
                                       cmocka_unit_test(test_spm_json_to_gguf)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
