/* What `generate`, `chat` and `eval` share: opening a model with its tokenizer and an optional
 * PEFT adapter (refused when it holds a non-finite value), the end-of-sequence ids, and the text
 * stream of one generated row (incremental decode, stop strings matched on the decoded text and
 * never printed, incomplete UTF-8 held back). */
#ifndef LT_CLI_GEN_COMMON_H
#define LT_CLI_GEN_COMMON_H

#include <stdio.h>

#include "longtune/generate.h"
#include "longtune/tokenizer.h"

#define LT_GEN_MAX_STOP 16

/* Loads the tokenizer and the model at path on dev (threads for the context already set), with
 * the adapter in adapter_dir when non-NULL (else a rank-1 LoRA whose B is zero: the base). */
lt_status lt_gen_open(lt_ctx *ctx, const char *path, const char *adapter_dir, lt_device dev, lt_tokenizer **tok,
                      lt_model **m);

/* The ids that end a reply: the model's EOS list (eos_id when it has none), the tokenizer's EOS
 * and the chat formats' turn ends that the vocabulary has. Returns how many (<= cap). */
int lt_gen_stop_ids(const lt_tokenizer *tok, const lt_model *m, int32_t *ids, int cap);

typedef struct lt_gen_stream {
    lt_ctx *ctx;
    const lt_tokenizer *tok;
    FILE *out; /* where text goes as it is final; NULL: only kept */
    const char *const *stops;
    int n_stops;
    const int32_t *stop_ids; /* not printed */
    int n_stop_ids;
    int32_t *ids;
    size_t n, cap;
    char *text; /* the final text so far (stop string cut off once matched) */
    size_t len, printed;
    int stopped;
} lt_gen_stream;

/* Adds id; returns 1 when a stop string completed (the row should end). */
int lt_gen_stream_push(lt_gen_stream *s, int32_t id);
/* Prints what was held back (the row ended). */
void lt_gen_stream_finish(lt_gen_stream *s);
void lt_gen_stream_free(lt_gen_stream *s);

#endif
