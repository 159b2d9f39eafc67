/* Mistral and Phi-3 against transformers + PEFT fixtures (tests/oracle/gen_family_fixtures.py):
 * logits, loss, per-token loss and every LoRA gradient of a packed batch for Mistral v0.1 (sliding
 * window 4), v0.3 (no window), Nemo-style (head_dim with H·D != C), Phi-3-mini (fused qkv_proj and
 * gate_up_proj split at load) and Phi-3 with longrope (long factors and attention factor) and a
 * window, from the transformers folders and, for mistral_v01 and phi3_longrope, from GGUF files
 * written as llama.cpp writes them. The configs read into the described layers, RoPE scaling and
 * EOS lists. On a CUDA device, the same families at a CUDA head dim match the CPU (skipped without
 * one). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"

/* fp32 end to end against fp32 PyTorch: differences are summation order only, relative to the
 * largest magnitude of the tensor compared. */
#define ORACLE_REL 1e-4

static const char *const CASES[] = {"mistral_v01", "mistral_v03", "mistral_nemo", "phi3_mini", "phi3_longrope"};

typedef struct fixture {
    lt_safetensors *exp;
    int64_t B, T, S, rank;
    float alpha;
    int32_t tokens[64], targets[64], positions[64], offsets[16];
} fixture;

static void case_dir(const char *c, char *buf, size_t n) {
    snprintf(buf, n, "%s/tests/fixtures/family/%s", lt_test_source_dir(), c);
}

static const float *ftensor(lt_ctx *ctx, const fixture *f, const char *name, int64_t *numel) {
    lt_tensor t;
    if (lt_safetensors_find(ctx, f->exp, name, &t) != LT_OK) fail_msg("fixture: %s", lt_ctx_error(ctx));
    assert_int_equal(t.dtype, LT_DTYPE_F32);
    if (numel) *numel = lt_tensor_numel(&t);
    return t.data;
}

static void ints(lt_ctx *ctx, const fixture *f, const char *name, int32_t *out, int64_t want) {
    int64_t n;
    const float *x = ftensor(ctx, f, name, &n);
    assert_int_equal(n, want);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)x[i];
}

static void open_fixture(lt_ctx *ctx, const char *c, fixture *f) {
    char dir[1024], p[1200];
    case_dir(c, dir, sizeof dir);
    snprintf(p, sizeof p, "%s/expected.safetensors", dir);
    memset(f, 0, sizeof *f);
    if (lt_safetensors_open(ctx, p, &f->exp) != LT_OK) fail_msg("%s", lt_ctx_error(ctx));
    f->B = atoll(lt_safetensors_metadata(f->exp, "B"));
    f->T = atoll(lt_safetensors_metadata(f->exp, "T"));
    f->S = atoll(lt_safetensors_metadata(f->exp, "S"));
    f->rank = atoll(lt_safetensors_metadata(f->exp, "rank"));
    f->alpha = (float)atof(lt_safetensors_metadata(f->exp, "alpha"));
    ints(ctx, f, "tokens", f->tokens, f->B * f->T);
    ints(ctx, f, "targets", f->targets, f->B * f->T);
    ints(ctx, f, "positions", f->positions, f->B * f->T);
    ints(ctx, f, "seq_offsets", f->offsets, f->B * (f->S + 1));
}

static void compare(const char *what, const float *got, const float *want, int64_t n, double rel) {
    double scale = 0, worst = 0;
    int64_t wi = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) worst = e, wi = i;
    }
    if (!(worst <= rel * scale + 1e-7))
        fail_msg("%s: max error %.3g at %lld (got %.8g want %.8g), scale %.3g", what, worst, (long long)wi,
                 (double)got[wi], (double)want[wi], scale);
}

static void check_case(const char *c, const char *file) {
    lt_ctx *ctx = lt_ctx_new();
    fixture f;
    open_fixture(ctx, c, &f);
    char path[1200];
    case_dir(c, path, sizeof path);
    if (file) strcat(strcat(path, "/"), file);
    lt_lora_options lo = {0};
    lo.rank = f.rank, lo.alpha = f.alpha, lo.seed = 3;
    lt_model *m = NULL;
    if (lt_model_load(ctx, path, NULL, &lo, &m) != LT_OK) fail_msg("%s: %s", path, lt_ctx_error(ctx));
    for (int64_t i = 0; i < lt_model_lora_count(m); i++) { /* the adapter values PEFT used */
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        int64_t n;
        const float *v = ftensor(ctx, &f, t.name, &n);
        assert_int_equal(n, lt_tensor_numel(&t.value));
        memcpy(t.value.data, v, (size_t)n * 4);
    }
    assert_int_equal(lt_model_lora_count(m), atoll(lt_safetensors_metadata(f.exp, "n_lora")));
    int64_t N = f.B * f.T, V = lt_model_get_config(m)->V;
    lt_model_batch b = {0};
    b.B = f.B, b.T = f.T, b.S = f.S;
    b.tokens = f.tokens, b.targets = f.targets, b.positions = f.positions, b.seq_offsets = f.offsets;
    for (int pol = 0; pol < 2; pol++) {
        lt_model_run_options ro = {0};
        ro.B = f.B, ro.T = f.T, ro.recompute = pol ? LT_RECOMPUTE_EVERY : LT_RECOMPUTE_NONE;
        if (lt_model_prepare(ctx, m, &ro) != LT_OK) fail_msg("%s: prepare: %s", path, lt_ctx_error(ctx));
        float *logits = malloc((size_t)(N * V) * 4), tl[64];
        for (int64_t i = 0; i < N * V; i++) logits[i] = LT_TEST_POISON;
        assert_int_equal(lt_model_logits(ctx, m, &b, logits), LT_OK);
        char what[1400];
        snprintf(what, sizeof what, "%s logits", path);
        compare(what, logits, ftensor(ctx, &f, "logits", NULL), N * V, ORACLE_REL);
        free(logits);
        lt_model_zero_grads(m);
        lt_model_result r;
        if (lt_model_forward_backward(ctx, m, &b, 0.0f, &r, tl) != LT_OK) fail_msg("%s: %s", path, lt_ctx_error(ctx));
        float loss = (float)(r.loss_sum / (double)r.n_tokens);
        snprintf(what, sizeof what, "%s loss", path);
        compare(what, &loss, ftensor(ctx, &f, "loss", NULL), 1, ORACLE_REL);
        snprintf(what, sizeof what, "%s token_loss", path);
        compare(what, tl, ftensor(ctx, &f, "token_loss", NULL), N, ORACLE_REL);
        for (int64_t i = 0; i < lt_model_lora_count(m); i++) {
            lt_lora_tensor t;
            assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
            char key[200];
            snprintf(key, sizeof key, "%s.grad", t.name);
            snprintf(what, sizeof what, "%s %s", path, key);
            compare(what, t.grad.data, ftensor(ctx, &f, key, NULL), lt_tensor_numel(&t.grad), ORACLE_REL);
        }
    }
    lt_model_free(ctx, m);
    lt_safetensors_close(ctx, f.exp);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void matches_transformers_peft(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof CASES / sizeof *CASES; i++) check_case(CASES[i], NULL);
}

static void gguf_matches_transformers_peft(void **state) {
    (void)state;
    check_case("mistral_v01", "model.gguf");
    check_case("phi3_longrope", "model.gguf");
}

/* What each family's config reads into: arch, window per layer, head dim, RoPE scaling, EOS. */
static void configs_describe_the_families(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    static const struct {
        const char *c, *file;
        lt_model_arch arch;
        int64_t window, D;
        lt_rope_scaling rope;
        int n_eos;
    } want[] = {
        {"mistral_v01", NULL, LT_ARCH_MISTRAL, 4, 8, LT_ROPE_SCALING_NONE, 1},
        {"mistral_v01", "model.gguf", LT_ARCH_MISTRAL, 4, 8, LT_ROPE_SCALING_NONE, 2},
        {"mistral_v03", NULL, LT_ARCH_MISTRAL, 0, 8, LT_ROPE_SCALING_NONE, 1},
        {"mistral_nemo", NULL, LT_ARCH_MISTRAL, 0, 12, LT_ROPE_SCALING_NONE, 1},
        {"phi3_mini", NULL, LT_ARCH_PHI3, 0, 8, LT_ROPE_SCALING_NONE, 1},
        {"phi3_longrope", NULL, LT_ARCH_PHI3, 6, 8, LT_ROPE_SCALING_LONGROPE, 1},
        {"phi3_longrope", "model.gguf", LT_ARCH_PHI3, 6, 8, LT_ROPE_SCALING_LONGROPE, 2},
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char path[1200];
        case_dir(want[i].c, path, sizeof path);
        if (want[i].file) strcat(strcat(path, "/"), want[i].file);
        lt_model_config cfg;
        if (lt_model_inspect(ctx, path, NULL, &cfg) != LT_OK) fail_msg("%s: %s", path, lt_ctx_error(ctx));
        assert_int_equal(cfg.arch, want[i].arch);
        assert_int_equal(cfg.sliding_window, want[i].window);
        assert_int_equal(cfg.D, want[i].D);
        assert_int_equal(cfg.rope_scaling, want[i].rope);
        assert_int_equal(cfg.n_eos, want[i].n_eos);
        assert_int_equal(cfg.eos_id, 2);
        if (want[i].n_eos == 2) assert_int_equal(cfg.eos_ids[1], 3); /* GGUF eot */
        for (int64_t l = 0; l < cfg.L; l++) {
            lt_layer_desc d;
            lt_model_describe_layer(&cfg, l, &d);
            assert_int_equal(d.attn, want[i].window ? LT_ATTN_KIND_SLIDING : LT_ATTN_KIND_FULL);
            assert_int_equal(d.window, want[i].window);
        }
        if (want[i].rope == LT_ROPE_SCALING_LONGROPE) {
            /* max_position_embeddings 64 over original 4: factor 16, sqrt(1 + ln 16 / ln 4) */
            assert_int_equal(cfg.rope_original_ctx, 4);
            assert_true(fabs(cfg.rope_factor - 16) < 1e-12);
            assert_true(fabs(cfg.rope_long_factor[3] - 15.0f) < 1e-6);
            double af = cfg.rope_attn_factor > 0 ? cfg.rope_attn_factor : sqrt(3.0);
            assert_true(fabs(af - sqrt(3.0)) < 1e-6);
        }
    }
    lt_ctx_free(ctx);
}

/* Fused tensors of the wrong size are shape errors naming the tensor. */
static void bad_fused_tensor_is_named(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[] = "/tmp/lt_family_XXXXXX", src[1200], p[1300];
    assert_non_null(mkdtemp(dir));
    case_dir("phi3_mini", src, sizeof src);
    snprintf(p, sizeof p, "cp %s/config.json %s/", src, dir);
    assert_int_equal(system(p), 0);
    float w[64 * 32];
    memset(w, 0, sizeof w);
    int64_t sh_e[2] = {64, 32}, sh_qkv[2] = {40, 32};
    lt_safetensors_entry e[2] = {
        {"model.embed_tokens.weight", lt_tensor_view(w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh_e)},
        {"model.layers.0.self_attn.qkv_proj.weight", lt_tensor_view(w, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh_qkv)},
    };
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, p, e, 2, NULL, 0), LT_OK);
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, dir, NULL, &cfg), LT_ERR_SHAPE);
    assert_non_null(strstr(lt_ctx_error(ctx), "model.layers.0.self_attn.qkv_proj.weight"));
    assert_non_null(strstr(lt_ctx_error(ctx), "expected 64"));
    assert_int_equal(lt_test_rm_tree(dir), 0);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(configs_describe_the_families),
        cmocka_unit_test(matches_transformers_peft),
        cmocka_unit_test(gguf_matches_transformers_peft),
        cmocka_unit_test(bad_fused_tensor_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
