/* FP8 E4M3 scalars and the fp8 projection layout: every code decodes to its value from the
 * format's definition, encoding picks the nearest code (ties to an even significand) and
 * saturates, the row scale maps the row's largest magnitude to 448, and lt_fp8_pack lays out
 * q and the row scales. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "longtune/tensor.h"

/* The value of code c from the definition: sign, 4 exponent bits (bias 7), 3 significand bits. */
static double def_value(int c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return s ? -v : v;
}

static void every_code_decodes_to_its_value(void **state) {
    (void)state;
    for (int c = 0; c < 256; c++) {
        float v = lt_fp8_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            assert_true(isnan(v));
            continue;
        }
        assert_true((double)v == def_value(c));
    }
    assert_true(lt_fp8_to_f32(0x7e) == 448.0f);
}

/* The nearest finite code to f by brute force (ties: the even significand), saturating. */
static uint8_t nearest(float f) {
    int best = -1;
    double bd = INFINITY;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7f) == 0x7f || ((c & 0x80) != 0) != (signbit(f) != 0)) continue;
        double d = fabs(def_value(c) - (double)f);
        if (d < bd || (d == bd && (c & 1) == 0)) bd = d, best = c;
    }
    return (uint8_t)best;
}

static void encoding_rounds_to_nearest_even_and_saturates(void **state) {
    (void)state;
    uint64_t s = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < 200000; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        float f;
        if (i < 256 * 3 && (i % 256 & 0x7f) < 0x7e) { /* every code, its midpoints to the next */
            int c = i % 256;
            double a = def_value(c), b = def_value(c + 1);
            f = (float)(i < 256 ? a : i < 512 ? (a + b) / 2 : a + (b - a) * 0.499);
        } else {
            f = ldexpf((float)(s >> 40) / (float)(1 << 24) * (s & 1 ? -1.0f : 1.0f), (int)(s >> 8 & 31) - 16);
        }
        uint8_t want = fabsf(f) >= 448.0f ? (uint8_t)(signbit(f) ? 0xfe : 0x7e) : nearest(f);
        if (lt_f32_to_fp8(f) != want) fail_msg("%.9g: got 0x%02x, want 0x%02x", (double)f, lt_f32_to_fp8(f), want);
    }
    assert_int_equal(lt_f32_to_fp8(1e30f), 0x7e);
    assert_int_equal(lt_f32_to_fp8(-INFINITY), 0xfe);
    assert_int_equal(lt_f32_to_fp8(NAN) & 0x7f, 0x7f);
    assert_int_equal(lt_f32_to_fp8(ldexpf(1.0f, -10)), 0x00); /* half the smallest subnormal: ties to 0 */
    assert_int_equal(lt_f32_to_fp8(ldexpf(1.5f, -10)), 0x01);
}

static void row_scale_and_pack_layout(void **state) {
    (void)state;
    enum { OUT = 48, IN = 32 };
    float w[OUT * IN];
    for (int i = 0; i < OUT * IN; i++) w[i] = sinf((float)i * 0.37f) * (float)(1 + i % 7);
    for (int i = 0; i < IN; i++) w[5 * IN + i] = 0.0f; /* a zero row: scale 0, codes 0 */
    assert_int_equal(lt_dtype_row_bytes(LT_DTYPE_FP8, IN), IN + 4);
    uint8_t *p = malloc((size_t)OUT * (IN + 4));
    lt_fp8_pack(w, OUT, IN, p);
    const uint8_t *q = p;
    const float *scale = (const float *)(p + OUT * IN);
    assert_ptr_equal(lt_fp8_scales(p, OUT, IN), scale);
    for (int o = 0; o < OUT; o++) {
        float inv, sc, amax = lt_fp8_row_scale(w + o * IN, IN, &inv, &sc);
        assert_true(scale[o] == sc);
        if (o == 5) assert_true(sc == 0.0f && amax == 0.0f);
        else assert_true(fabsf(amax * inv - 448.0f) <= 448.0f * 1e-6f);
        for (int i = 0; i < IN; i++) {
            assert_int_equal(q[o * IN + i], lt_f32_to_fp8(w[o * IN + i] * inv));
            /* within half a step of e4m3 (2^-4 relative) of the weight */
            double back = (double)lt_fp8_to_f32(q[o * IN + i]) * sc;
            assert_true(fabs(back - w[o * IN + i]) <= fabs((double)w[o * IN + i]) / 16 + sc * ldexp(1, -9));
        }
    }
    float nanrow[4] = {1.0f, NAN, 2.0f, 3.0f}, inv, sc;
    assert_true(isnan(lt_fp8_row_scale(nanrow, 4, &inv, &sc)) && isnan(sc));
    free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_code_decodes_to_its_value),
        cmocka_unit_test(encoding_rounds_to_nearest_even_and_saturates),
        cmocka_unit_test(row_scale_and_pack_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
