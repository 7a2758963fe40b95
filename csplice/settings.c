/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "settings.h"
#include "util.h"

#define SETTINGS_MAX_BYTES (64 * 1024)

static const char *const strategy_table[_STRATEGY_MAX] = {
        [STRATEGY_RW] = "rw",
        [STRATEGY_SPLICE] = "splice",
        [STRATEGY_RW2] = "rw2",
        [STRATEGY_SPLICE2] = "splice2",
        [STRATEGY_DIRECT] = "direct",
};

const char *strategy_to_string(Strategy s) {
        return s >= 0 && s < _STRATEGY_MAX ? strategy_table[s] : NULL;
}

int strategy_from_string(const char *s) {
        for (size_t i = 0; i < ELEMENTSOF(strategy_table); i++)
                if (strcmp(s, strategy_table[i]) == 0)
                        return (int) i;
        return -EINVAL;
}

/* The keys of csplice.conf, one line each: corehandler renders every [capture] option of its config under the
 * same name (tests/local/test_csplice_contract.py holds the two sides together). */
#define SETTING(key, type) { #key, type, offsetof(Settings, key) }
const SettingDef setting_table[] = {
        SETTING(spool_dir, SETTING_PATH),
        SETTING(strategy, SETTING_STRATEGY),
        SETTING(chunk_size, SETTING_U64),
        SETTING(pipe_size, SETTING_U64),
        SETTING(max_dump_size, SETTING_U64),
        SETTING(direct_above, SETTING_U64),
        SETTING(direct_rate, SETTING_U64),
        SETTING(min_free, SETTING_SIZE_OR_PERCENT),
        SETTING(max_pending, SETTING_U64),
        SETTING(max_pending_per_uid, SETTING_U64),
        SETTING(max_per_exe_per_minute, SETTING_U64),
        SETTING(timeout, SETTING_U64),
        SETTING(fsync, SETTING_BOOL),
        SETTING(sparse, SETTING_BOOL),
        SETTING(io_realtime, SETTING_BOOL),
        SETTING(collect_environ, SETTING_BOOL),
        SETTING(collect_maps, SETTING_BOOL),
};
const size_t setting_table_len = ELEMENTSOF(setting_table);

void settings_defaults(Settings *s) {
        *s = (Settings) {
                .spool_dir = CSPLICE_SPOOL_DIR,
                /* bench/results/capture.md, stock 6.18 kernel: read/write of 256 KiB on a 1 MiB pipe held crashed
                 * processes no longer than a plain read/write loop, and up to 30% shorter. The file corehandler
                 * renders picks the strategy per kernel (corehandler/csplice_contract.py). */
                .strategy = STRATEGY_RW,
                .chunk_size = 256 * 1024,
                .pipe_size = 1024 * 1024,
                .max_dump_size = 32ULL << 30,
                /* Without a file, or before corehandler has measured this host's write rates (the file then
                 * says what they chose: host/writerates.py). bench/results/capture.md, v0.2: at 4 GiB the
                 * buffered write met the dirty limits and held 4x longer than direct on any host. */
                .direct_above = 2ULL << 30,
                .min_free = { .percent = 15 },
                .max_pending = 64,
                .max_pending_per_uid = 16,
                .max_per_exe_per_minute = 16,
                .timeout = 3600,
                .fsync = false,
                .sparse = true,
                .io_realtime = false,
                .source = "built-in defaults",
        };
}

static int parse_u64(const char *v, uint64_t *ret) {
        char *end;
        unsigned long long x;

        if (*v < '0' || *v > '9')
                return -EINVAL;
        errno = 0;
        x = strtoull(v, &end, 10);
        if (errno != 0 || *end != '\0')
                return -EINVAL;
        *ret = x;
        return 0;
}

static int parse_bool(const char *v, bool *ret) {
        if (strcmp(v, "yes") == 0 || strcmp(v, "1") == 0 || strcmp(v, "true") == 0)
                *ret = true;
        else if (strcmp(v, "no") == 0 || strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
                *ret = false;
        else
                return -EINVAL;
        return 0;
}

static int parse_size_or_percent(const char *v, SizeOrPercent *ret) {
        SizeOrPercent x = {};
        size_t len = strlen(v);
        char digits[32];
        int r;

        if (len > 0 && v[len - 1] == '%') {
                if (len > sizeof digits)
                        return -EINVAL;
                memcpy(digits, v, len - 1);
                digits[len - 1] = '\0';
                r = parse_u64(digits, &x.percent);
        } else
                r = parse_u64(v, &x.bytes);
        if (r < 0)
                return r;
        *ret = x;
        return 0;
}

static int parse_path(const char *v, char *ret) {
        /* Relative paths would resolve against whatever cwd the kernel gave us. */
        if (v[0] != '/' || strlen(v) >= PATH_MAX)
                return -EINVAL;
        strcpy(ret, v);
        return 0;
}

static int parse_strategy(const char *v, Strategy *ret) {
        int r = strategy_from_string(v);
        if (r < 0)
                return r;
        *ret = (Strategy) r;
        return 0;
}

static int settings_apply(Settings *s, const char *key, const char *value) {
        for (size_t i = 0; i < setting_table_len; i++) {
                const SettingDef *d = &setting_table[i];
                void *p = (char *) s + d->offset;

                if (strcmp(key, d->key) != 0)
                        continue;
                switch (d->type) {
                case SETTING_PATH:
                        return parse_path(value, p);
                case SETTING_STRATEGY:
                        return parse_strategy(value, p);
                case SETTING_U64:
                        return parse_u64(value, p);
                case SETTING_BOOL:
                        return parse_bool(value, p);
                case SETTING_SIZE_OR_PERCENT:
                        return parse_size_or_percent(value, p);
                }
        }
        /* Unknown keys are ignored so an older csplice runs with a newer control plane's file. */
        return 0;
}

void setting_format(const Settings *s, const SettingDef *d, char *buf, size_t size) {
        const void *p = (const char *) s + d->offset;
        const SizeOrPercent *sp = p;

        switch (d->type) {
        case SETTING_PATH:
                (void) snprintf(buf, size, "%s", (const char *) p);
                break;
        case SETTING_STRATEGY:
                (void) snprintf(buf, size, "%s", strategy_to_string(*(const Strategy *) p));
                break;
        case SETTING_U64:
                (void) snprintf(buf, size, "%llu", (unsigned long long) *(const uint64_t *) p);
                break;
        case SETTING_BOOL:
                (void) snprintf(buf, size, "%s", *(const bool *) p ? "yes" : "no");
                break;
        case SETTING_SIZE_OR_PERCENT:
                (void) snprintf(buf, size, sp->percent > 0 ? "%llu%%" : "%llu",
                                (unsigned long long) (sp->percent > 0 ? sp->percent : sp->bytes));
                break;
        }
}

static int settings_validate(Settings *s) {
        if (s->chunk_size < 4096 || s->chunk_size > (64ULL << 20))
                return -ERANGE;
        if (s->pipe_size > (1ULL << 30) || s->min_free.percent > 100)
                return -ERANGE;
        return 0;
}

int settings_load(Settings *s, const char *path) {
        Settings parsed;
        char *buf = NULL, *line, *saveptr = NULL;
        unsigned lineno = 0;
        size_t len;
        int r;

        settings_defaults(s);
        parsed = *s;

        r = read_bounded_at(AT_FDCWD, path, SETTINGS_MAX_BYTES + 1, &buf, &len);
        /* A NUL would end the parse early and silently drop the lines after it; a longer file is not ours. */
        if (r >= 0 && (len > SETTINGS_MAX_BYTES || memchr(buf, '\0', len))) {
                free(buf);
                r = -EBADMSG;
        }
        if (r < 0) {
                (void) snprintf(s->error, sizeof s->error, "cannot read %s, using built-in defaults: %s", path,
                                strerror(-r));
                return r;
        }

        for (line = strtok_r(buf, "\n", &saveptr); line; line = strtok_r(NULL, "\n", &saveptr)) {
                char *eq;

                lineno++;
                line += strspn(line, " \t");
                if (*line == '#' || *line == '\0')
                        continue;
                eq = strchr(line, '=');
                if (!eq) {
                        r = -EINVAL;
                        break;
                }
                *eq = '\0';
                r = settings_apply(&parsed, line, eq + 1);
                if (r < 0)
                        break;
        }
        free(buf);
        if (r >= 0)
                r = settings_validate(&parsed);
        if (r < 0) {
                (void) snprintf(s->error, sizeof s->error, "%s:%u: invalid setting, using built-in defaults: %s",
                                path, lineno, strerror(-r));
                return r;
        }

        *s = parsed;
        (void) snprintf(s->source, sizeof s->source, "%s", path);
        s->from_file = true;
        return 0;
}
