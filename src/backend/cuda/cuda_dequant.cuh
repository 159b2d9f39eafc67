/* One weight of a row in any dtype as f32 on the device, the same arithmetic as the host's
 * lt_dequantize_row (src/core/) so the embedding gather is bit-identical to the CPU one (explicit
 * round-to-nearest multiplies, adds and subtractions in the host's order: no FMA contraction).
 * Every GGUF block format longtune reads: the 32-weight blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
 * IQ4_NL), INT4_G64's 64, and the 256-weight super-blocks of Q2_K..Q6_K and IQ4_XS (decoded in
 * 32-weight groups, each inside one super-block). lt_dq_elem decodes any of them; the group
 * decoders are split, lt_dq_group32 for Q8_0/Q4_0/Q4_1/INT4_G64 and lt_dq_group32_ext for the rest,
 * so that kernels instantiated for the first four keep the register budget they were measured
 * with. Used by the embedding gather, the matmul's tile conversion and the fused loss's head tiles;
 * not a fused GEMM prologue. Private to src/backend/cuda. */
#ifndef LT_CUDA_DEQUANT_CUH
#define LT_CUDA_DEQUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "longtune/tensor.h"
}

static __device__ __forceinline__ float lt_dq_f16(const uint8_t *p) {
    __half_raw r;
    r.x = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__half(r));
}

/* IQ4_NL / IQ4_XS's 16 fixed levels (ggml's kvalues_iq4nl) packed four to a word, picked with
 * selects rather than an indexed table (no local-memory array, no serialised constant reads). */
static __device__ __forceinline__ float lt_dq_iq4(int q) {
    const uint32_t w = (q & 8) ? ((q & 4) ? 0x71594535u : 0x26190d01u) : ((q & 4) ? 0xf6eaddcfu : 0xbfad9881u);
    return (float)(int8_t)(uint8_t)(w >> (8 * (q & 3)));
}

/* d·q − m as two rounded operations (the host's order for the affine K-quants). */
static __device__ __forceinline__ float lt_dq_mul_sub(float d, float q, float m) {
    return __fsub_rn(__fmul_rn(d, q), m);
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes s. */
static __device__ __forceinline__ void lt_dq_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 2) & 0x30);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
    }
}

/* Q3_K: the signed 6-bit scale k (0..15) from the 12 scale bytes s. */
static __device__ __forceinline__ int lt_dq_q3_scale(const uint8_t *s, int k) {
    const int lo = k < 8 ? (s[k] & 0xf) : (s[k - 8] >> 4);
    const int hi = (s[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

/* Weight e of one block of the formats beyond Q4_1 (b: the block's first byte). Layouts as ggml's
 * block_q5_0 ... block_iq4_xs (ggml-common.h); the 2-bit planes of Q2_K/Q3_K and the 4-bit ones of
 * the K-quants hold element h·128 + 32·j + l (h the half, l < 32) in byte h·32 + l (Q2_K, Q3_K;
 * Q4_K/Q5_K: byte (j/2)·32 + l, nibble j%2) at bits 2j. */
static __device__ __forceinline__ float lt_dq_block_elem(lt_dtype t, const uint8_t *b, int e) {
    switch (t) {
    case LT_DTYPE_Q5_0:
    case LT_DTYPE_Q5_1: {
        const int m1 = t == LT_DTYPE_Q5_1, j = e & 15;
        const uint8_t *qh = b + (m1 ? 4 : 2), *qs = qh + 4;
        const uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
        const int q = ((e < 16 ? qs[j] & 0xf : qs[j] >> 4)) | (int)(((h >> e) & 1u) << 4);
        if (m1) return __fadd_rn(__fmul_rn(lt_dq_f16(b), (float)q), lt_dq_f16(b + 2));
        return __fmul_rn(lt_dq_f16(b), (float)(q - 16));
    }
    case LT_DTYPE_IQ4_NL: {
        const int j = e & 15, q = e < 16 ? b[2 + j] & 0xf : b[2 + j] >> 4;
        return __fmul_rn(lt_dq_f16(b), lt_dq_iq4(q));
    }
    case LT_DTYPE_Q2_K: {
        const int h = e >> 7, j = (e >> 5) & 3, l = e & 31, s = b[e >> 4];
        const int q = (b[16 + h * 32 + l] >> (2 * j)) & 3;
        const float dl = __fmul_rn(lt_dq_f16(b + 80), (float)(s & 0xf));
        const float ml = __fmul_rn(lt_dq_f16(b + 82), (float)(s >> 4));
        return lt_dq_mul_sub(dl, (float)q, ml);
    }
    case LT_DTYPE_Q3_K: {
        const int h = e >> 7, j = (e >> 5) & 3, l = e & 31;
        const int lo = (b[32 + h * 32 + l] >> (2 * j)) & 3, hb = (b[l] >> (e >> 5)) & 1;
        const float dl = __fmul_rn(lt_dq_f16(b + 108), (float)lt_dq_q3_scale(b + 96, e >> 4));
        return __fmul_rn(dl, (float)(lo - ((hb ^ 1) << 2)));
    }
    case LT_DTYPE_Q4_K:
    case LT_DTYPE_Q5_K: {
        const int five = t == LT_DTYPE_Q5_K, j = e >> 5, l = e & 31;
        int sc, mn;
        lt_dq_k4_scale_min(b + 4, j, &sc, &mn);
        int v = (b[(five ? 48 : 16) + (j >> 1) * 32 + l] >> (4 * (j & 1))) & 0xf;
        if (five) v |= ((b[16 + l] >> j) & 1) << 4;
        const float dl = __fmul_rn(lt_dq_f16(b), (float)sc), ml = __fmul_rn(lt_dq_f16(b + 2), (float)mn);
        return lt_dq_mul_sub(dl, (float)v, ml);
    }
    case LT_DTYPE_Q6_K: {
        const int h = e >> 7, r = e & 127;
        const int lo = (b[h * 64 + (r & 63)] >> (4 * (r >> 6))) & 0xf;
        const int hi = (b[128 + h * 32 + (r & 31)] >> (2 * (r >> 5))) & 3;
        const float dl = __fmul_rn(lt_dq_f16(b + 208), (float)(int8_t)b[192 + (e >> 4)]);
        return __fmul_rn(dl, (float)((lo | (hi << 4)) - 32));
    }
    case LT_DTYPE_IQ4_XS: {
        const int k = e >> 5, i = e & 31;
        const int sh = b[2] | (b[3] << 8);
        const int s = (((b[4 + (k >> 1)] >> (4 * (k & 1))) & 0xf) | (((sh >> (2 * k)) & 3) << 4)) - 32;
        const int q = (b[8 + k * 16 + (i & 15)] >> (4 * (i >> 4))) & 0xf;
        return __fmul_rn(__fmul_rn(lt_dq_f16(b), (float)s), lt_dq_iq4(q));
    }
    default: return __int_as_float(0x7fc00000); /* unreachable: lt_dq_elem / lt_dq_group32 route here */
    }
}

/* Weights and bytes of one block of the formats lt_dq_block_elem decodes. */
static __device__ __forceinline__ int lt_dq_block_weights(lt_dtype t) {
    return t == LT_DTYPE_Q5_0 || t == LT_DTYPE_Q5_1 || t == LT_DTYPE_IQ4_NL ? 32 : 256;
}
static __device__ __forceinline__ int lt_dq_block_size(lt_dtype t) {
    switch (t) {
    case LT_DTYPE_Q5_0: return 22;
    case LT_DTYPE_Q5_1: return 24;
    case LT_DTYPE_IQ4_NL: return 18;
    case LT_DTYPE_Q2_K: return 84;
    case LT_DTYPE_Q3_K: return 110;
    case LT_DTYPE_Q4_K: return 144;
    case LT_DTYPE_Q5_K: return 176;
    case LT_DTYPE_Q6_K: return 210;
    default: return 136; /* IQ4_XS */
    }
}

/* Weight c of the row starting at `row` (block-aligned, as lt_dtype_row_bytes lays rows out). */
static __device__ __forceinline__ float lt_dq_elem(lt_dtype t, const uint8_t *row, int64_t c) {
    switch (t) {
    case LT_DTYPE_F32: return ((const float *)row)[c];
    case LT_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)row)[c]);
    case LT_DTYPE_F16: return __half2float(((const __half *)row)[c]);
    case LT_DTYPE_Q8_0: {
        const uint8_t *b = row + (c >> 5) * 34;
        return __fmul_rn((float)(int8_t)b[2 + (c & 31)], lt_dq_f16(b));
    }
    case LT_DTYPE_Q4_0: {
        const uint8_t *b = row + (c >> 5) * 18;
        int j = (int)(c & 31);
        int q = j < 16 ? (b[2 + j] & 0xf) : (b[2 + j - 16] >> 4);
        return __fmul_rn((float)(q - 8), lt_dq_f16(b));
    }
    case LT_DTYPE_Q4_1: {
        const uint8_t *b = row + (c >> 5) * 20;
        int j = (int)(c & 31);
        int q = j < 16 ? (b[4 + j] & 0xf) : (b[4 + j - 16] >> 4);
        return __fadd_rn(__fmul_rn((float)q, lt_dq_f16(b)), lt_dq_f16(b + 2));
    }
    case LT_DTYPE_INT4_G64: {
        const uint8_t *b = row + (c >> 6) * 36;
        int e = (int)(c & 63);
        /* word e/8, nibble e%8, low nibble first: byte 4 + 4·(e/8) + (e%8)/2 */
        int q = (b[4 + 4 * (e >> 3) + ((e & 7) >> 1)] >> (4 * (e & 1))) & 0xf;
        return __fadd_rn(__fmul_rn((float)q, lt_dq_f16(b)), lt_dq_f16(b + 2));
    }
    case LT_DTYPE_Q5_0:
    case LT_DTYPE_Q5_1:
    case LT_DTYPE_IQ4_NL:
    case LT_DTYPE_Q2_K:
    case LT_DTYPE_Q3_K:
    case LT_DTYPE_Q4_K:
    case LT_DTYPE_Q5_K:
    case LT_DTYPE_Q6_K:
    case LT_DTYPE_IQ4_XS: {
        const int be = lt_dq_block_weights(t);
        return lt_dq_block_elem(t, row + (c / be) * lt_dq_block_size(t), (int)(c % be));
    }
    default: return __int_as_float(0x7fc00000); /* unreachable: the model admits only the dtypes above */
    }
}

/* Weights [32·g, 32·g + 32) of a row of Q8_0, Q4_0, Q4_1 or INT4_G64 (in a multiple of 32 for
 * every block format), as lt_dq_elem computes each: one thread decodes a whole group, reading each
 * scale once. The formats beyond Q4_1 have lt_dq_group32_ext (their own kernels, so these keep
 * their register budget); plain dtypes are not handled here (lt_dq_plain serves them). */
static __device__ __forceinline__ void lt_dq_group32(lt_dtype t, const uint8_t *row, int64_t g, float out[32]) {
    switch (t) {
    case LT_DTYPE_Q8_0: {
        const uint8_t *b = row + g * 34;
        const float d = lt_dq_f16(b);
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = __fmul_rn((float)(int8_t)b[2 + j], d);
        break;
    }
    case LT_DTYPE_Q4_0: {
        const uint8_t *b = row + g * 18;
        const float d = lt_dq_f16(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b[2 + j];
            out[j] = __fmul_rn((float)((q & 0xf) - 8), d);
            out[j + 16] = __fmul_rn((float)((q >> 4) - 8), d);
        }
        break;
    }
    case LT_DTYPE_Q4_1: {
        const uint8_t *b = row + g * 20;
        const float d = lt_dq_f16(b), m = lt_dq_f16(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int q = b[4 + j];
            out[j] = __fadd_rn(__fmul_rn((float)(q & 0xf), d), m);
            out[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), m);
        }
        break;
    }
    case LT_DTYPE_INT4_G64: {
        const uint8_t *b = row + (g >> 1) * 36;
        const float sc = lt_dq_f16(b), bias = lt_dq_f16(b + 2);
        const uint8_t *q = b + 4 + 16 * (g & 1); /* this half's four words, low nibble first */
#pragma unroll
        for (int j = 0; j < 16; j++) {
            out[2 * j] = __fadd_rn(__fmul_rn((float)(q[j] & 0xf), sc), bias);
            out[2 * j + 1] = __fadd_rn(__fmul_rn((float)(q[j] >> 4), sc), bias);
        }
        break;
    }
    default:
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = __int_as_float(0x7fc00000);
    }
}

/* 1 for the formats beyond Q4_1 (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS): lt_dq_group32_ext's. */
static __host__ __device__ __forceinline__ int lt_dq_ext(lt_dtype t) {
    return t == LT_DTYPE_Q5_0 || t == LT_DTYPE_Q5_1 || t == LT_DTYPE_IQ4_NL || t == LT_DTYPE_Q2_K ||
        t == LT_DTYPE_Q3_K || t == LT_DTYPE_Q4_K || t == LT_DTYPE_Q5_K || t == LT_DTYPE_Q6_K || t == LT_DTYPE_IQ4_XS;
}

/* lt_dq_group32 for the formats beyond Q4_1: group g is block g of the 32-weight formats, or
 * group g % 8 of super-block g / 8 (256 weights). */
static __device__ __forceinline__ void lt_dq_group32_ext(lt_dtype t, const uint8_t *row, int64_t g, float out[32]) {
    switch (t) {
    case LT_DTYPE_Q5_0:
    case LT_DTYPE_Q5_1:
    case LT_DTYPE_IQ4_NL: {
        const uint8_t *b = row + g * lt_dq_block_size(t);
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = lt_dq_block_elem(t, b, j);
        break;
    }
    case LT_DTYPE_Q2_K:
    case LT_DTYPE_Q3_K:
    case LT_DTYPE_Q4_K:
    case LT_DTYPE_Q5_K:
    case LT_DTYPE_Q6_K:
    case LT_DTYPE_IQ4_XS: {
        const uint8_t *b = row + (g >> 3) * lt_dq_block_size(t);
        const int e0 = 32 * (int)(g & 7);
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = lt_dq_block_elem(t, b, e0 + j);
        break;
    }
    default:
#pragma unroll
        for (int j = 0; j < 32; j++) out[j] = __int_as_float(0x7fc00000);
    }
}

/* One weight of a plain dtype (the matmul's f32 / f16 tiles). */
static __device__ __forceinline__ float lt_dq_plain(lt_dtype t, const uint8_t *row, int64_t c) {
    switch (t) {
    case LT_DTYPE_F32: return ((const float *)row)[c];
    case LT_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)row)[c]);
    case LT_DTYPE_F16: return __half2float(((const __half *)row)[c]);
    default: return __int_as_float(0x7fc00000); /* unreachable: block formats take lt_dq_group32(_ext) */
    }
}

#endif
