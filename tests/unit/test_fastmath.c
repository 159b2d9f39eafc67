/* The branch-free exp and tanh of core/fastmath.h against float64 libm on fresh random inputs over
 * their whole ranges (relative error within the ulps their comments state, plus one for the f32
 * rounding of the reference), their edge values (±inf, NaN, the clamps, tanh's switch at 0.4), and
 * lt_fast_softcap, the vectorised loop, against cap·tanh(x / cap) in float64 element by element,
 * including lengths that leave a vector tail and a cap of 0 (nothing changes). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/fastmath.h"
#include "helpers/test_util.h"

static uint64_t seed_state;

static float uniform(float lo, float hi) { return (float)lt_test_uniform(&seed_state, lo, hi); }

/* |got - want| in units of want's f32 ulp (the spacing at |want|) */
static double ulps(float got, double want) {
    const float w = (float)want;
    const double ulp = nextafterf(fabsf(w), INFINITY) - fabsf(w);
    return fabs((double)got - want) / ulp;
}

static void exp_matches_libm(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i < 200000; i++) {
        const float x = uniform(-87.0f, 88.0f);
        const double u = ulps(lt_fast_exp(x), exp((double)x));
        if (u > worst) worst = u;
    }
    print_message("exp: worst %.2f ulp over 200000 inputs in [-87, 88]\n", worst);
    assert_true(worst <= 2.5);
    assert_true(lt_fast_exp(0.0f) == 1.0f);
    /* the clamps: below -87 gives exp(-87), above 88 exp(88), infinities included */
    assert_true(ulps(lt_fast_exp(-1000.0f), exp(-87.0)) <= 2.5);
    assert_true(ulps(lt_fast_exp(-INFINITY), exp(-87.0)) <= 2.5);
    assert_true(ulps(lt_fast_exp(INFINITY), exp(88.0)) <= 2.5);
    assert_true(isnan(lt_fast_exp(NAN)));
}

static void tanh_matches_libm(void **state) {
    (void)state;
    double worst = 0;
    for (int i = 0; i < 200000; i++) {
        /* both sides of the series / exp switch at 0.4, and far into saturation */
        const float x = i & 1 ? uniform(-0.8f, 0.8f) : uniform(-40.0f, 40.0f);
        const double u = ulps(lt_fast_tanh(x), tanh((double)x));
        if (u > worst) worst = u;
    }
    print_message("tanh: worst %.2f ulp over 200000 inputs\n", worst);
    assert_true(worst <= 4.0);
    const float edges[] = {0.0f, 0.4f, nextafterf(0.4f, 0.0f), -0.4f, 1e-30f, -1e-30f, 9.0f, 100.0f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        assert_true(ulps(lt_fast_tanh(edges[i]), tanh((double)edges[i])) <= 4.0);
    assert_true(lt_fast_tanh(INFINITY) == 1.0f);
    assert_true(lt_fast_tanh(-INFINITY) == -1.0f);
    assert_true(isnan(lt_fast_tanh(NAN)));
}

static void softcap_loop(void **state) {
    (void)state;
    const int64_t lens[] = {1, 7, 15, 16, 17, 255, 49152 + 3};
    const float caps[] = {30.0f, 50.0f, 0.5f};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t ci = 0; ci < sizeof caps / sizeof caps[0]; ci++) {
            const int64_t n = lens[li];
            const float cap = caps[ci];
            float *x = malloc((size_t)n * sizeof *x), *x0 = malloc((size_t)n * sizeof *x0);
            assert_non_null(x);
            assert_non_null(x0);
            for (int64_t i = 0; i < n; i++) x0[i] = x[i] = uniform(-8.0f, 8.0f) * cap;
            lt_fast_softcap(x, n, cap);
            for (int64_t i = 0; i < n; i++) {
                /* the reference from the same f32 quotient the loop forms, then cap times tanh */
                const float q = x0[i] * (1.0f / cap);
                const double want = (double)cap * tanh((double)q);
                if (!(ulps(x[i], want) <= 5.0))
                    fail_msg("softcap n=%lld cap=%g: x=%g gave %.9g, want %.9g", (long long)n, cap, x0[i], x[i], want);
            }
            free(x);
            free(x0);
        }
    /* infinities saturate at ±cap, NaN stays NaN, in the vector body as in the tail */
    float v[19];
    for (int i = 0; i < 19; i++) v[i] = i % 3 == 0 ? INFINITY : i % 3 == 1 ? -INFINITY : NAN;
    lt_fast_softcap(v, 19, 30.0f);
    for (int i = 0; i < 19; i++) {
        if (i % 3 == 0) assert_true(v[i] == 30.0f);
        else if (i % 3 == 1) assert_true(v[i] == -30.0f);
        else assert_true(isnan(v[i]));
    }
    /* cap 0 (no softcap) and a negative one leave the values alone */
    float w[3] = {1.0f, -2.0f, 1e6f}, w0[3] = {1.0f, -2.0f, 1e6f};
    lt_fast_softcap(w, 3, 0.0f);
    lt_fast_softcap(w, 3, -1.0f);
    assert_memory_equal(w, w0, sizeof w);
}

int main(void) {
    seed_state = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(exp_matches_libm),
        cmocka_unit_test(tanh_matches_libm),
        cmocka_unit_test(softcap_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
