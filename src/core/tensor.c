/* dtype tables, tensor views and scalar conversions. The block formats' reference (de)quantizers
 * live in quant.c (32-weight blocks) and quant_k.c (256-weight super-blocks). */
#include <math.h>
#include <string.h>

#include "longtune/alloc.h"
#include "longtune/tensor.h"

static const struct {
    const char *name;
    int64_t block_elems, block_bytes;
} dtype_info[LT_DTYPE_COUNT_] = {
    [LT_DTYPE_F32] = {"f32", 1, 4},           [LT_DTYPE_BF16] = {"bf16", 1, 2},
    [LT_DTYPE_F16] = {"f16", 1, 2},           [LT_DTYPE_I32] = {"i32", 1, 4},
    [LT_DTYPE_Q8_0] = {"q8_0", 32, 34},       [LT_DTYPE_Q4_0] = {"q4_0", 32, 18},
    [LT_DTYPE_Q4_1] = {"q4_1", 32, 20},       [LT_DTYPE_INT4_G64] = {"int4_g64", 64, 36},
    [LT_DTYPE_Q5_0] = {"q5_0", 32, 22},       [LT_DTYPE_Q5_1] = {"q5_1", 32, 24},
    [LT_DTYPE_Q2_K] = {"q2_k", 256, 84},      [LT_DTYPE_Q3_K] = {"q3_k", 256, 110},
    [LT_DTYPE_Q4_K] = {"q4_k", 256, 144},     [LT_DTYPE_Q5_K] = {"q5_k", 256, 176},
    [LT_DTYPE_Q6_K] = {"q6_k", 256, 210},     [LT_DTYPE_IQ4_NL] = {"iq4_nl", 32, 18},
    [LT_DTYPE_IQ4_XS] = {"iq4_xs", 256, 136}, [LT_DTYPE_FP8] = {"fp8", 1, 1},
};

const char *lt_dtype_name(lt_dtype t) { return (unsigned)t < LT_DTYPE_COUNT_ ? dtype_info[t].name : "unknown"; }

lt_status lt_dtype_parse(const char *name, lt_dtype *out) {
    for (int i = 0; i < LT_DTYPE_COUNT_; i++)
        if (name && strcmp(name, dtype_info[i].name) == 0) {
            *out = (lt_dtype)i;
            return LT_OK;
        }
    return LT_ERR_INVALID_ARG;
}

int lt_dtype_is_quantized(lt_dtype t) { return (unsigned)t < LT_DTYPE_COUNT_ && dtype_info[t].block_elems > 1; }
int64_t lt_dtype_block_elems(lt_dtype t) { return (unsigned)t < LT_DTYPE_COUNT_ ? dtype_info[t].block_elems : 0; }
int64_t lt_dtype_block_bytes(lt_dtype t) { return (unsigned)t < LT_DTYPE_COUNT_ ? dtype_info[t].block_bytes : 0; }

int64_t lt_dtype_row_bytes(lt_dtype t, int64_t cols) {
    if ((unsigned)t >= LT_DTYPE_COUNT_ || cols < 0) return -1;
    if (t == LT_DTYPE_FP8) return cols > INT64_MAX - 4 ? -1 : cols + 4; /* q and a row scale */
    int64_t be = dtype_info[t].block_elems, bb = dtype_info[t].block_bytes;
    if (cols % be) return -1;
    if (cols / be > INT64_MAX / bb) return -1;
    return cols / be * bb;
}

lt_dtype lt_dtype_quantize_target(lt_dtype q, int64_t cols) {
    if (lt_dtype_row_bytes(q, cols) >= 0) return q;
    lt_dtype fb = q == LT_DTYPE_Q2_K || q == LT_DTYPE_Q3_K ? LT_DTYPE_Q4_0
        : q == LT_DTYPE_Q4_K                               ? LT_DTYPE_Q5_0
        : q == LT_DTYPE_Q5_K                               ? LT_DTYPE_Q5_1
        : q == LT_DTYPE_Q6_K                               ? LT_DTYPE_Q8_0
                                                           : LT_DTYPE_COUNT_;
    return fb != LT_DTYPE_COUNT_ && lt_dtype_row_bytes(fb, cols) >= 0 ? fb : LT_DTYPE_COUNT_;
}

lt_tensor lt_tensor_view(void *data, lt_dtype dtype, lt_device dev, int ndim, const int64_t *shape) {
    lt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    t.device = dev;
    t.ndim = ndim < 0 ? 0 : (ndim > LT_MAX_DIMS ? LT_MAX_DIMS : ndim);
    int64_t s = 1;
    for (int i = t.ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = s;
        /* Saturate: an overflowing shape is caught by lt_tensor_nbytes, not here. */
        if (__builtin_mul_overflow(s, shape[i] > 0 ? shape[i] : 1, &s)) s = INT64_MAX;
    }
    if (lt_dtype_is_quantized(dtype) && t.ndim >= 2) t.stride[t.ndim - 2] = 1;
    return t;
}

int64_t lt_tensor_numel(const lt_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) return -1;
        if (t->shape[i] && n > INT64_MAX / t->shape[i]) return -1;
        n *= t->shape[i];
    }
    return n;
}

int64_t lt_tensor_nbytes(const lt_tensor *t) {
    if (t->ndim == 0) return dtype_info[t->dtype].block_bytes;
    int64_t rows = 1;
    for (int i = 0; i < t->ndim - 1; i++) {
        if (t->shape[i] < 0 || (t->shape[i] && rows > INT64_MAX / t->shape[i])) return -1;
        rows *= t->shape[i];
    }
    int64_t rb = lt_dtype_row_bytes(t->dtype, t->shape[t->ndim - 1]);
    if (rb < 0 || (rb && rows > INT64_MAX / rb)) return -1;
    return rows * rb;
}

int lt_tensor_is_contiguous(const lt_tensor *t) {
    if (lt_dtype_is_quantized(t->dtype)) return t->ndim < 1 || t->stride[t->ndim - 1] == 1;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

lt_status lt_tensor_alloc(lt_ctx *ctx, lt_tensor *out, lt_dtype dtype, lt_device dev, int ndim, const int64_t *shape,
                          const char *what) {
    if ((unsigned)dtype >= LT_DTYPE_COUNT_ || ndim < 1 || ndim > LT_MAX_DIMS)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "tensor %s: bad dtype or rank %d", what ? what : "", ndim);
    *out = lt_tensor_view(NULL, dtype, dev, ndim, shape);
    int64_t nb = lt_tensor_nbytes(out);
    if (nb <= 0)
        return lt_error(ctx, LT_ERR_SHAPE, "tensor %s: size overflows or is not a whole number of %s blocks",
                        what ? what : "", lt_dtype_name(dtype));
    out->data = lt_alloc(ctx, dev, (size_t)nb, what);
    return out->data ? LT_OK : lt_ctx_status(ctx);
}

void lt_tensor_release(lt_ctx *ctx, lt_tensor *t) {
    if (!t || !t->data) return;
    lt_free(ctx, t->device, t->data, (size_t)lt_tensor_nbytes(t));
    t->data = NULL;
}

float lt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t lt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float lt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            u = sign | (exp << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t lt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to inf */
    if (absu < 0x38800000u) {                                   /* subnormal or zero */
        float a;
        memcpy(&a, &absu, 4);
        return (uint16_t)(sign | (uint32_t)lrintf(a * 16777216.0f)); /* a / 2^-24 */
    }
    uint32_t exp = (absu >> 23) - 127 + 15, man = absu & 0x7fffffu;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}
