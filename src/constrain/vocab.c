/* The vocabulary as the matcher reads it, built once per tokenizer: every token's bytes, which tokens are
 * special (one symbol each), and the text tokens in bytewise order with the prefix each shares with the one
 * before it, so that a walk over the whole vocabulary steps each shared prefix once and skips every token
 * under a prefix the grammar refused (constrain/grammar.c, k3c_gmatch_mask). */
#define _GNU_SOURCE /* qsort_r: the comparison reads the vocabulary without a global (builds may run on several threads) */
#include <stdlib.h>
#include <string.h>

#include "constrain/grammar.h"
#include "util/error.h"

static int cmp_tok(const void *x, const void *y, void *ctx) {
    const k3c_grammar_vocab *v = ctx;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    uint32_t la = v->len[a], lb = v->len[b];
    int c = memcmp(v->bytes + v->off[a], v->bytes + v->off[b], la < lb ? la : lb);
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

void k3c_grammar_vocab_free(k3c_grammar_vocab *v) {
    if (!v) return;
    free(v->kind);
    free(v->off);
    free(v->len);
    free(v->bytes);
    free(v->sorted);
    free(v->lcp);
    free(v->specials);
    free(v);
}

int k3c_grammar_vocab_build(int n, const char *(*token)(void *user, int32_t id, size_t *len),
                            int (*special)(void *user, int32_t id), void *user, k3c_grammar_vocab **out) {
    *out = NULL;
    if (n <= 0) return k3c_errorf("grammar vocabulary: %d tokens", n);
    k3c_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return k3c_errorf_kind(K3C_ERROR_OOM, "grammar vocabulary: out of memory");
    v->n = n;
    v->kind = calloc((size_t)n, 1);
    v->off = calloc((size_t)n, sizeof *v->off);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->sorted = malloc(sizeof *v->sorted * (size_t)n);
    v->lcp = calloc((size_t)n, sizeof *v->lcp);
    v->specials = malloc(sizeof *v->specials * (size_t)n);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        if (token(user, i, &len) && !special(user, i)) total += len;
    }
    v->bytes = malloc(total ? total : 1);
    if (!v->kind || !v->off || !v->len || !v->sorted || !v->lcp || !v->specials || !v->bytes) {
        k3c_grammar_vocab_free(v);
        return k3c_errorf_kind(K3C_ERROR_OOM, "grammar vocabulary: out of memory (%d tokens)", n);
    }
    size_t at = 0;
    int one[256] = {0};
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *s = token(user, i, &len);
        if (!s) continue;
        if (special(user, i)) {
            v->kind[i] = VOC_SPECIAL;
            v->specials[v->n_specials++] = i;
            continue;
        }
        if (!len || at + len > total) continue; /* an empty text token can never be taken */
        v->kind[i] = VOC_TEXT;
        v->off[i] = (uint32_t)at;
        v->len[i] = (uint32_t)len;
        memcpy(v->bytes + at, s, len);
        at += len;
        if ((int)len > v->max_len) v->max_len = (int)len;
        if (len == 1) one[(uint8_t)s[0]] = 1;
        v->sorted[v->n_sorted++] = i;
    }
    v->all_bytes = 1;
    for (int b = 0; b < 256; b++) v->all_bytes &= one[b];
    qsort_r(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, cmp_tok, v);
    for (int i = 1; i < v->n_sorted; i++) {
        int32_t a = v->sorted[i - 1], b = v->sorted[i];
        uint32_t k = 0, m = v->len[a] < v->len[b] ? v->len[a] : v->len[b];
        while (k < m && v->bytes[v->off[a] + k] == v->bytes[v->off[b] + k]) k++;
        v->lcp[i] = k;
    }
    *out = v;
    return K3C_OK;
}
