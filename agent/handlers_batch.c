/*
 * POST /v1/fs/batch (docs/protocol.md, "Batch ops"): the ops decoded by
 * lib/proto_batch.c run here in order, each answering its own result.
 *
 * Paths go through confine.c as in handlers_fs.c: operations on the last
 * component use the parent's fd and the bare name with the *at() calls,
 * never following a symlink there.  Where no *at() call can act on an
 * inode without following (chmod, xattrs, utimens of the root), the
 * object is opened O_PATH | O_NOFOLLOW and addressed as /proc/self/fd/N,
 * which names exactly that inode.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

#define MAX_XATTR (64 * 1024)

/* An O_PATH fd on the object itself (never following a last symlink). */
struct obj {
	int fd;
	struct stat st;
	char proc[48]; /* /proc/self/fd/N */
};

static int obj_open(int dfd, const char *name, struct obj *o, const char *what)
{
	o->fd = *name ? openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)
		      : fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	if (o->fd < 0)
		return sbx_error_os("%s", what);
	if (fstat(o->fd, &o->st) < 0) {
		int rc = sbx_error_os("%s", what);

		close(o->fd);
		o->fd = -1;
		return rc;
	}
	snprintf(o->proc, sizeof(o->proc), "/proc/self/fd/%d", o->fd);
	return 0;
}

static void obj_close(struct obj *o)
{
	if (o->fd >= 0)
		close(o->fd);
	o->fd = -1;
}

/* Set for the op: its result lands in `res`. */
struct exec_ctx {
	struct agent *a;
	int dfd;
	const char *name;
	char *buf;
};

static int parent_of(struct exec_ctx *x, const char *path)
{
	return agent_parent(x->a, path, &x->dfd, &x->name, &x->buf);
}

static void ctx_fini(struct exec_ctx *x)
{
	if (x->dfd >= 0)
		close(x->dfd);
	x->dfd = -1;
	free(x->buf);
	x->buf = NULL;
}

/* Creating or removing the root (or "x/..") makes no sense. */
static int need_name(struct exec_ctx *x, const char *path)
{
	if (!*x->name)
		return sbx_error_set(SBX_ERR_OS, -EBUSY,
				     "%s: not allowed on the root or \"..\"",
				     *path ? path : "/");
	return 0;
}

static mode_t agent_umask;
static pthread_once_t agent_umask_once = PTHREAD_ONCE_INIT;

/* The agent's umask, read without changing it (threads share it). */
static void read_umask(void)
{
	char line[128];
	unsigned v;
	FILE *f = fopen("/proc/self/status", "re");

	agent_umask = 022;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Umask: %o", &v) == 1)
			agent_umask = (mode_t)(v & 0777);
	fclose(f);
}

/*
 * A new object made for a client: the mode it asked for (the client's
 * kernel applied the caller's umask already; the agent's own must not
 * take more bits away), and, when the agent runs as root, the owner it
 * names (the group stays the directory's when that is set-group-ID).
 * Best effort, as a file system that cannot chown keeps the agent's user.
 */
static void fix_new(struct exec_ctx *x, const struct sbx_batch_op *op)
{
	struct stat st, dst;
	bool chowned = false;

	if (fstatat(x->dfd, x->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return;
	if (geteuid() == 0 && (op->has_uid || op->has_gid)) {
		uid_t uid = op->has_uid ? (uid_t)op->uid : (uid_t)-1;
		gid_t gid = op->has_gid ? (gid_t)op->gid : (gid_t)-1;

		if (fstat(x->dfd, &dst) == 0 && (dst.st_mode & S_ISGID))
			gid = (gid_t)-1;
		if ((uid != (uid_t)-1 && uid != st.st_uid) ||
		    (gid != (gid_t)-1 && gid != st.st_gid))
			chowned = fchownat(x->dfd, x->name, uid, gid,
					   AT_SYMLINK_NOFOLLOW) == 0;
	}
	if (S_ISLNK(st.st_mode) || !op->has_mode)
		return;
	pthread_once(&agent_umask_once, read_umask);
	/* Bits our umask took, and set-ID bits chown cleared. */
	if ((op->mode & agent_umask & 0777) ||
	    (chowned && (st.st_mode & (S_ISUID | S_ISGID)))) {
		mode_t m = (st.st_mode & 07777) | (op->mode & 0777);

		if (fchmodat(x->dfd, x->name, m, 0) < 0) {
			/* keeps the mode it has */
		}
	}
}

static int stat_result(struct exec_ctx *x, const char *path, cJSON *res)
{
	struct stat st;
	int rc = agent_stat_at(x->dfd, x->name, &st, path);

	if (rc == 0)
		agent_put_st(res, &st);
	return rc;
}

/* mkdir, mknod, create, symlink: make the object, then its mode, owner
 * and the stat result. */
static int make_node(struct exec_ctx *x, const struct sbx_batch_op *op,
		     cJSON *res)
{
	const char *p = op->path;
	bool made = true;
	int fd, e = 0;

	switch (op->kind) {
	case SBX_BATCH_MKDIR:
		e = mkdirat(x->dfd, x->name, (mode_t)op->mode);
		break;
	case SBX_BATCH_MKNOD:
		e = mknodat(x->dfd, x->name, (mode_t)op->mode, (dev_t)op->rdev);
		break;
	case SBX_BATCH_SYMLINK:
		e = symlinkat(op->target, x->dfd, x->name);
		break;
	case SBX_BATCH_CREATE: {
		int fl = O_CREAT | O_WRONLY | O_NOFOLLOW | O_NOCTTY |
			 O_NONBLOCK | O_CLOEXEC | (op->truncate ? O_TRUNC : 0);

		/* O_NOFOLLOW: never create through a symlink.  Exclusive
		 * first, so an existing file keeps its owner and mode. */
		fd = openat(x->dfd, x->name, fl | O_EXCL,
			    (mode_t)(op->mode & 07777));
		if (fd < 0 && errno == EEXIST && !op->excl) {
			made = false;
			fd = openat(x->dfd, x->name, fl,
				    (mode_t)(op->mode & 07777));
		}
		if (fd >= 0)
			close(fd);
		e = fd < 0 ? -1 : 0;
		break;
	}
	}
	if (e < 0)
		return sbx_error_os("%s %s", sbx_batch_kind_name(op->kind), p);
	if (made)
		fix_new(x, op);
	return stat_result(x, p, res);
}

static int op_setattr(struct exec_ctx *x, const struct sbx_batch_op *op,
		      cJSON *res)
{
	struct obj o = { .fd = -1 };
	const char *p = op->path;
	int rc;

	rc = obj_open(x->dfd, x->name, &o, p);
	if (rc < 0)
		return rc;
	/* Meant for one file (as a write with `ino`): the object is held
	 * open, so the check and the changes are about the same one. */
	if (op->ino && (uint64_t)o.st.st_ino != op->ino)
		rc = sbx_error_set(SBX_ERR_OS, -ESTALE,
				   "setattr %s: the path names another file "
				   "now",
				   p);
	if (rc == 0 && op->has_mode) {
		if (S_ISLNK(o.st.st_mode))
			rc = sbx_error_set(SBX_ERR_OS, -EOPNOTSUPP,
					   "chmod %s: a symlink", p);
		else if (chmod(o.proc, (mode_t)op->mode) < 0)
			rc = sbx_error_os("chmod %s", p);
	}
	if (rc == 0 && (op->has_uid || op->has_gid) &&
	    fchownat(o.fd, "", op->has_uid ? (uid_t)op->uid : (uid_t)-1,
		     op->has_gid ? (gid_t)op->gid : (gid_t)-1,
		     AT_EMPTY_PATH) < 0)
		rc = sbx_error_os("chown %s", p);
	if (rc == 0 && op->has_size) {
		int fd;

		if (S_ISLNK(o.st.st_mode) || S_ISDIR(o.st.st_mode)) {
			rc = sbx_error_set(SBX_ERR_OS,
					   S_ISDIR(o.st.st_mode) ? -EISDIR
								 : -EINVAL,
					   "truncate %s: not a file", p);
		} else if ((fd = open(o.proc, O_WRONLY | O_NOCTTY | O_NONBLOCK |
						      O_CLOEXEC)) < 0) {
			rc = sbx_error_os("truncate %s", p);
		} else {
			if (ftruncate(fd, (off_t)op->size) < 0)
				rc = sbx_error_os("truncate %s", p);
			close(fd);
		}
	}
	if (rc == 0 && (op->atime_set || op->mtime_set)) {
		struct timespec ts[2];
		const int set[2] = { op->atime_set, op->mtime_set };
		const long long s[2] = { op->atime_s, op->mtime_s };
		const long long ns[2] = { op->atime_ns, op->mtime_ns };
		int e;

		for (int i = 0; i < 2; i++) {
			ts[i].tv_sec = (time_t)s[i];
			ts[i].tv_nsec =
				set[i] == SBX_BATCH_TIME_OMIT  ? UTIME_OMIT
				: set[i] == SBX_BATCH_TIME_NOW ? UTIME_NOW
							       : (long)ns[i];
		}
		/* A symlink itself by name (never the root); anything else
		 * by its inode. */
		if (S_ISLNK(o.st.st_mode))
			e = utimensat(x->dfd, x->name, ts, AT_SYMLINK_NOFOLLOW);
		else
			e = utimensat(AT_FDCWD, o.proc, ts, 0);
		if (e < 0)
			rc = sbx_error_os("utimens %s", p);
	}
	if (rc == 0 && fstat(o.fd, &o.st) == 0)
		agent_put_st(res, &o.st);
	obj_close(&o);
	return rc;
}

static int op_xattr(struct exec_ctx *x, const struct sbx_batch_op *op,
		    cJSON *res)
{
	struct obj o = { .fd = -1 };
	const char *p = op->path;
	char *buf = NULL;
	ssize_t n;
	int rc;

	rc = obj_open(x->dfd, x->name, &o, p);
	if (rc < 0)
		return rc;
	/* User xattrs cannot exist on symlinks; never follow one here. */
	if (S_ISLNK(o.st.st_mode)) {
		if (op->kind == SBX_BATCH_LISTXATTR)
			cJSON_AddArrayToObject(res, "names");
		else
			rc = sbx_error_set(SBX_ERR_OS,
					   op->kind == SBX_BATCH_GETXATTR
						   ? -ENODATA
						   : -EPERM,
					   "xattr on symlink %s", p);
		goto out;
	}
	switch (op->kind) {
	case SBX_BATCH_GETXATTR:
		buf = sbx_xmalloc(MAX_XATTR);
		n = getxattr(o.proc, op->name, buf, MAX_XATTR);
		if (n < 0) {
			rc = sbx_error_os("getxattr %s %s", p, op->name);
		} else {
			char *b = sbx_proto_base64_encode(buf, (size_t)n);

			cJSON_AddStringToObject(res, "value", b);
			free(b);
		}
		break;
	case SBX_BATCH_LISTXATTR: {
		cJSON *names = cJSON_AddArrayToObject(res, "names");

		buf = sbx_xmalloc(MAX_XATTR);
		n = listxattr(o.proc, buf, MAX_XATTR);
		if (n < 0) {
			rc = sbx_error_os("listxattr %s", p);
			break;
		}
		for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
			cJSON_AddItemToArray(names,
					     cJSON_CreateString(buf + i));
		break;
	}
	case SBX_BATCH_SETXATTR:
		if (setxattr(o.proc, op->name, op->data, op->data_len,
			     (int)op->flags) < 0)
			rc = sbx_error_os("setxattr %s %s", p, op->name);
		break;
	case SBX_BATCH_REMOVEXATTR:
		if (removexattr(o.proc, op->name) < 0)
			rc = sbx_error_os("removexattr %s %s", p, op->name);
		break;
	}
out:
	free(buf);
	obj_close(&o);
	return rc;
}

static int op_data(struct exec_ctx *x, const struct sbx_batch_op *op,
		   cJSON *res)
{
	struct stat st;
	int fd = -1, rc, flags;

	switch (op->kind) {
	case SBX_BATCH_WRITE:
		flags = O_WRONLY | (op->append ? O_APPEND : 0);
		break;
	case SBX_BATCH_FALLOCATE:
		flags = O_WRONLY;
		break;
	default:
		flags = O_RDONLY;
		break;
	}
	rc = agent_open_ino(x->a, op->path, flags | O_NOCTTY | O_NONBLOCK,
			    op->kind == SBX_BATCH_WRITE ? op->ino : 0, &fd);
	if (rc < 0)
		return rc;
	switch (op->kind) {
	case SBX_BATCH_WRITE:
		rc = agent_write_all(fd, op->data, op->data_len, op->offset,
				     op->append, op->path);
		if (rc == 0)
			cJSON_AddNumberToObject(res, "written",
						(double)op->data_len);
		break;
	case SBX_BATCH_READ: {
		size_t len = op->length > SBX_BATCH_MAX_READ
				     ? SBX_BATCH_MAX_READ
				     : (size_t)op->length;
		char *buf = sbx_xmalloc(len + 1);
		size_t got = 0;

		while (got < len) {
			ssize_t n = pread(fd, buf + got, len - got,
					  (off_t)(op->offset + (long long)got));

			if (n < 0 && errno == EINTR)
				continue;
			if (n < 0) {
				rc = sbx_error_os("read %s", op->path);
				break;
			}
			if (n == 0)
				break;
			got += (size_t)n;
		}
		if (rc == 0) {
			char *b = sbx_proto_base64_encode(buf, got);

			cJSON_AddStringToObject(res, "data", b);
			free(b);
		}
		free(buf);
		break;
	}
	case SBX_BATCH_FSYNC:
		if ((op->datasync ? fdatasync(fd) : fsync(fd)) < 0)
			rc = sbx_error_os("fsync %s", op->path);
		break;
	case SBX_BATCH_FALLOCATE:
		if (fallocate(fd, op->fmode, (off_t)op->offset,
			      (off_t)op->length) < 0)
			rc = sbx_error_os("fallocate %s", op->path);
		break;
	case SBX_BATCH_LSEEK: {
		off_t r = lseek(fd, (off_t)op->offset, op->whence);

		if (r < 0)
			rc = sbx_error_os("lseek %s", op->path);
		else
			cJSON_AddNumberToObject(res, "offset", (double)r);
		break;
	}
	}
	if (rc == 0 &&
	    (op->kind == SBX_BATCH_WRITE || op->kind == SBX_BATCH_READ)) {
		if (fstat(fd, &st) == 0)
			agent_put_st(res, &st);
	}
	close(fd);
	return rc;
}

/* Run one op; fills `res` with its result fields. */
static int run_op(struct agent *a, const struct sbx_batch_op *op, cJSON *res)
{
	struct exec_ctx x = { .a = a, .dfd = -1 };
	struct exec_ctx y = { .a = a, .dfd = -1 };
	const char *p = op->path;
	int rc = 0;

	switch (op->kind) {
	case SBX_BATCH_STATFS: {
		cJSON *o = NULL;

		rc = agent_statfs_json(a, &o);
		if (rc == 0) {
			cJSON *it;

			/* Flatten: the result carries the statfs fields. */
			while (o && (it = o->child)) {
				cJSON_DetachItemViaPointer(o, it);
				cJSON_AddItemToObject(res, it->string, it);
			}
			cJSON_Delete(o);
		}
		return rc;
	}
	case SBX_BATCH_LIST: {
		cJSON *entries = NULL;
		struct stat dirst;

		rc = agent_list(a, p, &entries, &dirst);
		if (rc == 0) {
			agent_put_st(res, &dirst);
			cJSON_AddItemToObject(res, "entries", entries);
		}
		return rc;
	}
	case SBX_BATCH_WRITE:
	case SBX_BATCH_READ:
	case SBX_BATCH_FSYNC:
	case SBX_BATCH_FALLOCATE:
	case SBX_BATCH_LSEEK:
		return op_data(&x, op, res);
	default:
		break;
	}

	rc = parent_of(&x, p);
	if (rc < 0)
		goto out;
	switch (op->kind) {
	case SBX_BATCH_STAT:
		rc = stat_result(&x, p, res);
		break;
	case SBX_BATCH_MKDIR:
	case SBX_BATCH_MKNOD:
	case SBX_BATCH_CREATE:
	case SBX_BATCH_SYMLINK:
		rc = need_name(&x, p);
		if (rc == 0)
			rc = make_node(&x, op, res);
		break;
	case SBX_BATCH_LINK:
		rc = need_name(&x, p);
		if (rc == 0)
			rc = parent_of(&y, op->newpath);
		if (rc == 0)
			rc = need_name(&y, op->newpath);
		if (rc == 0 && linkat(x.dfd, x.name, y.dfd, y.name, 0) < 0)
			rc = sbx_error_os("link %s to %s", p, op->newpath);
		if (rc == 0)
			rc = stat_result(&y, op->newpath, res);
		break;
	case SBX_BATCH_UNLINK:
		rc = need_name(&x, p);
		if (rc == 0 && op->dir_slash) {
			/* "x/" names a directory: unlink(2) answers ENOTDIR
			 * for a file or symlink x, never removes it. */
			struct stat st;

			if (fstatat(x.dfd, x.name, &st, AT_SYMLINK_NOFOLLOW) <
			    0)
				rc = sbx_error_os("unlink %s/", p);
			else if (!S_ISDIR(st.st_mode))
				rc = sbx_error_set(SBX_ERR_OS, -ENOTDIR,
						   "unlink %s/: not a "
						   "directory",
						   p);
		}
		if (rc == 0 && unlinkat(x.dfd, x.name, 0) < 0)
			rc = sbx_error_os("unlink %s", p);
		break;
	case SBX_BATCH_RMDIR:
		rc = need_name(&x, p);
		if (rc == 0 && unlinkat(x.dfd, x.name, AT_REMOVEDIR) < 0)
			rc = sbx_error_os("rmdir %s", p);
		break;
	case SBX_BATCH_RENAME:
		rc = need_name(&x, p);
		if (rc == 0)
			rc = parent_of(&y, op->newpath);
		if (rc == 0)
			rc = need_name(&y, op->newpath);
		if (rc == 0 &&
		    renameat2(x.dfd, x.name, y.dfd, y.name, op->flags) < 0)
			rc = sbx_error_os("rename %s to %s", p, op->newpath);
		break;
	case SBX_BATCH_SETATTR:
		rc = op_setattr(&x, op, res);
		break;
	case SBX_BATCH_READLINK: {
		char target[PATH_MAX + 1];
		ssize_t n = readlinkat(x.dfd, x.name, target,
				       sizeof(target) - 1);

		if (n < 0) {
			rc = sbx_error_os("readlink %s", p);
			break;
		}
		target[n] = '\0';
		cJSON_AddStringToObject(res, "target", target);
		break;
	}
	case SBX_BATCH_GETXATTR:
	case SBX_BATCH_LISTXATTR:
	case SBX_BATCH_SETXATTR:
	case SBX_BATCH_REMOVEXATTR:
		rc = op_xattr(&x, op, res);
		break;
	default:
		rc = sbx_error_set(SBX_ERR_INTERNAL, -EINVAL, "op %d",
				   op->kind);
		break;
	}
out:
	ctx_fini(&x);
	ctx_fini(&y);
	return rc;
}

cJSON *agent_batch_run(struct agent *a, const struct sbx_batch *b)
{
	cJSON *out = cJSON_CreateObject();
	cJSON *results = cJSON_AddArrayToObject(out, "results");
	bool stopped = false;

	for (size_t i = 0; i < b->n; i++) {
		const struct sbx_batch_op *op = &b->ops[i];
		cJSON *res;
		int rc;

		if (stopped) {
			res = sbx_proto_error_to_json(
				-ECANCELED, "not run: an earlier op failed");
		} else if (op->rc < 0) {
			res = sbx_proto_error_to_json(op->rc, op->msg);
		} else {
			res = cJSON_CreateObject();
			sbx_error_clear();
			rc = run_op(a, op, res);
			if (rc < 0) {
				const struct sbx_error *e = sbx_error_last();
				const char *msg = e->code == rc ? e->msg : NULL;

				cJSON_Delete(res);
				res = sbx_proto_error_to_json(rc, msg);
				sbx_debug("batch %s %s: %s",
					  sbx_batch_kind_name(op->kind),
					  op->path ? op->path : "",
					  msg ? msg : strerror(-rc));
			} else {
				cJSON_AddBoolToObject(res, "ok", 1);
			}
		}
		if (b->stop_on_error &&
		    (op->rc < 0 || cJSON_HasObjectItem(res, "error")))
			stopped = true;
		cJSON_AddItemToArray(results, res);
	}
	return out;
}

int agent_h_batch(struct agent_req *r)
{
	struct sbx_batch *b = NULL;
	cJSON *out;
	int rc;

	rc = sbx_batch_decode(r->body.data ? r->body.data : "", r->body.len,
			      &b);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	out = agent_batch_run(r->a, b);
	sbx_batch_free(b);
	return agent_reply_json(r, 200, out);
}
