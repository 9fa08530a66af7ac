/* The k3c command: one subcommand per front-end job; every subcommand lives in its own cmd_*.c. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"inspect", cmd_inspect, "inspect DIR                 validate a checkpoint and print its structure"},
    {"synth", cmd_synth, "synth --preset NAME --out DIR [--seed N]   write a synthetic checkpoint"},
    {"generate", cmd_generate,
     "generate [--model DIR] [--prompt-ids 1,2,3] [-n 32] [--temperature T --top-k K --top-p P --seed S] [--device cpu|cuda] [--stock]"},
    {"logits", cmd_logits, "logits --model DIR --prompt-ids IDS --prefill N --out FILE [--device cpu|cuda] [--f32]"},
    {"bench", cmd_bench, "bench [--device cpu|cuda] [--preset NAME] [--batches 1,8,64]   decode step time vs its bandwidth floor"},
    {"tokenize", cmd_tokenize,
     "tokenize [--model DIR] [--no-special] [--file F | TEXT]   print the token ids of a text (--bench FILE: MB/s)"},
    {"detokenize", cmd_detokenize, "detokenize [--model DIR] --ids 1,2,3   print the text of token ids"},
    {"run", cmd_run,
     "run [--model DIR] --prompts \"1,2,3;4,5\" [-n N] [--spec D] [--max-requests M] [--device cpu|cuda]   batched runner"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: k3c COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) fprintf(f, "  %s\n", commands[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "k3c: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
