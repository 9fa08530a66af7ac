/* The schema store (constrain/json.h) and its compiler from JSON Schema (constrain/schema.h). Nodes are
 * appended after their children (post-order), so jz_schema_finish computes the shortest values in one pass
 * over the node list. */
#include "constrain/schema.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

#define GROW(arr, n, cap)                                                                                          \
    (((n) < (cap)) ? 1 : grow((void **)&(arr), &(cap), sizeof *(arr)))

static int grow(void **arr, int *cap, size_t elem) {
    int c = *cap ? 2 * *cap : 16;
    void *p = realloc(*arr, (size_t)c * elem);
    if (!p) return 0;
    *arr = p;
    *cap = c;
    return 1;
}

static int oom(void) { return k3c_errorf_kind(K3C_ERROR_OOM, "JSON schema: out of memory"); }

static int add_node(jz_schema *sc, const jz_node *n) {
    if (!GROW(sc->nodes, sc->n_nodes, sc->cap_nodes)) return -1;
    sc->nodes[sc->n_nodes] = *n;
    return sc->n_nodes++;
}

static const uint8_t *blob(jz_schema *sc, const void *s, size_t len) {
    if (!GROW(sc->blobs, sc->n_blobs, sc->cap_blobs)) return NULL;
    uint8_t *b = malloc(len ? len : 1);
    if (!b) return NULL;
    memcpy(b, s, len);
    sc->blobs[sc->n_blobs++] = b;
    return b;
}

int jz_schema_init(jz_schema *sc) {
    memset(sc, 0, sizeof *sc);
    sc->max_ws = -1;
    sc->top_ws = 1;
    jz_node any = {.types = JZ_T_ALL, .items = JZ_ANY, .additional = JZ_ANY};
    if (add_node(sc, &any) != JZ_ANY) return oom();
    jz_schema_finish(sc);
    return K3C_OK;
}

void jz_schema_release(jz_schema *sc) {
    for (int i = 0; i < sc->n_blobs; i++) free(sc->blobs[i]);
    free(sc->blobs);
    free(sc->nodes);
    free(sc->props);
    free(sc->encs);
    memset(sc, 0, sizeof *sc);
}

int jz_schema_any_object(jz_schema *sc) {
    jz_node o = {.types = JZ_T_OBJ, .items = JZ_ANY, .additional = JZ_ANY};
    int i = add_node(sc, &o);
    if (i < 0) return oom(), -1;
    jz_schema_finish(sc);
    return i;
}

void jz_schema_finish(jz_schema *sc) {
    for (int i = 0; i < sc->n_nodes; i++) {
        jz_node *n = &sc->nodes[i];
        int best = 1 << 29;
        if (n->n_enums) {
            for (int e = 0; e < n->n_enums; e++)
                if ((int)sc->encs[n->enums + e].len < best) best = (int)sc->encs[n->enums + e].len;
            n->min_len = best;
            continue;
        }
        for (int p = 0; p < n->n_props; p++) {
            jz_prop *q = &sc->props[n->props + p];
            q->cost = (int32_t)q->name.len + 3 + sc->nodes[q->node].min_len;
        }
        if (n->types & (JZ_T_INT | JZ_T_NUM)) best = 1;
        else if (n->types & (JZ_T_STR | JZ_T_ARR)) best = 2;
        if (n->types & JZ_T_OBJ) {
            int c = 2, k = 0;
            for (int p = 0; p < n->n_props; p++)
                if ((n->required >> p) & 1) c += sc->props[n->props + p].cost + (k++ ? 1 : 0);
            if (c < best) best = c;
        }
        if ((n->types & (JZ_T_NULL | JZ_T_BOOL)) && 4 < best) best = 4;
        n->min_len = best;
    }
}

/* ---- the compiler ---- */

typedef struct ctx {
    jz_schema *sc;
    int strict;
    char path[512];
} ctx;

static const char *const annotations[] = {"title", "description", "default", "examples", "format", "deprecated",
                                          "readOnly", "writeOnly", "$schema", "$id", "$comment", NULL};
static const char *const enforced[] = {"type", "properties", "required", "additionalProperties", "items", "enum",
                                       "const", NULL};

static int in(const char *const *list, const char *k) {
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

static int refuse(ctx *c, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return k3c_errorf("%s: %s", c->path, msg);
}

static int type_bits(ctx *c, const cJSON *t, uint8_t *out) {
    static const struct {
        const char *name;
        uint8_t bits;
    } names[] = {{"null", JZ_T_NULL}, {"boolean", JZ_T_BOOL}, {"integer", JZ_T_INT}, {"number", JZ_T_NUM | JZ_T_INT},
                 {"string", JZ_T_STR}, {"array", JZ_T_ARR},   {"object", JZ_T_OBJ}};
    *out = 0;
    const cJSON *it = cJSON_IsArray(t) ? t->child : t;
    for (; it; it = cJSON_IsArray(t) ? it->next : NULL) {
        if (!cJSON_IsString(it)) return refuse(c, "'type' must be a type name or a list of them%s", "");
        size_t i = 0;
        while (i < sizeof names / sizeof names[0] && strcmp(names[i].name, it->valuestring)) i++;
        if (i == sizeof names / sizeof names[0])
            return refuse(c, "'type' '%s' is not a JSON Schema type (null, boolean, integer, number, string, "
                             "array, object)", it->valuestring);
        *out |= names[i].bits;
    }
    if (!*out) return refuse(c, "'type' is an empty list: no value satisfies it%s", "");
    return K3C_OK;
}

/* Well-formed UTF-8 (Unicode Table 3-7), what the automaton's strings take. */
static int utf8_ok(const char *s) {
    const uint8_t *p = (const uint8_t *)s;
    while (*p) {
        uint8_t b = *p;
        if (b < 0x80) {
            p++;
            continue;
        }
        int need = b >= 0xC2 && b <= 0xDF ? 1 : b >= 0xE0 && b <= 0xEF ? 2 : b >= 0xF0 && b <= 0xF4 ? 3 : -1;
        if (need < 0) return 0;
        uint8_t lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80, hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;
        for (int k = 1; k <= need; k++, lo = 0x80, hi = 0xBF)
            if (p[k] < lo || p[k] > hi) return 0;
        p += need + 1;
    }
    return 1;
}

/* A name the automaton can match as a key: well-formed UTF-8 without '"', '\' or control characters. */
static int keyable(const char *s) {
    for (const uint8_t *p = (const uint8_t *)s; *p; p++)
        if (*p < 0x20 || *p == '"' || *p == '\\') return 0;
    return utf8_ok(s);
}

/* The compact JSON encoding of a scalar (strings with the fewest escapes, other characters as they are);
 * 0 and nothing written for containers. */
static int encode_scalar(const cJSON *v, char **out, size_t *len) {
    *out = NULL;
    if (cJSON_IsString(v)) {
        const char *s = v->valuestring;
        if (!utf8_ok(s)) return 0;
        size_t n = strlen(s), k = 0;
        char *b = malloc(6 * n + 3);
        if (!b) return -1;
        b[k++] = '"';
        for (const uint8_t *p = (const uint8_t *)s; *p; p++) {
            static const char esc[] = "\"\"\\\\\bb\ff\nn\rr\tt";
            const char *e = *p ? memchr(esc, *p, sizeof esc - 1) : NULL;
            if (e && (e - esc) % 2 == 0) {
                b[k++] = '\\';
                b[k++] = e[1];
            } else if (*p < 0x20) {
                k += (size_t)sprintf(b + k, "\\u%04x", *p);
            } else {
                b[k++] = (char)*p;
            }
        }
        b[k++] = '"';
        *out = b;
        *len = k;
        return 1;
    }
    if (cJSON_IsNumber(v) || cJSON_IsBool(v) || cJSON_IsNull(v)) {
        char *p = cJSON_PrintUnformatted(v);
        if (!p) return -1;
        *out = p;
        *len = strlen(p);
        return 1;
    }
    return 0;
}

static uint8_t scalar_type(const cJSON *v) {
    if (cJSON_IsString(v)) return JZ_T_STR;
    if (cJSON_IsBool(v)) return JZ_T_BOOL;
    if (cJSON_IsNull(v)) return JZ_T_NULL;
    if (cJSON_IsNumber(v)) return fabs(v->valuedouble) < 1e15 && v->valuedouble == floor(v->valuedouble) ? JZ_T_INT : JZ_T_NUM;
    return 0;
}

typedef struct pending_prop {
    const char *name;
    int node;
    int required;
} pending_prop;

static int cmp_bytes(const uint8_t *a, uint32_t la, const uint8_t *b, uint32_t lb) {
    int c = memcmp(a, b, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

static int cmp_prop(const void *x, const void *y) {
    const pending_prop *a = x, *b = y;
    return cmp_bytes((const uint8_t *)a->name, (uint32_t)strlen(a->name), (const uint8_t *)b->name,
                     (uint32_t)strlen(b->name));
}

static int cmp_enc(const void *x, const void *y) {
    const jz_bytes *a = x, *b = y;
    return cmp_bytes(a->s, a->len, b->s, b->len);
}

static int compile_node(ctx *c, const cJSON *s, int depth, int *out);

/* path + "." + part (or "[i]"), restored by the caller. */
static size_t path_push(ctx *c, const char *fmt, const char *part) {
    size_t at = strlen(c->path);
    snprintf(c->path + at, sizeof c->path - at, fmt, part);
    return at;
}

static int compile_child(ctx *c, const cJSON *s, int depth, const char *fmt, const char *part, int *out) {
    size_t at = path_push(c, fmt, part);
    int rc = compile_node(c, s, depth, out);
    if (rc == K3C_OK) c->path[at] = 0;
    return rc;
}

static int compile_enum(ctx *c, const cJSON *s, uint8_t types, jz_node *n, int *dropped) {
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(s, "enum"), *k = cJSON_GetObjectItemCaseSensitive(s, "const");
    *dropped = 0;
    if (!e && !k) return K3C_OK;
    if (e && !cJSON_IsArray(e)) return refuse(c, "'enum' must be an array%s", "");
    int cnt = 0;
    jz_bytes *tmp = malloc(sizeof *tmp * (size_t)(e ? cJSON_GetArraySize(e) + 1 : 1));
    if (!tmp) return oom();
    const cJSON *it = e ? e->child : k;
    for (; it; it = e ? it->next : NULL) {
        uint8_t t = scalar_type(it);
        char *enc = NULL;
        size_t len = 0;
        int er = t ? encode_scalar(it, &enc, &len) : 0;
        if (er < 0) {
            free(tmp);
            return oom();
        }
        if (!er) {
            free(tmp);
            if (c->strict) return refuse(c, "'%s' holds an array, an object or ill-formed UTF-8: k3c enforces "
                                            "scalar enum values only",
                                         e ? "enum" : "const");
            *dropped = 1;
            return K3C_OK;
        }
        if (!(types & (t == JZ_T_INT ? JZ_T_INT | JZ_T_NUM : t))) { /* not of the schema's type */
            free(enc);
            continue;
        }
        const uint8_t *b = blob(c->sc, enc, len);
        free(enc);
        if (!b) {
            free(tmp);
            return oom();
        }
        tmp[cnt++] = (jz_bytes){b, (uint32_t)len};
    }
    if (!cnt) {
        free(tmp);
        return refuse(c, "'%s' leaves no value of the schema's type: nothing satisfies it", e ? "enum" : "const");
    }
    qsort(tmp, (size_t)cnt, sizeof *tmp, cmp_enc);
    int u = 0; /* equal values once (sorted: next to each other) */
    for (int i = 0; i < cnt; i++)
        if (!u || cmp_enc(&tmp[u - 1], &tmp[i])) tmp[u++] = tmp[i];
    cnt = u;
    int ok = 1;
    for (int i = 0; i < cnt && ok; i++) {
        ok = GROW(c->sc->encs, c->sc->n_encs, c->sc->cap_encs);
        if (ok) c->sc->encs[c->sc->n_encs++] = tmp[i];
    }
    free(tmp);
    if (!ok) return oom();
    n->enums = c->sc->n_encs - cnt;
    n->n_enums = cnt;
    return K3C_OK;
}

static int compile_object(ctx *c, const cJSON *s, int depth, jz_node *n) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return refuse(c, "'properties' must be an object%s", "");
    if (req && !cJSON_IsArray(req)) return refuse(c, "'required' must be an array of names%s", "");
    n->additional = JZ_ANY;
    if (cJSON_IsFalse(add)) n->additional = -1;
    else if (add && !cJSON_IsTrue(add) && compile_child(c, add, depth + 1, ".%s", "additionalProperties", &n->additional))
        return K3C_ERR;
    int np = props ? cJSON_GetArraySize(props) : 0, nr = req ? cJSON_GetArraySize(req) : 0;
    pending_prop *pp = calloc((size_t)(np + nr + 1), sizeof *pp);
    if (!pp) return oom();
    int cnt = 0, matchable = 1, rc = K3C_OK;
    for (const cJSON *p = props ? props->child : NULL; p && rc == K3C_OK; p = p->next) {
        for (int i = 0; i < cnt; i++)
            if (!strcmp(pp[i].name, p->string)) rc = refuse(c, "'properties' names '%s' twice", p->string);
        if (rc == K3C_OK) rc = compile_child(c, p, depth + 1, ".properties.%s", p->string, &pp[cnt].node);
        if (rc == K3C_OK) pp[cnt++].name = p->string;
    }
    for (const cJSON *r = req ? req->child : NULL; r && rc == K3C_OK; r = r->next) {
        if (!cJSON_IsString(r)) {
            rc = refuse(c, "'required' must be an array of names%s", "");
            break;
        }
        int i = 0;
        while (i < cnt && strcmp(pp[i].name, r->valuestring)) i++;
        if (i == cnt) {
            if (n->additional < 0) {
                rc = refuse(c, "'required' names '%s', which is not in 'properties' while additionalProperties is "
                               "false: nothing satisfies it", r->valuestring);
                break;
            }
            pp[cnt++] = (pending_prop){r->valuestring, n->additional, 0};
        }
        pp[i].required = 1;
    }
    if (rc == K3C_OK) {
        matchable = cnt <= JZ_MAX_PROPS;
        for (int i = 0; i < cnt && matchable; i++) matchable = keyable(pp[i].name);
        if (!matchable && c->strict)
            rc = refuse(c, "%s", cnt > JZ_MAX_PROPS ? "more properties than the 64 k3c matches"
                                                     : "a property name holds '\"', '\\', a control character or "
                                                       "ill-formed UTF-8, which k3c does not match");
    }
    if (rc == K3C_OK && !matchable) { /* lenient: any object */
        n->additional = JZ_ANY;
        cnt = 0;
    }
    if (rc == K3C_OK && cnt) {
        qsort(pp, (size_t)cnt, sizeof *pp, cmp_prop);
        n->props = c->sc->n_props;
        for (int i = 0; i < cnt && rc == K3C_OK; i++) {
            size_t len = strlen(pp[i].name);
            const uint8_t *b = blob(c->sc, pp[i].name, len);
            if (!b || !GROW(c->sc->props, c->sc->n_props, c->sc->cap_props)) {
                rc = oom();
                break;
            }
            c->sc->props[c->sc->n_props++] = (jz_prop){{b, (uint32_t)len}, pp[i].node, 0, pp[i].required};
            if (pp[i].required) n->required |= 1ull << i;
        }
        n->n_props = cnt;
    }
    n->keyed = rc == K3C_OK && (cnt > 0 || n->additional < 0);
    free(pp);
    return rc;
}

static int compile_node(ctx *c, const cJSON *s, int depth, int *out) {
    if (depth >= JZ_MAX_DEPTH) return refuse(c, "the schema nests deeper than %s levels", "32");
    if (cJSON_IsTrue(s)) {
        *out = JZ_ANY;
        return K3C_OK;
    }
    if (cJSON_IsFalse(s)) return refuse(c, "the schema is false: nothing satisfies it%s", "");
    if (!cJSON_IsObject(s)) return refuse(c, "a schema must be an object or a boolean%s", "");
    for (const cJSON *k = s->child; k; k = k->next)
        if (!in(annotations, k->string) && !in(enforced, k->string) && c->strict)
            return refuse(c, "'%s' is not supported: k3c enforces type, properties, required, additionalProperties, "
                             "items, enum and const (annotations such as description are ignored)", k->string);
    jz_node n = {.types = JZ_T_ALL, .items = JZ_ANY, .additional = JZ_ANY};
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (t) {
        K3C_TRY(type_bits(c, t, &n.types));
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        n.types = JZ_T_OBJ;
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items")) {
        n.types = JZ_T_ARR;
    }
    int dropped;
    K3C_TRY(compile_enum(c, s, n.types, &n, &dropped));
    if (!n.n_enums) {
        if (n.types & JZ_T_OBJ) K3C_TRY(compile_object(c, s, depth, &n));
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        if ((n.types & JZ_T_ARR) && items) {
            if (cJSON_IsFalse(items) && !c->strict) items = NULL; /* lenient: not enforced */
            if (items && compile_child(c, items, depth + 1, ".%s", "items", &n.items)) return K3C_ERR;
        }
    }
    int i = add_node(c->sc, &n);
    if (i < 0) return oom();
    *out = i;
    return K3C_OK;
}

int jz_compile(jz_schema *sc, const cJSON *schema, int strict, const char *what, int *root) {
    *root = -1;
    if (!schema || cJSON_IsNull(schema)) {
        int r = jz_schema_any_object(sc);
        if (r < 0) return K3C_ERR;
        *root = r;
        return K3C_OK;
    }
    ctx c = {.sc = sc, .strict = strict};
    snprintf(c.path, sizeof c.path, "%s", what);
    int r;
    K3C_TRY(compile_node(&c, schema, 0, &r));
    if (r == JZ_ANY) {
        r = jz_schema_any_object(sc);
        if (r < 0) return K3C_ERR;
    }
    jz_node *n = &sc->nodes[r];
    if (!(n->types & JZ_T_OBJ) || n->n_enums)
        return k3c_errorf("%s: the schema's root must be an object schema (type object)", what);
    if (n->types != JZ_T_OBJ) {
        /* an untyped root with object keywords: make it the object part alone */
        n->types = JZ_T_OBJ;
    }
    jz_schema_finish(sc);
    *root = r;
    return K3C_OK;
}
