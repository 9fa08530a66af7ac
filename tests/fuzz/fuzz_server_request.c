/* libFuzzer target over what a client sends the server (src/server/openai.c, stop.c, buf.c). The first
 * byte picks the parser (chat, completions, tokenize, detokenize) and the bytes after it are the body. A
 * body must parse or be refused with an OpenAI-shaped error (a 4xx or 5xx status, a message, JSON that
 * parses back), never crash or leak; a parsed request's stop strings then run over the body's own bytes
 * in random-sized pieces and must release a prefix of them. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server/buf.h"
#include "server/openai.h"
#include "server/stop.h"

#define REQUIRE(c)                                                                                                 \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

static void check_error(const srv_error *e) {
    REQUIRE(e->status >= 400 && e->status < 600 && e->message[0] && e->type);
    char *s = srv_error_json(e);
    REQUIRE(s);
    cJSON *j = cJSON_Parse(s);
    REQUIRE(j && cJSON_IsObject(cJSON_GetObjectItem(j, "error")));
    cJSON_Delete(j);
    free(s);
}

static void run_stops(const srv_params *p, const uint8_t *data, size_t size) {
    if (!p->n_stop) return;
    srv_stop s;
    srv_stop_init(&s, p->stop, p->n_stop, p->include_stop_str);
    srv_buf out = {0};
    int matched = 0;
    for (size_t at = 0; at < size && !matched;) {
        size_t k = 1 + data[at] % 7;
        if (k > size - at) k = size - at;
        matched = srv_stop_push(&s, (const char *)data + at, k, &out);
        at += k;
    }
    if (!matched) srv_stop_flush(&s, &out);
    /* released text is always a prefix of what was pushed (plus the stop string with include) */
    REQUIRE(out.len <= size + 64 * 1024);
    if (!p->include_stop_str) REQUIRE(out.len <= size && (!out.len || !memcmp(out.data, data, out.len)));
    srv_buf_free(&out);
    srv_stop_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] & 3;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    srv_error e;
    memset(&e, 0, sizeof e);
    if (which < 2) {
        srv_params p;
        if (srv_parse_request(which == 0 ? SRV_CHAT : SRV_COMPLETION, body, len, &p, &e) == 0) {
            REQUIRE(p.root && p.n >= 1 && p.n <= SRV_MAX_N && p.n_stop <= SRV_MAX_STOP);
            REQUIRE(p.kind == SRV_CHAT ? p.messages != NULL : p.n_prompts >= 1);
            run_stops(&p, data + 1, len);
            srv_params_free(&p);
        } else {
            check_error(&e);
        }
    } else {
        srv_tokenize_params p;
        if (srv_parse_tokenize(body, len, which == 3, &p, &e) == 0) srv_tokenize_params_free(&p);
        else check_error(&e);
    }
    srv_buf b = {0};
    srv_buf_json_string(&b, body, len);
    REQUIRE(!b.failed);
    cJSON *j = cJSON_Parse(b.data);
    REQUIRE(j && cJSON_IsString(j));
    cJSON_Delete(j);
    srv_buf_free(&b);
    return 0;
}
