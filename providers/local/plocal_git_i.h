/*
 * The local provider's control plane on libgit2 (plocal_i.h has the
 * provider as a whole):
 *
 *   plocal_git.c        libgit2 glue (init, errors), sessions' paths and
 *                       repositories, status; get, list, terminate
 *   plocal_gitsource.c  the user's repository and the start commit of a
 *                       new session (sbx/gitsource.h, shared with the CLI)
 *   plocal_create.c     create: branch, worktree, carried changes, and the
 *                       rollback of a create that failed half-way
 *   plocal_snap.c       snapshots (refs/sbx/snapshots/NAME/<id>) and
 *                       restore
 *   plocal_fsutil.c     filesystem helpers below a directory descriptor
 *                       (removal, copies) that never follow symlinks
 *
 * Identity (plocal_i.h): session NAME is branch sbx/NAME, worktree
 * directory <worktrees>/NAME registered in the source repository as
 * "sbx-NAME", and snapshot refs refs/sbx/snapshots/NAME/<id>.  No state
 * file: everything is read back from git, so a crash leaves nothing that
 * git cannot describe.  This code never shells out to git.
 *
 * Every libgit2 object is freed on every path (one `out:` label per
 * function).  libgit2 is initialised once per process (plocal_lg_init())
 * and is never shut down: other threads of the daemon may still use it.
 *
 * Errors: 0 / negative errno with sbx_error_last(); libgit2 failures as
 * SBX_ERR_GIT with the libgit2 code in `detail` (sbx_git_fail()).
 */
#ifndef PLOCAL_GIT_I_H
#define PLOCAL_GIT_I_H

#include <stdbool.h>

#include <git2.h>

#include "sbx/error.h"
#include "sbx/gitsource.h"
#include "sbx/provider.h"

#include "plocal_i.h"

#define BRANCH_PREFIX "sbx/"
#define WORKTREE_PREFIX "sbx-"
#define SNAP_PREFIX "refs/sbx/snapshots/"

/* ---- libgit2 glue and sessions (plocal_git.c) ------------------------------ */

/* git_libgit2_init() once per process. */
void plocal_lg_init(void);

/* libgit2 failures: sbx_git_fail() (sbx/gitsource.h). */

/* Keep the current error across cleanup code that may set its own. */
void plocal_error_save(struct sbx_error *save);
void plocal_error_restore(const struct sbx_error *save);

/* A copy of `path` without trailing '/' (malloc'd). */
char *plocal_dir_dup(const char *path);
/* <worktrees>/<session> (malloc'd). */
char *plocal_session_path(const struct plocal_provider *lp,
			  const char *session);
/* The configured isolation ("none" unless set). */
const char *plocal_isolation_of(const struct plocal_provider *lp);

/*
 * Open the worktree repository of a session's directory without searching
 * upwards (a broken worktree must not silently resolve to $SBX_HOME's or
 * the user's enclosing repository).
 */
SBX_WUR int plocal_open_worktree_repo(git_repository **out,
				      const char *path);
/*
 * The session's worktree repository (and its path, when path_out is not
 * NULL, malloc'd); -ENOENT (SBX_ERR_NOTFOUND) when there is none.
 */
SBX_WUR int plocal_open_session(const struct plocal_provider *lp,
				const char *session, git_repository **out,
				char **path_out);
/* Signature for sbx commits: the repository's user, else "sbx". */
SBX_WUR int plocal_signature(git_signature **out, git_repository *repo);

/* The path a status entry is about (no rename detection is requested). */
const char *plocal_status_path(const git_status_entry *e);
/*
 * Status of a checkout: staged, unstaged and untracked-not-ignored files,
 * untracked directories expanded to their files.
 */
SBX_WUR int plocal_status_list(git_status_list **out, git_repository *repo,
			       bool with_submodules);

/* What get() reports of the worktree at `path` (READY or ERROR). */
int plocal_fill_info(const struct plocal_provider *lp, const char *session,
		     const char *path, struct sbx_sandbox_info *out);

/* ---- filesystem helpers (plocal_fsutil.c) ---------------------------------- */

/*
 * Remove `path` recursively, never following symlinks; a mount inside is
 * refused with -EXDEV instead of being emptied.  0 when it does not exist.
 */
int plocal_rm_tree(const char *path);
/* Copy `in` to `out` to EOF; `what` names the file in errors. */
int plocal_copy_fd(int in, int out, const char *what);
/*
 * Make `rel` below `rootfd` what `src` is (a file, a symlink, or nothing
 * when `src` does not exist), creating parent directories; never follows
 * a symlink below rootfd.
 */
int plocal_mirror_path(int rootfd, const char *rel, const char *src);

#endif
