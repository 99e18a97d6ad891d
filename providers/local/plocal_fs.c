/*
 * Local data plane: passthrough to the worktree on O_PATH descriptors.
 *
 * Every node holds an O_PATH|O_NOFOLLOW descriptor of its object, as
 * libfuse's passthrough_hp does, so renames anywhere in the tree need no
 * bookkeeping and a node can never be redirected by a symlink swapped in
 * behind it.  Operations that have no *at() form with AT_EMPTY_PATH go
 * through /proc/self/fd/N, which refers to the object itself.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/xmalloc.h"
#include "plocal_i.h"

#define PSB(sb) ((struct plocal_sandbox *)(sb))
#define PNODE(n) ((struct plocal_node *)(n))
#define PFILE(f) ((struct plocal_file *)(f))

static void procname(char out[64], int fd)
{
	snprintf(out, 64, "/proc/self/fd/%d", fd);
}

static int os_err(const char *what, const char *name)
{
	return sbx_error_os("%s %s", what, name ? name : "");
}

static struct sbx_node *p_root(struct sbx_sandbox *sb)
{
	return (struct sbx_node *)&PSB(sb)->root;
}

static int stat_fd(int fd, struct stat *st)
{
	if (fstatat(fd, "", st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		return sbx_error_os("fstat");
	return 0;
}

static int new_node(int fd, struct sbx_node **out, struct stat *st)
{
	struct plocal_node *n;
	int rc = stat_fd(fd, st);

	if (rc < 0) {
		close(fd);
		return rc;
	}
	n = sbx_xmalloc(sizeof(*n));
	n->fd = fd;
	n->dev = st->st_dev;
	n->ino = st->st_ino;
	*out = (struct sbx_node *)n;
	return 0;
}

static int p_lookup(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node **out, struct stat *st)
{
	struct plocal_node *dir = PNODE(parent);
	int fd;

	*out = NULL;
	/* ".." of the root would leave the worktree. */
	if (dir == &PSB(sb)->root && strcmp(name, "..") == 0)
		name = ".";
	fd = openat(dir->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return os_err("lookup", name);
	return new_node(fd, out, st);
}

static void p_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	struct plocal_node *n = PNODE(node);

	if (!n || n == &PSB(sb)->root)
		return;
	close(n->fd);
	free(n);
}

static int p_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	if (fh && PFILE(fh)->fd >= 0) {
		if (fstat(PFILE(fh)->fd, st) < 0)
			return sbx_error_os("fstat");
		return 0;
	}
	return stat_fd(PNODE(node)->fd, st);
}

static int p_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct plocal_node *n = PNODE(node);
	int fd = fh ? PFILE(fh)->fd : -1;
	char proc[64];
	int rc;

	procname(proc, n->fd);
	if (valid & SBX_SET_MODE) {
		rc = fd >= 0 ? fchmod(fd, in->st_mode)
			     : fchmodat(AT_FDCWD, proc, in->st_mode, 0);
		if (rc < 0)
			return sbx_error_os("chmod");
	}
	if (valid & (SBX_SET_UID | SBX_SET_GID)) {
		uid_t uid = (valid & SBX_SET_UID) ? in->st_uid : (uid_t)-1;
		gid_t gid = (valid & SBX_SET_GID) ? in->st_gid : (gid_t)-1;

		if (fchownat(n->fd, "", uid, gid,
			     AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
			return sbx_error_os("chown");
	}
	if (valid & SBX_SET_SIZE) {
		rc = fd >= 0 ? ftruncate(fd, in->st_size)
			     : truncate(proc, in->st_size);
		if (rc < 0)
			return sbx_error_os("truncate");
	}
	if (valid & (SBX_SET_ATIME | SBX_SET_MTIME)) {
		struct timespec tv[2];

		tv[0].tv_sec = 0;
		tv[1].tv_sec = 0;
		tv[0].tv_nsec = UTIME_OMIT;
		tv[1].tv_nsec = UTIME_OMIT;
		if (valid & SBX_SET_ATIME_NOW)
			tv[0].tv_nsec = UTIME_NOW;
		else if (valid & SBX_SET_ATIME)
			tv[0] = in->st_atim;
		if (valid & SBX_SET_MTIME_NOW)
			tv[1].tv_nsec = UTIME_NOW;
		else if (valid & SBX_SET_MTIME)
			tv[1] = in->st_mtim;
		if (fd >= 0)
			rc = futimens(fd, tv);
		else
			rc = utimensat(AT_FDCWD, proc, tv, 0);
		if (rc < 0 && errno == ELOOP) {
			/* A symlink itself: /proc would follow it. */
			errno = EPERM;
		}
		if (rc < 0)
			return sbx_error_os("utimens");
	}
	return p_getattr(sb, node, fh, out);
}

static int p_readlink(struct sbx_sandbox *sb, struct sbx_node *node,
		      char *buf, size_t size)
{
	ssize_t n = readlinkat(PNODE(node)->fd, "", buf, size);

	if (n < 0)
		return sbx_error_os("readlink");
	return (int)n;
}

/*
 * Bracket an entry-changing system call with the event it will cause, so
 * the change stream does not invalidate what the kernel already knows.
 * Evaluates `call` (an int < 0 on failure, errno set) and returns its rc.
 */
#define EXPECTING(sb, dir, name, mask, call)                                   \
	({                                                                     \
		struct plocal_expect *e_ =                                     \
			plocal_expect_begin(PSB(sb), PNODE(dir), name, mask);  \
		int rc_ = (call);                                              \
		int errno_ = errno;                                            \
		plocal_expect_end(PSB(sb), e_, rc_ >= 0);                      \
		errno = errno_;                                                \
		rc_;                                                           \
	})

/*
 * A new object belongs to whoever made it through the mount (struct
 * sbx_caller): with a shared mount (allow_other) the daemon runs as root
 * and would otherwise own everything.  The group is the caller's, or the
 * directory's when it is set-group-ID (the kernel gave it already).  Best
 * effort: a file system that refuses chown keeps the daemon as owner,
 * which is what a daemon that is not root gives anyway.
 */
static void give_to_caller(struct plocal_node *dir, struct sbx_node *node,
			   struct stat *st)
{
	const struct sbx_caller *c = sbx_caller_get();
	struct plocal_node *n = PNODE(node);
	struct stat dst;
	gid_t gid;

	if (!c || geteuid() != 0)
		return;
	gid = c->gid;
	if (stat_fd(dir->fd, &dst) == 0 && (dst.st_mode & S_ISGID))
		gid = st->st_gid;
	sbx_error_clear();
	if (st->st_uid == c->uid && st->st_gid == gid)
		return;
	if (fchownat(n->fd, "", c->uid, gid,
		     AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		return;
	/* chown clears set-user/group-ID bits the caller asked for. */
	if (S_ISREG(st->st_mode) && (st->st_mode & (S_ISUID | S_ISGID))) {
		char proc[64];

		procname(proc, n->fd);
		if (chmod(proc, st->st_mode & 07777) < 0) {
			/* keeps the mode chown left */
		}
	}
	if (stat_fd(n->fd, st) < 0)
		sbx_error_clear();
}

static int p_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   struct sbx_node **out, struct stat *st)
{
	int rc;

	if (EXPECTING(sb, parent, name, IN_CREATE,
		      mknodat(PNODE(parent)->fd, name, mode, rdev)) < 0)
		return os_err("mknod", name);
	rc = p_lookup(sb, parent, name, out, st);
	if (rc == 0)
		give_to_caller(PNODE(parent), *out, st);
	return rc;
}

static int p_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, struct sbx_node **out,
		   struct stat *st)
{
	int rc;

	if (EXPECTING(sb, parent, name, IN_CREATE | IN_ISDIR,
		      mkdirat(PNODE(parent)->fd, name, mode)) < 0)
		return os_err("mkdir", name);
	rc = p_lookup(sb, parent, name, out, st);
	if (rc == 0)
		give_to_caller(PNODE(parent), *out, st);
	return rc;
}

static int p_symlink(struct sbx_sandbox *sb, const char *target,
		     struct sbx_node *parent, const char *name,
		     struct sbx_node **out, struct stat *st)
{
	int rc;

	if (EXPECTING(sb, parent, name, IN_CREATE,
		      symlinkat(target, PNODE(parent)->fd, name)) < 0)
		return os_err("symlink", name);
	rc = p_lookup(sb, parent, name, out, st);
	if (rc == 0)
		give_to_caller(PNODE(parent), *out, st);
	return rc;
}

static int p_link(struct sbx_sandbox *sb, struct sbx_node *node,
		  struct sbx_node *newparent, const char *newname,
		  struct sbx_node **out, struct stat *st)
{
	char proc[64];

	procname(proc, PNODE(node)->fd);
	/* AT_EMPTY_PATH would need CAP_DAC_READ_SEARCH; /proc does not. */
	if (EXPECTING(sb, newparent, newname, IN_CREATE,
		      linkat(AT_FDCWD, proc, PNODE(newparent)->fd, newname,
			     AT_SYMLINK_FOLLOW)) < 0)
		return os_err("link", newname);
	return p_lookup(sb, newparent, newname, out, st);
}

static int p_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name)
{
	if (EXPECTING(sb, parent, name, IN_DELETE,
		      unlinkat(PNODE(parent)->fd, name, 0)) < 0)
		return os_err("unlink", name);
	return 0;
}

static int p_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name)
{
	if (EXPECTING(sb, parent, name, IN_DELETE | IN_ISDIR,
		      unlinkat(PNODE(parent)->fd, name, AT_REMOVEDIR)) < 0)
		return os_err("rmdir", name);
	return 0;
}

static int p_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node *newparent,
		    const char *newname, unsigned flags)
{
	struct plocal_expect *from = NULL, *to = NULL;
	int rc, err;

	/* An exchange reports moves both ways; let those invalidate. */
	if (!(flags & RENAME_EXCHANGE)) {
		struct stat st;
		uint32_t dir = 0;

		if (fstatat(PNODE(parent)->fd, name, &st,
			    AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
			dir = IN_ISDIR;
		from = plocal_expect_begin(PSB(sb), PNODE(parent), name,
					   IN_MOVED_FROM | dir);
		to = plocal_expect_begin(PSB(sb), PNODE(newparent), newname,
					 IN_MOVED_TO | dir);
	}
	rc = renameat2(PNODE(parent)->fd, name, PNODE(newparent)->fd, newname,
		       flags);
	err = errno;
	plocal_expect_end(PSB(sb), from, rc == 0);
	plocal_expect_end(PSB(sb), to, rc == 0);
	errno = err;
	if (rc < 0)
		return os_err("rename", name);
	return 0;
}

static struct plocal_file *new_file(int fd)
{
	struct plocal_file *f = sbx_xcalloc(1, sizeof(*f));

	f->fd = fd;
	pthread_mutex_init(&f->lock, NULL);
	return f;
}

static void fill_open(struct sbx_open_result *out, int fd)
{
	memset(out, 0, sizeof(*out));
	out->fh = (struct sbx_file *)new_file(fd);
	out->keep_cache = true;
}

static int p_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		  struct sbx_open_result *out)
{
	char proc[64];
	int fd;

	procname(proc, PNODE(node)->fd);
	/* The kernel resolved the path; never follow a swapped-in link. */
	fd = open(proc, (flags & ~(O_NOFOLLOW | O_CREAT | O_EXCL)) | O_CLOEXEC);
	if (fd < 0)
		return sbx_error_os("open");
	fill_open(out, fd);
	return 0;
}

static int p_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, mode_t mode, int flags,
		    struct sbx_node **node_out, struct stat *st,
		    struct sbx_open_result *out)
{
	bool made = true;
	int fd, rc;

	flags = (flags | O_CLOEXEC) & ~O_NOFOLLOW;
	/* Exclusive first, so we know whether IN_CREATE will come. */
	fd = EXPECTING(sb, parent, name, IN_CREATE,
		       openat(PNODE(parent)->fd, name, flags | O_CREAT | O_EXCL,
			      mode));
	if (fd < 0 && errno == EEXIST && !(flags & O_EXCL)) {
		made = false;
		fd = openat(PNODE(parent)->fd, name, flags & ~O_CREAT, mode);
	}
	if (fd < 0)
		return os_err("create", name);
	rc = p_lookup(sb, parent, name, node_out, st);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	if (made)
		give_to_caller(PNODE(parent), *node_out, st);
	fill_open(out, fd);
	return 0;
}

static ssize_t p_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		      size_t size, off_t off)
{
	ssize_t n = pread(PFILE(fh)->fd, buf, size, off);

	return n < 0 ? sbx_error_os("read") : n;
}

static int p_file_fd(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	return PFILE(fh)->fd;
}

static ssize_t p_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *buf, size_t size, off_t off)
{
	ssize_t n = pwrite(PFILE(fh)->fd, buf, size, off);

	return n < 0 ? sbx_error_os("write") : n;
}

static int p_flush(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	/* Writes are write-through: nothing buffered here. */
	return 0;
}

static int p_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	int rc = datasync ? fdatasync(PFILE(fh)->fd) : fsync(PFILE(fh)->fd);

	return rc < 0 ? sbx_error_os("fsync") : 0;
}

static int p_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	struct plocal_file *f = PFILE(fh);
	int rc = 0;

	if (f->dir)
		closedir(f->dir); /* closes f->fd too */
	else if (f->fd >= 0 && close(f->fd) < 0)
		rc = sbx_error_os("close");
	pthread_mutex_destroy(&f->lock);
	free(f);
	return rc;
}

static int p_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		       off_t off, off_t len)
{
	if (fallocate(PFILE(fh)->fd, mode, off, len) < 0)
		return sbx_error_os("fallocate");
	return 0;
}

static off_t p_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		     int whence)
{
	off_t r = lseek(PFILE(fh)->fd, off, whence);

	return r < 0 ? sbx_error_os("lseek") : r;
}

static ssize_t p_copy_file_range(struct sbx_sandbox *sb, struct sbx_file *in,
				 off_t off_in, struct sbx_file *out,
				 off_t off_out, size_t len, int flags)
{
	ssize_t n = copy_file_range(PFILE(in)->fd, &off_in, PFILE(out)->fd,
				    &off_out, len, (unsigned)flags);

	return n < 0 ? sbx_error_os("copy_file_range") : n;
}

static int p_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file **out)
{
	struct plocal_file *f;
	DIR *dir;
	int fd;

	fd = openat(PNODE(node)->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return sbx_error_os("opendir");
	dir = fdopendir(fd);
	if (!dir) {
		int rc = sbx_error_os("fdopendir");

		close(fd);
		return rc;
	}
	f = new_file(fd);
	f->dir = dir;
	*out = (struct sbx_file *)f;
	return 0;
}

static int p_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		     unsigned flags, sbx_dirent_cb cb, void *payload)
{
	struct plocal_file *d = PFILE(dh);
	bool plus = flags & SBX_READDIR_PLUS;
	int rc = 0;

	pthread_mutex_lock(&d->lock);
	if (off != d->dir_off) {
		seekdir(d->dir, off);
		d->dir_off = off;
	}
	for (;;) {
		struct sbx_node *node = NULL;
		struct dirent *e;
		struct stat st;
		bool dot;

		errno = 0;
		e = readdir(d->dir);
		if (!e) {
			if (errno)
				rc = sbx_error_os("readdir");
			break;
		}
		dot = strcmp(e->d_name, ".") == 0 ||
		      strcmp(e->d_name, "..") == 0;
		memset(&st, 0, sizeof(st));
		st.st_ino = e->d_ino;
		st.st_mode = (mode_t)DTTOIF(e->d_type);
		if (plus && !dot) {
			int fd = openat(d->fd, e->d_name,
					O_PATH | O_NOFOLLOW | O_CLOEXEC);

			/* Vanished since readdir: skip it like ls does. */
			if (fd < 0 || new_node(fd, &node, &st) < 0) {
				sbx_error_clear();
				d->dir_off = e->d_off;
				continue;
			}
		}
		if (cb(e->d_name, &st, node, e->d_off, payload) != 0) {
			/* Not consumed: offer it again next time. */
			p_forget(sb, node);
			seekdir(d->dir, d->dir_off);
			break;
		}
		d->dir_off = e->d_off;
	}
	pthread_mutex_unlock(&d->lock);
	return rc;
}

static int p_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh,
		      bool datasync)
{
	int fd = PFILE(dh)->fd;
	int rc = datasync ? fdatasync(fd) : fsync(fd);

	return rc < 0 ? sbx_error_os("fsyncdir") : 0;
}

static int p_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	return p_release(sb, dh);
}

static int p_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct statvfs *out)
{
	if (fstatvfs(PNODE(node)->fd, out) < 0)
		return sbx_error_os("statfs");
	return 0;
}

/*
 * xattrs go through /proc/self/fd, which follows to the object; for a
 * symlink that would be its target, so symlinks have none here.
 */
static int xattr_path(struct sbx_node *node, char proc[64])
{
	struct stat st;
	int rc = stat_fd(PNODE(node)->fd, &st);

	if (rc < 0)
		return rc;
	if (S_ISLNK(st.st_mode))
		return sbx_error_set(SBX_ERR_OS, -EOPNOTSUPP,
				     "xattrs on symlinks are not supported");
	procname(proc, PNODE(node)->fd);
	return 0;
}

static ssize_t p_getxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			  const char *name, void *buf, size_t size)
{
	char proc[64];
	int rc = xattr_path(node, proc);
	ssize_t n;

	if (rc < 0)
		return rc;
	n = getxattr(proc, name, buf, size);
	return n < 0 ? os_err("getxattr", name) : n;
}

static ssize_t p_listxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			   char *buf, size_t size)
{
	char proc[64];
	int rc = xattr_path(node, proc);
	ssize_t n;

	if (rc == -EOPNOTSUPP) {
		sbx_error_clear();
		return 0;
	}
	if (rc < 0)
		return rc;
	n = listxattr(proc, buf, size);
	return n < 0 ? sbx_error_os("listxattr") : n;
}

static int p_setxattr(struct sbx_sandbox *sb, struct sbx_node *node,
		      const char *name, const void *value, size_t size,
		      int flags)
{
	char proc[64];
	int rc = xattr_path(node, proc);

	if (rc < 0)
		return rc;
	if (setxattr(proc, name, value, size, flags) < 0)
		return os_err("setxattr", name);
	return 0;
}

static int p_removexattr(struct sbx_sandbox *sb, struct sbx_node *node,
			 const char *name)
{
	char proc[64];
	int rc = xattr_path(node, proc);

	if (rc < 0)
		return rc;
	if (removexattr(proc, name) < 0)
		return os_err("removexattr", name);
	return 0;
}

static int p_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		       char **out)
{
	char proc[64], buf[PATH_MAX];
	ssize_t n;

	*out = NULL;
	procname(proc, PNODE(node)->fd);
	n = readlink(proc, buf, sizeof(buf) - 1);
	if (n < 0)
		return sbx_error_os("path of node");
	buf[n] = '\0';
	*out = sbx_xstrdup(buf);
	return 0;
}

static void p_free(struct sbx_sandbox *sb)
{
	struct plocal_sandbox *s = PSB(sb);

	if (!s)
		return;
	if (s->watch)
		plocal_watch_stop(sb);
	if (s->root.fd >= 0)
		close(s->root.fd);
	free(s->base.session);
	free(s->base.workdir);
	free(s->root_path);
	free(s->gitdir);
	free(s->state_dir);
	free(s->isolation);
	free(s);
}

const struct sbx_sandbox_ops plocal_sandbox_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.root = p_root,
	.lookup = p_lookup,
	.forget = p_forget,
	.getattr = p_getattr,
	.setattr = p_setattr,
	.readlink = p_readlink,
	.mknod = p_mknod,
	.mkdir = p_mkdir,
	.symlink = p_symlink,
	.link = p_link,
	.unlink = p_unlink,
	.rmdir = p_rmdir,
	.rename = p_rename,
	.open = p_open,
	.create = p_create,
	.read = p_read,
	.file_fd = p_file_fd,
	.write = p_write,
	.flush = p_flush,
	.fsync = p_fsync,
	.release = p_release,
	.fallocate = p_fallocate,
	.lseek = p_lseek,
	.copy_file_range = p_copy_file_range,
	.opendir = p_opendir,
	.readdir = p_readdir,
	.fsyncdir = p_fsyncdir,
	.releasedir = p_releasedir,
	.statfs = p_statfs,
	.getxattr = p_getxattr,
	.listxattr = p_listxattr,
	.setxattr = p_setxattr,
	.removexattr = p_removexattr,
	.node_path = p_node_path,
	.exec_start = plocal_exec_start,
	.watch_start = plocal_watch_start,
	.watch_sync = plocal_watch_sync,
	.watch_stop = plocal_watch_stop,
	.free = p_free,
};

int plocal_sandbox_open(struct plocal_provider *p, const char *session,
			const char *path, struct sbx_sandbox **out)
{
	struct plocal_sandbox *s;
	const struct cJSON *cfg = p->base.config;
	struct stat st;
	int rc;

	*out = NULL;
	s = sbx_xcalloc(1, sizeof(*s));
	s->base.ops = &plocal_sandbox_ops;
	s->base.session = sbx_xstrdup(session);
	s->root.fd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (s->root.fd < 0) {
		rc = sbx_error_os("open worktree %s of session %s", path,
				  session);
		goto fail;
	}
	rc = stat_fd(s->root.fd, &st);
	if (rc < 0)
		goto fail;
	s->root.dev = st.st_dev;
	s->root.ino = st.st_ino;
	s->root_path = realpath(path, NULL);
	if (!s->root_path) {
		rc = sbx_error_os("resolve worktree %s", path);
		goto fail;
	}
	s->base.workdir = sbx_xstrdup(s->root_path);
	rc = plocal_git_commondir(s->root_path, &s->gitdir);
	if (rc < 0)
		goto fail;
	if (p->worktrees) {
		/* $SBX_HOME is the parent of its worktrees directory. */
		char *home = sbx_xasprintf("%s/..", p->worktrees);

		s->state_dir = realpath(home, NULL);
		free(home);
	}
	s->isolation = sbx_xstrdup("none");
	s->network = true;
	if (cfg) {
		const cJSON *iso = cJSON_GetObjectItemCaseSensitive(cfg,
								   "isolation");
		const cJSON *net = cJSON_GetObjectItemCaseSensitive(cfg,
								   "network");

		if (cJSON_IsString(iso)) {
			free(s->isolation);
			s->isolation = sbx_xstrdup(iso->valuestring);
		}
		if (cJSON_IsBool(net))
			s->network = cJSON_IsTrue(net);
	}
	*out = &s->base;
	return 0;
fail:
	p_free(&s->base);
	return rc;
}
