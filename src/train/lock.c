/* The adapter folder's lock: one `longtune train` at a time writes into a folder. The lock is an
 * flock on LT_TRAIN_LOCK_FILE inside it, which holds the owner's pid; the kernel releases it when
 * the owner exits, however it exits, so a killed run never leaves the folder locked. */
#define _DEFAULT_SOURCE /* flock */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include "train/train_internal.h"

lt_status lt_train_lock_dir(lt_ctx *ctx, const char *dir, int *fd_out) {
    *fd_out = -1;
    char path[LT_TRAIN_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/" LT_TRAIN_LOCK_FILE, dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return lt_error(ctx, LT_ERR_IO, "%s: cannot open the lock file: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        char buf[32] = "";
        ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
        close(fd);
        if (err != EWOULDBLOCK) return lt_error(ctx, LT_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
        buf[n > 0 ? n : 0] = '\0';
        long pid = strtol(buf, NULL, 10);
        return lt_error(ctx, LT_ERR_INVALID_ARG,
                        "%s is in use by another training run (pid %ld, lock %s): one run per --adapter-path", dir, pid,
                        path);
    }
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, (size_t)n, 0) != n) {
        int err = errno;
        close(fd);
        return lt_error(ctx, LT_ERR_IO, "%s: cannot write the pid: %s", path, strerror(err));
    }
    *fd_out = fd;
    return LT_OK;
}

void lt_train_unlock_dir(int fd) {
    if (fd >= 0) close(fd); /* releases the flock; the file stays (removing it would race a waiter) */
}

void lt_train_clean_stale_tmp(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *t = strstr(e->d_name, ".tmp.");
        if (!t || t == e->d_name) continue;
        char *end;
        long pid = strtol(t + 5, &end, 10);
        if (*end || end == t + 5 || pid <= 0) continue;
        if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive or unknown */
        char path[LT_TRAIN_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        (void)unlink(path);
    }
    closedir(d);
}
