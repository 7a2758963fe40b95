/* SPDX-License-Identifier: MIT */
/*
 * Whether a dump is kept: the spool's backlog (per user, then for all), the crash-storm limit (per user and
 * executable), RLIMIT_CORE, the size limit and the free-space floor, each checked before the capture reads a
 * byte; and whether even its record is kept (the budgets' second half).
 */
#include <string.h>

#include "admit.h"
#include "log.h"
#include "socket.h"
#include "util.h"

/* The spool's backlog, per user first (docs/design.md, threat model): a user holds at most max_pending_per_uid
 * pending records with a core, and as many again without one; all users but root together max_pending, and as
 * many again without. Root's room is its own (max_pending, and as many again), so no other user's storm ever
 * takes root's core. Past a budget's second half nothing is stored: the crash is shed. */
static const char *admit_pending(Crash *c, int spool_fd, long long uid) {
        const Settings *s = &c->settings;
        uint64_t share, others;
        Pending p;
        int r;

        if (s->max_pending == 0)
                return NULL;
        share = uid == 0 ? s->max_pending : MIN(s->max_pending_per_uid ?: s->max_pending, s->max_pending);
        r = spool_count_pending(spool_fd, uid, 4 * s->max_pending, &p);
        if (r < 0) {
                (void) log_errno(LOG_WARNING, r, "Failed to count pending records, ignoring: %m");
                return NULL;
        }
        others = uid == 0 ? p.mine : p.all - p.root;
        c->shed = p.mine >= 2 * share || others >= 2 * s->max_pending;
        if (others >= s->max_pending)
                return "max_pending";
        if (p.mine >= share)
                return "max_pending_per_uid";
        return NULL;
}

/* Per user and executable: a user crashing /usr/bin/sleep 16 times a minute must not make root's next sleep
 * crash metadata-only. Past twice the limit the crash is shed. */
static const char *admit_rate(Crash *c, int spool_fd, long long uid) {
        uint64_t limit = c->settings.max_per_exe_per_minute;
        const char *key;
        int r;

        if (limit == 0)
                return NULL;
        key = c->proc.exe ?: c->argv[ARG_COMM] ?: "";
        r = spool_rate_hit(spool_fd, uid, key, (time_t) (c->started_ns / 1000000000ULL));
        if (r < 0) {
                (void) log_errno(LOG_WARNING, r, "Failed to update the crash rate, ignoring: %m");
                return NULL;
        }
        if ((uint64_t) r > 2 * limit)
                c->shed = true;
        return (uint64_t) r > limit ? "max_per_exe_per_minute" : NULL;
}

const char *admit(Crash *c, int spool_fd) {
        const Settings *s = &c->settings;
        uint64_t estimate = c->socket_mode ? socket_estimate_bytes(c) : 0;
        long long uid = crash_arg_number(c, ARG_UID), rlimit = crash_arg_number(c, ARG_RLIMIT);
        const char *pending, *rate;
        int r;

        /* Every crash counts against its user's budgets, whether a core would be kept or not: a record is what a
         * storm of `ulimit -c 0` crashes fills the spool with. */
        pending = admit_pending(c, spool_fd, uid);
        rate = admit_rate(c, spool_fd, uid);
        if (c->shed)
                return pending ?: rate;

        /* RLIMIT_CORE means what it means for a core file: 0 is "no core", in both modes (docs/design.md). 1 is
         * the kernel's guard against a handler's own helpers crashing into it (it never pipes such a dump);
         * socket mode honours it the same way. */
        if (rlimit == 0 || rlimit == 1)
                return "rlimit_core";
        /* Only the socket can refuse a dump before it is written; a pipe truncates it at the limit instead. */
        if (s->max_dump_size > 0 && estimate > s->max_dump_size)
                return "max_dump_size";
        if (pending || rate)
                return pending ?: rate;
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
