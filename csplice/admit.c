/* SPDX-License-Identifier: MIT */
/*
 * Whether a dump is kept: RLIMIT_CORE, the size limit, the spool's backlog, the crash-storm limit (per user and
 * executable) and the free-space floor, each checked before the capture reads a byte.
 */
#include <string.h>

#include "admit.h"
#include "log.h"
#include "socket.h"
#include "util.h"

const char *admit(Crash *c, int spool_fd) {
        const Settings *s = &c->settings;
        uint64_t estimate = c->socket_mode ? socket_estimate_bytes(c) : 0;
        const char *key;
        int r;

        /* RLIMIT_CORE means what it means for a core file: 0 is "no core", in both modes (docs/design.md). 1 is
         * the kernel's guard against a handler's own helpers crashing into it (it never pipes such a dump);
         * socket mode honours it the same way. */
        long long rlimit = crash_arg_number(c, ARG_RLIMIT);
        if (rlimit == 0 || rlimit == 1)
                return "rlimit_core";
        /* Only the socket can refuse a dump before it is written; a pipe truncates it at the limit instead. */
        if (s->max_dump_size > 0 && estimate > s->max_dump_size)
                return "max_dump_size";

        if (s->max_pending > 0) {
                r = spool_count_pending(spool_fd, s->max_pending);
                if (r < 0)
                        (void) log_errno(LOG_WARNING, r, "Failed to count pending records, ignoring: %m");
                else if ((uint64_t) r >= s->max_pending)
                        return "max_pending";
        }
        /* Per user and executable: a user crashing /usr/bin/sleep 16 times a minute must not make root's next
         * sleep crash metadata-only. */
        if (s->max_per_exe_per_minute > 0) {
                key = c->proc.exe ?: c->argv[ARG_COMM] ?: "";
                r = spool_rate_hit(spool_fd, crash_arg_number(c, ARG_UID), key,
                                   (time_t) (c->started_ns / 1000000000ULL));
                if (r < 0)
                        (void) log_errno(LOG_WARNING, r, "Failed to update the crash rate, ignoring: %m");
                else if ((uint64_t) r > s->max_per_exe_per_minute)
                        return "max_per_exe_per_minute";
        }
        /* At least the headroom the capture's first check asks for: a dump let in here must get its first bytes. */
        r = capture_space_ok(spool_fd, s, MAX(estimate, (uint64_t) CAPTURE_SPACE_STEP));
        if (r < 0)
                (void) log_errno(LOG_WARNING, r, "Failed to check free space, ignoring: %m");
        else if (r == 0)
                return "min_free";
        return NULL;
}

uint64_t admit_timeout(const Crash *c) {
        uint64_t ceiling = c->settings.timeout, limit = c->settings.max_dump_size, size;
        long long rlimit = crash_arg_number(c, ARG_RLIMIT);

        size = c->socket_mode ? socket_estimate_bytes(c) : procinfo_vm_bytes(&c->proc);
        if (ceiling == 0 || size == 0)
                return ceiling;
        if (rlimit > 0 && (limit == 0 || (uint64_t) rlimit < limit))
                limit = (uint64_t) rlimit;
        if (limit > 0)
                size = MIN(size, limit);
        return MIN(ceiling, ADMIT_TIMEOUT_BASE_SEC + size / ADMIT_TIMEOUT_BYTES_PER_SEC);
}

uint64_t admit_apply_rlimit(Crash *c) {
        long long rlimit = crash_arg_number(c, ARG_RLIMIT); /* -1 for RLIM_INFINITY, past LLONG_MAX */
        uint64_t configured = c->settings.max_dump_size;

        if (rlimit > 0 && (configured == 0 || (uint64_t) rlimit < configured))
                c->settings.max_dump_size = (uint64_t) rlimit;
        return configured;
}

void admit_restore_limit(Crash *c, uint64_t configured) {
        if (c->settings.max_dump_size != configured && c->capture.truncated &&
            strcmp(c->capture.truncated, "max_dump_size") == 0)
                c->capture.truncated = "rlimit_core";
        c->settings.max_dump_size = configured;
}
