/* Temporary: subcommands not written yet. Each moves to its own cmd_NAME.c. */
#include <stdio.h>

#include "cli/commands.h"

int cmd_inspect(int argc, char **argv) {
    fprintf(stderr, "k3c inspect: not implemented yet\n");
    return 1;
}

int cmd_synth(int argc, char **argv) {
    fprintf(stderr, "k3c synth: not implemented yet\n");
    return 1;
}
