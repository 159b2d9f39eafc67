/* One weight of a row in any dtype as f32 on the device, the same arithmetic as the host's
 * lt_dequantize_row (src/core/tensor.c) so the embedding gather is bit-identical to the CPU one
 * (explicit round-to-nearest multiplies and adds: no FMA contraction). Used by the embedding
 * gather and the matmul's tile conversion; not a fused GEMM prologue. Private to src/backend/cuda. */
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
    default: return __int_as_float(0x7fc00000); /* unreachable: the model admits only the dtypes above */
    }
}

/* Weights [32·g, 32·g + 32) of a row of a block format (in a multiple of 32 for every block
 * format), as lt_dq_elem computes each: one thread decodes a whole group, reading each scale
 * once. Plain dtypes are not handled here (lt_dq_elem serves them). */
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

#endif
