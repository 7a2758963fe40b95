/* SPDX-License-Identifier: MIT */
/*
 * Who crashed: the checks that the kernel (and no one else) started us, and the facts that name the crash
 * before its pipe is drained, after which the kernel may reap the process.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "identity.h"
#include "util.h"

/* Anything but the kernel's pipe is someone running csplice by hand with a terminal, /dev/null, a file or
 * garbage: a usage error, before anything is read or stored. */
const char *identity_check_caller(const Crash *c, int in_fd, const char *proc_root, char *buf, size_t size) {
        char path[PATH_MAX];
        struct stat st;
        int pid = crash_arg_int(c, ARG_PID);

        if (pid <= 0) {
                (void) snprintf(buf, size, "%%P must be the PID of the crashed process, not \"%.64s\"",
                                c->argv[ARG_PID] ?: "");
                return buf;
        }
        (void) snprintf(path, sizeof path, "%s/%d", proc_root, pid);
        if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
                (void) snprintf(buf, size, "PID %d is not a live process (%s): csplice is run by the kernel", pid,
                                path);
                return buf;
        }
        if (in_fd < 0 || fstat(in_fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
                (void) snprintf(buf, size, "stdin must be the kernel's core pipe, not %s",
                                in_fd < 0 ? "closed" : S_ISCHR(st.st_mode) ? (isatty(in_fd) ? "a terminal" :
                                "a device") : S_ISREG(st.st_mode) ? "a regular file" : S_ISSOCK(st.st_mode) ?
                                "a socket" : "something else");
                return buf;
        }
        return NULL;
}

static void read_boot_id(Crash *c, const char *proc_root) {
        char path[PATH_MAX], *buf = NULL, *w;

        (void) snprintf(path, sizeof path, "%s/sys/kernel/random/boot_id", proc_root);
        if (read_bounded_at(AT_FDCWD, path, 64, &buf, NULL) < 0)
                return;
        w = c->boot_id;
        for (char *p = buf; *p && w < c->boot_id + 32; p++)
                if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))
                        *w++ = *p;
        *w = '\0';
        free(buf);
}

/* "<realtime µs>-<boot id prefix>-<pid>": sorts by time, unique across reboots and PID reuse. */
static void make_id(Crash *c) {
        long long pid = crash_arg_number(c, ARG_PID);

        (void) snprintf(c->id, sizeof c->id, "%llu-%.16s-%lld", (unsigned long long) (c->started_ns / 1000),
                        c->boot_id[0] ? c->boot_id : "0000000000000000", pid < 0 ? 0 : pid);
}

int identity_collect(Crash *c, const char *proc_root) {
        int r;

        read_boot_id(c, proc_root);
        r = procinfo_collect(&c->proc, proc_root, crash_arg_int(c, ARG_PID), crash_arg_int(c, ARG_PIDFD),
                             (time_t) crash_arg_number(c, ARG_TIMESTAMP), &c->settings);
        make_id(c);
        return r;
}
