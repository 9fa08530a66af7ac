/* K3's output, XTML: tags built from the special tokens <|open|> / <|close|> ... <|sep|> around plain text
 * (the tag name and attributes, e.g. `call tool="f" index="1"`), channels think / response, a tools section.
 * The K3 model writes no call ids; each call gets functions.NAME:IDX from its position, as K2's model writes.
 *
 * Arguments are streamed as the JSON object vLLM's kimi_k3 parser builds from them: {"KEY": VALUE, ...} with
 * json.dumps' separators; a type="string" value is the raw text as a JSON string (escaped as it arrives), any
 * other type is its text parsed as JSON and written back as Python does (the raw text as a string when it does
 * not parse). A `json` block is taken as the arguments text itself. Leniency as in llama.cpp's kimi-k3 parser:
 * reasoning also ends at the response or tools opener, content at the tools opener or the message close. */
#include <stdlib.h>
#include <string.h>

#include "text/parse_internal.h"
#include "text/pyjson.h"

enum { K3_THINK, K3_AFTER, K3_RESPONSE, K3_TOOLS, K3_CALL, K3_ARG, K3_JSON, K3_SKIP, K3_END };

#define MAX_TAG 1024
#define MAX_ATTRS 4

typedef struct tag_attr {
    char key[64];
    char *value; /* unescaped, malloc'd */
} tag_attr;

typedef struct parsed_tag {
    int close;
    char name[32];
    tag_attr attrs[MAX_ATTRS];
    int n_attrs;
} parsed_tag;

static void tag_free(parsed_tag *t) {
    for (int i = 0; i < t->n_attrs; i++) free(t->attrs[i].value);
    t->n_attrs = 0;
}

static const char *attr_of(const parsed_tag *t, const char *key) {
    for (int i = 0; i < t->n_attrs; i++)
        if (!strcmp(t->attrs[i].key, key)) return t->attrs[i].value;
    return NULL;
}

/* name (key="value")* with spaces around; 0 when the text is not of that shape. */
static int parse_tag(const char *s, size_t n, int close, parsed_tag *t) {
    memset(t, 0, sizeof *t);
    t->close = close;
    size_t i = 0;
    while (i < n && parse_is_space(s + i, 1)) i++;
    size_t a = i;
    while (i < n && !parse_is_space(s + i, 1)) i++;
    if (i == a || i - a >= sizeof t->name) return 0;
    memcpy(t->name, s + a, i - a);
    for (;;) {
        while (i < n && parse_is_space(s + i, 1)) i++;
        if (i == n) return 1;
        if (close || t->n_attrs == MAX_ATTRS) break;
        size_t k = i;
        while (i < n && (s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
                         (s[i] >= '0' && s[i] <= '9')))
            i++;
        if (i == k || i - k >= sizeof t->attrs[0].key || i + 1 >= n || s[i] != '=' || s[i + 1] != '"') break;
        tag_attr *at = &t->attrs[t->n_attrs];
        memcpy(at->key, s + k, i - k);
        at->key[i - k] = '\0';
        i += 2;
        size_t v = i;
        while (i < n && s[i] != '"') i++;
        if (i == n) break;
        /* vLLM unescapes &quot; then &amp;, the inverse of the renderer's escape */
        char *val = malloc(i - v + 1), *o = val;
        if (!val) break;
        for (size_t j = v; j < i;) {
            if (i - j >= 6 && !memcmp(s + j, "&quot;", 6)) {
                *o++ = '"';
                j += 6;
            } else if (i - j >= 5 && !memcmp(s + j, "&amp;", 5)) {
                *o++ = '&';
                j += 5;
            } else {
                *o++ = s[j++];
            }
        }
        *o = '\0';
        at->value = val;
        t->n_attrs++;
        i++;
    }
    tag_free(t);
    return 0;
}

static int tag_is(const parsed_tag *t, int close, const char *name, int n_attrs) {
    return t->close == close && !strcmp(t->name, name) && t->n_attrs == n_attrs;
}

void parse_k3_init(k3c_parser *p) { p->state = p->opts.start_in_reasoning ? K3_THINK : K3_RESPONSE; }

/* Text (or an unrecognised tag's raw text) where the state has no structure for it. */
static void literal(k3c_parser *p, const char *s, size_t n);

static void void_to_skip(k3c_parser *p, const char *s, size_t n) {
    k3c_strbuf_put(&p->raw, s, n);
    parse_void_call(p);
    p->state = K3_SKIP;
}

/* A JSON string of n bytes, as json.dumps writes it; `quotes` 0 writes only the escaped body (a string value
 * arriving in pieces). */
static void put_json_string(k3c_parser *p, const char *s, size_t n, int quotes) {
    k3c_strbuf b = {0};
    if (quotes) k3c_strbuf_putc(&b, '"');
    k3c_pyjson_escape(&b, s, n);
    if (quotes) k3c_strbuf_putc(&b, '"');
    if (b.failed) p->failed = 1;
    parse_emit_args(p, b.data, b.len);
    k3c_strbuf_free(&b);
}

static void start_tools(k3c_parser *p, const char *raw, size_t n) {
    p->section_calls = 0;
    parse_pending_add(p, raw, n, 0);
    p->state = K3_TOOLS;
}

static void end_tools(k3c_parser *p, const char *raw, size_t n, int next_state) {
    if (p->section_calls == 0) {
        parse_flush_pending(p);
        parse_emit_text(p, K3C_PARSE_CONTENT, raw, n);
    } else {
        parse_resolve_pending(p);
    }
    p->state = next_state;
}

static void start_call(k3c_parser *p, const parsed_tag *t, const char *raw, size_t n) {
    parse_reset_call(p);
    k3c_strbuf_put(&p->raw, raw, n);
    const char *name = attr_of(t, "tool");
    if (!name || !name[0] || t->n_attrs > 2 || (t->n_attrs == 2 && !attr_of(t, "index"))) {
        parse_void_call(p);
        p->state = K3_SKIP;
        return;
    }
    k3c_strbuf id = {0};
    k3c_strbuf_printf(&id, "functions.%s:%d", name, p->next_index);
    if (id.failed)
        p->failed = 1;
    else
        parse_emit_start(p, id.data, name);
    k3c_strbuf_free(&id);
    p->state = K3_CALL;
}

static void end_arg(k3c_parser *p) {
    if (p->arg_string) {
        parse_emit_args(p, "\"", 1);
    } else {
        cJSON *v = k3c_pyjson_parse(p->buf.data ? p->buf.data : "", p->buf.len, "argument");
        if (v) {
            k3c_strbuf b = {0};
            k3c_pyjson_dump(&b, v, 0);
            if (b.failed) p->failed = 1;
            parse_emit_args(p, b.data, b.len);
            k3c_strbuf_free(&b);
            cJSON_Delete(v);
        } else {
            put_json_string(p, p->buf.data ? p->buf.data : "", p->buf.len, 1);
        }
    }
    k3c_strbuf_clear(&p->buf);
    p->n_args++;
    p->state = K3_CALL;
}

static void end_call(k3c_parser *p) {
    if (!p->json_done) parse_emit_args(p, p->n_args ? "}" : "{}", p->n_args ? 1 : 2);
    parse_emit_end(p);
    p->state = K3_TOOLS;
}

static void dispatch(k3c_parser *p, const parsed_tag *t, int ok, const char *raw, size_t n) {
    int close_message = ok && tag_is(t, 1, "message", 0);
    switch (p->state) {
    case K3_THINK:
    case K3_AFTER:
    case K3_RESPONSE: {
        int st = p->state, leading = !p->emitted_any;
        int next = -1;
        if (ok && st == K3_THINK && tag_is(t, 1, "think", 0))
            next = K3_AFTER;
        else if (ok && st == K3_RESPONSE && tag_is(t, 1, "response", 0))
            next = K3_AFTER;
        else if (ok && tag_is(t, 0, "response", 0) && (st != K3_RESPONSE || leading))
            next = K3_RESPONSE; /* also ends reasoning whose close is missing; a leading repeat is dropped */
        else if (ok && tag_is(t, 0, "think", 0) && (st == K3_AFTER || leading))
            next = K3_THINK;
        else if (ok && tag_is(t, 0, "tools", 0))
            next = K3_TOOLS;
        else if (close_message)
            next = K3_END;
        if (next < 0) {
            literal(p, raw, n);
            return;
        }
        parse_resolve_pending(p); /* the gap between channels: spaces dropped, text content */
        if (next == K3_TOOLS)
            start_tools(p, raw, n);
        else
            p->state = next;
        break;
    }
    case K3_TOOLS:
    case K3_SKIP:
        if (ok && tag_is(t, 0, "call", t->n_attrs)) {
            start_call(p, t, raw, n);
        } else if (ok && tag_is(t, 1, "tools", 0)) {
            end_tools(p, raw, n, K3_AFTER);
        } else if (close_message) {
            end_tools(p, "", 0, K3_END);
        } else if (p->state == K3_SKIP && ok && tag_is(t, 1, "call", 0)) {
            parse_emit_text(p, K3C_PARSE_CONTENT, raw, n);
            p->state = K3_TOOLS;
        } else {
            literal(p, raw, n);
        }
        break;
    case K3_CALL:
        if (ok && tag_is(t, 1, "call", 0)) {
            k3c_strbuf_put(&p->raw, raw, n);
            end_call(p);
        } else if (ok && !p->json_done && tag_is(t, 0, "argument", t->n_attrs) && attr_of(t, "key") &&
                   t->n_attrs <= 2 && (t->n_attrs == 1 || attr_of(t, "type"))) {
            k3c_strbuf_put(&p->raw, raw, n);
            parse_emit_args(p, p->n_args ? ", " : "{", p->n_args ? 2 : 1);
            put_json_string(p, attr_of(t, "key"), strlen(attr_of(t, "key")), 1);
            parse_emit_args(p, ": ", 2);
            const char *type = attr_of(t, "type");
            p->arg_string = type && !strcmp(type, "string");
            if (p->arg_string) parse_emit_args(p, "\"", 1);
            k3c_strbuf_clear(&p->buf);
            p->state = K3_ARG;
        } else if (ok && !p->json_done && p->n_args == 0 && tag_is(t, 0, "json", t->n_attrs) && t->n_attrs <= 1) {
            k3c_strbuf_put(&p->raw, raw, n);
            k3c_strbuf_clear(&p->buf);
            p->state = K3_JSON;
        } else if (ok && (tag_is(t, 0, "call", t->n_attrs) || tag_is(t, 1, "tools", 0) || close_message)) {
            /* the call's close is missing: void it, then read the tag as the tools section would */
            parse_void_call(p);
            p->state = K3_TOOLS;
            dispatch(p, t, ok, raw, n);
        } else {
            void_to_skip(p, raw, n);
        }
        break;
    case K3_ARG:
        if (ok && tag_is(t, 1, "argument", 0)) {
            k3c_strbuf_put(&p->raw, raw, n);
            end_arg(p);
        } else {
            void_to_skip(p, raw, n);
        }
        break;
    case K3_JSON:
        if (ok && tag_is(t, 1, "json", 0)) {
            k3c_strbuf_put(&p->raw, raw, n);
            if (parse_trimmed_args_valid(p)) {
                p->json_done = 1;
                p->state = K3_CALL;
            } else {
                parse_void_call(p);
                p->state = K3_SKIP;
            }
        } else {
            void_to_skip(p, raw, n);
        }
        break;
    default: /* K3_END */
        literal(p, raw, n);
        break;
    }
}

static void literal(k3c_parser *p, const char *s, size_t n) {
    switch (p->state) {
    case K3_THINK: parse_emit_text(p, K3C_PARSE_REASONING, s, n); break;
    case K3_AFTER:
    case K3_TOOLS: parse_pending_add(p, s, n, 1); break;
    case K3_CALL:
        if (parse_is_space(s, n))
            k3c_strbuf_put(&p->raw, s, n);
        else
            void_to_skip(p, s, n);
        break;
    case K3_ARG:
        k3c_strbuf_put(&p->raw, s, n);
        if (p->arg_string)
            put_json_string(p, s, n, 0);
        else
            k3c_strbuf_put(&p->buf, s, n);
        break;
    case K3_JSON: {
        size_t from = p->buf.len;
        k3c_strbuf_put(&p->raw, s, n);
        k3c_strbuf_put(&p->buf, s, n);
        parse_stream_trimmed_args(p, from);
        break;
    }
    default: parse_emit_text(p, K3C_PARSE_CONTENT, s, n); break; /* RESPONSE, SKIP, END */
    }
}

/* A tag that cannot complete (another marker came, or it is too long) is text where it stands. */
static void drop_tag(k3c_parser *p) {
    p->in_tag = 0;
    literal(p, p->tag_raw.data ? p->tag_raw.data : "", p->tag_raw.len);
    k3c_strbuf_clear(&p->tag_raw);
    k3c_strbuf_clear(&p->tag);
}

void parse_k3_feed(k3c_parser *p, int32_t id, const char *s, size_t n) {
    const k3c_parse_specials *sp = &p->sp;
    int is_open = sp->open >= 0 && id == sp->open, is_close = sp->close >= 0 && id == sp->close;
    int is_sep = sp->sep >= 0 && id == sp->sep;
    if (sp->end_of_msg >= 0 && id == sp->end_of_msg) {
        parse_k3_finish(p);
        p->done = 1;
        return;
    }
    if (p->in_tag) {
        if (is_sep) {
            k3c_strbuf_put(&p->tag_raw, s, n);
            parsed_tag t;
            int ok = parse_tag(p->tag.data ? p->tag.data : "", p->tag.len, p->tag_is_close, &t);
            size_t raw_len = 0;
            char *raw = k3c_strbuf_take(&p->tag_raw, &raw_len); /* dispatch may start the next tag's state */
            if (!raw) p->failed = 1;
            p->in_tag = 0;
            k3c_strbuf_clear(&p->tag);
            dispatch(p, &t, ok, raw ? raw : "", raw ? raw_len : 0);
            if (ok) tag_free(&t);
            free(raw);
            return;
        }
        if (is_open || is_close) {
            drop_tag(p);
        } else {
            k3c_strbuf_put(&p->tag, s, n);
            k3c_strbuf_put(&p->tag_raw, s, n);
            if (p->tag.len > MAX_TAG) drop_tag(p);
            return;
        }
    }
    if (is_open || is_close) {
        p->in_tag = 1;
        p->tag_is_close = is_close;
        k3c_strbuf_clear(&p->tag);
        k3c_strbuf_clear(&p->tag_raw);
        k3c_strbuf_put(&p->tag_raw, s, n);
        return;
    }
    literal(p, s, n); /* text, a stray <|sep|>, any other token */
}

void parse_k3_finish(k3c_parser *p) {
    if (p->in_tag) drop_tag(p);
    switch (p->state) {
    case K3_CALL:
    case K3_ARG:
    case K3_JSON: parse_void_call(p); break;
    case K3_TOOLS:
        if (p->section_calls == 0) {
            parse_flush_pending(p);
            break;
        }
        /* fall through */
    default: parse_resolve_pending(p); break;
    }
    p->state = K3_END;
}
