/* Dataset tokenisation with the default model's real tokenizer and chat template (SmolLM2 GGUF
 * from scripts/setup.sh; those tests are skipped when it is absent): mlx-lm's EOS rule for text,
 * chat = template then tokens, completion = the same as a two-message chat, prompt masking
 * supervises exactly the bytes of the assistant spans, malformed lines stop (file:line) or are
 * skipped and counted, and a packed batch trains exactly the supervised tokens. A committed
 * SentencePiece-style tokenizer exercises the prefix-tokenisation fallback of prompt masking. */
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
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

static char model_path[1024];
static lt_ctx *g_ctx;
static lt_gguf *g_gguf;
static lt_tokenizer *g_tok;

static const char *write_file(const char *name, const char *content) {
    static char path[256];
    snprintf(path, sizeof path, "/tmp/lt_test_dstok_%d_%s", (int)getpid(), name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(content, f);
    fclose(f);
    return path;
}

static lt_dataset *load(const char *content, const lt_dataset_options *opt) {
    const char *path = write_file("d.jsonl", content);
    lt_dataset *ds = NULL;
    lt_status s = lt_dataset_load(g_ctx, path, g_tok, opt, &ds);
    if (s != LT_OK) fail_msg("load: %s", lt_ctx_error(g_ctx));
    unlink(path);
    return ds;
}

static void encode(const char *text, int add_special, int32_t **ids, size_t *n) {
    assert_int_equal(lt_tokenizer_encode(g_ctx, g_tok, text, strlen(text), add_special, ids, n), LT_OK);
}

static void text_records_get_eos_once(void **state) {
    (void)state;
    if (!g_tok) skip();
    lt_dataset_options opt = {0};
    lt_dataset *ds = load("{\"text\": \"Hello world\"}\n{\"text\": \"ends with eos<|im_end|>\"}\n", &opt);
    lt_pack_input in = lt_dataset_input(ds);
    assert_int_equal(in.n_seqs, 2);
    int32_t eos = lt_tokenizer_eos(g_tok);
    int32_t *ids;
    size_t n;
    encode("Hello world", 1, &ids, &n);
    assert_int_equal(in.offsets[1], (int64_t)n + 1);
    assert_memory_equal(in.tokens, ids, n * sizeof *ids);
    assert_int_equal(in.tokens[n], eos);
    free(ids);
    encode("ends with eos<|im_end|>", 1, &ids, &n);
    assert_int_equal(ids[n - 1], eos); /* the special token is matched, so no second EOS */
    assert_int_equal(in.offsets[2] - in.offsets[1], (int64_t)n);
    free(ids);
    for (int64_t j = 0; j < in.offsets[2]; j++) assert_int_equal(in.supervised[j], 1);
    lt_dataset_stats st = lt_dataset_get_stats(ds);
    assert_int_equal(st.text_records, 2);
    assert_int_equal(st.chat_format, LT_CHAT_NONE);
    lt_dataset_free(g_ctx, ds);
}

static void chat_and_completion_follow_the_template(void **state) {
    (void)state;
    if (!g_tok) skip();
    const char *content =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}, {\"role\": \"assistant\", \"content\": \"4\"}]}\n"
        "{\"prompt\": \"What is 2+2?\", \"completion\": \"4\"}\n"
        "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
        " {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"Bye\"},"
        " {\"role\": \"assistant\", \"content\": \"Goodbye, \\u00e9t\\u00e9 \\ud83e\\udd99.\"}]}\n";
    for (int masked = 0; masked < 2; masked++) {
        lt_dataset_options opt = {0};
        opt.mask_prompt = masked;
        lt_dataset *ds = load(content, &opt);
        lt_pack_input in = lt_dataset_input(ds);
        lt_dataset_stats st = lt_dataset_get_stats(ds);
        assert_int_equal(st.chat_format, LT_CHAT_SMOLLM2);
        assert_int_equal(in.n_seqs, 3);
        /* record 0 = the rendered template, tokenised without added special tokens */
        lt_chat_text r = {0};
        lt_chat_message m[2] = {{"user", "What is 2+2?"}, {"assistant", "4"}};
        assert_int_equal(lt_chat_render(g_ctx, LT_CHAT_SMOLLM2, NULL, m, 2, &r), LT_OK);
        int32_t *ids;
        size_t n;
        assert_int_equal(lt_tokenizer_encode(g_ctx, g_tok, r.text, r.len, 0, &ids, &n), LT_OK);
        assert_int_equal(in.offsets[1], (int64_t)n);
        assert_memory_equal(in.tokens, ids, n * sizeof *ids);
        free(ids);
        lt_chat_text_free(g_ctx, &r);
        /* record 1 (completion) == record 0 (same chat), tokens and mask */
        assert_int_equal(in.offsets[2] - in.offsets[1], in.offsets[1]);
        assert_memory_equal(in.tokens + in.offsets[1], in.tokens, (size_t)in.offsets[1] * sizeof *in.tokens);
        assert_memory_equal(in.supervised + in.offsets[1], in.supervised, (size_t)in.offsets[1]);
        /* masked: the supervised runs decode to exactly the assistant spans' bytes */
        for (int64_t s = 0; s < in.n_seqs; s++) {
            const char *want_runs[2][2] = {{"4<|im_end|>", NULL},
                                           {"Hello!<|im_end|>",
                                            "Goodbye, \xc3\xa9t\xc3\xa9 \xf0\x9f\xa6\x99.<|im_end|>"}};
            int which = s == 2 ? 1 : 0;
            int run = 0;
            for (int64_t j = in.offsets[s]; j < in.offsets[s + 1];) {
                if (!masked) {
                    assert_int_equal(in.supervised[j], 1);
                    j++;
                    continue;
                }
                if (!in.supervised[j]) {
                    j++;
                    continue;
                }
                int64_t e = j;
                while (e < in.offsets[s + 1] && in.supervised[e]) e++;
                char *txt;
                size_t len;
                assert_int_equal(lt_tokenizer_decode(g_ctx, g_tok, in.tokens + j, (size_t)(e - j), 0, &txt, &len),
                                 LT_OK);
                assert_true(run < 2 && want_runs[which][run]);
                assert_string_equal(txt, want_runs[which][run]);
                free(txt);
                run++;
                j = e;
            }
            if (masked) assert_int_equal(run, which ? 2 : 1);
        }
        lt_dataset_free(g_ctx, ds);
    }
}

static void explicit_template_and_errors(void **state) {
    (void)state;
    if (!g_tok) skip();
    lt_dataset_options opt = {0};
    opt.chat_format = LT_CHAT_LLAMA3;
    opt.chat.bos_token = "<|im_start|>";
    lt_dataset *ds = load("{\"messages\": [{\"role\": \"user\", \"content\": \" hi \"}]}\n", &opt);
    assert_int_equal(lt_dataset_get_stats(ds).chat_format, LT_CHAT_LLAMA3);
    lt_dataset_free(g_ctx, ds);

    const char *bad = "{\"text\": \"a\"}\n{\"text\": 1}\nnot json\n{\"text\": \"b\"}\n"
                      "{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n";
    const char *path = write_file("bad.jsonl", bad);
    lt_dataset_options o2 = {0};
    lt_dataset *d2 = NULL;
    assert_int_equal(lt_dataset_load(g_ctx, path, g_tok, &o2, &d2), LT_ERR_FORMAT);
    char where[300];
    snprintf(where, sizeof where, "%s:2:", path);
    assert_non_null(strstr(lt_ctx_error(g_ctx), where));
    assert_null(d2);
    o2.skip_bad_lines = 1;
    assert_int_equal(lt_dataset_load(g_ctx, path, g_tok, &o2, &d2), LT_OK);
    lt_dataset_stats st = lt_dataset_get_stats(d2);
    assert_int_equal(st.records, 2);
    assert_int_equal(st.skipped_lines, 3);
    lt_dataset_free(g_ctx, d2);
    unlink(path);
    assert_int_equal(lt_dataset_load_split(g_ctx, "/nonexistent", "train", g_tok, &o2, &d2), LT_ERR_NOT_FOUND);
    assert_int_equal(lt_dataset_load_split(g_ctx, "/tmp", "dev", g_tok, &o2, &d2), LT_ERR_INVALID_ARG);
}

static void packed_batches_train_exactly_the_supervised_tokens(void **state) {
    (void)state;
    if (!g_tok) skip();
    char content[8192] = "";
    for (int i = 0; i < 20; i++) {
        char line[512];
        snprintf(line, sizeof line,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Question %d: why?\"}, "
                 "{\"role\": \"assistant\", \"content\": \"Because %d is %s.\"}]}\n",
                 i, i, i % 2 ? "odd" : "even");
        strcat(content, line);
    }
    lt_dataset_options opt = {0};
    opt.mask_prompt = 1;
    lt_dataset *ds = load(content, &opt);
    lt_pack_input in = lt_dataset_input(ds);
    int64_t want = 0;
    for (int64_t s = 0; s < in.n_seqs; s++)
        for (int64_t j = in.offsets[s] + 1; j < in.offsets[s + 1]; j++) want += in.supervised[j];
    lt_pack_options po = {0};
    po.row_len = 256; /* each record is ~50 tokens with SmolLM2's default system prompt */
    po.batch_size = 2;
    po.algorithm = LT_PACK_BFD;
    lt_pack_plan *plan;
    assert_int_equal(lt_pack_plan_build(g_ctx, &in, &po, &plan), LT_OK);
    lt_pack_stats ps = lt_pack_plan_stats(plan);
    assert_int_equal(ps.targets, want);
    assert_true(ps.seqs_per_row > 2.0);
    int64_t B, T, S, got = 0;
    lt_pack_batch_shape(plan, 0, &B, &T, &S);
    int32_t *buf = malloc((size_t)(3 * B * T + B * (S + 1)) * sizeof *buf);
    lt_pack_batch out = {buf, buf + B * T, buf + 2 * B * T, buf + 3 * B * T, NULL};
    for (int64_t b = 0; b < lt_pack_plan_batches(plan); b++) {
        assert_int_equal(lt_pack_fill(g_ctx, plan, &in, b, &out), LT_OK);
        for (int64_t k = 0; k < B * T; k++) got += out.targets[k] != LT_PACK_IGNORE;
    }
    assert_int_equal(got, want);
    free(buf);
    lt_pack_plan_free(g_ctx, plan);
    lt_dataset_free(g_ctx, ds);
}

/* SentencePiece-style BPE (tests/fixtures/tokenizer/spm): decoding token by token does not spell
 * the text (the leading-space marker), so masking falls back to tokenising prefixes. The supervised
 * runs must still be exactly the assistant turns. */
static void masking_falls_back_to_prefix_tokenisation(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/spm/tokenizer.json", lt_test_source_dir());
    lt_ctx *ctx = lt_ctx_new();
    lt_tokenizer *tok = NULL;
    if (lt_tokenizer_load_json(ctx, path, &tok) != LT_OK) fail_msg("%s", lt_ctx_error(ctx));
    const char *content = "{\"messages\": [{\"role\": \"user\", \"content\": \"hello there\"}, "
                          "{\"role\": \"assistant\", \"content\": \"general kenobi\"}, "
                          "{\"role\": \"user\", \"content\": \"and then\"}, "
                          "{\"role\": \"assistant\", \"content\": \"the end\"}]}\n";
    const char *file = write_file("spm.jsonl", content);
    lt_dataset_options opt = {0};
    opt.mask_prompt = 1;
    opt.chat_format = LT_CHAT_MISTRAL;
    lt_dataset *ds = NULL;
    if (lt_dataset_load(ctx, file, tok, &opt, &ds) != LT_OK) fail_msg("%s", lt_ctx_error(ctx));
    unlink(file);
    lt_pack_input in = lt_dataset_input(ds);
    const char *want[2] = {"general kenobi", "the end"};
    int run = 0;
    for (int64_t j = 0; j < in.offsets[1];) {
        if (!in.supervised[j]) {
            j++;
            continue;
        }
        int64_t e = j;
        while (e < in.offsets[1] && in.supervised[e]) e++;
        assert_int_equal(in.tokens[e - 1], lt_tokenizer_token_id(tok, "</s>")); /* each run ends with </s> */
        char *txt;
        size_t len;
        assert_int_equal(lt_tokenizer_decode(ctx, tok, in.tokens + j, (size_t)(e - j), 1, &txt, &len), LT_OK);
        assert_true(run < 2);
        const char *t = txt;
        while (*t == ' ') t++;
        assert_string_equal(t, want[run]);
        free(txt);
        run++;
        j = e;
    }
    assert_int_equal(run, 2);
    lt_dataset_free(ctx, ds);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

int main(void) {
    const char *cache = getenv("LONGTUNE_CACHE");
    const char *home = getenv("HOME");
    if (cache) snprintf(model_path, sizeof model_path, "%s/smollm2-135m-instruct-q4_1.gguf", cache);
    else
        snprintf(model_path, sizeof model_path, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", home ? home : "");
    g_ctx = lt_ctx_new();
    if (access(model_path, R_OK) != 0) {
        printf("model tests skipped: default model %s not found (run scripts/setup.sh)\n", model_path);
    } else if (lt_gguf_open(g_ctx, model_path, &g_gguf) != LT_OK ||
               lt_tokenizer_load_gguf(g_ctx, g_gguf, &g_tok) != LT_OK) {
        fprintf(stderr, "cannot load the tokenizer of %s: %s\n", model_path, lt_ctx_error(g_ctx));
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(text_records_get_eos_once),
        cmocka_unit_test(chat_and_completion_follow_the_template),
        cmocka_unit_test(explicit_template_and_errors),
        cmocka_unit_test(packed_batches_train_exactly_the_supervised_tokens),
        cmocka_unit_test(masking_falls_back_to_prefix_tokenisation),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    lt_tokenizer_free(g_tok);
    lt_gguf_close(g_gguf);
    lt_ctx_free(g_ctx);
    return rc;
}
