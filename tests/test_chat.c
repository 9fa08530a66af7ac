/* Chat rendering against the published templates: every conversation of tests/fixtures/chat/conversations.json
 * rendered natively must equal, byte for byte, what Python jinja2 rendered from the template
 * (tools/chat/make_goldens.py -> goldens.json); plus template fingerprints, the model directory's template,
 * K3's segments and the refusals. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"
#include "text/chat.h"
#include "text/pyjson.h"
#include "util/error.h"
#include "util/file.h"

#define CHAT_FIXTURES "tests/fixtures/chat"

static cJSON *load_json(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (k3c_read_file(path, (size_t)64 << 20, &text, &len) != K3C_OK) return NULL;
    cJSON *root = k3c_pyjson_parse(text, len, path);
    free(text);
    return root;
}

static const struct {
    const char *file;
    k3c_chat_format format;
} fixture_formats[] = {
    {"Kimi-K2-Instruct.jinja", K3C_CHAT_K2_INSTRUCT},
    {"Kimi-K2-Thinking.jinja", K3C_CHAT_K2_THINKING},
    {"moonshotai-Kimi-K2-Thinking.jinja", K3C_CHAT_K2_THINKING_MOONSHOT},
    {"Kimi-K3.jinja", K3C_CHAT_K3},
};
#define N_FIXTURES (sizeof fixture_formats / sizeof fixture_formats[0])

static const cJSON *find_conversation(const cJSON *corpus, const char *name) {
    for (const cJSON *c = corpus->child; c; c = c->next) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(c, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return c;
    }
    return NULL;
}

static k3c_chat_request request_of(const cJSON *conv) {
    k3c_chat_request r = {0};
    r.messages = cJSON_GetObjectItemCaseSensitive(conv, "messages");
    r.tools = cJSON_GetObjectItemCaseSensitive(conv, "tools");
    r.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conv, "add_generation_prompt"));
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(conv, "kwargs");
    if (kw) {
        r.no_thinking = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(kw, "thinking"));
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(kw, "thinking_effort");
        if (cJSON_IsString(e)) r.thinking_effort = e->valuestring;
        r.tool_choice = cJSON_GetObjectItemCaseSensitive(kw, "tool_choice");
        r.response_format = cJSON_GetObjectItemCaseSensitive(kw, "response_format");
    }
    return r;
}

/* Segments cover the text exactly, in order, none empty; a SPECIAL segment is one K3 marker. */
static int segments_ok(const k3c_chat_prompt *p, k3c_chat_format f) {
    size_t at = 0;
    for (size_t i = 0; i < p->n_segs; i++) {
        const k3c_chat_segment *s = &p->segs[i];
        if (s->off != at || s->len == 0) return 0;
        if (f == K3C_CHAT_K3) {
            if (s->kind == K3C_CHAT_SEG_MIXED) return 0;
            if (s->kind == K3C_CHAT_SEG_SPECIAL) {
                static const char *const marks[] = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
                int ok = 0;
                for (int k = 0; k < 4; k++)
                    ok |= strlen(marks[k]) == s->len && !memcmp(p->text + s->off, marks[k], s->len);
                if (!ok) return 0;
            }
        } else if (s->kind != K3C_CHAT_SEG_MIXED || p->n_segs != 1) {
            return 0;
        }
        at += s->len;
    }
    return at == p->len && strlen(p->text) == p->len;
}

static void show_diff(const char *what, const char *want, const char *got, size_t got_len) {
    size_t i = 0, wl = strlen(want);
    while (i < wl && i < got_len && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    fprintf(stderr, "    %s: first difference at byte %zu\n      want: %.120s\n      got:  %.*s\n", what, i, want + from,
            (int)(got_len - from < 120 ? got_len - from : 120), got + from);
}

TEST(chat_goldens_byte_exact) {
    cJSON *corpus = load_json(CHAT_FIXTURES "/conversations.json");
    cJSON *goldens = load_json(CHAT_FIXTURES "/goldens.json");
    CHECKF(corpus && goldens, "fixtures: %s", k3c_error_message());
    size_t equal[N_FIXTURES] = {0}, total[N_FIXTURES] = {0};
    int all = 1;
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(goldens, "cases");
    CHECK(cJSON_GetArraySize(cases) >= 4 * 30);
    for (const cJSON *c = cases->child; c; c = c->next) {
        const char *tname = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        const char *cname = cJSON_GetObjectItemCaseSensitive(c, "conversation")->valuestring;
        size_t t = 0;
        while (t < N_FIXTURES && strcmp(fixture_formats[t].file, tname)) t++;
        CHECKF(t < N_FIXTURES, "golden for unknown template %s", tname);
        const cJSON *conv = find_conversation(corpus, cname);
        CHECKF(conv, "golden for unknown conversation %s", cname);
        k3c_chat_request req = request_of(conv);
        k3c_chat_prompt p;
        int rc = k3c_chat_render(fixture_formats[t].format, &req, &p);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "text");
        int ok;
        total[t]++;
        if (cJSON_IsString(want)) {
            ok = rc == K3C_OK && p.len == strlen(want->valuestring) && !memcmp(p.text, want->valuestring, p.len) &&
                 segments_ok(&p, fixture_formats[t].format);
            if (!ok) {
                fprintf(stderr, "    %s / %s differs%s%s\n", tname, cname, rc ? ": " : "", rc ? k3c_error_message() : "");
                if (rc == K3C_OK) show_diff(cname, want->valuestring, p.text, p.len);
            }
        } else {
            /* the template raises: k3c must refuse too */
            ok = rc != K3C_OK;
            if (!ok) fprintf(stderr, "    %s / %s: the template raises, k3c rendered\n", tname, cname);
        }
        if (rc == K3C_OK) k3c_chat_prompt_free(&p);
        equal[t] += ok;
        all &= ok;
    }
    for (size_t t = 0; t < N_FIXTURES; t++)
        printf("    chat goldens %-34s %zu/%zu equal\n", fixture_formats[t].file, equal[t], total[t]);
    cJSON_Delete(corpus);
    cJSON_Delete(goldens);
    CHECK(all);
}

/* Python's repr of 2000 doubles (edge values, random bit patterns, short decimals), as json.dumps writes them. */
TEST(chat_pyjson_float_repr) {
    cJSON *goldens = load_json(CHAT_FIXTURES "/goldens.json");
    CHECK(goldens);
    const cJSON *nums = cJSON_GetObjectItemCaseSensitive(goldens, "numbers");
    CHECK(cJSON_GetArraySize(nums) >= 2000);
    size_t bad = 0;
    for (const cJSON *n = nums->child; n; n = n->next) {
        uint64_t bits = strtoull(cJSON_GetObjectItemCaseSensitive(n, "bits")->valuestring, NULL, 16);
        const char *want = cJSON_GetObjectItemCaseSensitive(n, "repr")->valuestring;
        double v;
        memcpy(&v, &bits, sizeof v);
        /* a float literal (what json.loads would have read): "1.0" says float whatever its value */
        cJSON *item = cJSON_CreateNumber(v);
        char lit[64];
        snprintf(lit, sizeof lit, "%.17g%s", v, strpbrk(want, ".e") ? "" : ".0");
        if (!strpbrk(lit, ".eEin")) strcat(lit, ".0");
        item->valuestring = strdup(lit);
        k3c_strbuf b = {0};
        k3c_pyjson_number(&b, item);
        if (strcmp(k3c_strbuf_cstr(&b), want) != 0 && bad++ < 5)
            fprintf(stderr, "    %016llx: want %s got %s\n", (unsigned long long)bits, want, b.data);
        k3c_strbuf_free(&b);
        cJSON_Delete(item);
    }
    cJSON_Delete(goldens);
    CHECKF(bad == 0, "%zu doubles differ from Python's repr", bad);
}

/* json.loads semantics: integers stay integers, floats keep their float text, duplicate keys collapse. */
TEST(chat_pyjson_dump_python_semantics) {
    const char *in = "{\"b\": 1, \"a\": [1.0, -0, 1E2, 12345678901234567890, 0.5, 1e-9, true, null, \"\\u00e9\\n\\u0001\\\"\"], "
                     "\"b\": {\"z\": 2, \"y\": 3}}";
    cJSON *v = k3c_pyjson_parse(in, strlen(in), "test");
    CHECK(v);
    k3c_strbuf b = {0};
    k3c_pyjson_dump(&b, v, 0);
    CHECKF(!strcmp(b.data, "{\"b\": {\"z\": 2, \"y\": 3}, \"a\": [1.0, 0, 100.0, 12345678901234567890, 0.5, 1e-09, true, "
                           "null, \"\xc3\xa9\\n\\u0001\\\"\"]}"),
           "got %s", b.data);
    k3c_strbuf_clear(&b);
    k3c_pyjson_dump(&b, v, K3C_PYJSON_COMPACT | K3C_PYJSON_SORT_KEYS);
    CHECKF(!strcmp(b.data, "{\"a\":[1.0,0,100.0,12345678901234567890,0.5,1e-09,true,null,\"\xc3\xa9\\n\\u0001\\\"\"],"
                           "\"b\":{\"y\":3,\"z\":2}}"),
           "got %s", b.data);
    /* a number changed after parsing loses its stale literal */
    cJSON_SetNumberValue(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(v, "a"), 0), 7);
    k3c_strbuf_clear(&b);
    k3c_pyjson_dump(&b, cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(v, "a"), 0), 0);
    CHECKF(!strcmp(b.data, "7"), "got %s", b.data);
    k3c_strbuf_free(&b);
    cJSON_Delete(v);
    CHECK(k3c_pyjson_parse("{\"a\": 1} x", 10, "test") == NULL);
    CHECK(strstr(k3c_error_message(), "extra data"));
    CHECK(k3c_pyjson_parse("{\"a\": ", 6, "test") == NULL);
    CHECK(k3c_py_isblank(" \t\n\xc2\xa0\xe3\x80\x80\x1c", 9));
    CHECK(!k3c_py_isblank(" \xe2\x80\x8b", 4)); /* U+200B is not a Python space */
}

static int read_whole(const char *path, char **text, size_t *len) { return k3c_read_file(path, (size_t)1 << 20, text, len); }

/* Each fixture template is recognised; a one-byte change or a different template is refused, naming the source. */
TEST(chat_detect_fingerprints) {
    for (size_t t = 0; t < N_FIXTURES; t++) {
        char path[256], *text = NULL;
        size_t len = 0;
        snprintf(path, sizeof path, CHAT_FIXTURES "/%s", fixture_formats[t].file);
        CHECK_OK(read_whole(path, &text, &len));
        k3c_chat_format f = K3C_CHAT_NONE;
        CHECK_OK(k3c_chat_format_detect(text, len, path, &f));
        CHECKF(f == fixture_formats[t].format, "%s detected as %d", path, (int)f);
        /* CRLF line ends and surrounding whitespace do not matter */
        k3c_strbuf crlf = {0};
        k3c_strbuf_puts(&crlf, "\n  ");
        for (size_t i = 0; i < len; i++) {
            if (text[i] == '\n') k3c_strbuf_putc(&crlf, '\r');
            k3c_strbuf_putc(&crlf, text[i]);
        }
        f = K3C_CHAT_NONE;
        CHECK_OK(k3c_chat_format_detect(crlf.data, crlf.len, "crlf", &f));
        CHECK(f == fixture_formats[t].format);
        k3c_strbuf_free(&crlf);
        /* one byte inside changed: refused */
        text[len / 2] ^= 0x20;
        CHECK(k3c_chat_format_detect(text, len, "/models/x/chat_template.jinja", &f) != K3C_OK);
        CHECK(strstr(k3c_error_message(), "/models/x/chat_template.jinja"));
        CHECK(strstr(k3c_error_message(), "not known"));
        free(text);
    }
    k3c_chat_format f;
    const char *chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    CHECK(k3c_chat_format_detect(chatml, strlen(chatml), "tokenizer_config.json", &f) != K3C_OK);
}

static int write_file(const char *path, const char *text) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t n = fwrite(text, 1, strlen(text), fp);
    return fclose(fp) == 0 && n == strlen(text) ? 0 : -1;
}

/* chat_template.jinja first, then tokenizer_config.json's chat_template, then the family's default. */
TEST(chat_load_model_dir) {
    char dir[512], path[600], src[600];
    k3c_chat_format f;
    snprintf(dir, sizeof dir, "%s/chatdir", test_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_OK(k3c_chat_format_load(dir, K3C_FAMILY_K3, &f, src, sizeof src));
    CHECK(f == K3C_CHAT_K3 && strstr(src, "default"));
    CHECK_OK(k3c_chat_format_load(dir, K3C_FAMILY_KIMI_LINEAR, &f, src, sizeof src));
    CHECK(f == K3C_CHAT_KIMI_LINEAR);

    /* tokenizer_config.json with the Moonshot K2-Thinking template as a JSON string */
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(read_whole(CHAT_FIXTURES "/moonshotai-Kimi-K2-Thinking.jinja", &text, &len));
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", text);
    cJSON_AddStringToObject(cfg, "bos_token", "[BOS]");
    char *cfg_text = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(write_file(path, cfg_text) == 0);
    free(cfg_text);
    free(text);
    CHECK_OK(k3c_chat_format_load(dir, K3C_FAMILY_K3, &f, src, sizeof src));
    CHECK(f == K3C_CHAT_K2_THINKING_MOONSHOT && strstr(src, "tokenizer_config.json"));

    /* chat_template.jinja wins; an unknown one is refused, naming the file */
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    CHECK(write_file(path, "{{ messages }}") == 0);
    CHECK(k3c_chat_format_load(dir, K3C_FAMILY_K3, &f, src, sizeof src) != K3C_OK);
    CHECK(strstr(k3c_error_message(), "chat_template.jinja"));
    remove(path);

    /* a named-template list is refused */
    cJSON_ReplaceItemInObject(cfg, "chat_template", cJSON_Parse("[{\"name\": \"default\", \"template\": \"x\"}]"));
    cfg_text = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(write_file(path, cfg_text) == 0);
    free(cfg_text);
    cJSON_Delete(cfg);
    CHECK(k3c_chat_format_load(dir, K3C_FAMILY_K3, &f, src, sizeof src) != K3C_OK);
    CHECK(strstr(k3c_error_message(), "list"));

    /* no chat_template key: the default */
    CHECK(write_file(path, "{\"bos_token\": \"[BOS]\"}") == 0);
    CHECK_OK(k3c_chat_format_load(dir, K3C_FAMILY_KIMI_LINEAR, &f, src, sizeof src));
    CHECK(f == K3C_CHAT_KIMI_LINEAR);
    CHECK(write_file(path, "{not json") == 0);
    CHECK(k3c_chat_format_load(dir, K3C_FAMILY_KIMI_LINEAR, &f, src, sizeof src) != K3C_OK);

    for (int i = K3C_CHAT_K2_INSTRUCT; i <= K3C_CHAT_K3; i++) {
        k3c_chat_format g;
        CHECK_OK(k3c_chat_format_from_name(k3c_chat_format_name((k3c_chat_format)i), &g));
        CHECK(g == (k3c_chat_format)i);
    }
    CHECK(k3c_chat_format_from_name("chatml", &f) != K3C_OK);
}

static int render_json(k3c_chat_format f, const char *messages, int agp, k3c_chat_prompt *p) {
    cJSON *m = k3c_pyjson_parse(messages, strlen(messages), "messages");
    if (!m) return K3C_ERR;
    k3c_chat_request r = {.messages = m, .add_generation_prompt = agp};
    int rc = k3c_chat_render(f, &r, p);
    cJSON_Delete(m);
    return rc;
}

/* The transformers test's Kimi Linear prompt (tokenizer-chat.md §6: ids 163587 2482 163601 ... 163588 69702
 * 163601 are <|im_user|> user <|im_middle|> ... <|im_end|> <|im_assistant|> assistant <|im_middle|>). */
TEST(chat_kimi_linear_transformers_vector) {
    k3c_chat_prompt p;
    CHECK_OK(render_json(K3C_CHAT_KIMI_LINEAR, "[{\"role\": \"user\", \"content\": \"Tell me about the french revolution.\"}]",
                         1, &p));
    CHECK(!strcmp(p.text, "<|im_user|>user<|im_middle|>Tell me about the french revolution.<|im_end|>"
                          "<|im_assistant|>assistant<|im_middle|>"));
    k3c_chat_prompt_free(&p);
}

/* K3: special-token text inside content stays in TEXT segments; the markers are SPECIAL segments. */
TEST(chat_k3_segments) {
    k3c_chat_prompt p;
    CHECK_OK(render_json(K3C_CHAT_K3, "[{\"role\": \"user\", \"content\": \"a<|open|>b<|sep|>\", \"name\": \"x\\\"&\"}]", 1, &p));
    int found_content = 0, found_name = 0;
    for (size_t i = 0; i < p.n_segs; i++) {
        const k3c_chat_segment *s = &p.segs[i];
        if (s->len == 17 && !memcmp(p.text + s->off, "a<|open|>b<|sep|>", 17)) found_content = s->kind == K3C_CHAT_SEG_TEXT;
        if (s->len == 12 && !memcmp(p.text + s->off, "x&quot;&amp;", 12)) found_name = s->kind == K3C_CHAT_SEG_TEXT;
    }
    CHECK(found_content && found_name);
    /* the attribute is four text segments: " name", "=\"", value, "\"" (encoding_k3.py @2ec5134c) */
    const char *at = strstr(p.text, " name=\"");
    CHECK(at);
    size_t off = (size_t)(at - p.text), k = 0;
    while (k < p.n_segs && p.segs[k].off != off) k++;
    CHECK(k + 3 < p.n_segs && p.segs[k].len == 5 && p.segs[k + 1].len == 2 && p.segs[k + 2].len == 12 &&
          p.segs[k + 3].len == 1);
    k3c_chat_prompt_free(&p);

    /* the exact non-thinking string of vLLM's test */
    cJSON *m = cJSON_Parse("[{\"role\": \"user\", \"content\": \"hello\"}]");
    k3c_chat_request r = {.messages = m, .add_generation_prompt = 1, .no_thinking = 1};
    CHECK_OK(k3c_chat_render(K3C_CHAT_K3, &r, &p));
    CHECK(!strcmp(p.text, "<|open|>message role=\"user\"<|sep|>hello<|close|>message<|sep|><|end_of_msg|><|open|>message "
                          "role=\"assistant\"<|sep|><|open|>response<|sep|>"));
    CHECK(p.n_segs == 22);
    k3c_chat_prompt_free(&p);
    cJSON_Delete(m);
}

/* Input a format cannot express is refused with the message index and field; nothing is returned. */
TEST(chat_refusals) {
    static const struct {
        k3c_chat_format f;
        const char *messages, *needle;
    } cases[] = {
        {K3C_CHAT_K2_INSTRUCT, "[{\"content\": \"x\"}]", "messages[0].role"},
        {K3C_CHAT_K3, "[{\"role\": 5, \"content\": \"x\"}]", "messages[0].role"},
        {K3C_CHAT_K2_THINKING, "[{\"role\": \"user\", \"content\": 5}]", "messages[0].content"},
        {K3C_CHAT_K3, "[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": \"x\"}}]}]",
         "image"},
        {K3C_CHAT_K2_INSTRUCT, "[{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]", "image"},
        {K3C_CHAT_K3, "[{\"role\": \"developer\", \"content\": \"x\"}]", "developer"},
        {K3C_CHAT_K3, "[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]",
         "function name"},
        {K3C_CHAT_K3, "[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"[1]\"}}]}]",
         "JSON object"},
        {K3C_CHAT_K2_INSTRUCT, "[{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]",
         "function.name"},
        {K3C_CHAT_K3, "[{\"role\": \"user\"}, {\"role\": \"tool\", \"content\": \"r\"}]", "tool name"},
        {K3C_CHAT_K2_INSTRUCT, "{\"role\": \"user\"}", "messages"},
        {K3C_CHAT_K3, "[\"hello\"]", "messages[0]"},
        {K3C_CHAT_K2_THINKING_MOONSHOT, "[{\"role\": \"user\", \"name\": 3, \"content\": \"x\"}]", "messages[0].name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k3c_chat_prompt p = {(char *)1, 1, NULL, 1};
        int rc = render_json(cases[i].f, cases[i].messages, 1, &p);
        CHECKF(rc != K3C_OK, "case %zu rendered", i);
        CHECKF(strstr(k3c_error_message(), cases[i].needle), "case %zu: %s", i, k3c_error_message());
        CHECK(p.text == NULL && p.segs == NULL && p.n_segs == 0);
    }
    cJSON *m = cJSON_Parse("[{\"role\": \"user\", \"content\": \"x\"}]");
    k3c_chat_request r = {.messages = m, .thinking_effort = "medium"};
    k3c_chat_prompt p;
    CHECK(k3c_chat_render(K3C_CHAT_K3, &r, &p) != K3C_OK && strstr(k3c_error_message(), "thinking_effort"));
    r.thinking_effort = NULL;
    r.tools = m->child; /* an object, not a list */
    CHECK(k3c_chat_render(K3C_CHAT_K2_INSTRUCT, &r, &p) != K3C_OK && strstr(k3c_error_message(), "tools"));
    cJSON_Delete(m);
}
