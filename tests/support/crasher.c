/* SPDX-License-Identifier: MIT */
/*
 * crasher: a process that dies on purpose, for tests and benchmarks of the real kernel path.
 *
 *   crasher segv  [MIB] [--untouched-half|--untouched]   single thread, SIGSEGV by a NULL write
 *   crasher abort [MIB] [--untouched-half|--untouched]   four threads, abort() from a worker (SIGABRT)
 *
 * Before crashing it maps MIB MiB and fills it with a pattern a test can find in the core: every 64-bit word
 * of the region holds its offset in the region XOR 0xc0ffee00c0ffee00. With --untouched-half only the first
 * half is written; the rest stays untouched (the kernel dumps it as zeros); with --untouched only the last word
 * is (the kernel writes all the zeros before it). It prints the region's address
 * and waits for a newline on stdin if --wait is given, so a benchmark can start the clock at the crash.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PATTERN 0xc0ffee00c0ffee00ULL

static void crash_here_segv(void) {
        /* The pointer itself is volatile: with a known NULL the compiler may drop the store as undefined. */
        volatile int *volatile p = NULL;
        *p = 1;
}

static void *worker(void *arg) {
        if (arg)
                abort();
        for (;;)
                pause();
        return NULL;
}

int main(int argc, char *argv[]) {
        size_t mib = 1, len;
        int untouched_half = 0, untouched = 0, wait_for_go = 0;
        uint64_t *region;

        if (argc < 2 || (strcmp(argv[1], "segv") != 0 && strcmp(argv[1], "abort") != 0)) {
                fprintf(stderr, "usage: crasher segv|abort [MIB] [--untouched-half|--untouched] [--wait]\n");
                return 2;
        }
        for (int i = 2; i < argc; i++) {
                if (strcmp(argv[i], "--untouched-half") == 0)
                        untouched_half = 1;
                else if (strcmp(argv[i], "--untouched") == 0)
                        untouched = 1;
                else if (strcmp(argv[i], "--wait") == 0)
                        wait_for_go = 1;
                else
                        mib = strtoull(argv[i], NULL, 10);
        }
        len = mib << 20;
        /* --untouched: a mapping far beyond RAM, reserving no memory, that the kernel still dumps. */
        region = mmap(NULL, len, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | (untouched ? MAP_NORESERVE : 0), -1, 0);
        if (region == MAP_FAILED) {
                perror("mmap");
                return 1;
        }
        for (size_t i = 0; i < (untouched ? 0 : untouched_half ? len / 2 : len) / 8; i++)
                region[i] = (i * 8) ^ PATTERN;
        /* Its last word only: the kernel skips trailing untouched pages of a dump, the ones before a written
         * page it writes as zeros (into a pipe, every one of them). */
        if (untouched)
                region[len / 8 - 1] = (len - 8) ^ PATTERN;
        printf("region %p %zu\n", (void *) region, len);
        fflush(stdout);
        if (wait_for_go) {
                char c;
                if (read(STDIN_FILENO, &c, 1) < 0)
                        return 1;
        }

        if (strcmp(argv[1], "segv") == 0)
                crash_here_segv();

        pthread_t t[4];
        for (int i = 0; i < 3; i++)
                pthread_create(&t[i], NULL, worker, NULL);
        pthread_create(&t[3], NULL, worker, (void *) 1);
        for (;;)
                pause();
}
