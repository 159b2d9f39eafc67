/* Built-in chat template renderers (chat.h). Each format is written out by hand from the Jinja
 * template it replaces, with the same string operations (Python's str.strip for Jinja's trim,
 * Qwen3's think-block splitting, Gemma 3's and Mistral v3's placement of the system message), so plain conversations render byte for byte as transformers
 * does; tests/fixtures/chat/ holds transformers' own output. Recognition looks for the literal
 * pieces that make each template distinct. No Jinja is interpreted here. */
#define _POSIX_C_SOURCE 200809L /* localtime_r */
#include <string.h>
#include <time.h>

#include "longtune/alloc.h"
#include "longtune/chat.h"

static const char *const format_names[LT_CHAT_FORMAT_COUNT_] = {
    "none",    "chatml",       "smollm2", "qwen2",  "qwen2.5", "qwen3",        "llama3",       "llama3.1",  "llama3.2",
    "mistral", "mistral-v0.1", "gemma",   "gemma3", "phi3",    "mistral-v0.3", "mistral-nemo", "phi3-mini",
};

#define CHAT_NAMES_HELP                                                                                         \
    "chatml, smollm2, qwen2, qwen2.5, qwen3, llama3, llama3.1, llama3.2, mistral, mistral-v0.1, mistral-v0.3, " \
    "mistral-nemo, gemma, gemma3, phi3, phi3-mini"

static const char SMOLLM2_SYSTEM[] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
static const char QWEN2_SYSTEM[] = "You are a helpful assistant.";
static const char QWEN2_5_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

const char *lt_chat_format_name(lt_chat_format fmt) {
    return (unsigned)fmt < LT_CHAT_FORMAT_COUNT_ ? format_names[fmt] : "unknown";
}

lt_status lt_chat_format_parse(lt_ctx *ctx, const char *name, lt_chat_format *out) {
    for (int f = 1; f < LT_CHAT_FORMAT_COUNT_; f++)
        if (name && !strcmp(name, format_names[f])) {
            *out = (lt_chat_format)f;
            return LT_OK;
        }
    return lt_error(ctx, LT_ERR_INVALID_ARG, "unknown chat template '%s' (one of: " CHAT_NAMES_HELP ")",
                    name ? name : "(null)");
}

/* ---- recognition ---- */

/* A ChatML template that writes a literal system prompt of its own ("<|im_start|>system\n" followed
 * by text rather than by the end of a string literal) carries a default we would not reproduce. */
static int chatml_has_unknown_default(const char *t) {
    for (const char *p = strstr(t, "<|im_start|>system"); p; p = strstr(p + 1, "<|im_start|>system")) {
        const char *q = p + strlen("<|im_start|>system");
        if (q[0] == '\n') q += 1;
        else if (q[0] == '\\' && q[1] == 'n') q += 2;
        else continue;
        if (*q != '\'' && *q != '"') return 1;
    }
    return 0;
}

lt_status lt_chat_detect(lt_ctx *ctx, const char *t, lt_chat_format *out) {
    *out = LT_CHAT_NONE;
    if (!t || !*t)
        return lt_error(ctx, LT_ERR_NOT_FOUND,
                        "the model has no chat template; pass --chat-template NAME (one of: " CHAT_NAMES_HELP ")");
    lt_chat_format f = LT_CHAT_NONE;
    /* Relatives that share a family's markers but render differently are told apart by a piece
     * only the family's own template has: Qwen3's rule for earlier reasoning (Qwen3.5, MiniCPM5,
     * StepFun differ), SmolLM2's system line ending its turn (SmolLM3 goes on), no tools or BOS in
     * plain ChatML (Hermes' tool templates, LFM2), no functions in Llama 3 (FireFunction,
     * Functionary) and Llama 3.1's date_string line (Functionary 3.1 has none). */
    if (strstr(t, "<|im_start|>") && strstr(t, "<|im_end|>")) {
        if (strstr(t, "<think>") && strstr(t, "last_query_index")) {
            if (strstr(t, "(not loop.last and reasoning_content)")) f = LT_CHAT_QWEN3;
        } else if (strstr(t, SMOLLM2_SYSTEM)) {
            if (strstr(t, "trained by Hugging Face<|im_end|>")) f = LT_CHAT_SMOLLM2;
        } else if (strstr(t, QWEN2_5_SYSTEM)) {
            f = LT_CHAT_QWEN2_5;
        } else if (strstr(t, "You are a helpful assistant.<|im_end|>") && strstr(t, "loop.first")) {
            f = LT_CHAT_QWEN2;
        } else if (!chatml_has_unknown_default(t) && !strstr(t, "<think>") && !strstr(t, "tool") &&
                   !strstr(t, "bos_token")) {
            f = LT_CHAT_CHATML;
        }
    } else if (strstr(t, "<|start_header_id|>") && strstr(t, "<|eot_id|>")) {
        if (strstr(t, "Cutting Knowledge Date")) {
            if (strstr(t, "\"Today Date: \" + date_string"))
                f = strstr(t, "strftime_now") ? LT_CHAT_LLAMA3_2 : LT_CHAT_LLAMA3_1;
        } else if (strstr(t, "trim") && strstr(t, "bos_token") && !strstr(t, "function")) {
            f = LT_CHAT_LLAMA3;
        }
    } else if (strstr(t, "'[INST] ' + message['content'] + ' [/INST]'") && !strstr(t, "<<SYS>>") &&
               !strstr(t, "system")) {
        f = strstr(t, "eos_token + ' '") ? LT_CHAT_MISTRAL_V0_1 : LT_CHAT_MISTRAL;
    } else if (strstr(t, "loop.last and system_message is defined") && strstr(t, "[/INST]")) {
        /* Mistral's v3 templates: v0.3 writes "[INST] " and " " + trimmed reply, Nemo (tekken)
         * "[INST]" and the reply as is. */
        if (strstr(t, "\"[INST] \" + system_message") && strstr(t, "\" \" + message[\"content\"]|trim + eos_token"))
            f = LT_CHAT_MISTRAL_V0_3;
        else if (strstr(t, "\"[INST]\" + system_message") && strstr(t, "message[\"content\"] + eos_token"))
            f = LT_CHAT_MISTRAL_NEMO;
    } else if (strstr(t, "<start_of_turn>") && strstr(t, "<end_of_turn>") && strstr(t, "model") &&
               strstr(t, "| trim")) {
        if (strstr(t, "System role not supported")) f = LT_CHAT_GEMMA;
        else if (strstr(t, "first_user_prefix = messages[0]['content'] + '\\n\\n'") ||
                 strstr(t, "first_user_prefix = messages[0]['content'] + '\n\n'"))
            f = LT_CHAT_GEMMA3; /* copies that join the system text with one newline are not it */
    } else if (strstr(t, "<|user|>") && strstr(t, "<|assistant|>") && strstr(t, "<|end|>") &&
               strstr(t, "message['role'] == 'system' and message['content']") && strstr(t, "eos_token") &&
               !strstr(t, "bos_token")) {
        f = LT_CHAT_PHI3;
    } else if (strstr(t,
                      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
                      "{{'<|user|>' + '\\n' + message['content'] + '<|end|>' + '\\n' + '<|assistant|>' + '\\n'}}"
                      "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\\n'}}"
                      "{% endif %}{% endfor %}") ||
               strstr(t,
                      "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
                      "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
                      "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}"
                      "{% endif %}{% endfor %}")) {
        /* Phi-3-mini's first template, with its '\n' pieces escaped or as newlines. */
        f = LT_CHAT_PHI3_MINI;
    }
    if (f == LT_CHAT_NONE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "the model's chat template is not one longtune renders; pass --chat-template NAME "
                        "(one of: " CHAT_NAMES_HELP ") to choose the format explicitly");
    *out = f;
    return LT_OK;
}

/* ---- output buffer ---- */

static lt_status put(lt_ctx *ctx, lt_chat_text *o, const char *s, size_t n) {
    if (o->len + n + 1 > o->cap_) {
        size_t cap = o->cap_ ? o->cap_ : 256;
        while (cap < o->len + n + 1) {
            if (cap > SIZE_MAX / 2) return lt_error(ctx, LT_ERR_OOM, "chat: text too large");
            cap *= 2;
        }
        char *p = lt_alloc(ctx, LT_DEVICE_CPU, cap, "chat text");
        if (!p) return LT_ERR_OOM;
        if (o->len) memcpy(p, o->text, o->len);
        lt_free(ctx, LT_DEVICE_CPU, o->text, o->cap_);
        o->text = p;
        o->cap_ = cap;
    }
    if (n) memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = 0;
    return LT_OK;
}

static lt_status puts_(lt_ctx *ctx, lt_chat_text *o, const char *s) { return put(ctx, o, s, strlen(s)); }

static lt_status add_span(lt_ctx *ctx, lt_chat_text *o, size_t begin, size_t message) {
    if (o->n_spans == o->spans_cap_) {
        size_t cap = o->spans_cap_ ? 2 * o->spans_cap_ : 8;
        lt_chat_span *p = lt_alloc(ctx, LT_DEVICE_CPU, cap * sizeof *p, "chat spans");
        if (!p) return LT_ERR_OOM;
        if (o->n_spans) memcpy(p, o->spans, o->n_spans * sizeof *p);
        lt_free(ctx, LT_DEVICE_CPU, o->spans, o->spans_cap_ * sizeof *p);
        o->spans = p;
        o->spans_cap_ = cap;
    }
    o->spans[o->n_spans++] = (lt_chat_span){begin, o->len, message};
    return LT_OK;
}

void lt_chat_text_free(lt_ctx *ctx, lt_chat_text *t) {
    if (!t) return;
    lt_free(ctx, LT_DEVICE_CPU, t->text, t->cap_);
    lt_free(ctx, LT_DEVICE_CPU, t->spans, t->spans_cap_ * sizeof *t->spans);
    memset(t, 0, sizeof *t);
}

/* ---- Python string operations ---- */

/* Length of the UTF-8 character at s (1 for invalid bytes) and its code point (or -1). */
static size_t utf8_char(const unsigned char *s, size_t n, long *cp) {
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    size_t len = s[0] >= 0xF0 ? 4 : s[0] >= 0xE0 ? 3 : s[0] >= 0xC0 ? 2 : 0;
    if (!len || len > n) {
        *cp = -1;
        return 1;
    }
    long v = s[0] & (0x3F >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    *cp = v;
    return len;
}

/* Python's str.isspace for one code point. */
static int py_isspace(long c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
        (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Jinja's trim (Python str.strip()): [*b, *e) shrinks past leading and trailing whitespace.
 * Invalid UTF-8 is never whitespace (Python would have refused it earlier). */
static void py_strip(const char *s, size_t *b, size_t *e) {
    const unsigned char *u = (const unsigned char *)s;
    while (*b < *e) {
        long cp;
        size_t k = utf8_char(u + *b, *e - *b, &cp);
        if (!py_isspace(cp)) break;
        *b += k;
    }
    while (*e > *b) {
        size_t st = *e - 1;
        while (st > *b && (u[st] & 0xC0) == 0x80 && *e - st < 4) st--;
        long cp;
        size_t k = utf8_char(u + st, *e - st, &cp);
        if (st + k != *e || !py_isspace(cp)) break;
        *e = st;
    }
}

/* Finds needle in [s, s+n): offset of the first (last when `last`) occurrence or -1. */
static long find(const char *s, size_t n, const char *needle, int last) {
    size_t m = strlen(needle);
    long hit = -1;
    for (size_t i = 0; i + m <= n; i++)
        if (!memcmp(s + i, needle, m)) {
            hit = (long)i;
            if (!last) break;
        }
    return hit;
}

/* ---- renderers ---- */

static int role_is(const lt_chat_message *m, const char *r) { return !strcmp(m->role, r); }

static lt_status check_roles(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_message *msgs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "messages[%zu]: role and content are required", i);
        if (!role_is(&msgs[i], "system") && !role_is(&msgs[i], "user") && !role_is(&msgs[i], "assistant"))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "messages[%zu]: role '%s' is not supported by the built-in '%s' template "
                            "(system, user, assistant)",
                            i, msgs[i].role, lt_chat_format_name(fmt));
    }
    return LT_OK;
}

static lt_status render_chatml(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt, const lt_chat_message *m,
                               size_t n, lt_chat_text *o) {
    const char *def = fmt == LT_CHAT_SMOLLM2 ? SMOLLM2_SYSTEM
        : fmt == LT_CHAT_QWEN2               ? QWEN2_SYSTEM
        : fmt == LT_CHAT_QWEN2_5             ? QWEN2_5_SYSTEM
                                             : NULL;
    /* SmolLM2/Qwen2 insert the default inside the loop at loop.first, Qwen2.5 before it: both
     * only when messages[0] is not a system message, and only when there are messages (Qwen2.5
     * writes it even for an empty list). */
    if (def && (n > 0 || fmt == LT_CHAT_QWEN2_5) && (n == 0 || !role_is(&m[0], "system"))) {
        LT_TRY(puts_(ctx, o, "<|im_start|>system\n"));
        LT_TRY(puts_(ctx, o, def));
        LT_TRY(puts_(ctx, o, "<|im_end|>\n"));
    }
    size_t last_query = n ? n - 1 : 0;
    if (fmt == LT_CHAT_QWEN3)
        for (size_t k = n; k-- > 0;) {
            const char *c = m[k].content;
            size_t cl = strlen(c);
            int tool_resp = cl >= strlen("<tool_response>") + strlen("</tool_response>") &&
                !strncmp(c, "<tool_response>", strlen("<tool_response>")) &&
                !strcmp(c + cl - strlen("</tool_response>"), "</tool_response>");
            if (role_is(&m[k], "user") && !tool_resp) {
                last_query = k;
                break;
            }
        }
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t cl = strlen(c);
        LT_TRY(puts_(ctx, o, "<|im_start|>"));
        LT_TRY(puts_(ctx, o, m[i].role));
        LT_TRY(puts_(ctx, o, "\n"));
        size_t begin = o->len;
        int assistant = role_is(&m[i], "assistant");
        if (fmt == LT_CHAT_QWEN3 && assistant) {
            /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n');
             * content = content.split('</think>')[-1].lstrip('\n') */
            size_t rb = 0, re = 0, cb = 0, ce = cl;
            long close1 = find(c, cl, "</think>", 0);
            if (close1 >= 0) {
                re = (size_t)close1;
                while (re > 0 && c[re - 1] == '\n') re--;
                long open = find(c, re, "<think>", 1);
                rb = open >= 0 ? (size_t)open + strlen("<think>") : 0;
                while (rb < re && c[rb] == '\n') rb++;
                cb = (size_t)find(c, cl, "</think>", 1) + strlen("</think>");
                while (cb < ce && c[cb] == '\n') cb++;
            }
            if (i > last_query && (i + 1 == n || re > rb)) {
                while (rb < re && c[rb] == '\n') rb++; /* reasoning_content.strip('\n') */
                while (re > rb && c[re - 1] == '\n') re--;
                while (cb < ce && c[cb] == '\n') cb++; /* content.lstrip('\n') */
                LT_TRY(puts_(ctx, o, "<think>\n"));
                LT_TRY(put(ctx, o, c + rb, re - rb));
                LT_TRY(puts_(ctx, o, "\n</think>\n\n"));
            }
            LT_TRY(put(ctx, o, c + cb, ce - cb));
        } else {
            LT_TRY(put(ctx, o, c, cl));
        }
        LT_TRY(puts_(ctx, o, "<|im_end|>"));
        if (assistant) LT_TRY(add_span(ctx, o, begin, i));
        LT_TRY(puts_(ctx, o, "\n"));
    }
    if (opt->add_generation_prompt) LT_TRY(puts_(ctx, o, "<|im_start|>assistant\n"));
    return LT_OK;
}

static lt_status llama_message(lt_ctx *ctx, lt_chat_text *o, const lt_chat_message *m, size_t i) {
    LT_TRY(puts_(ctx, o, "<|start_header_id|>"));
    LT_TRY(puts_(ctx, o, m->role));
    LT_TRY(puts_(ctx, o, "<|end_header_id|>\n\n"));
    size_t begin = o->len, b = 0, e = strlen(m->content);
    py_strip(m->content, &b, &e);
    LT_TRY(put(ctx, o, m->content + b, e - b));
    LT_TRY(puts_(ctx, o, "<|eot_id|>"));
    if (role_is(m, "assistant")) LT_TRY(add_span(ctx, o, begin, i));
    return LT_OK;
}

static lt_status render_llama(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt, const lt_chat_message *m,
                              size_t n, lt_chat_text *o) {
    const char *bos = opt->bos_token ? opt->bos_token : "<|begin_of_text|>";
    size_t first = 0;
    if (fmt == LT_CHAT_LLAMA3) {
        /* bos only before the first message (none for an empty conversation). */
        if (n) LT_TRY(puts_(ctx, o, bos));
    } else {
        char today[64];
        const char *date = opt->date;
        if (!date && fmt == LT_CHAT_LLAMA3_2) {
            time_t now = time(NULL);
            struct tm tmv;
            localtime_r(&now, &tmv);
            strftime(today, sizeof today, "%d %b %Y", &tmv);
            date = today;
        }
        if (!date) date = "26 Jul 2024";
        LT_TRY(puts_(ctx, o, bos));
        LT_TRY(puts_(ctx, o, "<|start_header_id|>system<|end_header_id|>\n\n"));
        LT_TRY(puts_(ctx, o, "Cutting Knowledge Date: December 2023\nToday Date: "));
        LT_TRY(puts_(ctx, o, date));
        LT_TRY(puts_(ctx, o, "\n\n"));
        if (n && role_is(&m[0], "system")) {
            size_t b = 0, e = strlen(m[0].content);
            py_strip(m[0].content, &b, &e);
            LT_TRY(put(ctx, o, m[0].content + b, e - b));
            first = 1;
        }
        LT_TRY(puts_(ctx, o, "<|eot_id|>"));
    }
    for (size_t i = first; i < n; i++) LT_TRY(llama_message(ctx, o, &m[i], i));
    if (opt->add_generation_prompt) LT_TRY(puts_(ctx, o, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    return LT_OK;
}

static lt_status render_mistral(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt, const lt_chat_message *m,
                                size_t n, lt_chat_text *o) {
    const char *bos = opt->bos_token ? opt->bos_token : "<s>";
    const char *eos = opt->eos_token ? opt->eos_token : "</s>";
    LT_TRY(puts_(ctx, o, bos));
    for (size_t i = 0; i < n; i++) {
        int user = role_is(&m[i], "user");
        if (user != (i % 2 == 0))
            return lt_error(ctx, LT_ERR_FORMAT,
                            "messages[%zu]: conversation roles must alternate user/assistant/user/assistant/... "
                            "(template '%s')",
                            i, lt_chat_format_name(fmt));
        if (user) {
            LT_TRY(puts_(ctx, o, "[INST] "));
            LT_TRY(puts_(ctx, o, m[i].content));
            LT_TRY(puts_(ctx, o, " [/INST]"));
        } else if (role_is(&m[i], "assistant")) {
            size_t begin = o->len;
            LT_TRY(puts_(ctx, o, m[i].content));
            LT_TRY(puts_(ctx, o, eos));
            LT_TRY(add_span(ctx, o, begin, i));
            if (fmt == LT_CHAT_MISTRAL_V0_1) LT_TRY(puts_(ctx, o, " "));
        } else {
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "messages[%zu]: only user and assistant roles are supported by template '%s'", i,
                            lt_chat_format_name(fmt));
        }
    }
    /* These templates have no generation prompt: a reply follows [/INST] directly. */
    return LT_OK;
}

/* Alternation as the templates' raise_exception: message k of the loop must be a user message
 * exactly when k is even. */
static lt_status check_alternation(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_message *m, size_t from, size_t n) {
    for (size_t i = from; i < n; i++)
        if (role_is(&m[i], "user") != ((i - from) % 2 == 0))
            return lt_error(ctx, LT_ERR_FORMAT,
                            "messages[%zu]: conversation roles must alternate user/assistant/user/assistant/... "
                            "(template '%s'%s)",
                            i, lt_chat_format_name(fmt), from ? ", after the optional system message" : "");
    return LT_OK;
}

static lt_status put_trimmed(lt_ctx *ctx, lt_chat_text *o, const char *s) {
    size_t b = 0, e = strlen(s);
    py_strip(s, &b, &e);
    return put(ctx, o, s + b, e - b);
}

/* Gemma 1/2: no system role; Gemma 3: a system message's text + "\n\n" opens the first turn. */
static lt_status render_gemma(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt, const lt_chat_message *m,
                              size_t n, lt_chat_text *o) {
    size_t first = 0;
    const char *prefix = NULL;
    if (n && role_is(&m[0], "system")) {
        if (fmt == LT_CHAT_GEMMA)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "messages[0]: the system role is not supported by template 'gemma' (Gemma 1/2 raise "
                            "'System role not supported'; gemma3 folds it into the first user turn)");
        prefix = m[0].content;
        first = 1;
    }
    LT_TRY(check_alternation(ctx, fmt, m, first, n));
    LT_TRY(puts_(ctx, o, opt->bos_token ? opt->bos_token : "<bos>"));
    for (size_t i = first; i < n; i++) {
        int assistant = role_is(&m[i], "assistant");
        LT_TRY(puts_(ctx, o, assistant ? "<start_of_turn>model\n" : "<start_of_turn>user\n"));
        if (prefix && i == first) {
            LT_TRY(puts_(ctx, o, prefix));
            LT_TRY(puts_(ctx, o, "\n\n"));
        }
        size_t begin = o->len;
        LT_TRY(put_trimmed(ctx, o, m[i].content));
        LT_TRY(puts_(ctx, o, "<end_of_turn>"));
        if (assistant) LT_TRY(add_span(ctx, o, begin, i));
        LT_TRY(puts_(ctx, o, "\n"));
    }
    if (opt->add_generation_prompt) LT_TRY(puts_(ctx, o, "<start_of_turn>model\n"));
    return LT_OK;
}

/* Phi-3.5: a system message with empty content is left out; eos ends a conversation that asks
 * for no reply. */
static lt_status render_phi3(lt_ctx *ctx, const lt_chat_options *opt, const lt_chat_message *m, size_t n,
                             lt_chat_text *o) {
    for (size_t i = 0; i < n; i++) {
        int assistant = role_is(&m[i], "assistant");
        if (role_is(&m[i], "system") && !m[i].content[0]) continue;
        LT_TRY(puts_(ctx, o, assistant ? "<|assistant|>\n" : role_is(&m[i], "user") ? "<|user|>\n" : "<|system|>\n"));
        size_t begin = o->len;
        LT_TRY(puts_(ctx, o, m[i].content));
        LT_TRY(puts_(ctx, o, "<|end|>"));
        if (assistant) LT_TRY(add_span(ctx, o, begin, i));
        LT_TRY(puts_(ctx, o, "\n"));
    }
    if (opt->add_generation_prompt) return puts_(ctx, o, "<|assistant|>\n");
    return puts_(ctx, o, opt->eos_token ? opt->eos_token : "<|endoftext|>");
}

/* Phi-3-mini's first template: each user turn ends with the assistant header, so there is no
 * separate generation prompt; system messages are left out. */
static lt_status render_phi3_mini(lt_ctx *ctx, const lt_chat_options *opt, const lt_chat_message *m, size_t n,
                                  lt_chat_text *o) {
    LT_TRY(puts_(ctx, o, opt->bos_token ? opt->bos_token : "<s>"));
    for (size_t i = 0; i < n; i++) {
        if (role_is(&m[i], "user")) {
            LT_TRY(puts_(ctx, o, "<|user|>\n"));
            LT_TRY(puts_(ctx, o, m[i].content));
            LT_TRY(puts_(ctx, o, "<|end|>\n<|assistant|>\n"));
        } else if (role_is(&m[i], "assistant")) {
            size_t begin = o->len;
            LT_TRY(puts_(ctx, o, m[i].content));
            LT_TRY(puts_(ctx, o, "<|end|>"));
            LT_TRY(add_span(ctx, o, begin, i));
            LT_TRY(puts_(ctx, o, "\n"));
        }
    }
    return LT_OK;
}

/* Mistral's v3 templates: an optional leading system message goes before the last message when
 * that is a user message (and is dropped otherwise, as the templates do). */
static lt_status render_mistral_v3(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt,
                                   const lt_chat_message *m, size_t n, lt_chat_text *o) {
    size_t first = n && role_is(&m[0], "system") ? 1 : 0;
    int v3 = fmt == LT_CHAT_MISTRAL_V0_3;
    LT_TRY(check_alternation(ctx, fmt, m, first, n));
    LT_TRY(puts_(ctx, o, opt->bos_token ? opt->bos_token : "<s>"));
    const char *eos = opt->eos_token ? opt->eos_token : "</s>";
    for (size_t i = first; i < n; i++) {
        if (role_is(&m[i], "user")) {
            LT_TRY(puts_(ctx, o, v3 ? "[INST] " : "[INST]"));
            if (first && i + 1 == n) {
                LT_TRY(puts_(ctx, o, m[0].content));
                LT_TRY(puts_(ctx, o, "\n\n"));
            }
            LT_TRY(puts_(ctx, o, m[i].content));
            LT_TRY(puts_(ctx, o, "[/INST]"));
        } else {
            size_t begin = o->len;
            if (v3) {
                LT_TRY(puts_(ctx, o, " "));
                LT_TRY(put_trimmed(ctx, o, m[i].content));
            } else {
                LT_TRY(puts_(ctx, o, m[i].content));
            }
            LT_TRY(puts_(ctx, o, eos));
            LT_TRY(add_span(ctx, o, begin, i));
        }
    }
    return LT_OK;
}

lt_status lt_chat_render(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt_in, const lt_chat_message *msgs,
                         size_t n, lt_chat_text *out) {
    lt_chat_options opt;
    memset(&opt, 0, sizeof opt);
    if (opt_in) opt = *opt_in;
    if (fmt <= LT_CHAT_NONE || fmt >= LT_CHAT_FORMAT_COUNT_)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "chat: no template format chosen (%d)", (int)fmt);
    if (n && !msgs) return lt_error(ctx, LT_ERR_INVALID_ARG, "chat: messages missing");
    out->len = 0;
    out->n_spans = 0;
    LT_TRY(put(ctx, out, "", 0));
    LT_TRY(check_roles(ctx, fmt, msgs, n));
    switch (fmt) {
    case LT_CHAT_CHATML:
    case LT_CHAT_SMOLLM2:
    case LT_CHAT_QWEN2:
    case LT_CHAT_QWEN2_5:
    case LT_CHAT_QWEN3: return render_chatml(ctx, fmt, &opt, msgs, n, out);
    case LT_CHAT_LLAMA3:
    case LT_CHAT_LLAMA3_1:
    case LT_CHAT_LLAMA3_2: return render_llama(ctx, fmt, &opt, msgs, n, out);
    case LT_CHAT_MISTRAL:
    case LT_CHAT_MISTRAL_V0_1: return render_mistral(ctx, fmt, &opt, msgs, n, out);
    case LT_CHAT_GEMMA:
    case LT_CHAT_GEMMA3: return render_gemma(ctx, fmt, &opt, msgs, n, out);
    case LT_CHAT_PHI3: return render_phi3(ctx, &opt, msgs, n, out);
    case LT_CHAT_PHI3_MINI: return render_phi3_mini(ctx, &opt, msgs, n, out);
    case LT_CHAT_MISTRAL_V0_3:
    case LT_CHAT_MISTRAL_NEMO: return render_mistral_v3(ctx, fmt, &opt, msgs, n, out);
    default: break;
    }
    return lt_error(ctx, LT_ERR_INVALID_ARG, "chat: unknown format %d", (int)fmt);
}
