/* lt_model_config_check_bounds (config_bounds.h): one check of a configuration's ranges for every
 * source, so an absurd value (4e15 layers, an infinite rms epsilon) is refused naming its key
 * before anything is sized or looped over. */
#include <math.h>
#include <stdio.h>

#include "model/config_bounds.h"

static const lt_model_config_keys hf_keys = {{"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                              "num_attention_heads", "num_key_value_heads", "head_dim",
                                              "max_position_embeddings", "rope_theta", "rms_norm_eps"}};

static lt_status int_out(lt_ctx *ctx, const char *where, const char *key, int64_t v, int64_t lo, int64_t hi) {
    return lt_error(ctx, LT_ERR_FORMAT, "%s: %s = %lld is outside [%lld, %lld]", where, key, (long long)v,
                    (long long)lo, (long long)hi);
}

lt_status lt_model_config_check_bounds(lt_ctx *ctx, const char *where, const lt_model_config *c,
                                       const lt_model_config_keys *keys) {
    const char *const *k = (keys ? keys : &hf_keys)->name;
    const struct {
        int64_t v, lo, hi;
    } ints[] = {{c->V, 1, LT_MODEL_MAX_VOCAB},    {c->C, 1, LT_MODEL_MAX_WIDTH},
                {c->F, 1, LT_MODEL_MAX_MLP},      {c->L, 1, LT_MODEL_MAX_LAYERS},
                {c->H, 1, LT_MODEL_MAX_HEADS},    {c->Hkv, 1, c->H >= 1 ? c->H : 1},
                {c->D, 2, LT_MODEL_MAX_HEAD_DIM}, {c->max_positions, 0, LT_MODEL_MAX_POSITIONS}};
    for (int i = 0; i < 8; i++)
        if (ints[i].v < ints[i].lo || ints[i].v > ints[i].hi)
            return int_out(ctx, where, k[i], ints[i].v, ints[i].lo, ints[i].hi);
    if (c->H % c->Hkv)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %s = %lld does not divide %s = %lld", where, k[5], (long long)c->Hkv,
                        k[4], (long long)c->H);
    if (c->D % 2)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %s = %lld is odd (RoPE rotates pairs)", where, k[6], (long long)c->D);
    if (c->H * c->D > LT_MODEL_MAX_WIDTH) /* both at most 2^12: no overflow */
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %s × %s = %lld × %lld is over %d", where, k[4], k[6], (long long)c->H,
                        (long long)c->D, LT_MODEL_MAX_WIDTH);
    if (!(c->rope_theta >= 1 && c->rope_theta <= LT_MODEL_MAX_ROPE_THETA))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %s = %g is outside [1, %g]", where, k[8], c->rope_theta,
                        LT_MODEL_MAX_ROPE_THETA);
    if (c->rope_local_theta != 0 && !(c->rope_local_theta >= 1 && c->rope_local_theta <= LT_MODEL_MAX_ROPE_THETA))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: the local rope base = %g is outside [1, %g]", where,
                        c->rope_local_theta, LT_MODEL_MAX_ROPE_THETA);
    if (!(c->rms_eps > 0 && c->rms_eps <= LT_MODEL_MAX_RMS_EPS))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %s = %g is outside (0, %g]", where, k[9], (double)c->rms_eps,
                        LT_MODEL_MAX_RMS_EPS);
    return LT_OK;
}
