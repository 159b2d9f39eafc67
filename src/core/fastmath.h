/* Branch-free exp and tanh in f32 for loops that must vectorise (softmax rows, GLU activations,
 * logit softcaps): no calls and no branches, so GCC turns a loop of them into vector code where
 * libm's expf / tanhf would be one call per element. Used by the CPU kernels and by the host-side
 * softcap of generated logits. Pure; every input has a defined result (NaN stays NaN). */
#ifndef LT_CORE_FASTMATH_H
#define LT_CORE_FASTMATH_H

#include <stdint.h>
#include <string.h>

/* exp(x) without branches or calls so that softmax loops vectorise: x = n ln2 + r with |r| <=
 * ln2/2, e^r from its degree-7 Taylor polynomial (truncation < 5e-9 relative), 2^n built in the
 * exponent bits. Inputs are clamped to [-87, 88], so exp of very negative arguments is ~1e-38
 * rather than 0, far below anything a sum of softmax terms (the largest of which is 1) can see.
 * Relative error < 1.5 ulp (measured over [-60, 0] in steps of 1e-5). */
static inline float lt_fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float t = x * 1.44269504088896341f + shifter;
    float n = t - shifter;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    uint32_t tb, sb = 0x4B400000u; /* the bits of `shifter` */
    memcpy(&tb, &t, 4);
    uint32_t e = (tb - sb + 127u) << 23;
    float s;
    memcpy(&s, &e, 4);
    return p * s;
}

/* tanh(x) for the logit softcap, branch-free like lt_fast_exp: its Taylor series to x^13 for |x| <
 * 0.4 (next term < 2e-9 relative), 1 - 2/(e^{2|x|} + 1) above, where no cancellation remains; the
 * sign is copied back. Relative error < 3 ulp (measured over [-30, 30] in steps of 1e-5). */
static inline float lt_fast_tanh(float x) {
    const float ax = x < 0 ? -x : x, x2 = x * x;
    float p = 21844.0f / 6081075.0f;
    p = p * x2 - 1382.0f / 155925.0f;
    p = p * x2 + 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    const float small = ax + ax * x2 * p;
    const float big = 1.0f - 2.0f / (lt_fast_exp(2.0f * ax) + 1.0f);
    const float r = ax < 0.4f ? small : big;
    return x < 0 ? -r : r;
}

/* x[i] -> cap·tanh(x[i] / cap) for i < n (the final-logit softcap), vectorised; cap <= 0 leaves x
 * as it is. */
void lt_fast_softcap(float *x, int64_t n, float cap);

#endif
