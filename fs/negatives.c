/*
 * Negative entries handed out with the long timeout; see fs_i.h.
 *
 * Why: while the change stream is healthy a LOOKUP that finds nothing is
 * cached by the kernel for FS_TIMEOUT_WATCHED, and the stream says when the
 * name appears.  When events are lost (an overflow, an agent restarted, an
 * outage the stream could not replay), invalidate_everything() can reach
 * every inode the kernel holds, but a negative dentry has no inode: without
 * this list a name made in the sandbox during the gap stayed "No such
 * file" through the mount for up to ten minutes (random tester's fault
 * runs, mount-stale: a file intact in the sandbox that the mount could not
 * open after the outage).
 */
#include <stdlib.h>
#include <string.h>

#include "fs_i.h"
#include "sbx/clock.h"
#include "sbx/xmalloc.h"

struct fs_negative {
	struct sbx_hashmap_node hnode; /* fs->negatives */
	long long expires_ms;          /* sbx_clock_mono_ms() the kernel's
					* copy times out */
	fuse_ino_t parent;
	char name[];
};

/* At most one pruning walk of a full list per this many ms. */
#define NEGATIVES_PRUNE_EVERY_MS 10000

struct negative_key {
	fuse_ino_t parent;
	const char *name;
};

static uint64_t negative_hash(fuse_ino_t parent, const char *name)
{
	return sbx_fnv1a_more(sbx_fnv1a(&parent, sizeof(parent)), name,
			      strlen(name));
}

static bool negative_eq(const struct sbx_hashmap_node *n, const void *key)
{
	const struct fs_negative *x =
		sbx_hashmap_entry(n, struct fs_negative, hnode);
	const struct negative_key *k = key;

	return x->parent == k->parent && strcmp(x->name, k->name) == 0;
}

static struct fs_negative *negative_find(struct fs *fs, fuse_ino_t parent,
					 const char *name)
{
	struct negative_key k = { parent, name };
	struct sbx_hashmap_node *n =
		sbx_hashmap_find(&fs->negatives, negative_hash(parent, name),
				 negative_eq, &k);

	return n ? sbx_hashmap_entry(n, struct fs_negative, hnode) : NULL;
}

/*
 * A full list: take off the entries whose kernel copy has timed out (the
 * names created through the mount, whose own events the cache keeps to
 * itself, end there too).  At most every NEGATIVES_PRUNE_EVERY_MS, so a
 * list full of live entries is not walked at each lookup.  neg_lock held.
 */
static void negatives_prune_locked(struct fs *fs, long long now)
{
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *n;

	if (now < fs->neg_prune_at)
		return;
	fs->neg_prune_at = now + NEGATIVES_PRUNE_EVERY_MS;
	sbx_hashmap_iter_init(&it, &fs->negatives);
	while ((n = sbx_hashmap_next(&it))) {
		struct fs_negative *x =
			sbx_hashmap_entry(n, struct fs_negative, hnode);

		if (x->expires_ms <= now) {
			sbx_hashmap_remove(&fs->negatives, n);
			free(x);
		}
	}
}

double fs_negative_timeout(struct fs *fs, fuse_ino_t parent,
			   const char *name)
{
	long long now = sbx_clock_mono_ms();
	long long expires = now + (long long)(FS_TIMEOUT_WATCHED * 1000);
	double timeout = FS_TIMEOUT_WATCHED;
	struct fs_negative *x;

	pthread_mutex_lock(&fs->neg_lock);
	x = negative_find(fs, parent, name);
	if (!x && sbx_hashmap_count(&fs->negatives) >= FS_NEGATIVES_MAX)
		negatives_prune_locked(fs, now);
	if (x) {
		x->expires_ms = expires;
	} else if (sbx_hashmap_count(&fs->negatives) >= FS_NEGATIVES_MAX) {
		/* Not listed, so not long-lived either. */
		timeout = FS_TIMEOUT_BLIND;
	} else {
		size_t len = strlen(name);

		x = sbx_xmalloc(sizeof(*x) + len + 1);
		sbx_hashmap_node_init(&x->hnode);
		x->expires_ms = expires;
		x->parent = parent;
		memcpy(x->name, name, len + 1);
		sbx_hashmap_insert(&fs->negatives, &x->hnode,
				   negative_hash(parent, name));
	}
	pthread_mutex_unlock(&fs->neg_lock);
	return timeout;
}

void fs_negative_drop(struct fs *fs, fuse_ino_t parent, const char *name)
{
	struct fs_negative *x;

	pthread_mutex_lock(&fs->neg_lock);
	x = negative_find(fs, parent, name);
	if (x)
		sbx_hashmap_remove(&fs->negatives, &x->hnode);
	pthread_mutex_unlock(&fs->neg_lock);
	free(x);
}

/* Take the whole list (neg_lock held by the caller). */
static struct sbx_hashmap negatives_take_locked(struct fs *fs)
{
	struct sbx_hashmap all = fs->negatives;

	sbx_hashmap_init(&fs->negatives);
	return all;
}

void fs_negatives_invalidate(struct fs *fs)
{
	struct sbx_hashmap all;
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *n;

	pthread_mutex_lock(&fs->neg_lock);
	all = negatives_take_locked(fs);
	pthread_mutex_unlock(&fs->neg_lock);
	/* Outside the lock: a notification may wait for a LOOKUP in that
	 * directory, whose handler takes neg_lock. */
	sbx_hashmap_iter_init(&it, &all);
	while ((n = sbx_hashmap_next(&it))) {
		struct fs_negative *x =
			sbx_hashmap_entry(n, struct fs_negative, hnode);

		fuse_lowlevel_notify_inval_entry(fs->se, x->parent, x->name,
						 strlen(x->name));
		free(x);
	}
	sbx_hashmap_fini(&all);
}

void fs_negatives_init(struct fs *fs)
{
	pthread_mutex_init(&fs->neg_lock, NULL);
	sbx_hashmap_init(&fs->negatives);
	fs->neg_prune_at = 0;
}

void fs_negatives_fini(struct fs *fs)
{
	struct sbx_hashmap all = negatives_take_locked(fs);
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *n;

	sbx_hashmap_iter_init(&it, &all);
	while ((n = sbx_hashmap_next(&it)))
		free(sbx_hashmap_entry(n, struct fs_negative, hnode));
	sbx_hashmap_fini(&all);
	pthread_mutex_destroy(&fs->neg_lock);
}
