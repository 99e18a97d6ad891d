/*
 * Unit tests: providers/provider.c (the registry's ops-version checks,
 * sbx_provider_open()) and the state names of lib/state.c
 * (sbx/sessionstate.h).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "sbx/provider.h"
#include "sbx/sessionstate.h"

/* A fake provider whose open() hands out a sandbox of a chosen version. */
static unsigned sandbox_version;
static int sandboxes_freed;

static void fake_sb_free(struct sbx_sandbox *sb)
{
	sandboxes_freed++;
	free(sb);
}

static struct sbx_sandbox_ops fake_sb_ops = {
	.free = fake_sb_free,
};

static int fake_open(struct sbx_provider *p, const char *session,
		     struct sbx_sandbox **out)
{
	struct sbx_sandbox *sb = calloc(1, sizeof(*sb));

	(void)p;
	(void)session;
	assert_non_null(sb);
	fake_sb_ops.version = sandbox_version;
	sb->ops = &fake_sb_ops;
	*out = sb;
	return 0;
}

static const struct sbx_provider_ops fake_ops = {
	.version = SBX_PROVIDER_OPS_VERSION,
	.name = "fake",
	.open = fake_open,
};

static const struct sbx_provider_ops future_ops = {
	.version = SBX_PROVIDER_OPS_VERSION + 41,
	.name = "future",
};

static void test_provider_ops_version(void **state)
{
	const struct sbx_error *e;

	(void)state;
	assert_int_equal(sbx_provider_ops_check(&fake_ops, "fake"), 0);
	assert_int_equal(sbx_provider_ops_check(&future_ops, "future"),
			 -EPROTO);
	e = sbx_error_last();
	assert_int_equal(e->klass, SBX_ERR_INTERNAL);
	assert_non_null(strstr(e->msg, "provider future"));
	assert_non_null(strstr(e->msg, "version 42"));
	assert_non_null(strstr(e->msg, "expected 1"));
	sbx_error_clear();
}

static void test_open_checks_sandbox_version(void **state)
{
	struct sbx_provider p = { .ops = &fake_ops };
	struct sbx_sandbox *sb = (struct sbx_sandbox *)&p; /* overwritten */
	const struct sbx_error *e;

	(void)state;
	sandboxes_freed = 0;
	sandbox_version = SBX_SANDBOX_OPS_VERSION;
	assert_int_equal(sbx_provider_open(&sb, &p, "s"), 0);
	assert_non_null(sb);
	assert_int_equal(sb->ops->version, SBX_SANDBOX_OPS_VERSION);
	sbx_sandbox_free(sb);
	assert_int_equal(sandboxes_freed, 1);

	/* Another version: refused, released, *out stays NULL. */
	sandbox_version = SBX_SANDBOX_OPS_VERSION + 6;
	sb = (struct sbx_sandbox *)&p;
	assert_int_equal(sbx_provider_open(&sb, &p, "s"), -EPROTO);
	assert_null(sb);
	assert_int_equal(sandboxes_freed, 2);
	e = sbx_error_last();
	assert_int_equal(e->klass, SBX_ERR_INTERNAL);
	assert_non_null(strstr(e->msg, "provider fake"));
	assert_non_null(strstr(e->msg, "sandbox ops version 7"));
	assert_non_null(strstr(e->msg, "expected 1"));
	sbx_error_clear();
}

static void test_open_without_open(void **state)
{
	struct sbx_provider p = { .ops = &future_ops };
	struct sbx_sandbox *sb = NULL;

	(void)state;
	assert_int_equal(sbx_provider_open(&sb, &p, "s"), -ENOSYS);
	assert_null(sb);
	sbx_error_clear();
}

static void test_unknown_provider(void **state)
{
	struct sbx_provider *p = (struct sbx_provider *)&p;

	(void)state;
	assert_int_equal(sbx_provider_new(&p, "nosuch", NULL), -ENOENT);
	assert_null(p);
	assert_non_null(strstr(sbx_error_last()->msg, "local"));
	sbx_error_clear();
}

static void test_state_names(void **state)
{
	static const char *const names[] = { "creating", "ready", "stopped",
					     "error" };

	(void)state;
	for (int i = 0; i < 4; i++) {
		assert_string_equal(sbx_state_name((enum sbx_state)i),
				    names[i]);
		assert_int_equal(sbx_state_parse(names[i]), i);
	}
	assert_string_equal(sbx_state_name((enum sbx_state)17), "error");
	assert_string_equal(sbx_state_name((enum sbx_state)-1), "error");
	assert_int_equal(sbx_state_parse(NULL), SBX_STATE_ERROR);
	assert_int_equal(sbx_state_parse("Ready"), SBX_STATE_ERROR);
	assert_int_equal(sbx_state_parse(""), SBX_STATE_ERROR);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_provider_ops_version),
		cmocka_unit_test(test_open_checks_sandbox_version),
		cmocka_unit_test(test_open_without_open),
		cmocka_unit_test(test_unknown_provider),
		cmocka_unit_test(test_state_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
