/*
 * Remote data plane, identities and the node table (premote_fs_i.h).
 *
 * Two maps (sbx/hashmap.h) over the tracked nodes, one by reported ino
 * (so a remote file has one node and its path can follow renames) and one
 * by path (so the change stream's paths resolve to the inode numbers the
 * daemon knows).  Both are protected by s->nodes_lock.
 */
#include "config.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sbx/hashmap.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "premote_fs_i.h"

/* ---- identities ----------------------------------------------------------- */

void premote_fix_stat(const struct premote_sandbox *s, struct stat *st)
{
	uint64_t rdev = (uint64_t)st->st_dev, ino = (uint64_t)st->st_ino;

	/* Another filesystem below the root (a mount inside the sandbox):
	 * keep inode numbers apart from the root filesystem's. */
	if (rdev != s->root_rdev)
		ino = (ino ^ mix64(rdev)) | (1ull << 63);
	st->st_ino = (ino_t)ino;
	st->st_dev = s->dev;
	if (!st->st_blksize)
		st->st_blksize = 4096;
}

/* ---- node table ----------------------------------------------------------- */

static bool ino_eq(const struct sbx_hashmap_node *hn, const void *key)
{
	return sbx_hashmap_entry(hn, struct premote_node, ino_node)->ino ==
	       *(const uint64_t *)key;
}

static bool path_eq(const struct sbx_hashmap_node *hn, const void *key)
{
	return !strcmp(sbx_hashmap_entry(hn, struct premote_node,
					 path_node)->path,
		       (const char *)key);
}

/* The tracked node of `ino`, or NULL.  Caller holds nodes_lock. */
static struct premote_node *find_ino_locked(struct premote_sandbox *s,
					    uint64_t ino)
{
	struct sbx_hashmap_node *hn =
		sbx_hashmap_find(&s->by_ino, ino, ino_eq, &ino);

	return hn ? sbx_hashmap_entry(hn, struct premote_node, ino_node) : NULL;
}

/*
 * The newest tracked node at `path` (the one linked there last), or NULL.
 * Caller holds nodes_lock.
 */
static struct premote_node *find_path_locked(struct premote_sandbox *s,
					     const char *path)
{
	struct premote_node *best = NULL;
	struct sbx_hashmap_node *hn;

	for (hn = sbx_hashmap_find(&s->by_path, sbx_fnv1a_str(path), path_eq,
				   path);
	     hn; hn = sbx_hashmap_find_next(hn, path_eq, path)) {
		struct premote_node *n =
			sbx_hashmap_entry(hn, struct premote_node, path_node);

		if (!best || n->path_gen > best->path_gen)
			best = n;
	}
	return best;
}

/* Caller holds nodes_lock. */
static void path_unlink_locked(struct premote_sandbox *s,
			       struct premote_node *n)
{
	sbx_hashmap_remove(&s->by_path, &n->path_node);
}

/* Caller holds nodes_lock.  Newest: a path lookup finds it. */
static void path_link_locked(struct premote_sandbox *s, struct premote_node *n)
{
	n->path_gen = ++s->path_gen;
	sbx_hashmap_insert(&s->by_path, &n->path_node, sbx_fnv1a_str(n->path));
}

static bool under(const char *path, const char *prefix, size_t pl)
{
	return !strncmp(path, prefix, pl) &&
	       (path[pl] == '\0' || path[pl] == '/' || pl == 0);
}

/*
 * Every tracked node at or below `from` now lives below `to` (and, with
 * `swap`, the other way round too).  O(nodes); renames are rare next to
 * lookups.  Caller holds nodes_lock.
 */
void premote_move_locked(struct premote_sandbox *s, const char *from,
			 const char *to, bool swap)
{
	size_t fl = strlen(from), tl = strlen(to);
	struct premote_node **moved = NULL;
	size_t nmoved = 0, cap = 0;

	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *hn;

	if (!fl || !tl)
		return; /* the root never moves */
	/* Collect first: relinking during the walk is not allowed. */
	sbx_hashmap_iter_init(&it, &s->by_path);
	while ((hn = sbx_hashmap_next(&it))) {
		struct premote_node *n =
			sbx_hashmap_entry(hn, struct premote_node, path_node);

		if (!under(n->path, from, fl) &&
		    !(swap && under(n->path, to, tl)))
			continue;
		if (nmoved == cap) {
			cap = cap ? cap * 2 : 16;
			moved = sbx_xrealloc(moved, cap * sizeof(*moved));
		}
		moved[nmoved++] = n;
	}
	for (size_t i = 0; i < nmoved; i++) {
		struct premote_node *n = moved[i];
		char *np;

		path_unlink_locked(s, n);
		if (under(n->path, from, fl))
			np = sbx_xasprintf("%s%s", to, n->path + fl);
		else
			np = sbx_xasprintf("%s%s", from, n->path + tl);
		free(n->path);
		n->path = np;
		path_link_locked(s, n);
	}
	free(moved);
}

/*
 * A tracked node for the object with (fixed) attributes `st` found at
 * `path`: the known one (path updated) or a new one.  One reference.
 */
struct premote_node *premote_node_get(struct premote_sandbox *s,
				      const char *path, const struct stat *st)
{
	uint64_t ino = (uint64_t)st->st_ino;
	struct premote_node *n;

	if (ino == s->root.ino) {
		/* The root under another name (a bind mount, "."): the root. */
		return &s->root;
	}
	pthread_mutex_lock(&s->nodes_lock);
	n = find_ino_locked(s, ino);
	if (n) {
		n->refs++;
		if (strcmp(n->path, path)) {
			if (n->dir) {
				char *old = sbx_xstrdup(n->path);

				/* Renamed behind our back: its subtree too. */
				premote_move_locked(s, old, path, false);
				free(old);
			} else {
				/* A hard link, or a file renamed: last seen. */
				path_unlink_locked(s, n);
				free(n->path);
				n->path = sbx_xstrdup(path);
				path_link_locked(s, n);
			}
		}
		n->dir = S_ISDIR(st->st_mode);
		pthread_mutex_unlock(&s->nodes_lock);
		return n;
	}
	n = sbx_xcalloc(1, sizeof(*n));
	n->path = sbx_xstrdup(path);
	n->ino = ino;
	n->dir = S_ISDIR(st->st_mode);
	n->refs = 1;
	sbx_hashmap_insert(&s->by_ino, &n->ino_node, ino);
	path_link_locked(s, n);
	pthread_mutex_unlock(&s->nodes_lock);
	return n;
}

void premote_node_put(struct premote_sandbox *s, struct premote_node *n)
{
	bool gone = false;

	if (!n || n == &s->root)
		return;
	pthread_mutex_lock(&s->nodes_lock);
	if (--n->refs == 0) {
		gone = true;
		/* No-ops for an untracked (node_at()) node. */
		sbx_hashmap_remove(&s->by_ino, &n->ino_node);
		path_unlink_locked(s, n);
	}
	pthread_mutex_unlock(&s->nodes_lock);
	if (gone) {
		free(n->path);
		free(n);
	}
}

void premote_node_ref(struct premote_sandbox *s, struct premote_node *n)
{
	if (n == &s->root)
		return;
	pthread_mutex_lock(&s->nodes_lock);
	n->refs++;
	pthread_mutex_unlock(&s->nodes_lock);
}

/* The node's current path (malloc'd). */
char *premote_npath(struct premote_sandbox *s, struct sbx_node *node)
{
	struct premote_node *n = RNODE(node);
	char *p;

	if (n == &s->root)
		return sbx_xstrdup("");
	pthread_mutex_lock(&s->nodes_lock);
	p = sbx_xstrdup(n->path);
	pthread_mutex_unlock(&s->nodes_lock);
	return p;
}

/* The path of `name` in directory `parent` (malloc'd). */
char *premote_cpath(struct premote_sandbox *s, struct sbx_node *parent,
		    const char *name)
{
	char *dir = premote_npath(s, parent), *p;

	if (!strcmp(name, ".")) {
		return dir;
	} else if (!strcmp(name, "..")) {
		char *slash = strrchr(dir, '/');

		if (slash)
			*slash = '\0';
		else
			dir[0] = '\0'; /* ".." of the root is the root */
		return dir;
	}
	p = sbx_proto_path_join(dir, name);
	free(dir);
	return p;
}

uint64_t premote_ino_at(struct premote_sandbox *s, const char *path)
{
	struct premote_node *n;
	uint64_t ino;

	if (!*path)
		return s->root.ino;
	pthread_mutex_lock(&s->nodes_lock);
	n = find_path_locked(s, path);
	ino = n ? n->ino : 0;
	pthread_mutex_unlock(&s->nodes_lock);
	return ino;
}

void premote_note_exec_seq(struct premote_sandbox *s, uint64_t seq)
{
	pthread_mutex_lock(&s->seq_lock);
	if (!s->exec_seq_set || seq > s->exec_seq)
		s->exec_seq = seq;
	s->exec_seq_set = true;
	pthread_mutex_unlock(&s->seq_lock);
}
