/*
 * The one process spawner; see sbx/spawn.h.
 *
 * The callers are multithreaded (the agent, the FUSE daemon), so the child
 * may run between fork() and execve() while another thread held a lock
 * (malloc's, stdio's): it touches only data prepared here and makes only
 * async-signal-safe calls.  That is why PATH is searched before fork
 * (execvp may allocate) and why the environment is passed to execve()
 * rather than assigned to `environ`.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "sbx/exec.h"
#include "sbx/spawn.h"
#include "sbx/xmalloc.h"

extern char **environ;

/* Where the child stopped; sent with its errno through the error pipe. */
enum stage {
	ST_GROUP,
	ST_STDIO,
	ST_CTTY,
	ST_KEEP,
	ST_CWD,
	ST_NNP,
	ST_EXEC,
};

static const char *const stage_what[] = {
	[ST_GROUP] = "new session",
	[ST_STDIO] = "standard streams",
	[ST_CTTY] = "controlling terminal",
	[ST_KEEP] = "inherited descriptor",
	[ST_CWD] = "working directory",
	[ST_NNP] = "no_new_privs",
	[ST_EXEC] = "exec",
};

struct report {
	int stage;
	int err;
};

/* Everything the child reads: prepared before fork. */
struct plan {
	const struct sbx_spawn_opts *o;
	const char *file;
	char *const *argv;
	char *const *envp;
	char *const *sh_argv; /* sh_fallback: /bin/sh FILE ARGS... */
	int fd[3];            /* the child's 0, 1, 2 */
	int errpipe;
};

void sbx_spawn_opts_init(struct sbx_spawn_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->cwd_fd = -1;
	o->keep_fd = -1;
	o->umask = -1;
	for (int i = 0; i < 3; i++)
		o->stdio[i] = SBX_SPAWN_PIPE;
}

const char *sbx_spawn_env_get(const char *const *envp, const char *name)
{
	size_t n = strlen(name);

	for (size_t i = 0; envp && envp[i]; i++)
		if (!strncmp(envp[i], name, n) && envp[i][n] == '=')
			return envp[i] + n + 1;
	return NULL;
}

static bool is_exec_file(int dirfd, const char *path)
{
	struct stat st;

	return fstatat(dirfd, path, &st, 0) == 0 && S_ISREG(st.st_mode) &&
	       faccessat(dirfd, path, X_OK, 0) == 0;
}

static char *cand_name(const char *dir, const char *entry, size_t elen,
		       const char *prog)
{
	if (!elen)
		return dir ? sbx_xasprintf("%s/%s", dir, prog)
			   : sbx_xstrdup(prog);
	if (entry[0] != '/' && dir)
		return sbx_xasprintf("%s/%.*s/%s", dir, (int)elen, entry, prog);
	return sbx_xasprintf("%.*s/%s", (int)elen, entry, prog);
}

int sbx_spawn_find(char **out, const char *prog, const char *path,
		   int dirfd, const char *dir)
{
	bool seen = false;
	const char *p = path ? path : SBX_SPAWN_DEFAULT_PATH;

	*out = NULL;
	if (strchr(prog, '/')) {
		char *full = prog[0] == '/' || !dir
				     ? sbx_xstrdup(prog)
				     : sbx_xasprintf("%s/%s", dir, prog);

		if (faccessat(dirfd, full, F_OK, 0) < 0) {
			free(full);
			return -ENOENT;
		}
		*out = full;
		return 0;
	}
	for (;;) {
		size_t l = strcspn(p, ":");
		char *cand = cand_name(dir, p, l, prog);

		if (is_exec_file(dirfd, cand)) {
			*out = cand;
			return 0;
		}
		if (faccessat(dirfd, cand, F_OK, 0) == 0)
			seen = true;
		free(cand);
		if (!p[l])
			break;
		p += l + 1;
	}
	return seen ? -EACCES : -ENOENT;
}

/* The program could not be run: detail SBX_EXEC_ERR_PROGRAM (127/126). */
int sbx_spawn_program_error(int rc, const char *prog)
{
	if (rc == -ENOENT)
		return sbx_error_setd(SBX_ERR_OS, rc, SBX_EXEC_ERR_PROGRAM,
				      "%s: command not found", prog);
	return sbx_error_setd(SBX_ERR_OS, rc, SBX_EXEC_ERR_PROGRAM,
			      "%s: cannot execute: %s", prog, strerror(-rc));
}

/* ---- the child ---------------------------------------------------------- */

static void __attribute__((noreturn)) child_fail(const struct plan *p,
						  int stage)
{
	struct report r = { .stage = stage, .err = errno };

	if (write(p->errpipe, &r, sizeof(r)) < 0) {
		/* nothing more to do */
	}
	_exit(127);
}

static void __attribute__((noreturn)) child(const struct plan *p)
{
	const struct sbx_spawn_opts *o = p->o;
	struct sigaction sa = { .sa_handler = SIG_DFL };
	sigset_t none;
	int fd[3];

	sigemptyset(&sa.sa_mask);
	for (int s = 1; s < NSIG; s++)
		if (s != SIGKILL && s != SIGSTOP)
			sigaction(s, &sa, NULL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	if (o->group == SBX_SPAWN_PGROUP ? setpgid(0, 0) < 0 : setsid() < 0)
		child_fail(p, ST_GROUP);
	/* A source among 0..2 that another dup2 would overwrite first
	 * moves out of the way. */
	for (int i = 0; i < 3; i++) {
		fd[i] = p->fd[i];
		if (fd[i] >= 0 && fd[i] < 3 && fd[i] != i) {
			fd[i] = fcntl(fd[i], F_DUPFD_CLOEXEC, 3);
			if (fd[i] < 0)
				child_fail(p, ST_STDIO);
		}
	}
	for (int i = 0; i < 3; i++) {
		if (fd[i] < 0)
			continue; /* inherited */
		if (fd[i] == i ? fcntl(i, F_SETFD, 0) < 0 : dup2(fd[i], i) < 0)
			child_fail(p, ST_STDIO);
	}
	if (o->tty && o->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
		child_fail(p, ST_CTTY);
	/* Nothing of the parent's leaks into the program. */
	close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
	if (o->keep_fd >= 0 && fcntl(o->keep_fd, F_SETFD, 0) < 0)
		child_fail(p, ST_KEEP);
	if (o->cwd_fd >= 0 ? fchdir(o->cwd_fd) < 0
			   : o->cwd && chdir(o->cwd) < 0)
		child_fail(p, ST_CWD);
	if (o->hook)
		o->hook(o->hook_payload);
	if (o->umask >= 0)
		umask((mode_t)o->umask & 0777);
	if (o->no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		child_fail(p, ST_NNP);
	execve(p->file, p->argv, p->envp);
	if (errno == ENOEXEC && p->sh_argv)
		execve("/bin/sh", p->sh_argv, p->envp);
	child_fail(p, ST_EXEC);
}

/* ---- the parent --------------------------------------------------------- */

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl >= 0)
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int open_pty(int *master_out, int *slave_out,
		    const struct sbx_spawn_opts *o)
{
	struct winsize ws = { .ws_row = o->rows, .ws_col = o->cols };
	char name[128];
	int master;

	*master_out = *slave_out = -1;
	master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 ||
	    ptsname_r(master, name, sizeof(name)) != 0) {
		int rc = sbx_error_os("allocate a pseudo-terminal");

		if (master >= 0)
			close(master);
		return rc;
	}
	*slave_out = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (*slave_out < 0) {
		int rc = sbx_error_os("open %s", name);

		close(master);
		return rc;
	}
	if (o->rows && o->cols)
		ioctl(master, TIOCSWINSZ, &ws);
	*master_out = master;
	return 0;
}

/* /bin/sh FILE ARGV[1]... for execvp's ENOEXEC rule. */
static char **sh_argv_new(const char *file, const char *const *argv)
{
	size_t n = 0;
	char **v;

	while (argv[n])
		n++;
	v = sbx_xcalloc(n + 2, sizeof(*v));
	v[0] = (char *)"/bin/sh";
	v[1] = (char *)file;
	for (size_t i = 1; i < n; i++)
		v[i + 1] = (char *)argv[i];
	return v;
}

static int child_error(const struct report *r, const char *prog)
{
	int rc = -(r->err ? r->err : EIO);

	if (r->stage == ST_EXEC)
		return sbx_spawn_program_error(rc, prog);
	return sbx_error_set(SBX_ERR_OS, rc, "%s: %s: %s", prog,
			     r->stage >= 0 && r->stage <= ST_EXEC
				     ? stage_what[r->stage] : "setup",
			     strerror(-rc));
}

int sbx_spawn_start(struct sbx_spawn *out, const struct sbx_spawn_opts *o)
{
	int pipes[3][2] = { { -1, -1 }, { -1, -1 }, { -1, -1 } };
	int errp[2] = { -1, -1 }, master = -1, slave = -1, devnull = -1;
	struct plan plan = { .o = o };
	char *found = NULL, **sh_argv = NULL;
	struct report rep;
	ssize_t n;
	pid_t pid;
	int rc;

	memset(out, 0, sizeof(*out));
	out->in_fd = out->out_fd = out->err_fd = out->pty_fd = -1;
	SBX_ASSERT_ARG(o && o->argv && o->argv[0]);
	SBX_ASSERT_ARG(!o->ctty || (o->tty && o->group == SBX_SPAWN_SESSION));

	plan.envp = (char *const *)(o->envp ? o->envp
					    : (const char *const *)environ);
	plan.file = o->file;
	if (!plan.file) {
		const char *path = o->path;

		if (!path)
			path = sbx_spawn_env_get(
				(const char *const *)plan.envp, "PATH");
		rc = sbx_spawn_find(&found, o->argv[0], path,
				    o->cwd_fd >= 0 ? o->cwd_fd : AT_FDCWD,
				    o->cwd_fd >= 0 ? NULL : o->cwd);
		if (rc < 0) {
			rc = sbx_spawn_program_error(rc, o->argv[0]);
			goto out;
		}
		plan.file = found;
	}
	plan.argv = (char *const *)o->argv;
	if (o->sh_fallback)
		plan.sh_argv = sh_argv = sh_argv_new(plan.file, o->argv);

	if (o->tty) {
		rc = open_pty(&master, &slave, o);
		if (rc < 0)
			goto out;
		plan.fd[0] = plan.fd[1] = plan.fd[2] = slave;
	} else {
		for (int i = 0; i < 3; i++) {
			int s = o->stdio[i];

			if (s >= 0) {
				plan.fd[i] = s;
			} else if (s == SBX_SPAWN_INHERIT) {
				plan.fd[i] = -1;
			} else if (s == SBX_SPAWN_NULL) {
				if (devnull < 0)
					devnull = open("/dev/null",
						       O_RDWR | O_CLOEXEC);
				if (devnull < 0) {
					rc = sbx_error_os("open /dev/null");
					goto out;
				}
				plan.fd[i] = devnull;
			} else {
				if (pipe2(pipes[i], O_CLOEXEC) < 0) {
					rc = sbx_error_os("pipe");
					goto out;
				}
				/* The child reads 0 and writes 1 and 2. */
				plan.fd[i] = pipes[i][i ? 1 : 0];
				/* Fewer, larger reads for big outputs. */
				if (i && o->pipe_size > 0)
					fcntl(pipes[i][0], F_SETPIPE_SZ,
					      o->pipe_size);
			}
		}
	}
	if (pipe2(errp, O_CLOEXEC) < 0) {
		rc = sbx_error_os("pipe");
		goto out;
	}
	plan.errpipe = errp[1];

	pid = fork();
	if (pid < 0) {
		rc = sbx_error_os("fork");
		goto out;
	}
	if (pid == 0)
		child(&plan);

	close_fd(&errp[1]);
	close_fd(&slave);
	close_fd(&devnull);
	close_fd(&pipes[0][0]);
	close_fd(&pipes[1][1]);
	close_fd(&pipes[2][1]);
	do {
		n = read(errp[0], &rep, sizeof(rep));
	} while (n < 0 && errno == EINTR);
	if (n == sizeof(rep)) {
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		out->child_failed = true;
		out->child_errno = rep.err;
		rc = child_error(&rep, o->argv[0]);
		goto out;
	}

	out->pid = pid;
	if (o->tty) {
		out->pty_fd = master;
		master = -1;
	} else {
		out->in_fd = pipes[0][1];
		out->out_fd = pipes[1][0];
		out->err_fd = pipes[2][0];
		pipes[0][1] = pipes[1][0] = pipes[2][0] = -1;
	}
	if (o->nonblock) {
		int fds[4] = { out->in_fd, out->out_fd, out->err_fd,
			       out->pty_fd };

		for (int i = 0; i < 4; i++)
			if (fds[i] >= 0)
				set_nonblock(fds[i]);
	}
	rc = 0;
out:
	close_fd(&master);
	close_fd(&slave);
	close_fd(&devnull);
	for (int i = 0; i < 3; i++) {
		close_fd(&pipes[i][0]);
		close_fd(&pipes[i][1]);
	}
	close_fd(&errp[0]);
	close_fd(&errp[1]);
	free(sh_argv);
	free(found);
	return rc;
}

void sbx_spawn_fini(struct sbx_spawn *s)
{
	if (!s)
		return;
	close_fd(&s->in_fd);
	close_fd(&s->out_fd);
	close_fd(&s->err_fd);
	close_fd(&s->pty_fd);
}
