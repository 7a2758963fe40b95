/* SPDX-License-Identifier: MIT */
#pragma once

#include <syslog.h>

/* Opens the log target, always above fd 2 (the kernel starts us with fds 1 and 2 closed). The kernel log by
 * default, since whatever crashed might be the journal or syslog; stderr when CSPLICE_LOG_STDERR is set (tests
 * run csplice without root). Call before stdio is redirected: it also keeps the stderr we were given, if any,
 * for log_usage(). */
void log_open(void);

/* A usage error, for a person who ran csplice by hand: one line on the stderr we were started with, or the
 * log when there was none (the kernel's case). Not added to any record: none is written. */
void log_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Logs one line; also appends it to the record's error list when prio is LOG_WARNING or worse. */
void log_full(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logs with errno set to err, so %m names it, and returns -err: `return log_errno(LOG_ERR, r, "...: %m");` */
int log_errno(int prio, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Warnings and errors logged so far, for the spool record. */
unsigned log_error_count(void);
const char *log_error_get(unsigned i);

/* Forgets them: a listener's child starts its crash's record with none of the listener's. */
void log_forget_errors(void);
