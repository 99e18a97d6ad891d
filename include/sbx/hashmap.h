/*
 * One intrusive hash table and one string hash (FNV-1a, 64 bit) for the tree.
 *
 * The table is a chained hash of `struct sbx_hashmap_node`s that the caller
 * embeds in its own elements (the Linux hlist pattern): no allocation per
 * element, O(1) removal of an element one holds, and an element may sit in
 * several maps at once through several embedded nodes.  Get the element
 * back from a node with sbx_hashmap_entry() (container_of).
 *
 * Keys are the caller's business: it computes a 64-bit hash (with sbx_fnv1a()
 * or from bytes that are already random, such as an object id) and, for
 * lookups, passes an equality callback that compares an element with its
 * key.  The map never compares keys itself, so it stores equal keys as often
 * as they are inserted: a caller that wants a set looks up first.
 *
 * Memory: the map owns its bucket array only, never the elements.
 * sbx_hashmap_fini() frees the buckets and leaves the elements alone; free
 * them first (sbx_hashmap_next() tolerates freeing the element it just
 * returned).  Allocation failure aborts (sbx/xmalloc.h), so no function here
 * can fail.
 *
 * Growth: the bucket array is allocated at the first insertion (16 buckets)
 * and doubles when the map holds more elements than buckets, so an empty map
 * costs no memory (one per directory is fine).  It never shrinks.
 *
 * Threads: no locking.  The caller serialises every call on one map, reads
 * included (a lookup may run during another thread's growth otherwise).
 */
#ifndef SBX_HASHMAP_H
#define SBX_HASHMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- FNV-1a -------------------------------------------------------------- */

/*
 * The offset basis and the FNV prime (64 bit).  The basis is the one this
 * tree has always used, 1469598103934665603, one digit short of the published
 * 14695981039346656037: any nonzero basis spreads as well, and these hashes
 * name things that outlive a process (pcommon_hash_hex() names directories
 * and cluster objects, the remote provider derives st_dev from one), so the
 * value must never change.
 */
#define SBX_FNV1A_INIT 1469598103934665603ULL
#define SBX_FNV1A_PRIME 1099511628211ULL

/* FNV-1a of `len` bytes at `p` (p may be NULL when len is 0). */
uint64_t sbx_fnv1a(const void *p, size_t len);

/*
 * Continue a hash `h` (SBX_FNV1A_INIT or an earlier result) over more bytes:
 * sbx_fnv1a_more(sbx_fnv1a(a, n), b, m) == sbx_fnv1a of a and b concatenated.
 */
uint64_t sbx_fnv1a_more(uint64_t h, const void *p, size_t len);

/* FNV-1a of a C string without its NUL. */
uint64_t sbx_fnv1a_str(const char *s);

/* ---- the map ------------------------------------------------------------- */

/* Embed one in each element; the map owns its fields while it is linked. */
struct sbx_hashmap_node {
	struct sbx_hashmap_node *next;   /* bucket chain */
	struct sbx_hashmap_node **pprev; /* what points at us; NULL: unlinked */
	uint64_t hash;
};

struct sbx_hashmap {
	struct sbx_hashmap_node **buckets; /* NULL until the first insertion */
	size_t nbuckets;                   /* 0 or a power of two */
	size_t count;                      /* elements linked */
};

/* An empty map, for static or designated initialisation. */
#define SBX_HASHMAP_INIT { NULL, 0, 0 }

/* The element of type `type` whose member `member` is the node `ptr`. */
#define sbx_hashmap_entry(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/*
 * Does the element behind `node` equal `key`?  `key` is whatever the caller
 * passed to sbx_hashmap_find(); called only for nodes of the same hash.
 */
typedef bool (*sbx_hashmap_eq_fn)(const struct sbx_hashmap_node *node,
				  const void *key);

/* Make `m` empty (no memory is allocated). */
void sbx_hashmap_init(struct sbx_hashmap *m);

/*
 * Free the bucket array and make `m` empty.  Linked elements are not touched
 * and their nodes are left stale: free or re-init them.  Accepts NULL.
 */
void sbx_hashmap_fini(struct sbx_hashmap *m);

/* Mark a node unlinked (for elements that may never be inserted). */
void sbx_hashmap_node_init(struct sbx_hashmap_node *n);

/* Is the node linked into a map?  (Nodes start zeroed or from node_init.) */
bool sbx_hashmap_node_linked(const struct sbx_hashmap_node *n);

/*
 * Link `n` under `hash`.  `n` must not be linked already (that would make a
 * chain a cycle: it aborts instead).  Equal keys are not detected.
 */
void sbx_hashmap_insert(struct sbx_hashmap *m, struct sbx_hashmap_node *n,
			uint64_t hash);

/*
 * Unlink `n` from `m` in O(1).  A node that is not linked is left alone (so
 * removing twice is harmless).  `n` must not be linked in another map.
 */
void sbx_hashmap_remove(struct sbx_hashmap *m, struct sbx_hashmap_node *n);

/*
 * The first node of hash `hash` for which eq(node, key) holds, or NULL.
 * `eq` NULL matches every node of that hash.
 */
struct sbx_hashmap_node *sbx_hashmap_find(const struct sbx_hashmap *m,
					  uint64_t hash, sbx_hashmap_eq_fn eq,
					  const void *key);

/*
 * The next node after `prev` (a result of sbx_hashmap_find() with the same
 * arguments) that matches too, or NULL: walks every element with one key.
 */
struct sbx_hashmap_node *
sbx_hashmap_find_next(const struct sbx_hashmap_node *prev, sbx_hashmap_eq_fn eq,
		      const void *key);

/* Number of elements linked. */
size_t sbx_hashmap_count(const struct sbx_hashmap *m);

/*
 * Iteration in no particular order:
 *
 *	struct sbx_hashmap_iter it;
 *	struct sbx_hashmap_node *n;
 *
 *	sbx_hashmap_iter_init(&it, m);
 *	while ((n = sbx_hashmap_next(&it)))
 *		...;
 *
 * The node just returned may be removed from the map or freed; inserting
 * into the map, or removing other nodes, during the walk is not allowed.
 */
struct sbx_hashmap_iter {
	const struct sbx_hashmap *m;
	size_t bucket;                 /* next bucket to enter */
	struct sbx_hashmap_node *next; /* next node in the current chain */
};

void sbx_hashmap_iter_init(struct sbx_hashmap_iter *it,
			   const struct sbx_hashmap *m);
struct sbx_hashmap_node *sbx_hashmap_next(struct sbx_hashmap_iter *it);

#endif /* SBX_HASHMAP_H */
