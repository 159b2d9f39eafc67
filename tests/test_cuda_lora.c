/* The CUDA backend's fused LoRA projection ops (lora_fwd, lora_bwd) against float64 on fresh random
 * inputs, at shapes that take the fused kernels (bf16 down-products from the matmul's staged x or
 * dy, the rank update before the base product, one dx pass per group, the bf16 tall reduction at
 * n >= 1024) and shapes that fall back to the reference composition (rank 6, n below the tall
 * kernel's reach, in not a multiple of 8). Without a CUDA device it prints "skipped: no CUDA
 * device" and exits 77. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "helpers/lora_check.h"
#include "helpers/test_util.h"

#if LT_HAVE_CUDA
/* The base product and the LoRA down-products read x and dy rounded to bf16 (fp32 accumulate):
 * relative errors of a few bf16 half-ulps (2^-9) against the largest element. */
#define TOL_LORA_BF16 0x1.0p-6

static void check(const lt_lora_case *c, uint64_t *rng) {
    lt_lora_errors e;
    lt_lora_check_run(lt_backend_get(LT_DEVICE_CUDA), rng, c, &e);
    fprintf(stderr, "  G=%d n=%lld in=%lld r=%lld: y %.2e lu %.2e dx %.2e ga %.2e gb %.2e\n", c->G, (long long)c->n,
            (long long)c->in, (long long)c->r, e.y, e.lu, e.dx, e.ga, e.gb);
    assert_true(e.y <= TOL_LORA_BF16 && e.lu <= TOL_LORA_BF16 && e.dx <= TOL_LORA_BF16);
    assert_true(e.ga <= TOL_LORA_BF16 && e.gb <= TOL_LORA_BF16);
}

static void fused_group_of_three(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_lora_case c = {3, {256, 64, 64}, {1, 1, 1}, 256, 1100, 8, 2.0f, 0.0f, 1, 0, 0, LT_DTYPE_BF16};
    check(&c, &rng);
    c.adapted[1] = 0; /* k without an adapter inside the group */
    c.beta = 1.0f;
    check(&c, &rng);
}

static void fused_single_and_rank16(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 1;
    lt_lora_case c = {1, {512, 0, 0}, {1, 0, 0}, 128, 1030, 16, 0.5f, 1.0f, 0, 0, 0, LT_DTYPE_BF16};
    check(&c, &rng);
    c.beta = 0.0f; /* alone with beta 0: dx written by the rank update, the base accumulates */
    check(&c, &rng);
    lt_lora_case p = {2, {384, 384, 0}, {1, 1, 0}, 128, 700, 4, 1.0f, 0.0f, 0, 0, 1, LT_DTYPE_F32};
    check(&p, &rng);
}

static void fallbacks(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 2;
    lt_lora_case a = {2, {96, 96, 0}, {1, 1, 0}, 64, 300, 6, 2.0f, 0.0f, 0, 0, 0, LT_DTYPE_BF16}; /* rank 6 */
    check(&a, &rng);
    lt_lora_case b = {1, {64, 0, 0}, {1, 0, 0}, 36, 200, 8, 2.0f, 1.0f, 1, 0, 0, LT_DTYPE_F32}; /* in % 8 != 0 */
    check(&b, &rng);
    lt_lora_case d = {1, {128, 0, 0}, {1, 0, 0}, 64, 500, 8, 1.0f, 0.0f, 0, 1, 0, LT_DTYPE_BF16}; /* lu only */
    check(&d, &rng);
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fused_group_of_three),
        cmocka_unit_test(fused_single_and_rank16),
        cmocka_unit_test(fallbacks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) { return lt_test_cuda_skip(); }
#endif
