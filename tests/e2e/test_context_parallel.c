/* Context-parallel attention, ring and Ulysses: the zig-zag split is a balanced permutation;
 * forward and backward over a world of one and over 2 and 3 MPI processes (the test re-runs
 * itself under mpirun) match a float64 causal attention of the whole sequence and the single-rank
 * flash attention (lt_attention_forward/backward) within fp32 tolerance, every output element
 * written; bad shapes are typed errors; the workspace the planner prices is exactly what is
 * allocated (ring) or what the calls check for (Ulysses). A mixture-of-experts model (the
 * Qwen3-MoE fixture, its router's load-balancing loss on and, from the GGUF file, off) trained on
 * one row split over 2 and 4 ranks gives the cross entropy, the aux loss (the same on every rank)
 * and every LoRA gradient of the whole row on one process. */
#define _GNU_SOURCE
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/backends.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/attention.h"
#include "longtune/context_parallel.h"
#include "longtune/model.h"

/* ---- float64 reference of the whole sequence ---------------------------------------------- */

typedef struct {
    int64_t T, H, Hkv, D;
    float scale;
} shape;

typedef struct {
    float *q, *k, *v, *dout;              /* inputs, whole sequence */
    double *out, *lse, *dq, *dk, *dv;     /* float64 reference */
    float *fout, *flse, *fdq, *fdk, *fdv; /* single-rank flash, f32 */
} full;

static double sc(const shape *s) { return s->scale > 0 ? s->scale : 1.0 / sqrt((double)s->D); }

static void reference(const shape *s, full *f) {
    const int64_t T = s->T, H = s->H, Hkv = s->Hkv, D = s->D, grp = H / Hkv;
    double *p = calloc((size_t)T, sizeof *p), *dp = calloc((size_t)T, sizeof *dp);
    memset(f->dk, 0, (size_t)(T * Hkv * D) * sizeof(double));
    memset(f->dv, 0, (size_t)(T * Hkv * D) * sizeof(double));
    for (int64_t h = 0; h < H; h++) {
        int64_t g = h / grp;
        for (int64_t i = 0; i < T; i++) {
            const float *q = f->q + (i * H + h) * D, *dout = f->dout + (i * H + h) * D;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; j++) {
                double a = 0;
                for (int64_t d = 0; d < D; d++) a += (double)q[d] * f->k[(j * Hkv + g) * D + d];
                p[j] = a * sc(s);
                mx = fmax(mx, p[j]);
            }
            for (int64_t j = 0; j <= i; j++) sum += exp(p[j] - mx);
            f->lse[h * T + i] = mx + log(sum);
            double *o = f->out + (i * H + h) * D, delta = 0;
            for (int64_t d = 0; d < D; d++) o[d] = 0;
            for (int64_t j = 0; j <= i; j++) {
                p[j] = exp(p[j] - f->lse[h * T + i]);
                for (int64_t d = 0; d < D; d++) o[d] += p[j] * f->v[(j * Hkv + g) * D + d];
            }
            for (int64_t d = 0; d < D; d++) delta += (double)dout[d] * o[d];
            double *dq = f->dq + (i * H + h) * D;
            for (int64_t d = 0; d < D; d++) dq[d] = 0;
            for (int64_t j = 0; j <= i; j++) {
                double a = 0;
                for (int64_t d = 0; d < D; d++) a += (double)dout[d] * f->v[(j * Hkv + g) * D + d];
                dp[j] = p[j] * (a - delta) * sc(s);
                for (int64_t d = 0; d < D; d++) {
                    dq[d] += dp[j] * f->k[(j * Hkv + g) * D + d];
                    f->dk[(j * Hkv + g) * D + d] += dp[j] * q[d];
                    f->dv[(j * Hkv + g) * D + d] += p[j] * dout[d];
                }
            }
        }
    }
    free(p), free(dp);
}

static void flash(const shape *s, full *f) {
    lt_ctx *ctx = lt_ctx_new();
    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = 1, p.T = s->T, p.H = s->H, p.Hkv = s->Hkv, p.D = s->D;
    p.dtype = LT_DTYPE_F32, p.device = LT_DEVICE_CPU, p.impl = LT_ATTENTION_FLASH, p.scale = s->scale;
    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = f->q, a.k = f->k, a.v = f->v, a.out = f->fout, a.lse = f->flse, a.dout = f->dout;
    a.dq = f->fdq, a.dk = f->fdk, a.dv = f->fdv;
    assert_int_equal(lt_attention_forward(ctx, &p, &a), LT_OK);
    assert_int_equal(lt_attention_backward(ctx, &p, &a), LT_OK);
    lt_ctx_free(ctx);
}

static full make_full(const shape *s) {
    uint64_t rng = lt_test_seed() ^ (uint64_t)(s->T * 131 + s->H * 7 + s->Hkv);
    size_t nq = (size_t)(s->T * s->H * s->D), nk = (size_t)(s->T * s->Hkv * s->D), nl = (size_t)(s->T * s->H);
    full f;
    f.q = malloc(nq * 4), f.k = malloc(nk * 4), f.v = malloc(nk * 4), f.dout = malloc(nq * 4);
    f.out = malloc(nq * 8), f.lse = malloc(nl * 8), f.dq = malloc(nq * 8), f.dk = malloc(nk * 8), f.dv = malloc(nk * 8);
    f.fout = malloc(nq * 4), f.flse = malloc(nl * 4), f.fdq = malloc(nq * 4), f.fdk = malloc(nk * 4);
    f.fdv = malloc(nk * 4);
    lt_test_fill_normal(&rng, f.q, (int64_t)nq, 1.0f);
    lt_test_fill_normal(&rng, f.k, (int64_t)nk, 1.0f);
    lt_test_fill_normal(&rng, f.v, (int64_t)nk, 1.0f);
    lt_test_fill_normal(&rng, f.dout, (int64_t)nq, 1.0f);
    reference(s, &f);
    flash(s, &f);
    return f;
}

static void free_full(full *f) {
    free(f->q), free(f->k), free(f->v), free(f->dout), free(f->out), free(f->lse), free(f->dq), free(f->dk);
    free(f->dv), free(f->fout), free(f->flse), free(f->fdq), free(f->fdk), free(f->fdv);
}

/* Max error of this rank's rows of a (T, row) tensor against the reference (and the flash f32
 * result) and the tolerance from the reference's magnitude, as test_attention.c: LT_TOL_F32_REL of
 * the largest magnitude (at least 1) plus LT_TOL_F32_ABS. lse is (H, T): rows are positions of
 * each head, passed with row = 1 and heads = H. Returns the worse ratio of error to tolerance. */
static double local_err(const float *loc, const double *ref, const float *fl, const shape *s, int world, int rank,
                        int64_t row, int64_t heads, int head_major) {
    const int64_t Tl = s->T / world;
    double mag = 0, e = 0, ef = 0;
    for (int64_t i = 0; i < s->T * row * heads; i++) mag = fmax(mag, fabs(ref[i]));
    for (int64_t h = 0; h < heads; h++)
        for (int64_t i = 0; i < Tl; i++) {
            int64_t gp = lt_cp_zigzag_position(s->T, world, rank, i);
            for (int64_t d = 0; d < row; d++) {
                size_t li = head_major ? (size_t)(h * Tl + i) : (size_t)(i * row + d);
                size_t gi = head_major ? (size_t)(h * s->T + gp) : (size_t)(gp * row + d);
                if (loc[li] == LT_TEST_POISON || !isfinite(loc[li])) return INFINITY;
                e = fmax(e, fabs(loc[li] - ref[gi]));
                ef = fmax(ef, fabs(loc[li] - fl[gi]));
            }
        }
    double tol = LT_TOL_F32_REL * fmax(mag, 1.0) + LT_TOL_F32_ABS;
    return fmax(e, ef) / tol;
}

/* Ulysses' lse: (H/world, T), the rank's heads over the whole sequence in order. */
static double ulysses_lse_err(const float *loc, const full *f, const shape *s, int world, int rank) {
    const int64_t Hs = s->H / world;
    double mag = 0, e = 0;
    for (int64_t i = 0; i < s->T * s->H; i++) mag = fmax(mag, fabs(f->lse[i]));
    for (int64_t h = 0; h < Hs; h++)
        for (int64_t t = 0; t < s->T; t++) {
            float x = loc[h * s->T + t];
            size_t gi = (size_t)((rank * Hs + h) * s->T + t);
            if (x == LT_TEST_POISON || !isfinite(x)) return INFINITY;
            e = fmax(e, fmax(fabs(x - f->lse[gi]), fabs(x - f->flse[gi])));
        }
    return e / (LT_TOL_F32_REL * fmax(mag, 1.0) + LT_TOL_F32_ABS);
}

/* Runs forward and backward on this rank's shard (ring, or Ulysses with uly = 1) and returns the
 * worst error / tolerance over out, lse, dq, dk, dv (INFINITY for an unwritten element or a failed
 * call). */
static double run_rank_kind(lt_ctx *ctx, lt_comm *c, const shape *s, const full *f, int uly) {
    const int world = lt_comm_size(c), rank = lt_comm_rank(c);
    const int64_t Tl = s->T / world, qr = s->H * s->D, kr = s->Hkv * s->D;
    size_t nq = (size_t)(Tl * qr), nk = (size_t)(Tl * kr), nl = (size_t)(Tl * s->H);
    float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4), *dout = malloc(nq * 4);
    float *out = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4), *dk = malloc(nk * 4),
          *dv = malloc(nk * 4);
    lt_cp_zigzag_scatter(f->q, q, s->T, world, rank, qr);
    lt_cp_zigzag_scatter(f->k, k, s->T, world, rank, kr);
    lt_cp_zigzag_scatter(f->v, v, s->T, world, rank, kr);
    lt_cp_zigzag_scatter(f->dout, dout, s->T, world, rank, qr);
    float *outs[] = {out, lse, dq, dk, dv};
    size_t ns[] = {nq, nl, nq, nk, nk};
    for (int t = 0; t < 5; t++)
        for (size_t i = 0; i < ns[t]; i++) outs[t][i] = LT_TEST_POISON;
    lt_cp_attention_params p = {s->T, s->H, s->Hkv, s->D, s->scale, LT_ATTENTION_AUTO, LT_DTYPE_F32};
    double worst = INFINITY;
    lt_status st;
    if (uly) {
        size_t wb = lt_cp_ulysses_workspace_bytes(&p, world, LT_DEVICE_CPU, lt_ctx_threads(ctx));
        assert_true(wb != SIZE_MAX);
        void *ws = aligned_alloc(256, (wb + 255) / 256 * 256);
        st = lt_cp_ulysses_forward(ctx, c, &p, q, k, v, out, lse, ws, wb, lt_ctx_threads(ctx));
        if (st == LT_OK)
            st = lt_cp_ulysses_backward(ctx, c, &p, q, k, v, out, lse, dout, dq, dk, dv, ws, wb, lt_ctx_threads(ctx));
        free(ws);
    } else {
        st = lt_cp_attention_forward(ctx, c, &p, q, k, v, out, lse);
        if (st == LT_OK) st = lt_cp_attention_backward(ctx, c, &p, q, k, v, out, lse, dout, dq, dk, dv);
    }
    if (st != LT_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, lt_ctx_error(ctx));
    } else {
        worst = local_err(out, f->out, f->fout, s, world, rank, qr, 1, 0);
        worst = fmax(worst,
                     uly ? ulysses_lse_err(lse, f, s, world, rank)
                         : local_err(lse, f->lse, f->flse, s, world, rank, 1, s->H, 1));
        worst = fmax(worst, local_err(dq, f->dq, f->fdq, s, world, rank, qr, 1, 0));
        worst = fmax(worst, local_err(dk, f->dk, f->fdk, s, world, rank, kr, 1, 0));
        worst = fmax(worst, local_err(dv, f->dv, f->fdv, s, world, rank, kr, 1, 0));
    }
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv);
    return worst;
}

static double run_rank(lt_ctx *ctx, lt_comm *c, const shape *s, const full *f) {
    return run_rank_kind(ctx, c, s, f, 0);
}

/* Ulysses in bf16 (the CUDA model's attention dtype) against the single-rank flash attention on the
 * same bf16 inputs of the whole sequence: outputs are compared after both round to bf16, so the
 * tolerance is two bf16 ulps of the largest magnitude (the ranks run the same kernel on fewer
 * heads; nothing but the heads' grouping differs). Returns the worst error / tolerance. */
static double run_rank_bf16(lt_ctx *ctx, lt_comm *c, const shape *s, const full *f) {
    const int world = lt_comm_size(c), rank = lt_comm_rank(c);
    const int64_t T = s->T, Tl = T / world, qr = s->H * s->D, kr = s->Hkv * s->D;
    const size_t nq = (size_t)(T * qr), nk = (size_t)(T * kr);
    uint16_t *g[4], *l[4], *ro[4], *lo[4]; /* q k v dout; out dq dk dv (full, local) */
    const float *src[4] = {f->q, f->k, f->v, f->dout};
    size_t n[4] = {nq, nk, nk, nq}, rw[4] = {(size_t)qr, (size_t)kr, (size_t)kr, (size_t)qr};
    size_t on[4] = {nq, nq, nk, nk}, orw[4] = {(size_t)qr, (size_t)qr, (size_t)kr, (size_t)kr};
    for (int t = 0; t < 4; t++) {
        g[t] = malloc(n[t] * 2), l[t] = malloc(n[t] / (size_t)world * 2);
        ro[t] = malloc(on[t] * 2), lo[t] = malloc(on[t] / (size_t)world * 2);
        for (size_t i = 0; i < n[t]; i++) g[t][i] = lt_f32_to_bf16(src[t][i]);
        for (int64_t i = 0; i < Tl; i++)
            memcpy(l[t] + (size_t)i * rw[t], g[t] + (size_t)lt_cp_zigzag_position(T, world, rank, i) * rw[t],
                   rw[t] * 2);
        for (size_t i = 0; i < on[t] / (size_t)world; i++) lo[t][i] = 0x7fc1; /* NaN poison */
    }
    float *lse = malloc((size_t)(T * s->H) * 4), *llse = malloc((size_t)(Tl * s->H) * 4);
    lt_attention_params ap;
    memset(&ap, 0, sizeof ap);
    ap.B = 1, ap.T = T, ap.H = s->H, ap.Hkv = s->Hkv, ap.D = s->D, ap.dtype = LT_DTYPE_BF16;
    ap.device = LT_DEVICE_CPU, ap.impl = LT_ATTENTION_FLASH, ap.scale = s->scale;
    lt_attention_args aa;
    memset(&aa, 0, sizeof aa);
    aa.q = g[0], aa.k = g[1], aa.v = g[2], aa.dout = g[3], aa.out = ro[0], aa.lse = lse;
    aa.dq = ro[1], aa.dk = ro[2], aa.dv = ro[3];
    double worst = INFINITY;
    lt_cp_attention_params p = {T, s->H, s->Hkv, s->D, s->scale, LT_ATTENTION_AUTO, LT_DTYPE_BF16};
    size_t wb = lt_cp_ulysses_workspace_bytes(&p, world, LT_DEVICE_CPU, lt_ctx_threads(ctx));
    void *ws = wb == SIZE_MAX ? NULL : aligned_alloc(256, (wb + 255) / 256 * 256);
    if (lt_attention_forward(ctx, &ap, &aa) != LT_OK || lt_attention_backward(ctx, &ap, &aa) != LT_OK || !ws ||
        lt_cp_ulysses_forward(ctx, c, &p, l[0], l[1], l[2], lo[0], llse, ws, wb, lt_ctx_threads(ctx)) != LT_OK ||
        lt_cp_ulysses_backward(ctx, c, &p, l[0], l[1], l[2], lo[0], llse, l[3], lo[1], lo[2], lo[3], ws, wb,
                               lt_ctx_threads(ctx)) != LT_OK) {
        fprintf(stderr, "rank %d: bf16: %s\n", rank, lt_ctx_error(ctx));
    } else {
        worst = 0;
        for (int t = 0; t < 4; t++) {
            double mag = 0, e = 0;
            for (size_t i = 0; i < on[t]; i++) mag = fmax(mag, fabs(lt_bf16_to_f32(ro[t][i])));
            for (int64_t i = 0; i < Tl; i++) {
                int64_t gp = lt_cp_zigzag_position(T, world, rank, i);
                for (size_t d = 0; d < orw[t]; d++) {
                    float x = lt_bf16_to_f32(lo[t][(size_t)i * orw[t] + d]);
                    e = isfinite(x) ? fmax(e, fabs(x - lt_bf16_to_f32(ro[t][(size_t)gp * orw[t] + d]))) : INFINITY;
                }
            }
            worst = fmax(worst, e / (2.0 * 0x1p-8 * fmax(mag, 1.0)));
        }
    }
    for (int t = 0; t < 4; t++) free(g[t]), free(l[t]), free(ro[t]), free(lo[t]);
    free(lse), free(llse), free(ws);
    return worst;
}

static const shape cases[] = {
    {60, 4, 2, 16, 0.0f}, /* GQA 2:1, default scale */
    {36, 3, 3, 8, 0.37f}, /* MHA, explicit scale */
    {12, 2, 1, 32, 0.0f}, /* MQA, chunks of 2 tokens at 3 ranks */
    {48, 12, 6, 8, 0.0f}, /* GQA 2:1 over 6 kv heads: Ulysses at 2 and 3 ranks */
};

/* Ulysses applies where the world divides Hkv. */
static int ulysses_fits(const shape *s, int world) { return s->Hkv % world == 0 && s->T % (2 * world) == 0; }

/* ---- world of one ------------------------------------------------------------------------- */

static void test_zigzag_split(void **state) {
    (void)state;
    for (int world = 1; world <= 4; world++) {
        int64_t T = 8 * world;
        int *seen = calloc((size_t)T, sizeof *seen);
        int64_t work0 = -1;
        for (int r = 0; r < world; r++) {
            int64_t work = 0;
            for (int64_t i = 0; i < T / world; i++) {
                int64_t g = lt_cp_zigzag_position(T, world, r, i);
                assert_true(g >= 0 && g < T);
                seen[g]++;
                work += g + 1; /* keys a causal query sees */
            }
            /* Balanced: every rank's queries see the same number of keys in all. */
            if (work0 < 0) work0 = work;
            assert_int_equal(work, work0);
        }
        for (int64_t g = 0; g < T; g++) assert_int_equal(seen[g], 1);
        free(seen);
    }
    /* Scatter then gather is the identity. */
    float full_in[48], loc[48], back[48];
    for (int i = 0; i < 48; i++) full_in[i] = (float)i, back[i] = LT_TEST_POISON;
    for (int r = 0; r < 3; r++) {
        lt_cp_zigzag_scatter(full_in, loc, 24, 3, r, 2);
        lt_cp_zigzag_gather(loc, back, 24, 3, r, 2);
    }
    assert_memory_equal(full_in, back, sizeof back);
}

static void test_world_of_one(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        full f = make_full(&cases[i]);
        double w = run_rank(ctx, NULL, &cases[i], &f);
        if (!(w <= 1)) fail_msg("case %zu: error / tolerance %.3g", i, w);
        w = run_rank_kind(ctx, NULL, &cases[i], &f, 1);
        if (!(w <= 1)) fail_msg("case %zu, Ulysses: error / tolerance %.3g", i, w);
        w = run_rank_bf16(ctx, NULL, &cases[i], &f);
        if (!(w <= 1)) fail_msg("case %zu, Ulysses bf16: error / tolerance %.3g", i, w);
        free_full(&f);
    }
    lt_ctx_free(ctx);
}

static void test_errors_and_workspace(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_cp_attention_params p = {30, 4, 2, 8, 0, LT_ATTENTION_AUTO, LT_DTYPE_F32};
    assert_int_equal(lt_cp_attention_check(ctx, NULL, &p), LT_OK);
    p.T = 31;
    assert_int_equal(lt_cp_attention_check(ctx, NULL, &p), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "multiple of 2"));
    p.T = 32, p.Hkv = 3;
    assert_int_equal(lt_cp_attention_check(ctx, NULL, &p), LT_ERR_INVALID_ARG);
    p.Hkv = 2, p.scale = -1;
    assert_int_equal(lt_cp_attention_check(ctx, NULL, &p), LT_ERR_INVALID_ARG);
    p.scale = 0, p.D = 0;
    assert_int_equal(lt_cp_attention_check(ctx, NULL, &p), LT_ERR_INVALID_ARG);
    /* The bytes the planner prices are the bytes the calls take from the allocator. */
    const shape s = {40, 4, 2, 16, 0};
    full f = make_full(&s);
    lt_cp_attention_params q = {s.T, s.H, s.Hkv, s.D, 0, LT_ATTENTION_AUTO, LT_DTYPE_F32};
    size_t base = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
    float *o = malloc((size_t)(s.T * s.H * s.D) * 4), *l = malloc((size_t)(s.T * s.H) * 4);
    assert_int_equal(lt_cp_attention_forward(ctx, NULL, &q, f.q, f.k, f.v, o, l), LT_OK);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes - base, lt_cp_attention_workspace_bytes(&q, 1, 0));
    float *dq = malloc((size_t)(s.T * s.H * s.D) * 4), *dk = malloc((size_t)(s.T * s.Hkv * s.D) * 4);
    float *dv = malloc((size_t)(s.T * s.Hkv * s.D) * 4);
    lt_mem_reset_peak(ctx, LT_DEVICE_CPU);
    assert_int_equal(lt_cp_attention_backward(ctx, NULL, &q, f.q, f.k, f.v, o, l, f.dout, dq, dk, dv), LT_OK);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).peak_bytes - base, lt_cp_attention_workspace_bytes(&q, 1, 1));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, base);
    /* Out of memory is a clean error. */
    lt_mem_fail_nth(ctx, 1);
    assert_int_equal(lt_cp_attention_forward(ctx, NULL, &q, f.q, f.k, f.v, o, l), LT_ERR_OOM);
    lt_mem_fail_nth(ctx, 0);
    /* Per-rank workspace shrinks with the world: blocks of T/world tokens. */
    assert_true(lt_cp_attention_workspace_bytes(&q, 4, 1) < lt_cp_attention_workspace_bytes(&q, 2, 1));
    /* Ulysses: Hkv must split over the world; the workspace is checked, not allocated. */
    assert_int_equal(lt_cp_ulysses_check(ctx, NULL, &q), LT_OK);
    assert_int_equal(lt_cp_choose(&q, 2, LT_DEVICE_CUDA), LT_CP_ULYSSES);
    lt_cp_attention_params r = q;
    r.Hkv = 3, r.H = 6;
    assert_int_equal(lt_cp_choose(&r, 2, LT_DEVICE_CPU), LT_CP_RING);
    assert_int_equal(lt_cp_choose(&r, 2, LT_DEVICE_CUDA), -1);
    assert_int_equal(lt_cp_ulysses_workspace_bytes(&r, 2, LT_DEVICE_CPU, 1), SIZE_MAX);
    size_t wb = lt_cp_ulysses_workspace_bytes(&q, 1, LT_DEVICE_CPU, 1);
    assert_true(wb != SIZE_MAX && wb >= (size_t)(s.T * (4 * s.H + 8 * s.Hkv) * s.D) * 4);
    void *ws = aligned_alloc(256, (wb + 255) / 256 * 256);
    lt_ctx_set_threads(ctx, 1);
    base = lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes;
    assert_int_equal(lt_cp_ulysses_forward(ctx, NULL, &q, f.q, f.k, f.v, o, l, ws, wb - 1, 1), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "workspace"));
    assert_int_equal(lt_cp_ulysses_forward(ctx, NULL, &q, f.q, f.k, f.v, o, l, ws, wb, 1), LT_OK);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, base);
    q.T = 41;
    assert_int_equal(lt_cp_ulysses_check(ctx, NULL, &q), LT_ERR_INVALID_ARG);
    free(ws);
    free(o), free(l), free(dq), free(dk), free(dv);
    free_full(&f);
    lt_ctx_free(ctx);
}

/* ---- over MPI ----------------------------------------------------------------------------- */

static void run_world(int np) {
    if (!LT_HAVE_MPI) {
        printf("skipped: this build has no MPI\n");
        skip();
    }
    int rc = lt_test_mpirun(np, "--cp-worker");
    if (rc == -1) {
        printf("skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)\n");
        skip();
    }
    if (rc != 0) fail_msg("mpirun -np %d ring attention worker exited with %d", np, rc);
}
static void test_mpi_two(void **state) {
    (void)state;
    run_world(2);
}
static void test_mpi_three(void **state) {
    (void)state;
    run_world(3);
}

static int worker(void) {
    lt_ctx *ctx = lt_ctx_new();
    lt_comm *c = NULL;
    if (lt_comm_init(ctx, NULL, &c) != LT_OK) {
        fprintf(stderr, "cp worker: %s\n", lt_ctx_error(ctx));
        return 1;
    }
    int rank = lt_comm_rank(c), world = lt_comm_size(c);
    double fails = world < 2;
    int ulysses_cases = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (cases[i].T % (2 * world)) continue;
        full f = make_full(&cases[i]);
        double w = run_rank(ctx, c, &cases[i], &f);
        if (!(w <= 1)) {
            fprintf(stderr, "rank %d of %d, case %zu (T %lld): error / tolerance %.3g\n", rank, world, i,
                    (long long)cases[i].T, w);
            fails++;
        }
        if (ulysses_fits(&cases[i], world)) {
            w = run_rank_kind(ctx, c, &cases[i], &f, 1);
            if (!(w <= 1)) {
                fprintf(stderr, "rank %d of %d, case %zu (T %lld), Ulysses: error / tolerance %.3g\n", rank, world, i,
                        (long long)cases[i].T, w);
                fails++;
            }
            w = run_rank_bf16(ctx, c, &cases[i], &f);
            if (!(w <= 1)) {
                fprintf(stderr, "rank %d of %d, case %zu (T %lld), Ulysses bf16: error / tolerance %.3g\n", rank, world,
                        i, (long long)cases[i].T, w);
                fails++;
            }
            ulysses_cases++;
        }
        free_full(&f);
    }
    if (!ulysses_cases) fails++; /* every world size tested must cover Ulysses too */
    lt_comm_allreduce_sum(ctx, c, &fails, 1, LT_COMM_F64);
    lt_comm_free(ctx, c);
    lt_ctx_free(ctx);
    return fails > 0;
}

/* ---- a mixture-of-experts model over the group ---------------------------------------------- */

#define MOE_T 48 /* a multiple of 2·world for worlds 2, 3 and 4; within the fixture's 64 positions */

/* One case: the fixture folder under tests/fixtures/moe and the model file in it (NULL: the HF
 * folder; the GGUF files carry no aux coefficient), the row's padding tail, the device, and the
 * relative tolerance. */
typedef struct moe_cfg {
    const char *dir, *file;
    int64_t pad;
    lt_device dev;
    double rel;
} moe_cfg;

/* max |got - want| / (rel·max(max |want|, 1) + LT_TOL_F32_ABS); INFINITY for a NaN. */
static double rel_err(const float *got, const float *want, int64_t n, double rel) {
    double mag = 0, e = 0;
    for (int64_t i = 0; i < n; i++) mag = fmax(mag, fabs(want[i]));
    for (int64_t i = 0; i < n; i++) e = isfinite(got[i]) ? fmax(e, fabs((double)got[i] - want[i])) : INFINITY;
    return e / (rel * fmax(mag, 1.0) + LT_TOL_F32_ABS);
}

static double rel_err1(double got, double want, double rel) {
    float g = (float)got, w = (float)want;
    return rel_err(&g, &w, 1, rel);
}

/* One row of MOE_T tokens trained on one process, then over the ranks of c (each its zig-zag
 * share, the gradients and loss sums reduced over the group): returns the worst error / tolerance
 * of the cross entropy, the aux loss (training and evaluation) and the LoRA gradients, INFINITY
 * on a failed call or an aux loss that differs between ranks. The last k->pad tokens are padding
 * (real_seqs on one process, cp_real over the group). */
static double moe_case(lt_ctx *ctx, lt_comm *c, const moe_cfg *k) {
    const int world = lt_comm_size(c), rank = lt_comm_rank(c);
    const int64_t T = MOE_T, Tl = T / world, pad = k->pad;
    const char *file = k->file;
    char path[1200];
    snprintf(path, sizeof path, "%s/tests/fixtures/moe/%s%s%s", lt_test_source_dir(), k->dir, file ? "/" : "",
             file ? file : "");
    lt_model_options mo = {0};
    mo.device = k->dev;
    lt_lora_options lo = {0};
    lo.rank = 4, lo.alpha = 8, lo.num_layers = 2, lo.seed = 7;
    lt_model *m = NULL;
    double worst = INFINITY;
    float *p = NULL, *g1 = NULL, *g = NULL;
    if (lt_model_load(ctx, path, &mo, &lo, &m) != LT_OK) goto done;
    const lt_model_config *cfg = lt_model_get_config(m);
    int with_aux = cfg->moe_aux_coef > 0;
    /* Random adapter values (B too: a zero B would leave A's gradients zero), the same on every rank. */
    uint64_t rng = lt_test_seed() ^ 0x6d6f65ULL;
    int64_t n = 0;
    lt_model_lora_params(m, &n);
    p = malloc((size_t)n * 4), g1 = malloc((size_t)n * 4), g = malloc((size_t)n * 4);
    lt_test_fill_normal(&rng, p, n, 0.2f);
    int32_t tok[MOE_T], tgt[MOE_T], ltok[MOE_T], ltgt[MOE_T], lpos[MOE_T];
    int64_t ntok = 0;
    for (int64_t i = 0; i < T; i++) tok[i] = (int32_t)(lt_test_rand_u64(&rng) % (uint64_t)cfg->V);
    for (int64_t i = 0; i < T; i++) { /* ignored targets spread unevenly over the ranks */
        tgt[i] = i + 1 < T - pad && i % 5 != 2 && i > 3 ? tok[i + 1] : LT_IGNORE_INDEX;
        ntok += tgt[i] != LT_IGNORE_INDEX;
    }
    float scale = (float)(1.0 / (double)ntok);
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = T, ro.device = k->dev;
    ro.saved_bf16 = k->dev == LT_DEVICE_CPU ? -1 : 0; /* the host's ring attention takes f32 */
    lt_model_batch b;
    memset(&b, 0, sizeof b);
    b.B = 1, b.T = T, b.tokens = tok, b.targets = tgt;
    int32_t offs[3] = {0, (int32_t)(T - pad), (int32_t)T}, real_seqs[1] = {1};
    if (pad) b.seq_offsets = offs, b.S = 2, b.real_seqs = real_seqs;
    lt_model_result r1, f1, r, f;
    if (lt_model_lora_set(ctx, m, 0, n, p) != LT_OK || lt_model_prepare(ctx, m, &ro) != LT_OK) goto done;
    lt_model_zero_grads(m);
    if (lt_model_forward_backward(ctx, m, &b, scale, &r1, NULL) != LT_OK || lt_model_forward(ctx, m, &b, &f1, NULL))
        goto done;
    if (lt_model_lora_get(ctx, m, 1, 0, n, g1) != LT_OK) goto done;
    /* the group: this rank's tokens at their places in the row */
    for (int64_t i = 0; i < Tl; i++) {
        int64_t gp = lt_cp_zigzag_position(T, world, rank, i);
        ltok[i] = tok[gp], ltgt[i] = tgt[gp], lpos[i] = (int32_t)gp;
    }
    b.T = Tl, b.tokens = ltok, b.targets = ltgt, b.positions = lpos;
    b.seq_offsets = NULL, b.S = 0, b.real_seqs = NULL;
    ro.T = Tl;
    /* cp_real is a context-parallel field, and at most the whole row */
    b.cp_real = 1;
    if (lt_model_forward(ctx, m, &b, &f, NULL) != LT_ERR_INVALID_ARG ||
        !strstr(lt_ctx_error(ctx), "cp_real = 1 without context parallel"))
        goto done;
    if (lt_model_set_context_parallel(ctx, m, c) != LT_OK || lt_model_prepare(ctx, m, &ro) != LT_OK) goto done;
    b.cp_real = T + 1;
    if (lt_model_forward(ctx, m, &b, &f, NULL) != LT_ERR_INVALID_ARG ||
        !strstr(lt_ctx_error(ctx), "cp_real = 49 is outside 0..48 (the whole row)"))
        goto done;
    b.cp_real = T - pad;
    lt_model_zero_grads(m);
    if (lt_model_forward_backward(ctx, m, &b, scale, &r, NULL) != LT_OK || lt_model_forward(ctx, m, &b, &f, NULL))
        goto done;
    if (lt_model_lora_get(ctx, m, 1, 0, n, g) != LT_OK) goto done;
    /* host buffers over any transport; aux0: rank 0's values (a sum with zeros) */
    double sums[2] = {r.loss_sum, f.loss_sum}, aux0[2] = {rank ? 0 : r.aux_loss, rank ? 0 : f.aux_loss};
    if (lt_comm_allreduce_sum_host(ctx, c, g, n, LT_COMM_F32) != LT_OK ||
        lt_comm_allreduce_sum_host(ctx, c, sums, 2, LT_COMM_F64) != LT_OK ||
        lt_comm_allreduce_sum_host(ctx, c, aux0, 2, LT_COMM_F64) != LT_OK)
        goto done;
    const double rel = k->rel;
    worst = rel_err(g, g1, n, rel);
    worst = fmax(worst, rel_err1(sums[0] / (double)ntok, r1.loss_sum / (double)r1.n_tokens, rel));
    worst = fmax(worst, rel_err1(sums[1] / (double)ntok, f1.loss_sum / (double)f1.n_tokens, rel));
    worst = fmax(worst, rel_err1(r.aux_loss, r1.aux_loss, rel));
    worst = fmax(worst, rel_err1(f.aux_loss, f1.aux_loss, rel));
    if (aux0[0] != r.aux_loss || aux0[1] != f.aux_loss) worst = INFINITY; /* one value over the group */
    if (with_aux ? !(r1.aux_loss > 0) : r1.aux_loss != 0 || r.aux_loss != 0) worst = INFINITY;
    if (worst > 1)
        fprintf(
            stderr,
            "rank %d of %d, %s, %lld padding: ce %.9g vs %.9g, aux %.9g vs %.9g (forward %.9g vs %.9g), gradients %.3g of "
            "tolerance\n",
            rank, world, file ? file : "HF folder", (long long)pad, sums[0] / (double)ntok,
            r1.loss_sum / (double)r1.n_tokens, r.aux_loss, r1.aux_loss, f.aux_loss, f1.aux_loss,
            rel_err(g, g1, n, rel));
done:
    if (!isfinite(worst)) fprintf(stderr, "rank %d of %d: %s\n", rank, world, lt_ctx_error(ctx));
    if (m) lt_model_set_context_parallel(ctx, m, NULL);
    lt_model_free(ctx, m);
    free(p), free(g1), free(g);
    return worst;
}

static int moe_worker(void) {
    lt_ctx *ctx = lt_ctx_new();
    lt_comm *c = NULL;
    if (lt_comm_init(ctx, NULL, &c) != LT_OK) {
        fprintf(stderr, "cp moe worker: %s\n", lt_ctx_error(ctx));
        return 1;
    }
    double fails = lt_comm_size(c) < 2;
    /* 7 padding tokens reach into two ranks' chunks at 4 ranks */
    const moe_cfg cases3[3] = {{"qwen3moe", NULL, 0, LT_DEVICE_CPU, LT_TOL_F32_REL},
                               {"qwen3moe", "model.gguf", 0, LT_DEVICE_CPU, LT_TOL_F32_REL},
                               {"qwen3moe", NULL, 7, LT_DEVICE_CPU, LT_TOL_F32_REL}};
    for (int i = 0; i < 3; i++) fails += !(moe_case(ctx, c, &cases3[i]) <= 1);
    lt_comm_allreduce_sum(ctx, c, &fails, 1, LT_COMM_F64);
    lt_comm_free(ctx, c);
    lt_ctx_free(ctx);
    return fails > 0;
}

static void run_moe_world(int np) {
    if (!LT_HAVE_MPI) {
        printf("skipped: this build has no MPI\n");
        skip();
    }
    int rc = lt_test_mpirun(np, "--cp-moe-worker");
    if (rc == -1) {
        printf("skipped: mpirun not found (scripts/setup.sh installs openmpi-bin)\n");
        skip();
    }
    if (rc != 0) fail_msg("mpirun -np %d MoE worker exited with %d", np, rc);
}
static void test_moe_two(void **state) {
    (void)state;
    run_moe_world(2);
}
static void test_moe_four(void **state) {
    (void)state;
    run_moe_world(4);
}

/* CUDA: the same over an NCCL world of one (LONGTUNE_CP=ulysses turns context parallel on), so the
 * statistics' all-reduce runs queued on NCCL's stream between the device's kernels; the head-dim-64
 * fixture (what the device's attention serves) with a padding tail, against the same model on the
 * same device without context parallel, within the device's bf16 unit roundoff. */
static void test_cuda_nccl_world_of_one(void **state) {
    (void)state;
    if (!lt_test_cuda_present()) {
        printf("skipped: no CUDA device\n");
        skip();
    }
    if (!LT_HAVE_NCCL) {
        printf("skipped: this build has no NCCL\n");
        skip();
    }
    lt_ctx *ctx = lt_ctx_new();
    lt_comm_options o;
    memset(&o, 0, sizeof o);
    o.backend = LT_COMM_NCCL;
    lt_comm *c = NULL;
    if (lt_comm_init(ctx, &o, &c) != LT_OK) fail_msg("nccl: %s", lt_ctx_error(ctx));
    assert_int_equal(setenv("LONGTUNE_CP", "ulysses", 1), 0);
    const moe_cfg k = {"qwen3moe_hd64", NULL, 7, LT_DEVICE_CUDA, 0x1p-8};
    double w = moe_case(ctx, c, &k);
    unsetenv("LONGTUNE_CP");
    lt_comm_free(ctx, c);
    lt_ctx_free(ctx);
    if (!(w <= 1)) fail_msg("MoE over an NCCL world of one: error / tolerance %.3g", w);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--cp-worker")) return worker();
    if (argc > 1 && !strcmp(argv[1], "--cp-moe-worker")) return moe_worker();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zigzag_split),
        cmocka_unit_test(test_world_of_one),
        cmocka_unit_test(test_errors_and_workspace),
        cmocka_unit_test(test_mpi_two),
        cmocka_unit_test(test_mpi_three),
        cmocka_unit_test(test_moe_two),
        cmocka_unit_test(test_moe_four),
        cmocka_unit_test(test_cuda_nccl_world_of_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
