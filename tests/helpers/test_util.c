/* Shared test helpers (see test_util.h). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/rng.h"
#include "longtune/sysinfo.h"
#include "longtune/tensor.h"
#include "test_util.h"

uint64_t lt_test_seed(void) {
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *s = getenv("LONGTUNE_TEST_SEED");
        seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
        fprintf(stderr, "test seed: %llu (replay with LONGTUNE_TEST_SEED)\n", (unsigned long long)seed);
        done = 1;
    }
    return seed;
}

/* The library's generator, so tests and library code that share a seed see the same stream. */
uint64_t lt_test_rand_u64(uint64_t *state) { return lt_splitmix64(state); }

double lt_test_uniform(uint64_t *state, double lo, double hi) {
    return lo + (hi - lo) * (double)(lt_test_rand_u64(state) >> 11) * 0x1.0p-53;
}

double lt_test_normal(uint64_t *state) {
    double u1 = lt_test_uniform(state, 1e-300, 1.0), u2 = lt_test_uniform(state, 0, 1.0);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

void lt_test_fill_normal(uint64_t *state, float *x, int64_t n, float stddev) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)lt_test_normal(state) * stddev;
}

int lt_test_cuda_skip(void) {
    if (lt_sys_cuda().count > 0) return 0;
    printf("skipped: no CUDA device%s\n", LT_HAVE_CUDA ? "" : " (this build has no CUDA)");
    return 77;
}

float *lt_test_fresh(uint64_t *state, int64_t n, float sd) {
    float *x = malloc((size_t)n * sizeof *x);
    lt_test_fill_normal(state, x, n, sd);
    return x;
}

float *lt_test_poisoned(int64_t n) {
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = LT_TEST_POISON;
    return x;
}

void lt_test_close_to(double got, double want, double scale, double rel, const char *what, int64_t i) {
    double tol = rel * (fabs(want) + scale) + LT_TOL_F32_ABS;
    if (!(fabs(got - want) <= tol)) {
        fprintf(stderr, "%s[%lld]: got %.9g want %.9g (tol %.3g)\n", what, (long long)i, got, want, tol);
        fail();
    }
}

double lt_test_bf16_round(double x) { return (double)lt_bf16_to_f32(lt_f32_to_bf16((float)x)); }

double lt_test_rel_err_f(const float *x, const double *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return INFINITY;
        e = fmax(e, fabs(x[i] - ref[i]));
        r = fmax(r, fabs(ref[i]));
    }
    return r > 0 ? e / r : e;
}

double lt_test_rel_err_d(const double *x, const double *ref, int64_t n) {
    double e = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        e = fmax(e, fabs(x[i] - ref[i]));
        r = fmax(r, fabs(ref[i]));
    }
    return r > 0 ? e / r : e;
}

void lt_test_omp_passive(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv);
}

int lt_test_rm_tree(const char *dir) {
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : 1;
}

const char *lt_test_source_dir(void) {
    const char *s = getenv("LONGTUNE_SOURCE_DIR");
    return s ? s : LT_SOURCE_DIR;
}
