/*
 * The libmicrohttpd server layer shared by sbx-agent (agent/server.c) and
 * `sbx serve` (cli/cmd_serve.c): listening sockets, starting the daemon
 * with the options both use, the request life cycle (MHD's access-handler
 * protocol turned into begin/body/end/done hooks), a route table of
 * {method, path pattern} matched the same way for both, request bodies
 * accumulated under a size cap, replies (JSON, and the one error shape),
 * and the request log.
 *
 * What stays with each server: its request struct, authentication, its
 * error vocabulary and its handlers.  Both servers reply to an error with
 *	{"error":{KIND:"...","message":"..."}}
 * where KIND is "errno" for the agent (docs/protocol.md: a symbolic errno
 * name, built by sbx_proto_error_to_json()) and "type" for the session API
 * (docs/api.md: an error type such as "NotFoundError", built by
 * sbx_httpd_error_json()).
 *
 * Threads: both servers run MHD with one thread per connection, so a
 * handler may block.  Everything here is callable from any thread; nothing
 * here keeps state between calls.
 *
 * This header and lib/httpd.c (libsbxhttpd) are the only part of lib/ that
 * knows libmicrohttpd; a program that serves nothing links libsbx alone.
 *
 * Errors: 0 or a negative errno with detail in sbx_error_last().
 */
#ifndef SBX_HTTPD_H
#define SBX_HTTPD_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "sbx/buf.h"
#include "sbx/error.h"

struct cJSON;

/* ---- listening sockets --------------------------------------------------- */

/* sbx_httpd_listen_*() flags. */
#define SBX_HTTPD_LISTEN_PRIVATE 0x1 /* unix: create the socket under
				       * umask 077 (owner-only access) */
#define SBX_HTTPD_LISTEN_NUMERIC 0x2 /* tcp: IP:PORT only ("localhost"
				       * is 127.0.0.1), no name lookup */
#define SBX_HTTPD_LISTEN_LOOPBACK 0x4 /* tcp: refuse a non-loopback
					* address (-EPERM) */
#define SBX_HTTPD_LISTEN_QUIET 0x8 /* do not print "listening on ..." on
				    * stdout (tests whose stdout is TAP) */

/*
 * Listen on the unix socket `path`, replacing a stale socket (never any
 * other kind of file) left there.  Prints "listening on unix:PATH" on
 * stdout (the line a parent process waits for).  *fd_out is close-on-exec
 * and non-blocking.  Errors: -ENAMETOOLONG (path empty or longer than a
 * sockaddr_un holds), -errno from socket/bind/listen.
 */
SBX_WUR int sbx_httpd_listen_unix(int *fd_out, const char *path,
				  unsigned flags);

/* The address a TCP listener is bound to (numeric). */
struct sbx_httpd_addr {
	char host[46]; /* INET6_ADDRSTRLEN */
	unsigned port;
};

/*
 * Listen on `spec`: HOST:PORT, [V6]:PORT, or :PORT (every address; not
 * with SBX_HTTPD_LISTEN_NUMERIC); port 0 picks a free one.  Prints
 * "listening on HOST:PORT" (IPv6 in brackets) on stdout and, when
 * `addr_out` is not NULL, stores the bound address there.  Errors: -EINVAL
 * (bad spec, unknown host), -EPERM (SBX_HTTPD_LISTEN_LOOPBACK and the
 * address is not a loopback one), -errno from socket/bind/listen.
 */
SBX_WUR int sbx_httpd_listen_tcp(int *fd_out, struct sbx_httpd_addr *addr_out,
				 const char *spec, unsigned flags);

/* ---- the daemon and the request life cycle ------------------------------- */

struct sbx_httpd;

/* What a request hook did (the hooks below return it, or MHD_NO's -1). */
#define SBX_HTTPD_NEXT 0     /* go on: more body, then `end` */
#define SBX_HTTPD_ANSWERED 1 /* a response is queued: the rest of the body
			      * is dropped and `end` is not called */
#define SBX_HTTPD_CLOSE (-1) /* close the connection */

/*
 * An application's request hooks (struct sbx_httpd_opts), called on the
 * connection's thread (one thread per connection: they may block).  `req`
 * is the application's request object, made by `begin` and released by
 * `done`.
 *
 * begin: the request line and headers are in: make *req_out (also when
 *	answering at once), check the request, route it; maybe answer
 *	(SBX_HTTPD_ANSWERED).  `method` and `url` (the path, decoded) stay
 *	valid until `done` returns.
 * body:  a piece of the request body, in order.
 * end:   the body is complete: answer (SBX_HTTPD_ANSWERED or CLOSE).
 * done:  the request is over, however it ended: release `req`; return
 *	the status answered (0: none) for the request log, which this layer
 *	writes at debug level: "METHOD URL -> STATUS (T ms)", " (aborted)"
 *	when the response did not complete.
 */
typedef int (*sbx_httpd_begin_fn)(void **req_out, void *payload,
				  struct MHD_Connection *conn,
				  const char *method, const char *url);
typedef int (*sbx_httpd_body_fn)(void *req, const char *data, size_t len);
typedef int (*sbx_httpd_end_fn)(void *req);
typedef unsigned (*sbx_httpd_done_fn)(void *req,
				      enum MHD_RequestTerminationCode toe);

/* SBX_HTTPD_ANSWERED when MHD queued the response (`ret`, an
 * MHD_Result), else SBX_HTTPD_CLOSE. */
static inline int sbx_httpd_answered(int ret)
{
	return ret == MHD_YES ? SBX_HTTPD_ANSWERED : SBX_HTTPD_CLOSE;
}

/* MHD_OPTION_UNESCAPE_CALLBACK's function (MHD has no name for it). */
typedef size_t (*sbx_httpd_unescape_fn)(void *payload,
					 struct MHD_Connection *conn, char *s);

struct sbx_httpd_opts {
	int listen_fd; /* from sbx_httpd_listen_*(); MHD closes it at stop */
	/* PEM text of the certificate and key, or both NULL for plain HTTP. */
	const char *tls_cert;
	const char *tls_key;
	size_t conn_memory;      /* per-connection pool; 0: MHD's default */
	unsigned conn_timeout_s; /* idle timeout */
	unsigned conn_limit;     /* 0: MHD's default */
	sbx_httpd_begin_fn begin; /* the request hooks (above) */
	sbx_httpd_body_fn body;
	sbx_httpd_end_fn end;
	sbx_httpd_done_fn done;
	MHD_NotifyConnectionCallback on_connection; /* or NULL */
	sbx_httpd_unescape_fn unescape; /* or NULL: MHD's own */
	void *payload; /* passed to `begin` and the two callbacks above */
};

/*
 * Start libmicrohttpd on o->listen_fd: an internal polling thread, one
 * thread per connection, MHD's messages logged at debug level, TLS when a
 * certificate is given.  Errors: -ENOTSUP (TLS asked for, and this
 * libmicrohttpd has none), -EIO (MHD refused; SBX_LOG=debug shows why).
 * Stop with sbx_httpd_stop(), which joins the connection threads.
 */
SBX_WUR int sbx_httpd_start(struct sbx_httpd **out,
			    const struct sbx_httpd_opts *o);

/* The running daemon, for MHD calls of the application's own. */
struct MHD_Daemon *sbx_httpd_daemon(const struct sbx_httpd *h);

/* Stop the daemon (joins every connection thread) and release `h`.
 * Accepts NULL. */
void sbx_httpd_stop(struct sbx_httpd *h);

/*
 * The signals of a server's main thread: SIGPIPE ignored (writes to a gone
 * client fail with EPIPE instead), SIGINT, SIGTERM and SIGHUP blocked in
 * the calling thread -- and so in every thread started after it, MHD's
 * included -- and set in *set_out for sbx_httpd_wait_signal().  Call it
 * before starting threads (and before printing "listening on", so that a
 * script that stops the server at that line gets a clean exit).  Children
 * must unblock them again.
 */
void sbx_httpd_block_signals(sigset_t *set_out);

/* Wait for one of the signals in `set` (sigwait); its number, or 0 when
 * waiting failed. */
int sbx_httpd_wait_signal(const sigset_t *set);

/* ---- routes -------------------------------------------------------------- */

/*
 * One route's key.  Applications put it first in their own route struct
 * and describe the array with struct sbx_httpd_table.  In `pattern`, '*'
 * stands for one id segment ([A-Za-z0-9_-], 1 to 64 bytes) and '+' for
 * one segment of 1 to 255 bytes other than '/'; the segment is captured.
 */
struct sbx_httpd_route {
	const char *method;
	const char *pattern;
};

/* struct sbx_httpd_table flags. */
#define SBX_HTTPD_ROUTE_SLASH 0x1 /* a trailing '/' on the path matches */

struct sbx_httpd_table {
	const void *routes; /* n entries, stride bytes apart */
	size_t n;
	size_t stride;  /* sizeof the application's route struct */
	/*
	 * NULL: the whole path is matched.  Otherwise the suffix starting at
	 * an occurrence of `anchor`, the last that matches first, so that a
	 * reverse proxy may put any prefix in front ("/v1/").
	 */
	const char *anchor;
	unsigned flags; /* SBX_HTTPD_ROUTE_* */
};

/*
 * Find the route for `method` and `path` (percent-decoded).  On a match,
 * *index_out is its index and *capture_out a malloc'd copy of the
 * segment '*' or '+' matched (NULL when the pattern has none).  Errors
 * (with detail): -ENOENT (no route: 404), -EOPNOTSUPP (the path has routes
 * for other methods only: 405).
 */
SBX_WUR int sbx_httpd_route_find(size_t *index_out, char **capture_out,
				 const struct sbx_httpd_table *t,
				 const char *method, const char *path);

/* The route at `index` of `t` (the application casts it to its type). */
const struct sbx_httpd_route *sbx_httpd_route_at(
	const struct sbx_httpd_table *t, size_t index);

/* ---- request bodies ------------------------------------------------------ */

/*
 * The value of Content-Length, when the request has a valid one: a body
 * over the cap can be refused before it is read.
 */
bool sbx_httpd_content_length(struct MHD_Connection *conn,
			      unsigned long long *out);

/*
 * Append `len` bytes of the request body to `body` (a capped sbx_buf).  At
 * the first piece that does not fit, *too_big is set, the buffer released
 * and -EFBIG returned (with detail); later pieces are dropped with
 * -EFBIG.  Whether to close the connection or answer 413 once the body is
 * in is the caller's choice.
 */
SBX_WUR int sbx_httpd_body_add(struct sbx_buf *body, bool *too_big,
			       const char *data, size_t len);

/* ---- replies ------------------------------------------------------------- */

/*
 * Queue `take` (released here, whatever happens) as the answer with
 * Content-Type `content_type`, "Cache-Control: no-store" and the
 * name/value pairs of `headers` (NULL-terminated; NULL for none).  Returns
 * MHD_YES or MHD_NO, the value the access handler returns.
 */
int sbx_httpd_queue(struct MHD_Connection *conn, unsigned status,
		    struct MHD_Response *take, const char *content_type,
		    const char *const *headers);

/* A response holding `j` (borrowed) printed compactly plus "\n"; NULL
 * when MHD cannot make one. */
struct MHD_Response *sbx_httpd_json_response(const struct cJSON *j);

/* {"error":{kind_key: kind, "message": message}} (see the top). */
struct cJSON *sbx_httpd_error_json(const char *kind_key, const char *kind,
				   const char *message);

/* Monotonic nanoseconds (the request log's clock). */
uint64_t sbx_httpd_now_ns(void);

#endif
