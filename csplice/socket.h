/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* What socket mode learned about a connection, for the record. The kernel's own words are kept as numbers:
 * they are its protocol, not ours. */
typedef struct SocketFacts {
        bool handshake;     /* "@@": a request came, an ack went; false for plain "@" (6.16) */
        uint32_t req_size;  /* the request's own size field (16 on 6.17/6.18, larger on later kernels) */
        uint32_t req_size_ack;
        uint64_t req_mask;  /* what the kernel offered */
        uint64_t ack_mask;  /* what we answered; 0 before the ack */
        int64_t mark;       /* the kernel's answer to the ack; -1 before it came */
        const char *error;  /* what went wrong in the exchange, or NULL */

        int pidfd;
        uint32_t coredump_mask; /* PIDFD_INFO_COREDUMP's bits */
        /* Storage for the argv the kernel would have given a pipe handler; Crash.argv points in here. */
        char args[12][72]; /* 12 = _ARG_MAX (checked in socket.c); 72 > a nodename */
} SocketFacts;

typedef struct Crash Crash;

/* Whether fd is a socket, i.e. csplice runs in socket mode (a listener or systemd's Accept=yes gave it). */
bool socket_is_connection(int fd);

/* Identifies the peer of connection fd through its pidfd and fills c->argv with what the kernel passes a pipe
 * handler (%P %I %u %g %d %s %t %c %h %F). Returns -EPERM when the peer is not a task being dumped: anybody
 * who can connect could otherwise hand us a made-up "crash". Then reads the request (socket_read_request);
 * a failure there is f->error, for the record, not a refusal. */
int socket_identify(int fd, Crash *c, const char *proc_root);

/* Counts a refused peer in <spool>/.refused (one number; the daemon's metrics read it). Nothing else stored. */
#define REFUSED_FILE ".refused"
void socket_count_refused(const char *spool_dir);

/* Reads the kernel's request ("@@"), or finds the dump itself already streaming (plain "@"). Returns 0 or
 * -errno (-EPROTO: not the kernel's protocol). */
int socket_read_request(int fd, SocketFacts *f);

/* Answers the request: keep = take the dump (KERNEL|WAIT), else REJECT; then reads the kernel's mark.
 * Returns 0 when the kernel agreed, or -errno with f->error saying what went wrong. */
int socket_answer(int fd, SocketFacts *f, bool keep);

/* The dump's likely size, to refuse it before it is written: VmRSS of the crashed process, 0 if unknown. */
uint64_t socket_estimate_bytes(const Crash *c);
