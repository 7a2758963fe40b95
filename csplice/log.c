/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

#define MAX_ERRORS 16
#define LINE_MAX_LEN 512

static int log_fd = -1;
static bool log_is_kmsg;
static char errors[MAX_ERRORS][LINE_MAX_LEN];
static unsigned n_errors;

void log_open(void) {
        if (getenv("CSPLICE_LOG_STDERR")) {
                log_fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
                return;
        }
        log_fd = open("/dev/kmsg", O_WRONLY | O_NOCTTY | O_CLOEXEC);
        log_is_kmsg = log_fd >= 0;
}

static void log_vline(int prio, const char *fmt, va_list ap) {
        char msg[LINE_MAX_LEN], line[LINE_MAX_LEN + 32];
        int n;

        (void) vsnprintf(msg, sizeof msg, fmt, ap);

        if (prio <= LOG_WARNING && n_errors < MAX_ERRORS)
                memcpy(errors[n_errors++], msg, sizeof msg);

        if (log_fd < 0)
                return;
        /* kmsg takes a "<prio>" prefix; LOG_DAEMON keeps us out of the kernel's own facility. */
        if (log_is_kmsg)
                n = snprintf(line, sizeof line, "<%d>csplice[%d]: %s\n", LOG_DAEMON | prio, (int) getpid(), msg);
        else
                n = snprintf(line, sizeof line, "csplice[%d]: %s\n", (int) getpid(), msg);
        if (n > 0)
                (void) write_full(log_fd, line, MIN((size_t) n, sizeof line - 1));
}

void log_full(int prio, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        log_vline(prio, fmt, ap);
        va_end(ap);
}

int log_errno(int prio, int err, const char *fmt, ...) {
        va_list ap;

        err = abs(err);
        errno = err;
        va_start(ap, fmt);
        log_vline(prio, fmt, ap);
        va_end(ap);
        return -err;
}

unsigned log_error_count(void) {
        return n_errors;
}

const char *log_error_get(unsigned i) {
        return i < n_errors ? errors[i] : NULL;
}

void log_forget_errors(void) {
        n_errors = 0;
}
