/* PEFT adapters with LoRA on the experts (tests/fixtures/moe/peft_experts, written by PEFT through
 * tests/oracle/gen_moe_peft_adapter.py on the Qwen3-MoE fixture): adapter_config.json's
 * target_parameters become the expert targets; every element of PEFT's expert tensors lands in the
 * model's storage slot lt_lora_tensor_peft_index names; saving the loaded adapter gives PEFT's own
 * file back (keys, shapes, values bit for bit; target_parameters in PEFT's nesting order,
 * lora_dropout 0), and it loads back identically; the model with PEFT's adapter gives the PEFT
 * model's logits (expected.safetensors). Bad input: a wrong expert shape, an unknown target
 * parameter, experts without projections, expert tensors for a model without MoE layers. */
#include <cjson/cJSON.h>
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
#include "longtune/safetensors.h"
#include "longtune/train.h"
#include "train/train_internal.h"

static char base_dir[600], fix_dir[600];

static lt_model *load_with(lt_ctx *ctx, const char *base, const char *adapter, lt_status *load_status) {
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, base, &mo, &cfg), LT_OK);
    lt_lora_options lora;
    lt_status s = lt_peft_read_config(ctx, adapter, cfg.L, &lora);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, base, &mo, &lora, &m), LT_OK);
    *load_status = lt_peft_load(ctx, adapter, m);
    return m;
}

/* Every element of the file's tensors sits where the PEFT index says. */
static void check_values(lt_ctx *ctx, lt_model *m, const char *adapter, int64_t *n_expert) {
    char path[800];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter);
    lt_safetensors *st;
    assert_int_equal(lt_safetensors_open(ctx, path, &st), LT_OK);
    int64_t count = lt_model_lora_count(m);
    assert_int_equal(count, lt_safetensors_count(st));
    *n_expert = 0;
    for (int64_t i = 0; i < count; i++) {
        lt_lora_tensor t;
        lt_tensor src;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        assert_int_equal(lt_safetensors_find(ctx, st, t.name, &src), LT_OK);
        assert_int_equal(src.dtype, LT_DTYPE_F32);
        assert_int_equal(src.shape[0], t.peft_rows);
        assert_int_equal(src.shape[1], t.peft_cols);
        const float *v = t.value.data, *f = src.data;
        int64_t n = t.peft_rows * t.peft_cols;
        assert_int_equal(n, lt_tensor_numel(&t.value));
        *n_expert += t.experts > 0;
        for (int64_t j = 0; j < n; j++) {
            /* Independently of the index: PEFT's B element [o, c] with c = j·E + e is expert e's
               row o, column j of its block (gate_up: gate stack, then up stack). */
            int64_t slot = j;
            if (t.experts && t.is_b) {
                int64_t E = t.experts, r = t.peft_cols / E, o = j / t.peft_cols, c = j % t.peft_cols;
                int64_t e = c % E, jj = c / E, rows = t.proj == LT_PROJ_GATE ? t.peft_rows / 2 : t.peft_rows;
                int64_t stack = o / rows, ro = o % rows;
                slot = stack * E * rows * r + (e * rows + ro) * r + jj;
            }
            assert_int_equal(lt_lora_tensor_peft_index(&t, j), slot);
            if (v[slot] != f[j]) fprintf(stderr, "%s element %lld differs\n", t.name, (long long)j);
            assert_true(v[slot] == f[j]);
        }
    }
    lt_safetensors_close(ctx, st);
}

/* The model's logits on the fixture's tokens against the PEFT model's. */
static void check_logits(lt_ctx *ctx, lt_model *m, const char *adapter) {
    char path[800];
    snprintf(path, sizeof path, "%s/expected.safetensors", adapter);
    lt_safetensors *ex;
    assert_int_equal(lt_safetensors_open(ctx, path, &ex), LT_OK);
    lt_tensor tok, want;
    assert_int_equal(lt_safetensors_find(ctx, ex, "tokens", &tok), LT_OK);
    assert_int_equal(lt_safetensors_find(ctx, ex, "logits", &want), LT_OK);
    int64_t T = tok.shape[1], V = lt_model_get_config(m)->V;
    assert_true(T <= 64);
    assert_int_equal(lt_tensor_numel(&want), T * V);
    int32_t ids[64];
    for (int64_t i = 0; i < T; i++) ids[i] = (int32_t)((const float *)tok.data)[i];
    lt_model_run_options ro = {.B = 1, .T = T, .forward_only = 1};
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    lt_model_batch b = {.B = 1, .T = T, .tokens = ids};
    float *got = malloc((size_t)(T * V) * sizeof(float));
    for (int64_t i = 0; i < T * V; i++) got[i] = LT_TEST_POISON;
    lt_status s = lt_model_logits(ctx, m, &b, got);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    double worst = 0, scale = 0;
    const float *w = want.data;
    for (int64_t i = 0; i < T * V; i++) {
        scale = fmax(scale, fabs((double)w[i]));
        double e = fabs((double)got[i] - (double)w[i]);
        if (!(e <= worst)) worst = e;
    }
    fprintf(stderr, "%s: logits against PEFT's: max error %.3g (scale %.3g)\n", adapter, worst, scale);
    assert_true(worst <= 1e-4 * scale + 1e-6);
    free(got);
    lt_safetensors_close(ctx, ex);
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

static void remove_dir(const char *dir) {
    char p[800];
    snprintf(p, sizeof p, "%s/adapter_model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/adapter_config.json", dir);
    unlink(p);
    rmdir(dir);
}

/* Saves m's adapter as the trainer does (names without the PEFT prefix, storage shapes). */
static void save_like_trainer(lt_ctx *ctx, lt_model *m, const char *dir, int64_t rank, float alpha) {
    int64_t n = lt_model_lora_count(m);
    lt_train_param *p = calloc((size_t)n, sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        lt_lora_tensor t;
        assert_int_equal(lt_model_lora_tensor(ctx, m, i, &t), LT_OK);
        size_t len = strlen(t.name), pl = strlen("base_model.model."), sl = strlen(".weight");
        memcpy(p[i].name, t.name + pl, len - pl - sl);
        p[i].ndim = 2;
        p[i].shape[0] = t.value.shape[0];
        p[i].shape[1] = t.value.shape[1];
        p[i].data = t.value.data;
    }
    lt_train_options o;
    memset(&o, 0, sizeof o);
    o.lora_rank = rank;
    o.lora_alpha = alpha;
    o.lora_dropout = 0.1; /* PEFT refuses dropout on target_parameters: the config records 0 */
    lt_status s = lt_peft_save_named(ctx, dir, "tests/fixtures/moe/qwen3moe", &o, p, (int)n, m);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    /* Without the model the expert stacks have no PEFT layout: refused, naming the tensor. */
    assert_int_equal(lt_peft_save(ctx, "/tmp/lt_never_written", "x", &o, p, (int)n), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "mlp.experts"));
    free(p);
}

static void case_round_trip(const char *name, int64_t rank, float alpha, const char *first_param, int n_params) {
    lt_ctx *ctx = lt_ctx_new();
    char adapter[700], out[700], path[800];
    snprintf(adapter, sizeof adapter, "%s/%s", fix_dir, name);
    lt_status s;
    lt_model *m = load_with(ctx, base_dir, adapter, &s);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    assert_true((lt_model_get_lora(m)->targets & LT_LORA_EXPERTS_GATE_UP) != 0);
    int64_t ne;
    check_values(ctx, m, adapter, &ne);
    assert_int_equal(ne, 2 * 2 * n_params); /* 2 layers, A and B per parameter */
    check_logits(ctx, m, adapter);

    snprintf(out, sizeof out, "/tmp/lt_test_peft_experts_%s_%ld", name, (long)getpid());
    save_like_trainer(ctx, m, out, rank, alpha);
    lt_model_free(ctx, m);
    /* The saved file is PEFT's, bit for bit. */
    lt_safetensors *ours, *theirs;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
    assert_int_equal(lt_safetensors_open(ctx, path, &ours), LT_OK);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter);
    assert_int_equal(lt_safetensors_open(ctx, path, &theirs), LT_OK);
    assert_int_equal(lt_safetensors_count(ours), lt_safetensors_count(theirs));
    for (int64_t i = 0; i < lt_safetensors_count(theirs); i++) {
        const char *key = lt_safetensors_name(theirs, i);
        lt_tensor a, b;
        assert_int_equal(lt_safetensors_find(ctx, theirs, key, &a), LT_OK);
        if (lt_safetensors_find(ctx, ours, key, &b) != LT_OK) fprintf(stderr, "missing %s\n", key);
        assert_int_equal(lt_safetensors_find(ctx, ours, key, &b), LT_OK);
        assert_int_equal(a.ndim, b.ndim);
        assert_memory_equal(a.shape, b.shape, 2 * sizeof(int64_t));
        assert_memory_equal(a.data, b.data, (size_t)lt_tensor_numel(&a) * sizeof(float));
    }
    lt_safetensors_close(ctx, ours);
    lt_safetensors_close(ctx, theirs);
    snprintf(path, sizeof path, "%s/adapter_config.json", out);
    char *text = read_all(path);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cJSON *tp = cJSON_GetObjectItem(j, "target_parameters");
    assert_true(cJSON_IsArray(tp));
    assert_int_equal(cJSON_GetArraySize(tp), n_params);
    assert_string_equal(cJSON_GetArrayItem(tp, 0)->valuestring, first_param);
    if (n_params == 2) assert_string_equal(cJSON_GetArrayItem(tp, 1)->valuestring, "mlp.experts.down_proj");
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "target_modules")), 2); /* q_proj, v_proj */
    assert_true(cJSON_GetObjectItem(j, "lora_dropout")->valuedouble == 0.0);
    cJSON_Delete(j);
    /* And it loads back to the same values. */
    m = load_with(ctx, base_dir, out, &s);
    assert_int_equal(s, LT_OK);
    check_values(ctx, m, adapter, &ne);
    lt_model_free(ctx, m);
    if (getenv("LONGTUNE_TEST_KEEP"))
        fprintf(stderr, "kept %s (tests/oracle/gen_moe_peft_adapter.py --check-adapter %s %s)\n", out, out, name);
    else remove_dir(out);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void both_round_trip(void **state) {
    (void)state;
    case_round_trip("both", 2, 4, "mlp.experts.gate_up_proj", 2);
}

static void gate_up_round_trip(void **state) {
    (void)state;
    case_round_trip("gate_up", 2, 8, "mlp.experts.gate_up_proj", 1);
}

/* A copy of the fixture "both" with its config edited by `edit` (a key and a JSON value) and its
 * tensor `retensor` rewritten with shape (rows, cols) when non-NULL. */
static void make_bad(const char *dir, const char *key, const char *json, const char *retensor, int64_t rows,
                     int64_t cols) {
    lt_ctx *ctx = lt_ctx_new();
    mkdir(dir, 0755);
    char path[800];
    snprintf(path, sizeof path, "%s/both/adapter_config.json", fix_dir);
    char *text = read_all(path);
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (key) {
        cJSON_DeleteItemFromObject(j, key);
        cJSON_AddItemToObject(j, key, cJSON_Parse(json));
    }
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "wb");
    fputs(out, f);
    fclose(f);
    free(out);
    lt_safetensors *st;
    snprintf(path, sizeof path, "%s/both/adapter_model.safetensors", fix_dir);
    assert_int_equal(lt_safetensors_open(ctx, path, &st), LT_OK);
    int64_t n = lt_safetensors_count(st);
    lt_safetensors_entry *e = calloc((size_t)n, sizeof *e);
    float *big = calloc((size_t)(rows * cols + 1), sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        e[i].name = lt_safetensors_name(st, i);
        assert_int_equal(lt_safetensors_find(ctx, st, e[i].name, &e[i].tensor), LT_OK);
        if (retensor && !strcmp(e[i].name, retensor)) {
            int64_t sh[2] = {rows, cols};
            e[i].tensor = lt_tensor_view(big, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sh);
        }
    }
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    assert_int_equal(lt_safetensors_write(ctx, path, e, n, NULL, 0), LT_OK);
    free(e);
    free(big);
    lt_safetensors_close(ctx, st);
    lt_ctx_free(ctx);
}

static void bad_adapters_are_refused(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char dir[256];
    snprintf(dir, sizeof dir, "/tmp/lt_test_peft_experts_bad_%ld", (long)getpid());
    lt_lora_options lo;

    /* PEFT's (r·E, in) expert A given as (r, in): the tensor and both shapes are named. */
    const char *key = "base_model.model.model.layers.1.mlp.experts.lora_A.weight";
    make_bad(dir, NULL, NULL, key, 2, 16);
    lt_status s;
    lt_model *m = load_with(ctx, base_dir, dir, &s);
    assert_int_equal(s, LT_ERR_SHAPE);
    assert_non_null(strstr(lt_ctx_error(ctx), key));
    assert_non_null(strstr(lt_ctx_error(ctx), "(16, 16)"));
    lt_model_free(ctx, m);
    remove_dir(dir);

    /* A target parameter longtune cannot map. */
    make_bad(dir, "target_parameters", "[\"mlp.experts.gate_up_proj\", \"mlp.router.weight\"]", NULL, 0, 0);
    assert_int_equal(lt_peft_read_config(ctx, dir, 2, &lo), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "mlp.router.weight"));
    remove_dir(dir);
    make_bad(dir, "target_parameters", "\"mlp.experts.gate_up_proj\"", NULL, 0, 0);
    assert_int_equal(lt_peft_read_config(ctx, dir, 2, &lo), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "target_parameters"));
    remove_dir(dir);

    /* Experts alone: longtune's LoRA always includes projections. */
    make_bad(dir, "target_modules", "[]", NULL, 0, 0);
    assert_int_equal(lt_peft_read_config(ctx, dir, 2, &lo), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "experts alone"));
    remove_dir(dir);

    /* PEFT's expert tensors on a layer outside layers_to_transform (PEFT does not apply it to
       target_parameters): named. */
    make_bad(dir, "layers_to_transform", "[1]", NULL, 0, 0);
    m = load_with(ctx, base_dir, dir, &s);
    assert_int_equal(s, LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "layers.0."));
    lt_model_free(ctx, m);
    remove_dir(dir);

    /* Expert tensors in the file, none in the config's targets. */
    make_bad(dir, "target_parameters", "null", NULL, 0, 0);
    m = load_with(ctx, base_dir, dir, &s);
    assert_int_equal(s, LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "mlp.experts"));
    lt_model_free(ctx, m);
    remove_dir(dir);

    /* The expert adapter given to a dense model: the model refuses the expert targets. */
    char dense[700], adapter[700];
    snprintf(dense, sizeof dense, "%s/tests/fixtures/model/llama_tied", lt_test_source_dir());
    snprintf(adapter, sizeof adapter, "%s/both", fix_dir);
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    assert_int_equal(lt_peft_read_config(ctx, adapter, 2, &lo), LT_OK);
    m = NULL;
    assert_int_equal(lt_model_load(ctx, dense, &mo, &lo, &m), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "mixture-of-experts"));
    assert_null(m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

int main(void) {
    snprintf(base_dir, sizeof base_dir, "%s/tests/fixtures/moe/qwen3moe", lt_test_source_dir());
    snprintf(fix_dir, sizeof fix_dir, "%s/tests/fixtures/moe/peft_experts", lt_test_source_dir());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_round_trip),
        cmocka_unit_test(gate_up_round_trip),
        cmocka_unit_test(bad_adapters_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
