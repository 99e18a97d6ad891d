/*
 * Positional arguments of the commands that take a session NAME (mount,
 * umount, status, down, snapshot, snapshots, restore, ...), checked one way.
 * Private to cli/; a candidate for cli_i.h (which this file does not
 * change, so that its owner can fold it in).
 */
#ifndef SBX_CLI_ARGS_I_H
#define SBX_CLI_ARGS_I_H

/*
 * After getopt: between `min` and `max` positional arguments (from
 * argv[optind]), the first a valid session name (cli_check_name).
 * Returns CLI_EXIT_OK, or CLI_EXIT_USAGE after printing the usage message
 * `expected` (e.g. "expected one session NAME") or the name's problem.
 */
int cli_args_name(const char *cmd, int argc, char **argv, int min, int max,
		  const char *expected);

#endif
