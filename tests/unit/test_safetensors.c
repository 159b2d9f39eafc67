/* safetensors writer→reader round trips on fresh random tensors (all three dtypes, metadata,
 * sharded index), every malformed-header case the reader must refuse with a typed error naming
 * the tensor, and config.json parsing for each supported architecture and the refused ones. */
#define _GNU_SOURCE
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

static char tmpdir[256];

static void make_tmpdir(void) {
    if (tmpdir[0]) return;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lt_test_st_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
}

static void path_in_tmp(char *out, size_t n, const char *name) {
    make_tmpdir();
    snprintf(out, n, "%s/%s", tmpdir, name);
}

static void write_raw(const char *path, const char *json, size_t data_bytes) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = strlen(json);
    for (int i = 0; i < 8; i++) fputc((int)((n >> (8 * i)) & 0xff), f);
    fwrite(json, 1, n, f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i * 7), f);
    fclose(f);
}

static void round_trip_all_dtypes(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    char path[512];
    path_in_tmp(path, sizeof path, "rt.safetensors");
    int64_t s1[2] = {3, 5}, s2[1] = {7}, s3[3] = {2, 2, 3};
    float a[15];
    uint16_t b[7], c[12];
    lt_test_fill_normal(&rng, a, 15, 1.0f);
    for (int i = 0; i < 7; i++) b[i] = lt_f32_to_bf16((float)lt_test_normal(&rng));
    for (int i = 0; i < 12; i++) c[i] = lt_f32_to_f16((float)lt_test_normal(&rng));
    lt_safetensors_entry e[3] = {
        {"x.weight", lt_tensor_view(a, LT_DTYPE_F32, LT_DEVICE_CPU, 2, s1)},
        {"y", lt_tensor_view(b, LT_DTYPE_BF16, LT_DEVICE_CPU, 1, s2)},
        {"z.bias", lt_tensor_view(c, LT_DTYPE_F16, LT_DEVICE_CPU, 3, s3)},
    };
    const char *meta[2] = {"format", "pt"};
    assert_int_equal(lt_safetensors_write(ctx, path, e, 3, meta, 1), LT_OK);
    lt_safetensors *st = NULL;
    assert_int_equal(lt_safetensors_open(ctx, path, &st), LT_OK);
    assert_int_equal(lt_safetensors_count(st), 3);
    assert_string_equal(lt_safetensors_metadata(st, "format"), "pt");
    assert_null(lt_safetensors_metadata(st, "nope"));
    lt_tensor t;
    assert_int_equal(lt_safetensors_find(ctx, st, "x.weight", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_F32);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 3);
    assert_int_equal(t.shape[1], 5);
    assert_memory_equal(t.data, a, sizeof a);
    assert_int_equal(lt_safetensors_find(ctx, st, "y", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_BF16);
    assert_memory_equal(t.data, b, sizeof b);
    assert_int_equal(lt_safetensors_find(ctx, st, "z.bias", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_F16);
    assert_int_equal(t.shape[2], 3);
    assert_memory_equal(t.data, c, sizeof c);
    assert_int_equal(lt_safetensors_find(ctx, st, "w", &t), LT_ERR_NOT_FOUND);
    assert_non_null(strstr(lt_ctx_error(ctx), "'w'"));
    lt_safetensors_close(ctx, st);
    /* Nothing left over: neither memory nor the temporary file. */
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    assert_int_not_equal(access(tmp, F_OK), 0);
    /* Writer refuses duplicates. */
    lt_safetensors_entry dup[2] = {e[0], e[0]};
    assert_int_equal(lt_safetensors_write(ctx, path, dup, 2, NULL, 0), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "x.weight"));
    lt_ctx_free(ctx);
}

static void expect_refused(lt_ctx *ctx, const char *json, size_t data, lt_status want, const char *needle) {
    char path[512];
    path_in_tmp(path, sizeof path, "bad.safetensors");
    write_raw(path, json, data);
    lt_safetensors *st = NULL;
    lt_status s = lt_safetensors_open(ctx, path, &st);
    if (s != want) fprintf(stderr, "for %s: got %s (%s)\n", json, lt_status_str(s), lt_ctx_error(ctx));
    assert_int_equal(s, want);
    assert_null(st);
    if (needle) assert_non_null(strstr(lt_ctx_error(ctx), needle));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
}

static void malformed_headers_are_typed_errors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    expect_refused(ctx, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, LT_ERR_FORMAT, "'a'");
    expect_refused(ctx, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,12]}}", 12, LT_ERR_FORMAT, "'a'");
    expect_refused(ctx, "{\"a\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, LT_ERR_UNSUPPORTED,
                   "I64");
    expect_refused(ctx,
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, LT_ERR_FORMAT, "overlap");
    expect_refused(ctx,
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                   16, LT_ERR_FORMAT, "duplicate");
    expect_refused(ctx, "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, LT_ERR_FORMAT, "'a'");
    expect_refused(ctx, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, LT_ERR_FORMAT, "'a'");
    expect_refused(ctx, "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, LT_ERR_FORMAT, "'a'");
    expect_refused(ctx, "[1,2]", 0, LT_ERR_FORMAT, NULL);
    expect_refused(ctx, "{\"a\":", 0, LT_ERR_FORMAT, NULL);
    /* Header length pointing past the end of the file. */
    char path[512];
    path_in_tmp(path, sizeof path, "trunc.safetensors");
    FILE *f = fopen(path, "wb");
    uint8_t len[8] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    fwrite(len, 1, 8, f);
    fputs("{}", f);
    fclose(f);
    lt_safetensors *st = NULL;
    assert_int_equal(lt_safetensors_open(ctx, path, &st), LT_ERR_FORMAT);
    path_in_tmp(path, sizeof path, "absent.safetensors");
    assert_int_equal(lt_safetensors_open(ctx, path, &st), LT_ERR_NOT_FOUND);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static void sharded_index_is_followed_and_checked(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed() + 5;
    lt_ctx *ctx = lt_ctx_new();
    char dir[512], p1[600], p2[600], idx[600];
    path_in_tmp(dir, sizeof dir, "sharded");
    assert_int_equal(mkdir(dir, 0755) == 0 || access(dir, F_OK) == 0, 1);
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    float a[6], b[4];
    lt_test_fill_normal(&rng, a, 6, 1.0f);
    lt_test_fill_normal(&rng, b, 4, 1.0f);
    int64_t sa[1] = {6}, sb[2] = {2, 2};
    lt_safetensors_entry e1 = {"layer.0.w", lt_tensor_view(a, LT_DTYPE_F32, LT_DEVICE_CPU, 1, sa)};
    lt_safetensors_entry e2 = {"layer.1.w", lt_tensor_view(b, LT_DTYPE_F32, LT_DEVICE_CPU, 2, sb)};
    assert_int_equal(lt_safetensors_write(ctx, p1, &e1, 1, NULL, 0), LT_OK);
    assert_int_equal(lt_safetensors_write(ctx, p2, &e2, 1, NULL, 0), LT_OK);
    FILE *f = fopen(idx, "w");
    fputs("{\"metadata\":{},\"weight_map\":{\"layer.0.w\":\"model-00001-of-00002.safetensors\","
          "\"layer.1.w\":\"model-00002-of-00002.safetensors\"}}",
          f);
    fclose(f);
    lt_safetensors *st = NULL;
    assert_int_equal(lt_safetensors_open(ctx, dir, &st), LT_OK);
    assert_int_equal(lt_safetensors_count(st), 2);
    lt_tensor t;
    assert_int_equal(lt_safetensors_find(ctx, st, "layer.1.w", &t), LT_OK);
    assert_memory_equal(t.data, b, sizeof b);
    lt_safetensors_close(ctx, st);
    /* An index that misplaces a tensor is refused, naming it. */
    f = fopen(idx, "w");
    fputs("{\"weight_map\":{\"layer.0.w\":\"model-00002-of-00002.safetensors\","
          "\"layer.1.w\":\"model-00002-of-00002.safetensors\"}}",
          f);
    fclose(f);
    assert_int_not_equal(lt_safetensors_open(ctx, dir, &st), LT_OK);
    assert_non_null(strstr(lt_ctx_error(ctx), "layer.0.w"));
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static lt_status config_from(lt_ctx *ctx, const char *json, lt_model_config *cfg) {
    char path[512];
    path_in_tmp(path, sizeof path, "config.json");
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
    return lt_model_config_read_hf(ctx, path, cfg);
}

static void hf_configs_parse_and_refuse(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config c;
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"llama\",\"vocab_size\":49152,\"hidden_size\":576,"
                                 "\"intermediate_size\":1536,\"num_hidden_layers\":30,\"num_attention_heads\":9,"
                                 "\"num_key_value_heads\":3,\"rope_theta\":100000,\"rms_norm_eps\":1e-5,"
                                 "\"tie_word_embeddings\":true,\"hidden_act\":\"silu\",\"bos_token_id\":1,"
                                 "\"eos_token_id\":2}",
                                 &c),
                     LT_OK);
    assert_int_equal(c.arch, LT_ARCH_LLAMA);
    assert_int_equal(c.D, 64);
    assert_int_equal(c.Hkv, 3);
    assert_true(c.tie_embeddings);
    assert_true(fabs(c.rope_theta - 100000) < 1e-9);
    assert_int_equal(c.eos_id, 2);
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"llama\",\"vocab_size\":128256,\"hidden_size\":2048,"
                                 "\"intermediate_size\":8192,\"num_hidden_layers\":16,\"num_attention_heads\":32,"
                                 "\"num_key_value_heads\":8,\"rope_theta\":500000.0,\"rope_scaling\":{\"factor\":32.0,"
                                 "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,"
                                 "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
                                 "\"eos_token_id\":[128001,128008]}",
                                 &c),
                     LT_OK);
    assert_int_equal(c.rope_scaling, LT_ROPE_SCALING_LLAMA3);
    assert_true(fabs(c.rope_factor - 32) < 1e-9);
    assert_int_equal(c.eos_id, 128001);
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"qwen3\",\"vocab_size\":1000,\"hidden_size\":64,"
                                 "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                                 "\"num_key_value_heads\":2,\"head_dim\":32}",
                                 &c),
                     LT_OK);
    assert_true(c.qk_norm && !c.qkv_bias);
    assert_int_equal(c.D, 32);
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"qwen2\",\"vocab_size\":1000,\"hidden_size\":64,"
                                 "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4}",
                                 &c),
                     LT_OK);
    assert_true(c.qkv_bias);
    assert_int_equal(config_from(ctx, "{\"model_type\":\"gpt2\",\"vocab_size\":10}", &c), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "gpt2"));
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"llama\",\"vocab_size\":1000,\"hidden_size\":64,"
                                 "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                                 "\"rope_scaling\":{\"type\":\"ntk-by-parts\",\"factor\":4}}",
                                 &c),
                     LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "ntk-by-parts"));
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"llama\",\"vocab_size\":\"x\",\"hidden_size\":64,"
                                 "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4}",
                                 &c),
                     LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "vocab_size"));
    assert_int_equal(config_from(ctx,
                                 "{\"model_type\":\"llama\",\"vocab_size\":10,\"hidden_size\":64,"
                                 "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                                 "\"num_key_value_heads\":3}",
                                 &c),
                     LT_ERR_FORMAT);
    lt_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip_all_dtypes),
        cmocka_unit_test(malformed_headers_are_typed_errors),
        cmocka_unit_test(sharded_index_is_followed_and_checked),
        cmocka_unit_test(hf_configs_parse_and_refuse),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (tmpdir[0]) { /* every file the tests wrote, then the folders */
        static const char *const files[] = {"rt.safetensors",
                                            "bad.safetensors",
                                            "trunc.safetensors",
                                            "config.json",
                                            "sharded/model-00001-of-00002.safetensors",
                                            "sharded/model-00002-of-00002.safetensors",
                                            "sharded/model.safetensors.index.json"};
        char p[600];
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
            unlink(p);
        }
        snprintf(p, sizeof p, "%s/sharded", tmpdir);
        rmdir(p);
        rmdir(tmpdir);
    }
    return failed;
}
