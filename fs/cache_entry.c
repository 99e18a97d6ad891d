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

/*
 * After an inner call created `name` in dir with attributes st: record the
 * entry, and note that dir itself changed.
 */
struct cnode *entry_created(struct cache *c, struct cnode *dir,
			    const char *name, const struct stat *st)
{
	struct cnode *k;

	cache_lock(c);
	change_own_done(c);
	k = tree_name_st(c, dir, name, st);
	content_drop(c, k);
	dir->st_valid = false;
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
	int rc = cache_check_name(newname);

	if (rc < 0)
		return rc;
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
	/* Both names now lead to one file: the first one joins the ring
	 * (tree_set_st), so its inode still works once it is removed. */
	if (from->st.st_ino == st->st_ino) /* kept while st is stale */
		tree_refresh_st(c, from, st);
	else
		tree_invalidate_file(from);
	cache_unlock(c);
	return rc;
}

/* After a name vanished from dir through us. */
static void removed(struct cache *c, struct cnode *dir, const char *name)
{
	struct cnode *k;

	cache_lock(c);
	change_own_done(c);
	k = tree_kid_find(dir, name);
	if (k) {
		k->slot = S_ABSENT;
		/* The file's other names have one link less. */
		tree_invalidate_file(k);
		content_drop(c, k);
	}
	dir->st_valid = false;
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
	}
	rc = EXPECTING(c, dir, name,
		       ON_INNER(c, dir, in,
				is_dir ? c->inner->ops->rmdir(c->inner, in,
							       name)
				       : c->inner->ops->unlink(c->inner, in,
								name)));
	if (rc == 0)
		removed(c, dir, name);
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

int entry_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		 const char *name, struct sbx_node *newparent,
		 const char *newname, unsigned flags)
{
	struct cache *c = CACHE(sb);
	struct cnode *from = CNODE(parent), *to = CNODE(newparent), *a, *b;
	struct sbx_node *fi = NULL, *ti = NULL;
	char *fp, *tp;
	int rc;

	rc = cache_check_name(name);
	if (rc == 0)
		rc = cache_check_name(newname);
	if (rc < 0)
		return rc;
	if (!(flags & RENAME_EXCHANGE)) {
		bool keep;

		/* A replaced file that is open here must stay readable. */
		cache_lock(c);
		a = tree_kid_find(from, name);
		b = tree_kid_find(to, newname);
		keep = b && a != b && !(flags & RENAME_NOREPLACE);
		cache_unlock(c);
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
		rc = c->inner->ops->rename(c->inner, fi, name, ti, newname,
					   flags);
		if (rc < 0) {
			change_expect_cancel(c, e1);
			change_expect_cancel(c, e2);
		}
	}
	if (fi)
		c->inner->ops->forget(c->inner, fi);
	if (ti)
		c->inner->ops->forget(c->inner, ti);
	if (rc < 0)
		return rc;

	cache_lock(c);
	change_own_done(c);
	a = tree_kid_find(from, name);
	b = tree_kid_find(to, newname);
	from->st_valid = false;
	to->st_valid = false;
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
		if (b && b != a) {
			/* The replaced object has no path any more. */
			tree_orphan(c, b);
			tree_invalidate_file(b);
		}
		if (a) {
			tree_kid_move(a, to, newname);
			a->st_valid = false; /* ctime changed */
		}
		/* The old name is now known to be free. */
		tree_kid_get(from, name)->slot = S_ABSENT;
	}
	cache_unlock(c);
	return 0;
}
