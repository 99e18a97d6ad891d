/*
 * The in-memory sandbox's open files and directory listings.  An open file
 * is a path (see pmem.h), resolved at every call.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "sbx/proto.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "pmem_i.h"

static struct pfile *file_new(const char *path, int flags)
{
	struct pfile *f = sbx_xcalloc(1, sizeof(*f));

	f->path = sbx_xstrdup(path);
	f->flags = flags;
	return f;
}

static void snap_clear(struct pfile *f)
{
	for (size_t i = 0; i < f->nsnap; i++) {
		free(f->snap[i].name);
		free(f->snap[i].path);
	}
	free(f->snap);
	f->snap = NULL;
	f->nsnap = 0;
}

static void file_free(struct pfile *f)
{
	if (!f)
		return;
	snap_clear(f);
	free(f->path);
	free(f);
}

static bool writable(int flags)
{
	return (flags & O_ACCMODE) != O_RDONLY;
}

/* Open the object at path: checks, O_TRUNC.  arg: the open flags. */
static int open_fn(struct pmem *s, const char *path, void *arg)
{
	int flags = *(const int *)arg;
	struct pinode *in;
	int rc = pmem_walk_locked(s, path, &in);

	if (rc < 0)
		return rc;
	if (S_ISDIR(in->mode) && writable(flags))
		return sbx_error_set(SBX_ERR_REMOTE, -EISDIR,
				     "open %s: is a directory", path);
	if ((flags & O_TRUNC) && writable(flags) && S_ISREG(in->mode))
		rc = pmem_truncate_locked(s, path, 0);
	return rc;
}

int pmem_op_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		 struct sbx_open_result *out)
{
	const char *path = PNODE(node)->path;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = pmem_path_op(PMEM(sb), OP_OPEN, path, open_fn, &flags);
	if (rc == 0) {
		struct pfile *f = file_new(path, flags);

		f->expect_ino = PNODE(node)->expect_ino;
		out->fh = (struct sbx_file *)f;
	}
	return rc;
}

struct create_args {
	mode_t mode;
	int flags;
	struct stat *st;
};

/* Open the file at path, making it when missing (and O_EXCL honoured). */
static int create_fn(struct pmem *s, const char *path, void *arg)
{
	struct create_args *a = arg;
	struct pinode *in;
	int rc = pmem_walk_locked(s, path, &in);

	if (rc == 0 && (a->flags & O_EXCL)) {
		rc = sbx_error_set(SBX_ERR_REMOTE, -EEXIST, "%s: file exists",
				   path);
	} else if (rc == 0) {
		rc = open_fn(s, path, &a->flags);
	} else if (rc == -ENOENT) {
		sbx_error_clear();
		rc = pmem_make_locked(s, path, S_IFREG | (a->mode & 07777), 0,
				      NULL, NULL);
	}
	if (rc == 0)
		rc = pmem_stat_locked(s, path, a->st);
	return rc;
}

int pmem_op_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, int flags,
		   struct sbx_node **node_out, struct stat *st,
		   struct sbx_open_result *out)
{
	struct create_args a = { mode, flags, st };
	int rc;

	memset(out, 0, sizeof(*out));
	rc = pmem_child_op(PMEM(sb), OP_CREATE, parent, name, create_fn, &a,
			   node_out);
	if (rc == 0)
		out->fh = (struct sbx_file *)file_new(PNODE(*node_out)->path,
						      flags);
	return rc;
}

/* A read, write, fallocate or lseek: its arguments, and its count or
 * offset (`n`) once done. */
struct io_args {
	void *buf;
	const void *cbuf;
	size_t size;
	off_t off, len;
	int flags;  /* write: the open flags; lseek: whence; fallocate: mode */
	ino_t ino;  /* read, write: the inode it is for (0: any) */
	ssize_t n;
};

static int read_fn(struct pmem *s, const char *path, void *arg)
{
	struct io_args *a = arg;
	struct pinode *in;
	int rc;

	if (a->off < 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "read %s: offset < 0", path);
	/* As the agent's client: never another file moved onto it. */
	rc = pmem_check_ino_locked(s, path, a->ino, "read");
	if (rc == 0)
		rc = pmem_regular_locked(s, path, &in);
	if (rc == 0 && (size_t)a->off < in->size) {
		a->n = (ssize_t)(in->size - (size_t)a->off < a->size
					 ? in->size - (size_t)a->off
					 : a->size);
		memcpy(a->buf, in->data + a->off, (size_t)a->n);
	}
	return rc;
}

ssize_t pmem_op_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		     size_t size, off_t off)
{
	struct io_args a = { .buf = buf, .size = size, .off = off,
			     .ino = PFILE(fh)->expect_ino };
	int rc = pmem_path_op(PMEM(sb), OP_READ, PFILE(fh)->path, read_fn, &a);

	return rc < 0 ? rc : a.n;
}

static int write_fn(struct pmem *s, const char *path, void *arg)
{
	struct io_args *a = arg;
	/* As the agent: never into another file moved onto it. */
	int rc = pmem_check_ino_locked(s, path, a->ino, "write");

	if (rc < 0)
		return rc;
	a->n = pmem_write_locked(s, path, a->cbuf, a->size, a->off,
				 a->flags & O_APPEND);
	return a->n < 0 ? (int)a->n : 0;
}

ssize_t pmem_op_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		      const void *buf, size_t size, off_t off)
{
	struct pfile *f = PFILE(fh);
	struct io_args a = { .cbuf = buf, .size = size, .off = off,
			     .flags = f->flags, .ino = f->expect_ino };
	int rc = pmem_path_op(PMEM(sb), OP_WRITE, f->path, write_fn, &a);

	return rc < 0 ? rc : a.n;
}

struct wthen_args {
	struct io_args io;
	const struct sbx_write_then *then;
	struct stat *st;
	bool *written;
};

/* write_then: the whole write, then the fsync (nothing to do) or the
 * setattr, then the file's attributes. */
static int write_then_fn(struct pmem *s, const char *path, void *arg)
{
	struct wthen_args *a = arg;
	int rc = write_fn(s, path, &a->io);

	if (rc == 0 && (size_t)a->io.n != a->io.size)
		rc = sbx_error_set(SBX_ERR_REMOTE, -EIO, "%s: short write",
				   path);
	if (rc < 0)
		return rc;
	*a->written = true;
	rc = pmem_fault_locked(s, OP_THEN, path);
	if (rc < 0)
		return rc;
	if (a->then->kind == SBX_THEN_SETATTR)
		return pmem_setattr_locked(s, path, a->then->in,
					   a->then->valid, a->st);
	return pmem_stat_locked(s, path, a->st);
}

int pmem_op_write_then(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *buf, size_t size, off_t off,
		       const struct sbx_write_then *then, struct stat *st,
		       bool *written)
{
	struct pfile *f = PFILE(fh);
	struct wthen_args a = {
		.io = { .cbuf = buf, .size = size, .off = off,
			.flags = f->flags, .ino = f->expect_ino },
		.then = then,
		.st = st,
		.written = written,
	};

	*written = false;
	if (f->flags & O_APPEND)
		return sbx_error_set(SBX_ERR_OS, -E2BIG,
				     "write_then: O_APPEND");
	return pmem_path_op(PMEM(sb), OP_WRITE_THEN, f->path, write_then_fn,
			    &a);
}

int pmem_op_flush(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	return pmem_enter(PMEM(sb), OP_FLUSH, PFILE(fh)->path);
}

/* fsync/fsyncdir: the path must still be there (the agent opens it). */
static int sync_path(struct pmem *s, enum op op, const char *path)
{
	return pmem_path_op(s, op, path, pmem_stat_locked, NULL);
}

int pmem_op_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	return sync_path(PMEM(sb), OP_FSYNC, PFILE(fh)->path);
}

int pmem_op_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	int rc = pmem_enter(PMEM(sb), OP_RELEASE, PFILE(fh)->path);

	file_free(PFILE(fh));
	return rc;
}

static int fallocate_fn(struct pmem *s, const char *path, void *arg)
{
	struct io_args *a = arg;
	struct pinode *in;
	int rc;

	if (a->flags != 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP,
				     "fallocate %s: mode %d", path, a->flags);
	if (a->off < 0 || a->len <= 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "fallocate %s: bad range", path);
	rc = pmem_regular_locked(s, path, &in);
	if (rc == 0 && (size_t)(a->off + a->len) > in->size)
		pmem_data_changed_locked(s, in, path,
					 (size_t)(a->off + a->len));
	return rc;
}

int pmem_op_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		      off_t off, off_t len)
{
	struct io_args a = { .off = off, .len = len, .flags = mode };

	return pmem_path_op(PMEM(sb), OP_FALLOCATE, PFILE(fh)->path,
			    fallocate_fn, &a);
}

static int lseek_fn(struct pmem *s, const char *path, void *arg)
{
	struct io_args *a = arg;
	struct pinode *in;
	int rc;

	if (a->flags != SEEK_DATA && a->flags != SEEK_HOLE)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "lseek %s: whence %d", path, a->flags);
	rc = pmem_regular_locked(s, path, &in);
	if (rc < 0)
		return rc;
	if (a->off < 0 || (size_t)a->off >= in->size)
		return sbx_error_set(SBX_ERR_REMOTE, -ENXIO,
				     "lseek %s: past the end", path);
	a->n = a->flags == SEEK_DATA ? a->off : (off_t)in->size;
	return 0;
}

off_t pmem_op_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		    int whence)
{
	struct io_args a = { .off = off, .flags = whence };
	int rc = pmem_path_op(PMEM(sb), OP_LSEEK, PFILE(fh)->path, lseek_fn,
			      &a);

	return rc < 0 ? rc : (off_t)a.n;
}

static int opendir_fn(struct pmem *s, const char *path, void *arg)
{
	struct pinode *in;
	int rc = pmem_walk_locked(s, path, &in);

	if (rc == 0 && !S_ISDIR(in->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				   "opendir %s: not a directory", path);
	return rc;
}

int pmem_op_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct sbx_file **out)
{
	const char *path = PNODE(node)->path;
	struct pfile *f;
	int rc;

	*out = NULL;
	rc = pmem_path_op(PMEM(sb), OP_OPENDIR, path, opendir_fn, NULL);
	if (rc < 0)
		return rc;
	f = file_new(path, O_RDONLY);
	f->is_dir = true;
	*out = (struct sbx_file *)f;
	return 0;
}

/* The listing of d's directory, "." and ".." first. */
static int snapshot_locked(struct pmem *s, struct pfile *d)
{
	struct pinode *in, *up;
	const char *slash = strrchr(d->path, '/');
	char *upath;
	int rc = pmem_walk_locked(s, d->path, &in);

	if (rc == 0 && !S_ISDIR(in->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				   "readdir %s: not a directory", d->path);
	if (rc < 0)
		return rc;
	upath = slash ? sbx_xstrndup(d->path, (size_t)(slash - d->path))
		      : sbx_xstrdup("");
	if (pmem_walk_locked(s, upath, &up) < 0) {
		sbx_error_clear();
		up = in;
	}
	free(upath);
	snap_clear(d);
	d->snap = sbx_xcalloc(in->nents + 2, sizeof(*d->snap));
	d->snap[0].name = sbx_xstrdup(".");
	pmem_fill_stat(s, in, &d->snap[0].st);
	d->snap[1].name = sbx_xstrdup("..");
	pmem_fill_stat(s, up, &d->snap[1].st);
	for (size_t i = 0; i < in->nents; i++) {
		struct psnap *e = &d->snap[i + 2];

		e->name = sbx_xstrdup(in->ents[i].name);
		pmem_fill_stat(s, in->ents[i].ino, &e->st);
		e->path = sbx_proto_path_join(d->path, e->name);
	}
	d->nsnap = in->nents + 2;
	d->fetched = true;
	return 0;
}

int pmem_op_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		    unsigned flags, sbx_dirent_cb cb, void *payload)
{
	struct pmem *s = PMEM(sb);
	struct pfile *d = PFILE(dh);
	int rc = pmem_enter(s, OP_READDIR, d->path);

	if (rc < 0)
		return rc;
	if (!d->is_dir)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				     "readdir %s: not a directory", d->path);
	if (!d->fetched || off == 0) {
		pthread_mutex_lock(&s->lock);
		rc = snapshot_locked(s, d);
		if (rc == 0)
			pmem_gate_locked(s, OP_READDIR, d->path, true);
		pthread_mutex_unlock(&s->lock);
		if (rc < 0)
			return rc;
	}
	for (size_t i = off > 0 ? (size_t)off : 0; i < d->nsnap; i++) {
		struct psnap *e = &d->snap[i];
		struct sbx_node *node = NULL;

		if ((flags & SBX_READDIR_PLUS) && e->path)
			node = (struct sbx_node *)pmem_node_new(e->path);
		if (cb(e->name, &e->st, node, (off_t)i + 1, payload) != 0) {
			pmem_node_free(PNODE(node));
			break;
		}
	}
	return 0;
}

int pmem_op_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh,
		     bool datasync)
{
	return sync_path(PMEM(sb), OP_FSYNCDIR, PFILE(dh)->path);
}

int pmem_op_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	int rc = pmem_enter(PMEM(sb), OP_RELEASEDIR, PFILE(dh)->path);

	file_free(PFILE(dh));
	return rc;
}

int pmem_op_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		   struct statvfs *out)
{
	struct pmem *s = PMEM(sb);
	unsigned long used = 0, files = 0;
	int rc = pmem_enter(s, OP_STATFS, PNODE(node)->path);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < s->itab_cap; i++)
		if (s->itab[i]) {
			files++;
			used += (s->itab[i]->size + 4095) / 4096;
		}
	pthread_mutex_unlock(&s->lock);
	memset(out, 0, sizeof(*out));
	out->f_bsize = out->f_frsize = 4096;
	out->f_blocks = 1u << 20;
	out->f_bfree = out->f_bavail = out->f_blocks - used;
	out->f_files = 1u << 20;
	out->f_ffree = out->f_favail = out->f_files - files;
	out->f_namemax = 255;
	return 0;
}

int pmem_op_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		      char **out)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	int rc;

	*out = NULL;
	rc = pmem_enter(s, OP_NODE_PATH, path);
	if (rc < 0)
		return rc;
	*out = *path ? sbx_xasprintf("%s/%s", s->base.workdir, path)
		     : sbx_xstrdup(s->base.workdir);
	return 0;
}
