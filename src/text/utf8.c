/* UTF-8 per Unicode Table 3-7 (the second byte's range depends on the lead; no overlongs, surrogates or
 * code points above U+10FFFF). The replacement rule is the one Python's decoder and the Unicode standard
 * ("maximal subparts", 3.9 U+FFFD substitution) share, so the output equals what tiktoken's
 * decode(errors="replace") makes of the same bytes. */
#include "text/utf8.h"

#include <string.h>

/* The range of the second byte after a multi-byte lead; lo > hi for bytes that cannot lead. */
static void second_range(uint8_t lead, uint8_t *lo, uint8_t *hi, size_t *len) {
    *lo = 0x80, *hi = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
        *len = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
        *len = 3;
        if (lead == 0xE0) *lo = 0xA0;
        if (lead == 0xED) *hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
        *len = 4;
        if (lead == 0xF0) *lo = 0x90;
        if (lead == 0xF4) *hi = 0x8F;
    } else {
        *len = 0;
        *lo = 1, *hi = 0;
    }
}

/* How many bytes of s[0 .. n) form a prefix of a well-formed sequence (at least 1 when s[0] can lead;
 * 0 when it cannot), and the full length that sequence needs. */
static size_t valid_prefix(const uint8_t *s, size_t n, size_t *need) {
    if (s[0] < 0x80) {
        *need = 1;
        return 1;
    }
    uint8_t lo, hi;
    second_range(s[0], &lo, &hi, need);
    if (!*need) return 0;
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) k++;
    else return k;
    while (k < *need && k < n && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

size_t k3c_utf8_seq(const uint8_t *s, size_t n) {
    size_t need, k = valid_prefix(s, n, &need);
    return k && k == need ? k : 0;
}

int k3c_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        /* ASCII eight bytes at a time: most text is mostly ASCII */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = k3c_utf8_seq(s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

size_t k3c_utf8_replace(const uint8_t *s, size_t n, uint8_t *out, int final, size_t *used) {
    size_t i = 0, o = 0;
    while (i < n) {
        size_t need, k = valid_prefix(s + i, n - i, &need);
        if (k && k == need) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        /* a well-formed prefix cut by the end of the input: more bytes may complete it */
        if (k && i + k == n && !final) break;
        out[o++] = 0xEF, out[o++] = 0xBF, out[o++] = 0xBD;
        i += k ? k : 1;
    }
    if (used) *used = i;
    return o;
}

int k3c_py_isspace(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: return 1;
    default: return cp >= 0x2000 && cp <= 0x200A;
    }
}
