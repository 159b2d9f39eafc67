/* GGUF reader: a tiny writer inside the test builds valid and malformed files (truncated at every
 * byte, offsets past the end, huge counts, bad magic and version, bad alignment, duplicate keys
 * and tensor names, random byte flips) and checks each typed error; a valid file round-trips
 * every metadata type and tensor dtype. The real SmolLM2 GGUF is checked when present. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "helpers/test_util.h"
#include "longtune/alloc.h"
#include "longtune/gguf.h"

/* ---- a tiny GGUF writer ------------------------------------------------------------------ */

typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
} wbuf;

static void w_bytes(wbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void w_u8(wbuf *b, uint8_t v) { w_bytes(b, &v, 1); }
static void w_u32(wbuf *b, uint32_t v) { w_bytes(b, &v, 4); }
static void w_u64(wbuf *b, uint64_t v) { w_bytes(b, &v, 8); }
static void w_str(wbuf *b, const char *s) {
    w_u64(b, strlen(s));
    w_bytes(b, s, strlen(s));
}
static void w_pad(wbuf *b, size_t align) {
    while (b->n % align) w_u8(b, 0);
}
static void w_header(wbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    w_bytes(b, "GGUF", 4);
    w_u32(b, version);
    w_u64(b, n_tensors);
    w_u64(b, n_kv);
}
static void w_kv_u32(wbuf *b, const char *key, uint32_t v) {
    w_str(b, key);
    w_u32(b, LT_GGUF_U32);
    w_u32(b, v);
}
static void w_kv_str(wbuf *b, const char *key, const char *v) {
    w_str(b, key);
    w_u32(b, LT_GGUF_STRING);
    w_str(b, v);
}
/* Tensor info with dims given in GGUF order (ne[0] fastest). */
static void w_tinfo(wbuf *b, const char *name, int nd, const uint64_t *ne, uint32_t type, uint64_t off) {
    w_str(b, name);
    w_u32(b, (uint32_t)nd);
    for (int i = 0; i < nd; i++) w_u64(b, ne[i]);
    w_u32(b, type);
    w_u64(b, off);
}

static char tmp_path[256];

static const char *write_tmp(const wbuf *b) {
    snprintf(tmp_path, sizeof tmp_path, "/tmp/lt_test_gguf_%d.gguf", (int)getpid());
    FILE *f = fopen(tmp_path, "wb");
    assert_non_null(f);
    if (b->n) assert_int_equal(fwrite(b->p, 1, b->n, f), b->n);
    fclose(f);
    return tmp_path;
}

/* Opens the buffer as a file; returns the status and closes the handle on success. */
static lt_status open_buf(lt_ctx *ctx, const wbuf *b) {
    lt_gguf *g = NULL;
    lt_status s = lt_gguf_open(ctx, write_tmp(b), &g);
    if (s == LT_OK) {
        assert_non_null(g);
        lt_gguf_close(g);
    } else {
        assert_null(g);
        assert_true(strlen(lt_ctx_error(ctx)) > 0);
    }
    unlink(tmp_path);
    return s;
}

/* The valid reference file: every metadata type, alignment 64, six tensors. Tensor data bytes
 * are a fixed pattern so the test can check the pointers. */
#define REF_ALIGN 64
static void build_valid(wbuf *b) {
    memset(b, 0, sizeof *b);
    w_header(b, 3, 7, 17);
    w_kv_u32(b, "general.alignment", REF_ALIGN);
    w_kv_str(b, "general.architecture", "llama");
    w_str(b, "k.u8");
    w_u32(b, LT_GGUF_U8);
    w_u8(b, 200);
    w_str(b, "k.i8");
    w_u32(b, LT_GGUF_I8);
    w_u8(b, (uint8_t)(int8_t)-5);
    w_str(b, "k.u16");
    w_u32(b, LT_GGUF_U16);
    {
        uint16_t v = 60000;
        w_bytes(b, &v, 2);
    }
    w_str(b, "k.i16");
    w_u32(b, LT_GGUF_I16);
    {
        int16_t v = -30000;
        w_bytes(b, &v, 2);
    }
    w_kv_u32(b, "k.u32", 4000000000u);
    w_str(b, "k.i32");
    w_u32(b, LT_GGUF_I32);
    {
        int32_t v = -123456;
        w_bytes(b, &v, 4);
    }
    w_str(b, "k.f32");
    w_u32(b, LT_GGUF_F32);
    {
        float v = 1.5e-5f;
        w_bytes(b, &v, 4);
    }
    w_str(b, "k.bool");
    w_u32(b, LT_GGUF_BOOL);
    w_u8(b, 1);
    w_str(b, "k.u64");
    w_u32(b, LT_GGUF_U64);
    w_u64(b, UINT64_MAX);
    w_str(b, "k.i64");
    w_u32(b, LT_GGUF_I64);
    {
        int64_t v = -(INT64_C(1) << 40);
        w_bytes(b, &v, 8);
    }
    w_str(b, "k.f64");
    w_u32(b, LT_GGUF_F64);
    {
        double v = 100000.0;
        w_bytes(b, &v, 8);
    }
    w_str(b, "k.arr_i32");
    w_u32(b, LT_GGUF_ARRAY);
    w_u32(b, LT_GGUF_I32);
    w_u64(b, 4);
    for (int32_t i = 0; i < 4; i++) {
        int32_t v = i * 10 - 7;
        w_bytes(b, &v, 4);
    }
    w_str(b, "k.arr_str");
    w_u32(b, LT_GGUF_ARRAY);
    w_u32(b, LT_GGUF_STRING);
    w_u64(b, 3);
    w_str(b, "alpha");
    w_str(b, "");
    w_str(b, "\xc4\xa0gamma");
    w_str(b, "k.arr_f32");
    w_u32(b, LT_GGUF_ARRAY);
    w_u32(b, LT_GGUF_F32);
    w_u64(b, 2);
    {
        float v[2] = {-0.5f, 3.25f};
        w_bytes(b, v, 8);
    }
    w_kv_str(b, "k.empty", "");
    /* Tensors: sizes F32 3x4 = 48 B, F16 2x8 = 32, BF16 8 = 16, Q8_0 2x64 = 4*34 = 136,
     * Q4_0 1x32 = 18, Q4_1 3x32 = 60, Q6_K 256 = 210. Offsets rounded to 64. */
    uint64_t off = 0;
    uint64_t ne_f32[2] = {4, 3}, ne_f16[2] = {8, 2}, ne_bf16[1] = {8}, ne_q8[2] = {64, 2}, ne_q40[2] = {32, 1},
             ne_q41[3] = {32, 3, 1}, ne_q6k[1] = {256};
    const uint64_t sizes[7] = {48, 32, 16, 136, 18, 60, 210};
    uint64_t offs[7];
    for (int i = 0; i < 7; i++) {
        offs[i] = off;
        off = (off + sizes[i] + REF_ALIGN - 1) / REF_ALIGN * REF_ALIGN;
    }
    w_tinfo(b, "t.f32", 2, ne_f32, 0, offs[0]);
    w_tinfo(b, "t.f16", 2, ne_f16, 1, offs[1]);
    w_tinfo(b, "t.bf16", 1, ne_bf16, 30, offs[2]);
    w_tinfo(b, "t.q8_0", 2, ne_q8, 8, offs[3]);
    w_tinfo(b, "t.q4_0", 2, ne_q40, 2, offs[4]);
    w_tinfo(b, "t.q4_1", 3, ne_q41, 3, offs[5]);
    w_tinfo(b, "t.q6_k", 1, ne_q6k, 14, offs[6]);
    w_pad(b, REF_ALIGN);
    size_t data = b->n;
    /* Data ends exactly where the last tensor does, so any truncation cuts a tensor. */
    for (uint64_t i = 0; i < offs[6] + sizes[6]; i++) w_u8(b, (uint8_t)(i * 7 + 3));
    (void)data;
}

static void valid_file_round_trips(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    wbuf b;
    build_valid(&b);
    lt_gguf *g = NULL;
    assert_int_equal(lt_gguf_open(ctx, write_tmp(&b), &g), LT_OK);
    assert_int_equal(lt_gguf_version(g), 3);
    assert_int_equal(lt_gguf_alignment(g), REF_ALIGN);
    assert_int_equal(lt_gguf_kv_count(g), 17);
    const char *s;
    size_t n;
    assert_int_equal(lt_gguf_get_str(ctx, g, "general.architecture", &s, &n), LT_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "llama", 5);
    assert_int_equal(lt_gguf_get_str(ctx, g, "k.empty", &s, &n), LT_OK);
    assert_int_equal(n, 0);
    uint64_t u;
    int64_t i;
    double f;
    int bo;
    assert_int_equal(lt_gguf_get_u64(ctx, g, "k.u8", &u), LT_OK);
    assert_int_equal(u, 200);
    assert_int_equal(lt_gguf_get_i64(ctx, g, "k.i8", &i), LT_OK);
    assert_int_equal(i, -5);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "k.u16", &u), LT_OK);
    assert_int_equal(u, 60000);
    assert_int_equal(lt_gguf_get_i64(ctx, g, "k.i16", &i), LT_OK);
    assert_int_equal(i, -30000);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "k.u32", &u), LT_OK);
    assert_int_equal(u, 4000000000u);
    assert_int_equal(lt_gguf_get_i64(ctx, g, "k.i32", &i), LT_OK);
    assert_int_equal(i, -123456);
    assert_int_equal(lt_gguf_get_f64(ctx, g, "k.f32", &f), LT_OK);
    assert_float_equal(f, 1.5e-5, 1e-12);
    assert_int_equal(lt_gguf_get_bool(ctx, g, "k.bool", &bo), LT_OK);
    assert_int_equal(bo, 1);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "k.u64", &u), LT_OK);
    assert_true(u == UINT64_MAX);
    assert_int_equal(lt_gguf_get_i64(ctx, g, "k.i64", &i), LT_OK);
    assert_true(i == -(INT64_C(1) << 40));
    assert_int_equal(lt_gguf_get_f64(ctx, g, "k.f64", &f), LT_OK);
    assert_float_equal(f, 100000.0, 0);
    assert_int_equal(lt_gguf_get_f64(ctx, g, "k.u32", &f), LT_OK);
    assert_float_equal(f, 4e9, 0);
    /* Conversions that do not fit, and type mismatches, are typed errors. */
    assert_int_equal(lt_gguf_get_i64(ctx, g, "k.u64", &i), LT_ERR_FORMAT);
    assert_non_null(strstr(lt_ctx_error(ctx), "k.u64"));
    assert_int_equal(lt_gguf_get_u64(ctx, g, "k.i8", &u), LT_ERR_FORMAT);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "general.architecture", &u), LT_ERR_FORMAT);
    assert_int_equal(lt_gguf_get_str(ctx, g, "k.u8", &s, &n), LT_ERR_FORMAT);
    assert_int_equal(lt_gguf_get_f64(ctx, g, "k.arr_f32", &f), LT_ERR_FORMAT);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "no.such.key", &u), LT_ERR_NOT_FOUND);
    assert_non_null(strstr(lt_ctx_error(ctx), "no.such.key"));
    /* Arrays. */
    lt_gguf_type et;
    uint64_t cnt;
    assert_int_equal(lt_gguf_get_array(ctx, g, "k.arr_i32", &et, &cnt), LT_OK);
    assert_int_equal(et, LT_GGUF_I32);
    assert_int_equal(cnt, 4);
    for (uint64_t k = 0; k < 4; k++) {
        assert_int_equal(lt_gguf_array_i64(ctx, g, "k.arr_i32", k, &i), LT_OK);
        assert_int_equal(i, (int64_t)k * 10 - 7);
    }
    assert_int_equal(lt_gguf_array_i64(ctx, g, "k.arr_i32", 4, &i), LT_ERR_INVALID_ARG);
    assert_int_equal(lt_gguf_array_f64(ctx, g, "k.arr_f32", 1, &f), LT_OK);
    assert_float_equal(f, 3.25, 0);
    assert_int_equal(lt_gguf_array_i64(ctx, g, "k.arr_f32", 0, &i), LT_ERR_FORMAT);
    assert_int_equal(lt_gguf_array_str(ctx, g, "k.arr_i32", 0, &s, &n), LT_ERR_FORMAT);
    assert_int_equal(lt_gguf_get_array(ctx, g, "k.arr_str", &et, &cnt), LT_OK);
    assert_int_equal(et, LT_GGUF_STRING);
    assert_int_equal(cnt, 3);
    assert_int_equal(lt_gguf_array_str(ctx, g, "k.arr_str", 0, &s, &n), LT_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "alpha", 5);
    assert_int_equal(lt_gguf_array_str(ctx, g, "k.arr_str", 1, &s, &n), LT_OK);
    assert_int_equal(n, 0);
    assert_int_equal(lt_gguf_array_str(ctx, g, "k.arr_str", 2, &s, &n), LT_OK);
    assert_int_equal(n, 7);
    assert_memory_equal(s, "\xc4\xa0gamma", 7);
    assert_int_equal(lt_gguf_array_str(ctx, g, "k.arr_str", 3, &s, &n), LT_ERR_INVALID_ARG);
    /* Keys in file order. */
    const char *key;
    lt_gguf_type kt;
    assert_int_equal(lt_gguf_kv_key(ctx, g, 1, &key, &n, &kt), LT_OK);
    assert_int_equal(n, strlen("general.architecture"));
    assert_int_equal(kt, LT_GGUF_STRING);
    assert_int_equal(lt_gguf_kv_key(ctx, g, 17, &key, &n, &kt), LT_ERR_INVALID_ARG);

    /* Tensors: shapes reversed to row-major, dtypes mapped, data where the offsets say. */
    assert_int_equal(lt_gguf_tensor_count(g), 7);
    assert_string_equal(lt_gguf_tensor_name(g, 3), "t.q8_0");
    assert_null(lt_gguf_tensor_name(g, 7));
    struct {
        const char *name;
        lt_dtype dt;
        int nd;
        int64_t shape[3];
        uint64_t off;
    } want[6] = {
        {"t.f32", LT_DTYPE_F32, 2, {3, 4}, 0},      {"t.f16", LT_DTYPE_F16, 2, {2, 8}, 64},
        {"t.bf16", LT_DTYPE_BF16, 1, {8}, 128},     {"t.q8_0", LT_DTYPE_Q8_0, 2, {2, 64}, 192},
        {"t.q4_0", LT_DTYPE_Q4_0, 2, {1, 32}, 384}, {"t.q4_1", LT_DTYPE_Q4_1, 3, {1, 3, 32}, 448},
    };
    size_t data_start = 0;
    for (int k = 0; k < 6; k++) {
        lt_tensor t;
        memset(&t, 0xAB, sizeof t);
        assert_int_equal(lt_gguf_find_tensor(ctx, g, want[k].name, &t), LT_OK);
        assert_int_equal(t.dtype, want[k].dt);
        assert_int_equal(t.ndim, want[k].nd);
        assert_int_equal(t.device, LT_DEVICE_CPU);
        for (int d = 0; d < t.ndim; d++) assert_int_equal(t.shape[d], want[k].shape[d]);
        if (k == 0) {
            /* The first tensor sits at the data start: its first byte is pattern byte 0. */
            const uint8_t *p = t.data;
            assert_int_equal(p[0], 3);
            assert_int_equal(p[1], 10);
            assert_int_equal(t.stride[0], 4);
            assert_int_equal(t.stride[1], 1);
            data_start = (size_t)(uintptr_t)t.data;
        } else {
            assert_int_equal((size_t)(uintptr_t)t.data - data_start, want[k].off);
            const uint8_t *p = t.data;
            assert_int_equal(p[0], (uint8_t)(want[k].off * 7 + 3));
        }
    }
    lt_tensor t;
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "t.q6_k", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_Q6_K);
    assert_int_equal(lt_tensor_nbytes(&t), 210);
    assert_int_equal((size_t)(uintptr_t)t.data - data_start, 512);
    uint32_t gt;
    const char *gtn;
    assert_int_equal(lt_gguf_tensor_ggml_type(ctx, g, "t.q6_k", &gt, &gtn), LT_OK);
    assert_int_equal(gt, 14);
    assert_string_equal(gtn, "Q6_K");
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "t.missing", &t), LT_ERR_NOT_FOUND);
    lt_gguf_close(g);
    unlink(tmp_path);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    free(b.p);
    lt_ctx_free(ctx);
}

/* Every proper prefix of the valid file is rejected with LT_ERR_FORMAT (never a crash): the
 * header walk catches cuts in the metadata, the bounds check cuts in the tensor data. */
static void every_truncation_is_a_format_error(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    wbuf b;
    build_valid(&b);
    size_t full = b.n;
    for (size_t len = 0; len < full; len++) {
        b.n = len;
        lt_status s = open_buf(ctx, &b);
        if (s != LT_ERR_FORMAT)
            fail_msg("prefix of %zu/%zu bytes: got %s (%s)", len, full, lt_status_str(s), lt_ctx_error(ctx));
    }
    b.n = full;
    assert_int_equal(open_buf(ctx, &b), LT_OK);
    free(b.p);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static lt_status open_and_expect(lt_ctx *ctx, wbuf *b, lt_status want, const char *needle) {
    lt_status s = open_buf(ctx, b);
    if (s != want) fail_msg("expected %s, got %s: %s", lt_status_str(want), lt_status_str(s), lt_ctx_error(ctx));
    if (needle && !strstr(lt_ctx_error(ctx), needle))
        fail_msg("error '%s' does not mention '%s'", lt_ctx_error(ctx), needle);
    free(b->p);
    memset(b, 0, sizeof *b);
    return s;
}

static void malformed_files_are_typed_errors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    wbuf b = {0};
    uint64_t ne1[1] = {8}, ne2[2] = {4, 4};

    w_bytes(&b, "GGUG", 4);
    w_u32(&b, 3);
    w_u64(&b, 0);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "magic");

    w_header(&b, 1, 0, 0);
    open_and_expect(ctx, &b, LT_ERR_UNSUPPORTED, "version 1");
    w_header(&b, 7, 0, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "version 7");
    w_bytes(&b, "GGUF", 4);
    w_u32(&b, 0x03000000u);
    w_u64(&b, 0);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_UNSUPPORTED, "big-endian");

    /* An empty but well-formed file (v2) opens. */
    w_header(&b, 2, 0, 0);
    open_and_expect(ctx, &b, LT_OK, NULL);

    /* Huge counts are rejected before anything is allocated for them. */
    w_header(&b, 3, 0, UINT64_MAX);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "metadata entries");
    w_header(&b, 3, UINT64_MAX / 2, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "tensors cannot fit");
    w_header(&b, 3, 0, 1);
    w_str(&b, "big");
    w_u32(&b, LT_GGUF_ARRAY);
    w_u32(&b, LT_GGUF_U64);
    w_u64(&b, UINT64_MAX / 4);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "big");
    w_header(&b, 3, 0, 1);
    w_str(&b, "bigs");
    w_u32(&b, LT_GGUF_ARRAY);
    w_u32(&b, LT_GGUF_STRING);
    w_u64(&b, UINT64_MAX);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "bigs");
    w_header(&b, 3, 0, 1);
    w_str(&b, "s");
    w_u32(&b, LT_GGUF_STRING);
    w_u64(&b, UINT64_MAX - 3);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "'s'");
    /* A key length that wraps the cursor. */
    w_header(&b, 3, 0, 1);
    w_u64(&b, UINT64_MAX);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "key");

    /* Unknown and nested value types. */
    w_header(&b, 3, 0, 1);
    w_str(&b, "odd");
    w_u32(&b, 99);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "odd");
    w_header(&b, 3, 0, 1);
    w_str(&b, "nest");
    w_u32(&b, LT_GGUF_ARRAY);
    w_u32(&b, LT_GGUF_ARRAY);
    w_u64(&b, 1);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_UNSUPPORTED, "nest");

    /* Duplicate keys. */
    w_header(&b, 3, 0, 2);
    w_kv_u32(&b, "a.b", 1);
    w_kv_u32(&b, "a.b", 2);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "duplicate key 'a.b'");

    /* Alignment: not a power of two, zero, wrong type; tensor offset not aligned. */
    w_header(&b, 3, 0, 1);
    w_kv_u32(&b, "general.alignment", 48);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "alignment");
    w_header(&b, 3, 0, 1);
    w_kv_u32(&b, "general.alignment", 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "alignment");
    w_header(&b, 3, 0, 1);
    w_kv_str(&b, "general.alignment", "32");
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "alignment");
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "w", 1, ne1, 0, 16);
    w_pad(&b, 32);
    for (int k = 0; k < 64; k++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "alignment");

    /* Tensor data past the end: offset beyond, and size beyond. */
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "w", 1, ne1, 0, 4096);
    w_pad(&b, 32);
    for (int k = 0; k < 32; k++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "'w'");
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "w", 2, ne2, 0, 0);
    w_pad(&b, 32);
    for (int k = 0; k < 63; k++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "past the end");
    /* Exactly enough data is fine. */
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "w", 2, ne2, 0, 0);
    w_pad(&b, 32);
    for (int k = 0; k < 64; k++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_OK, NULL);

    /* Dimensions: too many, overflowing product, quantized row not a block multiple. */
    uint64_t ne5[5] = {1, 1, 1, 1, 1};
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "w5", 5, ne5, 0, 0);
    w_pad(&b, 32);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "w5");
    uint64_t neh[2] = {UINT64_C(1) << 40, UINT64_C(1) << 40};
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "wh", 2, neh, 0, 0);
    w_pad(&b, 32);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "wh");
    uint64_t neq[1] = {33};
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "wq", 1, neq, 8, 0);
    w_pad(&b, 32);
    for (int k = 0; k < 128; k++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "wq");
    uint64_t nebig[2] = {UINT64_C(1) << 31, UINT64_C(1) << 31};
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "wb", 2, nebig, 0, 0);
    w_pad(&b, 32);
    w_u64(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "wb");

    /* Duplicate tensor names. */
    w_header(&b, 3, 2, 0);
    w_tinfo(&b, "same", 1, ne1, 0, 0);
    w_tinfo(&b, "same", 1, ne1, 0, 32);
    w_pad(&b, 32);
    for (int k = 0; k < 64; k++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "duplicate tensor name 'same'");

    /* Missing and non-regular files. */
    lt_gguf *g = NULL;
    assert_int_equal(lt_gguf_open(ctx, "/nonexistent/x.gguf", &g), LT_ERR_NOT_FOUND);
    assert_int_equal(lt_gguf_open(ctx, "/tmp", &g), LT_ERR_IO);
    assert_null(g);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Random byte flips in the header must never crash or leak; any status is acceptable. Also
 * every allocation failure inside open is reported as LT_ERR_OOM without leaks. */
/* Every GGUF block type longtune reads maps to its dtype with ggml's block size; a row that is
 * not a whole number of blocks, a type longtune does not read and an unknown type id are typed
 * errors naming the tensor and the type. */
static void every_read_block_type_maps(void **state) {
    (void)state;
    const struct {
        uint32_t id;
        lt_dtype dt;
        uint64_t be, bb;
    } types[] = {
        {6, LT_DTYPE_Q5_0, 32, 22},    {7, LT_DTYPE_Q5_1, 32, 24},    {10, LT_DTYPE_Q2_K, 256, 84},
        {11, LT_DTYPE_Q3_K, 256, 110}, {12, LT_DTYPE_Q4_K, 256, 144}, {13, LT_DTYPE_Q5_K, 256, 176},
        {14, LT_DTYPE_Q6_K, 256, 210}, {20, LT_DTYPE_IQ4_NL, 32, 18}, {23, LT_DTYPE_IQ4_XS, 256, 136},
    };
    const int nt = (int)(sizeof types / sizeof types[0]);
    lt_ctx *ctx = lt_ctx_new();
    wbuf b = {0};
    w_header(&b, 3, (uint64_t)nt + 2, 0);
    uint64_t off = 0, offs[16];
    for (int i = 0; i < nt; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", lt_dtype_name(types[i].dt));
        uint64_t ne[2] = {types[i].be * 2, 3};
        offs[i] = off;
        w_tinfo(&b, name, 2, ne, types[i].id, off);
        off = (off + 6 * types[i].bb + 31) / 32 * 32;
    }
    uint64_t ne1[1] = {256};
    w_tinfo(&b, "t.q8_k", 1, ne1, 15, off);
    w_tinfo(&b, "t.odd", 1, ne1, 99, off);
    w_pad(&b, 32);
    for (uint64_t i = 0; i < off + 292; i++) w_u8(&b, (uint8_t)i);
    lt_gguf *g = NULL;
    assert_int_equal(lt_gguf_open(ctx, write_tmp(&b), &g), LT_OK);
    const uint8_t *base = NULL;
    for (int i = 0; i < nt; i++) {
        char name[32];
        snprintf(name, sizeof name, "t.%s", lt_dtype_name(types[i].dt));
        lt_tensor t;
        assert_int_equal(lt_gguf_find_tensor(ctx, g, name, &t), LT_OK);
        assert_int_equal(t.dtype, types[i].dt);
        assert_int_equal(t.shape[0], 3);
        assert_int_equal(t.shape[1], (int64_t)types[i].be * 2);
        assert_int_equal(lt_tensor_nbytes(&t), (int64_t)(6 * types[i].bb));
        if (i == 0) base = t.data;
        assert_int_equal((uint64_t)((const uint8_t *)t.data - base), offs[i]);
    }
    lt_tensor t;
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "t.q8_k", &t), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "t.q8_k"));
    assert_non_null(strstr(lt_ctx_error(ctx), "Q8_K"));
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "t.odd", &t), LT_ERR_UNSUPPORTED);
    assert_non_null(strstr(lt_ctx_error(ctx), "t.odd"));
    assert_non_null(strstr(lt_ctx_error(ctx), "99"));
    lt_gguf_close(g);
    unlink(tmp_path);
    free(b.p);

    /* C = 576 is not a whole number of 256-weight super-blocks: the file is malformed. */
    memset(&b, 0, sizeof b);
    w_header(&b, 3, 1, 0);
    uint64_t ne576[2] = {576, 2};
    w_tinfo(&b, "blk.0.attn_q.weight", 2, ne576, 12, 0);
    w_pad(&b, 32);
    for (int i = 0; i < 2048; i++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "blk.0.attn_q.weight");
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "blk.0.attn_q.weight", 2, ne576, 14, 0);
    w_pad(&b, 32);
    for (int i = 0; i < 2048; i++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "Q6_K");
    /* A tensor whose blocks run past the end of the file. */
    uint64_t ne_big[2] = {256, 64};
    w_header(&b, 3, 1, 0);
    w_tinfo(&b, "blk.0.ffn_down.weight", 2, ne_big, 13, 0);
    w_pad(&b, 32);
    for (int i = 0; i < 176 * 63; i++) w_u8(&b, 0);
    open_and_expect(ctx, &b, LT_ERR_FORMAT, "blk.0.ffn_down.weight");
    lt_ctx_free(ctx);
}

static void random_corruption_and_oom_never_crash(void **state) {
    (void)state;
    uint64_t rng = lt_test_seed();
    lt_ctx *ctx = lt_ctx_new();
    wbuf b;
    build_valid(&b);
    uint8_t *orig = malloc(b.n);
    memcpy(orig, b.p, b.n);
    size_t header = b.n - 7 * 64; /* roughly the metadata and tensor infos */
    for (int it = 0; it < 300; it++) {
        memcpy(b.p, orig, b.n);
        int flips = 1 + (int)(lt_test_rand_u64(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t pos = 4 + (size_t)(lt_test_rand_u64(&rng) % (header - 4));
            b.p[pos] = (uint8_t)lt_test_rand_u64(&rng);
        }
        lt_gguf *g = NULL;
        lt_status s = lt_gguf_open(ctx, write_tmp(&b), &g);
        if (s == LT_OK) {
            /* Whatever opened must be safely readable. */
            for (int64_t t = 0; t < lt_gguf_tensor_count(g); t++) {
                lt_tensor tv;
                if (lt_gguf_find_tensor(ctx, g, lt_gguf_tensor_name(g, t), &tv) == LT_OK) {
                    int64_t nb = lt_tensor_nbytes(&tv);
                    volatile uint8_t sink = 0;
                    for (int64_t k = 0; k < nb; k++) sink ^= ((const uint8_t *)tv.data)[k];
                    (void)sink;
                }
            }
            lt_gguf_close(g);
        }
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    }
    memcpy(b.p, orig, b.n);
    write_tmp(&b);
    for (uint64_t nth = 1; nth < 12; nth++) {
        lt_mem_fail_nth(ctx, nth);
        lt_gguf *g = NULL;
        lt_status s = lt_gguf_open(ctx, tmp_path, &g);
        assert_true(s == LT_OK || s == LT_ERR_OOM);
        lt_gguf_close(g);
        assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    }
    lt_mem_fail_nth(ctx, 0);
    unlink(tmp_path);
    free(orig);
    free(b.p);
    lt_ctx_free(ctx);
}

/* The real default model, when installed: metadata and tensor types as llama.cpp wrote them. */
static void real_smollm2_metadata(void **state) {
    (void)state;
    char path[1024];
    const char *cache = getenv("LONGTUNE_CACHE");
    const char *home = getenv("HOME");
    if (cache) snprintf(path, sizeof path, "%s/smollm2-135m-instruct-q4_1.gguf", cache);
    else snprintf(path, sizeof path, "%s/.cache/longtune/smollm2-135m-instruct-q4_1.gguf", home ? home : "");
    if (access(path, R_OK) != 0) {
        fprintf(stderr, "skipped: %s absent (run scripts/setup.sh to install the model)\n", path);
        skip();
    }
    lt_ctx *ctx = lt_ctx_new();
    lt_gguf *g = NULL;
    assert_int_equal(lt_gguf_open(ctx, path, &g), LT_OK);
    const char *s;
    size_t n;
    assert_int_equal(lt_gguf_get_str(ctx, g, "general.architecture", &s, &n), LT_OK);
    assert_int_equal(n, 5);
    assert_memory_equal(s, "llama", 5);
    uint64_t u;
    assert_int_equal(lt_gguf_get_u64(ctx, g, "llama.block_count", &u), LT_OK);
    assert_int_equal(u, 30);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "llama.embedding_length", &u), LT_OK);
    assert_int_equal(u, 576);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "llama.attention.head_count", &u), LT_OK);
    assert_int_equal(u, 9);
    assert_int_equal(lt_gguf_get_u64(ctx, g, "llama.attention.head_count_kv", &u), LT_OK);
    assert_int_equal(u, 3);
    lt_gguf_type et;
    assert_int_equal(lt_gguf_get_array(ctx, g, "tokenizer.ggml.tokens", &et, &u), LT_OK);
    assert_int_equal(et, LT_GGUF_STRING);
    assert_int_equal(u, 49152);
    assert_int_equal(lt_gguf_get_str(ctx, g, "tokenizer.ggml.model", &s, &n), LT_OK);
    assert_int_equal(n, 4);
    assert_memory_equal(s, "gpt2", 4);
    lt_tensor t;
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "token_embd.weight", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_Q8_0);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 49152);
    assert_int_equal(t.shape[1], 576);
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "blk.0.attn_q.weight", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_Q4_1);
    assert_int_equal(t.shape[0], 576);
    assert_int_equal(t.shape[1], 576);
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "blk.29.ffn_down.weight", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_Q4_1);
    assert_int_equal(t.shape[0], 576);
    assert_int_equal(t.shape[1], 1536);
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "output_norm.weight", &t), LT_OK);
    assert_int_equal(t.dtype, LT_DTYPE_F32);
    /* The weights dequantize to finite, non-constant values. */
    float row[576];
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "token_embd.weight", &t), LT_OK);
    lt_dequantize_row(LT_DTYPE_Q8_0, (const uint8_t *)t.data + 1000 * lt_dtype_row_bytes(t.dtype, 576), row, 576);
    float mn = row[0], mx = row[0];
    for (int k = 0; k < 576; k++) {
        assert_true(row[k] == row[k] && row[k] > -100 && row[k] < 100);
        if (row[k] < mn) mn = row[k];
        if (row[k] > mx) mx = row[k];
    }
    assert_true(mx > mn);
    assert_int_equal(lt_gguf_find_tensor(ctx, g, "output.weight", &t), LT_ERR_NOT_FOUND);
    lt_gguf_close(g);
    lt_ctx_free(ctx);
}

/* The scalar widths the reader validates with and the writer lays out with, as the GGUF
 * specification gives them; strings, arrays and unknown codes have none. */
static void scalar_widths(void **state) {
    (void)state;
    const struct {
        uint32_t type;
        uint64_t bytes;
    } want[] = {{LT_GGUF_U8, 1},  {LT_GGUF_I8, 1},     {LT_GGUF_BOOL, 1},  {LT_GGUF_U16, 2},         {LT_GGUF_I16, 2},
                {LT_GGUF_U32, 4}, {LT_GGUF_I32, 4},    {LT_GGUF_F32, 4},   {LT_GGUF_U64, 8},         {LT_GGUF_I64, 8},
                {LT_GGUF_F64, 8}, {LT_GGUF_STRING, 0}, {LT_GGUF_ARRAY, 0}, {LT_GGUF_TYPE_COUNT_, 0}, {0xffffffffu, 0}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        assert_int_equal(lt_gguf_scalar_bytes(want[i].type), want[i].bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(scalar_widths),
        cmocka_unit_test(valid_file_round_trips),
        cmocka_unit_test(every_truncation_is_a_format_error),
        cmocka_unit_test(malformed_files_are_typed_errors),
        cmocka_unit_test(every_read_block_type_maps),
        cmocka_unit_test(random_corruption_and_oom_never_crash),
        cmocka_unit_test(real_smollm2_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
