/*
 * The agent's processes (docs/protocol.md, "Exec"): the table, the
 * output buffers and the pump threads; the routes are in handlers_exec.c.
 *
 * Each process has a pump thread that reads its stdout/stderr (or pty
 * master) into numbered chunks and reaps it.  Output is never dropped
 * unread:
 *   - chunks not yet handed to any client ("unsent") are bounded per
 *     stream (UNSENT_MAX); when a stream hits it the pump stops reading
 *     that pipe, so the process blocks on write instead of losing output;
 *   - chunks handed to a client stay for re-attach (a dropped connection
 *     loses what was in flight) until a request with since=S acknowledges
 *     them, or until more than REPLAY_MAX bytes of sent chunks pile up,
 *     when the oldest go (a later re-attach before them gets a "lost"
 *     frame saying which sequence numbers are gone).
 * At exit the pump drains the pipes (until EOF, or QUIET_MS without data
 * when a background child keeps them open), runs the watch barrier, and
 * records the exit status with the watch sequence at that moment.
 *
 * Locking: execs->lock (the table) before proc->lock (chunks, state);
 * proc->in_lock (stdin fd, resize) is never held with either.  A proc is
 * reference counted: the table, the pump thread and every handler or
 * stream using it hold one.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/pidfd.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sbx/log.h"
#include "sbx/proto_exec.h"
#include "sbx/spawn.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"
#include "exec_i.h"

#define UNSENT_MAX (1024 * 1024)
#define REPLAY_MAX (16 * 1024 * 1024)
#define CHUNK_MAX (64 * 1024)
#define QUIET_MS 200
#define KEEP_FINISHED_NS (600ULL * 1000000000ULL)
#define MAX_PROCS 1024
#define PIPE_SIZE (1024 * 1024)
#define PIDFD_FALLBACK_MS 20

/* ---- process objects -------------------------------------------------------- */

void agent_proc_get(struct agent_proc *p)
{
	atomic_fetch_add(&p->refs, 1);
}

void agent_proc_put(struct agent_proc *p)
{
	if (!p || atomic_fetch_sub(&p->refs, 1) != 1)
		return;
	for (size_t i = 0; i < p->n; i++)
		free(p->chunks[p->head + i]);
	free(p->chunks);
	if (p->pidfd >= 0)
		close(p->pidfd);
	if (p->wake_fd >= 0)
		close(p->wake_fd);
	for (int s = 0; s < 2; s++)
		if (p->out_fd[s] >= 0)
			close(p->out_fd[s]);
	if (p->in_fd >= 0)
		close(p->in_fd);
	pthread_mutex_destroy(&p->lock);
	pthread_mutex_destroy(&p->in_lock);
	pthread_cond_destroy(&p->cond);
	free(p);
}

static void wake_pump(struct agent_proc *p)
{
	uint64_t one = 1;

	if (write(p->wake_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: already signalled */
	}
}

/* Remove finished processes older than KEEP_FINISHED_NS. Table locked. */
static void gc_locked(struct agent_execs *t)
{
	uint64_t now = agent_now_ns();

	for (size_t i = 0; i < t->n;) {
		struct agent_proc *p = t->v[i];
		bool old;

		pthread_mutex_lock(&p->lock);
		old = p->finished && now - p->finish_ns > KEEP_FINISHED_NS;
		pthread_mutex_unlock(&p->lock);
		if (old) {
			t->v[i] = t->v[--t->n];
			agent_proc_put(p);
		} else {
			i++;
		}
	}
}

/* The process `id` with a reference, or NULL (-ENOENT recorded). */
struct agent_proc *agent_proc_lookup(struct agent *a, const char *id)
{
	struct agent_execs *t = a->execs;
	struct agent_proc *p = NULL;

	pthread_mutex_lock(&t->lock);
	gc_locked(t);
	for (size_t i = 0; id && i < t->n; i++)
		if (!strcmp(t->v[i]->id, id)) {
			p = t->v[i];
			agent_proc_get(p);
			break;
		}
	pthread_mutex_unlock(&t->lock);
	if (!p)
		sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT, "no process %s",
			      id ? id : "");
	return p;
}

void agent_proc_unlink(struct agent *a, struct agent_proc *p)
{
	struct agent_execs *t = a->execs;

	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i] == p) {
			t->v[i] = t->v[--t->n];
			agent_proc_put(p);
			break;
		}
	pthread_mutex_unlock(&t->lock);
}

/* ---- output buffer (proc->lock held) --------------------------------------- */

struct agent_chunk *agent_proc_chunk(struct agent_proc *p, uint64_t seq)
{
	if (seq < p->base_seq || seq >= p->base_seq + p->n)
		return NULL;
	return p->chunks[p->head + (seq - p->base_seq)];
}

static void append(struct agent_proc *p, int stream, const void *data, size_t len)
{
	struct agent_chunk *tail = p->n ? p->chunks[p->head + p->n - 1] : NULL;

	/* Merge into an unsent tail chunk: nobody has seen its number. */
	if (tail && !tail->sent && tail->stream == stream &&
	    tail->len + len <= CHUNK_MAX) {
		tail = sbx_xrealloc(tail, sizeof(*tail) + tail->len + len);
		memcpy(tail->data + tail->len, data, len);
		tail->len += len;
		p->chunks[p->head + p->n - 1] = tail;
	} else {
		struct agent_chunk *c = sbx_xmalloc(sizeof(*c) + len);

		c->stream = stream;
		c->sent = false;
		c->len = len;
		memcpy(c->data, data, len);
		if (p->head + p->n == p->cap) {
			if (p->head > p->cap / 2) {
				memmove(p->chunks, p->chunks + p->head,
					p->n * sizeof(*p->chunks));
				p->head = 0;
			} else {
				p->cap = p->cap ? p->cap * 2 : 64;
				p->chunks = sbx_xrealloc(
					p->chunks, p->cap * sizeof(*p->chunks));
			}
		}
		if (p->n == 0)
			p->base_seq = p->last_seq + 1;
		p->chunks[p->head + p->n++] = c;
		p->last_seq++;
	}
	p->unsent[stream] += len;
	pthread_cond_broadcast(&p->cond);
}

static void free_front(struct agent_proc *p)
{
	struct agent_chunk *c = p->chunks[p->head];

	if (c->sent)
		p->sent_bytes -= c->len;
	else
		p->unsent[c->stream] -= c->len;
	p->dropped = p->base_seq;
	free(c);
	p->head++;
	p->n--;
	p->base_seq++;
	if (p->n == 0)
		p->head = 0;
}

/* The client holds everything up to `seq`: free it. */
void agent_proc_ack(struct agent_proc *p, uint64_t seq)
{
	bool was_full = p->unsent[0] >= UNSENT_MAX || p->unsent[1] >= UNSENT_MAX;

	while (p->n && p->base_seq <= seq)
		free_front(p);
	if (was_full)
		wake_pump(p);
}

/* Mark a chunk handed out; keep at most REPLAY_MAX of sent chunks. */
void agent_proc_mark_sent(struct agent_proc *p, struct agent_chunk *c)
{
	if (c->sent)
		return;
	if (p->unsent[c->stream] >= UNSENT_MAX &&
	    p->unsent[c->stream] - c->len < UNSENT_MAX)
		wake_pump(p);
	c->sent = true;
	p->unsent[c->stream] -= c->len;
	p->sent_bytes += c->len;
	while (p->n && p->sent_bytes > REPLAY_MAX &&
	       p->chunks[p->head]->sent && p->chunks[p->head] != c)
		free_front(p);
}

/* ---- the pump thread --------------------------------------------------------- */

static void reap(struct agent_proc *p, int flags)
{
	int status;
	pid_t r;

	/* Under p->lock, so a signal never reaches a recycled pid. */
	pthread_mutex_lock(&p->lock);
	if (!p->reaped) {
		do {
			r = waitpid(p->pid, &status, flags);
		} while (r < 0 && errno == EINTR);
		if (r == p->pid) {
			p->reaped = true;
			p->status = status;
		} else if (r < 0) {
			p->reaped = true; /* ECHILD: nothing to wait for */
			p->status = 0;
		}
	}
	pthread_mutex_unlock(&p->lock);
}

static void *pump(void *arg)
{
	struct agent_proc *p = arg;
	struct agent_execs *t = p->a->execs;
	unsigned char *buf = sbx_xmalloc(CHUNK_MAX);

	for (;;) {
		struct pollfd pfd[4];
		int idx[2] = { -1, -1 }, np = 0, ipid = -1, timeout = -1;
		bool throttled = false, deleted, reaped;

		pthread_mutex_lock(&p->lock);
		deleted = p->deleted;
		reaped = p->reaped;
		for (int s = 0; s < 2; s++) {
			if (p->out_fd[s] < 0)
				continue;
			if (p->unsent[s] >= UNSENT_MAX) {
				throttled = true;
				continue;
			}
			idx[s] = np;
			pfd[np++] = (struct pollfd){ .fd = p->out_fd[s],
						     .events = POLLIN };
		}
		pthread_mutex_unlock(&p->lock);
		if (deleted)
			break;
		if (reaped && p->out_fd[0] < 0 && p->out_fd[1] < 0)
			break;
		if (!reaped && p->pidfd >= 0) {
			ipid = np;
			pfd[np++] = (struct pollfd){ .fd = p->pidfd,
						     .events = POLLIN };
		} else if (!reaped) {
			/* No pidfd (kernel < 5.3, valgrind, some sandboxes):
			 * look for the exit now and then. */
			timeout = PIDFD_FALLBACK_MS;
		}
		pfd[np++] = (struct pollfd){ .fd = p->wake_fd,
					     .events = POLLIN };
		/* Exited but a background child holds the pipes: stop after a
		 * quiet spell (not while throttled: that data is still due). */
		if (reaped && !throttled)
			timeout = QUIET_MS;
		int n = poll(pfd, (nfds_t)np, timeout);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			sbx_warn("exec %s: poll: %s", p->id, strerror(errno));
			break;
		}
		if (n == 0 && reaped)
			break;
		if (pfd[np - 1].revents & POLLIN) {
			uint64_t v;

			if (read(p->wake_fd, &v, sizeof(v)) < 0) {
				/* EAGAIN: raced with another reader */
			}
		}
		for (int s = 0; s < 2; s++) {
			ssize_t r;

			if (idx[s] < 0 || !pfd[idx[s]].revents)
				continue;
			r = read(p->out_fd[s], buf, CHUNK_MAX);
			if (r > 0) {
				pthread_mutex_lock(&p->lock);
				append(p, s, buf, (size_t)r);
				pthread_mutex_unlock(&p->lock);
			} else if (r == 0 ||
				   (errno != EAGAIN && errno != EINTR)) {
				/* EOF; EIO on a pty master once the
				 * terminal's last user has gone. */
				close(p->out_fd[s]);
				p->out_fd[s] = -1;
			}
		}
		if ((ipid >= 0 && pfd[ipid].revents) ||
		    (!reaped && p->pidfd < 0))
			reap(p, WNOHANG);
	}
	free(buf);

	pthread_mutex_lock(&p->lock);
	if (!p->reaped)
		kill(-p->pid, SIGKILL);
	pthread_mutex_unlock(&p->lock);
	reap(p, 0);
	for (int s = 0; s < 2; s++) {
		if (p->out_fd[s] >= 0)
			close(p->out_fd[s]);
		p->out_fd[s] = -1;
	}
	pthread_mutex_lock(&p->in_lock);
	if (p->in_fd >= 0)
		close(p->in_fd);
	p->in_fd = -1;
	pthread_mutex_unlock(&p->in_lock);

	/* The exec barrier: every change the command made is numbered. */
	uint64_t seq = agent_watch_sync_seq(p->a);

	pthread_mutex_lock(&p->lock);
	p->watch_seq = seq;
	p->finished = true;
	p->finish_ns = agent_now_ns();
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	sbx_debug("exec %s: pid %d finished, status 0x%x, watch_seq %llu",
		  p->id, (int)p->pid, p->status, (unsigned long long)seq);
	agent_proc_put(p);

	pthread_mutex_lock(&t->lock);
	t->pumps--;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

/* ---- starting a process ------------------------------------------------------ */

static void random_id(char *out)
{
	unsigned char b[16];
	static const char hex[] = "0123456789abcdef";

	if (getrandom(b, sizeof(b), 0) != (ssize_t)sizeof(b)) {
		uint64_t t = agent_now_ns();

		for (size_t i = 0; i < sizeof(b); i++)
			b[i] = (unsigned char)(t >> (8 * (i % 8))) ^
			       (unsigned char)(i * 37);
	}
	for (size_t i = 0; i < sizeof(b); i++) {
		out[2 * i] = hex[b[i] >> 4];
		out[2 * i + 1] = hex[b[i] & 15];
	}
	out[32] = '\0';
}

/* In the child, after the working directory (async-signal-safe). */
static void enter_alias(void *payload)
{
	agent_alias_enter(payload);
}

/*
 * Start `m` (decoded, cwd normalised in `cwd`) as a new proc.  The program
 * is found in the PATH of its env (the agent's without one) and run with
 * execve; ENOEXEC falls back to /bin/sh as execvp does (docs/protocol.md).
 */
static int spawn(struct agent *a, const struct sbx_exec_start_msg *m,
		 const char *cwd, struct agent_proc **out)
{
	struct sbx_spawn sp = { .in_fd = -1, .out_fd = -1, .err_fd = -1,
				.pty_fd = -1 };
	struct sbx_spawn_opts o;
	struct agent_alias alias;
	struct agent_proc *p = NULL;
	int rc, cwd_fd = -1;

	*out = NULL;
	agent_alias_prepare(a, m->alias, &alias);
	rc = agent_open(a, cwd, O_PATH | O_DIRECTORY, 0, &cwd_fd);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "working directory");
		goto out;
	}
	sbx_spawn_opts_init(&o);
	o.argv = m->argv;
	o.envp = m->envp;
	o.cwd_fd = cwd_fd;
	o.tty = o.ctty = m->tty;
	o.rows = m->rows;
	o.cols = m->cols;
	o.umask = m->umask;
	o.pipe_size = PIPE_SIZE;
	o.nonblock = true;
	o.sh_fallback = true;
	o.hook = enter_alias;
	o.hook_payload = &alias;
	rc = sbx_spawn_start(&sp, &o);
	if (rc < 0)
		goto out;

	p = sbx_xcalloc(1, sizeof(*p));
	random_id(p->id);
	p->pid = sp.pid;
	p->tty = m->tty;
	p->a = a;
	atomic_init(&p->refs, 1);
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_init(&p->in_lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	p->pidfd = pidfd_open(sp.pid, 0);
	if (m->tty) {
		p->in_fd = fcntl(sp.pty_fd, F_DUPFD_CLOEXEC, 0);
		p->out_fd[0] = sp.pty_fd;
		p->out_fd[1] = -1;
		sp.pty_fd = -1;
	} else {
		p->in_fd = sp.in_fd;
		p->out_fd[0] = sp.out_fd;
		p->out_fd[1] = sp.err_fd;
		sp.in_fd = sp.out_fd = sp.err_fd = -1;
	}
	if (p->wake_fd < 0 || p->in_fd < 0) {
		rc = sbx_error_os("exec setup");
		kill(-sp.pid, SIGKILL);
		reap(p, 0);
		agent_proc_put(p);
		p = NULL;
		goto out;
	}
	*out = p;
	rc = 0;
out:
	sbx_spawn_fini(&sp);
	agent_alias_fini(&alias);
	if (cwd_fd >= 0)
		close(cwd_fd);
	return rc;
}

/* Register a started proc and give it its pump thread.  Takes `p`'s
 * creation reference for the table; the caller keeps one of its own. */
static int adopt(struct agent *a, struct agent_proc *p)
{
	struct agent_execs *t = a->execs;
	pthread_t th;
	int rc;

	/* References: the table's (from creation), the pump's, ours. */
	agent_proc_get(p);
	agent_proc_get(p);
	pthread_mutex_lock(&t->lock);
	if (t->n == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 16;
		t->v = sbx_xrealloc(t->v, t->cap * sizeof(*t->v));
	}
	t->v[t->n++] = p;
	t->pumps++;
	pthread_mutex_unlock(&t->lock);
	rc = -pthread_create(&th, NULL, pump, p);
	if (rc < 0) {
		/* Without a pump nobody reaps it: undo. */
		kill(-p->pid, SIGKILL);
		reap(p, 0);
		pthread_mutex_lock(&t->lock);
		t->pumps--;
		pthread_mutex_unlock(&t->lock);
		agent_proc_unlink(a, p);
		agent_proc_put(p); /* the pump's */
		agent_proc_put(p); /* ours */
		return sbx_error_set(SBX_ERR_OS, rc, "cannot start a thread");
	}
	pthread_detach(th);
	return 0;
}


/*
 * Start `m` (cwd normalised) and register it with its pump thread.  *out
 * holds a reference for the caller.  -EAGAIN when MAX_PROCS are kept.
 */
int agent_proc_start(struct agent *a, const struct sbx_exec_start_msg *m,
		     const char *cwd, struct agent_proc **out)
{
	struct agent_execs *t = a->execs;
	struct agent_proc *p = NULL;
	size_t count;
	int rc;

	*out = NULL;
	pthread_mutex_lock(&t->lock);
	gc_locked(t);
	count = t->n;
	pthread_mutex_unlock(&t->lock);
	if (count >= MAX_PROCS)
		return sbx_error_set(SBX_ERR_STATE, -EAGAIN,
				     "too many processes (%d); DELETE "
				     "finished ones",
				     MAX_PROCS);
	rc = spawn(a, m, cwd, &p);
	if (rc < 0)
		return rc;
	sbx_debug("exec %s: pid %d: %s%s", p->id, (int)p->pid, m->argv[0],
		  m->tty ? " (tty)" : "");
	rc = adopt(a, p);
	if (rc < 0)
		return rc;
	*out = p;
	return 0;
}

void agent_proc_delete(struct agent_proc *p)
{
	pthread_mutex_lock(&p->lock);
	p->deleted = true;
	if (!p->reaped)
		kill(-p->pid, SIGKILL);
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	wake_pump(p);
}

/* ---- life cycle ------------------------------------------------------------------ */

int agent_exec_init(struct agent *a)
{
	struct agent_execs *t = sbx_xcalloc(1, sizeof(*t));

	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	a->execs = t;
	return 0;
}

void agent_exec_wake(struct agent *a)
{
	struct agent_execs *t = a->execs;

	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->n; i++) {
		pthread_mutex_lock(&t->v[i]->lock);
		pthread_cond_broadcast(&t->v[i]->cond);
		pthread_mutex_unlock(&t->v[i]->lock);
	}
	pthread_mutex_unlock(&t->lock);
}

void agent_exec_fini(struct agent *a)
{
	struct agent_execs *t = a->execs;
	struct timespec ts;

	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->n; i++)
		agent_proc_delete(t->v[i]);
	for (size_t i = 0; i < t->n; i++)
		agent_proc_put(t->v[i]);
	t->n = 0;
	/* Pumps finish quickly once their groups are killed. */
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	while (t->pumps > 0 &&
	       pthread_cond_timedwait(&t->cond, &t->lock, &ts) != ETIMEDOUT)
		;
	if (t->pumps > 0) {
		/* Leave the table to the stuck threads rather than free it
		 * under them. */
		sbx_warn("%d exec threads did not finish", t->pumps);
		pthread_mutex_unlock(&t->lock);
		a->execs = NULL;
		return;
	}
	pthread_mutex_unlock(&t->lock);
	free(t->v);
	pthread_mutex_destroy(&t->lock);
	pthread_cond_destroy(&t->cond);
	free(t);
	a->execs = NULL;
}
