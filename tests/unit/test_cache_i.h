/*
 * The fixture of the caching layer's unit tests (test_cache.c,
 * test_cache_quick.c, test_cache_rt.c, test_cache_fresh.c;
 * test_cache_ahead.c uses tc_walk_path only): the in-memory sandbox
 * (providers/mem) wrapped by the cache (fs/cache.c), and the call
 * sequences the FUSE daemon sends, so that a test drives the cache through
 * its ops table as the daemon would.
 *
 * Use it as cmocka's setup and teardown:
 *
 *	static void test_x(void **state)
 *	{
 *		struct tc_env *e = *state;
 *		struct sbx_node *n;
 *		struct sbx_file *fh;
 *
 *		assert_int_equal(tc_create(e, "f", 0, &n, &fh), 0);
 *		...
 *		assert_int_equal(tc_close(e, fh), 0);
 *		e->ops->forget(e->cache, n);
 *	}
 *	...
 *	cmocka_unit_test_setup_teardown(test_x, tc_setup, tc_teardown),
 *
 * A test that wants the changes the cache forwards calls
 * tc_setup_watch(state, cb, payload) from its own setup (e.g. with
 * th_changes_record from test_changes_i.h).  What the fixture gives:
 *
 *  - e->cache, e->ops, e->root: the cache as the daemon holds it (its
 *    change stream already started);
 *  - e->mem: the wrapped sandbox.  pmem_ext_*() change it "behind the
 *    mount" (the change reaches the cache through the watch; tc_settle()
 *    waits for it), pmem_calls()/pmem_calls_reset() count what reached it,
 *    pmem_fail() and the gate (pmem_gate_*) inject errors and order races
 *    (providers/mem/pmem.h).
 *
 * The events of the cache's own changes come too, late and on another
 * thread: one that lands while a fetch is out keeps that fetch's answer
 * from being recorded (it may predate the change).  A test that counts
 * calls after an entry operation of its own calls tc_settle() first, or
 * the count depends on timing.
 *
 * Nodes and handles a test gets from lookup/create/open are its own to
 * forget/release, as the kernel's would be.  Everything here runs on the
 * test's thread (cmocka's asserts must not run elsewhere), except the
 * tc_create/tc_open/tc_close/tc_unlink sequences, which only return codes
 * and so may run in worker threads too.
 */
#ifndef SBX_TEST_CACHE_I_H
#define SBX_TEST_CACHE_I_H

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../providers/mem/pmem.h"

struct tc_env {
	struct sbx_sandbox *mem;	   /* the wrapped sandbox */
	struct sbx_sandbox *cache;	   /* what the daemon would use */
	const struct sbx_sandbox_ops *ops; /* cache->ops */
	struct sbx_node *root;
	/*
	 * Set by a test whose worker thread is stuck in the cache: its
	 * teardown must leak the fixture rather than free what the thread
	 * still uses (test_cache.c keeps such objects reachable).
	 */
	bool hung;
};

static inline void tc_ignore_change(const struct sbx_change *c,
				    void *payload)
{
	(void)c;
	(void)payload;
}

/*
 * cmocka setup: a fresh fixture in *state whose forwarded changes go to
 * cb(payload).  Fails the test if it cannot be built.
 */
static inline int tc_setup_watch(void **state, sbx_change_cb cb,
				 void *payload)
{
	struct tc_env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	assert_int_equal(pmem_new(&e->mem, NULL), 0);
	assert_int_equal(fs_cache_new(&e->cache, e->mem, NULL), 0);
	e->ops = e->cache->ops;
	e->root = e->ops->root(e->cache);
	assert_int_equal(e->ops->watch_start(e->cache, cb, payload), 0);
	*state = e;
	return 0;
}

/* cmocka setup: a fresh fixture in *state; forwarded changes dropped. */
static inline int tc_setup(void **state)
{
	return tc_setup_watch(state, tc_ignore_change, NULL);
}

/* Free a fixture (the cache first, then what it wraps); NULL is fine. */
static inline void tc_env_free(struct tc_env *e)
{
	if (!e)
		return;
	sbx_sandbox_free(e->cache);
	sbx_sandbox_free(e->mem);
	free(e);
}

/* cmocka teardown for tc_setup/tc_setup_watch (e->hung: see above). */
static inline int tc_teardown(void **state)
{
	tc_env_free(*state);
	return 0;
}

/*
 * Apply every change made so far (the exec barrier: watch_sync), then
 * count the wrapped sandbox's calls afresh.
 */
static inline void tc_settle(struct tc_env *e)
{
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	pmem_calls_reset(e->mem);
}

/* What the sandbox holds at path equals data[len]. */
static inline bool tc_holds(struct tc_env *e, const char *path,
			    const void *data, size_t len)
{
	char *buf = malloc(len + 1);
	size_t got = 0;
	bool ok;

	ok = buf && pmem_ext_read(e->mem, path, buf, len + 1, &got) == 0 &&
	     got == len && memcmp(buf, data, len) == 0;
	free(buf);
	return ok;
}

/*
 * The node at `path` (relative to the root of `cache`, a cache over any
 * sandbox), looked up name by name as the kernel walks; with `getattr`,
 * each node is also asked for its attributes, as the kernel's permission
 * check does for a directory it walks through (default_permissions).  The
 * last answer in *st.  Test thread only (asserts).
 */
static inline struct sbx_node *tc_walk_path(struct sbx_sandbox *cache,
					    const char *path, bool getattr,
					    struct stat *st)
{
	const struct sbx_sandbox_ops *ops = cache->ops;
	char *p = strdup(path), *save = NULL, *part;
	struct sbx_node *n = ops->root(cache);

	assert_non_null(p);
	for (part = strtok_r(p, "/", &save); part;
	     part = strtok_r(NULL, "/", &save)) {
		assert_int_equal(ops->lookup(cache, n, part, &n, st), 0);
		if (getattr)
			assert_int_equal(ops->getattr(cache, n, NULL, st), 0);
	}
	free(p);
	return n;
}

/* ---- the daemon's sequences (return codes only: any thread) ------------- */

/* unlink(2) of root/name: the kernel looks the name up first. */
static inline int tc_unlink(struct tc_env *e, const char *name)
{
	struct sbx_node *n;
	struct stat st;
	int rc = e->ops->lookup(e->cache, e->root, name, &n, &st);

	if (rc < 0)
		return rc;
	e->ops->forget(e->cache, n);
	return e->ops->unlink(e->cache, e->root, name);
}

/*
 * open(2) with O_CREAT (plus `flags`, opened O_WRONLY) of root/name, which
 * the kernel found missing: -EEXIST if the lookup finds it.  *node and *fh
 * are the test's to forget and close.
 */
static inline int tc_create(struct tc_env *e, const char *name, int flags,
			    struct sbx_node **node, struct sbx_file **fh)
{
	struct sbx_open_result res;
	struct stat st;
	int rc;

	*fh = NULL;
	rc = e->ops->lookup(e->cache, e->root, name, node, &st);
	if (rc == 0)
		return -EEXIST;
	if (rc != -ENOENT)
		return rc;
	rc = e->ops->create(e->cache, e->root, name, 0644,
			    O_CREAT | O_WRONLY | flags, node, &st, &res);
	if (rc == 0)
		*fh = res.fh;
	return rc;
}

/*
 * open(2) of an existing file; O_TRUNC becomes a setattr (no
 * atomic_o_trunc), which the kernel sends with the new handle.
 */
static inline int tc_open(struct tc_env *e, struct sbx_node *node, int flags,
			  struct sbx_file **fh)
{
	struct sbx_open_result res;
	struct stat in, out;
	int rc = e->ops->open(e->cache, node, flags & ~O_TRUNC, &res);

	*fh = NULL;
	if (rc < 0)
		return rc;
	*fh = res.fh;
	if (flags & O_TRUNC) {
		memset(&in, 0, sizeof(in));
		rc = e->ops->setattr(e->cache, node, *fh, &in, SBX_SET_SIZE,
				     &out);
	}
	return rc;
}

/* close(2) of the last descriptor: FLUSH, then RELEASE. */
static inline int tc_close(struct tc_env *e, struct sbx_file *fh)
{
	int rc = e->ops->flush(e->cache, fh);
	int r = e->ops->release(e->cache, fh);

	return rc < 0 ? rc : r;
}

/*
 * A new file `name` in the root, open (*fh), and in hidden[] the name its
 * silly rename will give it, the `seq`-th of the cache.
 */
static inline void tc_create_to_hide(struct tc_env *e, const char *name,
				     unsigned long seq, struct sbx_node **node,
				     struct sbx_file **fh, char *hidden,
				     size_t size)
{
	struct stat st;

	assert_int_equal(tc_create(e, name, O_EXCL, node, fh), 0);
	assert_int_equal(e->ops->getattr(e->cache, *node, NULL, &st), 0);
	snprintf(hidden, size, ".sbx-silly.%llu.%lu",
		 (unsigned long long)st.st_ino, seq);
}

/*
 * unlink(2) of `name` in dir (path `path`), open here, whose silly rename
 * is lost: the call says EIO, the sandbox did it or not (`hidden`, the
 * hidden name's path then; NULL: not done), and every event is delivered.
 */
static inline void tc_unlink_answer_lost(struct tc_env *e, struct sbx_node *dir,
					 const char *name, const char *path,
					 const char *hidden)
{
	assert_int_equal(pmem_fail(e->mem, "rename", -EIO, 1), 0);
	assert_int_equal(e->ops->unlink(e->cache, dir, name), -EIO);
	sbx_error_clear();
	if (hidden)
		assert_int_equal(pmem_ext_rename(e->mem, path, hidden, 0), 0);
	tc_settle(e);
}

#endif
