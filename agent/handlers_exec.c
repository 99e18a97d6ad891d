/*
 * Exec routes (docs/protocol.md, "Exec").
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
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

#define UNSENT_MAX (1024 * 1024)
#define REPLAY_MAX (16 * 1024 * 1024)
#define CHUNK_MAX (64 * 1024)
#define BATCH_BYTES (256 * 1024)
#define QUIET_MS 200
#define KEEP_FINISHED_NS (600ULL * 1000000000ULL)
#define MAX_PROCS 1024
#define MAX_ARGS 65536
#define PIPE_SIZE (1024 * 1024)
#define STREAM_POLL_S 5
#define PIDFD_FALLBACK_MS 20

extern char **environ;

struct chunk {
	int stream; /* 0 stdout, 1 stderr */
	bool sent;  /* handed to a client at least once */
	size_t len;
	unsigned char data[];
};

struct proc {
	char id[33];
	pid_t pid;
	int pidfd;
	bool tty;
	struct agent *a;
	atomic_int refs;
	int wake_fd; /* eventfd: space freed, or deleted */
	int out_fd[2]; /* pump thread only */

	pthread_mutex_t in_lock;
	int in_fd; /* protected by in_lock; tty: a dup of the master */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	/* protected by lock: */
	struct chunk **chunks; /* chunks[head + i] has seq base_seq + i */
	size_t head, n, cap;
	uint64_t base_seq;
	uint64_t last_seq;
	uint64_t dropped; /* highest sequence freed */
	size_t unsent[2];
	size_t sent_bytes;
	bool reaped;
	int status;
	bool finished; /* output drained, status and watch_seq valid */
	uint64_t watch_seq;
	uint64_t finish_ns;
	bool deleted;
};

struct agent_execs {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct proc **v; /* protected by lock */
	size_t n, cap;   /* protected by lock */
	int pumps;       /* protected by lock: live pump threads */
};

/* ---- process objects -------------------------------------------------------- */

static void proc_get(struct proc *p)
{
	atomic_fetch_add(&p->refs, 1);
}

static void proc_put(struct proc *p)
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

static void wake_pump(struct proc *p)
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
		struct proc *p = t->v[i];
		bool old;

		pthread_mutex_lock(&p->lock);
		old = p->finished && now - p->finish_ns > KEEP_FINISHED_NS;
		pthread_mutex_unlock(&p->lock);
		if (old) {
			t->v[i] = t->v[--t->n];
			proc_put(p);
		} else {
			i++;
		}
	}
}

/* The process `id` with a reference, or NULL (-ENOENT recorded). */
static struct proc *lookup(struct agent *a, const char *id)
{
	struct agent_execs *t = a->execs;
	struct proc *p = NULL;

	pthread_mutex_lock(&t->lock);
	gc_locked(t);
	for (size_t i = 0; id && i < t->n; i++)
		if (!strcmp(t->v[i]->id, id)) {
			p = t->v[i];
			proc_get(p);
			break;
		}
	pthread_mutex_unlock(&t->lock);
	if (!p)
		sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT, "no process %s",
			      id ? id : "");
	return p;
}

static void unlink_proc(struct agent *a, struct proc *p)
{
	struct agent_execs *t = a->execs;

	pthread_mutex_lock(&t->lock);
	for (size_t i = 0; i < t->n; i++)
		if (t->v[i] == p) {
			t->v[i] = t->v[--t->n];
			proc_put(p);
			break;
		}
	pthread_mutex_unlock(&t->lock);
}

/* ---- output buffer (proc->lock held) --------------------------------------- */

static struct chunk *chunk_at(struct proc *p, uint64_t seq)
{
	if (seq < p->base_seq || seq >= p->base_seq + p->n)
		return NULL;
	return p->chunks[p->head + (seq - p->base_seq)];
}

static void append(struct proc *p, int stream, const void *data, size_t len)
{
	struct chunk *tail = p->n ? p->chunks[p->head + p->n - 1] : NULL;

	/* Merge into an unsent tail chunk: nobody has seen its number. */
	if (tail && !tail->sent && tail->stream == stream &&
	    tail->len + len <= CHUNK_MAX) {
		tail = sbx_xrealloc(tail, sizeof(*tail) + tail->len + len);
		memcpy(tail->data + tail->len, data, len);
		tail->len += len;
		p->chunks[p->head + p->n - 1] = tail;
	} else {
		struct chunk *c = sbx_xmalloc(sizeof(*c) + len);

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

static void free_front(struct proc *p)
{
	struct chunk *c = p->chunks[p->head];

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
static void ack(struct proc *p, uint64_t seq)
{
	bool was_full = p->unsent[0] >= UNSENT_MAX || p->unsent[1] >= UNSENT_MAX;

	while (p->n && p->base_seq <= seq)
		free_front(p);
	if (was_full)
		wake_pump(p);
}

/* Mark a chunk handed out; keep at most REPLAY_MAX of sent chunks. */
static void mark_sent(struct proc *p, struct chunk *c)
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

static void reap(struct proc *p, int flags)
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
	struct proc *p = arg;
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
	proc_put(p);

	pthread_mutex_lock(&t->lock);
	t->pumps--;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

/* ---- starting a process ------------------------------------------------------ */

struct spawn {
	char **argv; /* malloc'd vector of borrowed strings */
	char **envp; /* NULL: the agent's environment */
	char *cwd;   /* normalised */
	bool tty;
	unsigned short rows, cols;
	int umask;   /* the command's umask; -1: the agent's own */
	const char *alias; /* the client's mount path, or NULL (alias.c) */
};

struct child_plan {
	char *const *argv;
	char *const *envp;
	int cwd_fd;
	int in, out, err;
	bool ctty;
	int errpipe;
	int umask;   /* -1: inherit */
	const struct agent_alias *alias;
};

static void __attribute__((noreturn)) child(const struct child_plan *c)
{
	struct sigaction sa = { .sa_handler = SIG_DFL };
	sigset_t none;
	int e;

	/* Default dispositions and an empty mask: the agent ignores SIGPIPE
	 * and blocks SIGINT/TERM/HUP, which the command must not inherit. */
	sigemptyset(&sa.sa_mask);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &sa, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (setsid() < 0)
		goto fail;
	if (dup2(c->in, 0) < 0 || dup2(c->out, 1) < 0 || dup2(c->err, 2) < 0)
		goto fail;
	if (c->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
		goto fail;
	if (fchdir(c->cwd_fd) < 0)
		goto fail;
	agent_alias_enter(c->alias);
	if (c->umask >= 0)
		umask((mode_t)c->umask);
	if (c->envp)
		environ = (char **)c->envp;
	/* argv as given: execvp, never a shell. */
	execvp(c->argv[0], c->argv);
fail:
	e = errno;
	if (write(c->errpipe, &e, sizeof(e)) < 0) {
		/* nothing more to do */
	}
	_exit(127);
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

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

static int spawn(struct agent *a, const struct spawn *sp, struct proc **out)
{
	int in[2] = { -1, -1 }, o[2] = { -1, -1 }, e[2] = { -1, -1 };
	int errp[2] = { -1, -1 }, master = -1, slave = -1, cwd_fd = -1;
	struct child_plan plan = { 0 };
	struct agent_alias alias;
	struct proc *p = NULL;
	int rc, child_errno = 0;
	pid_t pid;
	ssize_t n;

	*out = NULL;
	agent_alias_prepare(a, sp->alias, &alias);
	rc = agent_open(a, sp->cwd, O_PATH | O_DIRECTORY, 0, &cwd_fd);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "working directory");
		goto out;
	}
	if (sp->tty) {
		char name[128];
		struct winsize ws = { .ws_row = sp->rows, .ws_col = sp->cols };

		master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 ||
		    ptsname_r(master, name, sizeof(name)) != 0) {
			rc = sbx_error_os("allocate a pseudo-terminal");
			goto out;
		}
		slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (slave < 0) {
			rc = sbx_error_os("open %s", name);
			goto out;
		}
		if (sp->rows && sp->cols)
			ioctl(master, TIOCSWINSZ, &ws);
		plan.in = plan.out = plan.err = slave;
		plan.ctty = true;
	} else {
		if (pipe2(in, O_CLOEXEC) < 0 || pipe2(o, O_CLOEXEC) < 0 ||
		    pipe2(e, O_CLOEXEC) < 0) {
			rc = sbx_error_os("pipe");
			goto out;
		}
		/* Fewer, larger reads for big outputs. */
		fcntl(o[0], F_SETPIPE_SZ, PIPE_SIZE);
		fcntl(e[0], F_SETPIPE_SZ, PIPE_SIZE);
		plan.in = in[0];
		plan.out = o[1];
		plan.err = e[1];
	}
	if (pipe2(errp, O_CLOEXEC) < 0) {
		rc = sbx_error_os("pipe");
		goto out;
	}
	plan.argv = sp->argv;
	plan.envp = sp->envp;
	plan.alias = &alias;
	plan.cwd_fd = cwd_fd;
	plan.errpipe = errp[1];
	plan.umask = sp->umask;

	pid = fork();
	if (pid < 0) {
		rc = sbx_error_os("fork");
		goto out;
	}
	if (pid == 0)
		child(&plan);
	close_fd(&errp[1]);
	close_fd(&slave);
	close_fd(&in[0]);
	close_fd(&o[1]);
	close_fd(&e[1]);
	do {
		n = read(errp[0], &child_errno, sizeof(child_errno));
	} while (n < 0 && errno == EINTR);
	if (n == sizeof(child_errno)) {
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		if (child_errno == ENOENT)
			rc = sbx_error_setd(SBX_ERR_OS, -ENOENT, 1,
					    "%s: command not found",
					    sp->argv[0]);
		else
			rc = sbx_error_setd(SBX_ERR_OS, -child_errno, 1,
					    "%s: cannot execute: %s",
					    sp->argv[0], strerror(child_errno));
		goto out;
	}

	p = sbx_xcalloc(1, sizeof(*p));
	random_id(p->id);
	p->pid = pid;
	p->tty = sp->tty;
	p->a = a;
	atomic_init(&p->refs, 1);
	pthread_mutex_init(&p->lock, NULL);
	pthread_mutex_init(&p->in_lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	p->pidfd = pidfd_open(pid, 0);
	if (sp->tty) {
		fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
		p->in_fd = fcntl(master, F_DUPFD_CLOEXEC, 0);
		p->out_fd[0] = master;
		p->out_fd[1] = -1;
		master = -1;
	} else {
		fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
		fcntl(o[0], F_SETFL, fcntl(o[0], F_GETFL) | O_NONBLOCK);
		fcntl(e[0], F_SETFL, fcntl(e[0], F_GETFL) | O_NONBLOCK);
		p->in_fd = in[1];
		p->out_fd[0] = o[0];
		p->out_fd[1] = e[0];
		in[1] = o[0] = e[0] = -1;
	}
	if (p->wake_fd < 0 || p->in_fd < 0) {
		rc = sbx_error_os("exec setup");
		kill(-pid, SIGKILL);
		reap(p, 0);
		proc_put(p);
		p = NULL;
		goto out;
	}
	*out = p;
	rc = 0;
out:
	agent_alias_fini(&alias);
	close_fd(&cwd_fd);
	close_fd(&master);
	close_fd(&slave);
	for (int i = 0; i < 2; i++) {
		close_fd(&in[i]);
		close_fd(&o[i]);
		close_fd(&e[i]);
		close_fd(&errp[i]);
	}
	return rc;
}

/* Parse the start request into `sp` (strings borrowed from `doc`). */
static int parse_start(const cJSON *doc, struct spawn *sp, bool *attach)
{
	const cJSON *argv = cJSON_GetObjectItemCaseSensitive(doc, "argv");
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(doc, "env");
	const cJSON *it;
	const char *cwd = NULL;
	long long rows, cols, um;
	size_t i = 0;
	int rc, n;

	if (!cJSON_IsArray(argv) || (n = cJSON_GetArraySize(argv)) < 1 ||
	    n > MAX_ARGS)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: \"argv\" must be a non-empty array "
				     "of strings");
	sp->argv = sbx_xcalloc((size_t)n + 1, sizeof(char *));
	cJSON_ArrayForEach(it, argv)
	{
		if (!cJSON_IsString(it) || !it->valuestring)
			return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					     "exec: argv[%zu] is not a string",
					     i);
		sp->argv[i++] = it->valuestring;
	}
	if (!*sp->argv[0])
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: argv[0] is empty");
	if (env && !cJSON_IsNull(env)) {
		if (!cJSON_IsArray(env) ||
		    (n = cJSON_GetArraySize(env)) > MAX_ARGS)
			return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					     "exec: \"env\" must be an array "
					     "of \"K=V\" strings");
		sp->envp = sbx_xcalloc((size_t)n + 1, sizeof(char *));
		i = 0;
		cJSON_ArrayForEach(it, env)
		{
			if (!cJSON_IsString(it) || !it->valuestring ||
			    !strchr(it->valuestring, '=') ||
			    it->valuestring[0] == '=')
				return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
						     "exec: env[%zu] is not "
						     "\"K=V\"",
						     i);
			sp->envp[i++] = it->valuestring;
		}
	}
	rc = sbx_json_get_string(&cwd, doc, "cwd", "exec");
	if (rc == 0)
		rc = sbx_json_get_bool(&sp->tty, doc, "tty", false, "exec");
	if (rc == 0)
		rc = sbx_json_get_bool(attach, doc, "attach", false, "exec");
	if (rc == 0)
		rc = sbx_json_get_int(&rows, doc, "rows", 0, "exec");
	if (rc == 0)
		rc = sbx_json_get_int(&cols, doc, "cols", 0, "exec");
	if (rc == 0)
		rc = sbx_json_get_int(&um, doc, "umask", -1, "exec");
	if (rc == 0)
		rc = sbx_json_get_string(&sp->alias, doc, "alias", "exec");
	if (rc < 0)
		return rc;
	if (um < -1 || um > 0777)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: umask out of range");
	sp->umask = (int)um;
	if (rows < 0 || rows > 65535 || cols < 0 || cols > 65535)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "exec: rows/cols out of range");
	sp->rows = (unsigned short)rows;
	sp->cols = (unsigned short)cols;
	return agent_path_norm(cwd ? cwd : "", &sp->cwd);
}

/* ---- the output stream ---------------------------------------------------------- */

struct ostream {
	struct agent_stream base;
	struct proc *p;
	uint64_t sent; /* last sequence delivered to this client */
	bool announce; /* attach: first frame {"id","pid"} */
	bool last_wait_timed_out;
};

static void exit_json(cJSON *o, const struct proc *p)
{
	cJSON *e = cJSON_CreateObject();
	int code = 0, sig = 0;

	if (WIFEXITED(p->status))
		code = WEXITSTATUS(p->status);
	else if (WIFSIGNALED(p->status)) {
		sig = WTERMSIG(p->status);
		code = 128 + sig;
	}
	cJSON_AddNumberToObject(e, "code", code);
	cJSON_AddNumberToObject(e, "signal", sig);
	cJSON_AddItemToObject(o, "exit", e);
	cJSON_AddNumberToObject(o, "watch_seq", (double)p->watch_seq);
}

static int ostream_next(struct agent_stream *s, struct sbx_buf *out)
{
	struct ostream *os = (struct ostream *)s;
	struct proc *p = os->p;
	int rc = 0;

	pthread_mutex_lock(&p->lock);
	if (os->announce) {
		cJSON *h = cJSON_CreateObject();

		cJSON_AddStringToObject(h, "id", p->id);
		cJSON_AddNumberToObject(h, "pid", p->pid);
		agent_frame(out, h, NULL, 0);
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
			cJSON *h = cJSON_CreateObject();
			cJSON *l = cJSON_AddObjectToObject(h, "lost");

			cJSON_AddNumberToObject(l, "from", (double)(os->sent + 1));
			cJSON_AddNumberToObject(l, "to", (double)p->dropped);
			agent_frame(out, h, NULL, 0);
			sbx_warn("exec %s: output %llu..%llu lost before "
				 "re-attach",
				 p->id, (unsigned long long)os->sent + 1,
				 (unsigned long long)p->dropped);
			os->sent = p->dropped;
			goto out;
		}
		if (os->sent < p->last_seq) {
			while (os->sent < p->last_seq && out->len < BATCH_BYTES) {
				struct chunk *c = chunk_at(p, os->sent + 1);
				cJSON *h;

				if (!c)
					break;
				h = cJSON_CreateObject();
				cJSON_AddNumberToObject(h, "seq",
							(double)(os->sent + 1));
				cJSON_AddStringToObject(h, "stream",
							c->stream ? "stderr"
								  : "stdout");
				agent_frame(out, h, c->data, c->len);
				os->sent++;
				mark_sent(p, c);
			}
			goto out;
		}
		if (p->finished) {
			cJSON *h = cJSON_CreateObject();

			exit_json(h, p);
			agent_frame(out, h, NULL, 0);
			h = cJSON_CreateObject();
			cJSON_AddBoolToObject(h, "end", 1);
			agent_frame(out, h, NULL, 0);
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

	proc_put(os->p);
	free(os);
}

static int reply_output(struct agent_req *r, struct proc *p, uint64_t since,
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
	struct agent_execs *t = r->a->execs;
	struct spawn sp = { 0 };
	struct proc *p = NULL;
	pthread_t th;
	cJSON *doc = NULL, *o;
	bool attach = false;
	size_t count;
	int rc;

	rc = agent_body_json(r, &doc);
	if (rc == 0)
		rc = parse_start(doc, &sp, &attach);
	if (rc < 0)
		goto fail;
	pthread_mutex_lock(&t->lock);
	gc_locked(t);
	count = t->n;
	pthread_mutex_unlock(&t->lock);
	if (count >= MAX_PROCS) {
		rc = sbx_error_set(SBX_ERR_STATE, -EAGAIN,
				   "too many processes (%d); DELETE finished "
				   "ones",
				   MAX_PROCS);
		goto fail;
	}
	rc = spawn(r->a, &sp, &p);
	if (rc < 0)
		goto fail;
	sbx_debug("exec %s: pid %d: %s%s", p->id, (int)p->pid, sp.argv[0],
		  sp.tty ? " (tty)" : "");
	/* References: the table's (from creation), the pump's, ours. */
	proc_get(p);
	proc_get(p);
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
		unlink_proc(r->a, p);
		proc_put(p); /* the pump's */
		proc_put(p); /* ours */
		rc = sbx_error_set(SBX_ERR_OS, rc, "cannot start a thread");
		goto fail;
	}
	pthread_detach(th);
	free(sp.argv);
	free(sp.envp);
	free(sp.cwd);
	cJSON_Delete(doc);
	if (attach)
		return reply_output(r, p, 0, true);
	o = cJSON_CreateObject();
	cJSON_AddStringToObject(o, "id", p->id);
	cJSON_AddNumberToObject(o, "pid", p->pid);
	proc_put(p);
	return agent_reply_json(r, 200, o);
fail:
	free(sp.argv);
	free(sp.envp);
	free(sp.cwd);
	cJSON_Delete(doc);
	return agent_reply_error(r, 0, rc);
}

int agent_h_exec_output(struct agent_req *r)
{
	long long since;
	struct proc *p;
	int rc;

	rc = agent_arg_int(r, "since", 0, 0, INT64_MAX, &since);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	p = lookup(r->a, r->id);
	if (!p)
		return agent_reply_error(r, 0, -ENOENT);
	pthread_mutex_lock(&p->lock);
	if ((uint64_t)since > p->last_seq)
		since = (long long)p->last_seq;
	/* The client holds everything up to `since`. */
	ack(p, (uint64_t)since);
	pthread_mutex_unlock(&p->lock);
	return reply_output(r, p, (uint64_t)since, false);
}

/* Write all of `data` to the process's stdin; -EPIPE once it is gone. */
static int stdin_write(struct proc *p, const unsigned char *data, size_t len)
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

int agent_h_exec_stdin(struct agent_req *r)
{
	long long eof;
	struct proc *p;
	int rc;

	rc = agent_arg_int(r, "eof", 0, 0, 1, &eof);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	p = lookup(r->a, r->id);
	if (!p)
		return agent_reply_error(r, 0, -ENOENT);
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
	proc_put(p);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_ok(r);
}

int agent_h_exec_resize(struct agent_req *r)
{
	long long rows = 0, cols = 0;
	struct winsize ws;
	struct proc *p;
	cJSON *doc = NULL;
	int rc;

	rc = agent_body_json(r, &doc);
	if (rc == 0)
		rc = sbx_json_get_int(&rows, doc, "rows", 0, "resize");
	if (rc == 0)
		rc = sbx_json_get_int(&cols, doc, "cols", 0, "resize");
	cJSON_Delete(doc);
	if (rc == 0 && (rows < 1 || rows > 65535 || cols < 1 || cols > 65535))
		rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				   "resize: rows and cols must be 1-65535");
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	p = lookup(r->a, r->id);
	if (!p)
		return agent_reply_error(r, 0, -ENOENT);
	ws = (struct winsize){ .ws_row = (unsigned short)rows,
			       .ws_col = (unsigned short)cols };
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
	proc_put(p);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_ok(r);
}

int agent_h_exec_signal(struct agent_req *r)
{
	const char *name = NULL;
	struct proc *p;
	cJSON *doc = NULL;
	pid_t pg = 0;
	int rc, sig = 0;

	rc = agent_body_json(r, &doc);
	if (rc == 0)
		rc = sbx_json_get_string(&name, doc, "signal", "signal");
	if (rc == 0 && !(sig = sbx_proto_signal_from_name(name)))
		rc = sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				   "signal: unknown signal \"%s\"",
				   name ? name : "");
	cJSON_Delete(doc);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	p = lookup(r->a, r->id);
	if (!p)
		return agent_reply_error(r, 0, -ENOENT);
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
	proc_put(p);
	if (rc < 0)
		return agent_reply_error(r, 0, rc);
	return agent_reply_ok(r);
}

int agent_h_exec_status(struct agent_req *r)
{
	struct proc *p = lookup(r->a, r->id);
	cJSON *o;

	if (!p)
		return agent_reply_error(r, 0, -ENOENT);
	o = cJSON_CreateObject();
	pthread_mutex_lock(&p->lock);
	cJSON_AddStringToObject(o, "id", p->id);
	cJSON_AddNumberToObject(o, "pid", p->pid);
	cJSON_AddBoolToObject(o, "running", !p->finished);
	cJSON_AddBoolToObject(o, "tty", p->tty);
	cJSON_AddNumberToObject(o, "output_seq", (double)p->last_seq);
	if (p->finished)
		exit_json(o, p);
	pthread_mutex_unlock(&p->lock);
	proc_put(p);
	return agent_reply_json(r, 200, o);
}

static void mark_deleted(struct proc *p)
{
	pthread_mutex_lock(&p->lock);
	p->deleted = true;
	if (!p->reaped)
		kill(-p->pid, SIGKILL);
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	wake_pump(p);
}

int agent_h_exec_delete(struct agent_req *r)
{
	struct proc *p = lookup(r->a, r->id);

	if (!p)
		return agent_reply_error(r, 0, -ENOENT);
	mark_deleted(p);
	unlink_proc(r->a, p);
	proc_put(p);
	return agent_reply_ok(r);
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
		mark_deleted(t->v[i]);
	for (size_t i = 0; i < t->n; i++)
		proc_put(t->v[i]);
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
