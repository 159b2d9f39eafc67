/* The CPU attention tiles' GEMM (src/backend/cpu/tile_gemm.c) against float64 on fresh random
 * inputs, on every path the CPU has (AVX-512, AVX2, OpenBLAS): op(A) as given and transposed, alpha
 * and beta (beta = 0 must not read C: C starts poisoned), row counts around the 6- and 8-row blocks,
 * column counts around the 8-, 16- and 32-wide vectors (masked tails) and the 64-wide blocks (full
 * blocks followed by narrower ones), depths from 0 to the tiles' 192, and leading dimensions wider
 * than the operands. The AVX-512 and AVX2 paths sum in the same
 * order, so they must agree bit for bit. The bf16 variant (tile_gemm_bf16.c) against float64
 * products of the operands rounded to bf16, at f32 tolerance, on each of its paths the CPU has
 * (AMX, AVX512-BF16, rounded f32), through the unpacked call and, on AMX and AVX512-BF16, through
 * packed operands with B as panels and as pair rows, with depths around the 32-deep chunks and
 * sizes around the 32 x 32 and 8 x 32 blocks; and it must differ from the unrounded product, so
 * the rounding is known to happen. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/cpu/tile_gemm.h"
#include "helpers/backends.h"
#include "helpers/test_util.h"

static void check_case(uint64_t *rng, int ta, int64_t M, int64_t N, int64_t K, float alpha, float beta) {
    const int64_t lda = (ta ? M : K) + 3, ldb = N + 5, ldc = N + 2;
    const int64_t arows = ta ? K : M;
    float *A = lt_test_fresh(rng, (arows > 0 ? arows : 1) * lda, 1.0f);
    float *B = lt_test_fresh(rng, (K > 0 ? K : 1) * ldb, 1.0f);
    float *C = beta == 0.0f ? lt_test_poisoned(M * ldc) : lt_test_fresh(rng, M * ldc, 1.0f);
    double *want = malloc(sizeof(double) * (size_t)(M * N)), *scale = malloc(sizeof(double) * (size_t)(M * N));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                const double t = (double)(ta ? A[k * lda + i] : A[i * lda + k]) * (double)B[k * ldb + j];
                s += t, a += fabs(t);
            }
            const double c = beta == 0.0f ? 0.0 : (double)beta * (double)C[i * ldc + j];
            want[i * N + j] = (double)alpha * s + c;
            scale[i * N + j] = fabs((double)alpha) * a + fabs(c);
        }
    const double tol = lt_test_tol_for(LT_DTYPE_F32, K);
    float *C0 = malloc(sizeof(float) * (size_t)(M * ldc)), *first = malloc(sizeof(float) * (size_t)(M * ldc));
    memcpy(C0, C, sizeof(float) * (size_t)(M * ldc));
    static const int paths[] = {LT_TILE_PATH_AVX512, LT_TILE_PATH_AVX2, LT_TILE_PATH_BLAS};
    for (int p = 0; p < 3; p++) {
        memcpy(C, C0, sizeof(float) * (size_t)(M * ldc));
        lt_cpu_tile_gemm_on(paths[p], ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        char what[160];
        snprintf(what, sizeof what, "tile_gemm path %d ta=%d M=%lld N=%lld K=%lld alpha=%g beta=%g", paths[p], ta,
                 (long long)M, (long long)N, (long long)K, (double)alpha, (double)beta);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                lt_test_close_to(C[i * ldc + j], want[i * N + j], scale[i * N + j], tol, what, i * N + j);
        if (p == 0) memcpy(first, C, sizeof(float) * (size_t)(M * ldc));
        if (p == 1) /* AVX-512 (or its fallback) against AVX2: the same sums */
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++)
                    if (memcmp(&C[i * ldc + j], &first[i * ldc + j], sizeof(float)))
                        fail_msg("%s: AVX-512 and AVX2 differ at (%lld, %lld): %.9g vs %.9g", what, (long long)i,
                                 (long long)j, (double)first[i * ldc + j], (double)C[i * ldc + j]);
    }
    free(A), free(B), free(C), free(C0), free(first), free(want), free(scale);
}

static void tile_gemm_matches_float64(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    static const int64_t Ms[] = {1, 5, 6, 7, 8, 9, 13, 17, 64, 96, 192};
    static const int64_t Ns[] = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65, 96, 111, 128, 129};
    static const int64_t Ks[] = {0, 1, 3, 64, 192};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.125f, 0.0f}, {1.0f, 1.0f}, {0.7f, 0.5f}};
    for (int ta = 0; ta < 2; ta++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
                    const size_t c = (mi + ni + ki + (size_t)ta) % (sizeof ab / sizeof *ab);
                    check_case(&rng, ta, Ms[mi], Ns[ni], Ks[ki], ab[c][0], ab[c][1]);
                }
}

static const char *path_name(int path) {
    return path == LT_TILE_BF16_AMX ? "amx" : path == LT_TILE_BF16_DP ? "avx512-bf16" : "rounded";
}

static double bf16_of(float f) { return (double)lt_bf16_to_f32(lt_f32_to_bf16(f)); }

static int64_t up32(int64_t n) { return (n + 31) / 32 * 32; }

/* C = alpha·op(A)·B + beta·C through the packed operands: op(A) packed into rows wider than it
 * needs, B as panels (layout 1) or as pair rows at a stride wider than 2·up32(N) (layout 2). */
static void packed_product(int path, int layout, int ta, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    const int64_t Mp = up32(M), Kp = up32(K), Np = up32(N), ldp = Kp + 32, ldr = 2 * Np + 32;
    uint16_t *pa = malloc(sizeof(uint16_t) * (size_t)(Mp * ldp));
    uint16_t *pb = malloc(sizeof(uint16_t) * (layout == 1 ? lt_cpu_bf16_pack_b_elems(N, K) : (size_t)(Kp / 2 * ldr)));
    lt_cpu_bf16_pack_a(ta, A, lda, M, K, pa, ldp, Mp, Kp);
    if (layout == 1) {
        lt_cpu_bf16_pack_b(B, ldb, N, K, pb);
        lt_cpu_tile_gemm_bf16_packed_on(path, M, N, K, alpha, pa, ldp, pb, lt_cpu_bf16_panel_elems(K), 32, beta, C,
                                        ldc);
    } else {
        lt_cpu_bf16_pack_b_rows(B, ldb, N, K, pb, ldr, Kp / 2, Np);
        lt_cpu_tile_gemm_bf16_packed_on(path, M, N, K, alpha, pa, ldp, pb, 32, ldr, beta, C, ldc);
    }
    free(pa), free(pb);
}

/* Returns how many elements of C sit further from the unrounded product than the tolerance.
 * layout 0: the unpacked call; 1, 2: packed_product's. */
static int64_t check_bf16_case(uint64_t *rng, int path, int layout, int ta, int64_t M, int64_t N, int64_t K,
                               float alpha, float beta) {
    const int64_t lda = (ta ? M : K) + 3, ldb = N + 5, ldc = N + 2;
    const int64_t arows = ta ? K : M;
    float *A = lt_test_fresh(rng, arows * lda, 1.0f), *B = lt_test_fresh(rng, K * ldb, 1.0f);
    float *C = beta == 0.0f ? lt_test_poisoned(M * ldc) : lt_test_fresh(rng, M * ldc, 1.0f);
    double *want = malloc(sizeof(double) * (size_t)(M * N)), *exact = malloc(sizeof(double) * (size_t)(M * N));
    double *scale = malloc(sizeof(double) * (size_t)(M * N));
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, a = 0, e = 0;
            for (int64_t k = 0; k < K; k++) {
                const float av = ta ? A[k * lda + i] : A[i * lda + k], bv = B[k * ldb + j];
                const double t = bf16_of(av) * bf16_of(bv);
                s += t, a += fabs(t), e += (double)av * (double)bv;
            }
            const double c = beta == 0.0f ? 0.0 : (double)beta * (double)C[i * ldc + j];
            want[i * N + j] = (double)alpha * s + c;
            exact[i * N + j] = (double)alpha * e + c;
            scale[i * N + j] = fabs((double)alpha) * a + fabs(c);
        }
    const double tol = lt_test_tol_for(LT_DTYPE_F32, K);
    void *pack = layout ? NULL : malloc(lt_cpu_tile_gemm_bf16_pack_bytes(M, N, K)); /* the unpacked call's scratch */
    if (layout) packed_product(path, layout, ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else lt_cpu_tile_gemm_bf16_on(path, ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
    char what[160];
    snprintf(what, sizeof what, "tile_gemm_bf16 path=%s layout=%d ta=%d M=%lld N=%lld K=%lld alpha=%g beta=%g",
             path_name(path), layout, ta, (long long)M, (long long)N, (long long)K, (double)alpha, (double)beta);
    int64_t apart = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            lt_test_close_to(C[i * ldc + j], want[i * N + j], scale[i * N + j], tol, what, i * N + j);
            apart += fabs((double)C[i * ldc + j] - exact[i * N + j]) > tol * scale[i * N + j];
        }
    free(A), free(B), free(C), free(want), free(exact), free(scale), free(pack);
    return apart;
}

static void tile_gemm_bf16_matches_float64(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    static const int64_t Ms[] = {1, 15, 16, 17, 32, 33, 64, 192};
    static const int64_t Ns[] = {1, 16, 17, 31, 32, 33, 64, 65, 128};
    static const int64_t Ks[] = {1, 31, 32, 33, 64, 192};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.125f, 0.0f}, {1.0f, 1.0f}, {0.7f, 0.5f}};
    static const int paths[] = {LT_TILE_BF16_ROUNDED, LT_TILE_BF16_AMX, LT_TILE_BF16_DP};
    for (size_t pi = 0; pi < sizeof paths / sizeof *paths; pi++) {
        const int path = paths[pi];
        if (!lt_cpu_tile_gemm_bf16_has(path)) {
            print_message("tile_gemm_bf16: this CPU has no %s path; skipped\n", path_name(path));
            continue;
        }
        /* the packed operands exist on the AMX and AVX512-BF16 paths */
        for (int layout = 0; layout <= (path == LT_TILE_BF16_ROUNDED ? 0 : 2); layout++) {
            int64_t apart = 0;
            for (int ta = 0; ta < 2; ta++)
                for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
                    for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
                            const size_t c = (mi + ni + ki + (size_t)ta) % (sizeof ab / sizeof *ab);
                            apart +=
                                check_bf16_case(&rng, path, layout, ta, Ms[mi], Ns[ni], Ks[ki], ab[c][0], ab[c][1]);
                        }
            if (apart < 1000)
                fail_msg("tile_gemm_bf16 path=%s layout=%d: only %lld elements away from the unrounded product",
                         path_name(path), layout, (long long)apart);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(tile_gemm_matches_float64),
                                       cmocka_unit_test(tile_gemm_bf16_matches_float64)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
