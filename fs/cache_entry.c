/*
 * The caching layer: operations on directory entries (mknod, mkdir,
 * symlink, link, unlink, rmdir, rename); see cache_i.h.  Each calls the
 * wrapped sandbox with no lock held, expecting the entry event it will
 * cause, then records the result in the tree.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

/* ---- attributes on the side (cache_i.h) ---------------------------------- */

static __thread struct side_call tl_side;

struct side_call *side_tl(void)
{
	return &tl_side;
}

void side_begin(struct cache *c, struct side_call *sc, struct cnode *dir,
		struct cnode *dir2)
{
	memset(sc, 0, sizeof(*sc));
	sc->dirs[0] = dir;
	sc->dirs[1] = dir2;
	cache_lock(c);
	for (int i = 0; i < 2; i++)
		sc->dir_time[i] = sc->dirs[i] && sc->dirs[i]->st_valid
					  ? sc->dirs[i]->st_time
					  : -1;
	sc->events = c->events;
	sc->foreign = c->foreign;
	sc->gen = ++c->side_gen;
	sc->alone = c->side_busy++ == 0;
	cache_unlock(c);
	sbx_side_arm(&sc->side);
}

void side_end(struct cache *c, struct side_call *sc)
{
	sbx_side_arm(NULL);
	cache_lock(c);
	c->side_busy--;
	sc->ended = true;
	cache_unlock(c);
}

bool side_take_locked(struct cache *c, struct side_call *sc)
{
	bool ok = sc->ended && sc->alone && c->side_gen == sc->gen &&
		  (sc->dirs[0] || c->events == sc->events);

	sc->ended = false;
	return ok;
}

/*
 * c->lock held: directory dir (sc->dirs[i]) changed with an entry in it.
 * Use the attributes the call handed back (`has`, `st`) when it may (see
 * struct side_call), else let the next getattr fetch them.
 */
static void dir_changed(struct cache *c, struct side_call *sc, bool ok,
			int i, struct cnode *dir, bool has,
			const struct stat *st)
{
	if (ok && has && sc->dirs[i] == dir && dir->slot == S_PRESENT &&
	    dir->st_valid &&
	    dir->st_time == sc->dir_time[i] && dir->st.st_ino == st->st_ino &&
	    S_ISDIR(st->st_mode))
		tree_refresh_st(c, dir, st);
	else
		dir->st_valid = false;
}

/*
 * After an inner call created `name` in dir with attributes st: record the
 * entry, and note that dir itself changed (with the attributes the call
 * handed back on the side when it ran under EXPECTING).
 */
struct cnode *entry_created(struct cache *c, struct cnode *dir,
			    const char *name, const struct stat *st)
{
	struct side_call *sc = side_tl();
	struct cnode *k;
	bool ok;

	cache_lock(c);
	ok = side_take_locked(c, sc);
	change_own_done(c);
	k = tree_name_st(c, dir, name, st);
	k->own_gen = c->events;
	content_drop(c, k);
	dir_changed(c, sc, ok, 0, dir, sc->side.has_dir, &sc->side.dir);
	cache_unlock(c);
	return k;
}

static int finish_create(struct cache *c, struct cnode *dir, const char *name,
			 struct sbx_node *made, struct stat *st,
			 struct sbx_node **out, int rc)
{
	if (rc < 0)
		return rc;
	c->inner->ops->forget(c->inner, made);
	*out = (struct sbx_node *)entry_created(c, dir, name, st);
	return 0;
}

/* One of the wrapped sandbox's calls that make an entry. */
struct make {
	enum { MAKE_NOD, MAKE_DIR, MAKE_SYMLINK } kind;
	mode_t mode;
	dev_t rdev;
	const char *target;
};

static int inner_make(struct cache *c, struct sbx_node *in, const char *name,
		      const struct make *m, struct sbx_node **made,
		      struct stat *st)
{
	switch (m->kind) {
	case MAKE_NOD:
		return c->inner->ops->mknod(c->inner, in, name, m->mode,
					    m->rdev, made, st);
	case MAKE_DIR:
		return c->inner->ops->mkdir(c->inner, in, name, m->mode, made,
					    st);
	default:
		return c->inner->ops->symlink(c->inner, m->target, in, name,
					      made, st);
	}
}

/* Make `name` in dir through the wrapped sandbox and record it. */
static int make(struct cache *c, struct cnode *dir, const char *name,
		const struct make *m, struct sbx_node **out, struct stat *st)
{
	struct sbx_node *in, *made = NULL;
	int rc = cache_check_name(name);

	if (rc < 0)
		return rc;
	rc = EXPECTING(c, dir, name,
		       ON_INNER(c, dir, in,
				inner_make(c, in, name, m, &made, st)));
	rc = finish_create(c, dir, name, made, st, out, rc);
	if (rc == 0 && m->kind != MAKE_NOD) {
		struct cnode *k = CNODE(*out);

		cache_lock(c);
		if (m->kind == MAKE_DIR) {
			/* A new directory is empty: its listing is known. */
			k->complete = true;
			k->prefetched = true;
			k->list_time = cache_now();
		} else {
			free(k->link);
			k->link = sbx_xstrdup(m->target);
		}
		cache_unlock(c);
	}
	return rc;
}

int entry_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		const char *name, mode_t mode, dev_t rdev,
		struct sbx_node **out, struct stat *st)
{
	struct make m = {.kind = MAKE_NOD, .mode = mode, .rdev = rdev};

	return make(CACHE(sb), CNODE(parent), name, &m, out, st);
}

int entry_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		const char *name, mode_t mode, struct sbx_node **out,
		struct stat *st)
{
	struct make m = {.kind = MAKE_DIR, .mode = mode};

	return make(CACHE(sb), CNODE(parent), name, &m, out, st);
}

int entry_symlink(struct sbx_sandbox *sb, const char *target,
		  struct sbx_node *parent, const char *name,
		  struct sbx_node **out, struct stat *st)
{
	struct make m = {.kind = MAKE_SYMLINK, .target = target};

	return make(CACHE(sb), CNODE(parent), name, &m, out, st);
}

int entry_link(struct sbx_sandbox *sb, struct sbx_node *node,
	       struct sbx_node *newparent, const char *newname,
	       struct sbx_node **out, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *from = CNODE(node);
	struct sbx_node *in, *src, *made = NULL;
	unsigned long unhides_all;
	int rc = cache_check_name(newname);

	if (rc < 0)
		return rc;
	/* Its bytes and a setattr held with them first: the new name's
	 * attributes (the link's answer) must be the file's. */
	rc = wb_push_node(c, from);
	if (rc < 0)
		return rc;
	unhides_all = cache_unhides_now(c);
	rc = cache_inner_node_of(c, from, &src);
	if (rc < 0)
		return rc;
	rc = EXPECTING(c, CNODE(newparent), newname,
		       ON_INNER(c, CNODE(newparent), in,
				c->inner->ops->link(c->inner, src, in, newname,
						    &made, st)));
	c->inner->ops->forget(c->inner, src);
	if (rc < 0)
		return cache_stale_or(c, from, rc);
	rc = finish_create(c, CNODE(newparent), newname, made, st, out, rc);
	cache_lock(c);
	/*
	 * Every other name of the file has one link more (and a new
	 * ctime): a count cached for one of them said one link too few
	 * (random tester, seed 450131391: fstat said 2 links, a local disk
	 * 3).  Then both names lead to one file: the first one joins the
	 * ring (tree_set_st), so its inode still works once it is removed.
	 */
	tree_invalidate_file(from);
	if (from->st.st_ino == st->st_ino) /* kept while st is stale */
		tree_refresh_st(c, from, st);
	if (rc == 0)
		tree_refresh_st(c, CNODE(*out), st);
	cache_unlock(c);
	/* The kernel takes the answer's link count for the file: hidden
	 * names of it (another name removed while open) do not count. */
	if (rc == 0)
		cache_settle_nlink(sb, CNODE(*out), unhides_all, st);
	return rc;
}

/* After a name vanished from dir through us (rmdir: is_dir). */
static void removed(struct cache *c, struct cnode *dir, const char *name,
		    bool is_dir)
{
	struct side_call *sc = side_tl();
	struct cnode *k;
	bool ok;

	cache_lock(c);
	ok = side_take_locked(c, sc);
	change_own_done(c);
	k = tree_kid_find(dir, name);
	if (k) {
		k->slot = S_ABSENT;
		k->own_gen = c->events;
		if (is_dir)
			tree_mark_gone_dir(k, true);
		/* The file's other names have one link less. */
		tree_invalidate_file(k);
		content_drop(c, k);
	}
	dir_changed(c, sc, ok, 0, dir, sc->side.has_dir, &sc->side.dir);
	cache_unlock(c);
}

/* Remove `name` from dir through the wrapped sandbox and record it. */
static int remove_entry(struct cache *c, struct cnode *dir, const char *name,
			bool is_dir)
{
	struct sbx_node *in;
	int rc = cache_check_name(name);

	if (rc < 0)
		return rc;
	if (!is_dir) {
		rc = silly_rename(c, dir, name);
		if (rc != 0)
			return rc < 0 ? rc : 0;
	} else {
		/* Files unlinked while open must not keep it non-empty. */
		silly_evict(c, dir, name);
	}
	rc = EXPECTING(c, dir, name,
		       ON_INNER(c, dir, in,
				is_dir ? c->inner->ops->rmdir(c->inner, in,
							       name)
				       : c->inner->ops->unlink(c->inner, in,
								name)));
	if (rc == 0)
		removed(c, dir, name, is_dir);
	return rc;
}

int entry_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		 const char *name)
{
	return remove_entry(CACHE(sb), CNODE(parent), name, false);
}

int entry_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		const char *name)
{
	return remove_entry(CACHE(sb), CNODE(parent), name, true);
}

void cache_wait_renames_locked(struct cache *c)
{
	struct timespec until;

	cache_deadline_in(&until, CLOCK_REALTIME, RENAME_WAIT_MS);
	while (c->renames_out &&
	       pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
		;
}

/* A rename counted in c->renames_out is over, the tree as it left it. */
static void renames_out_done(struct cache *c, unsigned flags)
{
	cache_lock(c);
	c->renames_out--;
	if (flags & RENAME_EXCHANGE)
		c->exchanges_out--;
	pthread_cond_broadcast(&c->cond);
	cache_unlock(c);
}

int entry_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		 const char *name, struct sbx_node *newparent,
		 const char *newname, unsigned flags)
{
	struct cache *c = CACHE(sb);
	struct cnode *from = CNODE(parent), *to = CNODE(newparent), *a, *b;
	struct sbx_node *fi = NULL, *ti = NULL;
	struct side_call sc = { .ended = false };
	char *fp, *tp;
	bool ok, counted = false;
	int rc;

	rc = cache_check_name(name);
	if (rc == 0)
		rc = cache_check_name(newname);
	if (rc < 0)
		return rc;
	if (!(flags & RENAME_EXCHANGE)) {
		bool keep, dir;

		/* A replaced file that is open here must stay readable. */
		cache_lock(c);
		a = tree_kid_find(from, name);
		b = tree_kid_find(to, newname);
		keep = b && a != b && !(flags & RENAME_NOREPLACE);
		dir = keep && S_ISDIR(b->st.st_mode);
		cache_unlock(c);
		/* A replaced directory must be empty: files unlinked while
		 * open must not keep it so. */
		if (dir)
			silly_evict(c, to, newname);
		if (keep) {
			rc = silly_rename(c, to, newname);
			if (rc < 0)
				return rc;
		}
	}
	cache_lock(c);
	fp = tree_path_of(from);
	tp = tree_path_of(to);
	cache_unlock(c);
	if (!fp || !tp) {
		free(fp);
		free(tp);
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "directory was replaced");
	}
	rc = cache_inner_node(c, fp, &fi);
	if (rc == 0)
		rc = cache_inner_node(c, tp, &ti);
	free(fp);
	free(tp);
	if (rc == 0) {
		struct expect *e1 = NULL, *e2 = NULL;

		/* An exchange's events are not worth predicting. */
		if (!(flags & RENAME_EXCHANGE)) {
			e1 = change_expect(c, from, name);
			e2 = change_expect(c, to, newname);
		}
		side_begin(c, &sc, from, to != from ? to : NULL);
		cache_lock(c);
		c->renames_out++;
		if (flags & RENAME_EXCHANGE)
			c->exchanges_out++;
		cache_unlock(c);
		counted = true;
		rc = c->inner->ops->rename(c->inner, fi, name, ti, newname,
					   flags);
		side_end(c, &sc);
		if (rc < 0) {
			change_expect_cancel(c, e1);
			change_expect_cancel(c, e2);
		}
	}
	if (fi)
		c->inner->ops->forget(c->inner, fi);
	if (ti)
		c->inner->ops->forget(c->inner, ti);
	if (rc < 0) {
		if (counted)
			renames_out_done(c, flags);
		return rc;
	}

	cache_lock(c);
	a = tree_kid_find(from, name);
	b = tree_kid_find(to, newname);
	ok = side_take_locked(c, &sc);
	change_own_done(c);
	dir_changed(c, &sc, ok, 0, from, sc.side.has_dir, &sc.side.dir);
	if (to != from)
		dir_changed(c, &sc, ok, 1, to, sc.side.has_newdir,
			    &sc.side.newdir);
	if (flags & RENAME_EXCHANGE) {
		if (a && b && a != b) {
			tree_kid_unlink(from, a);
			tree_kid_unlink(to, b);
			free(a->name);
			free(b->name);
			a->name = sbx_xstrdup(newname);
			b->name = sbx_xstrdup(name);
			tree_kid_link(to, a);
			tree_kid_link(from, b);
		} else {
			if (a)
				a->slot = S_UNKNOWN;
			if (b)
				b->slot = S_UNKNOWN;
		}
	} else {
		a = tree_rename(c, from, name, to, newname);
		if (a) {
			a->own_gen = c->events;
			/* The batch's stat of it is kept when no change but our
			 * own came in while the call was out (struct
			 * side_call). */
			if (ok && sc.side.has_obj && c->foreign == sc.foreign &&
			    a->slot == S_PRESENT &&
			    a->st.st_ino == sc.side.obj.st_ino &&
			    (a->st.st_mode & S_IFMT) ==
				    (sc.side.obj.st_mode & S_IFMT))
				tree_refresh_st(c, a, &sc.side.obj);
		}
	}
	cache_unlock(c);
	renames_out_done(c, flags);
	return 0;
}
