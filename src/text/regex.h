/* The tokenizer's two searches through PCRE2 (8-bit, JIT): the pre-split pattern and the alternation of
 * special-token texts. A compiled k3c_regex is read-only and shared; each search keeps its own match
 * state (k3c_regex_state), so one tokenizer encodes on several threads at once. */
#ifndef K3C_TEXT_REGEX_H
#define K3C_TEXT_REGEX_H

#include <stddef.h>

typedef struct k3c_regex k3c_regex;
typedef struct k3c_regex_state k3c_regex_state;

/* utf: the pattern and subjects are UTF-8 with Unicode properties (PCRE2_UTF | PCRE2_UCP); else bytes.
 * what names the pattern in errors. */
int k3c_regex_compile(const char *pattern, size_t len, int utf, const char *what, k3c_regex **out);
void k3c_regex_free(k3c_regex *re);

int k3c_regex_state_create(const k3c_regex *re, k3c_regex_state **out);
void k3c_regex_state_free(k3c_regex_state *st);

/* The leftmost match in subject[0 .. len) starting at or after `from`: 1 with [*start, *end), 0 when there
 * is none, K3C_ERR on a matching error. The subject is the whole text the pattern sees: lookarounds stop
 * at its ends. UTF subjects must be valid UTF-8 (not checked again here). */
int k3c_regex_find(const k3c_regex *re, k3c_regex_state *st, const char *subject, size_t len, size_t from,
                   size_t *start, size_t *end);

#endif
