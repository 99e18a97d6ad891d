/* Unit tests: lib/state.c (records, listing, locks across processes). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <cmocka.h>

#include "sbx/json.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"
#include "test_helpers_i.h"

static void fill(struct sbx_session *s, const char *name)
{
	sbx_session_init(s);
	s->session = sbx_xstrdup(name);
	s->provider = sbx_xstrdup("local");
	s->sandbox_id = sbx_xstrdup("sbx/x");
	s->state = SBX_STATE_READY;
	s->mountpoint = sbx_xstrdup("/home/u/sbx/x");
	s->workdir = sbx_xstrdup("/wt/x");
	s->created_at = 1706702400;
	s->provider_config = cJSON_Parse("{\"isolation\":\"bwrap\"}");
	s->pid = 1234;
	s->control_socket = sbx_xstrdup("/run/x.sock");
	s->isolation = sbx_xstrdup("bwrap");
	sbx_session_set_error(s, "FileError", "boom");
}

static void test_roundtrip(void **state)
{
	struct sbx_session a, b;
	char path[4096];
	struct stat st;

	fill(&a, "one");
	assert_int_equal(sbx_state_save(&a), 0);
	snprintf(path, sizeof(path), "%s/sessions/one.json",
		 (char *)*state);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);

	assert_int_equal(sbx_state_load(&b, "one"), 0);
	assert_string_equal(b.session, "one");
	assert_string_equal(b.provider, "local");
	assert_string_equal(b.sandbox_id, "sbx/x");
	assert_int_equal(b.state, SBX_STATE_READY);
	assert_string_equal(b.mountpoint, "/home/u/sbx/x");
	assert_string_equal(b.workdir, "/wt/x");
	assert_int_equal(b.created_at, 1706702400);
	assert_string_equal(sbx_json_str(b.provider_config, "isolation"),
			    "bwrap");
	assert_int_equal(b.pid, 1234);
	assert_string_equal(b.control_socket, "/run/x.sock");
	assert_string_equal(b.isolation, "bwrap");
	assert_string_equal(b.error_type, "FileError");
	assert_string_equal(b.error_message, "boom");
	assert_true(sbx_state_exists("one"));
	sbx_session_fini(&a);
	sbx_session_fini(&b);

	assert_int_equal(sbx_state_remove("one"), 0);
	assert_false(sbx_state_exists("one"));
	assert_int_equal(sbx_state_remove("one"), 0);
	assert_int_equal(sbx_state_load(&b, "one"), -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_NOTFOUND);
	assert_int_equal(sbx_state_load(&b, "../etc"), -EINVAL);
}

static void test_corrupt(void **state)
{
	struct sbx_session s;
	char path[4096];

	fill(&s, "bad");
	assert_int_equal(sbx_state_save(&s), 0);
	sbx_session_fini(&s);
	snprintf(path, sizeof(path), "%s/sessions/bad.json", (char *)*state);
	th_write(path, "{\"session\": \"bad\", \"provider\": 7}");
	assert_int_equal(sbx_state_load(&s, "bad"), -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "bad.json"));
	th_write(path, "{\"session\": \"other\", \"provider\": \"local\"}");
	assert_int_equal(sbx_state_load(&s, "bad"), -EINVAL);
	assert_null(s.session);
}

static void test_list(void **state)
{
	const char *names[] = {"b", "a", "c"};
	struct sbx_session s;
	char **list = NULL, path[4096];
	size_t n = 0;

	assert_int_equal(sbx_state_list(&list, &n), 0);
	assert_int_equal(n, 0);
	sbx_state_names_free(list, n);
	for (int i = 0; i < 3; i++) {
		fill(&s, names[i]);
		assert_int_equal(sbx_state_save(&s), 0);
		sbx_session_fini(&s);
	}
	/* Junk in the directory is ignored. */
	snprintf(path, sizeof(path), "%s/sessions/.x.json", (char *)*state);
	th_write(path, "{}");
	snprintf(path, sizeof(path), "%s/sessions/a.lock", (char *)*state);
	th_write(path, "");
	assert_int_equal(sbx_state_list(&list, &n), 0);
	assert_int_equal(n, 3);
	assert_string_equal(list[0], "a");
	assert_string_equal(list[1], "b");
	assert_string_equal(list[2], "c");
	sbx_state_names_free(list, n);
}

/* A second process must see the lock as held, then get it once freed. */
static void test_lock_contention(void **state)
{
	int fd = -1, fd2 = -1, held[2], release[2], st;
	char c;
	pid_t pid;

	/* The child says when it holds the lock, and holds it until told to
	 * let go: no sleeping for a guessed time. */
	assert_int_equal(pipe(held), 0);
	assert_int_equal(pipe(release), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int lfd;

		close(held[0]);
		close(release[1]);
		if (sbx_state_lock(&lfd, "s", true, 0) < 0)
			_exit(2);
		if (write(held[1], "x", 1) != 1)
			_exit(3);
		if (read(release[0], &c, 1) != 1)
			_exit(4);
		sbx_state_unlock(lfd);
		_exit(0);
	}
	close(held[1]);
	close(release[0]);
	assert_int_equal(read(held[0], &c, 1), 1);
	close(held[0]);

	assert_int_equal(sbx_state_lock(&fd, "s", true, 0), -EBUSY);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_STATE);
	assert_non_null(strstr(sbx_error_last()->msg,
			       "another sbx command is working on session s"));
	assert_int_equal(sbx_state_lock(&fd, "s", false, 50), -EBUSY);
	/* Waiting long enough succeeds once the child lets go. */
	assert_int_equal(write(release[1], "x", 1), 1);
	close(release[1]);
	assert_int_equal(sbx_state_lock(&fd, "s", true, 5000), 0);
	assert_true(fd >= 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

	/* Shared locks coexist with each other, not with exclusive ones. */
	sbx_state_unlock(fd);
	assert_int_equal(sbx_state_lock(&fd, "s", false, 0), 0);
	pid = fork();
	if (pid == 0) {
		int lfd;

		if (sbx_state_lock(&lfd, "s", false, 0) < 0)
			_exit(1);
		if (sbx_state_lock(&fd2, "s", true, 0) != -EBUSY)
			_exit(2);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	sbx_state_unlock(fd);
	sbx_state_unlock(-1);
}

/* A test with its own $SBX_HOME. */
#define HOME_TEST(t)                                                           \
	cmocka_unit_test_setup_teardown(t, th_sbx_home_setup,                  \
					th_sbx_home_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		HOME_TEST(test_roundtrip),
		HOME_TEST(test_corrupt),
		HOME_TEST(test_list),
		HOME_TEST(test_lock_contention),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
