/*
 * Deferred touches: utime(path, NULL), futimens(fd, NULL) and the like
 * through the mount are answered from the tree and sent to the sandbox
 * later, many per request (the wrapped sandbox's setattr_many), by one
 * sender thread.  See docs/design.md, "Deferred touches", and cache_i.h
 * for the rules (what is deferred, the drain before other inner calls,
 * the lock order).
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbx/log.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

struct touch {
	pthread_mutex_t lock;   /* lock order 3 */
	pthread_cond_t cond;    /* queue grew, batch answered, stopping */
	pthread_t thread;
	bool running, stopping;
	/* Queued nodes in order, each once (its touch_valid). */
	struct cnode **q;
	size_t n, cap;
	/*
	 * Sequence numbers: queued counts touches taken (merged ones too),
	 * done is `queued` as it was when the last answered batch was taken.
	 * A drain waits for done to reach the queued of its start.
	 */
	unsigned long queued, done;
};

bool touch_only(int valid)
{
	const int times = SBX_SET_ATIME | SBX_SET_MTIME;
	const int now = SBX_SET_ATIME_NOW | SBX_SET_MTIME_NOW;

	/* ctime follows any change; the kernel may say so (CTIME). */
	if (valid & ~(times | now | SBX_SET_CTIME))
		return false;
	if (!(valid & times))
		return false;
	/* A time that is set must be set to now. */
	if ((valid & SBX_SET_ATIME) && !(valid & SBX_SET_ATIME_NOW))
		return false;
	if ((valid & SBX_SET_MTIME) && !(valid & SBX_SET_MTIME_NOW))
		return false;
	return true;
}

/* The sender's work: one batch of queued nodes. */
struct sent {
	struct cnode *node;
	char *path;
	struct stat in;
	struct sbx_setattr_item item;
};

/*
 * How long after a batch's answer an attribute event that names one of its
 * files is still taken as that touch's echo (seconds).  The agent changes
 * the file before it answers, so its event is already on the stream then;
 * one that comes later than this is taken as foreign: a stat, no harm.
 */
#define TOUCH_ECHO_GRACE 2.0

/*
 * A touch that went through: keep the sandbox's attributes (its clock's
 * times, not the ones we answered with) unless the node changed since, and
 * let the kernel ask us again if they differ.  No lock held.
 */
static void touch_done(struct cache *c, struct sent *s)
{
	struct cnode *n = s->node;
	const struct stat *out = &s->item.out;
	struct stat st;
	bool notify = false;

	cache_lock(c);
	n->touch_own_until = cache_now() + TOUCH_ECHO_GRACE;
	pthread_mutex_lock(&c->touch->lock);
	if (out->st_ino != 0 && out->st_ino == n->st.st_ino && n->st_valid &&
	    !tree_file_dirty(n) && !n->touch_valid) {
		notify = memcmp(&out->st_mtim, &n->st.st_mtim,
				sizeof(out->st_mtim)) != 0 ||
			 memcmp(&out->st_atim, &n->st.st_atim,
				sizeof(out->st_atim)) != 0;
		n->st = *out;
		n->st_time = cache_now();
	}
	pthread_mutex_unlock(&c->touch->lock);
	st = n->st;
	cache_unlock(c);
	if (notify)
		change_notify_attr(c, &st);
}

/* Record what came of one touch (no lock held). */
static void touch_result(struct cache *c, struct sent *s, int rc)
{
	struct stat st;
	bool known;

	if (rc == 0) {
		touch_done(c, s);
		return;
	}
	sbx_warn("touch of '%s' was not delivered to the sandbox: %s; its "
		 "times there are unchanged", s->path ? s->path : "(gone)",
		 strerror(-rc));
	cache_lock(c);
	s->node->touch_own_until = 0;
	/* What we answered is not the sandbox's: ask it next time. */
	tree_invalidate_file(s->node);
	c->events++;
	st = s->node->st;
	known = st.st_ino != 0;
	cache_unlock(c);
	if (known)
		change_notify_attr(c, &st);
}

static void send_batch(struct cache *c, struct sent *b, size_t n)
{
	struct sbx_setattr_item *items = sbx_xcalloc(n, sizeof(*items));
	size_t *idx = sbx_xcalloc(n, sizeof(*idx));
	size_t k = 0;
	int rc;

	cache_lock(c);
	for (size_t i = 0; i < n; i++) {
		b[i].path = tree_path_of(b[i].node);
		/* Its attribute event may come before the answer. */
		b[i].node->touch_own_until = INFINITY;
	}
	cache_unlock(c);
	for (size_t i = 0; i < n; i++) {
		if (!b[i].path) {
			touch_result(c, &b[i], -ESTALE);
			continue;
		}
		/* Not cache_inner_node(): that drains, i.e. waits for us. */
		rc = c->inner->ops->node_at(c->inner, b[i].path,
					    &b[i].item.node);
		if (rc < 0) {
			touch_result(c, &b[i], rc);
			continue;
		}
		items[k] = b[i].item;
		idx[k++] = i;
	}
	if (k > 0) {
		rc = c->inner->ops->setattr_many(c->inner, items, k);
		sbx_error_clear();
		for (size_t j = 0; j < k; j++) {
			struct sent *s = &b[idx[j]];

			c->inner->ops->forget(c->inner, items[j].node);
			s->item.out = items[j].out;
			touch_result(c, s, rc < 0 ? rc : items[j].rc);
		}
	}
	for (size_t i = 0; i < n; i++)
		free(b[i].path);
	free(items);
	free(idx);
}

static void *sender(void *arg)
{
	struct cache *c = arg;
	struct touch *t = c->touch;

	pthread_mutex_lock(&t->lock);
	for (;;) {
		struct cnode **q;
		struct sent *b;
		unsigned long upto;
		size_t n;

		while (t->n == 0 && !t->stopping)
			pthread_cond_wait(&t->cond, &t->lock);
		if (t->n == 0)
			break; /* stopping, and nothing left */
		q = t->q;
		n = t->n;
		upto = t->queued;
		t->q = NULL;
		t->n = t->cap = 0;
		b = sbx_xcalloc(n, sizeof(*b));
		for (size_t i = 0; i < n; i++) {
			b[i].node = q[i];
			b[i].item.in = &b[i].in;
			b[i].item.valid = q[i]->touch_valid;
			q[i]->touch_valid = 0;
		}
		/* Touches that come now queue for the next batch. */
		pthread_mutex_unlock(&t->lock);
		free(q);
		send_batch(c, b, n);
		free(b);
		pthread_mutex_lock(&t->lock);
		t->done = upto;
		pthread_cond_broadcast(&t->cond);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

bool touch_queue(struct cache *c, struct cnode *n, int valid)
{
	struct touch *t = c->touch;

	if (!t) {
		t = sbx_xcalloc(1, sizeof(*t));
		pthread_mutex_init(&t->lock, NULL);
		pthread_cond_init(&t->cond, NULL);
		/* touch_drain() reads it without c->lock. */
		__atomic_store_n(&c->touch, t, __ATOMIC_RELEASE);
	}
	pthread_mutex_lock(&t->lock);
	if (t->stopping) {
		pthread_mutex_unlock(&t->lock);
		return false;
	}
	if (!t->running) {
		if (pthread_create(&t->thread, NULL, sender, c) != 0) {
			pthread_mutex_unlock(&t->lock);
			return false;
		}
		t->running = true;
	}
	if (!n->touch_valid) {
		if (t->n == t->cap) {
			t->cap = t->cap ? 2 * t->cap : 64;
			t->q = sbx_xrealloc(t->q, t->cap * sizeof(*t->q));
		}
		t->q[t->n++] = n;
	}
	n->touch_valid |= valid;
	t->queued++;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	return true;
}

void touch_drain(struct cache *c)
{
	struct touch *t = __atomic_load_n(&c->touch, __ATOMIC_ACQUIRE);
	unsigned long upto;

	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	upto = t->queued;
	while (t->done < upto)
		pthread_cond_wait(&t->cond, &t->lock);
	pthread_mutex_unlock(&t->lock);
}

void touch_stop(struct cache *c)
{
	struct touch *t = c->touch;
	bool running;

	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	t->stopping = true;
	running = t->running;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	/* The sender sends what is queued before it leaves. */
	if (running)
		pthread_join(t->thread, NULL);
	free(t->q);
	pthread_mutex_destroy(&t->lock);
	pthread_cond_destroy(&t->cond);
	free(t);
	c->touch = NULL;
}
