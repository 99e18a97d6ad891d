/*
 * Unit tests: the control-plane core of the kubernetes and modal providers
 * (providers/common/), the one curl-to-errno mapping (lib/http.c), and the
 * lock files a removed session leaves (lib/state.c).
 */
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

#include <cjson/cJSON.h>
#include <cmocka.h>
#include <curl/curl.h>

#include "sbx/http.h"
#include "sbx/json.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"
#include "pcommon.h"
#include "test_helpers_i.h"

static bool exists(const char *home, const char *rel)
{
	char *p = sbx_xasprintf("%s/%s", home, rel);
	struct stat st;
	bool ok = stat(p, &st) == 0;

	free(p);
	return ok;
}

/* ---- configuration -------------------------------------------------------- */

static void test_env_reserved_names(void **state)
{
	const char *bad[] = {
		"{\"env\": {\"SBX_AGENT_TOKEN\": \"x\"}}",
		"{\"env\": {\"SBX_SESSION\": \"x\"}}",
		"{\"env\": {\"1ABC\": \"x\"}}",
		"{\"env\": {\"A=B\": \"x\"}}",
		"{\"env\": {\"\": \"x\"}}",
		"{\"env\": {\"A\": 1}}",
		"{\"env\": [\"A=1\"]}",
	};
	const cJSON *out = NULL;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cJSON *sec = cJSON_Parse(bad[i]);

		assert_non_null(sec);
		assert_int_equal(pcommon_cfg_env("kubernetes", sec, "env", &out),
				 -EINVAL);
		assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
		assert_null(out);
		cJSON_Delete(sec);
	}
	{
		cJSON *sec = cJSON_Parse("{\"env\": {\"SBX_AGENT_TOKEN\": \"x\"}}");

		assert_int_equal(pcommon_cfg_env("modal", sec, "env", &out),
				 -EINVAL);
		assert_non_null(strstr(sbx_error_last()->msg,
				       "SBX_AGENT_TOKEN is reserved"));
		assert_non_null(strstr(sbx_error_last()->msg,
				       "configuration \"modal\""));
		cJSON_Delete(sec);
	}
	{
		cJSON *sec = cJSON_Parse("{\"env\": {\"LANG\": \"C.UTF-8\", "
					 "\"my.var-1\": \"ok\", \"_X\": \"\"}}");

		assert_int_equal(pcommon_cfg_env("kubernetes", sec, "env", &out),
				 0);
		assert_non_null(out);
		assert_int_equal(cJSON_GetArraySize(out), 3);
		cJSON_Delete(sec);
	}
	assert_true(pcommon_env_reserved("SBX_AGENT_TOKEN"));
	assert_false(pcommon_env_reserved("SBXFOO"));
	(void)state;
}

static void test_cfg_checkers(void **state)
{
	cJSON *sec = cJSON_Parse("{\"port\": 7070.5, \"ttl\": 10, "
				 "\"image\": \"\", \"flag\": 1, "
				 "\"secrets\": [\"a\", \"\"], \"cpu\": 0.25}");
	const cJSON *j = NULL;
	const char *s = NULL;
	long l = 0;
	double d = 0;
	bool b = true;

	assert_int_equal(pcommon_cfg_long("kubernetes", sec, "port", &l, 1, 1,
					  65535), -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "whole number"));
	assert_int_equal(pcommon_cfg_long("kubernetes", sec, "ttl", &l, 1, 60,
					  100), -EINVAL);
	assert_int_equal(pcommon_cfg_long("kubernetes", sec, "absent", &l, 42,
					  1, 100), 0);
	assert_int_equal(l, 42);
	assert_int_equal(pcommon_cfg_str("modal", sec, "image", &s, "d"),
			 -EINVAL);
	assert_int_equal(pcommon_cfg_bool("modal", sec, "flag", &b, false),
			 -EINVAL);
	assert_int_equal(pcommon_cfg_strings("k", sec, "secrets", &j), -EINVAL);
	assert_int_equal(pcommon_cfg_num("modal", sec, "cpu", &d, 0, 0, 512), 0);
	assert_true(d == 0.25);
	assert_int_equal(pcommon_cfg_object("modal", sec), 0);
	{
		cJSON *arr = cJSON_Parse("[1]");

		assert_int_equal(pcommon_cfg_object("modal", arr), -EINVAL);
		cJSON_Delete(arr);
	}
	/* A NULL section: every key absent. */
	assert_int_equal(pcommon_cfg_str("modal", NULL, "image", &s, "d"), 0);
	assert_string_equal(s, "d");
	cJSON_Delete(sec);
	(void)state;
}

/* ---- identity ---------------------------------------------------------------- */

static void test_identity(void **state)
{
	char a[17], b[17], r[65];

	pcommon_hash_hex(a, "host", "/home");
	pcommon_hash_hex(b, "host", "/home");
	assert_string_equal(a, b);
	pcommon_hash_hex(b, "hos", "t/home"); /* the NUL separates */
	assert_string_not_equal(a, b);
	pcommon_hash_hex(b, "host", NULL);
	assert_int_equal(strlen(b), 16);
	assert_int_equal(pcommon_home_id(a), 0);
	assert_int_equal(strlen(a), 16);
	pcommon_random_hex(r, 32);
	assert_int_equal(strlen(r), 64);
	(void)state;
}

/* ---- pins ---------------------------------------------------------------------- */

static int count_pins(const char *session, const cJSON *pin, void *payload)
{
	int *n = payload;

	assert_non_null(sbx_json_str(pin, "namespace"));
	(*n)++;
	return strcmp(session, "stop") ? 0 : 7;
}

static void test_pins(void **state)
{
	cJSON *pin = cJSON_CreateObject(), *got = NULL;
	int n = 0;

	/* No pin: 0 and NULL. */
	assert_int_equal(pcommon_pin_load(&got, "kubernetes", "s1"), 0);
	assert_null(got);
	sbx_json_set_str(pin, "namespace", "ns1");
	sbx_json_set_str(pin, "token", "secret");
	assert_int_equal(pcommon_pin_save("kubernetes", "s1", pin), 0);
	assert_int_equal(pcommon_pin_save("kubernetes", "s2", pin), 0);
	assert_int_equal(pcommon_pin_load(&got, "kubernetes", "s1"), 0);
	assert_string_equal(sbx_json_str(got, "namespace"), "ns1");
	cJSON_Delete(got);
	{
		char *path = NULL;
		struct stat st;

		assert_int_equal(pcommon_pin_path(&path, "kubernetes", "s1"), 0);
		assert_int_equal(stat(path, &st), 0);
		assert_int_equal(st.st_mode & 0777, 0600);
		free(path);
	}
	assert_int_equal(pcommon_pin_each("kubernetes", count_pins, &n), 0);
	assert_int_equal(n, 2);
	assert_int_equal(pcommon_pin_save("kubernetes", "stop", pin), 0);
	n = 0;
	assert_int_equal(pcommon_pin_each("kubernetes", count_pins, &n), 7);
	pcommon_pin_remove("kubernetes", "s1");
	pcommon_pin_remove("kubernetes", "s1"); /* absent: fine */
	assert_int_equal(pcommon_pin_load(&got, "kubernetes", "s1"), 0);
	assert_null(got);
	/* A provider that never pinned anything: nothing to walk. */
	n = 0;
	assert_int_equal(pcommon_pin_each("modal", count_pins, &n), 0);
	assert_int_equal(n, 0);
	cJSON_Delete(pin);
	(void)state;
}

/* ---- the snapshot store -------------------------------------------------------- */

static int collect(const struct sbx_snapshot_info *si, void *payload)
{
	cJSON *arr = payload;

	cJSON_AddItemToArray(arr, cJSON_CreateString(si->id));
	return 0;
}

static void test_snapshot_store(void **state)
{
	const char *home = *state;
	cJSON *ids = cJSON_CreateArray(), *f = cJSON_CreateObject(), *j = NULL;
	char id1[40], id2[40], *path = NULL;

	/* Listing a session never snapshotted makes no directory. */
	assert_int_equal(pcommon_snap_list("kubernetes", "s", collect, ids), 0);
	assert_int_equal(cJSON_GetArraySize(ids), 0);
	assert_false(exists(home, "kubernetes/snapshots/s"));
	/* Naming a file does not make one either (unless asked). */
	assert_int_equal(pcommon_snap_file(&path, "kubernetes", "s", "x",
					   ".tar", false), 0);
	free(path);
	assert_false(exists(home, "kubernetes/snapshots/s"));
	/* Bad ids. */
	assert_int_equal(pcommon_snap_file(&path, "kubernetes", "s", "../x",
					   ".tar", false), -EINVAL);
	assert_int_equal(pcommon_snap_file(&path, "kubernetes", "s", "a/b/c",
					   ".tar", false), -EINVAL);
	assert_int_equal(pcommon_snap_file(&path, "kubernetes", "s", ".x",
					   ".tar", false), -EINVAL);
	assert_int_equal(pcommon_snap_file(&path, "kubernetes", "s", "s/",
					   ".tar", false), -EINVAL);

	pcommon_snap_new_id(id1, 1000000000);
	pcommon_snap_new_id(id2, 2000000000);
	assert_int_equal(strncmp(id1, "20010909T014640Z-", 17), 0);
	sbx_json_set_str(f, "image_id", "im-1");
	assert_int_equal(pcommon_snap_record("modal", "s", id1, "first",
					     1000000000, f), 0);
	assert_int_equal(pcommon_snap_record("modal", "s", id2, NULL,
					     2000000000, NULL), 0);
	assert_int_equal(pcommon_snap_list("modal", "s", collect, ids), 0);
	assert_int_equal(cJSON_GetArraySize(ids), 2);
	assert_string_equal(cJSON_GetArrayItem(ids, 0)->valuestring, id2);
	/* Another session's snapshot by SESSION/ID. */
	{
		char *other = sbx_xasprintf("s/%s", id1);

		assert_int_equal(pcommon_snap_read(&j, "modal", "t", other), 0);
		assert_string_equal(sbx_json_str(j, "image_id"), "im-1");
		assert_string_equal(sbx_json_str(j, "message"), "first");
		cJSON_Delete(j);
		free(other);
	}
	assert_int_equal(pcommon_snap_read(&j, "modal", "s", "nope"), -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_NOTFOUND);
	/* Pruning removes an empty directory only. */
	pcommon_snap_prune("modal", "s");
	assert_true(exists(home, "modal/snapshots/s"));
	assert_int_equal(pcommon_snap_file(&path, "kubernetes", "e", "x",
					   ".tar", true), 0);
	free(path);
	assert_true(exists(home, "kubernetes/snapshots/e"));
	pcommon_snap_prune("kubernetes", "e");
	assert_false(exists(home, "kubernetes/snapshots/e"));
	cJSON_Delete(ids);
	cJSON_Delete(f);
	(void)state;
}

static void test_info_failed(void **state)
{
	struct sbx_sandbox_info info;

	memset(&info, 0, sizeof(info));
	info.state = SBX_STATE_READY;
	pcommon_info_failed(&info, "Evicted", false, "the pod failed");
	assert_int_equal(info.state, SBX_STATE_ERROR);
	assert_string_equal(sbx_json_str(info.extra, "error"), "the pod failed");
	assert_string_equal(sbx_json_str(info.extra, "error_reason"),
			    "Evicted");
	assert_false(sbx_json_bool(info.extra, "gone", true));
	cJSON_Delete(info.extra);
	(void)state;
}

/* ---- lib/http.c: the one mapping ---------------------------------------------- */

static void test_errno_from_curl(void **state)
{
	assert_int_equal(sbx_errno_from_curl(CURLE_OK), 0);
	assert_int_equal(sbx_errno_from_curl(CURLE_OPERATION_TIMEDOUT),
			 -ETIMEDOUT);
	assert_int_equal(sbx_errno_from_curl(CURLE_COULDNT_CONNECT),
			 -ECONNREFUSED);
	assert_int_equal(sbx_errno_from_curl(CURLE_COULDNT_RESOLVE_HOST),
			 -EHOSTUNREACH);
	assert_int_equal(sbx_errno_from_curl(CURLE_RECV_ERROR), -ECONNRESET);
	assert_int_equal(sbx_errno_from_curl(CURLE_HTTP2_STREAM), -ECONNRESET);
	assert_int_equal(sbx_errno_from_curl(CURLE_ABORTED_BY_CALLBACK),
			 -ECANCELED);
	assert_int_equal(sbx_errno_from_curl(CURLE_SSL_CONNECT_ERROR), -EIO);
	assert_non_null(strstr(sbx_http_user_agent(), "sbx/"));
	{
		struct sbx_http_pool *p = NULL;
		void *e;

		assert_int_equal(sbx_http_pool_new(&p), 0);
		e = sbx_http_pool_get(p);
		assert_non_null(e);
		sbx_http_pool_put(p, e);
		assert_ptr_equal(sbx_http_pool_get(p), e); /* reused */
		sbx_http_pool_put(p, e);
		sbx_http_pool_free(p);
	}
	(void)state;
}

/* ---- lib/state.c: no lock file per session ever created ----------------------- */

static void test_lock_forget(void **state)
{
	const char *home = *state;
	struct sbx_session s;
	int fd = -1, fd2 = -1;

	/* A failed first `up`: the lock goes with the (absent) record. */
	assert_int_equal(sbx_state_lock(&fd, "gone", true, 0), 0);
	assert_true(exists(home, "sessions/gone.lock"));
	sbx_error_set(SBX_ERR_REMOTE, -EIO, "kept");
	sbx_state_unlock_forget(fd, "gone");
	assert_false(exists(home, "sessions/gone.lock"));
	assert_string_equal(sbx_error_last()->msg, "kept"); /* untouched */
	sbx_error_clear();

	/* A session that has a record keeps its lock file. */
	sbx_session_init(&s);
	s.session = sbx_xstrdup("kept");
	s.provider = sbx_xstrdup("local");
	assert_int_equal(sbx_state_lock(&fd, "kept", true, 0), 0);
	assert_int_equal(sbx_state_save(&s), 0);
	sbx_state_unlock_forget(fd, "kept");
	assert_true(exists(home, "sessions/kept.lock"));

	/*
	 * A waiter holding the old (removed) file: after the holder removed
	 * it, a new lock is taken on the file at the path, so two holders
	 * never hold different files.
	 */
	assert_int_equal(sbx_state_remove("kept"), 0);
	assert_int_equal(sbx_state_lock(&fd, "kept", true, 0), 0);
	sbx_state_unlock_forget(fd, "kept");
	assert_false(exists(home, "sessions/kept.lock"));
	assert_int_equal(sbx_state_lock(&fd, "kept", true, 0), 0);
	assert_true(exists(home, "sessions/kept.lock"));
	assert_int_equal(sbx_state_lock(&fd2, "kept", true, 0), -EBUSY);
	sbx_error_clear();
	sbx_state_unlock(fd);
	sbx_session_fini(&s);
}

/* A test with its own $SBX_HOME. */
#define HOME_TEST(t)                                                           \
	cmocka_unit_test_setup_teardown(t, th_sbx_home_setup,                  \
					th_sbx_home_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		HOME_TEST(test_env_reserved_names),
		HOME_TEST(test_cfg_checkers),
		HOME_TEST(test_identity),
		HOME_TEST(test_pins),
		HOME_TEST(test_snapshot_store),
		HOME_TEST(test_info_failed),
		HOME_TEST(test_errno_from_curl),
		HOME_TEST(test_lock_forget),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
