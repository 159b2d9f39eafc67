/* RoPE frequency tables with Hugging Face's scaling semantics (modeling_rope_utils: default,
 * linear, dynamic NTK, YaRN, llama3, longrope), computed in float64 and stored as the rope op reads
 * them: D/2 inverse frequencies and then the attention factor cos and sin are multiplied by. The
 * checks and the JSON form of the RoPE config live here too. The rotation itself is a backend op. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model/model_internal.h"

static const char *const scaling_names[] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope"};

const char *lt_rope_scaling_name(lt_rope_scaling s) {
    return (unsigned)s < sizeof scaling_names / sizeof scaling_names[0] ? scaling_names[s] : "unknown";
}

/* transformers' get_mscale: YaRN's default attention factor. */
static double yarn_mscale(double factor) { return factor <= 1 ? 1.0 : 0.1 * log(factor) + 1.0; }

double lt_model_rope_attn_factor(const lt_model_config *c) {
    if (c->rope_attn_factor > 0) return c->rope_attn_factor;
    if (c->rope_scaling == LT_ROPE_SCALING_YARN) return yarn_mscale(c->rope_factor);
    if (c->rope_scaling == LT_ROPE_SCALING_LONGROPE)
        return c->rope_factor <= 1 ? 1.0 : sqrt(1 + log(c->rope_factor) / log((double)c->rope_original_ctx));
    return 1.0;
}

/* YaRN's correction dimension of num_rotations over the pretraining context. */
static double yarn_dim(double rot, double D, double base, double ctx) {
    const double pi = 3.14159265358979323846;
    return D * log(ctx / (rot * 2 * pi)) / (2 * log(base));
}

void lt_model_rope_table(const lt_model_config *c, int64_t T, float *table) {
    const int64_t half = c->D / 2;
    const double D = (double)c->D, pi = 3.14159265358979323846;
    const double f = c->rope_factor, old = (double)c->rope_original_ctx;
    double base = c->rope_theta;
    if (c->rope_scaling == LT_ROPE_SCALING_DYNAMIC) { /* _compute_dynamic_ntk_parameters at seq_len T */
        double seq = (double)(T > c->rope_original_ctx ? T : c->rope_original_ctx);
        base *= pow(f * seq / old - (f - 1), D / (D - 2));
    }
    double low = 0, high = 0;
    if (c->rope_scaling == LT_ROPE_SCALING_YARN) {
        double bf = c->rope_beta_fast != 0 ? c->rope_beta_fast : 32,
               bs = c->rope_beta_slow != 0 ? c->rope_beta_slow : 1;
        low = yarn_dim(bf, D, base, old);
        high = yarn_dim(bs, D, base, old);
        if (!c->rope_yarn_no_truncate) low = floor(low), high = ceil(high);
        if (low < 0) low = 0;
        if (high > D - 1) high = D - 1;
        if (low == high) high += 0.001; /* transformers: no singular ramp */
    }
    const float *ext = c->rope_long_factor;
    if (c->rope_scaling == LT_ROPE_SCALING_LONGROPE && !(T > c->rope_original_ctx)) ext = c->rope_short_factor;
    for (int64_t i = 0; i < half; i++) {
        double g = pow(base, -2.0 * (double)i / D);
        switch (c->rope_scaling) {
        case LT_ROPE_SCALING_LINEAR: g /= f; break;
        case LT_ROPE_SCALING_YARN: {
            double ramp = ((double)i - low) / (high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            double keep = 1 - ramp; /* extrapolation share */
            g = g / f * (1 - keep) + g * keep;
            break;
        }
        case LT_ROPE_SCALING_LLAMA3: {
            double low_wl = old / c->rope_low_freq, high_wl = old / c->rope_high_freq, wl = 2 * pi / g;
            if (wl > low_wl) {
                g /= f;
            } else if (wl >= high_wl) { /* medium band: between scaled and unscaled */
                double s = (old / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
                g = (1 - s) * g / f + s * g;
            }
            break;
        }
        case LT_ROPE_SCALING_LONGROPE: g /= (double)ext[i]; break;
        default: break;
        }
        table[i] = (float)g;
    }
    table[half] = (float)lt_model_rope_attn_factor(c);
}

void lt_model_rope_inv_freq(const lt_model_config *cfg, float *inv_freq) { lt_model_rope_table(cfg, 0, inv_freq); }

int lt_model_rope_depends_on_T(const lt_model_config *c) {
    return c->rope_scaling == LT_ROPE_SCALING_DYNAMIC || c->rope_scaling == LT_ROPE_SCALING_LONGROPE;
}

lt_status lt_model_rope_check(lt_ctx *ctx, const char *where, const lt_model_config *c) {
    const char *t = lt_rope_scaling_name(c->rope_scaling);
    if ((unsigned)c->rope_scaling > LT_ROPE_SCALING_LONGROPE)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: unknown rope scaling %d", where, (int)c->rope_scaling);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: rope_theta %g must be a positive number", where, c->rope_theta);
    if (c->rope_scaling == LT_ROPE_SCALING_NONE) return LT_OK;
    if (!(c->rope_factor >= 1) || !isfinite(c->rope_factor))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: %s factor %g must be a number >= 1", where, t, c->rope_factor);
    if (c->rope_original_ctx <= 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: %s original_max_position_embeddings %lld must be positive", where,
                        t, (long long)c->rope_original_ctx);
    if (!(c->rope_attn_factor >= 0) || !isfinite(c->rope_attn_factor))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: %s attention_factor %g must be >= 0", where, t,
                        c->rope_attn_factor);
    if (c->rope_scaling == LT_ROPE_SCALING_YARN) {
        if (!(c->rope_beta_fast >= 0) || !(c->rope_beta_slow >= 0) || !isfinite(c->rope_beta_fast) ||
            !isfinite(c->rope_beta_slow))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: yarn beta_fast %g and beta_slow %g must be >= 0", where,
                            c->rope_beta_fast, c->rope_beta_slow);
    }
    if (c->rope_scaling == LT_ROPE_SCALING_LLAMA3 &&
        !(c->rope_low_freq > 0 && c->rope_high_freq > c->rope_low_freq && isfinite(c->rope_high_freq)))
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "%s: llama3 low_freq_factor %g and high_freq_factor %g (need 0 < low < high)", where,
                        c->rope_low_freq, c->rope_high_freq);
    if (c->rope_scaling == LT_ROPE_SCALING_LONGROPE && c->rope_n_factors != c->D / 2)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: longrope needs %lld short and long factors, the model has %lld",
                        where, (long long)(c->D / 2), (long long)c->rope_n_factors);
    return LT_OK;
}

lt_status lt_model_config_apply_rope(lt_ctx *ctx, lt_model_config *cfg, const lt_rope_override *ov) {
    if (!ov || ov->scaling == LT_ROPE_SCALING_NONE) return LT_OK;
    const char *t = lt_rope_scaling_name(ov->scaling);
    if ((unsigned)ov->scaling > LT_ROPE_SCALING_LONGROPE)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "--rope-scaling: unknown type %d", (int)ov->scaling);
    if (!(ov->factor > 0) || !isfinite(ov->factor))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "--rope-factor %g must be a positive number", ov->factor);
    int64_t orig = ov->original_ctx ? ov->original_ctx : cfg->max_positions;
    if (orig <= 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "--original-max-position %lld must be positive", (long long)orig);
    double target = (double)orig * ov->factor;
    if (ov->factor < 1)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "--rope-scaling %s: the original context %lld is longer than the extended one (%.0f = %lld x "
                        "--rope-factor %g)",
                        t, (long long)orig, target, (long long)orig, ov->factor);
    if (cfg->max_positions > 0 && orig > cfg->max_positions)
        return lt_error(
            ctx, LT_ERR_INVALID_ARG,
            "--original-max-position %lld is longer than the model's context (max_position_embeddings %lld)",
            (long long)orig, (long long)cfg->max_positions);
    if (ov->scaling == LT_ROPE_SCALING_LONGROPE && cfg->rope_n_factors != cfg->D / 2)
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "--rope-scaling longrope needs the model's short_factor/long_factor lists (a longrope model)");
    if (target > 4.0e15) return lt_error(ctx, LT_ERR_INVALID_ARG, "--rope-factor %g is too large", ov->factor);
    lt_model_config c = *cfg;
    c.rope_scaling = ov->scaling;
    c.rope_factor = ov->factor;
    c.rope_original_ctx = orig;
    c.rope_beta_fast = ov->beta_fast;
    c.rope_beta_slow = ov->beta_slow;
    c.rope_attn_factor = ov->attn_factor;
    c.rope_yarn_no_truncate = 0;
    if (ov->scaling == LT_ROPE_SCALING_LLAMA3 && !(c.rope_high_freq > c.rope_low_freq && c.rope_low_freq > 0)) {
        c.rope_low_freq = 1.0; /* transformers' llama3 defaults (Llama 3.1) */
        c.rope_high_freq = 4.0;
    }
    c.max_positions = (int64_t)target;
    LT_TRY(lt_model_rope_check(ctx, "--rope-scaling", &c));
    *cfg = c;
    return LT_OK;
}

/* %.17g, and integers without an exponent. */
static int put_num(char *b, size_t cap, size_t at, const char *key, double v) {
    return snprintf(at < cap ? b + at : NULL, at < cap ? cap - at : 0, ", \"%s\": %.17g", key, v);
}

lt_status lt_model_config_rope_json(lt_ctx *ctx, const lt_model_config *c, char *buf, size_t cap) {
    size_t at = 0;
    int n = snprintf(buf, cap, "{\"rope_type\": \"%s\", \"rope_theta\": %.17g", lt_rope_scaling_name(c->rope_scaling),
                     c->rope_theta);
    at += (size_t)n;
    if (c->rope_scaling != LT_ROPE_SCALING_NONE) {
        at += (size_t)put_num(buf, cap, at, "factor", c->rope_factor);
        if (c->rope_scaling != LT_ROPE_SCALING_DYNAMIC)
            at += (size_t)put_num(buf, cap, at, "original_max_position_embeddings", (double)c->rope_original_ctx);
    }
    if (c->rope_scaling == LT_ROPE_SCALING_LLAMA3) {
        at += (size_t)put_num(buf, cap, at, "low_freq_factor", c->rope_low_freq);
        at += (size_t)put_num(buf, cap, at, "high_freq_factor", c->rope_high_freq);
    }
    if (c->rope_scaling == LT_ROPE_SCALING_YARN || c->rope_scaling == LT_ROPE_SCALING_LONGROPE)
        at += (size_t)put_num(buf, cap, at, "attention_factor", lt_model_rope_attn_factor(c));
    if (c->rope_scaling == LT_ROPE_SCALING_YARN) {
        at += (size_t)put_num(buf, cap, at, "beta_fast", c->rope_beta_fast != 0 ? c->rope_beta_fast : 32);
        at += (size_t)put_num(buf, cap, at, "beta_slow", c->rope_beta_slow != 0 ? c->rope_beta_slow : 1);
        n = snprintf(at < cap ? buf + at : NULL, at < cap ? cap - at : 0, ", \"truncate\": %s",
                     c->rope_yarn_no_truncate ? "false" : "true");
        at += (size_t)n;
    }
    if (c->rope_scaling == LT_ROPE_SCALING_LONGROPE) {
        for (int k = 0; k < 2; k++) {
            const float *v = k ? c->rope_long_factor : c->rope_short_factor;
            n = snprintf(at < cap ? buf + at : NULL, at < cap ? cap - at : 0, ", \"%s\": [",
                         k ? "long_factor" : "short_factor");
            at += (size_t)n;
            for (int64_t i = 0; i < c->rope_n_factors; i++) {
                n = snprintf(at < cap ? buf + at : NULL, at < cap ? cap - at : 0, "%s%.9g", i ? ", " : "",
                             (double)v[i]);
                at += (size_t)n;
            }
            n = snprintf(at < cap ? buf + at : NULL, at < cap ? cap - at : 0, "]");
            at += (size_t)n;
        }
    }
    n = snprintf(at < cap ? buf + at : NULL, at < cap ? cap - at : 0, "}");
    at += (size_t)n;
    if (at >= cap)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "rope config JSON needs %zu bytes, the buffer has %zu", at + 1, cap);
    return LT_OK;
}

lt_status lt_model_rope_refresh(lt_ctx *ctx, lt_model *m, int64_t T) {
    if (!m->inv_freq) return LT_OK;
    float table[LT_ROPE_MAX_FACTORS + 1];
    lt_model_rope_table(&m->cfg, T, table);
    return m->be->copy_to_device(ctx, m->inv_freq, table, (size_t)LT_ROPE_TABLE_LEN(m->cfg.D) * sizeof(float));
}

lt_status lt_model_set_rope(lt_ctx *ctx, lt_model *m, const lt_rope_override *ov) {
    if (!ov || ov->scaling == LT_ROPE_SCALING_NONE) return LT_OK;
    if (m->rope_file_factors)
        return lt_error(
            ctx, LT_ERR_UNSUPPORTED,
            "--rope-scaling: this GGUF carries its RoPE scaling as rope_freqs.weight; it cannot be replaced");
    LT_TRY(lt_model_config_apply_rope(ctx, &m->cfg, ov));
    return lt_model_rope_refresh(ctx, m, m->prepared ? m->run.T : 0);
}
