/* lt_eval_windows against llama-perplexity's scoring written out by hand: on a tiny fixture model
 * (and Gemma 2's, with its final-logit softcap) with random LoRA weights, a random token stream is
 * cut into windows; each window (its first token made BOS) goes through lt_model_logits, and the
 * float64 log-softmax NLL of the second half's targets (positions window/2 + 1 .. window - 1),
 * summed over the whole windows only, must equal the result's loss_sum, n_tokens and perplexity.
 * A different BOS, window or window count moves the figure (the comparison sees them). Bad
 * requests (window below 4, fewer than two windows of tokens, ids outside the vocabulary) are
 * typed errors. */
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
#include "helpers/test_util.h"
#include "longtune/model.h"
#include "longtune/train.h"

static lt_model *load(lt_ctx *ctx, const char *rel, uint64_t seed) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/%s", lt_test_source_dir(), rel);
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_lora_options lo;
    memset(&lo, 0, sizeof lo);
    lo.rank = 4;
    lt_model *m = NULL;
    if (lt_model_load(ctx, dir, &mo, &lo, &m) != LT_OK) {
        fprintf(stderr, "load %s: %s\n", rel, lt_ctx_error(ctx));
        fail();
    }
    int64_t n;
    lt_model_lora_params(m, &n);
    float *p = malloc((size_t)n * sizeof(float));
    uint64_t r = seed;
    for (int64_t i = 0; i < n; i++) p[i] = (float)((double)(lt_splitmix64(&r) >> 11) * 0x1.0p-53 - 0.5) * 0.2f;
    assert_int_equal(lt_model_lora_set(ctx, m, 0, n, p), LT_OK);
    free(p);
    return m;
}

/* The reference: Σ NLL and the count of llama-perplexity's scored tokens, by full logits. */
static double reference(lt_ctx *ctx, lt_model *m, const int32_t *tok, int64_t n, int64_t W, int32_t bos,
                        int64_t *count) {
    const lt_model_config *cf = lt_model_get_config(m);
    int64_t V = cf->V, nw = n / W;
    int32_t *ids = malloc((size_t)W * sizeof(int32_t));
    float *z = malloc((size_t)(W * V) * sizeof(float));
    lt_model_run_options run;
    memset(&run, 0, sizeof run);
    run.B = 1, run.T = W, run.forward_only = 1;
    assert_int_equal(lt_model_prepare(ctx, m, &run), LT_OK);
    double nll = 0;
    *count = 0;
    for (int64_t w = 0; w < nw; w++) {
        memcpy(ids, tok + w * W, (size_t)W * sizeof(int32_t));
        if (bos >= 0) ids[0] = bos;
        lt_model_batch b;
        memset(&b, 0, sizeof b);
        b.B = 1, b.T = W, b.tokens = ids;
        assert_int_equal(lt_model_logits(ctx, m, &b, z), LT_OK);
        for (int64_t p = W / 2; p + 1 < W; p++) {
            const float *row = z + p * V;
            double mx = row[0], se = 0;
            for (int64_t j = 1; j < V; j++) mx = fmax(mx, row[j]);
            for (int64_t j = 0; j < V; j++) se += exp((double)row[j] - mx);
            nll += mx + log(se) - row[tok[w * W + p + 1]];
            (*count)++;
        }
    }
    free(ids);
    free(z);
    return nll;
}

static void check_model(const char *rel, uint64_t seed) {
    lt_ctx *ctx = lt_ctx_new();
    lt_model *m = load(ctx, rel, seed);
    int64_t V = lt_model_get_config(m)->V, W = 16, n = 3 * W + 7; /* a tail of 7 left out */
    int32_t tok[64];
    uint64_t r = seed * 3 + 1;
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)(lt_splitmix64(&r) % (uint64_t)V);
    int32_t bos = 2;
    lt_eval_result res;
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, W, bos, 0, 0, &res), LT_OK);
    int64_t cnt;
    double want = reference(ctx, m, tok, n, W, bos, &cnt);
    fprintf(stderr, "%s: loss_sum %.9g (reference %.9g), %lld tokens, ppl %.6g\n", rel, res.loss_sum, want,
            (long long)res.n_tokens, res.ppl);
    assert_int_equal(res.n_tokens, cnt);
    assert_int_equal(cnt, 3 * (W - 1 - W / 2));
    assert_int_equal(res.n_seqs, 3);
    assert_true(fabs(res.loss_sum - want) <= 1e-4 * fabs(want));
    assert_true(fabs(res.ppl - exp(want / (double)cnt)) <= 1e-4 * res.ppl);
    /* what the figure depends on: no BOS, another window, fewer windows */
    lt_eval_result o;
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, W, -1, 0, 0, &o), LT_OK);
    want = reference(ctx, m, tok, n, W, -1, &cnt);
    assert_true(fabs(o.loss_sum - want) <= 1e-4 * fabs(want));
    assert_true(fabs(o.loss_sum - res.loss_sum) > 1e-6 * fabs(want));
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, 12, bos, 0, 0, &o), LT_OK);
    want = reference(ctx, m, tok, n, 12, bos, &cnt);
    assert_int_equal(o.n_tokens, cnt);
    assert_int_equal(o.n_seqs, 4);
    assert_true(fabs(o.loss_sum - want) <= 1e-4 * fabs(want));
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, W, bos, 2, 0, &o), LT_OK);
    assert_int_equal(o.n_seqs, 2);
    assert_int_equal(o.n_tokens, 2 * (W - 1 - W / 2));
    /* bad requests */
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, 3, bos, 0, 0, &o), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_eval_windows(ctx, m, tok, 2 * W - 1, W, bos, 0, 0, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "at least 32"));
    int32_t keep = tok[5];
    tok[5] = (int32_t)V;
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, W, bos, 0, 0, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "token"));
    tok[5] = keep;
    assert_int_equal(lt_eval_windows(ctx, m, tok, n, W, (int32_t)V, 0, 0, &o), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "BOS"));
    lt_model_free(ctx, m);
    lt_ctx_free(ctx);
}

static void test_llama(void **st) {
    (void)st;
    check_model("model/llama_tied", 5);
}

static void test_gemma2(void **st) {
    (void)st;
    check_model("gemma/gemma2", 9);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama),
        cmocka_unit_test(test_gemma2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
