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
 *
 * Run by hand with one option, it prints a table the control plane is checked against and exits:
 * --version, --list-specifiers (the argv it takes, optional ones in brackets), --list-strategies,
 * --list-settings (every csplice.conf key with its built-in default, as a settings file).
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

#include "capture.h"
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

/* Who may feed us (docs/design.md): in pipe mode the kernel, so stdin is a pipe and %P a process that is there
 * in proc_root (the kernel holds it while it dumps). Anything else is someone running csplice by hand with a
 * terminal, /dev/null, a file or garbage: a usage error, before anything is read or stored. Returns NULL, or
 * why not in buf. */
static const char *check_caller(const Crash *c, int in_fd, const char *proc_root, char *buf, size_t size) {
        char path[PATH_MAX];
        struct stat st;
        int pid = crash_arg_int(c, ARG_PID);

        if (pid <= 0) {
                (void) snprintf(buf, size, "%%P must be the PID of the crashed process, not \"%.64s\"",
                                c->argv[ARG_PID] ?: "");
                return buf;
        }
        (void) snprintf(path, sizeof path, "%s/%d", proc_root, pid);
        if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
                (void) snprintf(buf, size, "PID %d is not a live process (%s): csplice is run by the kernel", pid,
                                path);
                return buf;
        }
        if (in_fd < 0 || fstat(in_fd, &st) < 0 || !S_ISFIFO(st.st_mode)) {
                (void) snprintf(buf, size, "stdin must be the kernel's core pipe, not %s",
                                in_fd < 0 ? "closed" : S_ISCHR(st.st_mode) ? (isatty(in_fd) ? "a terminal" :
                                "a device") : S_ISREG(st.st_mode) ? "a regular file" : S_ISSOCK(st.st_mode) ?
                                "a socket" : "something else");
                return buf;
        }
        return NULL;
}

static void read_boot_id(Crash *c, const char *proc_root) {
        char path[PATH_MAX], *buf = NULL, *w;

        (void) snprintf(path, sizeof path, "%s/sys/kernel/random/boot_id", proc_root);
        if (read_bounded_at(AT_FDCWD, path, 64, &buf, NULL) < 0)
                return;
        w = c->boot_id;
        for (char *p = buf; *p && w < c->boot_id + 32; p++)
                if ((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))
                        *w++ = *p;
        *w = '\0';
        free(buf);
}

/* "<realtime µs>-<boot id prefix>-<pid>": sorts by time, unique across reboots and PID reuse. */
static void make_id(Crash *c) {
        long long pid = crash_arg_number(c, ARG_PID);

        (void) snprintf(c->id, sizeof c->id, "%llu-%.16s-%lld", (unsigned long long) (c->started_ns / 1000),
                        c->boot_id[0] ? c->boot_id : "0000000000000000", pid < 0 ? 0 : pid);
}

/* Admission: the reason to keep only metadata, or NULL to capture. Checked before the first byte is read (in
 * socket mode before the kernel writes it). */
static const char *admit(Crash *c, int spool_fd) {
        const Settings *s = &c->settings;
        uint64_t estimate = c->socket_mode ? socket_estimate_bytes(c) : 0;
        const char *key;
        int r;

        /* RLIMIT_CORE means what it means for a core file: 0 is "no core", in both modes (docs/design.md). 1 is
         * the kernel's guard against a handler's own helpers crashing into it (it never pipes such a dump);
         * socket mode honours it the same way. */
        long long rlimit = crash_arg_number(c, ARG_RLIMIT);
        if (rlimit == 0 || rlimit == 1)
                return "rlimit_core";
        /* Only the socket can refuse a dump before it is written; a pipe truncates it at the limit instead. */
        if (s->max_dump_size > 0 && estimate > s->max_dump_size)
                return "max_dump_size";

        if (s->max_pending > 0) {
                r = spool_count_pending(spool_fd, s->max_pending);
                if (r < 0)
                        (void) log_errno(LOG_WARNING, r, "Failed to count pending records, ignoring: %m");
                else if ((uint64_t) r >= s->max_pending)
                        return "max_pending";
        }
        if (s->max_per_exe_per_minute > 0) {
                key = c->proc.exe ?: c->argv[ARG_COMM] ?: "";
                r = spool_rate_hit(spool_fd, key, (time_t) (c->started_ns / 1000000000ULL));
                if (r < 0)
                        (void) log_errno(LOG_WARNING, r, "Failed to update the crash rate, ignoring: %m");
                else if ((uint64_t) r > s->max_per_exe_per_minute)
                        return "max_per_exe_per_minute";
        }
        /* At least the headroom the capture's first check asks for: a dump let in here must get its first bytes. */
        r = capture_space_ok(spool_fd, s, MAX(estimate, (uint64_t) CAPTURE_SPACE_STEP));
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to check free space, ignoring: %m");
        else if (r == 0)
                return "min_free";
        return NULL;
}

/* Room for a record: its fixed part plus the /proc texts it quotes. A hostile process picks those bytes, and
 * an invalid or control byte is written as a six-byte escape (\udcXX, \u00XX), so reserve for the worst. */
static uint64_t record_reserve(const Crash *c) {
        const ProcInfo *p = &c->proc;

        return 64 * 1024 + 6 * ((uint64_t) p->cmdline_len + p->environ_len + (p->status ? strlen(p->status) : 0) +
                                (p->cgroup ? strlen(p->cgroup) : 0) + (p->maps ? strlen(p->maps) : 0) +
                                (p->oci_config ? strlen(p->oci_config) : 0) + sizeof p->ns);
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
        } else if (strcmp(opt, "--list-strategies") == 0)
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

/* A smaller RLIMIT_CORE than max_dump_size cuts the capture there, like the kernel's own core files. Returns
 * the configured limit, for restore_limit(). */
static uint64_t apply_rlimit(Crash *c) {
        long long rlimit = crash_arg_number(c, ARG_RLIMIT); /* -1 for RLIM_INFINITY, past LLONG_MAX */
        uint64_t configured = c->settings.max_dump_size;

        if (rlimit > 0 && (configured == 0 || (uint64_t) rlimit < configured))
                c->settings.max_dump_size = (uint64_t) rlimit;
        return configured;
}

static void restore_limit(Crash *c, uint64_t configured) {
        if (c->settings.max_dump_size != configured && c->capture.truncated &&
            strcmp(c->capture.truncated, "max_dump_size") == 0)
                c->capture.truncated = "rlimit_core";
        c->settings.max_dump_size = configured;
}

int main(int argc, char *argv[]) {
        Crash c = {};
        SpoolRecord record = { .fd = -1 };
        const char *settings_path, *proc_root, *refused;
        char why[PATH_MAX + 128];
        uint64_t configured_limit;
        int in_fd, spool_fd, core_fd = -1, r;

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
        in_fd = make_safe();
        c.socket_mode = socket_is_connection(in_fd);
        if (argc < 2 && !c.socket_mode) {
                char usage[128];

                format_specifiers(usage, sizeof usage);
                log_usage("Usage: csplice %s, started by the kernel", usage);
                return EXIT_USAGE;
        }
        for (int i = 1; i < argc && i - 1 < _ARG_MAX; i++)
                c.argv[i - 1] = argv[i][0] ? argv[i] : NULL;

        /* The kernel passes no environment, so these only ever come from tests and benchmarks. */
        settings_path = getenv("CSPLICE_SETTINGS") ?: CSPLICE_SETTINGS_PATH;
        proc_root = getenv("CSPLICE_PROC_ROOT") ?: "/proc";
        /* Pipe mode here; a socket peer is checked below, once the settings are read (socket_identify). */
        refused = c.socket_mode ? NULL : check_caller(&c, in_fd, proc_root, why, sizeof why);
        if (refused) {
                log_usage("%s; nothing stored", refused);
                return EXIT_USAGE;
        }
        if (argc - 1 < _ARG_REQUIRED && !c.socket_mode)
                log_full(LOG_WARNING, "Only %d of %d core_pattern arguments given, recording what there is",
                         argc - 1, _ARG_REQUIRED);
        if (settings_load(&c.settings, settings_path) < 0)
                log_full(LOG_WARNING, "%s", c.settings.error);

        if (c.settings.timeout > 0) {
                struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART: blocked reads must end */
                (void) sigaction(SIGALRM, &sa, NULL);
                (void) alarm((unsigned) MIN(c.settings.timeout, 86400ULL));
        }

        /* Only the kernel feeds us: a socket peer must be a task being dumped. Nothing is stored for others. */
        if (c.socket_mode) {
                r = socket_identify(in_fd, &c, proc_root);
                if (r < 0) {
                        (void) log_errno(LOG_ERR, r, "Refusing a coredump socket peer that is not a task being "
                                         "dumped, nothing stored: %m");
                        socket_count_refused(c.settings.spool_dir);
                        return EXIT_USAGE;
                }
        }

        /* Metadata before the dump: once the pipe is drained the kernel may reap the process. */
        read_boot_id(&c, proc_root);
        r = procinfo_collect(&c.proc, proc_root, crash_arg_int(&c, ARG_PID), crash_arg_int(&c, ARG_PIDFD),
                             (time_t) crash_arg_number(&c, ARG_TIMESTAMP), &c.settings);
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to read /proc/%s, recording the dump without it: %m",
                                 c.argv[ARG_PID] ?: "?");
        make_id(&c);

        spool_fd = spool_open(c.settings.spool_dir);
        if (spool_fd < 0) {
                (void) log_errno(LOG_ERR, spool_fd, "Failed to open spool %s, dump of PID %s lost: %m",
                                 c.settings.spool_dir, c.argv[ARG_PID] ?: "?");
                if (c.socket.handshake)
                        (void) socket_answer(in_fd, &c.socket, false);
                else
                        (void) capture_drain(in_fd);
                return EXIT_CANTCREAT;
        }

        r = spool_create_record(spool_fd, c.id, record_reserve(&c), false, &record);
        if (r < 0 && r != -EOPNOTSUPP)
                (void) log_errno(LOG_WARNING, r, "Failed to create the record file, trying again after the dump: %m");

        c.dropped = c.socket.error ? "socket_error" : admit(&c, spool_fd);
        /* Socket mode answers the kernel now: a refused dump is never written and its process is let go. */
        if (c.socket_mode && socket_answer(in_fd, &c.socket, !c.dropped) < 0 && !c.dropped)
                c.dropped = "socket_error";
        if (c.socket.error)
                log_full(LOG_WARNING, "Coredump socket exchange with PID %s failed (%s)", c.argv[ARG_PID] ?: "?",
                         c.socket.error);
        if (!c.dropped) {
                core_fd = spool_create_core(spool_fd, c.id);
                if (core_fd < 0) {
                        (void) log_errno(LOG_ERR, core_fd, "Failed to create the core file: %m");
                        c.dropped = "create_failed";
                }
        }

        c.capture_begin_ns = now_ns(CLOCK_MONOTONIC);
        if (core_fd >= 0) {
                char magic[4];

                c.capture = (Capture) { .in_fd = in_fd, .out_fd = core_fd, .settings = &c.settings,
                                        .from_socket = c.socket_mode,
                                        .expected_bytes = procinfo_rss_bytes(&c.proc) };
                configured_limit = apply_rlimit(&c);
                capture_run(&c.capture);
                restore_limit(&c, configured_limit);
                c.elf_magic = pread(core_fd, magic, sizeof magic, 0) == sizeof magic &&
                              memcmp(magic, "\177ELF", 4) == 0;
                c.has_core = true;
                if (c.capture.written == 0) {
                        /* Nothing kept (the floor or a limit hit before the first byte, or no byte came): a
                         * metadata-only record says so, an empty core file would look like a dump. */
                        c.dropped = c.capture.truncated ?: "empty";
                        c.has_core = false;
                        r = spool_discard_core(spool_fd, c.id);
                        if (r < 0)
                                (void) log_errno(LOG_WARNING, r, "Failed to remove the empty core file, ignoring: %m");
                } else if (!c.elf_magic)
                        log_full(LOG_WARNING, "Dump of PID %s is not an ELF file (%llu bytes), keeping it as it is",
                                 c.argv[ARG_PID] ?: "?", (unsigned long long) c.capture.written);
        } else if (!c.socket.handshake)
                c.capture.drained = capture_drain(in_fd);
        c.capture_end_ns = now_ns(CLOCK_MONOTONIC);
        c.released_ns = now_ns(CLOCK_REALTIME);
        /* The process is released once the pipe is drained; closing it also ends a timed-out dump. */
        (void) close(in_fd);

        if (c.has_core && c.capture.truncated && c.capture.error)
                (void) log_errno(LOG_WARNING, c.capture.error, "Dump of PID %s truncated at %llu bytes (%s): %m",
                                 c.argv[ARG_PID] ?: "?", (unsigned long long) c.capture.written, c.capture.truncated);
        else if (c.has_core && c.capture.truncated)
                log_full(LOG_WARNING, "Dump of PID %s truncated at %llu bytes (%s)", c.argv[ARG_PID] ?: "?",
                         (unsigned long long) c.capture.written, c.capture.truncated);
        if (c.dropped && c.socket.handshake)
                log_full(LOG_WARNING, "Dump of PID %s refused (%s) before the kernel wrote it, recording metadata only",
                         c.argv[ARG_PID] ?: "?", c.dropped);
        else if (c.dropped)
                log_full(LOG_WARNING, "Dump of PID %s not kept (%s), %llu bytes discarded, recording metadata only",
                         c.argv[ARG_PID] ?: "?", c.dropped, (unsigned long long) c.capture.drained);

        if (c.has_core) {
                r = spool_publish_core(spool_fd, c.id, c.settings.fsync, core_fd);
                if (r < 0) {
                        (void) log_errno(LOG_ERR, r, "Failed to publish core %s: %m", c.id);
                        return EXIT_IOERR;
                }
        }
        r = commit_record(&c, spool_fd, &record);
        if (r < 0) {
                (void) log_errno(LOG_ERR, r, "Failed to commit record %s: %m", c.id);
                return EXIT_IOERR;
        }
        /* core_fd stays open (and locked) until here: a lock the daemon can take means we are gone. */
        if (core_fd >= 0)
                (void) close(core_fd);
        return 0;
}
