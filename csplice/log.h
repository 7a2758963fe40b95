/* SPDX-License-Identifier: MIT */
#pragma once

#include <syslog.h>

/* Opens the log target. The kernel log by default, since whatever crashed might be the journal or syslog;
 * stderr when CSPLICE_LOG_STDERR is set (tests run csplice without root). Call before stdio is redirected. */
void log_open(void);

/* Logs one line; also appends it to the record's error list when prio is LOG_WARNING or worse. */
void log_full(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logs with errno set to err, so %m names it, and returns -err: `return log_errno(LOG_ERR, r, "...: %m");` */
int log_errno(int prio, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Warnings and errors logged so far, for the spool record. */
unsigned log_error_count(void);
const char *log_error_get(unsigned i);

/* Forgets them: a listener's child starts its crash's record with none of the listener's. */
void log_forget_errors(void);
