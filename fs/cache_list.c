/*
 * Prefetch and directory listings; see cache_i.h.
 *
 * The first time a directory is looked into, one bulk call brings the
 * metadata of its whole subtree and the content of its small files.  A
 * complete, fresh listing answers readdir and negative lookups without a
 * round trip; otherwise one readdirplus request refreshes it.  Results of a
 * request during which a change event arrived (c->events moved) are served
 * but not kept as complete: they may predate the change.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

struct bulk_ctx {
	struct cache *c;
	unsigned long gen; /* c->events when the walk started */
	unsigned long unhides; /* c->unhides_all then */
	bool dropped;      /* a record came after a change: not kept */
};

static int bulk_item(const struct sbx_bulk_item *it, void *payload)
{
	struct bulk_ctx *ctx = payload;
	struct cache *c = ctx->c;
	struct sbx_hashmap_iter kit;
	struct cnode *n, *k;
	const char *base = strrchr(it->path, '/');

	/*
	 * Our hidden names are the last close's to remove and never listed:
	 * a record of one (its content, say) would bring its node back as
	 * present, even once removed, and its link would count as hidden
	 * in the sandbox for good.
	 */
	if (tree_is_silly(base ? base + 1 : it->path))
		return 0;
	cache_lock(c);
	/* After a change during the walk, the rest may predate it: keep
	 * nothing (lookups then ask one by one). */
	if (ctx->gen != c->events) {
		ctx->dropped = true;
		cache_unlock(c);
		return 0;
	}
	n = tree_resolve(c, it->path, true);
	/*
	 * The path holds another object than the node knew.  The tree still
	 * holds the name as present: the sandbox renamed, exchanged or
	 * replaced it and the event is on its way, so the record is not the
	 * node's (a directory's entries would become its listing, see
	 * relist_once) and waits for the walk's next try.  Else the event
	 * came and nothing has looked the name up since: the record is its
	 * new object's, as a lookup's answer would be (tree_name_st).
	 */
	if (n && n->parent && tree_other_object(c, n, it->st.st_ino)) {
		if (n->slot == S_PRESENT || n->hidden) {
			ctx->dropped = true;
			cache_unlock(c);
			return 0;
		}
		char *name = sbx_xstrdup(n->name); /* (n may go) */

		n = tree_name_st(c, n->parent, name, &it->st);
		free(name);
	}
	if (n && !tree_file_dirty(n)) {
		tree_set_st(c, n, &it->st);
		/*
		 * A hidden name's removal sends no event we keep, but changes
		 * a link count: one taken across it is not kept (random
		 * tester, seed 55013542: a walk's count of 2 for 1, taken
		 * while the last close removed a hidden name, was kept).
		 */
		if (tree_count_unsettled(c, n, ctx->unhides))
			n->st_valid = false;
		if (it->kind == SBX_BULK_DIR) {
			/* Names not listed are gone; listed ones present.
			 * Not our hidden names: listings never show them,
			 * and the last close removes them (cache_silly.c). */
			tree_for_each_kid(k, kit, n)
				if (!k->dirty && !k->hidden)
					k->slot = S_ABSENT;
			for (size_t i = 0; i < it->nentries; i++) {
				if (tree_is_silly(it->entries[i].name))
					continue;
				k = tree_kid_get(n, it->entries[i].name);
				if (tree_file_dirty(k)) {
					k->slot = S_PRESENT;
					continue;
				}
				k = tree_name_st(c, n, it->entries[i].name,
						 &it->entries[i].st);
				if (tree_count_unsettled(c, k, ctx->unhides))
					k->st_valid = false;
			}
			n->complete = true;
			n->prefetched = true;
			n->list_time = cache_now();
		} else if (it->kind == SBX_BULK_FILE &&
			   it->len == (size_t)it->st.st_size) {
			content_store(c, n, it->data, it->len, &it->st);
		}
	}
	cache_unlock(c);
	return 0;
}

int list_walk(struct cache *c, const char *path,
	      const struct sbx_bulk_opts *o)
{
	struct bulk_ctx ctx = {c, 0, 0, false};
	int rc;

	cache_lock(c);
	ctx.gen = c->events;
	ctx.unhides = c->unhides_all;
	cache_unlock(c);
	touch_drain(c); /* the walk must see the touches */
	rc = c->inner->ops->bulk(c->inner, path, o, bulk_item, &ctx);
	if (rc < 0)
		return rc;
	return ctx.dropped ? 1 : 0;
}

void list_prefetch(struct cache *c, struct cnode *dir)
{
	struct sbx_bulk_opts o = {PREFETCH_MAX_FILE, PREFETCH_MAX_TOTAL, -1};
	char *path;
	int rc;

	if (!c->inner->ops->bulk || dir->prefetched)
		return;
	while (dir->prefetching)
		pthread_cond_wait(&c->cond, &c->lock);
	if (dir->prefetched)
		return;
	path = tree_path_of(dir);
	if (!path)
		return;
	dir->prefetching = true;
	cache_unlock(c);
	rc = list_walk(c, path, &o);
	cache_lock(c);
	if (rc < 0) {
		sbx_debug("prefetch of '%s' failed: %s", path,
			  sbx_error_last()->msg);
		sbx_error_clear();
	}
	/* Even on failure: do not retry the walk on every lookup. */
	dir->prefetched = true;
	dir->prefetching = false;
	pthread_cond_broadcast(&c->cond);
	free(path);
}

/* ---- listings ------------------------------------------------------------ */

struct list_ctx {
	struct cache *c;
	struct cnode *dir;
	bool other_dir;    /* "." said the path holds another directory */
	unsigned long gen; /* c->events when the request went out */
	unsigned long unhides; /* c->unhides_all then */
	struct cnode **seen;
	size_t nseen, cap;
};

static int list_entry(const char *name, const struct stat *st,
		      struct sbx_node *node, off_t next, void *payload)
{
	struct list_ctx *l = payload;
	struct cnode *k;
	bool ours, raced;

	(void)next;
	if (node)
		l->c->inner->ops->forget(l->c->inner, node);
	/*
	 * "." comes first, with the number of the directory read.  Another
	 * number than the tree's: the path holds another directory now (the
	 * sandbox renamed or exchanged it, and the event is on its way).
	 * Its entries are not this node's: nothing of them is recorded.
	 */
	if (strcmp(name, ".") == 0) {
		cache_lock(l->c);
		l->other_dir = tree_other_object(l->c, l->dir, st->st_ino);
		cache_unlock(l->c);
		if (l->other_dir)
			return 1;
	}
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
	    tree_is_silly(name))
		return 0;
	cache_lock(l->c);
	k = tree_kid_get(l->dir, name);
	/* The name changed through us after the listing was taken. */
	ours = k->own_gen > l->gen && !tree_file_dirty(k);
	raced = l->gen != l->c->events;
	if (ours && k->slot == S_ABSENT) {
		/*
		 * Removed: not brought back (as PRESENT it would be a dead
		 * name alive -- for a hard-linked file, its surviving name
		 * then got a kernel inode of its own, and descriptors open
		 * through the two saw different sizes: random tester, seed
		 * 970431669), nor served.
		 */
		cache_unlock(l->c);
		return 0;
	}
	if (ours && k->st.st_ino && k->st.st_ino != st->st_ino) {
		/* Another object than the listing's took the name (a create
		 * or rename through us): served as the tree knows it, not
		 * detached for the older answer. */
	} else if (!tree_file_dirty(k)) {
		k = tree_name_st(l->c, l->dir, name, st);
		/*
		 * Raced with a change, or, for a hard-linked file, with the
		 * removal of a hidden name (of any file: not told apart), so
		 * that its link count may or may not count the name (random
		 * tester, seed 51744238: readdirplus handed the kernel 1 link
		 * for 2, the file's last close removing a hidden name while
		 * the listing was out).  Not kept, nor handed to the kernel
		 * as attributes to cache (snapshot_listing).
		 */
		if (raced || tree_count_unsettled(l->c, k, l->unhides))
			k->st_valid = false;
	} else {
		k->slot = S_PRESENT;
	}
	if (l->nseen == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 64;
		l->seen = sbx_xrealloc(l->seen, l->cap * sizeof(*l->seen));
	}
	l->seen[l->nseen++] = k;
	cache_unlock(l->c);
	return 0;
}

/*
 * List dir through the wrapped sandbox (one request with attributes), by
 * the path *before (set here; the caller frees it), taken when the tree
 * had applied *moves renames.
 */
static int relist_once(struct cache *c, struct cnode *dir, char **before,
		       unsigned long *moves)
{
	struct list_ctx l = {.c = c, .dir = dir};
	struct sbx_hashmap_iter kit;
	struct cnode *k;
	struct sbx_node *in;
	struct sbx_file *dh;
	int rc;

	cache_lock(c);
	l.unhides = c->unhides_all;
	*moves = c->moves;
	*before = cache_unlock_path(c, tree_path_of(dir), &l.gen, "directory");
	if (!*before)
		return -ESTALE;
	rc = cache_inner_node(c, *before, &in);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->opendir(c->inner, in, &dh);
	if (rc == 0) {
		rc = c->inner->ops->readdir(c->inner, dh, 0, SBX_READDIR_PLUS,
					    list_entry, &l);
		(void)c->inner->ops->releasedir(c->inner, dh);
	}
	c->inner->ops->forget(c->inner, in);
	if (rc == 0 && l.other_dir)
		rc = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				   "listing of '%s': the path names another "
				   "directory now (renamed in the sandbox)",
				   *before);
	cache_lock(c);
	if (rc == 0) {
		/* Everything not listed is absent now (unknown if raced),
		 * but for our hidden names, which no listing shows (see
		 * bulk_item). */
		bool raced = l.gen != c->events;

		tree_for_each_kid(k, kit, dir) {
			/* A name changed through us since the listing was
			 * taken is as that change left it. */
			if (k->dirty || k->hidden || k->own_gen > l.gen)
				continue;
			if (raced)
				(void)tree_name_unsure(c, k);
			else
				k->slot = S_ABSENT;
		}
		for (size_t i = 0; i < l.nseen; i++)
			if (!l.seen[i]->orphan && l.seen[i]->own_gen <= l.gen)
				l.seen[i]->slot = S_PRESENT;
		/* Raced with a change: serve this listing, cache none of it. */
		dir->complete = !raced;
		dir->list_time = cache_now();
	}
	cache_unlock(c);
	free(l.seen);
	return rc;
}

/*
 * relist_once(), again where the directory went when its path named
 * another directory (or none): the sandbox renamed it, and the change
 * stream says where (wb_io_again).  Listed by the old path, a directory
 * exchanged in the sandbox got the other one's entries, which the kernel
 * kept as its listing for good (CI, test_remote.py
 * test_directories_exchanged_in_the_sandbox, once under load).
 */
static int relist(struct cache *c, struct cnode *dir)
{
	for (int tries = 0;; tries++) {
		unsigned long moves;
		char *before = NULL;
		int rc = relist_once(c, dir, &before, &moves);

		if (rc == 0) {
			free(before);
			return 0;
		}
		if (!wb_io_again(c, dir, before, moves, rc, tries))
			return rc;
	}
}

/*
 * A listing can be served from the cache when it is complete and fresh,
 * and every entry's attributes are valid: readdirplus hands them to the
 * kernel, which would otherwise cache stale sizes and link counts.  One
 * relist refreshes them all in a single request.  c->lock held.
 */
static bool listing_usable(struct cache *c, struct cnode *n)
{
	struct sbx_hashmap_iter it;
	struct cnode *k;

	if (!n->complete || !cache_fresh(c, n->list_time))
		return false;
	tree_for_each_kid(k, it, n) {
		if (k->slot == S_UNKNOWN)
			return false;
		if (k->slot == S_PRESENT && !k->hidden &&
		    (!k->st_valid || tree_file_dirty(k) ||
		     !cache_fresh(c, k->st_time)))
			return false;
	}
	return true;
}

/* Drop a directory handle's snapshot. */
static void snapshot_free(struct cfile *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->names[i]);
	free(d->names);
	free(d->sts);
	free(d->nodes);
	d->names = NULL;
	d->sts = NULL;
	d->nodes = NULL;
	d->n = 0;
}

/* Fill a directory handle's snapshot from n's listing.  c->lock held. */
static void snapshot_listing(struct cnode *n, struct cfile *d)
{
	size_t cap = sbx_hashmap_count(&n->kids) + 1, i = 0;
	struct sbx_hashmap_iter it;
	struct cnode *k;

	snapshot_free(d);
	d->names = sbx_xcalloc(cap, sizeof(*d->names));
	d->sts = sbx_xcalloc(cap, sizeof(*d->sts));
	d->nodes = sbx_xcalloc(cap, sizeof(*d->nodes));
	tree_for_each_kid(k, it, n) {
		if (k->slot != S_PRESENT || k->hidden || i >= cap)
			continue;
		d->names[i] = sbx_xstrdup(k->name);
		d->sts[i] = k->st;
		d->sts[i].st_nlink = tree_visible_nlink(k, k->st.st_nlink);
		/*
		 * readdirplus hands the kernel the attributes of entries with
		 * a node, which it keeps: not those the tree does not hold
		 * as true (a listing that raced a change), nor a link count
		 * taken apart while a hidden name of the file is being
		 * removed.  The kernel looks those up when it needs them.
		 */
		d->nodes[i] = k->st_valid && !tree_file_unhiding(k) ? k : NULL;
		i++;
	}
	d->n = i;
	d->dir_ino = n->st.st_ino;
	d->snapped = true;
}

/*
 * Make n's listing usable (pushing what readdirplus would report sizes
 * of, relisting when not complete and fresh) and, with d, take d's
 * snapshot of it.
 */
static int list_take(struct cache *c, struct cnode *n, struct cfile *d)
{
	int rc;

	/*
	 * readdirplus hands the kernel every entry's size: push first.  A
	 * push that fails keeps its bytes and its error for the file's owner
	 * (cache_wb.c); the listing is not the file's to fail (random
	 * tester, seed 388538268: opendir said ENOENT, passing on a failed
	 * push of another directory's file).
	 */
	if (wb_push_dir(c, n) < 0) {
		sbx_debug("listing: a push before it failed: %s",
			  sbx_error_last()->msg);
		sbx_error_clear();
	}
	cache_lock(c);
	if (!n->prefetched && !n->complete)
		list_prefetch(c, n);
	if (!listing_usable(c, n)) {
		cache_unlock(c);
		rc = relist(c, n);
		if (rc < 0)
			return rc;
		cache_lock(c);
	}
	if (d)
		snapshot_listing(n, d);
	cache_unlock(c);
	return 0;
}

/*
 * opendir checks the directory can be listed now (its errors are
 * opendir's); the snapshot is taken by the first READDIR at offset 0,
 * and again by each later one (rewinddir).  Taken at opendir (before
 * 2026-12-07), it was older than what the kernel stamps its listing
 * cache with when it starts filling it (at the first READDIR): names
 * made through the mount in between were missing from every later `ls`
 * until the directory changed again (`git add -A` missed a new file),
 * and names removed in between came back as dentries the kernel kept
 * for 600 s (a create of one without O_EXCL said ENOENT); stress test,
 * `test_fileops.py::test_listing_opened_before_a_change_shows_it`.
 */
int list_opendir(struct cache *c, struct cnode *n, struct sbx_file **out)
{
	struct cfile *d;
	int rc;

	*out = NULL;
	rc = list_take(c, n, NULL);
	if (rc < 0)
		return rc;
	d = wb_file_new(n, O_RDONLY);
	d->is_dir = true;
	*out = (struct sbx_file *)d;
	return 0;
}

/*
 * Entry i of d's snapshot as it stands now: between two READDIRs of one
 * listing, a name may have been removed or renamed through the mount,
 * and its node's attributes changed.  The name is still listed (POSIX
 * leaves a name removed since the rewind unspecified) but without a node
 * when the tree no longer holds it under that name as true, so the
 * kernel makes no dentry of it (it kept one for 600 s: a create of the
 * removed name said ENOENT); else with the node's attributes of now.
 * c->lock held.
 */
static struct cnode *entry_now(struct cfile *d, size_t i, struct stat *st)
{
	struct cnode *k = d->nodes[i];

	*st = d->sts[i];
	if (!k)
		return NULL;
	if (k->orphan || k->parent != d->node || k->hidden ||
	    k->slot != S_PRESENT || !k->name ||
	    strcmp(k->name, d->names[i]) != 0 || !k->st_valid ||
	    tree_file_dirty(k) || tree_file_unhiding(k))
		return NULL;
	*st = k->st;
	st->st_nlink = tree_visible_nlink(k, k->st.st_nlink);
	return k;
}

/* Entries checked against the tree per lock hold. */
#define LIST_BATCH 64

int list_readdir(struct cache *c, struct cfile *d, off_t off, unsigned flags,
		 sbx_dirent_cb cb, void *payload)
{
	bool plus = flags & SBX_READDIR_PLUS;
	struct stat sts[LIST_BATCH];
	struct cnode *nodes[LIST_BATCH];

	if (off == 0 || !d->snapped) {
		int rc = list_take(c, d->node, d);

		if (rc < 0)
			return rc;
	}
	/* Cookies: 1 ".", 2 "..", then 3 + index. */
	for (off_t i = off; i < (off_t)d->n + 2;) {
		off_t first = i, last = i;

		if (i >= 2 && plus) {
			/* The next entries as they stand now. */
			cache_lock(c);
			for (; last < (off_t)d->n + 2 &&
			       last - first < LIST_BATCH;
			     last++)
				nodes[last - first] = entry_now(
					d, (size_t)(last - 2),
					&sts[last - first]);
			cache_unlock(c);
		} else {
			last = i + 1;
		}
		for (; i < last; i++) {
			struct stat st;
			struct sbx_node *node = NULL;
			const char *name;

			memset(&st, 0, sizeof(st));
			if (i < 2) {
				name = i == 0 ? "." : "..";
				st.st_mode = S_IFDIR;
				st.st_ino = i == 0 ? d->dir_ino : 1;
			} else if (plus) {
				name = d->names[i - 2];
				st = sts[i - first];
				node = (struct sbx_node *)nodes[i - first];
			} else {
				name = d->names[i - 2];
				st = d->sts[i - 2];
			}
			if (cb(name, &st, node, i + 1, payload) != 0)
				return 0;
		}
	}
	return 0;
}

void list_closedir(struct cfile *d)
{
	snapshot_free(d);
	pthread_mutex_destroy(&d->wlock);
	free(d);
}
