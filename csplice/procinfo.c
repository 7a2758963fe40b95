/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "procinfo.h"
#include "util.h"

#define PROC_FILE_MAX (64 * 1024)
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

static void read_optional(int dirfd, const char *name, size_t max, char **ret, size_t *ret_len) {
        int r = read_bounded_at(dirfd, name, max, ret, ret_len);
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to read /proc/PID/%s, ignoring: %m", name);
}

const char *const proc_ns_names[PROC_NS_COUNT] = { "cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts" };

static void read_namespaces(ProcInfo *p, int dirfd) {
        char name[16];

        for (size_t i = 0; i < PROC_NS_COUNT; i++) {
                ssize_t n;

                (void) snprintf(name, sizeof name, "ns/%s", proc_ns_names[i]);
                n = readlinkat(dirfd, name, p->ns[i], sizeof p->ns[i] - 1);
                p->ns[i][n > 0 ? n : 0] = '\0';
        }
}

static bool is_hex(char c) {
        return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* The innermost 64-hex-digit container id in a cgroup text (".../cri-containerd-ID.scope", "/docker/ID"),
 * or false. Only hex digits are copied, so the id is safe in a path. */
static bool container_id(const char *cgroup, char id[65]) {
        bool found = false;

        for (const char *q = cgroup; *q; q++) {
                size_t n = 0;

                if (q != cgroup && is_hex(q[-1]))
                        continue;
                while (n < 65 && is_hex(q[n]))
                        n++;
                if (n == 64) {
                        memcpy(id, q, 64);
                        id[64] = '\0';
                        found = true;
                }
        }
        return found;
}

/* Where containerd (CRI namespace k8s.io, Docker's moby, the default one), CRI-O and rootful Podman keep a
 * running container's OCI bundle. Reading a file there asks no runtime anything: a few failed opens at worst. */
static const char *const oci_bundle_paths[] = {
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/%s/config.json",
        "/run/containerd/io.containerd.runtime.v2.task/moby/%s/config.json",
        "/run/containerd/io.containerd.runtime.v2.task/default/%s/config.json",
        "/run/containers/storage/overlay-containers/%s/userdata/config.json",
        "/var/lib/containers/storage/overlay-containers/%s/userdata/config.json",
        "/run/docker/containerd/daemon/io.containerd.runtime.v1.linux/moby/%s/config.json",
};

static void read_oci_config(ProcInfo *p) {
        /* Tests point this at a fake tree; the kernel passes no environment. */
        const char *root = getenv("CSPLICE_BUNDLE_ROOT") ?: "";
        char id[65], rel[PATH_MAX], path[PATH_MAX];

        if (!p->cgroup || !container_id(p->cgroup, id))
                return;
        for (size_t i = 0; i < ELEMENTSOF(oci_bundle_paths); i++) {
                (void) snprintf(rel, sizeof rel, oci_bundle_paths[i], id);
                (void) snprintf(path, sizeof path, "%s%s", root, rel);
                if (read_bounded_at(AT_FDCWD, path, PROC_OCI_CONFIG_MAX, &p->oci_config, NULL) >= 0)
                        return;
        }
}

int procinfo_collect(ProcInfo *p, const char *proc_root, pid_t pid, int pidfd, time_t crash_time,
                     const Settings *s) {
        char path[PATH_MAX], link[PATH_MAX], *stat = NULL;
        ssize_t n;
        int dirfd, r;

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

        read_optional(dirfd, "comm", 64, &p->comm, NULL);
        /* The kernel appends one newline; the name itself may hold more (prctl(PR_SET_NAME) takes any byte). */
        if (p->comm && p->comm[0] && p->comm[strlen(p->comm) - 1] == '\n')
                p->comm[strlen(p->comm) - 1] = '\0';
        read_optional(dirfd, "cmdline", PROC_FILE_MAX, &p->cmdline, &p->cmdline_len);
        read_optional(dirfd, "status", PROC_FILE_MAX, &p->status, NULL);
        read_optional(dirfd, "cgroup", PROC_FILE_MAX, &p->cgroup, NULL);
        read_namespaces(p, dirfd);
        read_oci_config(p);
        if (s->collect_environ)
                read_optional(dirfd, "environ", PROC_FILE_MAX, &p->environ, &p->environ_len);
        if (s->collect_maps)
                read_optional(dirfd, "maps", PROC_MAPS_MAX, &p->maps, NULL);

        r = read_bounded_at(dirfd, "stat", PROC_FILE_MAX, &stat, NULL);
        if (r >= 0)
                r = parse_start_ticks(stat, &p->start_ticks);
        free(stat);
        (void) close(dirfd);
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to read the start time of PID %d, ignoring: %m", (int) pid);

        if (pidfd >= 0 && verify_pidfd(proc_root, pid, pidfd) >= 0) {
                p->verified_by = "pidfd";
                p->verified = true;
        } else if (r >= 0 && crash_time > 0) {
                p->verified_by = "start_time";
                p->verified = verify_start_time(p, proc_root, crash_time) >= 0;
        }
        if (p->verified_by && !p->verified)
                log_full(LOG_WARNING, "PID %d is not the crashed process any more (checked by %s)", (int) pid,
                         p->verified_by);
        return 0;
}

uint64_t procinfo_rss_bytes(const ProcInfo *p) {
        const char *line;
        unsigned long long kib;

        if (!p->status)
                return 0;
        line = strstr(p->status, "\nVmRSS:");
        if (!line || sscanf(line + strlen("\nVmRSS:"), "%llu kB", &kib) != 1 || kib > UINT64_MAX / 1024)
                return 0;
        return (uint64_t) kib * 1024;
}
