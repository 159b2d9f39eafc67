/* Shared test helpers: a seeded RNG printed once per program (so a failure can be replayed with
 * LONGTUNE_TEST_SEED), fresh random inputs, and named tolerances derived from the dtype. */
#ifndef LT_TEST_UTIL_H
#define LT_TEST_UTIL_H

#include <stdint.h>

/* Seed from LONGTUNE_TEST_SEED or the clock; printed to stderr. */
uint64_t lt_test_seed(void);
uint64_t lt_test_rand_u64(uint64_t *state);
/* Uniform in [lo, hi). */
double lt_test_uniform(uint64_t *state, double lo, double hi);
/* Standard normal. */
double lt_test_normal(uint64_t *state);
void lt_test_fill_normal(uint64_t *state, float *x, int64_t n, float stddev);
/* n fresh normal floats (stddev sd) in a malloc'd array the caller frees. */
float *lt_test_fresh(uint64_t *state, int64_t n, float sd);
/* n floats set to LT_TEST_POISON in a malloc'd array the caller frees. */
float *lt_test_poisoned(int64_t n);
/* x rounded to bf16 and back: where a naive bf16 implementation would round. */
double lt_test_bf16_round(double x);
/* max |x - ref| / max |ref| (the absolute error when ref is all zero); a non-finite x, i.e. a
 * poisoned or unwritten element, gives +inf. */
double lt_test_rel_err_f(const float *x, const double *ref, int64_t n);
/* The same between two float64 arrays. */
double lt_test_rel_err_d(const double *x, const double *ref, int64_t n);
/* Poison value written into outputs before a call, so unwritten elements are caught. */
#define LT_TEST_POISON (-7.25e30f)

/* Tolerances: fp32 ~ a few ulps of accumulated error; bf16 compared as "at most 2x the error of a
 * naive bf16 computation against the same float64 reference" by the tests themselves. */
#define LT_TOL_F32_REL 1e-5
#define LT_TOL_F32_ABS 1e-6

/* Fails the running cmocka test unless |got - want| <= rel·(|want| + scale) + LT_TOL_F32_ABS, where
 * scale is the magnitude of the terms summed into want (cancellation can make want itself tiny);
 * the message names what[i]. */
void lt_test_close_to(double got, double want, double scale, double rel, const char *what, int64_t i);

/* For the few programs that run outside cmocka (one device context across all checks): on a false
 * cond prints file:line and the condition and counts it in the int lvalue failures; never stops. */
#define LT_TEST_CHECK(failures, cond)                                                \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            (failures)++;                                                            \
        }                                                                            \
    } while (0)

/* Runs this test program again as `mpirun -np np <self> worker_arg` (shared-memory transport, the
 * parent's seed, LeakSanitizer suppressions for libmpi) and returns its exit status; -1 when mpirun
 * is not installed (the caller skips), -2 when the program's own path cannot be read. */
int lt_test_mpirun(int np, const char *worker_arg);

/* For the test_cuda_*.c programs: 0 when a CUDA device is usable; otherwise prints "skipped: no CUDA device"
 * (and says so when this build has no CUDA at all) and returns 77, the code ctest reports as skipped. */
int lt_test_cuda_skip(void);

/* For programs that run many short OpenMP regions on a shared machine: workers spinning at
 * barriers cost more than the work whenever a core is taken away (measured on the real model:
 * 51 s active vs 9 s passive). libgomp reads OMP_WAIT_POLICY before main, so when it is unset this
 * sets it to passive and re-executes the program with argv; returns only when it was already set
 * (or the re-exec failed). */
void lt_test_omp_passive(char **argv);

/* `rm -rf dir` (a per-test temporary folder): 0 on success, 1 otherwise. */
int lt_test_rm_tree(const char *dir);

/* Directory holding tests/fixtures (LONGTUNE_SOURCE_DIR or the compile-time source dir). */
const char *lt_test_source_dir(void);

#endif
