/* Evaluation of a data split as training reads it: the trainer's packing plan over the split
 * (epoch 0, no shuffle beyond what the packer does for epoch 0), its batch fill (lt_trainer_fill:
 * the same targets and masks), and the model's forward with the fused loss. Used by `longtune
 * eval` and by `train --test` after the last step. And a token stream scored in llama-perplexity's
 * windows (`longtune eval --text`), through the same forward and loss. */
#include <math.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/pack.h"
#include "train/trainer.h"

lt_status lt_train_evaluate(lt_ctx *ctx, const lt_train_options *opt, lt_model *m, const lt_pack_input *data,
                            int64_t max_batches, lt_eval_result *res) {
    memset(res, 0, sizeof *res);
    res->mean_loss = res->ppl = NAN;
    lt_trainer t;
    memset(&t, 0, sizeof t);
    t.ctx = ctx, t.o = opt, t.m = m, t.world = 1;
    t.B = opt->batch_size, t.T = opt->max_seq_length;
    if (t.B < 1 || t.T < 2)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "eval: batch_size %lld and max_seq_length %lld (resolve the options)",
                        (long long)t.B, (long long)t.T);
    LT_TRY(lt_pack_input_check(ctx, data));
    lt_pack_options popt;
    LT_TRY(lt_train_pack_options(ctx, opt, 1, &popt));
    popt.epoch = 0;
    lt_pack_plan *plan = NULL;
    LT_TRY(lt_pack_plan_build(ctx, data, &popt, &plan));
    size_t bt = (size_t)(t.B * t.T), bo = (size_t)(t.B * (t.T + 1));
    size_t bytes = (3 * bt + bo + (size_t)t.B) * sizeof(int32_t);
    int32_t *buf = lt_alloc(ctx, LT_DEVICE_CPU, bytes, "eval batch buffers");
    lt_status s = LT_OK;
    if (!buf) {
        s = lt_ctx_status(ctx);
        goto done;
    }
    t.ids = buf, t.tgt = buf + bt, t.pos = buf + 2 * bt, t.offs = buf + 3 * bt, t.pieces = buf + 3 * bt + bo;
    lt_model_run_options run;
    memset(&run, 0, sizeof run);
    run.B = t.B, run.T = t.T, run.forward_only = 1;
    run.attention = opt->attention, run.loss = opt->loss, run.threads = opt->threads;
    run.bf16_products = opt->bf16_products;
    if ((s = lt_model_prepare(ctx, m, &run)) != LT_OK) goto done;
    int64_t nb = lt_pack_plan_batches(plan);
    if (max_batches > 0 && nb > max_batches) nb = max_batches;
    for (int64_t i = 0; i < nb; i++) {
        lt_model_batch b;
        int64_t ntok = 0;
        if ((s = lt_trainer_fill(&t, plan, data, i, &b, &ntok, NULL)) != LT_OK) goto done;
        res->n_batches++;
        for (int64_t r = 0; r < b.B; r++) res->n_seqs += t.pieces[r];
        if (!ntok) continue;
        lt_model_result r;
        if ((s = lt_model_forward(ctx, m, &b, &r, NULL)) != LT_OK) goto done;
        res->loss_sum += r.loss_sum;
        res->n_tokens += r.n_tokens;
    }
    if (!res->n_tokens) {
        s = lt_error(ctx, LT_ERR_INVALID_ARG, "eval: the split has no scored tokens (%lld batches)",
                     (long long)res->n_batches);
        goto done;
    }
    res->mean_loss = res->loss_sum / (double)res->n_tokens;
    res->ppl = exp(res->mean_loss);
done:
    if (buf) lt_free(ctx, LT_DEVICE_CPU, buf, bytes);
    lt_pack_plan_free(ctx, plan);
    return s;
}

lt_status lt_eval_windows(lt_ctx *ctx, lt_model *m, const int32_t *tokens, int64_t n, int64_t window, int32_t bos,
                          int64_t max_windows, int bf16_products, lt_eval_result *res) {
    memset(res, 0, sizeof *res);
    res->mean_loss = res->ppl = NAN;
    const lt_model_config *cf = lt_model_get_config(m);
    if (window < 4 || window > INT32_MAX / 2)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "eval: window of %lld tokens (4 .. 2^30)", (long long)window);
    if (n < 2 * window)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "eval: the text has %lld tokens; windows of %lld need at least %lld (two windows, as "
                        "llama-perplexity)",
                        (long long)n, (long long)window, (long long)(2 * window));
    if (bos >= cf->V) return lt_error(ctx, LT_ERR_INVALID_ARG, "eval: BOS id %d outside the vocabulary", (int)bos);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= cf->V)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "eval: token %d at %lld outside [0, %lld)", (int)tokens[i],
                            (long long)i, (long long)cf->V);
    int64_t nw = n / window, first = window / 2;
    if (max_windows > 0 && nw > max_windows) nw = max_windows;
    size_t bytes = 2 * (size_t)window * sizeof(int32_t);
    int32_t *buf = lt_alloc(ctx, LT_DEVICE_CPU, bytes, "eval window");
    if (!buf) return lt_ctx_status(ctx);
    int32_t *ids = buf, *tgt = buf + window;
    lt_model_run_options run;
    memset(&run, 0, sizeof run);
    run.B = 1, run.T = window, run.forward_only = 1;
    run.bf16_products = bf16_products;
    lt_status s = lt_model_prepare(ctx, m, &run);
    for (int64_t w = 0; s == LT_OK && w < nw; w++) {
        const int32_t *src = tokens + w * window;
        memcpy(ids, src, (size_t)window * sizeof(int32_t));
        if (bos >= 0) ids[0] = bos;
        for (int64_t p = 0; p < window; p++) tgt[p] = p >= first && p + 1 < window ? src[p + 1] : LT_IGNORE_INDEX;
        lt_model_batch b;
        memset(&b, 0, sizeof b);
        b.B = 1, b.T = window, b.tokens = ids, b.targets = tgt;
        lt_model_result r;
        if ((s = lt_model_forward(ctx, m, &b, &r, NULL)) != LT_OK) break;
        res->loss_sum += r.loss_sum;
        res->n_tokens += r.n_tokens;
        res->n_seqs++, res->n_batches++;
    }
    lt_free(ctx, LT_DEVICE_CPU, buf, bytes);
    LT_TRY(s);
    res->mean_loss = res->loss_sum / (double)res->n_tokens;
    res->ppl = exp(res->mean_loss);
    return LT_OK;
}
