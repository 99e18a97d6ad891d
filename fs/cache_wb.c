/*
 * Open files and their write-back buffers; see cache_i.h.
 *
 * Each open file buffers its writes as sorted extents (touching or
 * overlapping writes merge, so sequential writes of a file being saved or
 * generated become one request; a linker's scattered pwrites become a few).
 * They are pushed to the sandbox, one write request per extent, on close
 * (FLUSH), fsync, RELEASE, when a write would take the buffer past
 * CACHE_WRITE_BUF bytes or CACHE_WB_EXTENTS extents, before anything that
 * must see the file's real state (setattr, other descriptors' writes,
 * reads and getattr the local image cannot answer), at the exec barrier
 * (syncfs), and at the latest CACHE_WB_EXPIRE after its first byte by the
 * flusher thread -- so a daemon killed with -9 loses at most about a
 * second of acknowledged writes, as a kernel page cache would lose its
 * dirty pages.
 *
 * The local image.  When the file's whole content is known as its first
 * unpushed byte is buffered (its cached content is valid and in memory, or
 * it is empty: created through this mount), reads and getattr of the file
 * are answered from that content overlaid with the extents, without a
 * push: a linker writing and reading back its output costs one push at
 * close instead of a push, a stat and a read per write.  Any change event
 * for the file (someone else wrote it, renamed it, an overflow) makes the
 * image unknown, and the old rule (push, then ask the sandbox) applies.
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

static void ext_free(struct wb_ext *e, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(e[i].data);
	free(e);
}

/* Drop every buffered extent (wlock and c->lock held, or last ref). */
static void ext_free_all(struct cfile *f)
{
	ext_free(f->ext, f->next);
	f->ext = NULL;
	f->next = f->ext_cap = 0;
	f->buf_len = 0;
}

static void img_forget(struct cfile *f)
{
	free(f->img_base);
	f->img_base = NULL;
	f->img_base_len = 0;
	f->img = false;
}

/*
 * Add a write of size bytes at off to f's extents, merging it with every
 * extent it overlaps or touches (its bytes win).  wlock and c->lock held.
 */
static void ext_add(struct cfile *f, const void *data, size_t size, off_t off)
{
	off_t end = off + (off_t)size, lo = off, hi = end;
	size_t first, last, len;
	struct wb_ext *e;

	/* Extents [first, last) overlap or touch [off, end). */
	for (first = 0; first < f->next &&
			f->ext[first].off + (off_t)f->ext[first].len < off;
	     first++)
		;
	for (last = first; last < f->next && f->ext[last].off <= end; last++)
		;
	if (first == last) {
		if (f->next == f->ext_cap) {
			f->ext_cap = f->ext_cap ? f->ext_cap * 2 : 4;
			f->ext = sbx_xrealloc(f->ext,
					      f->ext_cap * sizeof(*f->ext));
		}
		memmove(f->ext + first + 1, f->ext + first,
			(f->next - first) * sizeof(*f->ext));
		f->next++;
		e = &f->ext[first];
		e->off = off;
		e->len = e->cap = size;
		e->data = sbx_xmalloc(size ? size : 1);
		memcpy(e->data, data, size);
		f->buf_len += size;
		return;
	}
	if (f->ext[first].off < lo)
		lo = f->ext[first].off;
	if (f->ext[last - 1].off + (off_t)f->ext[last - 1].len > hi)
		hi = f->ext[last - 1].off + (off_t)f->ext[last - 1].len;
	len = (size_t)(hi - lo);
	e = &f->ext[first];
	if (e->off != lo) {
		/* The write starts before the first: a new buffer. */
		char *d = sbx_xmalloc(len);

		memcpy(d + (e->off - lo), e->data, e->len);
		free(e->data);
		e->data = d;
		e->cap = len;
		e->off = lo;
	} else if (e->cap < len) {
		/* Grows geometrically: sequential writes append cheaply. */
		e->cap = len > 2 * e->cap ? len : 2 * e->cap;
		e->data = sbx_xrealloc(e->data, e->cap);
	}
	f->buf_len -= e->len;
	for (size_t i = first + 1; i < last; i++) {
		memcpy(e->data + (f->ext[i].off - lo), f->ext[i].data,
		       f->ext[i].len);
		f->buf_len -= f->ext[i].len;
		free(f->ext[i].data);
	}
	memcpy(e->data + (off - lo), data, size);
	e->len = len;
	f->buf_len += len;
	memmove(f->ext + first + 1, f->ext + last,
		(f->next - last) * sizeof(*f->ext));
	f->next -= last - first - 1;
}

void wb_file_put(struct cache *c, struct cfile *f)
{
	bool last;

	cache_lock(c);
	last = --f->refs == 0;
	cache_unlock(c);
	if (!last)
		return;
	ext_free_all(f);
	img_forget(f);
	pthread_mutex_destroy(&f->wlock);
	free(f);
}

int wb_io_begin(struct cache *c, struct cfile *f, struct cache_io *io)
{
	return wb_io_begin_flags(c, f, f->flags, io);
}

int wb_io_begin_flags(struct cache *c, struct cfile *f, int flags,
		      struct cache_io *io)
{
	struct sbx_open_result res;
	char *path;
	int rc;

	ino_t ino;

	io->node = NULL;
	io->fh = NULL;
	cache_lock(c);
	path = tree_path_of(f->node);
	ino = f->ino;
	cache_unlock(c);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "file was replaced while open");
	rc = cache_inner_node_ino(c, path, ino, &io->node);
	free(path);
	if (rc < 0)
		return rc;
	memset(&res, 0, sizeof(res));
	rc = c->inner->ops->open(c->inner, io->node,
				 flags & ~(O_CREAT | O_EXCL | O_TRUNC), &res);
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

static struct cfile *img_of(struct cache *c, struct cnode *n);

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
	/* Every name's: a read through another one must not see old bytes. */
	content_drop_file(c, n);
}

/*
 * Before a push (wlock and c->lock held, img_of(f->node) == f): fill the
 * gaps of up to CACHE_WB_GAP between extents from the image, so that the
 * push writes one extent where the writes left several (a linker skips
 * its alignment padding).  The bytes filled in are what the file holds
 * there (our image says so), so writing them changes nothing else.
 */
static void img_fill_gaps(struct cfile *f)
{
	size_t i = 0;

	while (i + 1 < f->next) {
		struct wb_ext *a = &f->ext[i], *b = &f->ext[i + 1];
		off_t gap_lo = a->off + (off_t)a->len, gap = b->off - gap_lo;
		size_t len;

		if (gap > (off_t)CACHE_WB_GAP ||
		    f->buf_len + (size_t)gap > CACHE_WRITE_BUF) {
			i++;
			continue;
		}
		len = a->len + (size_t)gap + b->len;
		if (a->cap < len) {
			a->cap = len;
			a->data = sbx_xrealloc(a->data, len);
		}
		memset(a->data + a->len, 0, (size_t)gap);
		if (gap_lo < (off_t)f->img_base_len) {
			off_t hi = b->off < (off_t)f->img_base_len
					   ? b->off
					   : (off_t)f->img_base_len;

			memcpy(a->data + a->len, f->img_base + gap_lo,
			       (size_t)(hi - gap_lo));
		}
		memcpy(a->data + a->len + gap, b->data, b->len);
		a->len = len;
		f->buf_len += (size_t)gap;
		free(b->data);
		memmove(f->ext + i + 1, f->ext + i + 2,
			(f->next - i - 2) * sizeof(*f->ext));
		f->next--;
	}
}

/*
 * Take f's extents out for a push (wlock and c->lock held): gaps filled
 * first when f holds the node's image, which goes with them (once pushed,
 * the sandbox has the file and its own attributes).  The file stays on
 * c->dirty until they are delivered.  Returns how many (*ext set).
 */
static size_t ext_take(struct cache *c, struct cfile *f, struct wb_ext **ext)
{
	size_t next;

	if (f->next > 1 && img_of(c, f->node) == f)
		img_fill_gaps(f);
	*ext = f->ext;
	next = f->next;
	if (next) {
		f->ext = NULL;
		f->next = f->ext_cap = 0;
		f->buf_len = 0;
		img_forget(f);
	}
	return next;
}

/*
 * Put back what a push did not deliver (wlock and c->lock held): extent i
 * of ext[0..next) from byte `done` on, and the ones after it.  No write
 * can have been buffered meanwhile (the caller holds wlock).  Retried by
 * the next push; the flusher waits a full expiry first.
 */
static void ext_keep(struct cfile *f, struct wb_ext *ext, size_t next,
		     size_t i, size_t done)
{
	struct wb_ext *e = &ext[i];

	memmove(e->data, e->data + done, e->len - done);
	e->off += (off_t)done;
	e->len -= done;
	for (size_t j = 0; j < i; j++)
		free(ext[j].data);
	memmove(ext, ext + i, (next - i) * sizeof(*ext));
	f->ext = ext;
	f->next = f->ext_cap = next - i;
	for (size_t j = 0; j < f->next; j++)
		f->buf_len += ext[j].len;
	f->dirty_since = cache_now();
}

/*
 * Write one extent through io; returns the bytes delivered (*rc set on
 * failure).  No lock held.
 */
static size_t push_extent(struct cache *c, struct cache_io *io,
			  const struct wb_ext *e, int *rc)
{
	size_t done = 0;

	while (*rc == 0 && done < e->len) {
		ssize_t n = c->inner->ops->write(c->inner, io->fh,
						 e->data + done, e->len - done,
						 e->off + (off_t)done);

		if (n < 0)
			*rc = (int)n;
		else if (n == 0)
			*rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
					    "short write to the sandbox");
		else
			done += (size_t)n;
	}
	return done;
}

static int then_pset_locked(struct cache *c, struct cfile *f);

/*
 * The held setattr of f could not be done (c->lock held): dropped, and
 * its error kept for f's owner, whose next flush or fsync reports it
 * (wb_held_error).  Whoever pushed -- the flusher, a barrier, another
 * process -- did not ask for it and is not told.
 */
static void pset_failed_locked(struct cfile *f, int rc,
			       const struct sbx_error *why)
{
	f->pset_valid = 0;
	if (f->pset_err.code)
		return; /* the first one is reported */
	f->pset_err = *why;
	f->pset_err.code = rc;
	if (f->pset_err.klass == SBX_ERR_NONE)
		f->pset_err.klass = SBX_ERR_REMOTE;
	if (!*why->msg)
		snprintf(f->pset_err.msg, sizeof(f->pset_err.msg), "%s",
			 strerror(-rc));
}

/*
 * Push f's extents, in offset order, one write request each, and then the
 * setattr held with them (in one write_then exchange when they fit).  The
 * setattr goes through the same open file before the file leaves c->dirty,
 * so until the sandbox has both a stat answers from the local image.
 * Caller holds f->wlock.  Errors are the bytes': see pset_failed_locked.
 */
static int push_locked(struct cache *c, struct cfile *f)
{
	struct side_call sc;
	struct cache_io io;
	struct wb_ext *ext;
	struct stat pin, pst;
	struct sbx_error why, failed;
	size_t next, i = 0, done = 0, sent = 0;
	int pvalid, prc = 0;
	bool fresh, ok;
	int rc;

	if (f->pset_valid) {
		rc = then_pset_locked(c, f);
		if (rc != 0)
			return rc < 0 ? rc : 0;
	}
	cache_lock(c);
	next = ext_take(c, f, &ext);
	pvalid = f->pset_valid;
	pin = f->pset_in;
	cache_unlock(c);
	if (!next && !pvalid)
		return 0;
	rc = wb_io_begin(c, f, &io);
	side_begin(c, &sc, NULL, NULL);
	for (; rc == 0 && i < next; i++) {
		done = push_extent(c, &io, &ext[i], &rc);
		sent += done;
		if (rc < 0)
			break;
	}
	if (rc == 0 && pvalid) {
		sbx_error_clear();
		prc = c->inner->ops->setattr(c->inner, io.node, io.fh, &pin,
					     pvalid, &pst);
		why = *sbx_error_last();
		sbx_error_clear();
	}
	/* What failed, before the release and the unlock's jobs run. */
	failed = *sbx_error_last();
	side_end(c, &sc);
	wb_io_end(c, &io);
	cache_lock(c);
	/* The last write's answer describes the file after all of them. */
	fresh = side_take_locked(c, &sc);
	ok = fresh && i == next && sc.side.has_file;
	change_own_done(c);
	if (rc == 0 && pvalid) {
		/* Its answer describes the file after the bytes and it. */
		if (prc < 0)
			pset_failed_locked(f, prc, &why);
		else
			sc.side.file = pst;
		ok = fresh && prc == 0;
		f->pset_valid = 0;
	}
	if (sent || (rc == 0 && pvalid))
		written(c, f->node, ok ? &sc.side.file : NULL);
	/* (A held setattr stays on the list until it is sent.) */
	if (i == next && (rc == 0 || !pvalid)) {
		ext_free(ext, next);
		dirty_del(c, f);
	} else if (i < next) {
		/* Not delivered: the bytes and a held setattr stay. */
		ext_keep(f, ext, next, i, done);
	}
	cache_unlock(c);
	return rc < 0 && failed.code == rc ? sbx_error_restore(&failed) : rc;
}

/* wb_push_then() with f->wlock held. */
static int then_locked(struct cache *c, struct cfile *f,
		       const struct sbx_write_then *then, struct stat *st,
		       bool *pushed)
{
	struct cnode *n = f->node;
	struct side_call sc;
	struct cache_io io;
	struct stat got;
	struct wb_ext *ext = NULL;
	struct sbx_error why;
	size_t next = 0;
	bool ok, landed = false;
	int rc;

	*pushed = false;
	if (!c->inner->ops->write_then || (f->flags & O_APPEND))
		return 0;
	cache_lock(c);
	/* Only when f holds the node's only unpushed bytes, in one extent
	 * (gaps filled from the image first). */
	if (f->next && f->on_dirty && tree_file_dirty(n) == 1) {
		if (f->next > 1 && img_of(c, n) == f)
			img_fill_gaps(f);
		if (f->next == 1)
			next = ext_take(c, f, &ext);
	}
	cache_unlock(c);
	if (!next)
		return 0;
	rc = wb_io_begin(c, f, &io);
	side_begin(c, &sc, NULL, NULL);
	if (rc == 0)
		rc = c->inner->ops->write_then(c->inner, io.fh, ext[0].data,
					       ext[0].len, ext[0].off, then,
					       &got, &landed);
	/* What failed, before the release and the unlock's jobs run. */
	why = *sbx_error_last();
	side_end(c, &sc);
	wb_io_end(c, &io);
	cache_lock(c);
	ok = side_take_locked(c, &sc) && rc == 0;
	change_own_done(c);
	if (landed) {
		written(c, n, ok ? &got : NULL);
		ext_free(ext, next);
		dirty_del(c, f);
	} else {
		/* Nothing landed: the bytes stay for the next push. */
		ext_keep(f, ext, next, 0, 0);
	}
	cache_unlock(c);
	*pushed = landed;
	if (rc == -E2BIG && !landed) {
		sbx_error_clear();
		return 0;
	}
	if (rc < 0)
		return sbx_error_setd(why.klass ? why.klass : SBX_ERR_REMOTE,
				      rc, why.detail, "%s",
				      *why.msg ? why.msg : strerror(-rc));
	if (st)
		*st = got;
	return 1;
}

/*
 * f's bytes and the setattr held with them in one write_then exchange
 * (wlock held).  1: both pushed (a failed setattr is kept for the owner);
 * 0: they do not fit one exchange (push_locked sends them in turn);
 * -errno: the bytes were not delivered, and both stay held.
 */
static int then_pset_locked(struct cache *c, struct cfile *f)
{
	struct sbx_write_then then = { .kind = SBX_THEN_SETATTR };
	struct stat in;
	bool pushed;
	int rc;

	cache_lock(c);
	in = f->pset_in;
	then.valid = f->pset_valid;
	cache_unlock(c);
	then.in = &in;
	rc = then_locked(c, f, &then, NULL, &pushed);
	if (rc == 0 || (rc < 0 && !pushed))
		return rc;
	cache_lock(c);
	if (rc < 0) {
		pset_failed_locked(f, rc, sbx_error_last());
		sbx_error_clear();
	}
	f->pset_valid = 0;
	cache_unlock(c);
	return 1;
}

/* Hold a setattr with f's unpushed bytes (see cache_i.h; locks held). */
static void pset_merge(struct cfile *f, const struct stat *in, int valid)
{
	const int atime = SBX_SET_ATIME | SBX_SET_ATIME_NOW;
	const int mtime = SBX_SET_MTIME | SBX_SET_MTIME_NOW;
	struct timespec now;

	clock_gettime(CLOCK_REALTIME, &now);
	if (valid & SBX_SET_MODE) {
		f->pset_in.st_mode = in->st_mode;
		f->img_st.st_mode = (f->img_st.st_mode & S_IFMT) |
				    (in->st_mode & 07777);
	}
	if (valid & SBX_SET_UID)
		f->pset_in.st_uid = f->img_st.st_uid = in->st_uid;
	if (valid & SBX_SET_GID)
		f->pset_in.st_gid = f->img_st.st_gid = in->st_gid;
	if (valid & SBX_SET_ATIME) {
		f->pset_valid &= ~atime;
		f->pset_in.st_atim = in->st_atim;
		f->img_st.st_atim = (valid & SBX_SET_ATIME_NOW) ? now
							       : in->st_atim;
	}
	if (valid & SBX_SET_MTIME) {
		f->pset_valid &= ~mtime;
		f->pset_in.st_mtim = in->st_mtim;
		f->img_st.st_mtim = (valid & SBX_SET_MTIME_NOW) ? now
							       : in->st_mtim;
	}
	/* ctime follows any change; the sandbox sets its own. */
	f->pset_valid |= valid & ~SBX_SET_CTIME;
	f->img_st.st_ctim = now;
}

/* The attributes of n as f's image says (c->lock held, img_of(n) == f). */
static void img_stat(struct cnode *n, const struct cfile *f, struct stat *st)
{
	*st = f->img_st;
	st->st_size = f->img_size;
	/* Not allocated yet; the sandbox will say once pushed. */
	if ((off_t)st->st_blocks * 512 < f->img_size)
		st->st_blocks = (f->img_size + 511) / 512;
	st->st_nlink = tree_visible_nlink(n, st->st_nlink);
}

bool wb_defer_setattr(struct cache *c, struct cnode *n, const struct stat *in,
		      int valid, struct stat *out)
{
	const int held = SBX_SET_MODE | SBX_SET_UID | SBX_SET_GID |
			 SBX_SET_ATIME | SBX_SET_MTIME | SBX_SET_ATIME_NOW |
			 SBX_SET_MTIME_NOW | SBX_SET_CTIME;
	struct cfile *f;
	bool done = false;

	if ((valid & ~held) || !(valid & held & ~SBX_SET_CTIME) ||
	    !c->inner->ops->write_then)
		return false;
	cache_lock(c);
	f = img_of(c, n);
	if (f)
		wb_file_get(f);
	cache_unlock(c);
	if (!f)
		return false;
	pthread_mutex_lock(&f->wlock);
	cache_lock(c);
	/*
	 * Still the holder of n's only unpushed bytes and their image, of
	 * the file's only name (another name's attributes would not show
	 * it).  A chown is held only when it changes nothing (tar's, as
	 * the owner): one that gives the file away can fail on its own in
	 * the sandbox (an agent that is not root), and chown(2)'s caller
	 * must hear it.
	 */
	if (img_of(c, n) == f && !(f->flags & O_APPEND) && !n->in_ring &&
	    f->img_st.st_nlink <= 1 &&
	    (!(valid & SBX_SET_UID) || in->st_uid == f->img_st.st_uid) &&
	    (!(valid & SBX_SET_GID) || in->st_gid == f->img_st.st_gid)) {
		/*
		 * That chown is not sent at all: merged with a chmod it would
		 * follow it in the sandbox and clear the set-user-ID bit tar
		 * has just set.  (The kernel folds the bits a chown clears
		 * into its mode change, which is held.)
		 */
		pset_merge(f, in, valid & ~(SBX_SET_UID | SBX_SET_GID));
		img_stat(n, f, out);
		done = true;
	}
	cache_unlock(c);
	pthread_mutex_unlock(&f->wlock);
	wb_file_put(c, f);
	return done;
}

char *wb_path_now(struct cache *c, struct cnode *n, unsigned long *moves)
{
	char *p;

	cache_lock(c);
	p = tree_path_of(n);
	*moves = c->moves;
	cache_unlock(c);
	return p;
}

bool wb_io_again(struct cache *c, struct cnode *n, char *before,
		 unsigned long moves, int rc, int tries)
{
	struct sbx_error failed = *sbx_error_last();
	char *now = NULL;
	bool again = false;

	if ((rc == -ENOENT || rc == -ESTALE) && before &&
	    tries < WB_MOVED_TRIES) {
		unsigned long m;

		/* Renames through the mount move the node as they end. */
		cache_lock(c);
		cache_wait_renames_locked(c);
		now = tree_path_of(n);
		m = c->moves;
		cache_unlock(c);
		again = now && (strcmp(now, before) != 0 || m != moves);
		/* (Only a healthy stream can say where the file went.) */
		if (!again && cache_healthy(c) && change_watch_sync(c) == 0) {
			free(now);
			now = wb_path_now(c, n, &m);
			again = now && (strcmp(now, before) != 0 || m != moves);
		}
	}
	if (again)
		sbx_debug("'%s' is '%s' now (renamed): sending there", before,
			  now);
	else if (rc < 0 && failed.code == rc)
		(void)sbx_error_restore(&failed);
	free(before);
	free(now);
	return again;
}

ssize_t wb_io_retry(struct cache *c, struct cnode *n, ssize_t (*io)(void *),
		    void *arg)
{
	for (int tries = 0;; tries++) {
		unsigned long moves;
		char *before = wb_path_now(c, n, &moves);
		ssize_t rc = io(arg);

		if (!wb_io_again(c, n, before, moves, rc < 0 ? (int)rc : 0,
				 tries))
			return rc;
	}
}

struct then_args {
	struct cache *c;
	struct cfile *f;
	const struct sbx_write_then *then;
	struct stat *st;
	bool *pushed;
};

static ssize_t then_try(void *arg)
{
	struct then_args *a = arg;
	int rc = 0;

	*a->pushed = false;
	pthread_mutex_lock(&a->f->wlock);
	/* A held setattr goes first, with the bytes: the caller pushes. */
	if (!a->f->pset_valid)
		rc = then_locked(a->c, a->f, a->then, a->st, a->pushed);
	pthread_mutex_unlock(&a->f->wlock);
	return rc;
}

int wb_push_then(struct cache *c, struct cfile *f,
		 const struct sbx_write_then *then, struct stat *st,
		 bool *pushed)
{
	struct then_args a = { c, f, then, st, pushed };

	return (int)wb_io_retry(c, f->node, then_try, &a);
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

struct push_args {
	struct cache *c;
	struct cfile *f;
};

static ssize_t push_try(void *arg)
{
	struct push_args *a = arg;
	int rc;

	pthread_mutex_lock(&a->f->wlock);
	rc = push_locked(a->c, a->f);
	pthread_mutex_unlock(&a->f->wlock);
	return rc;
}

int wb_push(struct cache *c, struct cfile *f)
{
	struct push_args a = { c, f };

	return (int)wb_io_retry(c, f->node, push_try, &a);
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
/*
 * Is a name of n's file (n, or another name of a hard-linked n) the node
 * `want`, or a child of `dir`?  The kernel's one inode of a hard-linked
 * file holds one of its names, and its open files count there: bytes
 * buffered through it belong to the file under every name (a listing
 * hands out the size of each).  c->lock held.
 */
static bool file_named(const struct cnode *n, const struct cnode *want,
		       const struct cnode *dir)
{
	tree_for_each_name(a, n)
		/* A removed name of it is no child of dir's any more. */
		if (a == want ||
		    (dir && a->parent == dir && a->slot != S_ABSENT))
			return true;
	return false;
}

static size_t take_dirty(struct cache *c, const struct pick *p,
			 struct cfile ***out)
{
	struct cfile **fs = NULL;
	size_t nf = 0, cap = 0;

	for (struct cfile *f = c->dirty; f; f = f->dnext) {
		if ((p->n && !file_named(f->node, p->n, NULL)) ||
		    (p->dir && !file_named(f->node, NULL, p->dir)) ||
		    f == p->skip ||
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

/*
 * f's first unpushed byte is being buffered (c->lock held, f on c->dirty):
 * take the local image if the file's whole content is known now -- its
 * cached content valid and in memory (an empty file created here has an
 * empty one, see c_create), no other descriptor holding unpushed bytes,
 * and a healthy change stream to tell us if someone else changes it.
 */
static void img_take(struct cache *c, struct cfile *f)
{
	struct cnode *n = f->node;

	img_forget(f);
	if (tree_file_dirty(n) != 1 || !cache_healthy(c) ||
	    !S_ISREG(n->st.st_mode) ||
	    !content_valid(n) || !n->content->data)
		return;
	f->img_base_len = n->content->len;
	f->img_base = sbx_xmalloc(f->img_base_len ? f->img_base_len : 1);
	memcpy(f->img_base, n->content->data, f->img_base_len);
	f->img_size = (off_t)f->img_base_len;
	f->img_st = n->st;
	f->img_chg = n->chg;
	f->img = true;
}

/* A write ending at end went into the image (c->lock held). */
static void img_wrote(struct cfile *f, off_t end)
{
	struct timespec now;

	if (end > f->img_size)
		f->img_size = end;
	/* What the kernel shows after a write: both times are now. */
	clock_gettime(CLOCK_REALTIME, &now);
	f->img_st.st_mtim = now;
	f->img_st.st_ctim = now;
}

/* c->lock held: the dirty file of n whose local image is good, or NULL. */
static struct cfile *img_of(struct cache *c, struct cnode *n)
{
	if (tree_file_dirty(n) != 1 || !n->st_valid || !cache_healthy(c))
		return NULL;
	for (struct cfile *f = c->dirty; f; f = f->dnext)
		if (f->node == n)
			return f->img && f->buf_len && f->img_chg == n->chg
				       ? f
				       : NULL;
	return NULL;
}

bool wb_local_getattr(struct cache *c, struct cnode *n, struct stat *st)
{
	struct cfile *f;

	cache_lock(c);
	f = img_of(c, n);
	if (f)
		img_stat(n, f, st);
	cache_unlock(c);
	return f != NULL;
}

ssize_t wb_local_read(struct cache *c, struct cnode *n, void *buf,
		      size_t size, off_t off)
{
	struct cfile *f;
	off_t end;

	if (off < 0)
		return -1;
	cache_lock(c);
	f = img_of(c, n);
	if (!f) {
		cache_unlock(c);
		return -1;
	}
	if (off >= f->img_size) {
		cache_unlock(c);
		return 0;
	}
	if ((off_t)size > f->img_size - off)
		size = (size_t)(f->img_size - off);
	end = off + (off_t)size;
	/* The content it had, zeros past its end (holes read as zeros)... */
	memset(buf, 0, size);
	if (off < (off_t)f->img_base_len)
		memcpy(buf, f->img_base + off,
		       (size_t)((off_t)f->img_base_len < end
					? (off_t)f->img_base_len - off
					: end - off));
	/* ...under our writes. */
	for (size_t i = 0; i < f->next; i++) {
		const struct wb_ext *e = &f->ext[i];
		off_t lo = e->off > off ? e->off : off;
		off_t hi = e->off + (off_t)e->len < end
				   ? e->off + (off_t)e->len
				   : end;

		if (lo < hi)
			memcpy((char *)buf + (lo - off), e->data + (lo - e->off),
			       (size_t)(hi - lo));
	}
	cache_unlock(c);
	return (ssize_t)size;
}

void wb_node_changed(struct cnode *n)
{
	n->chg++;
	if (n->in_ring)
		for (struct cnode *a = n->ring_next; a != n; a = a->ring_next)
			a->chg++;
}

static ssize_t take_write(struct cache *c, struct cfile *f,
			       const void *data, size_t size, off_t off,
			       bool at_off);

ssize_t wb_write(struct cache *c, struct cfile *f, const void *data,
		 size_t size, off_t off)
{
	return take_write(c, f, data, size, off, false);
}

ssize_t wb_write_at(struct cache *c, struct cfile *f, const void *data,
		    size_t size, off_t off)
{
	return take_write(c, f, data, size, off, true);
}

/* wb_write (at_off false) and wb_write_at (true). */
static ssize_t take_write(struct cache *c, struct cfile *f,
			       const void *data, size_t size, off_t off,
			       bool at_off)
{
	ssize_t ret = (ssize_t)size;
	bool others = false;
	int rc;

	if (size == 0)
		return 0;

	/*
	 * Writes through several descriptors of one file must reach the
	 * sandbox in the order they were made, and an O_APPEND write must
	 * land after them: push the other descriptors' buffers first, so at
	 * most one descriptor of a file holds unpushed bytes.  (Not under
	 * f->wlock: two wlocks are never held at once.)
	 */
	cache_lock(c);
	/* Descriptors of the file (any name) on c->dirty, f among them or
	 * not. */
	others = tree_file_dirty(f->node) > (f->on_dirty ? 1u : 0u);
	cache_unlock(c);
	if (others) {
		rc = push_matching(c, f->node, NULL, f);
		if (rc < 0)
			return rc;
	}
	pthread_mutex_lock(&f->wlock);
	/*
	 * A held setattr of times goes before this write, which sets the
	 * mtime to now (sent after it, it would undo the write's).
	 */
	if (f->pset_valid & (SBX_SET_ATIME | SBX_SET_MTIME)) {
		rc = push_locked(c, f);
		if (rc < 0) {
			ret = rc;
			goto out;
		}
	}
	/*
	 * Appends must land at the real end: do not reorder them.  A write
	 * at an offset through an O_APPEND file goes out at once too (its
	 * pushes would append), through an open without O_APPEND.
	 */
	if (f->flags & O_APPEND) {
		struct cache_io io;

		rc = push_locked(c, f);
		if (rc == 0)
			rc = wb_io_begin_flags(c, f,
					       at_off ? f->flags & ~O_APPEND
						      : f->flags,
					       &io);
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
	if (f->buf_len && (f->buf_len + size > CACHE_WRITE_BUF ||
			   f->next >= CACHE_WB_EXTENTS)) {
		rc = push_locked(c, f);
		if (rc < 0) {
			ret = rc;
			goto out;
		}
	}
	cache_lock(c);
	if (!f->buf_len) {
		dirty_add(c, f);
		img_take(c, f);
	}
	ext_add(f, data, size, off);
	if (f->img)
		img_wrote(f, off + (off_t)size);
	content_drop_file(c, f->node);
	cache_unlock(c);
out:
	pthread_mutex_unlock(&f->wlock);
	return ret;
}

int wb_held_error(struct cache *c, struct cfile *f)
{
	struct sbx_error e;

	cache_lock(c);
	e = f->pset_err;
	f->pset_err.code = 0;
	cache_unlock(c);
	if (!e.code)
		return 0;
	return sbx_error_setd(e.klass, e.code, e.detail,
			      "a mode, owner or times change held with the "
			      "written bytes failed in the sandbox: %s", e.msg);
}

int wb_release(struct cache *c, struct cfile *f)
{
	int rc = wb_push(c, f);
	struct stat gone;

	memset(&gone, 0, sizeof(gone));
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
		if (f->buf_len || f->pset_valid) {
			char *p = tree_path_of(f->node);

			sbx_warn("dropping %zu unwritten bytes%s of '%s' at "
				 "its last close: %s",
				 f->buf_len,
				 f->pset_valid ? " and a mode, owner or times "
						 "change"
					       : "",
				 p ? p : "?", why);
			f->pset_valid = 0;
			free(p);
			ext_free_all(f);
			img_forget(f);
			dirty_del(c, f);
			written(c, f->node, NULL);
			/*
			 * The kernel's size and times count the dropped
			 * bytes (it extends a file on write): ask the sandbox
			 * again (stat said 16 TiB for a file left empty by a
			 * write EFBIG refused; stress test).
			 */
			tree_invalidate_file(f->node);
			c->events++;
			gone = f->node->st;
		}
		cache_unlock(c);
		pthread_mutex_unlock(&f->wlock);
		if (gone.st_ino)
			change_notify_attr(c, &gone);
	}
	if (wb_held_error(c, f) < 0) {
		char *p;

		cache_lock(c);
		p = tree_path_of(f->node);
		cache_unlock(c);
		/* No FLUSH of its owner was left to say it. */
		sbx_warn("'%s': %s", p ? p : "?", sbx_error_last()->msg);
		sbx_error_clear();
		free(p);
	}
	silly_drop_open(c, f);
	cache_lock(c);
	f->released = true;
	cache_unlock(c);
	wb_file_put(c, f);
	return rc;
}

/* ---- the flusher --------------------------------------------------------- */

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

		cache_deadline_in(&until, CLOCK_MONOTONIC, CACHE_WB_TICK_MS);
		pthread_cond_timedwait(&c->flusher_cond, &c->lock, &until);
		if (c->stopping)
			break;
		/* Hidden names an outage left (drops the lock). */
		silly_retry_locked(c);
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
	int rc;

	cache_cond_init_monotonic(&c->flusher_cond);
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
