/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdint.h>

#include "record.h"

/* Admission: the reason to keep only metadata, or NULL to capture; c->shed set when not even the record fits
 * its user's budget. Checked before the first byte is read (in socket mode before the kernel writes it). */
const char *admit(Crash *c, int spool_fd);

/* The capture's time limit in seconds (0: none). The configured timeout is the ceiling; below it a dump gets
 * ADMIT_TIMEOUT_BASE_SEC plus a second per ADMIT_TIMEOUT_BYTES_PER_SEC of what it can hold (the process's
 * address space, or the socket request's size, at most the size limit), so that a small process's stalled dump
 * does not hold the process and one of the kernel's core_pipe_limit slots for an hour. A slow disk shared by
 * sixteen dumps still writes each faster than that rate. Unknown size: the ceiling. */
#define ADMIT_TIMEOUT_BASE_SEC 60ULL
#define ADMIT_TIMEOUT_BYTES_PER_SEC (4ULL << 20)
uint64_t admit_timeout(const Crash *c);

/* A smaller RLIMIT_CORE than max_dump_size cuts the capture there, like the kernel's own core files. Returns
 * the configured limit, for admit_restore_limit(), which also names the cut for what it was. */
uint64_t admit_apply_rlimit(Crash *c);
void admit_restore_limit(Crash *c, uint64_t configured);
