/* Inode table: nlookup bookkeeping and provider-identity dedup. */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "fs_i.h"

static size_t hash(dev_t dev, ino_t ino, size_t size)
{
	uint64_t h = (uint64_t)ino * 0x9e3779b97f4a7c15ull ^ (uint64_t)dev;

	return (size_t)(h ^ (h >> 29)) & (size - 1);
}

/* Release everything an inode owns; it is out of the table already. */
static void inode_free(struct fs *fs, struct fs_inode *in)
{
	fs->sb->ops->forget(fs->sb, in->node);
	free(in->name);
	free(in);
}

void fs_inodes_init(struct fs *fs)
{
	fs->table_size = 4096;
	fs->table = sbx_xcalloc(fs->table_size, sizeof(*fs->table));
	fs->count = 0;
}

void fs_inodes_fini(struct fs *fs)
{
	for (size_t i = 0; i < fs->table_size; i++) {
		struct fs_inode *in = fs->table[i], *next;

		for (; in; in = next) {
			next = in->hnext;
			inode_free(fs, in);
		}
	}
	free(fs->table);
	fs->table = NULL;
	while (fs->stale) {
		struct fs_inode *in = fs->stale;

		fs->stale = in->hnext;
		inode_free(fs, in);
	}
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
	struct fs_inode *in;

	if (fs->root.dev == dev && fs->root.ino == ino)
		return &fs->root;
	for (in = fs->table[hash(dev, ino, fs->table_size)]; in; in = in->hnext)
		if (in->ino == ino && in->dev == dev)
			return in;
	return NULL;
}

/* Caller holds fs->lock. */
static void grow_locked(struct fs *fs)
{
	size_t nsize = fs->table_size * 2;
	struct fs_inode **nt = sbx_xcalloc(nsize, sizeof(*nt));

	for (size_t i = 0; i < fs->table_size; i++) {
		struct fs_inode *in = fs->table[i], *next;

		for (; in; in = next) {
			size_t h = hash(in->dev, in->ino, nsize);

			next = in->hnext;
			in->hnext = nt[h];
			nt[h] = in;
		}
	}
	free(fs->table);
	fs->table = nt;
	fs->table_size = nsize;
}

/* Take an inode out of the (dev, ino) table.  Caller holds fs->lock. */
static void unhash_locked(struct fs *fs, struct fs_inode *in)
{
	struct fs_inode **pp;

	if (!in->hashed)
		return;
	pp = &fs->table[hash(in->dev, in->ino, fs->table_size)];
	while (*pp != in)
		pp = &(*pp)->hnext;
	*pp = in->hnext;
	in->hnext = NULL;
	in->hashed = false;
	fs->count--;
}

static void set_name_locked(struct fs_inode *in, fuse_ino_t parent,
			    const char *name)
{
	if (!name)
		return;
	if (in->parent == parent && in->name && strcmp(in->name, name) == 0)
		return;
	free(in->name);
	in->name = sbx_xstrdup(name);
	in->parent = parent;
}

struct fs_inode *fs_inode_remember(struct fs *fs, fuse_ino_t parent,
				   const char *name, struct sbx_node *node,
				   const struct stat *st)
{
	struct fs_inode *in, *fresh = NULL;
	struct sbx_node *drop = NULL;

	pthread_mutex_lock(&fs->lock);
	in = find_locked(fs, st->st_dev, st->st_ino);
	if (in && in != &fs->root && in->node != node &&
	    fs->sb->ops->node_stale &&
	    fs->sb->ops->node_stale(fs->sb, in->node, node, st)) {
		/*
		 * The sandbox reused the inode number of a removed file the
		 * kernel still holds: the new file gets its own inode, and
		 * the old one stays only for the kernel's references.
		 */
		unhash_locked(fs, in);
		in->hnext = fs->stale;
		fs->stale = in;
		in = NULL;
	}
	if (in) {
		in->nlookup++;
		if (in != &fs->root)
			set_name_locked(in, parent, name);
		drop = node;
	} else {
		/* Allocate under the lock: rare, and keeps dedup exact. */
		fresh = sbx_xcalloc(1, sizeof(*fresh));
		fresh->node = node;
		fresh->dev = st->st_dev;
		fresh->ino = st->st_ino;
		fresh->nlookup = 1;
		set_name_locked(fresh, parent, name);
		if (fs->count * 2 >= fs->table_size)
			grow_locked(fs);
		size_t h = hash(fresh->dev, fresh->ino, fs->table_size);
		fresh->hnext = fs->table[h];
		fs->table[h] = fresh;
		fresh->hashed = true;
		fs->count++;
		in = fresh;
	}
	pthread_mutex_unlock(&fs->lock);
	if (drop)
		fs->sb->ops->forget(fs->sb, drop);
	return in;
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
		if (in->hashed) {
			unhash_locked(fs, in);
		} else {
			struct fs_inode **pp = &fs->stale;

			while (*pp && *pp != in)
				pp = &(*pp)->hnext;
			if (*pp)
				*pp = in->hnext;
		}
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
	struct snap *v;
	size_t n = 0, cap;

	pthread_mutex_lock(&fs->lock);
	cap = fs->count + 1;
	v = sbx_xcalloc(cap, sizeof(*v));
	v[n++] = (struct snap){FUSE_ROOT_ID, 0, NULL};
	for (size_t i = 0; i < fs->table_size; i++)
		for (struct fs_inode *in = fs->table[i]; in; in = in->hnext)
			v[n++] = (struct snap){fs_inode_id(fs, in), in->parent,
					       in->name ? sbx_xstrdup(in->name)
							: NULL};
	pthread_mutex_unlock(&fs->lock);
	for (size_t i = 0; i < n; i++) {
		fn(fs, v[i].ino, v[i].parent, v[i].name, payload);
		free(v[i].name);
	}
	free(v);
}
