/*
 * Session state store: what sbx remembers about each session between
 * commands, so that later commands (and a re-attach after a crash) find the
 * sandbox, its provider configuration and its daemon.
 *
 * Files (see sbx/paths.h): $SBX_HOME/sessions/<name>.json, mode 0600,
 * replaced atomically (write temp, fsync, rename), so readers never see a
 * half-written file and need no lock.  Writers serialise through
 * $SBX_HOME/sessions/<name>.lock with flock(2): every command that changes a
 * session or its sandbox (up, down, mount, umount, snapshot, restore) takes
 * the exclusive lock first and holds it until it is done.  A lock file is
 * deleted, by its holder, once the session's record is gone
 * (sbx_state_unlock_forget()); a process that was waiting on the deleted
 * file notices after locking it (it is no longer the file at the path)
 * and locks the one at the path instead, so two processes never "hold"
 * different files.
 *
 * Locking and fork: flock locks belong to the open file description, which
 * a forked child shares.  A process that forks a long-lived child (the
 * daemon) while holding a lock must close the lock fd in the child, or the
 * session stays locked for the daemon's lifetime.
 *
 * Naming: the record is `struct sbx_session` because `sbx_state` is already
 * the lifecycle enum of sbx/sessionstate.h (struct and enum tags share a C
 * namespace).  Functions keep the module prefix sbx_state_.
 */
#ifndef SBX_STATE_H
#define SBX_STATE_H

#include <stdbool.h>
#include <sys/types.h>
#include <time.h>

#include "sbx/error.h"
#include "sbx/sessionstate.h"

struct cJSON;

/* One session.  Every pointer is owned (malloc'd / cJSON tree) or NULL. */
struct sbx_session {
	char *session;        /* name (validated) */
	char *provider;       /* provider name used at creation */
	char *sandbox_id;     /* provider's id */
	enum sbx_state state; /* last known lifecycle state */
	bool remote;          /* files live on another machine */
	char *mountpoint;     /* absolute; NULL when never mounted */
	char *workdir;        /* directory inside the sandbox */
	char *repo;           /* source repository (local provider) or NULL */
	time_t created_at;
	struct cJSON *provider_config; /* provider section at creation */
	pid_t pid;            /* daemon pid, 0 when none */
	char *control_socket; /* daemon control socket or NULL */
	char *isolation;      /* "none", "bwrap", ... or NULL */
	bool allow_other;     /* mounted with allow_other (other users may
			       * use the mount; docs/configuration.md) */
	char *error_type;     /* "CreateError", ... or NULL */
	char *error_message;  /* NULL when error_type is NULL */
};

/* Zero a record. */
void sbx_session_init(struct sbx_session *s);
/* Release every member and zero the record.  Accepts NULL. */
void sbx_session_fini(struct sbx_session *s);

/* Record an error on the session (copies), or clear it with type NULL. */
void sbx_session_set_error(struct sbx_session *s, const char *type,
			   const char *message);

/*
 * Serialise / parse the file format (a JSON object; see docs/cli.md).
 * to_json returns a new tree (caller frees).  from_json fills `out` (which
 * it initialises); -EINVAL (SBX_ERR_JSON) names `source` on a bad field.
 */
struct cJSON *sbx_session_to_json(const struct sbx_session *s);

/*
 * Add the keys the session file and the status object (sbx/status.h)
 * share, in this order: session, provider, sandbox_id, state, remote,
 * mountpoint, workdir, created_at (RFC 3339 UTC; null when unknown, as
 * every missing string).  `j` is an object; existing keys are replaced.
 */
void sbx_session_json_common(struct cJSON *j, const struct sbx_session *s);
SBX_WUR int sbx_session_from_json(struct sbx_session *out,
				  const struct cJSON *j, const char *source);

/*
 * Load session `name`.  -ENOENT (SBX_ERR_NOTFOUND, "no session NAME") when
 * it does not exist; -EINVAL (CONFIG) for a bad name; -EINVAL (JSON) for a
 * corrupt file.  `out` is initialised in every case.  No lock needed.
 */
SBX_WUR int sbx_state_load(struct sbx_session *out, const char *name);

/* Write the record atomically (0600).  Caller holds the exclusive lock. */
SBX_WUR int sbx_state_save(const struct sbx_session *s);

/* Remove the record (not the lock file).  0 if it did not exist. */
SBX_WUR int sbx_state_remove(const char *name);

/* True when a record exists for `name` (a valid name). */
bool sbx_state_exists(const char *name);

/*
 * Names of all recorded sessions, sorted.  *names_out is a malloc'd array
 * of malloc'd strings (free with sbx_state_names_free()); files whose names
 * are not valid session names are skipped.
 */
SBX_WUR int sbx_state_list(char ***names_out, size_t *n_out);
void sbx_state_names_free(char **names, size_t n);

/*
 * Take the lock of session `name`, waiting up to `timeout_ms` (0: try once,
 * < 0: forever).  Exclusive for commands that change the session, shared
 * for readers that need a stable view.  *fd_out is the lock fd (O_CLOEXEC);
 * release with sbx_state_unlock().  -EBUSY (SBX_ERR_STATE): "another sbx
 * command is working on session NAME ..." on timeout.
 */
SBX_WUR int sbx_state_lock(int *fd_out, const char *name, bool exclusive,
			   int timeout_ms);

/* Release a lock taken with sbx_state_lock(); accepts -1. */
void sbx_state_unlock(int fd);

/*
 * Release an exclusive lock of session `name` and, when the session has
 * no record (it was removed, or never made: a failed `up`), delete the
 * lock file first, so no file is left per session ever created.  The
 * current error (sbx_error_last()) is kept.  Accepts -1.
 */
void sbx_state_unlock_forget(int fd, const char *name);

#endif
