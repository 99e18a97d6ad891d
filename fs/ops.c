/*
 * The fuse_lowlevel_ops table: every request goes to the provider table.
 *
 * Each handler replies exactly once.  Errors from the provider are negative
 * errnos; the FUSE boundary takes them positive.  Only this layer logs a
 * failure (at debug level: ENOENT and friends are normal traffic).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"
#include "fs_i.h"

/* Per-open state in fi->fh. */
struct fs_file {
	struct sbx_file *fh;
	struct fs_inode *inode;
	bool writer;
	uint64_t entry_gen; /* directories: fs_entry_gen() at the snapshot */
};

/* The virtual, read-only extended attributes of every path. */
#define XATTR_SESSION "user.sbx.session"
#define XATTR_PATH "user.sbx.path"
#define XATTR_CONTROL "user.sbx.control"

static struct fs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

static struct sbx_node *node_of(struct fs *fs, fuse_ino_t ino)
{
	return fs_inode_get(fs, ino)->node;
}

static struct fs_file *file_of(struct fuse_file_info *fi)
{
	return fi ? (struct fs_file *)(uintptr_t)fi->fh : NULL;
}

static struct sbx_file *pfile_of(struct fuse_file_info *fi)
{
	struct fs_file *f = file_of(fi);

	return f ? f->fh : NULL;
}

/*
 * The provider file for I/O on `ino`: the per-open file when the kernel
 * sent an open; else (zero-message opens) a file opened for this request
 * alone, which the caller releases with io_done().  Opening per request
 * costs a few microseconds but no descriptor per cached inode, and warm
 * reads never get here (the page cache serves them).
 */
static int io_file(struct fs *fs, fuse_ino_t ino, struct fuse_file_info *fi,
		   bool write, struct sbx_file **out)
{
	struct fs_inode *in = fs_inode_get(fs, ino);
	struct sbx_open_result res;
	int rc;

	*out = pfile_of(fi);
	if (*out)
		return 0;
	memset(&res, 0, sizeof(res));
	rc = fs->sb->ops->open(fs->sb, in->node, write ? O_RDWR : O_RDONLY,
			       &res);
	if (rc == -EACCES && write) {
		/* A write-only file (mode 0200): the kernel allowed it. */
		sbx_error_clear();
		rc = fs->sb->ops->open(fs->sb, in->node, O_WRONLY, &res);
	}
	if (rc < 0)
		return rc;
	*out = res.fh;
	return 0;
}

/*
 * Release a file from io_file() if it was opened for the request.  Looks
 * only at the handle value: after the reply, a RELEASE on another thread
 * may already have freed the per-open state it points to.
 */
static void io_done(struct fs *fs, struct fuse_file_info *fi,
		    struct sbx_file *fh)
{
	if (fh && !(fi && fi->fh))
		(void)fs->sb->ops->release(fs->sb, fh);
}

static void reply_err(fuse_req_t req, const char *op, int rc)
{
	if (rc >= 0)
		rc = -EIO;
	if (sbx_log_enabled(SBX_LOG_DEBUG)) {
		const struct sbx_error *e = sbx_error_last();

		sbx_debug("%s: %s (%s)", op, strerror(-rc),
			  e->klass ? e->msg : "no detail");
	} else if (rc == -EIO || rc == -ETIMEDOUT) {
		sbx_warn("%s: %s: %s", op, strerror(-rc), sbx_error_last()->msg);
	}
	sbx_error_clear();
	fuse_reply_err(req, -rc);
}

/* Reply to a request that returns no data: rc is 0 or -errno. */
static void reply_rc(fuse_req_t req, const char *op, int rc)
{
	if (rc < 0)
		reply_err(req, op, rc);
	else
		fuse_reply_err(req, 0);
}

/*
 * A name longer than NAME_MAX gets ENAMETOOLONG here, as from ext4, for
 * every provider: the kernel passes FUSE names of up to 1024 bytes, and a
 * caching layer that knows a directory's complete listing would otherwise
 * answer ENOENT without asking the sandbox.  True when it replied.
 */
static bool name_too_long(fuse_req_t req, const char *op, const char *name)
{
	size_t n = strlen(name);

	if (n <= NAME_MAX)
		return false;
	reply_err(req, op,
		  sbx_error_set(SBX_ERR_OS, -ENAMETOOLONG,
				"a name of %zu bytes (at most %d)", n,
				NAME_MAX));
	return true;
}

/*
 * Tell the provider who creates (sbx/provider.h, struct sbx_caller): with
 * a shared mount, a new object belongs to the caller, not to the daemon.
 * Cleared with caller_end() right after the provider call.
 */
static void caller_begin(fuse_req_t req)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);
	struct sbx_caller c = {
		.uid = ctx->uid, .gid = ctx->gid, .umask = ctx->umask,
	};

	sbx_caller_set(&c);
}

static void caller_end(void)
{
	sbx_caller_set(NULL);
}

/* Fill and send an entry reply for a node the provider just handed us. */
static void reply_entry(fuse_req_t req, struct fs *fs, fuse_ino_t parent,
			const char *name, struct sbx_node *node,
			const struct stat *st)
{
	struct fuse_entry_param e;
	struct fs_inode *in = fs_inode_remember(fs, parent, name, node, st);

	/*
	 * The name's listed negative entry, if any, is this one now.  Off the
	 * list before the reply, not after: once the reply is in, an event
	 * and a LOOKUP may list the name again, which a later drop would
	 * take off while the kernel keeps that negative entry.  (If the reply
	 * fails, the kernel may keep an unlisted one: an aborted request.)
	 */
	fs_negative_drop(fs, parent, name);
	memset(&e, 0, sizeof(e));
	e.ino = fs_inode_id(fs, in);
	e.attr = *st;
	e.attr_timeout = fs_timeout(fs);
	e.entry_timeout = fs_timeout(fs);
	/* An interrupted request: the kernel never saw this lookup. */
	if (fuse_reply_entry(req, &e) != 0)
		fs_inode_forget(fs, e.ino, 1);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct fs *fs = userdata;
	bool zero_copy = fs->sb->ops->file_fd != NULL;

	if (zero_copy) {
		if (conn->capable & FUSE_CAP_SPLICE_WRITE)
			conn->want |= FUSE_CAP_SPLICE_WRITE;
		if (conn->capable & FUSE_CAP_SPLICE_MOVE)
			conn->want |= FUSE_CAP_SPLICE_MOVE;
		if (conn->capable & FUSE_CAP_SPLICE_READ)
			conn->want |= FUSE_CAP_SPLICE_READ;
	}
	/* The backend changes under us, so no kernel write-back cache. */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	/* O_TRUNC arrives as a setattr, which zero-message opens need. */
	conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
	if (conn->capable & FUSE_CAP_PARALLEL_DIROPS)
		conn->want |= FUSE_CAP_PARALLEL_DIROPS;
	if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA)
		conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
	if (fs->watching && (conn->capable & FUSE_CAP_CACHE_SYMLINKS))
		conn->want |= FUSE_CAP_CACHE_SYMLINKS;
	if (conn->capable & FUSE_CAP_READDIRPLUS)
		conn->want |= FUSE_CAP_READDIRPLUS | FUSE_CAP_READDIRPLUS_AUTO;
	/* No locks: POSIX/flock locks stay local to the kernel. */
	conn->want &= ~(FUSE_CAP_POSIX_LOCKS | FUSE_CAP_FLOCK_LOCKS);
	conn->max_write = 1u << 20;
	conn->time_gran = 1;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	struct sbx_node *node = NULL;
	uint64_t gen = fs_entry_gen(fs);
	struct stat st;
	int rc;

	if (name_too_long(req, "lookup", name))
		return;

	rc = fs->sb->ops->lookup(fs->sb, node_of(fs, parent), name, &node, &st);
	if (rc == -ENOENT && fs_healthy(fs)) {
		/* Negative entry: cached until the change stream says so. */
		struct fuse_entry_param e;

		sbx_error_clear();
		memset(&e, 0, sizeof(e));
		e.entry_timeout = fs_negative_timeout(fs, parent, name);
		fuse_reply_entry(req, &e);
	} else if (rc < 0) {
		return reply_err(req, "lookup", rc);
	} else {
		reply_entry(req, fs, parent, name, node, &st);
	}
	fs_entry_replay(fs, parent, name, gen);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	fs_inode_forget(fs_of(req), ino, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count,
			    struct fuse_forget_data *forgets)
{
	struct fs *fs = fs_of(req);

	for (size_t i = 0; i < count; i++)
		fs_inode_forget(fs, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct stat st;
	int rc;

	rc = fs->sb->ops->getattr(fs->sb, node_of(fs, ino), pfile_of(fi), &st);
	if (rc < 0)
		return reply_err(req, "getattr", rc);
	fuse_reply_attr(req, &st, fs_timeout(fs));
}

/*
 * A truncation by name (open with O_TRUNC, truncate(2)) through a dentry
 * the kernel still holds for a file that was since removed or renamed in
 * the worktree, before the inotify invalidation arrived (docs/design.md,
 * "Zero-message opens").  On ext4 the name would not find that file any
 * more, so the open would create a new one; here the truncation and the
 * writes after it would go to the removed file and be lost.  Such a
 * setattr comes without a file handle (the kernel sends none for O_TRUNC
 * or a path), which tells it from ftruncate(2) on a descriptor, which
 * must keep working on a removed file.  True when the inode is no longer
 * found under the name we know for it: no links left, or (a single link)
 * another name.  Hard-linked files are only checked for links.
 */
static bool stale_by_name(struct fs *fs, fuse_ino_t ino)
{
	struct fs_inode *in = fs_inode_get(fs, ino);
	struct sbx_node *node = in->node;
	const char *base;
	char *name = NULL, *path = NULL;
	struct stat st;
	bool stale = false;

	if (fs->sb->ops->getattr(fs->sb, node, NULL, &st) < 0 ||
	    !S_ISREG(st.st_mode)) {
		sbx_error_clear();
		return false;
	}
	if (st.st_nlink == 0)
		return true;
	if (st.st_nlink > 1 || !fs->sb->ops->node_path)
		return false;
	pthread_mutex_lock(&fs->lock);
	if (in->name)
		name = sbx_xstrdup(in->name);
	pthread_mutex_unlock(&fs->lock);
	if (name && fs->sb->ops->node_path(fs->sb, node, &path) == 0) {
		size_t len = strlen(path), dl = strlen(" (deleted)");

		base = strrchr(path, '/');
		/*
		 * " (deleted)": the name the node was opened by is gone but
		 * the file has another (link a b; rm a): its current name is
		 * unknown here, so do not call it stale (the retry would find
		 * the same node and fail again).
		 */
		stale = !(len >= dl && strcmp(path + len - dl,
					      " (deleted)") == 0) &&
			strcmp(base ? base + 1 : path, name) != 0;
	}
	sbx_error_clear();
	free(path);
	free(name);
	return stale;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr,
		       int valid, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct stat st;
	int rc;

	/*
	 * ESTALE makes the kernel walk the path again with LOOKUP_REVAL,
	 * which revalidates the dentry by a LOOKUP: the name is gone, so
	 * O_CREAT creates a new file and truncate(2) says ENOENT.
	 */
	if (fs->zero_open && (valid & FUSE_SET_ATTR_SIZE) && !fi &&
	    stale_by_name(fs, ino))
		return reply_err(req, "setattr",
				 sbx_error_set(SBX_ERR_OS, -ESTALE,
					       "truncate by a name that no "
					       "longer leads to the file"));
	/* SBX_SET_* share FUSE_SET_ATTR_* values (see sbx/provider.h). */
	rc = fs->sb->ops->setattr(fs->sb, node_of(fs, ino), pfile_of(fi), attr,
				  valid, &st);
	if (rc < 0)
		return reply_err(req, "setattr", rc);
	fuse_reply_attr(req, &st, fs_timeout(fs));
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	char buf[PATH_MAX + 1];
	int n;

	n = fs->sb->ops->readlink(fs->sb, node_of(fs, ino), buf,
				  sizeof(buf) - 1);
	if (n < 0)
		return reply_err(req, "readlink", n);
	if ((size_t)n >= sizeof(buf) - 1)
		return reply_err(req, "readlink", -ENAMETOOLONG);
	buf[n] = '\0';
	fuse_reply_readlink(req, buf);
}

/* What a mknod, mkdir or symlink makes. */
struct make {
	const char *op;
	enum { MAKE_NOD, MAKE_DIR, MAKE_SYMLINK } kind;
	mode_t mode;
	dev_t rdev;
	const char *target;
};

static void make_entry(fuse_req_t req, fuse_ino_t parent, const char *name,
		       const struct make *m)
{
	struct fs *fs = fs_of(req);
	struct sbx_node *node, *dir = node_of(fs, parent);
	struct stat st;
	int rc;

	if (name_too_long(req, m->op, name))
		return;
	caller_begin(req);
	switch (m->kind) {
	case MAKE_NOD:
		rc = fs->sb->ops->mknod(fs->sb, dir, name, m->mode, m->rdev,
					&node, &st);
		break;
	case MAKE_DIR:
		rc = fs->sb->ops->mkdir(fs->sb, dir, name, m->mode, &node, &st);
		break;
	default:
		rc = fs->sb->ops->symlink(fs->sb, m->target, dir, name, &node,
					  &st);
		break;
	}
	caller_end();
	if (rc < 0)
		return reply_err(req, m->op, rc);
	reply_entry(req, fs, parent, name, node, &st);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode, dev_t rdev)
{
	struct make m = {"mknod", MAKE_NOD, mode, rdev, NULL};

	make_entry(req, parent, name, &m);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name,
		     mode_t mode)
{
	struct make m = {"mkdir", MAKE_DIR, mode, 0, NULL};

	make_entry(req, parent, name, &m);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent,
		       const char *name)
{
	struct make m = {"symlink", MAKE_SYMLINK, 0, 0, link};

	make_entry(req, parent, name, &m);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent,
		    const char *newname)
{
	struct fs *fs = fs_of(req);
	struct sbx_node *node;
	struct stat st;
	int rc;

	if (name_too_long(req, "link", newname))
		return;

	rc = fs->sb->ops->link(fs->sb, node_of(fs, ino),
			       node_of(fs, newparent), newname, &node, &st);
	if (rc < 0)
		return reply_err(req, "link", rc);
	reply_entry(req, fs, newparent, newname, node, &st);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	int rc = fs->sb->ops->unlink(fs->sb, node_of(fs, parent), name);

	if (rc == 0)
		fs_names_removed(fs, parent, name);
	reply_rc(req, "unlink", rc);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct fs *fs = fs_of(req);
	int rc = fs->sb->ops->rmdir(fs->sb, node_of(fs, parent), name);

	if (rc == 0)
		fs_names_removed(fs, parent, name);
	reply_rc(req, "rmdir", rc);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
		      fuse_ino_t newparent, const char *newname,
		      unsigned int flags)
{
	struct fs *fs = fs_of(req);
	int rc;

	if (name_too_long(req, "rename", name) ||
	    name_too_long(req, "rename", newname))
		return;

	rc = fs->sb->ops->rename(fs->sb, node_of(fs, parent), name,
				 node_of(fs, newparent), newname, flags);
	if (rc == 0) {
		fs_names_renamed(fs, parent, name, newparent, newname, flags);
		/* The kernel moves the source's dentry onto the target's. */
		fs_negative_drop(fs, newparent, newname);
	}
	reply_rc(req, "rename", rc);
}

static bool open_for_writing(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC);
}

/* Wrap a provider open result into fi; returns the fs_file. */
static void fill_open(struct fs *fs, struct fuse_file_info *fi,
		      struct fs_inode *in, const struct sbx_open_result *res)
{
	struct fs_file *f = sbx_xcalloc(1, sizeof(*f));

	f->fh = res->fh;
	f->inode = in;
	f->writer = open_for_writing(fi->flags);
	if (f->writer)
		fs_inode_writers(fs, in, 1);
	fi->fh = (uintptr_t)f;
	/*
	 * Page cache survives opens only while invalidations are exact, or
	 * when the caching layer revalidated the file at open.
	 */
	fi->keep_cache = res->keep_cache && (fs->cached || fs_healthy(fs));
	fi->direct_io = res->direct_io;
	fi->nonseekable = res->nonseekable;
	/*
	 * A reader's close(2) needs no FLUSH: nothing is buffered for it and
	 * locks stay in the kernel.  The caching layer counts such opens out
	 * of its "not yet closed" hint (fs/cache.c, count_open()).
	 */
	fi->noflush = !f->writer;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_inode *in = fs_inode_get(fs, ino);
	struct sbx_open_result res;
	int rc;

	if (fs->zero_open) {
		/* The kernel stops sending OPEN and RELEASE from now on. */
		fuse_reply_err(req, ENOSYS);
		return;
	}
	memset(&res, 0, sizeof(res));
	rc = fs->sb->ops->open(fs->sb, in->node, fi->flags, &res);
	if (rc < 0)
		return reply_err(req, "open", rc);
	fill_open(fs, fi, in, &res);
	if (fuse_reply_open(req, fi) != 0) {
		struct fs_file *f = file_of(fi);

		if (f->writer)
			fs_inode_writers(fs, in, -1);
		(void)fs->sb->ops->release(fs->sb, f->fh);
		free(f);
	}
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name,
		      mode_t mode, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct sbx_open_result res;
	struct fuse_entry_param e;
	struct sbx_node *node;
	struct fs_inode *in;
	int rc;

	if (name_too_long(req, "create", name))
		return;

	int flags = fi->flags;

	memset(&res, 0, sizeof(res));
	memset(&e, 0, sizeof(e));
	caller_begin(req);
	rc = fs->sb->ops->create(fs->sb, node_of(fs, parent), name, mode,
				 flags, &node, &e.attr, &res);
	caller_end();
	if (rc < 0)
		return reply_err(req, "create", rc);
	/* A file the create made cannot be one the kernel holds already
	 * (random tester, seeds 839183475 and 51744238: a new file's
	 * ftruncate said ENOENT, its mmap write ESTALE, the kernel's inode
	 * for it being a removed file's with the same number). */
	in = res.created
		     ? fs_inode_remember_new(fs, parent, name, node, &e.attr)
		     : fs_inode_remember(fs, parent, name, node, &e.attr);
	if (fs->zero_open) {
		/* I/O opens its own files (io_file); this one is done. */
		(void)fs->sb->ops->release(fs->sb, res.fh);
		fi->fh = 0;
		fi->keep_cache = fs_healthy(fs);
	} else {
		fill_open(fs, fi, in, &res);
	}
	e.ino = fs_inode_id(fs, in);
	e.generation = 0;
	e.attr_timeout = fs_timeout(fs);
	e.entry_timeout = fs_timeout(fs);
	/* The kernel's dentry for the name is this file now (reply_entry). */
	fs_negative_drop(fs, parent, name);
	if (fuse_reply_create(req, &e, fi) != 0) {
		struct fs_file *f = file_of(fi);

		if (f) {
			if (f->writer)
				fs_inode_writers(fs, in, -1);
			(void)fs->sb->ops->release(fs->sb, f->fh);
			free(f);
		}
		fs_inode_forget(fs, e.ino, 1);
	}
}

/* Reply to a read from `fh`: spliced from its descriptor when it has one. */
static void read_reply(fuse_req_t req, struct fs *fs, struct sbx_file *fh,
		       size_t size, off_t off)
{
	ssize_t n;
	char *buf;

	if (fs->sb->ops->file_fd) {
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
		int fd = fs->sb->ops->file_fd(fs->sb, fh);

		if (fd < 0)
			return reply_err(req, "read", fd);
		bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
		bv.buf[0].fd = fd;
		bv.buf[0].pos = off;
		fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
		return;
	}
	buf = sbx_xmalloc(size);
	n = fs->sb->ops->read(fs->sb, fh, buf, size, off);
	if (n < 0)
		reply_err(req, "read", (int)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		    struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct sbx_file *fh;
	int rc = io_file(fs, ino, fi, false, &fh);

	if (rc < 0)
		return reply_err(req, "read", rc);
	read_reply(req, fs, fh, size, off);
	io_done(fs, fi, fh);
}

/*
 * Write `in_buf` to `fh`; returns the count or -errno.  With `append`,
 * at the real end of the file: the kernel's idea of it may be stale when
 * another process appended in the worktree, and O_APPEND promises the end.
 * With `page_cache` (the kernel writing back dirty pages of a mapping),
 * at `off` whatever fh's own flags say (write_at).
 */
static ssize_t write_data(struct fs *fs, struct sbx_file *fh,
			  struct fuse_bufvec *in_buf, off_t off, bool append,
			  bool page_cache)
{
	ssize_t (*write)(struct sbx_sandbox *, struct sbx_file *,
			 const void *, size_t, off_t) =
		page_cache && fs->sb->ops->write_at ? fs->sb->ops->write_at
						    : fs->sb->ops->write;
	size_t size = fuse_buf_size(in_buf);
	int fd = fs->sb->ops->file_fd ? fs->sb->ops->file_fd(fs->sb, fh) : -1;
	struct fuse_bufvec mem = FUSE_BUFVEC_INIT(size);
	ssize_t n;

	if (fd >= 0 && !append) {
		struct fuse_bufvec out = FUSE_BUFVEC_INIT(size);

		out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
		out.buf[0].fd = fd;
		out.buf[0].pos = off;
		n = fuse_buf_copy(&out, in_buf, 0);
		return n < 0 ? sbx_error_set(SBX_ERR_OS, (int)n, "write: %s",
					     strerror((int)-n))
			     : n;
	}
	if (in_buf->count == 1 && !(in_buf->buf[0].flags & FUSE_BUF_IS_FD)) {
		mem.buf[0].mem = in_buf->buf[0].mem;
		n = (ssize_t)size;
	} else {
		/* Spliced or scattered input: gather into memory first. */
		mem.buf[0].mem = sbx_xmalloc(size);
		n = fuse_buf_copy(&mem, in_buf, 0);
	}
	if (n >= 0 && append && fd >= 0) {
		struct iovec iov = {mem.buf[0].mem, (size_t)n};

		n = pwritev2(fd, &iov, 1, -1, RWF_APPEND);
		if (n < 0)
			n = sbx_error_os("append");
	} else if (n >= 0) {
		n = write(fs->sb, fh, mem.buf[0].mem, (size_t)n, off);
	}
	if (mem.buf[0].mem != in_buf->buf[0].mem)
		free(mem.buf[0].mem);
	return n;
}

static void op_write_buf(fuse_req_t req, fuse_ino_t ino,
			 struct fuse_bufvec *in_buf, off_t off,
			 struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct sbx_file *fh;
	ssize_t n;
	int rc = io_file(fs, ino, fi, true, &fh);

	if (rc < 0)
		return reply_err(req, "write", rc);
	/*
	 * Per-open files carry O_APPEND themselves.  A page-cache write-back
	 * (mmap) comes through whichever writable open file the kernel
	 * picked, maybe an O_APPEND one, and belongs at its offset.
	 */
	n = write_data(fs, fh, in_buf, off,
		       !pfile_of(fi) && !fi->writepage &&
			       (fi->flags & O_APPEND),
		       fi->writepage);
	io_done(fs, fi, fh);
	if (n < 0)
		return reply_err(req, "write", (int)n);
	fuse_reply_write(req, (size_t)n);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	int rc;

	if (!pfile_of(fi)) {
		/* Zero-message opens: nothing per open to flush, ever. */
		fuse_reply_err(req, fs->zero_open ? ENOSYS : 0);
		return;
	}
	rc = fs->sb->ops->flush ? fs->sb->ops->flush(fs->sb, pfile_of(fi)) : 0;
	reply_rc(req, "flush", rc);
}

static void op_release(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_file *f = (struct fs_file *)(uintptr_t)fi->fh;
	int rc;

	if (!f) {
		/* A create() reply before the kernel learnt of zero opens. */
		fuse_reply_err(req, 0);
		return;
	}
	rc = fs->sb->ops->release(fs->sb, f->fh);
	if (f->writer)
		fs_inode_writers(fs, f->inode, -1);
	free(f);
	/* close(2) has returned already; the error only goes to the log. */
	if (rc < 0)
		sbx_warn("release: %s", sbx_error_last()->msg);
	fuse_reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
		     struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct sbx_file *fh;
	int rc = io_file(fs, ino, fi, false, &fh);

	if (rc == 0) {
		rc = fs->sb->ops->fsync(fs->sb, fh, datasync != 0);
		io_done(fs, fi, fh);
	}
	reply_rc(req, "fsync", rc);
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino,
		       struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_file *f;
	struct sbx_file *dh;
	uint64_t gen;
	int rc;

	if (fs->zero_open) {
		/* readdir opens its own handle; listings are cached. */
		fuse_reply_err(req, ENOSYS);
		return;
	}
	/* The handle may hold a snapshot of the listing from now on (the
	 * cache takes it at the first READDIR, which moves this on). */
	gen = fs_entry_gen(fs);
	rc = fs->sb->ops->opendir(fs->sb, node_of(fs, ino), &dh);
	if (rc < 0)
		return reply_err(req, "opendir", rc);
	f = sbx_xcalloc(1, sizeof(*f));
	f->entry_gen = gen;
	f->fh = dh;
	f->inode = fs_inode_get(fs, ino);
	fi->fh = (uintptr_t)f;
	/* The kernel may keep listings; the change stream invalidates them. */
	fi->cache_readdir = fs_healthy(fs);
	fi->keep_cache = fs_healthy(fs);
	if (fuse_reply_open(req, fi) != 0) {
		(void)fs->sb->ops->releasedir(fs->sb, dh);
		free(f);
	}
}

struct dir_fill {
	fuse_req_t req;
	struct fs *fs;
	fuse_ino_t dir;
	bool plus;
	char *buf;
	size_t size, used;
};

static int fill_entry(const char *name, const struct stat *st,
		      struct sbx_node *node, off_t next, void *payload)
{
	struct dir_fill *d = payload;
	size_t rem = d->size - d->used, need;

	if (!d->plus) {
		need = fuse_add_direntry(d->req, d->buf + d->used, rem, name,
					 st, next);
		if (need > rem)
			return 1;
		d->used += need;
		return 0;
	}
	need = fuse_add_direntry_plus(d->req, NULL, 0, name, NULL, 0);
	if (need > rem)
		return 1;

	struct fuse_entry_param e;

	memset(&e, 0, sizeof(e));
	e.attr = *st;
	if (node) {
		struct fs_inode *in = fs_inode_remember(d->fs, d->dir, name,
							node, st);

		e.ino = fs_inode_id(d->fs, in);
		e.attr_timeout = fs_timeout(d->fs);
		e.entry_timeout = fs_timeout(d->fs);
	}
	d->used += fuse_add_direntry_plus(d->req, d->buf + d->used, rem, name,
					  &e, next);
	return 0;
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size,
		       off_t off, struct fuse_file_info *fi, bool plus)
{
	struct fs *fs = fs_of(req);
	struct dir_fill d = {
		.req = req, .fs = fs, .dir = ino, .plus = plus, .size = size,
	};
	struct sbx_file *dh = pfile_of(fi), *tmp = NULL;
	struct fs_file *f = file_of(fi);
	uint64_t gen = f ? f->entry_gen : fs_entry_gen(fs);
	int rc;

	/* At offset 0 the provider takes its snapshot of the listing anew
	 * (rewinddir): changes before now are in it. */
	if (off == 0 && f)
		gen = f->entry_gen = fs_entry_gen(fs);
	if (!dh) {
		rc = fs->sb->ops->opendir(fs->sb, node_of(fs, ino), &tmp);
		if (rc < 0)
			return reply_err(req, "readdir", rc);
		dh = tmp;
	}
	d.buf = sbx_xmalloc(size);
	rc = fs->sb->ops->readdir(fs->sb, dh, off, plus ? SBX_READDIR_PLUS : 0,
				  fill_entry, &d);
	if (tmp)
		(void)fs->sb->ops->releasedir(fs->sb, tmp);
	/* Entries already in the buffer were remembered: send them. */
	if (rc < 0 && d.used == 0)
		reply_err(req, plus ? "readdirplus" : "readdir", rc);
	else
		fuse_reply_buf(req, d.buf, d.used);
	free(d.buf);
	fs_entry_replay(fs, ino, NULL, gen);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
		       struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size,
			   off_t off, struct fuse_file_info *fi)
{
	do_readdir(req, ino, size, off, fi, true);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino,
			  struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct fs_file *f = (struct fs_file *)(uintptr_t)fi->fh;

	if (f) {
		(void)fs->sb->ops->releasedir(fs->sb, f->fh);
		free(f);
	}
	fuse_reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
			struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	struct sbx_file *dh = pfile_of(fi), *tmp = NULL;
	int rc = 0;

	if (!fs->sb->ops->fsyncdir) {
		fuse_reply_err(req, 0);
		return;
	}
	if (!dh) {
		rc = fs->sb->ops->opendir(fs->sb, node_of(fs, ino), &tmp);
		dh = tmp;
	}
	if (rc == 0)
		rc = fs->sb->ops->fsyncdir(fs->sb, dh, datasync != 0);
	if (tmp)
		(void)fs->sb->ops->releasedir(fs->sb, tmp);

	reply_rc(req, "fsyncdir", rc);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct fs *fs = fs_of(req);
	struct statvfs sv;
	int rc = fs->sb->ops->statfs(fs->sb, node_of(fs, ino), &sv);

	if (rc < 0)
		return reply_err(req, "statfs", rc);
	fuse_reply_statfs(req, &sv);
}

static bool is_virtual_xattr(const char *name)
{
	return strcmp(name, XATTR_SESSION) == 0 ||
	       strcmp(name, XATTR_PATH) == 0 ||
	       strcmp(name, XATTR_CONTROL) == 0;
}

static void reply_xattr_value(fuse_req_t req, const char *value, size_t size)
{
	size_t len = strlen(value);

	if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, value, len);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			size_t size)
{
	struct fs *fs = fs_of(req);
	char *buf = NULL;
	ssize_t n;

	if (strcmp(name, XATTR_SESSION) == 0)
		return reply_xattr_value(req, fs->session, size);
	if (strcmp(name, XATTR_CONTROL) == 0) {
		if (!fs->control_socket) {
			fuse_reply_err(req, ENODATA);
			return;
		}
		return reply_xattr_value(req, fs->control_socket, size);
	}
	if (strcmp(name, XATTR_PATH) == 0) {
		int rc = fs->sb->ops->node_path(fs->sb, node_of(fs, ino), &buf);

		if (rc < 0)
			return reply_err(req, "getxattr", rc);
		reply_xattr_value(req, buf, size);
		free(buf);
		return;
	}
	if (!fs->sb->ops->getxattr) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	if (size)
		buf = sbx_xmalloc(size);
	n = fs->sb->ops->getxattr(fs->sb, node_of(fs, ino), name, buf, size);
	if (n < 0)
		reply_err(req, "getxattr", (int)n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct fs *fs = fs_of(req);
	char *buf = NULL;
	ssize_t n;

	/*
	 * The virtual attributes are not listed, so `cp -a` and `rsync -X`
	 * do not copy them onto other files.
	 */
	if (!fs->sb->ops->listxattr) {
		if (size)
			fuse_reply_buf(req, NULL, 0);
		else
			fuse_reply_xattr(req, 0);
		return;
	}
	if (size)
		buf = sbx_xmalloc(size);
	n = fs->sb->ops->listxattr(fs->sb, node_of(fs, ino), buf, size);
	if (n < 0)
		reply_err(req, "listxattr", (int)n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	free(buf);
}

/*
 * The virtual attributes are read-only, and a sandbox without the call
 * (`offered`) has none to change.  True when it replied.
 */
static bool xattr_write_refused(fuse_req_t req, const char *name,
				bool offered)
{
	if (is_virtual_xattr(name)) {
		fuse_reply_err(req, EPERM);
		return true;
	}
	if (!offered) {
		fuse_reply_err(req, EOPNOTSUPP);
		return true;
	}
	return false;
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name,
			const char *value, size_t size, int flags)
{
	struct fs *fs = fs_of(req);
	int rc;

	if (xattr_write_refused(req, name, fs->sb->ops->setxattr != NULL))
		return;
	rc = fs->sb->ops->setxattr(fs->sb, node_of(fs, ino), name, value, size,
				   flags);
	reply_rc(req, "setxattr", rc);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct fs *fs = fs_of(req);
	int rc;

	if (xattr_write_refused(req, name, fs->sb->ops->removexattr != NULL))
		return;
	rc = fs->sb->ops->removexattr(fs->sb, node_of(fs, ino), name);
	reply_rc(req, "removexattr", rc);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode,
			 off_t offset, off_t length, struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	int rc;

	if (!fs->sb->ops->fallocate) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	struct sbx_file *fh;

	rc = io_file(fs, ino, fi, true, &fh);
	if (rc == 0) {
		rc = fs->sb->ops->fallocate(fs->sb, fh, mode, offset, length);
		io_done(fs, fi, fh);
	}
	reply_rc(req, "fallocate", rc);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence,
		     struct fuse_file_info *fi)
{
	struct fs *fs = fs_of(req);
	off_t res;

	if (!fs->sb->ops->lseek) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	struct sbx_file *fh;
	int rc = io_file(fs, ino, fi, false, &fh);

	if (rc < 0)
		return reply_err(req, "lseek", rc);
	res = fs->sb->ops->lseek(fs->sb, fh, off, whence);
	io_done(fs, fi, fh);
	if (res < 0)
		return reply_err(req, "lseek", (int)res);
	fuse_reply_lseek(req, res);
}

static void op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in,
			       off_t off_in, struct fuse_file_info *fi_in,
			       fuse_ino_t ino_out, off_t off_out,
			       struct fuse_file_info *fi_out, size_t len,
			       int flags)
{
	struct fs *fs = fs_of(req);
	ssize_t n;

	if (!fs->sb->ops->copy_file_range) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	struct sbx_file *in, *out;
	int rc = io_file(fs, ino_in, fi_in, false, &in);

	if (rc < 0)
		return reply_err(req, "copy_file_range", rc);
	rc = io_file(fs, ino_out, fi_out, true, &out);
	if (rc < 0) {
		io_done(fs, fi_in, in);
		return reply_err(req, "copy_file_range", rc);
	}
	n = fs->sb->ops->copy_file_range(fs->sb, in, off_in, out, off_out, len,
					 flags);
	io_done(fs, fi_in, in);
	io_done(fs, fi_out, out);
	if (n < 0)
		return reply_err(req, "copy_file_range", (int)n);
	fuse_reply_write(req, (size_t)n);
}

const struct fuse_lowlevel_ops fs_ops = {
	.init = op_init,
	.lookup = op_lookup,
	.forget = op_forget,
	.forget_multi = op_forget_multi,
	.getattr = op_getattr,
	.setattr = op_setattr,
	.readlink = op_readlink,
	.mknod = op_mknod,
	.mkdir = op_mkdir,
	.symlink = op_symlink,
	.link = op_link,
	.unlink = op_unlink,
	.rmdir = op_rmdir,
	.rename = op_rename,
	.open = op_open,
	.create = op_create,
	.read = op_read,
	.write_buf = op_write_buf,
	.flush = op_flush,
	.release = op_release,
	.fsync = op_fsync,
	.opendir = op_opendir,
	.readdir = op_readdir,
	.readdirplus = op_readdirplus,
	.releasedir = op_releasedir,
	.fsyncdir = op_fsyncdir,
	.statfs = op_statfs,
	.getxattr = op_getxattr,
	.listxattr = op_listxattr,
	.setxattr = op_setxattr,
	.removexattr = op_removexattr,
	.fallocate = op_fallocate,
	.lseek = op_lseek,
	.copy_file_range = op_copy_file_range,
};
