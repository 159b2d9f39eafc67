/* The benchmark library: common flags, timing with medians over repeats, the result file of
 * conventions.md with its provenance (the commit the build was configured at, UTC date, machine),
 * the OpenBLAS sgemm ceiling, and the small helpers benches share (a seeded generator, a parallel
 * loop). It uses only the public headers (include/longtune/) and is what bench code may use
 * besides them. Result file:
 *   { "bench", "commit", "date", "machine": {cpu, cores, gpu, driver, cuda}, "config": {...},
 *     "arms": [ { "name", "median_ms", ... } ] }
 * written to <out>/<bench>-<tag>.json (default out: bench/results/) and, with --json, to stdout. */
#ifndef LT_BENCH_LIB_H
#define LT_BENCH_LIB_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "longtune/status.h"

/* Common flags every bench takes. */
typedef struct lt_bench_common {
    int json;            /* --json: print the result object on stdout */
    const char *out;     /* --out DIR (default bench/results) */
    int repeats;         /* --repeats N (default 5) */
    int warmup;          /* --warmup N (default 1) */
    const char *backend; /* --backend cpu|cuda (default cpu) */
} lt_bench_common;

void lt_bench_common_init(lt_bench_common *c);
/* Consumes the common flag at argv[*i] (advancing *i past its value) and returns 1, returns 0 when
 * argv[*i] is not a common flag, -1 on a missing or malformed value. */
int lt_bench_common_flag(lt_bench_common *c, int argc, char **argv, int *i);
#define LT_BENCH_COMMON_HELP                                                      \
    "  --json           print the result JSON on stdout\n"                        \
    "  --out DIR        where to write the result file (default bench/results)\n" \
    "  --repeats N      timed repetitions; the median is reported (default 5)\n"  \
    "  --warmup N       untimed repetitions first (default 1)\n"                  \
    "  --backend B      cpu | cuda (default cpu)\n"

/* Median of n values (the array is sorted in place); 0 for n <= 0. */
double lt_bench_median(double *v, int n);
/* Median seconds of `repeats` timed calls of fn(arg) after `warmup` untimed ones; fn returns 0,
 * or non-zero to stop (then -1 is returned). */
double lt_bench_time(int warmup, int repeats, int (*fn)(void *arg), void *arg);

/* The commit this build was configured at (git's short hash, "-dirty" with local changes, or
 * "unknown" outside a git checkout), unless LONGTUNE_COMMIT overrides it. */
const char *lt_bench_commit(void);
/* New result object with bench name, commit, UTC date and the machine filled in; add "config" and
 * "arms", then call lt_bench_write. NULL when out of memory. */
cJSON *lt_bench_result_new(const char *bench);
/* The "machine" object: cpu, cores, host_memory_bytes, and gpu (null without one), gpu_memory_bytes,
 * driver, cuda. */
cJSON *lt_bench_machine(void);
/* Writes <out>/<bench>[-<tag>].json atomically (temporary, fsync, rename), prints it with --json,
 * and frees `result`. Returns 0 on success. */
int lt_bench_write(const lt_bench_common *c, cJSON *result, const char *tag);

/* OpenBLAS sgemm GFLOP/s at M = N = K = n on `threads` threads (0 = default), median of repeats:
 * the machine's CPU ceiling that other benches report ratios to. */
double lt_bench_sgemm_gflops(int n, int repeats, int threads);

/* SplitMix64: the seeded generator of bench inputs (the same stream as the library's). */
static inline uint64_t lt_bench_rand_u64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Threads a context's parallel loops run on (its setting, or the OpenMP default for 0). */
int lt_bench_threads(const lt_ctx *ctx);
/* fn(arg, begin, end, thread) over [0, n) in chunks of at least `grain` items on up to `threads`
 * threads (0 = the OpenMP default): for filling large inputs. */
typedef void (*lt_bench_range_fn)(void *arg, int64_t begin, int64_t end, int thread);
void lt_bench_parallel_for(int threads, int64_t n, int64_t grain, lt_bench_range_fn fn, void *arg);

#endif
