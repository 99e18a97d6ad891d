/*
 * Remote data plane: every operation of struct sbx_sandbox_ops over the
 * agent's HTTP API (docs/protocol.md).  No caching here: fs/cache.c wraps
 * this table and keeps what it can; every call below is one round trip
 * (two where one FUSE operation needs two, e.g. rename of a node we must
 * re-stat).
 *
 * Nodes: see premote_i.h.  Two hash tables over the tracked nodes, one by
 * reported ino (so a remote file has one node and its path can follow
 * renames) and one by path (so the change stream's paths resolve to the
 * inode numbers the daemon knows).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/xmalloc.h"

#include "premote_i.h"

#define RSB(sb) PREMOTE_SB(sb)
#define RNODE(n) ((struct premote_node *)(n))

/* An open file: a reference on its node (so renames follow it). */
struct premote_file {
	struct premote_node *node;
	int flags;
	/* directories: the listing fetched at the first readdir */
	pthread_mutex_t lock;
	bool is_dir;
	bool fetched, served;
	cJSON *listing;          /* the answer ({"entries": [...]}) */
	const cJSON **entries;   /* borrowed from listing */
	size_t nentries;
	struct stat dot;         /* attributes of the directory itself */
};

#define RFILE(f) ((struct premote_file *)(f))

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

/* ---- identities ----------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

void premote_fix_stat(const struct premote_sandbox *s, struct stat *st)
{
	uint64_t rdev = (uint64_t)st->st_dev, ino = (uint64_t)st->st_ino;

	/* Another filesystem below the root (a mount inside the sandbox):
	 * keep inode numbers apart from the root filesystem's. */
	if (rdev != s->root_rdev)
		ino = (ino ^ mix64(rdev)) | (1ull << 63);
	st->st_ino = (ino_t)ino;
	st->st_dev = s->dev;
	if (!st->st_blksize)
		st->st_blksize = 4096;
}

/* ---- node table ----------------------------------------------------------- */

static size_t hash_ino(uint64_t ino, size_t n)
{
	return (size_t)(mix64(ino) & (n - 1));
}

static size_t hash_path(const char *p, size_t n)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	return (size_t)(mix64(h) & (n - 1));
}

/* Caller holds nodes_lock. */
static void path_unlink_locked(struct premote_sandbox *s,
			       struct premote_node *n)
{
	struct premote_node **pp = &s->by_path[hash_path(n->path,
							 s->nbuckets)];

	while (*pp && *pp != n)
		pp = &(*pp)->path_next;
	if (*pp)
		*pp = n->path_next;
	n->path_next = NULL;
}

/* Caller holds nodes_lock.  Newest first: a path lookup finds it. */
static void path_link_locked(struct premote_sandbox *s, struct premote_node *n)
{
	size_t h = hash_path(n->path, s->nbuckets);

	n->path_next = s->by_path[h];
	s->by_path[h] = n;
}

static void grow_locked(struct premote_sandbox *s)
{
	size_t nb = s->nbuckets * 2;
	struct premote_node **bi = sbx_xcalloc(nb, sizeof(*bi));
	struct premote_node **bp = sbx_xcalloc(nb, sizeof(*bp));

	for (size_t i = 0; i < s->nbuckets; i++) {
		struct premote_node *n, *next;

		for (n = s->by_ino[i]; n; n = next) {
			size_t h = hash_ino(n->ino, nb);

			next = n->ino_next;
			n->ino_next = bi[h];
			bi[h] = n;
		}
		for (n = s->by_path[i]; n; n = next) {
			size_t h = hash_path(n->path, nb);

			next = n->path_next;
			n->path_next = bp[h];
			bp[h] = n;
		}
	}
	free(s->by_ino);
	free(s->by_path);
	s->by_ino = bi;
	s->by_path = bp;
	s->nbuckets = nb;
}

static bool under(const char *path, const char *prefix, size_t pl)
{
	return !strncmp(path, prefix, pl) &&
	       (path[pl] == '\0' || path[pl] == '/' || pl == 0);
}

/*
 * Every tracked node at or below `from` now lives below `to` (and, with
 * `swap`, the other way round too).  O(nodes); renames are rare next to
 * lookups.  Caller holds nodes_lock.
 */
static void move_locked(struct premote_sandbox *s, const char *from,
			const char *to, bool swap)
{
	size_t fl = strlen(from), tl = strlen(to);
	struct premote_node **moved = NULL;
	size_t nmoved = 0, cap = 0;

	if (!fl || !tl)
		return; /* the root never moves */
	for (size_t i = 0; i < s->nbuckets; i++) {
		for (struct premote_node *n = s->by_path[i]; n;
		     n = n->path_next) {
			if (!under(n->path, from, fl) &&
			    !(swap && under(n->path, to, tl)))
				continue;
			if (nmoved == cap) {
				cap = cap ? cap * 2 : 16;
				moved = sbx_xrealloc(moved,
						     cap * sizeof(*moved));
			}
			moved[nmoved++] = n;
		}
	}
	for (size_t i = 0; i < nmoved; i++) {
		struct premote_node *n = moved[i];
		char *np;

		path_unlink_locked(s, n);
		if (under(n->path, from, fl))
			np = sbx_xasprintf("%s%s", to, n->path + fl);
		else
			np = sbx_xasprintf("%s%s", from, n->path + tl);
		free(n->path);
		n->path = np;
		path_link_locked(s, n);
	}
	free(moved);
}

/*
 * A tracked node for the object with (fixed) attributes `st` found at
 * `path`: the known one (path updated) or a new one.  One reference.
 */
static struct premote_node *node_get(struct premote_sandbox *s,
				     const char *path, const struct stat *st)
{
	uint64_t ino = (uint64_t)st->st_ino;
	struct premote_node *n;

	if (ino == s->root.ino) {
		/* The root under another name (a bind mount, "."): the root. */
		return &s->root;
	}
	pthread_mutex_lock(&s->nodes_lock);
	for (n = s->by_ino[hash_ino(ino, s->nbuckets)]; n; n = n->ino_next)
		if (n->ino == ino)
			break;
	if (n) {
		n->refs++;
		if (strcmp(n->path, path)) {
			if (n->dir) {
				char *old = sbx_xstrdup(n->path);

				/* Renamed behind our back: its subtree too. */
				move_locked(s, old, path, false);
				free(old);
			} else {
				/* A hard link, or a file renamed: last seen. */
				path_unlink_locked(s, n);
				free(n->path);
				n->path = sbx_xstrdup(path);
				path_link_locked(s, n);
			}
		}
		n->dir = S_ISDIR(st->st_mode);
		pthread_mutex_unlock(&s->nodes_lock);
		return n;
	}
	n = sbx_xcalloc(1, sizeof(*n));
	n->path = sbx_xstrdup(path);
	n->ino = ino;
	n->dir = S_ISDIR(st->st_mode);
	n->hashed = true;
	n->refs = 1;
	if (s->count * 2 >= s->nbuckets)
		grow_locked(s);
	size_t h = hash_ino(ino, s->nbuckets);

	n->ino_next = s->by_ino[h];
	s->by_ino[h] = n;
	path_link_locked(s, n);
	s->count++;
	pthread_mutex_unlock(&s->nodes_lock);
	return n;
}

static void node_put(struct premote_sandbox *s, struct premote_node *n)
{
	bool gone = false;

	if (!n || n == &s->root)
		return;
	pthread_mutex_lock(&s->nodes_lock);
	if (--n->refs == 0) {
		gone = true;
		if (n->hashed) {
			struct premote_node **pp =
				&s->by_ino[hash_ino(n->ino, s->nbuckets)];

			while (*pp != n)
				pp = &(*pp)->ino_next;
			*pp = n->ino_next;
			path_unlink_locked(s, n);
			s->count--;
		}
	}
	pthread_mutex_unlock(&s->nodes_lock);
	if (gone) {
		free(n->path);
		free(n);
	}
}

static void node_ref(struct premote_sandbox *s, struct premote_node *n)
{
	if (n == &s->root)
		return;
	pthread_mutex_lock(&s->nodes_lock);
	n->refs++;
	pthread_mutex_unlock(&s->nodes_lock);
}

/* The node's current path (malloc'd). */
static char *npath(struct premote_sandbox *s, struct sbx_node *node)
{
	struct premote_node *n = RNODE(node);
	char *p;

	if (n == &s->root)
		return sbx_xstrdup("");
	pthread_mutex_lock(&s->nodes_lock);
	p = sbx_xstrdup(n->path);
	pthread_mutex_unlock(&s->nodes_lock);
	return p;
}

/* The path of `name` in directory `parent` (malloc'd). */
static char *cpath(struct premote_sandbox *s, struct sbx_node *parent,
		   const char *name)
{
	char *dir = npath(s, parent), *p;

	if (!strcmp(name, ".")) {
		return dir;
	} else if (!strcmp(name, "..")) {
		char *slash = strrchr(dir, '/');

		if (slash)
			*slash = '\0';
		else
			dir[0] = '\0'; /* ".." of the root is the root */
		return dir;
	}
	p = sbx_proto_path_join(dir, name);
	free(dir);
	return p;
}

uint64_t premote_ino_at(struct premote_sandbox *s, const char *path)
{
	uint64_t ino = 0;

	if (!*path)
		return s->root.ino;
	pthread_mutex_lock(&s->nodes_lock);
	for (struct premote_node *n = s->by_path[hash_path(path, s->nbuckets)];
	     n; n = n->path_next) {
		if (!strcmp(n->path, path)) {
			ino = n->ino;
			break;
		}
	}
	pthread_mutex_unlock(&s->nodes_lock);
	return ino;
}

void premote_note_exec_seq(struct premote_sandbox *s, uint64_t seq)
{
	pthread_mutex_lock(&s->seq_lock);
	if (!s->exec_seq_set || seq > s->exec_seq)
		s->exec_seq = seq;
	s->exec_seq_set = true;
	pthread_mutex_unlock(&s->seq_lock);
}

/* ---- request helpers ------------------------------------------------------ */

/* A decoded, fixed stat from member `key` of `j`. */
static int get_st(struct premote_sandbox *s, const cJSON *j, const char *key,
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
static int get_json(struct premote_sandbox *s, const char *route,
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
	int rc = get_json(s, "/v1/fs/stat", path, &j);

	if (rc == 0)
		rc = premote_fs_errno(get_st(s, j, "st", st));
	cJSON_Delete(j);
	return rc;
}

/*
 * Run one batch op (taken).  On success *res (may be NULL) is its result
 * object, detached (caller deletes).  An op's own error comes back as its
 * errno with the agent's message.
 */
static int batch1(struct premote_sandbox *s, cJSON *op, cJSON **res)
{
	cJSON *req = cJSON_CreateObject(), *ops = cJSON_CreateArray();
	cJSON *ans = NULL, *r;
	const cJSON *results;
	char ctx[300];
	int rc;

	if (res)
		*res = NULL;
	if (!req || !ops)
		abort();
	snprintf(ctx, sizeof(ctx), "%s %s",
		 sbx_json_str(op, "op") ? sbx_json_str(op, "op") : "op",
		 sbx_json_str(op, "path") ? sbx_json_str(op, "path") : "");
	cJSON_AddItemToArray(ops, op);
	cJSON_AddItemToObject(req, "ops", ops);
	rc = premote_http_json(s->http, "POST", "/v1/fs/batch", NULL, req,
			       false, &ans);
	if (rc < 0)
		goto out;
	results = cJSON_GetObjectItemCaseSensitive(ans, "results");
	if (!cJSON_IsArray(results) || cJSON_GetArraySize(results) != 1 ||
	    !cJSON_IsObject(cJSON_GetArrayItem(results, 0))) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "/v1/fs/batch (%s): expected one result",
				   ctx);
		goto out;
	}
	r = cJSON_DetachItemFromArray((cJSON *)results, 0);
	rc = sbx_proto_error_from_json(r, ctx);
	if (rc < 0) {
		cJSON_Delete(r);
		goto out;
	}
	if (res)
		*res = r;
	else
		cJSON_Delete(r);
out:
	cJSON_Delete(ans);
	cJSON_Delete(req);
	return premote_fs_errno(rc);
}

static cJSON *new_op(const char *op, const char *path)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		abort();
	sbx_json_set_str(o, "op", op);
	if (path)
		sbx_json_set_str(o, "path", path);
	return o;
}

static void op_num(cJSON *o, const char *key, double v)
{
	if (!cJSON_AddNumberToObject(o, key, v))
		abort();
}

static void op_bool(cJSON *o, const char *key, bool v)
{
	if (!cJSON_AddBoolToObject(o, key, v))
		abort();
}

/* Run an entry-creating op and hand out the node for `path`. */
static int batch_entry(struct premote_sandbox *s, cJSON *op, const char *path,
		       struct sbx_node **out, struct stat *st)
{
	cJSON *r = NULL;
	int rc = batch1(s, op, &r);

	if (rc == 0) {
		if (cJSON_GetObjectItemCaseSensitive(r, "st"))
			rc = premote_fs_errno(get_st(s, r, "st", st));
		else
			rc = stat_path(s, path, st);
	}
	cJSON_Delete(r);
	if (rc == 0)
		*out = (struct sbx_node *)node_get(s, path, st);
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
	char *path = cpath(s, parent, name);
	int rc;

	*out = NULL;
	rc = stat_path(s, path, st);
	if (rc == 0)
		*out = (struct sbx_node *)node_get(s, path, st);
	free(path);
	return rc;
}

static void r_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	node_put(RSB(sb), RNODE(node));
}

static int r_node_at(struct sbx_sandbox *sb, const char *path,
		     struct sbx_node **out)
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
		free(clean);
		*out = (struct sbx_node *)&s->root;
		return 0;
	}
	n = sbx_xcalloc(1, sizeof(*n));
	n->path = clean;
	n->refs = 1;
	*out = (struct sbx_node *)n;
	return 0;
}

static int r_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node);
	int rc = stat_path(s, path, st);

	free(path);
	return rc;
}

static cJSON *time_json(bool now, const struct timespec *ts)
{
	cJSON *a;

	if (now)
		return cJSON_CreateString("now");
	a = cJSON_CreateArray();
	if (!a)
		abort();
	cJSON_AddItemToArray(a, cJSON_CreateNumber((double)ts->tv_sec));
	cJSON_AddItemToArray(a, cJSON_CreateNumber((double)ts->tv_nsec));
	return a;
}

static int r_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node);
	cJSON *op = new_op("setattr", path), *r = NULL;
	int rc;

	if (valid & SBX_SET_MODE)
		op_num(op, "mode", in->st_mode & 07777);
	if (valid & SBX_SET_UID)
		op_num(op, "uid", in->st_uid);
	if (valid & SBX_SET_GID)
		op_num(op, "gid", in->st_gid);
	if (valid & SBX_SET_SIZE)
		op_num(op, "size", (double)in->st_size);
	if (valid & (SBX_SET_ATIME | SBX_SET_ATIME_NOW))
		sbx_json_set_take(op, "atime",
				  time_json(valid & SBX_SET_ATIME_NOW,
					    &in->st_atim));
	if (valid & (SBX_SET_MTIME | SBX_SET_MTIME_NOW))
		sbx_json_set_take(op, "mtime",
				  time_json(valid & SBX_SET_MTIME_NOW,
					    &in->st_mtim));
	rc = batch1(s, op, &r);
	if (rc == 0) {
		if (cJSON_GetObjectItemCaseSensitive(r, "st"))
			rc = premote_fs_errno(get_st(s, r, "st", out));
		else
			rc = stat_path(s, path, out);
	}
	cJSON_Delete(r);
	free(path);
	return rc;
}

static int r_readlink(struct sbx_sandbox *sb, struct sbx_node *node,
		      char *buf, size_t size)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node);
	cJSON *j = NULL;
	const char *t;
	size_t n;
	int rc;

	rc = get_json(s, "/v1/fs/readlink", path, &j);
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
static void op_owner(cJSON *op)
{
	const struct sbx_caller *c = sbx_caller_get();

	if (!c)
		return;
	op_num(op, "uid", c->uid);
	op_num(op, "gid", c->gid);
}

static int r_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = cpath(s, parent, name);
	cJSON *op = new_op("mknod", path);
	int rc;

	*out = NULL;
	op_num(op, "mode", mode);
	op_num(op, "rdev", (double)rdev);
	op_owner(op);
	rc = batch_entry(s, op, path, out, st);
	free(path);
	return rc;
}

static int r_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, struct sbx_node **out,
		   struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = cpath(s, parent, name);
	cJSON *op = new_op("mkdir", path);
	int rc;

	*out = NULL;
	op_num(op, "mode", mode & 07777);
	op_owner(op);
	rc = batch_entry(s, op, path, out, st);
	free(path);
	return rc;
}

static int r_symlink(struct sbx_sandbox *sb, const char *target,
		     struct sbx_node *parent, const char *name,
		     struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = cpath(s, parent, name);
	cJSON *op = new_op("symlink", path);
	int rc;

	*out = NULL;
	sbx_json_set_str(op, "target", target);
	op_owner(op);
	rc = batch_entry(s, op, path, out, st);
	free(path);
	return rc;
}

static int r_link(struct sbx_sandbox *sb, struct sbx_node *node,
		  struct sbx_node *newparent, const char *newname,
		  struct sbx_node **out, struct stat *st)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node), *np = cpath(s, newparent, newname);
	cJSON *op = new_op("link", path);
	int rc;

	*out = NULL;
	sbx_json_set_str(op, "newpath", np);
	rc = batch_entry(s, op, np, out, st);
	free(np);
	free(path);
	return rc;
}

static int remove_entry(struct sbx_sandbox *sb, struct sbx_node *parent,
			const char *name, const char *what)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = cpath(s, parent, name);
	int rc = batch1(s, new_op(what, path), NULL);

	free(path);
	return rc;
}

static int r_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name)
{
	return remove_entry(sb, parent, name, "unlink");
}

static int r_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name)
{
	return remove_entry(sb, parent, name, "rmdir");
}

static int r_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node *newparent,
		    const char *newname, unsigned flags)
{
	struct premote_sandbox *s = RSB(sb);
	char *from, *to;
	cJSON *op;
	int rc;

	if (flags & ~(unsigned)(RENAME_EXCHANGE | RENAME_NOREPLACE))
		return sbx_error_set(SBX_ERR_OS, -EINVAL,
				     "rename %s: unsupported flags 0x%x", name,
				     flags);
	from = cpath(s, parent, name);
	to = cpath(s, newparent, newname);
	op = new_op("rename", from);
	sbx_json_set_str(op, "newpath", to);
	if (flags & RENAME_EXCHANGE)
		sbx_json_set_str(op, "flags", "exchange");
	else if (flags & RENAME_NOREPLACE)
		sbx_json_set_str(op, "flags", "noreplace");
	else
		op_num(op, "flags", 0);
	rc = batch1(s, op, NULL);
	if (rc == 0) {
		pthread_mutex_lock(&s->nodes_lock);
		move_locked(s, from, to, flags & RENAME_EXCHANGE);
		pthread_mutex_unlock(&s->nodes_lock);
	}
	free(from);
	free(to);
	return rc;
}

/* ---- files ---------------------------------------------------------------- */

static struct premote_file *file_new(struct premote_sandbox *s,
				     struct premote_node *n, int flags)
{
	struct premote_file *f = sbx_xcalloc(1, sizeof(*f));

	node_ref(s, n);
	f->node = n;
	f->flags = flags;
	pthread_mutex_init(&f->lock, NULL);
	return f;
}

static void file_free(struct premote_sandbox *s, struct premote_file *f)
{
	if (!f)
		return;
	node_put(s, f->node);
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
	out->fh = (struct sbx_file *)file_new(s, RNODE(node), flags);
	return 0;
}

static int r_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, mode_t mode, int flags,
		    struct sbx_node **node_out, struct stat *st,
		    struct sbx_open_result *out)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = cpath(s, parent, name);
	cJSON *op = new_op("create", path);
	int rc;

	*node_out = NULL;
	memset(out, 0, sizeof(*out));
	op_num(op, "mode", mode & 07777);
	op_bool(op, "excl", flags & O_EXCL);
	op_bool(op, "truncate", flags & O_TRUNC);
	op_owner(op);
	rc = batch_entry(s, op, path, node_out, st);
	if (rc == 0)
		out->fh = (struct sbx_file *)file_new(s, RNODE(*node_out),
						      flags);
	free(path);
	return rc;
}

static ssize_t r_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		      size_t size, off_t off)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, (struct sbx_node *)RFILE(fh)->node);
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
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	free(path);
	if (rc < 0)
		return premote_fs_errno(rc);
	return (ssize_t)resp.out_len;
}

static ssize_t write_chunk(struct premote_sandbox *s, const char *path,
			   const void *buf, size_t size, off_t off,
			   bool append)
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
	path = npath(s, (struct sbx_node *)f->node);
	while (done < size) {
		size_t len = size - done < WRITE_CHUNK ? size - done
						       : WRITE_CHUNK;
		ssize_t n = write_chunk(s, path, (const char *)buf + done, len,
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

static int fsync_path(struct premote_sandbox *s, struct premote_node *n,
		      bool datasync)
{
	char *path = npath(s, (struct sbx_node *)n);
	cJSON *op = new_op("fsync", path);
	int rc;

	op_bool(op, "datasync", datasync);
	rc = batch1(s, op, NULL);
	free(path);
	return rc;
}

static int r_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	return fsync_path(RSB(sb), RFILE(fh)->node, datasync);
}

static int r_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	file_free(RSB(sb), RFILE(fh));
	return 0;
}

static int r_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		       off_t off, off_t len)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, (struct sbx_node *)RFILE(fh)->node);
	cJSON *op = new_op("fallocate", path);
	int rc;

	op_num(op, "mode", mode);
	op_num(op, "offset", (double)off);
	op_num(op, "length", (double)len);
	rc = batch1(s, op, NULL);
	free(path);
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
	char *path;
	cJSON *op, *res = NULL;
	const cJSON *o;
	off_t r;
	int rc;

	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "lseek: whence %d", whence);
	path = npath(s, (struct sbx_node *)RFILE(fh)->node);
	op = new_op("lseek", path);
	op_num(op, "offset", (double)off);
	cJSON_AddStringToObject(op, "whence",
				whence == SEEK_DATA ? "data" : "hole");
	rc = batch1(s, op, &res);
	free(path);
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

/* ---- directories ---------------------------------------------------------- */

static int r_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file **out)
{
	struct premote_file *f = file_new(RSB(sb), RNODE(node), O_RDONLY);

	f->is_dir = true;
	*out = (struct sbx_file *)f;
	return 0;
}

/* One GET /v1/fs/list for the whole listing, with every entry's stat. */
static int fetch_listing(struct premote_sandbox *s, struct premote_file *d)
{
	char *path = npath(s, (struct sbx_node *)d->node);
	const cJSON *ents, *e;
	cJSON *j = NULL;
	size_t i = 0;
	int rc;

	rc = get_json(s, "/v1/fs/list", path, &j);
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
	memset(&d->dot, 0, sizeof(d->dot));
	d->dot.st_mode = S_IFDIR;
	d->dot.st_ino = d->node == &s->root ? s->root.ino : d->node->ino;
out:
	cJSON_Delete(j);
	free(path);
	return rc;
}

static int r_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
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
	dir = npath(s, (struct sbx_node *)d->node);
	/* Cookies: 1 ".", 2 "..", 3 + i the i-th entry. */
	for (off_t c = off; c < (off_t)d->nentries + 2; c++) {
		struct sbx_node *node = NULL;
		struct stat st;
		const char *name;
		char *path;

		if (c < 2) {
			memset(&st, 0, sizeof(st));
			st.st_mode = S_IFDIR;
			st.st_ino = c == 0 ? d->dot.st_ino : 1;
			if (cb(c == 0 ? "." : "..", &st, NULL, c + 1,
			       payload) != 0)
				break;
			d->served = true;
			continue;
		}
		const cJSON *e = d->entries[c - 2];

		name = sbx_json_str(e, "name");
		if (!name || !*name || strchr(name, '/') ||
		    get_st(s, e, "st", &st) < 0) {
			rc = sbx_error_set(SBX_ERR_PROTO, -EIO,
					   "list %s: malformed entry %lld",
					   dir, (long long)(c - 2));
			break;
		}
		if (plus) {
			path = sbx_proto_path_join(dir, name);
			node = (struct sbx_node *)node_get(s, path, &st);
			free(path);
		}
		if (cb(name, &st, node, c + 1, payload) != 0) {
			r_forget(sb, node);
			break;
		}
		d->served = true;
	}
out:
	pthread_mutex_unlock(&d->lock);
	free(dir);
	return rc;
}

static int r_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh,
		      bool datasync)
{
	return fsync_path(RSB(sb), RFILE(dh)->node, datasync);
}

static int r_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	file_free(RSB(sb), RFILE(dh));
	return 0;
}

static int r_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct statvfs *out)
{
	cJSON *j = NULL;
	int rc = get_json(RSB(sb), "/v1/fs/statfs", NULL, &j);

	if (rc == 0)
		rc = premote_fs_errno(sbx_proto_statvfs_from_json(j, out));
	cJSON_Delete(j);
	return rc;
}

/* ---- xattrs --------------------------------------------------------------- */

static ssize_t r_getxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			  const char *name, void *buf, size_t size)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node);
	cJSON *op = new_op("getxattr", path), *r = NULL;
	const char *v;
	unsigned char *val = NULL;
	size_t len = 0;
	ssize_t rc;

	sbx_json_set_str(op, "name", name);
	rc = batch1(s, op, &r);
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

static ssize_t r_listxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			   char *buf, size_t size)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node);
	cJSON *r = NULL;
	const cJSON *names, *n;
	size_t need = 0;
	ssize_t rc;

	rc = batch1(s, new_op("listxattr", path), &r);
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

static int r_setxattr(struct sbx_sandbox *sb, struct sbx_node *node,
		      const char *name, const void *value, size_t size,
		      int flags)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node), *v = sbx_proto_base64_encode(value, size);
	cJSON *op = new_op("setxattr", path);
	int rc;

	sbx_json_set_str(op, "name", name);
	sbx_json_set_str(op, "value", v);
	if (flags & XATTR_CREATE)
		sbx_json_set_str(op, "flags", "create");
	else if (flags & XATTR_REPLACE)
		sbx_json_set_str(op, "flags", "replace");
	else
		op_num(op, "flags", 0);
	rc = batch1(s, op, NULL);
	free(v);
	free(path);
	return rc;
}

static int r_removexattr(struct sbx_sandbox *sb, struct sbx_node *node,
			 const char *name)
{
	struct premote_sandbox *s = RSB(sb);
	char *path = npath(s, node);
	cJSON *op = new_op("removexattr", path);
	int rc;

	sbx_json_set_str(op, "name", name);
	rc = batch1(s, op, NULL);
	free(path);
	return rc;
}

static int r_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		       char **out)
{
	struct premote_sandbox *s = RSB(sb);
	char *p = npath(s, node);
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

static int bulk_dir(struct bulk_ctx *b, const cJSON *hdr, const char *dir)
{
	const cJSON *arr = cJSON_GetObjectItemCaseSensitive(hdr, "entries");
	bool more = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hdr, "more"));
	bool cont = cJSON_IsTrue(
		cJSON_GetObjectItemCaseSensitive(hdr, "continued"));
	struct sbx_bulk_item it;
	const cJSON *e;
	int rc;

	if (!cJSON_IsArray(arr))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: no \"entries\"", dir);
	if (b->start_only && strcmp(dir, b->start))
		return 1; /* past the start directory: enough */
	if (cont != (b->dpath != NULL) || (cont && strcmp(dir, b->dpath)))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: a continued directory does "
				     "not follow its start", dir);
	if (!cont) {
		b->dpath = sbx_xstrdup(dir);
		rc = get_st(b->s, hdr, "st", &b->dst);
		if (rc < 0)
			return rc;
	}
	cJSON_ArrayForEach(e, arr)
	{
		const char *name = sbx_json_str(e, "name");
		struct stat st;

		if (!name || !*name || strchr(name, '/') ||
		    get_st(b->s, e, "st", &st) < 0)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "bulk %s: malformed entry", dir);
		if (b->n == b->cap) {
			b->cap = b->cap ? b->cap * 2 : 64;
			b->ents = sbx_xrealloc(b->ents,
					       b->cap * sizeof(*b->ents));
		}
		b->ents[b->n].name = sbx_xstrdup(name);
		b->ents[b->n].st = st;
		b->n++;
	}
	if (more)
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
	const char *dir = sbx_json_str(hdr, "dir");
	const char *file = sbx_json_str(hdr, "file");
	struct sbx_bulk_item it;
	int rc;

	if (dir)
		return bulk_dir(b, hdr, dir);
	if (!file)
		return 0; /* {"end":...} and records we do not know */
	if (b->dpath)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: a file inside an unfinished "
				     "directory listing", file);
	memset(&it, 0, sizeof(it));
	rc = get_st(b->s, hdr, "st", &it.st);
	if (rc < 0)
		return rc;
	if ((uint64_t)it.st.st_size != len)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "bulk %s: %zu bytes for a file of %lld",
				     file, len, (long long)it.st.st_size);
	it.kind = SBX_BULK_FILE;
	it.path = file;
	it.data = data ? data : "";
	it.len = len;
	return bulk_deliver(b, &it);
}

static int r_bulk(struct sbx_sandbox *sb, const char *dir,
		  const struct sbx_bulk_opts *o, sbx_bulk_cb cb,
		  void *payload)
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

/* ---- lifetime ------------------------------------------------------------- */

static void r_free(struct sbx_sandbox *sb)
{
	struct premote_sandbox *s = RSB(sb);

	if (!s)
		return;
	if (s->watch)
		premote_watch_stop(sb);
	for (size_t i = 0; s->by_ino && i < s->nbuckets; i++) {
		struct premote_node *n, *next;

		/* Nodes the daemon did not forget (it exits): free them. */
		for (n = s->by_ino[i]; n; n = next) {
			next = n->ino_next;
			free(n->path);
			free(n);
		}
	}
	free(s->by_ino);
	free(s->by_path);
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
	.release = r_release,
	.fallocate = r_fallocate,
	.lseek = r_lseek,
	.opendir = r_opendir,
	.readdir = r_readdir,
	.fsyncdir = r_fsyncdir,
	.releasedir = r_releasedir,
	.statfs = r_statfs,
	.getxattr = r_getxattr,
	.listxattr = r_listxattr,
	.setxattr = r_setxattr,
	.removexattr = r_removexattr,
	.node_path = r_node_path,
	.exec_start = premote_exec_start,
	.watch_start = premote_watch_start,
	.watch_sync = premote_watch_sync,
	.watch_stop = premote_watch_stop,
	.bulk = r_bulk,
	.node_at = r_node_at,
	.watch_healthy = r_watch_healthy,
	.free = r_free,
	.repo_seed = premote_repo_seed,
	.repo_state = premote_repo_state,
	.repo_objects = premote_repo_objects,
};

/*
 * The same table without node_at: the daemon then serves these operations
 * directly, without fs/cache.c.  Chosen by SBX_REMOTE_NO_CACHE=1, a
 * debugging aid to tell the provider's faults from the cache's.
 */
static struct sbx_sandbox_ops premote_uncached_ops;
static pthread_once_t uncached_once = PTHREAD_ONCE_INIT;

static void uncached_init(void)
{
	premote_uncached_ops = premote_sandbox_ops;
	premote_uncached_ops.node_at = NULL;
}

int premote_sandbox_open(struct sbx_sandbox **out, const char *session,
			 struct premote_config *cfg, struct premote_http *http,
			 struct premote_info *info)
{
	struct premote_sandbox *s;
	struct stat st;
	uint64_t h = 1469598103934665603ull;
	cJSON *j = NULL;
	int rc;

	*out = NULL;
	s = sbx_xcalloc(1, sizeof(*s));
	s->base.ops = &premote_sandbox_ops;
	if (getenv("SBX_REMOTE_NO_CACHE") &&
	    !strcmp(getenv("SBX_REMOTE_NO_CACHE"), "1")) {
		pthread_once(&uncached_once, uncached_init);
		s->base.ops = &premote_uncached_ops;
	}
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
	s->nbuckets = 1024;
	s->by_ino = sbx_xcalloc(s->nbuckets, sizeof(*s->by_ino));
	s->by_path = sbx_xcalloc(s->nbuckets, sizeof(*s->by_path));
	/* A stable st_dev per sandbox: from its URL. */
	for (const char *p = s->cfg.url; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	s->dev = (dev_t)((mix64(h) & 0xffffffffu) | 1u);

	if (s->info.has_root_st) {
		/* /v1/info said it: no round trip of its own. */
		st = s->info.root_st;
		rc = 0;
	} else {
		rc = premote_fs_errno(get_json(s, "/v1/fs/stat", "", &j));
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
