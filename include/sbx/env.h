/*
 * Environment variables as sbx reads them: a variable set to the empty
 * string counts as unset (as with $SBX_CONFIG, $SBX_MOUNT_ROOT, the MODAL_*
 * credentials...), so `VAR= cmd` switches a setting off.  Thread-safe as
 * far as getenv(3) is (nothing here changes the environment).
 */
#ifndef SBX_ENV_H
#define SBX_ENV_H

/*
 * The value of `name`, or NULL when it is unset or empty.  The string
 * belongs to the environment: copy it before any setenv/unsetenv.
 */
const char *sbx_env_str(const char *name);

/* The value of `name`, or `dflt` when it is unset or empty. */
const char *sbx_env_or(const char *name, const char *dflt);

#endif
