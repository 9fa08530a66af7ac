/* Subcommands of the k3c CLI. Each takes argv starting at its own name and returns the exit status. */
#ifndef K3C_CLI_COMMANDS_H
#define K3C_CLI_COMMANDS_H

int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);

#endif
