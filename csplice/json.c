/* SPDX-License-Identifier: MIT */
#include <string.h>

#include "json.h"

static void json_key(Json *j, const char *key) {
        if (j->need_comma)
                (void) fputc(',', j->f);
        j->need_comma = true;
        if (key)
                (void) fprintf(j->f, "\"%s\":", key);
}

void json_begin(Json *j, const char *key) {
        json_key(j, key);
        (void) fputc('{', j->f);
        j->need_comma = false;
}

void json_end(Json *j) {
        (void) fputc('}', j->f);
        j->need_comma = true;
}

void json_begin_array(Json *j, const char *key) {
        json_key(j, key);
        (void) fputc('[', j->f);
        j->need_comma = false;
}

void json_end_array(Json *j) {
        (void) fputc(']', j->f);
        j->need_comma = true;
}

/* Length of the valid UTF-8 sequence at s, or 0 if the byte there does not start one. */
static size_t utf8_seq_len(const unsigned char *s, size_t left) {
        size_t n;
        uint32_t cp;

        if (s[0] < 0x80)
                return 1;
        if ((s[0] & 0xE0) == 0xC0) {
                n = 2;
                cp = s[0] & 0x1F;
        } else if ((s[0] & 0xF0) == 0xE0) {
                n = 3;
                cp = s[0] & 0x0F;
        } else if ((s[0] & 0xF8) == 0xF0) {
                n = 4;
                cp = s[0] & 0x07;
        } else
                return 0;
        if (n > left)
                return 0;
        for (size_t i = 1; i < n; i++) {
                if ((s[i] & 0xC0) != 0x80)
                        return 0;
                cp = (cp << 6) | (s[i] & 0x3F);
        }
        /* Overlong forms, surrogates and values past Unicode are not valid UTF-8. */
        if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) ||
            (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
                return 0;
        return n;
}

static void json_raw_string(Json *j, const char *s, size_t len) {
        const unsigned char *p = (const unsigned char *) s;

        (void) fputc('"', j->f);
        for (size_t i = 0; i < len;) {
                size_t n = utf8_seq_len(p + i, len - i);

                if (n == 0) {
                        (void) fprintf(j->f, "\\udc%02x", p[i]);
                        i++;
                } else if (n > 1) {
                        (void) fwrite(p + i, 1, n, j->f);
                        i += n;
                } else {
                        unsigned char c = p[i++];
                        if (c == '"' || c == '\\')
                                (void) fprintf(j->f, "\\%c", c);
                        else if (c < 0x20 || c == 0x7F)
                                (void) fprintf(j->f, "\\u%04x", c);
                        else
                                (void) fputc(c, j->f);
                }
        }
        (void) fputc('"', j->f);
}

void json_bytes(Json *j, const char *key, const char *s, size_t len) {
        json_key(j, key);
        json_raw_string(j, s, len);
}

void json_string(Json *j, const char *key, const char *s) {
        if (!s) {
                json_null(j, key);
                return;
        }
        json_bytes(j, key, s, strlen(s));
}

void json_u64(Json *j, const char *key, uint64_t v) {
        json_key(j, key);
        (void) fprintf(j->f, "%llu", (unsigned long long) v);
}

void json_i64(Json *j, const char *key, int64_t v) {
        json_key(j, key);
        (void) fprintf(j->f, "%lld", (long long) v);
}

void json_double(Json *j, const char *key, double v) {
        json_key(j, key);
        (void) fprintf(j->f, "%.6g", v);
}

void json_bool(Json *j, const char *key, bool v) {
        json_key(j, key);
        (void) fputs(v ? "true" : "false", j->f);
}

void json_null(Json *j, const char *key) {
        json_key(j, key);
        (void) fputs("null", j->f);
}

void json_strv(Json *j, const char *key, const char *s, size_t len) {
        json_begin_array(j, key);
        for (size_t i = 0; i < len;) {
                size_t n = strnlen(s + i, len - i);
                json_bytes(j, NULL, s + i, n);
                i += n + 1;
        }
        json_end_array(j);
}
