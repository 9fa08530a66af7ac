/* k3c synth --preset NAME --out DIR [--seed N] [--threads N]: writes a synthetic checkpoint of a built-in
 * preset, on all cores (the files do not depend on the thread count), with a progress line on stderr. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

static void synth_usage(FILE *f) {
    fprintf(f, "usage: k3c synth --preset NAME --out DIR [--seed N] [--threads N]\npresets:");
    for (const char *const *p = k3c_preset_names(); p && *p; p++)
        fprintf(f, " %s%s", *p, k3c_preset_has_weights(*p) ? "" : " (config only)");
    fprintf(f, "\n--threads: generator threads (default: one per core; the bytes are the same for any count)\n");
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL;
    uint64_t seed = 0;
    long threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int bad = 0;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            synth_usage(stdout);
            return 0;
        } else if ((v = cli_option(argc, argv, &i, "--preset"))) bad = cli_str("--preset", preset = v);
        else if ((v = cli_option(argc, argv, &i, "--out"))) bad = cli_str("--out", out = v);
        else if ((v = cli_option(argc, argv, &i, "--seed"))) bad = cli_u64("--seed", v, &seed);
        else if ((v = cli_option(argc, argv, &i, "--threads"))) bad = cli_int("--threads", v, 0, 4096, &threads);
        else bad = cli_unexpected(argv[i]);
        if (bad) {
            fprintf(stderr, "k3c synth: %s\n", cli_error());
            synth_usage(stderr);
            return 2;
        }
    }
    if (!preset || !out) {
        fprintf(stderr, "k3c synth: --preset and --out are required\n");
        synth_usage(stderr);
        return 2;
    }
    if (k3c_synthesize_threads(preset, seed, out, (int)threads) != K3C_OK) {
        fprintf(stderr, "k3c synth: %s\n", cli_error());
        return 1;
    }
    if (!k3c_preset_has_weights(preset))
        printf("note: preset %s has no weights on disk (a benchmark or full-size preset: benchmarks generate its "
               "weights in device memory); wrote %s/config.json only\n",
               preset, out);
    else
        printf("wrote preset %s (seed %" PRIu64 ") to %s\n", preset, seed, out);
    return 0;
}
