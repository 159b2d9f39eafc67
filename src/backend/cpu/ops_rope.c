/* Rotate-half RoPE (Hugging Face layout) on the CPU: element i of a head pairs with i + D/2.
 * Angles are pos·inv_freq computed in fp32 as transformers does, so the two agree to rounding.
 * The table (D/2 frequencies with the scaling applied, then the attention factor cos and sin are
 * multiplied by) is the model's; this file only rotates. */
#include <math.h>

#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

typedef struct rope_job {
    float *x;
    const int32_t *pos;
    const float *inv_freq;
    int64_t heads, D;
    float sign;
} rope_job;

LT_CPU_CLONES static void rope_rows(void *arg, int64_t n0, int64_t n1, int thread) {
    (void)thread;
    const rope_job *j = arg;
    int64_t half = j->D / 2;
    const float scale = j->inv_freq[half];
    for (int64_t n = n0; n < n1; n++) {
        float p = (float)j->pos[n];
        for (int64_t i = 0; i < half; i++) {
            float ang = p * j->inv_freq[i];
            float c = scale * cosf(ang), s = scale * j->sign * sinf(ang);
            for (int64_t h = 0; h < j->heads; h++) {
                float *v = j->x + (n * j->heads + h) * j->D;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void lt_cpu_rope(lt_ctx *ctx, float *x, const int32_t *pos, const float *inv_freq, int64_t N, int64_t heads, int64_t D,
                 int inverse) {
    rope_job j = {x, pos, inv_freq, heads, D, inverse ? -1.0f : 1.0f};
    lt_parallel_for(lt_ctx_threads(ctx), N, 16, rope_rows, &j);
}
