#include "server/stop.h"

#include <string.h>

void srv_stop_init(srv_stop *s, const char *const *stops, int n, int include) {
    *s = (srv_stop){.stops = stops, .n = n, .include = include, .which = -1};
}

/* Where the held text's longest suffix that is a proper prefix of some stop string begins (held->len when
 * there is none): everything before it can no longer be part of a match. */
static size_t safe_prefix(const srv_stop *s) {
    const char *h = s->held.data;
    size_t len = s->held.len, best = len;
    for (int i = 0; i < s->n; i++) {
        size_t sl = strlen(s->stops[i]);
        size_t max = sl - 1 < len ? sl - 1 : len;
        for (size_t k = max; k > 0; k--)
            if (len - k < best && !memcmp(h + len - k, s->stops[i], k)) {
                best = len - k;
                break;
            }
    }
    return best;
}

/* Releases the first n held bytes (and their tags). */
static void release(srv_stop *s, size_t n, srv_buf *out, srv_buf *out_tags) {
    srv_buf_put(out, s->held.data, n);
    if (out_tags) srv_buf_put(out_tags, s->tags.data, n);
    srv_buf_consume(&s->held, n);
    srv_buf_consume(&s->tags, n);
}

int srv_stop_push(srv_stop *s, const char *text, size_t len, srv_buf *out) {
    return srv_stop_push_tagged(s, text, len, 0, out, NULL);
}

int srv_stop_push_tagged(srv_stop *s, const char *text, size_t len, char tag, srv_buf *out, srv_buf *out_tags) {
    if (s->matched) return 1;
    if (!s->n) {
        srv_buf_put(out, text, len);
        for (size_t i = 0; out_tags && i < len; i++) srv_buf_put(out_tags, &tag, 1);
        return 0;
    }
    srv_buf_put(&s->held, text, len);
    for (size_t i = 0; i < len; i++) srv_buf_put(&s->tags, &tag, 1);
    if (s->held.failed || s->tags.failed) {
        out->failed = 1;
        return 0;
    }
    /* the match that completes first: the smallest end, then the earliest start (the longer string). The
     * held text begins after everything released, and a match ending in an earlier push was taken then, so
     * this is the first stop string the text completes, however it was split into pieces. */
    const char *h = s->held.data;
    size_t at = 0, end = (size_t)-1;
    int which = -1;
    for (int i = 0; i < s->n; i++) {
        size_t sl = strlen(s->stops[i]);
        for (size_t p = 0; p + sl <= s->held.len && p + sl <= end; p++)
            if (h[p] == s->stops[i][0] && !memcmp(h + p, s->stops[i], sl)) {
                if (p + sl < end || p < at) at = p, end = p + sl, which = i;
                break;
            }
    }
    if (which >= 0) {
        release(s, at + (s->include ? strlen(s->stops[which]) : 0), out, out_tags);
        s->matched = 1;
        s->which = which;
        srv_buf_free(&s->held);
        srv_buf_free(&s->tags);
        return 1;
    }
    release(s, safe_prefix(s), out, out_tags);
    return 0;
}

void srv_stop_flush(srv_stop *s, srv_buf *out) { srv_stop_flush_tagged(s, out, NULL); }

void srv_stop_flush_tagged(srv_stop *s, srv_buf *out, srv_buf *out_tags) {
    if (!s->matched && s->held.len) release(s, s->held.len, out, out_tags);
    srv_buf_free(&s->held);
    srv_buf_free(&s->tags);
}

void srv_stop_free(srv_stop *s) {
    srv_buf_free(&s->held);
    srv_buf_free(&s->tags);
}
