/*
 * Spawning and stopping the per-session FUSE daemon.
 *
 * Start: fork; the child becomes a session leader named SBX_DAEMON_COMM,
 * with stdin on /dev/null and stdout/stderr on $SBX_HOME/logs/NAME.log,
 * opens the provider from the configuration saved at creation, opens the
 * sandbox and runs fs_daemon_run().  Two pipes tell the parent how it went:
 *   ready: handed to fs_daemon_run() as ready_fd; one byte = mount is live;
 *   error: on failure the child writes "<klass> <errno> <message>".
 * Two pipes instead of one because fs_daemon_run() owns (and closes) its
 * ready fd, and any byte value may come through it.  EOF on both without a
 * byte means the child died.  The parent gives up after CLI_MOUNT_TIMEOUT_MS
 * and kills the child.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sbx/fs.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"

#define STOP_WAIT_MS 5000
#define TERM_WAIT_MS 2000

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* Open the sandbox of `s` and serve it; returns fs_daemon_run()'s result. */
static int serve(const struct sbx_session *s, int ready_fd)
{
	struct sbx_provider *p = NULL;
	struct sbx_sandbox *sb = NULL;
	struct fs_options o;
	int rc;

	rc = cli_session_provider(&p, s);
	if (rc < 0)
		goto out;
	rc = sbx_provider_open(&sb, p, s->session);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "open sandbox of session %s",
				      s->session);
		goto out;
	}
	/* Path identity for commands run on another machine (sbx/provider.h). */
	sb->mountpoint = s->mountpoint;
	memset(&o, 0, sizeof(o));
	o.session = s->session;
	o.mountpoint = s->mountpoint;
	o.control_socket = s->control_socket;
	o.sandbox = sb;
	o.ready_fd = ready_fd;
	o.allow_other = s->allow_other;
	o.cache = fs_cache_supported(sb);
	sbx_info("serving session %s at %s%s", s->session, s->mountpoint,
		 s->allow_other ? " (allow_other)" : "");
	rc = fs_daemon_run(&o);
	if (rc < 0)
		sbx_error("session %s: %s", s->session, sbx_error_last()->msg);
	else
		sbx_info("session %s: unmounted", s->session);
out:
	sbx_sandbox_free(sb);
	sbx_provider_free(p);
	return rc;
}

void cli_write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return;
		p += w;
		n -= (size_t)w;
	}
}

/* The child side of cli_daemon_start(); never returns. */
static void child(const struct sbx_session *s, int ready_w, int err_w,
		  const char *log_path)
{
	int fd, rc, lo = ready_w < err_w ? ready_w : err_w;
	int hi = ready_w < err_w ? err_w : ready_w;

	/*
	 * Nothing the CLI had open (provider files, libgit2 packs) belongs to
	 * the daemon: no exec happens to apply O_CLOEXEC, so close by hand.
	 */
	if (lo > 3)
		close_range(3, (unsigned)lo - 1, 0);
	if (hi > lo + 1)
		close_range((unsigned)lo + 1, (unsigned)hi - 1, 0);
	close_range((unsigned)hi + 1, ~0U, 0);

	setsid();
	/* `sbx serve` forks us from a thread that blocks SIGINT/SIGTERM/
	 * SIGHUP (taken by its sigwait()); the mask is inherited, and
	 * libfuse's handlers need them delivered. */
	{
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
	}
	prctl(PR_SET_NAME, SBX_DAEMON_COMM, 0, 0, 0);
	/* libfuse ignores SIGPIPE too; a gone parent must not kill us. */
	signal(SIGPIPE, SIG_IGN);

	fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (fd >= 0) {
		dup2(fd, STDIN_FILENO);
		close(fd);
	}
	fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
	}
	sbx_log_init(SBX_DAEMON_COMM);
	if (sbx_log_open(log_path) < 0)
		sbx_error_clear(); /* stderr is the log already */
	/* The log file is for post-mortems: keep lifecycle lines by default. */
	if (!getenv("SBX_LOG"))
		sbx_log_set_level(SBX_LOG_INFO);

	rc = serve(s, ready_w);
	if (rc < 0) {
		const struct sbx_error *e = sbx_error_last();
		char msg[sizeof(e->msg) + 32];
		int n = snprintf(msg, sizeof(msg), "%d %d %s", e->klass,
				 e->code ? e->code : rc, e->msg);

		if (n > 0)
			cli_write_all(err_w, msg,
				  (size_t)n < sizeof(msg) ? (size_t)n
							  : sizeof(msg) - 1);
	}
	_exit(rc < 0 ? 1 : 0);
}

/* Read the child's "<klass> <errno> <message>" and make it the error. */
static int child_error(const char *buf, const char *log_path)
{
	char *end;
	long klass = strtol(buf, &end, 10), code;

	if (end == buf || *end != ' ')
		goto garbled;
	code = strtol(end + 1, &end, 10);
	if (*end != ' ' || code >= 0 || code < -4095)
		goto garbled;
	return sbx_error_set((int)klass, (int)code, "%s (daemon log: %s)",
			     end + 1, log_path);
garbled:
	return sbx_error_set(SBX_ERR_INTERNAL, -EIO,
			     "the daemon failed to start; see %s", log_path);
}

/* Wait for the pipes; 0 once the mount is live. */
static int wait_ready(pid_t pid, int ready_r, int err_r, const char *log_path,
		      const char *mp)
{
	struct pollfd pfd[2] = {{ready_r, POLLIN, 0}, {err_r, POLLIN, 0}};
	long deadline = now_ms() + CLI_MOUNT_TIMEOUT_MS;
	char msg[1024];
	size_t mlen = 0;

	for (;;) {
		long left = deadline - now_ms();
		int n;

		if (pfd[0].fd < 0 && pfd[1].fd < 0)
			break;
		if (left <= 0) {
			kill(pid, SIGKILL);
			return sbx_error_set(SBX_ERR_OS, -ETIMEDOUT,
					     "the daemon did not mount %s "
					     "within %d s; see %s", mp,
					     CLI_MOUNT_TIMEOUT_MS / 1000,
					     log_path);
		}
		n = poll(pfd, 2, (int)left);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return sbx_error_os("poll");
		}
		if (pfd[0].fd >= 0 && pfd[0].revents) {
			char c;
			ssize_t r = read(ready_r, &c, 1);

			if (r == 1)
				return 0;
			if (r == 0 || (r < 0 && errno != EINTR))
				pfd[0].fd = -1;
		}
		if (pfd[1].fd >= 0 && pfd[1].revents) {
			ssize_t r = read(err_r, msg + mlen,
					 sizeof(msg) - 1 - mlen);

			if (r > 0)
				mlen += (size_t)r;
			if (r == 0 || mlen == sizeof(msg) - 1 ||
			    (r < 0 && errno != EINTR))
				pfd[1].fd = -1;
		}
	}
	msg[mlen] = '\0';
	if (mlen)
		return child_error(msg, log_path);
	return sbx_error_set(SBX_ERR_INTERNAL, -EIO,
			     "the daemon exited before mounting %s; see %s",
			     mp, log_path);
}

int cli_daemon_start(struct sbx_session *s, int lock_fd)
{
	int ready[2] = {-1, -1}, err[2] = {-1, -1}, rc, st;
	char *log_path = NULL, *sock = NULL;
	pid_t pid;

	rc = sbx_paths_session_file(&log_path, "logs", s->session, ".log");
	if (rc < 0)
		return rc;
	rc = sbx_paths_session_file(&sock, "run", s->session, ".sock");
	if (rc < 0)
		goto out;
	/* Only a dead daemon can have left it (the caller holds the lock). */
	unlink(sock);
	free(s->control_socket);
	s->control_socket = sock;
	sock = NULL;

	if (pipe2(ready, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
		rc = sbx_error_os("pipe");
		goto out;
	}
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		rc = sbx_error_os("fork");
		goto out;
	}
	if (pid == 0) {
		close(ready[0]);
		close(err[0]);
		/* See sbx/state.h: the lock must not live on in the daemon. */
		if (lock_fd >= 0)
			close(lock_fd);
		child(s, ready[1], err[1], log_path);
	}
	close(ready[1]);
	close(err[1]);
	ready[1] = err[1] = -1;

	rc = wait_ready(pid, ready[0], err[0], log_path, s->mountpoint);
	if (rc < 0) {
		/* Reap it; it has exited or was just killed. */
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		goto out;
	}
	s->pid = pid;
	rc = 0;
out:
	for (int i = 0; i < 2; i++) {
		if (ready[i] >= 0)
			close(ready[i]);
		if (err[i] >= 0)
			close(err[i]);
	}
	free(sock);
	free(log_path);
	return rc;
}

int cli_daemon_foreground(struct sbx_session *s, int *lock_fd)
{
	char *sock = NULL;
	int rc, rc2;

	rc = sbx_paths_session_file(&sock, "run", s->session, ".sock");
	if (rc < 0)
		return rc;
	unlink(sock);
	free(s->control_socket);
	s->control_socket = sock;
	/* This process is the daemon now: name it so status recognises it. */
	prctl(PR_SET_NAME, SBX_DAEMON_COMM, 0, 0, 0);
	s->pid = getpid();
	rc = sbx_state_save(s);
	if (rc < 0)
		return rc;
	/* Other commands (status, exec, umount) must work meanwhile. */
	sbx_state_unlock(*lock_fd);
	*lock_fd = -1;

	rc = serve(s, -1);
	/*
	 * No longer a daemon: an `sbx umount` that is waiting for us to exit
	 * (holding the lock we want next) must see us as gone.
	 */
	prctl(PR_SET_NAME, "sbx", 0, 0, 0);

	rc2 = sbx_state_lock(lock_fd, s->session, true, CLI_LOCK_TIMEOUT_MS);
	if (rc2 == 0) {
		struct sbx_session cur;

		/* Clear our pid unless someone re-recorded the session. */
		if (sbx_state_load(&cur, s->session) == 0 &&
		    cur.pid == getpid()) {
			cur.pid = 0;
			rc2 = sbx_state_save(&cur);
		}
		sbx_session_fini(&cur);
	}
	if (rc2 < 0 && rc == 0)
		rc = rc2;
	else if (rc2 < 0)
		sbx_warn("could not update session %s after unmount",
			 s->session);
	return rc;
}

/* Wait until the daemon is gone; true if it went within `ms`. */
static bool wait_gone(pid_t pid, long ms)
{
	long deadline = now_ms() + ms;

	for (;;) {
		/* If it is our child (same sbx run), reap it. */
		waitpid(pid, NULL, WNOHANG);
		if (!sbx_status_daemon_alive(pid))
			return true;
		if (now_ms() >= deadline)
			return false;
		sleep_ms(20);
	}
}

int cli_daemon_stop(struct sbx_session *s, bool force)
{
	bool alive = sbx_status_daemon_alive(s->pid);
	bool mounted = sbx_status_is_sbx_mount(NULL, s->mountpoint,
					       s->session);
	int rc;

	if (mounted) {
		/* A dead daemon's mount has nothing to flush: detach it. */
		rc = cli_unmount(s->mountpoint, force || !alive);
		if (rc < 0)
			return rc;
	}
	if (alive && !wait_gone(s->pid, STOP_WAIT_MS)) {
		sbx_warn("daemon %d of session %s did not exit after unmount; "
			 "terminating it", (int)s->pid, s->session);
		kill(s->pid, SIGTERM);
		if (!wait_gone(s->pid, TERM_WAIT_MS)) {
			kill(s->pid, SIGKILL);
			wait_gone(s->pid, TERM_WAIT_MS);
		}
	}
	s->pid = 0;
	if (s->control_socket)
		unlink(s->control_socket);
	return 0;
}
