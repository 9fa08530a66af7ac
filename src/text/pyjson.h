/* JSON as Python's json module reads and writes it. The Kimi chat formats serialize tools, tool-call
 * arguments and schemas with Python's json.dumps (through Jinja's tojson or directly), so k3c must write the
 * same bytes: ", " / ": " separators (or compact), non-ASCII kept, Python's escapes, Python's number text
 * (an integer stays an integer, 1.0 stays "1.0", 1e-9 becomes "1e-09"), and the dict json.loads would build
 * (a duplicate key keeps its last value at its first place).
 *
 * cJSON keeps every number as a double, which loses the integer/float distinction Python keeps; so
 * k3c_pyjson_parse records each number's source literal in the item's `valuestring` (cJSON frees it with the
 * item and its printers ignore it). A number whose literal is missing or no longer matches its value (the
 * caller built or changed it) is written as an integer when it is integral and below 2^53, as a float
 * otherwise. */
#ifndef K3C_TEXT_PYJSON_H
#define K3C_TEXT_PYJSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "text/strbuf.h"

/* Parses len bytes (NUL not needed) as one JSON value followed only by whitespace, keeping number literals.
 * NULL and a k3c error naming `what` and the byte offset on a syntax error or a failed allocation. */
cJSON *k3c_pyjson_parse(const char *text, size_t len, const char *what);

/* Records number literals on a tree cJSON parsed from exactly `text` (what k3c_pyjson_parse does after
 * cJSON_ParseWithLengthOpts); for callers that parse the request body themselves. 0, or -1 when the text's
 * numbers do not line up with the tree's (the tree is then left as it was). */
int k3c_pyjson_keep_literals(cJSON *root, const char *text, size_t len);

enum {
    K3C_PYJSON_COMPACT = 1,   /* separators=(",", ":") */
    K3C_PYJSON_SORT_KEYS = 2, /* keys in code point order at every level (Kimi's deep_sort_dict) */
};

/* Appends json.dumps(v, ensure_ascii=False, ...) of the value json.loads would have built. */
void k3c_pyjson_dump(k3c_strbuf *b, const cJSON *v, int flags);

/* Appends the body of json.dumps(s) for n bytes of a string (no quotes): byte-local, so pieces escape alike. */
void k3c_pyjson_escape(k3c_strbuf *b, const char *s, size_t n);

/* Appends the number as json.dumps writes it (also Python's str() of that number). */
void k3c_pyjson_number(k3c_strbuf *b, const cJSON *v);

/* The members of an object in the order and with the values of the dict json.loads builds (duplicate keys
 * collapsed: first position, last value); SORT_KEYS orders them by key. A malloc'd array of *n pointers to
 * the members that carry the values (the caller frees it); NULL with *n = 0 for an empty object or when the
 * allocation failed (*failed set then). */
const cJSON **k3c_pyjson_items(const cJSON *obj, int flags, size_t *n, int *failed);

/* 1 when Python's s.strip() of these UTF-8 bytes is empty (str.isspace: Unicode White_Space plus the
 * separators U+001C..U+001F). */
int k3c_py_isblank(const char *s, size_t n);

#endif
