/*
 * The caching layer's answers that need no round trip (issue 15, quick
 * wins), over the in-memory sandbox (providers/mem), whose call counters
 * show what reached the wrapped sandbox:
 *  - SEEK_DATA / SEEK_HOLE of a file without holes, from its cached size;
 *  - statfs reused for CACHE_STATFS_TTL;
 *  - file contents up to 1 MiB come with the bulk walk;
 *  - a read-only open (no FLUSH: FOPEN_NOFLUSH) does not keep an unlink
 *    from waiting for its RELEASE.
 * Driven through the ops table as the FUSE daemon drives it (the fixture
 * and the sequences: test_cache_i.h).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../fs/cache_i.h"
#include "../../providers/mem/pmem.h"
#include "test_cache_i.h"

/* A file of len bytes at root/name, looked up and opened with flags. */
static void make_open(struct tc_env *e, const char *name, size_t len,
		      int flags, struct sbx_node **node, struct sbx_file **fh)
{
	char *data = malloc(len ? len : 1);
	struct stat st;

	assert_non_null(data);
	memset(data, 'x', len);
	assert_int_equal(pmem_ext_write(e->mem, name, data, len), 0);
	free(data);
	/* The change reaches the cache before the lookup; count afresh. */
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, name, node, &st),
			 0);
	assert_int_equal(tc_open(e, *node, flags, fh), 0);
}

static void close_file(struct tc_env *e, struct sbx_node *node,
		       struct sbx_file *fh)
{
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, node);
}

/* ---- lseek ----------------------------------------------------------------- */

static void test_seek_data_hole_local(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	make_open(e, "f", 10000, O_RDONLY, &n, &fh);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->lseek(e->cache, fh, 0, SEEK_DATA), 0);
	assert_int_equal(e->ops->lseek(e->cache, fh, 4096, SEEK_DATA), 4096);
	assert_int_equal(e->ops->lseek(e->cache, fh, 0, SEEK_HOLE), 10000);
	assert_int_equal(e->ops->lseek(e->cache, fh, 9999, SEEK_HOLE), 10000);
	/* At and past EOF: ENXIO, as Linux answers. */
	assert_int_equal(e->ops->lseek(e->cache, fh, 10000, SEEK_DATA),
			 -ENXIO);
	assert_int_equal(e->ops->lseek(e->cache, fh, 10000, SEEK_HOLE),
			 -ENXIO);
	assert_int_equal(e->ops->lseek(e->cache, fh, 20000, SEEK_DATA),
			 -ENXIO);
	assert_int_equal(e->ops->lseek(e->cache, fh, -1, SEEK_HOLE), -ENXIO);
	sbx_error_clear();
	/* No call reached the sandbox (nothing to push, nothing to ask). */
	assert_int_equal(pmem_calls(e->mem, "lseek"), 0);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 0);
	assert_int_equal(pmem_calls(e->mem, "open"), 0);
	close_file(e, n, fh);

	/* An empty file: no data anywhere. */
	make_open(e, "empty", 0, O_RDONLY, &n, &fh);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->lseek(e->cache, fh, 0, SEEK_DATA), -ENXIO);
	assert_int_equal(e->ops->lseek(e->cache, fh, 0, SEEK_HOLE), -ENXIO);
	sbx_error_clear();
	assert_int_equal(pmem_calls(e->mem, "lseek"), 0);
	close_file(e, n, fh);
}

/* Buffered writes: the size is not settled; push and ask, as before. */
static void test_seek_buffered_asks(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	make_open(e, "w", 100, O_RDWR, &n, &fh);
	assert_int_equal(e->ops->write(e->cache, fh, "yyyy", 4, 200), 4);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->lseek(e->cache, fh, 0, SEEK_HOLE), 204);
	assert_int_equal(pmem_calls(e->mem, "lseek"), 1);
	assert_true(pmem_calls(e->mem, "write") >= 1);
	close_file(e, n, fh);
}

/* ---- statfs ---------------------------------------------------------------- */

static void test_statfs_reused(void **state)
{
	struct tc_env *e = *state;
	struct cache *c = CACHE(e->cache);
	struct statvfs a, b;

	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->statfs(e->cache, e->root, &a), 0);
	assert_int_equal(e->ops->statfs(e->cache, e->root, &b), 0);
	assert_int_equal(pmem_calls(e->mem, "statfs"), 1);
	assert_int_equal(a.f_blocks, b.f_blocks);
	assert_int_equal(a.f_namemax, b.f_namemax);
	/* Past the window (aged instead of slept): asked again. */
	cache_lock(c);
	c->statfs_time -= CACHE_STATFS_TTL + 0.1;
	cache_unlock(c);
	assert_int_equal(e->ops->statfs(e->cache, e->root, &b), 0);
	assert_int_equal(pmem_calls(e->mem, "statfs"), 2);
	assert_int_equal(e->ops->statfs(e->cache, e->root, &b), 0);
	assert_int_equal(pmem_calls(e->mem, "statfs"), 2);
}

/* A failed statfs is not kept. */
static void test_statfs_error_not_kept(void **state)
{
	struct tc_env *e = *state;
	struct statvfs a;

	pmem_calls_reset(e->mem);
	assert_int_equal(pmem_fail(e->mem, "statfs", -EIO, 1), 0);
	assert_int_equal(e->ops->statfs(e->cache, e->root, &a), -EIO);
	sbx_error_clear();
	assert_int_equal(e->ops->statfs(e->cache, e->root, &a), 0);
	assert_int_equal(pmem_calls(e->mem, "statfs"), 2);
}

/* ---- prefetch -------------------------------------------------------------- */

/* A file of up to 1 MiB comes with the bulk walk: its read costs nothing. */
static void test_prefetch_1mib(void **state)
{
	struct tc_env *e = *state;
	char buf[4096];
	struct sbx_node *n;
	struct sbx_file *fh;

	make_open(e, "mid", 1u << 20, O_RDONLY, &n, &fh);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf),
				      (1 << 20) - 4096), 4096);
	assert_int_equal(buf[0], 'x');
	assert_int_equal(pmem_calls(e->mem, "read"), 0);
	close_file(e, n, fh);
}

/* ---- read-only opens get no FLUSH ------------------------------------------- */

struct late_release {
	struct tc_env *e;
	struct sbx_file *fh;
};

static void *release_later(void *arg)
{
	struct late_release *l = arg;

	usleep(30 * 1000);
	(void)l->e->ops->release(l->e->cache, l->fh);
	return NULL;
}

/*
 * close(2) of a reader sends no FLUSH (FOPEN_NOFLUSH), only a RELEASE a
 * little later.  An unlink in between must wait for that RELEASE and remove
 * the file, not take it for open and rename it to a hidden name.
 */
static void test_reader_close_then_unlink(void **state)
{
	struct tc_env *e = *state;
	struct late_release l = {e, NULL};
	struct sbx_node *n, *n2;
	struct stat st;
	pthread_t t;

	make_open(e, "r", 10, O_RDONLY, &n, &l.fh);
	pmem_calls_reset(e->mem);
	assert_int_equal(pthread_create(&t, NULL, release_later, &l), 0);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "r", &n2, &st), 0);
	e->ops->forget(e->cache, n2);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "r"), 0);
	pthread_join(t, NULL);
	assert_int_equal(pmem_calls(e->mem, "rename"), 0);
	assert_int_equal(pmem_calls(e->mem, "unlink"), 1);
	e->ops->forget(e->cache, n);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_seek_data_hole_local,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(test_seek_buffered_asks,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(test_statfs_reused, tc_setup,
						tc_teardown),
		cmocka_unit_test_setup_teardown(test_statfs_error_not_kept,
						tc_setup, tc_teardown),
		cmocka_unit_test_setup_teardown(test_prefetch_1mib, tc_setup,
						tc_teardown),
		cmocka_unit_test_setup_teardown(test_reader_close_then_unlink,
						tc_setup, tc_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
