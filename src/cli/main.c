/* The k3c command: one subcommand per front-end job; every subcommand lives in its own cmd_*.c. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"inspect", cmd_inspect, "inspect DIR                 validate a checkpoint and print its structure"},
    {"plan", cmd_plan,
     "plan (--config FILE | --preset NAME) [--tp N --pp N --dp N --ep N --hosts N --gpu-mem BYTES]   bytes per rank, fit, decode floor"},
    {"synth", cmd_synth, "synth --preset NAME --out DIR [--seed N]   write a synthetic checkpoint"},
    {"generate", cmd_generate,
     "generate [--model DIR | --preset NAME] [--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3 [--text]] [-n 32] [--ignore-eos] [--temperature T --top-k K --top-p P --seed S] [--device cpu|cuda] [--stock]"},
    {"chat", cmd_chat,
     "chat [--model DIR | --preset NAME] [--system TEXT] [--reasoning show|hide] [-n 512] [--temperature T ...] [--device cpu|cuda]   interactive, multi-turn"},
    {"logits", cmd_logits, "logits [--model DIR | --preset NAME] --prompt-ids IDS --prefill N --out FILE [--device cpu|cuda] [--f32]"},
    {"perplexity", cmd_perplexity,
     "perplexity [--model DIR | --preset NAME] --file F [--window 512] [--max-tokens N] [--device cpu|cuda]   NLL per token"},
    {"bench", cmd_bench, "bench [--device cpu|cuda] [--preset NAME] [--batches 1,8,64]   decode step time vs its bandwidth floor"},
    {"tokenize", cmd_tokenize,
     "tokenize [--model DIR | --preset NAME] [--no-special] [--file F | TEXT]   print the token ids of a text (--bench FILE: MB/s)"},
    {"detokenize", cmd_detokenize, "detokenize [--model DIR | --preset NAME] --ids 1,2,3   print the text of token ids"},
    {"run", cmd_run,
     "run [--model DIR | --preset NAME] --prompts \"1,2,3;4,5\" [-n N] [--spec D] [--max-requests M] [--device cpu|cuda]   batched runner"},
    {"serve", cmd_serve,
     "serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--device cpu|cuda] [--api-key KEY]   OpenAI-compatible server"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: k3c COMMAND [options]   (k3c --version: the version)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  %s\n", commands[i].help);
    fprintf(f, "\nwithout --model, generate, chat, run, logits, perplexity, tokenize and detokenize use the embedded\n"
               "default model k3-fortune (trained, 8.4 M parameters); --preset NAME: a synthesized random model\n"
               "(tests, benchmarks); bench measures presets; serve without --model runs the tiny preset\n");
}

/* A standard descriptor the caller closed (`k3c generate >&-`) would be handed out again by the next open()
 * (a shard, a synthesized file), and printf would write into that file. Held on /dev/null opened read-only,
 * it stays taken and every write to it fails (EBADF), which the check at exit reports. */
static void hold_closed_std_fds(void) {
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int n = open("/dev/null", fd == 0 ? O_RDWR : O_RDONLY);
            if (n >= 0 && n != fd) {
                dup2(n, fd);
                close(n);
            }
        }
}

/* An option's value in argv (--name V or --name=V), or NULL. */
static const char *arg_value(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], name, n) != 0) continue;
        if (argv[i][n] == '=') return argv[i] + n + 1;
        if (argv[i][n] == '\0' && i + 1 < argc) return argv[i + 1];
    }
    return NULL;
}

/* TP ranks as threads of this process on device cuda (--tp N --device cuda, no --world-size) may share a
 * GPU, and the specialized executor's mailbox kernels then spin beside each other: each rank's stream needs
 * its own hardware queue and no kernel may load lazily behind a spinning one (comm/mailbox_cuda.h). Both are
 * read when CUDA starts, so they are set here, before any CUDA call; a value the environment gives is kept. */
static void ranks_on_one_device_env(int argc, char **argv) {
    const char *tp = arg_value(argc, argv, "--tp"), *dev = arg_value(argc, argv, "--device");
    if (!tp || atoi(tp) < 2 || !dev || strcmp(dev, "cuda") != 0 || arg_value(argc, argv, "--world-size")) return;
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
    setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

/* What a command printed went out, or the run fails: a full disk (/dev/full), a closed or read-only stdout
 * would otherwise exit 0 with the output lost. */
static int check_stdout(const char *cmd, int rc) {
    errno = 0;
    int bad = fflush(stdout) != 0 || ferror(stdout);
    int e = errno;
    if (fclose(stdout) != 0 && !bad) bad = 1, e = errno;
    if (!bad || rc) return rc; /* a failed command has said why */
    fprintf(stderr, "k3c%s%s: writing standard output failed: %s\n", *cmd ? " " : "", cmd,
            e ? strerror(e) : "write error");
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    hold_closed_std_fds();
    ranks_on_one_device_env(argc, argv);
    if (argc == 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))) {
        /* the library linked, and the header this binary was compiled against */
        printf("k3c %s (%s)\n", k3c_version(), k3c_has_cuda() ? "cpu, cuda" : "cpu");
        return strcmp(k3c_version(), K3C_VERSION_STRING) ? 1 : 0;
    }
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return check_stdout("", argc < 2 ? 2 : 0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return check_stdout(argv[1], commands[i].run(argc - 1, argv + 1));
    fprintf(stderr, "k3c: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
