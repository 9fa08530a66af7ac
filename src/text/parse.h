/* Streaming parser of a Kimi model's output: reasoning separated from content, and tool calls, token by token,
 * so a server can stream content, reasoning and tool-call argument deltas as the tokens arrive.
 * docs/TEXT.md describes both dialects and the rules for malformed output.
 *
 * Structure is recognised by token id, never by text: a marker counts only when the model produced the special
 * token, so content that merely spells "<|tool_call_begin|>" (bytes) stays content. Everything else is handled
 * as the decoded text piece the caller passes with each token (any split: the parser is byte-oriented and never
 * cares where one piece ends).
 *
 *   K2 family: [<think> reasoning </think>] content
 *              [<|tool_calls_section_begin|> (<|tool_call_begin|> functions.NAME:IDX <|tool_call_argument_begin|>
 *               {JSON arguments} <|tool_call_end|>)* <|tool_calls_section_end|>]
 *   K3:        reasoning <|close|>think<|sep|> <|open|>response<|sep|> content <|close|>response<|sep|>
 *              [<|open|>tools<|sep|> (<|open|>call tool="NAME" index="I"<|sep|>
 *               (<|open|>argument key="K" type="T"<|sep|> V <|close|>argument<|sep|>)*
 *               <|close|>call<|sep|>)* <|close|>tools<|sep|>] <|close|>message<|sep|> <|end_of_msg|>
 *              (the generation prompt already opened the think channel, or the response one without thinking)
 *
 * Malformed output never fails the parse: a call that cannot be completed (a bad id, a name without the
 * functions. prefix, arguments that are not a JSON object, a marker out of place, the output ending inside it)
 * is voided and its raw text, markers included, becomes content; stray markers outside their place are content
 * too. Only allocation failure returns K3C_ERR. */
#ifndef K3C_TEXT_PARSE_H
#define K3C_TEXT_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "text/chat.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum k3c_parse_dialect {
    K3C_PARSE_K2 = 1, /* the K2 family and Kimi Linear */
    K3C_PARSE_K3 = 2,
} k3c_parse_dialect;

/* The dialect of a chat format's output. */
k3c_parse_dialect k3c_parse_dialect_of(k3c_chat_format f);

/* The special token ids the parser recognises; -1 where the tokenizer has no such token (that marker then
 * never matches). */
typedef struct k3c_parse_specials {
    int32_t think_open, think_close;           /* <think> </think> (K2-Thinking and later) */
    int32_t section_begin, section_end;        /* <|tool_calls_section_begin|> <|tool_calls_section_end|> */
    int32_t call_begin, argument_begin, call_end; /* <|tool_call_begin|> <|tool_call_argument_begin|> <|tool_call_end|> */
    int32_t open, close, sep, end_of_msg;      /* K3's <|open|> <|close|> <|sep|> <|end_of_msg|> */
    int32_t stop[4];                           /* tokens that end the message (e.g. <|im_end|>, [EOS]): the
                                                  parse finishes there */
    int n_stop;
} k3c_parse_specials;

/* Fills the table by name through the caller's lookup (the tokenizer's special-id-by-name; it returns -1 for
 * a name it does not have): the markers above and the dialect's stop tokens (<|im_end|> for K2,
 * <|end_of_msg|> for K3, and [EOS] for both). */
void k3c_parse_specials_lookup(k3c_parse_specials *s, k3c_parse_dialect d,
                               int32_t (*special_id)(void *user, const char *name), void *user);

typedef struct k3c_parser_opts {
    k3c_parse_dialect dialect;
    /* K2: recognise <think> ... </think> (the thinking templates); 0 keeps those tokens as content text.
     * K3: the channels are always parsed. */
    int reasoning;
    /* The prompt ended inside the reasoning channel: K3 with thinking (its generation prompt opens think;
     * 0 for no_thinking, where it opens response); for K2 a prompt prefilled with <think>. */
    int start_in_reasoning;
} k3c_parser_opts;

/* The options matching a prompt rendered in format f: reasoning parsed for the K2 thinking templates, and for
 * K3 the channel its generation prompt opened (think, or response when rendered with no_thinking). */
k3c_parser_opts k3c_parser_opts_of(k3c_chat_format f, int no_thinking);

typedef enum k3c_parse_event_kind {
    K3C_PARSE_CONTENT = 1,  /* text: a content delta */
    K3C_PARSE_REASONING,    /* text: a reasoning delta */
    K3C_PARSE_TOOL_START,   /* index, id, name: a tool call begins */
    K3C_PARSE_TOOL_ARGS,    /* index, text: the next bytes of the call's arguments (JSON object text) */
    K3C_PARSE_TOOL_END,     /* index: the call is complete; its arguments parse as a JSON object */
    K3C_PARSE_TOOL_VOID,    /* index: the started call turned out malformed: drop it; its raw text follows
                               as CONTENT */
} k3c_parse_event_kind;

typedef struct k3c_parse_event {
    k3c_parse_event_kind kind;
    int index;        /* the tool call's index (0-based, never reused within one output); -1 for text */
    const char *text; /* CONTENT / REASONING / TOOL_ARGS: len bytes (not NUL-terminated) */
    size_t len;
    const char *id;   /* TOOL_START: "functions.NAME:IDX" as the model wrote it (K2) or made up the same way
                         from the call's position (K3, whose model writes no id) */
    const char *name; /* TOOL_START */
} k3c_parse_event;

typedef struct k3c_parse_tool_call {
    int index;
    const char *id, *name, *arguments;
} k3c_parse_tool_call;

/* Everything parsed so far: the fold of all events (voided calls removed). */
typedef struct k3c_parse_result {
    const char *content, *reasoning; /* NUL-terminated */
    size_t content_len, reasoning_len;
    const k3c_parse_tool_call *calls; /* complete calls and, before finish, the one being parsed */
    size_t n_calls;
    int finished;
} k3c_parse_result;

typedef struct k3c_parser k3c_parser;

int k3c_parser_create(const k3c_parser_opts *opts, const k3c_parse_specials *specials, k3c_parser **out);
void k3c_parser_free(k3c_parser *p);

/* Feeds one generated token: its id and its decoded text piece. *events / *n_events (optional) receive the
 * events it produced, valid until the next call on p. After a stop token or finish, further tokens are
 * ignored. */
int k3c_parser_feed(k3c_parser *p, int32_t id, const char *piece, size_t len, const k3c_parse_event **events,
                    size_t *n_events);
/* The output ended (a stop token, the length limit, a stop string): settles what is open. Idempotent. */
int k3c_parser_finish(k3c_parser *p, const k3c_parse_event **events, size_t *n_events);
/* The result so far; pointers valid until the next call on p. */
int k3c_parser_result(k3c_parser *p, k3c_parse_result *out);

#ifdef __cplusplus
}
#endif

#endif
