/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <limits.h>
#include <linux/nsfs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "container.h"
#include "log.h"
#include "procinfo.h"
#include "util.h"

#define PROC_FILE_MAX (64 * 1024)
/* What the record keeps of each file the process has a say in; more is cut and named in proc.truncated. Each
 * invalid byte costs six in the record (\udcXX), so these (and PATH_MAX for exe) bound a record to about
 * 200 KiB without maps and environ, which are kept only on request: a 64 KiB argv of high bytes made a 700 KiB
 * record, and every record is indexed and published. */
#define PROC_CMDLINE_MAX (4 * 1024)
#define PROC_CGROUP_MAX (8 * 1024)
#define PROC_STATUS_MAX (16 * 1024)
#define PROC_ENVIRON_MAX (32 * 1024)
#define PROC_MAPS_MAX (1024 * 1024)

/* Field 22 of /proc/PID/stat, counted after the last ')' since comm may itself contain ") ". */
static int parse_start_ticks(const char *stat, unsigned long long *ret) {
        const char *p = strrchr(stat, ')');
        if (!p)
                return -EINVAL;
        p++;
        for (int field = 3; field < 22; field++) {
                p = strchr(p + 1, ' ');
                if (!p)
                        return -EINVAL;
        }
        return sscanf(p + 1, "%llu", ret) == 1 ? 0 : -EINVAL;
}

static int boot_time(const char *proc_root, time_t *ret) {
        char path[PATH_MAX], *buf = NULL, *p;
        int r;

        (void) snprintf(path, sizeof path, "%s/stat", proc_root);
        r = read_bounded_at(AT_FDCWD, path, PROC_FILE_MAX, &buf, NULL);
        if (r < 0)
                return r;
        p = strstr(buf, "\nbtime ");
        r = p && sscanf(p + 7, "%ld", ret) == 1 ? 0 : -EINVAL;
        free(buf);
        return r;
}

/* A pidfd names the crashed process itself, so if it still says PID in its fdinfo and the process is alive,
 * the /proc/PID we opened is not a newer process that reused the number. */
static int verify_pidfd(const char *proc_root, pid_t pid, int pidfd) {
        char path[PATH_MAX], *buf = NULL, *p;
        int r;

        (void) snprintf(path, sizeof path, "%s/self/fdinfo/%d", proc_root, pidfd);
        r = read_bounded_at(AT_FDCWD, path, PROC_FILE_MAX, &buf, NULL);
        if (r < 0)
                return r;
        p = strstr(buf, "\nPid:");
        r = p && atoi(p + 5) == pid ? 0 : -ESRCH;
        free(buf);
        return r;
}

/* Without a pidfd: a process that started after the crash can't be the one that crashed. */
static int verify_start_time(const ProcInfo *p, const char *proc_root, time_t crash_time) {
        long hz = sysconf(_SC_CLK_TCK);
        time_t btime;
        int r;

        r = boot_time(proc_root, &btime);
        if (r < 0)
                return r;
        return btime + (time_t) (p->start_ticks / (unsigned long long) hz) <= crash_time ? 0 : -ESRCH;
}

/* Reads at most cap bytes of /proc/PID/name; past that the text is cut and the field named in proc.truncated. */
static void read_capped(ProcInfo *p, int dirfd, const char *name, size_t cap, char **ret, size_t *ret_len) {
        size_t len;
        int r;

        r = read_bounded_at(dirfd, name, cap + 1, ret, &len);
        if (r < 0) {
                (void) log_errno(LOG_WARNING, r, "Failed to read /proc/PID/%s, ignoring: %m", name);
                return;
        }
        if (len > cap) {
                (*ret)[cap] = '\0';
                len = cap;
                if (p->n_truncated < ELEMENTSOF(p->truncated))
                        p->truncated[p->n_truncated++] = name;
        }
        if (ret_len)
                *ret_len = len;
}

const char *const proc_ns_names[PROC_NS_COUNT] = { "cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts" };

static void read_namespaces(ProcInfo *p, int dirfd) {
        char name[16];
        int fd;

        /* The user namespace's owner: a dump of a process in a user namespace is shown to the user who made it
         * (corehandler/store/userview.py), not to whoever its uids map to. */
        fd = openat(dirfd, "ns/user", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
                p->userns_owner_known = ioctl(fd, NS_GET_OWNER_UID, &p->userns_owner) >= 0;
                (void) close(fd);
        }

        for (size_t i = 0; i < PROC_NS_COUNT; i++) {
                ssize_t n;

                (void) snprintf(name, sizeof name, "ns/%s", proc_ns_names[i]);
                n = readlinkat(dirfd, name, p->ns[i], sizeof p->ns[i] - 1);
                p->ns[i][n > 0 ? n : 0] = '\0';
        }
}

/* What another process's /proc said: not the crashed one's, so none of it goes in the record. */
static void forget(ProcInfo *p) {
        ProcInfo kept = { .available = p->available, .start_ticks = p->start_ticks, .verified_by = p->verified_by };

        procinfo_free(p);
        *p = kept;
}

void procinfo_free(ProcInfo *p) {
        free(p->exe);
        free(p->comm);
        free(p->cmdline);
        free(p->status);
        free(p->cgroup);
        free(p->environ);
        free(p->maps);
        container_free(&p->container);
        *p = (ProcInfo) {};
}

int procinfo_collect(ProcInfo *p, const char *proc_root, pid_t pid, int pidfd, time_t crash_time,
                     const Settings *s) {
        char path[PATH_MAX], link[PATH_MAX], *stat = NULL;
        ssize_t n;
        int dirfd, r, v;

        *p = (ProcInfo) {};
        if (pid <= 0)
                return -ESRCH;

        (void) snprintf(path, sizeof path, "%s/%d", proc_root, (int) pid);
        /* One directory fd for every read below, so they all see the same process even if the PID is reused
         * midway. */
        dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dirfd < 0)
                return -errno;
        p->available = true;

        n = readlinkat(dirfd, "exe", link, sizeof link - 1);
        if (n >= 0) {
                link[n] = '\0';
                p->exe = strdup(link);
        } else
                (void) log_errno(LOG_WARNING, errno, "Failed to read /proc/PID/exe, ignoring: %m");

        read_capped(p, dirfd, "comm", 64, &p->comm, NULL);
        /* The kernel appends one newline; the name itself may hold more (prctl(PR_SET_NAME) takes any byte). */
        if (p->comm && p->comm[0] && p->comm[strlen(p->comm) - 1] == '\n')
                p->comm[strlen(p->comm) - 1] = '\0';
        read_capped(p, dirfd, "cmdline", PROC_CMDLINE_MAX, &p->cmdline, &p->cmdline_len);
        read_capped(p, dirfd, "status", PROC_STATUS_MAX, &p->status, NULL);
        read_capped(p, dirfd, "cgroup", PROC_CGROUP_MAX, &p->cgroup, NULL);
        read_namespaces(p, dirfd);
        if (s->collect_environ)
                read_capped(p, dirfd, "environ", PROC_ENVIRON_MAX, &p->environ, &p->environ_len);
        if (s->collect_maps)
                read_capped(p, dirfd, "maps", PROC_MAPS_MAX, &p->maps, NULL);

        r = read_bounded_at(dirfd, "stat", PROC_FILE_MAX, &stat, NULL);
        if (r >= 0)
                r = parse_start_ticks(stat, &p->start_ticks);
        free(stat);
        (void) close(dirfd);
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to read the start time of PID %d, ignoring: %m", (int) pid);

        /* The pidfd is the crashed process itself: when it names another PID, or none (reaped), no fallback can
         * make /proc/PID its. It can only not be read (no %F, an older kernel), and then the start time decides. */
        v = pidfd >= 0 ? verify_pidfd(proc_root, pid, pidfd) : -EBADF;
        if (v >= 0 || v == -ESRCH) {
                p->verified_by = "pidfd";
                p->verified = v >= 0;
        } else if (r >= 0 && crash_time > 0) {
                p->verified_by = "start_time";
                p->verified = verify_start_time(p, proc_root, crash_time) >= 0;
        }
        if (p->verified_by && !p->verified) {
                log_full(LOG_WARNING, "PID %d is not the crashed process any more (checked by %s), recording "
                         "nothing of it", (int) pid, p->verified_by);
                forget(p);
                return 0;
        }
        /* After the check: a bundle is read only for the process that crashed. */
        (void) container_find(&p->container, proc_root, p->cgroup, p->ns[PROC_NS_MNT], p->ns[PROC_NS_PID]);
        return 0;
}

/* A "Name:   N kB" line of status, in bytes; 0 if absent. */
static uint64_t status_kib_field(const ProcInfo *p, const char *field) {
        char key[32];
        const char *line;
        unsigned long long kib;

        if (!p->status)
                return 0;
        (void) snprintf(key, sizeof key, "\n%s:", field);
        line = strstr(p->status, key);
        if (!line || sscanf(line + strlen(key), "%llu kB", &kib) != 1 || kib > UINT64_MAX / 1024)
                return 0;
        return (uint64_t) kib * 1024;
}

uint64_t procinfo_rss_bytes(const ProcInfo *p) {
        return status_kib_field(p, "VmRSS");
}

uint64_t procinfo_vm_bytes(const ProcInfo *p) {
        return status_kib_field(p, "VmSize");
}
