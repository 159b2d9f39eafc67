/* Datasets in mlx-lm's layout: a folder with train.jsonl, valid.jsonl and test.jsonl, one JSON
 * object per line, each {"text"}, {"prompt","completion"} or {"messages":[{"role","content"},...]}.
 * Files are streamed line by line (bounded memory however large the file); records become token
 * ids plus a per-token supervision mask (prompt masking), laid end to end as pack.h's input.
 * Tokenised data is kept in memory (4 bytes + 1 per token); no caching to disk, no shuffling here
 * (packing shuffles). */
#ifndef LONGTUNE_DATASET_H
#define LONGTUNE_DATASET_H

#include "export.h"
#include "chat.h"
#include "pack.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct lt_tokenizer;

/* ---- streaming JSONL lines ---- */

typedef struct lt_jsonl lt_jsonl;

/* Default and hard cap of one line's length. */
#define LT_JSONL_DEFAULT_MAX_LINE (16u << 20)

/* Opens `path` for line-by-line reading; max_line_bytes 0 = LT_JSONL_DEFAULT_MAX_LINE.
 * Errors: LT_ERR_NOT_FOUND (no such file), LT_ERR_IO, LT_ERR_OOM. */
LT_API lt_status lt_jsonl_open(lt_ctx *ctx, const char *path, size_t max_line_bytes, lt_jsonl **out);
/* Next line that is not blank: *line points to it NUL-terminated (without "\n" / "\r\n"), owned by
 * the reader and valid until the next call; *line_no is 1-based. At end of file: LT_OK, *line NULL.
 * A longer line than the limit is LT_ERR_FORMAT "path:line: line longer than N bytes"; the reader
 * stays usable and the next call continues after that line. Errors: LT_ERR_IO, LT_ERR_OOM. */
LT_API lt_status lt_jsonl_next(lt_ctx *ctx, lt_jsonl *r, const char **line, size_t *len, int64_t *line_no);
LT_API const char *lt_jsonl_path(const lt_jsonl *r);
LT_API void lt_jsonl_close(lt_ctx *ctx, lt_jsonl *r);

/* ---- records ---- */

typedef enum lt_record_kind {
    LT_RECORD_TEXT = 0,   /* {"text": s} */
    LT_RECORD_COMPLETION, /* {"prompt": s, "completion": s} */
    LT_RECORD_CHAT,       /* {"messages": [{"role": s, "content": s}, ...]} */
} lt_record_kind;

/* A parsed line. Strings point into the record's own parse tree; valid until the next parse into
 * the same record or lt_record_free. Zero-initialise before the first parse. */
typedef struct lt_record {
    lt_record_kind kind;
    const char *text;
    const char *prompt, *completion;
    lt_chat_message *messages;
    size_t n_messages;
    void *json_;     /* private: the cJSON tree */
    size_t msg_cap_; /* private */
} lt_record;

/* Parses one JSONL line. Other keys are ignored (mlx-lm does the same). Errors: LT_ERR_FORMAT
 * "file:line: ..." naming the problem (bad JSON with its byte offset, not an object, none of the
 * three shapes, a key of the wrong type such as messages[2].content), LT_ERR_OOM. */
LT_API lt_status lt_record_parse(lt_ctx *ctx, const char *line, size_t len, const char *file, int64_t line_no,
                                 lt_record *rec);
LT_API void lt_record_free(lt_ctx *ctx, lt_record *rec);

/* ---- tokenised datasets ---- */

/* Zero-initialised fields take the defaults noted. */
typedef struct lt_dataset_options {
    int mask_prompt;            /* supervise only completion / assistant tokens (else every token) */
    int skip_bad_lines;         /* count and skip malformed lines instead of failing */
    size_t max_line_bytes;      /* 0 = LT_JSONL_DEFAULT_MAX_LINE */
    lt_chat_format chat_format; /* LT_CHAT_NONE = recognise the tokenizer's template when a record
                                  needs one (--chat-template NAME sets it) */
    lt_chat_options chat;       /* bos/eos default to the tokenizer's own token strings */
    int64_t max_records;        /* stop after this many records, 0 = all */
} lt_dataset_options;

typedef struct lt_dataset_stats {
    int64_t records; /* tokenised records (= sequences) */
    int64_t text_records, completion_records, chat_records;
    int64_t skipped_lines;      /* malformed lines skipped (skip_bad_lines) */
    int64_t tokens;             /* N */
    int64_t supervised;         /* tokens flagged as targets (first tokens of sequences included) */
    int64_t max_len, min_len;   /* tokens per record */
    lt_chat_format chat_format; /* the format used (LT_CHAT_NONE if no record needed one) */
} lt_dataset_stats;

typedef struct lt_dataset lt_dataset;

/* Reads and tokenises every record of one JSONL file.
 * Token rules (as mlx-lm): text -> encode(text) with the tokenizer's special tokens (BOS where the
 * tokenizer adds one), EOS appended unless already last, all supervised. Chat -> the rendered
 * template tokenised without added special tokens (the template writes them), no EOS appended;
 * with mask_prompt only tokens that start inside an assistant span (chat.h) are supervised.
 * Completion -> the chat [user: prompt, assistant: completion] when a template is available or
 * chosen; else encode(prompt) + encode(completion) + EOS, with only the completion and EOS
 * supervised under mask_prompt.
 * Errors: LT_ERR_NOT_FOUND (file; or a chat record and the model has no template: the message
 * names --chat-template), LT_ERR_UNSUPPORTED (unrecognised template), LT_ERR_FORMAT (file:line),
 * LT_ERR_IO, LT_ERR_OOM, and the tokenizer's errors. */
LT_API lt_status lt_dataset_load(lt_ctx *ctx, const char *jsonl_path, const struct lt_tokenizer *tok,
                                 const lt_dataset_options *opt, lt_dataset **out);
/* dir/<split>.jsonl for split "train" | "valid" | "test". */
LT_API lt_status lt_dataset_load_split(lt_ctx *ctx, const char *dir, const char *split, const struct lt_tokenizer *tok,
                                       const lt_dataset_options *opt, lt_dataset **out);
LT_API void lt_dataset_free(lt_ctx *ctx, lt_dataset *ds);

/* The records as pack.h input; valid while the dataset lives. */
LT_API lt_pack_input lt_dataset_input(const lt_dataset *ds);
LT_API lt_dataset_stats lt_dataset_get_stats(const lt_dataset *ds);

/* Prompt masking from byte spans, exposed for tests: token i covers bytes
 * [tok_start[i], tok_start[i+1]) of the rendered text and is supervised iff tok_start[i] lies inside
 * some span [begin, end). tok_start has n+1 entries, non-decreasing. mask has n entries. */
LT_API void lt_dataset_mask_from_spans(const size_t *tok_start, size_t n, const lt_chat_span *spans, size_t n_spans,
                                       uint8_t *mask);

#ifdef __cplusplus
}
#endif
#endif
