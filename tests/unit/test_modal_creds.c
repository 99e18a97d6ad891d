/*
 * Modal credentials (providers/modal/modal_creds.c) and the TOML subset
 * reader under them (providers/modal/toml_min.c): what ~/.modal.toml may
 * hold, every refused construct with its line, environment over file,
 * MODAL_PROFILE over `active`, and the messages when no token is found.
 * Each test runs in a fresh temporary $HOME with the MODAL_* variables
 * cleared.
 */
#include "config.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/error.h"
#include "../../providers/modal/modal_creds.h"
#include "../../providers/modal/toml_min.h"
#include "test_helpers_i.h"

static const char *const cleared[] = {
	"MODAL_TOKEN_ID",   "MODAL_TOKEN_SECRET", "MODAL_ENVIRONMENT",
	"MODAL_SERVER_URL", "MODAL_CONFIG_PATH",  "MODAL_PROFILE", NULL,
};

static char *tmp; /* this test's directory, also $HOME */
static char *old_home;

TH_HOME_FIXTURE(tmp, old_home, cleared)

static char *home_file(const char *name, const char *text)
{
	char *path = NULL;

	if (asprintf(&path, "%s/%s", tmp, name) < 0)
		abort();
	th_write(path, text);
	return path;
}

static void assert_msg_has(const char *needle)
{
	const char *msg = sbx_error_last()->msg;

	if (!strstr(msg, needle))
		fail_msg("message \"%s\" lacks \"%s\"", msg, needle);
}

/* ---- the TOML subset ------------------------------------------------------- */

static void test_toml_accepts_the_subset(void **state)
{
	static const char text[] =
		"\xef\xbb\xbf# Modal config\n"
		"root_key = 'r'\n"
		"\n"
		"[default]  # trailing comment\n"
		"token_id = \"ak-1\"\n"
		"token_secret = 'as-\\literal'\n"
		"active = true\r\n"
		"\t count = -1_000 \n"
		"zero = 0\n"
		"\"quoted key\" = \"tab\\there \\\"q\\\" \\\\ \\u00fc \\U0001F600\"\n"
		"[\"my profile\"]\n"
		"active = false\n"
		"empty = \"\"\n"
		"['lit name']\n"
		"x = +7";
	struct toml_min_doc doc;
	const struct toml_min_table *t;
	const struct toml_min_kv *kv;

	assert_int_equal(toml_min_parse(&doc, text, sizeof(text) - 1, "t"), 0);
	assert_int_equal(doc.ntables, 4);
	kv = toml_min_get(toml_min_table(&doc, ""), "root_key");
	assert_non_null(kv);
	assert_string_equal(kv->str, "r");

	t = toml_min_table(&doc, "default");
	assert_non_null(t);
	assert_int_equal(t->line, 4);
	assert_string_equal(toml_min_get(t, "token_id")->str, "ak-1");
	assert_string_equal(toml_min_get(t, "token_secret")->str,
			    "as-\\literal");
	kv = toml_min_get(t, "active");
	assert_int_equal(kv->type, TOML_MIN_BOOL);
	assert_true(kv->b);
	kv = toml_min_get(t, "count");
	assert_int_equal(kv->type, TOML_MIN_INT);
	assert_int_equal(kv->i, -1000);
	assert_int_equal(kv->line, 8);
	assert_int_equal(toml_min_get(t, "zero")->i, 0);
	assert_string_equal(toml_min_get(t, "quoted key")->str,
			    "tab\there \"q\" \\ \xc3\xbc \xf0\x9f\x98\x80");

	t = toml_min_table(&doc, "my profile");
	assert_non_null(t);
	assert_false(toml_min_get(t, "active")->b);
	assert_string_equal(toml_min_get(t, "empty")->str, "");
	t = toml_min_table(&doc, "lit name");
	assert_int_equal(toml_min_get(t, "x")->i, 7);
	assert_null(toml_min_get(t, "nope"));
	assert_null(toml_min_table(&doc, "nope"));
	toml_min_fini(&doc);
	toml_min_fini(&doc); /* idempotent */
}

static void test_toml_errors_name_file_and_line(void **state)
{
	static const struct {
		const char *text;
		const char *where;  /* "<what>:<line>:" */
		const char *why;
	} cases[] = {
		{"[a]\nx = [1, 2]\n", "f.toml:2:", "arrays are not supported"},
		{"[a]\n\nx = { y = 1 }\n", "f.toml:3:", "inline tables"},
		{"x = \"\"\"multi\nline\"\"\"\n", "f.toml:1:", "multi-line"},
		{"\n\nx = '''m'''\n", "f.toml:3:", "multi-line"},
		{"a.b = 1\n", "f.toml:1:", "dotted keys"},
		{"[a.b]\n", "f.toml:1:", "dotted keys"},
		{"[[arr]]\n", "f.toml:1:", "arrays of tables"},
		{"x = 1.5\n", "f.toml:1:", "floats and dates"},
		{"x = 1e3\n", "f.toml:1:", "floats and dates"},
		{"x = 2024-01-01\n", "f.toml:1:", "floats and dates"},
		{"x = inf\n", "f.toml:1:", "floats"},
		{"x = 0x1f\n", "f.toml:1:", "only decimal"},
		{"x = 012\n", "f.toml:1:", "leading zeros"},
		{"x = 1__0\n", "f.toml:1:", "bad '_'"},
		{"x = 99999999999999999999\n", "f.toml:1:", "out of range"},
		{"x = \"open\n", "f.toml:1:", "unterminated string"},
		{"x = \"bad \\q\"\n", "f.toml:1:", "unknown escape"},
		{"x = \"\\u12\"\n", "f.toml:1:", "\\u escape"},
		{"x = \"\\ud800\"\n", "f.toml:1:", "not a valid character"},
		{"x = yes\n", "f.toml:1:", "expected a value"},
		{"x =\n", "f.toml:1:", "expected a value"},
		{"x 1\n", "f.toml:1:", "expected '='"},
		{"= 1\n", "f.toml:1:", "expected a key"},
		{"x = 1 2\n", "f.toml:1:", "unexpected text after the value"},
		{"[a] x\n", "f.toml:1:", "unexpected text after the table"},
		{"[a\n", "f.toml:1:", "expected ']'"},
		{"[\"\"]\n", "f.toml:1:", "empty table name"},
		{"[a]\n[b]\n[a]\n", "f.toml:3:", "defined twice (first on line 1)"},
		{"[a]\nx = 1\nx = 2\n", "f.toml:3:", "\"x\" defined twice"},
		{"x = \"a\x01\"\n", "f.toml:1:", "control character"},
		{"x = true2\n", "f.toml:1:", "expected a value"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct toml_min_doc doc;
		int rc = toml_min_parse(&doc, cases[i].text,
					strlen(cases[i].text), "f.toml");

		if (rc != -EINVAL)
			fail_msg("case %zu (%s): rc %d", i, cases[i].text, rc);
		assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
		if (strncmp(sbx_error_last()->msg, cases[i].where,
			    strlen(cases[i].where)))
			fail_msg("case %zu: \"%s\" does not start with %s", i,
				 sbx_error_last()->msg, cases[i].where);
		assert_msg_has(cases[i].why);
		assert_int_equal(doc.ntables, 0);
		sbx_error_clear();
	}
}

static void test_toml_nul_byte(void **state)
{
	struct toml_min_doc doc;

	assert_int_equal(toml_min_parse(&doc, "x = 1\ny\0 = 2\n", 13, "n"),
			 -EINVAL);
	assert_msg_has("n:2: NUL byte");
}

static void test_toml_error_never_shows_values(void **state)
{
	struct toml_min_doc doc;
	const char *text = "token_secret = \"s3cr3t-value\" trailing\n";

	assert_int_equal(toml_min_parse(&doc, text, strlen(text), "f"),
			 -EINVAL);
	assert_null(strstr(sbx_error_last()->msg, "s3cr3t"));
}

static void test_toml_file_missing_and_not_regular(void **state)
{
	struct toml_min_doc doc;
	char *p = NULL;

	if (asprintf(&p, "%s/none.toml", tmp) < 0)
		abort();
	assert_int_equal(toml_min_parse_file(&doc, p), -ENOENT);
	free(p);
	assert_int_equal(toml_min_parse_file(&doc, tmp), -EINVAL);
	assert_msg_has("not a regular file");
}

/* ---- credentials ------------------------------------------------------------ */

static void test_creds_from_active_profile(void **state)
{
	struct sbx_modal_creds c;
	char *p = home_file(".modal.toml",
			    "[first]\n"
			    "token_id = \"ak-first\"\n"
			    "token_secret = \"as-first\"\n"
			    "\n"
			    "[second]\n"
			    "token_id = \"ak-second\"\n"
			    "token_secret = \"as-second\"\n"
			    "environment = \"dev\"\n"
			    "active = true\n");

	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.token_id, "ak-second");
	assert_string_equal(c.token_secret, "as-second");
	assert_string_equal(c.environment, "dev");
	assert_string_equal(c.server_url, MODAL_DEFAULT_SERVER_URL);
	assert_string_equal(c.profile, "second");
	assert_non_null(strstr(c.source, p));
	assert_non_null(strstr(c.source, "\"second\""));
	sbx_modal_creds_fini(&c);
	assert_null(c.token_id);
	sbx_modal_creds_fini(NULL);
	free(p);
}

static void test_creds_modal_profile_beats_active(void **state)
{
	struct sbx_modal_creds c;
	char *p = home_file(".modal.toml",
			    "[a]\ntoken_id = \"ak-a\"\ntoken_secret = \"as-a\"\n"
			    "active = true\n"
			    "[b]\ntoken_id = \"ak-b\"\ntoken_secret = \"as-b\"\n"
			    "server_url = \"https://b.example:443\"\n");

	setenv("MODAL_PROFILE", "b", 1);
	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.token_id, "ak-b");
	assert_string_equal(c.server_url, "https://b.example:443");
	assert_string_equal(c.profile, "b");
	assert_null(c.environment);
	sbx_modal_creds_fini(&c);

	setenv("MODAL_PROFILE", "nope", 1);
	assert_int_equal(sbx_modal_creds_load(&c), -EINVAL);
	assert_msg_has("\"nope\"");
	assert_msg_has("MODAL_PROFILE");
	assert_msg_has(p);
	sbx_modal_creds_fini(&c);
	free(p);
}

static void test_creds_only_table_and_default(void **state)
{
	struct sbx_modal_creds c;
	char *p = home_file(".modal.toml",
			    "[only]\ntoken_id = 'ak-o'\ntoken_secret = 'as-o'\n");

	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.profile, "only");
	sbx_modal_creds_fini(&c);
	free(p);

	p = home_file(".modal.toml",
		      "[x]\ntoken_id = 'ak-x'\ntoken_secret = 'as-x'\n"
		      "[default]\ntoken_id = 'ak-d'\ntoken_secret = 'as-d'\n");
	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.token_id, "ak-d");
	sbx_modal_creds_fini(&c);
	free(p);
}

static void test_creds_env_overrides_file(void **state)
{
	struct sbx_modal_creds c;
	char *p = home_file("cfg.toml",
			    "[p]\ntoken_id = \"ak-file\"\n"
			    "token_secret = \"as-file\"\n"
			    "environment = \"file-env\"\n"
			    "server_url = \"https://file.example\"\n");

	setenv("MODAL_CONFIG_PATH", p, 1);
	setenv("MODAL_TOKEN_ID", "ak-env", 1);
	setenv("MODAL_ENVIRONMENT", "env-env", 1);
	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.token_id, "ak-env");
	assert_string_equal(c.token_secret, "as-file");
	assert_string_equal(c.environment, "env-env");
	assert_string_equal(c.server_url, "https://file.example");
	assert_non_null(strstr(c.source, "environment and"));
	sbx_modal_creds_fini(&c);

	setenv("MODAL_TOKEN_SECRET", "as-env", 1);
	setenv("MODAL_SERVER_URL", "https://env.example", 1);
	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.token_secret, "as-env");
	assert_string_equal(c.server_url, "https://env.example");
	assert_string_equal(c.source, "environment");
	sbx_modal_creds_fini(&c);
	free(p);
}

static void test_creds_env_only_no_file(void **state)
{
	struct sbx_modal_creds c;

	setenv("MODAL_TOKEN_ID", "ak-e", 1);
	setenv("MODAL_TOKEN_SECRET", "as-e", 1);
	assert_int_equal(sbx_modal_creds_load(&c), 0);
	assert_string_equal(c.token_id, "ak-e");
	assert_string_equal(c.source, "environment");
	assert_null(c.profile);
	assert_string_equal(c.server_url, MODAL_DEFAULT_SERVER_URL);
	sbx_modal_creds_fini(&c);
}

static void test_creds_missing_token(void **state)
{
	struct sbx_modal_creds c;
	char *p;

	/* No file, no environment. */
	assert_int_equal(sbx_modal_creds_load(&c), -EACCES);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_msg_has("modal token new");
	assert_msg_has("MODAL_TOKEN_ID");
	assert_msg_has("MODAL_TOKEN_SECRET");
	sbx_modal_creds_fini(&c);

	/* A profile without a secret. */
	p = home_file(".modal.toml", "[p]\ntoken_id = \"ak-p\"\n");
	assert_int_equal(sbx_modal_creds_load(&c), -EACCES);
	assert_msg_has("profile \"p\"");
	assert_msg_has("no token_secret");
	assert_msg_has("modal token new");
	sbx_modal_creds_fini(&c);
	free(p);

	/* Several profiles, none active. */
	p = home_file(".modal.toml",
		      "[a]\ntoken_id = 'x'\ntoken_secret = 'y'\n"
		      "[b]\ntoken_id = 'x'\ntoken_secret = 'y'\n");
	assert_int_equal(sbx_modal_creds_load(&c), -EACCES);
	assert_msg_has("none is active");
	assert_msg_has("MODAL_PROFILE");
	sbx_modal_creds_fini(&c);
	free(p);
}

static void test_creds_bad_file(void **state)
{
	struct sbx_modal_creds c;
	char *p = home_file(".modal.toml",
			    "[p]\ntoken_id = \"ak\"\ntoken_secret = [\"x\"]\n");

	/* Even with the tokens in the environment: the file is broken. */
	setenv("MODAL_TOKEN_ID", "ak-e", 1);
	setenv("MODAL_TOKEN_SECRET", "as-e", 1);
	assert_int_equal(sbx_modal_creds_load(&c), -EINVAL);
	assert_msg_has(":3: arrays are not supported");
	assert_msg_has(p);
	sbx_modal_creds_fini(&c);
	free(p);

	unsetenv("MODAL_TOKEN_ID");
	unsetenv("MODAL_TOKEN_SECRET");
	p = home_file(".modal.toml",
		      "[p]\ntoken_id = 42\ntoken_secret = \"s\"\n");
	assert_int_equal(sbx_modal_creds_load(&c), -EINVAL);
	assert_msg_has(":2: \"token_id\" of profile \"p\" must be a string");
	sbx_modal_creds_fini(&c);
	free(p);
}

static void test_creds_never_print_secrets(void **state)
{
	struct sbx_modal_creds c;
	char *p = home_file(".modal.toml",
			    "[p]\ntoken_secret = \"as-very-secret\"\n");

	assert_int_equal(sbx_modal_creds_load(&c), -EACCES);
	assert_null(strstr(sbx_error_last()->msg, "as-very-secret"));
	sbx_modal_creds_fini(&c);
	free(p);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_toml_accepts_the_subset),
		T(test_toml_errors_name_file_and_line),
		T(test_toml_nul_byte),
		T(test_toml_error_never_shows_values),
		T(test_toml_file_missing_and_not_regular),
		T(test_creds_from_active_profile),
		T(test_creds_modal_profile_beats_active),
		T(test_creds_only_table_and_default),
		T(test_creds_env_overrides_file),
		T(test_creds_env_only_no_file),
		T(test_creds_missing_token),
		T(test_creds_bad_file),
		T(test_creds_never_print_secrets),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
