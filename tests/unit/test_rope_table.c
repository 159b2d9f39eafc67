/* The RoPE frequency table (lt_model_rope_inv_freq): plain theta^(-2i/D), and Llama 3's scaling
 * with all three wavelength bands (kept, divided by the factor, and interpolated between) present
 * at D = 32. The rotation itself is an op, checked in tests/ops/test_backend_ops.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "model/model_internal.h"

static void plain_and_llama3_tables(void **state) {
    (void)state;
    lt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.D = 32;
    cfg.rope_theta = 500000.0;
    cfg.rope_scaling = LT_ROPE_SCALING_LLAMA3;
    cfg.rope_factor = 8;
    cfg.rope_low_freq = 1;
    cfg.rope_high_freq = 4;
    cfg.rope_original_ctx = 64; /* small so all three bands appear at D = 32 */
    float inv[17], plain[17];
    lt_model_rope_inv_freq(&cfg, inv);
    cfg.rope_scaling = LT_ROPE_SCALING_NONE;
    lt_model_rope_inv_freq(&cfg, plain);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 16; i++) {
        double f = pow(500000.0, -2.0 * i / 32.0), wl = 2 * 3.14159265358979323846 / f;
        lt_test_close_to(plain[i], f, 0, 1e-6, "inv_freq", i);
        double want = wl < 64 / 4.0 ? f : wl > 64 / 1.0 ? f / 8 : 0;
        if (want == 0) {
            double s = (64 / wl - 1) / (4 - 1);
            want = (1 - s) * f / 8 + s * f;
        }
        bands[wl < 16 ? 0 : wl > 64 ? 2 : 1]++;
        lt_test_close_to(inv[i], want, 0, 1e-6, "llama3 inv_freq", i);
    }
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(plain_and_llama3_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
