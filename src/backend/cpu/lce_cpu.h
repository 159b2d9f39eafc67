/* Private pieces shared by the three CPU linear cross-entropy implementations (naive, chunked,
 * fused): the resolved problem description, workspace carving, the per-row math (tile statistics,
 * loss finalisation, logit gradients), a vectorisable exp and the tile dequantizers. The
 * implementations differ only in how they tile and where the logits live; the math is here once.
 * Nothing here validates input: lce.c did that. */
#ifndef LT_BACKEND_CPU_LCE_CPU_H
#define LT_BACKEND_CPU_LCE_CPU_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "longtune/lce.h"

/* Everything an implementation needs, resolved once from the options and arguments. */
typedef struct lce_problem {
    int64_t N, V, C;
    lt_dtype h_dtype, w_dtype, dh_dtype;
    int backward; /* the pass: 0 forward, 1 backward, 2 forward_backward in one pass */
    int want_dw;
    int threads;        /* resolved worker count (>= 1) */
    int tile_n, tile_v; /* resolved and clamped to N and V */
    int32_t ignore_index;
    double eps, z_loss, softcap;
    lt_reduction reduction;
    /* Data (NULL when only sizing the workspace). */
    const void *h, *w;
    int64_t w_row_bytes;
    const int32_t *targets;
    const float *weight;
    /* bf16 products (lt_lce_options.bf16_products) of the one-pass forward_backward with a bf16
     * head: h and the logit weights rounded to bf16, the tile products through oneDNN. bf16x_spad:
     * each thread's scratchpad for them; ctx (NULL when only sizing) holds the products. */
    int bf16x;
    size_t bf16x_spad;
    lt_ctx *ctx;
} lce_problem;

/* Running per-token statistics of the (softcapped) logits seen so far. */
typedef struct lce_stat {
    float m;   /* max logit */
    float zt;  /* target logit (0 until its tile is seen) */
    double s;  /* Σ exp(z - m) */
    double sz; /* Σ z, for label smoothing */
} lce_stat;

#define LCE_ALIGN 64
/* Reserves `bytes` (rounded up to LCE_ALIGN) at *cursor and returns its offset. */
static inline size_t lce_take(size_t *cursor, size_t bytes) {
    size_t off = *cursor;
    *cursor += (bytes + LCE_ALIGN - 1) / LCE_ALIGN * LCE_ALIGN;
    return off;
}

/* The three implementations: workspace size for P, and the passes over a workspace of that size. */
size_t lt_cpu_lce_naive_workspace(const lce_problem *P);
size_t lt_cpu_lce_chunked_workspace(const lce_problem *P);
size_t lt_cpu_lce_fused_workspace(const lce_problem *P);
void lt_cpu_lce_naive_forward(const lce_problem *P, char *ws, float *lse, double *row_loss);
void lt_cpu_lce_chunked_forward(const lce_problem *P, char *ws, float *lse, double *row_loss);
void lt_cpu_lce_fused_forward(const lce_problem *P, char *ws, float *lse, double *row_loss);
/* coef: (N) upstream gradient times weight per token, 0 for ignored tokens; dh (N, C) in
 * P->dh_dtype is overwritten, dw (V, C) f32 accumulated when non-NULL. */
void lt_cpu_lce_naive_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh,
                               float *dw);
void lt_cpu_lce_chunked_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh,
                                 float *dw);
void lt_cpu_lce_fused_backward(const lce_problem *P, char *ws, const float *lse, const float *coef, void *dh,
                               float *dw);
/* forward_backward in one pass (fused only; no dw, not softcap together with label smoothing):
 * writes lse, row_loss (weighted, 0 for ignored tokens) and dh (overwritten) from coef. */
size_t lt_cpu_lce_fused_fb_workspace(const lce_problem *P);
void lt_cpu_lce_fused_forward_backward(const lce_problem *P, char *ws, float *lse, double *row_loss, const float *coef,
                                       void *dh);

/* ---- per-row math (lce_common.c) ---- */

static inline int lce_ignored(const lce_problem *P, int64_t i) { return P->targets[i] == P->ignore_index; }
/* Folds n softcapped logits z[0..n) of one token, covering vocabulary [v0, v0+n), into st.
 * target is the token's target (any value outside the range is simply not captured). */
void lt_cpu_lce_stat_update(lce_stat *st, const float *z, int64_t n, int64_t v0, int32_t target);
void lt_cpu_lce_stat_init(lce_stat *st);
/* Merges b into a (both over disjoint vocabulary ranges). */
void lt_cpu_lce_stat_merge(lce_stat *a, const lce_stat *b);
/* From the complete statistics of token i: writes its lse and returns its weighted loss
 * (0 and lse 0 for an ignored token). */
double lt_cpu_lce_finish_row(const lce_problem *P, int64_t i, const lce_stat *st, float *lse);
/* Turns n raw logits s (vocabulary [v0, v0+n)) of token i into ∂loss/∂s in place, given its lse
 * and coef (upstream gradient × weight; 0 writes zeros). */
void lt_cpu_lce_grad_row(const lce_problem *P, float *s, int64_t n, int64_t v0, int32_t target, float lse, float coef);

/* One-pass step over n raw logits z of one token (vocabulary [v0, v0+n)): softcaps them, folds
 * them into st against its running max (which only grows; when it does, st->s and, if acc_row is
 * set, the token's C-float grad-hidden accumulator are rescaled to the new max), and overwrites z
 * with exp(z_j − m)·cap'(z_j), the weights of W_j in that accumulator. */
void lt_cpu_lce_fb_row(const lce_problem *P, lce_stat *st, float *z, int64_t n, int64_t v0, int32_t target,
                       float *acc_row);

/* Dense f32 rows [r0, r0+nr) of h (f32 | bf16) and of the head w (any head dtype) into out
 * (nr, C). f32 sources are copied. */
void lt_cpu_lce_rows_to_f32(lt_dtype t, const void *base, int64_t row_bytes, int64_t r0, int64_t nr, int64_t C,
                            float *out);
/* The same in parallel over rows (for whole-matrix conversions outside parallel regions). */
void lt_cpu_lce_rows_to_f32_parallel(int threads, lt_dtype t, const void *base, int64_t row_bytes, int64_t r0,
                                     int64_t nr, int64_t C, float *out);
/* dst (nr, C) in dtype t (f32 | bf16) at rows [r0, ...) ← src f32. */
void lt_cpu_lce_rows_from_f32(lt_dtype t, void *base, int64_t r0, int64_t nr, int64_t C, const float *src);
/* Rows [r0, r0+nr) of dst (f32 | bf16) ← 0. */
void lt_cpu_lce_rows_zero(lt_dtype t, void *base, int64_t r0, int64_t nr, int64_t C);

#endif
