/* Float64 references of attention and the fused loss, as include/longtune/attention.h and lce.h
 * define them, for the op matrix (tests/ops/test_backend_ops.c). Plain loops over contiguous
 * arrays, written for clarity, not speed: small shapes only. */
#ifndef LT_TEST_REF_OPS_H
#define LT_TEST_REF_OPS_H

#include <stdint.h>

#include "longtune/lce.h"

/* Causal attention with grouped-query heads, an optional sliding window, softcap and packed rows.
 * q (B, T, H, D), k and v (B, T, Hkv, D) contiguous. */
typedef struct lt_ref_attn {
    int64_t B, T, H, Hkv, D, window;
    double scale, cap;
    const int32_t *off; /* (B, S+1) or NULL */
    int64_t S;
} lt_ref_attn;

/* o (B, T, H, D) and lse (B, H, T). */
void lt_ref_attn_forward(const lt_ref_attn *a, const double *q, const double *k, const double *v, double *o,
                         double *lse);
/* dq, dk, dv (overwritten) of Σ g·o, given the forward's o and lse. */
void lt_ref_attn_backward(const lt_ref_attn *a, const double *q, const double *k, const double *v, const double *o,
                          const double *lse, const double *g, double *dq, double *dk, double *dv);
/* Σ g·o of the forward (o, lse: scratch of the forward's sizes): what finite differences differentiate. */
double lt_ref_attn_loss(const lt_ref_attn *a, const double *q, const double *k, const double *v, const double *g,
                        double *o, double *lse);

/* The fused loss's options. */
typedef struct lt_ref_lce_opts {
    lt_reduction red;
    double eps, zl, cap;
    const double *tw; /* (N) token weights or NULL */
} lt_ref_lce_opts;

/* Forward and, with dh, backward of cross_entropy(softcap(h·Wᵀ), targets) as lce.h defines it:
 * h (N, C), w (V, C); loss (1), or (N) for LT_REDUCTION_NONE; dloss likewise; lse (N) or NULL,
 * 0 for ignored tokens; dh (N, C) or NULL. Returns Σ dloss·loss, the scalar dh is the gradient of. */
double lt_ref_lce(const double *h, const double *w, const int32_t *tgt, int64_t N, int64_t C, int64_t V,
                  const lt_ref_lce_opts *o, const double *dloss, double *loss, double *lse, double *dh);

#endif
