/*
 * The caching layer over a path-based sandbox; see cache.h.
 *
 * The tree.  Every path the daemon has seen is a `struct cnode` in a tree
 * mirroring the sandbox (parent + name; the path is derived, so a rename
 * through the mount moves a whole subtree at once).  A child slot is in one
 * of three states: PRESENT (attributes cached, maybe stale), ABSENT (a
 * negative entry) or UNKNOWN (a change was reported: ask again).  A
 * directory whose listing is `complete` answers lookups of names it does
 * not hold as ENOENT without asking.  Nodes are never freed while the cache
 * lives (a repository's worth of paths is small); the memory of contents is
 * bounded and spills to disk.
 *
 * Lock: c->lock protects everything in the tree and the content LRU.  It is
 * dropped around every call into the wrapped sandbox.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "cache.h"

/* Without a healthy change stream, cached data is trusted this long. */
#define CACHE_BLIND_TTL 1.0
/* Files up to this size are fetched whole on first read and kept. */
#define CACHE_WHOLE_FILE (1u << 20)
/* Memory for cached contents; beyond it, least recently used spill. */
#define CACHE_MEM_BUDGET (256u << 20)
/* Contents at least this large spill to disk instead of being dropped. */
#define CACHE_DISK_MIN (64u << 10)
/* Buffered writes per open file before they are pushed. */
#define CACHE_WRITE_BUF (4u << 20)
/* Prefetch: content for files up to max_file, total max_total. */
#define PREFETCH_MAX_FILE (64u << 10)
#define PREFETCH_MAX_TOTAL (32u << 20)

enum slot { S_UNKNOWN = 0, S_PRESENT, S_ABSENT };

struct content {
	void *data;     /* NULL when spilled to disk */
	size_t len;
	bool on_disk;
	/* What it was read from: valid while the attributes still say so. */
	ino_t ino;
	off_t size;
	struct timespec mtime;
	struct content *lru_prev, *lru_next; /* contents held in memory */
};

struct cnode {
	struct cnode *parent; /* NULL for the root */
	char *name;           /* NULL for the root */
	enum slot slot;
	bool orphan;          /* replaced by a rename: no path any more */

	struct stat st;
	bool st_valid;
	double st_time;       /* when st was fetched (monotonic) */

	char *link;           /* symlink target, valid with st */

	/* Directories. */
	struct cnode **kids;  /* hash buckets by name */
	size_t nbuckets, nkids;
	struct cnode *hnext;  /* bucket chain in the parent */
	bool complete;        /* every name is a kid (some UNKNOWN maybe) */
	double list_time;
	bool prefetched;      /* a bulk walk covered this directory */
	bool prefetching;

	struct content *content;
	unsigned dirty;       /* open files with unpushed writes */
	unsigned opens;       /* open files */
	unsigned active;      /* open files with no FLUSH since (a hint) */
	bool hidden;          /* a silly-renamed file: never listed */

	/* Hard links: other names of the same file, in a ring. */
	struct cnode *alias;
	struct cnode *ino_next; /* chain in cache->ino_tab */
};

struct cfile {
	struct cnode *node;
	struct sbx_file *inner; /* opened lazily */
	struct sbx_node *inner_node;
	int flags;
	/*
	 * Serialises writes and pushes of this file: the kernel sends
	 * write-back of several pages of one file from several threads.
	 */
	pthread_mutex_t wlock;
	pthread_mutex_t olock;  /* serialises open_inner() */
	bool flushed;           /* closed (FLUSH seen) and not used since */
	/* One contiguous extent of unpushed writes. */
	char *buf;
	size_t buf_len;
	off_t buf_off;
	struct cfile *dnext, *dprev; /* list of files with dirty data */
	/* Directory handles: a snapshot of the listing. */
	bool is_dir;
	char **names;
	struct stat *sts;
	struct cnode **nodes;
	size_t n;
};

struct cache {
	struct sbx_sandbox base;
	struct sbx_sandbox *inner;
	struct cnode root;
	pthread_mutex_t lock;
	pthread_cond_t cond;      /* prefetch completion, last RELEASE */
	bool watching;
	sbx_change_cb cb;
	void *cb_payload;
	struct content *lru_head, *lru_tail; /* most recent first */
	size_t mem_bytes;
	char *disk_dir;
	unsigned long disk_seq;
	struct cfile *dirty;      /* files with buffered writes */
	struct cnode *ino_tab[256]; /* multi-link files by ino */
	struct expect *expect;    /* entry events our own calls will cause */
	/*
	 * Count of change events applied.  A fetch that sees it move while
	 * its request was out may hold data from before the change: it is
	 * returned but not trusted as cached (not fresh, not complete).
	 */
	unsigned long events;
	unsigned long silly_seq;
};

/*
 * An entry event our own call through the mount will cause.  The cache and
 * the kernel already know of that change, so the event is dropped instead
 * of making the name UNKNOWN (which would cost a round trip on the next
 * lookup).  Registered before the call, cancelled if it fails.
 */
struct expect {
	struct expect *next;
	char path[];
};

/* Hidden names of open files removed through the mount (silly_rename). */
#define SILLY_PREFIX ".sbx-silly."
/* How long an unlink waits for the RELEASE that follows a close. */
#define RELEASE_WAIT_MS 100

struct cache;
struct cnode;
static void unlink_hidden_locked(struct cache *c, struct cnode *n);
struct sbx_change;
static void apply_change(struct cache *c, const struct sbx_change *ch);

static bool is_silly(const char *name)
{
	return strncmp(name, SILLY_PREFIX, sizeof(SILLY_PREFIX) - 1) == 0;
}

#define CACHE(sb) ((struct cache *)(sb))
#define CNODE(n) ((struct cnode *)(n))
#define CFILE(f) ((struct cfile *)(f))

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static bool healthy(struct cache *c)
{
	if (!c->watching)
		return false;
	return !c->inner->ops->watch_healthy ||
	       c->inner->ops->watch_healthy(c->inner);
}

/* Caller holds c->lock. */
static bool fresh(struct cache *c, double t)
{
	return healthy(c) || now() - t < CACHE_BLIND_TTL;
}

/* ---- tree ---------------------------------------------------------------- */

static size_t name_hash(const char *s, size_t nb)
{
	size_t h = 5381;

	while (*s)
		h = h * 33 + (unsigned char)*s++;
	return h & (nb - 1);
}

static struct cnode *kid_find(struct cnode *dir, const char *name)
{
	struct cnode *k;

	if (!dir->nbuckets)
		return NULL;
	for (k = dir->kids[name_hash(name, dir->nbuckets)]; k; k = k->hnext)
		if (strcmp(k->name, name) == 0)
			return k;
	return NULL;
}

static void kid_link(struct cnode *dir, struct cnode *k)
{
	size_t h;

	if (dir->nkids >= dir->nbuckets) {
		size_t nb = dir->nbuckets ? dir->nbuckets * 2 : 16;
		struct cnode **nk = sbx_xcalloc(nb, sizeof(*nk));

		for (size_t i = 0; i < dir->nbuckets; i++) {
			struct cnode *x = dir->kids[i], *next;

			for (; x; x = next) {
				next = x->hnext;
				h = name_hash(x->name, nb);
				x->hnext = nk[h];
				nk[h] = x;
			}
		}
		free(dir->kids);
		dir->kids = nk;
		dir->nbuckets = nb;
	}
	h = name_hash(k->name, dir->nbuckets);
	k->hnext = dir->kids[h];
	dir->kids[h] = k;
	k->parent = dir;
	dir->nkids++;
}

static void kid_unlink(struct cnode *dir, struct cnode *k)
{
	struct cnode **pp = &dir->kids[name_hash(k->name, dir->nbuckets)];

	while (*pp && *pp != k)
		pp = &(*pp)->hnext;
	if (*pp) {
		*pp = k->hnext;
		dir->nkids--;
	}
	k->hnext = NULL;
}

/* The child `name` of dir, created UNKNOWN if missing. */
static struct cnode *kid_get(struct cnode *dir, const char *name)
{
	struct cnode *k = kid_find(dir, name);

	if (!k) {
		k = sbx_xcalloc(1, sizeof(*k));
		k->name = sbx_xstrdup(name);
		kid_link(dir, k);
	}
	return k;
}

static void ring_remove(struct cache *c, struct cnode *n)
{
	struct cnode **pp = &c->ino_tab[n->st.st_ino & 255];
	struct cnode *next = n->alias;

	while (*pp && *pp != n)
		pp = &(*pp)->ino_next;
	if (*pp) {
		/* Keep the ring findable through another member. */
		if (next) {
			next->ino_next = n->ino_next;
			*pp = next;
		} else {
			*pp = n->ino_next;
		}
	}
	n->ino_next = NULL;
	if (next) {
		struct cnode *prev = next;

		while (prev->alias != n)
			prev = prev->alias;
		prev->alias = prev == next ? NULL : next;
		n->alias = NULL;
	}
}

/*
 * Files with several names share one kernel inode (the daemon dedups by
 * inode number) but are separate nodes here, one per name.  Tie them in a
 * ring so that an operation on the inode can use any name still present.
 */
static void ring_join(struct cache *c, struct cnode *n)
{
	struct cnode *o;

	for (o = c->ino_tab[n->st.st_ino & 255]; o; o = o->ino_next)
		if (o->st.st_ino == n->st.st_ino && o != n)
			break;
	if (!o) {
		n->ino_next = c->ino_tab[n->st.st_ino & 255];
		c->ino_tab[n->st.st_ino & 255] = n;
		return;
	}
	for (struct cnode *x = o->alias; x && x != o; x = x->alias)
		if (x == n)
			return; /* already in the ring */
	n->alias = o->alias ? o->alias : o;
	o->alias = n;
}

/*
 * Record attributes for n.  They were fetched under n's own name (a lookup,
 * a listing, a creation), so n is present; see refresh_st for attributes
 * fetched through path_of, possibly under another name.
 */
static void set_st(struct cache *c, struct cnode *n, const struct stat *st)
{
	/* A changed identity or type means another object: drop caches. */
	if (n->st_valid && (n->st.st_ino != st->st_ino ||
			    (n->st.st_mode & S_IFMT) != (st->st_mode & S_IFMT))) {
		free(n->link);
		n->link = NULL;
		n->complete = false;
		if (n->alias || n->ino_next)
			ring_remove(c, n);
	}
	n->st = *st;
	n->st_valid = true;
	n->st_time = now();
	n->slot = S_PRESENT;
	if (S_ISREG(st->st_mode) && st->st_nlink > 1)
		ring_join(c, n);
}

/* Attributes fetched through path_of(n): they say nothing of n's name. */
static void refresh_st(struct cache *c, struct cnode *n, const struct stat *st)
{
	enum slot was = n->slot;

	set_st(c, n, st);
	if (was == S_ABSENT)
		n->slot = S_ABSENT;
}

/* Path of n in the tree relative to the root, malloc'd; NULL for an
 * orphan. */
static char *tree_path(struct cnode *n)
{
	size_t len = 0, pos;
	struct cnode *x;
	char *p;

	for (x = n; x->parent; x = x->parent) {
		if (x->orphan)
			return NULL;
		len += strlen(x->name) + 1;
	}
	if (x->orphan)
		return NULL;
	p = sbx_xmalloc(len + 1);
	pos = len;
	p[pos] = '\0';
	for (x = n; x->parent; x = x->parent) {
		size_t l = strlen(x->name);

		pos -= l;
		memcpy(p + pos, x->name, l);
		if (pos > 0)
			p[--pos] = '/';
	}
	/* The loop leaves one leading separator slot for nested paths. */
	if (len > 0 && p[0] == '/')
		memmove(p, p + 1, len);
	return p;
}

/*
 * The path to use for operations on n: its own name while present, else
 * another name of the same file (hard links), else its own (the sandbox
 * will answer ENOENT).  NULL when n has no path at all.
 */
static char *path_of(struct cnode *n)
{
	char *p;

	if (n->slot != S_ABSENT && (p = tree_path(n)))
		return p;
	for (struct cnode *a = n->alias; a && a != n; a = a->alias)
		if (a->slot != S_ABSENT && (p = tree_path(a)))
			return p;
	return tree_path(n);
}

static char *child_path(struct cnode *dir, const char *name)
{
	char *dp = path_of(dir), *p;

	if (!dp)
		return NULL;
	p = *dp ? sbx_xasprintf("%s/%s", dp, name) : sbx_xstrdup(name);
	free(dp);
	return p;
}

/* Find the node of a path without creating anything (NULL when absent). */
static struct cnode *resolve(struct cache *c, const char *path, bool create)
{
	struct cnode *n = &c->root;
	char *copy = sbx_xstrdup(path), *save = NULL, *part;

	for (part = strtok_r(copy, "/", &save); part && n;
	     part = strtok_r(NULL, "/", &save))
		n = create ? kid_get(n, part) : kid_find(n, part);
	free(copy);
	return n;
}

/* ---- content ------------------------------------------------------------- */

static void lru_unlink(struct cache *c, struct content *ct)
{
	if (ct->lru_prev)
		ct->lru_prev->lru_next = ct->lru_next;
	else if (c->lru_head == ct)
		c->lru_head = ct->lru_next;
	if (ct->lru_next)
		ct->lru_next->lru_prev = ct->lru_prev;
	else if (c->lru_tail == ct)
		c->lru_tail = ct->lru_prev;
	ct->lru_prev = ct->lru_next = NULL;
}

static void lru_push(struct cache *c, struct content *ct)
{
	ct->lru_prev = NULL;
	ct->lru_next = c->lru_head;
	if (c->lru_head)
		c->lru_head->lru_prev = ct;
	c->lru_head = ct;
	if (!c->lru_tail)
		c->lru_tail = ct;
}

static char *disk_name(struct cache *c, const struct content *ct)
{
	return sbx_xasprintf("%s/%llu-%lld-%lld.%ld", c->disk_dir,
			     (unsigned long long)ct->ino, (long long)ct->size,
			     (long long)ct->mtime.tv_sec, ct->mtime.tv_nsec);
}

static void content_drop(struct cache *c, struct cnode *n)
{
	struct content *ct = n->content;

	if (!ct)
		return;
	if (ct->data) {
		lru_unlink(c, ct);
		c->mem_bytes -= ct->len;
		free(ct->data);
	}
	if (ct->on_disk) {
		char *p = disk_name(c, ct);

		unlink(p);
		free(p);
	}
	free(ct);
	n->content = NULL;
}

/* Spill or drop least recently used contents until under budget. */
static void content_trim(struct cache *c)
{
	while (c->mem_bytes > CACHE_MEM_BUDGET && c->lru_tail) {
		struct content *ct = c->lru_tail;
		bool spilled = false;

		if (c->disk_dir && ct->len >= CACHE_DISK_MIN) {
			char *p = disk_name(c, ct);

			spilled = sbx_file_write_atomic(p, ct->data, ct->len,
							0600) == 0;
			if (!spilled)
				sbx_error_clear();
			free(p);
		}
		lru_unlink(c, ct);
		c->mem_bytes -= ct->len;
		free(ct->data);
		ct->data = NULL;
		ct->on_disk = spilled; /* else invalid: fetched again */
	}
}

/* Does n's content match its current attributes? */
static bool content_valid(struct cnode *n)
{
	struct content *ct = n->content;

	return ct && n->st_valid && (ct->data || ct->on_disk) &&
	       ct->ino == n->st.st_ino && ct->size == n->st.st_size &&
	       (off_t)ct->len == n->st.st_size &&
	       ct->mtime.tv_sec == n->st.st_mtim.tv_sec &&
	       ct->mtime.tv_nsec == n->st.st_mtim.tv_nsec;
}

/* Keep `data` as n's content, taken as of attributes `st`. */
static void content_store(struct cache *c, struct cnode *n, const void *data,
			  size_t len, const struct stat *st)
{
	struct content *ct;

	content_drop(c, n);
	ct = sbx_xcalloc(1, sizeof(*ct));
	ct->data = sbx_xmalloc(len ? len : 1);
	memcpy(ct->data, data, len);
	ct->len = len;
	ct->ino = st->st_ino;
	ct->size = st->st_size;
	ct->mtime = st->st_mtim;
	n->content = ct;
	lru_push(c, ct);
	c->mem_bytes += len;
	content_trim(c);
}

/* Copy up to size bytes at off from n's valid content.  -1: not cached. */
static ssize_t content_read(struct cache *c, struct cnode *n, void *buf,
			    size_t size, off_t off)
{
	struct content *ct = n->content;
	size_t avail;

	if (!content_valid(n))
		return -1;
	if (off >= (off_t)ct->len)
		return 0;
	avail = ct->len - (size_t)off;
	if (size > avail)
		size = avail;
	if (ct->data) {
		memcpy(buf, (char *)ct->data + off, size);
		lru_unlink(c, ct); /* most recently used first */
		lru_push(c, ct);
		return (ssize_t)size;
	}
	char *p = disk_name(c, ct);
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	ssize_t got = -1;

	free(p);
	if (fd >= 0) {
		got = pread(fd, buf, size, off);
		close(fd);
	}
	if (got < 0)
		ct->on_disk = false; /* lost: fetch again */
	return got;
}

/* ---- own changes ---------------------------------------------------------- */

static struct expect *expect_add(struct cache *c, struct cnode *dir,
				 const char *name)
{
	struct expect *e;
	char *p;

	if (!c->watching)
		return NULL;
	pthread_mutex_lock(&c->lock);
	p = child_path(dir, name);
	if (!p) {
		pthread_mutex_unlock(&c->lock);
		return NULL;
	}
	e = sbx_xmalloc(sizeof(*e) + strlen(p) + 1);
	strcpy(e->path, p); /* sized above */
	free(p);
	e->next = c->expect;
	c->expect = e;
	pthread_mutex_unlock(&c->lock);
	return e;
}

/* The call failed: no event will come for it. */
static void expect_cancel(struct cache *c, struct expect *e)
{
	struct expect **pp;

	if (!e)
		return;
	pthread_mutex_lock(&c->lock);
	for (pp = &c->expect; *pp && *pp != e; pp = &(*pp)->next)
		;
	if (*pp) {
		*pp = e->next;
		free(e);
	}
	pthread_mutex_unlock(&c->lock);
}

/* Caller holds c->lock.  True (and consumed) when path was expected. */
static bool expect_take(struct cache *c, const char *path)
{
	struct expect **pp, *e;

	for (pp = &c->expect; (e = *pp); pp = &e->next)
		if (strcmp(e->path, path) == 0) {
			*pp = e->next;
			free(e);
			return true;
		}
	return false;
}

static void expect_clear(struct cache *c)
{
	while (c->expect) {
		struct expect *e = c->expect;

		c->expect = e->next;
		free(e);
	}
}

/* ---- inner calls --------------------------------------------------------- */

static int inner_node(struct cache *c, const char *path, struct sbx_node **out)
{
	return c->inner->ops->node_at(c->inner, path, out);
}

/* stat of path through the wrapped sandbox. */
static int inner_stat(struct cache *c, const char *path, struct stat *st)
{
	struct sbx_node *n;
	int rc = inner_node(c, path, &n);

	if (rc < 0)
		return rc;
	rc = c->inner->ops->getattr(c->inner, n, NULL, st);
	c->inner->ops->forget(c->inner, n);
	return rc;
}

/* Forward a change to the daemon with the identities it keys on. */
static void forward(struct cache *c, int kind, const struct cnode *dir,
		    const char *name, const struct cnode *obj)
{
	struct sbx_change ch;

	if (!c->cb)
		return;
	memset(&ch, 0, sizeof(ch));
	ch.kind = kind;
	if (dir) {
		ch.dir_dev = dir->st.st_dev;
		ch.dir_ino = dir->st.st_ino;
	}
	ch.name = name;
	if (obj) {
		ch.dev = obj->st.st_dev;
		ch.ino = obj->st.st_ino;
	}
	c->cb(&ch, c->cb_payload);
}

/* ---- prefetch ------------------------------------------------------------ */

struct bulk_ctx {
	struct cache *c;
	unsigned long gen; /* c->events when the walk started */
};

static int bulk_item(const struct sbx_bulk_item *it, void *payload)
{
	struct bulk_ctx *ctx = payload;
	struct cache *c = ctx->c;
	struct cnode *n;

	pthread_mutex_lock(&c->lock);
	/* After a change during the walk, the rest may predate it: keep
	 * nothing (lookups then ask one by one). */
	if (ctx->gen != c->events) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	n = resolve(c, it->path, true);
	if (n && !n->dirty) {
		set_st(c, n, &it->st);
		if (it->kind == SBX_BULK_DIR) {
			/* Names not listed are gone; listed ones present. */
			for (size_t b = 0; b < n->nbuckets; b++)
				for (struct cnode *k = n->kids[b]; k;
				     k = k->hnext)
					if (!k->dirty)
						k->slot = S_ABSENT;
			for (size_t i = 0; i < it->nentries; i++) {
				struct cnode *k;

				if (is_silly(it->entries[i].name))
					continue;
				k = kid_get(n, it->entries[i].name);

				if (!k->dirty)
					set_st(c, k, &it->entries[i].st);
				else
					k->slot = S_PRESENT;
			}
			n->complete = true;
			n->prefetched = true;
			n->list_time = now();
		} else if (it->kind == SBX_BULK_FILE &&
			   it->len == (size_t)it->st.st_size) {
			content_store(c, n, it->data, it->len, &it->st);
		}
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/*
 * Walk the subtree of dir in one bulk call.  Caller holds c->lock; it is
 * dropped during the call.  Concurrent callers for one directory wait for
 * the first.  Failure is not an error: the caller falls back to single
 * requests.
 */
static void prefetch(struct cache *c, struct cnode *dir)
{
	struct sbx_bulk_opts o = {PREFETCH_MAX_FILE, PREFETCH_MAX_TOTAL, -1};
	struct bulk_ctx ctx = {c};
	char *path;
	int rc;

	if (!c->inner->ops->bulk || dir->prefetched)
		return;
	while (dir->prefetching)
		pthread_cond_wait(&c->cond, &c->lock);
	if (dir->prefetched)
		return;
	path = path_of(dir);
	if (!path)
		return;
	dir->prefetching = true;
	ctx.gen = c->events;
	pthread_mutex_unlock(&c->lock);
	rc = c->inner->ops->bulk(c->inner, path, &o, bulk_item, &ctx);
	pthread_mutex_lock(&c->lock);
	if (rc < 0) {
		sbx_debug("prefetch of '%s' failed: %s", path,
			  sbx_error_last()->msg);
		sbx_error_clear();
	}
	/* Even on failure: do not retry the walk on every lookup. */
	dir->prefetched = true;
	dir->prefetching = false;
	pthread_cond_broadcast(&c->cond);
	free(path);
}

/* ---- data plane ---------------------------------------------------------- */

static struct sbx_node *c_root(struct sbx_sandbox *sb)
{
	return (struct sbx_node *)&CACHE(sb)->root;
}

static int c_lookup(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node **out, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *dir = CNODE(parent), *k;
	unsigned long gen;
	struct stat fst;
	char *path;
	int rc;

	*out = NULL;
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "lookup of '%s'", name);
	pthread_mutex_lock(&c->lock);
	if (!dir->prefetched && !dir->complete)
		prefetch(c, dir);
	k = kid_find(dir, name);
	if (k && k->slot == S_PRESENT && k->st_valid && fresh(c, k->st_time)) {
		*st = k->st;
		*out = (struct sbx_node *)k;
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	if ((k && k->slot == S_ABSENT && fresh(c, dir->list_time)) ||
	    (!k && dir->complete && fresh(c, dir->list_time))) {
		pthread_mutex_unlock(&c->lock);
		return sbx_error_set(SBX_ERR_REMOTE, -ENOENT, "no '%s'", name);
	}
	path = child_path(dir, name);
	gen = c->events;
	pthread_mutex_unlock(&c->lock);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "directory was replaced");
	rc = inner_stat(c, path, &fst);
	free(path);
	pthread_mutex_lock(&c->lock);
	if (rc == -ENOENT) {
		k = kid_get(dir, name);
		/* A negative entry is as fresh as a listing. */
		if (!k->dirty && gen == c->events) {
			k->slot = S_ABSENT;
			if (!dir->complete)
				dir->list_time = now();
		}
	} else if (rc == 0) {
		k = kid_get(dir, name);
		set_st(c, k, &fst);
		if (gen != c->events)
			k->st_valid = false; /* raced with a change */
		*st = fst;
		*out = (struct sbx_node *)k;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static void c_forget(struct sbx_sandbox *sb, struct sbx_node *node)
{
	/* Nodes live as long as the tree; the daemon counts references. */
}

static int push(struct cache *c, struct cfile *f);
static int push_node(struct cache *c, struct cnode *n);

/* A silly-renamed file is unlinked as far as the user is concerned. */
static void hide_link(const struct cnode *n, struct stat *st)
{
	if (n->hidden && st->st_nlink > 0)
		st->st_nlink--;
}

static int c_getattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	unsigned long gen;
	struct stat fst;
	char *path;
	int rc;

	/* Buffered writes change the size: push them so the answer is true. */
	if (n->dirty) {
		rc = push_node(c, n);
		if (rc < 0)
			return rc;
	}
	pthread_mutex_lock(&c->lock);
	if (n->st_valid && !n->dirty && fresh(c, n->st_time)) {
		*st = n->st;
		hide_link(n, st);
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	path = path_of(n);
	gen = c->events;
	pthread_mutex_unlock(&c->lock);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "file was replaced");
	rc = inner_stat(c, path, &fst);
	free(path);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&c->lock);
	refresh_st(c, n, &fst);
	if (gen != c->events)
		n->st_valid = false; /* raced with a change */
	*st = fst;
	hide_link(n, st);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

/* Push every buffered write of node n (all its open files). */
static int push_node(struct cache *c, struct cnode *n)
{
	int rc = 0;

	for (;;) {
		struct cfile *f;

		pthread_mutex_lock(&c->lock);
		for (f = c->dirty; f && f->node != n; f = f->dnext)
			;
		pthread_mutex_unlock(&c->lock);
		if (!f)
			return rc;
		int r = push(c, f);

		if (r < 0) {
			rc = r;
			return rc;
		}
	}
}

static int c_setattr(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file *fh, const struct stat *in, int valid,
		     struct stat *out)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct sbx_node *inode;
	char *path;
	int rc;

	rc = push_node(c, n);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&c->lock);
	path = path_of(n);
	pthread_mutex_unlock(&c->lock);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "file was replaced");
	rc = inner_node(c, path, &inode);
	free(path);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->setattr(c->inner, inode, NULL, in, valid, out);
	c->inner->ops->forget(c->inner, inode);
	pthread_mutex_lock(&c->lock);
	if (rc == 0) {
		refresh_st(c, n, out);
		if (valid & SBX_SET_SIZE)
			content_drop(c, n);
	} else {
		n->st_valid = false;
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static int c_readlink(struct sbx_sandbox *sb, struct sbx_node *node, char *buf,
		      size_t size)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct sbx_node *inode;
	char *path;
	int rc;

	pthread_mutex_lock(&c->lock);
	if (n->link && n->st_valid && fresh(c, n->st_time)) {
		size_t l = strlen(n->link);

		if (l > size)
			l = size;
		memcpy(buf, n->link, l);
		pthread_mutex_unlock(&c->lock);
		return (int)l;
	}
	path = path_of(n);
	pthread_mutex_unlock(&c->lock);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE, "link replaced");
	rc = inner_node(c, path, &inode);
	free(path);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->readlink(c->inner, inode, buf, size);
	c->inner->ops->forget(c->inner, inode);
	if (rc >= 0 && (size_t)rc < size) {
		pthread_mutex_lock(&c->lock);
		free(n->link);
		n->link = sbx_xstrndup(buf, (size_t)rc);
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

/*
 * After an inner call created `name` in dir with attributes st: record the
 * entry, and note that dir itself changed.
 */
static struct cnode *created(struct cache *c, struct cnode *dir,
			     const char *name, const struct stat *st)
{
	struct cnode *k;

	pthread_mutex_lock(&c->lock);
	k = kid_get(dir, name);
	set_st(c, k, st);
	content_drop(c, k);
	dir->st_valid = false;
	pthread_mutex_unlock(&c->lock);
	return k;
}

/* Run an inner creation op on the parent's node; see the callers. */
/* Evaluate `call` (an int rc) expecting an entry event for dir/name. */
#define EXPECTING(c, dir, name, call)                                          \
	({                                                                     \
		struct expect *x_ = expect_add(c, dir, name);                  \
		int rx_ = (call);                                              \
		if (rx_ < 0)                                                   \
			expect_cancel(c, x_);                                  \
		rx_;                                                           \
	})

#define WITH_PARENT(c, dir, inode, body)                                       \
	({                                                                     \
		char *p_;                                                      \
		int r_;                                                        \
		pthread_mutex_lock(&(c)->lock);                                \
		p_ = path_of(dir);                                             \
		pthread_mutex_unlock(&(c)->lock);                              \
		if (!p_) {                                                     \
			r_ = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,            \
					   "directory was replaced");          \
		} else {                                                       \
			r_ = inner_node(c, p_, &(inode));                      \
			free(p_);                                              \
			if (r_ == 0) {                                         \
				r_ = (body);                                   \
				(c)->inner->ops->forget((c)->inner, inode);    \
			}                                                      \
		}                                                              \
		r_;                                                            \
	})

static int finish_create(struct cache *c, struct cnode *dir, const char *name,
			 struct sbx_node *made, struct stat *st,
			 struct sbx_node **out, int rc)
{
	if (rc < 0)
		return rc;
	c->inner->ops->forget(c->inner, made);
	*out = (struct sbx_node *)created(c, dir, name, st);
	return 0;
}

static int c_mknod(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, dev_t rdev,
		   struct sbx_node **out, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in, *made = NULL;
	int rc = EXPECTING(c, CNODE(parent), name,
			   WITH_PARENT(c, CNODE(parent), in,
				       c->inner->ops->mknod(c->inner, in, name,
							    mode, rdev, &made,
							    st)));

	return finish_create(c, CNODE(parent), name, made, st, out, rc);
}

static int c_mkdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name, mode_t mode, struct sbx_node **out,
		   struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in, *made = NULL;
	int rc = EXPECTING(c, CNODE(parent), name,
			   WITH_PARENT(c, CNODE(parent), in,
				       c->inner->ops->mkdir(c->inner, in, name,
							    mode, &made, st)));

	rc = finish_create(c, CNODE(parent), name, made, st, out, rc);
	if (rc == 0) {
		/* A new directory is empty: its listing is known. */
		pthread_mutex_lock(&c->lock);
		CNODE(*out)->complete = true;
		CNODE(*out)->prefetched = true;
		CNODE(*out)->list_time = now();
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

static int c_symlink(struct sbx_sandbox *sb, const char *target,
		     struct sbx_node *parent, const char *name,
		     struct sbx_node **out, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in, *made = NULL;
	int rc = EXPECTING(c, CNODE(parent), name,
			   WITH_PARENT(c, CNODE(parent), in,
				       c->inner->ops->symlink(c->inner, target,
							      in, name, &made,
							      st)));

	rc = finish_create(c, CNODE(parent), name, made, st, out, rc);
	if (rc == 0) {
		pthread_mutex_lock(&c->lock);
		free(CNODE(*out)->link);
		CNODE(*out)->link = sbx_xstrdup(target);
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

static int c_link(struct sbx_sandbox *sb, struct sbx_node *node,
		  struct sbx_node *newparent, const char *newname,
		  struct sbx_node **out, struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in, *src, *made = NULL;
	char *sp;
	int rc;

	pthread_mutex_lock(&c->lock);
	sp = path_of(CNODE(node));
	pthread_mutex_unlock(&c->lock);
	if (!sp)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE, "file replaced");
	rc = inner_node(c, sp, &src);
	free(sp);
	if (rc < 0)
		return rc;
	rc = EXPECTING(c, CNODE(newparent), newname,
		       WITH_PARENT(c, CNODE(newparent), in,
				   c->inner->ops->link(c->inner, src, in,
						       newname, &made, st)));
	c->inner->ops->forget(c->inner, src);
	rc = finish_create(c, CNODE(newparent), newname, made, st, out, rc);
	if (rc == 0) {
		struct cnode *from = CNODE(node);

		pthread_mutex_lock(&c->lock);
		/* Both names now lead to one file: tie them (see ring_join),
		 * so the first name's inode still works once it is removed. */
		if (from->st.st_ino == st->st_ino) {
			from->st.st_nlink = st->st_nlink;
			ring_join(c, from);
		}
		from->st_valid = false; /* ctime changed */
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

/* After a name vanished from dir through us. */
static void removed(struct cache *c, struct cnode *dir, const char *name)
{
	struct cnode *k;

	pthread_mutex_lock(&c->lock);
	k = kid_find(dir, name);
	if (k) {
		k->slot = S_ABSENT;
		k->st_valid = false;
		content_drop(c, k);
	}
	dir->st_valid = false;
	pthread_mutex_unlock(&c->lock);
}

/* Wait up to RELEASE_WAIT_MS for n's last RELEASE.  Caller holds c->lock. */
static void wait_released(struct cache *c, struct cnode *n)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += RELEASE_WAIT_MS * 1000000L;
	until.tv_sec += until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	while (n->opens &&
	       pthread_cond_timedwait(&c->cond, &c->lock, &until) == 0)
		;
}

/*
 * The sandbox cannot keep a file alive for our open descriptors, so a file
 * that is open here is renamed to a hidden name instead of being removed
 * (NFS's "silly rename"), and removed at its last close.  Returns 1 when
 * `name` in dir was silly-renamed, 0 when it needs no such care.
 */
static int silly_rename(struct cache *c, struct cnode *dir, const char *name)
{
	struct sbx_node *in;
	struct cnode *k;
	char *hidden;
	int rc;

	pthread_mutex_lock(&c->lock);
	k = kid_find(dir, name);
	/*
	 * Every descriptor closed (FLUSH seen): the RELEASE is usually on its
	 * way, so wait a little for it rather than leave a hidden file
	 * behind.  A FLUSH does not mean the file is closed, though: a fork
	 * that exec's closes its copies of the parent's descriptors, and the
	 * parent's stay open.  Only RELEASE says that.
	 */
	if (k && k->opens && !k->active)
		wait_released(c, k);
	if (!k || k->slot == S_ABSENT || !k->opens || k->hidden ||
	    (k->st.st_mode && !S_ISREG(k->st.st_mode))) {
		pthread_mutex_unlock(&c->lock);
		return 0;
	}
	hidden = sbx_xasprintf(SILLY_PREFIX "%llu.%lu",
			       (unsigned long long)k->st.st_ino,
			       ++c->silly_seq);
	pthread_mutex_unlock(&c->lock);
	{
		struct expect *e1 = expect_add(c, dir, name);
		struct expect *e2 = expect_add(c, dir, hidden);

		rc = WITH_PARENT(c, dir, in,
				 c->inner->ops->rename(c->inner, in, name, in,
						       hidden,
						       RENAME_NOREPLACE));
		if (rc < 0) {
			expect_cancel(c, e1);
			expect_cancel(c, e2);
		}
	}
	if (rc == 0) {
		pthread_mutex_lock(&c->lock);
		kid_unlink(dir, k);
		free(k->name);
		k->name = hidden;
		hidden = NULL;
		k->hidden = true;
		kid_link(dir, k);
		kid_get(dir, name)->slot = S_ABSENT;
		dir->st_valid = false;
		/* Closed meanwhile: nothing will remove it later. */
		unlink_hidden_locked(c, k);
		pthread_mutex_unlock(&c->lock);
		rc = 1;
	}
	free(hidden);
	return rc;
}

static int c_unlink(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc = silly_rename(c, CNODE(parent), name);

	if (rc != 0)
		return rc < 0 ? rc : 0;
	rc = EXPECTING(c, CNODE(parent), name,
		       WITH_PARENT(c, CNODE(parent), in,
				   c->inner->ops->unlink(c->inner, in, name)));
	if (rc == 0)
		removed(c, CNODE(parent), name);
	return rc;
}

static int c_rmdir(struct sbx_sandbox *sb, struct sbx_node *parent,
		   const char *name)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc = EXPECTING(c, CNODE(parent), name,
			   WITH_PARENT(c, CNODE(parent), in,
				       c->inner->ops->rmdir(c->inner, in,
							    name)));

	if (rc == 0)
		removed(c, CNODE(parent), name);
	return rc;
}

static int c_rename(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, struct sbx_node *newparent,
		    const char *newname, unsigned flags)
{
	struct cache *c = CACHE(sb);
	struct cnode *from = CNODE(parent), *to = CNODE(newparent), *a, *b;
	struct sbx_node *fi = NULL, *ti = NULL;
	char *fp, *tp;
	int rc;

	if (!(flags & RENAME_EXCHANGE)) {
		/* A replaced file that is open here must stay readable. */
		pthread_mutex_lock(&c->lock);
		a = kid_find(from, name);
		b = kid_find(to, newname);
		bool keep = b && a != b && !(flags & RENAME_NOREPLACE);
		pthread_mutex_unlock(&c->lock);
		if (keep) {
			rc = silly_rename(c, to, newname);
			if (rc < 0)
				return rc;
		}
	}
	pthread_mutex_lock(&c->lock);
	fp = path_of(from);
	tp = path_of(to);
	pthread_mutex_unlock(&c->lock);
	if (!fp || !tp) {
		free(fp);
		free(tp);
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "directory was replaced");
	}
	rc = inner_node(c, fp, &fi);
	if (rc == 0)
		rc = inner_node(c, tp, &ti);
	free(fp);
	free(tp);
	if (rc == 0) {
		struct expect *e1 = NULL, *e2 = NULL;

		/* An exchange's events are not worth predicting. */
		if (!(flags & RENAME_EXCHANGE)) {
			e1 = expect_add(c, from, name);
			e2 = expect_add(c, to, newname);
		}
		rc = c->inner->ops->rename(c->inner, fi, name, ti, newname,
					   flags);
		if (rc < 0) {
			expect_cancel(c, e1);
			expect_cancel(c, e2);
		}
	}
	if (fi)
		c->inner->ops->forget(c->inner, fi);
	if (ti)
		c->inner->ops->forget(c->inner, ti);
	if (rc < 0)
		return rc;

	pthread_mutex_lock(&c->lock);
	a = kid_find(from, name);
	b = kid_find(to, newname);
	from->st_valid = false;
	to->st_valid = false;
	if (flags & RENAME_EXCHANGE) {
		if (a && b && a != b) {
			kid_unlink(from, a);
			kid_unlink(to, b);
			free(a->name);
			free(b->name);
			a->name = sbx_xstrdup(newname);
			b->name = sbx_xstrdup(name);
			kid_link(to, a);
			kid_link(from, b);
		} else {
			if (a)
				a->slot = S_UNKNOWN;
			if (b)
				b->slot = S_UNKNOWN;
		}
	} else {
		if (b && b != a) {
			/* The replaced object has no path any more. */
			kid_unlink(to, b);
			b->orphan = true;
			b->parent = NULL;
		}
		if (a) {
			kid_unlink(from, a);
			free(a->name);
			a->name = sbx_xstrdup(newname);
			kid_link(to, a);
			a->st_valid = false; /* ctime changed */
		}
		/* The old name is now known to be free. */
		struct cnode *gone = kid_get(from, name);

		gone->slot = S_ABSENT;
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static int open_inner(struct cache *c, struct cfile *f)
{
	struct sbx_open_result res;
	struct sbx_node *node = NULL;
	char *path;
	int rc = 0;

	if (__atomic_load_n(&f->inner, __ATOMIC_ACQUIRE))
		return 0;
	/*
	 * Several requests of one open file (parallel READs, a RELEASE's
	 * push) may get here at once: one opens, the others wait for it.
	 * Two opens would each set inner/inner_node, and the loser's node
	 * would be forgotten twice.
	 */
	pthread_mutex_lock(&f->olock);
	if (f->inner)
		goto out;
	pthread_mutex_lock(&c->lock);
	path = path_of(f->node);
	pthread_mutex_unlock(&c->lock);
	if (!path) {
		rc = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				   "file was replaced while open");
		goto out;
	}
	rc = inner_node(c, path, &node);
	free(path);
	if (rc < 0)
		goto out;
	memset(&res, 0, sizeof(res));
	rc = c->inner->ops->open(c->inner, node,
				 f->flags & ~(O_CREAT | O_EXCL | O_TRUNC),
				 &res);
	if (rc < 0) {
		c->inner->ops->forget(c->inner, node);
		goto out;
	}
	f->inner_node = node;
	__atomic_store_n(&f->inner, res.fh, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&f->olock);
	return rc;
}

static struct cfile *new_cfile(struct cnode *n, int flags)
{
	struct cfile *f = sbx_xcalloc(1, sizeof(*f));

	f->node = n;
	f->flags = flags;
	pthread_mutex_init(&f->wlock, NULL);
	pthread_mutex_init(&f->olock, NULL);
	return f;
}

/* I/O on a closed file (a dup'd descriptor): it is open after all. */
static void reactivate(struct cache *c, struct cfile *f)
{
	pthread_mutex_lock(&c->lock);
	if (f->flushed) {
		f->flushed = false;
		f->node->active++;
	}
	pthread_mutex_unlock(&c->lock);
}

static int c_open(struct sbx_sandbox *sb, struct sbx_node *node, int flags,
		  struct sbx_open_result *out)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct stat st;
	bool same = true;
	int rc;

	memset(out, 0, sizeof(out[0]));
	/*
	 * Close-to-open: without a healthy change stream, look at the file
	 * again; the kernel keeps its pages only if it did not change.
	 */
	if (!healthy(c)) {
		char *path;

		pthread_mutex_lock(&c->lock);
		path = path_of(n);
		pthread_mutex_unlock(&c->lock);
		if (!path)
			return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
					     "file was replaced");
		rc = inner_stat(c, path, &st);
		free(path);
		if (rc < 0)
			return rc;
		pthread_mutex_lock(&c->lock);
		same = n->st_valid && n->st.st_size == st.st_size &&
		       n->st.st_mtim.tv_sec == st.st_mtim.tv_sec &&
		       n->st.st_mtim.tv_nsec == st.st_mtim.tv_nsec;
		refresh_st(c, n, &st);
		pthread_mutex_unlock(&c->lock);
	}
	out->fh = (struct sbx_file *)new_cfile(n, flags);
	out->keep_cache = same;
	pthread_mutex_lock(&c->lock);
	n->opens++;
	n->active++;
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static int c_create(struct sbx_sandbox *sb, struct sbx_node *parent,
		    const char *name, mode_t mode, int flags,
		    struct sbx_node **node_out, struct stat *st,
		    struct sbx_open_result *out)
{
	struct cache *c = CACHE(sb);
	struct cnode *dir = CNODE(parent), *k;
	struct sbx_open_result res;
	struct sbx_node *in, *made = NULL;
	struct cfile *f;
	int rc;

	memset(&res, 0, sizeof(res));
	/* Without O_EXCL the file may exist already: then no event comes,
	 * and an unconsumed expectation would swallow a later one. */
	if (flags & O_EXCL)
		rc = EXPECTING(c, dir, name,
			       WITH_PARENT(c, dir, in,
					   c->inner->ops->create(c->inner, in,
								 name, mode,
								 flags, &made,
								 st, &res)));
	else
		rc = WITH_PARENT(c, dir, in,
				 c->inner->ops->create(c->inner, in, name, mode,
						       flags, &made, st, &res));
	if (rc < 0)
		return rc;
	k = created(c, dir, name, st);
	pthread_mutex_lock(&c->lock);
	k->opens++;
	k->active++;
	pthread_mutex_unlock(&c->lock);
	f = new_cfile(k, flags);
	f->inner = res.fh;
	f->inner_node = made;
	memset(out, 0, sizeof(*out));
	out->fh = (struct sbx_file *)f;
	out->keep_cache = true;
	*node_out = (struct sbx_node *)k;
	return 0;
}

/* Push f's buffered writes.  Thread-safe per file (FUSE serialises per
 * handle only partly, so the buffer is swapped out under the lock). */
static int push_locked(struct cache *c, struct cfile *f);

static int push(struct cache *c, struct cfile *f)
{
	int rc;

	pthread_mutex_lock(&f->wlock);
	rc = push_locked(c, f);
	pthread_mutex_unlock(&f->wlock);
	return rc;
}

/* Caller holds f->wlock. */
static int push_locked(struct cache *c, struct cfile *f)
{
	char *buf;
	size_t len, done = 0;
	off_t off;
	int rc;

	pthread_mutex_lock(&c->lock);
	buf = f->buf;
	len = f->buf_len;
	off = f->buf_off;
	f->buf = NULL;
	f->buf_len = 0;
	if (len) {
		/* Unlink from the dirty list; n->dirty drops after the push. */
		if (f->dprev)
			f->dprev->dnext = f->dnext;
		else if (c->dirty == f)
			c->dirty = f->dnext;
		if (f->dnext)
			f->dnext->dprev = f->dprev;
		f->dnext = f->dprev = NULL;
	}
	pthread_mutex_unlock(&c->lock);
	if (!len)
		return 0;
	rc = open_inner(c, f);
	while (rc == 0 && done < len) {
		ssize_t n = c->inner->ops->write(c->inner, f->inner,
						 buf + done, len - done,
						 off + (off_t)done);

		if (n < 0)
			rc = (int)n;
		else if (n == 0)
			rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
					   "short write to the sandbox");
		else
			done += (size_t)n;
	}
	free(buf);
	pthread_mutex_lock(&c->lock);
	f->node->dirty--;
	f->node->st_valid = false;
	content_drop(c, f->node);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static ssize_t c_read(struct sbx_sandbox *sb, struct sbx_file *fh, void *buf,
		      size_t size, off_t off)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	struct cnode *n = f->node;
	ssize_t got;
	int rc;

	reactivate(c, f);
	/* Writes through any open file of n (mmap write-back goes through
	 * whichever) must be in the sandbox before we read it. */
	if (n->dirty) {
		rc = push_node(c, n);
		if (rc < 0)
			return rc;
	}
	pthread_mutex_lock(&c->lock);
	got = content_read(c, n, buf, size, off);
	bool whole = got < 0 && n->st_valid && !n->dirty &&
		     S_ISREG(n->st.st_mode) &&
		     n->st.st_size <= (off_t)CACHE_WHOLE_FILE;
	off_t fsize = n->st.st_size;
	unsigned long gen = c->events;
	pthread_mutex_unlock(&c->lock);
	if (got >= 0)
		return got;
	rc = open_inner(c, f);
	if (rc < 0)
		return rc;
	if (whole) {
		/* Small file: fetch it whole once, serve from memory. */
		size_t cap = (size_t)fsize;
		char *all = sbx_xmalloc(cap ? cap : 1);
		ssize_t n2 = c->inner->ops->read(c->inner, f->inner, all, cap,
						 0);
		struct stat cur;

		if (n2 >= 0 && (size_t)n2 == cap) {
			pthread_mutex_lock(&c->lock);
			cur = n->st;
			/* Only if nothing changed the file meanwhile. */
			if (n->st_valid && cur.st_size == fsize && !n->dirty &&
			    gen == c->events)
				content_store(c, n, all, cap, &cur);
			got = content_read(c, n, buf, size, off);
			pthread_mutex_unlock(&c->lock);
			if (got < 0) {
				/* Evicted at once or changed: serve ours. */
				got = off >= n2 ? 0
					       : (ssize_t)(size < (size_t)(n2 - off)
							      ? size
							      : (size_t)(n2 - off));
				memcpy(buf, all + off, (size_t)got);
			}
			free(all);
			return got;
		}
		free(all);
		if (n2 < 0)
			return n2;
		/* The file changed size under us: fall through to a range. */
	}
	return c->inner->ops->read(c->inner, f->inner, buf, size, off);
}

static ssize_t c_write(struct sbx_sandbox *sb, struct sbx_file *fh,
		       const void *data, size_t size, off_t off)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	ssize_t ret = (ssize_t)size;
	int rc;

	reactivate(c, f);
	pthread_mutex_lock(&f->wlock);
	/* Appends must land at the real end: do not reorder them. */
	if (f->flags & O_APPEND) {
		rc = push_locked(c, f);
		if (rc == 0)
			rc = open_inner(c, f);
		ret = rc < 0 ? rc
			     : c->inner->ops->write(c->inner, f->inner, data,
						    size, off);
		pthread_mutex_lock(&c->lock);
		f->node->st_valid = false;
		content_drop(c, f->node);
		pthread_mutex_unlock(&c->lock);
		goto out;
	}
	if (f->buf_len &&
	    (off != f->buf_off + (off_t)f->buf_len ||
	     f->buf_len + size > CACHE_WRITE_BUF)) {
		rc = push_locked(c, f);
		if (rc < 0) {
			ret = rc;
			goto out;
		}
	}
	pthread_mutex_lock(&c->lock);
	if (!f->buf_len) {
		f->buf = sbx_xmalloc(CACHE_WRITE_BUF > size ? CACHE_WRITE_BUF
							    : size);
		f->buf_off = off;
		f->node->dirty++;
		f->dnext = c->dirty;
		f->dprev = NULL;
		if (c->dirty)
			c->dirty->dprev = f;
		c->dirty = f;
	}
	memcpy(f->buf + f->buf_len, data, size);
	f->buf_len += size;
	content_drop(c, f->node);
	pthread_mutex_unlock(&c->lock);
out:
	pthread_mutex_unlock(&f->wlock);
	return ret;
}

static int c_flush(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	int rc = push(c, f);

	/*
	 * close(2): the kernel sends RELEASE only later and asynchronously,
	 * so an unlink right after a close must not see this file as open.
	 */
	pthread_mutex_lock(&c->lock);
	if (!f->flushed) {
		f->flushed = true;
		if (f->node->active)
			f->node->active--;
	}
	pthread_mutex_unlock(&c->lock);

	if (rc == 0 && f->inner && c->inner->ops->flush)
		rc = c->inner->ops->flush(c->inner, f->inner);
	return rc;
}

static int c_fsync(struct sbx_sandbox *sb, struct sbx_file *fh, bool datasync)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	/* msync write-back may have come through another open file. */
	int rc = push_node(c, f->node);

	if (rc == 0)
		rc = open_inner(c, f);
	if (rc == 0)
		rc = c->inner->ops->fsync(c->inner, f->inner, datasync);
	return rc;
}

/*
 * Remove a silly-renamed file once nothing has it open.  Caller holds
 * c->lock; it is dropped for the removal.
 */
static void unlink_hidden_locked(struct cache *c, struct cnode *n)
{
	struct sbx_node *in;
	char *dir, *name;
	int rc;

	if (n->opens || !n->hidden || n->slot == S_ABSENT || !n->parent)
		return;
	dir = tree_path(n->parent);
	name = sbx_xstrdup(n->name);
	n->slot = S_ABSENT;
	pthread_mutex_unlock(&c->lock);
	rc = dir ? inner_node(c, dir, &in) : -ESTALE;
	if (rc == 0) {
		rc = EXPECTING(c, n->parent, name,
			       c->inner->ops->unlink(c->inner, in, name));
		c->inner->ops->forget(c->inner, in);
	}
	if (rc < 0) {
		sbx_warn("could not remove %s/%s: %s", dir ? dir : "?", name,
			 sbx_error_last()->msg);
		sbx_error_clear();
	}
	free(dir);
	free(name);
	pthread_mutex_lock(&c->lock);
}

/* The last close of a silly-renamed file removes it. */
static void drop_open(struct cache *c, struct cfile *f)
{
	struct cnode *n = f->node;

	pthread_mutex_lock(&c->lock);
	if (n->opens)
		n->opens--;
	if (!f->flushed && n->active)
		n->active--;
	if (!n->opens)
		pthread_cond_broadcast(&c->cond);
	unlink_hidden_locked(c, n);
	pthread_mutex_unlock(&c->lock);
}

static int c_release(struct sbx_sandbox *sb, struct sbx_file *fh)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	int rc;

	if (f->is_dir) {
		for (size_t i = 0; i < f->n; i++)
			free(f->names[i]);
		free(f->names);
		free(f->sts);
		free(f->nodes);
		free(f);
		return 0;
	}
	rc = push(c, f);
	if (f->inner) {
		int r = c->inner->ops->release(c->inner, f->inner);

		if (rc == 0)
			rc = r;
	}
	if (f->inner_node)
		c->inner->ops->forget(c->inner, f->inner_node);
	drop_open(c, f);
	pthread_mutex_destroy(&f->wlock);
	pthread_mutex_destroy(&f->olock);
	free(f);
	return rc;
}

static int with_file(struct cache *c, struct cfile *f)
{
	int rc = push(c, f);

	return rc < 0 ? rc : open_inner(c, f);
}

static int c_fallocate(struct sbx_sandbox *sb, struct sbx_file *fh, int mode,
		       off_t off, off_t len)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	int rc = with_file(c, f);

	if (rc < 0)
		return rc;
	if (!c->inner->ops->fallocate)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP,
				     "fallocate not supported");
	rc = c->inner->ops->fallocate(c->inner, f->inner, mode, off, len);
	pthread_mutex_lock(&c->lock);
	f->node->st_valid = false;
	content_drop(c, f->node);
	pthread_mutex_unlock(&c->lock);
	return rc;
}

static off_t c_lseek(struct sbx_sandbox *sb, struct sbx_file *fh, off_t off,
		     int whence)
{
	struct cache *c = CACHE(sb);
	struct cfile *f = CFILE(fh);
	int rc = with_file(c, f);

	if (rc < 0)
		return rc;
	if (!c->inner->ops->lseek)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS, "no lseek");
	return c->inner->ops->lseek(c->inner, f->inner, off, whence);
}

/* Fill a directory handle's snapshot from n's complete listing. */
static void snapshot_listing(struct cnode *n, struct cfile *d)
{
	size_t cap = n->nkids + 1, i = 0;

	d->names = sbx_xcalloc(cap, sizeof(*d->names));
	d->sts = sbx_xcalloc(cap, sizeof(*d->sts));
	d->nodes = sbx_xcalloc(cap, sizeof(*d->nodes));
	for (size_t b = 0; b < n->nbuckets; b++)
		for (struct cnode *k = n->kids[b]; k; k = k->hnext) {
			if (k->slot != S_PRESENT || k->hidden || i >= cap)
				continue;
			d->names[i] = sbx_xstrdup(k->name);
			d->sts[i] = k->st;
			d->nodes[i] = k;
			i++;
		}
	d->n = i;
}

struct list_ctx {
	struct cache *c;
	struct cnode *dir;
	unsigned long gen; /* c->events when the request went out */
	struct cnode **seen;
	size_t nseen, cap;
};

static int list_entry(const char *name, const struct stat *st,
		      struct sbx_node *node, off_t next, void *payload)
{
	struct list_ctx *l = payload;
	struct cnode *k;

	if (node)
		l->c->inner->ops->forget(l->c->inner, node);
	if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 ||
	    is_silly(name))
		return 0;
	pthread_mutex_lock(&l->c->lock);
	k = kid_get(l->dir, name);
	if (!k->dirty) {
		set_st(l->c, k, st);
		if (l->gen != l->c->events)
			k->st_valid = false; /* raced with a change */
	} else {
		k->slot = S_PRESENT;
	}
	if (l->nseen == l->cap) {
		l->cap = l->cap ? l->cap * 2 : 64;
		l->seen = sbx_xrealloc(l->seen, l->cap * sizeof(*l->seen));
	}
	l->seen[l->nseen++] = k;
	pthread_mutex_unlock(&l->c->lock);
	return 0;
}

/* List dir through the wrapped sandbox (one request with attributes). */
static int relist(struct cache *c, struct cnode *dir)
{
	struct list_ctx l = {.c = c, .dir = dir};
	struct sbx_node *in;
	struct sbx_file *dh;
	char *path;
	int rc;

	pthread_mutex_lock(&c->lock);
	path = path_of(dir);
	l.gen = c->events;
	pthread_mutex_unlock(&c->lock);
	if (!path)
		return sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				     "directory was replaced");
	rc = inner_node(c, path, &in);
	free(path);
	if (rc < 0)
		return rc;
	rc = c->inner->ops->opendir(c->inner, in, &dh);
	if (rc == 0) {
		rc = c->inner->ops->readdir(c->inner, dh, 0, SBX_READDIR_PLUS,
					    list_entry, &l);
		(void)c->inner->ops->releasedir(c->inner, dh);
	}
	c->inner->ops->forget(c->inner, in);
	pthread_mutex_lock(&c->lock);
	if (rc == 0) {
		/* Everything not listed is absent now (unknown if raced). */
		bool raced = l.gen != c->events;

		for (size_t b = 0; b < dir->nbuckets; b++)
			for (struct cnode *k = dir->kids[b]; k; k = k->hnext)
				if (!k->dirty)
					k->slot = raced ? S_UNKNOWN : S_ABSENT;
		for (size_t i = 0; i < l.nseen; i++)
			l.seen[i]->slot = S_PRESENT;
		/* Raced with a change: serve this listing, cache none of it. */
		dir->complete = !raced;
		dir->list_time = now();
	}
	pthread_mutex_unlock(&c->lock);
	free(l.seen);
	return rc;
}

/*
 * A listing can be served from the cache when it is complete and fresh,
 * and every entry's attributes are valid: readdirplus hands them to the
 * kernel, which would otherwise cache stale sizes and link counts.  One
 * relist refreshes them all in a single request.
 */
static bool listing_usable(struct cache *c, struct cnode *n)
{
	if (!n->complete || !fresh(c, n->list_time))
		return false;
	for (size_t b = 0; b < n->nbuckets; b++)
		for (struct cnode *k = n->kids[b]; k; k = k->hnext) {
			if (k->slot == S_UNKNOWN)
				return false;
			if (k->slot == S_PRESENT && !k->hidden &&
			    (!k->st_valid || k->dirty ||
			     !fresh(c, k->st_time)))
				return false;
		}
	return true;
}

static int c_opendir(struct sbx_sandbox *sb, struct sbx_node *node,
		     struct sbx_file **out)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(node);
	struct cfile *d;
	int rc = 0;

	pthread_mutex_lock(&c->lock);
	if (!n->prefetched && !n->complete)
		prefetch(c, n);
	if (!listing_usable(c, n)) {
		pthread_mutex_unlock(&c->lock);
		rc = relist(c, n);
		if (rc < 0)
			return rc;
		pthread_mutex_lock(&c->lock);
	}
	d = new_cfile(n, O_RDONLY);
	d->is_dir = true;
	snapshot_listing(n, d);
	pthread_mutex_unlock(&c->lock);
	*out = (struct sbx_file *)d;
	return 0;
}

static int c_readdir(struct sbx_sandbox *sb, struct sbx_file *dh, off_t off,
		     unsigned flags, sbx_dirent_cb cb, void *payload)
{
	struct cache *c = CACHE(sb);
	struct cfile *d = CFILE(dh);
	bool plus = flags & SBX_READDIR_PLUS;

	/* Cookies: 1 ".", 2 "..", then 3 + index. */
	for (off_t i = off; i < (off_t)d->n + 2; i++) {
		struct stat st;
		struct sbx_node *node = NULL;
		const char *name;

		memset(&st, 0, sizeof(st));
		if (i < 2) {
			name = i == 0 ? "." : "..";
			st.st_mode = S_IFDIR;
			st.st_ino = i == 0 ? d->node->st.st_ino : 1;
		} else {
			name = d->names[i - 2];
			st = d->sts[i - 2];
			if (plus)
				node = (struct sbx_node *)d->nodes[i - 2];
		}
		if (cb(name, &st, node, i + 1, payload) != 0)
			break;
	}
	(void)c;
	return 0;
}

static int c_releasedir(struct sbx_sandbox *sb, struct sbx_file *dh)
{
	return c_release(sb, dh);
}

static int c_statfs(struct sbx_sandbox *sb, struct sbx_node *node,
		    struct statvfs *out)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;
	int rc = inner_node(c, "", &in);

	if (rc < 0)
		return rc;
	rc = c->inner->ops->statfs(c->inner, in, out);
	c->inner->ops->forget(c->inner, in);
	return rc;
}

/* xattrs pass through; they are rare and not worth a cache. */
#define XATTR_CALL(c, node, inode, call)                                       \
	({                                                                     \
		char *p_;                                                      \
		long r_;                                                       \
		pthread_mutex_lock(&(c)->lock);                                \
		p_ = path_of(CNODE(node));                                     \
		pthread_mutex_unlock(&(c)->lock);                              \
		if (!p_) {                                                     \
			r_ = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,            \
					   "file was replaced");               \
		} else {                                                       \
			r_ = inner_node(c, p_, &(inode));                      \
			free(p_);                                              \
			if (r_ == 0) {                                         \
				r_ = (call);                                   \
				(c)->inner->ops->forget((c)->inner, inode);    \
			}                                                      \
		}                                                              \
		r_;                                                            \
	})

/*
 * security.* (SELinux labels, capabilities) and system.* (POSIX ACLs) of a
 * remote sandbox describe the remote machine's policy, not something this
 * machine can enforce; `ls -l` asks every file for them, which would cost
 * a round trip per file.  They are not exposed.
 */
static bool foreign_xattr(const char *name)
{
	return strncmp(name, "security.", 9) == 0 ||
	       strncmp(name, "system.", 7) == 0;
}

static ssize_t c_getxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			  const char *name, void *buf, size_t size)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;

	if (foreign_xattr(name))
		return sbx_error_set(SBX_ERR_REMOTE, -ENODATA,
				     "%s is not exposed for remote sandboxes",
				     name);

	if (!c->inner->ops->getxattr)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP, "no xattrs");
	return XATTR_CALL(c, node, in,
			  c->inner->ops->getxattr(c->inner, in, name, buf,
						  size));
}

static ssize_t c_listxattr(struct sbx_sandbox *sb, struct sbx_node *node,
			   char *buf, size_t size)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;

	if (!c->inner->ops->listxattr)
		return 0;
	return XATTR_CALL(c, node, in,
			  c->inner->ops->listxattr(c->inner, in, buf, size));
}

static int c_setxattr(struct sbx_sandbox *sb, struct sbx_node *node,
		      const char *name, const void *value, size_t size,
		      int flags)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;

	if (foreign_xattr(name))
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP,
				     "%s is not exposed for remote sandboxes",
				     name);
	if (!c->inner->ops->setxattr)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP, "no xattrs");
	return (int)XATTR_CALL(c, node, in,
			       c->inner->ops->setxattr(c->inner, in, name,
						       value, size, flags));
}

static int c_removexattr(struct sbx_sandbox *sb, struct sbx_node *node,
			 const char *name)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;

	if (!c->inner->ops->removexattr)
		return sbx_error_set(SBX_ERR_REMOTE, -EOPNOTSUPP, "no xattrs");
	return (int)XATTR_CALL(c, node, in,
			       c->inner->ops->removexattr(c->inner, in, name));
}

static int c_node_path(struct sbx_sandbox *sb, struct sbx_node *node,
		       char **out)
{
	struct cache *c = CACHE(sb);
	struct sbx_node *in;

	*out = NULL;
	return (int)XATTR_CALL(c, node, in,
			       c->inner->ops->node_path(c->inner, in, out));
}

static int c_exec_start(struct sbx_sandbox *sb,
			const struct sbx_exec_request *req,
			struct sbx_exec_handle **out)
{
	struct cache *c = CACHE(sb);

	if (!c->inner->ops->exec_start)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "this sandbox cannot run commands");
	return c->inner->ops->exec_start(c->inner, req, out);
}

/* Invalidate everything (events were lost). Caller holds c->lock. */
static void forget_all(struct cache *c, struct cnode *n)
{
	n->st_valid = false;
	n->complete = false;
	n->prefetched = false;
	free(n->link);
	n->link = NULL;
	for (size_t b = 0; b < n->nbuckets; b++)
		for (struct cnode *k = n->kids[b]; k; k = k->hnext) {
			if (k->slot == S_ABSENT)
				k->slot = S_UNKNOWN;
			forget_all(c, k);
		}
}

static void on_change(const struct sbx_change *ch, void *payload)
{
	struct cache *c = payload;

	pthread_mutex_lock(&c->lock);
	c->events++;
	pthread_mutex_unlock(&c->lock);
	apply_change(c, ch);
}

static void apply_change(struct cache *c, const struct sbx_change *ch)
{
	struct cnode *n, *dir = NULL, objcopy, dircopy;
	const char *name = NULL;
	bool have_obj = false, have_dir = false;
	char *dirpath = NULL;

	if (ch->kind == SBX_CHANGE_OVERFLOW || !ch->path) {
		pthread_mutex_lock(&c->lock);
		expect_clear(c);
		forget_all(c, &c->root);
		pthread_mutex_unlock(&c->lock);
		forward(c, SBX_CHANGE_OVERFLOW, NULL, NULL, NULL);
		return;
	}
	{
		const char *base = strrchr(ch->path, '/');

		/* Our own hidden names: nothing the kernel knows of. */
		if (is_silly(base ? base + 1 : ch->path))
			return;
	}
	pthread_mutex_lock(&c->lock);
	if (ch->kind == SBX_CHANGE_ENTRY && expect_take(c, ch->path)) {
		pthread_mutex_unlock(&c->lock);
		return;
	}
	n = resolve(c, ch->path, false);
	if (n && !n->dirty) {
		n->st_valid = false;
		free(n->link);
		n->link = NULL;
		if (ch->kind == SBX_CHANGE_DATA)
			content_drop(c, n);
		objcopy = *n;
		have_obj = n->st.st_ino != 0;
	}
	if (ch->kind == SBX_CHANGE_ENTRY) {
		const char *slash = strrchr(ch->path, '/');

		dirpath = slash ? sbx_xstrndup(ch->path,
					       (size_t)(slash - ch->path))
				: sbx_xstrdup("");
		name = slash ? slash + 1 : ch->path;
		dir = resolve(c, dirpath, false);
		if (dir) {
			/*
			 * The name may be new to us: record it as UNKNOWN so a
			 * complete listing neither answers "absent" for it nor
			 * is served without asking again.
			 */
			struct cnode *k = kid_get(dir, name);

			if (!k->dirty)
				k->slot = S_UNKNOWN;
			dir->st_valid = false;
			dircopy = *dir;
			have_dir = true;
		}
	}
	pthread_mutex_unlock(&c->lock);
	if (ch->kind == SBX_CHANGE_ENTRY) {
		if (have_dir)
			forward(c, SBX_CHANGE_ENTRY, &dircopy, name,
				have_obj ? &objcopy : NULL);
	} else if (have_obj) {
		forward(c, ch->kind, NULL, NULL, &objcopy);
	}
	free(dirpath);
}

static int c_watch_start(struct sbx_sandbox *sb, sbx_change_cb cb,
			 void *payload)
{
	struct cache *c = CACHE(sb);
	int rc;

	if (!c->inner->ops->watch_start)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "no change stream");
	c->cb = cb;
	c->cb_payload = payload;
	rc = c->inner->ops->watch_start(c->inner, on_change, c);
	if (rc == 0)
		c->watching = true;
	return rc;
}

static int c_watch_sync(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);
	int rc = c->inner->ops->watch_sync(c->inner);

	if (rc < 0) {
		/* Could not catch up: trust nothing cached. */
		pthread_mutex_lock(&c->lock);
		forget_all(c, &c->root);
		pthread_mutex_unlock(&c->lock);
	}
	return rc;
}

static void c_watch_stop(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);

	if (c->watching)
		c->inner->ops->watch_stop(c->inner);
	c->watching = false;
}

static bool c_node_stale(struct sbx_sandbox *sb, struct sbx_node *old,
			 struct sbx_node *fresh, const struct stat *st)
{
	struct cache *c = CACHE(sb);
	struct cnode *n = CNODE(old);
	bool stale = false;

	if (old == fresh)
		return false;
	pthread_mutex_lock(&c->lock);
	if (n->slot == S_ABSENT || n->orphan) {
		stale = true;
		for (struct cnode *a = n->alias; a && a != n; a = a->alias)
			if (a->slot != S_ABSENT && !a->orphan)
				stale = false;
	} else if (S_ISDIR(st->st_mode) || st->st_nlink <= 1) {
		/*
		 * One name only, and `fresh` was just found under it: what
		 * `old` knows (a slot kept PRESENT or UNKNOWN by a listing
		 * that raced the removal) is older than that.
		 */
		stale = true;
	}
	pthread_mutex_unlock(&c->lock);
	return stale;
}

static bool c_watch_healthy(struct sbx_sandbox *sb)
{
	return healthy(CACHE(sb));
}

static int c_syncfs(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);
	int rc = 0;

	for (;;) {
		struct cfile *f;

		pthread_mutex_lock(&c->lock);
		f = c->dirty;
		pthread_mutex_unlock(&c->lock);
		if (!f)
			break;
		int r = push(c, f);

		if (r < 0 && rc == 0)
			rc = r;
	}
	if (rc == 0 && c->inner->ops->syncfs)
		rc = c->inner->ops->syncfs(c->inner);
	return rc;
}

static void free_tree(struct cache *c, struct cnode *n)
{
	for (size_t b = 0; b < n->nbuckets; b++) {
		struct cnode *k = n->kids[b], *next;

		for (; k; k = next) {
			next = k->hnext;
			free_tree(c, k);
			free(k->name);
			free(k);
		}
	}
	free(n->kids);
	content_drop(c, n);
	free(n->link);
}

static void c_free(struct sbx_sandbox *sb)
{
	struct cache *c = CACHE(sb);

	if (!c)
		return;
	c_watch_stop(sb);
	free_tree(c, &c->root);
	free(c->disk_dir);
	free(c->base.session);
	free(c->base.workdir);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	free(c);
}

static const struct sbx_sandbox_ops cache_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.root = c_root,
	.lookup = c_lookup,
	.forget = c_forget,
	.getattr = c_getattr,
	.setattr = c_setattr,
	.readlink = c_readlink,
	.mknod = c_mknod,
	.mkdir = c_mkdir,
	.symlink = c_symlink,
	.link = c_link,
	.unlink = c_unlink,
	.rmdir = c_rmdir,
	.rename = c_rename,
	.open = c_open,
	.create = c_create,
	.read = c_read,
	.write = c_write,
	.flush = c_flush,
	.fsync = c_fsync,
	.release = c_release,
	.fallocate = c_fallocate,
	.lseek = c_lseek,
	.opendir = c_opendir,
	.readdir = c_readdir,
	.releasedir = c_releasedir,
	.statfs = c_statfs,
	.getxattr = c_getxattr,
	.listxattr = c_listxattr,
	.setxattr = c_setxattr,
	.removexattr = c_removexattr,
	.node_path = c_node_path,
	.exec_start = c_exec_start,
	.watch_start = c_watch_start,
	.watch_sync = c_watch_sync,
	.watch_stop = c_watch_stop,
	.watch_healthy = c_watch_healthy,
	.node_stale = c_node_stale,
	.syncfs = c_syncfs,
	.free = c_free,
};

/* Contents spilled by an earlier daemon are not trusted: remove them. */
static void clear_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d)))
		if (e->d_type == DT_REG)
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
}

int fs_cache_new(struct sbx_sandbox **out, struct sbx_sandbox *inner,
		 const char *disk_dir)
{
	struct cache *c;
	struct stat st;
	int rc;

	*out = NULL;
	if (!inner->ops->node_at)
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "the cache needs a path-based sandbox");
	c = sbx_xcalloc(1, sizeof(*c));
	c->base.ops = &cache_ops;
	c->base.session = sbx_xstrdup(inner->session ? inner->session : "");
	c->base.workdir = sbx_xstrdup(inner->workdir ? inner->workdir : "");
	c->inner = inner;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	rc = inner_stat(c, "", &st);
	if (rc < 0) {
		c_free(&c->base);
		return sbx_error_prefix(rc, "sandbox root");
	}
	set_st(c, &c->root, &st);
	if (disk_dir) {
		if (sbx_paths_mkdir_p(disk_dir, 0700) == 0) {
			c->disk_dir = sbx_xstrdup(disk_dir);
			clear_dir(disk_dir);
		} else {
			sbx_warn("content cache stays in memory: %s",
				 sbx_error_last()->msg);
			sbx_error_clear();
		}
	}
	*out = &c->base;
	return 0;
}
