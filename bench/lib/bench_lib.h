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
    const char *suffix;  /* --name-suffix S: appended to the result file's name (NULL: none) */
} lt_bench_common;

void lt_bench_common_init(lt_bench_common *c);

/* A bench's own flags, one table row each, parsed by lt_bench_parse_args beside the common ones. */
typedef enum lt_bench_arg_kind {
    LT_BENCH_ARG_SET,    /* a switch without a value: *(int *)dst = lo */
    LT_BENCH_ARG_STR,    /* a non-empty string: *(const char **)dst points into argv */
    LT_BENCH_ARG_CHOICE, /* one of `choices` ("a|b|c"): *(const char **)dst points into argv */
    LT_BENCH_ARG_INT,    /* a whole number in [lo, hi] into int */
    LT_BENCH_ARG_I64,    /* a whole number in [lo, hi] into int64_t */
    LT_BENCH_ARG_U64,    /* a whole number in [lo, hi] into uint64_t */
    LT_BENCH_ARG_F64,    /* a number in [lo, hi] into double */
    LT_BENCH_ARG_BYTES,  /* "4096", "64M", "120G" (binary units, > 0) into uint64_t */
    LT_BENCH_ARG_LIST,   /* comma list of 1..max whole numbers in [lo, hi] into int64_t[max], count into *count */
    LT_BENCH_ARG_FN,     /* parse(value, dst): NULL, or what the value should have been */
} lt_bench_arg_kind;

typedef struct lt_bench_arg {
    const char *name; /* "--seq" */
    lt_bench_arg_kind kind;
    void *dst;
    int64_t lo, hi;
    int *seen;                                      /* set to 1 when the flag is given (NULL: not tracked) */
    const char *choices;                            /* LT_BENCH_ARG_CHOICE */
    int *count, max;                                /* LT_BENCH_ARG_LIST */
    const char *(*parse)(const char *v, void *dst); /* LT_BENCH_ARG_FN */
} lt_bench_arg;

/* Table rows by kind (designated, so the other fields are zero). */
#define LT_BENCH_SET(nm, d, v) \
    { .name = (nm), .kind = LT_BENCH_ARG_SET, .dst = (d), .lo = (v) }
#define LT_BENCH_STR(nm, d) \
    { .name = (nm), .kind = LT_BENCH_ARG_STR, .dst = (d) }
#define LT_BENCH_CHOICE(nm, d, ch) \
    { .name = (nm), .kind = LT_BENCH_ARG_CHOICE, .dst = (d), .choices = (ch) }
#define LT_BENCH_INT(nm, d, l, h) \
    { .name = (nm), .kind = LT_BENCH_ARG_INT, .dst = (d), .lo = (l), .hi = (h) }
#define LT_BENCH_I64(nm, d, l, h) \
    { .name = (nm), .kind = LT_BENCH_ARG_I64, .dst = (d), .lo = (l), .hi = (h) }
#define LT_BENCH_U64(nm, d, l, h) \
    { .name = (nm), .kind = LT_BENCH_ARG_U64, .dst = (d), .lo = (l), .hi = (h) }
#define LT_BENCH_F64(nm, d, l, h) \
    { .name = (nm), .kind = LT_BENCH_ARG_F64, .dst = (d), .lo = (l), .hi = (h) }
#define LT_BENCH_BYTES(nm, d) \
    { .name = (nm), .kind = LT_BENCH_ARG_BYTES, .dst = (d) }
#define LT_BENCH_LIST(nm, d, n, mx, l, h) \
    { .name = (nm), .kind = LT_BENCH_ARG_LIST, .dst = (d), .count = (n), .max = (mx), .lo = (l), .hi = (h) }
#define LT_BENCH_FN(nm, d, fn) \
    { .name = (nm), .kind = LT_BENCH_ARG_FN, .dst = (d), .parse = (fn) }
#define LT_BENCH_NARGS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Which common flags a bench takes (lt_bench_parse_args' `common`). */
#define LT_BENCH_COMMON_JSON (1u << 0)
#define LT_BENCH_COMMON_OUT (1u << 1)
#define LT_BENCH_COMMON_REPEATS (1u << 2)
#define LT_BENCH_COMMON_WARMUP (1u << 3)
#define LT_BENCH_COMMON_BACKEND (1u << 4)
#define LT_BENCH_COMMON_ALL 31u
#define LT_BENCH_ARGS_HELP 1

/* Parses argv[1..argc) in order: --help returns LT_BENCH_ARGS_HELP (the caller prints its help and
 * exits 0); the common flags in `common` go into c, every other flag must be a row of args
 * ("--flag value" or "--flag=value"). Returns 0, or 2 after printing "longtune bench <bench>: <what>"
 * (an unknown flag, a missing value, or a bad one with the flag, the value and what is allowed) and
 * the usage line (synopsis, or "longtune bench <bench> [options]" when NULL). */
int lt_bench_parse_args(const char *bench, const char *synopsis, int argc, char **argv, lt_bench_common *c,
                        unsigned common, const lt_bench_arg *args, int nargs);
/* Prints "longtune bench <bench>: <message>" and the usage line as lt_bench_parse_args does; returns 2. */
int lt_bench_usage_error(const char *bench, const char *synopsis, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value parsers of the table, for benches that check a value after parsing: a whole number in
 * [lo, hi]; a byte size; a comma list (count, or -1 when empty, too long or out of range). Return
 * 0 (or the count) on success, -1 otherwise. */
int lt_bench_parse_i64(const char *v, int64_t lo, int64_t hi, int64_t *out);
int lt_bench_parse_bytes(const char *v, uint64_t *out);
int lt_bench_parse_i64_list(const char *v, int64_t *out, int max, int64_t lo, int64_t hi);
/* LT_BENCH_FN parser of a duration: seconds above 0 (at most 1e9) into double. */
const char *lt_bench_parse_seconds(const char *v, void *dst);
#define LT_BENCH_COMMON_HELP                                                                      \
    "  --json           print the result JSON on stdout\n"                                        \
    "  --out DIR        where to write the result file (default bench/results)\n"                 \
    "  --name-suffix S  appended to the result file's name (one configuration on two machines)\n" \
    "  --repeats N      timed repetitions; the median is reported (default 5)\n"                  \
    "  --warmup N       untimed repetitions first (default 1)\n"                                  \
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
