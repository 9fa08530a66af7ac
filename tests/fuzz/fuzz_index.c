/* libFuzzer target: the input is a model.safetensors.index.json. The parser must never crash or leak, and
 * what it accepts must be a sorted, duplicate-free name table whose files are all valid, distinct names. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/checkpoint.h"
#include "util/error.h"

#define REQUIRE(c)                                                                                                 \
    do {                                                                                                           \
        if (!(c)) __builtin_trap();                                                                                \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    k3c_index ix;
    if (k3c_index_parse((const char *)data, size, "fuzz", &ix) != K3C_OK) {
        REQUIRE(ix.names == NULL && ix.shard_files == NULL && ix.num_names == 0);
        REQUIRE(strstr(k3c_error_message(), "fuzz") != NULL);
        return 0;
    }
    REQUIRE(ix.num_names > 0 && ix.num_shards > 0);
    for (size_t i = 0; i < ix.num_names; i++) {
        REQUIRE(ix.names[i] && ix.names[i][0]);
        REQUIRE(i == 0 || strcmp(ix.names[i - 1], ix.names[i]) < 0);
        REQUIRE(ix.shard_of[i] >= 0 && ix.shard_of[i] < ix.num_shards);
    }
    for (int s = 0; s < ix.num_shards; s++) {
        const char *f = ix.shard_files[s];
        REQUIRE(f[0] && !strchr(f, '/') && !strstr(f, ".."));
        for (int r = 0; r < s; r++) REQUIRE(strcmp(ix.shard_files[r], f) != 0);
    }
    k3c_index_free(&ix);
    return 0;
}
