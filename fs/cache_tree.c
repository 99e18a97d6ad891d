/*
 * The node tree of the caching layer; see cache_i.h.
 *
 * Every path the daemon has seen is a `struct cnode` in a tree mirroring the
 * sandbox (parent + name; the path is derived, so a rename through the mount
 * moves a whole subtree at once).  A child slot is PRESENT (attributes
 * cached, maybe stale), ABSENT (a negative entry) or UNKNOWN (a change was
 * reported: ask again).  A directory whose listing is `complete` answers
 * lookups of names it does not hold as ENOENT without asking.
 *
 * Hard links.  The daemon gives a multi-link file one kernel inode, but the
 * tree has a node per name.  The names of one file are tied in a ring so
 * that an operation on the inode can go through any name still present, and
 * so that a change of one name's link count reaches the others.  Membership
 * is explicit (in_ring, ring_ino): joining twice, joining under a new inode
 * number, or leaving a ring never alone is a no-op or a clean move, never a
 * second insertion (which once made the bucket chain a cycle).
 *
 * Every function here is called with c->lock held and does no I/O.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "sbx/xmalloc.h"
#include "cache_i.h"

bool tree_is_silly(const char *name)
{
	return strncmp(name, SILLY_PREFIX, sizeof(SILLY_PREFIX) - 1) == 0;
}

/* ---- children ------------------------------------------------------------ */

static bool kid_eq(const struct sbx_hashmap_node *hn, const void *name)
{
	return strcmp(sbx_hashmap_entry(hn, struct cnode, kid_node)->name,
		      name) == 0;
}

struct cnode *tree_kid_find(struct cnode *dir, const char *name)
{
	struct sbx_hashmap_node *hn = sbx_hashmap_find(
		&dir->kids, sbx_fnv1a_str(name), kid_eq, name);

	return hn ? sbx_hashmap_entry(hn, struct cnode, kid_node) : NULL;
}

struct cnode *tree_kid_next(struct sbx_hashmap_iter *it)
{
	struct sbx_hashmap_node *hn = sbx_hashmap_next(it);

	return hn ? sbx_hashmap_entry(hn, struct cnode, kid_node) : NULL;
}

void tree_kid_link(struct cnode *dir, struct cnode *k)
{
	sbx_hashmap_insert(&dir->kids, &k->kid_node, sbx_fnv1a_str(k->name));
	k->parent = dir;
}

void tree_kid_unlink(struct cnode *dir, struct cnode *k)
{
	/* A node is linked in its parent's table and nowhere else. */
	if (k->parent == dir)
		sbx_hashmap_remove(&dir->kids, &k->kid_node);
}

void tree_kid_move(struct cnode *k, struct cnode *dir, const char *name)
{
	if (k->parent)
		tree_kid_unlink(k->parent, k);
	free(k->name);
	k->name = sbx_xstrdup(name);
	tree_kid_link(dir, k);
}

struct cnode *tree_kid_get(struct cnode *dir, const char *name)
{
	struct cnode *k = tree_kid_find(dir, name);

	if (!k) {
		k = sbx_xcalloc(1, sizeof(*k));
		k->name = sbx_xstrdup(name);
		tree_kid_link(dir, k);
	}
	return k;
}

struct cnode *tree_resolve(struct cache *c, const char *path, bool create)
{
	struct cnode *n = &c->root;
	const char *p = path;

	while (n && *p) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);

		if (len) {
			char *part = sbx_xstrndup(p, len);

			n = create ? tree_kid_get(n, part)
				   : tree_kid_find(n, part);
			free(part);
		}
		p += len;
		if (*p == '/')
			p++;
	}
	return n;
}

/* ---- paths --------------------------------------------------------------- */

char *tree_path(const struct cnode *n)
{
	size_t len = 0, pos;
	const struct cnode *x;
	char *p;

	for (x = n; x->parent; x = x->parent) {
		if (x->orphan)
			return NULL;
		len += strlen(x->name) + 1;
	}
	/* The top is the root, or the head of a detached subtree. */
	if (x->orphan || x->name)
		return NULL;
	p = sbx_xmalloc(len + 1);
	pos = len;
	p[pos] = '\0';
	for (x = n; x->parent; x = x->parent) {
		size_t l = strlen(x->name);

		pos -= l;
		memcpy(p + pos, x->name, l);
		if (pos > 0)
			p[--pos] = '/';
	}
	/* The loop leaves one leading separator slot for nested paths. */
	if (len > 0 && p[0] == '/')
		memmove(p, p + 1, len);
	return p;
}

/* Does tree_path(n) give a path (no orphan on the way up)? */
static bool has_path(const struct cnode *n)
{
	const struct cnode *x;

	for (x = n; x->parent; x = x->parent)
		if (x->orphan)
			return false;
	return !x->orphan && !x->name;
}

/* Has `a` a path, and does its slot say at least `want`? */
static bool name_usable(const struct cnode *a, enum slot want)
{
	if (a->slot == S_ABSENT || (want == S_PRESENT && a->slot != want))
		return false;
	return has_path(a);
}

/*
 * Names known to hold the file come before names that only may: a name
 * removed through the mount turns UNKNOWN again when a change is reported
 * for it, a listing races with a change or events are lost (overflow),
 * because it may have been created anew.  For the daemon's node of a
 * hard-linked file that name is usually the removed one: trying it first
 * answered ENOENT (ESTALE) for every other name of the file, however often
 * the kernel looked them up again (docs/design.md, "mount-stale").
 */
struct cnode *tree_name_of(struct cnode *n)
{
	static const enum slot order[] = {S_PRESENT, S_UNKNOWN};

	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		if (name_usable(n, order[i]))
			return n;
		if (n->in_ring)
			for (struct cnode *a = n->ring_next; a != n;
			     a = a->ring_next)
				if (name_usable(a, order[i]))
					return a;
	}
	return n;
}

char *tree_path_of(const struct cnode *n)
{
	return tree_path(tree_name_of((struct cnode *)n));
}

char *tree_child_path(const struct cnode *dir, const char *name)
{
	char *dp = tree_path_of(dir), *p;

	if (!dp)
		return NULL;
	p = *dp ? sbx_xasprintf("%s/%s", dp, name) : sbx_xstrdup(name);
	free(dp);
	return p;
}

/* ---- hard-link rings ----------------------------------------------------- */

static uint64_t ring_hash(ino_t ino)
{
	return (uint64_t)ino; /* the map mixes it */
}

static bool ring_eq(const struct sbx_hashmap_node *hn, const void *ino)
{
	return sbx_hashmap_entry(hn, struct cnode, ring_node)->ring_ino ==
	       *(const ino_t *)ino;
}

void tree_ring_leave(struct cache *c, struct cnode *n)
{
	if (!n->in_ring)
		return;
	if (sbx_hashmap_node_linked(&n->ring_node)) {
		/* n was the head: another member takes its place. */
		sbx_hashmap_remove(&c->rings, &n->ring_node);
		if (n->ring_next != n)
			sbx_hashmap_insert(&c->rings, &n->ring_next->ring_node,
					   ring_hash(n->ring_ino));
	}
	n->ring_next->ring_prev = n->ring_prev;
	n->ring_prev->ring_next = n->ring_next;
	n->ring_next = n->ring_prev = NULL;
	n->in_ring = false;
}

/* Can ring member a still be a name of its file in the sandbox? */
static bool ring_member_alive(const struct cnode *a)
{
	return a->slot != S_ABSENT || cnode_unhiding(a);
}

/*
 * The ring headed by `head` when none of its members can still name a
 * file: its file is gone, and the sandbox may give the inode number to a
 * new file (ext4 does, soon), whose names must not be tied to the dead
 * ones -- pushes picked by directory, link counts and the name a node's
 * I/O takes would mix the two files (random tester, seed 388538268).
 * Its members leave it.  c->lock held.
 */
static bool ring_dissolve_dead(struct cache *c, struct cnode *head)
{
	struct cnode *a = head;

	do {
		if (ring_member_alive(a))
			return false;
		a = a->ring_next;
	} while (a != head);
	while (head->in_ring)
		tree_ring_leave(c, head->ring_next != head ? head->ring_next
							   : head);
	return true;
}

void tree_ring_retire(struct cache *c, ino_t ino)
{
	struct sbx_hashmap_node *hn;
	struct cnode *head;

	hn = sbx_hashmap_find(&c->rings, ring_hash(ino), ring_eq, &ino);
	if (!hn)
		return;
	head = sbx_hashmap_entry(hn, struct cnode, ring_node);
	while (head->in_ring) {
		struct cnode *a = head->ring_next != head ? head->ring_next
							  : head;

		/*
		 * A hidden name the cache still counted: its removal's
		 * answer was lost after the sandbox did it (the name was
		 * kept to be tried again, cache_silly.c), or it was removed
		 * behind the mount.  Counted on, it took a link off the new
		 * file once that got a second name (random tester's fault
		 * runs: fstat said 1 link for 2).
		 */
		if (a->hidden && a->slot != S_ABSENT)
			a->slot = S_ABSENT;
		a->st_valid = false;
		tree_ring_leave(c, a);
	}
}

/* Tie n to the other names of inode `ino` (n's attributes say nlink > 1). */
static void ring_join(struct cache *c, struct cnode *n, ino_t ino)
{
	struct sbx_hashmap_node *hn;
	struct cnode *head;

	if (n->in_ring) {
		if (n->ring_ino == ino)
			return;
		tree_ring_leave(c, n);
	}
	hn = sbx_hashmap_find(&c->rings, ring_hash(ino), ring_eq, &ino);
	if (hn && ring_dissolve_dead(c, sbx_hashmap_entry(hn, struct cnode,
							   ring_node)))
		hn = NULL;
	n->in_ring = true;
	n->ring_ino = ino;
	if (!hn) {
		n->ring_next = n->ring_prev = n;
		sbx_hashmap_insert(&c->rings, &n->ring_node, ring_hash(ino));
		return;
	}
	head = sbx_hashmap_entry(hn, struct cnode, ring_node);
	n->ring_next = head->ring_next;
	n->ring_prev = head;
	head->ring_next->ring_prev = n;
	head->ring_next = n;
}

void tree_invalidate_file(struct cnode *n)
{
	n->st_valid = false;
	if (n->in_ring)
		for (struct cnode *a = n->ring_next; a != n; a = a->ring_next)
			a->st_valid = false;
}

unsigned tree_file_dirty(const struct cnode *n)
{
	unsigned dirty = 0;

	tree_for_each_name(a, n)
		dirty += a->dirty;
	return dirty;
}

static bool hidden_in_sandbox(const struct cnode *a)
{
	return a->hidden && (a->slot != S_ABSENT || cnode_unhiding(a));
}

static bool visible_name(const struct cnode *a)
{
	return !a->hidden && !a->orphan && a->slot == S_PRESENT;
}

unsigned tree_hidden_names(const struct cnode *n)
{
	unsigned hidden = 0;

	tree_for_each_name(a, n)
		hidden += hidden_in_sandbox(a);
	return hidden;
}

unsigned tree_file_opens(const struct cnode *n, unsigned *active)
{
	unsigned opens = 0, act = 0;

	tree_for_each_name(a, n) {
		opens += a->opens;
		act += a->active;
	}
	if (active)
		*active = act;
	return opens;
}

unsigned tree_file_unhides(const struct cnode *n)
{
	unsigned sum = 0;

	tree_for_each_name(a, n)
		sum += a->unhides + a->ghost_outs;
	return sum;
}

bool tree_file_unhiding(const struct cnode *n)
{
	tree_for_each_name(a, n)
		if (cnode_unhiding(a) || (a->ghost_outs & 1))
			return true;
	return false;
}

bool tree_count_unsettled(struct cache *c, const struct cnode *k,
			  unsigned long unhides)
{
	return S_ISREG(k->st.st_mode) && (k->in_ring || k->st.st_nlink > 1) &&
	       (unhides != c->unhides_all || tree_file_unhiding(k));
}

nlink_t tree_visible_nlink(const struct cnode *n, nlink_t nlink)
{
	unsigned hidden = tree_hidden_names(n);
	nlink_t visible = nlink > hidden ? nlink - hidden : 0;

	/*
	 * A count fetched just after a hidden name's removal landed, and
	 * taken apart before its removal was marked done, leaves that link
	 * out twice: a file with a name the user sees has a link.
	 */
	if (visible == 0 && S_ISREG(n->st.st_mode))
		tree_for_each_name(a, n)
			if (visible_name(a)) {
				visible = 1;
				break;
			}
	return visible;
}

/* ---- attributes ---------------------------------------------------------- */

void tree_set_st(struct cache *c, struct cnode *n, const struct stat *st)
{
	/* A changed identity or type means another object: drop caches. */
	if (n->st_valid && (n->st.st_ino != st->st_ino ||
			    (n->st.st_mode & S_IFMT) != (st->st_mode & S_IFMT))) {
		free(n->link);
		n->link = NULL;
		n->complete = false;
	}
	n->st = *st;
	n->st_valid = true;
	n->st_time = cache_now();
	n->slot = S_PRESENT;
	n->gone_dir = false;
	if (S_ISREG(st->st_mode) && st->st_nlink > 1)
		ring_join(c, n, st->st_ino);
	else if (n->in_ring && (n->ring_ino != st->st_ino ||
				!S_ISREG(st->st_mode)))
		tree_ring_leave(c, n);
	/*
	 * With nlink 1 under the same number n stays in its ring: the other
	 * members may be hidden names (silly renames) still counted by the
	 * sandbox, or names whose removal the change stream has yet to say.
	 */
}

void tree_refresh_st(struct cache *c, struct cnode *n, const struct stat *st)
{
	enum slot was = n->slot;
	/* Fetched through another name: n's own is as unknown as before. */
	bool own = tree_name_of(n) == n;

	tree_set_st(c, n, st);
	if (was == S_ABSENT || !own)
		n->slot = was;
}

bool tree_other_object(const struct cache *c, const struct cnode *n,
		       ino_t ino)
{
	return n != &c->root && n->st.st_ino && ino && n->st.st_ino != ino;
}

/*
 * `name` in dir now names the object with attributes st.  When the node
 * knew another object under that name (removed and recreated behind us,
 * or replaced), the daemon may still hold the old node for a kernel inode
 * (an open file, another hard link): it is detached, so that it keeps
 * leading to the old object through its other names (its ring) or to
 * nothing (ESTALE), and a new node takes the name.  So does a directory
 * removed through the mount (gone_dir), even when the sandbox gave its
 * inode number to the new object.
 */
struct cnode *tree_name_st(struct cache *c, struct cnode *dir,
			   const char *name, const struct stat *st)
{
	struct cnode *k = tree_kid_get(dir, name);
	/*
	 * A removed name of a hard-linked file that now names a file with
	 * one link: that is another file (with the inode number of the old
	 * one, which the sandbox reused), not the old file's ring.  The old
	 * node keeps the ring, for any descriptor still open on it.
	 */
	bool reused = k->slot == S_ABSENT && k->in_ring && !k->hidden &&
		      S_ISREG(st->st_mode) && st->st_nlink == 1;

	/*
	 * Even with buffered writes: they were made to the old object, and
	 * pushed through this name they would land in the new one (a name
	 * renamed or removed behind us, or by a call whose answer an outage
	 * lost, then made anew through the mount).  Detached, they reach
	 * the old object through its other names or fail with ESTALE, which
	 * the owner's fsync() or close() reports.
	 */
	if ((k->st.st_ino && k->st.st_ino != st->st_ino && !k->hidden) ||
	    k->gone_dir || reused) {
		tree_orphan(c, k);
		k->st_valid = false;
		/* An open file's last bytes are what its descriptors read
		 * now (c_read's gone_read_or). */
		if (!tree_file_opens(k, NULL))
			content_drop(c, k);
		k = tree_kid_get(dir, name);
	}
	tree_set_st(c, k, st);
	return k;
}

struct cnode *tree_rename(struct cache *c, struct cnode *from,
			  const char *name, struct cnode *to,
			  const char *newname)
{
	/* (name may be the moved node's own, which the move frees.) */
	char *old = sbx_xstrdup(name);
	struct cnode *a = tree_kid_find(from, old);
	struct cnode *b = tree_kid_find(to, newname), *k;

	if (b && b != a) {
		tree_orphan(c, b);
		tree_mark_gone_dir(b, false);
		tree_invalidate_file(b);
	}
	if (a) {
		tree_kid_move(a, to, newname);
		tree_invalidate_file(a);
	}
	k = tree_kid_get(from, old);
	k->slot = S_ABSENT;
	k->own_gen = c->events;
	c->moves++;
	free(old);
	return a;
}

void tree_orphan(struct cache *c, struct cnode *k)
{
	if (k->parent)
		tree_kid_unlink(k->parent, k);
	k->parent = NULL;
	k->orphan = true;
	k->slot = S_ABSENT;
	k->orphan_next = c->orphans;
	c->orphans = k;
}

void tree_unorphan(struct cache *c, struct cnode *k, struct cnode *dir,
		   const char *name)
{
	struct cnode **pp = &c->orphans, *old = tree_kid_find(dir, name);

	while (*pp && *pp != k)
		pp = &(*pp)->orphan_next;
	if (*pp)
		*pp = k->orphan_next;
	k->orphan_next = NULL;
	k->orphan = false;
	if (old)
		tree_orphan(c, old);
	tree_kid_move(k, dir, name);
	c->moves++;
	/* tree_mark_gone_dir() zeroed a directory's count. */
	k->gone_dir = false;
	k->st_valid = false;
	/* The event's inode number said the name holds k's object; buffered
	 * writes keep it present, as they keep a followed node
	 * (tree_orphan() made it absent). */
	k->slot = k->dirty ? S_PRESENT : S_UNKNOWN;
}

void tree_mark_gone_dir(struct cnode *k, bool rmdir)
{
	if (k->st.st_ino != 0 && S_ISDIR(k->st.st_mode)) {
		k->gone_dir = true;
		k->st.st_nlink = 0;
		/* What ext4 says: rmdir empties the inode, a rename over it
		 * leaves its size. */
		if (rmdir)
			k->st.st_size = 0;
	}
}

/* ---- whole tree ---------------------------------------------------------- */

bool tree_name_unsure(struct cache *c, struct cnode *k)
{
	/*
	 * Our hidden names are ours to know: no event or listing tells of
	 * them (both skip them).  A removed one made UNKNOWN counted as a
	 * link again (tree_hidden_names) and took one off the file's other
	 * names (random tester's fault runs, seed 304502879: after an
	 * overflow, stat said 1 link for 2).
	 */
	if (k->hidden)
		return false;
	if (k->slot == S_ABSENT && k->in_ring && !k->dirty) {
		tree_orphan(c, k);
		return true;
	}
	k->slot = S_UNKNOWN;
	return false;
}

void tree_forget_all(struct cache *c, struct cnode *n)
{
	struct sbx_hashmap_iter it;
	struct cnode *k;

	n->st_valid = false;
	n->complete = false;
	n->prefetched = false;
	free(n->link);
	n->link = NULL;
	tree_for_each_kid(k, it, n) {
		tree_forget_all(c, k);
		if (k->slot == S_ABSENT)
			(void)tree_name_unsure(c, k);
	}
}

void tree_free(struct cache *c, struct cnode *n)
{
	struct sbx_hashmap_iter it;
	struct cnode *k;

	tree_for_each_kid(k, it, n) {
		tree_free(c, k);
		free(k->name);
		free(k);
	}
	sbx_hashmap_fini(&n->kids);
	if (n == &c->root) {
		sbx_hashmap_fini(&c->rings);
		free(c->displaced_path);
		c->displaced_path = NULL;
		c->displaced = NULL;
		while (c->orphans) {
			struct cnode *o = c->orphans;

			c->orphans = o->orphan_next;
			tree_free(c, o);
			free(o->name);
			free(o);
		}
	}
	content_drop(c, n);
	free(n->link);
	n->link = NULL;
}
