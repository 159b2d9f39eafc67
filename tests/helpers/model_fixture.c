/* See model_fixture.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "helpers/model_fixture.h"
#include "helpers/test_util.h"
#include "longtune/alloc.h"

const float *lt_test_fixture_tensor(lt_ctx *ctx, const lt_test_fixture *f, const char *name, int64_t *numel) {
    lt_tensor t;
    if (lt_safetensors_find(ctx, f->exp, name, &t) != LT_OK) {
        fprintf(stderr, "fixture: %s\n", lt_ctx_error(ctx));
        fail();
    }
    assert_int_equal(t.dtype, LT_DTYPE_F32);
    if (numel) *numel = lt_tensor_numel(&t);
    return t.data;
}

static void ints(lt_ctx *ctx, const lt_test_fixture *f, const char *name, int32_t *out, int64_t want) {
    int64_t n;
    const float *x = lt_test_fixture_tensor(ctx, f, name, &n);
    assert_int_equal(n, want);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)x[i];
}

void lt_test_fixture_open(lt_ctx *ctx, const char *dir, lt_test_fixture *f) {
    char p[1200];
    snprintf(p, sizeof p, "%s/expected.safetensors", dir);
    memset(f, 0, sizeof *f);
    if (lt_safetensors_open(ctx, p, &f->exp) != LT_OK) {
        fprintf(stderr, "%s\n", lt_ctx_error(ctx));
        fail();
    }
    f->B = atoll(lt_safetensors_metadata(f->exp, "B"));
    f->T = atoll(lt_safetensors_metadata(f->exp, "T"));
    f->S = atoll(lt_safetensors_metadata(f->exp, "S"));
    f->rank = atoll(lt_safetensors_metadata(f->exp, "rank"));
    f->num_layers = atoll(lt_safetensors_metadata(f->exp, "num_layers"));
    f->alpha = (float)atof(lt_safetensors_metadata(f->exp, "alpha"));
    ints(ctx, f, "tokens", f->tokens, f->B * f->T);
    ints(ctx, f, "targets", f->targets, f->B * f->T);
    ints(ctx, f, "positions", f->positions, f->B * f->T);
    ints(ctx, f, "seq_offsets", f->offsets, f->B * (f->S + 1));
}

lt_model *lt_test_fixture_model(lt_ctx *ctx, const char *path, const char *what, const lt_test_fixture *f,
                                int quantize) {
    lt_lora_options lo = {0};
    lo.rank = f->rank;
    lo.alpha = f->alpha;
    lo.num_layers = f->num_layers;
    lo.seed = 7;
    lt_model_options mo = {0};
    mo.quantize_dtype = quantize ? LT_DTYPE_INT4_G64 : LT_DTYPE_F32;
    lt_model *m = NULL;
    if (lt_model_load(ctx, path, &mo, &lo, &m) != LT_OK) {
        fprintf(stderr, "%s: %s\n", what, lt_ctx_error(ctx));
        fail();
    }
    /* The adapter values PEFT used. */
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        int64_t n;
        const float *v = lt_test_fixture_tensor(ctx, f, t.name, &n);
        assert_int_equal(n, lt_tensor_numel(&t.value));
        memcpy(t.value.data, v, (size_t)n * 4);
    }
    return m;
}

lt_model_batch lt_test_fixture_batch(const lt_test_fixture *f) {
    lt_model_batch b = {0};
    b.B = f->B, b.T = f->T, b.S = f->S;
    b.tokens = f->tokens, b.targets = f->targets, b.positions = f->positions, b.seq_offsets = f->offsets;
    return b;
}

void lt_test_compare(const char *what, const float *got, const float *want, int64_t n, double rel) {
    double scale = 0, worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, wi = i;
    }
    if (!(worst <= rel * scale + 1e-7)) {
        fprintf(stderr, "%s: max error %.3g at %lld (got %.8g want %.8g), scale %.3g\n", what, worst, (long long)wi,
                (double)got[wi], (double)want[wi], scale);
        fail();
    }
}

lt_model *lt_test_fixture_model_in(lt_ctx *ctx, const char *dir, const char *file, const char *what,
                                   const lt_test_fixture *f, int quantize) {
    char path[1200];
    if (file && file[0] == '/') snprintf(path, sizeof path, "%s", file);
    else if (file) snprintf(path, sizeof path, "%s/%s", dir, file);
    else snprintf(path, sizeof path, "%s", dir);
    return lt_test_fixture_model(ctx, path, what, f, quantize);
}

void lt_test_fixture_check_logits(lt_ctx *ctx, lt_model *m, const lt_test_fixture *f, const char *what, double rel) {
    const int64_t N = f->B * f->T, V = lt_model_get_config(m)->V;
    lt_model_batch b = lt_test_fixture_batch(f);
    float *logits = malloc((size_t)(N * V) * 4);
    for (int64_t i = 0; i < N * V; i++) logits[i] = LT_TEST_POISON;
    assert_int_equal(lt_model_logits(ctx, m, &b, logits), LT_OK);
    lt_test_compare(what, logits, lt_test_fixture_tensor(ctx, f, "logits", NULL), N * V, rel);
    free(logits);
}

void lt_test_fixture_check_step(lt_ctx *ctx, lt_model *m, const lt_test_fixture *f, const char *c, double rel) {
    const int64_t N = f->B * f->T;
    lt_model_batch b = lt_test_fixture_batch(f);
    float tl[64];
    char what[1400];
    snprintf(what, sizeof what, "%s logits", c);
    lt_test_fixture_check_logits(ctx, m, f, what, rel);
    lt_model_zero_grads(m);
    lt_model_result r;
    if (lt_model_forward_backward(ctx, m, &b, 0.0f, &r, tl) != LT_OK) {
        fprintf(stderr, "%s: %s\n", c, lt_ctx_error(ctx));
        fail();
    }
    float loss = (float)(r.loss_sum / (double)r.n_tokens);
    snprintf(what, sizeof what, "%s loss", c);
    lt_test_compare(what, &loss, lt_test_fixture_tensor(ctx, f, "loss", NULL), 1, rel);
    snprintf(what, sizeof what, "%s token_loss", c);
    lt_test_compare(what, tl, lt_test_fixture_tensor(ctx, f, "token_loss", NULL), N, rel);
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        char key[200];
        snprintf(key, sizeof key, "%s.grad", t.name);
        snprintf(what, sizeof what, "%s %s", c, key);
        lt_test_compare(what, t.grad.data, lt_test_fixture_tensor(ctx, f, key, NULL), lt_tensor_numel(&t.grad), rel);
    }
}

void lt_test_fixture_check_oracle(const char *dir, const char *file, const char *c, double rel, double same_rel) {
    lt_ctx *ctx = lt_ctx_new();
    lt_test_fixture f;
    lt_test_fixture_open(ctx, dir, &f);
    lt_model *m = lt_test_fixture_model_in(ctx, dir, file, c, &f, 0);
    /* The last two rerun the attention forward in the recompute instead of keeping it. */
    const lt_recompute pol[5] = {LT_RECOMPUTE_NONE, LT_RECOMPUTE_EVERY, LT_RECOMPUTE_EVERY_K, LT_RECOMPUTE_EVERY,
                                 LT_RECOMPUTE_EVERY_K};
    float *first = NULL;
    int64_t ng = 0;
    for (int pi = 0; pi < 5; pi++) {
        lt_model_run_options ro = {0};
        ro.B = f.B, ro.T = f.T, ro.recompute = pol[pi], ro.recompute_k = 2, ro.recompute_attention = pi >= 3;
        assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
        lt_test_fixture_check_step(ctx, m, &f, c, rel);
        /* Recompute policies change memory, never numbers. */
        float *g = lt_model_lora_grads(m, &ng);
        if (!first) {
            first = malloc((size_t)ng * 4);
            memcpy(first, g, (size_t)ng * 4);
        } else {
            char what[400];
            snprintf(what, sizeof what, "%s grads under recompute policy %d", c, pi);
            lt_test_compare(what, g, first, ng, same_rel);
        }
    }
    free(first);
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}
