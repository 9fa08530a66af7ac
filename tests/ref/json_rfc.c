/* RFC 8259 section 2-7 as recursive descent (tests/ref/json_rfc.h). */
#include "json_rfc.h"

typedef struct rd {
    const uint8_t *s;
    size_t n, i;
    int depth, max_depth;
} rd;

static int peek(const rd *r) { return r->i < r->n ? r->s[r->i] : -1; }

/* ws = *( %x20 / %x09 / %x0A / %x0D ) */
static void ws(rd *r) {
    while (peek(r) == 0x20 || peek(r) == 0x09 || peek(r) == 0x0A || peek(r) == 0x0D) r->i++;
}

static int lit(rd *r, const char *w) {
    for (; *w; w++, r->i++)
        if (peek(r) != (uint8_t)*w) return 0;
    return 1;
}

static int digit(int c) { return c >= '0' && c <= '9'; }

/* number = [ minus ] int [ frac ] [ exp ] */
static int number(rd *r) {
    if (peek(r) == '-') r->i++;
    if (peek(r) == '0') {
        r->i++;
    } else if (digit(peek(r))) {
        while (digit(peek(r))) r->i++;
    } else {
        return 0;
    }
    if (peek(r) == '.') {
        r->i++;
        if (!digit(peek(r))) return 0;
        while (digit(peek(r))) r->i++;
    }
    if (peek(r) == 'e' || peek(r) == 'E') {
        r->i++;
        if (peek(r) == '+' || peek(r) == '-') r->i++;
        if (!digit(peek(r))) return 0;
        while (digit(peek(r))) r->i++;
    }
    return 1;
}

/* One UTF-8 encoded code point (RFC 3629: the shortest form, not a surrogate, at most U+10FFFF). */
static int utf8_char(rd *r, uint32_t *cp) {
    int c = peek(r);
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    if (n < 0) return 0;
    uint32_t v = n == 0 ? (uint32_t)c : n == 1 ? (uint32_t)(c & 0x1F) : n == 2 ? (uint32_t)(c & 0x0F) : (uint32_t)(c & 0x07);
    r->i++;
    for (int k = 0; k < n; k++) {
        int d = peek(r);
        if (d < 0 || (d & 0xC0) != 0x80) return 0;
        v = v << 6 | (uint32_t)(d & 0x3F);
        r->i++;
    }
    static const uint32_t least[4] = {0, 0x80, 0x800, 0x10000};
    if (v < least[n] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return 1;
}

static int hexdig(int c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* string = quotation-mark *char quotation-mark */
static int string(rd *r) {
    if (peek(r) != '"') return 0;
    r->i++;
    for (;;) {
        int c = peek(r);
        if (c < 0) return 0;
        if (c == '"') {
            r->i++;
            return 1;
        }
        if (c == '\\') {
            r->i++;
            int e = peek(r);
            r->i++;
            if (e == 'u') {
                for (int k = 0; k < 4; k++, r->i++)
                    if (!hexdig(peek(r))) return 0;
            } else if (!(e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
                         e == 't')) {
                return 0;
            }
            continue;
        }
        uint32_t cp;
        if (!utf8_char(r, &cp) || cp < 0x20) return 0; /* unescaped = %x20-21 / %x23-5B / %x5D-10FFFF */
    }
}

static int value(rd *r);

static int object(rd *r) {
    r->i++; /* { */
    ws(r);
    if (peek(r) == '}') {
        r->i++;
        return 1;
    }
    for (;;) {
        if (!string(r)) return 0;
        ws(r);
        if (peek(r) != ':') return 0;
        r->i++;
        ws(r);
        if (!value(r)) return 0;
        ws(r);
        if (peek(r) == '}') {
            r->i++;
            return 1;
        }
        if (peek(r) != ',') return 0;
        r->i++;
        ws(r);
    }
}

static int array(rd *r) {
    r->i++; /* [ */
    ws(r);
    if (peek(r) == ']') {
        r->i++;
        return 1;
    }
    for (;;) {
        if (!value(r)) return 0;
        ws(r);
        if (peek(r) == ']') {
            r->i++;
            return 1;
        }
        if (peek(r) != ',') return 0;
        r->i++;
        ws(r);
    }
}

static int value(rd *r) {
    switch (peek(r)) {
    case '{':
    case '[': {
        if (++r->depth > r->max_depth) return 0;
        int ok = peek(r) == '{' ? object(r) : array(r);
        r->depth--;
        return ok;
    }
    case '"': return string(r);
    case 't': return lit(r, "true");
    case 'f': return lit(r, "false");
    case 'n': return lit(r, "null");
    default: return number(r);
    }
}

int ref_json_valid(const uint8_t *s, size_t n, int max_depth) {
    rd r = {s, n, 0, 0, max_depth};
    ws(&r);
    if (!value(&r)) return 0;
    ws(&r);
    return r.i == n;
}
