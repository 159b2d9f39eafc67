/* The reference (de)quantizers of the 32-weight block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL, and longtune's INT4_G64), the bf16/f16 widening, and the two dispatchers over every
 * dtype. Dequantization is bit-for-bit gguf-py's (gguf.quants.dequantize): the same float32
 * operations in the same order, never contracted into FMAs; the GGUF quantizers follow ggml's
 * reference quantizers (quantize_row_*_ref), which gguf-py reproduces for these types. The
 * K-quants are in quant_k.c; the AVX2 and AVX-512 dequantizers (same bits) in quant_avx2.c and
 * quant_avx512.c, which lt_dequantize_row takes as quant_isa.c chose at its first call. */
#include <math.h>
#include <string.h>

#include "core/quant_internal.h"
#include "longtune/tensor.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

const int8_t lt_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* y = d*q + m as two rounded float32 operations (numpy's order). */
static float affine(float d, float q, float m) {
    float t = d * q;
    return t + m;
}

void lt_dequant_q8_0_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 34, out += 32) {
        float d = lt_quant_half(p);
        for (int j = 0; j < 32; j++) out[j] = (float)(int8_t)p[2 + j] * d;
    }
}

void lt_dequant_q4_0_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 18, out += 32) {
        float d = lt_quant_half(p);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)((p[2 + j] & 0xf) - 8);
            out[j + 16] = d * (float)((p[2 + j] >> 4) - 8);
        }
    }
}

void lt_dequant_q4_1_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 20, out += 32) {
        float d = lt_quant_half(p), m = lt_quant_half(p + 2);
        for (int j = 0; j < 16; j++) {
            out[j] = affine(d, (float)(p[4 + j] & 0xf), m);
            out[j + 16] = affine(d, (float)(p[4 + j] >> 4), m);
        }
    }
}

static void dequant_q5_scalar(const uint8_t *p, float *out, int64_t nb, int has_min) {
    const int64_t bb = has_min ? 24 : 22;
    for (int64_t b = 0; b < nb; b++, p += bb, out += 32) {
        float d = lt_quant_half(p), m = has_min ? lt_quant_half(p + 2) : 0.0f;
        const uint8_t *qhp = p + (has_min ? 4 : 2), *qs = qhp + 4;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        for (int j = 0; j < 16; j++) {
            int lo = (qs[j] & 0xf) | (int)(((qh >> j) & 1u) << 4);
            int hi = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            if (has_min) {
                out[j] = affine(d, (float)lo, m);
                out[j + 16] = affine(d, (float)hi, m);
            } else {
                out[j] = d * (float)(lo - 16);
                out[j + 16] = d * (float)(hi - 16);
            }
        }
    }
}

void lt_dequant_q5_0_scalar(const uint8_t *p, float *out, int64_t nb) { dequant_q5_scalar(p, out, nb, 0); }
void lt_dequant_q5_1_scalar(const uint8_t *p, float *out, int64_t nb) { dequant_q5_scalar(p, out, nb, 1); }

void lt_dequant_iq4_nl_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 18, out += 32) {
        float d = lt_quant_half(p);
        for (int j = 0; j < 16; j++) {
            out[j] = d * (float)lt_iq4_values[p[2 + j] & 0xf];
            out[j + 16] = d * (float)lt_iq4_values[p[2 + j] >> 4];
        }
    }
}

void lt_dequant_int4_g64_scalar(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 36, out += 64) {
        float s = lt_quant_half(p), bias = lt_quant_half(p + 2);
        for (int w = 0; w < 8; w++) {
            uint32_t q;
            memcpy(&q, p + 4 + 4 * w, 4);
            for (int j = 0; j < 8; j++) out[w * 8 + j] = affine((float)((q >> (4 * j)) & 0xfu), s, bias);
        }
    }
}

void lt_dequant_bf16_scalar(const uint8_t *p, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        out[i] = lt_bf16_to_f32(h);
    }
}

void lt_dequant_f16_scalar(const uint8_t *p, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = lt_quant_half(p + 2 * i);
}

static void dequantize_with(const lt_dequant_fn *table, lt_dtype t, const void *row, float *out, int64_t n) {
    if (t == LT_DTYPE_F32) {
        memcpy(out, row, (size_t)n * 4);
        return;
    }
    lt_dequant_fn fn = (unsigned)t < LT_DTYPE_COUNT_ ? table[t] : NULL;
    if (!fn) LT_ABORT("lt_dequantize_row: dtype %s has no float form", lt_dtype_name(t));
    fn(row, out, n / lt_dtype_block_elems(t));
}

void lt_dequantize_row_isa(lt_cpu_isa isa, lt_dtype t, const void *row, float *out, int64_t n) {
    const lt_dequant_fn *table = isa == LT_CPU_ISA_AVX512 ? lt_dequant_avx512_table()
        : isa == LT_CPU_ISA_AVX2                          ? lt_dequant_avx2_table()
                                                          : lt_dequant_scalar;
    if (!table || !lt_cpu_isa_available(isa, NULL))
        LT_ABORT("lt_dequantize_row: the %s path is not available here", lt_cpu_isa_name(isa));
    dequantize_with(table, t, row, out, n);
}

void lt_dequantize_row(lt_dtype t, const void *row, float *out, int64_t n) {
    const lt_cpu_isa isa = lt_cpu_isa_active();
    const lt_dequant_fn *table = isa == LT_CPU_ISA_AVX512 ? lt_dequant_avx512_table()
        : isa == LT_CPU_ISA_AVX2                          ? lt_dequant_avx2_table()
                                                          : lt_dequant_scalar;
    dequantize_with(table, t, row, out, n);
}

static void minmax(const float *x, int n, float *lo, float *hi) {
    *lo = x[0];
    *hi = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < *lo) *lo = x[i];
        if (x[i] > *hi) *hi = x[i];
    }
}

/* The weight of largest magnitude, signed (the first of equals). */
static float signed_absmax(const float *x, int n) {
    float amax = 0, mx = 0;
    for (int j = 0; j < n; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    return mx;
}

/* ggml's truncating level: (int)(v + offset), clamped to [0, top]. */
static int trunc_level(float v, float offset, int top) {
    float s = v + offset;
    int l = s > 0.0f ? (int)s : 0;
    return l > top ? top : l;
}

static uint8_t clamp_nibble(float v) {
    long r = lrintf(v);
    return (uint8_t)(r < 0 ? 0 : r > 15 ? 15 : r);
}

/* Q5_0 (symmetric, d = signed max / -16) and Q5_1 (d = range / 31, offset min): ggml's
 * quantize_row_q5_{0,1}_ref. The scale's reciprocal is taken before the scale's f16 rounding. */
static void quant_q5(const float *in, uint8_t *p, int64_t nb, int has_min) {
    for (int64_t b = 0; b < nb; b++, in += 32) {
        float d, m = 0;
        if (has_min) {
            float lo, hi;
            minmax(in, 32, &lo, &hi);
            d = (hi - lo) / 31.0f;
            m = lo;
        } else {
            d = signed_absmax(in, 32) / -16.0f;
        }
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        lt_quant_put_half(p, d);
        if (has_min) lt_quant_put_half(p + 2, m);
        uint8_t *qhp = p + (has_min ? 4 : 2), *qs = qhp + 4;
        uint32_t qh = 0;
        for (int j = 0; j < 16; j++) {
            int lo = has_min ? trunc_level((in[j] - m) * id, 0.5f, 31) : trunc_level(in[j] * id, 16.5f, 31);
            int hi = has_min ? trunc_level((in[j + 16] - m) * id, 0.5f, 31) : trunc_level(in[j + 16] * id, 16.5f, 31);
            qs[j] = (uint8_t)((lo & 0xf) | ((hi & 0xf) << 4));
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + 16);
        }
        memcpy(qhp, &qh, 4);
        p += has_min ? 24 : 22;
    }
}

int lt_quantize_has_encoder(lt_dtype t) {
    switch (t) { /* the cases of lt_quantize_row below */
    case LT_DTYPE_Q8_0:
    case LT_DTYPE_Q4_0:
    case LT_DTYPE_Q4_1:
    case LT_DTYPE_Q5_0:
    case LT_DTYPE_Q5_1:
    case LT_DTYPE_INT4_G64:
    case LT_DTYPE_Q2_K:
    case LT_DTYPE_Q3_K:
    case LT_DTYPE_Q4_K:
    case LT_DTYPE_Q5_K:
    case LT_DTYPE_Q6_K: return 1;
    default: return 0;
    }
}

void lt_quantize_row(lt_dtype t, const float *in, void *row, int64_t n) {
    uint8_t *p = row;
    int64_t nb = n / (lt_dtype_block_elems(t) > 0 ? lt_dtype_block_elems(t) : 1);
    switch (t) {
    case LT_DTYPE_Q8_0:
        for (int64_t b = 0; b < nb; b++, p += 34) {
            const float *x = in + b * 32;
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            lt_quant_put_half(p, d);
            for (int j = 0; j < 32; j++) {
                float q = roundf(x[j] * id); /* ties away from zero, as ggml */
                p[2 + j] = (uint8_t)(int8_t)(q < -127.0f ? -127 : q > 127.0f ? 127 : (int)q);
            }
        }
        break;
    case LT_DTYPE_Q4_0:
        for (int64_t b = 0; b < nb; b++, p += 18) {
            const float *x = in + b * 32;
            float d = signed_absmax(x, 32) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            lt_quant_put_half(p, d);
            for (int j = 0; j < 16; j++)
                p[2 + j] = (uint8_t)(trunc_level(x[j] * id, 8.5f, 15) | (trunc_level(x[j + 16] * id, 8.5f, 15) << 4));
        }
        break;
    case LT_DTYPE_Q4_1:
        for (int64_t b = 0; b < nb; b++, p += 20) {
            const float *x = in + b * 32;
            float lo, hi;
            minmax(x, 32, &lo, &hi);
            float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            lt_quant_put_half(p, d);
            lt_quant_put_half(p + 2, lo);
            for (int j = 0; j < 16; j++)
                p[4 + j] = (uint8_t)(trunc_level((x[j] - lo) * id, 0.5f, 15) |
                                     (trunc_level((x[j + 16] - lo) * id, 0.5f, 15) << 4));
        }
        break;
    case LT_DTYPE_Q5_0: quant_q5(in, p, nb, 0); break;
    case LT_DTYPE_Q5_1: quant_q5(in, p, nb, 1); break;
    case LT_DTYPE_Q2_K: lt_quant_q2_k(in, p, nb); break;
    case LT_DTYPE_Q3_K: lt_quant_q3_k(in, p, nb); break;
    case LT_DTYPE_Q4_K: lt_quant_q4_k(in, p, nb); break;
    case LT_DTYPE_Q5_K: lt_quant_q5_k(in, p, nb); break;
    case LT_DTYPE_Q6_K: lt_quant_q6_k(in, p, nb); break;
    case LT_DTYPE_INT4_G64:
        for (int64_t b = 0; b < nb; b++, p += 36) {
            const float *x = in + b * 64;
            float lo, hi;
            minmax(x, 64, &lo, &hi);
            uint16_t s16 = lt_f32_to_f16((hi - lo) / 15.0f), b16 = lt_f32_to_f16(lo);
            float s = lt_f16_to_f32(s16), bias = lt_f16_to_f32(b16), is = s != 0.0f ? 1.0f / s : 0.0f;
            memcpy(p, &s16, 2);
            memcpy(p + 2, &b16, 2);
            for (int w = 0; w < 8; w++) {
                uint32_t q = 0;
                for (int j = 0; j < 8; j++) q |= (uint32_t)clamp_nibble((x[w * 8 + j] - bias) * is) << (4 * j);
                memcpy(p + 4 + 4 * w, &q, 4);
            }
        }
        break;
    case LT_DTYPE_F32: memcpy(row, in, (size_t)n * 4); break;
    case LT_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)row)[i] = lt_f32_to_bf16(in[i]);
        break;
    case LT_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) ((uint16_t *)row)[i] = lt_f32_to_f16(in[i]);
        break;
    default: LT_ABORT("lt_quantize_row: dtype %s has no quantizer", lt_dtype_name(t));
    }
}
