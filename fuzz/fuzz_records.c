/* Fuzz target: one JSONL line through record parsing, then every built-in chat renderer for chat
 * and completion records, and template recognition of the raw bytes. Errors are expected; crashes,
 * leaks and sanitizer reports are not. Spans must lie inside the rendered text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 0;
    char *s = malloc(size + 1);
    if (!s) {
        lt_ctx_free(ctx);
        return 0;
    }
    memcpy(s, data, size);
    s[size] = 0;
    lt_chat_format f;
    (void)lt_chat_detect(ctx, s, &f);
    lt_record rec = {0};
    if (lt_record_parse(ctx, s, size, "fuzz", 1, &rec) == LT_OK &&
        (rec.kind == LT_RECORD_CHAT || rec.kind == LT_RECORD_COMPLETION)) {
        lt_chat_message pc[2] = {{"user", rec.prompt}, {"assistant", rec.completion}};
        const lt_chat_message *m = rec.kind == LT_RECORD_CHAT ? rec.messages : pc;
        size_t n = rec.kind == LT_RECORD_CHAT ? rec.n_messages : 2;
        lt_chat_text out = {0};
        for (int fmt = LT_CHAT_CHATML; fmt < LT_CHAT_FORMAT_COUNT_; fmt++) {
            lt_chat_options opt = {0};
            opt.add_generation_prompt = fmt & 1;
            opt.date = "01 Jan 2025";
            if (lt_chat_render(ctx, (lt_chat_format)fmt, &opt, m, n, &out) != LT_OK) continue;
            if (strlen(out.text) > out.len) abort();
            for (size_t k = 0; k < out.n_spans; k++)
                if (out.spans[k].begin > out.spans[k].end || out.spans[k].end > out.len) abort();
        }
        lt_chat_text_free(ctx, &out);
    }
    lt_record_free(ctx, &rec);
    if (lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes != 0) abort();
    lt_ctx_free(ctx);
    free(s);
    return 0;
}
