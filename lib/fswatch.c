/* Recursive inotify tree reported as relative paths; see sbx/fswatch.h. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbx/clock.h"
#include "sbx/fswatch.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"

#define WATCH_MASK                                                             \
	(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_MODIFY |     \
	 IN_ATTRIB | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

/*
 * A directory's IN_MOVED_FROM waits this long for its IN_MOVED_TO before
 * the directory is taken to have left the tree: the agent's read may come
 * between the two (the kernel queues them one after the other, not at
 * once), and a busy tree keeps the reads coming.
 */
#define MOVE_SETTLE_MS 50

/* Files moved away and not yet paired with their IN_MOVED_TO, at most. */
#define MOVES_PENDING 16

/* In a burst (BURST_EVENTS read at once), let events accumulate this long. */
#define COALESCE_MS 5
#define BURST_EVENTS 64

/* A watched directory. */
struct wdir {
	char *path; /* relative to the root */
	dev_t dev;  /* lstat() when the watch was added */
	ino_t ino;
	/* Below the name a directory was moved onto, while that move may be
	 * an exchange's first half (sbx_fswatch.swap_*). */
	bool displaced;
};

struct sbx_fswatch {
	char *root; /* absolute */
	unsigned flags; /* SBX_FSWATCH_F_* */
	int ifd;
	int efd; /* wakes the thread: sync requests and stop */
	pthread_t thread;
	bool started;
	sbx_fswatch_cb cb;
	void *payload;

	/* Indexed by watch descriptor; only the watcher thread touches them
	 * after start. */
	struct wdir **wds;
	size_t nwds;

	/* A directory moved away, waiting for its IN_MOVED_TO. */
	uint32_t move_cookie;
	char *move_path;
	long long move_since_ms; /* sbx_clock_mono_ms() at its MOVED_FROM */
	/*
	 * Files moved away whose IN_MOVED_TO (same cookie) has not come yet:
	 * it says where the file came from.  Other events may come between
	 * the two (another CPU's, queued while the rename ran: a churn test
	 * saw a write's IN_MODIFY there).  A move out of the tree has none;
	 * the oldest entry makes room.
	 */
	struct {
		uint32_t cookie; /* 0: free */
		char *path;
	} moves[MOVES_PENDING];
	unsigned moves_next;
	/*
	 * A directory moved from `swap_from` onto `swap_to`, where the
	 * directory watched as `swap_wd` was: the first half of an exchange,
	 * or a rename over an empty directory.  The watches below swap_to
	 * before the move (displaced) keep that path until the next event
	 * tells which: the second half (swap_to moved to swap_from) moves
	 * them there; an IN_ATTRIB of swap_wd itself (the link count of a
	 * directory replaced) or any other directory move leaves them.
	 */
	char *swap_from, *swap_to;
	int swap_wd;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t req_gen;  /* protected by lock */
	uint64_t done_gen; /* protected by lock */
	bool stop;         /* protected by lock */
	bool dead;         /* protected by lock: the thread has ended */
};

/*
 * Report `kind` for `name` in the watched directory `d`, or for `d` itself
 * when `name` is NULL (`path` is then d's), or with neither for OVERFLOW
 * and BATCH.
 */
static void emit_from(struct sbx_fswatch *w, int kind, const struct wdir *d,
		      const char *path, const char *name, uint32_t mask,
		      const char *from)
{
	struct sbx_fswatch_event ev = {
		.kind = kind,
		.path = path,
		.name = name,
		.dir_dev = d ? d->dev : 0,
		.dir_ino = d ? d->ino : 0,
		.mask = mask,
		.from = from,
	};

	w->cb(&ev, w->payload);
}

static void emit(struct sbx_fswatch *w, int kind, const struct wdir *d,
		 const char *path, const char *name, uint32_t mask)
{
	emit_from(w, kind, d, path, name, mask, NULL);
}

static char *join(const char *dir, const char *name)
{
	if (!*dir)
		return sbx_xstrdup(name);
	return sbx_xasprintf("%s/%s", dir, name);
}

static char *absolute(struct sbx_fswatch *w, const char *rel)
{
	if (!*rel)
		return sbx_xstrdup(w->root);
	return sbx_xasprintf("%s/%s", w->root, rel);
}

static struct wdir *set_wd(struct sbx_fswatch *w, int wd, const char *rel,
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
	d->path = sbx_xstrdup(rel);
	d->dev = st->st_dev;
	d->ino = st->st_ino;
	return d;
}

static void drop_wd(struct sbx_fswatch *w, int wd)
{
	if (wd < 0 || (size_t)wd >= w->nwds || !w->wds[wd])
		return;
	free(w->wds[wd]->path);
	free(w->wds[wd]);
	w->wds[wd] = NULL;
}

/*
 * Watch directory `rel` and every directory beneath it.  With `report`,
 * emit ENTRY for every entry found (they may predate the watch).
 */
static int add_tree(struct sbx_fswatch *w, const char *rel, bool report)
{
	char *abs = absolute(w, rel);
	struct wdir here;
	struct dirent *e;
	struct stat st;
	DIR *dir = NULL;
	int wd, rc = 0;

	wd = inotify_add_watch(w->ifd, abs, WATCH_MASK);
	if (wd < 0) {
		if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP)
			goto out; /* gone again: its parent's event says so */
		rc = sbx_error_os("inotify watch %s (raise "
				  "fs.inotify.max_user_watches?)",
				  abs);
		goto out;
	}
	if (lstat(abs, &st) < 0)
		goto out; /* gone again, as above */
	/* A copy: the recursion below may rename or drop entries. */
	here = *set_wd(w, wd, rel, &st);
	here.path = NULL;
	dir = opendir(abs);
	if (!dir)
		goto out;
	while ((e = readdir(dir))) {
		char *child;
		bool isdir;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		child = join(rel, e->d_name);
		if (report)
			emit(w, SBX_FSWATCH_ENTRY, &here, child, e->d_name, 0);
		isdir = e->d_type == DT_DIR;
		if (e->d_type == DT_UNKNOWN) {
			isdir = fstatat(dirfd(dir), e->d_name, &st,
					AT_SYMLINK_NOFOLLOW) == 0 &&
				S_ISDIR(st.st_mode);
		}
		if (isdir)
			rc = add_tree(w, child, report);
		free(child);
		if (rc < 0)
			break;
	}
out:
	if (dir)
		closedir(dir);
	free(abs);
	return rc;
}

static bool has_prefix(const char *path, const char *prefix, size_t plen)
{
	return !strncmp(path, prefix, plen) &&
	       (path[plen] == '\0' || path[plen] == '/');
}

/* A directory moved from `from` to `to` inside the tree: fix paths. */
static void rename_prefix(struct sbx_fswatch *w, const char *from,
			  const char *to)
{
	size_t flen = strlen(from);

	for (size_t i = 0; i < w->nwds; i++) {
		struct wdir *d = w->wds[i];
		char *p;

		if (!d || d->displaced || !has_prefix(d->path, from, flen))
			continue;
		p = sbx_xasprintf("%s%s", to, d->path + flen);
		free(d->path);
		d->path = p;
	}
}

/*
 * End a pending exchange (swap_*): with `exchanged`, the displaced watches
 * go to swap_from (the second half came); else they stay where they are
 * (the directory they were below was replaced).
 */
static void swap_end(struct sbx_fswatch *w, bool exchanged)
{
	size_t tlen = w->swap_to ? strlen(w->swap_to) : 0;

	for (size_t i = 0; w->swap_to && i < w->nwds; i++) {
		struct wdir *d = w->wds[i];
		char *p;

		if (!d || !d->displaced)
			continue;
		d->displaced = false;
		if (!exchanged || !has_prefix(d->path, w->swap_to, tlen))
			continue;
		p = sbx_xasprintf("%s%s", w->swap_from, d->path + tlen);
		free(d->path);
		d->path = p;
	}
	free(w->swap_from);
	free(w->swap_to);
	w->swap_from = w->swap_to = NULL;
	w->swap_wd = -1;
}

/*
 * A directory moved from `from` to `to`.  A RENAME_EXCHANGE is reported as
 * two such moves (from -> to, then to -> from); renaming prefixes twice
 * would put both subtrees under `from`.  When a watched directory was at
 * `to`, its watches are set apart (displaced) until the next event says
 * whether this was an exchange's first half (swap_end).  The kernel
 * queues an exchange's two halves back to back, in one call, and a
 * rename over an empty directory reports that directory's link count
 * (IN_ATTRIB) right after its IN_MOVED_TO: neither depends on what the
 * sandbox looks like when the events are read.  (Until 2026-12-08 the
 * first half looked at `from` then: an exchange followed at once by a
 * rename of one of the two was taken for a plain rename, and both
 * subtrees were reported under one path for good; stress test.)
 */
static void dir_moved(struct sbx_fswatch *w, const char *from, const char *to)
{
	size_t tlen = strlen(to);
	int t = -1;

	if (w->swap_from && !strcmp(from, w->swap_to) &&
	    !strcmp(to, w->swap_from)) {
		swap_end(w, true);
		return;
	}
	swap_end(w, false);
	for (size_t i = 0; i < w->nwds && t < 0; i++)
		if (w->wds[i] && !strcmp(w->wds[i]->path, to))
			t = (int)i;
	if (t >= 0 && !has_prefix(to, from, strlen(from))) {
		for (size_t i = 0; i < w->nwds; i++)
			if (w->wds[i] && has_prefix(w->wds[i]->path, to, tlen))
				w->wds[i]->displaced = true;
		w->swap_from = sbx_xstrdup(from);
		w->swap_to = sbx_xstrdup(to);
		w->swap_wd = t;
	}
	rename_prefix(w, from, to);
}

/* A directory left the tree: stop watching it and everything below. */
static void remove_prefix(struct sbx_fswatch *w, const char *from)
{
	size_t flen = strlen(from);

	for (size_t i = 0; i < w->nwds; i++) {
		if (!w->wds[i] || !has_prefix(w->wds[i]->path, from, flen))
			continue;
		inotify_rm_watch(w->ifd, (int)i);
		drop_wd(w, (int)i);
	}
}

static void settle_move(struct sbx_fswatch *w)
{
	if (!w->move_path)
		return;
	remove_prefix(w, w->move_path);
	free(w->move_path);
	w->move_path = NULL;
	w->move_cookie = 0;
}

static void overflow(struct sbx_fswatch *w, const char *why)
{
	if (why) {
		sbx_warn("%s; invalidating everything", why);
		sbx_error_clear();
	}
	emit(w, SBX_FSWATCH_OVERFLOW, NULL, NULL, NULL, 0);
	/* Directories created while events were lost have no watch yet;
	 * adding an existing watch again only returns its descriptor. */
	if (add_tree(w, "", false) < 0) {
		sbx_warn("re-scan after overflow: %s", sbx_error_last()->msg);
		sbx_error_clear();
	}
}

/* A file moved away from `path` (its IN_MOVED_FROM, `cookie`). */
static void file_move_start(struct sbx_fswatch *w, uint32_t cookie,
			    const char *path)
{
	unsigned i = w->moves_next++ % MOVES_PENDING;

	free(w->moves[i].path);
	w->moves[i].cookie = cookie;
	w->moves[i].path = sbx_xstrdup(path);
}

/* The pending file move of `cookie` (its slot), or -1. */
static int file_move_find(const struct sbx_fswatch *w, uint32_t cookie)
{
	for (int i = 0; i < MOVES_PENDING; i++)
		if (cookie && w->moves[i].cookie == cookie && w->moves[i].path)
			return i;
	return -1;
}

static void file_move_end(struct sbx_fswatch *w, int i)
{
	if (i < 0)
		return;
	free(w->moves[i].path);
	w->moves[i].path = NULL;
	w->moves[i].cookie = 0;
}

/* Where the object an IN_MOVED_TO names came from: the path of its
 * IN_MOVED_FROM, when that was paired with it; else NULL. */
static const char *moved_from(const struct sbx_fswatch *w,
			      const struct inotify_event *ev, int file_move)
{
	if (!(ev->mask & IN_MOVED_TO))
		return NULL;
	if (ev->mask & IN_ISDIR)
		return w->move_path && ev->cookie == w->move_cookie
			       ? w->move_path
			       : NULL;
	return file_move >= 0 ? w->moves[file_move].path : NULL;
}

static void handle(struct sbx_fswatch *w, const struct inotify_event *ev)
{
	int file_move = -1;
	const struct wdir *dir;
	char *path;

	if (ev->mask & IN_Q_OVERFLOW) {
		overflow(w, NULL);
		return;
	}
	if (ev->wd < 0 || (size_t)ev->wd >= w->nwds || !w->wds[ev->wd])
		return;
	if (ev->mask & IN_IGNORED) {
		if (ev->wd == w->swap_wd)
			swap_end(w, false);
		drop_wd(w, ev->wd);
		return;
	}
	dir = w->wds[ev->wd];
	if (ev->len == 0 || !ev->name[0]) {
		/* About the watched directory itself.  The directory a
		 * pending move replaced: its link count (dir_moved). */
		if ((ev->mask & IN_ATTRIB) && ev->wd == w->swap_wd)
			swap_end(w, false);
		if (ev->mask & IN_ATTRIB)
			emit(w, SBX_FSWATCH_ATTR, dir, dir->path, NULL,
			     ev->mask);
		return;
	}
	/*
	 * A pending directory move, when another one starts: it did not pair
	 * (it left the tree).  Other events may come between a move's two
	 * halves (see `moves`); one left pending settles MOVE_SETTLE_MS
	 * after it came (drain).
	 */
	if (w->move_path && (ev->mask & IN_MOVED_FROM) &&
	    (ev->mask & IN_ISDIR)) {
		settle_move(w);
		/* That may have been this event's directory: it left. */
		dir = w->wds[ev->wd];
		if (!dir)
			return;
	}

	path = join(dir->path, ev->name);
	if ((ev->mask & IN_MOVED_TO) && !(ev->mask & IN_ISDIR))
		file_move = file_move_find(w, ev->cookie);
	if (ev->mask & (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)) {
		emit_from(w, SBX_FSWATCH_ENTRY, dir, path, ev->name, ev->mask,
			  moved_from(w, ev, file_move));
		file_move_end(w, file_move);
		if (!(ev->mask & IN_ISDIR) && (ev->mask & IN_MOVED_FROM)) {
			file_move_start(w, ev->cookie, path);
		} else if ((ev->mask & IN_ISDIR) &&
			   (ev->mask & IN_MOVED_FROM)) {
			w->move_cookie = ev->cookie;
			w->move_path = path;
			w->move_since_ms = sbx_clock_mono_ms();
			path = NULL;
		} else if ((ev->mask & IN_ISDIR) && (ev->mask & IN_MOVED_TO) &&
			   w->move_path && ev->cookie == w->move_cookie) {
			dir_moved(w, w->move_path, path);
			free(w->move_path);
			w->move_path = NULL;
			w->move_cookie = 0;
		} else if ((ev->mask & IN_ISDIR) &&
			   (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
			if (add_tree(w, path, true) < 0)
				overflow(w, sbx_error_last()->msg);
		}
	} else if (ev->mask & IN_MODIFY) {
		emit(w, SBX_FSWATCH_DATA, dir, path, ev->name, ev->mask);
	} else if (ev->mask & IN_ATTRIB) {
		emit(w, SBX_FSWATCH_ATTR, dir, path, ev->name, ev->mask);
	}
	free(path);
}

/* Read and handle everything queued now: the number of events, or -1. */
static long drain(struct sbx_fswatch *w)
{
	char buf[64 * 1024]
		__attribute__((aligned(__alignof__(struct inotify_event))));
	long count = 0;

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
			const struct inotify_event *ev = (const void *)p;

			handle(w, ev);
			p += sizeof(*ev) + ev->len;
			count++;
		}
	}
	/* A move whose partner is not queued by now left the tree. */
	if (w->move_path &&
	    sbx_clock_mono_ms() - w->move_since_ms >= MOVE_SETTLE_MS)
		settle_move(w);
	return count;
}

static void *watcher(void *arg)
{
	struct sbx_fswatch *w = arg;
	struct pollfd pfd[2] = {
		{ .fd = w->ifd, .events = POLLIN },
		{ .fd = w->efd, .events = POLLIN },
	};
	bool busy = false;

	for (;;) {
		uint64_t gen, v;
		bool stop;
		long n;

		/* (A pending directory move settles once nothing comes.) */
		if (poll(pfd, 2, w->move_path ? MOVE_SETTLE_MS : -1) < 0 &&
		    errno != EINTR)
			break;
		if (busy && !(pfd[1].revents & POLLIN)) {
			/* Let a burst accumulate; a sync request cuts it. */
			poll(&pfd[1], 1, COALESCE_MS);
		}
		if (read(w->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
			break;
		pthread_mutex_lock(&w->lock);
		gen = w->req_gen;
		stop = w->stop;
		pthread_mutex_unlock(&w->lock);
		if (stop)
			break;
		n = drain(w);
		if (n < 0) {
			emit(w, SBX_FSWATCH_OVERFLOW, NULL, NULL, NULL, 0);
			break;
		}
		busy = n >= BURST_EVENTS;
		if (w->flags & SBX_FSWATCH_F_BATCH)
			emit(w, SBX_FSWATCH_BATCH, NULL, NULL, NULL, 0);
		pthread_mutex_lock(&w->lock);
		if (gen > w->done_gen) {
			w->done_gen = gen;
			pthread_cond_broadcast(&w->cond);
		}
		pthread_mutex_unlock(&w->lock);
	}
	/* Wake barrier waiters: they must not hang on a dead watcher. */
	pthread_mutex_lock(&w->lock);
	w->dead = true;
	pthread_cond_broadcast(&w->cond);
	pthread_mutex_unlock(&w->lock);
	return NULL;
}

void sbx_fswatch_wake(struct sbx_fswatch *w)
{
	uint64_t one = 1;

	if (write(w->efd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is already non-zero, the thread wakes. */
	}
}

void sbx_fswatch_free(struct sbx_fswatch *w)
{
	if (!w)
		return;
	if (w->started) {
		pthread_mutex_lock(&w->lock);
		w->stop = true;
		pthread_mutex_unlock(&w->lock);
		sbx_fswatch_wake(w);
		pthread_join(w->thread, NULL);
	}
	for (size_t i = 0; i < w->nwds; i++)
		drop_wd(w, (int)i);
	free(w->wds);
	free(w->move_path);
	for (int i = 0; i < MOVES_PENDING; i++)
		free(w->moves[i].path);
	free(w->swap_from);
	free(w->swap_to);
	if (w->ifd >= 0)
		close(w->ifd);
	if (w->efd >= 0)
		close(w->efd);
	pthread_mutex_destroy(&w->lock);
	pthread_cond_destroy(&w->cond);
	free(w->root);
	free(w);
}

int sbx_fswatch_new(struct sbx_fswatch **out, const char *root,
		    sbx_fswatch_cb cb, void *payload)
{
	return sbx_fswatch_new_flags(out, root, 0, cb, payload);
}

int sbx_fswatch_new_flags(struct sbx_fswatch **out, const char *root,
			  unsigned flags, sbx_fswatch_cb cb, void *payload)
{
	struct sbx_fswatch *w;
	struct stat st;
	int rc;

	*out = NULL;
	SBX_ASSERT_ARG(root && cb);
	/* add_tree() forgives directories that vanish; the root must not. */
	if (stat(root, &st) < 0)
		return sbx_error_os("watch %s", root);
	if (!S_ISDIR(st.st_mode))
		return sbx_error_set(SBX_ERR_OS, -ENOTDIR,
				     "watch %s: not a directory", root);
	w = sbx_xcalloc(1, sizeof(*w));
	w->swap_wd = -1;
	w->root = sbx_xstrdup(root);
	w->flags = flags;
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
	rc = add_tree(w, "", false);
	if (rc < 0)
		goto fail;
	rc = -pthread_create(&w->thread, NULL, watcher, w);
	if (rc < 0) {
		rc = sbx_error_set(SBX_ERR_OS, rc, "cannot start watcher");
		goto fail;
	}
	w->started = true;
	*out = w;
	return 0;
fail:
	sbx_fswatch_free(w);
	return rc;
}

int sbx_fswatch_sync(struct sbx_fswatch *w, int timeout_ms)
{
	struct timespec deadline;
	uint64_t gen;
	int rc = 0;

	/* The condition variable waits on CLOCK_REALTIME (its default). */
	deadline = sbx_clock_deadline(CLOCK_REALTIME, timeout_ms);
	pthread_mutex_lock(&w->lock);
	gen = ++w->req_gen;
	sbx_fswatch_wake(w);
	while (rc == 0 && w->done_gen < gen && !w->dead) {
		if (pthread_cond_timedwait(&w->cond, &w->lock, &deadline) ==
		    ETIMEDOUT)
			rc = sbx_error_set(SBX_ERR_INTERNAL, -ETIMEDOUT,
					   "change stream did not catch up "
					   "within %d ms",
					   timeout_ms);
	}
	if (rc == 0 && w->done_gen < gen)
		rc = sbx_error_set(SBX_ERR_INTERNAL, -EIO,
				   "change stream stopped");
	pthread_mutex_unlock(&w->lock);
	return rc;
}

bool sbx_fswatch_entry_stat(const struct sbx_fswatch_event *ev,
			    const char *root, struct stat *st)
{
	char *full;
	bool ok;

	memset(st, 0, sizeof(*st));
	if (ev->kind != SBX_FSWATCH_ENTRY || !ev->path ||
	    (ev->mask & (IN_DELETE | IN_MOVED_FROM)) ||
	    ((ev->mask & IN_ISDIR) && !ev->from))
		return false;
	full = sbx_xasprintf("%s/%s", root, ev->path);
	ok = lstat(full, st) == 0;
	free(full);
	if (!ok)
		memset(st, 0, sizeof(*st));
	return ok;
}
