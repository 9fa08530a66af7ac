/* An incremental byte-level JSON pushdown automaton (RFC 8259) with an optional schema, for constrained
 * decoding: jz_step takes one byte at a time and refuses a byte exactly when no JSON text (of the schema)
 * starts with the bytes so far, so a prefix it admits can always be completed; jz_min_close says how many
 * bytes the shortest completion takes (a path of that length exists, and some next byte shortens it by
 * one), which lets a caller always finish inside a token budget.
 *
 * The state is a small header and a stack of containers (jz_frame, 16 bytes each): a caller that tries
 * candidate bytes copies jz_state_size() bytes of it, not the whole struct.
 *
 * What a schema enforces (jz_schema, compiled by schema.c): the value's JSON types, an object's properties
 * (their values' schemas), required properties (the object cannot close before they appear), whether other
 * keys are allowed (additionalProperties) and their values' schema, array items, enum / const values
 * (written in their compact encoding). Where a schema names properties, keys are written without escape
 * sequences (so the typed bytes are the key) and never twice. Integers are written without fraction or
 * exponent. Everything generated is valid JSON of the schema; not every valid text can be generated. */
#ifndef K3C_CONSTRAIN_JSON_H
#define K3C_CONSTRAIN_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JZ_MAX_DEPTH 32 /* containers open at once (a deeper '{' or '[' is refused) */
#define JZ_MAX_PROPS 64 /* properties of one object schema that are matched (a bit each in jz_frame.seen) */
#define JZ_ANY 0        /* node 0 of every schema: any JSON value */

enum {
    JZ_T_NULL = 1,
    JZ_T_BOOL = 2,
    JZ_T_INT = 4, /* an integer: -?(0|[1-9][0-9]*) */
    JZ_T_NUM = 8, /* any number (integers included) */
    JZ_T_STR = 16,
    JZ_T_ARR = 32,
    JZ_T_OBJ = 64,
    JZ_T_ALL = 127,
};

typedef struct jz_bytes {
    const uint8_t *s;
    uint32_t len;
} jz_bytes;

typedef struct jz_prop {
    jz_bytes name;   /* the key as typed (no quotes, no escapes) */
    int32_t node;    /* its value's schema */
    int32_t cost;    /* bytes of `"name":v` with v the shortest value */
    int required;
} jz_prop;

typedef struct jz_node {
    uint8_t types;          /* JZ_T_* the value may have */
    uint8_t keyed;          /* an object whose keys are matched against props */
    int32_t items;          /* array elements' node */
    int32_t props, n_props; /* jz_schema.props[props ..): sorted bytewise by name */
    uint64_t required;      /* bit i: props[props + i] must appear */
    int32_t additional;     /* value node of keys that are no property; -1: none allowed */
    int32_t enums, n_enums; /* n_enums > 0: the value is one of jz_schema.encs[enums ..) (sorted bytewise) */
    int32_t min_len;        /* bytes of the shortest value */
} jz_node;

typedef struct jz_schema {
    jz_node *nodes;
    int n_nodes, cap_nodes;
    jz_prop *props;
    int n_props, cap_props;
    jz_bytes *encs;
    int n_encs, cap_encs;
    uint8_t **blobs; /* the names' and encodings' bytes */
    int n_blobs, cap_blobs;
    int max_ws;      /* consecutive whitespace bytes allowed between tokens; -1: any number */
    int top_ws;      /* whitespace after the top-level value (before it: always, within max_ws) */
    /* \u escapes of surrogates only as pairs (a high half then a low half): RFC 8259 allows lone ones, but
     * what a parser makes of them is unpredictable (section 8.2) and cJSON, k3c's, refuses them */
    int paired;
} jz_schema;

typedef struct jz_frame {
    uint64_t seen;  /* object: the properties written so far */
    int32_t node;
    int16_t prop;   /* object: the member being written (-1: a key that is no property) */
    uint8_t obj;    /* 1 object, 0 array */
    uint8_t sub;    /* where in the container (json.c) */
} jz_frame;

typedef struct jz_state {
    uint8_t mode, sub, ws, depth;
    uint8_t u8need, u8lo, u8hi; /* UTF-8 continuation bytes still due, and the range of the next one */
    uint8_t lit;                /* literal (true / false / null); in a number: integers only; in a string:
                                 * the \u escape's surrogate state (json.c) */
    int32_t node;               /* the schema of the value being written */
    uint32_t pos, lo, hi;       /* literal / enum / key: bytes matched, candidates [lo, hi) */
    jz_frame f[JZ_MAX_DEPTH];
} jz_state;

/* A schema that takes any JSON value at node 0 (JZ_ANY); max_ws -1 and top_ws 1: RFC 8259 exactly. */
int jz_schema_init(jz_schema *sc);
void jz_schema_release(jz_schema *sc);
/* A node taking any object (keys unrestricted, values any). */
int jz_schema_any_object(jz_schema *sc);
/* Fills min_len and the properties' costs (call once, after the last node was added). */
void jz_schema_finish(jz_schema *sc);

void jz_init(jz_state *st, int root);
/* 1: b continues a text of the schema (st advanced); 0: it cannot (st is then undefined: step a copy). */
int jz_step(jz_state *st, const jz_schema *sc, uint8_t b);
/* The top-level value is complete and nothing but (allowed) whitespace may follow. */
int jz_done(const jz_state *st);
/* The bytes so far are a whole JSON text (a top-level number or enum value may still go on). */
int jz_accepting(const jz_state *st, const jz_schema *sc);
/* Bytes of the shortest completion (0 when accepting). */
int jz_min_close(const jz_state *st, const jz_schema *sc);
/* Bytes of st that matter (a copy of that many is the same state). */
static inline size_t jz_state_size(const jz_state *st) {
    return offsetof(jz_state, f) + (size_t)st->depth * sizeof(jz_frame);
}

#endif
