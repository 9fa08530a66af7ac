/* k3c synth --preset NAME --out DIR [--seed N]: writes a synthetic checkpoint of a built-in preset. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/synth.h"
#include "util/error.h"

static void synth_usage(FILE *f) {
    fprintf(f, "usage: k3c synth --preset NAME --out DIR [--seed N]\npresets:");
    for (const char *const *p = k3c_preset_names(); p && *p; p++)
        fprintf(f, " %s%s", *p, k3c_preset_has_weights(*p) ? "" : " (config only)");
    fprintf(f, "\n");
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *seed_str = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            synth_usage(stdout);
            return 0;
        } else if ((v = cli_option(argc, argv, &i, "--preset"))) {
            preset = v;
        } else if ((v = cli_option(argc, argv, &i, "--out"))) {
            out = v;
        } else if ((v = cli_option(argc, argv, &i, "--seed"))) {
            seed_str = v;
        } else {
            fprintf(stderr, "k3c synth: unexpected argument '%s' (or missing value)\n", argv[i]);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!preset || !out) {
        fprintf(stderr, "k3c synth: --preset and --out are required\n");
        synth_usage(stderr);
        return 2;
    }
    uint64_t seed = 0;
    if (seed_str) {
        char *end;
        errno = 0;
        seed = strtoull(seed_str, &end, 0);
        if (errno || *end || !*seed_str || seed_str[0] == '-') {
            fprintf(stderr, "k3c synth: --seed: '%s' is not an unsigned integer\n", seed_str);
            return 2;
        }
    }
    k3c_config c;
    if (k3c_preset_config(preset, &c) != K3C_OK) {
        fprintf(stderr, "k3c synth: %s\n", k3c_error_message());
        return 1;
    }
    int rc = k3c_synth_write(&c, preset, seed, out);
    k3c_config_free(&c);
    if (rc != K3C_OK) {
        fprintf(stderr, "k3c synth: %s\n", k3c_error_message());
        return 1;
    }
    if (!k3c_preset_has_weights(preset))
        printf("note: preset %s has no weights on disk (a benchmark or full-size preset: benchmarks generate its "
               "weights in device memory); wrote %s/config.json and the tokenizer only\n",
               preset, out);
    else
        printf("wrote preset %s (seed %" PRIu64 ") to %s\n", preset, seed, out);
    return 0;
}
