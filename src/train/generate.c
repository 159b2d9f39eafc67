/* Text generation for before/after checks: greedy or temperature/top-p sampling over the model's
 * full logits, re-running the forward over the whole sequence for each new token (no KV cache; the
 * model has none; only the last position's logits are computed). Not a serving path. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "longtune/alloc.h"
#include "train/train_internal.h"
#include "core/rng.h"

/* Picks the next id from one row of logits z (V); probs is (V) scratch, order (V) scratch. */
static int32_t pick(const float *z, int64_t V, const lt_generate_options *o, uint64_t *rng, double *probs,
                    int32_t *order) {
    int64_t best = 0;
    for (int64_t j = 1; j < V; j++)
        if (z[j] > z[best]) best = j;
    if (o->temp <= 0) return (int32_t)best;
    double sum = 0;
    for (int64_t j = 0; j < V; j++) sum += probs[j] = exp(((double)z[j] - (double)z[best]) / o->temp);
    double top_p = o->top_p > 0 && o->top_p < 1 ? o->top_p : 1;
    double u = (double)(lt_splitmix64(rng) >> 11) * 0x1.0p-53;
    if (top_p >= 1) {
        double acc = 0, target = u * sum;
        for (int64_t j = 0; j < V; j++)
            if ((acc += probs[j]) > target) return (int32_t)j;
        return (int32_t)best;
    }
    /* Nucleus: the smallest set of most likely ids with mass >= top_p (selection by repeated max,
       fine for the few dozen ids it usually holds). */
    int64_t k = 0;
    double mass = 0;
    while (mass < top_p * sum && k < V) {
        int64_t arg = -1;
        for (int64_t j = 0; j < V; j++)
            if (probs[j] >= 0 && (arg < 0 || probs[j] > probs[arg])) arg = j;
        order[k++] = (int32_t)arg;
        mass += probs[arg];
        probs[arg] = -1 - probs[arg]; /* mark taken, keep the value recoverable */
    }
    double acc = 0, target = u * mass;
    for (int64_t i = 0; i < k; i++)
        if ((acc += -1 - probs[order[i]]) > target) return order[i];
    return order[0];
}

lt_status lt_generate(lt_ctx *ctx, lt_model *m, const int32_t *prompt, int64_t n_prompt, const int32_t *stop_ids,
                      int n_stop, const lt_generate_options *opt, int32_t *out, int64_t *n_out,
                      void (*on_token)(void *arg, int32_t id), void *arg) {
    *n_out = 0;
    lt_generate_options o = *opt;
    if (o.max_tokens <= 0) o.max_tokens = 256;
    const lt_model_config *cfg = lt_model_get_config(m);
    int64_t V = cfg->V, Tmax = n_prompt + o.max_tokens;
    if (n_prompt < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "generate: empty prompt");
    /* Positions past the model's context were never trained: refuse the prompt, stop the reply. */
    if (cfg->max_positions > 0 && n_prompt >= cfg->max_positions)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "generate: the prompt's %lld tokens fill the model's context of %lld positions "
                        "(max_position_embeddings)",
                        (long long)n_prompt, (long long)cfg->max_positions);
    if (cfg->max_positions > 0 && Tmax > cfg->max_positions) {
        o.max_tokens = cfg->max_positions - n_prompt;
        Tmax = cfg->max_positions;
    }
    for (int64_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "generate: prompt id %d at %lld outside [0, %lld)", prompt[i],
                            (long long)i, (long long)V);
    lt_model_run_options run = {.B = 1, .T = Tmax, .forward_only = 1};
    LT_TRY(lt_model_prepare(ctx, m, &run));
    size_t seq_bytes = (size_t)Tmax * sizeof(int32_t), logit_bytes = (size_t)V * sizeof(float);
    size_t scratch_bytes = (size_t)V * (sizeof(double) + sizeof(int32_t));
    int32_t *seq = lt_alloc(ctx, LT_DEVICE_CPU, seq_bytes, "generation tokens");
    float *logits = lt_alloc(ctx, LT_DEVICE_CPU, logit_bytes, "generation logits");
    double *probs = lt_alloc(ctx, LT_DEVICE_CPU, scratch_bytes, "sampling scratch");
    lt_status s = LT_OK;
    if (!seq || !logits || !probs) {
        s = LT_ERR_OOM;
        goto done;
    }
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    uint64_t rng = o.seed;
    int64_t T = n_prompt;
    while (*n_out < o.max_tokens) {
        lt_model_batch b = {.B = 1, .T = T, .tokens = seq};
        if ((s = lt_model_logits_last(ctx, m, &b, logits)) != LT_OK) goto done;
        int32_t id = pick(logits, V, &o, &rng, probs, (int32_t *)(probs + V));
        out[(*n_out)++] = id;
        seq[T++] = id;
        if (on_token) on_token(arg, id);
        int stop = 0;
        for (int i = 0; i < n_stop; i++) stop |= id == stop_ids[i];
        if (stop) break;
    }
done:
    if (seq) lt_free(ctx, LT_DEVICE_CPU, seq, seq_bytes);
    if (logits) lt_free(ctx, LT_DEVICE_CPU, logits, logit_bytes);
    if (probs) lt_free(ctx, LT_DEVICE_CPU, probs, scratch_bytes);
    return s;
}
