/* The CPU backend's weight products and LoRA GEMMs give bit-identical results for every thread count
 * (the trainer's exact resume and its determinism rest on it), at the SmolLM2 shapes' kinds of
 * widths (multiples of 16 and not) and row counts that do not divide into the thread grid. The
 * values themselves are checked against float64 in the op matrix (test_backend_ops.c); here only
 * 1 thread vs several. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "helpers/test_util.h"

static const lt_backend *be(void) { return lt_backend_get(LT_DEVICE_CPU); }

static void f32_matmul_same_for_any_thread_count(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    /* (N, out, in): wide enough for column blocks, narrow (k/v-like) ones that split rows, odd sizes */
    static const int64_t shapes[][3] = {{260, 400, 200}, {300, 96, 200}, {77, 320, 96}, {45, 200, 70}, {9, 33, 17}};
    static const int threads[] = {2, 3, 4, 7, 16};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
        for (int nn = 0; nn < 2; nn++)
            for (int bz = 0; bz < 2; bz++) {
                const int64_t N = shapes[si][0], out = shapes[si][1], in = shapes[si][2];
                const int64_t xw = nn ? out : in, yw = nn ? in : out;
                float *W = lt_test_fresh(&rng, out * in, 0.5f), *x = lt_test_fresh(&rng, N * xw, 1.0f);
                float *y0 = lt_test_fresh(&rng, N * yw, 1.0f), *ref = malloc((size_t)(N * yw) * 4);
                float *y = malloc((size_t)(N * yw) * 4);
                int64_t shape[2] = {out, in};
                lt_tensor w = lt_tensor_view(W, LT_DTYPE_F32, LT_DEVICE_CPU, 2, shape);
                const float beta = bz ? 0.0f : 1.0f;
                lt_matmul_mode mode = nn ? LT_MATMUL_NN : LT_MATMUL_NT;
                lt_ctx_set_threads(ctx, 1);
                memcpy(ref, y0, (size_t)(N * yw) * 4);
                be()->matmul(ctx, mode, &w, x, N, beta, ref, NULL);
                for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
                    lt_ctx_set_threads(ctx, threads[ti]);
                    memcpy(y, y0, (size_t)(N * yw) * 4);
                    be()->matmul(ctx, mode, &w, x, N, beta, y, NULL);
                    if (memcmp(y, ref, (size_t)(N * yw) * 4)) {
                        fail_msg("matmul %s N=%lld out=%lld in=%lld beta=%g: %d threads differ from 1",
                                 nn ? "NN" : "NT", (long long)N, (long long)out, (long long)in, (double)beta,
                                 threads[ti]);
                    }
                }
                free(W), free(x), free(y0), free(ref), free(y);
            }
    lt_ctx_free(ctx);
}

/* The adapters' products: x·Aᵀ (N, r), lu·Bᵀ (N, out), dyᵀ·lu (out, r), dy·B (N, r), dluᵀ·x (r, in),
 * dlu·A (N, in), at r = 8 and 16. */
static void lora_gemms_same_for_any_thread_count(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 1;
    lt_ctx *ctx = lt_ctx_new();
    static const int threads[] = {2, 3, 5, 16};
    static const int64_t ranks[] = {8, 16};
    const int64_t N = 150, out = 200, in = 72;
    for (size_t ri = 0; ri < sizeof ranks / sizeof *ranks; ri++) {
        const int64_t r = ranks[ri];
        /* {ta, tb, M, N, K} as the model calls them */
        const int64_t calls[][5] = {{0, 1, N, r, in},  {0, 1, N, out, r}, {1, 0, out, r, N},
                                    {0, 0, N, r, out}, {1, 0, r, in, N},  {0, 0, N, in, r}};
        for (size_t ci = 0; ci < sizeof calls / sizeof *calls; ci++) {
            const int ta = (int)calls[ci][0], tb = (int)calls[ci][1];
            const int64_t M = calls[ci][2], Nc = calls[ci][3], K = calls[ci][4];
            const int64_t lda = ta ? M : K, ldb = tb ? K : Nc;
            float *A = lt_test_fresh(&rng, (ta ? K : M) * lda, 1.0f),
                  *B = lt_test_fresh(&rng, (tb ? Nc : K) * ldb, 1.0f);
            float *C0 = lt_test_fresh(&rng, M * Nc, 1.0f), *ref = malloc((size_t)(M * Nc) * 4);
            float *C = malloc((size_t)(M * Nc) * 4);
            lt_ctx_set_threads(ctx, 1);
            memcpy(ref, C0, (size_t)(M * Nc) * 4);
            be()->gemm(ctx, ta, tb, M, Nc, K, 0.5f, A, lda, B, ldb, 1.0f, ref, Nc);
            for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
                lt_ctx_set_threads(ctx, threads[ti]);
                memcpy(C, C0, (size_t)(M * Nc) * 4);
                be()->gemm(ctx, ta, tb, M, Nc, K, 0.5f, A, lda, B, ldb, 1.0f, C, Nc);
                if (memcmp(C, ref, (size_t)(M * Nc) * 4))
                    fail_msg("gemm ta=%d tb=%d (%lld x %lld x %lld): %d threads differ from 1", ta, tb, (long long)M,
                             (long long)Nc, (long long)K, threads[ti]);
            }
            free(A), free(B), free(C0), free(ref), free(C);
        }
    }
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f32_matmul_same_for_any_thread_count),
        cmocka_unit_test(lora_gemms_same_for_any_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
