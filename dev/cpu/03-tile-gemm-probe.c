/* Lab probe: the flash attention tiles' GEMM (src/backend/cpu/tile_gemm.c) on one core, in cache, at
 * the tile shapes of a SmolLM2-135M step (G = 3 query heads per kv head, D = 64, forward tiles of 32
 * tokens against 64 keys, backward tiles of 64 tokens), on each path (AVX2, AVX-512). Not built by
 * CMake. Build from the repository root:
 *   gcc -O2 -I src dev/cpu/03-tile-gemm-probe.c src/backend/cpu/tile_gemm.c \
 *       -I/usr/include/x86_64-linux-gnu/openblas-openmp -L/usr/lib/x86_64-linux-gnu/openblas-openmp \
 *       -lopenblas -o tile-probe
 * Prints the best of 200 rounds of 20 calls per shape and path, GFLOP/s. Measured on the 2-core AMD
 * EPYC (Zen 4) VM: AVX2 93-104 GFLOP/s, AVX-512 105-115 (8 x 32 blocks). On the 2-core Xeon
 * (Sapphire Rapids) VM, two runs each: AVX2 102-107; AVX-512 148-173 with the 8 x 32 blocks alone,
 * 177-190 with the 6 x 64 blocks for full 64-column tiles (OpenBLAS's sgemm reaches about 222 on a
 * core there at 256 x 256 x 256). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/tile_gemm.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(void) {
    float *A = malloc(4u << 20), *B = malloc(4u << 20), *C = malloc(4u << 20);
    for (int i = 0; i < (1 << 20); i++) A[i] = B[i] = C[i] = (float)(i % 97) * 0.01f;
    static const struct {
        int ta, M, N, K, lda, ldb;
        const char *what;
    } s[] = {
        {0, 96, 64, 64, 64, 2080, "fwd S = Q.Kt"},
        {0, 96, 64, 64, 64, 64, "fwd O += P.V"},
        {0, 192, 64, 64, 64, 64, "bwd S, dP, dQ"},
        {1, 64, 64, 192, 64, 64, "bwd dV, dK"},
    };
    static const int paths[] = {LT_TILE_PATH_AVX2, LT_TILE_PATH_AVX512};
    for (int p = 0; p < 2; p++)
        for (size_t i = 0; i < sizeof s / sizeof *s; i++) {
            double best = 1e9;
            for (int r = 0; r < 200; r++) {
                const double t0 = now();
                for (int q = 0; q < 20; q++)
                    lt_cpu_tile_gemm_on(paths[p], s[i].ta, s[i].M, s[i].N, s[i].K, 1.0f, A, s[i].lda, B, s[i].ldb, 1.0f,
                                        C, 64);
                const double dt = (now() - t0) / 20;
                if (dt < best) best = dt;
            }
            printf("%-7s %-14s %7.2f us %6.1f GFLOP/s\n", p ? "avx512" : "avx2", s[i].what, best * 1e6,
                   2.0 * s[i].M * s[i].N * s[i].K / best * 1e-9);
        }
    free(A), free(B), free(C);
    return 0;
}
