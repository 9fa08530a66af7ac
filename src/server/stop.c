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

int srv_stop_push(srv_stop *s, const char *text, size_t len, srv_buf *out) {
    if (s->matched) return 1;
    if (!s->n) {
        srv_buf_put(out, text, len);
        return 0;
    }
    srv_buf_put(&s->held, text, len);
    if (s->held.failed) {
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
        srv_buf_put(out, h, at + (s->include ? strlen(s->stops[which]) : 0));
        s->matched = 1;
        s->which = which;
        srv_buf_free(&s->held);
        return 1;
    }
    size_t safe = safe_prefix(s);
    srv_buf_put(out, h, safe);
    srv_buf_consume(&s->held, safe);
    return 0;
}

void srv_stop_flush(srv_stop *s, srv_buf *out) {
    if (!s->matched && s->held.len) srv_buf_put(out, s->held.data, s->held.len);
    srv_buf_free(&s->held);
}

void srv_stop_free(srv_stop *s) { srv_buf_free(&s->held); }
