/* PEFT adapter files: the exported safetensors has PEFT's key names, shapes (A: (r, in), B: (out,
 * r)), F32 data at 8-aligned offsets equal to the tensors, and adapter_config.json the fields PEFT's
 * LoraConfig reads; bad names and shapes are refused. Against the PEFT oracle (tests/fixtures/peft,
 * written by tests/oracle/gen_peft_fixtures.py): an adapter saved by PEFT loads into longtune and
 * gives PEFT's logits, and exporting those weights gives PEFT's own file back (keys, shapes,
 * values, LoRA config fields); test_train_run.c checks that an export loads back into longtune. */
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

static uint64_t rng;

static char *read_all(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    rewind(f);
    char *b = malloc((size_t)*n + 1);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    b[*n] = '\0';
    fclose(f);
    return b;
}

static void export_keys_shapes_and_data(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_train_options o;
    memset(&o, 0, sizeof o);
    o.lora_rank = 4;
    o.lora_alpha = 8;
    o.lora_dropout = 0.05;
    const int64_t r = 4, C = 24, F = 40;
    const char *names[6] = {"model.layers.2.self_attn.q_proj.lora_A", "model.layers.2.self_attn.q_proj.lora_B",
                            "model.layers.2.mlp.down_proj.lora_A",    "model.layers.2.mlp.down_proj.lora_B",
                            "model.layers.1.self_attn.q_proj.lora_A", "model.layers.1.self_attn.q_proj.lora_B"};
    const int64_t shapes[6][2] = {{r, C}, {C, r}, {r, F}, {C, r}, {r, C}, {C, r}};
    lt_train_param p[6];
    float *data[6];
    for (int i = 0; i < 6; i++) {
        memset(&p[i], 0, sizeof p[i]);
        snprintf(p[i].name, sizeof p[i].name, "%s", names[i]);
        p[i].ndim = 2;
        p[i].shape[0] = shapes[i][0];
        p[i].shape[1] = shapes[i][1];
        data[i] = malloc((size_t)(shapes[i][0] * shapes[i][1]) * sizeof(float));
        lt_test_fill_normal(&rng, data[i], shapes[i][0] * shapes[i][1], 1.0f);
        p[i].data = data[i];
    }
    char dir[256], path[300];
    char parent[200];
    snprintf(parent, sizeof parent, "/tmp/lt_test_peft_%ld", (long)getpid());
    snprintf(dir, sizeof dir, "%s/nested/adapter", parent); /* parents are created as mkdir -p */
    assert_int_equal(lt_peft_save(ctx, dir, "HuggingFaceTB/SmolLM2-135M-Instruct", &o, p, 6), LT_OK);

    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    long n;
    char *st = read_all(path, &n);
    uint64_t hl;
    memcpy(&hl, st, 8);
    assert_true(hl % 8 == 0 && 8 + hl <= (uint64_t)n);
    cJSON *h = cJSON_ParseWithLength(st + 8, (size_t)hl);
    assert_non_null(h);
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(h, "__metadata__"), "format")->valuestring, "pt");
    uint64_t total = 0;
    for (int i = 0; i < 6; i++) {
        char key[256];
        snprintf(key, sizeof key, "base_model.model.%s.weight", names[i]);
        cJSON *t = cJSON_GetObjectItemCaseSensitive(h, key);
        assert_non_null(t);
        assert_string_equal(cJSON_GetObjectItem(t, "dtype")->valuestring, "F32");
        cJSON *shape = cJSON_GetObjectItem(t, "shape"), *offs = cJSON_GetObjectItem(t, "data_offsets");
        assert_int_equal(cJSON_GetArraySize(shape), 2);
        assert_int_equal((int64_t)cJSON_GetArrayItem(shape, 0)->valuedouble, shapes[i][0]);
        assert_int_equal((int64_t)cJSON_GetArrayItem(shape, 1)->valuedouble, shapes[i][1]);
        uint64_t b = (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
        uint64_t e = (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        size_t bytes = (size_t)(shapes[i][0] * shapes[i][1]) * sizeof(float);
        assert_int_equal(e - b, bytes);
        assert_memory_equal(st + 8 + hl + b, data[i], bytes);
        total += bytes;
    }
    assert_int_equal(cJSON_GetArraySize(h), 7);
    assert_int_equal(8 + hl + total, (uint64_t)n);
    cJSON_Delete(h);
    free(st);

    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    char *cfg = read_all(path, &n);
    cJSON *c = cJSON_Parse(cfg);
    assert_non_null(c);
    assert_string_equal(cJSON_GetObjectItem(c, "peft_type")->valuestring, "LORA");
    assert_string_equal(cJSON_GetObjectItem(c, "task_type")->valuestring, "CAUSAL_LM");
    assert_string_equal(cJSON_GetObjectItem(c, "base_model_name_or_path")->valuestring,
                        "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_int_equal(cJSON_GetObjectItem(c, "r")->valueint, 4);
    assert_true(cJSON_GetObjectItem(c, "lora_alpha")->valuedouble == 8);
    assert_true(cJSON_GetObjectItem(c, "lora_dropout")->valuedouble == 0.05);
    cJSON *tm = cJSON_GetObjectItem(c, "target_modules");
    assert_int_equal(cJSON_GetArraySize(tm), 2);
    assert_string_equal(cJSON_GetArrayItem(tm, 0)->valuestring, "q_proj");
    assert_string_equal(cJSON_GetArrayItem(tm, 1)->valuestring, "down_proj");
    cJSON *lt = cJSON_GetObjectItem(c, "layers_to_transform");
    assert_int_equal(cJSON_GetArraySize(lt), 2);
    assert_int_equal(cJSON_GetArrayItem(lt, 0)->valueint, 1);
    assert_int_equal(cJSON_GetArrayItem(lt, 1)->valueint, 2);
    assert_true(cJSON_IsFalse(cJSON_GetObjectItem(c, "use_rslora")));
    cJSON_Delete(c);
    free(cfg);

    /* A name without lora_A/B and a shape that disagrees with the rank are refused. */
    snprintf(p[0].name, sizeof p[0].name, "model.layers.2.self_attn.q_proj.weight");
    assert_int_equal(lt_peft_save(ctx, dir, "b", &o, p, 6), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "q_proj.weight"));
    snprintf(p[0].name, sizeof p[0].name, "%s", names[0]);
    p[1].shape[1] = 3;
    assert_int_equal(lt_peft_save(ctx, dir, "b", &o, p, 6), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "rank"));

    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    unlink(path);
    rmdir(dir);
    snprintf(path, sizeof path, "%s/nested", parent);
    rmdir(path);
    rmdir(parent);
    for (int i = 0; i < 6; i++) free(data[i]);
    lt_ctx_free(ctx);
}

#define ORACLE_REL 1e-4 /* fp32 forward against PyTorch, as tests/e2e/test_model.c */

static void compare(const char *what, const float *got, const float *want, int64_t n) {
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs((double)want[i]));
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= worst)) worst = e;
    }
    fprintf(stderr, "%s: max error %.3g (scale %.3g)\n", what, worst, scale);
    assert_true(worst <= ORACLE_REL * scale + 1e-7);
}

/* Loads the fixture base with the adapter in `dir` and returns its logits (T, V), malloc'd. */
static float *adapter_logits(lt_ctx *ctx, const char *base, const char *dir, const float *ids_f, int64_t T,
                             lt_model **out) {
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    lt_model_config cfg;
    assert_int_equal(lt_model_inspect(ctx, base, &mo, &cfg), LT_OK);
    lt_lora_options lora;
    lt_status s = lt_peft_read_config(ctx, dir, cfg.L, &lora);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    assert_int_equal(lora.rank, 4);
    assert_int_equal(lora.num_layers, 1);
    assert_int_equal(lora.targets, LT_LORA_ALL_TARGETS);
    lt_model *m = NULL;
    assert_int_equal(lt_model_load(ctx, base, &mo, &lora, &m), LT_OK);
    s = lt_peft_load(ctx, dir, m);
    if (s != LT_OK) fprintf(stderr, "%s\n", lt_ctx_error(ctx));
    assert_int_equal(s, LT_OK);
    lt_model_run_options ro = {.B = 1, .T = T, .forward_only = 1};
    assert_int_equal(lt_model_prepare(ctx, m, &ro), LT_OK);
    int32_t ids[64];
    for (int64_t i = 0; i < T; i++) ids[i] = (int32_t)ids_f[i];
    lt_model_batch b = {.B = 1, .T = T, .tokens = ids};
    float *logits = malloc((size_t)(T * cfg.V) * sizeof(float));
    for (int64_t i = 0; i < T * cfg.V; i++) logits[i] = LT_TEST_POISON;
    assert_int_equal(lt_model_logits(ctx, m, &b, logits), LT_OK);
    *out = m;
    return logits;
}

static void peft_oracle_both_directions(void **state) {
    (void)state;
    char base[600], fix[600], peft_dir[700], lt_dir[700], exp_path[700];
    snprintf(base, sizeof base, "%s/tests/fixtures/model/llama_tied", lt_test_source_dir());
    snprintf(fix, sizeof fix, "%s/tests/fixtures/peft", lt_test_source_dir());
    snprintf(peft_dir, sizeof peft_dir, "%s/peft_written", fix);
    snprintf(lt_dir, sizeof lt_dir, "%s/longtune_written", fix);
    snprintf(exp_path, sizeof exp_path, "%s/expected.safetensors", fix);
    lt_ctx *ctx = lt_ctx_new();
    lt_safetensors *exp = NULL;
    assert_int_equal(lt_safetensors_open(ctx, exp_path, &exp), LT_OK);
    lt_tensor ids, want;
    assert_int_equal(lt_safetensors_find(ctx, exp, "input_ids", &ids), LT_OK);
    assert_int_equal(lt_safetensors_find(ctx, exp, "logits_peft", &want), LT_OK);
    int64_t T = ids.shape[0];
    assert_true(T <= 64);

    /* PEFT → longtune. */
    lt_model *m;
    float *got = adapter_logits(ctx, base, peft_dir, ids.data, T, &m);
    compare("logits with PEFT's adapter", got, want.data, lt_tensor_numel(&want));
    free(got);

    /* longtune → PEFT: exporting the same weights gives PEFT's own file contents: the same keys,
       shapes and values (PEFT saves F32 here too), and a config with the same LoRA fields. */
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
    o.lora_rank = 4;
    o.lora_alpha = 8;
    char out_dir[700], path[800];
    snprintf(out_dir, sizeof out_dir, "/tmp/lt_test_peft_oracle_%ld", (long)getpid());
    assert_int_equal(lt_peft_save(ctx, out_dir, "tests/fixtures/model/llama_tied", &o, p, (int)n), LT_OK);
    free(p);
    lt_model_free(ctx, m);
    lt_safetensors *ours = NULL, *theirs = NULL;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
    assert_int_equal(lt_safetensors_open(ctx, path, &ours), LT_OK);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", peft_dir);
    assert_int_equal(lt_safetensors_open(ctx, path, &theirs), LT_OK);
    assert_int_equal(lt_safetensors_count(ours), lt_safetensors_count(theirs));
    for (int64_t i = 0; i < lt_safetensors_count(theirs); i++) {
        const char *key = lt_safetensors_name(theirs, i);
        lt_tensor a, b;
        assert_int_equal(lt_safetensors_find(ctx, theirs, key, &a), LT_OK);
        if (lt_safetensors_find(ctx, ours, key, &b) != LT_OK) fprintf(stderr, "missing key %s\n", key);
        assert_int_equal(lt_safetensors_find(ctx, ours, key, &b), LT_OK);
        assert_int_equal(a.dtype, LT_DTYPE_F32);
        assert_int_equal(b.dtype, LT_DTYPE_F32);
        assert_int_equal(a.ndim, b.ndim);
        assert_memory_equal(a.shape, b.shape, (size_t)a.ndim * sizeof(int64_t));
        assert_memory_equal(a.data, b.data, (size_t)lt_tensor_numel(&a) * sizeof(float));
    }
    lt_safetensors_close(ctx, ours);
    lt_safetensors_close(ctx, theirs);
    long cn;
    snprintf(path, sizeof path, "%s/adapter_config.json", peft_dir);
    char *ct = read_all(path, &cn);
    snprintf(path, sizeof path, "%s/adapter_config.json", out_dir);
    char *co = read_all(path, &cn);
    cJSON *jt = cJSON_Parse(ct), *jo = cJSON_Parse(co);
    const char *same[] = {"peft_type",      "task_type",           "r",        "lora_alpha", "lora_dropout",   "bias",
                          "fan_in_fan_out", "layers_to_transform", "use_dora", "use_rslora", "modules_to_save"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        if (!cJSON_Compare(cJSON_GetObjectItem(jt, same[i]), cJSON_GetObjectItem(jo, same[i]), 1))
            fprintf(stderr, "adapter_config.json: '%s' differs from PEFT's\n", same[i]);
        assert_true(cJSON_Compare(cJSON_GetObjectItem(jt, same[i]), cJSON_GetObjectItem(jo, same[i]), 1));
    }
    /* target_modules: the same set (PEFT stores a set, so its order is arbitrary). */
    cJSON *tt = cJSON_GetObjectItem(jt, "target_modules"), *to = cJSON_GetObjectItem(jo, "target_modules"), *e;
    assert_int_equal(cJSON_GetArraySize(tt), cJSON_GetArraySize(to));
    cJSON_ArrayForEach(e, tt) {
        int found = 0;
        cJSON *f;
        cJSON_ArrayForEach(f, to) found |= !strcmp(e->valuestring, f->valuestring);
        assert_true(found);
    }
    cJSON_Delete(jt);
    cJSON_Delete(jo);
    free(ct);
    free(co);
    if (getenv("LONGTUNE_TEST_KEEP")) { /* keep the longtune-written adapter for the PEFT check */
        fprintf(stderr, "kept %s (tests/oracle/gen_peft_fixtures.py longtune --adapter %s)\n", out_dir, out_dir);
    } else {
        unlink(path);
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
        unlink(path);
        rmdir(out_dir);
    }

    lt_safetensors_close(ctx, exp);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

int main(void) {
    rng = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(export_keys_shapes_and_data),
        cmocka_unit_test(peft_oracle_both_directions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
