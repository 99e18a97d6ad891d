/* Unit tests: lib/status.c (status object keys, mountinfo parsing). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/json.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "test_helpers_i.h"

static void assert_keys(const cJSON *j, const char *const *keys)
{
	const cJSON *it;
	size_t n = 0, i;

	cJSON_ArrayForEach(it, j) {
		for (i = 0; keys[i]; i++)
			if (strcmp(keys[i], it->string) == 0)
				break;
		if (!keys[i])
			fail_msg("unexpected key %s", it->string);
		n++;
	}
	for (i = 0; keys[i]; i++)
		;
	assert_int_equal(n, i);
}

static void test_keys(void **state)
{
	static const char *const base[] = {
		"session", "provider", "sandbox_id", "state", "remote",
		"mountpoint", "workdir", "created_at", "isolation", "mounted",
		"pid", NULL,
	};
	static const char *const with_error[] = {
		"session", "provider", "sandbox_id", "state", "remote",
		"mountpoint", "workdir", "created_at", "isolation", "mounted",
		"pid", "error", NULL,
	};
	struct sbx_session s;
	cJSON *j;
	const cJSON *e;

	sbx_session_init(&s);
	s.session = sbx_xstrdup("x");
	s.provider = sbx_xstrdup("local");
	s.state = SBX_STATE_STOPPED;
	s.created_at = 1706702400;
	s.pid = 99;
	j = sbx_status_build(&s, false);
	assert_keys(j, base);
	assert_string_equal(sbx_json_str(j, "state"), "stopped");
	assert_string_equal(sbx_json_str(j, "created_at"),
			    "2024-01-31T12:00:00Z");
	assert_true(cJSON_IsNull(cJSON_GetObjectItem(j, "sandbox_id")));
	assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "remote")));
	assert_true(cJSON_IsFalse(cJSON_GetObjectItem(j, "mounted")));
	/* A pid is only reported for a live mount. */
	assert_int_equal(cJSON_GetObjectItem(j, "pid")->valueint, 0);
	cJSON_Delete(j);

	sbx_session_set_error(&s, SBX_STATUS_CREATE_ERROR, "no repo");
	j = sbx_status_build(&s, true);
	assert_keys(j, with_error);
	assert_int_equal(cJSON_GetObjectItem(j, "pid")->valueint, 99);
	e = cJSON_GetObjectItem(j, "error");
	assert_string_equal(sbx_json_str(e, "type"), "CreateError");
	assert_string_equal(sbx_json_str(e, "message"), "no repo");
	assert_int_equal(cJSON_GetArraySize(e), 2);
	cJSON_Delete(j);

	/* Not mounted: no daemon of that pid, nothing in mountinfo. */
	s.mountpoint = sbx_xstrdup("/nonexistent/sbx/x");
	assert_false(sbx_status_mounted(&s));
	sbx_session_fini(&s);
}

static void test_error_types(void **state)
{
	assert_string_equal(sbx_status_error_type(SBX_ERR_CONFIG, "X"),
			    "ConfigError");
	assert_string_equal(sbx_status_error_type(SBX_ERR_NOTFOUND, "X"),
			    "NotFoundError");
	assert_string_equal(sbx_status_error_type(SBX_ERR_GIT, "CreateError"),
			    "CreateError");
}

static void test_mountinfo(void **state)
{
	char *tmp = th_tmpdir(), mi[4096];
	struct sbx_mount_entry e;

	snprintf(mi, sizeof(mi), "%s/mountinfo", tmp);
	th_write(mi,
		 "22 1 0:21 / / rw - ext4 /dev/sda1 rw\n"
		 "40 22 0:40 / /home/u/sbx/a rw,nosuid - fuse.sbx sbx:a rw\n"
		 "41 22 0:41 / /home/u/my\\040dir rw - fuse.sbx sbx:b rw\n"
		 "42 22 0:42 / /home/u/sbx/c rw - tmpfs tmpfs rw\n"
		 "43 42 0:43 / /home/u/sbx/c rw shared:1 - fuse.sbx sbx:c rw\n");
	assert_int_equal(sbx_mountinfo_find(&e, mi, "/home/u/sbx/a"), 0);
	assert_string_equal(e.fstype, "fuse.sbx");
	assert_string_equal(e.source, "sbx:a");
	sbx_mount_entry_fini(&e);
	assert_int_equal(sbx_mountinfo_find(&e, mi, "/home/u/my dir"), 0);
	assert_string_equal(e.source, "sbx:b");
	sbx_mount_entry_fini(&e);
	assert_int_equal(sbx_mountinfo_find(&e, mi, "/home/u/none"), -ENOENT);

	assert_true(sbx_status_is_sbx_mount(mi, "/home/u/sbx/a", "a"));
	assert_false(sbx_status_is_sbx_mount(mi, "/home/u/sbx/a", "b"));
	assert_true(sbx_status_is_sbx_mount(mi, "/home/u/my dir", "b"));
	/* The topmost of stacked mounts counts. */
	assert_true(sbx_status_is_sbx_mount(mi, "/home/u/sbx/c", "c"));
	assert_false(sbx_status_is_sbx_mount(mi, "/", "a"));
	th_rmrf(tmp);
	free(tmp);
}

static void test_daemon_alive(void **state)
{
	assert_false(sbx_status_daemon_alive(0));
	assert_false(sbx_status_daemon_alive(-1));
	/* This test process is alive but is not named sbxfs. */
	assert_false(sbx_status_daemon_alive(getpid()));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_keys),
		cmocka_unit_test(test_error_types),
		cmocka_unit_test(test_mountinfo),
		cmocka_unit_test(test_daemon_alive),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
