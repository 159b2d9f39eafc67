/* The machine's CPU ceiling: OpenBLAS sgemm at a square shape (see bench_lib.h). */
#include <stdlib.h>

#include <cblas.h>

#include "bench_lib.h"

typedef struct sgemm_job {
    int n;
    const float *a, *b;
    float *c;
} sgemm_job;

static int sgemm_once(void *arg) {
    const sgemm_job *j = arg;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->n, j->n, j->n, 1.0f, j->a, j->n, j->b, j->n, 0.0f, j->c,
                j->n);
    return 0;
}

double lt_bench_sgemm_gflops(int n, int repeats, int threads) {
    size_t sz = (size_t)n * (size_t)n;
    float *a = malloc(sz * 4), *b = malloc(sz * 4), *cm = malloc(sz * 4);
    double gflops = 0;
    if (a && b && cm) {
        for (size_t i = 0; i < sz; i++) {
            a[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            b[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
        }
        if (threads > 0) openblas_set_num_threads(threads);
        sgemm_job j = {n, a, b, cm};
        const double med = lt_bench_time(1, repeats, sgemm_once, &j);
        if (med > 0) gflops = 2.0 * n * (double)n * n / med * 1e-9;
    }
    free(a), free(b), free(cm);
    return gflops;
}
