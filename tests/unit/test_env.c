/* Unit tests: lib/env.c (environment variables, empty meaning unset). */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "sbx/env.h"

static void test_unset_empty_set(void **state)
{
	unsetenv("SBX_TEST_ENV");
	assert_null(sbx_env_str("SBX_TEST_ENV"));
	assert_string_equal(sbx_env_or("SBX_TEST_ENV", "dflt"), "dflt");
	setenv("SBX_TEST_ENV", "", 1);
	assert_null(sbx_env_str("SBX_TEST_ENV"));
	assert_string_equal(sbx_env_or("SBX_TEST_ENV", "dflt"), "dflt");
	setenv("SBX_TEST_ENV", "v", 1);
	assert_string_equal(sbx_env_str("SBX_TEST_ENV"), "v");
	assert_string_equal(sbx_env_or("SBX_TEST_ENV", "dflt"), "v");
	assert_null(sbx_env_or("SBX_TEST_ENV_UNSET_TOO", NULL));
	unsetenv("SBX_TEST_ENV");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_unset_empty_set),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
