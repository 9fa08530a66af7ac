/* The embedded default model (models/k3-fortune): written out byte for byte, loadable with its tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "k3c.h"
#include "test.h"
#include "util/error.h"

TEST(default_model_write_loads) {
    char dir[] = "/tmp/k3c-test-default-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECK_OK(k3c_default_model_write(dir));
    char cmd[256];
    snprintf(cmd, sizeof cmd, "cmp -s %s/config.json models/k3-fortune/config.json && cmp -s %s/tiktoken.model "
             "models/k3-fortune/tiktoken.model", dir, dir);
    CHECK(system(cmd) == 0);
    k3c_model *m = NULL;
    CHECK_OK(k3c_load(dir, &m));
    k3c_tokenizer *t = NULL;
    CHECK_OK(k3c_tokenizer_load(dir, &t));
    k3c_tokenizer_free(t);
    k3c_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
    CHECK(k3c_default_model_write("/nonexistent-k3c-dir") != K3C_OK);
}
