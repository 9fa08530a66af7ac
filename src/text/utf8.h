/* UTF-8 as the tokenizer needs it: validation, Python's "replace" error handling, a streaming split
 * point, and Python's str.isspace() (the chunking rule of Kimi's encode is written in terms of it). */
#ifndef K3C_TEXT_UTF8_H
#define K3C_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Length of the well-formed sequence (Unicode Table 3-7) at s[0 .. n), 0 when s does not start with one
 * (an ill-formed or truncated sequence). n >= 1. */
size_t k3c_utf8_seq(const uint8_t *s, size_t n);

/* 1 when s[0 .. n) is well-formed UTF-8. */
int k3c_utf8_valid(const uint8_t *s, size_t n);

/* Python's bytes.decode("utf-8", "replace") re-encoded: each maximal ill-formed subpart (the longest
 * prefix of a well-formed sequence, or one byte when none) becomes U+FFFD (EF BF BD). Writes at most
 * 3 * n bytes to out; returns the number written. With `final` = 0 a trailing truncated-but-well-formed
 * prefix (at most 3 bytes) is not converted: *used gets the bytes consumed, so a stream passes the rest
 * back in with its next bytes and the joined output equals decoding everything at once. */
size_t k3c_utf8_replace(const uint8_t *s, size_t n, uint8_t *out, int final, size_t *used);

/* The code point of the well-formed sequence at s (k3c_utf8_seq(s) == *len > 0). */
static inline uint32_t k3c_utf8_decode(const uint8_t *s, size_t len) {
    switch (len) {
    case 1: return s[0];
    case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
    case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
    default: return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    }
}

/* Bytes of the sequence led by a byte of well-formed UTF-8 (1..4). */
static inline size_t k3c_utf8_lead_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

/* Python 3's str.isspace(): bidirectional class WS, B or S, or category Zs. That is White_Space plus
 * U+001C..U+001F (and not U+180E); unchanged from Unicode 6.3 to 16. */
int k3c_py_isspace(uint32_t cp);

#endif
