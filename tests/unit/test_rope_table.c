/* The RoPE frequency tables (lt_model_rope_table) against transformers: every case of
 * tests/fixtures/rope/cases.json (written by tests/oracle/gen_rope_fixtures.py from
 * ROPE_INIT_FUNCTIONS) is read through the config reader from the config.json text transformers
 * wrote, its table computed for the case's sequence length and compared to transformers'
 * inv_freq and attention factor (1e-6 relative). Also Llama 3's three wavelength bands, the CLI
 * override and its bad values, and the rope JSON read back. The rotation itself is an op, checked
 * in tests/ops/test_backend_ops.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <cjson/cJSON.h>

#include "helpers/test_util.h"
#include "model/model_internal.h"

static char tmpdir[256];

static void write_text(const char *name, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static lt_status read_config(lt_ctx *ctx, const char *text, lt_model_config *cfg) {
    write_text("config.json", text);
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", tmpdir);
    return lt_model_config_read_hf(ctx, p, cfg);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    return b;
}

static void transformers_tables(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    char p[1024];
    snprintf(p, sizeof p, "%s/tests/fixtures/rope/cases.json", lt_test_source_dir());
    char *text = slurp(p);
    cJSON *cases = cJSON_Parse(text);
    free(text);
    assert_true(cJSON_IsArray(cases) && cJSON_GetArraySize(cases) >= 15);
    int kinds[LT_ROPE_SCALING_LONGROPE + 1] = {0};
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
        lt_model_config cfg;
        lt_status s = read_config(ctx, cJSON_GetObjectItem(c, "config")->valuestring, &cfg);
        if (s != LT_OK) fail_msg("%s: %s", name, lt_ctx_error(ctx));
        const cJSON *inv = cJSON_GetObjectItem(c, "inv_freq");
        assert_int_equal(cJSON_GetArraySize(inv), cfg.D / 2);
        float table[LT_ROPE_MAX_FACTORS + 1];
        lt_model_rope_table(&cfg, (int64_t)cJSON_GetObjectItem(c, "T")->valuedouble, table);
        for (int64_t i = 0; i < cfg.D / 2; i++) {
            double want = cJSON_GetArrayItem(inv, (int)i)->valuedouble;
            if (fabs(table[i] - want) > 1e-6 * fabs(want))
                fail_msg("%s: inv_freq[%lld] %.9g, transformers %.9g", name, (long long)i, (double)table[i], want);
        }
        double att = cJSON_GetObjectItem(c, "attention_factor")->valuedouble;
        if (fabs(table[cfg.D / 2] - att) > 1e-6 * att)
            fail_msg("%s: attention factor %.9g, transformers %.9g", name, (double)table[cfg.D / 2], att);
        kinds[cfg.rope_scaling]++;
    }
    for (int k = 0; k <= LT_ROPE_SCALING_LONGROPE; k++)
        if (!kinds[k]) fail_msg("no case of rope scaling %s", lt_rope_scaling_name((lt_rope_scaling)k));
    cJSON_Delete(cases);
    lt_ctx_free(ctx);
}

static void llama3_bands(void **state) {
    (void)state;
    lt_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.D = 32;
    cfg.rope_theta = 500000.0;
    cfg.rope_scaling = LT_ROPE_SCALING_LLAMA3;
    cfg.rope_factor = 8;
    cfg.rope_low_freq = 1;
    cfg.rope_high_freq = 4;
    cfg.rope_original_ctx = 64; /* small so all three bands appear at D = 32 */
    float inv[17], plain[17];
    lt_model_rope_inv_freq(&cfg, inv);
    cfg.rope_scaling = LT_ROPE_SCALING_NONE;
    lt_model_rope_inv_freq(&cfg, plain);
    int bands[3] = {0, 0, 0};
    for (int i = 0; i < 16; i++) {
        double f = pow(500000.0, -2.0 * i / 32.0), wl = 2 * 3.14159265358979323846 / f;
        lt_test_close_to(plain[i], f, 0, 1e-6, "inv_freq", i);
        double want = wl < 64 / 4.0 ? f : wl > 64 / 1.0 ? f / 8 : 0;
        if (want == 0) {
            double s = (64 / wl - 1) / (4 - 1);
            want = (1 - s) * f / 8 + s * f;
        }
        bands[wl < 16 ? 0 : wl > 64 ? 2 : 1]++;
        lt_test_close_to(inv[i], want, 0, 1e-6, "llama3 inv_freq", i);
    }
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);
    assert_true(inv[16] == 1.0f && plain[16] == 1.0f);
}

static const char *const llama_cfg = "{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":256,"
                                     "\"intermediate_size\":64,\"num_hidden_layers\":1,\"num_attention_heads\":4,"
                                     "\"max_position_embeddings\":4096%s}";

static lt_status read_llama(lt_ctx *ctx, const char *extra, lt_model_config *cfg) {
    char text[2048];
    snprintf(text, sizeof text, llama_cfg, extra);
    return read_config(ctx, text, cfg);
}

/* The CLI's override: yarn over a plain model equals the same yarn read from a config, and the
 * rope JSON longtune writes reads back to the same table. */
static void override_and_json_round_trip(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config a, b;
    assert_int_equal(read_llama(ctx, "", &a), LT_OK);
    lt_rope_override ov = {LT_ROPE_SCALING_YARN, 4.0, 2048, 16, 2, 0};
    assert_int_equal(lt_model_config_apply_rope(ctx, &a, &ov), LT_OK);
    assert_int_equal(a.max_positions, 8192);
    assert_int_equal(read_llama(ctx,
                                ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4,\"rope_theta\":10000,"
                                "\"original_max_position_embeddings\":2048,\"beta_fast\":16,\"beta_slow\":2}",
                                &b),
                     LT_OK);
    float ta[LT_ROPE_MAX_FACTORS + 1], tb[LT_ROPE_MAX_FACTORS + 1];
    lt_model_rope_table(&a, 8192, ta);
    lt_model_rope_table(&b, 8192, tb);
    assert_memory_equal(ta, tb, sizeof(float) * (size_t)LT_ROPE_TABLE_LEN(a.D));
    static const lt_rope_scaling kinds[] = {LT_ROPE_SCALING_NONE, LT_ROPE_SCALING_LINEAR, LT_ROPE_SCALING_DYNAMIC,
                                            LT_ROPE_SCALING_YARN, LT_ROPE_SCALING_LLAMA3};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        assert_int_equal(read_llama(ctx, "", &a), LT_OK);
        lt_rope_override o = {kinds[k], 2.5, 1024, 0, 0, 0};
        assert_int_equal(lt_model_config_apply_rope(ctx, &a, &o), LT_OK);
        char json[8192], extra[8300];
        assert_int_equal(lt_model_config_rope_json(ctx, &a, json, sizeof json), LT_OK);
        snprintf(extra, sizeof extra, ",\"rope_parameters\":%s", json);
        /* dynamic reads max_position_embeddings as its original context */
        char text[9000];
        snprintf(text, sizeof text,
                 "{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":256,\"intermediate_size\":64,"
                 "\"num_hidden_layers\":1,\"num_attention_heads\":4,\"max_position_embeddings\":%lld%s}",
                 kinds[k] == LT_ROPE_SCALING_DYNAMIC ? (long long)a.rope_original_ctx : (long long)a.max_positions,
                 extra);
        if (read_config(ctx, text, &b) != LT_OK)
            fail_msg("%s: %s (%s)", lt_rope_scaling_name(kinds[k]), lt_ctx_error(ctx), json);
        assert_int_equal(b.rope_scaling, a.rope_scaling);
        lt_model_rope_table(&a, 4000, ta);
        lt_model_rope_table(&b, 4000, tb);
        assert_memory_equal(ta, tb, sizeof(float) * (size_t)LT_ROPE_TABLE_LEN(a.D));
    }
    char small[16];
    assert_int_equal(lt_model_config_rope_json(ctx, &a, small, sizeof small), LT_ERR_INVALID_ARG);
    lt_ctx_free(ctx);
}

static void bad_rope_input_is_typed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config c;
    assert_int_equal(read_llama(ctx, "", &c), LT_OK);
    lt_model_config keep = c;
    const double bad_factors[] = {0.0, -2.0, NAN, INFINITY, 0.5};
    for (size_t i = 0; i < sizeof bad_factors / sizeof bad_factors[0]; i++) {
        lt_rope_override o = {LT_ROPE_SCALING_LINEAR, bad_factors[i], 0, 0, 0, 0};
        assert_int_equal(lt_model_config_apply_rope(ctx, &c, &o), LT_ERR_INVALID_ARG);
        assert_non_null(strstr(lt_ctx_error(ctx), "factor"));
        assert_memory_equal(&c, &keep, sizeof c); /* untouched */
    }
    lt_rope_override longer = {LT_ROPE_SCALING_YARN, 2.0, 8192, 0, 0, 0};
    assert_int_equal(lt_model_config_apply_rope(ctx, &c, &longer), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "8192"));
    lt_rope_override lr = {LT_ROPE_SCALING_LONGROPE, 2.0, 0, 0, 0, 0};
    assert_int_equal(lt_model_config_apply_rope(ctx, &c, &lr), LT_ERR_INVALID_ARG);
    lt_rope_override neg = {LT_ROPE_SCALING_YARN, 2.0, 0, -1, 0, 0};
    assert_int_equal(lt_model_config_apply_rope(ctx, &c, &neg), LT_ERR_INVALID_ARG);
    lt_rope_scaling k;
    assert_int_equal(lt_rope_scaling_parse(ctx, "ntk", &k), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "\"ntk\""));
    assert_int_equal(lt_rope_scaling_parse(ctx, "longrope", &k), LT_OK);
    assert_int_equal(k, LT_ROPE_SCALING_LONGROPE);
    /* configs: unknown type, factor 0, a factor < 1, longrope with a short list, yarn's original
     * context longer than the target, a wrong-typed rope object */
    static const struct {
        const char *extra, *needle;
        lt_status want;
    } cases[] = {
        {",\"rope_parameters\":{\"rope_type\":\"ntk-by-parts\"}", "ntk-by-parts", LT_ERR_UNSUPPORTED},
        {",\"rope_scaling\":{\"type\":\"linear\",\"factor\":0}", "factor 0", LT_ERR_INVALID_ARG},
        {",\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":0.5}", "factor 0.5", LT_ERR_INVALID_ARG},
        {",\"rope_parameters\":{\"rope_type\":\"linear\"}", "factor", LT_ERR_FORMAT},
        {",\"rope_parameters\":{\"rope_type\":\"longrope\",\"short_factor\":[1,2],\"long_factor\":[1,2]}",
         "short_factor", LT_ERR_FORMAT},
        {",\"rope_parameters\":{\"rope_type\":\"yarn\",\"original_max_position_embeddings\":8192}", "factor 0.5",
         LT_ERR_INVALID_ARG},
        {",\"rope_parameters\":\"yarn\"", "rope_parameters", LT_ERR_FORMAT},
        {",\"rope_parameters\":{\"rope_type\":7}", "rope_type", LT_ERR_FORMAT},
        {",\"partial_rotary_factor\":0.5", "partial_rotary_factor 0.5", LT_ERR_UNSUPPORTED},
        {",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\",\"rope_theta\":1e6}}",
         "rope_parameters.full_attention: RoPE parameters per layer type", LT_ERR_UNSUPPORTED},
        {",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":-1}", "rope_theta", LT_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lt_status s = read_llama(ctx, cases[i].extra, &c);
        if (s != cases[i].want || !strstr(lt_ctx_error(ctx), cases[i].needle))
            fail_msg("%s: status %d, message '%s'", cases[i].extra, (int)s, lt_ctx_error(ctx));
    }
    lt_ctx_free(ctx);
}

static int setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lt_rope_XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    return lt_test_rm_tree(tmpdir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(transformers_tables),
        cmocka_unit_test(llama3_bands),
        cmocka_unit_test(override_and_json_round_trip),
        cmocka_unit_test(bad_rope_input_is_typed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
