/* Unit tests: lib/spawn.c (the process spawner), with real processes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/error.h"
#include "sbx/exec.h"
#include "sbx/spawn.h"
#include "sbx/xmalloc.h"

/* Read `fd` to EOF (or EIO, a pty) into a NUL-terminated string. */
static char *slurp(int fd)
{
	size_t len = 0, cap = 4096;
	char *buf = sbx_xmalloc(cap);

	for (;;) {
		ssize_t n;

		if (len + 1 >= cap)
			buf = sbx_xrealloc(buf, cap *= 2);
		n = read(fd, buf + len, cap - len - 1);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLIN };

			poll(&p, 1, 5000);
			continue;
		}
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	return buf;
}

static int reap(pid_t pid)
{
	int status = -1;

	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	return status;
}

/* Run sh -c `script` with `o` (argv filled in); stdout in *out_text. */
static int run_sh(struct sbx_spawn_opts *o, const char *script,
		  char **out_text)
{
	const char *argv[] = { "sh", "-c", script, NULL };
	struct sbx_spawn sp;
	int rc;

	o->argv = argv;
	rc = sbx_spawn_start(&sp, o);
	assert_int_equal(rc, 0);
	assert_true(sp.pid > 0);
	*out_text = sp.out_fd >= 0 ? slurp(sp.out_fd) : sbx_xstrdup("");
	rc = reap(sp.pid);
	sbx_spawn_fini(&sp);
	return rc;
}

static void test_exit_codes(void **state)
{
	struct sbx_spawn_opts o;
	char *text;
	int st;

	(void)state;
	sbx_spawn_opts_init(&o);
	st = run_sh(&o, "exit 0", &text);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	free(text);
	st = run_sh(&o, "exit 42", &text);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 42);
	free(text);
	st = run_sh(&o, "kill -TERM $$", &text);
	assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
	free(text);
}

static void test_env_and_path(void **state)
{
	const char *env[] = { "PATH=/usr/bin:/bin", "SBX_T=hello world",
			      NULL };
	struct sbx_spawn_opts o;
	char *text;
	int st;

	(void)state;
	sbx_spawn_opts_init(&o);
	o.envp = env;
	st = run_sh(&o, "printf '%s|%s' \"$SBX_T\" \"${HOME-unset}\"", &text);
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_string_equal(text, "hello world|unset");
	free(text);
}

static void test_cwd_and_umask(void **state)
{
	struct sbx_spawn_opts o;
	char dir[] = "/tmp/sbx-spawn-XXXXXX", *text;
	int fd, st;

	(void)state;
	assert_non_null(mkdtemp(dir));
	sbx_spawn_opts_init(&o);
	o.cwd = dir;
	o.umask = 027;
	st = run_sh(&o, "pwd; umask", &text);
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_non_null(strstr(text, dir));
	assert_non_null(strstr(text, "0027"));
	free(text);

	/* By descriptor, and a relative program found in it. */
	fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	sbx_spawn_opts_init(&o);
	o.cwd_fd = fd;
	st = run_sh(&o, "printf x > made; pwd", &text);
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_non_null(strstr(text, dir));
	free(text);
	close(fd);
	{
		char *p = sbx_xasprintf("%s/made", dir);

		assert_int_equal(access(p, F_OK), 0);
		unlink(p);
		free(p);
	}
	rmdir(dir);
}

static void test_fds(void **state)
{
	struct sbx_spawn_opts o;
	struct sbx_spawn sp;
	const char *argv[] = { "sh", "-c",
			       "read x; echo \"out:$x\"; echo err >&2; "
			       "ls /proc/self/fd | wc -l",
			       NULL };
	int leak, given[2];
	char *out, *err;

	(void)state;
	/* A descriptor without O_CLOEXEC must not reach the child. */
	leak = open("/dev/null", O_RDONLY);
	assert_true(leak >= 0);
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	o.nonblock = true;
	assert_int_equal(sbx_spawn_start(&sp, &o), 0);
	assert_true(sp.in_fd >= 0 && sp.out_fd >= 0 && sp.err_fd >= 0);
	assert_int_equal(sp.pty_fd, -1);
	assert_true(fcntl(sp.out_fd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(sp.out_fd, F_GETFD) & FD_CLOEXEC);
	assert_int_equal(write(sp.in_fd, "abc\n", 4), 4);
	close(sp.in_fd);
	sp.in_fd = -1;
	out = slurp(sp.out_fd);
	err = slurp(sp.err_fd);
	assert_int_equal(WEXITSTATUS(reap(sp.pid)), 0);
	/* 0, 1, 2 and the one ls opens to list them. */
	assert_string_equal(out, "out:abc\n4\n");
	assert_string_equal(err, "err\n");
	free(out);
	free(err);
	sbx_spawn_fini(&sp);
	close(leak);

	/* Given descriptors, /dev/null, and a source among 0..2. */
	assert_int_equal(pipe2(given, O_CLOEXEC), 0);
	argv[2] = "cat; echo done";
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	o.stdio[0] = SBX_SPAWN_NULL;
	o.stdio[1] = given[1];
	o.stdio[2] = given[1];
	assert_int_equal(sbx_spawn_start(&sp, &o), 0);
	assert_int_equal(sp.in_fd, -1);
	assert_int_equal(sp.out_fd, -1);
	close(given[1]);
	out = slurp(given[0]);
	assert_int_equal(WEXITSTATUS(reap(sp.pid)), 0);
	assert_string_equal(out, "done\n");
	free(out);
	close(given[0]);
	sbx_spawn_fini(&sp);
}

static void test_session_and_signals(void **state)
{
	struct sbx_spawn_opts o;
	struct sbx_spawn sp;
	const char *argv[] = { "sh", "-c",
			       "trap 'echo got-int; exit 3' INT; "
			       "echo ready; while :; do sleep 0.05; done",
			       NULL };
	sigset_t block, old;
	char buf[64];
	ssize_t n;
	int st;

	(void)state;
	/* The child must not inherit a blocked or ignored SIGINT. */
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	pthread_sigmask(SIG_BLOCK, &block, &old);
	signal(SIGINT, SIG_IGN);
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	assert_int_equal(sbx_spawn_start(&sp, &o), 0);
	signal(SIGINT, SIG_DFL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	assert_int_equal(getsid(sp.pid), sp.pid);
	assert_int_equal(getpgid(sp.pid), sp.pid);
	n = read(sp.out_fd, buf, sizeof(buf) - 1);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_string_equal(buf, "ready\n");
	assert_int_equal(kill(-sp.pid, SIGINT), 0);
	st = reap(sp.pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 3);
	sbx_spawn_fini(&sp);

	/* A process group only: same session as ours. */
	argv[2] = "exit 0";
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	o.group = SBX_SPAWN_PGROUP;
	o.stdio[0] = o.stdio[1] = o.stdio[2] = SBX_SPAWN_INHERIT;
	assert_int_equal(sbx_spawn_start(&sp, &o), 0);
	assert_int_equal(getpgid(sp.pid) == sp.pid || errno == ESRCH, 1);
	assert_int_equal(WEXITSTATUS(reap(sp.pid)), 0);
	sbx_spawn_fini(&sp);
}

static void test_pty(void **state)
{
	struct sbx_spawn_opts o;
	struct sbx_spawn sp;
	const char *argv[] = { "sh", "-c",
			       "stty size; test -t 0 && echo is-a-tty; "
			       "(: </dev/tty) 2>/dev/null && echo ctty",
			       NULL };
	char *out;

	(void)state;
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	o.tty = o.ctty = true;
	o.rows = 33;
	o.cols = 99;
	assert_int_equal(sbx_spawn_start(&sp, &o), 0);
	assert_true(sp.pty_fd >= 0);
	assert_int_equal(sp.in_fd, -1);
	out = slurp(sp.pty_fd);
	assert_int_equal(WEXITSTATUS(reap(sp.pid)), 0);
	assert_non_null(strstr(out, "33 99"));
	assert_non_null(strstr(out, "is-a-tty"));
	assert_non_null(strstr(out, "ctty"));
	free(out);
	sbx_spawn_fini(&sp);
}

static void test_not_found(void **state)
{
	const char *argv[] = { "sbx-no-such-program", NULL };
	const char *env[] = { "PATH=/nonexistent:/usr/bin", NULL };
	struct sbx_spawn_opts o;
	struct sbx_spawn sp;
	char dir[] = "/tmp/sbx-spawn-XXXXXX", *path, *found;
	int fd;

	(void)state;
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	o.envp = env;
	assert_int_equal(sbx_spawn_start(&sp, &o), -ENOENT);
	assert_int_equal(sp.pid, 0);
	assert_int_equal(sbx_error_last()->detail, SBX_EXEC_ERR_PROGRAM);
	assert_string_equal(sbx_error_last()->msg,
			    "sbx-no-such-program: command not found");
	sbx_error_clear();

	/* A path that does not exist: found by the child's execve. */
	argv[0] = "/nonexistent/prog";
	o.file = argv[0];
	assert_int_equal(sbx_spawn_start(&sp, &o), -ENOENT);
	assert_true(sp.child_failed);
	assert_int_equal(sp.child_errno, ENOENT);
	assert_string_equal(sbx_error_last()->msg,
			    "/nonexistent/prog: command not found");
	sbx_error_clear();

	/* Not executable: EACCES, "cannot execute". */
	assert_non_null(mkdtemp(dir));
	path = sbx_xasprintf("%s/noexec", dir);
	fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	close(fd);
	assert_int_equal(sbx_spawn_find(&found, "noexec", dir, AT_FDCWD,
					NULL), -EACCES);
	/* Found in PATH once executable; a script without #! needs sh. */
	chmod(path, 0755);
	assert_int_equal(sbx_spawn_find(&found, "noexec", dir, AT_FDCWD,
					NULL), 0);
	assert_string_equal(found, path);
	free(found);
	fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	assert_int_equal(write(fd, "exit 7\n", 7), 7);
	close(fd);
	argv[0] = "noexec";
	sbx_spawn_opts_init(&o);
	o.argv = argv;
	o.path = dir;
	assert_int_equal(sbx_spawn_start(&sp, &o), -ENOEXEC);
	assert_int_equal(sbx_error_last()->detail, SBX_EXEC_ERR_PROGRAM);
	sbx_error_clear();
	o.sh_fallback = true;
	assert_int_equal(sbx_spawn_start(&sp, &o), 0);
	assert_int_equal(WEXITSTATUS(reap(sp.pid)), 7);
	sbx_spawn_fini(&sp);

	/* A bad working directory is not the program's fault. */
	o.cwd = "/nonexistent-dir";
	assert_int_equal(sbx_spawn_start(&sp, &o), -ENOENT);
	assert_int_equal(sbx_error_last()->detail, 0);
	assert_non_null(strstr(sbx_error_last()->msg, "working directory"));
	sbx_error_clear();

	/* Relative names with a directory prefix. */
	assert_int_equal(sbx_spawn_find(&found, "./noexec", NULL, AT_FDCWD,
					dir), 0);
	assert_non_null(strstr(found, "/./noexec"));
	free(found);
	unlink(path);
	free(path);
	rmdir(dir);
}

static void test_env_get(void **state)
{
	const char *env[] = { "PATHX=1", "PATH=/a", "=odd", NULL };

	(void)state;
	assert_string_equal(sbx_spawn_env_get(env, "PATH"), "/a");
	assert_null(sbx_spawn_env_get(env, "HOME"));
	assert_null(sbx_spawn_env_get(NULL, "PATH"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exit_codes),
		cmocka_unit_test(test_env_and_path),
		cmocka_unit_test(test_cwd_and_umask),
		cmocka_unit_test(test_fds),
		cmocka_unit_test(test_session_and_signals),
		cmocka_unit_test(test_pty),
		cmocka_unit_test(test_not_found),
		cmocka_unit_test(test_env_get),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
