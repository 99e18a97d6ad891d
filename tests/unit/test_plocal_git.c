/*
 * Local provider control plane (providers/local/plocal_git.c) against real
 * repositories made with libgit2 in a temporary directory.  Every test gets
 * a fresh repository and $SBX_HOME and checks observable state: files on
 * disk, refs, the index, error classes.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <git2.h>

#include "sbx/error.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"
#include "providers/local/plocal_i.h"

struct fx {
	char root[256];      /* temp dir */
	char repo[PATH_MAX]; /* source repository work dir */
	char home[PATH_MAX]; /* $SBX_HOME */
	git_repository *r;
	git_oid c1, c2; /* first and second (HEAD) commits */
	struct sbx_provider *p;
};

/* --- helpers ------------------------------------------------------------ */

static void put(const char *dir, const char *rel, const char *content,
		mode_t mode)
{
	char *path = sbx_xasprintf("%s/%s", dir, rel), *slash;
	FILE *f;

	for (slash = strchr(path + strlen(dir) + 1, '/'); slash;
	     slash = strchr(slash + 1, '/')) {
		*slash = '\0';
		mkdir(path, 0755);
		*slash = '/';
	}
	unlink(path);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(content, f);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
	free(path);
}

static void unlink_in(const char *dir, const char *rel)
{
	char *path = sbx_xasprintf("%s/%s", dir, rel);

	assert_int_equal(unlink(path), 0);
	free(path);
}

static void symlink_in(const char *target, const char *dir, const char *rel)
{
	char *path = sbx_xasprintf("%s/%s", dir, rel);

	assert_int_equal(symlink(target, path), 0);
	free(path);
}

/* Whole content of dir/rel, or NULL when it cannot be read. */
static char *slurp(const char *dir, const char *rel)
{
	char *path = sbx_xasprintf("%s/%s", dir, rel);
	char *buf = NULL;
	size_t len = 0;
	FILE *f = fopen(path, "r");

	free(path);
	if (!f)
		return NULL;
	buf = sbx_xmalloc(65536);
	len = fread(buf, 1, 65535, f);
	buf[len] = '\0';
	fclose(f);
	return buf;
}

static void assert_content(const char *dir, const char *rel,
			   const char *expect)
{
	char *got = slurp(dir, rel);

	if (!got)
		fail_msg("%s/%s is missing", dir, rel);
	assert_string_equal(got, expect);
	free(got);
}

static bool exists(const char *dir, const char *rel)
{
	char *path = sbx_xasprintf("%s/%s", dir, rel);
	struct stat st;
	bool ok = lstat(path, &st) == 0;

	free(path);
	return ok;
}

static mode_t lmode(const char *dir, const char *rel)
{
	char *path = sbx_xasprintf("%s/%s", dir, rel);
	struct stat st;

	assert_int_equal(lstat(path, &st), 0);
	free(path);
	return st.st_mode;
}

static void stage_all(git_repository *r)
{
	git_index *idx;

	assert_int_equal(git_repository_index(&idx, r), 0);
	assert_int_equal(git_index_add_all(idx, NULL, 0, NULL, NULL), 0);
	assert_int_equal(git_index_update_all(idx, NULL, NULL, NULL), 0);
	assert_int_equal(git_index_write(idx), 0);
	git_index_free(idx);
}

static void stage_path(git_repository *r, const char *path)
{
	git_index *idx;

	assert_int_equal(git_repository_index(&idx, r), 0);
	assert_int_equal(git_index_add_bypath(idx, path), 0);
	assert_int_equal(git_index_write(idx), 0);
	git_index_free(idx);
}

static void commit_index(git_repository *r, const char *msg, git_oid *out)
{
	git_index *idx;
	git_oid tree_oid;
	git_tree *tree;
	git_signature *sig;
	git_reference *head = NULL;
	git_commit *parent = NULL;
	const git_commit *parents[1];

	assert_int_equal(git_repository_index(&idx, r), 0);
	assert_int_equal(git_index_write_tree(&tree_oid, idx), 0);
	git_index_free(idx);
	assert_int_equal(git_tree_lookup(&tree, r, &tree_oid), 0);
	assert_int_equal(git_signature_now(&sig, "T", "t@example.com"), 0);
	if (git_repository_head(&head, r) == 0)
		assert_int_equal(git_commit_lookup(&parent, r,
						   git_reference_target(head)),
				 0);
	parents[0] = parent;
	assert_int_equal(git_commit_create(out, r, "HEAD", sig, sig, NULL, msg,
					   tree, parent ? 1 : 0, parents),
			 0);
	git_commit_free(parent);
	git_reference_free(head);
	git_signature_free(sig);
	git_tree_free(tree);
}

/* The oid a ref resolves to in repository `r`; false when missing. */
static bool resolve(git_repository *r, const char *name, git_oid *out)
{
	int rc = git_reference_name_to_id(out, r, name);

	git_error_clear();
	return rc == 0;
}

static char *worktree_of(struct fx *f, const char *session)
{
	return sbx_xasprintf("%s/worktrees/%s", f->home, session);
}

static void assert_err(int rc, int code, int klass)
{
	const struct sbx_error *e = sbx_error_last();

	if (rc != code || e->klass != klass)
		fail_msg("rc %d (want %d), class %d (want %d): %s", rc, code,
			 e->klass, klass, e->msg);
}

static int do_create(struct fx *f, const char *session, const char *ref,
		     bool carry, struct sbx_sandbox_info *info)
{
	struct sbx_create_opts o = {
		.session = session,
		.repo = f->repo,
		.ref = ref,
		.carry_changes = carry,
	};
	struct sbx_sandbox_info tmp;
	int rc = f->p->ops->create(f->p, &o, info ? info : &tmp);

	if (!info && rc == 0)
		sbx_sandbox_info_fini(&tmp);
	return rc;
}

static void create_ok(struct fx *f, const char *session)
{
	int rc = do_create(f, session, NULL, false, NULL);

	if (rc < 0)
		fail_msg("create %s: %s", session, sbx_error_last()->msg);
}

/* The tree of a snapshot commit, looked up in the source repository. */
static git_tree *snap_tree(struct fx *f, const char *session, const char *id,
			   git_commit **commit_out)
{
	char *name = sbx_xasprintf("refs/sbx/snapshots/%s/%s", session, id);
	git_oid oid;
	git_commit *c;
	git_tree *t;

	if (!resolve(f->r, name, &oid))
		fail_msg("no ref %s", name);
	free(name);
	assert_int_equal(git_commit_lookup(&c, f->r, &oid), 0);
	assert_int_equal(git_commit_tree(&t, c), 0);
	if (commit_out)
		*commit_out = c;
	else
		git_commit_free(c);
	return t;
}

/* Content of `path` in `tree`, or NULL when absent; *mode_out its mode. */
static char *tree_file(git_repository *r, git_tree *tree, const char *path,
		       unsigned *mode_out)
{
	git_tree_entry *te = NULL;
	git_blob *b;
	char *res;

	if (git_tree_entry_bypath(&te, tree, path) < 0) {
		git_error_clear();
		return NULL;
	}
	if (mode_out)
		*mode_out = git_tree_entry_filemode(te);
	assert_int_equal(git_blob_lookup(&b, r, git_tree_entry_id(te)), 0);
	res = sbx_xstrndup(git_blob_rawcontent(b),
			   (size_t)git_blob_rawsize(b));
	git_blob_free(b);
	git_tree_entry_free(te);
	return res;
}

static char *file_bytes(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf = sbx_xmalloc(1 << 20);

	assert_non_null(f);
	*len = fread(buf, 1, 1 << 20, f);
	fclose(f);
	return buf;
}

static int rm_cb(const char *path, const struct stat *st, int flag,
		 struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	chmod(path, 0700);
	return remove(path);
}

/* --- fixture -------------------------------------------------------------- */

/*
 * repo: README, src/main.c, script.sh (0755), link -> README, .gitignore
 * ("*.log", "build/").  Commit 1, then README changes in commit 2 (HEAD);
 * tag v1 at commit 1.
 */
static int setup(void **state)
{
	struct fx *f = sbx_xcalloc(1, sizeof(*f));
	char *link;
	git_object *obj;
	git_oid tag;

	git_libgit2_init();
	snprintf(f->root, sizeof(f->root), "/tmp/sbx-test-plocal.XXXXXX");
	assert_non_null(mkdtemp(f->root));
	snprintf(f->repo, sizeof(f->repo), "%s/repo", f->root);
	snprintf(f->home, sizeof(f->home), "%s/home", f->root);
	assert_int_equal(setenv("SBX_HOME", f->home, 1), 0);
	assert_int_equal(git_repository_init(&f->r, f->repo, 0), 0);

	put(f->repo, "README", "hello\n", 0644);
	put(f->repo, "src/main.c", "int main(void) { return 0; }\n", 0644);
	put(f->repo, "script.sh", "#!/bin/sh\necho hi\n", 0755);
	put(f->repo, ".gitignore", "*.log\nbuild/\n", 0644);
	link = sbx_xasprintf("%s/link", f->repo);
	assert_int_equal(symlink("README", link), 0);
	free(link);
	stage_all(f->r);
	commit_index(f->r, "one\n", &f->c1);
	put(f->repo, "README", "hello v2\n", 0644);
	stage_all(f->r);
	commit_index(f->r, "two\n", &f->c2);

	assert_int_equal(git_object_lookup(&obj, f->r, &f->c1,
					   GIT_OBJECT_COMMIT), 0);
	assert_int_equal(git_tag_create_lightweight(&tag, f->r, "v1", obj, 0),
			 0);
	git_object_free(obj);

	if (plocal_provider_new(&f->p, NULL) < 0)
		fail_msg("provider: %s", sbx_error_last()->msg);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	sbx_provider_free(f->p);
	git_repository_free(f->r);
	nftw(f->root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	free(f);
	sbx_error_clear();
	return 0;
}

/* --- tests ---------------------------------------------------------------- */

static int count_cb(const struct sbx_sandbox_info *info, void *payload)
{
	(void)info;
	++*(int *)payload;
	return 0;
}

static void test_create_at_head(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info, again;
	char *wt = worktree_of(f, "s1"), *real, *repo_real, sha[41];
	git_oid oid;
	char target[64];
	ssize_t n;
	int count = 0;
	const cJSON *v;

	if (do_create(f, "s1", NULL, false, &info) < 0)
		fail_msg("%s", sbx_error_last()->msg);
	real = realpath(wt, NULL);
	repo_real = realpath(f->repo, NULL);
	assert_string_equal(info.session, "s1");
	assert_string_equal(info.provider, "local");
	assert_string_equal(info.sandbox_id, "sbx/s1");
	assert_string_equal(info.workdir, real);
	assert_string_equal(info.isolation, "none");
	assert_int_equal(info.state, SBX_STATE_READY);
	assert_false(info.remote);
	assert_true(info.created_at > 0);
	git_oid_tostr(sha, sizeof(sha), &f->c2);
	v = cJSON_GetObjectItem(info.extra, "head");
	assert_string_equal(cJSON_GetStringValue(v), sha);
	v = cJSON_GetObjectItem(info.extra, "repo");
	assert_string_equal(cJSON_GetStringValue(v), repo_real);
	v = cJSON_GetObjectItem(info.extra, "branch");
	assert_string_equal(cJSON_GetStringValue(v), "sbx/s1");

	/* Branch at HEAD, files checked out with modes and symlinks. */
	assert_true(resolve(f->r, "refs/heads/sbx/s1", &oid));
	assert_true(git_oid_equal(&oid, &f->c2));
	assert_content(wt, "README", "hello v2\n");
	assert_content(wt, "src/main.c", "int main(void) { return 0; }\n");
	assert_true(lmode(wt, "script.sh") & S_IXUSR);
	assert_false(lmode(wt, "README") & S_IXUSR);
	assert_true(S_ISLNK(lmode(wt, "link")));
	{
		char *lp = sbx_xasprintf("%s/link", wt);

		n = readlink(lp, target, sizeof(target));
		free(lp);
	}
	assert_int_equal(n, 6);
	assert_memory_equal(target, "README", 6);
	assert_true(S_ISREG(lmode(wt, ".git")));
	/* The source checkout is untouched: HEAD still on its branch. */
	assert_true(resolve(f->r, "HEAD", &oid));
	assert_true(git_oid_equal(&oid, &f->c2));
	assert_int_equal(git_repository_head_detached(f->r), 0);

	assert_int_equal(f->p->ops->get(f->p, "s1", &again), 0);
	assert_string_equal(again.workdir, info.workdir);
	assert_int_equal(again.state, SBX_STATE_READY);
	assert_int_equal(again.created_at, info.created_at);
	sbx_sandbox_info_fini(&again);

	assert_int_equal(f->p->ops->list(f->p, count_cb, &count), 0);
	assert_int_equal(count, 1);

	sbx_sandbox_info_fini(&info);
	free(repo_real);
	free(real);
	free(wt);
}

static void test_create_at_ref(void **state)
{
	struct fx *f = *state;
	char *wt = worktree_of(f, "old"), *wt2 = worktree_of(f, "tagged");
	git_oid oid;
	int rc;

	if (do_create(f, "old", "HEAD~1", false, NULL) < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_true(resolve(f->r, "refs/heads/sbx/old", &oid));
	assert_true(git_oid_equal(&oid, &f->c1));
	assert_content(wt, "README", "hello\n");

	if (do_create(f, "tagged", "v1", false, NULL) < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_true(resolve(f->r, "refs/heads/sbx/tagged", &oid));
	assert_true(git_oid_equal(&oid, &f->c1));
	assert_content(wt2, "README", "hello\n");

	/* A bad revision is bad input and leaves nothing behind. */
	rc = do_create(f, "bad", "no-such-branch", false, NULL);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, "no-such-branch"));
	assert_false(resolve(f->r, "refs/heads/sbx/bad", &oid));
	free(wt);
	wt = worktree_of(f, "bad");
	assert_false(exists(wt, ""));
	free(wt);
	free(wt2);
}

static void test_carry_changes(void **state)
{
	struct fx *f = *state;
	char *wt = worktree_of(f, "c1"), *nl;
	git_repository *w;
	git_index *idx;
	git_oid oid;
	git_status_list *sl;
	git_status_options so = GIT_STATUS_OPTIONS_INIT;
	unsigned flags = 0;

	/* unstaged modification, staged new file, unstaged deletion,
	 * staged deletion, mode change, untracked file + symlink, ignored
	 * files. */
	put(f->repo, "README", "changed, not staged\n", 0644);
	put(f->repo, "staged.txt", "staged\n", 0644);
	stage_path(f->r, "staged.txt");
	unlink_in(f->repo, "src/main.c");
	nl = sbx_xasprintf("%s/script.sh", f->repo);
	assert_int_equal(chmod(nl, 0644), 0);
	free(nl);
	put(f->repo, "notes/todo.txt", "untracked\n", 0600);
	nl = sbx_xasprintf("%s/newlink", f->repo);
	assert_int_equal(symlink("notes/todo.txt", nl), 0);
	free(nl);
	put(f->repo, "debug.log", "ignored\n", 0644);
	put(f->repo, "build/out.o", "ignored\n", 0644);
	put(f->repo, "gone.txt", "x", 0644); /* staged then deleted */
	stage_path(f->r, "gone.txt");
	commit_index(f->r, "three\n", &oid); /* HEAD has gone.txt */
	{
		git_index *si;

		assert_int_equal(git_repository_index(&si, f->r), 0);
		assert_int_equal(git_index_remove_bypath(si, "gone.txt"), 0);
		assert_int_equal(git_index_write(si), 0);
		git_index_free(si);
		unlink_in(f->repo, "gone.txt");
	}
	/* staged.txt was committed with "three": stage a new version. */
	put(f->repo, "staged.txt", "staged v2\n", 0644);
	stage_path(f->r, "staged.txt");

	if (do_create(f, "c1", NULL, true, NULL) < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_content(wt, "README", "changed, not staged\n");
	assert_content(wt, "staged.txt", "staged v2\n");
	assert_false(exists(wt, "src/main.c"));
	assert_false(exists(wt, "gone.txt"));
	assert_false(lmode(wt, "script.sh") & S_IXUSR);
	assert_content(wt, "notes/todo.txt", "untracked\n");
	assert_int_equal(lmode(wt, "notes/todo.txt") & 0777, 0600);
	assert_true(S_ISLNK(lmode(wt, "newlink")));
	assert_content(wt, "newlink", "untracked\n");
	assert_false(exists(wt, "debug.log"));
	assert_false(exists(wt, "build"));

	/* Nothing committed: the branch is at the source HEAD. */
	assert_true(resolve(f->r, "refs/heads/sbx/c1", &oid));
	assert_true(resolve(f->r, "HEAD", &f->c2));
	assert_true(git_oid_equal(&oid, &f->c2));
	/* The source still has its changes. */
	assert_content(f->repo, "README", "changed, not staged\n");

	/* Staged state reproduced: staged.txt and gone.txt staged, README
	 * not. */
	assert_int_equal(git_repository_open(&w, wt), 0);
	assert_int_equal(git_repository_index(&idx, w), 0);
	assert_null(git_index_get_bypath(idx, "gone.txt", 0));
	assert_non_null(git_index_get_bypath(idx, "staged.txt", 0));
	git_index_free(idx);
	so.flags = GIT_STATUS_OPT_INCLUDE_UNTRACKED;
	assert_int_equal(git_status_list_new(&sl, w, &so), 0);
	for (size_t i = 0; i < git_status_list_entrycount(sl); i++) {
		const git_status_entry *e = git_status_byindex(sl, i);
		const char *p = e->head_to_index
					? e->head_to_index->new_file.path
					: e->index_to_workdir->new_file.path;

		if (!strcmp(p, "staged.txt") || !strcmp(p, "gone.txt") ||
		    !strcmp(p, "README"))
			flags |= e->status;
		if (!strcmp(p, "README"))
			assert_int_equal(e->status, GIT_STATUS_WT_MODIFIED);
		if (!strcmp(p, "gone.txt"))
			assert_int_equal(e->status, GIT_STATUS_INDEX_DELETED);
		if (!strcmp(p, "staged.txt"))
			assert_int_equal(e->status,
					 GIT_STATUS_INDEX_MODIFIED);
	}
	assert_true(flags & GIT_STATUS_INDEX_MODIFIED);
	git_status_list_free(sl);
	git_repository_free(w);
	free(wt);
}

static void test_create_bad_input(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info;
	struct sbx_create_opts o = {.session = "x"};
	char *notrepo = sbx_xasprintf("%s/plain", f->root);
	char *empty = sbx_xasprintf("%s/empty", f->root);
	git_repository *e;
	int rc;

	assert_int_equal(mkdir(notrepo, 0755), 0);
	o.repo = notrepo;
	rc = f->p->ops->create(f->p, &o, &info);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg,
			       "is not inside a git repository"));

	o.repo = "/nonexistent/sbx/dir";
	rc = f->p->ops->create(f->p, &o, &info);
	assert_err(rc, -ENOENT, SBX_ERR_CONFIG);

	o.repo = f->repo;
	o.session = "a/b";
	rc = f->p->ops->create(f->p, &o, &info);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);
	o.session = "x.lock";
	rc = f->p->ops->create(f->p, &o, &info);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);

	assert_int_equal(git_repository_init(&e, empty, 0), 0);
	git_repository_free(e);
	o.repo = empty;
	o.session = "x";
	rc = f->p->ops->create(f->p, &o, &info);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, "no commits"));
	free(notrepo);
	free(empty);
}

static void test_terminate(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info;
	char *wt = worktree_of(f, "t1");
	git_worktree *w = NULL;
	git_oid oid;
	int rc;

	create_ok(f, "t1");
	put(wt, "work.txt", "precious\n", 0644);
	rc = f->p->ops->terminate(f->p, "t1", 0);
	assert_err(rc, -EBUSY, SBX_ERR_STATE);
	assert_non_null(strstr(sbx_error_last()->msg, "work.txt"));
	assert_non_null(strstr(sbx_error_last()->msg, "--force"));
	assert_content(wt, "work.txt", "precious\n");

	/* Ignored files alone do not make it dirty... but this one is. */
	rc = f->p->ops->terminate(f->p, "t1", SBX_TERMINATE_FORCE);
	if (rc < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_false(exists(wt, ""));
	assert_true(resolve(f->r, "refs/heads/sbx/t1", &oid));
	assert_true(git_worktree_lookup(&w, f->r, "sbx-t1") < 0);
	assert_false(exists(f->repo, ".git/worktrees/sbx-t1"));
	rc = f->p->ops->get(f->p, "t1", &info);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	rc = f->p->ops->terminate(f->p, "t1", 0);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);

	/* A clean one with only ignored files goes without --force. */
	create_ok(f, "t2");
	free(wt);
	wt = worktree_of(f, "t2");
	put(wt, "x.log", "ignored\n", 0644);
	rc = f->p->ops->terminate(f->p, "t2", 0);
	if (rc < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_false(exists(wt, ""));
	assert_true(resolve(f->r, "refs/heads/sbx/t2", &oid));
	free(wt);
}

static void test_terminate_delete_branch(void **state)
{
	struct fx *f = *state;
	char *id = NULL, *wt = worktree_of(f, "d1"), *outside;
	git_oid oid;
	int rc;

	create_ok(f, "d1");
	assert_int_equal(f->p->ops->snapshot(f->p, "d1", "s", &id), 0);
	assert_true(resolve(f->r, "refs/sbx/snapshots/d1/0001", &oid));
	/* A symlink out of the worktree must not be followed. */
	outside = sbx_xasprintf("%s/outside", f->root);
	assert_int_equal(mkdir(outside, 0755), 0);
	put(outside, "keep.txt", "keep\n", 0644);
	symlink_in(outside, wt, "out");
	rc = f->p->ops->terminate(f->p, "d1", SBX_TERMINATE_FORCE |
						      SBX_TERMINATE_DELETE_BRANCH);
	if (rc < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_false(exists(wt, ""));
	assert_false(resolve(f->r, "refs/heads/sbx/d1", &oid));
	assert_false(resolve(f->r, "refs/sbx/snapshots/d1/0001", &oid));
	assert_content(outside, "keep.txt", "keep\n");
	/* Same name again starts fresh. */
	create_ok(f, "d1");
	free(outside);
	free(id);
	free(wt);
}

static int snap_cb(const struct sbx_snapshot_info *s, void *payload)
{
	cJSON *arr = payload;
	cJSON *o = cJSON_CreateObject();

	cJSON_AddStringToObject(o, "id", s->id);
	cJSON_AddStringToObject(o, "message", s->message);
	cJSON_AddNumberToObject(o, "time", (double)s->created_at);
	cJSON_AddItemToArray(arr, o);
	return 0;
}

static void test_snapshot(void **state)
{
	struct fx *f = *state;
	char *wt = worktree_of(f, "sn"), *id = NULL, *id2 = NULL, *c;
	char *index_path, *before, *after;
	size_t blen, alen;
	git_repository *w;
	git_oid head_before, head_after, br_before, br_after, oid;
	git_commit *commit, *parent;
	git_tree *t;
	unsigned mode;
	cJSON *arr;

	create_ok(f, "sn");
	assert_int_equal(git_repository_open(&w, wt), 0);
	put(wt, "README", "modified in sandbox\n", 0644);
	put(wt, "staged-only.txt", "staged\n", 0644);
	stage_path(w, "staged-only.txt");
	put(wt, "dir/new.txt", "untracked\n", 0644);
	unlink_in(wt, "src/main.c");
	put(wt, "trace.log", "ignored\n", 0644);
	put(wt, "tool.sh", "#!/bin/sh\n", 0755);

	assert_true(resolve(w, "HEAD", &head_before));
	assert_true(resolve(f->r, "refs/heads/sbx/sn", &br_before));
	index_path = sbx_xasprintf("%sindex", git_repository_path(w));
	before = file_bytes(index_path, &blen);

	if (f->p->ops->snapshot(f->p, "sn", "first", &id) < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_string_equal(id, "0001");

	assert_true(resolve(w, "HEAD", &head_after));
	assert_true(git_oid_equal(&head_before, &head_after));
	assert_true(resolve(f->r, "refs/heads/sbx/sn", &br_after));
	assert_true(git_oid_equal(&br_before, &br_after));
	after = file_bytes(index_path, &alen);
	assert_int_equal(alen, blen);
	assert_memory_equal(before, after, blen);
	/* The worktree files are as they were. */
	assert_content(wt, "README", "modified in sandbox\n");
	assert_content(wt, "trace.log", "ignored\n");

	t = snap_tree(f, "sn", "0001", &commit);
	assert_int_equal(git_commit_parent(&parent, commit, 0), 0);
	assert_true(git_oid_equal(git_commit_id(parent), &head_before));
	assert_string_equal(git_commit_message(commit), "first\n");
	git_commit_free(parent);
	git_commit_free(commit);
	c = tree_file(f->r, t, "README", NULL);
	assert_string_equal(c, "modified in sandbox\n");
	free(c);
	c = tree_file(f->r, t, "dir/new.txt", NULL);
	assert_string_equal(c, "untracked\n");
	free(c);
	c = tree_file(f->r, t, "staged-only.txt", NULL);
	assert_string_equal(c, "staged\n");
	free(c);
	assert_null(tree_file(f->r, t, "src/main.c", NULL));
	assert_null(tree_file(f->r, t, "trace.log", NULL));
	c = tree_file(f->r, t, "tool.sh", &mode);
	assert_int_equal(mode, GIT_FILEMODE_BLOB_EXECUTABLE);
	free(c);
	c = tree_file(f->r, t, "script.sh", &mode);
	assert_int_equal(mode, GIT_FILEMODE_BLOB_EXECUTABLE);
	free(c);
	c = tree_file(f->r, t, "link", &mode);
	assert_int_equal(mode, GIT_FILEMODE_LINK);
	assert_string_equal(c, "README");
	free(c);
	git_tree_free(t);

	/* A second one gets the next id; the list is newest first. */
	assert_int_equal(f->p->ops->snapshot(f->p, "sn", NULL, &id2), 0);
	assert_string_equal(id2, "0002");
	arr = cJSON_CreateArray();
	assert_int_equal(f->p->ops->snapshots(f->p, "sn", snap_cb, arr), 0);
	assert_int_equal(cJSON_GetArraySize(arr), 2);
	assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(
				    cJSON_GetArrayItem(arr, 0), "id")),
			    "0002");
	assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(
				    cJSON_GetArrayItem(arr, 0), "message")),
			    "sbx snapshot");
	assert_string_equal(cJSON_GetStringValue(cJSON_GetObjectItem(
				    cJSON_GetArrayItem(arr, 1), "message")),
			    "first");
	assert_true(cJSON_GetNumberValue(cJSON_GetObjectItem(
			    cJSON_GetArrayItem(arr, 1), "time")) > 0);
	cJSON_Delete(arr);
	(void)oid;

	git_repository_free(w);
	free(before);
	free(after);
	free(index_path);
	free(id);
	free(id2);
	free(wt);
}

static void test_restore(void **state)
{
	struct fx *f = *state;
	char *wt = worktree_of(f, "r1"), *id = NULL, *saved = NULL, *c;
	git_repository *w;
	git_oid head_before, head_after;
	git_status_list *sl;
	git_status_options so = GIT_STATUS_OPTIONS_INIT;
	git_tree *t;
	git_commit *commit;
	int rc;

	create_ok(f, "r1");
	assert_int_equal(git_repository_open(&w, wt), 0);
	assert_true(resolve(w, "HEAD", &head_before));
	put(wt, "a.txt", "v1\n", 0644);
	put(wt, "README", "readme at snapshot\n", 0644);
	assert_int_equal(f->p->ops->snapshot(f->p, "r1", "good", &id), 0);

	put(wt, "a.txt", "v2\n", 0644);
	put(wt, "b/new.txt", "new after\n", 0644);
	unlink_in(wt, "README");
	unlink_in(wt, "link");
	put(wt, "x.log", "ignored stays\n", 0644);
	put(wt, "staged.txt", "staged\n", 0644);
	stage_path(w, "staged.txt");

	rc = f->p->ops->restore(f->p, "r1", "1", &saved); /* "1" = "0001" */
	if (rc < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_string_equal(saved, "0002");

	assert_content(wt, "a.txt", "v1\n");
	assert_content(wt, "README", "readme at snapshot\n");
	assert_true(S_ISLNK(lmode(wt, "link")));
	assert_true(lmode(wt, "script.sh") & S_IXUSR);
	assert_false(exists(wt, "b/new.txt"));
	assert_false(exists(wt, "b"));
	assert_false(exists(wt, "staged.txt"));
	assert_content(wt, "x.log", "ignored stays\n");

	/* The safety snapshot holds the state before the restore. */
	t = snap_tree(f, "r1", "0002", &commit);
	assert_string_equal(git_commit_message(commit),
			    "before restore to 0001\n");
	git_commit_free(commit);
	c = tree_file(f->r, t, "a.txt", NULL);
	assert_string_equal(c, "v2\n");
	free(c);
	c = tree_file(f->r, t, "b/new.txt", NULL);
	assert_string_equal(c, "new after\n");
	free(c);
	assert_null(tree_file(f->r, t, "README", NULL));
	git_tree_free(t);

	/* HEAD unmoved; index = HEAD's tree: nothing staged. */
	git_repository_free(w);
	assert_int_equal(git_repository_open(&w, wt), 0);
	assert_true(resolve(w, "HEAD", &head_after));
	assert_true(git_oid_equal(&head_before, &head_after));
	so.show = GIT_STATUS_SHOW_INDEX_ONLY;
	assert_int_equal(git_status_list_new(&sl, w, &so), 0);
	assert_int_equal(git_status_list_entrycount(sl), 0);
	git_status_list_free(sl);

	/* Round trip: back to the saved state. */
	free(saved);
	saved = NULL;
	assert_int_equal(f->p->ops->restore(f->p, "r1", "0002", &saved), 0);
	assert_string_equal(saved, "0003");
	assert_content(wt, "a.txt", "v2\n");
	assert_content(wt, "b/new.txt", "new after\n");
	assert_false(exists(wt, "README"));

	rc = f->p->ops->restore(f->p, "r1", "0042", NULL);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	assert_non_null(strstr(sbx_error_last()->msg, "sbx snapshots r1"));
	rc = f->p->ops->restore(f->p, "r1", "../x", NULL);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);

	git_repository_free(w);
	free(saved);
	free(id);
	free(wt);
}

static int never_cb(const struct sbx_snapshot_info *s, void *payload)
{
	(void)s;
	(void)payload;
	fail_msg("callback for an unknown session");
	return 0;
}

static void test_unknown_session(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info;
	char *id = NULL;
	int rc;

	rc = f->p->ops->get(f->p, "nope", &info);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	assert_non_null(strstr(sbx_error_last()->msg,
			       "no local sandbox for session nope"));
	rc = f->p->ops->snapshot(f->p, "nope", NULL, &id);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	rc = f->p->ops->snapshots(f->p, "nope", never_cb, NULL);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	rc = f->p->ops->restore(f->p, "nope", "0001", NULL);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	rc = f->p->ops->terminate(f->p, "nope", SBX_TERMINATE_FORCE);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	rc = f->p->ops->get(f->p, "../etc", &info);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);
}

static void test_create_twice_and_rollback(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info;
	char *wt = worktree_of(f, "tw"), *index, *wt2 = worktree_of(f, "rb");
	git_oid oid;
	git_worktree *w = NULL;
	int rc;

	create_ok(f, "tw");
	put(wt, "mine.txt", "agent work\n", 0644);
	rc = do_create(f, "tw", NULL, false, NULL);
	assert_err(rc, -EEXIST, SBX_ERR_STATE);
	assert_content(wt, "mine.txt", "agent work\n");
	assert_true(resolve(f->r, "refs/heads/sbx/tw", &oid));
	assert_int_equal(f->p->ops->get(f->p, "tw", &info), 0);
	assert_int_equal(info.state, SBX_STATE_READY);
	sbx_sandbox_info_fini(&info);

	/* A branch kept by an earlier `sbx down` is continued: the new
	 * worktree starts at its commit, not at HEAD... */
	assert_int_equal(git_reference_create(NULL, f->r,
					      "refs/heads/sbx/left", &f->c1,
					      0, NULL),
			 0);
	/* ...but an explicit --ref is refused before anything is made. */
	rc = do_create(f, "left", "HEAD", false, NULL);
	assert_err(rc, -EEXIST, SBX_ERR_STATE);
	assert_non_null(strstr(sbx_error_last()->msg, "git branch -D"));
	{
		char *lw = worktree_of(f, "left");

		assert_false(exists(lw, ""));
		free(lw);
	}
	rc = do_create(f, "left", NULL, false, NULL);
	assert_int_equal(rc, 0);
	assert_true(resolve(f->r, "refs/heads/sbx/left", &oid));
	assert_true(git_oid_equal(&oid, &f->c1));
	{
		git_repository *lr = NULL;
		git_reference *head = NULL;
		char *lw = worktree_of(f, "left");

		assert_int_equal(git_repository_open(&lr, lw), 0);
		assert_int_equal(git_repository_head(&head, lr), 0);
		assert_true(git_oid_equal(git_reference_target(head), &f->c1));
		assert_string_equal(git_reference_name(head),
				    "refs/heads/sbx/left");
		git_reference_free(head);
		git_repository_free(lr);
		free(lw);
	}

	/* A failure after the branch and worktree exist (carrying changes
	 * out of a corrupt index) undoes everything. */
	index = sbx_xasprintf("%s/.git/index", f->repo);
	put(f->repo, ".git/index", "garbage", 0644);
	rc = do_create(f, "rb", NULL, true, NULL);
	assert_true(rc < 0);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_GIT);
	assert_false(exists(wt2, ""));
	assert_false(resolve(f->r, "refs/heads/sbx/rb", &oid));
	assert_true(git_worktree_lookup(&w, f->r, "sbx-rb") < 0);
	assert_false(exists(f->repo, ".git/worktrees/sbx-rb"));
	/* ... and the first sandbox is intact. */
	assert_content(wt, "mine.txt", "agent work\n");
	free(index);
	free(wt2);
	free(wt);
}

static void test_broken_worktree(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info;
	char *reg = sbx_xasprintf("%s/.git/worktrees/sbx-br", f->repo);
	char *wt = worktree_of(f, "br");
	struct sbx_sandbox *sb = NULL;
	int rc;

	create_ok(f, "br");
	assert_int_equal(nftw(reg, rm_cb, 16, FTW_DEPTH | FTW_PHYS), 0);
	assert_int_equal(f->p->ops->get(f->p, "br", &info), 0);
	assert_int_equal(info.state, SBX_STATE_ERROR);
	assert_non_null(cJSON_GetStringValue(
		cJSON_GetObjectItem(info.extra, "error")));
	sbx_sandbox_info_fini(&info);
	rc = f->p->ops->open(f->p, "br", &sb);
	assert_err(rc, -EIO, SBX_ERR_STATE);
	assert_null(sb);

	rc = f->p->ops->terminate(f->p, "br", 0);
	assert_err(rc, -EBUSY, SBX_ERR_STATE);
	assert_true(exists(wt, "README"));
	rc = f->p->ops->terminate(f->p, "br", SBX_TERMINATE_FORCE);
	if (rc < 0)
		fail_msg("%s", sbx_error_last()->msg);
	assert_false(exists(wt, ""));
	/* The stale registration is no obstacle to a new sandbox. */
	rc = f->p->ops->terminate(f->p, "br", SBX_TERMINATE_FORCE);
	assert_err(rc, -ENOENT, SBX_ERR_NOTFOUND);
	free(reg);
	free(wt);
}

static void test_stale_registration(void **state)
{
	struct fx *f = *state;
	char *wt = worktree_of(f, "st");

	/* The worktree directory vanished (rm -rf by hand): a new create
	 * prunes the stale registration.  The branch must go first. */
	create_ok(f, "st");
	assert_int_equal(nftw(wt, rm_cb, 16, FTW_DEPTH | FTW_PHYS), 0);
	{
		git_reference *b;

		assert_int_equal(git_branch_lookup(&b, f->r, "sbx/st",
						   GIT_BRANCH_LOCAL), 0);
		assert_int_equal(git_branch_delete(b), 0);
		git_reference_free(b);
	}
	create_ok(f, "st");
	assert_content(wt, "README", "hello v2\n");
	free(wt);
}

static void test_from_linked_worktree(void **state)
{
	struct fx *f = *state;
	struct sbx_sandbox_info info;
	struct sbx_create_opts o = {.session = "child", .carry_changes = true};
	char *wt = worktree_of(f, "parent"), *cd = NULL, *common;
	const cJSON *v;
	git_oid oid;

	create_ok(f, "parent");
	put(wt, "from-parent.txt", "carried\n", 0644);
	o.repo = wt;
	if (f->p->ops->create(f->p, &o, &info) < 0)
		fail_msg("%s", sbx_error_last()->msg);
	v = cJSON_GetObjectItem(info.extra, "repo");
	common = realpath(f->repo, NULL);
	assert_string_equal(cJSON_GetStringValue(v), common);
	free(common);
	assert_content(info.workdir, "from-parent.txt", "carried\n");
	assert_true(resolve(f->r, "refs/heads/sbx/child", &oid));

	assert_int_equal(plocal_git_commondir(info.workdir, &cd), 0);
	common = sbx_xasprintf("%s/.git", f->repo);
	{
		char *a = realpath(common, NULL), *b = realpath(cd, NULL);

		assert_string_equal(a, b);
		free(a);
		free(b);
	}
	free(common);
	free(cd);
	sbx_sandbox_info_fini(&info);
	free(wt);
}

static void test_isolation_config(void **state)
{
	struct fx *f = *state;
	struct sbx_provider *p = NULL;
	struct sbx_sandbox_info info;
	cJSON *conf = cJSON_Parse("{\"isolation\": \"bwrap\"}");
	int rc;

	assert_int_equal(plocal_provider_new(&p, conf), 0);
	create_ok(f, "iso");
	assert_int_equal(p->ops->get(p, "iso", &info), 0);
	assert_string_equal(info.isolation, "bwrap");
	sbx_sandbox_info_fini(&info);
	sbx_provider_free(p);
	cJSON_Delete(conf);

	conf = cJSON_Parse("{\"isolation\": \"chroot\"}");
	rc = plocal_provider_new(&p, conf);
	assert_err(rc, -EINVAL, SBX_ERR_CONFIG);
	assert_null(p);
	cJSON_Delete(conf);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_create_at_head),
		T(test_create_at_ref),
		T(test_carry_changes),
		T(test_create_bad_input),
		T(test_terminate),
		T(test_terminate_delete_branch),
		T(test_snapshot),
		T(test_restore),
		T(test_unknown_session),
		T(test_create_twice_and_rollback),
		T(test_broken_worktree),
		T(test_stale_registration),
		T(test_from_linked_worktree),
		T(test_isolation_config),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
