/* The parser's state, shared by the event machinery (parse.c) and the two dialects (parse_k2.c, parse_k3.c). */
#ifndef K3C_TEXT_PARSE_INTERNAL_H
#define K3C_TEXT_PARSE_INTERNAL_H

#include "text/parse.h"
#include "text/strbuf.h"

/* An event of the current feed, its strings as offsets into evtext (which may move while it grows). */
typedef struct ev_rec {
    k3c_parse_event_kind kind;
    int index;
    size_t off, len, id_off, name_off;
} ev_rec;

typedef struct call_acc {
    int index;
    k3c_strbuf id, name, args;
} call_acc;

struct k3c_parser {
    k3c_parser_opts opts;
    k3c_parse_specials sp;
    int state;    /* the dialect's state */
    int done;     /* finished: further tokens are ignored */
    int failed;   /* an allocation failed */
    int reasoning_mode; /* K2 text: 1 while inside <think> */
    int emitted_any;    /* any content, reasoning or call so far (K2: <think> opens only at the very start) */

    ev_rec *ev; /* the current feed's events */
    size_t n_ev, cap_ev;
    k3c_strbuf evtext;
    k3c_parse_event *pub; /* ev as handed out */
    size_t cap_pub;

    k3c_strbuf content, reasoning; /* the result */
    call_acc *calls;
    size_t n_calls, cap_calls;
    k3c_parse_tool_call *pub_calls;
    size_t cap_pub_calls;
    int next_index;

    /* the call being parsed */
    int call_started;  /* TOOL_START emitted */
    k3c_strbuf raw;    /* its raw text, markers included: content if it is voided */
    k3c_strbuf buf;    /* K2: the id, then the arguments text; K3: an argument value or a json block */
    size_t args_lead, args_end, args_emitted; /* K2 / json block: trimmed span of buf, bytes already emitted */
    int args_seen;     /* a non-space byte of the arguments was seen */
    int n_args;        /* K3: arguments emitted so far */
    int arg_string;    /* K3: the open argument has type="string" */
    int json_done;     /* K3: the call's json block is complete (only <|close|>call<|sep|> may follow) */

    /* the tool section (and K3's gaps between channels) */
    int section_calls;  /* calls completed in this section */
    k3c_strbuf pending; /* raw text since the last call settled: its markers, and the text runs between them */
    struct pend_seg {
        size_t off, len;
        int text; /* a run of text tokens (between two markers), else a marker's raw text */
    } *pseg;
    size_t n_pseg, cap_pseg;

    /* K3: a tag being read between <|open|>/<|close|> and <|sep|> */
    int in_tag, tag_is_close;
    k3c_strbuf tag, tag_raw;
};

void parse_emit_text(k3c_parser *p, k3c_parse_event_kind kind, const char *s, size_t n);
void parse_emit_start(k3c_parser *p, const char *id, const char *name);
void parse_emit_args(k3c_parser *p, const char *s, size_t n);
void parse_emit_end(k3c_parser *p);
/* Voids the call being parsed (TOOL_VOID if it had started) and emits pending + its raw text as content. */
void parse_void_call(k3c_parser *p);
/* Raw text inside a tool section that is not part of a call waits in `pending` until the section's fate is
 * known, so the outcome never depends on how the text was split into tokens: once a call completes (or the
 * section ends with calls), each text run holding more than spaces is content and the rest (markers, spaces)
 * is structure (parse_resolve_pending); when a call is voided or the section ends without one, all of it is
 * content, markers included (parse_flush_pending). */
void parse_pending_add(k3c_parser *p, const char *s, size_t n, int text);
void parse_resolve_pending(k3c_parser *p);
void parse_flush_pending(k3c_parser *p);
/* Streams buf's arguments trimmed of surrounding spaces (K2 and K3's json block): call after appending. */
void parse_stream_trimmed_args(k3c_parser *p, size_t appended_from);
/* 1 when buf's trimmed span parses as a JSON object. */
int parse_trimmed_args_valid(const k3c_parser *p);
void parse_reset_call(k3c_parser *p);
int parse_is_space(const char *s, size_t n);

void parse_k2_feed(k3c_parser *p, int32_t id, const char *s, size_t n);
void parse_k2_finish(k3c_parser *p);
void parse_k3_feed(k3c_parser *p, int32_t id, const char *s, size_t n);
void parse_k3_finish(k3c_parser *p);
void parse_k3_init(k3c_parser *p);

#endif
