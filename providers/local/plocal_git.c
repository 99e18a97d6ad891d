/*
 * Local provider control plane on libgit2: create, get, list, terminate,
 * snapshot, snapshots, restore.  See docs/providers.md ("local") for the
 * user-facing rules; this file never shells out to git.
 *
 * Identity (plocal_i.h): session NAME is branch sbx/NAME, worktree directory
 * <worktrees>/NAME registered in the source repository as "sbx-NAME", and
 * snapshot refs refs/sbx/snapshots/NAME/<id>.  No state file: everything is
 * read back from git, so a crash leaves nothing that git cannot describe.
 *
 * Every libgit2 object is freed on every path (one `out:` label per
 * function).  libgit2 is initialised once per process (pthread_once) and is
 * never shut down: other threads of the daemon may still use it.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <git2.h>
#include <git2/sys/repository.h>

#include "sbx/gitsource.h"
#include "sbx/error.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"
#include "plocal_i.h"

#define BRANCH_PREFIX "sbx/"
#define WORKTREE_PREFIX "sbx-"
#define SNAP_PREFIX "refs/sbx/snapshots/"
#define SNAP_DEFAULT_MSG "sbx snapshot"
#define DIRTY_LIST_MAX 5

/* ------------------------------------------------------------------------ */
/* libgit2 plumbing                                                          */
/* ------------------------------------------------------------------------ */

static pthread_once_t lg_once = PTHREAD_ONCE_INIT;

static void lg_init_once(void)
{
	git_libgit2_init();
}

static void lg_init(void)
{
	pthread_once(&lg_once, lg_init_once);
}

/* The errno that best describes a libgit2 return code. */
static int plocal_errno_from_git(int gitrc)
{
	switch (gitrc) {
	case GIT_ENOTFOUND:
	case GIT_EUNBORNBRANCH:
		return -ENOENT;
	case GIT_EEXISTS:
		return -EEXIST;
	case GIT_EAMBIGUOUS:
	case GIT_EBAREREPO:
	case GIT_EINVALIDSPEC:
	case GIT_EINVALID:
	case GIT_EPEEL:
		return -EINVAL;
	case GIT_ELOCKED:
	case GIT_EMODIFIED:
	case GIT_ECONFLICT:
	case GIT_EUNMERGED:
	case GIT_EUNCOMMITTED:
	case GIT_EINDEXDIRTY:
	case GIT_EMERGECONFLICT:
		return -EBUSY;
	case GIT_EDIRECTORY:
		return -EISDIR;
	case GIT_EAUTH:
	case GIT_ECERTIFICATE:
	case GIT_EOWNER:
		return -EACCES;
	default:
		return -EIO;
	}
}

/*
 * Record a libgit2 failure: "<what>: <libgit2 message>", class GIT, detail
 * the libgit2 code.  Returns the mapped negative errno.
 */
static int SBX_PRINTF(2, 3) lg_fail(int gitrc, const char *fmt, ...)
{
	const git_error *e = git_error_last();
	char what[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return sbx_error_setd(SBX_ERR_GIT, plocal_errno_from_git(gitrc), gitrc,
			      "%s: %s", what,
			      e && e->message ? e->message
					      : "unknown libgit2 error");
}

/* Keep the current error across cleanup code that may set its own. */
static void error_save(struct sbx_error *save)
{
	*save = *sbx_error_last();
}

static void error_restore(const struct sbx_error *save)
{
	sbx_error_setd(save->klass, save->code, save->detail, "%s", save->msg);
}

/* Copy of a libgit2 directory path without its trailing '/'. */
static char *dir_dup(const char *path)
{
	size_t n = strlen(path);

	while (n > 1 && path[n - 1] == '/')
		n--;
	return sbx_xstrndup(path, n);
}

static char *session_path(const struct plocal_provider *lp,
			  const char *session)
{
	return sbx_xasprintf("%s/%s", lp->worktrees, session);
}

/* Isolation in force for this provider: "none" unless configured. */
static const char *isolation_of(const struct plocal_provider *lp)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(lp->base.config,
							  "isolation");

	return cJSON_IsString(v) && v->valuestring ? v->valuestring : "none";
}

/*
 * Where the user's repository is: the working directory of the repository
 * that owns `commondir` (its common dir itself when bare).  Used for the
 * "repo" field, so that get() and create() report the same thing.
 */
static char *main_repo_path(const char *commondir)
{
	git_repository *main = NULL;
	char *res;

	if (git_repository_open_ext(&main, commondir,
				    GIT_REPOSITORY_OPEN_NO_SEARCH, NULL) == 0 &&
	    git_repository_workdir(main))
		res = dir_dup(git_repository_workdir(main));
	else
		res = dir_dup(commondir);
	git_repository_free(main);
	return res;
}

/*
 * Open the worktree repository of a session's directory without searching
 * upwards (a broken worktree must not silently resolve to $SBX_HOME's or
 * the user's enclosing repository).
 */
static int open_worktree_repo(git_repository **out, const char *path)
{
	int rc;

	*out = NULL;
	rc = git_repository_open_ext(out, path, GIT_REPOSITORY_OPEN_NO_SEARCH,
				     NULL);
	if (rc < 0)
		return lg_fail(rc, "cannot open the worktree at %s", path);
	return 0;
}

/*
 * The session's worktree directory, or -ENOENT (NOTFOUND) when there is
 * none.  *path_out malloc'd.
 */
static int locate(const struct plocal_provider *lp, const char *session,
		  char **path_out)
{
	struct stat st;
	char *path;
	int rc;

	*path_out = NULL;
	if ((rc = sbx_name_validate(session)) < 0)
		return rc;
	path = session_path(lp, session);
	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
					   "no local sandbox for session %s "
					   "(looked for worktree %s)",
					   session, path);
		else
			rc = sbx_error_os("cannot inspect worktree %s", path);
		free(path);
		return rc;
	}
	*path_out = path;
	return 0;
}

/* locate() + open_worktree_repo(), the prologue of most operations. */
static int open_session(const struct plocal_provider *lp, const char *session,
			git_repository **repo_out, char **path_out)
{
	char *path = NULL;
	int rc;

	*repo_out = NULL;
	if (path_out)
		*path_out = NULL;
	if ((rc = locate(lp, session, &path)) < 0)
		return rc;
	if ((rc = open_worktree_repo(repo_out, path)) < 0) {
		rc = sbx_error_prefix(rc, "sandbox %s is broken", session);
		free(path);
		return rc;
	}
	if (path_out)
		*path_out = path;
	else
		free(path);
	return 0;
}

/* Signature for sbx commits: the repository's user, else "sbx". */
static int signature(git_signature **out, git_repository *repo)
{
	int rc;

	if (git_signature_default(out, repo) == 0)
		return 0;
	rc = git_signature_now(out, "sbx", "sbx@localhost");
	if (rc < 0)
		return lg_fail(rc, "cannot make a commit signature");
	return 0;
}

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
static int rm_tree(const char *path)
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
static int copy_fd(int in, int out, const char *what)
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
static int mirror_path(int rootfd, const char *rel, const char *src)
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
	if ((rc = copy_fd(in, out, rel)) < 0)
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

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

/* The path a status entry is about (no rename detection is requested). */
static const char *status_path(const git_status_entry *e)
{
	if (e->index_to_workdir)
		return e->index_to_workdir->new_file.path;
	if (e->head_to_index)
		return e->head_to_index->new_file.path;
	return NULL;
}

/*
 * Status of a checkout: staged, unstaged and untracked-not-ignored files,
 * untracked directories expanded to their files.
 */
static int status_list(git_status_list **out, git_repository *repo,
		       bool with_submodules)
{
	git_status_options so = GIT_STATUS_OPTIONS_INIT;
	int rc;

	so.show = GIT_STATUS_SHOW_INDEX_AND_WORKDIR;
	so.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED |
		   GIT_STATUS_OPT_RECURSE_UNTRACKED_DIRS;
	if (!with_submodules)
		so.flags |= GIT_STATUS_OPT_EXCLUDE_SUBMODULES;
	rc = git_status_list_new(out, repo, &so);
	if (rc < 0)
		return lg_fail(rc, "cannot compute the status of %s",
			       git_repository_workdir(repo));
	return 0;
}

/*
 * -EBUSY (STATE) when the worktree has uncommitted changes, with up to
 * DIRTY_LIST_MAX of them in the message.
 */
static int refuse_if_dirty(git_repository *repo, const char *session)
{
	git_status_list *sl = NULL;
	char list[320] = "";
	size_t n, i, shown = 0, len = 0;
	int rc;

	if ((rc = status_list(&sl, repo, true)) < 0)
		return rc;
	n = git_status_list_entrycount(sl);
	for (i = 0; i < n; i++) {
		const git_status_entry *e = git_status_byindex(sl, i);
		const char *path = status_path(e);

		if (e->status == GIT_STATUS_CURRENT ||
		    (e->status & GIT_STATUS_IGNORED) || !path)
			continue;
		if (shown < DIRTY_LIST_MAX && len < sizeof(list)) {
			int w = snprintf(list + len, sizeof(list) - len,
					 "%s%s", shown ? ", " : "", path);
			len += w > 0 ? (size_t)w : 0;
		}
		shown++;
	}
	git_status_list_free(sl);
	if (!shown)
		return 0;
	if (len >= sizeof(list))
		len = sizeof(list) - 1;
	return sbx_error_set(SBX_ERR_STATE, -EBUSY,
			     "sandbox %s has %zu uncommitted change%s (%s%s); "
			     "commit them, or keep a copy with `sbx snapshot "
			     "%s` and then pass --force, or pass --force to "
			     "discard them",
			     session, shown, shown == 1 ? "" : "s", list,
			     shown > DIRTY_LIST_MAX ? ", ..." : "", session);
}

/* ------------------------------------------------------------------------ */
/* create                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * The repository to branch from: `dir` (or the working directory) and
 * upwards.  A linked worktree is fine: libgit2 adds new worktrees to its
 * common dir, and its HEAD and changes are the ones the user sees there.
 */
int sbx_git_open_source(git_repository **out, const char *dir)
{
	git_buf found = GIT_BUF_INIT;
	char cwd[PATH_MAX];
	struct stat st;
	int rc;

	*out = NULL;
	if (!dir) {
		if (!getcwd(cwd, sizeof(cwd)))
			return sbx_error_os("getcwd");
		dir = cwd;
	} else if (stat(dir, &st) < 0) {
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "repository %s: %s", dir,
				     strerror(errno));
	}
	rc = git_repository_discover(&found, dir, 0, NULL);
	if (rc == GIT_ENOTFOUND)
		return sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, rc,
				      "%s is not inside a git repository; "
				      "run sbx inside one or pass --repo DIR",
				      dir);
	if (rc < 0)
		return lg_fail(rc, "cannot look for a git repository at %s",
			       dir);
	rc = git_repository_open(out, found.ptr);
	if (rc < 0)
		rc = lg_fail(rc, "cannot open the git repository at %s",
			     found.ptr);
	git_buf_dispose(&found);
	return rc;
}

/* The commit to start from: `ref` (any revspec) or HEAD. */
static int start_commit(git_commit **out, git_repository *repo,
			const char *ref)
{
	git_object *obj = NULL, *peeled = NULL;
	const char *where = git_repository_workdir(repo)
				    ? git_repository_workdir(repo)
				    : git_repository_path(repo);
	int rc;

	*out = NULL;
	if (!ref) {
		rc = git_repository_head_unborn(repo);
		if (rc == 1)
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "the repository at %s has no "
					     "commits yet (HEAD is unborn); "
					     "commit something first or pass "
					     "--ref REV", where);
		ref = "HEAD";
	}
	rc = git_revparse_single(&obj, repo, ref);
	if (rc == GIT_ENOTFOUND || rc == GIT_EINVALIDSPEC ||
	    rc == GIT_EAMBIGUOUS) {
		rc = sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, rc,
				    "--ref %s: no such revision in %s (%s)",
				    ref, where,
				    git_error_last() ? git_error_last()->message
						     : "not found");
		goto out;
	}
	if (rc < 0) {
		rc = lg_fail(rc, "cannot resolve %s in %s", ref, where);
		goto out;
	}
	rc = git_object_peel(&peeled, obj, GIT_OBJECT_COMMIT);
	if (rc < 0) {
		rc = sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, rc,
				    "--ref %s does not name a commit", ref);
		goto out;
	}
	*out = (git_commit *)peeled;
	peeled = NULL;
out:
	git_object_free(peeled);
	git_object_free(obj);
	return rc < 0 ? rc : 0;
}

/*
 * A registration "sbx-NAME" left behind by a crash, whose directory is
 * gone, is garbage that would make git_worktree_add() fail: prune it, as
 * `git worktree prune` would.  A valid one is someone else's: refuse.
 */
static int clear_stale_registration(git_repository *repo, const char *name,
				    const char *session)
{
	git_worktree *wt = NULL;
	git_worktree_prune_options po = GIT_WORKTREE_PRUNE_OPTIONS_INIT;
	int rc;

	rc = git_worktree_lookup(&wt, repo, name);
	if (rc == GIT_ENOTFOUND || rc < 0) {
		/* Not registered, or a directory too broken to parse:
		 * git_worktree_add() reports the latter precisely. */
		git_error_clear();
		return 0;
	}
	if (git_worktree_validate(wt) == 0) {
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "the repository already has a worktree "
				   "named %s at %s (another SBX_HOME?); remove "
				   "it with `git worktree remove` or pick "
				   "another session name than %s",
				   name, git_worktree_path(wt), session);
		goto out;
	}
	po.flags = GIT_WORKTREE_PRUNE_LOCKED;
	rc = git_worktree_prune(wt, &po);
	if (rc < 0)
		rc = lg_fail(rc, "cannot prune the stale worktree %s", name);
out:
	git_worktree_free(wt);
	return rc < 0 ? rc : 0;
}

/*
 * Carry the source checkout's uncommitted changes into the new worktree:
 * every path that git status reports (staged, unstaged, untracked and not
 * ignored; submodules excluded) gets the source's working-tree content, or
 * is deleted when the source deleted it.  Staged entries are reproduced in
 * the new worktree's index too (same blob, stat data cleared so git
 * rehashes), so `git status` there reads like the source's.  Nothing is
 * committed.
 */
static int carry_changes(git_repository *src, git_repository *dst,
			 const char *dst_path)
{
	git_status_list *sl = NULL;
	git_index *sidx = NULL, *didx = NULL;
	const char *swd = git_repository_workdir(src);
	char *spath = NULL;
	int rootfd = -1, rc;
	size_t i, n;

	if (!swd)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "--carry-changes: %s is a bare repository "
				     "with no checkout to carry changes from",
				     git_repository_path(src));
	if ((rc = status_list(&sl, src, false)) < 0)
		return rc;
	if ((rc = git_repository_index(&sidx, src)) < 0 ||
	    (rc = git_repository_index(&didx, dst)) < 0) {
		rc = lg_fail(rc, "cannot read an index");
		goto out;
	}
	rootfd = open(dst_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		rc = sbx_error_os("cannot open %s", dst_path);
		goto out;
	}
	n = git_status_list_entrycount(sl);
	for (i = 0; i < n; i++) {
		const git_status_entry *e = git_status_byindex(sl, i);
		const char *path = status_path(e);
		const git_index_entry *ie;
		git_index_entry copy;

		if (!path || e->status == GIT_STATUS_CURRENT ||
		    (e->status & GIT_STATUS_IGNORED))
			continue;
		free(spath);
		spath = sbx_xasprintf("%s%s", swd, path);
		if ((rc = mirror_path(rootfd, path, spath)) < 0) {
			rc = sbx_error_prefix(rc, "carrying %s", path);
			goto out;
		}
		if (e->status & GIT_STATUS_INDEX_DELETED) {
			rc = git_index_remove_bypath(didx, path);
		} else if (e->status & (GIT_STATUS_INDEX_NEW |
					GIT_STATUS_INDEX_MODIFIED |
					GIT_STATUS_INDEX_TYPECHANGE)) {
			ie = git_index_get_bypath(sidx, path, 0);
			if (!ie)
				continue;
			copy = *ie;
			memset(&copy.ctime, 0, sizeof(copy.ctime));
			memset(&copy.mtime, 0, sizeof(copy.mtime));
			copy.dev = copy.ino = copy.uid = copy.gid = 0;
			copy.file_size = 0;
			rc = git_index_add(didx, &copy);
		}
		if (rc < 0) {
			rc = lg_fail(rc, "cannot stage %s in the new worktree",
				     path);
			goto out;
		}
	}
	if ((rc = git_index_write(didx)) < 0)
		rc = lg_fail(rc, "cannot write the index of %s", dst_path);
out:
	if (rootfd >= 0)
		close(rootfd);
	free(spath);
	git_index_free(didx);
	git_index_free(sidx);
	git_status_list_free(sl);
	return rc < 0 ? rc : 0;
}

static int fill_info(const struct plocal_provider *lp, const char *session,
		     const char *path, struct sbx_sandbox_info *out);

/*
 * Undo a failed create: the worktree directory and the registration
 * directory `regdir` (neither existed before the call), the registration
 * itself, and the branch if this call made it.  Best effort; the
 * caller's error is kept.
 */
static void rollback(git_repository *src, const char *wtname,
		     const char *path, const char *regdir, git_reference *branch,
		     bool made_branch)
{
	git_worktree *wt = NULL;
	git_worktree_prune_options po = GIT_WORKTREE_PRUNE_OPTIONS_INIT;
	struct sbx_error save;

	error_save(&save);
	(void)rm_tree(path);
	po.flags = GIT_WORKTREE_PRUNE_VALID | GIT_WORKTREE_PRUNE_LOCKED;
	if (git_worktree_lookup(&wt, src, wtname) == 0)
		(void)git_worktree_prune(wt, &po);
	git_worktree_free(wt);
	/* A half-made registration that libgit2 cannot parse. */
	(void)rm_tree(regdir);
	if (made_branch && branch)
		(void)git_branch_delete(branch);
	git_error_clear();
	error_restore(&save);
}

int plocal_create(struct sbx_provider *p, const struct sbx_create_opts *o,
		  struct sbx_sandbox_info *out)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	git_repository *src = NULL, *dst = NULL;
	git_commit *commit = NULL;
	git_reference *branch = NULL;
	git_worktree *wt = NULL;
	git_worktree_add_options ao = GIT_WORKTREE_ADD_OPTIONS_INIT;
	char *path = NULL, *bname = NULL, *refname = NULL, *wtname = NULL;
	char *common = NULL, *regdir = NULL;
	const char *iso;
	bool made_branch = false, touched = false;
	struct stat st;
	int rc, valid = 0;

	SBX_ASSERT_ARG(p && o && out);
	memset(out, 0, sizeof(*out));
	lg_init();
	if ((rc = sbx_name_validate(o->session)) < 0)
		return rc;
	iso = isolation_of(lp);
	if (strcmp(iso, "none") && strcmp(iso, "bwrap"))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "unknown isolation \"%s\" for the local "
				     "provider (use \"none\" or \"bwrap\")",
				     iso);

	bname = sbx_xasprintf(BRANCH_PREFIX "%s", o->session);
	refname = sbx_xasprintf("refs/heads/%s", bname);
	wtname = sbx_xasprintf(WORKTREE_PREFIX "%s", o->session);
	path = session_path(lp, o->session);
	if (git_reference_name_is_valid(&valid, refname) < 0 || !valid) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "session name %s cannot be a git branch "
				   "name (%s); avoid \"..\" and a \".lock\" "
				   "suffix", o->session, bname);
		goto out;
	}
	if (lstat(path, &st) == 0) {
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "a sandbox for session %s already exists at "
				   "%s; use it (`sbx up %s`) or remove it "
				   "(`sbx down %s`)", o->session, path,
				   o->session, o->session);
		goto out;
	}

	if ((rc = sbx_git_open_source(&src, o->repo)) < 0)
		goto out;

	/*
	 * A branch kept by an earlier `sbx down` holds the agent's commits:
	 * a new sandbox of that session continues it.  Only an explicit
	 * --ref asks for something else, and that we refuse rather than
	 * guess.
	 */
	rc = git_branch_lookup(&branch, src, bname, GIT_BRANCH_LOCAL);
	if (rc == 0 && o->ref) {
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "branch %s already exists in %s (kept from "
				   "an earlier session); run without --ref to "
				   "continue it, or delete it with `git branch "
				   "-D %s`", bname,
				   git_repository_commondir(src), bname);
		goto out;
	}
	if (rc < 0 && rc != GIT_ENOTFOUND) {
		rc = lg_fail(rc, "cannot look up branch %s", bname);
		goto out;
	}
	git_error_clear();
	if (!branch && (rc = start_commit(&commit, src, o->ref)) < 0)
		goto out;
	if ((rc = clear_stale_registration(src, wtname, o->session)) < 0)
		goto out;
	/* Whatever is left at the registration path is not ours to remove,
	 * and rollback() removes that path: refuse instead. */
	common = dir_dup(git_repository_commondir(src));
	regdir = sbx_xasprintf("%s/worktrees/%s", common, wtname);
	if (lstat(regdir, &st) == 0) {
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "%s exists but is not a usable worktree "
				   "registration; remove it or pick another "
				   "session name than %s", regdir, o->session);
		goto out;
	}

	/* From here on, anything made is undone on failure. */
	touched = true;
	if (!branch) {
		rc = git_branch_create(&branch, src, bname, commit, 0);
		if (rc < 0) {
			rc = lg_fail(rc, "cannot create branch %s", bname);
			goto out;
		}
		made_branch = true;
	}
	ao.ref = branch;
	ao.checkout_options.checkout_strategy = GIT_CHECKOUT_SAFE;
	rc = git_worktree_add(&wt, src, wtname, path, &ao);
	if (rc < 0) {
		rc = lg_fail(rc, "cannot add worktree %s at %s", wtname, path);
		goto out;
	}
	if (o->carry_changes) {
		if ((rc = open_worktree_repo(&dst, path)) < 0)
			goto out;
		if ((rc = carry_changes(src, dst, path)) < 0) {
			rc = sbx_error_prefix(rc, "--carry-changes");
			goto out;
		}
	}
	rc = fill_info(lp, o->session, path, out);
	if (rc == 0 && out->state != SBX_STATE_READY) {
		const cJSON *err = cJSON_GetObjectItemCaseSensitive(out->extra,
								   "error");

		rc = sbx_error_set(SBX_ERR_INTERNAL, -EIO,
				   "the new worktree %s is not usable: %s",
				   path,
				   cJSON_IsString(err) ? err->valuestring
						       : "unknown");
		sbx_sandbox_info_fini(out);
	}
out:
	git_repository_free(dst);
	dst = NULL;
	if (rc < 0 && touched)
		rollback(src, wtname, path, regdir, branch, made_branch);
	git_worktree_free(wt);
	git_reference_free(branch);
	git_commit_free(commit);
	git_repository_free(src);
	free(regdir);
	free(common);
	free(path);
	free(wtname);
	free(refname);
	free(bname);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* get / list                                                                */
/* ------------------------------------------------------------------------ */

/*
 * Describe the worktree at `path`.  Problems with the worktree itself do
 * not fail: they give state ERROR with the explanation in extra.error, so
 * that `sbx ls` / `sbx status` can show them and `sbx down --force` can
 * clean up.
 */
static int fill_info(const struct plocal_provider *lp, const char *session,
		     const char *path, struct sbx_sandbox_info *out)
{
	git_repository *repo = NULL;
	git_worktree *wt = NULL;
	git_reference *head = NULL;
	char *gitfile, *real, *gitdir = NULL, *commondir = NULL, *repo_path;
	const char *base;
	char sha[GIT_OID_HEXSZ + 1];
	struct stat st;
	int rc;

	memset(out, 0, sizeof(*out));
	out->session = sbx_xstrdup(session);
	out->provider = sbx_xstrdup("local");
	out->sandbox_id = sbx_xasprintf(BRANCH_PREFIX "%s", session);
	real = realpath(path, NULL);
	out->workdir = real ? real : sbx_xstrdup(path);
	out->isolation = sbx_xstrdup(isolation_of(lp));
	out->remote = false;
	out->state = SBX_STATE_READY;
	out->extra = cJSON_CreateObject();
	if (!out->extra)
		abort();
	cJSON_AddStringToObject(out->extra, "branch", out->sandbox_id);

	/*
	 * created_at: git_worktree_add() writes the worktree's .git file
	 * once and nothing rewrites it, so its mtime is the creation time
	 * without keeping state of our own.
	 */
	gitfile = sbx_xasprintf("%s/.git", path);
	if (lstat(gitfile, &st) == 0 || lstat(path, &st) == 0)
		out->created_at = st.st_mtime;
	free(gitfile);

	if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
		rc = sbx_error_set(SBX_ERR_STATE, -ENOTDIR,
				   "%s is not a directory", path);
		goto broken;
	}
	rc = git_repository_open_ext(&repo, path,
				     GIT_REPOSITORY_OPEN_NO_SEARCH, NULL);
	if (rc < 0) {
		rc = lg_fail(rc, "%s is not a usable git worktree", path);
		goto broken;
	}
	gitdir = dir_dup(git_repository_path(repo));
	base = strrchr(gitdir, '/');
	base = base ? base + 1 : gitdir;
	if (!git_repository_is_worktree(repo) ||
	    strncmp(base, WORKTREE_PREFIX, strlen(WORKTREE_PREFIX)) ||
	    strcmp(base + strlen(WORKTREE_PREFIX), session)) {
		rc = sbx_error_set(SBX_ERR_STATE, -EINVAL,
				   "%s is not the sbx worktree of session %s "
				   "(its git dir is %s)", path, session,
				   gitdir);
		goto broken;
	}
	commondir = dir_dup(git_repository_commondir(repo));
	repo_path = main_repo_path(commondir);
	cJSON_AddStringToObject(out->extra, "repo", repo_path);
	free(repo_path);

	rc = git_worktree_open_from_repository(&wt, repo);
	if (rc == 0)
		rc = git_worktree_validate(wt);
	if (rc < 0) {
		rc = lg_fail(rc, "the worktree registration of %s is broken",
			     path);
		goto broken;
	}
	rc = git_repository_head(&head, repo);
	if (rc < 0) {
		rc = lg_fail(rc, "cannot resolve HEAD of %s", path);
		goto broken;
	}
	git_oid_tostr(sha, sizeof(sha), git_reference_target(head));
	cJSON_AddStringToObject(out->extra, "head", sha);
	goto out;

broken:
	out->state = SBX_STATE_ERROR;
	cJSON_AddStringToObject(out->extra, "error", sbx_error_last()->msg);
	sbx_error_clear();
	git_error_clear();
out:
	git_reference_free(head);
	git_worktree_free(wt);
	git_repository_free(repo);
	free(commondir);
	free(gitdir);
	return 0;
}

int plocal_get(struct sbx_provider *p, const char *session,
	       struct sbx_sandbox_info *out)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	char *path = NULL;
	int rc;

	SBX_ASSERT_ARG(p && session && out);
	memset(out, 0, sizeof(*out));
	lg_init();
	if ((rc = locate(lp, session, &path)) < 0)
		return rc;
	rc = fill_info(lp, session, path, out);
	free(path);
	return rc;
}

int plocal_list(struct sbx_provider *p, sbx_list_cb cb, void *payload)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	struct sbx_sandbox_info info;
	struct dirent *de;
	struct stat st;
	DIR *d;
	char *gitfile;
	int rc = 0;

	SBX_ASSERT_ARG(p && cb);
	lg_init();
	d = opendir(lp->worktrees);
	if (!d)
		return errno == ENOENT ? 0
				       : sbx_error_os("cannot list %s",
						      lp->worktrees);
	while ((de = readdir(d)) != NULL) {
		if (de->d_name[0] == '.')
			continue;
		if (sbx_name_validate(de->d_name) < 0) {
			sbx_error_clear();
			continue;
		}
		/* An sbx worktree: a directory with a .git link in it. */
		gitfile = sbx_xasprintf("%s/%s/.git", lp->worktrees,
					de->d_name);
		rc = lstat(gitfile, &st);
		free(gitfile);
		if (rc < 0) {
			rc = 0;
			continue;
		}
		if ((rc = plocal_get(p, de->d_name, &info)) < 0) {
			/* Vanished meanwhile (a concurrent `sbx down`). */
			if (rc == -ENOENT) {
				sbx_error_clear();
				rc = 0;
				continue;
			}
			break;
		}
		rc = cb(&info, payload);
		sbx_sandbox_info_fini(&info);
		if (rc != 0) {
			rc = rc < 0 ? rc : 0;
			break;
		}
	}
	closedir(d);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* terminate                                                                 */
/* ------------------------------------------------------------------------ */

/* Delete every ref below refs/sbx/snapshots/<session>/. */
static int delete_snapshot_refs(git_repository *repo, const char *session)
{
	git_reference_iterator *it = NULL;
	git_reference *ref = NULL;
	char *glob = sbx_xasprintf(SNAP_PREFIX "%s/*", session);
	int rc;

	rc = git_reference_iterator_glob_new(&it, repo, glob);
	if (rc < 0) {
		rc = lg_fail(rc, "cannot list snapshots of %s", session);
		goto out;
	}
	while ((rc = git_reference_next(&ref, it)) == 0) {
		rc = git_reference_delete(ref);
		git_reference_free(ref);
		ref = NULL;
		if (rc < 0) {
			rc = lg_fail(rc, "cannot delete a snapshot of %s",
				     session);
			goto out;
		}
	}
	if (rc == GIT_ITEROVER)
		rc = 0;
	else
		rc = lg_fail(rc, "cannot list snapshots of %s", session);
out:
	git_reference_iterator_free(it);
	free(glob);
	return rc;
}

/*
 * The common dir named by a worktree's .git file, for cleaning up a
 * worktree that libgit2 cannot open: "gitdir: <common>/worktrees/<name>".
 */
static char *commondir_from_gitfile(const char *path, const char *wtname)
{
	char *gitfile = sbx_xasprintf("%s/.git", path), *buf = NULL;
	char *res = NULL, *nl, *cut;
	size_t len = 0;

	if (sbx_file_read(gitfile, 4096, &buf, &len) < 0) {
		sbx_error_clear();
		goto out;
	}
	if (strncmp(buf, "gitdir: ", 8))
		goto out;
	if ((nl = strchr(buf, '\n')))
		*nl = '\0';
	cut = strstr(buf + 8, "/worktrees/");
	if (!cut || strcmp(cut + strlen("/worktrees/"), wtname))
		goto out;
	res = sbx_xstrndup(buf + 8, (size_t)(cut - (buf + 8)));
out:
	free(buf);
	free(gitfile);
	return res;
}

int plocal_terminate(struct sbx_provider *p, const char *session,
		     unsigned flags)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	git_repository *repo = NULL, *main = NULL;
	git_worktree *wt = NULL;
	git_reference *branch = NULL;
	git_worktree_prune_options po = GIT_WORKTREE_PRUNE_OPTIONS_INIT;
	char *path = NULL, *commondir = NULL, *wtname = NULL, *bname = NULL;
	char *gitdir = NULL;
	int rc;

	SBX_ASSERT_ARG(p && session);
	lg_init();
	if ((rc = locate(lp, session, &path)) < 0)
		return rc;
	wtname = sbx_xasprintf(WORKTREE_PREFIX "%s", session);
	bname = sbx_xasprintf(BRANCH_PREFIX "%s", session);

	rc = git_repository_open_ext(&repo, path,
				     GIT_REPOSITORY_OPEN_NO_SEARCH, NULL);
	if (rc < 0) {
		if (!(flags & SBX_TERMINATE_FORCE)) {
			char why[sizeof(sbx_error_last()->msg)];

			(void)lg_fail(rc, "cannot open the worktree %s", path);
			/* Copied: the message is rewritten by the next set. */
			snprintf(why, sizeof(why), "%s", sbx_error_last()->msg);
			rc = sbx_error_set(SBX_ERR_STATE, -EBUSY,
					   "sandbox %s is broken, so its "
					   "changes cannot be checked (%s); "
					   "nothing was removed; pass --force "
					   "to delete %s anyway", session, why,
					   path);
			goto out;
		}
		git_error_clear();
		commondir = commondir_from_gitfile(path, wtname);
	} else {
		if (!(flags & SBX_TERMINATE_FORCE) &&
		    (rc = refuse_if_dirty(repo, session)) < 0)
			goto out;
		commondir = dir_dup(git_repository_commondir(repo));
		git_repository_free(repo);
		repo = NULL;
	}

	if ((rc = rm_tree(path)) < 0) {
		rc = sbx_error_prefix(rc, "removing the worktree of %s",
				      session);
		goto out;
	}
	if (!commondir)
		goto out; /* forced removal of an unrecognisable directory */

	rc = git_repository_open_ext(&main, commondir,
				     GIT_REPOSITORY_OPEN_NO_SEARCH, NULL);
	if (rc < 0) {
		rc = lg_fail(rc, "worktree %s removed, but its repository %s "
			     "cannot be opened to unregister it", path,
			     commondir);
		goto out;
	}
	po.flags = GIT_WORKTREE_PRUNE_VALID | GIT_WORKTREE_PRUNE_LOCKED;
	rc = git_worktree_lookup(&wt, main, wtname);
	if (rc == 0)
		rc = git_worktree_prune(wt, &po);
	if (rc < 0 && rc != GIT_ENOTFOUND) {
		/* A registration libgit2 cannot parse: remove it directly. */
		git_error_clear();
		gitdir = sbx_xasprintf("%s/worktrees/%s", commondir, wtname);
		if ((rc = rm_tree(gitdir)) < 0)
			goto out;
	}
	rc = 0;
	git_error_clear();

	if (flags & SBX_TERMINATE_DELETE_BRANCH) {
		rc = git_branch_lookup(&branch, main, bname, GIT_BRANCH_LOCAL);
		if (rc == 0)
			rc = git_branch_delete(branch);
		if (rc < 0 && rc != GIT_ENOTFOUND) {
			rc = lg_fail(rc, "worktree removed, but branch %s "
				     "could not be deleted", bname);
			goto out;
		}
		rc = delete_snapshot_refs(main, session);
	}
out:
	git_reference_free(branch);
	git_worktree_free(wt);
	git_repository_free(main);
	git_repository_free(repo);
	free(gitdir);
	free(bname);
	free(wtname);
	free(commondir);
	free(path);
	return rc;
}

/* ------------------------------------------------------------------------ */
/* snapshots                                                                 */
/* ------------------------------------------------------------------------ */

/*
 * Snapshot ids are sequence numbers, zero-padded to 4 digits ("0001"),
 * wider past 9999; they sort numerically.  A user may type "3" for "0003".
 * Returns false for anything that is not a number.
 */
static bool snap_id_parse(const char *id, unsigned long *n)
{
	char *end;

	if (!id || !*id || strlen(id) > 18 || strspn(id, "0123456789") !=
						      strlen(id))
		return false;
	errno = 0;
	*n = strtoul(id, &end, 10);
	return errno == 0 && *end == '\0';
}

static char *snap_id_format(unsigned long n)
{
	return sbx_xasprintf("%04lu", n);
}

/* The highest snapshot number of a session, 0 when there is none. */
static int snap_max(git_repository *repo, const char *session,
		    unsigned long *max)
{
	git_reference_iterator *it = NULL;
	const char *name;
	char *glob = sbx_xasprintf(SNAP_PREFIX "%s/*", session);
	size_t plen = strlen(glob) - 1;
	unsigned long n;
	int rc;

	*max = 0;
	rc = git_reference_iterator_glob_new(&it, repo, glob);
	while (rc == 0 && (rc = git_reference_next_name(&name, it)) == 0) {
		if (snap_id_parse(name + plen, &n) && n > *max)
			*max = n;
	}
	if (rc == GIT_ITEROVER)
		rc = 0;
	else if (rc < 0)
		rc = lg_fail(rc, "cannot list snapshots of %s", session);
	git_reference_iterator_free(it);
	free(glob);
	return rc;
}

/*
 * The tree of the worktree's current state: tracked files as they are on
 * disk (modifications and deletions applied) plus untracked files that are
 * not ignored.  It is built in a private index so that the worktree's real
 * index, HEAD and branch are not touched:
 *
 *  - the private index starts as a copy of the real one, so that its stat
 *    data saves rehashing unchanged files (the copy keeps the original's
 *    mtime: libgit2's racy-git check compares file times to it);
 *  - without a real index it starts from HEAD's tree;
 *  - add_all + update_all then make it match the working tree, respecting
 *    .gitignore, as `git add -A` does.
 *
 * The private index is installed in `repo` (a repository object opened for
 * this operation only) and left there: restore() checks out against it.
 */
static int state_tree(git_oid *tree_out, git_repository *repo,
		      git_commit *head)
{
	git_index *idx = NULL;
	git_tree *tree = NULL;
	char *real = sbx_xasprintf("%sindex", git_repository_path(repo));
	char *tmp = sbx_xasprintf("%ssbx-snapshot-index.XXXXXX",
				  git_repository_path(repo));
	int in = -1, out = -1, rc;
	bool have_copy = false;
	struct stat st;

	in = open(real, O_RDONLY | O_CLOEXEC);
	if (in >= 0 && fstat(in, &st) == 0) {
		out = mkstemp(tmp);
		if (out < 0) {
			rc = sbx_error_os("cannot create a temporary index in "
					  "%s", git_repository_path(repo));
			goto out;
		}
		have_copy = true;
		if ((rc = copy_fd(in, out, tmp)) < 0)
			goto out;
		{
			struct timespec ts[2] = {st.st_atim, st.st_mtim};

			(void)futimens(out, ts);
		}
		close(out);
		out = -1;
		rc = git_index_open(&idx, tmp);
	} else if (in < 0 && errno != ENOENT) {
		rc = sbx_error_os("cannot read %s", real);
		goto out;
	} else {
		rc = git_index_new(&idx);
	}
	if (rc < 0) {
		rc = lg_fail(rc, "cannot make a private index");
		goto out;
	}
	/* Owned by the repository from here; our reference stays ours. */
	if ((rc = git_repository_set_index(repo, idx)) < 0) {
		rc = lg_fail(rc, "cannot install a private index");
		goto out;
	}
	if (!have_copy && head) {
		if ((rc = git_commit_tree(&tree, head)) < 0 ||
		    (rc = git_index_read_tree(idx, tree)) < 0) {
			rc = lg_fail(rc, "cannot read the HEAD tree");
			goto out;
		}
	}
	if ((rc = git_index_add_all(idx, NULL, GIT_INDEX_ADD_DEFAULT, NULL,
				    NULL)) < 0 ||
	    (rc = git_index_update_all(idx, NULL, NULL, NULL)) < 0) {
		rc = lg_fail(rc, "cannot record the working tree of %s",
			     git_repository_workdir(repo));
		goto out;
	}
	if ((rc = git_index_write_tree_to(tree_out, idx, repo)) < 0)
		rc = lg_fail(rc, "cannot write the snapshot tree");
out:
	if (out >= 0)
		close(out);
	if (in >= 0)
		close(in);
	if (have_copy)
		(void)unlink(tmp);
	git_tree_free(tree);
	git_index_free(idx);
	free(tmp);
	free(real);
	return rc < 0 ? rc : 0;
}

/*
 * Record the worktree's state as a commit (parent: HEAD, when born) under
 * refs/sbx/snapshots/<session>/<id>.  Leaves the private index installed
 * in `repo` and the state tree in *tree_out (may be NULL).
 */
static int take_snapshot(git_repository *repo, const char *session,
			 const char *message, char **id_out,
			 git_oid *tree_out)
{
	git_reference *headref = NULL, *snap = NULL;
	git_commit *head = NULL;
	git_tree *tree = NULL;
	git_signature *sig = NULL;
	git_oid tree_oid, commit_oid;
	char *msg = NULL, *name = NULL, *id = NULL;
	const git_commit *parents[1];
	unsigned long n;
	int rc, tries;

	*id_out = NULL;
	rc = git_repository_head(&headref, repo);
	if (rc == 0) {
		rc = git_reference_peel((git_object **)&head, headref,
					GIT_OBJECT_COMMIT);
	} else if (rc == GIT_EUNBORNBRANCH) {
		git_error_clear();
		rc = 0; /* an orphan branch: a root snapshot */
	}
	if (rc < 0) {
		rc = lg_fail(rc, "cannot resolve HEAD of sandbox %s", session);
		goto out;
	}
	if ((rc = state_tree(&tree_oid, repo, head)) < 0)
		goto out;
	if ((rc = git_tree_lookup(&tree, repo, &tree_oid)) < 0) {
		rc = lg_fail(rc, "cannot read the snapshot tree");
		goto out;
	}
	if ((rc = signature(&sig, repo)) < 0)
		goto out;
	if (!message || !*message)
		message = SNAP_DEFAULT_MSG;
	msg = sbx_xasprintf("%s%s", message,
			    message[strlen(message) - 1] == '\n' ? "" : "\n");
	parents[0] = head;
	rc = git_commit_create(&commit_oid, repo, NULL, sig, sig, NULL, msg,
			       tree, head ? 1 : 0, parents);
	if (rc < 0) {
		rc = lg_fail(rc, "cannot write the snapshot commit");
		goto out;
	}
	if ((rc = snap_max(repo, session, &n)) < 0)
		goto out;
	/* Never overwrite: a concurrent snapshot makes us take the next. */
	for (tries = 0; tries < 100; tries++) {
		free(id);
		free(name);
		id = snap_id_format(++n);
		name = sbx_xasprintf(SNAP_PREFIX "%s/%s", session, id);
		rc = git_reference_create(&snap, repo, name, &commit_oid, 0,
					  message);
		if (rc != GIT_EEXISTS)
			break;
		git_error_clear();
	}
	if (rc < 0) {
		rc = lg_fail(rc, "cannot create snapshot ref %s", name);
		goto out;
	}
	if (tree_out)
		*tree_out = tree_oid;
	*id_out = id;
	id = NULL;
out:
	git_reference_free(snap);
	git_signature_free(sig);
	git_tree_free(tree);
	git_commit_free(head);
	git_reference_free(headref);
	free(id);
	free(name);
	free(msg);
	return rc < 0 ? rc : 0;
}

int plocal_snapshot(struct sbx_provider *p, const char *session,
		    const char *message, char **id_out)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	git_repository *repo = NULL;
	int rc;

	SBX_ASSERT_ARG(p && session && id_out);
	*id_out = NULL;
	lg_init();
	if ((rc = open_session(lp, session, &repo, NULL)) < 0)
		return rc;
	rc = take_snapshot(repo, session, message, id_out, NULL);
	git_repository_free(repo);
	return rc;
}

struct snap_item {
	unsigned long n;
	char *id;
	char *message;
	time_t time;
};

static int snap_cmp_desc(const void *a, const void *b)
{
	const struct snap_item *x = a, *y = b;

	return x->n < y->n ? 1 : x->n > y->n ? -1 : 0;
}

int plocal_snapshots(struct sbx_provider *p, const char *session,
		     sbx_snapshot_cb cb, void *payload)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	git_repository *repo = NULL;
	git_reference_iterator *it = NULL;
	git_reference *ref = NULL;
	git_commit *c = NULL;
	struct snap_item *items = NULL;
	size_t count = 0, cap = 0, i, plen;
	char *glob = NULL;
	unsigned long n;
	int rc;

	SBX_ASSERT_ARG(p && session && cb);
	lg_init();
	if ((rc = open_session(lp, session, &repo, NULL)) < 0)
		return rc;
	glob = sbx_xasprintf(SNAP_PREFIX "%s/*", session);
	plen = strlen(glob) - 1;
	if ((rc = git_reference_iterator_glob_new(&it, repo, glob)) < 0) {
		rc = lg_fail(rc, "cannot list snapshots of %s", session);
		goto out;
	}
	while ((rc = git_reference_next(&ref, it)) == 0) {
		const char *id = git_reference_name(ref) + plen;
		const char *m;
		size_t mlen;

		if (!snap_id_parse(id, &n) ||
		    git_reference_peel((git_object **)&c, ref,
				       GIT_OBJECT_COMMIT) < 0) {
			git_error_clear();
			git_reference_free(ref);
			ref = NULL;
			continue; /* not ours: skip */
		}
		if (count == cap) {
			cap = cap ? cap * 2 : 16;
			items = sbx_xrealloc(items, cap * sizeof(*items));
		}
		m = git_commit_message(c);
		mlen = strlen(m);
		while (mlen && m[mlen - 1] == '\n')
			mlen--;
		items[count].n = n;
		items[count].id = sbx_xstrdup(id);
		items[count].message = sbx_xstrndup(m, mlen);
		items[count].time = (time_t)git_commit_time(c);
		count++;
		git_commit_free(c);
		c = NULL;
		git_reference_free(ref);
		ref = NULL;
	}
	if (rc != GIT_ITEROVER) {
		rc = lg_fail(rc, "cannot list snapshots of %s", session);
		goto out;
	}
	rc = 0;
	qsort(items, count, sizeof(*items), snap_cmp_desc);
	for (i = 0; i < count; i++) {
		struct sbx_snapshot_info si = {
			.id = items[i].id,
			.message = items[i].message,
			.created_at = items[i].time,
		};

		if ((rc = cb(&si, payload)) != 0) {
			rc = rc < 0 ? rc : 0;
			break;
		}
	}
out:
	for (i = 0; i < count; i++) {
		free(items[i].id);
		free(items[i].message);
	}
	free(items);
	git_commit_free(c);
	git_reference_free(ref);
	git_reference_iterator_free(it);
	git_repository_free(repo);
	free(glob);
	return rc;
}

/*
 * Restore: snapshot the current state first ("before restore to <id>"),
 * then make the working tree equal the snapshot's tree with a forced
 * checkout against the private index of that fresh snapshot.  Relative to
 * that index every non-ignored file is tracked, so files absent from the
 * target are removed while ignored files stay.  HEAD and the branch are not
 * moved; the real index is then reset to HEAD's tree (unstaged), so `git
 * status` shows the restored state as working-tree changes against HEAD.
 */
int plocal_restore(struct sbx_provider *p, const char *session,
		   const char *id, char **saved_out)
{
	struct plocal_provider *lp = (struct plocal_provider *)p;
	git_repository *repo = NULL, *fresh = NULL;
	git_reference *ref = NULL;
	git_object *target = NULL, *head = NULL;
	git_tree *target_tree = NULL, *cur_tree = NULL;
	git_checkout_options co = GIT_CHECKOUT_OPTIONS_INIT;
	char *star = "*";
	git_strarray all = {&star, 1};
	git_oid cur_oid;
	char *name = NULL, *saved = NULL, *nid = NULL, *path = NULL;
	char *msg = NULL;
	unsigned long n;
	int rc;

	SBX_ASSERT_ARG(p && session && id);
	if (saved_out)
		*saved_out = NULL;
	lg_init();
	if ((rc = open_session(lp, session, &repo, &path)) < 0)
		return rc;
	if (!snap_id_parse(id, &n)) {
		rc = -ENOENT;
	} else {
		nid = snap_id_format(n);
		name = sbx_xasprintf(SNAP_PREFIX "%s/%s", session, nid);
		rc = git_reference_lookup(&ref, repo, name);
		if (rc == 0)
			rc = git_reference_peel(&target, ref, GIT_OBJECT_TREE);
		if (rc < 0 && rc != GIT_ENOTFOUND)
			rc = lg_fail(rc, "cannot read snapshot %s", name);
	}
	if (rc == -ENOENT || rc == GIT_ENOTFOUND) {
		git_error_clear();
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "session %s has no snapshot %s; list them "
				   "with `sbx snapshots %s`", session, id,
				   session);
		goto out;
	}
	if (rc < 0)
		goto out;
	target_tree = (git_tree *)target;

	msg = sbx_xasprintf("before restore to %s", nid);
	if ((rc = take_snapshot(repo, session, msg, &saved, &cur_oid)) < 0) {
		rc = sbx_error_prefix(rc, "restore %s: saving the current state "
				      "first failed, nothing was changed", id);
		goto out;
	}
	if ((rc = git_tree_lookup(&cur_tree, repo, &cur_oid)) < 0) {
		rc = lg_fail(rc, "cannot read the current state tree");
		goto out;
	}
	/*
	 * FORCE: the worktree must equal the snapshot.  REMOVE_UNTRACKED:
	 * files not in the state index appeared after the safety snapshot;
	 * ignored files are never removed (no REMOVE_IGNORED).  The private
	 * index has no file of its own, so it is never written.
	 */
	co.checkout_strategy = GIT_CHECKOUT_FORCE |
			       GIT_CHECKOUT_REMOVE_UNTRACKED |
			       GIT_CHECKOUT_DONT_WRITE_INDEX;
	co.baseline = cur_tree;
	rc = git_checkout_tree(repo, (git_object *)target_tree, &co);
	if (rc < 0) {
		rc = lg_fail(rc, "restore %s: checkout failed (the state before "
			     "it is snapshot %s)", id, saved);
		goto out;
	}

	/* The real index back to HEAD's tree, keeping stat data of entries
	 * that already match (git_reset_default only rewrites the others). */
	if ((rc = open_worktree_repo(&fresh, path)) < 0)
		goto out;
	rc = git_revparse_single(&head, fresh, "HEAD^{commit}");
	if (rc == GIT_ENOTFOUND) {
		git_error_clear();
		head = NULL; /* orphan: empty index */
	} else if (rc < 0) {
		rc = lg_fail(rc, "cannot resolve HEAD of %s", path);
		goto out;
	}
	rc = git_reset_default(fresh, head, &all);
	if (rc < 0) {
		rc = lg_fail(rc, "restore %s: the files are restored, but the "
			     "index could not be reset to HEAD", id);
		goto out;
	}
	if (saved_out) {
		*saved_out = saved;
		saved = NULL;
	}
out:
	git_object_free(head);
	git_repository_free(fresh);
	git_tree_free(cur_tree);
	git_reference_free(ref);
	git_object_free(target);
	git_repository_free(repo);
	free(msg);
	free(saved);
	free(name);
	free(nid);
	free(path);
	return rc < 0 ? rc : 0;
}

/* ------------------------------------------------------------------------ */

int plocal_git_commondir(const char *worktree, char **out)
{
	git_repository *repo = NULL;
	int rc;

	SBX_ASSERT_ARG(worktree && out);
	*out = NULL;
	lg_init();
	if ((rc = open_worktree_repo(&repo, worktree)) < 0)
		return rc;
	*out = dir_dup(git_repository_commondir(repo));
	git_repository_free(repo);
	return 0;
}
