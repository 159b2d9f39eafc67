/* safetensors reader (mmap, single file or sharded index) and atomic writer. The header JSON is
 * parsed with cJSON and immediately copied into a flat, validated table; cJSON's own mallocs are
 * transient. Tensor data is never copied here: callers get views into the mapping. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "longtune/alloc.h"
#include "longtune/safetensors.h"
#include "io/json_nul.h"

#define ST_MAX_HEADER (256u << 20) /* larger headers are refused rather than parsed */
#define ST_MAX_SHARDS 1024

typedef struct st_shard {
    void *map;
    size_t size;
    char *path; /* lt_alloc'd */
    size_t path_bytes;
} st_shard;

typedef struct st_entry {
    char *name; /* into the names arena */
    lt_dtype dtype;
    int ndim;
    int64_t shape[LT_MAX_DIMS];
    int shard;
    const uint8_t *data;
    size_t nbytes;
} st_entry;

struct lt_safetensors {
    st_shard *shards;
    int n_shards;
    st_entry *entries;
    int64_t n, cap;
    char *names; /* arena of NUL-terminated names and metadata strings */
    size_t names_used, names_cap;
    char **meta; /* key/value pairs into the arena (first shard's __metadata__) */
    int64_t n_meta, meta_cap;
    const st_entry **by_name; /* every entry sorted by name (built once loading is done): lookups
                                 are binary searches, so an index of n tensors costs O(n log n) */
};

static int dtype_from_str(const char *s, lt_dtype *out) {
    if (!strcmp(s, "F32")) *out = LT_DTYPE_F32;
    else if (!strcmp(s, "F16")) *out = LT_DTYPE_F16;
    else if (!strcmp(s, "BF16")) *out = LT_DTYPE_BF16;
    else return 0;
    return 1;
}

static const char *dtype_to_str(lt_dtype t) {
    return t == LT_DTYPE_F32 ? "F32" : t == LT_DTYPE_F16 ? "F16" : t == LT_DTYPE_BF16 ? "BF16" : NULL;
}

static char *arena_put(lt_ctx *ctx, lt_safetensors *st, const char *s) {
    size_t len = strlen(s) + 1;
    if (st->names_used + len > st->names_cap) {
        size_t cap = st->names_cap ? st->names_cap : 4096;
        while (cap < st->names_used + len) cap *= 2;
        char *p = lt_alloc(ctx, LT_DEVICE_CPU, cap, "safetensors names");
        if (!p) return NULL;
        /* Names already handed out point into the old arena: rebase them. */
        if (st->names) {
            memcpy(p, st->names, st->names_used);
            for (int64_t i = 0; i < st->n; i++) st->entries[i].name = p + (st->entries[i].name - st->names);
            for (int64_t i = 0; i < 2 * st->n_meta; i++) st->meta[i] = p + (st->meta[i] - st->names);
            lt_free(ctx, LT_DEVICE_CPU, st->names, st->names_cap);
        }
        st->names = p;
        st->names_cap = cap;
    }
    char *dst = st->names + st->names_used;
    memcpy(dst, s, len);
    st->names_used += len;
    return dst;
}

static lt_status grow(lt_ctx *ctx, void **arr, int64_t *cap, int64_t need, size_t elem, const char *what) {
    if (need <= *cap) return LT_OK;
    int64_t nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    void *p = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)nc * elem, what);
    if (!p) return lt_ctx_status(ctx);
    if (*arr) {
        memcpy(p, *arr, (size_t)*cap * elem);
        lt_free(ctx, LT_DEVICE_CPU, *arr, (size_t)*cap * elem);
    }
    *arr = p;
    *cap = nc;
    return LT_OK;
}

static int64_t find_index(const lt_safetensors *st, const char *name) {
    int64_t lo = 0, hi = st->by_name ? st->n : 0;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->by_name[mid]->name, name);
        if (!c) return st->by_name[mid] - st->entries;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(const st_entry *const *)a)->name, (*(const st_entry *const *)b)->name);
}

/* Sorts the loaded entries by name for find_index and refuses a name given twice (in one file or
 * in two shards). */
static lt_status build_name_table(lt_ctx *ctx, lt_safetensors *st) {
    if (st->n == 0) return LT_OK;
    st->by_name = lt_alloc(ctx, LT_DEVICE_CPU, (size_t)st->n * sizeof *st->by_name, "safetensors name table");
    if (!st->by_name) return lt_ctx_status(ctx);
    for (int64_t i = 0; i < st->n; i++) st->by_name[i] = &st->entries[i];
    qsort(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_by_name);
    for (int64_t i = 1; i < st->n; i++)
        if (!strcmp(st->by_name[i - 1]->name, st->by_name[i]->name))
            return lt_error(ctx, LT_ERR_FORMAT, "%s: duplicate tensor name '%s'",
                            st->shards[st->by_name[i]->shard].path, st->by_name[i]->name);
    return LT_OK;
}

static int cmp_by_data(const void *a, const void *b) {
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    return x->data < y->data ? -1 : x->data > y->data;
}

/* Maps one file and appends its tensors. `only` (may be NULL) restricts nothing but is used to
 * check an index's claims afterwards. */
static lt_status load_shard(lt_ctx *ctx, lt_safetensors *st, const char *path) {
    lt_status s = LT_OK;
    cJSON *root = NULL;
    char *hdr = NULL;
    const st_entry **sorted = NULL;
    int64_t first = st->n;
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: cannot open: %s", path,
                        strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return lt_error(ctx, LT_ERR_IO, "%s: fstat: %s", path, strerror(errno));
    }
    size_t fsize = (size_t)sb.st_size;
    if (fsize < 8) {
        close(fd);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors header", path, fsize);
    }
    void *map = mmap(NULL, fsize, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return lt_error(ctx, LT_ERR_IO, "%s: mmap: %s", path, strerror(errno));
    if (st->n_shards >= ST_MAX_SHARDS) {
        munmap(map, fsize);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: more than %d shards", path, ST_MAX_SHARDS);
    }
    st_shard *sh = &st->shards[st->n_shards];
    size_t plen = strlen(path) + 1;
    sh->path = lt_alloc(ctx, LT_DEVICE_CPU, plen, "safetensors path");
    if (!sh->path) {
        munmap(map, fsize);
        return lt_ctx_status(ctx);
    }
    memcpy(sh->path, path, plen);
    sh->path_bytes = plen;
    sh->map = map;
    sh->size = fsize;
    int shard = st->n_shards++;

    const uint8_t *base = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen == 0 || hlen > ST_MAX_HEADER || hlen > fsize - 8)
        return lt_error(ctx, LT_ERR_FORMAT, "%s: header length %llu does not fit the file (%zu bytes)", path,
                        (unsigned long long)hlen, fsize);
    hdr = malloc((size_t)hlen + 1); /* cJSON needs a terminated copy; transient */
    if (!hdr) return lt_error(ctx, LT_ERR_OOM, "%s: header copy of %llu bytes", path, (unsigned long long)hlen);
    memcpy(hdr, base + 8, (size_t)hlen);
    hdr[hlen] = 0;
    int64_t nul = lt_json_nul_line(hdr, (size_t)hlen);
    if (nul) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: header line %lld: string contains U+0000", path, (long long)nul);
        goto done;
    }
    const char *hend = NULL;
    root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &hend, 0);
    if (!root || !cJSON_IsObject(root)) {
        s = lt_error(ctx, LT_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    /* The format pads the header with spaces; anything else after the object is not a header. */
    for (const char *q = hend; q && q < hdr + hlen; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            s = lt_error(ctx, LT_ERR_FORMAT,
                         "%s: %lld bytes of trailing data after the header's JSON object (byte %lld)", path,
                         (long long)(hdr + hlen - q), (long long)(q - hdr));
            goto done;
        }
    const uint8_t *data = base + 8 + hlen;
    size_t dsize = fsize - 8 - (size_t)hlen;
    for (cJSON *it = root->child; it; it = it->next) {
        const char *name = it->string ? it->string : "";
        if (!strcmp(name, "__metadata__")) {
            if (!cJSON_IsObject(it)) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                goto done;
            }
            if (shard != 0) continue;
            for (cJSON *kv = it->child; kv; kv = kv->next) {
                if (!cJSON_IsString(kv)) continue;
                if ((s = grow(ctx, (void **)&st->meta, &st->meta_cap, 2 * (st->n_meta + 1), sizeof(char *),
                              "safetensors metadata")) != LT_OK)
                    goto done;
                char *k = arena_put(ctx, st, kv->string);
                char *v = k ? arena_put(ctx, st, kv->valuestring) : NULL;
                if (!v) {
                    s = lt_ctx_status(ctx);
                    goto done;
                }
                k = v - strlen(kv->string) - 1; /* the arena may have moved under k */
                st->meta[2 * st->n_meta] = k;
                st->meta[2 * st->n_meta + 1] = v;
                st->n_meta++;
            }
            continue;
        }
        if (!*name) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor with an empty name", path);
            goto done;
        }
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *shp = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(shp) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s': needs dtype, shape and two data_offsets", path, name);
            goto done;
        }
        st_entry e;
        memset(&e, 0, sizeof e);
        if (!dtype_from_str(dt->valuestring, &e.dtype)) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s (only F32, F16, BF16)", path, name,
                         dt->valuestring);
            goto done;
        }
        int nd = cJSON_GetArraySize(shp);
        if (nd > LT_MAX_DIMS) {
            s = lt_error(ctx, LT_ERR_UNSUPPORTED, "%s: tensor '%s': rank %d > %d", path, name, nd, LT_MAX_DIMS);
            goto done;
        }
        e.ndim = nd;
        uint64_t numel = 1;
        for (int d = 0; d < nd; d++) {
            cJSON *x = cJSON_GetArrayItem(shp, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 ||
                x->valuedouble != (double)(int64_t)x->valuedouble) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s': bad shape[%d]", path, name, d);
                goto done;
            }
            e.shape[d] = (int64_t)x->valuedouble;
            if (e.shape[d] && numel > UINT64_MAX / (uint64_t)e.shape[d]) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s': shape overflows", path, name);
                goto done;
            }
            numel *= (uint64_t)e.shape[d];
        }
        double o0 = cJSON_GetArrayItem(off, 0)->valuedouble, o1 = cJSON_GetArrayItem(off, 1)->valuedouble;
        if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) || o0 < 0 ||
            o1 < o0 || o1 > (double)dsize || o0 != (double)(uint64_t)o0 || o1 != (double)(uint64_t)o1) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%.0f, %.0f] outside the %zu data bytes",
                         path, name, o0, o1, dsize);
            goto done;
        }
        uint64_t esz = (uint64_t)lt_dtype_block_bytes(e.dtype);
        if (numel > UINT64_MAX / esz || numel * esz != (uint64_t)o1 - (uint64_t)o0) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s': %llu bytes of data for %llu %s elements", path, name,
                         (unsigned long long)((uint64_t)o1 - (uint64_t)o0), (unsigned long long)numel, dt->valuestring);
            goto done;
        }
        e.shard = shard;
        e.data = data + (size_t)o0;
        e.nbytes = (size_t)(o1 - o0);
        if ((s = grow(ctx, (void **)&st->entries, &st->cap, st->n + 1, sizeof(st_entry), "safetensors table")) != LT_OK)
            goto done;
        if (!(e.name = arena_put(ctx, st, name))) {
            s = lt_ctx_status(ctx);
            goto done;
        }
        st->entries[st->n++] = e;
    }
    /* Tensors of one file must not overlap (the format also forbids holes, which we tolerate). */
    int64_t cnt = st->n - first;
    if (cnt > 1) {
        sorted = malloc((size_t)cnt * sizeof *sorted);
        if (!sorted) {
            s = lt_error(ctx, LT_ERR_OOM, "%s: overlap check", path);
            goto done;
        }
        for (int64_t i = 0; i < cnt; i++) sorted[i] = &st->entries[first + i];
        qsort(sorted, (size_t)cnt, sizeof *sorted, cmp_by_name); /* a name twice first */
        for (int64_t i = 1; i < cnt; i++)
            if (!strcmp(sorted[i - 1]->name, sorted[i]->name)) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: duplicate tensor name '%s'", path, sorted[i]->name);
                goto done;
            }
        qsort(sorted, (size_t)cnt, sizeof *sorted, cmp_by_data);
        /* A zero-size tensor holds no bytes, so it overlaps nothing wherever it points. */
        const st_entry *prev = NULL;
        for (int64_t i = 0; i < cnt; i++) {
            if (!sorted[i]->nbytes) continue;
            if (prev && prev->data + prev->nbytes > sorted[i]->data) {
                s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", path, prev->name,
                             sorted[i]->name);
                goto done;
            }
            prev = sorted[i];
        }
    }
done:
    free(sorted);
    cJSON_Delete(root);
    free(hdr);
    return s;
}

static lt_status read_text(lt_ctx *ctx, const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return lt_error(ctx, LT_ERR_IO, "%s: seek failed", path);
    }
    long n = ftell(f);
    if (n < 0 || n > (64L << 20)) {
        fclose(f);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: unreasonable size %ld", path, n);
    }
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    if (!buf) {
        fclose(f);
        return lt_error(ctx, LT_ERR_OOM, "%s: %ld bytes", path, n);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return lt_error(ctx, LT_ERR_IO, "%s: short read", path);
    }
    buf[n] = 0;
    *out = buf;
    return LT_OK;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int file_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* A weight_map entry and its position in the file, for finding each shard's first mention. */
typedef struct wm_ref {
    cJSON *item;
    int64_t pos;
    int first;
} wm_ref;

static int cmp_ref_by_shard(const void *a, const void *b) {
    const wm_ref *x = a, *y = b;
    int c = strcmp(x->item->valuestring, y->item->valuestring);
    return c ? c : (x->pos > y->pos) - (x->pos < y->pos);
}

static int cmp_ref_by_pos(const void *a, const void *b) {
    const wm_ref *x = a, *y = b;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Opens the shards named by an index file and checks that every weight_map entry is found in the
 * shard it names. */
static lt_status load_index(lt_ctx *ctx, lt_safetensors *st, const char *index_path) {
    char *text = NULL;
    lt_status s = read_text(ctx, index_path, &text);
    if (s != LT_OK) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    char dir[PATH_MAX], shard_path[PATH_MAX];
    const char *slash = strrchr(index_path, '/');
    size_t dlen = slash ? (size_t)(slash - index_path) : 0;
    if (dlen >= sizeof dir) {
        cJSON_Delete(root);
        return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: path too long", index_path);
    }
    memcpy(dir, index_path, dlen);
    dir[dlen] = 0;
    cJSON *wm = root ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: no \"weight_map\" object", index_path);
    }
    /* Distinct shard names in order of first appearance: the entries sorted by (shard name,
     * position), the first of each run marked, then loaded in position order (O(n log n)). */
    int64_t nw = 0;
    for (cJSON *it = wm->child; it; it = it->next) {
        if (!cJSON_IsString(it) || strchr(it->valuestring, '/') || !it->valuestring[0]) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: weight_map['%s'] is not a file name in the folder", index_path,
                         it->string);
            cJSON_Delete(root);
            return s;
        }
        nw++;
    }
    wm_ref *refs = nw ? malloc((size_t)nw * sizeof *refs) : NULL; /* transient */
    if (nw && !refs) {
        cJSON_Delete(root);
        return lt_error(ctx, LT_ERR_OOM, "%s: %lld weight_map entries", index_path, (long long)nw);
    }
    int64_t k = 0;
    for (cJSON *it = wm->child; it; it = it->next, k++) refs[k] = (wm_ref){it, k, 0};
    if (nw) {
        qsort(refs, (size_t)nw, sizeof *refs, cmp_ref_by_shard);
        for (k = 0; k < nw; k++)
            refs[k].first = k == 0 || strcmp(refs[k - 1].item->valuestring, refs[k].item->valuestring) != 0;
        qsort(refs, (size_t)nw, sizeof *refs, cmp_ref_by_pos);
    }
    for (k = 0; k < nw && s == LT_OK; k++) {
        if (!refs[k].first) continue;
        cJSON *it = refs[k].item;
        int w = snprintf(shard_path, sizeof shard_path, "%s%s%s", dir, dlen ? "/" : "", it->valuestring);
        if (w < 0 || (size_t)w >= sizeof shard_path) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: shard path too long", index_path);
            break;
        }
        s = load_shard(ctx, st, shard_path);
    }
    free(refs);
    if (s == LT_OK) s = build_name_table(ctx, st);
    for (cJSON *it = wm->child; it && s == LT_OK; it = it->next) {
        int64_t i = find_index(st, it->string);
        if (i < 0) {
            s = lt_error(ctx, LT_ERR_NOT_FOUND, "%s: tensor '%s' is not in shard %s", index_path, it->string,
                         it->valuestring);
            break;
        }
        const char *sp = st->shards[st->entries[i].shard].path;
        if (!ends_with(sp, it->valuestring)) {
            s = lt_error(ctx, LT_ERR_FORMAT, "%s: tensor '%s' is in %s, the index says %s", index_path, it->string, sp,
                         it->valuestring);
            break;
        }
    }
    cJSON_Delete(root);
    return s;
}

lt_status lt_safetensors_open(lt_ctx *ctx, const char *path, lt_safetensors **out) {
    *out = NULL;
    lt_safetensors *st = lt_calloc(ctx, LT_DEVICE_CPU, sizeof *st, "safetensors");
    if (!st) return lt_ctx_status(ctx);
    lt_status s = LT_OK;
    st->shards = lt_calloc(ctx, LT_DEVICE_CPU, ST_MAX_SHARDS * sizeof(st_shard), "safetensors shards");
    if (!st->shards) {
        s = lt_ctx_status(ctx);
        goto fail;
    }
    char buf[PATH_MAX];
    if (is_dir(path)) {
        int w = snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (w < 0 || (size_t)w >= sizeof buf) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: path too long", path);
            goto fail;
        }
        if (file_exists(buf)) {
            s = load_index(ctx, st, buf);
        } else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            if (!file_exists(buf)) {
                s = lt_error(ctx, LT_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", path);
                goto fail;
            }
            s = load_shard(ctx, st, buf);
            if (s == LT_OK) s = build_name_table(ctx, st);
        }
    } else if (ends_with(path, ".json")) {
        s = load_index(ctx, st, path);
    } else {
        s = load_shard(ctx, st, path);
        if (s == LT_OK) s = build_name_table(ctx, st);
    }
    if (s != LT_OK) goto fail;
    *out = st;
    return LT_OK;
fail:
    lt_safetensors_close(ctx, st);
    return s;
}

void lt_safetensors_close(lt_ctx *ctx, lt_safetensors *st) {
    if (!st) return;
    if (st->shards) {
        for (int i = 0; i < st->n_shards; i++) {
            if (st->shards[i].map) munmap(st->shards[i].map, st->shards[i].size);
            lt_free(ctx, LT_DEVICE_CPU, st->shards[i].path, st->shards[i].path_bytes);
        }
        lt_free(ctx, LT_DEVICE_CPU, st->shards, ST_MAX_SHARDS * sizeof(st_shard));
    }
    if (st->entries) lt_free(ctx, LT_DEVICE_CPU, st->entries, (size_t)st->cap * sizeof(st_entry));
    if (st->meta) lt_free(ctx, LT_DEVICE_CPU, st->meta, (size_t)st->meta_cap * sizeof(char *));
    if (st->names) lt_free(ctx, LT_DEVICE_CPU, st->names, st->names_cap);
    if (st->by_name) lt_free(ctx, LT_DEVICE_CPU, st->by_name, (size_t)st->n * sizeof *st->by_name);
    lt_free(ctx, LT_DEVICE_CPU, st, sizeof *st);
}

int64_t lt_safetensors_count(const lt_safetensors *st) { return st->n; }

const char *lt_safetensors_name(const lt_safetensors *st, int64_t i) {
    return i >= 0 && i < st->n ? st->entries[i].name : NULL;
}

lt_status lt_safetensors_find(lt_ctx *ctx, const lt_safetensors *st, const char *name, lt_tensor *out) {
    int64_t i = find_index(st, name);
    if (i < 0) return lt_error(ctx, LT_ERR_NOT_FOUND, "safetensors: no tensor '%s'", name);
    const st_entry *e = &st->entries[i];
    int64_t one = 1;
    *out = lt_tensor_view((void *)e->data, e->dtype, LT_DEVICE_CPU, e->ndim ? e->ndim : 1, e->ndim ? e->shape : &one);
    return LT_OK;
}

const char *lt_safetensors_metadata(const lt_safetensors *st, const char *key) {
    for (int64_t i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta[2 * i], key)) return st->meta[2 * i + 1];
    return NULL;
}

/* ---- writer ---- */

static lt_status write_all(lt_ctx *ctx, int fd, const void *p, size_t n, const char *path) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return lt_error(ctx, LT_ERR_IO, "%s: write: %s", path, strerror(errno));
        }
        b += w;
        n -= (size_t)w;
    }
    return LT_OK;
}

lt_status lt_safetensors_write(lt_ctx *ctx, const char *path, const lt_safetensors_entry *entries, int64_t n,
                               const char *const *meta_kv, int64_t n_meta) {
    lt_status s = LT_OK;
    char *json = NULL, *hdr = NULL;
    int fd = -1;
    char tmp[PATH_MAX];
    int w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (w < 0 || (size_t)w >= sizeof tmp) return lt_error(ctx, LT_ERR_INVALID_ARG, "%s: path too long", path);
    cJSON *root = cJSON_CreateObject();
    if (!root) return lt_error(ctx, LT_ERR_OOM, "%s: header", path);
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int64_t i = 0; m && i < n_meta; i++) cJSON_AddStringToObject(m, meta_kv[2 * i], meta_kv[2 * i + 1]);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const lt_tensor *t = &entries[i].tensor;
        const char *dt = dtype_to_str(t->dtype);
        const char *name = entries[i].name;
        if (!name || !*name || !strcmp(name, "__metadata__")) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: entry %lld has an invalid name", path, (long long)i);
            goto done;
        }
        if (!dt || !lt_tensor_is_contiguous(t) || t->device != LT_DEVICE_CPU) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: tensor '%s' must be a contiguous host F32/F16/BF16 tensor", path,
                         name);
            goto done;
        }
        if (cJSON_GetObjectItemCaseSensitive(root, name)) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: duplicate tensor name '%s'", path, name);
            goto done;
        }
        int64_t nb = lt_tensor_nbytes(t);
        if (nb < 0) {
            s = lt_error(ctx, LT_ERR_INVALID_ARG, "%s: tensor '%s': size overflows", path, name);
            goto done;
        }
        cJSON *e = cJSON_AddObjectToObject(root, name);
        cJSON *shp = e ? cJSON_AddArrayToObject(e, "shape") : NULL;
        cJSON *offs = e ? cJSON_AddArrayToObject(e, "data_offsets") : NULL;
        if (!offs || !cJSON_AddStringToObject(e, "dtype", dt)) {
            s = lt_error(ctx, LT_ERR_OOM, "%s: header", path);
            goto done;
        }
        for (int d = 0; d < t->ndim; d++) cJSON_AddItemToArray(shp, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += (uint64_t)nb;
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) {
        s = lt_error(ctx, LT_ERR_OOM, "%s: header", path);
        goto done;
    }
    /* Pad the header with spaces to a multiple of 8 so the data starts aligned. */
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
    hdr = malloc(8 + hl);
    if (!hdr) {
        s = lt_error(ctx, LT_ERR_OOM, "%s: header", path);
        goto done;
    }
    for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)hl >> (8 * i)) & 0xff);
    memcpy(hdr + 8, json, jl);
    memset(hdr + 8 + jl, ' ', hl - jl);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        s = lt_error(ctx, LT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    if ((s = write_all(ctx, fd, hdr, 8 + hl, tmp)) != LT_OK) goto done;
    for (int64_t i = 0; i < n; i++)
        if ((s = write_all(ctx, fd, entries[i].tensor.data, (size_t)lt_tensor_nbytes(&entries[i].tensor), tmp)) !=
            LT_OK)
            goto done;
    if (fsync(fd) != 0) {
        s = lt_error(ctx, LT_ERR_IO, "%s: fsync: %s", tmp, strerror(errno));
        goto done;
    }
    if (close(fd) != 0) {
        fd = -1;
        s = lt_error(ctx, LT_ERR_IO, "%s: close: %s", tmp, strerror(errno));
        goto done;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        s = lt_error(ctx, LT_ERR_IO, "%s: rename to %s: %s", tmp, path, strerror(errno));
        goto done;
    }
    /* Make the rename itself durable. */
    {
        char dir[PATH_MAX];
        const char *slash = strrchr(path, '/');
        size_t dl = slash ? (size_t)(slash - path) : 0;
        if (dl == 0) {
            strcpy(dir, slash ? "/" : ".");
        } else if (dl < sizeof dir) {
            memcpy(dir, path, dl);
            dir[dl] = 0;
        } else {
            strcpy(dir, ".");
        }
        int dfd = open(dir, O_RDONLY);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
done:
    if (fd >= 0) close(fd);
    if (s != LT_OK) unlink(tmp);
    free(hdr);
    free(json);
    cJSON_Delete(root);
    return s;
}
