/* Every class of malformed input in docs/bad-input.md, one test each: the exact status and a
 * fragment of the message (file, key, tensor or line named). Inputs are built here byte by byte
 * (GGUF, safetensors, config.json, tokenizer.json, JSONL); the over-limit line is a sparse file.
 * What needs the CLI (flags, empty dataset, token ids past the model's vocabulary) is
 * tests/cli/test_cli_bad_input.sh. Corrupted checkpoints are test_train.c's. */
#define _POSIX_C_SOURCE 200809L
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
#include "longtune/dataset.h"
#include "longtune/gguf.h"
#include "longtune/model.h"
#include "longtune/safetensors.h"
#include "longtune/tokenizer.h"

static char dir[128];

static const char *tmp_path(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (n) assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

/* Asserts status and that the context's message contains `frag`. */
#define EXPECT(ctx, call, status, frag)                                                          \
    do {                                                                                         \
        lt_status s_ = (call);                                                                   \
        const char *m_ = lt_ctx_error(ctx);                                                      \
        if (s_ != (status) || !strstr(m_, (frag)))                                               \
            fail_msg("%s: got %s \"%s\", expected %s with \"%s\"", #call, lt_status_str(s_), m_, \
                     lt_status_str(status), (frag));                                             \
    } while (0)

/* ---- a tiny GGUF writer ---- */

typedef struct {
    uint8_t b[4096];
    size_t n;
} buf_t;

static void put(buf_t *b, const void *p, size_t n) {
    assert_true(b->n + n <= sizeof b->b);
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void put_kv_str(buf_t *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, 8);
    put_str(b, v);
}
/* Tensor info: name, 1..2 dims, ggml type, offset. */
static void put_tensor(buf_t *b, const char *name, int nd, const uint64_t *dims, uint32_t type, uint64_t off) {
    put_str(b, name);
    put_u32(b, (uint32_t)nd);
    for (int i = 0; i < nd; i++) put_u64(b, dims[i]);
    put_u32(b, type);
    put_u64(b, off);
}
static void put_header(buf_t *b, uint64_t n_tensors, uint64_t n_kv) {
    put(b, "GGUF", 4);
    put_u32(b, 3);
    put_u64(b, n_tensors);
    put_u64(b, n_kv);
}
/* Pads to the default 32-byte alignment and appends `data_bytes` bytes of data. */
static void put_data(buf_t *b, size_t data_bytes) {
    while (b->n % 32) b->b[b->n++] = 0;
    for (size_t i = 0; i < data_bytes; i++) b->b[b->n++] = (uint8_t)i;
}

/* A valid GGUF: general.architecture = arch, one F32 tensor "w" of 4x2. */
static void gguf_valid(buf_t *b, const char *arch) {
    b->n = 0;
    put_header(b, 1, 1);
    put_kv_str(b, "general.architecture", arch);
    uint64_t d[2] = {4, 2};
    put_tensor(b, "w", 2, d, 0, 0);
    put_data(b, 32);
}

static lt_status gguf_open_bytes(lt_ctx *ctx, const buf_t *b, size_t n) {
    const char *p = tmp_path("t.gguf");
    write_bytes(p, b->b, n);
    lt_gguf *g = NULL;
    lt_status s = lt_gguf_open(ctx, p, &g);
    if (g) lt_gguf_close(g);
    return s;
}

static void gguf_truncated(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b;
    gguf_valid(&b, "llama");
    assert_int_equal(gguf_open_bytes(ctx, &b, b.n), LT_OK);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, 10), LT_ERR_FORMAT, "is too short for a GGUF header");
    /* Cut inside the tensor info (after the key-value section). */
    EXPECT(ctx, gguf_open_bytes(ctx, &b, 24 + 8 + 20 + 4 + 8 + 5 + 8), LT_ERR_FORMAT,
           "tensor 0: name runs past the end of the file");
    EXPECT(ctx, gguf_open_bytes(ctx, &b, 24 + 8 + 20 + 4 + 8 + 9 + 4 + 8), LT_ERR_FORMAT, "tensor 'w': truncated info");
    /* Cut inside the data: the tensor runs past the end. */
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n - 1), LT_ERR_FORMAT,
           "tensor 'w': data [0, +32) lies past the end of the file");
    lt_ctx_free(ctx);
}

static void gguf_bad_magic_and_version(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b;
    gguf_valid(&b, "llama");
    b.b[0] = 'X';
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT, "not a GGUF file (bad magic)");
    gguf_valid(&b, "llama");
    b.b[4] = 1;
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_UNSUPPORTED, "GGUF version 1 is not supported");
    lt_ctx_free(ctx);
}

static void gguf_offset_past_end(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b = {0};
    put_header(&b, 1, 0);
    uint64_t d[1] = {8};
    put_tensor(&b, "w", 1, d, 0, 1ull << 40);
    put_data(&b, 32);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT,
           "tensor 'w': data [1099511627776, +32) lies past the end");
    lt_ctx_free(ctx);
}

static void gguf_overflowing_dimensions(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b = {0};
    put_header(&b, 1, 0);
    uint64_t d[2] = {1ull << 40, 1ull << 40};
    put_tensor(&b, "w", 2, d, 0, 0);
    put_data(&b, 32);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT, "tensor 'w': dimension 1 = 1099511627776 overflows");
    b.n = 0;
    put_header(&b, 1, 0);
    uint64_t d2[1] = {1ull << 63};
    put_tensor(&b, "w", 1, d2, 0, 0);
    put_data(&b, 32);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT,
           "tensor 'w': dimension 0 = 9223372036854775808 overflows");
    /* Counts that cannot fit the file. */
    b.n = 0;
    put_header(&b, 1ull << 60, 0);
    put_data(&b, 64);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT, "tensors cannot fit in a");
    lt_ctx_free(ctx);
}

static void gguf_wrong_dtype(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b = {0};
    put_header(&b, 1, 0);
    uint64_t d[1] = {8};
    put_tensor(&b, "w", 1, d, 200, 0);
    put_data(&b, 32);
    const char *p = tmp_path("dtype.gguf");
    write_bytes(p, b.b, b.n);
    lt_gguf *g = NULL;
    lt_status s = lt_gguf_open(ctx, p, &g);
    if (s == LT_OK) {
        lt_tensor t;
        EXPECT(ctx, lt_gguf_find_tensor(ctx, g, "w", &t), LT_ERR_UNSUPPORTED,
               "GGUF tensor 'w' has unknown ggml type 200");
        lt_gguf_close(g);
    } else {
        EXPECT(ctx, s, LT_ERR_FORMAT, "tensor 'w'");
    }
    lt_ctx_free(ctx);
}

static void gguf_duplicates(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b = {0};
    put_header(&b, 2, 0);
    uint64_t d[1] = {8};
    put_tensor(&b, "w", 1, d, 0, 0);
    put_tensor(&b, "w", 1, d, 0, 32);
    put_data(&b, 64);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT, "duplicate tensor name 'w'");
    b.n = 0;
    put_header(&b, 0, 2);
    put_kv_str(&b, "general.architecture", "llama");
    put_kv_str(&b, "general.architecture", "qwen2");
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT, "duplicate key 'general.architecture'");
    lt_ctx_free(ctx);
}

/* Tensors sharing bytes: every tensor at offset 0 would alias all the weights. */
static void gguf_overlapping_tensors(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b;
    b.n = 0;
    put_header(&b, 3, 0);
    uint64_t d[2] = {4, 2};
    put_tensor(&b, "a", 2, d, 0, 0);
    put_tensor(&b, "b", 2, d, 0, 0);
    put_tensor(&b, "c", 2, d, 0, 32);
    put_data(&b, 64);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT,
           "tensors 'a' and 'b' overlap (data [0, +32) and [0, +32))");
    /* Back to back is fine. */
    b.n = 0;
    put_header(&b, 2, 0);
    put_tensor(&b, "a", 2, d, 0, 0);
    put_tensor(&b, "b", 2, d, 0, 32);
    put_data(&b, 64);
    assert_int_equal(gguf_open_bytes(ctx, &b, b.n), LT_OK);
    lt_ctx_free(ctx);
}

static void gguf_string_past_end(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b = {0};
    put_header(&b, 0, 1);
    put_str(&b, "general.name");
    put_u32(&b, 8);
    put_u64(&b, 1000); /* string length past the end */
    put(&b, "abc", 3);
    EXPECT(ctx, gguf_open_bytes(ctx, &b, b.n), LT_ERR_FORMAT,
           "key 'general.name': string runs past the end of the file");
    lt_ctx_free(ctx);
}

static void gguf_unknown_architecture(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    buf_t b;
    gguf_valid(&b, "gpt2");
    const char *p = tmp_path("arch.gguf");
    write_bytes(p, b.b, b.n);
    lt_model *m = NULL;
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    EXPECT(ctx, lt_model_load(ctx, p, &mo, NULL, &m), LT_ERR_UNSUPPORTED,
           "GGUF architecture 'gpt2' is not supported (llama, qwen2, qwen3, phi3, gemma2, gemma3, qwen3moe, qwen2moe)");
    assert_null(m);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* ---- safetensors ---- */

static lt_status st_open_header(lt_ctx *ctx, const char *json, size_t data_bytes, int64_t claimed_len) {
    uint8_t b[2048];
    size_t hl = strlen(json);
    uint64_t len = claimed_len >= 0 ? (uint64_t)claimed_len : hl;
    memcpy(b, &len, 8);
    memcpy(b + 8, json, hl);
    memset(b + 8 + hl, 0x3f, data_bytes);
    const char *p = tmp_path("t.safetensors");
    write_bytes(p, b, 8 + hl + data_bytes);
    lt_safetensors *st = NULL;
    lt_status s = lt_safetensors_open(ctx, p, &st);
    if (st) lt_safetensors_close(ctx, st);
    return s;
}

static void safetensors_malformed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *ok = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    assert_int_equal(st_open_header(ctx, ok, 16, -1), LT_OK);
    /* Truncated: the file ends inside the data. */
    EXPECT(ctx, st_open_header(ctx, ok, 8, -1), LT_ERR_FORMAT,
           "tensor 'w': data_offsets [0, 16] outside the 8 data bytes");
    /* Truncated: header length past the end. */
    EXPECT(ctx, st_open_header(ctx, ok, 16, 1 << 20), LT_ERR_FORMAT, "header length 1048576 does not fit the file");
    EXPECT(ctx, st_open_header(ctx, "", 0, 0), LT_ERR_FORMAT, "header length 0 does not fit the file (8 bytes)");
    write_bytes(tmp_path("short.safetensors"), "\x10\0\0", 3);
    lt_safetensors *st = NULL;
    EXPECT(ctx, lt_safetensors_open(ctx, tmp_path("short.safetensors"), &st), LT_ERR_FORMAT,
           "3 bytes is too short for a safetensors header");
    /* Offsets past the end. */
    EXPECT(ctx, st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4096,4104]}}", 16, -1),
           LT_ERR_FORMAT, "tensor 'w': data_offsets [4096, 4104] outside the 16 data bytes");
    /* Overflowing dimensions. */
    EXPECT(ctx,
           st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}",
                          16, -1),
           LT_ERR_FORMAT, "tensor 'w': shape overflows");
    EXPECT(ctx, st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,16]}}", 16, -1),
           LT_ERR_FORMAT, "tensor 'w': bad shape[0]");
    /* Size that disagrees with the shape. */
    EXPECT(ctx, st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, -1),
           LT_ERR_FORMAT, "tensor 'w': 16 bytes of data for 3 F32 elements");
    /* Wrong dtype. */
    EXPECT(ctx, st_open_header(ctx, "{\"w\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, -1),
           LT_ERR_UNSUPPORTED, "tensor 'w': dtype I64 (only F32, F16, BF16)");
    /* Duplicate tensor names. */
    EXPECT(ctx,
           st_open_header(ctx,
                          "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                          16, -1),
           LT_ERR_FORMAT, "duplicate tensor name 'w'");
    /* Overlapping tensors. */
    EXPECT(ctx,
           st_open_header(ctx,
                          "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                          16, -1),
           LT_ERR_FORMAT, "tensors 'a' and 'b' overlap");
    /* A zero-size tensor holds no bytes: at [0,0] beside a tensor at [0,8] it overlaps nothing. */
    assert_int_equal(st_open_header(ctx,
                                    "{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                                    "\"z\":{\"dtype\":\"F32\",\"shape\":[2,0],\"data_offsets\":[4,4]}}",
                                    8, -1),
                     LT_OK);
    /* Trailing garbage after the header's JSON (space padding is the format's and is accepted). */
    EXPECT(ctx, st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}} xyz", 16, -1),
           LT_ERR_FORMAT, "3 bytes of trailing data after the header's JSON object (byte 58)");
    assert_int_equal(st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    ", 16,
                                    -1),
                     LT_OK);
    /* Missing keys. */
    EXPECT(ctx, st_open_header(ctx, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 16, -1), LT_ERR_FORMAT,
           "tensor 'w': needs dtype, shape and two data_offsets");
    /* Not JSON / invalid UTF-8 that breaks the JSON. */
    EXPECT(ctx, st_open_header(ctx, "{\"w\": \xff\xfe}", 16, -1), LT_ERR_FORMAT, "header is not a JSON object");
    lt_ctx_free(ctx);
}

static void safetensors_index_malformed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    float x[2] = {1, 2};
    int64_t sh[1] = {2};
    lt_safetensors_entry e = {"x", lt_tensor_view(x, LT_DTYPE_F32, LT_DEVICE_CPU, 1, sh)};
    assert_int_equal(lt_safetensors_write(ctx, tmp_path("a.safetensors"), &e, 1, NULL, 0), LT_OK);
    const char *idx = tmp_path("model.safetensors.index.json");
    lt_safetensors *st = NULL;
    write_text(idx, "{\"weight_map\": {\"x\": \"a.safetensors\"}}");
    assert_int_equal(lt_safetensors_open(ctx, idx, &st), LT_OK);
    lt_safetensors_close(ctx, st);
    write_text(idx, "{\"metadata\": {}}");
    EXPECT(ctx, lt_safetensors_open(ctx, idx, &st), LT_ERR_FORMAT, "no \"weight_map\" object");
    write_text(idx, "{\"weight_map\": {\"x\": \"../a.safetensors\"}}");
    EXPECT(ctx, lt_safetensors_open(ctx, idx, &st), LT_ERR_FORMAT, "weight_map['x'] is not a file name in the folder");
    write_text(idx, "{\"weight_map\": {\"x\": \"a.safetensors\", \"y\": \"a.safetensors\"}}");
    EXPECT(ctx, lt_safetensors_open(ctx, idx, &st), LT_ERR_NOT_FOUND, "tensor 'y' is not in shard a.safetensors");
    write_text(idx, "{\"weight_map\": {\"x\": \"missing.safetensors\"}}");
    EXPECT(ctx, lt_safetensors_open(ctx, idx, &st), LT_ERR_NOT_FOUND, "missing.safetensors: cannot open");
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* ---- config.json ---- */

static void config_malformed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *p = tmp_path("config.json");
    lt_model_config cfg;
    write_text(p, "{\"model_type\": \"gpt2\", \"vocab_size\": 10}");
    EXPECT(
        ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_UNSUPPORTED,
        "model_type \"gpt2\" is not supported (llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text, gemma3, qwen3_moe, qwen2_moe, mixtral)");
    write_text(p, "{\"model_type\": \"llama\", \"vocab_size\": 10}");
    EXPECT(ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_FORMAT, "missing key \"hidden_size\"");
    write_text(p, "{\"model_type\": \"llama\", \"vocab_size\": \"ten\"}");
    EXPECT(ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_FORMAT, "\"vocab_size\" must be a non-negative integer");
    write_text(p, "[1, 2");
    EXPECT(ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_FORMAT, "not a JSON object");
    write_text(p, "{\"model_type\": \"ll\xff\xfe\"}");
    EXPECT(
        ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_UNSUPPORTED,
        "is not supported (llama, qwen2, qwen3, mistral, phi3, gemma2, gemma3_text, gemma3, qwen3_moe, qwen2_moe, mixtral)");
    lt_ctx_free(ctx);
}

/* ---- tokenizer ---- */

static void tokenizer_malformed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *p = tmp_path("tokenizer.json");
    lt_tokenizer *tok = NULL;
    write_text(p, "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    EXPECT(ctx, lt_tokenizer_load_json(ctx, p, &tok), LT_ERR_UNSUPPORTED, "WordPiece");
    write_text(p, "{\"version\": \"1.0\"");
    EXPECT(ctx, lt_tokenizer_load_json(ctx, p, &tok), LT_ERR_FORMAT, "tokenizer.json");
    assert_null(tok);
    char real[512];
    snprintf(real, sizeof real, "%s/tests/fixtures/tokenizer/bpe-nfc/tokenizer.json", lt_test_source_dir());
    assert_int_equal(lt_tokenizer_load_json(ctx, real, &tok), LT_OK);
    /* Out-of-range token ids. */
    int32_t ids[3] = {5, lt_tokenizer_vocab_size(tok), 7};
    char frag[64];
    snprintf(frag, sizeof frag, "token id %d at position 1 is not in the vocabulary (size %d)", ids[1], ids[1]);
    char *out = NULL;
    size_t ol = 0;
    EXPECT(ctx, lt_tokenizer_decode(ctx, tok, ids, 3, 0, &out, &ol), LT_ERR_INVALID_ARG, frag);
    ids[1] = -1;
    snprintf(frag, sizeof frag, "token id -1 at position 1 is not in the vocabulary");
    EXPECT(ctx, lt_tokenizer_decode(ctx, tok, ids, 3, 0, &out, &ol), LT_ERR_INVALID_ARG, frag);
    /* Invalid UTF-8 text becomes U+FFFD per ill-formed subpart (as Python's errors="replace"). */
    static const char bad[] = "a\xff\xfe b\xc3";
    int32_t *enc = NULL;
    size_t n = 0;
    assert_int_equal(lt_tokenizer_encode(ctx, tok, bad, sizeof bad - 1, 0, &enc, &n), LT_OK);
    assert_int_equal(lt_tokenizer_decode(ctx, tok, enc, n, 0, &out, &ol), LT_OK);
    assert_string_equal(out, "a\xEF\xBF\xBD\xEF\xBF\xBD b\xEF\xBF\xBD");
    free(out);
    free(enc);
    lt_tokenizer_free(tok);
    lt_ctx_free(ctx);
}

/* ---- datasets ---- */

static lt_tokenizer *fixture_tokenizer(lt_ctx *ctx) {
    char real[512];
    snprintf(real, sizeof real, "%s/tests/fixtures/tokenizer/bpe-nfc/tokenizer.json", lt_test_source_dir());
    lt_tokenizer *tok = NULL;
    assert_int_equal(lt_tokenizer_load_json(ctx, real, &tok), LT_OK);
    return tok;
}

static void dataset_malformed(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_tokenizer *tok = fixture_tokenizer(ctx);
    const char *p = tmp_path("train.jsonl");
    lt_dataset_options opt;
    memset(&opt, 0, sizeof opt);
    lt_dataset *ds = NULL;
    write_text(p, "{\"text\": \"ok\"}\n{\"text\": \"ok\"\n");
    EXPECT(ctx, lt_dataset_load(ctx, p, tok, &opt, &ds), LT_ERR_FORMAT, "train.jsonl:2:");
    write_text(p, "{\"text\": \"ok\"}\n\n{\"prompt\": \"only a prompt\"}\n");
    EXPECT(ctx, lt_dataset_load(ctx, p, tok, &opt, &ds), LT_ERR_FORMAT, "train.jsonl:3:");
    write_text(p, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n");
    EXPECT(ctx, lt_dataset_load(ctx, p, tok, &opt, &ds), LT_ERR_FORMAT, "messages[0].content");
    write_text(p, "[1, 2, 3]\n");
    EXPECT(ctx, lt_dataset_load(ctx, p, tok, &opt, &ds), LT_ERR_FORMAT, "train.jsonl:1:");
    EXPECT(ctx, lt_dataset_load(ctx, tmp_path("absent.jsonl"), tok, &opt, &ds), LT_ERR_NOT_FOUND, "absent.jsonl");
    /* Invalid UTF-8 inside a JSON string: accepted, each ill-formed subpart becomes U+FFFD. */
    write_text(p, "{\"text\": \"caf\xe9 \xff\"}\n");
    assert_int_equal(lt_dataset_load(ctx, p, tok, &opt, &ds), LT_OK);
    assert_int_equal(lt_dataset_get_stats(ds).records, 1);
    lt_dataset_free(ctx, ds);
    /* An empty file (or only blank lines) is an empty dataset, not an error here: the trainer
     * refuses it (tests/cli/test_cli_bad_input.sh). */
    write_text(p, "\n\n");
    assert_int_equal(lt_dataset_load(ctx, p, tok, &opt, &ds), LT_OK);
    assert_int_equal(lt_dataset_get_stats(ds).records, 0);
    lt_dataset_free(ctx, ds);
    /* Only regular files: /dev/zero would stream NUL bytes forever, a folder reads as an error. */
    EXPECT(ctx, lt_dataset_load(ctx, "/dev/zero", tok, &opt, &ds), LT_ERR_INVALID_ARG,
           "/dev/zero: is not a regular file (a device, FIFO or socket), not a JSONL file");
    EXPECT(ctx, lt_dataset_load(ctx, dir, tok, &opt, &ds), LT_ERR_INVALID_ARG, ": is a folder, not a JSONL file");
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Lines at and over the 16 MiB limit, in a sparse file (the line is NUL bytes: no RAM or disk
 * spent). The reader returns a line of exactly the limit, refuses one byte more with a typed error
 * naming the line, and carries on after it. */
static void jsonl_line_limit(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const size_t lim = LT_JSONL_DEFAULT_MAX_LINE;
    const char *p = tmp_path("long.jsonl");
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fseeko(f, (off_t)lim, SEEK_SET), 0);
    fputc('\n', f);
    assert_int_equal(fseeko(f, (off_t)(2 * lim + 2), SEEK_SET), 0);
    fputs("\n{\"text\": \"after\"}\n", f);
    fclose(f);
    lt_jsonl *r = NULL;
    assert_int_equal(lt_jsonl_open(ctx, p, 0, &r), LT_OK);
    const char *line;
    size_t len;
    int64_t no;
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
    assert_int_equal(len, lim);
    assert_int_equal(no, 1);
    EXPECT(ctx, lt_jsonl_next(ctx, r, &line, &len, &no), LT_ERR_FORMAT,
           "long.jsonl:2: line longer than 16777216 bytes");
    assert_int_equal(lt_jsonl_next(ctx, r, &line, &len, &no), LT_OK);
    assert_non_null(line);
    assert_int_equal(no, 3);
    assert_string_equal(line, "{\"text\": \"after\"}");
    lt_jsonl_close(ctx, r);
    /* Through the dataset reader: the over-limit line is a typed error, or skipped on request. */
    lt_tokenizer *tok = fixture_tokenizer(ctx);
    lt_dataset_options opt;
    memset(&opt, 0, sizeof opt);
    opt.max_line_bytes = 1024;
    lt_dataset *ds = NULL;
    EXPECT(ctx, lt_dataset_load(ctx, p, tok, &opt, &ds), LT_ERR_FORMAT, "long.jsonl:1: line longer than 1024 bytes");
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/lt_test_bad_input_%ld", (long)getpid());
    mkdir(dir, 0755);
    return 0;
}

/* ---- U+0000 in JSON strings: refused (cJSON's C strings would drop the text after it) ---- */

static void json_nul(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_record rec;
    memset(&rec, 0, sizeof rec);
    const char esc[] = "{\"text\": \"before\\u0000after\"}";
    EXPECT(ctx, lt_record_parse(ctx, esc, sizeof esc - 1, "t.jsonl", 7, &rec), LT_ERR_FORMAT,
           "t.jsonl:7: string contains U+0000");
    const char raw[] = "{\"text\": \"before\0after\"}";
    EXPECT(ctx, lt_record_parse(ctx, raw, sizeof raw - 1, "t.jsonl", 8, &rec), LT_ERR_FORMAT,
           "t.jsonl:8: string contains U+0000");
    /* An escaped backslash before u0000 is the text \u0000, kept whole. */
    const char lit[] = "{\"text\": \"a\\\\u0000b\"}";
    assert_int_equal(lt_record_parse(ctx, lit, sizeof lit - 1, "t.jsonl", 9, &rec), LT_OK);
    assert_string_equal(rec.text, "a\\u0000b");
    lt_record_free(ctx, &rec);
    const char *p = tmp_path("config.json");
    lt_model_config cfg;
    const char cj[] = "{\"model_type\": \"llama\",\n\"x\": \"a\0b\"}";
    write_bytes(p, cj, sizeof cj - 1);
    EXPECT(ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_FORMAT, "config.json: line 2: string contains U+0000");
    const char *tp = tmp_path("tokenizer.json");
    write_text(tp, "{\"model\": {\"type\": \"BPE\",\n\n \"vocab\": {\"a\\u0000\": 0}}}");
    lt_tokenizer *tok = NULL;
    EXPECT(ctx, lt_tokenizer_load_json(ctx, tp, &tok), LT_ERR_FORMAT, "tokenizer.json: line 3: string contains U+0000");
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* ---- configuration bounds (config.json, GGUF metadata) ---- */

static const char *cfg_json(char *buf, size_t n, const char *key, const char *value) {
    static const char *const base[][2] = {{"model_type", "\"llama\""},  {"vocab_size", "96"},
                                          {"hidden_size", "16"},        {"intermediate_size", "32"},
                                          {"num_hidden_layers", "2"},   {"num_attention_heads", "2"},
                                          {"num_key_value_heads", "1"}, {"rms_norm_eps", "1e-5"},
                                          {"rope_theta", "10000"}};
    size_t u = (size_t)snprintf(buf, n, "{");
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        u += (size_t)snprintf(buf + u, n - u, "%s\"%s\": %s", i ? ", " : "", base[i][0],
                              !strcmp(base[i][0], key) ? value : base[i][1]);
    snprintf(buf + u, n - u, "}");
    return buf;
}

static void config_bounds(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *p = tmp_path("config.json");
    lt_model_config cfg;
    char j[1024];
    write_text(p, cfg_json(j, sizeof j, "", ""));
    assert_int_equal(lt_model_config_read_hf(ctx, p, &cfg), LT_OK);
    static const char *const cases[][3] = {
        {"num_hidden_layers", "4e15", "num_hidden_layers = 4000000000000000 is outside [1, 1024]"},
        {"num_hidden_layers", "1025", "num_hidden_layers = 1025 is outside [1, 1024]"},
        {"hidden_size", "2097152", "hidden_size = 2097152 is outside [1, 1048576]"},
        {"intermediate_size", "8388608", "intermediate_size = 8388608 is outside [1, 4194304]"},
        {"vocab_size", "16777217", "vocab_size = 16777217 is outside [1, 16777216]"},
        {"num_attention_heads", "8192", "num_attention_heads = 8192 is outside [1, 4096]"},
        {"num_key_value_heads", "3", "num_key_value_heads = 3 is outside [1, 2]"},
        {"rms_norm_eps", "1e308", "rms_norm_eps = 1e+308 is outside (0, 1]"},
        {"rope_theta", "1e-308", "rope_theta = 1e-308 is outside [1, 1e+12]"},
        {"rope_theta", "1e300", "rope_theta = 1e+300 is outside [1, 1e+12]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(p, cfg_json(j, sizeof j, cases[i][0], cases[i][1]));
        EXPECT(ctx, lt_model_config_read_hf(ctx, p, &cfg), LT_ERR_FORMAT, cases[i][2]);
    }
    /* A caller's own struct: the size tables refuse it instead of overflowing. */
    write_text(p, cfg_json(j, sizeof j, "", ""));
    assert_int_equal(lt_model_config_read_hf(ctx, p, &cfg), LT_OK);
    cfg.L = 4000000000000000LL;
    lt_model_run_options run = {.B = 1, .T = 16, .device = LT_DEVICE_CPU};
    lt_model_sizes tab;
    EXPECT(ctx, lt_model_size_table(ctx, &cfg, NULL, &run, &tab), LT_ERR_FORMAT,
           "model layout: num_hidden_layers = 4000000000000000 is outside [1, 1024]");
    lt_ctx_free(ctx);
}

/* A GGUF of general.architecture llama with the given extra key/values (u32 or f32) and a
 * token_embd.weight of 4 x 8. */
typedef struct {
    const char *key;
    int is_f32;
    double v;
} gg_kv;

static const char *gguf_config(const gg_kv *extra, int n_extra) {
    static const gg_kv base[] = {{"llama.block_count", 0, 1},
                                 {"llama.embedding_length", 0, 8},
                                 {"llama.feed_forward_length", 0, 16},
                                 {"llama.attention.head_count", 0, 2}};
    const gg_kv *kvs[8];
    int n = 0;
    for (int i = 0; i < 4; i++) {
        int overridden = 0;
        for (int e = 0; e < n_extra; e++) overridden |= !strcmp(extra[e].key, base[i].key);
        if (!overridden) kvs[n++] = &base[i];
    }
    for (int e = 0; e < n_extra; e++) kvs[n++] = &extra[e];
    buf_t b;
    b.n = 0;
    put_header(&b, 1, (uint64_t)(1 + n));
    put_kv_str(&b, "general.architecture", "llama");
    for (int i = 0; i < n; i++) {
        put_str(&b, kvs[i]->key);
        if (kvs[i]->is_f32) {
            put_u32(&b, 6);
            float f = (float)kvs[i]->v;
            put(&b, &f, 4);
        } else {
            put_u32(&b, 4);
            put_u32(&b, (uint32_t)kvs[i]->v);
        }
    }
    uint64_t d[2] = {8, 4};
    put_tensor(&b, "token_embd.weight", 2, d, 0, 0);
    put_data(&b, 128);
    const char *p = tmp_path("cfg.gguf");
    write_bytes(p, b.b, b.n);
    return p;
}

static void gguf_config_bounds(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    lt_model_config cfg;
    lt_model_options mo = {.device = LT_DEVICE_CPU};
    gg_kv eps_inf = {"llama.attention.layer_norm_rms_epsilon", 1, INFINITY};
    EXPECT(ctx, lt_model_inspect(ctx, gguf_config(&eps_inf, 1), &mo, &cfg), LT_ERR_FORMAT,
           "metadata 'llama.attention.layer_norm_rms_epsilon' = inf is outside (0, 1]");
    gg_kv theta_inf = {"llama.rope.freq_base", 1, INFINITY};
    EXPECT(ctx, lt_model_inspect(ctx, gguf_config(&theta_inf, 1), &mo, &cfg), LT_ERR_FORMAT,
           "metadata 'llama.rope.freq_base' = inf is outside [1, 1e+12]");
    gg_kv layers = {"llama.block_count", 0, 5000};
    EXPECT(ctx, lt_model_inspect(ctx, gguf_config(&layers, 1), &mo, &cfg), LT_ERR_FORMAT,
           "metadata 'llama.block_count' = 5000 is outside [1, 1024]");
    gg_kv kv3 = {"llama.attention.head_count_kv", 0, 3};
    EXPECT(ctx, lt_model_inspect(ctx, gguf_config(&kv3, 1), &mo, &cfg), LT_ERR_FORMAT,
           "metadata 'llama.attention.head_count_kv' = 3 is outside [1, 2]");
    /* Head dim 0 (width 8 over 16 heads) is named, not reported as partial RoPE of 0 dims. */
    gg_kv rope[2] = {{"llama.attention.key_length", 0, 0}, {"llama.rope.dimension_count", 0, 32}};
    EXPECT(ctx, lt_model_inspect(ctx, gguf_config(rope, 2), &mo, &cfg), LT_ERR_FORMAT,
           "head dim 0 (metadata 'llama.attention.key_length', or embedding_length 8 / head_count 2) is not positive");
    /* The reader's own message survives the loader's wrapping (a float where an integer goes). */
    gg_kv ctxlen = {"llama.context_length", 1, 4096};
    EXPECT(ctx, lt_model_inspect(ctx, gguf_config(&ctxlen, 1), &mo, &cfg), LT_ERR_FORMAT,
           "cfg.gguf: metadata 'llama.context_length': GGUF key 'llama.context_length' has type");
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

/* Vocabulary ids are bounded by the vocabulary's size (model.vocab plus added_tokens entries): one
 * id of 2,147,483,646 in a small file would otherwise size a table of 2^31 entries. */
static void tokenizer_ids_bounded(void **state) {
    (void)state;
    lt_ctx *ctx = lt_ctx_new();
    const char *p = tmp_path("tokenizer.json");
    lt_tokenizer *tok = NULL;
    write_text(p,
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2147483646, \"c\": 1}, \"merges\": []}}");
    EXPECT(ctx, lt_tokenizer_load_json(ctx, p, &tok), LT_ERR_FORMAT,
           "tokenizer.json: model.vocab['b'] has id 2147483646, past the vocabulary's 3 entries (model.vocab and "
           "added_tokens)");
    assert_null(tok);
    write_text(p,
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
               " \"added_tokens\": [{\"id\": 70000, \"content\": \"<x>\", \"special\": true}]}");
    EXPECT(ctx, lt_tokenizer_load_json(ctx, p, &tok), LT_ERR_FORMAT,
           "tokenizer.json: added_tokens[0] '<x>' has id 70000, past the vocabulary's 3 entries");
    /* Ids up to entries - 1 are fine (an added token beyond the model's vocabulary). */
    write_text(p,
               "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []},"
               " \"added_tokens\": [{\"id\": 2, \"content\": \"<x>\", \"special\": true}]}");
    assert_int_equal(lt_tokenizer_load_json(ctx, p, &tok), LT_OK);
    assert_int_equal(lt_tokenizer_vocab_size(tok), 3);
    lt_tokenizer_free(tok);
    assert_int_equal(lt_mem_get_stats(ctx, LT_DEVICE_CPU).used_bytes, 0);
    lt_ctx_free(ctx);
}

static int teardown(void **state) {
    (void)state;
    return lt_test_rm_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gguf_truncated),
        cmocka_unit_test(gguf_bad_magic_and_version),
        cmocka_unit_test(gguf_offset_past_end),
        cmocka_unit_test(gguf_overflowing_dimensions),
        cmocka_unit_test(gguf_wrong_dtype),
        cmocka_unit_test(gguf_duplicates),
        cmocka_unit_test(gguf_overlapping_tensors),
        cmocka_unit_test(gguf_string_past_end),
        cmocka_unit_test(gguf_unknown_architecture),
        cmocka_unit_test(safetensors_malformed),
        cmocka_unit_test(safetensors_index_malformed),
        cmocka_unit_test(config_malformed),
        cmocka_unit_test(tokenizer_malformed),
        cmocka_unit_test(dataset_malformed),
        cmocka_unit_test(jsonl_line_limit),
        cmocka_unit_test(json_nul),
        cmocka_unit_test(config_bounds),
        cmocka_unit_test(gguf_config_bounds),
        cmocka_unit_test(tokenizer_ids_bounded),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
