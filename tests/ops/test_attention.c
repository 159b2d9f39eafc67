/* Attention (naive oracle and flash, CPU): forward and backward against a float64 attention with
 * an explicit mask for every option (GQA ratios, window, softcap, packed rows with empty and
 * length-1 sequences, custom layouts, scale), bf16 against twice the error of a naive bf16
 * computation, gradients against float64 finite differences, packed rows against their sequences
 * run alone, typed errors for bad inputs, poisoned outputs, and the exact workspace size. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"

static uint64_t rng;

/* ---- a test case and its buffers ------------------------------------------------------- */

enum { LAYOUT_CONTIG, LAYOUT_BHTD, LAYOUT_PADDED };

typedef struct {
    int64_t B, T, H, Hkv, D, window;
    float scale, softcap;
    const int32_t *offs; /* (B, S+1) or NULL */
    int64_t S;
    int layout;
} tcase;

/* A (B, T, heads, D) tensor in some layout; n elements including the gaps of the layout. */
typedef struct {
    void *data;
    size_t n;
    lt_attention_layout l;
    int64_t heads;
    lt_dtype dt;
} tbuf;

static lt_attention_layout make_layout(int kind, int64_t T, int64_t heads, int64_t D, int pad) {
    lt_attention_layout l = {0, 0, 0};
    if (kind == LAYOUT_BHTD) {
        l.token = D;
        l.head = T * D;
        l.batch = heads * T * D;
    } else if (kind == LAYOUT_PADDED) {
        l.head = D + 3 + pad;
        l.token = heads * l.head + 5;
        l.batch = T * l.token + 7;
    }
    return l;
}

static lt_attention_layout resolved(lt_attention_layout l, int64_t T, int64_t heads, int64_t D) {
    if (!l.batch && !l.token && !l.head) return (lt_attention_layout){T * heads * D, heads * D, D};
    return l;
}

static tbuf buf_new(const tcase *c, lt_dtype dt, int64_t heads, lt_attention_layout l) {
    tbuf t = {.l = l, .heads = heads, .dt = dt};
    lt_attention_layout r = resolved(l, c->T, heads, c->D);
    t.n = (size_t)((c->B - 1) * r.batch + (c->T - 1) * r.token + (heads - 1) * r.head + c->D);
    t.data = malloc(t.n * (dt == LT_DTYPE_F32 ? 4 : 2));
    assert_non_null(t.data);
    return t;
}

static size_t buf_off(const tbuf *t, const tcase *c, int64_t b, int64_t i, int64_t h, int64_t d) {
    lt_attention_layout r = resolved(t->l, c->T, t->heads, c->D);
    return (size_t)(b * r.batch + i * r.token + h * r.head + d);
}

static double buf_get(const tbuf *t, size_t off) {
    if (t->dt == LT_DTYPE_F32) return ((const float *)t->data)[off];
    return lt_bf16_to_f32(((const uint16_t *)t->data)[off]);
}

static void buf_set(tbuf *t, size_t off, double x) {
    if (t->dt == LT_DTYPE_F32) ((float *)t->data)[off] = (float)x;
    else ((uint16_t *)t->data)[off] = lt_f32_to_bf16((float)x);
}

/* Every element (gaps included) random, or poisoned. */
static void buf_fill(tbuf *t, int poison) {
    for (size_t i = 0; i < t->n; i++) buf_set(t, i, poison ? LT_TEST_POISON : lt_test_normal(&rng));
}

/* The logical elements as float64 (B, T, heads, D), contiguous. */
static double *buf_to_f64(const tbuf *t, const tcase *c) {
    double *x = malloc(sizeof(double) * (size_t)(c->B * c->T * t->heads * c->D));
    assert_non_null(x);
    size_t n = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->T; i++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t d = 0; d < c->D; d++) x[n++] = buf_get(t, buf_off(t, c, b, i, h, d));
    return x;
}

/* Every logical element written (no poison left) and every gap untouched (still poison). */
static void assert_written(const tbuf *t, const tcase *c) {
    char *logical = calloc(t->n, 1);
    assert_non_null(logical);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < c->T; i++)
            for (int64_t h = 0; h < t->heads; h++)
                for (int64_t d = 0; d < c->D; d++) logical[buf_off(t, c, b, i, h, d)] = 1;
    const double poison = buf_get(&(tbuf){.data = &(float){LT_TEST_POISON}, .dt = LT_DTYPE_F32}, 0);
    const double poison_t = t->dt == LT_DTYPE_F32 ? poison : lt_bf16_to_f32(lt_f32_to_bf16((float)poison));
    for (size_t i = 0; i < t->n; i++) {
        double x = buf_get(t, i);
        if (logical[i]) {
            assert_true(isfinite(x) && x != poison_t);
        } else {
            assert_true(x == poison_t);
        }
    }
    free(logical);
}

/* ---- float64 reference with an explicit mask --------------------------------------------- */

static double rnd_bf16(double x) { return lt_bf16_to_f32(lt_f32_to_bf16((float)x)); }

/* Sequence id of every token of row b, by a linear walk of the offsets (the library searches). */
static void seq_ids(const tcase *c, int64_t b, int64_t *id) {
    for (int64_t i = 0; i < c->T; i++) {
        id[i] = 0;
        if (!c->offs) continue;
        const int32_t *o = c->offs + b * (c->S + 1);
        for (int64_t s = 0; s < c->S; s++)
            if (o[s] <= i && i < o[s + 1]) id[i] = s;
    }
}

/* Forward (and backward when dout) of contiguous float64 (B, T, heads, D) tensors. With bf16 set
 * it is the naive bf16 computation: scores, probabilities, output, dP, D, dS and the gradients are
 * rounded to bf16 as a framework holding bf16 intermediates would. */
static void ref_attention(const tcase *c, int bf16, const double *q, const double *k, const double *v,
                          const double *dout, double *o, double *lse, double *dq, double *dk, double *dv) {
    const int64_t T = c->T, D = c->D, H = c->H, Hkv = c->Hkv, group = H / Hkv;
    const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D), cap = c->softcap;
#define R(x) (bf16 ? rnd_bf16(x) : (x))
    double *Sc = malloc(sizeof(double) * (size_t)(T * T)), *P = malloc(sizeof(double) * (size_t)(T * T));
    int64_t *id = malloc(sizeof(int64_t) * (size_t)T);
    assert_true(Sc && P && id);
    if (dout) {
        memset(dk, 0, sizeof(double) * (size_t)(c->B * T * Hkv * D));
        memset(dv, 0, sizeof(double) * (size_t)(c->B * T * Hkv * D));
    }
    for (int64_t b = 0; b < c->B; b++) {
        seq_ids(c, b, id);
        for (int64_t h = 0; h < H; h++) {
            const int64_t g = h / group;
#define Q(i) (q + ((b * T + (i)) * H + h) * D)
#define K(i) (k + ((b * T + (i)) * Hkv + g) * D)
#define V(i) (v + ((b * T + (i)) * Hkv + g) * D)
#define DO(i) (dout + ((b * T + (i)) * H + h) * D)
            for (int64_t i = 0; i < T; i++) {
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j < T; j++) {
                    int vis = id[i] == id[j] && j <= i && (c->window == 0 || i - j < c->window);
                    Sc[i * T + j] = -INFINITY;
                    if (!vis) continue;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += Q(i)[d] * K(j)[d];
                    s = R(s * scale);
                    if (cap > 0) s = R(cap * tanh(s / cap));
                    Sc[i * T + j] = s;
                    m = s > m ? s : m;
                }
                for (int64_t j = 0; j < T; j++) sum += Sc[i * T + j] == -INFINITY ? 0 : exp(Sc[i * T + j] - m);
                lse[(b * H + h) * T + i] = m + log(sum);
                double *oi = o + ((b * T + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++) oi[d] = 0;
                for (int64_t j = 0; j < T; j++) {
                    double p = Sc[i * T + j] == -INFINITY ? 0 : R(exp(Sc[i * T + j] - m) / sum);
                    P[i * T + j] = p;
                    for (int64_t d = 0; d < D; d++) oi[d] += p * V(j)[d];
                }
                for (int64_t d = 0; d < D; d++) oi[d] = R(oi[d]);
            }
            if (!dout) continue;
            for (int64_t i = 0; i < T; i++) {
                double Di = 0, *dqi = dq + ((b * T + i) * H + h) * D;
                /* dP_ij = dO_i . V_j for this row. */
                double *dp = malloc(sizeof(double) * (size_t)T);
                assert_non_null(dp);
                for (int64_t j = 0; j < T; j++) {
                    double x = 0;
                    if (Sc[i * T + j] != -INFINITY)
                        for (int64_t d = 0; d < D; d++) x += DO(i)[d] * V(j)[d];
                    dp[j] = R(x);
                    Di += P[i * T + j] * dp[j];
                }
                Di = R(Di);
                for (int64_t d = 0; d < D; d++) dqi[d] = 0;
                for (int64_t j = 0; j < T; j++) {
                    const double p = P[i * T + j], sc = Sc[i * T + j];
                    if (sc == -INFINITY) continue;
                    const double gcap = cap > 0 ? 1 - (sc / cap) * (sc / cap) : 1;
                    const double ds = R(p * (dp[j] - Di) * gcap);
                    for (int64_t d = 0; d < D; d++) {
                        dqi[d] += scale * ds * K(j)[d];
                        dk[((b * T + j) * Hkv + g) * D + d] += scale * ds * Q(i)[d];
                        dv[((b * T + j) * Hkv + g) * D + d] += p * DO(i)[d];
                    }
                }
                for (int64_t d = 0; d < D; d++) dqi[d] = R(dqi[d]);
                free(dp);
            }
#undef Q
#undef K
#undef V
#undef DO
        }
    }
    if (dout && bf16)
        for (int64_t i = 0; i < c->B * T * Hkv * D; i++) {
            dk[i] = R(dk[i]);
            dv[i] = R(dv[i]);
        }
#undef R
    free(Sc);
    free(P);
    free(id);
}

/* ---- running the library on a case ------------------------------------------------------ */

typedef struct {
    tcase c;
    lt_dtype dt;
    tbuf q, k, v, o, dout, dq, dk, dv;
    float *lse;
    double *q64, *k64, *v64, *do64; /* the inputs as the library sees them */
} fixture;

static lt_attention_params params_of(const tcase *c, lt_dtype dt, lt_attention_impl impl) {
    lt_attention_params p = {.B = c->B, .T = c->T, .H = c->H, .Hkv = c->Hkv, .D = c->D, .dtype = dt,
                             .device = LT_DEVICE_CPU, .impl = impl, .scale = c->scale, .window = c->window,
                             .softcap = c->softcap, .seq_offsets = c->offs, .S = c->offs ? c->S : 0};
    p.q_layout = make_layout(c->layout, c->T, c->H, c->D, 0);
    p.kv_layout = make_layout(c->layout, c->T, c->Hkv, c->D, 1);
    /* Padded cases give out/dout a third, different layout. */
    p.o_layout = make_layout(c->layout == LAYOUT_PADDED ? LAYOUT_BHTD : c->layout, c->T, c->H, c->D, 2);
    return p;
}

static void fixture_init(fixture *f, const tcase *c, lt_dtype dt) {
    memset(f, 0, sizeof *f);
    f->c = *c;
    f->dt = dt;
    lt_attention_params p = params_of(c, dt, LT_ATTENTION_AUTO);
    f->q = buf_new(c, dt, c->H, p.q_layout);
    f->dq = buf_new(c, dt, c->H, p.q_layout);
    f->k = buf_new(c, dt, c->Hkv, p.kv_layout);
    f->v = buf_new(c, dt, c->Hkv, p.kv_layout);
    f->dk = buf_new(c, dt, c->Hkv, p.kv_layout);
    f->dv = buf_new(c, dt, c->Hkv, p.kv_layout);
    f->o = buf_new(c, dt, c->H, p.o_layout);
    f->dout = buf_new(c, dt, c->H, p.o_layout);
    buf_fill(&f->q, 0);
    buf_fill(&f->k, 0);
    buf_fill(&f->v, 0);
    buf_fill(&f->dout, 0);
    tbuf *outs[] = {&f->o, &f->dq, &f->dk, &f->dv};
    for (int i = 0; i < 4; i++) buf_fill(outs[i], 1);
    f->lse = malloc(sizeof(float) * (size_t)(c->B * c->H * c->T));
    assert_non_null(f->lse);
    f->q64 = buf_to_f64(&f->q, c);
    f->k64 = buf_to_f64(&f->k, c);
    f->v64 = buf_to_f64(&f->v, c);
    f->do64 = buf_to_f64(&f->dout, c);
}

static void fixture_free(fixture *f) {
    tbuf *b[] = {&f->q, &f->k, &f->v, &f->o, &f->dout, &f->dq, &f->dk, &f->dv};
    for (int i = 0; i < 8; i++) free(b[i]->data);
    free(f->lse);
    free(f->q64);
    free(f->k64);
    free(f->v64);
    free(f->do64);
}

/* Poisons every output, runs forward then backward, checks every output element was written. */
static void fixture_run(lt_ctx *ctx, fixture *f, lt_attention_impl impl) {
    lt_attention_params p = params_of(&f->c, f->dt, impl);
    tbuf *outs[] = {&f->o, &f->dq, &f->dk, &f->dv};
    for (int i = 0; i < 4; i++) buf_fill(outs[i], 1);
    const size_t nl = (size_t)(f->c.B * f->c.H * f->c.T);
    for (size_t i = 0; i < nl; i++) f->lse[i] = LT_TEST_POISON;
    lt_attention_args a = {.q = f->q.data, .k = f->k.data, .v = f->v.data, .out = f->o.data, .lse = f->lse,
                           .dout = f->dout.data, .dq = f->dq.data, .dk = f->dk.data, .dv = f->dv.data};
    lt_status s = lt_attention_forward(ctx, &p, &a);
    if (s != LT_OK) fail_msg("forward: %s", lt_ctx_error(ctx));
    s = lt_attention_backward(ctx, &p, &a);
    if (s != LT_OK) fail_msg("backward: %s", lt_ctx_error(ctx));
    for (int i = 0; i < 4; i++) assert_written(outs[i], &f->c);
    for (size_t i = 0; i < nl; i++) assert_true(isfinite(f->lse[i]) && f->lse[i] != LT_TEST_POISON);
}

typedef struct {
    double *o, *lse, *dq, *dk, *dv;
} refout;

static refout ref_run(const fixture *f, int bf16) {
    const tcase *c = &f->c;
    const size_t nq = (size_t)(c->B * c->T * c->H * c->D), nk = (size_t)(c->B * c->T * c->Hkv * c->D);
    refout r = {malloc(nq * 8), malloc((size_t)(c->B * c->H * c->T) * 8), malloc(nq * 8), malloc(nk * 8),
                malloc(nk * 8)};
    assert_true(r.o && r.lse && r.dq && r.dk && r.dv);
    ref_attention(c, bf16, f->q64, f->k64, f->v64, f->do64, r.o, r.lse, r.dq, r.dk, r.dv);
    return r;
}

static void ref_free(refout *r) {
    free(r->o);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
}

static double max_abs(const double *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* max |buf - ref| over the logical elements. */
static double buf_err(const tbuf *t, const tcase *c, const double *ref) {
    double *x = buf_to_f64(t, c), e = 0;
    const size_t n = (size_t)(c->B * c->T * t->heads * c->D);
    for (size_t i = 0; i < n; i++) e = fabs(x[i] - ref[i]) > e ? fabs(x[i] - ref[i]) : e;
    free(x);
    return e;
}

static double lse_err(const float *lse, const double *ref, size_t n) {
    double e = 0;
    for (size_t i = 0; i < n; i++) e = fabs(lse[i] - ref[i]) > e ? fabs(lse[i] - ref[i]) : e;
    return e;
}

/* fp32: every element within LT_TOL_F32_REL of the tensor's largest reference magnitude, or of 1
 * when that is smaller: the inputs are unit normal, so the terms summed are at least O(1) even when
 * a gradient cancels to ~0 (window 1: dS = P (dP - D) with dP = D exactly). */
static void check_f32(const char *what, const char *name, double err, const double *ref, size_t n) {
    const double tol = LT_TOL_F32_REL * fmax(max_abs(ref, n), 1.0) + LT_TOL_F32_ABS;
    if (err > tol) fail_msg("%s: %s max error %.3g > tolerance %.3g", what, name, err, tol);
}

/* ---- cases --------------------------------------------------------------------------------- */

static const int32_t offs_a[] = {0, 1, 1, 65, 100, 150, /* row 1: */ 0, 150, 150, 150, 150, 150};
static const int32_t offs_b[] = {0, 0, 30, 31, 97, /* */ 0, 40, 41, 41, 97, /* */ 0, 97, 97, 97, 97};

static const tcase cases[] = {
    {.B = 2, .T = 130, .H = 4, .Hkv = 4, .D = 16},                                       /* MHA */
    {.B = 1, .T = 150, .H = 4, .Hkv = 1, .D = 64, .window = 37},                          /* GQA 4 */
    {.B = 2, .T = 150, .H = 6, .Hkv = 1, .D = 24, .softcap = 3, .scale = 0.3f, .layout = LAYOUT_BHTD},
    {.B = 2, .T = 150, .H = 2, .Hkv = 1, .D = 80, .window = 20, .offs = offs_a, .S = 5, .layout = LAYOUT_PADDED},
    {.B = 1, .T = 70, .H = 2, .Hkv = 2, .D = 256, .softcap = 5, .window = 64},
    {.B = 1, .T = 1, .H = 1, .Hkv = 1, .D = 1},
    {.B = 3, .T = 97, .H = 4, .Hkv = 2, .D = 96, .offs = offs_b, .S = 4, .layout = LAYOUT_PADDED, .softcap = 4},
    {.B = 1, .T = 128, .H = 2, .Hkv = 1, .D = 128, .window = 1},
    {.B = 1, .T = 65, .H = 3, .Hkv = 3, .D = 7, .window = 64, .scale = 1.5f, .layout = LAYOUT_BHTD},
    /* the CPU kernels stack the query heads of a kv group; the backward runs at most 4 kv heads
     * at once, so 5 takes two passes (and a group of 3, SmolLM2's, on packed rows) */
    {.B = 1, .T = 140, .H = 10, .Hkv = 5, .D = 8, .window = 90},
    {.B = 3, .T = 97, .H = 6, .Hkv = 2, .D = 16, .offs = offs_b, .S = 4},
    /* more key tiles than the CPU backward's 4 dQ buckets: a bucket accumulates several tiles */
    {.B = 1, .T = 330, .H = 3, .Hkv = 1, .D = 16},
};
#define NCASES (sizeof cases / sizeof cases[0])

static void describe(const tcase *c, char *buf, size_t n) {
    snprintf(buf, n, "B=%lld T=%lld H=%lld Hkv=%lld D=%lld window=%lld softcap=%g scale=%g packed=%d layout=%d",
             (long long)c->B, (long long)c->T, (long long)c->H, (long long)c->Hkv, (long long)c->D,
             (long long)c->window, (double)c->softcap, (double)c->scale, c->offs != NULL, c->layout);
}

static void f32_matches_float64_reference(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (size_t ci = 0; ci < NCASES; ci++) {
        fixture f;
        fixture_init(&f, &cases[ci], LT_DTYPE_F32);
        refout r = ref_run(&f, 0);
        const tcase *c = &f.c;
        const size_t nq = (size_t)(c->B * c->T * c->H * c->D), nk = (size_t)(c->B * c->T * c->Hkv * c->D);
        for (int impl = LT_ATTENTION_FLASH; impl <= LT_ATTENTION_NAIVE; impl++) {
            char what[256];
            describe(c, what, sizeof what);
            strcat(what, impl == LT_ATTENTION_FLASH ? " flash" : " naive");
            fixture_run(ctx, &f, (lt_attention_impl)impl);
            check_f32(what, "out", buf_err(&f.o, c, r.o), r.o, nq);
            check_f32(what, "lse", lse_err(f.lse, r.lse, (size_t)(c->B * c->H * c->T)), r.lse,
                      (size_t)(c->B * c->H * c->T));
            check_f32(what, "dq", buf_err(&f.dq, c, r.dq), r.dq, nq);
            check_f32(what, "dk", buf_err(&f.dk, c, r.dk), r.dk, nk);
            check_f32(what, "dv", buf_err(&f.dv, c, r.dv), r.dv, nk);
        }
        ref_free(&r);
        fixture_free(&f);
    }
    lt_ctx_free(ctx);
}

/* bf16: the error against float64 (on the same bf16 inputs) is at most twice that of a naive bf16
 * computation. */
static void bf16_within_twice_naive_bf16(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const size_t pick[] = {0, 1, 2, 3, 6, 10};
    for (size_t pi = 0; pi < sizeof pick / sizeof pick[0]; pi++) {
        fixture f;
        fixture_init(&f, &cases[pick[pi]], LT_DTYPE_BF16);
        refout r = ref_run(&f, 0), nb = ref_run(&f, 1);
        const tcase *c = &f.c;
        const size_t nq = (size_t)(c->B * c->T * c->H * c->D), nk = (size_t)(c->B * c->T * c->Hkv * c->D);
        const size_t nl = (size_t)(c->B * c->H * c->T);
        struct {
            const char *name;
            const double *ref, *naive;
            size_t n;
            const tbuf *t;
        } outs[] = {{"out", r.o, nb.o, nq, &f.o}, {"dq", r.dq, nb.dq, nq, &f.dq},
                    {"dk", r.dk, nb.dk, nk, &f.dk}, {"dv", r.dv, nb.dv, nk, &f.dv}};
        for (int impl = LT_ATTENTION_FLASH; impl <= LT_ATTENTION_NAIVE; impl++) {
            char what[256];
            describe(c, what, sizeof what);
            fixture_run(ctx, &f, (lt_attention_impl)impl);
            for (int o = 0; o < 4; o++) {
                double naive_err = 0;
                for (size_t i = 0; i < outs[o].n; i++) {
                    double e = fabs(outs[o].naive[i] - outs[o].ref[i]);
                    naive_err = e > naive_err ? e : naive_err;
                }
                double err = buf_err(outs[o].t, c, outs[o].ref);
                if (err > 2 * naive_err)
                    fail_msg("%s %s bf16 %s: error %.3g > 2 x naive bf16 error %.3g", what,
                             impl == LT_ATTENTION_FLASH ? "flash" : "naive", outs[o].name, err, naive_err);
            }
            double lerr = lse_err(f.lse, r.lse, nl), lnaive = 0;
            for (size_t i = 0; i < nl; i++) lnaive = fmax(lnaive, fabs(nb.lse[i] - r.lse[i]));
            assert_true(lerr <= 2 * lnaive + LT_TOL_F32_REL * max_abs(r.lse, nl));
        }
        ref_free(&r);
        ref_free(&nb);
        fixture_free(&f);
    }
    lt_ctx_free(ctx);
}

/* loss = sum(dout * out) of the float64 reference, for finite differences. */
static double ref_loss(const fixture *f) {
    const tcase *c = &f->c;
    const size_t nq = (size_t)(c->B * c->T * c->H * c->D);
    double *o = malloc(nq * 8), *lse = malloc((size_t)(c->B * c->H * c->T) * 8), l = 0;
    assert_true(o && lse);
    ref_attention(c, 0, f->q64, f->k64, f->v64, NULL, o, lse, NULL, NULL, NULL);
    for (size_t i = 0; i < nq; i++) l += o[i] * f->do64[i];
    free(o);
    free(lse);
    return l;
}

static void gradients_match_finite_differences(void **state) {
    (void)state;
    static const int32_t offs[] = {0, 4, 4, 5, 9};
    const tcase small[] = {
        {.B = 1, .T = 9, .H = 2, .Hkv = 1, .D = 3, .window = 3, .softcap = 2, .scale = 0.7f, .offs = offs, .S = 4},
        {.B = 1, .T = 70, .H = 2, .Hkv = 1, .D = 2, .layout = LAYOUT_PADDED}, /* crosses a tile edge */
        {.B = 2, .T = 12, .H = 4, .Hkv = 2, .D = 5, .window = 5, .softcap = 1.5f},
    };
    lt_ctx *ctx = lt_ctx_new();
    for (size_t ci = 0; ci < sizeof small / sizeof small[0]; ci++) {
        fixture f;
        fixture_init(&f, &small[ci], LT_DTYPE_F32);
        refout r = ref_run(&f, 0);
        const tcase *c = &f.c;
        const size_t nq = (size_t)(c->B * c->T * c->H * c->D), nk = (size_t)(c->B * c->T * c->Hkv * c->D);
        double *inputs[] = {f.q64, f.k64, f.v64};
        const double *analytic[] = {r.dq, r.dk, r.dv};
        const tbuf *lib[] = {&f.dq, &f.dk, &f.dv};
        const size_t n[] = {nq, nk, nk};
        const double h = 1e-5;
        double *fd[3];
        for (int t = 0; t < 3; t++) {
            fd[t] = malloc(n[t] * 8);
            assert_non_null(fd[t]);
            for (size_t i = 0; i < n[t]; i++) {
                const double x = inputs[t][i];
                inputs[t][i] = x + h;
                double lp = ref_loss(&f);
                inputs[t][i] = x - h;
                double lm = ref_loss(&f);
                inputs[t][i] = x;
                fd[t][i] = (lp - lm) / (2 * h);
            }
            const double scale = max_abs(fd[t], n[t]);
            for (size_t i = 0; i < n[t]; i++) assert_true(fabs(analytic[t][i] - fd[t][i]) <= 1e-7 * scale + 1e-9);
        }
        for (int impl = LT_ATTENTION_FLASH; impl <= LT_ATTENTION_NAIVE; impl++) {
            fixture_run(ctx, &f, (lt_attention_impl)impl);
            for (int t = 0; t < 3; t++)
                check_f32(impl == LT_ATTENTION_FLASH ? "finite differences, flash" : "finite differences, naive",
                          t == 0 ? "dq" : t == 1 ? "dk" : "dv", buf_err(lib[t], c, fd[t]), fd[t], n[t]);
        }
        for (int t = 0; t < 3; t++) free(fd[t]);
        ref_free(&r);
        fixture_free(&f);
    }
    lt_ctx_free(ctx);
}

/* A packed row equals each of its sequences run alone (fp32, flash). */
static void packed_row_equals_sequences_alone(void **state) {
    (void)state;
    static const int32_t offs[] = {0, 70, 70, 71, 200, 300};
    const int64_t windows[] = {0, 50};
    lt_ctx *ctx = lt_ctx_new();
    for (int wi = 0; wi < 2; wi++) {
        const tcase pc = {.B = 1, .T = 300, .H = 4, .Hkv = 2, .D = 32, .window = windows[wi], .offs = offs, .S = 5};
        fixture f;
        fixture_init(&f, &pc, LT_DTYPE_F32);
        fixture_run(ctx, &f, LT_ATTENTION_FLASH);
        for (int s = 0; s < 5; s++) {
            const int64_t a = offs[s], len = offs[s + 1] - offs[s];
            if (len == 0) continue;
            const tcase sc = {.B = 1, .T = len, .H = 4, .Hkv = 2, .D = 32, .window = windows[wi]};
            fixture g;
            fixture_init(&g, &sc, LT_DTYPE_F32);
            /* Copy the sequence's inputs out of the packed row. */
            struct {
                tbuf *dst;
                const tbuf *src;
            } in[] = {{&g.q, &f.q}, {&g.k, &f.k}, {&g.v, &f.v}, {&g.dout, &f.dout}};
            for (int t = 0; t < 4; t++)
                for (int64_t i = 0; i < len; i++)
                    for (int64_t h = 0; h < in[t].src->heads; h++)
                        for (int64_t d = 0; d < 32; d++)
                            buf_set(in[t].dst, buf_off(in[t].dst, &sc, 0, i, h, d),
                                    buf_get(in[t].src, buf_off(in[t].src, &pc, 0, a + i, h, d)));
            fixture_run(ctx, &g, LT_ATTENTION_FLASH);
            struct {
                const tbuf *alone, *packed;
            } out[] = {{&g.o, &f.o}, {&g.dq, &f.dq}, {&g.dk, &f.dk}, {&g.dv, &f.dv}};
            for (int t = 0; t < 4; t++) {
                double mx = 0, err = 0;
                for (int64_t i = 0; i < len; i++)
                    for (int64_t h = 0; h < out[t].alone->heads; h++)
                        for (int64_t d = 0; d < 32; d++) {
                            double x = buf_get(out[t].alone, buf_off(out[t].alone, &sc, 0, i, h, d));
                            double y = buf_get(out[t].packed, buf_off(out[t].packed, &pc, 0, a + i, h, d));
                            mx = fmax(mx, fabs(x));
                            err = fmax(err, fabs(x - y));
                        }
                if (err > 1e-6 * mx) fail_msg("window %lld sequence %d output %d: packed differs by %.3g (max %.3g)",
                                              (long long)windows[wi], s, t, err, mx);
            }
            for (int64_t h = 0; h < 4; h++)
                for (int64_t i = 0; i < len; i++)
                    assert_true(fabs(g.lse[h * len + i] - f.lse[h * 300 + a + i]) <= 1e-6 * fmax(1, fabs(g.lse[h * len + i])));
            fixture_free(&g);
        }
        fixture_free(&f);
    }
    lt_ctx_free(ctx);
}

static void expect(lt_ctx *ctx, const lt_attention_params *p, lt_status want, const char *substr) {
    lt_ctx_clear_error(ctx);
    lt_status s = lt_attention_check(ctx, p);
    if (s != want || !strstr(lt_ctx_error(ctx), substr))
        fail_msg("want status %d with '%s', got %d: '%s'", (int)want, substr, (int)s, lt_ctx_error(ctx));
}

static void bad_inputs_give_typed_errors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    int32_t offs[] = {0, 3, 8, /* row 1 */ 0, 5, 8};
    const lt_attention_params good = {.B = 2, .T = 8, .H = 4, .Hkv = 2, .D = 16, .dtype = LT_DTYPE_F32,
                                      .seq_offsets = offs, .S = 2};
    assert_int_equal(lt_attention_check(ctx, &good), LT_OK);
    lt_attention_params p;
#define CASE(field_assign, status, substr) \
    p = good;                              \
    field_assign;                          \
    expect(ctx, &p, status, substr)
    CASE(p.H = 3, LT_ERR_INVALID_ARG, "not a multiple of Hkv");
    CASE(p.D = 0, LT_ERR_SHAPE, "D=0");
    CASE(p.T = -1, LT_ERR_SHAPE, "T=-1");
    CASE(p.D = 257, LT_ERR_UNSUPPORTED, "D=257");
    CASE(p.dtype = LT_DTYPE_F16, LT_ERR_UNSUPPORTED, "f16");
    CASE(p.dtype = LT_DTYPE_Q4_0, LT_ERR_DTYPE, "q4_0");
    CASE(p.window = -2, LT_ERR_INVALID_ARG, "window -2");
    CASE(p.scale = -1, LT_ERR_INVALID_ARG, "scale");
    CASE(p.scale = NAN, LT_ERR_INVALID_ARG, "scale");
    CASE(p.softcap = INFINITY, LT_ERR_INVALID_ARG, "softcap");
    CASE(p.impl = (lt_attention_impl)7, LT_ERR_INVALID_ARG, "impl");
    CASE(p.q_layout = ((lt_attention_layout){.batch = 1000, .token = 8, .head = 16}), LT_ERR_INVALID_ARG,
         "q token stride 8");
    CASE(p.kv_layout = ((lt_attention_layout){.batch = -5, .token = 64, .head = 16}), LT_ERR_INVALID_ARG, "kv batch");
    CASE(p.o_layout = ((lt_attention_layout){.batch = 10000, .token = 64, .head = INT64_MAX / 2}),
         LT_ERR_INVALID_ARG, "out layout overflows");
    CASE(p.S = 0, LT_ERR_INVALID_ARG, "S=0");
    CASE((p.seq_offsets = NULL, p.S = 2), LT_ERR_INVALID_ARG, "without seq_offsets");
    CASE(p.device = LT_DEVICE_CUDA, LT_ERR_UNSUPPORTED, "D=16 has no CUDA kernel");
#if LT_HAVE_CUDA
    CASE((p.device = LT_DEVICE_CUDA, p.D = 64), LT_OK, ""); /* the CUDA kernels are in this build */
#else
    CASE((p.device = LT_DEVICE_CUDA, p.D = 64), LT_ERR_UNSUPPORTED, "CUDA attention is not in this build");
#endif
    offs[4] = 2; /* row 1: 0, 2, 8 is fine; make it non-monotone next */
    CASE((void)0, LT_OK, "");
    offs[4] = 9;
    CASE((void)0, LT_ERR_INVALID_ARG, "row 1 index 2: 8 < 9");
    offs[4] = 5;
    offs[3] = 1;
    CASE((void)0, LT_ERR_INVALID_ARG, "row 1 starts at 1");
    offs[3] = 0;
    offs[2] = 7;
    CASE((void)0, LT_ERR_INVALID_ARG, "row 0 ends at 7, not T = 8");
    offs[2] = 8;
#undef CASE
    /* Missing tensors and a short workspace, through the entry points. */
    float buf[2 * 8 * 4 * 16], lse[2 * 4 * 8];
    lt_attention_args a = {.q = buf, .k = buf, .v = buf, .out = NULL, .lse = lse};
    assert_int_equal(lt_attention_forward(ctx, &good, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "must all be set"));
    assert_int_equal(lt_attention_forward(ctx, &good, NULL), LT_ERR_INVALID_ARG);
    a.out = buf;
    assert_int_equal(lt_attention_backward(ctx, &good, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "dout, dq, dk and dv"));
    a.workspace = (char *)buf + 4;
    a.workspace_size = 1 << 20;
    assert_int_equal(lt_attention_forward(ctx, &good, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "not aligned to 64 bytes"));
    static _Alignas(64) float ws[16];
    a.workspace = ws;
    a.workspace_size = 16;
    assert_int_equal(lt_attention_forward(ctx, &good, &a), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "workspace of 16 bytes"));
    assert_int_equal(lt_attention_check(ctx, NULL), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

/* The workspace the entry points allocate is exactly lt_attention_workspace_bytes; a caller's
 * workspace gives the same results with no allocation; allocation failure is LT_ERR_OOM. */
static void workspace_is_exactly_what_is_allocated(void **state) {
    (void)state;
    const tcase c = cases[3];
    for (int dt = 0; dt < 2; dt++)
        for (int impl = LT_ATTENTION_FLASH; impl <= LT_ATTENTION_NAIVE; impl++)
            for (int threads = 1; threads <= 3; threads += 2) {
                lt_ctx *ctx = lt_ctx_new();
                lt_ctx_set_threads(ctx, threads);
                fixture f;
                fixture_init(&f, &c, dt ? LT_DTYPE_BF16 : LT_DTYPE_F32);
                lt_attention_params p = params_of(&c, f.dt, (lt_attention_impl)impl);
                lt_attention_args a = {.q = f.q.data, .k = f.k.data, .v = f.v.data, .out = f.o.data, .lse = f.lse,
                                       .dout = f.dout.data, .dq = f.dq.data, .dk = f.dk.data, .dv = f.dv.data};
                for (int bwd = 0; bwd < 2; bwd++) {
                    const size_t want = lt_attention_workspace_bytes(&p, bwd, threads);
                    assert_true(want > 0);
                    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
                    const size_t before = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
                    lt_status s = bwd ? lt_attention_backward(ctx, &p, &a) : lt_attention_forward(ctx, &p, &a);
                    assert_int_equal(s, LT_OK);
                    lt_mem_stats st = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
                    assert_int_equal(st.peak_bytes - before, lt_alloc_accounted_size(LT_DEVICE_CPU, want));
                    assert_int_equal(st.used_bytes, before);
                }
                /* Keep the results, rerun with a caller's workspace: identical, nothing allocated. */
                tbuf *outs[] = {&f.o, &f.dq, &f.dk, &f.dv};
                void *keep[4];
                const size_t es = f.dt == LT_DTYPE_F32 ? 4 : 2;
                for (int i = 0; i < 4; i++) {
                    keep[i] = malloc(outs[i]->n * es);
                    memcpy(keep[i], outs[i]->data, outs[i]->n * es);
                    buf_fill(outs[i], 1);
                }
                const size_t wf = lt_attention_workspace_bytes(&p, 0, threads),
                             wb = (wf > lt_attention_workspace_bytes(&p, 1, threads) ? wf
                                   : lt_attention_workspace_bytes(&p, 1, threads));
                a.workspace_size = wb;
                a.workspace = aligned_alloc(64, (wb + 63) / 64 * 64);
                const uint64_t n0 = lt_mem_get_stats(ctx, LT_DEVICE_CPU).n_allocs;
                assert_int_equal(lt_attention_forward(ctx, &p, &a), LT_OK);
                assert_int_equal(lt_attention_backward(ctx, &p, &a), LT_OK);
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).n_allocs, n0);
                for (int i = 0; i < 4; i++) {
                    assert_memory_equal(keep[i], outs[i]->data, outs[i]->n * es);
                    free(keep[i]);
                }
                free(a.workspace);
                a.workspace = NULL;
                a.workspace_size = 0;
                lt_mem_fail_nth(ctx, 1);
                assert_int_equal(lt_attention_backward(ctx, &p, &a), LT_ERR_OOM);
                assert_non_null(strstr(lt_ctx_error(ctx), "attention workspace"));
                assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
                fixture_free(&f);
                lt_ctx_free(ctx);
            }
    /* Flash memory is linear in T; naive's is quadratic. */
    lt_attention_params p = {.B = 1, .T = 1024, .H = 8, .Hkv = 2, .D = 64, .dtype = LT_DTYPE_F32};
    size_t f1 = lt_attention_workspace_bytes(&p, 1, 2), n1;
    p.impl = LT_ATTENTION_NAIVE;
    n1 = lt_attention_workspace_bytes(&p, 0, 2);
    p.T = 2048;
    assert_true(lt_attention_workspace_bytes(&p, 0, 2) > 3 * n1);
    p.impl = LT_ATTENTION_FLASH;
    assert_true(lt_attention_workspace_bytes(&p, 1, 2) <= 2 * f1);
}

/* Every output element is computed by one work item the same way whatever the thread count. */
static void thread_count_case(const tcase c) {
    fixture f;
    fixture_init(&f, &c, LT_DTYPE_F32);
    tbuf *outs[] = {&f.o, &f.dq, &f.dk, &f.dv};
    void *first[4] = {0};
    for (int threads = 1; threads <= 4; threads += 3) {
        lt_ctx *ctx = lt_ctx_new();
        lt_ctx_set_threads(ctx, threads);
        fixture_run(ctx, &f, LT_ATTENTION_FLASH);
        for (int i = 0; i < 4; i++) {
            if (!first[i]) {
                first[i] = malloc(outs[i]->n * 4);
                memcpy(first[i], outs[i]->data, outs[i]->n * 4);
            } else {
                assert_memory_equal(first[i], outs[i]->data, outs[i]->n * 4);
            }
        }
        lt_ctx_free(ctx);
    }
    for (int i = 0; i < 4; i++) free(first[i]);
    fixture_free(&f);
}

static void results_do_not_depend_on_thread_count(void **state) {
    (void)state;
    thread_count_case(cases[6]);
    thread_count_case(cases[NCASES - 3]);
    thread_count_case(cases[NCASES - 2]);
    thread_count_case(cases[NCASES - 1]);
}

int main(void) {
    rng = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f32_matches_float64_reference),
        cmocka_unit_test(bf16_within_twice_naive_bf16),
        cmocka_unit_test(gradients_match_finite_differences),
        cmocka_unit_test(packed_row_equals_sequences_alone),
        cmocka_unit_test(bad_inputs_give_typed_errors),
        cmocka_unit_test(workspace_is_exactly_what_is_allocated),
        cmocka_unit_test(results_do_not_depend_on_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
