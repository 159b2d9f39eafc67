/* The per-layer description: how a config expands into one lt_layer_desc per layer, and the one
 * check that refuses a kind the model cannot run yet. The families' config readers (config_hf.c,
 * the GGUF reader in load.c) fill the config fields this reads; nothing here touches memory. */
#include <math.h>
#include <string.h>

#include "model/model_internal.h"

const char *lt_attn_kind_name(lt_attn_kind k) {
    static const char *const n[] = {"full attention", "sliding-window attention", "no attention"};
    return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "unknown attention";
}

const char *lt_norm_place_name(lt_norm_place p) {
    static const char *const n[] = {"pre-norm", "post-norm", "sandwich norm"};
    return (unsigned)p < sizeof n / sizeof n[0] ? n[p] : "unknown norm placement";
}

const char *lt_mlp_kind_name(lt_mlp_kind k) {
    static const char *const n[] = {"SwiGLU MLP", "GeGLU MLP", "mixture-of-experts MLP"};
    return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "unknown MLP";
}

int lt_model_layer_is_moe(const lt_model_config *c, int64_t l) {
    if (c->n_experts <= 0) return 0;
    if (l >= 0 && l < LT_MODEL_MAX_MIXED_LAYERS && c->moe_dense[l]) return 0;
    return c->moe_every <= 1 || (l + 1) % c->moe_every == 0;
}

void lt_model_describe_layer(const lt_model_config *c, int64_t l, lt_layer_desc *d) {
    memset(d, 0, sizeof *d);
    int global = c->sliding_period > 0 && l % c->sliding_period == c->sliding_period - 1;
    if (c->sliding_window > 0 && !global) {
        d->attn = LT_ATTN_KIND_SLIDING;
        d->window = c->sliding_window;
    }
    d->D = c->D;
    d->softcap = c->attn_softcap;
    d->qk_norm = c->qk_norm != 0;
    d->qkv_bias = c->qkv_bias != 0;
    d->norm = c->norm_place;
    d->mlp = c->mlp;
    if (lt_model_layer_is_moe(c, l)) d->mlp = LT_MLP_KIND_MOE;
    /* Gemma 3: sliding layers rotate by their own base (table 1), global ones by rope_theta */
    d->rope = d->attn == LT_ATTN_KIND_SLIDING && c->rope_local_theta > 0 ? 1 : 0;
}

/* What the step runs: pre-norm or sandwich-norm blocks, SwiGLU or GeGLU, full or sliding attention
 * over the model's head dim and its RoPE table (a second one for sliding layers when the config has
 * rope_local_theta). */
static lt_status check_one(lt_ctx *ctx, const lt_model_config *c, int64_t l, const lt_layer_desc *d) {
    const long long ll = (long long)l;
    if (d->attn != LT_ATTN_KIND_FULL && d->attn != LT_ATTN_KIND_SLIDING)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: layer %lld has %s, which the model cannot run", ll,
                        lt_attn_kind_name(d->attn));
    if (d->norm != LT_NORM_PLACE_PRE && d->norm != LT_NORM_PLACE_SANDWICH)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "model: layer %lld has a %s block, which the model cannot run "
                        "(pre-norm or sandwich norm)",
                        ll, lt_norm_place_name(d->norm));
    if (d->mlp != LT_MLP_KIND_SWIGLU && d->mlp != LT_MLP_KIND_GEGLU && d->mlp != LT_MLP_KIND_MOE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "model: layer %lld has a %s, which the model cannot run (SwiGLU, "
                        "GeGLU or mixture of experts)",
                        ll, lt_mlp_kind_name(d->mlp));
    if (d->mlp == LT_MLP_KIND_MOE && c->n_experts <= 0)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: layer %lld has a %s without experts (n_experts = %lld)", ll,
                        lt_mlp_kind_name(d->mlp), (long long)c->n_experts);
    if (d->mlp == LT_MLP_KIND_MOE && d->norm != LT_NORM_PLACE_PRE)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: layer %lld has a %s with a %s, which the model cannot run", ll,
                        lt_mlp_kind_name(d->mlp), lt_norm_place_name(d->norm));
    int n_tables = c->rope_local_theta > 0 ? 2 : 1;
    if (d->D != c->D || d->rope < 0 || d->rope >= n_tables)
        return lt_error(ctx, LT_ERR_UNSUPPORTED,
                        "model: layer %lld has head dim %lld and RoPE table %d; the model "
                        "runs one head dim (%lld) and %d table(s)",
                        ll, (long long)d->D, d->rope, (long long)c->D, n_tables);
    if (d->window < 0 || (d->attn == LT_ATTN_KIND_SLIDING && d->window == 0))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: layer %lld has a sliding window of %lld keys", ll,
                        (long long)d->window);
    if (!(d->softcap >= 0))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: layer %lld has attention softcap %g (needs >= 0)", ll,
                        (double)d->softcap);
    return LT_OK;
}

lt_status lt_model_check_layers(lt_ctx *ctx, const lt_model_config *c) {
    if (c->D / 2 > LT_ROPE_MAX_FACTORS)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "model: head dim %lld is above the RoPE table's %d", (long long)c->D,
                        2 * LT_ROPE_MAX_FACTORS);
    if (c->sliding_window < 0 || c->sliding_period < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "model: sliding_window %lld and sliding_period %lld must be >= 0",
                        (long long)c->sliding_window, (long long)c->sliding_period);
    if (!(c->final_softcap >= 0 && isfinite(c->final_softcap)) || !(c->embed_scale >= 0 && isfinite(c->embed_scale)) ||
        !(c->query_scale >= 0 && isfinite(c->query_scale)) ||
        !(c->rope_local_theta >= 0 && isfinite(c->rope_local_theta)))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "model: final_softcap %g, embed_scale %g, query_scale %g and rope_local_theta %g must be "
                        "finite and >= 0",
                        (double)c->final_softcap, (double)c->embed_scale, c->query_scale, c->rope_local_theta);
    LT_TRY(lt_model_check_moe(ctx, c));
    for (int64_t l = 0; l < c->L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(c, l, &d);
        LT_TRY(check_one(ctx, c, l, &d));
    }
    return LT_OK;
}

lt_layer_desc lt_model_widest_layer(const lt_model_config *c) {
    lt_layer_desc w;
    lt_model_describe_layer(c, 0, &w);
    for (int64_t l = 1; l < c->L; l++) {
        lt_layer_desc d;
        lt_model_describe_layer(c, l, &d);
        w.qk_norm |= d.qk_norm;
        w.qkv_bias |= d.qkv_bias;
        if (d.norm == LT_NORM_PLACE_SANDWICH) w.norm = d.norm;
    }
    return w;
}

const lt_proj lt_proj_group_qkv[3] = {LT_PROJ_Q, LT_PROJ_K, LT_PROJ_V};
const lt_proj lt_proj_group_gate_up[2] = {LT_PROJ_GATE, LT_PROJ_UP};

lt_proj lt_model_lora_owner(const lt_model_config *c, lt_proj p) {
    if (c->arch != LT_ARCH_PHI3) return p;
    if (p == LT_PROJ_K || p == LT_PROJ_V) return LT_PROJ_Q;
    if (p == LT_PROJ_UP) return LT_PROJ_GATE;
    return p;
}

const char *lt_model_lora_module(const lt_model_config *c, lt_proj p) {
    if (c->arch == LT_ARCH_PHI3 && p == LT_PROJ_Q) return "qkv_proj";
    if (c->arch == LT_ARCH_PHI3 && p == LT_PROJ_GATE) return "gate_up_proj";
    return lt_proj_name(p);
}

lt_status lt_model_check_lora_targets(lt_ctx *ctx, const lt_model_config *c, unsigned targets) {
    for (int p = 0; p < LT_PROJ_COUNT_; p++) {
        lt_proj o = lt_model_lora_owner(c, (lt_proj)p);
        if (((targets >> p) & 1u) != ((targets >> o) & 1u))
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "lora: %s is one module of this model (%s); target all of its projections or none",
                            lt_model_lora_module(c, o), o == LT_PROJ_Q ? "q, k and v" : "gate and up");
    }
    return LT_OK;
}
