/* libFuzzer target over the JSON Schema compiler and the JSON automaton (src/constrain/schema.c, json.c): a
 * schema comes from a client (response_format json_schema, tool parameters), the bytes from a model. The
 * first byte picks strict or lenient compiling, paired surrogates and the whitespace limit; the rest is the
 * schema's JSON text, a NUL, then a document. A schema must compile or be refused with an input error that
 * has a message, never crash or leak; a compiled one takes the document's bytes until it refuses one, and from
 * there the shortest completion must exist: bytes that each shorten jz_min_close by one, ending accepting
 * after exactly jz_min_close of them (the invariant constrained decoding's budget relies on). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "constrain/json.h"
#include "constrain/schema.h"
#include "util/error.h"

#define REQUIRE(c)                                                                                                 \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t flags = data[0];
    const uint8_t *body = data + 1, *nul = memchr(body, 0, size - 1);
    size_t schema_len = nul ? (size_t)(nul - body) : size - 1;
    const uint8_t *doc = nul ? nul + 1 : body + size - 1;
    size_t doc_len = (size_t)(data + size - doc);
    cJSON *schema = cJSON_ParseWithLength((const char *)body, schema_len);
    jz_schema sc;
    REQUIRE(jz_schema_init(&sc) == K3C_OK);
    sc.paired = flags & 2;
    sc.max_ws = flags & 4 ? 1 : -1;
    sc.top_ws = !(flags & 4);
    int root = -1;
    if (jz_compile(&sc, schema, flags & 1, "schema", &root) != K3C_OK) {
        REQUIRE(k3c_error_message()[0] && (k3c_error_kind_get() == K3C_ERROR_INPUT || k3c_error_kind_get() == K3C_ERROR_OOM));
        k3c_error_clear();
    } else {
        REQUIRE(root >= 0 && root < sc.n_nodes);
        jz_state st, t;
        jz_init(&st, root);
        for (size_t i = 0; i < doc_len; i++) {
            memcpy(&t, &st, jz_state_size(&st));
            if (!jz_step(&t, &sc, doc[i])) break;
            memcpy(&st, &t, jz_state_size(&t));
        }
        int u = jz_min_close(&st, &sc);
        REQUIRE(u >= 0 && u < (1 << 28));
        for (int steps = 0; !(u == 0 && jz_accepting(&st, &sc)); steps++) {
            REQUIRE(u > 0 && steps < 1 << 20);
            int found = 0;
            for (int b = 0; b < 256 && !found; b++) {
                memcpy(&t, &st, jz_state_size(&st));
                if (jz_step(&t, &sc, (uint8_t)b) && jz_min_close(&t, &sc) == u - 1) {
                    memcpy(&st, &t, jz_state_size(&t));
                    found = 1;
                }
            }
            REQUIRE(found);
            u--;
        }
    }
    jz_schema_release(&sc);
    cJSON_Delete(schema);
    return 0;
}
