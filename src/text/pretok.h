/* The pre-split's fast path: where the pattern's match at a position can be decided from ASCII bytes
 * alone, decide it here instead of calling PCRE2 (English and code are mostly that). */
#ifndef K3C_TEXT_PRETOK_H
#define K3C_TEXT_PRETOK_H

#include <stddef.h>
#include <stdint.h>

/* The end of the match of Kimi's pattern at s[p] in the subject s[0 .. n) (p < n; the pattern matches
 * every character, so a match always starts at p), when every byte the decision reads is ASCII; 0 when it
 * would read a byte >= 0x80 (the caller asks PCRE2). */
size_t k3c_pretok_ascii(const uint8_t *s, size_t n, size_t p);

#endif
