/*
 * Exec routes (docs/protocol.md, "Exec"): decode the requests
 * (sbx/proto_exec.h), act on the process table of exec_proc.c, and stream
 * the output frames.  An output stream sends the chunks a client has not
 * seen, in batches of at most BATCH_BYTES, then the exit and end frames;
 * while the command is silent it checks every STREAM_POLL_S that the
 * client is still there.
 */
#include "config.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/log.h"
#include "sbx/proto_exec.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"
#include "exec_i.h"

#define BATCH_BYTES (256 * 1024)
#define STREAM_POLL_S 5

/* ---- the output stream ---------------------------------------------------------- */

struct ostream {
	struct agent_stream base;
	struct agent_proc *p;
	uint64_t sent; /* last sequence delivered to this client */
	bool announce; /* attach: first frame {"id","pid"} */
};

/* One frame of sbx/proto_exec.h into `out`. */
static void put_frame(struct sbx_buf *out, const struct sbx_exec_frame *f,
		      const void *data, size_t len)
{
	agent_frame(out, sbx_exec_frame_encode(f), data, len);
}

static int ostream_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct ostream *os = (struct ostream *)s;
	struct agent_proc *p = os->p;
	int rc = 0;

	pthread_mutex_lock(&p->lock);
	if (os->announce) {
		put_frame(out, &(struct sbx_exec_frame){
				       .kind = SBX_EXEC_FRAME_STARTED,
				       .id = p->id, .pid = p->pid },
			  NULL, 0);
		os->announce = false;
		goto out;
	}
	for (;;) {
		if (p->deleted || atomic_load(&s->a->stopping)) {
			rc = -ECANCELED;
			goto out;
		}
		if (os->sent < p->dropped && os->sent < p->last_seq) {
			/* Freed before this client came back for them. */
			put_frame(out, &(struct sbx_exec_frame){
					       .kind = SBX_EXEC_FRAME_LOST,
					       .from = os->sent + 1,
					       .to = p->dropped },
				  NULL, 0);
			sbx_warn("exec %s: output %llu..%llu lost before "
				 "re-attach",
				 p->id, (unsigned long long)os->sent + 1,
				 (unsigned long long)p->dropped);
			os->sent = p->dropped;
			goto out;
		}
		if (os->sent < p->last_seq) {
			while (os->sent < p->last_seq && out->len < BATCH_BYTES) {
				struct agent_chunk *c = agent_proc_chunk(p, os->sent + 1);

				if (!c)
					break;
				put_frame(out, &(struct sbx_exec_frame){
						       .kind = SBX_EXEC_FRAME_OUTPUT,
						       .seq = os->sent + 1,
						       .stream = c->stream },
					  c->data, c->len);
				os->sent++;
				agent_proc_mark_sent(p, c);
			}
			goto out;
		}
		if (p->finished) {
			put_frame(out, &(struct sbx_exec_frame){
					       .kind = SBX_EXEC_FRAME_EXIT,
					       .status = p->status,
					       .watch_seq = p->watch_seq },
				  NULL, 0);
			put_frame(out, &(struct sbx_exec_frame){
					       .kind = SBX_EXEC_FRAME_END },
				  NULL, 0);
			rc = 1;
			goto out;
		}
		{
			struct timespec ts;

			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_sec += STREAM_POLL_S;
			if (pthread_cond_timedwait(&p->cond, &p->lock, &ts) ==
				    ETIMEDOUT &&
			    !agent_conn_alive(s->conn)) {
				/* The client went away while the command is
				 * silent: free this thread. */
				rc = -ECONNRESET;
				goto out;
			}
		}
	}
out:
	pthread_mutex_unlock(&p->lock);
	return rc;
}

static void ostream_fini(struct agent_stream *s)
{
	struct ostream *os = (struct ostream *)s;

	agent_proc_put(os->p);
	free(os);
}

static int reply_output(struct agent_req *r, struct agent_proc *p, uint64_t since,
			bool announce)
{
	struct ostream *os = sbx_xcalloc(1, sizeof(*os));

	os->base.next = ostream_next;
	os->base.fini = ostream_fini;
	os->p = p; /* takes the caller's reference */
	os->sent = since;
	os->announce = announce;
	return agent_reply_stream(r, &os->base);
}

/* ---- routes -------------------------------------------------------------------- */

int agent_h_exec_start(struct agent_req *r)
{
	struct sbx_exec_start_msg m;
	struct agent_proc *p = NULL;
	cJSON *doc = NULL, *o;
	char *cwd = NULL;
	bool attach;
	int rc;

	memset(&m, 0, sizeof(m));
	rc = agent_body_json(r, &doc);
	if (rc == 0)
		rc = sbx_exec_start_decode(doc, &m);
	if (rc == 0)
		rc = agent_path_norm(m.cwd ? m.cwd : "", &cwd);
	if (rc == 0)
		rc = agent_proc_start(r->a, &m, cwd, &p);
	if (rc < 0)
		goto fail;
	attach = m.attach;
	sbx_exec_start_fini(&m);
	free(cwd);
	cJSON_Delete(doc);
	if (attach)
		return reply_output(r, p, 0, true);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "id", p->id);
	cJSON_AddNumberToObject(o, "pid", p->pid);
	agent_proc_put(p);
	return agent_reply_json(r, 200, o);
fail:
	sbx_exec_start_fini(&m);
	free(cwd);
	cJSON_Delete(doc);
	return agent_reply_error(r, 0, rc);
}

/*
 * The process a route names, with a reference, once the request's own
 * checks have passed (`rc`: 0, or the error they recorded).  NULL when the
 * route was answered with the error instead; *reply is that answer.
 */
static struct agent_proc *route_proc(struct agent_req *r, int rc, int *reply)
{
	struct agent_proc *p = NULL;

	*reply = 0;
	if (rc == 0 && !(p = agent_proc_lookup(r->a, r->id)))
		rc = -ENOENT;
	if (rc < 0)
		*reply = agent_reply_error(r, 0, rc);
	return p;
}

int agent_h_exec_output(struct agent_req *r)
{
	long long since = 0;
	struct agent_proc *p;
	int reply;

	p = route_proc(r, agent_arg_int(r, "since", 0, 0, INT64_MAX, &since),
		       &reply);
	if (!p)
		return reply;
	pthread_mutex_lock(&p->lock);
	if ((uint64_t)since > p->last_seq)
		since = (long long)p->last_seq;
	/* The client holds everything up to `since`. */
	agent_proc_ack(p, (uint64_t)since);
	pthread_mutex_unlock(&p->lock);
	return reply_output(r, p, (uint64_t)since, false);
}

/* Write all of `data` to the process's stdin; -EPIPE once it is gone. */
static int stdin_write(struct agent_proc *p, const unsigned char *data, size_t len)
{
	size_t done = 0;

	while (done < len) {
		ssize_t n;

		if (p->in_fd < 0)
			return sbx_error_set(SBX_ERR_STATE, -EPIPE,
					     "stdin is closed");
		n = write(p->in_fd, data + done, len - done);
		if (n > 0) {
			done += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			struct pollfd pfd = { .fd = p->in_fd, .events = POLLOUT };
			bool gone;

			poll(&pfd, 1, 1000);
			pthread_mutex_lock(&p->lock);
			gone = p->deleted || p->finished ||
			       atomic_load(&p->a->stopping);
			pthread_mutex_unlock(&p->lock);
			if (gone)
				return sbx_error_set(SBX_ERR_STATE, -EPIPE,
						     "the process has exited");
			continue;
		}
		return sbx_error_os("write to stdin");
	}
	return 0;
}

/* The end of a control route on `p`: drop our reference, answer. */
static int reply_done(struct agent_req *r, struct agent_proc *p, int rc)
{
	agent_proc_put(p);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_ok(r);
}

int agent_h_exec_stdin(struct agent_req *r)
{
	long long eof = 0;
	struct agent_proc *p;
	int rc, reply;

	p = route_proc(r, agent_arg_int(r, "eof", 0, 0, 1, &eof), &reply);
	if (!p)
		return reply;
	pthread_mutex_lock(&p->in_lock);
	rc = stdin_write(p, (const unsigned char *)r->body.data, r->body.len);
	if (rc == 0 && eof && p->in_fd >= 0) {
		if (p->tty) {
			/* A terminal has no EOF but its VEOF character. */
			struct termios tio;
			unsigned char c = 4;

			if (tcgetattr(p->in_fd, &tio) == 0 &&
			    tio.c_cc[VEOF] != _POSIX_VDISABLE)
				c = tio.c_cc[VEOF];
			rc = stdin_write(p, &c, 1);
		} else {
			close(p->in_fd);
			p->in_fd = -1;
		}
	}
	pthread_mutex_unlock(&p->in_lock);
	return reply_done(r, p, rc);
}

/* The body of a control route, decoded by `decode` (sbx/proto_exec.h). */
static int control_body(struct agent_req *r, int (*decode)(const cJSON *,
							    void *),
			void *arg)
{
	cJSON *doc = NULL;
	int rc = agent_body_json(r, &doc);

	if (rc == 0)
		rc = decode(doc, arg);
	cJSON_Delete(doc);
	return rc;
}

static int decode_resize(const cJSON *doc, void *arg)
{
	struct winsize *ws = arg;

	return sbx_exec_resize_decode(doc, &ws->ws_row, &ws->ws_col);
}

static int decode_signal(const cJSON *doc, void *arg)
{
	return sbx_exec_signal_decode(doc, arg);
}

int agent_h_exec_resize(struct agent_req *r)
{
	struct winsize ws = { 0 };
	struct agent_proc *p;
	int rc = 0, reply;

	p = route_proc(r, control_body(r, decode_resize, &ws), &reply);
	if (!p)
		return reply;
	pthread_mutex_lock(&p->in_lock);
	if (!p->tty)
		rc = sbx_error_set(SBX_ERR_STATE, -ENOTTY,
				   "resize: the process has no terminal");
	else if (p->in_fd < 0)
		rc = sbx_error_set(SBX_ERR_STATE, -ESRCH,
				   "resize: the process has exited");
	else if (ioctl(p->in_fd, TIOCSWINSZ, &ws) < 0) /* kernel: SIGWINCH */
		rc = sbx_error_os("TIOCSWINSZ");
	pthread_mutex_unlock(&p->in_lock);
	return reply_done(r, p, rc);
}

int agent_h_exec_signal(struct agent_req *r)
{
	struct agent_proc *p;
	pid_t pg = 0;
	int rc = 0, sig = 0, reply;

	p = route_proc(r, control_body(r, decode_signal, &sig), &reply);
	if (!p)
		return reply;
	if (p->tty) {
		/* What the kernel does for ^C: the foreground group. */
		pthread_mutex_lock(&p->in_lock);
		if (p->in_fd < 0 || ioctl(p->in_fd, TIOCGPGRP, &pg) < 0)
			pg = 0;
		pthread_mutex_unlock(&p->in_lock);
	}
	pthread_mutex_lock(&p->lock);
	if (p->reaped)
		rc = sbx_error_set(SBX_ERR_STATE, -ESRCH,
				   "the process has exited");
	else if (kill(-(pg > 0 ? pg : p->pid), sig) < 0 &&
		 kill(p->pid, sig) < 0)
		rc = sbx_error_os("kill %d", (int)p->pid);
	pthread_mutex_unlock(&p->lock);
	return reply_done(r, p, rc);
}

int agent_h_exec_status(struct agent_req *r)
{
	int reply;
	struct agent_proc *p = route_proc(r, 0, &reply);
	cJSON *o;

	if (!p)
		return reply;
	o = cJSON_CreateObject();
	pthread_mutex_lock(&p->lock);
	cJSON_AddStringToObject(o, "id", p->id);
	cJSON_AddNumberToObject(o, "pid", p->pid);
	cJSON_AddBoolToObject(o, "running", !p->finished);
	cJSON_AddBoolToObject(o, "tty", p->tty);
	cJSON_AddNumberToObject(o, "output_seq", (double)p->last_seq);
	if (p->finished) {
		cJSON_AddItemToObject(o, "exit",
				      sbx_exec_exit_encode(p->status));
		cJSON_AddNumberToObject(o, "watch_seq", (double)p->watch_seq);
	}
	pthread_mutex_unlock(&p->lock);
	agent_proc_put(p);
	return agent_reply_json(r, 200, o);
}

int agent_h_exec_delete(struct agent_req *r)
{
	int reply;
	struct agent_proc *p = route_proc(r, 0, &reply);

	if (!p)
		return reply;
	agent_proc_delete(p);
	agent_proc_unlink(r->a, p);
	return reply_done(r, p, 0);
}
