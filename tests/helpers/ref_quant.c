/* The host decoder and random blocks of tests/helpers/ref_quant.h, written from ggml's block
 * layouts (ggml-common.h): every field offset is spelled out per format. */
#include "helpers/ref_quant.h"

#include <math.h>
#include <string.h>

#include "helpers/test_util.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

const lt_dtype lt_ref_quant_types[] = {LT_DTYPE_Q5_0, LT_DTYPE_Q5_1, LT_DTYPE_Q2_K,   LT_DTYPE_Q3_K,  LT_DTYPE_Q4_K,
                                       LT_DTYPE_Q5_K, LT_DTYPE_Q6_K, LT_DTYPE_IQ4_NL, LT_DTYPE_IQ4_XS};
const int lt_ref_quant_ntypes = (int)(sizeof lt_ref_quant_types / sizeof lt_ref_quant_types[0]);

static const int8_t iq4_levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static float f16_at(const uint8_t *p) { return lt_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Products and differences through volatile so that no compiler contracts them. */
static float mul(float a, float b) {
    volatile float r = a * b;
    return r;
}
static float add(float a, float b) {
    volatile float r = a + b;
    return r;
}

float lt_ref_dequant_elem(lt_dtype t, const uint8_t *b, int e) {
    switch (t) {
    case LT_DTYPE_Q5_0:
    case LT_DTYPE_Q5_1: { /* { f16 d; [f16 m;] u8 qh[4]; u8 qs[16] }: low nibbles are 0..15 */
        const int aff = t == LT_DTYPE_Q5_1;
        const uint8_t *qh = b + (aff ? 4 : 2), *qs = qh + 4;
        const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        const int nib = e < 16 ? qs[e] & 0xf : qs[e - 16] >> 4;
        const int q = nib | (int)((h >> e) & 1u) << 4;
        return aff ? add(mul(f16_at(b), (float)q), f16_at(b + 2)) : mul(f16_at(b), (float)(q - 16));
    }
    case LT_DTYPE_IQ4_NL: { /* { f16 d; u8 qs[16] } */
        const int q = e < 16 ? b[2 + e] & 0xf : b[2 + e - 16] >> 4;
        return mul(f16_at(b), (float)iq4_levels[q]);
    }
    case LT_DTYPE_Q2_K: { /* { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin } */
        const int half = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32, sc = b[e / 16];
        const int q = (b[16 + 32 * half + l] >> shift) & 3;
        const float dl = mul(f16_at(b + 80), (float)(sc & 0xf)), ml = mul(f16_at(b + 82), (float)(sc >> 4));
        return add(mul(dl, (float)q), -ml);
    }
    case LT_DTYPE_Q3_K: { /* { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d } */
        const int half = e / 128, shift = 2 * ((e % 128) / 32), l = e % 32, k = e / 16;
        const uint8_t *s = b + 96;
        /* scale k: low 4 bits from byte k (k < 8) or the high nibble of byte k - 8, high 2 bits
         * from byte 8 + k % 4 at bits 2·(k / 4) */
        const int lo4 = k < 8 ? s[k] & 0xf : s[k - 8] >> 4, hi2 = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        const int sc = (lo4 | hi2 << 4) - 32;
        const int q = ((b[32 + 32 * half + l] >> shift) & 3) - ((b[l] >> (e / 32)) & 1 ? 0 : 4);
        return mul(mul(f16_at(b + 108), (float)sc), (float)q);
    }
    case LT_DTYPE_Q4_K:
    case LT_DTYPE_Q5_K: { /* { f16 d; f16 dmin; u8 scales[12]; [u8 qh[32];] u8 qs[128] } */
        const int five = t == LT_DTYPE_Q5_K, j = e / 32, l = e % 32;
        const uint8_t *s = b + 4, *qs = b + (five ? 48 : 16);
        int sc, mn;
        if (j < 4) {
            sc = s[j] & 63, mn = s[j + 4] & 63;
        } else {
            sc = (s[j + 4] & 0xf) | (s[j - 4] >> 6) << 4;
            mn = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
        }
        int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0xf;
        if (five && (b[16 + l] >> j) & 1) q += 16;
        const float dl = mul(f16_at(b), (float)sc), ml = mul(f16_at(b + 2), (float)mn);
        return add(mul(dl, (float)q), -ml);
    }
    case LT_DTYPE_Q6_K: { /* { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d } */
        const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        /* quarter 0..3 of a half: ql[l] low, ql[l + 32] low, ql[l] high, ql[l + 32] high */
        const int lo = (b[64 * half + l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0xf;
        const int hi = (b[128 + 32 * half + l] >> (2 * quarter)) & 3;
        const float dl = mul(f16_at(b + 208), (float)(int8_t)b[192 + e / 16]);
        return mul(dl, (float)((lo | hi << 4) - 32));
    }
    case LT_DTYPE_IQ4_XS: { /* { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] } */
        const int ib = e / 32, i = e % 32, sh = b[2] | b[3] << 8;
        const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | ((sh >> (2 * ib)) & 3) << 4;
        const int q = i < 16 ? b[8 + 16 * ib + i] & 0xf : b[8 + 16 * ib + i - 16] >> 4;
        return mul(mul(f16_at(b), (float)(ls - 32)), (float)iq4_levels[q]);
    }
    default: return NAN;
    }
}

void lt_ref_dequant_row(lt_dtype t, const uint8_t *row, float *out, int64_t n) {
    const int64_t be = lt_dtype_block_elems(t), bb = lt_dtype_block_bytes(t);
    for (int64_t i = 0; i < n; i++) out[i] = lt_ref_dequant_elem(t, row + (i / be) * bb, (int)(i % be));
}

static void put_f16(uint8_t *p, double x) {
    const uint16_t h = lt_f32_to_f16((float)x);
    p[0] = (uint8_t)h, p[1] = (uint8_t)(h >> 8);
}

void lt_ref_random_row(uint64_t *rng, lt_dtype t, uint8_t *row, int64_t n, double mag) {
    const int64_t be = lt_dtype_block_elems(t), bb = lt_dtype_block_bytes(t);
    for (int64_t i = 0; i < n / be; i++) {
        uint8_t *b = row + i * bb;
        for (int64_t k = 0; k < bb; k++) b[k] = (uint8_t)lt_test_rand_u64(rng);
        /* the largest |weight| a block can hold per unit of its f16 scale(s) */
        const double u = lt_test_uniform(rng, 0.5, 1.5) * mag;
        switch (t) {
        case LT_DTYPE_Q5_0: put_f16(b, u / 16); break;
        case LT_DTYPE_Q5_1: put_f16(b, u / 16), put_f16(b + 2, -u * lt_test_uniform(rng, 0.5, 1.5)); break;
        case LT_DTYPE_IQ4_NL: put_f16(b, u / 127); break;
        case LT_DTYPE_Q2_K: put_f16(b + 80, u / 45), put_f16(b + 82, u / 15 * lt_test_uniform(rng, 0.5, 1)); break;
        case LT_DTYPE_Q3_K: put_f16(b + 108, u / 128); break;
        case LT_DTYPE_Q4_K: put_f16(b, u / 945), put_f16(b + 2, u / 945); break;
        case LT_DTYPE_Q5_K: put_f16(b, u / 1953), put_f16(b + 2, u / 1953); break;
        case LT_DTYPE_Q6_K: put_f16(b + 208, u / 4096); break;
        case LT_DTYPE_IQ4_XS: put_f16(b, u / 4064); break;
        default: break;
        }
    }
}
