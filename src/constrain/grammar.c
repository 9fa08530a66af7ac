/* The grammar and its matcher (constrain/grammar.h). */
#define _GNU_SOURCE /* qsort_r: the comparison reads the grammar's symbols without a global */
#include "constrain/grammar.h"

#include <stdlib.h>
#include <string.h>

#include "constrain/schema.h"
#include "util/error.h"

static int oom(const char *what) { return k3c_errorf_kind(K3C_ERROR_OOM, "grammar: out of memory (%s)", what); }

static int grow(void **arr, int *cap, int need, size_t elem) {
    if (need <= *cap) return 1;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p) return 0;
    *arr = p;
    *cap = c;
    return 1;
}

/* ---- symbol strings ---- */

static void syms_push(k3c_syms *s, int32_t x) {
    if (s->failed) return;
    if (!grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) {
        s->failed = 1;
        return;
    }
    s->v[s->n++] = x;
}

void k3c_syms_bytes(k3c_syms *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) syms_push(s, (uint8_t)bytes[i]);
}
void k3c_syms_text(k3c_syms *s, const char *text) { k3c_syms_bytes(s, text, strlen(text)); }
void k3c_syms_raw(k3c_syms *s, const int32_t *syms, int n) {
    for (int i = 0; i < n; i++) syms_push(s, syms[i]);
}
void k3c_syms_special(k3c_syms *s, int32_t id) {
    if (id < 0) s->failed = 1; /* a marker the tokenizer lacks: the builder checks before */
    else syms_push(s, K3C_SYM_SPECIAL + id);
}
void k3c_syms_free(k3c_syms *s) {
    free(s->v);
    memset(s, 0, sizeof *s);
}

/* ---- building ---- */

void k3c_grammar_free(k3c_grammar *g) {
    if (!g) return;
    jz_schema_release(&g->sc);
    free(g->el);
    free(g->alts);
    free(g->syms);
    free(g->specials);
    free(g);
}

int k3c_grammar_begin(const k3c_grammar_vocab *v, int max_ws, k3c_grammar **out) {
    *out = NULL;
    if (!v) return k3c_errorf("grammar: the vocabulary is NULL");
    k3c_grammar *g = calloc(1, sizeof *g);
    if (!g) return oom("grammar");
    g->v = v;
    g->start = -1;
    if (jz_schema_init(&g->sc) != K3C_OK) {
        free(g);
        return K3C_ERR;
    }
    g->sc.max_ws = max_ws;
    g->sc.top_ws = 0; /* the next element follows the value's last byte */
    g->sc.paired = 1;
    *out = g;
    return K3C_OK;
}

static int rest(const k3c_grammar *g, int32_t el) { return el < 0 ? 0 : g->el[el].min_rest; }

static int add_el(k3c_grammar *g, const g_elem *e) {
    if (!grow((void **)&g->el, &g->cap_el, g->n_el + 1, sizeof *g->el)) return oom("elements"), -1;
    g->el[g->n_el] = *e;
    return g->n_el++;
}

static int check_next(const k3c_grammar *g, int32_t next, const char *what) {
    if (next >= g->n_el || next < -1)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: %s names element %d, of %d so far", what, next, g->n_el);
    return K3C_OK;
}

int k3c_grammar_add_end(k3c_grammar *g, const int32_t *ids, int n) {
    if (n <= 0 || n > K3C_GRAMMAR_MAX_ENDS)
        return k3c_errorf("grammar: %d end ids (1 .. %d)", n, K3C_GRAMMAR_MAX_ENDS), -1;
    memcpy(g->ends, ids, sizeof *ids * (size_t)n);
    g->n_ends = n;
    g_elem e = {.kind = GE_END, .fallback = -1, .next = -1, .term = -1, .min_rest = 1};
    return add_el(g, &e);
}

int k3c_grammar_add_alt(k3c_grammar *g, int fallback) {
    if (check_next(g, fallback, "an ALT's fallback")) return -1;
    g_elem e = {.kind = GE_ALT, .alts = g->n_alts, .fallback = fallback, .next = -1, .term = -1,
                .min_rest = fallback >= 0 ? rest(g, fallback) : 1 << 29};
    return add_el(g, &e);
}

int k3c_grammar_alt_string(k3c_grammar *g, int el, const int32_t *syms, int n, int next) {
    if (el < 0 || el >= g->n_el || g->el[el].kind != GE_ALT || g->el[el].alts + g->el[el].n_alts != g->n_alts)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: a string for element %d, which is not the last ALT", el);
    if (n <= 0) return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: an empty ALT string");
    K3C_TRY(check_next(g, next, "an ALT string"));
    if (!grow((void **)&g->syms, &g->cap_syms, g->n_syms + n, sizeof *g->syms) ||
        !grow((void **)&g->alts, &g->cap_alts, g->n_alts + 1, sizeof *g->alts))
        return oom("strings");
    memcpy(g->syms + g->n_syms, syms, sizeof *syms * (size_t)n);
    g->alts[g->n_alts++] = (g_alt){g->n_syms, n, next};
    g->n_syms += n;
    g_elem *e = &g->el[el];
    e->n_alts++;
    if (n + rest(g, next) < e->min_rest) e->min_rest = n + rest(g, next);
    return K3C_OK;
}

int k3c_grammar_schema(k3c_grammar *g, const cJSON *schema, int strict, const char *what) {
    int root;
    if (jz_compile(&g->sc, schema, strict, what, &root) != K3C_OK) return -1;
    return root;
}

int k3c_grammar_add_json_root(k3c_grammar *g, int root, int next) {
    if (check_next(g, next, "a JSON element")) return -1;
    if (root < 0 || root >= g->sc.n_nodes) return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: JSON root %d", root), -1;
    g_elem e = {.kind = GE_JSON, .fallback = -1, .root = root, .next = next, .term = -1,
                .min_rest = g->sc.nodes[root].min_len + rest(g, next)};
    return add_el(g, &e);
}

int k3c_grammar_add_free(k3c_grammar *g, int term) {
    int ok = term >= 0 && term < g->n_el && g->el[term].kind == GE_ALT && g->el[term].n_alts > 0 &&
             g->el[term].fallback < 0;
    for (int i = 0; ok && i < g->el[term].n_alts; i++) {
        int32_t first = g->syms[g->alts[g->el[term].alts + i].off];
        ok = first >= K3C_SYM_SPECIAL && first == g->syms[g->alts[g->el[term].alts].off];
    }
    if (!ok)
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: a FREE terminator must be an ALT whose strings all "
                                                   "open with one special token"), -1;
    g_elem e = {.kind = GE_FREE, .fallback = -1, .next = -1, .term = term, .min_rest = rest(g, term)};
    return add_el(g, &e);
}

static int cmp_syms(const k3c_grammar *g, const g_alt *a, const g_alt *b) {
    int n = a->len < b->len ? a->len : b->len;
    for (int i = 0; i < n; i++) {
        int32_t x = g->syms[a->off + i], y = g->syms[b->off + i];
        if (x != y) return x < y ? -1 : 1;
    }
    return (a->len > b->len) - (a->len < b->len);
}

static int cmp_alt(const void *x, const void *y, void *g) { return cmp_syms(g, x, y); }

int k3c_grammar_finish(k3c_grammar *g, int start) {
    if (start < 0 || start >= g->n_el) return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: start %d", start);
    for (int i = 0; i < g->n_el; i++) {
        g_elem *e = &g->el[i];
        if (e->kind != GE_ALT) continue;
        if (!e->n_alts && e->fallback < 0)
            return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: ALT element %d has no string", i);
        if (!e->n_alts) continue;
        g_alt *a = g->alts + e->alts;
        qsort_r(a, (size_t)e->n_alts, sizeof *a, cmp_alt, g);
        for (int j = 1; j < e->n_alts; j++) {
            const g_alt *p = &a[j - 1], *q = &a[j];
            int k = 0;
            while (k < p->len && g->syms[p->off + k] == g->syms[q->off + k]) k++;
            if (k == p->len) return k3c_errorf("grammar: two of the choices at one place are the same or one starts "
                                               "the other (duplicate tool names?)");
        }
    }
    /* the special tokens the strings hold (a vocabulary may have far more, reserved ones) */
    g->specials = malloc(sizeof *g->specials * (size_t)(g->n_syms ? g->n_syms : 1));
    if (!g->specials) return oom("specials");
    for (int i = 0; i < g->n_syms; i++) {
        int32_t id = g->syms[i] - K3C_SYM_SPECIAL, seen = 0;
        for (int j = 0; j < g->n_specials && !seen; j++) seen = g->specials[j] == id;
        if (id >= 0 && !seen) g->specials[g->n_specials++] = id;
    }
    g->start = start;
    g->min_tokens = g->el[start].min_rest;
    return K3C_OK;
}

/* ---- matching ---- */

static size_t state_size(const k3c_grammar *g, const g_state *st) {
    return st->el >= 0 && g->el[st->el].kind == GE_JSON ? offsetof(g_state, js) + jz_state_size(&st->js)
                                                         : offsetof(g_state, js);
}

static void enter(const k3c_grammar *g, g_state *st, int32_t el) {
    st->el = el;
    if (el < 0) return;
    const g_elem *e = &g->el[el];
    st->pos = 0;
    st->lo = (uint32_t)e->alts;
    st->hi = (uint32_t)(e->alts + e->n_alts);
    if (e->kind == GE_JSON) jz_init(&st->js, e->root);
}

static int step(const k3c_grammar *g, g_state *st, int32_t sym) {
    for (;;) {
        if (st->el < 0) return 1;
        const g_elem *e = &g->el[st->el];
        switch (e->kind) {
        case GE_ALT: {
            /* the strings in range share their first pos symbols and are longer (prefix-free), sorted: those
             * with sym at pos are a run, found by binary search (a request may name thousands of tools) */
            uint32_t lo = st->lo, hi = st->hi, pos = st->pos, a = lo, b = hi;
            while (a < b) {
                uint32_t mid = a + (b - a) / 2;
                if (g->syms[g->alts[mid].off + pos] < sym) a = mid + 1;
                else b = mid;
            }
            lo = a;
            b = hi;
            while (a < b) {
                uint32_t mid = a + (b - a) / 2;
                if (g->syms[g->alts[mid].off + pos] <= sym) a = mid + 1;
                else b = mid;
            }
            uint32_t h = a;
            if (lo == h) {
                if (pos == 0 && e->fallback >= 0) {
                    enter(g, st, e->fallback);
                    continue;
                }
                return 0;
            }
            st->lo = lo;
            st->hi = h;
            st->pos = pos + 1;
            /* prefix-free strings: a complete one is alone in its range */
            if ((uint32_t)g->alts[lo].len == st->pos) enter(g, st, g->alts[lo].next);
            return 1;
        }
        case GE_JSON:
            if (sym >= K3C_SYM_SPECIAL || !jz_step(&st->js, &g->sc, (uint8_t)sym)) return 0;
            if (jz_done(&st->js)) enter(g, st, e->next);
            return 1;
        case GE_FREE:
            if (sym < K3C_SYM_SPECIAL) return 1;
            if (sym != g->syms[g->alts[g->el[e->term].alts].off]) return 0;
            enter(g, st, e->term);
            continue;
        default: /* GE_END: whole tokens only (token_step) */
            return 0;
        }
    }
}

static int is_end(const k3c_grammar *g, int32_t tok) {
    for (int i = 0; i < g->n_ends; i++)
        if (g->ends[i] == tok) return 1;
    return 0;
}

static int token_step(const k3c_grammar *g, g_state *st, int32_t tok) {
    const k3c_grammar_vocab *v = g->v;
    if (st->el < 0) return 1;
    if (g->el[st->el].kind == GE_END) {
        if (!is_end(g, tok)) return 0;
        st->el = -1;
        return 1;
    }
    if (tok < 0 || tok >= v->n) return 0;
    if (v->kind[tok] == VOC_SPECIAL) return step(g, st, K3C_SYM_SPECIAL + tok);
    if (v->kind[tok] != VOC_TEXT) return 0;
    const uint8_t *b = v->bytes + v->off[tok];
    for (uint32_t i = 0; i < v->len[tok]; i++) {
        if (st->el < 0) return 1;
        if (!step(g, st, b[i])) return 0;
    }
    return 1;
}

static int min_symbols(const k3c_grammar *g, const g_state *st) {
    if (st->el < 0) return 0;
    const g_elem *e = &g->el[st->el];
    switch (e->kind) {
    case GE_ALT: {
        int best = st->pos == 0 && e->fallback >= 0 ? rest(g, e->fallback) : 1 << 29;
        for (uint32_t i = st->lo; i < st->hi; i++) {
            int c = g->alts[i].len - (int)st->pos + rest(g, g->alts[i].next);
            if (c < best) best = c;
        }
        return best;
    }
    case GE_JSON: return jz_min_close(&st->js, &g->sc) + rest(g, e->next);
    case GE_FREE: return rest(g, e->term);
    default: return 1;
    }
}

int k3c_gmatch_create(const k3c_grammar *g, k3c_gmatch **out) {
    *out = NULL;
    if (!g || g->start < 0) return k3c_errorf("grammar matcher: %s", g ? "the grammar is not finished" : "the grammar is NULL");
    k3c_gmatch *m = calloc(1, sizeof *m);
    if (!m) return oom("matcher");
    m->g = g;
    m->stack = malloc(sizeof *m->stack * (size_t)(g->v->max_len + 1));
    if (!m->stack) {
        free(m);
        return oom("matcher");
    }
    enter(g, &m->st, g->start);
    *out = m;
    return K3C_OK;
}

void k3c_gmatch_free(k3c_gmatch *m) {
    if (!m) return;
    free(m->stack);
    free(m);
}

int k3c_gmatch_done(const k3c_gmatch *m) { return m->st.el < 0; }
int k3c_gmatch_min_symbols(const k3c_gmatch *m) { return min_symbols(m->g, &m->st); }

static void copy_state(const k3c_grammar *g, g_state *dst, const g_state *src) {
    memcpy(dst, src, state_size(g, src));
}

int k3c_gmatch_admits(k3c_gmatch *m, int32_t tok, int remaining) {
    copy_state(m->g, &m->tmp, &m->st);
    if (!token_step(m->g, &m->tmp, tok)) return 0;
    return remaining <= 0 || min_symbols(m->g, &m->tmp) <= remaining - 1;
}

int k3c_gmatch_advance(k3c_gmatch *m, int32_t tok) {
    copy_state(m->g, &m->tmp, &m->st);
    if (!token_step(m->g, &m->tmp, tok))
        return k3c_errorf_kind(K3C_ERROR_INTERNAL, "grammar: token %d does not continue the constrained output", tok);
    copy_state(m->g, &m->st, &m->tmp);
    return K3C_OK;
}

/* The text tokens, in bytewise order: each one's bytes stepped from the state its shared prefix with the
 * token before reached (stack[d]: after d bytes), and every token skipped that starts with a prefix the
 * grammar refused (the sorted order puts them right after the refused one). */
static int mask_text(k3c_gmatch *m, int remaining, uint8_t *mask, int V) {
    const k3c_grammar *g = m->g;
    const k3c_grammar_vocab *v = g->v;
    g_state *stk = m->stack;
    copy_state(g, &stk[0], &m->st);
    int count = 0;
    uint32_t valid = 0; /* stack[0 .. valid] hold the last walked token's prefixes */
    int64_t fail = -1;  /* that token's byte the grammar refused, -1: none */
    for (int i = 0; i < v->n_sorted; i++) {
        int32_t t = v->sorted[i];
        uint32_t l = v->lcp[i], len = v->len[t];
        if (fail >= 0 && l > (uint32_t)fail) continue;
        uint32_t d = l < valid ? l : valid;
        const uint8_t *b = v->bytes + v->off[t];
        fail = -1;
        for (; d < len; d++) {
            g_state *s = &stk[d + 1];
            copy_state(g, s, &stk[d]);
            if (s->el >= 0 && !step(g, s, b[d])) {
                fail = d;
                break;
            }
        }
        valid = d;
        if (fail >= 0) continue;
        if ((remaining <= 0 || min_symbols(g, &stk[len]) <= remaining - 1) && t < V) {
            mask[t] = 1;
            count++;
        }
    }
    return count;
}

int k3c_gmatch_mask(k3c_gmatch *m, int remaining, uint8_t *mask, int V) {
    const k3c_grammar *g = m->g;
    const k3c_grammar_vocab *v = g->v;
    memset(mask, 0, (size_t)V);
    int n = v->n < V ? v->n : V, count = 0;
    if (m->st.el < 0) {
        for (int i = 0; i < n; i++) count += mask[i] = v->kind[i] != VOC_NONE;
        return count;
    }
    const g_elem *e = &g->el[m->st.el];
    if (e->kind == GE_END) {
        for (int i = 0; i < g->n_ends; i++)
            if (g->ends[i] >= 0 && g->ends[i] < V && !mask[g->ends[i]]) count += mask[g->ends[i]] = 1;
        return count;
    }
    for (int i = 0; i < g->n_specials; i++)
        if (g->specials[i] < V && k3c_gmatch_admits(m, g->specials[i], remaining)) count += mask[g->specials[i]] = 1;
    if (e->kind == GE_FREE) {
        /* text keeps the state as it is: all of it or none, by the budget */
        if (remaining > 0 && min_symbols(g, &m->st) > remaining - 1) return count;
        for (int i = 0; i < v->n_sorted; i++)
            if (v->sorted[i] < V) count += mask[v->sorted[i]] = 1;
        return count;
    }
    return count + mask_text(m, remaining, mask, V);
}

/* ---- the public JSON grammar (include/k3c.h) ---- */

int k3c_grammar_min_tokens(const k3c_grammar *g) { return g ? g->min_tokens : 0; }

int k3c_grammar_json_create(const k3c_grammar_vocab *v, const char *schema_json, size_t len, int strict,
                            const int32_t *end_ids, int n_end, k3c_grammar **out) {
    if (!out) return k3c_errorf("JSON grammar: out is NULL");
    *out = NULL;
    cJSON *schema = NULL;
    if (schema_json) {
        schema = cJSON_ParseWithLength(schema_json, len);
        if (!schema) return k3c_errorf("JSON grammar: the schema is not valid JSON");
    }
    k3c_grammar *g;
    int rc = k3c_grammar_begin(v, K3C_GRAMMAR_MAX_WS, &g);
    if (rc == K3C_OK) {
        int end = k3c_grammar_add_end(g, end_ids, n_end);
        int root = end >= 0 ? k3c_grammar_schema(g, schema, strict, "schema") : -1;
        int json = root >= 0 ? k3c_grammar_add_json_root(g, root, end) : -1;
        rc = json >= 0 ? k3c_grammar_finish(g, json) : K3C_ERR;
        if (rc != K3C_OK) k3c_grammar_free(g);
        else *out = g;
    }
    cJSON_Delete(schema);
    return rc;
}
