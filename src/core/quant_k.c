/* The reference (de)quantizers of the 256-weight super-block formats: Q2_K..Q6_K and IQ4_XS.
 * Dequantization is bit-for-bit gguf-py's (gguf.quants.dequantize), every product and difference
 * a separately rounded float32 operation in numpy's order. The quantizers follow the algorithms of
 * ggml's reference quantizers (quantize_row_q{2..6}_K_ref): per sub-block a scale (and for the
 * affine types a min) searched over a few candidate grids for the least weighted error, the
 * sub-block scales then quantized to 4/6/8 bits against one f16 super-scale. There is no IQ4_XS
 * quantizer: its importance-weighted search has no use here. The AVX2 and AVX-512 dequantizers
 * are in quant_avx2.c and quant_avx512.c; the quantizers' per-sub-block searches have an AVX2
 * table in quant_k_avx2.c (eight sub-blocks at once, the same bits), which lt_cpu_isa_active's
 * path picks for every super-block (the super-block step here is shared). */
#include <math.h>
#include <string.h>

#include "core/quant_internal.h"
#include "longtune/tensor.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

enum { QK = 256 };

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* d*q - m as two rounded float32 operations. */
static float scaled_minus(float d, float q, float m) {
    float t = d * q;
    return t - m;
}

void lt_dequant_q2_k_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 84, out += QK) {
        const uint8_t *sc = p, *qs = p + 16;
        float d = lt_quant_half(p + 80), dmin = lt_quant_half(p + 82);
        for (int e = 0; e < QK; e++) {
            int h = e / 128, j = (e / 32) % 4, l = e % 32, s, m;
            int q = (qs[h * 32 + l] >> (2 * j)) & 3;
            lt_q2_scale_min(sc, e / 16, &s, &m);
            out[e] = scaled_minus(d * (float)s, (float)q, dmin * (float)m);
        }
    }
}

void lt_dequant_q3_k_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 110, out += QK) {
        const uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        float d = lt_quant_half(p + 108);
        for (int k = 0; k < 16; k++) {
            float dl = d * (float)lt_q3_scale(sc, k);
            for (int i = 0; i < 16; i++) {
                int e = k * 16 + i, h = e / 128, j = (e / 32) % 4, l = e % 32;
                int lo = (qs[h * 32 + l] >> (2 * j)) & 3, hb = (hm[l] >> (e / 32)) & 1;
                out[e] = dl * (float)(lo - ((hb ^ 1) << 2));
            }
        }
    }
}

static void dequant_k45(const uint8_t *p, float *out, int64_t nb, int five) {
    const int64_t bb = five ? 176 : 144;
    for (int64_t b = 0; b < nb; b++, p += bb, out += QK) {
        float d = lt_quant_half(p), dmin = lt_quant_half(p + 2);
        const uint8_t *sc = p + 4, *qh = p + 16, *qs = p + (five ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            int s, m;
            lt_k4_scale_min(sc, j, &s, &m);
            float dl = d * (float)s, ml = dmin * (float)m;
            const uint8_t *q = qs + (j / 2) * 32;
            int shift = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                int v = (q[l] >> shift) & 0xf;
                if (five) v |= ((qh[l] >> j) & 1) << 4;
                out[j * 32 + l] = scaled_minus(dl, (float)v, ml);
            }
        }
    }
}

void lt_dequant_q4_k_scalar(const uint8_t *p, float *out, int64_t nb) { dequant_k45(p, out, nb, 0); }
void lt_dequant_q5_k_scalar(const uint8_t *p, float *out, int64_t nb) { dequant_k45(p, out, nb, 1); }

void lt_dequant_q6_k_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 210, out += QK) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = lt_quant_half(p + 208);
        for (int e = 0; e < QK; e++) {
            int h = e / 128, r = e % 128;
            int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0xf;
            int hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
            float dl = d * (float)sc[e / 16];
            out[e] = dl * (float)((lo | (hi << 4)) - 32);
        }
    }
}

void lt_dequant_iq4_xs_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 136, out += QK) {
        float d = lt_quant_half(p);
        const uint8_t *qs = p + 8;
        for (int k = 0; k < 8; k++) {
            float dl = d * (float)lt_iq4_xs_scale(p, k);
            for (int i = 0; i < 32; i++) {
                int q = (qs[k * 16 + i % 16] >> (4 * (i / 16))) & 0xf;
                out[k * 32 + i] = dl * (float)lt_iq4_values[q];
            }
        }
    }
}

/* ---- quantizers ----------------------------------------------------------------------------- */

#define GROUP_EPS 1e-15f

/* The element of x[0..n) largest in magnitude (the first of equals; 0 when every one is 0), and
 * that magnitude in *amax: the symmetric grids run through it, the super-scales divide by it. */
static float signed_max(const float *x, int n, float *amax) {
    float a = 0, mx = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > a) {
            a = fabsf(x[i]);
            mx = x[i];
        }
    *amax = a;
    return mx;
}

/* The final levels of an affine sub-block once its scale dl and min ml are the stored (rounded)
 * ones: L = round((x + ml) / dl) in [0, nmax]. A zero scale keeps the searched levels. */
static void requant_affine(const float *x, int n, float dl, float ml, int nmax, uint8_t *L) {
    if (dl == 0.0f) return;
    for (int l = 0; l < n; l++) L[l] = (uint8_t)clampi(lt_quant_round((x[l] + ml) / dl), 0, nmax);
}

/* The same for a symmetric sub-block: L = round(x / dl) in [-nmax, nmax-1], stored plus nmax. */
static void requant_symmetric(const float *x, int n, float dl, int nmax, int8_t *L) {
    if (dl == 0.0f) return;
    for (int l = 0; l < n; l++) L[l] = (int8_t)(clampi(lt_quant_round(x[l] / dl), -nmax, nmax - 1) + nmax);
}

float lt_kquant_affine_lo(const float *x, int n) {
    float lo = x[0];
    for (int i = 1; i < n; i++) lo = fminf(lo, x[i]);
    return lo > 0 ? 0.0f : lo;
}

/* An affine grid x ≈ scale*L - mn, L in [0, nmax], for n weights with importance w: the min is
 * pinned at or below zero; the grid spanning [min, max] is refined by trying nstep+1 widened or
 * narrowed grids (nmax + rmin + rdelta*i levels over the range) and taking each one's weighted
 * least-squares scale and min. use_mad weighs absolute instead of squared errors. Returns the
 * scale; *mn gets the (non-negative) offset. */
static float affine_search(int n, int nmax, const float *x, const float *w, uint8_t *L, float *mn, float rmin,
                           float rdelta, int nstep, int use_mad) {
    float lo = lt_kquant_affine_lo(x, n), hi = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        hi = fmaxf(hi, x[i]);
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *mn = -lo;
        return 0.0f;
    }
    float inv = (float)nmax / (hi - lo), scale = 1.0f / inv, best = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(lt_quant_round(inv * (x[i] - lo)), 0, nmax);
        float diff = scale * (float)L[i] + lo - x[i];
        best += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    uint8_t cand[32];
    for (int s = 0; s <= nstep; s++) {
        inv = (rmin + rdelta * (float)s + (float)nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(lt_quant_round(inv * (x[i] - lo)), 0, nmax);
            cand[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)l * (float)l;
            sxl += w[i] * (float)l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (det <= 0) continue;
        float cs = (sw * sxl - sx * sl) / det, cm = (sl2 * sx - sl * sxl) / det;
        if (cm > 0) {
            cm = 0;
            cs = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = cs * (float)cand[i] + cm - x[i];
            err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
        }
        if (err < best) {
            memcpy(L, cand, (size_t)n);
            best = err;
            scale = cs;
            lo = cm;
        }
    }
    *mn = -lo;
    return scale;
}

/* A symmetric grid x ≈ scale*(L - nmax), L - nmax in [-nmax, nmax-1], weighted by x² (ggml's
 * rmse_type 1): the grid through the signed largest weight, then 18 nearby grids, keeping the one
 * whose least-squares scale explains the most of the weighted energy. Returns the scale. */
static float symmetric_search(int n, int nmax, const float *x, int8_t *L) {
    float amax, mx = signed_max(x, n, &amax);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float scale = 0, best = 0;
    for (int s = 0; s <= 18; s++) {
        int is = s == 0 ? 0 : (s <= 9 ? s - 10 : s - 9); /* 0, then -9..-1, 1..9 */
        float inv = -((float)nmax + 0.1f * (float)is) / mx;
        float sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(lt_quant_round(inv * x[i]), -nmax, nmax - 1);
            float w = x[i] * x[i];
            sxl += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
        }
        if (s == 0 || (sl2 > 0 && sxl * sxl > best * sl2)) {
            for (int i = 0; i < n; i++) L[i] = (int8_t)(clampi(lt_quant_round(inv * x[i]), -nmax, nmax - 1) + nmax);
            scale = sl2 > 0 ? sxl / sl2 : 0.0f;
            best = scale * sxl;
        }
    }
    return scale;
}

/* Q3_K's symmetric grid (nmax 4): the grid through the signed largest weight, then up to five
 * passes moving single levels while that raises the x²-weighted fit. L gets level + nmax. */
static float q3_search(int n, int nmax, const float *x, int8_t *L) {
    float amax, mx = signed_max(x, n, &amax);
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float inv = -(float)nmax / mx, sxl = 0, sl2 = 0;
    for (int i = 0; i < n; i++) {
        int l = clampi(lt_quant_round(inv * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sxl += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    for (int pass = 0; pass < 5; pass++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sxl - w * x[i] * (float)L[i];
            if (slx <= 0) continue;
            float sl2b = sl2 - w * (float)L[i] * (float)L[i];
            int nl = clampi(lt_quant_round(x[i] * sl2b / slx), -nmax, nmax - 1);
            if (nl == L[i]) continue;
            slx += w * x[i] * (float)nl;
            sl2b += w * (float)nl * (float)nl;
            if (sl2b > 0 && slx * slx * sl2 > sxl * sxl * sl2b) {
                L[i] = (int8_t)nl;
                sxl = slx;
                sl2 = sl2b;
                changed++;
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return sl2 > 0 ? sxl / sl2 : 0.0f;
}

static void affine_scalar(const float *x, const float *w, int nsub, int n, int nmax, float rmin, float rdelta,
                          int nstep, int use_mad, uint8_t *L, float *scales, float *mins) {
    for (int j = 0; j < nsub; j++)
        scales[j] = affine_search(n, nmax, x + n * j, w + n * j, L + n * j, &mins[j], rmin, rdelta, nstep, use_mad);
}

static void symmetric_scalar(const float *x, int nsub, int n, int nmax, int8_t *L, float *scales) {
    for (int j = 0; j < nsub; j++) scales[j] = symmetric_search(n, nmax, x + n * j, L + n * j);
}

static void q3_scalar(const float *x, int nsub, int n, int nmax, int8_t *L, float *scales) {
    for (int j = 0; j < nsub; j++) scales[j] = q3_search(n, nmax, x + n * j, L + n * j);
}

const lt_kquant_search lt_kquant_search_scalar = {affine_scalar, symmetric_scalar, q3_scalar, requant_affine,
                                                  requant_symmetric};

/* Packs 2-bit levels: byte h*32+l holds elements h*128 + 32*j + l at bits 2j (Q2_K, Q3_K). */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *e = L + h * 128 + l;
            qs[h * 32 + l] = (uint8_t)(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
        }
}

static void quant_q2_k(const lt_kquant_search *S, const float *x, uint8_t *p, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += QK, p += 84) {
        uint8_t L[QK];
        float scales[16], mins[16], w[QK], max_scale = 0, max_min = 0;
        for (int l = 0; l < QK; l++) w[l] = fabsf(x[l]);
        S->affine(x, w, 16, 16, 3, -0.5f, 0.1f, 15, 1, L, scales, mins);
        for (int j = 0; j < 16; j++) {
            max_scale = fmaxf(max_scale, scales[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        uint8_t *sc = p;
        memset(sc, 0, 16);
        float is = max_scale > 0 ? 15.0f / max_scale : 0.0f, im = max_min > 0 ? 15.0f / max_min : 0.0f;
        for (int j = 0; j < 16; j++)
            sc[j] = (uint8_t)(clampi(lt_quant_round(is * scales[j]), 0, 15) |
                              (clampi(lt_quant_round(im * mins[j]), 0, 15) << 4));
        lt_quant_put_half(p + 80, max_scale > 0 ? max_scale / 15.0f : 0.0f);
        lt_quant_put_half(p + 82, max_min > 0 ? max_min / 15.0f : 0.0f);
        float d = lt_quant_half(p + 80), dmin = lt_quant_half(p + 82);
        for (int j = 0; j < 16; j++) {
            int s, m;
            lt_q2_scale_min(sc, j, &s, &m);
            S->requant_affine(x + 16 * j, 16, d * (float)s, dmin * (float)m, 3, L + 16 * j);
        }
        pack_2bit(L, p + 16);
    }
}

static void quant_q3_k(const lt_kquant_search *S, const float *x, uint8_t *p, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += QK, p += 110) {
        int8_t L[QK];
        float scales[16], amax;
        S->q3(x, 16, 16, 4, L, scales);
        const float max_scale = signed_max(scales, 16, &amax);
        uint8_t *hm = p, *qs = p + 32, *sc = p + 96;
        memset(sc, 0, 12);
        if (max_scale != 0.0f) {
            float inv = -32.0f / max_scale;
            for (int j = 0; j < 16; j++) {
                int l = clampi(lt_quant_round(inv * scales[j]), -32, 31) + 32;
                if (j < 8) sc[j] = (uint8_t)(l & 0xf);
                else sc[j - 8] |= (uint8_t)((l & 0xf) << 4);
                sc[8 + j % 4] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            lt_quant_put_half(p + 108, 1.0f / inv);
        } else {
            lt_quant_put_half(p + 108, 0.0f);
        }
        float d = lt_quant_half(p + 108);
        for (int j = 0; j < 16; j++) S->requant_symmetric(x + 16 * j, 16, d * (float)lt_q3_scale(sc, j), 4, L + 16 * j);
        /* The third bit of element e goes to hmask[e % 32] bit e / 32; the low two bits pack as Q2_K. */
        memset(hm, 0, 32);
        uint8_t low[QK];
        for (int e = 0; e < QK; e++) { /* L in [0, 7]: bit 2 is the third bit, without a branch */
            const int l = L[e];
            hm[e % 32] |= (uint8_t)((l >> 2) << (e / 32));
            low[e] = (uint8_t)(l & 3);
        }
        pack_2bit(low, qs);
    }
}

/* Q4_K (nmax 15) and Q5_K (nmax 31): eight 32-weight sub-blocks, each an affine grid weighted by
 * rms(x) + |x|, their scales and mins quantized to 6 bits against f16 d and dmin. */
static void quant_k45(const lt_kquant_search *S, const float *x, uint8_t *p, int64_t nb, int five) {
    const int nmax = five ? 31 : 15, nstep = five ? 15 : 20;
    const float rmin = five ? -0.5f : -1.0f;
    /* the searches take two super-blocks at a time (sixteen independent sub-blocks) */
    uint8_t L2[2 * QK];
    float scales2[16], mins2[16], w[2 * QK];
    for (int64_t b = 0; b < nb; b++, x += QK, p += five ? 176 : 144) {
        if (b % 2 == 0) {
            const int nsub = b + 1 < nb ? 16 : 8;
            for (int j = 0; j < nsub; j++) {
                const float *xs = x + 32 * j;
                float s2 = 0;
                for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
                float av = sqrtf(s2 / 32.0f);
                for (int l = 0; l < 32; l++) w[32 * j + l] = av + fabsf(xs[l]);
            }
            S->affine(x, w, nsub, 32, nmax, rmin, 0.1f, nstep, 0, L2, scales2, mins2);
        }
        uint8_t *L = L2 + (b % 2) * QK;
        const float *scales = scales2 + (b % 2) * 8, *mins = mins2 + (b % 2) * 8;
        float max_scale = 0, max_min = 0;
        for (int j = 0; j < 8; j++) {
            max_scale = fmaxf(max_scale, scales[j]);
            max_min = fmaxf(max_min, mins[j]);
        }
        uint8_t *sc = p + 4;
        memset(sc, 0, 12);
        float is = max_scale > 0 ? 63.0f / max_scale : 0.0f, im = max_min > 0 ? 63.0f / max_min : 0.0f;
        for (int j = 0; j < 8; j++) {
            int ls = clampi(lt_quant_round(is * scales[j]), 0, 63), lm = clampi(lt_quant_round(im * mins[j]), 0, 63);
            if (j < 4) {
                sc[j] = (uint8_t)ls;
                sc[j + 4] = (uint8_t)lm;
            } else {
                sc[j + 4] = (uint8_t)((ls & 0xf) | ((lm & 0xf) << 4));
                sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
                sc[j] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        lt_quant_put_half(p, max_scale / 63.0f);
        lt_quant_put_half(p + 2, max_min / 63.0f);
        float d = lt_quant_half(p), dmin = lt_quant_half(p + 2);
        for (int j = 0; j < 8; j++) {
            int s, m;
            lt_k4_scale_min(sc, j, &s, &m);
            S->requant_affine(x + 32 * j, 32, d * (float)s, dmin * (float)m, nmax, L + 32 * j);
        }
        uint8_t *qh = p + 16, *qs = p + (five ? 48 : 16);
        if (five) memset(qh, 0, 32);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int a = L[64 * g + l], c = L[64 * g + 32 + l];
                if (five) {
                    qh[l] |= (uint8_t)(((a >> 4) << (2 * g)) | ((c >> 4) << (2 * g + 1)));
                    a &= 0xf;
                    c &= 0xf;
                }
                qs[32 * g + l] = (uint8_t)(a | (c << 4));
            }
    }
}

static void quant_q6_k(const lt_kquant_search *S, const float *x, uint8_t *p, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, x += QK, p += 210) {
        int8_t L[QK];
        float scales[16], amax;
        S->symmetric(x, 16, 16, 32, L, scales);
        const float max_scale = signed_max(scales, 16, &amax);
        memset(p, 0, 210);
        if (amax < GROUP_EPS) continue; /* an all-zero super-block: d = 0 */
        float inv = -128.0f / max_scale;
        int8_t *sc = (int8_t *)(p + 192);
        for (int j = 0; j < 16; j++) sc[j] = (int8_t)clampi(lt_quant_round(inv * scales[j]), -128, 127);
        lt_quant_put_half(p + 208, 1.0f / inv);
        float d = lt_quant_half(p + 208);
        for (int j = 0; j < 16; j++) S->requant_symmetric(x + 16 * j, 16, d * (float)sc[j], 32, L + 16 * j);
        uint8_t *ql = p, *qh = p + 128;
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const int8_t *e = L + 128 * h + l;
                ql[64 * h + l] = (uint8_t)((e[0] & 0xf) | ((e[64] & 0xf) << 4));
                ql[64 * h + 32 + l] = (uint8_t)((e[32] & 0xf) | ((e[96] & 0xf) << 4));
                qh[32 * h + l] =
                    (uint8_t)((e[0] >> 4) | ((e[32] >> 4) << 2) | ((e[64] >> 4) << 4) | ((e[96] >> 4) << 6));
            }
    }
}

static void quant_k(const lt_kquant_search *S, lt_dtype t, const float *x, uint8_t *p, int64_t nb) {
    switch (t) {
    case LT_DTYPE_Q2_K: quant_q2_k(S, x, p, nb); break;
    case LT_DTYPE_Q3_K: quant_q3_k(S, x, p, nb); break;
    case LT_DTYPE_Q4_K: quant_k45(S, x, p, nb, 0); break;
    case LT_DTYPE_Q5_K: quant_k45(S, x, p, nb, 1); break;
    case LT_DTYPE_Q6_K: quant_q6_k(S, x, p, nb); break;
    default: LT_ABORT("lt_quantize_k_isa: %s is not a K-quant", lt_dtype_name(t));
    }
}

void lt_quantize_k_isa(lt_cpu_isa isa, lt_dtype t, const float *x, uint8_t *p, int64_t n) {
    quant_k(lt_kquant_search_for(isa), t, x, p, n / QK);
}

void lt_quant_q2_k(const float *x, uint8_t *p, int64_t nb) {
    quant_q2_k(lt_kquant_search_for(lt_cpu_isa_active()), x, p, nb);
}
void lt_quant_q3_k(const float *x, uint8_t *p, int64_t nb) {
    quant_q3_k(lt_kquant_search_for(lt_cpu_isa_active()), x, p, nb);
}
void lt_quant_q4_k(const float *x, uint8_t *p, int64_t nb) {
    quant_k45(lt_kquant_search_for(lt_cpu_isa_active()), x, p, nb, 0);
}
void lt_quant_q5_k(const float *x, uint8_t *p, int64_t nb) {
    quant_k45(lt_kquant_search_for(lt_cpu_isa_active()), x, p, nb, 1);
}
void lt_quant_q6_k(const float *x, uint8_t *p, int64_t nb) {
    quant_q6_k(lt_kquant_search_for(lt_cpu_isa_active()), x, p, nb);
}
