/* Names the kind of a JSON value for "expected X, got Y" messages of the parsers of untrusted JSON
 * (safetensors headers, the index). */
#ifndef K3C_FORMAT_JSON_KIND_H
#define K3C_FORMAT_JSON_KIND_H

#include <cjson/cJSON.h>

/* "an object", "a string", ..., "nothing" for NULL. */
const char *k3c_json_kind(const cJSON *v);

#endif
