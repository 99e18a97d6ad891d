/* Unit tests: lib/proto_exec.c (exec messages of the agent protocol). */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/error.h"
#include "sbx/json.h"
#include "sbx/proto_exec.h"

static cJSON *parse(const char *text)
{
	cJSON *j = cJSON_Parse(text);

	assert_non_null(j);
	return j;
}

static void test_start_roundtrip(void **state)
{
	const char *argv[] = { "sh", "-c", "echo \"$X\"", NULL };
	const char *env[] = { "X=1", "PATH=/bin", NULL };
	struct sbx_exec_start_msg m = {
		.argv = argv, .envp = env, .cwd = "sub/dir", .tty = true,
		.attach = true, .rows = 24, .cols = 80, .umask = 022,
		.alias = "/home/u/sbx/x",
	}, back;
	cJSON *j;
	char *text;

	(void)state;
	j = sbx_exec_start_encode(&m);
	text = sbx_json_print(j, false);
	cJSON_Delete(j);
	j = parse(text);
	assert_int_equal(sbx_exec_start_decode(j, &back), 0);
	for (int i = 0; argv[i]; i++)
		assert_string_equal(back.argv[i], argv[i]);
	assert_null(back.argv[3]);
	assert_string_equal(back.envp[1], "PATH=/bin");
	assert_null(back.envp[2]);
	assert_string_equal(back.cwd, "sub/dir");
	assert_true(back.tty && back.attach);
	assert_int_equal(back.rows, 24);
	assert_int_equal(back.cols, 80);
	assert_int_equal(back.umask, 022);
	assert_string_equal(back.alias, "/home/u/sbx/x");
	sbx_exec_start_fini(&back);
	cJSON_Delete(j);
	free(text);

	/* Optional fields left out: no env, no umask, no rows without tty. */
	m.envp = NULL;
	m.tty = false;
	m.umask = -1;
	m.alias = NULL;
	j = sbx_exec_start_encode(&m);
	assert_null(cJSON_GetObjectItem(j, "env"));
	assert_null(cJSON_GetObjectItem(j, "umask"));
	assert_null(cJSON_GetObjectItem(j, "rows"));
	assert_null(cJSON_GetObjectItem(j, "alias"));
	assert_int_equal(sbx_exec_start_decode(j, &back), 0);
	assert_null(back.envp);
	assert_int_equal(back.umask, -1);
	assert_int_equal(back.rows, 0);
	sbx_exec_start_fini(&back);
	cJSON_Delete(j);
}

static void test_start_hostile(void **state)
{
	static const char *const bad[] = {
		"{}",
		"{\"argv\":[]}",
		"{\"argv\":\"sh\"}",
		"{\"argv\":[\"\"]}",
		"{\"argv\":[\"sh\",1]}",
		"{\"argv\":[\"sh\"],\"env\":[\"NOEQUALS\"]}",
		"{\"argv\":[\"sh\"],\"env\":[\"=x\"]}",
		"{\"argv\":[\"sh\"],\"env\":\"X=1\"}",
		"{\"argv\":[\"sh\"],\"umask\":512}",
		"{\"argv\":[\"sh\"],\"umask\":-2}",
		"{\"argv\":[\"sh\"],\"rows\":70000}",
		"{\"argv\":[\"sh\"],\"cols\":-1}",
		"{\"argv\":[\"sh\"],\"tty\":\"yes\"}",
		"{\"argv\":[\"sh\"],\"cwd\":5}",
	};
	struct sbx_exec_start_msg m;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cJSON *j = parse(bad[i]);

		assert_int_equal(sbx_exec_start_decode(j, &m), -EINVAL);
		sbx_exec_start_fini(&m);
		sbx_error_clear();
		cJSON_Delete(j);
	}
	/* env null is "none". */
	{
		cJSON *j = parse("{\"argv\":[\"sh\"],\"env\":null}");

		assert_int_equal(sbx_exec_start_decode(j, &m), 0);
		assert_null(m.envp);
		assert_null(m.cwd);
		sbx_exec_start_fini(&m);
		cJSON_Delete(j);
	}
}

static void frame_roundtrip(const struct sbx_exec_frame *f,
			    struct sbx_exec_frame *back)
{
	cJSON *j = sbx_exec_frame_encode(f);
	char *text = sbx_json_print(j, false);
	cJSON *k;

	cJSON_Delete(j);
	k = parse(text);
	free(text);
	assert_int_equal(sbx_exec_frame_decode(k, back), 0);
	assert_int_equal(back->kind, f->kind);
	cJSON_Delete(k);
}

static void test_frames(void **state)
{
	struct sbx_exec_frame f, b;

	(void)state;
	f = (struct sbx_exec_frame){ .kind = SBX_EXEC_FRAME_STARTED,
				     .id = "abc", .pid = 1234 };
	{
		cJSON *j = sbx_exec_frame_encode(&f);

		assert_int_equal(sbx_exec_frame_decode(j, &b), 0);
		assert_string_equal(b.id, "abc");
		assert_int_equal(b.pid, 1234);
		cJSON_Delete(j);
	}
	f = (struct sbx_exec_frame){ .kind = SBX_EXEC_FRAME_OUTPUT,
				     .seq = (1ULL << 40), .stream = 1 };
	frame_roundtrip(&f, &b);
	assert_true(b.seq == (1ULL << 40));
	assert_int_equal(b.stream, 1);
	f.stream = 0;
	frame_roundtrip(&f, &b);
	assert_int_equal(b.stream, 0);
	f = (struct sbx_exec_frame){ .kind = SBX_EXEC_FRAME_LOST,
				     .from = 3, .to = 9 };
	frame_roundtrip(&f, &b);
	assert_int_equal(b.from, 3);
	assert_int_equal(b.to, 9);
	f = (struct sbx_exec_frame){ .kind = SBX_EXEC_FRAME_EXIT,
				     .status = 7 << 8, .watch_seq = 77 };
	frame_roundtrip(&f, &b);
	assert_true(WIFEXITED(b.status) && WEXITSTATUS(b.status) == 7);
	assert_true(b.has_watch_seq);
	assert_int_equal(b.watch_seq, 77);
	f.status = SIGKILL; /* killed */
	frame_roundtrip(&f, &b);
	assert_true(WIFSIGNALED(b.status) && WTERMSIG(b.status) == SIGKILL);
	f = (struct sbx_exec_frame){ .kind = SBX_EXEC_FRAME_END };
	frame_roundtrip(&f, &b);
}

static void test_frames_hostile(void **state)
{
	static const char *const bad[] = {
		"{\"stream\":\"stdout\"}",
		"{\"stream\":\"stdout\",\"seq\":-1}",
		"{\"stream\":\"stdout\",\"seq\":1.5}",
		"{\"stream\":\"stdout\",\"seq\":\"1\"}",
		"{\"exit\":{}}",
		"{\"exit\":{\"code\":256}}",
		"{\"exit\":{\"code\":-1}}",
		"{\"exit\":5}",
	};
	struct sbx_exec_frame f;
	cJSON *j;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		j = parse(bad[i]);
		assert_int_equal(sbx_exec_frame_decode(j, &f), -EPROTO);
		sbx_error_clear();
		cJSON_Delete(j);
	}
	/* Unknown kinds are ignored; a bad "lost" range is harmless. */
	j = parse("{\"future\":1}");
	assert_int_equal(sbx_exec_frame_decode(j, &f), 0);
	assert_int_equal(f.kind, SBX_EXEC_FRAME_OTHER);
	cJSON_Delete(j);
	j = parse("{\"lost\":{\"from\":\"x\"}}");
	assert_int_equal(sbx_exec_frame_decode(j, &f), 0);
	assert_int_equal(f.kind, SBX_EXEC_FRAME_LOST);
	cJSON_Delete(j);
	/* An exit without watch_seq (older agents). */
	j = parse("{\"exit\":{\"code\":0,\"signal\":0}}");
	assert_int_equal(sbx_exec_frame_decode(j, &f), 0);
	assert_false(f.has_watch_seq);
	cJSON_Delete(j);
}

static void test_control(void **state)
{
	unsigned short rows, cols;
	cJSON *j;
	int sig;

	(void)state;
	j = sbx_exec_resize_encode(50, 132);
	assert_int_equal(sbx_exec_resize_decode(j, &rows, &cols), 0);
	assert_int_equal(rows, 50);
	assert_int_equal(cols, 132);
	cJSON_Delete(j);
	j = parse("{\"rows\":0,\"cols\":10}");
	assert_int_equal(sbx_exec_resize_decode(j, &rows, &cols), -EINVAL);
	sbx_error_clear();
	cJSON_Delete(j);

	j = sbx_exec_signal_encode(SIGINT);
	assert_non_null(j);
	assert_int_equal(sbx_exec_signal_decode(j, &sig), 0);
	assert_int_equal(sig, SIGINT);
	cJSON_Delete(j);
	j = parse("{\"signal\":\"TERM\"}");
	assert_int_equal(sbx_exec_signal_decode(j, &sig), 0);
	assert_int_equal(sig, SIGTERM);
	cJSON_Delete(j);
	j = parse("{\"signal\":\"SIGNOPE\"}");
	assert_int_equal(sbx_exec_signal_decode(j, &sig), -EINVAL);
	sbx_error_clear();
	cJSON_Delete(j);
	assert_null(sbx_exec_signal_encode(0));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_start_roundtrip),
		cmocka_unit_test(test_start_hostile),
		cmocka_unit_test(test_frames),
		cmocka_unit_test(test_frames_hostile),
		cmocka_unit_test(test_control),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
