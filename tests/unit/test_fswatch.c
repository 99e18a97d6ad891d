/* Unit tests: lib/fswatch.c (recursive inotify reported as paths). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/fswatch.h"
#include "test_helpers_i.h"

struct seen {
	pthread_mutex_t lock;
	char log[16384]; /* "kind:path\n" lines */
};

static void on_event(const struct sbx_fswatch_event *ev, void *payload)
{
	struct seen *s = payload;
	size_t n;

	pthread_mutex_lock(&s->lock);
	n = strlen(s->log);
	snprintf(s->log + n, sizeof(s->log) - n, "%d:%s\n", ev->kind,
		 ev->path ? ev->path : "(null)");
	pthread_mutex_unlock(&s->lock);
}

static bool saw(struct seen *s, int kind, const char *path)
{
	char line[512];
	bool found;

	snprintf(line, sizeof(line), "%d:%s\n", kind, path);
	pthread_mutex_lock(&s->lock);
	found = strstr(s->log, line) != NULL;
	pthread_mutex_unlock(&s->lock);
	return found;
}

static void clear(struct seen *s)
{
	pthread_mutex_lock(&s->lock);
	s->log[0] = '\0';
	pthread_mutex_unlock(&s->lock);
}

static void test_tree(void **state)
{
	char *dir = th_tmpdir();
	char p[4096];
	struct sbx_fswatch *w = NULL;
	struct seen s = { .lock = PTHREAD_MUTEX_INITIALIZER };

	assert_non_null(dir);
	snprintf(p, sizeof(p), "%s/pre", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(sbx_fswatch_new(&w, dir, on_event, &s), 0);

	/* a file in the root and in a directory that existed before */
	snprintf(p, sizeof(p), "%s/a", dir);
	th_write(p, "x");
	snprintf(p, sizeof(p), "%s/pre/b", dir);
	th_write(p, "y");
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "a"));
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "pre/b"));
	assert_true(saw(&s, SBX_FSWATCH_DATA, "pre/b"));

	/* a directory created later is watched too */
	clear(&s);
	snprintf(p, sizeof(p), "%s/new", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	snprintf(p, sizeof(p), "%s/new/c", dir);
	th_write(p, "z");
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "new"));
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "new/c"));

	/* a renamed directory keeps its watch under the new name */
	clear(&s);
	{
		char q[4096];

		snprintf(p, sizeof(p), "%s/new", dir);
		snprintf(q, sizeof(q), "%s/renamed", dir);
		assert_int_equal(rename(p, q), 0);
	}
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	snprintf(p, sizeof(p), "%s/renamed/d", dir);
	th_write(p, "w");
	assert_int_equal(chmod(p, 0600), 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "new"));
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "renamed"));
	assert_true(saw(&s, SBX_FSWATCH_ENTRY, "renamed/d"));
	assert_true(saw(&s, SBX_FSWATCH_ATTR, "renamed/d"));

	sbx_fswatch_free(w);
	sbx_fswatch_free(NULL);
	th_rmrf(dir);
	free(dir);
}

/* What the local provider relies on: identities, masks, batches, wake. */
struct ident {
	pthread_mutex_t lock;
	dev_t dir_dev;
	ino_t dir_ino;
	uint32_t create_mask; /* of the ENTRY "sub/f" */
	int scanned;          /* ENTRY events with mask 0 ("sub2/g") */
	int self_attr;        /* ATTR about "sub" itself (name NULL) */
	int batches;
	bool bad;             /* an event broke the header's promises */
};

static void on_ident(const struct sbx_fswatch_event *ev, void *payload)
{
	struct ident *x = payload;

	pthread_mutex_lock(&x->lock);
	if (ev->kind == SBX_FSWATCH_BATCH) {
		x->batches++;
		if (ev->path || ev->name || ev->mask)
			x->bad = true;
	} else if (ev->kind == SBX_FSWATCH_ENTRY && ev->path &&
		   !strcmp(ev->path, "sub/f")) {
		if (!ev->name || strcmp(ev->name, "f"))
			x->bad = true;
		x->dir_dev = ev->dir_dev;
		x->dir_ino = ev->dir_ino;
		x->create_mask |= ev->mask;
	} else if (ev->kind == SBX_FSWATCH_ENTRY && ev->path &&
		   !strcmp(ev->path, "sub2/g")) {
		if (ev->mask == 0)
			x->scanned++;
	} else if (ev->kind == SBX_FSWATCH_ATTR && ev->path &&
		   !strcmp(ev->path, "sub") && !ev->name) {
		x->self_attr++;
	}
	pthread_mutex_unlock(&x->lock);
}

static void test_identity_batch(void **state)
{
	char *dir = th_tmpdir();
	char p[4096], q[4200];
	struct sbx_fswatch *w = NULL;
	struct ident x = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct stat st;
	int before;

	assert_non_null(dir);
	snprintf(p, sizeof(p), "%s/sub", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(lstat(p, &st), 0);
	assert_int_equal(sbx_fswatch_new_flags(&w, dir, SBX_FSWATCH_F_BATCH,
					       on_ident, &x),
			 0);

	snprintf(p, sizeof(p), "%s/sub/f", dir);
	th_write(p, "x");
	snprintf(p, sizeof(p), "%s/sub", dir);
	assert_int_equal(chmod(p, 0700), 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	pthread_mutex_lock(&x.lock);
	assert_false(x.bad);
	assert_true(x.dir_dev == st.st_dev && x.dir_ino == st.st_ino);
	assert_true(x.create_mask & IN_CREATE);
	assert_true(x.self_attr >= 1);
	assert_true(x.batches >= 1);
	before = x.batches;
	pthread_mutex_unlock(&x.lock);

	/* A directory moved in is scanned: its entries come with mask 0. */
	snprintf(p, sizeof(p), "%s/../sbx-fswatch-outside-%d", dir,
		 (int)getpid());
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(q, sizeof(q), "%s/g", p);
	th_write(q, "y");
	snprintf(q, sizeof(q), "%s/sub2", dir);
	assert_int_equal(rename(p, q), 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	pthread_mutex_lock(&x.lock);
	assert_int_equal(x.scanned, 1);
	pthread_mutex_unlock(&x.lock);

	/* wake() runs a batch without any inotify event; sync sees it. */
	pthread_mutex_lock(&x.lock);
	before = x.batches;
	pthread_mutex_unlock(&x.lock);
	sbx_fswatch_wake(w);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	pthread_mutex_lock(&x.lock);
	assert_true(x.batches > before);
	assert_false(x.bad);
	pthread_mutex_unlock(&x.lock);

	sbx_fswatch_free(w);
	th_rmrf(dir);
	free(dir);
}

/* ENTRY events of IN_MOVED_TO say where the object came from. */
static void on_move(const struct sbx_fswatch_event *ev, void *payload)
{
	struct seen *s = payload;
	size_t n;

	if (ev->kind != SBX_FSWATCH_ENTRY)
		return;
	pthread_mutex_lock(&s->lock);
	n = strlen(s->log);
	snprintf(s->log + n, sizeof(s->log) - n, "%s<-%s\n", ev->path,
		 ev->from ? ev->from : "(null)");
	pthread_mutex_unlock(&s->lock);
}

static bool saw_move(struct seen *s, const char *path, const char *from)
{
	char line[512];
	bool found;

	snprintf(line, sizeof(line), "%s<-%s\n", path, from);
	pthread_mutex_lock(&s->lock);
	found = strstr(s->log, line) != NULL;
	pthread_mutex_unlock(&s->lock);
	return found;
}

static void test_moved_from(void **state)
{
	char *dir = th_tmpdir();
	char p[4096], q[4096], out[4096];
	struct sbx_fswatch *w = NULL;
	struct seen s = { .lock = PTHREAD_MUTEX_INITIALIZER };

	(void)state;
	assert_non_null(dir);
	snprintf(p, sizeof(p), "%s/d", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/log", dir);
	th_write(p, "x");
	snprintf(out, sizeof(out), "%s/../sbx-fswatch-out-%d", dir,
		 (int)getpid());
	th_write(out, "o");
	assert_int_equal(sbx_fswatch_new(&w, dir, on_move, &s), 0);

	/* A file renamed in its directory, then into another one. */
	snprintf(q, sizeof(q), "%s/log.1", dir);
	assert_int_equal(rename(p, q), 0);
	snprintf(p, sizeof(p), "%s/d/log.2", dir);
	assert_int_equal(rename(q, p), 0);
	/* A directory renamed. */
	snprintf(p, sizeof(p), "%s/d", dir);
	snprintf(q, sizeof(q), "%s/e", dir);
	assert_int_equal(rename(p, q), 0);
	/* A file moved in from outside the tree: no old name. */
	snprintf(p, sizeof(p), "%s/in", dir);
	assert_int_equal(rename(out, p), 0);
	/* A file moved out, then one created: not paired. */
	assert_int_equal(rename(p, out), 0);
	snprintf(q, sizeof(q), "%s/new", dir);
	th_write(q, "n");
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);

	/* (The old names' own events carry none.) */
	assert_true(saw_move(&s, "log", "(null)"));
	assert_true(saw_move(&s, "log.1", "log"));
	assert_true(saw_move(&s, "d/log.2", "log.1"));
	assert_true(saw_move(&s, "e", "d"));
	assert_true(saw_move(&s, "in", "(null)"));
	assert_true(saw_move(&s, "new", "(null)"));

	sbx_fswatch_free(w);
	unlink(out);
	th_rmrf(dir);
	free(dir);
}

/*
 * RENAME_EXCHANGE of two directories comes as two moves, each the other
 * way: the watches' paths must swap, not both go under one name (review:
 * a file renamed in d1's old directory was then reported under d1).
 */
static void test_exchange_swaps_paths(void **state)
{
	char *dir = th_tmpdir();
	char p[4096], q[4096];
	struct sbx_fswatch *w = NULL;
	struct seen s = { .lock = PTHREAD_MUTEX_INITIALIZER };

	(void)state;
	assert_non_null(dir);
	snprintf(p, sizeof(p), "%s/d1", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/d2", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/d1/f", dir);
	th_write(p, "x");
	snprintf(p, sizeof(p), "%s/d2/g", dir);
	th_write(p, "y");
	assert_int_equal(sbx_fswatch_new(&w, dir, on_move, &s), 0);
	snprintf(p, sizeof(p), "%s/d1", dir);
	snprintf(q, sizeof(q), "%s/d2", dir);
	assert_int_equal(renameat2(AT_FDCWD, p, AT_FDCWD, q, RENAME_EXCHANGE),
			 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw_move(&s, "d2", "d1"));
	assert_true(saw_move(&s, "d1", "d2"));
	/* f is now d2/f, g is d1/g. */
	snprintf(p, sizeof(p), "%s/d2/f", dir);
	snprintf(q, sizeof(q), "%s/d2/f2", dir);
	assert_int_equal(rename(p, q), 0);
	snprintf(p, sizeof(p), "%s/d1/g", dir);
	snprintf(q, sizeof(q), "%s/d1/g2", dir);
	assert_int_equal(rename(p, q), 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw_move(&s, "d2/f2", "d2/f"));
	assert_true(saw_move(&s, "d1/g2", "d1/g"));
	/* A plain rename after it renames one subtree again. */
	snprintf(p, sizeof(p), "%s/d1", dir);
	snprintf(q, sizeof(q), "%s/d3", dir);
	assert_int_equal(rename(p, q), 0);
	snprintf(p, sizeof(p), "%s/d3/g2", dir);
	snprintf(q, sizeof(q), "%s/d3/g3", dir);
	assert_int_equal(rename(p, q), 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw_move(&s, "d3/g3", "d3/g2"));

	sbx_fswatch_free(w);
	th_rmrf(dir);
	free(dir);
}

/* on_move, and the watcher thread held at the event of "gate" while
 * `hold`: the changes made meanwhile are read after all of them. */
struct gated {
	struct seen s;
	pthread_mutex_t m;
	pthread_cond_t c;
	bool hold, held;
};

static void on_move_gated(const struct sbx_fswatch_event *ev, void *payload)
{
	struct gated *g = payload;

	if (ev->kind == SBX_FSWATCH_ENTRY && ev->path &&
	    !strcmp(ev->path, "gate")) {
		pthread_mutex_lock(&g->m);
		g->held = true;
		pthread_cond_broadcast(&g->c);
		while (g->hold)
			pthread_cond_wait(&g->c, &g->m);
		pthread_mutex_unlock(&g->m);
	}
	on_move(ev, &g->s);
}

/* Hold the watcher (it waits at the event of a file "gate" made now). */
static void gate_hold(struct gated *g, const char *dir)
{
	char p[4096];

	pthread_mutex_lock(&g->m);
	g->hold = true;
	g->held = false;
	pthread_mutex_unlock(&g->m);
	snprintf(p, sizeof(p), "%s/gate", dir);
	th_write(p, "g");
	pthread_mutex_lock(&g->m);
	while (!g->held)
		pthread_cond_wait(&g->c, &g->m);
	pthread_mutex_unlock(&g->m);
}

static void gate_release(struct gated *g)
{
	pthread_mutex_lock(&g->m);
	g->hold = false;
	pthread_cond_broadcast(&g->c);
	pthread_mutex_unlock(&g->m);
}

#define GATED_INIT                                                             \
	{ .s.lock = PTHREAD_MUTEX_INITIALIZER, .m = PTHREAD_MUTEX_INITIALIZER, \
	  .c = PTHREAD_COND_INITIALIZER }

/*
 * Make the NULL-ended relative paths below dir, in order (ending in '/':
 * a directory, else a file), then watch dir through g's gate.
 */
static struct sbx_fswatch *gated_tree(const char *dir, struct gated *g, ...)
{
	struct sbx_fswatch *w = NULL;
	const char *rel;
	char p[4096];
	va_list ap;

	va_start(ap, g);
	while ((rel = va_arg(ap, const char *))) {
		size_t n = strlen(rel);

		snprintf(p, sizeof(p), "%s/%s", dir, rel);
		if (n && rel[n - 1] == '/')
			assert_int_equal(mkdir(p, 0755), 0);
		else
			th_write(p, "x");
	}
	va_end(ap);
	assert_int_equal(sbx_fswatch_new(&w, dir, on_move_gated, g), 0);
	return w;
}

static void dir_rename(const char *dir, const char *a, const char *b,
		       unsigned flags)
{
	char p[4096], q[4096];

	snprintf(p, sizeof(p), "%s/%s", dir, a);
	snprintf(q, sizeof(q), "%s/%s", dir, b);
	assert_int_equal(renameat2(AT_FDCWD, p, AT_FDCWD, q, flags), 0);
}

/*
 * An exchange whose events are read after one of the two directories has
 * moved on (d1 renamed to d3 at once): each subtree keeps its own path.
 * The first half used to look at the sandbox as it was when the events
 * were read, took the exchange for a plain rename, and put both subtrees
 * under one path for good (stress test: a file made in one directory was
 * reported in the other).
 */
static void test_exchange_read_after_a_later_rename(void **state)
{
	char *dir = th_tmpdir();
	struct gated g = GATED_INIT;
	struct sbx_fswatch *w;

	(void)state;
	assert_non_null(dir);
	w = gated_tree(dir, &g, "d1/", "d2/", "d1/f", "d2/g", NULL);
	gate_hold(&g, dir);
	dir_rename(dir, "d1", "d2", RENAME_EXCHANGE);
	dir_rename(dir, "d1", "d3", 0);
	gate_release(&g);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	/* f is d2/f now, g is d3/g. */
	dir_rename(dir, "d2/f", "d2/f2", 0);
	dir_rename(dir, "d3/g", "d3/g2", 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw_move(&g.s, "d2/f2", "d2/f"));
	assert_true(saw_move(&g.s, "d3/g2", "d3/g"));
	sbx_fswatch_free(w);
	th_rmrf(dir);
	free(dir);
}

/*
 * A directory renamed over an empty one and back at once, the events read
 * after both: not an exchange (the empty directory's link count says it
 * was replaced), the subtree is where it is.
 */
static void test_rename_over_empty_dir_and_back(void **state)
{
	char *dir = th_tmpdir();
	struct gated g = GATED_INIT;
	struct sbx_fswatch *w;

	(void)state;
	assert_non_null(dir);
	w = gated_tree(dir, &g, "a/", "b/", "a/x", NULL);
	gate_hold(&g, dir);
	dir_rename(dir, "a", "b", 0);
	dir_rename(dir, "b", "a", 0);
	gate_release(&g);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	dir_rename(dir, "a/x", "a/y", 0);
	assert_int_equal(sbx_fswatch_sync(w, 5000), 0);
	assert_true(saw_move(&g.s, "a/y", "a/x"));
	sbx_fswatch_free(w);
	th_rmrf(dir);
	free(dir);
}

static void test_bad_root(void **state)
{
	struct sbx_fswatch *w = (void *)1;
	struct seen s = { .lock = PTHREAD_MUTEX_INITIALIZER };

	assert_int_equal(sbx_fswatch_new(&w, "/nonexistent-sbx-test", on_event,
					 &s),
			 -ENOENT);
	assert_null(w);
	assert_int_equal(sbx_fswatch_new(&w, "/etc/hostname", on_event, &s),
			 -ENOTDIR);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tree),
		cmocka_unit_test(test_identity_batch),
		cmocka_unit_test(test_moved_from),
		cmocka_unit_test(test_exchange_swaps_paths),
		cmocka_unit_test(test_exchange_read_after_a_later_rename),
		cmocka_unit_test(test_rename_over_empty_dir_and_back),
		cmocka_unit_test(test_bad_root),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
