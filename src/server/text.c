/* The server's text side over the chat renderer and the output parser. */
#include "server/text.h"

#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/parse.h"

struct srv_text {
    k3c_tokenizer *tok;
    k3c_chat_format format;
    k3c_parse_specials specials;
    int32_t end_ids[4];
    int n_end;
};

static int32_t special_id(void *user, const char *name) { return k3c_tokenizer_special_id(user, name); }

int srv_text_create(const char *model_dir, const char *preset, const char *family, srv_text **out) {
    *out = NULL;
    srv_text *t = calloc(1, sizeof *t);
    if (!t) return K3C_ERR;
    int rc = model_dir && k3c_tokenizer_present(model_dir) ? k3c_tokenizer_load(model_dir, &t->tok)
                                                             : k3c_tokenizer_load_preset(preset ? preset : "tiny", &t->tok);
    k3c_family fam = family && strstr(family, "K3") ? K3C_FAMILY_K3 : K3C_FAMILY_KIMI_LINEAR;
    if (rc == K3C_OK) {
        if (model_dir) rc = k3c_chat_format_load(model_dir, fam, &t->format, NULL, 0);
        else t->format = k3c_chat_format_default(fam);
    }
    if (rc != K3C_OK) {
        k3c_tokenizer_free(t->tok);
        free(t);
        return K3C_ERR;
    }
    k3c_parse_specials_lookup(&t->specials, k3c_parse_dialect_of(t->format), special_id, t->tok);
    for (int i = 0; i < t->specials.n_stop; i++) t->end_ids[t->n_end++] = t->specials.stop[i];
    *out = t;
    return K3C_OK;
}

void srv_text_free(srv_text *t) {
    if (!t) return;
    k3c_tokenizer_free(t->tok);
    free(t);
}

const k3c_tokenizer *srv_text_tokenizer(const srv_text *t) { return t->tok; }
const char *srv_text_format_name(const srv_text *t) { return k3c_chat_format_name(t->format); }

const int32_t *srv_text_end_ids(const srv_text *t, int *n) {
    *n = t->n_end;
    return t->end_ids;
}

static int encode_prompt(const srv_text *t, const k3c_chat_request *req, k3c_tokens *out, srv_error *e) {
    k3c_chat_prompt pr;
    if (k3c_chat_render(t->format, req, &pr) != K3C_OK)
        return srv_fail(e, 400, NULL, NULL, "messages", "%s", k3c_last_error());
    int rc = 0;
    for (size_t i = 0; i < pr.n_segs && !rc; i++) {
        const k3c_chat_segment *s = &pr.segs[i];
        const char *text = pr.text + s->off;
        if (s->kind == K3C_CHAT_SEG_SPECIAL) {
            char name[64];
            int32_t id = -1;
            if (s->len < sizeof name) {
                memcpy(name, text, s->len);
                name[s->len] = 0;
                id = k3c_tokenizer_special_id(t->tok, name);
            }
            if (id < 0) {
                rc = srv_fail(e, 500, "server_error", NULL, NULL, "the chat format needs the special token %.*s, which the "
                              "tokenizer does not have", (int)(s->len < 64 ? s->len : 64), text);
                break;
            }
            if (out->n == out->cap) {
                size_t cap = out->cap ? 2 * out->cap : 64;
                int32_t *ids = realloc(out->ids, cap * sizeof *ids);
                if (!ids) {
                    rc = srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
                    break;
                }
                out->ids = ids;
                out->cap = cap;
            }
            out->ids[out->n++] = id;
        } else if (k3c_tokenizer_encode(t->tok, text, s->len, s->kind == K3C_CHAT_SEG_MIXED, out) != K3C_OK) {
            rc = srv_fail(e, 400, NULL, NULL, "messages", "%s", k3c_last_error());
        }
    }
    k3c_chat_prompt_free(&pr);
    return rc;
}

int srv_text_chat_encode(const srv_text *t, const srv_params *p, k3c_tokens *out, srv_error *e) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(p->root, "tool_choice");
    k3c_chat_request req = {
        .messages = p->messages,
        .tools = p->tools,
        .add_generation_prompt = p->add_generation_prompt,
        .no_thinking = p->no_thinking,
        .thinking_effort = p->thinking_effort,
        .tool_choice = tc,
    };
    return encode_prompt(t, &req, out, e);
}

int srv_text_chat_encode_messages(const srv_text *t, const void *messages, const void *tools, int add_generation_prompt,
                                  k3c_tokens *out, srv_error *e) {
    k3c_chat_request req = {.messages = messages, .tools = tools, .add_generation_prompt = add_generation_prompt};
    return encode_prompt(t, &req, out, e);
}

struct srv_tparser {
    k3c_parser *p;
    srv_tevent *ev;
    size_t cap;
    srv_tool_call *calls;
    size_t cap_calls;
};

int srv_tparser_create(const srv_text *t, const srv_params *p, srv_tparser **out) {
    *out = NULL;
    srv_tparser *tp = calloc(1, sizeof *tp);
    if (!tp) return K3C_ERR;
    k3c_parser_opts o = k3c_parser_opts_of(t->format, p->no_thinking);
    if (k3c_parser_create(&o, &t->specials, &tp->p) != K3C_OK) {
        free(tp);
        return K3C_ERR;
    }
    *out = tp;
    return K3C_OK;
}

void srv_tparser_free(srv_tparser *p) {
    if (!p) return;
    k3c_parser_free(p->p);
    free(p->ev);
    free(p->calls);
    free(p);
}

static int convert(srv_tparser *p, const k3c_parse_event *ev, size_t n, const srv_tevent **out, size_t *n_out) {
    if (n > p->cap) {
        srv_tevent *e = realloc(p->ev, n * sizeof *e);
        if (!e) return K3C_ERR;
        p->ev = e;
        p->cap = n;
    }
    for (size_t i = 0; i < n; i++)
        p->ev[i] = (srv_tevent){(srv_tevent_kind)ev[i].kind, ev[i].index, ev[i].text, ev[i].len, ev[i].id, ev[i].name};
    *out = p->ev;
    *n_out = n;
    return K3C_OK;
}

int srv_tparser_feed(srv_tparser *p, int32_t id, const char *text, size_t len, const srv_tevent **ev, size_t *n) {
    const k3c_parse_event *e;
    size_t ne = 0;
    /* id 0 is a byte rank, never a marker: text without a token of its own */
    if (k3c_parser_feed(p->p, id < 0 ? 0 : id, text, len, &e, &ne) != K3C_OK) return K3C_ERR;
    return convert(p, e, ne, ev, n);
}

int srv_tparser_finish(srv_tparser *p, const srv_tevent **ev, size_t *n) {
    const k3c_parse_event *e;
    size_t ne = 0;
    if (k3c_parser_finish(p->p, &e, &ne) != K3C_OK) return K3C_ERR;
    return convert(p, e, ne, ev, n);
}

int srv_tparser_result(srv_tparser *p, const char **content, const char **reasoning, const srv_tool_call **calls,
                       size_t *n_calls) {
    k3c_parse_result r;
    if (k3c_parser_result(p->p, &r) != K3C_OK) return K3C_ERR;
    if (r.n_calls > p->cap_calls) {
        srv_tool_call *c = realloc(p->calls, r.n_calls * sizeof *c);
        if (!c) return K3C_ERR;
        p->calls = c;
        p->cap_calls = r.n_calls;
    }
    for (size_t i = 0; i < r.n_calls; i++) p->calls[i] = (srv_tool_call){r.calls[i].id, r.calls[i].name, r.calls[i].arguments};
    *content = r.content;
    *reasoning = r.reasoning;
    *calls = p->calls;
    *n_calls = r.n_calls;
    return K3C_OK;
}
