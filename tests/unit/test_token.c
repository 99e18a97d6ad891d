/* Unit tests: lib/token.c (token files, comparison, generation). */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/token.h"
#include "test_helpers_i.h"

static char *tmpfile_with(const char *dir, const char *text, mode_t mode)
{
	char *p;

	assert_true(asprintf(&p, "%s/token", dir) > 0);
	th_write(p, text);
	assert_int_equal(chmod(p, mode), 0);
	return p;
}

static void test_read_first_line(void **state)
{
	char *dir = th_tmpdir(), *p, *tok = NULL;

	p = tmpfile_with(dir, "s3cret \t\r\nsecond\n", 0600);
	assert_int_equal(sbx_token_file_read(&tok, p), 0);
	assert_string_equal(tok, "s3cret");
	sbx_token_free(tok);
	assert_int_equal(chmod(p, 0400), 0);
	assert_int_equal(sbx_token_file_read(&tok, p), 0);
	assert_string_equal(tok, "s3cret");
	sbx_token_free(tok);
	th_write(p, "no-newline");
	assert_int_equal(sbx_token_file_read(&tok, p), 0);
	assert_string_equal(tok, "no-newline");
	sbx_token_free(tok);
	free(p);
	th_rmrf(dir);
	free(dir);
}

static void test_open_to_others_refused(void **state)
{
	static const mode_t bad[] = {0644, 0640, 0604, 0620, 0602, 0610,
				     0601, 0666, 0700 | 0070};
	char *dir = th_tmpdir(), *p, *tok = NULL;

	p = tmpfile_with(dir, "s3cret\n", 0600);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(chmod(p, bad[i]), 0);
		assert_int_equal(sbx_token_file_read(&tok, p), -EPERM);
		assert_null(tok);
		assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
		assert_non_null(strstr(sbx_error_last()->msg, "chmod 600"));
		assert_non_null(strstr(sbx_error_last()->msg, p));
		assert_null(strstr(sbx_error_last()->msg, "s3cret"));
	}
	free(p);
	th_rmrf(dir);
	free(dir);
}

static void test_bad_content(void **state)
{
	char *dir = th_tmpdir(), *p, *tok = NULL, *missing, *big;

	p = tmpfile_with(dir, "\n", 0600);
	assert_int_equal(sbx_token_file_read(&tok, p), -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "empty"));
	th_write(p, "");
	assert_int_equal(sbx_token_file_read(&tok, p), -EINVAL);
	th_write(p, "ab\001cd\n");
	assert_int_equal(sbx_token_file_read(&tok, p), -EINVAL);
	assert_null(strstr(sbx_error_last()->msg, "ab"));
	big = malloc(SBX_TOKEN_FILE_CAP + 2);
	memset(big, 'x', SBX_TOKEN_FILE_CAP + 1);
	big[SBX_TOKEN_FILE_CAP + 1] = '\0';
	th_write(p, big);
	assert_int_equal(sbx_token_file_read(&tok, p), -EFBIG);
	free(big);
	assert_true(asprintf(&missing, "%s/nope", dir) > 0);
	assert_int_equal(sbx_token_file_read(&tok, missing), -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_OS);
	assert_non_null(strstr(sbx_error_last()->msg, missing));
	assert_null(tok);
	free(missing);
	free(p);
	th_rmrf(dir);
	free(dir);
}

static void test_pipe(void **state)
{
	int fds[2];
	char path[64], *tok = NULL;

	assert_int_equal(pipe(fds), 0);
	assert_int_equal(write(fds[1], "piped\n", 6), 6);
	close(fds[1]);
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fds[0]);
	assert_int_equal(sbx_token_file_read(&tok, path), 0);
	assert_string_equal(tok, "piped");
	sbx_token_free(tok);
	close(fds[0]);
}

static void test_equal(void **state)
{
	assert_true(sbx_token_equal("abc", 3, "abc"));
	assert_false(sbx_token_equal("abc", 3, "abd"));
	assert_false(sbx_token_equal("abc", 3, "ab"));
	assert_false(sbx_token_equal("abc", 3, "abcd"));
	assert_false(sbx_token_equal("abc", 3, ""));
	assert_false(sbx_token_equal("abc", 3, NULL));
	assert_false(sbx_token_equal(NULL, 0, "x"));
}

static void test_random(void **state)
{
	char a[65], b[65];

	assert_int_equal(sbx_token_random(a, 32), 0);
	assert_int_equal(sbx_token_random(b, 32), 0);
	assert_int_equal(strlen(a), 64);
	assert_int_equal(strspn(a, "0123456789abcdef"), 64);
	assert_string_not_equal(a, b);
	sbx_token_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_first_line),
		cmocka_unit_test(test_open_to_others_refused),
		cmocka_unit_test(test_bad_content),
		cmocka_unit_test(test_pipe),
		cmocka_unit_test(test_equal),
		cmocka_unit_test(test_random),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
