/*
 * Local change stream: recursive inotify on the worktree, through
 * lib/fswatch.c (sbx/fswatch.h), turned into struct sbx_change for the
 * daemon, which invalidates kernel caches.
 *
 * What this file adds to the watcher: changes name objects by identity
 * (the directory's st_dev/st_ino and the entry name, or the object's own
 * identity for DATA and ATTR), and events our own system calls cause
 * through the mount are dropped (plocal_expect_begin/end, plocal_i.h).  The
 * exec barrier (plocal_watch_sync) is the watcher's: an inotify event is
 * queued inside the system call that caused it, so once a command has
 * exited, draining the queue delivers every change it made.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include "sbx/fswatch.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "plocal_i.h"

/* How long the exec barrier waits for the watcher before giving up. */
#define SYNC_TIMEOUT_MS (30 * 1000)

/* An event our own system call will cause (see plocal_i.h). */
struct plocal_expect {
	dev_t dev;       /* the directory */
	ino_t ino;
	uint32_t mask;   /* IN_CREATE, IN_DELETE, IN_MOVED_FROM, IN_MOVED_TO */
	bool consumed;   /* the watcher saw the event */
	bool ended;      /* the system call has returned */
	struct plocal_expect *next;
	char name[];
};

/* A change to emit from the watcher thread (never from a FUSE request). */
struct deferred {
	dev_t dev;
	ino_t ino;
	struct deferred *next;
	char name[];
};

struct plocal_watch {
	struct sbx_fswatch *fw;
	const char *root; /* the sandbox's root_path, borrowed */
	sbx_change_cb cb;
	void *payload;
	uint64_t seq; /* the watcher thread only */

	pthread_mutex_t lock;
	struct plocal_expect *expect; /* protected by lock */
	struct deferred *deferred;    /* protected by lock */
};

/* Report a change; `name` in the directory (dir_dev, dir_ino), or about
 * the object (dev, ino) alone.  On the watcher thread. */
static void emit(struct plocal_watch *w, int kind, dev_t dir_dev,
		 ino_t dir_ino, const char *name, dev_t dev, ino_t ino)
{
	const struct sbx_change c = {
		.seq = ++w->seq,
		.kind = kind,
		.dir_dev = dir_dev,
		.dir_ino = dir_ino,
		.name = name,
		.dev = dev,
		.ino = ino,
	};

	w->cb(&c, w->payload);
}

/*
 * Is this event one our own system call announced?  Consumes the first
 * matching expectation.  Events of one name cannot merge in the inotify
 * queue (a second IN_CREATE needs an IN_DELETE between), so one event
 * answers one expectation exactly.
 */
static bool expect_consume(struct plocal_watch *w, dev_t dev, ino_t ino,
			   const char *name, uint32_t mask)
{
	struct plocal_expect **pp, *e;
	bool found = false;

	mask &= IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO;
	pthread_mutex_lock(&w->lock);
	for (pp = &w->expect; (e = *pp); pp = &e->next) {
		if (e->mask != mask || e->ino != ino || e->dev != dev ||
		    strcmp(e->name, name) != 0)
			continue;
		*pp = e->next;
		found = true;
		if (e->ended)
			free(e);
		else
			e->consumed = true; /* plocal_expect_end frees it */
		break;
	}
	pthread_mutex_unlock(&w->lock);
	return found;
}

/* Forget every expectation (events were lost: all is invalidated). */
static void expect_clear(struct plocal_watch *w)
{
	struct plocal_expect *e, *next;

	pthread_mutex_lock(&w->lock);
	for (e = w->expect; e; e = next) {
		next = e->next;
		if (e->ended)
			free(e);
		else
			e->consumed = true;
	}
	w->expect = NULL;
	pthread_mutex_unlock(&w->lock);
}

static void emit_deferred(struct plocal_watch *w)
{
	struct deferred *d, *next;

	pthread_mutex_lock(&w->lock);
	d = w->deferred;
	w->deferred = NULL;
	pthread_mutex_unlock(&w->lock);
	for (; d; d = next) {
		next = d->next;
		emit(w, SBX_CHANGE_ENTRY, d->dev, d->ino, d->name, 0, 0);
		free(d);
	}
}

struct plocal_expect *plocal_expect_begin(struct plocal_sandbox *s,
					  const struct plocal_node *dir,
					  const char *name, uint32_t mask)
{
	struct plocal_watch *w = s->watch;
	size_t len = strlen(name);
	struct plocal_expect *e;

	if (!w)
		return NULL;
	e = sbx_xmalloc(sizeof(*e) + len + 1);
	e->dev = dir->dev;
	e->ino = dir->ino;
	e->mask = mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO);
	e->consumed = false;
	e->ended = false;
	memcpy(e->name, name, len + 1);
	pthread_mutex_lock(&w->lock);
	e->next = w->expect;
	w->expect = e;
	pthread_mutex_unlock(&w->lock);
	return e;
}

void plocal_expect_end(struct plocal_sandbox *s, struct plocal_expect *e,
		       bool ok)
{
	struct plocal_watch *w = s->watch;
	struct plocal_expect **pp;
	bool wake = false;

	if (!e)
		return;
	pthread_mutex_lock(&w->lock);
	if (e->consumed) {
		if (!ok) {
			/*
			 * The event we swallowed was someone else's (our call
			 * failed): have the watcher invalidate after all.  Not
			 * from here, inside a FUSE request holding the
			 * directory lock the notification needs.
			 */
			size_t len = strlen(e->name);
			struct deferred *d = sbx_xmalloc(sizeof(*d) + len + 1);

			d->dev = e->dev;
			d->ino = e->ino;
			memcpy(d->name, e->name, len + 1);
			d->next = w->deferred;
			w->deferred = d;
			wake = true;
		}
		free(e);
	} else if (!ok) {
		for (pp = &w->expect; *pp && *pp != e; pp = &(*pp)->next)
			;
		if (*pp)
			*pp = e->next;
		free(e);
	} else {
		e->ended = true; /* the watcher frees it when the event comes */
	}
	pthread_mutex_unlock(&w->lock);
	if (wake)
		sbx_fswatch_wake(w->fw);
}

/* fswatch callback, on the watcher thread. */
static void on_event(const struct sbx_fswatch_event *ev, void *payload)
{
	struct plocal_watch *w = payload;
	struct stat st;
	char *path;

	switch (ev->kind) {
	case SBX_FSWATCH_OVERFLOW:
		expect_clear(w);
		emit(w, SBX_CHANGE_OVERFLOW, 0, 0, NULL, 0, 0);
		return;
	case SBX_FSWATCH_BATCH:
		emit_deferred(w);
		return;
	case SBX_FSWATCH_ENTRY:
		/* Entries found by a scan (mask 0) were nobody's call. */
		if (ev->mask && expect_consume(w, ev->dir_dev, ev->dir_ino,
					       ev->name, ev->mask))
			return;
		/*
		 * With the identity of what the name holds now: a link to a
		 * file the kernel knows by another name changed that file's
		 * link count, and no event names it.
		 */
		(void)sbx_fswatch_entry_stat(ev, w->root, &st);
		emit(w, SBX_CHANGE_ENTRY, ev->dir_dev, ev->dir_ino, ev->name,
		     st.st_dev, st.st_ino);
		return;
	case SBX_FSWATCH_DATA:
	case SBX_FSWATCH_ATTR:
		if (!ev->name) {
			/* The watched directory itself. */
			emit(w, SBX_CHANGE_ATTR, 0, 0, NULL, ev->dir_dev,
			     ev->dir_ino);
			return;
		}
		/* The object's identity: gone again, nothing to say. */
		path = sbx_xasprintf("%s/%s", w->root, ev->path);
		if (lstat(path, &st) == 0)
			emit(w, ev->kind == SBX_FSWATCH_DATA ? SBX_CHANGE_DATA
							     : SBX_CHANGE_ATTR,
			     ev->dir_dev, ev->dir_ino, ev->name, st.st_dev,
			     st.st_ino);
		free(path);
		return;
	default:
		return;
	}
}

static void watch_free(struct plocal_watch *w)
{
	if (!w)
		return;
	/* First: joins the thread, the only other user of the lists. */
	sbx_fswatch_free(w->fw);
	while (w->expect) {
		struct plocal_expect *e = w->expect;

		w->expect = e->next;
		free(e);
	}
	while (w->deferred) {
		struct deferred *d = w->deferred;

		w->deferred = d->next;
		free(d);
	}
	pthread_mutex_destroy(&w->lock);
	free(w);
}

int plocal_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
		       void *payload)
{
	struct plocal_sandbox *s = (struct plocal_sandbox *)sb;
	struct plocal_watch *w;
	int rc;

	if (s->watch)
		return sbx_error_set(SBX_ERR_INTERNAL, -EBUSY,
				     "change stream already started");
	w = sbx_xcalloc(1, sizeof(*w));
	w->root = s->root_path;
	w->cb = cb;
	w->payload = payload;
	pthread_mutex_init(&w->lock, NULL);
	rc = sbx_fswatch_new_flags(&w->fw, s->root_path, SBX_FSWATCH_F_BATCH,
				   on_event, w);
	if (rc < 0) {
		watch_free(w);
		return rc;
	}
	s->watch = w;
	return 0;
}

int plocal_watch_sync(struct sbx_sandbox *sb)
{
	struct plocal_watch *w = ((struct plocal_sandbox *)sb)->watch;

	if (!w)
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOSYS,
				     "no change stream");
	return sbx_fswatch_sync(w->fw, SYNC_TIMEOUT_MS);
}

void plocal_watch_stop(struct sbx_sandbox *sb)
{
	struct plocal_sandbox *s = (struct plocal_sandbox *)sb;
	struct plocal_watch *w = s->watch;

	if (!w)
		return;
	/* Stop the thread before anyone sees s->watch go. */
	sbx_fswatch_free(w->fw);
	w->fw = NULL;
	s->watch = NULL;
	watch_free(w);
}
