/* Chat formats: names, template fingerprints, the model directory's template, and the render entry. */
#include "text/chat.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "format/json_kind.h"
#include "text/chat_internal.h"
#include "util/error.h"
#include "util/file.h"

static const struct {
    k3c_chat_format format;
    const char *name;
} format_names[] = {
    {K3C_CHAT_K2_INSTRUCT, "kimi-k2-instruct"},
    {K3C_CHAT_K2_THINKING, "kimi-k2-thinking"},
    {K3C_CHAT_K2_THINKING_MOONSHOT, "kimi-k2-thinking-moonshot"},
    {K3C_CHAT_KIMI_LINEAR, "kimi-linear"},
    {K3C_CHAT_K3, "kimi-k3"},
};
#define N_FORMATS (sizeof format_names / sizeof format_names[0])

/* The templates k3c reproduces, by fingerprint (tests/fixtures/chat/, each file's source in README.md there;
 * test_chat checks every fixture maps to its format). */
static const struct {
    uint64_t fnv;
    size_t len;
    k3c_chat_format format;
    const char *file;
} known_templates[] = {
    {0x03b73e6a09dd8ecbULL, 2518, K3C_CHAT_K2_INSTRUCT, "llama.cpp Kimi-K2-Instruct.jinja"},
    {0xc45c611cc68f7fc0ULL, 4129, K3C_CHAT_K2_THINKING, "llama.cpp Kimi-K2-Thinking.jinja"},
    {0xaafa7d2fab38eaceULL, 3429, K3C_CHAT_K2_THINKING_MOONSHOT, "Moonshot Kimi-K2-Thinking chat_template"},
    {0x3bf6646373cdb7aeULL, 14907, K3C_CHAT_K3, "llama.cpp Kimi-K3.jinja"},
};

const char *k3c_chat_format_name(k3c_chat_format f) {
    for (size_t i = 0; i < N_FORMATS; i++)
        if (format_names[i].format == f) return format_names[i].name;
    return NULL;
}

int k3c_chat_format_from_name(const char *name, k3c_chat_format *out) {
    for (size_t i = 0; i < N_FORMATS; i++)
        if (name && strcmp(name, format_names[i].name) == 0) {
            *out = format_names[i].format;
            return K3C_OK;
        }
    return k3c_errorf("chat format '%s' is not known; known: kimi-k2-instruct, kimi-k2-thinking, "
                      "kimi-k2-thinking-moonshot, kimi-linear, kimi-k3",
                      name ? name : "(null)");
}

k3c_chat_format k3c_chat_format_default(k3c_family family) {
    return family == K3C_FAMILY_K3 ? K3C_CHAT_K3 : K3C_CHAT_KIMI_LINEAR;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int k3c_chat_format_detect(const char *text, size_t len, const char *source, k3c_chat_format *out) {
    size_t a = 0, b = len;
    while (a < b && is_ws(text[a])) a++;
    while (b > a && is_ws(text[b - 1])) b--;
    uint64_t h = 0xcbf29ce484222325ULL;
    size_t n = 0;
    for (size_t i = a; i < b; i++) {
        if (text[i] == '\r' && i + 1 < b && text[i + 1] == '\n') continue;
        h = (h ^ (unsigned char)text[i]) * 0x100000001b3ULL;
        n++;
    }
    for (size_t i = 0; i < sizeof known_templates / sizeof known_templates[0]; i++)
        if (known_templates[i].fnv == h && known_templates[i].len == n) {
            *out = known_templates[i].format;
            return K3C_OK;
        }
    return k3c_errorf("%s: chat template not known to k3c (fnv1a64 %016llx over %zu normalised bytes); k3c "
                      "renders only the templates it reproduces exactly (docs/TEXT.md): Kimi-K2-Instruct and "
                      "Kimi-K2-Thinking (llama.cpp), Kimi-K2-Thinking (Moonshot), Kimi-K3; choose one "
                      "explicitly with a chat-format option if the model uses one of those formats",
                      source, (unsigned long long)h, n);
}

static int file_exists(const char *path, int *exists) {
    struct stat st;
    if (stat(path, &st) == 0) {
        *exists = 1;
        return K3C_OK;
    }
    if (errno == ENOENT || errno == ENOTDIR) {
        *exists = 0;
        return K3C_OK;
    }
    return k3c_errorf("%s: %s", path, strerror(errno));
}

static void set_source(char *source, size_t n, const char *s) {
    if (source && n) snprintf(source, n, "%s", s);
}

int k3c_chat_format_load(const char *model_dir, k3c_family family, k3c_chat_format *out, char *source,
                         size_t source_n) {
    char path[4096];
    int exists = 0;
    if ((size_t)snprintf(path, sizeof path, "%s/chat_template.jinja", model_dir) >= sizeof path)
        return k3c_errorf("%s: model directory path too long", model_dir);
    K3C_TRY(file_exists(path, &exists));
    if (exists) {
        char *text = NULL;
        size_t len = 0;
        K3C_TRY(k3c_read_file(path, (size_t)16 << 20, &text, &len));
        int rc = k3c_chat_format_detect(text, len, path, out);
        free(text);
        if (rc == K3C_OK) set_source(source, source_n, path);
        return rc;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    K3C_TRY(file_exists(path, &exists));
    if (exists) {
        char *text = NULL;
        size_t len = 0;
        K3C_TRY(k3c_read_file(path, (size_t)64 << 20, &text, &len));
        const char *end = NULL;
        cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
        free(text);
        if (!root || !cJSON_IsObject(root)) {
            cJSON_Delete(root);
            return k3c_errorf("%s: not a JSON object", path);
        }
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
        int rc = K3C_OK;
        if (cJSON_IsString(t)) {
            char what[4200];
            snprintf(what, sizeof what, "%s (chat_template)", path);
            rc = k3c_chat_format_detect(t->valuestring, strlen(t->valuestring), what, out);
            if (rc == K3C_OK) set_source(source, source_n, what);
            cJSON_Delete(root);
            return rc;
        }
        if (t && !cJSON_IsNull(t)) {
            rc = k3c_errorf("%s: chat_template is %s; k3c reads a single template string (named template "
                            "lists are not supported)",
                            path, k3c_json_kind(t));
            cJSON_Delete(root);
            return rc;
        }
        cJSON_Delete(root);
    }
    *out = k3c_chat_format_default(family);
    char what[64];
    snprintf(what, sizeof what, "default for %s", family == K3C_FAMILY_K3 ? "Kimi K3" : "Kimi Linear");
    set_source(source, source_n, what);
    return K3C_OK;
}

/* ---- the prompt being built ---------------------------------------------------------------------------- */

void chat_emit(chat_out *o, k3c_chat_seg_kind kind, const char *s, size_t n) {
    if (!n || o->failed) return;
    if (o->n_segs == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 64;
        k3c_chat_segment *p = realloc(o->segs, cap * sizeof *p);
        if (!p) {
            o->failed = 1;
            return;
        }
        o->segs = p;
        o->cap = cap;
    }
    o->segs[o->n_segs++] = (k3c_chat_segment){o->text.len, n, kind};
    k3c_strbuf_put(&o->text, s, n);
}

int chat_get_string(const cJSON *msg, size_t i, const char *key, const char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(msg, key);
    *out = NULL;
    if (!v || cJSON_IsNull(v)) return K3C_OK;
    if (!cJSON_IsString(v)) return k3c_errorf("messages[%zu].%s: expected a string, got %s", i, key, k3c_json_kind(v));
    *out = v->valuestring;
    return K3C_OK;
}

int chat_truthy(const cJSON *v) {
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v)) return 0;
    if (cJSON_IsString(v)) return v->valuestring && v->valuestring[0];
    if (cJSON_IsNumber(v)) return v->valuedouble != 0;
    if (cJSON_IsArray(v) || cJSON_IsObject(v)) return v->child != NULL;
    return 1;
}

int chat_check_content(const cJSON *content, size_t i, const char *field) {
    if (!content || cJSON_IsNull(content) || cJSON_IsString(content)) return K3C_OK;
    if (!cJSON_IsArray(content))
        return k3c_errorf("messages[%zu].%s: expected a string, a list of text parts or null, got %s", i, field,
                          k3c_json_kind(content));
    size_t j = 0;
    for (const cJSON *part = content->child; part; part = part->next, j++) {
        if (!cJSON_IsObject(part))
            return k3c_errorf("messages[%zu].%s[%zu]: expected a content part object, got %s", i, field, j,
                              k3c_json_kind(part));
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        if ((cJSON_IsString(type) && (!strcmp(type->valuestring, "image") || !strcmp(type->valuestring, "image_url"))) ||
            cJSON_GetObjectItemCaseSensitive(part, "image") || cJSON_GetObjectItemCaseSensitive(part, "image_url"))
            return k3c_errorf("messages[%zu].%s[%zu]: image parts are not supported (k3c has no vision input)", i,
                              field, j);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (text && !cJSON_IsString(text))
            return k3c_errorf("messages[%zu].%s[%zu].text: expected a string, got %s", i, field, j,
                              k3c_json_kind(text));
    }
    return K3C_OK;
}

int chat_check_messages(const cJSON *messages) {
    if (!cJSON_IsArray(messages))
        return k3c_errorf("messages: expected an array, got %s", k3c_json_kind(messages));
    size_t i = 0;
    for (const cJSON *m = messages->child; m; m = m->next, i++) {
        if (!cJSON_IsObject(m)) return k3c_errorf("messages[%zu]: expected an object, got %s", i, k3c_json_kind(m));
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role))
            return k3c_errorf("messages[%zu].role: expected a string, got %s", i, k3c_json_kind(role));
        K3C_TRY(chat_check_content(cJSON_GetObjectItemCaseSensitive(m, "content"), i, "content"));
    }
    return K3C_OK;
}

/* ---- entry ---------------------------------------------------------------------------------------------- */

int k3c_chat_render(k3c_chat_format format, const k3c_chat_request *req, k3c_chat_prompt *out) {
    memset(out, 0, sizeof *out);
    if (req->tools && !cJSON_IsNull(req->tools) && !cJSON_IsArray(req->tools))
        return k3c_errorf("tools: expected an array, got %s", k3c_json_kind(req->tools));
    K3C_TRY(chat_check_messages(req->messages));
    chat_out o = {0};
    int rc;
    switch (format) {
    case K3C_CHAT_K2_INSTRUCT:
    case K3C_CHAT_K2_THINKING:
    case K3C_CHAT_K2_THINKING_MOONSHOT:
    case K3C_CHAT_KIMI_LINEAR: rc = chat_render_k2(format, req, &o); break;
    case K3C_CHAT_K3: rc = chat_render_k3(req, &o); break;
    default: rc = k3c_errorf("chat format %d is not a format k3c renders", (int)format); break;
    }
    if (rc == K3C_OK && (o.failed || o.text.failed)) rc = k3c_errorf("rendering the chat prompt: out of memory");
    if (rc != K3C_OK) {
        k3c_strbuf_free(&o.text);
        free(o.segs);
        return K3C_ERR;
    }
    size_t len = 0;
    out->text = k3c_strbuf_take(&o.text, &len);
    if (!out->text) {
        free(o.segs);
        return k3c_errorf("rendering the chat prompt: out of memory");
    }
    out->len = len;
    out->segs = o.segs;
    out->n_segs = o.n_segs;
    return K3C_OK;
}

void k3c_chat_prompt_free(k3c_chat_prompt *p) {
    free(p->text);
    free(p->segs);
    memset(p, 0, sizeof *p);
}
