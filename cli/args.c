/* Positional-argument checks shared by the session commands; see args_i.h. */
#include "config.h"

#include <getopt.h>

#include "cli_i.h"
#include "args_i.h"

int cli_args_name(const char *cmd, int argc, char **argv, int min, int max,
		  const char *expected)
{
	int n = argc - optind;

	if (n < min || n > max)
		return cli_usage(cmd, "%s", expected);
	if (cli_check_name(cmd, argv[optind]))
		return CLI_EXIT_USAGE;
	return CLI_EXIT_OK;
}
