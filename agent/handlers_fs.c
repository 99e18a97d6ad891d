/*
 * File routes: stat, list, read, write, readlink, statfs, batch and bulk
 * (docs/protocol.md, "Files").
 *
 * Every path goes through confine.c.  Operations on the last component
 * itself use the parent's fd and the bare name with the *at() calls and
 * AT_SYMLINK_NOFOLLOW / O_NOFOLLOW, so a symlink there is never followed.
 * Where no *at() call can act on an inode without following (chmod,
 * xattrs, utimens of the root), the object is opened O_PATH | O_NOFOLLOW
 * and addressed as /proc/self/fd/N, which names exactly that inode.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

/* One read answers at most this much (the client checks X-Sbx-Size). */
#define MAX_READ SBX_PROTO_MAX_WRITE_BODY
/* A batch read op answers at most this much (base64 in JSON). */
#define MAX_BATCH_READ (1024 * 1024)
#define MAX_XATTR (64 * 1024)
/* Bulk: a directory frame's JSON stays below the frame limit. */
#define BULK_FRAME_BUDGET (SBX_PROTO_MAX_FRAME_JSON - 4096)
#define BULK_DEFAULT_MAX_FILE (64 * 1024)
#define BULK_DEFAULT_MAX_TOTAL (32LL * 1024 * 1024)

/* ---- helpers ------------------------------------------------------------- */

static int req_path(struct agent_req *r, const char *key, char **out)
{
	const char *p = agent_arg(r, key);

	return agent_path_norm(p ? p : "", out);
}

/* lstat of (dfd, name); name "" is dfd itself. */
static int stat_at(int dfd, const char *name, struct stat *st, const char *what)
{
	if (fstatat(dfd, name, st,
		    AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH)) < 0)
		return sbx_error_os("stat %s", what);
	return 0;
}

static int lstat_path(struct agent *a, const char *path, struct stat *st)
{
	const char *name;
	char *buf = NULL;
	int dfd = -1, rc;

	rc = agent_parent(a, path, &dfd, &name, &buf);
	if (rc == 0)
		rc = stat_at(dfd, name, st, *path ? path : "/");
	if (dfd >= 0)
		close(dfd);
	free(buf);
	return rc;
}

static cJSON *list_entries(DIR *d, const char *what, int *rc_out)
{
	cJSON *arr = cJSON_CreateArray();
	struct dirent *e;

	*rc_out = 0;
	errno = 0;
	while ((e = readdir(d))) {
		struct stat st;
		cJSON *o;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* removed meanwhile */
		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", e->d_name);
		cJSON_AddItemToObject(o, "st", sbx_proto_stat_to_json(&st));
		cJSON_AddItemToArray(arr, o);
		errno = 0;
	}
	if (errno) {
		*rc_out = sbx_error_os("list %s", what);
		cJSON_Delete(arr);
		return NULL;
	}
	return arr;
}

static int list_path(struct agent *a, const char *path, cJSON **out)
{
	DIR *d;
	int fd, rc;

	*out = NULL;
	rc = agent_open(a, path, O_RDONLY | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	d = fdopendir(fd);
	if (!d) {
		rc = sbx_error_os("list %s", path);
		close(fd);
		return rc;
	}
	*out = list_entries(d, *path ? path : "/", &rc);
	closedir(d);
	return rc;
}

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

static void put_st(cJSON *o, const struct stat *st)
{
	cJSON_AddItemToObject(o, "st", sbx_proto_stat_to_json(st));
}

/* ---- simple routes -------------------------------------------------------- */

int agent_h_stat(struct agent_req *r)
{
	struct stat st;
	char *path = NULL;
	cJSON *o;
	int rc;

	rc = req_path(r, "path", &path);
	if (rc == 0)
		rc = lstat_path(r->a, path, &st);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	put_st(o, &st);
	return agent_reply_json(r, 200, o);
}

int agent_h_list(struct agent_req *r)
{
	char *path = NULL;
	cJSON *entries = NULL, *o;
	int rc;

	rc = req_path(r, "path", &path);
	if (rc == 0)
		rc = list_path(r->a, path, &entries);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	cJSON_AddItemToObject(o, "entries", entries);
	return agent_reply_json(r, 200, o);
}

static void hdr_stat(struct MHD_Response *resp, const struct stat *st)
{
	char v[64];

	snprintf(v, sizeof(v), "%lld", (long long)st->st_size);
	MHD_add_response_header(resp, SBX_HDR_SIZE, v);
	snprintf(v, sizeof(v), "%lld.%09ld", (long long)st->st_mtim.tv_sec,
		 st->st_mtim.tv_nsec);
	MHD_add_response_header(resp, SBX_HDR_MTIME, v);
	snprintf(v, sizeof(v), "%" PRIu64, (uint64_t)st->st_ino);
	MHD_add_response_header(resp, SBX_HDR_INO, v);
}

int agent_h_read(struct agent_req *r)
{
	long long off, len;
	struct MHD_Response *resp;
	char *path = NULL, *data = NULL;
	struct stat st;
	size_t got = 0;
	int fd = -1, rc;

	rc = req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "offset", 0, 0, LLONG_MAX, &off);
	if (rc == 0)
		rc = agent_arg_int(r, "length", MAX_READ, 0, LLONG_MAX, &len);
	if (rc == 0)
		rc = agent_open(r->a, path, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0,
				&fd);
	if (rc == 0 && fstat(fd, &st) < 0)
		rc = sbx_error_os("read %s", path);
	if (rc == 0 && S_ISDIR(st.st_mode))
		rc = sbx_error_set(SBX_ERR_OS, -EISDIR, "read %s: a directory",
				   path);
	if (rc < 0)
		goto out;
	if (len > MAX_READ)
		len = MAX_READ;
	/* Regular files: never allocate past the end. */
	if (S_ISREG(st.st_mode))
		len = off >= st.st_size ? 0
			: (st.st_size - off < len ? st.st_size - off : len);
	data = sbx_xmalloc((size_t)len + 1);
	while (got < (size_t)len) {
		ssize_t n = pread(fd, data + got, (size_t)len - got,
				  (off_t)(off + (long long)got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sbx_error_os("read %s", path);
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	resp = MHD_create_response_from_buffer(got, data, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		rc = -ENOMEM;
		goto out;
	}
	data = NULL;
	hdr_stat(resp, &st);
	close(fd);
	free(path);
	return agent_reply(r, 200, resp, SBX_CT_OCTET);
out:
	free(data);
	if (fd >= 0)
		close(fd);
	free(path);
	return agent_reply_error(r, 0, rc);
}

static int write_all(int fd, const void *data, size_t len, long long off,
		     bool append, const char *what)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n = append ? write(fd, (const char *)data + done,
					   len - done)
				   : pwrite(fd, (const char *)data + done,
					    len - done,
					    (off_t)(off + (long long)done));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return sbx_error_os("write %s", what);
		done += (size_t)n;
	}
	return 0;
}

int agent_h_write(struct agent_req *r)
{
	long long off, append, trunc;
	char *path = NULL;
	struct stat st;
	cJSON *o;
	int fd = -1, rc;

	rc = req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "offset", 0, 0, LLONG_MAX / 2, &off);
	if (rc == 0)
		rc = agent_arg_int(r, "append", 0, 0, 1, &append);
	if (rc == 0)
		rc = agent_arg_int(r, "truncate", 0, 0, 1, &trunc);
	if (rc == 0)
		rc = agent_open(r->a, path,
				O_WRONLY | O_NOCTTY | (append ? O_APPEND : 0),
				0, &fd);
	if (rc == 0)
		rc = write_all(fd, r->body.data, r->body.len, off, append, path);
	if (rc == 0 && trunc && !append &&
	    ftruncate(fd, (off_t)(off + (long long)r->body.len)) < 0)
		rc = sbx_error_os("truncate %s", path);
	if (rc == 0 && fstat(fd, &st) < 0)
		rc = sbx_error_os("stat %s", path);
	if (fd >= 0)
		close(fd);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "written", (double)r->body.len);
	put_st(o, &st);
	return agent_reply_json(r, 200, o);
}

static int readlink_path(struct agent *a, const char *path, char **out)
{
	char target[PATH_MAX + 1];
	const char *name;
	char *buf = NULL;
	ssize_t n = -1;
	int dfd = -1, rc;

	*out = NULL;
	rc = agent_parent(a, path, &dfd, &name, &buf);
	if (rc == 0) {
		n = readlinkat(dfd, name, target, sizeof(target) - 1);
		if (n < 0)
			rc = sbx_error_os("readlink %s", path);
	}
	if (dfd >= 0)
		close(dfd);
	free(buf);
	if (rc < 0)
		return rc;
	target[n] = '\0';
	*out = sbx_xstrdup(target);
	return 0;
}

int agent_h_readlink(struct agent_req *r)
{
	char *path = NULL, *target = NULL;
	cJSON *o;
	int rc;

	rc = req_path(r, "path", &path);
	if (rc == 0)
		rc = readlink_path(r->a, path, &target);
	free(path);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "target", target);
	free(target);
	return agent_reply_json(r, 200, o);
}

static int statfs_root(struct agent *a, cJSON **out)
{
	struct statvfs sv;

	*out = NULL;
	if (fstatvfs(a->root_fd, &sv) < 0)
		return sbx_error_os("statfs");
	*out = sbx_proto_statvfs_to_json(&sv);
	return 0;
}

int agent_h_statfs(struct agent_req *r)
{
	cJSON *o;
	int rc = statfs_root(r->a, &o);

	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_json(r, 200, o);
}

/* ---- batch: parsing (pure) ------------------------------------------------ */

static const struct {
	const char *name;
	int kind;
} op_names[] = {
	{ "stat", AGENT_OP_STAT },
	{ "list", AGENT_OP_LIST },
	{ "mkdir", AGENT_OP_MKDIR },
	{ "mknod", AGENT_OP_MKNOD },
	{ "create", AGENT_OP_CREATE },
	{ "symlink", AGENT_OP_SYMLINK },
	{ "link", AGENT_OP_LINK },
	{ "unlink", AGENT_OP_UNLINK },
	{ "rmdir", AGENT_OP_RMDIR },
	{ "rename", AGENT_OP_RENAME },
	{ "setattr", AGENT_OP_SETATTR },
	{ "write", AGENT_OP_WRITE },
	{ "read", AGENT_OP_READ },
	{ "readlink", AGENT_OP_READLINK },
	{ "fsync", AGENT_OP_FSYNC },
	{ "fallocate", AGENT_OP_FALLOCATE },
	{ "lseek", AGENT_OP_LSEEK },
	{ "getxattr", AGENT_OP_GETXATTR },
	{ "listxattr", AGENT_OP_LISTXATTR },
	{ "setxattr", AGENT_OP_SETXATTR },
	{ "removexattr", AGENT_OP_REMOVEXATTR },
	{ "statfs", AGENT_OP_STATFS },
};

static const char *op_name(int kind)
{
	for (size_t i = 0; i < sizeof(op_names) / sizeof(op_names[0]); i++)
		if (op_names[i].kind == kind)
			return op_names[i].name;
	return "?";
}

/* Parse-error context: "ops[3] (mkdir)". */
struct pctx {
	struct agent_op *op;
	size_t index;
};

static int perr(struct pctx *c, const char *field, const char *what)
{
	if (c->op->rc == 0) {
		c->op->rc = -EINVAL;
		c->op->msg = sbx_xasprintf("ops[%zu] (%s): \"%s\" %s", c->index,
					   op_name(c->op->kind), field, what);
	}
	return -EINVAL;
}

static const cJSON *field(const cJSON *o, const char *key)
{
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNull(f) ? NULL : f;
}

static int p_int(struct pctx *c, const cJSON *o, const char *key, bool required,
		 long long lo, long long hi, long long *out, bool *present)
{
	const cJSON *f = field(o, key);
	double d;

	if (present)
		*present = f != NULL;
	if (!f)
		return required ? perr(c, key, "is required") : 0;
	if (!cJSON_IsNumber(f))
		return perr(c, key, "must be an integer");
	d = f->valuedouble;
	if (!isfinite(d) || d < (double)lo || d > (double)hi ||
	    d != (double)(long long)d)
		return perr(c, key, "is out of range");
	*out = (long long)d;
	return 0;
}

static int p_bool(struct pctx *c, const cJSON *o, const char *key, bool *out)
{
	const cJSON *f = field(o, key);

	*out = false;
	if (!f)
		return 0;
	if (cJSON_IsBool(f)) {
		*out = cJSON_IsTrue(f);
		return 0;
	}
	if (cJSON_IsNumber(f) && (f->valuedouble == 0 || f->valuedouble == 1)) {
		*out = f->valuedouble == 1;
		return 0;
	}
	return perr(c, key, "must be a boolean");
}

static int p_str(struct pctx *c, const cJSON *o, const char *key,
		 bool required, char **out)
{
	const cJSON *f = field(o, key);

	*out = NULL;
	if (!f)
		return required ? perr(c, key, "is required") : 0;
	if (!cJSON_IsString(f) || !f->valuestring)
		return perr(c, key, "must be a string");
	if (strlen(f->valuestring) >= PATH_MAX)
		return perr(c, key, "is too long");
	*out = sbx_xstrdup(f->valuestring);
	return 0;
}

static int p_path(struct pctx *c, const cJSON *o, const char *key, char **out)
{
	char *raw = NULL;
	int rc = p_str(c, o, key, true, &raw);

	if (rc < 0)
		return rc;
	rc = agent_path_norm(raw, out);
	free(raw);
	if (rc < 0)
		return perr(c, key, "is not a valid path");
	return 0;
}

static int p_b64(struct pctx *c, const cJSON *o, const char *key,
		 bool required, unsigned char **out, size_t *len)
{
	const cJSON *f = field(o, key);

	*out = NULL;
	*len = 0;
	if (!f)
		return required ? perr(c, key, "is required") : 0;
	if (!cJSON_IsString(f) || !f->valuestring)
		return perr(c, key, "must be a base64 string");
	if (sbx_proto_base64_decode(f->valuestring, out, len) < 0) {
		sbx_error_clear();
		return perr(c, key, "is not valid base64");
	}
	return 0;
}

/* setattr times: [s, ns] or "now". */
static int p_time(struct pctx *c, const cJSON *o, const char *key, int *set,
		  long long *s, long long *ns)
{
	const cJSON *f = field(o, key);
	const cJSON *a0, *a1;

	*set = AGENT_TIME_OMIT;
	if (!f)
		return 0;
	if (cJSON_IsString(f) && f->valuestring &&
	    !strcmp(f->valuestring, "now")) {
		*set = AGENT_TIME_NOW;
		return 0;
	}
	if (!cJSON_IsArray(f) || cJSON_GetArraySize(f) != 2)
		return perr(c, key, "must be [s, ns] or \"now\"");
	a0 = cJSON_GetArrayItem(f, 0);
	a1 = cJSON_GetArrayItem(f, 1);
	if (!cJSON_IsNumber(a0) || !cJSON_IsNumber(a1) ||
	    !isfinite(a0->valuedouble) || fabs(a0->valuedouble) > 9e15 ||
	    a0->valuedouble != (double)(long long)a0->valuedouble ||
	    a1->valuedouble < 0 || a1->valuedouble > 999999999 ||
	    a1->valuedouble != (double)(long long)a1->valuedouble)
		return perr(c, key, "must be [s, ns] or \"now\"");
	*s = (long long)a0->valuedouble;
	*ns = (long long)a1->valuedouble;
	*set = AGENT_TIME_SET;
	return 0;
}

static int p_rename_flags(struct pctx *c, const cJSON *o, unsigned *out)
{
	const cJSON *f = field(o, "flags");

	*out = 0;
	if (!f || (cJSON_IsNumber(f) && f->valuedouble == 0))
		return 0;
	if (cJSON_IsString(f) && f->valuestring) {
		if (!strcmp(f->valuestring, "noreplace")) {
			*out = RENAME_NOREPLACE;
			return 0;
		}
		if (!strcmp(f->valuestring, "exchange")) {
			*out = RENAME_EXCHANGE;
			return 0;
		}
		if (!*f->valuestring || !strcmp(f->valuestring, "0"))
			return 0;
	}
	return perr(c, "flags", "must be 0, \"noreplace\" or \"exchange\"");
}

static int p_xattr_flags(struct pctx *c, const cJSON *o, unsigned *out)
{
	const cJSON *f = field(o, "flags");

	*out = 0;
	if (!f || (cJSON_IsNumber(f) && f->valuedouble == 0))
		return 0;
	if (cJSON_IsString(f) && f->valuestring) {
		if (!strcmp(f->valuestring, "create")) {
			*out = XATTR_CREATE;
			return 0;
		}
		if (!strcmp(f->valuestring, "replace")) {
			*out = XATTR_REPLACE;
			return 0;
		}
	}
	return perr(c, "flags", "must be 0, \"create\" or \"replace\"");
}

/* Fill `op` from `o`; on a field error op->rc/msg are set. */
static void parse_op(struct agent_op *op, const cJSON *o, size_t index)
{
	struct pctx c = { .op = op, .index = index };
	const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "op");
	long long v = 0;
	bool present;

	if (!cJSON_IsObject(o)) {
		op->rc = -EINVAL;
		op->msg = sbx_xasprintf("ops[%zu]: not an object", index);
		return;
	}
	if (cJSON_IsString(kind) && kind->valuestring)
		for (size_t i = 0; i < sizeof(op_names) / sizeof(op_names[0]);
		     i++)
			if (!strcmp(op_names[i].name, kind->valuestring))
				op->kind = op_names[i].kind;
	if (!op->kind) {
		op->rc = -EINVAL;
		op->msg = sbx_xasprintf("ops[%zu]: unknown or missing \"op\"",
					index);
		return;
	}
	if (op->kind != AGENT_OP_STATFS && p_path(&c, o, "path", &op->path) < 0)
		return;
	if (op->path && *op->path) {
		const char *raw = cJSON_GetStringValue(field(o, "path"));

		op->dir_slash = raw && raw[strlen(raw) - 1] == '/';
	}

	switch (op->kind) {
	case AGENT_OP_MKDIR:
	case AGENT_OP_CREATE:
	case AGENT_OP_MKNOD:
	case AGENT_OP_SYMLINK:
		/* The owner of the new object (applied as root only). */
		if (p_int(&c, o, "uid", false, 0, UINT32_MAX - 1, &v,
			  &op->has_uid) < 0)
			return;
		op->uid = (unsigned)v;
		if (p_int(&c, o, "gid", false, 0, UINT32_MAX - 1, &v,
			  &op->has_gid) < 0)
			return;
		op->gid = (unsigned)v;
		break;
	default:
		break;
	}

	switch (op->kind) {
	case AGENT_OP_MKDIR:
	case AGENT_OP_CREATE:
	case AGENT_OP_MKNOD:
		if (p_int(&c, o, "mode", op->kind == AGENT_OP_MKNOD, 0,
			  UINT32_MAX, &v, &present) < 0)
			return;
		op->mode = present ? (unsigned)v
			 : (op->kind == AGENT_OP_MKDIR ? 0755 : 0644);
		op->has_mode = present;
		if (op->kind == AGENT_OP_MKNOD &&
		    p_int(&c, o, "rdev", false, 0, (long long)1 << 53, &v,
			  NULL) == 0)
			op->rdev = (unsigned long long)v;
		if (op->kind == AGENT_OP_CREATE) {
			if (p_bool(&c, o, "excl", &op->excl) < 0 ||
			    p_bool(&c, o, "truncate", &op->truncate) < 0)
				return;
		}
		break;
	case AGENT_OP_SYMLINK:
		p_str(&c, o, "target", true, &op->target);
		if (op->target && !*op->target)
			perr(&c, "target", "must not be empty");
		break;
	case AGENT_OP_LINK:
		p_path(&c, o, "newpath", &op->newpath);
		break;
	case AGENT_OP_RENAME:
		if (p_path(&c, o, "newpath", &op->newpath) == 0)
			p_rename_flags(&c, o, &op->flags);
		break;
	case AGENT_OP_SETATTR:
		if (p_int(&c, o, "mode", false, 0, 07777, &v, &op->has_mode) <
		    0)
			return;
		op->mode = (unsigned)v;
		if (p_int(&c, o, "uid", false, 0, UINT32_MAX - 1, &v,
			  &op->has_uid) < 0)
			return;
		op->uid = (unsigned)v;
		if (p_int(&c, o, "gid", false, 0, UINT32_MAX - 1, &v,
			  &op->has_gid) < 0)
			return;
		op->gid = (unsigned)v;
		if (p_int(&c, o, "size", false, 0, (long long)1 << 53,
			  &op->size, &op->has_size) < 0)
			return;
		if (p_time(&c, o, "atime", &op->atime_set, &op->atime_s,
			   &op->atime_ns) < 0)
			return;
		p_time(&c, o, "mtime", &op->mtime_set, &op->mtime_s,
		       &op->mtime_ns);
		break;
	case AGENT_OP_WRITE:
		if (p_int(&c, o, "offset", false, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0 ||
		    p_bool(&c, o, "append", &op->append) < 0)
			return;
		p_b64(&c, o, "data", true, &op->data, &op->data_len);
		break;
	case AGENT_OP_READ:
		if (p_int(&c, o, "offset", false, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0)
			return;
		op->length = MAX_BATCH_READ;
		p_int(&c, o, "length", false, 0, (long long)1 << 53,
		      &op->length, NULL);
		break;
	case AGENT_OP_FSYNC:
		p_bool(&c, o, "datasync", &op->datasync);
		break;
	case AGENT_OP_LSEEK: {
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "whence");

		if (p_int(&c, o, "offset", true, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0)
			return;
		/* Only what needs the file's extents: the rest is local. */
		if (cJSON_IsString(w) && strcmp(w->valuestring, "data") == 0)
			op->whence = SEEK_DATA;
		else if (cJSON_IsString(w) && strcmp(w->valuestring, "hole") == 0)
			op->whence = SEEK_HOLE;
		else
			perr(&c, "whence", "must be \"data\" or \"hole\"");
		break;
	}
	case AGENT_OP_FALLOCATE:
		if (p_int(&c, o, "mode", false, 0, INT32_MAX, &v, NULL) < 0)
			return;
		op->fmode = (int)v;
		if (p_int(&c, o, "offset", true, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0)
			return;
		p_int(&c, o, "length", true, 1, (long long)1 << 53,
		      &op->length, NULL);
		break;
	case AGENT_OP_GETXATTR:
	case AGENT_OP_REMOVEXATTR:
	case AGENT_OP_SETXATTR:
		if (p_str(&c, o, "name", true, &op->name) < 0)
			return;
		if (!*op->name || strlen(op->name) > XATTR_NAME_MAX) {
			perr(&c, "name", "must be 1-255 bytes");
			return;
		}
		if (op->kind == AGENT_OP_SETXATTR &&
		    p_b64(&c, o, "value", true, &op->data, &op->data_len) == 0)
			p_xattr_flags(&c, o, &op->flags);
		break;
	default:
		break;
	}
}

void agent_batch_free(struct agent_batch *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->n; i++) {
		struct agent_op *op = &b->ops[i];

		free(op->msg);
		free(op->path);
		free(op->newpath);
		free(op->target);
		free(op->name);
		free(op->data);
	}
	free(b->ops);
	free(b);
}

int agent_batch_parse(const char *body, size_t len, struct agent_batch **out)
{
	const cJSON *ops, *stop, *item;
	struct agent_batch *b;
	cJSON *doc = NULL;
	size_t i = 0;
	int rc, n;

	*out = NULL;
	rc = sbx_json_parse(&doc, body, len, "batch");
	if (rc < 0)
		return rc;
	if (!cJSON_IsObject(doc)) {
		cJSON_Delete(doc);
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "batch: expected an object");
	}
	ops = cJSON_GetObjectItemCaseSensitive(doc, "ops");
	if (!cJSON_IsArray(ops)) {
		cJSON_Delete(doc);
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "batch: \"ops\" must be an array");
	}
	n = cJSON_GetArraySize(ops);
	if (n > SBX_PROTO_MAX_BATCH) {
		cJSON_Delete(doc);
		return sbx_error_set(SBX_ERR_PROTO, -EFBIG,
				     "batch: %d ops, at most %d", n,
				     SBX_PROTO_MAX_BATCH);
	}
	stop = cJSON_GetObjectItemCaseSensitive(doc, "stop_on_error");
	if (stop && !cJSON_IsBool(stop)) {
		cJSON_Delete(doc);
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "batch: \"stop_on_error\" must be a "
				     "boolean");
	}
	b = sbx_xcalloc(1, sizeof(*b));
	b->stop_on_error = cJSON_IsTrue(stop);
	b->ops = sbx_xcalloc(n ? (size_t)n : 1, sizeof(*b->ops));
	b->n = (size_t)n;
	cJSON_ArrayForEach(item, ops)
	{
		parse_op(&b->ops[i], item, i);
		i++;
	}
	cJSON_Delete(doc);
	*out = b;
	return 0;
}

/* ---- batch: execution ------------------------------------------------------ */

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
static void fix_new(struct exec_ctx *x, const struct agent_op *op)
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
	int rc = stat_at(x->dfd, x->name, &st, path);

	if (rc == 0)
		put_st(res, &st);
	return rc;
}

static int op_setattr(struct exec_ctx *x, const struct agent_op *op,
		      cJSON *res)
{
	struct obj o = { .fd = -1 };
	const char *p = op->path;
	int rc;

	rc = obj_open(x->dfd, x->name, &o, p);
	if (rc < 0)
		return rc;
	if (op->has_mode) {
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
			ts[i].tv_nsec = set[i] == AGENT_TIME_OMIT  ? UTIME_OMIT
					: set[i] == AGENT_TIME_NOW ? UTIME_NOW
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
		put_st(res, &o.st);
	obj_close(&o);
	return rc;
}

static int op_xattr(struct exec_ctx *x, const struct agent_op *op, cJSON *res)
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
		if (op->kind == AGENT_OP_LISTXATTR)
			cJSON_AddArrayToObject(res, "names");
		else
			rc = sbx_error_set(SBX_ERR_OS,
					   op->kind == AGENT_OP_GETXATTR
						   ? -ENODATA
						   : -EPERM,
					   "xattr on symlink %s", p);
		goto out;
	}
	switch (op->kind) {
	case AGENT_OP_GETXATTR:
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
	case AGENT_OP_LISTXATTR: {
		cJSON *names = cJSON_AddArrayToObject(res, "names");

		buf = sbx_xmalloc(MAX_XATTR);
		n = listxattr(o.proc, buf, MAX_XATTR);
		if (n < 0) {
			rc = sbx_error_os("listxattr %s", p);
			break;
		}
		for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1)
			cJSON_AddItemToArray(names, cJSON_CreateString(buf + i));
		break;
	}
	case AGENT_OP_SETXATTR:
		if (setxattr(o.proc, op->name, op->data, op->data_len,
			     (int)op->flags) < 0)
			rc = sbx_error_os("setxattr %s %s", p, op->name);
		break;
	case AGENT_OP_REMOVEXATTR:
		if (removexattr(o.proc, op->name) < 0)
			rc = sbx_error_os("removexattr %s %s", p, op->name);
		break;
	}
out:
	free(buf);
	obj_close(&o);
	return rc;
}

static int op_data(struct exec_ctx *x, const struct agent_op *op, cJSON *res)
{
	struct stat st;
	int fd = -1, rc, flags;

	switch (op->kind) {
	case AGENT_OP_WRITE:
		flags = O_WRONLY | (op->append ? O_APPEND : 0);
		break;
	case AGENT_OP_FALLOCATE:
		flags = O_WRONLY;
		break;
	default:
		flags = O_RDONLY;
		break;
	}
	rc = agent_open(x->a, op->path, flags | O_NOCTTY | O_NONBLOCK, 0, &fd);
	if (rc < 0)
		return rc;
	switch (op->kind) {
	case AGENT_OP_WRITE:
		rc = write_all(fd, op->data, op->data_len, op->offset,
			       op->append, op->path);
		if (rc == 0)
			cJSON_AddNumberToObject(res, "written",
						(double)op->data_len);
		break;
	case AGENT_OP_READ: {
		size_t len = op->length > MAX_BATCH_READ ? MAX_BATCH_READ
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
	case AGENT_OP_FSYNC:
		if ((op->datasync ? fdatasync(fd) : fsync(fd)) < 0)
			rc = sbx_error_os("fsync %s", op->path);
		break;
	case AGENT_OP_FALLOCATE:
		if (fallocate(fd, op->fmode, (off_t)op->offset,
			      (off_t)op->length) < 0)
			rc = sbx_error_os("fallocate %s", op->path);
		break;
	case AGENT_OP_LSEEK: {
		off_t r = lseek(fd, (off_t)op->offset, op->whence);

		if (r < 0)
			rc = sbx_error_os("lseek %s", op->path);
		else
			cJSON_AddNumberToObject(res, "offset", (double)r);
		break;
	}
	}
	if (rc == 0 && (op->kind == AGENT_OP_WRITE || op->kind == AGENT_OP_READ)) {
		if (fstat(fd, &st) == 0)
			put_st(res, &st);
	}
	close(fd);
	return rc;
}

/* Run one op; fills `res` with its result fields. */
static int run_op(struct agent *a, const struct agent_op *op, cJSON *res)
{
	struct exec_ctx x = { .a = a, .dfd = -1 };
	struct exec_ctx y = { .a = a, .dfd = -1 };
	const char *p = op->path;
	int rc = 0;

	switch (op->kind) {
	case AGENT_OP_STATFS: {
		cJSON *o = NULL;

		rc = statfs_root(a, &o);
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
	case AGENT_OP_LIST: {
		cJSON *entries = NULL;

		rc = list_path(a, p, &entries);
		if (rc == 0)
			cJSON_AddItemToObject(res, "entries", entries);
		return rc;
	}
	case AGENT_OP_WRITE:
	case AGENT_OP_READ:
	case AGENT_OP_FSYNC:
	case AGENT_OP_FALLOCATE:
	case AGENT_OP_LSEEK:
		return op_data(&x, op, res);
	default:
		break;
	}

	rc = parent_of(&x, p);
	if (rc < 0)
		goto out;
	switch (op->kind) {
	case AGENT_OP_STAT:
		rc = stat_result(&x, p, res);
		break;
	case AGENT_OP_MKDIR:
		rc = need_name(&x, p);
		if (rc == 0 && mkdirat(x.dfd, x.name, (mode_t)op->mode) < 0)
			rc = sbx_error_os("mkdir %s", p);
		if (rc == 0)
			fix_new(&x, op);
		if (rc == 0)
			rc = stat_result(&x, p, res);
		break;
	case AGENT_OP_MKNOD:
		rc = need_name(&x, p);
		if (rc == 0 && mknodat(x.dfd, x.name, (mode_t)op->mode,
				       (dev_t)op->rdev) < 0)
			rc = sbx_error_os("mknod %s", p);
		if (rc == 0)
			fix_new(&x, op);
		if (rc == 0)
			rc = stat_result(&x, p, res);
		break;
	case AGENT_OP_CREATE: {
		int fd, fl = O_CREAT | O_WRONLY | O_NOFOLLOW | O_NOCTTY |
			     O_NONBLOCK | O_CLOEXEC |
			     (op->truncate ? O_TRUNC : 0);
		bool made = true;

		rc = need_name(&x, p);
		if (rc < 0)
			break;
		/* O_NOFOLLOW: never create through a symlink.  Exclusive
		 * first, so an existing file keeps its owner and mode. */
		fd = openat(x.dfd, x.name, fl | O_EXCL,
			    (mode_t)(op->mode & 07777));
		if (fd < 0 && errno == EEXIST && !op->excl) {
			made = false;
			fd = openat(x.dfd, x.name, fl,
				    (mode_t)(op->mode & 07777));
		}
		if (fd < 0) {
			rc = sbx_error_os("create %s", p);
			break;
		}
		close(fd);
		if (made)
			fix_new(&x, op);
		rc = stat_result(&x, p, res);
		break;
	}
	case AGENT_OP_SYMLINK:
		rc = need_name(&x, p);
		if (rc == 0 && symlinkat(op->target, x.dfd, x.name) < 0)
			rc = sbx_error_os("symlink %s", p);
		if (rc == 0)
			fix_new(&x, op);
		if (rc == 0)
			rc = stat_result(&x, p, res);
		break;
	case AGENT_OP_LINK:
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
	case AGENT_OP_UNLINK:
		rc = need_name(&x, p);
		if (rc == 0 && op->dir_slash) {
			/* "x/" names a directory: unlink(2) answers ENOTDIR
			 * for a file or symlink x, never removes it. */
			struct stat st;

			if (fstatat(x.dfd, x.name, &st, AT_SYMLINK_NOFOLLOW) < 0)
				rc = sbx_error_os("unlink %s/", p);
			else if (!S_ISDIR(st.st_mode))
				rc = sbx_error_set(SBX_ERR_OS, -ENOTDIR,
						   "unlink %s/: not a directory",
						   p);
		}
		if (rc == 0 && unlinkat(x.dfd, x.name, 0) < 0)
			rc = sbx_error_os("unlink %s", p);
		break;
	case AGENT_OP_RMDIR:
		rc = need_name(&x, p);
		if (rc == 0 && unlinkat(x.dfd, x.name, AT_REMOVEDIR) < 0)
			rc = sbx_error_os("rmdir %s", p);
		break;
	case AGENT_OP_RENAME:
		rc = need_name(&x, p);
		if (rc == 0)
			rc = parent_of(&y, op->newpath);
		if (rc == 0)
			rc = need_name(&y, op->newpath);
		if (rc == 0 &&
		    renameat2(x.dfd, x.name, y.dfd, y.name, op->flags) < 0)
			rc = sbx_error_os("rename %s to %s", p, op->newpath);
		break;
	case AGENT_OP_SETATTR:
		rc = op_setattr(&x, op, res);
		break;
	case AGENT_OP_READLINK: {
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
	case AGENT_OP_GETXATTR:
	case AGENT_OP_LISTXATTR:
	case AGENT_OP_SETXATTR:
	case AGENT_OP_REMOVEXATTR:
		rc = op_xattr(&x, op, res);
		break;
	default:
		rc = sbx_error_set(SBX_ERR_INTERNAL, -EINVAL, "op %d", op->kind);
		break;
	}
out:
	ctx_fini(&x);
	ctx_fini(&y);
	return rc;
}

static cJSON *error_result(int rc, const char *msg)
{
	return sbx_proto_error_to_json(rc, msg);
}

int agent_h_batch(struct agent_req *r)
{
	struct agent_batch *b = NULL;
	cJSON *out, *results;
	bool stopped = false;
	int rc;

	rc = agent_batch_parse(r->body.data ? r->body.data : "", r->body.len,
			       &b);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	out = cJSON_CreateObject();
	results = cJSON_AddArrayToObject(out, "results");
	for (size_t i = 0; i < b->n; i++) {
		const struct agent_op *op = &b->ops[i];
		cJSON *res;

		if (stopped) {
			res = error_result(-ECANCELED,
					   "not run: an earlier op failed");
		} else if (op->rc < 0) {
			res = error_result(op->rc, op->msg);
		} else {
			res = cJSON_CreateObject();
			sbx_error_clear();
			rc = run_op(r->a, op, res);
			if (rc < 0) {
				const struct sbx_error *e = sbx_error_last();

				cJSON_Delete(res);
				res = error_result(rc, e->code == rc ? e->msg
								     : NULL);
				sbx_debug("batch %s %s: %s", op_name(op->kind),
					  op->path ? op->path : "",
					  e->code == rc ? e->msg
							: strerror(-rc));
			} else {
				cJSON_AddBoolToObject(res, "ok", 1);
			}
		}
		if (b->stop_on_error && (op->rc < 0 || cJSON_HasObjectItem(
							       res, "error")))
			stopped = true;
		cJSON_AddItemToArray(results, res);
	}
	agent_batch_free(b);
	return agent_reply_json(r, 200, out);
}

/* ---- bulk ------------------------------------------------------------------ */

struct bulk_entry {
	char *name;
	struct stat st;
};

struct bulk {
	struct agent_stream base;
	/* directories still to walk, breadth first */
	char **queue;
	int *qdepth;
	size_t qhead, qlen, qcap;
	long long max_file, max_total, total;
	long long max_depth; /* <= 0: unlimited */
	uint64_t watch_seq;
	/* the directory being emitted */
	int dfd;
	char *dpath;
	int ddepth;
	struct stat dst;
	struct bulk_entry *ents;
	size_t nents, emitted, filepos;
};

static void bulk_push(struct bulk *b, char *path, int depth)
{
	if (b->qlen == b->qcap) {
		b->qcap = b->qcap ? b->qcap * 2 : 16;
		b->queue = sbx_xrealloc(b->queue, b->qcap * sizeof(*b->queue));
		b->qdepth = sbx_xrealloc(b->qdepth,
					 b->qcap * sizeof(*b->qdepth));
	}
	b->queue[b->qlen] = path;
	b->qdepth[b->qlen] = depth;
	b->qlen++;
}

static void bulk_dir_done(struct bulk *b)
{
	for (size_t i = 0; i < b->nents; i++)
		free(b->ents[i].name);
	free(b->ents);
	b->ents = NULL;
	b->nents = b->emitted = b->filepos = 0;
	if (b->dfd >= 0)
		close(b->dfd);
	b->dfd = -1;
	free(b->dpath);
	b->dpath = NULL;
}

/* Open and read the next queued directory; -errno for that directory. */
static int bulk_open_dir(struct bulk *b)
{
	struct dirent *e;
	size_t cap = 0;
	DIR *d;
	int fd, rc;

	b->dpath = b->queue[b->qhead];
	b->ddepth = b->qdepth[b->qhead];
	b->queue[b->qhead] = NULL;
	b->qhead++;
	rc = agent_open(b->base.a, b->dpath, O_RDONLY | O_DIRECTORY, 0, &fd);
	if (rc < 0)
		return rc;
	if (fstat(fd, &b->dst) < 0 || !(d = fdopendir(fd))) {
		rc = sbx_error_os("list %s", b->dpath);
		close(fd);
		return rc;
	}
	b->dfd = dup(fd); /* kept for reading files after closedir */
	while ((e = readdir(d))) {
		struct bulk_entry *be;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (b->nents == cap) {
			cap = cap ? cap * 2 : 64;
			b->ents = sbx_xrealloc(b->ents, cap * sizeof(*b->ents));
		}
		be = &b->ents[b->nents];
		if (fstatat(fd, e->d_name, &be->st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		be->name = sbx_xstrdup(e->d_name);
		b->nents++;
		if (S_ISDIR(be->st.st_mode) &&
		    (b->max_depth <= 0 || b->ddepth < b->max_depth))
			bulk_push(b, sbx_proto_path_join(b->dpath, e->d_name),
				  b->ddepth + 1);
	}
	closedir(d);
	if (b->dfd < 0)
		return sbx_error_os("dup");
	return 0;
}

/* One directory frame with as many entries as fit the frame budget. */
static void bulk_dir_frame(struct bulk *b, struct sbx_buf *out)
{
	cJSON *h = cJSON_CreateObject();
	cJSON *arr;
	size_t budget = BULK_FRAME_BUDGET, used = 6 * strlen(b->dpath) + 512;

	cJSON_AddStringToObject(h, "dir", b->dpath);
	put_st(h, &b->dst);
	if (b->emitted)
		cJSON_AddBoolToObject(h, "continued", 1);
	arr = cJSON_AddArrayToObject(h, "entries");
	while (b->emitted < b->nents) {
		const struct bulk_entry *be = &b->ents[b->emitted];
		/* worst case: every byte escaped as \u00XX, 15 long numbers */
		size_t need = 6 * strlen(be->name) + 400;
		cJSON *o;

		if (used + need > budget && used > 6 * strlen(b->dpath) + 512)
			break;
		used += need;
		o = cJSON_CreateObject();
		cJSON_AddStringToObject(o, "name", be->name);
		put_st(o, &be->st);
		cJSON_AddItemToArray(arr, o);
		b->emitted++;
	}
	if (b->emitted < b->nents)
		cJSON_AddBoolToObject(h, "more", 1);
	agent_frame(out, h, NULL, 0);
}

/* The next small file's frame; false when none is left in this dir. */
static bool bulk_file_frame(struct bulk *b, struct sbx_buf *out)
{
	while (b->filepos < b->nents) {
		const struct bulk_entry *be = &b->ents[b->filepos++];
		struct stat st;
		char *data, *path;
		size_t got = 0;
		cJSON *h;
		int fd;

		if (!S_ISREG(be->st.st_mode) || be->st.st_size > b->max_file ||
		    b->total + be->st.st_size > b->max_total)
			continue;
		fd = openat(b->dfd, be->name,
			    O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY |
				    O_CLOEXEC);
		if (fd < 0)
			continue;
		/* st before reading: the client validates with it later. */
		if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
		    st.st_size > b->max_file ||
		    b->total + st.st_size > b->max_total) {
			close(fd);
			continue;
		}
		data = sbx_xmalloc((size_t)st.st_size + 1);
		while (got < (size_t)st.st_size) {
			ssize_t n = pread(fd, data + got,
					  (size_t)st.st_size - got, (off_t)got);

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		close(fd);
		if (got != (size_t)st.st_size) {
			/* Changed while reading: leave it to a later read. */
			free(data);
			continue;
		}
		b->total += st.st_size;
		path = sbx_proto_path_join(b->dpath, be->name);
		h = cJSON_CreateObject();
		cJSON_AddStringToObject(h, "file", path);
		put_st(h, &st);
		free(path);
		agent_frame(out, h, data, got);
		free(data);
		return true;
	}
	return false;
}

static int bulk_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct bulk *b = (struct bulk *)s;

	for (;;) {
		if (atomic_load(&s->a->stopping))
			return -ECANCELED;
		if (b->dpath && b->dfd >= 0) {
			if (b->emitted < b->nents || (b->nents == 0 &&
						      b->filepos == 0 &&
						      !b->emitted)) {
				bulk_dir_frame(b, out);
				if (b->nents == 0)
					b->filepos = 1; /* empty dir: done */
				return 0;
			}
			if (bulk_file_frame(b, out))
				return 0;
			bulk_dir_done(b);
			continue;
		}
		if (b->qhead >= b->qlen) {
			cJSON *h = cJSON_CreateObject();

			cJSON_AddBoolToObject(h, "end", 1);
			cJSON_AddNumberToObject(h, "watch_seq",
						(double)b->watch_seq);
			agent_frame(out, h, NULL, 0);
			return 1;
		}
		if (bulk_open_dir(b) < 0) {
			/* A directory that vanished or cannot be read:
			 * say so and go on with the rest. */
			const struct sbx_error *e = sbx_error_last();
			cJSON *h = sbx_proto_error_to_json(e->code, e->msg);

			cJSON_AddStringToObject(h, "dir", b->dpath);
			agent_frame(out, h, NULL, 0);
			bulk_dir_done(b);
			sbx_error_clear();
			return 0;
		}
	}
}

static void bulk_fini(struct agent_stream *s)
{
	struct bulk *b = (struct bulk *)s;

	bulk_dir_done(b);
	for (size_t i = b->qhead; i < b->qlen; i++)
		free(b->queue[i]);
	free(b->queue);
	free(b->qdepth);
	free(b);
}

int agent_h_bulk(struct agent_req *r)
{
	long long max_file, max_total, depth;
	struct stat st;
	char *path = NULL;
	struct bulk *b;
	int rc;

	rc = req_path(r, "path", &path);
	if (rc == 0)
		rc = agent_arg_int(r, "max_file", BULK_DEFAULT_MAX_FILE, 0,
				   SBX_PROTO_MAX_FRAME_DATA, &max_file);
	if (rc == 0)
		rc = agent_arg_int(r, "max_total", BULK_DEFAULT_MAX_TOTAL, 0,
				   LLONG_MAX / 2, &max_total);
	if (rc == 0)
		rc = agent_arg_int(r, "depth", 0, 0, INT32_MAX, &depth);
	/* Take the sequence before reading anything: a change made during
	 * the walk gets a later number, so the client applies it after. */
	uint64_t seq = agent_watch_seq(r->a);

	if (rc == 0) {
		int fd;

		/* Refuse a bad root of the walk with an HTTP error. */
		rc = agent_open(r->a, path, O_PATH | O_DIRECTORY, 0, &fd);
		if (rc == 0) {
			if (fstat(fd, &st) < 0)
				rc = sbx_error_os("stat %s", path);
			close(fd);
		}
	}
	if (rc < 0) {
		free(path);
		return agent_reply_error(r, 0, rc);
	}
	b = sbx_xcalloc(1, sizeof(*b));
	b->base.next = bulk_next;
	b->base.fini = bulk_fini;
	b->max_file = max_file;
	b->max_total = max_total;
	b->max_depth = depth;
	b->watch_seq = seq;
	b->dfd = -1;
	bulk_push(b, path, 1);
	return agent_reply_stream(r, &b->base);
}
