/*
 * The provider interface: how sbx creates sandboxes and reaches their files.
 *
 * A provider (local, remote, kubernetes, modal, mem) is a versioned table of
 * operations in two halves:
 *
 *  - the control plane (struct sbx_provider_ops): create, get, list,
 *    terminate, snapshot, snapshots, restore, status, and opening the data
 *    plane of one sandbox;
 *  - the data plane of one open sandbox (struct sbx_sandbox_ops): node-based
 *    file operations modelled on the FUSE low-level API, plus exec and watch.
 *
 * Nodes.  The data plane is node based, not path based: lookup() returns a
 * provider-owned `struct sbx_node *` that stays valid until the caller hands
 * it back with forget().  The FUSE daemon keeps one node per kernel inode and
 * deduplicates by `st_dev`/`st_ino` of the returned attributes (hard links,
 * repeated lookups), so a provider may hand out several nodes for one file
 * and must report a stable st_ino for it.  A local provider keeps an O_PATH
 * descriptor in its node (renames need no bookkeeping); a remote provider
 * keeps a path or a remote handle.  The root node is owned by the sandbox and
 * is never forgotten.
 *
 * Errors: every int-returning operation returns 0 or a negative errno and
 * records detail with sbx_error_set() (see sbx/error.h).  The errno is what the
 * mount shows to applications, so it must be the POSIX-meaningful one
 * (-ENOENT for a missing file, -EIO/-ETIMEDOUT for an unreachable sandbox).
 *
 * Threads: data-plane operations are called concurrently from the FUSE
 * worker threads, for different and for the same nodes; providers do their
 * own locking.  Control-plane operations are called from the CLI, serialised
 * per session by the session lock (sbx/state.h).
 *
 * Versioning: a provider sets `version` to the SBX_*_OPS_VERSION it was built
 * against.  Tables of another version are refused where they enter:
 * provider tables by sbx_provider_new() (the registry), sandbox tables by
 * sbx_provider_open() (so open a sandbox through it, not through
 * ops->open directly), both with -EPROTO (SBX_ERR_INTERNAL) naming the
 * provider and the two versions.  Optional
 * operations may be NULL; callers then fail with -ENOSYS (or -EOPNOTSUPP for
 * xattrs/fallocate/copy_file_range) as the kernel expects.
 */
#ifndef SBX_PROVIDER_H
#define SBX_PROVIDER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#include "sbx/error.h"
#include "sbx/sessionstate.h"

struct cJSON;
struct sbx_provider;
struct sbx_sandbox;
struct sbx_sandbox_ops;
struct sbx_node;
struct sbx_file;

#define SBX_PROVIDER_OPS_VERSION 1
#define SBX_SANDBOX_OPS_VERSION 1

/* ------------------------------------------------------------------------ */
/* Control plane                                                            */
/* ------------------------------------------------------------------------ */

/*
 * Sandbox lifecycle states (enum sbx_state, sbx_state_name()) live in
 * sbx/sessionstate.h, shared with the session store.
 */

/*
 * What a provider knows about one sandbox.  Strings are owned by the struct;
 * release with sbx_sandbox_info_fini().
 */
struct sbx_sandbox_info {
	char *session;     /* session name */
	char *provider;    /* "local", "remote", ... */
	char *sandbox_id;  /* provider's id (local: branch name) */
	char *workdir;     /* directory inside the sandbox that is mounted */
	char *isolation;   /* "none", "bwrap", ... (exec isolation in force) */
	enum sbx_state state;
	bool remote;       /* the files live on another machine */
	time_t created_at;
	struct cJSON *extra; /* provider-specific fields, may be NULL */
};

void sbx_sandbox_info_fini(struct sbx_sandbox_info *info);

/*
 * Options for create().  `options` is the provider's section of the merged
 * configuration (see sbx/config.h), borrowed for the call.
 */
struct sbx_create_opts {
	const char *session;
	const char *repo;        /* local: source repository (NULL: cwd's) */
	const char *ref;         /* local: start point (NULL: HEAD) */
	bool carry_changes;      /* local: copy uncommitted changes */
	const struct cJSON *options;
};

/* Flags for terminate(). */
#define SBX_TERMINATE_FORCE 0x1         /* even with uncommitted changes */
#define SBX_TERMINATE_DELETE_BRANCH 0x2 /* local: delete sbx/<name> too */

/* One snapshot, as listed by snapshots(). Strings borrowed for the call. */
struct sbx_snapshot_info {
	const char *id;      /* stable id usable with restore() */
	const char *message;
	time_t created_at;
};

typedef int (*sbx_snapshot_cb)(const struct sbx_snapshot_info *snap,
			       void *payload);
typedef int (*sbx_list_cb)(const struct sbx_sandbox_info *info, void *payload);

struct sbx_provider_ops {
	unsigned version; /* SBX_PROVIDER_OPS_VERSION */
	const char *name;

	/*
	 * Create the sandbox of session `o->session`.  Fails with -EEXIST if
	 * it already exists.  Fills `out` on success.
	 */
	int (*create)(struct sbx_provider *p, const struct sbx_create_opts *o,
		      struct sbx_sandbox_info *out);

	/* Describe an existing sandbox; -ENOENT (NOTFOUND) when unknown. */
	int (*get)(struct sbx_provider *p, const char *session,
		   struct sbx_sandbox_info *out);

	/* Every sandbox this provider knows of; stops when cb returns != 0. */
	int (*list)(struct sbx_provider *p, sbx_list_cb cb, void *payload);

	/*
	 * Remove the sandbox.  Refuses with -EBUSY (SBX_ERR_STATE) when it
	 * holds work that would be lost, unless SBX_TERMINATE_FORCE.
	 * -ENOENT when it does not exist.
	 */
	int (*terminate)(struct sbx_provider *p, const char *session,
			 unsigned flags);

	/*
	 * Record the whole sandbox state without disturbing it.  *id_out
	 * (malloc'd, caller frees) names the snapshot.
	 */
	int (*snapshot)(struct sbx_provider *p, const char *session,
			const char *message, char **id_out);

	/* Snapshots of a session, newest first. */
	int (*snapshots)(struct sbx_provider *p, const char *session,
			 sbx_snapshot_cb cb, void *payload);

	/*
	 * Return the sandbox to snapshot `id`.  First snapshots the current
	 * state so nothing is lost; its id goes to *saved_out (may be NULL).
	 */
	int (*restore)(struct sbx_provider *p, const char *session,
		       const char *id, char **saved_out);

	/*
	 * Open the data plane of an existing sandbox (for the FUSE daemon).
	 * *out is owned by the caller, released with sbx_sandbox_free().
	 */
	int (*open)(struct sbx_provider *p, const char *session,
		    struct sbx_sandbox **out);

	/* Release the provider.  Accepts NULL. */
	void (*free)(struct sbx_provider *p);
};

struct sbx_provider {
	const struct sbx_provider_ops *ops;
	struct cJSON *config; /* owned: the provider's config section */
};

/*
 * Instantiate provider `name` ("local", ...) with its configuration section
 * `config` (borrowed; duplicated).  -ENOENT (CONFIG) for an unknown name.
 */
SBX_WUR int sbx_provider_new(struct sbx_provider **out, const char *name,
			     const struct cJSON *config);
void sbx_provider_free(struct sbx_provider *p);

/* Names of the compiled-in providers, NULL-terminated. */
const char *const *sbx_provider_names(void);

/*
 * Open the data plane of session `session` on provider `p` (ops->open)
 * and check the sandbox ops table it returns: a table of another version
 * than SBX_SANDBOX_OPS_VERSION is released and refused with -EPROTO
 * (SBX_ERR_INTERNAL, "provider NAME: sandbox ops version X, expected Y").
 * -ENOSYS when the provider has no open().  Otherwise what open() returns.
 * *out is owned by the caller (sbx_sandbox_free()).
 */
SBX_WUR int sbx_provider_open(struct sbx_sandbox **out, struct sbx_provider *p,
			      const char *session);

/*
 * The version checks themselves (used by sbx_provider_new() and
 * sbx_provider_open(); public for decorators and tests): 0 when `ops` has
 * the version this build expects, else -EPROTO (SBX_ERR_INTERNAL) naming
 * `provider` (the provider's name, for the message) and both versions.
 */
SBX_WUR int sbx_provider_ops_check(const struct sbx_provider_ops *ops,
				   const char *provider);
SBX_WUR int sbx_sandbox_ops_check(const struct sbx_sandbox_ops *ops,
				  const char *provider);

/* ------------------------------------------------------------------------ */
/* Data plane                                                               */
/* ------------------------------------------------------------------------ */

/*
 * Called by readdir for each entry.  `st` carries at least st_ino and the
 * S_IFMT bits of st_mode.  With SBX_READDIR_PLUS, `st` is complete and
 * `node` is a new node reference for the entry: the callback takes it when
 * it returns 0; otherwise the provider forgets it.  `next` is the cookie to
 * resume after this entry.  Return non-zero to stop (reply buffer full); the
 * entry was then not consumed and will be offered again.
 */
typedef int (*sbx_dirent_cb)(const char *name, const struct stat *st,
			     struct sbx_node *node, off_t next, void *payload);

#define SBX_READDIR_PLUS 0x1

/*
 * Receives change events from watch(); see below.  Objects are named by the
 * identity the provider reports in st_dev/st_ino (the daemon's inode key).
 */
struct sbx_change {
	uint64_t seq;
	int kind;             /* SBX_CHANGE_* */
	dev_t dir_dev;        /* parent directory of `name` */
	ino_t dir_ino;        /* (0 when unknown) */
	const char *name;     /* entry name in dir, NULL when not about a name */
	dev_t dev;            /* the changed object itself; for ENTRY, an */
	ino_t ino;            /* object the name held or now holds (whose
			       * link count changed); 0 when unknown */
	/*
	 * Path-based providers (remote) name the object by its path relative
	 * to the sandbox root instead ("" is the root; NULL when unused).
	 * For ENTRY it is the entry's path ("dir/name"); the caching layer
	 * resolves it and fills in the identities above for the daemon.
	 */
	const char *path;
	/*
	 * ENTRY of a path-based provider, optional: the path the object
	 * `path` names was renamed from inside the sandbox (its own ENTRY
	 * came before); NULL when the change is not known to be a rename.
	 */
	const char *from_path;
};

#define SBX_CHANGE_ENTRY 1    /* name appeared/disappeared in dir */
#define SBX_CHANGE_DATA 2     /* content and attributes changed */
#define SBX_CHANGE_ATTR 3     /* attributes changed */
#define SBX_CHANGE_OVERFLOW 4 /* events lost: invalidate everything */

typedef void (*sbx_change_cb)(const struct sbx_change *c, void *payload);

/* setattr `valid` bits (same meaning as FUSE_SET_ATTR_*). */
#define SBX_SET_MODE 0x01
#define SBX_SET_UID 0x02
#define SBX_SET_GID 0x04
#define SBX_SET_SIZE 0x08
#define SBX_SET_ATIME 0x10
#define SBX_SET_MTIME 0x20
#define SBX_SET_ATIME_NOW 0x80
#define SBX_SET_MTIME_NOW 0x100
#define SBX_SET_CTIME 0x400

/* Per-open results a provider may request from the kernel. */
struct sbx_open_result {
	struct sbx_file *fh;
	bool keep_cache;  /* page cache still valid for this file */
	bool direct_io;   /* bypass the page cache (e.g. /proc-like files) */
	bool nonseekable;
	/*
	 * create: the call made a new file (O_EXCL, or the provider knew the
	 * name free), so no object the daemon knows under its inode number
	 * is this file (the number was a removed file's, reused).
	 */
	bool created;
};

/*
 * One record of a bulk walk (see bulk below).  Borrowed for the callback.
 * A DIR record lists a directory completely; a FILE record carries the
 * whole content of a small regular file.
 */
struct sbx_bulk_entry {
	const char *name;
	struct stat st;
};

struct sbx_bulk_item {
	int kind;                /* SBX_BULK_DIR or SBX_BULK_FILE */
	const char *path;        /* relative to the sandbox root */
	struct stat st;          /* of the directory / file */
	const struct sbx_bulk_entry *entries; /* DIR: all entries */
	size_t nentries;
	const void *data;        /* FILE: the content, st.st_size bytes */
	size_t len;
};

#define SBX_BULK_DIR 1
#define SBX_BULK_FILE 2

typedef int (*sbx_bulk_cb)(const struct sbx_bulk_item *item, void *payload);

struct sbx_bulk_opts {
	size_t max_file;  /* content only for files up to this size */
	size_t max_total; /* stop sending content past this total */
	int depth;        /* levels below the start; -1 unlimited */
	/*
	 * Optional (nfiles > 0): no walk; instead FILE records with the
	 * content of these files (paths relative to the root, borrowed), in
	 * this order.  Files missing, not regular, larger than max_file or
	 * past max_total are left out (the caller reads them itself); `dir`
	 * is ignored.  A provider or agent that cannot: -ENOSYS.
	 */
	const char *const *files;
	size_t nfiles;
};

struct sbx_exec_request;  /* sbx/exec.h */
struct sbx_exec_handle;   /* sbx/exec.h */

/*
 * The repository of a sandbox without git in it (docs/design.md,
 * "Repository in and out"; the agent's /v1/repo routes, docs/protocol.md).
 * The client computes everything with libgit2; the sandbox stores and
 * hands back files.
 */

/* What repo_seed() did. */
struct sbx_repo_seed_result {
	uint64_t entries;         /* tar entries extracted */
	uint64_t bytes;           /* file content written */
	uint64_t index_entries;   /* entries of .git/index */
	uint64_t index_refreshed; /* of which the sandbox filled stat data */
};

/* A pack of the sandbox's repository (objects/pack/NAME.pack + .idx). */
struct sbx_repo_pack {
	char *name;     /* "pack-<40 hex>" */
	uint64_t size;  /* of the .pack */
	uint64_t idx_size;
	char *keep;     /* content of NAME.keep, NULL when there is none */
};

/* The sandbox repository's HEAD, one ref and its object files. */
struct sbx_repo_state {
	char *head;     /* HEAD as stored ("ref: refs/heads/x" or an id) */
	char *oid;      /* the asked ref's object id (40 hex), NULL: absent */
	bool shallow;   /* .git/shallow is not empty */
	char **loose;   /* ids (40 hex) of the loose objects */
	size_t nloose;
	struct sbx_repo_pack *packs;
	size_t npacks;
};

void sbx_repo_state_fini(struct sbx_repo_state *st);

/*
 * Receives the files asked for with repo_objects(), in order, each in one
 * or more pieces: `name` as asked, `size` the whole file's, `data`/`len`
 * the piece at `offset`.  A file that could not be read comes once with
 * `err` < 0 (-ENOENT: packed or removed meanwhile) and no data.  Non-zero
 * stops the transfer and is returned.
 */
typedef int (*sbx_repo_object_cb)(const char *name, uint64_t size,
				  uint64_t offset, const void *data,
				  size_t len, int err, void *payload);

/* One setattr of setattr_many() (struct sbx_sandbox_ops). */
struct sbx_setattr_item {
	struct sbx_node *node;  /* borrowed */
	const struct stat *in;  /* as setattr()'s; borrowed */
	int valid;              /* SBX_SET_* */
	int rc;                 /* out: 0 or -errno */
	/* out: the attributes after it, when rc is 0 and the sandbox said
	 * (st_ino 0 when it did not); setattr_many callers zero it first. */
	struct stat out;
};

/* What write_then() does after its write (struct sbx_sandbox_ops). */
enum sbx_then { SBX_THEN_FSYNC, SBX_THEN_SETATTR };
struct sbx_write_then {
	enum sbx_then kind;
	bool datasync;          /* SBX_THEN_FSYNC */
	const struct stat *in;  /* SBX_THEN_SETATTR: as setattr()'s */
	int valid;              /* SBX_THEN_SETATTR: SBX_SET_* */
};

struct sbx_sandbox_ops {
	unsigned version; /* SBX_SANDBOX_OPS_VERSION */

	/* The root node (owned by the sandbox; never forgotten). */
	struct sbx_node *(*root)(struct sbx_sandbox *sb);

	/*
	 * Find `name` in directory `parent`.  On success *out is a new node
	 * reference (release with forget) and *st its attributes.
	 */
	int (*lookup)(struct sbx_sandbox *sb, struct sbx_node *parent,
		      const char *name, struct sbx_node **out, struct stat *st);

	/* Drop a node reference returned by lookup/create/mkdir/.... */
	void (*forget)(struct sbx_sandbox *sb, struct sbx_node *node);

	/* Attributes of a node; `fh` may be NULL or an open file of it. */
	int (*getattr)(struct sbx_sandbox *sb, struct sbx_node *node,
		       struct sbx_file *fh, struct stat *st);

	/*
	 * Change attributes: mode, owner, size, times per `valid` (SBX_SET_*),
	 * values from `in`.  Fills *out with the new attributes.
	 */
	int (*setattr)(struct sbx_sandbox *sb, struct sbx_node *node,
		       struct sbx_file *fh, const struct stat *in, int valid,
		       struct stat *out);

	int (*readlink)(struct sbx_sandbox *sb, struct sbx_node *node,
			char *buf, size_t size); /* returns length or -errno */

	/*
	 * Optional: setattr() of many nodes in few exchanges (the caching
	 * layer sends its deferred touches so), in order, each item's new
	 * attributes in its `out` where the sandbox reports them.  Returns 0 when every item was attempted, each item's
	 * rc saying how it went (error detail of a failed item is not kept);
	 * -errno when an exchange failed as a whole: then the items from the
	 * first one it carried on have that rc and may or may not be done
	 * (callers only send idempotent changes).  NULL: no batching; the
	 * caching layer then sends each setattr() as it comes.
	 */
	int (*setattr_many)(struct sbx_sandbox *sb,
			    struct sbx_setattr_item *items, size_t n);

	/* Create nodes; each returns a node reference and its attributes. */
	int (*mknod)(struct sbx_sandbox *sb, struct sbx_node *parent,
		     const char *name, mode_t mode, dev_t rdev,
		     struct sbx_node **out, struct stat *st);
	int (*mkdir)(struct sbx_sandbox *sb, struct sbx_node *parent,
		     const char *name, mode_t mode, struct sbx_node **out,
		     struct stat *st);
	int (*symlink)(struct sbx_sandbox *sb, const char *target,
		       struct sbx_node *parent, const char *name,
		       struct sbx_node **out, struct stat *st);
	int (*link)(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct sbx_node *newparent, const char *newname,
		    struct sbx_node **out, struct stat *st);

	int (*unlink)(struct sbx_sandbox *sb, struct sbx_node *parent,
		      const char *name);
	int (*rmdir)(struct sbx_sandbox *sb, struct sbx_node *parent,
		     const char *name);
	/* flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE. */
	int (*rename)(struct sbx_sandbox *sb, struct sbx_node *parent,
		      const char *name, struct sbx_node *newparent,
		      const char *newname, unsigned flags);

	/* Open an existing file; `flags` as open(2). */
	int (*open)(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		    struct sbx_open_result *out);
	/* Create and open (O_CREAT, O_EXCL honoured). */
	int (*create)(struct sbx_sandbox *sb, struct sbx_node *parent,
		      const char *name, mode_t mode, int flags,
		      struct sbx_node **node_out, struct stat *st,
		      struct sbx_open_result *out);

	/* Read up to `size` bytes at `off` into buf; returns count or -errno. */
	ssize_t (*read)(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
			size_t size, off_t off);
	/*
	 * Optional zero-copy path: a descriptor of the open file that the
	 * daemon may splice from (reads) and into (writes) at explicit offsets
	 * instead of calling read/write.  Returns the fd (owned by fh) or
	 * -errno; NULL when the provider has none (remote backends).
	 */
	int (*file_fd)(struct sbx_sandbox *sb, struct sbx_file *fh);
	/* Write; returns count or -errno. */
	ssize_t (*write)(struct sbx_sandbox *sb, struct sbx_file *fh,
			 const void *buf, size_t size, off_t off);
	/*
	 * Optional: a write-back of the kernel's page cache (dirty pages of
	 * a shared mapping) through fh, which the kernel picked among the
	 * file's writable open files: at `off` even when fh was opened
	 * O_APPEND (a plain write() through such a file lands at the end).
	 * NULL: write (right for providers whose open files never append).
	 */
	ssize_t (*write_at)(struct sbx_sandbox *sb, struct sbx_file *fh,
			    const void *buf, size_t size, off_t off);
	/* close(2) of one descriptor of the open file: push buffered data. */
	int (*flush)(struct sbx_sandbox *sb, struct sbx_file *fh);
	int (*fsync)(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync);
	/*
	 * Optional: write `size` bytes at `off`, then do `then` (an fsync of
	 * the file, or a setattr of it as setattr() does), in one exchange,
	 * and fill *st with the file's attributes after both.  Stops at the
	 * first failure.  *written (set in every case) says whether every
	 * byte was written: when false nothing may be assumed written (the
	 * caller keeps the bytes and may write them again; a write at an
	 * offset is idempotent); when true and the result is -errno, the
	 * `then` part failed.  -E2BIG (nothing done) when `size` is more
	 * than one exchange carries or the file is O_APPEND: the caller then
	 * writes and does `then` separately.  NULL: write, then fsync or
	 * setattr.
	 */
	int (*write_then)(struct sbx_sandbox *sb, struct sbx_file *fh,
			  const void *buf, size_t size, off_t off,
			  const struct sbx_write_then *then, struct stat *st,
			  bool *written);
	/* Last reference to the open file is gone; frees fh. */
	int (*release)(struct sbx_sandbox *sb, struct sbx_file *fh);

	/* Optional: fallocate(2), lseek(2) SEEK_DATA/SEEK_HOLE, copy. */
	int (*fallocate)(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
			 off_t off, off_t len);
	off_t (*lseek)(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		       int whence);
	ssize_t (*copy_file_range)(struct sbx_sandbox *sb,
				   struct sbx_file *in, off_t off_in,
				   struct sbx_file *out, off_t off_out,
				   size_t len, int flags);

	/* Directories: opendir → readdir* → releasedir. */
	int (*opendir)(struct sbx_sandbox *sb, struct sbx_node *node,
		       struct sbx_file **out);
	/*
	 * Emit entries after cookie `off` (0 = start) through cb.  `flags`:
	 * SBX_READDIR_PLUS for attributes and nodes (readdirplus).  "." and
	 * ".." are emitted like any entry (so cookies stay the provider's)
	 * but never with a node.
	 */
	int (*readdir)(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		       unsigned flags, sbx_dirent_cb cb, void *payload);
	int (*fsyncdir)(struct sbx_sandbox *sb, struct sbx_file *dh,
			bool datasync);
	int (*releasedir)(struct sbx_sandbox *sb, struct sbx_file *dh);

	int (*statfs)(struct sbx_sandbox *sb, struct sbx_node *node,
		      struct statvfs *out);

	/* Extended attributes (optional).  get/list return length or -errno;
	 * size 0 asks for the needed length, as getxattr(2). */
	ssize_t (*getxattr)(struct sbx_sandbox *sb, struct sbx_node *node,
			    const char *name, void *buf, size_t size);
	ssize_t (*listxattr)(struct sbx_sandbox *sb, struct sbx_node *node,
			     char *buf, size_t size);
	int (*setxattr)(struct sbx_sandbox *sb, struct sbx_node *node,
			const char *name, const void *value, size_t size,
			int flags);
	int (*removexattr)(struct sbx_sandbox *sb, struct sbx_node *node,
			   const char *name);

	/*
	 * Absolute path of `node` inside the sandbox (what a command running
	 * there would use).  *out malloc'd, caller frees.
	 */
	int (*node_path)(struct sbx_sandbox *sb, struct sbx_node *node,
			 char **out);

	/*
	 * Exec (sbx/exec.h): start a command in the sandbox.  NULL when the
	 * provider cannot run commands.
	 */
	int (*exec_start)(struct sbx_sandbox *sb,
			  const struct sbx_exec_request *req,
			  struct sbx_exec_handle **out);

	/*
	 * Watch: start delivering change events to cb from a provider thread.
	 * Returns -ENOSYS when the provider has no change stream (the daemon
	 * then uses short cache timeouts).  Events for names are delivered
	 * with the parent node when the provider can resolve it.
	 */
	int (*watch_start)(struct sbx_sandbox *sb, sbx_change_cb cb,
			   void *payload);
	/*
	 * Deliver every change that happened before this call (the exec
	 * barrier): on return, cb has been called for all of them.
	 */
	int (*watch_sync)(struct sbx_sandbox *sb);
	void (*watch_stop)(struct sbx_sandbox *sb);

	/*
	 * Optional: stream the metadata of the subtree at path `dir` (relative
	 * to the root) and the content of its small files in one exchange,
	 * for prefetching.  Records arrive in breadth-first order.  With
	 * o->nfiles, the content of a list of files instead (see
	 * sbx_bulk_opts).
	 */
	int (*bulk)(struct sbx_sandbox *sb, const char *dir,
		    const struct sbx_bulk_opts *o, sbx_bulk_cb cb,
		    void *payload);

	/*
	 * Optional: push every buffered change to the sandbox (the exec
	 * barrier before a command starts).  Thread-safe.
	 */
	int (*syncfs)(struct sbx_sandbox *sb);

	/*
	 * Optional, for path-based providers: a node reference for `path`
	 * (relative to the root, "" for the root) without any I/O.  The
	 * caching layer (fs/cache.c) wraps only providers that have it, and
	 * addresses everything by path through it.
	 */
	int (*node_at)(struct sbx_sandbox *sb, const char *path,
		       struct sbx_node **out);
	/*
	 * Optional, with node_at: the same, for the object whose inode
	 * number is `ino` (nonzero).  Reads, writes (write, write_then) and
	 * setattrs through the node or files opened on it fail with -ESTALE,
	 * reading or changing nothing, when `path` names another object by
	 * then.  The cache uses it so that bytes buffered for one file never
	 * land in another file moved onto its name behind the mount, and a
	 * descriptor never reads or chmods that other file.  Other calls do
	 * not check.  NULL: the caller uses node_at (no check).
	 */
	int (*node_at_ino)(struct sbx_sandbox *sb, const char *path,
			   uint64_t ino, struct sbx_node **out);

	/*
	 * Optional: `old` (held by the daemon) and `fresh` (just returned,
	 * attributes `st`) report the same (st_dev, st_ino).  True when `old`
	 * no longer names that object -- its names were all removed or now
	 * name other files -- so the number was reused or moved to `fresh`
	 * behind our back; the daemon then gives `fresh` a kernel inode of
	 * its own.  Path-based providers need it: the sandbox reuses inode
	 * numbers the daemon still holds.  Called with the daemon's
	 * inode-table lock held: must not call back into the daemon.
	 */
	bool (*node_stale)(struct sbx_sandbox *sb, struct sbx_node *old,
			   struct sbx_node *fresh, const struct stat *st);

	/*
	 * Optional: the attributes of `node` (held by the daemon) may have
	 * changed in the sandbox without a change naming it: a name of it
	 * was removed or made (a link), and a change stream watching
	 * directories reports the name, not the file's new link count.  Drop
	 * what is cached of them.  False: the kernel had better keep its copy
	 * (the provider cannot ask for the attributes again: a file with no
	 * name left in the sandbox, still open here).  Called with the
	 * daemon's inode-table lock held: must not block on I/O nor call
	 * back into the daemon.  When NULL, the kernel's copy is dropped.
	 */
	bool (*attr_changed)(struct sbx_sandbox *sb, struct sbx_node *node);

	/*
	 * Optional: is the change stream delivering right now?  The daemon
	 * caches for long only while it is (and for 1 s otherwise).  When
	 * NULL, a started stream counts as healthy.
	 */
	bool (*watch_healthy)(struct sbx_sandbox *sb);

	/* Release the sandbox handle (not the sandbox).  Accepts NULL. */
	void (*free)(struct sbx_sandbox *sb);

	/*
	 * Optional: the repository endpoints, for sandboxes on another
	 * machine (NULL: -ENOSYS).  Paths are relative to the root; "" is
	 * the workdir itself.
	 *
	 * repo_seed: extract the tar read from `tar_fd` (to EOF) into
	 * `path`, which must be empty or absent (-ENOTEMPTY otherwise), then
	 * refresh `path`/.git/index; a failure leaves `path` empty.
	 * repo_state: HEAD, `ref` (may be NULL) and the object files of the
	 * repository at `path` (-ENOENT: no .git there); fini *out.
	 * repo_objects: stream `names` ("ab/cdef..." loose objects,
	 * "pack/pack-ID.pack|.idx|.keep") of `path`/.git/objects to cb.
	 * None has a total time bound; each fails when nothing moves for the
	 * configured timeout.
	 */
	int (*repo_seed)(struct sbx_sandbox *sb, const char *path, int tar_fd,
			 struct sbx_repo_seed_result *out);
	int (*repo_state)(struct sbx_sandbox *sb, const char *path,
			  const char *ref, struct sbx_repo_state *out);
	int (*repo_objects)(struct sbx_sandbox *sb, const char *path,
			    const char *const *names, size_t n,
			    sbx_repo_object_cb cb, void *payload);
};

struct sbx_sandbox {
	const struct sbx_sandbox_ops *ops;
	char *session;   /* owned */
	char *workdir;   /* owned: absolute path inside the sandbox */
	/*
	 * Borrowed, may be NULL: where this machine mounts the sandbox, set
	 * by whoever mounts it (the daemon) and valid while the handle is
	 * open.  A provider whose commands run on another machine makes the
	 * path resolve to the workdir there (path identity: a command given
	 * "cd /home/u/sbx/NAME" finds the files).
	 */
	const char *mountpoint;
};

/*
 * Who asks.  Around the operations that make a new object (mknod, mkdir,
 * symlink, create) the FUSE daemon records the caller of the request in a
 * thread-local, so that the object belongs to the caller, as on any file
 * system, when the mount is shared with other users (allow_other,
 * docs/configuration.md).  A thread-local rather than a parameter keeps
 * the ops table (and every provider and decorator) unchanged: the caching
 * layer calls the provider on the same thread.
 *
 * Providers read it with sbx_caller_get() during those operations; NULL
 * means "the daemon's own user".  The local provider, running as root,
 * gives the new object to uid/gid (the directory's group instead when the
 * directory is set-group-ID, as the kernel does); not as root, it cannot.
 * The remote provider sends uid/gid along (docs/protocol.md) and the agent
 * applies them when it runs as root.  `umask` is informational: the
 * kernel has already applied it to the mode it sends.
 */
struct sbx_caller {
	uid_t uid;
	gid_t gid;
	mode_t umask;
};

/* Set the calling thread's caller (copied); NULL clears it. */
void sbx_caller_set(const struct sbx_caller *c);
/* The calling thread's caller, or NULL.  Valid until the next set. */
const struct sbx_caller *sbx_caller_get(void);

/*
 * Attributes on the side (optional both ways).  A remote provider learns
 * the new attributes of the directories an entry operation changed, and of
 * a file it wrote, in the same exchange (one batch, the write's answer);
 * handing them back spares the caller a stat round trip.  Around mknod,
 * mkdir, symlink, link, create, unlink, rmdir, rename and write, a caller
 * that can use them (the caching layer) arms a zeroed struct sbx_side on
 * its thread with sbx_side_arm(); a provider that finds one armed
 * (sbx_side_get() != NULL) during such an operation may fill what it knows
 * and set the matching has_* flag, and must leave the rest alone.
 * Nothing is filled on failure.  Like struct sbx_caller this is a
 * thread-local so the ops table stays unchanged: providers that ignore it
 * (local, decorators) keep working, the caller then asks again.
 *
 *   dir     entry operations: the directory the entry was made in or
 *           removed from (rename: the old name's, link: the new name's),
 *           taken after the change;
 *   newdir  rename into another directory: the new name's directory;
 *   obj     rename (not RENAME_EXCHANGE): the moved object at its new
 *           name, after;
 *   file    write: the written file after the write (the last chunk's).
 */
struct sbx_side {
	struct stat dir, newdir, obj, file;
	bool has_dir, has_newdir, has_obj, has_file;
};

/*
 * Arm `s` (the caller's, zeroed) for the calling thread's next operations;
 * NULL disarms.  The caller keeps ownership and disarms before `s` goes
 * away.  Thread-local, like sbx_caller_set().
 */
void sbx_side_arm(struct sbx_side *s);
/* The calling thread's armed struct sbx_side, or NULL. */
struct sbx_side *sbx_side_get(void);

/* Free a sandbox handle through its ops; accepts NULL. */
void sbx_sandbox_free(struct sbx_sandbox *sb);

#endif
