/*
 * Batch ops on the wire (sbx/proto_batch.h, docs/protocol.md "Batch
 * ops"): the decoder the agent runs on every request and the encoder the
 * remote provider builds its requests with.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "sbx/xmalloc.h"

/* ---- decoding ---------------------------------------------------------------- */

static const struct {
	const char *name;
	int kind;
} op_names[] = {
	{ "stat", SBX_BATCH_STAT },
	{ "list", SBX_BATCH_LIST },
	{ "mkdir", SBX_BATCH_MKDIR },
	{ "mknod", SBX_BATCH_MKNOD },
	{ "create", SBX_BATCH_CREATE },
	{ "symlink", SBX_BATCH_SYMLINK },
	{ "link", SBX_BATCH_LINK },
	{ "unlink", SBX_BATCH_UNLINK },
	{ "rmdir", SBX_BATCH_RMDIR },
	{ "rename", SBX_BATCH_RENAME },
	{ "setattr", SBX_BATCH_SETATTR },
	{ "write", SBX_BATCH_WRITE },
	{ "read", SBX_BATCH_READ },
	{ "readlink", SBX_BATCH_READLINK },
	{ "fsync", SBX_BATCH_FSYNC },
	{ "fallocate", SBX_BATCH_FALLOCATE },
	{ "lseek", SBX_BATCH_LSEEK },
	{ "getxattr", SBX_BATCH_GETXATTR },
	{ "listxattr", SBX_BATCH_LISTXATTR },
	{ "setxattr", SBX_BATCH_SETXATTR },
	{ "removexattr", SBX_BATCH_REMOVEXATTR },
	{ "statfs", SBX_BATCH_STATFS },
};

const char *sbx_batch_kind_name(int kind)
{
	for (size_t i = 0; i < sizeof(op_names) / sizeof(op_names[0]); i++)
		if (op_names[i].kind == kind)
			return op_names[i].name;
	return "?";
}

int sbx_batch_kind_from_name(const char *name)
{
	for (size_t i = 0; name && i < sizeof(op_names) / sizeof(op_names[0]);
	     i++)
		if (!strcmp(op_names[i].name, name))
			return op_names[i].kind;
	return 0;
}

/* Parse-error context: "ops[3] (mkdir)". */
struct pctx {
	struct sbx_batch_op *op;
	size_t index;
};

static int perr(struct pctx *c, const char *field, const char *what)
{
	if (c->op->rc == 0) {
		c->op->rc = -EINVAL;
		c->op->msg = sbx_xasprintf("ops[%zu] (%s): \"%s\" %s", c->index,
					   sbx_batch_kind_name(c->op->kind),
					   field, what);
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
	rc = sbx_proto_path_norm(raw, SBX_PATH_DOTDOT_KEEP, out);
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

/* An inode number: a decimal string, as in the stat array (0: none). */
static int p_ino(struct pctx *c, const cJSON *o, const char *key,
		 uint64_t *out)
{
	const cJSON *f = field(o, key);

	*out = 0;
	if (!f)
		return 0;
	if (sbx_proto_u64_from_json(f, out) < 0)
		return perr(c, key, "must be a decimal string");
	return 0;
}

/* "uid" and "gid", both optional (new objects' owner; setattr). */
static int p_owner(struct pctx *c, const cJSON *o)
{
	struct sbx_batch_op *op = c->op;
	long long v = 0;

	if (p_int(c, o, "uid", false, 0, UINT32_MAX - 1, &v, &op->has_uid) < 0)
		return -EINVAL;
	op->uid = (unsigned)v;
	if (p_int(c, o, "gid", false, 0, UINT32_MAX - 1, &v, &op->has_gid) < 0)
		return -EINVAL;
	op->gid = (unsigned)v;
	return 0;
}

/* setattr times: [s, ns] or "now". */
static int p_time(struct pctx *c, const cJSON *o, const char *key, int *set,
		  long long *s, long long *ns)
{
	const cJSON *f = field(o, key);
	const cJSON *a0, *a1;

	*set = SBX_BATCH_TIME_OMIT;
	if (!f)
		return 0;
	if (cJSON_IsString(f) && f->valuestring &&
	    !strcmp(f->valuestring, "now")) {
		*set = SBX_BATCH_TIME_NOW;
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
	*set = SBX_BATCH_TIME_SET;
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
void sbx_batch_op_decode(struct sbx_batch_op *op, const cJSON *o, size_t index)
{
	struct pctx c = { .op = op, .index = index };
	const cJSON *kind = cJSON_GetObjectItemCaseSensitive(o, "op");
	long long v = 0;
	bool present;

	memset(op, 0, sizeof(*op));
	if (!cJSON_IsObject(o)) {
		op->rc = -EINVAL;
		op->msg = sbx_xasprintf("ops[%zu]: not an object", index);
		return;
	}
	if (cJSON_IsString(kind))
		op->kind = sbx_batch_kind_from_name(kind->valuestring);
	if (!op->kind) {
		op->rc = -EINVAL;
		op->msg = sbx_xasprintf("ops[%zu]: unknown or missing \"op\"",
					index);
		return;
	}
	if (op->kind != SBX_BATCH_STATFS &&
	    p_path(&c, o, "path", &op->path) < 0)
		return;
	if (op->path && *op->path) {
		const char *raw = cJSON_GetStringValue(field(o, "path"));

		op->dir_slash = raw && raw[strlen(raw) - 1] == '/';
	}

	switch (op->kind) {
	case SBX_BATCH_MKDIR:
	case SBX_BATCH_CREATE:
	case SBX_BATCH_MKNOD:
	case SBX_BATCH_SYMLINK:
		/* The owner of the new object (applied as root only). */
		if (p_owner(&c, o) < 0)
			return;
		break;
	default:
		break;
	}

	switch (op->kind) {
	case SBX_BATCH_MKDIR:
	case SBX_BATCH_CREATE:
	case SBX_BATCH_MKNOD:
		if (p_int(&c, o, "mode", op->kind == SBX_BATCH_MKNOD, 0,
			  UINT32_MAX, &v, &present) < 0)
			return;
		op->mode = present ? (unsigned)v
			 : (op->kind == SBX_BATCH_MKDIR ? 0755 : 0644);
		op->has_mode = present;
		if (op->kind == SBX_BATCH_MKNOD &&
		    p_int(&c, o, "rdev", false, 0, (long long)1 << 53, &v,
			  NULL) == 0)
			op->rdev = (unsigned long long)v;
		if (op->kind == SBX_BATCH_CREATE) {
			if (p_bool(&c, o, "excl", &op->excl) < 0 ||
			    p_bool(&c, o, "truncate", &op->truncate) < 0)
				return;
		}
		break;
	case SBX_BATCH_SYMLINK:
		p_str(&c, o, "target", true, &op->target);
		if (op->target && !*op->target)
			perr(&c, "target", "must not be empty");
		break;
	case SBX_BATCH_LINK:
		p_path(&c, o, "newpath", &op->newpath);
		break;
	case SBX_BATCH_RENAME:
		if (p_path(&c, o, "newpath", &op->newpath) == 0)
			p_rename_flags(&c, o, &op->flags);
		break;
	case SBX_BATCH_SETATTR:
		if (p_int(&c, o, "mode", false, 0, 07777, &v, &op->has_mode) <
		    0)
			return;
		op->mode = (unsigned)v;
		if (p_owner(&c, o) < 0)
			return;
		if (p_int(&c, o, "size", false, 0, (long long)1 << 53,
			  &op->size, &op->has_size) < 0)
			return;
		if (p_time(&c, o, "atime", &op->atime_set, &op->atime_s,
			   &op->atime_ns) < 0)
			return;
		if (p_time(&c, o, "mtime", &op->mtime_set, &op->mtime_s,
			   &op->mtime_ns) < 0)
			return;
		p_ino(&c, o, "ino", &op->ino);
		break;
	case SBX_BATCH_WRITE:
		if (p_int(&c, o, "offset", false, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0 ||
		    p_bool(&c, o, "append", &op->append) < 0 ||
		    p_ino(&c, o, "ino", &op->ino) < 0)
			return;
		p_b64(&c, o, "data", true, &op->data, &op->data_len);
		break;
	case SBX_BATCH_READ:
		if (p_int(&c, o, "offset", false, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0)
			return;
		op->length = SBX_BATCH_MAX_READ;
		p_int(&c, o, "length", false, 0, (long long)1 << 53,
		      &op->length, NULL);
		break;
	case SBX_BATCH_FSYNC:
		p_bool(&c, o, "datasync", &op->datasync);
		break;
	case SBX_BATCH_LSEEK: {
		const cJSON *w = cJSON_GetObjectItemCaseSensitive(o, "whence");

		if (p_int(&c, o, "offset", true, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0)
			return;
		/* Only what needs the file's extents: the rest is local. */
		if (cJSON_IsString(w) && strcmp(w->valuestring, "data") == 0)
			op->whence = SEEK_DATA;
		else if (cJSON_IsString(w) &&
			 strcmp(w->valuestring, "hole") == 0)
			op->whence = SEEK_HOLE;
		else
			perr(&c, "whence", "must be \"data\" or \"hole\"");
		break;
	}
	case SBX_BATCH_FALLOCATE:
		if (p_int(&c, o, "mode", false, 0, INT32_MAX, &v, NULL) < 0)
			return;
		op->fmode = (int)v;
		if (p_int(&c, o, "offset", true, 0, (long long)1 << 53,
			  &op->offset, NULL) < 0)
			return;
		p_int(&c, o, "length", true, 1, (long long)1 << 53,
		      &op->length, NULL);
		break;
	case SBX_BATCH_GETXATTR:
	case SBX_BATCH_REMOVEXATTR:
	case SBX_BATCH_SETXATTR:
		if (p_str(&c, o, "name", true, &op->name) < 0)
			return;
		if (!*op->name || strlen(op->name) > XATTR_NAME_MAX) {
			perr(&c, "name", "must be 1-255 bytes");
			return;
		}
		if (op->kind == SBX_BATCH_SETXATTR &&
		    p_b64(&c, o, "value", true, &op->data, &op->data_len) == 0)
			p_xattr_flags(&c, o, &op->flags);
		break;
	default:
		break;
	}
}

void sbx_batch_op_fini(struct sbx_batch_op *op)
{
	if (!op)
		return;
	free(op->msg);
	free(op->path);
	free(op->newpath);
	free(op->target);
	free(op->name);
	free(op->data);
	memset(op, 0, sizeof(*op));
}

void sbx_batch_free(struct sbx_batch *b)
{
	if (!b)
		return;
	for (size_t i = 0; i < b->n; i++)
		sbx_batch_op_fini(&b->ops[i]);
	free(b->ops);
	free(b);
}

int sbx_batch_decode(const char *body, size_t len, struct sbx_batch **out)
{
	const cJSON *ops, *stop, *item;
	struct sbx_batch *b;
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
		sbx_batch_op_decode(&b->ops[i], item, i);
		i++;
	}
	cJSON_Delete(doc);
	*out = b;
	return 0;
}

/* ---- encoding ---------------------------------------------------------------- */

static void put_num(cJSON *o, const char *key, double v)
{
	if (!cJSON_AddNumberToObject(o, key, v))
		abort();
}

static void put_bool(cJSON *o, const char *key, bool v)
{
	if (!cJSON_AddBoolToObject(o, key, v))
		abort();
}

static void put_b64(cJSON *o, const char *key, const void *data, size_t len)
{
	char *b = sbx_proto_base64_encode(data, len);

	sbx_json_set_str(o, key, b);
	free(b);
}

static void put_owner(cJSON *o, const struct sbx_batch_op *op)
{
	if (op->has_uid)
		put_num(o, "uid", op->uid);
	if (op->has_gid)
		put_num(o, "gid", op->gid);
}

/* An inode number the path must still name, as a decimal string; none
 * for 0. */
static void put_ino(cJSON *o, uint64_t ino)
{
	cJSON *v;

	if (!ino)
		return;
	v = sbx_proto_u64_to_json(ino);
	if (!v)
		abort();
	cJSON_AddItemToObject(o, "ino", v);
}

static void put_time(cJSON *o, const char *key, int set, long long s,
		     long long ns)
{
	cJSON *a;

	if (set == SBX_BATCH_TIME_NOW) {
		sbx_json_set_str(o, key, "now");
		return;
	}
	if (set != SBX_BATCH_TIME_SET)
		return;
	a = cJSON_CreateArray();
	if (!a)
		abort();
	cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s));
	cJSON_AddItemToArray(a, cJSON_CreateNumber((double)ns));
	sbx_json_set_take(o, key, a);
}

/* flags of rename and setxattr: a name, or 0. */
static void put_flags(cJSON *o, const struct sbx_batch_op *op)
{
	const char *name = NULL;

	if (op->kind == SBX_BATCH_RENAME)
		name = (op->flags & RENAME_EXCHANGE)	 ? "exchange"
		       : (op->flags & RENAME_NOREPLACE) ? "noreplace"
							: NULL;
	else
		name = (op->flags & XATTR_CREATE)    ? "create"
		       : (op->flags & XATTR_REPLACE) ? "replace"
						     : NULL;
	if (name)
		sbx_json_set_str(o, "flags", name);
	else
		put_num(o, "flags", 0);
}

cJSON *sbx_batch_op_encode(const struct sbx_batch_op *op)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		abort();
	sbx_json_set_str(o, "op", sbx_batch_kind_name(op->kind));
	if (op->kind != SBX_BATCH_STATFS) {
		const char *p = op->path ? op->path : "";

		if (op->dir_slash && *p) {
			char *slashed = sbx_xasprintf("%s/", p);

			sbx_json_set_str(o, "path", slashed);
			free(slashed);
		} else {
			sbx_json_set_str(o, "path", p);
		}
	}
	switch (op->kind) {
	case SBX_BATCH_MKDIR:
	case SBX_BATCH_CREATE:
	case SBX_BATCH_MKNOD:
		if (op->has_mode || op->kind == SBX_BATCH_MKNOD)
			put_num(o, "mode", op->mode);
		if (op->kind == SBX_BATCH_MKNOD)
			put_num(o, "rdev", (double)op->rdev);
		if (op->kind == SBX_BATCH_CREATE) {
			put_bool(o, "excl", op->excl);
			put_bool(o, "truncate", op->truncate);
		}
		put_owner(o, op);
		break;
	case SBX_BATCH_SYMLINK:
		sbx_json_set_str(o, "target", op->target ? op->target : "");
		put_owner(o, op);
		break;
	case SBX_BATCH_LINK:
		sbx_json_set_str(o, "newpath", op->newpath ? op->newpath : "");
		break;
	case SBX_BATCH_RENAME:
		sbx_json_set_str(o, "newpath", op->newpath ? op->newpath : "");
		put_flags(o, op);
		break;
	case SBX_BATCH_SETATTR:
		if (op->has_mode)
			put_num(o, "mode", op->mode);
		put_owner(o, op);
		if (op->has_size)
			put_num(o, "size", (double)op->size);
		put_time(o, "atime", op->atime_set, op->atime_s, op->atime_ns);
		put_time(o, "mtime", op->mtime_set, op->mtime_s, op->mtime_ns);
		put_ino(o, op->ino);
		break;
	case SBX_BATCH_WRITE:
		put_num(o, "offset", (double)op->offset);
		if (op->append)
			put_bool(o, "append", true);
		put_ino(o, op->ino);
		put_b64(o, "data", op->data, op->data_len);
		break;
	case SBX_BATCH_READ:
		put_num(o, "offset", (double)op->offset);
		put_num(o, "length", (double)op->length);
		break;
	case SBX_BATCH_FSYNC:
		put_bool(o, "datasync", op->datasync);
		break;
	case SBX_BATCH_LSEEK:
		put_num(o, "offset", (double)op->offset);
		sbx_json_set_str(o, "whence",
				 op->whence == SEEK_HOLE ? "hole" : "data");
		break;
	case SBX_BATCH_FALLOCATE:
		put_num(o, "mode", op->fmode);
		put_num(o, "offset", (double)op->offset);
		put_num(o, "length", (double)op->length);
		break;
	case SBX_BATCH_GETXATTR:
	case SBX_BATCH_REMOVEXATTR:
		sbx_json_set_str(o, "name", op->name ? op->name : "");
		break;
	case SBX_BATCH_SETXATTR:
		sbx_json_set_str(o, "name", op->name ? op->name : "");
		put_b64(o, "value", op->data, op->data_len);
		put_flags(o, op);
		break;
	default:
		break;
	}
	return o;
}

cJSON *sbx_batch_encode(const struct sbx_batch_op *ops, size_t n,
			bool stop_on_error)
{
	cJSON *doc = cJSON_CreateObject(), *arr = cJSON_CreateArray();

	if (!doc || !arr)
		abort();
	for (size_t i = 0; i < n; i++)
		cJSON_AddItemToArray(arr, sbx_batch_op_encode(&ops[i]));
	cJSON_AddItemToObject(doc, "ops", arr);
	if (stop_on_error)
		put_bool(doc, "stop_on_error", true);
	return doc;
}

int sbx_batch_result_take(cJSON *answer, size_t n, size_t i,
			  const char *context, cJSON **out)
{
	cJSON *results = cJSON_GetObjectItemCaseSensitive(answer, "results");
	cJSON *r;
	int rc;

	*out = NULL;
	if (!cJSON_IsArray(results) ||
	    (size_t)cJSON_GetArraySize(results) != n || i >= n)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "/v1/fs/batch (%s): expected %zu "
				     "result%s", context, n, n == 1 ? "" : "s");
	if (!cJSON_IsObject(cJSON_GetArrayItem(results, (int)i)))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "/v1/fs/batch (%s): result %zu is not "
				     "an object", context, i);
	/*
	 * A null takes its place, so the others keep their indices and a
	 * second take of the same result is refused as not an object.  (A
	 * copy: cJSON 1.7.15 cannot insert where an item was detached.)
	 */
	r = cJSON_Duplicate(cJSON_GetArrayItem(results, (int)i), true);
	if (!r || !cJSON_ReplaceItemInArray(results, (int)i,
					    cJSON_CreateNull())) {
		fputs("sbx: out of memory (cJSON)\n", stderr);
		abort();
	}
	rc = sbx_proto_error_from_json(r, context);
	if (rc < 0) {
		cJSON_Delete(r);
		return rc;
	}
	*out = r;
	return 0;
}
