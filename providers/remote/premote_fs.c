/*
 * Remote data plane: every operation of struct sbx_sandbox_ops over the
 * agent's HTTP API (docs/protocol.md).  No caching here: fs/cache.c wraps
 * this table and keeps what it can; every call below is one round trip
 * (two where one FUSE operation needs two, e.g. rename of a node we must
 * re-stat).
 *
 * Nodes: see premote_i.h; the node table is premote_nodes.c, directories,
 * xattrs and bulk reads premote_fs_dir.c (premote_fs_i.h joins them).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "sbx/hashmap.h"
#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "sbx/xmalloc.h"

#include "premote_fs_i.h"

/* Chunk size for writes (the agent takes at most 16 MiB per request). */
#define WRITE_CHUNK ((size_t)SBX_PROTO_MAX_WRITE_BODY)

/* ---- errors --------------------------------------------------------------- */

int premote_fs_errno(int rc)
{
	switch (rc) {
	case -ECONNREFUSED:
	case -EHOSTUNREACH:
	case -ECONNRESET:
	case -ECANCELED:
	case -EPROTO:
	case -EPROTONOSUPPORT:
		return -EIO;
	default:
		return rc;
	}
}

/* ---- request helpers ------------------------------------------------------ */

/* A decoded, fixed stat from member `key` of `j`. */
int premote_get_st(struct premote_sandbox *s, const cJSON *j, const char *key,
		   struct stat *st)
{
	int rc = sbx_proto_stat_from_json(
		cJSON_GetObjectItemCaseSensitive(j, key), st);

	if (rc < 0)
		return rc;
	premote_fix_stat(s, st);
	return 0;
}

/* GET route?path=P and a JSON answer. */
int premote_get_json(struct premote_sandbox *s, const char *route,
		     const char *path, cJSON **out)
{
	struct sbx_buf q;
	int rc;

	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	if (path)
		premote_q_str(&q, "path", path);
	rc = premote_http_json(s->http, "GET", route, sbx_buf_ptr(&q), NULL,
			       true, out);
	sbx_buf_fini(&q);
	return premote_fs_errno(rc);
}

static int stat_path(struct premote_sandbox *s, const char *path,
		     struct stat *st)
{
	cJSON *j = NULL;
	int rc = premote_get_json(s, "/v1/fs/stat", path, &j);

	if (rc == 0)
		rc = premote_fs_errno(premote_get_st(s, j, "st", st));
	cJSON_Delete(j);
	return rc;
}

/*
 * Run one batch op.  On success *res (may be NULL) is its result object
 * (caller deletes).  An op's own error comes back as its errno with the
 * agent's message.
 */
/*
 * The protocol carries paths of at most PATH_MAX - 1 bytes (the agent
 * refused longer ones as a bad request, which said EINVAL: `mkdir` deep
 * in a tree, stress test); a local disk would say ENAMETOOLONG for such
 * a path given whole, so that is said here.
 */
static int op_paths_fit(const struct sbx_batch_op *op)
{
	const char *p = op->path && strlen(op->path) >= PATH_MAX ? op->path
		      : op->newpath && strlen(op->newpath) >= PATH_MAX
			      ? op->newpath
			      : NULL;

	if (!p)
		return 0;
	return sbx_error_set(SBX_ERR_REMOTE, -ENAMETOOLONG,
			     "%s: the path in the sandbox is %zu bytes long; "
			     "the remote protocol carries at most %d",
			     sbx_batch_kind_name(op->kind), strlen(p),
			     PATH_MAX - 1);
}

int premote_batch1(struct premote_sandbox *s, const struct sbx_batch_op *op,
		  cJSON **res)
{
	cJSON *req, *ans = NULL, *r = NULL;
	char ctx[300];
	int rc;

	if (res)
		*res = NULL;
	rc = op_paths_fit(op);
	if (rc < 0)
		return rc;
	req = sbx_batch_encode(op, 1, false);
	snprintf(ctx, sizeof(ctx), "%s %s", sbx_batch_kind_name(op->kind),
		 op->path ? op->path : "");
	rc = premote_http_json(s->http, "POST", "/v1/fs/batch", NULL, req,
			       false, &ans);
	if (rc == 0)
		rc = sbx_batch_result_take(ans, 1, 0, ctx, &r);
	if (rc == 0 && res)
		*res = r;
	else
		cJSON_Delete(r);
	cJSON_Delete(ans);
	cJSON_Delete(req);
	return premote_fs_errno(rc);
}

/* The directory part of `path` ("" for a name in the root), malloc'd. */
static char *parent_of(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? sbx_xstrndup(path, (size_t)(slash - path))
		     : sbx_xstrdup("");
}

/*
 * Run `op` like premote_batch1(), and when the calling thread armed a
 * struct sbx_side (see sbx/provider.h), stat the directories `dir` and
 * `newdir` and the object `obj` (each may be NULL) in the same batch,
 * after the op, into side->dir / side->newdir / side->obj.  A failed stat
 * only leaves its flag unset.
 */
static int batch_side(struct premote_sandbox *s, const struct sbx_batch_op *op,
		      const char *dir, const char *newdir, const char *obj,
		      cJSON **res)
{
	struct sbx_side *side = sbx_side_get();
	struct sbx_batch_op ops[4] = { *op };
	struct stat *dst[4] = { NULL };
	bool *flag[4] = { NULL };
	cJSON *req, *ans = NULL, *r = NULL;
	size_t n = 1;
	char ctx[300];
	int rc;

	if (!side || !dir)
		return premote_batch1(s, op, res);
	if (res)
		*res = NULL;
	rc = op_paths_fit(op);
	if (rc < 0)
		return rc;
	ops[n] = (struct sbx_batch_op){ .kind = SBX_BATCH_STAT,
					.path = (char *)dir };
	dst[n] = &side->dir;
	flag[n++] = &side->has_dir;
	if (newdir && strcmp(newdir, dir) != 0) {
		ops[n] = (struct sbx_batch_op){ .kind = SBX_BATCH_STAT,
						.path = (char *)newdir };
		dst[n] = &side->newdir;
		flag[n++] = &side->has_newdir;
	}
	if (obj) {
		ops[n] = (struct sbx_batch_op){ .kind = SBX_BATCH_STAT,
						.path = (char *)obj };
		dst[n] = &side->obj;
		flag[n++] = &side->has_obj;
	}
	req = sbx_batch_encode(ops, n, false);
	snprintf(ctx, sizeof(ctx), "%s %s", sbx_batch_kind_name(op->kind),
		 op->path ? op->path : "");
	rc = premote_http_json(s->http, "POST", "/v1/fs/batch", NULL, req,
			       false, &ans);
	cJSON_Delete(req);
	if (rc < 0) {
		cJSON_Delete(ans);
		return premote_fs_errno(rc);
	}
	for (size_t i = 1; i < n; i++) {
		struct stat st;

		if (sbx_batch_result_take(ans, n, i, ctx, &r) == 0 &&
		    premote_get_st(s, r, "st", &st) == 0) {
			*dst[i] = st;
			*flag[i] = true;
		}
		sbx_error_clear();
		cJSON_Delete(r);
		r = NULL;
	}
	rc = sbx_batch_result_take(ans, n, 0, ctx, &r);
	if (rc < 0) {
		/* The op failed: the stats say nothing the caller may use. */
		side->has_dir = side->has_newdir = side->has_obj = false;
	}
	if (rc == 0 && res)
		*res = r;
	else
		cJSON_Delete(r);
	cJSON_Delete(ans);
	return premote_fs_errno(rc);
}

/* Run an op whose result carries the object's "st" (stat `path` when an
 * older agent left it out); the parent's attributes on the side. */
static int batch_st(struct premote_sandbox *s, const struct sbx_batch_op *op,
		    const char *path, struct stat *st)
{
	cJSON *r = NULL;
	char *dir = parent_of(path);
	int rc = batch_side(s, op, dir, NULL, NULL, &r);

	free(dir);

	if (rc == 0) {
		if (cJSON_GetObjectItemCaseSensitive(r, "st"))
			rc = premote_fs_errno(premote_get_st(s, r, "st", st));
		else
			rc = stat_path(s, path, st);
	}
	cJSON_Delete(r);
	return rc;
}

/* Run an entry-creating op and hand out the node for `path`. */
static int batch_entry(struct premote_sandbox *s,
		       const struct sbx_batch_op *op, const char *path,
		       struct sbx_node **out, struct stat *st)
{
	int rc = batch_st(s, op, path, st);

	if (rc == 0)
		*out = (struct sbx_node *)premote_node_get(s, path, st);
	return rc;
}

/* ---- node operations ------------------------------------------------------ */

static struct sbx_node *r_root(struct sbx_sandbox *sb)
{
	return (struct sbx_node *)&RSB(sb)->root;
}

static int r_lookup(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = premote_cpath(s, parent, name);
	int rc;

	*out = NULL;
	rc = stat_path(s, path, st);
	if (rc == 0)
		*out = (struct sbx_node *)premote_node_get(s, path, st);
	free(path);
	return rc;
}

static void r_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	premote_node_put(RSB(sb), RNODE(node));
}

static int r_node_at_ino(struct sbx_sandbox *sb, const char *path,
			 uint64_t ino, struct sbx_node **out)
{
	struct premote_sandbox *s = RSB(sb);
	struct premote_node *n;
	char *clean = NULL;
	int rc;

	*out = NULL;
	rc = sbx_proto_path_clean(path, &clean);
	if (rc < 0)
		return rc;
	if (!*clean) {
		/* The root is never written. */
		free(clean);
		*out = (struct sbx_node *)&s->root;
		return 0;
	}
	n = sbx_xcalloc(1, sizeof(*n));
	n->path = clean;
	n->refs = 1;
	/*
	 * The agent checks the number it reports.  A number with the top
	 * bit set was mixed with the device of a filesystem mounted below
	 * the root (premote_fix_stat) and cannot be turned back: such
	 * files are written unchecked, as before.
	 */
	n->expect_ino = ino >> 63 ? 0 : ino;
	*out = (struct sbx_node *)n;
	return 0;
}

static int r_node_at(struct sbx_sandbox *sb, const char *path,
		     struct sbx_node **out)
{
	return r_node_at_ino(sb, path, 0, out);
}

static int r_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = premote_npath(s, node);
	int rc = stat_path(s, path, st);

	free(path);
	return rc;
}

/* A setattr time from the SBX_SET_* bits `now` and `set`. */
static void op_time(int valid, int now, int set, const struct timespec *ts,
		    int *how, long long *sec, long long *nsec)
{
	if (valid & now) {
		*how = SBX_BATCH_TIME_NOW;
	} else if (valid & set) {
		*how = SBX_BATCH_TIME_SET;
		*sec = (long long)ts->tv_sec;
		*nsec = (long long)ts->tv_nsec;
	}
}

/* The batch op of setattr(`in`, `valid`) on path (borrowed), of the file
 * with inode number ino (0: whatever the path names). */
static void setattr_op(struct sbx_batch_op *op, char *path, uint64_t ino,
		       const struct stat *in, int valid)
{
	*op = (struct sbx_batch_op){
		.kind = SBX_BATCH_SETATTR, .path = path, .ino = ino,
		.has_mode = valid & SBX_SET_MODE, .mode = in->st_mode & 07777,
		.has_uid = valid & SBX_SET_UID, .uid = in->st_uid,
		.has_gid = valid & SBX_SET_GID, .gid = in->st_gid,
		.has_size = valid & SBX_SET_SIZE, .size = in->st_size,
	};
	op_time(valid, SBX_SET_ATIME_NOW, SBX_SET_ATIME, &in->st_atim,
		&op->atime_set, &op->atime_s, &op->atime_ns);
	op_time(valid, SBX_SET_MTIME_NOW, SBX_SET_MTIME, &in->st_mtim,
		&op->mtime_set, &op->mtime_s, &op->mtime_ns);
}

/*
 * The protocol's numbers stop at 2^53 (JSON): a larger size is EFBIG, what
 * a local disk says past its largest file (the agent refused it as a bad
 * request, EINVAL, before).
 */
static int size_sendable(const struct stat *in, int valid, const char *path)
{
	if ((valid & SBX_SET_SIZE) && in->st_size > (off_t)1 << 53)
		return sbx_error_set(SBX_ERR_OS, -EFBIG,
				     "truncate %s: %lld bytes is past the "
				     "largest size the protocol carries (2^53)",
				     path, (long long)in->st_size);
	return 0;
}

static int r_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = premote_npath(s, node);
	struct sbx_batch_op op;
	int rc = size_sendable(in, valid, path);

	if (rc < 0) {
		free(path);
		return rc;
	}

	setattr_op(&op, path, RNODE(node)->expect_ino, in, valid);
	rc = batch_st(s, &op, path, out);
	free(path);
	return rc;
}

/*
 * Up to SBX_PROTO_MAX_BATCH setattr ops per POST /v1/fs/batch.  Sent as
 * idempotent (retried once on a connection failure like GETs are): the
 * caching layer sends only touches through here, which may run twice.
 */
static int setattr_chunk(struct premote_sandbox *s,
			 struct sbx_setattr_item *items, size_t n)
{
	struct sbx_batch_op ops[SBX_PROTO_MAX_BATCH];
	char *paths[SBX_PROTO_MAX_BATCH];
	cJSON *req, *ans = NULL, *r;
	char ctx[300];
	int rc;

	for (size_t i = 0; i < n; i++) {
		paths[i] = premote_npath(s, items[i].node);
		setattr_op(&ops[i], paths[i], RNODE(items[i].node)->expect_ino,
			   items[i].in, items[i].valid);
	}
	req = sbx_batch_encode(ops, n, false);
	rc = premote_http_json(s->http, "POST", "/v1/fs/batch", NULL, req,
			       true, &ans);
	for (size_t i = 0; i < n; i++) {
		if (rc == 0) {
			snprintf(ctx, sizeof(ctx), "setattr %s", paths[i]);
			r = NULL;
			items[i].rc = premote_fs_errno(
				sbx_batch_result_take(ans, n, i, ctx, &r));
			/* The attributes after it, when the agent said. */
			if (items[i].rc == 0 &&
			    cJSON_GetObjectItemCaseSensitive(r, "st") &&
			    premote_get_st(s, r, "st", &items[i].out) < 0)
				memset(&items[i].out, 0, sizeof(items[i].out));
			cJSON_Delete(r);
		} else {
			items[i].rc = premote_fs_errno(rc);
		}
		free(paths[i]);
	}
	cJSON_Delete(ans);
	cJSON_Delete(req);
	return rc < 0 ? premote_fs_errno(rc) : 0;
}

static int r_setattr_many(struct sbx_sandbox *sb,
			  struct sbx_setattr_item *items, size_t n)
{
	struct premote_sandbox *s = RSB(sb);
	int rc = 0;

	for (size_t i = 0; i < n && rc == 0; i += SBX_PROTO_MAX_BATCH) {
		size_t k = n - i < SBX_PROTO_MAX_BATCH ? n - i
						       : SBX_PROTO_MAX_BATCH;

		rc = setattr_chunk(s, items + i, k);
		if (rc < 0)
			for (size_t j = i + k; j < n; j++)
				items[j].rc = rc;
	}
	if (rc == 0)
		sbx_error_clear();
	return rc;
}

static int r_readlink(struct sbx_sandbox *sb, struct sbx_node *node,
		      char *buf, size_t size)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = premote_npath(s, node);
	cJSON *j = NULL;
	const char *t;
	size_t n;
	int rc;

	rc = premote_get_json(s, "/v1/fs/readlink", path, &j);
	if (rc < 0)
		goto out;
	t = sbx_json_str(j, "target");
	if (!t) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EIO,
				   "readlink %s: no \"target\" in the answer",
				   path);
		goto out;
	}
	n = strlen(t);
	if (n > size)
		n = size;
	memcpy(buf, t, n);
	rc = (int)n;
out:
	cJSON_Delete(j);
	free(path);
	return rc;
}

/*
 * The owner of a new object: the caller through the mount (struct
 * sbx_caller).  The agent applies it when it runs as root and ignores it
 * otherwise (older agents ignore the fields).
 */
static void op_owner(struct sbx_batch_op *op)
{
	const struct sbx_caller *c = sbx_caller_get();

	if (!c)
		return;
	op->has_uid = op->has_gid = true;
	op->uid = c->uid;
	op->gid = c->gid;
}

/* mknod, mkdir, symlink, create: `op` names the new object's path. */
static int make_entry(struct premote_sandbox *s, struct sbx_batch_op *op,
		      struct sbx_node **out, struct stat *st)
{
	*out = NULL;
	op_owner(op);
	return batch_entry(s, op, op->path, out, st);
}

static int r_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_MKNOD, .path = premote_cpath(s, parent, name),
		.has_mode = true, .mode = mode, .rdev = rdev,
	};
	int rc = make_entry(s, &op, out, st);

	free(op.path);
	return rc;
}

static int r_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, struct sbx_node **out,
		   struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_MKDIR, .path = premote_cpath(s, parent, name),
		.has_mode = true, .mode = mode & 07777,
	};
	int rc = make_entry(s, &op, out, st);

	free(op.path);
	return rc;
}

static int r_symlink(struct sbx_sandbox *sb, const char *target,
		     struct sbx_node *parent, const char *name,
		     struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_SYMLINK,
		.path = premote_cpath(s, parent, name),
		.target = sbx_xstrdup(target),
	};
	int rc = make_entry(s, &op, out, st);

	sbx_batch_op_fini(&op);
	return rc;
}

static int r_link(struct sbx_sandbox *sb, struct sbx_node *node,
		  struct sbx_node *newparent, const char *newname,
		  struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_LINK, .path = premote_npath(s, node),
		.newpath = premote_cpath(s, newparent, newname),
	};
	int rc;

	*out = NULL;
	rc = batch_entry(s, &op, op.newpath, out, st);
	sbx_batch_op_fini(&op);
	return rc;
}

static int remove_entry(struct sbx_sandbox *sb, struct sbx_node *parent,
			const char *name, int kind)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = { .kind = kind,
				   .path = premote_cpath(s, parent, name) };
	char *dir = parent_of(op.path);
	int rc = batch_side(s, &op, dir, NULL, NULL, NULL);

	free(dir);
	sbx_batch_op_fini(&op);
	return rc;
}

static int r_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name)
{
	return remove_entry(sb, parent, name, SBX_BATCH_UNLINK);
}

static int r_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name)
{
	return remove_entry(sb, parent, name, SBX_BATCH_RMDIR);
}

static int r_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node *newparent,
		    const char *newname, unsigned flags)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = { .kind = SBX_BATCH_RENAME };
	char *dir, *newdir;
	int rc;

	if (flags & ~(unsigned)(RENAME_EXCHANGE | RENAME_NOREPLACE))
		return sbx_error_set(SBX_ERR_OS, -EINVAL,
				     "rename %s: unsupported flags 0x%x", name,
				     flags);
	op.path = premote_cpath(s, parent, name);
	op.newpath = premote_cpath(s, newparent, newname);
	/* The wire carries one of the two: exchange wins. */
	op.flags = (flags & RENAME_EXCHANGE) ? RENAME_EXCHANGE
					     : flags & RENAME_NOREPLACE;
	dir = parent_of(op.path);
	newdir = parent_of(op.newpath);
	/* The moved object too (its ctime changed), unless exchanged. */
	rc = batch_side(s, &op, dir, newdir,
			(flags & RENAME_EXCHANGE) ? NULL : op.newpath, NULL);
	free(dir);
	free(newdir);
	if (rc == 0) {
		pthread_mutex_lock(&s->nodes_lock);
		premote_move_locked(s, op.path, op.newpath,
				    flags & RENAME_EXCHANGE);
		pthread_mutex_unlock(&s->nodes_lock);
	}
	sbx_batch_op_fini(&op);
	return rc;
}

/* ---- files ---------------------------------------------------------------- */

struct premote_file *premote_file_new(struct premote_sandbox *s,
				      struct premote_node *n, int flags)
{
	struct premote_file *f = sbx_xcalloc(1, sizeof(*f));

	premote_node_ref(s, n);
	f->node = n;
	f->flags = flags;
	pthread_mutex_init(&f->lock, NULL);
	return f;
}

void premote_file_free(struct premote_sandbox *s, struct premote_file *f)
{
	if (!f)
		return;
	premote_node_put(s, f->node);
	cJSON_Delete(f->listing);
	free(f->entries);
	pthread_mutex_destroy(&f->lock);
	free(f);
}

/*
 * Opening costs nothing: the agent has no open files, every read and
 * write names the path.  Permissions were checked by the kernel
 * (default_permissions) against the attributes we reported; the agent
 * checks again when the I/O happens.
 */
static int r_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		  struct sbx_open_result *out)
{
	struct premote_sandbox *s = RSB(sb);
	int rc;

	memset(out, 0, sizeof(*out));
	if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY) {
		struct stat in = { .st_size = 0 }, st;

		rc = r_setattr(sb, node, NULL, &in, SBX_SET_SIZE, &st);
		if (rc < 0)
			return rc;
	}
	out->fh = (struct sbx_file *)premote_file_new(s, RNODE(node), flags);
	return 0;
}

static int r_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, mode_t mode, int flags,
		    struct sbx_node **node_out, struct stat *st,
		    struct sbx_open_result *out)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_CREATE,
		.path = premote_cpath(s, parent, name),
		.has_mode = true,
		.mode = mode & 07777,
		.excl = flags & O_EXCL,
		.truncate = flags & O_TRUNC,
	};
	int rc;

	memset(out, 0, sizeof(*out));
	rc = make_entry(s, &op, node_out, st);
	if (rc == 0)
		out->fh = (struct sbx_file *)premote_file_new(
			s, RNODE(*node_out), flags);
	free(op.path);
	return rc;
}

static ssize_t r_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		      size_t size, off_t off)
{
	struct premote_sandbox *s = RSB(sb);
	struct premote_node *node = RFILE(fh)->node;
	char *path = premote_npath(s, (struct sbx_node *)node);
	struct premote_req r = {
		.method = "GET", .route = "/v1/fs/read", .idempotent = true,
		.cancel_fd = -1, .out = buf, .out_cap = size,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	int rc;

	if (off < 0)
		return sbx_error_set(SBX_ERR_OS, -EINVAL, "read: offset < 0");
	if (size == 0) {
		free(path);
		return 0;
	}
	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", path);
	premote_q_u64(&q, "offset", (uint64_t)off);
	premote_q_u64(&q, "length", size);
	r.query = sbx_buf_ptr(&q);
	premote_resp_init(&resp);
	rc = premote_http_do(s->http, &r, &resp);
	/*
	 * A node for one file (node_at_ino) reads only that file, as its
	 * writes write only it: the path may name another one now (replaced
	 * in the sandbox, its event on its way), whose bytes would be taken
	 * for this file's.  Agents before X-Sbx-Ino send none: unchecked.
	 */
	if (rc == 0 && node->expect_ino && resp.hdr_ino &&
	    resp.hdr_ino != node->expect_ino)
		rc = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				   "read %s: the path names another file now",
				   path);
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	free(path);
	if (rc < 0)
		return premote_fs_errno(rc);
	return (ssize_t)resp.out_len;
}

static ssize_t write_chunk(struct premote_sandbox *s, const char *path,
			   uint64_t ino, const void *buf, size_t size,
			   off_t off, bool append)
{
	struct premote_req r = {
		.method = "PUT", .route = "/v1/fs/write",
		.content_type = SBX_CT_OCTET, .body = buf, .body_len = size,
		/* At an offset, writing twice gives the same file. */
		.idempotent = !append, .cancel_fd = -1,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	const cJSON *w;
	cJSON *j = NULL;
	ssize_t rc;

	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", path);
	premote_q_u64(&q, "offset", (uint64_t)off);
	if (append)
		premote_q_str(&q, "append", "1");
	if (ino)
		premote_q_u64(&q, "ino", ino);
	r.query = sbx_buf_ptr(&q);
	premote_resp_init(&resp);
	rc = premote_http_do(s->http, &r, &resp);
	if (rc < 0)
		goto out;
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
				  sbx_buf_len(&resp.body));
	w = cJSON_GetObjectItemCaseSensitive(j, "written");
	if (!cJSON_IsNumber(w) || w->valuedouble < 0 ||
	    w->valuedouble > (double)size) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "write %s: bad \"written\" in the answer",
				   path);
		goto out;
	}
	rc = (ssize_t)w->valuedouble;
	if (sbx_side_get()) {
		struct sbx_side *side = sbx_side_get();
		struct stat st;

		/* The file after this chunk: older agents send no "st". */
		if (cJSON_GetObjectItemCaseSensitive(j, "st") &&
		    premote_get_st(s, j, "st", &st) == 0) {
			side->file = st;
			side->has_file = true;
		} else {
			side->has_file = false;
			sbx_error_clear();
		}
	}
out:
	cJSON_Delete(j);
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	return rc < 0 ? premote_fs_errno((int)rc) : rc;
}

/* Writes larger than the agent's request limit go out in chunks; a short
 * or failed chunk after others succeeded ends with what was written. */
static ssize_t r_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *buf, size_t size, off_t off)
{
	struct premote_sandbox *s = RSB(sb);
	struct premote_file *f = RFILE(fh);
	bool append = f->flags & O_APPEND;
	size_t done = 0;
	char *path;

	if (off < 0)
		return sbx_error_set(SBX_ERR_OS, -EINVAL, "write: offset < 0");
	path = premote_npath(s, (struct sbx_node *)f->node);
	while (done < size) {
		size_t len = size - done < WRITE_CHUNK ? size - done
						       : WRITE_CHUNK;
		ssize_t n = write_chunk(s, path, f->node->expect_ino,
					(const char *)buf + done, len,
					off + (off_t)done, append);

		if (n < 0) {
			if (!done) {
				free(path);
				return n;
			}
			sbx_error_clear();
			break;
		}
		done += (size_t)n;
		if ((size_t)n < len)
			break;
	}
	free(path);
	return (ssize_t)done;
}

static int r_flush(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	return 0; /* writes went out when they were made */
}

int premote_fsync_path(struct premote_sandbox *s, struct premote_node *n,
		       bool datasync)
{
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_FSYNC,
		.path = premote_npath(s, (struct sbx_node *)n),
		.datasync = datasync,
	};
	int rc = premote_batch1(s, &op, NULL);

	free(op.path);
	return rc;
}

static int r_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	return premote_fsync_path(RSB(sb), RFILE(fh)->node, datasync);
}

/*
 * The most r_write_then() sends: the batch is JSON (at most 1 MiB, the
 * agent's limit) and the data goes in it as base64 (4/3 larger).
 */
#define WRITE_THEN_MAX ((size_t)512 << 10)

/*
 * One batch {write, fsync or setattr, stat}, stopping at the first error:
 * the stat gives the file's attributes after both (batch writes answer no
 * "st").
 */
/*
 * The answer of a write_then batch (write, then, stat) that describes the
 * file written: the setattr's (the agent's fstat of the object it changed,
 * after the change) or the write's (of the descriptor it wrote; an fsync
 * changes no attribute).  The stat goes by the path, which the sandbox
 * may have given to another file between the ops: taken as the file's
 * (before 2026-12-08), it made the node that file (a stress agent: under
 * a storm of exchanges, a descriptor's fchmod reached another file).
 * Agents that put no `st` in those answers: the stat's.
 */
static const cJSON *then_st(const struct sbx_write_then *then,
			    cJSON *const r[3])
{
	const cJSON *own = then->kind == SBX_THEN_SETATTR ? r[1] : r[0];

	return cJSON_GetObjectItemCaseSensitive(own, "st") ? own : r[2];
}

static int r_write_then(struct sbx_sandbox *sb, struct sbx_file *fh,
			const void *buf, size_t size, off_t off,
			const struct sbx_write_then *then, struct stat *st,
			bool *written)
{
	struct premote_sandbox *s = RSB(sb);
	struct premote_file *f = RFILE(fh);
	struct sbx_batch_op ops[3];
	char *path, ctx[300];
	cJSON *req, *ans = NULL, *r[3] = { NULL, NULL, NULL };
	const cJSON *w;
	int rc, rcs[3];

	*written = false;
	if (size > WRITE_THEN_MAX || (f->flags & O_APPEND))
		return sbx_error_set(SBX_ERR_OS, -E2BIG,
				     "write: %zu bytes do not fit a batch",
				     size);
	if (off < 0)
		return sbx_error_set(SBX_ERR_OS, -EINVAL, "write: offset < 0");
	path = premote_npath(s, (struct sbx_node *)f->node);
	if (then->kind == SBX_THEN_SETATTR &&
	    (rc = size_sendable(then->in, then->valid, path)) < 0) {
		free(path);
		return rc;
	}
	ops[0] = (struct sbx_batch_op){ .kind = SBX_BATCH_WRITE, .path = path,
					.data = (unsigned char *)buf,
					.data_len = size, .offset = off,
					.ino = f->node->expect_ino };
	if (then->kind == SBX_THEN_SETATTR)
		setattr_op(&ops[1], path, f->node->expect_ino, then->in,
			   then->valid);
	else
		ops[1] = (struct sbx_batch_op){ .kind = SBX_BATCH_FSYNC,
						.path = path,
						.datasync = then->datasync };
	ops[2] = (struct sbx_batch_op){ .kind = SBX_BATCH_STAT, .path = path };
	req = sbx_batch_encode(ops, 3, true);
	snprintf(ctx, sizeof(ctx), "write+%s %s",
		 sbx_batch_kind_name(ops[1].kind), path);
	rc = premote_http_json(s->http, "POST", "/v1/fs/batch", NULL, req,
			       false, &ans);
	cJSON_Delete(req);
	if (rc == 0) {
		/* The first error is the one that counts (the ops after it
		 * answer ECANCELED). */
		for (size_t i = 0; i < 3; i++)
			rcs[i] = sbx_batch_result_take(ans, 3, i, ctx, &r[i]);
		rc = rcs[0];
		if (rc == 0) {
			w = cJSON_GetObjectItemCaseSensitive(r[0], "written");
			if (!cJSON_IsNumber(w) || w->valuedouble != (double)size)
				rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
						   "%s: short write", ctx);
		}
		if (rc == 0) {
			*written = true;
			rc = rcs[1] < 0 ? rcs[1] : rcs[2];
		}
		if (rc == 0)
			rc = premote_get_st(s, then_st(then, r), "st", st);
	}
	for (size_t i = 0; i < 3; i++)
		cJSON_Delete(r[i]);
	cJSON_Delete(ans);
	free(path);
	return premote_fs_errno(rc);
}

static int r_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	premote_file_free(RSB(sb), RFILE(fh));
	return 0;
}

static int r_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		       off_t off, off_t len)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_FALLOCATE,
		.path = premote_npath(s, (struct sbx_node *)RFILE(fh)->node),
		.fmode = mode, .offset = off, .length = len,
	};
	int rc = premote_batch1(s, &op, NULL);

	free(op.path);
	return rc;
}

/*
 * SEEK_DATA/SEEK_HOLE need the sandbox's extents; the other whences are
 * the kernel's business and never reach a FUSE filesystem.
 */
static off_t r_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		     int whence)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_LSEEK, .offset = off, .whence = whence,
	};
	cJSON *res = NULL;
	const cJSON *o;
	off_t r;
	int rc;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "lseek: whence %d", whence);
	op.path = premote_npath(s, (struct sbx_node *)RFILE(fh)->node);
	rc = premote_batch1(s, &op, &res);
	free(op.path);
	if (rc < 0)
		return rc;
	o = cJSON_GetObjectItemCaseSensitive(res, "offset");
	r = cJSON_IsNumber(o) && o->valuedouble >= 0 ? (off_t)o->valuedouble
						      : -1;
	cJSON_Delete(res);
	if (r < 0)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "lseek: the agent sent no offset");
	return r;
}

static int r_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		       char **out)
{
	struct premote_sandbox *s = RSB(sb);
	char *p = premote_npath(s, node);
	const char *root = s->info.root;
	size_t rl = strlen(root);

	if (!*p)
		*out = sbx_xstrdup(root);
	else if (rl && root[rl - 1] == '/')
		*out = sbx_xasprintf("%s%s", root, p);
	else
		*out = sbx_xasprintf("%s/%s", root, p);
	free(p);
	return 0;
}

/* ---- lifetime ------------------------------------------------------------- */

static void r_free(struct sbx_sandbox *sb)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_hashmap_iter it;
	struct sbx_hashmap_node *hn;

	if (!s)
		return;
	if (s->watch)
		premote_watch_stop(sb);
	/* Nodes the daemon did not forget (it exits): free them. */
	sbx_hashmap_iter_init(&it, &s->by_ino);
	while ((hn = sbx_hashmap_next(&it))) {
		struct premote_node *n =
			sbx_hashmap_entry(hn, struct premote_node, ino_node);

		free(n->path);
		free(n);
	}
	sbx_hashmap_fini(&s->by_ino);
	sbx_hashmap_fini(&s->by_path);
	pthread_mutex_destroy(&s->nodes_lock);
	pthread_mutex_destroy(&s->seq_lock);
	premote_exec_env_fini(s);
	premote_http_free(s->http);
	premote_config_fini(&s->cfg);
	premote_info_fini(&s->info);
	free(s->base.session);
	free(s->base.workdir);
	free(s);
}

static bool r_watch_healthy(struct sbx_sandbox *sb)
{
	return premote_watch_healthy(sb);
}

const struct sbx_sandbox_ops premote_sandbox_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.root = r_root,
	.lookup = r_lookup,
	.forget = r_forget,
	.getattr = r_getattr,
	.setattr = r_setattr,
	.setattr_many = r_setattr_many,
	.readlink = r_readlink,
	.mknod = r_mknod,
	.mkdir = r_mkdir,
	.symlink = r_symlink,
	.link = r_link,
	.unlink = r_unlink,
	.rmdir = r_rmdir,
	.rename = r_rename,
	.open = r_open,
	.create = r_create,
	.read = r_read,
	.file_fd = NULL,
	.write = r_write,
	.flush = r_flush,
	.fsync = r_fsync,
	.write_then = r_write_then,
	.release = r_release,
	.fallocate = r_fallocate,
	.lseek = r_lseek,
	.opendir = premote_opendir,
	.readdir = premote_readdir,
	.fsyncdir = premote_fsyncdir,
	.releasedir = premote_releasedir,
	.statfs = premote_statfs,
	.getxattr = premote_getxattr,
	.listxattr = premote_listxattr,
	.setxattr = premote_setxattr,
	.removexattr = premote_removexattr,
	.node_path = r_node_path,
	.exec_start = premote_exec_start,
	.watch_start = premote_watch_start,
	.watch_sync = premote_watch_sync,
	.watch_stop = premote_watch_stop,
	.bulk = premote_bulk,
	.node_at = r_node_at,
	.node_at_ino = r_node_at_ino,
	.watch_healthy = r_watch_healthy,
	.free = r_free,
	.repo_seed = premote_repo_seed,
	.repo_state = premote_repo_state,
	.repo_objects = premote_repo_objects,
};

int premote_sandbox_open(struct sbx_sandbox **out, const char *session,
			 struct premote_config *cfg, struct premote_http *http,
			 struct premote_info *info)
{
	struct premote_sandbox *s;
	struct stat st;
	cJSON *j = NULL;
	int rc;

	*out = NULL;
	s = sbx_xcalloc(1, sizeof(*s));
	/* Whether the daemon caches it is decided there (cli/daemon.c). */
	s->base.ops = &premote_sandbox_ops;
	s->base.session = sbx_xstrdup(session);
	s->cfg = *cfg;
	memset(cfg, 0, sizeof(*cfg));
	s->http = http;
	s->info = *info;
	memset(info, 0, sizeof(*info));
	s->base.workdir = sbx_xstrdup(s->info.root);
	pthread_mutex_init(&s->nodes_lock, NULL);
	pthread_mutex_init(&s->seq_lock, NULL);
	pthread_mutex_init(&s->cenv_lock, NULL);
	sbx_hashmap_init(&s->by_ino);
	sbx_hashmap_init(&s->by_path);
	/* A stable st_dev per sandbox: from its URL.  Never change the
	 * formula (inode numbers users saw would move). */
	s->dev = (dev_t)((mix64(sbx_fnv1a_str(s->cfg.url)) & 0xffffffffu) |
			 1u);

	if (s->info.has_root_st) {
		/* /v1/info said it: no round trip of its own. */
		st = s->info.root_st;
		rc = 0;
	} else {
		rc = premote_fs_errno(
			premote_get_json(s, "/v1/fs/stat", "", &j));
		if (rc == 0)
			rc = sbx_proto_stat_from_json(
				cJSON_GetObjectItemCaseSensitive(j, "st"),
				&st);
		cJSON_Delete(j);
	}
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "stat the root of the agent at %s",
				      s->cfg.url);
		goto fail;
	}
	s->root_rdev = (uint64_t)st.st_dev;
	premote_fix_stat(s, &st);
	s->root.ino = (uint64_t)st.st_ino;
	s->root.path = NULL;
	s->root.dir = true;
	s->root.refs = 1;
	*out = &s->base;
	return 0;
fail:
	r_free(&s->base);
	return rc;
}
