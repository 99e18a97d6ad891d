/*
 * sbx-exec, the exec shim: private interface (shim.c).
 *
 * main.c is a thin main() over shim_main().  Everything else is here so the
 * unit tests can link it (libshim).  The shim links only libsbx: it knows
 * the mount's virtual xattrs and the control socket, nothing else.
 *
 * Single-threaded; shim_main() may call execv() (local run) or exit().
 */
#ifndef SBX_SHIM_I_H
#define SBX_SHIM_I_H

#include <stdbool.h>

#include "sbx/error.h"

/* Deepest chain of shims exec'ing shims before we call it a loop. */
#define SHIM_MAX_DEPTH 8
/* Environment variable counting nested local execs of the shim. */
#define SHIM_DEPTH_ENV "SBX_SHIM_DEPTH"

/* What the virtual xattrs and mountinfo say about a directory. */
struct shim_mount {
	char *session;      /* user.sbx.session */
	char *control;      /* user.sbx.control: the daemon's socket */
	char *mountpoint;   /* local path of the mount root */
	char *sandbox_root; /* user.sbx.path of the mount root */
	char *sandbox_cwd;  /* user.sbx.path of the directory itself */
};

void shim_mount_fini(struct shim_mount *m);

/*
 * Is `dir` inside an sbx mount?  1 and `m` filled when it is, 0 when not
 * (no user.sbx.session xattr), or a negative errno: a mount whose daemon is
 * gone (-ENOTCONN, with the "run `sbx mount NAME`" message).
 */
SBX_WUR int shim_mount_find(struct shim_mount *m, const char *dir);

/*
 * Translate one argument: an absolute path into the mount (or an option
 * of the form -x=/path or --name=/path whose value is one) becomes the
 * sandbox path.  Returns a malloc'd string, or NULL when unchanged.
 */
char *shim_translate_arg(const struct shim_mount *m, const char *arg);

/*
 * The next executable called `name` on $PATH that is not this shim (by
 * st_dev/st_ino of /proc/self/exe).  malloc'd, or NULL when none.
 */
char *shim_find_next(const char *name);

/* The program: see docs/exec.md.  Returns the process exit code. */
int shim_main(int argc, char **argv);

#endif
