/* The public chat API (k3c.h "chat"): a request body -> prompt ids, and generated ids -> the assistant message.
 * (1) Every golden conversation encodes to the ids of the golden text (what jinja2 rendered from the published
 *     template) tokenized the way its format says: K2 family the whole text with specials allowed; K3 each
 *     piece on its own (markers by id, text with specials off); the ids decode back to the golden text.
 * (2) Random assistant messages (content, reasoning, tool calls with random arguments) round-trip: the
 *     conversation with the message, minus the prompt with the generation prompt, fed id by id to the public
 *     parser, gives the message back as JSON. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "test.h"
#include "text/chat.h"
#include "text/pyjson.h"
#include "text/strbuf.h"
#include "util/error.h"
#include "util/file.h"
#include "util/rng.h"

static cJSON *load_fixture(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (k3c_read_file(path, (size_t)64 << 20, &text, &len) != K3C_OK) return NULL;
    cJSON *root = k3c_pyjson_parse(text, len, path);
    free(text);
    return root;
}

/* The request body of a corpus conversation, as an OpenAI client would send it (json.dumps of the fields). */
static char *request_body(const cJSON *conv) {
    cJSON *o = cJSON_CreateObject();
    static const char *const keys[] = {"messages", "tools", "add_generation_prompt"};
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(conv, keys[i]);
        if (v) cJSON_AddItemReferenceToObject(o, keys[i], (cJSON *)v);
    }
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(conv, "kwargs");
    if (kw) {
        cJSON *ctk = cJSON_AddObjectToObject(o, "chat_template_kwargs");
        for (const cJSON *k = kw->child; k; k = k->next) {
            int top = !strcmp(k->string, "tool_choice") || !strcmp(k->string, "response_format");
            cJSON_AddItemReferenceToObject(top ? o : ctk, k->string, (cJSON *)k);
        }
    }
    k3c_strbuf b = {0};
    k3c_pyjson_dump(&b, o, 0);
    cJSON_Delete(o);
    return k3c_strbuf_take(&b, NULL);
}

static const struct {
    const char *file;
    k3c_chat_format format;
    const char *name;
} formats[] = {
    {"Kimi-K2-Instruct.jinja", K3C_CHAT_K2_INSTRUCT, "kimi-k2-instruct"},
    {"Kimi-K2-Thinking.jinja", K3C_CHAT_K2_THINKING, "kimi-k2-thinking"},
    {"moonshotai-Kimi-K2-Thinking.jinja", K3C_CHAT_K2_THINKING_MOONSHOT, "kimi-k2-thinking-moonshot"},
    {"Kimi-K3.jinja", K3C_CHAT_K3, "kimi-k3"},
};
#define N_FORMATS (sizeof formats / sizeof formats[0])

/* The tokenizers the synthesized presets ship: K3's special layout for K3, Kimi Linear's (K2's) for the rest. */
static k3c_tokenizer *tokenizer_for(k3c_chat_format f) {
    k3c_tokenizer *t = NULL;
    return k3c_tokenizer_load_preset(f == K3C_CHAT_K3 ? "tiny" : "kimi-linear-tiny", &t) == K3C_OK ? t : NULL;
}

TEST(chat_tokens_goldens) {
    cJSON *corpus = load_fixture("tests/fixtures/chat/conversations.json");
    cJSON *goldens = load_fixture("tests/fixtures/chat/goldens.json");
    CHECKF(corpus && goldens, "fixtures: %s", k3c_error_message());
    k3c_tokenizer *tok[N_FORMATS];
    k3c_chat_template *tpl[N_FORMATS];
    for (size_t f = 0; f < N_FORMATS; f++) {
        CHECK((tok[f] = tokenizer_for(formats[f].format)));
        CHECK_OK(k3c_chat_template_from_name(formats[f].name, &tpl[f]));
        CHECK(!strcmp(k3c_chat_template_name(tpl[f]), formats[f].name));
    }
    size_t equal[N_FORMATS] = {0}, total[N_FORMATS] = {0}, specials = 0;
    int all = 1;
    const cJSON *cases = cJSON_GetObjectItemCaseSensitive(goldens, "cases");
    for (const cJSON *c = cases->child; c; c = c->next) {
        const char *tname = cJSON_GetObjectItemCaseSensitive(c, "template")->valuestring;
        const char *cname = cJSON_GetObjectItemCaseSensitive(c, "conversation")->valuestring;
        size_t f = 0;
        while (f < N_FORMATS && strcmp(formats[f].file, tname)) f++;
        CHECK(f < N_FORMATS);
        const cJSON *conv = NULL;
        for (conv = corpus->child; conv; conv = conv->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(conv, "name")->valuestring, cname)) break;
        CHECK(conv);
        char *body = request_body(conv);
        CHECK(body);
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, "text");
        k3c_tokens got = {.ids = NULL}, ref = {.ids = NULL};
        CHECK_OK(k3c_tokenizer_encode_ordinary(tok[f], "x", 1, &got)); /* encode appends: keep what was there */
        int rc = k3c_chat_encode(tpl[f], tok[f], body, strlen(body), &got);
        int ok;
        total[f]++;
        if (!cJSON_IsString(want)) {
            ok = rc != K3C_OK && got.n == 1; /* the template raises: refused, nothing appended */
        } else if (rc != K3C_OK) {
            ok = 0;
            fprintf(stderr, "    %s / %s: %s\n", tname, cname, k3c_error_message());
        } else {
            const char *text = want->valuestring;
            size_t len = strlen(text);
            ok = 1;
            if (formats[f].format == K3C_CHAT_K3) {
                /* the segments of the render (its text is the golden's: chat_goldens_byte_exact), each on its own */
                cJSON *req = k3c_pyjson_parse(body, strlen(body), "body");
                k3c_chat_request r = {.messages = cJSON_GetObjectItemCaseSensitive(req, "messages"),
                                      .tools = cJSON_GetObjectItemCaseSensitive(req, "tools"),
                                      .add_generation_prompt = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(req, "add_generation_prompt"))};
                const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
                r.no_thinking = cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(kw, "thinking"));
                const cJSON *e = cJSON_GetObjectItemCaseSensitive(kw, "thinking_effort");
                r.thinking_effort = cJSON_IsString(e) ? e->valuestring : NULL;
                r.tool_choice = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
                r.response_format = cJSON_GetObjectItemCaseSensitive(req, "response_format");
                k3c_chat_prompt p;
                ok = k3c_chat_render(K3C_CHAT_K3, &r, &p) == K3C_OK && p.len == len;
                for (size_t s = 0; ok && s < p.n_segs; s++) {
                    const k3c_chat_segment *sg = &p.segs[s];
                    if (sg->kind == K3C_CHAT_SEG_SPECIAL) {
                        char name[32];
                        snprintf(name, sizeof name, "%.*s", (int)sg->len, text + sg->off);
                        int32_t id = k3c_tokenizer_special_id(tok[f], name);
                        ok = id >= 0;
                        if (ok) {
                            k3c_tokens one = {.ids = NULL};
                            /* a marker's text encoded with specials allowed is that one id */
                            ok = k3c_tokenizer_encode(tok[f], text + sg->off, sg->len, 1, &one) == K3C_OK &&
                                 one.n == 1 && one.ids[0] == id;
                            if (ok) ok = k3c_tokenizer_encode(tok[f], text + sg->off, sg->len, 1, &ref) == K3C_OK;
                            k3c_tokens_free(&one);
                            specials++;
                        }
                    } else {
                        ok = sg->kind == K3C_CHAT_SEG_TEXT &&
                             k3c_tokenizer_encode_ordinary(tok[f], text + sg->off, sg->len, &ref) == K3C_OK;
                    }
                }
                k3c_chat_prompt_free(&p);
                cJSON_Delete(req);
            } else {
                ok = k3c_tokenizer_encode(tok[f], text, len, 1, &ref) == K3C_OK;
            }
            ok = ok && got.n == ref.n + 1 && !memcmp(got.ids + 1, ref.ids, ref.n * sizeof *ref.ids);
            char *dec = NULL;
            size_t dlen = 0;
            ok = ok && k3c_tokenizer_decode_bytes(tok[f], got.ids + 1, got.n - 1, &dec, &dlen) == K3C_OK &&
                 dlen == len && !memcmp(dec, text, len);
            free(dec);
            if (!ok) fprintf(stderr, "    %s / %s: %zu ids, want %zu\n", tname, cname, got.n - 1, ref.n);
        }
        k3c_tokens_free(&got);
        k3c_tokens_free(&ref);
        free(body);
        equal[f] += ok;
        all &= ok;
    }
    for (size_t f = 0; f < N_FORMATS; f++) {
        printf("    chat encode %-26s %zu/%zu equal\n", formats[f].name, equal[f], total[f]);
        k3c_chat_template_free(tpl[f]);
        k3c_tokenizer_free(tok[f]);
    }
    cJSON_Delete(corpus);
    cJSON_Delete(goldens);
    CHECK(all);
    CHECK(specials > 100);
}

/* ---- round trip ---- */

/* Words that exercise the tokenizer (multi-byte UTF-8, CJK, emoji split across byte-level tokens) and the
 * parser (quotes, braces, newlines in content), none spelling a special token. */
static const char *const words[] = {"hello", "world", "Kimi", "données", "中文", "测试。", "😀", "x=1", "{\"a\": 1}",
                                    "a\nb", "tab\there", "’quote’", "ÀÉÎ", "1234567", "foo_bar", "<tag>", "&amp;", "!?"};
#define N_WORDS (sizeof words / sizeof words[0])

static void random_text(k3c_strbuf *b, k3c_rng *r, int min_words) {
    int n = min_words + (int)(k3c_rng_next(r) % 6);
    for (int i = 0; i < n; i++) {
        if (i) k3c_strbuf_putc(b, ' ');
        k3c_strbuf_puts(b, words[k3c_rng_next(r) % N_WORDS]);
    }
}

static cJSON *random_args(k3c_rng *r) {
    cJSON *a = cJSON_CreateObject();
    int n = 1 + (int)(k3c_rng_next(r) % 3);
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        k3c_strbuf s = {0};
        switch (k3c_rng_next(r) % 3) {
        case 0:
            random_text(&s, r, 1);
            cJSON_AddStringToObject(a, key, k3c_strbuf_cstr(&s));
            break;
        case 1: cJSON_AddNumberToObject(a, key, (double)(k3c_rng_next(r) % 1000)); break;
        default: cJSON_AddBoolToObject(a, key, (int)(k3c_rng_next(r) & 1));
        }
        k3c_strbuf_free(&s);
    }
    return a;
}

static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather of a city\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"k0\": {\"type\": \"string\"}, \"k1\": {\"type\": "
    "\"string\"}, \"k2\": {\"type\": \"string\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"search\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {}}}}]";

/* The body of [system, user, (assistant)] with the given add_generation_prompt. */
static char *body_of(const cJSON *assistant, int agp, const char *user) {
    char *tools_s = NULL;
    cJSON *o = cJSON_CreateObject(), *m = cJSON_AddArrayToObject(o, "messages");
    cJSON *sys = cJSON_CreateObject(), *u = cJSON_CreateObject();
    cJSON_AddStringToObject(sys, "role", "system");
    cJSON_AddStringToObject(sys, "content", "You are a test.");
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", user);
    cJSON_AddItemToArray(m, sys);
    cJSON_AddItemToArray(m, u);
    if (assistant) cJSON_AddItemReferenceToArray(m, (cJSON *)assistant);
    cJSON_AddItemToObject(o, "tools", cJSON_Parse(tools_json));
    cJSON_AddBoolToObject(o, "add_generation_prompt", agp);
    tools_s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return tools_s;
}

/* got (the parser's JSON) carries what the message says: content, reasoning (where the format keeps it) and
 * each call's name and arguments (as JSON values; the id as the format writes it). */
static int same_message(const cJSON *want, const cJSON *got, int keep_reasoning, char *why, size_t why_n) {
    const cJSON *wc = cJSON_GetObjectItemCaseSensitive(want, "content"), *gc = cJSON_GetObjectItemCaseSensitive(got, "content");
    const char *wcs = cJSON_IsString(wc) ? wc->valuestring : "";
    const char *gcs = cJSON_IsString(gc) ? gc->valuestring : "";
    if (strcmp(wcs, gcs)) return snprintf(why, why_n, "content [%s], want [%s]", gcs, wcs), 0;
    const cJSON *wr = cJSON_GetObjectItemCaseSensitive(want, "reasoning_content");
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(got, "reasoning_content");
    const char *wrs = keep_reasoning && cJSON_IsString(wr) ? wr->valuestring : "";
    const char *grs = cJSON_IsString(gr) ? gr->valuestring : "";
    if (strcmp(wrs, grs)) return snprintf(why, why_n, "reasoning [%s], want [%s]", grs, wrs), 0;
    const cJSON *wt = cJSON_GetObjectItemCaseSensitive(want, "tool_calls"), *gt = cJSON_GetObjectItemCaseSensitive(got, "tool_calls");
    if (cJSON_GetArraySize(wt) != cJSON_GetArraySize(gt))
        return snprintf(why, why_n, "%d calls, want %d", cJSON_GetArraySize(gt), cJSON_GetArraySize(wt)), 0;
    int i = 0;
    for (const cJSON *w = wt ? wt->child : NULL, *g = gt ? gt->child : NULL; w; w = w->next, g = g->next, i++) {
        const cJSON *wf = cJSON_GetObjectItemCaseSensitive(w, "function"), *gf = cJSON_GetObjectItemCaseSensitive(g, "function");
        const char *wn = cJSON_GetObjectItemCaseSensitive(wf, "name")->valuestring;
        const cJSON *gn = cJSON_GetObjectItemCaseSensitive(gf, "name"), *gid = cJSON_GetObjectItemCaseSensitive(g, "id");
        char id[64];
        snprintf(id, sizeof id, "functions.%s:%d", wn, i);
        if (!cJSON_IsString(gn) || strcmp(gn->valuestring, wn) || !cJSON_IsString(gid) || strcmp(gid->valuestring, id))
            return snprintf(why, why_n, "call %d: name/id differ", i), 0;
        cJSON *wa = cJSON_Parse(cJSON_GetObjectItemCaseSensitive(wf, "arguments")->valuestring);
        const cJSON *gas = cJSON_GetObjectItemCaseSensitive(gf, "arguments");
        cJSON *ga = cJSON_IsString(gas) ? cJSON_Parse(gas->valuestring) : NULL;
        int same = wa && ga && cJSON_Compare(wa, ga, 1);
        if (!same) snprintf(why, why_n, "call %d: arguments %s", i, cJSON_IsString(gas) ? gas->valuestring : "-");
        cJSON_Delete(wa);
        cJSON_Delete(ga);
        if (!same) return 0;
    }
    return 1;
}

TEST(chat_tokens_round_trip) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    int trips = 0, calls = 0, reasoned = 0;
    for (size_t f = 0; f < N_FORMATS; f++) {
        k3c_tokenizer *tok = tokenizer_for(formats[f].format);
        CHECK(tok);
        k3c_chat_template *t;
        CHECK_OK(k3c_chat_template_from_name(formats[f].name, &t));
        int32_t stops[8];
        int n_stops = k3c_chat_stop_ids(t, tok, stops, 8);
        CHECK(n_stops >= 2 && n_stops <= 8);
        CHECK(stops[0] == k3c_tokenizer_special_id(tok, formats[f].format == K3C_CHAT_K3 ? "<|end_of_msg|>" : "<|im_end|>"));
        for (int trial = 0; trial < 60; trial++) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddStringToObject(a, "role", "assistant");
            k3c_strbuf s = {0};
            int n_calls = (int)(k3c_rng_next(&r) % 3);
            if (!n_calls || k3c_rng_next(&r) % 2) random_text(&s, &r, 1);
            cJSON_AddStringToObject(a, "content", k3c_strbuf_cstr(&s));
            k3c_strbuf_clear(&s);
            if (k3c_rng_next(&r) % 2) {
                random_text(&s, &r, 1);
                cJSON_AddStringToObject(a, "reasoning_content", k3c_strbuf_cstr(&s));
            }
            if (n_calls) {
                cJSON *tcs = cJSON_AddArrayToObject(a, "tool_calls");
                for (int c = 0; c < n_calls; c++) {
                    const char *name = k3c_rng_next(&r) % 2 ? "get_weather" : "search";
                    cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
                    char id[64];
                    snprintf(id, sizeof id, "functions.%s:%d", name, c);
                    cJSON_AddStringToObject(tc, "id", id);
                    cJSON_AddStringToObject(tc, "type", "function");
                    cJSON_AddStringToObject(fn, "name", name);
                    cJSON *args = random_args(&r);
                    char *at = cJSON_PrintUnformatted(args);
                    cJSON_AddStringToObject(fn, "arguments", at);
                    free(at);
                    cJSON_Delete(args);
                    cJSON_AddItemToObject(tc, "function", fn);
                    cJSON_AddItemToArray(tcs, tc);
                }
            }
            k3c_strbuf_clear(&s);
            random_text(&s, &r, 2);
            char *prompt_body = body_of(NULL, 1, k3c_strbuf_cstr(&s)), *full_body = body_of(a, 0, k3c_strbuf_cstr(&s));
            k3c_strbuf_free(&s);
            k3c_tokens prompt = {.ids = NULL}, full = {.ids = NULL};
            CHECK_OK(k3c_chat_encode(t, tok, prompt_body, strlen(prompt_body), &prompt));
            CHECK_OK(k3c_chat_encode(t, tok, full_body, strlen(full_body), &full));
            /* what the model would have generated after the prompt: the rest of the full conversation */
            CHECKF(full.n > prompt.n && !memcmp(full.ids, prompt.ids, prompt.n * sizeof *prompt.ids),
                   "%s: the prompt is not a prefix of the conversation with the answer", formats[f].name);
            k3c_chat_parser *p;
            CHECK_OK(k3c_chat_parser_create(t, tok, prompt_body, strlen(prompt_body), &p));
            /* the events fold to the result */
            k3c_strbuf content = {0}, reasoning = {0};
            int stopped_at = -1;
            for (size_t i = prompt.n; i < full.n; i++) {
                const k3c_chat_event *ev;
                size_t n_ev;
                CHECK_OK(k3c_chat_parser_feed(p, full.ids[i], &ev, &n_ev));
                for (size_t k = 0; k < n_ev; k++) {
                    if (ev[k].kind == K3C_CHAT_CONTENT) k3c_strbuf_put(&content, ev[k].text, ev[k].len);
                    if (ev[k].kind == K3C_CHAT_REASONING) k3c_strbuf_put(&reasoning, ev[k].text, ev[k].len);
                    CHECK(ev[k].kind != K3C_CHAT_TOOL_VOID);
                }
                if (stopped_at < 0 && k3c_chat_parser_done(p) == 1) stopped_at = (int)i;
            }
            CHECK_OK(k3c_chat_parser_finish(p, NULL, NULL));
            CHECKF(stopped_at == (int)full.n - 1, "%s: stopped at %d of %zu", formats[f].name, stopped_at, full.n);
            char *json;
            CHECK_OK(k3c_chat_parser_result_json(p, &json));
            cJSON *got = cJSON_Parse(json);
            char why[512] = "";
            /* K2-Instruct writes no reasoning; both K2-Thinking templates empty it up to and including an
             * assistant turn without tool calls (the first one, or the last), so a lone turn keeps it only
             * with calls; K3 keeps it */
            int keep_reasoning = formats[f].format == K3C_CHAT_K3 || (formats[f].format != K3C_CHAT_K2_INSTRUCT && n_calls > 0);
            int ok = got && same_message(a, got, keep_reasoning, why, sizeof why);
            const cJSON *gc = cJSON_GetObjectItemCaseSensitive(got, "content");
            const cJSON *gr = cJSON_GetObjectItemCaseSensitive(got, "reasoning_content");
            ok = ok && !strcmp(k3c_strbuf_cstr(&content), cJSON_IsString(gc) ? gc->valuestring : "") &&
                 !strcmp(k3c_strbuf_cstr(&reasoning), cJSON_IsString(gr) ? gr->valuestring : "");
            if (!ok) {
                char *w = cJSON_PrintUnformatted(a);
                fprintf(stderr, "    %s: %s\n      want %s\n      got  %s\n", formats[f].name, why, w, json);
                free(w);
            }
            calls += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(got, "tool_calls"));
            reasoned += cJSON_IsString(gr);
            cJSON_Delete(got);
            free(json);
            k3c_strbuf_free(&content);
            k3c_strbuf_free(&reasoning);
            k3c_chat_parser_free(p);
            k3c_tokens_free(&prompt);
            k3c_tokens_free(&full);
            free(prompt_body);
            free(full_body);
            cJSON_Delete(a);
            CHECK(ok);
            trips++;
        }
        k3c_chat_template_free(t);
        k3c_tokenizer_free(tok);
    }
    printf("    %d assistant messages round-tripped (%d tool calls, %d with reasoning)\n", trips, calls, reasoned);
    CHECK(calls > 50 && reasoned > 30);
}

/* Loading by directory: the family's default where the directory has no template, the file where it has
 * one; errors name what is wrong. */
TEST(chat_tokens_template_load) {
    k3c_chat_template *t;
    CHECK_OK(k3c_chat_template_load(NULL, "Kimi K3", &t));
    CHECK(!strcmp(k3c_chat_template_name(t), "kimi-k3") && strstr(k3c_chat_template_source(t), "default"));
    k3c_chat_template_free(t);
    CHECK_OK(k3c_chat_template_load(NULL, "Kimi Linear", &t));
    CHECK(!strcmp(k3c_chat_template_name(t), "kimi-linear"));
    k3c_chat_template_free(t);
    CHECK(k3c_chat_template_load(NULL, "Llama", &t) != K3C_OK && t == NULL && strstr(k3c_last_error(), "Llama"));
    CHECK(k3c_chat_template_from_name("chatml", &t) != K3C_OK && t == NULL);
    char dir[3000], path[7000];
    snprintf(dir, sizeof dir, "%s/chat_tokens_tpl", test_tmpdir());
    snprintf(path, sizeof path, "mkdir -p '%s' && cp tests/fixtures/chat/Kimi-K2-Instruct.jinja '%s/chat_template.jinja'", dir, dir);
    CHECK(test_run_status(path) == 0);
    CHECK_OK(k3c_chat_template_load(dir, "Kimi Linear", &t));
    CHECK(!strcmp(k3c_chat_template_name(t), "kimi-k2-instruct") && strstr(k3c_chat_template_source(t), "chat_template.jinja"));
    k3c_chat_template_free(t);
    snprintf(path, sizeof path, "printf 'x' >> '%s/chat_template.jinja'", dir);
    CHECK(test_run_status(path) == 0);
    CHECK(k3c_chat_template_load(dir, "Kimi Linear", &t) != K3C_OK && strstr(k3c_last_error(), "chat_template.jinja"));
    /* bad request bodies: refused naming what is wrong, nothing appended */
    k3c_tokenizer *tok;
    CHECK_OK(k3c_tokenizer_load_preset("tiny", &tok));
    CHECK_OK(k3c_chat_template_from_name("kimi-k3", &t));
    static const struct {
        const char *body, *msg;
    } bad[] = {
        {"[1]", "not a JSON object"},
        {"{\"messages\": {}}", "messages"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "content"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": {\"thinking\": 1}}", "thinking"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": {}}", "tools"},
        {"{\"messages\": ", "chat request"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        k3c_tokens v = {.ids = NULL};
        int rc = k3c_chat_encode(t, tok, bad[i].body, strlen(bad[i].body), &v);
        CHECKF(rc != K3C_OK && v.n == 0 && strstr(k3c_last_error(), bad[i].msg), "%s: %s", bad[i].body, k3c_last_error());
    }
    /* NULL handles and outputs: errors, not crashes (k3c.h's rule) */
    k3c_chat_parser *p;
    k3c_tokens none = {.ids = NULL};
    int32_t ids[4];
    char *json = NULL;
    CHECK(k3c_chat_encode(NULL, tok, "{}", 2, &none) != K3C_OK && k3c_chat_encode(t, NULL, "{}", 2, &none) != K3C_OK);
    CHECK(k3c_chat_encode(t, tok, NULL, 0, &none) != K3C_OK && k3c_chat_encode(t, tok, "{}", 2, NULL) != K3C_OK);
    CHECK(k3c_chat_stop_ids(NULL, tok, ids, 4) == -1 && k3c_chat_stop_ids(t, tok, NULL, 4) == -1);
    CHECK(k3c_chat_stop_ids(t, tok, NULL, 0) >= 2); /* the count alone */
    CHECK(k3c_chat_template_name(NULL) == NULL && k3c_chat_template_source(NULL) == NULL);
    k3c_chat_template *t2;
    CHECK(k3c_chat_template_load(NULL, "Kimi K3", NULL) != K3C_OK && k3c_chat_template_from_name(NULL, &t2) != K3C_OK);
    CHECK(k3c_chat_parser_create(NULL, tok, NULL, 0, &p) != K3C_OK && k3c_chat_parser_create(t, tok, NULL, 0, NULL) != K3C_OK);
    CHECK(k3c_chat_parser_feed(NULL, 1, NULL, NULL) != K3C_OK && k3c_chat_parser_finish(NULL, NULL, NULL) != K3C_OK);
    CHECK(k3c_chat_parser_done(NULL) == -1 && k3c_chat_parser_result_json(NULL, &json) != K3C_OK);
    k3c_chat_parser_free(NULL);
    k3c_chat_template_free(NULL);
    /* ids outside the vocabulary are refused by the parser */
    CHECK_OK(k3c_chat_parser_create(t, tok, NULL, 0, &p));
    CHECK(k3c_chat_parser_feed(p, k3c_tokenizer_vocab(tok), NULL, NULL) != K3C_OK);
    CHECK(k3c_chat_parser_feed(p, -1, NULL, NULL) != K3C_OK);
    k3c_chat_parser_free(p);
    k3c_chat_template_free(t);
    k3c_tokenizer_free(tok);
}

/* A synthesized checkpoint's config.json names the ids its tokenizer gives [BOS], [EOS] and [PAD] (tiny: 768,
 * 769, 1023; kimi-linear-tiny: 766, 767, 1021), read back through the loader; a config-only preset of a
 * published model keeps the published ids (its vocabulary is larger than the embedded tokenizer's). */
TEST(chat_tokens_synth_ids_agree) {
    static const char *const presets[] = {"tiny", "kimi-linear-tiny", "k3"};
    for (int i = 0; i < 3; i++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/synth_ids_%s", test_tmpdir(), presets[i]);
        CHECK_OK(k3c_synthesize(presets[i], 3, dir));
        k3c_tokenizer *t;
        CHECK_OK(k3c_tokenizer_load(dir, &t));
        k3c_model_info info;
        if (i < 2) {
            k3c_model *m;
            CHECK_OK(k3c_load(dir, &m));
            CHECK_OK(k3c_model_info_get(m, &info));
            k3c_free(m);
            CHECKF(info.bos_token_id == k3c_tokenizer_special_id(t, "[BOS]") &&
                       info.eos_token_id == k3c_tokenizer_special_id(t, "[EOS]") &&
                       info.pad_token_id == k3c_tokenizer_special_id(t, "[PAD]"),
                   "%s: config bos %d eos %d pad %d, tokenizer %d %d %d", presets[i], info.bos_token_id,
                   info.eos_token_id, info.pad_token_id, k3c_tokenizer_bos(t), k3c_tokenizer_eos(t), k3c_tokenizer_pad(t));
            CHECK(info.bos_token_id == k3c_tokenizer_bos(t) && info.eos_token_id == k3c_tokenizer_eos(t) &&
                  info.pad_token_id == k3c_tokenizer_pad(t) && info.bos_token_id == (i == 0 ? 768 : 766));
        } else {
            char path[4200], *text = NULL;
            size_t len = 0;
            snprintf(path, sizeof path, "%s/config.json", dir);
            CHECK_OK(k3c_read_file(path, (size_t)1 << 20, &text, &len));
            CHECKF(strstr(text, "\"bos_token_id\": 163584") && strstr(text, "\"eos_token_id\": 163586"), "%s", text);
            free(text);
        }
        k3c_tokenizer_free(t);
    }
}
