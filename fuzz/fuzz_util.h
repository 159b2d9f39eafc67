/* Fuzz helpers (built with _GNU_SOURCE for memfd_create): expose an input buffer as a file path (memfd, no disk I/O) for readers that take
 * paths, so the same code path as a user's file is exercised. */
#ifndef LT_FUZZ_UTIL_H
#define LT_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

/* Writes data to a fresh memfd; fills path with /proc/self/fd/N. Returns the fd or -1. */
static inline int lt_fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t n) {
    int fd = memfd_create("lt-fuzz", 0);
    if (fd < 0) return -1;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        off += (size_t)w;
    }
    snprintf(path, n, "/proc/self/fd/%d", fd);
    return fd;
}

#endif
