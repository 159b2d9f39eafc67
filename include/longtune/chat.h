/* Chat templates: built-in renderers for the chat formats of the supported model families (ChatML
 * as used by Qwen2/2.5/3 and SmolLM2, Llama 3 / 3.1 / 3.2, Mistral [INST] v0.1-v0.3 and Nemo, Gemma
 * 1/2/3, Phi-3/3.5), chosen by recognising the
 * model's Jinja template string. The output equals transformers' apply_chat_template for plain
 * system/user/assistant conversations, and the renderer reports the byte spans the assistant
 * generates (for prompt masking). It is not a Jinja engine: tools, images and unknown roles are
 * typed errors, and an unrecognised template is an error that names `--chat-template NAME`. */
#ifndef LONGTUNE_CHAT_H
#define LONGTUNE_CHAT_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_chat_format {
    LT_CHAT_NONE = 0,     /* no template (plain text only) */
    LT_CHAT_CHATML,       /* "chatml": <|im_start|>role\n...<|im_end|>\n, no default system prompt */
    LT_CHAT_SMOLLM2,      /* "smollm2": ChatML + "You are a helpful AI assistant named SmolLM, ..." */
    LT_CHAT_QWEN2,        /* "qwen2": ChatML + "You are a helpful assistant." */
    LT_CHAT_QWEN2_5,      /* "qwen2.5": ChatML + "You are Qwen, created by Alibaba Cloud. ..." */
    LT_CHAT_QWEN3,        /* "qwen3": ChatML, <think> blocks after the last user turn */
    LT_CHAT_LLAMA3,       /* "llama3": Llama 3 Instruct (bos, headers, trimmed content, <|eot_id|>) */
    LT_CHAT_LLAMA3_1,     /* "llama3.1": Llama 3.1 (system header with knowledge and today dates) */
    LT_CHAT_LLAMA3_2,     /* "llama3.2": as llama3.1, but today's date by default (strftime_now) */
    LT_CHAT_MISTRAL,      /* "mistral": bos [INST] user [/INST]assistant</s> (v0.2 style) */
    LT_CHAT_MISTRAL_V0_1, /* "mistral-v0.1": as mistral with a space after each </s> */
    LT_CHAT_GEMMA,        /* "gemma": Gemma 1/2 (<bos><start_of_turn>user\n...<end_of_turn>\n, the assistant
                             as "model", trimmed content; no system role) */
    LT_CHAT_GEMMA3,       /* "gemma3": as gemma, a system message folded into the first user turn */
    LT_CHAT_PHI3,         /* "phi3": Phi-3/3.5 (<|user|>\n...<|end|>\n, eos at the end without a prompt) */
    LT_CHAT_MISTRAL_V0_3, /* "mistral-v0.3": v3 template ([INST] ...[/INST] trimmed reply</s>, the system
                             message before the last user message) */
    LT_CHAT_MISTRAL_NEMO, /* "mistral-nemo": v3-tekken template ([INST]...[/INST]reply</s>) */
    LT_CHAT_PHI3_MINI,    /* "phi3-mini": Phi-3-mini's first template (bos, <|assistant|>\n after each user
                             turn, system messages left out) */
    LT_CHAT_FORMAT_COUNT_
} lt_chat_format;

typedef struct lt_chat_message {
    const char *role;    /* "system" | "user" | "assistant" */
    const char *content; /* UTF-8, NUL-terminated */
} lt_chat_message;

/* Zero-initialised fields take the defaults noted. */
typedef struct lt_chat_options {
    int add_generation_prompt; /* append the assistant header that starts a reply */
    const char *bos_token;     /* NULL = the family's ("<|begin_of_text|>" Llama 3, "<s>" Mistral, "<bos>"
                                  Gemma) */
    const char *eos_token;     /* NULL = the family's ("</s>" Mistral's turn end, "<|endoftext|>" Phi-3) */
    const char *date;          /* llama3.x "Today Date"; NULL = the template's default: "26 Jul 2024"
                                  for llama3.1, today's local date ("%d %b %Y") for llama3.2 */
} lt_chat_options;

/* Byte range [begin, end) of rendered text that the assistant of message `message` generates: its
 * content (as rendered: trimmed for Llama and Gemma, with the think block for Qwen3, with the
 * leading space of Mistral v0.3) and the end-of-turn marker after it (<|im_end|>, <|eot_id|>,
 * </s>, <end_of_turn>, <|end|>), which the model must learn to emit. */
typedef struct lt_chat_span {
    size_t begin, end;
    size_t message;
} lt_chat_span;

/* Rendered conversation; owns its buffers (accounted host memory), free with lt_chat_text_free. */
typedef struct lt_chat_text {
    char *text;          /* NUL-terminated */
    size_t len;          /* bytes, excluding the NUL */
    lt_chat_span *spans; /* one per assistant message, in order */
    size_t n_spans;
    size_t cap_, spans_cap_; /* allocation sizes (private) */
} lt_chat_text;

/* Renders n messages. *out must be zero-initialised or a previously rendered text (its buffers are
 * reused). Errors: LT_ERR_INVALID_ARG (format NONE or out of range, NULL role/content),
 * LT_ERR_UNSUPPORTED (a role the format does not take, naming messages[i]; a system message for
 * gemma), LT_ERR_FORMAT (Mistral, Gemma: roles not alternating user/assistant, as the template's
 * raise_exception), LT_ERR_OOM. */
LT_API lt_status lt_chat_render(lt_ctx *ctx, lt_chat_format fmt, const lt_chat_options *opt,
                                const lt_chat_message *msgs, size_t n, lt_chat_text *out);
LT_API void lt_chat_text_free(lt_ctx *ctx, lt_chat_text *t);

/* Recognises a Jinja chat template (e.g. lt_tokenizer_chat_template) as one of the formats.
 * Errors: LT_ERR_NOT_FOUND (NULL or empty: the model has no template) and LT_ERR_UNSUPPORTED (not
 * recognised); both messages name `--chat-template NAME` and list the names. */
LT_API lt_status lt_chat_detect(lt_ctx *ctx, const char *tmpl, lt_chat_format *out);

/* Names as listed above ("chatml", "smollm2", ...). Parse errors: LT_ERR_INVALID_ARG listing them. */
LT_API const char *lt_chat_format_name(lt_chat_format fmt);
LT_API lt_status lt_chat_format_parse(lt_ctx *ctx, const char *name, lt_chat_format *out);

#ifdef __cplusplus
}
#endif
#endif
