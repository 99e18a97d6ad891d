/*
 * The caching layer over a path-based sandbox; see cache.h for what it
 * does and cache_i.h for its parts and its lock order.  This file holds
 * the sbx_sandbox_ops table: each operation answers from the tree when it
 * can, and otherwise calls the wrapped sandbox with no lock held and
 * records what came back.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbx/fs.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "cache.h"
#include "cache_i.h"

double cache_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void cache_deadline_in(struct timespec *ts, clockid_t clock, long ms)
{
	clock_gettime(clock, ts);
	ts->tv_nsec += ms * 1000000L;
	ts->tv_sec += ts->tv_nsec / 1000000000L;
	ts->tv_nsec %= 1000000000L;
}

void cache_cond_init_monotonic(pthread_cond_t *cond)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cond, &ca);
	pthread_condattr_destroy(&ca);
}

bool cache_healthy(struct cache *c)
{
	if (!__atomic_load_n(&c->watching, __ATOMIC_ACQUIRE))
		return false;
	/* A flag read in the provider, no I/O: fine under c->lock. */
	return !c->inner->ops->watch_healthy ||
	       c->inner->ops->watch_healthy(c->inner);
}

bool cache_fresh(struct cache *c, double t)
{
	return cache_healthy(c) || cache_now() - t < CACHE_BLIND_TTL;
}

void cache_lock(struct cache *c)
{
	pthread_mutex_lock(&c->lock);
}

void cache_unlock(struct cache *c)
{
	struct disk_job *jobs = c->jobs;

	c->jobs = NULL;
	pthread_mutex_unlock(&c->lock);
	if (jobs)
		content_run_jobs(c, jobs);
}

int cache_inner_node(struct cache *c, const char *path, struct sbx_node **out)
{
	/* Every call about a path starts here: deferred touches go first. */
	touch_drain(c);
	return c->inner->ops->node_at(c->inner, path, out);
}

int cache_inner_node_ino(struct cache *c, const char *path, ino_t ino,
			 struct sbx_node **out)
{
	if (!ino || !c->inner->ops->node_at_ino)
		return cache_inner_node(c, path, out);
	touch_drain(c);
	return c->inner->ops->node_at_ino(c->inner, path, (uint64_t)ino, out);
}

int cache_inner_stat(struct cache *c, const char *path, struct stat *st)
{
	struct sbx_node *n;
	int rc = cache_inner_node(c, path, &n);

	if (rc < 0)
		return rc;
	rc = c->inner->ops->getattr(c->inner, n, NULL, st);
	c->inner->ops->forget(c->inner, n);
	return rc;
}

char *cache_op_path(struct cache *c, struct cnode *n)
{
	char *p;

	cache_lock(c);
	p = tree_path_of(n);
	cache_unlock(c);
	if (!p)
		sbx_error_set(SBX_ERR_REMOTE, -ESTALE, "'%s' was replaced",
			      n->name ? n->name : "/");
	return p;
}

int cache_inner_node_of(struct cache *c, struct cnode *n,
			struct sbx_node **out)
{
	char *p = cache_op_path(c, n);
	int rc;

	if (!p)
		return -ESTALE;
	rc = cache_inner_node(c, p, out);
	free(p);
	return rc;
}

char *cache_unlock_path(struct cache *c, char *path, unsigned long *gen,
			const char *what)
{
	*gen = c->events;
	cache_unlock(c);
	if (!path)
		sbx_error_set(SBX_ERR_REMOTE, -ESTALE, "%s was replaced", what);
	return path;
}

/*
 * The sandbox says n's path is gone while the tree (and so the kernel's
 * dentry) still had it: a removal whose event has not arrived yet.  The
 * name becomes unknown, and ESTALE makes the kernel look the path up
 * again and retry the call once (open, stat, truncate, chmod, utimes all
 * do): the retry then finds the name gone, or a new file under it, as on
 * a local disk.  For a call on a descriptor (ftruncate of a file removed
 * in the sandbox) ESTALE is what NFS says too; a getattr of a file open
 * here answers from what was last known instead (open_removed_or).  The
 * O_TRUNC of an open arrives as a setattr on the just-opened file: the
 * retry reopens.
 */
int cache_stale_or(struct cache *c, struct cnode *n, int rc)
{
	struct cnode *k;
	char *name = NULL;

	if (rc != -ENOENT)
		return rc;
	cache_lock(c);
	/*
	 * The name that failed is the one the call went through: for a hard
	 * link that may be another name of the file than n's own.  It is
	 * the one to ask about again, so the retry takes another name.
	 */
	k = tree_name_of(n);
	if (k->slot != S_ABSENT && k->parent) {
		/* Our hidden names are ours to know (tree_name_unsure): one
		 * the sandbox does not have is gone, and counts no more. */
		k->slot = k->hidden ? S_ABSENT : S_UNKNOWN;
		tree_invalidate_file(k);
		k->parent->st_valid = false;
		k->parent->complete = false;
		name = sbx_xstrdup(k->name);
	}
	cache_unlock(c);
	if (!name)
		return rc;
	rc = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
			   "'%s' was removed in the sandbox; look it up again",
			   name);
	free(name);
	return rc;
}

int cache_check_name(const char *name)
{
	if (strlen(name) > NAME_MAX)
		return sbx_error_set(SBX_ERR_REMOTE, -ENAMETOOLONG,
				     "a name has at most %d bytes", NAME_MAX);
	return 0;
}

/* ---- lookups and attributes ---------------------------------------------- */

static struct sbx_node *c_root(struct sbx_sandbox *sb)
{
	return (struct sbx_node *)&CACHE(sb)->root;
}

/*
 * c->lock held: does the tree know that dir has no kid k (its node, or
 * NULL), by a negative entry or a complete listing, fresh?
 */
static bool known_absent_locked(struct cache *c, struct cnode *dir,
				struct cnode *k)
{
	return cache_fresh(c, dir->list_time) &&
	       (k ? k->slot == S_ABSENT : dir->complete);
}

/*
 * After a fetch of n's file's attributes (c->lock held, `unhides` the
 * file's tree_file_unhides() when it went out): was a hidden name of the
 * file being removed meanwhile?  Then the sandbox's link count may or may
 * not count that name, and taking the hidden names apart gives one link
 * too many or too few (random tester, seeds 736082533 and 651796407: a
 * stat right after the last close of a hard-linked file with a name
 * removed while open).  Wait for the removal and say to fetch again, at
 * most twice.  The wait is for the removal's own request, not a guess
 * (100 ms until 2026-12-07: a removal slower than that on a loaded
 * machine left a count taken apart as if it had not landed).
 */
static void wait_unhidden(struct cache *c, struct cnode *n, int *tries)
{
	struct timespec until;

	(*tries)++;
	cache_deadline_in(&until, CLOCK_REALTIME, UNHIDE_WAIT_MS);
	while (tree_file_unhiding(n) &&
	       pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
		;
	sbx_debug("link count of '%s' taken during a hidden name's removal: "
		  "asking again", n->name ? n->name : "");
}

static bool count_unsettled(struct cache *c, struct cnode *n,
			    unsigned unhides, const struct stat *fst,
			    int *tries)
{
	if (!S_ISREG(fst->st_mode) || *tries >= 2 ||
	    (tree_file_unhides(n) == unhides && !tree_file_unhiding(n)))
		return false;
	wait_unhidden(c, n, tries);
	return true;
}

/*
 * The same once the answer is recorded under n, now tied to its file's
 * other names: the file's own count above misses a removal when n was
 * not yet in the file's ring as the answer went out (a name made behind
 * the mount, or a node made afresh by an event: random tester, seed
 * 19350260, fstat of a file just opened said 1 link for 2), so any
 * removal of a hidden name since `unhides_all` (c->unhides_all then)
 * makes a hard-linked file's count unsettled (tree_count_unsettled).
 * Then n's attributes are not kept, and the caller fetches again.
 */
static bool count_unsettled_any(struct cache *c, struct cnode *n,
				unsigned long unhides_all, int *tries)
{
	if (*tries >= 2 || !tree_count_unsettled(c, n, unhides_all))
		return false;
	n->st_valid = false;
	wait_unhidden(c, n, tries);
	return true;
}

/*
 * A push before a stat failed: its bytes and its error stay with the
 * file's owner (cache_wb.c), whose fsync() or close() reports it; the stat
 * answers the sandbox's attributes (an outage fails that fetch too).  It
 * said the push's error before 2026-12-07: `EFBIG` of a write past the
 * sandbox's largest file came back from fstat() and stat() (stress test).
 */
static void push_failed_for_stat(const struct cnode *n, int rc)
{
	sbx_debug("stat of '%s': a push before it failed (%s); the sandbox's "
		  "attributes answer", n->name ? n->name : "", strerror(-rc));
	sbx_error_clear();
}

static int c_lookup(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node **out, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *dir = CNODE(parent), *k, *known;
	unsigned long gen, unhides_all;
	unsigned unhides;
	struct stat fst;
	char *path;
	int rc, tries = 0, renamed_tries = 0;

	*out = NULL;
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "lookup of '%s'", name);
	rc = cache_check_name(name);
	if (rc < 0)
		return rc;
again:
	cache_lock(c);
	if (!dir->prefetched && !dir->complete)
		list_prefetch(c, dir);
	k = tree_kid_find(dir, name);
	if (k && tree_file_dirty(k) && k->slot == S_PRESENT) {
		cache_unlock(c);
		if (wb_local_getattr(c, k, st)) {
			*out = (struct sbx_node *)k;
			return 0;
		}
		cache_lock(c);
	}
	if (k && tree_file_dirty(k)) {
		/*
		 * Buffered writes (through any name of the file) change the
		 * size: a LOOKUP reply carries attributes the kernel keeps
		 * (600 s), so they must be the sandbox's after the push, not
		 * the cached ones.
		 */
		cache_unlock(c);
		rc = wb_push_node(c, k);
		if (rc < 0)
			push_failed_for_stat(k, rc);
		cache_lock(c);
	}
	/* (Not while a hidden name of the file is being removed: see
	 * c_getattr.) */
	if (k && k->slot == S_PRESENT && k->st_valid && !tree_file_dirty(k) &&
	    cache_fresh(c, k->st_time) && !tree_file_unhiding(k)) {
		*st = k->st;
		st->st_nlink = tree_visible_nlink(k, st->st_nlink);
		*out = (struct sbx_node *)k;
		cache_unlock(c);
		return 0;
	}
	if (known_absent_locked(c, dir, k)) {
		cache_unlock(c);
		sbx_debug("lookup of '%s': absent (cached)", name);
		return sbx_error_set(SBX_ERR_REMOTE, -ENOENT, "no '%s'", name);
	}
	known = k;
	unhides = k ? tree_file_unhides(k) : 0;
	unhides_all = c->unhides_all;
	path = cache_unlock_path(c, tree_child_path(dir, name), &gen,
				 "directory");
	if (!path)
		return -ESTALE;
	rc = cache_inner_stat(c, path, &fst);
	if (rc == -ENOENT)
		sbx_debug("lookup of '%s': absent in the sandbox", path);
	free(path);
	cache_lock(c);
	if (rc == 0 && known &&
	    count_unsettled(c, known, unhides, &fst, &tries)) {
		cache_unlock(c);
		goto again;
	}
	/*
	 * The name changed through the mount, or its object moved away in
	 * the sandbox (follow_move_locked), after this answer was sent: it
	 * may show the object that left, which would get a second node (and
	 * the kernel a second inode) beside the one that followed it.
	 */
	k = rc == 0 ? tree_kid_find(dir, name) : NULL;
	if (k && k->own_gen > gen && renamed_tries++ < 2) {
		cache_unlock(c);
		goto again;
	}
	if (rc == -ENOENT) {
		k = tree_kid_get(dir, name);
		/* A negative entry is as fresh as a listing. */
		if (!k->dirty && gen == c->events) {
			k->slot = S_ABSENT;
			if (!dir->complete)
				dir->list_time = cache_now();
		}
	} else if (rc == 0) {
		k = tree_name_st(c, dir, name, &fst);
		if (count_unsettled_any(c, k, unhides_all, &tries)) {
			cache_unlock(c);
			goto again;
		}
		if (gen != c->events)
			k->st_valid = false; /* raced with a change */
		*st = fst;
		st->st_nlink = tree_visible_nlink(k, st->st_nlink);
		*out = (struct sbx_node *)k;
	}
	cache_unlock(c);
	return rc;
}

static void c_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	/* Nodes live as long as the tree; the daemon counts references. */
	(void)sb;
	(void)node;
}

/*
 * A regular file open here whose name the sandbox no longer has (removed
 * or moved there): its last known attributes, for a descriptor's fstat(),
 * as a local disk answers it.  The kernel usually answers from its own
 * copy, which an event about the name leaves alone (c_attr_changed), but
 * not always: a reply that crossed an invalidation of the inode is not
 * cached, and ESTALE then reached fstat() (test_fileops.py, the link
 * counts test, 1 run in 10 on a loaded machine).  c->lock held.
 */
static bool open_file_last_st(const struct cnode *n, struct stat *st)
{
	if (!S_ISREG(n->st.st_mode) || !n->st.st_ino ||
	    !tree_file_opens(n, NULL))
		return false;
	*st = n->st;
	st->st_nlink = tree_visible_nlink(n, st->st_nlink);
	return true;
}

/*
 * rc, the failure of a getattr of n; or 0 and open_file_last_st().  Not
 * when the name asked was present as far as the tree knew (`named`): no
 * event or lookup had said otherwise, so the kernel's dentry may still
 * lead a stat() by the path here, which must look the name up again
 * (ESTALE) and say ENOENT, not see the removed file; after such an event
 * or lookup the kernel dropped the dentry, and the call comes from a
 * descriptor.
 */
static int open_removed_or(struct cache *c, struct cnode *n, bool named,
			   struct stat *st, int rc)
{
	bool kept;

	if (named || (rc != -ENOENT && rc != -ESTALE))
		return rc;
	cache_lock(c);
	kept = open_file_last_st(n, st);
	cache_unlock(c);
	if (!kept)
		return rc;
	sbx_error_clear();
	return 0;
}

/* Does st, fetched by n's path, describe another object than n's? */
static bool other_object(struct cache *c, struct cnode *n,
			 const struct stat *st)
{
	bool other;

	cache_lock(c);
	other = tree_other_object(c, n, st->st_ino);
	cache_unlock(c);
	return other;
}

static int c_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	unsigned long gen, unhides_all;
	unsigned unhides;
	struct stat fst;
	char *path;
	bool named;
	unsigned long moves;
	int rc, tries = 0, moved = 0;

	(void)fh;
	/* A file being written whose whole content we know: its size and
	 * times are ours to tell. */
	if (wb_local_getattr(c, n, st))
		return 0;
	/* Else buffered writes change the size: push them so the answer is
	 * true (and wait for pushes in flight). */
	rc = wb_push_node(c, n);
	if (rc < 0)
		push_failed_for_stat(n, rc);
again:
	cache_lock(c);
	/* A directory removed through the mount, still open here (or some
	 * process's working directory): what a local disk says, not ENOENT.
	 * (Never dirty: the two calls above did nothing for it.) */
	if (n->gone_dir) {
		*st = n->st;
		cache_unlock(c);
		return 0;
	}
	/*
	 * Not while a hidden name of the file is being removed: a count
	 * kept meanwhile (an open's look, say) may or may not count that
	 * name, which is still taken off (random tester, seed 367681880:
	 * fstat after open(O_CREAT) of a name of a file whose other name's
	 * last close had just sent the removal said 1 link for 2).  The
	 * fetch below waits for the removal.
	 */
	if (n->st_valid && !tree_file_dirty(n) &&
	    cache_fresh(c, n->st_time) && !tree_file_unhiding(n)) {
		*st = n->st;
		st->st_nlink = tree_visible_nlink(n, st->st_nlink);
		cache_unlock(c);
		return 0;
	}
	unhides = tree_file_unhides(n);
	unhides_all = c->unhides_all;
	named = tree_name_of(n)->slot == S_PRESENT;
	moves = c->moves;
	path = cache_unlock_path(c, tree_path_of(n), &gen, "file");
	if (!path)
		return open_removed_or(c, n, false, st, -ESTALE);
	rc = cache_inner_stat(c, path, &fst);
	if (rc == 0 && other_object(c, n, &fst)) {
		/*
		 * The path holds another object than n's (renamed, exchanged
		 * or replaced in the sandbox, the event on its way): as if
		 * n's were gone from it.  Taken as n's (before 2026-12-08),
		 * n became that object in place, and so did the kernel's
		 * inode of it, listing and all (directories exchanged in
		 * the sandbox while listed: one showed the other's entries).
		 */
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOENT,
				   "'%s' names another object now", path);
	}
	if (rc < 0) {
		/* Renamed meanwhile (through the mount or in the sandbox):
		 * ask where it went (frees path). */
		if (wb_io_again(c, n, path, moves, rc, moved++))
			goto again;
		return open_removed_or(c, n, named, st,
				       cache_stale_or(c, n, rc));
	}
	free(path);
	cache_lock(c);
	if (count_unsettled(c, n, unhides, &fst, &tries)) {
		cache_unlock(c);
		goto again;
	}
	tree_refresh_st(c, n, &fst);
	if (count_unsettled_any(c, n, unhides_all, &tries)) {
		cache_unlock(c);
		goto again;
	}
	if (gen != c->events)
		n->st_valid = false; /* raced with a change */
	*st = fst;
	st->st_nlink = tree_visible_nlink(n, st->st_nlink);
	cache_unlock(c);
	return 0;
}

unsigned long cache_unhides_now(struct cache *c)
{
	unsigned long now;

	cache_lock(c);
	now = c->unhides_all;
	cache_unlock(c);
	return now;
}

void cache_settle_nlink(struct sbx_sandbox *sb, struct cnode *n,
			unsigned long unhides_all, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct stat fst;

	cache_lock(c);
	if (!tree_count_unsettled(c, n, unhides_all)) {
		st->st_nlink = tree_visible_nlink(n, st->st_nlink);
		cache_unlock(c);
		return;
	}
	n->st_valid = false;
	cache_unlock(c);
	if (c_getattr(sb, (struct sbx_node *)n, NULL, &fst) == 0) {
		*st = fst;
		return;
	}
	/* Gone meanwhile (say): the answer's own count. */
	sbx_error_clear();
	cache_lock(c);
	st->st_nlink = tree_visible_nlink(n, st->st_nlink);
	cache_unlock(c);
}

/*
 * A touch (utime(NULL), futimens(UTIME_NOW)) of a regular file or
 * directory whose attributes the tree holds, while the change stream is
 * healthy: answered from them with the times set to now, and queued for
 * the sender (cache_touch.c), so a run of touches costs a few requests,
 * not one each.  Permissions are the kernel's: the mount always has
 * default_permissions (fs/fs.c), which checks owner or write access for a
 * touch before it reaches us.  A file with other names is not deferred
 * (their ctime would change too), nor one with buffered writes (the touch
 * must follow them).  True when answered; *out filled.
 */
static bool touch_deferred(struct cache *c, struct cnode *n, int valid,
			   struct stat *out)
{
	struct timespec now;
	struct stat st;

	if (!c->inner->ops->setattr_many || !touch_only(valid))
		return false;
	clock_gettime(CLOCK_REALTIME, &now);
	cache_lock(c);
	st = n->st;
	if (!cache_healthy(c) || !n->st_valid || tree_file_dirty(n) ||
	    n->orphan ||
	    n->hidden || n->slot == S_ABSENT ||
	    !(S_ISDIR(st.st_mode) ||
	      (S_ISREG(st.st_mode) && st.st_nlink == 1)) ||
	    !touch_queue(c, n, valid)) {
		cache_unlock(c);
		return false;
	}
	if (valid & SBX_SET_ATIME)
		st.st_atim = now;
	if (valid & SBX_SET_MTIME)
		st.st_mtim = now;
	st.st_ctim = now;
	n->st = st;
	n->st_time = cache_now();
	/* A fetch out now may answer from before the touch: not kept. */
	change_own_done(c);
	*out = st;
	out->st_nlink = tree_visible_nlink(n, st.st_nlink);
	cache_unlock(c);
	return true;
}

struct setattr_args {
	struct cache *c;
	struct cnode *n;
	const struct stat *in;
	int valid;
	struct stat *out;
};

/*
 * A setattr of n by its path, for n's file only (node_at_ino, as writes):
 * the path may name another file now (the sandbox replaced it, the event
 * on its way), which must not get n's chmod or truncate (ESTALE instead).
 */
static ssize_t setattr_try(void *arg)
{
	struct setattr_args *a = arg;
	struct cache *c = a->c;
	struct sbx_node *in;
	char *path;
	ino_t ino;
	int rc;

	cache_lock(c);
	ino = a->n->st.st_ino;
	cache_unlock(c);
	path = cache_op_path(c, a->n);
	if (!path)
		return -ESTALE;
	rc = cache_inner_node_ino(c, path, ino, &in);
	free(path);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->setattr(c->inner, in, NULL, a->in, a->valid,
				    a->out);
	c->inner->ops->forget(c->inner, in);
	return rc;
}

static int c_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct sbx_write_then then = { .kind = SBX_THEN_SETATTR, .in = in,
				       .valid = valid };
	unsigned long unhides_all;
	bool pushed, other;
	int rc;

	(void)fh;
	if (touch_deferred(c, n, valid, out))
		return 0;
	unhides_all = cache_unhides_now(c);
	/* A file being written: held, sent with its bytes. */
	if (wb_defer_setattr(c, n, in, valid, out))
		return 0;
	/* tar's fchown/fchmod/futimens before close: the buffered bytes and
	 * the setattr in one exchange when they fit. */
	rc = wb_push_node_then(c, n, &then, out, &pushed);
	if (rc < 0 && !pushed)
		return rc; /* as a failed push below */
	if (rc == 0) {
		struct setattr_args a = { c, n, in, valid, out };

		rc = wb_push_node(c, n);
		if (rc < 0)
			return rc;
		rc = (int)wb_io_retry(c, n, setattr_try, &a);
	} else if (rc > 0) {
		rc = 0;
	}
	if (rc < 0) {
		cache_lock(c);
		tree_invalidate_file(n);
		cache_unlock(c);
		/* ESTALE: the path names another file, and the stream said
		 * nothing of n moving: look it up again, as for a removal
		 * (still ESTALE for a node with no name left). */
		if (rc == -ESTALE && cache_stale_or(c, n, -ENOENT) == -ENOENT)
			return -ESTALE;
		return cache_stale_or(c, n, rc);
	}
	cache_lock(c);
	other = tree_other_object(c, n, out->st_ino);
	if (other) {
		/*
		 * The answer describes another file than n's (a stat by a
		 * path the sandbox gave away meanwhile; the change itself
		 * named n's inode): not n's attributes, which are asked for
		 * again.  Taken as n's, n became that file, and later
		 * setattrs passed the inode check for it.
		 */
		mode_t type = n->st.st_mode & S_IFMT;

		*out = n->st;
		if (valid & SBX_SET_MODE)
			out->st_mode = type | (in->st_mode & 07777);
		if (valid & SBX_SET_SIZE)
			out->st_size = in->st_size;
	} else {
		tree_refresh_st(c, n, out);
	}
	if (valid & SBX_SET_SIZE)
		content_drop_file(c, n);
	/* ctime (and a size) changed for every name of the file. */
	tree_invalidate_file(n);
	n->st_valid = !other;
	cache_unlock(c);
	/* The kernel keeps the answer's link count too. */
	cache_settle_nlink(sb, n, unhides_all, out);
	return 0;
}

static int c_readlink(struct sbx_sandbox *sb, struct sbx_node *node, char *buf,
		      size_t size)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct sbx_node *inode;
	int rc;

	cache_lock(c);
	if (n->link && n->st_valid && cache_fresh(c, n->st_time)) {
		size_t l = strlen(n->link);

		if (l > size)
			l = size;
		memcpy(buf, n->link, l);
		cache_unlock(c);
		return (int)l;
	}
	cache_unlock(c);
	rc = (int)ON_INNER(c, n, inode,
			   c->inner->ops->readlink(c->inner, inode, buf, size));
	if (rc >= 0 && (size_t)rc < size) {
		cache_lock(c);
		free(n->link);
		n->link = sbx_xstrndup(buf, (size_t)rc);
		cache_unlock(c);
	}
	return rc < 0 ? cache_stale_or(c, n, rc) : rc;
}

/* ---- open files ---------------------------------------------------------- */

/*
 * Does the kernel send FLUSH for this open?  Not for read-only ones:
 * fill_open() in fs/ops.c sets FOPEN_NOFLUSH unless the open may write
 * (the same rule as its open_for_writing()), which saves a synchronous
 * request per close(2) of a reader.
 */
static bool open_flushes(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
}

/*
 * Count a new open file f of n.  Opens without FLUSH never count as
 * active: an unlink of a file that only readers have open waits a little
 * for their RELEASE (cache_silly.c) instead of taking them for open.
 */
static void count_open(struct cache *c, struct cnode *n, struct cfile *f)
{
	cache_lock(c);
	n->opens++;
	f->ino = n->st.st_ino;
	if (open_flushes(f->flags))
		n->active++;
	else
		f->flushed = true;
	cache_unlock(c);
}

/* I/O on a closed file (a dup'd descriptor): it is open after all. */
static void reactivate(struct cache *c, struct cfile *f)
{
	if (!open_flushes(f->flags))
		return; /* never active, see count_open() */
	cache_lock(c);
	if (f->flushed) {
		f->flushed = false;
		f->node->active++;
	}
	cache_unlock(c);
}

static int c_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		  struct sbx_open_result *out)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct stat st;
	unsigned long unhides_all;
	bool same = true, check;
	int rc;

	memset(out, 0, sizeof(out[0]));
	/*
	 * Close-to-open: without a healthy change stream, look at the file
	 * again; the kernel keeps its pages only if it did not change.  With
	 * one, look only when an event said the name changed since the
	 * kernel looked it up.
	 */
	cache_lock(c);
	check = !cache_healthy(c) || n->slot != S_PRESENT;
	unhides_all = c->unhides_all;
	cache_unlock(c);
	if (check) {
		struct sbx_node *in;

		rc = (int)ON_INNER(c, n, in,
				   c->inner->ops->getattr(c->inner, in, NULL,
							  &st));
		if (rc < 0)
			return cache_stale_or(c, n, rc);
		cache_lock(c);
		if (tree_other_object(c, n, st.st_ino)) {
			/*
			 * The path holds another file than n's (the sandbox
			 * moved n's away and put another there, the events
			 * on their way): the kernel looks the path up again
			 * and opens that one.  Taken as n's (before
			 * 2026-12-08), n became that file, and so did its
			 * descriptors: a file's descriptor read another
			 * file's bytes (stress agent, exchange chains).
			 */
			cache_unlock(c);
			sbx_error_set(SBX_ERR_REMOTE, -ENOENT,
				      "open: the path names another file now");
			return cache_stale_or(c, n, -ENOENT);
		}
		same = n->st_valid && n->st.st_ino == st.st_ino &&
		       n->st.st_size == st.st_size &&
		       n->st.st_mtim.tv_sec == st.st_mtim.tv_sec &&
		       n->st.st_mtim.tv_nsec == st.st_mtim.tv_nsec;
		tree_refresh_st(c, n, &st);
		/*
		 * A link count taken while a hidden name of the file was
		 * being removed may or may not count it: not kept (random
		 * tester, seed 367681880: kept, a stat right after said 3
		 * links for 2).
		 */
		if (tree_count_unsettled(c, n, unhides_all))
			n->st_valid = false;
		cache_unlock(c);
	}
	out->fh = (struct sbx_file *)wb_file_new(n, flags);
	out->keep_cache = same;
	count_open(c, n, CFILE(out->fh));
	return 0;
}

static int c_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, mode_t mode, int flags,
		    struct sbx_node **node_out, struct stat *st,
		    struct sbx_open_result *out)
{
	struct cache *c = CACHE(sb);
	struct cnode *dir = CNODE(parent), *k;
	struct sbx_open_result res;
	struct sbx_node *in, *made = NULL;
	struct cfile *f;
	unsigned long unhides;
	bool expect, created;
	int rc = cache_check_name(name);

	if (rc < 0)
		return rc;
	memset(&res, 0, sizeof(res));
	/*
	 * Without O_EXCL the file may exist already: then no event of ours
	 * comes, and an unconsumed expectation would swallow a later one.
	 * Unless the tree knows the name is absent (the kernel's LOOKUP
	 * before this CREATE said so): then exactly one entry event comes,
	 * ours, or -- the file was made behind us and its event is still on
	 * its way -- that one, which says nothing our answer does not.
	 * A linker unlinks its output, then creates it so: had the event
	 * of that create not been expected, it would make the new file's
	 * content unknown (its local image, cache_wb.c) while it is being
	 * written.
	 */
	expect = flags & O_EXCL;
	cache_lock(c);
	if (!expect)
		expect = known_absent_locked(c, dir, tree_kid_find(dir, name));
	unhides = c->unhides_all;
	cache_unlock(c);
	rc = EXPECTING_IF(c, expect, dir, name,
			  ON_INNER(c, dir, in,
				   c->inner->ops->create(c->inner, in, name,
							 mode, flags, &made,
							 st, &res)));
	if (rc < 0)
		return rc;
	/* I/O opens the file by its path each time (see cache_i.h). */
	if (res.fh)
		(void)c->inner->ops->release(c->inner, res.fh);
	c->inner->ops->forget(c->inner, made);
	k = entry_created(c, dir, name, st);
	/*
	 * The kernel keeps the answer's link count for the file (an existing
	 * one, without O_EXCL): hidden names of it do not count, and a count
	 * taken while one was being removed (a last close just before, whose
	 * RELEASE the kernel does not wait for) may or may not count it
	 * (random tester, seeds 894512807 and 491753834: fstat after such an
	 * open said 2 links for 1).
	 */
	cache_settle_nlink(sb, k, unhides, st);
	/*
	 * O_EXCL, or the name known free and the file with one link: a new
	 * file.  (A name known free may hold a file made behind us just now,
	 * whose event is on its way: with one link that one is new to us
	 * too; with more, a hard link of a file the kernel may hold, which
	 * node_stale must tie to it.)
	 */
	created = (flags & O_EXCL) ||
		  (expect && S_ISREG(st->st_mode) && st->st_nlink <= 1);
	cache_lock(c);
	/* Empty: its whole content is known, reads need not ask. */
	if (S_ISREG(st->st_mode) && st->st_size == 0)
		content_store(c, k, "", 0, st);
	/* Names a dead file left under its number are not its. */
	if (created && st->st_nlink <= 1 && !k->in_ring)
		tree_ring_retire(c, st->st_ino);
	cache_unlock(c);
	f = wb_file_new(k, flags);
	count_open(c, k, f);
	memset(out, 0, sizeof(*out));
	out->fh = (struct sbx_file *)f;
	out->keep_cache = true;
	out->created = created;
	*node_out = (struct sbx_node *)k;
	return 0;
}

/* A read of n that misses is served by fetching n whole.  c->lock held. */
static bool read_whole(const struct cnode *n)
{
	return n->st_valid && !tree_file_dirty(n) && S_ISREG(n->st.st_mode) &&
	       n->st.st_size <= (off_t)CACHE_WHOLE_FILE;
}

/*
 * The part of c_read() that asks the sandbox: the file whole (`whole`:
 * `fsize` bytes, kept if c->events is still `gen`) or the range.  No
 * lock held.
 */
struct read_args {
	struct cache *c;
	struct cfile *f;
	void *buf;
	size_t size;
	off_t off;
	bool whole;
	off_t fsize;
	unsigned long gen;
};

static ssize_t read_through(void *arg)
{
	struct read_args *a = arg;
	struct cache *c = a->c;
	struct cfile *f = a->f;
	void *buf = a->buf;
	size_t size = a->size;
	off_t off = a->off, fsize = a->fsize;
	struct cnode *n = f->node;
	struct cache_io io;
	ssize_t got;
	int rc;

	rc = wb_io_begin(c, f, &io);
	if (rc < 0)
		return rc;
	if (a->whole) {
		/* Small file: fetch it whole once, serve from memory. */
		size_t cap = (size_t)fsize;
		char *all = sbx_xmalloc(cap ? cap : 1);
		ssize_t n2 = c->inner->ops->read(c->inner, io.fh, all, cap, 0);

		if (n2 >= 0 && (size_t)n2 == cap) {
			wb_io_end(c, &io);
			cache_lock(c);
			/* Only if nothing changed the file meanwhile. */
			if (n->st_valid && n->st.st_size == fsize &&
			    !tree_file_dirty(n) && a->gen == c->events) {
				struct stat cur = n->st;

				content_store(c, n, all, cap, &cur);
			}
			cache_unlock(c);
			got = off >= n2 ? 0
				       : (ssize_t)(size < (size_t)(n2 - off)
						      ? size
						      : (size_t)(n2 - off));
			if (got > 0)
				memcpy(buf, all + off, (size_t)got);
			free(all);
			return got;
		}
		free(all);
		if (n2 < 0) {
			wb_io_end(c, &io);
			return n2;
		}
		/* The file changed size under us: fall through to a range. */
	}
	got = c->inner->ops->read(c->inner, io.fh, buf, size, off);
	wb_io_end(c, &io);
	return got;
}

/*
 * rc, a read of n that found no file (ENOENT, ESTALE): n's object left the
 * sandbox, removed or replaced there (an editor's save), after the
 * descriptor was opened, or after the kernel's dentry led an open here
 * while its event was on its way.  Then the bytes it last had, if held
 * whole, as a local disk serves a descriptor of an unlinked file.  Said
 * ESTALE before 2026-12-08: `cat` of a file saved in the sandbox at that
 * moment failed (stress agent, 1 run in 5).  Bytes written to it there
 * after it left its name are not seen, as they were never asked for.
 */
static ssize_t gone_read_or(struct cache *c, struct cnode *n, void *buf,
			    size_t size, off_t off, ssize_t rc)
{
	char *disk = NULL;
	ssize_t got;

	if (rc != -ENOENT && rc != -ESTALE)
		return rc;
	cache_lock(c);
	got = content_read_last(c, n, buf, size, off, &disk);
	cache_unlock(c);
	if (disk) {
		got = content_read_disk(disk, buf, size, off);
		free(disk);
	}
	if (got < 0)
		return rc;
	sbx_error_clear();
	sbx_debug("read of a file gone from the sandbox: its last bytes");
	return got;
}

static ssize_t c_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		      size_t size, off_t off)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	struct cnode *n = f->node;
	struct read_args a = { .c = c, .f = f, .buf = buf, .size = size,
			       .off = off };
	char *disk = NULL;
	ssize_t got;
	bool whole;
	int rc;

	reactivate(c, f);
	/* Our writes over content we know: no need to ask. */
	got = wb_local_read(c, n, buf, size, off);
	if (got >= 0)
		return got;
	/* Else writes through any open file of n (mmap write-back goes
	 * through whichever) must be in the sandbox before we read it. */
	rc = wb_push_node(c, n);
	if (rc < 0)
		return rc;
	cache_lock(c);
	got = content_read(c, n, buf, size, off, &disk);
	whole = got < 0 && !disk && read_whole(n);
	/* A cold walk: a look-ahead request brings it with the next files. */
	if (whole && ahead_wait(c, n)) {
		got = content_read(c, n, buf, size, off, &disk);
		whole = got < 0 && !disk && read_whole(n);
	}
	a.whole = whole;
	a.fsize = n->st.st_size;
	a.gen = c->events;
	cache_unlock(c);
	if (got >= 0)
		return got;
	if (disk) {
		got = content_read_disk(disk, buf, size, off);
		free(disk);
		if (got >= 0)
			return got;
	}
	/* A rename through the mount or in the sandbox may move the file
	 * while the read is out: read again where it went. */
	got = wb_io_retry(c, n, read_through, &a);
	return got < 0 ? gone_read_or(c, n, buf, size, off, got) : got;
}

static ssize_t c_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *data, size_t size, off_t off)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);

	reactivate(c, f);
	return wb_write(c, f, data, size, off);
}

/* Page-cache write-back through f: at off even if f is O_APPEND. */
static ssize_t c_write_at(struct sbx_sandbox *sb, struct sbx_file *fh,
			  const void *data, size_t size, off_t off)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);

	reactivate(c, f);
	return wb_write_at(c, f, data, size, off);
}

static int c_flush(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	int rc = wb_push(c, f);

	/*
	 * close(2): the kernel sends RELEASE only later and asynchronously,
	 * so an unlink right after a close must not see this file as open.
	 */
	cache_lock(c);
	if (!f->flushed) {
		f->flushed = true;
		if (f->node->active)
			f->node->active--;
	}
	cache_unlock(c);
	/* Nothing to flush in the wrapped file: the cache opens it per I/O
	 * and has just pushed what it buffered. */
	return rc < 0 ? rc : wb_held_error(c, f);
}

struct fsync_args {
	struct cache *c;
	struct cfile *f;
	bool datasync;
};

static ssize_t fsync_try(void *arg)
{
	struct fsync_args *a = arg;
	struct cache_io io;
	int rc = wb_io_begin(a->c, a->f, &io);

	if (rc == 0) {
		rc = a->c->inner->ops->fsync(a->c->inner, io.fh, a->datasync);
		wb_io_end(a->c, &io);
	}
	return rc;
}

static int c_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	struct fsync_args a = { c, f, datasync };
	/* The buffered bytes and the fsync in one exchange when they fit. */
	struct sbx_write_then then = { .kind = SBX_THEN_FSYNC,
				       .datasync = datasync };
	bool pushed;
	int rc = wb_push_then(c, f, &then, NULL, &pushed);

	if (rc != 0)
		return rc < 0 ? rc : wb_held_error(c, f);
	/* msync write-back may have come through another open file. */
	rc = wb_push_node(c, f->node);
	if (rc == 0)
		rc = (int)wb_io_retry(c, f->node, fsync_try, &a);
	return rc < 0 ? rc : wb_held_error(c, f);
}

static int c_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);

	if (f->is_dir) {
		list_closedir(f);
		return 0;
	}
	return wb_release(c, f);
}

/* Push f's writes, then open it for one I/O. */
static int with_file(struct cache *c, struct cfile *f, struct cache_io *io)
{
	int rc = wb_push(c, f);

	return rc < 0 ? rc : wb_io_begin(c, f, io);
}

static int c_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		       off_t off, off_t len)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	struct cache_io io;
	int rc;

	if (!c->inner->ops->fallocate)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP,
				     "fallocate not supported");
	rc = with_file(c, f, &io);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->fallocate(c->inner, io.fh, mode, off, len);
	wb_io_end(c, &io);
	cache_lock(c);
	tree_invalidate_file(f->node);
	content_drop(c, f->node);
	cache_unlock(c);
	return rc;
}

/*
 * Does n, by its cached attributes, have no holes?  Its allocated blocks
 * cover its size, and not by much more: blocks past EOF (fallocate with
 * KEEP_SIZE, speculative preallocation) could make up for a hole.  A small
 * file takes a whole block, a large one some blocks of metadata.  Wrong
 * only towards "no holes", which is always a correct answer to SEEK_HOLE.
 * Caller holds c->lock.
 */
static bool known_dense(struct cache *c, const struct cnode *n)
{
	off_t size = n->st.st_size, alloc = (off_t)n->st.st_blocks * 512;

	return n->st_valid && !tree_file_dirty(n) &&
	       cache_fresh(c, n->st_time) &&
	       S_ISREG(n->st.st_mode) && alloc >= size &&
	       alloc - size <= (64 << 10) + size / 64;
}

/*
 * SEEK_DATA / SEEK_HOLE of a file known to have no holes, from its cached
 * size: data anywhere before EOF, the hole at EOF, ENXIO at or past it (as
 * Linux answers).  grep asks this of every file larger than its buffer.
 * Returns false when the sandbox must be asked.
 */
static bool lseek_local(struct cache *c, struct cnode *n, off_t off,
			int whence, off_t *r)
{
	off_t size;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return false;
	if (off < 0) {
		/* What Linux answers; the agent would take it for EINVAL. */
		*r = sbx_error_set(SBX_ERR_REMOTE, -ENXIO, "negative offset");
		return true;
	}
	cache_lock(c);
	if (!known_dense(c, n)) {
		cache_unlock(c);
		return false;
	}
	size = n->st.st_size;
	cache_unlock(c);
	if (off >= size)
		*r = sbx_error_set(SBX_ERR_REMOTE, -ENXIO, "offset %lld is "
				   "past the end", (long long)off);
	else
		*r = whence == SEEK_DATA ? off : size;
	return true;
}

static off_t c_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		     int whence)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	struct cache_io io;
	off_t r;
	int rc;

	if (lseek_local(c, f->node, off, whence, &r))
		return r;
	if (!c->inner->ops->lseek)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS, "no lseek");
	rc = with_file(c, f, &io);
	if (rc < 0)
		return rc;
	r = c->inner->ops->lseek(c->inner, io.fh, off, whence);
	wb_io_end(c, &io);
	return r;
}

/* ---- directories ---------------------------------------------------------- */

static int c_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file **out)
{
	return list_opendir(CACHE(sb), CNODE(node), out);
}

static int c_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		     unsigned flags, sbx_dirent_cb cb, void *payload)
{
	return list_readdir(CACHE(sb), CFILE(dh), off, flags, cb, payload);
}

static int c_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	(void)sb;
	list_closedir(CFILE(dh));
	return 0;
}

/*
 * One file system under the whole sandbox: the root's answer serves every
 * node, and is reused for CACHE_STATFS_TTL seconds whatever the change
 * stream says (free space changes without events).
 */
static int c_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct statvfs *out)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc;

	(void)node;
	cache_lock(c);
	if (c->statfs_valid &&
	    cache_now() - c->statfs_time < CACHE_STATFS_TTL) {
		*out = c->statfs;
		cache_unlock(c);
		return 0;
	}
	cache_unlock(c);
	rc = cache_inner_node(c, "", &in);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->statfs(c->inner, in, out);
	c->inner->ops->forget(c->inner, in);
	if (rc == 0) {
		cache_lock(c);
		c->statfs = *out;
		c->statfs_time = cache_now();
		c->statfs_valid = true;
		cache_unlock(c);
	}
	return rc;
}

/* xattrs pass through; they are rare and not worth a cache. */
#define XATTR_CALL(c, node, inode, call) ON_INNER(c, CNODE(node), inode, call)

/*
 * security.* (SELinux labels, capabilities) and system.* (POSIX ACLs) of a
 * remote sandbox describe the remote machine's policy, not something this
 * machine can enforce; `ls -l` asks every file for them, which would cost
 * a round trip per file.  They are not exposed: not listed, and get and
 * set answer EOPNOTSUPP, as a file system without them does.  (ENODATA
 * would say "supported, none on this file", and `ls -l` would ask every
 * file again; after EOPNOTSUPP it stops asking for the device.)
 */
static bool foreign_xattr(const char *name)
{
	return strncmp(name, "security.", 9) == 0 ||
	       strncmp(name, "system.", 7) == 0;
}

/*
 * May an xattr call go through to the wrapped sandbox, which offers it
 * (`offered`)?  0, or -EOPNOTSUPP: for a foreign `name` (NULL: no such
 * check), or when the sandbox has no xattrs.
 */
static int xattr_pass(const char *name, bool offered)
{
	if (name && foreign_xattr(name))
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP,
				     "%s is not exposed for remote sandboxes",
				     name);
	if (!offered)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP, "no xattrs");
	return 0;
}

static ssize_t c_getxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			  const char *name, void *buf, size_t size)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc = xattr_pass(name, c->inner->ops->getxattr != NULL);

	if (rc < 0)
		return rc;
	return XATTR_CALL(c, node, in,
			  c->inner->ops->getxattr(c->inner, in, name, buf,
						  size));
}

/*
 * The names the sandbox lists, less the foreign ones (which getxattr would
 * refuse).  One call with room for any list (XATTR_LIST_MAX), so that the
 * size query (size 0) costs no second round trip and sees the filtered
 * length.
 */
static ssize_t c_listxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			   char *buf, size_t size)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	size_t len = 0, l;
	ssize_t n;
	char *all;

	if (!c->inner->ops->listxattr)
		return 0;
	all = sbx_xmalloc(XATTR_LIST_MAX);
	n = XATTR_CALL(c, node, in,
		       c->inner->ops->listxattr(c->inner, in, all,
						XATTR_LIST_MAX));
	for (ssize_t i = 0; i < n; i += (ssize_t)l + 1) {
		l = strnlen(all + i, (size_t)(n - i));
		if (foreign_xattr(all + i) || (ssize_t)l == n - i)
			continue; /* hidden, or not terminated */
		if (size && len + l + 1 > size) {
			free(all);
			return sbx_error_set(SBX_ERR_REMOTE, -ERANGE,
					     "xattr list larger than %zu bytes",
					     size);
		}
		if (size)
			memcpy(buf + len, all + i, l + 1);
		len += l + 1;
	}
	free(all);
	return n < 0 ? n : (ssize_t)len;
}

static int c_setxattr(struct sbx_sandbox *sb, struct sbx_node *node,
		      const char *name, const void *value, size_t size,
		      int flags)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc = xattr_pass(name, c->inner->ops->setxattr != NULL);

	if (rc < 0)
		return rc;
	return (int)XATTR_CALL(c, node, in,
			       c->inner->ops->setxattr(c->inner, in, name,
						       value, size, flags));
}

static int c_removexattr(struct sbx_sandbox *sb, struct sbx_node *node,
			 const char *name)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc = xattr_pass(NULL, c->inner->ops->removexattr != NULL);

	if (rc < 0)
		return rc;
	return (int)XATTR_CALL(c, node, in,
			       c->inner->ops->removexattr(c->inner, in, name));
}

static int c_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		       char **out)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;

	*out = NULL;
	return (int)XATTR_CALL(c, node, in,
			       c->inner->ops->node_path(c->inner, in, out));
}

static int c_exec_start(struct sbx_sandbox *sb,
			const struct sbx_exec_request *req,
			struct sbx_exec_handle **out)
{
	struct cache *c = CACHE(sb);

	if (!c->inner->ops->exec_start)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "this sandbox cannot run commands");
	touch_drain(c);
	return c->inner->ops->exec_start(c->inner, req, out);
}

/* ---- change stream, identity, sync ---------------------------------------- */

static int c_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			 void *payload)
{
	return change_watch_start(CACHE(sb), cb, payload);
}

static int c_watch_sync(struct sbx_sandbox *sb)
{
	return change_watch_sync(CACHE(sb));
}

static void c_watch_stop(struct sbx_sandbox *sb)
{
	change_watch_stop(CACHE(sb));
}

static bool c_watch_healthy(struct sbx_sandbox *sb)
{
	return cache_healthy(CACHE(sb));
}

/*
 * Does a name in removed node n's ring still name the file, so that
 * `fresh` (just found with attributes st) is that file under another name
 * and shares its kernel inode?  Yes when fresh is in the ring, or another
 * member is in the sandbox.  A member whose state is UNKNOWN (an event
 * about its name came, late: the event of a create without O_EXCL is not
 * expected) proves nothing when st says the file has one name and fresh
 * is not in the ring: then that name is gone and the sandbox gave the
 * dead file's number to another file, which must not take over the dead
 * file's kernel inode (its I/O would take the dead names' paths: ESTALE).
 * c->lock held.
 */
static bool ring_names_file(struct cnode *n, struct cnode *fresh,
			    const struct stat *st)
{
	bool sole = S_ISREG(st->st_mode) && st->st_nlink <= 1;

	/* n itself is removed, and not fresh (the caller's old != fresh). */
	tree_for_each_name(a, n)
		if (a == fresh ||
		    (!a->orphan && (a->slot == S_PRESENT ||
				    (a->slot == S_UNKNOWN && !sole))))
			return true;
	return false;
}

static bool c_attr_changed(struct sbx_sandbox *sb, struct sbx_node *node)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	bool named = false;

	cache_lock(c);
	tree_invalidate_file(n);
	/*
	 * What a name change says of a directory (its links are its
	 * subdirectories) comes from events in it.  A file with no name
	 * known to be there (all removed or moved in the sandbox, or
	 * unknown since an event), open here: asked again, either would say
	 * ENOENT or ESTALE to a descriptor's fstat() or a shell's `stat .`.
	 * The kernel's copy is better.
	 */
	if (!S_ISDIR(n->st.st_mode))
		tree_for_each_name(a, n)
			named |= a->slot == S_PRESENT;
	/* Not cache_unlock(): no disk jobs under the daemon's lock. */
	pthread_mutex_unlock(&c->lock);
	return named;
}

static bool c_node_stale(struct sbx_sandbox *sb, struct sbx_node *old,
			 struct sbx_node *fresh, const struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(old);
	bool stale = false;

	if (old == fresh)
		return false;
	cache_lock(c);
	if ((n->slot == S_ABSENT || n->orphan) && n->st.st_mode &&
	    (n->st.st_mode & S_IFMT) != (st->st_mode & S_IFMT)) {
		/*
		 * A removed file's number given to a directory (or the
		 * reverse): never the same object, whatever its other names
		 * look like (random tester, seeds 105502626 and 777222215:
		 * the kernel's inode of a new directory was a dead file's
		 * node, and mkdir or open(O_CREAT) in it said ESTALE or
		 * ENOENT).
		 */
		stale = true;
	} else if (n->slot == S_ABSENT || n->orphan) {
		stale = !ring_names_file(n, CNODE(fresh), st);
	} else if (S_ISDIR(st->st_mode) ||
		   (st->st_nlink <= 1 &&
		    !(n->st.st_ino == st->st_ino && tree_hidden_names(n)))) {
		/*
		 * One name only, and `fresh` was just found under it: what
		 * `old` knows (a slot kept PRESENT or UNKNOWN by a listing
		 * that raced the removal) is older than that.  Unless a
		 * hidden name of old's file is still in the sandbox: st's
		 * link count leaves it out, and while it holds the inode
		 * number no other file can have it, so `fresh` is another
		 * name of the same file (link(a, b), a replaced while open)
		 * and must share its kernel inode, or writes through one
		 * would not change the size the other shows.
		 */
		stale = true;
	}
	cache_unlock(c);
	return stale;
}

static int c_syncfs(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);
	int rc;

	/* The exec barrier: touches are changes the command must see. */
	touch_drain(c);
	rc = wb_push_all(c);
	/*
	 * A file whose push the sandbox refused keeps its bytes and its
	 * error for its owner (cache_wb.c); the command is not that file's
	 * to fail (stress test: a file renamed while its push was out made
	 * `sbx exec` fail before the command ran).  An outage fails it: the
	 * command would not see what was written.
	 */
	if (rc < 0 && (!cache_outage_error(rc) || rc == -ESTALE)) {
		sbx_warn("exec barrier: a file's buffered bytes were not "
			 "delivered (%s); its owner's fsync() or close() will "
			 "say so", sbx_error_last()->msg);
		sbx_error_clear();
		rc = 0;
	}
	if (rc == 0 && c->inner->ops->syncfs)
		rc = c->inner->ops->syncfs(c->inner);
	return rc;
}

static void c_free(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);

	if (!c)
		return;
	/* No more events: they would start the fresh walkers again. */
	change_watch_stop(c);
	/*
	 * Our threads next: each may be waiting in touch_drain() for the
	 * touch sender, whose state touch_stop() frees (review: a prefetch
	 * thread there at exit read freed memory).
	 */
	fresh_stop(c);
	ahead_stop(c);
	wb_stop_flusher(c);
	/* Deferred touches go out now (their failures are logged). */
	touch_stop(c);
	/* Files still open at exit: their writes go out now or never. */
	if (wb_push_all(c) < 0) {
		sbx_warn("writes still buffered at exit were not delivered: %s",
			 sbx_error_last()->msg);
		sbx_error_clear();
	}
	/* Hidden files of files still open (or whose removal failed); no
	 * other thread of ours is left to move names meanwhile. */
	silly_final_sweep(c);
	silly_fini(c);
	cache_lock(c);
	tree_free(c, &c->root);
	change_expect_clear(c);
	cache_unlock(c);
	free(c->disk_dir);
	free(c->base.session);
	free(c->base.workdir);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}

static const struct sbx_sandbox_ops cache_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.root = c_root,
	.lookup = c_lookup,
	.forget = c_forget,
	.getattr = c_getattr,
	.setattr = c_setattr,
	.readlink = c_readlink,
	.mknod = entry_mknod,
	.mkdir = entry_mkdir,
	.symlink = entry_symlink,
	.link = entry_link,
	.unlink = entry_unlink,
	.rmdir = entry_rmdir,
	.rename = entry_rename,
	.open = c_open,
	.create = c_create,
	.read = c_read,
	.write = c_write,
	.write_at = c_write_at,
	.flush = c_flush,
	.fsync = c_fsync,
	.release = c_release,
	.fallocate = c_fallocate,
	.lseek = c_lseek,
	.opendir = c_opendir,
	.readdir = c_readdir,
	.releasedir = c_releasedir,
	.statfs = c_statfs,
	.getxattr = c_getxattr,
	.listxattr = c_listxattr,
	.setxattr = c_setxattr,
	.removexattr = c_removexattr,
	.node_path = c_node_path,
	.exec_start = c_exec_start,
	.watch_start = c_watch_start,
	.watch_sync = c_watch_sync,
	.watch_stop = c_watch_stop,
	.watch_healthy = c_watch_healthy,
	.node_stale = c_node_stale,
	.attr_changed = c_attr_changed,
	.syncfs = c_syncfs,
	.free = c_free,
};

bool fs_cache_supported(const struct sbx_sandbox *sb)
{
	return sb->ops->node_at != NULL;
}

int fs_cache_new(struct sbx_sandbox **out, struct sbx_sandbox *inner,
		 const char *disk_dir)
{
	struct cache *c;
	struct stat st;
	int rc;

	*out = NULL;
	if (!fs_cache_supported(inner))
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "the cache needs a path-based sandbox");
	c = sbx_xcalloc(1, sizeof(*c));
	c->base.ops = &cache_ops;
	c->base.session = sbx_xstrdup(inner->session ? inner->session : "");
	c->base.workdir = sbx_xstrdup(inner->workdir ? inner->workdir : "");
	c->inner = inner;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	rc = cache_inner_stat(c, "", &st);
	if (rc < 0) {
		c_free(&c->base);
		return sbx_error_prefix(rc, "sandbox root");
	}
	tree_set_st(c, &c->root, &st);
	if (disk_dir) {
		if (sbx_paths_mkdir_p(disk_dir, 0700) == 0) {
			c->disk_dir = sbx_xstrdup(disk_dir);
			content_clear_dir(disk_dir);
		} else {
			sbx_warn("content cache stays in memory: %s",
				 sbx_error_last()->msg);
			sbx_error_clear();
		}
	}
	rc = wb_start_flusher(c);
	if (rc < 0) {
		c_free(&c->base);
		return rc;
	}
	*out = &c->base;
	return 0;
}
