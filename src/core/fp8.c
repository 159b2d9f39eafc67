/* FP8 E4M3 scalars and the LT_DTYPE_FP8 projection layout (tensor.h): the encoding of a frozen
 * base held in eight bits (train --base-dtype fp8). Both backends scale a row of activations the
 * same way (lt_fp8_row_scale), so the CPU product is the reference for the CUDA one. */
#include <math.h>
#include <string.h>

#include "core/parallel.h"
#include "longtune/tensor.h"

/* Decoding and encoding work on the bits (both run once per weight and activation of every FP8
 * product the CPU emulates): a normal code's exponent and significand move into an f32's fields;
 * a subnormal one is m·2^-9. */
float lt_fp8_to_f32(uint8_t v) {
    const uint32_t sign = (uint32_t)(v >> 7) << 31, e = (v >> 3) & 15u, m = v & 7u;
    float r;
    if (e == 15 && m == 7) return sign ? -NAN : NAN;
    if (e == 0) {
        r = (float)m * 0x1p-9f;
    } else {
        uint32_t b = (e + 120u) << 23 | m << 20; /* bias 7 -> 127 */
        memcpy(&r, &b, 4);
    }
    return sign ? -r : r;
}

uint8_t lt_f32_to_fp8(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint8_t sign = (uint8_t)((b >> 24) & 0x80);
    b &= 0x7fffffffu;
    if (b > 0x7f800000u) return (uint8_t)(sign | 0x7f);  /* NaN */
    if (b >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* >= 448 (and inf): saturate; 448 is 0x7e */
    if (b < 0x3c800000u) {                               /* below 2^-6: the subnormal binade, step 2^-9 */
        float a;
        memcpy(&a, &b, 4);
        return (uint8_t)(sign | (uint8_t)nearbyintf(a * 0x1p9f)); /* exact scaling; ties to even; 8 is 2^-6 */
    }
    /* normal: round the 23-bit significand to 3 bits, ties to even; a carry moves into the
     * exponent, which is what the next binade's code needs */
    b += 0x7ffffu + ((b >> 20) & 1u);
    const uint32_t e = (b >> 23) - 120u, m = (b >> 20) & 7u;          /* bias 127 -> 7 */
    if (e > 15 || (e == 15 && m == 7)) return (uint8_t)(sign | 0x7e); /* rounded past 448 */
    return (uint8_t)(sign | e << 3 | m);
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
    int64_t in;
    uint8_t *q;
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

const float *lt_fp8_scales(const void *data, int64_t out, int64_t in) {
    return (const float *)((const uint8_t *)data + (size_t)out * (size_t)in);
}

void lt_fp8_pack(const float *w, int64_t out, int64_t in, uint8_t *dst) {
    pack_job j = {w, in, dst, (float *)(dst + (size_t)out * (size_t)in)};
    lt_parallel_for(lt_parallel_threads(0), out, 16, pack_rows, &j);
}
