/*
 * The pieces of a libcurl client that every HTTP user in sbx shares (the
 * remote provider's agent client, the Kubernetes API client built on it,
 * and the Modal gRPC channel): global initialisation, one mapping from
 * CURLcode to errno, the User-Agent, request bodies for every method, and
 * a pool of easy handles.
 *
 * Connections are NOT shared between handles.  libcurl 7.88 documents
 * sharing the connection cache (CURL_LOCK_DATA_CONNECT) across threads as
 * unsupported ("not yet safe"); the pool's CURLSH shares the DNS cache and
 * TLS sessions only.  Each pooled handle keeps its own kept-alive
 * connection between uses, so a pool of N handles holds up to N
 * connections to a server and a TLS reconnect resumes the session.
 *
 * libcurl types do not appear here (the header compiles without curl's):
 * handles are `void *` (CURL *) and codes `int` (CURLcode).
 *
 * Threads: every function may be called from any thread; a handle taken
 * from a pool belongs to the caller until it is given back.
 * Errors: 0 or a negative errno with sbx_error_last() (sbx/error.h).
 */
#ifndef SBX_HTTP_H
#define SBX_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "sbx/error.h"

/*
 * curl_global_init() once per process.  -EIO (SBX_ERR_HTTP, detail = the
 * CURLcode) when libcurl cannot be initialised.
 */
SBX_WUR int sbx_http_global_init(void);

/*
 * The one CURLcode → errno mapping (STYLE.md, "one mapping function per
 * foreign library"):
 *   CURLE_OK                                      0
 *   OPERATION_TIMEDOUT                            -ETIMEDOUT
 *   COULDNT_CONNECT                               -ECONNREFUSED
 *   COULDNT_RESOLVE_HOST, COULDNT_RESOLVE_PROXY   -EHOSTUNREACH
 *   SEND_ERROR, RECV_ERROR, GOT_NOTHING, PARTIAL_FILE, HTTP2, HTTP2_STREAM
 *                                                 -ECONNRESET
 *   ABORTED_BY_CALLBACK                           -ECANCELED
 *   anything else (TLS, bad URL, ...)             -EIO
 */
int sbx_errno_from_curl(int code);

/* "sbx/VERSION": the User-Agent of every request sbx makes. */
const char *sbx_http_user_agent(void);

/*
 * Set up `easy` (CURL *) to send `method` with a body of `len` bytes (not
 * copied: it must live until the transfer ends; NULL with len 0 sends an
 * empty body).  Works for every method: POST and PUT, and also DELETE
 * (Kubernetes DeleteOptions) and PATCH, which libcurl otherwise sends
 * without the body.
 */
void sbx_http_set_body(void *easy, const char *method, const void *body,
		       size_t len);

/*
 * Parse one response header line as libcurl's CURLOPT_HEADERFUNCTION gets
 * it (`n` bytes, not NUL-terminated, with its CRLF): when it is header
 * `name` (case-insensitive, followed by ':'), the value without leading
 * blanks and trailing whitespace -- a pointer into `line` with *vlen
 * bytes; otherwise NULL.  Pure.
 */
const char *sbx_http_header_value(const char *line, size_t n,
				  const char *name, size_t *vlen);

/* A pool of easy handles with a DNS + TLS-session share. */
struct sbx_http_pool;

/* Never fails (out of memory aborts); initialises libcurl if needed. */
SBX_WUR int sbx_http_pool_new(struct sbx_http_pool **out);

/* Cleans every idle handle.  No handle may be out.  Accepts NULL. */
void sbx_http_pool_free(struct sbx_http_pool *p);

/*
 * A handle for one transfer, with the share, CURLOPT_NOSIGNAL and the
 * User-Agent already set.  Give it back with sbx_http_pool_put(), which
 * resets its options (its connection stays open for the next user).
 */
void *sbx_http_pool_get(struct sbx_http_pool *p);
void sbx_http_pool_put(struct sbx_http_pool *p, void *easy);

#endif
