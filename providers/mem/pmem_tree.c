/*
 * The in-memory sandbox's tree: inode objects in a table indexed by inode
 * number; a directory holds its entries (name -> inode) in an array, in
 * creation order.  Every change is made by one *_locked helper shared by
 * the operation and its pmem_ext_*() twin, which also queues the change
 * events.  See pmem_i.h.
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
#include <time.h>
#include <unistd.h>

#include "sbx/proto.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "pmem_i.h"

/* ---- the tree ------------------------------------------------------------ */

/* A timestamp strictly after every earlier one.  Caller holds s->lock. */
struct timespec pmem_stamp_locked(struct pmem *s)
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

struct pinode *pmem_inode_new_locked(struct pmem *s, mode_t mode)
{
	struct pinode *in = sbx_xcalloc(1, sizeof(*in));

	in->ino = ino_alloc_locked(s);
	in->mode = mode;
	in->nlink = S_ISDIR(mode) ? 2 : 1;
	in->uid = geteuid();
	in->gid = getegid();
	in->atim = in->mtim = in->ctim = pmem_stamp_locked(s);
	s->itab[in->ino] = in;
	return in;
}

void pmem_inode_free(struct pinode *in)
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
		pmem_inode_free(in);
	} else {
		in->ctim = pmem_stamp_locked(s);
	}
}

void pmem_fill_stat(const struct pmem *s, const struct pinode *in,
		    struct stat *st)
{
	off_t size = 0;

	if (S_ISREG(in->mode))
		size = (off_t)in->size;
	else if (S_ISDIR(in->mode))
		size = DIR_SIZE;
	else if (S_ISLNK(in->mode))
		size = (off_t)strlen(in->target);
	memset(st, 0, sizeof(*st));
	*st = (struct stat){
		.st_dev = s->dev, .st_ino = in->ino, .st_mode = in->mode,
		.st_nlink = in->nlink, .st_uid = in->uid, .st_gid = in->gid,
		.st_rdev = in->rdev, .st_size = size, .st_blksize = 4096,
		.st_blocks = (size + 511) / 512, .st_atim = in->atim,
		.st_mtim = in->mtim, .st_ctim = in->ctim,
	};
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
	dir->mtim = dir->ctim = pmem_stamp_locked(s);
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
	dir->mtim = dir->ctim = pmem_stamp_locked(s);
	return in;
}

/*
 * Walk a clean path (see sbx_proto_path_clean) to its inode.  Returns
 * -ENOENT or -ENOTDIR (an intermediate component is not a directory).
 */
int pmem_check_ino_locked(struct pmem *s, const char *path, ino_t ino,
			  const char *what)
{
	struct pinode *in;
	int rc;

	if (!ino)
		return 0;
	rc = pmem_walk_locked(s, path, &in);
	if (rc == 0 && in->ino != ino)
		rc = sbx_error_set(SBX_ERR_REMOTE, -ESTALE,
				   "%s %s: the path names another file now",
				   what, path);
	return rc;
}

int pmem_walk_locked(struct pmem *s, const char *path, struct pinode **out)
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

int pmem_stat_locked(struct pmem *s, const char *path, void *st)
{
	struct pinode *in;
	int rc = pmem_walk_locked(s, path, &in);

	if (rc == 0 && st)
		pmem_fill_stat(s, in, st);
	return rc;
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
	rc = pmem_walk_locked(s, dpath, dir);
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
int pmem_clean(const char *in, char **out)
{
	int rc = sbx_proto_path_clean(in, out);

	if (rc < 0)
		return sbx_error_set(SBX_ERR_REMOTE, rc, "bad path \"%s\"",
				     in);
	return 0;
}

/* The path of entry `name` in directory node `dir`; -EINVAL for bad names. */
int pmem_child(struct sbx_node *dir, const char *name, char **out)
{
	*out = NULL;
	if (!*name || strchr(name, '/') || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "bad name \"%s\"", name);
	*out = sbx_proto_path_join(PNODE(dir)->path, name);
	return 0;
}

struct pnode *pmem_node_new(const char *path)
{
	struct pnode *n = sbx_xcalloc(1, sizeof(*n));

	n->path = sbx_xstrdup(path);
	return n;
}

void pmem_node_free(struct pnode *n)
{
	if (!n)
		return;
	free(n->path);
	free(n);
}

void pmem_tree_fini(struct pmem *s)
{
	for (size_t i = 0; i < s->itab_cap; i++)
		if (s->itab[i])
			pmem_inode_free(s->itab[i]);
	free(s->itab);
	s->itab = NULL;
	s->itab_cap = 0;
}

/* ---- changes (shared by the operations and pmem_ext_*) ------------------- */

/* The directory and the name of a new entry at path; -EEXIST when taken. */
static int free_name_locked(struct pmem *s, const char *path,
			    struct pinode **dir, const char **name)
{
	int rc = parent_locked(s, path, dir, name);

	if (rc == 0 && dir_find(*dir, *name))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EEXIST, "%s: file exists",
				   path);
	return rc;
}

/* Enter `in` as `name` in `dir` (the entry at `path`): the change event,
 * and *st (may be NULL) its attributes. */
static void enter_name_locked(struct pmem *s, struct pinode *dir,
			      const char *name, struct pinode *in,
			      const char *path, struct stat *st)
{
	dir_add_locked(s, dir, name, in);
	pmem_emit_locked(s, SBX_CHANGE_ENTRY, path);
	if (st)
		pmem_fill_stat(s, in, st);
}

/* Make a new object at path.  *st (may be NULL) its attributes. */
int pmem_make_locked(struct pmem *s, const char *path, mode_t mode,
		     dev_t rdev, const char *target, struct stat *st)
{
	struct pinode *dir, *in;
	const char *name;
	int rc = free_name_locked(s, path, &dir, &name);

	if (rc < 0)
		return rc;
	in = pmem_inode_new_locked(s, mode);
	in->rdev = rdev;
	if (target)
		in->target = sbx_xstrdup(target);
	enter_name_locked(s, dir, name, in, path, st);
	return 0;
}

int pmem_link_locked(struct pmem *s, const char *from, const char *to,
		     struct stat *st)
{
	struct pinode *src, *dir;
	const char *name;
	int rc = pmem_walk_locked(s, from, &src);

	if (rc < 0)
		return rc;
	if (S_ISDIR(src->mode))
		return sbx_error_set(SBX_ERR_REMOTE, -EPERM,
				     "link %s: a directory", from);
	rc = free_name_locked(s, to, &dir, &name);
	if (rc < 0)
		return rc;
	src->nlink++;
	src->ctim = pmem_stamp_locked(s);
	enter_name_locked(s, dir, name, src, to, st);
	return 0;
}

int pmem_remove_locked(struct pmem *s, const char *path, bool rmdir)
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
	pmem_emit_locked(s, SBX_CHANGE_ENTRY, path);
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

int pmem_rename_locked(struct pmem *s, const char *from, const char *to,
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
		src->ctim = dst->ctim = pmem_stamp_locked(s);
		fdir->mtim = fdir->ctim = tdir->mtim = tdir->ctim =
			pmem_stamp_locked(s);
		/* As inotify tells it: two renames, each the other way. */
		pmem_emit_move_locked(s, from, to, src->ino);
		pmem_emit_move_locked(s, to, from, dst->ino);
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
	src->ctim = pmem_stamp_locked(s);
	pmem_emit_move_locked(s, from, to, src->ino);
	return 0;
}

/* The regular file at path, for content changes. */
int pmem_regular_locked(struct pmem *s, const char *path,
			struct pinode **out)
{
	int rc = pmem_walk_locked(s, path, out);

	if (rc == 0 && S_ISDIR((*out)->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EISDIR,
				   "%s: is a directory", path);
	else if (rc == 0 && !S_ISREG((*out)->mode))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				   "%s: not a regular file", path);
	return rc;
}

void pmem_resize(struct pinode *in, size_t size)
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

void pmem_data_changed_locked(struct pmem *s, struct pinode *in,
			      const char *path, size_t size)
{
	pmem_resize(in, size);
	in->mtim = in->ctim = pmem_stamp_locked(s);
	pmem_emit_locked(s, SBX_CHANGE_DATA, path);
}

int pmem_truncate_locked(struct pmem *s, const char *path, off_t size)
{
	struct pinode *in;
	int rc;

	if (size < 0)
		return sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
				     "truncate %s: size < 0", path);
	rc = pmem_regular_locked(s, path, &in);
	if (rc < 0)
		return rc;
	pmem_data_changed_locked(s, in, path, (size_t)size);
	return 0;
}

/* Write at off (append: at the end).  Returns the count. */
ssize_t pmem_write_locked(struct pmem *s, const char *path,
			  const void *data, size_t len, off_t off,
			  bool append)
{
	struct pinode *in;
	size_t end;
	int rc = off < 0 ? sbx_error_set(SBX_ERR_REMOTE, -EINVAL,
					 "write %s: offset < 0", path)
			 : pmem_regular_locked(s, path, &in);

	if (rc < 0)
		return rc;
	if (append)
		off = (off_t)in->size;
	/* An empty write changes the times, never the size. */
	end = len ? (size_t)off + len : 0;
	pmem_data_changed_locked(s, in, path,
				 end > in->size ? end : in->size);
	if (len)
		memcpy(in->data + off, data, len);
	return (ssize_t)len;
}

int pmem_setattr_locked(struct pmem *s, const char *path,
			const struct stat *a, int valid, struct stat *out)
{
	struct pinode *in;
	struct timespec t;
	int rc = pmem_walk_locked(s, path, &in);

	if (rc < 0)
		return rc;
	if (valid & SBX_SET_SIZE) {
		rc = pmem_truncate_locked(s, path, a->st_size);
		if (rc < 0)
			return rc;
	}
	t = pmem_stamp_locked(s);
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
		pmem_emit_locked(s, SBX_CHANGE_ATTR, path);
	}
	if (out)
		pmem_fill_stat(s, in, out);
	return 0;
}

/* ---- behind the mount ---------------------------------------------------- */

/* Run `body` (an int expression using `p`, the clean path) under s->lock. */
#define EXT(sb, path, body)                                                    \
	({                                                                     \
		struct pmem *s_ = PMEM(sb);                                    \
		char *p = NULL;                                                \
		int r_ = pmem_clean(path, &p);                                 \
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
	ssize_t n = pmem_write_locked(s, path, data, len, off, false);

	return n < 0 ? (int)n : 0;
}

/* open(O_CREAT|O_TRUNC) + write.  Caller holds s->lock. */
static int ext_write_locked(struct pmem *s, const char *path,
			    const void *data, size_t len)
{
	struct pinode *in;
	int rc = pmem_walk_locked(s, path, &in);

	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = pmem_make_locked(s, path, S_IFREG | 0644, 0, NULL, NULL);
	} else if (rc == 0) {
		rc = pmem_truncate_locked(s, path, 0);
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
	return EXT(sb, path, pmem_truncate_locked(s_, p, size));
}

int pmem_ext_chmod(struct sbx_sandbox *sb, const char *path, mode_t mode)
{
	struct stat a = {.st_mode = mode};

	return EXT(sb, path,
		   pmem_setattr_locked(s_, p, &a, SBX_SET_MODE, NULL));
}

int pmem_ext_mkdir(struct sbx_sandbox *sb, const char *path, mode_t mode)
{
	return EXT(sb, path,
		   pmem_make_locked(s_, p, S_IFDIR | (mode & 07777), 0, NULL,
			       NULL));
}

int pmem_ext_symlink(struct sbx_sandbox *sb, const char *target,
		     const char *path)
{
	return EXT(sb, path,
		   pmem_make_locked(s_, p, S_IFLNK | 0777, 0, target, NULL));
}

int pmem_ext_unlink(struct sbx_sandbox *sb, const char *path)
{
	return EXT(sb, path, pmem_remove_locked(s_, p, false));
}

int pmem_ext_rmdir(struct sbx_sandbox *sb, const char *path)
{
	return EXT(sb, path, pmem_remove_locked(s_, p, true));
}

/* Two paths: clean both, then run under the lock. */
static int ext2(struct sbx_sandbox *sb, const char *from, const char *to,
		bool link, unsigned flags)
{
	struct pmem *s = PMEM(sb);
	char *f = NULL, *t = NULL;
	int rc = pmem_clean(from, &f);

	if (rc == 0)
		rc = pmem_clean(to, &t);
	if (rc == 0) {
		pthread_mutex_lock(&s->lock);
		rc = link ? pmem_link_locked(s, f, t, NULL)
			  : pmem_rename_locked(s, f, t, flags);
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
	pmem_emit_locked(s, SBX_CHANGE_OVERFLOW, NULL);
	pthread_mutex_unlock(&s->lock);
}

static int ext_read_locked(struct pmem *s, const char *path, void *buf,
			   size_t size, size_t *len)
{
	struct pinode *in;
	int rc = pmem_regular_locked(s, path, &in);

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

int pmem_ext_stat(struct sbx_sandbox *sb, const char *path, struct stat *st)
{
	return EXT(sb, path, pmem_stat_locked(s_, p, st));
}
