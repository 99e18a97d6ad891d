/*
 * The change stream; see cache_i.h.
 *
 * The wrapped sandbox reports changes by path.  The cache marks what they
 * touch as unknown or stale and forwards them to the daemon keyed by
 * identity (st_dev/st_ino of the directory and the object), which is what
 * the daemon needs to invalidate the kernel's caches.
 *
 * Own changes.  An entry event that our own call through the mount causes
 * is expected before the call (the cache and the kernel already know the
 * change) and dropped when it arrives, instead of making the name UNKNOWN
 * and costing a round trip on the next lookup.  A failed call cancels its
 * expectation.  A call that succeeded still counts as a change for the
 * fetches that were out meanwhile (change_own_done): its event, which
 * would have told them, may come only after their answers.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "cache.h"
#include "cache_i.h"

struct expect {
	struct expect *next;
	char path[];
};

struct expect *change_expect(struct cache *c, const struct cnode *dir,
			     const char *name)
{
	struct expect *e;
	size_t len;
	char *p;

	/*
	 * Nor for our hidden names: their events are dropped before any
	 * expectation is looked at (apply_change), so one would stay for
	 * good, and each silly rename and hidden removal added one to the
	 * list every event is compared against.
	 */
	if (!__atomic_load_n(&c->watching, __ATOMIC_ACQUIRE) ||
	    tree_is_silly(name))
		return NULL;
	cache_lock(c);
	p = tree_child_path(dir, name);
	if (!p) {
		cache_unlock(c);
		return NULL;
	}
	len = strlen(p);
	e = sbx_xmalloc(sizeof(*e) + len + 1);
	memcpy(e->path, p, len + 1);
	free(p);
	e->next = c->expect;
	c->expect = e;
	cache_unlock(c);
	return e;
}

void change_expect_cancel(struct cache *c, struct expect *e)
{
	struct expect **pp;

	if (!e)
		return;
	cache_lock(c);
	for (pp = &c->expect; *pp && *pp != e; pp = &(*pp)->next)
		;
	if (*pp) {
		*pp = e->next;
		free(e);
	}
	cache_unlock(c);
}

/* c->lock held.  True (and consumed) when path was expected. */
static bool expect_take(struct cache *c, const char *path)
{
	struct expect **pp, *e;

	for (pp = &c->expect; (e = *pp); pp = &e->next)
		if (strcmp(e->path, path) == 0) {
			*pp = e->next;
			free(e);
			return true;
		}
	return false;
}

void change_own_done(struct cache *c)
{
	/*
	 * Our change counts as an event for fetches that were out across it
	 * (the `gen` of cache_unlock_path()): their answer may predate it.
	 * Without this, a listing sent before our create and answered after
	 * it (no event in between: the stream was down, or the event was
	 * late) recorded the new name as absent, and the late event, ours
	 * and expected, was dropped: ENOENT for a file the sandbox has, for
	 * as long as the stream stays healthy (mount-stale); a directory
	 * stat so answered was kept as valid, and a push's data could be
	 * hidden the same way.  Entry operations, pushes and touches call it.
	 */
	c->events++;
}

size_t fs_cache_expected_events(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);
	size_t n = 0;

	cache_lock(c);
	for (struct expect *e = c->expect; e; e = e->next)
		n++;
	cache_unlock(c);
	return n;
}

void change_expect_clear(struct cache *c)
{
	while (c->expect) {
		struct expect *e = c->expect;

		c->expect = e->next;
		free(e);
	}
}

/* Forward a change to the daemon with the identities it keys on. */
static void forward(struct cache *c, int kind, const struct stat *dir,
		    const char *name, const struct stat *obj)
{
	struct sbx_change ch;

	if (!c->cb)
		return;
	memset(&ch, 0, sizeof(ch));
	ch.kind = kind;
	if (dir) {
		ch.dir_dev = dir->st_dev;
		ch.dir_ino = dir->st_ino;
	}
	ch.name = name;
	if (obj) {
		ch.dev = obj->st_dev;
		ch.ino = obj->st_ino;
	}
	c->cb(&ch, c->cb_payload);
}

/* Is d the node n or below it? */
static bool is_within(const struct cnode *d, const struct cnode *n)
{
	for (; d; d = d->parent)
		if (d == n)
			return true;
	return false;
}

/*
 * The ENTRY event of `name` in `dir` says its object came from
 * ch->from_path: a rename in the sandbox (a log rotated, `git mv`, a
 * command's `mv`), or one through the mount whose answer an outage lost.
 * The old name's node moves to the new name, as entry_rename() moves it
 * for a rename of ours, so what the kernel holds of it -- an open
 * descriptor, a working directory, the files below a directory -- keeps
 * reaching the object by its new path.  Left behind (before 2026-12-07),
 * the node kept the old path: reads and pushes of a file open here said
 * ENOENT, and buffered bytes were lost at close.  What the name held
 * before is replaced, as a rename over it replaces it.  The event must
 * not say the new name holds another object (the agent sends its inode
 * number with `from`, when the name is still there): a RENAME_EXCHANGE
 * comes as two renames, and after the first the second one's old name
 * holds the other object; then the one the first half replaced (an
 * orphan since) goes to the old name, if it is the object the event
 * names (c->displaced).
 * The old node's own event came first and made its slot unknown, unless
 * it holds buffered writes; the new name stays unknown until a lookup
 * confirms it.  The old name is known free, and an answer about it sent
 * before the event is older than that (own_gen, as after our renames).
 * Not followed: a name the cache never had attributes for (nothing of it
 * is held), our hidden names, and anything while an exchange of ours is
 * out (entry_rename() swaps the two nodes by name when it ends).
 * c->lock held.
 */
static void follow_move_locked(struct cache *c, const struct sbx_change *ch,
			       struct cnode *dir, const char *name)
{
	struct cnode *o = tree_resolve(c, ch->from_path, false), *k;
	struct cnode *olddir, *gone, *d = c->displaced;
	char *oldname;
	bool exchange;

	/* At most the rename right after the one that displaced it. */
	c->displaced = NULL;
	exchange = d && ch->ino && d->orphan && d->st.st_ino == ch->ino &&
		   c->displaced_path &&
		   strcmp(c->displaced_path, ch->from_path) == 0;
	if (!o || o == &c->root || !o->parent || o->orphan || o->hidden ||
	    !o->st.st_ino || is_within(dir, o) || c->exchanges_out)
		return;
	/*
	 * The number says it is this node's object, even if a lookup
	 * answered before the rename made the old name present again (a
	 * churn test saw it).  No number: the name was gone again when the
	 * agent looked (moved on at once; its next event says where), which
	 * the second half of an exchange, both names present, is not; then
	 * the old name's own event must have made its slot unknown (unless
	 * it holds buffered writes, which keep it).
	 */
	if (ch->ino && o->st.st_ino != ch->ino) {
		k = tree_kid_find(dir, name);
		/*
		 * The second half of an exchange: the first left the name
		 * free and nothing has looked it up since (a lookup's node
		 * would be a second one of the object).
		 */
		if (exchange && !is_within(dir, d) &&
		    (!k || (k->slot != S_PRESENT && !k->st.st_ino))) {
			tree_unorphan(c, d, dir, name);
			sbx_debug("followed an exchange in the sandbox: %s -> %s",
				  ch->from_path, ch->path);
		}
		return;
	}
	if (!ch->ino && o->slot == S_PRESENT && !o->dirty)
		return;
	k = tree_kid_find(dir, name);
	if (k == o || (k && k->hidden))
		return;
	olddir = o->parent;
	oldname = sbx_xstrdup(o->name);
	(void)tree_rename(c, olddir, oldname, dir, name);
	if (!o->dirty)
		o->slot = S_UNKNOWN;
	olddir->st_valid = false;
	/*
	 * The old name is not known free, as after a rename of ours: the
	 * sandbox is ahead of its events, and the second half of an
	 * exchange (or a create) may have filled it already.  Made absent
	 * (before 2026-12-08), it said ENOENT for as long as the stream
	 * stayed healthy: a lookup of it after this event, and before one
	 * about it, was answered from here (directories exchanged in the
	 * sandbox, the event of the half that filled the name applied
	 * first).  Its own event made the kernel drop it; the next lookup
	 * asks, and tree_rename()'s own_gen keeps older answers out.
	 */
	gone = tree_kid_find(olddir, oldname);
	if (gone && !tree_file_dirty(gone) && !gone->hidden)
		gone->slot = S_UNKNOWN;
	free(oldname);
	/* Replaced: the first half of an exchange, maybe. */
	if (k && k->orphan && k->st.st_ino && !k->in_ring && !k->hidden) {
		c->displaced = k;
		free(c->displaced_path);
		c->displaced_path = sbx_xstrdup(ch->path);
	}
	sbx_debug("followed a rename in the sandbox: %s -> %s",
		  ch->from_path, ch->path);
}

static void apply_change(struct cache *c, const struct sbx_change *ch)
{
	struct stat objst, dirst;
	struct cnode *n, *dir;
	const char *name = NULL, *base;
	bool have_obj = false, have_dir = false;
	char *dirpath = NULL;

	if (ch->kind == SBX_CHANGE_OVERFLOW || !ch->path) {
		cache_lock(c);
		c->events++;
		c->foreign++;
		change_expect_clear(c);
		tree_forget_all(c, &c->root);
		cache_unlock(c);
		forward(c, SBX_CHANGE_OVERFLOW, NULL, NULL, NULL);
		return;
	}
	base = strrchr(ch->path, '/');
	/* Our own hidden names: nothing the kernel knows of. */
	if (tree_is_silly(base ? base + 1 : ch->path))
		return;
	cache_lock(c);
	c->events++;
	if (ch->kind == SBX_CHANGE_ENTRY && expect_take(c, ch->path)) {
		cache_unlock(c);
		return;
	}
	n = tree_resolve(c, ch->path, false);
	if (n && ch->kind == SBX_CHANGE_ATTR &&
	    n->touch_own_until > cache_now()) {
		/* Our deferred touch's echo (cache_touch.c): known here. */
		cache_unlock(c);
		return;
	}
	c->foreign++;
	if (ch->kind == SBX_CHANGE_ENTRY)
		fresh_note(c, ch->path);
	if (n)
		wb_node_changed(n); /* even dirty: its local image is old */
	if (n && !n->dirty) {
		/* Its other names' link counts may have changed too. */
		tree_invalidate_file(n);
		free(n->link);
		n->link = NULL;
		if (ch->kind == SBX_CHANGE_DATA)
			content_drop(c, n);
		objst = n->st;
		have_obj = n->st.st_ino != 0;
	}
	if (ch->kind == SBX_CHANGE_ENTRY) {
		dirpath = base ? sbx_xstrndup(ch->path,
					      (size_t)(base - ch->path))
			       : sbx_xstrdup("");
		name = base ? base + 1 : ch->path;
		dir = tree_resolve(c, dirpath, false);
		if (dir) {
			if (ch->from_path)
				follow_move_locked(c, ch, dir, name);
			/*
			 * The name may be new to us: record it as UNKNOWN so a
			 * complete listing neither answers "absent" for it nor
			 * is served without asking again.
			 */
			struct cnode *k = tree_kid_get(dir, name);

			/* A removed name of a hard-linked file gets a new
			 * node (tree_name_unsure): such events are common,
			 * as the create of a name without O_EXCL is not
			 * expected, and its event, when late, lands after
			 * the name's removal. */
			if (!k->dirty && tree_name_unsure(c, k))
				(void)tree_kid_get(dir, name);
			dir->st_valid = false;
			dirst = dir->st;
			have_dir = true;
		}
	}
	cache_unlock(c);
	if (ch->kind == SBX_CHANGE_ENTRY) {
		/*
		 * The objects the name held (our node of it) and holds now
		 * (the provider's word, ch->ino: a file a link was made to,
		 * whose other names' link count changed): the daemon has
		 * our nodes of them drop their attributes (c_attr_changed)
		 * and the kernel its copy.  A directory we do not know: the
		 * kernel knows nothing in it, but may know the objects by
		 * other names.
		 */
		struct stat nowst;

		memset(&nowst, 0, sizeof(nowst));
		nowst.st_dev = ch->dev;
		nowst.st_ino = ch->ino;
		if (have_dir || have_obj || ch->ino)
			forward(c, SBX_CHANGE_ENTRY, have_dir ? &dirst : NULL,
				name,
				ch->ino ? &nowst : have_obj ? &objst : NULL);
		if (ch->ino && have_obj && objst.st_ino != ch->ino)
			forward(c, SBX_CHANGE_ENTRY, NULL, NULL, &objst);
	} else if (have_obj) {
		forward(c, ch->kind, NULL, NULL, &objst);
	}
	free(dirpath);
}

static void on_change(const struct sbx_change *ch, void *payload)
{
	apply_change(payload, ch);
}

int change_watch_start(struct cache *c, sbx_change_cb cb, void *payload)
{
	int rc;

	if (!c->inner->ops->watch_start)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "no change stream");
	c->cb = cb;
	c->cb_payload = payload;
	rc = c->inner->ops->watch_start(c->inner, on_change, c);
	if (rc == 0)
		__atomic_store_n(&c->watching, true, __ATOMIC_RELEASE);
	return rc;
}

void change_notify_attr(struct cache *c, const struct stat *st)
{
	/* After watch_stop the daemon may be tearing down what cb uses. */
	if (__atomic_load_n(&c->watching, __ATOMIC_ACQUIRE))
		forward(c, SBX_CHANGE_ATTR, NULL, NULL, st);
}

int change_watch_sync(struct cache *c)
{
	int rc;

	/* Their events are among those to wait for. */
	touch_drain(c);
	rc = c->inner->ops->watch_sync(c->inner);

	if (rc < 0) {
		/* Could not catch up: trust nothing cached. */
		cache_lock(c);
		tree_forget_all(c, &c->root);
		cache_unlock(c);
	}
	return rc;
}

void change_watch_stop(struct cache *c)
{
	/* Touches answered so far go out while the daemon can hear of a
	 * failure (change_notify_attr). */
	touch_drain(c);
	if (__atomic_load_n(&c->watching, __ATOMIC_ACQUIRE))
		c->inner->ops->watch_stop(c->inner);
	__atomic_store_n(&c->watching, false, __ATOMIC_RELEASE);
}
