/*
 * The user's repository for a new sandbox, found as `sbx up` finds it: the
 * git repository holding `dir`, or the current directory when `dir` is
 * NULL; and the commit the session's branch starts at.  One implementation
 * (providers/local/plocal_gitsource.c) for the local provider (worktrees)
 * and the client that seeds remote sandboxes (cli/repo_seed.c), so both
 * follow the same rules (docs/providers.md).
 */
#ifndef SBX_GITSOURCE_H
#define SBX_GITSOURCE_H

#include <stdarg.h>

#include "sbx/error.h"

struct git_commit;
struct git_reference;
struct git_repository;

/*
 * The one libgit2 → errno mapping (STYLE.md, "one mapping function per
 * foreign library"): GIT_ENOTFOUND, GIT_EUNBORNBRANCH -ENOENT; GIT_EEXISTS
 * -EEXIST; GIT_EAMBIGUOUS, EBAREREPO, EINVALIDSPEC, EINVALID, EPEEL
 * -EINVAL; GIT_ELOCKED, EMODIFIED, ECONFLICT, EUNMERGED, EUNCOMMITTED,
 * EINDEXDIRTY, EMERGECONFLICT -EBUSY; GIT_EDIRECTORY -EISDIR; GIT_EAUTH,
 * ECERTIFICATE, EOWNER -EACCES; anything else -EIO.
 */
int sbx_errno_from_git(int gitrc);

/*
 * Record a libgit2 failure: "<what>: <libgit2 message>" (git_error_last()),
 * class SBX_ERR_GIT, detail the libgit2 code.  Returns the mapped negative
 * errno.
 */
int sbx_git_fail(int gitrc, const char *fmt, ...) SBX_PRINTF(2, 3);
int sbx_git_failv(int gitrc, const char *fmt, va_list ap)
	SBX_PRINTF(2, 0);

/*
 * Open it.  *out is released with git_repository_free().  Errors:
 * -ENOENT (CONFIG) when `dir` does not exist, -EINVAL (CONFIG) when it is
 * not inside a repository, libgit2's failures as SBX_ERR_GIT.  libgit2
 * must be initialised (git_libgit2_init).
 */
SBX_WUR int sbx_git_open_source(struct git_repository **out, const char *dir);

/*
 * Where the branch `branch` (short name, "sbx/NAME") of session `session`
 * starts in `repo`:
 *  - a branch kept by an earlier `sbx down` holds the agent's commits: it
 *    is continued (*out its tip; *branch_out, when not NULL, the branch),
 *    and an explicit `ref` is refused rather than guessed at (-EEXIST,
 *    SBX_ERR_STATE, saying how to continue or delete it);
 *  - otherwise `ref` (any revspec; -EINVAL, SBX_ERR_CONFIG, when it names
 *    no commit), or HEAD (-EINVAL, CONFIG, when HEAD is unborn), and
 *    *branch_out is NULL.
 * A session name that cannot be a branch name is -EINVAL (CONFIG).
 * libgit2's other failures are SBX_ERR_GIT.  *out is released with
 * git_commit_free(), *branch_out with git_reference_free().
 */
SBX_WUR int sbx_git_start_point(struct git_commit **out,
				struct git_reference **branch_out,
				struct git_repository *repo,
				const char *session, const char *branch,
				const char *ref);

#endif
