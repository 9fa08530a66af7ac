/* The endpoints: what each path answers, the API key, and a generation request from its parsed body to
 * the scheduler (prompt ids, context checks, choices, submission). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

static const struct {
    const char *path, *method;
} routes[] = {
    {"/v1/chat/completions", "POST"}, {"/v1/completions", "POST"}, {"/v1/models", "GET"}, {"/health", "GET"},
    {"/metrics", "GET"},              {"/tokenize", "POST"},       {"/detokenize", "POST"}, {"/version", "GET"},
};
#define N_ROUTES (sizeof routes / sizeof routes[0])

void srv_route_error(srv_route_result *out, const srv_error *e) {
    out->status = e->status;
    out->body = srv_error_json(e);
    out->body_len = out->body ? strlen(out->body) : 0;
    out->content_type = "application/json";
    if (e->status == 429 || e->status == 503) out->retry_after = 1;
}

static void json_out(srv_route_result *out, int status, cJSON *root) {
    out->status = status;
    out->body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!out->body) {
        srv_error e;
        srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory building the response");
        srv_route_error(out, &e);
        return;
    }
    out->body_len = strlen(out->body);
    out->content_type = "application/json";
}

int srv_route_check(const char *method, const char *url, srv_route_result *out) {
    srv_error e;
    for (size_t i = 0; i < N_ROUTES; i++)
        if (!strcmp(url, routes[i].path)) {
            if (!strcmp(method, routes[i].method)) return 0;
            srv_fail(&e, 405, NULL, "method_not_allowed", NULL, "%s %s: this path takes %s.", method, url, routes[i].method);
            srv_route_error(out, &e);
            return 405;
        }
    srv_fail(&e, 404, NULL, "not_found", NULL, "Not found: %s %s", method, url);
    srv_route_error(out, &e);
    return 404;
}

/* Compares every byte whatever the first difference, so the time taken does not tell how much of a
 * guessed key was right. */
static int same_secret(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    unsigned char d = (unsigned char)(la != lb);
    for (size_t i = 0; i < lb; i++) d |= (unsigned char)(a[i < la ? i : 0] ^ b[i]);
    return d == 0;
}

int srv_route_auth(const srv_server *s, const char *url, const char *authorization, srv_route_result *out) {
    /* as vLLM: the /v1 API needs the key; /health, /metrics, /version, /tokenize and /detokenize do not */
    if (!s->cfg.api_key || strncmp(url, "/v1/", 4)) return 0;
    const char *prefix = "Bearer ";
    if (authorization && !strncmp(authorization, prefix, strlen(prefix)) &&
        same_secret(authorization + strlen(prefix), s->cfg.api_key))
        return 0;
    srv_error e;
    srv_fail(&e, 401, "authentication_error", "invalid_api_key", NULL,
             authorization ? "Incorrect API key provided." : "Missing API key: send 'Authorization: Bearer KEY'.");
    srv_route_error(out, &e);
    return 401;
}

static int model_check(const srv_server *s, const char *model, srv_error *e) {
    if (!model || !strcmp(model, s->model_name) || (s->cfg.model_dir && !strcmp(model, s->cfg.model_dir))) return 0;
    return srv_fail(e, 404, NULL, "model_not_found", "model", "The model `%s` does not exist.", model);
}

static int not_ready(srv_server *s, srv_error *e) {
    if (atomic_load(&s->draining))
        return srv_fail(e, 503, "server_error", NULL, NULL, "The server is shutting down.");
    if (!atomic_load(&s->ready)) return srv_fail(e, 503, "unavailable_error", NULL, NULL, "Loading model");
    return 0;
}

static int check_ids(const srv_server *s, const int32_t *ids, int n, const char *param, srv_error *e) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->vocab)
            return srv_fail(e, 400, NULL, NULL, param, "'%s' holds the token id %d, outside the vocabulary 0..%d.", param,
                            ids[i], s->vocab - 1);
    return 0;
}

/* ---- generation ---- */

static int prompt_ids(srv_server *s, srv_req *r, srv_error *e) {
    const srv_params *p = &r->p;
    r->n_prompts = p->kind == SRV_CHAT ? 1 : p->n_prompts;
    r->prompt_ids = calloc((size_t)r->n_prompts, sizeof *r->prompt_ids);
    r->prompt_len = calloc((size_t)r->n_prompts, sizeof *r->prompt_len);
    if (!r->prompt_ids || !r->prompt_len) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const k3c_tokenizer *tok = srv_text_tokenizer(s->text);
    for (int i = 0; i < r->n_prompts; i++) {
        k3c_tokens t = {0};
        if (p->kind == SRV_CHAT) {
            if (srv_text_chat_encode(s->text, p->chat_json, p->chat_json_len, &t, e)) {
                k3c_tokens_free(&t);
                return -1;
            }
        } else if (p->prompts[i].text) {
            /* Kimi's encode: special-token text is the special token */
            if (k3c_tokenizer_encode(tok, p->prompts[i].text, p->prompts[i].len, 1, &t) != K3C_OK) {
                k3c_tokens_free(&t);
                return srv_fail(e, 400, NULL, NULL, "prompt", "%s", k3c_last_error());
            }
        } else {
            if (check_ids(s, p->prompts[i].ids, p->prompts[i].n_ids, "prompt", e)) return -1;
            t.ids = malloc(sizeof *t.ids * (size_t)(p->prompts[i].n_ids ? p->prompts[i].n_ids : 1));
            if (!t.ids) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            memcpy(t.ids, p->prompts[i].ids, sizeof *t.ids * (size_t)p->prompts[i].n_ids);
            t.n = (size_t)p->prompts[i].n_ids;
        }
        r->prompt_ids[i] = t.ids;
        r->prompt_len[i] = (int)t.n;
        const char *param = p->kind == SRV_CHAT ? "messages" : "prompt";
        if (!t.n) return srv_fail(e, 400, NULL, NULL, param, "The prompt is empty (no tokens).");
        /* vLLM's rule: prompt + max_tokens within the context */
        if ((long)t.n >= s->max_context)
            return srv_fail(e, 400, NULL, "context_length_exceeded", param,
                            "This model's maximum context length is %d tokens. However, your %s has %zu input tokens. "
                            "Please reduce the length of the input.", s->max_context, param, t.n);
        if (p->max_tokens > 0 && (long)t.n + p->max_tokens > s->max_context)
            return srv_fail(e, 400, NULL, "context_length_exceeded", p->kind == SRV_CHAT ? "max_completion_tokens" : "max_tokens",
                            "This model's maximum context length is %d tokens. However, you requested %ld tokens (%zu in "
                            "the %s, %ld in the completion). Please reduce the length of the %s or the completion.",
                            s->max_context, (long)t.n + p->max_tokens, t.n, param, p->max_tokens, param);
    }
    return 0;
}

/* The chat turns before the last message, rendered on their own: when their ids begin the prompt, the next
 * turn of the conversation (or another request with the same system prompt) starts with them, and the
 * scheduler keeps a KDA snapshot where they end, so that request skips their prefill. */
static int chat_prefix_hint(srv_server *s, const srv_req *r) {
    int n = cJSON_GetArraySize(r->p.messages);
    if (n < 2) return 0;
    cJSON *req = cJSON_CreateObject();
    cJSON *head = cJSON_Duplicate(r->p.messages, 1);
    if (!req || !head) {
        cJSON_Delete(req);
        cJSON_Delete(head);
        return 0;
    }
    cJSON_DeleteItemFromArray(head, n - 1);
    cJSON_AddItemToObject(req, "messages", head);
    if (r->p.tools) cJSON_AddItemToObject(req, "tools", cJSON_Duplicate(r->p.tools, 1));
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(r->p.root, "tool_choice");
    if (tc) cJSON_AddItemToObject(req, "tool_choice", cJSON_Duplicate(tc, 1));
    cJSON_AddFalseToObject(req, "add_generation_prompt");
    cJSON *kw = cJSON_AddObjectToObject(req, "chat_template_kwargs");
    cJSON_AddBoolToObject(kw, "thinking", !r->p.no_thinking);
    if (r->p.thinking_effort) cJSON_AddStringToObject(kw, "thinking_effort", r->p.thinking_effort);
    char *json = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    k3c_tokens t = {0};
    srv_error e;
    int hint = 0;
    /* a number in a tool schema printed differently than sent renders other text: then no hint */
    if (json && !srv_text_chat_encode(s->text, json, strlen(json), &t, &e) && t.n <= (size_t)r->prompt_len[0] &&
        !memcmp(t.ids, r->prompt_ids[0], t.n * sizeof *t.ids))
        hint = (int)t.n;
    k3c_tokens_free(&t);
    cJSON_free(json);
    return hint;
}

/* The stop ids given to the scheduler: the request's, and unless ignore_eos the tokenizer's eos and (chat)
 * the format's end-of-message tokens. */
static int stop_ids(srv_server *s, srv_req *r, srv_error *e) {
    int n_end = 0;
    const int32_t *end = srv_text_end_ids(s->text, &n_end);
    int cap = r->p.n_stop_token_ids + n_end + 1;
    r->stop_ids = malloc(sizeof *r->stop_ids * (size_t)cap);
    if (!r->stop_ids) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 0; i < r->p.n_stop_token_ids; i++) r->stop_ids[r->n_stop_ids++] = r->p.stop_token_ids[i];
    if (!r->p.ignore_eos) {
        int32_t eos = k3c_tokenizer_eos(srv_text_tokenizer(s->text));
        if (eos >= 0 && eos < s->vocab) r->stop_ids[r->n_stop_ids++] = eos;
        if (r->p.kind == SRV_CHAT)
            for (int i = 0; i < n_end; i++)
                if (end[i] != eos && end[i] < s->vocab) r->stop_ids[r->n_stop_ids++] = end[i];
    }
    return 0;
}

/* A seed for a request that gave none: distinct per request and per server start. */
static uint64_t fresh_seed(srv_server *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ (atomic_fetch_add(&s->next_id, 1) << 32);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static void generation(srv_server *s, srv_kind kind, const char *body, size_t len, srv_route_result *out) {
    srv_error e;
    srv_params p;
    if (not_ready(s, &e)) goto refuse;
    if (srv_parse_request(kind, body, len, &p, &e)) goto refuse;
    if (model_check(s, p.model, &e) || check_ids(s, p.stop_token_ids, p.n_stop_token_ids, "stop_token_ids", &e)) {
        srv_params_free(&p);
        goto refuse;
    }
    srv_req *r = srv_req_new(s, &p);
    if (!r) {
        srv_params_free(&p);
        srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto refuse;
    }
    if (prompt_ids(s, r, &e) || stop_ids(s, r, &e)) goto fail;
    /* constrained decoding: tool_choice required / named, response_format json */
    if (r->p.kind == SRV_CHAT &&
        (r->p.tool_choice == SRV_TOOLS_REQUIRED || r->p.tool_choice == SRV_TOOLS_NAMED || r->p.json_output) &&
        srv_text_grammar(s->text, r->p.chat_json, r->p.chat_json_len, &r->grammar, &e))
        goto fail;
    r->prefix_hint = r->p.kind == SRV_CHAT ? chat_prefix_hint(s, r) : 0;
    r->n_choices = r->n_prompts * r->p.n;
    r->choices = calloc((size_t)r->n_choices, sizeof *r->choices);
    if (!r->choices) {
        srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    for (int i = 0; i < r->n_choices; i++) {
        srv_choice *c = &r->choices[i];
        c->index = i;
        c->prompt = i / r->p.n;
        if (srv_choice_init(r, c)) {
            srv_fail(&e, 500, "server_error", NULL, NULL, "out of memory");
            goto fail;
        }
    }
    if (r->p.stream) srv_req_stream_start(r, &r->out);
    uint64_t seed = r->p.has_seed ? r->p.seed : fresh_seed(s);
    /* every choice's reference and open count, taken before the first submit: the scheduler may finish a
     * choice before the next one is submitted, and the request must not look complete then */
    pthread_mutex_lock(&r->mu);
    r->refs += r->n_choices;
    r->n_open += r->n_choices;
    pthread_mutex_unlock(&r->mu);
    for (int i = 0; i < r->n_choices; i++) {
        srv_choice *c = &r->choices[i];
        int np = r->prompt_len[c->prompt];
        k3c_sched_request q = {
            .prompt = r->prompt_ids[c->prompt],
            .n_prompt = np,
            .max_new = (int)(r->p.max_tokens > 0 ? r->p.max_tokens : s->max_context - np),
            .sampling = {
                /* sample j of a prompt: seed + j, so the n samples differ and a seeded request repeats */
                .base = {.temperature = r->p.temperature, .top_k = r->p.top_k, .top_p = r->p.top_p,
                         .seed = seed + (uint64_t)(i % r->p.n)},
                .min_p = r->p.min_p,
                .presence_penalty = r->p.presence_penalty,
                .frequency_penalty = r->p.frequency_penalty,
                .repetition_penalty = r->p.repetition_penalty,
                .logprobs = r->p.logprobs ? r->p.top_logprobs + 1 : 0,
            },
            .stop_ids = r->stop_ids,
            .n_stop_ids = r->n_stop_ids,
            .ignore_eos = r->p.ignore_eos,
            .priority = r->p.priority,
            /* the n samples of a prompt share all of it */
            .prefix_hint = r->p.kind == SRV_CHAT && r->p.n == 1 ? r->prefix_hint : r->p.n > 1 ? np : 0,
            .grammar = r->grammar,
            .user = c,
        };
        uint64_t id = 0;
        int rc = k3c_scheduler_submit(s->sched, &q, &id);
        if (rc != 0) {
            /* this choice and the later ones will never be submitted (the request is answered with the
             * error; the earlier choices are aborted below) */
            pthread_mutex_lock(&r->mu);
            r->refs -= r->n_choices - i;
            r->n_open -= r->n_choices - i;
            pthread_mutex_unlock(&r->mu);
            if (rc == 1) {
                srv_metrics_count(&s->metrics, &s->metrics.rejected_queue_full);
                srv_fail(&e, 429, "rate_limit_exceeded", "queue_full", NULL,
                         "The server's queue is full (%d waiting requests); retry later.", s->cfg.max_queue);
            } else if (k3c_last_error_kind() == K3C_ERROR_INPUT) {
                srv_fail(&e, 400, NULL, NULL, NULL, "%s", k3c_last_error());
            } else {
                srv_fail(&e, 500, "server_error", NULL, NULL, "%s", k3c_last_error());
            }
            goto fail;
        }
        c->sched_id = id;
        c->submitted = 1;
    }
    srv_metrics_request(&s->metrics, r->p.n, r->p.max_tokens > 0 ? r->p.max_tokens : s->max_context);
    out->req = r;
    return;
fail:
    srv_req_abandon(r);
    srv_req_unref(r);
refuse:
    if (e.status == 400 || e.status == 404) srv_metrics_count(&s->metrics, &s->metrics.rejected_invalid);
    srv_route_error(out, &e);
}

/* ---- the other endpoints ---- */

static void models(srv_server *s, srv_route_result *out) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)time(NULL));
    cJSON_AddStringToObject(m, "owned_by", "k3c");
    cJSON_AddStringToObject(m, "root", s->cfg.model_dir ? s->cfg.model_dir : s->model_name);
    cJSON_AddNullToObject(m, "parent");
    cJSON_AddNumberToObject(m, "max_model_len", s->max_context);
    cJSON_AddItemToArray(data, m);
    json_out(out, 200, root);
}

static void health(srv_server *s, srv_route_result *out) {
    srv_error e;
    if (!atomic_load(&s->ready)) {
        not_ready(s, &e);
        srv_route_error(out, &e);
        return;
    }
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "status", "ok");
    json_out(out, 200, root);
}

static void metrics(srv_server *s, srv_route_result *out) {
    srv_sched_gauges g = {0};
    if (atomic_load(&s->ready)) srv_engine_gauges(s, &g);
    srv_buf b = {0};
    srv_metrics_render(&s->metrics, &g, s->model_name[0] ? s->model_name : "loading", &b);
    out->status = 200;
    out->body = srv_buf_take(&b, &out->body_len);
    out->content_type = "text/plain; version=0.0.4; charset=utf-8";
}

static void tokenize(srv_server *s, const char *body, size_t len, int detok, srv_route_result *out) {
    srv_error e;
    srv_tokenize_params p;
    if (!atomic_load(&s->ready)) {
        not_ready(s, &e);
        srv_route_error(out, &e);
        return;
    }
    if (srv_parse_tokenize(body, len, detok, &p, &e) || model_check(s, p.model, &e)) goto fail;
    const k3c_tokenizer *tok = srv_text_tokenizer(s->text);
    cJSON *root = cJSON_CreateObject();
    if (detok) {
        if (check_ids(s, p.tokens, p.n_tokens, "tokens", &e)) {
            cJSON_Delete(root);
            goto fail;
        }
        char *text = NULL;
        size_t n = 0;
        if (k3c_tokenizer_decode(tok, p.tokens, (size_t)p.n_tokens, &text, &n) != K3C_OK) {
            cJSON_Delete(root);
            srv_fail(&e, 400, NULL, NULL, "tokens", "%s", k3c_last_error());
            goto fail;
        }
        cJSON_AddItemToObject(root, "prompt", srv_json_text(text, n));
        free(text);
    } else {
        k3c_tokens t = {0};
        int rc = p.prompt ? (k3c_tokenizer_encode(tok, p.prompt, p.prompt_len, 1, &t) == K3C_OK
                                 ? 0
                                 : srv_fail(&e, 400, NULL, NULL, "prompt", "%s", k3c_last_error()))
                          : srv_text_chat_encode(s->text, body, len, &t, &e);
        if (rc) {
            k3c_tokens_free(&t);
            cJSON_Delete(root);
            goto fail;
        }
        cJSON_AddNumberToObject(root, "count", (double)t.n);
        cJSON_AddNumberToObject(root, "max_model_len", s->max_context);
        cJSON *ids = cJSON_AddArrayToObject(root, "tokens");
        for (size_t i = 0; i < t.n; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(t.ids[i]));
        cJSON_AddNullToObject(root, "token_strs");
        k3c_tokens_free(&t);
    }
    srv_tokenize_params_free(&p);
    json_out(out, 200, root);
    return;
fail:
    srv_tokenize_params_free(&p);
    srv_route_error(out, &e);
}

void srv_route(srv_server *s, const char *method, const char *url, const char *body, size_t len,
               srv_route_result *out) {
    memset(out, 0, sizeof *out);
    srv_metrics_count(&s->metrics, &s->metrics.http_requests);
    if (srv_route_check(method, url, out)) return;
    if (!strcmp(url, "/v1/chat/completions")) generation(s, SRV_CHAT, body, len, out);
    else if (!strcmp(url, "/v1/completions")) generation(s, SRV_COMPLETION, body, len, out);
    else if (!strcmp(url, "/v1/models")) models(s, out);
    else if (!strcmp(url, "/health")) health(s, out);
    else if (!strcmp(url, "/metrics")) metrics(s, out);
    else if (!strcmp(url, "/tokenize")) tokenize(s, body, len, 0, out);
    else if (!strcmp(url, "/detokenize")) tokenize(s, body, len, 1, out);
    else {
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "version", k3c_version());
        json_out(out, 200, root);
    }
}
