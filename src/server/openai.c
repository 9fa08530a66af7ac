/* OpenAI request bodies -> srv_params: every field type- and range-checked, unknown fields refused (as the
 * OpenAI API refuses them: "Unrecognized request argument supplied"), duplicate keys refused (Python's json
 * keeps the last, cJSON finds the first: neither guess is safe). vLLM's sampling extras are accepted under
 * their vLLM names. */
#include "server/openai.h"

#include "server/buf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int srv_fail(srv_error *e, int status, const char *type, const char *code, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type ? type : "invalid_request_error";
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *srv_error_json(const srv_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddItemToObject(err, "message", srv_json_text(e->message, strlen(e->message)));
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0]) cJSON_AddItemToObject(err, "param", srv_json_text(e->param, strlen(e->param)));
    else cJSON_AddNullToObject(err, "param");
    if (e->code) cJSON_AddStringToObject(err, "code", e->code);
    else cJSON_AddNumberToObject(err, "code", e->status);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* ---- field helpers: absent or null = default; anything else must have the right type and range ---- */

static const char *type_name(const cJSON *v) {
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

static int bad_type(srv_error *e, const char *name, const char *want, const cJSON *v) {
    return srv_fail(e, 400, NULL, NULL, name, "Invalid type for '%s': expected %s, but got %s instead.", name, want,
                    type_name(v));
}

static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static int get_bool(const cJSON *o, const char *name, int *out, srv_error *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsBool(v)) return bad_type(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int get_num(const cJSON *o, const char *name, double lo, double hi, int lo_open, float *out, srv_error *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsNumber(v)) return bad_type(e, name, "a number", v);
    double x = v->valuedouble;
    if (!isfinite(x) || (lo_open ? !(x > lo) : !(x >= lo)) || !(x <= hi))
        return srv_fail(e, 400, NULL, NULL, name, "'%s' is %g: expected a number in %s%g, %g].", name, x,
                        lo_open ? "(" : "[", lo, hi);
    *out = (float)x;
    return 0;
}

static int int_value(const cJSON *v, const char *name, double lo, double hi, double *out, srv_error *e) {
    if (!cJSON_IsNumber(v)) return bad_type(e, name, "an integer", v);
    double x = v->valuedouble;
    if (!isfinite(x) || x != floor(x)) return srv_fail(e, 400, NULL, NULL, name, "'%s' is %g: expected an integer.", name, x);
    if (x < lo || x > hi)
        return srv_fail(e, 400, NULL, NULL, name, "'%s' is %.0f: expected an integer in %.0f..%.0f.", name, x, lo, hi);
    *out = x;
    return 0;
}

static int get_long(const cJSON *o, const char *name, long lo, long hi, long *out, srv_error *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    double x;
    if (int_value(v, name, (double)lo, (double)hi, &x, e)) return -1;
    *out = (long)x;
    return 0;
}

static int get_int(const cJSON *o, const char *name, int lo, int hi, int *out, srv_error *e) {
    long l = *out;
    if (get_long(o, name, lo, hi, &l, e)) return -1;
    *out = (int)l;
    return 0;
}

static int get_string(const cJSON *o, const char *name, const char **out, srv_error *e) {
    const cJSON *v = field(o, name);
    if (!v) return 0;
    if (!cJSON_IsString(v)) return bad_type(e, name, "a string", v);
    *out = v->valuestring;
    return 0;
}

static int get_ids(const cJSON *v, const char *name, int max, int32_t **ids, int *n, srv_error *e) {
    if (!cJSON_IsArray(v)) return bad_type(e, name, "an array of token ids", v);
    int cnt = cJSON_GetArraySize(v);
    if (cnt > max) return srv_fail(e, 400, NULL, NULL, name, "'%s' has %d ids: at most %d.", name, cnt, max);
    int32_t *out = malloc(sizeof *out * (size_t)(cnt ? cnt : 1));
    if (!out) return srv_fail(e, 500, "server_error", NULL, name, "out of memory reading '%s'", name);
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        double x;
        if (int_value(it, name, 0, INT32_MAX, &x, e)) {
            free(out);
            return -1;
        }
        out[i++] = (int32_t)x;
    }
    *ids = out;
    *n = cnt;
    return 0;
}

/* ---- which fields exist ---- */

static const char *const common_fields[] = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n", "stop", "seed",
    "presence_penalty", "frequency_penalty", "logprobs", "user", "logit_bias",
    /* vLLM's extras */
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "include_stop_str_in_output",
    "skip_special_tokens", "priority", NULL};
static const char *const chat_fields[] = {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "reasoning_effort", "metadata", "store", "service_tier",
    /* vLLM's extras */
    "chat_template_kwargs", "add_generation_prompt", NULL};
static const char *const completion_fields[] = {"prompt", "echo", "suffix", "best_of", NULL};

static int in_list(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

static int check_fields(const cJSON *root, srv_kind kind, srv_error *e) {
    const cJSON *a;
    cJSON_ArrayForEach(a, root) {
        const char *k = a->string;
        if (!in_list(common_fields, k) && !in_list(kind == SRV_CHAT ? chat_fields : completion_fields, k))
            return srv_fail(e, 400, NULL, NULL, k, "Unrecognized request argument supplied: %s", k);
        for (const cJSON *b = a->next; b; b = b->next)
            if (!strcmp(b->string, k))
                return srv_fail(e, 400, NULL, NULL, k, "'%s' appears more than once in the request body.", k);
    }
    return 0;
}

/* ---- parts ---- */

static int parse_stop(const cJSON *root, srv_params *p, srv_error *e) {
    const cJSON *v = field(root, "stop");
    if (!v) return 0;
    int cnt = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (cnt < 0) return bad_type(e, "stop", "a string or an array of strings", v);
    if (cnt > SRV_MAX_STOP)
        return srv_fail(e, 400, NULL, NULL, "stop", "'stop' has %d strings: at most %d.", cnt, SRV_MAX_STOP);
    if (!cnt) return 0;
    p->stop = malloc(sizeof *p->stop * (size_t)cnt);
    if (!p->stop) return srv_fail(e, 500, "server_error", NULL, "stop", "out of memory");
    const cJSON *it = cJSON_IsString(v) ? v : v->child;
    for (int i = 0; i < cnt; i++, it = it->next) {
        if (!cJSON_IsString(it)) return bad_type(e, "stop", "a string or an array of strings", it);
        if (!it->valuestring[0]) return srv_fail(e, 400, NULL, NULL, "stop", "'stop' holds an empty string.");
        p->stop[p->n_stop++] = it->valuestring;
    }
    return 0;
}

static int parse_stream_options(const cJSON *root, srv_params *p, srv_error *e) {
    const cJSON *so = field(root, "stream_options");
    if (!so) return 0;
    if (!cJSON_IsObject(so)) return bad_type(e, "stream_options", "an object", so);
    if (!p->stream)
        return srv_fail(e, 400, NULL, NULL, "stream_options", "'stream_options' is only allowed when 'stream' is true.");
    const cJSON *a;
    cJSON_ArrayForEach(a, so) if (strcmp(a->string, "include_usage") && strcmp(a->string, "continuous_usage_stats"))
        return srv_fail(e, 400, NULL, NULL, "stream_options", "Unrecognized stream_options argument: %s", a->string);
    if (get_bool(so, "include_usage", &p->include_usage, e)) return -1;
    if (get_bool(so, "continuous_usage_stats", &p->continuous_usage, e)) return -1;
    return 0;
}

static int tool_name_of(const cJSON *t, const char **name) {
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *nm = cJSON_IsObject(fn) ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
    if (!cJSON_IsString(nm) || !nm->valuestring[0]) return -1;
    *name = nm->valuestring;
    return 0;
}

static int parse_tools(const cJSON *root, srv_params *p, srv_error *e) {
    const cJSON *tools = field(root, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return bad_type(e, "tools", "an array", tools);
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type");
            const char *name;
            if (!cJSON_IsObject(t) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "function") ||
                tool_name_of(t, &name))
                return srv_fail(e, 400, NULL, NULL, "tools",
                                "tools[%d] is not {\"type\": \"function\", \"function\": {\"name\": ...}}.", i);
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"),
                                                                   "parameters");
            if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
                return srv_fail(e, 400, NULL, NULL, "tools", "tools[%d].function.parameters is not an object.", i);
            i++;
        }
        if (i) p->tools = tools;
    }
    const cJSON *tc = field(root, "tool_choice");
    if (!tc) return 0;
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "none")) p->tool_choice = SRV_TOOLS_NONE;
        else if (!strcmp(s, "auto")) p->tool_choice = SRV_TOOLS_AUTO;
        else if (!strcmp(s, "required")) p->tool_choice = SRV_TOOLS_REQUIRED;
        else
            return srv_fail(e, 400, NULL, NULL, "tool_choice",
                            "'tool_choice' is '%s': expected none, auto, required or a named function.", s);
    } else if (cJSON_IsObject(tc)) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(tc, "type");
        const char *name;
        if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || tool_name_of(tc, &name))
            return srv_fail(e, 400, NULL, NULL, "tool_choice",
                            "'tool_choice' is not {\"type\": \"function\", \"function\": {\"name\": ...}}.");
        p->tool_choice = SRV_TOOLS_NAMED;
        p->tool_name = name;
    } else {
        return bad_type(e, "tool_choice", "a string or an object", tc);
    }
    if ((p->tool_choice == SRV_TOOLS_REQUIRED || p->tool_choice == SRV_TOOLS_NAMED) && !p->tools)
        return srv_fail(e, 400, NULL, NULL, "tool_choice", "'tool_choice' %s needs 'tools'.",
                        p->tool_choice == SRV_TOOLS_REQUIRED ? "required" : "naming a function");
    if (p->tool_choice == SRV_TOOLS_NAMED) {
        const cJSON *t;
        cJSON_ArrayForEach(t, p->tools) {
            const char *name;
            if (!tool_name_of(t, &name) && !strcmp(name, p->tool_name)) return 0;
        }
        return srv_fail(e, 400, NULL, NULL, "tool_choice", "'tool_choice' names the function '%s', which 'tools' does not have.",
                        p->tool_name);
    }
    return 0;
}

/* response_format's shape (OpenAI's): {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
 * "json_schema": {"name", "description", "schema", "strict"}}. What a schema asks is checked where the grammar
 * is built (server/text.c: a keyword k3c cannot enforce is a 400 there). */
static int parse_response_format(const cJSON *root, srv_params *p, srv_error *e) {
    const cJSON *rf = field(root, "response_format");
    if (!rf) return 0;
    const cJSON *ty = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (!cJSON_IsString(ty)) return bad_type(e, "response_format", "an object with a string 'type'", rf);
    const char *t = ty->valuestring;
    if (strcmp(t, "text") && strcmp(t, "json_object") && strcmp(t, "json_schema"))
        return srv_fail(e, 400, NULL, NULL, "response_format",
                        "response_format '%s' is not supported: expected text, json_object or json_schema.", t);
    const cJSON *a;
    cJSON_ArrayForEach(a, rf) if (strcmp(a->string, "type") && (strcmp(t, "json_schema") || strcmp(a->string, "json_schema")))
        return srv_fail(e, 400, NULL, NULL, "response_format", "Unrecognized response_format argument: %s", a->string);
    p->json_output = strcmp(t, "text") != 0;
    if (strcmp(t, "json_schema")) return 0;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return srv_fail(e, 400, NULL, NULL, "response_format",
                        "response_format json_schema needs 'json_schema': {\"name\": ..., \"schema\": {...}}.");
    cJSON_ArrayForEach(a, js) {
        const char *k = a->string;
        if (strcmp(k, "name") && strcmp(k, "description") && strcmp(k, "schema") && strcmp(k, "strict"))
            return srv_fail(e, 400, NULL, NULL, "response_format", "Unrecognized json_schema argument: %s", k);
        if ((!strcmp(k, "name") || !strcmp(k, "description")) && !cJSON_IsString(a))
            return bad_type(e, "response_format", "a string for json_schema.name and .description", a);
        if (!strcmp(k, "strict") && !cJSON_IsBool(a) && !cJSON_IsNull(a))
            return bad_type(e, "response_format", "a boolean for json_schema.strict", a);
        if (!strcmp(k, "schema") && !cJSON_IsObject(a))
            return bad_type(e, "response_format", "an object for json_schema.schema", a);
    }
    if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(js, "name")))
        return srv_fail(e, 400, NULL, NULL, "response_format", "response_format json_schema needs a 'name'.");
    return 0;
}

/* reasoning_effort (OpenAI) and chat_template_kwargs (vLLM) -> the chat formats' thinking switches. K3 has
 * three efforts: OpenAI's low stays low, medium becomes high, high and xhigh become max; none and minimal
 * turn thinking off. */
static int parse_thinking(const cJSON *root, srv_params *p, srv_error *e) {
    const char *eff = NULL;
    if (get_string(root, "reasoning_effort", &eff, e)) return -1;
    if (eff) {
        p->thinking_given = 1;
        if (!strcmp(eff, "none") || !strcmp(eff, "minimal")) p->no_thinking = 1;
        else if (!strcmp(eff, "low")) p->thinking_effort = "low";
        else if (!strcmp(eff, "medium")) p->thinking_effort = "high";
        else if (!strcmp(eff, "high") || !strcmp(eff, "xhigh")) p->thinking_effort = "max";
        else
            return srv_fail(e, 400, NULL, NULL, "reasoning_effort",
                            "'reasoning_effort' is '%s': expected none, minimal, low, medium, high or xhigh.", eff);
    }
    const cJSON *kw = field(root, "chat_template_kwargs");
    if (!kw) return 0;
    if (!cJSON_IsObject(kw)) return bad_type(e, "chat_template_kwargs", "an object", kw);
    const cJSON *a;
    cJSON_ArrayForEach(a, kw) {
        const char *k = a->string;
        if (!strcmp(k, "thinking") || !strcmp(k, "enable_thinking")) {
            int on = 1;
            if (get_bool(kw, k, &on, e)) return -1;
            p->no_thinking = !on;
            p->thinking_given = 1;
        } else if (!strcmp(k, "thinking_effort")) {
            const char *s = NULL;
            if (get_string(kw, k, &s, e)) return -1;
            if (s && strcmp(s, "low") && strcmp(s, "high") && strcmp(s, "max"))
                return srv_fail(e, 400, NULL, NULL, "chat_template_kwargs",
                                "chat_template_kwargs.thinking_effort is '%s': expected low, high or max.", s);
            p->thinking_effort = s;
            p->thinking_given = 1;
        } else {
            return srv_fail(e, 400, NULL, NULL, "chat_template_kwargs",
                            "chat_template_kwargs.%s is not a switch of k3c's chat formats (thinking, "
                            "enable_thinking, thinking_effort).", k);
        }
    }
    return 0;
}

static int parse_chat(const cJSON *root, srv_params *p, srv_error *e) {
    const cJSON *m = field(root, "messages");
    if (!m) return srv_fail(e, 400, NULL, NULL, "messages", "Missing required parameter: 'messages'.");
    if (!cJSON_IsArray(m)) return bad_type(e, "messages", "an array", m);
    if (!cJSON_GetArraySize(m)) return srv_fail(e, 400, NULL, NULL, "messages", "'messages' is empty.");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, m) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsObject(it) || !cJSON_IsString(role))
            return srv_fail(e, 400, NULL, NULL, "messages", "messages[%d] is not an object with a string 'role'.", i);
        i++;
    }
    p->messages = m;
    if (get_long(root, "max_completion_tokens", 1, 1L << 30, &p->max_tokens, e)) return -1;
    const cJSON *lp = field(root, "logprobs");
    if (lp && !cJSON_IsBool(lp)) return bad_type(e, "logprobs", "a boolean", lp);
    p->logprobs = lp && cJSON_IsTrue(lp);
    if (field(root, "top_logprobs")) {
        if (get_int(root, "top_logprobs", 0, SRV_MAX_TOP_LOGPROBS, &p->top_logprobs, e)) return -1;
        if (!p->logprobs)
            return srv_fail(e, 400, NULL, NULL, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true.");
    }
    if (parse_tools(root, p, e)) return -1;
    if (parse_response_format(root, p, e)) return -1;
    int ignored = 0;
    if (get_bool(root, "parallel_tool_calls", &ignored, e) || get_bool(root, "store", &ignored, e)) return -1;
    const char *s = NULL;
    if (get_string(root, "service_tier", &s, e)) return -1;
    const cJSON *md = field(root, "metadata");
    if (md && !cJSON_IsObject(md)) return bad_type(e, "metadata", "an object", md);
    p->add_generation_prompt = 1;
    if (get_bool(root, "add_generation_prompt", &p->add_generation_prompt, e)) return -1;
    return parse_thinking(root, p, e);
}

static int parse_prompts(const cJSON *root, srv_params *p, srv_error *e) {
    const cJSON *v = field(root, "prompt");
    if (!v) return srv_fail(e, 400, NULL, NULL, "prompt", "Missing required parameter: 'prompt'.");
    const char *want = "a string, an array of strings, an array of token ids or an array of such arrays";
    int cnt;
    const cJSON *first;
    if (cJSON_IsString(v)) {
        cnt = 1;
        first = v;
    } else if (cJSON_IsArray(v)) {
        cnt = cJSON_GetArraySize(v);
        if (!cnt) return srv_fail(e, 400, NULL, NULL, "prompt", "'prompt' is empty.");
        /* an array of numbers is one prompt of ids */
        if (cJSON_IsNumber(v->child)) cnt = 1, first = v;
        else first = v->child;
    } else {
        return bad_type(e, "prompt", want, v);
    }
    if (cnt > SRV_MAX_PROMPTS)
        return srv_fail(e, 400, NULL, NULL, "prompt", "'prompt' holds %d prompts: at most %d.", cnt, SRV_MAX_PROMPTS);
    p->prompts = calloc((size_t)cnt, sizeof *p->prompts);
    if (!p->prompts) return srv_fail(e, 500, "server_error", NULL, "prompt", "out of memory");
    const cJSON *it = first;
    for (int i = 0; i < cnt; i++, it = it->next) {
        srv_prompt *q = &p->prompts[p->n_prompts++];
        if (cJSON_IsString(it)) {
            q->text = it->valuestring;
            q->len = strlen(it->valuestring);
        } else if (cJSON_IsArray(it)) {
            if (get_ids(it, "prompt", 1 << 24, &q->ids, &q->n_ids, e)) return -1;
        } else {
            return bad_type(e, "prompt", want, it);
        }
    }
    const cJSON *lp = field(root, "logprobs");
    if (lp) {
        if (get_int(root, "logprobs", 0, SRV_MAX_TOP_LOGPROBS, &p->top_logprobs, e)) return -1;
        p->logprobs = 1;
    }
    if (get_bool(root, "echo", &p->echo, e)) return -1;
    if (p->echo && p->logprobs)
        return srv_fail(e, 400, NULL, NULL, "echo", "'echo' with 'logprobs' is not supported (it needs the prompt's logprobs).");
    const cJSON *sfx = field(root, "suffix");
    if (sfx && (!cJSON_IsString(sfx) || sfx->valuestring[0]))
        return srv_fail(e, 400, NULL, NULL, "suffix", "'suffix' is not supported.");
    long best_of = p->n;
    if (get_long(root, "best_of", 1, SRV_MAX_N, &best_of, e)) return -1;
    if (best_of != p->n)
        return srv_fail(e, 400, NULL, NULL, "best_of", "'best_of' %ld differs from 'n' %d: not supported.", best_of, p->n);
    return 0;
}

static int parse_body(const char *body, size_t len, cJSON **root, srv_error *e) {
    *root = NULL;
    /* a raw NUL cannot be in JSON text; cJSON would stop there and take the prefix */
    if (!len || memchr(body, 0, len))
        return srv_fail(e, 400, NULL, NULL, NULL, "The request body is not valid JSON%s.", len ? " (it holds a NUL byte)" : " (it is empty)");
    char *copy = malloc(len + 1);
    if (!copy) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory reading the request body");
    memcpy(copy, body, len);
    copy[len] = 0;
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts(copy, len + 1, &end, 1);
    size_t at = end ? (size_t)(end - copy) : 0;
    free(copy);
    if (!r) return srv_fail(e, 400, NULL, NULL, NULL, "The request body is not valid JSON (at byte %zu).", at);
    if (!cJSON_IsObject(r)) {
        cJSON_Delete(r);
        return srv_fail(e, 400, NULL, NULL, NULL, "The request body must be a JSON object.");
    }
    *root = r;
    return 0;
}

/* The body for k3c_chat_encode / k3c_chat_parser_create, which read the thinking switches from
 * chat_template_kwargs only: the effective ones are appended as the object's last member (a duplicate key's
 * last value wins in the chat API's JSON reader), the text before them kept byte for byte (numbers keep
 * their spelling in tool schemas). */
static int chat_json(const char *body, size_t len, srv_params *p, srv_error *e) {
    size_t end = len;
    while (end > 0 && body[end - 1] != '}') end--;
    srv_buf b = {0};
    if (!p->thinking_given || !end) {
        srv_buf_put(&b, body, len);
    } else {
        srv_buf_put(&b, body, end - 1);
        srv_buf_printf(&b, ",\"chat_template_kwargs\":{\"thinking\":%s", p->no_thinking ? "false" : "true");
        if (p->thinking_effort) srv_buf_printf(&b, ",\"thinking_effort\":\"%s\"", p->thinking_effort);
        srv_buf_puts(&b, "}}");
    }
    p->chat_json = srv_buf_take(&b, &p->chat_json_len);
    if (!p->chat_json) return srv_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return 0;
}

int srv_parse_request(srv_kind kind, const char *body, size_t len, srv_params *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->kind = kind;
    p->max_tokens = -1;
    p->temperature = 1;
    p->top_p = 1;
    p->repetition_penalty = 1;
    p->n = 1;
    p->skip_special_tokens = 1;
    if (parse_body(body, len, &p->root, e)) return -1;
    const cJSON *root = p->root;
    if (check_fields(root, kind, e)) goto fail;
    if (get_string(root, "model", &p->model, e)) goto fail;
    if (get_bool(root, "stream", &p->stream, e) || parse_stream_options(root, p, e)) goto fail;
    if (get_long(root, "max_tokens", 1, 1L << 30, &p->max_tokens, e)) goto fail;
    if (get_num(root, "temperature", 0, 1e6, 0, &p->temperature, e)) goto fail;
    if (get_num(root, "top_p", 0, 1, 1, &p->top_p, e)) goto fail;
    if (get_num(root, "min_p", 0, 1, 0, &p->min_p, e)) goto fail;
    if (get_num(root, "presence_penalty", -2, 2, 0, &p->presence_penalty, e)) goto fail;
    if (get_num(root, "frequency_penalty", -2, 2, 0, &p->frequency_penalty, e)) goto fail;
    if (get_num(root, "repetition_penalty", 0, 100, 1, &p->repetition_penalty, e)) goto fail;
    p->top_k = 0;
    if (get_int(root, "top_k", -1, 1 << 30, &p->top_k, e)) goto fail;
    if (p->top_k < 0) p->top_k = 0; /* vLLM's -1: off */
    if (get_int(root, "n", 1, SRV_MAX_N, &p->n, e)) goto fail;
    const cJSON *seed = field(root, "seed");
    if (seed) {
        double x;
        /* int64 like vLLM; a negative seed is its two's complement */
        if (int_value(seed, "seed", -9223372036854775808.0, 9223372036854775807.0, &x, e)) goto fail;
        p->has_seed = 1;
        p->seed = x < 0 ? (uint64_t)(int64_t)x : (uint64_t)x;
    }
    if (parse_stop(root, p, e)) goto fail;
    const cJSON *sti = field(root, "stop_token_ids");
    if (sti && get_ids(sti, "stop_token_ids", 256, &p->stop_token_ids, &p->n_stop_token_ids, e)) goto fail;
    if (get_bool(root, "ignore_eos", &p->ignore_eos, e)) goto fail;
    if (get_bool(root, "include_stop_str_in_output", &p->include_stop_str, e)) goto fail;
    if (get_bool(root, "skip_special_tokens", &p->skip_special_tokens, e)) goto fail;
    if (get_int(root, "priority", -1000000, 1000000, &p->priority, e)) goto fail;
    const char *user = NULL;
    if (get_string(root, "user", &user, e)) goto fail;
    const cJSON *lb = field(root, "logit_bias");
    if (lb && (!cJSON_IsObject(lb) || lb->child)) {
        srv_fail(e, 400, NULL, NULL, "logit_bias", "'logit_bias' is not supported.");
        goto fail;
    }
    if (kind == SRV_CHAT ? parse_chat(root, p, e) : parse_prompts(root, p, e)) goto fail;
    if (kind == SRV_CHAT && chat_json(body, len, p, e)) goto fail;
    return 0;
fail:
    srv_params_free(p);
    return -1;
}

void srv_params_free(srv_params *p) {
    if (!p) return;
    for (int i = 0; i < p->n_prompts; i++) free(p->prompts[i].ids);
    free(p->prompts);
    free(p->stop);
    free(p->stop_token_ids);
    free(p->chat_json);
    cJSON_Delete(p->root);
    memset(p, 0, sizeof *p);
}

int srv_parse_tokenize(const char *body, size_t len, int detokenize, srv_tokenize_params *p, srv_error *e) {
    memset(p, 0, sizeof *p);
    p->add_special_tokens = 1;
    p->add_generation_prompt = 1;
    if (parse_body(body, len, &p->root, e)) return -1;
    const cJSON *root = p->root, *a;
    static const char *const tok_fields[] = {"model", "prompt", "messages", "tools", "add_special_tokens",
                                             "add_generation_prompt", NULL};
    static const char *const detok_fields[] = {"model", "tokens", NULL};
    cJSON_ArrayForEach(a, root) if (!in_list(detokenize ? detok_fields : tok_fields, a->string)) {
        srv_fail(e, 400, NULL, NULL, a->string, "Unrecognized request argument supplied: %s", a->string);
        goto fail;
    }
    if (get_string(root, "model", &p->model, e)) goto fail;
    if (detokenize) {
        const cJSON *t = field(root, "tokens");
        if (!t) {
            srv_fail(e, 400, NULL, NULL, "tokens", "Missing required parameter: 'tokens'.");
            goto fail;
        }
        if (get_ids(t, "tokens", 1 << 24, &p->tokens, &p->n_tokens, e)) goto fail;
        return 0;
    }
    const cJSON *pr = field(root, "prompt"), *m = field(root, "messages");
    if (!!pr == !!m) {
        srv_fail(e, 400, NULL, NULL, pr ? "messages" : "prompt", "Give exactly one of 'prompt' and 'messages'.");
        goto fail;
    }
    if (pr) {
        if (!cJSON_IsString(pr)) {
            bad_type(e, "prompt", "a string", pr);
            goto fail;
        }
        p->prompt = pr->valuestring;
        p->prompt_len = strlen(pr->valuestring);
    } else {
        if (!cJSON_IsArray(m)) {
            bad_type(e, "messages", "an array", m);
            goto fail;
        }
        p->messages = m;
        const cJSON *t = field(root, "tools");
        if (t && !cJSON_IsArray(t)) {
            bad_type(e, "tools", "an array", t);
            goto fail;
        }
        p->tools = t;
    }
    if (get_bool(root, "add_special_tokens", &p->add_special_tokens, e)) goto fail;
    if (get_bool(root, "add_generation_prompt", &p->add_generation_prompt, e)) goto fail;
    return 0;
fail:
    srv_tokenize_params_free(p);
    return -1;
}

void srv_tokenize_params_free(srv_tokenize_params *p) {
    if (!p) return;
    free(p->tokens);
    cJSON_Delete(p->root);
    memset(p, 0, sizeof *p);
}
