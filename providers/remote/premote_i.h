/*
 * Remote provider internals: a client of sbx-agent (docs/protocol.md).
 * What other providers use (configuration, the HTTP client, opening a
 * sandbox over an agent, tar transfers) is public in sbx/remote.h; this
 * header stays private to providers/remote/.
 *
 *   premote.c        provider ops table, configuration, probe (health +
 *                    info), construction, open(), connect
 *   premote_http.c   libcurl layer over the pool of sbx/http.h (DNS and
 *                    TLS sessions shared, one connection per handle),
 *                    timeouts, error mapping, frame streams, URL and
 *                    query building, base64
 *   premote_env.c    the environment of commands in container sandboxes
 *   premote_fs.c     data plane: every file operation, open and free
 *   premote_nodes.c  the node table (by ino and by path) and identities
 *   premote_fs_dir.c directories, xattrs, bulk walks
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
#include "sbx/hashmap.h"
#include "sbx/proto.h"
#include "sbx/provider.h"
#include "sbx/remote.h"

struct cJSON;

/* ---- configuration (premote.c) ------------------------------------------ */

/*
 * The "remote" configuration section, validated into a struct
 * premote_config (sbx/remote.h):
 *   {"url": "http[s]://host:port[/prefix]",   required
 *    "token_file": "/path",                    required (first line = token)
 *    "timeout": 30,                            seconds, bounds every request
 *    "connect_timeout": 10,                    seconds
 *    "ca_file": "/path/ca.pem",                TLS: trust this CA
 *    "insecure": false}                        TLS: skip verification
 * Validate `section` (may be NULL: then "url" is missing) into *out.
 * -EINVAL (SBX_ERR_CONFIG) with a message naming the key and saying how
 * to set it.  *out is zeroed first and left empty on error.
 */
SBX_WUR int premote_config_parse(struct premote_config *out,
				 const struct cJSON *section);

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

/* The client itself is public (sbx/remote.h); these are its private helpers. */

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
	/* node_at_ino(): writes through it name the inode they are for
	 * (the agent answers ESTALE when the path names another); 0: any. */
	uint64_t expect_ino;
	bool dir;
	unsigned long refs;   /* protected by nodes_lock */
	/* Links in premote_sandbox.by_ino / by_path, protected by
	 * nodes_lock; both unlinked for the root and node_at() nodes
	 * (sbx_hashmap_node_linked() says whether a node is tracked). */
	struct sbx_hashmap_node ino_node, path_node;
	/* When it was (re)linked by path, protected by nodes_lock: among
	 * nodes of one path (hard links, a stale node) the newest wins. */
	uint64_t path_gen;
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
	bool cap_bulk_files; /* POST /v1/fs/bulk (newer agents) */
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

	/*
	 * The tracked nodes (premote_nodes.c), keyed by reported ino
	 * (premote_node.ino_node; hash: the ino itself) and by path
	 * (premote_node.path_node; hash: sbx_fnv1a_str() of the path).
	 * nodes_lock guards both maps, every node's links, path and refs,
	 * and path_gen: sbx_hashmap does no locking of its own, so even a
	 * lookup holds it.
	 */
	pthread_mutex_t nodes_lock;
	struct sbx_hashmap by_ino, by_path;
	uint64_t path_gen;    /* the last premote_node.path_gen handed out */

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

#endif
