/* The text pipeline of one choice, token by token, on the scheduler thread:
 *
 *   completions: token -> detokenizer (whole UTF-8 characters) -> stop strings -> the chunk's text
 *   chat:        token -> the chat API's output parser (reasoning / content / tool-call deltas, by token id)
 *                -> stop strings over the reasoning and content text, as one stream -> the chunk's delta
 *
 * Stop strings hold back text that may still become the start of one; a tool call's events release what
 * they hold first (so the order of text and calls is kept, and a stop string never spans a call). In a
 * completion special tokens skip the detokenizer: their text (the tokenizer's name for them) is left out
 * unless the request sets skip_special_tokens false (vLLM's default and switch), and then stop strings see
 * it like any text; in a chat the parser decides what text a token makes. Stop tokens (the request's
 * stop_token_ids, the chat format's end of message, the eos) end the output and are never text. */
#include <stdlib.h>
#include <string.h>

#include "server/request.h"

static int is_stop_id(const srv_req *r, int32_t t) {
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] == t) return 1;
    return 0;
}

int srv_choice_init(srv_req *r, srv_choice *c) {
    const k3c_tokenizer *tok = srv_text_tokenizer(r->text);
    c->req = r;
    c->finish = SRV_FINISH_LENGTH;
    srv_stop_init(&c->stop, r->p.stop, r->p.n_stop, r->p.include_stop_str);
    if (r->p.kind == SRV_CHAT) {
        if (srv_tparser_create(r->text, r->p.chat_json, r->p.chat_json_len, &c->parser) != K3C_OK) return -1;
    } else if (k3c_detokenizer_create(tok, &c->detok) != K3C_OK) {
        return -1;
    }
    if (r->p.logprobs && !r->p.stream) {
        c->lp = r->p.kind == SRV_CHAT ? cJSON_CreateArray() : srv_completion_logprobs_new();
        if (!c->lp) return -1;
    }
    return 0;
}

void srv_choice_free(srv_choice *c) {
    k3c_detokenizer_free(c->detok);
    srv_stop_free(&c->stop);
    srv_tparser_free(c->parser);
    srv_buf_free(&c->text);
    srv_buf_free(&c->reasoning);
    for (int i = 0; i < c->n_calls; i++) {
        free(c->calls[i].id);
        free(c->calls[i].name);
        srv_buf_free(&c->calls[i].args);
    }
    free(c->calls);
    c->calls = NULL;
    c->n_calls = 0;
    cJSON_Delete(c->lp);
    c->detok = NULL;
    c->parser = NULL;
    c->lp = NULL;
}

/* ---- one token's output: the chunk being built ---- */

/* A tool call's part of one token's delta. */
typedef struct tool_delta {
    int index;
    char *id_s, *name_s; /* TOOL_START: the call's id and name */
    srv_buf args;
} tool_delta;

typedef struct delta {
    srv_buf content, reasoning;
    tool_delta *tools;
    int n_tools;
    int any, failed;
} delta;

static void delta_free(delta *d) {
    srv_buf_free(&d->content);
    srv_buf_free(&d->reasoning);
    for (int i = 0; i < d->n_tools; i++) {
        free(d->tools[i].id_s);
        free(d->tools[i].name_s);
        srv_buf_free(&d->tools[i].args);
    }
    free(d->tools);
}

/* The entry of call `index`: the last one when it is that call (argument pieces within a token join). */
static tool_delta *tool_entry(delta *d, int index) {
    if (d->n_tools && d->tools[d->n_tools - 1].index == index) return &d->tools[d->n_tools - 1];
    tool_delta *t = realloc(d->tools, sizeof *t * (size_t)(d->n_tools + 1));
    if (!t) {
        d->failed = 1;
        return NULL;
    }
    d->tools = t;
    t = &d->tools[d->n_tools++];
    *t = (tool_delta){.index = index};
    return t;
}

/* Released text with its tags (0 content, 1 reasoning) into the delta. */
static void put_tagged(delta *d, const srv_buf *text, const srv_buf *tags) {
    for (size_t i = 0; i < text->len;) {
        size_t j = i;
        char tag = tags->data[i];
        while (j < text->len && tags->data[j] == tag) j++;
        srv_buf_put(tag ? &d->reasoning : &d->content, text->data + i, j - i);
        d->any = 1;
        i = j;
    }
}

static void release_held(srv_choice *c, delta *d) {
    srv_buf rel = {0}, tags = {0};
    srv_stop_flush_tagged(&c->stop, &rel, &tags);
    if (rel.failed || tags.failed) d->failed = 1;
    else put_tagged(d, &rel, &tags);
    srv_buf_free(&rel);
    srv_buf_free(&tags);
}

static srv_call *find_call(srv_choice *c, int index, int create) {
    for (int i = 0; i < c->n_calls; i++)
        if (c->calls[i].index == index) return &c->calls[i];
    if (!create) return NULL;
    srv_call *n = realloc(c->calls, sizeof *n * (size_t)(c->n_calls + 1));
    if (!n) return NULL;
    c->calls = n;
    n = &c->calls[c->n_calls++];
    *n = (srv_call){.index = index};
    return n;
}

/* Parser events into the delta, the text through the stop strings. Returns 1 when a stop string matched.
 * With tool_choice none the model's calls are not reported (the request said it wants none); their raw
 * text is not restored either. */
static int take_events(srv_choice *c, const k3c_chat_event *ev, size_t n, delta *d) {
    int tools_on = c->req->p.tool_choice != SRV_TOOLS_NONE;
    for (size_t i = 0; i < n; i++) {
        const k3c_chat_event *e = &ev[i];
        if (e->kind == K3C_CHAT_CONTENT || e->kind == K3C_CHAT_REASONING) {
            srv_buf rel = {0}, tags = {0};
            int m = srv_stop_push_tagged(&c->stop, e->text, e->len, e->kind == K3C_CHAT_REASONING, &rel, &tags);
            if (rel.failed || tags.failed) d->failed = 1;
            else put_tagged(d, &rel, &tags);
            srv_buf_free(&rel);
            srv_buf_free(&tags);
            if (m) return 1;
            continue;
        }
        if (!tools_on) continue;
        release_held(c, d);
        tool_delta *t = tool_entry(d, e->index);
        srv_call *call = find_call(c, e->index, e->kind == K3C_CHAT_TOOL_START);
        if (!t) continue;
        switch (e->kind) {
        case K3C_CHAT_TOOL_START:
            t->id_s = strdup(e->id ? e->id : "");
            t->name_s = strdup(e->name ? e->name : "");
            if (!t->id_s || !t->name_s || !call) d->failed = 1;
            if (call) {
                call->id = strdup(e->id ? e->id : "");
                call->name = strdup(e->name ? e->name : "");
            }
            d->any = 1;
            break;
        case K3C_CHAT_TOOL_ARGS:
            srv_buf_put(&t->args, e->text, e->len);
            if (call) srv_buf_put(&call->args, e->text, e->len);
            d->any = 1;
            break;
        case K3C_CHAT_TOOL_END:
            if (call) call->complete = 1;
            c->n_tool_calls++;
            break;
        case K3C_CHAT_TOOL_VOID:
            if (call) call->voided = 1; /* its raw text follows as content */
            break;
        default: break;
        }
    }
    return 0;
}

/* tool_calls entries as the openai client accumulates them: the first names the call (id, type, name and
 * empty arguments), the next ones carry argument pieces only. */
static cJSON *tool_calls_json(const delta *d) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < d->n_tools; i++) {
        const tool_delta *t = &d->tools[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "index", t->index);
        if (t->id_s) {
            cJSON_AddItemToObject(e, "id", srv_json_text(t->id_s, strlen(t->id_s)));
            cJSON_AddStringToObject(e, "type", "function");
        }
        cJSON *fn = cJSON_AddObjectToObject(e, "function");
        if (t->name_s) cJSON_AddItemToObject(fn, "name", srv_json_text(t->name_s, strlen(t->name_s)));
        cJSON_AddItemToObject(fn, "arguments", srv_json_text(t->args.data ? t->args.data : "", t->args.len));
        cJSON_AddItemToArray(a, e);
    }
    return a;
}

static int feed_parser(srv_choice *c, int32_t id, delta *d) {
    const k3c_chat_event *ev;
    size_t n = 0;
    if (k3c_chat_parser_feed(c->parser, id, &ev, &n) != K3C_OK) {
        d->failed = 1;
        return 0;
    }
    return take_events(c, ev, n, d);
}

/* Completions: released text into the delta. */
static void emit_text(const srv_buf *rel, delta *d) {
    if (!rel->len) return;
    srv_buf_put(&d->content, rel->data, rel->len);
    d->any = 1;
}

/* The end of the output: what the parser, the detokenizer and the stop strings still hold (unless a stop
 * string matched: then what followed it is dropped). */
static void settle(srv_choice *c, delta *d) {
    if (c->parser) {
        const k3c_chat_event *ev;
        size_t n = 0;
        if (!c->stop.matched && k3c_chat_parser_finish(c->parser, &ev, &n) == K3C_OK) take_events(c, ev, n, d);
        if (!c->stop.matched) release_held(c, d);
    } else if (!c->stop.matched) {
        srv_buf rel = {0};
        const char *t;
        size_t n = 0;
        if (k3c_detokenizer_finish(c->detok, &t, &n) == K3C_OK && n) srv_stop_push(&c->stop, t, n, &rel);
        srv_stop_flush(&c->stop, &rel);
        emit_text(&rel, d);
        srv_buf_free(&rel);
    }
    c->done = 1;
}

static void add_usage(const srv_req *r, cJSON *chunk) {
    cJSON_AddItemToObject(chunk, "usage", srv_usage(r));
}

/* The streamed chunk of one token's delta (and its logprobs), or into the non-streaming accumulators. */
static void put_delta(srv_choice *c, delta *d, cJSON *logprobs, srv_buf *out) {
    srv_req *r = c->req;
    if (!r->p.stream) {
        srv_buf_put(&c->text, d->content.data, d->content.len);
        srv_buf_put(&c->reasoning, d->reasoning.data, d->reasoning.len);
        cJSON_Delete(logprobs);
        return;
    }
    if (!d->any && !logprobs) return;
    cJSON *chunk = srv_chunk_new(r), *ch = srv_chunk_choice(chunk, r, c->index);
    if (r->p.kind == SRV_CHAT) {
        cJSON *dl = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        if (d->reasoning.len) {
            /* both names: vLLM renamed reasoning_content to reasoning, clients read either */
            cJSON_AddItemToObject(dl, "reasoning", srv_json_text(d->reasoning.data, d->reasoning.len));
            cJSON_AddItemToObject(dl, "reasoning_content", srv_json_text(d->reasoning.data, d->reasoning.len));
        }
        if (d->content.len) cJSON_AddItemToObject(dl, "content", srv_json_text(d->content.data, d->content.len));
        if (d->n_tools) cJSON_AddItemToObject(dl, "tool_calls", tool_calls_json(d));
        if (logprobs) {
            cJSON *lp = cJSON_CreateObject();
            cJSON *content = cJSON_AddArrayToObject(lp, "content");
            cJSON_AddItemToArray(content, logprobs);
            cJSON_ReplaceItemInObjectCaseSensitive(ch, "logprobs", lp);
        }
    } else {
        cJSON_ReplaceItemInObjectCaseSensitive(ch, "text", srv_json_text(d->content.data ? d->content.data : "",
                                                                          d->content.len));
        if (logprobs) cJSON_ReplaceItemInObjectCaseSensitive(ch, "logprobs", logprobs);
    }
    if (r->p.continuous_usage) add_usage(r, chunk);
    srv_sse_put(out, chunk);
}

int srv_choice_token(srv_choice *c, int32_t token, float logprob, int n_top, const int32_t *top_ids,
                     const float *top_lps, srv_buf *out) {
    srv_req *r = c->req;
    if (c->done) return 1;
    const k3c_tokenizer *tok = srv_text_tokenizer(r->text);
    double now = srv_now();
    c->tokens++;
    if (c->t_first == 0) {
        c->t_first = now;
        srv_metrics_token_times(r->metrics, now - r->t_arrival, NULL, 0);
    } else {
        double itl = now - c->t_last;
        srv_metrics_token_times(r->metrics, -1, &itl, 1);
    }
    c->t_last = now;

    delta d = {0};
    long before = c->text_offset;
    int settled = 0;
    if (is_stop_id(r, token)) {
        c->finish = SRV_FINISH_STOP;
        if (c->parser) feed_parser(c, token, &d); /* the parser ends its message there */
        settle(c, &d);
        settled = 1;
    } else if (c->parser) {
        settled = feed_parser(c, token, &d);
    } else if (k3c_tokenizer_is_special(tok, token)) {
        /* what waits in the detokenizer first; then the special's text, unless skipped */
        srv_buf rel = {0};
        const char *t;
        size_t n = 0;
        if (k3c_detokenizer_finish(c->detok, &t, &n) == K3C_OK && n) settled = srv_stop_push(&c->stop, t, n, &rel);
        size_t sl = 0;
        const char *st = r->p.skip_special_tokens ? NULL : k3c_tokenizer_token(tok, token, &sl);
        if (!settled && st) settled = srv_stop_push(&c->stop, st, sl, &rel);
        emit_text(&rel, &d);
        srv_buf_free(&rel);
    } else {
        const char *t;
        size_t n = 0;
        srv_buf rel = {0};
        if (k3c_detokenizer_push(c->detok, token, &t, &n) != K3C_OK) d.failed = 1;
        else if (n) settled = srv_stop_push(&c->stop, t, n, &rel);
        emit_text(&rel, &d);
        srv_buf_free(&rel);
    }
    if (settled && !c->done) {
        c->finish = SRV_FINISH_STOP;
        settle(c, &d);
    }
    cJSON *lp = NULL;
    if (r->p.logprobs) {
        if (r->p.kind == SRV_CHAT) {
            lp = srv_chat_logprob(tok, token, logprob, n_top, top_ids, top_lps, r->p.top_logprobs);
            if (c->lp) cJSON_AddItemToArray(c->lp, lp), lp = NULL;
        } else {
            cJSON *obj = c->lp ? c->lp : (lp = srv_completion_logprobs_new());
            srv_completion_logprob(obj, tok, token, logprob, n_top, top_ids, top_lps, r->p.top_logprobs, before);
        }
    }
    c->text_offset += (long)d.content.len;
    int failed = d.failed || d.content.failed || d.reasoning.failed;
    put_delta(c, &d, lp, out);
    delta_free(&d);
    if (failed) return -1;
    return settled || c->done;
}

void srv_choice_finished(srv_choice *c, srv_finish reason, int cached_tokens, int completion_tokens, double queue_s,
                         srv_buf *out) {
    srv_req *r = c->req;
    c->cached_tokens = cached_tokens;
    if (!c->done) {
        /* settled here, not by a stop string (after which the tokens the scheduler made before the abort
         * took effect are not the client's) */
        if (completion_tokens > c->tokens) c->tokens = completion_tokens;
        c->finish = reason;
        delta d = {0};
        settle(c, &d);
        put_delta(c, &d, NULL, out);
        delta_free(&d);
    }
    if (c->finish == SRV_FINISH_STOP && c->n_tool_calls) c->finish = SRV_FINISH_TOOL_CALLS;
    /* vLLM's phases from the scheduler's queue time and the times tokens reached the server */
    double now = srv_now(), admitted = r->t_arrival + queue_s;
    srv_finish_times t = {.e2e = now - r->t_arrival, .queue = queue_s, .prefill = -1, .decode = -1, .inference = -1,
                          .tpot = -1};
    if (c->t_first > 0) {
        t.prefill = c->t_first > admitted ? c->t_first - admitted : 0;
        t.decode = c->t_last - c->t_first;
        t.inference = c->t_last > admitted ? c->t_last - admitted : 0;
        if (c->tokens > 1) t.tpot = t.decode / (c->tokens - 1);
    }
    srv_metrics_finished(r->metrics, c->finish, &t, r->prompt_len[c->prompt], c->tokens);
    if (!r->p.stream || c->finish == SRV_FINISH_ABORT || c->finish == SRV_FINISH_ERROR) return;
    cJSON *chunk = srv_chunk_new(r), *ch = srv_chunk_choice(chunk, r, c->index);
    cJSON_ReplaceItemInObjectCaseSensitive(ch, "finish_reason", cJSON_CreateString(srv_finish_name(c->finish)));
    if (r->p.continuous_usage) add_usage(r, chunk);
    srv_sse_put(out, chunk);
}

/* ---- the start and the end of the request ---- */

void srv_req_stream_start(srv_req *r, srv_buf *out) {
    for (int i = 0; i < r->n_choices; i++) {
        const srv_choice *c = &r->choices[i];
        cJSON *chunk = srv_chunk_new(r), *ch = srv_chunk_choice(chunk, r, c->index);
        if (r->p.kind == SRV_CHAT) {
            /* the role chunk the openai client expects first: role assistant, empty content */
            cJSON *dl = cJSON_GetObjectItemCaseSensitive(ch, "delta");
            cJSON_AddStringToObject(dl, "role", "assistant");
            cJSON_AddStringToObject(dl, "content", "");
        } else if (r->p.echo) {
            const srv_prompt *pr = &r->p.prompts[c->prompt];
            char *s = NULL;
            size_t n = 0;
            if (!pr->text) k3c_tokenizer_decode(srv_text_tokenizer(r->text), pr->ids, (size_t)pr->n_ids, &s, &n);
            cJSON_ReplaceItemInObjectCaseSensitive(ch, "text", pr->text ? srv_json_text(pr->text, pr->len)
                                                                          : srv_json_text(s ? s : "", s ? n : 0));
            free(s);
        } else {
            cJSON_Delete(chunk);
            continue;
        }
        srv_sse_put(out, chunk);
    }
}


static cJSON *chat_message(srv_choice *c) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    int n_calls = 0;
    for (int i = 0; i < c->n_calls; i++) n_calls += c->calls[i].complete && !c->calls[i].voided;
    if (c->text.len || !n_calls) cJSON_AddItemToObject(m, "content", srv_json_text(c->text.data ? c->text.data : "", c->text.len));
    else cJSON_AddNullToObject(m, "content");
    if (c->reasoning.len) {
        cJSON_AddItemToObject(m, "reasoning", srv_json_text(c->reasoning.data, c->reasoning.len));
        cJSON_AddItemToObject(m, "reasoning_content", srv_json_text(c->reasoning.data, c->reasoning.len));
    } else {
        cJSON_AddNullToObject(m, "reasoning");
        cJSON_AddNullToObject(m, "reasoning_content");
    }
    cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
    for (int i = 0; i < c->n_calls; i++) {
        const srv_call *k = &c->calls[i];
        if (!k->complete || k->voided) continue;
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToObject(t, "id", srv_json_text(k->id ? k->id : "", k->id ? strlen(k->id) : 0));
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(t, "function");
        cJSON_AddItemToObject(fn, "name", srv_json_text(k->name ? k->name : "", k->name ? strlen(k->name) : 0));
        cJSON_AddItemToObject(fn, "arguments", srv_json_text(k->args.data ? k->args.data : "", k->args.len));
        cJSON_AddItemToArray(tc, t);
    }
    return m;
}

static int any_abort(const srv_req *r) {
    for (int i = 0; i < r->n_choices; i++)
        if (r->choices[i].finish == SRV_FINISH_ABORT || r->choices[i].finish == SRV_FINISH_ERROR) return 1;
    return 0;
}

void srv_req_finalize(srv_req *r, srv_buf *out) {
    if (any_abort(r)) {
        srv_error e;
        srv_fail(&e, 503, "server_error", NULL, NULL, "The request was aborted (the server is shutting down, or the "
                 "engine failed).");
        srv_req_fail(r, &e, out);
        return;
    }
    if (r->p.stream) {
        if (r->p.include_usage) {
            cJSON *chunk = srv_chunk_new(r);
            add_usage(r, chunk);
            srv_sse_put(out, chunk);
        }
        srv_sse_done(out);
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", r->id);
    cJSON_AddStringToObject(root, "object", r->p.kind == SRV_CHAT ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)r->created);
    cJSON_AddStringToObject(root, "model", r->model_name);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < r->n_choices; i++) {
        srv_choice *c = &r->choices[i];
        cJSON *ch = cJSON_CreateObject();
        cJSON_AddNumberToObject(ch, "index", c->index);
        if (r->p.kind == SRV_CHAT) {
            cJSON_AddItemToObject(ch, "message", chat_message(c));
            if (c->lp) {
                cJSON *lp = cJSON_AddObjectToObject(ch, "logprobs");
                cJSON_AddItemToObject(lp, "content", c->lp);
                c->lp = NULL;
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        } else {
            srv_buf text = {0};
            if (r->p.echo) {
                const srv_prompt *pr = &r->p.prompts[c->prompt];
                if (pr->text) {
                    srv_buf_put(&text, pr->text, pr->len);
                } else {
                    char *s = NULL;
                    size_t n = 0;
                    if (k3c_tokenizer_decode(srv_text_tokenizer(r->text), pr->ids, (size_t)pr->n_ids, &s, &n) == K3C_OK)
                        srv_buf_put(&text, s, n);
                    free(s);
                }
            }
            srv_buf_put(&text, c->text.data, c->text.len);
            cJSON_AddItemToObject(ch, "text", srv_json_text(text.data ? text.data : "", text.len));
            srv_buf_free(&text);
            if (c->lp) {
                cJSON_AddItemToObject(ch, "logprobs", c->lp);
                c->lp = NULL;
            } else {
                cJSON_AddNullToObject(ch, "logprobs");
            }
        }
        cJSON_AddStringToObject(ch, "finish_reason", srv_finish_name(c->finish));
        cJSON_AddItemToArray(choices, ch);
    }
    cJSON_AddItemToObject(root, "usage", srv_usage(r));
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) {
        out->failed = 1;
        return;
    }
    srv_buf_puts(out, s);
    cJSON_free(s);
    r->status = 200;
}

void srv_req_fail(srv_req *r, const srv_error *e, srv_buf *out) {
    char *s = srv_error_json(e);
    if (!s) {
        out->failed = 1;
        return;
    }
    if (r->p.stream) {
        /* a stream's status was sent with its first byte: the error goes in the stream, then [DONE] */
        srv_buf_printf(out, "data: %s\n\n", s);
        srv_sse_done(out);
    } else {
        srv_buf_puts(out, s);
        r->status = e->status;
    }
    cJSON_free(s);
}
