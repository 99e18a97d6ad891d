/*
 * Unit tests: the header-line parser of lib/http.c, shared by the remote
 * provider's client and the Modal gRPC channel.  (The CURLcode mapping is
 * covered in test_pcommon.c.)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "sbx/http.h"

static const char *val(const char *line, const char *name, size_t *vl)
{
	return sbx_http_header_value(line, strlen(line), name, vl);
}

static void test_header_value(void **state)
{
	size_t vl = 99;
	const char *v;

	v = val("X-Sbx-Size: 1234\r\n", "x-sbx-size", &vl);
	assert_non_null(v);
	assert_int_equal(vl, 4);
	assert_memory_equal(v, "1234", 4);
	/* Blanks around the value go; inner ones stay. */
	v = val("grpc-message:\t  a b  \r\n", "grpc-message", &vl);
	assert_int_equal(vl, 3);
	assert_memory_equal(v, "a b", 3);
	/* An empty value is a value. */
	v = val("X-Sbx-Agent:\r\n", "X-Sbx-Agent", &vl);
	assert_non_null(v);
	assert_int_equal(vl, 0);
	/* A prefix of another name, another header, or no colon: none. */
	assert_null(val("X-Sbx-Sizes: 1\r\n", "X-Sbx-Size", &vl));
	assert_null(val("Retry-After 5\r\n", "Retry-After", &vl));
	assert_null(val("Retry-After", "Retry-After", &vl));
	assert_null(val("HTTP/2 200\r\n", "grpc-status", &vl));
	/* Only `n` bytes are read: the line need not be NUL-terminated. */
	v = sbx_http_header_value("grpc-status: 14XXXX", 15, "grpc-status",
				  &vl);
	assert_int_equal(vl, 2);
	assert_memory_equal(v, "14", 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_header_value),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
