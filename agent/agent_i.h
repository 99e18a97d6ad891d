/*
 * sbx-agent internals: the server state, the request context, the route
 * table and the per-area handler entry points.  docs/protocol.md is the
 * contract; include/sbx/proto.h holds the wire encodings shared with the
 * client.
 *
 * Threads.  libmicrohttpd runs one thread per connection
 * (MHD_USE_THREAD_PER_CONNECTION), so a handler and a streaming reader
 * callback may block.  State shared between connections:
 *   - struct agent: immutable after agent_server_run() starts serving,
 *     except `stopping` (atomic);
 *   - the watch ring: agent_watch's own lock (handlers_watch.c);
 *   - the exec table and each process: their own locks (handlers_exec.c);
 *     lock order: table lock before a process's lock.
 * The thread-local error (sbx/error.h) is valid within one handler call.
 *
 * Errors: functions return 0 or a negative errno with detail in
 * sbx_error_last(); handlers turn that into the error JSON.  Handlers are
 * the replying layer and the only one that logs.
 */
#ifndef SBX_AGENT_I_H
#define SBX_AGENT_I_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "sbx/buf.h"
#include "sbx/error.h"
#include "sbx/httpd.h"
#include "sbx/proto.h"

struct cJSON;
struct MHD_Connection;
struct MHD_Daemon;
struct MHD_Response;
struct agent_watch;
struct agent_execs;
struct agent_conns;
struct sbx_batch;
struct agent_stream;

/* Command-line options of `sbx-agent serve`.  Strings borrowed. */
struct agent_options {
	const char *root;
	const char *listen;
	const char *token_file; /* exactly one of token_file and token_env */
	const char *token_env;  /* name of the variable holding the token */
	const char *tls_cert;
	const char *tls_key;
};

struct agent {
	char *root_path; /* realpath of --root */
	int root_fd;     /* O_PATH | O_DIRECTORY */
	bool use_openat2; /* false: the userspace resolver (confine.c) */
	char *token;     /* first line of the token file, or the variable's
			  * value without trailing whitespace */
	size_t token_len;
	char boot_id[33]; /* 128 random bits, hex */
	struct MHD_Daemon *mhd;
	int listen_fd;
	char *unix_path; /* unlinked at exit */
	struct agent_watch *watch;
	struct agent_execs *execs;
	/* Connections that have not shown the token yet (server.c). */
	struct agent_conns *conns;
	atomic_bool stopping;
};

/*
 * The command line: `sbx-agent serve ...`, `--version`, `help`.  Returns
 * the process exit status (0, 1 on errors, 2 on usage errors).
 */
int agent_main(int argc, char **argv);

/* ---- requests (server.c) ------------------------------------------------- */

struct agent_route;

/* One HTTP request; lives from the first access-handler call to
 * MHD's completion callback. */
struct agent_req {
	struct agent *a;
	struct MHD_Connection *conn;
	const struct agent_route *route;
	const char *method; /* borrowed from MHD */
	char *url;          /* the path as received (for logs) */
	char *id;           /* exec id from the route pattern, or NULL */
	struct sbx_buf body;
	bool body_too_big;
	bool answered;      /* a response was queued */
	/* A streamed body's state (routes with `upload`), released by
	 * upload_free when the request ends however it ends. */
	void *upload_state;
	void (*upload_free)(void *upload_state);
	unsigned status;    /* for the request log */
	uint64_t start_ns;
};

/*
 * A handler answers the request by queuing exactly one response with the
 * agent_reply_*() helpers and returns their result (an MHD_Result).
 */
typedef int (*agent_handler)(struct agent_req *r);

/*
 * A streamed request body.  Routes with `upload` get the body as it
 * arrives instead of buffered in r->body (max_body does not apply): the
 * function is called once with (NULL, 0) when the headers are in -- it may
 * answer right away (a bad query), the body is then dropped -- and then
 * with each piece of the body in order, on the connection's thread (it may
 * block).  It returns 0, or a negative errno to abort the connection (no
 * answer).  Errors to answer are kept in r->upload_state and answered by
 * the handler, which runs once the whole body was passed.
 */
typedef int (*agent_upload)(struct agent_req *r, const char *data,
			    size_t len);

struct agent_route {
	/* method and pattern ("/v1/exec/ * /output", '*' = one id) */
	struct sbx_httpd_route match;
	agent_handler handler;
	bool auth;           /* requires X-Sbx-Token */
	size_t max_body;     /* 0: no body expected */
	agent_upload upload; /* NULL: the body is buffered in r->body */
};

/*
 * Find the route for `path` (the URL path, percent-decoded): the suffix
 * starting at the last "/v1/" that begins a known route, so a reverse
 * proxy may add any prefix.  On a match *route_out is set; *id_out gets a
 * malloc'd copy of the '*' segment (NULL when none).  Returns 0, -ENOENT
 * (no route) or -EOPNOTSUPP (the path exists for another method: 405).
 */
int agent_route_find(const struct agent_route **route_out, char **id_out,
		     const char *method, const char *path);

/* ---- replies (server.c) -------------------------------------------------- */

/* Add X-Sbx-Agent and Content-Type, queue, destroy; records the status. */
int agent_reply(struct agent_req *r, unsigned status,
		struct MHD_Response *resp, const char *content_type);
/* Answer a JSON document (taken: deleted here) with `status`. */
int agent_reply_json(struct agent_req *r, unsigned status,
		     struct cJSON *take);
/* {"ok":true} */
int agent_reply_ok(struct agent_req *r);
/*
 * Answer the error JSON for `rc` (negative errno); the message is
 * sbx_error_last()'s when it belongs to rc, else strerror.  Status per
 * sbx_proto_http_status() unless `status` is non-zero.
 */
int agent_reply_error(struct agent_req *r, unsigned status, int rc);

/* Query argument `key` (decoded) or NULL. */
const char *agent_arg(struct agent_req *r, const char *key);
/*
 * Integer query argument: *out = dflt when absent; -EINVAL (with a
 * message) when not a decimal integer within [lo, hi].
 */
int agent_arg_int(struct agent_req *r, const char *key, long long dflt,
		  long long lo, long long hi, long long *out);
/* Unsigned 64-bit query argument (an inode number): 0 when absent. */
int agent_arg_u64(struct agent_req *r, const char *key, uint64_t *out);
/* Parse the request body as a JSON object (-EINVAL when it is not). */
int agent_body_json(struct agent_req *r, struct cJSON **out);

/*
 * Is the client of `conn` still connected?  Used by streams that block
 * waiting for data, so a vanished client frees its thread.
 */
bool agent_conn_alive(struct MHD_Connection *conn);

/* Monotonic clock in nanoseconds. */
uint64_t agent_now_ns(void);

/* Run the server until SIGINT/SIGTERM.  Returns 0 or -errno. */
SBX_WUR int agent_server_run(const struct agent_options *opt);

/* ---- confinement (confine.c) --------------------------------------------- */

/*
 * Normalise a client path: strip leading and repeated '/', drop "."
 * components.  ".." is kept (the resolver refuses escapes with -EXDEV, so
 * "a/../b" works and "../x" does not).  -ENAMETOOLONG beyond PATH_MAX.
 * A path with a NUL never gets here: the request is refused (400) where
 * it is decoded, by server.c's URL unescaping (%00) and by
 * sbx_json_parse() ("\u0000").  *out malloc'd; "" is the root.
 */
static inline SBX_WUR int agent_path_norm(const char *in, char **out)
{
	return sbx_proto_path_norm(in, SBX_PATH_DOTDOT_KEEP, out);
}

/*
 * Open `path` (normalised) beneath the root, following symlinks that stay
 * inside it: openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS), or the
 * userspace equivalent.  `flags` as for open(2) (O_CLOEXEC added).
 * -EXDEV for escapes (.., absolute symlinks, links pointing out).
 */
SBX_WUR int agent_open(struct agent *a, const char *path, int flags,
		       mode_t mode, int *fd_out);

/*
 * Resolve the parent of `path` (following symlinks beneath the root) as an
 * O_PATH directory fd and return the last component, for operations on the
 * last component itself (lstat, unlink, rename, ...).  For the root and for
 * a path ending in "..", *dirfd_out is the object itself and *name_out is
 * "" (use AT_EMPTY_PATH; refuse creating/removing it).  *name_out points
 * into *buf_out (malloc'd; free it).  The caller closes *dirfd_out.
 */
SBX_WUR int agent_parent(struct agent *a, const char *path, int *dirfd_out,
			 const char **name_out, char **buf_out);

/* Probe openat2 (and honour SBX_AGENT_NO_OPENAT2=1 for tests). */
void agent_confine_init(struct agent *a);

/* ---- file system (handlers_fs.c, handlers_batch.c, handlers_bulk.c) ------ */

int agent_h_stat(struct agent_req *r);
int agent_h_list(struct agent_req *r);
int agent_h_read(struct agent_req *r);
int agent_h_write(struct agent_req *r);
int agent_h_readlink(struct agent_req *r);
int agent_h_statfs(struct agent_req *r);
/* POST /v1/fs/batch: ops decoded by sbx/proto_batch.h, run in order. */
int agent_h_batch(struct agent_req *r);
/*
 * Run the decoded batch `b` beneath a's root and return the answer
 * {"results":[...]} (a new object): one result per op, in order, each
 * {"ok":true,...} or an error object (handlers_batch.c).  Needs only
 * a->root_fd and a->use_openat2 (agent_confine_init), so tests run it
 * without a server.
 */
struct cJSON *agent_batch_run(struct agent *a, const struct sbx_batch *b);
/* GET /v1/fs/bulk: the frames of sbx/proto_bulk.h. */
int agent_h_bulk(struct agent_req *r);
/* POST /v1/fs/bulk: the content of the files listed in the body. */
int agent_h_bulk_files(struct agent_req *r);
/*
 * The bulk walk of `path` (normalised) as a stream (handlers_bulk.c):
 * files up to max_file bytes while the total stays within max_total,
 * `depth` levels (0: unlimited), the end frame carrying watch_seq.
 * -errno when `path` is not a directory beneath the root.  *out is
 * released with its fini; agent_h_bulk() answers it, tests call its
 * next() directly.
 */
SBX_WUR int agent_bulk_stream(struct agent *a, const char *path,
			      long long max_file, long long max_total,
			      long long depth, uint64_t watch_seq,
			      struct agent_stream **out);

/*
 * Shared by the file routes (handlers_fs.c).  Errors: negative errno with
 * sbx_error_last(); `what` names the object in messages.
 */
/* The query argument `key` normalised (agent_path_norm); "" when absent. */
SBX_WUR int agent_req_path(struct agent_req *r, const char *key, char **out);
/* lstat of (dfd, name); name "" is dfd itself. */
SBX_WUR int agent_stat_at(int dfd, const char *name, struct stat *st,
			  const char *what);
/*
 * The entries array of directory `path` (sbx_proto_entry_encode), and in
 * *dirst the attributes of the directory listed (fstat of the descriptor
 * read, so they name the object whose entries these are, even if the path
 * changed meanwhile).
 */
SBX_WUR int agent_list(struct agent *a, const char *path, struct cJSON **out,
		       struct stat *dirst);
/* o["st"] = the stat array of st. */
void agent_put_st(struct cJSON *o, const struct stat *st);
/*
 * Open `path` (agent_open) for a write that was meant for the object with
 * inode number `ino` (0: any object).  -ESTALE, with nothing opened, when
 * the path names another object: the client buffered bytes for a file
 * that was since moved away or replaced, and they must not land in
 * whatever took its name.  The object is looked at before the open (an
 * O_PATH open) and after it (fstat); the descriptor's number must match,
 * except on overlayfs, where opening a lower-layer file for writing copies
 * it up and may give it a new number: there the object before the open
 * matching, with the same size and mtime, is enough.
 */
/*
 * Is fd (attributes `after`), opened by a path that named an object with
 * attributes `before` just earlier, the file with inode number ino?  Its
 * own number says so, or, on overlayfs only, a copy-up of `before`
 * (agent_open_ino).
 */
bool agent_same_object(int fd, const struct stat *before,
		       const struct stat *after, uint64_t ino);
SBX_WUR int agent_open_ino(struct agent *a, const char *path, int flags,
			   uint64_t ino, int *fd_out);
/* Write all of data at off (or at the end when `append`). */
SBX_WUR int agent_write_all(int fd, const void *data, size_t len,
			    long long off, bool append, const char *what);
/* The root file system's statvfs object. */
SBX_WUR int agent_statfs_json(struct agent *a, struct cJSON **out);

/* ---- watch (handlers_watch.c) -------------------------------------------- */

/* Start the recursive watch of the root.  Failure is not fatal: the agent
 * serves without the `watch` capability and logs why. */
SBX_WUR int agent_watch_start(struct agent *a);
void agent_watch_stop(struct agent *a);
/* Wake blocked watch streams (shutdown). */
void agent_watch_wake(struct agent *a);
bool agent_watch_enabled(struct agent *a);
/* The sequence number of the last event. */
uint64_t agent_watch_seq(struct agent *a);
/*
 * Barrier: every change queued by inotify before the call has its sequence
 * number when this returns; then answers agent_watch_seq().  On timeout
 * the current sequence is returned after an overflow event, so a client
 * never trusts a sequence that may miss changes.
 */
uint64_t agent_watch_sync_seq(struct agent *a);

int agent_h_watch(struct agent_req *r);

/* ---- exec (handlers_exec.c) ---------------------------------------------- */

SBX_WUR int agent_exec_init(struct agent *a);
/* Kill every process group and free the table (after the server stopped). */
void agent_exec_fini(struct agent *a);
void agent_exec_wake(struct agent *a);

int agent_h_exec_start(struct agent_req *r);
int agent_h_exec_output(struct agent_req *r);
int agent_h_exec_stdin(struct agent_req *r);
int agent_h_exec_resize(struct agent_req *r);
int agent_h_exec_signal(struct agent_req *r);
int agent_h_exec_status(struct agent_req *r);
int agent_h_exec_delete(struct agent_req *r);

/* ---- archive (handlers_archive.c) --------------------------------------- */

/* GET /v1/archive: the tar stream of a directory. */
int agent_h_archive_get(struct agent_req *r);
/* PUT /v1/archive: extract the tar body (agent_archive_upload) and answer. */
int agent_h_archive_put(struct agent_req *r);
int agent_archive_upload(struct agent_req *r, const char *data, size_t len);

/*
 * The extractor of PUT /v1/archive, for routes that extract a tar body and
 * then do more (PUT /v1/repo/seed).  agent_extract_begin() creates `path`
 * (normalised, relative to the root) with its parents and sets
 * r->upload_state/upload_free; the body's pieces then go to
 * agent_archive_upload(); agent_extract_finish() ends the archive (the
 * first error, its HTTP status in *status_out, 0 meaning "by errno").
 * agent_extract_confined() is confine.c's view with `path` as the root
 * (for resolving names the archive made); agent_extract_clear() removes
 * everything beneath `path` (undoing a failed seed of an empty
 * directory).  Errors: negative errno with sbx_error_last().
 */
SBX_WUR int agent_extract_begin(struct agent_req *r, const char *path,
				bool replace);
SBX_WUR int agent_extract_finish(struct agent_req *r, uint64_t *entries,
				 uint64_t *bytes, unsigned *status_out);
struct agent *agent_extract_confined(struct agent_req *r);
SBX_WUR int agent_extract_clear(struct agent_req *r);

/* ---- repository (handlers_repo.c, gitindex.c) ----------------------------- */

/* PUT /v1/repo/seed: extract a repository's tar into an empty directory,
 * then refresh its index (gitindex.h). */
int agent_repo_seed_upload(struct agent_req *r, const char *data, size_t len);
int agent_h_repo_seed(struct agent_req *r);
/* GET /v1/repo/state: HEAD, one ref, the loose objects and the packs. */
int agent_h_repo_state(struct agent_req *r);
/* POST /v1/repo/objects: the named files under .git/objects, as frames. */
int agent_h_repo_objects(struct agent_req *r);

/* ---- path identity (alias.c) ----------------------------------------------- */

/*
 * An exec's "alias": the absolute path where the client mounts the
 * sandbox, made to lead to the root for the command (docs/protocol.md,
 * "Exec").  The command still starts in its confined cwd under the root;
 * the alias only makes the client's paths resolve.
 * agent_alias_prepare() runs in the agent before fork: it decides how
 * (and creates the symlink when that is the way); the child calls
 * agent_alias_enter() before exec.
 */
enum agent_alias_mode {
	AGENT_ALIAS_NONE = 0, /* not asked for, or not possible */
	AGENT_ALIAS_READY,    /* the path already leads to the root (a
			       * symlink made by us, or the root itself) */
	AGENT_ALIAS_BIND,     /* a private mount namespace with the root
			       * bind-mounted over the path (root only) */
};

struct agent_alias {
	int mode;         /* enum agent_alias_mode */
	char *path;       /* the alias, normalised (malloc'd) */
	const char *root; /* borrowed: the agent's root path */
};

/*
 * Decide for `alias` (from the request; NULL or "" for none).  Never
 * fails: a path that cannot be provided gives AGENT_ALIAS_NONE (logged
 * at debug level).
 */
void agent_alias_prepare(struct agent *a, const char *alias,
			 struct agent_alias *out);
void agent_alias_fini(struct agent_alias *al);
/*
 * In the child, after fork: for BIND, a private mount namespace with the
 * root bind-mounted at the alias.  Async-signal-safe; a failure leaves
 * the command without the alias.
 */
void agent_alias_enter(const struct agent_alias *al);

/* ---- health and info (routes.c) ------------------------------------------ */

int agent_h_health(struct agent_req *r);
int agent_h_info(struct agent_req *r);

/* ---- streams (server.c) -------------------------------------------------- */

/*
 * A streamed frames response.  `next` is called (on the connection's thread,
 * may block) to append at least one frame to `out`; it returns 0 to go on,
 * 1 when the stream is complete (after the end frame), or a negative errno
 * to abort the connection (the client sees a dropped stream).  `fini`
 * releases the state (also when the client went away).
 */
struct agent_stream {
	int (*next)(struct agent_stream *s, struct sbx_buf *out);
	void (*fini)(struct agent_stream *s);
	struct agent *a;
	struct MHD_Connection *conn;
};

/* Answer `s` (taken) as application/octet-stream frames. */
int agent_reply_stream(struct agent_req *r, struct agent_stream *s);

/*
 * Append one frame (hdr taken).  Producers size frames below the protocol
 * limits; a frame that still does not fit is logged and left out whole.
 */
void agent_frame(struct sbx_buf *out, struct cJSON *take_hdr,
		 const void *data, size_t len);

#endif
