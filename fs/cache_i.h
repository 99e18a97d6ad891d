/*
 * Private to the caching layer (fs/cache*.c); see cache.h for what it does.
 *
 * Seams, one file each:
 *   cache_tree.c     the node tree, paths, hard-link rings, attributes
 *   cache_content.c  cached file contents: memory LRU and disk spill
 *   cache_wb.c       open files, their write-back buffers, the flusher
 *   cache_list.c     prefetch (bulk walks), listings, directory handles
 *   cache_ahead.c    look-ahead prefetch of contents the bulk left out
 *   cache_fresh.c    git objects made in the sandbox, fetched ahead
 *   cache_change.c   the change stream: own-change expectations, applying
 *                    events, forwarding them to the daemon
 *   cache_silly.c    unlink of open files (silly rename) and last close
 *   cache_entry.c    operations on entries: create, link, remove, rename
 *   cache_touch.c    deferred touches (utime(NULL)) and their sender
 *   cache.c          the sbx_sandbox_ops table and everything else
 *
 * Locks, in the order they are taken (a thread holding one may take only
 * those below it):
 *
 *   1. cfile.wlock  one open file's write buffer; held across the inner
 *                   write calls of a push, so pushes of one file are
 *                   ordered and a write never overtakes an older one.
 *   2. cache.lock   the tree, every cnode field, the content LRU, the
 *                   dirty list, cfile reference counts and the fields
 *                   marked "c->lock" below.  Never held across a call
 *                   into the wrapped sandbox, nor across disk I/O: both
 *                   happen with only 1 (or nothing) held.  Disk
 *                   work decided under it (spilling contents, removing
 *                   spilled files) is queued and done by cache_unlock().
 *   3. touch.lock   the queue of deferred touches (cache_touch.c) and
 *                   cnode.touch_valid.  Taken under 2 to queue; the
 *                   sender holds nothing while it calls the sandbox or
 *                   takes 2.  A drain (touch_drain) waits on it with
 *                   nothing else of the cache's held but maybe 1 (the
 *                   sender never takes 1).
 *
 * Lifetimes.  Nodes live as long as the cache (the daemon holds
 * references to them; a repository's worth of paths is small).  Open files
 * (struct cfile) are reference counted: the kernel's handle holds one
 * reference until RELEASE, and any thread that finds a file on the dirty
 * list takes one under c->lock before dropping the lock to push it, so a
 * RELEASE on another thread can never free a file still being pushed.
 *
 * Wrapped files.  The cache opens the wrapped sandbox's file for each I/O,
 * at the path its node has at that moment (struct cache_io), instead of
 * keeping one open: a path-based provider's open file names a fixed path,
 * so a rename through the mount (or a silly rename) would otherwise leave
 * it pointing at the old name.  Opening costs nothing for the remote
 * providers (the agent has no open files; every request names its path).
 */
#ifndef FS_CACHE_I_H
#define FS_CACHE_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include "sbx/hashmap.h"
#include "sbx/provider.h"

/* Without a healthy change stream, cached data is trusted this long. */
#define CACHE_BLIND_TTL 1.0
/* Files up to this size are fetched whole on first read and kept. */
#define CACHE_WHOLE_FILE (1u << 20)
/*
 * Memory for cached contents; beyond it, least recently used spill.  The
 * kernel's page cache keeps what was read, so this holds what is about to
 * be read (prefetched) and what the kernel may ask for again; content
 * read to its end is the first to go, and is dropped, not spilled.
 */
#define CACHE_MEM_BUDGET (64u << 20)
/* Contents at least this large spill to disk instead of being dropped. */
#define CACHE_DISK_MIN (64u << 10)
/* Buffered writes per open file before they are pushed. */
#define CACHE_WRITE_BUF (4u << 20)
/* Separate extents of buffered writes per open file before a push. */
#define CACHE_WB_EXTENTS 256
/*
 * Gaps up to this size between extents of a file whose local image is
 * known are filled from it at push time (zeros, mostly: a linker's
 * alignment padding), so the extents go out as one write.
 */
#define CACHE_WB_GAP (64u << 10)
/*
 * Buffered writes are pushed at the latest this long after the first
 * unpushed byte (the kernel's dirty_expire is 30 s; ours is short because
 * the daemon, unlike the kernel, can be killed).
 */
#define CACHE_WB_EXPIRE 1.0
/* How often the flusher looks for expired buffers. */
#define CACHE_WB_TICK_MS 200
/*
 * Prefetch: content for files up to max_file, total max_total.  max_file
 * is the protocol's cap (one bulk frame, SBX_PROTO_MAX_FRAME_DATA), the
 * same as CACHE_WHOLE_FILE: a file the bulk skips would be fetched whole
 * at its first read anyway, one round trip each.
 */
#define PREFETCH_MAX_FILE (1u << 20)
#define PREFETCH_MAX_TOTAL (32u << 20)
/*
 * Look-ahead prefetch (cache_ahead.c): requests of up to AHEAD_REQ_BYTES
 * of content (AHEAD_REQ_FILES files), at most AHEAD_WORKERS in flight,
 * while in flight plus fetched-but-unread stays under AHEAD_WINDOW.  A
 * plan's first request (the one its reader waits for) carries up to
 * AHEAD_FIRST_BYTES; the next ones, sent once the reader follows the
 * plan, double up to AHEAD_REQ_BYTES, so a read that starts no walk pays
 * little for the look-ahead.
 */
#define AHEAD_WORKERS 3
#define AHEAD_FIRST_BYTES (512u << 10)
#define AHEAD_REQ_BYTES (4u << 20)
#define AHEAD_REQ_FILES 1024
#define AHEAD_WINDOW (24u << 20)
/*
 * Git objects made in the sandbox (cache_fresh.c): the fan-out directories
 * that entry events name are walked (depth 0, content up to
 * FRESH_DIR_BYTES, files up to FRESH_MAX_FILE) by FRESH_WORKERS threads
 * once the stream has been quiet for FRESH_QUIET seconds (at the latest
 * FRESH_MAX_WAIT after they were noted), FRESH_TRIES times at most when a
 * change races the walk; at most FRESH_MAX_DIRS wait.
 */
#define FRESH_WORKERS 4
#define FRESH_QUIET 0.05
#define FRESH_MAX_WAIT 2.0
#define FRESH_TRIES 3
#define FRESH_MAX_DIRS 512
#define FRESH_MAX_FILE (64u << 10)
#define FRESH_DIR_BYTES (256u << 10)
/*
 * How long a statfs answer is reused (seconds).  `df` through the mount may
 * lag this much; fts (grep -r, find) calls fstatfs() once per walk.
 */
#define CACHE_STATFS_TTL 5.0
/* Hidden names of open files removed through the mount (silly rename). */
#define SILLY_PREFIX ".sbx-silly."
/* How long an unlink waits for the RELEASE that follows a close. */
#define RELEASE_WAIT_MS 100
/* How long a link count waits for a hidden name's removal under way (one
 * request, which ends sooner unless the sandbox is out of reach). */
#define UNHIDE_WAIT_MS 5000
/* How long the removal of a hidden name that said ENOENT waits for
 * renames through the mount under way, to try the path they leave. */
#define RENAME_WAIT_MS 2000
/* How often hidden names left by an outage are tried again (seconds). */
#define SILLY_RETRY_S 5.0

enum slot { S_UNKNOWN = 0, S_PRESENT, S_ABSENT };

struct content {
	void *data;     /* NULL when spilled to disk or being spilled */
	size_t len;
	bool on_disk;         /* complete in its spill file */
	bool spilling;        /* its spill job has not finished */
	struct content *spill_next; /* c->spilling */
	unsigned long serial; /* names the spill file; unique per cache */
	/* What it was read from: valid while the attributes still say so. */
	ino_t ino;
	off_t size;
	struct timespec mtime;
	struct content *lru_prev, *lru_next; /* contents held in memory */
	unsigned ahead_plan;  /* fetched ahead by this plan, unread; or 0 */
	bool delivered;       /* last read reached its end (content_read) */
};

/* A hidden name a silly rename with a lost answer may have made: `name`
 * in `dir`, whose path is taken when it is removed, so it follows renames
 * of dir through the mount (nodes live as long as the cache). */
struct ghost {
	struct cnode *dir;
	char *name;
	struct cnode *owner;  /* the node whose file it is a name of */
	struct ghost *next;   /* c->ghosts */
	/* Its removal is out (it stays listed: an rmdir of dir waits). */
	bool busy;
	unsigned long round;  /* c->ghost_round when last tried */
};

/* Every field is protected by c->lock. */
struct cnode {
	struct cnode *parent; /* NULL for the root and for orphans */
	char *name;           /* NULL for the root */
	enum slot slot;
	bool orphan;          /* replaced by a rename: no path any more */

	struct stat st;
	bool st_valid;
	double st_time;       /* when st was fetched (monotonic) */

	char *link;           /* symlink target, valid with st */

	/* Directories. */
	struct sbx_hashmap kids;         /* children by name: their kid_node */
	struct sbx_hashmap_node kid_node; /* in the parent's kids */
	struct cnode *orphan_next;       /* c->orphans */
	bool complete;        /* every name is a kid (some UNKNOWN maybe) */
	double list_time;
	bool prefetched;      /* a bulk walk covered this directory */
	bool prefetching;
	bool ahead;           /* a look-ahead request for its content is out */

	struct content *content;
	unsigned dirty;       /* open files with unpushed writes */
	unsigned opens;       /* open files */
	unsigned active;      /* open files with no FLUSH since (a hint) */
	bool hidden;          /* a silly-renamed file: never listed */
	/*
	 * Removals of hidden names of this node's file that silly renames
	 * with a lost answer may have made (c->ghosts, owner this node)
	 * started or ended (two each): counted with `unhides` in
	 * tree_file_unhides(), so a link count fetched across one is
	 * unsettled, but apart, as it says nothing of this name.
	 */
	unsigned ghost_outs;
	/*
	 * Removals of this hidden name started or ended (two each): odd
	 * while one is out (cnode_unhiding) -- the slot is already S_ABSENT
	 * but the link still counts in the sandbox's link count -- and a
	 * link count fetched across a change of it is unsettled
	 * (tree_file_unhides).
	 */
	unsigned unhides;
	/* A hidden name being moved out of a directory about to be removed
	 * (silly_evict): its last close leaves the removal to the mover. */
	bool moving;
	/*
	 * A directory removed through the mount (rmdir, or a rename over
	 * it): its kernel inode may live on (an open descriptor, a shell's
	 * working directory), and its attributes are the last ones known
	 * with no link, as on a local disk.  Cleared when the node names an
	 * object again (tree_set_st).
	 */
	bool gone_dir;
	/*
	 * Change events that named this file (any of its names), counted
	 * even while it is dirty: a local image of its content taken at an
	 * earlier count is no longer the sandbox's file plus our writes.
	 */
	unsigned long chg;
	/*
	 * c->events right after the last entry change of this name made
	 * through the mount (create, link, rename to or from it, removal;
	 * 0: none): an answer sent before then (its `gen` lower) is older
	 * than what the tree knows of the name.
	 */
	unsigned long own_gen;

	/*
	 * Hard links: the names of one multi-link file form a circular,
	 * doubly linked ring (ring_next == ring_prev == self when alone);
	 * one member of each ring, the head, sits in c->rings under
	 * ring_ino, the inode number it was joined with.
	 */
	bool in_ring;
	ino_t ring_ino;
	struct cnode *ring_next, *ring_prev;
	struct sbx_hashmap_node ring_node; /* a head's entry in c->rings */

	/* touch.lock, not c->lock: SBX_SET_* of its queued touch, or 0. */
	int touch_valid;
	/*
	 * Until then (cache_now()), attribute events that name it are the
	 * echo of our own deferred touch and change nothing: INFINITY while
	 * a batch carrying its touch is out, a short grace after the answer,
	 * 0 otherwise (cache_touch.c).
	 */
	double touch_own_until;
};

/* One extent of unpushed writes of an open file. */
struct wb_ext {
	off_t off;
	size_t len, cap;
	char *data;
};

struct cfile {
	struct cnode *node;
	int flags;
	/*
	 * The inode number of the file this open opened (set under c->lock
	 * as the open is counted; 0: unknown).  Pushes name it, so bytes
	 * buffered here never land in another file moved onto the name
	 * behind the mount (the sandbox answers ESTALE instead).
	 */
	ino_t ino;
	unsigned refs;              /* c->lock */
	bool released;              /* c->lock: RELEASE seen */
	pthread_mutex_t wlock;      /* lock order 1 */
	bool flushed;               /* c->lock: FLUSH seen, not used since */
	/*
	 * Unpushed writes: extents sorted by offset, disjoint and not
	 * touching (touching or overlapping writes are merged); buf_len
	 * counts their bytes.  wlock and c->lock to change, either to read.
	 */
	struct wb_ext *ext;
	size_t next, ext_cap;
	size_t buf_len;
	/*
	 * The local image (wb_local_*): when the file's whole content was
	 * known as the first unpushed byte came (cached in memory, or empty
	 * because created here), img_base is that content and the file as
	 * the owner sees it is img_base (zeros past its end) overlaid with
	 * the extents, img_size bytes long, with attributes img_st.  Valid
	 * while img and the node's chg is still img_chg.  c->lock.
	 */
	bool img;
	char *img_base;
	size_t img_base_len;
	off_t img_size;
	struct stat img_st;
	unsigned long img_chg;
	/*
	 * A setattr held with the unpushed writes (wb_defer_setattr): its
	 * SBX_SET_* (0: none) and values, sent after them by the next push.
	 * wlock and c->lock to change, either to read.
	 */
	int pset_valid;
	struct stat pset_in;
	/* Why a held setattr failed (code 0: it did not) until the owner's
	 * flush or fsync reports it.  c->lock. */
	struct sbx_error pset_err;
	double dirty_since;         /* c->lock: when buf became non-empty */
	bool on_dirty;              /* c->lock: on c->dirty */
	struct cfile *dnext, *dprev;
	/* Directory handles: a snapshot of the listing, taken by the first
	 * READDIR at offset 0 (owner only). */
	bool is_dir;
	bool snapped;
	char **names;
	struct stat *sts;
	struct cnode **nodes;
	size_t n;
	ino_t dir_ino;
};

/* Disk work decided under c->lock, done after it is dropped. */
struct disk_job {
	struct disk_job *next;
	char *path;         /* the spill file */
	void *data;         /* NULL: remove path; else write it, then free */
	size_t len;
	unsigned long serial; /* for a spill: whose content */
};

struct expect;

struct cache {
	struct sbx_sandbox base;
	struct sbx_sandbox *inner;
	struct cnode root;
	pthread_mutex_t lock;      /* lock order 2 */
	pthread_cond_t cond;       /* prefetch completion, last RELEASE */
	bool watching;             /* atomic */
	sbx_change_cb cb;
	void *cb_payload;
	struct content *lru_head, *lru_tail; /* most recent first */
	size_t mem_bytes;
	char *disk_dir;
	unsigned long content_serial;
	struct disk_job *jobs;     /* queued by content_*, run by unlock */
	struct content *spilling;  /* contents whose spill job is pending */
	struct cfile *dirty;       /* open files with buffered writes */
	struct sbx_hashmap rings;  /* hard-link ring heads by ring_ino */
	struct cnode *orphans;     /* detached nodes (by orphan_next) */
	struct expect *expect;     /* entry events our own calls will cause */
	/*
	 * Count of changes applied: change events, and our own entry
	 * operations, pushes and touches (change_own_done).  A fetch that
	 * sees it move while its request was out may hold data from before
	 * the change: it is returned but not trusted as cached (not fresh,
	 * not complete).
	 */
	unsigned long events;
	/* Of those, the ones not dropped as our own (struct side_call). */
	unsigned long foreign;
	/*
	 * Removals of hidden names started or ended (two each), all files:
	 * a listing answered across one may carry link counts that do or do
	 * not count the name (see cnode.unhides).
	 */
	unsigned long unhides_all;
	/* Calls handing back attributes on the side (struct side_call). */
	unsigned side_busy;        /* in flight */
	unsigned long side_gen;    /* started */
	unsigned long silly_seq;
	/* Renames through the mount under way (entry_rename): a path taken
	 * before one ends may be old (unlink_where_it_is).  c->cond is
	 * broadcast when one ends. */
	unsigned renames_out;
	/* Of those, RENAME_EXCHANGEs: their events are not expected, and
	 * following them (follow_move_locked) would fight the swap the
	 * call makes in the tree when it ends. */
	unsigned exchanges_out;
	/*
	 * The node the last rename followed from the change stream replaced
	 * (an orphan now), and the path it had: if the next followed
	 * rename brings that object back from that path, it was a
	 * RENAME_EXCHANGE in the sandbox, and the node goes to its new name
	 * (follow_move_locked).  Orphans are never freed before the cache.
	 */
	struct cnode *displaced;
	char *displaced_path;
	/* Renames applied to the tree, ours and followed ones (tree_rename,
	 * tree_unorphan): an I/O that met a path its file had left may
	 * find it back at that path after two (wb_io_again). */
	unsigned long moves;
	/*
	 * Hidden names that silly renames whose answer was lost may have
	 * made (the sandbox out of reach: it may or may not have done
	 * them), removed once nothing has their file open
	 * (silly_sweep_locked).  Not nodes of the tree on purpose: a name
	 * that may not exist must not count as a live name of the file
	 * (ring_member_alive, node_stale), which tied a dead file's ring
	 * to a new file under its inode number in review.  Few: a list.
	 */
	struct ghost *ghosts;
	unsigned long ghost_round; /* silly_retry_locked's rounds */
	/* Hidden names may be left to retry (silly_retry_locked), not
	 * before silly_retry_at (cache_now()). */
	bool silly_left;
	double silly_retry_at;
	struct ahead *ahead;       /* cache_ahead.c; NULL until first used */
	struct fresh *fresh;       /* cache_fresh.c; NULL until first used */
	/* cache_touch.c; NULL until the first touch (set under c->lock). */
	struct touch *touch;
	/* The last statfs answer, reused for CACHE_STATFS_TTL (c_statfs). */
	struct statvfs statfs;
	double statfs_time;
	bool statfs_valid;
	/* The write-back flusher. */
	pthread_t flusher;
	bool flusher_running;
	bool stopping;
	pthread_cond_t flusher_cond;
};

/* A removal of hidden name n is out (see cnode.unhides). */
static inline bool cnode_unhiding(const struct cnode *n)
{
	return n->unhides & 1;
}

/*
 * Every name of n's file: n itself, then the other members of its
 * hard-link ring.  Declares `a` (const); c->lock held.
 */
#define tree_for_each_name(a, n)                                          \
	for (const struct cnode *a = (n); a;                              \
	     a = a->in_ring && a->ring_next != (n) ? a->ring_next : NULL)

#define CACHE(sb) ((struct cache *)(sb))
#define CNODE(n) ((struct cnode *)(n))
#define CFILE(f) ((struct cfile *)(f))

/* ---- cache.c ------------------------------------------------------------ */

double cache_now(void);
/* *ts = now on `clock` plus ms milliseconds (a pthread_cond_timedwait
 * deadline: CLOCK_MONOTONIC for conds made by cache_cond_init_monotonic,
 * CLOCK_REALTIME for the others). */
void cache_deadline_in(struct timespec *ts, clockid_t clock, long ms);
/* A condition variable whose timed waits use CLOCK_MONOTONIC. */
void cache_cond_init_monotonic(pthread_cond_t *cond);
/* Is the change stream delivering?  Caller may hold c->lock. */
bool cache_healthy(struct cache *c);
/* Caller holds c->lock: is data fetched at monotonic time t still good? */
bool cache_fresh(struct cache *c, double t);
/* Take c->lock. */
void cache_lock(struct cache *c);
/* Drop c->lock, then run the disk jobs queued while it was held. */
void cache_unlock(struct cache *c);
/* A node reference of the wrapped sandbox for path (no I/O). */
int cache_inner_node(struct cache *c, const char *path, struct sbx_node **out);
/*
 * The same for writes meant for the file with inode number `ino` (0: any):
 * through node_at_ino when the wrapped sandbox has it, so that they fail
 * with ESTALE once the path names another file (sbx/provider.h).
 */
int cache_inner_node_ino(struct cache *c, const char *path, ino_t ino,
			 struct sbx_node **out);
/* stat of path through the wrapped sandbox.  Caller holds no lock. */
int cache_inner_stat(struct cache *c, const char *path, struct stat *st);

/*
 * The path of n for an operation on it (malloc'd); NULL with ESTALE set when
 * it has none.  Caller holds no lock.
 */
char *cache_op_path(struct cache *c, struct cnode *n);
/* cache_inner_node() of n's path (see cache_op_path).  No lock held. */
int cache_inner_node_of(struct cache *c, struct cnode *n,
			struct sbx_node **out);
/*
 * c->lock held: drop it, handing back `path` (just computed under it) and
 * the event count of that moment in *gen.  NULL path: ESTALE is set ("<what>
 * was replaced") and NULL returned.
 */
char *cache_unlock_path(struct cache *c, char *path, unsigned long *gen,
			const char *what);
/*
 * rc of a call on n's path (tree_path_of); -ENOENT for a name the tree
 * still had becomes -ESTALE (the kernel then looks the name up again) and
 * that name UNKNOWN, so the retry goes through another name of a
 * hard-linked file if one is known present.  No lock held.
 */
int cache_stale_or(struct cache *c, struct cnode *n, int rc);
/* -ENAMETOOLONG (error set) for a name longer than NAME_MAX, else 0. */
int cache_check_name(const char *name);

/*
 * Run `call` (using the inner node `inode`) on the wrapped sandbox's node
 * of n's path; -ESTALE when n has none.  No lock held.
 */
#define ON_INNER(c, n, inode, call)                                            \
	({                                                                     \
		long r_ = cache_inner_node_of(c, n, &(inode));                 \
		if (r_ == 0) {                                                 \
			r_ = (call);                                           \
			(c)->inner->ops->forget((c)->inner, inode);            \
		}                                                              \
		r_;                                                            \
	})

/*
 * Evaluate `call` (an int rc) expecting an entry event for dir/name when
 * `want` is true, with the thread's side call (side_tl()) armed around
 * it either way.
 */
#define EXPECTING_IF(c, want, dir, name, call)                                 \
	({                                                                     \
		struct expect *x_ =                                            \
			(want) ? change_expect(c, dir, name) : NULL;           \
		int rx_;                                                       \
		side_begin(c, side_tl(), (struct cnode *)(dir), NULL);         \
		rx_ = (int)(call);                                             \
		side_end(c, side_tl());                                        \
		if (rx_ < 0) {                                                 \
			side_tl()->ended = false;                              \
			change_expect_cancel(c, x_);                           \
		}                                                              \
		rx_;                                                           \
	})
#define EXPECTING(c, dir, name, call) EXPECTING_IF(c, true, dir, name, call)

/* ---- cache_entry.c: attributes on the side (struct sbx_side) ----------- */

/*
 * One inner call that may hand back attributes on the side: the parent
 * directories of an entry operation, the file of a write.  They replace a
 * refetch only when nothing can have changed them after the provider took
 * them.  Entry calls: the directory's attributes were valid when the call
 * began and no event (nor fetch) has touched them since -- an event about
 * the directory or an entry in it marks them invalid, while our own
 * expected entry events do not.  Writes: no change event at all was
 * applied meanwhile.  Both: no other side call (entry or write) was in
 * flight at any time meanwhile -- two calls in one directory, or pushes of
 * one file through two open files, may answer in either order.
 */
struct side_call {
	struct sbx_side side;
	struct cnode *dirs[2];  /* entry calls: the directories, or NULL */
	double dir_time[2];     /* their st_time at side_begin(); -1 invalid */
	unsigned long events, foreign, gen;
	bool alone;  /* no other side call in flight when it began */
	bool ended;  /* side_end() ran; not taken yet */
};
/* The calling thread's side call (used by EXPECTING). */
struct side_call *side_tl(void);
/*
 * Arm sc on this thread before the inner call: an entry call in dir (and
 * dir2, rename into another directory), or a write (both NULL).  No lock
 * held.
 */
void side_begin(struct cache *c, struct side_call *sc, struct cnode *dir,
		struct cnode *dir2);
/* Disarm after the inner call.  No lock held. */
void side_end(struct cache *c, struct side_call *sc);
/*
 * c->lock held: may sc's attributes be used now, as far as other calls
 * and (for writes) events go?  A directory's own check (dir_time) is the
 * caller's.  Consumes sc (a second call says false).  The has_* flags
 * still say which were filled.  The caller counts the call as its own
 * change (change_own_done()).
 */
bool side_take_locked(struct cache *c, struct side_call *sc);

/* ---- cache_entry.c: sbx_sandbox_ops of entries; no lock held ----------- */

/*
 * After an inner call created `name` in dir with attributes st: record the
 * entry (its node is returned) and note that dir itself changed.
 */
struct cnode *entry_created(struct cache *c, struct cnode *dir,
			    const char *name, const struct stat *st);
int entry_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		const char *name, mode_t mode, dev_t rdev,
		struct sbx_node **out, struct stat *st);
int entry_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		const char *name, mode_t mode, struct sbx_node **out,
		struct stat *st);
int entry_symlink(struct sbx_sandbox *sb, const char *target,
		  struct sbx_node *parent, const char *name,
		  struct sbx_node **out, struct stat *st);
int entry_link(struct sbx_sandbox *sb, struct sbx_node *node,
	       struct sbx_node *newparent, const char *newname,
	       struct sbx_node **out, struct stat *st);
int entry_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		 const char *name);
int entry_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		const char *name);
int entry_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		 const char *name, struct sbx_node *newparent,
		 const char *newname, unsigned flags);

/* ---- cache_tree.c: all with c->lock held ------------------------------- */

struct cnode *tree_kid_find(struct cnode *dir, const char *name);
/* The child `name` of dir, created UNKNOWN if missing. */
struct cnode *tree_kid_get(struct cnode *dir, const char *name);
void tree_kid_link(struct cnode *dir, struct cnode *k);
void tree_kid_unlink(struct cnode *dir, struct cnode *k);
/* The next child of a walk over a directory's kids, or NULL. */
struct cnode *tree_kid_next(struct sbx_hashmap_iter *it);
/*
 * Every child k of dir:  tree_for_each_kid(k, it, dir) { ... }  The body
 * may free k but not add or remove other children.
 */
#define tree_for_each_kid(k, it, dir)                            \
	for (sbx_hashmap_iter_init(&(it), &(dir)->kids);         \
	     ((k) = tree_kid_next(&(it))) != NULL;)
/* Detach k from its parent onto c->orphans: it has no path any more. */
void tree_orphan(struct cache *c, struct cnode *k);
/* k was removed through the mount (rmdir, or replaced by a rename): if
 * a directory, it is gone_dir. */
void tree_mark_gone_dir(struct cnode *k, bool rmdir);
/* Rename k (a child of its parent) to name in dir (takes nothing). */
void tree_kid_move(struct cnode *k, struct cnode *dir, const char *name);
/*
 * The tree after a rename of `name` in `from` to `newname` in `to` (ours,
 * entry_rename, or one the change stream told of, follow_move_locked):
 * what newname held is replaced (no path any more), the moved node takes
 * the new name (its ctime changed: its attributes, and its other names',
 * are invalid), and the old name is known free -- an answer about it sent
 * before is older (own_gen).  Returns the moved node, or NULL when the
 * tree had none.  Not for RENAME_EXCHANGE.  c->lock held.
 */
struct cnode *tree_rename(struct cache *c, struct cnode *from,
			  const char *name, struct cnode *to,
			  const char *newname);
/*
 * Put orphan k back into the tree as `name` in dir, in place of what the
 * name holds (orphaned in turn): the second half of a RENAME_EXCHANGE
 * made in the sandbox (follow_move_locked).  Its attributes are invalid
 * and its slot unknown (present if it holds buffered writes).  c->lock
 * held.
 */
void tree_unorphan(struct cache *c, struct cnode *k, struct cnode *dir,
		   const char *name);
/* Find (create: make) the node of a path relative to the root. */
struct cnode *tree_resolve(struct cache *c, const char *path, bool create);
/* Path of n relative to the root, malloc'd; NULL for an orphan. */
char *tree_path(const struct cnode *n);
/*
 * The node whose name operations on n go through: n itself while its name
 * is present, else another name of the same file (hard links) known
 * present, else the first of n and those names that is not known absent,
 * else n.  Never NULL; its path may be (an orphan).
 */
struct cnode *tree_name_of(struct cnode *n);
/* The path of tree_name_of(n), malloc'd; NULL when it has none. */
char *tree_path_of(const struct cnode *n);
char *tree_child_path(const struct cnode *dir, const char *name);
/*
 * Does an answer fetched by n's path, with inode number ino, describe
 * another object than n's?  The sandbox renamed, exchanged or replaced
 * it, and the event is on its way ("The path may hold another object",
 * docs/design.md).  Both numbers known and different; never the root,
 * which is never renamed.  c->lock held.
 */
bool tree_other_object(const struct cache *c, const struct cnode *n,
		       ino_t ino);
/* dir/name has attributes st: its node (a new one if the object is
 * another than the node knew), present. */
struct cnode *tree_name_st(struct cache *c, struct cnode *dir,
			   const char *name, const struct stat *st);
/* Record attributes fetched under n's own name: n is present. */
void tree_set_st(struct cache *c, struct cnode *n, const struct stat *st);
/* Attributes fetched through tree_path_of(n): say nothing of n's name. */
void tree_refresh_st(struct cache *c, struct cnode *n, const struct stat *st);
/* Forget n's attributes and those of its other names (link counts). */
void tree_invalidate_file(struct cnode *n);
/* n is gone or another object now: leave its hard-link ring. */
void tree_ring_leave(struct cache *c, struct cnode *n);
/*
 * The sandbox just gave inode number `ino` to a file it made (a create
 * that made its file): no other file has it, so the ring of names kept
 * under it is a dead file's.  Its members leave it, and hidden names in
 * it are gone from the sandbox (slot S_ABSENT).  c->lock held.
 */
void tree_ring_retire(struct cache *c, ino_t ino);
/*
 * Open files of n's file holding unpushed bytes: those counted on n and on
 * its other names (a write through one name changes the size and content
 * every name shows).  Attribute and content checks ask this; what is about
 * a name itself (its slot, the path a push takes) asks n->dirty.
 */
unsigned tree_file_dirty(const struct cnode *n);
/*
 * Open files of n's file, and (active, if not NULL) how many of them had
 * no FLUSH since their last use: those counted on n and on its other
 * names.  The kernel has one inode per file and its opens count on
 * whichever node that inode holds, which may be a name removed since
 * (open b after link(c, b) and unlink(c) counts on c).  c->lock held.
 */
unsigned tree_file_opens(const struct cnode *n, unsigned *active);
/* How many of the names of n's file are hidden (silly renames) and still
 * in the sandbox. */
unsigned tree_hidden_names(const struct cnode *n);
/* The link count the user should see (silly-renamed names hidden). */
nlink_t tree_visible_nlink(const struct cnode *n, nlink_t nlink);
/*
 * k's link count, just taken from an answer sent when c->unhides_all was
 * `unhides`, may or may not count a hidden name of its file: one was
 * removed (of any file: not told apart) while the answer was out, or one
 * of k's file is being removed now.  Only regular files with other names
 * (the sandbox counts hidden names).  Such a count is not kept.  c->lock
 * held.
 */
bool tree_count_unsettled(struct cache *c, const struct cnode *k,
			  unsigned long unhides);
/*
 * st: the answer of a call about n's file that the kernel keeps (a
 * create's, a link's, a setattr's), sent when c->unhides_all was
 * `unhides_all`, already recorded under n.  Its st_nlink becomes the count
 * the user should see: hidden names taken out, and when the count is
 * unsettled (tree_count_unsettled) *st is n's attributes asked again
 * (the answer's own count when that fails).  No lock held.
 */
void cache_settle_nlink(struct sbx_sandbox *sb, struct cnode *n,
			unsigned long unhides_all, struct stat *st);
/* c->unhides_all now, for cache_settle_nlink() after a call.  No lock
 * held (takes c->lock). */
unsigned long cache_unhides_now(struct cache *c);
/*
 * Removals of hidden names of n's file started or ended so far (a sum
 * that moves with each), and whether one is out now.  A link count the
 * sandbox gave while it moved, or with one out, may or may not count the
 * name, so tree_visible_nlink() cannot take it apart: fetch it again once
 * the removal is done (count_unsettled(), cache.c).  c->lock held.
 */
unsigned tree_file_unhides(const struct cnode *n);
bool tree_file_unhiding(const struct cnode *n);
/*
 * What the name of k holds may have changed (an event about it, a listing
 * that raced a change, lost events): k's slot becomes UNKNOWN, so the next
 * lookup asks.  But a removed name of a hard-linked file leaves the name
 * instead (orphaned: it keeps its ring, for a descriptor open through it,
 * and the name has no node until one is made): UNKNOWN, it would count as
 * alive and make the dead file look so -- its ring kept for a new file
 * under its names, its kernel inode given to a new file with its number,
 * or taken from the file's surviving name (c_node_stale(), cache.c).  True
 * when k was orphaned (never a dirty k).  Our hidden names are left as
 * they are.  c->lock held; may run inside tree_for_each_kid() over k's
 * directory (it removes k only).
 */
bool tree_name_unsure(struct cache *c, struct cnode *k);
/* Invalidate everything below and including n (events were lost). */
void tree_forget_all(struct cache *c, struct cnode *n);
/* Free the subtree of n (not n itself) and n's own allocations. */
void tree_free(struct cache *c, struct cnode *n);
bool tree_is_silly(const char *name);

/* ---- cache_content.c: all with c->lock held ---------------------------- */

void content_drop(struct cache *c, struct cnode *n);
/* content_drop() of n and of its other names: the file's bytes changed. */
void content_drop_file(struct cache *c, struct cnode *n);
bool content_valid(const struct cnode *n);
/* Keep `data` (copied) as n's content, taken as of attributes st. */
void content_store(struct cache *c, struct cnode *n, const void *data,
		   size_t len, const struct stat *st);
/*
 * Copy up to size bytes at off from n's valid content held in memory.
 * Returns the count, or -1 when not cached in memory; *disk_out (when not
 * NULL) receives the spill file's name (malloc'd) when the content is on
 * disk: read it with content_read_disk() after dropping the lock.
 */
ssize_t content_read(struct cache *c, struct cnode *n, void *buf, size_t size,
		     off_t off, char **disk_out);
/*
 * content_read() of the bytes n had as of its last known attributes, valid
 * or not: for a file the sandbox no longer has (c_read's gone_read_or()).
 */
ssize_t content_read_last(struct cache *c, struct cnode *n, void *buf,
			  size_t size, off_t off, char **disk_out);
/* No lock held: read a spill file; -1 when it is gone. */
ssize_t content_read_disk(const char *path, void *buf, size_t size, off_t off);
/* Run queued disk jobs (no lock held); see cache_unlock(). */
void content_run_jobs(struct cache *c, struct disk_job *jobs);
/* Remove what an earlier daemon spilled (no lock held). */
void content_clear_dir(const char *dir);

/* ---- cache_wb.c -------------------------------------------------------- */

struct cfile *wb_file_new(struct cnode *n, int flags);
/* Take / drop a reference.  get: c->lock held.  put: no lock held. */
void wb_file_get(struct cfile *f);
void wb_file_put(struct cache *c, struct cfile *f);
/* A wrapped open file for one I/O on f, at f's current path. */
struct cache_io {
	struct sbx_node *node;
	struct sbx_file *fh;
};
/* Open it (no lock held); on success end it with wb_io_end(). */
int wb_io_begin(struct cache *c, struct cfile *f, struct cache_io *io);
/* The same with open flags `flags` instead of f's. */
int wb_io_begin_flags(struct cache *c, struct cfile *f, int flags,
		      struct cache_io *io);
void wb_io_end(struct cache *c, struct cache_io *io);
/*
 * Push f's buffered writes.  No lock held.  On failure the unpushed bytes
 * stay buffered (the next push retries them) and the error is returned.
 * A push that meets a path the file left in the sandbox is sent again
 * where it went (wb_io_again).
 */
int wb_push(struct cache *c, struct cfile *f);

/* Wait until no rename through the mount is under way (c->renames_out),
 * at most RENAME_WAIT_MS.  c->lock held (dropped while waiting). */
void cache_wait_renames_locked(struct cache *c);

/* An error that the sandbox answering again may clear: an outage's
 * (cache_silly.c). */
bool cache_outage_error(int rc);

/* n's path now (malloc'd), or NULL when it has none, and c->moves then
 * in *moves.  No lock held. */
char *wb_path_now(struct cache *c, struct cnode *n, unsigned long *moves);

/* Tries of an I/O whose file keeps moving in the sandbox, at most. */
#define WB_MOVED_TRIES 8

/*
 * An I/O of n through path `before` (taken just before it, with
 * wb_path_now) said `rc`.  ENOENT or ESTALE may say the file was renamed
 * through the mount by a call still under way (the tree moves the node
 * when it ends: wait for such calls, at most RENAME_WAIT_MS; stress test:
 * fstat and pread of a descriptor said ESTALE/ENOENT while another
 * thread renamed the file), or renamed in the sandbox with the event that
 * moves its node (follow_move_locked) still on its way: catch up with the
 * change stream (a barrier).  Then say whether the node's path changed
 * meanwhile, when the I/O is worth sending again (churn test,
 * test_remote.py: an fsync right after a rename in the sandbox said
 * ENOENT), or any rename was applied since `moves` (c->moves when
 * `before` was taken: renamed a -> b -> a meanwhile, the path is the same
 * and the I/O worth sending again).  Try number `tries` (from 0), at
 * most WB_MOVED_TRIES.  Keeps the I/O's error as the last one when not.
 * Frees `before`.  No lock held, nor any f->wlock (the barrier waits for
 * events, whose invalidations may need a write of ours).
 */
bool wb_io_again(struct cache *c, struct cnode *n, char *before,
		 unsigned long moves, int rc, int tries);
/*
 * Run io(arg), an I/O of n by its path, until it succeeds (>= 0) or fails
 * in a way wb_io_again() does not send again: each try goes where n is
 * then (wb_path_now), after the change stream said where it went.
 * Returns io's last result.  No lock held, nor any f->wlock.
 */
ssize_t wb_io_retry(struct cache *c, struct cnode *n, ssize_t (*io)(void *),
		    void *arg);
/*
 * Push f's buffered bytes and do `then` (fsync, or a setattr of the file)
 * in one exchange (the wrapped sandbox's write_then).  1: pushed and
 * done, *st (may be NULL) the file's attributes after both; 0: nothing
 * done (nothing buffered, another open file of the node holds bytes too,
 * no such op, O_APPEND, too large): push and do `then` separately;
 * -errno: failed.  *pushed says whether the bytes were written (then
 * only `then` failed); if not they stay buffered.  0 as well while f
 * holds a setattr (wb_defer_setattr): the push sends it.  No lock held.
 */
int wb_push_then(struct cache *c, struct cfile *f,
		 const struct sbx_write_then *then, struct stat *st,
		 bool *pushed);
/*
 * A setattr of n that changes no size (mode, owner, times) while one open
 * file holds n's only unpushed bytes and its local image: held with them
 * and sent after them by their push, in the same exchange when it fits
 * (tar's futimens, fchown and fchmod before close cost no request of
 * their own).  Its errors are the push's: close() or fsync() reports
 * them, as for the bytes, whoever pushed them (wb_held_error).  A
 * chown that changes nothing is answered and not sent.  True when held
 * (*out: the attributes after it); false: do it now.  No lock held.
 */
bool wb_defer_setattr(struct cache *c, struct cnode *n, const struct stat *in,
		      int valid, struct stat *out);
/*
 * The error of a setattr held with f's bytes that failed when they were
 * pushed (by anyone: the flusher, a barrier, another process's stat), for
 * f's owner: returned once, as -errno with the message set; 0 if none.
 * No lock held.
 */
int wb_held_error(struct cache *c, struct cfile *f);
/* wb_push_then() of the one open file of n that holds buffered bytes. */
int wb_push_node_then(struct cache *c, struct cnode *n,
		      const struct sbx_write_then *then, struct stat *st,
		      bool *pushed);
/* Push every buffered write of node n (all its open files). */
int wb_push_node(struct cache *c, struct cnode *n);
/* Push every buffered write of the files in directory dir. */
int wb_push_dir(struct cache *c, struct cnode *dir);
/* Push every buffered write of the sandbox. */
int wb_push_all(struct cache *c);
ssize_t wb_write(struct cache *c, struct cfile *f, const void *data,
		 size_t size, off_t off);
/*
 * The same at `off` even when f is O_APPEND (a page-cache write-back that
 * the kernel sent through f): buffered as any write, or, for an O_APPEND
 * file, whose pushes append, written at once at `off`.
 */
ssize_t wb_write_at(struct cache *c, struct cfile *f, const void *data,
		    size_t size, off_t off);
/*
 * Reads and getattr of a node with unpushed writes, answered from the
 * local image (see struct cfile) without pushing.  No lock held.  Return
 * false / -1 when the image is not known: push and ask the sandbox.
 */
bool wb_local_getattr(struct cache *c, struct cnode *n, struct stat *st);
ssize_t wb_local_read(struct cache *c, struct cnode *n, void *buf,
		      size_t size, off_t off);
/* A change event named n (c->lock held): its local image is old. */
void wb_node_changed(struct cnode *n);
/* The last reference of the kernel: push, close, drop.  Frees f (later). */
int wb_release(struct cache *c, struct cfile *f);
int wb_start_flusher(struct cache *c);
void wb_stop_flusher(struct cache *c);

/* ---- cache_list.c ------------------------------------------------------ */

/* Walk dir's subtree in one bulk call.  c->lock held (dropped inside). */
void list_prefetch(struct cache *c, struct cnode *dir);
/*
 * One bulk walk of `path` (relative to the root) with `o`, its records
 * kept in the tree as the prefetch keeps them: none that arrive after a
 * change event during the walk.  No lock held.  0 when every record was
 * kept, 1 when a change made it drop some, or a negative errno (-ENOSYS:
 * the sandbox has no bulk walk).
 */
int list_walk(struct cache *c, const char *path,
	      const struct sbx_bulk_opts *o);
int list_opendir(struct cache *c, struct cnode *n, struct sbx_file **out);
/* Entries of d from cookie off; off 0 (or a first call) takes a new
 * snapshot of the listing.  No lock held. */
int list_readdir(struct cache *c, struct cfile *d, off_t off, unsigned flags,
		 sbx_dirent_cb cb, void *payload);
void list_closedir(struct cfile *d);

/* ---- cache_ahead.c: c->lock held unless said ---------------------------- */

/*
 * A read of n missed its content (n a regular file of at most
 * CACHE_WHOLE_FILE, attributes valid, no buffered writes): wait for the
 * look-ahead request that brings it, starting one (and a plan from n on)
 * when none does.  Drops c->lock while waiting.  True when a request for
 * n ended (look at the content again; it may have been left out); false
 * when there is no look-ahead for n (read it alone).
 */
bool ahead_wait(struct cache *c, struct cnode *n);
/*
 * ct leaves memory, or was `read`: it no longer holds the window.  A read
 * of content fetched ahead also tells that the reader follows the plan.
 */
void ahead_consumed(struct cache *c, struct content *ct, bool read);
/* Stop the workers (no lock held; requests out are finished first). */
void ahead_stop(struct cache *c);

/* ---- cache_fresh.c ----------------------------------------------------- */

/*
 * A foreign entry event named `path` (c->lock held): when it is a loose
 * git object of a repository the tree has seen, its directory is walked
 * soon (see cache_fresh.c).
 */
void fresh_note(struct cache *c, const char *path);
/* Stop the workers (no lock held; walks out are finished first). */
void fresh_stop(struct cache *c);

/* What the workers did (for tests). */
struct fresh_stats {
	size_t waiting;       /* directories queued */
	unsigned walking;     /* walks out now */
	unsigned long walks;  /* walks ended (kept or not) */
};

/* Takes c->lock. */
void fresh_stats(struct cache *c, struct fresh_stats *out);

/* ---- cache_change.c ---------------------------------------------------- */

/* Expect the entry event of our own change of dir/name (no lock held).
 * NULL (nothing to cancel) while the stream is off, and for our hidden
 * names, whose events are never matched. */
struct expect *change_expect(struct cache *c, const struct cnode *dir,
			     const char *name);
/* The change failed: no event will come for it (no lock held). */
void change_expect_cancel(struct cache *c, struct expect *e);
/*
 * c->lock held: an entry operation through the mount (create, link,
 * unlink, rename, ...) succeeded and is being recorded.  Counts as a change
 * (c->events): a listing or negative lookup whose request was out may
 * predate it, and its own event, which would have said so, may come after
 * that answer (the stream is down or slow) and is then dropped as
 * expected.
 */
void change_own_done(struct cache *c);
/* Drop every expectation (c->lock held). */
void change_expect_clear(struct cache *c);
int change_watch_start(struct cache *c, sbx_change_cb cb, void *payload);
int change_watch_sync(struct cache *c);
/*
 * Tell the daemon (the change callback) that the attributes of the file
 * st names changed, so the kernel drops what it keeps; nothing once the
 * stream is stopped (change_watch_stop drains touches first).  No lock
 * held.
 */
void change_notify_attr(struct cache *c, const struct stat *st);
void change_watch_stop(struct cache *c);

/* ---- cache_touch.c: deferred touches ----------------------------------- */

/*
 * Does a setattr with `valid` (SBX_SET_*) only set atime and/or mtime to
 * now?  Such a touch may be deferred (see c_setattr and docs/design.md).
 */
bool touch_only(int valid);
/*
 * Queue a touch (`valid` as above) of n, whose attributes were just
 * answered from the tree; same-node touches queued and not yet taken by
 * the sender merge.  c->lock held.  False when it cannot be queued
 * (stopping; no thread): send it now.
 */
bool touch_queue(struct cache *c, struct cnode *n, int valid);
/*
 * Wait until every touch queued before the call has been sent and
 * answered.  Called before every inner call but the sender's own
 * (cache_inner_node, bulk walks, syncfs, exec, watch_sync), so a queued
 * touch reaches the sandbox before any later request.  No lock held but
 * maybe a cfile.wlock.  Costs one atomic load when nothing was queued.
 */
void touch_drain(struct cache *c);
/* Send what is queued and stop the sender (no lock held; at c_free). */
void touch_stop(struct cache *c);

/* ---- cache_silly.c ----------------------------------------------------- */

/*
 * If `name` in dir is open here, rename it to a hidden name instead of
 * removing it.  Returns 1 when it did, 0 when the name needs no such care,
 * or -errno.  No lock held.
 */
int silly_rename(struct cache *c, struct cnode *dir, const char *name);
/* The kernel closed f (RELEASE): remove a hidden file at its last close. */
void silly_drop_open(struct cache *c, struct cfile *f);
/*
 * `name` in dir, a directory, is about to be removed or replaced: move the
 * hidden names of open files in it to the root, so that it is as empty in
 * the sandbox as it is to the user.  Best effort (a failed move leaves the
 * removal to say ENOTEMPTY).  No lock held.
 */
void silly_evict(struct cache *c, struct cnode *dir, const char *name);
/*
 * Hidden names whose removal failed while the sandbox was out of reach
 * (kept ones, and c->ghosts) of files nothing has open any more: try
 * them again, at most every SILLY_RETRY_S and only while the change stream
 * is healthy, so that an outage leaves no `.sbx-silly.*` file in the
 * sandbox and no link counted that is not there.  The flusher calls it on
 * each tick.  c->lock held; dropped for each removal.
 */
void silly_retry_locked(struct cache *c);
/*
 * At exit (the kernel's connection closed: no descriptor can use them any
 * more), remove every hidden name still in the sandbox, of open files too:
 * left, they were `.sbx-silly.*` files in the user's tree for good.  Stops
 * at the first failure other than ENOENT (the sandbox out of reach).  No
 * lock held; no other thread may use the cache's hidden names (the
 * flusher is stopped).
 */
void silly_final_sweep(struct cache *c);
/* Free what is left of c->ghosts (those the sweep could not remove).
 * Teardown only: no other thread. */
void silly_fini(struct cache *c);

#endif
