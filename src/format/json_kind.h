/* Helpers of the parsers of untrusted JSON (safetensors headers, the index): the kind of a value for
 * "expected X, got Y" messages, and exact integer reading. */
#ifndef K3C_FORMAT_JSON_KIND_H
#define K3C_FORMAT_JSON_KIND_H

#include <cjson/cJSON.h>
#include <stdint.h>

/* "an object", "a string", ..., "nothing" for NULL. */
const char *k3c_json_kind(const cJSON *v);

/* 1 and *out when v is a non-negative integer number exactly representable in a double (<= 2^53: cJSON
 * keeps numbers as doubles, so larger ones would silently lose precision); 0 otherwise. */
int k3c_json_exact_u64(const cJSON *v, uint64_t *out);

#endif
