/* SPDX-License-Identifier: MIT */
/*
 * guest: the static helper that runs the kernel matrix inside the qemu guest (tests/kernel/init.sh calls it).
 * Every subcommand that reports prints one line `RESULT {json}` on stdout, which is the serial console.
 *
 *   guest case NAME HANDLER KIND MIB HALF VERIFY STRATEGY CHUNK PIPE
 *       HANDLER: csplice (core_pattern |/csplice ...), csplice-timed (the same under `guest hrun`, which
 *       measures the handler's CPU time), sink-splice / sink-read (a reference reader that throws the core
 *       away with splice() to /dev/null or read(); `+batch`/`+pin` variants, see cmd_sink). Crashes `/crasher KIND MIB [--untouched-half]`, times the
 *       hold (crash signal to reaped), takes the dumper's CPU time, checks the capture and deletes it.
 *   guest verify CORE PID ADDR LEN HALF KIND   the capture check on its own (for the host's tests of it).
 *   guest probe          proves which kernel runs: see probe() below.
 *   guest kallsyms       reports vmsplice_to_pipe's type in /proc/kallsyms (when the kernel has kallsyms).
 *   guest hrun PID PROG ARGS...      (core_pattern) runs PROG, then stores its CPU time for `case`.
 *   guest sink splice|read CHUNK PIPE PID   (core_pattern) the reference reader.
 *   guest probe-handler PID          (core_pattern) the probe's handler.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PATTERN 0xc0ffee00c0ffee00ULL
#define SPOOL "/spool"
#define SETTINGS "/var/lib/corehandler/csplice.conf"
/* SPECIFIERS, csplice's argv, comes from corehandler.install (kernel_matrix.build_guest passes it). */
#define PROBE_ADDR 0x10000UL
#define PROBE_FD 100

static uint64_t now_ns(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

static int write_file(const char *path, const char *text) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        ssize_t n;

        if (fd < 0)
                return -errno;
        n = write(fd, text, strlen(text));
        (void) close(fd);
        return n == (ssize_t) strlen(text) ? 0 : -EIO;
}

/* Reads a whole small file into buf (NUL-terminated); returns its length or -errno. */
static ssize_t read_file(const char *path, char *buf, size_t size) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        size_t len = 0;

        if (fd < 0)
                return -errno;
        while (len + 1 < size) {
                ssize_t n = read(fd, buf + len, size - 1 - len);
                if (n <= 0)
                        break;
                len += (size_t) n;
        }
        buf[len] = 0;
        (void) close(fd);
        return (ssize_t) len;
}

static uint64_t tv_ns(struct timeval tv) {
        return (uint64_t) tv.tv_sec * 1000000000ULL + (uint64_t) tv.tv_usec * 1000ULL;
}

/* utime + stime of a live process from /proc/PID/stat, in ns (USER_HZ ticks). */
static uint64_t proc_cpu_ns(pid_t pid) {
        char path[64], buf[1024], *p;
        unsigned long long ut = 0, st = 0;

        (void) snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        if (read_file(path, buf, sizeof buf) < 0 || !(p = strrchr(buf, ')')))
                return 0;
        /* After ") ": state(3) ... utime is field 14, stime 15. */
        if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
                return 0;
        return (ut + st) * (1000000000ULL / (uint64_t) sysconf(_SC_CLK_TCK));
}

/* ---- the core check ---- */

typedef struct Check {
        char error[200];
        unsigned threads;
        int first_signal;
        bool pid_seen;
        uint64_t size;
} Check;

/* Records why a check failed; returns false so callers can `return fail(...)`. */
__attribute__((format(printf, 2, 3)))
static bool fail(Check *k, const char *fmt, ...) {
        va_list ap;

        va_start(ap, fmt);
        (void) vsnprintf(k->error, sizeof k->error, fmt, ap);
        va_end(ap);
        return false;
}

static bool check_notes(Check *k, const uint8_t *base, const Elf64_Phdr *ph, pid_t pid) {
        uint64_t off = 0;

        while (off + sizeof(Elf64_Nhdr) <= ph->p_filesz) {
                const Elf64_Nhdr *n = (const Elf64_Nhdr *) (base + ph->p_offset + off);
                const uint8_t *desc = (const uint8_t *) (n + 1) + ((n->n_namesz + 3) & ~3U);

                if (n->n_type == NT_PRSTATUS && n->n_descsz >= 48) {
                        int cursig = *(const int16_t *) (desc + 12);
                        int32_t pr_pid = *(const int32_t *) (desc + 32);

                        if (k->threads++ == 0)
                                k->first_signal = cursig;
                        if (pr_pid == pid)
                                k->pid_seen = true;
                }
                off += sizeof *n + ((n->n_namesz + 3) & ~3U) + ((n->n_descsz + 3) & ~3U);
        }
        return true;
}

/* The crasher's region: each 64-bit word holds its offset XOR PATTERN; with --untouched-half the second half
 * is zeros (the kernel dumps pages that were never touched as zeros). The kernel may have merged the region
 * with a neighbouring mapping (a thread stack), so the segment need only contain it. */
static bool check_region(Check *k, const uint8_t *base, const Elf64_Phdr *ph, uint64_t addr, uint64_t len,
                         bool half) {
        uint64_t skip = addr - ph->p_vaddr, filled = (half ? len / 2 : len) / 8;
        const uint64_t *w = (const uint64_t *) (base + ph->p_offset + skip);

        if (ph->p_filesz < skip + len)
                return fail(k, "pattern: the region's segment holds only %llu bytes",
                            (unsigned long long) ph->p_filesz);
        for (uint64_t i = 0; i < len / 8; i++) {
                uint64_t want = i < filled ? (i * 8) ^ PATTERN : 0;
                if (w[i] != want)
                        return fail(k, "pattern: wrong word at region offset %llu", (unsigned long long) i * 8);
        }
        return true;
}

/* kind: segv (one thread, SIGSEGV) or abort (five threads, SIGABRT first: the worker that called abort()). */
static bool check_core(Check *k, const char *path, pid_t pid, uint64_t addr, uint64_t len, bool half,
                       const char *kind) {
        bool abort_kind = strcmp(kind, "abort") == 0;
        const Elf64_Ehdr *eh;
        const uint8_t *base;
        struct stat st;
        bool region = false, ok = true;
        int fd;

        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) < 0)
                return fail(k, "open: cannot open the core: %s", strerror(errno));
        k->size = (uint64_t) st.st_size;
        if (k->size < sizeof *eh) {
                (void) close(fd);
                return fail(k, "elf: core of %llu bytes", (unsigned long long) k->size);
        }
        base = mmap(NULL, k->size, PROT_READ, MAP_PRIVATE, fd, 0);
        (void) close(fd);
        if (base == MAP_FAILED)
                return fail(k, "open: mmap failed: %s", strerror(errno));
        eh = (const Elf64_Ehdr *) base;
        if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64)
                ok = fail(k, "elf: not a 64-bit ELF file");
        else if (eh->e_type != ET_CORE || eh->e_machine != EM_X86_64)
                ok = fail(k, "elf: e_type %u is not ET_CORE/x86_64", (unsigned) eh->e_type);
        else if (eh->e_phoff + (uint64_t) eh->e_phnum * sizeof(Elf64_Phdr) > k->size)
                ok = fail(k, "elf: program headers past the end (%u)", (unsigned) eh->e_phnum);
        for (unsigned i = 0; ok && i < eh->e_phnum; i++) {
                const Elf64_Phdr *ph = (const Elf64_Phdr *) (base + eh->e_phoff) + i;

                if (ph->p_offset + ph->p_filesz > k->size) {
                        ok = fail(k, "truncated: segment %u runs past the end of the core", i);
                        break;
                }
                if (ph->p_type == PT_NOTE)
                        ok = check_notes(k, base, ph, pid);
                else if (ph->p_type == PT_LOAD && ph->p_vaddr <= addr && addr + len <= ph->p_vaddr + ph->p_memsz) {
                        region = true;
                        ok = check_region(k, base, ph, addr, len, half);
                }
        }
        if (ok && !region)
                ok = fail(k, "pattern: no segment at the region's address %#llx", (unsigned long long) addr);
        else if (ok && !k->pid_seen)
                ok = fail(k, "notes: no NT_PRSTATUS for pid %d", (int) pid);
        else if (ok && k->threads != (abort_kind ? 5U : 1U))
                ok = fail(k, "notes: %u NT_PRSTATUS notes", k->threads);
        else if (ok && k->first_signal != (abort_kind ? SIGABRT : SIGSEGV))
                ok = fail(k, "notes: the first thread died of signal %d", k->first_signal);
        (void) munmap((void *) base, k->size);
        return ok;
}

/* ---- the spool record ---- */

typedef struct Record {
        char id[256];
        char strategy[16];
        uint64_t bytes;
        bool complete;
} Record;

static bool scan_spool(const char *suffix, Record *r) {
        struct dirent *de;
        bool found = false;
        DIR *d = opendir(SPOOL);

        while (d && !found && (de = readdir(d))) {
                size_t n = strlen(de->d_name), m = strlen(suffix);
                if (de->d_name[0] != '.' && n > m && n - 5 < sizeof r->id && strcmp(de->d_name + n - m, suffix) == 0) {
                        memcpy(r->id, de->d_name, n - 5); /* the id keeps its -PID, loses .json */
                        r->id[n - 5] = 0;
                        found = true;
                }
        }
        if (d)
                (void) closedir(d);
        return found;
}

/* Finds the record csplice committed for pid (its id ends in -PID) and pulls the capture fields. csplice
 * closes the pipe (releasing the process) before it commits, so the record may come a moment after the reap. */
static bool find_record(pid_t pid, Record *r) {
        char suffix[32], path[512], *buf, *cap, *p;
        bool found = false;

        (void) snprintf(suffix, sizeof suffix, "-%d.json", (int) pid);
        for (int i = 0; i < 3000 && !(found = scan_spool(suffix, r)); i++)
                (void) usleep(10000);
        if (!found || !(buf = malloc(1 << 20)))
                return false;
        (void) snprintf(path, sizeof path, SPOOL "/%s.json", r->id);
        if (read_file(path, buf, 1 << 20) < 0 || !(cap = strstr(buf, "\"capture\":{"))) {
                free(buf);
                return false;
        }
        if ((p = strstr(cap, "\"strategy\":\"")))
                (void) sscanf(p + 12, "%15[^\"]", r->strategy);
        if ((p = strstr(cap, "\"bytes\":")))
                r->bytes = strtoull(p + 8, NULL, 10);
        r->complete = (p = strstr(cap, "\"complete\":")) && strncmp(p + 11, "true", 4) == 0;
        free(buf);
        return true;
}

/* ---- guest case ---- */

typedef struct Crash {
        pid_t pid;
        uint64_t addr, len;
        int signal;
        bool dumped;
        uint64_t hold_ns, dumper_cpu_ns;
} Crash;

/* Runs the crasher with --wait, so the clock starts at the crash and not at the fill. */
static int run_crasher(const char *name, const char *kind, const char *mib, bool half, Crash *c) {
        int to[2], from[2], status;
        char line[128] = "";
        struct rusage ru;
        uint64_t before, t0;
        ssize_t n;
        FILE *f;

        if (pipe(to) < 0 || pipe(from) < 0)
                return -errno;
        c->pid = fork();
        if (c->pid < 0)
                return -errno;
        if (c->pid == 0) {
                struct rlimit unlimited = { RLIM_INFINITY, RLIM_INFINITY };
                (void) setrlimit(RLIMIT_CORE, &unlimited);
                (void) dup2(to[0], 0);
                (void) dup2(from[1], 1);
                execl("/crasher", "crasher", kind, mib, "--wait", half ? "--untouched-half" : NULL, (char *) NULL);
                _exit(127);
        }
        (void) close(to[0]);
        (void) close(from[1]);
        f = fdopen(from[0], "r");
        if (!f || !fgets(line, sizeof line, f) ||
            sscanf(line, "region %" SCNx64 " %" SCNu64, &c->addr, &c->len) != 2) {
                (void) kill(c->pid, SIGKILL);
                (void) waitpid(c->pid, NULL, 0);
                return -EPROTO;
        }
        before = proc_cpu_ns(c->pid);
        /* Tells a host-side profiler that the dump starts now. */
        printf("BEGIN %s\n", name);
        (void) fflush(stdout);
        t0 = now_ns();
        n = write(to[1], "\n", 1);
        if (n != 1) {
                (void) kill(c->pid, SIGKILL);
                (void) waitpid(c->pid, NULL, 0);
                return -EIO;
        }
        if (wait4(c->pid, &status, 0, &ru) < 0)
                return -errno;
        c->hold_ns = now_ns() - t0;
        c->dumper_cpu_ns = tv_ns(ru.ru_utime) + tv_ns(ru.ru_stime) - before;
        c->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        c->dumped = WIFSIGNALED(status) && WCOREDUMP(status);
        (void) fclose(f);
        (void) close(to[1]);
        return 0;
}

static int set_handler(const char *handler, const char *strategy, const char *chunk, const char *pipe_bytes) {
        char buf[512];
        int r;

        (void) snprintf(buf, sizeof buf,
                        "spool_dir=" SPOOL "\nstrategy=%s\nchunk_size=%s\npipe_size=%s\n"
                        "min_free=0\ntimeout=600\n",
                        strategy, chunk, pipe_bytes);
        r = write_file(SETTINGS, buf);
        if (r < 0)
                return r;
        if (strcmp(handler, "csplice") == 0)
                (void) snprintf(buf, sizeof buf, "|/csplice %s", SPECIFIERS);
        else if (strcmp(handler, "csplice-timed") == 0)
                (void) snprintf(buf, sizeof buf, "|/bin/guest hrun %%P /csplice %s", SPECIFIERS);
        else if (strncmp(handler, "sink-", 5) == 0 && strspn(handler + 5, "abcdefghijklmnopqrstuvwxyz+") == strlen(handler + 5))
                (void) snprintf(buf, sizeof buf, "|/bin/guest hrun %%P /bin/guest sink %s %s %s %%P", handler + 5, chunk,
                                pipe_bytes);
        else
                return -EINVAL;
        return write_file("/proc/sys/kernel/core_pattern", buf);
}

/* CPU time `guest hrun` stored for the handler of pid, or -1. */
static long long handler_cpu_ns(pid_t pid, unsigned long long *bytes) {
        char path[64], buf[128] = "";
        long long ns = -1;

        (void) snprintf(path, sizeof path, "/run/handler-%d", (int) pid);
        for (int i = 0; i < 3000 && read_file(path, buf, sizeof buf) <= 0; i++) /* written after the handler exits */
                (void) usleep(10000);
        if (sscanf(buf, "%lld %llu", &ns, bytes) < 1)
                ns = -1;
        (void) unlink(path);
        return ns;
}

static int cmd_case(char **a) {
        const char *name = a[0], *handler = a[1], *kind = a[2], *mib = a[3];
        bool half = strcmp(a[4], "1") == 0, verify = strcmp(a[5], "1") == 0, csplice = strncmp(handler, "csplice", 7) == 0;
        Check k = { .error = "" };
        Record rec = { .id = "", .strategy = "" };
        unsigned long long sink_bytes = 0;
        long long hcpu;
        Crash c = {};
        char core[512];
        bool ok;
        int r;

        r = set_handler(handler, a[6], a[7], a[8]);
        if (r >= 0)
                r = run_crasher(name, kind, mib, half, &c);
        if (r < 0) {
                printf("RESULT {\"case\":\"%s\",\"ok\":false,\"error\":\"setup: %s\"}\n", name, strerror(-r));
                return 1;
        }
        hcpu = strcmp(handler, "csplice") == 0 ? -1 : handler_cpu_ns(c.pid, &sink_bytes);
        ok = c.dumped;
        if (!ok)
                (void) fail(&k, "crasher not dumped (signal %d)", c.signal);
        if (ok && !csplice && sink_bytes < c.len)
                ok = fail(&k, "the sink read %llu bytes, less than the region", sink_bytes);
        if (ok && csplice) {
                ok = find_record(c.pid, &rec);
                if (!ok)
                        (void) fail(&k, "no committed record for pid %d", (int) c.pid);
                else if (!rec.complete)
                        ok = fail(&k, "record says the capture is incomplete");
        }
        (void) snprintf(core, sizeof core, SPOOL "/%s.core", rec.id);
        if (ok && csplice && verify)
                ok = check_core(&k, core, c.pid, c.addr, c.len, half, kind);
        if (ok && csplice && k.size == 0) {
                struct stat st;
                k.size = stat(core, &st) == 0 ? (uint64_t) st.st_size : 0;
        }
        if (ok && csplice && k.size != rec.bytes)
                ok = fail(&k, "core holds %llu bytes, record says %llu",
                               (unsigned long long) k.size, (unsigned long long) rec.bytes);
        if (rec.id[0]) {
                (void) unlink(core);
                (void) snprintf(core, sizeof core, SPOOL "/%s.json", rec.id);
                (void) unlink(core);
        }
        printf("RESULT {\"case\":\"%s\",\"ok\":%s,\"error\":\"%s\",\"handler\":\"%s\",\"kind\":\"%s\",\"mib\":%s,"
               "\"untouched_half\":%s,\"verified\":%s,\"strategy\":\"%s\",\"chunk_size\":%s,\"pipe_size\":%s,"
               "\"pid\":%d,\"signal\":%d,\"core_bytes\":%llu,\"sink_bytes\":%llu,\"threads\":%u,\"hold_ns\":%llu,"
               "\"dumper_cpu_ns\":%llu,\"handler_cpu_ns\":%lld}\n",
               name, ok ? "true" : "false", k.error, handler, kind, mib, half ? "true" : "false",
               ok && verify && csplice ? "true" : "false", csplice ? rec.strategy : handler + 5, a[7], a[8],
               (int) c.pid, c.signal, (unsigned long long) (csplice ? k.size : 0), sink_bytes, k.threads,
               (unsigned long long) c.hold_ns, (unsigned long long) c.dumper_cpu_ns, hcpu);
        (void) fflush(stdout);
        return ok ? 0 : 1;
}

/* argv: CORE PID ADDR LEN HALF KIND. The check `case` runs, on its own, so the host can test the checker. */
static int cmd_verify(char **argv) {
        Check k = { .error = "" };
        bool ok = check_core(&k, argv[0], (pid_t) atoi(argv[1]), strtoull(argv[2], NULL, 0),
                             strtoull(argv[3], NULL, 0), strcmp(argv[4], "1") == 0, argv[5]);

        printf("{\"ok\":%s,\"error\":\"%s\",\"threads\":%u}\n", ok ? "true" : "false", k.error, k.threads);
        return ok ? 0 : 1;
}

/* ---- core_pattern helpers ---- */

/* argv: PID PROG ARGS... */
static int cmd_hrun(char **argv) {
        struct rusage ru;
        unsigned long long bytes = 0;
        char path[64], buf[128];
        int status;
        pid_t child;

        child = fork();
        if (child == 0) {
                execv(argv[1], argv + 1);
                _exit(127);
        }
        if (child < 0 || wait4(child, &status, 0, &ru) < 0)
                return 1;
        /* The sink leaves its byte count behind; csplice's is in its record. */
        (void) snprintf(path, sizeof path, "/run/sink-%s", argv[0]);
        if (read_file(path, buf, sizeof buf) > 0) {
                bytes = strtoull(buf, NULL, 10);
                (void) unlink(path);
        }
        (void) snprintf(path, sizeof path, "/run/handler-%s", argv[0]);
        (void) snprintf(buf, sizeof buf, "%llu %llu\n",
                        (unsigned long long) (tv_ns(ru.ru_utime) + tv_ns(ru.ru_stime)), bytes);
        (void) write_file(path, buf);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/* The CPU a task last ran on: field 39 of /proc/PID/stat. */
static int task_cpu(const char *pid) {
        char path[64], buf[1024], *p;
        int cpu = -1;

        (void) snprintf(path, sizeof path, "/proc/%s/stat", pid);
        if (read_file(path, buf, sizeof buf) < 0 || !(p = strrchr(buf, ')')))
                return -1;
        p += 2;
        for (int field = 3; field < 39 && p; field++)
                if ((p = strchr(p, ' ')))
                        p++;
        if (p)
                cpu = atoi(p);
        return cpu;
}

/* argv: MODE CHUNK PIPE PID, MODE = splice|read [+batch] [+pin]. Throws stdin away: the kernel-side cost of a
 * dump with a trivial reader, and the handler-side choices the -smp 2 investigation compares:
 *   +batch  sleep 1 ms while the pipe is under half full, so the dumper fills it instead of waking us per page;
 *   +pin    run ourselves and the dumper on the dumper's CPU, so its wakeups never cross CPUs. */
static int cmd_sink(char **argv) {
        size_t chunk = strtoull(argv[1], NULL, 10), pipe_bytes = strtoull(argv[2], NULL, 10);
        bool use_splice = strncmp(argv[0], "splice", 6) == 0, batch = strstr(argv[0], "+batch") != NULL;
        unsigned long long total = 0;
        char path[64], buf[32];
        char *mem = NULL;
        int out, size;

        if (pipe_bytes > 0)
                (void) fcntl(0, F_SETPIPE_SZ, (int) pipe_bytes);
        size = fcntl(0, F_GETPIPE_SZ);
        if (strstr(argv[0], "+pin")) {
                int cpu = task_cpu(argv[3]);
                cpu_set_t set;

                CPU_ZERO(&set);
                CPU_SET(cpu < 0 ? 0 : cpu, &set);
                (void) sched_setaffinity(0, sizeof set, &set);
                (void) sched_setaffinity((pid_t) atoi(argv[3]), sizeof set, &set);
        }
        out = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (!use_splice && !(mem = malloc(chunk)))
                return 1;
        for (;;) {
                ssize_t n;
                int avail;

                if (batch && ioctl(0, FIONREAD, &avail) == 0 && avail < size / 2)
                        (void) usleep(1000);
                n = use_splice ? splice(0, NULL, out, NULL, chunk, SPLICE_F_MOVE) : read(0, mem, chunk);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        break;
                total += (unsigned long long) n;
        }
        (void) snprintf(path, sizeof path, "/run/sink-%s", argv[3]);
        (void) snprintf(buf, sizeof buf, "%llu\n", total);
        (void) write_file(path, buf);
        free(mem);
        return 0;
}

/* ---- which kernel is this? ----
 *
 * The patch's signature is zero copy: the stock kernel copies each dumped page into the pipe, the patched one
 * puts a reference to the page itself there. So the probe crashes a process whose first dumped page is a
 * MAP_SHARED memfd page full of 'A', and its handler waits until the kernel has queued that page (the pipe
 * stops filling), overwrites the page with 'B' through the memfd, and only then reads the core: it sees 'A'
 * on a stock kernel and 'B' on a patched one. No timing, no symbols: it fails loudly on a mix-up either way.
 */
static int probe_child(void) {
        struct rlimit unlimited = { RLIM_INFINITY, RLIM_INFINITY };
        int fd = memfd_create("probe", MFD_CLOEXEC);
        char *page, *filler;

        if (fd < 0 || ftruncate(fd, 4096) < 0 || dup2(fd, PROBE_FD) < 0)
                _exit(2);
        page = mmap((void *) PROBE_ADDR, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, fd, 0);
        if (page != (void *) PROBE_ADDR)
                _exit(3);
        memset(page, 'A', 4096);
        /* 1 MiB of private pages after it: the pipe (64 KiB) fills and the kernel blocks with our page queued. */
        filler = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (filler == MAP_FAILED)
                _exit(4);
        memset(filler, 'f', 1 << 20);
        (void) setrlimit(RLIMIT_CORE, &unlimited);
        (void) raise(SIGSEGV);
        _exit(5);
}

static int cmd_probe_handler(char **argv) {
        char path[64], verdict[64] = "no-segment";
        size_t cap = 8 << 20, len = 0;
        int last = -1, stable = 0, avail, fd;
        uint8_t *core = malloc(cap), b[4096];
        const Elf64_Ehdr *eh = (const Elf64_Ehdr *) core;

        memset(b, 'B', sizeof b);
        for (int i = 0; i < 500 && stable < 10; i++) { /* at most 10 s, done after 200 ms without change */
                if (ioctl(0, FIONREAD, &avail) < 0)
                        break;
                stable = avail > 0 && avail == last ? stable + 1 : 0;
                last = avail;
                (void) usleep(20000);
        }
        (void) snprintf(path, sizeof path, "/proc/%s/fd/%d", argv[0], PROBE_FD);
        fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || pwrite(fd, b, sizeof b, 0) != (ssize_t) sizeof b)
                (void) snprintf(verdict, sizeof verdict, "overwrite-failed");
        if (fd >= 0)
                (void) close(fd);
        for (;;) {
                ssize_t n = read(0, core + len, cap - len);
                if (n <= 0)
                        break;
                len += (size_t) n;
                if (len == cap)
                        break;
        }
        for (unsigned i = 0; core && len >= sizeof *eh && i < eh->e_phnum; i++) {
                const Elf64_Phdr *ph = (const Elf64_Phdr *) (core + eh->e_phoff) + i;
                if (ph->p_type == PT_LOAD && ph->p_vaddr == PROBE_ADDR && ph->p_offset + 4096 <= len)
                        (void) snprintf(verdict, sizeof verdict, "%s",
                                        core[ph->p_offset] == 'B' ? "reference" :
                                        core[ph->p_offset] == 'A' ? "copy" : "garbage");
        }
        (void) snprintf(path, sizeof path, "%s %zu %d\n", verdict, len, last);
        (void) write_file("/run/probe", path);
        return 0;
}

static int cmd_probe(void) {
        char buf[128] = "", verdict[64] = "none";
        size_t len = 0;
        int status = 0, queued = 0;
        pid_t pid;

        (void) unlink("/run/probe");
        if (write_file("/proc/sys/kernel/core_pattern", "|/bin/guest probe-handler %P") < 0)
                return 1;
        pid = fork();
        if (pid == 0)
                probe_child();
        (void) waitpid(pid, &status, 0);
        if (read_file("/run/probe", buf, sizeof buf) > 0)
                (void) sscanf(buf, "%63s %zu %d", verdict, &len, &queued);
        printf("RESULT {\"case\":\"probe\",\"ok\":%s,\"dumped\":%s,\"pages\":\"%s\",\"core_bytes\":%zu,"
               "\"queued_bytes\":%d,\"patched\":%s}\n",
               strcmp(verdict, "reference") == 0 || strcmp(verdict, "copy") == 0 ? "true" : "false",
               WIFSIGNALED(status) && WCOREDUMP(status) ? "true" : "false", verdict, len, queued,
               strcmp(verdict, "reference") == 0 ? "true" : "false");
        (void) fflush(stdout);
        return 0;
}

static int cmd_kallsyms(void) {
        char line[256], type = 0, name[200];
        unsigned long long addr;
        bool present;
        FILE *f = fopen("/proc/kallsyms", "re");

        present = f != NULL;
        while (f && fgets(line, sizeof line, f))
                if (sscanf(line, "%llx %c %199s", &addr, &type, name) == 3 && strcmp(name, "vmsplice_to_pipe") == 0)
                        break;
                else
                        type = 0;
        if (f)
                (void) fclose(f);
        printf("RESULT {\"case\":\"kallsyms\",\"ok\":true,\"available\":%s,\"vmsplice_to_pipe\":\"%c\"}\n",
               present ? "true" : "false", type ? type : '-');
        (void) fflush(stdout);
        return 0;
}

static int cmd_boot(void) {
        struct utsname u;

        (void) uname(&u);
        printf("RESULT {\"case\":\"boot\",\"ok\":true,\"release\":\"%s\",\"version\":\"%s\",\"cpus\":%ld}\n",
               u.release, u.version, sysconf(_SC_NPROCESSORS_ONLN));
        (void) fflush(stdout);
        return 0;
}

int main(int argc, char *argv[]) {
        if (argc == 11 && strcmp(argv[1], "case") == 0)
                return cmd_case(argv + 2);
        if (argc >= 4 && strcmp(argv[1], "hrun") == 0)
                return cmd_hrun(argv + 2);
        if (argc == 6 && strcmp(argv[1], "sink") == 0)
                return cmd_sink(argv + 2);
        if (argc == 8 && strcmp(argv[1], "verify") == 0)
                return cmd_verify(argv + 2);
        if (argc == 3 && strcmp(argv[1], "probe-handler") == 0)
                return cmd_probe_handler(argv + 2);
        if (argc == 2 && strcmp(argv[1], "probe") == 0)
                return cmd_probe();
        if (argc == 2 && strcmp(argv[1], "kallsyms") == 0)
                return cmd_kallsyms();
        if (argc == 2 && strcmp(argv[1], "boot") == 0)
                return cmd_boot();
        fprintf(stderr, "usage: see the comment at the top of tests/kernel/guest.c\n");
        return 64;
}
