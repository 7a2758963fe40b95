/* SPDX-License-Identifier: MIT */
#pragma once

#include <limits.h>
#include <stddef.h>
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
        STRATEGY_SPLICE,  /* the 16-page splice loop: splice() stdin -> file, chunk_size at a time */
        STRATEGY_RW2,     /* read()/write() with a reader and a writer thread over a ring of buffers */
        STRATEGY_SPLICE2, /* splice() stdin -> private pipe, a second thread splices it -> file */
        STRATEGY_DIRECT,  /* a reader and two writer threads, 2 MiB slots written O_DIRECT */
        _STRATEGY_MAX,
} Strategy;

/* The free-space floor: a size or a share of the filesystem (one of them, the other 0). */
typedef struct SizeOrPercent {
        uint64_t bytes;
        uint64_t percent;
} SizeOrPercent;

/* Named as in corehandler.toml's [capture] section (docs/design.md); setting_table in settings.c is the one
 * list of keys, and `csplice --list-settings` prints it with the built-in defaults. */
typedef struct Settings {
        char spool_dir[PATH_MAX];
        Strategy strategy;
        uint64_t chunk_size;       /* bytes per system call */
        uint64_t pipe_size;        /* bytes, F_SETPIPE_SZ on the core pipe; 0 leaves the kernel's size */
        uint64_t max_dump_size;    /* bytes; 0: no limit */
        uint64_t direct_above;     /* bytes: a process with at least this VmRSS is captured with direct; 0: never */
        uint64_t direct_rate;      /* bytes/s the spool takes O_DIRECT: rw moves to direct when slower; 0: never */
        SizeOrPercent min_free;    /* free-space floor of the spool's filesystem */
        uint64_t max_pending;      /* records in the spool not yet ingested; 0: no limit */
        uint64_t max_pending_per_uid; /* of those, one user's (admit.c); 0: max_pending */
        uint64_t max_per_exe_per_minute; /* 0: no limit */
        uint64_t timeout;          /* seconds, the whole capture; 0: none */
        bool fsync;
        bool sparse;               /* seek over all-zero pages instead of writing them */
        bool io_realtime;          /* the dump's writes in the realtime I/O class, ahead of writeback */
        bool collect_environ;
        bool collect_maps;

        /* Where the values came from, for the record and the kernel log. */
        char source[PATH_MAX];
        bool from_file;
        char error[256];
} Settings;

typedef enum SettingType {
        SETTING_PATH,
        SETTING_STRATEGY,
        SETTING_U64,
        SETTING_BOOL,            /* yes/no (also 1/0, true/false) */
        SETTING_SIZE_OR_PERCENT, /* "N" bytes or "N%" */
} SettingType;

typedef struct SettingDef {
        const char *key;
        SettingType type;
        size_t offset; /* in Settings */
} SettingDef;

extern const SettingDef setting_table[];
extern const size_t setting_table_len;

const char *strategy_to_string(Strategy s);
int strategy_from_string(const char *s);

void settings_defaults(Settings *s);

/* The value of d in s as csplice.conf spells it. */
void setting_format(const Settings *s, const SettingDef *d, char *buf, size_t size);

/* Loads path over the defaults. On any error the settings stay the defaults (a half-applied file is worse
 * than none) and s->error says why; returns 0 or -errno (-EINVAL for a bad line). */
int settings_load(Settings *s, const char *path);
