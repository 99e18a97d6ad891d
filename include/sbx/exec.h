/*
 * Running a command inside a sandbox: the provider-neutral exec handle.
 *
 * A provider's exec_start() (struct sbx_sandbox_ops, sbx/provider.h) starts
 * one command described by a struct sbx_exec_request and returns a handle.
 * The handle exposes the command's standard streams as pollable file
 * descriptors and its lifetime as a pollable "exit" descriptor, so that one
 * poll loop (fs/ctl_server.c) can serve any provider:
 *
 *   - the local provider hands out the real pipe / pty master descriptors
 *     and a pidfd;
 *   - a remote provider (HTTP agent) can hand out pipes fed by its own
 *     thread, and an eventfd or pipe that becomes readable at exit.
 *
 * Ownership: the request is borrowed for the duration of exec_start() only.
 * The handle and every descriptor in it belong to the handle; the caller
 * reads/writes them but never closes them, and releases everything with
 * sbx_exec_free().  Descriptors are O_NONBLOCK and O_CLOEXEC.
 *
 * Threads: a handle is used by one thread at a time (the control-server
 * connection thread that started it).  Different handles are independent.
 *
 * Errors: 0 or a negative errno, detail in sbx_error_last() (sbx/error.h).
 */
#ifndef SBX_EXEC_H
#define SBX_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "sbx/error.h"

struct sbx_exec_handle;

/*
 * exec_start() failures where the program itself could not be executed
 * (-ENOENT: not found; -EACCES/-ENOEXEC: not executable) carry this value in
 * sbx_error_last()->detail, so clients can answer 127/126 as a shell does.
 * Other failures (bad cwd, no pty, bwrap missing) carry 0.
 */
#define SBX_EXEC_ERR_PROGRAM 1

/*
 * What to run.  Every string is NUL-terminated and borrowed.
 *
 *  argv  NULL-terminated; argv[0] is the program, searched in the PATH of
 *        `envp` when it has no '/'.  Passed to execve() as is: never through
 *        a shell, never re-quoted.
 *  envp  NULL-terminated "KEY=VALUE" list: the complete environment of the
 *        command (the control server has already applied the environment
 *        policy of docs/exec.md).
 *  cwd   absolute path inside the sandbox.  The provider refuses (-EACCES,
 *        SBX_ERR_CONFIG) a directory outside the sandbox's files.
 *  tty   allocate a pseudo-terminal of rows x cols for stdin/stdout/stderr
 *        (0 x 0: leave the kernel default).
 *  stdio descriptors (borrowed; the provider dups them) the command gets
 *        directly as its stdin/stdout/stderr, or -1 for a pipe exposed in
 *        the handle.  This is how the control server hands a local client's
 *        own descriptors to the command (zero copies, docs/exec.md).  Must
 *        be -1 with `tty`.  A provider that cannot use descriptors (a
 *        remote one) fails with -EXDEV when any is >= 0; the caller then
 *        retries with pipes.  The handle's fields for the streams given
 *        here are -1.
 *  umask the command's file mode creation mask when `has_umask` (the
 *        client's, docs/exec.md); otherwise SBX_EXEC_DEFAULT_UMASK, never
 *        the daemon's own (which is 0).
 */
struct sbx_exec_request {
	const char *const *argv;
	const char *const *envp;
	const char *cwd;
	bool tty;
	unsigned short rows;
	unsigned short cols;
	int stdio[3];
	bool has_umask;
	mode_t umask;
};

#define SBX_EXEC_DEFAULT_UMASK 022

/*
 * Operations of a handle; every one is required.
 */
struct sbx_exec_handle_ops {
	/*
	 * Close the command's standard input (EOF).  In tty mode this writes
	 * the terminal's EOF character (^D) instead, as a terminal would.
	 * Idempotent.  Afterwards stdin_fd is -1.
	 */
	int (*close_stdin)(struct sbx_exec_handle *h);

	/*
	 * Deliver signal `sig` (a Linux signal number) to the command's
	 * process group; in tty mode, to the terminal's foreground process
	 * group (what the kernel does for ^C).  -ESRCH when it has exited.
	 */
	int (*signal)(struct sbx_exec_handle *h, int sig);

	/* Change the terminal size (tty mode; -ENOTTY otherwise). */
	int (*resize)(struct sbx_exec_handle *h, unsigned short rows,
		      unsigned short cols);

	/*
	 * Collect the exit status once exit_fd is readable (non-blocking:
	 * -EAGAIN while the command still runs).  *status_out is a wait(2)
	 * status (WIFEXITED/WEXITSTATUS, WIFSIGNALED/WTERMSIG).  After success
	 * the command is reaped and further calls return the same status.
	 */
	int (*wait)(struct sbx_exec_handle *h, int *status_out);

	/*
	 * Release the handle: close every descriptor.  A command still running
	 * gets SIGKILL (process group) and is reaped.  Accepts NULL.
	 */
	void (*free)(struct sbx_exec_handle *h);
};

struct sbx_exec_handle {
	const struct sbx_exec_handle_ops *ops;
	/*
	 * Write end of the command's stdin (-1 once closed).  In tty mode the
	 * pty master (the same descriptor as stdout_fd).
	 */
	int stdin_fd;
	/*
	 * Read end of stdout; in tty mode the pty master, carrying both
	 * output streams.  read() returning 0 -- or EIO on a pty master --
	 * means end of output.
	 */
	int stdout_fd;
	/* Read end of stderr; -1 in tty mode. */
	int stderr_fd;
	/* Becomes readable (POLLIN) when the command has exited. */
	int exit_fd;
	/* Process id of the command (informational; 0 when not local). */
	pid_t pid;
};

/*
 * Convenience wrappers over the ops table.  sbx_exec_free() accepts NULL.
 */
static inline int sbx_exec_close_stdin(struct sbx_exec_handle *h)
{
	return h->ops->close_stdin(h);
}

static inline int sbx_exec_signal(struct sbx_exec_handle *h, int sig)
{
	return h->ops->signal(h, sig);
}

static inline int sbx_exec_resize(struct sbx_exec_handle *h,
				  unsigned short rows, unsigned short cols)
{
	return h->ops->resize(h, rows, cols);
}

static inline int sbx_exec_wait(struct sbx_exec_handle *h, int *status_out)
{
	return h->ops->wait(h, status_out);
}

static inline void sbx_exec_free(struct sbx_exec_handle *h)
{
	if (h)
		h->ops->free(h);
}

#endif
