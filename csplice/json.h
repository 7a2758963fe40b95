/* SPDX-License-Identifier: MIT */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A minimal streaming JSON writer: enough for one spool record, no allocation. */
typedef struct Json {
        FILE *f;
        bool need_comma;
} Json;

void json_begin(Json *j, const char *key);       /* "key": { (or a bare { when key is NULL) */
void json_end(Json *j);                          /* } */
void json_begin_array(Json *j, const char *key); /* "key": [ */
void json_end_array(Json *j);                    /* ] */

/* Strings are bytes from the crashed process: valid UTF-8 is kept, every invalid byte 0xXY becomes the lone
 * surrogate \udcXY, which Python decodes back to the same byte with errors="surrogateescape". */
void json_bytes(Json *j, const char *key, const char *s, size_t len);
void json_string(Json *j, const char *key, const char *s); /* NULL writes null */
void json_u64(Json *j, const char *key, uint64_t v);
void json_i64(Json *j, const char *key, int64_t v);
void json_double(Json *j, const char *key, double v);
void json_bool(Json *j, const char *key, bool v);
void json_null(Json *j, const char *key);

/* A NUL-separated list (cmdline, environ) as an array of strings. */
void json_strv(Json *j, const char *key, const char *s, size_t len);
