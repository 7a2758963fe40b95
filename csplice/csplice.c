/* SPDX-License-Identifier: MIT */
/*
 * csplice: the kernel.core_pattern handler, for a pipe ("|csplice %P ...") or the coredump socket
 * ("@@/run/corehandler/capture/coredump.socket", served by `csplice --listen`, see listen.c and socket.c).
 *
 * The kernel runs us as root, with no environment, once per crash, and holds the crashed process until we
 * have read the whole core from stdin. So: make ourselves safe, read the metadata while /proc/PID is still
 * there, decide whether to keep the dump, copy it into the spool as fast as the disk takes it, commit a JSON
 * record, exit. Everything slower (compression, indexing, journal, metrics) is the daemon's, afterwards.
 *
 * Exit codes (the kernel ignores them; they are for people running csplice by hand and for tests):
 *   0  a record was committed (complete, truncated or metadata-only)
 *   64 usage: not started the way the kernel starts us (no arguments, %P not a live PID, stdin not a pipe,
 *      or a socket peer that is not a task being dumped); nothing was stored
 *   73 the spool could not be opened or written: the dump was drained and lost, see the kernel log
 *   74 the record could not be committed
 *   75 shed: the crash's user is past their budget (admit.c), nothing stored but a count in <spool>/.shed
 *
 * Run by hand with one option, it prints a table the control plane is checked against and exits:
 * --version, --list-specifiers (the argv it takes, optional ones in brackets), --list-strategies,
 * --list-settings (every csplice.conf key with its built-in default, as a settings file), --list-annotations
 * (the OCI annotations a record keeps of a container's bundle, container.c).
 * `csplice --listen PATH ...` is socket mode's accept loop (listen.c).
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admit.h"
#include "capture.h"
#include "identity.h"
#include "listen.h"
#include "log.h"
#include "procinfo.h"
#include "record.h"
#include "settings.h"
#include "spool.h"
#include "util.h"

#define EXIT_USAGE 64
#define EXIT_CANTCREAT 73
#define EXIT_IOERR 74
#define EXIT_SHED 75

static void on_alarm(int sig) {
        (void) sig;
        capture_timed_out = 1;
}

/* Returns the fd the core arrives on, moved above stdio. */
static int make_safe(void) {
        int in_fd, null_fd;

        /* Never dump ourselves: our own crash would come back to a core_pattern handler, i.e. to us. */
        (void) prctl(PR_SET_DUMPABLE, 0);
        /* Dumps hold secrets; whatever we create is ours alone. */
        (void) umask(0077);

        /* Keep the core pipe off fds 0-2, so no stray printf or library write can land in it or read it. */
        in_fd = fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
        null_fd = open("/dev/null", O_RDWR | O_NOCTTY);
        if (null_fd >= 0) {
                for (int fd = 0; fd < 3; fd++)
                        if (fd != null_fd)
                                (void) dup2(null_fd, fd);
                if (null_fd > 2)
                        (void) close(null_fd);
        }
        if (chdir("/") < 0)
                (void) log_errno(LOG_WARNING, errno, "Failed to change to /, ignoring: %m");
        return in_fd;
}

/* Room for a record: its fixed part plus the /proc texts it quotes. A hostile process picks those bytes, and
 * an invalid or control byte is written as a six-byte escape (\udcXX, \u00XX), so reserve for the worst. */
static uint64_t record_reserve(const Crash *c) {
        const ProcInfo *p = &c->proc;

        return 64 * 1024 + 6 * ((uint64_t) p->cmdline_len + p->environ_len + (p->status ? strlen(p->status) : 0) +
                                (p->cgroup ? strlen(p->cgroup) : 0) + (p->maps ? strlen(p->maps) : 0) +
                                CONTAINER_ANNOTATION_KEYS * CONTAINER_VALUE_MAX + sizeof p->ns);
}

static int commit_record(Crash *c, int spool_fd, SpoolRecord *rec) {
        FILE *f;
        long length;
        int r;

        if (rec->fd < 0) {
                r = spool_create_record(spool_fd, c->id, 0, true, rec);
                if (r < 0)
                        return r;
        }
        f = fdopen(rec->fd, "w");
        if (!f)
                return -errno;
        record_write(c, f);
        length = ftell(f);
        r = fflush(f) == 0 && !ferror(f) && length >= 0 ? 0 : -(errno ?: EIO);
        if (r == 0)
                r = spool_commit_record(spool_fd, c->id, c->settings.fsync, rec, (uint64_t) length);
        (void) fclose(f);
        rec->fd = -1;
        return r;
}

/* "%P %i ... %e [%F]": the argv after the program name, as arg_names has it. */
static void format_specifiers(char *buf, size_t size) {
        size_t n = 0;

        buf[0] = '\0';
        for (unsigned a = 0; a < _ARG_MAX && n < size; a++)
                n += (size_t) snprintf(buf + n, size - n, a < _ARG_REQUIRED ? "%s%%%s" : "%s[%%%s]",
                                       a > 0 ? " " : "", arg_names[a]);
}

/* The tables behind --list-*; returns whether opt was one of them. */
static bool list_table(const char *opt) {
        char buf[PATH_MAX];

        if (strcmp(opt, "--version") == 0)
                (void) puts(CSPLICE_VERSION);
        else if (strcmp(opt, "--list-specifiers") == 0) {
                format_specifiers(buf, sizeof buf);
                (void) puts(buf);
        } else if (strcmp(opt, "--list-annotations") == 0)
                for (size_t i = 0; i < CONTAINER_ANNOTATION_KEYS; i++)
                        (void) puts(container_annotation_keys[i]);
        else if (strcmp(opt, "--list-strategies") == 0)
                for (Strategy st = 0; st < _STRATEGY_MAX; st++)
                        (void) puts(strategy_to_string(st));
        else if (strcmp(opt, "--list-settings") == 0) {
                Settings s;

                settings_defaults(&s);
                for (size_t i = 0; i < setting_table_len; i++) {
                        setting_format(&s, &setting_table[i], buf, sizeof buf);
                        (void) printf("%s=%s\n", setting_table[i].key, buf);
                }
        } else
                return false;
        return true;
}

/* Reads the arguments and the settings; returns 0, or the exit code of a usage error (nothing is stored). */
static int setup(Crash *c, int argc, char *argv[], int in_fd, const char **proc_root) {
        const char *settings_path, *refused;
        char why[PATH_MAX + 128];

        if (argc < 2 && !c->socket_mode) {
                char usage[128];

                format_specifiers(usage, sizeof usage);
                log_usage("Usage: csplice %s, started by the kernel", usage);
                return EXIT_USAGE;
        }
        for (int i = 1; i < argc && i - 1 < _ARG_MAX; i++)
                c->argv[i - 1] = argv[i][0] ? argv[i] : NULL;

        /* The kernel passes no environment, so these only ever come from tests and benchmarks. */
        settings_path = getenv("CSPLICE_SETTINGS") ?: CSPLICE_SETTINGS_PATH;
        *proc_root = getenv("CSPLICE_PROC_ROOT") ?: "/proc";
        /* Pipe mode here; a socket peer is checked once the settings are read (socket_identify). */
        refused = c->socket_mode ? NULL : identity_check_caller(c, in_fd, *proc_root, why, sizeof why);
        if (refused) {
                log_usage("%s; nothing stored", refused);
                return EXIT_USAGE;
        }
        if (argc - 1 < _ARG_REQUIRED && !c->socket_mode)
                log_full(LOG_WARNING, "Only %d of %d core_pattern arguments given, recording what there is",
                         argc - 1, _ARG_REQUIRED);
        /* A relative path would be read from wherever the caller stood: refused aloud, not followed. */
        if (settings_path[0] != '/') {
                settings_defaults(&c->settings);
                (void) snprintf(c->settings.error, sizeof c->settings.error,
                                "CSPLICE_SETTINGS=%s is not an absolute path, using built-in defaults", settings_path);
                log_full(LOG_WARNING, "%s", c->settings.error);
        } else if (settings_load(&c->settings, settings_path) < 0)
                log_full(LOG_WARNING, "%s", c->settings.error);

        if (c->settings.timeout > 0) {
                struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART: blocked reads must end */
                (void) sigaction(SIGALRM, &sa, NULL);
                (void) alarm((unsigned) MIN(c->settings.timeout, 86400ULL));
        }

        /* Only the kernel feeds us: a socket peer must be a task being dumped. Nothing is stored for others. */
        if (c->socket_mode) {
                int r = socket_identify(in_fd, c, *proc_root);
                if (r < 0) {
                        (void) log_errno(LOG_ERR, r, "Refusing a coredump socket peer that is not a task being "
                                         "dumped, nothing stored: %m");
                        socket_count_refused(c->settings.spool_dir);
                        return EXIT_USAGE;
                }
        }
        return 0;
}

/* Copies the core into the spool, or drains it when the dump is dropped; returns the core's fd (-1 if none),
 * which stays open (and locked) until the record is committed. The dumped process is released on return. */
static int capture_core(Crash *c, int in_fd, int spool_fd) {
        int core_fd = -1, r;

        if (!c->dropped) {
                core_fd = spool_create_core(spool_fd, c->id);
                if (core_fd < 0) {
                        (void) log_errno(LOG_ERR, core_fd, "Failed to create the core file: %m");
                        c->dropped = "create_failed";
                }
        }

        c->capture_begin_ns = now_ns(CLOCK_MONOTONIC);
        if (core_fd >= 0) {
                char magic[4];
                uint64_t configured_limit;

                c->capture = (Capture) { .in_fd = in_fd, .out_fd = core_fd, .settings = &c->settings,
                                         .from_socket = c->socket_mode,
                                         .expected_bytes = procinfo_rss_bytes(&c->proc) };
                configured_limit = admit_apply_rlimit(c);
                capture_run(&c->capture);
                admit_restore_limit(c, configured_limit);
                c->elf_magic = pread(core_fd, magic, sizeof magic, 0) == sizeof magic &&
                               memcmp(magic, "\177ELF", 4) == 0;
                c->has_core = true;
                if (c->capture.raw_bytes == 0) {
                        /* Nothing kept (the floor or a limit hit before the first byte, or no byte came): a
                         * metadata-only record says so, an empty core file would look like a dump. */
                        c->dropped = c->capture.truncated ?: "empty";
                        c->has_core = false;
                        r = spool_discard_core(spool_fd, c->id);
                        if (r < 0)
                                (void) log_errno(LOG_WARNING, r, "Failed to remove the empty core file, ignoring: %m");
                }
        } else if (!c->socket.handshake) {
                bool eof;
                c->capture.drained_bytes = capture_drain(in_fd, &eof);
        }
        c->capture_end_ns = now_ns(CLOCK_MONOTONIC);
        c->released_ns = now_ns(CLOCK_REALTIME);
        /* The process is released once the pipe is drained; closing it also ends a timed-out dump. */
        (void) close(in_fd);
        return core_fd;
}

/* The kernel log's word on anything but a whole ELF dump kept. */
static void log_outcome(const Crash *c) {
        const char *pid = c->argv[ARG_PID] ?: "?";

        if (c->has_core && !c->elf_magic)
                log_full(LOG_WARNING, "Dump of PID %s is not an ELF file (%llu bytes), keeping it as it is", pid,
                         (unsigned long long) c->capture.raw_bytes);
        if (c->has_core && c->capture.truncated && c->capture.error)
                (void) log_errno(LOG_WARNING, c->capture.error, "Dump of PID %s truncated at %llu bytes (%s): %m",
                                 pid, (unsigned long long) c->capture.raw_bytes, c->capture.truncated);
        else if (c->has_core && c->capture.truncated)
                log_full(LOG_WARNING, "Dump of PID %s truncated at %llu bytes (%s)", pid,
                         (unsigned long long) c->capture.raw_bytes, c->capture.truncated);
        else if (c->dropped && c->socket.handshake)
                log_full(LOG_WARNING, "Dump of PID %s dropped (%s) before the kernel wrote it, recording metadata only",
                         pid, c->dropped);
        else if (c->dropped)
                log_full(LOG_WARNING, "Dump of PID %s dropped (%s), %llu bytes drained, recording metadata only",
                         pid, c->dropped, (unsigned long long) c->capture.drained_bytes);
}

/* The commit point: the core under its final name, then the record beside it. */
static int commit(Crash *c, int spool_fd, int core_fd, SpoolRecord *record) {
        int r;

        if (c->has_core) {
                r = spool_publish_core(spool_fd, c->id, c->settings.fsync, core_fd);
                if (r < 0) {
                        (void) log_errno(LOG_ERR, r, "Failed to publish core %s: %m", c->id);
                        return EXIT_IOERR;
                }
                c->published_ns = now_ns(CLOCK_MONOTONIC);
        }
        r = commit_record(c, spool_fd, record);
        if (r < 0) {
                (void) log_errno(LOG_ERR, r, "Failed to commit record %s: %m", c->id);
                return EXIT_IOERR;
        }
        /* core_fd stays open (and locked) until here: a lock the daemon can take means we are gone. */
        if (core_fd >= 0)
                (void) close(core_fd);
        return 0;
}

/* A crash past its user's budget: counted, nothing else stored, and the process let go at once (closing the
 * pipe ends the kernel's dump; in socket mode the kernel is told not to write it). */
static int shed(Crash *c, int in_fd, int spool_fd) {
        int r;

        if (c->socket.handshake)
                (void) socket_answer(in_fd, &c->socket, false);
        (void) close(in_fd);
        r = spool_count_shed(spool_fd, crash_arg_number(c, ARG_UID));
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to count the shed crash, ignoring: %m");
        log_full(LOG_WARNING, "Crash of PID %s by UID %s shed (%s): its user is past the budget, nothing stored",
                 c->argv[ARG_PID] ?: "?", c->argv[ARG_UID] ?: "?", c->dropped);
        return EXIT_SHED;
}

int main(int argc, char *argv[]) {
        Crash c = {};
        SpoolRecord record = { .fd = -1 };
        const char *proc_root;
        int in_fd, spool_fd, core_fd, r;

        /* The kernel's first argument is %P, a number: an option only ever comes from a person or a test. */
        if (argc == 2 && list_table(argv[1]))
                return fflush(stdout) == 0 ? 0 : EXIT_IOERR;

        /* First, log to a safe place, since we don't know what crashed and it might be the journal. */
        log_open();
        /* The accept loop comes back here only in a child, with one connection on stdin and no arguments. */
        if (argc >= 2 && strcmp(argv[1], "--listen") == 0) {
                r = listener_run(argc - 2, argv + 2);
                if (r != 0)
                        return r < 0 ? EXIT_USAGE : 0;
                argc = 1;
        }
        c.started_ns = now_ns(CLOCK_REALTIME);
        c.started_mono_ns = now_ns(CLOCK_MONOTONIC);
        in_fd = make_safe();
        c.socket_mode = socket_is_connection(in_fd);
        r = setup(&c, argc, argv, in_fd, &proc_root);
        if (r != 0)
                return r;
        c.settings_ns = now_ns(CLOCK_MONOTONIC);

        /* Metadata before the dump: once the pipe is drained the kernel may reap the process. */
        r = identity_collect(&c, proc_root);
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to read /proc/%s, recording the dump without it: %m",
                                 c.argv[ARG_PID] ?: "?");
        c.metadata_ns = now_ns(CLOCK_MONOTONIC);
        /* Now that the process's size is known: the time limit set up with the settings was only the ceiling. */
        c.timeout = admit_timeout(&c);
        if (c.timeout > 0)
                (void) alarm((unsigned) MIN(c.timeout, 86400ULL));

        spool_fd = spool_open(c.settings.spool_dir);
        if (spool_fd < 0) {
                (void) log_errno(LOG_ERR, spool_fd, "Failed to open spool %s, dump of PID %s lost: %m",
                                 c.settings.spool_dir, c.argv[ARG_PID] ?: "?");
                if (c.socket.handshake)
                        (void) socket_answer(in_fd, &c.socket, false);
                else {
                        bool eof;
                        (void) capture_drain(in_fd, &eof);
                }
                return EXIT_CANTCREAT;
        }
        /* Made before the dump, so a full disk afterwards still has room for the record. */
        r = spool_create_record(spool_fd, c.id, record_reserve(&c), false, &record);
        if (r < 0 && r != -EOPNOTSUPP)
                (void) log_errno(LOG_WARNING, r, "Failed to create the record file, trying again after the dump: %m");

        c.dropped = c.socket.error ? "socket_error" : admit(&c, spool_fd);
        if (c.shed)
                return shed(&c, in_fd, spool_fd);
        /* Socket mode answers the kernel now: a dropped dump is never written and its process is let go. */
        if (c.socket_mode && socket_answer(in_fd, &c.socket, !c.dropped) < 0 && !c.dropped)
                c.dropped = "socket_error";
        if (c.socket.error)
                log_full(LOG_WARNING, "Coredump socket exchange with PID %s failed (%s)", c.argv[ARG_PID] ?: "?",
                         c.socket.error);
        c.admitted_ns = now_ns(CLOCK_MONOTONIC);

        core_fd = capture_core(&c, in_fd, spool_fd);
        log_outcome(&c);
        return commit(&c, spool_fd, core_fd, &record);
}
