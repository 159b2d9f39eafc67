/* See ref_ops.h. */
#include "helpers/ref_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Start of the sequence holding token t in row b. */
static int64_t seq_start(const lt_ref_attn *a, int64_t b, int64_t t) {
    if (!a->off) return 0;
    int64_t s0 = 0;
    for (int64_t s = 0; s < a->S; s++)
        if (a->off[b * (a->S + 1) + s] <= t) s0 = a->off[b * (a->S + 1) + s];
    return s0;
}

/* Scores of query (b, t, h) over keys j in [lo, t]: raw (before the cap) and capped. */
static double attn_score(const lt_ref_attn *a, const double *q, const double *k, int64_t b, int64_t t, int64_t h,
                         int64_t j, double *raw) {
    const int64_t hk = h / (a->H / a->Hkv), D = a->D;
    const double *qv = q + ((b * a->T + t) * a->H + h) * D, *kv = k + ((b * a->T + j) * a->Hkv + hk) * D;
    double s = 0;
    for (int64_t d = 0; d < D; d++) s += qv[d] * kv[d];
    s *= a->scale;
    *raw = s;
    return a->cap > 0 ? a->cap * tanh(s / a->cap) : s;
}

static int64_t attn_lo(const lt_ref_attn *a, int64_t b, int64_t t) {
    int64_t lo = seq_start(a, b, t);
    if (a->window > 0 && t - a->window + 1 > lo) lo = t - a->window + 1;
    return lo;
}

/* Forward in float64: o (B, T, H, D), lse (B, H, T). */
void lt_ref_attn_forward(const lt_ref_attn *a, const double *q, const double *k, const double *v, double *o,
                         double *lse) {
    const int64_t D = a->D;
    double *p = malloc(sizeof(double) * (size_t)a->T);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t t = 0; t < a->T; t++) {
                const int64_t lo = attn_lo(a, b, t), hk = h / (a->H / a->Hkv);
                double m = -INFINITY, z = 0, raw;
                for (int64_t j = lo; j <= t; j++) p[j] = attn_score(a, q, k, b, t, h, j, &raw), m = fmax(m, p[j]);
                for (int64_t j = lo; j <= t; j++) p[j] = exp(p[j] - m), z += p[j];
                lse[(b * a->H + h) * a->T + t] = m + log(z);
                double *ov = o + ((b * a->T + t) * a->H + h) * D;
                for (int64_t d = 0; d < D; d++) ov[d] = 0;
                for (int64_t j = lo; j <= t; j++)
                    for (int64_t d = 0; d < D; d++) ov[d] += p[j] / z * v[((b * a->T + j) * a->Hkv + hk) * D + d];
            }
    free(p);
}

/* Backward in float64 given dout: dq, dk, dv (zeroed here). */
void lt_ref_attn_backward(const lt_ref_attn *a, const double *q, const double *k, const double *v, const double *o,
                          const double *lse, const double *g, double *dq, double *dk, double *dv) {
    const int64_t D = a->D, nq = a->B * a->T * a->H * D, nk = a->B * a->T * a->Hkv * D;
    memset(dq, 0, sizeof(double) * (size_t)nq), memset(dk, 0, sizeof(double) * (size_t)nk);
    memset(dv, 0, sizeof(double) * (size_t)nk);
    for (int64_t b = 0; b < a->B; b++)
        for (int64_t h = 0; h < a->H; h++)
            for (int64_t t = 0; t < a->T; t++) {
                const int64_t lo = attn_lo(a, b, t), hk = h / (a->H / a->Hkv), qi = ((b * a->T + t) * a->H + h) * D;
                double go = 0;
                for (int64_t d = 0; d < D; d++) go += g[qi + d] * o[qi + d];
                for (int64_t j = lo; j <= t; j++) {
                    const int64_t ki = ((b * a->T + j) * a->Hkv + hk) * D;
                    double raw, s = attn_score(a, q, k, b, t, h, j, &raw);
                    const double p = exp(s - lse[(b * a->H + h) * a->T + t]);
                    double dp = 0;
                    for (int64_t d = 0; d < D; d++) dp += g[qi + d] * v[ki + d], dv[ki + d] += p * g[qi + d];
                    double ds = p * (dp - go);
                    if (a->cap > 0) {
                        const double th = tanh(raw / a->cap);
                        ds *= 1 - th * th;
                    }
                    ds *= a->scale;
                    for (int64_t d = 0; d < D; d++) dq[qi + d] += ds * k[ki + d], dk[ki + d] += ds * q[qi + d];
                }
            }
}

/* Σ g·o of the float64 forward: the scalar whose gradient the backward computes. */
double lt_ref_attn_loss(const lt_ref_attn *a, const double *q, const double *k, const double *v, const double *g,
                        double *o, double *lse) {
    lt_ref_attn_forward(a, q, k, v, o, lse);
    double l = 0;
    for (int64_t i = 0; i < a->B * a->T * a->H * a->D; i++) l += g[i] * o[i];
    return l;
}

/* Forward (and, with dh, backward) in float64 as lce.h defines it. loss: (1) or, for NONE, (N).
 * dloss: the upstream gradient, (1) or (N). Returns Σ dloss·loss, the scalar dh is the gradient of. */
double lt_ref_lce(const double *h, const double *w, const int32_t *tgt, int64_t N, int64_t C, int64_t V,
                  const lt_ref_lce_opts *o, const double *dloss, double *loss, double *lse, double *dh) {
    double *z = malloc(sizeof(double) * (size_t)V), *raw = malloc(sizeof(double) * (size_t)V);
    double wsum = 0, total = 0, scalar = 0;
    for (int64_t i = 0; i < N; i++) wsum += tgt[i] != LT_IGNORE_INDEX ? (o->tw ? o->tw[i] : 1.0) : 0.0;
    for (int64_t i = 0; i < N; i++) {
        const double wi = o->tw ? o->tw[i] : 1.0;
        if (dh)
            for (int64_t c = 0; c < C; c++) dh[i * C + c] = 0;
        if (o->red == LT_REDUCTION_NONE) loss[i] = 0;
        if (lse) lse[i] = 0;
        if (tgt[i] == LT_IGNORE_INDEX) continue;
        double m = -INFINITY, se = 0, zmean = 0;
        for (int64_t j = 0; j < V; j++) {
            double acc = 0;
            for (int64_t c = 0; c < C; c++) acc += h[i * C + c] * w[j * C + c];
            raw[j] = acc;
            z[j] = o->cap > 0 ? o->cap * tanh(acc / o->cap) : acc;
            m = fmax(m, z[j]), zmean += z[j] / (double)V;
        }
        for (int64_t j = 0; j < V; j++) se += exp(z[j] - m);
        const double l = m + log(se);
        if (lse) lse[i] = l;
        const double li = wi * ((1 - o->eps) * (l - z[tgt[i]]) + o->eps * (l - zmean) + o->zl * l * l);
        double gi;
        if (o->red == LT_REDUCTION_NONE) loss[i] = li, gi = dloss[i], scalar += dloss[i] * li;
        else total += li, gi = dloss[0] * (o->red == LT_REDUCTION_MEAN ? (wsum > 0 ? 1.0 / wsum : 0) : 1.0);
        if (dh)
            for (int64_t j = 0; j < V; j++) {
                const double pj = exp(z[j] - l);
                double dz = (1 - o->eps) * (pj - (j == tgt[i])) + o->eps * (pj - 1.0 / (double)V) + 2 * o->zl * l * pj;
                if (o->cap > 0) {
                    const double th = tanh(raw[j] / o->cap);
                    dz *= 1 - th * th;
                }
                dz *= gi * wi;
                for (int64_t c = 0; c < C; c++) dh[i * C + c] += dz * w[j * C + c];
            }
    }
    if (o->red != LT_REDUCTION_NONE) {
        loss[0] = o->red == LT_REDUCTION_MEAN ? (wsum > 0 ? total / wsum : 0) : total;
        scalar = dloss[0] * loss[0];
    }
    free(z), free(raw);
    return scalar;
}
