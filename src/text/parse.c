/* The output parser's API and event machinery: events of one feed with their strings in one buffer, and the
 * running result, which is the fold of every event (so a streaming client and the final answer agree). */
#include "text/parse.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "text/parse_internal.h"
#include "util/error.h"

k3c_parse_dialect k3c_parse_dialect_of(k3c_chat_format f) { return f == K3C_CHAT_K3 ? K3C_PARSE_K3 : K3C_PARSE_K2; }

k3c_parser_opts k3c_parser_opts_of(k3c_chat_format f, int no_thinking) {
    k3c_parser_opts o = {k3c_parse_dialect_of(f), 0, 0};
    if (f == K3C_CHAT_K3) {
        o.reasoning = 1;
        o.start_in_reasoning = !no_thinking;
    } else {
        o.reasoning = f == K3C_CHAT_K2_THINKING || f == K3C_CHAT_K2_THINKING_MOONSHOT;
    }
    return o;
}

void k3c_parse_specials_lookup(k3c_parse_specials *s, k3c_parse_dialect d,
                               int32_t (*special_id)(void *user, const char *name), void *user) {
    s->think_open = special_id(user, "<think>");
    s->think_close = special_id(user, "</think>");
    s->section_begin = special_id(user, "<|tool_calls_section_begin|>");
    s->section_end = special_id(user, "<|tool_calls_section_end|>");
    s->call_begin = special_id(user, "<|tool_call_begin|>");
    s->argument_begin = special_id(user, "<|tool_call_argument_begin|>");
    s->call_end = special_id(user, "<|tool_call_end|>");
    s->open = special_id(user, "<|open|>");
    s->close = special_id(user, "<|close|>");
    s->sep = special_id(user, "<|sep|>");
    s->end_of_msg = special_id(user, "<|end_of_msg|>");
    s->n_stop = 0;
    const char *stops[] = {d == K3C_PARSE_K3 ? "<|end_of_msg|>" : "<|im_end|>", "[EOS]"};
    for (int i = 0; i < 2; i++) {
        int32_t id = special_id(user, stops[i]);
        if (id >= 0) s->stop[s->n_stop++] = id;
    }
}

int k3c_parser_create(const k3c_parser_opts *opts, const k3c_parse_specials *specials, k3c_parser **out) {
    *out = NULL;
    if (opts->dialect != K3C_PARSE_K2 && opts->dialect != K3C_PARSE_K3)
        return k3c_errorf("output parser: dialect %d is neither K2 nor K3", (int)opts->dialect);
    if (specials->n_stop < 0 || specials->n_stop > 4)
        return k3c_errorf("output parser: n_stop %d, expected 0..4", specials->n_stop);
    k3c_parser *p = calloc(1, sizeof *p);
    if (!p) return k3c_errorf("output parser: out of memory");
    p->opts = *opts;
    p->sp = *specials;
    if (opts->dialect == K3C_PARSE_K3)
        parse_k3_init(p);
    else
        p->reasoning_mode = opts->reasoning && opts->start_in_reasoning;
    *out = p;
    return K3C_OK;
}

static void free_calls(k3c_parser *p) {
    for (size_t i = 0; i < p->n_calls; i++) {
        k3c_strbuf_free(&p->calls[i].id);
        k3c_strbuf_free(&p->calls[i].name);
        k3c_strbuf_free(&p->calls[i].args);
    }
}

void k3c_parser_free(k3c_parser *p) {
    if (!p) return;
    free_calls(p);
    free(p->calls);
    free(p->pub_calls);
    free(p->ev);
    free(p->pub);
    free(p->pseg);
    k3c_strbuf *bufs[] = {&p->evtext, &p->content, &p->reasoning, &p->raw, &p->buf, &p->pending, &p->tag, &p->tag_raw};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) k3c_strbuf_free(bufs[i]);
    free(p);
}

/* ---- events --------------------------------------------------------------------------------------------- */

static ev_rec *push_ev(k3c_parser *p, k3c_parse_event_kind kind, int index) {
    if (p->n_ev == p->cap_ev) {
        size_t cap = p->cap_ev ? 2 * p->cap_ev : 16;
        ev_rec *e = realloc(p->ev, cap * sizeof *e);
        if (!e) {
            p->failed = 1;
            return NULL;
        }
        p->ev = e;
        p->cap_ev = cap;
    }
    ev_rec *e = &p->ev[p->n_ev++];
    *e = (ev_rec){kind, index, p->evtext.len, 0, 0, 0};
    return e;
}

/* Consecutive deltas of one kind (and one call) become one event. */
static void push_delta(k3c_parser *p, k3c_parse_event_kind kind, int index, const char *s, size_t n) {
    ev_rec *last = p->n_ev ? &p->ev[p->n_ev - 1] : NULL;
    if (!(last && last->kind == kind && last->index == index && last->off + last->len == p->evtext.len))
        last = push_ev(p, kind, index);
    if (!last) return;
    k3c_strbuf_put(&p->evtext, s, n);
    last->len += n;
}

void parse_emit_text(k3c_parser *p, k3c_parse_event_kind kind, const char *s, size_t n) {
    if (!n) return;
    push_delta(p, kind, -1, s, n);
    k3c_strbuf_put(kind == K3C_PARSE_REASONING ? &p->reasoning : &p->content, s, n);
    p->emitted_any = 1;
}

static call_acc *current_call(k3c_parser *p) { return p->call_started && p->n_calls ? &p->calls[p->n_calls - 1] : NULL; }

void parse_emit_start(k3c_parser *p, const char *id, const char *name) {
    if (p->n_calls == p->cap_calls) {
        size_t cap = p->cap_calls ? 2 * p->cap_calls : 8;
        call_acc *c = realloc(p->calls, cap * sizeof *c);
        if (!c) {
            p->failed = 1;
            return;
        }
        p->calls = c;
        p->cap_calls = cap;
    }
    call_acc *c = &p->calls[p->n_calls++];
    memset(c, 0, sizeof *c);
    c->index = p->next_index++;
    k3c_strbuf_puts(&c->id, id);
    k3c_strbuf_puts(&c->name, name);
    k3c_strbuf_cstr(&c->args);
    if (c->id.failed || c->name.failed || c->args.failed) p->failed = 1;
    p->call_started = 1;
    p->emitted_any = 1;
    ev_rec *e = push_ev(p, K3C_PARSE_TOOL_START, c->index);
    if (!e) return;
    e->id_off = p->evtext.len;
    k3c_strbuf_put(&p->evtext, id, strlen(id) + 1);
    e->name_off = p->evtext.len;
    k3c_strbuf_put(&p->evtext, name, strlen(name) + 1);
}

void parse_emit_args(k3c_parser *p, const char *s, size_t n) {
    call_acc *c = current_call(p);
    if (!c || !n) return;
    push_delta(p, K3C_PARSE_TOOL_ARGS, c->index, s, n);
    k3c_strbuf_put(&c->args, s, n);
    if (c->args.failed) p->failed = 1;
}

void parse_emit_end(k3c_parser *p) {
    call_acc *c = current_call(p);
    if (c) push_ev(p, K3C_PARSE_TOOL_END, c->index);
    p->section_calls++;
    parse_resolve_pending(p);
    parse_reset_call(p);
}

void parse_void_call(k3c_parser *p) {
    call_acc *c = current_call(p);
    if (c) {
        push_ev(p, K3C_PARSE_TOOL_VOID, c->index);
        k3c_strbuf_free(&c->id);
        k3c_strbuf_free(&c->name);
        k3c_strbuf_free(&c->args);
        p->n_calls--;
    }
    parse_flush_pending(p);
    parse_emit_text(p, K3C_PARSE_CONTENT, p->raw.data, p->raw.len);
    parse_reset_call(p);
}

void parse_reset_call(k3c_parser *p) {
    p->call_started = 0;
    k3c_strbuf_clear(&p->raw);
    k3c_strbuf_clear(&p->buf);
    p->args_lead = p->args_end = p->args_emitted = 0;
    p->args_seen = p->n_args = p->arg_string = p->json_done = 0;
}

int parse_is_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') return 0;
    return 1;
}

static void clear_pending(k3c_parser *p) {
    k3c_strbuf_clear(&p->pending);
    p->n_pseg = 0;
}

void parse_pending_add(k3c_parser *p, const char *s, size_t n, int text) {
    if (!n) return;
    struct pend_seg *last = p->n_pseg ? &p->pseg[p->n_pseg - 1] : NULL;
    if (!(text && last && last->text)) {
        if (p->n_pseg == p->cap_pseg) {
            size_t cap = p->cap_pseg ? 2 * p->cap_pseg : 8;
            struct pend_seg *q = realloc(p->pseg, cap * sizeof *q);
            if (!q) {
                p->failed = 1;
                return;
            }
            p->pseg = q;
            p->cap_pseg = cap;
        }
        last = &p->pseg[p->n_pseg++];
        *last = (struct pend_seg){p->pending.len, 0, text};
    }
    k3c_strbuf_put(&p->pending, s, n);
    last->len += n;
}

void parse_flush_pending(k3c_parser *p) {
    parse_emit_text(p, K3C_PARSE_CONTENT, p->pending.data, p->pending.len);
    clear_pending(p);
}

void parse_resolve_pending(k3c_parser *p) {
    for (size_t i = 0; i < p->n_pseg; i++) {
        const struct pend_seg *g = &p->pseg[i];
        if (g->text && !parse_is_space(p->pending.data + g->off, g->len))
            parse_emit_text(p, K3C_PARSE_CONTENT, p->pending.data + g->off, g->len);
    }
    clear_pending(p);
}

void parse_stream_trimmed_args(k3c_parser *p, size_t from) {
    for (size_t k = from; k < p->buf.len; k++) {
        if (parse_is_space(p->buf.data + k, 1)) continue;
        if (!p->args_seen) {
            p->args_seen = 1;
            p->args_lead = p->args_emitted = k;
        }
        p->args_end = k + 1;
    }
    if (p->args_seen && p->args_end > p->args_emitted) {
        parse_emit_args(p, p->buf.data + p->args_emitted, p->args_end - p->args_emitted);
        p->args_emitted = p->args_end;
    }
}

int parse_trimmed_args_valid(const k3c_parser *p) {
    if (!p->args_seen) return 0;
    const char *s = p->buf.data + p->args_lead, *end = NULL;
    size_t n = p->args_end - p->args_lead;
    cJSON *v = cJSON_ParseWithLengthOpts(s, n, &end, 0);
    int ok = v && cJSON_IsObject(v) && end == s + n;
    cJSON_Delete(v);
    return ok;
}

/* ---- API ------------------------------------------------------------------------------------------------ */

static int publish(k3c_parser *p, const k3c_parse_event **events, size_t *n_events) {
    if (p->failed || p->evtext.failed || p->content.failed || p->reasoning.failed || p->raw.failed ||
        p->buf.failed || p->pending.failed || p->tag.failed || p->tag_raw.failed)
        return k3c_errorf("output parser: out of memory");
    if (p->n_ev > p->cap_pub) {
        k3c_parse_event *e = realloc(p->pub, p->n_ev * sizeof *e);
        if (!e) return k3c_errorf("output parser: out of memory");
        p->pub = e;
        p->cap_pub = p->n_ev;
    }
    for (size_t i = 0; i < p->n_ev; i++) {
        const ev_rec *r = &p->ev[i];
        k3c_parse_event *e = &p->pub[i];
        *e = (k3c_parse_event){r->kind, r->index, NULL, 0, NULL, NULL};
        if (r->kind == K3C_PARSE_CONTENT || r->kind == K3C_PARSE_REASONING || r->kind == K3C_PARSE_TOOL_ARGS) {
            e->text = p->evtext.data + r->off;
            e->len = r->len;
        } else if (r->kind == K3C_PARSE_TOOL_START) {
            e->id = p->evtext.data + r->id_off;
            e->name = p->evtext.data + r->name_off;
        }
    }
    if (events) *events = p->pub;
    if (n_events) *n_events = p->n_ev;
    return K3C_OK;
}

static void begin_feed(k3c_parser *p) {
    p->n_ev = 0;
    k3c_strbuf_clear(&p->evtext);
}

static void finish(k3c_parser *p) {
    if (p->done) return;
    if (p->opts.dialect == K3C_PARSE_K3)
        parse_k3_finish(p);
    else
        parse_k2_finish(p);
    p->done = 1;
}

int k3c_parser_feed(k3c_parser *p, int32_t id, const char *piece, size_t len, const k3c_parse_event **events,
                    size_t *n_events) {
    begin_feed(p);
    if (!piece) len = 0;
    if (!p->done) {
        int stop = 0;
        for (int i = 0; i < p->sp.n_stop; i++) stop |= id >= 0 && id == p->sp.stop[i];
        if (stop)
            finish(p);
        else if (p->opts.dialect == K3C_PARSE_K3)
            parse_k3_feed(p, id, piece ? piece : "", len);
        else
            parse_k2_feed(p, id, piece ? piece : "", len);
    }
    return publish(p, events, n_events);
}

int k3c_parser_finish(k3c_parser *p, const k3c_parse_event **events, size_t *n_events) {
    begin_feed(p);
    finish(p);
    return publish(p, events, n_events);
}

int k3c_parser_result(k3c_parser *p, k3c_parse_result *out) {
    if (p->n_calls > p->cap_pub_calls) {
        k3c_parse_tool_call *c = realloc(p->pub_calls, p->n_calls * sizeof *c);
        if (!c) return k3c_errorf("output parser: out of memory");
        p->pub_calls = c;
        p->cap_pub_calls = p->n_calls;
    }
    for (size_t i = 0; i < p->n_calls; i++)
        p->pub_calls[i] = (k3c_parse_tool_call){p->calls[i].index, k3c_strbuf_cstr(&p->calls[i].id),
                                                k3c_strbuf_cstr(&p->calls[i].name), k3c_strbuf_cstr(&p->calls[i].args)};
    const char *content = k3c_strbuf_cstr(&p->content), *reasoning = k3c_strbuf_cstr(&p->reasoning);
    if (!content || !reasoning) return k3c_errorf("output parser: out of memory");
    for (size_t i = 0; i < p->n_calls; i++)
        if (!p->pub_calls[i].id || !p->pub_calls[i].name || !p->pub_calls[i].arguments)
            return k3c_errorf("output parser: out of memory");
    *out = (k3c_parse_result){content, reasoning, p->content.len, p->reasoning.len, p->pub_calls, p->n_calls, p->done};
    return K3C_OK;
}
