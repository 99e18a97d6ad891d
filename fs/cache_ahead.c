/*
 * Look-ahead prefetch of file contents; see cache_i.h and docs/design.md
 * ("Scale").
 *
 * The bulk walk brings the metadata of a whole tree but content only up to
 * PREFETCH_MAX_TOTAL.  A cold `grep -r` of a larger tree would then pay one
 * round trip per remaining file.  Instead, the first read that misses such
 * a content starts a *plan*: the files that a depth-first walk in listing
 * order (fts's order, the one `grep -r` and `find` follow) reaches from
 * that file on.  The plan is cut into requests of up to AHEAD_REQ_BYTES
 * (one bulk call each with the list of paths, POST /v1/fs/bulk), planned
 * as long as what is planned or in flight plus what was fetched but not
 * read yet stays under AHEAD_WINDOW, and sent by AHEAD_WORKERS threads (so
 * that many are in flight at once).  A read
 * of a file whose request is out waits for that request instead of asking
 * on its own.  A read that misses a file no request covers starts a new
 * plan there (the reader went elsewhere).
 *
 * Correctness is the bulk walk's: a request during which a change event
 * arrived keeps nothing, and content is kept only with the attributes the
 * agent read it under, when they are still the node's attributes.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

struct ahead_job {
	struct ahead_job *next;
	struct cnode **nodes;
	char **paths;
	size_t n;
	size_t bytes;
	size_t pos;           /* where the next answer is looked for */
	unsigned long gen;    /* c->events when the request went out */
	unsigned plan;
};

struct ahead {
	pthread_t th[AHEAD_WORKERS];
	int nth;
	pthread_cond_t cond;  /* workers: a job queued or room in the window */
	struct ahead_job *queue, **qtail; /* planned, not sent yet */
	unsigned nqueued;
	/* The plan: the walk continues after `cursor` (NULL: no plan). */
	struct cnode *cursor;
	unsigned plan;        /* current plan's number, from 1 */
	size_t inflight;      /* content bytes of requests out */
	size_t unread;        /* fetched by the current plan, not read yet */
	bool disabled;        /* the wrapped sandbox cannot (ENOSYS) */
	bool stopping;
};

/* ---- the walk ------------------------------------------------------------ */

static struct cnode *first_kid(struct cnode *dir)
{
	struct sbx_hashmap_iter it;
	struct cnode *k;

	tree_for_each_kid(k, it, dir)
		return k;
	return NULL;
}

/* The kid of dir that the listing shows after x (listing order). */
static struct cnode *kid_after(struct cnode *dir, struct cnode *x)
{
	struct sbx_hashmap_iter it;
	struct cnode *k;
	bool seen = false;

	tree_for_each_kid(k, it, dir) {
		if (seen)
			return k;
		seen = k == x;
	}
	return NULL;
}

/*
 * The node after x in a depth-first walk of the tree in listing order
 * (entering x's own directory first when `enter`); NULL past the end.
 * Listings are snapshots of the kids' hash order (snapshot_listing), so
 * this is the order in which the kernel's readdir showed them.
 */
static struct cnode *walk_next(struct cnode *x, bool enter)
{
	struct cnode *k;

	if (enter && x->st_valid && S_ISDIR(x->st.st_mode) &&
	    (k = first_kid(x)))
		return k;
	for (; x->parent; x = x->parent)
		if ((k = kid_after(x->parent, x)))
			return k;
	return NULL;
}

/* Is n a file whose content a request should bring? */
static bool wanted(const struct cnode *n)
{
	return n->slot == S_PRESENT && n->st_valid && !n->orphan &&
	       !n->hidden && !n->dirty && !n->ahead &&
	       S_ISREG(n->st.st_mode) &&
	       n->st.st_size <= (off_t)CACHE_WHOLE_FILE && !content_valid(n);
}

static void job_add(struct ahead_job *j, struct cnode *n, size_t *cap)
{
	if (j->n == *cap) {
		*cap = *cap ? *cap * 2 : 64;
		j->nodes = sbx_xrealloc(j->nodes, *cap * sizeof(*j->nodes));
		j->paths = sbx_xrealloc(j->paths, *cap * sizeof(*j->paths));
	}
	j->nodes[j->n] = n;
	j->paths[j->n] = tree_path(n);
	n->ahead = true;
	j->bytes += (size_t)n->st.st_size;
	j->n++;
}

/*
 * The next request of the plan: `first` (when not NULL), then the files
 * the walk reaches after it or after the cursor, up to AHEAD_REQ_BYTES and
 * AHEAD_REQ_FILES.  NULL when the walk is over.  c->lock held.
 */
static struct ahead_job *plan_next(struct cache *c, struct cnode *first)
{
	struct ahead *a = c->ahead;
	struct ahead_job *j = sbx_xcalloc(1, sizeof(*j));
	struct cnode *x = first ? first : a->cursor, *nx;
	size_t cap = 0;

	if (first)
		job_add(j, first, &cap);
	while (x && j->n < AHEAD_REQ_FILES) {
		nx = walk_next(x, true);
		if (nx && wanted(nx)) {
			if (j->n &&
			    j->bytes + (size_t)nx->st.st_size > AHEAD_REQ_BYTES)
				break; /* the next request starts with it */
			job_add(j, nx, &cap);
		}
		x = nx;
	}
	a->cursor = x;
	if (!j->n) {
		free(j);
		return NULL;
	}
	j->gen = c->events;
	j->plan = a->plan;
	a->inflight += j->bytes;
	return j;
}

static void job_free(struct ahead_job *j)
{
	for (size_t i = 0; i < j->n; i++)
		free(j->paths[i]);
	free(j->paths);
	free(j->nodes);
	free(j);
}

/* ---- the requests -------------------------------------------------------- */

struct job_ctx {
	struct cache *c;
	struct ahead_job *j;
};

static bool same_file(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_size == b->st_size &&
	       a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	       a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static int job_item(const struct sbx_bulk_item *it, void *payload)
{
	struct job_ctx *x = payload;
	struct cache *c = x->c;
	struct ahead_job *j = x->j;
	struct cnode *n = NULL;

	if (it->kind != SBX_BULK_FILE)
		return 0;
	/* Answers come in the order asked, some left out. */
	while (j->pos < j->n && strcmp(j->paths[j->pos], it->path) != 0)
		j->pos++;
	if (j->pos == j->n)
		return 0;
	n = j->nodes[j->pos++];
	cache_lock(c);
	/*
	 * As for the bulk walk: after a change event during the request the
	 * content may predate it; and it is kept only under the attributes
	 * the agent read it with, when they are still the node's.
	 */
	if (j->gen == c->events && n->ahead && n->st_valid &&
	    !n->dirty && !n->orphan && it->len == (size_t)it->st.st_size &&
	    same_file(&n->st, &it->st) && !content_valid(n)) {
		content_store(c, n, it->data, it->len, &it->st);
		if (n->content && j->plan == c->ahead->plan) {
			n->content->ahead_plan = j->plan;
			c->ahead->unread += it->len;
		}
	}
	cache_unlock(c);
	return 0;
}

/* Send one request (no lock held), then wake whoever waits for its files. */
static void job_run(struct cache *c, struct ahead_job *j)
{
	struct sbx_bulk_opts o = {
		.max_file = CACHE_WHOLE_FILE, .max_total = j->bytes + 1,
		.depth = -1, .files = (const char *const *)j->paths,
		.nfiles = j->n,
	};
	struct job_ctx x = {c, j};
	int rc = c->inner->ops->bulk(c->inner, "", &o, job_item, &x);

	cache_lock(c);
	if (rc < 0) {
		sbx_debug("look-ahead of %zu files failed: %s", j->n,
			  sbx_error_last()->msg);
		if (rc == -ENOSYS)
			c->ahead->disabled = true;
		sbx_error_clear();
	}
	for (size_t i = 0; i < j->n; i++)
		j->nodes[i]->ahead = false;
	c->ahead->inflight -= j->bytes;
	pthread_cond_broadcast(&c->cond);
	cache_unlock(c);
	job_free(j);
}

/* Room for another request of the plan?  c->lock held. */
static bool room(const struct ahead *a)
{
	return a->cursor && !a->disabled &&
	       a->inflight + a->unread < AHEAD_WINDOW;
}

static void enqueue(struct ahead *a, struct ahead_job *j, bool first)
{
	if (first) {
		j->next = a->queue;
		a->queue = j;
		if (a->qtail == &a->queue)
			a->qtail = &j->next;
	} else {
		j->next = NULL;
		*a->qtail = j;
		a->qtail = &j->next;
	}
	a->nqueued++;
	pthread_cond_signal(&a->cond);
}

/*
 * Plan the next requests while the window has room, keeping one queued per
 * worker.  Planning happens here, under c->lock, at once: a reader that
 * reaches a file finds its request already planned.  c->lock held.
 */
static void fill(struct cache *c)
{
	struct ahead *a = c->ahead;
	struct ahead_job *j;

	while (room(a) && a->nqueued < AHEAD_WORKERS &&
	       (j = plan_next(c, NULL)))
		enqueue(a, j, false);
}

static void *worker_main(void *arg)
{
	struct cache *c = arg;
	struct ahead *a = c->ahead;

	cache_lock(c);
	for (;;) {
		struct ahead_job *j = NULL;

		while (!a->stopping && !a->queue)
			pthread_cond_wait(&a->cond, &c->lock);
		if (a->stopping)
			break;
		j = a->queue;
		a->queue = j->next;
		if (!a->queue)
			a->qtail = &a->queue;
		a->nqueued--;
		fill(c);
		cache_unlock(c);
		job_run(c, j);
		cache_lock(c);
		fill(c);
	}
	cache_unlock(c);
	return NULL;
}

/* ---- entry points -------------------------------------------------------- */

static bool ahead_start(struct cache *c)
{
	struct ahead *a;

	if (c->ahead)
		return !c->ahead->disabled;
	a = sbx_xcalloc(1, sizeof(*a));
	a->qtail = &a->queue;
	pthread_cond_init(&a->cond, NULL);
	c->ahead = a;
	for (int i = 0; i < AHEAD_WORKERS; i++) {
		if (pthread_create(&a->th[a->nth], NULL, worker_main, c) != 0)
			break;
		a->nth++;
	}
	if (!a->nth)
		a->disabled = true;
	return !a->disabled;
}

bool ahead_wait(struct cache *c, struct cnode *n)
{
	struct ahead *a;
	struct ahead_job *j;

	if (!c->inner->ops->bulk || !ahead_start(c))
		return false;
	a = c->ahead;
	if (!n->ahead) {
		if (!wanted(n))
			return false;
		/* A new plan from here; what the old one fetched and this
		 * reader did not want no longer holds the window. */
		a->plan++;
		a->unread = 0;
		a->cursor = NULL;
		j = plan_next(c, n);
		enqueue(a, j, true);
		fill(c);
	}
	while (n->ahead)
		pthread_cond_wait(&c->cond, &c->lock);
	return true;
}

void ahead_consumed(struct cache *c, struct content *ct)
{
	struct ahead *a = c->ahead;

	if (!ct->ahead_plan)
		return;
	if (a && ct->ahead_plan == a->plan) {
		a->unread -= a->unread < ct->len ? a->unread : ct->len;
		fill(c);
	}
	ct->ahead_plan = 0;
}

void ahead_stop(struct cache *c)
{
	struct ahead *a = c->ahead;

	if (!a)
		return;
	cache_lock(c);
	a->stopping = true;
	pthread_cond_broadcast(&a->cond);
	cache_unlock(c);
	for (int i = 0; i < a->nth; i++)
		pthread_join(a->th[i], NULL);
	while (a->queue) {
		struct ahead_job *j = a->queue;

		a->queue = j->next;
		for (size_t i = 0; i < j->n; i++)
			j->nodes[i]->ahead = false;
		job_free(j);
	}
	pthread_cond_destroy(&a->cond);
	free(a);
	c->ahead = NULL;
}
