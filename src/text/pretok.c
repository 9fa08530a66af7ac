/* Kimi's pattern (tokenization_kimi.py pat_str) restricted to ASCII, alternative by alternative in the
 * pattern's order, with the backtracking worked out:
 *   1 [\p{Han}]+                          no ASCII byte is Han
 *   2 LEAD? U* L+ CONTRACTION?            LEAD = [^\r\n\p{L}\p{N}], U = A-Z, L = a-z on ASCII. U and L
 *   3 LEAD? U+ L* CONTRACTION?              share no ASCII letter, so giving back U* never lets L+ match,
 *                                          and a failed LEAD? retried empty leaves a non-letter first
 *   4 \p{N}{1,3}                           0-9
 *   5 " "? P+ [\r\n]*                      P: not \s, letter or digit
 *   6 \s* [\r\n]+                          ends after the last CR / LF of the whitespace run
 *   7 \s+ (?!\S)                           the whole run at the end of the subject, else all but its
 *                                          last character (that one then starts the next match)
 *   8 \s+                                  a run of one
 * Whenever a run or a test stops at a byte >= 0x80, that byte's class (a letter? a space like U+00A0 or
 * U+3000? a digit? the ſ of 'ſ?) would decide, so the answer is 0 and PCRE2 decides instead. The test
 * tokenizer_pretok_ascii holds this to PCRE2 on random text. */
#include "text/pretok.h"

enum { UP, LO, DG, NL, WS, PU, NA };

/* classes of the 128 ASCII bytes: \t \v \f and space are WS, \r \n NL, the rest of the non-alphanumerics PU */
static const uint8_t ascii_class[128] = {
    PU, PU, PU, PU, PU, PU, PU, PU, PU, WS, NL, WS, WS, NL, PU, PU, /* 0x00 */
    PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, /* 0x10 */
    WS, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, PU, /* 0x20 */
    DG, DG, DG, DG, DG, DG, DG, DG, DG, DG, PU, PU, PU, PU, PU, PU, /* 0x30 */
    PU, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, /* 0x40 */
    UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, UP, PU, PU, PU, PU, PU, /* 0x50 */
    PU, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, /* 0x60 */
    LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, LO, PU, PU, PU, PU, PU, /* 0x70 */
};

static inline int cls(uint8_t b) { return b < 0x80 ? ascii_class[b] : NA; }

/* After the letters, up to e: (?i:'s|'t|'re|'ve|'m|'ll|'d)? ; 0 when the byte after ' is not ASCII
 * ((?i:s) also matches U+017F ſ). */
static size_t contraction(const uint8_t *s, size_t n, size_t e) {
    if (e + 1 >= n || s[e] != '\'') return e;
    uint8_t a = s[e + 1];
    if (a >= 0x80) return 0;
    a |= 0x20; /* lower case; only letters can come out as these */
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return e + 2;
    if (e + 2 < n) {
        uint8_t b = s[e + 2] | 0x20;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return e + 3;
    }
    return e;
}

size_t k3c_pretok_ascii(const uint8_t *s, size_t n, size_t p) {
    int c0 = cls(s[p]);
    if (c0 == NA) return 0;
    /* 2 and 3: letters, after one LEAD character when s[p] is not a letter itself */
    if (c0 == UP || c0 == LO || c0 == WS || c0 == PU) {
        size_t q = p + (c0 == WS || c0 == PU), u = q;
        while (u < n && cls(s[u]) == UP) u++;
        if (u < n && s[u] >= 0x80) return 0;
        size_t l = u;
        while (l < n && cls(s[l]) == LO) l++;
        if (l < n && s[l] >= 0x80) return 0;
        if (l > u) return contraction(s, n, l); /* 2: U* L+ */
        if (u > q) return contraction(s, n, u); /* 3: U+ (L* empty) */
    }
    /* 4 */
    if (c0 == DG) {
        size_t e = p;
        while (e < n && e - p < 3 && cls(s[e]) == DG) e++;
        if (e - p < 3 && e < n && s[e] >= 0x80) return 0;
        return e;
    }
    /* 5 */
    if (c0 == PU || s[p] == ' ') {
        size_t q = p + (s[p] == ' ');
        if (q < n && s[q] >= 0x80) return 0;
        if (q < n && cls(s[q]) == PU) {
            while (q < n && cls(s[q]) == PU) q++;
            if (q < n && s[q] >= 0x80) return 0;
            while (q < n && cls(s[q]) == NL) q++;
            return q;
        }
    }
    /* 6, 7, 8: s[p] is whitespace here */
    size_t w = p, last_nl = 0;
    int nl = 0;
    while (w < n && (cls(s[w]) == WS || cls(s[w]) == NL)) {
        if (cls(s[w]) == NL) nl = 1, last_nl = w;
        w++;
    }
    if (w < n && s[w] >= 0x80) return 0;
    if (nl) return last_nl + 1;
    if (w == n || w - p == 1) return w;
    return w - 1;
}
