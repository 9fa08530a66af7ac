/* The text pipeline of one choice, token by token, on the scheduler thread:
 *
 *   token -> detokenizer (whole UTF-8 characters) -> stop strings (a possible partial match held back)
 *         -> chat: the output parser (reasoning / content / tool-call argument deltas) -> SSE chunk or the body
 *         -> completions: the text itself
 *
 * Special tokens skip the detokenizer. Their text (the tokenizer's name for them) is left out unless the
 * request sets skip_special_tokens false (vLLM's default and switch); a completion then matches stop
 * strings on it like on any text. A chat parser sees every special token's id at once (structure is matched
 * by id), after the text the stop strings held back, and a stop string never spans a special token there;
 * a malformed tool call turned back into content lacks its markers' text, as vLLM's would. Stop tokens (the request's stop_token_ids, the chat format's end
 * of message, the tokenizer's eos) end the output and are never text. */
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
    if (k3c_detokenizer_create(tok, &c->detok) != K3C_OK) return -1;
    if (r->p.kind == SRV_CHAT && srv_tparser_create(r->text, &r->p, &c->parser) != K3C_OK) return -1;
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

/* Parser events into the delta. With tool_choice none the model's calls are not reported (the request
 * said it wants none); their raw text is not restored either. */
static void take_events(srv_choice *c, const srv_tevent *ev, size_t n, delta *d) {
    int tools_on = c->req->p.tool_choice != SRV_TOOLS_NONE;
    for (size_t i = 0; i < n; i++) {
        const srv_tevent *e = &ev[i];
        tool_delta *t;
        switch (e->kind) {
        case SRV_TEV_CONTENT: srv_buf_put(&d->content, e->text, e->len), d->any = 1; break;
        case SRV_TEV_REASONING: srv_buf_put(&d->reasoning, e->text, e->len), d->any = 1; break;
        case SRV_TEV_TOOL_START:
            if (!tools_on || !(t = tool_entry(d, e->index))) break;
            t->id_s = strdup(e->id ? e->id : "");
            t->name_s = strdup(e->name ? e->name : "");
            if (!t->id_s || !t->name_s) d->failed = 1;
            d->any = 1;
            break;
        case SRV_TEV_TOOL_ARGS:
            if (!tools_on || !(t = tool_entry(d, e->index))) break;
            srv_buf_put(&t->args, e->text, e->len);
            d->any = 1;
            break;
        case SRV_TEV_TOOL_END:
            if (tools_on) c->n_tool_calls++;
            break;
        case SRV_TEV_TOOL_VOID: break; /* its raw text follows as content */
        }
    }
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

static void feed_parser(srv_choice *c, int32_t id, const char *text, size_t len, delta *d) {
    const srv_tevent *ev;
    size_t n = 0;
    if (srv_tparser_feed(c->parser, id, text, len, &ev, &n) == K3C_OK) take_events(c, ev, n, d);
    else d->failed = 1;
}

/* Released text of the choice (after the stop strings): to the parser, or the completion's text. */
static void emit_text(srv_choice *c, int32_t id, const char *text, size_t len, delta *d) {
    if (c->parser) {
        feed_parser(c, id, text, len, d);
    } else if (len) {
        srv_buf_put(&d->content, text, len);
        d->any = 1;
    }
}

/* The end of the output: what the detokenizer and the stop strings still hold (unless a stop string
 * matched: then what followed it is dropped), then the parser's settling. */
static void settle(srv_choice *c, delta *d) {
    srv_buf rel = {0};
    if (!c->stop.matched) {
        const char *t;
        size_t n = 0;
        if (k3c_detokenizer_finish(c->detok, &t, &n) == K3C_OK && n) srv_stop_push(&c->stop, t, n, &rel);
        srv_stop_flush(&c->stop, &rel);
    }
    emit_text(c, -1, rel.data ? rel.data : "", rel.len, d);
    srv_buf_free(&rel);
    if (c->parser) {
        const srv_tevent *ev;
        size_t n = 0;
        if (srv_tparser_finish(c->parser, &ev, &n) == K3C_OK) take_events(c, ev, n, d);
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
        if (r->p.kind == SRV_COMPLETION) srv_buf_put(&c->text, d->content.data, d->content.len);
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
        settle(c, &d);
        settled = 1;
    } else if (k3c_tokenizer_is_special(tok, token)) {
        /* what waits in the detokenizer goes first; then the special's text (none with skip_special_tokens,
         * the default, as in vLLM). A completion matches stop strings on that text as on any other; a chat
         * parser sees the id at once, so the text held back by the stop strings is released before it. */
        srv_buf rel = {0};
        const char *t;
        size_t n = 0;
        if (k3c_detokenizer_finish(c->detok, &t, &n) == K3C_OK && n) settled = srv_stop_push(&c->stop, t, n, &rel);
        size_t sl = 0;
        const char *st = r->p.skip_special_tokens ? NULL : k3c_tokenizer_token(tok, token, &sl);
        if (c->parser) {
            if (!settled) srv_stop_flush(&c->stop, &rel);
            emit_text(c, -1, rel.data ? rel.data : "", rel.len, &d);
            if (!settled) feed_parser(c, token, st ? st : "", st ? sl : 0, &d);
        } else {
            if (!settled && st) settled = srv_stop_push(&c->stop, st, sl, &rel);
            emit_text(c, token, rel.data ? rel.data : "", rel.len, &d);
        }
        srv_buf_free(&rel);
        if (settled) {
            c->finish = SRV_FINISH_STOP;
            settle(c, &d);
        }
    } else {
        const char *t;
        size_t n = 0;
        srv_buf rel = {0};
        if (k3c_detokenizer_push(c->detok, token, &t, &n) != K3C_OK) rel.failed = 1;
        else if (n && srv_stop_push(&c->stop, t, n, &rel)) settled = 1;
        emit_text(c, token, rel.data ? rel.data : "", rel.len, &d);
        srv_buf_free(&rel);
        if (settled) {
            c->finish = SRV_FINISH_STOP;
            settle(c, &d);
        }
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

void srv_choice_finished(srv_choice *c, srv_finish reason, int cached_tokens, int completion_tokens, srv_buf *out) {
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
    srv_metrics_finished(r->metrics, c->finish, srv_now() - r->t_arrival, r->prompt_len[c->prompt], c->tokens);
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
    const char *content = "", *reasoning = "";
    const srv_tool_call *calls = NULL;
    size_t n_calls = 0;
    if (srv_tparser_result(c->parser, &content, &reasoning, &calls, &n_calls) != K3C_OK) n_calls = 0;
    if (c->req->p.tool_choice == SRV_TOOLS_NONE) n_calls = 0;
    if (*content || !n_calls) cJSON_AddItemToObject(m, "content", srv_json_text(content, strlen(content)));
    else cJSON_AddNullToObject(m, "content");
    if (*reasoning) {
        cJSON_AddItemToObject(m, "reasoning", srv_json_text(reasoning, strlen(reasoning)));
        cJSON_AddItemToObject(m, "reasoning_content", srv_json_text(reasoning, strlen(reasoning)));
    } else {
        cJSON_AddNullToObject(m, "reasoning");
        cJSON_AddNullToObject(m, "reasoning_content");
    }
    cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
    for (size_t i = 0; i < n_calls; i++) {
        cJSON *t = cJSON_CreateObject();
        cJSON_AddItemToObject(t, "id", srv_json_text(calls[i].id, strlen(calls[i].id)));
        cJSON_AddStringToObject(t, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(t, "function");
        cJSON_AddItemToObject(fn, "name", srv_json_text(calls[i].name, strlen(calls[i].name)));
        cJSON_AddItemToObject(fn, "arguments", srv_json_text(calls[i].arguments, strlen(calls[i].arguments)));
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
