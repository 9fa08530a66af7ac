/* A growable byte string for the text layer (chat rendering, output parsing). Appends never fail visibly: an
 * allocation failure sets `failed`, later appends do nothing, and the owner checks once at the end. That keeps
 * the renderers' code a straight line of appends. */
#ifndef K3C_TEXT_STRBUF_H
#define K3C_TEXT_STRBUF_H

#include <stddef.h>

typedef struct k3c_strbuf {
    char *data; /* NUL-terminated whenever len > 0 (or after k3c_strbuf_cstr) */
    size_t len;
    size_t cap;
    int failed; /* an allocation failed: contents are incomplete */
} k3c_strbuf;

void k3c_strbuf_put(k3c_strbuf *b, const char *s, size_t n);
void k3c_strbuf_puts(k3c_strbuf *b, const char *s);
void k3c_strbuf_putc(k3c_strbuf *b, char c);
void k3c_strbuf_printf(k3c_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The contents as a C string ("" for an empty buffer; NULL only when an allocation failed). */
const char *k3c_strbuf_cstr(k3c_strbuf *b);
void k3c_strbuf_clear(k3c_strbuf *b); /* len = 0, memory kept */
void k3c_strbuf_free(k3c_strbuf *b);
/* Hands the data to the caller (malloc'd, NUL-terminated, never NULL unless `failed`) and resets b. */
char *k3c_strbuf_take(k3c_strbuf *b, size_t *len);

#endif
