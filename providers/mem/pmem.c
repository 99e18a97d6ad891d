/*
 * The in-memory sandbox; see pmem.h.
 *
 * The tree: inode objects (struct pinode) in a table indexed by inode
 * number; a directory holds its entries (name -> inode) in an array, in
 * creation order.  Nodes and open files are paths (see pmem.h), resolved
 * on every call.  Every tree change is made by one *_locked helper shared
 * by the operation and its pmem_ext_*() twin, which also queues the change
 * events.
 *
 * Locks: s->lock protects the tree, the event queue, counters, faults, the
 * hook and the gate.  s->deliver serialises event delivery (the watch
 * thread and watch_sync) so callbacks run in order; it is taken before
 * s->lock and held across the callback, never the other way round.
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

#include "pmem.h"

#define ROOT_INO 1
#define DIR_SIZE 4096

/* Operation names, for counters, faults, hooks and gates. */
enum op {
	OP_LOOKUP, OP_FORGET, OP_GETATTR, OP_SETATTR, OP_READLINK, OP_MKNOD,
	OP_MKDIR, OP_SYMLINK, OP_LINK, OP_UNLINK, OP_RMDIR, OP_RENAME,
	OP_OPEN, OP_CREATE, OP_READ, OP_WRITE, OP_FLUSH, OP_FSYNC,
	OP_RELEASE, OP_FALLOCATE, OP_LSEEK, OP_OPENDIR, OP_READDIR,
	OP_FSYNCDIR, OP_RELEASEDIR, OP_STATFS, OP_NODE_PATH, OP_WATCH_START,
	OP_WATCH_SYNC, OP_WATCH_STOP, OP_BULK, OP_SYNCFS, OP_NODE_AT,
	OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
	"lookup", "forget", "getattr", "setattr", "readlink", "mknod",
	"mkdir", "symlink", "link", "unlink", "rmdir", "rename",
	"open", "create", "read", "write", "flush", "fsync",
	"release", "fallocate", "lseek", "opendir", "readdir",
	"fsyncdir", "releasedir", "statfs", "node_path", "watch_start",
	"watch_sync", "watch_stop", "bulk", "syncfs", "node_at",
};

struct pinode;

struct pdirent {
	char *name;
	struct pinode *ino;
};

struct pinode {
	ino_t ino;
	mode_t mode;
	nlink_t nlink;
	uid_t uid;
	gid_t gid;
	dev_t rdev;
	struct timespec atim, mtim, ctim;
	char *data;           /* regular files */
	size_t size, cap;
	char *target;         /* symlinks */
	struct pdirent *ents; /* directories */
	size_t nents, capents;
};

struct pnode {
	char *path; /* relative to the root; fixed */
};

/* A directory snapshot entry (readdir). */
struct psnap {
	char *name;
	struct stat st;
	char *path; /* for readdirplus nodes */
};

struct pfile {
	char *path;
	int flags;
	bool is_dir;
	bool fetched;
	struct psnap *snap; /* "." and ".." first */
	size_t nsnap;
};

struct pevent {
	struct pevent *next;
	uint64_t seq;
	int kind;
	char *path; /* NULL for OVERFLOW */
};

struct fault {
	int err;
	int count; /* -1: until cleared */
};

struct pmem {
	struct sbx_sandbox base;
	struct pnode root_node;
	pthread_mutex_t lock;
	int ino_policy;
	dev_t dev;

	/* The tree. */
	struct pinode **itab; /* by inode number */
	size_t itab_cap;
	ino_t next_ino;       /* PMEM_INO_NEXT */
	struct timespec last_time;

	/* Instrumentation. */
	unsigned long calls[OP_COUNT];
	struct fault faults[OP_COUNT];
	pmem_hook_fn hook;
	void *hook_payload;
	pthread_cond_t gate_cond;
	int gate_op;          /* -1: not armed */
	char *gate_path;      /* NULL: any */
	bool gate_parked, gate_open;

	/* The change stream. */
	pthread_mutex_t deliver;
	pthread_cond_t ev_cond;
	sbx_change_cb cb;
	void *cb_payload;
	bool watching, stopping, held;
	bool healthy;         /* atomic: read without the lock, as is
			       * `watching` (written under it) */
	pthread_t thread;
	struct pevent *ev_head, *ev_tail;
	size_t ev_count;
	uint64_t seq;
};

#define PMEM(sb) ((struct pmem *)(sb))
#define PNODE(n) ((struct pnode *)(n))
#define PFILE(f) ((struct pfile *)(f))

static int op_index(const char *name)
{
	for (int i = 0; i < OP_COUNT; i++)
		if (strcmp(op_names[i], name) == 0)
			return i;
	return -1;
}

/* ---- instrumentation ----------------------------------------------------- */

/*
 * Start of an operation: gate, hook, counter, fault (see pmem.h).  Returns
 * 0 or the injected error.  Called without s->lock.
 */
static int enter(struct pmem *s, enum op op, const char *path)
{
	pmem_hook_fn hook;
	void *payload;
	struct fault *f;
	int rc = 0;

	pthread_mutex_lock(&s->lock);
	if (s->gate_op == (int)op && !s->gate_parked && !s->gate_open &&
	    (!s->gate_path || strcmp(s->gate_path, path) == 0)) {
		s->gate_parked = true;
		pthread_cond_broadcast(&s->gate_cond);
		while (!s->gate_open)
			pthread_cond_wait(&s->gate_cond, &s->lock);
		/* Disarmed: the next arm starts afresh. */
		s->gate_op = -1;
		s->gate_parked = false;
		s->gate_open = false;
		free(s->gate_path);
		s->gate_path = NULL;
		pthread_cond_broadcast(&s->gate_cond);
	}
	hook = s->hook;
	payload = s->hook_payload;
	pthread_mutex_unlock(&s->lock);

	if (hook)
		hook(op_names[op], path, payload);

	pthread_mutex_lock(&s->lock);
	s->calls[op]++;
	f = &s->faults[op];
	if (f->count != 0 && f->err) {
		rc = f->err;
		if (f->count > 0)
			f->count--;
	}
	pthread_mutex_unlock(&s->lock);
	if (rc)
		return sbx_error_set(SBX_ERR_REMOTE, rc, "%s %s: injected",
				     op_names[op], path);
	return 0;
}

int pmem_fail(struct sbx_sandbox *sb, const char *op, int neg_errno, int count)
{
	struct pmem *s = PMEM(sb);
	int i = op_index(op);

	if (i < 0 || neg_errno > 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "pmem_fail: bad op '%s' or errno %d", op,
				     neg_errno);
	pthread_mutex_lock(&s->lock);
	s->faults[i].err = count ? neg_errno : 0;
	s->faults[i].count = neg_errno ? count : 0;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

unsigned long pmem_calls(struct sbx_sandbox *sb, const char *op)
{
	struct pmem *s = PMEM(sb);
	int i = op_index(op);
	unsigned long n;

	if (i < 0)
		return 0;
	pthread_mutex_lock(&s->lock);
	n = s->calls[i];
	pthread_mutex_unlock(&s->lock);
	return n;
}

void pmem_calls_reset(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	memset(s->calls, 0, sizeof(s->calls));
	pthread_mutex_unlock(&s->lock);
}

void pmem_set_hook(struct sbx_sandbox *sb, pmem_hook_fn fn, void *payload)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	s->hook = fn;
	s->hook_payload = payload;
	pthread_mutex_unlock(&s->lock);
}

int pmem_gate_arm(struct sbx_sandbox *sb, const char *op, const char *path)
{
	struct pmem *s = PMEM(sb);
	int i = op_index(op);

	if (i < 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "pmem_gate_arm: unknown op '%s'", op);
	pthread_mutex_lock(&s->lock);
	if (s->gate_parked) {
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_INTERNAL, -EBUSY,
				     "pmem_gate_arm: a call is parked");
	}
	free(s->gate_path);
	s->gate_path = path ? sbx_xstrdup(path) : NULL;
	s->gate_op = i;
	s->gate_open = false;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int pmem_gate_wait(struct sbx_sandbox *sb, int timeout_ms)
{
	struct pmem *s = PMEM(sb);
	struct timespec until;
	int rc = 0;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&s->lock);
	while (!s->gate_parked && rc == 0)
		rc = pthread_cond_timedwait(&s->gate_cond, &s->lock, &until);
	rc = s->gate_parked ? 0 : -ETIMEDOUT;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void pmem_gate_release(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	if (s->gate_parked) {
		s->gate_open = true;
		pthread_cond_broadcast(&s->gate_cond);
	} else {
		s->gate_op = -1;
		free(s->gate_path);
		s->gate_path = NULL;
	}
	pthread_mutex_unlock(&s->lock);
}

/* ---- events -------------------------------------------------------------- */

/* Queue a change.  Caller holds s->lock.  `path` NULL for OVERFLOW. */
static void emit_locked(struct pmem *s, int kind, const char *path)
{
	struct pevent *e;

	if (!s->watching)
		return;
	e = sbx_xcalloc(1, sizeof(*e));
	e->seq = ++s->seq;
	e->kind = kind;
	e->path = path ? sbx_xstrdup(path) : NULL;
	if (s->ev_tail)
		s->ev_tail->next = e;
	else
		s->ev_head = e;
	s->ev_tail = e;
	s->ev_count++;
	pthread_cond_broadcast(&s->ev_cond);
}

static void event_free(struct pevent *e)
{
	if (e) {
		free(e->path);
		free(e);
	}
}

static void deliver_one(struct pmem *s, sbx_change_cb cb, void *payload,
			struct pevent *e)
{
	struct sbx_change c;

	memset(&c, 0, sizeof(c));
	c.seq = e->seq;
	c.kind = e->kind;
	c.path = e->path;
	if (e->kind == SBX_CHANGE_ENTRY && e->path) {
		const char *slash = strrchr(e->path, '/');

		c.name = slash ? slash + 1 : e->path;
	}
	if (cb)
		cb(&c, payload);
}

/*
 * Deliver queued events with seq <= upto.  Caller holds s->deliver, not
 * s->lock.
 */
static void deliver_upto(struct pmem *s, uint64_t upto)
{
	for (;;) {
		struct pevent *e;
		sbx_change_cb cb;
		void *payload;

		pthread_mutex_lock(&s->lock);
		e = s->ev_head;
		if (!e || e->seq > upto) {
			pthread_mutex_unlock(&s->lock);
			return;
		}
		s->ev_head = e->next;
		if (!s->ev_head)
			s->ev_tail = NULL;
		s->ev_count--;
		cb = s->cb;
		payload = s->cb_payload;
		pthread_mutex_unlock(&s->lock);
		deliver_one(s, cb, payload, e);
		event_free(e);
	}
}

static void *watch_thread(void *arg)
{
	struct pmem *s = arg;

	for (;;) {
		uint64_t upto;

		pthread_mutex_lock(&s->lock);
		while (!s->stopping && (s->held || !s->ev_head))
			pthread_cond_wait(&s->ev_cond, &s->lock);
		if (s->stopping) {
			pthread_mutex_unlock(&s->lock);
			return NULL;
		}
		upto = s->seq;
		pthread_mutex_unlock(&s->lock);
		pthread_mutex_lock(&s->deliver);
		deliver_upto(s, upto);
		pthread_mutex_unlock(&s->deliver);
	}
}

void pmem_watch_hold(struct sbx_sandbox *sb, bool hold)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	s->held = hold;
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->lock);
}

size_t pmem_watch_pending(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);
	size_t n;

	pthread_mutex_lock(&s->lock);
	n = s->ev_count;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void pmem_set_healthy(struct sbx_sandbox *sb, bool healthy)
{
	__atomic_store_n(&PMEM(sb)->healthy, healthy, __ATOMIC_RELEASE);
}

/* ---- the tree ------------------------------------------------------------ */

/* A timestamp strictly after every earlier one.  Caller holds s->lock. */
static struct timespec stamp_locked(struct pmem *s)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	if (t.tv_sec < s->last_time.tv_sec ||
	    (t.tv_sec == s->last_time.tv_sec &&
	     t.tv_nsec <= s->last_time.tv_nsec)) {
		t = s->last_time;
		if (++t.tv_nsec >= 1000000000L) {
			t.tv_sec++;
			t.tv_nsec = 0;
		}
	}
	s->last_time = t;
	return t;
}

static ino_t ino_alloc_locked(struct pmem *s)
{
	ino_t i;

	if (s->ino_policy == PMEM_INO_LOWEST) {
		for (i = ROOT_INO; i < s->itab_cap && s->itab[i]; i++)
			;
	} else {
		i = s->next_ino++;
	}
	if (i >= s->itab_cap) {
		size_t cap = s->itab_cap * 2;

		while (cap <= i)
			cap *= 2;
		s->itab = sbx_xrealloc(s->itab, cap * sizeof(*s->itab));
		memset(s->itab + s->itab_cap, 0,
		       (cap - s->itab_cap) * sizeof(*s->itab));
		s->itab_cap = cap;
	}
	return i;
}

static struct pinode *inode_new_locked(struct pmem *s, mode_t mode)
{
	struct pinode *in = sbx_xcalloc(1, sizeof(*in));

	in->ino = ino_alloc_locked(s);
	in->mode = mode;
	in->nlink = S_ISDIR(mode) ? 2 : 1;
	in->uid = geteuid();
	in->gid = getegid();
	in->atim = in->mtim = in->ctim = stamp_locked(s);
	s->itab[in->ino] = in;
	return in;
}

static void inode_free(struct pinode *in)
{
	for (size_t i = 0; i < in->nents; i++)
		free(in->ents[i].name);
	free(in->ents);
	free(in->data);
	free(in->target);
	free(in);
}

/* One name less; the inode goes with its last one. */
static void inode_drop_locked(struct pmem *s, struct pinode *in)
{
	if (S_ISDIR(in->mode))
		in->nlink = 0;
	else if (in->nlink > 0)
		in->nlink--;
	if (in->nlink == 0) {
		s->itab[in->ino] = NULL;
		inode_free(in);
	} else {
		in->ctim = stamp_locked(s);
	}
}

static void fill_stat(const struct pmem *s, const struct pinode *in,
		      struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_dev = s->dev;
	st->st_ino = in->ino;
	st->st_mode = in->mode;
	st->st_nlink = in->nlink;
	st->st_uid = in->uid;
	st->st_gid = in->gid;
	st->st_rdev = in->rdev;
	if (S_ISREG(in->mode))
		st->st_size = (off_t)in->size;
	else if (S_ISDIR(in->mode))
		st->st_size = DIR_SIZE;
	else if (S_ISLNK(in->mode))
		st->st_size = (off_t)strlen(in->target);
	st->st_blksize = 4096;
	st->st_blocks = (st->st_size + 511) / 512;
	st->st_atim = in->atim;
	st->st_mtim = in->mtim;
	st->st_ctim = in->ctim;
}

static struct pdirent *dir_find(struct pinode *dir, const char *name)
{
	for (size_t i = 0; i < dir->nents; i++)
		if (strcmp(dir->ents[i].name, name) == 0)
			return &dir->ents[i];
	return NULL;
}

static void dir_add_locked(struct pmem *s, struct pinode *dir,
			   const char *name, struct pinode *in)
{
	if (dir->nents == dir->capents) {
		dir->capents = dir->capents ? dir->capents * 2 : 8;
		dir->ents = sbx_xrealloc(dir->ents,
					 dir->capents * sizeof(*dir->ents));
	}
	dir->ents[dir->nents].name = sbx_xstrdup(name);
	dir->ents[dir->nents].ino = in;
	dir->nents++;
	if (S_ISDIR(in->mode))
		dir->nlink++;
	dir->mtim = dir->ctim = stamp_locked(s);
}

/* Remove entry e of dir (keeps the order of the others: cookies). */
static struct pinode *dir_del_locked(struct pmem *s, struct pinode *dir,
				     struct pdirent *e)
{
	struct pinode *in = e->ino;
	size_t i = (size_t)(e - dir->ents);

	free(e->name);
	memmove(&dir->ents[i], &dir->ents[i + 1],
		(dir->nents - i - 1) * sizeof(*dir->ents));
	dir->nents--;
	if (S_ISDIR(in->mode))
		dir->nlink--;
	dir->mtim = dir->ctim = stamp_locked(s);
	return in;
}

/*
 * Walk a clean path (see sbx_proto_path_clean) to its inode.  Returns
 * -ENOENT or -ENOTDIR (an intermediate component is not a directory).
 */
static int walk_locked(struct pmem *s, const char *path, struct pinode **out)
{
	struct pinode *in = s->itab[ROOT_INO];
	const char *p = path;

	*out = NULL;
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t len = slash ? (size_t)(slash - p) : strlen(p);
		struct pdirent *e = NULL;

		if (!S_ISDIR(in->mode))
			return sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
					     "%s: not a directory", path);
		for (size_t i = 0; i < in->nents; i++)
			if (strlen(in->ents[i].name) == len &&
			    memcmp(in->ents[i].name, p, len) == 0) {
				e = &in->ents[i];
				break;
			}
		if (!e)
			return sbx_error_set(SBX_ERR_REMOTE, -ENOENT,
					     "%s: no such file or directory",
					     path);
		in = e->ino;
		p = slash ? slash + 1 : p + len;
	}
	*out = in;
	return 0;
}

/*
 * Split a clean, non-root path into its directory's inode and the last
 * name (pointing into path).  -ENOENT/-ENOTDIR for the directory; -EINVAL
 * for the root.
 */
static int parent_locked(struct pmem *s, const char *path,
			 struct pinode **dir, const char **name)
{
	const char *slash = strrchr(path, '/');
	char *dpath;
	int rc;

	*dir = NULL;
	if (!*path)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "the root has no parent");
	*name = slash ? slash + 1 : path;
	dpath = slash ? sbx_xstrndup(path, (size_t)(slash - path))
		      : sbx_xstrdup("");
	rc = walk_locked(s, dpath, dir);
	free(dpath);
	if (rc == 0 && !S_ISDIR((*dir)->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				   "%s: not a directory", path);
	if (rc == 0 && strlen(*name) > 255)
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENAMETOOLONG,
				   "%s: name too long", path);
	return rc;
}

/* A clean path from user input (ext functions, node_at). */
static int clean(const char *in, char **out)
{
	int rc = sbx_proto_path_clean(in, out);

	if (rc < 0)
		return sbx_error_set(SBX_ERR_REMOTE, rc, "bad path \"%s\"",
				     in);
	return 0;
}

/* The path of entry `name` in directory node `dir`; -EINVAL for bad names. */
static int child(struct sbx_node *dir, const char *name, char **out)
{
	*out = NULL;
	if (!*name || strchr(name, '/') || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "bad name \"%s\"", name);
	*out = sbx_proto_path_join(PNODE(dir)->path, name);
	return 0;
}

static struct pnode *node_new(const char *path)
{
	struct pnode *n = sbx_xcalloc(1, sizeof(*n));

	n->path = sbx_xstrdup(path);
	return n;
}

/* ---- changes (shared by the operations and pmem_ext_*) ------------------- */

/* Make a new object at path.  *st (may be NULL) its attributes. */
static int make_locked(struct pmem *s, const char *path, mode_t mode,
		       dev_t rdev, const char *target, struct stat *st)
{
	struct pinode *dir, *in;
	const char *name;
	int rc = parent_locked(s, path, &dir, &name);

	if (rc < 0)
		return rc;
	if (dir_find(dir, name))
		return sbx_error_set(SBX_ERR_REMOTE, -EEXIST, "%s: file exists",
				     path);
	in = inode_new_locked(s, mode);
	in->rdev = rdev;
	if (target)
		in->target = sbx_xstrdup(target);
	dir_add_locked(s, dir, name, in);
	emit_locked(s, SBX_CHANGE_ENTRY, path);
	if (st)
		fill_stat(s, in, st);
	return 0;
}

static int link_locked(struct pmem *s, const char *from, const char *to,
		       struct stat *st)
{
	struct pinode *src, *dir;
	const char *name;
	int rc = walk_locked(s, from, &src);

	if (rc < 0)
		return rc;
	if (S_ISDIR(src->mode))
		return sbx_error_set(SBX_ERR_REMOTE, -EPERM,
				     "link %s: a directory", from);
	rc = parent_locked(s, to, &dir, &name);
	if (rc < 0)
		return rc;
	if (dir_find(dir, name))
		return sbx_error_set(SBX_ERR_REMOTE, -EEXIST, "%s: file exists",
				     to);
	src->nlink++;
	src->ctim = stamp_locked(s);
	dir_add_locked(s, dir, name, src);
	emit_locked(s, SBX_CHANGE_ENTRY, to);
	if (st)
		fill_stat(s, src, st);
	return 0;
}

static int remove_locked(struct pmem *s, const char *path, bool rmdir)
{
	struct pinode *dir, *in;
	struct pdirent *e;
	const char *name;
	int rc = parent_locked(s, path, &dir, &name);

	if (rc < 0)
		return rc;
	e = dir_find(dir, name);
	if (!e)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOENT,
				     "%s: no such file or directory", path);
	in = e->ino;
	if (rmdir && !S_ISDIR(in->mode))
		return sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				     "%s: not a directory", path);
	if (!rmdir && S_ISDIR(in->mode))
		return sbx_error_set(SBX_ERR_REMOTE, -EISDIR,
				     "%s: is a directory", path);
	if (rmdir && in->nents)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOTEMPTY,
				     "%s: directory not empty", path);
	dir_del_locked(s, dir, e);
	inode_drop_locked(s, in);
	emit_locked(s, SBX_CHANGE_ENTRY, path);
	return 0;
}

/* Is `in` a directory that contains `x` (at any depth, or is it)? */
static bool contains(const struct pinode *in, const struct pinode *x)
{
	if (in == x)
		return true;
	if (!S_ISDIR(in->mode))
		return false;
	for (size_t i = 0; i < in->nents; i++)
		if (contains(in->ents[i].ino, x))
			return true;
	return false;
}

static int rename_locked(struct pmem *s, const char *from, const char *to,
			 unsigned flags)
{
	struct pinode *fdir, *tdir, *src, *dst;
	struct pdirent *fe, *te;
	const char *fname, *tname;
	int rc;

	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE) ||
	    ((flags & RENAME_NOREPLACE) && (flags & RENAME_EXCHANGE)))
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "rename %s: flags 0x%x", from, flags);
	rc = parent_locked(s, from, &fdir, &fname);
	if (rc == 0)
		rc = parent_locked(s, to, &tdir, &tname);
	if (rc < 0)
		return rc;
	fe = dir_find(fdir, fname);
	if (!fe)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOENT,
				     "rename %s: no such file or directory",
				     from);
	src = fe->ino;
	te = dir_find(tdir, tname);
	dst = te ? te->ino : NULL;
	if (fe == te)
		return 0;
	if (flags & RENAME_EXCHANGE) {
		if (!dst)
			return sbx_error_set(SBX_ERR_REMOTE, -ENOENT,
					     "rename %s: no %s", from, to);
		if ((S_ISDIR(src->mode) && contains(src, tdir)) ||
		    (S_ISDIR(dst->mode) && contains(dst, fdir)))
			return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
					     "rename %s: into itself", from);
		fe->ino = dst;
		te->ino = src;
		if (fdir != tdir && S_ISDIR(src->mode) != S_ISDIR(dst->mode)) {
			/* A directory changed parents: ".." counts. */
			struct pinode *d = S_ISDIR(src->mode) ? tdir : fdir;
			struct pinode *o = d == tdir ? fdir : tdir;

			d->nlink++;
			o->nlink--;
		}
		src->ctim = dst->ctim = stamp_locked(s);
		fdir->mtim = fdir->ctim = tdir->mtim = tdir->ctim =
			stamp_locked(s);
		emit_locked(s, SBX_CHANGE_ENTRY, from);
		emit_locked(s, SBX_CHANGE_ENTRY, to);
		return 0;
	}
	if (dst && (flags & RENAME_NOREPLACE))
		return sbx_error_set(SBX_ERR_REMOTE, -EEXIST,
				     "rename %s: %s exists", from, to);
	if (S_ISDIR(src->mode) && contains(src, tdir))
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "rename %s: into itself", from);
	if (dst) {
		if (dst == src)
			return 0; /* two names of one file: a no-op */
		if (S_ISDIR(src->mode) && !S_ISDIR(dst->mode))
			return sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
					     "rename %s: %s not a directory",
					     from, to);
		if (!S_ISDIR(src->mode) && S_ISDIR(dst->mode))
			return sbx_error_set(SBX_ERR_REMOTE, -EISDIR,
					     "rename %s: %s is a directory",
					     from, to);
		if (S_ISDIR(dst->mode) && dst->nents)
			return sbx_error_set(SBX_ERR_REMOTE, -ENOTEMPTY,
					     "rename %s: %s not empty", from,
					     to);
		dir_del_locked(s, tdir, te);
		inode_drop_locked(s, dst);
	}
	/* Entries may have moved in memory: find the source again. */
	fe = dir_find(fdir, fname);
	dir_del_locked(s, fdir, fe);
	dir_add_locked(s, tdir, tname, src);
	src->ctim = stamp_locked(s);
	emit_locked(s, SBX_CHANGE_ENTRY, from);
	emit_locked(s, SBX_CHANGE_ENTRY, to);
	return 0;
}

/* The regular file at path, for content changes. */
static int regular_locked(struct pmem *s, const char *path,
			  struct pinode **out)
{
	int rc = walk_locked(s, path, out);

	if (rc == 0 && S_ISDIR((*out)->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EISDIR,
				   "%s: is a directory", path);
	else if (rc == 0 && !S_ISREG((*out)->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				   "%s: not a regular file", path);
	return rc;
}

static void resize(struct pinode *in, size_t size)
{
	if (size > in->cap) {
		size_t cap = in->cap ? in->cap : 4096;

		while (cap < size)
			cap *= 2;
		in->data = sbx_xrealloc(in->data, cap);
		in->cap = cap;
	}
	if (size > in->size)
		memset(in->data + in->size, 0, size - in->size);
	in->size = size;
}

static int truncate_locked(struct pmem *s, const char *path, off_t size)
{
	struct pinode *in;
	int rc;

	if (size < 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "truncate %s: size < 0", path);
	rc = regular_locked(s, path, &in);
	if (rc < 0)
		return rc;
	resize(in, (size_t)size);
	in->mtim = in->ctim = stamp_locked(s);
	emit_locked(s, SBX_CHANGE_DATA, path);
	return 0;
}

/* Write at off (append: at the end).  Returns the count. */
static ssize_t write_locked(struct pmem *s, const char *path,
			    const void *data, size_t len, off_t off,
			    bool append)
{
	struct pinode *in;
	int rc;

	if (off < 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "write %s: offset < 0", path);
	rc = regular_locked(s, path, &in);
	if (rc < 0)
		return rc;
	if (append)
		off = (off_t)in->size;
	if (len) {
		if ((size_t)off + len > in->size)
			resize(in, (size_t)off + len);
		memcpy(in->data + off, data, len);
	}
	in->mtim = in->ctim = stamp_locked(s);
	emit_locked(s, SBX_CHANGE_DATA, path);
	return (ssize_t)len;
}

static int setattr_locked(struct pmem *s, const char *path,
			  const struct stat *a, int valid, struct stat *out)
{
	struct pinode *in;
	struct timespec t;
	int rc = walk_locked(s, path, &in);

	if (rc < 0)
		return rc;
	if (valid & SBX_SET_SIZE) {
		rc = truncate_locked(s, path, a->st_size);
		if (rc < 0)
			return rc;
	}
	t = stamp_locked(s);
	if (valid & SBX_SET_MODE)
		in->mode = (in->mode & S_IFMT) | (a->st_mode & 07777);
	if (valid & SBX_SET_UID)
		in->uid = a->st_uid;
	if (valid & SBX_SET_GID)
		in->gid = a->st_gid;
	if (valid & SBX_SET_ATIME_NOW)
		in->atim = t;
	else if (valid & SBX_SET_ATIME)
		in->atim = a->st_atim;
	if (valid & SBX_SET_MTIME_NOW)
		in->mtim = t;
	else if (valid & SBX_SET_MTIME)
		in->mtim = a->st_mtim;
	if (valid & ~SBX_SET_SIZE) {
		in->ctim = t;
		emit_locked(s, SBX_CHANGE_ATTR, path);
	}
	if (out)
		fill_stat(s, in, out);
	return 0;
}

/* ---- data plane ---------------------------------------------------------- */

static struct sbx_node *m_root(struct sbx_sandbox *sb)
{
	return (struct sbx_node *)&PMEM(sb)->root_node;
}

static int m_node_at(struct sbx_sandbox *sb, const char *path,
		     struct sbx_node **out)
{
	struct pmem *s = PMEM(sb);
	char *p = NULL;
	int rc;

	*out = NULL;
	rc = enter(s, OP_NODE_AT, path);
	if (rc == 0)
		rc = clean(path, &p);
	if (rc < 0)
		return rc;
	if (!*p)
		*out = (struct sbx_node *)&s->root_node;
	else
		*out = (struct sbx_node *)node_new(p);
	free(p);
	return 0;
}

static int m_lookup(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node **out, struct stat *st)
{
	struct pmem *s = PMEM(sb);
	struct pinode *in;
	char *path;
	int rc;

	*out = NULL;
	rc = child(parent, name, &path);
	if (rc < 0)
		return rc;
	rc = enter(s, OP_LOOKUP, path);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = walk_locked(s, path, &in);
		if (rc == 0)
			fill_stat(s, in, st);
		pthread_mutex_unlock(&s->lock);
	}
	if (rc == 0)
		*out = (struct sbx_node *)node_new(path);
	free(path);
	return rc;
}

static void m_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	struct pmem *s = PMEM(sb);

	if (!node)
		return;
	(void)enter(s, OP_FORGET, PNODE(node)->path);
	sbx_error_clear();
	if (PNODE(node) == &s->root_node)
		return;
	free(PNODE(node)->path);
	free(node);
}

static int m_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	struct pinode *in;
	int rc = enter(s, OP_GETATTR, path);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = walk_locked(s, path, &in);
	if (rc == 0)
		fill_stat(s, in, st);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int m_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	int rc = enter(s, OP_SETATTR, path);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = setattr_locked(s, path, in, valid, out);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int m_readlink(struct sbx_sandbox *sb, struct sbx_node *node,
		      char *buf, size_t size)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	struct pinode *in;
	int rc = enter(s, OP_READLINK, path);
	size_t n;

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = walk_locked(s, path, &in);
	if (rc == 0 && !S_ISLNK(in->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				   "readlink %s: not a symlink", path);
	if (rc == 0) {
		n = strlen(in->target);
		if (n > size)
			n = size;
		memcpy(buf, in->target, n);
		rc = (int)n;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* mknod/mkdir/symlink: make path, hand out a node. */
static int make_op(struct pmem *s, enum op op, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   const char *target, struct sbx_node **out, struct stat *st)
{
	char *path;
	int rc;

	*out = NULL;
	rc = child(parent, name, &path);
	if (rc < 0)
		return rc;
	rc = enter(s, op, path);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = make_locked(s, path, mode, rdev, target, st);
		pthread_mutex_unlock(&s->lock);
	}
	if (rc == 0)
		*out = (struct sbx_node *)node_new(path);
	free(path);
	return rc;
}

static int m_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   struct sbx_node **out, struct stat *st)
{
	if (S_ISDIR(mode) || S_ISLNK(mode)) {
		*out = NULL;
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "mknod %s: bad type", name);
	}
	if (!(mode & S_IFMT))
		mode |= S_IFREG;
	return make_op(PMEM(sb), OP_MKNOD, parent, name, mode, rdev, NULL,
		       out, st);
}

static int m_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, struct sbx_node **out,
		   struct stat *st)
{
	return make_op(PMEM(sb), OP_MKDIR, parent, name,
		       S_IFDIR | (mode & 07777), 0, NULL, out, st);
}

static int m_symlink(struct sbx_sandbox *sb, const char *target,
		     struct sbx_node *parent, const char *name,
		     struct sbx_node **out, struct stat *st)
{
	return make_op(PMEM(sb), OP_SYMLINK, parent, name, S_IFLNK | 0777, 0,
		       target, out, st);
}

static int m_link(struct sbx_sandbox *sb, struct sbx_node *node,
		  struct sbx_node *newparent, const char *newname,
		  struct sbx_node **out, struct stat *st)
{
	struct pmem *s = PMEM(sb);
	char *path;
	int rc;

	*out = NULL;
	rc = child(newparent, newname, &path);
	if (rc < 0)
		return rc;
	rc = enter(s, OP_LINK, path);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = link_locked(s, PNODE(node)->path, path, st);
		pthread_mutex_unlock(&s->lock);
	}
	if (rc == 0)
		*out = (struct sbx_node *)node_new(path);
	free(path);
	return rc;
}

static int remove_op(struct pmem *s, enum op op, struct sbx_node *parent,
		     const char *name)
{
	char *path;
	int rc = child(parent, name, &path);

	if (rc < 0)
		return rc;
	rc = enter(s, op, path);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = remove_locked(s, path, op == OP_RMDIR);
		pthread_mutex_unlock(&s->lock);
	}
	free(path);
	return rc;
}

static int m_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name)
{
	return remove_op(PMEM(sb), OP_UNLINK, parent, name);
}

static int m_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name)
{
	return remove_op(PMEM(sb), OP_RMDIR, parent, name);
}

static int m_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node *newparent,
		    const char *newname, unsigned flags)
{
	struct pmem *s = PMEM(sb);
	char *from = NULL, *to = NULL;
	int rc = child(parent, name, &from);

	if (rc == 0)
		rc = child(newparent, newname, &to);
	if (rc == 0)
		rc = enter(s, OP_RENAME, from);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = rename_locked(s, from, to, flags);
		pthread_mutex_unlock(&s->lock);
	}
	free(from);
	free(to);
	return rc;
}

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

/* Open the object at path: checks, O_TRUNC.  Caller holds s->lock. */
static int open_locked(struct pmem *s, const char *path, int flags)
{
	struct pinode *in;
	int rc = walk_locked(s, path, &in);

	if (rc < 0)
		return rc;
	if (S_ISDIR(in->mode) && writable(flags))
		return sbx_error_set(SBX_ERR_REMOTE, -EISDIR,
				     "open %s: is a directory", path);
	if ((flags & O_TRUNC) && writable(flags) && S_ISREG(in->mode))
		rc = truncate_locked(s, path, 0);
	return rc;
}

static int m_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		  struct sbx_open_result *out)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = enter(s, OP_OPEN, path);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = open_locked(s, path, flags);
	pthread_mutex_unlock(&s->lock);
	if (rc == 0)
		out->fh = (struct sbx_file *)file_new(path, flags);
	return rc;
}

static int m_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, mode_t mode, int flags,
		    struct sbx_node **node_out, struct stat *st,
		    struct sbx_open_result *out)
{
	struct pmem *s = PMEM(sb);
	struct pinode *in;
	char *path;
	int rc;

	*node_out = NULL;
	memset(out, 0, sizeof(*out));
	rc = child(parent, name, &path);
	if (rc < 0)
		return rc;
	rc = enter(s, OP_CREATE, path);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = walk_locked(s, path, &in);
		if (rc == 0 && (flags & O_EXCL)) {
			rc = sbx_error_set(SBX_ERR_REMOTE, -EEXIST,
					   "%s: file exists", path);
		} else if (rc == 0) {
			rc = open_locked(s, path, flags);
		} else if (rc == -ENOENT) {
			sbx_error_clear();
			rc = make_locked(s, path, S_IFREG | (mode & 07777), 0,
					 NULL, NULL);
		}
		if (rc == 0) {
			walk_locked(s, path, &in);
			fill_stat(s, in, st);
		}
		pthread_mutex_unlock(&s->lock);
	}
	if (rc == 0) {
		*node_out = (struct sbx_node *)node_new(path);
		out->fh = (struct sbx_file *)file_new(path, flags);
	}
	free(path);
	return rc;
}

static ssize_t m_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		      size_t size, off_t off)
{
	struct pmem *s = PMEM(sb);
	struct pfile *f = PFILE(fh);
	struct pinode *in;
	ssize_t n = 0;
	int rc = enter(s, OP_READ, f->path);

	if (rc < 0)
		return rc;
	if (off < 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "read %s: offset < 0", f->path);
	pthread_mutex_lock(&s->lock);
	rc = regular_locked(s, f->path, &in);
	if (rc == 0 && (size_t)off < in->size) {
		n = (ssize_t)(in->size - (size_t)off < size
				      ? in->size - (size_t)off
				      : size);
		memcpy(buf, in->data + off, (size_t)n);
	}
	pthread_mutex_unlock(&s->lock);
	return rc < 0 ? rc : n;
}

static ssize_t m_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *buf, size_t size, off_t off)
{
	struct pmem *s = PMEM(sb);
	struct pfile *f = PFILE(fh);
	int rc = enter(s, OP_WRITE, f->path);
	ssize_t n;

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	n = write_locked(s, f->path, buf, size, off, f->flags & O_APPEND);
	pthread_mutex_unlock(&s->lock);
	return n;
}

static int m_flush(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	return enter(PMEM(sb), OP_FLUSH, PFILE(fh)->path);
}

/* fsync/fsyncdir: the path must still be there (the agent opens it). */
static int sync_path(struct pmem *s, enum op op, const char *path)
{
	struct pinode *in;
	int rc = enter(s, op, path);

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = walk_locked(s, path, &in);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static int m_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	return sync_path(PMEM(sb), OP_FSYNC, PFILE(fh)->path);
}

static int m_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	int rc = enter(PMEM(sb), OP_RELEASE, PFILE(fh)->path);

	file_free(PFILE(fh));
	return rc;
}

static int m_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		       off_t off, off_t len)
{
	struct pmem *s = PMEM(sb);
	struct pfile *f = PFILE(fh);
	struct pinode *in;
	int rc = enter(s, OP_FALLOCATE, f->path);

	if (rc < 0)
		return rc;
	if (mode != 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP,
				     "fallocate %s: mode %d", f->path, mode);
	if (off < 0 || len <= 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "fallocate %s: bad range", f->path);
	pthread_mutex_lock(&s->lock);
	rc = regular_locked(s, f->path, &in);
	if (rc == 0 && (size_t)(off + len) > in->size) {
		resize(in, (size_t)(off + len));
		in->mtim = in->ctim = stamp_locked(s);
		emit_locked(s, SBX_CHANGE_DATA, f->path);
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

static off_t m_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		     int whence)
{
	struct pmem *s = PMEM(sb);
	struct pfile *f = PFILE(fh);
	struct pinode *in;
	off_t r = 0;
	int rc = enter(s, OP_LSEEK, f->path);

	if (rc < 0)
		return rc;
	if (whence != SEEK_DATA && whence != SEEK_HOLE)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "lseek %s: whence %d", f->path, whence);
	pthread_mutex_lock(&s->lock);
	rc = regular_locked(s, f->path, &in);
	if (rc == 0) {
		if (off < 0 || (size_t)off >= in->size)
			rc = sbx_error_set(SBX_ERR_REMOTE, -ENXIO,
					   "lseek %s: past the end", f->path);
		else
			r = whence == SEEK_DATA ? off : (off_t)in->size;
	}
	pthread_mutex_unlock(&s->lock);
	return rc < 0 ? rc : r;
}

static int m_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file **out)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	struct pinode *in;
	struct pfile *f;
	int rc;

	*out = NULL;
	rc = enter(s, OP_OPENDIR, path);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = walk_locked(s, path, &in);
	if (rc == 0 && !S_ISDIR(in->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				   "opendir %s: not a directory", path);
	pthread_mutex_unlock(&s->lock);
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
	int rc = walk_locked(s, d->path, &in);

	if (rc == 0 && !S_ISDIR(in->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				   "readdir %s: not a directory", d->path);
	if (rc < 0)
		return rc;
	upath = slash ? sbx_xstrndup(d->path, (size_t)(slash - d->path))
		      : sbx_xstrdup("");
	if (walk_locked(s, upath, &up) < 0) {
		sbx_error_clear();
		up = in;
	}
	free(upath);
	snap_clear(d);
	d->snap = sbx_xcalloc(in->nents + 2, sizeof(*d->snap));
	d->snap[0].name = sbx_xstrdup(".");
	fill_stat(s, in, &d->snap[0].st);
	d->snap[1].name = sbx_xstrdup("..");
	fill_stat(s, up, &d->snap[1].st);
	for (size_t i = 0; i < in->nents; i++) {
		struct psnap *e = &d->snap[i + 2];

		e->name = sbx_xstrdup(in->ents[i].name);
		fill_stat(s, in->ents[i].ino, &e->st);
		e->path = sbx_proto_path_join(d->path, e->name);
	}
	d->nsnap = in->nents + 2;
	d->fetched = true;
	return 0;
}

static int m_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		     unsigned flags, sbx_dirent_cb cb, void *payload)
{
	struct pmem *s = PMEM(sb);
	struct pfile *d = PFILE(dh);
	int rc = enter(s, OP_READDIR, d->path);

	if (rc < 0)
		return rc;
	if (!d->is_dir)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOTDIR,
				     "readdir %s: not a directory", d->path);
	if (!d->fetched || off == 0) {
		pthread_mutex_lock(&s->lock);
		rc = snapshot_locked(s, d);
		pthread_mutex_unlock(&s->lock);
		if (rc < 0)
			return rc;
	}
	for (size_t i = off > 0 ? (size_t)off : 0; i < d->nsnap; i++) {
		struct psnap *e = &d->snap[i];
		struct sbx_node *node = NULL;

		if ((flags & SBX_READDIR_PLUS) && e->path)
			node = (struct sbx_node *)node_new(e->path);
		if (cb(e->name, &e->st, node, (off_t)i + 1, payload) != 0) {
			if (node) {
				free(PNODE(node)->path);
				free(node);
			}
			break;
		}
	}
	return 0;
}

static int m_fsyncdir(struct sbx_sandbox *sb, struct sbx_file *dh,
		      bool datasync)
{
	return sync_path(PMEM(sb), OP_FSYNCDIR, PFILE(dh)->path);
}

static int m_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	int rc = enter(PMEM(sb), OP_RELEASEDIR, PFILE(dh)->path);

	file_free(PFILE(dh));
	return rc;
}

static int m_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct statvfs *out)
{
	struct pmem *s = PMEM(sb);
	unsigned long used = 0, files = 0;
	int rc = enter(s, OP_STATFS, PNODE(node)->path);

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

static int m_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		       char **out)
{
	struct pmem *s = PMEM(sb);
	const char *path = PNODE(node)->path;
	int rc;

	*out = NULL;
	rc = enter(s, OP_NODE_PATH, path);
	if (rc < 0)
		return rc;
	*out = *path ? sbx_xasprintf("%s/%s", s->base.workdir, path)
		     : sbx_xstrdup(s->base.workdir);
	return 0;
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
	int rc = walk_locked(s, dir, &root);

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
		fill_stat(s, in, &b->it.st);
		b->ents = sbx_xcalloc(in->nents ? in->nents : 1,
				      sizeof(*b->ents));
		for (size_t i = 0; i < in->nents; i++) {
			b->ents[i].name = sbx_xstrdup(in->ents[i].name);
			fill_stat(s, in->ents[i].ino, &b->ents[i].st);
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
				struct bitem *f = bitem_add(w);

				f->path = kp;
				f->it.kind = SBX_BULK_FILE;
				f->it.path = kp;
				fill_stat(s, k, &f->it.st);
				f->data = sbx_xmalloc(k->size ? k->size : 1);
				if (k->size)
					memcpy(f->data, k->data, k->size);
				f->it.data = f->data;
				f->it.len = k->size;
				w->total += k->size;
				continue;
			}
			free(kp);
		}
	}
	free(q);
	return 0;
}

static int m_bulk(struct sbx_sandbox *sb, const char *dir,
		  const struct sbx_bulk_opts *o, sbx_bulk_cb cb, void *payload)
{
	struct pmem *s = PMEM(sb);
	struct bwalk w = {0};
	char *p = NULL;
	int rc = enter(s, OP_BULK, dir);

	if (rc == 0)
		rc = clean(dir, &p);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	rc = bulk_collect_locked(s, p, o, &w);
	pthread_mutex_unlock(&s->lock);
	for (size_t i = 0; rc == 0 && i < w.n; i++)
		rc = cb(&w.items[i].it, payload);
	bwalk_fini(&w);
	free(p);
	return rc;
}

static int m_syncfs(struct sbx_sandbox *sb)
{
	return enter(PMEM(sb), OP_SYNCFS, "");
}

/* ---- watch --------------------------------------------------------------- */

static int m_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			 void *payload)
{
	struct pmem *s = PMEM(sb);
	int rc = enter(s, OP_WATCH_START, "");

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	if (s->watching) {
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_REMOTE, -EBUSY,
				     "the change stream is already on");
	}
	s->cb = cb;
	s->cb_payload = payload;
	s->stopping = false;
	__atomic_store_n(&s->watching, true, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&s->lock);
	rc = pthread_create(&s->thread, NULL, watch_thread, s);
	if (rc != 0) {
		pthread_mutex_lock(&s->lock);
		__atomic_store_n(&s->watching, false, __ATOMIC_RELEASE);
		s->cb = NULL;
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_OS, -rc,
				     "cannot start the watch thread");
	}
	return 0;
}

static int m_watch_sync(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);
	uint64_t upto;
	int rc = enter(s, OP_WATCH_SYNC, "");

	if (rc < 0)
		return rc;
	pthread_mutex_lock(&s->lock);
	upto = s->seq;
	if (!s->watching) {
		pthread_mutex_unlock(&s->lock);
		return sbx_error_set(SBX_ERR_REMOTE, -EIO,
				     "the change stream is off");
	}
	pthread_mutex_unlock(&s->lock);
	/* Whatever the thread took is delivered once we hold this. */
	pthread_mutex_lock(&s->deliver);
	deliver_upto(s, upto);
	pthread_mutex_unlock(&s->deliver);
	return 0;
}

static void stop(struct pmem *s)
{
	bool joining;

	pthread_mutex_lock(&s->lock);
	joining = s->watching;
	s->stopping = true;
	pthread_cond_broadcast(&s->ev_cond);
	pthread_mutex_unlock(&s->lock);
	if (joining)
		pthread_join(s->thread, NULL);
	pthread_mutex_lock(&s->lock);
	while (s->ev_head) {
		struct pevent *e = s->ev_head;

		s->ev_head = e->next;
		event_free(e);
	}
	s->ev_tail = NULL;
	s->ev_count = 0;
	__atomic_store_n(&s->watching, false, __ATOMIC_RELEASE);
	s->cb = NULL;
	s->cb_payload = NULL;
	pthread_mutex_unlock(&s->lock);
}

static void m_watch_stop(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	(void)enter(s, OP_WATCH_STOP, "");
	sbx_error_clear();
	stop(s);
}

static bool m_watch_healthy(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	return __atomic_load_n(&s->watching, __ATOMIC_ACQUIRE) &&
	       __atomic_load_n(&s->healthy, __ATOMIC_ACQUIRE);
}

static void m_free(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	if (!s)
		return;
	stop(s);
	pthread_mutex_lock(&s->lock);
	if (s->gate_parked) {
		s->gate_open = true;
		pthread_cond_broadcast(&s->gate_cond);
		while (s->gate_parked)
			pthread_cond_wait(&s->gate_cond, &s->lock);
	}
	pthread_mutex_unlock(&s->lock);
	for (size_t i = 0; i < s->itab_cap; i++)
		if (s->itab[i])
			inode_free(s->itab[i]);
	free(s->itab);
	free(s->gate_path);
	free(s->root_node.path);
	free(s->base.session);
	free(s->base.workdir);
	pthread_mutex_destroy(&s->lock);
	pthread_mutex_destroy(&s->deliver);
	pthread_cond_destroy(&s->ev_cond);
	pthread_cond_destroy(&s->gate_cond);
	free(s);
}

static const struct sbx_sandbox_ops pmem_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.root = m_root,
	.lookup = m_lookup,
	.forget = m_forget,
	.getattr = m_getattr,
	.setattr = m_setattr,
	.readlink = m_readlink,
	.mknod = m_mknod,
	.mkdir = m_mkdir,
	.symlink = m_symlink,
	.link = m_link,
	.unlink = m_unlink,
	.rmdir = m_rmdir,
	.rename = m_rename,
	.open = m_open,
	.create = m_create,
	.read = m_read,
	.write = m_write,
	.flush = m_flush,
	.fsync = m_fsync,
	.release = m_release,
	.fallocate = m_fallocate,
	.lseek = m_lseek,
	.opendir = m_opendir,
	.readdir = m_readdir,
	.fsyncdir = m_fsyncdir,
	.releasedir = m_releasedir,
	.statfs = m_statfs,
	.node_path = m_node_path,
	.watch_start = m_watch_start,
	.watch_sync = m_watch_sync,
	.watch_stop = m_watch_stop,
	.bulk = m_bulk,
	.syncfs = m_syncfs,
	.node_at = m_node_at,
	.watch_healthy = m_watch_healthy,
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
	s->itab_cap = 64;
	s->itab = sbx_xcalloc(s->itab_cap, sizeof(*s->itab));
	s->next_ino = ROOT_INO;
	s->gate_op = -1;
	s->healthy = true;
	pthread_mutex_init(&s->lock, NULL);
	pthread_mutex_init(&s->deliver, NULL);
	pthread_cond_init(&s->ev_cond, NULL);
	pthread_cond_init(&s->gate_cond, NULL);
	root = inode_new_locked(s, S_IFDIR | 0755);
	if (root->ino != ROOT_INO)
		abort();
	*out = &s->base;
	return 0;
}

/* ---- behind the mount ---------------------------------------------------- */

/* Run `body` (an int expression using `p`, the clean path) under s->lock. */
#define EXT(sb, path, body)                                                    \
	({                                                                     \
		struct pmem *s_ = PMEM(sb);                                    \
		char *p = NULL;                                                \
		int r_ = clean(path, &p);                                      \
		if (r_ == 0) {                                                 \
			pthread_mutex_lock(&s_->lock);                         \
			r_ = (body);                                           \
			pthread_mutex_unlock(&s_->lock);                       \
		}                                                              \
		free(p);                                                       \
		r_;                                                            \
	})

static int ext_pwrite_locked(struct pmem *s, const char *path,
			     const void *data, size_t len, off_t off)
{
	ssize_t n = write_locked(s, path, data, len, off, false);

	return n < 0 ? (int)n : 0;
}

/* open(O_CREAT|O_TRUNC) + write.  Caller holds s->lock. */
static int ext_write_locked(struct pmem *s, const char *path,
			    const void *data, size_t len)
{
	struct pinode *in;
	int rc = walk_locked(s, path, &in);

	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = make_locked(s, path, S_IFREG | 0644, 0, NULL, NULL);
	} else if (rc == 0) {
		rc = truncate_locked(s, path, 0);
	}
	if (rc == 0)
		rc = ext_pwrite_locked(s, path, data, len, 0);
	return rc;
}

int pmem_ext_write(struct sbx_sandbox *sb, const char *path, const void *data,
		   size_t len)
{
	return EXT(sb, path, ext_write_locked(s_, p, data, len));
}

int pmem_ext_pwrite(struct sbx_sandbox *sb, const char *path,
		    const void *data, size_t len, off_t off)
{
	return EXT(sb, path, ext_pwrite_locked(s_, p, data, len, off));
}

int pmem_ext_truncate(struct sbx_sandbox *sb, const char *path, off_t size)
{
	return EXT(sb, path, truncate_locked(s_, p, size));
}

int pmem_ext_chmod(struct sbx_sandbox *sb, const char *path, mode_t mode)
{
	struct stat a = {.st_mode = mode};

	return EXT(sb, path, setattr_locked(s_, p, &a, SBX_SET_MODE, NULL));
}

int pmem_ext_mkdir(struct sbx_sandbox *sb, const char *path, mode_t mode)
{
	return EXT(sb, path,
		   make_locked(s_, p, S_IFDIR | (mode & 07777), 0, NULL,
			       NULL));
}

int pmem_ext_symlink(struct sbx_sandbox *sb, const char *target,
		     const char *path)
{
	return EXT(sb, path,
		   make_locked(s_, p, S_IFLNK | 0777, 0, target, NULL));
}

int pmem_ext_unlink(struct sbx_sandbox *sb, const char *path)
{
	return EXT(sb, path, remove_locked(s_, p, false));
}

int pmem_ext_rmdir(struct sbx_sandbox *sb, const char *path)
{
	return EXT(sb, path, remove_locked(s_, p, true));
}

/* Two paths: clean both, then run under the lock. */
static int ext2(struct sbx_sandbox *sb, const char *from, const char *to,
		bool link, unsigned flags)
{
	struct pmem *s = PMEM(sb);
	char *f = NULL, *t = NULL;
	int rc = clean(from, &f);

	if (rc == 0)
		rc = clean(to, &t);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = link ? link_locked(s, f, t, NULL)
			  : rename_locked(s, f, t, flags);
		pthread_mutex_unlock(&s->lock);
	}
	free(f);
	free(t);
	return rc;
}

int pmem_ext_link(struct sbx_sandbox *sb, const char *from, const char *to)
{
	return ext2(sb, from, to, true, 0);
}

int pmem_ext_rename(struct sbx_sandbox *sb, const char *from, const char *to,
		    unsigned flags)
{
	return ext2(sb, from, to, false, flags);
}

void pmem_ext_overflow(struct sbx_sandbox *sb)
{
	struct pmem *s = PMEM(sb);

	pthread_mutex_lock(&s->lock);
	emit_locked(s, SBX_CHANGE_OVERFLOW, NULL);
	pthread_mutex_unlock(&s->lock);
}

static int ext_read_locked(struct pmem *s, const char *path, void *buf,
			   size_t size, size_t *len)
{
	struct pinode *in;
	int rc = regular_locked(s, path, &in);

	*len = 0;
	if (rc < 0)
		return rc;
	*len = in->size < size ? in->size : size;
	if (*len)
		memcpy(buf, in->data, *len);
	return 0;
}

int pmem_ext_read(struct sbx_sandbox *sb, const char *path, void *buf,
		  size_t size, size_t *len)
{
	*len = 0;
	return EXT(sb, path, ext_read_locked(s_, p, buf, size, len));
}

static int ext_stat_locked(struct pmem *s, const char *path, struct stat *st)
{
	struct pinode *in;
	int rc = walk_locked(s, path, &in);

	if (rc == 0)
		fill_stat(s, in, st);
	return rc;
}

int pmem_ext_stat(struct sbx_sandbox *sb, const char *path, struct stat *st)
{
	return EXT(sb, path, ext_stat_locked(s_, p, st));
}
