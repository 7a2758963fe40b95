/* SPDX-License-Identifier: MIT */
/*
 * Socket mode: kernel.core_pattern = "@@/run/corehandler/coredump.socket" (Linux 6.17+) or "@..." (6.16+).
 *
 * The kernel connects to our listening socket as the crashing task, so the peer's pidfd names the process;
 * with "@@" it sends a struct coredump_req, we answer a struct coredump_ack that takes the dump or refuses it,
 * the kernel answers a 4-byte mark and then (if taken) streams the core. A refused dump is never written: the
 * crashed process is released at once. The structs are defined here from the kernel's uapi
 * (include/uapi/linux/coredump.h, pidfd.h) since this machine's headers may predate them; every size is read
 * from the kernel's own size fields, so a later kernel's larger structs are fine.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "record.h"
#include "log.h"
#include "socket.h"
#include "util.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

/* include/uapi/linux/coredump.h */
#define COREDUMP_KERNEL (1ULL << 0)
#define COREDUMP_USERSPACE (1ULL << 1)
#define COREDUMP_REJECT (1ULL << 2)
#define COREDUMP_WAIT (1ULL << 3)
#define COREDUMP_REQ_SIZE_VER0 16U
#define COREDUMP_ACK_SIZE_VER0 16U
/* systemd's bound too: a request is a handful of fields, anything near a page is not the kernel. */
#define COREDUMP_REQ_SIZE_MAX 4096U
#define COREDUMP_MARK_REQACK 0U

struct coredump_req_v0 {
        uint32_t size;
        uint32_t size_ack;
        uint64_t mask;
};

struct coredump_ack_v0 {
        uint32_t size;
        uint32_t spare;
        uint64_t mask;
};

/* include/uapi/linux/pidfd.h, up to PIDFD_INFO_SIZE_VER2 (80 bytes) */
#define PIDFD_INFO_COREDUMP (1ULL << 4)
#define PIDFD_INFO_COREDUMP_SIGNAL (1ULL << 6)
#define PIDFD_COREDUMPED (1U << 0)
#define PIDFD_COREDUMP_USER (1U << 2)
#define PIDFD_COREDUMP_ROOT (1U << 3)

struct csplice_pidfd_info {
        uint64_t mask;
        uint64_t cgroupid;
        uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
        int32_t exit_code;
        uint32_t coredump_mask;
        uint32_t coredump_signal;
        uint64_t supported_mask;
};
#define PIDFD_GET_INFO _IOWR(0xFF, 11, struct csplice_pidfd_info)

/* Only ever set by tests (the kernel passes no environment): accept a socketpair's peer as "the kernel". A
 * connection to the listening socket always has its path as local address, so this cannot be reached by
 * connecting to the real socket even if the variable leaked into the listener's environment. */
_Static_assert(ELEMENTSOF(((SocketFacts *) 0)->args) == _ARG_MAX, "one slot per argument");

#define TEST_PEER_ENV "CSPLICE_TEST_SOCKETPAIR_PEER"

bool socket_is_connection(int fd) {
        struct stat st;
        return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

static bool is_unnamed(int fd) {
        struct sockaddr_storage sa;
        socklen_t len = sizeof sa;

        return getsockname(fd, (struct sockaddr *) &sa, &len) == 0 && len <= sizeof(sa_family_t);
}

/* RLIMIT_CORE's soft limit as the kernel prints %c: a number, RLIM_INFINITY as 18446744073709551615. */
static void read_rlimit(int procfd, char *buf, size_t size) {
        char *text = NULL, *p, soft[32];

        buf[0] = '\0';
        if (read_bounded_at(procfd, "limits", 16 * 1024, &text, NULL) < 0)
                return;
        p = strstr(text, "\nMax core file size");
        if (p && sscanf(p + strlen("\nMax core file size"), " %31s", soft) == 1)
                (void) snprintf(buf, size, "%s", strcmp(soft, "unlimited") == 0 ? "18446744073709551615" : soft);
        free(text);
}

/* Field 52 of /proc/PID/stat, the exit code: while the task dumps, the signal that killed it (the kernel sets
 * the group's exit code before it connects). Kernels with PIDFD_INFO_COREDUMP_SIGNAL say it directly. */
static int read_stat_signal(int procfd) {
        char *text = NULL, *p;
        int sig = -1;

        if (read_bounded_at(procfd, "stat", 4096, &text, NULL) < 0)
                return -1;
        p = strrchr(text, ')');
        for (int field = 2; p && field < 52; field++)
                p = strchr(p + 1, ' ');
        if (p && sscanf(p + 1, "%d", &sig) != 1)
                sig = -1;
        free(text);
        return sig > 0 && sig < 128 ? sig : -1;
}

static void set_arg(Crash *c, Arg a, const char *fmt, unsigned long long v) {
        (void) snprintf(c->socket.args[a], sizeof c->socket.args[a], fmt, v);
        c->argv[a] = c->socket.args[a];
}

int socket_identify(int fd, Crash *c, const char *proc_root) {
        struct csplice_pidfd_info info = { .mask = PIDFD_INFO_COREDUMP | PIDFD_INFO_COREDUMP_SIGNAL };
        SocketFacts *f = &c->socket;
        socklen_t len = sizeof f->pidfd;
        struct utsname un;
        char path[PATH_MAX];
        bool test_peer;
        int procfd, r;

        f->pidfd = -1;
        f->mark = -1;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &f->pidfd, &len) < 0)
                return -errno;
        if (ioctl(f->pidfd, PIDFD_GET_INFO, &info) < 0)
                return -errno;
        test_peer = getenv(TEST_PEER_ENV) && is_unnamed(fd);
        f->coredump_mask = info.mask & PIDFD_INFO_COREDUMP ? info.coredump_mask : 0;
        if (!(f->coredump_mask & PIDFD_COREDUMPED) && !test_peer)
                return -EPERM;

        set_arg(c, ARG_PID, "%llu", info.tgid);
        set_arg(c, ARG_UID, "%llu", info.ruid);
        set_arg(c, ARG_GID, "%llu", info.rgid);
        if (f->coredump_mask & (PIDFD_COREDUMP_USER | PIDFD_COREDUMP_ROOT))
                set_arg(c, ARG_DUMPABLE, "%llu", f->coredump_mask & PIDFD_COREDUMP_ROOT ? 2 : 1);
        if (info.mask & PIDFD_INFO_COREDUMP_SIGNAL && info.coredump_signal > 0)
                set_arg(c, ARG_SIGNAL, "%llu", info.coredump_signal);
        set_arg(c, ARG_TIMESTAMP, "%llu", c->started_ns / 1000000000ULL);
        set_arg(c, ARG_PIDFD, "%llu", (unsigned) f->pidfd);
        /* Ours, not the crashed task's UTS namespace: the kernel gives a socket server no %h. */
        if (uname(&un) == 0) {
                (void) snprintf(c->socket.args[ARG_HOSTNAME], sizeof c->socket.args[ARG_HOSTNAME], "%s",
                                un.nodename);
                c->argv[ARG_HOSTNAME] = c->socket.args[ARG_HOSTNAME];
        }
        /* The TIDs (%i %I) are the dumping thread's; the pidfd names the thread group, so they stay unknown. */

        (void) snprintf(path, sizeof path, "%s/%u", proc_root, info.tgid);
        procfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (procfd >= 0) {
                char *comm = NULL;

                int sig = c->argv[ARG_SIGNAL] ? -1 : read_stat_signal(procfd);

                if (sig > 0)
                        set_arg(c, ARG_SIGNAL, "%llu", (unsigned) sig);
                read_rlimit(procfd, c->socket.args[ARG_RLIMIT], sizeof c->socket.args[ARG_RLIMIT]);
                if (c->socket.args[ARG_RLIMIT][0])
                        c->argv[ARG_RLIMIT] = c->socket.args[ARG_RLIMIT];
                if (read_bounded_at(procfd, "comm", 64, &comm, NULL) >= 0) {
                        comm[strcspn(comm, "\n")] = '\0';
                        (void) snprintf(c->socket.args[ARG_COMM], sizeof c->socket.args[ARG_COMM], "%s", comm);
                        c->argv[ARG_COMM] = c->socket.args[ARG_COMM];
                        free(comm);
                }
                (void) close(procfd);
        }

        r = socket_read_request(fd, f);
        if (r < 0 && !f->error)
                f->error = "read_error";
        return 0;
}

void socket_count_refused(const char *spool_dir) {
        char buf[32] = {};
        long long count = 0;
        ssize_t n;
        int dirfd, fd;

        dirfd = spool_open(spool_dir);
        if (dirfd < 0)
                return;
        fd = openat(dirfd, REFUSED_FILE, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        (void) close(dirfd);
        if (fd < 0)
                return;
        if (flock(fd, LOCK_EX) == 0) {
                n = pread(fd, buf, sizeof buf - 1, 0);
                if (n > 0)
                        count = atoll(buf);
                n = snprintf(buf, sizeof buf, "%lld\n", count + 1);
                if (pwrite(fd, buf, (size_t) n, 0) != n)
                        (void) log_errno(LOG_WARNING, errno, "Failed to count the refused peer, ignoring: %m");
        }
        (void) close(fd);
}

/* recv() of exactly len bytes (flags MSG_PEEK or 0). Returns len, a short count at EOF, or -errno. */
static ssize_t recv_exact(int fd, void *buf, size_t len, int flags) {
        size_t done = 0;

        while (done < len) {
                ssize_t n = recv(fd, (char *) buf + (flags & MSG_PEEK ? 0 : done),
                                 flags & MSG_PEEK ? len : len - done, flags | MSG_WAITALL);
                if (n < 0 && errno == EINTR && !capture_timed_out)
                        continue;
                if (n < 0)
                        return capture_timed_out ? -ETIMEDOUT : -errno;
                if (n == 0)
                        return (ssize_t) done;
                if (flags & MSG_PEEK) {
                        if ((size_t) n == len)
                                return n;
                        continue; /* MSG_WAITALL with MSG_PEEK may return early; peek again */
                }
                done += (size_t) n;
        }
        return (ssize_t) done;
}

static int protocol_error(SocketFacts *f, const char *why) {
        f->error = why;
        return -EPROTO;
}

int socket_read_request(int fd, SocketFacts *f) {
        struct coredump_req_v0 req = {};
        char rest[256];
        uint32_t left;
        ssize_t n;

        n = recv_exact(fd, &req.size, sizeof req.size, MSG_PEEK);
        if (n < 0)
                return n;
        if (n < (ssize_t) sizeof req.size)
                return protocol_error(f, "peer_gone");
        /* Plain "@": no request, the core itself is already streaming. */
        if (memcmp(&req.size, "\177ELF", 4) == 0)
                return 0;
        if (req.size < COREDUMP_REQ_SIZE_VER0 || req.size > COREDUMP_REQ_SIZE_MAX)
                return protocol_error(f, "bad_request_size");
        n = recv_exact(fd, &req, sizeof req, 0);
        if (n < 0)
                return n;
        if (n < (ssize_t) sizeof req)
                return protocol_error(f, "peer_gone");
        f->handshake = true;
        f->req_size = req.size;
        f->req_size_ack = req.size_ack;
        f->req_mask = req.mask;
        /* A later kernel's longer request: what we do not know of it, we read and let go. */
        for (left = req.size - (uint32_t) sizeof req; left > 0; left -= (uint32_t) n) {
                n = recv_exact(fd, rest, MIN(left, (uint32_t) sizeof rest), 0);
                if (n < 0)
                        return n;
                if (n == 0)
                        return protocol_error(f, "peer_gone");
        }
        return 0;
}

int socket_answer(int fd, SocketFacts *f, bool keep) {
        struct coredump_ack_v0 ack = {};
        uint32_t mark;
        uint64_t want;
        ssize_t n;

        if (!f->handshake)
                return 0;
        if (f->req_size_ack < COREDUMP_ACK_SIZE_VER0)
                return protocol_error(f, "bad_ack_size");
        /* WAIT keeps the task until we close: its /proc stays for us, and it costs nothing when we close early. */
        want = (keep ? COREDUMP_KERNEL : COREDUMP_REJECT) | COREDUMP_WAIT;
        /* Only bits the kernel offered may be set; WAIT is a courtesy, the choice is not. */
        if (!(f->req_mask & COREDUMP_WAIT))
                want &= ~COREDUMP_WAIT;
        if ((f->req_mask & want) != want)
                return protocol_error(f, keep ? "kernel_unsupported" : "reject_unsupported");
        ack.size = COREDUMP_ACK_SIZE_VER0;
        ack.mask = want;
        for (;;) {
                n = send(fd, &ack, sizeof ack, MSG_NOSIGNAL);
                if (n >= 0 || errno != EINTR || capture_timed_out)
                        break;
        }
        if (n < 0)
                return errno == EPIPE || errno == ECONNRESET ? protocol_error(f, "peer_gone") : -errno;
        if (n != sizeof ack)
                return protocol_error(f, "short_ack");
        f->ack_mask = want;

        n = recv_exact(fd, &mark, sizeof mark, 0);
        if (n < 0)
                return n;
        if (n < (ssize_t) sizeof mark)
                return protocol_error(f, n == 0 ? "peer_gone" : "short_mark");
        f->mark = mark;
        if (mark != COREDUMP_MARK_REQACK)
                return protocol_error(f, "ack_refused");
        return 0;
}

uint64_t socket_estimate_bytes(const Crash *c) {
        const char *p = c->proc.status ? strstr(c->proc.status, "\nVmRSS:") : NULL;
        unsigned long long kb;

        return p && sscanf(p + strlen("\nVmRSS:"), " %llu", &kb) == 1 ? (uint64_t) kb * 1024 : 0;
}
