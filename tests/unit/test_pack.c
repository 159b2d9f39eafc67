/* Sequence packing: a fuzz-style property test over random lengths, masks, row lengths, batch
 * sizes and every algorithm/overflow policy (every supervised token is a target exactly once, no
 * segment crosses a sequence, positions restart, padding is inert), determinism per (seed, epoch),
 * a hand-checked small case, and argument errors. Token ids encode their own index in the input
 * so any misplaced or duplicated token is detected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/pack.h"

#define PAD_ID (-7)

typedef struct corpus {
    int32_t *tokens;
    uint8_t *mask;
    int64_t *offsets;
    int64_t n_seqs, N;
} corpus;

static corpus make_corpus(uint64_t *rng, int64_t n_seqs, int64_t max_len, double p_sup) {
    corpus c;
    c.n_seqs = n_seqs;
    c.offsets = malloc((size_t)(n_seqs + 1) * sizeof *c.offsets);
    c.offsets[0] = 0;
    for (int64_t i = 0; i < n_seqs; i++) {
        int64_t len = (int64_t)lt_test_uniform(rng, 0, (double)max_len + 1);
        if (lt_test_uniform(rng, 0, 1) < 0.1) len = 0;
        c.offsets[i + 1] = c.offsets[i] + len;
    }
    c.N = c.offsets[n_seqs];
    c.tokens = malloc((size_t)(c.N + 1) * sizeof *c.tokens);
    c.mask = malloc((size_t)(c.N + 1));
    for (int64_t j = 0; j < c.N; j++) {
        c.tokens[j] = (int32_t)j; /* the id is the index: lets the checks locate every token */
        c.mask[j] = lt_test_uniform(rng, 0, 1) < p_sup;
    }
    return c;
}

static void free_corpus(corpus *c) {
    free(c->tokens);
    free(c->mask);
    free(c->offsets);
}

static int64_t seq_of(const corpus *c, int64_t j) { /* binary search: sequence holding token j */
    int64_t lo = 0, hi = c->n_seqs - 1;
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (c->offsets[mid] <= j) lo = mid;
        else hi = mid - 1;
    }
    while (lo < c->n_seqs && c->offsets[lo + 1] <= j) lo++; /* skip empty sequences */
    return lo;
}

/* Builds, fills every batch, checks every invariant; returns a checksum of all batch contents. */
static uint64_t check_plan(lt_ctx *ctx, const corpus *c, const lt_pack_options *opt, int use_mask) {
    lt_pack_input in = {c->tokens, use_mask ? c->mask : NULL, c->offsets, c->n_seqs};
    lt_pack_plan *plan = NULL;
    assert_int_equal(lt_pack_plan_build(ctx, &in, opt, &plan), LT_OK);
    lt_pack_stats st = lt_pack_plan_stats(plan);
    const int64_t L = opt->row_len;
    int64_t *seen = calloc((size_t)c->N + 1, sizeof *seen);
    int64_t B0, T0, S0;
    lt_pack_batch_shape(plan, 0, &B0, &T0, &S0);
    size_t cap = (size_t)(B0 * L);
    int32_t *ids = malloc(cap * 4), *tg = malloc(cap * 4), *pos = malloc(cap * 4);
    int32_t *so = malloc((size_t)(B0 * (S0 + 1)) * 4), *np = malloc((size_t)B0 * 4);
    int64_t real = 0, capacity = 0, targets = 0, pieces = 0;
    uint64_t sum = 1469598103934665603ull;
    for (int64_t b = 0; b < lt_pack_plan_batches(plan); b++) {
        int64_t B, T, S;
        lt_pack_batch_shape(plan, b, &B, &T, &S);
        assert_int_equal(B, B0);
        assert_int_equal(S, S0);
        assert_true(T <= L && T >= 1);
        if (opt->algorithm != LT_PACK_NONE) assert_int_equal(T, L);
        for (size_t k = 0; k < cap; k++) ids[k] = tg[k] = pos[k] = (int32_t)0x5A5A5A5A; /* poison */
        lt_pack_batch out = {ids, tg, pos, so, np};
        assert_int_equal(lt_pack_fill(ctx, plan, &in, b, &out), LT_OK);
        capacity += B * T;
        for (int64_t r = 0; r < B; r++) {
            const int32_t *o = so + r * (S + 1);
            assert_int_equal(o[0], 0);
            assert_int_equal(o[S], T);
            int64_t nseg_real = 0;
            for (int64_t k = 0; k < S; k++) {
                assert_true(o[k] <= o[k + 1]);
                if (o[k] == o[k + 1]) continue;
                const int32_t *id = ids + r * T, *t = tg + r * T, *p = pos + r * T;
                int64_t a = o[k], e = o[k + 1];
                for (int64_t j = a; j < e; j++) assert_int_equal(p[j], j - a);
                if (id[a] == PAD_ID) { /* the padding tail: last segment, inert */
                    assert_int_equal(e, T);
                    for (int64_t j = a; j < e; j++) {
                        assert_int_equal(id[j], PAD_ID);
                        assert_int_equal(t[j], LT_PACK_IGNORE);
                    }
                    continue;
                }
                /* A real segment: consecutive tokens of ONE sequence. */
                nseg_real++;
                int64_t s = seq_of(c, id[a]);
                assert_true(id[a] >= c->offsets[s] && id[e - 1] < c->offsets[s + 1]);
                assert_true(e - a <= L);
                for (int64_t j = a; j < e; j++) {
                    assert_int_equal(id[j], id[a] + (j - a));
                    int64_t want = LT_PACK_IGNORE;
                    if (j + 1 < e && (!use_mask || c->mask[id[j] + 1])) want = id[j] + 1;
                    assert_int_equal(t[j], want);
                    if (t[j] != LT_PACK_IGNORE) {
                        seen[t[j]]++;
                        targets++;
                    }
                }
                real += e - a;
            }
            assert_int_equal(np[r], nseg_real);
            pieces += nseg_real;
        }
        for (size_t k = 0; k < (size_t)(B * T); k++)
            sum = (sum ^ (uint32_t)ids[k] ^ ((uint64_t)(uint32_t)tg[k] << 32)) * 1099511628211ull;
    }
    /* Every supervised token (not first of its sequence, inside what is kept) exactly once. */
    int64_t truncated = 0, split = 0, dropped = 0;
    for (int64_t s = 0; s < c->n_seqs; s++) {
        int64_t len = c->offsets[s + 1] - c->offsets[s];
        int64_t keep = len;
        if (len > L) {
            if (opt->overflow == LT_PACK_TRUNCATE) {
                keep = L;
                truncated++;
                dropped += len - L;
            } else {
                split++;
            }
        }
        for (int64_t i = 0; i < len; i++) {
            int64_t j = c->offsets[s] + i;
            int64_t want = (i >= 1 && i < keep && (!use_mask || c->mask[j])) ? 1 : 0;
            if (seen[j] != want)
                fail_msg("token %lld (seq %lld, index %lld): target %lld times, want %lld", (long long)j, (long long)s,
                         (long long)i, (long long)seen[j], (long long)want);
        }
    }
    assert_int_equal(st.truncated, truncated);
    assert_int_equal(st.split, split);
    assert_int_equal(st.dropped_tokens, dropped);
    assert_int_equal(st.real_tokens, real);
    assert_int_equal(st.capacity_tokens, capacity);
    assert_int_equal(st.padding_tokens, capacity - real);
    assert_int_equal(st.targets, targets);
    assert_int_equal(st.pieces, pieces);
    assert_true(st.rows * L >= real);
    assert_int_equal(st.rows + st.empty_rows, st.batches * B0);
    free(seen);
    free(ids);
    free(tg);
    free(pos);
    free(so);
    free(np);
    lt_pack_plan_free(ctx, plan);
    return sum;
}

static void property_random_lengths(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    for (int trial = 0; trial < 120; trial++) {
        int64_t L = 2 + (int64_t)lt_test_uniform(&rng, 0, 60);
        int64_t n = (int64_t)lt_test_uniform(&rng, 0, 300);
        corpus c =
            make_corpus(&rng, n, (int64_t)((double)L * lt_test_uniform(&rng, 0.2, 2.5)), lt_test_uniform(&rng, 0, 1));
        lt_pack_options opt = {0};
        opt.row_len = L;
        opt.batch_size = 1 + (int64_t)lt_test_uniform(&rng, 0, 5);
        opt.algorithm = (lt_pack_algorithm)(trial % 3);
        opt.overflow = (lt_pack_overflow)((trial / 3) % 2);
        opt.seed = lt_test_rand_u64(&rng);
        opt.epoch = (uint64_t)trial;
        opt.pad_id = PAD_ID;
        opt.pad_multiple = 1 + (int64_t)lt_test_uniform(&rng, 0, 16);
        check_plan(ctx, &c, &opt, trial % 5 != 0);
        free_corpus(&c);
    }
    lt_mem_stats ms = lt_mem_get_stats(ctx, LT_DEVICE_CPU);
    assert_int_equal(ms.used_bytes, 0); /* the plan frees everything it allocated */
    lt_ctx_free(ctx);
}

static void deterministic_per_seed_and_epoch(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 17;
    lt_ctx *ctx = lt_ctx_new();
    corpus c = make_corpus(&rng, 500, 40, 0.7);
    for (int a = 0; a < 3; a++) {
        lt_pack_options opt = {0};
        opt.row_len = 64;
        opt.batch_size = 3;
        opt.algorithm = (lt_pack_algorithm)a;
        opt.pad_id = PAD_ID;
        opt.seed = 1234;
        opt.epoch = 2;
        uint64_t h1 = check_plan(ctx, &c, &opt, 1);
        uint64_t h2 = check_plan(ctx, &c, &opt, 1);
        assert_true(h1 == h2);
        opt.epoch = 3;
        uint64_t h3 = check_plan(ctx, &c, &opt, 1);
        assert_true(h3 != h1); /* another epoch, another order (500 sequences: no collision) */
        opt.epoch = 2;
        opt.seed = 1235;
        assert_true(check_plan(ctx, &c, &opt, 1) != h1);
    }
    free_corpus(&c);
    lt_ctx_free(ctx);
}

static void bfd_small_case_by_hand(void **state) {
    (void)state;
    /* Lengths 3, 5, 4 in rows of 8: BFD places 5, then 4 (does not fit: new row), then 3 into the
     * 5-row (fits exactly). Rows: {5,3} and {4} + 4 padding. */
    int32_t tok[12];
    for (int i = 0; i < 12; i++) tok[i] = 100 + i;
    uint8_t mask[12] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 1};
    int64_t off[4] = {0, 3, 8, 12};
    lt_pack_input in = {tok, mask, off, 3};
    lt_pack_options opt = {0};
    opt.row_len = 8;
    opt.batch_size = 2;
    opt.algorithm = LT_PACK_BFD;
    opt.pad_id = 0;
    lt_ctx *ctx = lt_ctx_new();
    lt_pack_plan *plan;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_OK);
    lt_pack_stats st = lt_pack_plan_stats(plan);
    assert_int_equal(st.rows, 2);
    assert_int_equal(st.batches, 1);
    assert_int_equal(st.max_segments, 2);
    assert_int_equal(st.real_tokens, 12);
    assert_int_equal(st.padding_tokens, 4);
    assert_int_equal(st.targets, 2 + 3 + 2); /* per sequence, the masked-in tokens after the first */
    int32_t ids[16], tg[16], pos[16], so[6];
    lt_pack_batch out = {ids, tg, pos, so, NULL};
    assert_int_equal(lt_pack_fill(ctx, plan, &in, 0, &out), LT_OK);
    /* Find the full row (5 + 3) regardless of the shuffled row order. */
    int full = ids[0] == 103 ? 0 : 1;
    const int32_t *r = ids + full * 8, *t = tg + full * 8, *p = pos + full * 8, *o = so + full * 3;
    const int32_t want_ids[8] = {103, 104, 105, 106, 107, 100, 101, 102};
    const int32_t want_tg[8] = {LT_PACK_IGNORE, 105, 106, 107, LT_PACK_IGNORE, 101, 102, LT_PACK_IGNORE};
    const int32_t want_pos[8] = {0, 1, 2, 3, 4, 0, 1, 2};
    for (int j = 0; j < 8; j++) {
        assert_int_equal(r[j], want_ids[j]);
        assert_int_equal(t[j], want_tg[j]);
        assert_int_equal(p[j], want_pos[j]);
    }
    assert_int_equal(o[0], 0);
    assert_int_equal(o[1], 5);
    assert_int_equal(o[2], 8);
    const int32_t *r2 = ids + (1 - full) * 8, *t2 = tg + (1 - full) * 8, *o2 = so + (1 - full) * 3;
    const int32_t want2[8] = {108, 109, 110, 111, 0, 0, 0, 0};
    const int32_t want2_tg[8] =
        {109, LT_PACK_IGNORE, 111, LT_PACK_IGNORE, LT_PACK_IGNORE, LT_PACK_IGNORE, LT_PACK_IGNORE, LT_PACK_IGNORE};
    for (int j = 0; j < 8; j++) {
        assert_int_equal(r2[j], want2[j]);
        assert_int_equal(t2[j], want2_tg[j]);
    }
    assert_int_equal(o2[1], 4);
    assert_int_equal(o2[2], 8);
    lt_pack_plan_free(ctx, plan);
    lt_ctx_free(ctx);
}

static void split_keeps_every_target(void **state) {
    (void)state;
    /* One sequence of 10 tokens, L = 4: pieces start at 0, 3, 6 (stride L-1) and overlap by one. */
    int32_t tok[10];
    for (int i = 0; i < 10; i++) tok[i] = i;
    int64_t off[2] = {0, 10};
    lt_pack_input in = {tok, NULL, off, 1};
    lt_pack_options opt = {0};
    opt.row_len = 4;
    opt.overflow = LT_PACK_SPLIT;
    opt.algorithm = LT_PACK_BFD;
    lt_ctx *ctx = lt_ctx_new();
    lt_pack_plan *plan;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_OK);
    lt_pack_stats st = lt_pack_plan_stats(plan);
    assert_int_equal(st.split, 1);
    assert_int_equal(st.pieces, 3);
    assert_int_equal(st.targets, 9);
    assert_int_equal(st.dropped_tokens, 0);
    lt_pack_plan_free(ctx, plan);
    opt.overflow = LT_PACK_TRUNCATE;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_OK);
    st = lt_pack_plan_stats(plan);
    assert_int_equal(st.truncated, 1);
    assert_int_equal(st.dropped_tokens, 6);
    assert_int_equal(st.targets, 3);
    lt_pack_plan_free(ctx, plan);
    lt_ctx_free(ctx);
}

/* First fit's worst case for its row bound: every piece just over half a row, so every piece
 * opens a row (the tree is sized from that bound). */
static void first_fit_half_rows(void **state) {
    (void)state;
    const int64_t n = 3000, L = 64;
    int64_t *off = malloc((size_t)(n + 1) * sizeof *off);
    int32_t *tok = calloc((size_t)(n * (L / 2 + 1)), sizeof *tok);
    off[0] = 0;
    for (int64_t i = 0; i < n; i++) off[i + 1] = off[i] + L / 2 + 1 - (i % 7 == 0 ? 20 : 0);
    lt_pack_input in = {tok, NULL, off, n};
    lt_pack_options opt = {0};
    opt.row_len = L;
    lt_ctx *ctx = lt_ctx_new();
    lt_pack_plan *plan;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_OK);
    lt_pack_stats st = lt_pack_plan_stats(plan);
    const int64_t n_long = n - (n + 6) / 7; /* pieces of L/2+1: each needs a row of its own */
    assert_true(st.rows >= n_long && st.rows <= n);
    assert_int_equal(st.real_tokens, off[n]);
    lt_pack_plan_free(ctx, plan);
    lt_ctx_free(ctx);
    free(off);
    free(tok);
}

static void unpacked_pads_to_rounded_longest(void **state) {
    (void)state;
    int32_t tok[40] = {0};
    int64_t off[4] = {0, 5, 15, 40}; /* lengths 5, 10, 25 */
    lt_pack_input in = {tok, NULL, off, 3};
    lt_pack_options opt = {0};
    opt.row_len = 64;
    opt.batch_size = 2;
    opt.algorithm = LT_PACK_NONE;
    opt.pad_multiple = 8;
    lt_ctx *ctx = lt_ctx_new();
    lt_pack_plan *plan;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_OK);
    /* Sorted by length: batch {5, 10} -> T = 16; batch {25, empty} -> T = 32. */
    int64_t widths[2], B, T, S;
    for (int b = 0; b < 2; b++) {
        lt_pack_batch_shape(plan, b, &B, &T, &S);
        widths[b] = T;
    }
    assert_true((widths[0] == 16 && widths[1] == 32) || (widths[0] == 32 && widths[1] == 16));
    lt_pack_stats st = lt_pack_plan_stats(plan);
    assert_int_equal(st.capacity_tokens, 2 * 16 + 2 * 32);
    assert_int_equal(st.empty_rows, 1);
    lt_pack_plan_free(ctx, plan);
    lt_ctx_free(ctx);
}

static void bad_arguments_are_typed_errors(void **state) {
    (void)state;
    int32_t tok[4] = {1, 2, 3, 4};
    int64_t off[3] = {0, 3, 2};
    lt_pack_input in = {tok, NULL, off, 2};
    lt_pack_options opt = {0};
    opt.row_len = 8;
    lt_ctx *ctx = lt_ctx_new();
    lt_pack_plan *plan = NULL;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "index 2"));
    assert_null(plan);
    off[2] = 4;
    opt.row_len = 1;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_ERR_INVALID_ARG);
    opt.row_len = 8;
    assert_int_equal(lt_pack_plan_build(ctx, &in, &opt, &plan), LT_OK);
    int32_t a[8], b[8], c[8], d[3];
    lt_pack_batch out = {a, b, c, d, NULL};
    assert_int_equal(lt_pack_fill(ctx, plan, &in, 1, &out), LT_ERR_INVALID_ARG);
    lt_pack_input other = in;
    other.n_seqs = 1;
    assert_int_equal(lt_pack_fill(ctx, plan, &other, 0, &out), LT_ERR_INVALID_ARG);
    lt_pack_plan_free(ctx, plan);
    lt_pack_algorithm alg;
    assert_int_equal(lt_pack_algorithm_parse(ctx, "bfd", &alg), LT_OK);
    assert_int_equal(alg, LT_PACK_BFD);
    assert_int_equal(lt_pack_algorithm_parse(ctx, "best", &alg), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

static void allocation_failures_are_clean(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 5;
    corpus c = make_corpus(&rng, 200, 30, 0.5);
    lt_pack_input in = {c.tokens, c.mask, c.offsets, c.n_seqs};
    for (int a = 0; a < 3; a++) {
        for (uint64_t nth = 1; nth < 20; nth++) {
            lt_ctx *ctx = lt_ctx_new();
            lt_pack_options opt = {0};
            opt.row_len = 32;
            opt.batch_size = 2;
            opt.algorithm = (lt_pack_algorithm)a;
            lt_mem_fail_nth(ctx, nth);
            lt_pack_plan *plan = NULL;
            lt_status s = lt_pack_plan_build(ctx, &in, &opt, &plan);
            if (s == LT_OK) lt_pack_plan_free(ctx, plan);
            else assert_int_equal(s, LT_ERR_OOM);
            assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
            lt_ctx_free(ctx);
        }
    }
    free_corpus(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(property_random_lengths),
        cmocka_unit_test(deterministic_per_seed_and_epoch),
        cmocka_unit_test(bfd_small_case_by_hand),
        cmocka_unit_test(split_keeps_every_target),
        cmocka_unit_test(first_fit_half_rows),
        cmocka_unit_test(unpacked_pads_to_rounded_longest),
        cmocka_unit_test(bad_arguments_are_typed_errors),
        cmocka_unit_test(allocation_failures_are_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
