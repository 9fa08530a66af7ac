/* A growable byte buffer for the server's response bodies and SSE queues. A failed allocation sets `failed`
 * and later appends are dropped, so callers check once, where the buffer is used, instead of after every
 * append. */
#ifndef K3C_SERVER_BUF_H
#define K3C_SERVER_BUF_H

#include <stddef.h>

typedef struct srv_buf {
    char *data; /* NUL-terminated while not failed */
    size_t len, cap;
    int failed;
} srv_buf;

void srv_buf_put(srv_buf *b, const void *s, size_t n);
void srv_buf_puts(srv_buf *b, const char *s);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes (what a reader has sent). */
void srv_buf_consume(srv_buf *b, size_t n);
/* Hands the bytes to the caller (malloc'd, NUL-terminated; NULL when failed) and empties the buffer. */
char *srv_buf_take(srv_buf *b, size_t *len);
void srv_buf_free(srv_buf *b);

/* s[0 .. n) as a JSON string literal (quotes included): control bytes and NUL escaped (cJSON stops at a
 * NUL and would cut the text there), ill-formed UTF-8 replaced by U+FFFD, so the result is always valid
 * JSON in valid UTF-8 whatever the bytes. */
void srv_buf_json_string(srv_buf *b, const char *s, size_t n);
/* The same as a cJSON item (raw), NULL when out of memory. */
struct cJSON;
struct cJSON *srv_json_text(const char *s, size_t n);

#endif
