/* PCRE2 with JIT where the library has it (Debian's does), the interpreter otherwise. The JIT runs on a
 * 32 KiB stack by default; a pattern with a repeated lookahead group can need more on a long piece (up to
 * 25 000 characters after Kimi's chunking), so a search that hits the limit retries once on a JIT stack of
 * its own, grown as needed, instead of failing. */
#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/error.h"

struct k3c_regex {
    pcre2_code *code;
    int jit; /* 1 when pcre2_jit_compile succeeded */
    int utf;
    char what[64];
};

struct k3c_regex_state {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *stack; /* NULL until a search outgrows the default stack */
    size_t stack_max;
};

int k3c_regex_compile(const char *pattern, size_t len, int utf, const char *what, k3c_regex **out) {
    *out = NULL;
    k3c_regex *re = calloc(1, sizeof *re);
    if (!re) return k3c_errorf("out of memory compiling %s", what);
    snprintf(re->what, sizeof re->what, "%s", what);
    int err;
    PCRE2_SIZE at;
    re->code = pcre2_compile((PCRE2_SPTR)pattern, len, utf ? PCRE2_UTF | PCRE2_UCP : 0, &err, &at, NULL);
    if (!re->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        free(re);
        return k3c_errorf("%s: PCRE2 cannot compile the pattern (at offset %zu): %s", what, (size_t)at, (char *)msg);
    }
    re->jit = pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE) == 0;
    re->utf = utf;
    *out = re;
    return K3C_OK;
}

void k3c_regex_free(k3c_regex *re) {
    if (!re) return;
    pcre2_code_free(re->code);
    free(re);
}

int k3c_regex_state_create(const k3c_regex *re, k3c_regex_state **out) {
    *out = NULL;
    k3c_regex_state *st = calloc(1, sizeof *st);
    if (!st) return k3c_errorf("out of memory for a %s search", re->what);
    st->md = pcre2_match_data_create_from_pattern(re->code, NULL);
    st->mc = pcre2_match_context_create(NULL);
    if (!st->md || !st->mc) {
        k3c_regex_state_free(st);
        return k3c_errorf("out of memory for a %s search", re->what);
    }
    /* the interpreter (no JIT) keeps its backtracking frames on the heap, 20 MB by default: a piece of
     * 25 000 letters may need more */
    pcre2_set_heap_limit(st->mc, 4u << 20); /* KiB: 4 GiB */
    *out = st;
    return K3C_OK;
}

void k3c_regex_state_free(k3c_regex_state *st) {
    if (!st) return;
    pcre2_match_data_free(st->md);
    pcre2_match_context_free(st->mc);
    pcre2_jit_stack_free(st->stack);
    free(st);
}

/* A larger JIT stack for this state: 1 MiB, then x8 per retry, at most 512 MiB. */
static int grow_stack(k3c_regex_state *st) {
    size_t want = st->stack_max ? st->stack_max * 8 : (size_t)1 << 20;
    if (want > (size_t)512 << 20) return 0;
    pcre2_jit_stack *s = pcre2_jit_stack_create(32 * 1024, want, NULL);
    if (!s) return 0;
    pcre2_jit_stack_free(st->stack);
    st->stack = s;
    st->stack_max = want;
    pcre2_jit_stack_assign(st->mc, NULL, st->stack);
    return 1;
}

int k3c_regex_find(const k3c_regex *re, k3c_regex_state *st, const char *subject, size_t len, size_t from,
                   size_t *start, size_t *end) {
    for (;;) {
        int rc = re->jit ? pcre2_jit_match(re->code, (PCRE2_SPTR)subject, len, from, 0, st->md, st->mc)
                         : pcre2_match(re->code, (PCRE2_SPTR)subject, len, from, re->utf ? PCRE2_NO_UTF_CHECK : 0,
                                       st->md, st->mc);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT && grow_stack(st)) continue;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return k3c_errorf("%s: PCRE2 match failed at byte %zu of %zu: %s", re->what, from, len, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        *start = ov[0];
        *end = ov[1];
        return 1;
    }
}
