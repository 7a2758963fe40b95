/* SPDX-License-Identifier: MIT */
/*
 * feeder: plays the kernel's side of a piped core dump, so csplice can be tested and benchmarked without
 * crashing anything. It builds a synthetic but valid ELF core of --size bytes in its own memory and pushes it
 * into a pipe either with write() (what a stock kernel does: a copy per page) or with vmsplice() of its own
 * pages (what a COREDUMP_USE_PIPE kernel does). The pipe goes to the command after "--", or to stdout.
 *
 * Layout: ELF header, a PT_NOTE and a PT_LOAD program header, NT_PRSTATUS, NT_PRPSINFO and NT_AUXV notes (the
 * auxv holds AT_SECURE, --at-secure, default 0, as the view rule reads it), then the load
 * segment to the end: every 64-bit little-endian word at file offset o holds o ^ 0x5a5a5a5a5a5a5a5a, except in
 * zero regions (--zero-regions: every other MiB of the segment, left untouched as a crashed process's
 * untouched pages are). A size below the headers' size gives the first --size bytes of that stream.
 *
 * Prints one JSON line to stderr: bytes pushed, nanoseconds from the first byte to the command's exit, its exit
 * status. (The kernel releases the process when the handler closes the pipe, a little before it exits; a writer
 * can't see that moment without keeping the pipe open, which would withhold the EOF.)
 */
#include <elf.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/procfs.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util.h"

#define PATTERN 0x5a5a5a5a5a5a5a5aULL
#define ZERO_REGION (1ULL << 20)

static size_t note_size(size_t desc) {
        return sizeof(Elf64_Nhdr) + 8 /* "CORE\0" padded */ + ((desc + 3) & ~3UL);
}

static char *put_note(char *p, uint32_t type, const void *desc, size_t len) {
        Elf64_Nhdr nh = { .n_namesz = 5, .n_descsz = (uint32_t) len, .n_type = type };

        memcpy(p, &nh, sizeof nh);
        memcpy(p + sizeof nh, "CORE\0\0\0", 8);
        memcpy(p + sizeof nh + 8, desc, len);
        return p + note_size(len);
}

/* Builds the whole image in an anonymous mapping, like the crashed process's memory. */
static char *build_core(uint64_t size, bool zero_regions, pid_t pid, uint64_t at_secure, uint64_t *ret_map) {
        uint64_t hdr_end, map = MAX(size, 4096);
        struct elf_prstatus prs = {};
        struct elf_prpsinfo psi = {};
        uint64_t auxv[4] = { AT_SECURE, at_secure, AT_NULL, 0 };
        Elf64_Ehdr eh = {};
        Elf64_Phdr ph[2] = {};
        char head[4096] = {}, *img, *p;

        img = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (img == MAP_FAILED)
                return NULL;

        prs.pr_pid = pid;
        prs.pr_cursig = 11;
        psi.pr_pid = pid;
        (void) snprintf(psi.pr_fname, sizeof psi.pr_fname, "feeder");

        memcpy(eh.e_ident, ELFMAG, SELFMAG);
        eh.e_ident[EI_CLASS] = ELFCLASS64;
        eh.e_ident[EI_DATA] = ELFDATA2LSB;
        eh.e_ident[EI_VERSION] = EV_CURRENT;
        eh.e_type = ET_CORE;
        eh.e_machine = EM_X86_64;
        eh.e_version = EV_CURRENT;
        eh.e_phoff = sizeof eh;
        eh.e_ehsize = sizeof eh;
        eh.e_phentsize = sizeof(Elf64_Phdr);
        eh.e_phnum = 2;

        ph[0].p_type = PT_NOTE;
        ph[0].p_offset = sizeof eh + sizeof ph;
        ph[0].p_filesz = note_size(sizeof prs) + note_size(sizeof psi) + note_size(sizeof auxv);
        hdr_end = (ph[0].p_offset + ph[0].p_filesz + 4095) & ~4095ULL;
        ph[1].p_type = PT_LOAD;
        ph[1].p_flags = PF_R | PF_W;
        ph[1].p_offset = hdr_end;
        ph[1].p_vaddr = 0x10000000;
        ph[1].p_filesz = ph[1].p_memsz = size > hdr_end ? size - hdr_end : 0;
        ph[1].p_align = 4096;

        memcpy(head, &eh, sizeof eh);
        memcpy(head + sizeof eh, ph, sizeof ph);
        p = put_note(head + ph[0].p_offset, NT_PRSTATUS, &prs, sizeof prs);
        p = put_note(p, NT_PRPSINFO, &psi, sizeof psi);
        (void) put_note(p, NT_AUXV, auxv, sizeof auxv);
        memcpy(img, head, MIN(size, hdr_end));

        for (uint64_t o = hdr_end; o + 8 <= size; o += 8) {
                if (zero_regions && ((o - hdr_end) / ZERO_REGION) % 2 == 1) {
                        o += ZERO_REGION - (o - hdr_end) % ZERO_REGION - 8;
                        continue;
                }
                uint64_t v = o ^ PATTERN;
                memcpy(img + o, &v, 8);
        }
        *ret_map = map;
        return img;
}

static int push_write(int fd, const char *img, uint64_t size, size_t chunk) {
        for (uint64_t o = 0; o < size; o += chunk) {
                int r = write_full(fd, img + o, (size_t) MIN((uint64_t) chunk, size - o));
                if (r < 0)
                        return r;
        }
        return 0;
}

static int push_vmsplice(int fd, const char *img, uint64_t size, size_t chunk) {
        for (uint64_t o = 0; o < size;) {
                struct iovec iov = { .iov_base = (void *) (img + o), .iov_len = (size_t) MIN((uint64_t) chunk, size - o) };
                ssize_t n = vmsplice(fd, &iov, 1, 0);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                o += (uint64_t) n;
        }
        return 0;
}

static void usage(void) {
        (void) fprintf(stderr,
                       "usage: feeder --size BYTES [--mode write|vmsplice] [--zero-regions] [--chunk BYTES]\n"
                       "              [--pipe-size BYTES] [--pid PID] [--at-secure N] [--emit FILE] [-- COMMAND ARGS...]\n");
        exit(2);
}

int main(int argc, char *argv[]) {
        static const struct option opts[] = {
                { "size", required_argument, NULL, 's' },      { "mode", required_argument, NULL, 'm' },
                { "zero-regions", no_argument, NULL, 'z' },    { "chunk", required_argument, NULL, 'c' },
                { "pipe-size", required_argument, NULL, 'p' }, { "pid", required_argument, NULL, 'P' },
                { "emit", required_argument, NULL, 'e' },      { "at-secure", required_argument, NULL, 'a' },
                {}
        };
        uint64_t size = 0, map = 0, at_secure = 0, t0, t1;
        size_t chunk = 64 * 1024, pipe_size = 0;
        bool vm = false, zero_regions = false, have_size = false;
        const char *emit = NULL;
        pid_t pid = getpid(), child = -1;
        int opt, out_fd = STDOUT_FILENO, status = 0, r;
        char *img;

        while ((opt = getopt_long(argc, argv, "+", opts, NULL)) >= 0)
                switch (opt) {
                case 's': size = strtoull(optarg, NULL, 10); have_size = true; break;
                case 'm':
                        if (strcmp(optarg, "vmsplice") == 0)
                                vm = true;
                        else if (strcmp(optarg, "write") != 0)
                                usage();
                        break;
                case 'z': zero_regions = true; break;
                case 'c': chunk = strtoull(optarg, NULL, 10); break;
                case 'p': pipe_size = strtoull(optarg, NULL, 10); break;
                case 'P': pid = (pid_t) atoi(optarg); break;
                case 'e': emit = optarg; break;
                case 'a': at_secure = strtoull(optarg, NULL, 10); break;
                default: usage();
                }
        if (!have_size || chunk == 0)
                usage();

        img = build_core(size, zero_regions, pid, at_secure, &map);
        if (!img) {
                perror("feeder: mmap");
                return 1;
        }

        if (emit) {
                int fd = open(emit, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
                if (fd < 0 || push_write(fd, img, size, 1 << 20) < 0 || close(fd) < 0) {
                        perror("feeder: emit");
                        return 1;
                }
                return 0;
        }

        if (optind < argc) {
                int p[2];

                if (pipe2(p, O_CLOEXEC) < 0) {
                        perror("feeder: pipe");
                        return 1;
                }
                child = fork();
                if (child < 0) {
                        perror("feeder: fork");
                        return 1;
                }
                if (child == 0) {
                        (void) dup2(p[0], STDIN_FILENO);
                        execv(argv[optind], argv + optind);
                        perror("feeder: exec");
                        _exit(127);
                }
                (void) close(p[0]);
                out_fd = p[1];
        }
        /* The kernel is not killed by a reader that closed the pipe (a shed crash): its write fails with EPIPE.
         * Set after the fork, so csplice starts with the default disposition as the kernel starts it. */
        (void) signal(SIGPIPE, SIG_IGN);
        if (pipe_size > 0)
                (void) fcntl(out_fd, F_SETPIPE_SZ, (int) pipe_size);

        t0 = now_ns(CLOCK_MONOTONIC);
        r = vm ? push_vmsplice(out_fd, img, size, chunk) : push_write(out_fd, img, size, chunk);
        if (r < 0 && r != -EPIPE)
                (void) fprintf(stderr, "feeder: push: %s\n", strerror(-r));
        (void) close(out_fd);
        if (child > 0)
                (void) waitpid(child, &status, 0);
        t1 = now_ns(CLOCK_MONOTONIC);

        (void) fprintf(stderr, "{\"bytes\": %" PRIu64 ", \"ns\": %" PRIu64 ", \"mode\": \"%s\", \"exit\": %d, \"push_error\": %d}\n",
                       size, t1 - t0, vm ? "vmsplice" : "write",
                       child > 0 ? (WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) : 0, -r);
        (void) munmap(img, map);
        return r < 0 && r != -EPIPE ? 1 : 0;
}
