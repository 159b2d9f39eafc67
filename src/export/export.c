/* lt_export_model: opens the base and the adapter, picks the output dtype of every tensor and
 * streams each tensor row by row through read (dequantize, un-permute) → merge (W + s·B·A in f32)
 * → convert (the output dtype, requantization error measured on the round trip) → the writer's
 * sink, a round of rows at a time on the run's threads (the sink and the error report take the
 * rows in order). Rows the merge does not touch and whose dtype stays are copied byte for byte. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/parallel.h"
#include "export/export_internal.h"
#include "export/pipeline.h"
#include "longtune/alloc.h"

int64_t lt_ex_deinterleave_row(int64_t g, int64_t D) {
    int64_t h = g / D, w = g % D, i = w / 2, s = w % 2;
    return h * D + s * (D / 2) + i;
}

/* Rows converted per thread per round: enough to amortise the fork-join, few enough that a round
 * of the widest rows (the vocabulary's columns are the hidden size) stays a few MiB. */
#define EX_ROWS_PER_THREAD 8

lt_status lt_ex_rows_init(lt_ctx *ctx, lt_ex_rows *r, const lt_ex_base *b) {
    memset(r, 0, sizeof *r);
    const lt_model_config *c = &b->cfg;
    int64_t w = c->C > c->F ? c->C : c->F;
    if (c->H * c->D > w) w = c->H * c->D;
    if (c->moe_F > w) w = c->moe_F;
    if (c->moe_shared_F > w) w = c->moe_shared_F;
    r->cols = w;
    r->threads = lt_parallel_threads(0);
    r->batch = (int64_t)r->threads * EX_ROWS_PER_THREAD;
    /* f and back: w floats a slot; out: w floats' bytes plus 64, each slot starting 64-byte aligned */
    r->bytes = (size_t)r->batch * ((size_t)w * sizeof(float) * 3 + 64);
    r->f = lt_alloc(ctx, LT_DEVICE_CPU, r->bytes, "export rows");
    if (!r->f) return lt_ctx_status(ctx);
    r->back = r->f + r->batch * w;
    r->out = (uint8_t *)(r->back + r->batch * w);
    return LT_OK;
}

void lt_ex_rows_free(lt_ctx *ctx, lt_ex_rows *r) {
    if (r->f) lt_free(ctx, LT_DEVICE_CPU, r->f, r->bytes);
    r->f = NULL;
}

/* One round of a piece's rows: output rows g0 .. g0 + n - 1 read, merged and converted into
 * slots 0 .. n - 1 of the row buffers (each row on its own; the slots are disjoint). */
typedef struct ex_round {
    const lt_ex_base *b;
    const lt_ex_adapter *a;
    const lt_ex_piece *p;
    const lt_tensor *t;
    lt_dtype dt;
    int merged, qk_out_interleaved;
    int64_t g0, cols, ostride;
    lt_ex_rows *rows;
} ex_round;

static void ex_round_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const ex_round *x = arg;
    const int64_t w = x->rows->cols;
    for (int64_t i = begin; i < end; i++) {
        const int64_t g = x->g0 + i;
        const int64_t r = x->qk_out_interleaved ? lt_ex_deinterleave_row(g, x->b->cfg.D) : g; /* canonical row */
        float *f = x->rows->f + i * w, *back = x->rows->back + i * w;
        lt_ex_read_row(x->b, x->p, x->t, r, f);
        if (x->merged && x->p->kind == EX_EXPERT)
            lt_ex_adapter_add_expert_row(x->a, &x->b->cfg, x->p->layer, x->p->which, x->p->expert, r, f);
        else if (x->merged) lt_ex_adapter_add_row(x->a, x->p->layer, x->p->which, r, x->cols, f);
        lt_ex_convert_row(x->dt, f, x->rows->out + (size_t)i * (size_t)x->ostride, back, x->cols);
    }
}

lt_status lt_ex_stream_piece(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_adapter *a, const lt_ex_piece *p,
                             const lt_tensor *t, lt_dtype dt, int out_interleaved, lt_ex_rows *rows, lt_ex_sink sink,
                             void *arg, lt_export_report *rep) {
    int64_t nrows = p->ndim == 2 ? p->shape[0] : 1, cols = p->ndim == 2 ? p->shape[1] : p->shape[0];
    int merged = lt_ex_piece_merged(a, p);
    int qk = p->kind == EX_PROJ && (p->which == LT_PROJ_Q || p->which == LT_PROJ_K);
    int64_t D = b->cfg.D;
    int64_t orb = lt_dtype_row_bytes(dt, cols);
    if (orb < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: %lld columns are not whole %s blocks", lt_ex_class_name(p),
                        (long long)cols, lt_dtype_name(dt));
    const char *cls = lt_ex_class_name(p);
    int copy = !merged && t->data && t->dtype == dt;
    if (copy) {
        int64_t srb = lt_dtype_row_bytes(t->dtype, cols);
        for (int64_t g = 0; g < nrows; g++) {
            int64_t r = (qk && out_interleaved) ? lt_ex_deinterleave_row(g, D) : g; /* canonical row */
            int64_t sr = (qk && b->permute_qk) ? lt_ex_interleaved_row(r, D) : r;
            LT_TRY(sink(ctx, arg, (const uint8_t *)t->data + (size_t)sr * (size_t)srb, (size_t)orb));
            lt_ex_report_add(rep, cls, dt, NULL, NULL, cols, g == 0);
        }
    } else {
        /* rows convert on the run's threads a round at a time; the report and the sink take them
         * in order, so the bytes and the error figures are those of one thread */
        const int64_t ostride = (orb + 63) / 64 * 64;
        ex_round x = {b, a, p, t, dt, merged, qk && out_interleaved, 0, cols, ostride, rows};
        for (int64_t g0 = 0; g0 < nrows; g0 += rows->batch) {
            const int64_t n = nrows - g0 < rows->batch ? nrows - g0 : rows->batch;
            x.g0 = g0;
            lt_parallel_for(rows->threads, n, 1, ex_round_rows, &x);
            for (int64_t i = 0; i < n; i++) {
                lt_ex_report_add(rep, cls, dt, rows->f + i * rows->cols, rows->back + i * rows->cols, cols,
                                 g0 + i == 0);
                LT_TRY(sink(ctx, arg, rows->out + (size_t)i * (size_t)ostride, (size_t)orb));
            }
        }
    }
    if (merged && rep) rep->n_merged++;
    if (rep) rep->n_tensors++;
    return LT_OK;
}

static int is_float(lt_dtype t) { return t == LT_DTYPE_F32 || t == LT_DTYPE_F16 || t == LT_DTYPE_BF16; }

lt_status lt_ex_pick_dtype(lt_ctx *ctx, const lt_ex_base *b, const lt_ex_adapter *a, const lt_ex_piece *p,
                           const lt_tensor *t, const lt_export_options *opt, lt_dtype *out) {
    int64_t cols = p->ndim == 2 ? p->shape[1] : p->shape[0];
    char name[160];
    lt_ex_gguf_name(p, name, sizeof name);
    if (opt->format == LT_EXPORT_HF) {
        if (opt->outtype_set) *out = opt->outtype;
        else {
            lt_dtype d = b->cfg.proj_dtype[LT_PROJ_Q];
            *out = is_float(d) ? d : LT_DTYPE_F16;
        }
        return LT_OK;
    }
    if (p->ndim == 1 || p->kind == EX_ROUTER ||
        p->kind == EX_SHEXP_GATE) { /* llama.cpp keeps norms, biases, rope factors and routers in f32 */
        *out = LT_DTYPE_F32;
        return LT_OK;
    }
    lt_dtype want;
    if (opt->outtype_set) want = opt->outtype;
    else want = t->data ? t->dtype : LT_DTYPE_F32;
    if (opt->dequantize && !is_float(want))
        want = opt->outtype_set && is_float(opt->outtype) ? opt->outtype : LT_DTYPE_F16;
    if (lt_dtype_row_bytes(want, cols) < 0) {
        /* Rows that are not whole blocks: llama.cpp's quantizer falls back the same way (a
         * K-quant to a 32-weight format, anything else to f16). */
        lt_dtype fb = lt_dtype_quantize_target(want, cols);
        want = fb != LT_DTYPE_COUNT_ ? fb : LT_DTYPE_F16;
    }
    int merged = lt_ex_piece_merged(a, p);
    int copy = !merged && t->data && t->dtype == want;
    if (!copy && !lt_export_can_quantize(want))
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "tensor '%s': writing %s needs a %s quantizer, which this build lacks (choose --outtype or "
                        "--dequantize)",
                        name, lt_dtype_name(want), lt_dtype_name(want));
    *out = want;
    return LT_OK;
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

lt_status lt_export_model(lt_ctx *ctx, const char *model, const char *out, const lt_export_options *opt_in,
                          lt_export_report *report) {
    lt_export_options opt;
    memset(&opt, 0, sizeof opt);
    if (opt_in) opt = *opt_in;
    lt_export_report rep_local;
    lt_export_report *rep = report ? report : &rep_local;
    memset(rep, 0, sizeof *rep);
    if (!model || !out || !*out) return lt_error(ctx, LT_ERR_INVALID_ARG, "export: a model and an output are required");
    if ((unsigned)opt.format > LT_EXPORT_GGUF_LORA)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "export: unknown format %d", (int)opt.format);
    if (opt.outtype_set && opt.format == LT_EXPORT_HF && !is_float(opt.outtype))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "export: an HF folder holds f32, f16 or bf16, not --outtype %s",
                        lt_dtype_name(opt.outtype));
    if (opt.outtype_set && opt.format == LT_EXPORT_GGUF && lt_gguf_ggml_type_of(opt.outtype) < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "export: GGUF has no type for --outtype %s",
                        lt_dtype_name(opt.outtype));
    if (opt.outtype_set && opt.format == LT_EXPORT_GGUF && !lt_export_can_quantize(opt.outtype))
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "export: this build has no %s quantizer", lt_dtype_name(opt.outtype));
    if (opt.dequantize && opt.outtype_set && !is_float(opt.outtype))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "export: --dequantize writes f32, f16 or bf16, not --outtype %s",
                        lt_dtype_name(opt.outtype));
    if (opt.format == LT_EXPORT_GGUF_LORA && !opt.adapter)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "export: --format gguf-lora needs an adapter");
    if (exists(out) && !opt.overwrite)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: exists (pass --overwrite to replace it)", out);
    lt_ex_base b;
    lt_ex_adapter a;
    memset(&a, 0, sizeof a);
    lt_status s = lt_ex_base_open(ctx, model, &b);
    if (s != LT_OK) goto done;
    if (opt.rope.scaling != LT_ROPE_SCALING_NONE) {
        if (opt.format == LT_EXPORT_GGUF_LORA) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG,
                         "export: --rope-scaling changes the model; a LoRA adapter GGUF carries no RoPE (export "
                         "--format gguf or hf)");
            goto done;
        }
        if (b.has_rope_freqs) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED,
                         "%s: carries its RoPE scaling as rope_freqs.weight; --rope-scaling cannot replace it", model);
            goto done;
        }
        if ((s = lt_model_config_apply_rope(ctx, &b.cfg, &opt.rope)) != LT_OK) goto done;
        b.rope_override = 1;
    }
    if (opt.adapter && (s = lt_ex_adapter_read(ctx, opt.adapter, &b, &a)) != LT_OK) goto done;
    switch (opt.format) {
    case LT_EXPORT_HF: s = lt_ex_write_hf(ctx, &b, opt.adapter ? &a : NULL, out, &opt, rep); break;
    case LT_EXPORT_GGUF: s = lt_ex_write_gguf(ctx, &b, opt.adapter ? &a : NULL, out, &opt, rep); break;
    case LT_EXPORT_GGUF_LORA: s = lt_ex_write_gguf_lora(ctx, &b, &a, out, &opt, rep); break;
    }
    lt_ex_report_finish(rep);
done:
    lt_ex_adapter_free(ctx, &a);
    lt_ex_base_close(ctx, &b);
    return s;
}
