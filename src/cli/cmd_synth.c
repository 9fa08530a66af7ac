/* k3c synth --preset NAME --out DIR [--seed N] [--threads N]: writes a synthetic checkpoint of a built-in
 * preset, on all cores (the files do not depend on the thread count), with a progress line on stderr. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "model/config.h"
#include "model/presets.h"
#include "model/synth.h"
#include "util/error.h"

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

void cli_synth_progress_init(cli_synth_meter *p, const char *what) {
    p->what = what;
    p->t0 = mono_s();
    p->last = p->t0;
    p->tty = isatty(2);
    p->shown = 0;
}

/* On a terminal one line rewritten at most 5 times a second; elsewhere a line every 2 s. Runs shorter than a
 * second print nothing. */
void cli_synth_progress(void *ctx, uint64_t done, uint64_t total) {
    cli_synth_meter *p = ctx;
    double now = mono_s(), frac = total ? (double)done / total : 1;
    int last = done >= total;
    if (now - p->t0 < 1.0 && !p->shown) return;
    if (!last && now - p->last < (p->tty ? 0.2 : 2.0)) return;
    p->last = now;
    p->shown = 1;
    fprintf(stderr, "%s%s: %.1f of %.1f MB (%3d%%) in %.1f s%s", p->tty ? "\r" : "", p->what, done / 1e6,
            total / 1e6, (int)(100 * frac), now - p->t0, p->tty && !last ? "" : "\n");
    fflush(stderr);
}

static void synth_usage(FILE *f) {
    fprintf(f, "usage: k3c synth --preset NAME --out DIR [--seed N] [--threads N (0 = all cores)]\npresets:");
    for (const char *const *p = k3c_preset_names(); p && *p; p++)
        fprintf(f, " %s%s", *p, k3c_preset_has_weights(*p) ? "" : " (config only)");
    fprintf(f, "\n");
}

int cmd_synth(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *seed_str = NULL;
    long threads = 0;
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
        } else if ((v = cli_option(argc, argv, &i, "--threads"))) {
            if (cli_parse_int(v, 0, 4096, &threads) != 0) {
                fprintf(stderr, "k3c synth: --threads: '%s' is not an integer in 0..4096\n", v);
                return 2;
            }
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
    char what[128];
    snprintf(what, sizeof what, "synth %s", preset);
    cli_synth_meter prog;
    cli_synth_progress_init(&prog, what);
    k3c_synth_options so = {.threads = (int)threads, .progress = cli_synth_progress, .progress_ctx = &prog};
    int rc = k3c_synth_write_opts(&c, preset, seed, out, &so);
    k3c_config_free(&c);
    if (rc != K3C_OK) {
        fprintf(stderr, "k3c synth: %s\n", k3c_error_message());
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
