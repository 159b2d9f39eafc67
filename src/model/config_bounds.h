/* The bounds every model configuration must respect, whatever its source (config.json, GGUF
 * metadata, a caller's struct): generous for real models (the largest released ones use under a
 * fifth of each), small enough that every size product of the layout -- (B·T) × width, V × C,
 * rank × width × layers -- stays far below 2^63. Internal to the model module. */
#ifndef LT_MODEL_CONFIG_BOUNDS_H
#define LT_MODEL_CONFIG_BOUNDS_H

#include "longtune/model.h"

#define LT_MODEL_MAX_LAYERS 1024           /* num_hidden_layers */
#define LT_MODEL_MAX_WIDTH (1 << 20)       /* hidden_size */
#define LT_MODEL_MAX_MLP (1 << 22)         /* intermediate_size */
#define LT_MODEL_MAX_HEADS 4096            /* num_attention_heads (key/value heads: at most these) */
#define LT_MODEL_MAX_HEAD_DIM 4096         /* head_dim */
#define LT_MODEL_MAX_VOCAB (1 << 24)       /* vocab_size */
#define LT_MODEL_MAX_POSITIONS (1LL << 30) /* max_position_embeddings */
#define LT_MODEL_MAX_ROPE_THETA 1e12       /* rope_theta in [1, this] */
#define LT_MODEL_MAX_RMS_EPS 1.0           /* rms_norm_eps in (0, this] */

/* The names a source gives the bounded fields, in this order: vocab, width, MLP width, layers,
 * heads, key/value heads, head dim, positions, rope base, rms epsilon. */
typedef struct lt_model_config_keys {
    const char *name[10];
} lt_model_config_keys;

/* LT_OK when every shape field of c lies within the bounds above (and H*D within the width
 * bound, Hkv dividing H, D even) and rms_eps, rope_theta (and a local rope base) are finite and in
 * range; else LT_ERR_FORMAT "<where>: <key> = <value> is outside [lo, hi]" with the source's key
 * name. keys may be NULL (Hugging Face names). */
lt_status lt_model_config_check_bounds(lt_ctx *ctx, const char *where, const lt_model_config *c,
                                       const lt_model_config_keys *keys);

#endif
