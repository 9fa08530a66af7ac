/* A synthetic checkpoint of any config.json (k3c synth takes built-in presets only), for benchmarks on
 * shapes no preset has (tools/llama-cpu-compare.sh):
 *   make NVCC= build/libk3c.a
 *   cc -O2 -std=gnu11 -Iinclude -Isrc tools/synth_config.c build/libk3c.a -lcjson -lpcre2-8 -lm -pthread \
 *      -o build/synth_config
 *   build/synth_config CONFIG_JSON SEED OUT_DIR [LAYERS VOCAB]
 * CONFIG_JSON may be preset:NAME (a built-in preset's config, also one without weights on disk, like
 * k3-slice); LAYERS and VOCAB cut the config to its first LAYERS layers and a vocabulary of VOCAB, the
 * bos / eos / pad ids then the default tokenizer's (a few-layer full-width slice, tools/gpu-multi.sh).
 * The weights are k3c synth's (model/synth.h: each tensor from (seed, tensor name), well conditioned); the
 * tokenizer is the default one sized to the vocabulary, so the config's bos / eos / pad must be its ids (a
 * mismatch is refused, naming them). Uses internal headers: a tool beside the engine, not an API user. */
#include <stdio.h>
#include <stdlib.h>

#include <string.h>

#include "format/config_json.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/synth.h"
#include "text/tokenizer.h"
#include "util/error.h"

int main(int argc, char **argv) {
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: %s CONFIG_JSON|preset:NAME SEED OUT_DIR [LAYERS VOCAB]\n", argv[0]);
        return 2;
    }
    char *end;
    unsigned long long seed = strtoull(argv[2], &end, 10);
    if (!*argv[2] || *end) {
        fprintf(stderr, "%s: SEED '%s' is not a non-negative integer\n", argv[0], argv[2]);
        return 2;
    }
    long layers = 0, vocab = 0;
    if (argc == 6) {
        layers = strtol(argv[4], &end, 10);
        if (!*argv[4] || *end || layers < 1) {
            fprintf(stderr, "%s: LAYERS '%s' is not a positive integer\n", argv[0], argv[4]);
            return 2;
        }
        vocab = strtol(argv[5], &end, 10);
        if (!*argv[5] || *end || vocab < 1 || vocab > (1L << 30)) {
            fprintf(stderr, "%s: VOCAB '%s' is not an integer in 1..2^30\n", argv[0], argv[5]);
            return 2;
        }
    }
    k3c_config c;
    int rc = strncmp(argv[1], "preset:", 7) ? k3c_config_load(argv[1], &c) : k3c_preset_config(argv[1] + 7, &c);
    if (rc != K3C_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], k3c_last_error());
        return 1;
    }
    int32_t bos, eos, pad;
    int have_ids = k3c_tokenizer_default_ids(c.family == K3C_FAMILY_K3, (int32_t)(vocab ? vocab : c.vocab_size),
                                             &bos, &eos, &pad);
    if (layers && have_ids) {
        if (layers < c.num_layers) c.num_layers = (int)layers;
        c.num_attn_res_blocks = k3c_config_attn_res_blocks(c.num_layers, c.attn_res_block_size);
        c.vocab_size = (int)vocab;
        c.bos_token_id = bos, c.eos_token_id = eos, c.pad_token_id = pad;
        rc = k3c_config_validate(&c);
    }
    if (rc == K3C_OK && !have_ids)
        rc = k3c_errorf("%s: vocab_size %d has no room for the default tokenizer", argv[1], c.vocab_size);
    else if (rc == K3C_OK && (c.bos_token_id != bos || c.eos_token_id != eos || c.pad_token_id != pad))
        rc = k3c_errorf("%s: bos / eos / pad ids %d / %d / %d, expected %d / %d / %d (the default tokenizer's for "
                        "vocab_size %d)",
                        argv[1], c.bos_token_id, c.eos_token_id, c.pad_token_id, bos, eos, pad, c.vocab_size);
    if (rc == K3C_OK) rc = k3c_synth_write(&c, NULL, seed, argv[3]);
    k3c_config_free(&c);
    if (rc != K3C_OK) {
        fprintf(stderr, "%s: %s\n", argv[0], k3c_last_error());
        return 1;
    }
    printf("wrote %s (seed %llu) to %s\n", argv[1], seed, argv[3]);
    return 0;
}
