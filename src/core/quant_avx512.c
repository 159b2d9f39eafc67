/* AVX-512 dequantizers of every block format and the bf16/f16 widening, compiled for avx512f/bw/vl
 * by function attribute whatever the build targets, and taken only where quant_isa.c found the
 * CPU has them. The super-blocks' levels are unpacked 64 bytes at a time; the 32-weight blocks
 * widen their bytes to 16 int32 lanes and unpack there (fifth bits by mask, IQ4 values by a
 * 16-entry permute); each 16 floats are then d*q (+ m or - m): one multiply and one add or
 * subtract, the scalar code's roundings (no FMA) on the scalar code's scales, so every path gives
 * the same bits. */
#include "core/quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX512_FN __attribute__((target("avx512f,avx512bw,avx512vl")))

enum { QK = 256 };

AVX512_FN static inline __m128i load16(const uint8_t *p) { return _mm_loadu_si128((const __m128i *)(const void *)p); }
AVX512_FN static inline __m256i load32(const uint8_t *p) {
    return _mm256_loadu_si256((const __m256i *)(const void *)p);
}
AVX512_FN static inline __m512i load64(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }
AVX512_FN static inline void store64(int8_t *p, __m512i v) { _mm512_storeu_si512((void *)p, v); }

/* 16 signed levels as floats. */
AVX512_FN static inline __m512 levels16(const int8_t *lev) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16((const uint8_t *)lev)));
}

/* out[0..n) = dl*lev - ml, n a multiple of 16. */
AVX512_FN static inline void scale_minus(const int8_t *lev, float dl, float ml, float *out, int n) {
    const __m512 d = _mm512_set1_ps(dl), m = _mm512_set1_ps(ml);
    for (int i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, _mm512_sub_ps(_mm512_mul_ps(d, levels16(lev + i)), m));
}

/* out[0..n) = dl*lev. */
AVX512_FN static inline void scale(const int8_t *lev, float dl, float *out, int n) {
    const __m512 d = _mm512_set1_ps(dl);
    for (int i = 0; i < n; i += 16) _mm512_storeu_ps(out + i, _mm512_mul_ps(d, levels16(lev + i)));
}

/* A 512-bit vector of 16-bit lanes: `lo` in the low 256 bits, `hi` in the high ones (per-half
 * shift counts). */
AVX512_FN static inline __m512i halves16(short lo, short hi) {
    return _mm512_inserti64x4(_mm512_set1_epi16(lo), _mm256_set1_epi16(hi), 1);
}

/* 32 bytes in both halves of a 512-bit vector. */
AVX512_FN static inline __m512i both_halves(const uint8_t *p) { return _mm512_broadcast_i64x4(load32(p)); }

/* ---- 32-weight blocks ---- */

AVX512_FN static void q8_0(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 34, out += 32) {
        const __m512 d = _mm512_set1_ps(lt_quant_half(p));
        _mm512_storeu_ps(out, _mm512_mul_ps(levels16((const int8_t *)(p + 2)), d));
        _mm512_storeu_ps(out + 16, _mm512_mul_ps(levels16((const int8_t *)(p + 18)), d));
    }
}

/* The low and high nibbles of 16 bytes, as int32 lanes. */
AVX512_FN static inline void nibbles16(const uint8_t *q, __m512i *lo, __m512i *hi) {
    __m512i e = _mm512_cvtepu8_epi32(load16(q));
    *lo = _mm512_and_si512(e, _mm512_set1_epi32(0xf));
    *hi = _mm512_srli_epi32(e, 4);
}

AVX512_FN static void q4_0(const uint8_t *p, float *out, int64_t nb) {
    const __m512i eight = _mm512_set1_epi32(8);
    for (int64_t b = 0; b < nb; b++, p += 18, out += 32) {
        const __m512 d = _mm512_set1_ps(lt_quant_half(p));
        __m512i lo, hi;
        nibbles16(p + 2, &lo, &hi);
        _mm512_storeu_ps(out, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, eight))));
        _mm512_storeu_ps(out + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, eight))));
    }
}

AVX512_FN static void q4_1(const uint8_t *p, float *out, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 20, out += 32) {
        const __m512 d = _mm512_set1_ps(lt_quant_half(p)), m = _mm512_set1_ps(lt_quant_half(p + 2));
        __m512i lo, hi;
        nibbles16(p + 4, &lo, &hi);
        _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)), m));
        _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)), m));
    }
}

/* Q5_0 / Q5_1: weight j's fifth bit is bit j of qh, set in its lane by mask. */
AVX512_FN static void dequant_q5(const uint8_t *p, float *out, int64_t nb, int has_min) {
    const int64_t bb = has_min ? 24 : 22;
    const __m512i sixteen = _mm512_set1_epi32(16);
    for (int64_t b = 0; b < nb; b++, p += bb, out += 32) {
        const __m512 d = _mm512_set1_ps(lt_quant_half(p)), m = _mm512_set1_ps(has_min ? lt_quant_half(p + 2) : 0.0f);
        const uint8_t *qhp = p + (has_min ? 4 : 2);
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        __m512i lo, hi;
        nibbles16(qhp + 4, &lo, &hi);
        lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xffffu), lo, sixteen);
        hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, sixteen);
        if (has_min) {
            _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)), m));
            _mm512_storeu_ps(out + 16, _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)), m));
        } else {
            _mm512_storeu_ps(out, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(lo, sixteen))));
            _mm512_storeu_ps(out + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(hi, sixteen))));
        }
    }
}

AVX512_FN static void q5_0(const uint8_t *p, float *out, int64_t nb) { dequant_q5(p, out, nb, 0); }
AVX512_FN static void q5_1(const uint8_t *p, float *out, int64_t nb) { dequant_q5(p, out, nb, 1); }

/* The IQ4 table as 16 floats (exact), for a 16-lane permute. */
AVX512_FN static inline __m512 iq4_table(void) { return levels16(lt_iq4_values); }

AVX512_FN static void iq4_nl(const uint8_t *p, float *out, int64_t nb) {
    const __m512 table = iq4_table();
    for (int64_t b = 0; b < nb; b++, p += 18, out += 32) {
        const __m512 d = _mm512_set1_ps(lt_quant_half(p));
        __m512i lo, hi;
        nibbles16(p + 2, &lo, &hi);
        _mm512_storeu_ps(out, _mm512_mul_ps(d, _mm512_permutexvar_ps(lo, table)));
        _mm512_storeu_ps(out + 16, _mm512_mul_ps(d, _mm512_permutexvar_ps(hi, table)));
    }
}

/* INT4_G64: weight 2i in the low nibble of byte i, 2i+1 in the high one; x = q*scale + bias. */
AVX512_FN static void int4_g64(const uint8_t *p, float *out, int64_t nb) {
    const __m512i first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i second = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    for (int64_t b = 0; b < nb; b++, p += 36, out += 64) {
        const __m512 s = _mm512_set1_ps(lt_quant_half(p)), bias = _mm512_set1_ps(lt_quant_half(p + 2));
        for (int c = 0; c < 2; c++) {
            __m512i lo, hi;
            nibbles16(p + 4 + 16 * c, &lo, &hi);
            __m512 a = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, first, hi));
            __m512 z = _mm512_cvtepi32_ps(_mm512_permutex2var_epi32(lo, second, hi));
            _mm512_storeu_ps(out + 32 * c, _mm512_add_ps(_mm512_mul_ps(a, s), bias));
            _mm512_storeu_ps(out + 32 * c + 16, _mm512_add_ps(_mm512_mul_ps(z, s), bias));
        }
    }
}

/* ---- bf16 and f16 ---- */

AVX512_FN static void bf16(const uint8_t *p, float *out, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_slli_epi32(_mm512_cvtepu16_epi32(load32(p + 2 * i)), 16);
        _mm512_storeu_ps(out + i, _mm512_castsi512_ps(v));
    }
    lt_dequant_bf16_scalar(p + 2 * i, out + i, n - i);
}

/* The hardware conversion, except that a NaN keeps its payload unquieted as lt_f16_to_f32 keeps it. */
AVX512_FN static void f16(const uint8_t *p, float *out, int64_t n) {
    const __m512i mag = _mm512_set1_epi32(0x7fff), inf = _mm512_set1_epi32(0x7c00);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = load32(p + 2 * i);
        __m512i e = _mm512_cvtepu16_epi32(h), a = _mm512_and_si512(e, mag);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(a, inf);
        __m512i bits =
            _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_xor_si512(e, a), 16), _mm512_slli_epi32(a, 13)),
                            _mm512_set1_epi32(0x7f800000));
        _mm512_storeu_ps(out + i, _mm512_mask_blend_ps(nan, _mm512_cvtph_ps(h), _mm512_castsi512_ps(bits)));
    }
    lt_dequant_f16_scalar(p + 2 * i, out + i, n - i);
}

/* ---- 256-weight super-blocks ---- */

AVX512_FN static void dequant_k45(const uint8_t *p, float *out, int64_t nb, int five) {
    const int64_t bb = five ? 176 : 144;
    const __m512i nib = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(16);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += bb, out += QK) {
        float d = lt_quant_half(p), dmin = lt_quant_half(p + 2);
        const uint8_t *sc = p + 4, *qs = p + (five ? 48 : 16);
        const __m512i qh = five ? both_halves(p + 16) : _mm512_setzero_si512();
        /* groups g and g+1 (32 bytes each): sub-block 2g takes the low nibbles, 2g+1 the high */
        for (int g = 0; g < 4; g += 2) {
            __m512i v = load64(qs + 32 * g);
            __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
            if (five) {
                const __m512i blo = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * g))),
                                                       _mm256_set1_epi8((char)(1 << (2 * g + 2))), 1);
                const __m512i bhi = _mm512_add_epi8(blo, blo);
                lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, blo), lo, sixteen);
                hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, bhi), hi, sixteen);
            }
            store64(lev + 64 * g, _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0)));
            store64(lev + 64 * g + 64, _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2)));
        }
        for (int j = 0; j < 8; j++) {
            int s, m;
            lt_k4_scale_min(sc, j, &s, &m);
            scale_minus(lev + 32 * j, d * (float)s, dmin * (float)m, out + 32 * j, 32);
        }
    }
}

AVX512_FN static void q4_k(const uint8_t *p, float *out, int64_t nb) { dequant_k45(p, out, nb, 0); }
AVX512_FN static void q5_k(const uint8_t *p, float *out, int64_t nb) { dequant_k45(p, out, nb, 1); }

AVX512_FN static void q6_k(const uint8_t *p, float *out, int64_t nb) {
    const __m512i nib = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3), off = _mm512_set1_epi8(32);
    const __m512i c01 = halves16(0, 2), c23 = halves16(4, 6);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 210, out += QK) {
        const int8_t *sc = (const int8_t *)(p + 192);
        float d = lt_quant_half(p + 208);
        for (int h = 0; h < 2; h++) {
            /* elements 128h + r: r < 64 the low nibbles of ql[64h + r], r >= 64 the high ones;
             * the top two bits from qh[32h + r % 32] at bit 2 * (r / 32) */
            __m512i a = load64(p + 64 * h), qh = both_halves(p + 128 + 32 * h);
            __m512i h01 = _mm512_and_si512(_mm512_srlv_epi16(qh, c01), three);
            __m512i h23 = _mm512_and_si512(_mm512_srlv_epi16(qh, c23), three);
            __m512i lo = _mm512_and_si512(a, nib), hi = _mm512_and_si512(_mm512_srli_epi16(a, 4), nib);
            store64(lev + 128 * h, _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi16(h01, 4)), off));
            store64(lev + 128 * h + 64, _mm512_sub_epi8(_mm512_or_si512(hi, _mm512_slli_epi16(h23, 4)), off));
        }
        for (int k = 0; k < 16; k++) scale(lev + 16 * k, d * (float)sc[k], out + 16 * k, 16);
    }
}

AVX512_FN static void q2_k(const uint8_t *p, float *out, int64_t nb) {
    const __m512i three = _mm512_set1_epi8(3), c01 = halves16(0, 2), c23 = halves16(4, 6);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 84, out += QK) {
        const uint8_t *sc = p;
        float d = lt_quant_half(p + 80), dmin = lt_quant_half(p + 82);
        for (int h = 0; h < 2; h++) {
            /* element 128h + 32j + l is bits 2j of qs[32h + l] */
            __m512i q = both_halves(p + 16 + 32 * h);
            store64(lev + 128 * h, _mm512_and_si512(_mm512_srlv_epi16(q, c01), three));
            store64(lev + 128 * h + 64, _mm512_and_si512(_mm512_srlv_epi16(q, c23), three));
        }
        for (int k = 0; k < 16; k++) {
            int s, m;
            lt_q2_scale_min(sc, k, &s, &m);
            scale_minus(lev + 16 * k, d * (float)s, dmin * (float)m, out + 16 * k, 16);
        }
    }
}

AVX512_FN static void q3_k(const uint8_t *p, float *out, int64_t nb) {
    const __m512i three = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1), four = _mm512_set1_epi8(4);
    int8_t lev[QK];
    for (int64_t b = 0; b < nb; b++, p += 110, out += QK) {
        const uint8_t *sc = p + 96;
        float d = lt_quant_half(p + 108);
        const __m512i hm = both_halves(p);
        for (int h = 0; h < 2; h++) {
            __m512i q = both_halves(p + 32 + 32 * h);
            for (int j = 0; j < 4; j += 2) {
                /* element 128h + 32j + l: bits 2j of qs[32h + l], third bit hmask[l] bit 4h + j */
                __m512i lo =
                    _mm512_and_si512(_mm512_srlv_epi16(q, halves16((short)(2 * j), (short)(2 * j + 2))), three);
                __m512i hb =
                    _mm512_and_si512(_mm512_srlv_epi16(hm, halves16((short)(4 * h + j), (short)(4 * h + j + 1))), one);
                /* lo - 4 * (1 - hb) */
                store64(lev + 128 * h + 32 * j, _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi16(hb, 2)), four));
            }
        }
        for (int k = 0; k < 16; k++) scale(lev + 16 * k, d * (float)lt_q3_scale(sc, k), out + 16 * k, 16);
    }
}

AVX512_FN static void iq4_xs(const uint8_t *p, float *out, int64_t nb) {
    const __m512 table = iq4_table();
    for (int64_t b = 0; b < nb; b++, p += 136, out += QK) {
        const float d = lt_quant_half(p);
        for (int k = 0; k < 8; k++) {
            const __m512 dl = _mm512_set1_ps(d * (float)lt_iq4_xs_scale(p, k));
            __m512i lo, hi;
            nibbles16(p + 8 + 16 * k, &lo, &hi);
            _mm512_storeu_ps(out + 32 * k, _mm512_mul_ps(dl, _mm512_permutexvar_ps(lo, table)));
            _mm512_storeu_ps(out + 32 * k + 16, _mm512_mul_ps(dl, _mm512_permutexvar_ps(hi, table)));
        }
    }
}

static const lt_dequant_fn avx512_table[LT_DTYPE_COUNT_] = {
    [LT_DTYPE_BF16] = bf16, [LT_DTYPE_F16] = f16,       [LT_DTYPE_Q8_0] = q8_0,         [LT_DTYPE_Q4_0] = q4_0,
    [LT_DTYPE_Q4_1] = q4_1, [LT_DTYPE_Q5_0] = q5_0,     [LT_DTYPE_Q5_1] = q5_1,         [LT_DTYPE_IQ4_NL] = iq4_nl,
    [LT_DTYPE_Q2_K] = q2_k, [LT_DTYPE_Q3_K] = q3_k,     [LT_DTYPE_Q4_K] = q4_k,         [LT_DTYPE_Q5_K] = q5_k,
    [LT_DTYPE_Q6_K] = q6_k, [LT_DTYPE_IQ4_XS] = iq4_xs, [LT_DTYPE_INT4_G64] = int4_g64,
};

const lt_dequant_fn *lt_dequant_avx512_table(void) { return avx512_table; }
#else
const lt_dequant_fn *lt_dequant_avx512_table(void) { return NULL; }
#endif
