/* AVX2 grid searches of the K-quant encoders (quant_k.c runs the super-block step around them),
 * compiled for AVX2 by function attribute whatever the build targets and taken only where
 * quant_isa.c found the CPU has it. Eight sub-blocks run at once, one per lane: every lane does
 * its sub-block's scalar search, the same float32 operations in the same order (each sum over
 * the sub-block's weights in element order, a product then a sum, never an FMA), its branches
 * turned into masks that keep or replace the lane's state, so each lane ends with the scalar
 * search's bits. Rounding is the scalar lt_quant_round's: the value clamped to the level range
 * (NaN to the low end, as the scalar rounding sends it there) and rounded to nearest, ties to
 * even. A super-block holding a NaN or an infinity goes to the scalar searches, as does the
 * lowest weight of an affine sub-block when it is a zero (whose sign the scalar fminf decides). */
#include "core/quant_internal.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2_FN __attribute__((target("avx2")))

enum { LANES = 8, NMAX_SUB = 32 };

#define GROUP_EPS 1e-15f

/* clamp(round(v), lo, hi) as lt_quant_round then clampi: clamping first is the same for integer
 * bounds (rounding is monotone and fixes integers); max_ps returns its second operand for NaN. */
AVX2_FN static inline __m256 round_clamp(__m256 v, __m256 lo, __m256 hi) {
    return _mm256_round_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

AVX2_FN static inline __m256 vabs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

AVX2_FN static inline __m256 lt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
AVX2_FN static inline __m256 gt(__m256 a, __m256 b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
AVX2_FN static inline __m256 sel(__m256 keep, __m256 take, __m256 m) { return _mm256_blendv_ps(keep, take, m); }

/* 1 when any of x[0..n) is a NaN or an infinity. */
AVX2_FN static int any_nonfinite(const float *x, int n) {
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < n; i += 8) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), e);
        acc = _mm256_or_si256(acc, _mm256_cmpeq_epi32(v, e));
    }
    return !_mm256_testz_si256(acc, acc);
}

/* xt[i] lane j = x[j*n + i]: element i of each of the eight sub-blocks. */
AVX2_FN static void transpose_in(const float *x, int n, __m256 *xt) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(n));
    for (int i = 0; i < n; i++) xt[i] = _mm256_i32gather_ps(x + i, idx, 4);
}

/* The signed largest-magnitude weight of each lane's sub-block (the first of equals), and that
 * magnitude: the scalar signed_max. */
AVX2_FN static __m256 signed_max8(const __m256 *xt, int n, __m256 *amax) {
    __m256 a = _mm256_setzero_ps(), mx = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m256 ax = vabs(xt[i]), m = gt(ax, a);
        a = sel(a, ax, m);
        mx = sel(mx, xt[i], m);
    }
    *amax = a;
    return mx;
}

/* G·8 affine searches (quant_k.c's affine_search), sub-blocks j of x and w at j*n; G = 2 runs
 * two independent sets of eight interleaved, so one set's sums fill the other's latency. */
AVX2_FN __attribute__((always_inline)) static inline void affine_lanes(const float *x, const float *w, int n, int nmax,
                                                                       float rmin, float rdelta, int nstep, int use_mad,
                                                                       uint8_t *L, float *scales, float *mins,
                                                                       const int G) {
    __m256 xt[2][NMAX_SUB], wt[2][NMAX_SUB], Lt[2][NMAX_SUB], ct[2][NMAX_SUB];
    __m256 lo[2], hi[2], sw[2], sx[2], lo0[2], flat[2], inv[2], scale[2], best[2];
    const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps((float)nmax);
    for (int g = 0; g < G; g++) {
        xt[g][0] = wt[g][0] = zero; /* n >= 8: for the compiler's sake */
        transpose_in(x + g * LANES * n, n, xt[g]);
        transpose_in(w + g * LANES * n, n, wt[g]);
        hi[g] = lo[g] = xt[g][0];
        sw[g] = wt[g][0];
        sx[g] = _mm256_mul_ps(wt[g][0], xt[g][0]);
    }
    for (int i = 1; i < n; i++)
        for (int g = 0; g < G; g++) {
            lo[g] = _mm256_min_ps(lo[g], xt[g][i]);
            hi[g] = _mm256_max_ps(hi[g], xt[g][i]);
            sw[g] = _mm256_add_ps(sw[g], wt[g][i]);
            sx[g] = _mm256_add_ps(sx[g], _mm256_mul_ps(wt[g][i], xt[g][i]));
        }
    for (int g = 0; g < G; g++) {
        lo[g] = sel(lo[g], zero, gt(lo[g], zero));
        /* a zero lowest weight: its sign is the scalar fminf chain's (hi's sign never matters) */
        const int zl = _mm256_movemask_ps(_mm256_cmp_ps(lo[g], zero, _CMP_EQ_OQ));
        if (zl) {
            float l8[LANES];
            _mm256_storeu_ps(l8, lo[g]);
            for (int j = 0; j < LANES; j++)
                if (zl >> j & 1) l8[j] = lt_kquant_affine_lo(x + (g * LANES + j) * n, n);
            lo[g] = _mm256_loadu_ps(l8);
        }
        lo0[g] = lo[g];
        flat[g] = _mm256_cmp_ps(hi[g], lo[g], _CMP_EQ_OQ);
        inv[g] = _mm256_div_ps(top, _mm256_sub_ps(hi[g], lo[g]));
        scale[g] = _mm256_div_ps(_mm256_set1_ps(1.0f), inv[g]);
        best[g] = zero;
    }
    for (int i = 0; i < n; i++)
        for (int g = 0; g < G; g++) {
            Lt[g][i] = round_clamp(_mm256_mul_ps(inv[g], _mm256_sub_ps(xt[g][i], lo[g])), zero, top);
            __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(scale[g], Lt[g][i]), lo[g]), xt[g][i]);
            best[g] = _mm256_add_ps(best[g], _mm256_mul_ps(wt[g][i], use_mad ? vabs(diff) : _mm256_mul_ps(diff, diff)));
        }
    for (int s = 0; s <= nstep; s++) {
        const __m256 c = _mm256_set1_ps(rmin + rdelta * (float)s + (float)nmax);
        __m256 sl[2], sl2[2], sxl[2], err[2];
        for (int g = 0; g < G; g++) {
            inv[g] = _mm256_div_ps(c, _mm256_sub_ps(hi[g], lo[g]));
            sl[g] = sl2[g] = sxl[g] = err[g] = zero;
        }
        for (int i = 0; i < n; i++)
            for (int g = 0; g < G; g++) {
                __m256 l = round_clamp(_mm256_mul_ps(inv[g], _mm256_sub_ps(xt[g][i], lo[g])), zero, top);
                ct[g][i] = l;
                __m256 wl = _mm256_mul_ps(wt[g][i], l);
                sl[g] = _mm256_add_ps(sl[g], wl);
                sl2[g] = _mm256_add_ps(sl2[g], _mm256_mul_ps(wl, l));
                sxl[g] = _mm256_add_ps(sxl[g], _mm256_mul_ps(wl, xt[g][i]));
            }
        __m256 det[2], cs[2], cm[2];
        for (int g = 0; g < G; g++) {
            det[g] = _mm256_sub_ps(_mm256_mul_ps(sw[g], sl2[g]), _mm256_mul_ps(sl[g], sl[g]));
            cs[g] = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sw[g], sxl[g]), _mm256_mul_ps(sx[g], sl[g])), det[g]);
            cm[g] = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sl2[g], sx[g]), _mm256_mul_ps(sl[g], sxl[g])), det[g]);
            const __m256 pos = gt(cm[g], zero);
            cm[g] = sel(cm[g], zero, pos);
            cs[g] = sel(cs[g], _mm256_div_ps(sxl[g], sl2[g]), pos);
        }
        for (int i = 0; i < n; i++)
            for (int g = 0; g < G; g++) {
                __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(cs[g], ct[g][i]), cm[g]), xt[g][i]);
                err[g] =
                    _mm256_add_ps(err[g], _mm256_mul_ps(wt[g][i], use_mad ? vabs(diff) : _mm256_mul_ps(diff, diff)));
            }
        for (int g = 0; g < G; g++) {
            /* the scalar skips det <= 0; a NaN det gives a NaN err, which never wins */
            const __m256 take = _mm256_and_ps(gt(det[g], zero), lt(err[g], best[g]));
            if (!_mm256_movemask_ps(take)) continue;
            for (int i = 0; i < n; i++) Lt[g][i] = sel(Lt[g][i], ct[g][i], take);
            best[g] = sel(best[g], err[g], take);
            scale[g] = sel(scale[g], cs[g], take);
            lo[g] = sel(lo[g], cm[g], take);
        }
    }
    for (int g = 0; g < G; g++) {
        /* a flat sub-block: levels 0, scale 0, min -lo */
        _mm256_storeu_ps(scales + g * LANES, sel(scale[g], zero, flat[g]));
        _mm256_storeu_ps(mins + g * LANES, _mm256_xor_ps(sel(lo[g], lo0[g], flat[g]), _mm256_set1_ps(-0.0f)));
        float l8[LANES];
        for (int i = 0; i < n; i++) {
            _mm256_storeu_ps(l8, sel(Lt[g][i], zero, flat[g]));
            for (int j = 0; j < LANES; j++) L[(g * LANES + j) * n + i] = (uint8_t)l8[j];
        }
    }
}

AVX2_FN static void affine8(const float *x, const float *w, int n, int nmax, float rmin, float rdelta, int nstep,
                            int use_mad, uint8_t *L, float *scales, float *mins) {
    affine_lanes(x, w, n, nmax, rmin, rdelta, nstep, use_mad, L, scales, mins, 1);
}

AVX2_FN static void affine16(const float *x, const float *w, int n, int nmax, float rmin, float rdelta, int nstep,
                             int use_mad, uint8_t *L, float *scales, float *mins) {
    affine_lanes(x, w, n, nmax, rmin, rdelta, nstep, use_mad, L, scales, mins, 2);
}

/* Levels l = round_clamp(inv * x) of one grid, and its x²-weighted sums Σ w·x·l and Σ w·l² in the
 * scalar searches' order (w = x²). */
AVX2_FN static inline void weighted_levels(const __m256 *xt, int n, __m256 inv, __m256 lo_l, __m256 hi_l, __m256 *l_out,
                                           __m256 *sxl, __m256 *sl2) {
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m256 l = round_clamp(_mm256_mul_ps(inv, xt[i]), lo_l, hi_l), w = _mm256_mul_ps(xt[i], xt[i]);
        l_out[i] = l;
        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_mul_ps(w, xt[i]), l));
        b = _mm256_add_ps(b, _mm256_mul_ps(_mm256_mul_ps(w, l), l));
    }
    *sxl = a;
    *sl2 = b;
}

/* Eight symmetric searches (quant_k.c's symmetric_search). */
AVX2_FN static void symmetric8(const float *x, int n, int nmax, int8_t *L, float *scales) {
    __m256 xt[NMAX_SUB], Lt[NMAX_SUB], ct[NMAX_SUB];
    transpose_in(x, n, xt);
    const __m256 zero = _mm256_setzero_ps(), lo_l = _mm256_set1_ps((float)-nmax),
                 hi_l = _mm256_set1_ps((float)(nmax - 1));
    __m256 amax, mx = signed_max8(xt, n, &amax);
    const __m256 tiny = lt(amax, _mm256_set1_ps(GROUP_EPS));
    __m256 scale = zero, best = zero;
    for (int s = 0; s <= 18; s++) {
        int is = s == 0 ? 0 : (s <= 9 ? s - 10 : s - 9);
        const float c = (float)nmax + 0.1f * (float)is;
        __m256 sxl, sl2;
        weighted_levels(xt, n, _mm256_div_ps(_mm256_set1_ps(-c), mx), lo_l, hi_l, ct, &sxl, &sl2);
        const __m256 pl = gt(sl2, zero);
        const __m256 take = s == 0 ? _mm256_castsi256_ps(_mm256_set1_epi32(-1))
                                   : _mm256_and_ps(pl, gt(_mm256_mul_ps(sxl, sxl), _mm256_mul_ps(best, sl2)));
        if (!_mm256_movemask_ps(take)) continue;
        const __m256 sc = sel(zero, _mm256_div_ps(sxl, sl2), pl);
        for (int i = 0; i < n; i++) Lt[i] = sel(Lt[i], ct[i], take);
        scale = sel(scale, sc, take);
        best = sel(best, _mm256_mul_ps(sc, sxl), take);
    }
    /* an all-but-zero sub-block: levels 0 (not nmax), scale 0 */
    _mm256_storeu_ps(scales, sel(scale, zero, tiny));
    float l8[LANES];
    const int tz = _mm256_movemask_ps(tiny);
    for (int i = 0; i < n; i++) {
        _mm256_storeu_ps(l8, Lt[i]);
        for (int j = 0; j < LANES; j++) L[j * n + i] = (int8_t)(tz >> j & 1 ? 0 : (int)l8[j] + nmax);
    }
}

/* Eight Q3_K searches (quant_k.c's q3_search). A lane whose pass changed nothing runs on with
 * the others: a pass is a function of the state alone, so it changes nothing again. */
AVX2_FN static void q3_8(const float *x, int n, int nmax, int8_t *L, float *scales) {
    __m256 xt[NMAX_SUB], Lt[NMAX_SUB];
    transpose_in(x, n, xt);
    const __m256 zero = _mm256_setzero_ps(), lo_l = _mm256_set1_ps((float)-nmax),
                 hi_l = _mm256_set1_ps((float)(nmax - 1));
    __m256 amax, mx = signed_max8(xt, n, &amax);
    const int tiny = _mm256_movemask_ps(lt(amax, _mm256_set1_ps(GROUP_EPS)));
    __m256 sxl, sl2;
    weighted_levels(xt, n, _mm256_div_ps(_mm256_set1_ps(-(float)nmax), mx), lo_l, hi_l, Lt, &sxl, &sl2);
    for (int pass = 0; pass < 5; pass++) {
        __m256 changed = zero;
        for (int i = 0; i < n; i++) {
            const __m256 w = _mm256_mul_ps(xt[i], xt[i]), wx = _mm256_mul_ps(w, xt[i]);
            __m256 slx = _mm256_sub_ps(sxl, _mm256_mul_ps(wx, Lt[i]));
            const __m256 go = _mm256_cmp_ps(slx, zero, _CMP_NLE_UQ); /* the scalar skips slx <= 0 */
            __m256 sl2b = _mm256_sub_ps(sl2, _mm256_mul_ps(_mm256_mul_ps(w, Lt[i]), Lt[i]));
            const __m256 nl = round_clamp(_mm256_div_ps(_mm256_mul_ps(xt[i], sl2b), slx), lo_l, hi_l);
            const __m256 moved = _mm256_cmp_ps(nl, Lt[i], _CMP_NEQ_UQ);
            slx = _mm256_add_ps(slx, _mm256_mul_ps(wx, nl));
            sl2b = _mm256_add_ps(sl2b, _mm256_mul_ps(_mm256_mul_ps(w, nl), nl));
            const __m256 better = _mm256_and_ps(gt(sl2b, zero),
                                                gt(_mm256_mul_ps(_mm256_mul_ps(slx, slx), sl2),
                                                   _mm256_mul_ps(_mm256_mul_ps(sxl, sxl), sl2b)));
            const __m256 take = _mm256_and_ps(_mm256_and_ps(go, moved), better);
            Lt[i] = sel(Lt[i], nl, take);
            sxl = sel(sxl, slx, take);
            sl2 = sel(sl2, sl2b, take);
            changed = _mm256_or_ps(changed, take);
        }
        if (!_mm256_movemask_ps(changed)) break;
    }
    const __m256 sc = sel(zero, _mm256_div_ps(sxl, sl2), gt(sl2, zero));
    _mm256_storeu_ps(scales, sc);
    float l8[LANES];
    for (int i = 0; i < n; i++) {
        _mm256_storeu_ps(l8, Lt[i]);
        for (int j = 0; j < LANES; j++) L[j * n + i] = (int8_t)((int)l8[j] + nmax);
    }
    for (int j = 0; j < LANES; j++)
        if (tiny >> j & 1) {
            memset(L + j * n, 0, (size_t)n);
            scales[j] = 0.0f;
        }
}

AVX2_FN static void affine_avx2(const float *x, const float *w, int nsub, int n, int nmax, float rmin, float rdelta,
                                int nstep, int use_mad, uint8_t *L, float *scales, float *mins) {
    if (nsub % LANES || n < 8 || n > NMAX_SUB || n % 8 || any_nonfinite(x, nsub * n) || any_nonfinite(w, nsub * n)) {
        lt_kquant_search_scalar.affine(x, w, nsub, n, nmax, rmin, rdelta, nstep, use_mad, L, scales, mins);
        return;
    }
    int g = 0;
    for (; g + 2 * LANES <= nsub; g += 2 * LANES)
        affine16(x + g * n, w + g * n, n, nmax, rmin, rdelta, nstep, use_mad, L + g * n, scales + g, mins + g);
    for (; g < nsub; g += LANES)
        affine8(x + g * n, w + g * n, n, nmax, rmin, rdelta, nstep, use_mad, L + g * n, scales + g, mins + g);
}

AVX2_FN static void symmetric_avx2(const float *x, int nsub, int n, int nmax, int8_t *L, float *scales) {
    if (nsub % LANES || n < 8 || n > NMAX_SUB || n % 8 || any_nonfinite(x, nsub * n)) {
        lt_kquant_search_scalar.symmetric(x, nsub, n, nmax, L, scales);
        return;
    }
    for (int g = 0; g < nsub; g += LANES) symmetric8(x + g * n, n, nmax, L + g * n, scales + g);
}

AVX2_FN static void q3_avx2(const float *x, int nsub, int n, int nmax, int8_t *L, float *scales) {
    if (nsub % LANES || n < 8 || n > NMAX_SUB || n % 8 || any_nonfinite(x, nsub * n)) {
        lt_kquant_search_scalar.q3(x, nsub, n, nmax, L, scales);
        return;
    }
    for (int g = 0; g < nsub; g += LANES) q3_8(x + g * n, n, nmax, L + g * n, scales + g);
}

/* Eight levels in [0, 255] (whole floats) as bytes at L. */
AVX2_FN static inline void store_levels8(__m256 l, uint8_t *L) {
    const __m256i q = _mm256_cvtps_epi32(l);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64((__m128i *)(void *)L, _mm_packus_epi16(w, w));
}

AVX2_FN static void requant_affine_avx2(const float *x, int n, float dl, float ml, int nmax, uint8_t *L) {
    if (dl == 0.0f) return;
    if (n % 8) {
        lt_kquant_search_scalar.requant_affine(x, n, dl, ml, nmax, L);
        return;
    }
    const __m256 d = _mm256_set1_ps(dl), m = _mm256_set1_ps(ml), lo = _mm256_setzero_ps(),
                 hi = _mm256_set1_ps((float)nmax);
    for (int i = 0; i < n; i += 8)
        store_levels8(round_clamp(_mm256_div_ps(_mm256_add_ps(_mm256_loadu_ps(x + i), m), d), lo, hi), L + i);
}

AVX2_FN static void requant_symmetric_avx2(const float *x, int n, float dl, int nmax, int8_t *L) {
    if (dl == 0.0f) return;
    if (n % 8) {
        lt_kquant_search_scalar.requant_symmetric(x, n, dl, nmax, L);
        return;
    }
    const __m256 d = _mm256_set1_ps(dl), lo = _mm256_set1_ps((float)-nmax), hi = _mm256_set1_ps((float)(nmax - 1)),
                 off = _mm256_set1_ps((float)nmax);
    for (int i = 0; i < n; i += 8)
        store_levels8(_mm256_add_ps(round_clamp(_mm256_div_ps(_mm256_loadu_ps(x + i), d), lo, hi), off),
                      (uint8_t *)L + i);
}

static const lt_kquant_search avx2_search = {affine_avx2, symmetric_avx2, q3_avx2, requant_affine_avx2,
                                             requant_symmetric_avx2};

const lt_kquant_search *lt_kquant_search_avx2(void) { return &avx2_search; }

#else

const lt_kquant_search *lt_kquant_search_avx2(void) { return NULL; }

#endif
