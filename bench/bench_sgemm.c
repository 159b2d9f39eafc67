/* `longtune bench sgemm`: OpenBLAS sgemm GFLOP/s at square sizes, the CPU ceiling other benches
 * report ratios to. */
#include <stdio.h>

#include "bench.h"

int lt_bench_sgemm(int argc, char **argv) {
    lt_bench_common c;
    lt_bench_common_init(&c);
    const int parsed = lt_bench_parse_args("sgemm", NULL, argc, argv, &c, LT_BENCH_COMMON_ALL, NULL, 0);
    if (parsed == LT_BENCH_ARGS_HELP) {
        printf("usage: longtune bench sgemm [options]\n\nOpenBLAS sgemm rate at n = 512, 1024, "
               "2048 (C = A·Bᵀ, f32).\n\noptions:\n" LT_BENCH_COMMON_HELP);
        return 0;
    }
    if (parsed) return parsed;
    cJSON *r = lt_bench_result_new("sgemm");
    cJSON *arms = cJSON_AddArrayToObject(r, "arms");
    const int sizes[] = {512, 1024, 2048};
    for (int s = 0; s < 3; s++) {
        double g = lt_bench_sgemm_gflops(sizes[s], c.repeats, 0);
        cJSON *a = cJSON_CreateObject();
        char name[32];
        snprintf(name, sizeof name, "sgemm-%d", sizes[s]);
        cJSON_AddStringToObject(a, "name", name);
        cJSON_AddNumberToObject(a, "n", sizes[s]);
        cJSON_AddNumberToObject(a, "gflops", g);
        cJSON_AddNumberToObject(a, "median_ms", 2.0 * sizes[s] * (double)sizes[s] * sizes[s] / g * 1e-6);
        cJSON_AddItemToArray(arms, a);
        fprintf(stderr, "sgemm n=%d: %.1f GFLOP/s\n", sizes[s], g);
    }
    return lt_bench_write(&c, r, NULL);
}
