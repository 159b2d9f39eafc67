/* Medians over repeated runs, and the parallel loop and thread count benches fill inputs with
 * (see bench_lib.h). */
#include <stdlib.h>

#include <omp.h>

#include "bench_lib.h"
#include "longtune/log.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double lt_bench_median(double *v, int n) {
    if (n <= 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double lt_bench_time(int warmup, int repeats, int (*fn)(void *arg), void *arg) {
    for (int r = 0; r < warmup; r++)
        if (fn(arg)) return -1;
    double *t = malloc(sizeof(double) * (size_t)(repeats > 0 ? repeats : 1));
    if (!t) return -1;
    for (int r = 0; r < repeats; r++) {
        const double t0 = lt_time_now();
        if (fn(arg)) {
            free(t);
            return -1;
        }
        t[r] = lt_time_now() - t0;
    }
    const double med = lt_bench_median(t, repeats);
    free(t);
    return med;
}

int lt_bench_threads(const lt_ctx *ctx) {
    const int t = ctx ? lt_ctx_threads(ctx) : 0;
    return t > 0 ? t : omp_get_max_threads();
}

void lt_bench_parallel_for(int threads, int64_t n, int64_t grain, lt_bench_range_fn fn, void *arg) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int nt = threads > 0 ? threads : omp_get_max_threads();
    const int64_t chunks = (n + grain - 1) / grain;
    if (chunks < nt) nt = (int)chunks;
    if (nt <= 1) {
        fn(arg, 0, n, 0);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
        if (begin < end) fn(arg, begin, end, t);
    }
}
