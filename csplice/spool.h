/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "settings.h"

#define SPOOL_ID_MAX 96

/* Opens (creating the last component, 0700) the spool directory; never follows a symlink there. */
int spool_open(const char *path);

/* A record names its uid within its first SPOOL_RECORD_HEAD bytes (record.c writes it right behind the id). */
#define SPOOL_RECORD_HEAD 256

/* Committed records still waiting for the daemon: all of them, uid's, and root's (a record whose head names
 * no uid is uid -1's). */
typedef struct Pending {
        uint64_t all, mine, root;
} Pending;

/* Counts them, stopping once all reaches limit. Returns 0 or -errno. */
int spool_count_pending(int dirfd, long long uid, uint64_t limit, Pending *ret);

/* Counts a crash shed for its user's budget (nothing else of it is stored) in <spool>/.shed: a "<uid> <count>"
 * line per user, at most SPOOL_SHED_UIDS of them; the users past that share the line of uid -1. */
#define SPOOL_SHED_FILE ".shed"
#define SPOOL_SHED_UIDS 64
int spool_count_shed(int dirfd, long long uid);

/* Counts this crash against the one-minute window of (uid, key) in <spool>/.rate/<uid>-<hash of key> (uid -1:
 * unknown). Returns the count including this crash, or -errno. Serialised with flock() since crashes of one
 * program often come together. */
int spool_rate_hit(int dirfd, long long uid, const char *key, time_t now);

/* Creates the core file, locked before it gets its name ".tmp.<id>.core" (0600): a .tmp file whose lock the
 * daemon can take means its writer died. If the id is taken, a suffix is added to it. Returns the fd or -errno. */
int spool_create_core(int dirfd, char id[SPOOL_ID_MAX]);

/* Renames ".tmp.<id>.core" to "<id>.core". */
int spool_publish_core(int dirfd, const char *id, bool do_fsync, int fd);

/* Removes ".tmp.<id>.core": the capture kept nothing of the dump. The fd stays locked until closed. */
int spool_discard_core(int dirfd, const char *id);

typedef struct SpoolRecord {
        int fd;
        char tmp_name[SPOOL_ID_MAX + 16]; /* "" when the file is unnamed (O_TMPFILE) until the commit */
} SpoolRecord;

/* Creates the record's file, unnamed where the filesystem allows, with reserve bytes allocated so that the
 * record still fits once the dump has filled the disk. Without O_TMPFILE: -EOPNOTSUPP, or with named_ok a
 * ".tmp.<id>.json" (locked), which is only worth it right before the commit: the daemon deletes old ones. */
int spool_create_record(int dirfd, const char *id, uint64_t reserve, bool named_ok, SpoolRecord *ret);

/* Cuts the record to length and names it "<id>.json": the commit point. */
int spool_commit_record(int dirfd, const char *id, bool do_fsync, SpoolRecord *rec, uint64_t length);
