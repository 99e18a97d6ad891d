/*
 * Private interface of the `sbx` command (cli/).
 *
 * main() calls cli_main(), which parses the global options and dispatches
 * to one cli_cmd_<verb>() per subcommand (the table in cmd.c).  Each
 * subcommand parses its own options with getopt_long and returns a process
 * exit code (enum cli_exit); errors are reported once, at the end, with
 * cli_report() from sbx_error_last().
 *
 * Single-threaded: the CLI never starts threads, which is what makes fork()
 * of the daemon in daemon.c safe.
 */
#ifndef SBX_CLI_I_H
#define SBX_CLI_I_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include "sbx/error.h"

struct cJSON;
struct sbx_provider;
struct sbx_session;

/* Exit codes; documented in docs/cli.md.  Do not renumber. */
enum cli_exit {
	CLI_EXIT_OK = 0,
	CLI_EXIT_FAIL = 1,     /* anything else; the message says what */
	CLI_EXIT_USAGE = 2,    /* bad options or arguments, bad name */
	CLI_EXIT_NOTFOUND = 3, /* no such session / sandbox / snapshot */
	CLI_EXIT_REFUSED = 4,  /* would lose data, busy, or in use */
	CLI_EXIT_CONFIG = 5,   /* configuration error, not a git repo */
	CLI_EXIT_CREATE = 6,   /* the provider could not create the sandbox */
};

/* Seconds to wait for the session lock before giving up. */
#define CLI_LOCK_TIMEOUT_MS 30000
/* How long `up`/`mount` wait for the daemon to report the mount live. */
#define CLI_MOUNT_TIMEOUT_MS 15000

typedef int (*cli_cmd_fn)(int argc, char **argv);

struct cli_cmd {
	const char *name;
	cli_cmd_fn run;
	const char *usage;   /* "sbx up [NAME] [OPTIONS]" */
	const char *summary; /* one line for `sbx help` */
	const char *help;    /* option list for `sbx help CMD` */
};

/* Global options (before the subcommand). */
struct cli_globals {
	const char *config_file; /* --config FILE */
};
extern struct cli_globals cli_g;

/* Entry point of the sbx binary. */
int cli_main(int argc, char **argv);

/* The command table entry for `name`, or NULL. */
const struct cli_cmd *cli_cmd_find(const char *name);

/* Print the usage and help of `c` to `f`. */
void cli_print_help(const struct cli_cmd *c, FILE *f);

/*
 * Report the current error ("sbx: <message>") on stderr and return the
 * exit code for it: by error class (NOTFOUND 3, STATE/EBUSY 4, CONFIG 5),
 * else `fallback`.
 */
int cli_report(int fallback);

/* Print "sbx CMD: <message>" and a hint to stderr; returns CLI_EXIT_USAGE. */
int cli_usage(const char *cmd, const char *fmt, ...) SBX_PRINTF(2, 3);

/*
 * Standard handling of getopt_long's result for the options every command
 * has (-h/--help, unknown option): returns -1 to continue parsing, or an
 * exit code to return.
 */
int cli_common_opt(const char *cmd, int opt);

/*
 * Validate a session name given on the command line: 0, or prints the
 * reason and returns CLI_EXIT_USAGE.
 */
int cli_check_name(const char *cmd, const char *name);

/*
 * After getopt, for the commands that take a session NAME (mount, umount,
 * status, down, snapshot, snapshots, restore, pull, env): between `min` and
 * `max` positional arguments (from argv[optind]), the first a valid session
 * name (cli_check_name).  Returns CLI_EXIT_OK, or CLI_EXIT_USAGE after
 * printing the usage message `expected` (e.g. "expected one session NAME")
 * or the name's problem.
 */
int cli_args_name(const char *cmd, int argc, char **argv, int min, int max,
		  const char *expected);

/* Print a JSON tree on stdout (pretty, newline-terminated). */
void cli_print_json(const struct cJSON *j);

/* ---- session.c: helpers shared by the commands ------------------------- */

/*
 * Load session `name` under its exclusive lock.  On success *lock_out is
 * the lock fd (release with sbx_state_unlock()) and `s` is filled.
 */
SBX_WUR int cli_session_lock_load(struct sbx_session *s, int *lock_out,
				  const char *name);

/* The provider recorded for `s`, configured as at creation. */
SBX_WUR int cli_session_provider(struct sbx_provider **out,
				 const struct sbx_session *s);

/*
 * Get `mountpoint` ready to mount session `name` on: "~" expanded, created
 * (0755) when missing (*created_out set then), a stale sbx mount of this
 * session detached, and refused (-EBUSY/-ENOTEMPTY, SBX_ERR_STATE) when it
 * is a live mount or a non-empty directory.  *abs_out is the absolute path
 * with the parent's symlinks resolved (what mountinfo will show).
 */
SBX_WUR int cli_mountpoint_prepare(char **abs_out, bool *created_out,
				   const char *mountpoint, const char *name);

/*
 * Detach a stale (or, with `lazy`, a busy) FUSE mount: umount2 as root,
 * else fusermount3 -u [-z].  -EBUSY (STATE) when it is in use and not lazy.
 */
SBX_WUR int cli_unmount(const char *mountpoint, bool lazy);

/* ---- status_ask.c: what status and ls report -------------------------- */

/*
 * Ask the provider of remote session `s` what became of its sandbox and
 * correct the status object `st`: the provider's state; a failed sandbox
 * as error SandboxError (NotFoundError when it is gone) with its reason;
 * a provider that cannot be asked as state "unknown" with error
 * UnavailableError (ConfigError for credentials) and the error's class.
 * Blocks up to the provider's own timeouts.
 */
void cli_status_ask(struct cJSON *st, const struct sbx_session *s);

/*
 * The status object of `s` as `sbx status` reports it: the record, the
 * provider's answer (remote sessions in state ready), then the daemon's
 * (sbx_status_probe(), at most ping_ms).  Caller frees.
 */
struct cJSON *cli_status_object(const struct sbx_session *s, int ping_ms);

/* `sbx ls` waits this long for all providers and daemons together. */
#define CLI_LS_TIMEOUT_MS 5000

/*
 * cli_status_object() for n sessions at once: each one that may block
 * runs in a child process; what has not answered after timeout_ms is
 * killed and reported as state "unknown".  out[i] (caller frees) belongs
 * to s[i].  Forks: single-threaded callers only.
 */
void cli_status_gather(struct cJSON **out, const struct sbx_session *s,
		       size_t n, int timeout_ms);

/* ---- daemon.c: the per-session FUSE daemon ----------------------------- */

/*
 * Start the daemon of `s` detached (see docs/cli.md, "Mounting") and wait
 * until the mount is live.  `lock_fd` (the caller's session lock) is closed
 * in the child.  On success sets s->pid and s->control_socket; the caller
 * saves the record.  On failure the child's error is the current error.
 */
SBX_WUR int cli_daemon_start(struct sbx_session *s, int lock_fd);

/*
 * Serve `s` in this process until unmounted (`sbx mount -f`).  `*lock_fd`
 * is released while serving and re-taken afterwards to clear the pid.
 */
SBX_WUR int cli_daemon_foreground(struct sbx_session *s, int *lock_fd);

/*
 * Unmount `s` and make sure its daemon is gone: unmount (lazy with
 * `force`), wait up to 5 s for the daemon to exit, then SIGTERM, then
 * SIGKILL.  Clears s->pid.  -EBUSY (STATE) when the mount is in use.
 */
SBX_WUR int cli_daemon_stop(struct sbx_session *s, bool force);

/* ---- cmd_up.c / cmd_down.c: the lifecycle, shared with `sbx serve` ---- */

/* Options of cli_session_up(); every pointer is borrowed. */
struct cli_up_opts {
	const char *name;        /* session name, validated by the caller */
	const char *repo;        /* NULL: the repository holding the cwd */
	const char *ref;         /* NULL: HEAD */
	const char *mount;       /* NULL: recorded, else $SBX_MOUNT_ROOT/NAME */
	const char *config_file; /* extra configuration file or NULL */
	/* The command-line layer of the configuration (provider, sections
	 * such as "local" or "remote"), merged over the files; or NULL. */
	const struct cJSON *flags;
	bool carry;   /* copy the checkout's uncommitted changes */
	bool isolate; /* local.isolation=bwrap was asked for */
	/* Repository of a sandbox elsewhere (repo_i.h): none at all, or
	 * only `depth` commits of history (0: all); progress lines. */
	bool no_repo;
	int depth;
	bool progress;
};

/*
 * `sbx up`: get-or-create session o->name and mount it, under the
 * session's exclusive lock.  On success *status_out is the status object
 * (sbx_status_new(); the caller frees it with cJSON_Delete).  On failure
 * returns the negative errno with the current error set, and *exit_out
 * says which CLI exit code the failure maps to (CLI_EXIT_CREATE when the
 * provider could not create it, CLI_EXIT_CONFIG, CLI_EXIT_USAGE, ...).
 * Prints warnings on stderr.  Forks the daemon: the caller must not run
 * other lifecycle operations concurrently in the same process.
 */
SBX_WUR int cli_session_up(struct cJSON **status_out, int *exit_out,
			   const struct cli_up_opts *o);

/*
 * `sbx down`: unmount session `name` and terminate its sandbox
 * (SBX_TERMINATE_* `flags`), or with `keep` only unmount and mark it
 * stopped.  A sandbox elsewhere that was given a repository is pulled
 * first (cli_session_pull()); a pull that fails or is refused refuses
 * the `down` (-EBUSY, the mount restored) unless SBX_TERMINATE_FORCE.
 * -EBUSY (the provider refuses: uncommitted work; the mount is restored)
 * or the errors of the steps; -ENOENT (NOTFOUND) for an unknown session.
 * Takes the session lock.
 */
SBX_WUR int cli_session_down(const char *name, unsigned flags, bool keep);

/* ---- the subcommands --------------------------------------------------- */

int cli_cmd_up(int argc, char **argv);
int cli_cmd_down(int argc, char **argv);
int cli_cmd_ls(int argc, char **argv);
int cli_cmd_status(int argc, char **argv);
int cli_cmd_mount(int argc, char **argv);
int cli_cmd_umount(int argc, char **argv);
int cli_cmd_snapshot(int argc, char **argv);
int cli_cmd_snapshots(int argc, char **argv);
int cli_cmd_restore(int argc, char **argv);
int cli_cmd_gc(int argc, char **argv);
int cli_cmd_help(int argc, char **argv);
int cli_cmd_version(int argc, char **argv);
/* cmd_exec.c (exec shim issue): `sbx exec`, `sbx shell`. */
int cli_cmd_exec(int argc, char **argv);
int cli_cmd_shell(int argc, char **argv);
/* cmd_shim.c (exec shim issue): `sbx shim install`, `sbx env`. */
int cli_cmd_shim(int argc, char **argv);
int cli_cmd_env(int argc, char **argv);
/* cmd_serve.c (API issue): `sbx serve`. */
int cli_cmd_serve(int argc, char **argv);
/* cmd_pull.c: `sbx pull` (repo_i.h). */
int cli_cmd_pull(int argc, char **argv);

/* Write all of p to fd, retrying on EINTR; gives up silently on error
 * (for messages to a pipe whose reader may be gone). */
void cli_write_all(int fd, const char *p, size_t n);

#endif
