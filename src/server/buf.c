#include "server/buf.h"

#include <cjson/cJSON.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(srv_buf *b, size_t extra) {
    if (b->failed) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > ((size_t)-1) / 2) {
            b->failed = 1;
            return 0;
        }
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return 0;
    }
    b->data = d;
    b->cap = cap;
    return 1;
}

void srv_buf_put(srv_buf *b, const void *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void srv_buf_puts(srv_buf *b, const char *s) { srv_buf_put(b, s, strlen(s)); }

void srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        srv_buf_put(b, small, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void srv_buf_consume(srv_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data) b->data[b->len] = 0;
}

char *srv_buf_take(srv_buf *b, size_t *len) {
    char *d = NULL;
    if (!b->failed) {
        if (!b->data) srv_buf_put(b, "", 0);
        d = b->data;
        if (len) *len = b->len;
        b->data = NULL;
    } else {
        free(b->data);
        b->data = NULL;
    }
    b->len = b->cap = 0;
    b->failed = 0;
    return d;
}

void srv_buf_free(srv_buf *b) {
    free(b->data);
    *b = (srv_buf){0};
}

/* Length of the well-formed UTF-8 sequence at s (Unicode 3.9 table D3-7), 0 when it is ill-formed. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;
        if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;
        if (c == 0xf4) hi = 0x8f;
    } else {
        return 0;
    }
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return len;
}

void srv_buf_json_string(srv_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    srv_buf_put(b, "\"", 1);
    size_t run = 0; /* bytes copied as they are, flushed in one put */
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        const char *esc = NULL;
        char tmp[8];
        size_t l = 1;
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\u%04x", c);
            esc = tmp;
        } else if (c >= 0x80 && !(l = utf8_len(u + i, n - i))) {
            esc = "\xef\xbf\xbd";
            l = 1;
        }
        if (esc) {
            srv_buf_put(b, s + i - run, run);
            run = 0;
            srv_buf_puts(b, esc);
        } else {
            run += l;
        }
        i += l;
    }
    srv_buf_put(b, s + n - run, run);
    srv_buf_put(b, "\"", 1);
}

cJSON *srv_json_text(const char *s, size_t n) {
    srv_buf b = {0};
    srv_buf_json_string(&b, s, n);
    cJSON *j = b.failed ? NULL : cJSON_CreateRaw(b.data);
    srv_buf_free(&b);
    return j;
}
