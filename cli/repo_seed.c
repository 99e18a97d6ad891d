/*
 * Seeding a sandbox with a repository (repo_i.h; docs/design.md,
 * "Repository in and out").
 *
 * cli_seed_prepare() checks everything that can be checked before the
 * sandbox exists and starts the pack builder (git_packbuilder over the
 * start commit's history, written with its .idx into a temporary
 * directory), so the pack is built while the provider creates the
 * sandbox.  cli_seed_send() then streams one tar, in one request:
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
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <git2.h>

#include "sbx/gitsource.h"
#include "sbx/buf.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "repo_i.h"

/* ---- libgit2 errors ------------------------------------------------------ */

int cli_git_fail(int gitrc, const char *fmt, ...)
{
	const git_error *e = git_error_last();
	char what[256];
	va_list ap;
	int rc;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	switch (gitrc) {
	case GIT_ENOTFOUND:
	case GIT_EUNBORNBRANCH:
		rc = -ENOENT;
		break;
	case GIT_EEXISTS:
		rc = -EEXIST;
		break;
	case GIT_EAMBIGUOUS:
	case GIT_EINVALIDSPEC:
	case GIT_EINVALID:
	case GIT_EPEEL:
	case GIT_EBAREREPO:
		rc = -EINVAL;
		break;
	case GIT_ELOCKED:
	case GIT_EMODIFIED:
		rc = -EBUSY;
		break;
	default:
		rc = -EIO;
	}
	return sbx_error_setd(SBX_ERR_GIT, rc, gitrc, "%s: %s", what,
			      e && e->message ? e->message
					      : "unknown libgit2 error");
}

/* A submodule entry (mode 160000). */
#define IS_GITLINK(m) (((m) & 0170000) == 0160000)

/* ---- state --------------------------------------------------------------- */

/* One path that --carry-changes brings along. */
struct carried {
	char *path;
	unsigned status;      /* git_status_t bits */
	bool staged;          /* the source index has an entry to copy */
	git_index_entry entry; /* that entry (path points to `path`) */
};

struct cli_seed {
	char *session;
	char *branch;         /* "sbx/NAME" */
	char *workdir;        /* the source's working directory, no '/' */
	char *repo_path;      /* what git_repository_open takes */
	git_repository *repo;
	git_oid start;
	bool continued;       /* started from an existing sbx/NAME */
	int depth;
	bool progress;
	char *user_name, *user_email;
	char *exclude;        /* info/exclude, or NULL */
	size_t exclude_len;
	struct carried *carry;
	size_t ncarry;
	bool carry_on;

	/* the pack builder (its own thread and repository handle) */
	char *tmpdir;
	pthread_t pack_thread;
	bool pack_started, pack_joined;
	atomic_bool pack_done;   /* set by the pack thread as it ends */
	int pack_rc;
	struct sbx_error pack_err;
	char *pack_name;      /* "pack-<hex>" built here, or NULL */
	size_t pack_objects;
	char **reuse;         /* the repository's packs sent as they are:
			       * paths without ".pack" */
	size_t nreuse;
	git_oid *shallow;
	size_t nshallow;
};

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

/* The start point, by the local provider's rules (docs/providers.md). */
static int start_point(struct cli_seed *sd, const char *ref)
{
	git_reference *branch = NULL;
	git_object *obj = NULL, *peeled = NULL;
	char *refname = sbx_xasprintf("refs/heads/%s", sd->branch);
	int rc, valid = 0;

	if (git_reference_name_is_valid(&valid, refname) < 0 || !valid) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "session name %s cannot be a git branch "
				   "name (%s); avoid \"..\" and a \".lock\" "
				   "suffix",
				   sd->session, sd->branch);
		goto out;
	}
	rc = git_branch_lookup(&branch, sd->repo, sd->branch,
			       GIT_BRANCH_LOCAL);
	if (rc == 0 && ref) {
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "branch %s already exists in %s (kept from "
				   "an earlier session); run without --ref to "
				   "continue it, or delete it with `git branch "
				   "-D %s`",
				   sd->branch, sd->workdir, sd->branch);
		goto out;
	}
	if (rc == 0) {
		rc = git_reference_peel(&peeled, branch, GIT_OBJECT_COMMIT);
		if (rc < 0) {
			rc = cli_git_fail(rc, "branch %s", sd->branch);
			goto out;
		}
		git_oid_cpy(&sd->start, git_object_id(peeled));
		sd->continued = true;
		goto out;
	}
	if (rc != GIT_ENOTFOUND) {
		rc = cli_git_fail(rc, "cannot look up branch %s", sd->branch);
		goto out;
	}
	git_error_clear();
	if (!ref) {
		if (git_repository_head_unborn(sd->repo) == 1) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "the repository at %s has no "
					   "commits yet (HEAD is unborn); "
					   "commit something first or pass "
					   "--ref REV",
					   sd->workdir);
			goto out;
		}
		ref = "HEAD";
	}
	rc = git_revparse_single(&obj, sd->repo, ref);
	if (rc == GIT_ENOTFOUND || rc == GIT_EINVALIDSPEC ||
	    rc == GIT_EAMBIGUOUS) {
		rc = sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, rc,
				    "--ref %s: no such revision in %s (%s)",
				    ref, sd->workdir,
				    git_error_last() ? git_error_last()->message
						     : "not found");
		goto out;
	}
	if (rc < 0) {
		rc = cli_git_fail(rc, "cannot resolve %s in %s", ref,
				  sd->workdir);
		goto out;
	}
	rc = git_object_peel(&peeled, obj, GIT_OBJECT_COMMIT);
	if (rc < 0) {
		rc = sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, rc,
				    "--ref %s does not name a commit", ref);
		goto out;
	}
	git_oid_cpy(&sd->start, git_object_id(peeled));
	rc = 0;
out:
	git_object_free(peeled);
	git_object_free(obj);
	git_reference_free(branch);
	free(refname);
	return rc < 0 ? rc : 0;
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
		return cli_git_fail(rc, "cannot compute the status of %s",
				    sd->workdir);
	rc = git_repository_index(&idx, sd->repo);
	if (rc < 0) {
		rc = cli_git_fail(rc, "cannot read the index of %s",
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
				rc = cli_git_fail(rc, "cannot pack commit %s",
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
			rc = cli_git_fail(rc, "cannot read commit %s",
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
		return cli_git_fail(rc, "cannot read tree %s",
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
		rc = cli_git_fail(rc, "cannot walk the history of %s",
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
		rc = cli_git_fail(rc, "cannot open %s", sd->repo_path);
		goto out;
	}
	rc = git_packbuilder_new(&pb, repo);
	if (rc < 0) {
		rc = cli_git_fail(rc, "cannot start a pack");
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
			rc = cli_git_fail(rc, "cannot pack the staged %s",
					  e->path);
	}
	if (rc == 0 && sd->depth == 0) {
		rc = reuse_packs(sd, repo, &need, &left, &nleft);
		sd->pack_objects = need.n;
		for (size_t i = 0; rc == 0 && i < nleft; i++) {
			rc = git_packbuilder_insert(pb, &left[i], NULL);
			if (rc < 0)
				rc = cli_git_fail(rc, "cannot pack %s",
						  git_oid_tostr_s(&left[i]));
		}
		if (rc == 0 && nleft == 0)
			goto out; /* the repository's packs hold it all */
	}
	if (rc < 0)
		goto out;
	rc = git_packbuilder_write(pb, sd->tmpdir, 0644, NULL, NULL);
	if (rc < 0) {
		rc = cli_git_fail(rc, "cannot write the pack");
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

static int pack_wait(struct cli_seed *sd)
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

/* ---- the stream ---------------------------------------------------------- */

struct producer {
	struct cli_seed *sd;
	struct cli_tar tar;
	int rc;
	struct sbx_error err;
	int64_t now;
	uint64_t files, total;
	struct timespec start, last;
	bool printed;
};

static double since(const struct timespec *a)
{
	struct timespec b;

	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(b.tv_sec - a->tv_sec) +
	       (double)(b.tv_nsec - a->tv_nsec) / 1e9;
}

static int progress(uint64_t written, void *payload)
{
	struct producer *p = payload;

	if (!p->sd->progress || since(&p->last) < 0.2)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &p->last);
	if (p->total > written)
		fprintf(stderr, "\rsbx: seeding %s: %.1f of ~%.1f MiB, %llu "
				"files ",
			p->sd->session, (double)written / 1048576.0,
			(double)p->total / 1048576.0,
			(unsigned long long)p->files);
	else
		fprintf(stderr, "\rsbx: seeding %s: %.1f MiB, %llu files ",
			p->sd->session, (double)written / 1048576.0,
			(unsigned long long)p->files);
	p->printed = true;
	return 0;
}

/* sd->carry is sorted by path (capture_changes). */
static struct carried *carried_find(struct cli_seed *sd, const char *path)
{
	struct carried key = { .path = (char *)path };

	return bsearch(&key, sd->carry, sd->ncarry, sizeof(*sd->carry),
		       carried_cmp);
}

#define WT_CHANGED                                                       \
	(GIT_STATUS_WT_MODIFIED | GIT_STATUS_WT_DELETED |                  \
	 GIT_STATUS_WT_TYPECHANGE | GIT_STATUS_WT_NEW)

/*
 * The new index: the start commit's tree, then the carried staged state
 * (entries added or replaced, staged deletions removed) with mtime 1 s
 * for paths whose working file differs from the staged blob.
 */
static int build_index(struct cli_seed *sd, git_index **out)
{
	git_commit *c = NULL;
	git_tree *tree = NULL;
	git_index *idx = NULL;
	char *path = sbx_xasprintf("%s/index", sd->tmpdir);
	int rc;

	*out = NULL;
	rc = git_index_open(&idx, path);
	if (rc == 0)
		rc = git_commit_lookup(&c, sd->repo, &sd->start);
	if (rc == 0)
		rc = git_commit_tree(&tree, c);
	if (rc == 0)
		rc = git_index_read_tree(idx, tree);
	if (rc < 0) {
		rc = cli_git_fail(rc, "cannot build the index");
		goto out;
	}
	for (size_t i = 0; i < sd->ncarry; i++) {
		struct carried *k = &sd->carry[i];
		const git_index_entry *cur;
		git_index_entry e;

		if (k->status & GIT_STATUS_INDEX_DELETED) {
			rc = git_index_remove_bypath(idx, k->path);
		} else if (k->staged) {
			e = k->entry;
			memset(&e.ctime, 0, sizeof(e.ctime));
			memset(&e.mtime, 0, sizeof(e.mtime));
			e.dev = e.ino = e.uid = e.gid = 0;
			e.file_size = 0;
			if (k->status & WT_CHANGED)
				e.mtime.seconds = 1;
			rc = git_index_add(idx, &e);
		} else if ((k->status & WT_CHANGED) &&
			   (cur = git_index_get_bypath(idx, k->path, 0))) {
			/* Unstaged: the entry stays, marked "look again". */
			e = *cur;
			e.mtime.seconds = 1;
			rc = git_index_add(idx, &e);
		} else {
			rc = 0;
		}
		if (rc < 0) {
			rc = cli_git_fail(rc, "cannot stage %s in the new "
					  "index", k->path);
			goto out;
		}
	}
	*out = idx;
	idx = NULL;
	rc = 0;
out:
	git_index_free(idx);
	git_tree_free(tree);
	git_commit_free(c);
	free(path);
	return rc;
}

/* Does the repository ask for checkout filters (attributes, CRLF)? */
static bool needs_filters(struct cli_seed *sd, git_index *idx)
{
	git_config *cfg = NULL;
	const char *v = NULL;
	bool yes = false;

	for (size_t i = 0; i < git_index_entrycount(idx); i++) {
		const char *p = git_index_get_byindex(idx, i)->path;
		const char *b = strrchr(p, '/');

		if (!strcmp(b ? b + 1 : p, ".gitattributes"))
			return true;
	}
	if (git_repository_config_snapshot(&cfg, sd->repo) == 0) {
		if ((git_config_get_string(&v, cfg, "core.autocrlf") == 0 &&
		     strcmp(v, "false") != 0) ||
		    git_config_get_string(&v, cfg, "core.eol") == 0)
			yes = true;
		git_config_free(cfg);
	}
	git_error_clear();
	return yes;
}

/* A file of the checkout (--carry-changes), as it is on disk now. */
static int send_disk(struct producer *p, const char *path)
{
	char *full = sbx_xasprintf("%s/%s", p->sd->workdir, path);
	struct stat st;
	int fd = -1, rc = 0;

	if (lstat(full, &st) < 0) {
		rc = errno == ENOENT ? 0 : sbx_error_os("carry %s", full);
		goto out;
	}
	if (S_ISLNK(st.st_mode)) {
		char target[4096];
		ssize_t n = readlink(full, target, sizeof(target) - 1);

		if (n < 0) {
			rc = sbx_error_os("carry %s", full);
			goto out;
		}
		target[n] = '\0';
		rc = cli_tar_symlink(&p->tar, path, target, p->now);
	} else if (S_ISREG(st.st_mode)) {
		fd = open(full, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0 || fstat(fd, &st) < 0) {
			rc = sbx_error_os("carry %s", full);
			goto out;
		}
		rc = cli_tar_file_fd(&p->tar, path, st.st_mode & 07777, p->now,
				     fd, (uint64_t)st.st_size);
	} else if (S_ISDIR(st.st_mode)) {
		rc = cli_tar_dir(&p->tar, path, 0755, p->now);
	}
	p->files++;
out:
	if (fd >= 0)
		close(fd);
	free(full);
	return rc;
}

/* An index entry's file from its blob. */
static int send_blob(struct producer *p, const git_index_entry *e,
		     bool filters)
{
	git_blob *blob = NULL;
	git_buf buf = GIT_BUF_INIT;
	const void *data;
	size_t len;
	int rc;

	rc = git_blob_lookup(&blob, p->sd->repo, &e->id);
	if (rc < 0)
		return cli_git_fail(rc, "cannot read the blob of %s",
				    e->path);
	if (S_ISLNK(e->mode)) {
		char *target = sbx_xstrndup(git_blob_rawcontent(blob),
					    (size_t)git_blob_rawsize(blob));

		rc = cli_tar_symlink(&p->tar, e->path, target, p->now);
		free(target);
		goto out;
	}
	data = git_blob_rawcontent(blob);
	len = (size_t)git_blob_rawsize(blob);
	if (filters) {
		git_blob_filter_options fo = GIT_BLOB_FILTER_OPTIONS_INIT;

		fo.flags = GIT_BLOB_FILTER_CHECK_FOR_BINARY |
			   GIT_BLOB_FILTER_ATTRIBUTES_FROM_COMMIT;
		git_oid_cpy(&fo.attr_commit_id, &p->sd->start);
		rc = git_blob_filter(&buf, blob, e->path, &fo);
		if (rc < 0) {
			rc = cli_git_fail(rc, "cannot filter %s", e->path);
			goto out;
		}
		data = buf.ptr;
		len = buf.size;
	}
	rc = cli_tar_file(&p->tar, e->path,
			  (e->mode & 0111) ? 0755 : 0644, p->now, data, len);
out:
	p->files++;
	git_buf_dispose(&buf);
	git_blob_free(blob);
	return rc;
}

static int send_file_at(struct producer *p, const char *name,
			const char *path, unsigned mode)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC), rc;

	if (fd < 0 || fstat(fd, &st) < 0) {
		rc = sbx_error_os("open %s", path);
		if (fd >= 0)
			close(fd);
		return rc;
	}
	rc = cli_tar_file_fd(&p->tar, name, mode, p->now, fd,
			     (uint64_t)st.st_size);
	close(fd);
	return rc;
}

/* A git config value, quoted. */
static void cfg_value(struct sbx_buf *b, const char *v)
{
	int rc = sbx_buf_adds(b, "\"");

	for (; rc == 0 && *v; v++) {
		if (*v == '"' || *v == '\\')
			rc = sbx_buf_addf(b, "\\%c", *v);
		else if (*v == '\n')
			rc = sbx_buf_adds(b, "\\n");
		else
			rc = sbx_buf_add(b, v, 1);
	}
	if (rc == 0)
		rc = sbx_buf_adds(b, "\"\n");
	if (rc < 0)
		abort();
}

static int send_git_dir(struct producer *p, git_index *idx)
{
	struct cli_seed *sd = p->sd;
	char oid[GIT_OID_HEXSZ + 1], *text, *name, *path;
	struct sbx_buf b;
	int rc;

	/* HEAD, the branch, the directories git looks for. */
	text = sbx_xasprintf("ref: refs/heads/%s\n", sd->branch);
	rc = cli_tar_file(&p->tar, ".git/HEAD", 0644, p->now, text,
			  strlen(text));
	free(text);
	git_oid_tostr(oid, sizeof(oid), &sd->start);
	name = sbx_xasprintf(".git/refs/heads/%s", sd->branch);
	text = sbx_xasprintf("%s\n", oid);
	if (rc == 0)
		rc = cli_tar_file(&p->tar, name, 0644, p->now, text,
				  strlen(text));
	free(name);
	free(text);
	if (rc == 0)
		rc = cli_tar_dir(&p->tar, ".git/refs/tags", 0755, p->now);
	if (rc == 0)
		rc = cli_tar_dir(&p->tar, ".git/objects/info", 0755, p->now);
	if (rc == 0)
		rc = cli_tar_dir(&p->tar, ".git/info", 0755, p->now);

	/* config */
	sbx_buf_init(&b, 1024 * 1024);
	if (sbx_buf_adds(&b, "[core]\n\trepositoryformatversion = 0\n"
			     "\tfilemode = true\n\tbare = false\n"
			     "\tlogallrefupdates = true\n") < 0)
		abort();
	if (sd->user_name || sd->user_email) {
		if (sbx_buf_adds(&b, "[user]\n") < 0)
			abort();
		if (sd->user_name) {
			if (sbx_buf_adds(&b, "\tname = ") < 0)
				abort();
			cfg_value(&b, sd->user_name);
		}
		if (sd->user_email) {
			if (sbx_buf_adds(&b, "\temail = ") < 0)
				abort();
			cfg_value(&b, sd->user_email);
		}
	}
	if (rc == 0)
		rc = cli_tar_file(&p->tar, ".git/config", 0644, p->now,
				  sbx_buf_ptr(&b), sbx_buf_len(&b));
	sbx_buf_fini(&b);
	if (rc == 0 && sd->exclude)
		rc = cli_tar_file(&p->tar, ".git/info/exclude", 0644, p->now,
				  sd->exclude, sd->exclude_len);
	if (rc == 0 && sd->nshallow) {
		sbx_buf_init(&b, 64 * 1024 * 1024);
		for (size_t i = 0; i < sd->nshallow; i++) {
			git_oid_tostr(oid, sizeof(oid), &sd->shallow[i]);
			if (sbx_buf_addf(&b, "%s\n", oid) < 0)
				abort();
		}
		rc = cli_tar_file(&p->tar, ".git/shallow", 0644, p->now,
				  sbx_buf_ptr(&b), sbx_buf_len(&b));
		sbx_buf_fini(&b);
	}
	if (rc < 0)
		return rc;

	/* The pack (waits for the builder, keeping the stream alive), its
	 * .idx and a .keep that tells a later pull the sandbox got it from
	 * here. */
	for (unsigned ms = 0; !atomic_load(&sd->pack_done); ms += 100) {
		struct timespec ts = { 0, 100 * 1000000L };

		nanosleep(&ts, NULL);
		if (ms && ms % 5000 == 0) {
			rc = cli_tar_keepalive(&p->tar, "sbx: building the "
							"pack");
			if (rc < 0)
				return rc;
		}
	}
	rc = pack_wait(sd);
	if (rc < 0)
		return rc;
	git_oid_tostr(oid, sizeof(oid), &sd->start);
	text = sbx_xasprintf("sbx seed %s\n", oid);
	for (size_t k = 0; rc == 0 && k <= sd->nreuse; k++) {
		static const char *const ext[] = { "pack", "idx" };
		char *prefix = k < sd->nreuse
				       ? sbx_xstrdup(sd->reuse[k])
				       : sd->pack_name
						 ? sbx_xasprintf("%s/%s",
								 sd->tmpdir,
								 sd->pack_name)
						 : NULL;
		const char *base = prefix ? strrchr(prefix, '/') + 1 : NULL;

		for (size_t i = 0; prefix && i < 2 && rc == 0; i++) {
			name = sbx_xasprintf(".git/objects/pack/%s.%s", base,
					     ext[i]);
			path = sbx_xasprintf("%s.%s", prefix, ext[i]);
			rc = send_file_at(p, name, path, 0444);
			free(name);
			free(path);
		}
		if (prefix && rc == 0) {
			name = sbx_xasprintf(".git/objects/pack/%s.keep",
					     base);
			rc = cli_tar_file(&p->tar, name, 0644, p->now, text,
					  strlen(text));
			free(name);
		}
		free(prefix);
	}
	free(text);

	/* The index, last: the agent refreshes it after extracting. */
	if (rc == 0) {
		rc = git_index_write(idx);
		if (rc < 0)
			rc = cli_git_fail(rc, "cannot write the index");
	}
	if (rc == 0) {
		path = sbx_xasprintf("%s/index", sd->tmpdir);
		rc = send_file_at(p, ".git/index", path, 0644);
		free(path);
	}
	return rc;
}

static int write_tar(struct producer *p)
{
	struct cli_seed *sd = p->sd;
	git_index *idx = NULL;
	git_odb *odb = NULL;
	bool filters;
	int rc;

	rc = build_index(sd, &idx);
	if (rc < 0)
		return rc;
	filters = needs_filters(sd, idx);
	/* A size estimate for the progress line. */
	if (sd->progress && git_repository_odb(&odb, sd->repo) == 0) {
		for (size_t i = 0; i < git_index_entrycount(idx); i++) {
			size_t len;
			git_object_t type;

			if (git_odb_read_header(
				    &len, &type, odb,
				    &git_index_get_byindex(idx, i)->id) == 0)
				p->total += len;
		}
		git_odb_free(odb);
		git_error_clear();
	}
	/* 1. the working tree */
	for (size_t i = 0; rc == 0 && i < git_index_entrycount(idx); i++) {
		const git_index_entry *e = git_index_get_byindex(idx, i);
		struct carried *k;

		if (GIT_INDEX_ENTRY_STAGE(e) != 0)
			continue;
		if (IS_GITLINK(e->mode)) {
			rc = cli_tar_dir(&p->tar, e->path, 0755, p->now);
			continue;
		}
		k = sd->carry_on ? carried_find(sd, e->path) : NULL;
		if (k && (k->status & WT_CHANGED))
			rc = send_disk(p, e->path); /* absent: deleted */
		else
			rc = send_blob(p, e, filters);
	}
	/* untracked files of --carry-changes */
	for (size_t i = 0; rc == 0 && i < sd->ncarry; i++)
		if (sd->carry[i].status & GIT_STATUS_WT_NEW)
			rc = send_disk(p, sd->carry[i].path);
	/* 2 and 3 */
	if (rc == 0)
		rc = send_git_dir(p, idx);
	if (rc == 0)
		rc = cli_tar_end(&p->tar);
	git_index_free(idx);
	return rc;
}

static void *produce(void *arg)
{
	struct producer *p = arg;

	p->rc = write_tar(p);
	if (p->rc < 0)
		p->err = *sbx_error_last();
	/* EOF for the request body (a cut stream if we failed). */
	shutdown(p->tar.fd, SHUT_WR);
	close(p->tar.fd);
	return NULL;
}

int cli_seed_send(struct cli_seed *sd, struct sbx_sandbox *sb)
{
	struct sbx_repo_seed_result res;
	struct producer p;
	pthread_t th;
	char oid[GIT_OID_HEXSZ + 1];
	int sv[2], rc;

	if (!sb->ops->repo_seed)
		return sbx_error_set(SBX_ERR_CONFIG, -ENOSYS,
				     "this provider's sandboxes cannot receive "
				     "a repository");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		return sbx_error_os("socketpair");
	memset(&p, 0, sizeof(p));
	p.sd = sd;
	p.tar.fd = sv[0];
	p.tar.progress = progress;
	p.tar.payload = &p;
	p.now = (int64_t)time(NULL);
	clock_gettime(CLOCK_MONOTONIC, &p.start);
	p.last = p.start;
	rc = pthread_create(&th, NULL, produce, &p);
	if (rc) {
		close(sv[0]);
		close(sv[1]);
		return sbx_error_set(SBX_ERR_OS, -rc, "cannot start a thread");
	}
	rc = sb->ops->repo_seed(sb, "", sv[1], &res);
	/* The producer stops at its next write if the request failed. */
	shutdown(sv[1], SHUT_RDWR);
	close(sv[1]);
	pthread_join(th, NULL);
	if (p.printed)
		fputc('\n', stderr);
	if (p.rc < 0 && (rc == 0 || rc == -EINVAL || rc == -EPIPE ||
			 rc == -ECONNRESET || rc == -EIO))
		/* Our failure is the cause: say that, not "truncated". */
		rc = sbx_error_setd(p.err.klass, p.err.code, p.err.detail,
				    "%s", p.err.msg);
	if (rc < 0)
		return rc;
	git_oid_tostr(oid, sizeof(oid), &sd->start);
	fprintf(stderr,
		"sbx: seeded session %s with %s at %.12s on branch %s%s: "
		"%llu files, %zu objects, %.1f MiB in %.1f s\n",
		sd->session, sd->workdir, oid, sd->branch,
		sd->continued ? " (continued)" : "",
		(unsigned long long)p.files, sd->pack_objects,
		(double)p.tar.written / 1048576.0, since(&p.start));
	sbx_debug("seed %s: %llu entries, %llu bytes, index %llu/%llu "
		  "refreshed",
		  sd->session, (unsigned long long)res.entries,
		  (unsigned long long)res.bytes,
		  (unsigned long long)res.index_refreshed,
		  (unsigned long long)res.index_entries);
	return 0;
}

/* rm -r of the temporary directory (flat: pack, idx, index). */
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
