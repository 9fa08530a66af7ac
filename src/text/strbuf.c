#include "text/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(k3c_strbuf *b, size_t extra) {
    if (b->failed) return 0;
    if (extra > (size_t)-1 / 2 - b->len) {
        b->failed = 1;
        return 0;
    }
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

void k3c_strbuf_put(k3c_strbuf *b, const char *s, size_t n) {
    if (!reserve(b, n)) return;
    if (n) memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void k3c_strbuf_puts(k3c_strbuf *b, const char *s) { k3c_strbuf_put(b, s, strlen(s)); }

void k3c_strbuf_putc(k3c_strbuf *b, char c) { k3c_strbuf_put(b, &c, 1); }

void k3c_strbuf_printf(k3c_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

const char *k3c_strbuf_cstr(k3c_strbuf *b) {
    if (!reserve(b, 0)) return NULL;
    b->data[b->len] = '\0';
    return b->data;
}

void k3c_strbuf_clear(k3c_strbuf *b) {
    b->len = 0;
    if (b->data) b->data[0] = '\0';
}

void k3c_strbuf_free(k3c_strbuf *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

char *k3c_strbuf_take(k3c_strbuf *b, size_t *len) {
    if (!reserve(b, 0)) {
        k3c_strbuf_free(b);
        return NULL;
    }
    char *p = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof *b);
    return p;
}
