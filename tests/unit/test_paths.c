/* Unit tests: lib/paths.c (names, $SBX_HOME, atomic files, git top). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "sbx/paths.h"
#include "test_helpers_i.h"

static void test_names(void **state)
{
	char n64[65], n65[66];

	memset(n64, 'a', 64);
	n64[64] = '\0';
	memset(n65, 'a', 65);
	n65[65] = '\0';
	assert_int_equal(sbx_name_validate("ok-name_1.2"), 0);
	assert_int_equal(sbx_name_validate("X"), 0);
	assert_int_equal(sbx_name_validate(n64), 0);
	assert_int_equal(sbx_name_validate(n65), -EINVAL);
	assert_int_equal(sbx_name_validate(""), -EINVAL);
	assert_int_equal(sbx_name_validate(NULL), -EINVAL);
	assert_int_equal(sbx_name_validate("a/b"), -EINVAL);
	assert_int_equal(sbx_name_validate(".."), -EINVAL);
	assert_int_equal(sbx_name_validate(".x"), -EINVAL);
	assert_int_equal(sbx_name_validate("-x"), -EINVAL);
	assert_int_equal(sbx_name_validate("a b"), -EINVAL);
	assert_int_equal(sbx_name_validate("a\nb"), -EINVAL);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, "only A-Z"));
}

static void test_absolute(void **state)
{
	char *p = NULL;

	assert_int_equal(sbx_path_absolute("/a//b/./c/../d/", &p), 0);
	assert_string_equal(p, "/a/b/d");
	free(p);
	assert_int_equal(sbx_path_absolute("/../..", &p), 0);
	assert_string_equal(p, "/");
	free(p);
	assert_int_equal(sbx_path_absolute("", &p), -EINVAL);
	assert_null(p);
}

static void test_home_and_mkdir(void **state)
{
	char *tmp = th_tmpdir(), *home = NULL, *f = NULL, deep[4096];
	struct stat st;

	assert_non_null(tmp);
		snprintf(deep, sizeof(deep), "%s/x/y/z", tmp);
	assert_int_equal(sbx_paths_mkdir_p(deep, 0700), 0);
	assert_int_equal(stat(deep, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0700);
	/* Existing directories are fine; a file in the way is not. */
	assert_int_equal(sbx_paths_mkdir_p(deep, 0700), 0);
	snprintf(deep, sizeof(deep), "%s/file", tmp);
	th_write(deep, "x");
	assert_int_equal(sbx_paths_mkdir_p(deep, 0700), -ENOTDIR);

	snprintf(deep, sizeof(deep), "%s/state", tmp);
	setenv("SBX_HOME", deep, 1);
	assert_int_equal(sbx_paths_home(&home), 0);
	assert_string_equal(home, deep);
	assert_int_equal(stat(home, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	assert_int_equal(sbx_paths_session_file(&f, "sessions", "s1", ".json"),
			 0);
	assert_non_null(strstr(f, "/state/sessions/s1.json"));
	free(f);
	assert_int_equal(sbx_paths_session_file(&f, "sessions", "../x", ""),
			 -EINVAL);
	assert_null(f);

	free(home);
	th_rmrf(tmp);
	free(tmp);
	unsetenv("SBX_HOME");
}

static void test_atomic_write(void **state)
{
	char *tmp = th_tmpdir(), path[4096], *data = NULL;
	struct stat st;
	size_t len;

	snprintf(path, sizeof(path), "%s/f.json", tmp);
	assert_int_equal(sbx_file_write_atomic(path, "hello", 5, 0600), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	assert_int_equal(sbx_file_write_atomic(path, "bye", 3, 0600), 0);
	assert_int_equal(sbx_file_read(path, 100, &data, &len), 0);
	assert_string_equal(data, "bye");
	assert_int_equal(len, 3);
	free(data);
	/* Too big for the cap. */
	assert_int_equal(sbx_file_read(path, 2, &data, NULL), -EFBIG);
	assert_null(data);
	snprintf(path, sizeof(path), "%s/none", tmp);
	assert_int_equal(sbx_file_read(path, 2, &data, NULL), -ENOENT);
	/* Missing directory: the error says so and nothing is left. */
	snprintf(path, sizeof(path), "%s/no/f", tmp);
	assert_int_equal(sbx_file_write_atomic(path, "x", 1, 0600), -ENOENT);
	th_rmrf(tmp);
	free(tmp);
}

static void test_git_toplevel(void **state)
{
	char *tmp = th_tmpdir(), p[4096], *top = NULL;

	snprintf(p, sizeof(p), "%s/repo/.git", tmp);
	assert_int_equal(sbx_paths_mkdir_p(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/repo/a/b", tmp);
	assert_int_equal(sbx_paths_mkdir_p(p, 0755), 0);
	assert_int_equal(sbx_paths_git_toplevel(&top, p), 0);
	snprintf(p, sizeof(p), "%s/repo", tmp);
	assert_string_equal(top, p);
	free(top);
	/* A worktree has a .git file. */
	snprintf(p, sizeof(p), "%s/wt", tmp);
	assert_int_equal(sbx_paths_mkdir_p(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/wt/.git", tmp);
	th_write(p, "gitdir: /elsewhere\n");
	snprintf(p, sizeof(p), "%s/wt", tmp);
	assert_int_equal(sbx_paths_git_toplevel(&top, p), 0);
	assert_string_equal(top, p);
	free(top);
	snprintf(p, sizeof(p), "%s/missing", tmp);
	assert_int_equal(sbx_paths_git_toplevel(&top, p), -ENOENT);
	th_rmrf(tmp);
	free(tmp);
}

static void test_expand_user(void **state)
{
	char *p = NULL;

	setenv("HOME", "/home/someone", 1);
	assert_int_equal(sbx_path_expand_user(&p, "~/sbx"), 0);
	TH_STR_FREE(p, "/home/someone/sbx");
	assert_int_equal(sbx_path_expand_user(&p, "~"), 0);
	TH_STR_FREE(p, "/home/someone");
	assert_int_equal(sbx_path_expand_user(&p, "~bob/x"), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_absolute),
		cmocka_unit_test(test_home_and_mkdir),
		cmocka_unit_test(test_atomic_write),
		cmocka_unit_test(test_git_toplevel),
		cmocka_unit_test(test_expand_user),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
