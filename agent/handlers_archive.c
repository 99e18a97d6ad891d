/*
 * Archive routes (docs/protocol.md, "Archive"): GET /v1/archive streams a
 * directory as a pax tar, PUT /v1/archive extracts a tar body as it
 * arrives.  The tar format itself is tar.c.
 *
 * GET walks depth first with the directory fds kept on a stack, opening
 * every child relative to its parent with O_NOFOLLOW, so the walk never
 * leaves the tree it started in (the start is resolved by confine.c).  The
 * generic stream (agent_reply_stream) carries the raw tar bytes here, not
 * frames; an error after the first byte returns a negative errno from the
 * producer, which makes libmicrohttpd drop the connection without the
 * chunked terminator, so a client never mistakes a cut archive for a
 * complete one (the two zero blocks are only written at the very end).
 *
 * PUT confines every entry to REL, not just to the root: it resolves names
 * with confine.c against a `struct agent` whose root is REL's fd.  A
 * symlink in the archive is created as is (a tree may hold `python ->
 * /usr/bin/python3`), but nothing is ever written through one that leads
 * out of REL (EXDEV, 400), and the last component is never followed
 * (O_EXCL | O_NOFOLLOW creation after removing what was there).
 *
 * replace=1 removes what the archive does not have *after* a successful
 * extraction rather than clearing REL first: a rejected, corrupt or cut
 * upload then leaves the old content (plus what was extracted), never an
 * empty directory.  Directory modes and mtimes are applied last, deepest
 * first, so writing their contents neither fails (a 0555 directory) nor
 * moves their mtimes.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/hashmap.h"
#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"
#include "tar.h"

/* A producer call returns once this much is buffered (< the stream cap). */
#define OUT_CHUNK (256 * 1024)
#define READ_CHUNK (64 * 1024)

static char *join(const char *dir, const char *name)
{
	return *dir ? sbx_xasprintf("%s/%s", dir, name) : sbx_xstrdup(name);
}

/* ---- a set of names (PUT) --------------------------------------------------- */

/* Zeroed is empty (a zeroed sbx_hashmap is). */
struct nameset {
	struct sbx_hashmap map;
};

struct setname {
	struct sbx_hashmap_node node;
	char name[]; /* NUL-terminated */
};

static bool name_eq(const struct sbx_hashmap_node *n, const void *key)
{
	return !strcmp(sbx_hashmap_entry(n, struct setname, node)->name, key);
}

static bool set_has(const struct nameset *s, const char *name)
{
	return sbx_hashmap_find(&s->map, sbx_fnv1a_str(name), name_eq,
				name) != NULL;
}

static void set_add(struct nameset *s, const char *name)
{
	size_t len = strlen(name);
	struct setname *e;

	if (set_has(s, name))
		return;
	e = sbx_xcalloc(1, sizeof(*e) + len + 1);
	memcpy(e->name, name, len + 1);
	sbx_hashmap_insert(&s->map, &e->node, sbx_fnv1a(name, len));
}

static void set_fini(struct nameset *s)
{
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *n;

	sbx_hashmap_iter_init(&it, &s->map);
	while ((n = sbx_hashmap_next(&it)))
		free(sbx_hashmap_entry(n, struct setname, node));
	sbx_hashmap_fini(&s->map);
}

/* ---- GET: the writer --------------------------------------------------------- */

struct wdir {
	int fd;
	char *path; /* relative to REL; "" for REL */
	char **names;
	size_t n, i;
};

/* First name of a multi-link inode, for hard link entries. */
struct wlink {
	struct sbx_hashmap_node node; /* in tarw.links, by (dev, ino) */
	dev_t dev;
	ino_t ino;
	char *name;
};

struct tarw {
	struct agent_stream base;
	char *rel;
	struct wdir *stack;
	size_t depth, cap;
	/* the regular file being sent */
	int fd;
	char *fpath;
	uint64_t size, sent;
	bool short_read;
	struct sbx_hashmap links; /* struct wlink */
	unsigned char *rbuf;
};

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Push directory `fd` (taken) with its sorted entries. */
static int push_dir(struct tarw *t, int fd, char *take_path)
{
	struct wdir *w;
	struct dirent *e;
	size_t cap = 0;
	int dfd = dup(fd), rc = 0;
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;

	if (!d) {
		rc = sbx_error_os("archive %s: list %s", t->rel, take_path);
		if (dfd >= 0)
			close(dfd);
		close(fd);
		free(take_path);
		return rc;
	}
	if (t->depth == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 16;
		t->stack = sbx_xrealloc(t->stack, t->cap * sizeof(*t->stack));
	}
	w = &t->stack[t->depth++];
	memset(w, 0, sizeof(*w));
	w->fd = fd;
	w->path = take_path;
	errno = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (w->n == cap) {
			cap = cap ? 2 * cap : 32;
			w->names = sbx_xrealloc(w->names,
						cap * sizeof(*w->names));
		}
		w->names[w->n++] = sbx_xstrdup(e->d_name);
		errno = 0;
	}
	if (errno)
		rc = sbx_error_os("archive %s: list %s", t->rel, w->path);
	closedir(d);
	if (w->n)
		qsort(w->names, w->n, sizeof(*w->names), cmp_names);
	return rc;
}

static void pop_dir(struct tarw *t)
{
	struct wdir *w = &t->stack[--t->depth];

	for (size_t i = 0; i < w->n; i++)
		free(w->names[i]);
	free(w->names);
	free(w->path);
	close(w->fd);
}

static bool link_eq(const struct sbx_hashmap_node *n, const void *key)
{
	const struct wlink *l = sbx_hashmap_entry(n, struct wlink, node);
	const struct stat *st = key;

	return l->ino == st->st_ino && l->dev == st->st_dev;
}

/* The first name seen for (dev, ino), or NULL after recording `name`. */
static const char *link_seen(struct tarw *t, const struct stat *st,
			     const char *name)
{
	uint64_t h = sbx_fnv1a(&st->st_ino, sizeof(st->st_ino));
	struct sbx_hashmap_node *n;
	struct wlink *l;

	n = sbx_hashmap_find(&t->links, h, link_eq, st);
	if (n)
		return sbx_hashmap_entry(n, struct wlink, node)->name;
	l = sbx_xcalloc(1, sizeof(*l));
	l->dev = st->st_dev;
	l->ino = st->st_ino;
	l->name = sbx_xstrdup(name);
	sbx_hashmap_insert(&t->links, &l->node, h);
	return NULL;
}

static void entry_from_stat(struct agent_tar_entry *e, const struct stat *st,
			    const char *name)
{
	memset(e, 0, sizeof(*e));
	e->name = name;
	e->linkname = "";
	e->mode = st->st_mode & 07777;
	e->uid = st->st_uid;
	e->gid = st->st_gid;
	e->mtime_s = st->st_mtim.tv_sec;
	e->mtime_ns = st->st_mtim.tv_nsec;
}

/* Open (dfd, name) without following; ENOENT means "removed meanwhile". */
static int open_child(int dfd, const char *name, int flags)
{
	return openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
}

/* Emit entry `name` of the top directory.  0 also when it was skipped. */
static int emit(struct tarw *t, struct sbx_buf *out)
{
	struct wdir *w = &t->stack[t->depth - 1];
	const char *name = w->names[w->i++];
	struct agent_tar_entry e;
	char *path = join(w->path, name);
	const char *first;
	char target[PATH_MAX];
	struct stat st;
	ssize_t tl;
	int fd = -1, rc = 0;

	if (fstatat(w->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		goto gone;
	if (S_ISDIR(st.st_mode)) {
		fd = open_child(w->fd, name, O_RDONLY | O_DIRECTORY);
		if (fd < 0 || fstat(fd, &st) < 0)
			goto gone;
		entry_from_stat(&e, &st, path);
		e.type = AGENT_TAR_DIR;
		rc = agent_tar_header(out, &e);
		if (rc == 0)
			return push_dir(t, fd, path);
		close(fd);
		goto out;
	}
	if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
		sbx_warn("archive %s: skipping %s (not a file, directory or "
			 "symlink: mode %o)",
			 t->rel, path, (unsigned)st.st_mode);
		goto out;
	}
	if (S_ISREG(st.st_mode)) {
		fd = open_child(w->fd, name, O_RDONLY | O_NONBLOCK);
		if (fd < 0 || fstat(fd, &st) < 0)
			goto gone;
		if (!S_ISREG(st.st_mode)) {
			sbx_warn("archive %s: %s changed type, skipped",
				 t->rel, path);
			goto out;
		}
	}
	entry_from_stat(&e, &st, path);
	if (st.st_nlink > 1 && (first = link_seen(t, &st, path))) {
		e.type = AGENT_TAR_LNK;
		e.linkname = first;
		rc = agent_tar_header(out, &e);
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		tl = readlinkat(w->fd, name, target, sizeof(target) - 1);
		if (tl < 0)
			goto gone;
		target[tl] = '\0';
		e.type = AGENT_TAR_SYM;
		e.linkname = target;
		rc = agent_tar_header(out, &e);
		goto out;
	}
	e.type = AGENT_TAR_REG;
	e.size = (uint64_t)st.st_size;
	rc = agent_tar_header(out, &e);
	if (rc < 0)
		goto out;
	t->fd = fd;
	t->fpath = path;
	t->size = e.size;
	t->sent = 0;
	t->short_read = false;
	return 0;
gone:
	if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) {
		/* Removed or replaced between the listing and now. */
		sbx_warn("archive %s: %s vanished while archiving, skipped",
			 t->rel, path);
	} else {
		rc = sbx_error_os("archive %s: %s", t->rel, path);
	}
out:
	if (fd >= 0)
		close(fd);
	free(path);
	return rc;
}

static void file_done(struct tarw *t)
{
	close(t->fd);
	t->fd = -1;
	free(t->fpath);
	t->fpath = NULL;
}

/* The next piece of the file being sent (data, zero fill, padding). */
static int file_piece(struct tarw *t, struct sbx_buf *out)
{
	size_t want = t->size - t->sent > READ_CHUNK
			      ? READ_CHUNK
			      : (size_t)(t->size - t->sent);
	ssize_t n = 0;

	if (want == 0) {
		struct stat st;

		if (!t->short_read && fstat(t->fd, &st) == 0 &&
		    (uint64_t)st.st_size != t->size)
			sbx_warn("archive %s: %s changed size while being read "
				 "(%" PRIu64 " -> %lld bytes): truncated to %" PRIu64,
				 t->rel, t->fpath, t->size,
				 (long long)st.st_size, t->size);
		memset(t->rbuf, 0, agent_tar_padding(t->size));
		file_done(t);
		return sbx_buf_add(out, t->rbuf, agent_tar_padding(t->size));
	}
	if (!t->short_read) {
		do
			n = read(t->fd, t->rbuf, want);
		while (n < 0 && errno == EINTR);
		if (n < 0)
			return sbx_error_os("archive %s: read %s", t->rel,
					    t->fpath);
		if (n == 0) {
			sbx_warn("archive %s: %s shrank while being read: "
				 "padded with zeros to %" PRIu64 " bytes",
				 t->rel, t->fpath, t->size);
			t->short_read = true;
		}
	}
	if (t->short_read) {
		memset(t->rbuf, 0, want);
		n = (ssize_t)want;
	}
	t->sent += (uint64_t)n;
	return sbx_buf_add(out, t->rbuf, (size_t)n);
}

static int tarw_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct tarw *t = (struct tarw *)s;
	int rc = 0;

	while (out->len < OUT_CHUNK) {
		if (atomic_load(&s->a->stopping)) {
			rc = -ECANCELED;
			sbx_error_set(SBX_ERR_STATE, rc, "agent shutting down");
			break;
		}
		if (t->fd >= 0) {
			rc = file_piece(t, out);
		} else if (t->depth == 0) {
			rc = agent_tar_end(out);
			if (rc == 0)
				return 1;
		} else if (t->stack[t->depth - 1].i ==
			   t->stack[t->depth - 1].n) {
			pop_dir(t);
		} else {
			rc = emit(t, out);
		}
		if (rc < 0)
			break;
	}
	if (rc < 0) {
		sbx_warn("archive %s: stream aborted: %s", t->rel,
			 sbx_error_last()->msg);
		sbx_error_clear();
	}
	return rc;
}

static void tarw_fini(struct agent_stream *s)
{
	struct tarw *t = (struct tarw *)s;
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *n;

	if (t->fd >= 0)
		file_done(t);
	while (t->depth)
		pop_dir(t);
	sbx_hashmap_iter_init(&it, &t->links);
	while ((n = sbx_hashmap_next(&it))) {
		struct wlink *l = sbx_hashmap_entry(n, struct wlink, node);

		free(l->name);
		free(l);
	}
	sbx_hashmap_fini(&t->links);
	free(t->stack);
	free(t->rbuf);
	free(t->rel);
	free(t);
}

int agent_h_archive_get(struct agent_req *r)
{
	const char *arg = agent_arg(r, "path");
	struct tarw *t;
	char *path = NULL;
	int fd = -1, rc;

	rc = agent_path_norm(arg ? arg : "", &path);
	if (rc == 0)
		rc = agent_open(r->a, path, O_RDONLY | O_DIRECTORY, 0, &fd);
	if (rc < 0) {
		free(path);
		return agent_reply_error(r, 0, rc);
	}
	t = sbx_xcalloc(1, sizeof(*t));
	t->base.next = tarw_next;
	t->base.fini = tarw_fini;
	t->fd = -1;
	t->rel = path;
	t->rbuf = sbx_xmalloc(READ_CHUNK);
	/* Reading the top directory here turns its errors into an answer. */
	rc = push_dir(t, fd, sbx_xstrdup(""));
	if (rc < 0) {
		tarw_fini(&t->base);
		return agent_reply_error(r, 0, rc);
	}
	return agent_reply_stream(r, &t->base);
}

/* ---- PUT: the extractor ------------------------------------------------------ */

struct xdir {
	char *path;
	unsigned mode;
	int64_t mtime_s;
	long mtime_ns;
};

struct tarx {
	struct agent *a;
	struct agent sub; /* confine.c's view with REL as the root */
	char *rel;
	bool replace;
	struct agent_tar_reader *rd;
	/* the first error, answered at the end */
	int rc;
	unsigned status;
	char msg[512];
	/* the regular file being written */
	int fd;
	char *fpath;
	uint64_t fsize, fdone;
	unsigned fmode;
	int64_t fmtime_s;
	long fmtime_ns;
	uint64_t entries, bytes;
	struct xdir *dirs;
	size_t ndirs, dcap;
	struct nameset seen;
};

/* Record the first error (`status` 0: per errno) from sbx_error_last(). */
static int fail(struct tarx *x, unsigned status, int rc)
{
	if (!x->rc) {
		x->rc = rc;
		x->status = status;
		snprintf(x->msg, sizeof(x->msg), "%s",
			 sbx_error_last()->code == rc ? sbx_error_last()->msg
						      : strerror(-rc));
	}
	return rc;
}

/* A failure on entry `name`: EXDEV and ELOOP are the archive's fault. */
static int fail_entry(struct tarx *x, const char *name, int rc)
{
	if (rc == -EXDEV)
		sbx_error_set(SBX_ERR_PROTO, rc,
			      "archive entry \"%s\": resolves outside the "
			      "target directory /%s",
			      name, x->rel);
	else
		sbx_error_prefix(rc, "archive entry \"%s\"", name);
	return fail(x, rc == -EXDEV || rc == -ELOOP || rc == -EINVAL ? 400 : 0,
		    rc);
}

/*
 * Normalise an archive name: no absolute names, "." and empty components
 * dropped, ".." allowed only while it stays inside.  *out malloc'd; ""
 * is REL itself.
 */
static int name_norm(const char *in, char **out)
{
	*out = NULL;
	if (in[0] == '/')
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "absolute name \"%s\"", in);
	return sbx_proto_path_norm(in, SBX_PATH_DOTDOT_RESOLVE, out);
}

/* mkdir -p of `path` beneath conf's root (following symlinks inside). */
static int mkdirs(struct agent *conf, const char *path, struct nameset *seen)
{
	char *p = sbx_xstrdup(path);
	int rc = 0;

	for (char *s = p;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		{
			char c = *s;
			const char *name;
			char *buf = NULL;
			int dfd = -1;

			*s = '\0';
			rc = agent_parent(conf, p, &dfd, &name, &buf);
			if (rc == 0 && *name && mkdirat(dfd, name, 0755) < 0 &&
			    errno != EEXIST)
				rc = sbx_error_os("mkdir %s", p);
			if (rc == 0 && seen)
				set_add(seen, p);
			if (dfd >= 0)
				close(dfd);
			free(buf);
			*s = c;
			if (rc < 0 || c == '\0')
				break;
		}
	}
	free(p);
	return rc;
}

/* The parent of `path` beneath REL, creating missing directories. */
static int parent(struct tarx *x, const char *path, int *dfd,
		  const char **name, char **buf)
{
	int rc = agent_parent(&x->sub, path, dfd, name, buf);

	if (rc == -ENOENT) {
		const char *slash = strrchr(path, '/');
		char *dir = sbx_xstrndup(path, slash ? (size_t)(slash - path)
						     : 0);

		sbx_error_clear();
		rc = mkdirs(&x->sub, dir, NULL);
		free(dir);
		if (rc == 0)
			rc = agent_parent(&x->sub, path, dfd, name, buf);
	}
	return rc;
}

/* Make room for a new non-directory at (dfd, name). */
static int clear_slot(int dfd, const char *name, const char *path)
{
	if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	if (errno == EISDIR || errno == EPERM) {
		if (unlinkat(dfd, name, AT_REMOVEDIR) == 0)
			return 0;
		if (errno == ENOTEMPTY || errno == EEXIST)
			return sbx_error_set(SBX_ERR_OS, -ENOTEMPTY,
					     "a non-empty directory is in the "
					     "way at %s",
					     path);
	}
	return sbx_error_os("remove %s", path);
}

static int set_times_fd(int fd, int64_t s, long ns)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_sec = (time_t)s, .tv_nsec = ns } };

	return futimens(fd, ts);
}

static int file_finish(struct tarx *x)
{
	int rc = 0;

	if (fchmod(x->fd, x->fmode) < 0 ||
	    set_times_fd(x->fd, x->fmtime_s, x->fmtime_ns) < 0)
		rc = sbx_error_os("set attributes of %s", x->fpath);
	if (close(x->fd) < 0 && rc == 0)
		rc = sbx_error_os("write %s", x->fpath);
	x->fd = -1;
	if (rc < 0)
		fail_entry(x, x->fpath, rc);
	free(x->fpath);
	x->fpath = NULL;
	return rc;
}

/*
 * Set mode and mtime of the directory (dfd, name) without following a
 * symlink there: an O_PATH | O_NOFOLLOW fd addressed as /proc/self/fd/N
 * names exactly that inode, and needs no read permission on it.
 */
static int dir_attrs(int dfd, const char *name, unsigned mode, bool times,
		     int64_t s, long ns)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_sec = (time_t)s, .tv_nsec = ns } };
	char proc[48];
	struct stat st;
	int fd = open_child(dfd, *name ? name : ".", O_PATH | O_DIRECTORY);
	int rc = 0;

	if (fd < 0)
		return -errno;
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (fstat(fd, &st) < 0 || chmod(proc, mode) < 0 ||
	    (times && utimensat(AT_FDCWD, proc, ts, 0) < 0))
		rc = -errno;
	close(fd);
	return rc;
}

/* Create directory (dfd, name), or make an existing one writable. */
static int make_dir(int dfd, const char *name, const char *path)
{
	struct stat st;
	int rc;

	if (mkdirat(dfd, name, 0700) == 0)
		return 0;
	if (errno != EEXIST || fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return sbx_error_os("mkdir %s", path);
	if (!S_ISDIR(st.st_mode)) {
		rc = clear_slot(dfd, name, path);
		if (rc == 0 && mkdirat(dfd, name, 0700) < 0)
			rc = sbx_error_os("mkdir %s", path);
		return rc;
	}
	if ((st.st_mode & 0700) == 0700)
		return 0;
	rc = dir_attrs(dfd, name, (st.st_mode & 07777) | 0700, false, 0, 0);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_OS, rc, "chmod %s: %s", path,
				     strerror(-rc));
	return 0;
}

static int x_dir(struct tarx *x, const char *path,
		 const struct agent_tar_entry *e)
{
	const char *name;
	char *buf = NULL;
	int dfd = -1, rc = 0;
	struct xdir *d;

	if (*path) {
		rc = parent(x, path, &dfd, &name, &buf);
		if (rc == 0)
			rc = make_dir(dfd, name, path);
		if (dfd >= 0)
			close(dfd);
		free(buf);
		if (rc < 0)
			return rc;
	}
	if (x->ndirs == x->dcap) {
		x->dcap = x->dcap ? 2 * x->dcap : 64;
		x->dirs = sbx_xrealloc(x->dirs, x->dcap * sizeof(*x->dirs));
	}
	d = &x->dirs[x->ndirs++];
	d->path = sbx_xstrdup(path);
	d->mode = e->mode;
	d->mtime_s = e->mtime_s;
	d->mtime_ns = e->mtime_ns;
	return 0;
}

static int x_other(struct tarx *x, const char *path,
		   const struct agent_tar_entry *e)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_sec = (time_t)e->mtime_s,
				    .tv_nsec = e->mtime_ns } };
	const char *name, *lname;
	char *buf = NULL, *lbuf = NULL, *target = NULL;
	int dfd = -1, ldfd = -1, rc;

	if (!*path)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "only a directory may name the target "
				     "directory itself");
	if (e->type == AGENT_TAR_LNK) {
		rc = name_norm(e->linkname, &target);
		if (rc == 0 && !set_has(&x->seen, target))
			rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					   "hard link to \"%s\", which is not "
					   "an earlier entry of the archive",
					   e->linkname);
		if (rc == 0)
			rc = agent_parent(&x->sub, target, &ldfd, &lname,
					  &lbuf);
		if (rc == 0 && !*lname)
			rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					   "hard link to a directory");
		if (rc < 0)
			goto out;
		if (!strcmp(target, path))
			goto out; /* a link to itself: already there */
	}
	rc = parent(x, path, &dfd, &name, &buf);
	if (rc == 0)
		rc = clear_slot(dfd, name, path);
	if (rc < 0)
		goto out;
	switch (e->type) {
	case AGENT_TAR_REG:
		x->fd = openat(dfd, name,
			       O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW |
				       O_CLOEXEC | O_NOCTTY,
			       0600);
		if (x->fd < 0) {
			rc = sbx_error_os("create %s", path);
			break;
		}
		x->fpath = sbx_xstrdup(path);
		x->fsize = e->size;
		x->fdone = 0;
		x->fmode = e->mode;
		x->fmtime_s = e->mtime_s;
		x->fmtime_ns = e->mtime_ns;
		if (e->size == 0)
			rc = file_finish(x);
		break;
	case AGENT_TAR_SYM:
		if (symlinkat(e->linkname, dfd, name) < 0 ||
		    utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
			rc = sbx_error_os("symlink %s", path);
		break;
	case AGENT_TAR_LNK:
		if (linkat(ldfd, lname, dfd, name, 0) < 0)
			rc = sbx_error_os("link %s to %s", path, target);
		break;
	}
out:
	if (dfd >= 0)
		close(dfd);
	if (ldfd >= 0)
		close(ldfd);
	free(buf);
	free(lbuf);
	free(target);
	return rc;
}

static int on_entry(const struct agent_tar_entry *e, void *payload)
{
	struct tarx *x = payload;
	char *path = NULL;
	int rc;

	if (x->fd >= 0) /* a file whose data ended: cannot happen */
		file_finish(x);
	switch (e->type) {
	case AGENT_TAR_CHR:
	case AGENT_TAR_BLK:
	case AGENT_TAR_FIFO:
		sbx_warn("archive %s: skipping %s (device or fifo)",
			 x->rel, e->name);
		return 0;
	case 'V': /* a GNU volume label */
		return 0;
	case AGENT_TAR_DIR:
	case AGENT_TAR_REG:
	case AGENT_TAR_SYM:
	case AGENT_TAR_LNK:
		break;
	default:
		sbx_error_set(SBX_ERR_PROTO, -EINVAL,
			      "entry type '%c' is not supported", e->type);
		return fail_entry(x, e->name, -EINVAL);
	}
	rc = name_norm(e->name, &path);
	if (rc == 0) {
		/* Every directory leading to it belongs to the archive too
		 * (replace=1 must not remove them). */
		for (char *s = path; (s = strchr(s, '/')); s++) {
			*s = '\0';
			set_add(&x->seen, path);
			*s = '/';
		}
		if (e->type == AGENT_TAR_DIR)
			rc = x_dir(x, path, e);
		else
			rc = x_other(x, path, e);
	}
	if (rc == 0) {
		set_add(&x->seen, path);
		x->entries++;
	}
	free(path);
	return rc < 0 ? fail_entry(x, e->name, rc) : 0;
}

static int on_data(const void *data, size_t len, void *payload)
{
	struct tarx *x = payload;
	size_t done = 0;

	if (x->fd < 0)
		return 0; /* data of a link or directory entry: not kept */
	while (done < len) {
		ssize_t n = write(x->fd, (const char *)data + done, len - done);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return fail_entry(x, x->fpath,
					  sbx_error_os("write %s", x->fpath));
		done += (size_t)n;
	}
	x->fdone += len;
	x->bytes += len;
	if (x->fdone == x->fsize)
		return file_finish(x);
	return 0;
}

/* Remove (dfd, name) and everything below it, never following links. */
static int remove_tree(int dfd, const char *name, const char *path)
{
	struct stat st;
	struct dirent *e;
	DIR *d;
	int fd, rc = 0;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : sbx_error_os("remove %s", path);
	if (!S_ISDIR(st.st_mode)) {
		if (unlinkat(dfd, name, 0) < 0 && errno != ENOENT)
			return sbx_error_os("remove %s", path);
		return 0;
	}
	fd = open_child(dfd, name, O_RDONLY | O_DIRECTORY);
	if (fd < 0 || !(d = fdopendir(fd))) {
		rc = sbx_error_os("remove %s", path);
		if (fd >= 0)
			close(fd);
		return rc;
	}
	while (rc == 0 && (e = readdir(d))) {
		char *sub;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		sub = join(path, e->d_name);
		rc = remove_tree(dirfd(d), e->d_name, sub);
		free(sub);
	}
	closedir(d);
	if (rc == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0 &&
	    errno != ENOENT)
		rc = sbx_error_os("remove %s", path);
	return rc;
}

/* replace=1: remove what is below (dfd = `path`) but not in the archive. */
static int remove_extras(struct tarx *x, int dfd, const char *path)
{
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	int fd = dup(dfd), rc = 0;
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;

	if (!d) {
		rc = sbx_error_os("list %s", *path ? path : ".");
		if (fd >= 0)
			close(fd);
		return rc;
	}
	rewinddir(d);
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 32;
			names = sbx_xrealloc(names, cap * sizeof(*names));
		}
		names[n++] = sbx_xstrdup(e->d_name);
	}
	closedir(d);
	for (size_t i = 0; i < n; i++) {
		char *sub = join(path, names[i]);
		struct stat st;

		if (rc < 0) {
			/* just free the rest */
		} else if (!set_has(&x->seen, sub)) {
			rc = remove_tree(dfd, names[i], sub);
		} else if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) ==
				   0 &&
			   S_ISDIR(st.st_mode)) {
			int cfd = open_child(dfd, names[i],
					     O_RDONLY | O_DIRECTORY);

			if (cfd < 0) {
				rc = sbx_error_os("list %s", sub);
			} else {
				rc = remove_extras(x, cfd, sub);
				close(cfd);
			}
		}
		free(sub);
		free(names[i]);
	}
	free(names);
	return rc;
}

/* Directory modes and mtimes, deepest (latest) first. */
static void apply_dirs(struct tarx *x)
{
	for (size_t i = x->ndirs; i-- > 0;) {
		struct xdir *d = &x->dirs[i];
		const char *what = *d->path ? d->path : ".";
		const char *name;
		char *buf = NULL;
		int dfd = -1, rc;

		rc = agent_parent(&x->sub, d->path, &dfd, &name, &buf);
		if (rc == 0) {
			rc = dir_attrs(dfd, name, d->mode, true, d->mtime_s,
				       d->mtime_ns);
			if (rc < 0)
				sbx_error_set(SBX_ERR_OS, rc,
					      "set attributes of %s: %s", what,
					      strerror(-rc));
		}
		if (rc < 0)
			fail_entry(x, what, rc);
		if (dfd >= 0)
			close(dfd);
		free(buf);
	}
}

static void tarx_free(void *p)
{
	struct tarx *x = p;

	if (!x)
		return;
	if (x->fd >= 0)
		close(x->fd);
	free(x->fpath);
	agent_tar_reader_free(x->rd);
	for (size_t i = 0; i < x->ndirs; i++)
		free(x->dirs[i].path);
	free(x->dirs);
	set_fini(&x->seen);
	if (x->sub.root_fd >= 0)
		close(x->sub.root_fd);
	free(x->rel);
	free(x);
}

int agent_extract_begin(struct agent_req *r, const char *path, bool replace)
{
	struct tarx *x;
	int fd = -1, rc = 0;

	if (*path)
		rc = mkdirs(r->a, path, NULL);
	if (rc == 0)
		rc = agent_open(r->a, path, O_PATH | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	x = sbx_xcalloc(1, sizeof(*x));
	x->a = r->a;
	x->sub.root_fd = fd;
	x->sub.use_openat2 = r->a->use_openat2;
	x->sub.root_path = r->a->root_path;
	x->rel = sbx_xstrdup(path);
	x->replace = replace;
	x->fd = -1;
	x->rd = agent_tar_reader_new(on_entry, on_data, x);
	r->upload_state = x;
	r->upload_free = tarx_free;
	return 0;
}

/* The start of a PUT: check the query, create and open REL. */
static int put_begin(struct agent_req *r)
{
	const char *arg = agent_arg(r, "path");
	long long replace;
	char *path = NULL;
	int rc;

	rc = agent_path_norm(arg ? arg : "", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "replace", 0, 0, 1, &replace);
	if (rc == 0)
		rc = agent_extract_begin(r, path, replace);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc) == MHD_YES ? 0 : -EIO;
	return 0;
}

int agent_archive_upload(struct agent_req *r, const char *data, size_t len)
{
	struct tarx *x = r->upload_state;
	int rc;

	if (!data)
		return put_begin(r);
	if (!x || x->rc)
		return 0; /* failed: read and drop the rest, then answer */
	rc = agent_tar_feed(x->rd, data, len);
	if (rc < 0)
		fail(x, rc == -EINVAL ? 400 : 0, rc);
	return 0;
}

int agent_extract_finish(struct agent_req *r, uint64_t *entries,
			 uint64_t *bytes, unsigned *status_out)
{
	struct tarx *x = r->upload_state;
	int fd;

	*entries = *bytes = 0;
	*status_out = 0;
	if (!x) {
		*status_out = 500;
		return sbx_error_set(SBX_ERR_INTERNAL, -EIO,
				     "archive: no upload");
	}
	if (!x->rc && agent_tar_finish(x->rd) < 0)
		fail(x, 400, sbx_error_last()->code);
	if (x->fd >= 0) {
		close(x->fd);
		x->fd = -1;
	}
	if (!x->rc && x->replace) {
		fd = openat(x->sub.root_fd, ".",
			    O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd < 0)
			fail(x, 0, sbx_error_os("open %s", x->rel));
		else if (remove_extras(x, fd, "") < 0)
			fail(x, 0, sbx_error_last()->code);
		if (fd >= 0)
			close(fd);
	}
	apply_dirs(x);
	if (x->rc) {
		*status_out = x->status;
		return sbx_error_set(SBX_ERR_PROTO, x->rc, "%s", x->msg);
	}
	*entries = x->entries;
	*bytes = x->bytes;
	return 0;
}

struct agent *agent_extract_confined(struct agent_req *r)
{
	struct tarx *x = r->upload_state;

	return x ? &x->sub : NULL;
}

int agent_extract_clear(struct agent_req *r)
{
	struct tarx *x = r->upload_state;
	struct nameset none = { 0 }, kept;
	int fd, rc;

	if (!x)
		return 0;
	if (x->fd >= 0) {
		close(x->fd);
		x->fd = -1;
	}
	fd = openat(x->sub.root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return sbx_error_os("open %s", x->rel);
	/* Everything is an extra against an empty set of names. */
	kept = x->seen;
	x->seen = none;
	rc = remove_extras(x, fd, "");
	x->seen = kept;
	close(fd);
	return rc;
}

int agent_h_archive_put(struct agent_req *r)
{
	struct tarx *x = r->upload_state;
	uint64_t entries, bytes;
	unsigned status;
	cJSON *o;
	int rc;

	rc = agent_extract_finish(r, &entries, &bytes, &status);
	if (rc < 0) {
		sbx_warn("PUT archive %s: %s", x && *x->rel ? x->rel : ".",
			 sbx_error_last()->msg);
		return agent_reply_error(r, status, rc);
	}
	sbx_debug("PUT archive %s: %" PRIu64 " entries, %" PRIu64 " bytes",
		  *x->rel ? x->rel : ".", entries, bytes);
	o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "entries", (double)entries);
	cJSON_AddNumberToObject(o, "bytes", (double)bytes);
	return agent_reply_json(r, 200, o);
}
