/* The K2 family's output: <think> reasoning, then content, then a tool-calls section whose markers are special
 * tokens and whose ids and arguments are text.
 *
 * Leniency, where the model is known to drift (llama.cpp's kimi-k2 parser tests record each case): a call
 * without the section marker starts a section; a section may open while reasoning (the reasoning ends there);
 * a missing <|tool_call_end|> is implied by the next call, the section end or the end of output, when the
 * arguments are already a complete JSON object. Everything else out of place is content. */
#include <string.h>

#include "text/parse_internal.h"

enum { K2_TEXT, K2_SECTION, K2_ID, K2_ARGS, K2_SKIP };

static int is(int32_t id, int32_t marker) { return marker >= 0 && id == marker; }

static void text(k3c_parser *p, const char *s, size_t n) {
    parse_emit_text(p, p->reasoning_mode ? K3C_PARSE_REASONING : K3C_PARSE_CONTENT, s, n);
}

static void start_call(k3c_parser *p, const char *s, size_t n) {
    parse_reset_call(p);
    k3c_strbuf_put(&p->raw, s, n);
    p->state = K2_ID;
}

static void end_section(k3c_parser *p, const char *s, size_t n) {
    if (p->section_calls == 0) {
        parse_flush_pending(p);
        parse_emit_text(p, K3C_PARSE_CONTENT, s, n);
    } else {
        parse_resolve_pending(p);
    }
    p->state = K2_TEXT;
}

static void open_section(k3c_parser *p, const char *s, size_t n) {
    p->reasoning_mode = 0;
    p->section_calls = 0;
    parse_pending_add(p, s, n, 0);
}

/* "functions.NAME:IDX" with surrounding spaces: NAME non-empty without spaces, IDX digits. */
static int valid_id(const char *s, size_t n, size_t *a, size_t *b, size_t *name_a, size_t *name_b) {
    size_t i = 0, j = n;
    while (i < j && parse_is_space(s + i, 1)) i++;
    while (j > i && parse_is_space(s + j - 1, 1)) j--;
    static const char pre[] = "functions.";
    if (j - i < sizeof pre + 1 || memcmp(s + i, pre, sizeof pre - 1) != 0) return 0;
    size_t colon = j;
    while (colon > i && s[colon - 1] != ':') colon--;
    if (colon == i || colon == j) return 0;
    for (size_t k = colon; k < j; k++)
        if (s[k] < '0' || s[k] > '9') return 0;
    size_t na = i + sizeof pre - 1, nb = colon - 1;
    if (nb <= na) return 0;
    for (size_t k = na; k < nb; k++)
        if (parse_is_space(s + k, 1)) return 0;
    *a = i;
    *b = j;
    *name_a = na;
    *name_b = nb;
    return 1;
}

static void begin_args(k3c_parser *p, const char *s, size_t n) {
    size_t a, b, na, nb;
    if (!valid_id(p->buf.data ? p->buf.data : "", p->buf.len, &a, &b, &na, &nb)) {
        k3c_strbuf_put(&p->raw, s, n);
        parse_void_call(p);
        p->state = K2_SKIP;
        return;
    }
    k3c_strbuf id = {0}, name = {0};
    k3c_strbuf_put(&id, p->buf.data + a, b - a);
    k3c_strbuf_put(&name, p->buf.data + na, nb - na);
    if (id.failed || name.failed)
        p->failed = 1;
    else
        parse_emit_start(p, id.data, name.data);
    k3c_strbuf_free(&id);
    k3c_strbuf_free(&name);
    k3c_strbuf_put(&p->raw, s, n);
    k3c_strbuf_clear(&p->buf);
    p->state = K2_ARGS;
}

/* The call ends here (its end marker, or one implied): complete when its arguments are a JSON object. */
static void settle_call(k3c_parser *p) {
    if (p->state == K2_ARGS && parse_trimmed_args_valid(p))
        parse_emit_end(p);
    else
        parse_void_call(p);
    p->state = K2_SECTION;
}

void parse_k2_feed(k3c_parser *p, int32_t id, const char *s, size_t n) {
    const k3c_parse_specials *sp = &p->sp;
    switch (p->state) {
    case K2_TEXT:
        if (p->opts.reasoning && is(id, sp->think_open) && !p->emitted_any)
            p->reasoning_mode = 1; /* an opener only at the very start; a leading one after a prefill is dropped */
        else if (p->opts.reasoning && is(id, sp->think_close) && p->reasoning_mode)
            p->reasoning_mode = 0;
        else if (is(id, sp->section_begin)) {
            open_section(p, s, n);
            p->state = K2_SECTION;
        } else if (is(id, sp->call_begin)) {
            open_section(p, "", 0);
            start_call(p, s, n);
        } else
            text(p, s, n);
        break;
    case K2_SECTION:
        if (is(id, sp->call_begin))
            start_call(p, s, n);
        else if (is(id, sp->section_end))
            end_section(p, s, n);
        else
            parse_pending_add(p, s, n, 1); /* stray markers included: content if the run is */
        break;
    case K2_ID:
        if (is(id, sp->argument_begin)) {
            begin_args(p, s, n);
        } else if (is(id, sp->call_end)) {
            k3c_strbuf_put(&p->raw, s, n);
            parse_void_call(p);
            p->state = K2_SECTION;
        } else if (is(id, sp->call_begin)) {
            parse_void_call(p);
            start_call(p, s, n);
        } else if (is(id, sp->section_end)) {
            parse_void_call(p);
            end_section(p, s, n);
        } else {
            k3c_strbuf_put(&p->raw, s, n);
            k3c_strbuf_put(&p->buf, s, n);
            if (p->buf.len > 1024) { /* no id is this long: the call is not one */
                parse_void_call(p);
                p->state = K2_SKIP;
            }
        }
        break;
    case K2_ARGS:
        if (is(id, sp->call_end)) {
            k3c_strbuf_put(&p->raw, s, n);
            settle_call(p);
        } else if (is(id, sp->call_begin)) {
            settle_call(p);
            start_call(p, s, n);
        } else if (is(id, sp->section_end)) {
            settle_call(p);
            end_section(p, s, n);
        } else {
            size_t from = p->buf.len;
            k3c_strbuf_put(&p->raw, s, n);
            k3c_strbuf_put(&p->buf, s, n);
            parse_stream_trimmed_args(p, from);
        }
        break;
    case K2_SKIP: /* the rest of a voided call: content up to its end */
        if (is(id, sp->call_end)) {
            parse_emit_text(p, K3C_PARSE_CONTENT, s, n);
            p->state = K2_SECTION;
        } else if (is(id, sp->call_begin)) {
            start_call(p, s, n);
        } else if (is(id, sp->section_end)) {
            end_section(p, s, n);
        } else {
            parse_emit_text(p, K3C_PARSE_CONTENT, s, n);
        }
        break;
    }
}

void parse_k2_finish(k3c_parser *p) {
    switch (p->state) {
    case K2_SECTION:
        if (p->section_calls == 0)
            parse_flush_pending(p);
        else
            parse_resolve_pending(p);
        break;
    case K2_ID:
    case K2_ARGS: settle_call(p); break;
    default: break;
    }
    p->state = K2_TEXT;
}
