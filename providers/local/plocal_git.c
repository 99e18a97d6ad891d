/*
 * Local provider control plane on libgit2: the glue (init, errors,
 * sessions' repositories, status) and get, list, terminate.  See
 * plocal_git_i.h for the other files and docs/providers.md ("local") for
 * the user-facing rules.
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

#include "sbx/error.h"
#include "sbx/gitsource.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"
#include "plocal_git_i.h"

#define DIRTY_LIST_MAX 5

/* ------------------------------------------------------------------------ */
/* libgit2 plumbing                                                          */
/* ------------------------------------------------------------------------ */

static pthread_once_t lg_once = PTHREAD_ONCE_INIT;

static void lg_init_once(void)
{
	git_libgit2_init();
}

void plocal_lg_init(void)
{
	pthread_once(&lg_once, lg_init_once);
}



/* Keep the current error across cleanup code that may set its own. */
void plocal_error_save(struct sbx_error *save)
{
	*save = *sbx_error_last();
}

void plocal_error_restore(const struct sbx_error *save)
{
	sbx_error_restore(save);
}

/* Copy of a libgit2 directory path without its trailing '/'. */
char *plocal_dir_dup(const char *path)
{
	size_t n = strlen(path);

	while (n > 1 && path[n - 1] == '/')
		n--;
	return sbx_xstrndup(path, n);
}

char *plocal_session_path(const struct plocal_provider *lp,
			  const char *session)
{
	return sbx_xasprintf("%s/%s", lp->worktrees, session);
}

/* Isolation in force for this provider: "none" unless configured. */
const char *plocal_isolation_of(const struct plocal_provider *lp)
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
		res = plocal_dir_dup(git_repository_workdir(main));
	else
		res = plocal_dir_dup(commondir);
	git_repository_free(main);
	return res;
}

/*
 * Open the worktree repository of a session's directory without searching
 * upwards (a broken worktree must not silently resolve to $SBX_HOME's or
 * the user's enclosing repository).
 */
int plocal_open_worktree_repo(git_repository **out, const char *path)
{
	int rc;

	*out = NULL;
	rc = git_repository_open_ext(out, path, GIT_REPOSITORY_OPEN_NO_SEARCH,
				     NULL);
	if (rc < 0)
		return sbx_git_fail(rc, "cannot open the worktree at %s",
				    path);
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
	path = plocal_session_path(lp, session);
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

/* locate() + plocal_open_worktree_repo(), the prologue of most operations. */
int plocal_open_session(const struct plocal_provider *lp, const char *session,
			git_repository **repo_out, char **path_out)
{
	char *path = NULL;
	int rc;

	*repo_out = NULL;
	if (path_out)
		*path_out = NULL;
	if ((rc = locate(lp, session, &path)) < 0)
		return rc;
	if ((rc = plocal_open_worktree_repo(repo_out, path)) < 0) {
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
int plocal_signature(git_signature **out, git_repository *repo)
{
	int rc;

	if (git_signature_default(out, repo) == 0)
		return 0;
	rc = git_signature_now(out, "sbx", "sbx@localhost");
	if (rc < 0)
		return sbx_git_fail(rc, "cannot make a commit signature");
	return 0;
}

/* ------------------------------------------------------------------------ */
/* Status                                                                    */
/* ------------------------------------------------------------------------ */

/* The path a status entry is about (no rename detection is requested). */
const char *plocal_status_path(const git_status_entry *e)
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
int plocal_status_list(git_status_list **out, git_repository *repo,
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
		return sbx_git_fail(rc, "cannot compute the status of %s",
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

	if ((rc = plocal_status_list(&sl, repo, true)) < 0)
		return rc;
	n = git_status_list_entrycount(sl);
	for (i = 0; i < n; i++) {
		const git_status_entry *e = git_status_byindex(sl, i);
		const char *path = plocal_status_path(e);

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
/* get / list                                                                */
/* ------------------------------------------------------------------------ */

/*
 * Describe the worktree at `path`.  Problems with the worktree itself do
 * not fail: they give state ERROR with the explanation in extra.error, so
 * that `sbx ls` / `sbx status` can show them and `sbx down --force` can
 * clean up.
 */
int plocal_fill_info(const struct plocal_provider *lp, const char *session,
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
	out->isolation = sbx_xstrdup(plocal_isolation_of(lp));
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
		rc = sbx_git_fail(rc, "%s is not a usable git worktree",
				  path);
		goto broken;
	}
	gitdir = plocal_dir_dup(git_repository_path(repo));
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
	commondir = plocal_dir_dup(git_repository_commondir(repo));
	repo_path = main_repo_path(commondir);
	cJSON_AddStringToObject(out->extra, "repo", repo_path);
	free(repo_path);

	rc = git_worktree_open_from_repository(&wt, repo);
	if (rc == 0)
		rc = git_worktree_validate(wt);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "the worktree registration of %s is "
				  "broken", path);
		goto broken;
	}
	rc = git_repository_head(&head, repo);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot resolve HEAD of %s", path);
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
	plocal_lg_init();
	if ((rc = locate(lp, session, &path)) < 0)
		return rc;
	rc = plocal_fill_info(lp, session, path, out);
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
	plocal_lg_init();
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
		rc = sbx_git_fail(rc, "cannot list snapshots of %s",
				  session);
		goto out;
	}
	while ((rc = git_reference_next(&ref, it)) == 0) {
		rc = git_reference_delete(ref);
		git_reference_free(ref);
		ref = NULL;
		if (rc < 0) {
			rc = sbx_git_fail(rc, "cannot delete a snapshot "
					  "of %s", session);
			goto out;
		}
	}
	if (rc == GIT_ITEROVER)
		rc = 0;
	else
		rc = sbx_git_fail(rc, "cannot list snapshots of %s",
				  session);
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
	plocal_lg_init();
	if ((rc = locate(lp, session, &path)) < 0)
		return rc;
	wtname = sbx_xasprintf(WORKTREE_PREFIX "%s", session);
	bname = sbx_xasprintf(BRANCH_PREFIX "%s", session);

	rc = git_repository_open_ext(&repo, path,
				     GIT_REPOSITORY_OPEN_NO_SEARCH, NULL);
	if (rc < 0) {
		if (!(flags & SBX_TERMINATE_FORCE)) {
			char why[sizeof(sbx_error_last()->msg)];

			(void)sbx_git_fail(rc, "cannot open the worktree %s",
					   path);
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
		commondir = plocal_dir_dup(git_repository_commondir(repo));
		git_repository_free(repo);
		repo = NULL;
	}

	if ((rc = plocal_rm_tree(path)) < 0) {
		rc = sbx_error_prefix(rc, "removing the worktree of %s",
				      session);
		goto out;
	}
	if (!commondir)
		goto out; /* forced removal of an unrecognisable directory */

	rc = git_repository_open_ext(&main, commondir,
				     GIT_REPOSITORY_OPEN_NO_SEARCH, NULL);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "worktree %s removed, but its "
				  "repository %s cannot be opened to "
				  "unregister it", path, commondir);
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
		if ((rc = plocal_rm_tree(gitdir)) < 0)
			goto out;
	}
	rc = 0;
	git_error_clear();

	if (flags & SBX_TERMINATE_DELETE_BRANCH) {
		rc = git_branch_lookup(&branch, main, bname, GIT_BRANCH_LOCAL);
		if (rc == 0)
			rc = git_branch_delete(branch);
		if (rc < 0 && rc != GIT_ENOTFOUND) {
			rc = sbx_git_fail(rc, "worktree removed, but "
					  "branch %s could not be deleted",
					  bname);
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

int plocal_git_commondir(const char *worktree, char **out)
{
	git_repository *repo = NULL;
	int rc;

	SBX_ASSERT_ARG(worktree && out);
	*out = NULL;
	plocal_lg_init();
	if ((rc = plocal_open_worktree_repo(&repo, worktree)) < 0)
		return rc;
	*out = plocal_dir_dup(git_repository_commondir(repo));
	git_repository_free(repo);
	return 0;
}
