/* The KV cache and the incremental forward of generation: a batch of sequences, each a row of the
 * cache holding its keys (after RoPE) and values for every layer, extended token by token (or a
 * prompt at a time) with only the new tokens' work. A prompt into an empty row runs the flash
 * attention of training over the packed prompts; tokens after cached ones run decode attention
 * (one query per token over that row's cached keys). The cache and its scratch are allocated once
 * at lt_kv_cache_new; nothing allocates in lt_kv_cache_extend. LoRA runs unmerged
 * (y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ) over the quantized base, so an adapter is exactly what training used. */
#ifndef LONGTUNE_KV_CACHE_H
#define LONGTUNE_KV_CACHE_H

#include "export.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lt_kv_cache lt_kv_cache;

#define LT_KV_MAX_RUNS 256 /* rows one lt_kv_cache_extend call serves in a single pass */

/* Bytes of the keys and values alone: L·2·B·ctx·Hkv·D·4 (f32). Errors: LT_ERR_INVALID_ARG (a
 * non-positive size, an overflow). */
LT_API lt_status lt_kv_cache_bytes(lt_ctx *ctx, const lt_model_config *cfg, int64_t B, int64_t ctx_len, size_t *bytes);

/* A cache of B rows of ctx_len positions for m, with scratch for n_max tokens per forward pass
 * (0 = ctx_len; longer calls run in passes of n_max tokens), on m's device, sized for the
 * context's thread count at this call. *out_bytes (may be NULL) gets every byte it allocated.
 * Errors: LT_ERR_INVALID_ARG (sizes; ctx_len above the model's max_positions, named),
 * LT_ERR_UNSUPPORTED (a head dim or layer the device's decode attention refuses), LT_ERR_OOM. */
LT_API lt_status lt_kv_cache_new(lt_ctx *ctx, lt_model *m, int64_t B, int64_t ctx_len, int64_t n_max, lt_kv_cache **out,
                                 size_t *out_bytes);

/* lt_kv_cache_new with options. bf16_products = 1: a prompt's prefill runs flash attention's tiles
 * on bf16 operands and, in passes of more than 8 tokens, multiplies its projections'
 * bf16, f16 and quantized weights on x and W rounded to bf16, as lt_model_run_options.bf16_products
 * does in training (the CPU: oneDNN and AMX tiles where it has them; a CPU build without oneDNN
 * refuses it, LT_ERR_UNSUPPORTED; CUDA multiplies bf16 either way); the decode steps (one query per
 * token over the cache) and the logits keep their products. */
typedef struct lt_kv_cache_options {
    int64_t B, ctx_len, n_max; /* as lt_kv_cache_new's */
    int bf16_products;
} lt_kv_cache_options;
LT_API lt_status lt_kv_cache_create(lt_ctx *ctx, lt_model *m, const lt_kv_cache_options *opt, lt_kv_cache **out,
                                    size_t *out_bytes);
LT_API void lt_kv_cache_free(lt_ctx *ctx, lt_kv_cache *c);

/* Positions cached in row seq (0 outside [0, B)), and the row capacity. */
LT_API int64_t lt_kv_cache_length(const lt_kv_cache *c, int64_t seq);
LT_API int64_t lt_kv_cache_context(const lt_kv_cache *c);
/* The configuration of the cache's model. */
LT_API const lt_model_config *lt_kv_cache_config(const lt_kv_cache *c);

/* Keeps the first len positions of row seq (len <= its length), so a sequence whose prefix is
 * unchanged continues from there. Errors: LT_ERR_INVALID_ARG. */
LT_API lt_status lt_kv_cache_truncate(lt_ctx *ctx, lt_kv_cache *c, int64_t seq, int64_t len);

/* Appends tokens[i][0 .. n_tokens[i]) to row seq[i] for i < n_seq (distinct rows, n_tokens >= 1)
 * and writes the logits (n_seq, V) f32 of each row's last new token into the host buffer logits.
 * Errors: LT_ERR_INVALID_ARG (a row outside the cache or repeated, a token outside [0, V), a row
 * whose length would pass the cache's context: the message names row, lengths and context;
 * threads above the creation's), LT_ERR_UNSUPPORTED, LT_ERR_CUDA. */
LT_API lt_status lt_kv_cache_extend(lt_ctx *ctx, lt_kv_cache *c, int64_t n_seq, const int64_t *seq,
                                    const int32_t *const *tokens, const int64_t *n_tokens, float *logits);

#ifdef __cplusplus
}
#endif
#endif
