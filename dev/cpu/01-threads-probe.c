/* Lab probe for the CPU trainer's thread scaling: the cost of one OpenMP fork-join at the
 * machine's thread count, and OpenBLAS sgemm rates at the SmolLM2-135M step's shapes (N = 512
 * tokens; C = 576, F = 1536, LoRA rank 8) run (a) by OpenBLAS's own threads and (b) split into column
 * blocks over an OpenMP team with OpenBLAS single-threaded inside. Not built by CMake; prints one
 * line per measurement. Build: gcc -O2 -fopenmp 01-threads-probe.c -lopenblas -o probe. Run it once
 * per OMP_WAIT_POLICY / GOMP_SPINCOUNT setting (libgomp reads them at start-up). */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void openblas_set_num_threads(int);

static double now(void) { return omp_get_wtime(); }

static volatile float sink;

/* The median-free mean over reps after one warm call: enough for a ranking. */
static double region_us(int nt, int reps, int work) {
    float part[256] = {0};
    double t0 = 0;
    for (int r = -1; r < reps; r++) {
        if (r == 0) t0 = now();
#pragma omp parallel num_threads(nt)
        {
            int t = omp_get_thread_num();
            float acc = 0;
            for (int i = 0; i < work; i++) acc += (float)i * 1e-9f;
            part[t] += acc;
        }
    }
    sink = part[0];
    return (now() - t0) / reps * 1e6;
}

typedef struct {
    int ta, tb, M, N, K;
    const char *what;
} shape;

static void split_gemm(const shape *s, const float *A, const float *B, float *C, int nt) {
    /* C (M, N) column blocks of 16-multiple width per thread; B is (N, K) when tb, else (K, N). */
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
#pragma omp parallel num_threads(nt)
    {
        int t = omp_get_thread_num(), n = omp_get_num_threads();
        int blocks = (s->N + 15) / 16, b0 = blocks * t / n, b1 = blocks * (t + 1) / n;
        int c0 = b0 * 16, c1 = b1 * 16 < s->N ? b1 * 16 : s->N;
        if (c1 > c0)
            cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->M,
                        c1 - c0, s->K, 1.0f, A, lda, s->tb ? B + (size_t)c0 * (size_t)ldb : B + c0, ldb, 0.0f, C + c0,
                        s->N);
    }
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    setvbuf(stdout, NULL, _IOLBF, 0); /* lines survive a timeout's kill */
    printf("threads %d  OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s\n", nt,
           getenv("OMP_WAIT_POLICY") ? getenv("OMP_WAIT_POLICY") : "-",
           getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "-");
    for (int w = 0; w <= 20000; w += 20000) {
        printf("region fork-join (%5d adds/thread): ", w);
        for (int k = 2; k <= nt; k *= 2) printf(" %2d thr %6.1f us", k, region_us(k, 2000, w));
        printf("\n");
    }
    static const shape shapes[] = {
        {0, 1, 512, 576, 576, "x·Wᵀ q/o (512x576x576)"},       {0, 1, 512, 192, 576, "x·Wᵀ k/v (512x192x576)"},
        {0, 1, 512, 1536, 576, "x·Wᵀ gate/up (512x1536x576)"}, {0, 1, 512, 576, 1536, "x·Wᵀ down (512x576x1536)"},
        {0, 0, 512, 576, 576, "dy·W q/o (512x576x576)"},       {0, 0, 512, 576, 1536, "dy·W gate/up (512x576x1536)"},
        {0, 0, 512, 1536, 576, "dy·W down (512x1536x576)"},    {0, 1, 512, 576, 8, "lu·Bᵀ rank 8 (512x576x8)"},
        {0, 1, 512, 1536, 8, "lu·Bᵀ rank 8 (512x1536x8)"},     {0, 1, 2048, 576, 576, "x·Wᵀ q/o T=2048"},
        {0, 1, 2048, 1536, 576, "x·Wᵀ gate/up T=2048"},
    };
    size_t maxf = 2048 * 1536;
    float *A = malloc(maxf * 4), *B = malloc(maxf * 4), *C = malloc(maxf * 4);
    for (size_t i = 0; i < maxf; i++) A[i] = B[i] = (float)(i % 97) * 0.01f;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        double flop = 2.0 * s->M * s->N * s->K;
        int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
        double best[3] = {1e9, 1e9, 1e9};
        for (int mode = 0; mode < 3; mode++) {
            for (int r = 0; r < 12; r++) {
                double t0 = now();
                if (mode == 0 || mode == 1) {
                    openblas_set_num_threads(mode == 0 ? nt : 1);
                    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                                s->M, s->N, s->K, 1.0f, A, lda, B, ldb, 0.0f, C, s->N);
                } else {
                    openblas_set_num_threads(1);
                    split_gemm(s, A, B, C, nt);
                }
                double dt = now() - t0;
                if (r >= 2 && dt < best[mode]) best[mode] = dt;
            }
        }
        printf(
            "%-30s openblas %2d thr %7.1f us %6.1f GF/s | 1 thr %7.1f us %6.1f GF/s | split %2d thr %7.1f us %6.1f GF/s\n",
            s->what, nt, best[0] * 1e6, flop / best[0] * 1e-9, best[1] * 1e6, flop / best[1] * 1e-9, nt, best[2] * 1e6,
            flop / best[2] * 1e-9);
    }
    free(A), free(B), free(C);
    return 0;
}
