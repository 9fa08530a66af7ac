/* The grammars a chat request's tool_choice and response_format ask for (include/k3c.h, constrained
 * decoding), in each chat format's own tool-call syntax (the renderers chat_k2.c / chat_k3.c and the parsers
 * parse_k2.c / parse_k3.c read and write it):
 *
 *   K3 (the prompt ends with <|open|>think<|sep|>, or <|open|>response<|sep|> when thinking is off):
 *     [reasoning <|close|>think<|sep|><|open|>response<|sep|>] <|close|>response<|sep|><|open|>tools<|sep|>
 *     ( <|open|>call tool="NAME" index="K"<|sep|><|open|>json type="object"<|sep|> ARGS
 *       <|close|>json<|sep|><|close|>call<|sep|> )+ <|close|>tools<|sep|><|close|>message<|sep|> END
 *     The arguments go in the format's json block (a JSON object as text, what both k3c's parser and vLLM's
 *     take), not in per-key argument tags: a JSON automaton holds it whole.
 *   K2 family (the prompt ends with <|im_assistant|>assistant<|im_middle|>; the thinking variants may open
 *   with <think>):
 *     [<think> reasoning </think>] <|tool_calls_section_begin|>
 *     ( <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|> ARGS <|tool_call_end|> )+
 *     <|tool_calls_section_end|> END
 *     IDX counts the calls of the conversation so far, as the K2 templates number them.
 *   response_format json_object / json_schema: the content is one JSON object (K3: in the response channel,
 *   then <|close|>response<|sep|><|close|>message<|sep|>), then END.
 * END is one of the format's stop ids (k3c_chat_stop_ids). A named function allows one call of it;
 * "required" one to K3C_CHAT_MAX_CALLS calls (one with parallel_tool_calls false), each naming one of the
 * tools. The grammar is built back to front (constrain/grammar.h). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/grammar.h"
#include "k3c.h"
#include "text/chat.h"
#include "util/error.h"

#define K3C_CHAT_MAX_CALLS 8

static const char *tok_bytes(void *user, int32_t id, size_t *len) { return k3c_tokenizer_token(user, id, len); }
static int tok_special(void *user, int32_t id) { return k3c_tokenizer_is_special(user, id) == 1; }

int k3c_grammar_vocab_create(const k3c_tokenizer *tok, k3c_grammar_vocab **out) {
    if (!out) return k3c_errorf("grammar vocabulary: out is NULL");
    *out = NULL;
    if (!tok) return k3c_errorf("grammar vocabulary: the tokenizer is NULL");
    return k3c_grammar_vocab_build(k3c_tokenizer_vocab(tok), tok_bytes, tok_special, (void *)tok, out);
}

enum { CHOICE_NONE, CHOICE_REQUIRED, CHOICE_NAMED };

typedef struct builder {
    k3c_grammar *g;
    const k3c_tokenizer *tok;
    int k3;       /* the K3 format, else the K2 family */
    int thinking; /* K3: the prompt opened the think channel; K2: a thinking variant (<think> may open) */
    const char *missing; /* a marker the tokenizer lacks */
} builder;

static void mark(builder *b, k3c_syms *s, const char *name) {
    int32_t id = k3c_tokenizer_special_id(b->tok, name);
    if (id < 0) {
        if (!b->missing) b->missing = name;
        s->failed = 1;
        return;
    }
    k3c_syms_special(s, id);
}

/* K3's <|open|>body<|sep|> (close 0) or <|close|>body<|sep|>. */
static void k3_tag(builder *b, k3c_syms *s, int close, const char *body) {
    mark(b, s, close ? "<|close|>" : "<|open|>");
    k3c_syms_text(s, body);
    mark(b, s, "<|sep|>");
}

static int syms_error(const builder *b) {
    if (b->missing)
        return k3c_errorf("the tokenizer has no %s, which the chat format's constrained output needs", b->missing);
    return k3c_errorf_kind(K3C_ERROR_OOM, "chat grammar: out of memory");
}

/* An ALT of one string (freed here); the element or -1. */
static int literal(builder *b, k3c_syms *s, int next) {
    int el = -1;
    if (s->failed) syms_error(b);
    else if ((el = k3c_grammar_add_alt(b->g, -1)) >= 0 && k3c_grammar_alt_string(b->g, el, s->v, s->n, next) != K3C_OK)
        el = -1;
    k3c_syms_free(s);
    return el;
}

static int alt_string(builder *b, int el, k3c_syms *s, int next) {
    int rc = s->failed ? syms_error(b) : k3c_grammar_alt_string(b->g, el, s->v, s->n, next);
    k3c_syms_free(s);
    return rc;
}

static int end_element(builder *b, const k3c_chat_template *t) {
    int32_t ends[K3C_GRAMMAR_MAX_ENDS];
    int n = k3c_chat_stop_ids(t, b->tok, ends, K3C_GRAMMAR_MAX_ENDS);
    if (n <= 0) return k3c_errorf("chat grammar: the format has no stop id in this tokenizer"), -1;
    return k3c_grammar_add_end(b->g, ends, n > K3C_GRAMMAR_MAX_ENDS ? K3C_GRAMMAR_MAX_ENDS : n);
}

typedef struct tool {
    const char *name;
    int root; /* its parameters' schema node */
} tool;

/* The header of call k (1-based) naming t and the arguments' opening, appended to s. */
static void call_header(builder *b, k3c_syms *s, const tool *t, int k, int first_id) {
    if (!b->k3) {
        char idx[32];
        snprintf(idx, sizeof idx, ":%d", first_id + k - 1);
        mark(b, s, "<|tool_call_begin|>");
        k3c_syms_text(s, "functions.");
        k3c_syms_text(s, t->name);
        k3c_syms_text(s, idx);
        mark(b, s, "<|tool_call_argument_begin|>");
        return;
    }
    mark(b, s, "<|open|>");
    k3c_syms_text(s, "call tool=\"");
    for (const char *p = t->name; *p; p++) /* the attribute value escaped as the renderer does */
        if (*p == '&') k3c_syms_text(s, "&amp;");
        else if (*p == '"') k3c_syms_text(s, "&quot;");
        else k3c_syms_bytes(s, p, 1);
    char idx[48];
    snprintf(idx, sizeof idx, "\" index=\"%d\"", k);
    k3c_syms_text(s, idx);
    mark(b, s, "<|sep|>");
    k3_tag(b, s, 0, "json type=\"object\"");
}

/* The tool-call section up to END: its first element, or -1. */
static int tool_section(builder *b, int end, const tool *tools, int n_tools, int calls, int first_id) {
    k3c_syms s = {0}, close_section = {0};
    int tail = end;
    if (b->k3) {
        k3_tag(b, &s, 1, "message");
        if ((tail = literal(b, &s, end)) < 0) return -1;
        k3_tag(b, &close_section, 1, "tools");
    } else {
        mark(b, &close_section, "<|tool_calls_section_end|>");
    }
    k3c_syms_raw(&s, close_section.v, close_section.n);
    s.failed |= close_section.failed;
    int after = literal(b, &s, tail), first = -1;
    int *jsons = malloc(sizeof *jsons * (size_t)n_tools);
    if (!jsons) k3c_errorf_kind(K3C_ERROR_OOM, "chat grammar: out of memory");
    for (int k = calls; k >= 1 && after >= 0 && jsons; k--) {
        if (b->k3) {
            k3_tag(b, &s, 1, "json");
            k3_tag(b, &s, 1, "call");
        } else {
            mark(b, &s, "<|tool_call_end|>");
        }
        int close = literal(b, &s, after);
        for (int i = 0; i < n_tools && close >= 0; i++)
            if ((jsons[i] = k3c_grammar_add_json_root(b->g, tools[i].root, close)) < 0) close = -1;
        int el = close >= 0 ? k3c_grammar_add_alt(b->g, -1) : -1;
        int rc = el >= 0 ? K3C_OK : K3C_ERR;
        if (rc == K3C_OK && k > 1) {
            /* after call k - 1: the section closes, or call k follows */
            k3c_syms_raw(&s, close_section.v, close_section.n);
            s.failed |= close_section.failed;
            rc = alt_string(b, el, &s, tail);
        }
        for (int i = 0; i < n_tools && rc == K3C_OK; i++) {
            if (k == 1) { /* the first call comes with the section's opening */
                if (b->k3) {
                    k3_tag(b, &s, 1, "response");
                    k3_tag(b, &s, 0, "tools");
                } else {
                    mark(b, &s, "<|tool_calls_section_begin|>");
                }
            }
            call_header(b, &s, &tools[i], k, first_id);
            rc = alt_string(b, el, &s, jsons[i]);
        }
        after = rc == K3C_OK ? el : -1;
        first = after;
    }
    free(jsons);
    k3c_syms_free(&close_section);
    k3c_syms_free(&s);
    return first;
}

/* The content as one JSON object of schema node root, up to END. */
static int json_content(builder *b, int end, int root) {
    int tail = end;
    if (b->k3) {
        k3c_syms s = {0};
        k3_tag(b, &s, 1, "response");
        k3_tag(b, &s, 1, "message");
        if ((tail = literal(b, &s, end)) < 0) return -1;
    }
    return k3c_grammar_add_json_root(b->g, root, tail);
}

/* The reasoning section before `first`: free text up to the format's close of it, which then goes on as
 * `first` does (every string of an ALT first gets the close in front; a JSON first follows the close). K2's
 * thinking variants may also start with `first` directly (the <think> opener is optional there). */
static int reasoning(builder *b, int first) {
    if (!b->thinking) return first;
    k3c_syms pre = {0}, s = {0};
    if (b->k3) {
        k3_tag(b, &pre, 1, "think");
        k3_tag(b, &pre, 0, "response");
    } else {
        mark(b, &pre, "</think>");
    }
    g_elem e = b->g->el[first];
    int term = k3c_grammar_add_alt(b->g, -1), rc = term >= 0 ? K3C_OK : K3C_ERR;
    if (e.kind == GE_ALT) {
        for (int j = 0; j < e.n_alts && rc == K3C_OK; j++) {
            g_alt a = b->g->alts[e.alts + j];
            k3c_syms_raw(&s, pre.v, pre.n);
            k3c_syms_raw(&s, b->g->syms + a.off, a.len);
            s.failed |= pre.failed;
            rc = alt_string(b, term, &s, a.next);
        }
    } else if (rc == K3C_OK) {
        k3c_syms_raw(&s, pre.v, pre.n);
        s.failed |= pre.failed;
        rc = alt_string(b, term, &s, first);
    }
    k3c_syms_free(&pre);
    int free_text = rc == K3C_OK ? k3c_grammar_add_free(b->g, term) : -1;
    if (free_text < 0 || b->k3) return free_text;
    int opt = k3c_grammar_add_alt(b->g, first);
    mark(b, &s, "<think>");
    if (opt < 0 || alt_string(b, opt, &s, free_text) != K3C_OK) return -1;
    return opt;
}

/* ---- the request ---- */

static const cJSON *item(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL;
    return cJSON_IsNull(v) ? NULL : v;
}

static const char *tool_name(const cJSON *t) {
    const cJSON *n = item(item(t, "function"), "name");
    return cJSON_IsString(n) && n->valuestring[0] ? n->valuestring : NULL;
}

/* Calls of the assistant turns so far (K2 numbers a call by its place in the conversation). */
static int prior_calls(const cJSON *root) {
    int n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, item(root, "messages")) {
        const cJSON *role = item(m, "role"), *calls = item(m, "tool_calls");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "assistant") && cJSON_IsArray(calls))
            n += cJSON_GetArraySize(calls);
    }
    return n;
}

/* The tools a constrained call may name (named: that one), their schemas compiled into b->g. */
static int collect_tools(builder *b, const cJSON *tools, const char *named, tool **out, int *n_out) {
    *out = NULL;
    *n_out = 0;
    int cap = cJSON_GetArraySize(tools), n = 0, i = 0;
    tool *v = calloc((size_t)(cap ? cap : 1), sizeof *v);
    if (!v) return k3c_errorf_kind(K3C_ERROR_OOM, "chat grammar: out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const char *name = tool_name(t);
        if (!name) {
            free(v);
            return k3c_errorf("tools[%d]: not {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
        }
        if (!named || !strcmp(name, named)) {
            for (int j = 0; j < n; j++)
                if (!strcmp(v[j].name, name)) {
                    free(v);
                    return k3c_errorf("tools[%d]: the function name '%s' appears twice: a forced call could not "
                                      "tell them apart", i, name);
                }
            for (const char *p = name; !b->k3 && *p; p++)
                if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
                    free(v);
                    return k3c_errorf("tools[%d]: the function name '%s' holds whitespace, which the K2 format's "
                                      "call ids (functions.NAME:IDX) cannot carry", i, name);
                }
            char what[64];
            snprintf(what, sizeof what, "tools[%d].function.parameters", i);
            int root = k3c_grammar_schema(b->g, item(item(t, "function"), "parameters"), 0, what);
            if (root < 0) {
                free(v);
                return K3C_ERR;
            }
            v[n++] = (tool){name, root};
        }
        i++;
    }
    if (!n) {
        free(v);
        return named ? k3c_errorf("tool_choice names the function '%s', which 'tools' does not have", named)
                     : k3c_errorf("tool_choice 'required' needs at least one tool in 'tools'");
    }
    *out = v;
    *n_out = n;
    return K3C_OK;
}

int k3c_chat_grammar_create(const k3c_chat_template *t, const k3c_tokenizer *tok, const k3c_grammar_vocab *v,
                            const char *request_json, size_t len, k3c_grammar **out) {
    if (!out) return k3c_errorf("chat grammar: out is NULL");
    *out = NULL;
    if (!t || !tok || !v || !request_json)
        return k3c_errorf("chat grammar: %s is NULL", !t ? "the template" : !tok ? "the tokenizer" : !v ? "the vocabulary"
                                                                                                       : "the request");
    k3c_chat_format f;
    K3C_TRY(k3c_chat_format_from_name(k3c_chat_template_name(t), &f));
    cJSON *root = cJSON_ParseWithLength(request_json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return k3c_errorf("chat grammar: the request is not a JSON object");
    }
    const cJSON *tc = item(root, "tool_choice"), *tools = item(root, "tools"), *rf = item(root, "response_format");
    int choice = CHOICE_NONE;
    const char *named = NULL;
    if (cJSON_IsString(tc) && !strcmp(tc->valuestring, "required")) {
        choice = CHOICE_REQUIRED;
    } else if (cJSON_IsObject(tc)) {
        choice = CHOICE_NAMED;
        if (!(named = tool_name(tc))) {
            cJSON_Delete(root);
            return k3c_errorf("tool_choice: not {\"type\": \"function\", \"function\": {\"name\": ...}}");
        }
    }
    const cJSON *rf_type = item(rf, "type"), *schema = NULL;
    int json_out = 0;
    if (choice == CHOICE_NONE && cJSON_IsString(rf_type)) {
        if (!strcmp(rf_type->valuestring, "json_object")) {
            json_out = 1;
        } else if (!strcmp(rf_type->valuestring, "json_schema")) {
            json_out = 1;
            schema = item(item(rf, "json_schema"), "schema");
        } else if (strcmp(rf_type->valuestring, "text")) {
            k3c_errorf("response_format type '%s': expected text, json_object or json_schema", rf_type->valuestring);
            cJSON_Delete(root);
            return K3C_ERR;
        }
    }
    if (choice == CHOICE_NONE && !json_out) {
        cJSON_Delete(root);
        return K3C_OK;
    }
    if (cJSON_IsFalse(item(root, "add_generation_prompt"))) {
        cJSON_Delete(root);
        return k3c_errorf("%s with add_generation_prompt false: the constrained output continues the assistant's "
                          "opening, which the prompt then lacks", choice != CHOICE_NONE ? "tool_choice" : "response_format");
    }
    if (choice != CHOICE_NONE && !cJSON_IsArray(tools)) {
        cJSON_Delete(root);
        return k3c_errorf("tool_choice %s needs 'tools'", choice == CHOICE_REQUIRED ? "required" : "naming a function");
    }
    builder b = {.tok = tok, .k3 = f == K3C_CHAT_K3};
    const cJSON *kw = item(root, "chat_template_kwargs");
    b.thinking = b.k3 ? !cJSON_IsFalse(item(kw, "thinking"))
                      : f == K3C_CHAT_K2_THINKING || f == K3C_CHAT_K2_THINKING_MOONSHOT;
    int rc = k3c_grammar_begin(v, K3C_GRAMMAR_MAX_WS, &b.g), first = -1;
    int end = rc == K3C_OK ? end_element(&b, t) : -1;
    if (end >= 0 && choice != CHOICE_NONE) {
        tool *tv;
        int n_tools;
        const cJSON *par = item(root, "parallel_tool_calls");
        int calls = choice == CHOICE_NAMED || cJSON_IsFalse(par) ? 1 : K3C_CHAT_MAX_CALLS;
        if (collect_tools(&b, tools, named, &tv, &n_tools) == K3C_OK) {
            first = tool_section(&b, end, tv, n_tools, calls, prior_calls(root));
            free(tv);
        }
    } else if (end >= 0) {
        int node = k3c_grammar_schema(b.g, schema, 1, "response_format.json_schema.schema");
        if (node >= 0) first = json_content(&b, end, node);
    }
    int start = first >= 0 ? reasoning(&b, first) : -1;
    rc = start >= 0 ? k3c_grammar_finish(b.g, start) : K3C_ERR;
    cJSON_Delete(root);
    if (rc != K3C_OK) {
        k3c_grammar_free(b.g);
        return K3C_ERR;
    }
    *out = b.g;
    return K3C_OK;
}
