/*
 * The daemon end of the control protocol (sbx/ctl.h, docs/exec.md): runs
 * the exec shim's commands in the sandbox through the provider's exec
 * handle (sbx/exec.h), with the exec barrier around each command.
 *
 * Threads: one accept thread, plus one detached thread per connection (one
 * command each).  fs_ctl_stop() wakes all of them through `wake` and waits
 * until the connection count drops to zero.  Shared fields are protected by
 * ctl->lock; the wake pipe is written once, at stop.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sbx/clock.h"
#include "sbx/ctl.h"
#include "sbx/exec.h"
#include "sbx/log.h"
#include "sbx/provider.h"
#include "sbx/waitfd.h"
#include "sbx/xmalloc.h"

#include "fs_ctl.h"

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define REQUEST_TIMEOUT_MS 10000 /* from accept to a complete REQUEST */
#define STDIN_BUF_MAX (1024 * 1024) /* queued for the command's stdin */
#define EXIT_GRACE_MS 250   /* after exit: wait this long for output EOF */
#define HANGUP_GRACE_MS 5000 /* client gone: SIGHUP, then SIGKILL after */
#define STOP_GRACE_MS 2000  /* daemon stopping: SIGHUP, then SIGKILL after */

struct fs_ctl {
	struct fs *fs;
	char *path;
	int listen_fd;
	int wake[2];            /* readable once stopping */
	pthread_t accept_thread;
	bool accept_started;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned nconn;         /* protected by lock */
};

struct conn {
	struct fs_ctl *ctl;
	int sock;
};

static int64_t now_ms(void)
{
	return (int64_t)sbx_clock_mono_ms();
}

/* ---- environment defaults ------------------------------------------------ */

static bool env_has(char **env, size_t n, const char *name)
{
	size_t l = strlen(name);

	for (size_t i = 0; i < n; i++)
		if (!strncmp(env[i], name, l) && env[i][l] == '=')
			return true;
	return false;
}

/*
 * The command's environment: what the client sent (already filtered by its
 * allowlist), plus defaults for PATH, HOME, USER, LOGNAME, plus
 * SBX_SESSION.  Strings in the result are borrowed from `req` or owned by
 * `owned` (freed by the caller with sbx_ctl_env_free()).
 */
static char **build_env(char ***owned, const struct sbx_ctl_request *req,
			const char *session)
{
	size_t n = 0, no = 0, i;
	char **env, **own;
	struct passwd pw, *pwp = NULL;
	char pwbuf[1024];
	const char *home;

	while (req->envp[n])
		n++;
	env = sbx_xcalloc(n + 8, sizeof(char *));
	own = sbx_xcalloc(8, sizeof(char *));
	for (i = 0; i < n; i++)
		if (strncmp(req->envp[i], "SBX_SESSION=", 12))
			env[no++] = req->envp[i];
	getpwuid_r(geteuid(), &pw, pwbuf, sizeof(pwbuf), &pwp);
	n = 0;
	if (!env_has(env, no, "PATH"))
		env[no++] = own[n++] = sbx_xstrdup("PATH=" DEFAULT_PATH);
	home = getenv("HOME");
	if (!home && pwp)
		home = pwp->pw_dir;
	if (!env_has(env, no, "HOME") && home)
		env[no++] = own[n++] = sbx_xasprintf("HOME=%s", home);
	if (pwp && !env_has(env, no, "USER"))
		env[no++] = own[n++] = sbx_xasprintf("USER=%s", pwp->pw_name);
	if (pwp && !env_has(env, no, "LOGNAME"))
		env[no++] = own[n++] = sbx_xasprintf("LOGNAME=%s",
						     pwp->pw_name);
	env[no++] = own[n++] = sbx_xasprintf("SBX_SESSION=%s", session);
	env[no] = NULL;
	*owned = own;
	return env;
}

/* ---- one connection ------------------------------------------------------ */

struct run {
	struct fs_ctl *ctl;
	int sock;
	struct sbx_ctl_rbuf rb;
	struct sbx_ctl_wbuf wb;
	struct sbx_exec_handle *h;
	uint8_t *inbuf;      /* bytes for the command's stdin */
	size_t in_len, in_off;
	bool in_eof;         /* client sent STDIN_EOF */
	bool out_open, err_open;
	bool exited;
	bool client_gone;
	bool stopping;
	int64_t deadline;    /* exit grace / hangup grace (0: none) */
};

static void send_error(struct run *r, int rc, int kind)
{
	const struct sbx_error *e = sbx_error_last();

	sbx_ctl_wbuf_put_error(&r->wb, rc, kind,
			       e->klass != SBX_ERR_NONE ? e->msg
							: strerror(-rc));
}

/* Write everything queued, waiting (bounded) for the client. */
static void flush_blocking(struct run *r, int timeout_ms)
{
	int64_t end = now_ms() + timeout_ms;

	while (!r->client_gone && sbx_ctl_wbuf_pending(&r->wb)) {
		struct pollfd p = { .fd = r->sock, .events = POLLOUT };
		int64_t left = end - now_ms();

		if (sbx_ctl_wbuf_flush(&r->wb, r->sock) < 0) {
			sbx_error_clear();
			r->client_gone = true;
			break;
		}
		if (!sbx_ctl_wbuf_pending(&r->wb) || left <= 0)
			break;
		poll(&p, 1, (int)left);
	}
}

/* 0 and *out: a REQUEST; 1: a PING (no *out); or -errno. */
static int read_request(struct run *r, struct sbx_ctl_request **out,
			int fds[3], int *nfds)
{
	int64_t end = now_ms() + REQUEST_TIMEOUT_MS;
	struct sbx_ctl_frame f;
	int rc;

	*out = NULL;
	while (1) {
		int64_t left = end - now_ms();
		ssize_t n;

		rc = sbx_ctl_rbuf_next(&r->rb, &f);
		if (rc < 0)
			return rc;
		if (rc > 0)
			break;
		if (left <= 0)
			return sbx_error_set(SBX_ERR_PROTO, -ETIMEDOUT,
					     "control protocol: no REQUEST "
					     "within %d ms",
					     REQUEST_TIMEOUT_MS);
		rc = sbx_waitfd(r->sock, POLLIN, r->ctl->wake[0], (int)left,
				NULL);
		if (rc < 0)
			return rc;
		if (rc == SBX_WAITFD_WOKEN)
			return sbx_error_set(SBX_ERR_STATE, -ESHUTDOWN,
					     "the daemon is stopping");
		if (rc == SBX_WAITFD_TIMEOUT)
			continue; /* the next turn reports it */
		n = sbx_ctl_rbuf_fill_fds(&r->rb, r->sock, fds, nfds);
		if (n == 0)
			return sbx_error_set(SBX_ERR_PROTO, -ECONNRESET,
					     "client went away");
		if (n < 0 && n != -EAGAIN)
			return (int)n;
	}
	if (f.type == SBX_CTL_PING)
		return 1;
	if (f.type != SBX_CTL_REQUEST)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: expected REQUEST, got "
				     "frame type %u", f.type);
	return sbx_ctl_request_decode(out, f.data, f.len);
}

/* The command's working directory: "" is the workdir, relative paths are
 * below it, absolute paths are taken as sandbox paths. */
static char *resolve_cwd(struct sbx_sandbox *sb, const char *cwd)
{
	if (cwd[0] == '/')
		return sbx_xstrdup(cwd);
	if (!cwd[0])
		return sbx_xstrdup(sb->workdir);
	return sbx_xasprintf("%s/%s", sb->workdir, cwd);
}

static void client_frames(struct run *r)
{
	struct sbx_ctl_frame f;
	int rc;

	while ((rc = sbx_ctl_rbuf_next(&r->rb, &f)) > 0) {
		switch (f.type) {
		case SBX_CTL_STDIN:
			if (f.len > SBX_CTL_DATA_MAX)
				goto proto;
			if (r->in_eof || r->h->stdin_fd < 0)
				break; /* the command closed its stdin */
			if (r->in_off == r->in_len)
				r->in_off = r->in_len = 0;
			r->inbuf = sbx_xrealloc(r->inbuf, r->in_len + f.len);
			memcpy(r->inbuf + r->in_len, f.data, f.len);
			r->in_len += f.len;
			break;
		case SBX_CTL_STDIN_EOF:
			r->in_eof = true;
			break;
		case SBX_CTL_SIGNAL:
			if (f.len != 4)
				goto proto;
			if (!r->exited) {
				int sig = (int)sbx_ctl_get_u32(f.data);

				if (sig > 0 && sig < NSIG)
					rc = sbx_exec_signal(r->h, sig);
				sbx_error_clear();
			}
			break;
		case SBX_CTL_RESIZE:
			if (f.len != 4)
				goto proto;
			rc = sbx_exec_resize(r->h,
					     (unsigned short)(f.data[0] |
							      f.data[1] << 8),
					     (unsigned short)(f.data[2] |
							      f.data[3] << 8));
			sbx_error_clear();
			break;
		default:
			goto proto;
		}
	}
	if (rc == 0)
		return;
proto:
	sbx_warn("session %s: control protocol error from a client "
		 "(frame type %u); dropping it", fs_session(r->ctl->fs),
		 f.type);
	r->client_gone = true;
}

static void client_gone(struct run *r)
{
	if (r->client_gone && !r->deadline)
		return;
	r->client_gone = true;
	if (!r->exited) {
		if (sbx_exec_signal(r->h, SIGHUP) < 0)
			sbx_error_clear();
		r->deadline = now_ms() + HANGUP_GRACE_MS;
	}
}

/* Feed queued stdin to the command. */
static void pump_stdin(struct run *r)
{
	while (r->in_off < r->in_len && r->h->stdin_fd >= 0) {
		ssize_t n = write(r->h->stdin_fd, r->inbuf + r->in_off,
				  r->in_len - r->in_off);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return;
			/* EPIPE: the command does not read stdin any more. */
			r->in_off = r->in_len = 0;
			if (sbx_exec_close_stdin(r->h) < 0)
				sbx_error_clear();
			return;
		}
		r->in_off += (size_t)n;
	}
	if (r->in_off == r->in_len && r->in_eof && r->h->stdin_fd >= 0) {
		if (sbx_exec_close_stdin(r->h) < 0)
			sbx_error_clear();
	}
}

/* One read of an output stream into a frame; false at its end. */
static bool pump_output(struct run *r, int fd, uint8_t type)
{
	ssize_t n = sbx_ctl_wbuf_put_from_fd(&r->wb, type, fd,
					     SBX_CTL_DATA_MAX);

	if (n > 0 || n == -EAGAIN || n == -EINTR)
		return true;
	return false; /* 0: EOF; EIO: pty slave closed; other: give up */
}

/* After the exit grace: take what is already buffered, then stop. */
static void drain_outputs(struct run *r)
{
	size_t budget = 64u << 20;

	while (budget && (r->out_open || r->err_open)) {
		size_t before = sbx_ctl_wbuf_pending(&r->wb);

		if (r->out_open && !pump_output(r, r->h->stdout_fd,
						 SBX_CTL_STDOUT))
			r->out_open = false;
		if (r->err_open && !pump_output(r, r->h->stderr_fd,
						 SBX_CTL_STDERR))
			r->err_open = false;
		if (sbx_ctl_wbuf_pending(&r->wb) == before)
			break;
		budget -= budget < sbx_ctl_wbuf_pending(&r->wb) - before
				  ? budget
				  : sbx_ctl_wbuf_pending(&r->wb) - before;
		flush_blocking(r, 5000);
	}
	r->out_open = r->err_open = false;
}

static void run_loop(struct run *r)
{
	struct sbx_exec_handle *h = r->h;

	while (1) {
		struct pollfd p[6];
		int np = 0, isock = -1, iout = -1, ierr = -1, iin = -1;
		int iexit = -1, iwake, timeout = -1;
		bool room = sbx_ctl_wbuf_pending(&r->wb) < SBX_CTL_DATA_MAX;

		if (r->exited && !r->out_open && !r->err_open)
			break;
		if (r->deadline) {
			int64_t left = r->deadline - now_ms();

			if (left <= 0) {
				if (r->exited) {
					drain_outputs(r);
					break;
				}
				/* Client gone or daemon stopping, command
				 * still alive: the handle's free kills it. */
				break;
			}
			timeout = (int)left;
		}
		if (!r->client_gone) {
			isock = np;
			p[np++] = (struct pollfd){
				.fd = r->sock,
				.events = (r->in_len - r->in_off < STDIN_BUF_MAX
						   ? POLLIN : 0) |
					  (sbx_ctl_wbuf_pending(&r->wb)
						   ? POLLOUT : 0),
			};
		}
		/* Output is read only when the socket has room: back-pressure
		 * from a slow client reaches the command as a full pipe. */
		if (r->out_open && (room || r->client_gone)) {
			iout = np;
			p[np++] = (struct pollfd){ .fd = h->stdout_fd,
						   .events = POLLIN };
		}
		if (r->err_open && (room || r->client_gone)) {
			ierr = np;
			p[np++] = (struct pollfd){ .fd = h->stderr_fd,
						   .events = POLLIN };
		}
		if (r->in_off < r->in_len && h->stdin_fd >= 0 && !r->exited) {
			iin = np;
			p[np++] = (struct pollfd){ .fd = h->stdin_fd,
						   .events = POLLOUT };
		}
		if (!r->exited) {
			iexit = np;
			p[np++] = (struct pollfd){ .fd = h->exit_fd,
						   .events = POLLIN };
		}
		iwake = np;
		p[np++] = (struct pollfd){ .fd = r->ctl->wake[0],
					   .events = r->stopping ? 0 : POLLIN };
		if (poll(p, (nfds_t)np, timeout) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[iwake].revents & POLLIN) {
			r->stopping = true;
			if (!r->exited) {
				if (sbx_exec_signal(h, SIGHUP) < 0)
					sbx_error_clear();
				r->deadline = now_ms() + STOP_GRACE_MS;
			}
		}
		if (isock >= 0 && (p[isock].revents & (POLLIN | POLLHUP |
						       POLLERR))) {
			ssize_t n = sbx_ctl_rbuf_fill(&r->rb, r->sock);

			if (n > 0)
				client_frames(r);
			else if (n != -EAGAIN)
				client_gone(r);
			sbx_error_clear();
		}
		if (iin >= 0 && p[iin].revents)
			pump_stdin(r);
		else if (r->in_eof && r->in_off == r->in_len &&
			 h->stdin_fd >= 0)
			pump_stdin(r);
		if (iout >= 0 && p[iout].revents &&
		    !pump_output(r, h->stdout_fd, SBX_CTL_STDOUT)) {
			r->out_open = false;
			if (h->stdout_fd == h->stdin_fd)
				r->in_off = r->in_len = 0; /* pty gone */
		}
		if (ierr >= 0 && p[ierr].revents &&
		    !pump_output(r, h->stderr_fd, SBX_CTL_STDERR))
			r->err_open = false;
		if (iexit >= 0 && p[iexit].revents) {
			r->exited = true;
			if (!r->client_gone && !r->stopping)
				r->deadline = now_ms() + EXIT_GRACE_MS;
			else
				r->deadline = now_ms() + 1;
		}
		if (r->client_gone) {
			/* Nobody to send to: discard. */
			sbx_ctl_wbuf_fini(&r->wb);
			sbx_ctl_wbuf_init(&r->wb);
		} else if (sbx_ctl_wbuf_pending(&r->wb) &&
			   sbx_ctl_wbuf_flush(&r->wb, r->sock) < 0) {
			sbx_error_clear();
			client_gone(r);
		}
	}
}

static void serve(struct fs_ctl *ctl, int sock)
{
	struct fs *fs = ctl->fs;
	struct sbx_sandbox *sb = fs_sandbox(fs);
	struct sbx_ctl_request *req = NULL;
	struct sbx_exec_request xr = { 0 };
	struct run r = { .ctl = ctl, .sock = sock };
	char **env = NULL, **owned = NULL, *cwd = NULL;
	int rc, status = 0, fds[3] = { -1, -1, -1 }, nfds = 0;
	uint32_t started_flags = 0;
	uint8_t b8[8];

	sbx_ctl_rbuf_init(&r.rb, SBX_CTL_REQUEST_MAX);
	sbx_ctl_wbuf_init(&r.wb);
	rc = read_request(&r, &req, fds, &nfds);
	if (rc < 0) {
		send_error(&r, rc, SBX_CTL_ERR_SBX);
		goto out;
	}
	if (rc == 1) {
		/* PING (`sbx status`): answer once the daemon's main lock
		 * could be taken, so that a deadlocked daemon does not. */
		fs_ping(fs);
		sbx_ctl_put_u32(b8, (uint32_t)getpid());
		sbx_ctl_wbuf_put(&r.wb, SBX_CTL_PONG, b8, 4);
		goto out;
	}
	if (!sb->ops->exec_start) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOSYS,
				   "session %s: this provider cannot run "
				   "commands", fs_session(fs));
		send_error(&r, rc, SBX_CTL_ERR_SBX);
		goto out;
	}
	env = build_env(&owned, req, fs_session(fs));
	cwd = resolve_cwd(sb, req->cwd);
	xr.argv = (const char *const *)req->argv;
	xr.envp = (const char *const *)env;
	xr.cwd = cwd;
	xr.tty = req->flags & SBX_CTL_REQ_TTY;
	xr.rows = req->rows;
	xr.cols = req->cols;
	/* The client's umask, not the daemon's umask(0). */
	xr.has_umask = req->flags & SBX_CTL_REQ_UMASK;
	xr.umask = (mode_t)req->umask;
	xr.stdio[0] = xr.stdio[1] = xr.stdio[2] = -1;
	if ((req->flags & SBX_CTL_REQ_FDS) && nfds == 3 && !xr.tty) {
		/* The client's own descriptors: the command writes straight
		 * into them (same machine, zero copies). */
		memcpy(xr.stdio, fds, sizeof(xr.stdio));
		started_flags |= SBX_CTL_STARTED_FDS;
	}

	rc = fs_barrier_before(fs);
	if (rc < 0) {
		sbx_error_prefix(rc, "exec barrier (flush before the command)");
		send_error(&r, rc, SBX_CTL_ERR_SBX);
		goto out;
	}
	rc = sb->ops->exec_start(sb, &xr, &r.h);
	if (rc == -EXDEV && started_flags) {
		/* The provider cannot use descriptors: stream frames. */
		sbx_error_clear();
		xr.stdio[0] = xr.stdio[1] = xr.stdio[2] = -1;
		started_flags = 0;
		rc = sb->ops->exec_start(sb, &xr, &r.h);
	}
	for (int i = 0; i < nfds; i++) {
		close(fds[i]);
		fds[i] = -1;
	}
	nfds = 0;
	if (rc < 0) {
		int kind = sbx_error_last()->detail == SBX_EXEC_ERR_PROGRAM
				   ? SBX_CTL_ERR_EXEC : SBX_CTL_ERR_SBX;

		sbx_debug("session %s: exec %s: %s", fs_session(fs),
			  req->argv[0], sbx_error_last()->msg);
		send_error(&r, rc, kind);
		goto out;
	}
	sbx_debug("session %s: exec %s (pid %d) in %s", fs_session(fs),
		  req->argv[0], (int)r.h->pid, cwd);
	sbx_ctl_put_u32(b8, (uint32_t)r.h->pid);
	sbx_ctl_put_u32(b8 + 4, started_flags);
	sbx_ctl_wbuf_put(&r.wb, SBX_CTL_STARTED, b8, 8);
	if (sbx_ctl_wbuf_flush(&r.wb, sock) < 0) {
		sbx_error_clear();
		client_gone(&r);
	}
	r.out_open = r.h->stdout_fd >= 0;
	r.err_open = r.h->stderr_fd >= 0;
	/* Frames that came in the same read as the REQUEST. */
	client_frames(&r);
	pump_stdin(&r);
	run_loop(&r);

	if (!r.exited || sbx_exec_wait(r.h, &status) < 0) {
		/* Gone client or stopping daemon, command still running. */
		sbx_exec_free(r.h);
		r.h = NULL;
		if (r.client_gone)
			goto out;
		rc = sbx_error_set(SBX_ERR_STATE, -ESHUTDOWN,
				   "session %s's daemon is stopping; the "
				   "command was killed", fs_session(fs));
		send_error(&r, rc, SBX_CTL_ERR_SBX);
		goto out;
	}
	while (sbx_exec_wait(r.h, &status) == -EAGAIN) {
		struct pollfd p = { .fd = r.h->exit_fd, .events = POLLIN };

		poll(&p, 1, 100);
	}
	rc = fs_barrier_after(fs);
	if (rc < 0) {
		sbx_warn("session %s: exec barrier after %s: %s",
			 fs_session(fs), req->argv[0], sbx_error_last()->msg);
		sbx_error_clear();
	}
	if (r.stopping && !WIFEXITED(status)) {
		rc = sbx_error_set(SBX_ERR_STATE, -ESHUTDOWN,
				   "session %s's daemon is stopping; the "
				   "command was stopped", fs_session(fs));
		send_error(&r, rc, SBX_CTL_ERR_SBX);
		goto out;
	}
	sbx_ctl_put_u32(b8, (uint32_t)status);
	sbx_ctl_wbuf_put(&r.wb, SBX_CTL_EXIT, b8, 4);
out:
	flush_blocking(&r, 5000);
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	sbx_exec_free(r.h);
	free(r.inbuf);
	free(cwd);
	free(env);
	sbx_ctl_env_free(owned);
	sbx_ctl_request_free(req);
	sbx_ctl_rbuf_fini(&r.rb);
	sbx_ctl_wbuf_fini(&r.wb);
	sbx_error_clear();
}

static void *conn_thread(void *arg)
{
	struct conn *c = arg;
	struct fs_ctl *ctl = c->ctl;

	serve(ctl, c->sock);
	close(c->sock);
	free(c);
	pthread_mutex_lock(&ctl->lock);
	ctl->nconn--;
	pthread_cond_broadcast(&ctl->cond);
	pthread_mutex_unlock(&ctl->lock);
	return NULL;
}

static bool peer_allowed(int sock)
{
	struct ucred cr;
	socklen_t l = sizeof(cr);

	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &l) < 0)
		return false;
	return cr.uid == geteuid() || cr.uid == 0;
}

static void *accept_thread(void *arg)
{
	struct fs_ctl *ctl = arg;
	sigset_t all;

	/* Signals belong to the daemon's main thread. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	/* Until stopped (the wake pipe) or poll itself fails. */
	while (sbx_waitfd(ctl->listen_fd, POLLIN, ctl->wake[0], -1, NULL) ==
	       SBX_WAITFD_READY) {
		pthread_attr_t attr;
		pthread_t t;
		struct conn *c;
		int s;

		s = accept4(ctl->listen_fd, NULL, NULL,
			    SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (s < 0) {
			if (errno == EMFILE || errno == ENFILE)
				poll(NULL, 0, 100);
			continue;
		}
		if (!peer_allowed(s)) {
			sbx_warn("session %s: control connection from another "
				 "user refused", fs_session(ctl->fs));
			close(s);
			continue;
		}
		c = sbx_xmalloc(sizeof(*c));
		c->ctl = ctl;
		c->sock = s;
		pthread_mutex_lock(&ctl->lock);
		ctl->nconn++;
		pthread_mutex_unlock(&ctl->lock);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &attr, conn_thread, c) != 0) {
			close(s);
			free(c);
			pthread_mutex_lock(&ctl->lock);
			ctl->nconn--;
			pthread_mutex_unlock(&ctl->lock);
		}
		pthread_attr_destroy(&attr);
	}
	return NULL;
}

int fs_ctl_start(struct fs *fs, const char *path, struct fs_ctl **out)
{
	struct fs_ctl *ctl;
	int rc;

	*out = NULL;
	ctl = sbx_xcalloc(1, sizeof(*ctl));
	ctl->fs = fs;
	ctl->listen_fd = ctl->wake[0] = ctl->wake[1] = -1;
	pthread_mutex_init(&ctl->lock, NULL);
	pthread_cond_init(&ctl->cond, NULL);
	ctl->path = sbx_xstrdup(path);
	if (pipe2(ctl->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		rc = sbx_error_os("pipe");
		goto fail;
	}
	rc = sbx_ctl_listen(path, &ctl->listen_fd);
	if (rc < 0)
		goto fail;
	rc = pthread_create(&ctl->accept_thread, NULL, accept_thread, ctl);
	if (rc != 0) {
		rc = sbx_error_set(SBX_ERR_OS, -rc, "start control thread: %s",
				   strerror(rc));
		unlink(path);
		goto fail;
	}
	ctl->accept_started = true;
	*out = ctl;
	return 0;
fail:
	fs_ctl_stop(ctl);
	return rc;
}

void fs_ctl_stop(struct fs_ctl *ctl)
{
	if (!ctl)
		return;
	if (ctl->wake[1] >= 0 && write(ctl->wake[1], "x", 1) < 0) {
		/* non-blocking pipe with room: cannot fail */
	}
	if (ctl->accept_started)
		pthread_join(ctl->accept_thread, NULL);
	pthread_mutex_lock(&ctl->lock);
	while (ctl->nconn > 0)
		pthread_cond_wait(&ctl->cond, &ctl->lock);
	pthread_mutex_unlock(&ctl->lock);
	if (ctl->listen_fd >= 0) {
		close(ctl->listen_fd);
		if (ctl->accept_started)
			unlink(ctl->path);
	}
	if (ctl->wake[0] >= 0)
		close(ctl->wake[0]);
	if (ctl->wake[1] >= 0)
		close(ctl->wake[1]);
	pthread_mutex_destroy(&ctl->lock);
	pthread_cond_destroy(&ctl->cond);
	free(ctl->path);
	free(ctl);
}
