/* Streaming JSONL reading and record parsing for datasets (dataset.h): a line reader with a fixed
 * read buffer and a line buffer bounded by a maximum length, so files of any size stream in bounded
 * memory; and the three mlx-lm record shapes, validated with errors naming file:line and the key.
 * Tokenisation lives in dataset.c; nothing here knows about tokens. */
#define _POSIX_C_SOURCE 200809L /* fileno, fstat */
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <string.h>
#include <cjson/cJSON.h>

#include "longtune/alloc.h"
#include "longtune/dataset.h"
#include "io/json_nul.h"

#define JSONL_CHUNK (1u << 20)

struct lt_jsonl {
    FILE *f;
    char *path;
    size_t path_bytes;
    char *chunk; /* JSONL_CHUNK bytes of file data */
    size_t chunk_len, chunk_pos;
    char *line; /* current line, NUL-terminated */
    size_t line_len, line_cap, max_line;
    int64_t line_no;
    int eof;
};

lt_status lt_jsonl_open(lt_ctx *ctx, const char *path, size_t max_line_bytes, lt_jsonl **out) {
    *out = NULL;
    if (!path) return lt_error(ctx, LT_ERR_INVALID_ARG, "jsonl: no path");
    FILE *f = fopen(path, "rb");
    if (!f)
        return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: cannot open: %s", path,
                        strerror(errno));
    /* Only a regular file has an end: a device (/dev/zero), FIFO or socket could stream forever. */
    struct stat sb;
    memset(&sb, 0, sizeof sb);
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        int dir = S_ISDIR(sb.st_mode);
        fclose(f);
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: is %s, not a JSONL file", path,
                        dir ? "a folder" : "not a regular file (a device, FIFO or socket)");
    }
    lt_jsonl *r = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *r, "jsonl reader");
    if (!r) {
        fclose(f);
        return LT_ERR_OOM;
    }
    r->f = f;
    r->max_line = max_line_bytes ? max_line_bytes : LT_JSONL_DEFAULT_MAX_LINE;
    r->path_bytes = strlen(path) + 1;
    r->path = lt_alloc(ctx, LT_DEVICE_CPU, r->path_bytes, "jsonl path");
    r->chunk = lt_alloc(ctx, LT_DEVICE_CPU, JSONL_CHUNK, "jsonl read buffer");
    r->line_cap = 4096;
    r->line = lt_alloc(ctx, LT_DEVICE_CPU, r->line_cap, "jsonl line");
    if (!r->path || !r->chunk || !r->line) {
        lt_jsonl_close(ctx, r);
        return LT_ERR_OOM;
    }
    memcpy(r->path, path, r->path_bytes);
    *out = r;
    return LT_OK;
}

void lt_jsonl_close(lt_ctx *ctx, lt_jsonl *r) {
    if (!r) return;
    if (r->f) fclose(r->f);
    lt_free(ctx, LT_DEVICE_CPU, r->path, r->path_bytes);
    lt_free(ctx, LT_DEVICE_CPU, r->chunk, JSONL_CHUNK);
    lt_free(ctx, LT_DEVICE_CPU, r->line, r->line_cap);
    lt_free(ctx, LT_DEVICE_CPU, r, sizeof *r);
}

const char *lt_jsonl_path(const lt_jsonl *r) { return r->path; }

static lt_status line_append(lt_ctx *ctx, lt_jsonl *r, const char *s, size_t n) {
    if (r->line_len + n + 1 > r->line_cap) {
        size_t cap = r->line_cap;
        while (cap < r->line_len + n + 1) cap *= 2;
        char *p = lt_alloc(ctx, LT_DEVICE_CPU, cap, "jsonl line");
        if (!p) return LT_ERR_OOM;
        memcpy(p, r->line, r->line_len);
        lt_free(ctx, LT_DEVICE_CPU, r->line, r->line_cap);
        r->line = p;
        r->line_cap = cap;
    }
    memcpy(r->line + r->line_len, s, n);
    r->line_len += n;
    return LT_OK;
}

/* Reads one raw line into r->line (possibly truncated at max_line, with *too_long set). Returns
 * LT_OK with r->eof set and no line when the file is exhausted. */
static lt_status read_line(lt_ctx *ctx, lt_jsonl *r, int *got, int *too_long) {
    *got = 0;
    *too_long = 0;
    r->line_len = 0;
    for (;;) {
        if (r->chunk_pos == r->chunk_len) {
            if (r->eof) break;
            r->chunk_len = fread(r->chunk, 1, JSONL_CHUNK, r->f);
            r->chunk_pos = 0;
            if (r->chunk_len < JSONL_CHUNK) {
                if (ferror(r->f))
                    return lt_error(ctx, LT_ERR_IO, "%s:%lld: read error", r->path, (long long)(r->line_no + 1));
                r->eof = 1;
            }
            if (r->chunk_len == 0) break;
        }
        *got = 1;
        const char *start = r->chunk + r->chunk_pos;
        const char *nl = memchr(start, '\n', r->chunk_len - r->chunk_pos);
        size_t n = nl ? (size_t)(nl - start) : r->chunk_len - r->chunk_pos;
        if (!*too_long) {
            if (r->line_len + n > r->max_line) {
                *too_long = 1;
            } else {
                LT_TRY(line_append(ctx, r, start, n));
            }
        }
        r->chunk_pos += n + (nl ? 1 : 0);
        if (nl) break;
    }
    if (*got) r->line_no++;
    return LT_OK;
}

lt_status lt_jsonl_next(lt_ctx *ctx, lt_jsonl *r, const char **line, size_t *len, int64_t *line_no) {
    *line = NULL;
    *len = 0;
    for (;;) {
        int got, too_long;
        LT_TRY(read_line(ctx, r, &got, &too_long));
        if (!got) return LT_OK;
        *line_no = r->line_no;
        if (too_long)
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: line longer than %zu bytes (raise the line limit)", r->path,
                            (long long)r->line_no, r->max_line);
        if (r->line_len && r->line[r->line_len - 1] == '\r') r->line_len--;
        r->line[r->line_len] = 0;
        size_t off = 0;
        if (r->line_no == 1 && r->line_len >= 3 && !memcmp(r->line, "\xEF\xBB\xBF", 3)) off = 3; /* BOM */
        size_t k = off;
        while (k < r->line_len && (r->line[k] == ' ' || r->line[k] == '\t')) k++;
        if (k == r->line_len) continue; /* blank line */
        *line = r->line + off;
        *len = r->line_len - off;
        return LT_OK;
    }
}

/* ---- records ---- */

void lt_record_free(lt_ctx *ctx, lt_record *rec) {
    if (!rec) return;
    cJSON_Delete(rec->json_);
    lt_free(ctx, LT_DEVICE_CPU, rec->messages, rec->msg_cap_ * sizeof *rec->messages);
    memset(rec, 0, sizeof *rec);
}

static const char *shape_help = "expected {\"text\"}, {\"prompt\",\"completion\"} or {\"messages\":[...]}";

lt_status lt_record_parse(lt_ctx *ctx, const char *line, size_t len, const char *file, int64_t line_no,
                          lt_record *rec) {
    lt_chat_message *keep = rec->messages;
    size_t keep_cap = rec->msg_cap_;
    cJSON_Delete(rec->json_);
    memset(rec, 0, sizeof *rec);
    rec->messages = keep;
    rec->msg_cap_ = keep_cap;
    const char *end = NULL;
    if (lt_json_nul_line(line, len))
        return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: string contains U+0000 (a \\u0000 escape or a NUL byte)", file,
                        (long long)line_no);
    cJSON *j = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!j) {
        const char *at = cJSON_GetErrorPtr();
        long off = (at && at >= line && at <= line + len) ? (long)(at - line) : -1;
        return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: invalid JSON (near byte %ld)", file, (long long)line_no, off);
    }
    rec->json_ = j;
    if (end) {
        while (end < line + len && (*end == ' ' || *end == '\t')) end++;
        if (end < line + len)
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: trailing data after the JSON object (byte %ld)", file,
                            (long long)line_no, (long)(end - line));
    }
    if (!cJSON_IsObject(j))
        return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: a line must be a JSON object; %s", file, (long long)line_no,
                        shape_help);
    cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    cJSON *prompt = cJSON_GetObjectItemCaseSensitive(j, "prompt");
    cJSON *completion = cJSON_GetObjectItemCaseSensitive(j, "completion");
    cJSON *messages = cJSON_GetObjectItemCaseSensitive(j, "messages");
    if (messages) {
        if (!cJSON_IsArray(messages))
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: key 'messages' must be an array", file, (long long)line_no);
        size_t n = (size_t)cJSON_GetArraySize(messages);
        if (n == 0) return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: key 'messages' is empty", file, (long long)line_no);
        if (n > rec->msg_cap_) {
            lt_chat_message *p = lt_alloc(ctx, LT_DEVICE_CPU, n * sizeof *p, "record messages");
            if (!p) return LT_ERR_OOM;
            lt_free(ctx, LT_DEVICE_CPU, rec->messages, rec->msg_cap_ * sizeof *rec->messages);
            rec->messages = p;
            rec->msg_cap_ = n;
        }
        size_t i = 0;
        cJSON *m;
        cJSON_ArrayForEach(m, messages) {
            cJSON *role = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "role") : NULL;
            cJSON *content = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "content") : NULL;
            if (!cJSON_IsObject(m))
                return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: messages[%zu] must be an object", file,
                                (long long)line_no, i);
            if (!cJSON_IsString(role))
                return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: messages[%zu].role must be a string", file,
                                (long long)line_no, i);
            if (!cJSON_IsString(content))
                return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: messages[%zu].content must be a string", file,
                                (long long)line_no, i);
            rec->messages[i].role = role->valuestring;
            rec->messages[i].content = content->valuestring;
            i++;
        }
        rec->n_messages = n;
        rec->kind = LT_RECORD_CHAT;
        return LT_OK;
    }
    if (prompt || completion) {
        if (!cJSON_IsString(prompt))
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: key 'prompt' must be a string", file, (long long)line_no);
        if (!cJSON_IsString(completion))
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: key 'completion' must be a string", file, (long long)line_no);
        rec->prompt = prompt->valuestring;
        rec->completion = completion->valuestring;
        rec->kind = LT_RECORD_COMPLETION;
        return LT_OK;
    }
    if (text) {
        if (!cJSON_IsString(text))
            return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: key 'text' must be a string", file, (long long)line_no);
        rec->text = text->valuestring;
        rec->kind = LT_RECORD_TEXT;
        return LT_OK;
    }
    return lt_error(ctx, LT_ERR_FORMAT, "%s:%lld: unknown record shape; %s", file, (long long)line_no, shape_help);
}

void lt_dataset_mask_from_spans(const size_t *tok_start, size_t n, const lt_chat_span *spans, size_t n_spans,
                                uint8_t *mask) {
    size_t s = 0;
    for (size_t i = 0; i < n; i++) {
        while (s < n_spans && spans[s].end <= tok_start[i]) s++;
        mask[i] = s < n_spans && tok_start[i] >= spans[s].begin && tok_start[i] < spans[s].end;
    }
}
