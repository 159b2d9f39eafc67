/* GGUF writer (version 3, alignment 32): metadata and tensor infos are collected first, so the
 * file's size and every offset are known before a byte is written; the tensor data then streams
 * in declaration order. The file is written to a temporary beside the target, fsynced and renamed
 * over it, so a failed export never leaves a half file. It does not convert or quantize data: the
 * caller hands over bytes in the declared dtype. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "longtune/alloc.h"
#include "longtune/gguf.h"

#define GW_ALIGN 32u
#define GW_NAME_MAX 64 /* llama.cpp's GGML_MAX_NAME, NUL included */

typedef struct gw_tensor {
    char name[GW_NAME_MAX];
    int ndim;
    int64_t ne[LT_MAX_DIMS]; /* GGUF order */
    uint32_t ggml_type;
    uint64_t offset, nbytes;
} gw_tensor;

struct lt_gguf_writer {
    lt_ctx *ctx;
    uint8_t *kv; /* serialized key/values */
    size_t kv_len, kv_cap;
    uint64_t n_kv;
    gw_tensor *t;
    int64_t n_t, cap_t;
    uint64_t data_bytes; /* aligned sum */
    /* writing */
    FILE *f;
    char path[4096], tmp[4160];
    int64_t cur;        /* tensor being written */
    uint64_t cur_done;  /* bytes of it written */
    uint64_t data_done; /* bytes of the data section written, padding included */
};

int lt_gguf_ggml_type_of(lt_dtype t) {
    switch (t) {
    case LT_DTYPE_F32: return 0;
    case LT_DTYPE_F16: return 1;
    case LT_DTYPE_Q4_0: return 2;
    case LT_DTYPE_Q4_1: return 3;
    case LT_DTYPE_Q5_0: return 6;
    case LT_DTYPE_Q5_1: return 7;
    case LT_DTYPE_Q8_0: return 8;
    case LT_DTYPE_Q2_K: return 10;
    case LT_DTYPE_Q3_K: return 11;
    case LT_DTYPE_Q4_K: return 12;
    case LT_DTYPE_Q5_K: return 13;
    case LT_DTYPE_Q6_K: return 14;
    case LT_DTYPE_IQ4_NL: return 20;
    case LT_DTYPE_IQ4_XS: return 23;
    case LT_DTYPE_BF16: return 30;
    default: return -1;
    }
}

lt_status lt_gguf_writer_new(lt_ctx *ctx, lt_gguf_writer **out) {
    *out = lt_calloc(ctx, LT_DEVICE_CPU, sizeof **out, "gguf writer");
    if (!*out) return lt_ctx_status(ctx);
    (*out)->ctx = ctx;
    (*out)->cur = -1;
    return LT_OK;
}

void lt_gguf_writer_free(lt_gguf_writer *w) {
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        unlink(w->tmp);
    }
    if (w->kv) lt_free(w->ctx, LT_DEVICE_CPU, w->kv, w->kv_cap);
    if (w->t) lt_free(w->ctx, LT_DEVICE_CPU, w->t, (size_t)w->cap_t * sizeof *w->t);
    lt_free(w->ctx, LT_DEVICE_CPU, w, sizeof *w);
}

static lt_status kv_reserve(lt_ctx *ctx, lt_gguf_writer *w, size_t more) {
    if (more > SIZE_MAX / 2 - w->kv_len) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: metadata too large");
    if (w->kv_len + more <= w->kv_cap) return LT_OK;
    size_t cap = w->kv_cap ? w->kv_cap : 4096;
    while (cap < w->kv_len + more) cap *= 2;
    uint8_t *n = lt_alloc(ctx, LT_DEVICE_CPU, cap, "gguf writer metadata");
    if (!n) return lt_ctx_status(ctx);
    if (w->kv) {
        memcpy(n, w->kv, w->kv_len);
        lt_free(ctx, LT_DEVICE_CPU, w->kv, w->kv_cap);
    }
    w->kv = n;
    w->kv_cap = cap;
    return LT_OK;
}

static void put(lt_gguf_writer *w, const void *p, size_t n) {
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
}
static void put_u32(lt_gguf_writer *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(lt_gguf_writer *w, uint64_t v) { put(w, &v, 8); }

/* Walks the serialized metadata looking for key; 1 when present. */
int lt_gguf_writer_has_key(const lt_gguf_writer *w, const char *key) {
    size_t at = 0, kl = strlen(key);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        uint64_t len, skip;
        memcpy(&len, w->kv + at, 8);
        int same = len == kl && !memcmp(w->kv + at + 8, key, kl);
        at += 8 + len;
        uint32_t type;
        memcpy(&type, w->kv + at, 4);
        at += 4;
        memcpy(&skip, w->kv + at, 8); /* every entry records its value's size after its type */
        at += 8 + skip;
        if (same) return 1;
    }
    return 0;
}

/* Starts an entry: key, type and a placeholder for the value's size (the in-memory form keeps
 * it so lookups can skip entries; it is dropped when the file is written). */
static lt_status begin_kv(lt_ctx *ctx, lt_gguf_writer *w, const char *key, lt_gguf_type type, size_t value_bytes,
                          size_t *size_at) {
    if (w->f) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: metadata '%s' added after begin", key);
    size_t kl = key ? strlen(key) : 0;
    if (kl == 0 || kl > 65535) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: bad metadata key '%s'", key);
    if (lt_gguf_writer_has_key(w, key))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: metadata key '%s' set twice", key);
    if (value_bytes > SIZE_MAX / 4) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: '%s' too large", key);
    LT_TRY(kv_reserve(ctx, w, 8 + kl + 4 + 8 + value_bytes));
    put_u64(w, kl);
    put(w, key, kl);
    put_u32(w, (uint32_t)type);
    *size_at = w->kv_len;
    put_u64(w, (uint64_t)value_bytes);
    w->n_kv++;
    return LT_OK;
}

static lt_status set_scalar(lt_ctx *ctx, lt_gguf_writer *w, const char *key, lt_gguf_type type, const void *v,
                            size_t n) {
    size_t at;
    LT_TRY(begin_kv(ctx, w, key, type, n, &at));
    put(w, v, n);
    return LT_OK;
}

lt_status lt_gguf_writer_set_u32(lt_ctx *ctx, lt_gguf_writer *w, const char *key, uint32_t v) {
    return set_scalar(ctx, w, key, LT_GGUF_U32, &v, 4);
}
lt_status lt_gguf_writer_set_i32(lt_ctx *ctx, lt_gguf_writer *w, const char *key, int32_t v) {
    return set_scalar(ctx, w, key, LT_GGUF_I32, &v, 4);
}
lt_status lt_gguf_writer_set_u64(lt_ctx *ctx, lt_gguf_writer *w, const char *key, uint64_t v) {
    return set_scalar(ctx, w, key, LT_GGUF_U64, &v, 8);
}
lt_status lt_gguf_writer_set_f32(lt_ctx *ctx, lt_gguf_writer *w, const char *key, float v) {
    return set_scalar(ctx, w, key, LT_GGUF_F32, &v, 4);
}
lt_status lt_gguf_writer_set_bool(lt_ctx *ctx, lt_gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    return set_scalar(ctx, w, key, LT_GGUF_BOOL, &b, 1);
}
lt_status lt_gguf_writer_set_str(lt_ctx *ctx, lt_gguf_writer *w, const char *key, const char *s, size_t len) {
    size_t at;
    LT_TRY(begin_kv(ctx, w, key, LT_GGUF_STRING, 8 + len, &at));
    put_u64(w, len);
    put(w, s, len);
    return LT_OK;
}

lt_status lt_gguf_writer_set_array(lt_ctx *ctx, lt_gguf_writer *w, const char *key, lt_gguf_type elem, const void *data,
                                   uint64_t n) {
    size_t eb = (size_t)lt_gguf_scalar_bytes(elem);
    if (!eb) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: '%s': array of type %d", key, (int)elem);
    if (n > (SIZE_MAX / 4) / eb) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: '%s' too large", key);
    size_t at;
    LT_TRY(begin_kv(ctx, w, key, LT_GGUF_ARRAY, 4 + 8 + (size_t)n * eb, &at));
    put_u32(w, (uint32_t)elem);
    put_u64(w, n);
    if (n) put(w, data, (size_t)n * eb);
    return LT_OK;
}

lt_status lt_gguf_writer_set_array_str(lt_ctx *ctx, lt_gguf_writer *w, const char *key, const char *const *s,
                                       const size_t *lens, uint64_t n) {
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : strlen(s[i]);
        if (l > SIZE_MAX / 8 - total) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: '%s' too large", key);
        total += 8 + l;
    }
    size_t at;
    LT_TRY(begin_kv(ctx, w, key, LT_GGUF_ARRAY, total, &at));
    put_u32(w, (uint32_t)LT_GGUF_STRING);
    put_u64(w, n);
    for (uint64_t i = 0; i < n; i++) {
        size_t l = lens ? lens[i] : strlen(s[i]);
        put_u64(w, l);
        put(w, s[i], l);
    }
    return LT_OK;
}

/* Appends one element of a numeric array read through the reader's converting accessors. */
static void put_elem(lt_gguf_writer *w, lt_gguf_type t, int64_t iv, double fv) {
    switch (t) {
    case LT_GGUF_U8:
    case LT_GGUF_I8:
    case LT_GGUF_BOOL: {
        uint8_t v = (uint8_t)iv;
        put(w, &v, 1);
        break;
    }
    case LT_GGUF_U16:
    case LT_GGUF_I16: {
        uint16_t v = (uint16_t)iv;
        put(w, &v, 2);
        break;
    }
    case LT_GGUF_U32:
    case LT_GGUF_I32: {
        uint32_t v = (uint32_t)iv;
        put(w, &v, 4);
        break;
    }
    case LT_GGUF_U64:
    case LT_GGUF_I64: put_u64(w, (uint64_t)iv); break;
    case LT_GGUF_F32: {
        float v = (float)fv;
        put(w, &v, 4);
        break;
    }
    case LT_GGUF_F64: put(w, &fv, 8); break;
    default: break;
    }
}

static int is_float(lt_gguf_type t) { return t == LT_GGUF_F32 || t == LT_GGUF_F64; }

lt_status lt_gguf_writer_copy_kv(lt_ctx *ctx, lt_gguf_writer *w, const lt_gguf *g, int64_t i) {
    const char *k;
    size_t kl;
    lt_gguf_type type;
    LT_TRY(lt_gguf_kv_key(ctx, g, i, &k, &kl, &type));
    char key[1024];
    if (kl >= sizeof key) return lt_error(ctx, LT_ERR_UNSUPPORTED, "gguf writer: metadata key of %zu bytes", kl);
    memcpy(key, k, kl);
    key[kl] = 0;
    if (type == LT_GGUF_STRING) {
        const char *s;
        size_t sl;
        LT_TRY(lt_gguf_get_str(ctx, g, key, &s, &sl));
        return lt_gguf_writer_set_str(ctx, w, key, s, sl);
    }
    if (type != LT_GGUF_ARRAY) {
        size_t at, eb = (size_t)lt_gguf_scalar_bytes(type);
        if (!eb) return lt_error(ctx, LT_ERR_FORMAT, "gguf writer: '%s' has type %d", key, (int)type);
        int64_t iv = 0;
        double fv = 0;
        if (is_float(type)) LT_TRY(lt_gguf_get_f64(ctx, g, key, &fv));
        else if (type == LT_GGUF_U64) {
            uint64_t u;
            LT_TRY(lt_gguf_get_u64(ctx, g, key, &u));
            iv = (int64_t)u;
        } else if (type == LT_GGUF_BOOL) {
            int b;
            LT_TRY(lt_gguf_get_bool(ctx, g, key, &b));
            iv = b;
        } else LT_TRY(lt_gguf_get_i64(ctx, g, key, &iv));
        LT_TRY(begin_kv(ctx, w, key, type, eb, &at));
        put_elem(w, type, iv, fv);
        return LT_OK;
    }
    lt_gguf_type et;
    uint64_t n;
    LT_TRY(lt_gguf_get_array(ctx, g, key, &et, &n));
    size_t at;
    if (et == LT_GGUF_STRING) {
        size_t total = 12;
        for (uint64_t j = 0; j < n; j++) {
            const char *s;
            size_t sl;
            LT_TRY(lt_gguf_array_str(ctx, g, key, j, &s, &sl));
            total += 8 + sl;
        }
        LT_TRY(begin_kv(ctx, w, key, LT_GGUF_ARRAY, total, &at));
        put_u32(w, (uint32_t)LT_GGUF_STRING);
        put_u64(w, n);
        for (uint64_t j = 0; j < n; j++) {
            const char *s;
            size_t sl;
            LT_TRY(lt_gguf_array_str(ctx, g, key, j, &s, &sl));
            put_u64(w, sl);
            put(w, s, sl);
        }
        return LT_OK;
    }
    size_t eb = (size_t)lt_gguf_scalar_bytes(et);
    if (!eb) return lt_error(ctx, LT_ERR_UNSUPPORTED, "gguf writer: '%s': array of type %d", key, (int)et);
    if (n > (SIZE_MAX / 4) / eb) return lt_error(ctx, LT_ERR_FORMAT, "gguf writer: '%s' too large", key);
    LT_TRY(begin_kv(ctx, w, key, LT_GGUF_ARRAY, 12 + (size_t)n * eb, &at));
    put_u32(w, (uint32_t)et);
    put_u64(w, n);
    for (uint64_t j = 0; j < n; j++) {
        int64_t iv = 0;
        double fv = 0;
        if (is_float(et)) LT_TRY(lt_gguf_array_f64(ctx, g, key, j, &fv));
        else LT_TRY(lt_gguf_array_i64(ctx, g, key, j, &iv));
        put_elem(w, et, iv, fv);
    }
    return LT_OK;
}

static uint64_t align_up(uint64_t v) { return (v + GW_ALIGN - 1) / GW_ALIGN * GW_ALIGN; }

lt_status lt_gguf_writer_add_tensor(lt_ctx *ctx, lt_gguf_writer *w, const char *name, lt_dtype dtype, int ndim,
                                    const int64_t *shape) {
    if (w->f) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s' added after begin", name);
    size_t nl = name ? strlen(name) : 0;
    if (nl == 0 || nl >= GW_NAME_MAX)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor name '%s' is empty or over %d bytes", name,
                        GW_NAME_MAX - 1);
    int gt = lt_gguf_ggml_type_of(dtype);
    if (gt < 0)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s': dtype %s has no ggml type", name,
                        lt_dtype_name(dtype));
    if (ndim < 1 || ndim > LT_MAX_DIMS)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s' has %d dims", name, ndim);
    for (int64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s' declared twice", name);
    int64_t rows = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || (d < ndim - 1 && rows > INT64_MAX / shape[d]))
            return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s': bad dim %d", name, d);
        if (d < ndim - 1) rows *= shape[d];
    }
    int64_t rb = lt_dtype_row_bytes(dtype, shape[ndim - 1]);
    if (rb < 0 || (rb > 0 && rows > INT64_MAX / rb))
        return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s': %lld columns are not whole %s blocks", name,
                        (long long)shape[ndim - 1], lt_dtype_name(dtype));
    if (w->n_t == w->cap_t) {
        int64_t cap = w->cap_t ? w->cap_t * 2 : 64;
        gw_tensor *n = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)cap * sizeof *n, "gguf writer tensors");
        if (!n) return lt_ctx_status(ctx);
        if (w->t) {
            memcpy(n, w->t, (size_t)w->n_t * sizeof *n);
            lt_free(ctx, LT_DEVICE_CPU, w->t, (size_t)w->cap_t * sizeof *w->t);
        }
        w->t = n;
        w->cap_t = cap;
    }
    gw_tensor *t = &w->t[w->n_t++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, nl + 1);
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->ne[d] = shape[ndim - 1 - d];
    t->ggml_type = (uint32_t)gt;
    t->nbytes = (uint64_t)(rows * rb);
    t->offset = w->data_bytes;
    w->data_bytes += align_up(t->nbytes);
    return LT_OK;
}

/* Metadata as written: each entry without the in-memory size field. */
static uint64_t kv_file_bytes(const lt_gguf_writer *w) { return w->kv_len - 8 * w->n_kv; }

static uint64_t header_bytes(const lt_gguf_writer *w) {
    uint64_t n = 4 + 4 + 8 + 8 + kv_file_bytes(w);
    for (int64_t i = 0; i < w->n_t; i++) n += 8 + strlen(w->t[i].name) + 4 + 8 * (uint64_t)w->t[i].ndim + 4 + 8;
    return align_up(n);
}

uint64_t lt_gguf_writer_file_bytes(const lt_gguf_writer *w) { return header_bytes(w) + w->data_bytes; }

static lt_status out(lt_ctx *ctx, lt_gguf_writer *w, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, w->f) != n)
        return lt_error(ctx, LT_ERR_IO, "%s: write failed: %s", w->tmp, strerror(errno));
    return LT_OK;
}

static lt_status zeros(lt_ctx *ctx, lt_gguf_writer *w, uint64_t n) {
    static const uint8_t z[GW_ALIGN];
    while (n) {
        size_t k = n < GW_ALIGN ? (size_t)n : GW_ALIGN;
        LT_TRY(out(ctx, w, z, k));
        n -= k;
    }
    return LT_OK;
}

static lt_status write_header(lt_ctx *ctx, lt_gguf_writer *w) {
    uint32_t version = 3;
    uint64_t nt = (uint64_t)w->n_t, nkv = w->n_kv;
    LT_TRY(out(ctx, w, "GGUF", 4));
    LT_TRY(out(ctx, w, &version, 4));
    LT_TRY(out(ctx, w, &nt, 8));
    LT_TRY(out(ctx, w, &nkv, 8));
    size_t at = 0;
    for (uint64_t i = 0; i < w->n_kv; i++) {
        uint64_t kl, vb;
        memcpy(&kl, w->kv + at, 8);
        LT_TRY(out(ctx, w, w->kv + at, 8 + kl + 4)); /* key and type */
        at += 8 + kl + 4;
        memcpy(&vb, w->kv + at, 8);
        at += 8;
        LT_TRY(out(ctx, w, w->kv + at, vb));
        at += vb;
    }
    uint64_t written = 4 + 4 + 8 + 8 + kv_file_bytes(w);
    for (int64_t i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->t[i];
        uint64_t nl = strlen(t->name);
        uint32_t nd = (uint32_t)t->ndim;
        LT_TRY(out(ctx, w, &nl, 8));
        LT_TRY(out(ctx, w, t->name, nl));
        LT_TRY(out(ctx, w, &nd, 4));
        LT_TRY(out(ctx, w, t->ne, 8 * (size_t)t->ndim));
        LT_TRY(out(ctx, w, &t->ggml_type, 4));
        LT_TRY(out(ctx, w, &t->offset, 8));
        written += 8 + nl + 4 + 8 * (uint64_t)t->ndim + 4 + 8;
    }
    return zeros(ctx, w, align_up(written) - written);
}

lt_status lt_gguf_writer_begin(lt_ctx *ctx, lt_gguf_writer *w, const char *path) {
    if (w->f) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: begin called twice");
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof w->path) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: bad path '%s'", path);
    memcpy(w->path, path, n + 1);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) return lt_error(ctx, LT_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
    w->cur = 0;
    w->cur_done = 0;
    w->data_done = 0;
    return write_header(ctx, w);
}

lt_status lt_gguf_writer_write(lt_ctx *ctx, lt_gguf_writer *w, const void *data, size_t n) {
    if (!w->f) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: write before begin");
    const uint8_t *p = data;
    while (n) {
        if (w->cur >= w->n_t)
            return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: %zu bytes past the last declared tensor", n);
        gw_tensor *t = &w->t[w->cur];
        uint64_t left = t->nbytes - w->cur_done;
        size_t k = n < left ? n : (size_t)left;
        LT_TRY(out(ctx, w, p, k));
        p += k;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            LT_TRY(zeros(ctx, w, align_up(t->nbytes) - t->nbytes));
            w->data_done += align_up(t->nbytes);
            w->cur++;
            w->cur_done = 0;
        }
    }
    return LT_OK;
}

lt_status lt_gguf_writer_finish(lt_ctx *ctx, lt_gguf_writer *w) {
    if (!w->f) return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: finish before begin");
    /* Zero-byte tensors cannot exist (every dim >= 1), so a short write leaves cur < n_t. */
    if (w->cur < w->n_t)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "gguf writer: tensor '%s' got %llu of %llu bytes", w->t[w->cur].name,
                        (unsigned long long)w->cur_done, (unsigned long long)w->t[w->cur].nbytes);
    int bad = fflush(w->f) != 0 || fsync(fileno(w->f)) != 0;
    int err = errno;
    bad |= fclose(w->f) != 0;
    w->f = NULL;
    if (bad) {
        unlink(w->tmp);
        return lt_error(ctx, LT_ERR_IO, "%s: flush/fsync failed: %s", w->tmp, strerror(err));
    }
    if (rename(w->tmp, w->path) != 0) {
        err = errno;
        unlink(w->tmp);
        return lt_error(ctx, LT_ERR_IO, "%s: rename to %s failed: %s", w->tmp, w->path, strerror(err));
    }
    return LT_OK;
}
