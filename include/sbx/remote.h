/*
 * The remote provider as other providers use it (docs/providers.md,
 * "remote").
 *
 * The kubernetes and modal providers start an sbx-agent themselves (in a
 * pod, in a Modal sandbox) and then reach it exactly as the remote
 * provider reaches any agent: this header is that contract.  It offers
 *
 *   - struct premote_config: where the agent answers (URL, token, TLS,
 *     timeouts), plus the hooks a provider in front of the agent needs:
 *     credentials of the server that proxies to it (struct premote_auth,
 *     asked for per request), the name of that hop for messages, and the
 *     choice of the sandbox's own environment for commands;
 *   - premote_sandbox_connect(): check the agent (protocol, token) and open
 *     the data plane of a session on it -- what a provider's open()
 *     returns;
 *   - premote_agent_ping(): the same check alone (waiting for an agent to
 *     come up);
 *   - struct premote_http: the HTTP client itself, which the kubernetes
 *     provider also uses for the Kubernetes API (any_status, on_data), and
 *     the tar snapshot transfers over it (premote_archive_get/put).
 *
 * Everything else of the remote provider (node table, watch stream, exec
 * streams, the probe's details) is private to providers/remote/
 * (premote_i.h).  Names keep the provider prefix `premote_` (STYLE.md,
 * "Providers").
 *
 * Errors: 0 / negative errno, detail in sbx_error_last() (sbx/error.h).
 * Transport failures carry SBX_ERR_HTTP with the CURLcode (or the HTTP
 * status) in `detail`; errors the agent answers carry SBX_ERR_REMOTE.
 *
 * Threads: a premote_http may be used from any thread at once; a
 * configuration belongs to one thread until handed over.
 */
#ifndef SBX_REMOTE_H
#define SBX_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx/buf.h"
#include "sbx/error.h"
#include "sbx/proto.h"

struct cJSON;
struct sbx_provider;
struct sbx_sandbox;

#define PREMOTE_DEFAULT_TIMEOUT_S 30
#define PREMOTE_DEFAULT_CONNECT_TIMEOUT_S 10
/* JSON answers (listings of huge directories) are capped here. */
#define PREMOTE_MAX_JSON_ANSWER (64u * 1024 * 1024)
/* Query strings (a PATH_MAX path percent-encoded fits many times). */
#define PREMOTE_QUERY_CAP (1024u * 1024)

/* ---- configuration ------------------------------------------------------- */

/*
 * Where an agent answers.  The remote provider fills it from its
 * configuration section (premote_config_parse(), private); providers that
 * start the agent themselves fill it by hand (memset 0 first).  Strings
 * are owned; release with premote_config_fini().
 */
struct premote_config {
	char *url;        /* http[s]://host:port[/prefix], without trailing '/' */
	char *token_file; /* "~" expanded; unused when `token` is set */
	long timeout_ms;  /* bounds every request */
	long connect_timeout_ms;
	char *ca_file;    /* NULL: system CAs */
	bool insecure;    /* TLS: skip verification */
	/*
	 * Set by providers that start the agent themselves (kubernetes,
	 * modal).  `token` replaces token_file; `auth` (owned: released with
	 * the configuration) authenticates to the server in front of the
	 * agent (the Kubernetes API server's pod proxy).
	 */
	char *token;
	struct premote_auth *auth;
	/*
	 * Who answers at `url` when it is not the agent itself, for messages
	 * that must name the hop that failed ("the Kubernetes API server at
	 * https://... (pod proxy of pod P)"); NULL: the agent.  Owned.
	 */
	char *peer;
	/*
	 * Commands run in the sandbox's own environment (the image's and the
	 * pod spec's: kubernetes, modal) rather than one built from the
	 * client's.
	 */
	bool container_env;
};

/* Release the strings and the auth hook; accepts NULL.  Wipes the token. */
void premote_config_fini(struct premote_config *c);

/*
 * TLS and authentication material of the server in front of the agent,
 * for one request.  Blobs are PEM text.  Every member is malloc'd by the
 * auth provider's get() and owned by the caller (premote_creds_fini()).
 */
struct premote_creds {
	char *ca_pem;            /* trust only this CA bundle; NULL: ca_file
				  * or the system CAs */
	size_t ca_pem_len;
	bool insecure;           /* skip TLS verification */
	char *tls_server_name;   /* verify this name instead of the URL's
				  * host; NULL: the host */
	char *bearer;            /* "Authorization: Bearer ..."; NULL: none */
	char *cert_pem, *key_pem; /* client certificate; NULL: none */
	size_t cert_pem_len, key_pem_len;
	char *connect_to;        /* CURLOPT_CONNECT_TO "host:port:h2:p2"
				  * (tls-server-name: the URL carries the
				  * name to verify, this the real address) */
};

void premote_creds_fini(struct premote_creds *c);

/*
 * The transport hook: get() fills *out before each request (refresh: the
 * last credentials were refused with 401, fetch new ones); release(ctx)
 * (may be NULL) runs when the configuration holding it is released.
 * Called from any thread that makes a request.
 */
struct premote_auth {
	int (*get)(void *ctx, bool refresh, struct premote_creds *out);
	void (*release)(void *ctx);
	void *ctx;
};

/* ---- opening a sandbox over an agent ------------------------------------- */

/*
 * Check that an agent answers at cfg->url with our protocol version and
 * accepts the token (GET /v1/info, or /v1/health then /v1/info to say
 * what is wrong), then open the data plane of `session` on it.  Takes
 * `cfg` in every case (its members are moved or released; the struct is
 * zeroed).  Errors say what to check ("cannot reach sbx-agent at URL: ...;
 * is it running?", "the agent at URL refused the token ...").
 */
SBX_WUR int premote_sandbox_connect(struct sbx_sandbox **out,
				    const char *session,
				    struct premote_config *cfg);

/*
 * The check of premote_sandbox_connect() alone: 0 when the agent at
 * cfg->url answers and accepts the token.  `cfg` is borrowed.
 */
SBX_WUR int premote_agent_ping(const struct premote_config *cfg);

/* The remote provider itself (the registry, providers/provider.c). */
SBX_WUR int premote_provider_new(struct sbx_provider **out,
				 const struct cJSON *config);

/* ---- the HTTP client ------------------------------------------------------ */

/*
 * A client for one server: base URL, token, timeouts, and a pool of curl
 * easy handles (sbx/http.h) sharing the DNS cache and TLS sessions, each
 * keeping its own kept-alive connection, so up to as many requests as
 * there are calling threads run at once.  Every request carries the
 * User-Agent sbx/VERSION; a body is sent with any method (DELETE carries
 * Kubernetes DeleteOptions).
 *
 * Threads: every function may be called from any thread concurrently.
 * premote_http_free() must not race with requests.
 */
struct premote_http;

/*
 * `token` may be NULL (only /v1/health then works; or the server is not
 * an agent, and cfg->auth authenticates).  Copies what it needs from cfg
 * (cfg->auth is borrowed: it must outlive the client).  Initialises
 * libcurl globally on first use.
 */
SBX_WUR int premote_http_new(struct premote_http **out,
			     const struct premote_config *cfg,
			     const char *token);
/* Accepts NULL. */
void premote_http_free(struct premote_http *h);

/* The base URL (borrowed). */
const char *premote_http_base(const struct premote_http *h);
/* The configured per-request timeout in milliseconds. */
long premote_http_timeout_ms(const struct premote_http *h);

/* One request.  Strings borrowed for the call. */
struct premote_req {
	const char *method;       /* "GET", "POST", "PUT", "DELETE" */
	const char *route;        /* "/v1/fs/stat" */
	const char *query;        /* encoded, without '?'; NULL for none */
	const void *body;         /* request body, or NULL */
	size_t body_len;
	const char *content_type; /* of the body (SBX_CT_JSON/OCTET) */
	bool no_token;            /* /v1/health */
	bool idempotent;          /* retried once after a dropped connection */
	/*
	 * 0: the configured timeout bounds the whole request.  < 0: no total
	 * bound (streams); then `low_speed_s` > 0 aborts with -ETIMEDOUT when
	 * less than one byte arrived in that many seconds.
	 */
	long timeout_ms;
	long low_speed_s;
	/*
	 * >= 0: a descriptor that becomes readable to abort the request
	 * (-ECANCELED).  The request then runs on a private multi handle.
	 */
	int cancel_fd;
	/*
	 * Request body streamed from a descriptor (read to EOF, sent
	 * chunked) instead of `body`: set body_from_fd and body_fd.
	 */
	bool body_from_fd;
	int body_fd;
	/* A 2xx body written to a descriptor: set out_to_fd and out_fd. */
	bool out_to_fd;
	int out_fd;
	/*
	 * The answer comes from a server, not the agent (the Kubernetes API):
	 * any HTTP answer returns 0, X-Sbx-Agent is not required, and the
	 * caller reads resp->status and resp->body (capped at max_body).
	 */
	bool any_status;
	/*
	 * A 2xx body handed over as it arrives (the Kubernetes watch API's
	 * JSON lines).  Non-zero from the callback stops the request and is
	 * returned.
	 */
	int (*on_data)(const char *buf, size_t len, void *payload);
	/* Where a 2xx body goes (default: resp->body, capped at max_body). */
	size_t max_body;          /* 0: PREMOTE_MAX_JSON_ANSWER */
	void *out;                /* octet bodies: straight into out[out_cap] */
	size_t out_cap;
	sbx_frame_cb frames;      /* frame streams: parsed as they arrive */
	void *payload;
};

struct premote_resp {
	long status;            /* HTTP status; 0 when none came */
	bool agent;             /* the answer carried X-Sbx-Agent */
	struct sbx_buf body;    /* JSON answers and every error body */
	size_t out_len;         /* bytes stored in req->out */
	bool ended;             /* frame stream ended with {"end":true} */
	bool delivered;         /* at least one frame reached the callback */
	long long hdr_size;     /* X-Sbx-Size, -1 when absent */
	uint64_t hdr_ino;       /* X-Sbx-Ino, 0 when absent */
	long retry_after_s;     /* Retry-After in seconds, -1 when absent */
};

void premote_resp_init(struct premote_resp *r);
/* Accepts NULL. */
void premote_resp_fini(struct premote_resp *r);

/*
 * Perform `req`.  Returns 0 for a 2xx answer of the agent (any answer
 * with req->any_status).  Otherwise:
 *  - transport failure: sbx_errno_from_curl() (-ETIMEDOUT, -EIO, ...),
 *    SBX_ERR_HTTP, "METHOD URL: <curl message>";
 *  - an error answer of the agent: its errno (sbx_proto_error_from_json),
 *    SBX_ERR_REMOTE;
 *  - an answer without X-Sbx-Agent (a proxy speaking): -EIO, SBX_ERR_HTTP,
 *    detail = status, "a proxy answered for the agent at URL: HTTP 503 ..."
 *  - a frame stream that ends without {"end":true}: -ECONNRESET
 *    (SBX_ERR_HTTP); the callback's non-zero value when it stopped it.
 * resp->status is set whenever an answer came, so callers can refine
 * messages (401).  Blocks at most the timeout (see premote_req).
 */
SBX_WUR int premote_http_do(struct premote_http *h,
			    const struct premote_req *req,
			    struct premote_resp *resp);

/*
 * Query building: "k=v&k2=v2" with values percent-encoded.  The buffer
 * must be initialised by the caller with sbx_buf_init(q, PREMOTE_QUERY_CAP);
 * passing the cap aborts (a bug, as out of memory).
 */
void premote_q_str(struct sbx_buf *q, const char *key, const char *value);
void premote_q_u64(struct sbx_buf *q, const char *key, uint64_t value);

/* ---- tar transfers (snapshots of providers that keep them as tars) ------- */

/*
 * Snapshot and restore of a directory as a tar stream (GET/PUT
 * /v1/archive).  Neither has a total time bound: a transfer only fails
 * when nothing moves for the configured timeout.  Errors as
 * premote_http_do(): an agent error (-ENOENT, -EINVAL for a bad or
 * refused archive, ...) with SBX_ERR_REMOTE, or a transport error
 * (a stream cut mid-way is -ECONNRESET/-EIO: what reached out_fd is then
 * an incomplete archive and must be discarded).
 */

/* Stream the tar of `path` (relative to the agent root, "" = all) into
 * out_fd. */
SBX_WUR int premote_archive_get(struct premote_http *h, const char *path,
				int out_fd);
/* Send the tar read from in_fd (to EOF) to be extracted at `path`;
 * `replace` removes what the archive does not have.  *entries (may be
 * NULL) gets the number of entries extracted. */
SBX_WUR int premote_archive_put(struct premote_http *h, const char *path,
				int in_fd, bool replace, uint64_t *entries);

#endif
