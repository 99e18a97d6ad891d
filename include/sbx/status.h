/*
 * The status object: what `sbx status NAME --json` prints and what the HTTP
 * API of `sbx serve` (`GET /session/:id/sandbox`, docs/api.md) answers,
 * built in one place.
 *
 * Keys, exactly: session, provider, sandbox_id, state ("creating", "ready",
 * "stopped", "error"), remote (bool), mountpoint, workdir, created_at
 * (RFC 3339 UTC string), isolation, mounted (bool), pid (number), and
 * error {type, message} only when there is one.  Strings that are unknown
 * are JSON null.
 *
 * "mounted" means: the daemon process is alive AND the mountpoint is a live
 * sbx mount of this session (/proc/self/mountinfo shows fstype "fuse.sbx"
 * and source "sbx:<name>" there).  A pid alone is not proof (pids are
 * reused), and a mount alone is not (a dead daemon leaves a stale mount that
 * fails with ENOTCONN).
 *
 * Daemon identity: the daemon sets its command name (prctl PR_SET_NAME) to
 * SBX_DAEMON_COMM so that a reused pid of an unrelated process is not taken
 * for it.
 *
 * No global state; thread-safe.  Trees returned are owned by the caller.
 */
#ifndef SBX_STATUS_H
#define SBX_STATUS_H

#include <stdbool.h>
#include <sys/types.h>

#include "sbx/error.h"

struct cJSON;
struct sbx_session;

#define SBX_DAEMON_COMM "sbxfs"

/* Error types of the status object (those of the sandbox API it replaces). */
#define SBX_STATUS_CREATE_ERROR "CreateError"
#define SBX_STATUS_NOTFOUND_ERROR "NotFoundError"
#define SBX_STATUS_EXEC_ERROR "ExecError"
#define SBX_STATUS_FILE_ERROR "FileError"
#define SBX_STATUS_CONFIG_ERROR "ConfigError"
/* The provider reports the sandbox failed (crashed, evicted, expired). */
#define SBX_STATUS_SANDBOX_ERROR "SandboxError"
/* The provider could not be asked (API server down, credentials...). */
#define SBX_STATUS_UNAVAILABLE_ERROR "UnavailableError"
/* "state" when the provider could not be asked: not known to be ready. */
#define SBX_STATUS_STATE_UNKNOWN "unknown"

/*
 * The error type for an error of class `klass` (enum sbx_error_class):
 * CONFIG → ConfigError, NOTFOUND → NotFoundError, otherwise `fallback`
 * (the type of the operation that failed: CreateError for create, ...).
 */
const char *sbx_status_error_type(int klass, const char *fallback);

/* True when `pid` > 0 is a live process whose comm is SBX_DAEMON_COMM. */
bool sbx_status_daemon_alive(pid_t pid);

/* One line of mountinfo, unescaped.  Strings owned; see _fini. */
struct sbx_mount_entry {
	char *mountpoint;
	char *fstype;
	char *source;
};

void sbx_mount_entry_fini(struct sbx_mount_entry *e);

/*
 * The first n bytes of a mountinfo field with its octal escapes undone
 * (\040 space, \011 tab, \012 newline, \134 backslash).  malloc'd.
 */
char *sbx_mountinfo_unescape(const char *s, size_t n);

/*
 * Find the topmost mount at `mountpoint` (exact, absolute path) in the
 * mountinfo file `mountinfo` (NULL: /proc/self/mountinfo).  0 and *out
 * filled when found; -ENOENT (no error recorded) when nothing is mounted
 * there; -errno (OS) when the file cannot be read.
 */
SBX_WUR int sbx_mountinfo_find(struct sbx_mount_entry *out,
			       const char *mountinfo, const char *mountpoint);

/*
 * True when `mountpoint` is an sbx mount of session `name` (alive or
 * stale: this looks at the mount table only).  `mountinfo` as above.
 */
bool sbx_status_is_sbx_mount(const char *mountinfo, const char *mountpoint,
			     const char *name);

/* The "mounted" rule above, for a recorded session. */
bool sbx_status_mounted(const struct sbx_session *s);

/* Build the status object with an explicit `mounted` (tests, HTTP API). */
struct cJSON *sbx_status_build(const struct sbx_session *s, bool mounted);

/* Build the status object, computing `mounted` with sbx_status_mounted(). */
struct cJSON *sbx_status_new(const struct sbx_session *s);

/*
 * How long `sbx status` waits for a mounted session's daemon to answer a
 * PING on its control socket (sbx_ctl_ping()).
 */
#define SBX_STATUS_PING_MS 3000

/*
 * For a status object `st` of session `s` that says mounted: ask the
 * daemon whether it answers (at most `timeout_ms`).  When it does not (it
 * is stopped, or stuck), set "state" to "error" and "error" to a
 * FileError saying so and how to recover.  Blocks up to timeout_ms;
 * changes nothing for a daemon that answers or is not running.
 */
void sbx_status_probe(struct cJSON *st, const struct sbx_session *s,
		      int timeout_ms);

#endif
