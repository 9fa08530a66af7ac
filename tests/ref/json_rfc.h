/* A JSON text validator written from RFC 8259 alone (recursive descent over its ABNF, strings decoded as
 * UTF-8 by code point with the RFC 3629 limits), the oracle the constrained-decoding automaton
 * (src/constrain/json.c, a byte-stepping pushdown machine) is tested against. */
#ifndef K3C_TESTS_REF_JSON_RFC_H
#define K3C_TESTS_REF_JSON_RFC_H

#include <stddef.h>
#include <stdint.h>

/* 1 when s[0 .. n) is one JSON text (ws value ws) nesting at most max_depth arrays / objects, else 0. */
int ref_json_valid(const uint8_t *s, size_t n, int max_depth);

#endif
