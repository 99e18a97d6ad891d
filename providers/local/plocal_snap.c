/*
 * The local provider's snapshots and restore: a snapshot is a commit of
 * the worktree's state (index and files, untracked included) under
 * refs/sbx/snapshots/NAME/<id>; a restore first saves the current state
 * as one.  See plocal_git_i.h.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <git2.h>
#include <git2/sys/repository.h>

#include "sbx/error.h"
#include "sbx/xmalloc.h"
#include "sbx/gitsource.h"
#include "plocal_git_i.h"

#define SNAP_DEFAULT_MSG "sbx snapshot"

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
		rc = sbx_git_fail(rc, "cannot list snapshots of %s",
				  session);
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
		if ((rc = plocal_copy_fd(in, out, tmp)) < 0)
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
		rc = sbx_git_fail(rc, "cannot make a private index");
		goto out;
	}
	/* Owned by the repository from here; our reference stays ours. */
	if ((rc = git_repository_set_index(repo, idx)) < 0) {
		rc = sbx_git_fail(rc, "cannot install a private index");
		goto out;
	}
	if (!have_copy && head) {
		if ((rc = git_commit_tree(&tree, head)) < 0 ||
		    (rc = git_index_read_tree(idx, tree)) < 0) {
			rc = sbx_git_fail(rc, "cannot read the HEAD tree");
			goto out;
		}
	}
	if ((rc = git_index_add_all(idx, NULL, GIT_INDEX_ADD_DEFAULT, NULL,
				    NULL)) < 0 ||
	    (rc = git_index_update_all(idx, NULL, NULL, NULL)) < 0) {
		rc = sbx_git_fail(rc, "cannot record the working tree of %s",
				  git_repository_workdir(repo));
		goto out;
	}
	if ((rc = git_index_write_tree_to(tree_out, idx, repo)) < 0)
		rc = sbx_git_fail(rc, "cannot write the snapshot tree");
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
		rc = sbx_git_fail(rc, "cannot resolve HEAD of sandbox %s",
				  session);
		goto out;
	}
	if ((rc = state_tree(&tree_oid, repo, head)) < 0)
		goto out;
	if ((rc = git_tree_lookup(&tree, repo, &tree_oid)) < 0) {
		rc = sbx_git_fail(rc, "cannot read the snapshot tree");
		goto out;
	}
	if ((rc = plocal_signature(&sig, repo)) < 0)
		goto out;
	if (!message || !*message)
		message = SNAP_DEFAULT_MSG;
	msg = sbx_xasprintf("%s%s", message,
			    message[strlen(message) - 1] == '\n' ? "" : "\n");
	parents[0] = head;
	rc = git_commit_create(&commit_oid, repo, NULL, sig, sig, NULL, msg,
			       tree, head ? 1 : 0, parents);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot write the snapshot commit");
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
		rc = sbx_git_fail(rc, "cannot create snapshot ref %s", name);
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
	plocal_lg_init();
	if ((rc = plocal_open_session(lp, session, &repo, NULL)) < 0)
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
	plocal_lg_init();
	if ((rc = plocal_open_session(lp, session, &repo, NULL)) < 0)
		return rc;
	glob = sbx_xasprintf(SNAP_PREFIX "%s/*", session);
	plen = strlen(glob) - 1;
	if ((rc = git_reference_iterator_glob_new(&it, repo, glob)) < 0) {
		rc = sbx_git_fail(rc, "cannot list snapshots of %s",
				  session);
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
		rc = sbx_git_fail(rc, "cannot list snapshots of %s",
				  session);
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
	plocal_lg_init();
	if ((rc = plocal_open_session(lp, session, &repo, &path)) < 0)
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
			rc = sbx_git_fail(rc, "cannot read snapshot %s",
					  name);
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
		rc = sbx_error_prefix(rc,
				      "restore %s: saving the current state "
				      "first failed, nothing was changed", id);
		goto out;
	}
	if ((rc = git_tree_lookup(&cur_tree, repo, &cur_oid)) < 0) {
		rc = sbx_git_fail(rc, "cannot read the current state tree");
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
		rc = sbx_git_fail(rc, "restore %s: checkout failed (the "
				  "state before it is snapshot %s)", id,
				  saved);
		goto out;
	}

	/* The real index back to HEAD's tree, keeping stat data of entries
	 * that already match (git_reset_default only rewrites the others). */
	if ((rc = plocal_open_worktree_repo(&fresh, path)) < 0)
		goto out;
	rc = git_revparse_single(&head, fresh, "HEAD^{commit}");
	if (rc == GIT_ENOTFOUND) {
		git_error_clear();
		head = NULL; /* orphan: empty index */
	} else if (rc < 0) {
		rc = sbx_git_fail(rc, "cannot resolve HEAD of %s", path);
		goto out;
	}
	rc = git_reset_default(fresh, head, &all);
	if (rc < 0) {
		rc = sbx_git_fail(rc, "restore %s: the files are restored, "
				  "but the index could not be reset to "
				  "HEAD", id);
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

