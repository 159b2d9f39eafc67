/* The real default model (SmolLM2-135M-Instruct, Q4_1 GGUF, installed by scripts/setup.sh): it
 * loads quantized (QLoRA), its Q/K un-permutation is right (a real sentence scores < 4 nats per
 * token, greedy completion of a factual prompt is sensible), and a few LoRA AdamW steps through
 * the backend table lower the loss. Skipped with a message when the file is absent.
 * Text is encoded by the GGUF's own tokenizer (lt_tokenizer_load_gguf). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/gguf.h"
#include "longtune/model.h"
#include "longtune/tokenizer.h"

static char model_path[1024];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Canonical BPE ids of `text` from the GGUF's own tokenizer (no special tokens). */
static int64_t encode(lt_ctx *ctx, const lt_tokenizer *tok, const char *text, int32_t *out, int64_t cap) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(lt_tokenizer_encode(ctx, tok, text, strlen(text), 0, &ids, &n), LT_OK);
    assert_true((int64_t)n <= cap);
    memcpy(out, ids, n * sizeof *ids);
    free(ids);
    return (int64_t)n;
}

static int setup(void **state) {
    (void)state;
    const char *c = getenv("LONGTUNE_CACHE");
    const char *h = getenv("HOME");
    if (c) snprintf(model_path, sizeof model_path, "%s/smollm2-135m-instruct-q4_1.gguf", c);
    else snprintf(model_path, sizeof model_path, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", h ? h : "");
    return 0;
}

static void real_model_scores_text_and_learns(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_gguf *g = NULL;
    assert_int_equal(lt_gguf_open(ctx, model_path, &g), LT_OK);
    int32_t toks[64], prompt[16];
    lt_tokenizer *tok = NULL;
    assert_int_equal(lt_tokenizer_load_gguf(ctx, g, &tok), LT_OK);
    int64_t n = encode(ctx, tok,
                       "The capital of France is Paris. It is a large city with many museums, and "
                       "the Eiffel Tower is the most famous building in the city.",
                       toks, 64);
    int64_t np = encode(ctx, tok, "The capital of France is", prompt, 16);
    int32_t paris[4];
    assert_int_equal(encode(ctx, tok, " Paris", paris, 4), 1);

    lt_lora_options lo = {0};
    lo.rank = 8;
    lo.num_layers = 4;
    lo.seed = 1;
    lt_model *m = NULL;
    double t0 = now();
    if (lt_model_load(ctx, model_path, NULL, &lo, &m) != LT_OK) {
        fprintf(stderr, "%s\n", lt_ctx_error(ctx));
        fail();
    }
    const lt_model_config *c = lt_model_get_config(m);
    assert_int_equal(c->L, 30);
    assert_int_equal(c->C, 576);
    assert_int_equal(c->Hkv, 3);
    assert_true(c->tie_embeddings);
    assert_int_equal(c->proj_dtype[LT_PROJ_Q], LT_DTYPE_Q4_1); /* QLoRA: stays quantized */
    assert_int_equal(c->embed_dtype, LT_DTYPE_Q8_0);
    fprintf(stderr, "model: %s, %lld tokens in the sentence, weights %.1f MB, loaded in %.2f s\n", model_path,
            (long long)n, (double)lt_model_get_sizes(m).bytes[LT_MEM_WEIGHTS] / 1e6, now() - t0);

    /* Greedy next token of the prompt. */
    lt_model_run_options ro = {0};
    ro.B = 1, ro.T = 64, ro.recompute = LT_RECOMPUTE_EVERY;
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    float *logits = malloc((size_t)c->V * 4);
    lt_model_batch pb = {0};
    pb.B = 1, pb.T = np, pb.tokens = prompt;
    assert_int_equal(lt_model_logits_last(ctx, m, &pb, logits), LT_OK);
    int64_t best = 0;
    for (int64_t v = 1; v < c->V; v++)
        if (logits[v] > logits[best]) best = v;
    char *txt = NULL;
    size_t tl = 0;
    int32_t best32 = (int32_t)best;
    assert_int_equal(lt_tokenizer_decode(ctx, tok, &best32, 1, 0, &txt, &tl), LT_OK);
    fprintf(stderr, "greedy next token after \"The capital of France is\": '%s' (id %lld, want %d)\n", txt,
            (long long)best, (int)paris[0]);
    free(txt);
    assert_int_equal(best, paris[0]);
    free(logits);

    /* Loss of a real sentence, then three AdamW steps on it. */
    int32_t tg[64];
    for (int64_t i = 0; i < n; i++) tg[i] = i + 1 < n ? toks[i + 1] : LT_IGNORE_INDEX;
    lt_model_batch b = {0};
    b.B = 1, b.T = n, b.tokens = toks, b.targets = tg;
    lt_model_result r;
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
    double loss0 = r.loss_sum / (double)r.n_tokens;
    fprintf(stderr, "loss on a real sentence: %.4f nats/token over %lld targets\n", loss0, (long long)r.n_tokens);
    assert_true(loss0 < 4.0);
    int64_t np_ = 0;
    float *p = lt_model_lora_params(m, &np_), *gr = lt_model_lora_grads(m, NULL);
    float *mom = calloc((size_t)np_, 4), *var = calloc((size_t)np_, 4);
    lt_adamw_params hp = {2e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0};
    t0 = now();
    for (int step = 1; step <= 2; step++) {
        lt_model_zero_grads(m);
        b.step = (uint64_t)step;
        assert_int_equal(lt_model_forward_backward(ctx, m, &b, 0, &r, NULL), LT_OK);
        hp.step = step;
        lt_backend_get(LT_DEVICE_CPU)->adamw(ctx, p, gr, mom, var, np_, &hp);
    }
    assert_int_equal(lt_model_forward(ctx, m, &b, &r, NULL), LT_OK);
    double loss1 = r.loss_sum / (double)r.n_tokens;
    fprintf(stderr, "after 2 LoRA AdamW steps (%.2f s): %.4f nats/token\n", now() - t0, loss1);
    assert_true(loss1 < loss0 - 0.05);
    free(mom), free(var);
    lt_model_free(ctx, m);
    lt_tokenizer_free(tok);
    lt_gguf_close(g);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

int main(int argc, char **argv) {
    (void)argc;
    lt_test_omp_passive(argv);
    setup(NULL);
    if (access(model_path, R_OK) != 0) {
        printf("skipped: %s is absent (run scripts/setup.sh)\n", model_path);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(real_model_scores_text_and_learns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
