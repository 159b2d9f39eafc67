/* FP8 E4M3 scalars and the LT_DTYPE_FP8 projection layout (tensor.h): the encoding of a frozen
 * base held in eight bits (train --base-dtype fp8). Both backends scale a row of activations the
 * same way (lt_fp8_row_scale), so the CPU product is the reference for the CUDA one. */
#include <math.h>
#include <string.h>

#include "core/parallel.h"
#include "longtune/tensor.h"

float lt_fp8_to_f32(uint8_t v) {
    const int sign = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7) return sign ? -NAN : NAN;
    if (e == 0) r = ldexpf((float)m, -9); /* subnormal: m·2^-3·2^-6 */
    else r = ldexpf((float)(8 + m), e - 10);
    return sign ? -r : r;
}

uint8_t lt_f32_to_fp8(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    if (isnan(f)) return (uint8_t)(sign | 0x7f);
    float a = fabsf(f);
    if (a >= LT_FP8_MAX) return (uint8_t)(sign | 0x7e); /* saturate (448 itself is 0x7e) */
    /* a < 448: the exponent of a's binade, clamped to the subnormal binade; the step there is
     * 2^(e-3), and rounding a/step to an integer (ties to even) gives the code's significand */
    int e;
    (void)frexpf(a, &e); /* a = f·2^e, f in [0.5, 1): the binade's exponent is e - 1 */
    int be = e - 1 < -6 ? -6 : e - 1;
    float q = nearbyintf(ldexpf(a, 3 - be)); /* exact scaling; nearbyint rounds ties to even */
    if (q >= 16.0f) q = 8.0f, be++;          /* rounded up into the next binade */
    if (be > 8) return (uint8_t)(sign | 0x7e);
    int mant = (int)q;
    uint8_t code;
    if (mant < 8) code = (uint8_t)mant; /* subnormal (be is -6) or zero */
    else code = (uint8_t)(((be + 7) << 3) | (mant - 8));
    return (uint8_t)(sign | code);
}

float lt_fp8_row_scale(const float *x, int64_t n, float *inv, float *scale) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (isnan(a)) amax = a;
        else if (!isnan(amax) && a > amax) amax = a;
    }
    if (amax > 0.0f) {
        *inv = LT_FP8_MAX / amax;
        *scale = amax / LT_FP8_MAX;
    } else {
        *inv = 0.0f;
        *scale = amax == 0.0f ? 0.0f : amax;
    }
    return amax;
}

typedef struct {
    const float *w;
    int64_t out, in;
    uint8_t *q, *qt;
    float *scale;
} pack_job;

static void pack_rows(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const pack_job *j = arg;
    for (int64_t o = begin; o < end; o++) {
        const float *row = j->w + o * j->in;
        float inv, sc;
        (void)lt_fp8_row_scale(row, j->in, &inv, &sc);
        j->scale[o] = sc;
        uint8_t *q = j->q + o * j->in;
        for (int64_t i = 0; i < j->in; i++) q[i] = lt_f32_to_fp8(row[i] * inv);
    }
}

/* qt (in, out) from q in blocks of 64 x 64 so both sides stay in cache. */
static void pack_transpose(void *arg, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const pack_job *j = arg;
    for (int64_t ib = begin; ib < end; ib++) {
        const int64_t i0 = ib * 64, i1 = i0 + 64 < j->in ? i0 + 64 : j->in;
        for (int64_t o0 = 0; o0 < j->out; o0 += 64) {
            const int64_t o1 = o0 + 64 < j->out ? o0 + 64 : j->out;
            for (int64_t i = i0; i < i1; i++)
                for (int64_t o = o0; o < o1; o++) j->qt[i * j->out + o] = j->q[o * j->in + i];
        }
    }
}

void lt_fp8_pack(const float *w, int64_t out, int64_t in, uint8_t *dst) {
    pack_job j = {w, out, in, dst, dst + (size_t)out * (size_t)in, NULL};
    j.scale = (float *)(dst + 2 * (size_t)out * (size_t)in);
    const int threads = lt_parallel_threads(0);
    lt_parallel_for(threads, out, 16, pack_rows, &j);
    lt_parallel_for(threads, (in + 63) / 64, 1, pack_transpose, &j);
}
