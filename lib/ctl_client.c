/*
 * The exec client, sbx_ctl_run(): connect to a session daemon's control
 * socket, send the REQUEST (with our descriptors when the command may read
 * them itself), then pump stdin, signals and window sizes one way and
 * stdout/stderr the other until EXIT; see sbx/ctl.h for the contract.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include "sbx/ctl.h"
#include "sbx/env.h"
#include "sbx/xmalloc.h"

#include "ctl_i.h"

/* Signal plumbing: handlers write the signal number to a self-pipe. */
static int sig_pipe[2] = { -1, -1 };
static const int fwd_signals[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT,
				   SIGWINCH };
#define NFWD (sizeof(fwd_signals) / sizeof(fwd_signals[0]))

/* Terminal restore: also from atexit() as a last resort. */
static struct termios saved_tio;
static int saved_tio_fd = -1;

static void tty_restore(void)
{
	if (saved_tio_fd >= 0) {
		tcsetattr(saved_tio_fd, TCSAFLUSH, &saved_tio);
		saved_tio_fd = -1;
	}
}

static void on_signal(int sig)
{
	int e = errno;
	unsigned char c = (unsigned char)sig;

	if (sig_pipe[1] >= 0 && write(sig_pipe[1], &c, 1) < 0) {
		/* pipe full: the signal is coalesced with a pending one */
	}
	errno = e;
}

static int tty_raw(int fd)
{
	static bool atexit_done;
	struct termios tio;

	if (tcgetattr(fd, &saved_tio) < 0)
		return sbx_error_os("tcgetattr");
	tio = saved_tio;
	cfmakeraw(&tio);
	tio.c_cc[VMIN] = 1;
	tio.c_cc[VTIME] = 0;
	saved_tio_fd = fd;
	if (!atexit_done) {
		atexit(tty_restore);
		atexit_done = true;
	}
	if (tcsetattr(fd, TCSADRAIN, &tio) < 0) {
		saved_tio_fd = -1;
		return sbx_error_os("tcsetattr");
	}
	return 0;
}

/* Write everything to a (possibly non-blocking) local descriptor. */
static int write_all(int fd, const uint8_t *p, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, p, len);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd pf = { .fd = fd,
						     .events = POLLOUT };

				poll(&pf, 1, -1);
				continue;
			}
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

static void get_winsize(int fd, unsigned short *rows, unsigned short *cols)
{
	struct winsize ws;

	*rows = *cols = 0;
	if (fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0) {
		*rows = ws.ws_row;
		*cols = ws.ws_col;
	}
}

static int daemon_down(int rc, const char *session, const char *path)
{
	const char *s = session ? session : "?";

	return sbx_error_set(SBX_ERR_STATE, rc,
			     "session %s's daemon is not running (%s: %s); "
			     "run `sbx mount %s`",
			     s, path, strerror(-rc), s);
}

struct client {
	const struct sbx_ctl_run_opts *o;
	int sock;
	struct sbx_ctl_rbuf rb;
	struct sbx_ctl_wbuf wb;
	bool stdin_open;
	bool out_broken;   /* local stdout gave EPIPE: discard */
	bool err_broken;
	bool started;
	bool fds_sent;     /* stdin is read only once STARTED says how */
	bool done;
	int status;
	int tty_fd;        /* the local terminal (for resize) or -1 */
};

static int client_frame(struct client *c, const struct sbx_ctl_frame *f)
{
	const struct sbx_ctl_run_opts *o = c->o;
	int rc;

	switch (f->type) {
	case SBX_CTL_STARTED:
		c->started = true;
		if (f->len >= 8 &&
		    (sbx_ctl_get_u32(f->data + 4) & SBX_CTL_STARTED_FDS)) {
			/* The command reads our stdin itself. */
			c->stdin_open = false;
		}
		return 0;
	case SBX_CTL_STDOUT:
	case SBX_CTL_STDERR: {
		bool is_out = f->type == SBX_CTL_STDOUT;
		bool *broken = is_out ? &c->out_broken : &c->err_broken;
		int fd = is_out ? o->out_fd : o->err_fd;

		if (*broken || fd < 0)
			return 0;
		rc = write_all(fd, f->data, f->len);
		if (rc == -EPIPE) {
			/* As if the command's own write failed: SIGPIPE. */
			uint8_t p[4];

			*broken = true;
			sbx_ctl_put_u32(p, SIGPIPE);
			sbx_ctl_wbuf_put(&c->wb, SBX_CTL_SIGNAL, p, 4);
			return 0;
		}
		if (rc < 0) {
			errno = -rc;
			return sbx_error_os("write %s", is_out ? "stdout"
							       : "stderr");
		}
		return 0;
	}
	case SBX_CTL_EXIT:
		if (f->len < 4)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "control protocol: short EXIT");
		c->status = (int)sbx_ctl_get_u32(f->data);
		c->done = true;
		return 0;
	case SBX_CTL_ERROR: {
		int err, kind;

		if (f->len < 8)
			return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					     "control protocol: short ERROR");
		err = (int)sbx_ctl_get_u32(f->data);
		kind = (int)sbx_ctl_get_u32(f->data + 4);
		if (err <= 0 || err > 4095)
			err = EIO;
		return sbx_error_setd(SBX_ERR_REMOTE, -err, kind, "%.*s",
				      (int)(f->len - 8),
				      (const char *)f->data + 8);
	}
	default:
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "control protocol: unexpected frame "
				     "type %u from the daemon", f->type);
	}
}

static void client_signal(struct client *c, int sig)
{
	uint8_t p[4];

	if (sig == SIGWINCH) {
		unsigned short rows, cols;

		if (c->tty_fd < 0)
			return;
		get_winsize(c->tty_fd, &rows, &cols);
		ctl_put_u16(p, rows);
		ctl_put_u16(p + 2, cols);
		sbx_ctl_wbuf_put(&c->wb, SBX_CTL_RESIZE, p, 4);
		return;
	}
	sbx_ctl_put_u32(p, (uint32_t)sig);
	sbx_ctl_wbuf_put(&c->wb, SBX_CTL_SIGNAL, p, 4);
}

static int client_loop(struct client *c)
{
	const struct sbx_ctl_run_opts *o = c->o;
	int rc;

	while (!c->done) {
		struct pollfd p[3];
		int np = 0, isock, iin = -1, isig = -1;
		bool want_in;

		rc = sbx_ctl_wbuf_flush(&c->wb, c->sock);
		if (rc == -EPIPE || rc == -ECONNRESET) {
			/*
			 * The daemon stopped reading (the command is done with
			 * its input): drop what it will never want and keep
			 * reading, its EXIT frame is on the way or queued.
			 */
			sbx_error_clear();
			c->wb.start = c->wb.end = 0;
			c->stdin_open = false;
		} else if (rc < 0) {
			return sbx_error_prefix(rc, "session %s", o->session);
		}
		/* Read local stdin only when the socket has taken what we sent
		 * before: back-pressure instead of unbounded buffering, and
		 * the socket is always read, so no deadlock. */
		want_in = c->stdin_open && (c->started || !c->fds_sent) &&
			  sbx_ctl_wbuf_pending(&c->wb) < SBX_CTL_DATA_MAX;
		isock = np;
		p[np++] = (struct pollfd){
			.fd = c->sock,
			.events = POLLIN |
				  (sbx_ctl_wbuf_pending(&c->wb) ? POLLOUT : 0)
		};
		if (want_in) {
			iin = np;
			p[np++] = (struct pollfd){ .fd = o->in_fd,
						   .events = POLLIN };
		}
		if (sig_pipe[0] >= 0) {
			isig = np;
			p[np++] = (struct pollfd){ .fd = sig_pipe[0],
						   .events = POLLIN };
		}
		rc = poll(p, (nfds_t)np, -1);
		if (rc < 0) {
			if (errno == EINTR)
				continue;
			return sbx_error_os("poll");
		}
		if (isig >= 0 && p[isig].revents) {
			unsigned char sigs[64];
			ssize_t n = read(sig_pipe[0], sigs, sizeof(sigs));

			for (ssize_t i = 0; i < n; i++)
				client_signal(c, sigs[i]);
		}
		if (iin >= 0 && p[iin].revents) {
			ssize_t n = sbx_ctl_wbuf_put_from_fd(
				&c->wb, SBX_CTL_STDIN, o->in_fd,
				SBX_CTL_DATA_MAX);

			if (n == 0 || (n < 0 && n != -EAGAIN && n != -EINTR)) {
				/* EOF (or an unreadable stdin: same thing
				 * for the command). */
				c->stdin_open = false;
				sbx_ctl_wbuf_put(&c->wb, SBX_CTL_STDIN_EOF,
						 NULL, 0);
			}
		}
		if (p[isock].revents & (POLLIN | POLLHUP | POLLERR)) {
			struct sbx_ctl_frame f;
			ssize_t n = sbx_ctl_rbuf_fill(&c->rb, c->sock);

			if (n == 0 || (n < 0 && n != -EAGAIN)) {
				/* Drain complete frames first: EXIT may be
				 * followed directly by the close. */
				while ((rc = sbx_ctl_rbuf_next(&c->rb, &f)) > 0)
					if ((rc = client_frame(c, &f)) < 0 ||
					    c->done)
						return rc;
				if (n == 0 || n == -ECONNRESET) {
					return sbx_error_set(
						SBX_ERR_PROTO, -ECONNRESET,
						"session %s's daemon closed "
						"the connection before the "
						"command's exit status "
						"arrived (did the daemon "
						"stop?)", o->session);
				}
				return sbx_error_prefix((int)n, "session %s",
							o->session);
			}
			while ((rc = sbx_ctl_rbuf_next(&c->rb, &f)) > 0) {
				rc = client_frame(c, &f);
				if (rc < 0)
					return rc;
				if (c->done)
					return 0;
			}
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

/* Send the REQUEST frame with our three descriptors attached. */
static int send_with_fds(int sock, const uint8_t *payload, size_t plen,
			 const struct sbx_ctl_run_opts *o)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int) * 3)];
	} cm;
	uint8_t hdr[SBX_CTL_HEADER_SIZE];
	int fds[3] = { o->in_fd, o->out_fd, o->err_fd };
	size_t total = sizeof(hdr) + plen, off = 0;

	ctl_put_header(hdr, SBX_CTL_REQUEST, (uint32_t)plen);
	memset(&cm, 0, sizeof(cm));
	while (off < total) {
		struct iovec iov[2];
		struct msghdr mh = { 0 };
		int niov = 0;
		ssize_t n;

		if (off < sizeof(hdr)) {
			iov[niov].iov_base = hdr + off;
			iov[niov++].iov_len = sizeof(hdr) - off;
			iov[niov].iov_base = (void *)payload;
			iov[niov++].iov_len = plen;
		} else {
			iov[niov].iov_base = (void *)(payload + off -
						      sizeof(hdr));
			iov[niov++].iov_len = total - off;
		}
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)niov;
		if (off == 0) {
			struct cmsghdr *c;

			mh.msg_control = cm.buf;
			mh.msg_controllen = sizeof(cm.buf);
			c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(fds));
			memcpy(CMSG_DATA(c), fds, sizeof(fds));
		}
		n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = sock,
						    .events = POLLOUT };

				poll(&p, 1, 1000);
				continue;
			}
			return sbx_error_os("send to control socket");
		}
		off += (size_t)n;
	}
	return 0;
}

/*
 * This process's umask, without changing it: /proc/self/status has it
 * (Linux 4.7); else the umask(2) round trip, which briefly changes it for
 * every thread (the clients are single-threaded).
 */
static mode_t process_umask(void)
{
	char line[128];
	unsigned v;
	mode_t m;
	FILE *f = fopen("/proc/self/status", "re");

	if (f) {
		while (fgets(line, sizeof(line), f)) {
			if (sscanf(line, "Umask: %o", &v) == 1) {
				fclose(f);
				return (mode_t)(v & 0777);
			}
		}
		fclose(f);
	}
	m = umask(022);
	umask(m);
	return m & 0777;
}

void sbx_ctl_run_opts_stdio(struct sbx_ctl_run_opts *o, int tty)
{
	o->tty = tty >= 0 ? tty != 0 : (isatty(0) && isatty(1));
	o->in_fd = 0;
	o->out_fd = 1;
	o->err_fd = 2;
	o->forward_signals = true;
	o->pass_fds = true;
}

int sbx_ctl_run(const struct sbx_ctl_run_opts *o, int *status_out)
{
	struct sigaction old[NFWD];
	bool handlers = false;
	struct sbx_ctl_request req = { 0 };
	struct client c = { .o = o, .sock = -1, .tty_fd = -1 };
	uint8_t *payload = NULL;
	size_t plen = 0, i;
	int rc;

	*status_out = 0;
	sbx_ctl_rbuf_init(&c.rb, SBX_CTL_DATA_MAX);
	sbx_ctl_wbuf_init(&c.wb);

	req.flags = o->tty ? SBX_CTL_REQ_TTY : 0;
	/* The command creates files as the caller would (docs/exec.md). */
	req.flags |= SBX_CTL_REQ_UMASK;
	req.umask = process_umask();
	req.cwd = (char *)(o->cwd ? o->cwd : "");
	req.argv = (char **)o->argv;
	req.envp = (char **)o->envp;
	if (o->tty) {
		c.tty_fd = isatty(o->in_fd) ? o->in_fd
			   : isatty(o->out_fd) ? o->out_fd : -1;
		get_winsize(c.tty_fd, &req.rows, &req.cols);
	}
	if (o->pass_fds && !o->tty && o->in_fd >= 0 && o->out_fd >= 0 &&
	    o->err_fd >= 0) {
		if (!sbx_env_str("SBX_EXEC_FRAMED"))
			req.flags |= SBX_CTL_REQ_FDS;
	}
	rc = sbx_ctl_request_encode(&payload, &plen, &req);
	if (rc < 0)
		goto out;

	rc = sbx_ctl_connect(o->socket_path, o->connect_timeout_ms, &c.sock);
	if (rc == -ECONNREFUSED || rc == -ENOENT) {
		rc = daemon_down(rc, o->session, o->socket_path);
		goto out;
	}
	if (rc < 0)
		goto out;
	if (req.flags & SBX_CTL_REQ_FDS) {
		rc = send_with_fds(c.sock, payload, plen, o);
		if (rc < 0)
			goto out;
		c.fds_sent = true;
	} else {
		sbx_ctl_wbuf_put(&c.wb, SBX_CTL_REQUEST, payload, plen);
	}

	if (o->forward_signals) {
		if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
			rc = sbx_error_os("pipe");
			goto out;
		}
		for (i = 0; i < NFWD; i++) {
			struct sigaction sa = { .sa_handler = on_signal };

			sigemptyset(&sa.sa_mask);
			sa.sa_flags = SA_RESTART;
			sigaction(fwd_signals[i], &sa, &old[i]);
		}
		handlers = true;
	}
	/* stdin stays blocking (it may be shared with the parent shell): it is
	 * read only after poll() reported it readable. */
	if (o->in_fd >= 0)
		c.stdin_open = true;
	else
		sbx_ctl_wbuf_put(&c.wb, SBX_CTL_STDIN_EOF, NULL, 0);
	if (o->tty && c.tty_fd >= 0 && isatty(o->in_fd)) {
		rc = tty_raw(o->in_fd);
		if (rc < 0)
			goto out;
	}

	rc = client_loop(&c);
	if (rc == 0)
		*status_out = c.status;
out:
	tty_restore();
	if (handlers) {
		for (i = 0; i < NFWD; i++)
			sigaction(fwd_signals[i], &old[i], NULL);
		close(sig_pipe[0]);
		close(sig_pipe[1]);
		sig_pipe[0] = sig_pipe[1] = -1;
	}
	if (c.sock >= 0)
		close(c.sock);
	free(payload);
	sbx_ctl_rbuf_fini(&c.rb);
	sbx_ctl_wbuf_fini(&c.wb);
	return rc;
}
