/*
 * A recorder of the changes a provider's watch callback reports, for the
 * unit tests of the providers and the cache: start the watch with
 * th_changes_record as the callback and a struct th_changes as payload,
 * then read what arrived under its lock (or after watch_sync/watch_stop).
 */
#ifndef SBX_TEST_CHANGES_I_H
#define SBX_TEST_CHANGES_I_H

#include <pthread.h>
#include <stdio.h>
#include <sys/types.h>

#include "sbx/provider.h"

#define TH_MAX_CHANGES 256

struct th_changes {
	pthread_mutex_t lock;
	int n; /* changes recorded; later ones are dropped */
	struct th_change {
		int kind;
		ino_t dir_ino, ino;
		char name[64]; /* "" when the change has none */
		char path[64]; /* "(null)" when the change has none */
	} c[TH_MAX_CHANGES];
};

#define TH_CHANGES_INIT { .lock = PTHREAD_MUTEX_INITIALIZER }

/* sbx_change_cb: record `c` in the struct th_changes `payload`. */
static inline void th_changes_record(const struct sbx_change *c,
				     void *payload)
{
	struct th_changes *r = payload;

	pthread_mutex_lock(&r->lock);
	if (r->n < TH_MAX_CHANGES) {
		struct th_change *e = &r->c[r->n++];

		e->kind = c->kind;
		e->dir_ino = c->dir_ino;
		e->ino = c->ino;
		snprintf(e->name, sizeof(e->name), "%s",
			 c->name ? c->name : "");
		snprintf(e->path, sizeof(e->path), "%s",
			 c->path ? c->path : "(null)");
	}
	pthread_mutex_unlock(&r->lock);
}

/* Forget what was recorded. */
static inline void th_changes_reset(struct th_changes *r)
{
	pthread_mutex_lock(&r->lock);
	r->n = 0;
	pthread_mutex_unlock(&r->lock);
}

#endif
