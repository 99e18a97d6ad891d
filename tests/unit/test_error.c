/*
 * Thread-local typed errors (lib/error.c): set, prefix, clear, and the
 * restore of a saved error across cleanup that sets its own.
 */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "sbx/error.h"

static void test_set_and_prefix(void **state)
{
	(void)state;
	assert_int_equal(sbx_error_setd(SBX_ERR_HTTP, -EIO, 503, "HTTP %d", 503),
			 -EIO);
	assert_int_equal(sbx_error_prefix(-EIO, "GET /v1/info"), -EIO);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_HTTP);
	assert_int_equal(sbx_error_last()->detail, 503);
	assert_string_equal(sbx_error_last()->msg, "GET /v1/info: HTTP 503");
	sbx_error_clear();
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_NONE);
}

static void test_restore_after_cleanup(void **state)
{
	struct sbx_error saved;

	(void)state;
	sbx_error_setd(SBX_ERR_REMOTE, -ENOTEMPTY, 7, "/ is not empty");
	saved = *sbx_error_last();
	/* cleanup fails on its own and overwrites the slot */
	sbx_error_set(SBX_ERR_OS, -EACCES, "remove /x: denied");
	assert_int_equal(sbx_error_restore(&saved), -ENOTEMPTY);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_int_equal(sbx_error_last()->code, -ENOTEMPTY);
	assert_int_equal(sbx_error_last()->detail, 7);
	assert_string_equal(sbx_error_last()->msg, "/ is not empty");
	/* restoring the slot itself changes nothing */
	assert_int_equal(sbx_error_restore(sbx_error_last()), -ENOTEMPTY);
	assert_string_equal(sbx_error_last()->msg, "/ is not empty");
	sbx_error_clear();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_set_and_prefix),
		cmocka_unit_test(test_restore_after_cleanup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
