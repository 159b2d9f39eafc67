/* The op profiler (prof.h): op-table wrappers that bracket every op with two timestamps, the mark
 * and record pools, and the reduction of one step's records into per-phase, per-op totals. Marks
 * are taken only while profiling; the plain tables are untouched, so the hot path carries no check.
 * Not thread-safe: the model's step runs its ops from one host thread. */
#include <stdlib.h>
#include <string.h>

#include "backend/prof.h"
#include "longtune/log.h"

/* Marks per collect: an 8B-shape step queues ~5,000 ops (two marks each) plus the nested parts. */
#define PROF_MARKS 65536
#define PROF_RECORDS (PROF_MARKS / 2)
#define PROF_DEPTH 8

typedef struct prof_mark {
    lt_device dev;
    double t; /* CPU: seconds; CUDA: the event slot is the mark's own index */
} prof_mark;

typedef struct prof_record {
    int a, b;   /* marks; b < 0 while open */
    int parent; /* enclosing record or -1 */
    uint8_t phase, op;
} prof_record;

typedef struct prof_change {
    int mark;
    lt_prof_phase phase;
} prof_change;

int lt_prof_active;
static prof_mark marks[PROF_MARKS];
static prof_record recs[PROF_RECORDS];
static prof_change changes[PROF_RECORDS];
static int n_marks, n_recs, n_changes, depth, open_stack[PROF_DEPTH];
static lt_prof_phase phase_now;
static int64_t dropped;

void lt_prof_enable(int on) { lt_prof_active = on != 0; }

static int mark(lt_device dev) {
    if (n_marks >= PROF_MARKS) return -1;
    int i = n_marks;
    marks[i].dev = dev;
    marks[i].t = 0;
    if (dev == LT_DEVICE_CPU) {
        marks[i].t = lt_time_now();
#if LT_HAVE_CUDA
    } else if (dev == LT_DEVICE_CUDA) {
        if (lt_cuda_prof_record(i) != 0) return -1;
#endif
    } else {
        return -1;
    }
    n_marks++;
    return i;
}

void lt_prof_set_phase(lt_device dev, lt_prof_phase ph) {
    if (!lt_prof_active || n_changes >= PROF_RECORDS) return;
    int k = mark(dev);
    if (k < 0) {
        dropped++;
        return;
    }
    changes[n_changes].mark = k;
    changes[n_changes].phase = ph;
    n_changes++;
    phase_now = ph;
}

int lt_prof_begin(lt_device dev, lt_prof_op op) {
    if (!lt_prof_active) return -1;
    if (n_recs >= PROF_RECORDS || depth >= PROF_DEPTH) {
        dropped++;
        return -1;
    }
    int k = mark(dev);
    if (k < 0) {
        dropped++;
        return -1;
    }
    prof_record *r = &recs[n_recs];
    r->a = k, r->b = -1;
    r->parent = depth ? open_stack[depth - 1] : -1;
    r->phase = (uint8_t)phase_now, r->op = (uint8_t)op;
    open_stack[depth++] = n_recs;
    return n_recs++;
}

void lt_prof_end(int h) {
    if (h < 0 || h >= n_recs) return;
    /* records close innermost first; an unmatched end (a dropped inner record) closes down to h */
    while (depth > 0 && open_stack[depth - 1] != h) depth--;
    if (depth > 0) depth--;
    int k = mark(marks[recs[h].a].dev);
    if (k < 0) {
        dropped++;
        return;
    }
    recs[h].b = k;
}

static double span_ms(int a, int b) {
    if (marks[a].dev != marks[b].dev) return 0;
#if LT_HAVE_CUDA
    if (marks[a].dev == LT_DEVICE_CUDA) return (double)lt_cuda_prof_ms(a, b);
#endif
    return (marks[b].t - marks[a].t) * 1e3;
}

lt_status lt_prof_collect(lt_ctx *ctx, lt_device dev, lt_prof_totals *tot) {
    if (!lt_prof_active) return LT_OK;
    int end = mark(dev);
#if LT_HAVE_CUDA
    if (dev == LT_DEVICE_CUDA) LT_TRY(lt_cuda_prof_wait(ctx));
#else
    (void)ctx;
#endif
    for (int i = 0; i < n_recs; i++) {
        const prof_record *r = &recs[i];
        if (r->b < 0) continue;
        double ms = span_ms(r->a, r->b);
        tot->op_ms[r->phase][r->op] += ms;
        tot->calls[r->phase][r->op]++;
        if (r->parent >= 0) tot->op_ms[recs[r->parent].phase][recs[r->parent].op] -= ms;
    }
    for (int i = 0; i < n_changes; i++) {
        int b = i + 1 < n_changes ? changes[i + 1].mark : end;
        if (b >= 0) tot->phase_ms[changes[i].phase] += span_ms(changes[i].mark, b);
    }
    tot->steps++;
    tot->dropped += dropped;
    n_marks = n_recs = n_changes = depth = 0;
    dropped = 0;
    /* the next step starts where this one ended */
    lt_prof_set_phase(dev, LT_PROF_OTHER);
    return LT_OK;
}

const char *lt_prof_op_name(lt_prof_op op) {
    static const char *const names[LT_PROF_OP_COUNT_] = {
        [LT_PROF_MATMUL] = "matmul",
        [LT_PROF_MATMUL_CVT] = "matmul_cvt",
        [LT_PROF_MATMUL_DEQUANT] = "matmul_dequant",
        [LT_PROF_MATMUL_FP8_SCALE] = "matmul_fp8_scale",
        [LT_PROF_GEMM] = "gemm_f32",
        [LT_PROF_ATTN_FWD] = "attn_fwd",
        [LT_PROF_ATTN_BWD] = "attn_bwd",
        [LT_PROF_LCE] = "lce",
        [LT_PROF_RMSNORM_FWD] = "rmsnorm_fwd",
        [LT_PROF_RMSNORM_BWD] = "rmsnorm_bwd",
        [LT_PROF_ROPE] = "rope",
        [LT_PROF_SWIGLU_FWD] = "swiglu_fwd",
        [LT_PROF_SWIGLU_BWD] = "swiglu_bwd",
        [LT_PROF_EMBEDDING] = "embedding",
        [LT_PROF_ADD] = "add",
        [LT_PROF_ADD_BIAS] = "add_bias",
        [LT_PROF_DROPOUT] = "dropout",
        [LT_PROF_ADAMW] = "adamw",
        [LT_PROF_ZERO] = "zero",
        [LT_PROF_SCALE] = "scale",
        [LT_PROF_SUMSQ] = "sumsq",
        [LT_PROF_COPY] = "copy",
        [LT_PROF_SYNC] = "sync",
        [LT_PROF_SAVED_CVT] = "saved_cvt",
        [LT_PROF_MOE_ROUTE] = "moe_route",
        [LT_PROF_MOE_DISPATCH] = "moe_dispatch",
        [LT_PROF_GROUPED_MATMUL] = "grouped_matmul",
    };
    return (unsigned)op < LT_PROF_OP_COUNT_ ? names[op] : "?";
}

const char *lt_prof_phase_name(lt_prof_phase ph) {
    static const char *const names[LT_PROF_PHASE_COUNT_] = {"other", "forward", "loss", "recompute", "backward"};
    return (unsigned)ph < LT_PROF_PHASE_COUNT_ ? names[ph] : "?";
}

/* ---- the wrapped tables: one set of wrappers per backend (an op receives no table pointer) ---- */

/* One timed wrapper P_name(params) of REAL's op name: the call name args between
 * lt_prof_begin(DEV, kind) and lt_prof_end, returning the op's value of type T (PROF_RET). */
#define PROF_VOID(P, REAL, DEV, name, kind, params, args) \
    static void P##_##name params {                       \
        int h_ = lt_prof_begin(DEV, kind);                \
        (REAL).name args;                                 \
        lt_prof_end(h_);                                  \
    }
#define PROF_RET(T, P, REAL, DEV, name, kind, params, args) \
    static T P##_##name params {                            \
        int h_ = lt_prof_begin(DEV, kind);                  \
        T r_ = (REAL).name args;                            \
        lt_prof_end(h_);                                    \
        return r_;                                          \
    }

#define PROF_WRAPPERS(P, REAL, DEV)                                                                                    \
    PROF_RET(lt_status, P, REAL, DEV, copy_to_device, LT_PROF_COPY,                                                    \
             (lt_ctx * ctx, void *dst, const void *src, size_t bytes), (ctx, dst, src, bytes))                         \
    PROF_RET(lt_status, P, REAL, DEV, copy_to_host, LT_PROF_COPY,                                                      \
             (lt_ctx * ctx, void *dst, const void *src, size_t bytes), (ctx, dst, src, bytes))                         \
    PROF_RET(lt_status, P, REAL, DEV, synchronize, LT_PROF_SYNC, (lt_ctx * ctx), (ctx))                                \
    PROF_VOID(P, REAL, DEV, gemm, LT_PROF_GEMM,                                                                        \
              (lt_ctx * ctx, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,             \
               int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc),                           \
              (ctx, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc))                                             \
    PROF_VOID(P, REAL, DEV, matmul, LT_PROF_MATMUL,                                                                    \
              (lt_ctx * ctx, lt_matmul_mode mode, const lt_tensor *w, const float *x, int64_t N, float beta, float *y, \
               void *ws),                                                                                              \
              (ctx, mode, w, x, N, beta, y, ws))                                                                       \
    PROF_VOID(P, REAL, DEV, rmsnorm_fwd, LT_PROF_RMSNORM_FWD,                                                          \
              (lt_ctx * ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, float *y, float *rstd),  \
              (ctx, x, w, eps, N, C, y, rstd))                                                                         \
    PROF_VOID(P, REAL, DEV, rmsnorm_bwd, LT_PROF_RMSNORM_BWD,                                                          \
              (lt_ctx * ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N, int64_t C, \
               float *dx, float *dw),                                                                                  \
              (ctx, dy, x, w, rstd, N, C, dx, dw))                                                                     \
    PROF_VOID(P, REAL, DEV, rope, LT_PROF_ROPE,                                                                        \
              (lt_ctx * ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D, \
               int inverse),                                                                                           \
              (ctx, x, pos, inv_freq, N, heads, D, inverse))                                                           \
    PROF_VOID(P, REAL, DEV, swiglu_fwd, LT_PROF_SWIGLU_FWD,                                                            \
              (lt_ctx * ctx, const float *g, const float *u, int64_t n, float *a), (ctx, g, u, n, a))                  \
    PROF_VOID(P, REAL, DEV, swiglu_bwd, LT_PROF_SWIGLU_BWD,                                                            \
              (lt_ctx * ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du),        \
              (ctx, da, g, u, n, dg, du))                                                                              \
    PROF_VOID(P, REAL, DEV, embedding, LT_PROF_EMBEDDING,                                                              \
              (lt_ctx * ctx, const lt_tensor *table, const int32_t *ids, int64_t N, float *out),                       \
              (ctx, table, ids, N, out))                                                                               \
    PROF_VOID(P, REAL, DEV, add, LT_PROF_ADD, (lt_ctx * ctx, float *y, const float *x, float alpha, int64_t n),        \
              (ctx, y, x, alpha, n))                                                                                   \
    PROF_VOID(P, REAL, DEV, add_bias, LT_PROF_ADD_BIAS,                                                                \
              (lt_ctx * ctx, float *y, const float *b, int64_t N, int64_t C), (ctx, y, b, N, C))                       \
    PROF_VOID(P, REAL, DEV, dropout, LT_PROF_DROPOUT,                                                                  \
              (lt_ctx * ctx, const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset),            \
              (ctx, x, y, n, p, seed, offset))                                                                         \
    PROF_VOID(P, REAL, DEV, adamw, LT_PROF_ADAMW,                                                                      \
              (lt_ctx * ctx, float *p, const float *g, float *m, float *v, int64_t n, const lt_adamw_params *hp),      \
              (ctx, p, g, m, v, n, hp))                                                                                \
    PROF_VOID(P, REAL, DEV, zero, LT_PROF_ZERO, (lt_ctx * ctx, void *p, size_t bytes), (ctx, p, bytes))                \
    PROF_VOID(P, REAL, DEV, scale, LT_PROF_SCALE, (lt_ctx * ctx, float *x, float a, int64_t n), (ctx, x, a, n))        \
    PROF_RET(float, P, REAL, DEV, sumsq, LT_PROF_SUMSQ, (lt_ctx * ctx, const float *x, int64_t n), (ctx, x, n))        \
    PROF_VOID(P, REAL, DEV, to_bf16, LT_PROF_SAVED_CVT, (lt_ctx * ctx, const float *x, uint16_t *y, int64_t n),        \
              (ctx, x, y, n))                                                                                          \
    PROF_VOID(P, REAL, DEV, from_bf16, LT_PROF_SAVED_CVT, (lt_ctx * ctx, const uint16_t *x, float *y, int64_t n),      \
              (ctx, x, y, n))                                                                                          \
    /* its LoRA products nest as gemm */                                                                               \
    PROF_VOID(P, REAL, DEV, lora_fwd, LT_PROF_MATMUL,                                                                  \
              (lt_ctx * ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s, float beta,  \
               void *ws),                                                                                              \
              (ctx, p, G, x, n, r, s, beta, ws))                                                                       \
    PROF_VOID(P, REAL, DEV, lora_bwd, LT_PROF_MATMUL,                                                                  \
              (lt_ctx * ctx, const lt_lora_proj *p, int G, const float *x, int64_t n, int64_t r, float s, float *dx,   \
               float beta, float *dlu, void *ws),                                                                      \
              (ctx, p, G, x, n, r, s, dx, beta, dlu, ws))                                                              \
    PROF_VOID(P, REAL, DEV, lora_fwd_bf16, LT_PROF_MATMUL,                                                             \
              (lt_ctx * ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n, int64_t r,   \
               float s, float beta, void *ws),                                                                         \
              (ctx, p, G, x, xh, n, r, s, beta, ws))                                                                   \
    PROF_VOID(P, REAL, DEV, lora_bwd_bf16, LT_PROF_MATMUL,                                                             \
              (lt_ctx * ctx, const lt_lora_proj *p, int G, const float *x, const uint16_t *xh, int64_t n, int64_t r,   \
               float s, float *dx, uint16_t *dxh, float beta, float *dlu, void *ws),                                   \
              (ctx, p, G, x, xh, n, r, s, dx, dxh, beta, dlu, ws))                                                     \
    PROF_VOID(P, REAL, DEV, rmsnorm_fwd_bf16, LT_PROF_RMSNORM_FWD,                                                     \
              (lt_ctx * ctx, const float *x, const float *w, float eps, int64_t N, int64_t C, uint16_t *y,             \
               float *rstd),                                                                                           \
              (ctx, x, w, eps, N, C, y, rstd))                                                                         \
    PROF_VOID(P, REAL, DEV, rmsnorm_bwd_add, LT_PROF_RMSNORM_BWD,                                                      \
              (lt_ctx * ctx, const float *dy, const float *x, const float *w, const float *rstd, int64_t N, int64_t C, \
               float *dx),                                                                                             \
              (ctx, dy, x, w, rstd, N, C, dx))                                                                         \
    PROF_VOID(P, REAL, DEV, rope_cvt, LT_PROF_ROPE,                                                                    \
              (lt_ctx * ctx, const void *x, int x_bf16, void *y, int y_bf16, const int32_t *pos,                       \
               const float *inv_freq, int64_t N, int64_t heads, int64_t D, int inverse),                               \
              (ctx, x, x_bf16, y, y_bf16, pos, inv_freq, N, heads, D, inverse))                                        \
    PROF_VOID(P, REAL, DEV, glu_fwd_bf16, LT_PROF_SWIGLU_FWD,                                                          \
              (lt_ctx * ctx, int gelu, const void *g, const void *u, int gu_bf16, int64_t n, uint16_t *a),             \
              (ctx, gelu, g, u, gu_bf16, n, a))                                                                        \
    PROF_VOID(P, REAL, DEV, glu_bwd_bf16, LT_PROF_SWIGLU_BWD,                                                          \
              (lt_ctx * ctx, int gelu, const void *da, const void *g, const void *u, int gu_bf16, int64_t n,           \
               uint16_t *dg, uint16_t *du),                                                                            \
              (ctx, gelu, da, g, u, gu_bf16, n, dg, du))                                                               \
    PROF_RET(lt_status, P, REAL, DEV, attention_fwd, LT_PROF_ATTN_FWD,                                                 \
             (lt_ctx * ctx, const lt_attention_params *p, lt_attention_args *a), (ctx, p, a))                          \
    PROF_RET(lt_status, P, REAL, DEV, attention_bwd, LT_PROF_ATTN_BWD,                                                 \
             (lt_ctx * ctx, const lt_attention_params *p, lt_attention_args *a), (ctx, p, a))                          \
    /* The per-batch key bounds, timed as attention forward work. */                                                   \
    PROF_RET(lt_status, P, REAL, DEV, attention_batch_prepare, LT_PROF_ATTN_FWD,                                       \
             (lt_ctx * ctx, const lt_attention_params *p, lt_attention_batch *b), (ctx, p, b))                         \
    PROF_RET(lt_status, P, REAL, DEV, lce_fwd, LT_PROF_LCE, (lt_ctx * ctx, const lt_lce_options *o, lt_lce_args *a),   \
             (ctx, o, a))                                                                                              \
    PROF_RET(lt_status, P, REAL, DEV, lce_bwd, LT_PROF_LCE, (lt_ctx * ctx, const lt_lce_options *o, lt_lce_args *a),   \
             (ctx, o, a))                                                                                              \
    PROF_RET(lt_status, P, REAL, DEV, lce_fwd_bwd, LT_PROF_LCE,                                                        \
             (lt_ctx * ctx, const lt_lce_options *o, lt_lce_args *a), (ctx, o, a))                                     \
    PROF_VOID(P, REAL, DEV, moe_route, LT_PROF_MOE_ROUTE,                                                              \
              (lt_ctx * ctx, const float *logits, int64_t n, int64_t E, int64_t k, int norm_topk, int32_t *idx,        \
               float *w, float *stats),                                                                                \
              (ctx, logits, n, E, k, norm_topk, idx, w, stats))                                                        \
    PROF_VOID(P, REAL, DEV, moe_route_bwd, LT_PROF_MOE_ROUTE,                                                          \
              (lt_ctx * ctx, const float *logits, const int32_t *idx, const float *dw, int64_t n, int64_t E,           \
               int64_t k, int norm_topk, const float *stats, const float *scale, float *dlogits),                      \
              (ctx, logits, idx, dw, n, E, k, norm_topk, stats, scale, dlogits))                                       \
    PROF_VOID(P, REAL, DEV, moe_sort, LT_PROF_MOE_DISPATCH,                                                            \
              (lt_ctx * ctx, const int32_t *idx, int64_t n, int64_t k, int64_t E, int32_t *off, int32_t *rows,         \
               int32_t *slot),                                                                                         \
              (ctx, idx, n, k, E, off, rows, slot))                                                                    \
    PROF_VOID(P, REAL, DEV, moe_gather, LT_PROF_MOE_DISPATCH,                                                          \
              (lt_ctx * ctx, const float *x, const int32_t *rows, int64_t nk, int64_t k, int64_t C, float *xg),        \
              (ctx, x, rows, nk, k, C, xg))                                                                            \
    PROF_VOID(P, REAL, DEV, moe_gather_bwd, LT_PROF_MOE_DISPATCH,                                                      \
              (lt_ctx * ctx, const float *dxg, const int32_t *slot, int64_t n, int64_t k, int64_t C, float beta,       \
               float *dx),                                                                                             \
              (ctx, dxg, slot, n, k, C, beta, dx))                                                                     \
    PROF_VOID(P, REAL, DEV, moe_combine, LT_PROF_MOE_DISPATCH,                                                         \
              (lt_ctx * ctx, const float *yg, const float *w, const int32_t *slot, int64_t n, int64_t k, int64_t C,    \
               float beta, float *y),                                                                                  \
              (ctx, yg, w, slot, n, k, C, beta, y))                                                                    \
    PROF_VOID(P, REAL, DEV, moe_combine_bwd, LT_PROF_MOE_DISPATCH,                                                     \
              (lt_ctx * ctx, const float *dy, const float *yg, const float *w, const int32_t *slot, int64_t n,         \
               int64_t k, int64_t C, float *dyg, float *dw),                                                           \
              (ctx, dy, yg, w, slot, n, k, C, dyg, dw))                                                                \
    PROF_VOID(P, REAL, DEV, grouped_matmul, LT_PROF_GROUPED_MATMUL,                                                    \
              (lt_ctx * ctx, lt_matmul_mode mode, const lt_tensor *w, int64_t E, const int32_t *off, const float *x,   \
               int64_t nk, float beta, float *y, void *ws),                                                            \
              (ctx, mode, w, E, off, x, nk, beta, y, ws))                                                              \
    /* The real table with the timed ops swapped in: fields added later stay the real ones. */                         \
    static void P##_install(lt_backend *t) {                                                                           \
        *t = (REAL);                                                                                                   \
        t->copy_to_device = P##_copy_to_device, t->copy_to_host = P##_copy_to_host;                                    \
        t->synchronize = P##_synchronize, t->gemm = P##_gemm, t->matmul = P##_matmul;                                  \
        t->rmsnorm_fwd = P##_rmsnorm_fwd, t->rmsnorm_bwd = P##_rmsnorm_bwd, t->rope = P##_rope;                        \
        t->swiglu_fwd = P##_swiglu_fwd, t->swiglu_bwd = P##_swiglu_bwd, t->embedding = P##_embedding;                  \
        t->add = P##_add, t->add_bias = P##_add_bias, t->dropout = P##_dropout, t->adamw = P##_adamw;                  \
        t->zero = P##_zero, t->scale = P##_scale, t->sumsq = P##_sumsq;                                                \
        t->to_bf16 = P##_to_bf16, t->from_bf16 = P##_from_bf16;                                                        \
        t->lora_fwd = P##_lora_fwd, t->lora_bwd = P##_lora_bwd;                                                        \
        /* the bf16-operand ops where the backend has them */                                                          \
        if ((REAL).lora_fwd_bf16) t->lora_fwd_bf16 = P##_lora_fwd_bf16, t->lora_bwd_bf16 = P##_lora_bwd_bf16;          \
        if ((REAL).rmsnorm_fwd_bf16) t->rmsnorm_fwd_bf16 = P##_rmsnorm_fwd_bf16;                                       \
        if ((REAL).rmsnorm_bwd_add) t->rmsnorm_bwd_add = P##_rmsnorm_bwd_add;                                          \
        if ((REAL).rope_cvt) t->rope_cvt = P##_rope_cvt;                                                               \
        if ((REAL).glu_fwd_bf16) t->glu_fwd_bf16 = P##_glu_fwd_bf16, t->glu_bwd_bf16 = P##_glu_bwd_bf16;               \
        t->attention_fwd = P##_attention_fwd, t->attention_bwd = P##_attention_bwd;                                    \
        t->attention_batch_prepare = P##_attention_batch_prepare;                                                      \
        t->lce_fwd = P##_lce_fwd, t->lce_bwd = P##_lce_bwd, t->lce_fwd_bwd = P##_lce_fwd_bwd;                          \
        t->moe_route = P##_moe_route, t->moe_route_bwd = P##_moe_route_bwd, t->moe_sort = P##_moe_sort;                \
        t->moe_gather = P##_moe_gather, t->moe_gather_bwd = P##_moe_gather_bwd;                                        \
        t->moe_combine = P##_moe_combine, t->moe_combine_bwd = P##_moe_combine_bwd;                                    \
        t->grouped_matmul = P##_grouped_matmul;                                                                        \
    }

PROF_WRAPPERS(prof_cpu, lt_backend_cpu, LT_DEVICE_CPU)
#if LT_HAVE_CUDA
PROF_WRAPPERS(prof_cuda, lt_backend_cuda, LT_DEVICE_CUDA)
#endif

const lt_backend *lt_backend_profiled(const lt_backend *be) {
    static lt_backend cpu_t;
    static int cpu_ready;
    if (be == &lt_backend_cpu) {
        if (!cpu_ready) prof_cpu_install(&cpu_t), cpu_ready = 1;
        return &cpu_t;
    }
#if LT_HAVE_CUDA
    static lt_backend cuda_t;
    static int cuda_ready;
    if (be == &lt_backend_cuda) {
        if (!cuda_ready) prof_cuda_install(&cuda_t), cuda_ready = 1;
        return &cuda_t;
    }
#endif
    return be;
}
