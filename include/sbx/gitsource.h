/*
 * The user's repository for a new sandbox, found as `sbx up` finds it: the
 * git repository holding `dir`, or the current directory when `dir` is
 * NULL.  One implementation for the local provider (worktrees) and the
 * client that seeds remote sandboxes (cli/repo_seed.c).
 */
#ifndef SBX_GITSOURCE_H
#define SBX_GITSOURCE_H

#include "sbx/error.h"

struct git_repository;

/*
 * Open it.  *out is released with git_repository_free().  Errors:
 * -ENOENT (CONFIG) when `dir` does not exist, -EINVAL (CONFIG) when it is
 * not inside a repository, libgit2's failures as SBX_ERR_GIT.  libgit2
 * must be initialised (git_libgit2_init).
 */
SBX_WUR int sbx_git_open_source(struct git_repository **out, const char *dir);

#endif
