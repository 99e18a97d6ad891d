/*
 * Look-ahead prefetch of file contents; see cache_i.h and docs/design.md
 * ("Scale").
 *
 * The bulk walk brings the metadata of a whole tree but content only up to
 * PREFETCH_MAX_TOTAL.  A cold `grep -r` of a larger tree would then pay one
 * round trip per remaining file.  Instead, the first read that misses such
 * a content starts a *plan*: the files that a depth-first walk in listing
 * order (fts's order, the one `grep -r` and `find` follow) reaches from
 * that file on.  The plan is cut into requests (one bulk call each with
 * the list of paths, POST /v1/fs/bulk).  The first, which the reader
 * waits for, carries up to AHEAD_FIRST_BYTES; once the reader shows it
 * follows the plan, the next ones double up to AHEAD_REQ_BYTES and are
 * planned as long as what is planned or in flight plus what was fetched
 * but not read yet stays under AHEAD_WINDOW, and sent by AHEAD_WORKERS
 * threads (so that many are in flight at once).  A read of a file whose
 * request is out waits for that request instead of asking on its own.  A
 * read that misses a file no request covers starts a new plan there (the
 * reader went elsewhere).  There is one plan at a time: walkers reading
 * several places at once (ripgrep's threads) restart it more often, and
 * pay more round trips, never wrong content.
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
	/*
	 * The plan: a depth-first walk, one frame per directory entered
	 * (its kids in listing order, taken when entered, and the next
	 * one's index); `pending` is a file the last request had no room
	 * for.  No frame and no pending file: no plan.
	 */
	struct frame *stack;
	size_t depth, cap;
	struct cnode *pending;
	size_t req_bytes;     /* the next request's size, growing */
	bool confirmed;       /* the reader follows the plan */
	struct cnode *origin; /* the file a reader waits for: not ahead */
	unsigned plan;        /* current plan's number, from 1 */
	size_t inflight;      /* content bytes of requests out */
	size_t unread;        /* fetched by the current plan, not read yet */
	bool disabled;        /* the wrapped sandbox cannot (ENOSYS) */
	bool stopping;
};

/* ---- the walk ------------------------------------------------------------ */

struct frame {
	struct cnode **kids;  /* nodes live as long as the cache */
	size_t n, next;
};

/* Enter dir: a frame with its kids in listing order. */
static void push_frame(struct ahead *a, struct cnode *dir)
{
	size_t cap = sbx_hashmap_count(&dir->kids), n = 0;
	struct sbx_hashmap_iter it;
	struct frame *f;
	struct cnode *k;

	if (a->depth == a->cap) {
		a->cap = a->cap ? a->cap * 2 : 16;
		a->stack = sbx_xrealloc(a->stack, a->cap * sizeof(*a->stack));
	}
	f = &a->stack[a->depth++];
	f->kids = sbx_xcalloc(cap ? cap : 1, sizeof(*f->kids));
	tree_for_each_kid(k, it, dir)
		if (n < cap)
			f->kids[n++] = k;
	f->n = n;
	f->next = 0;
}

static void pop_frame(struct ahead *a)
{
	free(a->stack[--a->depth].kids);
}

static void plan_clear(struct ahead *a)
{
	while (a->depth)
		pop_frame(a);
	a->pending = NULL;
}

static bool walk_enters(const struct cnode *k)
{
	return k->slot == S_PRESENT && k->st_valid && S_ISDIR(k->st.st_mode);
}

/*
 * The next node of the walk, NULL at its end.  The order is fts's (grep
 * -r, find): depth first, each directory's entries in listing order,
 * which is the kids' hash order (snapshot_listing), the order readdir
 * showed the kernel.
 */
static struct cnode *walk_next(struct ahead *a)
{
	while (a->depth) {
		struct frame *f = &a->stack[a->depth - 1];

		if (f->next < f->n) {
			struct cnode *k = f->kids[f->next++];

			if (walk_enters(k))
				push_frame(a, k);
			return k;
		}
		pop_frame(a);
	}
	return NULL;
}

/* A new plan: the walk goes on after n (the frames of n's ancestors). */
static void walk_from(struct ahead *a, struct cnode *n)
{
	struct cnode *up[256];
	size_t nup = 0;

	plan_clear(a);
	for (struct cnode *x = n; x->parent && nup < 256; x = x->parent)
		up[nup++] = x;
	/* up[nup - 1] is a kid of the root; deeper than 256: from there. */
	for (struct cnode *dir = up[nup - 1]->parent; nup > 0; nup--) {
		struct cnode *x = up[nup - 1];
		struct frame *f;

		push_frame(a, dir);
		f = &a->stack[a->depth - 1];
		f->next = f->n;
		for (size_t i = 0; i < f->n; i++)
			if (f->kids[i] == x) {
				f->next = i + 1;
				break;
			}
		dir = x;
	}
}

/* Is n a file whose content a request should bring? */
static bool wanted(const struct cnode *n)
{
	return n->slot == S_PRESENT && n->st_valid && !n->orphan &&
	       !n->hidden && !tree_file_dirty(n) && !n->ahead &&
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
 * The next request of the plan: `first` (when not NULL: a new plan from
 * it), then the files the walk reaches, up to AHEAD_REQ_BYTES and
 * AHEAD_REQ_FILES.  NULL when the walk is over.  c->lock held.
 */
static struct ahead_job *plan_next(struct cache *c, struct cnode *first)
{
	struct ahead *a = c->ahead;
	struct ahead_job *j = sbx_xcalloc(1, sizeof(*j));
	struct cnode *x;
	size_t cap = 0;

	if (first) {
		walk_from(a, first);
		job_add(j, first, &cap);
		a->req_bytes = AHEAD_FIRST_BYTES;
	} else if (a->req_bytes < AHEAD_REQ_BYTES) {
		a->req_bytes *= 2;
		if (a->req_bytes > AHEAD_REQ_BYTES)
			a->req_bytes = AHEAD_REQ_BYTES;
	}
	while (j->n < AHEAD_REQ_FILES) {
		x = a->pending ? a->pending : walk_next(a);
		a->pending = NULL;
		if (!x)
			break;
		if (!wanted(x))
			continue;
		if (j->n &&
		    j->bytes + (size_t)x->st.st_size > a->req_bytes) {
			a->pending = x; /* the next request starts with it */
			break;
		}
		job_add(j, x, &cap);
	}
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
	    !tree_file_dirty(n) && !n->orphan &&
	    it->len == (size_t)it->st.st_size &&
	    same_file(&n->st, &it->st) && !content_valid(n)) {
		content_store(c, n, it->data, it->len, &it->st);
		/* Its reader waits for it: reading it confirms nothing. */
		if (n->content && j->plan == c->ahead->plan &&
		    n != c->ahead->origin) {
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
	bool off;
	int rc = 0;

	cache_lock(c);
	off = c->ahead->disabled; /* planned before an ENOSYS came back */
	cache_unlock(c);
	if (!off) {
		touch_drain(c); /* its attributes must be after the touches */
		rc = c->inner->ops->bulk(c->inner, "", &o, job_item, &x);
	}
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
	return (a->depth || a->pending) && !a->disabled &&
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

	while (a->confirmed && room(a) && a->nqueued < AHEAD_WORKERS &&
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
	if (!n->ahead && a->pending == n) {
		/* The file the plan's last request had no room for: the
		 * reader follows the plan. */
		a->confirmed = true;
		a->origin = n;
		if ((j = plan_next(c, NULL)))
			enqueue(a, j, true);
		fill(c);
	}
	if (!n->ahead) {
		if (!wanted(n))
			return false;
		/* A new plan from here; what the old one fetched and this
		 * reader did not want no longer holds the window. */
		a->plan++;
		a->unread = 0;
		a->confirmed = false;
		a->origin = n;
		j = plan_next(c, n);
		enqueue(a, j, true);
	}
	while (n->ahead)
		pthread_cond_wait(&c->cond, &c->lock);
	return true;
}

void ahead_consumed(struct cache *c, struct content *ct, bool read)
{
	struct ahead *a = c->ahead;

	if (!ct->ahead_plan)
		return;
	if (a && ct->ahead_plan == a->plan) {
		a->unread -= a->unread < ct->len ? a->unread : ct->len;
		if (read)
			a->confirmed = true;
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
	plan_clear(a);
	free(a->stack);
	pthread_cond_destroy(&a->cond);
	free(a);
	c->ahead = NULL;
}
