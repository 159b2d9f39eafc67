/* The GGUF block formats beyond Q4_1 (Q5_0, Q5_1, IQ4_NL, Q2_K..Q6_K, IQ4_XS) written out from
 * their specification (ggml's block layouts and dequantize_row_* arithmetic) for the tests that
 * check a backend's decoding: a host decoder independent of src/core, and random valid blocks.
 * Nothing here quantizes real data. */
#ifndef LT_TEST_REF_QUANT_H
#define LT_TEST_REF_QUANT_H

#include <stdint.h>

#include "longtune/tensor.h"

/* The dtypes these helpers serve, in tensor.h's order; n of them. */
extern const lt_dtype lt_ref_quant_types[];
extern const int lt_ref_quant_ntypes;

/* Weight e (0 <= e < lt_dtype_block_elems(t)) of the block at b, as float32 operations in the
 * order of ggml's dequantize_row_* (each product and sum rounded, no fused multiply-add). */
float lt_ref_dequant_elem(lt_dtype t, const uint8_t *b, int e);

/* n weights (a multiple of the block) of the row at `row` into out. */
void lt_ref_dequant_row(lt_dtype t, const uint8_t *row, float *out, int64_t n);

/* n weights of random valid blocks into row: random quant bytes and sub-block scales, the f16
 * scales (and mins) drawn so that the weights are of order `mag` (at most a few times it). */
void lt_ref_random_row(uint64_t *rng, lt_dtype t, uint8_t *row, int64_t n, double mag);

#endif
