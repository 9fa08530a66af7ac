/* Stop strings matched on the decoded output text across token boundaries. Text that may still become the
 * start of a stop string is held back (at most the longest stop string's length - 1 bytes), so what has been
 * released is never part of a match; the match and everything after it are never released (unless the
 * request asked for include_stop_str_in_output: then the stop string itself is, and nothing after it).
 * With several stop strings the one whose end comes first in the text wins (the first to be complete, as
 * a streaming match sees it), at equal ends the one that starts first: the result does not depend on how
 * the text was cut into pieces. */
#ifndef K3C_SERVER_STOP_H
#define K3C_SERVER_STOP_H

#include <stddef.h>

#include "server/buf.h"

typedef struct srv_stop {
    const char *const *stops; /* [n] non-empty UTF-8 strings (not owned; they outlive the matcher) */
    int n;
    int include;              /* release the matched stop string too */
    srv_buf held;
    srv_buf tags;             /* one byte per held byte: the tag it was pushed with */
    int matched;              /* once set, push releases nothing more */
    int which;                /* the stop string that matched */
} srv_stop;

void srv_stop_init(srv_stop *s, const char *const *stops, int n, int include);
/* Appends text; appends what is now safe to emit to out. Returns 1 when a stop string has matched (now or
 * before), 0 otherwise. */
int srv_stop_push(srv_stop *s, const char *text, size_t len, srv_buf *out);
/* The same with a tag for each byte (a chat's content or reasoning: the text of both is matched as one
 * stream); out_tags receives the tag of every released byte. */
int srv_stop_push_tagged(srv_stop *s, const char *text, size_t len, char tag, srv_buf *out, srv_buf *out_tags);
/* The output ended without a match (or a tool call comes between texts): releases what was held back. */
void srv_stop_flush(srv_stop *s, srv_buf *out);
void srv_stop_flush_tagged(srv_stop *s, srv_buf *out, srv_buf *out_tags);
void srv_stop_free(srv_stop *s);

#endif
