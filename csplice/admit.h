/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdint.h>

#include "record.h"

/* Admission: the reason to keep only metadata, or NULL to capture. Checked before the first byte is read (in
 * socket mode before the kernel writes it). */
const char *admit(Crash *c, int spool_fd);

/* A smaller RLIMIT_CORE than max_dump_size cuts the capture there, like the kernel's own core files. Returns
 * the configured limit, for admit_restore_limit(), which also names the cut for what it was. */
uint64_t admit_apply_rlimit(Crash *c);
void admit_restore_limit(Crash *c, uint64_t configured);
