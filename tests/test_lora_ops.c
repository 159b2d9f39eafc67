/* The CPU backend's LoRA projection ops (lora_fwd, lora_bwd: the reference composition the model
 * runs every projection through) against float64 on fresh random inputs: groups of one to three
 * projections sharing x, a member without an adapter, bias, beta = 0 (poisoned outputs) and 1,
 * the lu-only forward, the backward without dx, f32 and bf16 weights. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "helpers/lora_check.h"
#include "helpers/test_util.h"

/* f32 products over in <= 96 terms, then a rank-r correction: a few ulps of the largest term. */
#define TOL_LORA_F32 2e-5

static void check(const lt_lora_case *c, uint64_t *rng) {
    lt_lora_errors e;
    lt_lora_check_run(lt_backend_get(LT_DEVICE_CPU), rng, c, &e);
    fprintf(stderr, "  G=%d n=%lld in=%lld r=%lld: y %.2e lu %.2e dx %.2e ga %.2e gb %.2e\n", c->G, (long long)c->n,
            (long long)c->in, (long long)c->r, e.y, e.lu, e.dx, e.ga, e.gb);
    assert_true(e.y <= TOL_LORA_F32 && e.lu <= TOL_LORA_F32 && e.dx <= TOL_LORA_F32);
    assert_true(e.ga <= TOL_LORA_F32 && e.gb <= TOL_LORA_F32);
}

static void group_of_three_with_bias(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_lora_case c = {3, {48, 16, 16}, {1, 1, 1}, 64, 37, 4, 2.0f, 0.0f, 1, 0, 0, LT_DTYPE_F32};
    check(&c, &rng);
    c.adapted[1] = 0; /* q, v adapted, k not (PEFT's default targets) */
    c.beta = 1.0f;
    check(&c, &rng);
}

static void single_projection_accumulating(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 1;
    lt_lora_case c = {1, {40, 0, 0}, {1, 0, 0}, 96, 29, 8, 0.5f, 1.0f, 0, 0, 0, LT_DTYPE_BF16};
    check(&c, &rng);
    c.no_dx = 1;
    c.beta = 0.0f;
    check(&c, &rng);
}

static void lu_only_pair(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 2;
    lt_lora_case c = {2, {72, 72, 0}, {1, 1, 0}, 32, 17, 3, 1.5f, 0.0f, 0, 1, 0, LT_DTYPE_F32};
    check(&c, &rng);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(group_of_three_with_bias),
        cmocka_unit_test(single_projection_accumulating),
        cmocka_unit_test(lu_only_pair),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
