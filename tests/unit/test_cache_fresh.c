/*
 * Git objects made in the sandbox, fetched before they are asked for
 * (fs/cache_fresh.c), over the in-memory sandbox:
 *  - a loose object written behind the mount is walked once the stream is
 *    quiet: then its directory, its attributes and its content are
 *    answered with no call to the sandbox;
 *  - a new fan-out directory: `objects` is walked too;
 *  - a change during that walk keeps nothing of it, and the walk is tried
 *    again: the reader gets the content after the change;
 *  - only loose objects of a repository the tree has seen are walked (not
 *    git's temporary files, packs, other files, our own writes through the
 *    mount, nor objects of a directory nobody looked into);
 *  - a cache freed while directories wait frees them without waiting.
 * Driven through the ops table as the FUSE daemon drives it.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../fs/cache_i.h"
#include "../../providers/mem/pmem.h"
#include "test_cache_i.h"

/* Loose object names: 38 hex digits below the fan-out directory. */
#define OBJ_AB "0123456789abcdef0123456789abcdef012345"
#define OBJ_AB2 "fedcba9876543210fedcba9876543210fedcba"
#define OBJ_CD "00112233445566778899aabbccddeeff001122"

/* The calls a reader of an object makes, and the walk. */
static const char *const reads[] = {
	"lookup", "getattr", "open", "read", "bulk", "readdir", "node_at",
};

struct env {
	struct tc_env *tc;        /* test_cache_i.h's fixture */
	struct sbx_sandbox *mem;  /* its members, for short */
	struct sbx_sandbox *cache;
	const struct sbx_sandbox_ops *ops;
	struct sbx_node *root;
	/* the hook: directories walked, and a change made during a walk */
	pthread_mutex_t lock;
	char walked[8][64];
	unsigned nwalked;
	const char *change_path;  /* written during the first walk of it */
	const char *change_data;
	int change_rc;            /* what that write returned */
};

static void hook(const char *op, const char *path, void *payload)
{
	struct env *e = payload;
	const char *change = NULL;

	pthread_mutex_lock(&e->lock);
	if (!strcmp(op, "bulk") && e->nwalked < 8)
		snprintf(e->walked[e->nwalked++], sizeof(e->walked[0]), "%s",
			 path);
	if (!strcmp(op, "bulk:sent") && e->change_path) {
		change = e->change_path;
		e->change_path = NULL;
	}
	pthread_mutex_unlock(&e->lock);
	/* The walk's records are taken: this change is one they predate.
	 * (A worker's thread: the test asserts on the result.) */
	if (change) {
		int rc = pmem_ext_write(e->mem, change, e->change_data,
					strlen(e->change_data));

		/* and it arrives before the records do */
		if (rc == 0)
			rc = e->mem->ops->watch_sync(e->mem);

		pthread_mutex_lock(&e->lock);
		e->change_rc = rc;
		pthread_mutex_unlock(&e->lock);
	}
}

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	void *tc = NULL;

	assert_non_null(e);
	pthread_mutex_init(&e->lock, NULL);
	tc_setup(&tc);
	e->tc = tc;
	e->mem = e->tc->mem;
	e->cache = e->tc->cache;
	e->ops = e->tc->ops;
	e->root = e->tc->root;
	/* made behind the mount before the tree knows anything */
	assert_int_equal(pmem_ext_mkdir(e->mem, ".git", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, ".git/objects", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, ".git/objects/ab", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, ".git/objects/cd", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, ".git/objects/pack", 0755),
			 0);
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/ab/" OBJ_AB2,
					"old", 3),
			 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "src", 0755), 0);
	tc_settle(e->tc);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	pmem_set_hook(e->mem, NULL, NULL);
	tc_env_free(e->tc);
	pthread_mutex_destroy(&e->lock);
	free(e);
	return 0;
}

/* The node at path, looked up name by name, each directory's attributes
 * asked on the way (tc_walk_path). */
static struct sbx_node *lookup_path(struct env *e, const char *path,
				    struct stat *st)
{
	return tc_walk_path(e->cache, path, true, st);
}

/* The whole (small) content of path through the cache, NUL-terminated. */
static char *read_path(struct env *e, const char *path)
{
	struct sbx_open_result res;
	struct stat st;
	struct sbx_node *n = lookup_path(e, path, &st);
	char *buf = calloc(1, (size_t)st.st_size + 1);
	ssize_t r;

	assert_non_null(buf);
	assert_int_equal(e->ops->open(e->cache, n, O_RDONLY, &res), 0);
	r = e->ops->read(e->cache, res.fh, buf, (size_t)st.st_size, 0);
	assert_int_equal(r, st.st_size);
	assert_int_equal(e->ops->release(e->cache, res.fh), 0);
	return buf;
}

static unsigned long reader_calls(struct env *e)
{
	unsigned long n = 0;

	for (size_t i = 0; i < sizeof(reads) / sizeof(reads[0]); i++)
		n += pmem_calls(e->mem, reads[i]);
	return n;
}

/*
 * path reads as want[len] through the cache and costs the sandbox no call:
 * its directory, its attributes and its content were all known here.
 */
static void read_without_asking(struct env *e, const char *path,
				const char *want, size_t len)
{
	char *got;

	pmem_calls_reset(e->mem);
	got = read_path(e, path);
	assert_memory_equal(got, want, len);
	free(got);
	assert_int_equal(reader_calls(e), 0);
}

/* The tree knows the repository (git status through the mount did it). */
static void know_repository(struct env *e)
{
	struct stat st;

	lookup_path(e, ".git/objects/ab", &st);
	lookup_path(e, ".git/objects/cd", &st);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	pmem_calls_reset(e->mem);
	pmem_set_hook(e->mem, hook, e);
}

/* Wait (5 s at most) until nothing waits or walks and `walks` ended. */
static void wait_walks(struct env *e, unsigned long walks)
{
	struct timespec pause = {.tv_nsec = 5 * 1000 * 1000};
	struct fresh_stats fs;

	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	for (int i = 0; i < 1000; i++) {
		fresh_stats(CACHE(e->cache), &fs);
		if (fs.walks >= walks && !fs.waiting && !fs.walking)
			return;
		nanosleep(&pause, NULL);
	}
	fail_msg("walks: %lu of %lu ended, %zu waiting, %u out", fs.walks,
		 walks, fs.waiting, fs.walking);
}

static void test_new_object_is_there_before_it_is_asked(void **state)
{
	struct env *e = *state;
	struct fresh_stats fs;

	know_repository(e);
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/ab/" OBJ_AB,
					"blob 5\0hello", 12),
			 0);
	wait_walks(e, 1);
	assert_int_equal(e->nwalked, 1);
	assert_string_equal(e->walked[0], ".git/objects/ab");
	read_without_asking(e, ".git/objects/ab/" OBJ_AB, "blob 5\0hello", 12);
	fresh_stats(CACHE(e->cache), &fs);
	assert_int_equal(fs.walks, 1);
}

static void test_walk_racing_a_change_is_tried_again(void **state)
{
	struct env *e = *state;

	know_repository(e);
	pthread_mutex_lock(&e->lock);
	e->change_path = ".git/objects/ab/" OBJ_AB;
	e->change_data = "second";
	e->change_rc = 1;
	pthread_mutex_unlock(&e->lock);
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/ab/" OBJ_AB,
					"first", 5),
			 0);
	/* the first walk read "first" and is dropped; the second keeps */
	wait_walks(e, 2);
	pthread_mutex_lock(&e->lock);
	assert_int_equal(e->change_rc, 0);
	pthread_mutex_unlock(&e->lock);
	assert_int_equal(e->nwalked, 2);
	assert_string_equal(e->walked[1], ".git/objects/ab");
	read_without_asking(e, ".git/objects/ab/" OBJ_AB, "second", 7);
}

static void test_only_loose_objects_of_a_seen_repository(void **state)
{
	struct env *e = *state;
	struct sbx_open_result res;
	struct sbx_node *ab, *n;
	struct stat st;

	know_repository(e);
	/* git's temporary file, a pack, another file, an unseen repository */
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/ab/tmp_obj_x1",
					"t", 1),
			 0);
	assert_int_equal(pmem_ext_write(e->mem,
					".git/objects/pack/pack-" OBJ_AB
					".pack",
					"p", 1),
			 0);
	assert_int_equal(pmem_ext_write(e->mem, "src/" OBJ_AB, "s", 1), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "other", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "other/objects", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "other/objects/ab", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "other/objects/ab/" OBJ_AB,
					"o", 1),
			 0);
	/* an object written through the mount: its event is our own */
	ab = lookup_path(e, ".git/objects/ab", &st);
	assert_int_equal(e->ops->create(e->cache, ab, OBJ_AB, 0444,
					O_CREAT | O_EXCL | O_WRONLY, &n, &st,
					&res),
			 0);
	assert_int_equal(e->ops->write(e->cache, res.fh, "mine", 4, 0), 4);
	assert_int_equal(e->ops->flush(e->cache, res.fh), 0);
	assert_int_equal(e->ops->release(e->cache, res.fh), 0);
	/* and one that counts, last: everything before it was passed over */
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/cd/" OBJ_CD,
					"c", 1),
			 0);
	wait_walks(e, 1);
	assert_int_equal(e->nwalked, 1);
	assert_string_equal(e->walked[0], ".git/objects/cd");
}

static void test_new_fanout_directory(void **state)
{
	struct env *e = *state;
	bool objects = false, ef = false;

	know_repository(e);
	/* the first object of its fan-out directory: `objects` changes too */
	assert_int_equal(pmem_ext_mkdir(e->mem, ".git/objects/ef", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/ef/" OBJ_AB,
					"fresh", 5),
			 0);
	wait_walks(e, 2);
	assert_int_equal(e->nwalked, 2);
	for (unsigned i = 0; i < e->nwalked; i++) {
		objects |= !strcmp(e->walked[i], ".git/objects");
		ef |= !strcmp(e->walked[i], ".git/objects/ef");
	}
	assert_true(objects && ef);
	read_without_asking(e, ".git/objects/ef/" OBJ_AB, "fresh", 6);
}

static void test_freed_while_directories_wait(void **state)
{
	struct env *e = *state;
	struct fresh_stats fs;

	know_repository(e);
	/* the stream never quiets long enough before the cache goes */
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/ab/" OBJ_AB,
					"x", 1),
			 0);
	assert_int_equal(pmem_ext_write(e->mem, ".git/objects/cd/" OBJ_CD,
					"y", 1),
			 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	fresh_stats(CACHE(e->cache), &fs);
	assert_int_equal(fs.waiting + fs.walking + fs.walks, 2);
	/* teardown frees the cache now: it must neither wait the quiet
	 * period out nor leak what waits (ASan) */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(
			test_new_object_is_there_before_it_is_asked, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_walk_racing_a_change_is_tried_again, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_only_loose_objects_of_a_seen_repository, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_new_fanout_directory,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_freed_while_directories_wait, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
