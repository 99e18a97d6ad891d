/*
 * Unit tests: fs/inode.c, the daemon's inode table (nlookup bookkeeping and
 * dedup by the provider's (st_dev, st_ino)).  The provider is a fake whose
 * nodes are heap objects freed by forget, so a node forgotten twice or
 * never shows as a count (and under ASan as an error or a leak).
 */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "sbx/fs.h"
#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../fs/fs_i.h"

struct fake_node {
	int id;
};

static int forgotten;
static bool say_stale;

static void f_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	(void)sb;
	forgotten++;
	free(node);
}

static bool f_node_stale(struct sbx_sandbox *sb, struct sbx_node *old,
			 struct sbx_node *fresh, const struct stat *st)
{
	(void)sb;
	(void)old;
	(void)fresh;
	(void)st;
	return say_stale;
}

static const struct sbx_sandbox_ops fake_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.forget = f_forget,
	.node_stale = f_node_stale,
};

struct env {
	struct sbx_sandbox sb;
	struct fs fs;
};

static struct sbx_node *node(int id)
{
	struct fake_node *n = calloc(1, sizeof(*n));

	n->id = id;
	return (struct sbx_node *)n;
}

static struct stat st_of(dev_t dev, ino_t ino)
{
	struct stat st;

	memset(&st, 0, sizeof(st));
	st.st_dev = dev;
	st.st_ino = ino;
	st.st_mode = S_IFREG | 0644;
	st.st_nlink = 1;
	return st;
}

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	e->sb.ops = &fake_ops;
	e->fs.sb = &e->sb;
	pthread_mutex_init(&e->fs.lock, NULL);
	fs_inodes_init(&e->fs);
	e->fs.root.node = node(0);
	e->fs.root.dev = 1;
	e->fs.root.ino = 1;
	e->fs.root.nlookup = 2;
	forgotten = 0;
	say_stale = false;
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	fs_inodes_fini(&e->fs);
	/* The daemon forgets the root's node itself (fs.c). */
	f_forget(&e->sb, e->fs.root.node);
	pthread_mutex_destroy(&e->fs.lock);
	free(e);
	return 0;
}

static struct fs_inode *remember(struct env *e, fuse_ino_t parent,
				 const char *name, int id, dev_t dev, ino_t ino)
{
	struct stat st = st_of(dev, ino);

	return fs_inode_remember(&e->fs, parent, name, node(id), &st);
}

/* A new identity gets an inode whose address is its id; find sees it. */
static void test_remember_new_and_find(void **state)
{
	struct env *e = *state;
	struct fs_inode *in = remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	fuse_ino_t id = fs_inode_id(&e->fs, in);
	unsigned writers = 99;

	assert_int_equal(in->nlookup, 1);
	assert_string_equal(in->name, "a");
	assert_int_equal(in->parent, FUSE_ROOT_ID);
	assert_true(id != FUSE_ROOT_ID);
	assert_ptr_equal(fs_inode_get(&e->fs, id), in);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, &writers), id);
	assert_int_equal(writers, 0);
	assert_int_equal(fs_inode_find(&e->fs, 1, 11, NULL), 0);
	assert_int_equal(fs_inode_find(&e->fs, 2, 10, NULL), 0);
	assert_int_equal(forgotten, 0);
}

/* Hard links and repeated lookups share one inode; the extra node goes. */
static void test_same_identity_shares_inode(void **state)
{
	struct env *e = *state;
	struct fs_inode *a = remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	struct fs_inode *b = remember(e, FUSE_ROOT_ID, "b", 2, 1, 10);

	assert_ptr_equal(a, b);
	assert_int_equal(a->nlookup, 2);
	assert_int_equal(forgotten, 1);
	/* The last name seen is kept (for the overflow replay). */
	assert_string_equal(a->name, "b");
	assert_int_equal(((struct fake_node *)a->node)->id, 1);
}

/* The root's identity maps to FUSE_ROOT_ID, never to a new inode. */
static void test_root_identity(void **state)
{
	struct env *e = *state;
	struct fs_inode *r = remember(e, FUSE_ROOT_ID, "..", 7, 1, 1);

	assert_ptr_equal(r, &e->fs.root);
	assert_int_equal(fs_inode_id(&e->fs, r), FUSE_ROOT_ID);
	assert_ptr_equal(fs_inode_get(&e->fs, FUSE_ROOT_ID), &e->fs.root);
	assert_int_equal(e->fs.root.nlookup, 3);
	assert_null(e->fs.root.name); /* the root keeps no name */
	assert_int_equal(forgotten, 1);
	assert_int_equal(fs_inode_find(&e->fs, 1, 1, NULL), FUSE_ROOT_ID);
	/* Forgetting the root is a no-op. */
	fs_inode_forget(&e->fs, FUSE_ROOT_ID, 3);
	assert_int_equal(e->fs.root.nlookup, 3);
}

/* The inode (and its node) go when the kernel's count reaches zero. */
static void test_forget_frees_at_zero(void **state)
{
	struct env *e = *state;
	struct fs_inode *in = remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	fuse_ino_t id = fs_inode_id(&e->fs, in);

	remember(e, FUSE_ROOT_ID, "a", 2, 1, 10);
	remember(e, FUSE_ROOT_ID, "a", 3, 1, 10);
	assert_int_equal(forgotten, 2);
	fs_inode_forget(&e->fs, id, 2);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, NULL), id);
	assert_int_equal(forgotten, 2);
	fs_inode_forget(&e->fs, id, 1);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, NULL), 0);
	assert_int_equal(forgotten, 3);
	/* The identity can come back as a new inode. */
	in = remember(e, FUSE_ROOT_ID, "a", 4, 1, 10);
	assert_int_equal(in->nlookup, 1);
	assert_int_equal(((struct fake_node *)in->node)->id, 4);
}

/*
 * A reused inode number (node_stale says so): the new file gets its own
 * inode; the old one lives on, unfindable, until the kernel forgets it.
 */
static void test_stale_identity_gets_new_inode(void **state)
{
	struct env *e = *state;
	struct fs_inode *old = remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	fuse_ino_t old_id = fs_inode_id(&e->fs, old), new_id;
	struct fs_inode *fresh;

	say_stale = true;
	fresh = remember(e, FUSE_ROOT_ID, "a", 2, 1, 10);
	say_stale = false;
	new_id = fs_inode_id(&e->fs, fresh);
	assert_ptr_not_equal(fresh, old);
	assert_int_equal(forgotten, 0);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, NULL), new_id);
	/* The old inode still serves the kernel's references. */
	assert_ptr_equal(fs_inode_get(&e->fs, old_id), old);
	fs_inode_forget(&e->fs, old_id, 1);
	assert_int_equal(forgotten, 1);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, NULL), new_id);
	fs_inode_forget(&e->fs, new_id, 1);
	assert_int_equal(forgotten, 2);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, NULL), 0);
}

/*
 * A file the create made: the inode held under its number is a removed
 * file's, even where node_stale would say otherwise (the cache's beliefs
 * about a removed file's names can be out of date).
 */
static void test_made_file_gets_new_inode(void **state)
{
	struct env *e = *state;
	struct fs_inode *old = remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	fuse_ino_t old_id = fs_inode_id(&e->fs, old);
	struct stat st = st_of(1, 10);
	struct fs_inode *made;

	say_stale = false;
	made = fs_inode_remember_new(&e->fs, FUSE_ROOT_ID, "b", node(2), &st);
	assert_ptr_not_equal(made, old);
	assert_int_equal(((struct fake_node *)made->node)->id, 2);
	assert_int_equal(forgotten, 0);
	assert_int_equal(fs_inode_find(&e->fs, 1, 10, NULL),
			 fs_inode_id(&e->fs, made));
	/* The old one serves the kernel's references until forgotten. */
	assert_ptr_equal(fs_inode_get(&e->fs, old_id), old);
	fs_inode_forget(&e->fs, old_id, 1);
	assert_int_equal(forgotten, 1);
	fs_inode_forget(&e->fs, fs_inode_id(&e->fs, made), 1);
	assert_int_equal(forgotten, 2);
}

/* Stale inodes still held at exit are freed by fini (no leak). */
static void test_fini_frees_stale_and_live(void **state)
{
	struct env *e = *state;

	remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	say_stale = true;
	remember(e, FUSE_ROOT_ID, "a", 2, 1, 10);
	say_stale = false;
	remember(e, FUSE_ROOT_ID, "b", 3, 1, 11);
	fs_inodes_fini(&e->fs);
	assert_int_equal(forgotten, 3);
	fs_inodes_init(&e->fs); /* for teardown */
}

static void test_writers(void **state)
{
	struct env *e = *state;
	struct fs_inode *in = remember(e, FUSE_ROOT_ID, "a", 1, 1, 10);
	unsigned w = 0;

	fs_inode_writers(&e->fs, in, 1);
	fs_inode_writers(&e->fs, in, 1);
	assert_int_not_equal(fs_inode_find(&e->fs, 1, 10, &w), 0);
	assert_int_equal(w, 2);
	fs_inode_writers(&e->fs, in, -1);
	fs_inode_find(&e->fs, 1, 10, &w);
	assert_int_equal(w, 1);
}

struct seen {
	size_t n;
	bool root;
	unsigned char *names; /* names[i] set when "f<i>" was seen */
};

static void count_inode(struct fs *fs, fuse_ino_t ino, fuse_ino_t parent,
			const char *name, void *payload)
{
	struct seen *s = payload;

	(void)fs;
	s->n++;
	if (ino == FUSE_ROOT_ID) {
		s->root = true;
		return;
	}
	if (name && name[0] == 'f' && parent == FUSE_ROOT_ID)
		s->names[strtol(name + 1, NULL, 10)]++;
}

/* Many inodes: the table grows, every one stays findable and listed. */
static void test_many_and_foreach(void **state)
{
	enum { N = 20000 };
	struct env *e = *state;
	fuse_ino_t *ids = calloc(N, sizeof(*ids));
	struct seen s = { 0, false, calloc(N, 1) };
	char name[16];

	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "f%d", i);
		/* Two devices, the same inode numbers: distinct files. */
		struct fs_inode *in = remember(e, FUSE_ROOT_ID, name, i,
					       2 + (i & 1), 100 + i / 2);

		ids[i] = fs_inode_id(&e->fs, in);
	}
	for (int i = 0; i < N; i++)
		assert_int_equal(fs_inode_find(&e->fs, 2 + (i & 1),
					       100 + i / 2, NULL), ids[i]);
	fs_inode_foreach(&e->fs, count_inode, &s);
	assert_int_equal(s.n, N + 1);
	assert_true(s.root);
	for (int i = 0; i < N; i++)
		assert_int_equal(s.names[i], 1);
	/* Forget half of them. */
	for (int i = 0; i < N; i += 2)
		fs_inode_forget(&e->fs, ids[i], 1);
	for (int i = 0; i < N; i++)
		assert_int_equal(fs_inode_find(&e->fs, 2 + (i & 1),
					       100 + i / 2, NULL) != 0,
				 i % 2 == 1);
	assert_int_equal(forgotten, N / 2);
	free(s.names);
	free(ids);
}

/* fs_names_take's answer for (parent, name), as a count and the first. */
static size_t take(struct env *e, fuse_ino_t parent, const char *name,
		   fuse_ino_t *first)
{
	fuse_ino_t out[8];
	size_t n = fs_names_take(&e->fs, parent, name, out, 8);

	*first = n ? out[0] : 0;
	return n;
}

/*
 * The name index: an event about a name reaches the inode the kernel
 * knows under it (a hard-linked file's other names need their link count
 * again), under every name it was handed out as, and it follows renames
 * and removals made through the mount.
 */
static void test_names_find_the_inode_of_a_name(void **state)
{
	struct env *e = *state;
	struct fs_inode *f = remember(e, FUSE_ROOT_ID, "f", 1, 1, 10);
	struct fs_inode *g = remember(e, FUSE_ROOT_ID, "g", 2, 1, 10);
	struct fs_inode *x;
	fuse_ino_t id = fs_inode_id(&e->fs, f), got;

	assert_ptr_equal(f, g); /* links share the inode */
	assert_int_equal(take(e, FUSE_ROOT_ID, "g", &got), 1);
	assert_int_equal(got, id);
	/* taken: the kernel's dentry goes with the event */
	assert_int_equal(take(e, FUSE_ROOT_ID, "g", &got), 0);
	assert_int_equal(take(e, FUSE_ROOT_ID, "f", &got), 1);
	assert_int_equal(got, id);
	assert_int_equal(take(e, id, "f", &got), 0); /* another directory */

	/* a rename through the mount moves the name */
	(void)remember(e, FUSE_ROOT_ID, "f", 3, 1, 10);
	fs_names_renamed(&e->fs, FUSE_ROOT_ID, "f", FUSE_ROOT_ID, "h", 0);
	assert_int_equal(take(e, FUSE_ROOT_ID, "f", &got), 0);
	assert_int_equal(take(e, FUSE_ROOT_ID, "h", &got), 1);
	assert_int_equal(got, id);

	/* an exchange swaps; a removal forgets */
	x = remember(e, FUSE_ROOT_ID, "x", 4, 1, 20);
	(void)remember(e, FUSE_ROOT_ID, "f", 5, 1, 10);
	fs_names_renamed(&e->fs, FUSE_ROOT_ID, "f", FUSE_ROOT_ID, "x",
			 RENAME_EXCHANGE);
	assert_int_equal(take(e, FUSE_ROOT_ID, "x", &got), 1);
	assert_int_equal(got, id);
	assert_int_equal(take(e, FUSE_ROOT_ID, "f", &got), 1);
	assert_int_equal(got, fs_inode_id(&e->fs, x));
	(void)remember(e, FUSE_ROOT_ID, "x", 6, 1, 20);
	fs_names_removed(&e->fs, FUSE_ROOT_ID, "x");
	assert_int_equal(take(e, FUSE_ROOT_ID, "x", &got), 0);

	/* forgotten inodes leave the index (ASan: nothing leaks) */
	(void)remember(e, FUSE_ROOT_ID, "y", 7, 1, 20);
	fs_inode_forget(&e->fs, fs_inode_id(&e->fs, x), x->nlookup);
	assert_int_equal(take(e, FUSE_ROOT_ID, "y", &got), 0);
}

/* A file looked up under very many names keeps the newest few. */
static void test_names_are_bounded_per_inode(void **state)
{
	struct env *e = *state;
	char name[16];
	fuse_ino_t got;

	for (int i = 0; i < FS_NAMES_PER_INODE + 5; i++) {
		snprintf(name, sizeof(name), "n%d", i);
		(void)remember(e, FUSE_ROOT_ID, name, 100 + i, 1, 30);
	}
	assert_int_equal(take(e, FUSE_ROOT_ID, "n0", &got), 0);
	snprintf(name, sizeof(name), "n%d", FS_NAMES_PER_INODE + 4);
	assert_int_equal(take(e, FUSE_ROOT_ID, name, &got), 1);
}

static bool keep_kernel_copy;
static int attr_changed_calls;

static bool f_attr_changed(struct sbx_sandbox *sb, struct sbx_node *node)
{
	(void)sb;
	(void)node;
	attr_changed_calls++;
	return !keep_kernel_copy;
}

/* The provider hears of every inode an event reaches, and may ask that the
 * kernel keep its copy of the attributes. */
static void test_names_tell_the_provider(void **state)
{
	struct env *e = *state;
	struct sbx_sandbox_ops ops = fake_ops;
	struct fs_inode *f;
	fuse_ino_t got;

	ops.attr_changed = f_attr_changed;
	e->sb.ops = &ops;
	attr_changed_calls = 0;
	f = remember(e, FUSE_ROOT_ID, "f", 1, 1, 10);
	keep_kernel_copy = true;
	assert_int_equal(take(e, FUSE_ROOT_ID, "f", &got), 0);
	assert_int_equal(fs_inode_attr_changed(&e->fs, 1, 10), 0);
	assert_int_equal(attr_changed_calls, 2);
	keep_kernel_copy = false;
	assert_int_equal(fs_inode_attr_changed(&e->fs, 1, 10),
			 fs_inode_id(&e->fs, f));
	assert_int_equal(fs_inode_attr_changed(&e->fs, 1, 11), 0);
	assert_int_equal(attr_changed_calls, 3);
	e->sb.ops = &fake_ops; /* teardown forgets through it */
}

/* The caching decorator needs a path-based sandbox (node_at). */
static void test_cache_supported(void **state)
{
	struct env *e = *state;
	struct sbx_sandbox *c = NULL;

	assert_false(fs_cache_supported(&e->sb));
	assert_int_equal(fs_cache_new(&c, &e->sb, NULL), -EINVAL);
	assert_null(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_remember_new_and_find,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_same_identity_shares_inode,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_root_identity, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_forget_frees_at_zero,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_stale_identity_gets_new_inode, setup, teardown),
		cmocka_unit_test_setup_teardown(test_made_file_gets_new_inode,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_fini_frees_stale_and_live,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_writers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_and_foreach, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_names_find_the_inode_of_a_name, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_names_are_bounded_per_inode, setup, teardown),
		cmocka_unit_test_setup_teardown(test_names_tell_the_provider,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_cache_supported, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
