/* The Kimi K2 family's chat format (Kimi-K2-Instruct, Kimi-K2-Thinking, Kimi Linear): one string in which
 * the turn markers appear as their special-token text, tokenized with every special allowed.
 *
 *   [<|im_system|>tool_declare<|im_middle|>{tools as JSON}<|im_end|>]
 *   [<|im_system|>system<|im_middle|>{default system prompt}<|im_end|>]
 *   per message: <|im_user|> | <|im_assistant|> | <|im_system|> (every other role), then {name or role}
 *     <|im_middle|> {body} <|im_end|>
 *   [<|im_assistant|>assistant<|im_middle|>]   (add_generation_prompt)
 *
 * Bodies: user/system text; assistant [<think>{reasoning}</think>] text [tool calls section]; tool results
 * "## Return of {id}\n{text}". The variants differ only in the switches of k2_variant, each read off its
 * template (chat.h names them). Nulls are treated as absent (the templates would print "None"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "format/json_kind.h"
#include "text/chat_internal.h"
#include "text/pyjson.h"
#include "util/error.h"

typedef struct k2_variant {
    const char *default_system; /* NULL: none */
    int system_in_loop;         /* emitted at the first message with a "\n" after (llama.cpp's K2-Instruct
                                   template: its {% endif %} keeps the line end), else before the loop,
                                   also for an empty conversation */
    int compact_tools;          /* tojson(separators=(',', ':')) */
    int thinking;               /* <think> blocks, history / suffix split */
    int split_at_first;         /* history ends at the first assistant turn without tool calls (a loop
                                   without break), else at the last */
    int synth_ids;              /* tool-call ids rewritten to functions.NAME:N */
} k2_variant;

static const char *const KIMI_SYSTEM = "You are Kimi, an AI assistant created by Moonshot AI.";

static k2_variant variant_of(k3c_chat_format f) {
    switch (f) {
    case K3C_CHAT_K2_INSTRUCT: return (k2_variant){KIMI_SYSTEM, 1, 0, 0, 0, 1};
    case K3C_CHAT_K2_THINKING: return (k2_variant){KIMI_SYSTEM, 0, 0, 1, 1, 1};
    case K3C_CHAT_K2_THINKING_MOONSHOT: return (k2_variant){KIMI_SYSTEM, 0, 0, 1, 0, 0};
    default: return (k2_variant){NULL, 0, 1, 0, 0, 0}; /* K3C_CHAT_KIMI_LINEAR */
    }
}

/* Synthesized ids: a counter over the conversation and the queue of ids tool results take in order. */
typedef struct id_queue {
    char **ids;
    size_t head, n, cap;
    size_t counter;
} id_queue;

static int queue_push(id_queue *q, const char *name, size_t counter) {
    if (q->n == q->cap) {
        size_t cap = q->cap ? 2 * q->cap : 16;
        char **p = realloc(q->ids, cap * sizeof *p);
        if (!p) return k3c_errorf("rendering the chat prompt: out of memory");
        q->ids = p;
        q->cap = cap;
    }
    size_t n = strlen(name) + 40;
    char *id = malloc(n);
    if (!id) return k3c_errorf("rendering the chat prompt: out of memory");
    snprintf(id, n, "functions.%s:%zu", name, counter);
    q->ids[q->n++] = id;
    return K3C_OK;
}

static void queue_free(id_queue *q) {
    for (size_t i = 0; i < q->n; i++) free(q->ids[i]);
    free(q->ids);
}

static void put_content(k3c_strbuf *b, const cJSON *content) {
    if (cJSON_IsString(content)) {
        k3c_strbuf_puts(b, content->valuestring);
    } else if (cJSON_IsArray(content)) {
        for (const cJSON *part = content->child; part; part = part->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t)) k3c_strbuf_puts(b, t->valuestring);
        }
    }
}

static int put_tool_calls(k3c_strbuf *b, const cJSON *calls, size_t i, const k2_variant *v, id_queue *q) {
    k3c_strbuf_puts(b, "<|tool_calls_section_begin|>");
    size_t j = 0;
    for (const cJSON *tc = calls->child; tc; tc = tc->next, j++) {
        const cJSON *fn = cJSON_IsObject(tc) ? cJSON_GetObjectItemCaseSensitive(tc, "function") : NULL;
        if (!cJSON_IsObject(fn))
            return k3c_errorf("messages[%zu].tool_calls[%zu].function: expected an object, got %s", i, j,
                              k3c_json_kind(fn));
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!args) return k3c_errorf("messages[%zu].tool_calls[%zu].function.arguments: missing", i, j);
        k3c_strbuf_puts(b, "<|tool_call_begin|>");
        if (v->synth_ids) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name))
                return k3c_errorf("messages[%zu].tool_calls[%zu].function.name: expected a string, got %s", i, j,
                                  k3c_json_kind(name));
            K3C_TRY(queue_push(q, name->valuestring, q->counter++));
            k3c_strbuf_puts(b, q->ids[q->n - 1]);
        } else {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(tc, "id");
            if (id && !cJSON_IsNull(id) && !cJSON_IsString(id))
                return k3c_errorf("messages[%zu].tool_calls[%zu].id: expected a string, got %s", i, j,
                                  k3c_json_kind(id));
            if (cJSON_IsString(id)) k3c_strbuf_puts(b, id->valuestring);
        }
        k3c_strbuf_puts(b, "<|tool_call_argument_begin|>");
        if (cJSON_IsString(args))
            k3c_strbuf_puts(b, args->valuestring);
        else
            k3c_pyjson_dump(b, args, 0);
        k3c_strbuf_puts(b, "<|tool_call_end|>");
    }
    k3c_strbuf_puts(b, "<|tool_calls_section_end|>");
    return K3C_OK;
}

static int put_tool_result_id(k3c_strbuf *b, const cJSON *m, size_t i, const k2_variant *v, id_queue *q) {
    const char *s = NULL;
    if (v->synth_ids) {
        if (q->head < q->n) {
            k3c_strbuf_puts(b, q->ids[q->head++]);
            return K3C_OK;
        }
        K3C_TRY(chat_get_string(m, i, "name", &s));
        k3c_strbuf_printf(b, "functions.%s:%zu", s ? s : "unknown", q->counter);
        return K3C_OK;
    }
    K3C_TRY(chat_get_string(m, i, "tool_call_id", &s));
    if (s) k3c_strbuf_puts(b, s);
    return K3C_OK;
}

static int has_tool_calls(const cJSON *m, size_t i, const cJSON **calls) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    *calls = NULL;
    if (!chat_truthy(tc)) return K3C_OK;
    if (!cJSON_IsArray(tc))
        return k3c_errorf("messages[%zu].tool_calls: expected an array, got %s", i, k3c_json_kind(tc));
    *calls = tc;
    return K3C_OK;
}

static int render_messages(const k3c_chat_request *req, const k2_variant *v, k3c_strbuf *b, id_queue *q) {
    const cJSON *msgs = req->messages;
    const cJSON *first = msgs->child;
    int first_is_system = first && !strcmp(cJSON_GetObjectItemCaseSensitive(first, "role")->valuestring, "system");

    if (chat_truthy(req->tools)) {
        k3c_strbuf_puts(b, "<|im_system|>tool_declare<|im_middle|>");
        k3c_pyjson_dump(b, req->tools, K3C_PYJSON_SORT_KEYS | (v->compact_tools ? K3C_PYJSON_COMPACT : 0));
        k3c_strbuf_puts(b, "<|im_end|>");
    }
    if (v->default_system && !v->system_in_loop && !first_is_system)
        k3c_strbuf_printf(b, "<|im_system|>system<|im_middle|>%s<|im_end|>", v->default_system);

    /* the first message of the "suffix", whose assistant turns keep their reasoning */
    size_t suffix_from = 0;
    if (v->thinking) {
        size_t i = 0, found = (size_t)-1;
        for (const cJSON *m = msgs->child; m; m = m->next, i++) {
            const cJSON *calls;
            K3C_TRY(has_tool_calls(m, i, &calls));
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring, "assistant") && !calls) {
                found = i;
                if (v->split_at_first) break;
            }
        }
        suffix_from = found == (size_t)-1 ? 0 : found + 1;
    }

    size_t i = 0;
    for (const cJSON *m = msgs->child; m; m = m->next, i++) {
        const char *role = cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring;
        const char *name = NULL;
        const cJSON *calls = NULL;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        K3C_TRY(chat_get_string(m, i, "name", &name));
        K3C_TRY(has_tool_calls(m, i, &calls));
        int assistant = !strcmp(role, "assistant"), tool = !strcmp(role, "tool");
        if (v->default_system && v->system_in_loop && i == 0 && !first_is_system)
            k3c_strbuf_printf(b, "<|im_system|>system<|im_middle|>%s<|im_end|>\n", v->default_system);
        const char *open = !strcmp(role, "user") ? "<|im_user|>" : assistant ? "<|im_assistant|>" : "<|im_system|>";
        k3c_strbuf_printf(b, "%s%s<|im_middle|>", open, name && name[0] ? name : role);
        if (assistant && v->thinking) {
            const char *rc = NULL;
            if (i >= suffix_from) {
                K3C_TRY(chat_get_string(m, i, "reasoning_content", &rc));
                if (!rc) K3C_TRY(chat_get_string(m, i, "reasoning", &rc)); /* vLLM's newer name */
            }
            k3c_strbuf_printf(b, "<think>%s</think>", rc ? rc : "");
            put_content(b, content);
            if (calls) K3C_TRY(put_tool_calls(b, calls, i, v, q));
        } else if (assistant && calls) {
            put_content(b, content);
            K3C_TRY(put_tool_calls(b, calls, i, v, q));
        } else if (tool) {
            k3c_strbuf_puts(b, "## Return of ");
            K3C_TRY(put_tool_result_id(b, m, i, v, q));
            k3c_strbuf_putc(b, '\n');
            put_content(b, content);
        } else {
            put_content(b, content);
        }
        k3c_strbuf_puts(b, "<|im_end|>");
    }
    if (req->add_generation_prompt) k3c_strbuf_puts(b, "<|im_assistant|>assistant<|im_middle|>");
    return K3C_OK;
}

int chat_render_k2(k3c_chat_format format, const k3c_chat_request *req, chat_out *o) {
    k2_variant v = variant_of(format);
    k3c_strbuf b = {0};
    id_queue q = {0};
    int rc = render_messages(req, &v, &b, &q);
    queue_free(&q);
    if (rc == K3C_OK) {
        if (b.failed) o->failed = 1;
        chat_emit(o, K3C_CHAT_SEG_MIXED, b.data, b.len);
    }
    k3c_strbuf_free(&b);
    return rc;
}
