/*
 * FUSE daemon internals.
 *
 * Inodes.  Every kernel inode is a `struct fs_inode` whose address is the
 * FUSE node id (passthrough_ll), except the root, which is FUSE_ROOT_ID.  An
 * inode holds one provider node reference and lives as long as the kernel's
 * lookup count: it is created by a reply that returns an entry (lookup,
 * create, mkdir, mknod, symlink, link, readdirplus) and freed in forget.
 * Inodes are keyed by the provider's (st_dev, st_ino), so hard links and
 * repeated lookups share one kernel inode.
 *
 * Lock order: fs->lock, then a provider's own locks (node_stale and
 * attr_changed are called under fs->lock; they take only the provider's
 * locks and send no request to the sandbox).  fs->neg_lock and
 * fs->replay_lock are leaves: nothing else is taken while one is held.
 *
 * Threads that send notifications: the replay thread (replay.c), for the
 * change stream's changes too (fs_apply_change queues them), and the
 * control thread's barrier without a change stream.  The change stream's
 * thread sends none: a FUSE handler may wait for it (wb_io_again's
 * barrier) while the kernel holds a page or a directory lock that an
 * invalidation would wait for.  The FUSE workers send none that can wait
 * for a directory's lock behind a listing (fs_entry_replay queues them):
 * a worker must stay free to answer the lister.
 *
 * Locking.  fs->lock protects the inode table, the name index (fs->names
 * and every inode's `names`) and every inode's `nlookup`, `parent`/`name`
 * and `writers`.  It is never held across any other provider call or a
 * fuse_lowlevel_notify_* call (the kernel may need a worker thread to
 * answer a request before a notification returns).
 *
 * Cache rule (docs/design.md): while the provider's change stream is live,
 * entries and attributes are cached by the kernel for `timeout` seconds
 * (long) and page/readdir caches are kept across opens; every change the
 * stream reports is invalidated with fuse_lowlevel_notify_inval_*.  Without
 * a change stream, timeouts are short and page caches are dropped on open.
 */
#ifndef FS_I_H
#define FS_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <fuse_lowlevel.h>

#include "sbx/hashmap.h"
#include "sbx/provider.h"

struct fs_ctl;

#define FS_RECENT_ENTRIES 256
/*
 * Entry and attribute timeouts: long while the change stream is healthy
 * (every change is invalidated explicitly, so the timeout only bounds the
 * damage of a lost event), short without one (changes made behind our
 * back show up within FS_TIMEOUT_BLIND seconds).
 */
#define FS_TIMEOUT_WATCHED 600.0
#define FS_TIMEOUT_BLIND 1.0
/* Negative entries listed at most (fs_negative_timeout); past that, the
 * long timeout is not given. */
#define FS_NEGATIVES_MAX 65536
/* How long the exec barrier waits for the change stream's notifications
 * to be sent (fs_notify_drain). */
#define FS_NOTIFY_DRAIN_MS 10000
/* Names kept per inode in the name index (fs_names_*), newest first. */
#define FS_NAMES_PER_INODE 16

/*
 * A name the kernel may hold a dentry for: (parent, name) -> inode, in
 * fs->names and on the inode's own list.  Kept so that a change event
 * about a name reaches the attributes of the object that had it: the
 * directory watches of a change stream say that a name went, not that the
 * link count of the file it named dropped (inotify reports that only to a
 * watch on the file itself).  Protected by fs->lock.
 */
struct fs_name {
	struct sbx_hashmap_node hnode; /* fs->names, by (parent, name) */
	struct fs_inode *inode;
	struct fs_name *next;          /* inode->names */
	fuse_ino_t parent;
	char name[];
};

struct fs_inode {
	struct sbx_node *node; /* provider reference, owned */
	dev_t dev;
	ino_t ino;
	uint64_t nlookup;      /* protected by fs->lock */
	unsigned writers;      /* opens for writing; protected by fs->lock */
	fuse_ino_t parent;     /* last known parent; protected by fs->lock */
	char *name;            /* last known name; protected by fs->lock */
	struct fs_name *names; /* names handed out; protected by fs->lock */
	/* In fs->table (findable by (dev, ino)) while linked; fs->lock. */
	struct sbx_hashmap_node hnode;
	struct fs_inode *stale_next; /* fs->stale; protected by fs->lock */
};

struct fs {
	struct fuse_session *se;
	struct sbx_sandbox *sb;
	const char *session;
	const char *mountpoint;
	char *control_socket;

	pthread_mutex_t lock;
	struct fs_inode root;
	struct sbx_hashmap table; /* inodes by (dev, ino), but the root */
	struct fs_inode *stale;   /* unhashed, still held by the kernel */
	struct sbx_hashmap names; /* struct fs_name by (parent, name); lock */

	bool watching;          /* change stream started */
	bool cached;            /* sb is our caching layer (fs/cache.c) */
	struct sbx_sandbox *cache; /* owned when cached */
	/*
	 * The provider gives descriptors (file_fd): the kernel is told that
	 * open/opendir/flush are not implemented, so opening and closing a
	 * file costs no request at all; each I/O request opens its own file.
	 */
	bool zero_open;
	pthread_mutex_t barrier_lock;

	/*
	 * Recent entry changes (fs_entry_replay).  entry_gen counts them;
	 * recent[gen % FS_RECENT_ENTRIES] holds the last ones.  Protected by
	 * lock; entry_gen is also read without it (atomically) as a fast
	 * path.
	 */
	uint64_t entry_gen;
	struct fs_recent_entry {
		fuse_ino_t parent;
		char *name;
	} recent[FS_RECENT_ENTRIES];

	/*
	 * Negative entries handed out with the long timeout (negatives.c):
	 * struct fs_negative by (parent, name).  Its own leaf lock: nothing
	 * else is taken, and no notification sent, while neg_lock is held.
	 */
	pthread_mutex_t neg_lock;
	struct sbx_hashmap negatives;
	long long neg_prune_at; /* sbx_clock_mono_ms(); neg_lock */

	/*
	 * Invalidations of replies that raced a change, sent by their own
	 * thread (replay.c).  replay_lock is a leaf and guards the queue
	 * and replay_stop; replay_started is set before the FUSE loop runs.
	 */
	pthread_mutex_t replay_lock;
	pthread_cond_t replay_cond;
	struct fs_replay_job *replay_head, *replay_tail;
	pthread_t replay_thread;
	bool replay_started, replay_stop;
	bool replay_busy; /* a job is being sent (fs_notify_drain) */

	struct fs_ctl *ctl;

	/* Lazy-unmount watch (fs.c): ends the loop once no mount is left. */
	dev_t dev;              /* our mount's device; 0 if unknown */
	pthread_t main_thread;  /* runs the FUSE loop */
	pthread_t detach_thread;
	bool detach_started;
	int detach_wake[2];     /* readable: the watch thread stops */
	bool detached;          /* atomic: the mount was detached */
	bool loop_done;         /* atomic: the FUSE loop has returned */
};

extern const struct fuse_lowlevel_ops fs_ops;

/* --- negatives.c ---------------------------------------------------------- */
/*
 * The kernel may keep a negative dentry (parent, name) for as long as the
 * entry timeout: one given while the change stream is healthy lasts
 * FS_TIMEOUT_WATCHED, and only an event about that name drops it.  So such
 * names are listed, and when events are lost (invalidate_everything) each
 * is dropped too: a negative dentry has no inode that the walk over inodes
 * would reach.
 *
 * fs_negative_timeout(): list (parent, name) and return the timeout for its
 * negative reply: FS_TIMEOUT_WATCHED, or FS_TIMEOUT_BLIND when the list is
 * full (FS_NEGATIVES_MAX) even after entries timed out in the kernel were
 * taken off.  Entries also leave when their name's event comes, when the
 * name gets an entry through us (reply_entry, create, a rename's target)
 * and at an overflow.  Call before the reply is sent, only while
 * healthy.  fs_negative_drop(): the name's event came (its dentry was
 * invalidated).  fs_negatives_invalidate(): drop every listed dentry and
 * empty the list.  fs_negatives_init() / fs_negatives_fini(): make the
 * empty list and its lock / free both (no notification).
 */
double fs_negative_timeout(struct fs *fs, fuse_ino_t parent,
			   const char *name);
void fs_negative_drop(struct fs *fs, fuse_ino_t parent, const char *name);
void fs_negatives_invalidate(struct fs *fs);
void fs_negatives_init(struct fs *fs);
void fs_negatives_fini(struct fs *fs);

/* --- replay.c ------------------------------------------------------------ */
/*
 * fs_replay_queue(): send these invalidations for `parent` from the replay
 * thread -- the entries `names` (n of them; the array and its strings are
 * taken over), with `lost` every known child and `name` too, then the
 * directory's inode -- or here when the thread is not running.
 * fs_replay_init() before any; fs_replay_start() starts the thread;
 * fs_replay_fini() stops it (with the session still there: when a listing
 * that will never be answered keeps it waiting for 2 s, the connection is
 * aborted) and frees what is left, unsent.
 */
void fs_replay_init(struct fs *fs);
int fs_replay_start(struct fs *fs);
void fs_replay_fini(struct fs *fs);
/*
 * Abort our FUSE connection (fusectl): every request still waiting fails,
 * and a process that held a directory's lock or a page while it waited
 * lets go (and so does an invalidation of ours waiting for it).
 */
void fs_abort_connection(struct fs *fs);
void fs_replay_queue(struct fs *fs, fuse_ino_t parent, char **names,
		     size_t n, bool lost, const char *name);
/*
 * Queue, for the replay thread, the notifications of a change: with
 * `parent` and `name`, the entry's dentry and the directory's attributes
 * and listing; then every inode of objs[] (nobjs, at most
 * FS_NAME_TAKE_MAX + 1; duplicates and the parent skipped), its pages too
 * where data[i] (data NULL: attributes only).  In order with the other
 * jobs.  Never waits for the kernel: the change stream's thread calls it.
 */
void fs_notify_change(struct fs *fs, fuse_ino_t parent, const char *name,
		      const fuse_ino_t *objs, const bool *data, size_t nobjs);
/* Queue fs_invalidate_everything() likewise (the stream lost events). */
void fs_notify_everything(struct fs *fs);
/*
 * Wait until every notification queued so far was sent, at most
 * timeout_ms: 0, or -ETIMEDOUT.  Not from a FUSE worker (a job may wait
 * for the kernel, which may wait for a worker).
 */
int fs_notify_drain(struct fs *fs, int timeout_ms);
/* Forget every cached entry, attribute and page (sent from here). */
void fs_invalidate_everything(struct fs *fs);

/* --- inode.c ------------------------------------------------------------- */
void fs_inodes_init(struct fs *fs);
void fs_inodes_fini(struct fs *fs);

/* The inode for a FUSE node id (never NULL for ids the kernel holds). */
struct fs_inode *fs_inode_get(struct fs *fs, fuse_ino_t ino);
fuse_ino_t fs_inode_id(struct fs *fs, struct fs_inode *inode);

/*
 * Register a lookup reply: take ownership of `node` (attributes `st`) found
 * as `name` in `parent`.  Returns the inode whose nlookup was raised; if an
 * inode for (st_dev, st_ino) already existed, `node` is forgotten through
 * the provider and the existing inode is returned.
 */
struct fs_inode *fs_inode_remember(struct fs *fs, fuse_ino_t parent,
				   const char *name, struct sbx_node *node,
				   const struct stat *st);
/*
 * The same for an object the call just made (a create that made its
 * file): an inode held for another node under its number is a removed
 * object's, whatever the provider's node_stale would say, and leaves the
 * table for the new one.
 */
struct fs_inode *fs_inode_remember_new(struct fs *fs, fuse_ino_t parent,
				       const char *name, struct sbx_node *node,
				       const struct stat *st);

/* Drop `n` lookups; frees the inode (and forgets its node) at zero. */
void fs_inode_forget(struct fs *fs, fuse_ino_t ino, uint64_t n);

/*
 * Find a live inode by provider identity; 0 when the kernel has none.  The
 * kernel may forget the inode as soon as this returns, so the id is only
 * good for notifications; `writers`, when not NULL, gets the inode's count
 * of writers, read under the same lock.
 */
fuse_ino_t fs_inode_find(struct fs *fs, dev_t dev, ino_t ino,
			 unsigned *writers);

/* Count writers (opens for writing) of an inode. */
void fs_inode_writers(struct fs *fs, struct fs_inode *inode, int delta);

/*
 * The name index (struct fs_name).  fs_inode_remember() records the name a
 * reply handed out; these keep it true for what goes through the mount.
 * Entries may outlive the kernel's dentry (it drops them silently): that
 * costs at most a needless invalidation.  A missing entry costs a missed
 * one, so renames and removals through the mount update it.
 */
/* The name was removed through the mount (unlink, rmdir). */
void fs_names_removed(struct fs *fs, fuse_ino_t parent, const char *name);
/* A rename through the mount succeeded (RENAME_EXCHANGE swaps). */
void fs_names_renamed(struct fs *fs, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned flags);
/* At most this many inodes are taken for one change event's name: more
 * than one only while several objects held it in turn unnoticed. */
#define FS_NAME_TAKE_MAX 8
/*
 * A change event about (parent, name): the ids of the inodes known under
 * it (at most `cap`, itself at most FS_NAME_TAKE_MAX, in out[]), whose
 * entries leave the index (the caller drops the kernel's dentry), and
 * whose attributes the provider is told
 * are old (its attr_changed; those it says the kernel should keep are
 * left out).  Returns how many.  The ids are good for notifications only
 * (fs_inode_find).
 */
size_t fs_names_take(struct fs *fs, fuse_ino_t parent, const char *name,
		     fuse_ino_t *out, size_t cap);
/* fs_inode_find(), and the provider is told the inode's attributes are
 * old (its attr_changed); 0 also when it says the kernel should keep its
 * copy. */
fuse_ino_t fs_inode_attr_changed(struct fs *fs, dev_t dev, ino_t ino);

/*
 * Call fn for every live inode with its last known (parent, name); used on
 * overflow.  Runs fn without fs->lock held on a snapshot of the table.
 */
void fs_inode_foreach(struct fs *fs,
		      void (*fn)(struct fs *fs, fuse_ino_t ino,
				 fuse_ino_t parent, const char *name,
				 void *payload),
		      void *payload);

/* --- fs.c ---------------------------------------------------------------- */
/*
 * Entry/attribute timeout for a reply now: long while the change stream is
 * started and healthy, short otherwise.
 */
double fs_timeout(struct fs *fs);
/* True while cached data may be trusted until invalidated. */
bool fs_healthy(struct fs *fs);

/* Apply one change from the provider's stream to the kernel caches. */
void fs_apply_change(const struct sbx_change *c, void *payload);

/*
 * Replies that race a change.  A lookup or readdir reply is built from
 * data read before it is sent; when an entry change is invalidated in
 * between, the kernel installs the reply's stale dentry (or listing) after
 * the invalidation, and keeps it for the whole long timeout.  So: take
 * fs_entry_gen() before reading, and after sending the reply call
 * fs_entry_replay(), which invalidates again whatever changed in `parent`
 * meanwhile (a lookup passes its `name`, NULL otherwise: when changes were
 * lost, that name is dropped too, as it may be a negative entry).  The
 * kernel holds the directory's lock while it takes in a
 * reply, and an invalidation waits for that lock: the second one lands
 * after the stale data.  Never call replay before the reply is sent (the
 * kernel would wait for the reply while we wait for its lock).
 */
uint64_t fs_entry_gen(struct fs *fs);
void fs_entry_replay(struct fs *fs, fuse_ino_t parent, const char *name,
		     uint64_t since);

#endif
