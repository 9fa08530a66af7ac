/* libFuzzer target: the input is a whole safetensors file image (8-byte little-endian header length, header
 * JSON, data region). The header parser must never crash, leak or read out of bounds, and whatever it accepts
 * must satisfy the invariants the loader relies on. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"
#include "util/error.h"

#define REQUIRE(c)                                                                                                 \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen > size - 8) return 0;
    uint64_t region = size - 8 - hlen;
    k3c_st_header h;
    if (k3c_st_parse_header((const char *)data + 8, (size_t)hlen, region, "fuzz", &h) != K3C_OK) {
        REQUIRE(h.tensors == NULL && h.num_tensors == 0);
        REQUIRE(strstr(k3c_error_message(), "fuzz") != NULL);
        return 0;
    }
    uint64_t max_end = 0;
    for (size_t i = 0; i < h.num_tensors; i++) {
        const k3c_st_tensor *t = &h.tensors[i];
        REQUIRE(t->name && t->name[0]);
        REQUIRE(i == 0 || strcmp(h.tensors[i - 1].name, t->name) < 0);
        REQUIRE(k3c_st_header_find(&h, t->name) == t);
        REQUIRE(t->ndim >= 0 && t->ndim <= K3C_ST_MAX_DIMS);
        REQUIRE(k3c_dtype_size(t->dtype) > 0);
        REQUIRE(t->begin <= t->end && t->end <= region);
        REQUIRE(k3c_st_numel(t) * k3c_dtype_size(t->dtype) == t->end - t->begin);
        if (t->end > max_end) max_end = t->end;
        /* pairwise overlap is checked in O(n^2) here only because fuzz inputs are small */
        for (size_t j = 0; j < i; j++) {
            const k3c_st_tensor *u = &h.tensors[j];
            if (t->begin == t->end || u->begin == u->end) continue;
            REQUIRE(t->end <= u->begin || u->end <= t->begin);
        }
    }
    REQUIRE(h.data_size == max_end);
    k3c_st_header_free(&h);
    return 0;
}
