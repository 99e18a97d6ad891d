/*
 * The user's repository and the start commit of a new session, for the
 * local provider and for the CLI that seeds remote sandboxes (one set of
 * rules: sbx/gitsource.h, docs/providers.md).
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <git2.h>

#include "sbx/error.h"
#include "sbx/gitsource.h"
#include "sbx/xmalloc.h"
#include "plocal_git_i.h"

int sbx_errno_from_git(int gitrc)
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

int sbx_git_failv(int gitrc, const char *fmt, va_list ap)
{
	const git_error *e = git_error_last();
	char what[256];

	vsnprintf(what, sizeof(what), fmt, ap);
	return sbx_error_setd(SBX_ERR_GIT, sbx_errno_from_git(gitrc), gitrc,
			      "%s: %s", what,
			      e && e->message ? e->message
					      : "unknown libgit2 error");
}

int sbx_git_fail(int gitrc, const char *fmt, ...)
{
	va_list ap;
	int rc;

	va_start(ap, fmt);
	rc = sbx_git_failv(gitrc, fmt, ap);
	va_end(ap);
	return rc;
}

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
		return sbx_git_fail(rc, "cannot look for a git "
				    "repository at %s", dir);
	rc = git_repository_open(out, found.ptr);
	if (rc < 0)
		rc = sbx_git_fail(rc, "cannot open the git repository at %s",
				  found.ptr);
	git_buf_dispose(&found);
	return rc;
}

/* The commit `ref` (any revspec) names, or HEAD's. */
static int ref_commit(git_commit **out, git_repository *repo, const char *ref,
		      const char *where)
{
	git_object *obj = NULL, *peeled = NULL;
	int rc;

	if (!ref) {
		if (git_repository_head_unborn(repo) == 1)
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
		rc = sbx_git_fail(rc, "cannot resolve %s in %s", ref, where);
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

int sbx_git_start_point(git_commit **out, git_reference **branch_out,
			git_repository *repo, const char *session,
			const char *bname, const char *ref)
{
	git_reference *branch = NULL;
	git_object *tip = NULL;
	char *refname = sbx_xasprintf("refs/heads/%s", bname);
	char *where = plocal_dir_dup(git_repository_workdir(repo)
					     ? git_repository_workdir(repo)
					     : git_repository_path(repo));
	int rc, valid = 0;

	*out = NULL;
	if (branch_out)
		*branch_out = NULL;
	if (git_reference_name_is_valid(&valid, refname) < 0 || !valid) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "session name %s cannot be a git branch "
				   "name (%s); avoid \"..\" and a \".lock\" "
				   "suffix", session, bname);
		goto out;
	}
	rc = git_branch_lookup(&branch, repo, bname, GIT_BRANCH_LOCAL);
	if (rc == 0 && ref) {
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "branch %s already exists in %s (kept from "
				   "an earlier session); run without --ref to "
				   "continue it, or delete it with `git branch "
				   "-D %s`", bname, where, bname);
		goto out;
	}
	if (rc == 0) {
		rc = git_reference_peel(&tip, branch, GIT_OBJECT_COMMIT);
		if (rc < 0) {
			rc = sbx_git_fail(rc, "branch %s", bname);
			goto out;
		}
		*out = (git_commit *)tip;
		if (branch_out) {
			*branch_out = branch;
			branch = NULL;
		}
		goto out;
	}
	if (rc != GIT_ENOTFOUND) {
		rc = sbx_git_fail(rc, "cannot look up branch %s", bname);
		goto out;
	}
	git_error_clear();
	rc = ref_commit(out, repo, ref, where);
out:
	git_reference_free(branch);
	free(where);
	free(refname);
	return rc < 0 ? rc : 0;
}
