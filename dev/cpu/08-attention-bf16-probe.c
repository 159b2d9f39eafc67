/* Lab probe: the flash attention tiles' products with bf16 operands (src/backend/cpu/tile_gemm_bf16.c)
 * against the f32 tile products (tile_gemm.c) on one core, in cache, at the tile shapes of a
 * SmolLM2-135M step (G = 3: forward 96 x 128 x 64 and 96 x 64 x 128, backward 192 x 64 x 64 and
 * the transposed 64 x 64 x 192) and of a GQA-4 head dim 128 (384 x 128 x 128). The paths: f32,
 * bf16 on rounded f32 copies ("rounded", what a CPU without AMX or AVX512-BF16 runs), and AMX and
 * AVX512-BF16 where the CPU has them, packing included.
 * Not built by CMake. Build from the repository root:
 *   gcc -O3 -std=c11 -I include -I src dev/cpu/08-attention-bf16-probe.c src/backend/cpu/tile_gemm.c \
 *       src/backend/cpu/tile_gemm_bf16.c -lopenblas -lpthread -o attn-bf16-probe
 * Prints the mean of 2000 calls per shape and path. On the 2-core Xeon (Sapphire Rapids) VM, two
 * runs: f32 7.2-9.2 µs on the SmolLM2 shapes (170-218 GFLOP/s), rounded 10.0-12.2 µs, AMX
 * 2.8-3.7 µs (422-557 GFLOP/s); at 384 x 128 x 128 and its transpose f32 62-70 µs, AMX 17-20 µs.
 * On the 2-core EPYC (Zen 4, no AMX) VM: f32 13.6-14.2 µs on the SmolLM2 shapes, rounded 16.7-18.1,
 * AVX512-BF16 8.8-11.5 µs; at 384 x 128 x 128 and its transpose f32 110-111, AVX512-BF16 64-65. */
#define _POSIX_C_SOURCE 200809L
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
    static const int shapes[][4] = {{0, 96, 128, 64}, {0, 96, 64, 128},   {0, 192, 64, 64},
                                    {1, 64, 64, 192}, {0, 384, 128, 128}, {1, 128, 128, 384}};
    const size_t n = 1 << 20;
    float *A = malloc(4 * n), *B = malloc(4 * n), *C = malloc(4 * n);
    void *pack = malloc(8 << 20);
    if (!A || !B || !C || !pack) return 1;
    for (size_t i = 0; i < n; i++) {
        A[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        B[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        C[i] = 0;
    }
    static const char *names[] = {"f32", "rounded", "amx", "avx512-bf16"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int ta = shapes[s][0], M = shapes[s][1], N = shapes[s][2], K = shapes[s][3], lda = ta ? M : K;
        const double flop = 2.0 * M * N * K;
        const int calls = 2000;
        for (int path = 0; path < 4; path++) {
            /* path 0: f32; 1 + LT_TILE_BF16_ROUNDED / _AMX / _DP: the bf16 paths this CPU has */
            if (path > 0 && !lt_cpu_tile_gemm_bf16_has(path - 1)) continue;
            const double t0 = now();
            for (int r = 0; r < calls; r++) {
                if (path == 0) lt_cpu_tile_gemm(ta, M, N, K, 1, A, lda, B, N, 1, C, N);
                else lt_cpu_tile_gemm_bf16_on(path - 1, ta, M, N, K, 1, A, lda, B, N, 1, C, N, pack);
            }
            const double t = (now() - t0) / calls;
            printf("ta=%d %4d x %4d x %4d %-8s %8.2f us %7.1f GFLOP/s\n", ta, M, N, K, names[path], t * 1e6,
                   flop / t * 1e-9);
        }
    }
    free(A), free(B), free(C), free(pack);
    return 0;
}
