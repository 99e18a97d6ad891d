/*
 * Remote data plane, directories, xattrs and bulk reads: one GET
 * /v1/fs/list per listing, xattrs as batch ops, and GET /v1/fs/bulk's
 * frames (sbx/proto_bulk.h) assembled into whole directories; POST
 * /v1/fs/bulk for the content of listed files (look-ahead prefetch).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/proto_batch.h"
#include "sbx/proto_bulk.h"
#include "sbx/xmalloc.h"

#include "premote_fs_i.h"

/* ---- directories ---------------------------------------------------------- */

int premote_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct sbx_file **out)
{
	struct premote_file *f =
		premote_file_new(RSB(sb), RNODE(node), O_RDONLY);

	f->is_dir = true;
	*out = (struct sbx_file *)f;
	return 0;
}

/* One GET /v1/fs/list for the whole listing, with every entry's stat. */
static int fetch_listing(struct premote_sandbox *s, struct premote_file *d)
{
	char *path = premote_npath(s, (struct sbx_node *)d->node);
	const cJSON *ents, *e;
	cJSON *j = NULL;
	size_t i = 0;
	int rc;

	rc = premote_get_json(s, "/v1/fs/list", path, &j);
	if (rc < 0)
		goto out;
	ents = cJSON_GetObjectItemCaseSensitive(j, "entries");
	if (!cJSON_IsArray(ents)) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EIO,
				   "list %s: no \"entries\" in the answer",
				   path);
		goto out;
	}
	cJSON_Delete(d->listing);
	free(d->entries);
	d->listing = j;
	d->nentries = (size_t)cJSON_GetArraySize(ents);
	d->entries = sbx_xcalloc(d->nentries + 1, sizeof(*d->entries));
	cJSON_ArrayForEach(e, ents)
	{
		if (i < d->nentries)
			d->entries[i++] = e;
	}
	d->nentries = i;
	j = NULL;
	d->fetched = true;
	d->served = false;
	/*
	 * "." carries the listed directory's own attributes when the agent
	 * sends them (since 2026-12-08): taken from the descriptor it read,
	 * they say which directory these entries are of, which a caller
	 * that knows the directory by inode number checks (a rename in the
	 * sandbox may have put another directory at the path).  Older
	 * agents: the number last known for the node.
	 */
	memset(&d->dot, 0, sizeof(d->dot));
	if (sbx_proto_stat_from_json(cJSON_GetObjectItemCaseSensitive(
					     d->listing, "st"),
				     &d->dot) == 0) {
		premote_fix_stat(s, &d->dot);
	} else {
		sbx_error_clear();
		memset(&d->dot, 0, sizeof(d->dot));
		d->dot.st_mode = S_IFDIR;
		d->dot.st_ino = d->node == &s->root ? s->root.ino
						    : d->node->ino;
	}
out:
	cJSON_Delete(j);
	free(path);
	return rc;
}

int premote_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		    unsigned flags, sbx_dirent_cb cb, void *payload)
{
	struct premote_sandbox *s = RSB(sb);
	struct premote_file *d = RFILE(dh);
	bool plus = flags & SBX_READDIR_PLUS;
	char *dir = NULL;
	int rc = 0;

	pthread_mutex_lock(&d->lock);
	/* A rewind after entries were served sees a fresh listing. */
	if (!d->fetched || (off == 0 && d->served)) {
		rc = fetch_listing(s, d);
		if (rc < 0)
			goto out;
	}
	dir = premote_npath(s, (struct sbx_node *)d->node);
	/* Cookies: 1 ".", 2 "..", 3 + i the i-th entry. */
	for (off_t c = off; c < (off_t)d->nentries + 2; c++) {
		struct sbx_node *node = NULL;
		struct stat st;
		const char *name;
		char *path;

		if (c < 2) {
			memset(&st, 0, sizeof(st));
			st.st_mode = S_IFDIR;
			st.st_ino = 1;
			if (c == 0)
				st = d->dot;
			if (cb(c == 0 ? "." : "..", &st, NULL, c + 1,
			       payload) != 0)
				break;
			d->served = true;
			continue;
		}
		const cJSON *e = d->entries[c - 2];

		if (sbx_proto_entry_decode(e, &name, &st) < 0) {
			rc = sbx_error_set(SBX_ERR_PROTO, -EIO,
					   "list %s: malformed entry %lld",
					   dir, (long long)(c - 2));
			break;
		}
		premote_fix_stat(s, &st);
		if (plus) {
			path = sbx_proto_path_join(dir, name);
			node = (struct sbx_node *)premote_node_get(s, path,
								   &st);
			free(path);
		}
		if (cb(name, &st, node, c + 1, payload) != 0) {
			premote_node_put(s, RNODE(node));
			break;
		}
		d->served = true;
	}
out:
	pthread_mutex_unlock(&d->lock);
	free(dir);
	return rc;
}

int premote_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh, bool datasync)
{
	return premote_fsync_path(RSB(sb), RFILE(dh)->node, datasync);
}

int premote_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	premote_file_free(RSB(sb), RFILE(dh));
	return 0;
}

int premote_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		   struct statvfs *out)
{
	cJSON *j = NULL;
	int rc = premote_get_json(RSB(sb), "/v1/fs/statfs", NULL, &j);

	if (rc == 0)
		rc = premote_fs_errno(sbx_proto_statvfs_from_json(j, out));
	cJSON_Delete(j);
	return rc;
}

/* ---- xattrs --------------------------------------------------------------- */

ssize_t premote_getxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			 const char *name, void *buf, size_t size)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = premote_npath(s, node);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_GETXATTR, .path = path, .name = (char *)name,
	};
	cJSON *r = NULL;
	const char *v;
	unsigned char *val = NULL;
	size_t len = 0;
	ssize_t rc;

	rc = premote_batch1(s, &op, &r);
	if (rc < 0)
		goto out;
	v = sbx_json_str(r, "value");
	if (!v || sbx_proto_base64_decode(v, &val, &len) < 0) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EIO,
				   "getxattr %s %s: bad \"value\"", path, name);
		goto out;
	}
	if (size == 0) {
		rc = (ssize_t)len;
	} else if (len > size) {
		rc = sbx_error_set(SBX_ERR_OS, -ERANGE,
				   "getxattr %s: value larger than %zu bytes",
				   name, size);
	} else {
		memcpy(buf, val, len);
		rc = (ssize_t)len;
	}
out:
	free(val);
	cJSON_Delete(r);
	free(path);
	return rc;
}

ssize_t premote_listxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			  char *buf, size_t size)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = premote_npath(s, node);
	cJSON *r = NULL;
	const cJSON *names, *n;
	size_t need = 0;
	ssize_t rc;

	struct sbx_batch_op op = { .kind = SBX_BATCH_LISTXATTR, .path = path };

	rc = premote_batch1(s, &op, &r);
	if (rc < 0)
		goto out;
	names = cJSON_GetObjectItemCaseSensitive(r, "names");
	cJSON_ArrayForEach(n, names)
	{
		if (cJSON_IsString(n))
			need += strlen(n->valuestring) + 1;
	}
	if (size == 0) {
		rc = (ssize_t)need;
		goto out;
	}
	if (need > size) {
		rc = sbx_error_set(SBX_ERR_OS, -ERANGE,
				   "listxattr %s: list larger than %zu bytes",
				   path, size);
		goto out;
	}
	need = 0;
	cJSON_ArrayForEach(n, names)
	{
		if (!cJSON_IsString(n))
			continue;
		size_t l = strlen(n->valuestring) + 1;

		memcpy(buf + need, n->valuestring, l);
		need += l;
	}
	rc = (ssize_t)need;
out:
	cJSON_Delete(r);
	free(path);
	return rc;
}

int premote_setxattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     const char *name, const void *value, size_t size,
		     int flags)
{
	struct premote_sandbox *s = RSB(sb);
	/* The encoder only reads the op: name and value are not copied. */
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_SETXATTR, .path = premote_npath(s, node),
		.name = (char *)name, .data = (unsigned char *)value,
		.data_len = size,
		.flags = (flags & XATTR_CREATE)	   ? XATTR_CREATE
			 : (flags & XATTR_REPLACE) ? XATTR_REPLACE
						   : 0,
	};
	int rc = premote_batch1(s, &op, NULL);

	free(op.path);
	return rc;
}

int premote_removexattr(struct sbx_sandbox *sb, struct sbx_node *node,
			const char *name)
{
	struct premote_sandbox *s = RSB(sb);
	struct sbx_batch_op op = {
		.kind = SBX_BATCH_REMOVEXATTR, .path = premote_npath(s, node),
		.name = (char *)name,
	};
	int rc = premote_batch1(s, &op, NULL);

	free(op.path);
	return rc;
}

/* ---- bulk ----------------------------------------------------------------- */

/*
 * The agent may split a large directory over several DIR frames (the
 * first with "more", the next with "continued"); the caller gets it
 * whole, as sbx_bulk_item promises.
 */
struct bulk_ctx {
	struct premote_sandbox *s;
	sbx_bulk_cb cb;
	void *payload;
	int cb_rc;
	const char *start;        /* the walk's start (cleaned) */
	bool start_only;          /* depth 0: the start directory alone */
	/* a directory being assembled */
	char *dpath;
	struct stat dst;
	struct sbx_bulk_entry *ents;
	size_t n, cap;
};

static void pending_clear(struct bulk_ctx *b)
{
	for (size_t i = 0; i < b->n; i++)
		free((char *)b->ents[i].name);
	free(b->ents);
	free(b->dpath);
	b->ents = NULL;
	b->dpath = NULL;
	b->n = b->cap = 0;
}

static int bulk_deliver(struct bulk_ctx *b, const struct sbx_bulk_item *it)
{
	int rc = b->cb(it, b->payload);

	if (rc)
		b->cb_rc = rc;
	return rc;
}

static int bulk_dir(struct bulk_ctx *b, const struct sbx_bulk_frame *f)
{
	const char *dir = f->path;
	struct sbx_bulk_item it;
	const cJSON *e;
	int rc;

	if (b->start_only && strcmp(dir, b->start))
		return 1; /* past the start directory: enough */
	if (f->continued != (b->dpath != NULL) ||
	    (f->continued && strcmp(dir, b->dpath)))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: a continued directory does "
				     "not follow its start", dir);
	if (!f->continued) {
		b->dpath = sbx_xstrdup(dir);
		b->dst = f->st;
		premote_fix_stat(b->s, &b->dst);
	}
	cJSON_ArrayForEach(e, f->entries)
	{
		const char *name;
		struct stat st;

		if (sbx_proto_entry_decode(e, &name, &st) < 0)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "bulk %s: malformed entry", dir);
		premote_fix_stat(b->s, &st);
		if (b->n == b->cap) {
			b->cap = b->cap ? b->cap * 2 : 64;
			b->ents = sbx_xrealloc(b->ents,
					       b->cap * sizeof(*b->ents));
		}
		b->ents[b->n].name = sbx_xstrdup(name);
		b->ents[b->n].st = st;
		b->n++;
	}
	if (f->more)
		return 0;
	memset(&it, 0, sizeof(it));
	it.kind = SBX_BULK_DIR;
	it.path = b->dpath;
	it.st = b->dst;
	it.entries = b->ents;
	it.nentries = b->n;
	rc = bulk_deliver(b, &it);
	pending_clear(b);
	return rc;
}

static int bulk_frame(const cJSON *hdr, const void *data, size_t len,
		      void *payload)
{
	struct bulk_ctx *b = payload;
	struct sbx_bulk_frame f;
	struct sbx_bulk_item it;
	int rc = sbx_bulk_frame_decode(hdr, len, &f);

	if (rc < 0)
		return rc;
	switch (f.kind) {
	case SBX_BULK_FRAME_DIR:
		return bulk_dir(b, &f);
	case SBX_BULK_FRAME_DIR_ERROR:
		if (b->start_only && strcmp(f.path, b->start))
			return 1; /* past the start directory: enough */
		if (b->dpath)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "bulk %s: an error inside an "
					     "unfinished directory listing",
					     f.path);
		if (!strcmp(f.path, b->start))
			/* Nothing to walk: the start's own error. */
			return sbx_error_set(SBX_ERR_REMOTE, f.error,
					     "bulk %s: %s", f.path,
					     f.message ? f.message : "error");
		/* A subdirectory that cannot be read (docs/protocol.md): the
		 * walk goes on without it.  It is simply not delivered, so
		 * nobody takes it for empty, and listing it later answers its
		 * own error. */
		return 0;
	case SBX_BULK_FRAME_FILE:
		break;
	default:
		return 0; /* {"end":...} and records we do not know */
	}
	if (b->dpath)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: a file inside an unfinished "
				     "directory listing", f.path);
	memset(&it, 0, sizeof(it));
	it.st = f.st;
	premote_fix_stat(b->s, &it.st);
	it.kind = SBX_BULK_FILE;
	it.path = f.path;
	it.data = data ? data : "";
	it.len = len;
	return bulk_deliver(b, &it);
}

/* POST /v1/fs/bulk: the content of o->files, as file frames. */
static int bulk_files(struct premote_sandbox *s, const struct sbx_bulk_opts *o,
		      sbx_bulk_cb cb, void *payload)
{
	struct bulk_ctx b = { .s = s, .cb = cb, .payload = payload,
			      .start = "" };
	struct premote_req r = {
		.method = "POST", .route = "/v1/fs/bulk", .idempotent = true,
		.cancel_fd = -1, .timeout_ms = -1, .frames = bulk_frame,
		.payload = &b, .content_type = SBX_CT_JSON,
	};
	struct premote_resp resp;
	cJSON *j, *arr;
	char *body;
	int rc;

	if (!s->info.cap_bulk_files)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "the agent at %s cannot send listed "
				     "files in bulk", s->cfg.url);
	j = cJSON_CreateObject();
	arr = cJSON_AddArrayToObject(j, "files");
	if (!j || !arr)
		abort();
	for (size_t i = 0; i < o->nfiles; i++)
		cJSON_AddItemToArray(arr, cJSON_CreateString(o->files[i]));
	if (o->max_file)
		cJSON_AddNumberToObject(j, "max_file", (double)o->max_file);
	if (o->max_total)
		cJSON_AddNumberToObject(j, "max_total", (double)o->max_total);
	body = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!body)
		abort();
	r.body = body;
	r.body_len = strlen(body);
	r.low_speed_s = (premote_http_timeout_ms(s->http) + 999) / 1000;
	premote_resp_init(&resp);
	rc = premote_http_do(s->http, &r, &resp);
	premote_resp_fini(&resp);
	cJSON_free(body);
	pending_clear(&b);
	if (rc > 0 || (b.cb_rc && rc == b.cb_rc))
		return rc > 0 ? 0 : rc; /* stopped on purpose */
	return premote_fs_errno(rc);
}

int premote_bulk(struct sbx_sandbox *sb, const char *dir,
		 const struct sbx_bulk_opts *o, sbx_bulk_cb cb, void *payload)
{
	struct premote_sandbox *s = RSB(sb);
	struct bulk_ctx b = { .s = s, .cb = cb, .payload = payload };
	struct premote_req r = {
		.method = "GET", .route = "/v1/fs/bulk", .idempotent = true,
		.cancel_fd = -1, .timeout_ms = -1, .frames = bulk_frame,
		.payload = &b,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	char *start = NULL;
	int rc;

	if (o && o->nfiles)
		return bulk_files(s, o, cb, payload);
	if (!s->info.cap_bulk)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "the agent at %s has no bulk capability",
				     s->cfg.url);
	rc = sbx_proto_path_clean(dir, &start);
	if (rc < 0)
		return rc;
	b.start = start;
	r.low_speed_s = (premote_http_timeout_ms(s->http) + 999) / 1000;
	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", start);
	if (o && o->max_file)
		premote_q_u64(&q, "max_file", o->max_file);
	if (o && o->max_total)
		premote_q_u64(&q, "max_total", o->max_total);
	/* The agent counts levels below the start, 0 meaning unlimited:
	 * depth 0 (the start alone) is cut short here instead. */
	if (o && o->depth > 0)
		premote_q_u64(&q, "depth", (uint64_t)o->depth);
	b.start_only = o && o->depth == 0;
	r.query = sbx_buf_ptr(&q);
	premote_resp_init(&resp);
	rc = premote_http_do(s->http, &r, &resp);
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	pending_clear(&b);
	free(start);
	if (rc > 0 || (b.cb_rc && rc == b.cb_rc))
		return rc > 0 ? 0 : rc; /* stopped on purpose */
	return premote_fs_errno(rc);
}
