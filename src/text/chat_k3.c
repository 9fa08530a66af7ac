/* Kimi K3's chat format, XTML: tags made of special tokens and plain text, rendered as segments the way
 * Moonshot's encoding_k3.py (build_chat_segments; vLLM vllm/tokenizers/encoding_k3.py @2ec5134c) does:
 *
 *   open(tag, attrs) = SPECIAL <|open|>, TEXT tag, per attribute TEXT " key", TEXT "=\"", TEXT value
 *                      (& and " escaped), TEXT "\"", SPECIAL <|sep|>
 *   close(tag)       = SPECIAL <|close|>, TEXT tag, SPECIAL <|sep|>          end = SPECIAL <|end_of_msg|>
 *
 * Each segment is tokenized on its own (no BPE merge across segments), so content containing "<|open|>"
 * stays text. Order: tool declaration, thinking effort, the messages, tool_choice, response_format, the
 * generation prompt. Tool results are re-sorted into the order of the assistant's calls when every result of
 * a run matches a call id (normalize_xtml_tool_result_messages). Where the reference silently skips input
 * (a role it does not know, a message that is not an object) k3c refuses it instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json_kind.h"
#include "text/chat_internal.h"
#include "text/pyjson.h"
#include "util/error.h"

#define OPEN "<|open|>"
#define CLOSE "<|close|>"
#define SEP "<|sep|>"
#define EOM "<|end_of_msg|>"

static void ctl(chat_out *o, const char *s) { chat_emit(o, K3C_CHAT_SEG_SPECIAL, s, strlen(s)); }

typedef struct attr {
    const char *key;
    const char *value;
} attr;

static void open_tag(chat_out *o, const char *tag, const attr *attrs, size_t n) {
    ctl(o, OPEN);
    chat_text(o, tag);
    for (size_t i = 0; i < n; i++) {
        k3c_strbuf esc = {0};
        for (const char *p = attrs[i].value; *p; p++) {
            if (*p == '&')
                k3c_strbuf_puts(&esc, "&amp;");
            else if (*p == '"')
                k3c_strbuf_puts(&esc, "&quot;");
            else
                k3c_strbuf_putc(&esc, *p);
        }
        if (esc.failed) o->failed = 1;
        k3c_strbuf key = {0};
        k3c_strbuf_printf(&key, " %s", attrs[i].key);
        if (key.failed) o->failed = 1;
        chat_emit(o, K3C_CHAT_SEG_TEXT, key.data, key.len);
        chat_text(o, "=\"");
        chat_emit(o, K3C_CHAT_SEG_TEXT, esc.data, esc.len);
        chat_text(o, "\"");
        k3c_strbuf_free(&esc);
        k3c_strbuf_free(&key);
    }
    ctl(o, SEP);
}

static void close_tag(chat_out *o, const char *tag) {
    ctl(o, CLOSE);
    chat_text(o, tag);
    ctl(o, SEP);
}

static void system_message(chat_out *o, const char *type, const char *body) {
    attr a[] = {{"role", "system"}, {"type", type}};
    open_tag(o, "message", a, 2);
    chat_text(o, body);
    close_tag(o, "message");
    ctl(o, EOM);
}

static void tool_declare(chat_out *o, const cJSON *tools, int dynamic) {
    k3c_strbuf body = {0};
    k3c_strbuf_puts(&body, dynamic ? "## New Tools Available\n"
                                     "The system dynamically extends the toolset via lazy-loading.\n"
                                     "You have access to all existing and extended tools.\n"
                                     "Here are the specs for the extended tools.\n\n```json\n"
                                   : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n");
    k3c_pyjson_dump(&body, tools, K3C_PYJSON_COMPACT | K3C_PYJSON_SORT_KEYS);
    k3c_strbuf_puts(&body, "\n```");
    if (body.failed) o->failed = 1;
    attr a[] = {{"role", "system"}, {"type", "tool-declare"}};
    open_tag(o, "message", a, 2);
    chat_emit(o, K3C_CHAT_SEG_TEXT, body.data, body.len);
    close_tag(o, "message");
    ctl(o, EOM);
    k3c_strbuf_free(&body);
}

static void content_segments(chat_out *o, const cJSON *content) {
    if (cJSON_IsString(content)) {
        chat_text(o, content->valuestring);
    } else if (cJSON_IsArray(content)) {
        for (const cJSON *part = content->child; part; part = part->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t)) chat_text(o, t->valuestring);
        }
    }
}

/* The function object of a tool call: tool_call.function, or the call itself (the flat shape). */
static int call_function(const cJSON *tc, size_t i, size_t j, const cJSON **fn) {
    if (!cJSON_IsObject(tc))
        return k3c_errorf("messages[%zu].tool_calls[%zu]: expected an object, got %s", i, j, k3c_json_kind(tc));
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
    if (f && !cJSON_IsObject(f))
        return k3c_errorf("messages[%zu].tool_calls[%zu].function: expected an object, got %s", i, j,
                          k3c_json_kind(f));
    *fn = f ? f : tc;
    return K3C_OK;
}

static int call_name(const cJSON *tc, size_t i, size_t j, const char **name) {
    const cJSON *fn;
    K3C_TRY(call_function(tc, i, j, &fn));
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(fn, "name");
    if (!cJSON_IsString(n))
        return k3c_errorf("messages[%zu].tool_calls[%zu]: a Kimi K3 tool call needs a function name (a string), "
                          "got %s",
                          i, j, k3c_json_kind(n));
    *name = n->valuestring;
    return K3C_OK;
}

/* encoding_k3.py normalize_tool_arguments: an object as is; a string parsed (blank -> {}, an object -> its
 * members, not JSON -> a raw `json` block); null/absent -> {}. *parsed (to free) holds a parsed string. */
static int call_arguments(const cJSON *fn, size_t i, size_t j, const cJSON **obj, cJSON **parsed,
                          const char **json_block) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    *obj = NULL;
    *parsed = NULL;
    *json_block = NULL;
    if (!a || cJSON_IsNull(a)) return K3C_OK;
    if (cJSON_IsObject(a)) {
        *obj = a;
        return K3C_OK;
    }
    if (!cJSON_IsString(a))
        return k3c_errorf("messages[%zu].tool_calls[%zu].function.arguments: Kimi K3 tool call arguments must be "
                          "an object or a JSON object string, got %s",
                          i, j, k3c_json_kind(a));
    const char *s = a->valuestring;
    if (k3c_py_isblank(s, strlen(s))) return K3C_OK;
    cJSON *p = k3c_pyjson_parse(s, strlen(s), "arguments");
    if (!p) {
        k3c_error_clear();
        *json_block = s;
        return K3C_OK;
    }
    if (!cJSON_IsObject(p)) {
        cJSON_Delete(p);
        return k3c_errorf("messages[%zu].tool_calls[%zu].function.arguments: Kimi K3 tool call arguments must be "
                          "a JSON object",
                          i, j);
    }
    *parsed = p;
    *obj = p;
    return K3C_OK;
}

static const char *xtml_type(const cJSON *v) {
    if (cJSON_IsBool(v)) return "boolean";
    if (cJSON_IsNull(v)) return "null";
    if (cJSON_IsNumber(v)) return "number";
    if (cJSON_IsString(v)) return "string";
    if (cJSON_IsObject(v)) return "object";
    return "array";
}

static int render_assistant(chat_out *o, const cJSON *m, size_t i, int thinking) {
    if (thinking) {
        /* `reasoning_content or reasoning`: an empty string falls through to the other name */
        const char *rc = NULL, *r = NULL;
        K3C_TRY(chat_get_string(m, i, "reasoning_content", &rc));
        K3C_TRY(chat_get_string(m, i, "reasoning", &r));
        if (!rc || !rc[0]) rc = r;
        open_tag(o, "think", NULL, 0);
        if (rc && !k3c_py_isblank(rc, strlen(rc))) chat_text(o, rc);
        close_tag(o, "think");
    }
    open_tag(o, "response", NULL, 0);
    content_segments(o, cJSON_GetObjectItemCaseSensitive(m, "content"));
    close_tag(o, "response");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (!chat_truthy(calls)) return K3C_OK;
    if (!cJSON_IsArray(calls))
        return k3c_errorf("messages[%zu].tool_calls: expected an array, got %s", i, k3c_json_kind(calls));
    open_tag(o, "tools", NULL, 0);
    size_t j = 0;
    for (const cJSON *tc = calls->child; tc; tc = tc->next, j++) {
        const cJSON *fn, *args;
        const char *name, *block;
        cJSON *parsed;
        K3C_TRY(call_function(tc, i, j, &fn));
        K3C_TRY(call_name(tc, i, j, &name));
        K3C_TRY(call_arguments(fn, i, j, &args, &parsed, &block));
        char index[24];
        snprintf(index, sizeof index, "%zu", j + 1);
        attr a[] = {{"tool", name}, {"index", index}};
        open_tag(o, "call", a, 2);
        if (block) {
            attr t[] = {{"type", "object"}};
            open_tag(o, "json", t, 1);
            chat_text(o, block);
            close_tag(o, "json");
        } else if (args) {
            size_t n = 0;
            const cJSON **items = k3c_pyjson_items(args, 0, &n, &o->failed);
            for (size_t k = 0; k < n; k++) {
                attr t[] = {{"key", items[k]->string}, {"type", xtml_type(items[k])}};
                open_tag(o, "argument", t, 2);
                if (cJSON_IsString(items[k])) {
                    chat_text(o, items[k]->valuestring);
                } else {
                    k3c_strbuf v = {0};
                    k3c_pyjson_dump(&v, items[k], 0);
                    if (v.failed) o->failed = 1;
                    chat_emit(o, K3C_CHAT_SEG_TEXT, v.data, v.len);
                    k3c_strbuf_free(&v);
                }
                close_tag(o, "argument");
            }
            free(items);
        }
        cJSON_Delete(parsed);
        close_tag(o, "call");
    }
    close_tag(o, "tools");
    return K3C_OK;
}

/* ---- tool results in call order ------------------------------------------------------------------------ */

typedef struct ordered_msg {
    const cJSON *m;
    size_t index;           /* position in the request, for messages */
    const char *tool_name;  /* the matched call's function name, overriding tool/name; NULL: none */
    size_t call_pos;        /* 1-based position of the matched call (sort key) */
} ordered_msg;

/* A call id as Python's str() of it; NULL for ids that are neither strings nor numbers. */
static const char *id_text(const cJSON *id, char *buf, size_t n) {
    if (cJSON_IsString(id)) return id->valuestring;
    if (cJSON_IsNumber(id)) {
        k3c_strbuf b = {0};
        k3c_pyjson_number(&b, id);
        snprintf(buf, n, "%s", b.data ? b.data : "");
        k3c_strbuf_free(&b);
        return buf;
    }
    return NULL;
}

/* The call of `calls` whose id matches (first occurrence), by position; 0 when none. */
static size_t match_call(const cJSON *calls, const char *want, const char **name) {
    size_t pos = 0;
    for (const cJSON *tc = calls ? calls->child : NULL; tc; tc = tc->next) {
        pos++;
        if (!cJSON_IsObject(tc)) continue;
        char buf[64];
        const char *id = id_text(cJSON_GetObjectItemCaseSensitive(tc, "id"), buf, sizeof buf);
        if (!id || strcmp(id, want) != 0) continue;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(fn) ? fn : tc, "name");
        *name = cJSON_IsString(n) ? n->valuestring : NULL;
        return pos;
    }
    return 0;
}

static int by_call_pos(const void *a, const void *b) {
    const ordered_msg *x = a, *y = b;
    if (x->call_pos != y->call_pos) return x->call_pos < y->call_pos ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

static int order_messages(const cJSON *msgs, ordered_msg **out, size_t *n_out) {
    size_t n = (size_t)cJSON_GetArraySize(msgs);
    ordered_msg *v = calloc(n ? n : 1, sizeof *v);
    if (!v) return k3c_errorf("rendering the chat prompt: out of memory");
    size_t i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) v[i] = (ordered_msg){m, i, NULL, 0};
    const cJSON *calls = NULL;
    for (i = 0; i < n;) {
        const char *role = cJSON_GetObjectItemCaseSensitive(v[i].m, "role")->valuestring;
        if (!strcmp(role, "assistant")) {
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(v[i].m, "tool_calls");
            calls = chat_truthy(tc) && cJSON_IsArray(tc) ? tc : NULL;
        }
        if (strcmp(role, "tool") != 0) {
            i++;
            continue;
        }
        size_t start = i, resolved = 1;
        for (; i < n && !strcmp(cJSON_GetObjectItemCaseSensitive(v[i].m, "role")->valuestring, "tool"); i++) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(v[i].m, "tool_call_id");
            if (!id) id = cJSON_GetObjectItemCaseSensitive(v[i].m, "id");
            char buf[64];
            const char *want = id_text(id, buf, sizeof buf);
            v[i].call_pos = want ? match_call(calls, want, &v[i].tool_name) : 0;
            if (!v[i].call_pos) resolved = 0;
        }
        if (resolved) {
            qsort(v + start, i - start, sizeof *v, by_call_pos);
        } else {
            for (size_t k = start; k < i; k++) v[k].tool_name = NULL;
        }
    }
    *out = v;
    *n_out = n;
    return K3C_OK;
}

/* ---- the conversation ----------------------------------------------------------------------------------- */

static int render(const k3c_chat_request *req, chat_out *o, const ordered_msg *msgs, size_t n) {
    int thinking = !req->no_thinking;
    const char *effort = req->thinking_effort ? req->thinking_effort : "max";
    if (strcmp(effort, "low") && strcmp(effort, "high") && strcmp(effort, "max"))
        return k3c_errorf("thinking_effort '%s': Kimi K3 supports low, high and max", effort);

    if (chat_truthy(req->tools)) tool_declare(o, req->tools, 0);
    if (thinking) {
        char body[400];
        snprintf(body, sizeof body,
                 "`thinking_effort` guides on how much to think in your thinking channel (not including the "
                 "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                 "Now the system is invoked with `thinking_effort=%s`.",
                 effort);
        system_message(o, "thinking-effort", body);
    }

    const cJSON *calls = NULL; /* the last assistant turn's tool_calls */
    size_t tool_index = 0;
    for (size_t k = 0; k < n; k++) {
        const cJSON *m = msgs[k].m;
        size_t i = msgs[k].index;
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const char *name = NULL;
        K3C_TRY(chat_get_string(m, i, "name", &name));
        attr a[3] = {{"role", role}};
        size_t na = 1;
        if (name && name[0]) a[na++] = (attr){"name", name};
        if (!strcmp(role, "user") ||
            (!strcmp(role, "system") && !chat_truthy(cJSON_GetObjectItemCaseSensitive(m, "tools")))) {
            open_tag(o, "message", a, na);
            content_segments(o, cJSON_GetObjectItemCaseSensitive(m, "content"));
            close_tag(o, "message");
            ctl(o, EOM);
        } else if (!strcmp(role, "system")) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(m, "tools");
            if (!cJSON_IsArray(t))
                return k3c_errorf("messages[%zu].tools: expected an array, got %s", i, k3c_json_kind(t));
            tool_declare(o, t, 1);
        } else if (!strcmp(role, "assistant")) {
            const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            calls = tc && !cJSON_IsNull(tc) ? tc : NULL;
            tool_index = 0;
            open_tag(o, "message", a, na);
            K3C_TRY(render_assistant(o, m, i, thinking));
            close_tag(o, "message");
            ctl(o, EOM);
        } else if (!strcmp(role, "tool")) {
            tool_index++;
            const char *tool = msgs[k].tool_name;
            if (!tool) {
                const char *key = cJSON_GetObjectItemCaseSensitive(m, "tool") ? "tool" : "name";
                K3C_TRY(chat_get_string(m, i, key, &tool));
            }
            if (!tool && cJSON_IsArray(calls) && tool_index <= (size_t)cJSON_GetArraySize(calls))
                K3C_TRY(call_name(cJSON_GetArrayItem(calls, (int)tool_index - 1), i, tool_index - 1, &tool));
            if (!tool)
                return k3c_errorf("messages[%zu]: a Kimi K3 tool message needs a resolvable tool name: carry "
                                  "`tool`/`name`, or match a preceding assistant tool_call by order",
                                  i);
            char index[24];
            snprintf(index, sizeof index, "%zu", tool_index);
            attr t[] = {{"role", "tool"}, {"tool", tool}, {"index", index}};
            open_tag(o, "message", t, 3);
            content_segments(o, cJSON_GetObjectItemCaseSensitive(m, "content"));
            close_tag(o, "message");
            ctl(o, EOM);
        } else {
            return k3c_errorf("messages[%zu].role '%s': Kimi K3 knows system, user, assistant and tool", i, role);
        }
    }

    const cJSON *choice = req->tool_choice;
    if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required"))
        system_message(o, "tool-choice",
                       "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    else if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none"))
        system_message(o, "tool-choice", "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any "
                                         "tools in the next message.");

    const cJSON *rf = req->response_format;
    const cJSON *type = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : rf;
    const char *rf_type = cJSON_IsString(type) ? type->valuestring : "";
    static const char *const raw_json = "Your response must be raw JSON data without markdown code blocks (```json) "
                                        "or any additional formatting.";
    if (!strcmp(rf_type, "json_object")) {
        k3c_strbuf body = {0};
        k3c_strbuf_printf(&body, "The system is invoked with `response_format=json_object`.\n%s", raw_json);
        if (body.failed) o->failed = 1;
        if (body.data) system_message(o, "response-format", body.data);
        k3c_strbuf_free(&body);
    } else if (!strcmp(rf_type, "json_schema")) {
        /* extract_response_schema: json_schema.schema, else json_schema.json_schema, else json_schema */
        const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema"), *schema = js;
        if (cJSON_IsObject(js)) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(js, "schema");
            if (!s) s = cJSON_GetObjectItemCaseSensitive(js, "json_schema");
            if (s) schema = s;
        }
        k3c_strbuf body = {0};
        k3c_strbuf_printf(&body, "The system is invoked with `response_format=json_schema`.\n%s\nThe JSON data must "
                                 "match the following schema:\n```json\n",
                          raw_json);
        if (schema)
            k3c_pyjson_dump(&body, schema, K3C_PYJSON_COMPACT | K3C_PYJSON_SORT_KEYS);
        else
            k3c_strbuf_puts(&body, "null");
        k3c_strbuf_puts(&body, "\n```");
        if (body.failed) o->failed = 1;
        if (body.data) system_message(o, "response-format", body.data);
        k3c_strbuf_free(&body);
    }

    if (req->add_generation_prompt) {
        attr a[] = {{"role", "assistant"}};
        open_tag(o, "message", a, 1);
        open_tag(o, thinking ? "think" : "response", NULL, 0);
    }
    return K3C_OK;
}

int chat_render_k3(const k3c_chat_request *req, chat_out *o) {
    ordered_msg *msgs = NULL;
    size_t n = 0;
    K3C_TRY(order_messages(req->messages, &msgs, &n));
    int rc = render(req, o, msgs, n);
    free(msgs);
    return rc;
}
