#include "text/pyjson.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* ---- number literals ---------------------------------------------------------------------------------- */

/* cJSON reads a number as the run of [0-9+-eE.] at a '-' or digit (at most 63 bytes) cut where strtod stops;
 * the scan below finds the same runs in the same (document) order as a pre-order walk of the tree. */
static int is_num_char(char c) { return (c >= '0' && c <= '9') || c == '+' || c == '-' || c == 'e' || c == 'E' || c == '.'; }

typedef struct literal_list {
    char **lit;
    size_t n, cap;
} literal_list;

static void literals_free(literal_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->lit[i]);
    free(l->lit);
}

static int literals_scan(const char *t, size_t len, literal_list *l) {
    size_t i = 0;
    while (i < len) {
        char c = t[i];
        if (c == '"') {
            for (i++; i < len && t[i] != '"'; i++)
                if (t[i] == '\\') i++;
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            char tmp[64];
            size_t k = 0;
            while (i + k < len && k < sizeof tmp - 1 && is_num_char(t[i + k])) {
                tmp[k] = t[i + k];
                k++;
            }
            tmp[k] = '\0';
            char *end = NULL;
            (void)strtod(tmp, &end);
            size_t used = (size_t)(end - tmp);
            if (used == 0) return -1;
            tmp[used] = '\0';
            if (l->n == l->cap) {
                size_t cap = l->cap ? 2 * l->cap : 16;
                char **p = realloc(l->lit, cap * sizeof *p);
                if (!p) return -1;
                l->lit = p;
                l->cap = cap;
            }
            if (!(l->lit[l->n] = strdup(tmp))) return -1;
            l->n++;
            i += used;
        } else {
            i++;
        }
    }
    return 0;
}

static size_t count_numbers(const cJSON *v) {
    size_t n = cJSON_IsNumber(v) ? 1 : 0;
    for (const cJSON *c = v->child; c; c = c->next) n += count_numbers(c);
    return n;
}

static void assign_literals(cJSON *v, literal_list *l, size_t *next) {
    if (cJSON_IsNumber(v)) {
        free(v->valuestring);
        v->valuestring = l->lit[*next];
        l->lit[(*next)++] = NULL;
    }
    for (cJSON *c = v->child; c; c = c->next) assign_literals(c, l, next);
}

int k3c_pyjson_keep_literals(cJSON *root, const char *text, size_t len) {
    literal_list l = {0};
    int rc = -1;
    if (literals_scan(text, len, &l) == 0 && l.n == count_numbers(root)) {
        size_t next = 0;
        assign_literals(root, &l, &next);
        rc = 0;
    }
    literals_free(&l);
    return rc;
}

cJSON *k3c_pyjson_parse(const char *text, size_t len, const char *what) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        k3c_errorf("%s: not valid JSON (near byte %zu of %zu)", what, at, len);
        return NULL;
    }
    for (size_t i = (size_t)(end - text); i < len; i++) {
        char c = text[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            cJSON_Delete(root);
            k3c_errorf("%s: extra data after the JSON value at byte %zu of %zu", what, i, len);
            return NULL;
        }
    }
    if (count_numbers(root) && k3c_pyjson_keep_literals(root, text, len) != 0) {
        /* only an allocation failure can get here: the scan mirrors cJSON's own reading */
        cJSON_Delete(root);
        k3c_errorf("%s: out of memory recording number literals", what);
        return NULL;
    }
    return root;
}

/* ---- number text ---------------------------------------------------------------------------------------- */

/* Python's repr(float): the shortest digits that read back to the same double (the correctly rounded
 * p-digit decimal for the smallest such p, which is what dtoa's shortest mode picks), written fixed when the
 * decimal point falls within -4 < decpt <= 16, else as d.ddde+XX. */
static void put_py_float(k3c_strbuf *b, double v) {
    if (isnan(v)) {
        k3c_strbuf_puts(b, "NaN");
        return;
    }
    if (isinf(v)) {
        k3c_strbuf_puts(b, v < 0 ? "-Infinity" : "Infinity");
        return;
    }
    char e[40];
    for (int p = 1; p <= 17; p++) {
        snprintf(e, sizeof e, "%.*e", p - 1, v);
        if (strtod(e, NULL) == v) break;
    }
    /* e = [-]d[.ddd]e[+-]XX */
    const char *s = e;
    int neg = 0;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    char digits[24];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int exp10 = atoi(s + 1);
    int decpt = exp10 + 1;
    if (neg) k3c_strbuf_putc(b, '-');
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            k3c_strbuf_puts(b, "0.");
            for (int i = 0; i < -decpt; i++) k3c_strbuf_putc(b, '0');
            k3c_strbuf_put(b, digits, (size_t)nd);
        } else if (decpt >= nd) {
            k3c_strbuf_put(b, digits, (size_t)nd);
            for (int i = nd; i < decpt; i++) k3c_strbuf_putc(b, '0');
            k3c_strbuf_puts(b, ".0");
        } else {
            k3c_strbuf_put(b, digits, (size_t)decpt);
            k3c_strbuf_putc(b, '.');
            k3c_strbuf_put(b, digits + decpt, (size_t)(nd - decpt));
        }
    } else {
        k3c_strbuf_putc(b, digits[0]);
        if (nd > 1) {
            k3c_strbuf_putc(b, '.');
            k3c_strbuf_put(b, digits + 1, (size_t)(nd - 1));
        }
        int x = decpt - 1;
        k3c_strbuf_printf(b, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    }
}

void k3c_pyjson_number(k3c_strbuf *b, const cJSON *v) {
    const char *lit = v->valuestring;
    if (lit && strtod(lit, NULL) == v->valuedouble) {
        if (!strpbrk(lit, ".eE")) {
            /* Python's int(): the literal's digits, without a sign on zero */
            const char *d = lit[0] == '-' ? lit + 1 : lit;
            while (d[0] == '0' && d[1]) d++;
            if (lit[0] == '-' && strcmp(d, "0") != 0) k3c_strbuf_putc(b, '-');
            k3c_strbuf_puts(b, d);
        } else {
            put_py_float(b, v->valuedouble);
        }
        return;
    }
    double x = v->valuedouble;
    if (isfinite(x) && x == floor(x) && fabs(x) < 9007199254740992.0)
        k3c_strbuf_printf(b, "%.0f", x == 0 ? 0.0 : x);
    else
        put_py_float(b, x);
}

/* ---- strings -------------------------------------------------------------------------------------------- */

/* json.dumps(ensure_ascii=False): escapes " \\ and the C0 controls (\\n \\r \\t \\b \\f by name, the rest as
 * \\u00xx); every other byte, DEL and non-ASCII included, is written as is. Byte-local, so a string split
 * anywhere escapes to the same bytes piece by piece. */
void k3c_pyjson_escape(k3c_strbuf *b, const char *s, size_t n) {
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        k3c_strbuf_put(b, s + run, i - run);
        switch (c) {
        case '"': k3c_strbuf_puts(b, "\\\""); break;
        case '\\': k3c_strbuf_puts(b, "\\\\"); break;
        case '\n': k3c_strbuf_puts(b, "\\n"); break;
        case '\r': k3c_strbuf_puts(b, "\\r"); break;
        case '\t': k3c_strbuf_puts(b, "\\t"); break;
        case '\b': k3c_strbuf_puts(b, "\\b"); break;
        case '\f': k3c_strbuf_puts(b, "\\f"); break;
        default: k3c_strbuf_printf(b, "\\u%04x", c); break;
        }
        run = i + 1;
    }
    k3c_strbuf_put(b, s + run, n - run);
}

static void put_py_string(k3c_strbuf *b, const char *s) {
    k3c_strbuf_putc(b, '"');
    k3c_pyjson_escape(b, s, strlen(s));
    k3c_strbuf_putc(b, '"');
}

/* ---- objects -------------------------------------------------------------------------------------------- */

typedef struct member_ref {
    const cJSON *item;
    size_t pos;
} member_ref;

static const char *key_of(const cJSON *c) { return c->string ? c->string : ""; }

static int by_key_then_pos(const void *a, const void *b) {
    const member_ref *x = a, *y = b;
    int c = strcmp(key_of(x->item), key_of(y->item));
    if (c) return c;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int by_pos(const void *a, const void *b) {
    const member_ref *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

const cJSON **k3c_pyjson_items(const cJSON *obj, int flags, size_t *n_out, int *failed) {
    *n_out = 0;
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next) n++;
    if (!n) return NULL;
    member_ref *m = malloc(n * sizeof *m);
    const cJSON **out = malloc(n * sizeof *out);
    if (!m || !out) {
        free(m);
        free(out);
        if (failed) *failed = 1;
        return NULL;
    }
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next, i++) m[i] = (member_ref){c, i};
    /* strcmp on UTF-8 is code point order, which is Python's str order */
    qsort(m, n, sizeof *m, by_key_then_pos);
    size_t k = 0;
    for (i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && strcmp(key_of(m[j + 1].item), key_of(m[i].item)) == 0) j++;
        m[k++] = (member_ref){m[j].item, m[i].pos}; /* last value, first position */
        i = j + 1;
    }
    if (!(flags & K3C_PYJSON_SORT_KEYS)) qsort(m, k, sizeof *m, by_pos);
    for (i = 0; i < k; i++) out[i] = m[i].item;
    free(m);
    *n_out = k;
    return out;
}

static void dump(k3c_strbuf *b, const cJSON *v, int flags, int depth) {
    const char *comma = (flags & K3C_PYJSON_COMPACT) ? "," : ", ";
    const char *colon = (flags & K3C_PYJSON_COMPACT) ? ":" : ": ";
    if (depth > CJSON_NESTING_LIMIT + 1) { /* cannot come from cJSON's parser; a guard for built trees */
        b->failed = 1;
        return;
    }
    if (cJSON_IsNull(v)) {
        k3c_strbuf_puts(b, "null");
    } else if (cJSON_IsTrue(v)) {
        k3c_strbuf_puts(b, "true");
    } else if (cJSON_IsFalse(v)) {
        k3c_strbuf_puts(b, "false");
    } else if (cJSON_IsNumber(v)) {
        k3c_pyjson_number(b, v);
    } else if (cJSON_IsString(v)) {
        put_py_string(b, v->valuestring ? v->valuestring : "");
    } else if (cJSON_IsArray(v)) {
        k3c_strbuf_putc(b, '[');
        for (const cJSON *c = v->child; c; c = c->next) {
            if (c != v->child) k3c_strbuf_puts(b, comma);
            dump(b, c, flags, depth + 1);
        }
        k3c_strbuf_putc(b, ']');
    } else if (cJSON_IsObject(v)) {
        size_t n = 0;
        const cJSON **items = k3c_pyjson_items(v, flags, &n, &b->failed);
        k3c_strbuf_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            if (i) k3c_strbuf_puts(b, comma);
            put_py_string(b, key_of(items[i]));
            k3c_strbuf_puts(b, colon);
            dump(b, items[i], flags, depth + 1);
        }
        k3c_strbuf_putc(b, '}');
        free(items);
    } else {
        k3c_strbuf_puts(b, "null"); /* cJSON_Raw / invalid: never produced by the parser */
    }
}

void k3c_pyjson_dump(k3c_strbuf *b, const cJSON *v, int flags) { dump(b, v, flags, 0); }

/* ---- whitespace ----------------------------------------------------------------------------------------- */

static int py_isspace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

int k3c_py_isblank(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        uint32_t c = p[i];
        size_t k = 1;
        if (c >= 0xC0 && c < 0xE0 && i + 1 < n) {
            c = ((c & 0x1F) << 6) | (p[i + 1] & 0x3F);
            k = 2;
        } else if (c >= 0xE0 && c < 0xF0 && i + 2 < n) {
            c = ((c & 0x0F) << 12) | ((uint32_t)(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
            k = 3;
        } else if (c >= 0xF0) {
            return 0; /* astral: no space there */
        }
        if (!py_isspace(c)) return 0;
        i += k;
    }
    return 1;
}
