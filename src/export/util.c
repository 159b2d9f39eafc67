/* Helpers shared by the export writers: whole-file reads and atomic writes, free-space checks,
 * row conversion into the output dtype (with the round trip for the error report), and the
 * per-class error accounting. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "export/export_internal.h"
#include "train/train_internal.h"

int lt_export_can_quantize(lt_dtype t) {
    /* GGUF's own types: the float ones and every block format lt_quantize_row encodes but int4_g64 */
    if (t == LT_DTYPE_F32 || t == LT_DTYPE_F16 || t == LT_DTYPE_BF16) return 1;
    return t != LT_DTYPE_INT4_G64 && lt_quantize_has_encoder(t);
}

lt_status lt_ex_read_file(lt_ctx *ctx, const char *path, size_t max, char **out, size_t *n) {
    *out = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return lt_error(ctx, errno == ENOENT ? LT_ERR_NOT_FOUND : LT_ERR_IO, "%s: %s", path, strerror(errno));
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || (unsigned long)size > max) {
        fclose(f);
        return lt_error(ctx, LT_ERR_FORMAT, "%s: unreadable or larger than %zu bytes", path, max);
    }
    rewind(f);
    char *b = malloc((size_t)size + 1); /* transient: freed by the caller right after parsing */
    if (!b) {
        fclose(f);
        return lt_error(ctx, LT_ERR_OOM, "%s: cannot buffer %ld bytes", path, size);
    }
    size_t got = fread(b, 1, (size_t)size, f);
    fclose(f);
    if (got != (size_t)size) {
        free(b);
        return lt_error(ctx, LT_ERR_IO, "%s: short read", path);
    }
    b[size] = 0;
    *out = b;
    *n = (size_t)size;
    return LT_OK;
}

lt_status lt_ex_write_file(lt_ctx *ctx, const char *path, const void *data, size_t n) {
    lt_atomic_file af;
    LT_TRY(lt_atomic_open(ctx, &af, path));
    lt_status s = lt_atomic_write(ctx, &af, data, n);
    if (s != LT_OK) {
        lt_atomic_abort(&af);
        return s;
    }
    return lt_atomic_commit(ctx, &af);
}

int lt_ex_gguf_str(lt_ctx *ctx, const lt_gguf *g, const char *key, char *buf, size_t n) {
    const char *s;
    size_t l;
    if (lt_gguf_get_str(ctx, g, key, &s, &l) != LT_OK || l >= n) {
        lt_ctx_clear_error(ctx);
        return 0;
    }
    memcpy(buf, s, l);
    buf[l] = 0;
    return 1;
}

lt_status lt_ex_check_space(lt_ctx *ctx, const char *path, uint64_t need) {
    char dir[EX_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) dir[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    struct statvfs vs;
    if (statvfs(dir, &vs) != 0) return lt_error(ctx, LT_ERR_IO, "%s: cannot read free space: %s", dir, strerror(errno));
    uint64_t have = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
    /* Headroom for folder entries and filesystem rounding. */
    uint64_t want = need + need / 100 + ((uint64_t)1 << 20);
    if (have < want)
        return lt_error(ctx, LT_ERR_IO, "%s: no space: the export needs %llu bytes, %llu are free", dir,
                        (unsigned long long)want, (unsigned long long)have);
    return LT_OK;
}

void lt_ex_convert_row(lt_dtype dt, const float *src, void *dst, float *back, int64_t n) {
    switch (dt) {
    case LT_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        if (back) memcpy(back, src, (size_t)n * sizeof(float));
        break;
    case LT_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = lt_f32_to_f16(src[i]);
            ((uint16_t *)dst)[i] = h;
            if (back) back[i] = lt_f16_to_f32(h);
        }
        break;
    case LT_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = lt_f32_to_bf16(src[i]);
            ((uint16_t *)dst)[i] = h;
            if (back) back[i] = lt_bf16_to_f32(h);
        }
        break;
    default:
        lt_quantize_row(dt, src, dst, n);
        if (back) lt_dequantize_row(dt, dst, back, n);
    }
}

void lt_ex_report_add(lt_export_report *rep, const char *cls, lt_dtype dt, const float *merged, const float *written,
                      int64_t n, int new_tensor) {
    if (!rep) return;
    int c = 0;
    while (c < rep->n_classes && strcmp(rep->classes[c].name, cls)) c++;
    if (c == rep->n_classes) {
        if (c == LT_EXPORT_MAX_CLASSES) return;
        rep->n_classes++;
        memset(&rep->classes[c], 0, sizeof rep->classes[c]);
        snprintf(rep->classes[c].name, sizeof rep->classes[c].name, "%s", cls);
    }
    lt_export_class_error *e = &rep->classes[c];
    e->dtype = dt;
    if (new_tensor) e->n_tensors++;
    if (!merged || !written) { /* copied bytes: written equals the source, which is the merged row */
        e->n_elems += n;
        return;
    }
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)written[i] - (double)merged[i];
        if (fabs(d) > e->max_abs) e->max_abs = fabs(d);
        ss += d * d;
    }
    e->rms += ss; /* sum of squares until lt_ex_report_finish */
    e->n_elems += n;
}

void lt_ex_report_finish(lt_export_report *rep) {
    if (!rep) return;
    for (int c = 0; c < rep->n_classes; c++) {
        lt_export_class_error *e = &rep->classes[c];
        e->rms = e->n_elems ? sqrt(e->rms / (double)e->n_elems) : 0.0;
    }
}
