/*
 * Private to providers/mem: the sandbox object and the helpers its files
 * share.  pmem.c holds the node operations, bulk, the ops table and
 * pmem_new(); pmem_tree.c the inode tree and every change to it (shared by
 * the operations and pmem_ext_*()); pmem_file.c open files and directory
 * listings; pmem_instr.c the instrumentation (counters, faults, hook, gate)
 * and the change stream.
 *
 * Locks: s->lock protects the tree, the event queue, counters, faults, the
 * hook and the gate.  s->deliver serialises event delivery (the watch
 * thread and watch_sync) so callbacks run in order; it is taken before
 * s->lock and held across the callback, never the other way round.
 * Functions named *_locked are called with s->lock held.
 */
#ifndef SBX_PMEM_I_H
#define SBX_PMEM_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>

#include "sbx/provider.h"

#include "pmem.h"

#define ROOT_INO 1
#define DIR_SIZE 4096

/* Operation names, for counters, faults, hooks and gates. */
enum op {
	OP_LOOKUP, OP_FORGET, OP_GETATTR, OP_SETATTR, OP_READLINK, OP_MKNOD,
	OP_MKDIR, OP_SYMLINK, OP_LINK, OP_UNLINK, OP_RMDIR, OP_RENAME,
	OP_OPEN, OP_CREATE, OP_READ, OP_WRITE, OP_FLUSH, OP_FSYNC,
	OP_RELEASE, OP_FALLOCATE, OP_LSEEK, OP_OPENDIR, OP_READDIR,
	OP_FSYNCDIR, OP_RELEASEDIR, OP_STATFS, OP_NODE_PATH, OP_WATCH_START,
	OP_WATCH_SYNC, OP_WATCH_STOP, OP_BULK, OP_SYNCFS, OP_NODE_AT,
	OP_WRITE_THEN, OP_SETATTR_MANY,
	OP_THEN, /* write_then's second part, after its bytes landed */
	OP_COUNT
};


struct pinode;

struct pdirent {
	char *name;
	struct pinode *ino;
};

struct pinode {
	ino_t ino;
	mode_t mode;
	nlink_t nlink;
	uid_t uid;
	gid_t gid;
	dev_t rdev;
	struct timespec atim, mtim, ctim;
	char *data;           /* regular files */
	size_t size, cap;
	char *target;         /* symlinks */
	struct pdirent *ents; /* directories */
	size_t nents, capents;
};

struct pnode {
	char *path; /* relative to the root; fixed */
	ino_t expect_ino; /* node_at_ino(): writes check it; 0: any */
};

/* A directory snapshot entry (readdir). */
struct psnap {
	char *name;
	struct stat st;
	char *path; /* for readdirplus nodes */
};

struct pfile {
	char *path;
	int flags;
	ino_t expect_ino; /* the node's: writes fail with ESTALE when the
			   * path names another inode; 0: any */
	bool is_dir;
	bool fetched;
	struct psnap *snap; /* "." and ".." first */
	size_t nsnap;
};

struct pevent {
	struct pevent *next;
	uint64_t seq;
	int kind;
	char *path; /* NULL for OVERFLOW */
	char *from; /* ENTRY of a rename's new name: the old one; or NULL */
	uint64_t ino; /* with `from`: what the new name holds (the agent's) */
};

struct fault {
	int err;
	int count; /* -1: until cleared */
};

struct pmem {
	struct sbx_sandbox base;
	struct pnode root_node;
	pthread_mutex_t lock;
	int ino_policy;
	dev_t dev;
	size_t bulk_max_total; /* pmem_opts.bulk_max_total */

	/* The tree. */
	struct pinode **itab; /* by inode number */
	size_t itab_cap;
	ino_t next_ino;       /* PMEM_INO_NEXT */
	struct timespec last_time;

	/* Instrumentation. */
	unsigned long calls[OP_COUNT];
	struct fault faults[OP_COUNT];
	pmem_hook_fn hook;
	void *hook_payload;
	pthread_cond_t gate_cond;
	int gate_op;          /* -1: not armed */
	char *gate_path;      /* NULL: any */
	bool gate_after;      /* park after the work (pmem_gate_arm_after) */
	bool gate_parked, gate_open;

	/* The change stream. */
	pthread_mutex_t deliver;
	pthread_cond_t ev_cond;
	sbx_change_cb cb;
	void *cb_payload;
	bool watching, stopping, held;
	bool unpaired;        /* s->lock: renames as two plain events */
	bool healthy;         /* atomic: read without the lock, as is
			       * `watching` (written under it) */
	pthread_t thread;
	struct pevent *ev_head, *ev_tail;
	size_t ev_count;
	uint64_t seq;
};

#define PMEM(sb) ((struct pmem *)(sb))
#define PNODE(n) ((struct pnode *)(n))
#define PFILE(f) ((struct pfile *)(f))

/* ---- instrumentation and the change stream (pmem_instr.c) --------------- */

/*
 * Start of an operation: gate, hook, counter, fault (see pmem.h).  Returns
 * 0 or the injected error.  Called without s->lock.
 */
int pmem_enter(struct pmem *s, enum op op, const char *path);
/*
 * Count a call of op and fail it if a fault is armed (pmem_fail): the
 * counter and fault part of pmem_enter, for a step inside an operation.
 * s->lock held.
 */
int pmem_fault_locked(struct pmem *s, enum op op, const char *path);
/*
 * Park at the gate if it is armed for op on path at this point (`after`:
 * once the operation's work is done; pmem_gate_arm_after), until released.
 * s->lock held (dropped while parked).
 */
void pmem_gate_locked(struct pmem *s, enum op op, const char *path,
		      bool after);
/* Call the hook (if any) with a name of no operation.  Without s->lock. */
void pmem_hook_point(struct pmem *s, const char *name, const char *path);

/* The body of an operation on one clean path, run under s->lock. */
typedef int (*pmem_locked_fn)(struct pmem *s, const char *path, void *arg);

/*
 * The shape of most operations: pmem_enter(op, path), then fn(s, path, arg)
 * under s->lock.  Returns its error.
 */
int pmem_path_op(struct pmem *s, enum op op, const char *path,
		 pmem_locked_fn fn, void *arg);

/*
 * The same for the entry `name` of directory node `parent` (-EINVAL for a
 * bad name).  On success, when out is not NULL, *out is a new node for the
 * entry's path (the caller's, freed by forget).
 */
int pmem_child_op(struct pmem *s, enum op op, struct sbx_node *parent,
		  const char *name, pmem_locked_fn fn, void *arg,
		  struct sbx_node **out);

/*
 * After operation `op` on `path` succeeded (rename: `newpath` too): fill
 * the calling thread's armed struct sbx_side (sbx/provider.h), if any --
 * the entry's directory (and the new name's, and the object at it) for
 * entry operations, the file for writes.  Caller holds s->lock.
 */
void pmem_side_locked(struct pmem *s, enum op op, const char *path,
		      const char *newpath);

/* Queue a change.  Caller holds s->lock.  `path` NULL for OVERFLOW. */
void pmem_emit_locked(struct pmem *s, int kind, const char *path);
/* The two ENTRY events of a rename (from, then to, which names from and
 * the inode number `ino` it holds now), as the agent reports one made in
 * its tree; two plain ENTRY events after pmem_pair_renames(false). */
void pmem_emit_move_locked(struct pmem *s, const char *from, const char *to,
			   uint64_t ino);

int pmem_op_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			void *payload);
int pmem_op_watch_sync(struct sbx_sandbox *sb);
void pmem_op_watch_stop(struct sbx_sandbox *sb);
bool pmem_op_watch_healthy(struct sbx_sandbox *sb);

/* Stop the stream: join the thread, drop queued events.  Without locks. */
void pmem_watch_fini(struct pmem *s);

/*
 * Release a call parked at the gate and wait until it has left, then free
 * the gate.  For free(); without locks.
 */
void pmem_gate_fini(struct pmem *s);

/* ---- the tree (pmem_tree.c) ---------------------------------------------- */

/* A timestamp strictly after every earlier one. */
struct timespec pmem_stamp_locked(struct pmem *s);
struct pinode *pmem_inode_new_locked(struct pmem *s, mode_t mode);
void pmem_inode_free(struct pinode *in);
/* Free every inode and the table. */
void pmem_tree_fini(struct pmem *s);
void pmem_fill_stat(const struct pmem *s, const struct pinode *in,
		    struct stat *st);

/*
 * Walk a clean path (see sbx_proto_path_clean) to its inode.  Returns
 * -ENOENT or -ENOTDIR (an intermediate component is not a directory).
 */
int pmem_walk_locked(struct pmem *s, const char *path, struct pinode **out);
/*
 * An I/O (`what`: "read", "write", "setattr") meant for the file with
 * inode number ino (0: any): ESTALE when path names another one now, as
 * the agent answers; else pmem_walk_locked()'s result.
 */
int pmem_check_ino_locked(struct pmem *s, const char *path, ino_t ino,
			  const char *what);

/* pmem_locked_fn: the path exists; *(struct stat *)st (may be NULL) its
 * attributes. */
int pmem_stat_locked(struct pmem *s, const char *path, void *st);

/* A clean path from user input (ext functions, node_at). */
int pmem_clean(const char *in, char **out);

/* The path of entry `name` in directory node `dir`; -EINVAL for bad names. */
int pmem_child(struct sbx_node *dir, const char *name, char **out);
struct pnode *pmem_node_new(const char *path);
/* Free a node made by pmem_node_new(). */
void pmem_node_free(struct pnode *n);

/* Make a new object at path.  *st (may be NULL) its attributes. */
int pmem_make_locked(struct pmem *s, const char *path, mode_t mode,
		     dev_t rdev, const char *target, struct stat *st);
int pmem_link_locked(struct pmem *s, const char *from, const char *to,
		     struct stat *st);
int pmem_remove_locked(struct pmem *s, const char *path, bool rmdir);
int pmem_rename_locked(struct pmem *s, const char *from, const char *to,
		       unsigned flags);
/* The regular file at path, for content changes. */
int pmem_regular_locked(struct pmem *s, const char *path,
			struct pinode **out);
void pmem_resize(struct pinode *in, size_t size);
/* The content of `in` (at `path`) is now `size` bytes (zeros added): new
 * mtime and ctime, a DATA change. */
void pmem_data_changed_locked(struct pmem *s, struct pinode *in,
			      const char *path, size_t size);
int pmem_truncate_locked(struct pmem *s, const char *path, off_t size);
/* Write at off (append: at the end).  Returns the count. */
ssize_t pmem_write_locked(struct pmem *s, const char *path,
			  const void *data, size_t len, off_t off,
			  bool append);
int pmem_setattr_locked(struct pmem *s, const char *path,
			const struct stat *a, int valid, struct stat *out);

/* ---- open files and listings (pmem_file.c) ------------------------------- */

int pmem_op_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		 struct sbx_open_result *out);
int pmem_op_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, int flags,
		   struct sbx_node **node_out, struct stat *st,
		   struct sbx_open_result *out);
ssize_t pmem_op_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		     size_t size, off_t off);
ssize_t pmem_op_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		      const void *buf, size_t size, off_t off);
int pmem_op_flush(struct sbx_sandbox *sb, struct sbx_file *fh);
int pmem_op_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync);
int pmem_op_write_then(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *buf, size_t size, off_t off,
		       const struct sbx_write_then *then, struct stat *st,
		       bool *written);
int pmem_op_release(struct sbx_sandbox *sb, struct sbx_file *fh);
int pmem_op_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		      off_t off, off_t len);
off_t pmem_op_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		    int whence);
int pmem_op_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct sbx_file **out);
int pmem_op_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		    unsigned flags, sbx_dirent_cb cb, void *payload);
int pmem_op_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh,
		     bool datasync);
int pmem_op_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh);
int pmem_op_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		   struct statvfs *out);
int pmem_op_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		      char **out);

#endif
