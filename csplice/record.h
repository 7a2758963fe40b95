/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "capture.h"
#include "procinfo.h"
#include "settings.h"
#include "socket.h"
#include "spool.h"

/* The core_pattern argv, in this order after the program name. Required ones first, new ones only appended:
 * installed core_patterns outlive csplice upgrades. */
typedef enum Arg {
        ARG_PID,         /* %P: PID in the initial PID namespace */
        ARG_TID,         /* %i: TID of the dumping thread, in its own namespace */
        ARG_TID_INITIAL, /* %I: TID of the dumping thread, in the initial namespace */
        ARG_UID,         /* %u: real UID */
        ARG_GID,         /* %g: real GID */
        ARG_DUMPABLE,    /* %d: dump mode (0-2), as in prctl(PR_SET_DUMPABLE) */
        ARG_SIGNAL,      /* %s: the signal that caused the dump */
        ARG_TIMESTAMP,   /* %t: time of dump, seconds since the Epoch */
        ARG_RLIMIT,      /* %c: RLIMIT_CORE soft limit */
        ARG_HOSTNAME,    /* %h: nodename, as in uname() */
        ARG_COMM,        /* %e: comm, the thread's name (may hold spaces, '/' and any byte) */
        ARG_PIDFD,       /* %F: pidfd number of the crashed process (Linux 6.16+); empty before */
        _ARG_MAX,
        _ARG_REQUIRED = ARG_COMM + 1,
} Arg;

extern const char *const arg_names[_ARG_MAX];

typedef struct Crash {
        const char *argv[_ARG_MAX]; /* NULL where not given */
        char id[SPOOL_ID_MAX];
        char boot_id[40];
        Settings settings;
        ProcInfo proc;
        Capture capture;
        bool has_core;
        const char *dropped;       /* why the dump was dropped, or NULL */
        bool shed;                 /* not even a record fits its user's budget (admit.c): nothing is stored */
        uint64_t started_ns;       /* CLOCK_REALTIME at csplice's start */
        /* The hold's steps on CLOCK_MONOTONIC, for capture.phases (with Capture's own): csplice's start, then when
         * each step ended; 0 where one did not happen. */
        uint64_t started_mono_ns;
        uint64_t settings_ns;      /* arguments, settings, the caller checked */
        uint64_t metadata_ns;      /* /proc/PID read */
        uint64_t admitted_ns;      /* spool open, record reserved, admission decided (socket mode: answered) */
        uint64_t published_ns;     /* the core fsynced (as configured) and renamed into place */
        uint64_t capture_begin_ns; /* CLOCK_MONOTONIC around the copy */
        uint64_t capture_end_ns;
        uint64_t released_ns;      /* CLOCK_REALTIME once the pipe is drained: the process is let go */
        uint64_t timeout;          /* the capture's time limit in seconds, 0 = none (admit_timeout) */
        bool elf_magic;
        bool socket_mode;          /* the dump came over the coredump socket, not a pipe */
        SocketFacts socket;
} Crash;

/* Parses a numeric argument; -1 when absent, not a number or out of range. */
long long crash_arg_number(const Crash *c, Arg a);
/* The same for arguments that are an int (PID, fd): -1 past INT_MAX rather than another, wrapped, number. */
int crash_arg_int(const Crash *c, Arg a);

/* Writes the spool record as JSON to f. */
void record_write(const Crash *c, FILE *f);
