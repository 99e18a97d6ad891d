/*
 * Unlink of open files; see cache_i.h.
 *
 * The sandbox cannot keep a file alive for descriptors open on this
 * machine, so a file that is open here is renamed to a hidden name instead
 * of being removed (NFS's "silly rename") and removed at its last RELEASE.
 * Hidden names are never listed, their events never forwarded, and their
 * link does not count in the link count the user sees.
 *
 * Open counts: `opens` counts open files (RELEASE not seen), `active` those
 * whose FLUSH has not been seen since their last use.  An unlink of a file
 * that is open but not active waits a little for the RELEASE that usually
 * follows a close, rather than leave a hidden file behind.  A FLUSH alone
 * does not mean the file is closed: a fork that exec's closes its copies of
 * the parent's descriptors, and the parent's stay open.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbx/hashmap.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

/* Wait up to RELEASE_WAIT_MS for the last RELEASE of n's file.  c->lock
 * held. */
static void wait_released(struct cache *c, struct cnode *n)
{
	struct timespec until;

	cache_deadline_in(&until, CLOCK_REALTIME, RELEASE_WAIT_MS);
	while (tree_file_opens(n, NULL) &&
	       pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
		;
}

/* An error that says the request may have been done in the sandbox, its
 * answer lost (the connection cut or timed out after it was sent). */
static bool outcome_unknown(int rc)
{
	return rc == -EIO || rc == -ETIMEDOUT || rc == -ECONNRESET ||
	       rc == -ECONNABORTED || rc == -EPIPE;
}

/* An error that the sandbox answering again may clear: an outage's.  A
 * refusal (EACCES, EROFS...) is not retried by the flusher: it would be
 * asked again every SILLY_RETRY_S for the daemon's life. */
bool cache_outage_error(int rc)
{
	return outcome_unknown(rc) || rc == -ENOTCONN ||
	       rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
	       rc == -ENETUNREACH || rc == -EAGAIN || rc == -ESTALE;
}

/* A removal failed: silly_retry_locked() tries again later.  c->lock
 * held. */
static void silly_left_locked(struct cache *c)
{
	c->silly_left = true;
	c->silly_retry_at = cache_now() + SILLY_RETRY_S;
}

/* A hidden name still in the sandbox, not being moved (its mover removes
 * it).  c->lock held. */
static bool removable(const struct cnode *a)
{
	return a->hidden && a->slot != S_ABSENT && a->parent && !a->moving;
}

/* n, or the first other name of n's file, for which `is` holds; NULL when
 * none does.  c->lock held. */
static struct cnode *name_where(struct cnode *n,
				bool (*is)(const struct cnode *))
{
	struct cnode *a = n;

	do {
		if (is(a))
			return a;
		a = a->in_ring ? a->ring_next : n;
	} while (a != n);
	return NULL;
}

/*
 * Remove hidden name `name` of sandbox directory `dir` ("" for the root;
 * NULL: the directory is gone).  No change event is expected: those of
 * hidden names are dropped (change_expect).  No lock held.  0, or a
 * negative errno with the error set (-ENOENT: it is not there).
 */
static int unlink_in_sandbox(struct cache *c, const char *dir,
			     const char *name)
{
	struct sbx_node *in;
	int rc;

	if (!dir)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "directory gone");
	rc = cache_inner_node(c, dir, &in);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->unlink(c->inner, in, name);
	if (rc < 0) {
		/* (The forget may clear the error's message.) */
		struct sbx_error failed = *sbx_error_last();

		c->inner->ops->forget(c->inner, in);
		return failed.code == rc ? sbx_error_restore(&failed) : rc;
	}
	c->inner->ops->forget(c->inner, in);
	return rc;
}

/*
 * Remove hidden name `name` of directory node d, whose path *dir was taken
 * under c->lock (NULL: d has none).  ENOENT may only say that a rename of
 * d, or of a directory above it, through the mount was under way: the
 * hidden file is then where d is now (random tester, seed 391619360: it
 * stayed under the directory's new name for good, and an rmdir there
 * said ENOTEMPTY).  ENOTDIR says the same when a file was made under
 * d's old name meanwhile (random tester, seed 607803788).  So on either
 * wait for the renames under way (at most RENAME_WAIT_MS) and try d's
 * path again if it changed; *dir is the last path tried.  No lock held.
 */
static int unlink_where_it_is(struct cache *c, const struct cnode *d,
			      char **dir, const char *name)
{
	for (int tries = 0;; tries++) {
		int rc = unlink_in_sandbox(c, *dir, name);
		char *now;

		if ((rc != -ENOENT && rc != -ENOTDIR) || !*dir || tries == 3)
			return rc;
		cache_lock(c);
		cache_wait_renames_locked(c);
		now = tree_path_of(d);
		cache_unlock(c);
		if (!now || strcmp(now, *dir) == 0) {
			free(now);
			return rc;
		}
		sbx_debug("'%s' became '%s' while its hidden name %s was "
			  "being removed: again there", *dir, now, name);
		sbx_error_clear();
		free(*dir);
		*dir = now;
	}
}

/*
 * Remove a silly-renamed file once nothing has it open.  c->lock held; it
 * is dropped for the removal.  False when the removal failed (the hidden
 * name stays, to be removed later).
 */
static bool unlink_hidden_locked(struct cache *c, struct cnode *n)
{
	struct cnode *parent;
	char *dir, *name;
	bool kept = false, retry = false;
	int rc;

	if (tree_file_opens(n, NULL) || !removable(n))
		return true;
	/* (Its own parent stays: removable() is false while it is out.) */
	parent = n->parent;
	dir = tree_path(parent);
	name = sbx_xstrdup(n->name);
	n->slot = S_ABSENT;
	n->unhides++; /* out: cnode_unhiding() */
	c->unhides_all++;
	cache_unlock(c);
	sbx_debug("removing hidden %s/%s", dir ? dir : "?", name);
	rc = unlink_where_it_is(c, parent, &dir, name);
	if (rc == -ENOENT) {
		/* Removed in the sandbox meanwhile (rm -r of its directory,
		 * say): what we were to do is done. */
		sbx_debug("%s/%s was already gone", dir ? dir : "?", name);
		sbx_error_clear();
	} else if (rc < 0) {
		/*
		 * The sandbox could not be reached, most likely: the hidden
		 * name is still there.  Forgotten, it stayed for good -- an
		 * invisible file that counted as a visible link and made an
		 * rmdir of its directory say ENOTEMPTY (random tester's
		 * fault runs).  Kept, it still counts as hidden, an rmdir
		 * moves it away (silly_evict), and the next last close of
		 * the file or that move tries again.
		 */
		sbx_warn("could not remove %s/%s: %s; kept hidden, to be "
			 "removed at the file's next close, its directory's "
			 "removal%s", dir ? dir : "?", name,
			 sbx_error_last()->msg,
			 cache_outage_error(rc) ? ", or once the sandbox answers"
					  : "");
		sbx_error_clear();
		kept = dir != NULL; /* not when its directory is gone */
		retry = kept && cache_outage_error(rc);
	}
	free(dir);
	free(name);
	cache_lock(c);
	if (kept && n->slot == S_ABSENT && n->hidden && n->parent) {
		n->slot = S_PRESENT;
		if (retry)
			silly_left_locked(c);
	}
	n->unhides++; /* done */
	c->unhides_all++;
	/* The file's other names have one link less (or, on failure, the
	 * count is the sandbox's to say). */
	tree_invalidate_file(n);
	/* An rmdir may be waiting for its directory to empty. */
	pthread_cond_broadcast(&c->cond);
	return !kept;
}

/*
 * The last open file of n's file is gone: remove every hidden name of it
 * (n's own, or that of another name the open counted on n).  c->lock
 * held; dropped for each removal, so the ring is searched afresh after
 * each (a removed name is S_ABSENT and not found again).
 */
static void unlink_hidden_file_locked(struct cache *c, struct cnode *n)
{
	while (!tree_file_opens(n, NULL)) {
		struct cnode *h = name_where(n, removable);

		/* A failed removal is not tried again at once: the sandbox
		 * is most likely out of reach. */
		if (!h || !unlink_hidden_locked(c, h))
			return;
	}
}

static void ghost_free(struct ghost *g)
{
	free(g->name);
	free(g);
}

/* Is `owner` a name of n's file?  c->lock held. */
static bool names_file(const struct cnode *owner, const struct cnode *n)
{
	tree_for_each_name(a, n)
		if (a == owner)
			return true;
	return false;
}

/* Claim the first ghost of c->ghosts that is not being removed and for
 * which `pick` says yes (busy, tried in this round); NULL when none.
 * c->lock held. */
static struct ghost *ghost_claim(struct cache *c,
				 bool (*pick)(const struct cache *,
					      const struct ghost *,
					      const void *),
				 const void *arg)
{
	for (struct ghost *g = c->ghosts; g; g = g->next)
		if (!g->busy && pick(c, g, arg)) {
			g->busy = true;
			g->round = c->ghost_round;
			return g;
		}
	return NULL;
}

/* A claimed ghost is gone from the sandbox: off the list.  c->lock
 * held. */
static void ghost_drop(struct cache *c, struct ghost *g)
{
	for (struct ghost **pp = &c->ghosts; *pp; pp = &(*pp)->next)
		if (*pp == g) {
			*pp = g->next;
			break;
		}
	ghost_free(g);
}

/*
 * Remove ghost g (claimed: busy, still listed) from the sandbox, where its
 * directory is now.  0 when it is gone (removed, or never made: ENOENT;
 * its directory replaced or gone), or a negative errno.  While it is out,
 * a link count of its file fetched across it is unsettled (the owner's
 * ghost_outs, odd meanwhile, counts in tree_file_unhides() but does not
 * make the owner's own name look alive).  c->lock held; dropped for the
 * removal.
 */
static int ghost_remove_locked(struct cache *c, const struct ghost *g)
{
	char *dir = tree_path_of(g->dir);
	int rc;

	g->owner->ghost_outs++;
	c->unhides_all++;
	cache_unlock(c);
	rc = dir ? unlink_where_it_is(c, g->dir, &dir, g->name) : -ENOENT;
	if (rc == 0)
		sbx_info("removed %s%s%s, left by a hidden rename whose "
			 "answer was lost", dir, *dir ? "/" : "", g->name);
	else if (rc != -ENOENT)
		sbx_warn("hidden name %s%s%s may be left in the sandbox: %s",
			 dir, *dir ? "/" : "", g->name,
			 sbx_error_last()->msg);
	else if (!dir)
		sbx_debug("%s: its directory is gone, so is it", g->name);
	sbx_error_clear();
	free(dir);
	cache_lock(c);
	g->owner->ghost_outs++; /* done */
	c->unhides_all++;
	/* One link less, maybe: ask the sandbox.  And whoever waits for a
	 * removal to settle (count_unsettled, silly_evict) looks again. */
	tree_invalidate_file(g->owner);
	pthread_cond_broadcast(&c->cond);
	return rc == -ENOENT ? 0 : rc;
}

/* Remove claimed ghost g; it stays listed when that failed (retried by
 * the flusher after an outage's error).  False then.  c->lock held;
 * dropped. */
static bool ghost_sweep_one_locked(struct cache *c, struct ghost *g)
{
	int rc = ghost_remove_locked(c, g);

	g->busy = false;
	if (rc < 0) {
		if (cache_outage_error(rc))
			silly_left_locked(c);
		return false;
	}
	ghost_drop(c, g);
	return true;
}

static bool ghost_of_file(const struct cache *c, const struct ghost *g,
			  const void *n)
{
	(void)c;
	return names_file(g->owner, n);
}

/*
 * Remove the hidden names that silly renames with a lost answer may have
 * made for n's file (c->ghosts), once nothing has the file open: the
 * user's unlink said EIO, but if the sandbox did it the file is out of
 * every visible name, and left there it counted as a link of the file's
 * other names and kept its directory from being removed (ENOTEMPTY;
 * random tester's fault runs).  ENOENT: it was not done.  Another error
 * keeps the ghost for the next try.  c->lock held; dropped for each
 * removal.
 */
static void silly_sweep_locked(struct cache *c, struct cnode *n)
{
	struct ghost *g;

	while (!tree_file_opens(n, NULL) &&
	       (g = ghost_claim(c, ghost_of_file, n)))
		if (!ghost_sweep_one_locked(c, g))
			return;
}

static bool ghost_in_dir_closed(const struct cache *c, const struct ghost *g,
				const void *d)
{
	(void)c;
	return g->dir == d && !tree_file_opens(g->owner, NULL);
}

/* A ghost in d is being removed (its removal's end broadcasts c->cond).
 * c->lock held. */
static bool ghost_busy_in(const struct cache *c, const struct cnode *d)
{
	for (const struct ghost *g = c->ghosts; g; g = g->next)
		if (g->busy && g->dir == d)
			return true;
	return false;
}

/*
 * Sweep a ghost in directory d whose file nothing has open.  True when one
 * was removed (or found not there): the caller looks again, as the lock
 * was dropped.  False when there was none, or its removal failed (it is
 * kept; the sandbox is most likely out of reach).  c->lock held.
 */
static bool sweep_dir_locked(struct cache *c, struct cnode *d)
{
	struct ghost *g = ghost_claim(c, ghost_in_dir_closed, d);

	return g && ghost_sweep_one_locked(c, g);
}

int silly_rename(struct cache *c, struct cnode *dir, const char *name)
{
	struct expect *e1, *e2;
	struct sbx_node *in;
	struct cnode *k, *gone;
	char *hidden, *dp;
	unsigned opens = 0, active = 0;
	int rc;

	cache_lock(c);
	k = tree_kid_find(dir, name);
	if (k)
		opens = tree_file_opens(k, &active);
	if (opens && !active) {
		wait_released(c, k);
		opens = tree_file_opens(k, &active);
	}
	if (!k || k->slot == S_ABSENT || !opens || k->hidden ||
	    (k->st.st_mode && !S_ISREG(k->st.st_mode))) {
		cache_unlock(c);
		return 0;
	}
	hidden = sbx_xasprintf(SILLY_PREFIX "%llu.%lu",
			       (unsigned long long)k->st.st_ino,
			       ++c->silly_seq);
	dp = tree_path_of(dir);
	cache_unlock(c);
	if (!dp) {
		free(hidden);
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "directory was replaced");
	}
	e1 = change_expect(c, dir, name);
	e2 = change_expect(c, dir, hidden);
	rc = cache_inner_node(c, dp, &in);
	free(dp);
	if (rc == 0) {
		rc = c->inner->ops->rename(c->inner, in, name, in, hidden,
					   RENAME_NOREPLACE);
		c->inner->ops->forget(c->inner, in);
	}
	if (rc < 0) {
		change_expect_cancel(c, e1);
		change_expect_cancel(c, e2);
		if (outcome_unknown(rc)) {
			/* The sandbox may have done it: see to it once
			 * nothing has the file open (maybe now: the last
			 * close may have come while the rename was out). */
			struct ghost *g = sbx_xcalloc(1, sizeof(*g));

			g->dir = dir;
			g->owner = k;
			g->name = sbx_xstrdup(hidden);
			cache_lock(c);
			g->next = c->ghosts;
			c->ghosts = g;
			tree_invalidate_file(k);
			silly_sweep_locked(c, k);
			cache_unlock(c);
			sbx_error_set(SBX_ERR_REMOTE, rc,
				      "could not move '%s' out of the way of "
				      "its removal: %s", name, strerror(-rc));
		}
		free(hidden);
		if (rc != -ENOENT)
			return rc;
		/*
		 * Not in the sandbox: removed behind us, and the opens
		 * counted are the file's through another name (a hard
		 * link).  Nothing here to keep alive; the removal or rename
		 * that asked goes on and meets the sandbox's answer itself
		 * (random tester, seed 983871424: a rename onto such a name
		 * said ENOENT).
		 */
		sbx_debug("%s is not in the sandbox: nothing to hide", name);
		sbx_error_clear();
		return 0;
	}
	sbx_debug("hid %s (inode %llu, %u open) as %s", name,
		  (unsigned long long)k->st.st_ino, opens, hidden);
	cache_lock(c);
	change_own_done(c);
	tree_kid_move(k, dir, hidden);
	k->hidden = true;
	gone = tree_kid_get(dir, name);
	gone->slot = S_ABSENT;
	gone->own_gen = c->events;
	dir->st_valid = false;
	/* Its link no longer counts, for this name and any other. */
	tree_invalidate_file(k);
	/* Closed meanwhile: nothing will remove it later. */
	(void)unlink_hidden_locked(c, k);
	cache_unlock(c);
	free(hidden);
	return 1;
}

void silly_drop_open(struct cache *c, struct cfile *f)
{
	struct cnode *n = f->node;

	cache_lock(c);
	if (n->opens)
		n->opens--;
	if (!f->flushed && n->active)
		n->active--;
	f->flushed = true;
	if (!n->opens)
		pthread_cond_broadcast(&c->cond);
	unlink_hidden_file_locked(c, n);
	silly_sweep_locked(c, n);
	cache_unlock(c);
}

/*
 * A local disk removes a directory whose files are all unlinked, open or
 * not; here their hidden names keep it non-empty (rmdir, or a rename over
 * it: ENOTEMPTY, which `rm -r` of a build directory with a file still open
 * in it would hit).  They move to the root, where the last close finds
 * them as before: the root is never removed, and the open files' I/O
 * takes each node's current path.
 */
void silly_evict(struct cache *c, struct cnode *dir, const char *name)
{
	struct timespec until;

	cache_deadline_in(&until, CLOCK_REALTIME, RELEASE_WAIT_MS);
	for (;;) {
		struct cnode *d, *h = NULL, *k;
		struct sbx_hashmap_iter it;
		struct sbx_node *from = NULL, *to = NULL;
		struct expect *e1, *e2;
		char *dp, *hname;
		bool removing = false, others = false;
		int rc;

		cache_lock(c);
		d = tree_kid_find(dir, name);
		/* Hidden names a lost answer may have left in it first
		 * (the lock is dropped: d is looked up again after). */
		if (d && d->slot != S_ABSENT && !d->orphan && d != &c->root &&
		    sweep_dir_locked(c, d)) {
			cache_unlock(c);
			continue;
		}
		/* A ghost in it being removed (a last close just before). */
		if (d && ghost_busy_in(c, d))
			removing = true;
		if (d && d->slot != S_ABSENT && !d->orphan && d != &c->root)
			tree_for_each_kid(k, it, d) {
				removing |= k->hidden && cnode_unhiding(k);
				/* A name the user sees: the removal will say
				 * ENOTEMPTY anyway, move nothing. */
				others |= !k->hidden && k->slot == S_PRESENT;
				if (!h && removable(k) &&
				    !tree_kid_find(&c->root, k->name))
					h = k;
			}
		if (others) {
			cache_unlock(c);
			return;
		}
		if (!h && removing &&
		    pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0) {
			/* A last close is removing one (a close right
			 * before the rmdir): look again once it is done. */
			cache_unlock(c);
			continue;
		}
		dp = h ? tree_path(d) : NULL;
		if (!dp) {
			cache_unlock(c);
			return;
		}
		h->moving = true;
		hname = sbx_xstrdup(h->name);
		cache_unlock(c);

		e1 = change_expect(c, d, hname);
		e2 = change_expect(c, &c->root, hname);
		rc = cache_inner_node(c, dp, &from);
		if (rc == 0)
			rc = cache_inner_node(c, "", &to);
		if (rc == 0)
			rc = c->inner->ops->rename(c->inner, from, hname, to,
						   hname, RENAME_NOREPLACE);
		if (from)
			c->inner->ops->forget(c->inner, from);
		if (to)
			c->inner->ops->forget(c->inner, to);
		if (rc < 0) {
			change_expect_cancel(c, e1);
			change_expect_cancel(c, e2);
			sbx_debug("could not move %s/%s to the root: %s", dp,
				  hname, sbx_error_last()->msg);
			sbx_error_clear();
		} else {
			sbx_debug("moved %s/%s to the root", dp, hname);
		}
		cache_lock(c);
		h->moving = false;
		if (rc == 0) {
			change_own_done(c);
			tree_kid_move(h, &c->root, hname);
			d->st_valid = false;
			c->root.st_valid = false;
		} else if (rc == -ENOENT) {
			/*
			 * Not there (removed behind the mount, or a name the
			 * cache kept counting): nothing to move, and the
			 * other hidden names still are (random tester,
			 * seed 136255067: giving up at the first one made a
			 * rename over the directory say ENOTEMPTY).  Marked
			 * gone, it is not picked again.
			 */
			h->slot = S_ABSENT;
			tree_invalidate_file(h);
		}
		/* Closed meanwhile: nothing else will remove it. */
		(void)unlink_hidden_locked(c, h);
		cache_unlock(c);
		free(dp);
		free(hname);
		if (rc < 0 && rc != -ENOENT)
			return;
	}
}

/* Append to *v the nodes under d (d itself too) that are hidden names
 * to remove.  c->lock held. */
static void collect_left(struct cnode *d, struct cnode ***v, size_t *n,
			 size_t *cap)
{
	struct sbx_hashmap_iter it;
	struct cnode *k;

	if (removable(d)) {
		if (*n == *cap) {
			*cap = *cap ? *cap * 2 : 16;
			*v = sbx_xrealloc(*v, *cap * sizeof(**v));
		}
		(*v)[(*n)++] = d;
	}
	tree_for_each_kid(k, it, d)
		collect_left(k, v, n, cap);
}

/* A ghost of a file nothing has open, not tried in this round. */
static bool ghost_closed_untried(const struct cache *c,
				 const struct ghost *g, const void *unused)
{
	(void)unused;
	return g->round != c->ghost_round && !tree_file_opens(g->owner, NULL);
}

void silly_retry_locked(struct cache *c)
{
	struct cnode **v = NULL;
	size_t n = 0, cap = 0, tried = 0;

	if (!c->silly_left || cache_now() < c->silly_retry_at ||
	    !cache_healthy(c))
		return;
	/* Found again below; a failure sets it again. */
	c->silly_left = false;
	/* Ghosts of files nothing has open (their last close failed), each
	 * once: a refused one stays listed, not to be taken again now... */
	c->ghost_round++;
	while (!c->silly_left && !c->stopping) {
		struct ghost *g = ghost_claim(c, ghost_closed_untried, NULL);

		if (!g)
			break;
		tried++;
		(void)ghost_sweep_one_locked(c, g);
	}
	/* ...then kept hidden names.  Nodes are never freed while the cache
	 * runs (tree_free), so the list stays good while the lock is dropped
	 * for each removal. */
	if (!c->silly_left && !c->stopping)
		collect_left(&c->root, &v, &n, &cap);
	for (size_t i = 0; i < n && !c->silly_left && !c->stopping; i++) {
		if (tree_file_opens(v[i], NULL))
			continue; /* its last close sees to it */
		tried++;
		(void)unlink_hidden_locked(c, v[i]);
	}
	if (tried)
		sbx_debug("retried %zu hidden name(s) left by an outage: %s",
			  tried, c->silly_left ? "some are still there"
					       : "done");
	free(v);
}

void silly_final_sweep(struct cache *c)
{
	struct cnode **v = NULL;
	size_t n = 0, cap = 0, removed = 0;
	struct ghost *g;
	int rc = 0;

	cache_lock(c);
	/* The names lost renames may have made, of open files too (a
	 * refusal is this name's alone)... */
	while (!cache_outage_error(rc) && (g = c->ghosts)) {
		g->busy = true;
		rc = ghost_remove_locked(c, g);
		ghost_drop(c, g);
	}
	/* ...and every hidden name. */
	if (!cache_outage_error(rc))
		collect_left(&c->root, &v, &n, &cap);
	for (size_t i = 0; i < n; i++) {
		struct cnode *k = v[i];
		char *dir, *name;

		if (!removable(k))
			continue;
		dir = tree_path(k->parent);
		name = sbx_xstrdup(k->name);
		k->slot = S_ABSENT;
		cache_unlock(c);
		/* (No path: its directory was replaced, so it is gone.) */
		rc = dir ? unlink_in_sandbox(c, dir, name) : -ENOENT;
		if (rc == 0)
			removed++;
		else if (rc != -ENOENT)
			sbx_warn("hidden file %s/%s is left in the sandbox: %s",
				 dir, name, sbx_error_last()->msg);
		sbx_error_clear();
		free(dir);
		free(name);
		cache_lock(c);
		/* The sandbox out of reach: do not wait for each of the
		 * others in turn.  (A refusal is this name's alone.) */
		if (cache_outage_error(rc))
			break;
	}
	cache_unlock(c);
	if (removed)
		sbx_info("removed %zu hidden file(s) of files removed while "
			 "open", removed);
	free(v);
}

void silly_fini(struct cache *c)
{
	while (c->ghosts)
		ghost_drop(c, c->ghosts);
}
