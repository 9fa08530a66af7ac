/* k3c_read_file: contents and length exact (NUL after the last byte), refusals named by path. */
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "util/error.h"
#include "util/file.h"
#include "util/rng.h"

#define CHECK_REFUSED(expr, sub)                                                                                   \
    do {                                                                                                           \
        k3c_error_clear();                                                                                         \
        CHECKF((expr) == K3C_ERR, "%s unexpectedly succeeded", #expr);                                             \
        CHECKF(strstr(k3c_error_message(), sub) && strstr(k3c_error_message(), path), "message \"%s\" lacks \"%s\" " \
               "or the path", k3c_error_message(), sub);                                                           \
        CHECK(out == NULL && len == 7);                                                                            \
    } while (0)

TEST(util_read_file) {
    k3c_rng r;
    k3c_rng_seed(&r, test_seed() ^ 0xf11e);
    char path[1024];
    snprintf(path, sizeof path, "%s/read_file.bin", test_tmpdir());
    /* random bytes (NULs included) of a random length, and the empty file */
    size_t n = 1 + (size_t)(k3c_rng_uniform(&r) * 5000);
    for (int empty = 0; empty < 2; empty++) {
        size_t want = empty ? 0 : n;
        unsigned char *data = malloc(want + 1);
        for (size_t i = 0; i < want; i++) data[i] = (unsigned char)(k3c_rng_uniform(&r) * 256);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(data, 1, want, f) == want);
        fclose(f);
        char *out = NULL;
        size_t len = 7;
        CHECK(k3c_read_file(path, want, &out, &len) == K3C_OK);
        CHECKF(len == want && memcmp(out, data, want) == 0 && out[want] == 0, "len %zu of %zu", len, want);
        free(out);
        out = NULL;
        len = 7;
        if (want > 0) CHECK_REFUSED(k3c_read_file(path, want - 1, &out, &len), "larger than");
        free(data);
    }
    char *out = NULL;
    size_t len = 7;
    snprintf(path, sizeof path, "%s/read_file_missing", test_tmpdir());
    CHECK_REFUSED(k3c_read_file(path, 100, &out, &len), "No such file");
    snprintf(path, sizeof path, "%s", test_tmpdir());
    CHECK_REFUSED(k3c_read_file(path, 100, &out, &len), "not a regular file");
}
