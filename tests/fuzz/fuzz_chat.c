/* libFuzzer target over the text layer's untrusted inputs. The first byte picks the target:
 *   even: the bytes after it are a chat request's `messages` JSON, rendered in every format (must render or
 *         refuse with a message, never crash or leak; a render's segments tile its text);
 *   odd:  the bytes are a model's output token stream for the output parser (each byte a marker token or a
 *         short text piece; dialect and options from the first byte): events must fold to the result and
 *         complete calls carry JSON-object arguments. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/parse.h"
#include "text/pyjson.h"
#include "util/error.h"

#define REQUIRE(c)                                                                                                 \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

static void fuzz_render(const uint8_t *data, size_t size) {
    cJSON *m = k3c_pyjson_parse((const char *)data, size, "fuzz");
    if (!m) return;
    for (int f = K3C_CHAT_K2_INSTRUCT; f <= K3C_CHAT_K3; f++) {
        for (int agp = 0; agp < 2; agp++) {
            k3c_chat_request r = {.messages = m, .add_generation_prompt = agp, .no_thinking = agp};
            /* a "tools" member of the first message doubles as the request's tools */
            r.tools = cJSON_IsArray(m) && m->child ? cJSON_GetObjectItemCaseSensitive(m->child, "tools") : NULL;
            k3c_chat_prompt p;
            if (k3c_chat_render((k3c_chat_format)f, &r, &p) != K3C_OK) {
                REQUIRE(p.text == NULL && p.segs == NULL && k3c_error_message()[0]);
                continue;
            }
            size_t at = 0;
            for (size_t i = 0; i < p.n_segs; i++) {
                REQUIRE(p.segs[i].off == at && p.segs[i].len > 0);
                at += p.segs[i].len;
            }
            REQUIRE(at == p.len);
            k3c_chat_prompt_free(&p);
        }
    }
    cJSON_Delete(m);
}

static const struct {
    int32_t id;
    const char *text;
} marks[] = {
    {163595, "<|tool_calls_section_begin|>"}, {163596, "<|tool_calls_section_end|>"}, {163597, "<|tool_call_begin|>"},
    {163598, "<|tool_call_argument_begin|>"}, {163599, "<|tool_call_end|>"},         {163606, "<think>"},
    {163607, "</think>"},                     {163587, "<|open|>"},                   {163588, "<|close|>"},
    {163589, "<|sep|>"},                      {163586, "<|end_of_msg|>"},
};
static const char *const pieces[] = {"functions.f:0", "{\"a\": 1}", "{", "}", "\"", " ", "x", "think", "response",
                                     "tools", "call tool=\"f\" index=\"1\"", "argument key=\"k\" type=\"string\"",
                                     "argument key=\"n\" type=\"number\"", "json type=\"object\"", "message", "call",
                                     "argument", "json", "&quot;", "\xe4\xb8", "\xad", "1.5", "[", "]"};
#define N_MARKS (sizeof marks / sizeof marks[0])
#define N_PIECES (sizeof pieces / sizeof pieces[0])

static void fuzz_parse(const uint8_t *data, size_t size) {
    k3c_parser_opts o = {(data[0] >> 1) & 1 ? K3C_PARSE_K3 : K3C_PARSE_K2, (data[0] >> 2) & 1, (data[0] >> 3) & 1};
    k3c_parse_specials sp = {163606, 163607, 163595, 163596, 163597, 163598, 163599, 163587, 163588, 163589, 163586,
                             {163586}, 1};
    k3c_parser *p;
    REQUIRE(k3c_parser_create(&o, &sp, &p) == K3C_OK);
    size_t content = 0, reasoning = 0;
    const k3c_parse_event *ev;
    size_t n;
    for (size_t i = 1; i <= size; i++) {
        if (i == size) {
            REQUIRE(k3c_parser_finish(p, &ev, &n) == K3C_OK);
        } else {
            uint8_t b = data[i];
            if (b < N_MARKS)
                REQUIRE(k3c_parser_feed(p, marks[b].id, marks[b].text, strlen(marks[b].text), &ev, &n) == K3C_OK);
            else if (b < N_MARKS + N_PIECES)
                REQUIRE(k3c_parser_feed(p, 1000, pieces[b - N_MARKS], strlen(pieces[b - N_MARKS]), &ev, &n) == K3C_OK);
            else
                REQUIRE(k3c_parser_feed(p, 1000, (const char *)&data[i], 1, &ev, &n) == K3C_OK);
        }
        for (size_t k = 0; k < n; k++) {
            if (ev[k].kind == K3C_PARSE_CONTENT) content += ev[k].len;
            if (ev[k].kind == K3C_PARSE_REASONING) reasoning += ev[k].len;
            if (ev[k].kind == K3C_PARSE_TOOL_START) REQUIRE(ev[k].id && ev[k].name && ev[k].index >= 0);
        }
    }
    k3c_parse_result r;
    REQUIRE(k3c_parser_result(p, &r) == K3C_OK);
    REQUIRE(r.finished && r.content_len == content && r.reasoning_len == reasoning);
    for (size_t i = 0; i < r.n_calls; i++) {
        cJSON *a = cJSON_Parse(r.calls[i].arguments);
        REQUIRE(cJSON_IsObject(a));
        cJSON_Delete(a);
    }
    k3c_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    if (data[0] & 1)
        fuzz_parse(data, size);
    else
        fuzz_render(data + 1, size - 1);
    return 0;
}
