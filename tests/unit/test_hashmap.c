/* Unit tests: lib/hashmap.c (intrusive hash table, FNV-1a). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sbx/hashmap.h"

#include "pcommon.h"

struct item {
	int key;
	int val;
	struct sbx_hashmap_node node;
};

static bool item_eq(const struct sbx_hashmap_node *n, const void *key)
{
	return sbx_hashmap_entry(n, struct item, node)->key ==
	       *(const int *)key;
}

static uint64_t key_hash(int k)
{
	return sbx_fnv1a(&k, sizeof(k));
}

static struct item *find(struct sbx_hashmap *m, int k)
{
	struct sbx_hashmap_node *n = sbx_hashmap_find(m, key_hash(k), item_eq,
						      &k);

	return n ? sbx_hashmap_entry(n, struct item, node) : NULL;
}

static void test_fnv_known_values(void **state)
{
	char hex[17];

	(void)state;
	/* The tree's basis: the empty input hashes to it. */
	assert_true(sbx_fnv1a("", 0) == SBX_FNV1A_INIT);
	assert_true(sbx_fnv1a(NULL, 0) == SBX_FNV1A_INIT);
	assert_true(sbx_fnv1a_str("") == SBX_FNV1A_INIT);
	/* One step by hand: (basis ^ 'a') * prime. */
	assert_true(sbx_fnv1a("a", 1) ==
		    (uint64_t)((SBX_FNV1A_INIT ^ 'a') * SBX_FNV1A_PRIME));
	/* Pinned: these values name things on disk; they must never change. */
	snprintf(hex, sizeof(hex), "%016llx",
		 (unsigned long long)sbx_fnv1a_str("sandbox"));
	assert_string_equal(hex, "852d03bf0f50cb06");
}

/*
 * pcommon_hash_hex() names state directories and cluster objects; it moved
 * onto sbx_fnv1a() and must give the hex it always gave (computed with the
 * hand-written loop it replaced).
 */
static void test_pcommon_hash_hex_pinned(void **state)
{
	char hex[17];

	(void)state;
	pcommon_hash_hex(hex, "host", "/home");
	assert_string_equal(hex, "8475cb7698cf4e6f");
	pcommon_hash_hex(hex, "host", NULL);
	assert_string_equal(hex, "1416e768580e38b7");
}

static void test_fnv_more_and_str(void **state)
{
	const char *s = "hello, world";
	uint64_t h;

	(void)state;
	assert_true(sbx_fnv1a_str(s) == sbx_fnv1a(s, strlen(s)));
	h = sbx_fnv1a(s, 5);
	h = sbx_fnv1a_more(h, s + 5, strlen(s) - 5);
	assert_true(h == sbx_fnv1a(s, strlen(s)));
	assert_true(sbx_fnv1a_more(SBX_FNV1A_INIT, s, 3) == sbx_fnv1a(s, 3));
	assert_true(sbx_fnv1a_str("ab") != sbx_fnv1a_str("ba"));
}

static void test_empty(void **state)
{
	struct sbx_hashmap m = SBX_HASHMAP_INIT;
	struct sbx_hashmap_iter it;
	int k = 1;

	(void)state;
	assert_null(sbx_hashmap_find(&m, key_hash(k), item_eq, &k));
	assert_int_equal(sbx_hashmap_count(&m), 0);
	sbx_hashmap_iter_init(&it, &m);
	assert_null(sbx_hashmap_next(&it));
	sbx_hashmap_fini(&m);
	sbx_hashmap_fini(NULL);
	assert_null(m.buckets);
}

static void test_insert_find_remove_grow(void **state)
{
	enum { N = 5000 };
	struct sbx_hashmap m;
	struct item *items = calloc(N, sizeof(*items));

	(void)state;
	sbx_hashmap_init(&m);
	for (int i = 0; i < N; i++) {
		items[i].key = i * 7;
		items[i].val = i;
		assert_false(sbx_hashmap_node_linked(&items[i].node));
		sbx_hashmap_insert(&m, &items[i].node, key_hash(i * 7));
		assert_true(sbx_hashmap_node_linked(&items[i].node));
	}
	assert_int_equal(sbx_hashmap_count(&m), N);
	assert_true(m.nbuckets >= N); /* grew */
	for (int i = 0; i < N; i++) {
		struct item *it = find(&m, i * 7);

		assert_int_equal(it ? it->val : -1, i);
	}
	assert_null(find(&m, 3));
	/* Remove every other one, in O(1), from any position in a chain. */
	for (int i = 0; i < N; i += 2)
		sbx_hashmap_remove(&m, &items[i].node);
	assert_int_equal(sbx_hashmap_count(&m), N / 2);
	for (int i = 0; i < N; i++)
		assert_true((find(&m, i * 7) != NULL) == (i % 2 == 1));
	/* Removing again is a no-op. */
	sbx_hashmap_remove(&m, &items[0].node);
	assert_int_equal(sbx_hashmap_count(&m), N / 2);
	/* A removed node can go back in. */
	sbx_hashmap_insert(&m, &items[0].node, key_hash(0));
	assert_non_null(find(&m, 0));
	sbx_hashmap_fini(&m);
	free(items);
}

/* Every element with one hash must stay reachable: force collisions. */
static void test_collisions_and_find_next(void **state)
{
	struct sbx_hashmap m = SBX_HASHMAP_INIT;
	struct item a[40];
	struct sbx_hashmap_node *n;
	int k = 5, seen = 0;

	(void)state;
	memset(a, 0, sizeof(a));
	for (int i = 0; i < 40; i++) {
		a[i].key = i < 10 ? 5 : i; /* ten equal keys */
		a[i].val = i;
		sbx_hashmap_insert(&m, &a[i].node, 42); /* one hash for all */
	}
	for (n = sbx_hashmap_find(&m, 42, item_eq, &k); n;
	     n = sbx_hashmap_find_next(n, item_eq, &k))
		seen++;
	assert_int_equal(seen, 10);
	for (int i = 10; i < 40; i++) {
		k = i;
		n = sbx_hashmap_find(&m, 42, item_eq, &k);
		assert_ptr_equal(n, &a[i].node);
	}
	/* eq NULL: any node of the hash. */
	assert_non_null(sbx_hashmap_find(&m, 42, NULL, NULL));
	assert_null(sbx_hashmap_find(&m, 43, NULL, NULL));
	/* Remove the middle of the chain and its ends. */
	sbx_hashmap_remove(&m, &a[20].node);
	sbx_hashmap_remove(&m, &a[39].node);
	sbx_hashmap_remove(&m, &a[0].node);
	k = 20;
	assert_null(sbx_hashmap_find(&m, 42, item_eq, &k));
	k = 21;
	assert_ptr_equal(sbx_hashmap_find(&m, 42, item_eq, &k), &a[21].node);
	assert_int_equal(sbx_hashmap_count(&m), 37);
	sbx_hashmap_fini(&m);
}

/* Iteration visits each element once and survives freeing as it goes. */
static void test_iterate_and_free(void **state)
{
	enum { N = 300 };
	struct sbx_hashmap m = SBX_HASHMAP_INIT;
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *n;
	unsigned char seen[N] = { 0 };
	size_t count = 0;

	(void)state;
	for (int i = 0; i < N; i++) {
		struct item *x = calloc(1, sizeof(*x));

		x->key = i;
		sbx_hashmap_insert(&m, &x->node, key_hash(i));
	}
	sbx_hashmap_iter_init(&it, &m);
	while ((n = sbx_hashmap_next(&it))) {
		struct item *x = sbx_hashmap_entry(n, struct item, node);

		assert_int_equal(seen[x->key], 0);
		seen[x->key] = 1;
		count++;
	}
	assert_int_equal(count, N);
	/* Remove and free each element while walking. */
	sbx_hashmap_iter_init(&it, &m);
	while ((n = sbx_hashmap_next(&it))) {
		sbx_hashmap_remove(&m, n);
		free(sbx_hashmap_entry(n, struct item, node));
	}
	assert_int_equal(sbx_hashmap_count(&m), 0);
	sbx_hashmap_fini(&m);
}

/* An element in two maps at once, through two nodes. */
struct twice {
	int ino;
	const char *path;
	struct sbx_hashmap_node by_ino, by_path;
};

static bool path_eq(const struct sbx_hashmap_node *n, const void *key)
{
	return strcmp(sbx_hashmap_entry(n, struct twice, by_path)->path,
		      key) == 0;
}

static void test_two_maps(void **state)
{
	struct sbx_hashmap ino = SBX_HASHMAP_INIT, path = SBX_HASHMAP_INIT;
	struct twice t = { .ino = 9, .path = "a/b" };
	struct sbx_hashmap_node *n;

	(void)state;
	sbx_hashmap_insert(&ino, &t.by_ino, 9);
	sbx_hashmap_insert(&path, &t.by_path, sbx_fnv1a_str(t.path));
	n = sbx_hashmap_find(&path, sbx_fnv1a_str("a/b"), path_eq, "a/b");
	assert_ptr_equal(sbx_hashmap_entry(n, struct twice, by_path), &t);
	sbx_hashmap_remove(&ino, &t.by_ino);
	assert_null(sbx_hashmap_find(&ino, 9, NULL, NULL));
	assert_non_null(sbx_hashmap_find(&path, sbx_fnv1a_str("a/b"), path_eq,
					 "a/b"));
	sbx_hashmap_fini(&ino);
	sbx_hashmap_fini(&path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fnv_known_values),
		cmocka_unit_test(test_fnv_more_and_str),
		cmocka_unit_test(test_pcommon_hash_hex_pinned),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_insert_find_remove_grow),
		cmocka_unit_test(test_collisions_and_find_next),
		cmocka_unit_test(test_iterate_and_free),
		cmocka_unit_test(test_two_maps),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
