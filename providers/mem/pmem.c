/*
 * The in-memory sandbox; see pmem.h.  This file: the node operations
 * (lookup, attributes, making and removing names), bulk, the ops table and
 * pmem_new().  The tree is in pmem_tree.c, open files in pmem_file.c, the
 * instrumentation and the change stream in pmem_instr.c; pmem_i.h says
 * what they share and how they lock.
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
#include <unistd.h>

#include "sbx/proto.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "pmem_i.h"

/* ---- node operations ----------------------------------------------------- */

static struct sbx_node *m_root(struct sbx_sandbox *sb)
{
	return (struct sbx_node *)&PMEM(sb)->root_node;
}

static int m_node_at_ino(struct sbx_sandbox *sb, const char *path,
			 uint64_t ino, struct sbx_node **out)
{
	struct pmem *s = PMEM(sb);
	struct pnode *n;
	char *p = NULL;
	int rc;

	*out = NULL;
	rc = pmem_enter(s, OP_NODE_AT, path);
	if (rc == 0)
		rc = pmem_clean(path, &p);
	if (rc < 0)
		return rc;
	if (!*p) {
		*out = (struct sbx_node *)&s->root_node;
	} else {
		n = pmem_node_new(p);
		n->expect_ino = (ino_t)ino;
		*out = (struct sbx_node *)n;
	}
	free(p);
	return 0;
}

static int m_node_at(struct sbx_sandbox *sb, const char *path,
		     struct sbx_node **out)
{
	return m_node_at_ino(sb, path, 0, out);
}

static int m_lookup(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node **out, struct stat *st)
{
	return pmem_child_op(PMEM(sb), OP_LOOKUP, parent, name,
			     pmem_stat_locked, st, out);
}

static void m_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	struct pmem *s = PMEM(sb);

	if (!node)
		return;
	(void)pmem_enter(s, OP_FORGET, PNODE(node)->path);
	sbx_error_clear();
	if (PNODE(node) != &s->root_node)
		pmem_node_free(PNODE(node));
}

static int m_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	return pmem_path_op(PMEM(sb), OP_GETATTR, PNODE(node)->path,
			    pmem_stat_locked, st);
}

struct setattr_args {
	const struct stat *in;
	int valid;
	struct stat *out;
	ino_t ino; /* node_at_ino(): the file it is for (0: any) */
};

static int setattr_fn(struct pmem *s, const char *path, void *arg)
{
	struct setattr_args *a = arg;
	/* As the agent: never another file moved onto it. */
	int rc = pmem_check_ino_locked(s, path, a->ino, "setattr");

	if (rc < 0)
		return rc;
	return pmem_setattr_locked(s, path, a->in, a->valid, a->out);
}

static int m_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct setattr_args a = { in, valid, out, PNODE(node)->expect_ino };

	return pmem_path_op(PMEM(sb), OP_SETATTR, PNODE(node)->path,
			    setattr_fn, &a);
}

/*
 * One exchange (a single pmem_enter, named by the first item's path: its
 * gate, hook, counter and fault stand for the whole exchange), then each
 * item in order under the tree lock, each with its own result.
 */
static int m_setattr_many(struct sbx_sandbox *sb,
			  struct sbx_setattr_item *items, size_t n)
{
	struct pmem *s = PMEM(sb);
	int rc;

	if (n == 0)
		return 0;
	rc = pmem_enter(s, OP_SETATTR_MANY, PNODE(items[0].node)->path);
	if (rc < 0) {
		for (size_t i = 0; i < n; i++)
			items[i].rc = rc;
		return rc;
	}
	pthread_mutex_lock(&s->lock);
	for (size_t i = 0; i < n; i++)
		items[i].rc = pmem_setattr_locked(s, PNODE(items[i].node)->path,
						  items[i].in, items[i].valid,
						  &items[i].out);
	pthread_mutex_unlock(&s->lock);
	sbx_error_clear();
	return 0;
}

struct readlink_args {
	char *buf;
	size_t size;
};

/* Returns the length copied, like readlink. */
static int readlink_fn(struct pmem *s, const char *path, void *arg)
{
	struct readlink_args *a = arg;
	struct pinode *in;
	int rc = pmem_walk_locked(s, path, &in);
	size_t n;

	if (rc < 0)
		return rc;
	if (!S_ISLNK(in->mode))
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "readlink %s: not a symlink", path);
	n = strlen(in->target);
	if (n > a->size)
		n = a->size;
	memcpy(a->buf, in->target, n);
	return (int)n;
}

static int m_readlink(struct sbx_sandbox *sb, struct sbx_node *node,
		      char *buf, size_t size)
{
	struct readlink_args a = { buf, size };

	return pmem_path_op(PMEM(sb), OP_READLINK, PNODE(node)->path,
			    readlink_fn, &a);
}

/* mknod/mkdir/symlink: what to make, and where its attributes go. */
struct make_args {
	mode_t mode;
	dev_t rdev;
	const char *target;
	struct stat *st;
};

static int make_fn(struct pmem *s, const char *path, void *arg)
{
	struct make_args *a = arg;

	return pmem_make_locked(s, path, a->mode, a->rdev, a->target, a->st);
}

static int make_op(struct pmem *s, enum op op, struct sbx_node *parent,
		   const char *name, struct make_args *a,
		   struct sbx_node **out)
{
	return pmem_child_op(s, op, parent, name, make_fn, a, out);
}

static int m_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   struct sbx_node **out, struct stat *st)
{
	struct make_args a = { mode, rdev, NULL, st };

	if (S_ISDIR(mode) || S_ISLNK(mode)) {
		*out = NULL;
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "mknod %s: bad type", name);
	}
	if (!(mode & S_IFMT))
		a.mode |= S_IFREG;
	return make_op(PMEM(sb), OP_MKNOD, parent, name, &a, out);
}

static int m_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, struct sbx_node **out,
		   struct stat *st)
{
	struct make_args a = { S_IFDIR | (mode & 07777), 0, NULL, st };

	return make_op(PMEM(sb), OP_MKDIR, parent, name, &a, out);
}

static int m_symlink(struct sbx_sandbox *sb, const char *target,
		     struct sbx_node *parent, const char *name,
		     struct sbx_node **out, struct stat *st)
{
	struct make_args a = { S_IFLNK | 0777, 0, target, st };

	return make_op(PMEM(sb), OP_SYMLINK, parent, name, &a, out);
}

struct link_args {
	const char *from;
	struct stat *st;
};

static int link_fn(struct pmem *s, const char *path, void *arg)
{
	struct link_args *a = arg;

	return pmem_link_locked(s, a->from, path, a->st);
}

static int m_link(struct sbx_sandbox *sb, struct sbx_node *node,
		  struct sbx_node *newparent, const char *newname,
		  struct sbx_node **out, struct stat *st)
{
	struct link_args a = { PNODE(node)->path, st };

	return pmem_child_op(PMEM(sb), OP_LINK, newparent, newname, link_fn,
			     &a, out);
}

static int unlink_fn(struct pmem *s, const char *path, void *arg)
{
	return pmem_remove_locked(s, path, false);
}

static int rmdir_fn(struct pmem *s, const char *path, void *arg)
{
	return pmem_remove_locked(s, path, true);
}

static int m_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name)
{
	return pmem_child_op(PMEM(sb), OP_UNLINK, parent, name, unlink_fn,
			     NULL, NULL);
}

static int m_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name)
{
	return pmem_child_op(PMEM(sb), OP_RMDIR, parent, name, rmdir_fn, NULL,
			     NULL);
}

static int m_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node *newparent,
		    const char *newname, unsigned flags)
{
	struct pmem *s = PMEM(sb);
	char *from = NULL, *to = NULL;
	int rc = pmem_child(parent, name, &from);

	if (rc == 0)
		rc = pmem_child(newparent, newname, &to);
	if (rc == 0)
		rc = pmem_enter(s, OP_RENAME, from);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = pmem_rename_locked(s, from, to, flags);
		if (rc == 0)
			pmem_side_locked(s, OP_RENAME, from, to);
		/* Exchanged: no one object moved to `to`. */
		if (rc == 0 && (flags & RENAME_EXCHANGE) && sbx_side_get())
			sbx_side_get()->has_obj = false;
		pthread_mutex_unlock(&s->lock);
	}
	free(from);
	free(to);
	return rc;
}

/* ---- bulk ---------------------------------------------------------------- */

struct bitem {
	struct sbx_bulk_item it;
	char *path;
	struct sbx_bulk_entry *ents; /* names owned */
	void *data;
};

struct bwalk {
	struct bitem *items;
	size_t n, cap;
	size_t total; /* content bytes so far */
};

static struct bitem *bitem_add(struct bwalk *w)
{
	if (w->n == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 16;
		w->items = sbx_xrealloc(w->items, w->cap * sizeof(*w->items));
	}
	memset(&w->items[w->n], 0, sizeof(w->items[0]));
	return &w->items[w->n++];
}

/* A FILE record of k at path (taken over) with a copy of its bytes. */
static void bitem_file(struct pmem *s, struct bwalk *w, struct pinode *k,
		       char *path)
{
	struct bitem *f = bitem_add(w);

	f->path = path;
	f->it.kind = SBX_BULK_FILE;
	f->it.path = path;
	pmem_fill_stat(s, k, &f->it.st);
	f->data = sbx_xmalloc(k->size ? k->size : 1);
	if (k->size)
		memcpy(f->data, k->data, k->size);
	f->it.data = f->data;
	f->it.len = k->size;
	w->total += k->size;
}

static void bwalk_fini(struct bwalk *w)
{
	for (size_t i = 0; i < w->n; i++) {
		struct bitem *b = &w->items[i];

		for (size_t j = 0; j < b->it.nentries; j++)
			free((char *)b->ents[j].name);
		free(b->ents);
		free(b->path);
		free(b->data);
	}
	free(w->items);
}

/*
 * Records of the subtree at dir, breadth first, copied so the callbacks
 * run without the lock.  Caller holds s->lock.
 */
static int bulk_collect_locked(struct pmem *s, const char *dir,
			       const struct sbx_bulk_opts *o, struct bwalk *w)
{
	struct {
		char *path;
		struct pinode *in;
		int depth;
	} *q = NULL;
	size_t qh = 0, qn = 0, qcap = 0;
	struct pinode *root;
	int rc = pmem_walk_locked(s, dir, &root);

	if (rc == 0 && !S_ISDIR(root->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				   "bulk %s: not a directory", dir);
	if (rc < 0)
		return rc;
	qcap = 16;
	q = sbx_xmalloc(qcap * sizeof(*q));
	q[qn].path = sbx_xstrdup(dir);
	q[qn].in = root;
	q[qn++].depth = 0;
	while (qh < qn) {
		char *path = q[qh].path;
		struct pinode *in = q[qh].in;
		int depth = q[qh++].depth;
		struct bitem *b = bitem_add(w);

		b->path = path;
		b->it.kind = SBX_BULK_DIR;
		b->it.path = path;
		pmem_fill_stat(s, in, &b->it.st);
		b->ents = sbx_xcalloc(in->nents ? in->nents : 1,
				      sizeof(*b->ents));
		for (size_t i = 0; i < in->nents; i++) {
			b->ents[i].name = sbx_xstrdup(in->ents[i].name);
			pmem_fill_stat(s, in->ents[i].ino, &b->ents[i].st);
		}
		b->it.entries = b->ents;
		b->it.nentries = in->nents;
		/* b may move as items are added: done with it here. */
		for (size_t i = 0; i < in->nents; i++) {
			struct pinode *k = in->ents[i].ino;
			char *kp = sbx_proto_path_join(path, in->ents[i].name);

			if (S_ISDIR(k->mode) &&
			    (o->depth < 0 || depth < o->depth)) {
				if (qn == qcap) {
					qcap *= 2;
					q = sbx_xrealloc(q, qcap * sizeof(*q));
				}
				q[qn].path = kp;
				q[qn].in = k;
				q[qn++].depth = depth + 1;
				continue;
			}
			if (S_ISREG(k->mode) && k->size <= o->max_file &&
			    w->total + k->size <= o->max_total) {
				bitem_file(s, w, k, kp);
				continue;
			}
			free(kp);
		}
	}
	free(q);
	return 0;
}

/* FILE records of the listed files (o->files).  Caller holds s->lock. */
static void bulk_files_locked(struct pmem *s, const struct sbx_bulk_opts *o,
			      struct bwalk *w)
{
	for (size_t i = 0; i < o->nfiles; i++) {
		struct pinode *k;
		char *p = NULL;

		if (pmem_clean(o->files[i], &p) < 0 ||
		    pmem_walk_locked(s, p, &k) < 0 || !S_ISREG(k->mode) ||
		    k->size > o->max_file ||
		    w->total + k->size > o->max_total) {
			sbx_error_clear();
			free(p);
			continue;
		}
		bitem_file(s, w, k, p);
	}
}

static int m_bulk(struct sbx_sandbox *sb, const char *dir,
		  const struct sbx_bulk_opts *o, sbx_bulk_cb cb, void *payload)
{
	struct pmem *s = PMEM(sb);
	struct sbx_bulk_opts lim = *o;
	struct bwalk w = {0};
	char *p = NULL;
	int rc = pmem_enter(s, OP_BULK, o->nfiles ? o->files[0] : dir);

	if (rc == 0)
		rc = pmem_clean(dir, &p);
	if (rc < 0)
		return rc;
	if (!lim.nfiles && s->bulk_max_total &&
	    lim.max_total > s->bulk_max_total)
		lim.max_total = s->bulk_max_total;
	pthread_mutex_lock(&s->lock);
	if (lim.nfiles)
		bulk_files_locked(s, &lim, &w);
	else
		rc = bulk_collect_locked(s, p, &lim, &w);
	pthread_mutex_unlock(&s->lock);
	if (rc == 0)
		pmem_hook_point(s, "bulk:sent", o->nfiles ? o->files[0] : p);
	for (size_t i = 0; rc == 0 && i < w.n; i++)
		rc = cb(&w.items[i].it, payload);
	bwalk_fini(&w);
	free(p);
	return rc;
}

static int m_syncfs(struct sbx_sandbox *sb)
{
	return pmem_enter(PMEM(sb), OP_SYNCFS, "");
}

static void m_free(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	if (!s)
		return;
	pmem_watch_fini(s);
	pmem_gate_fini(s);
	pmem_tree_fini(s);
	free(s->root_node.path);
	free(s->base.session);
	free(s->base.workdir);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->deliver);
	pthread_cond_destroy(&s->ev_cond);
	free(s);
}

static const struct sbx_sandbox_ops pmem_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.root = m_root,
	.lookup = m_lookup,
	.forget = m_forget,
	.getattr = m_getattr,
	.setattr = m_setattr,
	.setattr_many = m_setattr_many,
	.readlink = m_readlink,
	.mknod = m_mknod,
	.mkdir = m_mkdir,
	.symlink = m_symlink,
	.link = m_link,
	.unlink = m_unlink,
	.rmdir = m_rmdir,
	.rename = m_rename,
	.open = pmem_op_open,
	.create = pmem_op_create,
	.read = pmem_op_read,
	.write = pmem_op_write,
	.flush = pmem_op_flush,
	.fsync = pmem_op_fsync,
	.write_then = pmem_op_write_then,
	.release = pmem_op_release,
	.fallocate = pmem_op_fallocate,
	.lseek = pmem_op_lseek,
	.opendir = pmem_op_opendir,
	.readdir = pmem_op_readdir,
	.fsyncdir = pmem_op_fsyncdir,
	.releasedir = pmem_op_releasedir,
	.statfs = pmem_op_statfs,
	.node_path = pmem_op_node_path,
	.watch_start = pmem_op_watch_start,
	.watch_sync = pmem_op_watch_sync,
	.watch_stop = pmem_op_watch_stop,
	.bulk = m_bulk,
	.syncfs = m_syncfs,
	.node_at = m_node_at,
	.node_at_ino = m_node_at_ino,
	.watch_healthy = pmem_op_watch_healthy,
	.free = m_free,
};

int pmem_new(struct sbx_sandbox **out, const struct pmem_opts *opts)
{
	struct pmem_opts def = {0};
	struct pmem *s;
	struct pinode *root;

	*out = NULL;
	if (!opts)
		opts = &def;
	if (opts->ino_policy != PMEM_INO_LOWEST &&
	    opts->ino_policy != PMEM_INO_NEXT)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "pmem_new: bad ino_policy %d",
				     opts->ino_policy);
	s = sbx_xcalloc(1, sizeof(*s));
	s->base.ops = &pmem_ops;
	s->base.session = sbx_xstrdup(opts->session ? opts->session : "mem");
	s->base.workdir = sbx_xstrdup(opts->workdir ? opts->workdir
						    : "/sandbox");
	s->root_node.path = sbx_xstrdup("");
	s->ino_policy = opts->ino_policy;
	s->dev = opts->dev ? opts->dev : PMEM_DEFAULT_DEV;
	s->bulk_max_total = opts->bulk_max_total;
	s->itab_cap = 64;
	s->itab = sbx_xcalloc(s->itab_cap, sizeof(*s->itab));
	s->next_ino = ROOT_INO;
	s->gate_op = -1;
	s->healthy = true;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->deliver, NULL);
	pthread_cond_init(&s->ev_cond, NULL);
	pthread_cond_init(&s->gate_cond, NULL);
	root = pmem_inode_new_locked(s, S_IFDIR | 0755);
	if (root->ino != ROOT_INO)
		abort();
	*out = &s->base;
	return 0;
}
