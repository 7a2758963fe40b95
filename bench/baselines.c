/* SPDX-License-Identifier: MIT */
/*
 * baselines: the simplest core_pattern handlers, for bench/capture.py to measure csplice against.
 *
 *   baselines rw FILE   read()/write() 64 KiB at a time from stdin into FILE: the plain loop csplice must match
 *   baselines null [PIPE_BYTES]   splice() stdin to /dev/null, the pipe first enlarged to PIPE_BYTES (csplice's
 *                                 pipe_size): no file at all, so the kernel's own dump rate (the floor)
 *   baselines read [PIPE_BYTES]   read() stdin 256 KiB at a time into one buffer, each 4 KiB block checked for
 *                                 zeros as csplice's sparse writes check it, nothing written: the floor of a
 *                                 handler that must look at the bytes (to leave holes), where the drain floor
 *                                 never copies them out of the pipe
 *   baselines splicedirect FILE [PIPE_BYTES]  splice() stdin into FILE opened with O_DIRECT, 1 MiB a call: no copy
 *                                 through user memory and none into the page cache, one write in flight (an
 *                                 experiment: what zero copy would give; a tail the disk refuses unaligned goes
 *                                 through the page cache)
 *   baselines odirect FILE BYTES  no pipe: writes BYTES of a pattern into FILE with O_DIRECT in 8 MiB blocks and
 *                                 prints the seconds it took: the spool filesystem's own write rate (2nd floor)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define DIRECT_BLOCK (8 << 20)
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static int copy_rw(const char *path) {
        static char buf[64 * 1024];
        int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ssize_t n;

        if (out < 0)
                return 1;
        while ((n = read(STDIN_FILENO, buf, sizeof buf)) > 0)
                for (ssize_t done = 0; done < n;) {
                        ssize_t w = write(out, buf + done, (size_t) (n - done));
                        if (w < 0)
                                return 1;
                        done += w;
                }
        return n < 0 || close(out) < 0;
}

static int to_null(const char *pipe_bytes) {
        int out = open("/dev/null", O_WRONLY | O_CLOEXEC);
        ssize_t n;

        if (out < 0)
                return 1;
        if (pipe_bytes && fcntl(STDIN_FILENO, F_SETPIPE_SZ, atoi(pipe_bytes)) < 0)
                return 1;
        while ((n = splice(STDIN_FILENO, NULL, out, NULL, 1 << 20, SPLICE_F_MOVE)) > 0)
                ;
        return n < 0;
}

static int read_only(const char *pipe_bytes) {
        static char buf[256 * 1024] __attribute__((aligned(4096)));
        size_t zero = 0;
        ssize_t n;

        if (pipe_bytes && fcntl(STDIN_FILENO, F_SETPIPE_SZ, atoi(pipe_bytes)) < 0)
                return 1;
        while ((n = read(STDIN_FILENO, buf, sizeof buf)) > 0)
                for (ssize_t i = 0; i + 4096 <= n; i += 4096)
                        /* csplice/capture.c's block_is_zero: memcmp is vectorised, a byte loop is not. */
                        zero += buf[i] == 0 && memcmp(buf + i, buf + i + 1, 4095) == 0;
        /* The count is used, so the compiler keeps the check it measures. */
        return n < 0 || zero == (size_t) -1;
}

static int splice_direct(const char *path, const char *pipe_bytes) {
        int direct = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
        int buffered = open(path, O_WRONLY | O_CLOEXEC);
        loff_t pos = 0;
        ssize_t n;

        if (direct < 0 || buffered < 0)
                return 1;
        if (pipe_bytes && fcntl(STDIN_FILENO, F_SETPIPE_SZ, atoi(pipe_bytes)) < 0)
                return 1;
        do {
                int avail = 0;

                (void) ioctl(STDIN_FILENO, FIONREAD, &avail);
                /* O_DIRECT takes whole blocks at aligned offsets: the dump's data (page-aligned in an ELF core);
                 * the headers and notes before it, and a tail, go through the page cache. */
                n = -1;
                errno = EINVAL;
                if (pos % 4096 == 0 && avail >= 4096)
                        n = splice(STDIN_FILENO, NULL, direct, &pos, MIN(1 << 20, avail / 4096 * 4096), SPLICE_F_MOVE);
                /* EINVAL: a buffer of the pipe not whole pages (a writer's odd length); nothing moved. */
                if (n < 0 && errno == EINVAL)
                        n = splice(STDIN_FILENO, NULL, buffered, &pos, 4096 - pos % 4096, SPLICE_F_MOVE);
        } while (n > 0);
        return n < 0 || close(buffered) < 0 || close(direct) < 0;
}

static int write_direct(const char *path, unsigned long long bytes) {
        struct timespec t0, t1;
        char *buf = aligned_alloc(4096, DIRECT_BLOCK);
        int out = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);

        if (!buf || out < 0)
                return 1;
        for (size_t i = 0; i < DIRECT_BLOCK; i++)
                buf[i] = (char) (i * 7 + 1);
        (void) clock_gettime(CLOCK_MONOTONIC, &t0);
        for (unsigned long long off = 0; off < bytes; off += DIRECT_BLOCK)
                if (pwrite(out, buf, DIRECT_BLOCK, (off_t) off) != DIRECT_BLOCK)
                        return 1;
        (void) clock_gettime(CLOCK_MONOTONIC, &t1);
        (void) printf("%.6f\n", (double) (t1.tv_sec - t0.tv_sec) + (double) (t1.tv_nsec - t0.tv_nsec) / 1e9);
        return close(out) < 0;
}

int main(int argc, char *argv[]) {
        if (argc == 3 && strcmp(argv[1], "rw") == 0)
                return copy_rw(argv[2]);
        if ((argc == 2 || argc == 3) && strcmp(argv[1], "null") == 0)
                return to_null(argc == 3 ? argv[2] : NULL);
        if ((argc == 2 || argc == 3) && strcmp(argv[1], "read") == 0)
                return read_only(argc == 3 ? argv[2] : NULL);
        if ((argc == 3 || argc == 4) && strcmp(argv[1], "splicedirect") == 0)
                return splice_direct(argv[2], argc == 4 ? argv[3] : NULL);
        if (argc == 4 && strcmp(argv[1], "odirect") == 0)
                return write_direct(argv[2], strtoull(argv[3], NULL, 10));
        (void) fprintf(stderr, "usage: baselines rw FILE | null [PIPE_BYTES] | read [PIPE_BYTES] | splicedirect FILE [PIPE_BYTES] | odirect FILE BYTES\n");
        return 2;
}
