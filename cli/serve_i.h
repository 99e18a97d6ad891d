/*
 * Private interface of `sbx serve` (cli/cmd_serve.c, cli/serve_*.c):
 * cmd_serve.c owns the socket and the request life cycle, serve_routes.c
 * the route table, replies, events and session routes, serve_exec.c the
 * exec stream.  The MHD layer under them is lib/httpd.c (sbx/httpd.h).
 *
 * Threads: libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a handler may block (a create, an
 * exec stream, the event stream).  Lifecycle operations (up, down,
 * snapshot, restore) fork the session daemon and use libgit2; they are
 * serialised process-wide by serve->ops_lock, which also makes two
 * concurrent creates of one session one create (the second finds the
 * session mounted and returns its status).  Across processes the state
 * store's per-session flock serialises them against the CLI as before.
 *
 * Lock order: ops_lock, then ev_lock.  Every thread blocks SIGINT,
 * SIGTERM and SIGHUP; the main thread takes them with sigwait().
 */
#ifndef SBX_SERVE_I_H
#define SBX_SERVE_I_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx/buf.h"
#include "sbx/error.h"

struct MHD_Connection;
struct MHD_Response;
struct cJSON;

/* Largest request body; larger ones get 413. */
#define SERVE_MAX_BODY (1024 * 1024)
/* Events kept for late SSE readers. */
#define SERVE_EV_RING 256

struct serve {
	char *token; /* NULL: no token (a unix socket without --token-file) */
	size_t token_len;
	bool unix_socket; /* peers are checked with SO_PEERCRED */
	atomic_bool stopping;
	pthread_mutex_t ops_lock; /* serialises lifecycle operations */

	pthread_mutex_t ev_lock;
	pthread_cond_t ev_cond;
	uint64_t ev_next;              /* protected by ev_lock */
	char *ev_ring[SERVE_EV_RING];  /* protected by ev_lock */
};

/* One request; lives from the first callback to the completion one. */
struct serve_req {
	struct serve *srv;
	struct MHD_Connection *conn;
	const char *method; /* MHD's, valid for the request */
	const char *url;    /* lib/httpd.c's, valid for the request */
	struct sbx_buf body;
	bool body_too_big;
	bool answered;
	unsigned status;
};

/*
 * Route the request and queue the answer; returns MHD_YES/MHD_NO.  The
 * body (r->body) is complete.  Every error is answered as
 * {"error":{"type":"...","message":"..."}}.
 */
int serve_dispatch(struct serve_req *r);

/*
 * Answer with the current error (sbx_error_last()): status and type from
 * its class and errno (404 NotFoundError, 409, 400 ConfigError, ...);
 * `fallback_type` when the class says nothing more precise.
 */
int serve_reply_error(struct serve_req *r, const char *fallback_type);

/* Answer with an explicit status, type and message. */
int serve_reply_errorf(struct serve_req *r, unsigned status,
		       const char *type, const char *fmt, ...)
	SBX_PRINTF(4, 5);

/* Answer with `j` (borrowed) as JSON. */
int serve_reply_json(struct serve_req *r, unsigned status,
		     const struct cJSON *j);

/* Answer with `take` (a response of any kind, released here). */
int serve_queue(struct serve_req *r, unsigned status,
		struct MHD_Response *take, const char *content_type);

/* The request body as a JSON object (*out owned); an empty body is {}. */
SBX_WUR int serve_body_json(struct cJSON **out, struct serve_req *r);

/*
 * The text a streamed response (events, exec) has formatted and not yet
 * handed to MHD.  `text` is malloc'd, NULL when nothing is pending.
 */
struct serve_pending {
	char *text;
	size_t len, off;
};

/* Make `take` (malloc'd) the pending text; nothing may be pending. */
void serve_pending_set(struct serve_pending *p, char *take);

/*
 * Copy up to `max` pending bytes to `buf` for MHD's content reader; the
 * text is released once all of it is copied.  Returns the count.
 */
size_t serve_pending_copy(struct serve_pending *p, char *buf, size_t max);

/* POST /session/NAME/sandbox/exec (serve_exec.c): the NDJSON stream. */
int serve_h_exec(struct serve_req *r, const char *name);

/*
 * Record a session state change for GET /events: {"session":..,
 * "state":.., "status":{..}|null}.  `status` is borrowed.  Wakes every
 * event stream.  Thread-safe.
 */
void serve_event(struct serve *srv, const char *session, const char *state,
		 const struct cJSON *status);

/* Initialise / finalise the event ring and locks of `srv`. */
void serve_init(struct serve *srv);
void serve_fini(struct serve *srv);

/* Wake event streams so they notice srv->stopping. */
void serve_wake(struct serve *srv);

#endif
