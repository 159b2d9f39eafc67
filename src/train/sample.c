/* Sampling one id from a row of logits: repetition penalty, temperature, top-k (quickselect of the
 * k-th largest), top-p (probabilities bucketed by quarter-octave so only the few buckets that hold
 * the nucleus are sorted: exact, O(V) but for those), min-p, then one uniform draw over what is
 * kept. Everything in double over scratch allocated once per sampler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "longtune/alloc.h"
#include "longtune/generate.h"

#define NBUCKET 128 /* quarter octaves: p down to 2^-32 of the max; the last bucket holds the rest */

struct lt_sampler {
    lt_sample_options o;
    int64_t V;
    double *p;     /* (V) */
    double *tmp;   /* (V) quickselect scratch */
    int32_t *ids;  /* (V) candidates */
    uint8_t *seen; /* (V) penalty marks */
    size_t bytes;
};

lt_status lt_sample_check(lt_ctx *ctx, const lt_sample_options *o) {
    if (!(o->temperature >= 0) || o->temperature > 1e4)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: temperature %g outside [0, 1e4]", o->temperature);
    if (o->top_k < 0) return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: top_k %lld is negative", (long long)o->top_k);
    if (!(o->top_p >= 0 && o->top_p <= 1))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: top_p %g outside (0, 1]", o->top_p);
    if (!(o->min_p >= 0 && o->min_p < 1))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: min_p %g outside [0, 1)", o->min_p);
    if (!(o->repeat_penalty == 0 || (o->repeat_penalty > 0 && o->repeat_penalty <= 100)))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: repeat_penalty %g outside (0, 100]", o->repeat_penalty);
    if (o->repeat_last_n < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: repeat_last_n %lld is negative",
                        (long long)o->repeat_last_n);
    return LT_OK;
}

lt_status lt_sampler_new(lt_ctx *ctx, int64_t V, const lt_sample_options *o, lt_sampler **out) {
    *out = NULL;
    LT_TRY(lt_sample_check(ctx, o));
    if (V < 1) return lt_error(ctx, LT_ERR_INVALID_ARG, "sampling: vocabulary %lld", (long long)V);
    size_t bytes = sizeof(lt_sampler) + (size_t)V * (2 * sizeof(double) + sizeof(int32_t) + 1);
    uint8_t *b = lt_calloc(ctx, LT_DEVICE_CPU, bytes, "sampler");
    if (!b) return lt_ctx_status(ctx);
    lt_sampler *s = (lt_sampler *)b;
    s->o = *o, s->V = V, s->bytes = bytes;
    s->p = (double *)(b + sizeof(lt_sampler));
    s->tmp = s->p + V;
    s->ids = (int32_t *)(s->tmp + V);
    s->seen = (uint8_t *)(s->ids + V);
    *out = s;
    return LT_OK;
}

void lt_sampler_free(lt_ctx *ctx, lt_sampler *s) {
    if (s) lt_free(ctx, LT_DEVICE_CPU, s, s->bytes);
}

static _Thread_local const double *t_p;
static int by_p_desc(const void *a, const void *b) {
    double x = t_p[*(const int32_t *)a], y = t_p[*(const int32_t *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

/* The k-th largest of v[0..n) (1-based k), by quickselect over a scratch copy. */
static double kth_largest(double *v, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        double piv = v[(lo + hi) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > piv) i++;
            while (v[j] < piv) j--;
            if (i <= j) {
                double t = v[i];
                v[i] = v[j], v[j] = t;
                i++, j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

int32_t lt_sampler_pick(lt_sampler *s, const float *z, const int32_t *hist, int64_t nh, uint64_t *rng) {
    const lt_sample_options *o = &s->o;
    const int64_t V = s->V;
    double *p = s->p;
    for (int64_t j = 0; j < V; j++) p[j] = z[j];
    double pen = o->repeat_penalty > 0 ? o->repeat_penalty : 1.0;
    if (pen != 1.0 && nh > 0) {
        int64_t last = o->repeat_last_n ? o->repeat_last_n : 64, h0 = nh > last ? nh - last : 0;
        for (int64_t i = h0; i < nh; i++) {
            int32_t id = hist[i];
            if (id < 0 || id >= V || s->seen[id]) continue;
            s->seen[id] = 1;
            p[id] = p[id] > 0 ? p[id] / pen : p[id] * pen;
        }
        for (int64_t i = h0; i < nh; i++)
            if (hist[i] >= 0 && hist[i] < V) s->seen[hist[i]] = 0;
    }
    int64_t best = 0;
    for (int64_t j = 1; j < V; j++)
        if (p[j] > p[best]) best = j;
    if (o->temperature <= 0) return (int32_t)best;
    const double mx = p[best];
    for (int64_t j = 0; j < V; j++) p[j] = exp((p[j] - mx) / o->temperature); /* p_max = 1 */
    int64_t n = 0;
    double top_p = o->top_p > 0 ? o->top_p : 1.0;
    if (o->top_k > 0 && o->top_k < V) {
        memcpy(s->tmp, p, (size_t)V * sizeof(double));
        double t = kth_largest(s->tmp, V, o->top_k);
        for (int64_t j = 0; j < V && n < o->top_k; j++)
            if (p[j] > t) s->ids[n++] = (int32_t)j;
        for (int64_t j = 0; j < V && n < o->top_k; j++) /* ties at the k-th value, lowest ids first */
            if (p[j] == t) s->ids[n++] = (int32_t)j;
    }
    if (!n && top_p < 1) { /* the buckets that hold the nucleus */
        double mass[NBUCKET] = {0}, total = 0;
        for (int64_t j = 0; j < V; j++) {
            int b = p[j] > 0 ? (int)(-log2(p[j]) * 4) : NBUCKET - 1;
            mass[b < NBUCKET ? b : NBUCKET - 1] += p[j];
            total += p[j];
        }
        double acc = 0;
        int cut = NBUCKET - 1;
        for (int b = 0; b < NBUCKET; b++)
            if ((acc += mass[b]) >= top_p * total) {
                cut = b;
                break;
            }
        double floor_p = cut < NBUCKET - 1 ? exp2(-(double)(cut + 1) / 4) : 0;
        for (int64_t j = 0; j < V; j++)
            if (p[j] >= floor_p) s->ids[n++] = (int32_t)j;
        t_p = p;
        qsort(s->ids, (size_t)n, sizeof(int32_t), by_p_desc);
        double keep = 0;
        int64_t k = 0;
        while (k < n && keep < top_p * total) keep += p[s->ids[k++]];
        n = k;
    } else if (n && top_p < 1) {
        t_p = p;
        qsort(s->ids, (size_t)n, sizeof(int32_t), by_p_desc);
        double total = 0, keep = 0;
        for (int64_t i = 0; i < n; i++) total += p[s->ids[i]];
        int64_t k = 0;
        while (k < n && keep < top_p * total) keep += p[s->ids[k++]];
        n = k;
    }
    if (!n)
        for (int64_t j = 0; j < V; j++) s->ids[n++] = (int32_t)j;
    if (o->min_p > 0) { /* p_max = 1 after the shift, and the argmax is always kept */
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++)
            if (p[s->ids[i]] >= o->min_p) s->ids[k++] = s->ids[i];
        n = k;
    }
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += p[s->ids[i]];
    double u = (double)(lt_splitmix64(rng) >> 11) * 0x1.0p-53 * sum, acc = 0;
    for (int64_t i = 0; i < n; i++)
        if ((acc += p[s->ids[i]]) > u) return s->ids[i];
    return s->ids[n - 1];
}
