/* The server's parts that need no HTTP and no engine: request validation and error shapes, stop strings
 * across arbitrary splits (against a whole-text reference), the JSON string writer on random bytes, the
 * output pipeline's SSE chunks (joined deltas equal the non-streaming result, tool-call argument deltas
 * equal the parsed arguments), and the metrics text. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "server/buf.h"
#include "server/metrics.h"
#include "server/openai.h"
#include "server/request.h"
#include "server/stop.h"
#include "server/text.h"
#include "test.h"
#include "util/error.h"

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t x = rng_state += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- request validation ---- */

static int parse_status(srv_kind kind, const char *body, char *param) {
    srv_params p;
    srv_error e;
    memset(&e, 0, sizeof e);
    int rc = srv_parse_request(kind, body, strlen(body), &p, &e);
    if (rc == 0) {
        srv_params_free(&p);
        return 0;
    }
    if (param) strcpy(param, e.param);
    return e.status;
}

TEST(server_request_errors) {
    static const struct {
        srv_kind kind;
        const char *body, *param;
        int status;
    } cases[] = {
        {SRV_CHAT, "", "", 400},
        {SRV_CHAT, "{", "", 400},
        {SRV_CHAT, "[]", "", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]} x", "", 400},
        {SRV_CHAT, "{}", "messages", 400},
        {SRV_CHAT, "{\"messages\": []}", "messages", 400},
        {SRV_CHAT, "{\"messages\": \"hi\"}", "messages", 400},
        {SRV_CHAT, "{\"messages\": [1]}", "messages", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"temperature\": \"hot\"}", "temperature", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"temperature\": -1}", "temperature", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"top_p\": 0}", "top_p", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"n\": 0}", "n", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"n\": 1.5}", "n", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"max_tokens\": true}", "max_tokens", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"max_completion_tokens\": 0}", "max_completion_tokens", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"frobnicate\": 1}", "frobnicate", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"stream\": true, \"stream\": false}", "stream", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"stream_options\": {\"include_usage\": true}}", "stream_options", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"top_logprobs\": 3}", "top_logprobs", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logprobs\": true, \"top_logprobs\": 21}", "top_logprobs", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"stop\": [\"a\", 3]}", "stop", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"stop\": \"\"}", "stop", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"tool_choice\": \"required\"}", "tool_choice", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"tools\": [{\"type\": \"function\"}]}", "tools", 400},
        {SRV_CHAT,
         "{\"messages\": [{\"role\": \"user\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
         "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}",
         "tool_choice", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"yaml\"}}", "response_format", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_object\", \"x\": 1}}", "response_format", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_schema\"}}", "response_format", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {}}}}", "response_format", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"schema\": 3}}}", "response_format", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"strict\": 1}}}", "response_format", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"seed\": 1e30}", "seed", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"logit_bias\": {\"1\": 5}}", "logit_bias", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"prompt\": \"x\"}", "prompt", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"chat_template_kwargs\": {\"foo\": 1}}", "chat_template_kwargs", 400},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"reasoning_effort\": \"extreme\"}", "reasoning_effort", 400},
        {SRV_COMPLETION, "{}", "prompt", 400},
        {SRV_COMPLETION, "{\"prompt\": 5}", "prompt", 400},
        {SRV_COMPLETION, "{\"prompt\": []}", "prompt", 400},
        {SRV_COMPLETION, "{\"prompt\": [1, -2]}", "prompt", 400},
        {SRV_COMPLETION, "{\"prompt\": [[1], \"x\", {}]}", "prompt", 400},
        {SRV_COMPLETION, "{\"prompt\": \"x\", \"messages\": []}", "messages", 400},
        {SRV_COMPLETION, "{\"prompt\": \"x\", \"suffix\": \"y\"}", "suffix", 400},
        {SRV_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 3}", "best_of", 400},
        {SRV_COMPLETION, "{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 1}", "echo", 400},
        {SRV_COMPLETION, "{\"prompt\": \"x\", \"stop_token_ids\": [1.5]}", "stop_token_ids", 400},
        {SRV_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1e400}", "max_tokens", 400},
        /* accepted */
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"model\": null, \"stop\": null}", "", 0},
        {SRV_COMPLETION, "{\"prompt\": [[1, 2], [3]], \"n\": 2, \"logprobs\": 0, \"top_k\": -1}", "", 0},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_object\"}}", "", 0},
        {SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}], \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"a\", \"strict\": true, \"description\": \"d\", \"schema\": {\"type\": \"object\"}}}}", "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char param[64] = "";
        int st = parse_status(cases[i].kind, cases[i].body, param);
        CHECKF(st == cases[i].status, "case %zu (%s): status %d, expected %d", i, cases[i].body, st, cases[i].status);
        CHECKF(!strcmp(param, cases[i].param), "case %zu (%s): param '%s', expected '%s'", i, cases[i].body, param,
               cases[i].param);
    }
    /* a NUL inside the body is refused, not parsed as the JSON before it */
    srv_params p;
    srv_error e;
    const char nul[] = "{\"prompt\": \"x\"}\0junk";
    CHECK(srv_parse_request(SRV_COMPLETION, nul, sizeof nul - 1, &p, &e) == -1 && e.status == 400);
}

TEST(server_request_fields) {
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 0.5, \"top_p\": 0.9,"
                       " \"top_k\": 7, \"min_p\": 0.1, \"seed\": -1, \"n\": 3, \"stop\": [\"a\", \"bc\"],"
                       " \"max_completion_tokens\": 9, \"max_tokens\": 4, \"logprobs\": true, \"top_logprobs\": 2,"
                       " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"ignore_eos\": true,"
                       " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {}}}],"
                       " \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}},"
                       " \"chat_template_kwargs\": {\"thinking\": false}, \"presence_penalty\": 0.5}";
    srv_params p;
    srv_error e;
    CHECKF(srv_parse_request(SRV_CHAT, body, strlen(body), &p, &e) == 0, "%s", e.message);
    CHECK(p.temperature == 0.5f && p.top_p == 0.9f && p.top_k == 7 && p.min_p == 0.1f);
    CHECK(p.has_seed && p.seed == UINT64_MAX);
    CHECK(p.n == 3 && p.n_stop == 2 && !strcmp(p.stop[1], "bc"));
    CHECK(p.max_tokens == 9); /* max_completion_tokens wins */
    CHECK(p.logprobs == 1 && p.top_logprobs == 2 && p.stream && p.include_usage && p.ignore_eos);
    CHECK(p.tool_choice == SRV_TOOLS_NAMED && !strcmp(p.tool_name, "f") && p.tools);
    CHECK(p.no_thinking && p.presence_penalty == 0.5f && p.repetition_penalty == 1.0f);
    srv_params_free(&p);
}

TEST(server_error_json) {
    srv_error e;
    /* invalid UTF-8 and a quote in what the client sent must still give valid JSON */
    srv_fail(&e, 404, NULL, "model_not_found", "model", "The model `%s` does not exist.", "a\"\xff\xfe\x01");
    char *s = srv_error_json(&e);
    cJSON *j = cJSON_Parse(s);
    CHECK(j);
    const cJSON *err = cJSON_GetObjectItem(j, "error");
    CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "message")));
    CHECK(!strcmp(cJSON_GetObjectItem(err, "message")->valuestring, "The model `a\"\xef\xbf\xbd\xef\xbf\xbd\x01` does not exist."));
    CHECK(!strcmp(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error"));
    CHECK(!strcmp(cJSON_GetObjectItem(err, "param")->valuestring, "model"));
    CHECK(!strcmp(cJSON_GetObjectItem(err, "code")->valuestring, "model_not_found"));
    cJSON_Delete(j);
    free(s);
}

/* ---- JSON strings from arbitrary bytes ---- */

static int valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t l = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!l || i + l > n) return 0;
        uint32_t cp = l == 1 ? c : l == 2 ? c & 0x1f : l == 3 ? c & 0x0f : c & 0x07;
        for (size_t k = 1; k < l; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[l] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += l;
    }
    return 1;
}

TEST(server_json_string) {
    rng_state = test_seed();
    static const char *pieces[] = {"a", "\"", "\\", "\n", "\x01", "\x7f", "\xc3\xa9", "\xe4\xb8\xad", "\xf0\x9f\x98\x80",
                                   "\xff", "\xc3", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe0\x80\xaf", "/"};
    for (int t = 0; t < 2000; t++) {
        char in[256];
        size_t n = 0;
        int valid = 1;
        int k = (int)(rnd() % 20);
        for (int i = 0; i < k; i++) {
            int which = (int)(rnd() % (sizeof pieces / sizeof pieces[0]));
            size_t l = strlen(pieces[which]);
            memcpy(in + n, pieces[which], l);
            n += l;
            if (which >= 9 && which <= 13) valid = 0;
        }
        srv_buf b = {0};
        srv_buf_json_string(&b, in, n);
        CHECK(!b.failed);
        CHECKF(valid_utf8((const unsigned char *)b.data, b.len), "case %d: output not UTF-8", t);
        cJSON *j = cJSON_Parse(b.data);
        CHECKF(j && cJSON_IsString(j), "case %d: %s does not parse", t, b.data);
        if (valid) CHECKF(strlen(j->valuestring) == n && !memcmp(j->valuestring, in, n), "case %d: round trip", t);
        cJSON_Delete(j);
        srv_buf_free(&b);
    }
    srv_buf b = {0};
    srv_buf_json_string(&b, "a\0b", 3);
    CHECK(!strcmp(b.data, "\"a\\u0000b\""));
    srv_buf_free(&b);
}

/* ---- stop strings ---- */

/* The reference over the whole text: the occurrence with the smallest end, ties to the smallest start. */
static int stop_reference(const char *text, size_t n, const char *const *stops, int ns, size_t *cut, int *which) {
    size_t best_end = (size_t)-1, best_start = 0;
    *which = -1;
    for (int i = 0; i < ns; i++) {
        size_t sl = strlen(stops[i]);
        for (size_t p = 0; p + sl <= n; p++)
            if (!memcmp(text + p, stops[i], sl)) {
                if (p + sl < best_end || (p + sl == best_end && p < best_start))
                    best_end = p + sl, best_start = p, *which = i;
                break;
            }
    }
    *cut = best_start;
    return *which >= 0;
}

TEST(server_stop_strings) {
    rng_state = test_seed();
    const char alphabet[] = "abc\xc3\xa9";
    for (int t = 0; t < 3000; t++) {
        char text[64];
        size_t n = 0;
        int len = (int)(rnd() % 40);
        for (int i = 0; i < len; i++) {
            int c = (int)(rnd() % 4);
            if (c == 3) text[n++] = '\xc3', text[n++] = '\xa9';
            else text[n++] = alphabet[c];
        }
        char stop_buf[3][8];
        const char *stops[3];
        int ns = 1 + (int)(rnd() % 3);
        for (int i = 0; i < ns; i++) {
            int sl = 1 + (int)(rnd() % 3);
            for (int k = 0; k < sl; k++) stop_buf[i][k] = alphabet[rnd() % 3];
            stop_buf[i][sl] = 0;
            stops[i] = stop_buf[i];
        }
        int include = (int)(rnd() % 2);
        srv_stop s;
        srv_stop_init(&s, stops, ns, include);
        srv_buf out = {0};
        int matched = 0;
        for (size_t at = 0; at < n;) {
            size_t k = 1 + rnd() % 5;
            if (k > n - at) k = n - at;
            matched = srv_stop_push(&s, text + at, k, &out);
            at += k;
        }
        if (!matched) srv_stop_flush(&s, &out);
        size_t cut;
        int which;
        int ref = stop_reference(text, n, stops, ns, &cut, &which);
        CHECKF(matched == ref, "case %d: matched %d, reference %d", t, matched, ref);
        size_t want = ref ? cut + (include ? strlen(stops[which]) : 0) : n;
        CHECKF(out.len == want && !memcmp(out.data ? out.data : "", text, want), "case %d: released %zu bytes, expected %zu",
               t, out.len, want);
        srv_stop_free(&s);
        srv_buf_free(&out);
    }
}

/* ---- the output pipeline ---- */

typedef struct pipe_fixture {
    srv_text *text;
    srv_metrics metrics;
    srv_req r;
} pipe_fixture;

static int fixture_init(pipe_fixture *f, srv_kind kind, const char *body) {
    memset(f, 0, sizeof *f);
    if (srv_text_create(NULL, "tiny", "Kimi K3", &f->text) != K3C_OK) return -1;
    srv_metrics_init(&f->metrics);
    srv_error e;
    if (srv_parse_request(kind, body, strlen(body), &f->r.p, &e)) return -1;
    f->r.text = f->text;
    f->r.metrics = &f->metrics;
    f->r.model_name = "tiny";
    strcpy(f->r.id, "test-1");
    f->r.n_prompts = 1;
    static int prompt_len = 3;
    f->r.prompt_len = &prompt_len;
    f->r.n_choices = 1;
    f->r.choices = calloc(1, sizeof *f->r.choices);
    return srv_choice_init(&f->r, &f->r.choices[0]);
}

static void fixture_free(pipe_fixture *f) {
    srv_choice_free(&f->r.choices[0]);
    free(f->r.choices);
    srv_params_free(&f->r.p);
    srv_metrics_free(&f->metrics);
    srv_text_free(f->text);
}

/* Every "data: {json}" event of an SSE text, in order (the caller frees the array). */
static cJSON *sse_events(const char *s) {
    cJSON *a = cJSON_CreateArray();
    while (s && *s) {
        const char *end = strstr(s, "\n\n");
        if (!end) break;
        if (!strncmp(s, "data: {", 7)) cJSON_AddItemToArray(a, cJSON_ParseWithLength(s + 6, (size_t)(end - s - 6)));
        s = end + 2;
    }
    return a;
}

TEST(server_output_completion_stream) {
    rng_state = test_seed();
    pipe_fixture f;
    CHECK(fixture_init(&f, SRV_COMPLETION, "{\"prompt\": [1], \"stream\": true, \"stop\": [\"e\"], \"logprobs\": 2}") == 0);
    const k3c_tokenizer *tok = srv_text_tokenizer(f.text);
    int32_t base = k3c_tokenizer_num_base(tok);
    /* random base tokens: the streamed text must equal the decoded text up to the first "e" */
    int32_t ids[64];
    int n = 0;
    srv_buf out = {0};
    int settled = 0;
    int32_t top_ids[2] = {5, 6};
    float top_lps[2] = {-0.5f, -1.5f};
    while (n < 64 && !settled) {
        ids[n] = (int32_t)(rnd() % (uint64_t)base);
        settled = srv_choice_token(&f.r.choices[0], ids[n], -0.25f, 2, top_ids, top_lps, &out);
        CHECK(settled >= 0);
        n++;
    }
    if (!settled) srv_choice_finished(&f.r.choices[0], SRV_FINISH_LENGTH, 0, 0, 0, &out);
    else srv_choice_finished(&f.r.choices[0], SRV_FINISH_ABORT, 0, 0, 0, &out);
    char *all = NULL;
    size_t all_n = 0;
    CHECK_OK(k3c_tokenizer_decode(tok, ids, (size_t)n, &all, &all_n));
    char *e = strchr(all, 'e');
    size_t want = e ? (size_t)(e - all) : all_n;
    cJSON *ev = sse_events(out.data);
    srv_buf joined = {0};
    int tokens_lp = 0;
    const char *finish = NULL;
    const cJSON *it;
    cJSON_ArrayForEach(it, ev) {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(it, "choices"), 0);
        CHECK(ch);
        CHECK(!strcmp(cJSON_GetObjectItem(it, "object")->valuestring, "text_completion"));
        srv_buf_puts(&joined, cJSON_GetObjectItem(ch, "text")->valuestring);
        const cJSON *lp = cJSON_GetObjectItem(ch, "logprobs");
        if (cJSON_IsObject(lp)) tokens_lp += cJSON_GetArraySize(cJSON_GetObjectItem(lp, "tokens"));
        const cJSON *fr = cJSON_GetObjectItem(ch, "finish_reason");
        if (cJSON_IsString(fr)) finish = fr->valuestring;
    }
    CHECKF(joined.len == want && !memcmp(joined.data ? joined.data : "", all, want), "streamed %zu bytes, expected %zu",
           joined.len, want);
    CHECK(tokens_lp == n);
    CHECK(finish && !strcmp(finish, settled ? "stop" : "length"));
    cJSON_Delete(ev);
    srv_buf_free(&joined);
    srv_buf_free(&out);
    free(all);
    fixture_free(&f);
}

/* K3 output with reasoning, content and a tool call, token by token: the streamed deltas joined equal the
 * non-streaming message, and the argument deltas joined equal the call's arguments. */
static int encode_k3(const k3c_tokenizer *tok, const char *const *parts, int32_t *ids, int cap) {
    int n = 0;
    for (int i = 0; parts[i]; i++) {
        int32_t sid = k3c_tokenizer_special_id(tok, parts[i]);
        if (sid >= 0) {
            ids[n++] = sid;
            continue;
        }
        k3c_tokens t = {0};
        if (k3c_tokenizer_encode_ordinary(tok, parts[i], strlen(parts[i]), &t) != K3C_OK) return -1;
        for (size_t k = 0; k < t.n && n < cap; k++) ids[n++] = t.ids[k];
        k3c_tokens_free(&t);
    }
    return n;
}

static int run_chat(int stream, const int32_t *ids, int n, srv_buf *out, pipe_fixture *f) {
    char body[512];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": %s,"
             " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get\"}}]}",
             stream ? "true" : "false");
    if (fixture_init(f, SRV_CHAT, body)) return -1;
    f->r.n_open = 1;
    /* what routes.c gives the scheduler for a chat request: the format's end-of-message ids */
    f->r.stop_ids = (int32_t *)srv_text_end_ids(f->text, &f->r.n_stop_ids);
    if (stream) srv_req_stream_start(&f->r, out);
    int settled = 0;
    for (int i = 0; i < n && !settled; i++) settled = srv_choice_token(&f->r.choices[0], ids[i], 0, 0, NULL, NULL, out);
    srv_choice_finished(&f->r.choices[0], settled ? SRV_FINISH_STOP : SRV_FINISH_LENGTH, 0, 0, 0, out);
    srv_req_finalize(&f->r, out);
    return 0;
}

TEST(server_output_chat_tools) {
    pipe_fixture fs, fn;
    CHECK_OK(srv_text_create(NULL, "tiny", "Kimi K3", &fs.text));
    const k3c_tokenizer *tok = srv_text_tokenizer(fs.text);
    static const char *const parts[] = {"I should call get.", "<|close|>", "think", "<|sep|>", "<|open|>", "response",
                                        "<|sep|>", "Calling it now.", "<|close|>", "response", "<|sep|>", "<|open|>",
                                        "tools", "<|sep|>", "<|open|>", "call tool=\"get\" index=\"0\"", "<|sep|>",
                                        "<|open|>", "argument key=\"city\" type=\"string\"", "<|sep|>", "Par\xc3\xads \"x\"",
                                        "<|close|>", "argument", "<|sep|>", "<|close|>", "call", "<|sep|>", "<|close|>",
                                        "tools", "<|sep|>", "<|end_of_msg|>", NULL};
    int32_t ids[256];
    int n = encode_k3(tok, parts, ids, 256);
    srv_text_free(fs.text);
    CHECK(n > 10);
    srv_buf so = {0}, no = {0};
    CHECK(run_chat(1, ids, n, &so, &fs) == 0);
    CHECK(run_chat(0, ids, n, &no, &fn) == 0);
    /* the non-streaming message */
    cJSON *body = cJSON_Parse(no.data);
    CHECK(body);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(body, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItem(ch, "message");
    CHECKF(!strcmp(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "tool_calls"), "finish %s",
           cJSON_GetObjectItem(ch, "finish_reason")->valuestring);
    const char *content = cJSON_GetObjectItem(msg, "content")->valuestring;
    const char *reasoning = cJSON_GetObjectItem(msg, "reasoning")->valuestring;
    CHECK(!strcmp(reasoning, cJSON_GetObjectItem(msg, "reasoning_content")->valuestring));
    CHECKF(!strcmp(reasoning, "I should call get."), "reasoning '%s'", reasoning);
    CHECKF(content && !strcmp(content, "Calling it now."), "content '%s'", content ? content : "(null)");
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0);
    CHECK(call);
    const char *args = cJSON_GetObjectItem(cJSON_GetObjectItem(call, "function"), "arguments")->valuestring;
    cJSON *aj = cJSON_Parse(args);
    CHECKF(aj && !strcmp(cJSON_GetObjectItem(aj, "city")->valuestring, "Par\xc3\xads \"x\""), "arguments %s", args);
    cJSON_Delete(aj);
    /* the stream: role first, then deltas that join to the same message; [DONE] last */
    cJSON *ev = sse_events(so.data);
    srv_buf sc = {0}, sr = {0}, sa = {0};
    const char *name = NULL, *id = NULL, *finish = NULL;
    int first = 1;
    const cJSON *it;
    cJSON_ArrayForEach(it, ev) {
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(it, "choices"), 0);
        const cJSON *d = cJSON_GetObjectItem(c0, "delta");
        if (first) CHECK(cJSON_IsString(cJSON_GetObjectItem(d, "role")) &&
                         !strcmp(cJSON_GetObjectItem(d, "role")->valuestring, "assistant"));
        first = 0;
        const cJSON *x;
        if ((x = cJSON_GetObjectItem(d, "content"))) srv_buf_puts(&sc, x->valuestring);
        if ((x = cJSON_GetObjectItem(d, "reasoning"))) srv_buf_puts(&sr, x->valuestring);
        const cJSON *tc;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItem(d, "tool_calls")) {
            CHECK(cJSON_GetObjectItem(tc, "index")->valueint == 0);
            const cJSON *fnj = cJSON_GetObjectItem(tc, "function");
            if ((x = cJSON_GetObjectItem(tc, "id"))) {
                CHECK(!id);
                id = x->valuestring;
            }
            if ((x = cJSON_GetObjectItem(fnj, "name"))) {
                CHECK(!name);
                name = x->valuestring;
            }
            if ((x = cJSON_GetObjectItem(fnj, "arguments"))) srv_buf_puts(&sa, x->valuestring);
        }
        if (cJSON_IsString(cJSON_GetObjectItem(c0, "finish_reason")))
            finish = cJSON_GetObjectItem(c0, "finish_reason")->valuestring;
    }
    CHECK(strstr(so.data, "data: [DONE]\n\n") && !strcmp(strstr(so.data, "data: [DONE]\n\n"), "data: [DONE]\n\n"));
    CHECKF(sc.data && !strcmp(sc.data, content), "streamed content '%s'", sc.data ? sc.data : "");
    CHECKF(sr.data && !strcmp(sr.data, reasoning), "streamed reasoning '%s'", sr.data ? sr.data : "");
    CHECK(name && !strcmp(name, "get") && id && !strcmp(id, cJSON_GetObjectItem(call, "id")->valuestring));
    CHECKF(sa.data && !strcmp(sa.data, args), "streamed arguments '%s' vs '%s'", sa.data ? sa.data : "", args);
    CHECK(finish && !strcmp(finish, "tool_calls"));
    cJSON_Delete(ev);
    cJSON_Delete(body);
    srv_buf_free(&sc);
    srv_buf_free(&sr);
    srv_buf_free(&sa);
    srv_buf_free(&so);
    srv_buf_free(&no);
    fixture_free(&fs);
    fixture_free(&fn);
}

TEST(server_metrics_text) {
    srv_metrics m;
    CHECK(srv_metrics_init(&m) == 0);
    srv_finish_times t1 = {.e2e = 0.4, .queue = 0.1, .prefill = 0.2, .decode = 0.1, .inference = 0.3, .tpot = 0.025};
    srv_finish_times t2 = {.e2e = 3.0, .queue = 3.0, .prefill = -1, .decode = -1, .inference = -1, .tpot = -1};
    srv_metrics_finished(&m, SRV_FINISH_STOP, &t1, 10, 5);
    srv_metrics_finished(&m, SRV_FINISH_ABORT, &t2, 10, 0);
    srv_metrics_finished(&m, SRV_FINISH_TOOL_CALLS, &t1, 10, 5); /* counted as stop, as vLLM's engine reason */
    double itl[3] = {0.005, 0.02, 100};
    srv_metrics_token_times(&m, 0.003, itl, 3);
    srv_metrics_request(&m, 3, 300);
    srv_metrics_iteration(&m, 9);
    srv_metrics_iteration(&m, 512);
    srv_sched_gauges g = {.running = 2, .waiting = 1, .blocks_total = 100, .blocks_used = 25, .route_steps = {4, 5, 0, 0},
                          .spec_tokens = 2, .spec_accepted_by_pos = {7, 3, 99}, .block_size = 16, .prefix_grid = 128,
                          .prefix_caching = 1};
    srv_buf b = {0};
    srv_metrics_render(&m, &g, "ti\"ny", &b);
    CHECK(!b.failed);
#define LAB "model_name=\"ti\\\"ny\",engine=\"0\""
    const char *want[] = {
        "k3c:num_requests_running{" LAB "} 2\n",
        "k3c:num_requests_waiting{" LAB "} 1\n",
        "k3c:kv_cache_usage_perc{" LAB "} 0.25\n",
        "k3c:request_success_total{" LAB ",finished_reason=\"stop\"} 2\n",
        "k3c:request_success_total{" LAB ",finished_reason=\"abort\"} 1\n",
        "k3c:engine_steps_total{" LAB ",route=\"decode\"} 5\n",
        "# TYPE k3c:prompt_tokens counter\n",
        /* cumulative buckets: 0.005 <= 0.01, 0.02 <= 0.025, 100 only in +Inf */
        "k3c:inter_token_latency_seconds_bucket{" LAB ",le=\"0.01\"} 1\n",
        "k3c:inter_token_latency_seconds_bucket{" LAB ",le=\"0.025\"} 2\n",
        "k3c:inter_token_latency_seconds_bucket{" LAB ",le=\"80\"} 2\n",
        "k3c:inter_token_latency_seconds_bucket{" LAB ",le=\"+Inf\"} 3\n",
        "k3c:inter_token_latency_seconds_count{" LAB "} 3\n",
        "k3c:time_to_first_token_seconds_bucket{" LAB ",le=\"0.001\"} 0\n",
        "k3c:time_to_first_token_seconds_bucket{" LAB ",le=\"0.005\"} 1\n",
        "k3c:e2e_request_latency_seconds_count{" LAB "} 3\n",
        /* the phases: both requests queued (0.1 and 3.0), only the first reached prefill and decode */
        "k3c:request_queue_time_seconds_bucket{" LAB ",le=\"0.3\"} 2\n",
        "k3c:request_queue_time_seconds_count{" LAB "} 3\n",
        "k3c:request_prefill_time_seconds_count{" LAB "} 2\n",
        "k3c:request_decode_time_seconds_count{" LAB "} 2\n",
        "k3c:request_inference_time_seconds_sum{" LAB "} 0.59999999999999998\n",
        "k3c:request_time_per_output_token_seconds_bucket{" LAB ",le=\"0.025\"} 2\n",
        "k3c:request_params_n_bucket{" LAB ",le=\"2\"} 0\n",
        "k3c:request_params_n_bucket{" LAB ",le=\"5\"} 1\n",
        "k3c:request_params_max_tokens_bucket{" LAB ",le=\"500\"} 1\n",
        "k3c:iteration_tokens_total_bucket{" LAB ",le=\"16\"} 1\n",
        "k3c:iteration_tokens_total_bucket{" LAB ",le=\"512\"} 2\n",
        /* per position: as many as the drafts per verify */
        "k3c:spec_decode_num_accepted_tokens_per_pos_total{" LAB ",position=\"0\"} 7\n",
        "k3c:spec_decode_num_accepted_tokens_per_pos_total{" LAB ",position=\"1\"} 3\n",
        "k3c:cache_config_info{" LAB ",block_size=\"16\",num_gpu_blocks=\"100\",enable_prefix_caching=\"True\","
        "prefix_grid=\"128\"",
    };
#undef LAB
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) CHECKF(strstr(b.data, want[i]), "missing: %s", want[i]);
    CHECK(!strstr(b.data, "position=\"2\"") && !strstr(b.data, "finished_reason=\"tool_calls\""));
    srv_buf_free(&b);
    srv_metrics_free(&m);
}
