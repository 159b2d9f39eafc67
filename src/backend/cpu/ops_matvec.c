/* The weight matmul's few-row path (NT mode, N <= LT_MATVEC_MAX_N rows of x, as one decode step of
 * a batch of sequences asks): no dequantised tile and no BLAS call; every weight row is read once
 * and dotted with all N rows of x. Q4_0, Q4_1 and Q8_0 rows are dotted in their block format
 * against x quantised to 8-bit blocks of 32 (a scale and the block's sum, as llama.cpp's q8_1):
 * integer products in AVX2, scaled per block in f32. Any other non-f32 dtype is widened a row at a
 * time with lt_dequantize_row and dotted in f32. Rows are split over the context's threads. The
 * rounding of x makes this path differ from the tiled one: 8 bits per block for Q4_0/Q4_1 rows (as
 * llama.cpp's q8_1), 16 bits for Q8_0 rows (xblock16); the f32 fallback differs only by summation
 * order. */
#include <math.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define LT_MATVEC_AVX2 1
#endif

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

/* One 32-element block of x: x ≈ q·d, s = d·Σq. */
typedef struct xblock {
    float d, s;
    int8_t q[32];
} xblock;

/* The same in 16 bits, for Q8_0 rows: an LM head's input (the final norm's output) carries a few
 * channels far larger than the rest, which 8 bits per block would round the others away against
 * (on SmolLM2-135M the greedy answer changed); 16 bits cost one widening per 16 weights. */
typedef struct xblock16 {
    float d, pad;
    int16_t q[32];
} xblock16;

/* Weight rows per parallel work item (also tried 8: more scheduling for no gain at 576 rows). */
#define MATVEC_GRAIN 16

/* The workspace (the matmul's, LT_MATMUL_TILE·in floats per thread) holds the quantised x (at most
 * LT_MATVEC_MAX_N·in/32 blocks of 72 bytes) or one widened row per thread. */
static int block32(lt_dtype t) { return t == LT_DTYPE_Q4_0 || t == LT_DTYPE_Q4_1 || t == LT_DTYPE_Q8_0; }

/* Inline forms of fmaxf(a, |v|) and lrintf (half away from zero) that the compiler vectorises
 * (the libm calls are not inlined without -ffast-math). */
static inline float absmax(float a, float v) {
    float m = v < 0 ? -v : v;
    return m > a ? m : a;
}
static inline int round_int(float v) { return (int)(v + (v >= 0 ? 0.5f : -0.5f)); }

static void quantize_x(const float *x, int64_t in, xblock *xb) {
    for (int64_t b = 0; b < in / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = absmax(amax, v[i]);
        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            int q = round_int(v[i] * id);
            xb[b].q[i] = (int8_t)q;
            sum += q;
        }
        xb[b].d = d;
        xb[b].s = d * (float)sum;
    }
}

typedef struct {
    const lt_tensor *w;
    const float *x;
    const xblock *xq;     /* (N, in/32) */
    const xblock16 *xq16; /* (N, in/32), Q8_0 rows */
    float *y, *rowbuf;
    int64_t N, out, in;
    float beta;
    size_t row_bytes;
} mv_job;

static void quantize_x16(const float *x, int64_t in, xblock16 *xb) {
    for (int64_t b = 0; b < in / 32; b++) {
        const float *v = x + b * 32;
        float amax = 0;
        for (int i = 0; i < 32; i++) amax = absmax(amax, v[i]);
        float d = amax / 32767.0f, id = d > 0 ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) xb[b].q[i] = (int16_t)round_int(v[i] * id);
        xb[b].d = d, xb[b].pad = 0;
    }
}

#if defined(LT_MATVEC_AVX2)
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

static inline float h16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Σ over blocks of u8 (0..15) weights × s8 x, per block scaled: returns Σ_b dw_b·dx_b·Σ w·q and
 * accumulates Σ_b mw_b·s_b into *off (Q4_1 min; Q4_0: -8·dw·s). */
static float dot_q4(const uint8_t *row, const xblock *xb, int64_t nb, int has_min) {
    const __m256i ones = _mm256_set1_epi16(1), lowm = _mm256_set1_epi8(0x0f);
    const size_t bs = has_min ? 20 : 18, qo = has_min ? 4 : 2;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    float off = 0;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const uint8_t *p0 = row + (size_t)b * bs, *p1 = p0 + bs;
        __m128i r0 = _mm_loadu_si128((const __m128i *)(p0 + qo)), r1 = _mm_loadu_si128((const __m128i *)(p1 + qo));
        __m256i w0 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r0, 4), r0), lowm);
        __m256i w1 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r1, 4), r1), lowm);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)xb[b].q),
                x1 = _mm256_loadu_si256((const __m256i *)xb[b + 1].q);
        __m256 s0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w0, x0), ones));
        __m256 s1 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w1, x1), ones));
        float d0 = h16(p0), d1 = h16(p1);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xb[b].d), s0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1 * xb[b + 1].d), s1, acc1);
        if (has_min) off += h16(p0 + 2) * xb[b].s + h16(p1 + 2) * xb[b + 1].s;
        else off -= 8.0f * (d0 * xb[b].s + d1 * xb[b + 1].s);
    }
    for (; b < nb; b++) {
        const uint8_t *p0 = row + (size_t)b * bs;
        __m128i r0 = _mm_loadu_si128((const __m128i *)(p0 + qo));
        __m256i w0 = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(r0, 4), r0), lowm);
        __m256i x0 = _mm256_loadu_si256((const __m256i *)xb[b].q);
        __m256 s0 = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(w0, x0), ones));
        float d0 = h16(p0);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xb[b].d), s0, acc0);
        off += has_min ? h16(p0 + 2) * xb[b].s : -8.0f * d0 * xb[b].s;
    }
    return hsum(_mm256_add_ps(acc0, acc1)) + off;
}

static float dot_q8(const uint8_t *row, const xblock16 *xb, int64_t nb) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p0 = row + (size_t)b * 34;
        __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p0 + 2)));
        __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(p0 + 18)));
        __m256i x0 = _mm256_loadu_si256((const __m256i *)xb[b].q),
                x1 = _mm256_loadu_si256((const __m256i *)(xb[b].q + 16));
        __m256i s = _mm256_add_epi32(_mm256_madd_epi16(w0, x0), _mm256_madd_epi16(w1, x1));
        __m256 sf = _mm256_cvtepi32_ps(s), sc = _mm256_set1_ps(h16(p0) * xb[b].d);
        if (b & 1) acc1 = _mm256_fmadd_ps(sc, sf, acc1);
        else acc0 = _mm256_fmadd_ps(sc, sf, acc0);
    }
    return hsum(_mm256_add_ps(acc0, acc1));
}
#else
static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return lt_f16_to_f32(h);
}

static float dot_q4(const uint8_t *row, const xblock *xb, int64_t nb, int has_min) {
    const size_t bs = has_min ? 20 : 18, qo = has_min ? 4 : 2;
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = row + (size_t)b * bs;
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += (p[qo + j] & 0xf) * xb[b].q[j] + (p[qo + j] >> 4) * xb[b].q[j + 16];
        float d = f16(p);
        acc += d * xb[b].d * (float)sum + (has_min ? f16(p + 2) * xb[b].s : -8.0f * d * xb[b].s);
    }
    return acc;
}

static float dot_q8(const uint8_t *row, const xblock16 *xb, int64_t nb) {
    float acc = 0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = row + (size_t)b * 34;
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (int8_t)p[2 + j] * xb[b].q[j];
        acc += f16(p) * xb[b].d * (float)sum;
    }
    return acc;
}
#endif

static void mv_block_rows(void *arg, int64_t r0, int64_t r1, int thread) {
    (void)thread;
    const mv_job *j = arg;
    const uint8_t *W = j->w->data;
    int64_t nb = j->in / 32;
    for (int64_t o = r0; o < r1; o++) {
        const uint8_t *row = W + (size_t)o * j->row_bytes;
        for (int64_t n = 0; n < j->N; n++) {
            float v = j->w->dtype == LT_DTYPE_Q8_0 ? dot_q8(row, j->xq16 + n * nb, nb)
                                                   : dot_q4(row, j->xq + n * nb, nb, j->w->dtype == LT_DTYPE_Q4_1);
            float *yo = j->y + n * j->out + o;
            *yo = j->beta == 0.0f ? v : v + j->beta * *yo;
        }
    }
}

static void mv_generic_rows(void *arg, int64_t r0, int64_t r1, int thread) {
    const mv_job *j = arg;
    const uint8_t *W = j->w->data;
    float *buf = j->rowbuf + (size_t)thread * (size_t)j->in;
    for (int64_t o = r0; o < r1; o++) {
        lt_dequantize_row(j->w->dtype, W + (size_t)o * j->row_bytes, buf, j->in);
        for (int64_t n = 0; n < j->N; n++) {
            const float *x = j->x + n * j->in;
            float v = 0;
            for (int64_t i = 0; i < j->in; i++) v += buf[i] * x[i];
            float *yo = j->y + n * j->out + o;
            *yo = j->beta == 0.0f ? v : v + j->beta * *yo;
        }
    }
}

int lt_cpu_matvec(lt_ctx *ctx, const lt_tensor *w, const float *x, int64_t N, float beta, float *y, void *ws) {
    int64_t out = w->shape[0], in = w->shape[1];
    if (w->dtype == LT_DTYPE_F32 || N > LT_MATVEC_MAX_N || !ws) return 0;
    mv_job j = {w, x, NULL, NULL, y, NULL, N, out, in, beta, (size_t)lt_dtype_row_bytes(w->dtype, in)};
    int threads = lt_ctx_threads(ctx);
    if (block32(w->dtype) && in % 32 == 0) {
        if (w->dtype == LT_DTYPE_Q8_0) {
            xblock16 *xq = ws;
            for (int64_t n = 0; n < N; n++) quantize_x16(x + n * in, in, xq + n * (in / 32));
            j.xq16 = xq;
        } else {
            xblock *xq = ws;
            for (int64_t n = 0; n < N; n++) quantize_x(x + n * in, in, xq + n * (in / 32));
            j.xq = xq;
        }
        lt_parallel_for(threads, out, MATVEC_GRAIN, mv_block_rows, &j);
    } else {
        j.rowbuf = ws;
        lt_parallel_for(threads, out, MATVEC_GRAIN, mv_generic_rows, &j);
    }
    return 1;
}
