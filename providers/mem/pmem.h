/*
 * The in-memory sandbox ("mem"), for tests only.
 *
 * A data plane (struct sbx_sandbox with struct sbx_sandbox_ops, see
 * sbx/provider.h) over a file tree held in memory, shaped like the remote
 * provider so that fs/cache.c can be driven without a network:
 *
 *  - Path based.  A node is a path relative to the root ("" is the root),
 *    fixed when the node is made: every call resolves it afresh, so a node
 *    names whatever is at its path at the time of the call.  node_at()
 *    makes one without I/O; lookup and the creating operations make one
 *    for the entry they found or made.  Nodes do not follow renames (like
 *    the remote provider's node_at() nodes).  The root node belongs to the
 *    sandbox; forget() of it does nothing.
 *  - Open files are paths too, like the remote agent, which opens the path
 *    at each request: read, write, fsync and fallocate resolve the path the
 *    file was opened with *at the time of the call*.  A file renamed or
 *    unlinked behind an open file therefore gives -ENOENT on its next
 *    write, exactly as with the remote provider; a new file at that path
 *    receives the write -- unless the file was opened on a node_at_ino()
 *    node whose inode number the path no longer names: then the write
 *    fails with -ESTALE, as the agent's writes that carry an inode number.
 *    Opening checks that the path exists (-ENOENT) and
 *    is not a directory opened for writing (-EISDIR); O_TRUNC with write
 *    access truncates, as the remote provider's setattr size=0 does.
 *  - Objects: directories, regular files (content in memory), symlinks
 *    (never followed: an intermediate component that is not a directory
 *    gives -ENOTDIR), device nodes/fifos/sockets (mknod: attributes only)
 *    and hard links (names share one inode object; st_nlink counts them;
 *    directories count "." and their subdirectories' "..").  An inode is
 *    freed when its last name goes (open files hold paths, not inodes).
 *  - Identity: st_dev is pmem_opts.dev for every file, st_ino a small
 *    number; the root is 1.  With PMEM_INO_LOWEST (the default) a new
 *    object takes the lowest free number, so numbers of removed files come
 *    back at once, as on ext4 only more so: that reproduces inode-number
 *    reuse deterministically.  PMEM_INO_NEXT never reuses a number.
 *  - Times come from CLOCK_REALTIME but every change gets a timestamp
 *    strictly later than the previous one, so size + mtime always tell two
 *    versions of a file apart (fs/cache.c validates contents that way).
 *  - Operations present: everything in struct sbx_sandbox_ops except
 *    file_fd, copy_file_range, xattrs, exec_start and node_stale (NULL:
 *    callers get -ENOSYS/-EOPNOTSUPP as usual).  fallocate supports mode 0
 *    only (-EOPNOTSUPP otherwise); lseek SEEK_DATA/SEEK_HOLE (no holes).
 *    flush and syncfs have nothing to push and return 0.  write_then
 *    writes all or fails (-EIO for a short write), has no size limit,
 *    and answers -E2BIG for O_APPEND files; its setattr is setattr's.
 *    setattr_many is one operation for the instrumentation (named by
 *    its first item's path; an injected fault fails every item) and
 *    then does each item's setattr in order, each with its own result.
 *    Attributes on the side (struct sbx_side, sbx/provider.h): when the
 *    calling thread armed one, a successful entry operation fills the
 *    entry's directory (rename: both) and a write the file, taken under
 *    the tree lock right after the change.  readdir takes a
 *    snapshot of the listing at the first call and whenever it is asked to
 *    start at cookie 0; cookies are 1 ".", 2 "..", then 3 + index.  bulk
 *    walks breadth first: each directory's DIR record, then FILE records
 *    of its small files, then the next directory.
 *
 * Errors: negative errno, with sbx_error_set(SBX_ERR_REMOTE, ...) (POSIX
 * meanings: ENOENT, EEXIST, ENOTDIR, EISDIR, ENOTEMPTY, EINVAL for bad
 * names and paths with "..", EPERM for hard links to directories).
 *
 * Change stream.  After watch_start every change -- made through the ops or
 * behind the mount with pmem_ext_*() -- queues a struct sbx_change the way
 * the agent's inotify watcher reports it: `path` relative to the root (and
 * `name` for ENTRY), identities 0 (as the remote stream, the caching layer
 * fills them in), `seq` counting from 1.  Per change:
 *    created, removed, renamed names (create of a new file, mknod, mkdir,
 *      symlink, link, unlink, rmdir, rename: old and new name)  -> ENTRY
 *    content (write, truncate, O_TRUNC, fallocate)             -> DATA
 *    attributes (mode, owner, times)                             -> ATTR
 * A link count changed by link/unlink of *another* name produces no event
 * for the remaining names (inotify directory watches report none either).
 * Changes made before watch_start are not reported.
 * Events are delivered in order from a provider thread, outside every lock
 * of the provider; watch_sync delivers, from the calling thread, all events
 * queued before it was called that the thread has not delivered yet, and
 * returns once each has been delivered (so the callback has run for every
 * earlier change); -EIO when the stream is not started.  watch_healthy is true while watching unless a test said
 * otherwise (pmem_set_healthy); it takes no lock and calls no hook.
 *
 * Test instrumentation: every operation except root and watch_healthy
 * starts by (1) waiting at the gate if it matches (pmem_gate_arm), (2)
 * calling the hook (pmem_set_hook), (3) counting the call and (4) failing
 * with an injected errno if one is armed for it (pmem_fail).  Operation
 * names are the member names of struct sbx_sandbox_ops ("lookup",
 * "getattr", "write", "node_at", "bulk", "watch_sync", ...).  The `path`
 * given to hooks and gates is the object of the operation: the node's
 * path, "<parent>/<name>" for operations naming an entry (lookup, create,
 * mknod, mkdir, symlink, unlink, rmdir; link: the new name; rename: the
 * old name), the path an open file was opened with, the directory of a
 * bulk walk (of a bulk of listed files: the first file), the argument of
 * node_at, "" for syncfs and watch_*.
 * pmem_ext_*() are "behind the mount": no gate, hook, counter or fault.
 *
 * Threads: every function may be called from any thread; one mutex
 * protects the tree (never held while calling hooks, gates or callbacks).
 */
#ifndef SBX_PMEM_H
#define SBX_PMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "sbx/error.h"

struct sbx_sandbox;

/* Inode-number policy (pmem_opts.ino_policy). */
#define PMEM_INO_LOWEST 0 /* lowest free number: removed numbers return */
#define PMEM_INO_NEXT 1   /* always a new number */

/* st_dev reported when pmem_opts.dev is 0. */
#define PMEM_DEFAULT_DEV ((dev_t)0x5b0)

struct pmem_opts {
	int ino_policy;       /* PMEM_INO_* */
	dev_t dev;            /* st_dev of every file; 0: PMEM_DEFAULT_DEV */
	const char *session;  /* sb->session; NULL: "mem" */
	const char *workdir;  /* sb->workdir, node_path prefix; NULL:
			       * "/sandbox" */
	size_t bulk_max_total; /* content a bulk walk sends at most (as an
				* agent past its budget); 0: as asked */
};

/*
 * A new empty sandbox: a root directory (mode 0755, owned by the caller's
 * euid/egid, ino 1).  `opts` may be NULL (all defaults); borrowed.  *out is
 * released with sbx_sandbox_free() (or sb->ops->free), which stops the
 * change stream and opens the gate first.  Cannot fail except on bad
 * options (-EINVAL).
 */
SBX_WUR int pmem_new(struct sbx_sandbox **out, const struct pmem_opts *opts);

/* ---- fault injection and counters ---------------------------------------- */

/*
 * Make the next `count` calls of operation `op` fail with `neg_errno` (a
 * negative errno; SBX_ERR_REMOTE, message "injected").  count -1: every
 * call until cleared; count 0 (or neg_errno 0) clears.  Faults of forget
 * and watch_stop (void) are counted down but cannot show; a failed release
 * or releasedir still frees the handle.  -EINVAL for an unknown op name.
 * "then" is write_then's second part (its fsync or setattr), failed after
 * the bytes were written, as the agent can answer.
 */
SBX_WUR int pmem_fail(struct sbx_sandbox *sb, const char *op, int neg_errno,
		      int count);

/* Calls of `op` since creation or the last reset (0 for unknown names). */
unsigned long pmem_calls(struct sbx_sandbox *sb, const char *op);

/* Set every call counter to 0. */
void pmem_calls_reset(struct sbx_sandbox *sb);

/* ---- interleavings ------------------------------------------------------- */

/*
 * Called at the start of every operation (see above) from the calling
 * thread, with no provider lock held, so it may block (on a semaphore the
 * test posts later) and may call pmem functions.  `path` is borrowed for the
 * call.  NULL clears.  The hook must not block the thread of a call it
 * waits for.  A bulk call also calls it with op "bulk:sent" once its
 * records are taken and before they are delivered (a change made then is
 * one the records predate).
 */
typedef void (*pmem_hook_fn)(const char *op, const char *path, void *payload);

void pmem_set_hook(struct sbx_sandbox *sb, pmem_hook_fn fn, void *payload);

/*
 * A one-shot gate, for the common case of the hook: the first call of `op`
 * on `path` (NULL: any path) after arming parks at its start until
 * pmem_gate_release().  One gate at a time: arming again replaces an unused
 * one (-EBUSY while a call is parked).  -EINVAL for an unknown op name.
 */
SBX_WUR int pmem_gate_arm(struct sbx_sandbox *sb, const char *op,
			  const char *path);

/*
 * The same, but the call parks once its work is done, before it returns
 * (operations on one path: getattr, setattr, readlink, open, read, write,
 * ...; readdir, with the listing taken; not entry operations), so that its
 * answer is from before whatever the test does meanwhile.
 */
SBX_WUR int pmem_gate_arm_after(struct sbx_sandbox *sb, const char *op,
				const char *path);

/*
 * Wait up to timeout_ms for a call to park at the gate: 0 when one is
 * parked, -ETIMEDOUT otherwise.
 */
SBX_WUR int pmem_gate_wait(struct sbx_sandbox *sb, int timeout_ms);

/* Let the parked call go on (or disarm an unused gate). */
void pmem_gate_release(struct sbx_sandbox *sb);

/* ---- the change stream --------------------------------------------------- */

/*
 * Hold (true) or resume (false) delivery by the provider thread; events
 * queue meanwhile.  watch_sync still delivers everything queued before it.
 */
void pmem_watch_hold(struct sbx_sandbox *sb, bool hold);

/* Deliver the first n queued events now, in this thread (while held). */
void pmem_watch_deliver(struct sbx_sandbox *sb, size_t n);

/* Events queued and not yet delivered. */
size_t pmem_watch_pending(struct sbx_sandbox *sb);

/* What watch_healthy answers while watching (default true). */
void pmem_set_healthy(struct sbx_sandbox *sb, bool healthy);

/* ---- behind the mount ---------------------------------------------------- */

/*
 * Changes as the sandbox's own processes make them: the tree changes at
 * once and events are queued as for the ops (see above).  Paths are
 * relative to the root (a leading '/' is ignored; ".." is -EINVAL).  Errors
 * as the corresponding system call: -ENOENT, -EEXIST, -ENOTDIR, -EISDIR,
 * -ENOTEMPTY ...
 */

/* open(O_WRONLY|O_CREAT|O_TRUNC, 0644) + write: ENTRY if new, DATA. */
SBX_WUR int pmem_ext_write(struct sbx_sandbox *sb, const char *path,
			   const void *data, size_t len);
/* pwrite into an existing file (no truncation, grows it): DATA. */
SBX_WUR int pmem_ext_pwrite(struct sbx_sandbox *sb, const char *path,
			    const void *data, size_t len, off_t off);
SBX_WUR int pmem_ext_truncate(struct sbx_sandbox *sb, const char *path,
			      off_t size);
/* chmod (permission bits only): ATTR. */
SBX_WUR int pmem_ext_chmod(struct sbx_sandbox *sb, const char *path,
			   mode_t mode);
SBX_WUR int pmem_ext_mkdir(struct sbx_sandbox *sb, const char *path,
			   mode_t mode);
SBX_WUR int pmem_ext_symlink(struct sbx_sandbox *sb, const char *target,
			     const char *path);
SBX_WUR int pmem_ext_link(struct sbx_sandbox *sb, const char *from,
			  const char *to);
SBX_WUR int pmem_ext_unlink(struct sbx_sandbox *sb, const char *path);
SBX_WUR int pmem_ext_rmdir(struct sbx_sandbox *sb, const char *path);
/* flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE. */
SBX_WUR int pmem_ext_rename(struct sbx_sandbox *sb, const char *from,
			    const char *to, unsigned flags);
/* Queue an OVERFLOW event (events were lost: invalidate everything). */
void pmem_ext_overflow(struct sbx_sandbox *sb);
/*
 * Renames' events: paired (default: the new name's ENTRY says where the
 * object came from and its inode number, as the agent reports a rename
 * inside its tree) or, with false, two plain ENTRY events (a rename the
 * agent could not pair, or an older agent).  Also for the sandbox's own
 * rename op.
 */
void pmem_pair_renames(struct sbx_sandbox *sb, bool paired);

/* ---- what the sandbox really holds --------------------------------------- */

/*
 * Copy up to `size` bytes of the regular file at `path` from offset 0 into
 * buf; *len is what was copied (the file's size if it fits).  -ENOENT,
 * -EISDIR, -EINVAL (not a regular file).
 */
SBX_WUR int pmem_ext_read(struct sbx_sandbox *sb, const char *path, void *buf,
			  size_t size, size_t *len);

/* lstat(2) of `path` (symlinks not followed).  -ENOENT, -ENOTDIR. */
SBX_WUR int pmem_ext_stat(struct sbx_sandbox *sb, const char *path,
			  struct stat *st);

#endif
