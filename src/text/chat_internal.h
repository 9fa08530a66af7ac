/* Shared by the chat renderers (chat_k2.c, chat_k3.c): the prompt being built and the request readers. */
#ifndef K3C_TEXT_CHAT_INTERNAL_H
#define K3C_TEXT_CHAT_INTERNAL_H

#include "text/chat.h"
#include "text/strbuf.h"

typedef struct chat_out {
    k3c_strbuf text;
    k3c_chat_segment *segs;
    size_t n_segs, cap;
    int failed; /* an allocation failed */
} chat_out;

/* Appends a segment (an empty one is dropped, as encoding_k3.py drops them). */
void chat_emit(chat_out *o, k3c_chat_seg_kind kind, const char *s, size_t n);
static inline void chat_text(chat_out *o, const char *s) { chat_emit(o, K3C_CHAT_SEG_TEXT, s, __builtin_strlen(s)); }

/* The message's string field, or NULL when it is absent or null; K3C_ERR naming messages[i].key when it is
 * present with another type. */
int chat_get_string(const cJSON *msg, size_t i, const char *key, const char **out);
/* 1 when a JSON value is "truthy" as Jinja / Python see it (non-empty string, list or object, non-zero
 * number, true). */
int chat_truthy(const cJSON *v);
/* Checks that content is a string, null/absent, or a list of text parts (objects whose "text" is a string or
 * absent). Image parts are refused: k3c has no vision input, and a placeholder without its image would be
 * rendered wrong. */
int chat_check_content(const cJSON *content, size_t i, const char *field);
/* Checks that `messages` is an array of objects with string roles. */
int chat_check_messages(const cJSON *messages);

int chat_render_k2(k3c_chat_format format, const k3c_chat_request *req, chat_out *o);
int chat_render_k3(const k3c_chat_request *req, chat_out *o);

#endif
