/* SPDX-License-Identifier: MIT */
#pragma once

#include <signal.h>
#include <stdint.h>

#include "settings.h"

/* Bytes between the capture's free-space checks, and the headroom each asks for above the floor; admission asks
 * for the same, so a dump it lets in is not stopped before its first byte. */
#define CAPTURE_SPACE_STEP (16ULL << 20)

typedef struct Capture {
        int in_fd;
        int out_fd;
        const Settings *settings;
        bool from_socket;       /* socket mode: no pipe to resize, and after a stop closing releases the process */
        uint64_t expected_bytes; /* what the process had resident before the dump (VmRSS); 0 if unknown */

        uint64_t raw_bytes;      /* the record's capture.bytes: the dump in out_fd (holes included), == its size */
        uint64_t drained_bytes;  /* read past a stop and thrown away */
        uint64_t direct_from;    /* where rw handed the rest of the dump to direct; 0 if it did not */
        const char *strategy;   /* the strategy that really ran */
        bool io_realtime;       /* its writes ran in the realtime I/O class (settings' io_realtime, granted) */
        const char *truncated;  /* why the capture stopped before EOF, or NULL */
        int error;              /* -errno behind a "read_error"/"write_error" truncation */

        /* The capture's own trace, for the record's capture.phases (CLOCK_MONOTONIC; 0: did not happen): a tail
         * round of a benchmark says where its time went. */
        uint64_t ring_ns;          /* rw2/direct: the buffers mapped and the writer threads started */
        uint64_t first_byte_ns;    /* the first bytes of the dump read */
        uint64_t handoff_ns;       /* rw moved the rest to direct */
        uint64_t eof_ns;           /* the strategy done: every byte kept is written (before the drain) */
        uint64_t longest_read_ns;  /* the longest single call that took bytes from the dump (read, splice) */
        uint64_t longest_write_ns; /* the longest single write into the core file (pwrite, the relay's splice) */
} Capture;

/* Set from the SIGALRM handler; every loop checks it so a stalled capture ends. */
extern volatile sig_atomic_t capture_timed_out;

/* Copies in_fd to out_fd with the configured strategy (falling back to read/write where its system calls
 * are refused), stops at the size limit and the free-space floor, then drains whatever is left so the
 * kernel releases the process. Nothing to return: every failure is recorded in c, for the record. */
void capture_run(Capture *c);

/* The strategy for a dump of about expected_bytes: direct from direct_above on, else the configured one. */
Strategy capture_choose(const Settings *s, uint64_t expected_bytes);

/* How long a drain may hold the crashed process. The rest of a dump past a limit can be any size (the kernel
 * writes an untouched mapping as zeros: a 1 TiB one is minutes of them), and the process holds one of the
 * kernel's core_pipe_limit slots until we are done: 16 such crashes made the kernel skip every other dump on
 * the host for the hour the timeout allowed. Closing the pipe ends the kernel's dump at once. */
#define CAPTURE_DRAIN_NS (2ULL * 1000000000ULL)

/* Reads in_fd to EOF and discards it, the fastest way available, for at most CAPTURE_DRAIN_NS; returns the
 * bytes discarded, *ret_eof whether the dump's end was reached. The caller closes in_fd either way. */
uint64_t capture_drain(int in_fd, bool *ret_eof);

/* Whether the filesystem of fd has room for `need` more bytes above the configured floor. Returns 1 or 0,
 * or -errno when it can't tell. */
int capture_space_ok(int fd, const Settings *s, uint64_t need);
