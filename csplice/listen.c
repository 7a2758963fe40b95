/* SPDX-License-Identifier: MIT */
/*
 * `csplice --listen PATH [--max-connections N] [--backlog N] [--exec]`: the coredump socket's accept loop.
 *
 * One forked csplice per connection, without an exec: the child already is csplice, so it goes straight on
 * to the same per-crash flow a systemd Accept=yes instance runs (the connection on stdin). The parent only
 * accepts and reaps; a child that fails or is killed costs its own dump, never the listener. At the cap the
 * parent stops accepting and the kernel's connections wait in the backlog. --exec makes each child exec a
 * fresh csplice instead, exactly as systemd's Accept=yes starts one (for tests and bench/capture.py).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "listen.h"
#include "log.h"

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
        if (sig != SIGCHLD)
                stop_requested = 1;
}

/* The kernel's rules for the path (fs/coredump.c): absolute, no "." or ".." components, shorter than
 * sun_path. Ours on top: no symlink on the way and every existing directory root's, since a connection to
 * whatever the path resolves to is a dump handed to it. */
static int check_path(const char *path, bool *created_dir) {
        char buf[sizeof ((struct sockaddr_un *) 0)->sun_path];
        struct stat st;

        if (path[0] != '/' || strlen(path) >= sizeof buf || strstr(path, "/./") || strstr(path, "/../") ||
            strstr(path, "//"))
                return -EINVAL;
        (void) snprintf(buf, sizeof buf, "%s", path);
        for (char *slash = strchr(buf + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
                *slash = '\0';
                if (lstat(buf, &st) < 0) {
                        if (errno != ENOENT)
                                return -errno;
                        /* Created as mkdir -p would; the socket's own directory is made 0700 below. */
                        if (mkdir(buf, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        *created_dir = !strchr(slash + 1, '/');
                        if (lstat(buf, &st) < 0)
                                return -errno;
                }
                if (!S_ISDIR(st.st_mode))
                        return -ENOTDIR;
                if (st.st_uid != geteuid())
                        return -EPERM;
                *slash = '/';
        }
        return 0;
}

static int open_listener(const char *path, unsigned backlog, int *ret_lock) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        char lock_path[sizeof sa.sun_path + 8], *dir_end;
        bool created_dir = false;
        struct stat st;
        mode_t old_umask;
        int fd, lock, r;

        r = check_path(path, &created_dir);
        if (r < 0)
                return r;
        /* The socket's directory is root's alone (connecting needs write permission on the socket, and the
         * directory keeps even its name from others): made so if we created it, else required. */
        (void) snprintf(lock_path, sizeof lock_path, "%s", path);
        dir_end = strrchr(lock_path, '/');
        *dir_end = '\0';
        if (created_dir && chmod(lock_path, 0700) < 0)
                return -errno;
        if (stat(dir_end == lock_path ? "/" : lock_path, &st) < 0)
                return -errno;
        if (st.st_mode & 0077)
                return log_errno(LOG_ERR, EPERM, "The socket's directory %s is open to others (mode %04o): it must be "
                                 "root's alone (0700)", dir_end == lock_path ? "/" : lock_path,
                                 (unsigned) (st.st_mode & 07777));
        /* One listener per path: the lock says the socket file we are about to replace is stale. */
        (void) snprintf(lock_path, sizeof lock_path, "%s.lock", path);
        lock = open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (lock < 0)
                return -errno;
        if (flock(lock, LOCK_EX | LOCK_NB) < 0) {
                r = errno == EWOULDBLOCK ? -EADDRINUSE : -errno;
                (void) close(lock);
                return r;
        }
        (void) unlink(path);

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                r = -errno;
                (void) close(lock);
                return r;
        }
        (void) snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
        old_umask = umask(0177);
        r = bind(fd, (struct sockaddr *) &sa, sizeof sa) < 0 ? -errno : 0;
        (void) umask(old_umask);
        if (r == 0 && listen(fd, (int) backlog) < 0)
                r = -errno;
        if (r < 0) {
                (void) close(fd);
                (void) close(lock);
                return r;
        }
        *ret_lock = lock;
        return fd;
}

static int parse_args(int argc, char *argv[], const char **path, unsigned *max, unsigned *backlog,
                      bool *exec_each) {
        if (argc < 1)
                return -EINVAL;
        *path = argv[0];
        for (int i = 1; i < argc; i++) {
                unsigned long v;
                char *end;

                if (strcmp(argv[i], "--exec") == 0) {
                        *exec_each = true;
                        continue;
                }
                if (i + 1 >= argc)
                        return -EINVAL;
                v = strtoul(argv[i + 1], &end, 10);
                if (*end || v == 0 || v > 65535)
                        return -EINVAL;
                if (strcmp(argv[i], "--max-connections") == 0)
                        *max = (unsigned) v;
                else if (strcmp(argv[i], "--backlog") == 0)
                        *backlog = (unsigned) v;
                else
                        return -EINVAL;
                i++;
        }
        return 0;
}

int listener_run(int argc, char *argv[]) {
        struct sigaction sa = { .sa_handler = on_signal };
        sigset_t block, old;
        const char *path;
        unsigned max = LISTEN_MAX_CONNECTIONS, backlog = LISTEN_BACKLOG, active = 0;
        char self[PATH_MAX] = "";
        bool exec_each = false;
        ssize_t n;
        int fd, lock = -1, r;

        r = parse_args(argc, argv, &path, &max, &backlog, &exec_each);
        if (r < 0)
                return log_errno(LOG_ERR, r, "Usage: csplice --listen PATH [--max-connections N] [--backlog N] "
                                 "[--exec]");
        /* Our own path, not /proc/self/exe, for --exec: the new process is named after what it execs. */
        n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n > 0)
                self[n] = '\0';
        /* The kernel starts a pipe handler with no environment; whoever starts the listener has one (a root shell
         * with a test's CSPLICE_PROC_ROOT or CSPLICE_BUNDLE_ROOT left over, a unit's Environment=). None of it
         * reaches a crash's csplice, forked or exec'd. */
        (void) clearenv();
        /* As csplice per crash: our own crash must not come back to the socket we serve. */
        (void) prctl(PR_SET_DUMPABLE, 0);
        fd = open_listener(path, backlog, &lock);
        if (fd < 0)
                return log_errno(LOG_ERR, fd, "Failed to listen on %s: %m", path);

        (void) sigemptyset(&block);
        (void) sigaddset(&block, SIGCHLD);
        (void) sigaddset(&block, SIGTERM);
        (void) sigaddset(&block, SIGINT);
        (void) sigprocmask(SIG_BLOCK, &block, &old);
        (void) sigaction(SIGCHLD, &sa, NULL);
        (void) sigaction(SIGTERM, &sa, NULL);
        (void) sigaction(SIGINT, &sa, NULL);
        log_full(LOG_INFO, "Listening on %s for the kernel's core dumps (at most %u at once)", path, max);

        while (!stop_requested) {
                struct pollfd p = { .fd = fd, .events = POLLIN };
                pid_t pid;
                int conn;

                while ((pid = waitpid(-1, NULL, WNOHANG)) > 0)
                        active--;
                /* At the cap, wait for a child to end (SIGCHLD) and leave the kernel in the backlog. */
                if (ppoll(&p, active < max ? 1 : 0, NULL, &old) < 0 || !(p.revents & POLLIN))
                        continue;
                conn = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
                if (conn < 0)
                        continue;
                pid = fork();
                if (pid == 0) {
                        /* The child handles this one crash: the per-crash flow, as if the kernel had started it. */
                        (void) close(fd);
                        (void) close(lock);
                        sa.sa_handler = SIG_DFL;
                        (void) sigaction(SIGCHLD, &sa, NULL);
                        (void) sigaction(SIGTERM, &sa, NULL);
                        (void) sigaction(SIGINT, &sa, NULL);
                        (void) sigprocmask(SIG_SETMASK, &old, NULL);
                        r = dup2(conn, STDIN_FILENO) < 0 ? -errno : 0;
                        (void) close(conn);
                        if (r == 0 && exec_each) {
                                char *const args[] = { (char *) "csplice", NULL };
                                (void) execv(self[0] ? self : "/proc/self/exe", args);
                                _exit(127);
                        }
                        log_forget_errors();
                        return r < 0 ? r : 0;
                }
                if (pid < 0)
                        (void) log_errno(LOG_ERR, errno, "Failed to fork for a core dump, dropping it: %m");
                else
                        active++;
                (void) close(conn);
        }
        /* In-flight children finish on their own; the path goes so nobody mistakes it for a live listener. */
        (void) unlink(path);
        (void) close(fd);
        (void) close(lock);
        return 1;
}
