/* The `aborted_memory_ceiling` artifact (see guard.h): one JSON object written atomically
 * (temporary in the same folder, fsync, rename, fsync of the folder). It records what happened;
 * it does not save the checkpoint itself, which is the trainer's job. */
#define _POSIX_C_SOURCE 200809L /* O_CLOEXEC, O_DIRECTORY, fsync */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "longtune/alloc.h"
#include "longtune/guard.h"

/* Writes all of buf to fd; 0 on success. */
static int write_all(int fd, const char *buf, size_t n) {
    while (n) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += w;
        n -= (size_t)w;
    }
    return 0;
}

static void fsync_dir_of(const char *path) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: some filesystems refuse fsync on folders */
        close(fd);
    }
}

static lt_status write_atomic(lt_ctx *ctx, const char *path, const char *text) {
    size_t plen = strlen(path);
    if (!plen || plen > 4000) return lt_error(ctx, LT_ERR_INVALID_ARG, "artifact path of %zu bytes", plen);
    char tmp[4096 + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return lt_error(ctx, LT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int bad = write_all(fd, text, n) || write_all(fd, "\n", 1) || fsync(fd);
    int err = errno;
    if (close(fd)) bad = 1;
    if (bad) {
        unlink(tmp);
        return lt_error(ctx, LT_ERR_IO, "%s: cannot write: %s", tmp, strerror(err));
    }
    if (rename(tmp, path)) {
        err = errno;
        unlink(tmp);
        return lt_error(ctx, LT_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(err));
    }
    fsync_dir_of(path);
    return LT_OK;
}

lt_status lt_guard_write_abort(lt_ctx *ctx, const char *path, const lt_guard_abort_record *r) {
    if (!path || !r) return lt_error(ctx, LT_ERR_INVALID_ARG, "abort artifact: NULL path or record");
    cJSON *plan = NULL;
    if (r->plan_json) {
        plan = cJSON_Parse(r->plan_json);
        if (!plan || !cJSON_IsObject(plan)) {
            cJSON_Delete(plan);
            return lt_error(ctx, LT_ERR_INVALID_ARG, "abort artifact: plan_json is not a JSON object");
        }
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) {
        cJSON_Delete(plan);
        return lt_error(ctx, LT_ERR_OOM, "abort artifact: out of memory");
    }
    /* Byte counts go in as doubles: exact below 2^53 bytes (8 PiB). */
    cJSON_AddStringToObject(o, "status", LT_GUARD_ABORT_STATUS);
    cJSON_AddStringToObject(o, "source", r->breach.source ? r->breach.source : "unknown");
    cJSON_AddStringToObject(o, "device", r->breach.device == LT_DEVICE_CUDA ? "cuda" : "cpu");
    cJSON_AddNumberToObject(o, "ceiling_bytes", (double)r->breach.ceiling_bytes);
    cJSON_AddNumberToObject(o, "observed_bytes", (double)r->breach.observed_bytes);
    cJSON_AddNumberToObject(o, "step", (double)r->step);
    cJSON_AddNumberToObject(o, "elapsed_s", r->breach.elapsed_s);
    cJSON_AddNumberToObject(o, "plan_peak_bytes", (double)r->plan_peak_bytes);
    cJSON_AddNumberToObject(o, "allocator_peak_bytes", (double)r->allocator_peak_bytes);
    if (plan) cJSON_AddItemToObject(o, "plan", plan);
    else cJSON_AddNullToObject(o, "plan");
    if (r->checkpoint) cJSON_AddStringToObject(o, "checkpoint", r->checkpoint);
    else cJSON_AddNullToObject(o, "checkpoint");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return lt_error(ctx, LT_ERR_OOM, "abort artifact: out of memory");
    lt_status s = write_atomic(ctx, path, text);
    cJSON_free(text);
    return s;
}
