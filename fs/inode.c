/* Inode table: nlookup bookkeeping and provider-identity dedup. */
#include "config.h"

#include <errno.h>
#include <stdio.h> /* RENAME_EXCHANGE */
#include <stdlib.h>
#include <string.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "fs_i.h"

struct key {
	dev_t dev;
	ino_t ino;
};

static uint64_t hash(dev_t dev, ino_t ino)
{
	return (uint64_t)ino * 0x9e3779b97f4a7c15ull ^ (uint64_t)dev;
}

static bool key_eq(const struct sbx_hashmap_node *hn, const void *key)
{
	const struct fs_inode *in = sbx_hashmap_entry(hn, struct fs_inode,
						      hnode);
	const struct key *k = key;

	return in->ino == k->ino && in->dev == k->dev;
}

/* ---- the name index ------------------------------------------------------ */

struct name_key {
	fuse_ino_t parent;
	const char *name;
};

static uint64_t name_hash(fuse_ino_t parent, const char *name)
{
	return sbx_fnv1a_str(name) ^ (uint64_t)parent * 0x9e3779b97f4a7c15ull;
}

static bool name_eq(const struct sbx_hashmap_node *hn, const void *key)
{
	const struct fs_name *e = sbx_hashmap_entry(hn, struct fs_name, hnode);
	const struct name_key *k = key;

	return e->parent == k->parent && strcmp(e->name, k->name) == 0;
}

/* Unlink e from the index and from its inode's list, and free it.
 * fs->lock held. */
static void name_free_locked(struct fs *fs, struct fs_name *e)
{
	struct fs_name **pp = &e->inode->names;

	while (*pp && *pp != e)
		pp = &(*pp)->next;
	if (*pp)
		*pp = e->next;
	sbx_hashmap_remove(&fs->names, &e->hnode);
	free(e);
}

/* Record that the kernel may know `in` as (parent, name).  fs->lock. */
static void name_add_locked(struct fs *fs, struct fs_inode *in,
			    fuse_ino_t parent, const char *name)
{
	struct fs_name *e, *last = NULL;
	size_t len, count = 0;

	if (!name || in == &fs->root)
		return;
	for (e = in->names; e; e = e->next) {
		if (e->parent == parent && strcmp(e->name, name) == 0)
			return;
		last = e;
		count++;
	}
	/* A file looked up under very many names: the oldest goes. */
	if (count >= FS_NAMES_PER_INODE)
		name_free_locked(fs, last);
	len = strlen(name);
	e = sbx_xmalloc(sizeof(*e) + len + 1);
	sbx_hashmap_node_init(&e->hnode);
	e->inode = in;
	e->parent = parent;
	memcpy(e->name, name, len + 1);
	e->next = in->names;
	in->names = e;
	sbx_hashmap_insert(&fs->names, &e->hnode, name_hash(parent, name));
}

/* The first entry for (parent, name), or NULL.  fs->lock held. */
static struct fs_name *name_find_locked(struct fs *fs, fuse_ino_t parent,
					const char *name)
{
	struct name_key k = { parent, name };
	struct sbx_hashmap_node *hn;

	hn = sbx_hashmap_find(&fs->names, name_hash(parent, name), name_eq, &k);
	return hn ? sbx_hashmap_entry(hn, struct fs_name, hnode) : NULL;
}

/* Drop every entry of (parent, name) from the index; the first `cap` of
 * their inodes go to moved[] (*n of them).  fs->lock held. */
static void names_detach_locked(struct fs *fs, fuse_ino_t parent,
				const char *name, struct fs_inode **moved,
				size_t *n, size_t cap)
{
	struct fs_name *e;

	while ((e = name_find_locked(fs, parent, name))) {
		if (*n < cap)
			moved[(*n)++] = e->inode;
		name_free_locked(fs, e);
	}
}

void fs_names_removed(struct fs *fs, fuse_ino_t parent, const char *name)
{
	size_t n = 0;

	pthread_mutex_lock(&fs->lock);
	names_detach_locked(fs, parent, name, NULL, &n, 0);
	pthread_mutex_unlock(&fs->lock);
}

/* (Renames and takes keep at most a few inodes per name: more under one
 * name are stale inodes of removed files, and their entries just go.) */
void fs_names_renamed(struct fs *fs, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned flags)
{
	struct fs_inode *from[4], *to[4];
	size_t nfrom = 0, nto = 0;

	pthread_mutex_lock(&fs->lock);
	names_detach_locked(fs, parent, name, from, &nfrom, 4);
	names_detach_locked(fs, newparent, newname, to, &nto, 4);
	for (size_t i = 0; i < nfrom; i++)
		name_add_locked(fs, from[i], newparent, newname);
	if (flags & RENAME_EXCHANGE)
		for (size_t i = 0; i < nto; i++)
			name_add_locked(fs, to[i], parent, name);
	pthread_mutex_unlock(&fs->lock);
}

/* The provider's cached attributes of `in` are old.  fs->lock held (the
 * inode cannot be freed meanwhile). */
static bool attr_changed_locked(struct fs *fs, struct fs_inode *in)
{
	if (in == &fs->root || !fs->sb->ops->attr_changed)
		return true;
	return fs->sb->ops->attr_changed(fs->sb, in->node);
}

size_t fs_names_take(struct fs *fs, fuse_ino_t parent, const char *name,
		     fuse_ino_t *out, size_t cap)
{
	struct fs_inode *in[FS_NAME_TAKE_MAX];
	size_t n = 0, kept = 0;

	if (cap > FS_NAME_TAKE_MAX)
		cap = FS_NAME_TAKE_MAX;
	pthread_mutex_lock(&fs->lock);
	names_detach_locked(fs, parent, name, in, &n, cap);
	for (size_t i = 0; i < n; i++)
		if (attr_changed_locked(fs, in[i]))
			out[kept++] = fs_inode_id(fs, in[i]);
	pthread_mutex_unlock(&fs->lock);
	return kept;
}

/* ---- inodes ---------------------------------------------------------------- */

/* Release everything an inode owns; it is out of the table and has no
 * entry in the name index. */
static void inode_free(struct fs *fs, struct fs_inode *in)
{
	fs->sb->ops->forget(fs->sb, in->node);
	free(in->name);
	free(in);
}

/* An inode leaves the name index for good.  fs->lock held. */
static void names_drop_locked(struct fs *fs, struct fs_inode *in)
{
	while (in->names)
		name_free_locked(fs, in->names);
}

void fs_inodes_init(struct fs *fs)
{
	sbx_hashmap_init(&fs->table);
	sbx_hashmap_init(&fs->names);
}

void fs_inodes_fini(struct fs *fs)
{
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *hn;

	sbx_hashmap_iter_init(&it, &fs->table);
	while ((hn = sbx_hashmap_next(&it))) {
		struct fs_inode *in = sbx_hashmap_entry(hn, struct fs_inode,
							hnode);

		names_drop_locked(fs, in);
		inode_free(fs, in);
	}
	sbx_hashmap_fini(&fs->table);
	while (fs->stale) {
		struct fs_inode *in = fs->stale;

		fs->stale = in->stale_next;
		names_drop_locked(fs, in);
		inode_free(fs, in);
	}
	sbx_hashmap_fini(&fs->names);
	free(fs->root.name);
	fs->root.name = NULL;
}

struct fs_inode *fs_inode_get(struct fs *fs, fuse_ino_t ino)
{
	if (ino == FUSE_ROOT_ID)
		return &fs->root;
	return (struct fs_inode *)(uintptr_t)ino;
}

fuse_ino_t fs_inode_id(struct fs *fs, struct fs_inode *inode)
{
	if (inode == &fs->root)
		return FUSE_ROOT_ID;
	return (fuse_ino_t)(uintptr_t)inode;
}

/* Caller holds fs->lock. */
static struct fs_inode *find_locked(struct fs *fs, dev_t dev, ino_t ino)
{
	struct key k = { dev, ino };
	struct sbx_hashmap_node *hn;

	if (fs->root.dev == dev && fs->root.ino == ino)
		return &fs->root;
	hn = sbx_hashmap_find(&fs->table, hash(dev, ino), key_eq, &k);
	return hn ? sbx_hashmap_entry(hn, struct fs_inode, hnode) : NULL;
}

static void set_name_locked(struct fs *fs, struct fs_inode *in,
			    fuse_ino_t parent, const char *name)
{
	if (!name)
		return;
	name_add_locked(fs, in, parent, name);
	if (in->parent == parent && in->name && strcmp(in->name, name) == 0)
		return;
	free(in->name);
	in->name = sbx_xstrdup(name);
	in->parent = parent;
}

static struct fs_inode *remember(struct fs *fs, fuse_ino_t parent,
				 const char *name, struct sbx_node *node,
				 const struct stat *st, bool made)
{
	struct fs_inode *in, *fresh = NULL;
	struct sbx_node *drop = NULL;

	pthread_mutex_lock(&fs->lock);
	in = find_locked(fs, st->st_dev, st->st_ino);
	if (in && in != &fs->root && in->node != node &&
	    (made || (fs->sb->ops->node_stale &&
		      fs->sb->ops->node_stale(fs->sb, in->node, node, st)))) {
		/*
		 * The sandbox reused the inode number of a removed file the
		 * kernel still holds: the new file gets its own inode, and
		 * the old one stays only for the kernel's references.
		 */
		sbx_hashmap_remove(&fs->table, &in->hnode);
		in->stale_next = fs->stale;
		fs->stale = in;
		in = NULL;
	}
	if (in) {
		in->nlookup++;
		if (in != &fs->root)
			set_name_locked(fs, in, parent, name);
		drop = node;
	} else {
		/* Allocate under the lock: rare, and keeps dedup exact. */
		fresh = sbx_xcalloc(1, sizeof(*fresh));
		fresh->node = node;
		fresh->dev = st->st_dev;
		fresh->ino = st->st_ino;
		fresh->nlookup = 1;
		set_name_locked(fs, fresh, parent, name);
		sbx_hashmap_insert(&fs->table, &fresh->hnode,
				   hash(fresh->dev, fresh->ino));
		in = fresh;
	}
	pthread_mutex_unlock(&fs->lock);
	if (drop)
		fs->sb->ops->forget(fs->sb, drop);
	return in;
}

struct fs_inode *fs_inode_remember(struct fs *fs, fuse_ino_t parent,
				   const char *name, struct sbx_node *node,
				   const struct stat *st)
{
	return remember(fs, parent, name, node, st, false);
}

struct fs_inode *fs_inode_remember_new(struct fs *fs, fuse_ino_t parent,
				       const char *name, struct sbx_node *node,
				       const struct stat *st)
{
	return remember(fs, parent, name, node, st, true);
}

void fs_inode_forget(struct fs *fs, fuse_ino_t ino, uint64_t n)
{
	struct fs_inode *in = fs_inode_get(fs, ino);
	bool gone = false;

	if (in == &fs->root)
		return;
	pthread_mutex_lock(&fs->lock);
	if (in->nlookup < n) {
		/* The kernel never forgets more than it looked up. */
		sbx_error("forget: inode %llu nlookup %llu < %llu",
			  (unsigned long long)in->ino,
			  (unsigned long long)in->nlookup,
			  (unsigned long long)n);
		abort();
	}
	in->nlookup -= n;
	if (in->nlookup == 0) {
		if (sbx_hashmap_node_linked(&in->hnode)) {
			sbx_hashmap_remove(&fs->table, &in->hnode);
		} else {
			struct fs_inode **pp = &fs->stale;

			while (*pp && *pp != in)
				pp = &(*pp)->stale_next;
			if (*pp)
				*pp = in->stale_next;
		}
		names_drop_locked(fs, in);
		gone = true;
	}
	pthread_mutex_unlock(&fs->lock);
	if (gone)
		inode_free(fs, in);
}

fuse_ino_t fs_inode_find(struct fs *fs, dev_t dev, ino_t ino,
			 unsigned *writers)
{
	struct fs_inode *in;
	fuse_ino_t id = 0;

	pthread_mutex_lock(&fs->lock);
	in = find_locked(fs, dev, ino);
	if (in)
		id = fs_inode_id(fs, in);
	if (writers)
		*writers = in ? in->writers : 0;
	pthread_mutex_unlock(&fs->lock);
	return id;
}

void fs_inode_writers(struct fs *fs, struct fs_inode *inode, int delta)
{
	pthread_mutex_lock(&fs->lock);
	inode->writers += (unsigned)delta;
	pthread_mutex_unlock(&fs->lock);
}

struct snap {
	fuse_ino_t ino, parent;
	char *name;
};

void fs_inode_foreach(struct fs *fs,
		      void (*fn)(struct fs *fs, fuse_ino_t ino,
				 fuse_ino_t parent, const char *name,
				 void *payload),
		      void *payload)
{
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *hn;
	struct snap *v;
	size_t n = 0;

	pthread_mutex_lock(&fs->lock);
	v = sbx_xcalloc(sbx_hashmap_count(&fs->table) + 1, sizeof(*v));
	v[n++] = (struct snap){FUSE_ROOT_ID, 0, NULL};
	sbx_hashmap_iter_init(&it, &fs->table);
	while ((hn = sbx_hashmap_next(&it))) {
		struct fs_inode *in = sbx_hashmap_entry(hn, struct fs_inode,
							hnode);

		v[n++] = (struct snap){fs_inode_id(fs, in), in->parent,
				       in->name ? sbx_xstrdup(in->name) : NULL};
	}
	pthread_mutex_unlock(&fs->lock);
	for (size_t i = 0; i < n; i++) {
		fn(fs, v[i].ino, v[i].parent, v[i].name, payload);
		free(v[i].name);
	}
	free(v);
}

fuse_ino_t fs_inode_attr_changed(struct fs *fs, dev_t dev, ino_t ino)
{
	struct fs_inode *in;
	fuse_ino_t id = 0;

	pthread_mutex_lock(&fs->lock);
	in = find_locked(fs, dev, ino);
	if (in && attr_changed_locked(fs, in))
		id = fs_inode_id(fs, in);
	pthread_mutex_unlock(&fs->lock);
	return id;
}
