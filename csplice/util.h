/* SPDX-License-Identifier: MIT */
#pragma once

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#define ELEMENTSOF(x) (sizeof(x) / sizeof((x)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

static inline uint64_t now_ns(clockid_t clock) {
        struct timespec ts;

        (void) clock_gettime(clock, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

/* Writes all of buf, retrying short writes and EINTR. Returns 0 or -errno. */
int write_full(int fd, const void *buf, size_t len);

/* Reads up to max bytes of a file below dirfd into a NUL-terminated heap buffer.
 * Bounded, because /proc files of a hostile process can be arbitrarily large. */
int read_bounded_at(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len);

/* Reads from fd until EOF or max bytes, whichever comes first. Returns bytes read or -errno. */
ssize_t read_full(int fd, void *buf, size_t max);
