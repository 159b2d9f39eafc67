/* Shared test helpers (see test_util.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

uint64_t lt_test_rand_u64(uint64_t *state) { /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

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

const char *lt_test_source_dir(void) {
    const char *s = getenv("LONGTUNE_SOURCE_DIR");
    return s ? s : LT_SOURCE_DIR;
}
