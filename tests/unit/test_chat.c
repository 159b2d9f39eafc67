/* Chat templates: every built-in renderer against transformers' output for the same conversations
 * (tests/fixtures/chat/, written by tests/oracle/gen_chat_fixtures.py), the assistant spans it
 * reports, recognition of the real template texts, and the typed errors (no template, unknown
 * template naming --chat-template, unsupported roles, Mistral's role alternation). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include <cjson/cJSON.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/chat.h"
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"

static char *slurp(const char *rel, size_t *len) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/chat/%s", lt_test_source_dir(), rel);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("short read %s", path);
    buf[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

/* Text just before an assistant span and the marker that ends it, per family. */
static void span_markers(lt_chat_format f, const char **before, const char **end) {
    if (f >= LT_CHAT_CHATML && f <= LT_CHAT_QWEN3) {
        *before = "<|im_start|>assistant\n";
        *end = "<|im_end|>";
    } else if (f >= LT_CHAT_LLAMA3 && f <= LT_CHAT_LLAMA3_2) {
        *before = "<|start_header_id|>assistant<|end_header_id|>\n\n";
        *end = "<|eot_id|>";
    } else if (f == LT_CHAT_GEMMA || f == LT_CHAT_GEMMA3) {
        *before = "<start_of_turn>model\n";
        *end = "<end_of_turn>";
    } else if (f == LT_CHAT_PHI3 || f == LT_CHAT_PHI3_MINI) {
        *before = "<|assistant|>\n";
        *end = "<|end|>";
    } else {
        *before = f == LT_CHAT_MISTRAL_V0_3 || f == LT_CHAT_MISTRAL_NEMO ? "[/INST]" : " [/INST]";
        *end = "</s>";
    }
}

static void renders_equal_transformers(void **state) {
    (void)state;
    char *json = slurp("cases.json", NULL);
    cJSON *root = cJSON_Parse(json);
    assert_non_null(root);
    cJSON *cases = cJSON_GetObjectItem(root, "cases");
    assert_true(cJSON_GetArraySize(cases) >= 60);
    lt_ctx *ctx = lt_ctx_new();
    lt_chat_text out = {0};
    cJSON *c;
    int n_checked = 0;
    cJSON_ArrayForEach(c, cases) {
        const char *fmt_name = cJSON_GetObjectItem(c, "format")->valuestring;
        lt_chat_format fmt;
        assert_int_equal(lt_chat_format_parse(ctx, fmt_name, &fmt), LT_OK);
        cJSON *ms = cJSON_GetObjectItem(c, "messages");
        size_t n = (size_t)cJSON_GetArraySize(ms);
        lt_chat_message msgs[16];
        size_t n_assistant = 0;
        for (size_t i = 0; i < n; i++) {
            cJSON *m = cJSON_GetArrayItem(ms, (int)i);
            msgs[i].role = cJSON_GetObjectItem(m, "role")->valuestring;
            msgs[i].content = cJSON_GetObjectItem(m, "content")->valuestring;
            n_assistant += !strcmp(msgs[i].role, "assistant");
        }
        lt_chat_options opt = {0};
        opt.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt"));
        cJSON *date = cJSON_GetObjectItem(c, "date");
        opt.date = date ? date->valuestring : NULL;
        lt_status s = lt_chat_render(ctx, fmt, &opt, msgs, n, &out);
        if (s != LT_OK) fail_msg("%s: %s", cJSON_GetObjectItem(c, "expected")->valuestring, lt_ctx_error(ctx));
        size_t want_len;
        char *want = slurp(cJSON_GetObjectItem(c, "expected")->valuestring, &want_len);
        if (out.len != want_len || memcmp(out.text, want, want_len))
            fail_msg("%s differs from transformers:\n--- got\n%s\n--- want\n%s",
                     cJSON_GetObjectItem(c, "expected")->valuestring, out.text, want);
        assert_int_equal(strlen(out.text), out.len);
        /* Spans: one per assistant message, right after the assistant header, ending with the
         * end-of-turn marker, in order and inside the text. */
        assert_int_equal(out.n_spans, n_assistant);
        const char *before, *end;
        span_markers(fmt, &before, &end);
        size_t prev = 0;
        for (size_t k = 0; k < out.n_spans; k++) {
            lt_chat_span sp = out.spans[k];
            assert_true(sp.begin >= prev && sp.begin <= sp.end && sp.end <= out.len);
            assert_string_equal(msgs[sp.message].role, "assistant");
            assert_true(sp.begin >= strlen(before));
            assert_memory_equal(out.text + sp.begin - strlen(before), before, strlen(before));
            assert_true(sp.end - sp.begin >= strlen(end));
            assert_memory_equal(out.text + sp.end - strlen(end), end, strlen(end));
            prev = sp.end;
        }
        free(want);
        n_checked++;
    }
    assert_true(n_checked >= 60);
    lt_chat_text_free(ctx, &out);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
    cJSON_Delete(root);
    free(json);
}

static void recognises_real_templates(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (int f = LT_CHAT_CHATML; f < LT_CHAT_FORMAT_COUNT_; f++) {
        char rel[128];
        snprintf(rel, sizeof rel, "templates/%s.jinja", lt_chat_format_name((lt_chat_format)f));
        char *t = slurp(rel, NULL);
        lt_chat_format got;
        lt_status s = lt_chat_detect(ctx, t, &got);
        if (s != LT_OK || got != (lt_chat_format)f)
            fail_msg("%s recognised as %s (%s)", rel, lt_chat_format_name(got), lt_ctx_error(ctx));
        free(t);
    }
    lt_ctx_free(ctx);
}

/* The chat templates real GGUFs carry (llama.cpp's vocabulary files, in
 * tests/fixtures/tokenizer/llama.cpp/): Phi-3-mini's is recognised; Qwen2's, whose default system
 * prompt ("You are a helpful assistant" without the period) none of the renderers writes, and
 * Command-R's are typed errors naming the flag. */
static void recognises_gguf_templates(void **state) {
    (void)state;
    static const struct {
        const char *file;
        lt_status want;
        lt_chat_format fmt;
    } cases[] = {{"phi-3", LT_OK, LT_CHAT_PHI3_MINI},
                 {"qwen2", LT_ERR_UNSUPPORTED, LT_CHAT_NONE},
                 {"command-r", LT_ERR_UNSUPPORTED, LT_CHAT_NONE}};
    lt_ctx *ctx = lt_ctx_new();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tests/fixtures/tokenizer/llama.cpp/%s.gguf", lt_test_source_dir(),
                 cases[i].file);
        lt_gguf *g;
        assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
        lt_tokenizer *tok;
        assert_int_equal(lt_tokenizer_load_gguf(ctx, g, &tok), LT_OK);
        lt_gguf_close(g);
        const char *tmpl = lt_tokenizer_chat_template(tok);
        assert_non_null(tmpl);
        lt_chat_format f;
        lt_status s = lt_chat_detect(ctx, tmpl, &f);
        if (s != cases[i].want || f != cases[i].fmt)
            fail_msg("%s: got %s / %s (%s)", cases[i].file, lt_status_str(s), lt_chat_format_name(f),
                     lt_ctx_error(ctx));
        if (s != LT_OK) assert_non_null(strstr(lt_ctx_error(ctx), "--chat-template NAME"));
        lt_tokenizer_free(tok);
    }
    lt_ctx_free(ctx);
}

static void unknown_or_missing_template_names_the_flag(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_chat_format f;
    assert_int_equal(lt_chat_detect(ctx, NULL, &f), LT_ERR_NOT_FOUND);
    assert_non_null(strstr(lt_ctx_error(ctx), "--chat-template NAME"));
    assert_int_equal(lt_chat_detect(ctx, "", &f), LT_ERR_NOT_FOUND);
    const char *llama2 = "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
                         "messages[0]['content'] + '\\n<</SYS>>\\n\\n' %}{% endif %}{{ bos_token + '[INST] ' + "
                         "message['content'] + ' [/INST]' }}";
    const char *gemma = "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
                        "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}";
    const char *chatml_other_default = "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
                                       "You are Hermes.<|im_end|>\\n' }}{% endif %}{% for m in messages %}"
                                       "{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}"
                                       "{% endfor %}";
    /* Phi-3-medium's and Phi-3-small's templates (no system block, or bos and <|role|> spelled from
     * the role) render differently from Phi-3.5's and are not taken for it. */
    const char *phi3_medium = "{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + "
                              "message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif "
                              "(message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif "
                              "%}{% endfor %}";
    const char *phi3_small = "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\n' + "
                             "message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
                             "'<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}";
    /* Mistral Small 3.x's [SYSTEM_PROMPT] template and a v3 template with an unknown reply shape. */
    const char *mistral_small = "{%- set default_system_message = 'You are Mistral Small 3' %}{{- bos_token }}"
                                "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- for message in "
                                "loop_messages %}{{- '[INST]' + message['content'] + '[/INST]' }}{%- endfor %}";
    const char *mistral_v3_other = "{%- if loop.last and system_message is defined %}{{- \"[INST]\" + "
                                   "system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}"
                                   "{%- elif message[\"role\"] == \"assistant\" %}{{- \" \" + "
                                   "message[\"content\"] + \"</s>\" }}";
    /* A Gemma 3 copy that joins the system text to the first turn with one newline. */
    const char *gemma3_one_newline =
        "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = "
        "messages[0]['content'] + '\\n' -%}{%- endif -%}{%- for message in loop_messages -%}"
        "{%- set role = \"model\" -%}{{ '<start_of_turn>' + role + '\\n' + "
        "(first_user_prefix if loop.first else \"\") }}{{ message['content'] | trim }}"
        "{{ '<end_of_turn>\\n' }}{%- endfor -%}";
    /* Relatives of the recognised families that render plain conversations differently: SmolLM3
     * (SmolLM2's sentence inside a longer system prompt), LFM2 (ChatML after a BOS), Hermes' tool
     * templates, Qwen3.5 (Qwen3's markers, another rule for reasoning), Functionary 3.1 (Llama
     * 3.1's header without the date line) and FireFunction (Llama 3 with functions). */
    const char *smollm3 = "{{ '<|im_start|>system\\n' }}You are a helpful AI assistant named SmolLM, trained by "
                          "Hugging Face. Your role is to think.{% for m in messages %}<|im_start|>{{ m.role }}\\n"
                          "{{ m.content }}<|im_end|>\\n{% endfor %}";
    const char *lfm2 = "{{ bos_token }}{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
                       "'<|im_end|>' + '\\n'}}{% endfor %}";
    const char *hermes_tools = "{% if tools %}{{ '<|im_start|>system\\n' + tools | tojson }}{% endif %}{% for m in "
                               "messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n'}}"
                               "{% endfor %}";
    const char *qwen35 = "{%- set ns = namespace(last_query_index=messages|length - 1) %}{% for m in messages %}"
                         "<|im_start|>{{ m.role }}\\n{% if loop.last %}<think>\\n\\n</think>\\n\\n{% endif %}"
                         "{{ m.content }}<|im_end|>\\n{% endfor %}{{ '<|im_start|>assistant\\n<think>\\n' }}";
    const char *functionary31 = "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\\n\\nCutting Knowledge "
                                "Date: December 2023\\n\\n<|eot_id|>{% for m in messages %}{{ m.content | trim }}"
                                "<|eot_id|>{% endfor %}";
    const char *firefunction = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>"
                               "\\n\\n{{ m.content | trim }} {{ functions }}<|eot_id|>{% endfor %}";
    const char *bad[] = {llama2,
                         gemma,
                         chatml_other_default,
                         "{{ messages }}",
                         phi3_medium,
                         phi3_small,
                         mistral_small,
                         mistral_v3_other,
                         gemma3_one_newline,
                         smollm3,
                         lfm2,
                         hermes_tools,
                         qwen35,
                         functionary31,
                         firefunction};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(lt_chat_detect(ctx, bad[i], &f), LT_ERR_UNSUPPORTED);
        assert_non_null(strstr(lt_ctx_error(ctx), "--chat-template NAME"));
        assert_non_null(strstr(lt_ctx_error(ctx), "smollm2"));
    }
    assert_int_equal(lt_chat_format_parse(ctx, "llama3.1", &f), LT_OK);
    assert_int_equal(f, LT_CHAT_LLAMA3_1);
    assert_int_equal(lt_chat_format_parse(ctx, "vicuna", &f), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_chat_format_parse(ctx, "none", &f), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

static void role_errors_are_typed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_chat_text out = {0};
    lt_chat_message tool[] = {{"user", "hi"}, {"tool", "{}"}};
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_SMOLLM2, NULL, tool, 2, &out), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "messages[1]"));
    lt_chat_message twice[] = {{"user", "a"}, {"user", "b"}};
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_MISTRAL, NULL, twice, 2, &out), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "alternate"));
    lt_chat_message sys[] = {{"system", "s"}, {"user", "b"}};
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_MISTRAL, NULL, sys, 2, &out), LT_ERR_FORMAT);
    /* Gemma 1/2 refuse a system message; Gemma 3 and Mistral v3 check alternation after it. */
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_GEMMA, NULL, sys, 2, &out), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "messages[0]"));
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_GEMMA3, NULL, sys, 2, &out), LT_OK);
    assert_string_equal(out.text, "<bos><start_of_turn>user\ns\n\nb<end_of_turn>\n");
    lt_chat_message sys_twice[] = {{"system", "s"}, {"user", "a"}, {"user", "b"}};
    lt_chat_format alternating[] = {LT_CHAT_GEMMA3, LT_CHAT_MISTRAL_V0_3, LT_CHAT_MISTRAL_NEMO};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(lt_chat_render(ctx, alternating[i], NULL, sys_twice, 3, &out), LT_ERR_FORMAT);
        assert_non_null(strstr(lt_ctx_error(ctx), "messages[2]"));
        assert_int_equal(lt_chat_render(ctx, alternating[i], NULL, twice, 2, &out), LT_ERR_FORMAT);
    }
    lt_chat_message nul[] = {{"user", NULL}};
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_CHATML, NULL, nul, 1, &out), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_NONE, NULL, twice, 2, &out), LT_ERR_INVALID_ARG);
    /* Llama 3.2 without a date renders today's, in the template's "%d %b %Y" shape. */
    lt_chat_message one[] = {{"user", "x"}};
    assert_int_equal(lt_chat_render(ctx, LT_CHAT_LLAMA3_2, NULL, one, 1, &out), LT_OK);
    const char *d = strstr(out.text, "Today Date: ");
    assert_non_null(d);
    d += strlen("Today Date: ");
    assert_true(d[0] >= '0' && d[0] <= '3' && d[2] == ' ' && d[6] == ' ' && d[11] == '\n');
    lt_chat_text_free(ctx, &out);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(renders_equal_transformers), cmocka_unit_test(recognises_real_templates),
        cmocka_unit_test(recognises_gguf_templates),  cmocka_unit_test(unknown_or_missing_template_names_the_flag),
        cmocka_unit_test(role_errors_are_typed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
