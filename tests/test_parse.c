/* The streaming output parser: cases written from the formats (tokenizer-chat.md §3.5, §4), each fed as
 * token streams split in many ways (one byte per text token, whole pieces, random splits) that must all give
 * the same result; the events folded must equal the parser's own result; corpus tool calls rendered by the
 * K3 renderer parse back; random token sequences over the marker alphabet never break the invariants. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "text/chat.h"
#include "text/parse.h"
#include "text/pyjson.h"
#include "util/error.h"
#include "util/file.h"
#include "util/rng.h"

/* Special ids as in the published tokenizers (tokenizer-chat.md §1.1). */
static const struct {
    const char *name;
    int32_t id;
} k2_names[] = {
    {"<|tool_calls_section_begin|>", 163595}, {"<|tool_calls_section_end|>", 163596},
    {"<|tool_call_begin|>", 163597},         {"<|tool_call_argument_begin|>", 163598},
    {"<|tool_call_end|>", 163599},           {"<think>", 163606},
    {"</think>", 163607},                    {"<|im_end|>", 163586},
    {"[EOS]", 163585},                       {"<|im_user|>", 163587},
}, k3_names[] = {
    {"<|open|>", 163587}, {"<|close|>", 163588}, {"<|sep|>", 163589}, {"<|end_of_msg|>", 163586}, {"[EOS]", 163585},
};
#define TEXT_ID 1000 /* any ordinary token */

typedef struct names_tab {
    const void *tab;
    size_t n;
} names_tab;

static int32_t lookup(void *user, const char *name) {
    const names_tab *t = user;
    const struct {
        const char *name;
        int32_t id;
    } *e = t->tab;
    for (size_t i = 0; i < t->n; i++)
        if (!strcmp(e[i].name, name)) return e[i].id;
    return -1;
}

static names_tab table_of(k3c_parse_dialect d) {
    return d == K3C_PARSE_K3 ? (names_tab){k3_names, sizeof k3_names / sizeof k3_names[0]}
                             : (names_tab){k2_names, sizeof k2_names / sizeof k2_names[0]};
}

typedef struct tok {
    int32_t id;
    const char *s;
    size_t n;
} tok;

typedef struct tok_list {
    tok *t;
    size_t n, cap;
} tok_list;

static void push_tok(tok_list *l, int32_t id, const char *s, size_t n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->t = realloc(l->t, l->cap * sizeof *l->t);
        if (!l->t) abort();
    }
    l->t[l->n++] = (tok){id, s, n};
}

/* Text split into tokens: split 0 = whole runs, 1 = one byte each, else random lengths 1..split (any byte
 * boundary, inside UTF-8 sequences too). */
static void push_text(tok_list *l, const char *s, size_t n, int split, k3c_rng *r) {
    size_t i = 0;
    while (i < n) {
        size_t k = split == 0 ? n - i : split == 1 ? 1 : 1 + (size_t)(k3c_rng_next(r) % (uint64_t)split);
        if (k > n - i) k = n - i;
        push_tok(l, TEXT_ID, s + i, k);
        i += k;
    }
}

/* A string in which the dialect's special names are special tokens (leftmost match), the rest text. */
static void tokenize(tok_list *l, k3c_parse_dialect d, const char *s, int split, k3c_rng *r) {
    names_tab t = table_of(d);
    const struct {
        const char *name;
        int32_t id;
    } *e = t.tab;
    size_t n = strlen(s), i = 0, text_from = 0;
    while (i < n) {
        size_t hit = t.n;
        for (size_t k = 0; k < t.n; k++)
            if (!strncmp(s + i, e[k].name, strlen(e[k].name))) hit = k;
        if (hit == t.n) {
            i++;
            continue;
        }
        push_text(l, s + text_from, i - text_from, split, r);
        push_tok(l, e[hit].id, s + i, strlen(e[hit].name));
        i += strlen(e[hit].name);
        text_from = i;
    }
    push_text(l, s + text_from, n - text_from, split, r);
}

/* The events folded into content / reasoning / calls, checked for order as they come. */
typedef struct fold_call {
    int index;
    k3c_strbuf id, name, args;
    int ended;
} fold_call;

typedef struct fold {
    k3c_strbuf content, reasoning;
    fold_call calls[64];
    int n;
    int bad; /* an event out of order */
    char why[160];
} fold;

static fold_call *fold_find(fold *f, int index) {
    for (int i = 0; i < f->n; i++)
        if (f->calls[i].index == index) return &f->calls[i];
    return NULL;
}

static void fold_apply(fold *f, const k3c_parse_event *ev, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const k3c_parse_event *e = &ev[i];
        fold_call *c = e->kind >= K3C_PARSE_TOOL_START ? fold_find(f, e->index) : NULL;
        switch (e->kind) {
        case K3C_PARSE_CONTENT: k3c_strbuf_put(&f->content, e->text, e->len); break;
        case K3C_PARSE_REASONING: k3c_strbuf_put(&f->reasoning, e->text, e->len); break;
        case K3C_PARSE_TOOL_START:
            if (c || f->n == 64 || !e->id || !e->name) {
                f->bad = 1;
                snprintf(f->why, sizeof f->why, "start of call %d repeated or without id/name", e->index);
                break;
            }
            c = &f->calls[f->n++];
            memset(c, 0, sizeof *c);
            c->index = e->index;
            k3c_strbuf_puts(&c->id, e->id);
            k3c_strbuf_puts(&c->name, e->name);
            k3c_strbuf_cstr(&c->args);
            break;
        case K3C_PARSE_TOOL_ARGS:
        case K3C_PARSE_TOOL_END:
        case K3C_PARSE_TOOL_VOID:
            if (!c || c->ended) {
                f->bad = 1;
                snprintf(f->why, sizeof f->why, "event %d for call %d not open", (int)e->kind, e->index);
                break;
            }
            if (e->kind == K3C_PARSE_TOOL_ARGS) k3c_strbuf_put(&c->args, e->text, e->len);
            if (e->kind == K3C_PARSE_TOOL_END) c->ended = 1;
            if (e->kind == K3C_PARSE_TOOL_VOID) {
                k3c_strbuf_free(&c->id);
                k3c_strbuf_free(&c->name);
                k3c_strbuf_free(&c->args);
                *c = f->calls[--f->n];
            }
            break;
        default: f->bad = 1; snprintf(f->why, sizeof f->why, "unknown event kind %d", (int)e->kind);
        }
    }
}

static void fold_free(fold *f) {
    k3c_strbuf_free(&f->content);
    k3c_strbuf_free(&f->reasoning);
    for (int i = 0; i < f->n; i++) {
        k3c_strbuf_free(&f->calls[i].id);
        k3c_strbuf_free(&f->calls[i].name);
        k3c_strbuf_free(&f->calls[i].args);
    }
}

static int same_bytes(const char *a, size_t an, const char *b, size_t bn) {
    return an == bn && (an == 0 || !memcmp(a, b, an));
}

/* A parse rendered as one string, to compare runs: content, reasoning, then each call. */
static void put_bytes(k3c_strbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\0')
            k3c_strbuf_puts(b, "\\0");
        else
            k3c_strbuf_putc(b, s[i]);
    }
}

static char *summary(const k3c_parse_result *r) {
    k3c_strbuf b = {0};
    k3c_strbuf_puts(&b, "content=[");
    put_bytes(&b, r->content, r->content_len);
    k3c_strbuf_puts(&b, "] reasoning=[");
    put_bytes(&b, r->reasoning, r->reasoning_len);
    k3c_strbuf_puts(&b, "]");
    for (size_t i = 0; i < r->n_calls; i++)
        k3c_strbuf_printf(&b, " call(%d %s %s %s)", r->calls[i].index, r->calls[i].id, r->calls[i].name,
                          r->calls[i].arguments);
    return k3c_strbuf_take(&b, NULL);
}

/* Runs the tokens through a parser; returns the summary (malloc'd) or NULL with *why on a broken invariant. */
static char *run_tokens(const k3c_parser_opts *o, const tok_list *l, char *why, size_t why_n) {
    k3c_parse_specials sp;
    names_tab t = table_of(o->dialect);
    k3c_parse_specials_lookup(&sp, o->dialect, lookup, &t);
    k3c_parser *p;
    if (k3c_parser_create(o, &sp, &p) != K3C_OK) return NULL;
    fold f = {0};
    const k3c_parse_event *ev;
    size_t n;
    for (size_t i = 0; i < l->n; i++) {
        if (k3c_parser_feed(p, l->t[i].id, l->t[i].s, l->t[i].n, &ev, &n) != K3C_OK) abort();
        fold_apply(&f, ev, n);
    }
    if (k3c_parser_finish(p, &ev, &n) != K3C_OK) abort();
    fold_apply(&f, ev, n);
    if (k3c_parser_feed(p, TEXT_ID, "after", 5, &ev, &n) != K3C_OK || n != 0) {
        snprintf(why, why_n, "events after finish");
        goto fail;
    }
    k3c_parse_result r;
    if (k3c_parser_result(p, &r) != K3C_OK) abort();
    if (f.bad) {
        snprintf(why, why_n, "%s", f.why);
        goto fail;
    }
    if (!r.finished || !same_bytes(r.content, r.content_len, f.content.data, f.content.len) ||
        !same_bytes(r.reasoning, r.reasoning_len, f.reasoning.data, f.reasoning.len) || (int)r.n_calls != f.n) {
        snprintf(why, why_n, "events do not fold to the result");
        goto fail;
    }
    for (size_t i = 0; i < r.n_calls; i++) {
        const fold_call *c = &f.calls[i];
        cJSON *args = cJSON_Parse(r.calls[i].arguments);
        int ok = c->ended && c->index == r.calls[i].index && !strcmp(c->id.data, r.calls[i].id) &&
                 !strcmp(c->name.data, r.calls[i].name) && !strcmp(c->args.data, r.calls[i].arguments) &&
                 cJSON_IsObject(args);
        cJSON_Delete(args);
        if (!ok) {
            snprintf(why, why_n, "call %zu: not ended, not the folded one, or arguments not a JSON object", i);
            goto fail;
        }
    }
    char *s = summary(&r);
    fold_free(&f);
    k3c_parser_free(p);
    return s;
fail:
    fold_free(&f);
    k3c_parser_free(p);
    return NULL;
}

typedef struct parse_case {
    const char *input;
    const char *content, *reasoning;
    const char *calls; /* " call(...)" as summary writes them, or "" */
} parse_case;

/* Every case, split whole / per byte / randomly (several seeds), gives the expected summary. */
static int run_case(k3c_parse_dialect d, int reasoning, int start_in_reasoning, const parse_case *c, size_t ci) {
    k3c_parser_opts o = {d, reasoning, start_in_reasoning};
    char want[8192];
    snprintf(want, sizeof want, "content=[%s] reasoning=[%s]%s", c->content, c->reasoning, c->calls);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() + ci);
    for (int round = 0; round < 12; round++) {
        int split = round == 0 ? 0 : round == 1 ? 1 : 2 + round * 3;
        tok_list l = {0};
        tokenize(&l, d, c->input, split, &r);
        char why[200] = "";
        char *got = run_tokens(&o, &l, why, sizeof why);
        free(l.t);
        if (!got || strcmp(got, want) != 0) {
            fprintf(stderr, "    case %zu split %d: %s\n      want %s\n      got  %s\n", ci, split, why, want,
                    got ? got : "(invariant broken)");
            free(got);
            return 0;
        }
        free(got);
    }
    return 1;
}

#define SB "<|tool_calls_section_begin|>"
#define SE "<|tool_calls_section_end|>"
#define CB "<|tool_call_begin|>"
#define AB "<|tool_call_argument_begin|>"
#define CE "<|tool_call_end|>"

TEST(parse_k2_cases) {
    static const parse_case think_cases[] = {
        {"<think>The user greets.</think>Hello!", "Hello!", "The user greets.", ""},
        {"<think>multi\nline <b></think>\n\nAnswer", "\n\nAnswer", "multi\nline <b>", ""},
        /* truncated while thinking: all reasoning */
        {"<think>still going", "", "still going", ""},
        /* <think> after content is text; a stray </think> in content is text */
        {"Hi <think>x</think>", "Hi <think>x</think>", "", ""},
        /* a call inside the reasoning ends it (llama.cpp's "call inside thinking block") */
        {"<think>I need f" SB CB "functions.f:0" AB "{\"a\": 1}" CE SE, "", "I need f",
         " call(0 functions.f:0 f {\"a\": 1})"},
        /* stops at <|im_end|> */
        {"<think>r</think>done<|im_end|>ignored", "done", "r", ""},
    };
    for (size_t i = 0; i < sizeof think_cases / sizeof think_cases[0]; i++) CHECK(run_case(K3C_PARSE_K2, 1, 0, &think_cases[i], i));

    static const parse_case cases[] = {
        {"Let me check." SB CB "functions.get_weather:0" AB "{\"city\": \"Paris\"}" CE SE, "Let me check.", "",
         " call(0 functions.get_weather:0 get_weather {\"city\": \"Paris\"})"},
        {SB CB "functions.search:0" AB "{\"q\":\"a\"}" CE CB "functions.fetch:1" AB "{\"url\": \"x\", \"n\": [1, {}]}" CE SE,
         "", "", " call(0 functions.search:0 search {\"q\":\"a\"}) call(1 functions.fetch:1 fetch {\"url\": \"x\", \"n\": [1, {}]})"},
        /* spaces around the id and the arguments are trimmed (the official regex's \s*) */
        {SB CB " functions.f:12 \n" AB "  {\"a\":1}\n " CE SE, "", "", " call(0 functions.f:12 f {\"a\":1})"},
        /* a dotted name keeps its dots */
        {SB CB "functions.ns.tool:3" AB "{}" CE SE, "", "", " call(0 functions.ns.tool:3 ns.tool {})"},
        /* no section markers, no end markers: complete JSON objects are calls (llama.cpp's real-life case) */
        {CB "functions.run:0" AB "{\"cmd\": \"ls\"}" CB "functions.run:1" AB "{\"cmd\": \"pwd\"}", "", "",
         " call(0 functions.run:0 run {\"cmd\": \"ls\"}) call(1 functions.run:1 run {\"cmd\": \"pwd\"})"},
        /* bad JSON arguments: the call and its empty section are content */
        {"x" SB CB "functions.f:0" AB "{\"a\": }" CE SE, "x" SB CB "functions.f:0" AB "{\"a\": }" CE SE, "", ""},
        /* arguments that are JSON but not an object */
        {SB CB "functions.f:0" AB "[1, 2]" CE SE, SB CB "functions.f:0" AB "[1, 2]" CE SE, "", ""},
        /* a name without the functions. prefix */
        {SB CB "get_weather:0" AB "{}" CE SE, SB CB "get_weather:0" AB "{}" CE SE, "", ""},
        /* ids without an index, with an empty name, with spaces in the name */
        {CB "functions.f" AB "{}" CE, CB "functions.f" AB "{}" CE, "", ""},
        {CB "functions.:0" AB "{}" CE, CB "functions.:0" AB "{}" CE, "", ""},
        {CB "functions.a b:0" AB "{}" CE, CB "functions.a b:0" AB "{}" CE, "", ""},
        /* unterminated: the output ends inside the arguments */
        {"ok" SB CB "functions.f:0" AB "{\"a\": ", "ok" SB CB "functions.f:0" AB "{\"a\": ", "", ""},
        {"ok" SB CB "functions.f", "ok" SB CB "functions.f", "", ""},
        {"ok" SB, "ok" SB, "", ""},
        /* one good call, then a bad one: the good one stays, the bad one's text is content */
        {SB CB "functions.a:0" AB "{}" CE CB "functions.b:1" AB "{oops" CE SE, CB "functions.b:1" AB "{oops" CE, "",
         " call(0 functions.a:0 a {})"},
        /* markers out of place are text */
        {CE "x" AB SE "y", CE "x" AB SE "y", "", ""},
        {SB CB "functions.f:0" CE SE, SB CB "functions.f:0" CE SE, "", ""},
        {SB SE, SB SE, "", ""},
        /* text between calls is content, spaces there are not */
        {SB " " CB "functions.f:0" AB "{}" CE " note " CB "functions.g:1" AB "{}" CE "\n" SE, " note ", "",
         " call(0 functions.f:0 f {}) call(1 functions.g:1 g {})"},
        /* without reasoning parsing, think tags are content */
        {"<think>r</think>x", "<think>r</think>x", "", ""},
        /* special-token text inside arguments (as the model's tokens) stays in the arguments */
        {SB CB "functions.f:0" AB "{\"s\": \"</think><think>\"}" CE SE, "", "",
         " call(0 functions.f:0 f {\"s\": \"</think><think>\"})"},
        /* unicode and escapes pass through untouched */
        {"中文 😀" SB CB "functions.f:0" AB "{\"s\": \"é\\n\\\"\"}" CE SE, "中文 😀", "",
         " call(0 functions.f:0 f {\"s\": \"é\\n\\\"\"})"},
        {"", "", "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) CHECK(run_case(K3C_PARSE_K2, 0, 0, &cases[i], 100 + i));
}

/* Marker text that arrives as ordinary text tokens (the bytes, not the special token) is content. */
TEST(parse_marker_text_is_content) {
    const char *s = SB CB "functions.f:0" AB "{}" CE SE;
    tok_list l = {0};
    push_text(&l, s, strlen(s), 1, NULL);
    k3c_parser_opts o = {K3C_PARSE_K2, 1, 0};
    char why[200] = "", want[512];
    char *got = run_tokens(&o, &l, why, sizeof why);
    snprintf(want, sizeof want, "content=[%s] reasoning=[]", s);
    CHECKF(got && !strcmp(got, want), "%s / %s", got ? got : why, want);
    free(got);
    free(l.t);
}

#define OP "<|open|>"
#define CL "<|close|>"
#define SP "<|sep|>"
#define EM "<|end_of_msg|>"
#define TAIL CL "message" SP EM

TEST(parse_k3_cases) {
    static const parse_case cases[] = {
        {"I think." CL "think" SP OP "response" SP "Hello!" CL "response" SP TAIL, "Hello!", "I think.", ""},
        /* truncated while thinking */
        {"still thinking", "", "still thinking", ""},
        /* the think close is missing: the response opener ends the reasoning */
        {"r" OP "response" SP "c" CL "response" SP TAIL, "c", "r", ""},
        /* prose naming the tags is text */
        {CL "think" SP OP "response" SP "Use the response tag, then message the handler." CL "response" SP TAIL,
         "Use the response tag, then message the handler.", "", ""},
        /* typed arguments: string raw, number / object as JSON written back the Python way */
        {"plan" CL "think" SP OP "response" SP "On it." CL "response" SP OP "tools" SP OP "call tool=\"search\" index=\"1\"" SP
             OP "argument key=\"q\" type=\"string\"" SP "kimi \"linear\"\n\\" CL "argument" SP
             OP "argument key=\"n\" type=\"number\"" SP "3" CL "argument" SP
             OP "argument key=\"x\" type=\"number\"" SP "2.50" CL "argument" SP
             OP "argument key=\"o\" type=\"object\"" SP "{\"a\":[1,2.0,null],\"b\":true}" CL "argument" SP
             OP "argument key=\"bad\" type=\"number\"" SP "abc" CL "argument" SP CL "call" SP CL "tools" SP TAIL,
         "On it.", "plan",
         " call(0 functions.search:0 search {\"q\": \"kimi \\\"linear\\\"\\n\\\\\", \"n\": 3, \"x\": 2.5, \"o\": {\"a\": [1, 2.0, "
         "null], \"b\": true}, \"bad\": \"abc\"})"},
        /* two calls, no arguments in the first; attribute escapes decoded */
        {CL "think" SP OP "response" SP CL "response" SP OP "tools" SP OP "call tool=\"a&amp;b\" index=\"1\"" SP CL "call" SP
             OP "call tool=\"f\" index=\"2\"" SP OP "argument key=\"k&quot;\" type=\"boolean\"" SP "false" CL "argument" SP CL
             "call" SP CL "tools" SP TAIL,
         "", "", " call(0 functions.a&b:0 a&b {}) call(1 functions.f:1 f {\"k\\\"\": false})"},
        /* a json block is the arguments text */
        {CL "think" SP OP "tools" SP OP "call tool=\"f\" index=\"1\"" SP OP "json type=\"object\"" SP " {\"a\": [1]} " CL "json" SP
             CL "call" SP CL "tools" SP TAIL,
         "", "", " call(0 functions.f:0 f {\"a\": [1]})"},
        /* a json block that is not a JSON object: the call is content */
        {CL "think" SP OP "tools" SP OP "call tool=\"f\" index=\"1\"" SP OP "json type=\"object\"" SP "ls -la" CL "json" SP CL
             "call" SP CL "tools" SP TAIL,
         OP "tools" SP OP "call tool=\"f\" index=\"1\"" SP OP "json type=\"object\"" SP "ls -la" CL "json" SP CL "call" SP CL
             "tools" SP,
         "", ""},
        /* a call without a tool name */
        {CL "think" SP OP "tools" SP OP "call index=\"1\"" SP CL "call" SP CL "tools" SP TAIL,
         OP "tools" SP OP "call index=\"1\"" SP CL "call" SP CL "tools" SP, "", ""},
        /* the output ends inside a call: voided, its text content */
        {CL "think" SP OP "tools" SP OP "call tool=\"f\" index=\"1\"" SP OP "argument key=\"q\" type=\"string\"" SP "par",
         OP "tools" SP OP "call tool=\"f\" index=\"1\"" SP OP "argument key=\"q\" type=\"string\"" SP "par", "", ""},
        /* a good call then the close of the tools section missing the call close */
        {CL "think" SP OP "tools" SP OP "call tool=\"a\" index=\"1\"" SP CL "call" SP OP "call tool=\"b\" index=\"2\"" SP CL
             "tools" SP TAIL,
         OP "call tool=\"b\" index=\"2\"" SP, "", " call(0 functions.a:0 a {})"},
        /* text inside a call between arguments voids it */
        {CL "think" SP OP "tools" SP OP "call tool=\"a\" index=\"1\"" SP "junk" CL "call" SP CL "tools" SP TAIL,
         OP "tools" SP OP "call tool=\"a\" index=\"1\"" SP "junk" CL "call" SP CL "tools" SP, "", ""},
        /* a tag interrupted by another marker is text where it stands */
        {"a" OP "foo" OP "response" SP "b" CL "response" SP TAIL, "b", "a" OP "foo", ""},
        /* an unknown tag is text; a stray sep is text */
        {CL "think" SP OP "response" SP "x" OP "weird tag" SP "y" SP "z" CL "response" SP TAIL,
         "x" OP "weird tag" SP "y" SP "z", "", ""},
        /* stops at <|end_of_msg|> */
        {CL "think" SP OP "response" SP "c" CL "response" SP TAIL "after", "c", "", ""},
        /* spaces between sections are dropped, text there is content */
        {"r" CL "think" SP "\n " OP "response" SP "c" CL "response" SP " tail" TAIL, "c tail", "r", ""},
        {"", "", "", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) CHECK(run_case(K3C_PARSE_K3, 1, 1, &cases[i], 200 + i));

    /* without thinking the prompt opened the response channel; a leading think opener still reads as reasoning */
    static const parse_case no_think[] = {
        {"Hi" CL "response" SP TAIL, "Hi", "", ""},
        {OP "think" SP "r" CL "think" SP OP "response" SP "c" CL "response" SP TAIL, "c", "r", ""},
        {OP "response" SP "c" CL "response" SP TAIL, "c", "", ""},
    };
    for (size_t i = 0; i < sizeof no_think / sizeof no_think[0]; i++) CHECK(run_case(K3C_PARSE_K3, 1, 0, &no_think[i], 300 + i));
}

/* The K3 renderer's assistant turns (the format the model writes) parse back to the corpus messages: the
 * reasoning, the content and each call's name and arguments (json.loads of the original, dumped again). */
TEST(parse_k3_round_trip_corpus) {
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(k3c_read_file("tests/fixtures/chat/conversations.json", (size_t)1 << 20, &text, &len));
    cJSON *corpus = k3c_pyjson_parse(text, len, "corpus");
    free(text);
    CHECK(corpus);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    int turns = 0, calls = 0;
    for (const cJSON *conv = corpus->child; conv; conv = conv->next) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(conv, "messages");
        for (const cJSON *m = msgs->child; m; m = m->next) {
            const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
            if (strcmp(role->valuestring, "assistant") != 0) continue;
            /* [the assistant turn] alone, no generation prompt, thinking on */
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemReferenceToArray(one, (cJSON *)m);
            k3c_chat_request req = {.messages = one};
            k3c_chat_prompt p;
            int rc = k3c_chat_render(K3C_CHAT_K3, &req, &p);
            if (rc != K3C_OK) {
                cJSON_Delete(one);
                continue; /* e.g. a json block: not a call the model writes */
            }
            /* skip the effort message and <|open|>message role="assistant"<|sep|><|open|>think<|sep|> */
            size_t s0 = 0, eoms = 0;
            while (s0 < p.n_segs && eoms < 1)
                if (p.segs[s0++].kind == K3C_CHAT_SEG_SPECIAL && p.text[p.segs[s0 - 1].off + 2] == 'e') eoms++;
            size_t opens = 0;
            while (s0 < p.n_segs && opens < 2)
                if (!memcmp(p.text + p.segs[s0++].off, "<|sep|>", 7) && p.segs[s0 - 1].kind == K3C_CHAT_SEG_SPECIAL)
                    opens++;
            tok_list l = {0};
            names_tab t = table_of(K3C_PARSE_K3);
            for (size_t k = s0; k < p.n_segs; k++) {
                const k3c_chat_segment *sg = &p.segs[k];
                if (sg->kind == K3C_CHAT_SEG_SPECIAL) {
                    char name[32];
                    snprintf(name, sizeof name, "%.*s", (int)sg->len, p.text + sg->off);
                    push_tok(&l, lookup(&t, name), p.text + sg->off, sg->len);
                } else {
                    push_text(&l, p.text + sg->off, sg->len, 5, &r);
                }
            }
            /* what the parse must give */
            const char *rc_s = NULL, *content = "";
            const cJSON *rcj = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
            if (!cJSON_IsString(rcj) || !rcj->valuestring[0]) rcj = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
            rc_s = cJSON_IsString(rcj) && !k3c_py_isblank(rcj->valuestring, strlen(rcj->valuestring)) ? rcj->valuestring : "";
            k3c_strbuf want = {0}, ctext = {0};
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (cJSON_IsString(c)) k3c_strbuf_puts(&ctext, c->valuestring);
            for (const cJSON *part = cJSON_IsArray(c) ? c->child : NULL; part; part = part->next)
                k3c_strbuf_puts(&ctext, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
            content = k3c_strbuf_cstr(&ctext);
            k3c_strbuf_printf(&want, "content=[%s] reasoning=[%s]", content, rc_s);
            int index = 0, skip = 0;
            const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            for (const cJSON *tc = cJSON_IsArray(tcs) ? tcs->child : NULL; tc; tc = tc->next, index++) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                cJSON *parsed = NULL;
                if (cJSON_IsString(a) && !k3c_py_isblank(a->valuestring, strlen(a->valuestring))) {
                    a = parsed = k3c_pyjson_parse(a->valuestring, strlen(a->valuestring), "args");
                    if (!parsed) skip = 1; /* rendered as a json block of non-JSON text: a voided call (parse_k3_cases) */
                }
                k3c_strbuf args = {0};
                if (cJSON_IsObject(a) && a->child)
                    k3c_pyjson_dump(&args, a, 0);
                else
                    k3c_strbuf_puts(&args, "{}");
                k3c_strbuf_printf(&want, " call(%d functions.%s:%d %s %s)", index, name, index, name, args.data);
                k3c_strbuf_free(&args);
                cJSON_Delete(parsed);
                calls++;
            }
            k3c_parser_opts o = {K3C_PARSE_K3, 1, 1};
            char why[200] = "";
            char *got = run_tokens(&o, &l, why, sizeof why);
            int ok = skip || (got && !strcmp(got, want.data));
            if (!ok)
                fprintf(stderr, "    %s: %s\n      want %s\n      got  %s\n",
                        cJSON_GetObjectItemCaseSensitive(conv, "name")->valuestring, why, want.data, got ? got : "-");
            free(got);
            free(l.t);
            k3c_strbuf_free(&want);
            k3c_strbuf_free(&ctext);
            k3c_chat_prompt_free(&p);
            cJSON_Delete(one);
            CHECK(ok);
            turns += !skip;
        }
    }
    cJSON_Delete(corpus);
    printf("    %d assistant turns, %d tool calls parsed back\n", turns, calls);
    CHECK(turns >= 20 && calls >= 15);
}

/* Random token sequences over both dialects' markers and fragments of their text: no crash, and the
 * invariants of run_tokens (ordered events that fold to the result, complete calls with JSON-object
 * arguments, nothing after finish) always hold. ASan (make fuzz) runs the same through a libFuzzer target. */
TEST(parse_fuzz_marker_alphabet) {
    static const char *const frags[] = {
        "functions.f:0", "functions.", ":1", "f", "{", "}", "{\"a\": 1}", "\"", "[", "]", " ", "\n", "x", "中",
        "\xe4\xb8", "\xad", "think", "response", "tools", "call tool=\"f\" index=\"1\"", "argument key=\"k\" type=\"string\"",
        "argument key=\"n\" type=\"number\"", "json type=\"object\"", "message", "call", "argument", "json",
        "tool=\"", "&quot;", "\\", "null", "1.5e3", "<|open|>", "<think>", "", "\x00",
    };
    const int32_t ids[] = {163595, 163596, 163597, 163598, 163599, 163606, 163607, 163586, 163587, 163588, 163589, 163585};
    const char *const id_text[] = {SB, SE, CB, AB, CE, "<think>", "</think>", "<|im_end|>", "<|open|>", "<|close|>", "<|sep|>", "[EOS]"};
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    int runs = 0;
    for (int it = 0; it < 6000; it++) {
        tok_list l = {0};
        int n = (int)(k3c_rng_next(&r) % 48);
        for (int k = 0; k < n; k++) {
            if (k3c_rng_next(&r) % 2) {
                size_t j = (size_t)(k3c_rng_next(&r) % (sizeof ids / sizeof ids[0]));
                push_tok(&l, ids[j], id_text[j], strlen(id_text[j]));
            } else {
                size_t j = (size_t)(k3c_rng_next(&r) % (sizeof frags / sizeof frags[0]));
                push_tok(&l, TEXT_ID, frags[j], j == sizeof frags / sizeof frags[0] - 1 ? 1 : strlen(frags[j]));
            }
        }
        for (int d = 1; d <= 2; d++) {
            k3c_parser_opts o = {(k3c_parse_dialect)d, (int)(it & 1), (int)((it >> 1) & 1)};
            char why[200] = "";
            char *got = run_tokens(&o, &l, why, sizeof why);
            CHECKF(got, "iteration %d dialect %d: %s", it, d, why);
            free(got);
            runs++;
        }
        free(l.t);
    }
    CHECK(runs == 12000);
}

/* Outputs generated from each dialect's grammar, then mutated (tokens dropped, repeated, swapped, markers
 * inserted): the invariants hold, and the result is the same whether the text tokens come merged, one byte
 * each or split at random. */
static const char *const gen_text[] = {"Hello", " ", "\n", "中文", "\xf0\x9f\x98", "\x80", "{\"a\": 1}", "{", "}",
                                       "\"q\"", "x y", "<|open|>", "think", "response", "\\", "3.50", "null", "[1, 2]"};
#define PICK(arr) arr[k3c_rng_next(r) % (sizeof arr / sizeof arr[0])]

static void gen_k2(tok_list *l, k3c_rng *r) {
    static const char *const ids[] = {"functions.f:0", "functions.get_weather:1", " functions.a.b:2 ", "f:0", "functions.x"};
    static const char *const args[] = {"{\"a\": 1}", "{}", " {\"s\": \"</think>\"} ", "{\"a\": ", "[1]", "nope"};
    if (k3c_rng_next(r) % 2) {
        push_tok(l, 163606, "<think>", 7);
        for (int k = (int)(k3c_rng_next(r) % 3); k >= 0; k--) { const char *t = PICK(gen_text); push_tok(l, TEXT_ID, t, strlen(t)); }
        push_tok(l, 163607, "</think>", 8);
    }
    for (int k = (int)(k3c_rng_next(r) % 3); k > 0; k--) { const char *t = PICK(gen_text); push_tok(l, TEXT_ID, t, strlen(t)); }
    if (k3c_rng_next(r) % 4) {
        push_tok(l, 163595, SB, strlen(SB));
        for (int c = 1 + (int)(k3c_rng_next(r) % 3); c > 0; c--) {
            push_tok(l, 163597, CB, strlen(CB));
            const char *id = PICK(ids), *a = PICK(args);
            push_tok(l, TEXT_ID, id, strlen(id));
            push_tok(l, 163598, AB, strlen(AB));
            push_tok(l, TEXT_ID, a, strlen(a));
            push_tok(l, 163599, CE, strlen(CE));
        }
        push_tok(l, 163596, SE, strlen(SE));
    }
    if (k3c_rng_next(r) % 2) push_tok(l, 163586, "<|im_end|>", 10);
}

static void gen_tag(tok_list *l, int close, const char *body) {
    push_tok(l, close ? 163588 : 163587, close ? CL : OP, strlen(close ? CL : OP));
    push_tok(l, TEXT_ID, body, strlen(body));
    push_tok(l, 163589, SP, strlen(SP));
}

static void gen_k3(tok_list *l, k3c_rng *r) {
    static const char *const calls[] = {"call tool=\"f\" index=\"1\"", "call tool=\"a&amp;b\" index=\"2\"", "call index=\"1\"",
                                        " call  tool=\"g\" "};
    static const char *const argtags[] = {"argument key=\"q\" type=\"string\"", "argument key=\"n\" type=\"number\"",
                                          "argument key=\"o\" type=\"object\"", "argument key=\"k\"", "argument type=\"x\"",
                                          "json type=\"object\""};
    for (int k = (int)(k3c_rng_next(r) % 3); k > 0; k--) { const char *t = PICK(gen_text); push_tok(l, TEXT_ID, t, strlen(t)); }
    gen_tag(l, 1, "think");
    gen_tag(l, 0, "response");
    for (int k = (int)(k3c_rng_next(r) % 3); k > 0; k--) { const char *t = PICK(gen_text); push_tok(l, TEXT_ID, t, strlen(t)); }
    gen_tag(l, 1, "response");
    if (k3c_rng_next(r) % 4) {
        gen_tag(l, 0, "tools");
        for (int c = 1 + (int)(k3c_rng_next(r) % 3); c > 0; c--) {
            gen_tag(l, 0, PICK(calls));
            for (int a = (int)(k3c_rng_next(r) % 3); a > 0; a--) {
                const char *tag = PICK(argtags);
                gen_tag(l, 0, tag);
                const char *v = PICK(gen_text);
                push_tok(l, TEXT_ID, v, strlen(v));
                gen_tag(l, 1, !strncmp(tag, "json", 4) ? "json" : "argument");
            }
            gen_tag(l, 1, "call");
        }
        gen_tag(l, 1, "tools");
    }
    gen_tag(l, 1, "message");
    if (k3c_rng_next(r) % 2) push_tok(l, 163586, EM, strlen(EM));
}

static void mutate(tok_list *l, k3c_rng *r) {
    static const tok markers[] = {{163595, SB, sizeof SB - 1}, {163597, CB, sizeof CB - 1}, {163599, CE, sizeof CE - 1},
                                  {163587, OP, sizeof OP - 1}, {163588, CL, sizeof CL - 1}, {163589, SP, sizeof SP - 1}};
    for (int m = (int)(k3c_rng_next(r) % 4); m > 0 && l->n; m--) {
        size_t i = (size_t)(k3c_rng_next(r) % l->n);
        switch (k3c_rng_next(r) % 4) {
        case 0: memmove(l->t + i, l->t + i + 1, (l->n - i - 1) * sizeof *l->t); l->n--; break;
        case 1: push_tok(l, l->t[i].id, l->t[i].s, l->t[i].n); break;
        case 2: if (i + 1 < l->n) { tok t = l->t[i]; l->t[i] = l->t[i + 1]; l->t[i + 1] = t; } break;
        default: {
            tok t = markers[k3c_rng_next(r) % (sizeof markers / sizeof markers[0])];
            push_tok(l, t.id, t.s, t.n);
            memmove(l->t + i + 1, l->t + i, (l->n - i - 1) * sizeof *l->t);
            l->t[i] = t;
        }
        }
    }
}

/* The same tokens with each run of text tokens re-split: 0 merged, 1 per byte, else random. */
static void resplit(const tok_list *in, tok_list *out, int split, k3c_rng *r, char *arena) {
    size_t at = 0;
    for (size_t i = 0; i < in->n;) {
        if (in->t[i].id != TEXT_ID) {
            push_tok(out, in->t[i].id, in->t[i].s, in->t[i].n);
            i++;
            continue;
        }
        size_t from = at;
        for (; i < in->n && in->t[i].id == TEXT_ID; i++) {
            memcpy(arena + at, in->t[i].s, in->t[i].n);
            at += in->t[i].n;
        }
        push_text(out, arena + from, at - from, split, r);
    }
}

TEST(parse_fuzz_grammar_mutations) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0x9e3779b97f4a7c15ULL);
    static char arena[3][1 << 16];
    int runs = 0, with_calls[2] = {0}, voided[2] = {0};
    for (int it = 0; it < 4000; it++) {
        k3c_parse_dialect d = it & 1 ? K3C_PARSE_K3 : K3C_PARSE_K2;
        tok_list l = {0};
        if (d == K3C_PARSE_K3)
            gen_k3(&l, &r);
        else
            gen_k2(&l, &r);
        mutate(&l, &r);
        k3c_parser_opts o = {d, (int)((it >> 1) & 1) | (d == K3C_PARSE_K3), d == K3C_PARSE_K3 ? (int)((it >> 2) & 1) : 0};
        char *first = NULL;
        for (int v = 0; v < 3; v++) {
            tok_list s2 = {0};
            resplit(&l, &s2, v == 0 ? 0 : v == 1 ? 1 : 7, &r, arena[v]);
            char why[200] = "";
            char *got = run_tokens(&o, &s2, why, sizeof why);
            free(s2.t);
            CHECKF(got, "iteration %d dialect %d split %d: %s", it, (int)d, v, why);
            if (!first) {
                first = got;
                with_calls[d == K3C_PARSE_K3] += strstr(got, " call(") != NULL;
                voided[d == K3C_PARSE_K3] += strstr(got, d == K3C_PARSE_K3 ? "call tool=" : "<|tool_call_begin|>") != NULL;
            } else {
                int same = !strcmp(first, got);
                if (!same) fprintf(stderr, "    iteration %d: merged %s\n      split %d %s\n", it, first, v, got);
                free(got);
                CHECK(same);
            }
            runs++;
        }
        free(first);
        free(l.t);
    }
    printf("    outputs with calls: K2 %d, K3 %d of 2000 each; with a call's raw text in content: K2 %d, K3 %d\n",
           with_calls[0], with_calls[1], voided[0], voided[1]);
    CHECK(runs == 12000 && with_calls[0] > 400 && with_calls[1] > 400 && voided[0] > 200 && voided[1] > 200);
}

static int has_k2_special(const char *s) {
    for (size_t k = 0; k < sizeof k2_names / sizeof k2_names[0]; k++)
        if (strstr(s, k2_names[k].name)) return 1;
    return 0;
}

/* The K2-Thinking renderer's assistant turns parse back: each turn's body (after <|im_middle|>, up to
 * <|im_end|>) split into tokens gives its reasoning (kept for turns with tool calls, which lie after the split),
 * content and calls, with the renderer's functions.NAME:N ids and the arguments text as written. Turns whose
 * text spells a K2 marker are skipped: rendered as one MIXED string, that text is the marker token. */
/* The options a rendered prompt implies. */
TEST(parse_opts_of_format) {
    k3c_parser_opts o = k3c_parser_opts_of(K3C_CHAT_K3, 0);
    CHECK(o.dialect == K3C_PARSE_K3 && o.start_in_reasoning == 1);
    CHECK(k3c_parser_opts_of(K3C_CHAT_K3, 1).start_in_reasoning == 0);
    o = k3c_parser_opts_of(K3C_CHAT_K2_THINKING_MOONSHOT, 0);
    CHECK(o.dialect == K3C_PARSE_K2 && o.reasoning == 1 && o.start_in_reasoning == 0);
    CHECK(k3c_parser_opts_of(K3C_CHAT_K2_INSTRUCT, 0).reasoning == 0);
    CHECK(k3c_parser_opts_of(K3C_CHAT_KIMI_LINEAR, 0).reasoning == 0);
    /* the lookup fills the markers by name and the dialect's stop tokens */
    k3c_parse_specials sp;
    names_tab t = table_of(K3C_PARSE_K2);
    k3c_parse_specials_lookup(&sp, K3C_PARSE_K2, lookup, &t);
    CHECK(sp.call_begin == 163597 && sp.think_close == 163607 && sp.open == -1 && sp.n_stop == 2 &&
          sp.stop[0] == 163586 && sp.stop[1] == 163585);
    t = table_of(K3C_PARSE_K3);
    k3c_parse_specials_lookup(&sp, K3C_PARSE_K3, lookup, &t);
    CHECK(sp.sep == 163589 && sp.call_begin == -1 && sp.stop[0] == 163586);
}

TEST(parse_k2_round_trip_corpus) {
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(k3c_read_file("tests/fixtures/chat/conversations.json", (size_t)1 << 20, &text, &len));
    cJSON *corpus = k3c_pyjson_parse(text, len, "corpus");
    free(text);
    CHECK(corpus);
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    int turns = 0, calls = 0;
    for (const cJSON *conv = corpus->child; conv; conv = conv->next) {
        const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(conv, "messages");
        for (const cJSON *m = msgs->child; m; m = m->next) {
            if (strcmp(cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring, "assistant") != 0) continue;
            cJSON *one = cJSON_CreateArray();
            cJSON_AddItemReferenceToArray(one, (cJSON *)m);
            k3c_chat_request req = {.messages = one};
            k3c_chat_prompt p;
            int rc = k3c_chat_render(K3C_CHAT_K2_THINKING, &req, &p);
            cJSON_Delete(one);
            CHECK_OK(rc);
            const char *body = strstr(strstr(p.text, "<|im_assistant|>"), "<|im_middle|>") + strlen("<|im_middle|>");
            const char *end = p.text + p.len - strlen("<|im_end|>");
            CHECK(end >= body && !strcmp(end, "<|im_end|>"));
            /* what the parse must give */
            const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            int with_calls = cJSON_IsArray(tcs) && tcs->child;
            const cJSON *rcj = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
            if (!cJSON_IsString(rcj)) rcj = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
            k3c_strbuf want = {0}, ctext = {0};
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
            if (cJSON_IsString(c)) k3c_strbuf_puts(&ctext, c->valuestring);
            for (const cJSON *part = cJSON_IsArray(c) ? c->child : NULL; part; part = part->next)
                k3c_strbuf_puts(&ctext, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
            k3c_strbuf_printf(&want, "content=[%s] reasoning=[%s]", k3c_strbuf_cstr(&ctext),
                              with_calls && cJSON_IsString(rcj) ? rcj->valuestring : "");
            int skip = has_k2_special(want.data), index = 0;
            for (const cJSON *tc = with_calls ? tcs->child : NULL; tc; tc = tc->next, index++) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
                const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                k3c_strbuf args = {0};
                if (cJSON_IsString(a)) {
                    cJSON *v = cJSON_Parse(a->valuestring);
                    skip |= !cJSON_IsObject(v) || has_k2_special(a->valuestring); /* voided: parse_k2_cases */
                    cJSON_Delete(v);
                    k3c_strbuf_puts(&args, a->valuestring);
                } else {
                    k3c_pyjson_dump(&args, a, 0);
                }
                k3c_strbuf_printf(&want, " call(%d functions.%s:%d %s %s)", index, name, index, name, args.data);
                k3c_strbuf_free(&args);
            }
            if (!skip) {
                tok_list l = {0};
                char *copy = strndup(body, (size_t)(end - body));
                tokenize(&l, K3C_PARSE_K2, copy, 4, &r);
                k3c_parser_opts o = {K3C_PARSE_K2, 1, 0};
                char why[200] = "";
                char *got = run_tokens(&o, &l, why, sizeof why);
                int ok = got && !strcmp(got, want.data);
                if (!ok)
                    fprintf(stderr, "    %s: %s\n      want %s\n      got  %s\n",
                            cJSON_GetObjectItemCaseSensitive(conv, "name")->valuestring, why, want.data, got ? got : "-");
                free(got);
                free(l.t);
                free(copy);
                CHECK(ok);
                turns++;
                calls += index;
            }
            k3c_strbuf_free(&want);
            k3c_strbuf_free(&ctext);
            k3c_chat_prompt_free(&p);
        }
    }
    cJSON_Delete(corpus);
    printf("    %d assistant turns, %d tool calls parsed back\n", turns, calls);
    CHECK(turns >= 20 && calls >= 12);
}
