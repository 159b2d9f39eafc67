/* The sampler (src/train/sample.c) with fixed seeds: greedy is the argmax (lowest id on ties), top-k
 * never picks outside the k largest, top-p keeps the smallest most-likely set of mass >= p (and the
 * draws follow its renormalised distribution), min-p drops ids below min_p·p_max, the repetition
 * penalty moves mass off repeated ids (both signs of logit), temperature sharpens, seeds
 * reproduce, and out-of-range options are typed errors naming the field. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/rng.h"
#include "longtune/generate.h"

#define V 500
#define DRAWS 20000

static void logits(float *z, uint64_t seed) {
    uint64_t r = seed;
    for (int j = 0; j < V; j++) z[j] = (float)((double)(lt_splitmix64(&r) >> 11) * 0x1.0p-53 * 8.0 - 4.0);
}

static lt_sampler *make(lt_ctx *ctx, const lt_sample_options *o) {
    lt_sampler *s = NULL;
    assert_int_equal(lt_sampler_new(ctx, V, o, &s), LT_OK);
    return s;
}

/* Probabilities softmax(z / t) in double. */
static void softmax(const float *z, double t, double *p) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) mx = fmax(mx, z[j]);
    for (int j = 0; j < V; j++) sum += p[j] = exp((z[j] - mx) / t);
    for (int j = 0; j < V; j++) p[j] /= sum;
}

static int rank_of(const double *p, int id) {
    int k = 0;
    for (int j = 0; j < V; j++) k += p[j] > p[id] || (p[j] == p[id] && j < id);
    return k;
}

static void test_greedy(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    float z[V];
    logits(z, 1);
    int best = 0;
    for (int j = 1; j < V; j++)
        if (z[j] > z[best]) best = j;
    lt_sample_options o = {0};
    lt_sampler *s = make(ctx, &o);
    uint64_t rng = 5, before = rng;
    assert_int_equal(lt_sampler_pick(s, z, NULL, 0, &rng), best);
    assert_true(rng == before);     /* greedy draws nothing */
    z[7] = z[best], z[3] = z[best]; /* ties: the lowest id */
    assert_int_equal(lt_sampler_pick(s, z, NULL, 0, &rng), best < 3 ? best : 3);
    lt_sampler_free(ctx, s);
    lt_ctx_free(ctx);
}

static void test_top_k(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    float z[V];
    double p[V];
    logits(z, 2);
    softmax(z, 2.0, p);
    lt_sample_options o = {.temperature = 2.0, .top_k = 5, .seed = 1};
    lt_sampler *s = make(ctx, &o);
    uint64_t rng = 11;
    int seen[5] = {0};
    for (int i = 0; i < DRAWS; i++) {
        int id = lt_sampler_pick(s, z, NULL, 0, &rng), k = rank_of(p, id);
        assert_true(k < 5);
        seen[k]++;
    }
    for (int k = 0; k < 5; k++) assert_true(seen[k] > 0);
    /* the draws follow the renormalised top-5 distribution */
    double mass = 0;
    for (int j = 0; j < V; j++) mass += rank_of(p, j) < 5 ? p[j] : 0;
    for (int j = 0; j < V; j++) {
        int k = rank_of(p, j);
        if (k >= 5) continue;
        double want = p[j] / mass, got = (double)seen[k] / DRAWS, sd = sqrt(want * (1 - want) / DRAWS);
        assert_true(fabs(got - want) < 5 * sd + 1e-9);
    }
    lt_sampler_free(ctx, s);
    lt_ctx_free(ctx);
}

static void test_top_p(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    float z[V];
    double p[V];
    logits(z, 3);
    for (double top_p = 0.3; top_p < 0.96; top_p += 0.3) {
        softmax(z, 0.7, p);
        /* the nucleus: the most likely ids until their mass reaches top_p */
        int order[V], n = 0;
        for (int k = 0; k < V; k++)
            for (int j = 0; j < V; j++)
                if (rank_of(p, j) == k) order[k] = j;
        double acc = 0;
        while (acc < top_p) acc += p[order[n++]];
        lt_sample_options o = {.temperature = 0.7, .top_p = top_p};
        lt_sampler *s = make(ctx, &o);
        uint64_t rng = 99;
        int max_rank = 0, hits_last = 0;
        for (int i = 0; i < DRAWS; i++) {
            int k = rank_of(p, lt_sampler_pick(s, z, NULL, 0, &rng));
            if (k > max_rank) max_rank = k;
            hits_last += k == n - 1;
        }
        assert_true(max_rank <= n - 1); /* never outside the nucleus */
        assert_true(max_rank >= n - 2); /* and it reaches (nearly) all of it */
        double want = p[order[n - 1]] / acc;
        assert_true(fabs((double)hits_last / DRAWS - want) < 5 * sqrt(want / DRAWS) + 1e-9);
        lt_sampler_free(ctx, s);
    }
    lt_ctx_free(ctx);
}

static void test_min_p(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    float z[V];
    double p[V];
    logits(z, 4);
    softmax(z, 1.0, p);
    double pmax = 0;
    for (int j = 0; j < V; j++) pmax = fmax(pmax, p[j]);
    lt_sample_options o = {.temperature = 1.0, .min_p = 0.5};
    lt_sampler *s = make(ctx, &o);
    uint64_t rng = 3;
    int kept = 0;
    for (int j = 0; j < V; j++) kept += p[j] >= 0.5 * pmax;
    int seen[V] = {0}, distinct = 0;
    for (int i = 0; i < DRAWS; i++) {
        int id = lt_sampler_pick(s, z, NULL, 0, &rng);
        assert_true(p[id] >= 0.5 * pmax * (1 - 1e-9));
        distinct += !seen[id]++;
    }
    assert_int_equal(distinct, kept);
    lt_sampler_free(ctx, s);
    lt_ctx_free(ctx);
}

static void test_repeat_penalty(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    float z[V];
    for (int j = 0; j < V; j++) z[j] = -5;
    z[10] = 3.0f, z[20] = 2.9f, z[30] = -0.5f, z[40] = -0.6f;
    lt_sample_options o = {0};
    lt_sampler *s = make(ctx, &o);
    uint64_t rng = 1;
    int32_t hist[3] = {10, 10, 30};
    assert_int_equal(lt_sampler_pick(s, z, hist, 3, &rng), 10); /* no penalty */
    lt_sampler_free(ctx, s);
    o.repeat_penalty = 1.5;
    s = make(ctx, &o);
    assert_int_equal(lt_sampler_pick(s, z, hist, 3, &rng), 20); /* 3/1.5 = 2 < 2.9 */
    lt_sampler_free(ctx, s);
    /* a negative logit is multiplied: id 30 (-0.5 · 1.5) falls below id 40 */
    float y[V];
    for (int j = 0; j < V; j++) y[j] = -5;
    y[30] = -0.5f, y[40] = -0.6f;
    s = make(ctx, &o);
    assert_int_equal(lt_sampler_pick(s, y, hist, 3, &rng), 40);
    /* outside repeat_last_n the history is ignored */
    lt_sampler_free(ctx, s);
    o.repeat_last_n = 1;
    s = make(ctx, &o);
    int32_t h2[2] = {10, 30};
    assert_int_equal(lt_sampler_pick(s, z, h2, 2, &rng), 10);
    /* with sampling, a penalised id is drawn less often */
    lt_sampler_free(ctx, s);
    lt_sample_options a = {.temperature = 1.0}, b = {.temperature = 1.0, .repeat_penalty = 2.0};
    lt_sampler *sa = make(ctx, &a), *sb = make(ctx, &b);
    uint64_t ra = 8, rb = 8;
    int na = 0, nb = 0;
    for (int i = 0; i < DRAWS; i++) {
        na += lt_sampler_pick(sa, z, hist, 3, &ra) == 10;
        nb += lt_sampler_pick(sb, z, hist, 3, &rb) == 10;
    }
    assert_true(nb < na / 2);
    lt_sampler_free(ctx, sa);
    lt_sampler_free(ctx, sb);
    lt_ctx_free(ctx);
}

static void test_seed_and_temperature(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    float z[V];
    logits(z, 6);
    lt_sample_options o = {.temperature = 1.0, .top_k = 40, .top_p = 0.9, .min_p = 0.01};
    lt_sampler *s = make(ctx, &o);
    uint64_t r1 = 42, r2 = 42, r3 = 43;
    int same = 1, differ = 0;
    for (int i = 0; i < 200; i++) {
        int a = lt_sampler_pick(s, z, NULL, 0, &r1), b = lt_sampler_pick(s, z, NULL, 0, &r2);
        same &= a == b;
        differ |= a != lt_sampler_pick(s, z, NULL, 0, &r3);
    }
    assert_true(same);
    assert_true(differ);
    lt_sampler_free(ctx, s);
    /* a low temperature concentrates the draws on the argmax */
    int best = 0;
    for (int j = 1; j < V; j++)
        if (z[j] > z[best]) best = j;
    z[best] += 1.0f; /* a clear argmax */
    lt_sample_options cold = {.temperature = 0.05}, hot = {.temperature = 5};
    lt_sampler *sc = make(ctx, &cold), *sh = make(ctx, &hot);
    uint64_t rc = 1, rh = 1;
    int nc = 0, nh = 0;
    for (int i = 0; i < 2000; i++) {
        nc += lt_sampler_pick(sc, z, NULL, 0, &rc) == best;
        nh += lt_sampler_pick(sh, z, NULL, 0, &rh) == best;
    }
    assert_true(nc > 1500 && nh < 200);
    lt_sampler_free(ctx, sc);
    lt_sampler_free(ctx, sh);
    lt_ctx_free(ctx);
}

static void test_bad_options(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    const struct {
        lt_sample_options o;
        const char *field;
    } bad[] = {
        {{.temperature = -1}, "temperature"},
        {{.temperature = NAN}, "temperature"},
        {{.top_k = -1}, "top_k"},
        {{.top_p = 1.5}, "top_p"},
        {{.top_p = -0.1}, "top_p"},
        {{.min_p = 1}, "min_p"},
        {{.repeat_penalty = -1}, "repeat_penalty"},
        {{.repeat_last_n = -2}, "repeat_last_n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lt_sampler *s = NULL;
        assert_int_equal(lt_sampler_new(ctx, V, &bad[i].o, &s), LT_ERR_INVALID_ARG);
        assert_null(s);
        assert_non_null(strstr(lt_ctx_error(ctx), bad[i].field));
    }
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),         cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),          cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_repeat_penalty), cmocka_unit_test(test_seed_and_temperature),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
