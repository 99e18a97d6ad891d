/*
 * Starting a child process from a multithreaded program: the one spawner
 * of the agent's exec routes (agent/), the local provider's exec
 * (providers/local/) and the kubeconfig exec credential plugins
 * (providers/kubernetes/).
 *
 * Everything the child needs -- the program's path (PATH is searched
 * before fork, never in the child), argv, envp, the descriptors -- is
 * prepared by the parent.  Between fork() and execve() the child makes
 * only async-signal-safe calls, in this order:
 *
 *   1. default dispositions for every signal and an empty signal mask
 *      (the daemons ignore SIGPIPE and block SIGINT/TERM/HUP, which the
 *      command must not inherit: sh cannot trap a signal ignored on entry);
 *   2. setsid() (SBX_SPAWN_SESSION) or setpgid(0, 0) (SBX_SPAWN_PGROUP);
 *   3. stdin/stdout/stderr from the pipes, the pty slave or the given
 *      descriptors; with `ctty`, the pty slave becomes the controlling
 *      terminal;
 *   4. close-on-exec for every other descriptor (close_range), except
 *      `keep_fd`, so nothing of the parent leaks whatever a library
 *      opened without O_CLOEXEC;
 *   5. the working directory (cwd_fd, else cwd);
 *   6. the caller's hook (e.g. entering a mount namespace);
 *   7. umask, PR_SET_NO_NEW_PRIVS when asked;
 *   8. execve(); with `sh_fallback` a file without a recognised format
 *      (ENOEXEC) is run by /bin/sh, as execvp(3) does.
 * A failure in the child is reported to the parent through a close-on-exec
 * pipe, so sbx_spawn_start() returns only once the program runs or has
 * definitely failed (the failed child is reaped).
 *
 * Errors: 0 or a negative errno with detail in sbx_error_last().
 *
 * Threads: the functions are thread-safe; the hook runs in the child.
 */
#ifndef SBX_SPAWN_H
#define SBX_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "sbx/error.h"

/* What sbx_spawn_find() searches when no PATH is given. */
#define SBX_SPAWN_DEFAULT_PATH \
	"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* Values of sbx_spawn_opts.stdio[] other than a descriptor. */
enum {
	SBX_SPAWN_PIPE = -1,    /* a pipe; the parent's end in the result */
	SBX_SPAWN_NULL = -2,    /* /dev/null */
	SBX_SPAWN_INHERIT = -3, /* the parent's own descriptor */
};

/* sbx_spawn_opts.group */
enum {
	SBX_SPAWN_SESSION = 0, /* setsid(): own session and process group */
	SBX_SPAWN_PGROUP = 1,  /* setpgid(0, 0): own process group */
};

/*
 * Runs in the child just before umask/execve (after the working directory
 * is set).  Must be async-signal-safe; it cannot fail the spawn.
 */
typedef void (*sbx_spawn_hook)(void *payload);

/*
 * What to start.  Every pointer is borrowed for the call.
 *
 *  file     the program to execve(); NULL: argv[0], searched as
 *           sbx_spawn_find() does in `path` (NULL: the PATH of envp,
 *           else SBX_SPAWN_DEFAULT_PATH), relative names resolving in the
 *           working directory.
 *  argv     NULL-terminated, passed as is.
 *  envp     the complete environment; NULL: the parent's (environ).
 *  cwd_fd   directory to fchdir() to (>= 0), else
 *  cwd      directory to chdir() to; NULL: the parent's.
 *  stdio    for descriptors 0, 1, 2: a descriptor (borrowed, >= 0) or
 *           SBX_SPAWN_PIPE / _NULL / _INHERIT.  Ignored with `tty`.
 *  tty      a pseudo-terminal for all three (rows x cols; 0 x 0: the
 *           kernel's default); with `ctty` it becomes the controlling
 *           terminal (requires SBX_SPAWN_SESSION).
 *  group    SBX_SPAWN_SESSION or SBX_SPAWN_PGROUP.
 *  umask    the child's umask, or -1 to inherit the parent's.
 *  keep_fd  a descriptor the program inherits (>= 3), or -1.
 *  pipe_size  F_SETPIPE_SZ for the output pipes; 0: the default.
 *  nonblock   O_NONBLOCK on the parent's ends (pipes, pty master).
 *  no_new_privs  PR_SET_NO_NEW_PRIVS before execve.
 *  sh_fallback   ENOEXEC: run the file with /bin/sh (execvp's rule).
 *  hook/hook_payload  see sbx_spawn_hook; NULL for none.
 */
struct sbx_spawn_opts {
	const char *file;
	const char *path;
	const char *const *argv;
	const char *const *envp;
	int cwd_fd;
	const char *cwd;
	int stdio[3];
	bool tty;
	bool ctty;
	unsigned short rows, cols;
	int group;
	int umask;
	int keep_fd;
	int pipe_size;
	bool nonblock;
	bool no_new_privs;
	bool sh_fallback;
	sbx_spawn_hook hook;
	void *hook_payload;
};

/* Options with every descriptor field -1 and stdio all pipes. */
void sbx_spawn_opts_init(struct sbx_spawn_opts *o);

/*
 * A started process.  The descriptors are the parent's ends (O_CLOEXEC),
 * -1 where there is none; they belong to the caller (sbx_spawn_fini()
 * closes them).  The caller reaps `pid`.
 */
struct sbx_spawn {
	pid_t pid;
	int in_fd;  /* write end of the child's stdin pipe */
	int out_fd; /* read end of its stdout pipe */
	int err_fd; /* read end of its stderr pipe */
	int pty_fd; /* tty: the pty master (all three streams) */
	/*
	 * On failure: true when the child could not set itself up or exec
	 * (child_errno says why), false when the parent failed first (pipes,
	 * pty, fork, the PATH search).
	 */
	bool child_failed;
	int child_errno;
};

/*
 * Start a process as described by `o`.  *out is filled (descriptors -1,
 * pid 0 on failure).  Errors:
 *   -ENOENT, -EACCES, -ENOEXEC ... (SBX_ERR_OS, detail
 *       SBX_EXEC_ERR_PROGRAM of sbx/exec.h): the program was not found
 *       ("PROG: command not found") or cannot be executed ("PROG: cannot
 *       execute: REASON");
 *   other errnos (SBX_ERR_OS, detail 0): a pipe, the pty, fork, or the
 *       child's setup ("PROG: working directory: REASON", ...).
 */
SBX_WUR int sbx_spawn_start(struct sbx_spawn *out,
			    const struct sbx_spawn_opts *o);

/* Close the result's descriptors (the process is left alone). */
void sbx_spawn_fini(struct sbx_spawn *s);

/*
 * Find `prog` the way execvp(3) does, in the parent: a name with a '/' is
 * taken as is (it must exist); otherwise each entry of `path` (a PATH
 * value; NULL: SBX_SPAWN_DEFAULT_PATH) is tried for a regular executable
 * file, an empty entry meaning the working directory.  Relative names are
 * checked against `dirfd` (AT_FDCWD or the command's working directory)
 * and, when `dir` is given, returned prefixed with it ("DIR/NAME");
 * otherwise returned relative.  *out is malloc'd.
 * Errors (no detail recorded): -ENOENT not found; -EACCES found but not
 * executable.
 */
SBX_WUR int sbx_spawn_find(char **out, const char *prog, const char *path,
			   int dirfd, const char *dir);

/*
 * Record that `prog` could not be run (rc from sbx_spawn_find() or a
 * child's exec): "PROG: command not found" for -ENOENT, else "PROG: cannot
 * execute: REASON"; class SBX_ERR_OS, detail SBX_EXEC_ERR_PROGRAM.
 * Returns rc.
 */
int sbx_spawn_program_error(int rc, const char *prog);

/* The value of `name` in a "K=V" list (NULL when absent or no list). */
const char *sbx_spawn_env_get(const char *const *envp, const char *name);

#endif
