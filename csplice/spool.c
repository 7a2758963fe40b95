/* SPDX-License-Identifier: MIT */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "spool.h"
#include "util.h"

#define RATE_DIR ".rate"
#define RATE_WINDOW_SEC 60

int spool_open(const char *path) {
        int fd;

        fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
                if (mkdir(path, 0700) < 0 && errno != EEXIST)
                        return -errno;
                fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        return fd < 0 ? -errno : fd;
}

static bool is_committed_record(const char *name) {
        size_t n = strlen(name);
        return name[0] != '.' && n > 5 && strcmp(name + n - 5, ".json") == 0;
}

/* The uid a committed record names in its head, -1 when it names none (or cannot be read). */
static long long record_uid(int dirfd, const char *name) {
        char head[SPOOL_RECORD_HEAD + 1];
        const char *p;
        ssize_t n;
        int fd;

        fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
                return -1;
        n = pread(fd, head, sizeof head - 1, 0);
        (void) close(fd);
        if (n <= 0)
                return -1;
        head[n] = '\0';
        /* Only our own digits (schema, id) come before it: no string there can hold the key. */
        p = strstr(head, "\"uid\":");
        return p && p[6] >= '0' && p[6] <= '9' ? strtoll(p + 6, NULL, 10) : -1;
}

int spool_count_pending(int dirfd, long long uid, uint64_t limit, Pending *ret) {
        struct dirent *de;
        long long owner;
        DIR *d;
        int fd;

        *ret = (Pending) {};
        fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        d = fdopendir(fd);
        if (!d) {
                (void) close(fd);
                return -errno;
        }
        while ((de = readdir(d)) && ret->all < limit) {
                if (!is_committed_record(de->d_name))
                        continue;
                owner = record_uid(dirfd, de->d_name);
                ret->all++;
                ret->mine += owner == uid;
                ret->root += owner == 0;
        }
        (void) closedir(d);
        return 0;
}

int spool_count_shed(int dirfd, long long uid) {
        long long uids[SPOOL_SHED_UIDS], counts[SPOOL_SHED_UIDS];
        char buf[SPOOL_SHED_UIDS * 48];
        size_t n = 0, len = 0, i;
        ssize_t got;
        int fd, r = 0;

        fd = openat(dirfd, SPOOL_SHED_FILE, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0)
                return -errno;
        if (flock(fd, LOCK_EX) < 0) {
                r = -errno;
                goto finish;
        }
        got = pread(fd, buf, sizeof buf - 1, 0);
        buf[got > 0 ? got : 0] = '\0';
        for (char *line = buf, *next; *line && n < SPOOL_SHED_UIDS; line = next) {
                next = strchr(line, '\n');
                next = next ? next + 1 : line + strlen(line);
                if (sscanf(line, "%lld %lld", &uids[n], &counts[n]) == 2 && counts[n] >= 0)
                        n++;
        }
        if (uid < 0)
                uid = -1;
        for (i = 0; i < n && uids[i] != uid; i++)
                ;
        /* A full table: this user joins the others' line (the last one is kept free for it). */
        if (i == n && n >= SPOOL_SHED_UIDS - 1) {
                uid = -1;
                for (i = 0; i < n && uids[i] != uid; i++)
                        ;
                if (i == SPOOL_SHED_UIDS) /* a table not of our making: its last line makes room */
                        i = --n;
        }
        if (i == n) {
                uids[n] = uid;
                counts[n++] = 0;
        }
        counts[i]++;
        for (i = 0; i < n; i++)
                len += (size_t) snprintf(buf + len, sizeof buf - len, "%lld %lld\n", uids[i], counts[i]);
        if (pwrite(fd, buf, len, 0) != (ssize_t) len || ftruncate(fd, (off_t) len) < 0)
                r = -errno;
finish:
        (void) close(fd);
        return r;
}

static uint64_t fnv1a64(const char *s) {
        uint64_t h = 0xcbf29ce484222325ULL;
        for (; *s; s++)
                h = (h ^ (unsigned char) *s) * 0x100000001b3ULL;
        return h;
}

int spool_rate_hit(int dirfd, long long uid, const char *key, time_t now) {
        char name[48], buf[64] = {};
        long long window = 0, count = 0;
        ssize_t n;
        int rdir, fd, r;

        if (mkdirat(dirfd, RATE_DIR, 0700) < 0 && errno != EEXIST)
                return -errno;
        rdir = openat(dirfd, RATE_DIR, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (rdir < 0)
                return -errno;
        /* A hash, not the executable's name: the name is the crashed process's to choose. The uid in clear, not
         * hashed with it: FNV is no cryptographic hash, and a user who found a path colliding with root's
         * /usr/bin/sleep would spend root's budget. A collision now only costs the user their own. */
        (void) snprintf(name, sizeof name, "%lld-%016llx", uid < 0 ? -1LL : uid, (unsigned long long) fnv1a64(key));
        fd = openat(rdir, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        r = fd < 0 ? -errno : 0;
        (void) close(rdir);
        if (r < 0)
                return r;

        if (flock(fd, LOCK_EX) < 0) {
                r = -errno;
                goto finish;
        }
        n = pread(fd, buf, sizeof buf - 1, 0);
        if (n > 0 && sscanf(buf, "%lld %lld", &window, &count) != 2)
                window = count = 0;
        if (now - window >= RATE_WINDOW_SEC || now < window) {
                window = now;
                count = 0;
        }
        count++;
        n = snprintf(buf, sizeof buf, "%lld %lld\n", window, count);
        if (pwrite(fd, buf, (size_t) n, 0) != n || ftruncate(fd, n) < 0)
                r = -errno;
        else
                r = (int) MIN(count, (long long) INT32_MAX);
finish:
        (void) close(fd);
        return r;
}

/* Gives the unnamed file fd the name `name` in dirfd; fails with EEXIST rather than replace anything. */
static int link_tmpfile(int fd, int dirfd, const char *name) {
        char path[64];

        if (linkat(fd, "", dirfd, name, AT_EMPTY_PATH) >= 0)
                return 0;
        /* AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link works without it. */
        if (errno != ENOENT && errno != EPERM)
                return -errno;
        (void) snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        return linkat(AT_FDCWD, path, dirfd, name, AT_SYMLINK_FOLLOW) < 0 ? -errno : 0;
}

/* An unnamed file in the spool, or -EOPNOTSUPP where the filesystem has no O_TMPFILE. */
static int open_tmpfile(int dirfd) {
        int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd >= 0)
                return fd;
        return errno == EISDIR || errno == EINVAL || errno == ENOENT ? -EOPNOTSUPP : -errno;
}

static int create_named(int dirfd, const char *name) {
        int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        return fd < 0 ? -errno : fd;
}

int spool_create_core(int dirfd, char id[SPOOL_ID_MAX]) {
        char name[SPOOL_ID_MAX + 16], base[SPOOL_ID_MAX];
        int fd, r;

        /* Locked before it has a name: the daemon takes a .tmp file it can lock for an orphan, so the name must
         * never be visible unlocked, not even between open() and flock(). */
        fd = open_tmpfile(dirfd);
        if (fd >= 0 && flock(fd, LOCK_EX) < 0) {
                r = -errno;
                (void) close(fd);
                return r;
        }
        if (fd < 0 && fd != -EOPNOTSUPP)
                return fd;

        (void) snprintf(base, sizeof base, "%s", id);
        for (unsigned attempt = 0; attempt < 16; attempt++) {
                if (attempt > 0)
                        (void) snprintf(id, SPOOL_ID_MAX, "%.80s.%u", base, attempt);
                (void) snprintf(name, sizeof name, ".tmp.%s.core", id);
                if (fd >= 0) {
                        r = link_tmpfile(fd, dirfd, name);
                        if (r == 0)
                                return fd;
                } else {
                        /* No O_TMPFILE here: the short window before flock() is the best this filesystem gives. */
                        r = create_named(dirfd, name);
                        if (r >= 0) {
                                (void) flock(r, LOCK_EX | LOCK_NB);
                                return r;
                        }
                }
                if (r != -EEXIST)
                        break;
        }
        if (fd >= 0)
                (void) close(fd);
        return r;
}

int spool_publish_core(int dirfd, const char *id, bool do_fsync, int fd) {
        char from[SPOOL_ID_MAX + 16], to[SPOOL_ID_MAX + 16];

        if (do_fsync && fsync(fd) < 0)
                return -errno;
        (void) snprintf(from, sizeof from, ".tmp.%s.core", id);
        (void) snprintf(to, sizeof to, "%s.core", id);
        return renameat(dirfd, from, dirfd, to) < 0 ? -errno : 0;
}

int spool_discard_core(int dirfd, const char *id) {
        char name[SPOOL_ID_MAX + 16];

        (void) snprintf(name, sizeof name, ".tmp.%s.core", id);
        return unlinkat(dirfd, name, 0) < 0 ? -errno : 0;
}

int spool_create_record(int dirfd, const char *id, uint64_t reserve, bool named_ok, SpoolRecord *ret) {
        int fd, r;

        *ret = (SpoolRecord) { .fd = -1 };
        fd = open_tmpfile(dirfd);
        if (fd == -EOPNOTSUPP && named_ok) {
                (void) snprintf(ret->tmp_name, sizeof ret->tmp_name, ".tmp.%s.json", id);
                fd = create_named(dirfd, ret->tmp_name);
                if (fd >= 0)
                        (void) flock(fd, LOCK_EX | LOCK_NB);
        }
        if (fd < 0)
                return fd;
        /* Room for the record, taken before the dump can fill the disk: a full disk still gets its record. */
        r = reserve > 0 ? posix_fallocate(fd, 0, (off_t) reserve) : 0;
        if (r != 0 && r != EOPNOTSUPP)
                (void) log_errno(LOG_WARNING, r, "Failed to reserve %llu bytes for the record, ignoring: %m",
                                 (unsigned long long) reserve);
        ret->fd = fd;
        return 0;
}

int spool_commit_record(int dirfd, const char *id, bool do_fsync, SpoolRecord *rec, uint64_t length) {
        char name[SPOOL_ID_MAX + 16];
        int r;

        /* Give back what the reservation did not use. */
        if (ftruncate(rec->fd, (off_t) length) < 0)
                return -errno;
        if (do_fsync && fsync(rec->fd) < 0)
                return -errno;
        (void) snprintf(name, sizeof name, "%s.json", id);
        if (rec->tmp_name[0])
                r = renameat(dirfd, rec->tmp_name, dirfd, name) < 0 ? -errno : 0;
        else
                r = link_tmpfile(rec->fd, dirfd, name);
        if (r < 0)
                return r;
        /* The new name is only durable once the directory is. */
        if (do_fsync && fsync(dirfd) < 0)
                return -errno;
        return 0;
}
