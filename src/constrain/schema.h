/* JSON Schema -> jz_schema nodes (constrain/json.h), for tool parameters and response_format json_schema.
 *
 * Enforced: `type` (a name or a list of them), `properties`, `required`, `additionalProperties` (a boolean
 * or a schema), `items` (a schema), `enum` and `const` of scalar values. Annotations are read and ignored:
 * title, description, default, examples, format, deprecated, readOnly, writeOnly, $schema, $id, $comment.
 * Anything else (anyOf, $ref, pattern, minimum, minLength, ...) is refused in strict mode with the path of
 * the keyword; in lenient mode it is not enforced (the rest of that schema still is). An object whose
 * properties cannot be matched (more than JZ_MAX_PROPS, or a name holding '"', '\', a control character or
 * ill-formed UTF-8) is refused in strict mode and taken as any object in lenient mode. Unsatisfiable
 * schemas (false, an empty enum, a required key that no property or additional key can be) are refused in
 * both. */
#ifndef K3C_CONSTRAIN_SCHEMA_H
#define K3C_CONSTRAIN_SCHEMA_H

#include <cjson/cJSON.h>

#include "constrain/json.h"

/* schema NULL: any object. `what` names the schema in messages ("response_format.json_schema.schema",
 * "tools[0].function.parameters"). The root must take objects (an untyped root is made an object schema). */
int jz_compile(jz_schema *sc, const cJSON *schema, int strict, const char *what, int *root);

#endif
