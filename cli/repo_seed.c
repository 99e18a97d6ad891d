/*
 * Seeding a sandbox with a repository (repo_i.h; docs/design.md,
 * "Repository in and out").
 *
 * cli_seed_prepare() checks everything that can be checked before the
 * sandbox exists and starts the pack builder (git_packbuilder over the
 * start commit's history, written with its .idx into a temporary
 * directory), so the pack is built while the provider creates the
 * sandbox.  cli_seed_send() (repo_seed_tar.c) then streams one tar, in
 * one request:
 *
 *   1. the working tree: every stage-0 entry of the new index with its
 *      blob's content (checkout filters applied when the repository has
 *      any), or with --carry-changes the checkout's file;
 *   2. .git: HEAD -> refs/heads/sbx/NAME, config (user.name/email
 *      copied), info/exclude, shallow, the pack, its .idx and a .keep;
 *   3. .git/index, written by libgit2 with all stat data zero for entries
 *      whose file is the blob (the agent fills in what it extracted) and
 *      mtime 1 s for those that differ (carried unstaged changes).
 *
 * The working tree goes first: it streams while the pack may still be
 * being built.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <git2.h>

#include "sbx/gitsource.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"
#include "repo_i.h"
#include "repo_seed_i.h"

const char *cli_seed_repo(const struct cli_seed *sd)
{
	return sd->workdir;
}

static char *dir_nodash(const char *p)
{
	size_t n = strlen(p);

	while (n > 1 && p[n - 1] == '/')
		n--;
	return sbx_xstrndup(p, n);
}

/* ---- prepare ------------------------------------------------------------- */

static int open_repo(struct cli_seed *sd, const char *dir)
{
	int rc = sbx_git_open_source(&sd->repo, dir);

	if (rc < 0)
		return rc;
	sd->repo_path = sbx_xstrdup(git_repository_path(sd->repo));
	if (!git_repository_workdir(sd->repo))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s is a bare repository: a sandbox "
				     "needs a repository with a checkout",
				     git_repository_path(sd->repo));
	sd->workdir = dir_nodash(git_repository_workdir(sd->repo));
	return 0;
}

/* The start point, by the local provider's rules (sbx/gitsource.h). */
static int start_point(struct cli_seed *sd, const char *ref)
{
	git_reference *branch = NULL;
	git_commit *start = NULL;
	int rc = sbx_git_start_point(&start, &branch, sd->repo, sd->session,
				     sd->branch, ref);

	if (rc < 0)
		return rc;
	git_oid_cpy(&sd->start, git_commit_id(start));
	sd->continued = branch != NULL;
	git_commit_free(start);
	git_reference_free(branch);
	return 0;
}

/* user.name / user.email (commits in the sandbox need an identity, as
 * in the checkout, whose config a local worktree shares) and the
 * repository's info/exclude. */
static void copy_settings(struct cli_seed *sd)
{
	git_config *cfg = NULL;
	const char *v;
	char *path;

	if (git_repository_config_snapshot(&cfg, sd->repo) == 0) {
		if (git_config_get_string(&v, cfg, "user.name") == 0)
			sd->user_name = sbx_xstrdup(v);
		if (git_config_get_string(&v, cfg, "user.email") == 0)
			sd->user_email = sbx_xstrdup(v);
		git_config_free(cfg);
	}
	git_error_clear();
	path = sbx_xasprintf("%s/info/exclude",
			     git_repository_commondir(sd->repo));
	if (sbx_file_read(path, 1024 * 1024, &sd->exclude,
			  &sd->exclude_len) < 0) {
		sd->exclude = NULL;
		sbx_error_clear();
	}
	free(path);
}

static int carried_cmp(const void *a, const void *b)
{
	return strcmp(((const struct carried *)a)->path,
		      ((const struct carried *)b)->path);
}

/* sd->carry is sorted by path (capture_changes). */
struct carried *cli_seed_carried_find(struct cli_seed *sd, const char *path)
{
	struct carried key = { .path = (char *)path };

	return bsearch(&key, sd->carry, sd->ncarry, sizeof(*sd->carry),
		       carried_cmp);
}


static const char *status_path(const git_status_entry *e)
{
	if (e->index_to_workdir)
		return e->index_to_workdir->new_file.path;
	if (e->head_to_index)
		return e->head_to_index->new_file.path;
	return NULL;
}

/*
 * --carry-changes: what `git status` reports now (staged, unstaged,
 * untracked and not ignored; submodules excluded), as the local provider
 * carries it.  Staged entries are copied from the source index.
 */
static int capture_changes(struct cli_seed *sd)
{
	git_status_options so = GIT_STATUS_OPTIONS_INIT;
	git_status_list *sl = NULL;
	git_index *idx = NULL;
	size_t n;
	int rc;

	so.show = GIT_STATUS_SHOW_INDEX_AND_WORKDIR;
	so.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED |
		   GIT_STATUS_OPT_RECURSE_UNTRACKED_DIRS |
		   GIT_STATUS_OPT_EXCLUDE_SUBMODULES;
	rc = git_status_list_new(&sl, sd->repo, &so);
	if (rc < 0)
		return sbx_git_fail(rc, "cannot compute the status of %s",
				    sd->workdir);
	rc = git_repository_index(&idx, sd->repo);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot read the index of %s",
				  sd->workdir);
		goto out;
	}
	n = git_status_list_entrycount(sl);
	sd->carry = sbx_xcalloc(n + 1, sizeof(*sd->carry));
	for (size_t i = 0; i < n; i++) {
		const git_status_entry *e = git_status_byindex(sl, i);
		const char *path = status_path(e);
		struct carried *c;

		if (!path || e->status == GIT_STATUS_CURRENT ||
		    (e->status & GIT_STATUS_IGNORED))
			continue;
		c = &sd->carry[sd->ncarry++];
		c->path = sbx_xstrdup(path);
		c->status = e->status;
		if (e->status &
		    (GIT_STATUS_INDEX_NEW | GIT_STATUS_INDEX_MODIFIED |
		     GIT_STATUS_INDEX_TYPECHANGE)) {
			const git_index_entry *ie =
				git_index_get_bypath(idx, path, 0);

			if (ie) {
				c->entry = *ie;
				c->entry.path = c->path;
				c->staged = true;
			}
		}
	}
	/* Sorted for carried_find(); entry.path follows its string. */
	qsort(sd->carry, sd->ncarry, sizeof(*sd->carry), carried_cmp);
	for (size_t i = 0; i < sd->ncarry; i++)
		sd->carry[i].entry.path = sd->carry[i].path;
	rc = 0;
out:
	git_index_free(idx);
	git_status_list_free(sl);
	return rc;
}

/* ---- the pack ------------------------------------------------------------ */

static bool oid_in(const git_oid *set, size_t n, const git_oid *id)
{
	for (size_t i = 0; i < n; i++)
		if (git_oid_equal(&set[i], id))
			return true;
	return false;
}

/*
 * --depth N: the commits within N-1 parent steps of the start (breadth
 * first, so each at its shortest distance), each with its tree; the
 * shallow boundary is every included commit with a parent left out.
 */
static int insert_shallow(struct cli_seed *sd, git_repository *repo,
			  git_packbuilder *pb)
{
	git_oid *level = sbx_xmalloc(sizeof(git_oid)), *next = NULL;
	git_oid *all = NULL;
	size_t nlevel = 1, nnext = 0, nall = 0, cap = 0;
	int rc = 0;

	git_oid_cpy(&level[0], &sd->start);
	for (int d = 0; d < sd->depth && nlevel && rc == 0; d++) {
		nnext = 0;
		free(next);
		next = NULL;
		for (size_t i = 0; i < nlevel && rc == 0; i++) {
			git_commit *c = NULL;

			if (oid_in(all, nall, &level[i]))
				continue;
			all = sbx_xrealloc(all, (nall + 1) * sizeof(*all));
			git_oid_cpy(&all[nall++], &level[i]);
			rc = git_packbuilder_insert_commit(pb, &level[i]);
			if (rc == 0)
				rc = git_commit_lookup(&c, repo, &level[i]);
			if (rc < 0) {
				rc = sbx_git_fail(rc, "cannot pack commit %s",
						  git_oid_tostr_s(&level[i]));
				break;
			}
			for (unsigned p = 0; p < git_commit_parentcount(c);
			     p++) {
				if (nnext == cap || !next) {
					cap = cap ? 2 * cap : 16;
					next = sbx_xrealloc(
						next, cap * sizeof(*next));
				}
				git_oid_cpy(&next[nnext++],
					    git_commit_parent_id(c, p));
			}
			git_commit_free(c);
		}
		free(level);
		level = next;
		nlevel = nnext;
		next = NULL;
		cap = 0;
	}
	/* The boundary: included commits with a parent not included. */
	for (size_t i = 0; i < nall && rc == 0; i++) {
		git_commit *c = NULL;

		rc = git_commit_lookup(&c, repo, &all[i]);
		if (rc < 0) {
			rc = sbx_git_fail(rc, "cannot read commit %s",
					  git_oid_tostr_s(&all[i]));
			break;
		}
		for (unsigned p = 0; p < git_commit_parentcount(c); p++) {
			if (!oid_in(all, nall, git_commit_parent_id(c, p))) {
				sd->shallow = sbx_xrealloc(
					sd->shallow,
					(sd->nshallow + 1) * sizeof(git_oid));
				git_oid_cpy(&sd->shallow[sd->nshallow++],
					    &all[i]);
				break;
			}
		}
		git_commit_free(c);
	}
	free(level);
	free(next);
	free(all);
	return rc;
}

/* Every object reachable from `start` (git rev-list --objects). */
static int walk_tree(git_repository *repo, const git_oid *id,
		     struct cli_oidset *set)
{
	git_tree *t = NULL;
	int rc;

	if (cli_oidset_has(set, id))
		return 0;
	cli_oidset_add(set, id);
	rc = git_tree_lookup(&t, repo, id);
	if (rc < 0)
		return sbx_git_fail(rc, "cannot read tree %s",
				    git_oid_tostr_s(id));
	for (size_t i = 0; rc == 0 && i < git_tree_entrycount(t); i++) {
		const git_tree_entry *e = git_tree_entry_byindex(t, i);

		switch (git_tree_entry_type(e)) {
		case GIT_OBJECT_TREE:
			rc = walk_tree(repo, git_tree_entry_id(e), set);
			break;
		case GIT_OBJECT_BLOB:
			cli_oidset_add(set, git_tree_entry_id(e));
			break;
		default: /* a submodule's commit: not ours */
			break;
		}
	}
	git_tree_free(t);
	return rc;
}

static int reachable(git_repository *repo, const git_oid *start,
		     struct cli_oidset *set)
{
	git_revwalk *w = NULL;
	git_oid c;
	int rc;

	rc = git_revwalk_new(&w, repo);
	if (rc == 0)
		rc = git_revwalk_push(w, start);
	while (rc == 0 && (rc = git_revwalk_next(&c, w)) == 0) {
		git_commit *commit = NULL;

		cli_oidset_add(set, &c);
		rc = git_commit_lookup(&commit, repo, &c);
		if (rc == 0)
			rc = walk_tree(repo, git_commit_tree_id(commit), set);
		git_commit_free(commit);
	}
	git_revwalk_free(w);
	if (rc == GIT_ITEROVER)
		return 0;
	if (rc < 0 && sbx_error_last()->klass != SBX_ERR_GIT)
		rc = sbx_git_fail(rc, "cannot walk the history of %s",
				  git_oid_tostr_s(start));
	return rc;
}

/*
 * Full history: the repository's own packs that hold any needed object
 * go as they are (as a local clone hardlinks them: no compression, no
 * delta search; a local sandbox sees the whole repository too), and only
 * what is in none of them (loose objects: recent commits) is packed
 * here.  *left_out gets those, *nleft_out of them.
 */
static int reuse_packs(struct cli_seed *sd, git_repository *repo,
		       const struct cli_oidset *need, git_oid **left_out,
		       size_t *nleft_out)
{
	struct cli_oidset covered = { 0 };
	char *dir = sbx_xasprintf("%sobjects/pack",
				  git_repository_commondir(repo));
	struct dirent *e;
	DIR *d = opendir(dir);
	size_t nleft = 0;
	git_oid *left;

	while (d && (e = readdir(d))) {
		size_t n = strlen(e->d_name), nids = 0, hits = 0;
		char *path, *data = NULL;
		git_oid *ids = NULL;
		size_t len = 0;

		if (n < 10 || strncmp(e->d_name, "pack-", 5) ||
		    strcmp(e->d_name + n - 4, ".idx"))
			continue;
		path = sbx_xasprintf("%s/%s", dir, e->d_name);
		if (sbx_file_read(path, (size_t)1 << 31, &data, &len) == 0 &&
		    cli_idx_oids(&ids, &nids, (unsigned char *)data, len) ==
			    0) {
			for (size_t i = 0; i < nids; i++)
				hits += cli_oidset_has(need, &ids[i]);
		}
		sbx_error_clear();
		if (hits) {
			char *pack = sbx_xasprintf("%.*s.pack",
						   (int)(strlen(path) - 4),
						   path);

			if (access(pack, R_OK) == 0) {
				for (size_t i = 0; i < nids; i++)
					cli_oidset_add(&covered, &ids[i]);
				sd->reuse = sbx_xrealloc(
					sd->reuse,
					(sd->nreuse + 1) * sizeof(char *));
				sd->reuse[sd->nreuse++] = sbx_xstrndup(
					path, strlen(path) - 4);
			}
			free(pack);
		}
		free(ids);
		free(data);
		free(path);
	}
	if (d)
		closedir(d);
	free(dir);
	left = sbx_xcalloc(need->n + 1, sizeof(git_oid));
	for (size_t i = 0; i < need->cap; i++)
		if (need->used[i] && !cli_oidset_has(&covered, &need->slots[i]))
			git_oid_cpy(&left[nleft++], &need->slots[i]);
	cli_oidset_fini(&covered);
	*left_out = left;
	*nleft_out = nleft;
	return 0;
}

static void *pack_main(void *arg)
{
	struct cli_seed *sd = arg;
	git_repository *repo = NULL;
	git_packbuilder *pb = NULL;
	struct cli_oidset need = { 0 };
	git_oid *left = NULL;
	size_t nleft = 0;
	int rc;

	/* Its own handle: libgit2 objects are not shared across threads. */
	rc = git_repository_open(&repo, sd->repo_path);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot open %s", sd->repo_path);
		goto out;
	}
	rc = git_packbuilder_new(&pb, repo);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot start a pack");
		goto out;
	}
	git_packbuilder_set_threads(pb, 0);
	if (sd->depth > 0)
		rc = insert_shallow(sd, repo, pb);
	else
		rc = reachable(repo, &sd->start, &need);
	/* Blobs staged in the checkout, for the carried index entries. */
	for (size_t i = 0; rc == 0 && i < sd->ncarry; i++) {
		const git_index_entry *e = &sd->carry[i].entry;

		if (!sd->carry[i].staged || IS_GITLINK(e->mode))
			continue;
		if (sd->depth > 0)
			rc = git_packbuilder_insert(pb, &e->id, e->path);
		else
			cli_oidset_add(&need, &e->id);
		if (rc < 0)
			rc = sbx_git_fail(rc, "cannot pack the staged %s",
					  e->path);
	}
	if (rc == 0 && sd->depth == 0) {
		rc = reuse_packs(sd, repo, &need, &left, &nleft);
		sd->pack_objects = need.n;
		for (size_t i = 0; rc == 0 && i < nleft; i++) {
			rc = git_packbuilder_insert(pb, &left[i], NULL);
			if (rc < 0)
				rc = sbx_git_fail(rc, "cannot pack %s",
						  git_oid_tostr_s(&left[i]));
		}
		if (rc == 0 && nleft == 0)
			goto out; /* the repository's packs hold it all */
	}
	if (rc < 0)
		goto out;
	rc = git_packbuilder_write(pb, sd->tmpdir, 0644, NULL, NULL);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot write the pack");
		goto out;
	}
	sd->pack_name = sbx_xasprintf("pack-%s", git_packbuilder_name(pb));
	if (sd->depth > 0)
		sd->pack_objects = git_packbuilder_object_count(pb);
	rc = 0;
out:
	if (rc < 0)
		sd->pack_err = *sbx_error_last();
	sd->pack_rc = rc;
	free(left);
	cli_oidset_fini(&need);
	git_packbuilder_free(pb);
	git_repository_free(repo);
	atomic_store(&sd->pack_done, true);
	return NULL;
}

int cli_seed_pack_wait(struct cli_seed *sd)
{
	if (sd->pack_started && !sd->pack_joined) {
		pthread_join(sd->pack_thread, NULL);
		sd->pack_joined = true;
	}
	if (sd->pack_rc < 0)
		return sbx_error_setd(sd->pack_err.klass, sd->pack_err.code,
				      sd->pack_err.detail, "%s",
				      sd->pack_err.msg);
	return 0;
}

int cli_seed_prepare(struct cli_seed **out, const struct cli_seed_opts *o)
{
	struct cli_seed *sd = sbx_xcalloc(1, sizeof(*sd));
	char *base = NULL;
	int rc;

	*out = NULL;
	git_libgit2_init();
	sd->session = sbx_xstrdup(o->session);
	sd->branch = sbx_xasprintf(CLI_BRANCH_PREFIX "%s", o->session);
	sd->depth = o->depth;
	sd->progress = o->progress;
	sd->carry_on = o->carry;
	rc = open_repo(sd, o->repo);
	if (rc == 0)
		rc = start_point(sd, o->ref);
	if (rc == 0 && o->carry)
		rc = capture_changes(sd);
	if (rc < 0)
		goto fail;
	copy_settings(sd);
	rc = sbx_paths_subdir(&base, "tmp");
	if (rc < 0)
		goto fail;
	sd->tmpdir = sbx_xasprintf("%s/seed-%s-XXXXXX", base, o->session);
	free(base);
	if (!mkdtemp(sd->tmpdir)) {
		rc = sbx_error_os("create a temporary directory %s",
				  sd->tmpdir);
		free(sd->tmpdir);
		sd->tmpdir = NULL;
		goto fail;
	}
	rc = pthread_create(&sd->pack_thread, NULL, pack_main, sd);
	if (rc) {
		rc = sbx_error_set(SBX_ERR_OS, -rc, "cannot start a thread");
		goto fail;
	}
	sd->pack_started = true;
	*out = sd;
	return 0;
fail:
	cli_seed_free(sd);
	return rc;
}

static void rm_tmp(const char *dir)
{
	struct dirent *e;
	DIR *d = opendir(dir);

	if (d) {
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			unlinkat(dirfd(d), e->d_name, 0);
		}
		closedir(d);
	}
	rmdir(dir);
}

void cli_seed_free(struct cli_seed *sd)
{
	if (!sd)
		return;
	if (sd->pack_started && !sd->pack_joined)
		pthread_join(sd->pack_thread, NULL);
	if (sd->tmpdir)
		rm_tmp(sd->tmpdir);
	for (size_t i = 0; i < sd->ncarry; i++)
		free(sd->carry[i].path);
	free(sd->carry);
	free(sd->shallow);
	for (size_t i = 0; i < sd->nreuse; i++)
		free(sd->reuse[i]);
	free(sd->reuse);
	free(sd->pack_name);
	free(sd->tmpdir);
	free(sd->exclude);
	free(sd->user_name);
	free(sd->user_email);
	git_repository_free(sd->repo);
	free(sd->repo_path);
	free(sd->workdir);
	free(sd->branch);
	free(sd->session);
	free(sd);
	git_libgit2_shutdown();
}
