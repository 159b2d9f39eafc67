/* Generation over the KV cache (kv_cache.h): sampling (temperature, top-k, top-p, min-p, a
 * repetition penalty, a seeded RNG per row; greedy at temperature 0) and the loop that prefills a
 * batch of prompts and decodes one token per live row per step until each row stops (an EOS id,
 * the caller's callback, max_tokens or the end of its cache row). */
#ifndef LONGTUNE_GENERATE_H
#define LONGTUNE_GENERATE_H

#include "export.h"
#include "kv_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Applied in this order (as transformers' logits processors): repetition penalty, temperature,
 * top-k, top-p, min-p; then a draw from what is left, renormalised. Zero fields are "off". */
typedef struct lt_sample_options {
    double temperature;    /* 0 = greedy (argmax after the penalty, lowest id on ties); else > 0 */
    int64_t top_k;         /* keep the k most likely ids; 0 = all */
    double top_p;          /* keep the smallest most-likely set of mass >= top_p, in (0, 1]; 0 = 1 */
    double min_p;          /* keep ids with p >= min_p · p_max, in [0, 1) */
    double repeat_penalty; /* ids among the last repeat_last_n tokens: logit z -> z/pen (z > 0) or
                              z·pen (CTRL's rule, as transformers and llama.cpp); 0 = 1 = off */
    int64_t repeat_last_n; /* tokens the penalty looks back over; 0 = 64 */
    uint64_t seed;         /* row i draws from splitmix64 seeded with seed + i */
} lt_sample_options;

/* LT_OK, or LT_ERR_INVALID_ARG naming the field and its allowed range. */
LT_API lt_status lt_sample_check(lt_ctx *ctx, const lt_sample_options *o);

typedef struct lt_sampler lt_sampler;
/* Scratch for a vocabulary of V. Errors: LT_ERR_INVALID_ARG (as lt_sample_check), LT_ERR_OOM. */
LT_API lt_status lt_sampler_new(lt_ctx *ctx, int64_t V, const lt_sample_options *o, lt_sampler **out);
LT_API void lt_sampler_free(lt_ctx *ctx, lt_sampler *s);
/* The next id from logits (V) given the row's recent tokens history[0 .. n_history) (the penalty
 * reads the last repeat_last_n of them); *rng is the row's generator state (advanced once per
 * draw; untouched when greedy). */
LT_API int32_t lt_sampler_pick(lt_sampler *s, const float *logits, const int32_t *history, int64_t n_history,
                               uint64_t *rng);

typedef struct lt_generate_request {
    int64_t max_tokens; /* new tokens per row at most; 0 = 256 */
    lt_sample_options sample;
    const int32_t *stop_ids; /* a row ends after sampling any of these (passed to on_token) */
    int n_stop;
    int bf16_products; /* lt_generate_batch's cache: prompts prefilled on bf16 products
                          (lt_kv_cache_options.bf16_products) */
} lt_generate_request;

typedef struct lt_generate_stats {
    int64_t prompt_tokens, new_tokens, decode_steps;
    double prefill_s, decode_s; /* wall time of the prefill and of the decode steps */
    size_t cache_bytes;         /* lt_generate_batch: every byte its cache allocated (keys and values
                                   L·2·B·ctx·Hkv·D·4, plus scratch) */
} lt_generate_stats;

/* Sees each new id of row i (its index among the call's rows) as soon as it is chosen; returns
 * nonzero to end that row (a stop string matched, say). */
typedef int (*lt_generate_token_fn)(void *arg, int64_t i, int32_t id);

/* Extends cache row rows[i] with prompt[i][0 .. n_prompt[i]) (the tokens after what the row
 * already holds) for i < n, then decodes until every row has stopped. A row's last sampled token
 * is not fed back: afterwards the row holds its prompt and every generated token but the last.
 * rng (n) holds each row's generator state (NULL: seed + i). The repetition penalty looks at this
 * call's prompt and generated tokens. Errors: those of lt_kv_cache_extend (a prompt that does not
 * fit its row names the row, lengths and context) and lt_sample_check; LT_ERR_OOM. */
LT_API lt_status lt_generate_rows(lt_ctx *ctx, lt_kv_cache *c, int64_t n, const int64_t *rows,
                                  const int32_t *const *prompt, const int64_t *n_prompt, const lt_generate_request *req,
                                  uint64_t *rng, lt_generate_token_fn on_token, void *arg, lt_generate_stats *stats);

/* A cache of n rows sized for the longest prompt plus max_tokens (the model's max_positions at
 * most), lt_generate_rows on rows 0 .. n-1, the cache freed. A prompt longer than max_positions is
 * LT_ERR_INVALID_ARG naming the prompt, its length and the limit. */
LT_API lt_status lt_generate_batch(lt_ctx *ctx, lt_model *m, int64_t n, const int32_t *const *prompt,
                                   const int64_t *n_prompt, const lt_generate_request *req,
                                   lt_generate_token_fn on_token, void *arg, lt_generate_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
