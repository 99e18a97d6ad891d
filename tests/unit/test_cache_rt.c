/*
 * Round trips the caching layer (fs/cache.c) saves with attributes handed
 * back on the side (struct sbx_side, sbx/provider.h) and with
 * write_then, over the in-memory sandbox (providers/mem), which fills
 * them the way the remote provider does (a stat in the same batch, the
 * write's answer).  Inner calls are counted with pmem_calls().
 *
 * What is checked: after an entry operation (create, mkdir, unlink,
 * rename) a getattr of its directory, and after a push a getattr of the
 * file, is answered without an inner call and gives the sandbox's
 * attributes -- unless a change event was applied while the call was out
 * (then the attributes are fetched again).  fsync of buffered bytes is one
 * inner call; a failed one keeps the bytes and reports the error.
 *
 * The change stream is held (pmem_watch_hold) around the operations so
 * that our own entry events arrive after the call, as they usually do
 * from the agent; the cache drops them as expected.  The DATA event of
 * our own write is not expected (fs/cache_change.c): once it arrives the
 * file's attributes are fetched again, so the write checks look before.
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

#include <cmocka.h>

#include "test_cache_i.h"

/* The shared fixture (test_cache_i.h) plus a directory "d" to work in. */
struct env {
	struct tc_env *tc;
	struct sbx_sandbox *mem, *cache;   /* tc's, for short */
	const struct sbx_sandbox_ops *ops; /* tc's */
	struct sbx_node *root;             /* tc's */
	struct sbx_node *dir;              /* "d", made through the cache */
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	void *tc = NULL;
	struct stat st;

	assert_non_null(e);
	assert_int_equal(tc_setup(&tc), 0);
	e->tc = tc;
	e->mem = e->tc->mem;
	e->cache = e->tc->cache;
	e->ops = e->tc->ops;
	e->root = e->tc->root;
	assert_int_equal(e->ops->mkdir(e->cache, e->root, "d", 0755, &e->dir,
				       &st),
			 0);
	tc_settle(e->tc);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	void *tc = e->tc;

	pmem_set_hook(e->mem, NULL, NULL);
	pmem_watch_hold(e->mem, false);
	e->ops->forget(e->cache, e->dir);
	free(e);
	return tc_teardown(&tc);
}

/* Hold our own events back until the operation is recorded. */
static void hold(struct env *e)
{
	pmem_watch_hold(e->mem, true);
}

/* Deliver everything (the exec barrier), then count afresh. */
static void settle(struct env *e)
{
	pmem_watch_hold(e->mem, false);
	tc_settle(e->tc);
}

/* Inner calls that fetch metadata. */
static unsigned long fetches(struct env *e)
{
	return pmem_calls(e->mem, "getattr") + pmem_calls(e->mem, "lookup") +
	       pmem_calls(e->mem, "bulk") + pmem_calls(e->mem, "readdir");
}

/* getattr of node through the cache equals lstat of path in the sandbox. */
static void same_st(struct env *e, struct sbx_node *node, const char *path)
{
	struct stat got, real;

	assert_int_equal(e->ops->getattr(e->cache, node, NULL, &got), 0);
	assert_int_equal(pmem_ext_stat(e->mem, path, &real), 0);
	assert_int_equal(got.st_ino, real.st_ino);
	assert_int_equal(got.st_size, real.st_size);
	assert_int_equal(got.st_nlink, real.st_nlink);
	assert_int_equal(got.st_mtim.tv_sec, real.st_mtim.tv_sec);
	assert_int_equal(got.st_mtim.tv_nsec, real.st_mtim.tv_nsec);
	assert_int_equal(got.st_ctim.tv_nsec, real.st_ctim.tv_nsec);
}

static int create_in(struct env *e, struct sbx_node *dir, const char *name,
		     struct sbx_node **n, struct sbx_file **fh)
{
	struct sbx_open_result res;
	struct stat st;
	int rc = e->ops->create(e->cache, dir, name, 0644,
				O_CREAT | O_EXCL | O_WRONLY, n, &st, &res);

	*fh = rc == 0 ? res.fh : NULL;
	return rc;
}

/* Create d/name and buffer "hello" in it (nothing pushed yet). */
static void create_hello_in(struct env *e, const char *name,
			    struct sbx_node **n, struct sbx_file **fh)
{
	assert_int_equal(create_in(e, e->dir, name, n, fh), 0);
	assert_int_equal(e->ops->write(e->cache, *fh, "hello", 5, 0), 5);
}

/* ---- entry operations ---------------------------------------------------- */

static void test_create_keeps_dir_attrs(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	for (int i = 0; i < 3; i++) {
		char name[16];

		snprintf(name, sizeof(name), "f%d", i);
		hold(e);
		assert_int_equal(create_in(e, e->dir, name, &n, &fh), 0);
		assert_int_equal(e->ops->release(e->cache, fh), 0);
		e->ops->forget(e->cache, n);
		settle(e);
		/* The kernel's permission check before the next create. */
		same_st(e, e->dir, "d");
		assert_int_equal(fetches(e), 0);
	}
}

static void test_mkdir_unlink_rmdir_keep_dir_attrs(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	settle(e);
	same_st(e, e->dir, "d"); /* fetched after the event */
	settle(e);
	hold(e);
	assert_int_equal(e->ops->mkdir(e->cache, e->dir, "sub", 0755, &n,
				       &st),
			 0);
	e->ops->forget(e->cache, n);
	settle(e);
	same_st(e, e->dir, "d"); /* nlink went up */
	assert_int_equal(fetches(e), 0);

	hold(e);
	assert_int_equal(e->ops->lookup(e->cache, e->dir, "x", &n, &st), 0);
	e->ops->forget(e->cache, n);
	assert_int_equal(e->ops->unlink(e->cache, e->dir, "x"), 0);
	settle(e);
	same_st(e, e->dir, "d");
	assert_int_equal(fetches(e), 0);

	hold(e);
	assert_int_equal(e->ops->rmdir(e->cache, e->dir, "sub"), 0);
	settle(e);
	same_st(e, e->dir, "d");
	assert_int_equal(fetches(e), 0);
}

static void test_rename_keeps_both_dirs(void **state)
{
	struct env *e = *state;
	struct sbx_node *n, *e2;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(e->ops->mkdir(e->cache, e->root, "e", 0755, &e2,
				       &st),
			 0);
	assert_int_equal(create_in(e, e->dir, "f", &n, &fh), 0);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	e->ops->forget(e->cache, n);
	settle(e);
	same_st(e, e->dir, "d");
	same_st(e, e2, "e");
	settle(e);
	hold(e);
	assert_int_equal(e->ops->rename(e->cache, e->dir, "f", e2, "g", 0), 0);
	settle(e);
	same_st(e, e->dir, "d");
	same_st(e, e2, "e");
	assert_int_equal(fetches(e), 0);
	e->ops->forget(e->cache, e2);
}

/* open(O_CREAT | O_TRUNC) without O_EXCL, as editors save a temp file. */
static int create_trunc(struct env *e, const char *name, struct sbx_node **n,
			struct sbx_file **fh)
{
	struct sbx_open_result res;
	struct stat st;
	int rc = e->ops->create(e->cache, e->dir, name, 0644,
				O_CREAT | O_TRUNC | O_WRONLY, n, &st, &res);

	*fh = rc == 0 ? res.fh : NULL;
	return rc;
}

/*
 * Without O_EXCL, a create of a name the tree knows is absent (the
 * kernel's LOOKUP said so) expects its event like an exclusive one: the
 * directory's attributes stay what the call brought back.
 */
static void test_create_trunc_of_absent_name_keeps_dir_attrs(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;

	settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->dir, "t", &n, &st),
			 -ENOENT);
	hold(e);
	assert_int_equal(create_trunc(e, "t", &n, &fh), 0);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	e->ops->forget(e->cache, n);
	settle(e);
	same_st(e, e->dir, "d");
	assert_int_equal(fetches(e), 0);
}

/*
 * Over an existing file no event of ours comes: nothing may be expected,
 * or a later removal behind the mount would be swallowed.
 */
static void test_create_trunc_of_existing_expects_nothing(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;
	struct stat st;

	assert_int_equal(pmem_ext_write(e->mem, "d/t", "old", 3), 0);
	settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->dir, "t", &n, &st), 0);
	e->ops->forget(e->cache, n);
	assert_int_equal(create_trunc(e, "t", &n, &fh), 0);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	e->ops->forget(e->cache, n);
	settle(e);
	/* The O_TRUNC's own DATA event made it fetch again: known now. */
	assert_int_equal(e->ops->lookup(e->cache, e->dir, "t", &n, &st), 0);
	e->ops->forget(e->cache, n);
	assert_int_equal(pmem_ext_unlink(e->mem, "d/t"), 0);
	settle(e);
	assert_int_equal(e->ops->lookup(e->cache, e->dir, "t", &n, &st),
			 -ENOENT);
}

/*
 * The rename batch brings the moved file's attributes back (its ctime
 * changed): an editor's next save looks the target up (the kernel's
 * LOOKUP_RENAME_TARGET) without a round trip.
 */
static void test_rename_keeps_the_moved_file(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	create_hello_in(e, "tmp", &n, &fh);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	settle(e);
	same_st(e, n, "d/tmp");
	settle(e);
	hold(e);
	assert_int_equal(e->ops->rename(e->cache, e->dir, "tmp", e->dir,
					"target", 0),
			 0);
	settle(e);
	same_st(e, n, "d/target");
	assert_int_equal(fetches(e), 0);
	e->ops->forget(e->cache, n);
}

/* A change behind the mount while the rename is out: asked again. */
static void chmod_hook(const char *op, const char *path, void *payload)
{
	struct env *e = payload;

	(void)path;
	if (strcmp(op, "rename") != 0)
		return;
	if (pmem_ext_chmod(e->mem, "d/tmp", 0600) == 0)
		(void)e->ops->watch_sync(e->cache);
}

static void test_rename_racing_event_refetches(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	create_hello_in(e, "tmp", &n, &fh);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	settle(e);
	same_st(e, n, "d/tmp");
	settle(e);
	pmem_set_hook(e->mem, chmod_hook, e);
	assert_int_equal(e->ops->rename(e->cache, e->dir, "tmp", e->dir,
					"target", 0),
			 0);
	pmem_set_hook(e->mem, NULL, NULL);
	settle(e);
	same_st(e, n, "d/target");
	assert_int_equal(pmem_calls(e->mem, "getattr") +
				 pmem_calls(e->mem, "lookup"),
			 1);
	e->ops->forget(e->cache, n);
}

/* A change behind the mount, applied while the create is out. */
static void racing_hook(const char *op, const char *path, void *payload)
{
	struct env *e = payload;

	if (strcmp(op, "create") != 0)
		return;
	if (pmem_ext_write(e->mem, "d/other", "o", 1) == 0)
		(void)e->ops->watch_sync(e->cache);
}

static void test_racing_event_refetches(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	hold(e);
	pmem_set_hook(e->mem, racing_hook, e);
	assert_int_equal(create_in(e, e->dir, "f", &n, &fh), 0);
	pmem_set_hook(e->mem, NULL, NULL);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	e->ops->forget(e->cache, n);
	settle(e);
	same_st(e, e->dir, "d");
	assert_int_equal(pmem_calls(e->mem, "getattr") +
				 pmem_calls(e->mem, "lookup"),
			 1);
}

struct getter {
	struct env *e;
	struct sbx_node *node;
	int rc;
};

static void *getattr_main(void *arg)
{
	struct getter *g = arg;
	struct stat st;

	g->rc = g->e->ops->getattr(g->e->cache, g->node, NULL, &st);
	return NULL;
}

/*
 * A fetch of the directory's attributes whose answer predates our create
 * but arrives after it must not be kept as valid: the create's own event
 * is dropped as expected, so nothing else would ever correct it.
 */
static void test_fetch_across_create_not_kept(void **state)
{
	struct env *e = *state;
	struct getter g = { .e = e, .node = e->dir };
	struct sbx_node *n;
	struct sbx_file *fh;
	pthread_t t;

	/* Someone else's change: d's attributes must be fetched. */
	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	settle(e);
	hold(e);
	assert_int_equal(pmem_gate_arm_after(e->mem, "getattr", "d"), 0);
	assert_int_equal(pthread_create(&t, NULL, getattr_main, &g), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(create_in(e, e->dir, "f", &n, &fh), 0);
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(g.rc, 0);
	/* Before our own event arrives, and after. */
	same_st(e, e->dir, "d");
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	settle(e);
	same_st(e, e->dir, "d");
	e->ops->forget(e->cache, n);
}

/* ---- writes -------------------------------------------------------------- */

/* Create d/f and buffer "hello" in it (nothing pushed yet). */
static void create_hello(struct env *e, struct sbx_node **n,
			 struct sbx_file **fh)
{
	assert_int_equal(create_in(e, e->dir, "f", n, fh), 0);
	assert_int_equal(e->ops->write(e->cache, *fh, "hello", 5, 0), 5);
}

/* The sandbox's d/f holds `len` bytes. */
static void holds_len(struct env *e, size_t want)
{
	char buf[16];
	size_t len = 0;

	assert_int_equal(pmem_ext_read(e->mem, "d/f", buf, sizeof(buf), &len),
			 0);
	assert_int_equal(len, want);
}

/* Close fh, deliver the events, drop n. */
static void close_settle(struct env *e, struct sbx_node *n,
			 struct sbx_file *fh)
{
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	settle(e);
	e->ops->forget(e->cache, n);
}

static void test_push_keeps_file_attrs(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	hold(e);
	create_hello(e, &n, &fh);
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	assert_int_equal(e->ops->release(e->cache, fh), 0);
	/* git's lstat right after the close, before the write's event. */
	pmem_calls_reset(e->mem);
	same_st(e, n, "d/f");
	assert_int_equal(fetches(e), 0);
	settle(e);
	e->ops->forget(e->cache, n);
}

static void test_fsync_one_call(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	hold(e);
	create_hello(e, &n, &fh);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	assert_int_equal(pmem_calls(e->mem, "write_then"), 1);
	assert_int_equal(pmem_calls(e->mem, "write"), 0);
	assert_int_equal(pmem_calls(e->mem, "fsync"), 0);
	holds_len(e, 5);
	pmem_calls_reset(e->mem);
	same_st(e, n, "d/f");
	assert_int_equal(fetches(e), 0);
	close_settle(e, n, fh);
}

static void test_fsync_failure_keeps_bytes(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	assert_int_equal(pmem_fail(e->mem, "write_then", -ENOSPC, 1), 0);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), -ENOSPC);
	holds_len(e, 0);
	/* The bytes stayed: the next fsync delivers them. */
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	holds_len(e, 5);
	close_settle(e, n, fh);
}

/* fchmod(fh, mode) through the cache, held with fh's bytes. */
static void chmod_held(struct env *e, struct sbx_node *n,
		       struct sbx_file *fh, mode_t mode)
{
	struct stat in = { .st_mode = mode }, out;

	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_MODE,
					 &out),
			 0);
}

/*
 * tar's futimens, fchown and fchmod before close: setattrs of a file with
 * buffered bytes are held with them (no inner call), answered from the
 * local image, and the close sends the bytes and the merged setattr in
 * one inner call.
 */
static void test_setattr_held_with_the_bytes(void **state)
{
	struct env *e = *state;
	struct stat in, out, real;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	assert_int_equal(e->ops->getattr(e->cache, n, fh, &real), 0);
	pmem_calls_reset(e->mem);
	memset(&in, 0, sizeof(in));
	in.st_mtim.tv_sec = 1000000000;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_MTIME,
					 &out),
			 0);
	assert_int_equal(out.st_mtim.tv_sec, 1000000000);
	/* tar's fchown to the owner it already has. */
	in.st_uid = real.st_uid;
	in.st_gid = real.st_gid;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in,
					 SBX_SET_UID | SBX_SET_GID, &out),
			 0);
	in.st_mode = 0600;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_MODE,
					 &out),
			 0);
	assert_int_equal(out.st_size, 5);
	assert_int_equal(out.st_mode & 07777, 0600);
	assert_int_equal(out.st_uid, in.st_uid);
	assert_int_equal(out.st_mtim.tv_sec, 1000000000);
	/* Held: nothing sent, and getattr says the same without asking. */
	assert_int_equal(pmem_calls(e->mem, "write_then") +
				 pmem_calls(e->mem, "setattr") +
				 pmem_calls(e->mem, "write"),
			 0);
	holds_len(e, 0);
	assert_int_equal(e->ops->getattr(e->cache, n, fh, &out), 0);
	assert_int_equal(out.st_mode & 07777, 0600);
	assert_int_equal(fetches(e), 0);
	/* The close: one exchange, the bytes then every change. */
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	assert_int_equal(pmem_calls(e->mem, "write_then"), 1);
	assert_int_equal(pmem_calls(e->mem, "write"), 0);
	assert_int_equal(pmem_calls(e->mem, "setattr"), 0);
	holds_len(e, 5);
	assert_int_equal(pmem_ext_stat(e->mem, "d/f", &real), 0);
	assert_int_equal(real.st_mode & 07777, 0600);
	assert_int_equal(real.st_uid, in.st_uid);
	assert_int_equal(real.st_gid, in.st_gid);
	assert_int_equal(real.st_mtim.tv_sec, 1000000000);
	close_settle(e, n, fh);
}

/*
 * A chown that gives the file away is not held: it can fail on its own in
 * the sandbox, and chown(2) must say so.  A held mtime goes first.
 */
static void test_chown_away_is_not_held(void **state)
{
	struct env *e = *state;
	struct stat in, out, real;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	assert_int_equal(e->ops->getattr(e->cache, n, fh, &real), 0);
	pmem_calls_reset(e->mem);
	memset(&in, 0, sizeof(in));
	in.st_mtim.tv_sec = 1000000000;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_MTIME,
					 &out),
			 0);
	in.st_uid = real.st_uid + 1;
	in.st_gid = real.st_gid;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in,
					 SBX_SET_UID | SBX_SET_GID, &out),
			 0);
	/* Sent before chown() returned: the bytes, the held mtime, the chown. */
	assert_int_not_equal(pmem_calls(e->mem, "write_then") +
				     pmem_calls(e->mem, "setattr"),
			     0);
	assert_int_equal(pmem_ext_stat(e->mem, "d/f", &real), 0);
	assert_int_equal(real.st_uid, in.st_uid);
	assert_int_equal(real.st_size, 5);
	assert_int_equal(real.st_mtim.tv_sec, 1000000000);
	assert_int_equal(out.st_uid, in.st_uid);
	close_settle(e, n, fh);
}

/*
 * The setattr part fails after the bytes landed: the setattr says so, and
 * the bytes are not pushed again.
 */
static void test_setattr_failure_after_the_bytes(void **state)
{
	struct env *e = *state;
	struct stat in = { .st_size = -1 }, out;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	pmem_calls_reset(e->mem);
	assert_true(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_SIZE,
				    &out) < 0);
	holds_len(e, 5);
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	assert_int_equal(pmem_calls(e->mem, "write"), 0);
	assert_int_equal(pmem_calls(e->mem, "write_then"), 1);
	close_settle(e, n, fh);
}

/* A write after held times: the write's mtime (now) wins, as on a disk. */
static void test_write_after_held_times(void **state)
{
	struct env *e = *state;
	struct stat in, out, real;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	memset(&in, 0, sizeof(in));
	in.st_mtim.tv_sec = 1000000000;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_MTIME,
					 &out),
			 0);
	assert_int_equal(e->ops->write(e->cache, fh, "!", 1, 5), 1);
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	holds_len(e, 6);
	assert_int_equal(pmem_ext_stat(e->mem, "d/f", &real), 0);
	assert_true(real.st_mtim.tv_sec > 1000000000);
	close_settle(e, n, fh);
}

/* A truncate after a held chmod: the chmod is sent first, then it. */
static void test_truncate_after_held_mode(void **state)
{
	struct env *e = *state;
	struct stat in, out, real;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	memset(&in, 0, sizeof(in));
	in.st_mode = 0640;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_MODE,
					 &out),
			 0);
	in.st_size = 2;
	assert_int_equal(e->ops->setattr(e->cache, n, fh, &in, SBX_SET_SIZE,
					 &out),
			 0);
	assert_int_equal(out.st_size, 2);
	holds_len(e, 2);
	assert_int_equal(pmem_ext_stat(e->mem, "d/f", &real), 0);
	assert_int_equal(real.st_mode & 07777, 0640);
	close_settle(e, n, fh);
}

/* A failed exchange keeps the bytes and the held setattr for the next. */
static void test_held_setattr_push_failure_keeps_both(void **state)
{
	struct env *e = *state;
	struct stat real;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	chmod_held(e, n, fh, 0600);
	assert_int_equal(pmem_fail(e->mem, "write_then", -EIO, 1), 0);
	assert_int_equal(e->ops->flush(e->cache, fh), -EIO);
	holds_len(e, 0);
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	holds_len(e, 5);
	assert_int_equal(pmem_ext_stat(e->mem, "d/f", &real), 0);
	assert_int_equal(real.st_mode & 07777, 0600);
	close_settle(e, n, fh);
}

/*
 * The held chmod fails in the sandbox after the bytes landed, in a push
 * another descriptor's write made: that write succeeds (it did not ask
 * for the chmod), the owner's next flush says it once, and the bytes are
 * not sent again.
 */
static void test_held_setattr_error_goes_to_the_owner(void **state)
{
	struct env *e = *state;
	struct stat out, real;
	struct sbx_open_result res;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	chmod_held(e, n, fh, 0600);
	assert_int_equal(e->ops->open(e->cache, n, O_WRONLY, &res), 0);
	assert_int_equal(pmem_fail(e->mem, "then", -EPERM, 1), 0);
	pmem_calls_reset(e->mem);
	/* Pushes fh's bytes and its chmod first: the chmod fails. */
	assert_int_equal(e->ops->write(e->cache, res.fh, "J", 1, 0), 1);
	assert_int_equal(pmem_calls(e->mem, "then"), 1);
	holds_len(e, 5);
	assert_int_equal(e->ops->flush(e->cache, res.fh), 0);
	assert_int_equal(e->ops->release(e->cache, res.fh), 0);
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->flush(e->cache, fh), -EPERM);
	assert_non_null(strstr(sbx_error_last()->msg, "mode, owner or times"));
	assert_int_equal(e->ops->flush(e->cache, fh), 0);
	assert_int_equal(pmem_calls(e->mem, "write") +
				 pmem_calls(e->mem, "write_then"),
			 0);
	assert_int_equal(pmem_ext_stat(e->mem, "d/f", &real), 0);
	assert_int_equal(real.st_mode & 07777, 0644);
	assert_int_equal(real.st_size, 5);
	/* And the cache does not answer with the mode that was not set. */
	assert_int_equal(e->ops->getattr(e->cache, n, fh, &out), 0);
	assert_int_equal(out.st_mode & 07777, 0644);
	close_settle(e, n, fh);
}

/* Same through fsync: it reports the held chmod's failure. */
static void test_held_setattr_error_at_fsync(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	chmod_held(e, n, fh, 0600);
	assert_int_equal(pmem_fail(e->mem, "then", -EPERM, 1), 0);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), -EPERM);
	holds_len(e, 5);
	assert_int_equal(e->ops->fsync(e->cache, fh, false), 0);
	close_settle(e, n, fh);
}

/* A file with a second name: its chmod is not held (the other name's
 * attributes would not show it). */
static void test_setattr_of_a_linked_file_is_not_held(void **state)
{
	struct env *e = *state;
	struct stat out, real;
	struct sbx_node *n, *l;
	struct sbx_file *fh;

	settle(e);
	assert_int_equal(create_in(e, e->dir, "f", &n, &fh), 0);
	assert_int_equal(e->ops->link(e->cache, n, e->dir, "g", &l, &out), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "hello", 5, 0), 5);
	pmem_calls_reset(e->mem);
	chmod_held(e, n, fh, 0600);
	assert_int_not_equal(pmem_calls(e->mem, "write_then") +
				     pmem_calls(e->mem, "setattr"),
			     0);
	assert_int_equal(pmem_ext_stat(e->mem, "d/g", &real), 0);
	assert_int_equal(real.st_mode & 07777, 0600);
	assert_int_equal(e->ops->getattr(e->cache, l, NULL, &out), 0);
	assert_int_equal(out.st_mode & 07777, 0600);
	e->ops->forget(e->cache, l);
	close_settle(e, n, fh);
}

/* A link of a file with a held chmod: the new name has the mode. */
static void test_link_after_held_setattr(void **state)
{
	struct env *e = *state;
	struct stat out, real;
	struct sbx_node *n, *l;
	struct sbx_file *fh;

	settle(e);
	create_hello(e, &n, &fh);
	chmod_held(e, n, fh, 0600);
	assert_int_equal(e->ops->link(e->cache, n, e->dir, "g", &l, &out), 0);
	assert_int_equal(out.st_mode & 07777, 0600);
	assert_int_equal(out.st_size, 5);
	assert_int_equal(e->ops->getattr(e->cache, l, NULL, &out), 0);
	assert_int_equal(out.st_mode & 07777, 0600);
	assert_int_equal(pmem_ext_stat(e->mem, "d/g", &real), 0);
	assert_int_equal(real.st_mode & 07777, 0600);
	e->ops->forget(e->cache, l);
	close_settle(e, n, fh);
}

struct flusher {
	struct env *e;
	struct sbx_file *fh;
	int rc;
};

static void *flush_main(void *arg)
{
	struct flusher *fl = arg;

	fl->rc = fl->e->ops->flush(fl->e->cache, fl->fh);
	return NULL;
}

/*
 * A push and a create overlap: neither may trust what it got back (either
 * could be older than the other's change), both are fetched again.
 */
static void test_overlapping_calls_refetch(void **state)
{
	struct env *e = *state;
	struct flusher fl = { .e = e };
	struct sbx_node *n, *g;
	struct sbx_file *gfh;
	pthread_t t;

	settle(e);
	hold(e);
	assert_int_equal(create_in(e, e->dir, "f", &n, &fl.fh), 0);
	assert_int_equal(e->ops->write(e->cache, fl.fh, "hello", 5, 0), 5);
	assert_int_equal(pmem_gate_arm(e->mem, "write", "d/f"), 0);
	assert_int_equal(pthread_create(&t, NULL, flush_main, &fl), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 5000), 0);
	assert_int_equal(create_in(e, e->dir, "g", &g, &gfh), 0);
	pmem_gate_release(e->mem);
	pthread_join(t, NULL);
	assert_int_equal(fl.rc, 0);
	pmem_calls_reset(e->mem);
	same_st(e, n, "d/f");
	same_st(e, e->dir, "d");
	assert_int_equal(pmem_calls(e->mem, "getattr") +
				 pmem_calls(e->mem, "lookup"),
			 2);
	assert_int_equal(e->ops->release(e->cache, fl.fh), 0);
	assert_int_equal(e->ops->release(e->cache, gfh), 0);
	settle(e);
	e->ops->forget(e->cache, n);
	e->ops->forget(e->cache, g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_keeps_dir_attrs,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_mkdir_unlink_rmdir_keep_dir_attrs, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_rename_keeps_both_dirs,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_create_trunc_of_absent_name_keeps_dir_attrs, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_create_trunc_of_existing_expects_nothing, setup,
			teardown),
		cmocka_unit_test_setup_teardown(
			test_rename_keeps_the_moved_file, setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_rename_racing_event_refetches, setup, teardown),
		cmocka_unit_test_setup_teardown(test_racing_event_refetches,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_fetch_across_create_not_kept, setup, teardown),
		cmocka_unit_test_setup_teardown(test_push_keeps_file_attrs,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_fsync_one_call, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_fsync_failure_keeps_bytes,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_setattr_held_with_the_bytes,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_setattr_failure_after_the_bytes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chown_away_is_not_held,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_held_setattr_push_failure_keeps_both, setup, teardown),
		cmocka_unit_test_setup_teardown(test_write_after_held_times,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_truncate_after_held_mode,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_held_setattr_error_goes_to_the_owner, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_held_setattr_error_at_fsync,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_setattr_of_a_linked_file_is_not_held, setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_link_after_held_setattr,
						setup, teardown),

		cmocka_unit_test_setup_teardown(test_overlapping_calls_refetch,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
