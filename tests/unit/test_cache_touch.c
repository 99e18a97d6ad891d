/*
 * Deferred touches (fs/cache_touch.c): a setattr that only sets atime
 * and/or mtime to now is answered from the tree and sent later, many per
 * setattr_many call, over the in-memory sandbox (providers/mem).
 *
 * What is checked: a run of touches costs a few setattr_many calls and no
 * single setattr, answered locally with the times set to now, and the
 * sandbox has them once drained; a read, a write push, a rename of a
 * touched file and the exec barrier (syncfs) reach the sandbox only after
 * the touch (the order is recorded at the provider by a hook); a failing
 * batch logs the path and errno and invalidates the attributes.
 *
 * Order checks: the hook of the sender's setattr_many waits (up to
 * ORDER_WINDOW_MS) for the operation under test to reach the provider
 * first.  With the drain it never does, and the check passes whatever
 * the timing; without it, the window lets the overtaking request arrive
 * and be recorded before the touch, so the check fails.
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

#include "sbx/log.h"
#include "test_cache_i.h"

#define TOUCH (SBX_SET_ATIME | SBX_SET_MTIME | SBX_SET_ATIME_NOW | \
	       SBX_SET_MTIME_NOW)
#define ORDER_WINDOW_MS 300
#define NFILES 500

/* ---- the provider's view: operations in arrival order ------------------ */

struct rec {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	char ops[4096][48];
	size_t n;
	const char *wait_for; /* the op the setattr_many hook waits for */
};

static struct rec rec = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER };

static bool boring(const char *op)
{
	return !strcmp(op, "node_at") || !strcmp(op, "forget") ||
	       !strncmp(op, "watch_", 6) || !strcmp(op, "bulk:sent");
}

static void hook(const char *op, const char *path, void *payload)
{
	struct timespec until;

	(void)payload;
	if (boring(op))
		return;
	pthread_mutex_lock(&rec.lock);
	/* The batch is recorded once it goes on: after the window. */
	if (!strcmp(op, "setattr_many") && rec.wait_for) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_nsec += ORDER_WINDOW_MS * 1000000L;
		until.tv_sec += until.tv_nsec / 1000000000L;
		until.tv_nsec %= 1000000000L;
		while (pthread_cond_timedwait(&rec.cond, &rec.lock, &until) ==
		       0) {
			bool seen = false;

			for (size_t i = 0; i < rec.n; i++)
				if (!strncmp(rec.ops[i], rec.wait_for,
					     strlen(rec.wait_for)))
					seen = true;
			if (seen)
				break;
		}
	}
	if (rec.n < 4096)
		snprintf(rec.ops[rec.n++], sizeof(rec.ops[0]), "%s %s", op,
			 path);
	pthread_cond_broadcast(&rec.cond);
	pthread_mutex_unlock(&rec.lock);
}

/* Index of the first recorded op starting with `what`, or -1. */
static long rec_find(const char *what)
{
	long r = -1;

	pthread_mutex_lock(&rec.lock);
	for (size_t i = 0; i < rec.n && r < 0; i++)
		if (!strncmp(rec.ops[i], what, strlen(what)))
			r = (long)i;
	pthread_mutex_unlock(&rec.lock);
	return r;
}

/* Index of the first call that brought path's bytes (read or bulk). */
static long data_fetch(const char *path)
{
	char rd[64], bulk[64];
	long r, b;

	snprintf(rd, sizeof(rd), "read %s", path);
	snprintf(bulk, sizeof(bulk), "bulk %s", path);
	r = rec_find(rd);
	b = rec_find(bulk);
	return r < 0 ? b : b < 0 ? r : r < b ? r : b;
}

static void rec_start(struct tc_env *e, const char *wait_for)
{
	pthread_mutex_lock(&rec.lock);
	rec.n = 0;
	rec.wait_for = wait_for;
	pthread_mutex_unlock(&rec.lock);
	pmem_set_hook(e->mem, hook, NULL);
}

static int teardown(void **state)
{
	struct tc_env *e = *state;

	pmem_set_hook(e->mem, NULL, NULL);
	pmem_watch_hold(e->mem, false);
	return tc_teardown(state);
}

/* ---- helpers ------------------------------------------------------------ */

static struct sbx_node *look(struct tc_env *e, const char *name,
			     struct stat *st)
{
	struct sbx_node *n;

	assert_int_equal(e->ops->lookup(e->cache, e->root, name, &n, st), 0);
	return n;
}

static int touch(struct tc_env *e, struct sbx_node *n, struct stat *out)
{
	struct stat in;

	memset(&in, 0, sizeof(in));
	return e->ops->setattr(e->cache, n, NULL, &in, TOUCH, out);
}

static bool ts_after(struct timespec a, struct timespec b)
{
	return a.tv_sec > b.tv_sec ||
	       (a.tv_sec == b.tv_sec && a.tv_nsec > b.tv_nsec);
}

/* A file "f" with old times (set behind the mount), looked up. */
static struct sbx_node *old_file(struct tc_env *e, const char *name,
				 struct stat *st)
{
	assert_int_equal(pmem_ext_write(e->mem, name, "data", 4), 0);
	tc_settle(e);
	return look(e, name, st);
}

/* ---- tests -------------------------------------------------------------- */

static void test_many_touches_batched(void **state)
{
	struct tc_env *e = *state;
	static struct sbx_node *nodes[NFILES];
	struct stat before = {0}, out, st, mst;
	char name[32];

	for (int i = 0; i < NFILES; i++) {
		snprintf(name, sizeof(name), "o%03d", i);
		assert_int_equal(pmem_ext_write(e->mem, name, "x", 1), 0);
	}
	tc_settle(e);
	for (int i = 0; i < NFILES; i++) {
		snprintf(name, sizeof(name), "o%03d", i);
		nodes[i] = look(e, name, &st);
		if (i == 0)
			before = st;
	}
	/* Our own ATTR events would invalidate: keep them back. */
	pmem_watch_hold(e->mem, true);
	pmem_calls_reset(e->mem);
	/* The first batch parks at the provider; the rest queue meanwhile. */
	assert_int_equal(pmem_gate_arm(e->mem, "setattr_many", NULL), 0);
	for (int i = 0; i < NFILES; i++) {
		assert_int_equal(touch(e, nodes[i], &out), 0);
		assert_true(ts_after(out.st_mtim, before.st_mtim));
		assert_int_equal(out.st_size, 1);
		if (i == 0)
			assert_int_equal(pmem_gate_wait(e->mem, 10000), 0);
	}
	/* Answered locally, and getattr says the same without asking. */
	assert_int_equal(e->ops->getattr(e->cache, nodes[NFILES - 1], NULL,
					 &st),
			 0);
	assert_int_equal(st.st_mtim.tv_sec, out.st_mtim.tv_sec);
	assert_int_equal(st.st_mtim.tv_nsec, out.st_mtim.tv_nsec);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 0);
	assert_int_equal(pmem_calls(e->mem, "setattr"), 0);
	pmem_gate_release(e->mem);
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	assert_true(pmem_calls(e->mem, "setattr_many") <= 2);
	assert_int_equal(pmem_calls(e->mem, "setattr"), 0);
	/* The sandbox has the new times. */
	for (int i = 0; i < NFILES; i++) {
		snprintf(name, sizeof(name), "o%03d", i);
		assert_int_equal(pmem_ext_stat(e->mem, name, &mst), 0);
		assert_true(ts_after(mst.st_mtim, before.st_mtim));
		e->ops->forget(e->cache, nodes[i]);
	}
}

/* A touch whose answer is not local: other setattrs go as before. */
static void test_other_setattr_not_deferred(void **state)
{
	struct tc_env *e = *state;
	struct stat st, in, out;
	struct sbx_node *n = old_file(e, "f", &st);

	memset(&in, 0, sizeof(in));
	in.st_mtim.tv_sec = 1000;
	assert_int_equal(e->ops->setattr(e->cache, n, NULL, &in,
					 SBX_SET_MTIME, &out),
			 0);
	assert_int_equal(pmem_calls(e->mem, "setattr"), 1);
	assert_int_equal(pmem_calls(e->mem, "setattr_many"), 0);
	assert_int_equal(out.st_mtim.tv_sec, 1000);
	e->ops->forget(e->cache, n);
}

static void test_read_waits_for_touch(void **state)
{
	struct tc_env *e = *state;
	struct sbx_file *fh;
	struct stat st, out;
	struct sbx_node *n = old_file(e, "f", &st);
	char buf[8];

	rec_start(e, "read");
	assert_int_equal(touch(e, n, &out), 0);
	assert_int_equal(tc_open(e, n, O_RDONLY, &fh), 0);
	assert_int_equal(e->ops->read(e->cache, fh, buf, sizeof(buf), 0), 4);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(rec_find("setattr_many f") >= 0);
	/*
	 * The bytes come by a read, or by a bulk fetch with the content when
	 * the attributes went stale meanwhile (a loaded machine): either
	 * after the touch.
	 */
	assert_true(data_fetch("f") > rec_find("setattr_many f"));
	e->ops->forget(e->cache, n);
}

static void test_write_waits_for_touch(void **state)
{
	struct tc_env *e = *state;
	struct sbx_file *fh;
	struct stat st, out;
	struct sbx_node *n = old_file(e, "f", &st);

	rec_start(e, "write");
	assert_int_equal(touch(e, n, &out), 0);
	assert_int_equal(tc_open(e, n, O_WRONLY, &fh), 0);
	assert_int_equal(e->ops->write(e->cache, fh, "DATA", 4, 0), 4);
	assert_int_equal(tc_close(e, fh), 0);
	assert_true(rec_find("setattr_many f") >= 0);
	assert_true(rec_find("write") > rec_find("setattr_many f"));
	assert_true(tc_holds(e, "f", "DATA", 4));
	e->ops->forget(e->cache, n);
}

static void test_rename_waits_for_touch(void **state)
{
	struct tc_env *e = *state;
	struct stat st, out, mst;
	struct sbx_node *n = old_file(e, "f", &st);

	rec_start(e, "rename");
	assert_int_equal(touch(e, n, &out), 0);
	assert_int_equal(e->ops->rename(e->cache, e->root, "f", e->root, "g",
					0),
			 0);
	assert_true(rec_find("setattr_many f") >= 0);
	assert_true(rec_find("rename") > rec_find("setattr_many f"));
	assert_int_equal(pmem_ext_stat(e->mem, "g", &mst), 0);
	assert_true(ts_after(mst.st_mtim, st.st_mtim));
	e->ops->forget(e->cache, n);
}

static void test_exec_barrier_drains(void **state)
{
	struct tc_env *e = *state;
	struct stat st, out, mst;
	struct sbx_node *n = old_file(e, "f", &st);

	rec_start(e, "syncfs");
	assert_int_equal(touch(e, n, &out), 0);
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	/* Done by the time the barrier returns, and before its syncfs. */
	assert_int_equal(pmem_ext_stat(e->mem, "f", &mst), 0);
	assert_true(ts_after(mst.st_mtim, st.st_mtim));
	assert_true(rec_find("syncfs") > rec_find("setattr_many f"));
	e->ops->forget(e->cache, n);
}

/* Unmount (the cache freed) sends what is queued first. */
static void test_teardown_sends_touches(void **state)
{
	struct tc_env *e = *state;
	struct stat st, out, mst;
	struct sbx_node *n = old_file(e, "f", &st);

	rec_start(e, "nothing");
	assert_int_equal(touch(e, n, &out), 0);
	e->ops->forget(e->cache, n);
	sbx_sandbox_free(e->cache);
	e->cache = NULL;
	assert_int_equal(pmem_ext_stat(e->mem, "f", &mst), 0);
	assert_true(ts_after(mst.st_mtim, st.st_mtim));
}

static bool file_has(const char *path, const char *a, const char *b)
{
	char buf[8192];
	FILE *f = fopen(path, "r");
	size_t len;

	if (!f)
		return false;
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	return strstr(buf, a) && strstr(buf, b);
}

static void test_failed_touch_logged_and_invalidated(void **state)
{
	struct tc_env *e = *state;
	char log[] = "/tmp/sbx-touch-log-XXXXXX";
	struct stat st, out, st2;
	struct sbx_node *n = old_file(e, "failing", &st);
	int fd = mkstemp(log);

	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sbx_log_open(log), 0);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_fail(e->mem, "setattr_many", -EIO, 1), 0);
	assert_int_equal(touch(e, n, &out), 0);
	assert_true(ts_after(out.st_mtim, st.st_mtim));
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	assert_true(file_has(log, "'failing'", strerror(EIO)));
	/* Not what we answered any more: asked again, the sandbox's times. */
	pmem_calls_reset(e->mem);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st2), 0);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 1);
	assert_int_equal(st2.st_mtim.tv_sec, st.st_mtim.tv_sec);
	assert_int_equal(st2.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
	unlink(log);
	e->ops->forget(e->cache, n);
}

/* A file removed behind the mount before its touch went out. */
static void test_vanished_file_logged(void **state)
{
	struct tc_env *e = *state;
	char log[] = "/tmp/sbx-touch-log-XXXXXX";
	struct stat st, out;
	struct sbx_node *n = old_file(e, "gone", &st);
	int fd = mkstemp(log);

	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sbx_log_open(log), 0);
	pmem_watch_hold(e->mem, true);
	assert_int_equal(pmem_gate_arm(e->mem, "setattr_many", NULL), 0);
	assert_int_equal(touch(e, n, &out), 0);
	assert_int_equal(pmem_gate_wait(e->mem, 10000), 0);
	assert_int_equal(pmem_ext_unlink(e->mem, "gone"), 0);
	pmem_gate_release(e->mem);
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	assert_true(file_has(log, "'gone'", strerror(ENOENT)));
	unlink(log);
	e->ops->forget(e->cache, n);
}

/*
 * The attribute event our own touch causes changes nothing: after the
 * batch and its event, the file's attributes are the sandbox's (its
 * clock's times) and answering them costs no call.  A foreign change of
 * the same file after the grace is seen as before.
 */
static void test_touch_echo_costs_nothing(void **state)
{
	struct tc_env *e = *state;
	struct stat st, out, st2, mst;
	struct sbx_node *n = old_file(e, "f", &st);
	struct timespec pause = { 2, 200000000L }; /* > TOUCH_ECHO_GRACE */

	assert_int_equal(touch(e, n, &out), 0);
	assert_true(ts_after(out.st_mtim, st.st_mtim));
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	/* The echo arrives and is applied (watch_sync: every event so far). */
	assert_true(pmem_watch_pending(e->mem) > 0 ||
		    pmem_calls(e->mem, "setattr_many") == 1);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st2), 0);
	e->ops->forget(e->cache, look(e, "f", &st2));
	assert_int_equal(pmem_calls(e->mem, "getattr"), 0);
	assert_int_equal(pmem_calls(e->mem, "lookup"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "f", &mst), 0);
	assert_int_equal(st2.st_mtim.tv_sec, mst.st_mtim.tv_sec);
	assert_int_equal(st2.st_mtim.tv_nsec, mst.st_mtim.tv_nsec);
	assert_int_equal(st2.st_ctim.tv_nsec, mst.st_ctim.tv_nsec);

	/* After the grace, an attribute change behind the mount is seen. */
	nanosleep(&pause, NULL);
	assert_int_equal(pmem_ext_chmod(e->mem, "f", 0600), 0);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, n, NULL, &st2), 0);
	assert_int_equal(st2.st_mode & 07777, 0600);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 1);
	e->ops->forget(e->cache, n);
}

/* A directory's touch: its echo changes nothing either. */
static void test_directory_touch_echo_costs_nothing(void **state)
{
	struct tc_env *e = *state;
	struct stat st, out, st2, mst;
	struct sbx_node *d;

	assert_int_equal(pmem_ext_mkdir(e->mem, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->mem, "d/x", "x", 1), 0);
	tc_settle(e);
	d = look(e, "d", &st);
	assert_int_equal(touch(e, d, &out), 0);
	assert_int_equal(e->ops->syncfs(e->cache), 0);
	tc_settle(e);
	assert_int_equal(e->ops->getattr(e->cache, d, NULL, &st2), 0);
	assert_int_equal(pmem_calls(e->mem, "getattr"), 0);
	assert_int_equal(pmem_ext_stat(e->mem, "d", &mst), 0);
	assert_int_equal(st2.st_mtim.tv_nsec, mst.st_mtim.tv_nsec);
	e->ops->forget(e->cache, d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_many_touches_batched,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_other_setattr_not_deferred,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_read_waits_for_touch,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_write_waits_for_touch,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_waits_for_touch,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_exec_barrier_drains,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_teardown_sends_touches,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_failed_touch_logged_and_invalidated, tc_setup,
			teardown),
		cmocka_unit_test_setup_teardown(test_vanished_file_logged,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(test_touch_echo_costs_nothing,
						tc_setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_directory_touch_echo_costs_nothing, tc_setup,
			teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
