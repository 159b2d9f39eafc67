/* Dataset reading: the streaming JSONL reader (lines across read-buffer boundaries, CRLF, BOM,
 * blank lines, over-long lines reported and skipped, bounded memory on a file many times the read
 * buffer), the three record shapes, malformed lines reported as file:line with the key, and the
 * span-to-token prompt mask. Tokenisation of records is tested in test_dataset_tokens.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/dataset.h"

static char tmp_path[256];

static const char *write_tmp(const char *content, size_t len) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lt_test_dataset_%d.jsonl", (int)getpid());
    FILE *f = fopen(tmp_path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(content, 1, len, f), len);
    fclose(f);
    return tmp_path;
}

static void record_shapes(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_record rec = {0};
    const char *t = "{\"text\": \"hello\\nworld\", \"extra\": 1}";
    assert_int_equal(lt_record_parse(ctx, t, strlen(t), "f", 1, &rec), LT_OK);
    assert_int_equal(rec.kind, LT_RECORD_TEXT);
    assert_string_equal(rec.text, "hello\nworld");
    const char *pc = "{\"prompt\": \"Q\", \"completion\": \"A \\u00e9\"}";
    assert_int_equal(lt_record_parse(ctx, pc, strlen(pc), "f", 2, &rec), LT_OK);
    assert_int_equal(rec.kind, LT_RECORD_COMPLETION);
    assert_string_equal(rec.prompt, "Q");
    assert_string_equal(rec.completion, "A \xc3\xa9");
    const char *m =
        "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u\"},"
        " {\"role\": \"assistant\", \"content\": \"a\"}]}";
    assert_int_equal(lt_record_parse(ctx, m, strlen(m), "f", 3, &rec), LT_OK);
    assert_int_equal(rec.kind, LT_RECORD_CHAT);
    assert_int_equal(rec.n_messages, 3);
    assert_string_equal(rec.messages[2].role, "assistant");
    assert_string_equal(rec.messages[1].content, "u");
    lt_record_free(ctx, &rec);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void malformed_lines_name_file_line_and_key(void **state) {
    (void)state;
    const char *content =
        "{\"text\": \"ok\"}\n"         /* 1 */
        "\n"                           /* 2 blank */
        "{\"text\": \"unterminated}\n" /* 3 */
        "[1, 2]\n"                     /* 4 */
        "{\"text\": 5}\n"              /* 5 */
        "{\"prompt\": \"p\"}\n"        /* 6 */
        "{\"messages\": [{\"role\": \"user\", \"content\": \"u\"}, {\"role\": \"assistant\", \"content\": 7}]}\n" /* 7 */
        "{\"question\": \"?\"}\n"               /* 8 */
        "{\"messages\": []}\n"                  /* 9 */
        "{\"text\": \"a\"} {\"text\": \"b\"}\n" /* 10 */
        "{\"messages\": [\"user\"]}\n"          /* 11 */
        "{\"text\": \"last\"}";                 /* 12, no newline */
    const char *path = write_tmp(content, strlen(content));
    struct {
        int64_t line;
        const char *needle;
    } want[] = {
        {3, "invalid JSON"},
        {4, "JSON object"},
        {5, "'text' must be a string"},
        {6, "'completion' must be a string"},
        {7, "messages[1].content must be a string"},
        {8, "unknown record shape"},
        {9, "'messages' is empty"},
        {10, "trailing data"},
        {11, "messages[0] must be an object"},
    };
    lt_ctx *ctx = lt_ctx_new();
    lt_jsonl *r;
    assert_int_equal(lt_jsonl_open(ctx, path, 0, &r), LT_OK);
    lt_record rec = {0};
    int ok = 0, bad = 0;
    for (;;) {
        const char *line;
        size_t len;
        int64_t no;
        assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
        if (!line) break;
        lt_status s = lt_record_parse(ctx, line, len, path, no, &rec);
        if (no == 1 || no == 12) {
            assert_int_equal(s, LT_OK);
            ok++;
            continue;
        }
        assert_int_equal(s, LT_ERR_FORMAT);
        char where[300];
        snprintf(where, sizeof where, "%s:%lld:", path, (long long)no);
        if (!strstr(lt_ctx_error(ctx), where)) fail_msg("no file:line in '%s'", lt_ctx_error(ctx));
        int matched = 0;
        for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
            if (want[k].line == no) {
                if (!strstr(lt_ctx_error(ctx), want[k].needle))
                    fail_msg("line %lld: '%s' lacks '%s'", (long long)no, lt_ctx_error(ctx), want[k].needle);
                matched = 1;
            }
        assert_true(matched);
        bad++;
    }
    assert_int_equal(ok, 2);
    assert_int_equal(bad, 9);
    lt_record_free(ctx, &rec);
    lt_jsonl_close(ctx, r);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_jsonl *none;
    assert_int_equal(lt_jsonl_open(ctx, "/nonexistent/train.jsonl", 0, &none), LT_ERR_NOT_FOUND);
    assert_non_null(strstr(lt_ctx_error(ctx), "/nonexistent/train.jsonl"));
    lt_ctx_free(ctx);
    unlink(path);
}

static void crlf_bom_and_long_lines(void **state) {
    (void)state;
    const char *content = "\xEF\xBB\xBF{\"text\": \"a\"}\r\n   \r\n{\"text\": \"0123456789012345678901234567890\"}\n"
                          "{\"text\": \"b\"}\r\n";
    const char *path = write_tmp(content, strlen(content));
    lt_ctx *ctx = lt_ctx_new();
    lt_jsonl *r;
    assert_int_equal(lt_jsonl_open(ctx, path, 24, &r), LT_OK);
    const char *line;
    size_t len;
    int64_t no;
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
    assert_string_equal(line, "{\"text\": \"a\"}");
    assert_int_equal(len, 13);
    assert_int_equal(no, 1);
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), ":3: line longer than 24 bytes"));
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK); /* continues after it */
    assert_string_equal(line, "{\"text\": \"b\"}");
    assert_int_equal(no, 4);
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
    assert_null(line);
    lt_jsonl_close(ctx, r);
    lt_ctx_free(ctx);
    unlink(path);
}

/* A file several times the 1 MiB read buffer, lines of random length (up to 300 KB) crossing the
 * buffer boundaries: every line comes back intact, and memory stays bounded by the buffer plus
 * the longest line. */
static void streams_large_files_in_bounded_memory(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lt_test_dataset_big_%d.jsonl", (int)getpid());
    FILE *f = fopen(tmp_path, "wb");
    assert_non_null(f);
    const int n_lines = 400;
    size_t *lens = malloc(n_lines * sizeof *lens);
    uint64_t *seeds = malloc(n_lines * sizeof *seeds);
    size_t longest = 0, total = 0;
    char *buf = malloc(400000);
    for (int i = 0; i < n_lines; i++) {
        size_t body = (size_t)(lt_test_uniform(&rng, 0, 1) < 0.1 ? lt_test_uniform(&rng, 1, 300000)
                                                                 : lt_test_uniform(&rng, 1, 30000));
        seeds[i] = lt_test_rand_u64(&rng);
        uint64_t s = seeds[i];
        int k = sprintf(buf, "{\"text\": \"");
        for (size_t j = 0; j < body; j++) buf[k + (int)j] = (char)('a' + lt_test_rand_u64(&s) % 26);
        k += (int)body;
        k += sprintf(buf + k, "\"}");
        lens[i] = (size_t)k;
        if ((size_t)k > longest) longest = (size_t)k;
        total += (size_t)k + 1;
        buf[k] = '\n';
        assert_int_equal(fwrite(buf, 1, (size_t)k + 1, f), (size_t)k + 1);
    }
    fclose(f);
    assert_true(total > 4u << 20);
    lt_ctx *ctx = lt_ctx_new();
    lt_jsonl *r;
    assert_int_equal(lt_jsonl_open(ctx, tmp_path, 0, &r), LT_OK);
    lt_record rec = {0};
    for (int i = 0; i < n_lines; i++) {
        const char *line;
        size_t len;
        int64_t no;
        assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
        assert_non_null(line);
        assert_int_equal(no, i + 1);
        assert_int_equal(len, lens[i]);
        assert_int_equal(lt_record_parse(ctx, line, len, tmp_path, no, &rec), LT_OK);
        uint64_t s = seeds[i];
        size_t body = strlen(rec.text);
        assert_int_equal(body, lens[i] - 12);
        for (size_t j = 0; j < body; j++)
            if (rec.text[j] != (char)('a' + lt_test_rand_u64(&s) % 26)) fail_msg("line %d byte %zu differs", i + 1, j);
    }
    const char *line;
    size_t len;
    int64_t no;
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
    assert_null(line);
    lt_mem_stats ms = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
    /* read buffer (1 MiB) + line buffer (< 2x the longest line, plus the old half while it grows)
     * + small records */
    assert_true(ms.peak_bytes < (1u << 20) + 3 * longest + 65536);
    assert_true(ms.peak_bytes < total / 4);
    lt_record_free(ctx, &rec);
    lt_jsonl_close(ctx, r);
    lt_ctx_free(ctx);
    unlink(tmp_path);
    free(lens);
    free(seeds);
    free(buf);
}

static void mask_from_spans_marks_tokens_starting_inside(void **state) {
    (void)state;
    /* tokens start at 0, 3, 5, 9, 10, 14; text length 20 */
    size_t starts[7] = {0, 3, 5, 9, 10, 14, 20};
    lt_chat_span spans[2] = {{4, 10, 1}, {14, 20, 3}};
    uint8_t mask[6];
    memset(mask, 0xAA, sizeof mask);
    lt_dataset_mask_from_spans(starts, 6, spans, 2, mask);
    const uint8_t want[6] = {0, 0, 1, 1, 0, 1};
    assert_memory_equal(mask, want, 6);
    lt_dataset_mask_from_spans(starts, 6, NULL, 0, mask);
    for (int i = 0; i < 6; i++) assert_int_equal(mask[i], 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(record_shapes),
        cmocka_unit_test(malformed_lines_name_file_line_and_key),
        cmocka_unit_test(crlf_bom_and_long_lines),
        cmocka_unit_test(streams_large_files_in_bounded_memory),
        cmocka_unit_test(mask_from_spans_marks_tokens_starting_inside),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
