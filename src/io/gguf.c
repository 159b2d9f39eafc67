/* GGUF reader (v2/v3, little-endian): maps the file read-only, walks the header once validating
 * every length, count, dimension and offset against the file size (with overflow checks), and
 * indexes keys and tensor names in hash tables (duplicates are rejected). Values are read in place
 * from the mapping. It does not write GGUF, convert dtypes or undo llama.cpp's Q/K permutation
 * (the model loader does that). */
#define _POSIX_C_SOURCE 200809L
#include "longtune/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "longtune/alloc.h"

#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

typedef struct gguf_kv {
    const char *key; /* into the mapping, not NUL-terminated */
    uint64_t key_len;
    uint32_t type;
    uint32_t elem_type; /* arrays */
    uint64_t count;     /* arrays: element count */
    const uint8_t *val; /* scalar value, string length prefix, or first array element */
    uint64_t *str_off;  /* string arrays: byte offset of element i from val (count entries) */
} gguf_kv;

typedef struct gguf_tensor {
    const char *name; /* NUL-terminated copy */
    size_t name_len;
    int ndim;
    int64_t ne[GGUF_MAX_DIMS]; /* GGUF order: ne[0] is the fastest-varying dimension */
    uint32_t ggml_type;
    uint64_t offset; /* relative to the data section */
    int64_t nbytes;  /* -1 when the type's block size is not known here */
} gguf_tensor;

struct lt_gguf {
    lt_ctx *ctx; /* the context that opened it: close frees through it */
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t alignment;
    size_t data_off;
    uint64_t n_kv;
    gguf_kv *kv;
    uint64_t n_tensors;
    gguf_tensor *tensors;
    char *names; /* all tensor names, NUL-separated */
    size_t names_bytes;
    uint64_t *str_offs; /* storage for every string array's offsets */
    size_t str_offs_count;
    uint32_t *kv_hash; /* open addressing: index+1, 0 = empty */
    uint32_t *t_hash;
    size_t kv_hcap, t_hcap;
};

/* ---- ggml types -------------------------------------------------------------------------- */

#define LT_GGUF_READ_TYPES "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS"

/* Block sizes of the ggml types whose layout is fixed and known, so that tensors longtune does
 * not read are still bounds-checked; a type missing here only has its offset checked. */
typedef struct ggml_type_info {
    const char *name;
    int lt;          /* lt_dtype, or -1 when longtune does not read it */
    int block_elems; /* 0 when the size is not known here */
    int block_bytes;
} ggml_type_info;

static ggml_type_info ggml_type(uint32_t t) {
    switch (t) {
    case 0: return (ggml_type_info){"F32", LT_DTYPE_F32, 1, 4};
    case 1: return (ggml_type_info){"F16", LT_DTYPE_F16, 1, 2};
    case 2: return (ggml_type_info){"Q4_0", LT_DTYPE_Q4_0, 32, 18};
    case 3: return (ggml_type_info){"Q4_1", LT_DTYPE_Q4_1, 32, 20};
    case 6: return (ggml_type_info){"Q5_0", LT_DTYPE_Q5_0, 32, 22};
    case 7: return (ggml_type_info){"Q5_1", LT_DTYPE_Q5_1, 32, 24};
    case 8: return (ggml_type_info){"Q8_0", LT_DTYPE_Q8_0, 32, 34};
    case 9: return (ggml_type_info){"Q8_1", -1, 32, 36};
    case 10: return (ggml_type_info){"Q2_K", LT_DTYPE_Q2_K, 256, 84};
    case 11: return (ggml_type_info){"Q3_K", LT_DTYPE_Q3_K, 256, 110};
    case 12: return (ggml_type_info){"Q4_K", LT_DTYPE_Q4_K, 256, 144};
    case 13: return (ggml_type_info){"Q5_K", LT_DTYPE_Q5_K, 256, 176};
    case 14: return (ggml_type_info){"Q6_K", LT_DTYPE_Q6_K, 256, 210};
    case 15: return (ggml_type_info){"Q8_K", -1, 256, 292};
    case 20: return (ggml_type_info){"IQ4_NL", LT_DTYPE_IQ4_NL, 32, 18};
    case 23: return (ggml_type_info){"IQ4_XS", LT_DTYPE_IQ4_XS, 256, 136};
    case 24: return (ggml_type_info){"I8", -1, 1, 1};
    case 25: return (ggml_type_info){"I16", -1, 1, 2};
    case 26: return (ggml_type_info){"I32", -1, 1, 4};
    case 27: return (ggml_type_info){"I64", -1, 1, 8};
    case 28: return (ggml_type_info){"F64", -1, 1, 8};
    case 30: return (ggml_type_info){"BF16", LT_DTYPE_BF16, 1, 2};
    default: return (ggml_type_info){NULL, -1, 0, 0};
    }
}

/* ---- bounded cursor over the mapping ----------------------------------------------------- */

typedef struct cursor {
    const uint8_t *p;
    size_t size, pos;
} cursor;

static int cur_need(const cursor *c, uint64_t n) { return n <= c->size - c->pos; }

static int cur_u32(cursor *c, uint32_t *v) {
    if (!cur_need(c, 4)) return 0;
    memcpy(v, c->p + c->pos, 4);
    c->pos += 4;
    return 1;
}

static int cur_u64(cursor *c, uint64_t *v) {
    if (!cur_need(c, 8)) return 0;
    memcpy(v, c->p + c->pos, 8);
    c->pos += 8;
    return 1;
}

/* A GGUF string: u64 length then bytes. */
static int cur_str(cursor *c, const char **s, uint64_t *len) {
    if (!cur_u64(c, len) || !cur_need(c, *len)) return 0;
    *s = (const char *)(c->p + c->pos);
    c->pos += (size_t)*len;
    return 1;
}

uint64_t lt_gguf_scalar_bytes(uint32_t t) {
    switch (t) {
    case LT_GGUF_U8:
    case LT_GGUF_I8:
    case LT_GGUF_BOOL: return 1;
    case LT_GGUF_U16:
    case LT_GGUF_I16: return 2;
    case LT_GGUF_U32:
    case LT_GGUF_I32:
    case LT_GGUF_F32: return 4;
    case LT_GGUF_U64:
    case LT_GGUF_I64:
    case LT_GGUF_F64: return 8;
    default: return 0;
    }
}

static const char *type_name(uint32_t t) {
    static const char *const names[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                        "bool", "string", "array", "u64", "i64", "f64"};
    return t < LT_GGUF_TYPE_COUNT_ ? names[t] : "unknown";
}

/* ---- hashing ----------------------------------------------------------------------------- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static size_t hash_cap(uint64_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    return cap;
}

static const gguf_kv *find_kv(const lt_gguf *g, const char *key) {
    size_t n = strlen(key), mask = g->kv_hcap - 1;
    for (size_t h = (size_t)hash_bytes(key, n) & mask;; h = (h + 1) & mask) {
        uint32_t e = g->kv_hash[h];
        if (!e) return NULL;
        const gguf_kv *kv = &g->kv[e - 1];
        if (kv->key_len == n && !memcmp(kv->key, key, n)) return kv;
    }
}

static int64_t find_tensor_index(const lt_gguf *g, const char *name, size_t n) {
    size_t mask = g->t_hcap - 1;
    for (size_t h = (size_t)hash_bytes(name, n) & mask;; h = (h + 1) & mask) {
        uint32_t e = g->t_hash[h];
        if (!e) return -1;
        const gguf_tensor *t = &g->tensors[e - 1];
        if (t->name_len == n && !memcmp(t->name, name, n)) return (int64_t)(e - 1);
    }
}

/* ---- open / close ------------------------------------------------------------------------ */

void lt_gguf_close(lt_gguf *g) {
    if (!g) return;
    lt_ctx *ctx = g->ctx;
    lt_free(ctx, LT_DEVICE_CPU, g->kv, g->n_kv * sizeof *g->kv);
    lt_free(ctx, LT_DEVICE_CPU, g->tensors, g->n_tensors * sizeof *g->tensors);
    lt_free(ctx, LT_DEVICE_CPU, g->names, g->names_bytes);
    lt_free(ctx, LT_DEVICE_CPU, g->str_offs, g->str_offs_count * sizeof *g->str_offs);
    lt_free(ctx, LT_DEVICE_CPU, g->kv_hash, g->kv_hcap * sizeof *g->kv_hash);
    lt_free(ctx, LT_DEVICE_CPU, g->t_hash, g->t_hcap * sizeof *g->t_hash);
    if (g->map) munmap((void *)(uintptr_t)g->map, g->size);
    lt_free(ctx, LT_DEVICE_CPU, g, sizeof *g);
}

/* lt_alloc refuses 0 bytes; an empty table is a NULL pointer. */
static void *alloc_table(lt_ctx *ctx, size_t bytes, const char *what) {
    return bytes ? lt_calloc(ctx, LT_DEVICE_CPU, bytes, what) : NULL;
}

/* Walks one value of type `t` at the cursor (validating it); for string arrays also counts the
 * elements so the offsets table can be sized. */
static lt_status parse_kv_value(lt_ctx *ctx, const char *path, cursor *c, gguf_kv *kv, uint64_t *n_str_elems) {
    const char *kn = kv->key;
    int kl = kv->key_len > 200 ? 200 : (int)kv->key_len;
    kv->val = c->p + c->pos;
    if (kv->type == LT_GGUF_STRING) {
        const char *s;
        uint64_t len;
        if (!cur_str(c, &s, &len))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': string runs past the end of the file", path, kl, kn);
        return LT_OK;
    }
    if (kv->type == LT_GGUF_ARRAY) {
        if (!cur_u32(c, &kv->elem_type) || !cur_u64(c, &kv->count))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': array header truncated", path, kl, kn);
        kv->val = c->p + c->pos;
        if (kv->elem_type == LT_GGUF_ARRAY)
            return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: key '%.*s': nested arrays are not supported", path, kl, kn);
        if (kv->elem_type == LT_GGUF_STRING) {
            /* Each element takes at least its 8-byte length, so count is bounded by the file. */
            if (kv->count > (c->size - c->pos) / 8)
                return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': array of %llu strings cannot fit in the file",
                                path, kl, kn, (unsigned long long)kv->count);
            for (uint64_t i = 0; i < kv->count; i++) {
                const char *s;
                uint64_t len;
                if (!cur_str(c, &s, &len))
                    return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': string %llu runs past the end of the file",
                                    path, kl, kn, (unsigned long long)i);
            }
            *n_str_elems += kv->count;
            return LT_OK;
        }
        uint64_t es = lt_gguf_scalar_bytes(kv->elem_type);
        if (!es)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': unknown array element type %u", path, kl, kn,
                            kv->elem_type);
        if (kv->count > (c->size - c->pos) / es)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': array of %llu %s runs past the end of the file", path,
                            kl, kn, (unsigned long long)kv->count, type_name(kv->elem_type));
        c->pos += (size_t)(kv->count * es);
        return LT_OK;
    }
    uint64_t sz = lt_gguf_scalar_bytes(kv->type);
    if (!sz) return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': unknown value type %u", path, kl, kn, kv->type);
    if (!cur_need(c, sz))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': value runs past the end of the file", path, kl, kn);
    c->pos += (size_t)sz;
    return LT_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const gguf_tensor *x = *(const gguf_tensor *const *)a, *y = *(const gguf_tensor *const *)b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* Tensors must not share bytes (every one at offset 0 would alias all the weights); tensors of
 * no bytes, or of a type whose size is not known here, overlap nothing. O(n log n). */
static lt_status check_overlap(lt_ctx *ctx, const char *path, const lt_gguf *g) {
    if (g->n_tensors < 2) return LT_OK;
    const gguf_tensor **v = malloc((size_t)g->n_tensors * sizeof *v); /* transient */
    if (!v)
        return lt_error(ctx, LT_ERR_OOM, "%s: overlap check of %llu tensors", path, (unsigned long long)g->n_tensors);
    size_t n = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].nbytes > 0) v[n++] = &g->tensors[i];
    if (n > 1) qsort(v, n, sizeof *v, cmp_by_offset);
    lt_status s = LT_OK;
    for (size_t i = 1; i < n && s == LT_OK; i++)
        if (v[i - 1]->offset + (uint64_t)v[i - 1]->nbytes > v[i]->offset)
            s = lt_error(ctx, LT_ERR_FORMAT,
                         "%s: tensors '%.200s' and '%.200s' overlap (data [%llu, +%lld) and [%llu, +%lld))", path,
                         v[i - 1]->name, v[i]->name, (unsigned long long)v[i - 1]->offset, (long long)v[i - 1]->nbytes,
                         (unsigned long long)v[i]->offset, (long long)v[i]->nbytes);
    free(v);
    return s;
}

static lt_status gguf_parse(lt_ctx *ctx, const char *path, lt_gguf *g) {
    cursor c = {g->map, g->size, 0};
    uint32_t magic;
    uint64_t n_tensors, n_kv;
    if (!cur_u32(&c, &magic) || memcmp(g->map, "GGUF", 4) != 0)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: not a GGUF file (bad magic)", path);
    (void)magic;
    if (!cur_u32(&c, &g->version)) return lt_error(ctx, LT_ERR_FORMAT, "%s: truncated header", path);
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: big-endian GGUF is not supported", path);
    if (g->version == 1)
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: GGUF version 1 is not supported (re-convert to v3)", path);
    if (g->version != 2 && g->version != 3)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: unknown GGUF version %u", path, g->version);
    if (!cur_u64(&c, &n_tensors) || !cur_u64(&c, &n_kv))
        return lt_error(ctx, LT_ERR_FORMAT, "%s: truncated header", path);
    /* Each key/value takes >= 8+4+1 bytes and each tensor info >= 8+4+8+4+8 bytes. */
    if (n_kv > (g->size - c.pos) / 13 || n_kv >= UINT32_MAX)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %llu metadata entries cannot fit in a %zu-byte file", path,
                        (unsigned long long)n_kv, g->size);
    if (n_tensors > (g->size - c.pos) / 32 || n_tensors >= UINT32_MAX)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %llu tensors cannot fit in a %zu-byte file", path,
                        (unsigned long long)n_tensors, g->size);

    g->n_kv = n_kv;
    g->kv = alloc_table(ctx, n_kv * sizeof *g->kv, "gguf metadata");
    if (n_kv && !g->kv) return lt_ctx_status(ctx);
    g->kv_hcap = hash_cap(n_kv);
    g->kv_hash = alloc_table(ctx, g->kv_hcap * sizeof *g->kv_hash, "gguf key index");
    if (!g->kv_hash) return lt_ctx_status(ctx);
    uint64_t n_str_elems = 0;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        if (!cur_str(&c, &kv->key, &kv->key_len))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: metadata entry %llu: key runs past the end of the file", path,
                            (unsigned long long)i);
        int kl = kv->key_len > 200 ? 200 : (int)kv->key_len;
        if (!cur_u32(&c, &kv->type))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: key '%.*s': type truncated", path, kl, kv->key);
        LT_TRY(parse_kv_value(ctx, path, &c, kv, &n_str_elems));
        size_t mask = g->kv_hcap - 1, h = (size_t)hash_bytes(kv->key, (size_t)kv->key_len) & mask;
        for (; g->kv_hash[h]; h = (h + 1) & mask) {
            const gguf_kv *o = &g->kv[g->kv_hash[h] - 1];
            if (o->key_len == kv->key_len && !memcmp(o->key, kv->key, (size_t)kv->key_len))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: duplicate key '%.*s'", path, kl, kv->key);
        }
        g->kv_hash[h] = (uint32_t)(i + 1);
        if (kv->key_len == 17 && !memcmp(kv->key, "general.alignment", 17)) {
            uint64_t a;
            if (kv->type == LT_GGUF_U32) {
                uint32_t a32;
                memcpy(&a32, kv->val, 4);
                a = a32;
            } else if (kv->type == LT_GGUF_U64) {
                memcpy(&a, kv->val, 8);
            } else {
                return lt_error(ctx, LT_ERR_FORMAT, "%s: general.alignment has type %s, expected u32", path,
                                type_name(kv->type));
            }
            if (a == 0 || (a & (a - 1)) || a > (1u << 20))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: general.alignment %llu is not a power of two in [1, 1 MiB]",
                                path, (unsigned long long)a);
            g->alignment = a;
        }
    }
    /* Offsets of string array elements, so element i is O(1). */
    if (n_str_elems) {
        g->str_offs_count = (size_t)n_str_elems;
        g->str_offs = lt_alloc(ctx, LT_DEVICE_CPU, g->str_offs_count * sizeof *g->str_offs, "gguf string index");
        if (!g->str_offs) return lt_ctx_status(ctx);
        size_t k = 0;
        for (uint64_t i = 0; i < n_kv; i++) {
            gguf_kv *kv = &g->kv[i];
            if (kv->type != LT_GGUF_ARRAY || kv->elem_type != LT_GGUF_STRING) continue;
            kv->str_off = g->str_offs + k;
            uint64_t off = 0;
            for (uint64_t e = 0; e < kv->count; e++) {
                uint64_t len;
                memcpy(&len, kv->val + off, 8);
                g->str_offs[k++] = off;
                off += 8 + len; /* validated by parse_kv_value */
            }
        }
    }

    /* Tensor infos. */
    g->n_tensors = n_tensors;
    g->tensors = alloc_table(ctx, n_tensors * sizeof *g->tensors, "gguf tensor infos");
    if (n_tensors && !g->tensors) return lt_ctx_status(ctx);
    g->t_hcap = hash_cap(n_tensors);
    g->t_hash = alloc_table(ctx, g->t_hcap * sizeof *g->t_hash, "gguf tensor index");
    if (!g->t_hash) return lt_ctx_status(ctx);
    size_t names_total = 0;
    /* First pass: validate and measure names; second pass below copies them NUL-terminated. */
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        const char *nm;
        uint64_t nl;
        if (!cur_str(&c, &nm, &nl))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor %llu: name runs past the end of the file", path,
                            (unsigned long long)i);
        int kl = nl > 200 ? 200 : (int)nl;
        if (nl == 0 || memchr(nm, 0, (size_t)nl))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor %llu: empty name or name with a NUL byte", path,
                            (unsigned long long)i);
        uint32_t nd;
        if (!cur_u32(&c, &nd)) return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': truncated info", path, kl, nm);
        if (nd == 0 || nd > GGUF_MAX_DIMS)
            return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': %u dimensions (expected 1..%d)", path, kl, nm, nd,
                            GGUF_MAX_DIMS);
        t->ndim = (int)nd;
        int64_t numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            if (!cur_u64(&c, &ne))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': truncated info", path, kl, nm);
            if (ne > (uint64_t)INT64_MAX || (ne && (uint64_t)numel > (uint64_t)INT64_MAX / ne))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': dimension %u = %llu overflows", path, kl, nm, d,
                                (unsigned long long)ne);
            t->ne[d] = (int64_t)ne;
            numel *= (int64_t)ne;
        }
        if (!cur_u32(&c, &t->ggml_type) || !cur_u64(&c, &t->offset))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': truncated info", path, kl, nm);
        if (t->offset % g->alignment)
            return lt_error(ctx, LT_ERR_FORMAT,
                            "%s: tensor '%.*s': offset %llu is not a multiple of the alignment %llu", path, kl, nm,
                            (unsigned long long)t->offset, (unsigned long long)g->alignment);
        ggml_type_info ti = ggml_type(t->ggml_type);
        t->nbytes = -1;
        if (ti.block_elems) {
            int64_t be = ti.block_elems;
            if (t->ne[0] % be)
                return lt_error(ctx, LT_ERR_FORMAT,
                                "%s: tensor '%.*s': row length %lld is not a multiple of the %s block (%lld)", path, kl,
                                nm, (long long)t->ne[0], ti.name, (long long)be);
            int64_t bb = ti.block_bytes, blocks = numel / be;
            if (blocks > INT64_MAX / bb)
                return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': byte size overflows", path, kl, nm);
            t->nbytes = blocks * bb;
        }
        t->name = nm; /* temporary: replaced by the NUL-terminated copy */
        t->name_len = (size_t)nl;
        names_total += (size_t)nl + 1;
    }
    /* The data section starts at the next multiple of the alignment. */
    uint64_t data_off = ((uint64_t)c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors && data_off > g->size)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: data section starts at %llu, past the end of the %zu-byte file", path,
                        (unsigned long long)data_off, g->size);
    g->data_off = (size_t)(data_off > g->size ? g->size : data_off);
    uint64_t data_size = g->size - g->data_off;

    if (names_total) {
        g->names_bytes = names_total;
        g->names = lt_alloc(ctx, LT_DEVICE_CPU, names_total, "gguf tensor names");
        if (!g->names) return lt_ctx_status(ctx);
    }
    char *np = g->names;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        memcpy(np, t->name, t->name_len);
        np[t->name_len] = '\0';
        t->name = np;
        np += t->name_len + 1;
        int kl = t->name_len > 200 ? 200 : (int)t->name_len;
        if (t->offset > data_size || (t->nbytes >= 0 && (uint64_t)t->nbytes > data_size - t->offset))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%.*s': data [%llu, +%lld) lies past the end of the file",
                            path, kl, t->name, (unsigned long long)t->offset, (long long)t->nbytes);
        size_t mask = g->t_hcap - 1, h = (size_t)hash_bytes(t->name, t->name_len) & mask;
        for (; g->t_hash[h]; h = (h + 1) & mask) {
            const gguf_tensor *o = &g->tensors[g->t_hash[h] - 1];
            if (o->name_len == t->name_len && !memcmp(o->name, t->name, t->name_len))
                return lt_error(ctx, LT_ERR_FORMAT, "%s: duplicate tensor name '%.*s'", path, kl, t->name);
        }
        g->t_hash[h] = (uint32_t)(i + 1);
    }
    return check_overlap(ctx, path, g);
}

lt_status lt_gguf_open(lt_ctx *ctx, const char *path, lt_gguf **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return lt_error(ctx, LT_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return lt_error(ctx, LT_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %lld bytes is too short for a GGUF header", path,
                        (long long)st.st_size);
    }
    lt_gguf *g = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *g, "gguf handle");
    if (!g) {
        close(fd);
        return lt_ctx_status(ctx);
    }
    g->ctx = ctx;
    g->size = (size_t)st.st_size;
    void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        lt_free(ctx, LT_DEVICE_CPU, g, sizeof *g);
        return lt_error(ctx, LT_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    }
    g->map = m;
    lt_status s = gguf_parse(ctx, path, g);
    if (s != LT_OK) {
        lt_gguf_close(g);
        return s;
    }
    *out = g;
    return LT_OK;
}

/* ---- metadata lookups -------------------------------------------------------------------- */

static lt_status need_kv(lt_ctx *ctx, const lt_gguf *g, const char *key, const gguf_kv **kv) {
    *kv = find_kv(g, key);
    if (!*kv) return lt_error(ctx, LT_ERR_NOT_FOUND, "GGUF key '%s' not found", key);
    return LT_OK;
}

/* Reads a scalar of integer, bool or float type at p. Returns 1 integer (into *i or *u with
 * *is_signed), 2 float (into *f), 0 otherwise. */
static int read_scalar(uint32_t t, const uint8_t *p, int64_t *i, uint64_t *u, int *is_signed, double *f) {
    *is_signed = 1;
    switch (t) {
    case LT_GGUF_U8:
        *u = *p;
        *is_signed = 0;
        return 1;
    case LT_GGUF_BOOL:
        *u = *p != 0;
        *is_signed = 0;
        return 1;
    case LT_GGUF_I8: {
        int8_t v;
        memcpy(&v, p, 1);
        *i = v;
        return 1;
    }
    case LT_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        *u = v;
        *is_signed = 0;
        return 1;
    }
    case LT_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        *i = v;
        return 1;
    }
    case LT_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        *u = v;
        *is_signed = 0;
        return 1;
    }
    case LT_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        *i = v;
        return 1;
    }
    case LT_GGUF_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        *u = v;
        *is_signed = 0;
        return 1;
    }
    case LT_GGUF_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        *i = v;
        return 1;
    }
    case LT_GGUF_F32: {
        float v;
        memcpy(&v, p, 4);
        *f = v;
        return 2;
    }
    case LT_GGUF_F64: {
        double v;
        memcpy(&v, p, 8);
        *f = v;
        return 2;
    }
    default: return 0;
    }
}

static lt_status scalar_to_i64(lt_ctx *ctx, const char *key, uint32_t t, const uint8_t *p, int64_t *out) {
    int64_t i = 0;
    uint64_t u = 0;
    double f;
    int sg;
    if (read_scalar(t, p, &i, &u, &sg, &f) != 1)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' has type %s, expected an integer", key, type_name(t));
    if (!sg) {
        if (u > (uint64_t)INT64_MAX)
            return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s': %llu does not fit in i64", key, (unsigned long long)u);
        i = (int64_t)u;
    }
    *out = i;
    return LT_OK;
}

lt_status lt_gguf_get_u64(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t *out) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    int64_t i = 0;
    uint64_t u = 0;
    double f;
    int sg;
    if (read_scalar(kv->type, kv->val, &i, &u, &sg, &f) != 1)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' has type %s, expected an integer", key, type_name(kv->type));
    if (sg) {
        if (i < 0) return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s': %lld is negative", key, (long long)i);
        u = (uint64_t)i;
    }
    *out = u;
    return LT_OK;
}

lt_status lt_gguf_get_i64(lt_ctx *ctx, const lt_gguf *g, const char *key, int64_t *out) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    return scalar_to_i64(ctx, key, kv->type, kv->val, out);
}

lt_status lt_gguf_get_bool(lt_ctx *ctx, const lt_gguf *g, const char *key, int *out) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    int64_t v = 0;
    LT_TRY(scalar_to_i64(ctx, key, kv->type, kv->val, &v));
    *out = v != 0;
    return LT_OK;
}

lt_status lt_gguf_get_f64(lt_ctx *ctx, const lt_gguf *g, const char *key, double *out) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    int64_t i = 0;
    uint64_t u = 0;
    double f = 0;
    int sg;
    int k = read_scalar(kv->type, kv->val, &i, &u, &sg, &f);
    if (k == 0 || kv->type == LT_GGUF_BOOL)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' has type %s, expected a number", key, type_name(kv->type));
    *out = k == 2 ? f : (sg ? (double)i : (double)u);
    return LT_OK;
}

lt_status lt_gguf_get_str(lt_ctx *ctx, const lt_gguf *g, const char *key, const char **s, size_t *len) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    if (kv->type != LT_GGUF_STRING)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' has type %s, expected string", key, type_name(kv->type));
    uint64_t n;
    memcpy(&n, kv->val, 8);
    *s = (const char *)kv->val + 8;
    *len = (size_t)n;
    return LT_OK;
}

lt_status lt_gguf_get_type(lt_ctx *ctx, const lt_gguf *g, const char *key, lt_gguf_type *type) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    *type = (lt_gguf_type)kv->type;
    return LT_OK;
}

lt_status lt_gguf_get_array(lt_ctx *ctx, const lt_gguf *g, const char *key, lt_gguf_type *elem_type, uint64_t *count) {
    const gguf_kv *kv;
    LT_TRY(need_kv(ctx, g, key, &kv));
    if (kv->type != LT_GGUF_ARRAY)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' has type %s, expected array", key, type_name(kv->type));
    if (elem_type) *elem_type = (lt_gguf_type)kv->elem_type;
    if (count) *count = kv->count;
    return LT_OK;
}

static lt_status need_elem(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, const gguf_kv **kv) {
    LT_TRY(need_kv(ctx, g, key, kv));
    if ((*kv)->type != LT_GGUF_ARRAY)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' has type %s, expected array", key, type_name((*kv)->type));
    if (i >= (*kv)->count)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "GGUF key '%s': index %llu out of range (%llu elements)", key,
                        (unsigned long long)i, (unsigned long long)(*kv)->count);
    return LT_OK;
}

lt_status lt_gguf_array_str(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, const char **s, size_t *len) {
    const gguf_kv *kv;
    LT_TRY(need_elem(ctx, g, key, i, &kv));
    if (kv->elem_type != LT_GGUF_STRING)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' is an array of %s, expected strings", key,
                        type_name(kv->elem_type));
    const uint8_t *p = kv->val + kv->str_off[i];
    uint64_t n;
    memcpy(&n, p, 8);
    *s = (const char *)p + 8;
    *len = (size_t)n;
    return LT_OK;
}

lt_status lt_gguf_array_i64(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, int64_t *out) {
    const gguf_kv *kv;
    LT_TRY(need_elem(ctx, g, key, i, &kv));
    uint64_t es = lt_gguf_scalar_bytes(kv->elem_type);
    if (!es || kv->elem_type == LT_GGUF_F32 || kv->elem_type == LT_GGUF_F64)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' is an array of %s, expected integers", key,
                        type_name(kv->elem_type));
    return scalar_to_i64(ctx, key, kv->elem_type, kv->val + i * es, out);
}

lt_status lt_gguf_array_f64(lt_ctx *ctx, const lt_gguf *g, const char *key, uint64_t i, double *out) {
    const gguf_kv *kv;
    LT_TRY(need_elem(ctx, g, key, i, &kv));
    uint64_t es = lt_gguf_scalar_bytes(kv->elem_type);
    int64_t iv = 0;
    uint64_t u = 0;
    double f = 0;
    int sg;
    int k = es ? read_scalar(kv->elem_type, kv->val + i * es, &iv, &u, &sg, &f) : 0;
    if (k == 0 || kv->elem_type == LT_GGUF_BOOL)
        return lt_error(ctx, LT_ERR_FORMAT, "GGUF key '%s' is an array of %s, expected numbers", key,
                        type_name(kv->elem_type));
    *out = k == 2 ? f : (sg ? (double)iv : (double)u);
    return LT_OK;
}

uint32_t lt_gguf_version(const lt_gguf *g) { return g->version; }
uint64_t lt_gguf_alignment(const lt_gguf *g) { return g->alignment; }
int64_t lt_gguf_kv_count(const lt_gguf *g) { return (int64_t)g->n_kv; }

lt_status lt_gguf_kv_key(lt_ctx *ctx, const lt_gguf *g, int64_t i, const char **key, size_t *len, lt_gguf_type *type) {
    if (i < 0 || (uint64_t)i >= g->n_kv)
        return lt_error(ctx, LT_ERR_INVALID_ARG, "GGUF metadata index %lld out of range (%llu entries)", (long long)i,
                        (unsigned long long)g->n_kv);
    *key = g->kv[i].key;
    *len = (size_t)g->kv[i].key_len;
    if (type) *type = (lt_gguf_type)g->kv[i].type;
    return LT_OK;
}

/* ---- tensors ----------------------------------------------------------------------------- */

int64_t lt_gguf_tensor_count(const lt_gguf *g) { return (int64_t)g->n_tensors; }

const char *lt_gguf_tensor_name(const lt_gguf *g, int64_t i) {
    if (i < 0 || (uint64_t)i >= g->n_tensors) return NULL;
    return g->tensors[i].name;
}

lt_status lt_gguf_tensor_ggml_type(lt_ctx *ctx, const lt_gguf *g, const char *name, uint32_t *type,
                                   const char **type_name_out) {
    int64_t i = find_tensor_index(g, name, strlen(name));
    if (i < 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "GGUF tensor '%s' not found", name);
    *type = g->tensors[i].ggml_type;
    if (type_name_out) {
        const char *n = ggml_type(*type).name;
        *type_name_out = n ? n : "unknown";
    }
    return LT_OK;
}

lt_status lt_gguf_find_tensor(lt_ctx *ctx, const lt_gguf *g, const char *name, lt_tensor *out) {
    int64_t i = find_tensor_index(g, name, strlen(name));
    if (i < 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "GGUF tensor '%s' not found", name);
    const gguf_tensor *t = &g->tensors[i];
    ggml_type_info ti = ggml_type(t->ggml_type);
    if (ti.lt < 0) {
        if (ti.name)
            return lt_error(ctx, LT_ERR_UNSUPPORTED,
                            "GGUF tensor '%s' has ggml type %s, which longtune does not read "
                            "(supported: " LT_GGUF_READ_TYPES ")",
                            name, ti.name);
        return lt_error(ctx, LT_ERR_UNSUPPORTED, "GGUF tensor '%s' has unknown ggml type %u", name, t->ggml_type);
    }
    /* ggml's block table and longtune's dtype table describe the same layouts. */
    LT_ASSERT(lt_dtype_block_elems((lt_dtype)ti.lt) == ti.block_elems &&
              lt_dtype_block_bytes((lt_dtype)ti.lt) == ti.block_bytes);
    int64_t shape[GGUF_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) shape[d] = t->ne[t->ndim - 1 - d];
    void *data = (void *)(uintptr_t)(g->map + g->data_off + t->offset);
    *out = lt_tensor_view(data, (lt_dtype)ti.lt, LT_DEVICE_CPU, t->ndim, shape);
    return LT_OK;
}
