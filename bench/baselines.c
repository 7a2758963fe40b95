/* SPDX-License-Identifier: MIT */
/*
 * baselines: the simplest core_pattern handlers, for bench/capture.py to measure csplice against.
 *
 *   baselines rw FILE   read()/write() 64 KiB at a time from stdin into FILE: the plain loop csplice must match
 *   baselines null      splice() stdin to /dev/null: no file at all, so the kernel's own dump rate (the floor)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

static int to_null(void) {
        int out = open("/dev/null", O_WRONLY | O_CLOEXEC);
        ssize_t n;

        if (out < 0)
                return 1;
        while ((n = splice(STDIN_FILENO, NULL, out, NULL, 1 << 20, SPLICE_F_MOVE)) > 0)
                ;
        return n < 0;
}

int main(int argc, char *argv[]) {
        if (argc == 3 && strcmp(argv[1], "rw") == 0)
                return copy_rw(argv[2]);
        if (argc == 2 && strcmp(argv[1], "null") == 0)
                return to_null();
        (void) fprintf(stderr, "usage: baselines rw FILE | baselines null\n");
        return 2;
}
