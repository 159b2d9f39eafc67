/* The backends an op test runs on, and the tolerance rule of the op matrix, for op tests that run
 * each case on every backend present: the CPU always, CUDA when the build has it and a device is
 * found. */
#ifndef LT_TEST_BACKENDS_H
#define LT_TEST_BACKENDS_H

#include <stdint.h>

#include "longtune/tensor.h"

#define LT_TEST_MAX_BACKENDS 2

/* 1 when this build has the CUDA backend and a CUDA device is usable. */
int lt_test_cuda_present(void);

/* Fills devs (LT_TEST_MAX_BACKENDS entries) with the devices whose backend is present, the CPU
 * first, and returns how many; prints "cuda: skipped: no CUDA device" (and that the build has no
 * CUDA, when so) for an absent CUDA backend. */
int lt_test_backends(lt_device *devs);

/* "cpu" or "cuda". */
const char *lt_test_backend_name(lt_device dev);

/* The dtype a backend reads attention and loss inputs in: f32 on the CPU, bf16 on CUDA (fp32
 * accumulate). */
lt_dtype lt_test_input_dtype(lt_device dev);

/* Tolerance of a result that sums k terms computed from inputs in dtype dt, relative to the
 * magnitude of what it sums: twice the error of a naive implementation in that dtype (each
 * product's inputs rounded, the result rounded, an f32 accumulation whose error grows as √k);
 * never below LT_TOL_F32_REL. The rule of tests/ops/test_backend_ops.c. */
double lt_test_tol_for(lt_dtype dt, int64_t k);

#endif
