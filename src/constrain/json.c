/* The JSON pushdown automaton (constrain/json.h). RFC 8259's grammar, one byte at a time:
 *
 *   value  = object / array / string / number / true / false / null, whitespace (SP HT LF CR) around
 *   string = '"' *( unescaped / '\' ( '"' '\' '/' b f n r t / 'u' 4HEXDIG ) ) '"', unescaped = any
 *            well-formed UTF-8 character but '"', '\' and U+0000..U+001F (Unicode Table 3-7: no overlong
 *            forms, no surrogates, nothing past U+10FFFF)
 *   number = [ '-' ] ( '0' / 1-9 *DIGIT ) [ '.' 1*DIGIT ] [ ( 'e' / 'E' ) [ '+' / '-' ] 1*DIGIT ]
 *
 * A number (and an enum value that another one extends) ends at the first byte that cannot continue it,
 * which is then read again in the container around it. Refusing a byte exactly when no completion exists
 * needs care in three places, each checked where its byte comes: an object's ',' only when another key can
 * follow (an unseen property, or other keys allowed), '}' only when every required property is there, and
 * a key's bytes only while some allowed key starts with them. */
#include "constrain/json.h"

#include <string.h>

enum { M_VALUE, M_STR, M_KEY, M_NUM, M_LIT, M_ENUM, M_CONT, M_DONE };
enum { S_NORM = 0, S_ESC = 1, S_PAIR_BSL = 2, S_PAIR_U = 3, S_HEX = 10 }; /* S_HEX + k: k hex digits due */
/* A string's jz_state.lit with paired surrogates (jz_schema.paired): the \u escape began with d/D (SUR_D),
 * is a high surrogate whose low half must follow (SUR_HIGH), is that low half (SUR_LOW). */
enum { SUR_D = 1, SUR_HIGH = 2, SUR_LOW = 4 };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { O_START, O_KEY, O_COLON, O_VALUE, O_NEXT, A_START, A_ELEM, A_NEXT };

static const char *const literals[3] = {"true", "false", "null"};
static const uint8_t literal_len[3] = {4, 5, 4};

#define BIG (1 << 29) /* "no completion" in the cost sums (never reached by an admitted state) */

static int is_ws(uint8_t b) { return b == ' ' || b == '\t' || b == '\n' || b == '\r'; }
static int is_digit(uint8_t b) { return b >= '0' && b <= '9'; }
static int is_hex(uint8_t b) { return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

void jz_init(jz_state *st, int root) {
    memset(st, 0, offsetof(jz_state, f));
    st->mode = M_VALUE;
    st->node = root;
}

static const jz_node *node_of(const jz_schema *sc, int32_t n) { return &sc->nodes[n]; }
/* A node's properties (NULL when it has none: the store may have no array at all). */
static const jz_prop *props_of(const jz_schema *sc, const jz_node *n) { return n->n_props ? sc->props + n->props : NULL; }

/* Whitespace here: a run of at most max_ws bytes. */
static int take_ws(jz_state *st, const jz_schema *sc) {
    if (sc->max_ws >= 0 && st->ws >= sc->max_ws) return 0;
    if (st->ws < 255) st->ws++;
    return 1;
}

/* A value just ended: back to its container, or the top level is done. */
static void value_done(jz_state *st) {
    st->ws = 0;
    if (st->depth == 0) {
        st->mode = M_DONE;
        return;
    }
    jz_frame *f = &st->f[st->depth - 1];
    f->sub = f->obj ? O_NEXT : A_NEXT;
    st->mode = M_CONT;
}

/* Another key can follow in object frame f. */
static int can_add_member(const jz_schema *sc, const jz_frame *f) {
    const jz_node *n = node_of(sc, f->node);
    if (!n->keyed || n->additional >= 0) return 1;
    uint64_t all = n->n_props >= 64 ? ~0ull : (1ull << n->n_props) - 1;
    return (f->seen & all) != all;
}

/* Property i of frame f's node (index within the node) is neither written nor excluded. */
static int prop_free(const jz_frame *f, int i) { return !((f->seen >> i) & 1); }

static void start_key(jz_state *st, const jz_schema *sc, jz_frame *f) {
    st->mode = M_KEY;
    st->sub = S_NORM;
    st->pos = 0;
    st->lo = 0;
    st->hi = (uint32_t)node_of(sc, f->node)->n_props;
    f->prop = -1;
    f->sub = O_KEY;
}

/* Keyed key bytes: narrows [lo, hi) to the names that go on with b at pos; 0 when the key cannot become
 * any allowed key any more. */
static int key_byte(jz_state *st, const jz_schema *sc, const jz_frame *f, uint8_t b) {
    const jz_node *n = node_of(sc, f->node);
    const jz_prop *p = props_of(sc, n);
    uint32_t lo = st->lo, hi = st->hi, pos = st->pos;
    while (lo < hi && !(p[lo].name.len > pos && p[lo].name.s[pos] == b)) lo++;
    uint32_t h = lo;
    while (h < hi && p[h].name.len > pos && p[h].name.s[pos] == b) h++;
    st->lo = lo;
    st->hi = h;
    st->pos = pos + 1;
    if (n->additional >= 0) return 1;
    for (uint32_t i = lo; i < h; i++)
        if (prop_free(f, (int)i)) return 1;
    return 0;
}

/* The key's closing quote: which property it names (the shortest name in range that equals the key). */
static int key_end(jz_state *st, const jz_schema *sc, jz_frame *f) {
    const jz_node *n = node_of(sc, f->node);
    f->prop = -1;
    if (n->keyed) {
        const jz_prop *p = props_of(sc, n);
        if (st->lo < st->hi && p[st->lo].name.len == st->pos) {
            if (!prop_free(f, (int)st->lo)) return 0; /* a property written twice */
            f->prop = (int16_t)st->lo;
            f->seen |= 1ull << st->lo;
        } else if (n->additional < 0) {
            return 0;
        }
    }
    f->sub = O_COLON;
    st->mode = M_CONT;
    st->ws = 0;
    return 1;
}

static int hex_val(uint8_t b) { return is_digit(b) ? b - '0' : (b | 0x20) - 'a' + 10; }

/* The hex digit of a \u escape at position 4 - k (k digits due before it); with paired surrogates a high
 * half (D800-DBFF) must be followed by a \u escape of a low half (DC00-DFFF) and a low half never stands
 * alone, refused at the digit that decides it. */
static int hex_byte(jz_state *st, const jz_schema *sc, uint8_t b) {
    if (!is_hex(b)) return 0;
    int k = st->sub - S_HEX, at = 4 - k, v = hex_val(b);
    if (sc->paired) {
        if (at == 0 && (st->lit & SUR_LOW) && v != 0xD) return 0;
        if (at == 0 && !(st->lit & SUR_LOW)) st->lit = v == 0xD ? SUR_D : 0;
        if (at == 1 && (st->lit & SUR_LOW) && v < 0xC) return 0;
        if (at == 1 && (st->lit & SUR_D)) {
            if (v >= 0xC) return 0;
            st->lit = v >= 0x8 ? SUR_HIGH : 0;
        }
    }
    if (k > 1) {
        st->sub--;
        return 1;
    }
    st->sub = st->lit == SUR_HIGH ? S_PAIR_BSL : S_NORM;
    if (st->lit & SUR_LOW) st->lit = 0;
    return 1;
}

/* Bytes still due before a string can close: a character's, an escape's (and a pending low surrogate's). */
static int string_pending(const jz_state *st) {
    int n = st->u8need;
    if (st->sub == S_ESC) n += 1;
    else if (st->sub == S_PAIR_BSL) n += 6; /* \uDC00 */
    else if (st->sub == S_PAIR_U) n += 5;
    else if (st->sub > S_HEX) n += st->sub - S_HEX + (st->lit == SUR_HIGH ? 6 : 0);
    return n;
}

/* String bytes (values and keys): UTF-8 well-formedness, escapes, the end quote (returns 2). */
static int string_byte(jz_state *st, const jz_schema *sc, uint8_t b, int escapes) {
    if (st->u8need) {
        if (b < st->u8lo || b > st->u8hi) return 0;
        st->u8need--;
        st->u8lo = 0x80;
        st->u8hi = 0xBF;
        return 1;
    }
    if (st->sub == S_PAIR_BSL || st->sub == S_PAIR_U) {
        if (b != (st->sub == S_PAIR_BSL ? '\\' : 'u')) return 0;
        st->sub = st->sub == S_PAIR_BSL ? S_PAIR_U : S_HEX + 4;
        if (st->sub == S_HEX + 4) st->lit = SUR_LOW;
        return 1;
    }
    if (st->sub == S_ESC) {
        if (b == 'u') {
            st->sub = S_HEX + 4;
            st->lit = 0;
            return 1;
        }
        if (!strchr("\"\\/bfnrt", b) || !b) return 0;
        st->sub = S_NORM;
        return 1;
    }
    if (st->sub > S_HEX) return hex_byte(st, sc, b);
    if (b == '"') return 2;
    if (b == '\\') {
        if (!escapes) return 0;
        st->sub = S_ESC;
        return 1;
    }
    if (b < 0x20) return 0;
    if (b < 0x80) return 1;
    st->u8lo = 0x80;
    st->u8hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) st->u8need = 1;
    else if (b == 0xE0) st->u8need = 2, st->u8lo = 0xA0;
    else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) st->u8need = 2;
    else if (b == 0xED) st->u8need = 2, st->u8hi = 0x9F;
    else if (b == 0xF0) st->u8need = 3, st->u8lo = 0x90;
    else if (b >= 0xF1 && b <= 0xF3) st->u8need = 3;
    else if (b == 0xF4) st->u8need = 3, st->u8hi = 0x8F;
    else return 0;
    return 1;
}

/* Enum bytes: narrows [lo, hi) of the node's encodings. 1 went on, 2 the value ended before b (b is to be
 * read again), 0 refused. */
static int enum_byte(jz_state *st, const jz_schema *sc, uint8_t b) {
    const jz_node *n = node_of(sc, st->node);
    const jz_bytes *e = sc->encs + n->enums;
    uint32_t lo = st->lo, hi = st->hi, pos = st->pos;
    uint32_t a = lo;
    while (a < hi && !(e[a].len > pos && e[a].s[pos] == b)) a++;
    uint32_t z = a;
    while (z < hi && e[z].len > pos && e[z].s[pos] == b) z++;
    if (a == z) return e[lo].len == pos ? 2 : 0; /* sorted: a complete one comes first in its range */
    st->lo = a;
    st->hi = z;
    st->pos = pos + 1;
    return 1;
}

static int push(jz_state *st, int32_t node, int obj) {
    if (st->depth >= JZ_MAX_DEPTH) return 0;
    jz_frame *f = &st->f[st->depth++];
    f->seen = 0;
    f->node = node;
    f->prop = -1;
    f->obj = (uint8_t)obj;
    f->sub = obj ? O_START : A_START;
    st->mode = M_CONT;
    st->ws = 0;
    return 1;
}

static int value_start(jz_state *st, const jz_schema *sc, uint8_t b) {
    const jz_node *n = node_of(sc, st->node);
    if (is_ws(b)) return take_ws(st, sc);
    st->ws = 0;
    if (n->n_enums) {
        st->mode = M_ENUM;
        st->lo = 0;
        st->hi = (uint32_t)n->n_enums;
        st->pos = 0;
        int r = enum_byte(st, sc, b);
        if (r != 1) return 0;
        if (st->hi - st->lo == 1 && sc->encs[n->enums + st->lo].len == st->pos) value_done(st);
        return 1;
    }
    switch (b) {
    case '{': return (n->types & JZ_T_OBJ) && push(st, st->node, 1);
    case '[': return (n->types & JZ_T_ARR) && push(st, st->node, 0);
    case '"':
        if (!(n->types & JZ_T_STR)) return 0;
        st->mode = M_STR;
        st->sub = S_NORM;
        st->u8need = 0;
        return 1;
    case 't':
    case 'f':
    case 'n':
        if (!(n->types & (b == 'n' ? JZ_T_NULL : JZ_T_BOOL))) return 0;
        st->mode = M_LIT;
        st->lit = b == 't' ? 0 : b == 'f' ? 1 : 2;
        st->pos = 1;
        return 1;
    default:
        if (!(n->types & (JZ_T_INT | JZ_T_NUM)) || !(b == '-' || is_digit(b))) return 0;
        st->mode = M_NUM;
        st->lit = !(n->types & JZ_T_NUM); /* integers only */
        st->sub = b == '-' ? N_MINUS : b == '0' ? N_ZERO : N_INT;
        return 1;
    }
}

/* Number bytes: 1 went on, 2 the number ended before b, 0 refused. */
static int number_byte(jz_state *st, uint8_t b) {
    int frac_ok = !st->lit;
    switch (st->sub) {
    case N_MINUS:
        if (!is_digit(b)) return 0;
        st->sub = b == '0' ? N_ZERO : N_INT;
        return 1;
    case N_ZERO:
    case N_INT:
        if (st->sub == N_INT && is_digit(b)) return 1;
        if (frac_ok && b == '.') return st->sub = N_DOT, 1;
        if (frac_ok && (b == 'e' || b == 'E')) return st->sub = N_E, 1;
        return 2;
    case N_DOT:
        if (!is_digit(b)) return 0;
        st->sub = N_FRAC;
        return 1;
    case N_FRAC:
        if (is_digit(b)) return 1;
        if (b == 'e' || b == 'E') return st->sub = N_E, 1;
        return 2;
    case N_E:
        if (b == '+' || b == '-') return st->sub = N_ESIGN, 1;
        if (!is_digit(b)) return 0;
        st->sub = N_EXP;
        return 1;
    case N_ESIGN:
        if (!is_digit(b)) return 0;
        st->sub = N_EXP;
        return 1;
    default: /* N_EXP */
        return is_digit(b) ? 1 : 2;
    }
}

static int container_byte(jz_state *st, const jz_schema *sc, uint8_t b) {
    jz_frame *f = &st->f[st->depth - 1];
    const jz_node *n = node_of(sc, f->node);
    if (is_ws(b)) return take_ws(st, sc);
    st->ws = 0;
    switch (f->sub) {
    case O_START:
    case O_NEXT:
        if (b == '}') {
            if (n->required & ~f->seen) return 0;
            st->depth--;
            value_done(st);
            return 1;
        }
        if (f->sub == O_START && b == '"') {
            if (!can_add_member(sc, f)) return 0;
            start_key(st, sc, f);
            return 1;
        }
        if (f->sub == O_NEXT && b == ',') {
            if (!can_add_member(sc, f)) return 0;
            f->sub = O_KEY;
            return 1;
        }
        return 0;
    case O_KEY:
        if (b != '"') return 0;
        start_key(st, sc, f);
        return 1;
    case O_COLON:
        if (b != ':') return 0;
        f->sub = O_VALUE;
        st->mode = M_VALUE;
        st->node = f->prop >= 0 ? sc->props[n->props + f->prop].node : n->additional >= 0 ? n->additional : JZ_ANY;
        return 1;
    case A_START:
    case A_NEXT:
        if (b == ']') {
            st->depth--;
            value_done(st);
            return 1;
        }
        if (f->sub == A_NEXT) {
            if (b != ',') return 0;
            f->sub = A_ELEM;
            st->mode = M_VALUE;
            st->node = n->items;
            return 1;
        }
        f->sub = A_ELEM;
        st->mode = M_VALUE;
        st->node = n->items;
        return value_start(st, sc, b);
    default:
        return 0;
    }
}

int jz_step(jz_state *st, const jz_schema *sc, uint8_t b) {
    for (;;) {
        int r;
        switch (st->mode) {
        case M_VALUE: return value_start(st, sc, b);
        case M_STR:
            r = string_byte(st, sc, b, 1);
            if (r == 2) value_done(st);
            return r != 0;
        case M_KEY: {
            jz_frame *f = &st->f[st->depth - 1];
            int keyed = node_of(sc, f->node)->keyed;
            r = string_byte(st, sc, b, !keyed);
            if (r == 2) return key_end(st, sc, f);
            if (r == 0) return 0;
            return keyed ? key_byte(st, sc, f, b) : 1;
        }
        case M_NUM:
            r = number_byte(st, b);
            if (r != 2) return r;
            value_done(st);
            continue; /* b again, in the container */
        case M_LIT:
            if (b != (uint8_t)literals[st->lit][st->pos]) return 0;
            if (++st->pos == literal_len[st->lit]) value_done(st);
            return 1;
        case M_ENUM: {
            r = enum_byte(st, sc, b);
            if (r == 0) return 0;
            if (r == 2) {
                value_done(st);
                continue;
            }
            const jz_bytes *e = sc->encs + node_of(sc, st->node)->enums;
            if (st->hi - st->lo == 1 && e[st->lo].len == st->pos) value_done(st);
            return 1;
        }
        case M_CONT: return container_byte(st, sc, b);
        default: /* M_DONE */
            return sc->top_ws && is_ws(b) && take_ws(st, sc);
        }
    }
}

int jz_done(const jz_state *st) { return st->mode == M_DONE; }

int jz_accepting(const jz_state *st, const jz_schema *sc) {
    if (st->mode == M_DONE) return 1;
    if (st->depth) return 0;
    if (st->mode == M_NUM) return st->sub == N_ZERO || st->sub == N_INT || st->sub == N_FRAC || st->sub == N_EXP;
    if (st->mode == M_ENUM) return sc->encs[node_of(sc, st->node)->enums + st->lo].len == st->pos;
    return 0;
}

/* ---- the shortest completion ---- */

/* Bytes that close object frame f once its current member is complete: each required property not yet
 * written as `,"name":v`, then '}'. */
static int object_rest(const jz_schema *sc, const jz_frame *f, int exclude) {
    const jz_node *n = node_of(sc, f->node);
    int cost = 1;
    uint64_t left = n->required & ~f->seen;
    for (int i = 0; left; i++, left >>= 1)
        if ((left & 1) && i != exclude) cost += 1 + sc->props[n->props + i].cost;
    return cost;
}

/* A member must come next (after '{' or ','): the cheapest one, then the rest and '}'. */
static int object_members(const jz_schema *sc, const jz_frame *f) {
    const jz_node *n = node_of(sc, f->node);
    uint64_t left = n->required & ~f->seen;
    if (left) return object_rest(sc, f, -1) - 1; /* the first of them needs no comma */
    int best = BIG;
    if (n->additional >= 0 || !n->keyed) {
        /* "":v, or "x":v where a property is named "" */
        int empty_name = n->keyed && n->n_props && sc->props[n->props].name.len == 0;
        best = 3 + empty_name + node_of(sc, n->additional >= 0 ? n->additional : JZ_ANY)->min_len;
    }
    for (int i = 0; i < n->n_props && n->keyed; i++)
        if (prop_free(f, i) && sc->props[n->props + i].cost < best) best = sc->props[n->props + i].cost;
    return best + 1;
}

/* The key being typed in frame f, finished the cheapest way, with the member's value and the object's rest. */
static int key_cost(const jz_state *st, const jz_schema *sc, const jz_frame *f) {
    const jz_node *n = node_of(sc, f->node);
    int pending = string_pending(st);
    int best = BIG;
    if (!n->keyed || n->additional >= 0) {
        int32_t vn = n->additional >= 0 ? n->additional : JZ_ANY;
        /* where the key as it stands is a property's name, one more byte that no name in range takes next
         * makes it another key (there are more such bytes than names); inside a character, the bytes that
         * finish it can avoid the names unless (one byte left) names of that length take every one of them */
        const jz_prop *p = props_of(sc, n);
        int extra = 0;
        if (n->keyed && st->lo < st->hi && !st->u8need) extra = p[st->lo].name.len == st->pos;
        if (n->keyed && st->lo < st->hi && st->u8need == 1) {
            int covered = 0, last = -1;
            for (uint32_t i = st->lo; i < st->hi; i++)
                if (p[i].name.len == st->pos + 1 && p[i].name.s[st->pos] != last) covered++, last = p[i].name.s[st->pos];
            extra = covered == st->u8hi - st->u8lo + 1;
        }
        best = pending + extra + 2 + node_of(sc, vn)->min_len + object_rest(sc, f, -1);
    }
    for (uint32_t i = st->lo; n->keyed && i < st->hi; i++) {
        if (!prop_free(f, (int)i)) continue;
        const jz_prop *p = props_of(sc, n) + i;
        int c = (int)(p->name.len - st->pos) + 2 + node_of(sc, p->node)->min_len + object_rest(sc, f, (int)i);
        if (c < best) best = c;
    }
    return best;
}

static int lexeme_cost(const jz_state *st, const jz_schema *sc) {
    switch (st->mode) {
    case M_VALUE: return node_of(sc, st->node)->min_len;
    case M_STR: return string_pending(st) + 1;
    case M_NUM: return st->sub == N_MINUS || st->sub == N_DOT || st->sub == N_E || st->sub == N_ESIGN;
    case M_LIT: return literal_len[st->lit] - (int)st->pos;
    case M_ENUM: {
        const jz_bytes *e = sc->encs + node_of(sc, st->node)->enums;
        int best = BIG;
        for (uint32_t i = st->lo; i < st->hi; i++)
            if ((int)(e[i].len - st->pos) < best) best = (int)(e[i].len - st->pos);
        return best;
    }
    default: return 0;
    }
}

int jz_min_close(const jz_state *st, const jz_schema *sc) {
    if (st->mode == M_DONE) return 0;
    int cost = 0, d = st->depth;
    if (st->mode == M_KEY || st->mode == M_CONT) {
        const jz_frame *f = &st->f[d - 1];
        if (st->mode == M_KEY) {
            cost = key_cost(st, sc, f);
        } else {
            switch (f->sub) {
            case O_START: cost = (node_of(sc, f->node)->required ? object_members(sc, f) : 1); break;
            case O_KEY: cost = object_members(sc, f); break;
            case O_COLON: {
                const jz_node *n = node_of(sc, f->node);
                int32_t vn = f->prop >= 0 ? sc->props[n->props + f->prop].node : n->additional >= 0 ? n->additional : JZ_ANY;
                cost = 1 + node_of(sc, vn)->min_len + object_rest(sc, f, -1);
                break;
            }
            case O_NEXT: cost = object_rest(sc, f, -1); break;
            default: cost = 1; break; /* A_START, A_NEXT: ']' */
            }
        }
        d--;
    } else {
        cost = lexeme_cost(st, sc);
    }
    for (int i = d - 1; i >= 0; i--) cost += st->f[i].obj ? object_rest(sc, &st->f[i], -1) : 1;
    return cost;
}
