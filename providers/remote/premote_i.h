/*
 * Remote provider internals: a client of sbx-agent (docs/protocol.md).
 *
 *   premote.c        provider ops table, configuration, probe (health +
 *                    info), construction, open()
 *   premote_http.c   libcurl layer over the pool of sbx/http.h (DNS and
 *                    TLS sessions shared, one connection per handle),
 *                    timeouts, error mapping, frame streams, URL and
 *                    query building, base64
 *   premote_env.c    the environment of commands in container sandboxes
 *   premote_fs.c     data plane: node table, every file operation
 *   premote_watch.c  change stream thread (GET /v1/watch), watch_sync
 *   premote_exec.c   exec handle over POST /v1/exec (attach)
 *
 * Identity.  A remote sandbox is "whatever agent answers at this URL": the
 * sandbox id is the URL, the workdir is the agent's root, and the provider
 * keeps no state of its own (sessions live in the state store).  Every file
 * is reported with st_dev = premote_sandbox.dev (a constant per sandbox) and
 * st_ino = the agent's inode number, mixed with the remote st_dev when the
 * file lives on another filesystem than the root (premote_fix_stat()).
 *
 * Lock order: premote_sandbox.nodes_lock, then nothing else; the watch and
 * exec locks are leaves too.  No lock is held across HTTP requests or
 * callbacks into the daemon.
 *
 * Errors: 0 / negative errno, detail in sbx_error_last() (sbx/error.h).
 * Transport failures carry SBX_ERR_HTTP with the CURLcode (or the HTTP
 * status) in `detail`; agent errors carry SBX_ERR_REMOTE.
 */
#ifndef PREMOTE_I_H
#define PREMOTE_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "sbx/buf.h"
#include "sbx/error.h"
#include "sbx/proto.h"
#include "sbx/provider.h"

struct cJSON;

#define PREMOTE_DEFAULT_TIMEOUT_S 30
#define PREMOTE_DEFAULT_CONNECT_TIMEOUT_S 10
/* JSON answers (listings of huge directories) are capped here. */
#define PREMOTE_MAX_JSON_ANSWER (64u * 1024 * 1024)
/* Query strings (a PATH_MAX path percent-encoded fits many times). */
#define PREMOTE_QUERY_CAP (1024u * 1024)

/* ---- configuration (premote.c) ------------------------------------------ */

/*
 * The "remote" configuration section, validated:
 *   {"url": "http[s]://host:port[/prefix]",   required
 *    "token_file": "/path",                    required (first line = token)
 *    "timeout": 30,                            seconds, bounds every request
 *    "connect_timeout": 10,                    seconds
 *    "ca_file": "/path/ca.pem",                TLS: trust this CA
 *    "insecure": false}                        TLS: skip verification
 * Strings are owned; release with premote_config_fini().
 */
struct premote_config {
	char *url;        /* without trailing '/' */
	char *token_file; /* "~" expanded */
	long timeout_ms;
	long connect_timeout_ms;
	char *ca_file;    /* NULL: system CAs */
	bool insecure;
	/*
	 * Not from the section: set by providers that start the agent
	 * themselves (kubernetes, modal).  `token` replaces token_file;
	 * `auth` (owned: released with the configuration) authenticates to
	 * the server in front of the agent (the Kubernetes API server's pod
	 * proxy).
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
	 * client's: see premote_exec_env().
	 */
	bool container_env;
};

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

struct premote_auth {
	int (*get)(void *ctx, bool refresh, struct premote_creds *out);
	void (*release)(void *ctx); /* may be NULL */
	void *ctx;
};

/*
 * Validate `section` (may be NULL: then "url" is missing) into *out.
 * -EINVAL (SBX_ERR_CONFIG) with a message naming the key and saying how
 * to set it.  *out is zeroed first and left empty on error.
 */
SBX_WUR int premote_config_parse(struct premote_config *out,
				 const struct cJSON *section);
void premote_config_fini(struct premote_config *c);

/*
 * Check that an agent answers at cfg->url with our protocol version and
 * accepts the token (GET /v1/health, then /v1/info).  On success *http_out
 * is a client for it (caller frees) and *info what it said (caller
 * premote_info_fini()s).  Errors say what to check.
 */
struct premote_http;
struct premote_info;
SBX_WUR int premote_probe(const struct premote_config *cfg,
			  struct premote_http **http_out,
			  struct premote_info *info);

/*
 * Read the token: the first line of `path`, without trailing whitespace
 * (sbx_token_file_read()).  -ENOENT/-EACCES (SBX_ERR_CONFIG) when
 * unreadable, -EINVAL when empty, -EPERM when group or others may access
 * the file (the message says chmod 600).  Messages name the file, never
 * the token.  *out malloc'd.
 */
SBX_WUR int premote_token_read(char **out, const char *path);

/* ---- HTTP (premote_http.c) ----------------------------------------------- */

/*
 * A client for one agent: base URL, token, timeouts, and a pool of curl
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
 * `token` may be NULL (only /v1/health then works).  Copies what it needs
 * from cfg.  Initialises libcurl globally on first use.
 */
SBX_WUR int premote_http_new(struct premote_http **out,
			     const struct premote_config *cfg,
			     const char *token);
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
	long retry_after_s;     /* Retry-After in seconds, -1 when absent */
};

void premote_resp_init(struct premote_resp *r);
void premote_resp_fini(struct premote_resp *r);

/*
 * Perform `req`.  Returns 0 for a 2xx answer of the agent.  Otherwise:
 *  - transport failure: premote_errno_from_curl() (-ETIMEDOUT, -EIO, ...),
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
 * Convenience: a JSON request and answer.  `body` (may be NULL) is sent
 * as JSON; *out (may be NULL) receives the parsed answer object (caller
 * cJSON_Delete()s).  -EPROTO when the answer is not a JSON object.
 */
SBX_WUR int premote_http_json(struct premote_http *h, const char *method,
			      const char *route, const char *query,
			      const struct cJSON *body, bool idempotent,
			      struct cJSON **out);

/*
 * Map a CURLcode (passed as int) to a negative errno: sbx_errno_from_curl()
 * (sbx/http.h), the one mapping shared with the Modal gRPC client.
 */
int premote_errno_from_curl(int code);

/* True for the errnos of premote_errno_from_curl() that mean "connection
 * lost or never made" (worth a reconnect). */
bool premote_errno_is_transport(int rc);

/*
 * "<base>/v1/..." plus "?query" when query is non-empty.  `route` starts
 * with '/'; `base` has no trailing '/'.  malloc'd.
 */
char *premote_url(const char *base, const char *route, const char *query);

/*
 * Normalise a configured base URL: requires an http:// or https:// scheme
 * and a host, strips trailing '/'.  -EINVAL (SBX_ERR_CONFIG) otherwise.
 * *out malloc'd.
 */
SBX_WUR int premote_url_normalise(char **out, const char *url);

/* Query building: "k=v&k2=v2" with values percent-encoded.  The buffer
 * must be initialised by the caller with sbx_buf_init(q, PREMOTE_QUERY_CAP);
 * passing the cap aborts (a bug, as out of memory). */
void premote_q_str(struct sbx_buf *q, const char *key, const char *value);
void premote_q_u64(struct sbx_buf *q, const char *key, uint64_t value);

/* ---- sandbox (premote_fs.c) ---------------------------------------------- */

/*
 * A node: a path relative to the agent's root plus the identity last seen
 * there.  Nodes returned by lookup (and the other entry-creating
 * operations) are kept in a table by ino, so one remote file has one node
 * whatever name it was found under, and its path follows renames: a
 * rename through the mount rewrites the paths below it, and a lookup that
 * finds a known directory under a new name moves it (and its subtree).
 * node_at() nodes (for fs/cache.c) are private, untracked and ino 0.
 */
struct premote_node {
	char *path;           /* protected by nodes_lock */
	uint64_t ino;         /* reported st_ino; 0 for node_at() nodes */
	bool dir;
	bool hashed;          /* in the tables */
	unsigned long refs;   /* protected by nodes_lock */
	struct premote_node *ino_next, *path_next;
};

struct premote_watch; /* premote_watch.c */

/* What /v1/info said. */
struct premote_info {
	char *version;
	char *root;
	char *boot_id;
	uint64_t watch_seq;
	long protocol;
	bool cap_watch, cap_exec, cap_bulk, cap_xattr, cap_pty;
	/* The root's attributes ("root_st", newer agents): opening the
	 * sandbox then needs no stat of its own. */
	bool has_root_st;
	struct stat root_st;
};

void premote_info_fini(struct premote_info *i);
/* Decode an info answer; -EPROTO naming the bad field. */
SBX_WUR int premote_info_parse(struct premote_info *out,
			       const struct cJSON *j);

struct premote_sandbox {
	struct sbx_sandbox base;
	struct premote_config cfg;
	struct premote_http *http;
	struct premote_info info;
	dev_t dev;            /* reported st_dev of every file */
	uint64_t root_rdev;   /* the root's remote st_dev (ino mixing) */
	struct premote_node root;

	pthread_mutex_t nodes_lock;
	struct premote_node **by_ino, **by_path; /* protected by nodes_lock */
	size_t nbuckets, count;

	struct premote_watch *watch;

	/* The sandbox's own environment (container_env), read once. */
	pthread_mutex_t cenv_lock;
	char **cenv;          /* protected by cenv_lock; NULL: not read */
	bool cenv_tried;      /* protected by cenv_lock */

	/* Newest watch_seq reported by an exec exit not yet synced. */
	pthread_mutex_t seq_lock;
	uint64_t exec_seq;    /* protected by seq_lock */
	bool exec_seq_set;
};

#define PREMOTE_SB(sb) ((struct premote_sandbox *)(sb))

extern const struct sbx_sandbox_ops premote_sandbox_ops;

/*
 * Open the data plane for `session`: takes ownership of `http` and of the
 * strings in `cfg` and `info` (moved; the structs are zeroed), stats the
 * root.  On error everything taken is released.
 */
SBX_WUR int premote_sandbox_open(struct sbx_sandbox **out,
				 const char *session,
				 struct premote_config *cfg,
				 struct premote_http *http,
				 struct premote_info *info);

/* Rewrite a decoded stat for the mount: st_dev/st_ino (see above). */
void premote_fix_stat(const struct premote_sandbox *s, struct stat *st);

/*
 * The identity the mount knows for `path` (the newest tracked node there):
 * its st_ino, or 0 when the daemon holds no node for it.  Thread-safe.
 */
uint64_t premote_ino_at(struct premote_sandbox *s, const char *path);

/* Map transport errnos to what the mount shows (-EIO; -ETIMEDOUT kept). */
int premote_fs_errno(int rc);

/* Record the watch_seq an exec reported at exit (for watch_sync). */
void premote_note_exec_seq(struct premote_sandbox *s, uint64_t seq);

/* ---- watch (premote_watch.c) --------------------------------------------- */

int premote_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			void *payload);
int premote_watch_sync(struct sbx_sandbox *sb);
void premote_watch_stop(struct sbx_sandbox *sb);
/* The stream is connected and has said hello since the last drop. */
bool premote_watch_healthy(struct sbx_sandbox *sb);

/*
 * Turn one watch frame into a change for the daemon.  Returns 1 and fills
 * *c (c->path/c->name point into `hdr`, valid while it lives) for
 * entry/data/attr/overflow; 0 for frames that are not changes (hello,
 * heartbeat, unknown kinds); -EPROTO for a malformed change.  ino fields
 * are left 0 (the caller resolves them).  Pure; exposed for tests.
 */
int premote_change_from_frame(const struct cJSON *hdr, struct sbx_change *c);

/* ---- exec (premote_exec.c) ----------------------------------------------- */

/*
 * The environment of a command in a container_env sandbox
 * (premote_env.c): the sandbox's own environment (read once per sandbox
 * by running `env -0` there with the agent's environment), overlaid with
 * what the client sent except PATH, HOME, USER, LOGNAME and SHELL -- unless
 * the user set those explicitly (`sbx exec -e`, named in SBX_EXEC_SET).
 * When the sandbox's environment cannot be read (an image without env),
 * `envp` is used as it is.  SBX_EXEC_SET itself is never passed on (for
 * every remote sandbox).  *out is NULL-terminated and owned by the caller
 * (premote_env_free()).  Thread-safe.
 */
SBX_WUR int premote_exec_env(struct premote_sandbox *s,
			     const char *const *envp, char ***out);
/* Release the cached environment (premote_sandbox teardown). */
void premote_exec_env_fini(struct premote_sandbox *s);
/* Free a list from premote_exec_env(); accepts NULL. */
void premote_env_free(char **env);

int premote_exec_start(struct sbx_sandbox *sb,
		       const struct sbx_exec_request *req,
		       struct sbx_exec_handle **out);

/*
 * Decode the exit object of an exec output stream into a wait(2) status:
 * {"code":C,"signal":S}: S > 0 → killed by S, else exited with C & 255.
 * -EPROTO when malformed.  Exposed for tests.
 */
SBX_WUR int premote_exit_status(const struct cJSON *exit_obj, int *status);

/* ---- repository (premote_repo.c) ----------------------------------------- */

/* The data plane's repo_seed, repo_state and repo_objects (sbx/provider.h). */
int premote_repo_seed(struct sbx_sandbox *sb, const char *path, int tar_fd,
		      struct sbx_repo_seed_result *out);
int premote_repo_state(struct sbx_sandbox *sb, const char *path,
		       const char *ref, struct sbx_repo_state *out);
int premote_repo_objects(struct sbx_sandbox *sb, const char *path,
			 const char *const *names, size_t n,
			 sbx_repo_object_cb cb, void *payload);

/* ---- provider (premote.c) ------------------------------------------------ */

SBX_WUR int premote_provider_new(struct sbx_provider **out,
				 const struct cJSON *config);

/* ---- archive (premote_archive.c) ---------------------------------------- */

/*
 * Snapshot and restore of a directory as a tar stream (GET/PUT
 * /v1/archive).  Neither has a total time bound: a transfer only fails
 * when nothing moves for the configured timeout.  Errors as
 * premote_http_do(): an agent error (-ENOENT, -EINVAL for a bad or
 * refused archive, ...) with SBX_ERR_REMOTE, or a transport error
 * (a stream cut mid-way is -ECONNRESET/-EIO: what reached out_fd is then
 * an incomplete archive and must be discarded).
 */

/* Stream the tar of `path` (relative to the agent root, "" = all) into out_fd. */
SBX_WUR int premote_archive_get(struct premote_http *h, const char *path, int out_fd);
/* Send the tar read from in_fd (to EOF) to be extracted at `path`; `replace` removes what the archive does not have. */
SBX_WUR int premote_archive_put(struct premote_http *h, const char *path, int in_fd, bool replace, uint64_t *entries);

#endif
