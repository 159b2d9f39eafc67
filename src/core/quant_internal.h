/* The block formats' reference (de)quantizers shared between quant.c (32-weight blocks, the
 * dispatchers lt_dequantize_row / lt_quantize_row) and quant_k.c (256-weight super-blocks).
 * Every function takes whole blocks: `nb` blocks in, nb * block_elems weights out. */
#ifndef LONGTUNE_QUANT_INTERNAL_H
#define LONGTUNE_QUANT_INTERNAL_H

#include <stdint.h>

/* ggml's rounding: to nearest, ties away from zero. */
int lt_quant_round(float v);

void lt_dequant_q2_k(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q3_k(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q4_k(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_k(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q6_k(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_iq4_xs(const uint8_t *p, float *out, int64_t nb);
/* The scalar definitions of the types that also have a vector path (which the functions above
 * take when the build has AVX2); both give the same bits, which test_quant checks. */
void lt_dequant_q2_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q3_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_iq4_xs_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q4_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q6_k_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_0_scalar(const uint8_t *p, float *out, int64_t nb);
void lt_dequant_q5_1_scalar(const uint8_t *p, float *out, int64_t nb);

void lt_quant_q2_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q3_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q4_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q5_k(const float *x, uint8_t *p, int64_t nb);
void lt_quant_q6_k(const float *x, uint8_t *p, int64_t nb);

/* The 16 values an IQ4 nibble indexes (IQ4_NL and IQ4_XS). */
extern const int8_t lt_iq4_values[16];

#endif
