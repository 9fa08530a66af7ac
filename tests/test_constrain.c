/* Constrained decoding (src/constrain/, runtime/constrained.c):
 *  - the JSON automaton against a validator written from RFC 8259 (tests/ref/json_rfc.c) and, where python3
 *    is installed, against Python's json module (the same strings written to a fixture and judged by
 *    json.loads of their strict UTF-8 decoding, NaN / Infinity refused): fresh random documents and near
 *    misses (a byte deleted, inserted, replaced, doubled, swapped; cut short; random bytes);
 *  - no dead prefix: every prefix the automaton admits is completed, along bytes that each shorten
 *    jz_min_close by one, into a text the validator accepts, in exactly jz_min_close bytes;
 *  - schemas: documents generated from each schema are admitted; what the automaton admits of their near
 *    misses satisfies the schema (a validator written here, over cJSON); strict compiling refuses what it
 *    cannot enforce, naming the keyword's path;
 *  - the vocabulary mask (the sorted walk) equals each token checked alone, with and without a budget; the
 *    constrained greedy choice is the best admitted token (NaN and ties included), sampled choices are
 *    admitted;
 *  - chat grammars (K3 on the tiny preset's tokenizer; K2 on kimi-linear-tiny's, with and without <think>):
 *    random logits driven through the grammar, greedy and sampled, under budgets from the grammar's minimum
 *    up, always give what the format's own output parser reads as a call of the named tool (or of the
 *    required tools) with arguments that parse as a JSON object of its schema, within the budget. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/grammar.h"
#include "constrain/json.h"
#include "constrain/schema.h"
#include "k3c.h"
#include "ref/json_rfc.h"
#include "runtime/constrained.h"
#include "runtime/sampler.h"
#include "test.h"
#include "util/error.h"
#include "util/rng.h"

/* ---- a byte buffer ---- */

typedef struct bbuf {
    uint8_t *d;
    size_t n, cap;
} bbuf;

static void bput(bbuf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 64;
        while (c < b->n + n + 1) c *= 2;
        b->d = realloc(b->d, c);
        b->cap = c;
    }
    memcpy(b->d + b->n, s, n);
    b->n += n;
    b->d[b->n] = 0;
}
static void bputc(bbuf *b, uint8_t c) { bput(b, &c, 1); }
static void bputs(bbuf *b, const char *s) { bput(b, s, strlen(s)); }

static uint32_t rnd(k3c_rng *r, uint32_t n) { return (uint32_t)(k3c_rng_next(r) % n); }

/* ---- random JSON ---- */

static void gen_ws(k3c_rng *r, bbuf *b) {
    if (rnd(r, 3)) return;
    for (uint32_t k = rnd(r, 3); k; k--) bputc(b, (uint8_t)" \t\n\r"[rnd(r, 4)]);
}

static void put_utf8(bbuf *b, uint32_t cp) {
    uint8_t u[4];
    int n;
    if (cp < 0x80) u[0] = (uint8_t)cp, n = 1;
    else if (cp < 0x800) u[0] = (uint8_t)(0xC0 | cp >> 6), u[1] = (uint8_t)(0x80 | (cp & 0x3F)), n = 2;
    else if (cp < 0x10000)
        u[0] = (uint8_t)(0xE0 | cp >> 12), u[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)), u[2] = (uint8_t)(0x80 | (cp & 0x3F)), n = 3;
    else
        u[0] = (uint8_t)(0xF0 | cp >> 18), u[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F)), u[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F)),
        u[3] = (uint8_t)(0x80 | (cp & 0x3F)), n = 4;
    bput(b, u, (size_t)n);
}

/* surrogates: \u escapes of lone surrogates too (RFC 8259 allows them; cJSON, the schema tests' parser, does not) */
static void gen_string_s(k3c_rng *r, bbuf *b, int surrogates) {
    bputc(b, '"');
    for (uint32_t k = rnd(r, 9); k; k--) {
        uint32_t t = rnd(r, 10);
        if (t < 5) {
            uint8_t c;
            do c = (uint8_t)(0x20 + rnd(r, 95)); while (c == '"' || c == '\\');
            bputc(b, c);
        } else if (t == 5) {
            bputc(b, '\\');
            bputc(b, (uint8_t)"\"\\/bfnrt"[rnd(r, 8)]);
        } else if (t == 6) {
            char u[8];
            uint32_t v;
            do v = rnd(r, 3) || !surrogates ? rnd(r, 0x10000) : 0xD800 + rnd(r, 0x800);
            while (!surrogates && (v >= 0xD800 && v <= 0xDFFF));
            snprintf(u, sizeof u, rnd(r, 2) ? "\\u%04x" : "\\u%04X", v);
            bputs(b, u);
        } else {
            uint32_t cp;
            do cp = t == 7 ? 0x80 + rnd(r, 0x780) : t == 8 ? 0x800 + rnd(r, 0xF800) : 0x10000 + rnd(r, 0x100000);
            while (cp >= 0xD800 && cp <= 0xDFFF);
            put_utf8(b, cp);
        }
    }
    bputc(b, '"');
}

static void gen_string(k3c_rng *r, bbuf *b) { gen_string_s(r, b, 1); }

static void gen_number(k3c_rng *r, bbuf *b) {
    if (rnd(r, 3) == 0) bputc(b, '-');
    if (rnd(r, 4) == 0) {
        bputc(b, '0');
    } else {
        bputc(b, (uint8_t)('1' + rnd(r, 9)));
        for (uint32_t k = rnd(r, 5); k; k--) bputc(b, (uint8_t)('0' + rnd(r, 10)));
    }
    if (rnd(r, 3) == 0) {
        bputc(b, '.');
        for (uint32_t k = 1 + rnd(r, 3); k; k--) bputc(b, (uint8_t)('0' + rnd(r, 10)));
    }
    if (rnd(r, 3) == 0) {
        bputc(b, rnd(r, 2) ? 'e' : 'E');
        if (rnd(r, 2)) bputc(b, rnd(r, 2) ? '+' : '-');
        for (uint32_t k = 1 + rnd(r, 3); k; k--) bputc(b, (uint8_t)('0' + rnd(r, 10)));
    }
}

static void gen_value(k3c_rng *r, bbuf *b, int depth, int max_depth) {
    uint32_t t = rnd(r, depth < max_depth ? 9 : 6);
    switch (t) {
    case 0: gen_string(r, b); break;
    case 1:
    case 2: gen_number(r, b); break;
    case 3: bputs(b, "true"); break;
    case 4: bputs(b, rnd(r, 2) ? "false" : "null"); break;
    case 5: gen_number(r, b); break;
    case 6:
    case 7: {
        bputc(b, '{');
        gen_ws(r, b);
        for (uint32_t k = rnd(r, 4), i = 0; i < k; i++) {
            if (i) bputc(b, ','), gen_ws(r, b);
            gen_string(r, b);
            gen_ws(r, b);
            bputc(b, ':');
            gen_ws(r, b);
            gen_value(r, b, depth + 1, max_depth);
            gen_ws(r, b);
        }
        bputc(b, '}');
        break;
    }
    default: {
        bputc(b, '[');
        gen_ws(r, b);
        for (uint32_t k = rnd(r, 4), i = 0; i < k; i++) {
            if (i) bputc(b, ','), gen_ws(r, b);
            gen_value(r, b, depth + 1, max_depth);
            gen_ws(r, b);
        }
        bputc(b, ']');
        break;
    }
    }
}

static void gen_doc(k3c_rng *r, bbuf *b) {
    b->n = 0;
    gen_ws(r, b);
    if (rnd(r, 40) == 0) { /* nesting at the automaton's limit, or one past it */
        int d = JZ_MAX_DEPTH + (int)rnd(r, 2);
        for (int i = 0; i < d; i++) bputs(b, rnd(r, 2) ? "[" : "{\"k\":");
        bputc(b, '1');
        /* close in reverse: the opener sequence is not kept, so rebuild it from the text */
        for (size_t i = b->n; i-- > 0;) {
            if (b->d[i] == '[') bputc(b, ']');
            else if (b->d[i] == '{') bputc(b, '}');
        }
    } else {
        gen_value(r, b, 0, 1 + (int)rnd(r, 5));
    }
    gen_ws(r, b);
}

static const char interesting[] = "{}[],:\"\\ \t\n\r0123456789-+.eEtrufalsnx/u";

static void mutate(k3c_rng *r, const bbuf *in, bbuf *out) {
    out->n = 0;
    bput(out, in->d, in->n);
    size_t n = out->n;
    uint32_t op = rnd(r, 7);
    uint8_t c = rnd(r, 3) ? (uint8_t)interesting[rnd(r, sizeof interesting - 1)] : (uint8_t)rnd(r, 256);
    size_t at = n ? rnd(r, (uint32_t)n) : 0;
    switch (op) {
    case 0: /* delete */
        if (n) memmove(out->d + at, out->d + at + 1, n - at - 1), out->n--;
        break;
    case 1: /* insert */
    case 2: {
        bputc(out, 0);
        memmove(out->d + at + 1, out->d + at, n - at);
        out->d[at] = op == 1 ? c : (n ? in->d[at] : c); /* op 2 doubles a byte */
        break;
    }
    case 3: /* replace */
        if (n) out->d[at] = c;
        break;
    case 4: /* cut short */
        out->n = at;
        break;
    case 5: /* swap */
        if (at + 1 < n) {
            uint8_t t = out->d[at];
            out->d[at] = out->d[at + 1];
            out->d[at + 1] = t;
        }
        break;
    default: /* random bytes */
        out->n = 0;
        for (uint32_t k = rnd(r, 12); k; k--)
            bputc(out, rnd(r, 2) ? (uint8_t)interesting[rnd(r, sizeof interesting - 1)] : (uint8_t)rnd(r, 256));
        break;
    }
}

/* ---- running the automaton ---- */

/* 1 when the automaton takes every byte and ends accepting. *stop: the first refused byte (n when none);
 * *at: the state before it. */
static int run_jz(const jz_schema *sc, int root, const uint8_t *s, size_t n, size_t *stop, jz_state *at) {
    jz_state st, t;
    jz_init(&st, root);
    for (size_t i = 0; i < n; i++) {
        memcpy(&t, &st, jz_state_size(&st));
        if (!jz_step(&t, sc, s[i])) {
            *stop = i;
            *at = st;
            return 0;
        }
        memcpy(&st, &t, jz_state_size(&t));
    }
    *stop = n;
    *at = st;
    return jz_accepting(&st, sc);
}

/* Completes st along bytes that each shorten jz_min_close by one, into out; 0 and a message on failure. */
static int complete(const jz_schema *sc, jz_state st, bbuf *out, char *why, size_t why_n) {
    int u = jz_min_close(&st, sc), steps = 0;
    while (!(u == 0 && jz_accepting(&st, sc))) {
        if (u <= 0 || steps > 100000) {
            snprintf(why, why_n, "jz_min_close %d but the state is not accepting", u);
            return 0;
        }
        int found = 0;
        for (int b = 0; b < 256 && !found; b++) {
            jz_state t = st;
            if (jz_step(&t, sc, (uint8_t)b) && jz_min_close(&t, sc) == u - 1) {
                st = t;
                bputc(out, (uint8_t)b);
                found = 1;
            }
        }
        if (!found) {
            snprintf(why, why_n, "no byte shortens jz_min_close %d", u);
            return 0;
        }
        u--;
        steps++;
    }
    return 1;
}

static void show(const uint8_t *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 < cap; i++)
        k += (size_t)(s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\' ? snprintf(out + k, cap - k, "%c", s[i])
                                                                  : snprintf(out + k, cap - k, "\\x%02x", s[i]));
    out[k] = 0;
}

/* ---- the RFC tests ---- */

#define N_DOCS 700

TEST(constrain_json_matches_rfc_and_python) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    jz_schema sc, paired;
    CHECK_OK(jz_schema_init(&sc));
    CHECK_OK(jz_schema_init(&paired));
    paired.paired = 1;
    bbuf doc = {0}, mut = {0}, fix = {0}, comp = {0};
    int n_strings = 0, n_valid = 0, n_invalid = 0;
    char path_in[600], path_out[600], cmd[2000], msg[800];
    snprintf(path_in, sizeof path_in, "%s/json_cases.hex", test_tmpdir());
    snprintf(path_out, sizeof path_out, "%s/json_cases.py-verdicts", test_tmpdir());
    uint8_t *verdict = malloc(N_DOCS * 5);
    for (int d = 0; d < N_DOCS; d++) {
        gen_doc(&r, &doc);
        for (int m = 0; m < 5; m++) {
            const bbuf *s = &doc;
            if (m) mutate(&r, &doc, &mut), s = &mut;
            size_t stop;
            jz_state at;
            int got = run_jz(&sc, JZ_ANY, s->d, s->n, &stop, &at);
            int want = ref_json_valid(s->d, s->n, JZ_MAX_DEPTH);
            show(s->d, s->n, msg, 400);
            CHECKF(got == want, "automaton %d, RFC validator %d on \"%s\"", got, want, msg);
            n_valid += want;
            n_invalid += !want;
            /* paired surrogates (what a model writes): what RFC 8259 allows and cJSON parses */
            cJSON *cj = want ? cJSON_ParseWithLength((const char *)s->d, s->n) : NULL;
            int got_paired = run_jz(&paired, JZ_ANY, s->d, s->n, &stop, &at);
            CHECKF(got_paired == (cj != NULL), "paired automaton %d, RFC + cJSON %d on \"%s\"", got_paired, cj != NULL,
                   msg);
            cJSON_Delete(cj);
            comp.n = 0;
            bput(&comp, s->d, stop);
            char why2[128];
            CHECKF(complete(&paired, at, &comp, why2, sizeof why2), "paired, prefix \"%s\": %s", msg, why2);
            cj = cJSON_ParseWithLength((const char *)comp.d, comp.n);
            CHECKF(cj && ref_json_valid(comp.d, comp.n, JZ_MAX_DEPTH), "paired: a completion cJSON or RFC refuses");
            cJSON_Delete(cj);
            got = run_jz(&sc, JZ_ANY, s->d, s->n, &stop, &at);
            /* the prefix it took completes into a valid text, in exactly jz_min_close bytes */
            comp.n = 0;
            bput(&comp, s->d, stop);
            int u = jz_min_close(&at, &sc);
            size_t before = comp.n;
            char why[128];
            CHECKF(complete(&sc, at, &comp, why, sizeof why), "prefix \"%s\" (%zu bytes): %s", msg, stop, why);
            CHECKF(comp.n - before == (size_t)u, "completion of %zu bytes, jz_min_close %d", comp.n - before, u);
            show(comp.d, comp.n, msg, 400);
            CHECKF(ref_json_valid(comp.d, comp.n, JZ_MAX_DEPTH), "completion \"%s\" is not valid JSON", msg);
            for (size_t i = 0; i < s->n; i++) {
                char h[3];
                snprintf(h, sizeof h, "%02x", s->d[i]);
                bputs(&fix, h);
            }
            bputc(&fix, '\n');
            verdict[n_strings++] = (uint8_t)got;
        }
    }
    CHECKF(n_valid > N_DOCS / 2 && n_invalid > N_DOCS, "%d valid, %d invalid: the generator lost its mix", n_valid,
           n_invalid);
    /* the same strings judged by Python's json */
    FILE *f = fopen(path_in, "wb");
    CHECK(f && fwrite(fix.d, 1, fix.n, f) == fix.n);
    fclose(f);
    if (test_run_status("command -v python3 >/dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd,
                 "python3 -c '\n"
                 "import json, sys\n"
                 "def depth(v):\n"
                 "    if isinstance(v, dict): return 1 + max([depth(x) for x in v.values()], default=0)\n"
                 "    if isinstance(v, list): return 1 + max([depth(x) for x in v], default=0)\n"
                 "    return 0\n"
                 "def refuse(c): raise ValueError(c)\n"
                 "out = []\n"
                 "for line in open(sys.argv[1]):\n"
                 "    try:\n"
                 "        v = json.loads(bytes.fromhex(line.strip()).decode(\"utf-8\"), parse_constant=refuse)\n"
                 "        out.append(\"1\" if depth(v) <= %d else \"0\")\n"
                 "    except (ValueError, RecursionError):\n"
                 "        out.append(\"0\")\n"
                 "open(sys.argv[2], \"w\").write(\"\".join(out))\n"
                 "' %s %s",
                 JZ_MAX_DEPTH, path_in, path_out);
        CHECK(test_run_status(cmd) == 0);
        FILE *g = fopen(path_out, "rb");
        CHECK(g);
        char *py = malloc((size_t)n_strings + 1);
        size_t got = fread(py, 1, (size_t)n_strings + 1, g);
        fclose(g);
        CHECKF(got == (size_t)n_strings, "python judged %zu of %d strings", got, n_strings);
        const uint8_t *line = fix.d;
        for (int i = 0; i < n_strings; i++) {
            const uint8_t *e = (const uint8_t *)strchr((const char *)line, '\n');
            CHECKF(py[i] - '0' == verdict[i], "automaton %d, python json %c on the hex string %.*s", verdict[i], py[i],
                   (int)(e - line), line);
            line = e + 1;
        }
        free(py);
    } else {
        printf("note: python3 not found: the automaton is checked against the RFC validator only\n");
    }
    free(verdict);
    free(doc.d);
    free(mut.d);
    free(fix.d);
    free(comp.d);
    jz_schema_release(&sc);
    jz_schema_release(&paired);
}

/* Byte-level specifics the random documents might miss, each against the validator and a fixed answer. */
TEST(constrain_json_edge_cases) {
    static const struct {
        const char *s;
        int ok;
    } cases[] = {
        {"0", 1}, {"-0", 1}, {"01", 0}, {"-", 0}, {"1.", 0}, {"1.e5", 0}, {"1e", 0}, {"1e+", 0}, {"1E-07", 1},
        {"\"\\u12\"", 0}, {"\"\\uD800\"", 1}, {"\"\\x\"", 0}, {"\"\x1f\"", 0}, {"\"\x7f\"", 1},
        {"\"\xc0\x80\"", 0}, {"\"\xc2\x80\"", 1}, {"\"\xe0\x9f\xbf\"", 0}, {"\"\xed\xa0\x80\"", 0},
        {"\"\xf4\x90\x80\x80\"", 0}, {"\"\xf0\x90\x80\x80\"", 1}, {"\"\xf5\x80\x80\x80\"", 0}, {"\xef\xbb\xbf{}", 0},
        {"{\"a\":1,}", 0}, {"[1,]", 0}, {"{,}", 0}, {"[]", 1}, {" {} ", 1}, {"{} {}", 0}, {"tru", 0}, {"nulll", 0},
        {"NaN", 0}, {"Infinity", 0}, {"{\"a\" 1}", 0}, {"\"a\"\"b\"", 0}, {"{\"a\":{\"b\":[true,false,null]}}", 1},
    };
    jz_schema sc;
    CHECK_OK(jz_schema_init(&sc));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const uint8_t *s = (const uint8_t *)cases[i].s;
        size_t n = strlen(cases[i].s), stop;
        jz_state at;
        CHECKF(ref_json_valid(s, n, JZ_MAX_DEPTH) == cases[i].ok, "validator on case %zu", i);
        CHECKF(run_jz(&sc, JZ_ANY, s, n, &stop, &at) == cases[i].ok, "automaton on case %zu (%s)", i, cases[i].s);
    }
    /* surrogate escapes as a model may write them: pairs only */
    static const struct {
        const char *s;
        int rfc, paired;
    } sur[] = {
        {"\"\\uD83D\\uDE00\"", 1, 1}, {"\"\\ud83d\\ude00x\"", 1, 1}, {"\"\\uD83D\"", 1, 0},
        {"\"\\uDE00\"", 1, 0},        {"\"\\uD83Dx\"", 1, 0},         {"\"\\uD83D\\n\"", 1, 0},
        {"\"\\uD83D\\uD83D\"", 1, 0}, {"\"\\uD7FF\\uE000\"", 1, 1}, {"{\"\\uDBFF\\uDFFF\":1}", 1, 1},
    };
    jz_schema paired;
    CHECK_OK(jz_schema_init(&paired));
    paired.paired = 1;
    for (size_t i = 0; i < sizeof sur / sizeof sur[0]; i++) {
        const uint8_t *s = (const uint8_t *)sur[i].s;
        size_t n = strlen(sur[i].s), stop;
        jz_state at;
        CHECKF(run_jz(&sc, JZ_ANY, s, n, &stop, &at) == sur[i].rfc, "surrogate case %zu (%s)", i, sur[i].s);
        CHECKF(run_jz(&paired, JZ_ANY, s, n, &stop, &at) == sur[i].paired, "paired case %zu (%s)", i, sur[i].s);
    }
    jz_schema_release(&paired);
    jz_schema_release(&sc);
}

/* ---- schemas ---- */

static int is_int(double x) { return isfinite(x) && x == floor(x); }

static int type_ok(const cJSON *v, const char *t) {
    if (!strcmp(t, "null")) return cJSON_IsNull(v);
    if (!strcmp(t, "boolean")) return cJSON_IsBool(v);
    if (!strcmp(t, "integer")) return cJSON_IsNumber(v) && is_int(v->valuedouble);
    if (!strcmp(t, "number")) return cJSON_IsNumber(v);
    if (!strcmp(t, "string")) return cJSON_IsString(v);
    if (!strcmp(t, "array")) return cJSON_IsArray(v);
    if (!strcmp(t, "object")) return cJSON_IsObject(v);
    return 0;
}

/* The enforced keywords' meaning (JSON Schema 2020-12), over a parsed value: an independent check of what
 * the automaton admits. */
static int valid(const cJSON *v, const cJSON *s) {
    if (cJSON_IsTrue(s) || !s) return 1;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (t) {
        int any = 0;
        if (cJSON_IsString(t)) any = type_ok(v, t->valuestring);
        for (const cJSON *x = cJSON_IsArray(t) ? t->child : NULL; x; x = x->next) any |= type_ok(v, x->valuestring);
        if (!any) return 0;
    }
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum"), *c = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (c && !cJSON_Compare(v, c, 1)) return 0;
    if (e) {
        int any = 0;
        for (const cJSON *x = e->child; x; x = x->next) any |= cJSON_Compare(v, x, 1);
        if (!any) return 0;
    }
    if (cJSON_IsObject(v)) {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        for (const cJSON *m = v->child; m; m = m->next) {
            const cJSON *ps = props ? cJSON_GetObjectItemCaseSensitive(props, m->string) : NULL;
            if (ps ? !valid(m, ps) : cJSON_IsFalse(add) ? 1 : add && !cJSON_IsTrue(add) && !valid(m, add)) return 0;
        }
        for (const cJSON *q = cJSON_GetObjectItemCaseSensitive(s, "required"); q && q->child;) {
            for (const cJSON *x = q->child; x; x = x->next)
                if (!cJSON_GetObjectItemCaseSensitive(v, x->valuestring)) return 0;
            break;
        }
    }
    if (cJSON_IsArray(v)) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        for (const cJSON *x = v->child; x && items; x = x->next)
            if (!valid(x, items)) return 0;
    }
    return 1;
}

/* cJSON refuses \u escapes of lone surrogates, which RFC 8259 allows: the validator parses a copy with
 * each \uD800-\uDFFF escape made \u0041 (no enum value of the schemas below holds one). */
static cJSON *parse_for_schema(const uint8_t *s, size_t n) {
    char *c = malloc(n + 1);
    memcpy(c, s, n);
    c[n] = 0;
    for (size_t i = 0; i + 5 < n; i++)
        if (c[i] == '\\' && c[i + 1] == 'u' && (c[i + 2] == 'd' || c[i + 2] == 'D') && c[i + 3] &&
            strchr("89abcdefABCDEF", c[i + 3]))
            memcpy(c + i + 2, "0041", 4);
        else if (c[i] == '\\')
            i++; /* an escaped character: not the start of another escape */
    cJSON *v = cJSON_ParseWithLength(c, n);
    free(c);
    return v;
}

static const char *const schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":\"string\",\"enum\":"
    "[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"unit\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},\"b\":{\"type\":"
    "[\"boolean\",\"null\"]},\"c\":{\"type\":\"object\",\"properties\":{\"x\":{\"const\":3}},\"required\":[\"x\"]}},"
    "\"required\":[\"c\"]}",
    "{\"type\":\"object\"}",
    "{\"description\":\"prefix names, an empty name, typed extra keys\",\"properties\":{\"ab\":{\"type\":\"string\"},"
    "\"a\":{\"type\":\"integer\"},\"\":{\"type\":\"null\"},\"\xc3\xa9t\xc3\xa9\":{\"type\":\"boolean\"}},"
    "\"required\":[\"a\",\"ab\"],\"additionalProperties\":{\"type\":\"boolean\"}}",
    "{\"type\":\"object\",\"properties\":{\"n\":{\"enum\":[1,10,-2.5,\"x\",\"x\\\"y\",true,null]},\"m\":{\"type\":"
    "\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"string\"}},\"required\":[\"k\"],"
    "\"additionalProperties\":false}}}},\"required\":[\"n\"],\"additionalProperties\":false}",
};

static void gen_key(k3c_rng *r, bbuf *b) {
    bputc(b, '"');
    for (uint32_t k = 1 + rnd(r, 4); k; k--) bputc(b, (uint8_t)('a' + rnd(r, 26)));
    bputc(b, '"');
}

/* A value of schema s in the form the automaton can write: enum values compact, keys without escapes. */
static void gen_schema_value(k3c_rng *r, bbuf *b, const cJSON *s, int depth) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum"), *c = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (e || c) {
        const cJSON *x = c ? c : cJSON_GetArrayItem(e, (int)rnd(r, (uint32_t)cJSON_GetArraySize(e)));
        char *p = cJSON_PrintUnformatted(x);
        bputs(b, p);
        free(p);
        return;
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    const char *type = !t ? (cJSON_GetObjectItemCaseSensitive(s, "properties") ? "object" : depth > 2 ? "number" : "any")
                       : cJSON_IsString(t) ? t->valuestring
                                           : cJSON_GetArrayItem(t, (int)rnd(r, (uint32_t)cJSON_GetArraySize(t)))->valuestring;
    if (!strcmp(type, "any")) type = (const char *[]){"string", "number", "boolean", "null", "array", "object"}[rnd(r, 6)];
    if (!strcmp(type, "null")) bputs(b, "null");
    else if (!strcmp(type, "boolean")) bputs(b, rnd(r, 2) ? "true" : "false");
    else if (!strcmp(type, "integer")) {
        if (rnd(r, 2)) bputc(b, '-');
        bputc(b, (uint8_t)('1' + rnd(r, 9)));
    } else if (!strcmp(type, "number")) gen_number(r, b);
    else if (!strcmp(type, "string")) gen_string_s(r, b, 0);
    else if (!strcmp(type, "array")) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        bputc(b, '[');
        for (uint32_t k = depth < 3 ? rnd(r, 4) : 0, i = 0; i < k; i++) {
            if (i) bputc(b, ',');
            gen_schema_value(r, b, items, depth + 1);
        }
        bputc(b, ']');
    } else {
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
        const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
        const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
        int n = 0;
        bputc(b, '{');
        for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
            int required = 0;
            for (const cJSON *x = req ? req->child : NULL; x; x = x->next) required |= !strcmp(x->valuestring, p->string);
            if (!required && rnd(r, 2)) continue;
            if (n++) bputc(b, ',');
            if (rnd(r, 4) == 0) bputc(b, ' ');
            bputc(b, '"');
            bputs(b, p->string);
            bputs(b, rnd(r, 3) ? "\":" : "\": ");
            gen_schema_value(r, b, p, depth + 1);
        }
        for (uint32_t k = cJSON_IsFalse(add) || depth > 2 ? 0 : rnd(r, 3); k; k--) {
            bbuf key = {0};
            gen_key(r, &key);
            char name[16];
            snprintf(name, sizeof name, "%.*s", (int)key.n - 2, key.d + 1);
            if (!props || !cJSON_GetObjectItemCaseSensitive(props, name)) {
                if (n++) bputc(b, ',');
                bput(b, key.d, key.n);
                bputc(b, ':');
                gen_schema_value(r, b, add && !cJSON_IsTrue(add) ? add : NULL, depth + 1);
            }
            free(key.d);
        }
        bputc(b, '}');
    }
}

TEST(constrain_schema_admits_valid_and_only_valid) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    bbuf doc = {0}, mut = {0}, comp = {0};
    char msg[800], why[128];
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        cJSON *s = cJSON_Parse(schemas[k]);
        CHECK(s);
        jz_schema sc;
        int root;
        CHECK_OK(jz_schema_init(&sc));
        CHECK_OK(jz_compile(&sc, s, 1, "schema", &root));
        int admitted_mutants = 0;
        for (int d = 0; d < 300; d++) {
            doc.n = 0;
            gen_schema_value(&r, &doc, s, 0);
            size_t stop;
            jz_state at;
            show(doc.d, doc.n, msg, 400);
            cJSON *v = cJSON_ParseWithLength((const char *)doc.d, doc.n);
            CHECKF(v && valid(v, s), "schema %zu: the generator wrote \"%s\", which does not satisfy it", k, msg);
            cJSON_Delete(v);
            CHECKF(run_jz(&sc, root, doc.d, doc.n, &stop, &at), "schema %zu: \"%s\" refused at byte %zu", k, msg, stop);
            for (int m = 0; m < 4; m++) {
                mutate(&r, &doc, &mut);
                int got = run_jz(&sc, root, mut.d, mut.n, &stop, &at);
                show(mut.d, mut.n, msg, 400);
                if (got) {
                    admitted_mutants++;
                    CHECKF(ref_json_valid(mut.d, mut.n, JZ_MAX_DEPTH), "schema %zu admits invalid JSON \"%s\"", k, msg);
                    cJSON *w = parse_for_schema(mut.d, mut.n);
                    CHECKF(w && valid(w, s), "schema %zu admits \"%s\", which does not satisfy it", k, msg);
                    cJSON_Delete(w);
                }
                /* every admitted prefix completes into a value of the schema in jz_min_close bytes */
                comp.n = 0;
                bput(&comp, mut.d, stop);
                int u = jz_min_close(&at, &sc);
                size_t before = comp.n;
                CHECKF(complete(&sc, at, &comp, why, sizeof why), "schema %zu, prefix of \"%s\": %s", k, msg, why);
                CHECKF(comp.n - before == (size_t)u, "schema %zu: completion %zu bytes, jz_min_close %d", k,
                       comp.n - before, u);
                cJSON *w = parse_for_schema(comp.d, comp.n);
                show(comp.d, comp.n, msg, 400);
                CHECKF(ref_json_valid(comp.d, comp.n, JZ_MAX_DEPTH) && w && valid(w, s),
                       "schema %zu: the completion \"%s\" does not satisfy it", k, msg);
                cJSON_Delete(w);
            }
        }
        CHECKF(admitted_mutants > 0, "schema %zu: no near miss was admitted (the test lost its power)", k);
        jz_schema_release(&sc);
        cJSON_Delete(s);
    }
    free(doc.d);
    free(mut.d);
    free(comp.d);
}

TEST(constrain_schema_strict_refusals) {
    static const struct {
        const char *schema, *needle;
    } bad[] = {
        {"{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"string\",\"pattern\":\"a+\"}}}", "properties.x: 'pattern'"},
        {"{\"anyOf\":[{\"type\":\"object\"}]}", "'anyOf'"},
        {"{\"type\":\"string\"}", "root must be an object"},
        {"{\"type\":\"object\",\"required\":[\"z\"],\"additionalProperties\":false}", "'z'"},
        {"{\"type\":\"object\",\"properties\":{\"e\":{\"enum\":[]}}}", "nothing satisfies"},
        {"{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"strin\"}}}", "'strin'"},
        {"{\"type\":\"object\",\"properties\":{\"a\\\"b\":{}}}", "property name"},
        {"{\"type\":\"object\",\"properties\":{\"f\":false}}", "false"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *s = cJSON_Parse(bad[i].schema);
        jz_schema sc;
        int root;
        CHECK_OK(jz_schema_init(&sc));
        CHECKF(jz_compile(&sc, s, 1, "response_format.json_schema.schema", &root) != K3C_OK, "schema %zu compiled", i);
        CHECKF(strstr(k3c_error_message(), bad[i].needle) && strstr(k3c_error_message(), "response_format"),
               "schema %zu: message '%s' lacks '%s'", i, k3c_error_message(), bad[i].needle);
        CHECKF(k3c_error_kind_get() == K3C_ERROR_INPUT, "schema %zu: not an input error", i);
        k3c_error_clear();
        jz_schema_release(&sc);
        cJSON_Delete(s);
    }
    /* lenient (tool parameters): pattern is not enforced, the rest is */
    cJSON *s = cJSON_Parse(bad[0].schema);
    jz_schema sc;
    int root;
    size_t stop;
    jz_state at;
    CHECK_OK(jz_schema_init(&sc));
    CHECK_OK(jz_compile(&sc, s, 0, "tools[0].function.parameters", &root));
    CHECK(run_jz(&sc, root, (const uint8_t *)"{\"x\":\"b\"}", 9, &stop, &at));
    CHECK(!run_jz(&sc, root, (const uint8_t *)"{\"x\":1}", 7, &stop, &at));
    jz_schema_release(&sc);
    cJSON_Delete(s);
}

/* ---- the vocabulary mask and the choice ---- */

static k3c_tokenizer *preset_tokenizer(const char *name) {
    k3c_tokenizer *t = NULL;
    return k3c_tokenizer_load_preset(name, &t) == K3C_OK ? t : NULL;
}

/* A random walk through g: at each step the mask equals every token checked alone (remaining random, or no
 * budget), then a random admitted token is taken. */
static int walk_masks(k3c_grammar *g, int V, k3c_rng *r, int steps, char *why, size_t why_n) {
    k3c_gmatch *m;
    if (k3c_gmatch_create(g, &m) != K3C_OK) return snprintf(why, why_n, "%s", k3c_error_message()), 0;
    uint8_t *mask = malloc((size_t)V);
    int ok = 1, budget = g->min_tokens + (int)rnd(r, 40);
    for (int s = 0; s < steps && ok && !k3c_gmatch_done(m); s++) {
        int remaining = rnd(r, 3) ? budget - s : 0;
        int n = k3c_gmatch_mask(m, remaining, mask, V), cnt = 0;
        for (int t = 0; t < V && ok; t++) {
            int a = k3c_gmatch_admits(m, t, remaining);
            cnt += a;
            if (a != mask[t]) {
                snprintf(why, why_n, "step %d token %d: mask %d, alone %d (remaining %d)", s, t, mask[t], a, remaining);
                ok = 0;
            }
        }
        if (ok && cnt != n) snprintf(why, why_n, "step %d: mask count %d of %d", s, n, cnt), ok = 0;
        if (!ok) break;
        /* the walk keeps to the budget, so that it always leaves a token */
        n = k3c_gmatch_mask(m, budget - s, mask, V);
        if (n == 0) snprintf(why, why_n, "step %d: the budget %d left no token", s, budget - s), ok = 0;
        if (!ok) break;
        uint32_t pick = rnd(r, (uint32_t)n);
        for (int t = 0; t < V; t++)
            if (mask[t] && pick-- == 0) {
                if (k3c_gmatch_advance(m, t) != K3C_OK) snprintf(why, why_n, "advance %d refused", t), ok = 0;
                break;
            }
    }
    free(mask);
    k3c_gmatch_free(m);
    return ok;
}

TEST(constrain_mask_equals_each_token_alone) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    k3c_tokenizer *tok = preset_tokenizer("tiny");
    CHECK(tok);
    k3c_grammar_vocab *v;
    CHECK_OK(k3c_grammar_vocab_create(tok, &v));
    CHECK(v->all_bytes);
    int V = k3c_tokenizer_vocab(tok);
    int32_t end = k3c_tokenizer_special_id(tok, "<|end_of_msg|>");
    char why[256];
    for (size_t k = 0; k < sizeof schemas / sizeof schemas[0]; k++) {
        k3c_grammar *g;
        CHECK_OK(k3c_grammar_json_create(v, schemas[k], strlen(schemas[k]), 1, &end, 1, &g));
        for (int w = 0; w < 3; w++) CHECKF(walk_masks(g, V, &r, 60, why, sizeof why), "schema %zu: %s", k, why);
        k3c_grammar_free(g);
    }
    k3c_grammar_vocab_free(v);
    k3c_tokenizer_free(tok);
}

TEST(constrain_choice_is_the_best_admitted) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    k3c_tokenizer *tok = preset_tokenizer("tiny");
    CHECK(tok);
    k3c_grammar_vocab *v;
    CHECK_OK(k3c_grammar_vocab_create(tok, &v));
    int V = k3c_tokenizer_vocab(tok);
    int32_t end = k3c_tokenizer_special_id(tok, "<|end_of_msg|>");
    k3c_grammar *g;
    CHECK_OK(k3c_grammar_json_create(v, schemas[0], strlen(schemas[0]), 1, &end, 1, &g));
    k3c_constrained_scratch w;
    CHECK_OK(k3c_constrained_scratch_init(&w, V));
    float *row = malloc(sizeof *row * (size_t)V);
    uint8_t *mask = malloc((size_t)V);
    for (int run = 0; run < 8; run++) {
        k3c_sampling sp = {.temperature = run < 4 ? 0.f : 0.8f, .top_k = run == 5 ? 50 : 0, .top_p = run == 6 ? 0.9f : 1,
                           .seed = k3c_rng_next(&r)};
        k3c_sampler *smp;
        k3c_gmatch *m;
        CHECK_OK(k3c_sampler_create(&sp, V, &smp));
        CHECK_OK(k3c_gmatch_create(g, &m));
        int budget = g->min_tokens + (int)rnd(&r, 30);
        for (int s = 0; s < budget && !k3c_gmatch_done(m); s++) {
            for (int i = 0; i < V; i++) {
                double u1 = (k3c_rng_next(&r) >> 11) * (1.0 / 9007199254740992.0) + 1e-12;
                double u2 = (k3c_rng_next(&r) >> 11) * (1.0 / 9007199254740992.0);
                row[i] = (float)(3 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
            }
            if (run == 1) row[rnd(&r, (uint32_t)V)] = NAN;
            if (run == 2) /* ties everywhere */
                for (int i = 0; i < V; i++) row[i] = (float)(int)row[i];
            int remaining = budget - s;
            int n = k3c_gmatch_mask(m, remaining, mask, V);
            if (!n) n = k3c_gmatch_mask(m, 0, mask, V);
            CHECK(n > 0);
            int best = -1;
            for (int i = 0; i < V; i++) {
                if (!mask[i]) continue;
                if (best < 0) {
                    best = i;
                    continue;
                }
                float a = row[i], b = row[best];
                if (!isnan(a) && (isnan(b) || a > b)) best = i;
            }
            int32_t t;
            CHECK_OK(k3c_constrained_next(smp, m, row, remaining, &w, &t));
            CHECKF(mask[t], "run %d step %d: token %d is not admitted", run, s, t);
            if (sp.temperature <= 0) CHECKF(t == best, "run %d step %d: greedy %d, best admitted %d", run, s, t, best);
        }
        CHECKF(k3c_gmatch_done(m), "run %d: the grammar did not finish within its budget %d", run, budget);
        k3c_gmatch_free(m);
        k3c_sampler_free(smp);
    }
    free(row);
    free(mask);
    k3c_constrained_scratch_release(&w);
    k3c_grammar_free(g);
    k3c_grammar_vocab_free(v);
    k3c_tokenizer_free(tok);
}

/* The sampled choice's distribution, against the model's renormalized over the admitted tokens (and, with
 * top-k, the k best admitted ones): chi-square over fresh draws, plain temperature (a draw from the whole row
 * kept when admitted, the mask after a refusal) and top-k (the mask first). */
TEST(constrain_sampling_distribution) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    k3c_tokenizer *tok = preset_tokenizer("tiny");
    CHECK(tok);
    k3c_grammar_vocab *v;
    CHECK_OK(k3c_grammar_vocab_create(tok, &v));
    int V = k3c_tokenizer_vocab(tok);
    int32_t end = k3c_tokenizer_special_id(tok, "<|end_of_msg|>");
    k3c_grammar *g;
    CHECK_OK(k3c_grammar_json_create(v, NULL, 0, 1, &end, 1, &g));
    k3c_gmatch *m0;
    CHECK_OK(k3c_gmatch_create(g, &m0));
    uint8_t *mask = malloc((size_t)V);
    float *row = malloc(sizeof *row * (size_t)V);
    double *want = calloc((size_t)V, sizeof *want);
    long *got = calloc((size_t)V, sizeof *got);
    int n_adm = k3c_gmatch_mask(m0, 0, mask, V);
    CHECK(n_adm > 4 && n_adm < V / 2);
    /* the admitted tokens hold about a third of the mass: both paths of the plain draw run */
    for (int i = 0; i < V; i++) row[i] = (float)((k3c_rng_next(&r) >> 11) * (1.0 / 9007199254740992.0)) * 2;
    double zin = 0, zall = 0;
    for (int i = 0; i < V; i++) zall += exp(row[i]), zin += mask[i] ? exp(row[i]) : 0;
    float shift = (float)log(0.5 * (zall - zin) / zin);
    for (int i = 0; i < V; i++)
        if (mask[i]) row[i] += shift;
    k3c_constrained_scratch w;
    CHECK_OK(k3c_constrained_scratch_init(&w, V));
    for (int mode = 0; mode < 2; mode++) {
        int top_k = mode ? 5 : 0;
        memset(want, 0, sizeof *want * (size_t)V);
        memset(got, 0, sizeof *got * (size_t)V);
        /* the reference: softmax over the admitted (the top_k best of them), in double */
        double z = 0;
        for (int i = 0; i < V; i++) {
            if (!mask[i]) continue;
            int better = 0;
            for (int j = 0; j < V && top_k; j++) better += mask[j] && (row[j] > row[i] || (row[j] == row[i] && j < i));
            if (!top_k || better < top_k) z += want[i] = exp(row[i]);
        }
        for (int i = 0; i < V; i++) want[i] /= z;
        int N = 30000;
        for (int d = 0; d < N; d++) {
            k3c_sampling sp = {.temperature = 1, .top_k = top_k, .seed = k3c_rng_next(&r)};
            k3c_sampler *smp;
            k3c_gmatch *m;
            CHECK_OK(k3c_sampler_create(&sp, V, &smp));
            CHECK_OK(k3c_gmatch_create(g, &m));
            int32_t t;
            CHECK_OK(k3c_constrained_next(smp, m, row, 0, &w, &t));
            CHECKF(mask[t], "draw %d: refused token %d", d, t);
            got[t]++;
            k3c_gmatch_free(m);
            k3c_sampler_free(smp);
        }
        double chi = 0;
        int df = -1;
        for (int i = 0; i < V; i++)
            if (want[i] > 0) {
                double e = want[i] * N;
                chi += (got[i] - e) * (got[i] - e) / e;
                df++;
            } else {
                CHECKF(got[i] == 0, "mode %d: token %d drawn %ld times, probability 0", mode, i, got[i]);
            }
        /* the chi-square tail at p = 1e-6: df + 5 sqrt(2 df) + 25 bounds it for these df */
        CHECKF(chi < df + 5 * sqrt(2.0 * df) + 25, "mode %d: chi-square %.1f over %d degrees of freedom", mode, chi, df);
    }
    k3c_constrained_scratch_release(&w);
    free(mask);
    free(row);
    free(want);
    free(got);
    k3c_gmatch_free(m0);
    k3c_grammar_free(g);
    k3c_grammar_vocab_free(v);
    k3c_tokenizer_free(tok);
}

/* ---- chat grammars, end to end through the format's own output parser ---- */

#define WEATHER                                                                                                    \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather of a city\","       \
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"type\":"      \
    "\"string\",\"enum\":[\"celsius\",\"fahrenheit\"]},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\","  \
    "\"unit\"],\"additionalProperties\":false}}}"
#define TIME                                                                                                       \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\"" \
    ":{\"zone\":{\"type\":\"string\"},\"utc\":{\"type\":\"boolean\"}},\"required\":[\"zone\"]}}}"
#define NOOP "{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}"
#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\"," \
             "\"content\":\"\",\"tool_calls\":[{\"id\":\"functions.noop:0\",\"type\":\"function\",\"function\":" \
             "{\"name\":\"noop\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"functions.noop:0\"," \
             "\"content\":\"ok\"},{\"role\":\"user\",\"content\":\"and now?\"}]"

typedef struct chat_case {
    const char *name, *tmpl, *tokenizer, *request;
    const char *want;   /* the one function a call must name, "*" any of the tools, NULL: JSON content */
    const char *schema; /* the content's schema (JSON content), or NULL */
} chat_case;

static const chat_case chat_cases[] = {
    {"k3 named", "kimi-k3", "tiny", "{" MSGS ",\"tools\":[" WEATHER "," TIME "," NOOP "],\"tool_choice\":"
     "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},\"chat_template_kwargs\":{\"thinking\":false}}",
     "get_weather", NULL},
    {"k3 named, thinking", "kimi-k3", "tiny", "{" MSGS ",\"tools\":[" WEATHER "," TIME "],\"tool_choice\":{\"type\":"
     "\"function\",\"function\":{\"name\":\"get_time\"}}}", "get_time", NULL},
    {"k3 required", "kimi-k3", "tiny", "{" MSGS ",\"tools\":[" WEATHER "," TIME "," NOOP "],\"tool_choice\":"
     "\"required\",\"chat_template_kwargs\":{\"thinking\":false}}", "*", NULL},
    {"k3 required, one call", "kimi-k3", "tiny", "{" MSGS ",\"tools\":[" WEATHER "," TIME "],\"tool_choice\":"
     "\"required\",\"parallel_tool_calls\":false}", "*", NULL},
    {"k3 json_object", "kimi-k3", "tiny", "{" MSGS ",\"response_format\":{\"type\":\"json_object\"}}", NULL, NULL},
    {"k3 json_schema", "kimi-k3", "tiny", "{" MSGS ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
     "{\"name\":\"w\",\"schema\":{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"number\"},\"ok\":{\"type\":"
     "\"boolean\"}},\"required\":[\"t\",\"ok\"]}}},\"chat_template_kwargs\":{\"thinking\":false}}", NULL,
     "{\"type\":\"object\",\"properties\":{\"t\":{\"type\":\"number\"},\"ok\":{\"type\":\"boolean\"}},\"required\":"
     "[\"t\",\"ok\"]}"},
    {"kimi-linear named", "kimi-linear", "kimi-linear-tiny", "{" MSGS ",\"tools\":[" WEATHER "," TIME "],"
     "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", "get_weather", NULL},
    {"k2-thinking required", "kimi-k2-thinking", "kimi-linear-tiny", "{" MSGS ",\"tools\":[" WEATHER "," TIME "," NOOP
     "],\"tool_choice\":\"required\"}", "*", NULL},
    {"k2-thinking json_object", "kimi-k2-thinking", "kimi-linear-tiny", "{" MSGS ",\"response_format\":{\"type\":"
     "\"json_object\"}}", NULL, NULL},
};

/* The schema of tool `name` in the request. */
static const cJSON *tool_schema(const cJSON *req, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(req, "tools")) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, name)) {
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            return p ? p : fn; /* no parameters: any object (valid() reads no keyword of fn) */
        }
    }
    return NULL;
}

/* Checks the parsed message against the case; 0 with a message. */
static int check_message(const chat_case *c, const cJSON *req, const char *result, char *why, size_t n) {
    cJSON *m = cJSON_Parse(result);
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    int ok = 1;
    if (!c->want) {
        const char *text = cJSON_IsString(content) ? content->valuestring : "";
        cJSON *v = parse_for_schema((const uint8_t *)text, strlen(text));
        cJSON *schema = c->schema ? cJSON_Parse(c->schema) : NULL;
        if (calls || !cJSON_IsObject(v) || !ref_json_valid((const uint8_t *)text, strlen(text), JZ_MAX_DEPTH) ||
            (schema && !valid(v, schema)))
            snprintf(why, n, "content %s is not a JSON object of the schema", text), ok = 0;
        cJSON_Delete(v);
        cJSON_Delete(schema);
    } else if (!cJSON_IsArray(calls) || !cJSON_GetArraySize(calls) ||
               (strcmp(c->want, "*") && cJSON_GetArraySize(calls) != 1)) {
        snprintf(why, n, "no call, or several for a named function: %s", result), ok = 0;
    } else if (cJSON_IsString(content) && content->valuestring[0]) {
        snprintf(why, n, "content beside the calls: %s", result), ok = 0;
    }
    const cJSON *call, *list = c->want ? calls : NULL;
    cJSON_ArrayForEach(call, list) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        const char *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring;
        const cJSON *schema = tool_schema(req, name);
        cJSON *v = parse_for_schema((const uint8_t *)args, strlen(args));
        if (!ok) break;
        if (strcmp(c->want, "*") && strcmp(name, c->want)) snprintf(why, n, "a call of %s", name), ok = 0;
        else if (!schema) snprintf(why, n, "a call of %s, which is no tool", name), ok = 0;
        else if (!cJSON_IsObject(v) || (cJSON_IsObject(schema) && !valid(v, schema)))
            snprintf(why, n, "%s's arguments %s are not a JSON object of its schema", name, args), ok = 0;
        cJSON_Delete(v);
    }
    cJSON_Delete(m);
    return ok;
}

/* Random logits through the grammar until an end id or the budget; the ids into out. */
static int drive(const k3c_grammar *g, int V, k3c_rng *r, float temperature, int budget, const int32_t *ends,
                 int n_ends, int32_t *out, int *n_out, char *why, size_t n) {
    k3c_sampling sp = {.temperature = temperature, .seed = k3c_rng_next(r)};
    k3c_sampler *smp;
    k3c_gmatch *m;
    k3c_constrained_scratch w;
    if (k3c_sampler_create(&sp, V, &smp) || k3c_gmatch_create(g, &m) || k3c_constrained_scratch_init(&w, V))
        return snprintf(why, n, "%s", k3c_error_message()), 0;
    float *row = malloc(sizeof *row * (size_t)V);
    float scale = 1 + (float)rnd(r, 6);
    int ok = 1, cnt = 0, ended = 0;
    while (cnt < budget && !ended && ok) {
        for (int i = 0; i < V; i++) row[i] = scale * (float)((k3c_rng_next(r) >> 11) * (1.0 / 9007199254740992.0));
        int32_t t;
        if (k3c_constrained_next(smp, m, row, budget - cnt, &w, &t) != K3C_OK) {
            snprintf(why, n, "step %d: %s", cnt, k3c_error_message());
            ok = 0;
            break;
        }
        out[cnt++] = t;
        for (int i = 0; i < n_ends; i++) ended |= t == ends[i];
    }
    if (ok && !ended) snprintf(why, n, "no end id within the budget of %d (grammar minimum %d)", budget, g->min_tokens), ok = 0;
    *n_out = cnt;
    free(row);
    k3c_constrained_scratch_release(&w);
    k3c_gmatch_free(m);
    k3c_sampler_free(smp);
    return ok;
}

TEST(constrain_chat_calls_parse_as_the_tool) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    char why[1024];
    int32_t *ids = malloc(sizeof *ids * 4096);
    for (size_t k = 0; k < sizeof chat_cases / sizeof chat_cases[0]; k++) {
        const chat_case *c = &chat_cases[k];
        k3c_tokenizer *tok = preset_tokenizer(c->tokenizer);
        k3c_chat_template *t;
        k3c_grammar_vocab *v;
        k3c_grammar *g;
        CHECK(tok);
        CHECK_OK(k3c_chat_template_from_name(c->tmpl, &t));
        CHECK_OK(k3c_grammar_vocab_create(tok, &v));
        CHECKF(k3c_chat_grammar_create(t, tok, v, c->request, strlen(c->request), &g) == K3C_OK && g, "%s: %s", c->name,
               k3c_error_message());
        int V = k3c_tokenizer_vocab(tok);
        int32_t ends[8];
        int n_ends = k3c_chat_stop_ids(t, tok, ends, 8);
        cJSON *req = cJSON_Parse(c->request);
        /* the prompt renders (the grammar continues it) */
        k3c_tokens prompt = {0};
        CHECKF(k3c_chat_encode(t, tok, c->request, strlen(c->request), &prompt) == K3C_OK, "%s: %s", c->name,
               k3c_error_message());
        k3c_tokens_free(&prompt);
        int budgets[] = {g->min_tokens, g->min_tokens + 1, g->min_tokens + 7, g->min_tokens + 40, 600};
        for (int b = 0; b < 5; b++)
            for (int rep = 0; rep < 3; rep++) {
                int n = 0;
                float temp = rep == 0 ? 0.f : rep == 1 ? 1.f : 0.3f;
                CHECKF(drive(g, V, &r, temp, budgets[b], ends, n_ends, ids, &n, why, sizeof why), "%s, budget %d: %s",
                       c->name, budgets[b], why);
                k3c_chat_parser *p;
                CHECK_OK(k3c_chat_parser_create(t, tok, c->request, strlen(c->request), &p));
                for (int i = 0; i < n; i++) CHECK_OK(k3c_chat_parser_feed(p, ids[i], NULL, NULL));
                CHECK_OK(k3c_chat_parser_finish(p, NULL, NULL));
                char *result;
                CHECK_OK(k3c_chat_parser_result_json(p, &result));
                int ok = check_message(c, req, result, why, sizeof why);
                char *text = NULL;
                size_t len = 0;
                if (!ok) k3c_tokenizer_decode(tok, ids, (size_t)n, &text, &len);
                CHECKF(ok, "%s, budget %d, temperature %g: %s\n  output: %s", c->name, budgets[b], (double)temp, why,
                       text ? text : "");
                if (getenv("K3C_SHOW") && rep == 0) {
                    k3c_tokenizer_decode(tok, ids, (size_t)n, &text, &len);
                    printf("%s [%d tokens, budget %d]: %s\n  -> %s\n", c->name, n, budgets[b], text, result);
                    free(text);
                    text = NULL;
                }
                free(result);
                k3c_chat_parser_free(p);
            }
        cJSON_Delete(req);
        k3c_grammar_free(g);
        k3c_grammar_vocab_free(v);
        k3c_chat_template_free(t);
        k3c_tokenizer_free(tok);
    }
    free(ids);
}

TEST(constrain_chat_refusals_and_none) {
    k3c_tokenizer *tok = preset_tokenizer("tiny");
    k3c_chat_template *t;
    k3c_grammar_vocab *v;
    CHECK(tok);
    CHECK_OK(k3c_chat_template_from_name("kimi-k3", &t));
    CHECK_OK(k3c_grammar_vocab_create(tok, &v));
    static const struct {
        const char *request, *needle; /* needle NULL: no grammar, no error */
    } cases[] = {
        {"{" MSGS "}", NULL},
        {"{" MSGS ",\"tools\":[" WEATHER "],\"tool_choice\":\"auto\"}", NULL},
        {"{" MSGS ",\"tools\":[" WEATHER "],\"tool_choice\":\"none\"}", NULL},
        {"{" MSGS ",\"response_format\":{\"type\":\"text\"}}", NULL},
        {"{" MSGS ",\"tools\":[" WEATHER "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"x\"}}}",
         "'x'"},
        {"{" MSGS ",\"tools\":[" WEATHER "," WEATHER "],\"tool_choice\":\"required\"}", "twice"},
        {"{" MSGS ",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":"
         "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":3}}}}}}",
         "response_format.json_schema.schema.properties.s: 'minLength'"},
        {"{" MSGS ",\"response_format\":{\"type\":\"yaml\"}}", "yaml"},
        {"{" MSGS ",\"response_format\":{\"type\":\"json_object\"},\"add_generation_prompt\":false}",
         "add_generation_prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        k3c_grammar *g = (k3c_grammar *)1;
        int rc = k3c_chat_grammar_create(t, tok, v, cases[i].request, strlen(cases[i].request), &g);
        if (!cases[i].needle) {
            CHECKF(rc == K3C_OK && !g, "case %zu: %s", i, rc ? k3c_error_message() : "a grammar");
        } else {
            CHECKF(rc != K3C_OK && !g && strstr(k3c_error_message(), cases[i].needle) &&
                       k3c_error_kind_get() == K3C_ERROR_INPUT,
                   "case %zu: rc %d, message '%s' (wanted '%s')", i, rc, k3c_error_message(), cases[i].needle);
            k3c_error_clear();
        }
    }
    /* a tool schema with a keyword k3c cannot enforce still gives a grammar (lenient) */
    const char *lenient = "{" MSGS ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
                          "{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"pattern\":\"^a\"}}}}}],"
                          "\"tool_choice\":\"required\"}";
    k3c_grammar *g;
    CHECK_OK(k3c_chat_grammar_create(t, tok, v, lenient, strlen(lenient), &g));
    CHECK(g && k3c_grammar_min_tokens(g) > 20);
    k3c_grammar_free(g);
    k3c_grammar_vocab_free(v);
    k3c_chat_template_free(t);
    k3c_tokenizer_free(tok);
}

/* ---- the scheduler on the embedded trained model ---- */

#include "k3_fortune.h"

typedef struct cjob {
    const int32_t *prompt;
    int n_prompt, max_new;
    k3c_sched_sampling sp;
    const k3c_grammar *g;
    int32_t out[512];
    int n_out, finished;
    k3c_finish_reason why;
    int32_t stop;
} cjob;

/* Runs the jobs through one scheduler (spec drafts per verify) to the end. */
static int run_jobs(k3c_engine *e, int spec, cjob *jobs, int n, k3c_scheduler_stats *st) {
    k3c_scheduler_options o;
    k3c_scheduler_options_default(&o);
    o.spec_tokens = spec;
    o.max_batched_tokens = 256;
    k3c_scheduler *s;
    K3C_TRY(k3c_scheduler_create(e, &o, &s));
    int rc = K3C_OK;
    for (int i = 0; i < n && rc == K3C_OK; i++) {
        k3c_sched_request q = {.prompt = jobs[i].prompt, .n_prompt = jobs[i].n_prompt, .max_new = jobs[i].max_new,
                               .sampling = jobs[i].sp, .grammar = jobs[i].g, .user = &jobs[i],
                               .stop_ids = (const int32_t[]){3842, 3841}, .n_stop_ids = 2};
        uint64_t id;
        jobs[i].n_out = jobs[i].finished = 0;
        if (k3c_scheduler_submit(s, &q, &id) != 0) rc = k3c_errorf("submit: %s", k3c_error_message());
    }
    for (int busy = 1, steps = 0; busy && rc == K3C_OK && steps < 100000; steps++) {
        const k3c_sched_event *ev;
        int n_ev;
        rc = k3c_scheduler_step(s, &ev, &n_ev, &busy);
        for (int i = 0; i < n_ev && rc == K3C_OK; i++) {
            cjob *j = ev[i].user;
            if (ev[i].kind == K3C_SCHED_TOKEN) j->out[j->n_out++] = ev[i].token;
            else j->finished = 1, j->why = ev[i].finish, j->stop = ev[i].stop_token;
            if (ev[i].kind == K3C_SCHED_FINISHED && ev[i].finish == K3C_FINISH_ERROR)
                rc = k3c_errorf("a request failed: %s", ev[i].message);
        }
    }
    if (st) k3c_scheduler_stats_get(s, st);
    k3c_scheduler_free(s);
    return rc;
}

/* Named tool choice and json_object on the trained model (never trained on either): the call is there and
 * parses, the content is a JSON object, and a constrained request's tokens are the same alone and beside
 * other requests (constrained and not, greedy and sampled, with logprobs), and for greedy with speculation
 * (drafts checked against the constraint). */
TEST(sched_constrained_fortune_invariance) {
    char dir[4096];
    CHECK(fortune_path(dir, sizeof dir, "models/k3-fortune") == 0);
    k3c_model *m;
    k3c_engine *e;
    k3c_tokenizer *tok;
    k3c_chat_template *t;
    k3c_grammar_vocab *v;
    CHECK_OK(k3c_load(dir, &m));
    k3c_engine_options eo;
    k3c_engine_options_default(&eo);
    eo.threads = 2;
    eo.max_requests = 6;
    eo.max_context = 1024;
    CHECK_OK(k3c_engine_create(m, &eo, &e));
    CHECK_OK(k3c_tokenizer_load(dir, &tok));
    CHECK_OK(k3c_chat_template_load(dir, "Kimi K3", &t));
    CHECK_OK(k3c_grammar_vocab_create(tok, &v));
    const char *req = "{\"messages\":[{\"role\":\"user\",\"content\":\"What is the weather in Paris?\"}],\"tools\":["
                      WEATHER "," TIME "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_weather\"}},\"chat_template_kwargs\":{\"thinking\":false}}";
    const char *req2 = "{\"messages\":[{\"role\":\"user\",\"content\":\"A fortune, as JSON\"}],\"response_format\":"
                       "{\"type\":\"json_object\"}}";
    k3c_tokens p1 = {0}, p2 = {0};
    CHECK_OK(k3c_chat_encode(t, tok, req, strlen(req), &p1));
    CHECK_OK(k3c_chat_encode(t, tok, req2, strlen(req2), &p2));
    k3c_grammar *g1, *g2;
    CHECK_OK(k3c_chat_grammar_create(t, tok, v, req, strlen(req), &g1));
    CHECK_OK(k3c_chat_grammar_create(t, tok, v, req2, strlen(req2), &g2));
    k3c_rng r;
    k3c_rng_seed(&r, test_seed());
    int32_t other[5][64];
    cjob alone[2] = {
        {.prompt = p1.ids, .n_prompt = (int)p1.n, .max_new = 220, .g = g1},
        {.prompt = p2.ids, .n_prompt = (int)p2.n, .max_new = 120, .g = g2,
         .sp = {.base = {.temperature = 0.8f, .top_p = 0.95f, .seed = k3c_rng_next(&r)}}},
    };
    CHECK_OK(run_jobs(e, 0, &alone[0], 1, NULL));
    CHECK_OK(run_jobs(e, 0, &alone[1], 1, NULL));
    /* what the parser makes of them */
    for (int k = 0; k < 2; k++) {
        CHECKF(alone[k].why == K3C_FINISH_STOP, "job %d ended %d", k, alone[k].why);
        k3c_chat_parser *p;
        const char *rq = k ? req2 : req;
        CHECK_OK(k3c_chat_parser_create(t, tok, rq, strlen(rq), &p));
        for (int i = 0; i < alone[k].n_out; i++) CHECK_OK(k3c_chat_parser_feed(p, alone[k].out[i], NULL, NULL));
        CHECK_OK(k3c_chat_parser_feed(p, alone[k].stop, NULL, NULL));
        char *json;
        CHECK_OK(k3c_chat_parser_result_json(p, &json));
        cJSON *rq_j = cJSON_Parse(rq);
        char why[512];
        chat_case c = {"fortune", "kimi-k3", "", rq, k ? NULL : "get_weather", NULL};
        int ok = check_message(&c, rq_j, json, why, sizeof why);
        CHECKF(ok, "job %d: %s", k, why);
        cJSON_Delete(rq_j);
        free(json);
        k3c_chat_parser_free(p);
    }
    /* alone with speculation: drafts of its own history accepted under the constraint, the same stream */
    cjob solo = alone[0];
    k3c_scheduler_stats st;
    CHECK_OK(run_jobs(e, 3, &solo, 1, &st));
    CHECKF(st.spec_accepted_tokens > 0, "%ld drafts verified, none accepted", st.spec_draft_tokens);
    CHECKF(solo.n_out == alone[0].n_out && !memcmp(solo.out, alone[0].out, sizeof(int32_t) * (size_t)solo.n_out),
           "speculation changed the constrained greedy stream");
    /* beside others, and with speculation */
    for (int spec = 0; spec <= 3; spec += 3) {
        cjob batch[7];
        batch[0] = alone[0];
        batch[1] = alone[1];
        for (int i = 0; i < 5; i++) {
            int n = 5 + (int)rnd(&r, 50);
            for (int k = 0; k < n; k++) other[i][k] = (int32_t)rnd(&r, 3800);
            batch[2 + i] = (cjob){.prompt = other[i], .n_prompt = n, .max_new = 20 + (int)rnd(&r, 40),
                                  .g = i == 0 ? g1 : i == 1 ? g2 : NULL,
                                  .sp = {.base = {.temperature = i % 2 ? 1.f : 0.f, .seed = k3c_rng_next(&r)},
                                         .logprobs = i == 4 ? 3 : 0}};
        }
        CHECK_OK(run_jobs(e, spec, batch, 7, &st));
        CHECKF(!spec || st.spec_accepted_tokens > 0, "spec %d: %ld drafts verified, none accepted", spec,
               st.spec_draft_tokens);
        /* a sampled request under speculation draws for its acceptance tests (its distribution, not its
         * stream, is the same): compared without speculation only */
        for (int k = 0; k < (spec ? 1 : 2); k++) {
            CHECKF(batch[k].n_out == alone[k].n_out && !memcmp(batch[k].out, alone[k].out, sizeof(int32_t) * (size_t)alone[k].n_out),
                   "job %d, spec %d: %d tokens, alone %d: the constrained stream depends on its neighbours", k, spec,
                   batch[k].n_out, alone[k].n_out);
        }
    }
    k3c_tokens_free(&p1);
    k3c_tokens_free(&p2);
    k3c_grammar_free(g1);
    k3c_grammar_free(g2);
    k3c_grammar_vocab_free(v);
    k3c_chat_template_free(t);
    k3c_tokenizer_free(tok);
    k3c_engine_free(e);
    k3c_free(m);
}
