/* SPDX-License-Identifier: MIT */
#include <errno.h>
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

void settings_defaults(Settings *s) {
        *s = (Settings) {
                .spool_dir = CSPLICE_SPOOL_DIR,
                /* bench/results/capture.md, stock 6.18 kernel: read/write of 256 KiB on a 1 MiB pipe held crashed
                 * processes no longer than a plain read/write loop, and up to 30% shorter. The file corehandler
                 * renders picks the strategy per kernel (corehandler/strategy.py). */
                .strategy = STRATEGY_RW,
                .chunk_bytes = 256 * 1024,
                .pipe_bytes = 1024 * 1024,
                .max_dump_bytes = 32ULL << 30,
                /* bench/results/capture.md: from 1 GiB on, O_DIRECT writes held a crash shorter than the page
                 * cache did; at 256 MiB the page cache wins. corehandler renders the same default. */
                .direct_above_bytes = 512ULL << 20,
                .min_free_bytes = 0,
                .min_free_percent = 15,
                .max_pending = 64,
                .max_per_exe_per_minute = 16,
                .timeout_sec = 3600,
                .fsync = false,
                .sparse = true,
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

static int settings_apply(Settings *s, const char *key, const char *value) {
        static const struct {
                const char *key;
                size_t offset;
        } u64s[] = {
                { "chunk_bytes", offsetof(Settings, chunk_bytes) },
                { "pipe_bytes", offsetof(Settings, pipe_bytes) },
                { "max_dump_bytes", offsetof(Settings, max_dump_bytes) },
                { "direct_above_bytes", offsetof(Settings, direct_above_bytes) },
                { "min_free_bytes", offsetof(Settings, min_free_bytes) },
                { "min_free_percent", offsetof(Settings, min_free_percent) },
                { "max_pending", offsetof(Settings, max_pending) },
                { "max_per_exe_per_minute", offsetof(Settings, max_per_exe_per_minute) },
                { "timeout_sec", offsetof(Settings, timeout_sec) },
        }, bools[] = {
                { "fsync", offsetof(Settings, fsync) },
                { "sparse", offsetof(Settings, sparse) },
                { "collect_environ", offsetof(Settings, collect_environ) },
                { "collect_maps", offsetof(Settings, collect_maps) },
        };

        for (size_t i = 0; i < ELEMENTSOF(u64s); i++)
                if (strcmp(key, u64s[i].key) == 0)
                        return parse_u64(value, (uint64_t *) ((char *) s + u64s[i].offset));
        for (size_t i = 0; i < ELEMENTSOF(bools); i++)
                if (strcmp(key, bools[i].key) == 0)
                        return parse_bool(value, (bool *) ((char *) s + bools[i].offset));

        if (strcmp(key, "strategy") == 0) {
                int r = strategy_from_string(value);
                if (r < 0)
                        return r;
                s->strategy = (Strategy) r;
                return 0;
        }
        if (strcmp(key, "spool_dir") == 0) {
                /* Relative paths would resolve against whatever cwd the kernel gave us. */
                if (value[0] != '/' || strlen(value) >= sizeof s->spool_dir)
                        return -EINVAL;
                strcpy(s->spool_dir, value);
                return 0;
        }
        /* Unknown keys are ignored so an older csplice runs with a newer control plane's file. */
        return 0;
}

static int settings_validate(Settings *s) {
        if (s->chunk_bytes < 4096 || s->chunk_bytes > (64ULL << 20))
                return -ERANGE;
        if (s->pipe_bytes > (1ULL << 30) || s->min_free_percent > 100)
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
