/* The generation loop over the KV cache: one prefill of every row's new prompt tokens (packed in
 * one forward pass where they fit), then decode steps of one token per live row, each row sampled
 * with its own generator so a row's output does not depend on which rows run beside it. lt_generate
 * (train.h) is one row of it. */
#include <string.h>

#include "core/rng.h"
#include "longtune/alloc.h"
#include "longtune/generate.h"
#include "longtune/log.h"
#include "train/train_internal.h"

/* Tokens of one prefill pass at most: bounds the scratch (activations of that many tokens). */
#define LT_GENERATE_PASS_TOKENS 2048

lt_status lt_generate_rows(lt_ctx *ctx, lt_kv_cache *c, int64_t n, const int64_t *rows, const int32_t *const *prompt,
                           const int64_t *n_prompt, const lt_generate_request *req, uint64_t *rng_io,
                           lt_generate_token_fn on_token, void *arg, lt_generate_stats *stats) {
    lt_generate_stats st;
    memset(&st, 0, sizeof st);
    if (n < 1 || n > LT_KV_MAX_RUNS)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "generate: %lld rows (1..%d)", (long long)n, LT_KV_MAX_RUNS);
    const lt_model_config *cf = NULL;
    LT_TRY(lt_sample_check(ctx, &req->sample));
    int64_t max_new = req->max_tokens > 0 ? req->max_tokens : 256, V = 0;
    /* the vocabulary comes from the logits row size the cache's model has */
    cf = lt_kv_cache_config(c);
    V = cf->V;
    int64_t hist_n = 0;
    for (int64_t i = 0; i < n; i++) hist_n += n_prompt[i] + max_new;
    size_t logit_bytes = (size_t)(n * V) * sizeof(float), hist_bytes = (size_t)hist_n * sizeof(int32_t);
    size_t row_bytes = (size_t)n * (3 * sizeof(int64_t) + sizeof(uint64_t) + sizeof(int32_t *) + 2 * sizeof(int32_t));
    float *logits = lt_alloc(ctx, LT_DEVICE_CPU, logit_bytes, "generation logits");
    int32_t *hist = lt_alloc(ctx, LT_DEVICE_CPU, hist_bytes, "generation history");
    uint8_t *rb = lt_alloc(ctx, LT_DEVICE_CPU, row_bytes, "generation rows");
    lt_sampler *smp = NULL;
    lt_status s = LT_OK;
    if (!logits || !hist || !rb) {
        s = lt_ctx_status(ctx);
        goto done;
    }
    if ((s = lt_sampler_new(ctx, V, &req->sample, &smp)) != LT_OK) goto done;
    int64_t *h0 = (int64_t *)rb, *hn = h0 + n, *live_rows = hn + n;
    uint64_t *rng = (uint64_t *)(live_rows + n);
    const int32_t **feed = (const int32_t **)(rng + n);
    int32_t *next = (int32_t *)(feed + n), *live = next + n;
    int64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        h0[i] = off;
        memcpy(hist + off, prompt[i], (size_t)n_prompt[i] * sizeof(int32_t));
        hn[i] = n_prompt[i];
        off += n_prompt[i] + max_new;
        rng[i] = rng_io ? rng_io[i] : req->sample.seed + (uint64_t)i;
        st.prompt_tokens += n_prompt[i];
    }
    double t0 = lt_time_now();
    if ((s = lt_kv_cache_extend(ctx, c, n, rows, prompt, n_prompt, logits)) != LT_OK) goto done;
    st.prefill_s = lt_time_now() - t0;
    t0 = lt_time_now();
    int64_t n_live = n;
    for (int64_t i = 0; i < n; i++) live[i] = 1;
    int64_t *lr = live_rows;
    for (int64_t step = 0; n_live > 0; step++) {
        /* logits row k belongs to the k-th live row of the previous call */
        int64_t k = 0, m = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!live[i]) continue;
            int32_t id = lt_sampler_pick(smp, logits + k * V, hist + h0[i], hn[i], &rng[i]);
            k++;
            hist[h0[i] + hn[i]++] = id;
            st.new_tokens++;
            int stop = on_token ? on_token(arg, i, id) != 0 : 0;
            for (int j = 0; j < req->n_stop; j++) stop |= id == req->stop_ids[j];
            if (hn[i] - n_prompt[i] >= max_new) stop = 1;
            if (lt_kv_cache_length(c, rows[i]) >= lt_kv_cache_context(c)) stop = 1;
            if (stop) {
                live[i] = 0;
                n_live--;
                continue;
            }
            next[m] = id;
            lr[m] = rows[i];
            feed[m] = &next[m];
            m++;
        }
        if (!m) break;
        int64_t ones[LT_KV_MAX_RUNS];
        for (int64_t j = 0; j < m; j++) ones[j] = 1;
        if ((s = lt_kv_cache_extend(ctx, c, m, lr, feed, ones, logits)) != LT_OK) goto done;
        st.decode_steps++;
    }
    st.decode_s = lt_time_now() - t0;
    if (rng_io)
        for (int64_t i = 0; i < n; i++) rng_io[i] = rng[i];
done:
    lt_sampler_free(ctx, smp);
    if (rb) lt_free(ctx, LT_DEVICE_CPU, rb, row_bytes);
    if (hist) lt_free(ctx, LT_DEVICE_CPU, hist, hist_bytes);
    if (logits) lt_free(ctx, LT_DEVICE_CPU, logits, logit_bytes);
    if (stats) *stats = st;
    return s;
}

lt_status lt_generate_batch(lt_ctx *ctx, lt_model *m, int64_t n, const int32_t *const *prompt, const int64_t *n_prompt,
                            const lt_generate_request *req, lt_generate_token_fn on_token, void *arg,
                            lt_generate_stats *stats) {
    const lt_model_config *cf = lt_model_get_config(m);
    if (n < 1 || n > LT_KV_MAX_RUNS)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "generate: %lld prompts (1..%d)", (long long)n, LT_KV_MAX_RUNS);
    int64_t longest = 0, max_new = req->max_tokens > 0 ? req->max_tokens : 256;
    for (int64_t i = 0; i < n; i++) {
        if (n_prompt[i] < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "generate: prompt %lld is empty", (long long)i);
        if (cf->max_positions > 0 && n_prompt[i] >= cf->max_positions)
            return lt_error(ctx, LT_ERR_INVALID_ARG,
                            "generate: prompt %lld has %lld tokens; the model's context (max_positions) is %lld",
                            (long long)i, (long long)n_prompt[i], (long long)cf->max_positions);
        if (n_prompt[i] > longest) longest = n_prompt[i];
    }
    int64_t ctx_len = longest + max_new;
    if (cf->max_positions > 0 && ctx_len > cf->max_positions) ctx_len = cf->max_positions;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += n_prompt[i];
    lt_kv_cache *c = NULL;
    size_t cache_bytes = 0;
    /* one pass holds every prompt up to LT_GENERATE_PASS_TOKENS tokens in all (longer batches
       prefill row by row in passes of that size), and always one token of every row */
    int64_t n_max = total < LT_GENERATE_PASS_TOKENS ? total : LT_GENERATE_PASS_TOKENS;
    if (n_max < n) n_max = n;
    const lt_kv_cache_options ko = {.B = n, .ctx_len = ctx_len, .n_max = n_max, .bf16_products = req->bf16_products};
    LT_TRY(lt_kv_cache_create(ctx, m, &ko, &c, &cache_bytes));
    int64_t rows[LT_KV_MAX_RUNS];
    for (int64_t i = 0; i < n; i++) rows[i] = i;
    lt_status s = lt_generate_rows(ctx, c, n, rows, prompt, n_prompt, req, NULL, on_token, arg, stats);
    if (stats) stats->cache_bytes = cache_bytes;
    lt_kv_cache_free(ctx, c);
    return s;
}

typedef struct one_row {
    void (*on_token)(void *arg, int32_t id);
    void *arg;
    int32_t *out;
    int64_t n;
} one_row;

static int one_token(void *arg, int64_t i, int32_t id) {
    (void)i;
    one_row *o = arg;
    o->out[o->n++] = id;
    if (o->on_token) o->on_token(o->arg, id);
    return 0;
}

lt_status lt_generate(lt_ctx *ctx, lt_model *m, const int32_t *prompt, int64_t n_prompt, const int32_t *stop_ids,
                      int n_stop, const lt_generate_options *opt, int32_t *out, int64_t *n_out,
                      void (*on_token)(void *arg, int32_t id), void *arg) {
    *n_out = 0;
    lt_generate_request req;
    memset(&req, 0, sizeof req);
    req.max_tokens = opt->max_tokens > 0 ? opt->max_tokens : 256;
    req.sample.temperature = opt->temp;
    req.sample.top_p = opt->top_p;
    req.sample.seed = opt->seed;
    req.stop_ids = stop_ids, req.n_stop = n_stop;
    if (n_prompt < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "generate: empty prompt");
    one_row o = {on_token, arg, out, 0};
    lt_status s = lt_generate_batch(ctx, m, 1, &prompt, &n_prompt, &req, one_token, &o, NULL);
    *n_out = o.n;
    return s;
}
