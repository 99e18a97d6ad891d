/*
 * Unit tests of the control protocol (lib/ctl.c), the daemon's control
 * server (fs/ctl_server.c) and local exec (providers/local/plocal_exec.c).
 *
 * The server runs over a fake `struct fs` (the fs_ctl.h accessors below)
 * whose sandbox is a plain temporary directory driven by plocal_exec_start,
 * so the whole exec path runs without FUSE.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/ctl.h"
#include "sbx/exec.h"
#include "sbx/xmalloc.h"

#include "fs/fs_ctl.h"
#include "providers/local/plocal_i.h"
#include "test_helpers_i.h"

/* ---- fake daemon core ---------------------------------------------------- */

struct fs {
	struct plocal_sandbox psb;
	int before, after, pings;
};

static struct sbx_sandbox_ops fake_ops = {
	.version = SBX_SANDBOX_OPS_VERSION,
	.exec_start = plocal_exec_start,
};

struct sbx_sandbox *fs_sandbox(struct fs *fs)
{
	return &fs->psb.base;
}

const char *fs_session(struct fs *fs)
{
	return "unit";
}

const char *fs_mountpoint(struct fs *fs)
{
	return "/nonexistent";
}

int fs_barrier_before(struct fs *fs)
{
	__atomic_add_fetch(&fs->before, 1, __ATOMIC_SEQ_CST);
	return 0;
}

int fs_barrier_after(struct fs *fs)
{
	__atomic_add_fetch(&fs->after, 1, __ATOMIC_SEQ_CST);
	return 0;
}

void fs_ping(struct fs *fs)
{
	__atomic_add_fetch(&fs->pings, 1, __ATOMIC_SEQ_CST);
}

struct env {
	char dir[64];
	char sock[128];
	struct fs fs;
	struct fs_ctl *ctl;
};

static int setup(void **state)
{
	struct env *e = sbx_xcalloc(1, sizeof(*e));

	strcpy(e->dir, "/tmp/sbx-test-ctl-XXXXXX");
	if (!mkdtemp(e->dir))
		return -1;
	snprintf(e->sock, sizeof(e->sock), "%s/ctl.sock", e->dir);
	e->fs.psb.base.ops = &fake_ops;
	e->fs.psb.base.session = "unit";
	e->fs.psb.base.workdir = e->dir;
	e->fs.psb.root_path = e->dir;
	e->fs.psb.isolation = "none";
	if (fs_ctl_start(&e->fs, e->sock, &e->ctl) < 0) {
		fprintf(stderr, "fs_ctl_start: %s\n", sbx_error_last()->msg);
		return -1;
	}
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	char cmd[128];

	fs_ctl_stop(e->ctl);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", e->dir);
	if (system(cmd) != 0)
		return -1;
	free(e);
	return 0;
}

/* Offer the client's descriptors to the daemon (zero-copy path). */
static bool g_pass_fds;

/* What a command run through the server left: its wait status, and its
 * stdout and stderr (malloc'd, NUL-terminated; result_fini frees them). */
struct result {
	int st;
	char *out, *err;
};

static void result_fini(struct result *r)
{
	free(r->out);
	free(r->err);
}

/* Run argv through the server; stdin from `in` (NULL: none), stdout and
 * stderr captured in *r.  Returns sbx_ctl_run's rc. */
static int run(struct env *e, const char *cwd, const char *in,
	       const char *const *argv, bool tty, struct result *r)
{
	char path[160];
	int fds[3], rc;
	const char *envp[] = { "PATH=/usr/bin:/bin", "LC_ALL=C", NULL };
	struct sbx_ctl_run_opts o = {
		.socket_path = e->sock,
		.session = "unit",
		.argv = argv,
		.envp = envp,
		.cwd = cwd,
		.tty = tty,
		.pass_fds = g_pass_fds,
	};

	for (int i = 0; i < 3; i++) {
		snprintf(path, sizeof(path), "%s/io%d", e->dir, i);
		fds[i] = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
			      0600);
		assert_true(fds[i] >= 0);
		unlink(path);
	}
	if (in) {
		assert_int_equal(write(fds[0], in, strlen(in)),
				 (ssize_t)strlen(in));
		lseek(fds[0], 0, SEEK_SET);
	}
	o.in_fd = in ? fds[0] : -1;
	o.out_fd = fds[1];
	o.err_fd = fds[2];
	rc = sbx_ctl_run(&o, &r->st);
	for (int i = 1; i < 3; i++) {
		off_t len = lseek(fds[i], 0, SEEK_END);
		char *buf = sbx_xmalloc((size_t)len + 1);

		assert_int_equal(pread(fds[i], buf, (size_t)len, 0), len);
		buf[len] = '\0';
		if (i == 1)
			r->out = buf;
		else
			r->err = buf;
	}
	for (int i = 0; i < 3; i++)
		close(fds[i]);
	return rc;
}

/* ---- framing -------------------------------------------------------------- */

static void test_request_roundtrip(void **state)
{
	char *argv[] = { "printf", "%s\\n", "a b", "", "\"q\"", NULL };
	char *envp[] = { "A=1", "B=", NULL };
	struct sbx_ctl_request in = {
		.flags = SBX_CTL_REQ_TTY, .rows = 24, .cols = 80,
		.cwd = "sub/dir", .argv = argv, .envp = envp,
	}, *out = NULL;
	uint8_t *p;
	size_t len;

	assert_int_equal(sbx_ctl_request_encode(&p, &len, &in), 0);
	assert_int_equal(sbx_ctl_request_decode(&out, p, len), 0);
	assert_int_equal(out->flags, SBX_CTL_REQ_TTY);
	assert_int_equal(out->rows, 24);
	assert_int_equal(out->cols, 80);
	assert_string_equal(out->cwd, "sub/dir");
	for (int i = 0; argv[i]; i++)
		assert_string_equal(out->argv[i], argv[i]);
	assert_null(out->argv[5]);
	assert_string_equal(out->envp[0], "A=1");
	assert_string_equal(out->envp[1], "B=");
	assert_null(out->envp[2]);
	sbx_ctl_request_free(out);

	/* Every truncation and a corrupted count are refused. */
	for (size_t l = 0; l < len; l++) {
		assert_true(sbx_ctl_request_decode(&out, p, l) < 0);
		assert_null(out);
	}
	p[12] = 200;
	assert_int_equal(sbx_ctl_request_decode(&out, p, len), -EPROTO);
	p[12] = 5;
	p[0] = 9;
	assert_int_equal(sbx_ctl_request_decode(&out, p, len),
			 -EPROTONOSUPPORT);
	free(p);
}

/* The client's umask rides after the strings (SBX_CTL_REQ_UMASK). */
static void test_request_umask(void **state)
{
	char *argv[] = { "sh", NULL };
	char *envp[] = { NULL };
	struct sbx_ctl_request in = {
		.flags = SBX_CTL_REQ_UMASK, .cwd = "", .argv = argv,
		.envp = envp, .umask = 027,
	}, *out = NULL;
	uint8_t *p;
	size_t len;

	assert_int_equal(sbx_ctl_request_encode(&p, &len, &in), 0);
	assert_int_equal(sbx_ctl_request_decode(&out, p, len), 0);
	assert_int_equal(out->flags, SBX_CTL_REQ_UMASK);
	assert_int_equal(out->umask, 027);
	assert_string_equal(out->argv[0], "sh");
	assert_null(out->envp[0]);
	sbx_ctl_request_free(out);
	for (size_t l = 0; l < len; l++) {
		assert_true(sbx_ctl_request_decode(&out, p, l) < 0);
		assert_null(out);
	}
	/* Not a mode mask. */
	p[len - 2] = 1;
	assert_int_equal(sbx_ctl_request_decode(&out, p, len), -EPROTO);
	free(p);

	/* Without the flag: no trailing field, umask 0 in the struct. */
	in.flags = 0;
	assert_int_equal(sbx_ctl_request_encode(&p, &len, &in), 0);
	assert_int_equal(sbx_ctl_request_decode(&out, p, len), 0);
	assert_int_equal(out->umask, 0);
	sbx_ctl_request_free(out);
	free(p);
}

static void test_frames_bytewise(void **state)
{
	struct sbx_ctl_wbuf wb;
	struct sbx_ctl_rbuf rb;
	struct sbx_ctl_frame f;
	int sv[2], got = 0;
	size_t total;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0,
				    sv), 0);
	sbx_ctl_wbuf_init(&wb);
	sbx_ctl_rbuf_init(&rb, SBX_CTL_DATA_MAX);
	sbx_ctl_wbuf_put(&wb, SBX_CTL_STDOUT, "hello", 5);
	sbx_ctl_wbuf_put(&wb, SBX_CTL_STDIN_EOF, NULL, 0);
	sbx_ctl_wbuf_put(&wb, SBX_CTL_STDERR, "\0\1\2", 3);
	total = sbx_ctl_wbuf_pending(&wb);
	/* Deliver one byte at a time: frames appear only when complete. */
	for (size_t i = 0; i < total; i++) {
		assert_int_equal(write(sv[0], wb.buf + i, 1), 1);
		assert_true(sbx_ctl_rbuf_fill(&rb, sv[1]) == 1);
		while (sbx_ctl_rbuf_next(&rb, &f) == 1) {
			if (got == 0) {
				assert_int_equal(f.type, SBX_CTL_STDOUT);
				assert_memory_equal(f.data, "hello", 5);
			} else if (got == 1) {
				assert_int_equal(f.type, SBX_CTL_STDIN_EOF);
				assert_int_equal(f.len, 0);
			} else {
				assert_int_equal(f.type, SBX_CTL_STDERR);
				assert_memory_equal(f.data, "\0\1\2", 3);
			}
			got++;
		}
	}
	assert_int_equal(got, 3);
	/* An oversized frame is a protocol error. */
	{
		uint8_t h[8] = { SBX_CTL_STDOUT, 0, 0, 0 };

		sbx_ctl_put_u32(h + 4, SBX_CTL_DATA_MAX + 1);
		assert_int_equal(write(sv[0], h, 8), 8);
		assert_int_equal(sbx_ctl_rbuf_fill(&rb, sv[1]), 8);
		assert_int_equal(sbx_ctl_rbuf_next(&rb, &f), -EPROTO);
	}
	sbx_ctl_rbuf_fini(&rb);
	sbx_ctl_wbuf_fini(&wb);
	close(sv[0]);
	close(sv[1]);
}

static void test_env_policy(void **state)
{
	char *in[] = { "TERM=xterm", "LC_ALL=C", "SECRET=x", "HOME=/root",
		       "MYVAR=1", "SBX_EXEC_ENV=MYVAR,OTHER",
		       "PATH=/shims:/usr/bin:/shims2:/bin", "NO_COLOR=1",
		       NULL };
	const char *drop[] = { "/shims", "/shims2", NULL };
	const char *extra[] = { "TERM=dumb", "NEW=2", NULL };
	char **out;
	char joined[512] = "";

	sbx_ctl_env_build(&out, in, drop, extra);
	for (int i = 0; out[i]; i++) {
		strcat(joined, out[i]);
		strcat(joined, ";");
	}
	assert_string_equal(joined, "TERM=dumb;LC_ALL=C;MYVAR=1;"
				    "PATH=/usr/bin:/bin;NO_COLOR=1;NEW=2;");
	sbx_ctl_env_free(out);
	assert_true(sbx_ctl_env_default_allowed("LC_CTYPE"));
	assert_false(sbx_ctl_env_default_allowed("LD_PRELOAD"));
}

/* ---- end to end -------------------------------------------------------------- */

static void test_exit_codes(void **state)
{
	struct env *e = *state;
	int codes[] = { 0, 1, 2, 42, 126, 127, 128, 255 };
	char script[64];
	int b0 = e->fs.before, a0 = e->fs.after;

	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		const char *argv[] = { "sh", "-c", script, NULL };
		struct result r;

		snprintf(script, sizeof(script), "exit %d", codes[i]);
		assert_int_equal(run(e, "", NULL, argv, false, &r), 0);
		assert_int_equal(sbx_ctl_exit_code(r.st), codes[i]);
		result_fini(&r);
	}
	assert_int_equal(e->fs.before - b0, 8);
	assert_int_equal(e->fs.after - a0, 8);
}

static void test_signal_death(void **state)
{
	struct env *e = *state;
	const char *argv[] = { "sh", "-c", "kill -TERM $$", NULL };
	struct result r;

	assert_int_equal(run(e, "", NULL, argv, false, &r), 0);
	assert_true(WIFSIGNALED(r.st));
	assert_int_equal(sbx_ctl_exit_code(r.st), 128 + SIGTERM);
	result_fini(&r);
}

static void test_streams(void **state)
{
	struct env *e = *state;
	const char *argv[] = { "sh", "-c",
			       "pwd; echo err >&2; cat; printf '%s' \"$1\"",
			       "sh", "a 'b' \"c\" $d", NULL };
	char want[256];
	struct result r;

	assert_int_equal(mkdir(strcat(strcpy(want, e->dir), "/sub"), 0755),
			 0);
	assert_int_equal(run(e, "sub", "stdin data\n", argv, false, &r), 0);
	assert_int_equal(sbx_ctl_exit_code(r.st), 0);
	snprintf(want, sizeof(want), "%s/sub\nstdin data\na 'b' \"c\" $d",
		 e->dir);
	assert_string_equal(r.out, want);
	assert_string_equal(r.err, "err\n");
	result_fini(&r);
}

static void test_env_in_command(void **state)
{
	struct env *e = *state;
	const char *argv[] = { "sh", "-c",
			       "echo \"$LC_ALL:$SBX_SESSION:${HOME:+home}\"",
			       NULL };
	struct result r;

	assert_int_equal(run(e, "", NULL, argv, false, &r), 0);
	assert_string_equal(r.out, "C:unit:home\n");
	result_fini(&r);
}

/* Running argv in cwd is refused with `want`: the exit code `code` and a
 * message holding `msg` (when given). */
static void run_refused(struct env *e, const char *cwd,
			const char *const *argv, int want, int code,
			const char *msg)
{
	struct result r;
	int rc = run(e, cwd, NULL, argv, false, &r);

	assert_int_equal(rc, want);
	if (code)
		assert_int_equal(sbx_ctl_error_exit_code(rc), code);
	if (msg)
		assert_non_null(strstr(sbx_error_last()->msg, msg));
	result_fini(&r);
}

static void test_not_found(void **state)
{
	const char *argv[] = { "no-such-command-sbx", NULL };

	run_refused(*state, "", argv, -ENOENT, 127, "command not found");
}

static void test_cwd_outside(void **state)
{
	const char *argv[] = { "true", NULL };

	run_refused(*state, "/usr", argv, -EACCES, 125, "outside the sandbox");
	run_refused(*state, "../", argv, -EACCES, 0, NULL);
}

static void test_tty(void **state)
{
	struct env *e = *state;
	const char *argv[] = { "sh", "-c", "test -t 0 && test -t 1 && echo tty",
			       NULL };
	struct result r;

	assert_int_equal(run(e, "", NULL, argv, true, &r), 0);
	assert_int_equal(sbx_ctl_exit_code(r.st), 0);
	assert_string_equal(r.out, "tty\r\n");
	result_fini(&r);
}

static void test_big_output(void **state)
{
	struct env *e = *state;
	/* 8 MiB on each stream, interleaved. */
	const char *argv[] = { "sh", "-c",
			       "head -c 8388608 /dev/zero & "
			       "head -c 8388608 /dev/zero >&2; wait", NULL };
	struct result r;

	assert_int_equal(run(e, "", NULL, argv, false, &r), 0);
	assert_int_equal(sbx_ctl_exit_code(r.st), 0);
	result_fini(&r);
}

static void test_fd_passing(void **state)
{
	g_pass_fds = true;
	test_streams(state);
	test_exit_codes(state);
	test_signal_death(state);
	test_big_output(state);
	g_pass_fds = false;
}

static void test_daemon_down(void **state)
{
	const char *argv[] = { "true", NULL };
	const char *envp[] = { NULL };
	struct sbx_ctl_run_opts o = {
		.socket_path = "/tmp/sbx-no-such-dir/x.sock",
		.session = "gone",
		.argv = argv, .envp = envp, .cwd = "",
		.in_fd = -1, .out_fd = 1, .err_fd = 2,
	};
	int st, rc = sbx_ctl_run(&o, &st);

	assert_int_equal(rc, -ENOENT);
	assert_int_equal(sbx_ctl_error_exit_code(rc), 125);
	assert_non_null(strstr(sbx_error_last()->msg, "run `sbx mount gone`"));
}

/* PING: a live daemon answers; a socket nobody accepts on times out. */
static void test_ping(void **state)
{
	struct env *e = *state;
	char path[160];
	struct timespec t0, t1;
	int fd, rc;

	assert_int_equal(sbx_ctl_ping(e->sock, 2000), 0);
	assert_int_equal(e->fs.pings, 1);

	/* A stopped daemon: the kernel completes the connect through the
	 * listen backlog, and nothing ever answers. */
	snprintf(path, sizeof(path), "%s/mute.sock", e->dir);
	assert_int_equal(sbx_ctl_listen(path, &fd), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = sbx_ctl_ping(path, 300);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_equal(rc, -ETIMEDOUT);
	assert_true((t1.tv_sec - t0.tv_sec) * 1000 +
			    (t1.tv_nsec - t0.tv_nsec) / 1000000 < 2000);
	close(fd);
	assert_int_equal(sbx_ctl_ping(path, 300), -ECONNREFUSED);
	sbx_error_clear();
}

static void test_env_listed(void **state)
{
	assert_true(sbx_ctl_env_listed("A,B C:D\tE", "B", 1));
	assert_true(sbx_ctl_env_listed("A,B C:D\tE", "E", 1));
	assert_true(sbx_ctl_env_listed(" , A", "AB", 1));
	assert_false(sbx_ctl_env_listed("AB", "A", 1));
	assert_false(sbx_ctl_env_listed("A", "AB", 2));
	assert_false(sbx_ctl_env_listed(NULL, "A", 1));
	assert_false(sbx_ctl_env_listed("", "A", 1));
}

static void test_run_opts_stdio(void **state)
{
	struct sbx_ctl_run_opts o = { .socket_path = "x", .cwd = "d",
				      .connect_timeout_ms = 7 };

	sbx_ctl_run_opts_stdio(&o, 1);
	assert_true(o.tty);
	assert_int_equal(o.in_fd, 0);
	assert_int_equal(o.out_fd, 1);
	assert_int_equal(o.err_fd, 2);
	assert_true(o.forward_signals && o.pass_fds);
	/* The caller's fields stay. */
	assert_string_equal(o.socket_path, "x");
	assert_string_equal(o.cwd, "d");
	assert_int_equal(o.connect_timeout_ms, 7);
	sbx_ctl_run_opts_stdio(&o, 0);
	assert_false(o.tty);
	sbx_ctl_run_opts_stdio(&o, -1);
	assert_true(o.tty == (isatty(0) && isatty(1)));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_request_roundtrip),
		cmocka_unit_test(test_request_umask),
		cmocka_unit_test(test_frames_bytewise),
		cmocka_unit_test(test_env_policy),
		cmocka_unit_test(test_run_opts_stdio),
		cmocka_unit_test(test_env_listed),
		cmocka_unit_test(test_daemon_down),
		TH_TEST(test_exit_codes),
		TH_TEST(test_signal_death),
		TH_TEST(test_streams),
		TH_TEST(test_env_in_command),
		TH_TEST(test_not_found),
		TH_TEST(test_cwd_outside),
		TH_TEST(test_tty),
		TH_TEST(test_big_output),
		TH_TEST(test_fd_passing),
		TH_TEST(test_ping),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
