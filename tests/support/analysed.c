/* SPDX-License-Identifier: MIT */
/*
 * analysed: crashes with known stacks, for the analysis tests (tests/local/test_analysis_real.py).
 *
 *   analysed segv       main -> crash_segv: a NULL write
 *   analysed other      main -> crash_other: a NULL write at another site
 *   analysed thread     8 workers started and waiting, worker 5 crashes in worker_crash
 *   analysed recurse    recurse() 5000 deep, then a NULL write
 *   analysed assert     do_assert: assert() fails (SIGABRT)
 *   analysed strlen     count_name: strlen(NULL), in whichever ifunc variant libc picked for this CPU
 *   analysed doublefree release: free() twice (glibc's tcache check aborts)
 *   analysed overflow   overflow(): unbounded recursion into the stack guard
 *   analysed threads N [MIB]  N threads with small stacks, then MIB MiB written (in the core), then main
 *                       crashes (thousands of threads; a big core of many threads for bench/minicore.py)
 *
 * -DPAD adds code before the crash sites: the same source rebuilt, every offset moved.
 */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef PAD
__attribute__((noinline)) int padding(int x) { for (int i = 0; i < x; i++) x ^= i * 7; return x; }
#endif

static volatile int *volatile nowhere;

__attribute__((noinline)) void crash_segv(void) { *nowhere = 1; }
__attribute__((noinline)) void crash_other(void) { *nowhere = 2; }

__attribute__((noinline)) int recurse(int n) {
        if (n == 0)
                *nowhere = 3;
        return recurse(n - 1) + 1;
}

__attribute__((noinline)) void do_assert(int x) { assert(x == 42); }

__attribute__((noinline)) size_t count_name(const char *name) { return strlen(name) + 1; }

__attribute__((noinline)) void release(char *p) {
        free(p);
        free(p);
}

__attribute__((noinline)) int overflow(volatile char *up) {
        volatile char frame[1024];
        frame[0] = up ? up[0] : 0;
        return overflow(frame) + frame[0];
}

static pthread_barrier_t started;

__attribute__((noinline)) void worker_crash(void) { *nowhere = 5; }

static void *worker(void *arg) {
        pthread_barrier_wait(&started);
        if ((long) arg == 5)
                worker_crash();
        for (;;)
                pause();
        return NULL;
}

static void *idle(void *arg) {
        (void) arg;
        for (;;)
                pause();
        return NULL;
}

int main(int argc, char *argv[]) {
        if (argc < 2)
                return 2;
#ifdef PAD
        if (argc > 5)
                return padding(argc);
#endif
        if (!strcmp(argv[1], "segv"))
                crash_segv();
        else if (!strcmp(argv[1], "other"))
                crash_other();
        else if (!strcmp(argv[1], "recurse"))
                return recurse(5000);
        else if (!strcmp(argv[1], "assert"))
                do_assert(argc);
        else if (!strcmp(argv[1], "strlen"))
                return (int) count_name(argc > 5 ? argv[2] : NULL);
        else if (!strcmp(argv[1], "doublefree"))
                release(malloc(32));
        else if (!strcmp(argv[1], "overflow"))
                return overflow(NULL);
        else if (!strcmp(argv[1], "thread")) {
                pthread_t t[8];
                pthread_barrier_init(&started, NULL, 9);
                for (long i = 0; i < 8; i++)
                        pthread_create(&t[i], NULL, worker, (void *) i);
                pthread_barrier_wait(&started);
                for (;;)
                        pause();
        } else if (!strcmp(argv[1], "threads")) {
                int n = argc > 2 ? atoi(argv[2]) : 1000;
                pthread_attr_t attr;
                pthread_t t;
                pthread_attr_init(&attr);
                pthread_attr_setstacksize(&attr, 64 << 10);
                for (int i = 0; i < n; i++)
                        if (pthread_create(&t, &attr, idle, NULL) != 0)
                                return 1;
                if (argc > 3) {
                        size_t len = strtoull(argv[3], NULL, 10) << 20;
                        char *region = malloc(len);
                        if (!region)
                                return 1;
                        memset(region, 0x5a, len);
                }
                usleep(200000);
                crash_segv();
        }
        return 1;
}
