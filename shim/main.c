/* sbx-exec: a thin main over shim_main() (shim.c). */
#include "config.h"

#include "shim_i.h"

int main(int argc, char **argv)
{
	return shim_main(argc, argv);
}
