/* The intrusive hash table and FNV-1a; see sbx/hashmap.h. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "sbx/hashmap.h"
#include "sbx/xmalloc.h"

#define FIRST_BUCKETS 16

uint64_t sbx_fnv1a_more(uint64_t h, const void *p, size_t len)
{
	const unsigned char *s = p;

	for (size_t i = 0; i < len; i++)
		h = (h ^ s[i]) * SBX_FNV1A_PRIME;
	return h;
}

uint64_t sbx_fnv1a(const void *p, size_t len)
{
	return sbx_fnv1a_more(SBX_FNV1A_INIT, p, len);
}

uint64_t sbx_fnv1a_str(const char *s)
{
	uint64_t h = SBX_FNV1A_INIT;

	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * SBX_FNV1A_PRIME;
	return h;
}

/*
 * FNV's low bits are weak for short keys that differ only at the end, and
 * callers may pass raw numbers (inode numbers) as hashes: fold the high bits
 * in before masking (the finaliser of splitmix64).
 */
static size_t bucket_of(uint64_t hash, size_t nbuckets)
{
	hash ^= hash >> 30;
	hash *= 0xbf58476d1ce4e5b9ULL;
	hash ^= hash >> 27;
	hash *= 0x94d049bb133111ebULL;
	hash ^= hash >> 31;
	return (size_t)(hash & (nbuckets - 1));
}

static void link_head(struct sbx_hashmap_node **head,
		      struct sbx_hashmap_node *n)
{
	n->next = *head;
	if (n->next)
		n->next->pprev = &n->next;
	*head = n;
	n->pprev = head;
}

static void grow(struct sbx_hashmap *m)
{
	size_t nb = m->nbuckets ? m->nbuckets * 2 : FIRST_BUCKETS;
	struct sbx_hashmap_node **nbk = sbx_xcalloc(nb, sizeof(*nbk));

	for (size_t i = 0; i < m->nbuckets; i++) {
		struct sbx_hashmap_node *n = m->buckets[i], *next;

		for (; n; n = next) {
			next = n->next;
			link_head(&nbk[bucket_of(n->hash, nb)], n);
		}
	}
	free(m->buckets);
	m->buckets = nbk;
	m->nbuckets = nb;
}

void sbx_hashmap_init(struct sbx_hashmap *m)
{
	memset(m, 0, sizeof(*m));
}

void sbx_hashmap_fini(struct sbx_hashmap *m)
{
	if (m) {
		free(m->buckets);
		sbx_hashmap_init(m);
	}
}

void sbx_hashmap_node_init(struct sbx_hashmap_node *n)
{
	memset(n, 0, sizeof(*n));
}

bool sbx_hashmap_node_linked(const struct sbx_hashmap_node *n)
{
	return n->pprev != NULL;
}

void sbx_hashmap_insert(struct sbx_hashmap *m, struct sbx_hashmap_node *n,
			uint64_t hash)
{
	if (n->pprev)
		abort(); /* a bug: linked twice would make a chain a cycle */
	if (m->count >= m->nbuckets)
		grow(m);
	n->hash = hash;
	link_head(&m->buckets[bucket_of(hash, m->nbuckets)], n);
	m->count++;
}

void sbx_hashmap_remove(struct sbx_hashmap *m, struct sbx_hashmap_node *n)
{
	if (!n->pprev)
		return;
	*n->pprev = n->next;
	if (n->next)
		n->next->pprev = n->pprev;
	n->next = NULL;
	n->pprev = NULL;
	m->count--;
}

static struct sbx_hashmap_node *match(struct sbx_hashmap_node *n,
				      uint64_t hash, sbx_hashmap_eq_fn eq,
				      const void *key)
{
	for (; n; n = n->next)
		if (n->hash == hash && (!eq || eq(n, key)))
			return n;
	return NULL;
}

struct sbx_hashmap_node *sbx_hashmap_find(const struct sbx_hashmap *m,
					  uint64_t hash, sbx_hashmap_eq_fn eq,
					  const void *key)
{
	if (!m->count)
		return NULL;
	return match(m->buckets[bucket_of(hash, m->nbuckets)], hash, eq, key);
}

struct sbx_hashmap_node *
sbx_hashmap_find_next(const struct sbx_hashmap_node *prev, sbx_hashmap_eq_fn eq,
		      const void *key)
{
	return match(prev->next, prev->hash, eq, key);
}

size_t sbx_hashmap_count(const struct sbx_hashmap *m)
{
	return m->count;
}

void sbx_hashmap_iter_init(struct sbx_hashmap_iter *it,
			   const struct sbx_hashmap *m)
{
	it->m = m;
	it->bucket = 0;
	it->next = NULL;
}

struct sbx_hashmap_node *sbx_hashmap_next(struct sbx_hashmap_iter *it)
{
	struct sbx_hashmap_node *n = it->next;

	while (!n && it->bucket < it->m->nbuckets)
		n = it->m->buckets[it->bucket++];
	if (n)
		it->next = n->next; /* read now: n may be freed by the caller */
	return n;
}
