/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"
#include "json.h"
#include "log.h"
#include "util.h"

#define RECORD_SCHEMA 1

const char *const arg_names[_ARG_MAX] = {
        [ARG_PID] = "P",      [ARG_TID] = "i",     [ARG_TID_INITIAL] = "I", [ARG_UID] = "u",
        [ARG_GID] = "g",      [ARG_DUMPABLE] = "d", [ARG_SIGNAL] = "s",     [ARG_TIMESTAMP] = "t",
        [ARG_RLIMIT] = "c",   [ARG_HOSTNAME] = "h", [ARG_COMM] = "e",       [ARG_PIDFD] = "F",
};

long long crash_arg_number(const Crash *c, Arg a) {
        const char *s = c->argv[a];
        char *end;
        long long v;

        if (!s || *s < '0' || *s > '9')
                return -1;
        errno = 0;
        v = strtoll(s, &end, 10);
        return errno == 0 && *end == '\0' ? v : -1;
}

int crash_arg_int(const Crash *c, Arg a) {
        long long v = crash_arg_number(c, a);
        return v <= INT_MAX ? (int) v : -1;
}

static void json_number_or_null(Json *j, const char *key, long long v) {
        if (v < 0)
                json_null(j, key);
        else
                json_i64(j, key, v);
}

static void write_settings(Json *j, const Settings *s) {
        json_begin(j, "settings");
        json_string(j, "source", s->source);
        json_bool(j, "from_file", s->from_file);
        json_string(j, "error", s->error[0] ? s->error : NULL);
        for (size_t i = 0; i < setting_table_len; i++) {
                const SettingDef *d = &setting_table[i];
                const void *p = (const char *) s + d->offset;
                char text[PATH_MAX];

                /* Numbers and booleans typed; a share of the filesystem as "N%", as `config show --json` has it. */
                if (d->type == SETTING_U64)
                        json_u64(j, d->key, *(const uint64_t *) p);
                else if (d->type == SETTING_BOOL)
                        json_bool(j, d->key, *(const bool *) p);
                else if (d->type == SETTING_SIZE_OR_PERCENT && ((const SizeOrPercent *) p)->percent == 0)
                        json_u64(j, d->key, ((const SizeOrPercent *) p)->bytes);
                else {
                        setting_format(s, d, text, sizeof text);
                        json_string(j, d->key, text);
                }
        }
        json_end(j);
}

/* null outside a container csplice could vouch for (container.c). */
static void write_container(Json *j, const Container *c) {
        if (!c->id[0]) {
                json_null(j, "container");
                return;
        }
        json_begin(j, "container");
        json_string(j, "id", c->id);
        json_string(j, "runtime", c->runtime);
        json_begin(j, "annotations");
        for (size_t i = 0; i < CONTAINER_ANNOTATION_KEYS; i++)
                if (c->values[i])
                        json_string(j, container_annotation_keys[i], c->values[i]);
        json_end(j);
        json_end(j);
}

static void write_proc(Json *j, const ProcInfo *p, const Settings *s) {
        json_begin(j, "proc");
        json_bool(j, "available", p->available);
        json_string(j, "exe", p->exe);
        json_string(j, "comm", p->comm);
        if (p->cmdline)
                json_strv(j, "cmdline", p->cmdline, p->cmdline_len);
        else
                json_null(j, "cmdline");
        json_string(j, "status", p->status);
        json_string(j, "cgroup", p->cgroup);
        json_begin(j, "ns");
        for (size_t i = 0; i < PROC_NS_COUNT; i++)
                json_string(j, proc_ns_names[i], p->ns[i][0] ? p->ns[i] : NULL);
        json_end(j);
        write_container(j, &p->container);
        json_number_or_null(j, "userns_owner", p->userns_owner_known ? (long long) p->userns_owner : -1);
        if (s->collect_environ) {
                if (p->environ)
                        json_strv(j, "environ", p->environ, p->environ_len);
                else
                        json_null(j, "environ");
        }
        if (s->collect_maps)
                json_string(j, "maps", p->maps);
        if (p->available)
                json_u64(j, "start_ticks", p->start_ticks);
        json_string(j, "verified_by", p->verified_by);
        json_bool(j, "verified", p->verified);
        json_begin_array(j, "truncated");
        for (unsigned i = 0; i < p->n_truncated; i++)
                json_string(j, NULL, p->truncated[i]);
        json_end_array(j);
        json_end(j);
}

/* The kernel's side of the socket exchange: null in pipe mode. */
static void write_socket(Json *j, const Crash *c) {
        const SocketFacts *f = &c->socket;

        if (!c->socket_mode) {
                json_null(j, "socket");
                return;
        }
        json_begin(j, "socket");
        json_bool(j, "handshake", f->handshake);
        json_u64(j, "request_size", f->req_size);
        json_u64(j, "request_mask", f->req_mask);
        json_u64(j, "ack_mask", f->ack_mask);
        json_bool(j, "rejected", f->handshake && f->ack_mask != 0 && !(f->ack_mask & 1));
        json_number_or_null(j, "mark", f->mark);
        json_u64(j, "coredump_mask", f->coredump_mask);
        json_string(j, "error", f->error);
        json_end(j);
}

/* capture.phases: when each step of the hold ended, in ns after csplice's start (the copy's own steps in the
 * order its strategy takes them: rw's hand-off to direct maps the ring after the first byte); 0 where a step
 * did not happen (no ring for rw, no hand-off, nothing published for a dropped dump). A few fixed
 * integers, whatever the dump: enough to say where a slow round's time went. csplice_contract.PHASES is this
 * list on the Python side. */
static void write_phases(Json *j, const Crash *c) {
        const Capture *cap = &c->capture;
        const struct {
                const char *name;
                uint64_t at;
        } phases[] = {
                { "settings", c->settings_ns },
                { "metadata", c->metadata_ns },
                { "admitted", c->admitted_ns },
                { "created", c->capture_begin_ns },     /* the core file made: the copy starts */
                { "ring", cap->ring_ns },
                { "first_byte", cap->first_byte_ns },
                { "handoff", cap->handoff_ns },
                { "eof", cap->eof_ns },
                { "released", c->capture_end_ns },      /* drained and closed: the process let go */
                { "published", c->published_ns },
        };

        json_begin(j, "phases");
        for (size_t i = 0; i < ELEMENTSOF(phases); i++)
                json_u64(j, phases[i].name, phases[i].at > c->started_mono_ns ? phases[i].at - c->started_mono_ns : 0);
        json_end(j);
        json_u64(j, "longest_read_ns", cap->longest_read_ns);
        json_u64(j, "longest_write_ns", cap->longest_write_ns);
}

static void write_capture(Json *j, const Crash *c) {
        const Capture *cap = &c->capture;
        uint64_t ns = c->capture_end_ns - c->capture_begin_ns;

        json_begin(j, "capture");
        json_string(j, "mode", c->socket_mode ? "socket" : "pipe");
        write_socket(j, c);
        json_string(j, "strategy", cap->strategy);
        json_bool(j, "io_realtime", cap->io_realtime);
        /* rw that moved to O_DIRECT part way (capture.c's ADAPT_WINDOW): from which byte on. */
        json_number_or_null(j, "direct_from", cap->direct_from > 0 ? (long long) cap->direct_from : -1);
        json_u64(j, "bytes", cap->raw_bytes);
        json_u64(j, "drained_bytes", cap->drained_bytes);
        json_u64(j, "timeout_seconds", c->timeout);
        json_u64(j, "ns", ns);
        /* With handler.started_realtime_ns: how long the kernel held the crashed process for us. */
        json_u64(j, "ended_realtime_ns", c->released_ns);
        json_double(j, "throughput_bytes_per_second",
                    ns > 0 ? (double) (cap->raw_bytes + cap->drained_bytes) * 1e9 / (double) ns : 0.0);
        json_bool(j, "complete", c->has_core && !cap->truncated);
        json_bool(j, "truncated", c->has_core && cap->truncated);
        json_string(j, "truncated_reason", c->has_core ? cap->truncated : NULL);
        json_string(j, "error", cap->error ? strerror(-cap->error) : NULL);
        json_bool(j, "dropped", c->dropped != NULL);
        json_string(j, "dropped_reason", c->dropped);
        json_bool(j, "elf_magic", c->elf_magic);
        write_phases(j, c);
        json_end(j);
}

void record_write(const Crash *c, FILE *f) {
        Json j = { .f = f };

        json_begin(&j, NULL);
        json_u64(&j, "schema", RECORD_SCHEMA);
        json_string(&j, "id", c->id);
        /* Right behind the id, within the record's first SPOOL_RECORD_HEAD bytes: admission counts each user's
         * pending records by it (spool_count_pending) without parsing whole records. */
        json_number_or_null(&j, "uid", crash_arg_number(c, ARG_UID));
        if (c->has_core) {
                char name[SPOOL_ID_MAX + 8];
                (void) snprintf(name, sizeof name, "%s.core", c->id);
                json_string(&j, "core", name);
        } else
                json_null(&j, "core");

        json_begin(&j, "specifiers");
        for (unsigned a = 0; a < _ARG_MAX; a++)
                json_string(&j, arg_names[a], c->argv[a]);
        json_end(&j);

        json_number_or_null(&j, "pid", crash_arg_number(c, ARG_PID));
        json_number_or_null(&j, "tid", crash_arg_number(c, ARG_TID_INITIAL));
        json_number_or_null(&j, "gid", crash_arg_number(c, ARG_GID));
        json_number_or_null(&j, "signal", crash_arg_number(c, ARG_SIGNAL));
        json_number_or_null(&j, "timestamp", crash_arg_number(c, ARG_TIMESTAMP));
        json_number_or_null(&j, "dumpable", crash_arg_number(c, ARG_DUMPABLE));
        json_string(&j, "rlimit_core", c->argv[ARG_RLIMIT]);
        json_string(&j, "hostname", c->argv[ARG_HOSTNAME]);
        json_string(&j, "comm", c->argv[ARG_COMM]);
        json_string(&j, "boot_id", c->boot_id[0] ? c->boot_id : NULL);

        write_proc(&j, &c->proc, &c->settings);
        write_capture(&j, c);

        json_begin(&j, "handler");
        json_string(&j, "name", "csplice");
        json_string(&j, "version", CSPLICE_VERSION);
        json_u64(&j, "started_realtime_ns", c->started_ns);
        write_settings(&j, &c->settings);
        json_end(&j);

        json_begin_array(&j, "errors");
        for (unsigned i = 0; i < log_error_count(); i++)
                json_string(&j, NULL, log_error_get(i));
        json_end_array(&j);

        json_end(&j);
        (void) fputc('\n', f);
}
