/*
 * Open files and their write-back buffers; see cache_i.h.
 *
 * Each open file buffers one contiguous extent of writes (sequential
 * writes of a file being saved or generated become one request).  The
 * extent is pushed to the sandbox on close (FLUSH), fsync, RELEASE, when a
 * write does not continue it or would overflow it, before anything that
 * must see the file's real size (getattr, read, setattr), at the exec
 * barrier (syncfs), and at the latest CACHE_WB_EXPIRE after its first byte
 * by the flusher thread -- so a daemon killed with -9 loses at most about a
 * second of acknowledged writes, as a kernel page cache would lose its
 * dirty pages.
 *
 * Errors stay with the data.  A push that fails, whoever asked for it (a
 * stat of another process, a child's close of an inherited descriptor,
 * the flusher), keeps the unpushed bytes in the buffer: the next push
 * retries them, and the owner's fsync() or close() reports the error if it
 * still fails.  Only the final RELEASE, after the owner's close() has
 * already been told through FLUSH, drops bytes that cannot be pushed (and
 * logs it).  A file is on c->dirty from its first buffered byte until a
 * push has delivered everything, including while a push is in flight, so
 * that wb_push_node() waits for in-flight pushes (through wlock) and never
 * lets a getattr read the sandbox's size before the data is there.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "cache_i.h"

struct cfile *wb_file_new(struct cnode *n, int flags)
{
	struct cfile *f = sbx_xcalloc(1, sizeof(*f));

	f->node = n;
	f->flags = flags;
	f->refs = 1;
	pthread_mutex_init(&f->wlock, NULL);
	return f;
}

void wb_file_get(struct cfile *f)
{
	f->refs++;
}

void wb_file_put(struct cache *c, struct cfile *f)
{
	bool last;

	cache_lock(c);
	last = --f->refs == 0;
	cache_unlock(c);
	if (!last)
		return;
	free(f->buf);
	pthread_mutex_destroy(&f->wlock);
	free(f);
}

int wb_io_begin(struct cache *c, struct cfile *f, struct cache_io *io)
{
	struct sbx_open_result res;
	char *path;
	int rc;

	io->node = NULL;
	io->fh = NULL;
	cache_lock(c);
	path = tree_path_of(f->node);
	cache_unlock(c);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "file was replaced while open");
	rc = cache_inner_node(c, path, &io->node);
	free(path);
	if (rc < 0)
		return rc;
	memset(&res, 0, sizeof(res));
	rc = c->inner->ops->open(c->inner, io->node,
				 f->flags & ~(O_CREAT | O_EXCL | O_TRUNC),
				 &res);
	if (rc < 0) {
		c->inner->ops->forget(c->inner, io->node);
		io->node = NULL;
		return rc;
	}
	io->fh = res.fh;
	return 0;
}

void wb_io_end(struct cache *c, struct cache_io *io)
{
	if (io->fh)
		(void)c->inner->ops->release(c->inner, io->fh);
	if (io->node)
		c->inner->ops->forget(c->inner, io->node);
	io->fh = NULL;
	io->node = NULL;
}

/* c->lock held. */
static void dirty_add(struct cache *c, struct cfile *f)
{
	if (f->on_dirty)
		return;
	f->dnext = c->dirty;
	f->dprev = NULL;
	if (c->dirty)
		c->dirty->dprev = f;
	c->dirty = f;
	f->on_dirty = true;
	f->dirty_since = cache_now();
	f->node->dirty++;
}

/* c->lock held. */
static void dirty_del(struct cache *c, struct cfile *f)
{
	if (!f->on_dirty)
		return;
	if (f->dprev)
		f->dprev->dnext = f->dnext;
	else
		c->dirty = f->dnext;
	if (f->dnext)
		f->dnext->dprev = f->dprev;
	f->dnext = f->dprev = NULL;
	f->on_dirty = false;
	f->node->dirty--;
}

/*
 * The sandbox's file changed under the node: cached views are old.  `st`
 * (may be NULL): its attributes after the write, handed back on the side
 * and usable (struct side_call), which spares the next getattr a fetch.
 */
static void written(struct cache *c, struct cnode *n, const struct stat *st)
{
	tree_invalidate_file(n);
	/* Only under a name known to be the file's (an event may have
	 * made it UNKNOWN: a refresh would make it PRESENT again). */
	if (st && n->slot == S_PRESENT && st->st_ino == n->st.st_ino &&
	    S_ISREG(st->st_mode))
		tree_refresh_st(c, n, st);
	content_drop(c, n);
}

/* Push f's buffer.  Caller holds f->wlock. */
static int push_locked(struct cache *c, struct cfile *f)
{
	struct side_call sc;
	struct cache_io io;
	char *buf;
	size_t len, done = 0;
	off_t off;
	bool ok;
	int rc;

	cache_lock(c);
	buf = f->buf;
	len = f->buf_len;
	off = f->buf_off;
	if (len) {
		/* Taken out; the file stays on c->dirty until delivered. */
		f->buf = NULL;
		f->buf_len = 0;
	}
	cache_unlock(c);
	if (!len)
		return 0;
	rc = wb_io_begin(c, f, &io);
	side_begin(c, &sc, NULL, NULL);
	while (rc == 0 && done < len) {
		ssize_t n = c->inner->ops->write(c->inner, io.fh, buf + done,
						 len - done,
						 off + (off_t)done);

		if (n < 0)
			rc = (int)n;
		else if (n == 0)
			rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
					   "short write to the sandbox");
		else
			done += (size_t)n;
	}
	side_end(c, &sc);
	wb_io_end(c, &io);
	cache_lock(c);
	ok = side_take_locked(c, &sc) && done == len && sc.side.has_file;
	if (done)
		written(c, f->node, ok ? &sc.side.file : NULL);
	if (done == len) {
		free(buf);
		dirty_del(c, f);
	} else {
		/*
		 * Keep what did not get through; no write can have been
		 * buffered meanwhile (the caller holds wlock).  Retried by the
		 * next push; the flusher waits a full expiry first.
		 */
		memmove(buf, buf + done, len - done);
		f->buf = buf;
		f->buf_len = len - done;
		f->buf_off = off + (off_t)done;
		f->dirty_since = cache_now();
	}
	cache_unlock(c);
	return rc;
}

int wb_push_then(struct cache *c, struct cfile *f,
		 const struct sbx_write_then *then, struct stat *st,
		 bool *pushed)
{
	struct cnode *n = f->node;
	struct side_call sc;
	struct cache_io io;
	struct stat got;
	char *buf = NULL;
	size_t len = 0;
	off_t off = 0;
	bool ok, landed = false;
	int rc;

	*pushed = false;
	if (!c->inner->ops->write_then || (f->flags & O_APPEND))
		return 0;
	pthread_mutex_lock(&f->wlock);
	cache_lock(c);
	/* Only when f holds the node's only unpushed bytes. */
	if (f->buf_len && f->on_dirty && n->dirty == 1) {
		buf = f->buf;
		len = f->buf_len;
		off = f->buf_off;
		f->buf = NULL;
		f->buf_len = 0;
	}
	cache_unlock(c);
	if (!len) {
		pthread_mutex_unlock(&f->wlock);
		return 0;
	}
	rc = wb_io_begin(c, f, &io);
	side_begin(c, &sc, NULL, NULL);
	if (rc == 0)
		rc = c->inner->ops->write_then(c->inner, io.fh, buf, len, off,
					       then, &got, &landed);
	side_end(c, &sc);
	wb_io_end(c, &io);
	cache_lock(c);
	ok = side_take_locked(c, &sc) && rc == 0;
	if (landed) {
		written(c, n, ok ? &got : NULL);
		free(buf);
		dirty_del(c, f);
	} else {
		/* Nothing landed: the bytes stay for the next push. */
		f->buf = buf;
		f->buf_len = len;
		f->buf_off = off;
		f->dirty_since = cache_now();
	}
	cache_unlock(c);
	pthread_mutex_unlock(&f->wlock);
	*pushed = landed;
	if (rc == -E2BIG && !landed) {
		sbx_error_clear();
		return 0;
	}
	if (rc == 0 && st)
		*st = got;
	return rc < 0 ? rc : 1;
}

int wb_push_node_then(struct cache *c, struct cnode *n,
		      const struct sbx_write_then *then, struct stat *st,
		      bool *pushed)
{
	struct cfile *f = NULL;
	int rc;

	*pushed = false;
	cache_lock(c);
	if (n->dirty == 1)
		for (f = c->dirty; f && f->node != n; f = f->dnext)
			;
	if (f)
		wb_file_get(f);
	cache_unlock(c);
	if (!f)
		return 0;
	rc = wb_push_then(c, f, then, st, pushed);
	wb_file_put(c, f);
	return rc;
}

int wb_push(struct cache *c, struct cfile *f)
{
	int rc;

	pthread_mutex_lock(&f->wlock);
	rc = push_locked(c, f);
	pthread_mutex_unlock(&f->wlock);
	return rc;
}

/* Which dirty files to take; all of them when every field is 0. */
struct pick {
	struct cnode *n;   /* only the files of n */
	struct cnode *dir; /* only the files of dir's children */
	struct cfile *skip;
	double now;        /* > 0: only files dirty for CACHE_WB_EXPIRE */
};

/*
 * c->lock held: take a reference to every dirty file `p` picks; they go to
 * *out (malloc'd, NULL when none), and their count is returned.
 */
static size_t take_dirty(struct cache *c, const struct pick *p,
			 struct cfile ***out)
{
	struct cfile **fs = NULL;
	size_t nf = 0, cap = 0;

	for (struct cfile *f = c->dirty; f; f = f->dnext) {
		if ((p->n && f->node != p->n) ||
		    (p->dir && f->node->parent != p->dir) || f == p->skip ||
		    (p->now > 0 && p->now - f->dirty_since < CACHE_WB_EXPIRE))
			continue;
		if (nf == cap) {
			cap = cap ? cap * 2 : 8;
			fs = sbx_xrealloc(fs, cap * sizeof(*fs));
		}
		wb_file_get(f);
		fs[nf++] = f;
	}
	*out = fs;
	return nf;
}

/*
 * Take a reference to every dirty file of n, or of the children of dir
 * (every file when both are NULL) and push them one by one.  Returns the
 * first error; every file is tried.
 */
static int push_matching(struct cache *c, struct cnode *n, struct cnode *dir,
			 struct cfile *skip)
{
	struct pick p = {.n = n, .dir = dir, .skip = skip};
	struct cfile **fs;
	size_t nf;
	int rc = 0;

	cache_lock(c);
	nf = take_dirty(c, &p, &fs);
	cache_unlock(c);
	for (size_t i = 0; i < nf; i++) {
		int r = wb_push(c, fs[i]);

		if (r < 0 && rc == 0)
			rc = r;
		wb_file_put(c, fs[i]);
	}
	free(fs);
	return rc;
}

int wb_push_node(struct cache *c, struct cnode *n)
{
	return push_matching(c, n, NULL, NULL);
}

int wb_push_dir(struct cache *c, struct cnode *dir)
{
	return push_matching(c, NULL, dir, NULL);
}

int wb_push_all(struct cache *c)
{
	return push_matching(c, NULL, NULL, NULL);
}

ssize_t wb_write(struct cache *c, struct cfile *f, const void *data,
		 size_t size, off_t off)
{
	ssize_t ret = (ssize_t)size;
	bool others = false;
	int rc;

	/*
	 * Writes through several descriptors of one file must reach the
	 * sandbox in the order they were made, and an O_APPEND write must
	 * land after them: push the other descriptors' buffers first, so at
	 * most one descriptor of a file holds unpushed bytes.  (Not under
	 * f->wlock: two wlocks are never held at once.)
	 */
	cache_lock(c);
	/* node->dirty counts its descriptors on c->dirty, f among them or not. */
	others = f->node->dirty > (f->on_dirty ? 1u : 0u);
	cache_unlock(c);
	if (others) {
		rc = push_matching(c, f->node, NULL, f);
		if (rc < 0)
			return rc;
	}
	pthread_mutex_lock(&f->wlock);
	/* Appends must land at the real end: do not reorder them. */
	if (f->flags & O_APPEND) {
		struct cache_io io;

		rc = push_locked(c, f);
		if (rc == 0)
			rc = wb_io_begin(c, f, &io);
		ret = rc < 0 ? rc
			     : c->inner->ops->write(c->inner, io.fh, data,
						    size, off);
		if (rc == 0)
			wb_io_end(c, &io);
		cache_lock(c);
		written(c, f->node, NULL);
		cache_unlock(c);
		goto out;
	}
	if (f->buf_len &&
	    (off != f->buf_off + (off_t)f->buf_len ||
	     f->buf_len + size > CACHE_WRITE_BUF)) {
		rc = push_locked(c, f);
		if (rc < 0) {
			ret = rc;
			goto out;
		}
	}
	cache_lock(c);
	if (!f->buf_len) {
		free(f->buf);
		f->buf = sbx_xmalloc(CACHE_WRITE_BUF > size ? CACHE_WRITE_BUF
							    : size);
		f->buf_off = off;
		dirty_add(c, f);
	}
	memcpy(f->buf + f->buf_len, data, size);
	f->buf_len += size;
	content_drop(c, f->node);
	cache_unlock(c);
out:
	pthread_mutex_unlock(&f->wlock);
	return ret;
}

int wb_release(struct cache *c, struct cfile *f)
{
	int rc = wb_push(c, f);

	if (rc < 0) {
		char why[512];

		snprintf(why, sizeof(why), "%s",
			 *sbx_error_last()->msg ? sbx_error_last()->msg
						: strerror(-rc));
		/*
		 * The owner's close() was told through FLUSH; nobody is left
		 * to tell now.  Say it in the log rather than keep retrying
		 * for a file no one has open.
		 */
		pthread_mutex_lock(&f->wlock);
		cache_lock(c);
		if (f->buf_len) {
			char *p = tree_path_of(f->node);

			sbx_warn("dropping %zu unwritten bytes of '%s' at its "
				 "last close: %s",
				 f->buf_len, p ? p : "?", why);
			free(p);
			free(f->buf);
			f->buf = NULL;
			f->buf_len = 0;
			dirty_del(c, f);
			written(c, f->node, NULL);
		}
		cache_unlock(c);
		pthread_mutex_unlock(&f->wlock);
	}
	silly_drop_open(c, f);
	cache_lock(c);
	f->released = true;
	cache_unlock(c);
	wb_file_put(c, f);
	return rc;
}

/* ---- the flusher --------------------------------------------------------- */

static void deadline_in(struct timespec *ts, long ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_nsec += ms * 1000000L;
	ts->tv_sec += ts->tv_nsec / 1000000000L;
	ts->tv_nsec %= 1000000000L;
}

static void *flusher_main(void *arg)
{
	struct cache *c = arg;
	bool warned = false;

	cache_lock(c);
	while (!c->stopping) {
		struct timespec until;
		struct pick p = {0};
		struct cfile **due;
		size_t n;

		deadline_in(&until, CACHE_WB_TICK_MS);
		pthread_cond_timedwait(&c->flusher_cond, &c->lock, &until);
		if (c->stopping)
			break;
		p.now = cache_now();
		n = take_dirty(c, &p, &due);
		cache_unlock(c);
		for (size_t i = 0; i < n; i++) {
			int rc = wb_push(c, due[i]);

			if (rc < 0) {
				/* Kept and retried; the owner will be told. */
				if (!warned)
					sbx_warn("write-back failed, will "
						 "retry: %s",
						 sbx_error_last()->msg);
				warned = true;
				sbx_error_clear();
			} else if (rc == 0 && warned) {
				sbx_info("write-back works again");
				warned = false;
			}
			wb_file_put(c, due[i]);
		}
		free(due);
		cache_lock(c);
	}
	cache_unlock(c);
	return NULL;
}

int wb_start_flusher(struct cache *c)
{
	pthread_condattr_t ca;
	int rc;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->flusher_cond, &ca);
	pthread_condattr_destroy(&ca);
	rc = pthread_create(&c->flusher, NULL, flusher_main, c);
	if (rc != 0)
		return sbx_error_set(SBX_ERR_OS, -rc,
				     "cannot start the write-back thread");
	c->flusher_running = true;
	return 0;
}

void wb_stop_flusher(struct cache *c)
{
	if (!c->flusher_running)
		return;
	cache_lock(c);
	c->stopping = true;
	pthread_cond_broadcast(&c->flusher_cond);
	cache_unlock(c);
	pthread_join(c->flusher, NULL);
	c->flusher_running = false;
}
