/* Decode attention on the CPU: each (query token, head) pair is one task over its visible cached
 * keys, with an online softmax in f32 (running max and sum, the output rescaled as the max grows),
 * so nothing but the output is written and no workspace is needed. Tasks are split over the
 * context's threads; one task's sum runs in key order, so results do not depend on the thread
 * count. The split over keys of flash-decoding buys nothing here: there are at least as many tasks
 * as threads whenever H >= threads. */
#include <math.h>

#include "backend/attention_impl.h"
#include "backend/cpu/cpu_ops.h"
#include "core/parallel.h"

static void decode_tasks(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const lt_decode_attention_params *p = arg;
    const int64_t D = p->D, H = p->H, Hkv = p->Hkv, group = H / Hkv;
    float acc[LT_ATTENTION_CPU_MAX_D];
    for (int64_t t = t0; t < t1; t++) {
        const int64_t i = t / H, h = t % H, kvh = h / group;
        const int64_t len = p->len[i], lo = p->window > 0 && len > p->window ? len - p->window : 0;
        const float *q = p->q + (i * H + h) * D;
        const float *kb = p->kc + ((int64_t)p->seq[i] * p->ctx * Hkv + kvh) * D;
        const float *vb = p->vc + ((int64_t)p->seq[i] * p->ctx * Hkv + kvh) * D;
        float mx = -INFINITY, sum = 0;
        for (int64_t d = 0; d < D; d++) acc[d] = 0;
        for (int64_t j = lo; j < len; j++) {
            const float *k = kb + j * Hkv * D, *v = vb + j * Hkv * D;
            float s = 0;
            for (int64_t d = 0; d < D; d++) s += q[d] * k[d];
            s *= p->scale;
            if (p->softcap > 0) s = p->softcap * tanhf(s / p->softcap);
            if (s > mx) {
                const float c = expf(mx - s); /* 0 on the first key */
                sum *= c;
                for (int64_t d = 0; d < D; d++) acc[d] *= c;
                mx = s;
            }
            const float e = expf(s - mx);
            sum += e;
            for (int64_t d = 0; d < D; d++) acc[d] += e * v[d];
        }
        float *o = p->out + (i * H + h) * D;
        const float inv = sum > 0 ? 1.0f / sum : 0.0f;
        for (int64_t d = 0; d < D; d++) o[d] = acc[d] * inv;
    }
}

size_t lt_cpu_decode_attention_workspace_bytes(const lt_decode_attention_params *p, int threads) {
    (void)p, (void)threads;
    return 0;
}

lt_status lt_cpu_decode_attention(lt_ctx *ctx, const lt_decode_attention_params *p) {
    lt_parallel_for(lt_ctx_threads(ctx), p->n * p->H, 1, decode_tasks, (void *)p);
    return LT_OK;
}
