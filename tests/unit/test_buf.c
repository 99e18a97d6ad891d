/* Unit tests: lib/buf.c (size-capped dynamic buffer). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sbx/buf.h"

static void test_add_and_take(void **state)
{
	struct sbx_buf b;
	size_t len;
	char *s;

	sbx_buf_init(&b, 100);
	assert_string_equal(sbx_buf_ptr(&b), "");
	assert_int_equal(sbx_buf_add(&b, "abc", 3), 0);
	assert_int_equal(sbx_buf_adds(&b, "def"), 0);
	assert_int_equal(sbx_buf_addf(&b, "-%d-%s", 42, "x"), 0);
	assert_string_equal(sbx_buf_ptr(&b), "abcdef-42-x");
	assert_int_equal(sbx_buf_len(&b), 11);
	s = sbx_buf_take(&b, &len);
	assert_string_equal(s, "abcdef-42-x");
	assert_int_equal(len, 11);
	assert_int_equal(sbx_buf_len(&b), 0);
	free(s);
	sbx_buf_fini(&b);
}

static void test_cap(void **state)
{
	struct sbx_buf b;
	char big[64];

	memset(big, 'x', sizeof(big));
	sbx_buf_init(&b, 10);
	assert_int_equal(sbx_buf_add(&b, big, 10), 0);
	/* Exactly at the cap is fine; one more byte is not. */
	assert_int_equal(sbx_buf_add(&b, "y", 1), -EFBIG);
	assert_int_equal(sbx_buf_len(&b), 10);
	assert_int_equal(sbx_buf_addf(&b, "%s", "z"), -EFBIG);
	sbx_buf_reset(&b);
	assert_int_equal(sbx_buf_len(&b), 0);
	assert_int_equal(sbx_buf_add(&b, big, 11), -EFBIG);
	assert_int_equal(sbx_buf_len(&b), 0);
	/* Huge lengths must not overflow the size check. */
	assert_int_equal(sbx_buf_add(&b, big, SIZE_MAX), -EFBIG);
	sbx_buf_fini(&b);
}

static void test_growth(void **state)
{
	struct sbx_buf b;

	sbx_buf_init(&b, 1 << 20);
	for (int i = 0; i < 10000; i++)
		assert_int_equal(sbx_buf_add(&b, "0123456789", 10), 0);
	assert_int_equal(sbx_buf_len(&b), 100000);
	assert_int_equal(strlen(sbx_buf_ptr(&b)), 100000);
	sbx_buf_fini(&b);
	sbx_buf_fini(NULL);
}

/* cap SIZE_MAX ("no cap") must not wrap when clamping the allocation. */
static void test_uncapped(void **state)
{
	struct sbx_buf b;
	char chunk[1000];

	memset(chunk, 'x', sizeof(chunk));
	sbx_buf_init(&b, SIZE_MAX);
	for (int i = 0; i < 100; i++)
		assert_int_equal(sbx_buf_add(&b, chunk, sizeof(chunk)), 0);
	assert_int_equal(sbx_buf_len(&b), 100000);
	assert_true(b.alloc > 100000);
	assert_int_equal(((const char *)sbx_buf_ptr(&b))[99999], 'x');
	sbx_buf_fini(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_add_and_take),
		cmocka_unit_test(test_cap),
		cmocka_unit_test(test_growth),
		cmocka_unit_test(test_uncapped),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
