/* CUDA flash attention (bf16) against float64 and the CPU backend, on fresh random inputs with
 * poisoned outputs: causal, grouped-query heads, head dims 64/96/128, sliding window, softcap,
 * packed rows (including empty and one-token sequences) and a fused qkv layout. The tolerance is
 * twice the error of a naive bf16 implementation (emulated here) against the same float64
 * reference. Without a CUDA device (or build) it prints "skipped: no CUDA device" and exits 77. */
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
#include "longtune/tensor.h"

#if LT_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/attention/tuning.h"

/* Half an ulp of bf16 at 1: the least error any bf16 output can carry. */
#define TOL_BF16_FLOOR 0x1.0p-8

typedef struct acase {
    int64_t B, T, H, Hkv, D, window;
    float softcap;
    int packed;       /* several sequences per row */
    int fused;        /* q, k, v interleaved in one (B, T, H + 2·Hkv, D) buffer */
    int with_cpu;     /* also run the CPU backend */
} acase;

/* Float64 attention over bf16-valued inputs, contiguous (B, T, heads, D). emu = 1 rounds to bf16
 * where a naive bf16 implementation would (scores, probabilities, every matmul output). */
static void reference(const acase *c, const int32_t *lo, const float *q, const float *k,
                      const float *v, const float *dout, int emu, double *out, double *lse,
                      double *dq, double *dk, double *dv) {
    const int64_t B = c->B, T = c->T, H = c->H, Hkv = c->Hkv, D = c->D, G = H / Hkv;
    const double scale = 1.0 / sqrt((double)D), cap = c->softcap;
    double *p = malloc(sizeof(double) * (size_t)T), *th = malloc(sizeof(double) * (size_t)T);
    double *dp = malloc(sizeof(double) * (size_t)T), *o = malloc(sizeof(double) * (size_t)D);
    memset(dk, 0, sizeof(double) * (size_t)(B * T * Hkv * D));
    memset(dv, 0, sizeof(double) * (size_t)(B * T * Hkv * D));
#define RND(x) (emu ? lt_test_bf16_round(x) : (x))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t hk = h / G;
            for (int64_t i = 0; i < T; i++) {
                const float *qi = q + ((b * T + i) * H + h) * D;
                const int64_t j0 = lo[b * T + i];
                double m = -INFINITY;
                for (int64_t j = j0; j <= i; j++) {
                    const float *kj = k + ((b * T + j) * Hkv + hk) * D;
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += (double)qi[d] * kj[d];
                    s = RND(s * scale);
                    th[j] = 0;
                    if (cap > 0) {
                        th[j] = tanh(s / cap);
                        s = RND(cap * th[j]);
                    }
                    p[j] = s;
                    if (s > m) m = s;
                }
                double l = 0;
                for (int64_t j = j0; j <= i; j++) l += (p[j] = exp(p[j] - m));
                lse[(b * H + h) * T + i] = m + log(l);
                for (int64_t d = 0; d < D; d++) o[d] = 0;
                for (int64_t j = j0; j <= i; j++) {
                    p[j] = RND(p[j] / l);
                    const float *vj = v + ((b * T + j) * Hkv + hk) * D;
                    for (int64_t d = 0; d < D; d++) o[d] += p[j] * vj[d];
                }
                double *oi = out + ((b * T + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++) oi[d] = RND(o[d]);
                /* Backward of this row. */
                const float *gi = dout + ((b * T + i) * H + h) * D;
                double delta = 0;
                for (int64_t d = 0; d < D; d++) delta += oi[d] * gi[d];
                double *dqi = dq + ((b * T + i) * H + h) * D;
                for (int64_t d = 0; d < D; d++) o[d] = 0;
                for (int64_t j = j0; j <= i; j++) {
                    const float *vj = v + ((b * T + j) * Hkv + hk) * D;
                    const float *kj = k + ((b * T + j) * Hkv + hk) * D;
                    double g = 0;
                    for (int64_t d = 0; d < D; d++) g += (double)gi[d] * vj[d];
                    dp[j] = RND(g);
                    double ds = RND(p[j] * (dp[j] - delta));
                    if (cap > 0) ds *= 1 - th[j] * th[j];
                    double *dkj = dk + ((b * T + j) * Hkv + hk) * D;
                    double *dvj = dv + ((b * T + j) * Hkv + hk) * D;
                    for (int64_t d = 0; d < D; d++) {
                        o[d] += ds * scale * kj[d];
                        dkj[d] += ds * scale * qi[d];
                        dvj[d] += p[j] * gi[d];
                    }
                }
                for (int64_t d = 0; d < D; d++) dqi[d] = RND(o[d]);
            }
        }
    if (emu) {
        for (int64_t n = 0; n < B * T * Hkv * D; n++) {
            dk[n] = lt_test_bf16_round(dk[n]);
            dv[n] = lt_test_bf16_round(dv[n]);
        }
    }
#undef RND
    free(p);
    free(th);
    free(dp);
    free(o);
}

static void make_offsets(uint64_t *rng, const acase *c, int32_t *off, int64_t S) {
    for (int64_t b = 0; b < c->B; b++) {
        int32_t *o = off + b * (S + 1);
        o[0] = 0;
        for (int64_t s = 1; s < S; s++) {
            int32_t step = (int32_t)lt_test_uniform(rng, 0, 2.0 * (double)c->T / (double)S);
            if (s == 2) step = 0; /* an empty sequence */
            if (s == 3) step = 1; /* a one-token sequence */
            o[s] = o[s - 1] + step > c->T ? (int32_t)c->T : o[s - 1] + step;
        }
        o[S] = (int32_t)c->T;
    }
}

static void key_bounds(const acase *c, const int32_t *off, int64_t S, int32_t *lo) {
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < c->T; t++) {
            int64_t start = 0;
            if (off)
                for (int64_t s = 0; s < S; s++)
                    if (off[b * (S + 1) + s] <= t && t < off[b * (S + 1) + s + 1]) start = off[b * (S + 1) + s];
            if (c->window > 0 && t - c->window + 1 > start) start = t - c->window + 1;
            lo[b * c->T + t] = (int32_t)start;
        }
}

/* Strided (B, T, heads, D) bf16 device tensor <-> contiguous float host array. */
static void put(uint16_t *host_buf, const float *x, int64_t B, int64_t T, int64_t heads, int64_t D,
                int64_t sb, int64_t st, int64_t sh) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t d = 0; d < D; d++)
                    host_buf[b * sb + t * st + h * sh + d] = lt_f32_to_bf16(x[((b * T + t) * heads + h) * D + d]);
}
static void get(const uint16_t *host_buf, float *x, int64_t B, int64_t T, int64_t heads, int64_t D,
                int64_t sb, int64_t st, int64_t sh) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < heads; h++)
                for (int64_t d = 0; d < D; d++)
                    x[((b * T + t) * heads + h) * D + d] = lt_bf16_to_f32(host_buf[b * sb + t * st + h * sh + d]);
}

/* ---- Forward cases: every forward kernel (lt_attn_cuda_tuning.fwd) on rows long enough to cycle the
 * warp-specialised kernel's K/V ring several times, with partial last blocks, packed rows (also
 * with more offsets than one kernel parameter holds), GQA, softcap, window, a fused layout. Only
 * the forward is compared (out and lse), against a float64 forward. */
static void reference_fwd(const acase *c, const int32_t *lo, const float *q, const float *k, const float *v,
                          int emu, double *out, double *lse) {
    const int64_t B = c->B, T = c->T, H = c->H, Hkv = c->Hkv, D = c->D, G = H / Hkv;
    const double scale = 1.0 / sqrt((double)D), cap = c->softcap;
    double *pr = malloc(sizeof(double) * (size_t)T), *o = malloc(sizeof(double) * (size_t)D);
#define RND(x) (emu ? lt_test_bf16_round(x) : (x))
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *qi = q + ((b * T + i) * H + h) * D;
                const int64_t j0 = lo[b * T + i];
                double m = -INFINITY, l = 0;
                for (int64_t j = j0; j <= i; j++) {
                    const float *kj = k + ((b * T + j) * Hkv + h / G) * D;
                    double sc = 0;
                    for (int64_t d = 0; d < D; d++) sc += (double)qi[d] * kj[d];
                    sc = RND(sc * scale);
                    if (cap > 0) sc = RND(cap * tanh(sc / cap));
                    pr[j] = sc;
                    m = fmax(m, sc);
                }
                for (int64_t j = j0; j <= i; j++) l += (pr[j] = exp(pr[j] - m));
                lse[(b * H + h) * T + i] = m + log(l);
                for (int64_t d = 0; d < D; d++) o[d] = 0;
                for (int64_t j = j0; j <= i; j++) {
                    const float *vj = v + ((b * T + j) * Hkv + h / G) * D;
                    const double pj = RND(pr[j] / l);
                    for (int64_t d = 0; d < D; d++) o[d] += pj * vj[d];
                }
                for (int64_t d = 0; d < D; d++) out[((b * T + i) * H + h) * D + d] = RND(o[d]);
            }
#undef RND
    free(pr);
    free(o);
}

static void run_fwd_variants(const acase *c, int64_t S) {
    uint64_t rng = lt_test_seed() ^ (uint64_t)(c->T * 977 + c->D * 13 + S);
    const int64_t B = c->B, T = c->T, H = c->H, Hkv = c->Hkv, D = c->D;
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D, nl = B * H * T;
    float *q = lt_test_fresh(&rng, nq, 1.0f), *k = lt_test_fresh(&rng, nk, 1.0f), *v = lt_test_fresh(&rng, nk, 1.0f);
    for (int64_t i = 0; i < nq; i++) q[i] = lt_bf16_to_f32(lt_f32_to_bf16(q[i]));
    for (int64_t i = 0; i < nk; i++) {
        k[i] = lt_bf16_to_f32(lt_f32_to_bf16(k[i]));
        v[i] = lt_bf16_to_f32(lt_f32_to_bf16(v[i]));
    }
    int32_t *off = S ? malloc(sizeof(int32_t) * (size_t)(B * (S + 1))) : NULL;
    if (off) make_offsets(&rng, c, off, S);
    int32_t *lo = malloc(sizeof(int32_t) * (size_t)(B * T));
    key_bounds(c, off, S, lo);
    double *r[2], *e[2];
    const int64_t n[2] = {nq, nl};
    for (int i = 0; i < 2; i++) {
        r[i] = malloc(sizeof(double) * (size_t)n[i]);
        e[i] = malloc(sizeof(double) * (size_t)n[i]);
    }
    reference_fwd(c, lo, q, k, v, 0, r[0], r[1]);
    reference_fwd(c, lo, q, k, v, 1, e[0], e[1]);
    const double tol[2] = {fmax(2 * lt_test_rel_err_d(e[0], r[0], nq), TOL_BF16_FLOOR),
                           fmax(2 * lt_test_rel_err_d(e[1], r[1], nl), TOL_BF16_FLOOR)};

    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = B; p.T = T; p.H = H; p.Hkv = Hkv; p.D = D;
    p.dtype = LT_DTYPE_BF16;
    p.device = LT_DEVICE_CUDA;
    p.window = c->window;
    p.softcap = c->softcap;
    p.seq_offsets = off;
    p.S = S;
    const int64_t W = c->fused ? H + 2 * Hkv : 0;
    const int64_t qsb = c->fused ? T * W * D : T * H * D, qst = c->fused ? W * D : H * D;
    const int64_t ksb = c->fused ? T * W * D : T * Hkv * D, kst = c->fused ? W * D : Hkv * D;
    if (c->fused) {
        p.q_layout = (lt_attention_layout){qsb, qst, D};
        p.kv_layout = (lt_attention_layout){ksb, kst, D};
    }
    const size_t elems = c->fused ? (size_t)(B * T * W * D) : (size_t)(nq + 2 * nk);
    const size_t koff = c->fused ? (size_t)(H * D) : (size_t)nq, voff = c->fused ? (size_t)((H + Hkv) * D) : (size_t)(nq + nk);
    uint16_t *hqkv = calloc(elems, 2), *hout = malloc((size_t)nq * 2);
    put(hqkv, q, B, T, H, D, qsb, qst, D);
    put(hqkv + koff, k, B, T, Hkv, D, ksb, kst, D);
    put(hqkv + voff, v, B, T, Hkv, D, ksb, kst, D);
    lt_ctx *ctx = lt_ctx_new();
    char *dqkv = lt_alloc(ctx, LT_DEVICE_CUDA, elems * 2, "qkv");
    char *dout = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nq * 2, "out");
    float *dlse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nl * 4, "lse");
    assert_non_null(dqkv);
    assert_non_null(dout);
    assert_non_null(dlse);
    assert_int_equal(cudaMemcpy(dqkv, hqkv, elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
    float *go = malloc(sizeof(float) * (size_t)nq), *glse = malloc(sizeof(float) * (size_t)nl);

    static const char *variants[] = LT_ATTN_FWD_KIND_NAMES;
    const lt_attn_cuda_tuning was = lt_attn_cuda_tuning_get();
    int bad = 0;
    for (int vi = LT_ATTN_FWD_AUTO; vi < LT_ATTN_FWD_KINDS_; vi++) {
        lt_attn_cuda_tuning force = was;
        force.fwd = vi;
        lt_attn_cuda_tuning_set(&force);
        assert_int_equal(cudaMemset(dout, 0xFF, (size_t)nq * 2), cudaSuccess);
        assert_int_equal(cudaMemset(dlse, 0xFF, (size_t)nl * 4), cudaSuccess);
        lt_attention_args a;
        memset(&a, 0, sizeof a);
        a.q = dqkv;
        a.k = dqkv + koff * 2;
        a.v = dqkv + voff * 2;
        a.out = dout;
        a.lse = dlse;
        lt_status st = lt_attention_forward(ctx, &p, &a);
        if (st != LT_OK) fprintf(stderr, "forward (%s): %s\n", variants[vi], lt_ctx_error(ctx));
        assert_int_equal(st, LT_OK);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaMemcpy(hout, dout, (size_t)nq * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        get(hout, go, B, T, H, D, T * H * D, H * D, D);
        assert_int_equal(cudaMemcpy(glse, dlse, (size_t)nl * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        const double eo = lt_test_rel_err_f(go, r[0], nq), el = lt_test_rel_err_f(glse, r[1], nl);
        fprintf(stderr, "  fwd %-7s B=%lld T=%lld D=%lld H=%lld/%lld S=%lld win=%lld cap=%g fused=%d: out err %.3g (tol %.3g), lse err %.3g (tol %.3g)\n",
                variants[vi], (long long)B, (long long)T, (long long)D, (long long)H,
                (long long)Hkv, (long long)S, (long long)c->window, (double)c->softcap, c->fused, eo, tol[0], el, tol[1]);
        if (!(eo <= tol[0]) || !(el <= tol[1])) {
            bad++;
            /* Where it goes wrong: the worst output element and the worst lse row. */
            int64_t wi = 0, wl = 0;
            double we = -1, wle = -1;
            for (int64_t i = 0; i < nq; i++) {
                const double d = isfinite(go[i]) ? fabs(go[i] - r[0][i]) : INFINITY;
                if (d > we) we = d, wi = i;
            }
            for (int64_t i = 0; i < nl; i++) {
                const double d = isfinite(glse[i]) ? fabs(glse[i] - r[1][i]) : INFINITY;
                if (d > wle) wle = d, wl = i;
            }
            fprintf(stderr, "    worst out: b=%lld t=%lld h=%lld d=%lld got %g want %g; worst lse: b=%lld h=%lld t=%lld got %g want %g\n",
                    (long long)(wi / (T * H * D)), (long long)(wi / (H * D) % T), (long long)(wi / D % H),
                    (long long)(wi % D), (double)go[wi], r[0][wi], (long long)(wl / (H * T)), (long long)(wl / T % H),
                    (long long)(wl % T), (double)glse[wl], r[1][wl]);
        }
    }
    lt_attn_cuda_tuning_set(&was);
    assert_int_equal(bad, 0);
    lt_free(ctx, LT_DEVICE_CUDA, dqkv, elems * 2);
    lt_free(ctx, LT_DEVICE_CUDA, dout, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, dlse, (size_t)nl * 4);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
    for (int i = 0; i < 2; i++) {
        free(r[i]);
        free(e[i]);
    }
    free(q); free(k); free(v); free(off); free(lo); free(hqkv); free(hout); free(go); free(glse);
}

/* Causal GQA, D = 128: 9 blocks of 128 queries, the last with its second warpgroup past T. */
static void fwd_causal_gqa_d128(void **s) {
    (void)s;
    acase c = {1, 1050, 8, 2, 128, 0, 0, 0, 0, 0};
    run_fwd_variants(&c, 0);
}
/* Two packed rows of long sequences in the fused q|k|v layout (the tensor maps' strides). */
static void fwd_packed_fused_d128(void **s) {
    (void)s;
    acase c = {2, 900, 4, 1, 128, 0, 0, 1, 1, 0};
    run_fwd_variants(&c, 6);
}
/* D = 64 with softcap and a window that starts rows mid-tile. */
static void fwd_window_softcap_d64(void **s) {
    (void)s;
    acase c = {1, 1100, 4, 2, 64, 300, 30.0f, 0, 0, 0};
    run_fwd_variants(&c, 0);
}
/* More packed offsets (2 x 1201) than one kernel parameter holds: the key bounds built piece by
 * piece without a host-to-device copy. */
static void fwd_many_offsets_d64(void **s) {
    (void)s;
    acase c = {2, 3000, 2, 1, 64, 0, 0, 1, 0, 0};
    run_fwd_variants(&c, 1200);
}

static void run_case(const acase *c) {
    uint64_t rng = lt_test_seed() ^ (uint64_t)(c->T * 131 + c->D * 7 + c->packed);
    const int64_t B = c->B, T = c->T, H = c->H, Hkv = c->Hkv, D = c->D;
    const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
    float *q = malloc(sizeof(float) * (size_t)nq), *k = malloc(sizeof(float) * (size_t)nk);
    float *v = malloc(sizeof(float) * (size_t)nk), *g = malloc(sizeof(float) * (size_t)nq);
    lt_test_fill_normal(&rng, q, nq, 1.0f);
    lt_test_fill_normal(&rng, k, nk, 1.0f);
    lt_test_fill_normal(&rng, v, nk, 1.0f);
    lt_test_fill_normal(&rng, g, nq, 1.0f);
    for (int64_t i = 0; i < nq; i++) {
        q[i] = lt_bf16_to_f32(lt_f32_to_bf16(q[i]));
        g[i] = lt_bf16_to_f32(lt_f32_to_bf16(g[i]));
    }
    for (int64_t i = 0; i < nk; i++) {
        k[i] = lt_bf16_to_f32(lt_f32_to_bf16(k[i]));
        v[i] = lt_bf16_to_f32(lt_f32_to_bf16(v[i]));
    }
    const int64_t S = c->packed ? 6 : 0;
    int32_t *off = S ? malloc(sizeof(int32_t) * (size_t)(B * (S + 1))) : NULL;
    if (off) make_offsets(&rng, c, off, S);
    int32_t *lo = malloc(sizeof(int32_t) * (size_t)(B * T));
    key_bounds(c, off, S, lo);

    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = B; p.T = T; p.H = H; p.Hkv = Hkv; p.D = D;
    p.dtype = LT_DTYPE_BF16;
    p.device = LT_DEVICE_CUDA;
    p.window = c->window;
    p.softcap = c->softcap;
    p.seq_offsets = off;
    p.S = S;
    /* Layouts: fused puts q, k, v side by side in one buffer (and dq, dk, dv in another). */
    int64_t W = c->fused ? H + 2 * Hkv : 0;
    int64_t qsb = c->fused ? T * W * D : T * H * D, qst = c->fused ? W * D : H * D;
    int64_t ksb = c->fused ? T * W * D : T * Hkv * D, kst = c->fused ? W * D : Hkv * D;
    if (c->fused) {
        p.q_layout = (lt_attention_layout){qsb, qst, D};
        p.kv_layout = (lt_attention_layout){ksb, kst, D};
    }
    size_t qkv_elems = c->fused ? (size_t)(B * T * W * D) : (size_t)(nq + 2 * nk);
    size_t koff = c->fused ? (size_t)(H * D) : (size_t)nq, voff = c->fused ? (size_t)((H + Hkv) * D) : (size_t)(nq + nk);
    uint16_t *hqkv = calloc(qkv_elems, 2), *hbuf = malloc((size_t)nq * 2);
    put(hqkv, q, B, T, H, D, qsb, qst, D);
    put(hqkv + koff, k, B, T, Hkv, D, ksb, kst, D);
    put(hqkv + voff, v, B, T, Hkv, D, ksb, kst, D);

    lt_ctx *ctx = lt_ctx_new();
    char *dqkv_in = lt_alloc(ctx, LT_DEVICE_CUDA, qkv_elems * 2, "qkv");
    char *dgrad = lt_alloc(ctx, LT_DEVICE_CUDA, qkv_elems * 2, "dq dk dv");
    char *dout = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nq * 2, "out");
    char *ddo = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)nq * 2, "dout");
    float *dlse = lt_alloc(ctx, LT_DEVICE_CUDA, (size_t)(B * H * T) * 4, "lse");
    assert_non_null(dqkv_in);
    assert_non_null(dgrad);
    assert_non_null(dout);
    assert_non_null(ddo);
    assert_non_null(dlse);
    assert_int_equal(cudaMemcpy(dqkv_in, hqkv, qkv_elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
    put(hbuf, g, B, T, H, D, T * H * D, H * D, D);
    assert_int_equal(cudaMemcpy(ddo, hbuf, (size_t)nq * 2, cudaMemcpyHostToDevice), cudaSuccess);
    /* Poison: 0xFFC1 is a bf16 NaN, 0xFF is a NaN pattern for the fp32 lse. */
    assert_int_equal(cudaMemset(dout, 0xFF, (size_t)nq * 2), cudaSuccess);
    assert_int_equal(cudaMemset(dgrad, 0xFF, qkv_elems * 2), cudaSuccess);
    assert_int_equal(cudaMemset(dlse, 0xFF, (size_t)(B * H * T) * 4), cudaSuccess);

    lt_attention_args a;
    memset(&a, 0, sizeof a);
    a.q = dqkv_in;
    a.k = dqkv_in + koff * 2;
    a.v = dqkv_in + voff * 2;
    a.out = dout;
    a.lse = dlse;
    a.dout = ddo;
    a.dq = dgrad;
    a.dk = dgrad + koff * 2;
    a.dv = dgrad + voff * 2;
    lt_status st = lt_attention_forward(ctx, &p, &a);
    if (st != LT_OK) fprintf(stderr, "forward: %s\n", lt_ctx_error(ctx));
    assert_int_equal(st, LT_OK);
    st = lt_attention_backward(ctx, &p, &a);
    if (st != LT_OK) fprintf(stderr, "backward: %s\n", lt_ctx_error(ctx));
    assert_int_equal(st, LT_OK);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    /* The workspace came from the accounting allocator and went back to it. */
    assert_true(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).peak_bytes >=
                lt_attention_workspace_bytes(&p, 1, 0));

    float *go = malloc(sizeof(float) * (size_t)nq), *glse = malloc(sizeof(float) * (size_t)(B * H * T));
    float *gdq = malloc(sizeof(float) * (size_t)nq), *gdk = malloc(sizeof(float) * (size_t)nk);
    float *gdv = malloc(sizeof(float) * (size_t)nk);
    assert_int_equal(cudaMemcpy(hbuf, dout, (size_t)nq * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    get(hbuf, go, B, T, H, D, T * H * D, H * D, D);
    assert_int_equal(cudaMemcpy(glse, dlse, (size_t)(B * H * T) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(hqkv, dgrad, qkv_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    get(hqkv, gdq, B, T, H, D, qsb, qst, D);
    get(hqkv + koff, gdk, B, T, Hkv, D, ksb, kst, D);
    get(hqkv + voff, gdv, B, T, Hkv, D, ksb, kst, D);

    double *r[5], *e[5];
    const int64_t n[5] = {nq, B * H * T, nq, nk, nk};
    for (int i = 0; i < 5; i++) {
        r[i] = malloc(sizeof(double) * (size_t)n[i]);
        e[i] = malloc(sizeof(double) * (size_t)n[i]);
    }
    reference(c, lo, q, k, v, g, 0, r[0], r[1], r[2], r[3], r[4]);
    reference(c, lo, q, k, v, g, 1, e[0], e[1], e[2], e[3], e[4]);
    const float *got[5] = {go, glse, gdq, gdk, gdv};
    const char *name[5] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < 5; i++) {
        double tol = fmax(2 * lt_test_rel_err_d(e[i], r[i], n[i]), TOL_BF16_FLOOR);
        double err = lt_test_rel_err_f(got[i], r[i], n[i]);
        fprintf(stderr, "  T=%lld D=%lld H=%lld/%lld win=%lld cap=%g packed=%d fused=%d %-4s cuda err %.3g (tol %.3g)\n",
                (long long)T, (long long)D, (long long)H, (long long)Hkv, (long long)c->window,
                (double)c->softcap, c->packed, c->fused, name[i], err, tol);
        assert_true(err <= tol);
    }

    if (c->with_cpu) {
        /* The CPU backend on the same bf16 inputs must land within the same tolerance. */
        lt_attention_params pc = p;
        pc.device = LT_DEVICE_CPU;
        pc.q_layout = pc.kv_layout = (lt_attention_layout){0, 0, 0};
        uint16_t *cq = malloc((size_t)nq * 2), *ck = malloc((size_t)nk * 2), *cv = malloc((size_t)nk * 2);
        uint16_t *cg = malloc((size_t)nq * 2), *co = malloc((size_t)nq * 2), *cdq = malloc((size_t)nq * 2);
        uint16_t *cdk = malloc((size_t)nk * 2), *cdv = malloc((size_t)nk * 2);
        float *clse = malloc(sizeof(float) * (size_t)(B * H * T));
        put(cq, q, B, T, H, D, T * H * D, H * D, D);
        put(ck, k, B, T, Hkv, D, T * Hkv * D, Hkv * D, D);
        put(cv, v, B, T, Hkv, D, T * Hkv * D, Hkv * D, D);
        put(cg, g, B, T, H, D, T * H * D, H * D, D);
        lt_attention_args ac = {cq, ck, cv, co, clse, cg, cdq, cdk, cdv, NULL, 0};
        assert_int_equal(lt_attention_forward(ctx, &pc, &ac), LT_OK);
        assert_int_equal(lt_attention_backward(ctx, &pc, &ac), LT_OK);
        float *f = malloc(sizeof(float) * (size_t)nq);
        get(co, f, B, T, H, D, T * H * D, H * D, D);
        double eo = lt_test_rel_err_f(f, r[0], nq);
        get(cdq, f, B, T, H, D, T * H * D, H * D, D);
        double eq = lt_test_rel_err_f(f, r[2], nq);
        fprintf(stderr, "  cpu backend: out err %.3g, dq err %.3g\n", eo, eq);
        assert_true(eo <= fmax(2 * lt_test_rel_err_d(e[0], r[0], nq), TOL_BF16_FLOOR));
        assert_true(eq <= fmax(2 * lt_test_rel_err_d(e[2], r[2], nq), TOL_BF16_FLOOR));
        free(f); free(cq); free(ck); free(cv); free(cg); free(co); free(cdq); free(cdk); free(cdv); free(clse);
    }

    for (int i = 0; i < 5; i++) {
        free(r[i]);
        free(e[i]);
    }
    lt_free(ctx, LT_DEVICE_CUDA, dqkv_in, qkv_elems * 2);
    lt_free(ctx, LT_DEVICE_CUDA, dgrad, qkv_elems * 2);
    lt_free(ctx, LT_DEVICE_CUDA, dout, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, ddo, (size_t)nq * 2);
    lt_free(ctx, LT_DEVICE_CUDA, dlse, (size_t)(B * H * T) * 4);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CUDA).used_bytes, 0);
    lt_ctx_free(ctx);
    free(q); free(k); free(v); free(g); free(off); free(lo); free(hqkv); free(hbuf);
    free(go); free(glse); free(gdq); free(gdk); free(gdv);
}

static void causal_gqa_d64(void **s) {
    (void)s;
    acase c = {2, 200, 4, 2, 64, 0, 0, 0, 0, 1};
    run_case(&c);
}
static void window_softcap_d96(void **s) {
    (void)s;
    acase c = {1, 257, 4, 1, 96, 50, 15.0f, 0, 0, 0};
    run_case(&c);
}
static void packed_gqa_d128(void **s) {
    (void)s;
    acase c = {2, 300, 8, 2, 128, 0, 0, 1, 0, 1};
    run_case(&c);
}
/* D = 64 packed rows with softcap: the one-warpgroup dK/dV kernel and the dQ kernel that also
 * forms delta (the sparse plan's D = 64 instances). */
static void packed_softcap_d64(void **s) {
    (void)s;
    acase c = {2, 400, 4, 2, 64, 0, 10.0f, 1, 0, 0};
    run_case(&c);
}
static void packed_window_fused_layout_d128(void **s) {
    (void)s;
    acase c = {1, 130, 2, 2, 128, 40, 0, 1, 1, 0};
    run_case(&c);
}

/* The Hopper backward kernel (D = 128) with softcap and window, and a longer causal row that walks
 * many query steps per key block. */
static void window_softcap_d128(void **s) {
    (void)s;
    acase c = {1, 333, 8, 2, 128, 100, 20.0f, 0, 0, 0};
    run_case(&c);
}
static void causal_long_d128(void **s) {
    (void)s;
    acase c = {1, 700, 4, 1, 128, 0, 0, 0, 0, 0};
    run_case(&c);
}

/* The warp-specialised backward (src/backend/cuda/attention/bwd_ws.cu: TMA producer, mbarrier
 * ring, bulk dQ reduction) takes causal rows without packing or window, T a multiple of 64, one CTA
 * per kv head.
 * These rows are short, so the plan would split the heads over CTAs: an override of split = 1 keeps
 * one CTA per kv head as at T >= 8k. Several key blocks and query heads per CTA, both head dims,
 * a last key block of 64 keys (T % 128 = 64), softcap, B = 2, D = 64 without softcap over four kv
 * heads, and a fused qkv layout (tensor-map strides other than the contiguous ones).
 * An override of bwd = LT_ATTN_BWD_WG runs the same cases on the wgmma main kernel. */
static void run_unsplit(const acase *c) {
    const lt_attn_cuda_tuning was = lt_attn_cuda_tuning_get();
    lt_attn_cuda_tuning force = was;
    force.split = 1;
    lt_attn_cuda_tuning_set(&force);
    run_case(c);
    lt_attn_cuda_tuning_set(&was);
}
static void ws_causal_gqa_d128(void **s) {
    (void)s;
    acase c = {2, 512, 8, 2, 128, 0, 0, 0, 0, 0};
    run_unsplit(&c);
}
static void ws_long_gqa_d128(void **s) {
    (void)s;
    acase c = {1, 1088, 4, 1, 128, 0, 0, 0, 0, 0};
    run_unsplit(&c);
}
static void ws_softcap_d64(void **s) {
    (void)s;
    acase c = {1, 576, 4, 1, 64, 0, 30.0f, 0, 0, 0};
    run_unsplit(&c);
}
static void ws_fused_layout_softcap_d128(void **s) {
    (void)s;
    acase c = {2, 320, 4, 2, 128, 0, 20.0f, 0, 1, 0};
    run_unsplit(&c);
}

static void ws_gqa_d64(void **s) {
    (void)s;
    acase c = {2, 640, 8, 4, 64, 0, 0, 0, 0, 0};
    run_unsplit(&c);
}

static void unsupported_requests_are_named(void **s) {
    (void)s;
    lt_ctx *ctx = lt_ctx_new();
    lt_attention_params p;
    memset(&p, 0, sizeof p);
    p.B = 1; p.T = 16; p.H = 2; p.Hkv = 2; p.D = 80;
    p.dtype = LT_DTYPE_BF16;
    p.device = LT_DEVICE_CUDA;
    assert_int_equal(lt_attention_check(ctx, &p), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "head dim"));
    lt_ctx_free(ctx);
}

int main(void) {
    int skip = lt_test_cuda_skip();
    if (skip) return skip;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(fwd_causal_gqa_d128),
        cmocka_unit_test(fwd_packed_fused_d128),
        cmocka_unit_test(fwd_window_softcap_d64),
        cmocka_unit_test(fwd_many_offsets_d64),
        cmocka_unit_test(causal_gqa_d64),
        cmocka_unit_test(window_softcap_d96),
        cmocka_unit_test(packed_gqa_d128),
        cmocka_unit_test(packed_softcap_d64),
        cmocka_unit_test(packed_window_fused_layout_d128),
        cmocka_unit_test(window_softcap_d128),
        cmocka_unit_test(causal_long_d128),
        cmocka_unit_test(ws_causal_gqa_d128),
        cmocka_unit_test(ws_long_gqa_d128),
        cmocka_unit_test(ws_softcap_d64),
        cmocka_unit_test(ws_fused_layout_softcap_d128),
        cmocka_unit_test(ws_gqa_d64),
        cmocka_unit_test(unsupported_requests_are_named),
    };
    /* LT_TEST_FILTER=pattern runs the matching cases only (device rounds run variants of the
     * backward on the ws_* cases alone). */
    const char *filter = getenv("LT_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) { return lt_test_cuda_skip(); }
#endif
