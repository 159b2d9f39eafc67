/* Atomic file writes for checkpoints, adapters and the metrics log: write a temp file in the
 * target's folder, fsync it, rename it over the target, fsync the folder. A crash leaves either
 * the old file or the new one, never a half-written one. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train_internal.h"

lt_status lt_atomic_open(lt_ctx *ctx, lt_atomic_file *af, const char *path) {
    memset(af, 0, sizeof *af);
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof af->path) return lt_error(ctx, LT_ERR_INVALID_ARG, "bad output path '%s'", path);
    memcpy(af->path, path, n + 1);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmp.%ld", path, (long)getpid());
    af->f = fopen(af->tmp, "wb");
    if (!af->f) return lt_error(ctx, LT_ERR_IO, "%s: cannot create: %s", af->tmp, strerror(errno));
    return LT_OK;
}

lt_status lt_atomic_write(lt_ctx *ctx, lt_atomic_file *af, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, af->f) != n)
        return lt_error(ctx, LT_ERR_IO, "%s: write failed: %s", af->tmp, strerror(errno));
    return LT_OK;
}

static void fsync_parent(const char *path) {
    char buf[LT_TRAIN_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    int fd = open(dirname(buf), O_RDONLY);
    if (fd >= 0) {
        (void)fsync(fd); /* best effort: some filesystems refuse fsync on folders */
        close(fd);
    }
}

lt_status lt_atomic_commit(lt_ctx *ctx, lt_atomic_file *af) {
    int bad = fflush(af->f) != 0 || fsync(fileno(af->f)) != 0;
    int err = errno;
    bad |= fclose(af->f) != 0;
    af->f = NULL;
    if (bad) {
        unlink(af->tmp);
        return lt_error(ctx, LT_ERR_IO, "%s: flush/fsync failed: %s", af->tmp, strerror(err));
    }
    if (rename(af->tmp, af->path) != 0) {
        err = errno;
        unlink(af->tmp);
        return lt_error(ctx, LT_ERR_IO, "%s: rename to %s failed: %s", af->tmp, af->path, strerror(err));
    }
    fsync_parent(af->path);
    return LT_OK;
}

void lt_atomic_abort(lt_atomic_file *af) {
    if (af->f) {
        fclose(af->f);
        af->f = NULL;
        unlink(af->tmp);
    }
}

static lt_status mkdir_one(lt_ctx *ctx, const char *dir) {
    if (mkdir(dir, 0755) == 0 || errno == EEXIST) {
        struct stat st;
        if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) return LT_OK;
        if (lstat(dir, &st) == 0 && S_ISLNK(st.st_mode))
            return lt_error(ctx, LT_ERR_IO, "%s: is a symbolic link to nothing (a dangling link), not a folder", dir);
        return lt_error(ctx, LT_ERR_IO, "%s: exists and is not a folder", dir);
    }
    return lt_error(ctx, LT_ERR_IO, "%s: cannot create folder: %s", dir, strerror(errno));
}

lt_status lt_train_mkdir(lt_ctx *ctx, const char *dir) {
    char buf[LT_TRAIN_PATH_MAX];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf) return lt_error(ctx, LT_ERR_INVALID_ARG, "bad folder path '%s'", dir);
    memcpy(buf, dir, n + 1);
    /* Parents first, as mkdir -p. */
    for (size_t i = 1; i < n; i++)
        if (buf[i] == '/' && buf[i - 1] != '/') {
            buf[i] = '\0';
            lt_status s = mkdir_one(ctx, buf);
            buf[i] = '/';
            if (s != LT_OK) return s;
        }
    return mkdir_one(ctx, buf);
}

uint64_t lt_fnv64(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}
