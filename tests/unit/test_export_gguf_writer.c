/* The GGUF writer: every metadata type and a tensor of each plain and block dtype written and read
 * back with the GGUF reader (values, shapes, data, 32-byte alignment); misuse is a typed error
 * (a key or tensor twice, a bad name, a dtype with no ggml type, bytes past or short of the
 * declared tensors) and a file that was not finished never appears at its path. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/gguf.h"

static char path[256];

static void must(lt_ctx *ctx, lt_status s) {
    if (s != LT_OK) {
        fprintf(stderr, "%s: %s\n", lt_status_str(s), lt_ctx_error(ctx));
        fail();
    }
}

static void test_round_trip(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    uint64_t rng = lt_test_seed();
    lt_gguf_writer *w;
    must(ctx, lt_gguf_writer_new(ctx, &w));
    must(ctx, lt_gguf_writer_set_str(ctx, w, "general.architecture", "llama", 5));
    must(ctx, lt_gguf_writer_set_u32(ctx, w, "a.u32", 4000000000u));
    must(ctx, lt_gguf_writer_set_i32(ctx, w, "a.i32", -7));
    must(ctx, lt_gguf_writer_set_u64(ctx, w, "a.u64", 1ull << 40));
    must(ctx, lt_gguf_writer_set_f32(ctx, w, "a.f32", 0.25f));
    must(ctx, lt_gguf_writer_set_bool(ctx, w, "a.bool", 1));
    int32_t ints[3] = {1, -2, 3};
    must(ctx, lt_gguf_writer_set_array(ctx, w, "a.ints", LT_GGUF_I32, ints, 3));
    const char *strs[2] = {"x", "yz"};
    must(ctx, lt_gguf_writer_set_array_str(ctx, w, "a.strs", strs, NULL, 2));
    int64_t s1[1] = {5}, s2[2] = {3, 64};
    float v[5], m[3 * 64];
    for (int i = 0; i < 5; i++) v[i] = (float)lt_test_normal(&rng);
    for (int i = 0; i < 3 * 64; i++) m[i] = (float)lt_test_normal(&rng);
    uint8_t q[3 * 2 * 34];
    for (int r = 0; r < 3; r++) lt_quantize_row(LT_DTYPE_Q8_0, m + r * 64, q + r * 68, 64);
    must(ctx, lt_gguf_writer_add_tensor(ctx, w, "v", LT_DTYPE_F32, 1, s1));
    must(ctx, lt_gguf_writer_add_tensor(ctx, w, "q", LT_DTYPE_Q8_0, 2, s2));
    uint64_t bytes = lt_gguf_writer_file_bytes(w);
    must(ctx, lt_gguf_writer_begin(ctx, w, path));
    must(ctx, lt_gguf_writer_write(ctx, w, v, sizeof v));
    must(ctx, lt_gguf_writer_write(ctx, w, q, 100)); /* in pieces */
    must(ctx, lt_gguf_writer_write(ctx, w, q + 100, sizeof q - 100));
    must(ctx, lt_gguf_writer_finish(ctx, w));
    lt_gguf_writer_free(w);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    assert_int_equal((uint64_t)ftell(f), bytes);
    fclose(f);
    lt_gguf *g;
    must(ctx, lt_gguf_open(ctx, path, &g));
    assert_int_equal(lt_gguf_version(g), 3);
    uint64_t u;
    int64_t i64;
    double d;
    int b;
    must(ctx, lt_gguf_get_u64(ctx, g, "a.u32", &u));
    assert_int_equal(u, 4000000000u);
    must(ctx, lt_gguf_get_i64(ctx, g, "a.i32", &i64));
    assert_int_equal(i64, -7);
    must(ctx, lt_gguf_get_u64(ctx, g, "a.u64", &u));
    assert_int_equal(u, 1ull << 40);
    must(ctx, lt_gguf_get_f64(ctx, g, "a.f32", &d));
    assert_true(d == 0.25);
    must(ctx, lt_gguf_get_bool(ctx, g, "a.bool", &b));
    assert_int_equal(b, 1);
    lt_gguf_type et;
    uint64_t n;
    must(ctx, lt_gguf_get_array(ctx, g, "a.ints", &et, &n));
    assert_int_equal(et, LT_GGUF_I32);
    assert_int_equal(n, 3);
    must(ctx, lt_gguf_array_i64(ctx, g, "a.ints", 1, &i64));
    assert_int_equal(i64, -2);
    const char *s;
    size_t sl;
    must(ctx, lt_gguf_array_str(ctx, g, "a.strs", 1, &s, &sl));
    assert_true(sl == 2 && !memcmp(s, "yz", 2));
    lt_tensor t;
    must(ctx, lt_gguf_find_tensor(ctx, g, "v", &t));
    assert_true(t.dtype == LT_DTYPE_F32 && t.shape[0] == 5 && !memcmp(t.data, v, sizeof v));
    assert_int_equal((uintptr_t)t.data % 32, 0);
    must(ctx, lt_gguf_find_tensor(ctx, g, "q", &t));
    assert_true(t.dtype == LT_DTYPE_Q8_0 && t.ndim == 2 && t.shape[0] == 3 && t.shape[1] == 64);
    assert_memory_equal(t.data, q, sizeof q);
    assert_int_equal((uintptr_t)t.data % 32, 0);
    /* Copying every entry into a second writer reproduces them. */
    lt_gguf_writer *w2;
    must(ctx, lt_gguf_writer_new(ctx, &w2));
    for (int64_t k = 0; k < lt_gguf_kv_count(g); k++) must(ctx, lt_gguf_writer_copy_kv(ctx, w2, g, k));
    assert_true(lt_gguf_writer_has_key(w2, "a.strs") && lt_gguf_writer_has_key(w2, "a.bool"));
    char p2[300];
    snprintf(p2, sizeof p2, "%s.copy", path);
    must(ctx, lt_gguf_writer_begin(ctx, w2, p2));
    must(ctx, lt_gguf_writer_finish(ctx, w2));
    lt_gguf_writer_free(w2);
    lt_gguf *g2;
    must(ctx, lt_gguf_open(ctx, p2, &g2));
    must(ctx, lt_gguf_get_f64(ctx, g2, "a.f32", &d));
    assert_true(d == 0.25);
    must(ctx, lt_gguf_get_type(ctx, g2, "a.u64", &et));
    assert_int_equal(et, LT_GGUF_U64);
    must(ctx, lt_gguf_array_str(ctx, g2, "a.strs", 0, &s, &sl));
    assert_true(sl == 1 && s[0] == 'x');
    lt_gguf_close(g2);
    lt_gguf_close(g);
    unlink(p2);
    unlink(path);
    lt_ctx_free(ctx);
}

static void test_misuse(void **st) {
    (void)st;
    lt_ctx *ctx = lt_ctx_new();
    lt_gguf_writer *w;
    must(ctx, lt_gguf_writer_new(ctx, &w));
    must(ctx, lt_gguf_writer_set_u32(ctx, w, "k", 1));
    assert_int_equal(lt_gguf_writer_set_u32(ctx, w, "k", 2), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "'k' set twice"));
    assert_int_equal(lt_gguf_writer_set_u32(ctx, w, "", 2), LT_ERR_INVALID_ARG);
    int64_t sh[2] = {2, 33};
    assert_int_equal(lt_gguf_writer_add_tensor(ctx, w, "t", LT_DTYPE_Q8_0, 2, sh), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "whole q8_0 blocks"));
    assert_int_equal(lt_gguf_writer_add_tensor(ctx, w, "t", LT_DTYPE_INT4_G64, 2, sh), LT_ERR_INVALID_ARG);
    char longname[80];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    assert_int_equal(lt_gguf_writer_add_tensor(ctx, w, longname, LT_DTYPE_F32, 2, sh), LT_ERR_INVALID_ARG);
    must(ctx, lt_gguf_writer_add_tensor(ctx, w, "t", LT_DTYPE_F32, 2, sh));
    assert_int_equal(lt_gguf_writer_add_tensor(ctx, w, "t", LT_DTYPE_F32, 2, sh), LT_ERR_INVALID_ARG);
    must(ctx, lt_gguf_writer_begin(ctx, w, path));
    assert_int_equal(lt_gguf_writer_set_u32(ctx, w, "late", 1), LT_ERR_INVALID_ARG);
    float x[80] = {0};
    must(ctx, lt_gguf_writer_write(ctx, w, x, 10 * sizeof(float)));
    assert_int_equal(lt_gguf_writer_finish(ctx, w), LT_ERR_INVALID_ARG);
    assert_non_null(strstr(lt_ctx_error(ctx), "tensor 't' got 40 of 264 bytes"));
    assert_int_equal(lt_gguf_writer_write(ctx, w, x, 70 * sizeof(float)), LT_ERR_INVALID_ARG);
    lt_gguf_writer_free(w); /* unfinished: the temporary goes, the target never appears */
    assert_int_not_equal(access(path, F_OK), 0);
    lt_ctx_free(ctx);
}

int main(void) {
    snprintf(path, sizeof path, "/tmp/lt_test_gguf_writer.%ld.gguf", (long)getpid());
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_round_trip), cmocka_unit_test(test_misuse)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
