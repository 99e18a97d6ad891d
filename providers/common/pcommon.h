/*
 * The control-plane core shared by the providers that start a sandbox on
 * someone else's machines and keep per-session state of their own
 * (kubernetes, modal): configuration checking, the identity of this
 * $SBX_HOME, pin files, the snapshot store and its listing, and the
 * messages a user sees when a sandbox failed.  One copy, so the two
 * providers cannot drift (docs/design.md, "One control-plane core").
 *
 *   pcommon_cfg.c    configuration sections, env maps, identity, random ids
 *   pcommon_store.c  pin files, the snapshot store, failure reports
 *
 * Errors: 0 or a negative errno with sbx_error_last() (sbx/error.h).
 * Threads: no shared state; every function is reentrant.
 */
#ifndef PCOMMON_H
#define PCOMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "sbx/error.h"
#include "sbx/provider.h"

struct cJSON;

/* ---- configuration sections (pcommon_cfg.c) ------------------------------- */

/*
 * Every checker reads `key` of section `sec` (may be NULL: then every key
 * is absent) and fails with -EINVAL (SBX_ERR_CONFIG) and a message of the
 * form: configuration "SECTION": "KEY" must be WANT.  An absent or null
 * key gives the default.  Strings are borrowed from `sec`.
 */
SBX_WUR int pcommon_cfg_bad(const char *section, const char *key,
			    const char *want);
/* `sec` is NULL or an object. */
SBX_WUR int pcommon_cfg_object(const char *section, const struct cJSON *sec);
/* A non-empty string. */
SBX_WUR int pcommon_cfg_str(const char *section, const struct cJSON *sec,
			    const char *key, const char **out,
			    const char *dflt);
/* A whole number in [min, max]. */
SBX_WUR int pcommon_cfg_long(const char *section, const struct cJSON *sec,
			     const char *key, long *out, long dflt, long min,
			     long max);
/* Any number in [min, max]. */
SBX_WUR int pcommon_cfg_num(const char *section, const struct cJSON *sec,
			    const char *key, double *out, double dflt,
			    double min, double max);
SBX_WUR int pcommon_cfg_bool(const char *section, const struct cJSON *sec,
			     const char *key, bool *out, bool dflt);
/* An object (array false) or a list (array true), taken as is. */
SBX_WUR int pcommon_cfg_json(const char *section, const struct cJSON *sec,
			     const char *key, const struct cJSON **out,
			     bool array);
/* A list of non-empty strings. */
SBX_WUR int pcommon_cfg_strings(const char *section, const struct cJSON *sec,
				const char *key, const struct cJSON **out);

/*
 * An environment map for the sandbox: an object of NAME → string value.
 * Names must be valid (Kubernetes' rule: letters, digits, '_', '-', '.',
 * not a digit first) and not
 * reserved (pcommon_env_reserved()): a reserved name would override what
 * sbx itself puts there (the agent's token) and is refused with a
 * ConfigError naming it.
 */
SBX_WUR int pcommon_cfg_env(const char *section, const struct cJSON *sec,
			    const char *key, const struct cJSON **out);

/*
 * Names sbx sets in a sandbox's environment itself: SBX_AGENT_TOKEN (the
 * agent's token), SBX_SESSION, and every other name starting with "SBX_"
 * (kept for sbx).
 */
bool pcommon_env_reserved(const char *name);

/* ---- identity ---------------------------------------------------------------- */

/* FNV-1a 64 of a, a NUL, b (NULL = ""), as 16 hex digits. */
void pcommon_hash_hex(char out[17], const char *a, const char *b);

/*
 * The identity of this state directory: the hash of the host name and
 * $SBX_HOME.  Labels/tags every sandbox made from here, so `sbx gc` only
 * ever touches its own.
 */
SBX_WUR int pcommon_home_id(char out[17]);

/* `bytes` (at most 32) random bytes as 2*bytes hex digits plus NUL. */
void pcommon_random_hex(char *out, size_t bytes);

/* Overwrite a string before freeing it (tokens). Accepts NULL. */
void pcommon_wipe_free(char *s);

/* ---- pin files (pcommon_store.c) ------------------------------------------ */

/*
 * A pin records what a provider chose for a session at creation (the
 * cluster, namespace and pod; the sandbox id and token), so that later
 * commands reach the same sandbox whatever the configuration says then:
 * $SBX_HOME/<provider>/<session>.json, mode 0600, replaced atomically.
 */
SBX_WUR int pcommon_pin_path(char **out, const char *provider,
			     const char *session);
/* 0 with *out NULL when there is none; -EINVAL (JSON) when corrupt. */
SBX_WUR int pcommon_pin_load(struct cJSON **out, const char *provider,
			     const char *session);
/* Writes `pin`; the serialised text is wiped from memory afterwards. */
SBX_WUR int pcommon_pin_save(const char *provider, const char *session,
			     const struct cJSON *pin);
/* Removes the pin (absent is fine; a failure is only warned about). */
void pcommon_pin_remove(const char *provider, const char *session);

/*
 * Call cb(session, pin, payload) for every readable pin of `provider`
 * (sessions in name order; unreadable files are skipped).  A non-zero
 * return of cb stops the walk and is returned.
 */
typedef int (*pcommon_pin_cb)(const char *session, const struct cJSON *pin,
			      void *payload);
SBX_WUR int pcommon_pin_each(const char *provider, pcommon_pin_cb cb,
			     void *payload);

/* ---- the snapshot store ---------------------------------------------------- */

/*
 * Snapshots are recorded as $SBX_HOME/<provider>/snapshots/<session>/
 * <id>.json ({"id","session","message","created_at", ...provider fields}),
 * with whatever else the provider keeps beside it (<id>.tar).  Ids are
 * "YYYYMMDDTHHMMSSZ-xxxx" (UTC time, 4 random hex digits): they sort by
 * time.  "OTHER/ID" names a snapshot of another session (restoring into a
 * new one).  Directories are made only when a snapshot is written, and a
 * session directory left empty by a failed snapshot is removed.
 */

/* A new id for a snapshot taken at `now`. */
void pcommon_snap_new_id(char out[40], time_t now);

/*
 * The file of snapshot `id` (or OTHER/ID) of `session` with extension
 * `ext` (".json", ".tar", ...).  `create`: make the directory.  -EINVAL
 * (CONFIG) for a malformed id.
 */
SBX_WUR int pcommon_snap_file(char **out, const char *provider,
			      const char *session, const char *id,
			      const char *ext, bool create);

/*
 * Write the record of snapshot `id`: the common fields plus every member
 * of `fields` (may be NULL; copied).
 */
SBX_WUR int pcommon_snap_record(const char *provider, const char *session,
				const char *id, const char *message,
				time_t created, const struct cJSON *fields);

/*
 * Read the record of `id` (or OTHER/ID): -ENOENT (NOTFOUND) "no snapshot
 * ID of session S (see `sbx snapshots S`)".
 */
SBX_WUR int pcommon_snap_read(struct cJSON **out, const char *provider,
			      const char *session, const char *id);

/* List the snapshots of `session`, newest first (no directory made). */
SBX_WUR int pcommon_snap_list(const char *provider, const char *session,
			      sbx_snapshot_cb cb, void *payload);

/* Remove the snapshot directory of `session` if it is empty. */
void pcommon_snap_prune(const char *provider, const char *session);

/* ---- what the user is told --------------------------------------------------- */

/*
 * `sbx down` of a sandbox that is no longer running: there is no agent to
 * take a snapshot from.  Prints on stderr that nothing was saved and why
 * (`why`: the provider's reason, e.g. "the pod failed (Evicted)").
 */
void pcommon_report_nothing_saved(const char *session, const char *what,
				  const char *why);

/*
 * A sandbox that failed to start: print the last lines of its log (`log`,
 * may be NULL or empty) on stderr under a heading naming `what`, at most
 * `max_lines` lines, each prefixed, so the reason survives the deletion of
 * the sandbox.
 */
void pcommon_report_log_tail(const char *what, const char *log,
			     int max_lines);

/*
 * Mark `info` (already filled) as failed: state ERROR, extra.error =
 * message, extra.error_reason = reason (a short word such as "Evicted",
 * "DeadlineExceeded", "Error", "NotFound"), extra.gone = gone (the
 * sandbox no longer exists at all).  `sbx status` and `sbx ls` report
 * these (NotFoundError when gone, SandboxError otherwise).
 */
void pcommon_info_failed(struct sbx_sandbox_info *info, const char *reason,
			 bool gone, const char *message);

#endif
