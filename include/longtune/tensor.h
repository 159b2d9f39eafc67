/* Tensors: a typed view (dtype, shape, strides, device) over memory owned elsewhere, plus the
 * block-quantized formats the loaders and kernels share. A tensor never owns its data unless made
 * by lt_tensor_alloc, and it carries no autograd state. */
#ifndef LONGTUNE_TENSOR_H
#define LONGTUNE_TENSOR_H

#include "export.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum lt_dtype {
    LT_DTYPE_F32 = 0,
    LT_DTYPE_BF16,
    LT_DTYPE_F16,
    LT_DTYPE_I32,
    /* Block formats: rows of `cols` weights, quantized along the last dimension. */
    LT_DTYPE_Q8_0,     /* GGUF: 32 weights = { f16 d; int8 q[32] }, x = q*d (34 B) */
    LT_DTYPE_Q4_0,     /* GGUF: 32 weights = { f16 d; u8 q[16] }, x = (nib-8)*d (18 B) */
    LT_DTYPE_Q4_1,     /* GGUF: 32 weights = { f16 d; f16 m; u8 q[16] }, x = nib*d+m (20 B) */
    LT_DTYPE_INT4_G64, /* MLX-style affine int4, 64 weights = { f16 scale; f16 bias;
                            u32 q[8] }, eight nibbles per u32, low nibble first,
                            x = nib*scale+bias (36 B) */
    /* The remaining GGUF block formats, laid out exactly as ggml stores them (block_q5_0, ...;
     * ggml-common.h); the K-quants and IQ4_XS pack 256 weights per super-block. */
    LT_DTYPE_Q5_0,   /* 32 weights = { f16 d; u8 qh[4]; u8 qs[16] } (22 B) */
    LT_DTYPE_Q5_1,   /* 32 weights = { f16 d; f16 m; u8 qh[4]; u8 qs[16] } (24 B) */
    LT_DTYPE_Q2_K,   /* 256 weights = { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin } (84 B) */
    LT_DTYPE_Q3_K,   /* 256 weights = { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d } (110 B) */
    LT_DTYPE_Q4_K,   /* 256 weights = { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] } (144 B) */
    LT_DTYPE_Q5_K,   /* 256 weights = { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128] } (176 B) */
    LT_DTYPE_Q6_K,   /* 256 weights = { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d } (210 B) */
    LT_DTYPE_IQ4_NL, /* 32 weights = { f16 d; u8 qs[16] }, nibbles index a fixed 16-value table (18 B) */
    LT_DTYPE_IQ4_XS, /* 256 weights = { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] } (136 B) */
    LT_DTYPE_FP8,    /* a frozen projection (out, in) in FP8 E4M3 with a scale per output row, laid out
                        as { e4m3 q[out][in]; f32 scale[out] }, W[o][i] = q[o][i]·scale[o]: in + 4
                        bytes a row (lt_fp8_pack, lt_fp8_scales) */
    LT_DTYPE_COUNT_
} lt_dtype;

#define LT_MAX_DIMS 4

typedef struct lt_tensor {
    void *data;
    lt_dtype dtype;
    lt_device device;
    int ndim;
    int64_t shape[LT_MAX_DIMS];
    /* In elements for plain dtypes; for block formats only the last dim must be contiguous and
     * stride[ndim-2] is in blocks-rows (one row = lt_dtype_row_bytes(dtype, shape[ndim-1])). */
    int64_t stride[LT_MAX_DIMS];
} lt_tensor;

LT_API const char *lt_dtype_name(lt_dtype t);
/* Parses "f32", "bf16", "q4_1", ...; returns LT_ERR_INVALID_ARG for anything else. */
LT_API lt_status lt_dtype_parse(const char *name, lt_dtype *out);
LT_API int lt_dtype_is_quantized(lt_dtype t);
/* Weights per block (1 for plain dtypes) and bytes per block (element size for plain). */
LT_API int64_t lt_dtype_block_elems(lt_dtype t);
LT_API int64_t lt_dtype_block_bytes(lt_dtype t);
/* Bytes of one row of `cols` elements; -1 if cols is not a multiple of the block or overflows. */
LT_API int64_t lt_dtype_row_bytes(lt_dtype t, int64_t cols);
/* The block format rows of `cols` weights are quantized to when `q` asks for one: q itself when
 * the rows are whole blocks of it, else llama.cpp's fallback for rows that are not whole 256-weight
 * super-blocks (q2_k, q3_k -> q4_0; q4_k -> q5_0; q5_k -> q5_1; q6_k -> q8_0; IQ4_NL's place is
 * taken by q4_0, which has a quantizer); LT_DTYPE_COUNT_ when neither fits. */
LT_API lt_dtype lt_dtype_quantize_target(lt_dtype q, int64_t cols);

/* A contiguous tensor view of `data` with the given shape (row-major strides). */
LT_API lt_tensor lt_tensor_view(void *data, lt_dtype dtype, lt_device dev, int ndim, const int64_t *shape);
LT_API int64_t lt_tensor_numel(const lt_tensor *t);
/* Total bytes of a contiguous tensor of this shape; -1 on overflow or bad block multiple. */
LT_API int64_t lt_tensor_nbytes(const lt_tensor *t);
LT_API int lt_tensor_is_contiguous(const lt_tensor *t);

/* Allocates a contiguous tensor through the accounting allocator; free with lt_tensor_release. */
LT_API lt_status lt_tensor_alloc(lt_ctx *ctx, lt_tensor *out, lt_dtype dtype, lt_device dev, int ndim,
                                 const int64_t *shape, const char *what);
LT_API void lt_tensor_release(lt_ctx *ctx, lt_tensor *t);

/* Scalar conversions shared by every module (round-to-nearest-even for bf16/f16). */
LT_API float lt_bf16_to_f32(uint16_t h);
LT_API uint16_t lt_f32_to_bf16(float f);
LT_API float lt_f16_to_f32(uint16_t h);
LT_API uint16_t lt_f32_to_f16(float f);

/* Dequantizes `n` consecutive weights of a row in a block format (n a multiple of the block),
 * starting at block-aligned `row` bytes, into f32 `out`. */
LT_API void lt_dequantize_row(lt_dtype t, const void *row, float *out, int64_t n);
/* Quantizes n floats (multiple of the block) into `row` (round to nearest, min/max per block for
 * the affine formats). Only for tests and --quantize; not a hot path. */
LT_API void lt_quantize_row(lt_dtype t, const float *in, void *row, int64_t n);
/* 1 when t is a block format lt_quantize_row encodes (IQ4 and the float types: 0). */
LT_API int lt_quantize_has_encoder(lt_dtype t);

/* FP8 E4M3 (the OCP "e4m3fn" encoding: no infinities, 0x7f/0xff NaN, largest finite 448). */
#define LT_FP8_MAX 448.0f
LT_API float lt_fp8_to_f32(uint8_t v);
/* Round to nearest even, saturating to ±448 (NaN stays NaN), as CUDA's __nv_cvt_float_to_fp8
 * with __NV_SATFINITE. */
LT_API uint8_t lt_f32_to_fp8(float f);
/* The per-row scaling every FP8 product uses, on both backends: amax = max |x[i]| over the n
 * values; *inv = 448 / amax and *scale = amax / 448 (both 0 when amax is 0), so x[i] is held as
 * lt_f32_to_fp8(x[i]·inv)·scale. Returns amax (NaN when a value is NaN). */
LT_API float lt_fp8_row_scale(const float *x, int64_t n, float *inv, float *scale);
/* Packs an (out, in) f32 matrix into the LT_DTYPE_FP8 layout at dst (out·(in + 4) bytes). */
LT_API void lt_fp8_pack(const float *w, int64_t out, int64_t in, uint8_t *dst);
/* The row scales of an (out, in) LT_DTYPE_FP8 matrix at data (host or device memory: only the
 * address is computed). */
LT_API const float *lt_fp8_scales(const void *data, int64_t out, int64_t in);

#ifdef __cplusplus
}
#endif
#endif
