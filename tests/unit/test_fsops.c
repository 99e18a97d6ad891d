/*
 * Unit tests: fs/ops.c, the FUSE low-level operations, without a kernel.
 *
 * The operations only talk to libfuse through the request (userdata,
 * caller context) and the fuse_reply_* / fuse_add_direntry* functions.
 * This file defines those functions itself, so the linker binds ops.c to
 * them instead of libfuse's: each "request" is a struct fuse_req of ours
 * that records the reply.  The operations run over the in-memory sandbox
 * (providers/mem), directly or through the caching layer (fs/cache.c) as
 * for a remote sandbox, and the table is called the way the kernel would
 * (fs_ops.lookup, fs_ops.create, ...).  The change stream, when started,
 * reaches fs_apply_change(); its kernel notifications are recorded too.
 *
 * What a mount adds (the kernel's own caches, permission checks, the
 * zero-message opens of a descriptor provider) is covered by the
 * integration tests (tests/integration/test_fileops.py).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/fs.h"
#include "sbx/provider.h"
#include "../../fs/cache.h"
#include "../../fs/fs_i.h"
#include "../../providers/mem/pmem.h"

/* ---- a libfuse of our own ------------------------------------------------ */

enum reply {
	R_NONE_YET = 0, R_ERR, R_NONE, R_ENTRY, R_CREATE, R_ATTR, R_READLINK,
	R_OPEN, R_WRITE, R_BUF, R_STATFS, R_XATTR, R_LSEEK, R_DATA,
};

struct fuse_req {
	struct fs *fs;
	struct fuse_ctx ctx;
	int fail;             /* the reply "fails" (interrupted request) */
	enum reply kind;
	int err;
	struct fuse_entry_param e;
	struct fuse_file_info fi;
	struct stat attr;
	double timeout;
	char *buf;
	size_t len;           /* buf's length, a write or xattr count */
};

/* One directory entry as our fuse_add_direntry* lay them out. */
struct rec {
	char name[48];
	uint64_t ino;
	uint64_t off;
};

static int replied(fuse_req_t req, enum reply kind)
{
	assert_int_equal(req->kind, R_NONE_YET); /* one reply per request */
	req->kind = kind;
	return req->fail ? -ENOENT : 0;
}

void *fuse_req_userdata(fuse_req_t req)
{
	return req->fs;
}

const struct fuse_ctx *fuse_req_ctx(fuse_req_t req)
{
	return &req->ctx;
}

int fuse_reply_err(fuse_req_t req, int err)
{
	req->err = err;
	return replied(req, R_ERR);
}

void fuse_reply_none(fuse_req_t req)
{
	(void)replied(req, R_NONE);
}

int fuse_reply_entry(fuse_req_t req, const struct fuse_entry_param *e)
{
	req->e = *e;
	return replied(req, R_ENTRY);
}

int fuse_reply_create(fuse_req_t req, const struct fuse_entry_param *e,
		      const struct fuse_file_info *fi)
{
	req->e = *e;
	req->fi = *fi;
	return replied(req, R_CREATE);
}

int fuse_reply_attr(fuse_req_t req, const struct stat *attr,
		    double attr_timeout)
{
	req->attr = *attr;
	req->timeout = attr_timeout;
	return replied(req, R_ATTR);
}

int fuse_reply_readlink(fuse_req_t req, const char *link)
{
	req->buf = strdup(link);
	req->len = strlen(link);
	return replied(req, R_READLINK);
}

int fuse_reply_open(fuse_req_t req, const struct fuse_file_info *fi)
{
	req->fi = *fi;
	return replied(req, R_OPEN);
}

int fuse_reply_write(fuse_req_t req, size_t count)
{
	req->len = count;
	return replied(req, R_WRITE);
}

int fuse_reply_buf(fuse_req_t req, const char *buf, size_t size)
{
	req->buf = malloc(size + 1);
	if (size)
		memcpy(req->buf, buf, size);
	req->buf[size] = '\0';
	req->len = size;
	return replied(req, R_BUF);
}

int fuse_reply_data(fuse_req_t req, struct fuse_bufvec *bufv,
		    enum fuse_buf_copy_flags flags)
{
	(void)bufv;
	(void)flags;
	return replied(req, R_DATA);
}

int fuse_reply_statfs(fuse_req_t req, const struct statvfs *stbuf)
{
	(void)stbuf;
	return replied(req, R_STATFS);
}

int fuse_reply_xattr(fuse_req_t req, size_t count)
{
	req->len = count;
	return replied(req, R_XATTR);
}

int fuse_reply_lseek(fuse_req_t req, off_t off)
{
	req->len = (size_t)off;
	return replied(req, R_LSEEK);
}

static size_t add_rec(char *buf, size_t bufsize, const char *name,
		      uint64_t ino, off_t off)
{
	struct rec r;

	if (!buf || bufsize < sizeof(r))
		return sizeof(r);
	memset(&r, 0, sizeof(r));
	snprintf(r.name, sizeof(r.name), "%s", name);
	r.ino = ino;
	r.off = (uint64_t)off;
	memcpy(buf, &r, sizeof(r));
	return sizeof(r);
}

size_t fuse_add_direntry(fuse_req_t req, char *buf, size_t bufsize,
			 const char *name, const struct stat *stbuf, off_t off)
{
	(void)req;
	return add_rec(buf, bufsize, name, stbuf ? stbuf->st_ino : 0, off);
}

size_t fuse_add_direntry_plus(fuse_req_t req, char *buf, size_t bufsize,
			      const char *name,
			      const struct fuse_entry_param *e, off_t off)
{
	(void)req;
	return add_rec(buf, bufsize, name, e ? e->ino : 0, off);
}

/* Kernel notifications from the change stream (fs.c). */
static pthread_mutex_t inval_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t inval_cond = PTHREAD_COND_INITIALIZER;
static char inval_names[64][64];
static fuse_ino_t inval_parents[64];
static int ninval_entry, ninval_inode;
/* While set, an entry invalidation waits, as the kernel's waits for the
 * directory's lock while a process holds it to list the directory. */
static bool inval_blocked;

int fuse_lowlevel_notify_inval_entry(struct fuse_session *se,
				     fuse_ino_t parent, const char *name,
				     size_t namelen)
{
	(void)se;
	pthread_mutex_lock(&inval_lock);
	while (inval_blocked)
		pthread_cond_wait(&inval_cond, &inval_lock);
	if (ninval_entry < 64) {
		snprintf(inval_names[ninval_entry], 64, "%.*s", (int)namelen,
			 name);
		inval_parents[ninval_entry] = parent;
	}
	ninval_entry++;
	pthread_mutex_unlock(&inval_lock);
	return 0;
}

int fuse_lowlevel_notify_inval_inode(struct fuse_session *se, fuse_ino_t ino,
				     off_t off, off_t len)
{
	(void)se;
	(void)ino;
	(void)off;
	(void)len;
	pthread_mutex_lock(&inval_lock);
	ninval_inode++;
	pthread_mutex_unlock(&inval_lock);
	return 0;
}

static bool entry_invalidated(fuse_ino_t parent, const char *name)
{
	bool found = false;

	pthread_mutex_lock(&inval_lock);
	for (int i = 0; i < ninval_entry && i < 64; i++)
		if (inval_parents[i] == parent &&
		    strcmp(inval_names[i], name) == 0)
			found = true;
	pthread_mutex_unlock(&inval_lock);
	return found;
}

/* ---- the daemon's state over a mem sandbox ------------------------------- */

struct env {
	struct sbx_sandbox *mem;
	struct sbx_sandbox *cache; /* NULL: the daemon serves mem directly */
	struct fs fs;
	struct fuse_req req;       /* the current request */
};

static int setup_with(void **state, bool cached, bool watch)
{
	struct env *e = calloc(1, sizeof(*e));
	struct stat st;

	assert_int_equal(pmem_new(&e->mem, NULL), 0);
	e->fs.sb = e->mem;
	if (cached) {
		assert_true(fs_cache_supported(e->mem));
		assert_int_equal(fs_cache_new(&e->cache, e->mem, NULL), 0);
		e->fs.sb = e->cache;
		e->fs.cached = true;
	}
	e->fs.session = "t";
	pthread_mutex_init(&e->fs.lock, NULL);
	pthread_mutex_init(&e->fs.barrier_lock, NULL);
	fs_negatives_init(&e->fs);
	fs_replay_init(&e->fs);
	fs_inodes_init(&e->fs);
	e->fs.root.node = e->fs.sb->ops->root(e->fs.sb);
	assert_int_equal(e->fs.sb->ops->getattr(e->fs.sb, e->fs.root.node,
						NULL, &st), 0);
	e->fs.root.dev = st.st_dev;
	e->fs.root.ino = st.st_ino;
	e->fs.root.nlookup = 2;
	e->fs.zero_open = e->fs.sb->ops->file_fd != NULL;
	if (watch) {
		assert_int_equal(e->fs.sb->ops->watch_start(e->fs.sb,
							    fs_apply_change,
							    &e->fs), 0);
		e->fs.watching = true;
	}
	ninval_entry = ninval_inode = 0;
	*state = e;
	return 0;
}

static int setup_direct(void **state)
{
	return setup_with(state, false, false);
}

static int setup_cached(void **state)
{
	return setup_with(state, true, false);
}

static int setup_cached_watched(void **state)
{
	return setup_with(state, true, true);
}

static int teardown(void **state)
{
	struct env *e = *state;

	if (e->fs.watching)
		e->fs.sb->ops->watch_stop(e->fs.sb);
	fs_replay_fini(&e->fs);
	fs_inodes_fini(&e->fs);
	for (size_t i = 0; i < FS_RECENT_ENTRIES; i++)
		free(e->fs.recent[i].name);
	free(e->req.buf);
	sbx_sandbox_free(e->cache);
	sbx_sandbox_free(e->mem);
	pthread_mutex_destroy(&e->fs.lock);
	pthread_mutex_destroy(&e->fs.barrier_lock);
	fs_negatives_fini(&e->fs);
	free(e);
	return 0;
}

/* A fresh request (the previous one's reply is dropped). */
static fuse_req_t req(struct env *e)
{
	free(e->req.buf);
	memset(&e->req, 0, sizeof(e->req));
	e->req.fs = &e->fs;
	e->req.ctx.uid = geteuid();
	e->req.ctx.gid = getegid();
	e->req.ctx.umask = 022;
	return &e->req;
}

/* The errno of the reply (0 for a successful reply of another kind). */
static int err_of(struct env *e)
{
	assert_int_not_equal(e->req.kind, R_NONE_YET);
	return e->req.kind == R_ERR ? e->req.err : 0;
}

static fuse_ino_t lookup(struct env *e, fuse_ino_t dir, const char *name)
{
	fs_ops.lookup(req(e), dir, name);
	return e->req.kind == R_ENTRY ? e->req.e.ino : 0;
}

static fuse_ino_t mkdir_(struct env *e, fuse_ino_t dir, const char *name)
{
	fs_ops.mkdir(req(e), dir, name, 0755);
	assert_int_equal(e->req.kind, R_ENTRY);
	return e->req.e.ino;
}

/* create + write + release, as `echo data > name` does. */
static fuse_ino_t write_file(struct env *e, fuse_ino_t dir, const char *name,
			     const char *data)
{
	struct fuse_file_info fi;
	struct fuse_bufvec bv = FUSE_BUFVEC_INIT(strlen(data));
	fuse_ino_t ino;

	memset(&fi, 0, sizeof(fi));
	fi.flags = O_WRONLY | O_CREAT | O_TRUNC;
	fs_ops.create(req(e), dir, name, 0644, &fi);
	assert_int_equal(e->req.kind, R_CREATE);
	ino = e->req.e.ino;
	fi = e->req.fi;
	assert_true(fi.fh != 0);
	bv.buf[0].mem = (void *)data;
	fs_ops.write_buf(req(e), ino, &bv, 0, &fi);
	assert_int_equal(e->req.kind, R_WRITE);
	assert_int_equal(e->req.len, strlen(data));
	fs_ops.flush(req(e), ino, &fi);
	assert_int_equal(err_of(e), 0);
	fs_ops.release(req(e), ino, &fi);
	assert_int_equal(err_of(e), 0);
	return ino;
}

static char *read_file(struct env *e, fuse_ino_t ino)
{
	struct fuse_file_info fi;

	memset(&fi, 0, sizeof(fi));
	fi.flags = O_RDONLY;
	fs_ops.open(req(e), ino, &fi);
	assert_int_equal(e->req.kind, R_OPEN);
	fi = e->req.fi;
	fs_ops.read(req(e), ino, 4096, 0, &fi);
	assert_int_equal(e->req.kind, R_BUF);
	char *s = strdup(e->req.buf);

	fs_ops.release(req(e), ino, &fi);
	return s;
}

/* Is `name` in the listing of dir (readdir or readdirplus)? */
static bool listed(struct env *e, fuse_ino_t dir, const char *name,
		   bool plus, uint64_t *ino_out)
{
	struct fuse_file_info fi;
	bool found = false;

	memset(&fi, 0, sizeof(fi));
	fs_ops.opendir(req(e), dir, &fi);
	assert_int_equal(e->req.kind, R_OPEN);
	fi = e->req.fi;
	if (plus)
		fs_ops.readdirplus(req(e), dir, 64 * sizeof(struct rec), 0,
				   &fi);
	else
		fs_ops.readdir(req(e), dir, 64 * sizeof(struct rec), 0, &fi);
	assert_int_equal(e->req.kind, R_BUF);
	assert_int_equal(e->req.len % sizeof(struct rec), 0);
	for (size_t i = 0; i < e->req.len / sizeof(struct rec); i++) {
		struct rec r;

		memcpy(&r, e->req.buf + i * sizeof(r), sizeof(r));
		if (strcmp(r.name, name) == 0) {
			found = true;
			if (ino_out)
				*ino_out = r.ino;
		}
	}
	fs_ops.releasedir(req(e), dir, &fi);
	assert_int_equal(err_of(e), 0);
	return found;
}

/* ---- tests ------------------------------------------------------------- */

static void test_lookup_and_forget(void **state)
{
	struct env *e = *state;
	fuse_ino_t d, again;
	struct fs_inode *in;

	assert_int_equal(lookup(e, FUSE_ROOT_ID, "d"), 0);
	assert_int_equal(err_of(e), ENOENT);
	d = mkdir_(e, FUSE_ROOT_ID, "d");
	assert_true(S_ISDIR(e->req.e.attr.st_mode));
	/* Blind (no change stream): short timeouts. */
	assert_true(e->req.e.entry_timeout <= 1.0);
	again = lookup(e, FUSE_ROOT_ID, "d");
	assert_int_equal(again, d); /* one kernel inode per object */
	in = fs_inode_get(&e->fs, d);
	assert_int_equal(in->nlookup, 2);
	assert_string_equal(in->name, "d");
	fs_ops.forget(req(e), d, 1);
	assert_int_equal(e->req.kind, R_NONE);
	assert_int_equal(in->nlookup, 1);
	{
		struct fuse_forget_data f = {.ino = d, .nlookup = 1};

		fs_ops.forget_multi(req(e), 1, &f);
	}
	assert_int_equal(e->req.kind, R_NONE);
	assert_int_equal(fs_inode_find(&e->fs, e->fs.root.dev,
				       e->req.e.attr.st_ino, NULL), 0);
}

/* ENAMETOOLONG for every provider, before any call (ext4's answer). */
static void test_name_too_long(void **state)
{
	struct env *e = *state;
	char name[NAME_MAX + 2];
	struct fuse_file_info fi;

	memset(name, 'x', sizeof(name) - 1);
	name[sizeof(name) - 1] = '\0';
	lookup(e, FUSE_ROOT_ID, name);
	assert_int_equal(err_of(e), ENAMETOOLONG);
	fs_ops.mkdir(req(e), FUSE_ROOT_ID, name, 0755);
	assert_int_equal(err_of(e), ENAMETOOLONG);
	fs_ops.symlink(req(e), "t", FUSE_ROOT_ID, name);
	assert_int_equal(err_of(e), ENAMETOOLONG);
	memset(&fi, 0, sizeof(fi));
	fs_ops.create(req(e), FUSE_ROOT_ID, name, 0644, &fi);
	assert_int_equal(err_of(e), ENAMETOOLONG);
	fs_ops.rename(req(e), FUSE_ROOT_ID, "a", FUSE_ROOT_ID, name, 0);
	assert_int_equal(err_of(e), ENAMETOOLONG);
	/* Exactly NAME_MAX is a name like any other. */
	name[NAME_MAX] = '\0';
	mkdir_(e, FUSE_ROOT_ID, name);
}

static void test_write_read_getattr(void **state)
{
	struct env *e = *state;
	fuse_ino_t f = write_file(e, FUSE_ROOT_ID, "f", "hello");
	char *s;

	s = read_file(e, f);
	assert_string_equal(s, "hello");
	free(s);
	fs_ops.getattr(req(e), f, NULL);
	assert_int_equal(e->req.kind, R_ATTR);
	assert_int_equal(e->req.attr.st_size, 5);
	assert_true(S_ISREG(e->req.attr.st_mode));
	/* Overwrite in place, then read again. */
	write_file(e, FUSE_ROOT_ID, "f", "bye");
	s = read_file(e, f);
	assert_string_equal(s, "bye");
	free(s);
	/* truncate(2) by name: a setattr without a file. */
	{
		struct stat st;

		memset(&st, 0, sizeof(st));
		fs_ops.setattr(req(e), f, &st, FUSE_SET_ATTR_SIZE, NULL);
		assert_int_equal(e->req.kind, R_ATTR);
		assert_int_equal(e->req.attr.st_size, 0);
	}
}

/* A writer is counted per open for writing, until release. */
static void test_writers_counted(void **state)
{
	struct env *e = *state;
	fuse_ino_t f = write_file(e, FUSE_ROOT_ID, "f", "x");
	struct fuse_file_info fi;
	unsigned w = 9;

	memset(&fi, 0, sizeof(fi));
	fi.flags = O_RDWR;
	fs_ops.open(req(e), f, &fi);
	fi = e->req.fi;
	fs_inode_find(&e->fs, e->fs.root.dev,
		      fs_inode_get(&e->fs, f)->ino, &w);
	assert_int_equal(w, 1);
	fs_ops.release(req(e), f, &fi);
	fs_inode_find(&e->fs, e->fs.root.dev,
		      fs_inode_get(&e->fs, f)->ino, &w);
	assert_int_equal(w, 0);
}

static void test_readdir_and_plus(void **state)
{
	struct env *e = *state;
	fuse_ino_t d = mkdir_(e, FUSE_ROOT_ID, "d"), f;
	uint64_t ino = 0;

	f = write_file(e, d, "f", "1");
	mkdir_(e, d, "sub");
	assert_true(listed(e, d, "f", false, NULL));
	assert_true(listed(e, d, "sub", false, NULL));
	assert_false(listed(e, d, "nope", false, NULL));
	/* readdirplus hands out entries: the same kernel inode as lookup. */
	assert_true(listed(e, d, "f", true, &ino));
	assert_int_equal(ino, f);
	assert_true(fs_inode_get(&e->fs, f)->nlookup >= 2);
}

static void test_unlink_rmdir(void **state)
{
	struct env *e = *state;
	fuse_ino_t d = mkdir_(e, FUSE_ROOT_ID, "d");

	write_file(e, d, "f", "data");
	fs_ops.rmdir(req(e), FUSE_ROOT_ID, "d");
	assert_int_equal(err_of(e), ENOTEMPTY);
	fs_ops.unlink(req(e), d, "f");
	assert_int_equal(err_of(e), 0);
	assert_int_equal(lookup(e, d, "f"), 0);
	assert_int_equal(err_of(e), ENOENT);
	fs_ops.unlink(req(e), d, "f");
	assert_int_equal(err_of(e), ENOENT);
	fs_ops.rmdir(req(e), FUSE_ROOT_ID, "d");
	assert_int_equal(err_of(e), 0);
	assert_int_equal(lookup(e, FUSE_ROOT_ID, "d"), 0);
}

/*
 * Cached only: a mem node names a fixed path (pmem.h), so served directly
 * the kernel inode of a renamed file would keep the old path; the caching
 * layer's nodes follow renames, as the daemon needs.
 */
static void test_rename(void **state)
{
	struct env *e = *state;
	fuse_ino_t d = mkdir_(e, FUSE_ROOT_ID, "d");
	fuse_ino_t f = write_file(e, d, "f", "data");
	char *s;

	fs_ops.rename(req(e), d, "f", FUSE_ROOT_ID, "g", 0);
	assert_int_equal(err_of(e), 0);
	assert_int_equal(lookup(e, d, "f"), 0);
	assert_int_equal(err_of(e), ENOENT);
	assert_int_equal(lookup(e, FUSE_ROOT_ID, "g"), f);
	s = read_file(e, f);
	assert_string_equal(s, "data");
	free(s);
	fs_ops.rename(req(e), FUSE_ROOT_ID, "g", FUSE_ROOT_ID, "d",
		      RENAME_NOREPLACE);
	assert_int_equal(err_of(e), EEXIST);
}

static void test_symlink_readlink_link(void **state)
{
	struct env *e = *state;
	fuse_ino_t f = write_file(e, FUSE_ROOT_ID, "f", "x"), l;

	fs_ops.symlink(req(e), "f", FUSE_ROOT_ID, "s");
	assert_int_equal(e->req.kind, R_ENTRY);
	l = e->req.e.ino;
	fs_ops.readlink(req(e), l);
	assert_int_equal(e->req.kind, R_READLINK);
	assert_string_equal(e->req.buf, "f");
	/* A hard link is the same kernel inode. */
	fs_ops.link(req(e), f, FUSE_ROOT_ID, "h");
	assert_int_equal(e->req.kind, R_ENTRY);
	assert_int_equal(e->req.e.ino, f);
	assert_int_equal(e->req.e.attr.st_nlink, 2);
}

/* The daemon's own read-only attributes, and the provider's absence. */
static void test_virtual_xattrs(void **state)
{
	struct env *e = *state;

	fs_ops.getxattr(req(e), FUSE_ROOT_ID, "user.sbx.session", 0);
	assert_int_equal(e->req.kind, R_XATTR);
	assert_int_equal(e->req.len, 1);
	fs_ops.getxattr(req(e), FUSE_ROOT_ID, "user.sbx.session", 16);
	assert_int_equal(e->req.kind, R_BUF);
	assert_string_equal(e->req.buf, "t");
	e->fs.session = "longer";
	fs_ops.getxattr(req(e), FUSE_ROOT_ID, "user.sbx.session", 2);
	assert_int_equal(err_of(e), ERANGE);
	e->fs.session = "t";
	fs_ops.getxattr(req(e), FUSE_ROOT_ID, "user.sbx.control", 64);
	assert_int_equal(err_of(e), ENODATA); /* no control socket */
	fs_ops.getxattr(req(e), FUSE_ROOT_ID, "user.sbx.path", 256);
	assert_int_equal(e->req.kind, R_BUF);
	assert_string_equal(e->req.buf, "/sandbox");
	fs_ops.setxattr(req(e), FUSE_ROOT_ID, "user.sbx.path", "x", 1, 0);
	assert_int_equal(err_of(e), EPERM);
	fs_ops.removexattr(req(e), FUSE_ROOT_ID, "user.sbx.session");
	assert_int_equal(err_of(e), EPERM);
	/* The mem sandbox has no xattrs of its own. */
	fs_ops.setxattr(req(e), FUSE_ROOT_ID, "user.other", "x", 1, 0);
	assert_int_equal(err_of(e), EOPNOTSUPP);
	fs_ops.listxattr(req(e), FUSE_ROOT_ID, 0);
	assert_int_equal(e->req.kind, R_XATTR);
	assert_int_equal(e->req.len, 0);
}

/* A reply the kernel never took (interrupted): the lookup is undone. */
static void test_failed_entry_reply_forgets(void **state)
{
	struct env *e = *state;
	fuse_ino_t d;
	fuse_req_t r;

	mkdir_(e, FUSE_ROOT_ID, "d");
	d = lookup(e, FUSE_ROOT_ID, "d");
	fs_ops.forget(req(e), d, 2);
	r = req(e);
	r->fail = 1;
	fs_ops.lookup(r, FUSE_ROOT_ID, "d");
	assert_int_equal(r->kind, R_ENTRY);
	assert_int_equal(fs_inode_find(&e->fs, e->fs.root.dev,
				       r->e.attr.st_ino, NULL), 0);
}

static void test_statfs_fsync_lseek(void **state)
{
	struct env *e = *state;
	fuse_ino_t f = write_file(e, FUSE_ROOT_ID, "f", "abc");
	struct fuse_file_info fi;

	fs_ops.statfs(req(e), FUSE_ROOT_ID);
	assert_int_equal(e->req.kind, R_STATFS);
	memset(&fi, 0, sizeof(fi));
	fi.flags = O_RDWR;
	fs_ops.open(req(e), f, &fi);
	fi = e->req.fi;
	fs_ops.fsync(req(e), f, 0, &fi);
	assert_int_equal(err_of(e), 0);
	fs_ops.lseek(req(e), f, 0, SEEK_DATA, &fi);
	assert_int_equal(e->req.kind, R_LSEEK);
	assert_int_equal(e->req.len, 0);
	fs_ops.release(req(e), f, &fi);
	assert_int_equal(err_of(e), 0);
}

/*
 * With a healthy change stream: a missing name is a negative entry the
 * kernel keeps (ino 0, long timeout), and a name created behind the mount
 * drops it through fs_apply_change().
 */
static void test_negative_entry_and_change(void **state)
{
	struct env *e = *state;

	assert_int_equal(lookup(e, FUSE_ROOT_ID, "n"), 0);
	assert_int_equal(e->req.kind, R_ENTRY); /* negative entry */
	assert_int_equal(e->req.e.ino, 0);
	assert_true(e->req.e.entry_timeout > 1.0);
	assert_int_equal(pmem_ext_write(e->mem, "n", "x", 1), 0);
	assert_int_equal(e->fs.sb->ops->watch_sync(e->fs.sb), 0);
	assert_true(entry_invalidated(FUSE_ROOT_ID, "n"));
	assert_true(lookup(e, FUSE_ROOT_ID, "n") != 0);
}

/*
 * Lost events (an overflow): the negative entries given with the long
 * timeout are dropped too, though no inode leads to them; a name that
 * got an entry since is off the list (not dropped again).
 */
static void test_overflow_drops_negative_entries(void **state)
{
	struct env *e = *state;

	assert_int_equal(lookup(e, FUSE_ROOT_ID, "n"), 0);
	assert_int_equal(e->req.e.ino, 0);
	assert_true(e->req.e.entry_timeout > 1.0);
	assert_int_equal(lookup(e, FUSE_ROOT_ID, "m"), 0);
	assert_int_equal(e->req.e.ino, 0);
	assert_int_equal(sbx_hashmap_count(&e->fs.negatives), 2);
	/* "m" made through the mount: its entry replaces the negative one. */
	assert_true(mkdir_(e, FUSE_ROOT_ID, "m") != 0);
	assert_int_equal(sbx_hashmap_count(&e->fs.negatives), 1);
	ninval_entry = 0;
	pmem_ext_overflow(e->mem);
	assert_int_equal(e->fs.sb->ops->watch_sync(e->fs.sb), 0);
	assert_true(entry_invalidated(FUSE_ROOT_ID, "n"));
	assert_int_equal(sbx_hashmap_count(&e->fs.negatives), 0);
}

/*
 * A FUSE call made on a thread of its own (`run`), so that the test can
 * see whether it returns while the kernel holds the invalidations back
 * (inval_hold()).
 */
struct bg_call {
	struct env *e;
	struct fuse_file_info fi;
	void (*run)(struct bg_call *b);
	pthread_t t;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done;
};

#define BG_CALL(env, fn)                                                       	{ .e = (env), .run = (fn), .lock = PTHREAD_MUTEX_INITIALIZER,          	  .cond = PTHREAD_COND_INITIALIZER }

static void *bg_main(void *arg)
{
	struct bg_call *b = arg;

	b->run(b);
	pthread_mutex_lock(&b->lock);
	b->done = true;
	pthread_cond_broadcast(&b->cond);
	pthread_mutex_unlock(&b->lock);
	return NULL;
}

/* Start b; did it return within 5 s? */
static bool bg_returns(struct bg_call *b)
{
	struct timespec until;
	bool done;

	assert_int_equal(pthread_create(&b->t, NULL, bg_main, b), 0);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	pthread_mutex_lock(&b->lock);
	while (!b->done &&
	       pthread_cond_timedwait(&b->cond, &b->lock, &until) == 0)
		;
	done = b->done;
	pthread_mutex_unlock(&b->lock);
	return done;
}

/* The kernel holds every invalidation back (counted from 0), or lets
 * them through. */
static void inval_hold(bool hold)
{
	pthread_mutex_lock(&inval_lock);
	inval_blocked = hold;
	if (hold)
		ninval_entry = ninval_inode = 0;
	else
		pthread_cond_broadcast(&inval_cond);
	pthread_mutex_unlock(&inval_lock);
}

static void readdir_second(struct bg_call *b)
{
	/* The listing's second READDIR (its snapshot was taken by the
	 * first, at offset 0): after ".", "..". */
	fs_ops.readdirplus(req(b->e), FUSE_ROOT_ID, 64 * sizeof(struct rec),
			   2, &b->fi);
}

/*
 * A listing answered while the directory changed a lot (more changes than
 * FS_RECENT_ENTRIES since its snapshot): the invalidations that follow the
 * reply are sent by the replay thread, and the READDIR handler returns
 * while they wait for the directory (stress test: sent by the workers,
 * they all waited there while a process listing the directory held its
 * lock, waiting for an answer none was left to give -- the mount hung).
 */
static void test_readdir_replay_does_not_hold_the_worker(void **state)
{
	struct env *e = *state;
	struct bg_call r = BG_CALL(e, readdir_second);
	bool done;

	write_file(e, FUSE_ROOT_ID, "f", "1");
	assert_int_equal(fs_replay_start(&e->fs), 0);
	memset(&r.fi, 0, sizeof(r.fi));
	fs_ops.opendir(req(e), FUSE_ROOT_ID, &r.fi);
	assert_int_equal(e->req.kind, R_OPEN);
	r.fi = e->req.fi;
	fs_ops.readdirplus(req(e), FUSE_ROOT_ID, 64 * sizeof(struct rec), 0,
			   &r.fi);
	assert_int_equal(e->req.kind, R_BUF);
	/* Changes behind the mount, more than the recent ones kept. */
	for (int i = 0; i < FS_RECENT_ENTRIES + 10; i++) {
		char name[32];
		struct sbx_change c = { .kind = SBX_CHANGE_ENTRY,
					.dir_dev = e->fs.root.dev,
					.dir_ino = e->fs.root.ino,
					.name = name };

		snprintf(name, sizeof(name), "churn%d", i);
		fs_apply_change(&c, &e->fs);
	}
	/* (Their own notifications, sent by the replay thread too.) */
	assert_int_equal(fs_notify_drain(&e->fs, 5000), 0);
	inval_hold(true);
	done = bg_returns(&r);
	/* The kernel lets the invalidations through. */
	inval_hold(false);
	assert_int_equal(pthread_join(r.t, NULL), 0);
	assert_true(done);
	assert_int_equal(e->req.kind, R_BUF);
	/* ...and the replay runs, after the changes' own notifications
	 * (on its thread: wait for it, at most 5 s): every known child,
	 * then the directory. */
	assert_int_equal(fs_notify_drain(&e->fs, 5000), 0);
	pthread_mutex_lock(&inval_lock);
	done = ninval_inode > 0;
	pthread_mutex_unlock(&inval_lock);
	assert_true(done);
	assert_true(entry_invalidated(FUSE_ROOT_ID, "f"));
	fs_ops.releasedir(req(e), FUSE_ROOT_ID, &r.fi);
}

static void apply_change_x(struct bg_call *b)
{
	struct sbx_change c = { .kind = SBX_CHANGE_ENTRY,
				.dir_dev = b->e->fs.root.dev,
				.dir_ino = b->e->fs.root.ino,
				.name = "x" };

	fs_apply_change(&c, &b->e->fs);
}

/*
 * The change stream's thread never waits for the kernel: while the kernel
 * holds an invalidation (a page a reader locked, a directory a lister
 * locked), the change is applied and its notifications wait on the replay
 * thread.  Sent by the stream's thread, they waited there, and a READ
 * whose handler waited for the stream (a barrier) stalled 30 s at a time
 * (stress test: a directory removed and made again in the sandbox while
 * its files were read).
 */
static void test_change_stream_does_not_wait_for_the_kernel(void **state)
{
	struct env *e = *state;
	struct bg_call a = BG_CALL(e, apply_change_x);
	bool done;

	assert_int_equal(fs_replay_start(&e->fs), 0);
	inval_hold(true);
	done = bg_returns(&a);
	/* Sent only once the kernel lets it through. */
	assert_int_equal(fs_notify_drain(&e->fs, 100), -ETIMEDOUT);
	inval_hold(false);
	assert_int_equal(pthread_join(a.t, NULL), 0);
	assert_true(done);
	assert_int_equal(fs_notify_drain(&e->fs, 5000), 0);
	assert_true(entry_invalidated(FUSE_ROOT_ID, "x"));
}

#define BOTH(t)                                                                \
	cmocka_unit_test_setup_teardown(t, setup_direct, teardown),            \
	cmocka_unit_test_setup_teardown(t, setup_cached, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		BOTH(test_lookup_and_forget),
		BOTH(test_name_too_long),
		BOTH(test_write_read_getattr),
		BOTH(test_writers_counted),
		BOTH(test_readdir_and_plus),
		BOTH(test_unlink_rmdir),
		cmocka_unit_test_setup_teardown(test_rename, setup_cached,
						teardown),
		BOTH(test_symlink_readlink_link),
		BOTH(test_virtual_xattrs),
		BOTH(test_failed_entry_reply_forgets),
		BOTH(test_statfs_fsync_lseek),
		cmocka_unit_test_setup_teardown(test_negative_entry_and_change,
						setup_cached_watched,
						teardown),
		cmocka_unit_test_setup_teardown(
			test_overflow_drops_negative_entries,
			setup_cached_watched, teardown),
		BOTH(test_readdir_replay_does_not_hold_the_worker),
	BOTH(test_change_stream_does_not_wait_for_the_kernel),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
