/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>

#include "record.h"

/* Who may feed us (docs/design.md): in pipe mode the kernel, so stdin is a pipe and %P a process that is there
 * in proc_root. Returns NULL, or why not (written into buf). */
const char *identity_check_caller(const Crash *c, int in_fd, const char *proc_root, char *buf, size_t size);

/* The crash's identity, read while the kernel still holds the process: the boot id, /proc/PID's facts and the
 * dump's id. Returns -errno when /proc/PID could not be read (the id is made all the same). */
int identity_collect(Crash *c, const char *proc_root);
