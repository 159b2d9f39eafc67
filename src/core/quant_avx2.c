/* AVX2 dequantizers of every block format and the bf16/f16 widening, compiled for AVX2 + F16C by
 * function attribute whatever the build targets, and taken only where quant_isa.c found the CPU
 * has them. Levels are unpacked with byte-wise vector ops (32 bytes wide), then each group of 8
 * becomes d*q (+ m or - m) with one float multiply and one add or subtract: the scalar code's two
 * roundings (no FMA), on the scales the scalar code computes, so both paths give the same bits.
 * Not here: the scale fields, read by the scalar helpers of quant_internal.h. */
#include "core/quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2,f16c")))

enum { QK = 256 };

AVX2_FN static inline __m256 levels8(const int8_t *lev) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)lev)));
}

/* out[0..n) = dl*lev - ml, n a multiple of 8. */
AVX2_FN static inline void scale_minus(const int8_t *lev, float dl, float ml, float *out, int n) {
    const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, _mm256_sub_ps(_mm256_mul_ps(d, levels8(lev + i)), m));
}

/* out[0..n) = dl*lev + ml. */
AVX2_FN static inline void scale_plus(const int8_t *lev, float dl, float ml, float *out, int n) {
    const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(d, levels8(lev + i)), m));
}

/* out[0..n) = dl*lev. */
AVX2_FN static inline void scale(const int8_t *lev, float dl, float *out, int n) {
    const __m256 d = _mm256_set1_ps(dl);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(out + i, _mm256_mul_ps(d, levels8(lev + i)));
}

AVX2_FN static inline __m256i load32(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)(const void *)p); }
AVX2_FN static inline __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)(const void *)p); }
AVX2_FN static inline void store32(int8_t *p, __m256i v) { _mm256_storeu_si256((__m256i *)(void *)p, v); }
AVX2_FN static inline void store16(int8_t *p, __m128i v) { _mm_storeu_si128((__m128i *)(void *)p, v); }

/* The low and high nibbles of 16 bytes. */
AVX2_FN static inline __m128i lo_nib(__m128i q) { return _mm_and_si128(q, _mm_set1_epi8(0x0f)); }
AVX2_FN static inline __m128i hi_nib(__m128i q) { return _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0f)); }

/* ---- 32-weight blocks ---- */

AVX2_FN static void q8_0(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 34, out += 32) {
        const __m256 d = _mm256_set1_ps(lt_quant_half(p));
        for (int i = 0; i < 32; i += 8) {
            __m256 x = levels8((const int8_t *)(p + 2 + i));
            _mm256_storeu_ps(out + i, _mm256_mul_ps(x, d));
        }
    }
}

/* Q4_0 (levels nibble - 8, times d), Q4_1 (nibble times d, plus m) and IQ4_NL (the table value a
 * nibble indexes, times d): 16 bytes of nibbles after the scales. */
enum { NIB_Q4_0, NIB_Q4_1, NIB_IQ4_NL };

AVX2_FN static inline void nibble_block(const uint8_t *p, float *out, int kind) {
    const __m128i table = load16((const uint8_t *)lt_iq4_values);
    int8_t lev[32];
    __m128i q = load16(p + (kind == NIB_Q4_1 ? 4 : 2)), lo = lo_nib(q), hi = hi_nib(q);
    if (kind == NIB_Q4_0) {
        lo = _mm_sub_epi8(lo, _mm_set1_epi8(8));
        hi = _mm_sub_epi8(hi, _mm_set1_epi8(8));
    } else if (kind == NIB_IQ4_NL) {
        lo = _mm_shuffle_epi8(table, lo);
        hi = _mm_shuffle_epi8(table, hi);
    }
    store16(lev, lo);
    store16(lev + 16, hi);
    const float d = lt_quant_half(p);
    if (kind == NIB_Q4_1) scale_plus(lev, d, lt_quant_half(p + 2), out, 32);
    else scale(lev, d, out, 32);
}

AVX2_FN static void q4_0(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) nibble_block(p + 18 * b, out + 32 * b, NIB_Q4_0);
}
AVX2_FN static void q4_1(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) nibble_block(p + 20 * b, out + 32 * b, NIB_Q4_1);
}
AVX2_FN static void iq4_nl(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++) nibble_block(p + 18 * b, out + 32 * b, NIB_IQ4_NL);
}

/* 0xff in byte i where bit i of x is set. */
AVX2_FN static inline __m256i bit_bytes(uint32_t x) {
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* Q5_0 / Q5_1: the fifth bits from qh, 32 at a time. */
AVX2_FN static void dequant_q5(const uint8_t *p, float *out, int64_t nb, int has_min) {
    const int64_t bb = has_min ? 24 : 22;
    const __m256i sixteen = _mm256_set1_epi8(16);
    int8_t lev[32];
    for (int64_t b = 0; b < nb; b++, p += bb, out += 32) {
        float d = lt_quant_half(p), m = has_min ? lt_quant_half(p + 2) : 0.0f;
        const uint8_t *qhp = p + (has_min ? 4 : 2);
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        __m128i q = load16(qhp + 4);
        __m256i v = _mm256_set_m128i(hi_nib(q), lo_nib(q));
        v = _mm256_or_si256(v, _mm256_and_si256(bit_bytes(qh), sixteen));
        if (!has_min) v = _mm256_sub_epi8(v, sixteen);
        store32(lev, v);
        if (has_min) scale_plus(lev, d, m, out, 32);
        else scale(lev, d, out, 32);
    }
}

AVX2_FN static void q5_0(const uint8_t *p, float *out, int64_t nb) { dequant_q5(p, out, nb, 0); }
AVX2_FN static void q5_1(const uint8_t *p, float *out, int64_t nb) { dequant_q5(p, out, nb, 1); }

/* INT4_G64: 64 nibbles per block, weight 2i in the low nibble of byte i, 2i+1 in the high one;
 * x = q*scale + bias. */
AVX2_FN static void int4_g64(const uint8_t *p, float *out, int64_t nb) {
    int8_t lev[64];
    for (int64_t b = 0; b < nb; b++, p += 36, out += 64) {
        for (int c = 0; c < 2; c++) {
            __m128i q = load16(p + 4 + 16 * c), lo = lo_nib(q), hi = hi_nib(q);
            store16(lev + 32 * c, _mm_unpacklo_epi8(lo, hi));
            store16(lev + 32 * c + 16, _mm_unpackhi_epi8(lo, hi));
        }
        const __m256 s = _mm256_set1_ps(lt_quant_half(p)), bias = _mm256_set1_ps(lt_quant_half(p + 2));
        for (int i = 0; i < 64; i += 8)
            _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_mul_ps(levels8(lev + i), s), bias));
    }
}

/* ---- bf16 and f16 ---- */

AVX2_FN static void bf16(const uint8_t *p, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(p + 2 * i)), 16);
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(v));
    }
    lt_dequant_bf16_scalar(p + 2 * i, out + i, n - i);
}

/* F16C's conversion, except that a NaN keeps its payload unquieted as lt_f16_to_f32 keeps it. */
AVX2_FN static void f16(const uint8_t *p, float *out, int64_t n) {
    const __m256i mag = _mm256_set1_epi32(0x7fff), inf = _mm256_set1_epi32(0x7c00);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = load16(p + 2 * i);
        __m256i e = _mm256_cvtepu16_epi32(h), a = _mm256_and_si256(e, mag);
        __m256i nan = _mm256_cmpgt_epi32(a, inf);
        __m256i bits =
            _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_xor_si256(e, a), 16), _mm256_slli_epi32(a, 13)),
                            _mm256_set1_epi32(0x7f800000));
        __m256 f = _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_castsi256_ps(bits), _mm256_castsi256_ps(nan));
        _mm256_storeu_ps(out + i, f);
    }
    lt_dequant_f16_scalar(p + 2 * i, out + i, n - i);
}

/* ---- 256-weight super-blocks ---- */

AVX2_FN static void dequant_k45(const uint8_t *p, float *out, int64_t nb, int five) {
    const int64_t bb = five ? 176 : 144;
    const __m256i nib = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += bb, out += QK) {
        float d = lt_quant_half(p), dmin = lt_quant_half(p + 2);
        const uint8_t *sc = p + 4, *qs = p + (five ? 48 : 16);
        __m256i qh = five ? load32(p + 16) : _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            __m256i v = load32(qs + 32 * g);
            __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g + 1), one), 4));
            }
            store32(lev + 64 * g, lo);
            store32(lev + 64 * g + 32, hi);
        }
        for (int j = 0; j < 8; j++) {
            int s, m;
            lt_k4_scale_min(sc, j, &s, &m);
            scale_minus(lev + 32 * j, d * (float)s, dmin * (float)m, out + 32 * j, 32);
        }
    }
}

AVX2_FN static void q4_k(const uint8_t *p, float *out, int64_t nb) { dequant_k45(p, out, nb, 0); }
AVX2_FN static void q5_k(const uint8_t *p, float *out, int64_t nb) { dequant_k45(p, out, nb, 1); }

AVX2_FN static void q6_k(const uint8_t *p, float *out, int64_t nb) {
    const __m256i nib = _mm256_set1_epi8(0x0f), three = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 210, out += QK) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = lt_quant_half(p + 208);
        for (int h = 0; h < 2; h++) {
            __m256i a = load32(p + 64 * h), c = load32(p + 64 * h + 32), qh = load32(p + 128 + 32 * h);
            __m256i lo4[4] = {_mm256_and_si256(a, nib), _mm256_and_si256(c, nib),
                              _mm256_and_si256(_mm256_srli_epi16(a, 4), nib),
                              _mm256_and_si256(_mm256_srli_epi16(c, 4), nib)};
            for (int j = 0; j < 4; j++) {
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), three);
                store32(lev + 128 * h + 32 * j,
                        _mm256_sub_epi8(_mm256_or_si256(lo4[j], _mm256_slli_epi16(hi, 4)), off));
            }
        }
        for (int k = 0; k < 16; k++) scale(lev + 16 * k, d * (float)sc[k], out + 16 * k, 16);
    }
}

AVX2_FN static void q2_k(const uint8_t *p, float *out, int64_t nb) {
    const __m256i three = _mm256_set1_epi8(3);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 84, out += QK) {
        const uint8_t *sc = p;
        float d = lt_quant_half(p + 80), dmin = lt_quant_half(p + 82);
        for (int h = 0; h < 2; h++) {
            __m256i q = load32(p + 16 + 32 * h);
            for (int j = 0; j < 4; j++)
                store32(lev + 128 * h + 32 * j, _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three));
        }
        for (int k = 0; k < 16; k++) {
            int s, m;
            lt_q2_scale_min(sc, k, &s, &m);
            scale_minus(lev + 16 * k, d * (float)s, dmin * (float)m, out + 16 * k, 16);
        }
    }
}

AVX2_FN static void q3_k(const uint8_t *p, float *out, int64_t nb) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 110, out += QK) {
        const uint8_t *sc = p + 96;
        float d = lt_quant_half(p + 108);
        __m256i hm = load32(p);
        for (int h = 0; h < 2; h++) {
            __m256i q = load32(p + 32 + 32 * h);
            for (int j = 0; j < 4; j++) {
                __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), three);
                __m256i hb = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + j), one);
                /* lo - 4 * (1 - hb) */
                store32(lev + 128 * h + 32 * j, _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), four));
            }
        }
        for (int k = 0; k < 16; k++) scale(lev + 16 * k, d * (float)lt_q3_scale(sc, k), out + 16 * k, 16);
    }
}

AVX2_FN static void iq4_xs(const uint8_t *p, float *out, int64_t nb) {
    const __m128i table = load16((const uint8_t *)lt_iq4_values);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 136, out += QK) {
        float d = lt_quant_half(p);
        for (int k = 0; k < 8; k++) {
            __m128i q = load16(p + 8 + 16 * k);
            store16(lev + 32 * k, _mm_shuffle_epi8(table, lo_nib(q)));
            store16(lev + 32 * k + 16, _mm_shuffle_epi8(table, hi_nib(q)));
        }
        for (int k = 0; k < 8; k++) scale(lev + 32 * k, d * (float)lt_iq4_xs_scale(p, k), out + 32 * k, 32);
    }
}

static const lt_dequant_fn avx2_table[LT_DTYPE_COUNT_] = {
    [LT_DTYPE_BF16] = bf16, [LT_DTYPE_F16] = f16,       [LT_DTYPE_Q8_0] = q8_0,         [LT_DTYPE_Q4_0] = q4_0,
    [LT_DTYPE_Q4_1] = q4_1, [LT_DTYPE_Q5_0] = q5_0,     [LT_DTYPE_Q5_1] = q5_1,         [LT_DTYPE_IQ4_NL] = iq4_nl,
    [LT_DTYPE_Q2_K] = q2_k, [LT_DTYPE_Q3_K] = q3_k,     [LT_DTYPE_Q4_K] = q4_k,         [LT_DTYPE_Q5_K] = q5_k,
    [LT_DTYPE_Q6_K] = q6_k, [LT_DTYPE_IQ4_XS] = iq4_xs, [LT_DTYPE_INT4_G64] = int4_g64,
};

const lt_dequant_fn *lt_dequant_avx2_table(void) { return avx2_table; }
#else
const lt_dequant_fn *lt_dequant_avx2_table(void) { return NULL; }
#endif
