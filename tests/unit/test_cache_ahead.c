/*
 * The caching layer's look-ahead prefetch (fs/cache_ahead.c) over the
 * in-memory sandbox, whose bulk walk here sends no content at all
 * (pmem_opts.bulk_max_total), as the agent's does past its 32 MiB budget:
 *  - a cold walk in listing order (as fts walks) reads every file with no
 *    read of its own: a few bulk requests of listed files, content right;
 *    also when it starts after a read elsewhere in the tree; a single read
 *    fetches its file and little more; without
 *    the sandbox's support, every file is read alone as before;
 *  - content fetched ahead and then changed behind the mount is not
 *    served;
 *  - a change during a request (after the sandbox read the files) keeps
 *    nothing of that request, even when the changed file shows the same
 *    size and mtime again by the time the answer arrives;
 *  - past the memory budget, content read to its end goes first, dropped
 *    rather than spilled.
 * Driven through the ops table as the FUSE daemon drives it.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../fs/cache_i.h"
#include "../../providers/mem/pmem.h"
#include "test_cache_i.h"

/* 3 directories of 16 files of 200 KiB: 20 fit one request (4 MiB). */
#define NDIRS 3
#define NFILES 16
#define FSIZE (200u << 10)

static const char *const dirs[NDIRS] = {"a", "a/sub", "b"};

struct env {
	struct sbx_sandbox *mem;
	struct sbx_sandbox *cache;
	const struct sbx_sandbox_ops *ops;
	struct sbx_node *root;
	/* test_change_during_request's hook */
	const char *target;       /* the file it changes */
	struct sbx_node *target_node;
	struct stat target_st;
	bool hooked;
};

static void on_change(const struct sbx_change *c, void *payload)
{
	(void)c;
	(void)payload;
}

/* Content of file i, version v: every file different. */
static void content_of(char *buf, size_t len, unsigned i, unsigned v)
{
	for (size_t j = 0; j < len; j++)
		buf[j] = (char)('a' + (i * 7 + j + v * 13) % 26);
}

static int setup(void **state)
{
	struct pmem_opts o = {.bulk_max_total = 1};
	struct env *e = calloc(1, sizeof(*e));
	char *buf = malloc(FSIZE);
	char path[64];

	assert_non_null(e);
	assert_non_null(buf);
	assert_int_equal(pmem_new(&e->mem, &o), 0);
	for (unsigned d = 0; d < NDIRS; d++) {
		assert_int_equal(pmem_ext_mkdir(e->mem, dirs[d], 0755), 0);
		for (unsigned i = 0; i < NFILES; i++) {
			snprintf(path, sizeof(path), "%s/f%02u", dirs[d], i);
			content_of(buf, FSIZE, d * NFILES + i, 0);
			assert_int_equal(pmem_ext_write(e->mem, path, buf,
							FSIZE), 0);
		}
	}
	free(buf);
	assert_int_equal(fs_cache_new(&e->cache, e->mem, NULL), 0);
	e->ops = e->cache->ops;
	e->root = e->ops->root(e->cache);
	assert_int_equal(e->ops->watch_start(e->cache, on_change, NULL), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	pmem_set_hook(e->mem, NULL, NULL);
	sbx_sandbox_free(e->cache);
	sbx_sandbox_free(e->mem);
	free(e);
	return 0;
}

/* The node at path, looked up name by name (tc_walk_path). */
static struct sbx_node *lookup_path(struct env *e, const char *path,
				    struct stat *st)
{
	return tc_walk_path(e->cache, path, false, st);
}

/* Read node n whole through the cache, 128 KiB at a time (the kernel's). */
static char *read_all(struct env *e, struct sbx_node *n, size_t len)
{
	struct sbx_open_result res;
	char *buf = malloc(len + 1);
	size_t got = 0;

	assert_non_null(buf);
	assert_int_equal(e->ops->open(e->cache, n, O_RDONLY, &res), 0);
	while (got < len) {
		size_t want = len - got < (128u << 10) ? len - got : 128u << 10;
		ssize_t r = e->ops->read(e->cache, res.fh, buf + got, want,
					 (off_t)got);

		assert_true(r > 0);
		got += (size_t)r;
	}
	assert_int_equal(e->ops->release(e->cache, res.fh), 0);
	return buf;
}

static void check_file(struct env *e, const char *path, unsigned i,
		       unsigned v)
{
	struct stat st;
	struct sbx_node *n = lookup_path(e, path, &st);
	char *want = malloc(FSIZE);
	char *got;

	assert_non_null(want);
	assert_int_equal(st.st_size, FSIZE);
	got = read_all(e, n, FSIZE);
	content_of(want, FSIZE, i, v);
	assert_memory_equal(got, want, FSIZE);
	free(got);
	free(want);
}

struct names {
	char name[NFILES + NDIRS][16];
	bool dir[NFILES + NDIRS];
	size_t n;
};

static int collect(const char *name, const struct stat *st,
		   struct sbx_node *node, off_t next, void *payload)
{
	struct names *l = payload;

	(void)node;
	(void)next;
	if (!strcmp(name, ".") || !strcmp(name, ".."))
		return 0;
	assert_true(l->n < NFILES + NDIRS);
	snprintf(l->name[l->n], sizeof(l->name[0]), "%s", name);
	l->dir[l->n++] = S_ISDIR(st->st_mode);
	return 0;
}

/* The file number setup() gave path. */
static unsigned file_no(const char *path)
{
	const char *slash = strrchr(path, '/');
	size_t dlen = (size_t)(slash - path);

	for (unsigned d = 0; d < NDIRS; d++)
		if (strlen(dirs[d]) == dlen && !strncmp(dirs[d], path, dlen))
			return d * NFILES + (unsigned)atoi(slash + 2);
	fail();
	return 0;
}

/* Walk dir as fts does: list it, then each entry in listing order. */
static void walk(struct env *e, const char *dir, unsigned *nread)
{
	struct sbx_node *n = *dir ? lookup_path(e, dir, &(struct stat){0})
				  : e->root;
	struct sbx_file *dh;
	struct names l = {0};
	char path[64];

	assert_int_equal(e->ops->opendir(e->cache, n, &dh), 0);
	assert_int_equal(e->ops->readdir(e->cache, dh, 0, 0, collect, &l), 0);
	assert_int_equal(e->ops->releasedir(e->cache, dh), 0);
	for (size_t i = 0; i < l.n; i++) {
		snprintf(path, sizeof(path), "%s%s%s", dir, *dir ? "/" : "",
			 l.name[i]);
		if (l.dir[i]) {
			walk(e, path, nread);
		} else {
			check_file(e, path, file_no(path), 0);
			(*nread)++;
		}
	}
}

static void test_cold_walk(void **state)
{
	struct env *e = *state;
	unsigned nread = 0;

	pmem_calls_reset(e->mem);
	walk(e, "", &nread);
	assert_int_equal(nread, NDIRS * NFILES);
	/* No file was read on its own ... */
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
	/*
	 * ... but in 1 walk + 5 requests of listed files, growing as the
	 * reader follows: 512 KiB, 1, 2, 4, 4 MiB (2 + 5 + 10 + 20 + 11).
	 */
	assert_int_equal(pmem_calls(e->mem, "bulk"), 6);
	/* Warm: nothing more. */
	pmem_calls_reset(e->mem);
	nread = 0;
	walk(e, "", &nread);
	assert_int_equal(pmem_calls(e->mem, "bulk"), 0);
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
}

/*
 * A read in the middle of the tree starts the plan there (the walk goes on
 * after it, out of its directory into the next ones); the walk that
 * follows starts new plans where it misses: still no read of its own.
 */
static void test_plan_starts_where_the_reader_is(void **state)
{
	struct env *e = *state;
	unsigned nread = 0;

	pmem_calls_reset(e->mem);
	check_file(e, "a/sub/f07", file_no("a/sub/f07"), 0);
	walk(e, "", &nread);
	assert_int_equal(nread, NDIRS * NFILES);
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
	assert_true(pmem_calls(e->mem, "bulk") <= 1 + 2 * 5);
}

/* Files whose content the cache holds. */
static unsigned count_cached(struct env *e)
{
	struct cache *c = CACHE(e->cache);
	unsigned cached = 0;
	char path[64];

	for (unsigned d = 0; d < NDIRS; d++)
		for (unsigned i = 0; i < NFILES; i++) {
			struct sbx_node *n;

			snprintf(path, sizeof(path), "%s/f%02u", dirs[d], i);
			n = lookup_path(e, path, &(struct stat){0});
			cache_lock(c);
			cached += content_valid(CNODE(n));
			cache_unlock(c);
		}
	return cached;
}

/*
 * One read that starts no walk (an editor opening a file) costs one
 * request of at most AHEAD_FIRST_BYTES: its file and the next one, not
 * the window's worth.
 */
static void test_single_read_fetches_little(void **state)
{
	struct env *e = *state;

	lookup_path(e, "b", &(struct stat){0}); /* the walk */
	pmem_calls_reset(e->mem);
	check_file(e, "b/f09", file_no("b/f09"), 0);
	assert_int_equal(pmem_calls(e->mem, "bulk"), 1);
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
	assert_int_equal(count_cached(e), AHEAD_FIRST_BYTES / FSIZE);
}

/*
 * A sandbox that cannot send listed files (an older agent: ENOSYS): each
 * file is read on its own, as before, and the look-ahead is not tried
 * again.
 */
static void test_without_bulk_files(void **state)
{
	struct env *e = *state;
	struct stat st;
	unsigned nread = 0;

	lookup_path(e, "a", &st); /* the walk */
	assert_int_equal(pmem_fail(e->mem, "bulk", -ENOSYS, -1), 0);
	pmem_calls_reset(e->mem);
	walk(e, "", &nread);
	assert_int_equal(nread, NDIRS * NFILES);
	/* The requests planned before the first answer came back. */
	assert_true(pmem_calls(e->mem, "bulk") <= AHEAD_WORKERS);
	assert_int_equal(pmem_calls(e->mem, "read"), NDIRS * NFILES);
}

/* A file other than `not` whose content the cache holds, or NULL. */
static const char *find_cached(struct env *e, const char *not,
			       char *path, size_t cap)
{
	struct cache *c = CACHE(e->cache);

	for (unsigned d = 0; d < NDIRS; d++)
		for (unsigned i = 0; i < NFILES; i++) {
			struct sbx_node *n;
			bool have;

			snprintf(path, cap, "%s/f%02u", dirs[d], i);
			if (!strcmp(path, not))
				continue;
			n = lookup_path(e, path, &(struct stat){0});
			cache_lock(c);
			have = content_valid(CNODE(n));
			cache_unlock(c);
			if (have)
				return path;
		}
	return NULL;
}

static void test_changed_after_prefetch(void **state)
{
	struct env *e = *state;
	char *buf = malloc(FSIZE);
	char path[64];
	const char *other;

	assert_non_null(buf);
	/* The first read brings the files after it ahead. */
	pmem_calls_reset(e->mem);
	check_file(e, "a/f00", file_no("a/f00"), 0);
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
	other = find_cached(e, "a/f00", path, sizeof(path));
	assert_non_null(other);
	/* Changed behind the mount: the new content, never the old. */
	content_of(buf, FSIZE, file_no(other), 1);
	assert_int_equal(pmem_ext_write(e->mem, other, buf, FSIZE), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	check_file(e, other, file_no(other), 1);
	free(buf);
}

/*
 * After the sandbox read the requested files and before their answer
 * arrives: change one, with the same size, and put its mtime back, so
 * that its attributes look as they did when it was read.
 */
static void change_hook(const char *op, const char *path, void *payload)
{
	struct env *e = payload;
	char *buf;
	struct stat in, out;

	/* The reader's own request starts with the file it reads. */
	if (strcmp(op, "bulk:sent") || e->hooked || !e->target_node ||
	    strcmp(path, e->target))
		return;
	e->hooked = true;
	buf = malloc(FSIZE);
	assert_non_null(buf);
	content_of(buf, FSIZE, file_no(e->target), 1);
	assert_int_equal(pmem_ext_write(e->mem, e->target, buf, FSIZE), 0);
	free(buf);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	memset(&in, 0, sizeof(in));
	in.st_mtim = e->target_st.st_mtim;
	assert_int_equal(e->ops->setattr(e->cache, e->target_node, NULL, &in,
					 SBX_SET_MTIME, &out),
			 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	assert_int_equal(e->ops->getattr(e->cache, e->target_node, NULL,
					 &out),
			 0);
	assert_int_equal(out.st_size, e->target_st.st_size);
	assert_int_equal(out.st_mtim.tv_nsec, e->target_st.st_mtim.tv_nsec);
}

static void test_change_during_request(void **state)
{
	struct env *e = *state;

	e->target = "a/f03";
	e->target_node = lookup_path(e, e->target, &e->target_st);
	pmem_set_hook(e->mem, change_hook, e);
	/* Its request read version 0; version 1 is there by the answer. */
	check_file(e, e->target, file_no(e->target), 1);
	assert_true(e->hooked);
	/* The rest is read right, wherever it comes from. */
	check_file(e, "a/f04", file_no("a/f04"), 0);
	check_file(e, "b/f15", file_no("b/f15"), 0);
}

/* ---- content memory ------------------------------------------------------ */

/* Give n (made for the test) valid attributes and a content of len bytes. */
static void give_content(struct cache *c, struct cnode *n, size_t len,
			 ino_t ino)
{
	char *data = malloc(len);
	struct stat st;

	assert_non_null(data);
	memset(data, 'c', len);
	memset(&st, 0, sizeof(st));
	st.st_mode = S_IFREG | 0644;
	st.st_ino = ino;
	st.st_size = (off_t)len;
	n->st = st;
	n->st_valid = true;
	n->slot = S_PRESENT;
	content_store(c, n, data, len, &st);
	free(data);
}

/*
 * Past CACHE_MEM_BUDGET, content read to its end goes first and is dropped
 * (the kernel's page cache has it), although it was used more recently
 * than content not read yet, which spills to disk.
 */
static void test_read_content_goes_first(void **state)
{
	char dir[] = "/tmp/sbx-test-ahead-XXXXXX";
	struct sbx_sandbox *mem = NULL, *sb = NULL;
	const size_t mib = 1u << 20;
	struct cnode *unread, *read, *k;
	struct cache *c;
	char name[32], *buf = malloc(mib);

	(void)state;
	assert_non_null(buf);
	assert_non_null(mkdtemp(dir));
	assert_int_equal(pmem_new(&mem, NULL), 0);
	assert_int_equal(fs_cache_new(&sb, mem, dir), 0);
	c = CACHE(sb);
	cache_lock(c);
	unread = tree_resolve(c, "unread", true);
	give_content(c, unread, mib, 100);
	read = tree_resolve(c, "read", true);
	give_content(c, read, mib, 101);
	assert_int_equal(content_read(c, read, buf, mib, 0, NULL), mib);
	/* Fill memory up to the budget (two are in), then one past it. */
	for (unsigned i = 0; i < CACHE_MEM_BUDGET / mib - 2; i++) {
		snprintf(name, sizeof(name), "fill%u", i);
		k = tree_resolve(c, name, true);
		give_content(c, k, mib, 200 + i);
	}
	assert_non_null(read->content->data);
	assert_non_null(unread->content->data);
	k = tree_resolve(c, "last", true);
	give_content(c, k, mib, 199);
	/* The one read is gone from memory, and not spilling ... */
	assert_null(read->content->data);
	assert_false(read->content->spilling);
	assert_false(content_valid(read));
	/* ... the older unread one is still there. */
	assert_non_null(unread->content->data);
	cache_unlock(c);
	sbx_sandbox_free(sb);
	sbx_sandbox_free(mem);
	content_clear_dir(dir);
	assert_int_equal(rmdir(dir), 0);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_cold_walk, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_plan_starts_where_the_reader_is, setup, teardown),
		cmocka_unit_test_setup_teardown(test_single_read_fetches_little,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_without_bulk_files, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_changed_after_prefetch,
						setup, teardown),
		cmocka_unit_test(test_read_content_goes_first),
		cmocka_unit_test_setup_teardown(test_change_during_request,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
