/* Subcommands of the k3c CLI. Each takes argv starting at its own name and returns the exit status. */
#ifndef K3C_CLI_COMMANDS_H
#define K3C_CLI_COMMANDS_H

int cmd_inspect(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_synth(int argc, char **argv);

int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* ---- helpers of the commands that run the model (cli_run.c) ---- */
#include <stddef.h>
#include <stdint.h>

#include "k3c.h"

/* A command's own failure (a file it writes, its memory), kept beside the library's messages so a command's
 * failure path prints one of them: cli_errorf returns K3C_ERR; cli_error() is the message of the last
 * cli_errorf, else k3c_last_error(). The CLI uses include/k3c.h only. */
int cli_errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *cli_error(void);

/* --name VALUE or --name=VALUE at argv[*i]: the value (advancing *i past a separate one), else NULL. */
/* --name VALUE or --name=VALUE at argv[*i]: the value (advancing *i past a separate one), else NULL; a --name
 * with nothing after it gives cli_no_value, which every parser below refuses ("--name needs a value"). */
extern const char cli_no_value[];
const char *cli_option(int argc, char **argv, int *i, const char *name);
/* The option parsers every command uses: 0, or -1 with a message (k3c_last_error) that names the option, the
 * value given and the range allowed. */
int cli_int(const char *name, const char *v, long lo, long hi, long *out);
int cli_u64(const char *name, const char *v, uint64_t *out);
/* a number in [lo, hi], or (lo, hi] with lo_open; never NaN or inf */
int cli_float(const char *name, const char *v, double lo, double hi, int lo_open, double *out);
/* bytes: a number with an optional K, M, G, T or P (powers of 1024; "8G", "512MiB", "1.5T") */
int cli_bytes(const char *name, const char *v, size_t *out);
/* a string value: present and not empty */
int cli_str(const char *name, const char *v);
/* Flushes stdout: 0, or -1 with a message naming the write error (a full disk, a closed stdout). */
int cli_flush_stdout(void);
/* the message for an argument that no option took; -1 */
int cli_unexpected(const char *arg);
/* "1,2,3" -> malloc'd ids (non-negative); 0 or -1 on a malformed list. */
int cli_parse_ids(const char *s, int32_t **ids, int *n);
/* Loads DIR; without DIR writes into a temporary directory, loads and removes (on a signal too) the embedded
 * default model (models/k3-fortune) when preset is NULL, else the synthesized `preset` (seed; on all cores
 * with a progress line). */
int cli_load_model(const char *dir, const char *preset, uint64_t seed, k3c_model **m);
/* The embedded default model written whole into a fresh temporary directory (path, cap bytes) that a signal
 * removes, for a command that needs the files while it runs (serve reads the tokenizer and chat template
 * after the weights); cli_default_model_dir_done removes it. */
int cli_default_model_dir(char *path, size_t cap);
void cli_default_model_dir_done(void);
/* --model DIR or --preset NAME at argv[*i] into *dir / *preset: 1 when argv[*i] is one of them (*bad = -1
 * for an empty value, or both given, with the message). */
/* The --help lines on that choice. */
#define CLI_MODEL_HELP                                                                                  \
    "without --model: the embedded default model k3-fortune (a small K3-architecture model trained on\n"  \
    "  Debian's fortunes, models/k3-fortune/README.md), written to a temporary directory and removed\n"   \
    "  once loaded; --preset NAME instead synthesizes a preset's random weights (seed 0; tiny, mini,\n"  \
    "  ...: k3c synth --help) for tests and benchmarks\n"
int cli_model_option(int argc, char **argv, int *i, const char **dir, const char **preset, int *bad);
/* What a command runs, for messages: DIR, "the synthesized P preset (a random model)" or "the embedded
 * k3-fortune model" (a static buffer). */
const char *cli_model_name(const char *dir, const char *preset);
int cli_check_device(const char *device); /* 0 for cpu / cuda, else -1 with a message */
/* The whole of a file (path "-": standard input), at most max bytes, into a malloc'd buffer with a NUL after
 * it; 0 or -1 with a message naming the file. */
int cli_read_input(const char *path, size_t max, char **buf, size_t *len);
/* The tokenizer of a model directory (dir NULL: the one the synthesized `preset` ships, or with preset NULL
 * the embedded default model's): 0 with *t NULL when the directory has none (the model runs on ids), -1 with
 * a message when its files are bad. */
int cli_load_tokenizer(const char *dir, const char *preset, k3c_tokenizer **t);
/* The message for a command that needs text from a model without a tokenizer (exit 2). */
int cli_no_tokenizer(const char *dir);
/* The ids that end a generation: the config's eos, the tokenizer's eos and, where the chat template loads,
 * its end-of-turn ids (t may be NULL; template_dir NULL: the family's default). At most cap; the count. */
int cli_stop_ids(const k3c_model *m, const k3c_tokenizer *t, const char *template_dir, int32_t *ids, int cap);
/* The engine options of generate, run and logits (--device cpu|cuda, --threads N >= 0, --kv-cache bf16|fp8,
 * --max-context N, --memory-limit BYTES) at argv[*i], parsed into *o: 1 when argv[*i] is one of them (*bad = -1
 * for a bad value, with the message). */
int cli_engine_option(int argc, char **argv, int *i, k3c_engine_options *o, int *bad);
/* The parallel options of generate, logits, bench, run and serve (docs/PARALLEL.md) at argv[*i], into
 * o->layout, o->rank, o->world_size, o->rendezvous and o->rank_timeout_ms: --tp N (ranks as threads of this
 * process, on cpu or cuda (main.c sets the CUDA environment they need), or with --world-size one process
 * per GPU), --dcp N, --pp N, --dp N, --ep, --rank R --world-size W --rendezvous PATH (a multi-process launch),
 * --rank-timeout S. 1 when
 * argv[*i] is one of them (*bad = -1 for a bad value, with the message). */
int cli_parallel_option(int argc, char **argv, int *i, k3c_engine_options *o, int *bad);
/* After parsing: --ep resolved to tp x dp, and the launch options checked together; 0 or -1 with a message. */
int cli_parallel_finish(k3c_engine_options *o);
/* Once the engine exists: on rank 0 (or world size 1) -1, the command goes on; on another rank it follows rank
 * 0's steps until rank 0 ends, and the exit status (0, or 1 with the message printed) is returned. */
int cli_follow(const char *cmd, k3c_engine *e);
/* The parallel options' --help lines. */
#define CLI_PARALLEL_HELP                                                                                        \
    "--tp N: N tensor-parallel ranks as threads of this process (each its shard of the model; rank 0 leads\n"  \
    "  every step, docs/PARALLEL.md); on --device cuda rank r on GPU r mod the visible GPUs, the stock\n"     \
    "  forward over host-staged sums, the specialized executor over an in-process mailbox (k3c then sets\n"  \
    "  CUDA_DEVICE_MAX_CONNECTIONS=32 and CUDA_MODULE_LOADING=EAGER unless given: ranks may share a GPU);\n"    \
    "  --pp N: N pipeline stages (each its layers and their caches; with --tp, TP inside a stage); --dp N: N\n" \
    "  data-parallel ranks, each request on one (the least loaded, or where its prefix is cached), with --ep\n" \
    "  the routed experts spread over them (DP attention + EP MoE; with --tp G, TP-G attention groups as the\n" \
    "  DP ranks and EP over all G x N ranks; on --device cuda with pp or dp every step runs the stock\n"     \
    "  forward: the executor stays off); --dcp N (a divisor of --tp): the\n"                                \
    "  MLA cache sharded by position over N TP ranks (decode context parallel: N times the tokens per byte);\n" \
    "  --rank R --world-size W --rendezvous PATH: one process per GPU, the stock forward over NCCL (rank 0\n"  \
    "  writing NCCL's id to PATH), the executor over a CUDA IPC mailbox when the TP group is on one host;\n"   \
    "  --rank-timeout S: the longest a rank waits for the others (default 60)\n"

/* The sampling options of generate and run (--temperature T in [0, FLT_MAX], --top-k K >= 0, --top-p P in
 * (0, 1], --seed S) at argv[*i], parsed into *s: 1 when argv[*i] is one of them (*bad as above). */
int cli_sampling_option(int argc, char **argv, int *i, k3c_sampling *s, int *bad);
/* After parsing: --top-k / --top-p without --temperature > 0 (greedy would ignore them) is an error. */
int cli_sampling_check(const k3c_sampling *s);
/* The context one request needs for a prompt of n_prompt tokens and n_new generated (option n_name): *ctx =
 * --max-context when given (an error when the need is larger), else the need. 0 or -1 with a message. */
int cli_context(const k3c_engine_options *o, int n_prompt, long n_new, const char *n_name, int *ctx);
/* The memory plan's line on stderr: what the engine reserved, for how many requests and tokens. */
void cli_report_memory(const char *cmd, const k3c_engine *e, const char *device);

/* ---- output files that appear whole or not at all (cli_out.c) ---- */
typedef struct cli_out {
    const char *path;
    char *tmp;     /* the temporary file beside path (NULL: path is a device or FIFO, written in place) */
    int fd;
    int committed; /* tmp renamed over path */
} cli_out;
int cli_out_open(cli_out *o, const char *path); /* before any compute; 0 or -1 with a message */
int cli_out_write(cli_out *o, const void *buf, size_t bytes);
int cli_out_close(cli_out *o);  /* close every output, then commit each */
int cli_out_commit(cli_out *o); /* renames the temporary file over path */
void cli_out_abort(cli_out *o); /* on any failure: removes what this output wrote, committed or not */
void cli_out_free(cli_out *o);  /* after the last commit */

/* k3c bench --device cuda (bench_cuda.c): decode step times of a device-synthetic preset per batch size
 * (batches: "1,2,4" or NULL for 1..64 in powers of two) against the memory floor. par: the parallel options
 * (cli_parallel_option: --tp N, one process per rank with --world-size; each rank generates only its shard on
 * its device). Returns the exit status. */
int bench_cuda(const char *preset, const char *batches, const char *verify, int context, int steps,
               const k3c_engine_options *par);
/* k3c bench --prefix N (bench_prefix.c): TTFT through the serving scheduler of requests sharing an N-token
 * system prompt, with prefix caching off, on a miss and on hits (rounds requests each). 0 or -1. */
int bench_prefix(const char *preset, const char *device, int threads, int prefix, int rounds);

#endif
