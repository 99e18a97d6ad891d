/*
 * The caching layer (fs/cache.c) over the in-memory sandbox
 * (providers/mem), driven through its ops table the way the FUSE daemon
 * drives it: lookup before every name operation, create/open hand out the
 * per-open handle, close is flush + release, O_TRUNC on open arrives as a
 * setattr(size=0).  Inner calls are counted by the provider, changes
 * "behind the mount" are pmem_ext_*(), and the provider's gate makes races
 * happen in a chosen order.  The fixture and those sequences are shared
 * with the other cache tests: test_cache_i.h.
 *
 * Two groups:
 *  - behaviour the cache has (caching, negative entries, listings,
 *    write-back on close, renames, invalidation by the change stream);
 *  - regressions for known defects ("REGRESSION" below), which fail or
 *    hang on a cache that has them.  Anything that could hang runs in a
 *    worker thread bounded by WATCHDOG_S: a hang is reported as a failure
 *    of that test (the stuck thread and its cache are leaked on purpose,
 *    the other tests go on).  A process-wide alarm is the last resort.
 *    Checks inside worker threads use CHECK (cmocka's asserts must not
 *    run outside the test's thread).
 *
 * SBX_TEST_FILTER=<glob> runs only the matching tests.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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
#include "../../providers/mem/pmem.h"
#include "test_cache_i.h"

/* A bounded section that has not finished by then is a hang. */
#define WATCHDOG_S 5
/* The whole binary: past this, something hung outside a bounded section. */
#define GLOBAL_WATCHDOG_S 28
/* Run only the tests whose names match this glob (cmocka's filter). */
#define FILTER_ENV "SBX_TEST_FILTER"

/* ---- forwarded changes --------------------------------------------------- */

#define MAX_FWD 256
static struct {
	pthread_mutex_t lock;
	int n;
	int kind[MAX_FWD];
	ino_t dir_ino[MAX_FWD];
	ino_t ino[MAX_FWD];
	char name[MAX_FWD][64];
} fwd = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void on_forward(const struct sbx_change *c, void *payload)
{
	pthread_mutex_lock(&fwd.lock);
	if (fwd.n < MAX_FWD) {
		fwd.kind[fwd.n] = c->kind;
		fwd.dir_ino[fwd.n] = c->dir_ino;
		fwd.ino[fwd.n] = c->ino;
		snprintf(fwd.name[fwd.n], 64, "%s", c->name ? c->name : "");
		fwd.n++;
	}
	pthread_mutex_unlock(&fwd.lock);
}

static void fwd_reset(void)
{
	pthread_mutex_lock(&fwd.lock);
	fwd.n = 0;
	pthread_mutex_unlock(&fwd.lock);
}

/* Index of a forwarded change of `kind` (name or ino may be 0/NULL). */
static int fwd_find(int kind, const char *name, ino_t ino)
{
	int found = -1;

	pthread_mutex_lock(&fwd.lock);
	for (int i = 0; i < fwd.n && found < 0; i++)
		if (fwd.kind[i] == kind &&
		    (!name || strcmp(fwd.name[i], name) == 0) &&
		    (!ino || fwd.ino[i] == ino))
			found = i;
	pthread_mutex_unlock(&fwd.lock);
	return found;
}

/* ---- leaks of hung tests ------------------------------------------------- */

/* Objects a stuck thread may still use: never freed, but reachable. */
static void *leaked[64];
static int nleaked;

static void leak(void *p)
{
	if (nleaked < (int)(sizeof(leaked) / sizeof(leaked[0])))
		leaked[nleaked++] = p;
}

/* ---- setup --------------------------------------------------------------- */

static int setup(void **state)
{
	fwd_reset();
	return tc_setup_watch(state, on_forward, NULL);
}

static int teardown(void **state)
{
	struct tc_env *e = *state;

	if (e->hung) {
		leak(e);
		leak(e->cache);
		leak(e->mem);
		return 0;
	}
	return tc_teardown(state);
}

/* Inner calls that fetch metadata. */
static unsigned long fetches(struct tc_env *e)
{
	return pmem_calls(e->mem, "getattr") + pmem_calls(e->mem, "lookup") +
	       pmem_calls(e->mem, "bulk") + pmem_calls(e->mem, "readdir");
}

static void fill(char *buf, size_t len, int seed)
{
	for (size_t i = 0; i < len; i++)
		buf[i] = (char)('a' + (i * 7 + (size_t)seed) % 26);
}

/* ---- bounded sections ---------------------------------------------------- */

/* A test body run in a worker thread; err[0] != 0 is a failure. */
struct body {
	struct tc_env *e;
	char err[512];
	void *arg;
	/* Bookkeeping of run_bounded. */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
	void *(*fn)(struct body *b);
};

#define CHECK(b, cond, ...)                                                    \
	do {                                                                   \
		if (!(cond)) {                                                 \
			snprintf((b)->err, sizeof((b)->err), __VA_ARGS__);     \
			return NULL;                                           \
		}                                                              \
	} while (0)

static void *body_main(void *arg)
{
	struct body *b = arg;

	b->fn(b);
	pthread_mutex_lock(&b->lock);
	b->done = true;
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

/*
 * Run fn in a worker for at most WATCHDOG_S seconds, then fail the test
 * with what it reported, or "hung" naming `what`.
 */
static void run_bounded(struct tc_env *e, void *(*fn)(struct body *b),
			void *arg, const char *what)
{
	struct body *b = calloc(1, sizeof(*b));
	struct timespec until;
	pthread_t t;
	bool done;

	assert_non_null(b);
	b->e = e;
	b->fn = fn;
	b->arg = arg;
	pthread_mutex_init(&b->lock, NULL);
	pthread_cond_init(&b->cond, NULL);
	assert_int_equal(pthread_create(&t, NULL, body_main, b), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += WATCHDOG_S;
	pthread_mutex_lock(&b->lock);
	while (!b->done &&
	       pthread_cond_timedwait(&b->cond, &b->lock, &until) == 0)
		;
	done = b->done;
	pthread_mutex_unlock(&b->lock);
	if (!done) {
		/* Stuck (a loop, a lost wake-up): leave it, fail loudly. */
		pthread_detach(t);
		leak(b);
		e->hung = true;
		fail_msg("HANG: %s did not finish within %d s", what,
			 WATCHDOG_S);
	}
	pthread_join(t, NULL);
	if (b->err[0]) {
		char msg[600];

		snprintf(msg, sizeof(msg), "%s: %s", what, b->err);
		free(b);
		fail_msg("%s", msg);
	}
	free(b);
}

static void on_global_alarm(int sig)
{
	static const char msg[] =
		"test_cache: WATCHDOG: the run hung outside a bounded "
		"section (see the last test started)\n";

	(void)sig;
	if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
		/* nothing left to report it with */
	}
	_exit(1);
}

/* ==== behaviour =========================================================== */

static void test_lookup_getattr_cached(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n, *n2;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "hello", 5), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	tc_settle(e);

	/* The first look into a directory walks it in one bulk call. */
	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &n, &st), 0);
	assert_int_equal(st.st_size, 5);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(pmem_calls(e->mem, "bulk"), 1);
	pmem_calls_reset(e->mem);

	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &n2, &st), 0);
	assert_ptr_equal(n, n2);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_size, 5);
	assert_int_equal(fetches(e), 0);
	assert_int_equal(pmem_calls(e->mem, "node_at"), 0);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, n2);
}

static void test_getattr_cached_without_prefetch(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	unsigned long f0;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "hello", 5), 0);
	tc_settle(e);
	/* No bulk walk: every name is fetched on its own, once. */
	assert_int_equal(pmem_fail(e->mem, "bulk", -EIO, 1), 0);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &n, &st), 0);
	f0 = fetches(e);
	assert_true(f0 >= 2); /* the failed walk, then the name itself */
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_size, 5);
	assert_int_equal(fetches(e), f0);
	e->ops->forget(e->cache, n);
}

static void test_negative_entries(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	unsigned long f0;
	struct stat st;
	int i;

	tc_settle(e);
	assert_int_equal(pmem_fail(e->mem, "bulk", -EIO, 1), 0);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "nope", &n, &st),
			 -ENOENT);
	f0 = fetches(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "nope", &n, &st),
			 -ENOENT);
	assert_int_equal(fetches(e), f0);

	/* Created behind the mount: the negative entry goes. */
	assert_int_equal(pmem_ext_write(e->mem, "nope", "x", 1), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	i = fwd_find(SBX_CHANGE_ENTRY, "nope", 0);
	assert_true(i >= 0);
	assert_int_equal(fwd.dir_ino[i], 1); /* the root's identity */
	assert_int_equal(e->ops->lookup(e->cache, e->root, "nope", &n, &st),
			 0);
	assert_int_equal(st.st_size, 1);
	e->ops->forget(e->cache, n);
}

static void test_complete_listing_answers_enoent(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "a", "", 0), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "a", &n, &st), 0);
	e->ops->forget(e->cache, n);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "zz", &n, &st),
			 -ENOENT);
	assert_int_equal(fetches(e), 0);
}

struct names {
	int n;
	char name[16][32];
	off_t size[16];
	nlink_t nlink[16]; /* with a node; else 0 */
	int nodes;
};

static int collect(const char *name, const struct stat *st,
		   struct sbx_node *node, off_t next, void *payload)
{
	struct names *l = payload;

	if (l->n >= 16)
		return 1;
	l->size[l->n] = st->st_size;
	l->nlink[l->n] = node ? st->st_nlink : 0;
	snprintf(l->name[l->n++], 32, "%s", name);
	if (node)
		l->nodes++;
	return 0;
}

static bool listed(const struct names *l, const char *name)
{
	for (int i = 0; i < l->n; i++)
		if (strcmp(l->name[i], name) == 0)
			return true;
	return false;
}

static void list_dir(struct tc_env *e, struct sbx_node *dir,
		     struct names *l)
{
	struct sbx_file *dh;

	memset(l, 0, sizeof(*l));
	assert_int_equal(e->ops->opendir(e->cache, dir, &dh), 0);
	assert_int_equal(e->ops->readdir(e->cache, dh, 0, SBX_READDIR_PLUS,
					 collect, l),
			 0);
	assert_int_equal(e->ops->releasedir(e->cache, dh), 0);
}

static void list_root(struct tc_env *e, struct names *l)
{
	struct sbx_file *dh;

	memset(l, 0, sizeof(*l));
	assert_int_equal(e->ops->opendir(e->cache, e->root, &dh), 0);
	assert_int_equal(e->ops->readdir(e->cache, dh, 0, SBX_READDIR_PLUS,
					 collect, l),
			 0);
	assert_int_equal(e->ops->releasedir(e->cache, dh), 0);
}

static void test_readdir_listing(void **state)
{
	struct tc_env *e = *state;
	struct names l;

	assert_int_equal(pmem_ext_write(e->mem, "a", "1", 1), 0);
	assert_int_equal(pmem_ext_write(e->mem, "b", "22", 2), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	tc_settle(e);

	list_root(e, &l);
	assert_int_equal(l.n, 5);
	assert_true(listed(&l, ".") && listed(&l, ".."));
	assert_true(listed(&l, "a") && listed(&l, "b") && listed(&l, "d"));
	assert_int_equal(l.nodes, 3);
	pmem_calls_reset(e->mem);

	/* Served from the cache the second time. */
	list_root(e, &l);
	assert_int_equal(l.n, 5);
	assert_int_equal(fetches(e), 0);
	assert_int_equal(pmem_calls(e->mem, "opendir"), 0);

	/* A name removed behind the mount is gone after the barrier. */
	assert_int_equal(pmem_ext_unlink(e->mem, "b"), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	list_root(e, &l);
	assert_int_equal(l.n, 4);
	assert_false(listed(&l, "b"));
}

static void test_write_flush_release(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	char data[4096];
	struct stat st;

	tc_settle(e);
	fill(data, sizeof(data), 1);
	assert_int_equal(tc_create(e, "new", O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, data, 1000, 0), 1000);
	assert_int_equal(e->ops->write(e->cache, fh, data + 1000,
				       sizeof(data) - 1000, 1000),
			 (ssize_t)(sizeof(data) - 1000));
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	assert_true(tc_holds(e, "new", data, sizeof(data)));
	assert_true(pmem_calls(e->mem, "write") >= 1);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	assert_true(tc_holds(e, "new", data, sizeof(data)));
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_size, sizeof(data));
}

static void test_read_through_cache(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_write(e->mem, "r", "content", 7), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "r", &n, &st), 0);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 7);
	assert_memory_equal(buf, "content", 7);
	assert_int_equal(tc_close(e, fh), 0);
	/* Small files came with the bulk walk: no read went out. */
	assert_int_equal(pmem_calls(e->mem, "read"), 0);

	/* Changed behind the mount: the cached content is not served. */
	assert_int_equal(pmem_ext_write(e->mem, "r", "CHANGED!", 8), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 8);
	assert_memory_equal(buf, "CHANGED!", 8);
	assert_int_equal(tc_close(e, fh), 0);
}

static void test_rename_through_cache(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *b;
	struct sbx_file *fh;
	struct stat sa, st;
	char buf[8];

	assert_int_equal(pmem_ext_write(e->mem, "a", "AAA", 3), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "a", &a, &sa), 0);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "b", &b, &st),
			 -ENOENT);
	assert_int_equal(e->ops->rename(e->cache, e->root, "a", e->root, "b",
					0),
			 0);
	assert_int_equal(pmem_ext_stat(e->mem, "b", &st), 0);
	assert_int_equal(st.st_ino, sa.st_ino);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "a", &b, &st),
			 -ENOENT);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "b", &b, &st), 0);
	assert_int_equal(st.st_ino, sa.st_ino);
	assert_int_equal(tc_open(e, b, O_RDONLY, &fh), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 3);
	assert_memory_equal(buf, "AAA", 3);
	assert_int_equal(tc_close(e, fh), 0);
	/* Our own rename's events are expected, not treated as news. */
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "a", &b, &st),
			 -ENOENT);
	assert_int_equal(fetches(e), 0);

	/* RENAME_NOREPLACE refuses an existing target. */
	assert_int_equal(pmem_ext_write(e->mem, "c", "", 0), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	assert_int_equal(e->ops->rename(e->cache, e->root, "b", e->root, "c",
					RENAME_NOREPLACE),
			 -EEXIST);
	assert_int_equal(e->ops->rename(e->cache, e->root, "b", e->root, "c",
					RENAME_EXCHANGE),
			 0);
	assert_int_equal(pmem_ext_stat(e->mem, "c", &st), 0);
	assert_int_equal(st.st_ino, sa.st_ino);
}

static void test_change_behind_mount_invalidates(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "one", 3), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &n, &st), 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_size, 3);
	fwd_reset();
	pmem_calls_reset(e->mem);

	assert_int_equal(pmem_ext_write(e->mem, "f", "three!", 6), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	/* Forwarded with the identity the daemon keys on. */
	assert_true(fwd_find(SBX_CHANGE_DATA, NULL, st.st_ino) >= 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_size, 6);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 1);

	assert_int_equal(pmem_ext_chmod(e->mem, "f", 0600), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	assert_true(fwd_find(SBX_CHANGE_ATTR, NULL, st.st_ino) >= 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);

	assert_int_equal(pmem_ext_unlink(e->mem, "f"), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	assert_true(fwd_find(SBX_CHANGE_ENTRY, "f", 0) >= 0);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &n, &st),
			 -ENOENT);

	/* An overflow is forwarded and forgets everything. */
	pmem_ext_overflow(e->mem);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	assert_true(fwd_find(SBX_CHANGE_OVERFLOW, NULL, 0) >= 0);
}

/*
 * A stat whose answer was read before a change but comes back after the
 * change's event was applied must not be cached as fresh.  The gate parks
 * the fetch after the provider answered (at the forget of its node), the
 * change happens and is applied, then the fetch finishes.
 */
struct racer {
	struct tc_env *e;
	struct sbx_node *n;
	struct stat st;
	int rc;
};

static void *race_getattr(void *arg)
{
	struct racer *r = arg;

	r->rc = r->e->ops->getattr(r->e->cache, r->n, NULL, &r->st);
	return NULL;
}

static void test_fetch_racing_change_not_kept(void **state)
{
	struct tc_env *e = *state;
	struct racer r = {.e = e};
	struct stat st;
	pthread_t t;
	int parked;

	assert_int_equal(pmem_ext_write(e->mem, "f", "old", 3), 0);
	tc_settle(e);
	assert_int_equal(pmem_fail(e->mem, "bulk", -EIO, 1), 0);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &r.n, &st),
			 0);
	/* Make the cached attributes stale so getattr fetches. */
	assert_int_equal(pmem_ext_chmod(e->mem, "f", 0600), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);

	assert_int_equal(pmem_gate_arm(e->mem, "forget", "f"), 0);
	assert_int_equal(pthread_create(&t, NULL, race_getattr, &r), 0);
	parked = pmem_gate_wait(e->mem, WATCHDOG_S * 1000);
	if (parked == 0) {
		assert_int_equal(pmem_ext_write(e->mem, "f", "newer", 5), 0);
		assert_int_equal(e->ops->watch_sync(e->cache), 0);
	}
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(parked, 0); /* the fetch went through node_at */
	assert_int_equal(r.rc, 0);
	assert_int_equal(r.st.st_size, 3); /* what it read: fine to return */

	assert_int_equal(e->ops->getattr(e->cache, r.n, NULL, &st), 0);
	assert_int_equal(st.st_size, 5); /* but not kept */
}

/* ==== regressions ========================================================= */

/*
 * REGRESSION a: hard-link rings.  The names of a multi-link file are tied
 * in a ring; removing and recreating them (with the sandbox reusing the
 * inode number) must not corrupt the ring into a loop.
 */
static void *ring_loop_body(struct body *b)
{
	struct tc_env *e = b->e;

	for (int i = 0; i < 5; i++) {
		struct sbx_node *a, *bn, *made;
		struct sbx_file *fh;
		struct stat st;
		int rc;

		rc = tc_unlink(e, "a");
		CHECK(b, rc == 0 || rc == -ENOENT, "round %d: unlink a: %d",
		      i, rc);
		rc = tc_unlink(e, "b");
		CHECK(b, rc == 0 || rc == -ENOENT, "round %d: unlink b: %d",
		      i, rc);
		rc = tc_create(e, "a", O_EXCL, &a, &fh);
		CHECK(b, rc == 0, "round %d: create a: %d", i, rc);
		rc = e->ops->write(e->cache, fh, "x", 1, 0);
		CHECK(b, rc == 1, "round %d: write a: %d", i, rc);
		rc = tc_close(e, fh);
		CHECK(b, rc == 0, "round %d: close a: %d", i, rc);
		rc = e->ops->lookup(e->cache, e->root, "b", &bn, &st);
		CHECK(b, rc == -ENOENT, "round %d: lookup b: %d", i, rc);
		rc = e->ops->link(e->cache, a, e->root, "b", &made, &st);
		CHECK(b, rc == 0, "round %d: link a b: %d", i, rc);
		CHECK(b, st.st_nlink == 2, "round %d: link: nlink %lu", i,
		      (unsigned long)st.st_nlink);
		/* The daemon keeps a's node for the inode, forgets made. */
		e->ops->forget(e->cache, made);
		rc = tc_unlink(e, "a");
		CHECK(b, rc == 0, "round %d: unlink a: %d", i, rc);
		rc = tc_unlink(e, "b");
		CHECK(b, rc == 0, "round %d: unlink b: %d", i, rc);
		e->ops->forget(e->cache, a);
	}
	return NULL;
}

static void test_hardlink_ring_loop(void **state)
{
	struct tc_env *e = *state;

	tc_settle(e);
	run_bounded(e, ring_loop_body, NULL,
		    "5 rounds of create a, link a b, unlink a, unlink b");
}

static void *foreign_link_body(struct body *b)
{
	struct tc_env *e = b->e;
	struct sbx_node *x;
	struct stat st, in, out;
	int rc;

	rc = e->ops->lookup(e->cache, e->root, "x", &x, &st);
	CHECK(b, rc == 0, "lookup x: %d", rc);
	rc = e->ops->getattr(e->cache, x, NULL, &st);
	CHECK(b, rc == 0 && st.st_nlink == 2, "getattr x: %d nlink %lu", rc,
	      (unsigned long)st.st_nlink);
	memset(&in, 0, sizeof(in));
	in.st_mtim.tv_sec = 1000000000;
	in.st_atim.tv_sec = 1000000000;
	rc = e->ops->setattr(e->cache, x, NULL, &in,
			     SBX_SET_ATIME | SBX_SET_MTIME, &out);
	CHECK(b, rc == 0, "setattr x: %d", rc);
	for (int i = 0; i < 3; i++) {
		rc = e->ops->getattr(e->cache, x, NULL, &st);
		CHECK(b, rc == 0, "getattr x again: %d", rc);
		rc = e->ops->setattr(e->cache, x, NULL, &in,
				     SBX_SET_ATIME | SBX_SET_MTIME, &out);
		CHECK(b, rc == 0, "setattr x again: %d", rc);
	}
	CHECK(b, out.st_mtim.tv_sec == 1000000000, "mtime not set");
	e->ops->forget(e->cache, x);
	return NULL;
}

static void test_foreign_hardlink_setattr(void **state)
{
	struct tc_env *e = *state;

	assert_int_equal(pmem_ext_write(e->mem, "x", "data", 4), 0);
	tc_settle(e);
	/* The second name is made behind the mount, never seen here. */
	assert_int_equal(pmem_ext_link(e->mem, "x", "hidden-name"), 0);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	run_bounded(e, foreign_link_body, NULL,
		    "getattr + setattr(times) of a file linked behind the "
		    "mount");
}

/*
 * REGRESSION c: a push that fails belongs to the open file that buffered
 * it.  Another caller's getattr pushes the buffer and the wrapped write
 * fails once; the owner's fsync must then report the error or the data
 * must have reached the sandbox -- never "0" with nothing there.
 */
static void *push_failure_body(struct body *b)
{
	struct tc_env *e = b->e;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	char data[4096];
	int rc, grc;

	fill(data, sizeof(data), 3);
	rc = tc_create(e, "f", O_EXCL, &n, &fh);
	CHECK(b, rc == 0, "create: %d", rc);
	rc = (int)e->ops->write(e->cache, fh, data, sizeof(data), 0);
	CHECK(b, rc == (int)sizeof(data), "write: %d", rc);
	CHECK(b, pmem_fail(e->mem, "write", -EIO, 1) == 0, "pmem_fail");
	grc = e->ops->getattr(e->cache, n, NULL, &st);
	CHECK(b, pmem_fail(e->mem, "write", 0, 0) == 0, "pmem_fail clear");
	rc = e->ops->fsync(e->cache, fh, false);
	if (rc == 0)
		CHECK(b, tc_holds(e, "f", data, sizeof(data)),
		      "fsync returned 0 but the sandbox does not hold the "
		      "4 KiB (the other caller's getattr returned %d and the "
		      "failed push was dropped)",
		      grc);
	else
		CHECK(b, rc == -EIO, "fsync: %d, expected 0 or -EIO", rc);
	rc = e->ops->flush(e->cache, fh);
	(void)e->ops->release(e->cache, fh);
	return NULL;
}

static void test_push_failure_stays_with_file(void **state)
{
	struct tc_env *e = *state;

	tc_settle(e);
	run_bounded(e, push_failure_body, NULL, "push failure");
}

/*
 * REGRESSION d: buffered writes reach the sandbox within a bounded time
 * even when the file is left open and nothing else happens (a process
 * that writes a log line and sleeps; a crash of the daemon must not lose
 * minutes of writes).
 */
static void test_bounded_writeback(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	char data[4096];
	struct stat st;
	bool there = false;

	tc_settle(e);
	fill(data, sizeof(data), 4);
	assert_int_equal(tc_create(e, "log", O_EXCL, &n, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, data, sizeof(data), 0),
			 (ssize_t)sizeof(data));
	for (int i = 0; i < 60 && !there; i++) {
		there = pmem_ext_stat(e->mem, "log", &st) == 0 &&
			st.st_size == (off_t)sizeof(data);
		if (!there)
			usleep(50 * 1000);
	}
	there = there && tc_holds(e, "log", data, sizeof(data));
	assert_int_equal(tc_close(e, fh), 0);
	if (!there)
		fail_msg("4 KiB written to an open file did not reach the "
			 "sandbox within 3 s without flush/fsync/release");
}

/*
 * REGRESSION e: link counts.  Removing one name of a two-link file
 * through the mount leaves the other with one link, at once (no event
 * says so: inotify reports no link-count change for the other names).
 */
static void *nlink_body(struct body *b)
{
	struct tc_env *e = b->e;
	struct sbx_node *a, *made, *bn;
	struct sbx_file *fh;
	struct stat st;
	int rc;

	rc = tc_create(e, "a", O_EXCL, &a, &fh);
	CHECK(b, rc == 0, "create a: %d", rc);
	rc = tc_close(e, fh);
	CHECK(b, rc == 0, "close a: %d", rc);
	rc = e->ops->lookup(e->cache, e->root, "b", &bn, &st);
	CHECK(b, rc == -ENOENT, "lookup b: %d", rc);
	rc = e->ops->link(e->cache, a, e->root, "b", &made, &st);
	CHECK(b, rc == 0 && st.st_nlink == 2, "link: %d nlink %lu", rc,
	      (unsigned long)st.st_nlink);
	e->ops->forget(e->cache, made);
	/* `ls -l` after the link: the cache now knows nlink 2. */
	rc = e->ops->getattr(e->cache, a, NULL, &st);
	CHECK(b, rc == 0 && st.st_nlink == 2, "getattr a: %d nlink %lu", rc,
	      (unsigned long)st.st_nlink);
	rc = tc_unlink(e, "b");
	CHECK(b, rc == 0, "unlink b: %d", rc);
	rc = e->ops->getattr(e->cache, a, NULL, &st);
	CHECK(b, rc == 0, "getattr a after unlink b: %d", rc);
	CHECK(b, st.st_nlink == 1,
	      "after unlink of b, getattr of a says nlink %lu, want 1",
	      (unsigned long)st.st_nlink);
	e->ops->forget(e->cache, a);
	return NULL;
}

static void test_nlink_after_unlink(void **state)
{
	struct tc_env *e = *state;

	tc_settle(e);
	run_bounded(e, nlink_body, NULL, "link counts");
}

static void *nlink_open_body(struct body *b)
{
	struct tc_env *e = b->e;
	struct sbx_node *a, *made;
	struct sbx_file *fh;
	struct stat st;
	int rc;

	rc = tc_create(e, "a", O_EXCL, &a, &fh);
	CHECK(b, rc == 0, "create a: %d", rc);
	rc = e->ops->link(e->cache, a, e->root, "b", &made, &st);
	CHECK(b, rc == 0 && st.st_nlink == 2, "link: %d nlink %lu", rc,
	      (unsigned long)st.st_nlink);
	e->ops->forget(e->cache, made);
	rc = tc_unlink(e, "a");
	CHECK(b, rc == 0, "unlink a: %d", rc);
	rc = tc_unlink(e, "b");
	CHECK(b, rc == 0, "unlink b: %d", rc);
	rc = e->ops->getattr(e->cache, a, fh, &st);
	CHECK(b, rc == 0, "fstat of the open file: %d", rc);
	CHECK(b, st.st_nlink == 0,
	      "both names removed, fstat of the open file says nlink %lu, "
	      "want 0",
	      (unsigned long)st.st_nlink);
	rc = tc_close(e, fh);
	CHECK(b, rc == 0, "close: %d", rc);
	e->ops->forget(e->cache, a);
	return NULL;
}

static void test_nlink_open_file_all_names_gone(void **state)
{
	struct tc_env *e = *state;

	tc_settle(e);
	run_bounded(e, nlink_open_body, NULL, "link count of an open file");
}

/*
 * f: a file open for writing is renamed *behind the mount* (by a command in
 * the sandbox) while it has buffered writes, and the agent could not say
 * where it went (it did not pair the rename's two events: an older agent,
 * or a rename out of its tree and back).  The agent writes by path, so
 * the push to the old name gets ENOENT.  This is the documented limit
 * (docs/design.md, "Write-back"): the bytes are never dropped silently --
 * they stay buffered and the owner's flush (close) reports the error; no
 * file is created under the old name.  (A paired rename: the bytes follow,
 * test_buffered_bytes_follow_a_rename_behind_the_mount.)
 */
static void *rename_behind_body(struct body *b)
{
	struct tc_env *e = b->e;
	struct sbx_node *n;
	struct sbx_file *fh;
	char data[4096];
	struct stat st;
	int rc;

	fill(data, sizeof(data), 6);
	pmem_pair_renames(e->mem, false);
	rc = tc_create(e, "f", O_EXCL, &n, &fh);
	CHECK(b, rc == 0, "create: %d", rc);
	rc = (int)e->ops->write(e->cache, fh, data, sizeof(data), 0);
	CHECK(b, rc == (int)sizeof(data), "write: %d", rc);
	CHECK(b, pmem_ext_rename(e->mem, "f", "g", 0) == 0, "ext rename");
	rc = e->ops->watch_sync(e->cache);
	CHECK(b, rc == 0, "watch_sync: %d", rc);
	rc = e->ops->flush(e->cache, fh);
	CHECK(b, rc == -ENOENT,
	      "flush after a rename behind the mount returned %d, want "
	      "-ENOENT (the owner must be told)", rc);
	/* Told twice if asked twice: the bytes are still held. */
	rc = e->ops->fsync(e->cache, fh, false);
	CHECK(b, rc < 0, "fsync after the failed flush returned %d", rc);
	(void)e->ops->release(e->cache, fh);
	CHECK(b, pmem_ext_stat(e->mem, "f", &st) == -ENOENT,
	      "the old name was recreated");
	CHECK(b, pmem_ext_stat(e->mem, "g", &st) == 0 && st.st_size == 0,
	      "g changed although the push failed");
	return NULL;
}

static void test_rename_behind_buffered_write(void **state)
{
	struct tc_env *e = *state;

	tc_settle(e);
	run_bounded(e, rename_behind_body, NULL,
		    "buffered write, rename behind the mount, flush");
}

/*
 * Rename *through the mount* of a file that is open with buffered writes,
 * then more writes and close: the data must land at the new name.
 */
static void *rename_open_body(struct body *b)
{
	struct tc_env *e = b->e;
	struct sbx_node *n;
	struct sbx_file *fh;
	char data[4096];
	int rc;

	fill(data, sizeof(data), 7);
	rc = tc_create(e, "f", O_EXCL, &n, &fh);
	CHECK(b, rc == 0, "create: %d", rc);
	rc = (int)e->ops->write(e->cache, fh, data, 1024, 0);
	CHECK(b, rc == 1024, "write: %d", rc);
	rc = e->ops->fsync(e->cache, fh, false);
	CHECK(b, rc == 0, "fsync: %d", rc);
	rc = e->ops->rename(e->cache, e->root, "f", e->root, "g", 0);
	CHECK(b, rc == 0, "rename f g: %d", rc);
	rc = (int)e->ops->write(e->cache, fh, data + 1024,
				sizeof(data) - 1024, 1024);
	CHECK(b, rc == (int)sizeof(data) - 1024, "write after rename: %d",
	      rc);
	rc = tc_close(e, fh);
	CHECK(b, rc == 0, "close after a rename through the mount: %d", rc);
	CHECK(b, tc_holds(e, "g", data, sizeof(data)),
	      "close returned 0 but g does not hold the data");
	return NULL;
}

static void test_rename_open_file_through_cache(void **state)
{
	struct tc_env *e = *state;

	tc_settle(e);
	run_bounded(e, rename_open_body, NULL,
		    "write, rename through the mount, write, close");
}

/*
 * A file open here and replaced by a rename through the mount is kept
 * under a hidden name (a silly rename) until its last close, which
 * removes it.  A listing of its directory from the sandbox in between,
 * which never shows hidden names, must not make the cache forget the
 * hidden file, or it stays in the sandbox and the directory cannot be
 * removed (ENOTEMPTY).
 */
static void test_hidden_file_removed_after_listing(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *dir, *n, *x;
	struct sbx_file *fh, *dh;
	struct stat st;
	struct names l;

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/b", "old", 3), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/d", "new", 3), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	n = tc_walk_path(e->cache, "s/b", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	x = tc_walk_path(e->cache, "s/d", false, &st);
	e->ops->forget(e->cache, x);
	assert_int_equal(e->ops->rename(e->cache, dir, "d", dir, "b", 0), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "s/d", &st), -ENOENT);
	/* Something else changes in the directory: its listing is asked
	 * for again. */
	assert_int_equal(pmem_ext_write(e->mem, "s/other", "o", 1), 0);
	tc_settle(e);
	memset(&l, 0, sizeof(l));
	assert_int_equal(e->ops->opendir(e->cache, dir, &dh), 0);
	assert_int_equal(e->ops->readdir(e->cache, dh, 0, SBX_READDIR_PLUS,
					 collect, &l),
			 0);
	assert_int_equal(e->ops->releasedir(e->cache, dh), 0);
	assert_true(listed(&l, "b") && listed(&l, "other"));
	assert_int_equal(l.n, 4);
	assert_true(pmem_calls(e->mem, "readdir") > 0);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, dir);
	assert_int_equal(pmem_ext_unlink(e->mem, "s/b"), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "s/other"), 0);
	assert_int_equal(pmem_ext_rmdir(e->mem, "s"), 0);
}

/*
 * A hard-linked file opened after its first name was removed: the kernel
 * keeps one inode per file, whose node is the removed name's, so the open
 * counts on that node.  Removing the last name must still keep the file
 * for the descriptor (hidden), I/O through it must work, and its last
 * close must remove the hidden name.  Found by the random tester: fsync
 * said ENOENT, as did a write through a mapping.
 */
static void test_open_through_a_removed_name_of_a_linked_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *dir, *c, *made;
	struct sbx_open_result res;
	struct sbx_file *fh;
	struct stat st;
	char buf[8];

	assert_int_equal(pmem_ext_mkdir(e->mem, "h", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "h/c", "data", 4), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "h", false, &st);
	c = tc_walk_path(e->cache, "h/c", false, &st);
	assert_int_equal(e->ops->link(e->cache, c, dir, "b", &made, &st), 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(e->ops->unlink(e->cache, dir, "c"), 0);
	assert_int_equal(e->ops->open(e->cache, c, O_RDWR, &res), 0);
	fh = res.fh;
	assert_int_equal(e->ops->unlink(e->cache, dir, "b"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "h/b", &st), -ENOENT);
	assert_int_equal(e->ops->write(e->cache, fh, "DATA", 4, 0), 4);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 4);
	assert_memory_equal(buf, "DATA", 4);
	assert_int_equal(e->ops->getattr(e->cache, c, fh, &st), 0);
	assert_int_equal(st.st_nlink, 0);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, c);
	e->ops->forget(e->cache, dir);
	assert_int_equal(pmem_ext_rmdir(e->mem, "h"), 0);
}

/*
 * Bytes buffered through one name of a hard-linked file, and a listing of
 * the directory of another name: readdirplus hands the kernel that name's
 * size, so the bytes must be in the sandbox first (the listing pushed
 * only files opened under a name in the listed directory: the kernel then
 * took the old size, and a read through another descriptor of the file
 * found nothing).
 */
/*
 * A new empty file "b", open for writing (*fh), with a second name "d/c";
 * *b and *d are the nodes of "b" and "d".
 */
static void linked_into_d(struct tc_env *e, struct sbx_node **b,
			  struct sbx_node **d, struct sbx_file **fh)
{
	struct sbx_node *made;
	struct stat st;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	tc_settle(e);
	*d = tc_walk_path(e->cache, "d", false, &st);
	assert_int_equal(tc_create(e, "b", O_EXCL, b, fh), 0);
	assert_int_equal(e->ops->link(e->cache, *b, *d, "c", &made, &st), 0);
	assert_int_equal(st.st_size, 0);
	e->ops->forget(e->cache, made);
}

static void test_listing_pushes_bytes_of_another_name(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *b, *d;
	struct sbx_file *fh, *dh;
	struct names l;

	linked_into_d(e, &b, &d, &fh);
	assert_int_equal(e->ops->write(e->cache, fh, "hello", 5, 0), 5);
	memset(&l, 0, sizeof(l));
	assert_int_equal(e->ops->opendir(e->cache, d, &dh), 0);
	assert_int_equal(e->ops->readdir(e->cache, dh, 0, SBX_READDIR_PLUS,
					 collect, &l),
			 0);
	assert_int_equal(e->ops->releasedir(e->cache, dh), 0);
	assert_int_equal(l.n, 3);
	assert_string_equal(l.name[2], "c");
	assert_int_equal(l.size[2], 5);
	assert_true(tc_holds(e, "d/c", "hello", 5));
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, d);
}

/*
 * Bytes buffered through one name of a hard-linked file: a lookup of
 * another name must answer the size they make (the kernel applies a
 * LOOKUP's attributes to its one inode of the file), not the size cached
 * when the link was made.
 */
static void test_lookup_of_another_name_sees_buffered_bytes(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *b, *d, *k;
	struct sbx_file *fh;
	struct stat st;

	linked_into_d(e, &b, &d, &fh);
	assert_int_equal(e->ops->write(e->cache, fh, "hello", 5, 0), 5);
	assert_int_equal(e->ops->lookup(e->cache, d, "c", &k, &st), 0);
	assert_int_equal(st.st_size, 5);
	assert_int_equal(e->ops->getattr(e->cache, k, NULL, &st), 0);
	assert_int_equal(st.st_size, 5);
	e->ops->forget(e->cache, k);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, d);
}

/*
 * A hard-linked file whose other name was removed while open (hidden): the
 * link count the user sees leaves the hidden name out, and once the last
 * close removes it the count must come from the sandbox again -- the
 * attributes cached while it was there counted it (random tester, seed
 * 193528780: fstat said 2 links, a local disk 1).
 */
static void test_link_count_after_hidden_name_removed(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *b, *made;
	struct sbx_file *fh, *fa;
	struct stat st;

	assert_int_equal(tc_create(e, "a", O_EXCL, &a, &fa), 0);
	assert_int_equal(tc_close(e, fa), 0);
	assert_int_equal(e->ops->link(e->cache, a, e->root, "b", &made, &st),
			 0);
	assert_int_equal(st.st_nlink, 2);
	e->ops->forget(e->cache, made);
	b = tc_walk_path(e->cache, "b", false, &st);
	assert_int_equal(tc_open(e, b, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "b"), 0);
	/* Hidden, still in the sandbox: 2 there, 1 for the user. */
	assert_int_equal(pmem_ext_stat(e->mem, "a", &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "a", &st), 0);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(e->ops->getattr(e->cache, b, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * A file "f" (4 bytes, made behind the mount) and a second name "g" linked
 * to it through the cache.  Returns f's node; *fst is f's attributes
 * before the link.  *g gets the link's node when g is not NULL, else it
 * is forgotten.
 */
static struct sbx_node *f_linked_as_g(struct tc_env *e, struct stat *fst,
				      struct sbx_node **g)
{
	struct sbx_node *f, *made;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "data", 4), 0);
	tc_settle(e);
	f = tc_walk_path(e->cache, "f", false, fst);
	assert_int_equal(e->ops->link(e->cache, f, e->root, "g", &made, &st),
			 0);
	if (g)
		*g = made;
	else
		e->ops->forget(e->cache, made);
	return f;
}

/*
 * The kernel may still hold a removed name of a hard-linked file when the
 * sandbox gives the file's inode number to a new directory (ext4 does,
 * soon).  The daemon asks node_stale() whether the new directory is that
 * file under another name: it never is (a file does not become a
 * directory), even while another name of the old file looks alive to the
 * cache (removed behind the mount: its event made it unknown, not
 * absent).  Said "not stale", the kernel's inode for the new directory
 * was the old file's node: entry operations in it took that node's path
 * and failed (random tester, seeds 105502626 and 777222215: mkdir of
 * "sub", then mkdir "sub/deep" said ESTALE, or open(O_CREAT) in it
 * ENOENT).
 */
static void test_new_directory_is_not_a_dead_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f, *d, *h;
	struct sbx_file *fh;
	struct stat st, fst;

	f = f_linked_as_g(e, &fst, NULL);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "f"), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "g"), 0);
	tc_settle(e);
	assert_int_equal(e->ops->mkdir(e->cache, e->root, "d", 0755, &d, &st),
			 0);
	/* The in-memory sandbox reuses the lowest free number at once. */
	assert_int_equal(st.st_ino, fst.st_ino);
	assert_true(S_ISDIR(st.st_mode));
	assert_true(e->ops->node_stale(e->cache, f, d, &st));
	e->ops->forget(e->cache, d);
	/* Nor is a new one-link file under another name. */
	assert_int_equal(e->ops->rmdir(e->cache, e->root, "d"), 0);
	assert_int_equal(tc_create(e, "h", O_EXCL, &h, &fh), 0);
	assert_int_equal(e->ops->getattr(e->cache, h, fh, &st), 0);
	assert_int_equal(st.st_ino, fst.st_ino);
	assert_true(e->ops->node_stale(e->cache, f, h, &st));
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, h);
	e->ops->forget(e->cache, f);
}

/*
 * Every own entry change is expected, and its event, when it comes, drops
 * the expectation.  Those of our hidden names were never dropped (their
 * events are ignored first): each unlink of an open file left two behind,
 * a list that grew for the life of the mount and that every event was
 * compared against.
 */
static void test_hidden_names_leave_no_expectation(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *d, *made;
	struct sbx_open_result res;
	struct sbx_file *fa;
	struct stat st;

	assert_int_equal(e->ops->mkdir(e->cache, e->root, "d", 0755, &d, &st),
			 0);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(tc_create(e, "a", O_EXCL, &a, &fa), 0);
		assert_int_equal(e->ops->write(e->cache, fa, "x", 1, 0), 1);
		/* Hidden, then removed at the close. */
		assert_int_equal(e->ops->unlink(e->cache, e->root, "a"), 0);
		assert_int_equal(tc_close(e, fa), 0);
		e->ops->forget(e->cache, a);
	}
	/* A hidden file moved out of a directory being removed. */
	assert_int_equal(e->ops->create(e->cache, d, "b", 0644,
					O_CREAT | O_EXCL | O_RDWR, &made, &st,
					&res),
			 0);
	assert_int_equal(e->ops->unlink(e->cache, d, "b"), 0);
	assert_int_equal(e->ops->rmdir(e->cache, e->root, "d"), 0);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, made);
	e->ops->forget(e->cache, d);
	tc_settle(e);
	assert_int_equal(fs_cache_expected_events(e->cache), 0);
}

/*
 * Both names of a hard-linked file removed through the mount, then a new
 * file made under one of them behind it, with the dead file's number.
 * The new file's event used to make the removed name's node UNKNOWN while
 * it stayed in the dead file's ring: the lookup then gave the new file
 * that node, tied to the dead file's names and kernel inode.
 */
static void new_file_under_removed_linked_name(struct tc_env *e,
					       bool overflow)
{
	struct sbx_node *f, *g, *g2;
	struct stat st, fst;

	f = f_linked_as_g(e, &fst, &g);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "g"), 0);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "f"), 0);
	/* Events lost: every removed name becomes unknown; the new file's
	 * event comes right after, before anything is looked up again. */
	pmem_watch_hold(e->mem, true);
	if (overflow)
		pmem_ext_overflow(e->mem);
	assert_int_equal(pmem_ext_write(e->mem, "g", "new", 3), 0);
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "g", &g2, &st), 0);
	assert_int_equal(st.st_ino, fst.st_ino); /* reused at once */
	assert_int_equal(st.st_size, 3);
	assert_ptr_not_equal(g2, g);
	assert_true(e->ops->node_stale(e->cache, f, g2, &st));
	assert_true(e->ops->node_stale(e->cache, g, g2, &st));
	e->ops->forget(e->cache, g2);
	e->ops->forget(e->cache, g);
	e->ops->forget(e->cache, f);
}

static void test_new_file_under_a_removed_linked_name(void **state)
{
	new_file_under_removed_linked_name(*state, false);
}

/*
 * The same after an overflow, which makes every removed name unknown: the
 * next lookup there walks the directory again, and the removed name,
 * found naming a one-link file, gets a new node (tree_name_st()).
 */
static void test_new_file_under_a_removed_linked_name_overflow(void **state)
{
	new_file_under_removed_linked_name(*state, true);
}

struct opendir_call {
	struct tc_env *e;
	struct sbx_node *dir;
	struct sbx_file *dh;
	struct names *l; /* readdir_main: where the entries go */
	int rc;
};

static void *opendir_main(void *arg)
{
	struct opendir_call *o = arg;

	o->rc = o->e->ops->opendir(o->e->cache, o->dir, &o->dh);
	return NULL;
}

/* The first READDIR of o->dh (it takes the handle's snapshot). */
static void *readdir_main(void *arg)
{
	struct opendir_call *o = arg;

	o->rc = o->e->ops->readdir(o->e->cache, o->dh, 0, SBX_READDIR_PLUS,
				   collect, o->l);
	return NULL;
}

/*
 * A listing taken before an unlink through the mount and answered after
 * it must not bring the removed name back.  Brought back PRESENT, the
 * removed name of a hard-linked file looked alive: the surviving name's
 * lookup, with one link, got a kernel inode of its own (c_node_stale's
 * "one name only" rule), and descriptors opened through the two names saw
 * different sizes (random tester, seed 970431669: fstat said 18509 bytes
 * after an open(O_TRUNC) and a write of 80 through the other name).
 */
static void test_listing_across_unlink_keeps_the_name_removed(void **state)
{
	struct tc_env *e = *state;
	struct opendir_call o = { .e = e };
	struct sbx_node *c, *g, *made;
	struct stat st;
	pthread_t t;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/c", "data", 4), 0);
	tc_settle(e);
	o.dir = tc_walk_path(e->cache, "d", false, &st);
	c = tc_walk_path(e->cache, "d/c", false, &st);
	assert_int_equal(e->ops->link(e->cache, c, o.dir, "g", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	/* A file made behind the mount: opendir lists again. */
	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	tc_settle(e);
	assert_int_equal(pmem_gate_arm_after(e->mem, "readdir", "d"), 0);
	assert_int_equal(pthread_create(&t, NULL, opendir_main, &o), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(e->ops->unlink(e->cache, o.dir, "c"), 0);
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(o.rc, 0);
	assert_int_equal(e->ops->releasedir(e->cache, o.dh), 0);
	assert_int_equal(e->ops->lookup(e->cache, o.dir, "g", &g, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	/* One file: the kernel's inode of "c" serves "g" too. */
	assert_false(e->ops->node_stale(e->cache, c, g, &st));
	assert_int_equal(e->ops->lookup(e->cache, o.dir, "c", &made, &st),
			 -ENOENT);
	e->ops->forget(e->cache, g);
	e->ops->forget(e->cache, c);
	e->ops->forget(e->cache, o.dir);
}

/*
 * A listing taken before a rename through the mount onto a listed name and
 * answered after it: the name's node is now the moved file's (and the
 * kernel's inode of that file).  The listing's older object under that
 * name must not detach it: the moved file's I/O then found no path
 * (ESTALE).
 */
static void test_listing_across_rename_keeps_the_moved_file(void **state)
{
	struct tc_env *e = *state;
	struct opendir_call o = { .e = e };
	struct sbx_node *y;
	struct stat st;
	pthread_t t;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/c", "data", 4), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/y", "moved", 5), 0);
	tc_settle(e);
	o.dir = tc_walk_path(e->cache, "d", false, &st);
	y = tc_walk_path(e->cache, "d/y", false, &st);
	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	tc_settle(e);
	assert_int_equal(pmem_gate_arm_after(e->mem, "readdir", "d"), 0);
	assert_int_equal(pthread_create(&t, NULL, opendir_main, &o), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(e->ops->rename(e->cache, o.dir, "y", o.dir, "c", 0),
			 0);
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(o.rc, 0);
	assert_int_equal(e->ops->releasedir(e->cache, o.dh), 0);
	assert_int_equal(e->ops->getattr(e->cache, y, NULL, &st), 0);
	assert_int_equal(st.st_size, 5);
	e->ops->forget(e->cache, y);
	e->ops->forget(e->cache, o.dir);
}

/*
 * List d (already opened as o->dir) with the listing's answer taken first
 * and handed back only after an unrelated change through the mount (a new
 * directory at the root): the listing raced a change.  Its entries are
 * collected into *l.
 */
static void raced_listing(struct tc_env *e, struct opendir_call *o,
			  struct names *l)
{
	struct sbx_node *made;
	struct stat st;
	pthread_t t;

	memset(l, 0, sizeof(*l));
	assert_int_equal(pmem_gate_arm_after(e->mem, "readdir", "d"), 0);
	assert_int_equal(pthread_create(&t, NULL, opendir_main, o), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(e->ops->mkdir(e->cache, e->root, "o", 0755, &made,
				       &st),
			 0);
	e->ops->forget(e->cache, made);
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(o->rc, 0);
	assert_int_equal(e->ops->readdir(e->cache, o->dh, 0, SBX_READDIR_PLUS,
					 collect, l),
			 0);
	assert_int_equal(e->ops->releasedir(e->cache, o->dh), 0);
}

/*
 * d holds c and a name n made and removed through the mount a while ago;
 * the stream is held (events wait), and a link of a file x of d then its
 * removal leave the link's attributes to be asked for, so opendir lists
 * again.
 */
static void listing_setup(struct tc_env *e, struct opendir_call *o)
{
	struct sbx_node *n, *x, *made;
	struct sbx_open_result res;
	struct stat st;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/c", "data", 4), 0);
	tc_settle(e);
	o->dir = tc_walk_path(e->cache, "d", false, &st);
	assert_int_equal(e->ops->create(e->cache, o->dir, "n", 0644,
					O_CREAT | O_EXCL | O_WRONLY, &n, &st,
					&res),
			 0);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, n);
	assert_int_equal(e->ops->unlink(e->cache, o->dir, "n"), 0);
	tc_settle(e);
	pmem_watch_hold(e->mem, true);
	x = tc_walk_path(e->cache, "d/x", false, &st);
	assert_int_equal(e->ops->link(e->cache, x, o->dir, "y", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	e->ops->forget(e->cache, x);
	/* y's link count is to be asked for again. */
	assert_int_equal(e->ops->unlink(e->cache, o->dir, "x"), 0);
}

/*
 * A name removed through the mount long before a listing, then made again
 * behind it (its event still to come): a listing that races some other
 * change of ours shows it, as the sandbox does.
 */
static void test_raced_listing_shows_a_name_made_again(void **state)
{
	struct tc_env *e = *state;
	struct opendir_call o = { .e = e };
	struct names l;

	listing_setup(e, &o);
	assert_int_equal(pmem_ext_write(e->mem, "d/n", "again", 5), 0);
	raced_listing(e, &o, &l);
	assert_true(listed(&l, "n"));
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	e->ops->forget(e->cache, o.dir);
}

/*
 * A file replaced behind the mount before a listing (its event still to
 * come): a listing that races some other change of ours shows the new
 * file, not the one the tree knew under the name.
 */
static void test_raced_listing_shows_a_file_replaced_behind(void **state)
{
	struct tc_env *e = *state;
	struct opendir_call o = { .e = e };
	struct sbx_node *c;
	struct names l;
	struct stat st;

	listing_setup(e, &o);
	c = tc_walk_path(e->cache, "d/c", false, &st);
	assert_int_equal(st.st_size, 4);
	assert_int_equal(pmem_ext_write(e->mem, "d/t", "replaced!", 9), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "d/t", "d/c", 0), 0);
	raced_listing(e, &o, &l);
	assert_true(listed(&l, "c"));
	for (int i = 0; i < l.n; i++)
		if (strcmp(l.name[i], "c") == 0)
			assert_int_equal(l.size[i], 9);
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	e->ops->forget(e->cache, c);
	e->ops->forget(e->cache, o.dir);
}

/*
 * Lost events (an overflow) leave nothing cached as valid, not even for a
 * removed name of a hard-linked file, which leaves its name then: a
 * descriptor may still hold that node, and its attributes are asked for
 * again.
 */
static void test_overflow_forgets_a_removed_linked_name(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f;
	struct stat st;

	f = f_linked_as_g(e, &st, NULL);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "f"), 0);
	/* The link's and the unlink's events, ours, first: one landing
	 * while the getattr below is out keeps its answer from being
	 * recorded (it may predate the event), and the getattr after it
	 * would ask again (CI, ASan: 1 run in 3). */
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 0);
	pmem_ext_overflow(e->mem);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 1);
	assert_int_equal(st.st_size, 4);
	e->ops->forget(e->cache, f);
}

/*
 * A create tells the daemon when it made the file (O_EXCL, or the name
 * known free), so that a kernel inode held under the same number, a
 * removed file's, is not given to it whatever the removed file's names
 * look like; and not when the name may have held a file already.
 */
static void test_create_says_when_it_made_the_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_open_result res;
	struct sbx_node *n;
	struct stat st;

	assert_int_equal(e->ops->create(e->cache, e->root, "x", 0644,
					O_CREAT | O_EXCL | O_RDWR, &n, &st,
					&res),
			 0);
	assert_true(res.created);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, n);
	/* Known absent (a lookup said so): made. */
	assert_int_equal(e->ops->lookup(e->cache, e->root, "y", &n, &st),
			 -ENOENT);
	assert_int_equal(e->ops->create(e->cache, e->root, "y", 0644,
					O_CREAT | O_RDWR, &n, &st, &res),
			 0);
	assert_true(res.created);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, n);
	/* Known absent, but a hard link of x made behind the mount just
	 * before, its event still to come: not made by the create. */
	assert_int_equal(e->ops->lookup(e->cache, e->root, "w", &n, &st),
			 -ENOENT);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_link(e->mem, "x", "w"), 0);
	assert_int_equal(e->ops->create(e->cache, e->root, "w", 0644,
					O_CREAT | O_RDWR, &n, &st, &res),
			 0);
	assert_false(res.created);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, n);
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	/* Made behind the mount (its event applied): an existing file. */
	assert_int_equal(pmem_ext_write(e->mem, "z", "z", 1), 0);
	tc_settle(e);
	assert_int_equal(e->ops->create(e->cache, e->root, "z", 0644,
					O_CREAT | O_RDWR, &n, &st, &res),
			 0);
	assert_false(res.created);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, n);
}

/*
 * A listing answered while the last close of a hard-linked file removed
 * a hidden name of it: the link count it carries may or may not count
 * that name, so readdirplus must not hand it to the kernel to keep
 * (random tester, seed 51744238: the kernel kept 1 link for 2).  The
 * entry goes without attributes, or with a count asked for again; a
 * lookup asks again.  The listing is asked for by the first READDIR
 * (opendir's own is usable then; a file made behind the mount makes the
 * READDIR list again).
 */
static void test_listing_across_hidden_removal_hands_no_count(void **state)
{
	struct tc_env *e = *state;
	struct opendir_call o = { .e = e };
	struct sbx_node *a, *b;
	struct sbx_file *fh;
	struct names l;
	struct stat st;
	pthread_t t;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/a", "data", 4), 0);
	tc_settle(e);
	o.dir = tc_walk_path(e->cache, "d", false, &st);
	a = tc_walk_path(e->cache, "d/a", false, &st);
	assert_int_equal(e->ops->link(e->cache, a, o.dir, "b", &b, &st), 0);
	assert_int_equal(tc_open(e, b, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, o.dir, "b"), 0);
	assert_int_equal(e->ops->opendir(e->cache, o.dir, &o.dh), 0);
	/* Hidden: 2 links in the sandbox, 1 for the user.  No event is
	 * still to come that the listing could race. */
	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	tc_settle(e);
	memset(&l, 0, sizeof(l));
	o.l = &l;
	assert_int_equal(pmem_gate_arm_after(e->mem, "readdir", "d"), 0);
	assert_int_equal(pthread_create(&t, NULL, readdir_main, &o), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(tc_close(e, fh), 0); /* removes the hidden name */
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(o.rc, 0);
	assert_int_equal(e->ops->releasedir(e->cache, o.dh), 0);
	assert_true(listed(&l, "a"));
	assert_true(listed(&l, "x"));
	for (int i = 0; i < l.n; i++)
		if (strcmp(l.name[i], "a") == 0)
			assert_int_equal(l.nlink[i], 0);
	/* Asked for again, the count is the sandbox's. */
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
	e->ops->forget(e->cache, o.dir);
}

struct removal_window {
	struct tc_env *e;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool landed, go;
};

/*
 * At the start of the removal of a hidden name: remove it in the sandbox
 * (the removal has landed; the call then finds it gone, which it takes
 * as done) and hold the call until the test says go, or 1 s.
 */
static void removal_window_hook(const char *op, const char *path,
				void *payload)
{
	struct removal_window *w = payload;
	struct timespec until;

	if (strcmp(op, "unlink") != 0 || !strstr(path, ".sbx-silly."))
		return;
	assert_int_equal(pmem_ext_unlink(w->e->mem, path), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 1;
	pthread_mutex_lock(&w->lock);
	w->landed = true;
	pthread_cond_broadcast(&w->cond);
	while (!w->go &&
	       pthread_cond_timedwait(&w->cond, &w->lock, &until) == 0)
		;
	pthread_mutex_unlock(&w->lock);
}

struct close_call {
	struct tc_env *e;
	struct sbx_file *fh;
	int rc;
};

static void *close_main(void *arg)
{
	struct close_call *cc = arg;

	cc->rc = tc_close(cc->e, cc->fh);
	return NULL;
}

/*
 * A file of three names, one removed while open (hidden): its last close
 * removes the hidden name.  While that removal is out -- landed in the
 * sandbox, not yet known done -- an open of another name looks at the
 * file again (the stream unhealthy) and keeps the sandbox's count, which
 * no longer counts the hidden name; a stat must not take the hidden name
 * off it once more (random tester, seed 367681880: 1 link for 2).
 */
static void test_count_kept_during_hidden_removal(void **state)
{
	struct tc_env *e = *state;
	struct removal_window w = { .e = e,
				    .lock = PTHREAD_MUTEX_INITIALIZER,
				    .cond = PTHREAD_COND_INITIALIZER };
	struct close_call cc = { .e = e };
	struct sbx_node *d, *a, *b, *c;
	struct sbx_file *fa;
	struct stat st;
	pthread_t t;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/a", "data", 4), 0);
	assert_int_equal(pmem_ext_link(e->mem, "d/a", "d/b"), 0);
	assert_int_equal(pmem_ext_link(e->mem, "d/a", "d/c"), 0);
	tc_settle(e);
	d = tc_walk_path(e->cache, "d", false, &st);
	a = tc_walk_path(e->cache, "d/a", false, &st);
	b = tc_walk_path(e->cache, "d/b", false, &st);
	c = tc_walk_path(e->cache, "d/c", false, &st);
	assert_int_equal(tc_open(e, b, O_RDONLY, &cc.fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, d, "b"), 0);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	pmem_set_hook(e->mem, removal_window_hook, &w);
	assert_int_equal(pthread_create(&t, NULL, close_main, &cc), 0);
	pthread_mutex_lock(&w.lock);
	while (!w.landed)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	pmem_set_healthy(e->mem, false);
	assert_int_equal(tc_open(e, a, O_RDWR, &fa), 0);
	pmem_set_healthy(e->mem, true);
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	pthread_mutex_lock(&w.lock);
	w.go = true;
	pthread_cond_broadcast(&w.cond);
	pthread_mutex_unlock(&w.lock);
	pthread_join(t, NULL);
	pmem_set_hook(e->mem, NULL, NULL);
	assert_int_equal(cc.rc, 0);
	assert_int_equal(e->ops->getattr(e->cache, c, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(tc_close(e, fa), 0);
	e->ops->forget(e->cache, c);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
	e->ops->forget(e->cache, d);
}

struct open_call {
	struct tc_env *e;
	struct sbx_node *n;
	struct sbx_file *fh;
	int rc;
};

static void *open_main(void *arg)
{
	struct open_call *o = arg;

	o->rc = tc_open(o->e, o->n, O_RDWR, &o->fh);
	return NULL;
}

/*
 * The same file of three names, one hidden: an open's look at the file
 * (the stream unhealthy) takes the count while the hidden name is still
 * there, and the hidden name's removal lands and ends before the open
 * keeps it.  Kept, a stat right after took nothing off (the name is gone)
 * and said 3 links for 2 (random tester, seed 367681880).
 */
static void test_open_keeps_no_count_across_hidden_removal(void **state)
{
	struct tc_env *e = *state;
	struct open_call o = { .e = e };
	struct sbx_node *d, *b;
	struct sbx_file *fb;
	struct stat st;
	pthread_t t;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/a", "data", 4), 0);
	assert_int_equal(pmem_ext_link(e->mem, "d/a", "d/b"), 0);
	assert_int_equal(pmem_ext_link(e->mem, "d/a", "d/c"), 0);
	tc_settle(e);
	d = tc_walk_path(e->cache, "d", false, &st);
	o.n = tc_walk_path(e->cache, "d/a", false, &st);
	b = tc_walk_path(e->cache, "d/b", false, &st);
	assert_int_equal(tc_open(e, b, O_RDONLY, &fb), 0);
	assert_int_equal(e->ops->unlink(e->cache, d, "b"), 0);
	tc_settle(e);
	pmem_set_healthy(e->mem, false);
	assert_int_equal(pmem_gate_arm_after(e->mem, "getattr", "d/a"), 0);
	assert_int_equal(pthread_create(&t, NULL, open_main, &o), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(tc_close(e, fb), 0); /* removes the hidden name */
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(o.rc, 0);
	pmem_set_healthy(e->mem, true);
	assert_int_equal(e->ops->getattr(e->cache, o.n, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(tc_close(e, o.fh), 0);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, o.n);
	e->ops->forget(e->cache, d);
}

struct move_on_call {
	struct tc_env *e;
	const char *from, *to; /* the rename to make, once */
	bool done;
};

/*
 * At the first call of the provider about `from` (the cache's stat or
 * read of it is on its way): the file is renamed in the sandbox first.
 */
static void move_on_call_hook(const char *op, const char *path,
			      void *payload)
{
	struct move_on_call *m = payload;

	(void)op;
	if (m->done || !path || strcmp(path, m->from) != 0)
		return;
	m->done = true;
	assert_int_equal(pmem_ext_rename(m->e->mem, m->from, m->to, 0), 0);
}

/*
 * A stat and a read of an open file whose request meets the file renamed
 * away (in the sandbox here; a rename through the mount under way is the
 * other case): they go again where it went, as pushes and fsync do (the
 * stress test saw fstat say ESTALE and pread ENOENT while another thread
 * renamed the file through the mount).
 */
static void test_stat_and_read_go_where_the_file_went(void **state)
{
	struct tc_env *e = *state;
	struct move_on_call m = { .e = e };
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_write(e->mem, "f", "data", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	/* Attributes and content the cache must ask for again. */
	assert_int_equal(pmem_ext_pwrite(e->mem, "f", "DATA", 4, 0), 0);
	tc_settle(e);
	m.from = "f";
	m.to = "g";
	pmem_set_hook(e->mem, move_on_call_hook, &m);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_true(m.done);
	assert_int_equal(st.st_size, 4);
	assert_int_equal(pmem_ext_pwrite(e->mem, "g", "Data", 4, 0), 0);
	tc_settle(e);
	m.from = "g";
	m.to = "h";
	m.done = false;
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 4);
	assert_true(m.done);
	assert_memory_equal(buf, "Data", 4);
	pmem_set_hook(e->mem, NULL, NULL);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
}

/*
 * The exec barrier (syncfs) with a file whose buffered bytes the sandbox
 * refuses (removed there): the barrier passes, the owner's close() says
 * it (the stress test saw `sbx exec` fail before its command ran when
 * another process's file was renamed while its push was out).
 */
static void test_barrier_is_not_a_refused_file_to_fail(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "data", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "DATA", 4, 0), 4);
	assert_int_equal(pmem_ext_unlink(e->mem, "f"), 0);
	tc_settle(e);
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	assert_true(tc_close(e, fh) < 0);
	sbx_error_clear();
	e->ops->forget(e->cache, n);
}

struct close_on_walk {
	struct tc_env *e;
	struct sbx_file *fh;
	int rc;
};

/* At a bulk walk's records taken, the last close of fh. */
static void close_on_walk_hook(const char *op, const char *path,
			       void *payload)
{
	struct close_on_walk *w = payload;

	(void)path;
	if (strcmp(op, "bulk:sent") != 0 || !w->fh)
		return;
	w->rc = tc_close(w->e, w->fh);
	w->fh = NULL;
}

/*
 * A bulk walk whose records were taken before the last close of a
 * hard-linked file's removed name removed its hidden name, delivered
 * after: the link count they carry counts the hidden name, and the cache
 * must not keep it (random tester, seed 55013542: a count of 2 for 1).
 */
static void test_walk_across_hidden_removal_keeps_no_count(void **state)
{
	struct tc_env *e = *state;
	struct close_on_walk w = { .e = e };
	struct sbx_node *d, *a, *b, *n;
	struct stat st;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/a", "data", 4), 0);
	tc_settle(e);
	d = tc_walk_path(e->cache, "d", false, &st);
	a = tc_walk_path(e->cache, "d/a", false, &st);
	assert_int_equal(e->ops->link(e->cache, a, d, "b", &b, &st), 0);
	assert_int_equal(tc_open(e, b, O_RDWR, &w.fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, d, "b"), 0);
	/* Lost events: the next lookup in d walks it again. */
	pmem_ext_overflow(e->mem);
	tc_settle(e);
	pmem_set_hook(e->mem, close_on_walk_hook, &w);
	assert_int_equal(e->ops->lookup(e->cache, d, "a", &n, &st), 0);
	pmem_set_hook(e->mem, NULL, NULL);
	assert_null(w.fh);
	assert_int_equal(w.rc, 0);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 1);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
	e->ops->forget(e->cache, d);
}

/* ... while the file's surviving name shares the removed name's inode. */
static void test_surviving_name_is_the_same_file(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f, *g;
	struct stat st;

	f = f_linked_as_g(e, &st, NULL);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "f"), 0);
	g = tc_walk_path(e->cache, "g", false, &st);
	assert_int_equal(st.st_nlink, 1);
	assert_false(e->ops->node_stale(e->cache, f, g, &st));
	e->ops->forget(e->cache, g);
	e->ops->forget(e->cache, f);
}

/*
 * A link through one name of a hard-linked file: every other name has one
 * link more, including a name whose count the cache holds (random tester,
 * seed 450131391: fstat said 2 links where a local disk says 3).
 */
static void test_link_counts_for_every_name(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *b, *made;
	struct sbx_file *fa;
	struct stat st;

	assert_int_equal(tc_create(e, "a", O_EXCL, &a, &fa), 0);
	assert_int_equal(tc_close(e, fa), 0);
	assert_int_equal(e->ops->link(e->cache, a, e->root, "b", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(e->ops->watch_sync(e->cache), 0);
	b = tc_walk_path(e->cache, "b", false, &st);
	assert_int_equal(e->ops->getattr(e->cache, b, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(e->ops->link(e->cache, a, e->root, "c", &made, &st),
			 0);
	assert_int_equal(st.st_nlink, 3);
	e->ops->forget(e->cache, made);
	assert_int_equal(e->ops->getattr(e->cache, b, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 3);
	assert_int_equal(e->ops->getattr(e->cache, a, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 3);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/* One call of the cache made on a thread (see parked_across_last_close):
 * `kind` says which, on node n (lookup: of `name` in the root; link: n as
 * "c" in the root, the new node in *made). */
enum call_kind { CALL_GETATTR, CALL_LOOKUP, CALL_CHMOD_600, CALL_LINK };

struct call_job {
	struct tc_env *e;
	enum call_kind kind;
	struct sbx_node *n, *made;
	const char *name;
	struct stat st; /* the answer */
	int rc;
};

static void *call_main(void *arg)
{
	struct call_job *j = arg;
	struct sbx_sandbox *c = j->e->cache;
	const struct sbx_sandbox_ops *ops = j->e->ops;
	struct stat in;

	switch (j->kind) {
	case CALL_GETATTR:
		j->rc = ops->getattr(c, j->n, NULL, &j->st);
		break;
	case CALL_LOOKUP:
		j->rc = ops->lookup(c, j->e->root, j->name, &j->n, &j->st);
		break;
	case CALL_CHMOD_600:
		memset(&in, 0, sizeof(in));
		in.st_mode = S_IFREG | 0600;
		j->rc = ops->setattr(c, j->n, NULL, &in, SBX_SET_MODE, &j->st);
		break;
	case CALL_LINK:
		j->rc = ops->link(c, j->n, j->e->root, "c", &j->made, &j->st);
		break;
	}
	return NULL;
}

/*
 * A file "a" with a second name "b" linked through the cache, open through
 * b (*fh), and b removed: its hidden name stays until *fh is closed.
 */
static void a_with_b_open_and_removed(struct tc_env *e, struct sbx_node **a,
				      struct sbx_node **b, struct sbx_file **fh)
{
	struct sbx_node *made;
	struct sbx_file *fa;
	struct stat st;

	assert_int_equal(tc_create(e, "a", O_EXCL, a, &fa), 0);
	assert_int_equal(tc_close(e, fa), 0);
	assert_int_equal(e->ops->link(e->cache, *a, e->root, "b", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	*b = tc_walk_path(e->cache, "b", false, &st);
	assert_int_equal(tc_open(e, *b, O_RDWR, fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "b"), 0);
}

/*
 * Run fn(job) on a thread whose call of `op` on `path` parks at the gate
 * (once its answer is made, with `after`); while it is parked, the last
 * close of fh removes the hidden name; then the call goes on, and the
 * thread is joined.
 */
static void parked_across_last_close(struct tc_env *e, const char *op,
				     const char *path, bool after,
				     void *(*fn)(void *), void *job,
				     struct sbx_file *fh)
{
	struct timespec until;
	pthread_t t;

	assert_int_equal(after ? pmem_gate_arm_after(e->mem, op, path)
			       : pmem_gate_arm(e->mem, op, path),
			 0);
	assert_int_equal(pthread_create(&t, NULL, fn, job), 0);
	assert_int_equal(pmem_gate_wait(e->mem, WATCHDOG_S * 1000), 0);
	assert_int_equal(tc_close(e, fh), 0);
	pmem_gate_release(e->mem);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += WATCHDOG_S;
	assert_int_equal(pthread_timedjoin_np(t, NULL, &until), 0);
}

/*
 * The link count of a hard-linked file fetched while the last close
 * removes its hidden name (the name unlinked while open): the sandbox
 * answered 2 (the hidden name still there), and by the time the answer is
 * taken apart the hidden name is gone, so it is not subtracted.  The count
 * must be asked again (random tester, seed 736082533: stat said 3 links,
 * a local disk 2).
 */
static void test_link_count_fetched_across_a_hidden_removal(void **state)
{
	struct tc_env *e = *state;
	struct call_job j = {.e = e, .kind = CALL_GETATTR};
	struct sbx_node *a, *b;
	struct sbx_file *fh;

	a_with_b_open_and_removed(e, &a, &b, &fh);
	/* The stat's answer is made (2 links), then held back while the
	 * last close removes the hidden name. */
	j.n = a;
	parked_across_last_close(e, "getattr", "a", true, call_main, &j,
				 fh);
	assert_int_equal(j.rc, 0);
	assert_int_equal(j.st.st_nlink, 1);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * The same for a LOOKUP of a name the tree has not tied to the file yet
 * (made behind the mount: its node is not in the file's ring, so the
 * file's own count of hidden-name removals does not see this one move).
 * The sandbox answered 3 links (the hidden name still there); taken apart
 * after the last close removed it, the count was 3 for 2; the other
 * order gave 1 for 2 (random tester, seed 19350260: fstat of a file just
 * opened, right after the last close of its name removed while open).
 */
static void test_lookup_count_fetched_across_a_hidden_removal(void **state)
{
	struct tc_env *e = *state;
	struct call_job j = {.e = e, .kind = CALL_LOOKUP, .name = "c"};
	struct sbx_node *a, *b;
	struct sbx_file *fh;

	a_with_b_open_and_removed(e, &a, &b, &fh);
	assert_int_equal(pmem_ext_link(e->mem, "a", "c"), 0);
	tc_settle(e);
	/* The lookup's answer is made (3 links: a, c, the hidden name),
	 * then held back while the last close removes the hidden name. */
	parked_across_last_close(e, "getattr", "c", true, call_main, &j,
				 fh);
	assert_int_equal(j.rc, 0);
	assert_int_equal(j.st.st_nlink, 2);
	e->ops->forget(e->cache, j.n);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * And for a GETATTR of a node that the kernel got while its file had one
 * name (so it is in no ring), another name made behind the mount since,
 * opened and removed here: its hidden name's removal moves nothing the
 * node counts, and the count taken before it (2) was kept for 1.
 */
static void test_getattr_count_of_an_unringed_node(void **state)
{
	struct tc_env *e = *state;
	struct call_job j = {.e = e, .kind = CALL_GETATTR};
	struct sbx_node *a, *b;
	struct sbx_file *fh, *fa;
	struct stat st;

	assert_int_equal(tc_create(e, "a", O_EXCL, &a, &fa), 0);
	assert_int_equal(tc_close(e, fa), 0);
	assert_int_equal(pmem_ext_link(e->mem, "a", "b"), 0);
	tc_settle(e);
	b = tc_walk_path(e->cache, "b", false, &st);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(tc_open(e, b, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "b"), 0);
	/* (A change behind the mount so that a's attributes are asked.) */
	assert_int_equal(pmem_ext_chmod(e->mem, "a", 0600), 0);
	tc_settle(e);
	/* The getattr's answer is made (2 links: a, the hidden name), then
	 * held back while the last close removes the hidden name. */
	j.n = a;
	parked_across_last_close(e, "getattr", "a", true, call_main, &j,
				 fh);
	assert_int_equal(j.rc, 0);
	assert_int_equal(j.st.st_nlink, 1);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * A setattr's answer, which the kernel keeps as the file's attributes,
 * made while a hidden name of the file was still there and taken apart
 * after the last close removed it: 2 links for 1.
 */
static void test_setattr_count_fetched_across_a_hidden_removal(void **state)
{
	struct tc_env *e = *state;
	struct call_job j = {.e = e, .kind = CALL_CHMOD_600};
	struct sbx_node *a, *b;
	struct sbx_file *fh;

	a_with_b_open_and_removed(e, &a, &b, &fh);
	/* The chmod's answer is made (2 links: a, the hidden name), then held
	 * back while the last close removes the hidden name. */
	j.n = a;
	parked_across_last_close(e, "setattr", "a", true, call_main, &j, fh);
	assert_int_equal(j.rc, 0);
	assert_int_equal(j.st.st_mode & 07777, 0600);
	assert_int_equal(j.st.st_nlink, 1);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * And a link's answer (the new name's attributes, which the kernel keeps
 * for the file): held back after it was made, by its release of the
 * source ("forget", the first call after the link), while the last close
 * removes the hidden name: 3 links for 2.
 */
static void test_link_answer_across_a_hidden_removal(void **state)
{
	struct tc_env *e = *state;
	struct call_job j = {.e = e, .kind = CALL_LINK};
	struct sbx_node *a, *b;
	struct sbx_file *fh;

	a_with_b_open_and_removed(e, &a, &b, &fh);
	/* The link's answer is made (3 links: a, c, the hidden name), then
	 * held back (at its release of the source) while the last close
	 * removes the hidden name. */
	j.n = a;
	parked_across_last_close(e, "forget", "a", false, call_main, &j, fh);
	assert_int_equal(j.rc, 0);
	assert_int_equal(j.st.st_nlink, 2);
	e->ops->forget(e->cache, j.made);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * open(O_CREAT) of an existing hard-linked file whose other name was
 * removed while open: the create's answer carries the sandbox's count,
 * hidden name included, and the kernel keeps it (random tester, seeds
 * 894512807 and 491753834: fstat after such an open, right after the
 * last close of the removed name, said 2 links for 1).
 */
static void test_create_of_a_linked_file_counts_no_hidden_name(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *b, *made;
	struct sbx_open_result res;
	struct sbx_file *fh;
	struct stat st;

	a_with_b_open_and_removed(e, &a, &b, &fh);
	assert_int_equal(e->ops->create(e->cache, e->root, "a", 0644,
					O_CREAT | O_RDWR, &made, &st, &res),
			 0);
	assert_false(res.created);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(tc_close(e, res.fh), 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * A rename onto a name that is open here (through another name of the same
 * file) but that was removed behind the mount: nothing is left to hide, and
 * the rename must go on (random tester, seed 983871424: it said ENOENT, the
 * silly rename's answer).
 */
static void test_rename_onto_a_name_removed_behind_the_mount(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *b, *made, *x;
	struct sbx_file *fa, *fh;
	struct stat st;
	char buf[8];

	assert_int_equal(tc_create(e, "a", O_EXCL, &a, &fa), 0);
	assert_int_equal(e->ops->write(e->cache, fa, "aaa", 3, 0), 3);
	assert_int_equal(tc_close(e, fa), 0);
	assert_int_equal(e->ops->link(e->cache, a, e->root, "b", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	b = tc_walk_path(e->cache, "b", false, &st);
	assert_int_equal(tc_open(e, b, O_RDONLY, &fh), 0);
	assert_int_equal(pmem_ext_write(e->mem, "c", "ccc", 3), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "b"), 0);
	tc_settle(e);
	x = tc_walk_path(e->cache, "c", false, &st);
	e->ops->forget(e->cache, x);
	assert_int_equal(e->ops->rename(e->cache, e->root, "c", e->root, "b",
					0),
			 0);
	assert_true(tc_holds(e, "b", "ccc", 3));
	assert_true(tc_holds(e, "a", "aaa", 3));
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 3);
	assert_memory_equal(buf, "aaa", 3);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, b);
	e->ops->forget(e->cache, a);
}

/*
 * A file open here, renamed in the sandbox (a log rotated by a command
 * there, or a rename through the mount whose answer an outage lost):
 * its descriptor reads and writes the file under its new name, as on a
 * local disk.
 */
static void test_open_file_follows_a_rename_behind_the_mount(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/log", "one\n", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "s/log", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "s/log", "s/log.1", 0), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/log.1", "one\ntwo\n", 8),
			 0);
	tc_settle(e);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 8);
	assert_memory_equal(buf, "one\ntwo\n", 8);
	assert_int_equal(e->ops->write(e->cache, fh, "3\n", 2, 8), 2);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(tc_holds(e, "s/log.1", "one\ntwo\n3\n", 10));
	e->ops->forget(e->cache, n);
}

/*
 * A file with bytes buffered when it is renamed in the sandbox: they land
 * in the file under its new name at close (they were lost: the push to
 * the old name said ENOENT).  Found in review: the buffered node kept its
 * slot through the old name's event, and was not followed.
 */
static void test_buffered_bytes_follow_a_rename_behind_the_mount(
	void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "notes", "notes\n", 6), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "notes", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "NOTES", 5, 0), 5);
	assert_int_equal(pmem_ext_rename(e->mem, "notes", "notes.old", 0), 0);
	tc_settle(e);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(tc_holds(e, "notes.old", "NOTES\n", 6));
	assert_int_equal(pmem_ext_stat(e->mem, "notes", &st), -ENOENT);
	e->ops->forget(e->cache, n);
}

/*
 * RENAME_EXCHANGE in the sandbox of two files open here (reported as two
 * renames, each the other way): both are followed, the second by putting
 * back the node the first replaced (before 2026-12-07, second session,
 * that one's descriptors got ESTALE).  Of two directories: the same, and
 * names looked up through either are its own.  Never the other file's
 * bytes.
 */
static void test_exchange_in_the_sandbox_is_followed(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *x, *y, *d1, *d2, *n, *m, *k;
	struct sbx_file *fx, *fy, *fh, *fm;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_write(e->mem, "x", "XXXX", 4), 0);
	assert_int_equal(pmem_ext_write(e->mem, "y", "YY", 2), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "d1", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "d2", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d1/f", "one", 3), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d2/f", "two2", 4), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d2/only2", "2", 1), 0);
	tc_settle(e);
	x = tc_walk_path(e->cache, "x", false, &st);
	y = tc_walk_path(e->cache, "y", false, &st);
	d1 = tc_walk_path(e->cache, "d1", false, &st);
	d2 = tc_walk_path(e->cache, "d2", false, &st);
	n = tc_walk_path(e->cache, "d1/f", false, &st);
	m = tc_walk_path(e->cache, "d2/only2", false, &st);
	assert_int_equal(tc_open(e, x, O_RDWR, &fx), 0);
	assert_int_equal(tc_open(e, y, O_RDWR, &fy), 0);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	assert_int_equal(tc_open(e, m, O_RDONLY, &fm), 0);
	/* Bytes buffered for the file that moves second go with it. */
	assert_int_equal(e->ops->write(e->cache, fy, "Y", 1, 2), 1);
	assert_int_equal(pmem_ext_rename(e->mem, "x", "y", RENAME_EXCHANGE),
			 0);
	assert_int_equal(pmem_ext_rename(e->mem, "d1", "d2", RENAME_EXCHANGE),
			 0);
	tc_settle(e);
	assert_int_equal(e->ops->read(e->cache, fx, buf, sizeof(buf), 0), 4);
	assert_memory_equal(buf, "XXXX", 4);
	assert_int_equal(e->ops->read(e->cache, fy, buf, sizeof(buf), 0), 3);
	assert_memory_equal(buf, "YYY", 3);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 3);
	assert_memory_equal(buf, "one", 3);
	assert_int_equal(e->ops->read(e->cache, fm, buf, sizeof(buf), 0), 1);
	assert_memory_equal(buf, "2", 1);
	/* By its new name too, buffered bytes and all. */
	assert_int_equal(e->ops->lookup(e->cache, e->root, "x", &k, &st), 0);
	assert_ptr_equal(k, y);
	assert_int_equal(st.st_size, 3);
	e->ops->forget(e->cache, k);
	/* A file made in d1's directory (named d2 now), and what is not. */
	assert_int_equal(pmem_ext_write(e->mem, "d2/new", "n", 1), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, d1, "new", &k, &st), 0);
	e->ops->forget(e->cache, k);
	assert_int_equal(e->ops->lookup(e->cache, d1, "only2", &k, &st),
			 -ENOENT);
	sbx_error_clear();
	assert_int_equal(e->ops->lookup(e->cache, d2, "new", &k, &st),
			 -ENOENT);
	sbx_error_clear();
	assert_int_equal(e->ops->lookup(e->cache, d2, "only2", &k, &st), 0);
	assert_int_equal(st.st_size, 1);
	e->ops->forget(e->cache, k);
	assert_int_equal(tc_close(e, fx), 0);
	assert_int_equal(tc_close(e, fy), 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(tc_close(e, fm), 0);
	assert_true(tc_holds(e, "y", "XXXX", 4));
	assert_true(tc_holds(e, "x", "YYY", 3));
	assert_true(tc_holds(e, "d1/only2", "2", 1));
	e->ops->forget(e->cache, m);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, d2);
	e->ops->forget(e->cache, d1);
	e->ops->forget(e->cache, y);
	e->ops->forget(e->cache, x);
}

/*
 * A directory listed by a path the sandbox has given to another directory
 * (the two exchanged there, the events still on their way): the listing
 * is the directory's own, from where the change stream says it went.
 * Listed by the old path, it got the other directory's entries, which the
 * kernel kept as its listing (CI: test_remote.py
 * test_directories_exchanged_in_the_sandbox saw `one` list `two`'s old
 * entries for good, once under load).
 */
static void test_listing_by_a_path_another_directory_took(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *d1, *d2;
	struct stat st;
	struct names l;
	ino_t d2_ino;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d1", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "d2", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d1/f1", "1", 1), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d2/f2", "2", 1), 0);
	tc_settle(e);
	d1 = tc_walk_path(e->cache, "d1", false, &st);
	d2 = tc_walk_path(e->cache, "d2", false, &st);
	list_dir(e, d2, &l);
	assert_true(listed(&l, "f2"));
	/* A change inside: its listing is asked for again. */
	assert_int_equal(pmem_ext_write(e->mem, "d2/g2", "2", 1), 0);
	tc_settle(e);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_rename(e->mem, "d1", "d2", RENAME_EXCHANGE),
			 0);
	list_dir(e, d2, &l);
	assert_true(listed(&l, "f2"));
	assert_true(listed(&l, "g2"));
	assert_false(listed(&l, "f1"));
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	list_dir(e, d1, &l);
	assert_true(listed(&l, "f1"));
	assert_false(listed(&l, "f2"));
	list_dir(e, d2, &l);
	assert_true(listed(&l, "g2"));
	assert_false(listed(&l, "f1"));
	/* A stat by the path, likewise: the directory's own attributes. */
	assert_int_equal(e->ops->getattr(e->cache, d2, NULL, &st), 0);
	d2_ino = st.st_ino;
	/* (d2 is at d1 now: a change inside drops its attributes.) */
	assert_int_equal(pmem_ext_write(e->mem, "d1/h2", "2", 1), 0);
	tc_settle(e);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_rename(e->mem, "d1", "d2", RENAME_EXCHANGE),
			 0);
	assert_int_equal(e->ops->getattr(e->cache, d2, NULL, &st), 0);
	assert_int_equal(st.st_ino, d2_ino);
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	e->ops->forget(e->cache, d2);
	e->ops->forget(e->cache, d1);
}

/*
 * A stat of an open file that the sandbox replaced (another file moved
 * over its name): never the new file's attributes (the node became that
 * file in place before 2026-12-08).  As for a file removed there
 * (test_fstat_of_a_file_removed_behind_the_mount): before the event,
 * ESTALE, so that a stat() by the path looks the name up again; after it,
 * the file's last attributes for its descriptor.  (Its reads are another
 * matter: docs/design.md, Known defects.)
 */
static void test_fstat_of_a_file_replaced_in_the_sandbox(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;
	ino_t ino;

	assert_int_equal(pmem_ext_write(e->mem, "f", "data", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	ino = st.st_ino;
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	/* Its attributes are asked for again. */
	assert_int_equal(pmem_ext_pwrite(e->mem, "f", "DATA", 4, 0), 0);
	tc_settle(e);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_write(e->mem, "g", "another", 7), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "g", "f", 0), 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), -ESTALE);
	sbx_error_clear();
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_ino, ino);
	assert_int_equal(st.st_size, 4);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
}

/*
 * A descriptor of a file then replaced (an editor's save) or removed in
 * the sandbox reads the bytes the file had, as on a local disk, when the
 * cache holds them; the name reads the new file.  (Said ESTALE before:
 * `cat` of a file saved in the sandbox as its event came failed.)
 */
static void test_read_of_a_file_gone_from_the_sandbox(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n, *m, *k;
	struct sbx_file *fh, *fh2, *fh3;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_write(e->mem, "f", "old bytes", 9), 0);
	assert_int_equal(pmem_ext_write(e->mem, "r", "removed", 7), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	m = tc_walk_path(e->cache, "r", false, &st);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	assert_int_equal(tc_open(e, m, O_RDONLY, &fh2), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, 3, 0), 3);
	assert_int_equal(pmem_ext_write(e->mem, "f.tmp", "new", 3), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "f.tmp", "f", 0), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "r"), 0);
	tc_settle(e);
	/* The name looked up again: a new node takes it. */
	k = tc_walk_path(e->cache, "f", false, &st);
	assert_ptr_not_equal(k, n);
	assert_int_equal(tc_open(e, k, O_RDONLY, &fh3), 0);
	assert_int_equal(e->ops->read(e->cache, fh3, buf, sizeof(buf), 0), 3);
	assert_memory_equal(buf, "new", 3);
	assert_int_equal(tc_close(e, fh3), 0);
	e->ops->forget(e->cache, k);
	memset(buf, 0, sizeof(buf));
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 9);
	assert_memory_equal(buf, "old bytes", 9);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 4), 5);
	assert_memory_equal(buf, "bytes", 5);
	assert_int_equal(e->ops->read(e->cache, fh2, buf, sizeof(buf), 0), 7);
	assert_memory_equal(buf, "removed", 7);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(tc_close(e, fh2), 0);
	assert_true(tc_holds(e, "f", "new", 3));
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, m);
}

/*
 * An open that looks at the file again (its name unknown since a rename
 * in the sandbox was followed) and finds another file at the path: ESTALE,
 * so that the kernel looks the path up again, not the node turned into
 * the other file (its descriptors then read that file's bytes: stress
 * agent, chains of exchanges and renames).
 */
static void test_open_by_a_path_another_file_took(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n, *k;
	struct sbx_file *fh;
	struct stat st;
	ino_t mine;
	char buf[16];

	assert_int_equal(pmem_ext_write(e->mem, "f", "mine", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	mine = st.st_ino;
	assert_int_equal(pmem_ext_rename(e->mem, "f", "g", 0), 0);
	tc_settle(e);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_write(e->mem, "h", "theirs", 6), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "g", "f2", 0), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "h", "g", 0), 0);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), -ESTALE);
	sbx_error_clear();
	/* Never the other file's attributes either. */
	if (e->ops->getattr(e->cache, n, NULL, &st) == 0)
		assert_int_equal(st.st_ino, mine);
	sbx_error_clear();
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	k = tc_walk_path(e->cache, "g", false, &st);
	assert_ptr_not_equal(k, n);
	assert_int_not_equal(st.st_ino, mine);
	assert_int_equal(tc_open(e, k, O_RDONLY, &fh), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 6);
	assert_memory_equal(buf, "theirs", 6);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, k);
	e->ops->forget(e->cache, n);
}

/*
 * A chmod or truncate of a file whose path the sandbox gave to another
 * file (its events on their way) is for the file, never the other one:
 * the path's file is not n's (ESTALE), the stream then says where n went,
 * and the setattr goes there.  (It went by the path unchecked before, and
 * truncated the other file.)
 */
static void test_setattr_by_a_path_another_file_took(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *n;
	struct stat st, in;

	assert_int_equal(pmem_ext_write(e->mem, "f", "mine", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "f", false, &st);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_rename(e->mem, "f", "moved", 0), 0);
	assert_int_equal(pmem_ext_write(e->mem, "f", "theirs", 6), 0);
	memset(&in, 0, sizeof(in));
	in.st_mode = 0600;
	in.st_size = 1;
	assert_int_equal(e->ops->setattr(e->cache, n, NULL, &in,
					 SBX_SET_MODE | SBX_SET_SIZE, &st),
			 0);
	assert_true(tc_holds(e, "f", "theirs", 6));
	assert_int_equal(pmem_ext_stat(e->mem, "f", &st), 0);
	assert_int_not_equal(st.st_mode & 07777, 0600);
	assert_true(tc_holds(e, "moved", "m", 1));
	assert_int_equal(pmem_ext_stat(e->mem, "moved", &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	pmem_watch_hold(e->mem, false);
	e->ops->forget(e->cache, n);
}

/*
 * A rename followed from the sandbox leaves its old name unknown, not
 * absent: the sandbox is ahead of its events, and the other half of an
 * exchange may have filled it already (directories exchanged in the
 * sandbox, looked up between the events: `two` said ENOENT for as long
 * as the stream stayed healthy).
 */
static void test_old_name_of_a_followed_rename_is_asked(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *one, *k;
	struct stat st;
	ino_t two_ino;

	assert_int_equal(pmem_ext_mkdir(e->mem, "one", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->mem, "two", 0755), 0);
	tc_settle(e);
	one = tc_walk_path(e->cache, "one", false, &st);
	k = tc_walk_path(e->cache, "two", false, &st);
	two_ino = st.st_ino;
	e->ops->forget(e->cache, k);
	/* The exchange's events, with a lookup of `one` between them that
	 * sees `two`'s directory there: the first half then cannot be
	 * followed, the second can, and it moves `two`'s node away from
	 * the name its own first half filled. */
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_rename(e->mem, "one", "two", RENAME_EXCHANGE),
			 0);
	assert_true(pmem_watch_pending(e->mem) > 0);
	pmem_watch_deliver(e->mem, 1);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "one", &k, &st), 0);
	assert_int_equal(st.st_ino, two_ino);
	e->ops->forget(e->cache, k);
	pmem_watch_hold(e->mem, false);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "two", &k, &st), 0);
	assert_int_not_equal(st.st_ino, two_ino);
	e->ops->forget(e->cache, k);
	e->ops->forget(e->cache, one);
}

struct lookup_call {
	struct tc_env *e;
	const char *name;
	struct sbx_node *out;
	struct stat st;
	int rc;
};

static void *lookup_main(void *arg)
{
	struct lookup_call *l = arg;

	l->rc = l->e->ops->lookup(l->e->cache, l->e->root, l->name, &l->out,
				  &l->st);
	return NULL;
}

/*
 * A lookup of a name, answered before the file was renamed in the sandbox
 * and landing after the cache followed the rename: the answer is old.  It
 * must not give the file a second node (and the kernel a second inode)
 * under the old name (review).
 */
static void test_lookup_answered_before_a_followed_rename(void **state)
{
	struct tc_env *e = *state;
	struct lookup_call l = { .e = e, .name = "log" };
	struct sbx_node *n, *m;
	struct sbx_file *fh;
	struct stat st;
	pthread_t t;

	assert_int_equal(pmem_ext_write(e->mem, "log", "one\n", 4), 0);
	tc_settle(e);
	n = tc_walk_path(e->cache, "log", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	/* Its attributes unknown again (a write in the sandbox). */
	assert_int_equal(pmem_ext_write(e->mem, "log", "one\ntwo\n", 8), 0);
	tc_settle(e);
	assert_int_equal(pmem_gate_arm_after(e->mem, "getattr", "log"), 0);
	assert_int_equal(pthread_create(&t, NULL, lookup_main, &l), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "log", "log.1", 0), 0);
	tc_settle(e);
	pmem_gate_release(e->mem);
	assert_int_equal(pthread_join(t, NULL), 0);
	/* Asked again: the name is gone (or, had it not been, the node the
	 * file has). */
	assert_true(l.rc == -ENOENT || (l.rc == 0 && l.out == n));
	if (l.rc == 0)
		e->ops->forget(e->cache, l.out);
	sbx_error_clear();
	m = tc_walk_path(e->cache, "log.1", false, &st);
	assert_ptr_equal(m, n);
	assert_int_equal(st.st_size, 8);
	e->ops->forget(e->cache, m);
	assert_int_equal(tc_close(e, fh), 0);
	e->ops->forget(e->cache, n);
}

/*
 * The same for bytes buffered before the rename (they were lost at close:
 * the push said ENOENT), for a file whose directory is renamed, and for
 * a rename through the mount whose answer an outage lost (the sandbox
 * did it; the call said EIO).
 */
static void test_open_files_follow_renames_behind_the_mount(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *d, *n, *m, *x;
	struct sbx_file *fh, *fm;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/a", "aaaa", 4), 0);
	assert_int_equal(pmem_ext_write(e->mem, "b", "bbbb", 4), 0);
	assert_int_equal(pmem_ext_write(e->mem, "c", "cc", 2), 0);
	tc_settle(e);
	d = tc_walk_path(e->cache, "d", false, &st);
	n = tc_walk_path(e->cache, "d/a", false, &st);
	m = tc_walk_path(e->cache, "b", false, &st);
	x = tc_walk_path(e->cache, "c", false, &st);
	assert_int_equal(tc_open(e, n, O_RDWR, &fh), 0);
	assert_int_equal(tc_open(e, m, O_RDWR, &fm), 0);
	/* Buffered, then the directory moves in the sandbox. */
	assert_int_equal(e->ops->write(e->cache, fh, "AA", 2, 0), 2);
	assert_int_equal(pmem_ext_rename(e->mem, "d", "e", 0), 0);
	/* b is renamed through the mount onto c; the answer is lost. */
	assert_int_equal(pmem_fail(e->mem, "rename", -EIO, 1), 0);
	assert_int_equal(e->ops->rename(e->cache, e->root, "b", e->root, "c",
					0),
			 -EIO);
	sbx_error_clear();
	assert_int_equal(pmem_ext_rename(e->mem, "b", "c", 0), 0);
	tc_settle(e);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 4);
	assert_memory_equal(buf, "AAaa", 4);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(tc_holds(e, "e/a", "AAaa", 4));
	assert_int_equal(e->ops->write(e->cache, fm, "B", 1, 4), 1);
	assert_int_equal(tc_close(e, fm), 0);
	assert_true(tc_holds(e, "c", "bbbbB", 5));
	/* The names as a walk sees them now. */
	e->ops->forget(e->cache, x);
	x = tc_walk_path(e->cache, "c", false, &st);
	assert_int_equal(st.st_size, 5);
	e->ops->forget(e->cache, x);
	x = tc_walk_path(e->cache, "e/a", false, &st);
	assert_int_equal(st.st_size, 4);
	e->ops->forget(e->cache, x);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "b", &x, &st),
			 -ENOENT);
	assert_int_equal(e->ops->lookup(e->cache, e->root, "d", &x, &st),
			 -ENOENT);
	sbx_error_clear();
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, m);
	e->ops->forget(e->cache, d);
}

/*
 * f and g, two names of one file; f removed through the mount; a
 * descriptor opened through g; then, in the sandbox, `mv g f`.  The
 * descriptor follows its file to f (it said ESTALE: the event for f
 * detached the node the kernel held, whose I/O then took g, gone).
 */
static void test_open_link_follows_a_rename_onto_its_removed_name(
	void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f, *g, *made;
	struct sbx_file *fh;
	struct stat st;
	char buf[8];

	assert_int_equal(pmem_ext_write(e->mem, "f", "ffff", 4), 0);
	tc_settle(e);
	f = tc_walk_path(e->cache, "f", false, &st);
	assert_int_equal(e->ops->link(e->cache, f, e->root, "g", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(tc_unlink(e, "f"), 0);
	g = tc_walk_path(e->cache, "g", false, &st);
	assert_int_equal(tc_open(e, g, O_RDWR, &fh), 0);
	assert_int_equal(pmem_ext_rename(e->mem, "g", "f", 0), 0);
	tc_settle(e);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 4);
	assert_memory_equal(buf, "ffff", 4);
	assert_int_equal(e->ops->write(e->cache, fh, "G", 1, 4), 1);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(tc_holds(e, "f", "ffffG", 5));
	assert_int_equal(pmem_ext_stat(e->mem, "g", &st), -ENOENT);
	e->ops->forget(e->cache, g);
	e->ops->forget(e->cache, f);
}

struct rmdir_call {
	struct tc_env *e;
	struct sbx_node *parent;
	const char *name;
	int rc;
};

static void *rmdir_main(void *arg)
{
	struct rmdir_call *r = arg;

	r->rc = r->e->ops->rmdir(r->e->cache, r->parent, r->name);
	return NULL;
}

/*
 * The last close's removal of a hidden name fails (the sandbox out of
 * reach): the hidden file is still there, so it must go on counting as
 * hidden, not as a link the user sees, and an rmdir of its directory must
 * still move it out and remove it.  Forgotten, it stayed for good: an
 * invisible file that made the rmdir say ENOTEMPTY and a link count one
 * too high (random tester, fault runs of 2026-12-07).
 */
static void test_failed_hidden_removal_is_kept_and_retried(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *dir, *f, *made;
	struct sbx_file *fh;
	struct stat st;
	char hidden[160], moved[128];

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	f = tc_walk_path(e->cache, "s/f", false, &st);
	snprintf(moved, sizeof(moved), ".sbx-silly.%llu.1",
		 (unsigned long long)st.st_ino);
	snprintf(hidden, sizeof(hidden), "s/%s", moved);
	assert_int_equal(e->ops->link(e->cache, f, dir, "g", &made, &st), 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(tc_open(e, f, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, dir, "f"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);

	/* The last close cannot remove it. */
	assert_int_equal(pmem_fail(e->mem, "unlink", -EIO, 1), 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	/* g's count leaves the hidden name out. */
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 1);

	/* The directory can go: the hidden file moves out and is removed. */
	assert_int_equal(e->ops->unlink(e->cache, dir, "g"), 0);
	assert_int_equal(e->ops->rmdir(e->cache, e->root, "s"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "s", &st), -ENOENT);
	assert_int_equal(pmem_ext_stat(e->mem, moved, &st), -ENOENT);
	e->ops->forget(e->cache, f);
	e->ops->forget(e->cache, dir);
}

/*
 * A hidden name the cache keeps counting although the sandbox removed it
 * (the removal's answer lost after it was done, or removed behind the
 * mount) must not take a link off a new file given its file's inode
 * number: a create that made its file retires the names kept under that
 * number (random tester's fault runs: fstat said 1 link for 2).
 */
static void test_new_file_under_a_kept_hidden_name(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f, *n, *made;
	struct sbx_file *fh, *fn;
	struct stat st;
	char hidden[64];
	ino_t ino;

	assert_int_equal(tc_create(e, "f", O_EXCL, &f, &fh), 0);
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	ino = st.st_ino;
	snprintf(hidden, sizeof(hidden), ".sbx-silly.%llu.1",
		 (unsigned long long)ino);
	assert_int_equal(e->ops->link(e->cache, f, e->root, "g", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "f"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);
	/* The last close cannot remove the hidden name: kept... */
	assert_int_equal(pmem_fail(e->mem, "unlink", -EIO, 1), 0);
	assert_int_equal(tc_close(e, fh), 0);
	/* ...but the sandbox has it removed all the same, and g too. */
	assert_int_equal(pmem_ext_unlink(e->mem, hidden), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "g"), 0);
	tc_settle(e);

	/* A new file gets the number, and a second name. */
	assert_int_equal(tc_create(e, "n", O_EXCL, &n, &fn), 0);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_ino, ino);
	assert_int_equal(e->ops->link(e->cache, n, e->root, "m", &made, &st),
			 0);
	assert_int_equal(st.st_nlink, 2);
	e->ops->forget(e->cache, made);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(tc_close(e, fn), 0);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, f);
}

/*
 * A file removed or moved away in the sandbox while open here: its
 * descriptor's fstat() answers with what was last known, whatever the
 * kernel's copy (not always kept: test_fileops.py's link counts test said
 * ESTALE under load), once an event or a lookup said the name changed, as
 * a local disk does.  Before that the kernel's dentry may still lead a
 * stat() by the path here: ESTALE, to look it up again.  A file not open
 * here says the name is gone.
 */
static void test_fstat_of_a_file_removed_behind_the_mount(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f, *g, *made;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "f", "data", 4), 0);
	assert_int_equal(pmem_ext_write(e->mem, "g", "gg", 2), 0);
	tc_settle(e);
	f = tc_walk_path(e->cache, "f", false, &st);
	g = tc_walk_path(e->cache, "g", false, &st);
	assert_int_equal(tc_open(e, f, O_RDONLY, &fh), 0);
	/* Before the event: a stat() by the path may be asking, and must
	 * look the name up again. */
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_ext_unlink(e->mem, "f"), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "g"), 0);
	/* (Its attributes to be asked for: an event about another name.) */
	assert_true(e->ops->attr_changed(e->cache, f));
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), -ESTALE);
	pmem_watch_hold(e->mem, false);
	tc_settle(e);

	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	assert_int_equal(st.st_size, 4);
	assert_true(S_ISREG(st.st_mode));
	/* The name is found gone; the descriptor still answers. */
	assert_int_equal(e->ops->lookup(e->cache, e->root, "f", &made, &st),
			 -ENOENT);
	assert_int_equal(e->ops->getattr(e->cache, f, NULL, &st), 0);
	assert_int_equal(st.st_size, 4);
	/* Not open: gone. */
	assert_true(e->ops->getattr(e->cache, g, NULL, &st) < 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(e->ops->getattr(e->cache, f, NULL, &st) < 0);
	e->ops->forget(e->cache, g);
	e->ops->forget(e->cache, f);
}

/*
 * Directory d holding n files open here and unlinked (their hidden names
 * in it), the hidden name of file `gone` removed behind the mount: rmdir
 * must succeed.  *seq: silly renames so far (they name the hidden files).
 */
static void rmdir_past_gone_hidden(struct tc_env *e, const char *d, int n,
				   int gone, unsigned long *seq)
{
	struct sbx_node *dir, *f[8];
	struct sbx_file *fh[8];
	struct stat st;
	char path[64], hidden[128];

	assert_true(n <= 8);
	assert_int_equal(pmem_ext_mkdir(e->mem, d, 0755), 0);
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/f%d", d, i);
		assert_int_equal(pmem_ext_write(e->mem, path, "data", 4), 0);
	}
	tc_settle(e);
	dir = tc_walk_path(e->cache, d, false, &st);
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/f%d", d, i);
		f[i] = tc_walk_path(e->cache, path, false, &st);
		assert_int_equal(tc_open(e, f[i], O_RDONLY, &fh[i]), 0);
		assert_int_equal(e->ops->unlink(e->cache, dir,
						strchr(path, '/') + 1),
				 0);
		snprintf(hidden, sizeof(hidden), "%s/.sbx-silly.%llu.%lu", d,
			 (unsigned long long)st.st_ino, ++*seq);
		assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);
		if (i == gone)
			assert_int_equal(pmem_ext_unlink(e->mem, hidden), 0);
	}
	tc_settle(e);

	assert_int_equal(e->ops->rmdir(e->cache, e->root, d), 0);
	assert_int_equal(pmem_ext_stat(e->mem, d, &st), -ENOENT);
	for (int i = 0; i < n; i++) {
		assert_int_equal(tc_close(e, fh[i]), 0);
		e->ops->forget(e->cache, f[i]);
	}
	e->ops->forget(e->cache, dir);
}

/*
 * A directory with hidden names of open files is removed once they are
 * moved out, even when one of them is no longer in the sandbox (removed
 * behind the mount): its move says ENOENT and the others still move
 * (random tester, seed 136255067: the first failed move gave up, and a
 * rename over the directory said ENOTEMPTY).  Each of the names in turn is
 * the gone one, so that whatever order the names are met in, it is met
 * before another one in some round.
 */
static void test_rmdir_past_a_hidden_name_gone_behind_the_mount(void **state)
{
	struct tc_env *e = *state;
	unsigned long seq = 0;
	char d[16];

	for (int gone = 0; gone < 3; gone++) {
		snprintf(d, sizeof(d), "s%d", gone);
		rmdir_past_gone_hidden(e, d, 3, gone, &seq);
	}
}

/*
 * A hidden name removed at its file's last close stays removed when events
 * are lost (an overflow makes every removed name unknown): counted again,
 * it took a link off the file's other names (random tester's fault runs,
 * seed 304502879: stat said 1 link for 2, and the copy of the tree made
 * after the outage lost a hard link).
 */
static void test_overflow_keeps_a_removed_hidden_name_removed(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *f, *g, *made;
	struct sbx_file *fh;
	struct stat st;
	char hidden[64];

	tc_create_to_hide(e, "f", 1, &f, &fh, hidden, sizeof(hidden));
	assert_int_equal(e->ops->link(e->cache, f, e->root, "g", &g, &st), 0);
	assert_int_equal(e->ops->link(e->cache, f, e->root, "h", &made, &st),
			 0);
	e->ops->forget(e->cache, made);
	assert_int_equal(e->ops->unlink(e->cache, e->root, "f"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), -ENOENT);
	assert_int_equal(e->ops->getattr(e->cache, g, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);

	pmem_ext_overflow(e->mem);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, g, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 2);
	e->ops->forget(e->cache, g);
	e->ops->forget(e->cache, f);
}

/*
 * A silly rename whose answer is lost (the sandbox did it, the call said
 * EIO): the file sits under a hidden name the user never sees.  Once
 * nothing has it open it must go -- left, it counted as a link of the
 * file's other names and kept its directory from being removed
 * (ENOTEMPTY; random tester's fault runs).  Both ways: at the last close,
 * and, when that close could not reach the sandbox, at the rmdir.
 */
static void test_hidden_rename_with_lost_answer_is_swept(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *dir, *f, *made;
	struct sbx_file *fh;
	struct stat st;
	char hidden[160];

	for (int round = 0; round < 2; round++) {
		assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
		assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
		tc_settle(e);
		dir = tc_walk_path(e->cache, "s", false, &st);
		f = tc_walk_path(e->cache, "s/f", false, &st);
		snprintf(hidden, sizeof(hidden), "s/.sbx-silly.%llu.%d",
			 (unsigned long long)st.st_ino, round + 1);
		assert_int_equal(e->ops->link(e->cache, f, dir, "g", &made,
					      &st),
				 0);
		e->ops->forget(e->cache, made);
		assert_int_equal(tc_open(e, f, O_RDWR, &fh), 0);
		/* The rename is done, its answer lost (a cut connection;
		 * a request that timed out). */
		int lost = round == 0 ? -EIO : -ETIMEDOUT;

		assert_int_equal(pmem_fail(e->mem, "rename", lost, 1), 0);
		assert_int_equal(e->ops->unlink(e->cache, dir, "f"), lost);
		sbx_error_clear();
		assert_int_equal(pmem_ext_rename(e->mem, "s/f", hidden, 0), 0);
		tc_settle(e);
		if (round == 1)
			assert_int_equal(pmem_fail(e->mem, "unlink", -EIO, 1),
					 0);
		assert_int_equal(tc_close(e, fh), 0);
		assert_int_equal(pmem_ext_stat(e->mem, hidden, &st),
				 round == 0 ? -ENOENT : 0);
		/* g has its one link back... */
		assert_int_equal(e->ops->unlink(e->cache, dir, "g"), 0);
		/* ...and the directory can go. */
		assert_int_equal(e->ops->rmdir(e->cache, e->root, "s"), 0);
		assert_int_equal(pmem_ext_stat(e->mem, "s", &st), -ENOENT);
		e->ops->forget(e->cache, f);
		e->ops->forget(e->cache, dir);
	}
}

/*
 * Two silly renames of one file whose answers are lost, then a rename of
 * their directory through the mount: both hidden names the sandbox made
 * are removed at the file's last close, where the directory is now (one
 * such name per file was kept before, by its path then).
 */
static void test_lost_hidden_renames_follow_their_directory(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *dir, *f;
	struct sbx_file *fh;
	struct stat st;
	char h1[96], h2[96], moved[128];

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
	assert_int_equal(pmem_ext_link(e->mem, "s/f", "s/g"), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	f = tc_walk_path(e->cache, "s/f", false, &st);
	snprintf(h1, sizeof(h1), ".sbx-silly.%llu.1",
		 (unsigned long long)st.st_ino);
	snprintf(h2, sizeof(h2), ".sbx-silly.%llu.2",
		 (unsigned long long)st.st_ino);
	assert_int_equal(tc_open(e, f, O_RDWR, &fh), 0);
	for (int i = 0; i < 2; i++) {
		char from[16], to[128];

		snprintf(from, sizeof(from), "s/%s", i ? "g" : "f");
		snprintf(to, sizeof(to), "s/%s", i ? h2 : h1);
		/* Done, its answer lost. */
		tc_unlink_answer_lost(e, dir, from + 2, from, to);
	}
	assert_int_equal(e->ops->rename(e->cache, e->root, "s", e->root, "t",
					0),
			 0);
	assert_int_equal(tc_close(e, fh), 0);
	snprintf(moved, sizeof(moved), "t/%s", h1);
	assert_int_equal(pmem_ext_stat(e->mem, moved, &st), -ENOENT);
	snprintf(moved, sizeof(moved), "t/%s", h2);
	assert_int_equal(pmem_ext_stat(e->mem, moved, &st), -ENOENT);
	assert_int_equal(pmem_ext_rmdir(e->mem, "t"), 0);
	e->ops->forget(e->cache, f);
	e->ops->forget(e->cache, dir);
}

/*
 * A silly rename whose answer was lost and that was NOT done, then the
 * file removed behind the mount and its inode number given to a new file
 * (ext4 does so soon), with one name or two: the hidden name that may
 * exist must not make the dead file look alive.  Found in review of a
 * version that kept it as a hidden node in the file's ring: the new file
 * was tied to the dead file's kernel inode (node_stale said no), and a
 * write through the old descriptor landed in the new file.
 */
static void test_lost_rename_not_done_then_number_reused(void **state)
{
	struct tc_env *e = *state;

	for (int links = 1; links <= 2; links++) {
		struct sbx_node *dir, *f, *n;
		struct sbx_file *fh;
		struct stat st, fst;
		char buf[16] = "";
		size_t len = 0;

		assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
		assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
		tc_settle(e);
		dir = tc_walk_path(e->cache, "s", false, &st);
		f = tc_walk_path(e->cache, "s/f", false, &fst);
		assert_int_equal(tc_open(e, f, O_RDWR, &fh), 0);
		/* Not done, its answer lost all the same. */
		tc_unlink_answer_lost(e, dir, "f", "s/f", NULL);
		assert_int_equal(pmem_ext_stat(e->mem, "s/f", &st), 0);

		assert_int_equal(pmem_ext_unlink(e->mem, "s/f"), 0);
		assert_int_equal(pmem_ext_write(e->mem, "s/n", "new", 3), 0);
		if (links == 2)
			assert_int_equal(pmem_ext_link(e->mem, "s/n", "s/m"),
					 0);
		tc_settle(e);
		/*
		 * With two names the event alone leaves f's name unknown, and
		 * a two-name file under its number may be f's own, renamed
		 * and linked behind the mount (docs/design.md, Known defects):
		 * a lookup settles it, as in the scenario the review found.
		 */
		if (links == 2) {
			assert_int_equal(e->ops->lookup(e->cache, dir, "f", &n,
							&st),
					 -ENOENT);
			sbx_error_clear();
		}
		assert_int_equal(e->ops->lookup(e->cache, dir, "n", &n, &st),
				 0);
		assert_int_equal(st.st_ino, fst.st_ino); /* reused */
		assert_int_equal(st.st_nlink, (nlink_t)links);
		assert_true(e->ops->node_stale(e->cache, f, n, &st));
		/* The old descriptor does not write into the new file. */
		(void)e->ops->write(e->cache, fh, "ZZ", 2, 0);
		sbx_error_clear();
		(void)tc_close(e, fh);
		sbx_error_clear();
		tc_settle(e);
		assert_int_equal(pmem_ext_read(e->mem, "s/n", buf,
					       sizeof(buf) - 1, &len),
				 0);
		assert_int_equal(len, 3);
		assert_memory_equal(buf, "new", 3);

		e->ops->forget(e->cache, n);
		e->ops->forget(e->cache, f);
		e->ops->forget(e->cache, dir);
		assert_int_equal(pmem_ext_unlink(e->mem, "s/n"), 0);
		if (links == 2)
			assert_int_equal(pmem_ext_unlink(e->mem, "s/m"), 0);
		assert_int_equal(pmem_ext_rmdir(e->mem, "s"), 0);
		tc_settle(e);
	}
}

/*
 * The hidden name a lost silly rename may have made is swept by the rmdir
 * of its directory even when the file's node is no longer a child of it
 * (a new file took the name; found in review: the sweep looked only at
 * the directory's children, and the rmdir said ENOTEMPTY).
 */
static void test_rmdir_sweeps_a_lost_rename_of_a_detached_node(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *dir, *f, *n;
	struct sbx_file *fh;
	struct stat st;
	char hidden[96];

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	f = tc_walk_path(e->cache, "s/f", false, &st);
	snprintf(hidden, sizeof(hidden), "s/.sbx-silly.%llu.1",
		 (unsigned long long)st.st_ino);
	assert_int_equal(tc_open(e, f, O_RDWR, &fh), 0);
	/* Done, its answer lost. */
	tc_unlink_answer_lost(e, dir, "f", "s/f", hidden);
	/* A new file takes the name: f's node leaves the directory. */
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "new file", 8), 0);
	tc_settle(e);
	assert_int_equal(e->ops->lookup(e->cache, dir, "f", &n, &st), 0);
	e->ops->forget(e->cache, n);
	/* The last close cannot reach the sandbox. */
	assert_int_equal(pmem_fail(e->mem, "unlink", -EIO, 1), 0);
	assert_int_equal(tc_close(e, fh), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "s/f"), 0);
	tc_settle(e);

	assert_int_equal(e->ops->rmdir(e->cache, e->root, "s"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "s", &st), -ENOENT);
	e->ops->forget(e->cache, f);
	e->ops->forget(e->cache, dir);
}

/*
 * The last close removes a hidden name while its directory is renamed
 * through the mount: the removal, sent with the old path, says ENOENT,
 * and the hidden file must still go, under the directory's new name
 * (random tester, seed 391619360: it stayed, and an rmdir of the
 * directory said ENOTEMPTY).
 */
static void hidden_removal_across_a_directory_rename(struct tc_env *e,
						    bool file_at_old_path)
{
	struct close_call cc = { .e = e };
	struct sbx_node *dir, *f;
	struct stat st;
	char hidden[96], gate[128], moved[128];
	pthread_t t;

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	f = tc_walk_path(e->cache, "s/f", false, &st);
	snprintf(hidden, sizeof(hidden), ".sbx-silly.%llu.1",
		 (unsigned long long)st.st_ino);
	snprintf(gate, sizeof(gate), "s/%s", hidden);
	snprintf(moved, sizeof(moved), "t/%s", hidden);
	assert_int_equal(tc_open(e, f, O_RDWR, &cc.fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, dir, "f"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, gate, &st), 0);

	/* The last close's removal parks with the old path... */
	assert_int_equal(pmem_gate_arm(e->mem, "unlink", gate), 0);
	assert_int_equal(pthread_create(&t, NULL, close_main, &cc), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	/* ...while the directory is renamed. */
	assert_int_equal(e->ops->rename(e->cache, e->root, "s", e->root, "t",
					0),
			 0);
	/* (The old path then names a file: the removal says ENOTDIR.) */
	if (file_at_old_path)
		assert_int_equal(pmem_ext_write(e->mem, "s", "x", 1), 0);
	pmem_gate_release(e->mem);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(cc.rc, 0);
	assert_int_equal(pmem_ext_stat(e->mem, moved, &st), -ENOENT);
	assert_int_equal(e->ops->rmdir(e->cache, e->root, "t"), 0);
	e->ops->forget(e->cache, f);
	e->ops->forget(e->cache, dir);
	if (file_at_old_path)
		assert_int_equal(pmem_ext_unlink(e->mem, "s"), 0);
}

static void test_hidden_removal_follows_a_rename_of_its_directory(void **state)
{
	hidden_removal_across_a_directory_rename(*state, false);
}

/*
 * The same, with a file made under the directory's old name meanwhile
 * (random tester, seed 607803788: the removal said ENOTDIR, which was not
 * taken for a rename under way, and the hidden file stayed until the
 * next phase).
 */
static void test_hidden_removal_follows_a_rename_then_a_file(void **state)
{
	hidden_removal_across_a_directory_rename(*state, true);
}

struct rmdir_bg {
	struct tc_env *e;
	const char *name;
	int rc;
};

static void *rmdir_bg_main(void *arg)
{
	struct rmdir_bg *r = arg;

	r->rc = r->e->ops->rmdir(r->e->cache, r->e->root, r->name);
	return NULL;
}

/*
 * An rmdir while the last close is removing a ghost of the directory (the
 * hidden name a lost silly rename made) waits for that removal, as for a
 * hidden name's (review: the ghost was invisible while out, and the rmdir
 * said ENOTEMPTY).
 */
static void test_rmdir_waits_for_a_ghost_being_removed(void **state)
{
	struct tc_env *e = *state;
	struct close_call cc = { .e = e };
	struct rmdir_bg r = { .e = e, .name = "s", .rc = 1 };
	struct timespec ms30 = {0, 30 * 1000 * 1000};
	struct sbx_node *dir, *f;
	struct stat st;
	char hidden[96];
	pthread_t tc, tr;

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	f = tc_walk_path(e->cache, "s/f", false, &st);
	snprintf(hidden, sizeof(hidden), "s/.sbx-silly.%llu.1",
		 (unsigned long long)st.st_ino);
	assert_int_equal(tc_open(e, f, O_RDWR, &cc.fh), 0);
	/* The silly rename is done, its answer lost: a ghost. */
	tc_unlink_answer_lost(e, dir, "f", "s/f", hidden);

	/* The last close's removal of it parks... */
	assert_int_equal(pmem_gate_arm(e->mem, "unlink", hidden), 0);
	assert_int_equal(pthread_create(&tc, NULL, close_main, &cc), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	/* ...an rmdir comes, and the removal ends a moment later. */
	assert_int_equal(pthread_create(&tr, NULL, rmdir_bg_main, &r), 0);
	nanosleep(&ms30, NULL);
	pmem_gate_release(e->mem);
	assert_int_equal(pthread_join(tc, NULL), 0);
	assert_int_equal(pthread_join(tr, NULL), 0);
	assert_int_equal(cc.rc, 0);
	assert_int_equal(r.rc, 0);
	assert_int_equal(pmem_ext_stat(e->mem, "s", &st), -ENOENT);
	e->ops->forget(e->cache, f);
	e->ops->forget(e->cache, dir);
}

/*
 * rmdir of a directory whose only file was unlinked while open: its hidden
 * name moves to the root and the rmdir succeeds.  The file's last close
 * arrives while the move is out (parked after the rename, at the forget of
 * the directory's wrapped node): the close must leave the removal to the
 * mover, which removes it at its new place -- removed at the old one, it
 * would say ENOENT and stay in the root for good.
 */
static void test_rmdir_moves_hidden_files_out(void **state)
{
	struct tc_env *e = *state;
	struct rmdir_call r = { .e = e, .name = "s" };
	struct sbx_node *dir, *f;
	struct sbx_file *fh;
	struct stat st;
	char hidden[160], moved[128];
	pthread_t t;
	int parked;

	assert_int_equal(pmem_ext_mkdir(e->mem, "s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "s/f", "data", 4), 0);
	tc_settle(e);
	dir = tc_walk_path(e->cache, "s", false, &st);
	f = tc_walk_path(e->cache, "s/f", false, &st);
	snprintf(moved, sizeof(moved), ".sbx-silly.%llu.1",
		 (unsigned long long)st.st_ino);
	snprintf(hidden, sizeof(hidden), "s/%s", moved);
	assert_int_equal(tc_open(e, f, O_RDWR, &fh), 0);
	assert_int_equal(e->ops->unlink(e->cache, dir, "f"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, hidden, &st), 0);

	r.parent = e->root;
	assert_int_equal(pmem_gate_arm(e->mem, "forget", "s"), 0);
	assert_int_equal(pthread_create(&t, NULL, rmdir_main, &r), 0);
	parked = pmem_gate_wait(e->mem, WATCHDOG_S * 1000);
	if (parked == 0) {
		/* Moved already; the last close comes now. */
		assert_int_equal(pmem_ext_stat(e->mem, moved, &st), 0);
		assert_int_equal(tc_close(e, fh), 0);
		fh = NULL;
	}
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(parked, 0);
	assert_int_equal(r.rc, 0);
	assert_int_equal(pmem_ext_stat(e->mem, "s", &st), -ENOENT);
	assert_int_equal(pmem_ext_stat(e->mem, moved, &st), -ENOENT);
	e->ops->forget(e->cache, f);
	e->ops->forget(e->cache, dir);
}

/*
 * A directory removed through the mount while the kernel still holds it (an
 * open descriptor, a working directory): its attributes are the last ones
 * with no link, not ENOENT, and a directory made under its name -- given
 * the same inode number, which pmem reuses like ext4 -- is another node.
 */
static void test_removed_directory_keeps_its_attributes(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *d, *d2;
	struct stat st, st2;
	ino_t ino;

	tc_settle(e);
	assert_int_equal(e->ops->mkdir(e->cache, e->root, "d", 0750, &d, &st),
			 0);
	ino = st.st_ino;
	assert_int_equal(e->ops->rmdir(e->cache, e->root, "d"), 0);
	assert_int_equal(e->ops->getattr(e->cache, d, NULL, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0750);
	assert_int_equal(st.st_nlink, 0);
	assert_int_equal(st.st_size, 0);
	assert_int_equal(e->ops->mkdir(e->cache, e->root, "d", 0700, &d2,
				       &st2),
			 0);
	assert_int_equal(st2.st_ino, ino);
	assert_ptr_not_equal(d2, d);
	assert_int_equal(e->ops->getattr(e->cache, d, NULL, &st), 0);
	assert_int_equal(st.st_nlink, 0);
	assert_int_equal(e->ops->getattr(e->cache, d2, NULL, &st2), 0);
	assert_int_equal(st2.st_nlink, 2);
	assert_int_equal(st2.st_mode & 07777, 0700);
	e->ops->forget(e->cache, d2);
	e->ops->forget(e->cache, d);
}

/*
 * A hard-linked file whose content is cached under one name, written
 * through another: a read through the first must see the new bytes.
 */
static void test_read_through_another_name_after_a_write(void **state)
{
	struct tc_env *e = *state;
	struct sbx_node *a, *b;
	struct sbx_file *fa, *fb;
	struct stat st;
	char buf[16];

	assert_int_equal(pmem_ext_write(e->mem, "a", "old!!", 5), 0);
	assert_int_equal(pmem_ext_link(e->mem, "a", "b"), 0);
	tc_settle(e);
	a = tc_walk_path(e->cache, "a", false, &st);
	b = tc_walk_path(e->cache, "b", false, &st);
	assert_int_equal(tc_open(e, a, O_RDONLY, &fa), 0);
	assert_int_equal(e->ops->read(e->cache, fa, buf, sizeof(buf), 0), 5);
	assert_memory_equal(buf, "old!!", 5);
	assert_int_equal(tc_open(e, b, O_WRONLY, &fb), 0);
	assert_int_equal(e->ops->write(e->cache, fb, "NEW", 3, 0), 3);
	assert_int_equal(tc_close(e, fb), 0);
	assert_true(tc_holds(e, "a", "NEW!!", 5));
	assert_int_equal(e->ops->read(e->cache, fa, buf, sizeof(buf), 0), 5);
	assert_memory_equal(buf, "NEW!!", 5);
	assert_int_equal(tc_close(e, fa), 0);
	e->ops->forget(e->cache, a);
	e->ops->forget(e->cache, b);
}

/*
 * REGRESSION b: use after free.  Per file, one thread opens (O_TRUNC),
 * writes 4 KiB, closes, in a loop, while two threads getattr its node
 * (which pushes the buffered writes of whichever open file has some): a
 * getattr must never push a file that a RELEASE is freeing.  Meant for
 * ASan; without it a hit may crash or pass silently.
 */
#define STRESS_FILES 3
#define STRESS_MS 2000

/* Shared by the stress threads; on the heap so a hang can leak it. */
struct stress_ctx {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int running;
	int stop;
};

struct stress {
	struct tc_env *e;
	struct sbx_node *node;
	char name[8];
	struct stress_ctx *ctx;
	char err[256];
	unsigned long rounds;
};

static bool stress_stopped(struct stress *s)
{
	return __atomic_load_n(&s->ctx->stop, __ATOMIC_ACQUIRE) || s->err[0];
}

static void stress_done(struct stress *s)
{
	pthread_mutex_lock(&s->ctx->lock);
	s->ctx->running--;
	pthread_cond_broadcast(&s->ctx->cond);
	pthread_mutex_unlock(&s->ctx->lock);
}

static void *stress_writer(void *arg)
{
	struct stress *s = arg;
	struct tc_env *e = s->e;
	char data[4096];

	fill(data, sizeof(data), 9);
	while (!stress_stopped(s)) {
		struct sbx_file *fh;
		int rc = tc_open(e, s->node, O_WRONLY | O_TRUNC, &fh);

		if (rc < 0) {
			snprintf(s->err, sizeof(s->err), "open %s: %d",
				 s->name, rc);
			if (fh)
				(void)e->ops->release(e->cache, fh);
			break;
		}
		if (e->ops->write(e->cache, fh, data, sizeof(data), 0) !=
		    (ssize_t)sizeof(data))
			snprintf(s->err, sizeof(s->err), "write %s", s->name);
		rc = tc_close(e, fh);
		if (rc < 0 && !s->err[0])
			snprintf(s->err, sizeof(s->err), "close %s: %d",
				 s->name, rc);
		s->rounds++;
	}
	stress_done(s);
	return NULL;
}

static void *stress_getattr(void *arg)
{
	struct stress *s = arg;
	struct tc_env *e = s->e;

	while (!stress_stopped(s)) {
		struct stat st;
		int rc = e->ops->getattr(e->cache, s->node, NULL, &st);

		if (rc < 0)
			snprintf(s->err, sizeof(s->err), "getattr %s: %d",
				 s->name, rc);
		s->rounds++;
	}
	stress_done(s);
	return NULL;
}

static void test_getattr_vs_release_uaf(void **state)
{
	struct tc_env *e = *state;
	struct stress_ctx *ctx = calloc(1, sizeof(*ctx));
	struct stress *s = calloc(STRESS_FILES * 3, sizeof(*s));
	pthread_t t[STRESS_FILES * 3];
	struct timespec until;
	unsigned long writes = 0;
	int running;

	assert_non_null(ctx);
	assert_non_null(s);
	pthread_mutex_init(&ctx->lock, NULL);
	pthread_cond_init(&ctx->cond, NULL);
	ctx->running = STRESS_FILES * 3;
	tc_settle(e);
	for (int f = 0; f < STRESS_FILES; f++) {
		struct sbx_node *n;
		struct sbx_file *fh;
		char name[8];

		snprintf(name, sizeof(name), "s%d", f);
		assert_int_equal(tc_create(e, name, O_EXCL, &n, &fh), 0);
		assert_int_equal(tc_close(e, fh), 0);
		for (int k = 0; k < 3; k++) {
			struct stress *x = &s[f * 3 + k];

			x->e = e;
			x->node = n;
			snprintf(x->name, sizeof(x->name), "%s", name);
			x->ctx = ctx;
		}
	}
	for (int i = 0; i < STRESS_FILES * 3; i++)
		assert_int_equal(pthread_create(&t[i], NULL,
						i % 3 ? stress_getattr
						      : stress_writer,
						&s[i]),
				 0);
	usleep(STRESS_MS * 1000); /* the duration of the stress, not a sync */
	__atomic_store_n(&ctx->stop, 1, __ATOMIC_RELEASE);

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += WATCHDOG_S;
	pthread_mutex_lock(&ctx->lock);
	while (ctx->running > 0 &&
	       pthread_cond_timedwait(&ctx->cond, &ctx->lock, &until) == 0)
		;
	running = ctx->running;
	pthread_mutex_unlock(&ctx->lock);
	if (running > 0) {
		/* Threads still use these: keep them. */
		e->hung = true;
		leak(s);
		leak(ctx);
		fail_msg("HANG: %d of %d stress threads still running %d s "
			 "after stop",
			 running, STRESS_FILES * 3, WATCHDOG_S);
	}
	for (int i = 0; i < STRESS_FILES * 3; i++)
		pthread_join(t[i], NULL);
	pthread_mutex_destroy(&ctx->lock);
	pthread_cond_destroy(&ctx->cond);
	free(ctx);
	for (int i = 0; i < STRESS_FILES * 3; i++) {
		if (s[i].err[0]) {
			char msg[300];

			snprintf(msg, sizeof(msg), "%s", s[i].err);
			free(s);
			fail_msg("%s", msg);
		}
		if (i % 3 == 0)
			writes += s[i].rounds;
	}
	free(s);
	assert_true(writes > 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_lookup_getattr_cached,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_getattr_cached_without_prefetch, setup, teardown),
		cmocka_unit_test_setup_teardown(test_negative_entries, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_complete_listing_answers_enoent, setup, teardown),
		cmocka_unit_test_setup_teardown(test_readdir_listing, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_write_flush_release, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_read_through_cache, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_rename_through_cache,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_change_behind_mount_invalidates, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_fetch_racing_change_not_kept, setup, teardown),
		/* Regressions. */
		cmocka_unit_test_setup_teardown(test_hardlink_ring_loop, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_foreign_hardlink_setattr,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_push_failure_stays_with_file, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bounded_writeback, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_nlink_after_unlink, setup,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_nlink_open_file_all_names_gone, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rename_behind_buffered_write, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rename_open_file_through_cache, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_hidden_file_removed_after_listing, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_open_through_a_removed_name_of_a_linked_file,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_listing_pushes_bytes_of_another_name, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_lookup_of_another_name_sees_buffered_bytes, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_read_through_another_name_after_a_write, setup,
			teardown),
		/* Last: under ASan a hit ends the process. */
		cmocka_unit_test_setup_teardown(
			test_link_count_after_hidden_name_removed, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_link_count_fetched_across_a_hidden_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_lookup_count_fetched_across_a_hidden_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_getattr_count_of_an_unringed_node, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_setattr_count_fetched_across_a_hidden_removal,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_link_answer_across_a_hidden_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_new_directory_is_not_a_dead_file,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_surviving_name_is_the_same_file,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_create_says_when_it_made_the_file, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_create_of_a_linked_file_counts_no_hidden_name,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_listing_across_unlink_keeps_the_name_removed,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_listing_across_rename_keeps_the_moved_file,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_raced_listing_shows_a_name_made_again, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_listing_across_hidden_removal_hands_no_count, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_count_kept_during_hidden_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_barrier_is_not_a_refused_file_to_fail, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_stat_and_read_go_where_the_file_went, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_open_keeps_no_count_across_hidden_removal, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_walk_across_hidden_removal_keeps_no_count, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_raced_listing_shows_a_file_replaced_behind, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_new_file_under_a_removed_linked_name, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_new_file_under_a_removed_linked_name_overflow,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_overflow_forgets_a_removed_linked_name, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_hidden_names_leave_no_expectation,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_link_counts_for_every_name,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_open_file_follows_a_rename_behind_the_mount, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_open_files_follow_renames_behind_the_mount, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_buffered_bytes_follow_a_rename_behind_the_mount,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_exchange_in_the_sandbox_is_followed, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_listing_by_a_path_another_directory_took, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_old_name_of_a_followed_rename_is_asked, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_fstat_of_a_file_replaced_in_the_sandbox, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_read_of_a_file_gone_from_the_sandbox, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_open_by_a_path_another_file_took, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_setattr_by_a_path_another_file_took, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_lookup_answered_before_a_followed_rename, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_open_link_follows_a_rename_onto_its_removed_name,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rename_onto_a_name_removed_behind_the_mount, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_rmdir_moves_hidden_files_out, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_failed_hidden_removal_is_kept_and_retried, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_new_file_under_a_kept_hidden_name, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_overflow_keeps_a_removed_hidden_name_removed,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rmdir_past_a_hidden_name_gone_behind_the_mount,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_fstat_of_a_file_removed_behind_the_mount, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_hidden_rename_with_lost_answer_is_swept, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_lost_hidden_renames_follow_their_directory, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_lost_rename_not_done_then_number_reused, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_rmdir_sweeps_a_lost_rename_of_a_detached_node,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_hidden_removal_follows_a_rename_of_its_directory,
			setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_hidden_removal_follows_a_rename_then_a_file, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_rmdir_waits_for_a_ghost_being_removed, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_removed_directory_keeps_its_attributes, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_getattr_vs_release_uaf,
						setup, teardown),
	};

	if (getenv(FILTER_ENV))
		cmocka_set_test_filter(getenv(FILTER_ENV));
	signal(SIGALRM, on_global_alarm);
	alarm(GLOBAL_WATCHDOG_S);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
