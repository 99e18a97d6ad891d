/* Unit tests: lib/json.c (JSONC parsing, getters, merge, times). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/json.h"

static cJSON *parse(const char *text)
{
	cJSON *j = NULL;

	assert_int_equal(sbx_json_parse(&j, text, strlen(text), "t.json"), 0);
	assert_non_null(j);
	return j;
}

static void expect_error(const char *text, const char *msg_prefix)
{
	cJSON *j = (cJSON *)1;

	assert_int_equal(sbx_json_parse(&j, text, strlen(text), "t.json"),
			 -EINVAL);
	assert_null(j);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_JSON);
	if (strncmp(sbx_error_last()->msg, msg_prefix, strlen(msg_prefix)))
		fail_msg("message '%s' does not start with '%s'",
			 sbx_error_last()->msg, msg_prefix);
}

static void test_comments(void **state)
{
	cJSON *j = parse("// leading comment\n"
			 "{ /* block\n comment */ \"a\": 1, // tail\n"
			 "  \"url\": \"http://x/*y*/\" }\n");

	assert_int_equal(cJSON_GetObjectItem(j, "a")->valueint, 1);
	assert_string_equal(sbx_json_str(j, "url"), "http://x/*y*/");
	cJSON_Delete(j);
}

static void test_trailing_commas(void **state)
{
	cJSON *j = parse("{\"a\": [1, 2, 3, ], \"b\": {\"c\": \",]\",},}");

	assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(j, "a")), 3);
	assert_string_equal(
		sbx_json_str(cJSON_GetObjectItem(j, "b"), "c"), ",]");
	cJSON_Delete(j);
}

static void test_errors_have_lines(void **state)
{
	expect_error("{\n  \"a\": 1,\n  \"b\": ?\n}", "t.json:3:");
	expect_error("{\n\"a\": 1 /* never closed\n", "t.json:2:");
	expect_error("", "t.json:1:1: empty");
	expect_error("  \n // only a comment\n", "t.json:3:1: empty");
	expect_error("{\"a\": 1} trailing", "t.json:1:");
	expect_error("{\"a\": ", "t.json:1:");
	expect_error("[1,,]", "t.json:1:");
}

static void test_nul_byte(void **state)
{
	cJSON *j = NULL;

	assert_int_equal(sbx_json_parse(&j, "{}\0{}", 5, "n"), -EINVAL);
	assert_string_equal(sbx_error_last()->msg,
			    "n:1:3: NUL byte in JSON text");
	/* U+0000 in a string would cut it as a C string: refused too. */
	expect_error("{\"p\": \"a\\u0000b\"}",
		     "t.json:1:9: \\u0000 (a NUL character) in a string");
	expect_error("[\"\\u0000\"]", "t.json:1:3: \\u0000");
	expect_error("{\"k\\u0000\": 1}", "t.json:1:4: \\u0000");
	/* An escaped quote does not end the string. */
	expect_error("{\"c\": \"\\\"\\u0000\"}", "t.json:1:10: \\u0000");
	/* Other escapes and an escaped backslash before "u0000" are fine. */
	j = parse("{\"a\": \"x\\\\u0000\", \"b\": \"\\u0001\\u1000\"}");
	assert_string_equal(sbx_json_str(j, "a"), "x\\u0000");
	cJSON_Delete(j);
}

static void test_getters(void **state)
{
	cJSON *j = parse("{\"s\": \"x\", \"b\": true, \"n\": 7, \"f\": 1.5, "
			 "\"o\": {}, \"z\": null}");
	const char *s;
	const cJSON *o;
	long long n;
	bool b;

	assert_int_equal(sbx_json_get_string(&s, j, "s", "w"), 0);
	assert_string_equal(s, "x");
	assert_int_equal(sbx_json_get_string(&s, j, "missing", "w"), 0);
	assert_null(s);
	assert_int_equal(sbx_json_get_string(&s, j, "z", "w"), 0);
	assert_null(s);
	assert_int_equal(sbx_json_get_string(&s, j, "b", "w"), -EINVAL);
	assert_string_equal(sbx_error_last()->msg,
			    "w: \"b\" must be a string, not boolean");
	assert_int_equal(sbx_json_get_bool(&b, j, "b", false, "w"), 0);
	assert_true(b);
	assert_int_equal(sbx_json_get_bool(&b, j, "none", true, "w"), 0);
	assert_true(b);
	assert_int_equal(sbx_json_get_bool(&b, j, "n", true, "w"), -EINVAL);
	assert_int_equal(sbx_json_get_int(&n, j, "n", 0, "w"), 0);
	assert_int_equal(n, 7);
	assert_int_equal(sbx_json_get_int(&n, j, "f", 0, "w"), -EINVAL);
	assert_int_equal(sbx_json_get_object(&o, j, "o", "w"), 0);
	assert_non_null(o);
	assert_int_equal(sbx_json_get_object(&o, j, "s", "w"), -EINVAL);
	cJSON_Delete(j);
}

static void test_merge(void **state)
{
	cJSON *dst = parse("{\"a\": 1, \"o\": {\"x\": 1, \"y\": 2}, "
			   "\"r\": {\"k\": 1}}");
	cJSON *src = parse("{\"a\": 2, \"o\": {\"y\": 3, \"z\": 4}, "
			   "\"r\": \"flat\", \"n\": [1]}");
	char *s;

	sbx_json_merge(dst, src);
	s = sbx_json_print(dst, false);
	assert_string_equal(s, "{\"a\":2,\"o\":{\"x\":1,\"y\":3,\"z\":4},"
			       "\"r\":\"flat\",\"n\":[1]}");
	free(s);
	cJSON_Delete(dst);
	cJSON_Delete(src);
}

static void test_time(void **state)
{
	char buf[32];
	time_t t;

	assert_string_equal(sbx_json_time_format(buf, sizeof(buf), 0),
			    "1970-01-01T00:00:00Z");
	assert_int_equal(sbx_json_time_parse(&t, "2024-01-31T12:00:00Z"), 0);
	assert_int_equal(t, 1706702400);
	assert_int_equal(sbx_json_time_parse(&t, "2024-01-31T13:30:00.25+01:30"),
			 0);
	assert_int_equal(t, 1706702400);
	assert_int_equal(sbx_json_time_parse(&t, "yesterday"), -EINVAL);
	assert_int_equal(sbx_json_time_parse(&t, "2024-01-31T12:00:00"),
			 -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_comments),
		cmocka_unit_test(test_trailing_commas),
		cmocka_unit_test(test_errors_have_lines),
		cmocka_unit_test(test_nul_byte),
		cmocka_unit_test(test_getters),
		cmocka_unit_test(test_merge),
		cmocka_unit_test(test_time),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
