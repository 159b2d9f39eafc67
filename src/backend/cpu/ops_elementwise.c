/* Elementwise CPU ops: SwiGLU and GeGLU forward/backward, embedding gather (any weight dtype), axpy, bias
 * add, counter-based dropout, zero, scale and the sum of squares. Each is a parallel loop over rows or element chunks; none keeps
 * state between calls (dropout masks are a pure function of seed and element index). */
/* The clamps and selects of the branch-free exp (lt_fast_exp) and of the masks become vector
 * selects only when GCC may assume no floating-point traps: with its default -ftrapping-math each
 * stays a branch and these loops run one lane at a time. No arithmetic is reordered or contracted,
 * so the results are the same, lane by lane, as the scalar code. Before every include, so inlined
 * helpers carry the same options. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <math.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "backend/cpu/attention_cpu.h"
#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

#define EW_GRAIN 4096

typedef struct ew_job {
    const float *a, *b, *c;
    float *y, *z;
    float alpha;
    int64_t C;
    const lt_tensor *table;
    const int32_t *ids;
    uint64_t seed, offset;
    uint32_t threshold;
    float keep_scale;
} ew_job;

/* σ(g) through core/fastmath.h's branch-free exp so these loops vectorise (libm's expf
 * is a call per element, and SwiGLU runs four times per layer and step over N·F elements). Its
 * clamp at −87 only moves σ of g < −87 from ~1e-38 to ~1e-38: silu there is below any tolerance. */
static inline float sigmoid(float g) { return 1.0f / (1.0f + lt_fast_exp(-g)); }

/* The GLU loops run with denormals flushed to zero and read as zero (MXCSR FTZ and DAZ on x86),
 * the caller's mode restored after. The vectorised σ computes for every lane what the lanes past
 * exp's clamp would take, g times a constant near 6e-39, and each denormal operand or result of
 * those products costs a microcode assist: the forward ran five times slower than its backward.
 * Only values below 1.2e-38 in magnitude change (to zero), far under any tolerance. */
#if defined(__x86_64__) || defined(__i386__)
static inline unsigned flush_denormals(void) {
    const unsigned mode = _mm_getcsr();
    _mm_setcsr(mode | 0x8040u); /* FTZ (bit 15), DAZ (bit 6) */
    return mode;
}
static inline void restore_fp_mode(unsigned mode) { _mm_setcsr(mode); }
#else
static inline unsigned flush_denormals(void) { return 0; }
static inline void restore_fp_mode(unsigned mode) { (void)mode; }
#endif

LT_CPU_CLONES static void swiglu_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    const float *restrict gp = j->a, *restrict up = j->b;
    float *restrict ap = j->y;
    const unsigned mode = flush_denormals();
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) ap[i] = gp[i] * sigmoid(gp[i]) * up[i];
    restore_fp_mode(mode);
}

void lt_cpu_swiglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a) {
    ew_job j = {.a = g, .b = u, .y = a};
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, swiglu_f, &j);
}

/* silu(g) = g·σ(g); silu'(g) = σ(g)·(1 + g·(1 − σ(g))). */
LT_CPU_CLONES static void swiglu_b(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    const float *gp = j->a, *up = j->b, *dap = j->c; /* dg may be g, du may be u (backend.h) */
    float *dg = j->y, *du = j->z;
    const unsigned mode = flush_denormals();
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float g = gp[i], u = up[i], da = dap[i];
        float s = sigmoid(g);
        dg[i] = da * u * s * (1.0f + g * (1.0f - s));
        du[i] = da * g * s;
    }
    restore_fp_mode(mode);
}

void lt_cpu_swiglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du) {
    ew_job j = {.a = g, .b = u, .c = da, .y = dg, .z = du};
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, swiglu_b, &j);
}

/* GeGLU with the tanh approximation of GELU (PyTorch's gelu(approximate="tanh"), Gemma's
 * gelu_pytorch_tanh): gelu(g) = g/2·(1 + tanh(k·(g + 0.044715·g³))), k = √(2/π), in f32 as
 * PyTorch computes it. tanh is core/fastmath.h's branch-free one (within 3 ulp of tanhf), so
 * the loops vectorise: libm's tanhf is a call per element (it and its expm1f took 13-16x the
 * SwiGLU loops' time over the same elements); denormals flushed as in the SwiGLU loops. */
#define GELU_K 0.7978845608028654f
#define GELU_A 0.044715f

static inline float gelu_tanh(float g) { return 0.5f * g * (1.0f + lt_fast_tanh(GELU_K * (g + GELU_A * g * g * g))); }

LT_CPU_CLONES static void geglu_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    const float *restrict gp = j->a, *restrict up = j->b;
    float *restrict ap = j->y;
    const unsigned mode = flush_denormals();
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) ap[i] = gelu_tanh(gp[i]) * up[i];
    restore_fp_mode(mode);
}

void lt_cpu_geglu_fwd(lt_ctx *ctx, const float *g, const float *u, int64_t n, float *a) {
    ew_job j = {.a = g, .b = u, .y = a};
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, geglu_f, &j);
}

/* gelu'(g) = (1 + t)/2 + g/2·(1 − t²)·k·(1 + 3·0.044715·g²), t = tanh(k·(g + 0.044715·g³)). */
LT_CPU_CLONES static void geglu_b(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    const float *gp = j->a, *up = j->b, *dap = j->c; /* dg may be g, du may be u (backend.h) */
    float *dg = j->y, *du = j->z;
    const unsigned mode = flush_denormals();
    /* simd: element-wise, each lane reading its g, u before writing dg, du over them */
#pragma omp simd
    for (int64_t i = i0; i < i1; i++) {
        float g = gp[i], u = up[i], da = dap[i];
        float t = lt_fast_tanh(GELU_K * (g + GELU_A * g * g * g));
        float d = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * GELU_K * (1.0f + 3.0f * GELU_A * g * g);
        dg[i] = da * u * d;
        du[i] = da * 0.5f * g * (1.0f + t);
    }
    restore_fp_mode(mode);
}

void lt_cpu_geglu_bwd(lt_ctx *ctx, const float *da, const float *g, const float *u, int64_t n, float *dg, float *du) {
    ew_job j = {.a = g, .b = u, .c = da, .y = dg, .z = du};
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, geglu_b, &j);
}

static void embed_rows(void *arg, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    const lt_tensor *t = j->table;
    size_t rb = (size_t)lt_dtype_row_bytes(t->dtype, j->C);
    for (int64_t n = n0; n < n1; n++)
        lt_dequantize_row(t->dtype, (const uint8_t *)t->data + (size_t)j->ids[n] * rb, j->y + n * j->C, j->C);
}

void lt_cpu_embedding(lt_ctx *ctx, const lt_tensor *table, const int32_t *ids, int64_t N, float *out) {
    ew_job j = {.table = table, .ids = ids, .y = out, .C = table->shape[1]};
    lt_parallel_for(lt_ctx_threads(ctx), N, 64, embed_rows, &j);
}

LT_CPU_CLONES static void axpy(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    for (int64_t i = i0; i < i1; i++) j->y[i] += j->alpha * j->a[i];
}

void lt_cpu_add(lt_ctx *ctx, float *y, const float *x, float alpha, int64_t n) {
    ew_job j = {.a = x, .y = y, .alpha = alpha};
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, axpy, &j);
}

static void bias_rows(void *arg, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    for (int64_t n = n0; n < n1; n++)
        for (int64_t c = 0; c < j->C; c++) j->y[n * j->C + c] += j->a[c];
}

void lt_cpu_add_bias(lt_ctx *ctx, float *y, const float *b, int64_t N, int64_t C) {
    ew_job j = {.a = b, .y = y, .C = C};
    lt_parallel_for(lt_ctx_threads(ctx), N, 64, bias_rows, &j);
}

/* splitmix64 finaliser of (seed, index): independent of thread split and call order. */
static uint32_t hash32(uint64_t seed, uint64_t i) {
    uint64_t z = seed ^ (i * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}

static void dropout_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    for (int64_t i = i0; i < i1; i++)
        j->y[i] = hash32(j->seed, j->offset + (uint64_t)i) >= j->threshold ? j->a[i] * j->keep_scale : 0.0f;
}

void lt_cpu_dropout(lt_ctx *ctx, const float *x, float *y, int64_t n, float p, uint64_t seed, uint64_t offset) {
    if (p <= 0.0f) {
        if (y != x) memmove(y, x, (size_t)n * sizeof(float));
        return;
    }
    ew_job j = {.a = x, .y = y, .seed = seed, .offset = offset};
    j.threshold = (uint32_t)fmin((double)p * 4294967296.0, 4294967295.0);
    j.keep_scale = 1.0f / (1.0f - p);
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, dropout_f, &j);
}

void lt_cpu_zero(lt_ctx *ctx, void *p, size_t bytes) {
    (void)ctx;
    if (bytes) memset(p, 0, bytes);
}

LT_CPU_CLONES static void scale_f(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const ew_job *j = arg;
    for (int64_t i = i0; i < i1; i++) j->y[i] *= j->alpha;
}

void lt_cpu_scale(lt_ctx *ctx, float *x, float a, int64_t n) {
    ew_job j = {.y = x, .alpha = a};
    lt_parallel_for(lt_ctx_threads(ctx), n, EW_GRAIN, scale_f, &j);
}

/* One float64 partial per thread slot; the split is static, so the same thread count gives the
 * same sum. */
#define SUMSQ_MAX_THREADS 256

typedef struct sumsq_job {
    const float *x;
    double part[SUMSQ_MAX_THREADS];
} sumsq_job;

static void sumsq_f(void *arg, int64_t i0, int64_t i1, int thread) {
    sumsq_job *j = arg;
    double s = 0;
    for (int64_t i = i0; i < i1; i++) s += (double)j->x[i] * (double)j->x[i];
    j->part[thread] = s;
}

float lt_cpu_sumsq(lt_ctx *ctx, const float *x, int64_t n) {
    sumsq_job j;
    memset(&j, 0, sizeof j);
    j.x = x;
    int threads = lt_parallel_threads(lt_ctx_threads(ctx));
    if (threads > SUMSQ_MAX_THREADS) threads = SUMSQ_MAX_THREADS;
    lt_parallel_for(threads, n, EW_GRAIN, sumsq_f, &j);
    double s = 0;
    for (int t = 0; t < SUMSQ_MAX_THREADS; t++) s += j.part[t];
    return (float)s;
}
