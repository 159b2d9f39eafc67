/* dtypes, tensor views and the reference (de)quantizers: exhaustive f16 round trips, bf16 round-
 * to-nearest-even, and quantize→dequantize errors within half a quantization step on fresh random
 * rows, checked against float64 arithmetic. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/tensor.h"

static void f16_round_trips_every_value(void **state) {
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = lt_f16_to_f32((uint16_t)h);
        if (isnan(f)) {
            assert_true(((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff));
            continue;
        }
        assert_int_equal(lt_f32_to_f16(f), h);
    }
    assert_true(lt_f16_to_f32(lt_f32_to_f16(1.0f)) == 1.0f);
    assert_true(lt_f16_to_f32(lt_f32_to_f16(65504.0f)) == 65504.0f);
    assert_true(isinf(lt_f16_to_f32(lt_f32_to_f16(1e6f))));
}

static void f32_to_f16_and_bf16_round_to_nearest(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    for (int i = 0; i < 200000; i++) {
        float x = (float)(lt_test_normal(&rng) * pow(2.0, lt_test_uniform(&rng, -20, 14)));
        double b = lt_bf16_to_f32(lt_f32_to_bf16(x));
        /* bf16 keeps 8 significant bits: relative error at most half an ulp, 2^-8. */
        assert_true(fabs(b - x) <= fabs((double)x) * 0x1.0p-8 * 1.0000001);
        double h = lt_f16_to_f32(lt_f32_to_f16(x));
        if (fabs((double)x) >= 0x1.0p-14 && fabs((double)x) < 65504)
            assert_true(fabs(h - x) <= fabs((double)x) * 0x1.0p-11 * 1.0000001);
        else if (fabs((double)x) < 0x1.0p-14) assert_true(fabs(h - x) <= 0x1.0p-25 * 1.0000001);
    }
    /* Ties go to even. */
    uint32_t u = 0x3f808000u; /* 1 + 2^-8: halfway between two bf16 values */
    float x;
    memcpy(&x, &u, 4);
    assert_int_equal(lt_f32_to_bf16(x), 0x3f80);
}

static void quantized_rows_round_trip_within_half_a_step(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 1;
    const lt_dtype types[] = {LT_DTYPE_Q8_0, LT_DTYPE_Q4_0, LT_DTYPE_Q4_1, LT_DTYPE_INT4_G64};
    for (int ti = 0; ti < 4; ti++) {
        lt_dtype t = types[ti];
        int64_t be = lt_dtype_block_elems(t), n = be * 8;
        float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        uint8_t *row = malloc((size_t)lt_dtype_row_bytes(t, n));
        lt_test_fill_normal(&rng, x, n, 0.7f);
        lt_quantize_row(t, x, row, n);
        for (int64_t i = 0; i < n; i++) y[i] = LT_TEST_POISON;
        lt_dequantize_row(t, row, y, n);
        for (int64_t b = 0; b < n / be; b++) {
            double lo = x[b * be], hi = lo, amax = 0;
            for (int64_t j = 0; j < be; j++) {
                double v = x[b * be + j];
                lo = fmin(lo, v);
                hi = fmax(hi, v);
                amax = fmax(amax, fabs(v));
            }
            double step = t == LT_DTYPE_Q8_0 ? amax / 127 : t == LT_DTYPE_Q4_0 ? amax / 8 : (hi - lo) / 15;
            for (int64_t j = 0; j < be; j++) {
                double err = fabs((double)y[b * be + j] - x[b * be + j]);
                /* half a step (a whole one for Q4_0, whose grid is asymmetric: -8..7 steps, so
                 * the extreme opposite in sign to the largest magnitude clamps), plus the f16
                 * rounding of the scale and offset */
                double allowed = (t == LT_DTYPE_Q4_0 ? 1.0 : 0.5) * step;
                assert_true(err <= allowed * 1.01 + fabs((double)x[b * be + j]) * 2e-3 + 1e-3 * step);
            }
        }
        free(x);
        free(y);
        free(row);
    }
    assert_int_equal(lt_dtype_row_bytes(LT_DTYPE_Q4_1, 64), 40);
    assert_int_equal(lt_dtype_row_bytes(LT_DTYPE_Q4_1, 65), -1);
    assert_int_equal(lt_dtype_row_bytes(LT_DTYPE_INT4_G64, 128), 72);
}

static void int4_g64_layout_is_low_nibble_first(void **state) {
    (void)state;
    uint8_t block[36] = {0};
    uint16_t one = lt_f32_to_f16(1.0f), zero = lt_f32_to_f16(0.0f);
    memcpy(block, &one, 2);
    memcpy(block + 2, &zero, 2);
    uint32_t q = 0x76543210u;
    memcpy(block + 4, &q, 4);
    float out[64];
    lt_dequantize_row(LT_DTYPE_INT4_G64, block, out, 64);
    for (int j = 0; j < 8; j++) assert_true(out[j] == (float)j);
}

static void tensors_views_and_allocation(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    int64_t shape[3] = {2, 3, 64};
    lt_tensor t;
    assert_int_equal(lt_tensor_alloc(ctx, &t, LT_DTYPE_BF16, LT_DEVICE_CPU, 3, shape, "t"), LT_OK);
    assert_int_equal(lt_tensor_numel(&t), 384);
    assert_int_equal(lt_tensor_nbytes(&t), 768);
    assert_true(lt_tensor_is_contiguous(&t));
    assert_int_equal(t.stride[0], 192);
    lt_tensor_release(ctx, &t);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    int64_t bad[2] = {4, 33};
    assert_int_equal(lt_tensor_alloc(ctx, &t, LT_DTYPE_Q4_0, LT_DEVICE_CPU, 2, bad, "q"), LT_ERR_SHAPE);
    int64_t huge[3] = {INT64_MAX / 2, 4, 4};
    assert_int_equal(lt_tensor_alloc(ctx, &t, LT_DTYPE_F32, LT_DEVICE_CPU, 3, huge, "huge"), LT_ERR_SHAPE);
    lt_dtype d;
    assert_int_equal(lt_dtype_parse("q4_1", &d), LT_OK);
    assert_int_equal(d, LT_DTYPE_Q4_1);
    assert_int_equal(lt_dtype_parse("q4_9", &d), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_round_trips_every_value),
        cmocka_unit_test(f32_to_f16_and_bf16_round_to_nearest),
        cmocka_unit_test(quantized_rows_round_trip_within_half_a_step),
        cmocka_unit_test(int4_g64_layout_is_low_nibble_first),
        cmocka_unit_test(tensors_views_and_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
