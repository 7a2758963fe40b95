/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

#include "container.h"
#include "settings.h"

/* The namespaces whose inode numbers the record keeps, in this order (procinfo.c's proc_ns_names). */
#define PROC_NS_COUNT 8
#define PROC_NS_MNT 2
#define PROC_NS_PID 4
extern const char *const proc_ns_names[PROC_NS_COUNT];

typedef struct ProcInfo {
        char *exe;
        char *comm;
        char *cmdline;      /* NUL-separated, cmdline_len bytes */
        size_t cmdline_len;
        char *status;
        char *cgroup;
        char *environ;      /* only if collect_environ */
        size_t environ_len;
        char *maps;         /* only if collect_maps */
        char ns[PROC_NS_COUNT][48]; /* readlinks of /proc/PID/ns/<name> ("pid:[4026531836]"), "" if unreadable */
        Container container; /* the container it is in and its bundle's naming annotations (container.c) */
        uid_t userns_owner;  /* who made its user namespace (NS_GET_OWNER_UID, as the initial one sees them) */
        bool userns_owner_known;
        const char *truncated[6]; /* the files cut at their cap (procinfo.c), in reading order */
        unsigned n_truncated;
        unsigned long long start_ticks;
        const char *verified_by; /* "pidfd", "start_time" or NULL */
        bool verified;
        bool available;     /* /proc/PID could be opened at all */
} ProcInfo;

/* The process's resident memory (VmRSS of its status, read before the dump) in bytes; 0 if unknown. */
uint64_t procinfo_rss_bytes(const ProcInfo *p);
/* Its address space (VmSize) in bytes, which bounds what a dump of it holds; 0 if unknown. */
uint64_t procinfo_vm_bytes(const ProcInfo *p);

void procinfo_free(ProcInfo *p);

/* Reads what the record needs of proc_root/PID, before the dump is touched, while the kernel keeps the
 * crashed process around. Each file that can't be read is logged and left NULL; returns -errno only when
 * the process directory itself is gone. Nothing is kept of a process that is shown not to be the one that
 * crashed (verified false). */
int procinfo_collect(ProcInfo *p, const char *proc_root, pid_t pid, int pidfd, time_t crash_time,
                     const Settings *s);
