/* SPDX-License-Identifier: MIT */
#include <fcntl.h>
#include <linux/ioprio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "capture.h"
#include "log.h"
#include "util.h"

#define BLOCK 4096
#define RW2_SLOTS 4
#define RW2_SLOT_BYTES (1ULL << 20)
/* direct: four 2 MiB aligned buffers, two written at once while the reader fills the others. With one write in
 * flight the disk idles between writes (issue 21's prototype, one 8 MiB write at a time, held 1 GiB 0.70-1.69 s
 * against a 0.44 s drain). Small, because every buffer page is a fresh page of this new process, and on a VM
 * that returns free memory to its host a fresh page is dear: touching 48 MiB took 80-200 ms here, 8 MiB
 * 12-23 ms, while this disk took O_DIRECT writes of 2 MiB, two in flight, at 1.3-1.9 GiB/s, as fast as of 8 MiB.
 * corehandler's probe of the spool (host/writerates.py) writes the same way. */
#define DIRECT_SLOTS 4
#define DIRECT_SLOT_BYTES (2ULL << 20)
#define DIRECT_WRITERS 2
#define RING_MAX_SLOTS 8
#define RING_MAX_WRITERS 4

volatile sig_atomic_t capture_timed_out;

int capture_space_ok(int fd, const Settings *s, uint64_t need) {
        struct statvfs sv;
        uint64_t avail, floor;

        if (s->min_free.bytes == 0 && s->min_free.percent == 0)
                return 1;
        if (fstatvfs(fd, &sv) < 0)
                return -errno;
        avail = (uint64_t) sv.f_bavail * sv.f_frsize;
        floor = MAX(s->min_free.bytes, (uint64_t) sv.f_blocks * sv.f_frsize / 100 * s->min_free.percent);
        return avail >= floor && avail - floor >= need;
}

/* How much the next call may move: a chunk, less near the size limit; 0 once the limit is reached. */
static size_t next_len(const Capture *c, uint64_t done, size_t chunk) {
        uint64_t max = c->settings->max_dump_size;

        if (max == 0)
                return chunk;
        return max > done ? (size_t) MIN((uint64_t) chunk, max - done) : 0;
}

/* Decides whether to stop before moving the next bytes: size limit, timeout, free space. Returns the reason
 * or NULL. Checks the filesystem only every CAPTURE_SPACE_STEP bytes because statvfs costs a system call. */
static const char *stop_reason(const Capture *c, uint64_t done, uint64_t *next_space_check, size_t want) {
        if (capture_timed_out)
                return "timeout";
        if (want == 0)
                return "max_dump_size";
        if (done >= *next_space_check) {
                *next_space_check = done + CAPTURE_SPACE_STEP;
                if (capture_space_ok(c->out_fd, c->settings, CAPTURE_SPACE_STEP) == 0)
                        return "min_free";
        }
        return NULL;
}

static bool block_is_zero(const char *p, size_t len) {
        /* Compare the block with itself shifted: memcmp is vectorised, a byte loop is not. */
        return p[0] == 0 && memcmp(p, p + 1, len - 1) == 0;
}

/* Writes buf at offset off; with sparse, pages that are all zero are skipped and left as holes. On failure
 * *ret_done says how much of buf's start is in the file all the same (written, or a hole). */
static int write_at(int fd, const char *buf, size_t len, uint64_t off, bool sparse, size_t *ret_done) {
        size_t i = 0;

        while (i < len) {
                size_t start, end;

                if (sparse && (off + i) % BLOCK == 0)
                        while (i + BLOCK <= len && block_is_zero(buf + i, BLOCK))
                                i += BLOCK;
                start = i;
                end = i;
                while (end < len) {
                        size_t n = MIN((size_t) BLOCK - (size_t) ((off + end) % BLOCK), len - end);
                        if (sparse && n == BLOCK && block_is_zero(buf + end, BLOCK))
                                break;
                        end += n;
                }
                while (start < end) {
                        ssize_t n = pwrite(fd, buf + start, end - start, (off_t) (off + start));
                        if (n < 0) {
                                if (errno == EINTR)
                                        continue;
                                *ret_done = start;
                                return -errno;
                        }
                        start += (size_t) n;
                }
                i = end;
        }
        *ret_done = len;
        return 0;
}

/* Keeps the longest of the calls timed into *longest; writers run in several threads. */
static void note_longest(uint64_t *longest, uint64_t since) {
        uint64_t took = now_ns(CLOCK_MONOTONIC) - since, seen = __atomic_load_n(longest, __ATOMIC_RELAXED);

        while (took > seen &&
               !__atomic_compare_exchange_n(longest, &seen, took, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
                ;
}

/* After a call that took n bytes of the dump, started at since: the trace's first byte and longest read. */
static void note_read(Capture *c, uint64_t since, ssize_t n) {
        note_longest(&c->longest_read_ns, since);
        if (n > 0 && c->first_byte_ns == 0)
                c->first_byte_ns = now_ns(CLOCK_MONOTONIC);
}

static ssize_t read_fd(int fd, void *buf, size_t len) {
        for (;;) {
                ssize_t n = read(fd, buf, len);
                if (n >= 0 || errno != EINTR)
                        return n < 0 ? -errno : n;
                if (capture_timed_out)
                        return -ETIMEDOUT;
        }
}

static ssize_t read_some(Capture *c, void *buf, size_t len) {
        uint64_t since = now_ns(CLOCK_MONOTONIC);
        ssize_t n = read_fd(c->in_fd, buf, len);

        note_read(c, since, n);
        return n;
}

static int write_timed(Capture *c, const char *buf, size_t len, uint64_t off, size_t *ret_done) {
        uint64_t since = now_ns(CLOCK_MONOTONIC);
        int r = write_at(c->out_fd, buf, len, off, c->settings->sparse, ret_done);

        note_longest(&c->longest_write_ns, since);
        return r;
}

/* The first failure wins. rw2, direct and splice2 fail from several threads, hence the lock: reason and errno stay a pair. */
static void set_failure(Capture *c, const char *why, int err) {
        static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

        (void) pthread_mutex_lock(&lock);
        if (!c->truncated) {
                c->truncated = why;
                c->error = err;
        }
        (void) pthread_mutex_unlock(&lock);
}

/* ---- read()/write(), one thread ---- */

/* rw hands the rest of a dump to direct when the page cache takes it slower than the spool takes O_DIRECT writes
 * (direct_rate: host/writerates.py measures it). How fast the page cache is belongs to the moment, not to the
 * host: on a VM that returns free memory to its host a fresh page costs a round trip and a recycled one does
 * not, so the same host wrote 1 GiB buffered in 0.2-1.8 s, and a probe before the crash cannot tell which it
 * will be (bench/results/capture.md, 2026-12-03: the probe chose the page cache, which then held 1 GiB 2.4x and
 * 4 GiB 3.3x the floor where direct held 1.3x and 1.0x). So rw measures itself, per window of the dump, wall
 * time with the pipe's reads (direct overlaps them), and moves when a window ran below 3/4 of direct_rate:
 * direct's threads and buffers cost something, and small dumps that the page cache takes fast stay there.
 * The window is short, because until it ends a dump that belongs in direct pays the page cache: with 16 MiB
 * a 64 MiB crash was held 1.55x the floor. */
#define ADAPT_WINDOW (4ULL << 20)

static bool rw_slower_than_direct(const Settings *s, uint64_t bytes, uint64_t ns) {
        return s->direct_rate > 0 && ns > 0 && (double) bytes * 1e9 / (double) ns < (double) s->direct_rate * 0.75;
}

/* Copies until EOF or a stop; with adapt, returns early with *ret_handoff set once a window was slower than
 * direct and the file offset is block-aligned (O_DIRECT writes need it). */
static void rw_loop(Capture *c, char *buf, bool adapt, bool *ret_handoff) {
        size_t chunk = (size_t) c->settings->chunk_size;
        uint64_t next_check = 0, window_start = c->raw_bytes, window_ns = now_ns(CLOCK_MONOTONIC);
        bool slow = false;

        *ret_handoff = false;
        for (;;) {
                size_t want = next_len(c, c->raw_bytes, chunk);
                const char *stop;
                size_t done;
                ssize_t n;
                int r;

                if (slow) {
                        if (c->raw_bytes % BLOCK == 0) {
                                *ret_handoff = true;
                                break;
                        }
                        want = MIN(want, (size_t) (BLOCK - c->raw_bytes % BLOCK));
                }
                stop = stop_reason(c, c->raw_bytes, &next_check, want);
                if (stop) {
                        set_failure(c, stop, 0);
                        break;
                }
                n = read_some(c, buf, want);
                if (n == 0)
                        break;
                if (n < 0) {
                        set_failure(c, n == -ETIMEDOUT ? "timeout" : "read_error", (int) n);
                        break;
                }
                r = write_timed(c, buf, (size_t) n, c->raw_bytes, &done);
                c->raw_bytes += done;
                if (r < 0) {
                        set_failure(c, "write_error", r);
                        c->drained_bytes += (uint64_t) n - done; /* read, not kept */
                        break;
                }
                if (adapt && !slow && c->raw_bytes - window_start >= ADAPT_WINDOW) {
                        uint64_t t = now_ns(CLOCK_MONOTONIC);

                        slow = rw_slower_than_direct(c->settings, c->raw_bytes - window_start, t - window_ns);
                        window_start = c->raw_bytes;
                        window_ns = t;
                }
        }
}

static int capture_direct(Capture *c);

static int capture_rw(Capture *c) {
        char *buf;
        bool handoff;

        buf = aligned_alloc(BLOCK, (c->settings->chunk_size + BLOCK - 1) / BLOCK * BLOCK);
        if (!buf)
                return -ENOMEM;

        c->strategy = strategy_to_string(STRATEGY_RW);
        rw_loop(c, buf, c->settings->direct_rate > 0, &handoff);
        if (handoff) {
                uint64_t from = c->raw_bytes;
                int r;

                c->handoff_ns = now_ns(CLOCK_MONOTONIC);
                r = capture_direct(c);

                c->strategy = strategy_to_string(STRATEGY_RW);
                if (r >= 0)
                        c->direct_from = from;
                else {
                        /* Refused before a byte moved (a filesystem without O_DIRECT): rw goes on as it was. */
                        (void) log_errno(LOG_NOTICE, r, "Moving to O_DIRECT writes refused (%m), staying with rw");
                        rw_loop(c, buf, false, &handoff);
                }
        }
        free(buf);
        return 0;
}

/* ---- splice() stdin -> file, chunk_size at a time: the 16-page splice loop, with a settable chunk ---- */

static int capture_splice(Capture *c) {
        size_t chunk = (size_t) c->settings->chunk_size;
        uint64_t next_check = 0;

        c->strategy = strategy_to_string(STRATEGY_SPLICE);
        for (;;) {
                size_t want = next_len(c, c->raw_bytes, chunk);
                const char *stop = stop_reason(c, c->raw_bytes, &next_check, want);
                uint64_t since = now_ns(CLOCK_MONOTONIC);
                ssize_t n;

                if (stop) {
                        set_failure(c, stop, 0);
                        break;
                }
                n = splice(c->in_fd, NULL, c->out_fd, NULL, want, SPLICE_F_MOVE);
                note_read(c, since, n);
                if (n == 0)
                        break;
                if (n < 0) {
                        if (errno == EINTR && !capture_timed_out)
                                continue;
                        /* Some filesystems and stdin kinds refuse splice: nothing moved yet, so fall back. */
                        if (c->raw_bytes == 0 && (errno == EINVAL || errno == ENOSYS || errno == EBADF))
                                return -errno;
                        set_failure(c, capture_timed_out ? "timeout" : "write_error", -errno);
                        break;
                }
                c->raw_bytes += (uint64_t) n;
        }
        return 0;
}

/* Starts the second thread of rw2 and splice2. It must not take SIGALRM: the timeout has to interrupt the first
 * thread's blocking read or splice on the core pipe. Returns 0 or -errno. */
static int start_writer(pthread_t *ret, void *(*fn)(void *), void *userdata) {
        sigset_t alrm, old;
        int r;

        (void) sigemptyset(&alrm);
        (void) sigaddset(&alrm, SIGALRM);
        (void) pthread_sigmask(SIG_BLOCK, &alrm, &old);
        r = -pthread_create(ret, NULL, fn, userdata);
        (void) pthread_sigmask(SIG_SETMASK, &old, NULL);
        return r;
}

/* ---- read()/write() with a reader thread and writer threads: rw2, and direct with O_DIRECT writes ---- */

/* The reader fills slots in file order and hands each over with its offset; writers take them in that order
 * and write them with pwrite(), so with several writers several writes are in flight (direct: the disk's queue
 * is only kept full by more than one). A slot is refilled once its write is done, whichever finished first. */
typedef struct Ring {
        Capture *c;
        pthread_mutex_t lock;
        pthread_cond_t changed;
        size_t slot_bytes;
        unsigned slots, writers;
        bool direct;    /* out_fd has O_DIRECT: every write a whole number of blocks from an aligned slot */
        char *slot[RING_MAX_SLOTS];
        void *mem;      /* the slots, one mapping */
        size_t mem_bytes;
        size_t len[RING_MAX_SLOTS];
        uint64_t off[RING_MAX_SLOTS];
        bool busy[RING_MAX_SLOTS];  /* handed over and not yet written */
        uint64_t filled, taken;     /* slots handed over and taken since the start: slot k is k % slots */
        uint64_t kept_end;          /* the first byte a failed write left out of the file; UINT64_MAX if none */
        bool eof, stop;
} Ring;

static int set_direct(int fd, bool on) {
        int flags = fcntl(fd, F_GETFL);

        if (flags < 0)
                return -errno;
        return fcntl(fd, F_SETFL, on ? flags | O_DIRECT : flags & ~O_DIRECT) < 0 ? -errno : 0;
}

/* Where the filesystem took the flag but refuses the writes, this and every later write goes through the page
 * cache. Returns whether the caller should write again, buffered. */
static bool ring_refuse_direct(Ring *ring) {
        bool again = true;

        (void) pthread_mutex_lock(&ring->lock);
        if (ring->direct) {
                __atomic_store_n(&ring->direct, false, __ATOMIC_RELAXED);
                again = set_direct(ring->c->out_fd, false) == 0;
                if (again)
                        log_full(LOG_NOTICE, "O_DIRECT write refused, writing through the page cache");
        }
        (void) pthread_mutex_unlock(&ring->lock);
        return again;
}

/* Writes one slot; *ret_done as for write_at(). With O_DIRECT a short last slot goes out padded to a whole
 * block (the reader zeroed the padding; capture_run's ftruncate cuts it off again).
 * Slots never go through the page cache because the disk lags: a dump big enough for direct is past the dirty
 * limits there, where writes wait for the disk all the same and pay for fresh pages on top. bench/capture.py,
 * 4 GiB dense, quiet machine, right after its O_DIRECT floor had written 4 GiB: 10.6-12.3 s with that detour,
 * 2.4-3.7 s without. */
static int ring_write(Ring *ring, unsigned i, size_t *ret_done) {
        int r;

        if (__atomic_load_n(&ring->direct, __ATOMIC_RELAXED)) {
                r = write_timed(ring->c, ring->slot[i], (ring->len[i] + BLOCK - 1) / BLOCK * BLOCK, ring->off[i],
                                ret_done);
                *ret_done = MIN(*ret_done, ring->len[i]);
                if (r != -EINVAL || *ret_done > 0 || !ring_refuse_direct(ring))
                        return r;
        }
        return write_timed(ring->c, ring->slot[i], ring->len[i], ring->off[i], ret_done);
}

static void *ring_writer(void *userdata) {
        Ring *ring = userdata;

        for (;;) {
                unsigned i;
                size_t done = 0;
                bool skip;
                int r = 0;

                (void) pthread_mutex_lock(&ring->lock);
                while (ring->taken == ring->filled && !ring->eof)
                        (void) pthread_cond_wait(&ring->changed, &ring->lock);
                if (ring->taken == ring->filled) {
                        (void) pthread_mutex_unlock(&ring->lock);
                        return NULL;
                }
                i = (unsigned) (ring->taken++ % ring->slots);
                /* After a failed write, later slots would be cut off by the ftruncate anyway. */
                skip = ring->stop;
                (void) pthread_mutex_unlock(&ring->lock);

                if (!skip)
                        r = ring_write(ring, i, &done);
                if (r < 0)
                        set_failure(ring->c, "write_error", r);

                (void) pthread_mutex_lock(&ring->lock);
                ring->busy[i] = false;
                if (r < 0) {
                        /* What made it into the file stays in the record, even from a slot that failed half way. */
                        ring->kept_end = MIN(ring->kept_end, ring->off[i] + done);
                        ring->stop = true;
                }
                (void) pthread_cond_broadcast(&ring->changed);
                (void) pthread_mutex_unlock(&ring->lock);
        }
}

/* The slots in one mapping on huge-page boundaries, with huge pages asked for: every page of a new process's
 * buffer is a fresh page, on a VM that returns free memory to its host a dear one, and 8 MiB took 4.4 ms in
 * 4 KiB pages here against 0.5 ms in 2 MiB ones. Where none is to be had, the kernel gives small pages. */
#define HUGE_PAGE (2ULL << 20)

static int ring_alloc(Ring *ring) {
        size_t bytes = ring->slots * ring->slot_bytes;
        char *m, *base;

        m = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
                return -errno;
        base = (char *) (((uintptr_t) m + HUGE_PAGE - 1) & ~(uintptr_t) (HUGE_PAGE - 1));
        (void) madvise(base, bytes, MADV_HUGEPAGE);
        ring->mem = m;
        ring->mem_bytes = bytes + HUGE_PAGE;
        for (unsigned i = 0; i < ring->slots; i++)
                ring->slot[i] = base + i * ring->slot_bytes;
        return 0;
}

static void ring_free(Ring *ring) {
        if (ring->mem)
                (void) munmap(ring->mem, ring->mem_bytes);
        ring->mem = NULL;
}

/* The reader side, shared by rw2 and direct: fills whole slots from the pipe and hands them to the writers. */
static int ring_capture(Capture *c, Ring *ring) {
        size_t chunk = (size_t) c->settings->chunk_size;
        /* rw may have written the dump's start already (capture_rw's hand-off). */
        uint64_t queued = c->raw_bytes, next_check = 0;
        pthread_t writer[RING_MAX_WRITERS];
        unsigned started = 0;
        int r = 0;

        ring->kept_end = UINT64_MAX;
        r = ring_alloc(ring);
        for (; r == 0 && started < ring->writers; started++)
                r = start_writer(&writer[started], ring_writer, ring);
        if (r < 0 && started == 0) {
                ring_free(ring);
                return r;
        }
        c->ring_ns = now_ns(CLOCK_MONOTONIC);

        for (bool done = false; !done;) {
                unsigned i;
                size_t fill = 0;

                (void) pthread_mutex_lock(&ring->lock);
                i = (unsigned) (ring->filled % ring->slots);
                while (ring->busy[i] && !ring->stop)
                        (void) pthread_cond_wait(&ring->changed, &ring->lock);
                done = ring->stop;
                (void) pthread_mutex_unlock(&ring->lock);
                if (done)
                        break;

                /* Fill a whole slot before handing it over: fewer wakeups of the writers. */
                while (fill < ring->slot_bytes) {
                        size_t want = next_len(c, queued + fill, MIN(chunk, ring->slot_bytes - fill));
                        /* The alarm may have gone off while we waited for a free slot (the disk being the
                         * slower side), and then no read() of ours was there for it to interrupt. */
                        const char *stop = stop_reason(c, queued + fill, &next_check, want);
                        ssize_t n;

                        if (stop) {
                                set_failure(c, stop, 0);
                                done = true;
                                break;
                        }
                        n = read_some(c, ring->slot[i] + fill, want);
                        if (n <= 0) {
                                if (n < 0)
                                        set_failure(c, n == -ETIMEDOUT ? "timeout" : "read_error", (int) n);
                                done = true;
                                break;
                        }
                        fill += (size_t) n;
                }
                /* The padding an O_DIRECT write of a short last slot carries: zeros, not a previous slot's bytes. */
                if (fill % BLOCK)
                        memset(ring->slot[i] + fill, 0, BLOCK - fill % BLOCK);

                (void) pthread_mutex_lock(&ring->lock);
                if (fill > 0) {
                        ring->len[i] = fill;
                        ring->off[i] = queued;
                        ring->busy[i] = true;
                        ring->filled++;
                }
                (void) pthread_cond_broadcast(&ring->changed);
                (void) pthread_mutex_unlock(&ring->lock);
                queued += fill;
        }

        (void) pthread_mutex_lock(&ring->lock);
        ring->eof = true;
        (void) pthread_cond_broadcast(&ring->changed);
        (void) pthread_mutex_unlock(&ring->lock);
        for (unsigned w = 0; w < started; w++)
                (void) pthread_join(writer[w], NULL);
        c->raw_bytes = MIN(queued, ring->kept_end);
        /* Slots read from the pipe but not kept (after a failed write) are accounted as drained. */
        c->drained_bytes += queued - c->raw_bytes;

        ring_free(ring);
        return 0;
}

static int capture_rw2(Capture *c) {
        Ring ring = { .c = c, .lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER,
                      .slot_bytes = RW2_SLOT_BYTES, .slots = RW2_SLOTS, .writers = 1 };

        /* On the kernel's 64 KiB pipe the idle reader thread wakes for about every page the kernel writes, on
         * the other CPU: bench/capture.py measured a 1 GiB crash held 2.6 s there against 0.8 s on 1 MiB. */
        if (c->settings->pipe_size == 0)
                (void) fcntl(c->in_fd, F_SETPIPE_SZ, (int) RW2_SLOT_BYTES);
        c->strategy = strategy_to_string(STRATEGY_RW2);
        return ring_capture(c, &ring);
}

/* rw2 with O_DIRECT writes from big slots, DIRECT_WRITERS of them in flight. A big dump written through the
 * page cache waits for page allocation and reclaim (on a VM that returned its free memory to the host, for the
 * host too) and evicts the server's working set; written O_DIRECT, it costs the disk's write rate and a few
 * reused buffers. Which one is faster is the host's: corehandler measures it (capture_choose). */
static int capture_direct(Capture *c) {
        Ring ring = { .c = c, .lock = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER,
                      .slot_bytes = DIRECT_SLOT_BYTES, .slots = DIRECT_SLOTS, .writers = DIRECT_WRITERS,
                      .direct = true };
        int r;

        /* Filesystems without direct I/O (ramfs, some FUSE) refuse the flag: nothing moved yet, fall back. */
        r = set_direct(c->out_fd, true);
        if (r < 0)
                return r;
        if (c->settings->pipe_size == 0)
                (void) fcntl(c->in_fd, F_SETPIPE_SZ, (int) RW2_SLOT_BYTES);
        c->strategy = strategy_to_string(STRATEGY_DIRECT);
        r = ring_capture(c, &ring);
        /* Later reads and writes of the core (its ELF magic, a fallback to rw) are small and unaligned. */
        (void) set_direct(c->out_fd, false);
        return r;
}

/* ---- splice() stdin -> private pipe -> file, the second hop in its own thread ---- */

typedef struct Relay {
        Capture *c;
        int pipe_rd;
        int sink; /* /dev/null, opened up front: after a failure the private pipe must still be emptied */
        volatile sig_atomic_t failed;
} Relay;

/* splice() moves page references, not bytes: no buffer to keep in cache, so fewer, larger calls are better
 * (bench/capture.py: 1 MiB calls beat 256 KiB ones on the vmsplice path) whatever chunk_size says for rw. */
static size_t splice2_chunk(const Capture *c) {
        return (size_t) MAX(c->settings->chunk_size, RW2_SLOT_BYTES);
}

static void *relay_writer(void *userdata) {
        Relay *relay = userdata;
        Capture *c = relay->c;
        size_t chunk = splice2_chunk(c);
        uint64_t next_check = 0;

        for (;;) {
                const char *stop;
                uint64_t since;
                ssize_t n;

                if (!relay->failed) {
                        stop = stop_reason(c, c->raw_bytes, &next_check, chunk);
                        if (stop && strcmp(stop, "timeout") != 0) {
                                set_failure(c, stop, 0);
                                relay->failed = 1;
                        }
                }
                /* Once failed, keep emptying the private pipe, or the first hop would block forever. */
                since = now_ns(CLOCK_MONOTONIC);
                n = splice(relay->pipe_rd, NULL, relay->failed ? relay->sink : c->out_fd, NULL, chunk,
                           SPLICE_F_MOVE);
                note_longest(&c->longest_write_ns, since);
                if (n == 0)
                        break;
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (relay->failed)
                                break;
                        set_failure(c, "write_error", -errno);
                        relay->failed = 1;
                        continue;
                }
                if (relay->failed)
                        c->drained_bytes += (uint64_t) n;
                else
                        c->raw_bytes += (uint64_t) n;
        }
        return NULL;
}

static int capture_splice2(Capture *c) {
        Relay relay = { .c = c };
        size_t chunk = splice2_chunk(c);
        uint64_t queued = 0;
        pthread_t writer;
        int p[2], r;

        relay.sink = open("/dev/null", O_WRONLY | O_CLOEXEC);
        if (relay.sink < 0)
                return -errno;
        if (pipe2(p, O_CLOEXEC) < 0) {
                r = -errno;
                (void) close(relay.sink);
                return r;
        }
        (void) fcntl(p[1], F_SETPIPE_SZ, (int) MAX(c->settings->pipe_size, RW2_SLOT_BYTES));
        relay.pipe_rd = p[0];

        r = start_writer(&writer, relay_writer, &relay);
        if (r < 0) {
                (void) close(p[0]);
                (void) close(p[1]);
                (void) close(relay.sink);
                return r;
        }

        c->strategy = strategy_to_string(STRATEGY_SPLICE2);
        for (;;) {
                size_t want = next_len(c, queued, chunk);
                uint64_t since;
                ssize_t n;

                if (relay.failed)
                        break;
                if (want == 0) {
                        set_failure(c, "max_dump_size", 0);
                        break;
                }
                if (capture_timed_out) {
                        set_failure(c, "timeout", 0);
                        break;
                }
                since = now_ns(CLOCK_MONOTONIC);
                n = splice(c->in_fd, NULL, p[1], NULL, want, SPLICE_F_MOVE);
                note_read(c, since, n);
                if (n == 0)
                        break;
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        if (queued == 0 && (errno == EINVAL || errno == ENOSYS || errno == EBADF))
                                r = -errno;
                        else
                                set_failure(c, "read_error", -errno);
                        break;
                }
                queued += (uint64_t) n;
        }
        (void) close(p[1]);
        (void) pthread_join(writer, NULL);
        (void) close(p[0]);
        (void) close(relay.sink);
        return r;
}

Strategy capture_choose(const Settings *s, uint64_t expected_bytes) {
        if (s->direct_above > 0 && expected_bytes >= s->direct_above)
                return STRATEGY_DIRECT;
        return s->strategy;
}

uint64_t capture_drain(int in_fd, bool *ret_eof) {
        static char buf[64 * 1024];
        uint64_t total = 0, deadline = now_ns(CLOCK_MONOTONIC) + CAPTURE_DRAIN_NS;
        int sink;

        *ret_eof = false;
        /* splice to /dev/null moves page references, not bytes: the cheapest way to release the process. */
        sink = open("/dev/null", O_WRONLY | O_CLOEXEC);
        while (sink >= 0 && !capture_timed_out && now_ns(CLOCK_MONOTONIC) < deadline) {
                ssize_t n = splice(in_fd, NULL, sink, NULL, 1U << 20, SPLICE_F_MOVE);
                if (n > 0) {
                        total += (uint64_t) n;
                        continue;
                }
                if (n < 0 && errno == EINTR)
                        continue;
                if (n == 0) {
                        (void) close(sink);
                        *ret_eof = true;
                        return total;
                }
                break;
        }
        if (sink >= 0)
                (void) close(sink);
        while (!capture_timed_out && now_ns(CLOCK_MONOTONIC) < deadline) {
                ssize_t n = read_fd(in_fd, buf, sizeof buf);
                if (n <= 0) {
                        *ret_eof = n == 0;
                        break;
                }
                total += (uint64_t) n;
        }
        return total;
}

/* io_realtime: the dump's writes go ahead of the page cache's writeback and of other processes' I/O (mq-deadline
 * and bfq serve the realtime class first), because the crashed process waits on them and nobody waits on the
 * flusher. Off by default: whoever crashes processes would have the disk ahead of every service, and the gain
 * was not consistent (bench/results/capture-tails.md, stored-upload.md). The middle level of the class; set
 * before the writer threads start, which inherit it. Needs CAP_SYS_ADMIN or CAP_SYS_NICE. */
static int set_realtime_io(void) {
        if (syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_RT, 4)) < 0)
                return -errno;
        return 0;
}

void capture_run(Capture *c) {
        static int (*const table[_STRATEGY_MAX])(Capture *c) = {
                [STRATEGY_RW] = capture_rw,
                [STRATEGY_SPLICE] = capture_splice,
                [STRATEGY_RW2] = capture_rw2,
                [STRATEGY_SPLICE2] = capture_splice2,
                [STRATEGY_DIRECT] = capture_direct,
        };
        Strategy strategy;
        bool eof = false;
        int r;

        if (c->settings->pipe_size > 0 && !c->from_socket &&
            fcntl(c->in_fd, F_SETPIPE_SZ, (int) c->settings->pipe_size) < 0)
                log_full(LOG_NOTICE, "Failed to resize the core pipe to %llu bytes, ignoring: %m",
                         (unsigned long long) c->settings->pipe_size);

        if (c->settings->io_realtime) {
                r = set_realtime_io();
                if (r < 0)
                        (void) log_errno(LOG_NOTICE, r, "Failed to move the dump's writes to the realtime I/O "
                                         "class, ignoring: %m");
                c->io_realtime = r >= 0;
        }

        strategy = capture_choose(c->settings, c->expected_bytes);
        r = table[strategy](c);
        if (r < 0 && strategy != STRATEGY_RW) {
                (void) log_errno(LOG_NOTICE, r, "Strategy %s refused (%m), falling back to rw",
                                 strategy_to_string(strategy));
                r = capture_rw(c);
        }
        c->eof_ns = now_ns(CLOCK_MONOTONIC);
        if (r < 0)
                set_failure(c, "write_error", r);

        /* The file's size is the record's byte count, whatever stopped us: trailing holes, a failed write. */
        if (ftruncate(c->out_fd, (off_t) c->raw_bytes) < 0)
                (void) log_errno(LOG_WARNING, errno, "Failed to set the core file's size, ignoring: %m");

        if (!capture_timed_out && !(c->from_socket && c->truncated)) {
                c->drained_bytes += capture_drain(c->in_fd, &eof);
                if (!eof && !capture_timed_out)
                        log_full(LOG_WARNING, "Stopped draining the dump %llu bytes past the capture: closing the "
                                 "pipe ends it", (unsigned long long) c->drained_bytes);
        }
        /* Nothing left after the limit means the dump was exactly the limit; only a drain that ran to EOF
         * can tell, not one the timeout or the drain's own bound cut short. */
        if (c->truncated && strcmp(c->truncated, "max_dump_size") == 0 && c->drained_bytes == 0 && eof)
                c->truncated = NULL;
}
