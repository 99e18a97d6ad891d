/*
 * Shared helpers for the unit tests: temporary directories, and the
 * fixtures that give a test a fresh $SBX_HOME or $HOME.
 */
#ifndef SBX_TEST_HELPERS_I_H
#define SBX_TEST_HELPERS_I_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A fresh directory under $TMPDIR; caller frees the string. */
static inline char *th_tmpdir(void)
{
	const char *base = getenv("TMPDIR");
	char tmpl[4096];
	char *d;

	snprintf(tmpl, sizeof(tmpl), "%s/sbx-test-XXXXXX",
		 base && *base ? base : "/tmp");
	d = mkdtemp(tmpl);
	return d ? strdup(d) : NULL;
}

static inline int th_rm1(const char *path, const struct stat *st, int flag,
			 struct FTW *ftw)
{
	return remove(path);
}

/* rm -rf of a directory made by th_tmpdir(), for test cleanup only. */
static inline void th_rmrf(const char *dir)
{
	if (!dir || !strstr(dir, "/sbx-test-"))
		return;
	nftw(dir, th_rm1, 16, FTW_DEPTH | FTW_PHYS);
}

/* Write a small file, creating it with mode 0644. */
static inline void th_write(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (!f)
		abort();
	fputs(text, f);
	fclose(f);
}

/* cmocka setup: $SBX_HOME is a fresh directory, which is also *state. */
static inline int th_sbx_home_setup(void **state)
{
	char *tmp = th_tmpdir();

	if (!tmp)
		return -1;
	setenv("SBX_HOME", tmp, 1);
	*state = tmp;
	return 0;
}

/* cmocka teardown of th_sbx_home_setup(). */
static inline int th_sbx_home_teardown(void **state)
{
	th_rmrf(*state);
	free(*state);
	unsetenv("SBX_HOME");
	return 0;
}

/*
 * A fresh $HOME for one test: returns the new directory (also $HOME), or
 * NULL.  The old $HOME is kept in *old_home, and the variables of the
 * NULL-terminated list `cleared` are unset (the test starts from none of
 * the user's settings).
 */
static inline char *th_home_setup(char **old_home, const char *const *cleared)
{
	const char *h = getenv("HOME");
	char *tmp;

	*old_home = h ? strdup(h) : NULL;
	tmp = th_tmpdir();
	if (!tmp)
		return NULL;
	setenv("HOME", tmp, 1);
	for (size_t i = 0; cleared && cleared[i]; i++)
		unsetenv(cleared[i]);
	return tmp;
}

/* Undo th_home_setup(): remove *dir, restore $HOME, unset `cleared`. */
static inline void th_home_teardown(char **dir, char **old_home,
				    const char *const *cleared)
{
	th_rmrf(*dir);
	free(*dir);
	*dir = NULL;
	if (*old_home)
		setenv("HOME", *old_home, 1);
	free(*old_home);
	*old_home = NULL;
	for (size_t i = 0; cleared && cleared[i]; i++)
		unsetenv(cleared[i]);
}

/*
 * Define setup() and teardown() for cmocka tests that each run in a fresh
 * $HOME: `dir` (a char * of the test file) is the directory, `saved` (a
 * char *) keeps the old $HOME, `cleared` is the NULL-terminated list of
 * variables unset around each test.  The test file includes sbx/error.h.
 */
#define TH_HOME_FIXTURE(dir, saved, cleared)                                   \
	static int setup(void **state)                                         \
	{                                                                      \
		dir = th_home_setup(&saved, cleared);                          \
		sbx_error_clear();                                             \
		return dir ? 0 : -1;                                           \
	}                                                                      \
                                                                               \
	static int teardown(void **state)                                      \
	{                                                                      \
		th_home_teardown(&dir, &saved, cleared);                       \
		return 0;                                                      \
	}

/* Check a malloc'd string (cmocka's assert_string_equal), then free it. */
#define TH_STR_FREE(got, want)                                                 \
	do {                                                                   \
		char *th_got_ = (got);                                         \
		assert_string_equal(th_got_, (want));                          \
		free(th_got_);                                                 \
	} while (0)

/* A cmocka test run between the test file's setup() and teardown(). */
#define TH_TEST(t) cmocka_unit_test_setup_teardown(t, setup, teardown)

#endif
