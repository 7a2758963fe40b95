/* SPDX-License-Identifier: MIT */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#ifndef CSPLICE_SETTINGS_PATH
#define CSPLICE_SETTINGS_PATH "/var/lib/corehandler/csplice.conf"
#endif
#ifndef CSPLICE_SPOOL_DIR
#define CSPLICE_SPOOL_DIR "/var/lib/corehandler/spool"
#endif

typedef enum Strategy {
        STRATEGY_RW,      /* read()/write() loop, one thread */
        STRATEGY_SPLICE,  /* the seed's loop: splice() stdin -> file, chunk_bytes at a time */
        STRATEGY_RW2,     /* read()/write() with a reader and a writer thread over a ring of buffers */
        STRATEGY_SPLICE2, /* splice() stdin -> private pipe, a second thread splices it -> file */
        STRATEGY_DIRECT,  /* rw2 with 8 MiB slots written O_DIRECT, through the page cache while the disk lags */
        _STRATEGY_MAX,
} Strategy;

typedef struct Settings {
        char spool_dir[PATH_MAX];
        Strategy strategy;
        uint64_t chunk_bytes;      /* per system call */
        uint64_t pipe_bytes;       /* F_SETPIPE_SZ on the core pipe; 0 leaves the kernel's size */
        uint64_t max_dump_bytes;   /* 0: no limit */
        uint64_t direct_above_bytes; /* dumps of processes with at least this VmRSS use direct; 0: never */
        uint64_t min_free_bytes;   /* free-space floor of the spool's filesystem, absolute ... */
        uint64_t min_free_percent; /* ... and relative; the larger wins */
        uint64_t max_pending;      /* records in the spool not yet ingested; 0: no limit */
        uint64_t max_per_exe_per_minute; /* 0: no limit */
        uint64_t timeout_sec;      /* whole capture; 0: none */
        bool fsync;
        bool sparse;               /* seek over all-zero pages instead of writing them */
        bool collect_environ;
        bool collect_maps;

        /* Where the values came from, for the record and the kernel log. */
        char source[PATH_MAX];
        bool from_file;
        char error[256];
} Settings;

const char *strategy_to_string(Strategy s);
int strategy_from_string(const char *s);

void settings_defaults(Settings *s);

/* Loads path over the defaults. On any error the settings stay the defaults (a half-applied file is worse
 * than none) and s->error says why; returns 0 or -errno (-EINVAL for a bad line). */
int settings_load(Settings *s, const char *path);
