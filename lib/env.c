/* Environment variables, empty meaning unset; see sbx/env.h. */
#include "config.h"

#include <stdlib.h>

#include "sbx/env.h"

const char *sbx_env_str(const char *name)
{
	const char *v = getenv(name);

	return v && *v ? v : NULL;
}

const char *sbx_env_or(const char *name, const char *dflt)
{
	const char *v = sbx_env_str(name);

	return v ? v : dflt;
}
