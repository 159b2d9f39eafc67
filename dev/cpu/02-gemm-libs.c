/* Lab probe: sgemm rates of two BLAS libraries at the SmolLM2-135M training step's exact shapes
 * (C = 576, Hkv·D = 192, F = 1536, the fused loss's 512 x 512 vocabulary tiles), one call on the
 * library's own threads, and per-thread single-threaded calls as the fused loss makes them.
 * Not built by CMake. Build once per library:
 *   gcc -O2 -fopenmp 02-gemm-libs.c -DUSE_BLIS -I/usr/include/x86_64-linux-gnu/blis-openmp \
 *       -L/usr/lib/x86_64-linux-gnu/blis-openmp -lblis -o probe-blis
 *   gcc -O2 -fopenmp 02-gemm-libs.c -I/usr/include/x86_64-linux-gnu/openblas-openmp \
 *       -L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -o probe-openblas
 * (BLIS from Debian's libblis-openmp-dev; add -Wl,-rpath to each library's folder.) Prints one line
 * per shape: the best of 15 calls after 3 warm ones, GFLOP/s. Also times the stacked forms (q, k, v
 * as one 960-wide product; gate and up as one 3072-wide product and its input gradient).
 * Measured on the 2-core AMD EPYC (Zen 4) VM, 2 threads: OpenBLAS 0.3.21 (Cooperlake kernels)
 * 190-200 GFLOP/s over the eight products at T = 512 and 2048 and the fused loss's tiles, BLIS 0.9
 * (zen kernels) 160-185; stacked q, k, v 1-7 % faster than the three products, stacked gate and up
 * no faster. */
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#if defined(USE_BLIS)
void bli_thread_set_num_threads(long);
static void set_threads(int n) { bli_thread_set_num_threads(n); }
static const char *lib = "blis";
#else
void openblas_set_num_threads(int);
static void set_threads(int n) { openblas_set_num_threads(n); }
static const char *lib = "openblas";
#endif

typedef struct {
    int ta, tb, M, N, K;
    const char *what;
} shape;

static void gemm(const shape *s, const float *A, const float *B, float *C) {
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, s->M, s->N, s->K,
                1.0f, A, lda, B, ldb, 0.0f, C, s->N);
}

int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 2, Ts[2] = {512, 2048};
    setvbuf(stdout, NULL, _IOLBF, 0);
    size_t maxf = (size_t)2048 * 3072;
    float *A = malloc(maxf * 4), *B = malloc(maxf * 4), *C = malloc(maxf * 4 * 2);
    for (size_t i = 0; i < maxf; i++) A[i] = B[i] = (float)(i % 97) * 0.01f;
    for (int ti = 0; ti < 2; ti++) {
        int T = Ts[ti];
        shape shapes[] = {
            {0, 1, T, 576, 576, "x.Wt q/o"},
            {0, 1, T, 192, 576, "x.Wt k/v"},
            {0, 1, T, 1536, 576, "x.Wt gate/up"},
            {0, 1, T, 576, 1536, "x.Wt down"},
            {0, 0, T, 576, 576, "dy.W q/o"},
            {0, 0, T, 576, 192, "dy.W k/v"},
            {0, 0, T, 576, 1536, "dy.W gate/up"},
            {0, 0, T, 1536, 576, "dy.W down"},
            {0, 1, T, 960, 576, "x.Wt qkv stacked"},
            {0, 1, T, 3072, 576, "x.Wt gate+up stacked"},
            {0, 0, T, 576, 3072, "dy.W gate+up stacked"},
        };
        double tot_flop = 0, tot_t = 0;
        for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
            const shape *s = &shapes[i];
            double flop = 2.0 * s->M * s->N * s->K, best = 1e9;
            set_threads(nt);
            for (int r = 0; r < 18; r++) {
                double t0 = omp_get_wtime();
                gemm(s, A, B, C);
                double dt = omp_get_wtime() - t0;
                if (r >= 3 && dt < best) best = dt;
            }
            if (i < 8) tot_flop += flop, tot_t += best;
            printf("%-8s T=%4d %-22s %5dx%5dx%5d  %8.1f us  %6.1f GF/s\n", lib, T, s->what, s->M, s->N, s->K,
                   best * 1e6, flop / best * 1e-9);
        }
        printf("%-8s T=%4d the eight unstacked products: %.1f GF/s\n", lib, T, tot_flop / tot_t * 1e-9);
    }
    /* The fused loss: every thread runs its own single-threaded 512 x 512 x 576 tiles. */
    shape lce[] = {{0, 1, 512, 512, 576, "lce logits NT"},
                   {0, 0, 512, 576, 512, "lce dh NN"},
                   {1, 0, 512, 576, 512, "lce dW TN"}};
    for (int i = 0; i < 3; i++) {
        const shape *s = &lce[i];
        double flop = 2.0 * s->M * s->N * s->K * nt, best = 1e9;
        set_threads(1);
        for (int r = 0; r < 18; r++) {
            double t0 = omp_get_wtime();
#pragma omp parallel num_threads(nt)
            {
                int t = omp_get_thread_num();
                gemm(s, A + (size_t)t * 512 * 576, B + (size_t)t * 512 * 576, C + (size_t)t * 512 * 576);
            }
            double dt = omp_get_wtime() - t0;
            if (r >= 3 && dt < best) best = dt;
        }
        printf("%-8s %d x 1-thread %-15s %5dx%5dx%5d  %8.1f us  %6.1f GF/s\n", lib, nt, s->what, s->M, s->N, s->K,
               best * 1e6, flop / best * 1e-9);
    }
    return 0;
}
