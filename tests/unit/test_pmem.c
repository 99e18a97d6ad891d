/*
 * The in-memory sandbox (providers/mem): the tree, open-by-path semantics,
 * inode-number reuse, the change stream and the test instrumentation that
 * test_cache relies on.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "../../providers/mem/pmem.h"
#include "test_changes_i.h"
#include "test_helpers_i.h"

struct env {
	struct sbx_sandbox *sb;
	const struct sbx_sandbox_ops *ops;
	struct sbx_node *root;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_int_equal(pmem_new(&e->sb, NULL), 0);
	e->ops = e->sb->ops;
	e->root = e->ops->root(e->sb);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	sbx_sandbox_free(e->sb);
	free(e);
	return 0;
}

/* Changes seen by the watch callback. */
static struct th_changes ev = TH_CHANGES_INIT;

static void test_create_write_read(void **state)
{
	struct env *e = *state;
	struct sbx_open_result res;
	struct sbx_node *n, *n2;
	struct stat st;
	char buf[16];
	size_t len;

	assert_int_equal(e->ops->create(e->sb, e->root, "f", 0640,
					O_CREAT | O_EXCL | O_RDWR, &n, &st,
					&res),
			 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0640);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(st.st_dev, PMEM_DEFAULT_DEV);
	assert_int_equal(e->ops->write(e->sb, res.fh, "hello", 5, 0), 5);
	assert_int_equal(e->ops->read(e->sb, res.fh, buf, sizeof(buf), 1), 4);
	assert_memory_equal(buf, "ello", 4);
	assert_int_equal(e->ops->release(e->sb, res.fh), 0);

	e->ops->forget(e->sb, n);
	assert_int_equal(pmem_ext_read(e->sb, "f", buf, sizeof(buf), &len), 0);
	assert_int_equal(len, 5);
	assert_int_equal(e->ops->lookup(e->sb, e->root, "f", &n2, &st), 0);
	assert_int_equal(st.st_size, 5);
	assert_int_equal(e->ops->create(e->sb, e->root, "f", 0640,
					O_CREAT | O_EXCL | O_RDWR, &n, &st,
					&res),
			 -EEXIST);
	assert_int_equal(e->ops->lookup(e->sb, e->root, "nope", &n, &st),
			 -ENOENT);
	e->ops->forget(e->sb, n2);
}

static void test_open_is_by_path(void **state)
{
	struct env *e = *state;
	struct sbx_open_result res;
	struct sbx_node *n;
	struct stat st;
	char buf[8];
	size_t len;

	assert_int_equal(pmem_ext_write(e->sb, "a", "x", 1), 0);
	assert_int_equal(e->ops->node_at(e->sb, "a", &n), 0);
	assert_int_equal(e->ops->open(e->sb, n, O_WRONLY, &res), 0);
	assert_int_equal(pmem_ext_rename(e->sb, "a", "b", 0), 0);
	/* The agent opens the path at each write: it is gone. */
	assert_int_equal(e->ops->write(e->sb, res.fh, "y", 1, 0), -ENOENT);
	assert_int_equal(e->ops->fsync(e->sb, res.fh, false), -ENOENT);
	/* A new file at the path gets the next write. */
	assert_int_equal(pmem_ext_write(e->sb, "a", "", 0), 0);
	assert_int_equal(e->ops->write(e->sb, res.fh, "z", 1, 0), 1);
	assert_int_equal(pmem_ext_read(e->sb, "a", buf, sizeof(buf), &len), 0);
	assert_int_equal(len, 1);
	assert_int_equal(buf[0], 'z');
	assert_int_equal(pmem_ext_read(e->sb, "b", buf, sizeof(buf), &len), 0);
	assert_int_equal(buf[0], 'x');
	assert_int_equal(e->ops->release(e->sb, res.fh), 0);
	e->ops->forget(e->sb, n);

	/* O_TRUNC on open truncates. */
	assert_int_equal(e->ops->node_at(e->sb, "/b", &n), 0);
	assert_int_equal(e->ops->open(e->sb, n, O_WRONLY | O_TRUNC, &res), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "b", &st), 0);
	assert_int_equal(st.st_size, 0);
	assert_int_equal(e->ops->release(e->sb, res.fh), 0);
	e->ops->forget(e->sb, n);
	assert_int_equal(e->ops->node_at(e->sb, "x/../y", &n), -EINVAL);
}

static void test_hard_links_and_ino_reuse(void **state)
{
	struct env *e = *state;
	struct sbx_node *a, *b;
	struct stat st, st2;
	ino_t ino;

	assert_int_equal(pmem_ext_write(e->sb, "a", "data", 4), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "a", &st), 0);
	ino = st.st_ino;
	assert_int_equal(e->ops->node_at(e->sb, "a", &a), 0);
	assert_int_equal(e->ops->link(e->sb, a, e->root, "b", &b, &st2), 0);
	assert_int_equal(st2.st_ino, ino);
	assert_int_equal(st2.st_nlink, 2);
	assert_int_equal(e->ops->unlink(e->sb, e->root, "a"), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "b", &st), 0);
	assert_int_equal(st.st_nlink, 1);
	assert_int_equal(st.st_size, 4);
	assert_int_equal(e->ops->getattr(e->sb, a, NULL, &st), -ENOENT);
	assert_int_equal(e->ops->getattr(e->sb, b, NULL, &st), 0);
	assert_int_equal(e->ops->unlink(e->sb, e->root, "b"), 0);
	/* The lowest free number comes back for the next object. */
	assert_int_equal(pmem_ext_mkdir(e->sb, "d", 0755), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "d", &st), 0);
	assert_int_equal(st.st_ino, ino);
	assert_int_equal(st.st_nlink, 2);
	assert_int_equal(pmem_ext_link(e->sb, "d", "e"), -EPERM);
	assert_int_equal(pmem_ext_stat(e->sb, "", &st), 0);
	assert_int_equal(st.st_ino, 1);
	assert_int_equal(st.st_nlink, 3);
	e->ops->forget(e->sb, a);
	e->ops->forget(e->sb, b);
}

static void test_no_reuse_policy(void **state)
{
	struct pmem_opts o = {.ino_policy = PMEM_INO_NEXT, .dev = 77};
	struct sbx_sandbox *sb;
	struct stat st;
	ino_t first;

	assert_int_equal(pmem_new(&sb, &o), 0);
	assert_int_equal(pmem_ext_write(sb, "a", "", 0), 0);
	assert_int_equal(pmem_ext_stat(sb, "a", &st), 0);
	assert_int_equal(st.st_dev, 77);
	first = st.st_ino;
	assert_int_equal(pmem_ext_unlink(sb, "a"), 0);
	assert_int_equal(pmem_ext_write(sb, "a", "", 0), 0);
	assert_int_equal(pmem_ext_stat(sb, "a", &st), 0);
	assert_int_not_equal(st.st_ino, first);
	sbx_sandbox_free(sb);
}

static void test_rename_flags(void **state)
{
	struct env *e = *state;
	struct stat sa, sb2, st;

	assert_int_equal(pmem_ext_write(e->sb, "a", "A", 1), 0);
	assert_int_equal(pmem_ext_write(e->sb, "b", "BB", 2), 0);
	assert_int_equal(pmem_ext_mkdir(e->sb, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->sb, "d/x", "", 0), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "a", &sa), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "b", &sb2), 0);

	assert_int_equal(e->ops->rename(e->sb, e->root, "a", e->root, "b",
					RENAME_NOREPLACE),
			 -EEXIST);
	assert_int_equal(e->ops->rename(e->sb, e->root, "a", e->root, "b",
					RENAME_EXCHANGE),
			 0);
	assert_int_equal(pmem_ext_stat(e->sb, "a", &st), 0);
	assert_int_equal(st.st_ino, sb2.st_ino);
	assert_int_equal(pmem_ext_rename(e->sb, "a", "d", 0), -EISDIR);
	assert_int_equal(pmem_ext_rename(e->sb, "d", "a", 0), -ENOTDIR);
	assert_int_equal(pmem_ext_mkdir(e->sb, "d2", 0755), 0);
	assert_int_equal(pmem_ext_rename(e->sb, "d2", "d", 0), -ENOTEMPTY);
	assert_int_equal(pmem_ext_rename(e->sb, "d", "d/x/y", 0), -ENOTDIR);
	assert_int_equal(pmem_ext_rename(e->sb, "d", "d/sub", 0), -EINVAL);
	/* Plain rename replaces and frees the replaced file. */
	assert_int_equal(pmem_ext_rename(e->sb, "a", "b", 0), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "b", &st), 0);
	assert_int_equal(st.st_ino, sb2.st_ino);
	assert_int_equal(pmem_ext_stat(e->sb, "a", &st), -ENOENT);
	/* A directory moving in fixes both parents' link counts. */
	assert_int_equal(pmem_ext_rename(e->sb, "d2", "d/d2", 0), 0);
	assert_int_equal(pmem_ext_stat(e->sb, "d", &st), 0);
	assert_int_equal(st.st_nlink, 3);
	assert_int_equal(pmem_ext_stat(e->sb, "", &st), 0);
	assert_int_equal(st.st_nlink, 3);
	assert_int_equal(pmem_ext_rmdir(e->sb, "d"), -ENOTEMPTY);
}

struct dirlist {
	int n;
	char names[16][16];
	int nodes;
	struct sbx_sandbox *sb;
};

static int collect(const char *name, const struct stat *st,
		   struct sbx_node *node, off_t next, void *payload)
{
	struct dirlist *l = payload;

	if (l->n >= 16)
		return 1;
	snprintf(l->names[l->n++], 16, "%s", name);
	if (node) {
		l->nodes++;
		l->sb->ops->forget(l->sb, node);
	}
	return 0;
}

static void test_readdir_and_bulk(void **state)
{
	struct env *e = *state;
	struct dirlist l = {.sb = e->sb};
	struct sbx_file *dh;

	assert_int_equal(pmem_ext_mkdir(e->sb, "d", 0755), 0);
	assert_int_equal(pmem_ext_write(e->sb, "d/f", "ff", 2), 0);
	assert_int_equal(pmem_ext_symlink(e->sb, "f", "d/l"), 0);
	assert_int_equal(pmem_ext_mkdir(e->sb, "d/s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->sb, "d/s/g", "g", 1), 0);

	assert_int_equal(e->ops->opendir(e->sb, e->root, &dh), 0);
	assert_int_equal(e->ops->readdir(e->sb, dh, 0, SBX_READDIR_PLUS,
					 collect, &l),
			 0);
	assert_int_equal(l.n, 3);
	assert_string_equal(l.names[0], ".");
	assert_string_equal(l.names[1], "..");
	assert_string_equal(l.names[2], "d");
	assert_int_equal(l.nodes, 1);
	assert_int_equal(e->ops->releasedir(e->sb, dh), 0);
}

struct bulk_rec {
	int n;
	char what[16][32];
};

static int on_item(const struct sbx_bulk_item *it, void *payload)
{
	struct bulk_rec *r = payload;

	if (r->n < 16)
		snprintf(r->what[r->n++], 32, "%s:%s:%zu",
			 it->kind == SBX_BULK_DIR ? "D" : "F", it->path,
			 it->kind == SBX_BULK_DIR ? it->nentries : it->len);
	return 0;
}

static void test_bulk_breadth_first(void **state)
{
	struct env *e = *state;
	struct sbx_bulk_opts o = {.max_file = 2, .max_total = 100, .depth = -1};
	struct bulk_rec r = {0};

	assert_int_equal(pmem_ext_mkdir(e->sb, "d", 0755), 0);
	assert_int_equal(pmem_ext_mkdir(e->sb, "d/s", 0755), 0);
	assert_int_equal(pmem_ext_write(e->sb, "d/s/g", "g", 1), 0);
	assert_int_equal(pmem_ext_write(e->sb, "d/f", "ff", 2), 0);
	assert_int_equal(pmem_ext_write(e->sb, "d/big", "123", 3), 0);
	assert_int_equal(pmem_ext_write(e->sb, "top", "t", 1), 0);

	assert_int_equal(e->sb->ops->bulk(e->sb, "", &o, on_item, &r), 0);
	assert_int_equal(r.n, 6);
	assert_string_equal(r.what[0], "D::2");
	assert_string_equal(r.what[1], "F:top:1");
	assert_string_equal(r.what[2], "D:d:3");
	assert_string_equal(r.what[3], "F:d/f:2");
	assert_string_equal(r.what[4], "D:d/s:1");
	assert_string_equal(r.what[5], "F:d/s/g:1");

	o.depth = 0;
	r.n = 0;
	assert_int_equal(e->sb->ops->bulk(e->sb, "d", &o, on_item, &r), 0);
	assert_int_equal(r.n, 2);
	assert_string_equal(r.what[0], "D:d:3");
}

static void test_faults_and_counters(void **state)
{
	struct env *e = *state;
	struct stat st;
	struct sbx_node *n;

	assert_int_equal(pmem_ext_write(e->sb, "f", "", 0), 0);
	assert_int_equal(e->ops->node_at(e->sb, "f", &n), 0);
	assert_int_equal(pmem_fail(e->sb, "getattr", -EIO, 2), 0);
	assert_int_equal(e->ops->getattr(e->sb, n, NULL, &st), -EIO);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_int_equal(e->ops->getattr(e->sb, n, NULL, &st), -EIO);
	assert_int_equal(e->ops->getattr(e->sb, n, NULL, &st), 0);
	assert_int_equal(pmem_calls(e->sb, "getattr"), 3);
	assert_int_equal(pmem_calls(e->sb, "node_at"), 1);
	assert_int_equal(pmem_fail(e->sb, "getattr", -ETIMEDOUT, -1), 0);
	for (int i = 0; i < 5; i++)
		assert_int_equal(e->ops->getattr(e->sb, n, NULL, &st),
				 -ETIMEDOUT);
	assert_int_equal(pmem_fail(e->sb, "getattr", 0, 0), 0);
	assert_int_equal(e->ops->getattr(e->sb, n, NULL, &st), 0);
	assert_int_equal(pmem_fail(e->sb, "no_such_op", -EIO, 1), -EINVAL);
	pmem_calls_reset(e->sb);
	assert_int_equal(pmem_calls(e->sb, "getattr"), 0);
	e->ops->forget(e->sb, n);
}

/* The gate: a getattr parks until released; meanwhile the test acts. */
struct getter {
	struct env *e;
	struct sbx_node *n;
	int rc;
	struct stat st;
};

static void *do_getattr(void *arg)
{
	struct getter *g = arg;

	g->rc = g->e->ops->getattr(g->e->sb, g->n, NULL, &g->st);
	return NULL;
}

static void test_gate_orders_calls(void **state)
{
	struct env *e = *state;
	struct getter g = {.e = e};
	pthread_t t;

	assert_int_equal(pmem_ext_write(e->sb, "f", "1", 1), 0);
	assert_int_equal(e->ops->node_at(e->sb, "f", &g.n), 0);
	assert_int_equal(pmem_gate_arm(e->sb, "getattr", "f"), 0);
	assert_int_equal(pthread_create(&t, NULL, do_getattr, &g), 0);
	assert_int_equal(pmem_gate_wait(e->sb, 5000), 0);
	/* The call has started but not looked: change the file now. */
	assert_int_equal(pmem_ext_write(e->sb, "f", "22", 2), 0);
	pmem_gate_release(e->sb);
	pthread_join(t, NULL);
	assert_int_equal(g.rc, 0);
	assert_int_equal(g.st.st_size, 2);
	/* Disarmed after one use. */
	assert_int_equal(pmem_gate_wait(e->sb, 10), -ETIMEDOUT);
	e->ops->forget(e->sb, g.n);
}

static void test_events(void **state)
{
	struct env *e = *state;
	struct sbx_node *n;
	struct stat st;

	th_changes_reset(&ev);
	assert_int_equal(e->ops->watch_start(e->sb, th_changes_record, &ev), 0);
	assert_true(e->ops->watch_healthy(e->sb));
	pmem_watch_hold(e->sb, true);
	assert_int_equal(pmem_ext_write(e->sb, "a", "1", 1), 0);
	assert_int_equal(pmem_ext_link(e->sb, "a", "b"), 0);
	assert_int_equal(pmem_ext_chmod(e->sb, "b", 0600), 0);
	assert_int_equal(pmem_ext_rename(e->sb, "b", "c", 0), 0);
	assert_int_equal(e->ops->mkdir(e->sb, e->root, "d", 0755, &n, &st), 0);
	e->ops->forget(e->sb, n);
	assert_int_equal(pmem_watch_pending(e->sb), 7);
	assert_int_equal(ev.n, 0);
	/* watch_sync delivers even while the thread is held. */
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_int_equal(ev.n, 7);
	assert_int_equal(ev.c[0].kind, SBX_CHANGE_ENTRY);
	assert_string_equal(ev.c[0].path, "a");
	assert_int_equal(ev.c[1].kind, SBX_CHANGE_DATA);
	assert_int_equal(ev.c[2].kind, SBX_CHANGE_ENTRY);
	assert_string_equal(ev.c[2].path, "b");
	assert_int_equal(ev.c[3].kind, SBX_CHANGE_ATTR);
	assert_string_equal(ev.c[4].path, "b");
	assert_string_equal(ev.c[5].path, "c");
	assert_string_equal(ev.c[6].path, "d");
	pmem_watch_hold(e->sb, false);
	pmem_ext_overflow(e->sb);
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_int_equal(ev.n, 8);
	assert_int_equal(ev.c[7].kind, SBX_CHANGE_OVERFLOW);
	pmem_set_healthy(e->sb, false);
	assert_false(e->ops->watch_healthy(e->sb));
	e->ops->watch_stop(e->sb);
	assert_false(e->ops->watch_healthy(e->sb));
}

/* Attributes on the side (struct sbx_side) and write_then. */
static void test_side_attrs(void **state)
{
	struct env *e = *state;
	struct sbx_open_result res;
	struct sbx_node *d, *n;
	struct sbx_side side;
	struct stat st, real;

	assert_int_equal(e->ops->mkdir(e->sb, e->root, "d", 0755, &d, &st), 0);
	/* Not armed: nothing filled. */
	memset(&side, 0, sizeof(side));
	assert_int_equal(e->ops->create(e->sb, d, "f", 0644,
					O_CREAT | O_WRONLY, &n, &st, &res),
			 0);
	assert_false(side.has_dir);
	assert_int_equal(e->ops->release(e->sb, res.fh), 0);
	e->ops->forget(e->sb, n);

	sbx_side_arm(&side);
	assert_int_equal(e->ops->create(e->sb, d, "g", 0644,
					O_CREAT | O_WRONLY, &n, &st, &res),
			 0);
	assert_true(side.has_dir);
	assert_int_equal(pmem_ext_stat(e->sb, "d", &real), 0);
	assert_int_equal(side.dir.st_ino, real.st_ino);
	assert_int_equal(side.dir.st_mtim.tv_nsec, real.st_mtim.tv_nsec);
	assert_int_equal(e->ops->write(e->sb, res.fh, "abc", 3, 0), 3);
	assert_true(side.has_file);
	assert_int_equal(side.file.st_size, 3);
	{
		struct sbx_write_then fs = { .kind = SBX_THEN_FSYNC };
		struct stat in = { .st_mode = 0600, .st_size = -1 };
		struct sbx_write_then sa = { .kind = SBX_THEN_SETATTR,
					     .in = &in, .valid = SBX_SET_MODE };
		bool written = false;

		assert_int_equal(e->ops->write_then(e->sb, res.fh, "defg", 4,
						    3, &fs, &st, &written),
				 0);
		assert_true(written);
		assert_int_equal(st.st_size, 7);
		assert_int_equal(e->ops->write_then(e->sb, res.fh, "h", 1, 7,
						    &sa, &st, &written),
				 0);
		assert_true(written);
		assert_int_equal(st.st_size, 8);
		assert_int_equal(st.st_mode & 07777, 0600);
		/* The setattr fails after the write landed: said so. */
		sa.valid = SBX_SET_SIZE;
		written = false;
		assert_true(e->ops->write_then(e->sb, res.fh, "i", 1, 8, &sa,
					       &st, &written) < 0);
		assert_true(written);
		sbx_error_clear();
	}
	assert_int_equal(e->ops->release(e->sb, res.fh), 0);
	e->ops->forget(e->sb, n);

	memset(&side, 0, sizeof(side));
	assert_int_equal(e->ops->rename(e->sb, d, "g", e->root, "h", 0), 0);
	assert_true(side.has_dir && side.has_newdir);
	assert_int_equal(side.dir.st_ino, real.st_ino);
	assert_int_equal(side.newdir.st_ino, 1);
	memset(&side, 0, sizeof(side));
	assert_int_equal(e->ops->unlink(e->sb, e->root, "h"), 0);
	assert_true(side.has_dir);
	assert_int_equal(side.dir.st_ino, 1);
	/* A failed operation fills nothing. */
	memset(&side, 0, sizeof(side));
	assert_int_equal(e->ops->unlink(e->sb, e->root, "h"), -ENOENT);
	assert_false(side.has_dir);
	sbx_side_arm(NULL);
	e->ops->forget(e->sb, d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		TH_TEST(test_create_write_read),
		TH_TEST(test_open_is_by_path),
		TH_TEST(test_hard_links_and_ino_reuse),
		cmocka_unit_test(test_no_reuse_policy),
		TH_TEST(test_rename_flags),
		TH_TEST(test_readdir_and_bulk),
		TH_TEST(test_bulk_breadth_first),
		TH_TEST(test_faults_and_counters),
		TH_TEST(test_gate_orders_calls),
		TH_TEST(test_events),
		TH_TEST(test_side_attrs),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
