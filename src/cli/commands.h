/* Subcommands of the k3c CLI. Each takes argv starting at its own name and returns the exit status. */
#ifndef K3C_CLI_COMMANDS_H
#define K3C_CLI_COMMANDS_H

int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv);

/* ---- helpers of the commands that run the model (cli_run.c) ---- */
#include <stdint.h>

#include "k3c.h"

/* --name VALUE or --name=VALUE at argv[*i]: the value (advancing *i past a separate one), else NULL. */
const char *cli_option(int argc, char **argv, int *i, const char *name);
int cli_parse_int(const char *s, long lo, long hi, long *out);       /* 0 or -1 */
int cli_parse_float(const char *s, double *out);                     /* 0 or -1 */
/* "1,2,3" -> malloc'd ids (non-negative); 0 or -1 on a malformed list. */
int cli_parse_ids(const char *s, int32_t **ids, int *n);
/* A progress line for synth on stderr (cmd_synth.c): cli_synth_progress is a k3c_synth_options.progress. */
typedef struct cli_synth_meter {
    const char *what;
    double t0, last;
    int tty, shown;
} cli_synth_meter;
void cli_synth_progress_init(cli_synth_meter *p, const char *what);
void cli_synth_progress(void *ctx, uint64_t done, uint64_t total);
/* Loads DIR, or without DIR synthesizes `preset` (seed) into a temporary directory, on all cores with a
 * progress line, and loads that. */
int cli_load_model(const char *dir, const char *preset, uint64_t seed, k3c_model **m);
int cli_check_device(const char *device); /* 0 for cpu / cuda */
/* The engine options of generate, run and logits (--device cpu|cuda, --threads N >= 0, --kv-cache bf16|fp8)
 * at argv[*i], parsed into *o: 1 when argv[*i] is one of them (*bad = 1 for a bad value). */
int cli_engine_option(int argc, char **argv, int *i, k3c_engine_options *o, int *bad);
/* The sampling options of generate and run (--temperature T >= 0, --top-k K >= 0, --top-p P in (0, 1],
 * --seed S >= 0) at argv[*i], parsed into *s: 1 when argv[*i] is one of them (*bad = 1 for a bad value). */
int cli_sampling_option(int argc, char **argv, int *i, k3c_sampling *s, int *bad);

/* k3c bench --device cuda (bench_cuda.c): decode step times of a device-synthetic preset per batch size
 * (batches: "1,2,4" or NULL for 1..64 in powers of two) against the memory floor. Returns the exit status. */
int bench_cuda(const char *preset, const char *batches, const char *verify, int context, int steps);

#endif
