/* PEFT adapter export: the safetensors file has PEFT's key names, shapes (A: (r, in), B: (out, r)),
 * F32 data at 8-aligned offsets equal to the tensors, and adapter_config.json the fields PEFT's
 * LoraConfig reads. Bad names and shapes are refused. */
#include <cjson/cJSON.h>
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
                            "model.layers.2.mlp.down_proj.lora_A", "model.layers.2.mlp.down_proj.lora_B",
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
    snprintf(dir, sizeof dir, "/tmp/lt_test_peft_%ld", (long)getpid());
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
    for (int i = 0; i < 6; i++) free(data[i]);
    lt_ctx_free(ctx);
}

int main(void) {
    rng = lt_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(export_keys_shapes_and_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
