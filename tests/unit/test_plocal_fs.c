/*
 * Local data plane and change stream, without FUSE: the provider table is
 * driven directly against a real worktree directory.
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
#include <git2.h>

#include "sbx/provider.h"
#include "../../providers/local/plocal_i.h"
#include "test_helpers_i.h"

struct env {
	char *dir;
	struct plocal_provider p;
	struct sbx_sandbox *sb;
	const struct sbx_sandbox_ops *ops;
};

/* Changes seen by the watch callback. */
#define MAX_CHANGES 256
static struct {
	pthread_mutex_t lock;
	int n;
	int kind[MAX_CHANGES];
	char name[MAX_CHANGES][64];
	ino_t ino[MAX_CHANGES];
} seen = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void on_change(const struct sbx_change *c, void *payload)
{
	pthread_mutex_lock(&seen.lock);
	if (seen.n < MAX_CHANGES) {
		seen.kind[seen.n] = c->kind;
		snprintf(seen.name[seen.n], 64, "%s", c->name ? c->name : "");
		seen.ino[seen.n] = c->ino;
		seen.n++;
	}
	pthread_mutex_unlock(&seen.lock);
}

static void seen_reset(void)
{
	pthread_mutex_lock(&seen.lock);
	seen.n = 0;
	pthread_mutex_unlock(&seen.lock);
}

static int seen_count(int kind, const char *name)
{
	int n = 0;

	pthread_mutex_lock(&seen.lock);
	for (int i = 0; i < seen.n; i++)
		if (seen.kind[i] == kind && (!name ||
					     strcmp(seen.name[i], name) == 0))
			n++;
	pthread_mutex_unlock(&seen.lock);
	return n;
}

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	git_repository *repo = NULL;

	e->dir = th_tmpdir();
	assert_non_null(e->dir);
	git_libgit2_init();
	assert_int_equal(git_repository_init(&repo, e->dir, 0), 0);
	git_repository_free(repo);
	assert_int_equal(plocal_sandbox_open(&e->p, "t", e->dir, &e->sb), 0);
	e->ops = e->sb->ops;
	seen_reset();
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	sbx_sandbox_free(e->sb);
	th_rmrf(e->dir);
	free(e->dir);
	free(e);
	git_libgit2_shutdown();
	return 0;
}

/* Two buffers in turn, so that rename(path_in(a), path_in(b)) works. */
static char *path_in(struct env *e, const char *name)
{
	static char buf[2][4096];
	static int which;

	which ^= 1;
	snprintf(buf[which], sizeof(buf[which]), "%s/%s", e->dir, name);
	return buf[which];
}

static void test_create_write_read(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb), *n = NULL, *n2 = NULL;
	struct sbx_open_result res;
	struct stat st, st2;
	char buf[16] = {0};

	assert_int_equal(e->ops->create(e->sb, root, "f", 0640,
					O_RDWR | O_EXCL, &n, &st, &res), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0640);
	assert_int_equal(e->ops->write(e->sb, res.fh, "hello", 5, 0), 5);
	assert_int_equal(e->ops->read(e->sb, res.fh, buf, sizeof(buf), 1), 4);
	assert_string_equal(buf, "ello");
	assert_int_equal(e->ops->release(e->sb, res.fh), 0);

	/* O_EXCL on an existing name fails; the file is untouched. */
	assert_int_equal(e->ops->create(e->sb, root, "f", 0600,
					O_RDWR | O_EXCL, &n2, &st2, &res),
			 -EEXIST);
	assert_int_equal(e->ops->lookup(e->sb, root, "f", &n2, &st2), 0);
	assert_int_equal(st2.st_ino, st.st_ino);
	assert_int_equal(st2.st_size, 5);
	e->ops->forget(e->sb, n2);
	e->ops->forget(e->sb, n);

	assert_int_equal(e->ops->lookup(e->sb, root, "missing", &n2, &st2),
			 -ENOENT);
	assert_null(n2);
}

static void test_lookup_dotdot_stays_inside(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb), *n = NULL;
	struct stat st, rst;

	assert_int_equal(e->ops->getattr(e->sb, root, NULL, &rst), 0);
	assert_int_equal(e->ops->lookup(e->sb, root, "..", &n, &st), 0);
	assert_int_equal(st.st_ino, rst.st_ino);
	e->ops->forget(e->sb, n);
}

struct names {
	struct sbx_sandbox *sb;
	int count, dots, with_node;
	bool has_a, has_b;
};

static int collect(const char *name, const struct stat *st,
		   struct sbx_node *node, off_t next, void *payload)
{
	struct names *ns = payload;

	ns->count++;
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
		ns->dots++;
		assert_null(node);
	}
	if (strcmp(name, "a") == 0) {
		ns->has_a = true;
		assert_true(S_ISDIR(st->st_mode));
	}
	if (strcmp(name, "b") == 0)
		ns->has_b = true;
	if (node) {
		ns->with_node++;
		ns->sb->ops->forget(ns->sb, node); /* we took it */
	}
	return 0;
}

static void test_readdir_plus(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb), *n;
	struct sbx_file *dh;
	struct names ns = {.sb = e->sb};
	struct stat st;

	assert_int_equal(e->ops->mkdir(e->sb, root, "a", 0755, &n, &st), 0);
	e->ops->forget(e->sb, n);
	th_write(path_in(e, "b"), "b");
	assert_int_equal(e->ops->opendir(e->sb, root, &dh), 0);
	assert_int_equal(e->ops->readdir(e->sb, dh, 0, SBX_READDIR_PLUS,
					 collect, &ns),
			 0);
	assert_int_equal(e->ops->releasedir(e->sb, dh), 0);
	assert_true(ns.has_a && ns.has_b);
	assert_int_equal(ns.dots, 2);
	/* ".git", "a", "b" each came with a node. */
	assert_int_equal(ns.with_node, 3);
}

static int stop_after_one(const char *name, const struct stat *st,
			  struct sbx_node *node, off_t next, void *payload)
{
	int *count = payload;

	if (*count == 1)
		return 1; /* buffer full */
	(*count)++;
	return 0;
}

static void test_readdir_resume(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb);
	struct sbx_file *dh;
	int total = 0;

	for (int i = 0; i < 50; i++) {
		char name[16];

		snprintf(name, sizeof(name), "f%02d", i);
		th_write(path_in(e, name), "x");
	}
	assert_int_equal(e->ops->opendir(e->sb, root, &dh), 0);
	/* One entry per call, resuming where the last refusal left off. */
	for (int guard = 0; guard < 200; guard++) {
		int got = 0;

		assert_int_equal(e->ops->readdir(e->sb, dh,
						 ((struct plocal_file *)dh)
							 ->dir_off,
						 0, stop_after_one, &got),
				 0);
		if (got == 0)
			break;
		total += got;
	}
	assert_int_equal(e->ops->releasedir(e->sb, dh), 0);
	/* 50 files, .git, "." and "..". */
	assert_int_equal(total, 53);
}

static void test_rename_flags(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb);
	char buf[8] = {0};
	FILE *f;

	th_write(path_in(e, "x"), "X");
	th_write(path_in(e, "y"), "Y");
	assert_int_equal(e->ops->rename(e->sb, root, "x", root, "y",
					RENAME_NOREPLACE),
			 -EEXIST);
	assert_int_equal(e->ops->rename(e->sb, root, "x", root, "y",
					RENAME_EXCHANGE),
			 0);
	f = fopen(path_in(e, "x"), "r");
	assert_non_null(f);
	assert_non_null(fgets(buf, sizeof(buf), f));
	fclose(f);
	assert_string_equal(buf, "Y");
	assert_int_equal(e->ops->rename(e->sb, root, "x", root, "z", 0), 0);
	assert_int_equal(access(path_in(e, "x"), F_OK), -1);
}

static void test_node_path_and_xattr(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb), *n;
	struct stat st;
	char *p = NULL, want[4096], val[8];

	th_write(path_in(e, "p"), "p");
	assert_int_equal(e->ops->lookup(e->sb, root, "p", &n, &st), 0);
	assert_int_equal(e->ops->node_path(e->sb, n, &p), 0);
	snprintf(want, sizeof(want), "%s/p", e->sb->workdir);
	assert_string_equal(p, want);
	free(p);
	if (e->ops->setxattr(e->sb, n, "user.k", "v", 1, 0) == 0) {
		assert_int_equal(e->ops->getxattr(e->sb, n, "user.k", val,
						  sizeof(val)),
				 1);
		assert_int_equal(val[0], 'v');
	}
	e->ops->forget(e->sb, n);
}

static void test_watch_external_changes(void **state)
{
	struct env *e = *state;

	assert_int_equal(e->ops->watch_start(e->sb, on_change, NULL), 0);
	th_write(path_in(e, "ext"), "1");
	assert_int_equal(mkdir(path_in(e, "newdir"), 0755), 0);
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_true(seen_count(SBX_CHANGE_ENTRY, "ext") >= 1);
	assert_true(seen_count(SBX_CHANGE_ENTRY, "newdir") >= 1);

	/* A file in a directory created after the watch started. */
	seen_reset();
	th_write(path_in(e, "newdir/inner"), "2");
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_true(seen_count(SBX_CHANGE_ENTRY, "inner") >= 1);

	/* Content change of an existing file. */
	seen_reset();
	th_write(path_in(e, "ext"), "changed");
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_true(seen_count(SBX_CHANGE_DATA, NULL) >= 1);

	/* After a directory rename, events beneath it still arrive. */
	assert_int_equal(rename(path_in(e, "newdir"), path_in(e, "moved")),
			 0);
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	seen_reset();
	th_write(path_in(e, "moved/inner2"), "3");
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_true(seen_count(SBX_CHANGE_ENTRY, "inner2") >= 1);
	e->ops->watch_stop(e->sb);
}

static void test_watch_own_changes_not_reported(void **state)
{
	struct env *e = *state;
	struct sbx_node *root = e->ops->root(e->sb), *n;
	struct sbx_open_result res;
	struct stat st;

	assert_int_equal(e->ops->watch_start(e->sb, on_change, NULL), 0);
	assert_int_equal(e->ops->create(e->sb, root, "own", 0644,
					O_WRONLY, &n, &st, &res),
			 0);
	e->ops->release(e->sb, res.fh);
	e->ops->forget(e->sb, n);
	assert_int_equal(e->ops->mkdir(e->sb, root, "owndir", 0755, &n, &st),
			 0);
	e->ops->forget(e->sb, n);
	assert_int_equal(e->ops->rename(e->sb, root, "own", root, "own2", 0),
			 0);
	assert_int_equal(e->ops->unlink(e->sb, root, "own2"), 0);
	assert_int_equal(e->ops->rmdir(e->sb, root, "owndir"), 0);
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_int_equal(seen_count(SBX_CHANGE_ENTRY, "own"), 0);
	assert_int_equal(seen_count(SBX_CHANGE_ENTRY, "own2"), 0);
	assert_int_equal(seen_count(SBX_CHANGE_ENTRY, "owndir"), 0);

	/* A failed call leaves no expectation behind: a later change by
	 * someone else to the same name is reported. */
	th_write(path_in(e, "taken"), "x");
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	seen_reset();
	assert_int_equal(e->ops->mkdir(e->sb, root, "taken", 0755, &n, &st),
			 -EEXIST);
	assert_int_equal(unlink(path_in(e, "taken")), 0);
	assert_int_equal(e->ops->watch_sync(e->sb), 0);
	assert_int_equal(seen_count(SBX_CHANGE_ENTRY, "taken"), 1);
	e->ops->watch_stop(e->sb);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_create_write_read, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_lookup_dotdot_stays_inside,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_readdir_plus, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_readdir_resume, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_rename_flags, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_node_path_and_xattr, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_watch_external_changes,
						setup, teardown),
		cmocka_unit_test_setup_teardown(
			test_watch_own_changes_not_reported, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
