/* The metrics log: one JSON object per line in <adapter-path>/metrics.jsonl, flushed per line so
 * a killed run keeps what it logged. On resume the records past the checkpoint's step are dropped
 * (atomically) so the file describes one trajectory. It does not rotate or compress. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "longtune/alloc.h"
#include "train/train_internal.h"

struct lt_metrics {
    FILE *f;
    char path[LT_TRAIN_PATH_MAX];
};

/* Rewrites `path` keeping lines whose "step" is <= keep (lines that do not parse are dropped). */
static lt_status truncate_after(lt_ctx *ctx, const char *path, int64_t keep) {
    FILE *in = fopen(path, "rb");
    if (!in) return errno == ENOENT ? LT_OK : lt_error(ctx, LT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    lt_atomic_file af;
    lt_status s = lt_atomic_open(ctx, &af, path);
    if (s != LT_OK) {
        fclose(in);
        return s;
    }
    char line[4096];
    while (s == LT_OK && fgets(line, sizeof line, in)) {
        const char *k = strstr(line, "\"step\":");
        if (!k) continue;
        long long step = strtoll(k + 7, NULL, 10);
        if (step <= keep) s = lt_atomic_write(ctx, &af, line, strlen(line));
    }
    fclose(in);
    if (s != LT_OK) {
        lt_atomic_abort(&af);
        return s;
    }
    return lt_atomic_commit(ctx, &af);
}

size_t lt_metrics_bytes(void) { return sizeof(lt_metrics); }

lt_status lt_metrics_open(lt_ctx *ctx, const char *path, int64_t keep_until_step, lt_metrics **out) {
    *out = NULL;
    if (strlen(path) >= LT_TRAIN_PATH_MAX) return lt_error(ctx, LT_ERR_INVALID_ARG, "metrics path too long");
    if (keep_until_step >= 0) LT_TRY(truncate_after(ctx, path, keep_until_step));
    lt_metrics *m = lt_alloc(ctx, LT_DEVICE_CPU, sizeof *m, "metrics log");
    if (!m) return LT_ERR_OOM;
    snprintf(m->path, sizeof m->path, "%s", path);
    m->f = fopen(path, keep_until_step >= 0 ? "ab" : "wb");
    if (!m->f) {
        lt_status s = lt_error(ctx, LT_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
        lt_free(ctx, LT_DEVICE_CPU, m, sizeof *m);
        return s;
    }
    *out = m;
    return LT_OK;
}

lt_status lt_metrics_write(lt_ctx *ctx, lt_metrics *m, const lt_metrics_record *r) {
    char line[1024];
    int n = snprintf(line, sizeof line, "{\"step\":%lld", (long long)r->step);
    /* JSON has no NaN: absent values are left out; a measured loss that is not finite is null. */
#define NUM(key, v) \
    if (isfinite(v)) n += snprintf(line + n, sizeof line - (size_t)n, ",\"" key "\":%.9g", (v))
#define INT(key, v) \
    if ((v) >= 0) n += snprintf(line + n, sizeof line - (size_t)n, ",\"" key "\":%lld", (long long)(v))
    if (r->train_loss_measured && !isfinite(r->train_loss))
        n += snprintf(line + n, sizeof line - (size_t)n, ",\"train_loss\":null,\"train_loss_non_finite\":\"%s\"",
                      isnan(r->train_loss)    ? "nan"
                          : r->train_loss > 0 ? "inf"
                                              : "-inf");
    else NUM("train_loss", r->train_loss);
    if (r->aux_loss > 0) NUM("aux_loss", r->aux_loss);
    NUM("val_loss", r->val_loss);
    NUM("learning_rate", r->learning_rate);
    NUM("tokens_per_s", r->tokens_per_s);
    INT("tokens", r->tokens);
    NUM("elapsed_s", r->elapsed_s);
    INT("peak_bytes", r->peak_bytes);
    INT("plan_bytes", r->plan_bytes);
    if (r->host_peak_bytes > 0) INT("host_peak_bytes", r->host_peak_bytes); /* device runs only */
    if (r->seq_len > 0) {
        INT("seq_len", r->seq_len);
        INT("stage", r->stage);
    }
#undef NUM
#undef INT
    n += snprintf(line + n, sizeof line - (size_t)n, "}\n");
    if (fputs(line, m->f) == EOF || fflush(m->f) != 0)
        return lt_error(ctx, LT_ERR_IO, "%s: write failed: %s", m->path, strerror(errno));
    return LT_OK;
}

void lt_metrics_close(lt_ctx *ctx, lt_metrics *m) {
    if (!m) return;
    if (m->f) fclose(m->f);
    lt_free(ctx, LT_DEVICE_CPU, m, sizeof *m);
}
