/* The server's text side: the tokenizer, the chat prompt of a request, and the streaming output parser
 * (reasoning, content and tool-call argument deltas, by token) of one choice. */
#ifndef K3C_SERVER_TEXT_H
#define K3C_SERVER_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "k3c.h"
#include "server/openai.h"

typedef struct srv_text srv_text;

/* model_dir: the checkpoint's tokenizer and chat template; NULL: the tokenizer of `preset` and the family's
 * default format. K3C_ERR with k3c_last_error when the model has no tokenizer or an unknown template. */
int srv_text_create(const char *model_dir, const char *preset, const char *family, srv_text **out);
void srv_text_free(srv_text *t);
const k3c_tokenizer *srv_text_tokenizer(const srv_text *t);
const char *srv_text_format_name(const srv_text *t);
/* Token ids that end an assistant message in this chat format (the parser's stop tokens), [n]. */
const int32_t *srv_text_end_ids(const srv_text *t, int *n);

/* The prompt ids of a chat request (messages, tools, tool_choice, thinking switches); a message the
 * format cannot express is a 400 naming it. */
int srv_text_chat_encode(const srv_text *t, const srv_params *p, k3c_tokens *out, srv_error *e);
/* The same for /tokenize's messages form. */
int srv_text_chat_encode_messages(const srv_text *t, const void *messages, const void *tools, int add_generation_prompt,
                                  k3c_tokens *out, srv_error *e);

typedef enum srv_tevent_kind {
    SRV_TEV_CONTENT = 1, SRV_TEV_REASONING, SRV_TEV_TOOL_START, SRV_TEV_TOOL_ARGS, SRV_TEV_TOOL_END, SRV_TEV_TOOL_VOID
} srv_tevent_kind;
typedef struct srv_tevent {
    srv_tevent_kind kind;
    int index;             /* tool call index */
    const char *text;      /* CONTENT / REASONING / TOOL_ARGS */
    size_t len;
    const char *id, *name; /* TOOL_START */
} srv_tevent;

typedef struct srv_tool_call {
    const char *id, *name, *arguments;
} srv_tool_call;

typedef struct srv_tparser srv_tparser;
/* A parser for a chat choice of request p (whether its prompt opened the reasoning channel). */
int srv_tparser_create(const srv_text *t, const srv_params *p, srv_tparser **out);
void srv_tparser_free(srv_tparser *p);
/* One token: its id and its text (id < 0: text only, no marker). Events valid until the next call. */
int srv_tparser_feed(srv_tparser *p, int32_t id, const char *text, size_t len, const srv_tevent **ev, size_t *n);
int srv_tparser_finish(srv_tparser *p, const srv_tevent **ev, size_t *n);
/* The folded result: content, reasoning, complete tool calls (valid until the next call). */
int srv_tparser_result(srv_tparser *p, const char **content, const char **reasoning, const srv_tool_call **calls,
                       size_t *n_calls);

#endif
