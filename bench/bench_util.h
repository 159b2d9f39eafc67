/* Shared benchmark plumbing: timing with medians over repeated runs, provenance (commit, date,
 * machine) and the result file format of conventions.md:
 *   { "bench", "commit", "date", "machine": {cpu, cores, gpu, driver, cuda}, "config": {...},
 *     "arms": [ { "name", "median_ms", ... } ] }
 * written to <out>/<bench>-<tag>.json (default out: bench/results/) and, with --json, to stdout. */
#ifndef LT_BENCH_UTIL_H
#define LT_BENCH_UTIL_H

#include <cjson/cJSON.h>
#include <stdint.h>

#define LT_BENCH(name, fn, summary) int fn(int argc, char **argv);
#include "benches.h"
#undef LT_BENCH

/* Common flags every bench takes. */
typedef struct lt_bench_common {
    int json;          /* --json: print the result object on stdout */
    const char *out;   /* --out DIR (default bench/results) */
    int repeats;       /* --repeats N (default 5) */
    int warmup;        /* --warmup N (default 1) */
    const char *backend; /* --backend cpu|cuda (default cpu) */
} lt_bench_common;

/* Consumes the common flags at argv[*i] (advancing *i) and returns 1, or returns 0 if argv[*i] is
 * not a common flag; -1 on a malformed value. */
int lt_bench_common_flag(lt_bench_common *c, int argc, char **argv, int *i);
void lt_bench_common_init(lt_bench_common *c);
#define LT_BENCH_COMMON_HELP \
    "  --json           print the result JSON on stdout\n" \
    "  --out DIR        where to write the result file (default bench/results)\n" \
    "  --repeats N      timed repetitions; the median is reported (default 5)\n" \
    "  --warmup N       untimed repetitions first (default 1)\n" \
    "  --backend B      cpu | cuda (default cpu)\n"

/* Median of n values (the array is sorted in place). */
double lt_bench_median(double *v, int n);

/* New result object with bench name, commit (git rev-parse or LONGTUNE_COMMIT), UTC date and
 * machine description filled; add "config" and "arms" then call lt_bench_write. */
cJSON *lt_bench_result_new(const char *bench);
/* Writes <out>/<bench>[-<tag>].json atomically (temp + rename) and prints it with --json;
 * frees `result`. Returns 0 on success. */
int lt_bench_write(const lt_bench_common *c, cJSON *result, const char *tag);

/* OpenBLAS sgemm GFLOP/s at M=N=K=n with `threads` threads (0 = default), median of repeats:
 * the machine's CPU ceiling that other benches report ratios to. */
double lt_bench_sgemm_gflops(int n, int repeats, int threads);

#endif
