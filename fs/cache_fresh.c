/*
 * Git objects made in the sandbox, fetched before they are asked for; see
 * cache_i.h and docs/design.md ("Objects made in the sandbox").
 *
 * A loose object that a command in the sandbox writes (a commit, `git
 * add`, the objects a fetch or an agent's work leaves) reaches us as an
 * entry event: its name becomes UNKNOWN and its directory's attributes
 * invalid.  Its first reader through the mount (a checkout here, `git log
 * -p`, `git show`) then pays three round trips in a row for it: the
 * directory's attributes (the kernel checks search permission on
 * objects/XX), the object's, and its content.  Objects never change and
 * are named by their hash, and what was just written is what is read
 * next.  So the fan-out directories (objects/XX) that such events name are
 * noted (and `objects` itself when a fan-out directory is new), and once
 * the change stream has been quiet for FRESH_QUIET seconds (the command
 * is done writing), FRESH_WORKERS threads walk them: one bulk walk of
 * depth 0 each, which brings the directory's attributes, its complete
 * listing and the content of its files up to FRESH_DIR_BYTES.
 * The records are kept under the bulk walk's rule (list_walk: nothing of a
 * walk during which a change arrived); a walk that raced with a change is
 * tried again after the next quiet period, FRESH_TRIES times in all.
 *
 * Bounds: only directories of an `objects` directory the tree has listed
 * (someone looked into that repository through the mount); at most
 * FRESH_MAX_DIRS waiting, the others dropped (their readers ask as
 * before); a stream that never quiets is waited for at most
 * FRESH_MAX_WAIT seconds, then the walks go out anyway (and keep what no
 * change raced).
 *
 * Locking: the queue is c->lock's; the workers hold nothing while they
 * walk (list_walk takes c->lock itself).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

struct fresh_dir {
	char *path;           /* objects/XX, relative to the root */
	unsigned tries;       /* walks done */
};

struct fresh {
	pthread_t th[FRESH_WORKERS];
	int nth;
	pthread_cond_t cond;  /* a directory queued, or stopping */
	struct fresh_dir *q;  /* waiting directories, oldest first */
	size_t n, cap;
	double wait_since;    /* when the oldest waiting one was queued */
	unsigned long gen;    /* c->events when last seen moving ... */
	double gen_time;      /* ... at this time */
	/* Stopping, or never to walk: no threads, or the sandbox has no
	 * bulk walk (the workers end on -ENOSYS). */
	bool stopping;
	unsigned walking;     /* walks out now */
	unsigned long walks;  /* walks ended */
};

static bool hex_run(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (!((s[i] >= '0' && s[i] <= '9') ||
		      (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* Does path[0..len) end with "objects/XX" (at its start or after '/')? */
static bool is_fanout(const char *path, size_t len)
{
	return len >= 10 && hex_run(path + len - 2, 2) &&
	       memcmp(path + len - 10, "objects/", 8) == 0 &&
	       (len == 10 || path[len - 11] == '/');
}

/*
 * The directory to walk for an entry event on `path`, as the length of
 * its prefix: a loose git object ("…objects/XX/" and 38 hex digits, 62
 * for SHA-256) names its fan-out directory objects/XX; a fan-out
 * directory (a new one) names `objects`.  0 for anything else.
 */
static size_t walk_len(const char *path)
{
	const char *base = strrchr(path, '/');
	size_t blen, dlen;

	if (!base)
		return 0;
	blen = strlen(base + 1);
	dlen = (size_t)(base - path);
	if ((blen == 38 || blen == 62) && hex_run(base + 1, blen) &&
	    is_fanout(path, dlen))
		return dlen;
	if (is_fanout(path, dlen + 1 + blen))
		return dlen;
	return 0;
}

static void *worker_main(void *arg);

/* Start the workers once; false when there are none.  c->lock held. */
static bool fresh_start(struct cache *c)
{
	struct fresh *f;

	if (c->fresh)
		return !c->fresh->stopping;
	if (!c->inner->ops->bulk)
		return false;
	f = sbx_xcalloc(1, sizeof(*f));
	cache_cond_init_monotonic(&f->cond);
	c->fresh = f;
	for (int i = 0; i < FRESH_WORKERS; i++) {
		if (pthread_create(&f->th[f->nth], NULL, worker_main, c) != 0)
			break;
		f->nth++;
	}
	if (!f->nth)
		f->stopping = true;
	return !f->stopping;
}

static bool queued(const struct fresh *f, const char *dir, size_t len)
{
	/* Events come in bursts per directory: the newest first. */
	for (size_t i = f->n; i-- > 0;)
		if (strlen(f->q[i].path) == len &&
		    memcmp(f->q[i].path, dir, len) == 0)
			return true;
	return false;
}

static void enqueue(struct fresh *f, char *dir, unsigned tries)
{
	if (f->n == f->cap) {
		f->cap = f->cap ? f->cap * 2 : 16;
		f->q = sbx_xrealloc(f->q, f->cap * sizeof(*f->q));
	}
	if (!f->n)
		f->wait_since = cache_now();
	f->q[f->n].path = dir;
	f->q[f->n].tries = tries;
	f->n++;
	pthread_cond_signal(&f->cond);
}

void fresh_note(struct cache *c, const char *path)
{
	size_t dlen = walk_len(path);
	struct fresh *f;
	struct cnode *n;
	char *objects;
	bool seen;

	if (!dlen)
		return;
	/* Events come in bursts: most name a directory already waiting. */
	if (c->fresh && (c->fresh->stopping || queued(c->fresh, path, dlen)))
		return;
	/* The repository's objects directory must be one the tree listed
	 * (an event alone makes an UNKNOWN node). */
	objects = sbx_xstrndup(path, is_fanout(path, dlen) ? dlen - 3 : dlen);
	n = tree_resolve(c, objects, false);
	seen = n && n->slot == S_PRESENT && (n->complete || n->prefetched);
	free(objects);
	if (!seen || !fresh_start(c))
		return;
	f = c->fresh;
	if (f->n >= FRESH_MAX_DIRS) {
		sbx_debug("new objects in '%.*s': not fetched ahead (%d "
			  "directories wait already)",
			  (int)dlen, path, FRESH_MAX_DIRS);
		return;
	}
	enqueue(f, sbx_xstrndup(path, dlen), 0);
}

/* ---- the workers --------------------------------------------------------- */

/*
 * Wait until the stream has been quiet for FRESH_QUIET (or the oldest
 * directory has waited FRESH_MAX_WAIT).  c->lock held.  False when the
 * queue emptied or the cache stops meanwhile.
 */
static bool wait_quiet(struct cache *c, struct fresh *f)
{
	for (;;) {
		struct timespec until;
		double now;

		if (f->stopping || !f->n)
			return false;
		now = cache_now();
		if (c->events != f->gen) {
			f->gen = c->events;
			f->gen_time = now;
		}
		if (now - f->gen_time >= FRESH_QUIET ||
		    now - f->wait_since >= FRESH_MAX_WAIT)
			return true;
		cache_deadline_in(&until, CLOCK_MONOTONIC,
				  (long)(FRESH_QUIET * 1000 / 2));
		pthread_cond_timedwait(&f->cond, &c->lock, &until);
	}
}

static void *worker_main(void *arg)
{
	struct cache *c = arg;
	struct fresh *f = c->fresh;

	cache_lock(c);
	for (;;) {
		struct fresh_dir d;
		struct sbx_bulk_opts o = {
			.max_file = FRESH_MAX_FILE,
			.max_total = FRESH_DIR_BYTES,
			.depth = 0,
		};
		int rc;

		while (!f->stopping && !f->n)
			pthread_cond_wait(&f->cond, &c->lock);
		if (f->stopping)
			break;
		if (!wait_quiet(c, f))
			continue;
		d = f->q[0];
		memmove(f->q, f->q + 1, --f->n * sizeof(*f->q));
		if (f->n)
			f->wait_since = cache_now();
		f->walking++;
		cache_unlock(c);
		rc = list_walk(c, d.path, &o);
		cache_lock(c);
		f->walking--;
		f->walks++;
		if (rc == -ENOSYS)
			f->stopping = true; /* no walks: the workers end */
		if (rc < 0) {
			sbx_debug("fetching the new objects of '%s' ahead: %s",
				  d.path, sbx_error_last()->msg);
			sbx_error_clear();
		}
		if (rc == 1 && ++d.tries < FRESH_TRIES && !f->stopping &&
		    !queued(f, d.path, strlen(d.path))) {
			/* A change raced the walk: after the next quiet. */
			enqueue(f, d.path, d.tries);
			d.path = NULL;
		}
		free(d.path);
	}
	cache_unlock(c);
	return NULL;
}

void fresh_stats(struct cache *c, struct fresh_stats *out)
{
	memset(out, 0, sizeof(*out));
	cache_lock(c);
	if (c->fresh) {
		out->waiting = c->fresh->n;
		out->walking = c->fresh->walking;
		out->walks = c->fresh->walks;
	}
	cache_unlock(c);
}

void fresh_stop(struct cache *c)
{
	struct fresh *f = c->fresh;

	if (!f)
		return;
	cache_lock(c);
	f->stopping = true;
	pthread_cond_broadcast(&f->cond);
	cache_unlock(c);
	for (int i = 0; i < f->nth; i++)
		pthread_join(f->th[i], NULL);
	for (size_t i = 0; i < f->n; i++)
		free(f->q[i].path);
	free(f->q);
	pthread_cond_destroy(&f->cond);
	free(f);
	c->fresh = NULL;
}
