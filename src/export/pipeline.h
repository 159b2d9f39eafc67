/* Private to src/export: the row pipeline the model writers share (see export.c). */
#ifndef LT_EXPORT_PIPELINE_H
#define LT_EXPORT_PIPELINE_H

#include "export/export_internal.h"

/* Receives the output bytes of consecutive rows. */
typedef lt_status (*lt_ex_sink)(lt_ctx *ctx, void *arg, const void *data, size_t n);

/* Row buffers for `batch` rows at a time (f: read and merged, back: the written values read back,
 * out: the written bytes), converted on `threads` threads and handed to the sink in order. */
typedef struct lt_ex_rows {
    int64_t cols, batch;
    int threads;
    float *f, *back;
    uint8_t *out;
    size_t bytes;
} lt_ex_rows;

lt_status lt_ex_rows_init(lt_ctx *ctx, lt_ex_rows *r, const lt_ex_base *b);
void lt_ex_rows_free(lt_ctx *ctx, lt_ex_rows *r);
/* Canonical (rotate-half) row of GGUF llama row g. */
int64_t lt_ex_deinterleave_row(int64_t g, int64_t D);
/* The output dtype of piece p (source tensor t) under opt; LT_ERR_UNSUPPORTED when a needed
 * quantizer is missing. */
lt_status lt_ex_pick_dtype(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_adapter *a, const lt_ex_piece *p,
                           const lt_tensor *t, const lt_export_options *opt, lt_dtype *out);
/* Streams piece p in dtype dt into sink; out_interleaved: write llama Q/K rows in GGUF order. */
lt_status lt_ex_stream_piece(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_adapter *a, const lt_ex_piece *p,
                             const lt_tensor *t, lt_dtype dt, int out_interleaved, lt_ex_rows *rows, lt_ex_sink sink,
                             void *arg, lt_export_report *rep);

#endif
