/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <stdlib.h>

#include "util.h"

int write_full(int fd, const void *buf, size_t len) {
        const char *p = buf;

        while (len > 0) {
                ssize_t n = write(fd, p, len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        return -EIO;
                p += n;
                len -= (size_t) n;
        }
        return 0;
}

ssize_t read_full(int fd, void *buf, size_t max) {
        char *p = buf;
        size_t got = 0;

        while (got < max) {
                ssize_t n = read(fd, p + got, max - got);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                got += (size_t) n;
        }
        return (ssize_t) got;
}

int read_bounded_at(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len) {
        char *buf;
        ssize_t n;
        int fd;

        fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
        if (fd < 0)
                return -errno;

        buf = malloc(max + 1);
        if (!buf) {
                (void) close(fd);
                return -ENOMEM;
        }

        n = read_full(fd, buf, max);
        (void) close(fd);
        if (n < 0) {
                free(buf);
                return (int) n;
        }

        buf[n] = '\0';
        *ret = buf;
        if (ret_len)
                *ret_len = (size_t) n;
        return 0;
}
