/* Lab probe: the LoRA adapters' thin products (rank r = 8) at the four projection shapes of a
 * SmolLM2-135M step, through the library's lt_cpu_gemm (its AVX-512 row dots, column sums and
 * rank-r updates, src/backend/cpu/ops_matmul.c) and through OpenBLAS's cblas_sgemm, on the threads
 * given. Not built by CMake. Build from the repository root after a release build in build/:
 *   gcc -O2 -I include -I src dev/cpu/05-lora-thin-probe.c build/liblongtune.a \
 *       -lopenblas -fopenmp -lpcre2-8 -lcjson -lm -o thin-probe
 *   OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=20000 ./thin-probe 2048 2
 * (tokens, threads). Prints the best of 9 warm calls per product, ms and the GB/s of the wide
 * operand's traffic, and each path's total over the 24 products. Measured on the 2-core Xeon
 * (Sapphire Rapids) VM, 2 threads, four runs a side: at 2048 tokens 5.7-7.7 ms with loops taking
 * one row a pass and 64-row column-sum blocks, 4.2-4.8 ms with three rows a pass, 16-row blocks
 * and items balanced over the threads (OpenBLAS 0.3.21: 10.9-11.5 ms); at 512 tokens 1.34-1.40
 * against 0.87-0.93 ms (OpenBLAS 2.4). */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/cpu_ops.h"
#include "longtune.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float *rnd(int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) exit(1);
    for (int64_t i = 0; i < n; i++) p[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    return p;
}

/* C (M, N) = alpha·op(A)·op(B) + beta·C, row-major, on the library or on OpenBLAS. */
static void gemm(lt_ctx *ctx, int blas, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                 int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (!blas) {
        lt_cpu_gemm(ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M, (blasint)N,
                (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : 2048, r = 8;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    lt_ctx *ctx = lt_ctx_new();
    if (!ctx) return 1;
    lt_ctx_set_threads(ctx, threads);
    openblas_set_num_threads(threads);
    static const int64_t shapes[4][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}}; /* out, in */
    static const char *names[6] = {"lu = x·Aᵀ",  "y += lu·Bᵀ",   "gB = dyᵀ·lu",
                                   "dlu = dy·B", "gA += dluᵀ·x", "dx += dlu·A"};
    for (int blas = 0; blas < 2; blas++) {
        double total = 0;
        printf("%s, %lld tokens, %d threads\n", blas ? "OpenBLAS" : "lt_cpu_gemm", (long long)n, threads);
        for (int s = 0; s < 4; s++) {
            const int64_t out = shapes[s][0], in = shapes[s][1];
            float *x = rnd(n * in), *A = rnd(r * in), *B = rnd(out * r), *lu = rnd(n * r), *y = rnd(n * out);
            float *dy = rnd(n * out), *gb = rnd(out * r), *dlu = rnd(n * r), *ga = rnd(r * in), *dx = rnd(n * in);
            printf("  out %lld, in %lld\n", (long long)out, (long long)in);
            for (int op = 0; op < 6; op++) {
                double best = 1e9;
                for (int it = 0; it < 10; it++) {
                    const double t0 = now();
                    switch (op) {
                    case 0: gemm(ctx, blas, 0, 1, n, r, in, 1.0f, x, in, A, in, 0.0f, lu, r); break;
                    case 1: gemm(ctx, blas, 0, 1, n, out, r, 1.0f, lu, r, B, r, 0.0f, y, out); break;
                    case 2: gemm(ctx, blas, 1, 0, out, r, n, 1.0f, dy, out, lu, r, 1.0f, gb, r); break;
                    case 3: gemm(ctx, blas, 0, 0, n, r, out, 1.0f, dy, out, B, r, 0.0f, dlu, r); break;
                    case 4: gemm(ctx, blas, 1, 0, r, in, n, 1.0f, dlu, r, x, in, 1.0f, ga, in); break;
                    default: gemm(ctx, blas, 0, 0, n, in, r, 1.0f, dlu, r, A, in, 1.0f, dx, in); break;
                    }
                    const double t = now() - t0;
                    if (it && t < best) best = t; /* the first call warms the operands */
                }
                const double wide = (double)n * (double)(op == 0 || op == 4 ? in : op == 5 ? 2 * in : out);
                printf("    %-14s %7.3f ms %6.1f GB/s\n", names[op], best * 1e3, wide * 4.0 / best * 1e-9);
                total += best;
            }
            free(x), free(A), free(B), free(lu), free(y), free(dy), free(gb), free(dlu), free(ga), free(dx);
        }
        printf("  total %.3f ms\n", total * 1e3);
    }
    lt_ctx_free(ctx);
    return 0;
}
