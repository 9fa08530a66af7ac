/* The default model: models/k3-fortune (a trained K3-architecture checkpoint, its README says how it was
 * made), embedded at build time (the Makefile makes this object depend on the files). The loader reads a
 * directory, so k3c_default_model_write writes the files out whole into one the caller owns. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "k3c.h"
#include "util/error.h"

__asm__(".section .rodata\n"
        ".global k3c_default_model_0\n"
        ".hidden k3c_default_model_0\n"
        ".global k3c_default_model_0_end\n"
        ".hidden k3c_default_model_0_end\n"
        ".global k3c_default_model_1\n"
        ".hidden k3c_default_model_1\n"
        ".global k3c_default_model_1_end\n"
        ".hidden k3c_default_model_1_end\n"
        ".global k3c_default_model_2\n"
        ".hidden k3c_default_model_2\n"
        ".global k3c_default_model_2_end\n"
        ".hidden k3c_default_model_2_end\n"
        ".global k3c_default_model_3\n"
        ".hidden k3c_default_model_3\n"
        ".global k3c_default_model_3_end\n"
        ".hidden k3c_default_model_3_end\n"
        ".global k3c_default_model_4\n"
        ".hidden k3c_default_model_4\n"
        ".global k3c_default_model_4_end\n"
        ".hidden k3c_default_model_4_end\n"
        ".global k3c_default_model_5\n"
        ".hidden k3c_default_model_5\n"
        ".global k3c_default_model_5_end\n"
        ".hidden k3c_default_model_5_end\n"
        ".global k3c_default_model_6\n"
        ".hidden k3c_default_model_6\n"
        ".global k3c_default_model_6_end\n"
        ".hidden k3c_default_model_6_end\n"
        ".global k3c_default_model_7\n"
        ".hidden k3c_default_model_7\n"
        ".global k3c_default_model_7_end\n"
        ".hidden k3c_default_model_7_end\n"
        ".global k3c_default_model_8\n"
        ".hidden k3c_default_model_8\n"
        ".global k3c_default_model_8_end\n"
        ".hidden k3c_default_model_8_end\n"
        ".global k3c_default_model_9\n"
        ".hidden k3c_default_model_9\n"
        ".global k3c_default_model_9_end\n"
        ".hidden k3c_default_model_9_end\n"
        ".global k3c_default_model_10\n"
        ".hidden k3c_default_model_10\n"
        ".global k3c_default_model_10_end\n"
        ".hidden k3c_default_model_10_end\n"
        ".global k3c_default_model_11\n"
        ".hidden k3c_default_model_11\n"
        ".global k3c_default_model_11_end\n"
        ".hidden k3c_default_model_11_end\n"
        ".global k3c_default_model_12\n"
        ".hidden k3c_default_model_12\n"
        ".global k3c_default_model_12_end\n"
        ".hidden k3c_default_model_12_end\n"
        ".global k3c_default_model_13\n"
        ".hidden k3c_default_model_13\n"
        ".global k3c_default_model_13_end\n"
        ".hidden k3c_default_model_13_end\n"
        ".balign 16\n"
        "k3c_default_model_0:\n"
        ".incbin \"models/k3-fortune/config.json\"\n"
        "k3c_default_model_0_end:\n"
        ".balign 16\n"
        "k3c_default_model_1:\n"
        ".incbin \"models/k3-fortune/model-00001-of-000010.safetensors\"\n"
        "k3c_default_model_1_end:\n"
        ".balign 16\n"
        "k3c_default_model_2:\n"
        ".incbin \"models/k3-fortune/model-00002-of-000010.safetensors\"\n"
        "k3c_default_model_2_end:\n"
        ".balign 16\n"
        "k3c_default_model_3:\n"
        ".incbin \"models/k3-fortune/model-00003-of-000010.safetensors\"\n"
        "k3c_default_model_3_end:\n"
        ".balign 16\n"
        "k3c_default_model_4:\n"
        ".incbin \"models/k3-fortune/model-00004-of-000010.safetensors\"\n"
        "k3c_default_model_4_end:\n"
        ".balign 16\n"
        "k3c_default_model_5:\n"
        ".incbin \"models/k3-fortune/model-00005-of-000010.safetensors\"\n"
        "k3c_default_model_5_end:\n"
        ".balign 16\n"
        "k3c_default_model_6:\n"
        ".incbin \"models/k3-fortune/model-00006-of-000010.safetensors\"\n"
        "k3c_default_model_6_end:\n"
        ".balign 16\n"
        "k3c_default_model_7:\n"
        ".incbin \"models/k3-fortune/model-00007-of-000010.safetensors\"\n"
        "k3c_default_model_7_end:\n"
        ".balign 16\n"
        "k3c_default_model_8:\n"
        ".incbin \"models/k3-fortune/model-00008-of-000010.safetensors\"\n"
        "k3c_default_model_8_end:\n"
        ".balign 16\n"
        "k3c_default_model_9:\n"
        ".incbin \"models/k3-fortune/model-00009-of-000010.safetensors\"\n"
        "k3c_default_model_9_end:\n"
        ".balign 16\n"
        "k3c_default_model_10:\n"
        ".incbin \"models/k3-fortune/model-00010-of-000010.safetensors\"\n"
        "k3c_default_model_10_end:\n"
        ".balign 16\n"
        "k3c_default_model_11:\n"
        ".incbin \"models/k3-fortune/model.safetensors.index.json\"\n"
        "k3c_default_model_11_end:\n"
        ".balign 16\n"
        "k3c_default_model_12:\n"
        ".incbin \"models/k3-fortune/tiktoken.model\"\n"
        "k3c_default_model_12_end:\n"
        ".balign 16\n"
        "k3c_default_model_13:\n"
        ".incbin \"models/k3-fortune/tokenizer_config.json\"\n"
        "k3c_default_model_13_end:\n"
        ".previous\n");
extern const char k3c_default_model_0[], k3c_default_model_0_end[], k3c_default_model_1[], k3c_default_model_1_end[], k3c_default_model_2[], k3c_default_model_2_end[], k3c_default_model_3[], k3c_default_model_3_end[], k3c_default_model_4[], k3c_default_model_4_end[], k3c_default_model_5[], k3c_default_model_5_end[], k3c_default_model_6[], k3c_default_model_6_end[], k3c_default_model_7[], k3c_default_model_7_end[], k3c_default_model_8[], k3c_default_model_8_end[], k3c_default_model_9[], k3c_default_model_9_end[], k3c_default_model_10[], k3c_default_model_10_end[], k3c_default_model_11[], k3c_default_model_11_end[], k3c_default_model_12[], k3c_default_model_12_end[], k3c_default_model_13[], k3c_default_model_13_end[];

typedef struct embedded_file {
    const char *name;
    const char *begin, *end;
} embedded_file;

static const embedded_file files[] = {
    {"config.json", k3c_default_model_0, k3c_default_model_0_end},
    {"model-00001-of-000010.safetensors", k3c_default_model_1, k3c_default_model_1_end},
    {"model-00002-of-000010.safetensors", k3c_default_model_2, k3c_default_model_2_end},
    {"model-00003-of-000010.safetensors", k3c_default_model_3, k3c_default_model_3_end},
    {"model-00004-of-000010.safetensors", k3c_default_model_4, k3c_default_model_4_end},
    {"model-00005-of-000010.safetensors", k3c_default_model_5, k3c_default_model_5_end},
    {"model-00006-of-000010.safetensors", k3c_default_model_6, k3c_default_model_6_end},
    {"model-00007-of-000010.safetensors", k3c_default_model_7, k3c_default_model_7_end},
    {"model-00008-of-000010.safetensors", k3c_default_model_8, k3c_default_model_8_end},
    {"model-00009-of-000010.safetensors", k3c_default_model_9, k3c_default_model_9_end},
    {"model-00010-of-000010.safetensors", k3c_default_model_10, k3c_default_model_10_end},
    {"model.safetensors.index.json", k3c_default_model_11, k3c_default_model_11_end},
    {"tiktoken.model", k3c_default_model_12, k3c_default_model_12_end},
    {"tokenizer_config.json", k3c_default_model_13, k3c_default_model_13_end},
};

int k3c_default_model_write(const char *dir) {
    if (!dir) return k3c_errorf("k3c_default_model_write: NULL directory");
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[4096];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, files[i].name) >= sizeof path)
            return k3c_errorf("default model: directory path too long: %.80s...", dir);
        FILE *f = fopen(path, "wb");
        if (!f) return k3c_errorf("cannot create %s: %s", path, strerror(errno));
        size_t len = (size_t)(files[i].end - files[i].begin);
        int bad = fwrite(files[i].begin, 1, len, f) != len || fflush(f) != 0;
        if (fclose(f) != 0 || bad) {
            remove(path);
            return k3c_errorf("writing %s failed", path);
        }
    }
    return K3C_OK;
}
