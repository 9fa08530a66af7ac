/* Token-level constrained decoding: a grammar of a few element kinds over symbols (a byte of a text token, or
 * a whole special token), and a matcher that says which tokens of the vocabulary may come next.
 *
 *   ALT   one of several symbol strings (prefix-free), each with its own next element; optionally a
 *         fallback element taken, consuming nothing, when the first symbol starts none of them (an
 *         optional opener such as K2's <think>). A literal is an ALT of one string.
 *   JSON  one JSON value of a schema (constrain/json.h; the top level is an object), then `next`.
 *   FREE  any text tokens (no special token) until the first symbol of its terminator ALT (a reasoning
 *         section until its closing marker).
 *   END   one of the end ids (the chat format's end of message); the grammar is then complete.
 * A complete grammar admits every token (the caller stops at the end id anyway).
 *
 * Elements are added back to front (each `next` names an element added before it), so the fewest symbols
 * from each element to the end are known when it is added, and the grammar is a DAG.
 *
 * Budget: with `remaining` tokens left (the candidate included), a token is admitted only when the
 * grammar can still be completed in remaining - 1 more tokens, counting one token per symbol of the
 * shortest completion (every byte is a one-byte token of a byte-level vocabulary, k3c_grammar_vocab's
 * all_bytes), so a request that runs out of tokens has always finished its grammar. remaining <= 0: no
 * budget. */
#ifndef K3C_CONSTRAIN_GRAMMAR_H
#define K3C_CONSTRAIN_GRAMMAR_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "constrain/json.h"
#include "k3c.h"

#define K3C_SYM_SPECIAL 256 /* symbol of special token id t: K3C_SYM_SPECIAL + t */

enum { VOC_NONE = 0, VOC_TEXT = 1, VOC_SPECIAL = 2 };

struct k3c_grammar_vocab {
    int n;              /* token ids 0 .. n - 1 */
    uint8_t *kind;      /* [n] VOC_* */
    uint32_t *off, *len; /* [n] the token's bytes in `bytes` */
    uint8_t *bytes;
    int32_t *sorted;    /* [n_sorted] the text tokens, bytewise in order */
    uint32_t *lcp;      /* [n_sorted] bytes each shares with the one before it */
    int n_sorted;
    int32_t *specials;  /* [n_specials] */
    int n_specials;
    int max_len;        /* bytes of the longest text token */
    int all_bytes;      /* every byte value is a one-byte text token */
};

/* A vocabulary of n ids from callbacks: token(user, id, &len) -> its bytes (NULL: none), special(user, id). */
int k3c_grammar_vocab_build(int n, const char *(*token)(void *user, int32_t id, size_t *len),
                            int (*special)(void *user, int32_t id), void *user, k3c_grammar_vocab **out);

enum { GE_ALT, GE_JSON, GE_FREE, GE_END };

typedef struct g_alt {
    int32_t off, len; /* symbols syms[off .. off + len) */
    int32_t next;     /* -1: the grammar is complete */
} g_alt;

typedef struct g_elem {
    uint8_t kind;
    int32_t alts, n_alts; /* ALT: g->alts[alts ..), sorted by their symbols once finished */
    int32_t fallback;     /* ALT: -1 none */
    int32_t root, next;   /* JSON */
    int32_t term;         /* FREE: its terminator (an ALT whose strings start with a special token) */
    int32_t min_rest;     /* symbols of the shortest way from this element's start to the end */
} g_elem;

#define K3C_GRAMMAR_MAX_ENDS 8
/* JSON a model writes is held to runs of one whitespace byte: it cannot pad forever, and compact or
 * single-spaced text (json.dumps either way) can still be written. */
#define K3C_GRAMMAR_MAX_WS 1

struct k3c_grammar {
    const k3c_grammar_vocab *v;
    jz_schema sc;
    g_elem *el;
    int n_el, cap_el;
    g_alt *alts;
    int n_alts, cap_alts;
    int32_t *syms;
    int n_syms, cap_syms;
    int32_t ends[K3C_GRAMMAR_MAX_ENDS];
    int n_ends;
    int32_t *specials; /* the special tokens its strings hold: the only ones it can admit before its end */
    int n_specials;
    int start;
    int min_tokens; /* symbols of the shortest complete output */
};

/* ---- building (constrain/grammar.c; the chat formats' grammars are in text/chat_grammar.c) ---- */
/* An empty grammar over v; JSON in it allows runs of at most max_ws whitespace bytes (-1: any). */
int k3c_grammar_begin(const k3c_grammar_vocab *v, int max_ws, k3c_grammar **out);
/* Each returns the new element's index, or -1 with an error set. */
int k3c_grammar_add_end(k3c_grammar *g, const int32_t *ids, int n);
int k3c_grammar_add_alt(k3c_grammar *g, int fallback);
/* A string of the ALT just added (alternatives follow their element directly). */
int k3c_grammar_alt_string(k3c_grammar *g, int el, const int32_t *syms, int n, int next);
/* A JSON Schema compiled into the grammar (constrain/schema.h; schema NULL: any object): its root node, for
 * any number of JSON elements. */
int k3c_grammar_schema(k3c_grammar *g, const cJSON *schema, int strict, const char *what);
int k3c_grammar_add_json_root(k3c_grammar *g, int root, int next);
int k3c_grammar_add_free(k3c_grammar *g, int term);
/* Sorts the alternatives (refusing two that are equal or one a prefix of another: `what` names them in
 * the message) and makes `start` the first element. */
int k3c_grammar_finish(k3c_grammar *g, int start);

/* A symbol string under construction. */
typedef struct k3c_syms {
    int32_t *v;
    int n, cap, failed;
} k3c_syms;
void k3c_syms_text(k3c_syms *s, const char *text);
void k3c_syms_bytes(k3c_syms *s, const char *bytes, size_t n);
void k3c_syms_special(k3c_syms *s, int32_t id);
void k3c_syms_raw(k3c_syms *s, const int32_t *syms, int n); /* symbols as they are */
void k3c_syms_free(k3c_syms *s);

/* ---- matching ---- */
typedef struct g_state {
    int32_t el; /* -1: complete */
    uint32_t pos, lo, hi;
    jz_state js; /* last: copied only as far as it matters */
} g_state;

typedef struct k3c_gmatch {
    const k3c_grammar *g;
    g_state st;
    g_state *stack; /* [max_len + 1] states along a token's bytes (the mask's walk) */
    g_state tmp;
} k3c_gmatch;

int k3c_gmatch_create(const k3c_grammar *g, k3c_gmatch **out);
void k3c_gmatch_free(k3c_gmatch *m);
/* 1 when tok may come next with `remaining` tokens left (this one included; <= 0: no budget). */
int k3c_gmatch_admits(k3c_gmatch *m, int32_t tok, int remaining);
/* Takes tok (K3C_ERR, state unchanged, when the grammar refuses it; no budget applies). */
int k3c_gmatch_advance(k3c_gmatch *m, int32_t tok);
/* mask[0 .. V): 1 where k3c_gmatch_admits; ids past the vocabulary are 0. Returns how many are 1. */
int k3c_gmatch_mask(k3c_gmatch *m, int remaining, uint8_t *mask, int V);
int k3c_gmatch_done(const k3c_gmatch *m);
/* Symbols of the shortest completion from here (0 when complete). */
int k3c_gmatch_min_symbols(const k3c_gmatch *m);

#endif
