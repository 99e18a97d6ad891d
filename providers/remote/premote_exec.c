/*
 * Remote exec: the handle of sbx/exec.h over the agent's exec routes.
 *
 * Start.  POST /v1/exec with "attach": the answer is the output stream
 * itself, so a short command (`true`) costs one round trip: its first
 * frame names the process, then come output, exit and end.  exec_start
 * waits (bounded by the timeout) for that first frame or the error.
 *
 * Descriptors.  The handle's descriptors are the daemon's ends of Unix
 * socket pairs (sockets rather than pipes so that our writes can use
 * MSG_NOSIGNAL); our ends are fed by two threads:
 *   - the output thread runs the stream and writes each output frame into
 *     the stdout/stderr socket, blocking while the daemon does not read
 *     (back-pressure reaches the agent through TCP, and the command blocks
 *     there, so nothing is lost);
 *   - the stdin thread reads what the daemon writes and POSTs it to
 *     /v1/exec/ID/stdin, and ?eof=1 at EOF.
 * In tty mode one socket carries both directions, like a pty master.
 * exit_fd is an eventfd written once the exit status is known and the
 * output sockets have been shut down (so output EOF comes first).
 *
 * Dropped stream.  The output thread re-attaches with
 * GET /v1/exec/ID/output?since=<last seq> (backoff 100 ms → 5 s, for at
 * most the configured timeout in total), skipping frames it has seen, so
 * nothing is lost or duplicated.  If it cannot, the command's stderr gets
 * a line saying so and the status is exit 255 (as ssh does).
 *
 * Threads: the handle ops run on the daemon's connection thread; `lock`
 * protects the fields marked so.  free() cancels both threads through
 * `cancel_fd` and joins them.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/clock.h"
#include "sbx/exec.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/proto_exec.h"
#include "sbx/waitfd.h"
#include "sbx/xmalloc.h"

#include "premote_i.h"

#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define STDIN_CHUNK (64 * 1024)
#define SOCK_BUF (1024 * 1024)
#define DELETE_TIMEOUT_MS 5000
#define LOST_STATUS (255 << 8)

enum { ST_STARTING, ST_RUNNING, ST_FAILED };

struct rexec {
	struct sbx_exec_handle base;
	struct premote_sandbox *s;
	bool tty;
	int out_w;            /* our end: output (tty: also input) */
	int err_w;            /* our end: stderr; -1 in tty mode */
	int in_r;             /* our end: stdin (tty: == out_w) */
	int cancel_fd;        /* eventfd, readable once freeing */
	char *body;           /* the start request */
	pthread_t out_thread, in_thread;
	bool out_started, in_started;

	pthread_mutex_t lock;
	pthread_cond_t cond;  /* CLOCK_MONOTONIC */
	int state;            /* ST_*; lock */
	char *id;             /* lock; constant once RUNNING */
	int start_rc;         /* ST_FAILED: the error; lock */
	int start_klass;
	long start_detail;
	char start_msg[512];
	bool exited;          /* status known and output shut; lock */
	int status;           /* lock */

	/* output thread only */
	uint64_t out_seq;     /* newest output frame written */
	bool have_seq;
	bool got_exit;
	int exit_status;
};

static bool canceled(const struct rexec *x)
{
	return sbx_waitfd(-1, 0, x->cancel_fd, 0, NULL) == SBX_WAITFD_WOKEN;
}

/* Sleep `ms` unless cancelled first; false when cancelled. */
static bool nap(const struct rexec *x, long ms)
{
	return sbx_waitfd(-1, 0, x->cancel_fd, (int)ms, NULL) ==
	       SBX_WAITFD_TIMEOUT;
}

int premote_exit_status(const cJSON *exit_obj, int *status)
{
	return sbx_exec_exit_decode(exit_obj, status);
}

/* Write all of buf to our end of a socket; drops it when cancelled. */
static void put(struct rexec *x, int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len && fd >= 0) {
		ssize_t n = send(fd, p, len, MSG_NOSIGNAL);

		if (n > 0) {
			p += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			if (sbx_waitfd(fd, POLLOUT, x->cancel_fd, -1, NULL) !=
			    SBX_WAITFD_READY) {
				sbx_error_clear();
				return; /* cancelled (or poll failed) */
			}
			continue;
		}
		return; /* EPIPE: the daemon let go of the output */
	}
}

/* ---- output stream -------------------------------------------------------- */

static void set_failed(struct rexec *x, int rc)
{
	const struct sbx_error *e = sbx_error_last();

	pthread_mutex_lock(&x->lock);
	x->state = ST_FAILED;
	x->start_rc = rc;
	x->start_klass = e->klass ? e->klass : SBX_ERR_REMOTE;
	x->start_detail = e->detail;
	snprintf(x->start_msg, sizeof(x->start_msg), "%s",
		 e->klass ? e->msg : strerror(-rc));
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
}

static int on_output(const cJSON *hdr, const void *data, size_t len,
		     void *payload)
{
	struct rexec *x = payload;
	struct sbx_exec_frame f;
	int rc = sbx_exec_frame_decode(hdr, &f);

	if (rc < 0)
		return rc;
	switch (f.kind) {
	case SBX_EXEC_FRAME_LOST:
		/* Dropped by the agent before we came back for it. */
		sbx_warn("exec %s: part of the output was lost while "
			 "disconnected", x->id);
		break;
	case SBX_EXEC_FRAME_STARTED:
		pthread_mutex_lock(&x->lock);
		if (!x->id)
			x->id = sbx_xstrdup(f.id);
		if (x->state == ST_STARTING)
			x->state = ST_RUNNING;
		pthread_cond_broadcast(&x->cond);
		pthread_mutex_unlock(&x->lock);
		break;
	case SBX_EXEC_FRAME_OUTPUT:
		if (x->have_seq && f.seq <= x->out_seq)
			break; /* seen before the re-attach */
		x->out_seq = f.seq;
		x->have_seq = true;
		if (len)
			put(x, f.stream && x->err_w >= 0 ? x->err_w : x->out_w,
			    data, len);
		break;
	case SBX_EXEC_FRAME_EXIT:
		x->exit_status = f.status;
		if (f.has_watch_seq)
			premote_note_exec_seq(x->s, f.watch_seq);
		x->got_exit = true;
		break;
	default:
		break;
	}
	return 0;
}

/* The start request, or a re-attach after a dropped stream. */
static int run_stream(struct rexec *x, bool attach)
{
	struct premote_req r = {
		.timeout_ms = -1, .cancel_fd = x->cancel_fd,
		.frames = on_output, .payload = x,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	char *route = NULL;
	int rc;

	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	if (attach) {
		r.method = "POST";
		r.route = "/v1/exec";
		r.body = x->body;
		r.body_len = strlen(x->body);
		r.content_type = SBX_CT_JSON;
	} else {
		char *id = sbx_proto_query_escape(x->id);

		route = sbx_xasprintf("/v1/exec/%s/output", id);
		free(id);
		r.method = "GET";
		r.route = route;
		r.idempotent = true;
		if (x->have_seq)
			premote_q_u64(&q, "since", x->out_seq);
		r.query = sbx_buf_ptr(&q);
	}
	premote_resp_init(&resp);
	rc = premote_http_do(x->s->http, &r, &resp);
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	free(route);
	return rc;
}

static void finish(struct rexec *x, int status)
{
	uint64_t one = 1;

	/* Output EOF before the exit, as a local process gives it. */
	shutdown(x->out_w, SHUT_WR);
	if (x->err_w >= 0)
		shutdown(x->err_w, SHUT_WR);
	pthread_mutex_lock(&x->lock);
	x->status = status;
	x->exited = true;
	pthread_cond_broadcast(&x->cond);
	pthread_mutex_unlock(&x->lock);
	if (write(x->base.exit_fd, &one, sizeof(one)) < 0) {
		/* an eventfd with room: cannot fail */
	}
}

static void *output_thread(void *arg)
{
	struct rexec *x = arg;
	long backoff = BACKOFF_MIN_MS;
	long long dropped;
	bool starting;
	sigset_t all;
	char msg[700];
	int rc;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	rc = run_stream(x, true);
	pthread_mutex_lock(&x->lock);
	starting = x->state == ST_STARTING;
	pthread_mutex_unlock(&x->lock);
	if (starting) {
		if (rc >= 0)
			rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					   "exec: the agent did not name the "
					   "process");
		set_failed(x, rc);
		return NULL;
	}
	dropped = sbx_clock_mono_ms();
	/* Without the exit record, re-attach; the end record alone may
	 * be lost harmlessly. */
	while (!x->got_exit) {
		if (rc == -ECANCELED || canceled(x))
			return NULL; /* free() is waiting for us */
		if (rc >= 0)
			rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					   "the output stream ended without "
					   "an exit status");
		/* Only a lost connection (or a proxy's answer) is worth
		 * another try; an unknown id means the agent restarted. */
		if (!premote_errno_is_transport(rc) ||
		    sbx_clock_mono_ms() - dropped >
			    premote_http_timeout_ms(x->s->http))
			goto lost;
		sbx_debug("exec %s: output stream dropped (%s); re-attaching",
			  x->id, sbx_error_last()->msg);
		sbx_error_clear();
		if (!nap(x, backoff))
			return NULL;
		backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
						       : backoff * 2;
		rc = run_stream(x, false);
	}
	sbx_error_clear();
	finish(x, x->exit_status);
	return NULL;
lost:
	snprintf(msg, sizeof(msg),
		 "%ssbx: lost the connection to the command in the sandbox: "
		 "%s%s", x->tty ? "\r\n" : "", sbx_error_last()->msg,
		 x->tty ? "\r\n" : "\n");
	put(x, x->err_w >= 0 ? x->err_w : x->out_w, msg, strlen(msg));
	sbx_warn("exec %s: %s", x->id, sbx_error_last()->msg);
	sbx_error_clear();
	finish(x, LOST_STATUS);
	return NULL;
}

/* ---- stdin ----------------------------------------------------------------- */

static int post_ctl(struct rexec *x, const char *what, const char *query,
		    const void *body, size_t len, const char *ct, long tmo)
{
	struct premote_req r = {
		.method = "POST", .query = query, .body = body,
		.body_len = len, .content_type = ct, .cancel_fd = x->cancel_fd,
		.timeout_ms = tmo,
	};
	struct premote_resp resp;
	char *id = sbx_proto_query_escape(x->id);
	char *route = sbx_xasprintf("/v1/exec/%s/%s", id, what);
	int rc;

	r.route = route;
	premote_resp_init(&resp);
	rc = premote_http_do(x->s->http, &r, &resp);
	premote_resp_fini(&resp);
	free(route);
	free(id);
	return rc;
}

/* POST a JSON control body (taken) to /v1/exec/ID/`what`. */
static int post_json(struct rexec *x, const char *what, cJSON *body)
{
	char *text = sbx_json_print(body, false);
	int rc = post_ctl(x, what, NULL, text, strlen(text), SBX_CT_JSON, 0);

	free(text);
	cJSON_Delete(body);
	return rc;
}

static void *stdin_thread(void *arg)
{
	struct rexec *x = arg;
	char *buf = sbx_xmalloc(STDIN_CHUNK);
	bool forward = true;
	sigset_t all;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	/* Until cancelled (or poll itself fails). */
	while (sbx_waitfd(x->in_r, POLLIN, x->cancel_fd, -1, NULL) ==
	       SBX_WAITFD_READY) {
		ssize_t n;

		n = read(x->in_r, buf, STDIN_CHUNK);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0) {
			if (forward && post_ctl(x, "stdin", "eof=1", "", 0,
						SBX_CT_OCTET, 0) < 0)
				sbx_error_clear();
			break;
		}
		if (!forward)
			continue; /* the command no longer reads: discard */
		if (post_ctl(x, "stdin", NULL, buf, (size_t)n, SBX_CT_OCTET,
			     0) < 0) {
			/* Exited, or closed its stdin: like EPIPE. */
			sbx_debug("exec %s: stdin: %s", x->id,
				  sbx_error_last()->msg);
			sbx_error_clear();
			forward = false;
		}
	}
	free(buf);
	return NULL;
}

/* ---- handle ops ------------------------------------------------------------ */

static bool has_exited(struct rexec *x)
{
	bool e;

	pthread_mutex_lock(&x->lock);
	e = x->exited;
	pthread_mutex_unlock(&x->lock);
	return e;
}

static int rx_close_stdin(struct sbx_exec_handle *h)
{
	struct rexec *x = (struct rexec *)h;

	if (x->base.stdin_fd < 0)
		return 0;
	if (x->tty) {
		/* The terminal's EOF character, to our end of the socket. */
		if (send(x->base.stdin_fd, "\x04", 1, MSG_NOSIGNAL) < 0 &&
		    errno != EAGAIN && errno != EPIPE)
			return sbx_error_os("send EOF to the terminal");
	} else {
		close(x->base.stdin_fd);
	}
	x->base.stdin_fd = -1;
	return 0;
}

static int rx_signal(struct sbx_exec_handle *h, int sig)
{
	struct rexec *x = (struct rexec *)h;
	cJSON *b;
	int rc;

	if (has_exited(x))
		return sbx_error_set(SBX_ERR_STATE, -ESRCH,
				     "the command has exited");
	b = sbx_exec_signal_encode(sig);
	if (!b)
		return sbx_error_set(SBX_ERR_OS, -EINVAL,
				     "signal %d cannot be sent to a remote "
				     "command", sig);
	rc = post_json(x, "signal", b);
	if (rc < 0 && has_exited(x)) {
		sbx_error_clear();
		return sbx_error_set(SBX_ERR_STATE, -ESRCH,
				     "the command has exited");
	}
	return rc;
}

static int rx_resize(struct sbx_exec_handle *h, unsigned short rows,
		     unsigned short cols)
{
	struct rexec *x = (struct rexec *)h;
	if (!x->tty)
		return sbx_error_set(SBX_ERR_STATE, -ENOTTY,
				     "resize: the command has no terminal");
	return post_json(x, "resize", sbx_exec_resize_encode(rows, cols));
}

static int rx_wait(struct sbx_exec_handle *h, int *status_out)
{
	struct rexec *x = (struct rexec *)h;
	int rc = -EAGAIN;

	pthread_mutex_lock(&x->lock);
	if (x->exited) {
		*status_out = x->status;
		rc = 0;
	}
	pthread_mutex_unlock(&x->lock);
	return rc;
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void rx_free(struct sbx_exec_handle *h)
{
	struct rexec *x = (struct rexec *)h;
	uint64_t one = 1;

	if (!x)
		return;
	if (x->cancel_fd >= 0 &&
	    write(x->cancel_fd, &one, sizeof(one)) < 0) {
		/* an eventfd with room: cannot fail */
	}
	if (x->out_started)
		pthread_join(x->out_thread, NULL);
	if (x->in_started)
		pthread_join(x->in_thread, NULL);
	if (x->id) {
		/* Kill it if it still runs, and free the agent's buffers. */
		struct premote_req r = {
			.method = "DELETE", .cancel_fd = -1,
			.timeout_ms = DELETE_TIMEOUT_MS,
		};
		struct premote_resp resp;
		char *id = sbx_proto_query_escape(x->id);
		char *route = sbx_xasprintf("/v1/exec/%s", id);

		r.route = route;
		premote_resp_init(&resp);
		if (premote_http_do(x->s->http, &r, &resp) < 0)
			sbx_error_clear();
		premote_resp_fini(&resp);
		free(route);
		free(id);
	}
	if (x->base.stdin_fd >= 0 && x->base.stdin_fd != x->base.stdout_fd)
		close(x->base.stdin_fd);
	close_fd(&x->base.stdout_fd);
	close_fd(&x->base.stderr_fd);
	close_fd(&x->base.exit_fd);
	if (x->in_r != x->out_w)
		close_fd(&x->in_r);
	close_fd(&x->out_w);
	close_fd(&x->err_w);
	close_fd(&x->cancel_fd);
	pthread_mutex_destroy(&x->lock);
	pthread_cond_destroy(&x->cond);
	free(x->id);
	free(x->body);
	free(x);
}

static const struct sbx_exec_handle_ops rexec_ops = {
	.close_stdin = rx_close_stdin,
	.signal = rx_signal,
	.resize = rx_resize,
	.wait = rx_wait,
	.free = rx_free,
};

/* ---- start ----------------------------------------------------------------- */

static int sockpair(int sv[2])
{
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
		       sv) < 0)
		return sbx_error_os("socketpair");
	for (int i = 0; i < 2; i++) {
		int sz = SOCK_BUF;

		setsockopt(sv[i], SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
		setsockopt(sv[i], SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
	}
	return 0;
}

/*
 * The daemon names the working directory as an absolute path inside the
 * sandbox (the workdir, i.e. the agent's root, and below); the agent takes
 * paths relative to its root.  Anything outside the root is refused, as
 * sbx/exec.h asks.  *out malloc'd.
 */
static int rel_cwd(char **out, const struct premote_sandbox *s,
		   const char *cwd)
{
	const char *root = s->info.root;
	size_t rl = strlen(root);

	*out = NULL;
	while (rl > 1 && root[rl - 1] == '/')
		rl--;
	if (cwd[0] != '/') {
		*out = sbx_xstrdup(cwd);
		return 0;
	}
	if (rl == 1) { /* the agent serves "/" */
		*out = sbx_xstrdup(cwd + 1);
		return 0;
	}
	if (strncmp(cwd, root, rl) || (cwd[rl] != '\0' && cwd[rl] != '/'))
		return sbx_error_set(SBX_ERR_CONFIG, -EACCES,
				     "working directory %s is outside the "
				     "sandbox (%s)", cwd, root);
	*out = sbx_xstrdup(cwd[rl] ? cwd + rl + 1 : "");
	return 0;
}

static char *start_body(const struct sbx_exec_request *req, const char *cwd,
			const char *alias)
{
	static const char *const no_env[] = { NULL };
	struct sbx_exec_start_msg m = {
		.argv = (const char **)req->argv,
		.envp = (const char **)(req->envp ? req->envp : no_env),
		.cwd = cwd,
		.tty = req->tty,
		.attach = true,
		.rows = req->rows,
		.cols = req->cols,
		.umask = req->has_umask ? (int)(req->umask & 0777)
					: SBX_EXEC_DEFAULT_UMASK,
		.alias = alias,
	};
	cJSON *b = sbx_exec_start_encode(&m);
	char *text = sbx_json_print(b, false);

	cJSON_Delete(b);
	return text;
}

/* Failures to run the program itself are told apart for the shim
 * (127/126 as a shell answers). */
static int start_error(struct rexec *x, const char *prog)
{
	int rc = x->start_rc;
	bool program = x->start_klass == SBX_ERR_REMOTE &&
		       (rc == -ENOENT || rc == -EACCES || rc == -ENOEXEC) &&
		       !strstr(x->start_msg, "cwd") &&
		       !strstr(x->start_msg, "directory");

	if (program && rc == -ENOENT)
		return sbx_error_setd(SBX_ERR_REMOTE, rc, SBX_EXEC_ERR_PROGRAM,
				      "%s: command not found", prog);
	return sbx_error_setd(x->start_klass, rc,
			      program ? SBX_EXEC_ERR_PROGRAM
				      : x->start_detail == SBX_EXEC_ERR_PROGRAM
						? 0 : x->start_detail,
			      "%s", x->start_msg);
}

int premote_exec_start(struct sbx_sandbox *sb,
		       const struct sbx_exec_request *req,
		       struct sbx_exec_handle **out)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	int in[2] = { -1, -1 }, o[2] = { -1, -1 }, e[2] = { -1, -1 };
	pthread_condattr_t ca;
	struct timespec until;
	struct rexec *x;
	char *cwd = NULL;
	int rc;

	*out = NULL;
	SBX_ASSERT_ARG(req && req->argv && req->argv[0] && req->cwd);
	if (req->stdio[0] >= 0 || req->stdio[1] >= 0 || req->stdio[2] >= 0)
		return sbx_error_set(SBX_ERR_CONFIG, -EXDEV,
				     "a remote sandbox cannot use local "
				     "descriptors");
	if (!s->info.cap_exec)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				     "the agent at %s cannot run commands",
				     s->cfg.url);
	if (req->tty && !s->info.cap_pty)
		return sbx_error_set(SBX_ERR_REMOTE, -ENOTSUP,
				     "the agent at %s cannot allocate "
				     "terminals; run without -t", s->cfg.url);

	x = sbx_xcalloc(1, sizeof(*x));
	x->base.ops = &rexec_ops;
	x->base.stdin_fd = x->base.stdout_fd = x->base.stderr_fd = -1;
	x->base.exit_fd = -1;
	x->out_w = x->err_w = x->in_r = x->cancel_fd = -1;
	x->s = s;
	x->tty = req->tty;
	pthread_mutex_init(&x->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->cond, &ca);
	pthread_condattr_destroy(&ca);

	if (req->tty) {
		if ((rc = sockpair(o)) < 0)
			goto fail;
		x->base.stdin_fd = x->base.stdout_fd = o[0];
		x->out_w = x->in_r = o[1];
	} else {
		if ((rc = sockpair(in)) < 0 || (rc = sockpair(o)) < 0 ||
		    (rc = sockpair(e)) < 0)
			goto fail;
		x->base.stdin_fd = in[0];
		x->in_r = in[1];
		x->base.stdout_fd = o[0];
		x->out_w = o[1];
		x->base.stderr_fd = e[0];
		x->err_w = e[1];
		/* One direction each. */
		shutdown(in[0], SHUT_RD);
		shutdown(in[1], SHUT_WR);
		shutdown(o[0], SHUT_WR);
		shutdown(e[0], SHUT_WR);
	}
	in[0] = in[1] = o[0] = o[1] = e[0] = e[1] = -1;
	x->base.exit_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	x->cancel_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (x->base.exit_fd < 0 || x->cancel_fd < 0) {
		rc = sbx_error_os("eventfd");
		goto fail;
	}
	rc = rel_cwd(&cwd, s, req->cwd);
	if (rc < 0)
		goto fail;
	{
		/* The environment policy of the sandbox (premote_env.c). */
		struct sbx_exec_request r2 = *req;
		char **env = NULL;

		rc = premote_exec_env(s, req->envp, &env);
		if (rc < 0)
			goto fail;
		r2.envp = (const char *const *)env;
		x->body = start_body(&r2, cwd, s->base.mountpoint);
		premote_env_free(env);
	}
	free(cwd);
	cwd = NULL;

	rc = pthread_create(&x->out_thread, NULL, output_thread, x);
	if (rc) {
		rc = sbx_error_set(SBX_ERR_OS, -rc, "start an exec thread: %s",
				   strerror(rc));
		goto fail;
	}
	x->out_started = true;

	/* The first frame names the process; bounded by the timeout. */
	until = sbx_clock_deadline(CLOCK_MONOTONIC,
				   (int)premote_http_timeout_ms(s->http) + 1000);
	pthread_mutex_lock(&x->lock);
	while (x->state == ST_STARTING &&
	       pthread_cond_timedwait(&x->cond, &x->lock, &until) != ETIMEDOUT)
		;
	if (x->state == ST_FAILED)
		rc = start_error(x, req->argv[0]);
	else if (x->state == ST_STARTING)
		rc = sbx_error_set(SBX_ERR_HTTP, -ETIMEDOUT,
				   "exec %s: the agent at %s did not start it "
				   "in time", req->argv[0], s->cfg.url);
	pthread_mutex_unlock(&x->lock);
	if (rc < 0)
		goto fail;

	rc = pthread_create(&x->in_thread, NULL, stdin_thread, x);
	if (rc) {
		rc = sbx_error_set(SBX_ERR_OS, -rc, "start an exec thread: %s",
				   strerror(rc));
		goto fail;
	}
	x->in_started = true;
	x->base.pid = 0; /* not a local process */
	*out = &x->base;
	return 0;
fail:
	for (int i = 0; i < 2; i++) {
		close_fd(&in[i]);
		close_fd(&o[i]);
		close_fd(&e[i]);
	}
	{
		/* Keep the error across the cleanup's requests. */
		struct sbx_error saved = *sbx_error_last();

		rx_free(&x->base);
		sbx_error_restore(&saved);
	}
	return rc;
}
