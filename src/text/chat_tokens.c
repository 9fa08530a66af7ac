/* The public chat API (include/k3c.h, "chat"): chat.h's renderer and parse.h's parser joined to the tokenizer.
 * A request body becomes prompt ids the way its segments say (TEXT: specials off, SPECIAL: one id by name,
 * MIXED: every special allowed), and generated ids become parser events through a streaming detokenizer, so
 * the parser only ever sees whole UTF-8 characters. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "text/chat.h"
#include "text/parse.h"
#include "text/pyjson.h"
#include "text/strbuf.h"
#include "util/error.h"

struct k3c_chat_template {
    k3c_chat_format format;
    char source[4300];
};

static int family_of(const char *name, k3c_family *out) {
    if (name && !strcmp(name, "Kimi K3")) *out = K3C_FAMILY_K3;
    else if (name && !strcmp(name, "Kimi Linear")) *out = K3C_FAMILY_KIMI_LINEAR;
    else return k3c_errorf("chat template: family '%s' is not \"Kimi K3\" or \"Kimi Linear\" (k3c_model_info.family)",
                           name ? name : "(NULL)");
    return K3C_OK;
}

static int template_new(k3c_chat_template **out) {
    *out = calloc(1, sizeof **out);
    return *out ? K3C_OK : k3c_errorf_kind(K3C_ERROR_OOM, "chat template: out of memory");
}

int k3c_chat_template_load(const char *model_dir, const char *family, k3c_chat_template **out) {
    if (!out) return k3c_errorf("chat template: out is NULL");
    *out = NULL;
    k3c_family fam = K3C_FAMILY_K3;
    K3C_TRY(family_of(family, &fam));
    k3c_chat_template *t;
    K3C_TRY(template_new(&t));
    if (model_dir) {
        if (k3c_chat_format_load(model_dir, fam, &t->format, t->source, sizeof t->source) != K3C_OK) {
            free(t);
            return K3C_ERR;
        }
    } else {
        t->format = k3c_chat_format_default(fam);
        snprintf(t->source, sizeof t->source, "default for %s", family);
    }
    *out = t;
    return K3C_OK;
}

int k3c_chat_template_from_name(const char *name, k3c_chat_template **out) {
    if (!out) return k3c_errorf("chat template: out is NULL");
    *out = NULL;
    k3c_chat_format f;
    if (!name) return k3c_errorf("chat template: the name is NULL");
    K3C_TRY(k3c_chat_format_from_name(name, &f));
    K3C_TRY(template_new(out));
    (*out)->format = f;
    snprintf((*out)->source, sizeof (*out)->source, "by name");
    return K3C_OK;
}

void k3c_chat_template_free(k3c_chat_template *t) { free(t); }

const char *k3c_chat_template_name(const k3c_chat_template *t) { return t ? k3c_chat_format_name(t->format) : NULL; }
const char *k3c_chat_template_source(const k3c_chat_template *t) { return t ? t->source : NULL; }

/* ---- the request ----------------------------------------------------------------------------------------- */

/* The parsed body and the renderer's view of it (pointers into root). */
typedef struct chat_req {
    cJSON *root;
    k3c_chat_request r;
} chat_req;

static int request_parse(const char *json, size_t len, chat_req *q) {
    memset(q, 0, sizeof *q);
    if (!json) return k3c_errorf("chat request: the JSON text is NULL");
    /* the pyjson parser keeps number literals: tools and arguments are written back as Python writes them */
    if (!(q->root = k3c_pyjson_parse(json, len, "chat request"))) return K3C_ERR;
    if (!cJSON_IsObject(q->root)) {
        cJSON_Delete(q->root);
        return k3c_errorf("chat request: the body is not a JSON object");
    }
    const cJSON *root = q->root, *v;
    q->r.messages = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(q->r.messages)) {
        cJSON_Delete(q->root);
        return k3c_errorf("chat request: `messages` must be an array");
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "tools");
    q->r.tools = cJSON_IsNull(v) ? NULL : v;
    if (q->r.tools && !cJSON_IsArray(q->r.tools)) {
        cJSON_Delete(q->root);
        return k3c_errorf("chat request: `tools` must be an array");
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "add_generation_prompt");
    q->r.add_generation_prompt = !cJSON_IsFalse(v); /* OpenAI servers default to true */
    v = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    q->r.tool_choice = cJSON_IsNull(v) ? NULL : v;
    v = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    q->r.response_format = cJSON_IsNull(v) ? NULL : v;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (kw && !cJSON_IsNull(kw)) {
        if (!cJSON_IsObject(kw)) {
            cJSON_Delete(q->root);
            return k3c_errorf("chat request: `chat_template_kwargs` must be an object");
        }
        v = cJSON_GetObjectItemCaseSensitive(kw, "thinking");
        if (v && !cJSON_IsBool(v) && !cJSON_IsNull(v)) {
            cJSON_Delete(q->root);
            return k3c_errorf("chat request: chat_template_kwargs.thinking must be true or false");
        }
        q->r.no_thinking = cJSON_IsFalse(v);
        v = cJSON_GetObjectItemCaseSensitive(kw, "thinking_effort");
        if (v && !cJSON_IsNull(v) && !cJSON_IsString(v)) {
            cJSON_Delete(q->root);
            return k3c_errorf("chat request: chat_template_kwargs.thinking_effort must be a string");
        }
        if (cJSON_IsString(v)) q->r.thinking_effort = v->valuestring;
    }
    return K3C_OK;
}

static int tokens_push(k3c_tokens *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return k3c_errorf_kind(K3C_ERROR_OOM, "chat encode: out of memory for %zu ids", cap);
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return K3C_OK;
}

int k3c_chat_encode(const k3c_chat_template *t, const k3c_tokenizer *tok, const char *request_json, size_t len,
                    k3c_tokens *out) {
    if (!t || !tok || !out) return k3c_errorf("chat encode: %s is NULL", !t ? "the template" : !tok ? "the tokenizer" : "out");
    chat_req q;
    K3C_TRY(request_parse(request_json, len, &q));
    k3c_chat_prompt p;
    int rc = k3c_chat_render(t->format, &q.r, &p);
    if (rc != K3C_OK) {
        cJSON_Delete(q.root);
        return k3c_error_context("chat request (%s)", k3c_chat_format_name(t->format));
    }
    size_t n0 = out->n;
    for (size_t i = 0; rc == K3C_OK && i < p.n_segs; i++) {
        const k3c_chat_segment *s = &p.segs[i];
        const char *text = p.text + s->off;
        if (s->kind == K3C_CHAT_SEG_SPECIAL) {
            char name[64];
            if (s->len >= sizeof name) {
                rc = k3c_errorf_kind(K3C_ERROR_INTERNAL, "chat encode: a special segment of %zu bytes", s->len);
                break;
            }
            memcpy(name, text, s->len);
            name[s->len] = 0;
            int32_t id = k3c_tokenizer_special_id(tok, name);
            rc = id >= 0 ? tokens_push(out, id)
                         : k3c_errorf("chat encode: the tokenizer has no special token %s, which the %s format needs",
                                      name, k3c_chat_format_name(t->format));
        } else {
            rc = k3c_tokenizer_encode(tok, text, s->len, s->kind == K3C_CHAT_SEG_MIXED, out);
        }
    }
    if (rc != K3C_OK) out->n = n0; /* nothing half-appended */
    k3c_chat_prompt_free(&p);
    cJSON_Delete(q.root);
    return rc;
}

static int32_t special_of(void *user, const char *name) { return k3c_tokenizer_special_id(user, name); }

/* The parser's markers and stop ids, the tokenizer's eos added where the format's own stops lack it. */
static void specials_of(const k3c_chat_template *t, const k3c_tokenizer *tok, k3c_parse_specials *s) {
    k3c_parse_specials_lookup(s, k3c_parse_dialect_of(t->format), special_of, (void *)tok);
    int32_t eos = k3c_tokenizer_eos(tok);
    int have = eos < 0;
    for (int i = 0; i < s->n_stop; i++) have |= s->stop[i] == eos;
    if (!have && s->n_stop < 4) s->stop[s->n_stop++] = eos;
}

int k3c_chat_stop_ids(const k3c_chat_template *t, const k3c_tokenizer *tok, int32_t *ids, int cap) {
    if (!t || !tok || (cap > 0 && !ids)) return k3c_errorf("chat stop ids: %s is NULL", !t ? "the template" : !tok ? "the tokenizer" : "ids");
    k3c_parse_specials s;
    specials_of(t, tok, &s);
    for (int i = 0; i < s.n_stop && i < cap; i++) ids[i] = s.stop[i];
    return s.n_stop;
}

/* ---- the parser ------------------------------------------------------------------------------------------ */

struct k3c_chat_parser {
    k3c_parser *p;
    k3c_detokenizer *d;
    const k3c_tokenizer *tok;
    k3c_chat_event *ev; /* the events of the current call; text/id/name offsets into `text` until published */
    size_t n_ev, cap_ev;
    k3c_strbuf text;
};

int k3c_chat_parser_create(const k3c_chat_template *t, const k3c_tokenizer *tok, const char *request_json,
                           size_t len, k3c_chat_parser **out) {
    if (!out) return k3c_errorf("chat parser: out is NULL");
    *out = NULL;
    if (!t || !tok) return k3c_errorf("chat parser: %s is NULL", !t ? "the template" : "the tokenizer");
    int no_thinking = 0;
    if (request_json) {
        chat_req q;
        K3C_TRY(request_parse(request_json, len, &q));
        no_thinking = q.r.no_thinking;
        cJSON_Delete(q.root);
    }
    k3c_parser_opts o = k3c_parser_opts_of(t->format, no_thinking);
    k3c_parse_specials s;
    specials_of(t, tok, &s);
    k3c_chat_parser *cp = calloc(1, sizeof *cp);
    if (!cp) return k3c_errorf_kind(K3C_ERROR_OOM, "chat parser: out of memory");
    cp->tok = tok;
    if (k3c_parser_create(&o, &s, &cp->p) != K3C_OK || k3c_detokenizer_create(tok, &cp->d) != K3C_OK) {
        k3c_chat_parser_free(cp);
        return K3C_ERR;
    }
    *out = cp;
    return K3C_OK;
}

void k3c_chat_parser_free(k3c_chat_parser *p) {
    if (!p) return;
    k3c_parser_free(p->p);
    k3c_detokenizer_free(p->d);
    free(p->ev);
    k3c_strbuf_free(&p->text);
    free(p);
}

/* Copies one internal feed's events (valid only until the parser's next call) into cp's list; the strings go
 * to cp->text, recorded as offsets (the buffer may move while it grows). */
static int collect(k3c_chat_parser *cp, const k3c_parse_event *ev, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (cp->n_ev == cp->cap_ev) {
            size_t cap = cp->cap_ev ? 2 * cp->cap_ev : 16;
            k3c_chat_event *e = realloc(cp->ev, cap * sizeof *e);
            if (!e) return k3c_errorf_kind(K3C_ERROR_OOM, "chat parser: out of memory");
            cp->ev = e;
            cp->cap_ev = cap;
        }
        k3c_chat_event *e = &cp->ev[cp->n_ev++];
        *e = (k3c_chat_event){(k3c_chat_event_kind)ev[i].kind, ev[i].index, NULL, ev[i].len, NULL, NULL};
        /* offset + 1 in the pointer fields (0 stays "none") */
        if (ev[i].text) {
            e->text = (const char *)(uintptr_t)(cp->text.len + 1);
            k3c_strbuf_put(&cp->text, ev[i].text, ev[i].len);
        }
        if (ev[i].id) {
            e->id = (const char *)(uintptr_t)(cp->text.len + 1);
            k3c_strbuf_put(&cp->text, ev[i].id, strlen(ev[i].id) + 1);
        }
        if (ev[i].name) {
            e->name = (const char *)(uintptr_t)(cp->text.len + 1);
            k3c_strbuf_put(&cp->text, ev[i].name, strlen(ev[i].name) + 1);
        }
    }
    return cp->text.failed ? k3c_errorf_kind(K3C_ERROR_OOM, "chat parser: out of memory") : K3C_OK;
}

static int publish(k3c_chat_parser *cp, const k3c_chat_event **events, size_t *n_events) {
    const char *base = k3c_strbuf_cstr(&cp->text);
    if (!base) return k3c_errorf_kind(K3C_ERROR_OOM, "chat parser: out of memory");
    for (size_t i = 0; i < cp->n_ev; i++) {
        k3c_chat_event *e = &cp->ev[i];
        if (e->text) e->text = base + ((uintptr_t)e->text - 1);
        if (e->id) e->id = base + ((uintptr_t)e->id - 1);
        if (e->name) e->name = base + ((uintptr_t)e->name - 1);
    }
    if (events) *events = cp->ev;
    if (n_events) *n_events = cp->n_ev;
    return K3C_OK;
}

static void begin(k3c_chat_parser *cp, const k3c_chat_event **events, size_t *n_events) {
    cp->n_ev = 0;
    k3c_strbuf_clear(&cp->text);
    if (events) *events = NULL;
    if (n_events) *n_events = 0;
}

int k3c_chat_parser_feed(k3c_chat_parser *cp, int32_t id, const k3c_chat_event **events, size_t *n_events) {
    if (!cp) return k3c_errorf("chat parser: the parser is NULL");
    begin(cp, events, n_events);
    if (id < 0 || id >= k3c_tokenizer_vocab(cp->tok))
        return k3c_errorf("chat parser: id %d is outside the vocabulary (0 .. %d)", id, k3c_tokenizer_vocab(cp->tok) - 1);
    const k3c_parse_event *ev;
    size_t n;
    const char *s;
    size_t len;
    /* A special token is structure: the bytes held back before it (an unfinished character) go out first, as
     * text of their own (U+FFFD), so that the marker's piece is the marker's text only. */
    if (k3c_tokenizer_is_special(cp->tok, id) && k3c_detokenizer_pending(cp->d)) {
        K3C_TRY(k3c_detokenizer_finish(cp->d, &s, &len));
        K3C_TRY(k3c_parser_feed(cp->p, -1, s, len, &ev, &n));
        K3C_TRY(collect(cp, ev, n));
    }
    K3C_TRY(k3c_detokenizer_push(cp->d, id, &s, &len));
    K3C_TRY(k3c_parser_feed(cp->p, id, s, len, &ev, &n));
    K3C_TRY(collect(cp, ev, n));
    return publish(cp, events, n_events);
}

int k3c_chat_parser_finish(k3c_chat_parser *cp, const k3c_chat_event **events, size_t *n_events) {
    if (!cp) return k3c_errorf("chat parser: the parser is NULL");
    begin(cp, events, n_events);
    const k3c_parse_event *ev;
    size_t n;
    const char *s;
    size_t len;
    k3c_parse_result r;
    K3C_TRY(k3c_parser_result(cp->p, &r));
    if (!r.finished && k3c_detokenizer_pending(cp->d)) {
        K3C_TRY(k3c_detokenizer_finish(cp->d, &s, &len));
        K3C_TRY(k3c_parser_feed(cp->p, -1, s, len, &ev, &n));
        K3C_TRY(collect(cp, ev, n));
    }
    K3C_TRY(k3c_parser_finish(cp->p, &ev, &n));
    K3C_TRY(collect(cp, ev, n));
    return publish(cp, events, n_events);
}

int k3c_chat_parser_done(const k3c_chat_parser *cp) {
    if (!cp) return k3c_errorf("chat parser: the parser is NULL");
    k3c_parse_result r;
    if (k3c_parser_result(cp->p, &r) != K3C_OK) return K3C_ERR;
    return r.finished;
}

int k3c_chat_parser_result_json(k3c_chat_parser *cp, char **json) {
    if (!cp || !json) return k3c_errorf("chat parser result: %s is NULL", !cp ? "the parser" : "json");
    *json = NULL;
    k3c_parse_result r;
    K3C_TRY(k3c_parser_result(cp->p, &r));
    cJSON *m = cJSON_CreateObject();
    int ok = m && cJSON_AddStringToObject(m, "role", "assistant");
    if (ok) ok = r.content_len || !r.n_calls ? cJSON_AddStringToObject(m, "content", r.content) != NULL
                                             : cJSON_AddNullToObject(m, "content") != NULL;
    if (ok && r.reasoning_len) ok = cJSON_AddStringToObject(m, "reasoning_content", r.reasoning) != NULL;
    cJSON *calls = ok && r.n_calls ? cJSON_AddArrayToObject(m, "tool_calls") : NULL;
    if (r.n_calls && !calls) ok = 0;
    for (size_t i = 0; ok && i < r.n_calls; i++) {
        cJSON *c = cJSON_CreateObject(), *f = NULL;
        ok = c && cJSON_AddItemToArray(calls, c) && cJSON_AddStringToObject(c, "id", r.calls[i].id) &&
             cJSON_AddStringToObject(c, "type", "function") && (f = cJSON_AddObjectToObject(c, "function")) &&
             cJSON_AddStringToObject(f, "name", r.calls[i].name) &&
             cJSON_AddStringToObject(f, "arguments", r.calls[i].arguments);
    }
    char *text = ok ? cJSON_PrintUnformatted(m) : NULL;
    cJSON_Delete(m);
    if (!text) return k3c_errorf_kind(K3C_ERROR_OOM, "chat parser result: out of memory");
    /* cJSON allocates with malloc unless hooks are set (k3c sets none): the caller's free() matches */
    *json = text;
    return K3C_OK;
}
