/*
 * Files and directories: $SBX_HOME, session names, atomic writes.
 *
 * Layout under $SBX_HOME (default ${XDG_STATE_HOME:-~/.local/state}/sbx,
 * every directory 0700, every file 0600):
 *   sessions/<name>.json   session state (sbx/state.h)
 *   sessions/<name>.lock   flock(2) serialising operations on a session
 *   worktrees/<name>/      local provider worktrees
 *   run/<name>.sock        daemon control socket (exec shim)
 *   logs/<name>.log        daemon log
 */
#ifndef SBX_PATHS_H
#define SBX_PATHS_H

#include <stddef.h>
#include <sys/types.h>

#include "sbx/error.h"

/*
 * $SBX_HOME as an absolute path, created (0700) if missing.  *out is
 * malloc'd.  Errors: -errno (OS) when it cannot be created.
 */
SBX_WUR int sbx_paths_home(char **out);

/* $SBX_HOME/<sub>, created 0700 if missing.  *out malloc'd. */
SBX_WUR int sbx_paths_subdir(char **out, const char *sub);

/* $SBX_HOME/<sub>/<name><suffix> (directory created).  *out malloc'd. */
SBX_WUR int sbx_paths_session_file(char **out, const char *sub,
				   const char *name, const char *suffix);

/* mkdir -p with `mode` for the directories it creates. */
SBX_WUR int sbx_paths_mkdir_p(const char *path, mode_t mode);

/*
 * Check a session name: 1-64 characters of [A-Za-z0-9._-], not starting
 * with '.' or '-' (so no "/", "..", or option look-alikes).  -EINVAL
 * (CONFIG) with a message that says what is allowed.
 */
SBX_WUR int sbx_name_validate(const char *name);

/*
 * Write `len` bytes to `path` atomically: temp file in the same directory,
 * fsync, rename, fsync of the directory.  File mode `mode`.
 */
SBX_WUR int sbx_file_write_atomic(const char *path, const void *data,
				  size_t len, mode_t mode);

/*
 * Read a whole file of at most `cap` bytes (-EFBIG beyond).  *out is
 * malloc'd and NUL-terminated; *len_out (may be NULL) gets the length.
 */
SBX_WUR int sbx_file_read(const char *path, size_t cap, char **out,
			  size_t *len_out);

/* Absolute, normalised form of `path` (no symlink resolution). */
SBX_WUR int sbx_path_absolute(const char *path, char **out);

/*
 * Additions beyond the original contract (lib/paths.c):
 */

/* The user's home directory ($HOME, else the passwd entry).  *out malloc'd. */
SBX_WUR int sbx_paths_user_home(char **out);

/*
 * Expand a leading "~" or "~/" to the user's home directory and make the
 * result absolute (sbx_path_absolute).  "~user" is not supported (-EINVAL,
 * SBX_ERR_CONFIG).  *out malloc'd.
 */
SBX_WUR int sbx_path_expand_user(char **out, const char *path);

/*
 * The user configuration file: $XDG_CONFIG_HOME/sbx/config.json, else
 * ~/.config/sbx/config.json.  Not created; may not exist.  *out malloc'd.
 */
SBX_WUR int sbx_paths_user_config(char **out);

/*
 * The top directory of the git repository containing `start` (NULL: the
 * working directory): the nearest ancestor holding a ".git" entry (directory
 * for a normal checkout, file for a worktree or submodule).  Found without
 * libgit2 so that lib/ stays free of it.  -ENOENT (SBX_ERR_CONFIG) when
 * there is none; -errno (OS) when `start` cannot be examined.  *out
 * malloc'd, absolute, normalised.
 */
SBX_WUR int sbx_paths_git_toplevel(char **out, const char *start);

#endif
