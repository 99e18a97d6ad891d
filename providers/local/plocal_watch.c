/*
 * Local change stream: recursive inotify on the worktree.
 *
 * One watch per directory.  A thread reads events and turns them into
 * struct sbx_change for the daemon, which invalidates kernel caches.  The
 * exec barrier (plocal_watch_sync) relies on a property of inotify: an event
 * is queued inside the system call that caused it, so once a command has
 * exited, draining the queue delivers every change it made.
 *
 * Directories created or moved into the tree get watches as their events
 * arrive; since entries may appear in them before the watch exists, every
 * entry found while adding a watch is reported too.  Directory renames
 * inside the tree keep their watches and only rewrite recorded paths.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "plocal_i.h"

#define WATCH_MASK                                                             \
	(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MODIFY |     \
	 IN_ATTRIB | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

/* In a burst (BURST_EVENTS read at once), let events accumulate this long. */
#define COALESCE_MS 5
#define BURST_EVENTS 64

/* How long the exec barrier waits for the watcher before giving up. */
#define SYNC_TIMEOUT_SEC 30

struct wdir {
	char *path; /* absolute */
	dev_t dev;
	ino_t ino;
};

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
	int ifd;
	int efd;
	pthread_t thread;
	sbx_change_cb cb;
	void *payload;
	uint64_t seq;

	/* Indexed by watch descriptor; only the watcher thread touches it
	 * after start. */
	struct wdir **wds;
	size_t nwds;

	/* A directory moved away, waiting for its IN_MOVED_TO. */
	uint32_t move_cookie;
	char *move_path;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct plocal_expect *expect; /* protected by lock */
	struct deferred *deferred;    /* protected by lock */
	uint64_t req_gen;  /* protected by lock */
	uint64_t done_gen; /* protected by lock */
	bool stop;         /* protected by lock */
};

static void emit(struct plocal_watch *w, int kind, const struct wdir *dir,
		 const char *name, const struct stat *st)
{
	struct sbx_change c;

	memset(&c, 0, sizeof(c));
	c.seq = ++w->seq;
	c.kind = kind;
	if (dir) {
		c.dir_dev = dir->dev;
		c.dir_ino = dir->ino;
	}
	c.name = name;
	if (st) {
		c.dev = st->st_dev;
		c.ino = st->st_ino;
	}
	w->cb(&c, w->payload);
}

static void set_wd(struct plocal_watch *w, int wd, char *path,
		   const struct stat *st)
{
	struct wdir *d;

	if ((size_t)wd >= w->nwds) {
		size_t n = w->nwds ? w->nwds : 64;

		while (n <= (size_t)wd)
			n *= 2;
		w->wds = sbx_xrealloc(w->wds, n * sizeof(*w->wds));
		memset(w->wds + w->nwds, 0, (n - w->nwds) * sizeof(*w->wds));
		w->nwds = n;
	}
	d = w->wds[wd];
	if (!d) {
		d = sbx_xcalloc(1, sizeof(*d));
		w->wds[wd] = d;
	}
	free(d->path);
	d->path = path;
	d->dev = st->st_dev;
	d->ino = st->st_ino;
}

static void drop_wd(struct plocal_watch *w, int wd)
{
	if (wd < 0 || (size_t)wd >= w->nwds || !w->wds[wd])
		return;
	free(w->wds[wd]->path);
	free(w->wds[wd]);
	w->wds[wd] = NULL;
}

/*
 * Watch `path` and every directory beneath it.  With `report`, emit an
 * ENTRY change for every entry found (they may predate the watch).
 * Returns 0 or -errno (-ENOSPC when the inotify watch limit is reached).
 */
static int add_tree(struct plocal_watch *w, const char *path, bool report)
{
	struct stat st;
	struct dirent *e;
	DIR *dir;
	int wd, rc = 0;

	wd = inotify_add_watch(w->ifd, path, WATCH_MASK);
	if (wd < 0) {
		if (errno == ENOENT || errno == ENOTDIR)
			return 0; /* gone again: its parent's event says so */
		return sbx_error_os("inotify watch %s (raise "
				    "fs.inotify.max_user_watches?)", path);
	}
	if (lstat(path, &st) < 0)
		return 0;
	set_wd(w, wd, sbx_xstrdup(path), &st);
	dir = opendir(path);
	if (!dir)
		return 0;
	while ((e = readdir(dir))) {
		char *child;
		bool isdir;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (report)
			emit(w, SBX_CHANGE_ENTRY, w->wds[wd], e->d_name, NULL);
		isdir = e->d_type == DT_DIR;
		child = sbx_xasprintf("%s/%s", path, e->d_name);
		if (e->d_type == DT_UNKNOWN) {
			struct stat cst;

			isdir = lstat(child, &cst) == 0 && S_ISDIR(cst.st_mode);
		}
		if (isdir)
			rc = add_tree(w, child, report);
		free(child);
		if (rc < 0)
			break;
	}
	closedir(dir);
	return rc;
}

/* A directory moved from `from` to `to` inside the tree: fix paths. */
static void rename_prefix(struct plocal_watch *w, const char *from,
			  const char *to)
{
	size_t flen = strlen(from);

	for (size_t i = 0; i < w->nwds; i++) {
		struct wdir *d = w->wds[i];

		if (!d || strncmp(d->path, from, flen) != 0 ||
		    (d->path[flen] != '\0' && d->path[flen] != '/'))
			continue;
		char *np = sbx_xasprintf("%s%s", to, d->path + flen);

		free(d->path);
		d->path = np;
	}
}

/* A directory left the tree: stop watching it and everything below. */
static void remove_prefix(struct plocal_watch *w, const char *from)
{
	size_t flen = strlen(from);

	for (size_t i = 0; i < w->nwds; i++) {
		struct wdir *d = w->wds[i];

		if (!d || strncmp(d->path, from, flen) != 0 ||
		    (d->path[flen] != '\0' && d->path[flen] != '/'))
			continue;
		inotify_rm_watch(w->ifd, (int)i);
		drop_wd(w, (int)i);
	}
}

static void settle_move(struct plocal_watch *w)
{
	if (!w->move_path)
		return;
	remove_prefix(w, w->move_path);
	free(w->move_path);
	w->move_path = NULL;
	w->move_cookie = 0;
}

/*
 * Is this event one our own system call announced?  Consumes the first
 * matching expectation.  Events of one name cannot merge in the inotify
 * queue (a second IN_CREATE needs an IN_DELETE between), so one event
 * answers one expectation exactly.
 */
static bool expect_consume(struct plocal_watch *w, const struct wdir *dir,
			   const char *name, uint32_t mask)
{
	struct plocal_expect **pp, *e;
	bool found = false;

	mask &= IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO;
	pthread_mutex_lock(&w->lock);
	for (pp = &w->expect; (e = *pp); pp = &e->next) {
		if (e->mask != mask || e->ino != dir->ino ||
		    e->dev != dir->dev || strcmp(e->name, name) != 0)
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
		struct wdir dir = {.dev = d->dev, .ino = d->ino};

		next = d->next;
		emit(w, SBX_CHANGE_ENTRY, &dir, d->name, NULL);
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
	uint64_t one = 1;
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
	if (wake && write(w->efd, &one, sizeof(one)) < 0) {
		/* The counter cannot overflow in practice. */
	}
}

static void handle(struct plocal_watch *w, const struct inotify_event *ev)
{
	struct wdir *dir;
	struct stat st;
	char *path;

	if (ev->mask & IN_Q_OVERFLOW) {
		expect_clear(w);
		emit(w, SBX_CHANGE_OVERFLOW, NULL, NULL, NULL);
		return;
	}
	if (ev->wd < 0 || (size_t)ev->wd >= w->nwds || !w->wds[ev->wd])
		return;
	if (ev->mask & IN_IGNORED) {
		drop_wd(w, ev->wd);
		return;
	}
	dir = w->wds[ev->wd];
	if (ev->len == 0) {
		/* About the watched directory itself. */
		if (ev->mask & IN_ATTRIB) {
			struct stat dst = {.st_dev = dir->dev,
					   .st_ino = dir->ino};

			emit(w, SBX_CHANGE_ATTR, NULL, NULL, &dst);
		}
		return;
	}

	/* A pending directory move that did not pair with this event. */
	if (w->move_path && !((ev->mask & IN_MOVED_TO) &&
			      ev->cookie == w->move_cookie))
		settle_move(w);

	path = sbx_xasprintf("%s/%s", dir->path, ev->name);
	if (ev->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)) {
		if (!expect_consume(w, dir, ev->name, ev->mask))
			emit(w, SBX_CHANGE_ENTRY, dir, ev->name, NULL);
		if ((ev->mask & IN_ISDIR) && (ev->mask & IN_MOVED_FROM)) {
			w->move_cookie = ev->cookie;
			w->move_path = path;
			path = NULL;
		} else if ((ev->mask & IN_ISDIR) && (ev->mask & IN_MOVED_TO) &&
			   w->move_path && ev->cookie == w->move_cookie) {
			rename_prefix(w, w->move_path, path);
			free(w->move_path);
			w->move_path = NULL;
			w->move_cookie = 0;
		} else if ((ev->mask & IN_ISDIR) &&
			   (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
			if (add_tree(w, path, true) < 0) {
				sbx_warn("%s; caches may go stale: "
					 "invalidating everything",
					 sbx_error_last()->msg);
				sbx_error_clear();
				emit(w, SBX_CHANGE_OVERFLOW, NULL, NULL, NULL);
			}
		}
	} else if (ev->mask & (IN_MODIFY | IN_ATTRIB)) {
		if (lstat(path, &st) == 0)
			emit(w, (ev->mask & IN_MODIFY) ? SBX_CHANGE_DATA
							: SBX_CHANGE_ATTR,
			     dir, ev->name, &st);
	}
	free(path);
}

/* Read and handle everything queued now: the number of events, or -1. */
static long drain(struct plocal_watch *w)
{
	long count = 0;

	char buf[64 * 1024]
		__attribute__((aligned(__alignof__(struct inotify_event))));

	for (;;) {
		ssize_t n = read(w->ifd, buf, sizeof(buf));

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			sbx_error("inotify read: %s", strerror(errno));
			return -1;
		}
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (void *)p;

			handle(w, ev);
			p += sizeof(*ev) + ev->len;
			count++;
		}
	}
	/* A move whose partner is not queued by now left the tree. */
	settle_move(w);
	return count;
}

static void *watcher(void *arg)
{
	struct plocal_watch *w = arg;
	struct pollfd pfd[2] = {
		{.fd = w->ifd, .events = POLLIN},
		{.fd = w->efd, .events = POLLIN},
	};

	bool busy = false;

	for (;;) {
		uint64_t gen = 0, v;
		bool stop;
		long n;

		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		if (busy && !(pfd[1].revents & POLLIN)) {
			/*
			 * In a burst, let events accumulate so that inotify
			 * merges repeated ones (a large write becomes a few
			 * events, not thousands).  Isolated changes are
			 * handled at once; a barrier request cuts the wait.
			 */
			poll(&pfd[1], 1, COALESCE_MS);
		}
		if (pfd[1].revents & POLLIN) {
			if (read(w->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				break;
		}
		pthread_mutex_lock(&w->lock);
		gen = w->req_gen;
		stop = w->stop;
		pthread_mutex_unlock(&w->lock);
		if (stop)
			break;
		n = drain(w);
		busy = n >= BURST_EVENTS;
		if (n < 0) {
			emit(w, SBX_CHANGE_OVERFLOW, NULL, NULL, NULL);
			break;
		}
		emit_deferred(w);
		pthread_mutex_lock(&w->lock);
		if (gen > w->done_gen) {
			w->done_gen = gen;
			pthread_cond_broadcast(&w->cond);
		}
		pthread_mutex_unlock(&w->lock);
	}
	/* Wake barrier waiters: they must not hang on a dead watcher. */
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

static void watch_free(struct plocal_watch *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->nwds; i++)
		drop_wd(w, (int)i);
	free(w->wds);
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
	free(w->move_path);
	if (w->ifd >= 0)
		close(w->ifd);
	if (w->efd >= 0)
		close(w->efd);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
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
	w->cb = cb;
	w->payload = payload;
	w->efd = -1;
	pthread_mutex_init(&w->lock, NULL);
	pthread_cond_init(&w->cond, NULL);
	w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (w->ifd < 0) {
		rc = sbx_error_os("inotify_init1");
		goto fail;
	}
	w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->efd < 0) {
		rc = sbx_error_os("eventfd");
		goto fail;
	}
	rc = add_tree(w, s->root_path, false);
	if (rc < 0)
		goto fail;
	rc = -pthread_create(&w->thread, NULL, watcher, w);
	if (rc < 0) {
		rc = sbx_error_set(SBX_ERR_OS, rc, "cannot start watcher");
		goto fail;
	}
	s->watch = w;
	return 0;
fail:
	watch_free(w);
	return rc;
}

int plocal_watch_sync(struct sbx_sandbox *sb)
{
	struct plocal_watch *w = ((struct plocal_sandbox *)sb)->watch;
	struct timespec deadline;
	uint64_t one = 1, gen;
	int rc = 0;

	if (!w)
		return sbx_error_set(SBX_ERR_INTERNAL, -ENOSYS,
				     "no change stream");
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += SYNC_TIMEOUT_SEC;
	pthread_mutex_lock(&w->lock);
	gen = ++w->req_gen;
	if (write(w->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		rc = sbx_error_os("wake watcher");
	while (rc == 0 && w->done_gen < gen && !w->stop) {
		int e = pthread_cond_timedwait(&w->cond, &w->lock, &deadline);

		if (e == ETIMEDOUT)
			rc = sbx_error_set(SBX_ERR_INTERNAL, -ETIMEDOUT,
					   "change stream did not catch up "
					   "within %d s", SYNC_TIMEOUT_SEC);
	}
	if (rc == 0 && w->done_gen < gen)
		rc = sbx_error_set(SBX_ERR_INTERNAL, -EIO,
				   "change stream stopped");
	pthread_mutex_unlock(&w->lock);
	return rc;
}

void plocal_watch_stop(struct sbx_sandbox *sb)
{
	struct plocal_sandbox *s = (struct plocal_sandbox *)sb;
	struct plocal_watch *w = s->watch;
	uint64_t one = 1;

	if (!w)
		return;
	pthread_mutex_lock(&w->lock);
	w->stop = true;
	pthread_mutex_unlock(&w->lock);
	if (write(w->efd, &one, sizeof(one)) < 0) {
		/* The counter is far from overflowing; nothing to do. */
	}
	pthread_join(w->thread, NULL);
	s->watch = NULL;
	watch_free(w);
}
