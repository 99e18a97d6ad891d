/*
 * The local provider's create(): the session's branch (continued, or made
 * at the start commit), its worktree, the changes carried over from the
 * user's checkout, and the rollback of a create that failed half-way.
 * See plocal_git_i.h.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <git2.h>

#include "sbx/error.h"
#include "sbx/gitsource.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"
#include "plocal_git_i.h"

/* ------------------------------------------------------------------------ */
/* create                                                                    */
/* ------------------------------------------------------------------------ */

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
		rc = sbx_git_fail(rc, "cannot prune the stale worktree %s",
				  name);
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
	if ((rc = plocal_status_list(&sl, src, false)) < 0)
		return rc;
	if ((rc = git_repository_index(&sidx, src)) < 0 ||
	    (rc = git_repository_index(&didx, dst)) < 0) {
		rc = sbx_git_fail(rc, "cannot read an index");
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
		const char *path = plocal_status_path(e);
		const git_index_entry *ie;
		git_index_entry copy;

		if (!path || e->status == GIT_STATUS_CURRENT ||
		    (e->status & GIT_STATUS_IGNORED))
			continue;
		free(spath);
		spath = sbx_xasprintf("%s%s", swd, path);
		if ((rc = plocal_mirror_path(rootfd, path, spath)) < 0) {
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
			rc = sbx_git_fail(rc, "cannot stage %s in the new "
					  "worktree", path);
			goto out;
		}
	}
	if ((rc = git_index_write(didx)) < 0)
		rc = sbx_git_fail(rc, "cannot write the index of %s",
				  dst_path);
out:
	if (rootfd >= 0)
		close(rootfd);
	free(spath);
	git_index_free(didx);
	git_index_free(sidx);
	git_status_list_free(sl);
	return rc < 0 ? rc : 0;
}

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

	plocal_error_save(&save);
	(void)plocal_rm_tree(path);
	po.flags = GIT_WORKTREE_PRUNE_VALID | GIT_WORKTREE_PRUNE_LOCKED;
	if (git_worktree_lookup(&wt, src, wtname) == 0)
		(void)git_worktree_prune(wt, &po);
	git_worktree_free(wt);
	/* A half-made registration that libgit2 cannot parse. */
	(void)plocal_rm_tree(regdir);
	if (made_branch && branch)
		(void)git_branch_delete(branch);
	git_error_clear();
	plocal_error_restore(&save);
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
	char *path = NULL, *bname = NULL, *wtname = NULL;
	char *common = NULL, *regdir = NULL;
	const char *iso;
	bool made_branch = false, touched = false;
	struct stat st;
	int rc;

	SBX_ASSERT_ARG(p && o && out);
	memset(out, 0, sizeof(*out));
	plocal_lg_init();
	if ((rc = sbx_name_validate(o->session)) < 0)
		return rc;
	iso = plocal_isolation_of(lp);
	if (strcmp(iso, "none") && strcmp(iso, "bwrap"))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "unknown isolation \"%s\" for the local "
				     "provider (use \"none\" or \"bwrap\")",
				     iso);

	bname = sbx_xasprintf(BRANCH_PREFIX "%s", o->session);
	wtname = sbx_xasprintf(WORKTREE_PREFIX "%s", o->session);
	path = plocal_session_path(lp, o->session);
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

	/* Continue a branch kept by an earlier `sbx down`, or start one. */
	rc = sbx_git_start_point(&commit, &branch, src, o->session, bname,
				 o->ref);
	if (rc < 0)
		goto out;
	if ((rc = clear_stale_registration(src, wtname, o->session)) < 0)
		goto out;
	/* Whatever is left at the registration path is not ours to remove,
	 * and rollback() removes that path: refuse instead. */
	common = plocal_dir_dup(git_repository_commondir(src));
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
			rc = sbx_git_fail(rc, "cannot create branch %s",
					  bname);
			goto out;
		}
		made_branch = true;
	}
	ao.ref = branch;
	ao.checkout_options.checkout_strategy = GIT_CHECKOUT_SAFE;
	rc = git_worktree_add(&wt, src, wtname, path, &ao);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot add worktree %s at %s", wtname,
				  path);
		goto out;
	}
	if (o->carry_changes) {
		if ((rc = plocal_open_worktree_repo(&dst, path)) < 0)
			goto out;
		if ((rc = carry_changes(src, dst, path)) < 0) {
			rc = sbx_error_prefix(rc, "--carry-changes");
			goto out;
		}
	}
	rc = plocal_fill_info(lp, o->session, path, out);
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
	free(bname);
	return rc;
}

