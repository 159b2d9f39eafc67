/* One random case of the backend's LoRA projection ops (lora_fwd, lora_bwd) run on a backend and
 * compared with a float64 reference computed here: the lora rows of the op matrix
 * (tests/ops/test_backend_ops.c) run it on every backend. */
#ifndef LT_TEST_LORA_CHECK_H
#define LT_TEST_LORA_CHECK_H

#include <stdint.h>

#include "backend/backend.h"

typedef struct lt_lora_case {
    int G;          /* projections sharing x: 1..3 */
    int64_t out[3]; /* their output widths */
    int adapted[3]; /* 1: carries an adapter */
    int64_t in, n, r;
    float s, beta;
    int bias;        /* forward: add a bias to every projection */
    int lu_only;     /* forward: y = NULL (only lu) */
    int no_dx;       /* backward: dx = NULL */
    lt_dtype wdtype; /* F32 or BF16 weights */
} lt_lora_case;

/* Worst relative errors (max |got - ref| / max |ref|) over the outputs of one case; +inf for a
 * non-finite (poisoned, unwritten) element. */
typedef struct lt_lora_errors {
    double y, lu, dx, ga, gb;
    /* On a backend with lora_fwd_bf16 / lora_bwd_bf16 that takes the case: the runs of those ops
     * (x in bf16, dy in bf16, both) and the output elements whose bits differ from the f32 ops'. */
    int bf16_variants;
    int64_t bf16_mismatch;
    /* Where the case also allows a bf16 output (beta 0, no bias, y wanted): lora_fwd_bf16 of the
     * bf16 x writing each y in bf16 (yh), its worst relative error against the reference (-1:
     * not run); its lu counts in bf16_mismatch. */
    double y_bf16;
    /* Likewise, one projection with beta 0 and dx wanted: lora_bwd_bf16 of the bf16 x and dy
     * writing dx in bf16 (dxh), its worst relative error against the reference (-1: not run); its
     * ga and gb count in bf16_mismatch. */
    double dx_bf16;
    /* beta != 0 with y wanted: lora_fwd again with the prior y read from yc (a copy) into a
     * poisoned y; the elements whose bits differ from the in-place run's y (-1: not run). */
    int64_t yc_mismatch;
} lt_lora_errors;

/* Runs lora_fwd then lora_bwd of `c` on be with fresh inputs from rng; fills *err. Where the
 * backend has the bf16-input ops and takes every projection, also runs them on the bf16
 * roundings of x and dy and compares their outputs with the f32 ops' bit for bit. */
void lt_lora_check_run(const lt_backend *be, uint64_t *rng, const lt_lora_case *c, lt_lora_errors *err);

#endif
