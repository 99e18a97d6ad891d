/*
 * Filesystem helpers of the local provider's control plane (see
 * plocal_git_i.h).
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sbx/error.h"
#include "sbx/xmalloc.h"
#include "plocal_git_i.h"

/* ------------------------------------------------------------------------ */
/* Filesystem helpers: everything below a directory fd, never following     */
/* symlinks, so that a link planted in a worktree cannot redirect a write   */
/* or a removal outside of it.                                               */
/* ------------------------------------------------------------------------ */

/*
 * Remove `name` in `dirfd` recursively.  Symlinks are removed, never
 * followed; directories on another device (a mount inside the worktree)
 * are refused with -EXDEV instead of being emptied.  Directories without
 * write/search permission are chmod'ed so that their content can go.
 * Recursion keeps one descriptor per level.
 */
static int rm_tree_at(int dirfd, const char *name, dev_t dev)
{
	struct stat st;
	struct dirent *de;
	DIR *d = NULL;
	int fd = -1, rc = 0;

	if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : sbx_error_os("stat %s", name);
	if (!S_ISDIR(st.st_mode)) {
		if (unlinkat(dirfd, name, 0) < 0 && errno != ENOENT)
			return sbx_error_os("cannot remove %s", name);
		return 0;
	}
	if (st.st_dev != dev)
		return sbx_error_set(SBX_ERR_OS, -EXDEV,
				     "%s is a mount point inside the worktree; "
				     "unmount it first", name);
	fd = openat(dirfd, name,
		    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return sbx_error_os("cannot open directory %s", name);
	if ((st.st_mode & 0700) != 0700)
		(void)fchmod(fd, (st.st_mode & 07777) | 0700);
	d = fdopendir(fd);
	if (!d) {
		rc = sbx_error_os("cannot read directory %s", name);
		close(fd);
		return rc;
	}
	while ((errno = 0, de = readdir(d)) != NULL) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if ((rc = rm_tree_at(fd, de->d_name, dev)) < 0)
			goto out;
	}
	if (errno) {
		rc = sbx_error_os("cannot read directory %s", name);
		goto out;
	}
	if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		rc = sbx_error_os("cannot remove directory %s", name);
out:
	closedir(d);
	return rc;
}

/* rm -r of an absolute path, with rm_tree_at()'s safety rules. */
int plocal_rm_tree(const char *path)
{
	char *parent = sbx_xstrdup(path), *slash;
	struct stat st;
	int pfd, rc;

	slash = strrchr(parent, '/');
	if (!slash || !slash[1]) {
		free(parent);
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "refusing to remove %s", path);
	}
	*slash = '\0';
	pfd = open(*parent ? parent : "/",
		   O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0) {
		rc = errno == ENOENT ? 0 : sbx_error_os("open %s", parent);
		free(parent);
		return rc;
	}
	if (fstatat(pfd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) < 0)
		rc = errno == ENOENT ? 0 : sbx_error_os("stat %s", path);
	else
		rc = rm_tree_at(pfd, slash + 1, st.st_dev);
	close(pfd);
	free(parent);
	return rc;
}

/*
 * Open the parent directory of `rel` below `rootfd`; *base_out points into
 * `rel` at the last component.  With `create`, missing directories are
 * made and non-directories (files, symlinks) in the way are replaced, as a
 * checkout would.  Without it, -ENOENT when the parent does not exist.
 */
static int open_parent(int rootfd, const char *rel, bool create,
		       const char **base_out)
{
	char *copy = sbx_xstrdup(rel), *comp, *slash;
	int dfd, nfd;

	dfd = dup(rootfd);
	if (dfd < 0) {
		free(copy);
		return sbx_error_os("dup");
	}
	comp = copy;
	while ((slash = strchr(comp, '/')) != NULL) {
		*slash = '\0';
		nfd = openat(dfd, comp,
			     O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd < 0 && create &&
		    (errno == ENOENT || errno == ENOTDIR || errno == ELOOP)) {
			if (errno != ENOENT)
				(void)unlinkat(dfd, comp, 0);
			if (mkdirat(dfd, comp, 0777) < 0 && errno != EEXIST) {
				nfd = -1;
			} else {
				nfd = openat(dfd, comp,
					     O_RDONLY | O_DIRECTORY |
						     O_NOFOLLOW | O_CLOEXEC);
			}
		}
		if (nfd < 0) {
			int err = errno;

			close(dfd);
			free(copy);
			errno = err;
			if (!create && (err == ENOENT || err == ENOTDIR ||
					err == ELOOP))
				return -ENOENT;
			return sbx_error_os("cannot open directory of %s",
					    rel);
		}
		close(dfd);
		dfd = nfd;
		comp = slash + 1;
	}
	*base_out = rel + (comp - copy);
	free(copy);
	return dfd;
}

/* Copy a regular file's content between descriptors. */
int plocal_copy_fd(int in, int out, const char *what)
{
	char buf[65536];
	ssize_t n, w, off;

	for (;;) {
		n = read(in, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return sbx_error_os("read %s", what);
		if (n == 0)
			return 0;
		for (off = 0; off < n; off += w) {
			w = write(out, buf + off, (size_t)(n - off));
			if (w < 0 && errno == EINTR) {
				w = 0;
				continue;
			}
			if (w < 0)
				return sbx_error_os("write %s", what);
		}
	}
}

/*
 * Make `rel` below `rootfd` a copy of the file or symlink at `src`
 * (replacing whatever is there), or remove it when `src` does not exist.
 * Only regular files and symlinks are carried; a directory at `src` only
 * removes a non-directory in the way (its files come as their own paths).
 */
int plocal_mirror_path(int rootfd, const char *rel, const char *src)
{
	struct stat st;
	const char *base;
	char *target = NULL;
	int dfd = -1, in = -1, out = -1, rc = 0;
	ssize_t n;

	if (lstat(src, &st) < 0) {
		if (errno != ENOENT && errno != ENOTDIR)
			return sbx_error_os("cannot read %s", src);
		dfd = open_parent(rootfd, rel, false, &base);
		if (dfd == -ENOENT)
			return 0;
		if (dfd < 0)
			return dfd;
		if (unlinkat(dfd, base, 0) < 0 && errno != ENOENT &&
		    errno != EISDIR)
			rc = sbx_error_os("cannot remove %s", rel);
		close(dfd);
		return rc;
	}
	if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode) &&
	    !S_ISDIR(st.st_mode))
		return 0; /* sockets, fifos: git does not track them either */

	if ((dfd = open_parent(rootfd, rel, true, &base)) < 0)
		return dfd;
	{
		struct stat cur;

		if (fstatat(dfd, base, &cur, AT_SYMLINK_NOFOLLOW) == 0) {
			if (S_ISDIR(st.st_mode) && S_ISDIR(cur.st_mode))
				goto out;
			if (S_ISDIR(cur.st_mode))
				rc = rm_tree_at(dfd, base, cur.st_dev);
			else if (unlinkat(dfd, base, 0) < 0)
				rc = sbx_error_os("cannot replace %s", rel);
			if (rc < 0)
				goto out;
		}
	}
	if (S_ISDIR(st.st_mode))
		goto out;

	if (S_ISLNK(st.st_mode)) {
		size_t cap = (size_t)st.st_size + 1;

		for (;;) {
			target = sbx_xrealloc(target, cap);
			n = readlink(src, target, cap);
			if (n < 0) {
				rc = sbx_error_os("readlink %s", src);
				goto out;
			}
			if ((size_t)n < cap)
				break;
			cap *= 2;
		}
		target[n] = '\0';
		if (symlinkat(target, dfd, base) < 0)
			rc = sbx_error_os("cannot create symlink %s", rel);
		goto out;
	}

	in = open(src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (in < 0) {
		rc = sbx_error_os("cannot open %s", src);
		goto out;
	}
	out = openat(dfd, base,
		     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		     0600);
	if (out < 0) {
		rc = sbx_error_os("cannot create %s", rel);
		goto out;
	}
	if ((rc = plocal_copy_fd(in, out, rel)) < 0)
		goto out;
	/* Exact permission bits (the umask would have narrowed them). */
	if (fchmod(out, st.st_mode & 07777) < 0)
		rc = sbx_error_os("chmod %s", rel);
out:
	if (out >= 0)
		close(out);
	if (in >= 0)
		close(in);
	if (dfd >= 0)
		close(dfd);
	free(target);
	return rc;
}

