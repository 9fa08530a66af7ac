/* The server's text side over include/k3c.h: the tokenizer, the chat template, a chat request's prompt ids,
 * the grammar of its constrained output, and the output parser of one chat choice (reasoning, content and
 * tool-call argument deltas, by token). */
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
/* Token ids that end an assistant message in this chat format, [n]. */
const int32_t *srv_text_end_ids(const srv_text *t, int *n);

/* The prompt ids of a chat request body (json, len bytes): messages, tools, tool_choice, thinking switches.
 * A message the format cannot express is a 400 naming it. */
int srv_text_chat_encode(const srv_text *t, const char *json, size_t len, k3c_tokens *out, srv_error *e);

/* The grammar a chat request's tool_choice (required, a named function) or response_format (json_object,
 * json_schema) holds its output to (include/k3c.h, constrained decoding); *out NULL when it asks for none. A
 * request the grammar cannot express (a schema keyword k3c does not enforce, ...) is a 400 naming it. */
int srv_text_grammar(const srv_text *t, const char *json, size_t len, k3c_grammar **out, srv_error *e);

/* The output parser of one chat choice: its events are k3c_chat_event's. */
typedef struct k3c_chat_parser srv_tparser;
int srv_tparser_create(const srv_text *t, const char *json, size_t len, srv_tparser **out);
void srv_tparser_free(srv_tparser *p);

#endif
