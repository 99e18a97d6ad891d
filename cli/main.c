/* The sbx command: a thin main over cli_main() (cli/cmd.c). */
#include "config.h"

#include "cli_i.h"

int main(int argc, char **argv)
{
	return cli_main(argc, argv);
}
