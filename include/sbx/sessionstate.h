/*
 * The lifecycle state of a session's sandbox, and its names.
 *
 * One enum, one name table and one parser for everyone who writes or reads
 * a state: the providers (struct sbx_sandbox_info, sbx/provider.h), the
 * session store (sbx/state.h, the "state" field of the session file), the
 * status object (sbx/status.h) and the HTTP API.  The names are part of
 * the file format and of `sbx status --json`: do not rename them.
 *
 * Implemented in lib/state.c (module prefix sbx_state_), so lib/ needs
 * nothing from the providers library for it.  No state; thread-safe.
 */
#ifndef SBX_SESSIONSTATE_H
#define SBX_SESSIONSTATE_H

/* Sandbox lifecycle states, as reported in the status object. */
enum sbx_state {
	SBX_STATE_CREATING = 0, /* "creating" */
	SBX_STATE_READY,        /* "ready" */
	SBX_STATE_STOPPED,      /* "stopped" */
	SBX_STATE_ERROR,        /* "error" */
};

/*
 * The name of `s` ("creating", "ready", "stopped", "error"); "error" for a
 * value outside the enum.  A static string, never NULL.
 */
const char *sbx_state_name(enum sbx_state s);

/*
 * The state named `name` (exact, lower case).  NULL or an unknown name
 * gives SBX_STATE_ERROR: a record whose state cannot be read is treated as
 * broken, never as ready.
 */
enum sbx_state sbx_state_parse(const char *name);

#endif
