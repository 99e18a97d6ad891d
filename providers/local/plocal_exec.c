/*
 * Local provider exec: fork/exec in the worktree, optionally under
 * bubblewrap.  See sbx/exec.h for the handle contract and docs/exec.md for
 * the process, signal and isolation model.
 *
 * Process model.  The child calls setsid(), so the command leads its own
 * session and process group and signals reach the whole group.  With a tty
 * the pty slave becomes its controlling terminal.  Under bwrap the forked
 * child execs bwrap, whose monitor process would die from a group-wide
 * SIGINT before the command could handle it (bubblewrap issue #369); so
 * bwrap runs with --new-session and reports the pid of its sandbox init
 * through --info-fd, and signals go to that init's process group, which
 * holds the command but not the monitor.  In tty mode under bwrap the
 * command is started through setsid(1) --ctty, which gives it the pty as
 * controlling terminal inside the new session, so ^C reaches the command
 * (the foreground group) and not bwrap.
 *
 * The child is started by sbx_spawn_start() (sbx/spawn.h), which runs only
 * async-signal-safe calls between fork() and execve(), on data prepared
 * here: the program is found in the command's PATH before fork.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "sbx/exec.h"
#include "sbx/paths.h"
#include "sbx/spawn.h"
#include "sbx/xmalloc.h"

#include "plocal_i.h"

#define PIPE_SIZE (1024 * 1024)

struct lexec {
	struct sbx_exec_handle base;
	bool tty;
	bool bwrap;
	bool reaped;
	int status;
	int info_fd;      /* bwrap --info-fd read end, -1 once read */
	pid_t sandbox_pg; /* bwrap: process group of the sandbox's init */
};

/* ---- helpers (parent side) ---------------------------------------------- */

/* Is `path` (resolved) `root` or below it? */
static bool path_within(const char *path, const char *root)
{
	size_t rl = strlen(root);

	if (rl == 1 && root[0] == '/')
		return true;
	return !strncmp(path, root, rl) && (path[rl] == '\0' || path[rl] == '/');
}

static int check_cwd(char **out, struct plocal_sandbox *psb, const char *cwd)
{
	char *real = NULL, *root = NULL;
	int rc = 0;

	*out = NULL;
	real = realpath(cwd, NULL);
	if (!real)
		return sbx_error_os("working directory %s", cwd);
	root = realpath(psb->root_path, NULL);
	if (!root) {
		rc = sbx_error_os("sandbox worktree %s", psb->root_path);
		goto out;
	}
	if (!path_within(real, root)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EACCES,
				   "working directory %s is outside the "
				   "sandbox (%s)", cwd, psb->root_path);
		goto out;
	}
	*out = real;
	real = NULL;
out:
	free(real);
	free(root);
	return rc;
}

/*
 * The uid and gid of an isolated command inside its user namespace when
 * sbx runs as root: "nobody".  Outside it is still uid 0 without any
 * capability (docs/exec.md, "Isolation and its limits").
 */
#define ISOLATED_ID "65534"

static int find_bwrap(char **out)
{
	int rc = sbx_spawn_find(out, "bwrap", getenv("PATH"), AT_FDCWD, "/");

	if (rc < 0)
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "isolation \"bwrap\" needs bubblewrap: "
				     "apt-get install bubblewrap");
	return 0;
}

struct argvb {
	char **v;
	size_t n, cap;
};

static void ab_push(struct argvb *a, const char *s)
{
	if (a->n + 2 > a->cap) {
		a->cap = a->cap ? a->cap * 2 : 32;
		a->v = sbx_xrealloc(a->v, a->cap * sizeof(char *));
	}
	a->v[a->n++] = sbx_xstrdup(s);
	a->v[a->n] = NULL;
}

/* `how` SRC DEST with SRC == DEST (bwrap's bind options). */
static void ab_bind(struct argvb *a, const char *how, const char *path)
{
	ab_push(a, how);
	ab_push(a, path);
	ab_push(a, path);
}

static void ab_free(struct argvb *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
}

/* ---- handle ops --------------------------------------------------------- */

static int lx_close_stdin(struct sbx_exec_handle *h)
{
	struct lexec *x = (struct lexec *)h;

	if (x->base.stdin_fd < 0)
		return 0;
	if (x->tty) {
		struct termios tio;
		char eof = 4;

		if (tcgetattr(x->base.stdout_fd, &tio) == 0 &&
		    tio.c_cc[VEOF] != _POSIX_VDISABLE)
			eof = (char)tio.c_cc[VEOF];
		if (write(x->base.stdout_fd, &eof, 1) < 0 && errno != EAGAIN &&
		    errno != EIO)
			return sbx_error_os("write EOF to the terminal");
	} else {
		close(x->base.stdin_fd);
	}
	x->base.stdin_fd = -1;
	return 0;
}

/* bwrap: learn the sandbox init's pid from --info-fd (waits briefly for
 * bwrap to finish its setup). */
static void read_bwrap_info(struct lexec *x)
{
	char buf[512];
	size_t len = 0;
	const char *p;

	if (x->info_fd < 0)
		return;
	while (len < sizeof(buf) - 1) {
		struct pollfd pf = { .fd = x->info_fd, .events = POLLIN };
		ssize_t n;

		if (poll(&pf, 1, 2000) <= 0)
			break;
		n = read(x->info_fd, buf + len, sizeof(buf) - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		buf[len] = '\0';
		if (strchr(buf, '}'))
			break;
	}
	buf[len] = '\0';
	p = strstr(buf, "\"child-pid\"");
	if (p && (p = strchr(p, ':')))
		x->sandbox_pg = (pid_t)strtol(p + 1, NULL, 10);
	close(x->info_fd);
	x->info_fd = -1;
}

static int lx_signal(struct sbx_exec_handle *h, int sig)
{
	struct lexec *x = (struct lexec *)h;
	pid_t pg = 0;

	if (x->reaped)
		return sbx_error_set(SBX_ERR_STATE, -ESRCH,
				     "the command has exited");
	if (x->tty && ioctl(x->base.stdout_fd, TIOCGPGRP, &pg) == 0 && pg > 0) {
		/* What the kernel does for ^C: the foreground group. */
	} else if (x->bwrap) {
		read_bwrap_info(x);
		pg = x->sandbox_pg;
	} else {
		pg = x->base.pid;
	}
	if (pg <= 0)
		pg = x->base.pid; /* bwrap not set up: stop bwrap itself */
	if (kill(-pg, sig) < 0 && kill(pg, sig) < 0)
		return sbx_error_os("kill(-%d, %d)", (int)pg, sig);
	return 0;
}

static int lx_resize(struct sbx_exec_handle *h, unsigned short rows,
		     unsigned short cols)
{
	struct lexec *x = (struct lexec *)h;
	struct winsize ws = { .ws_row = rows, .ws_col = cols };

	if (!x->tty)
		return sbx_error_set(SBX_ERR_STATE, -ENOTTY,
				     "resize: the command has no terminal");
	/* The kernel sends SIGWINCH to the foreground group. */
	if (ioctl(x->base.stdout_fd, TIOCSWINSZ, &ws) < 0)
		return sbx_error_os("TIOCSWINSZ");
	return 0;
}

static int lx_wait(struct sbx_exec_handle *h, int *status_out)
{
	struct lexec *x = (struct lexec *)h;
	pid_t r;

	if (!x->reaped) {
		do {
			r = waitpid(x->base.pid, &x->status, WNOHANG);
		} while (r < 0 && errno == EINTR);
		if (r < 0)
			return sbx_error_os("waitpid %d", (int)x->base.pid);
		if (r == 0)
			return -EAGAIN;
		x->reaped = true;
	}
	*status_out = x->status;
	return 0;
}

static void lx_free(struct sbx_exec_handle *h)
{
	struct lexec *x = (struct lexec *)h;

	if (!x)
		return;
	if (!x->reaped && x->base.pid > 0) {
		/* The whole group; under bwrap, killing bwrap kills the
		 * sandbox (--die-with-parent of its init). */
		kill(-x->base.pid, SIGKILL);
		kill(x->base.pid, SIGKILL);
		while (waitpid(x->base.pid, &x->status, 0) < 0 && errno == EINTR)
			;
	}
	if (x->base.stdin_fd >= 0 && x->base.stdin_fd != x->base.stdout_fd)
		close(x->base.stdin_fd);
	if (x->base.stdout_fd >= 0)
		close(x->base.stdout_fd);
	if (x->base.stderr_fd >= 0)
		close(x->base.stderr_fd);
	if (x->base.exit_fd >= 0)
		close(x->base.exit_fd);
	if (x->info_fd >= 0)
		close(x->info_fd);
	free(x);
}

static const struct sbx_exec_handle_ops lexec_ops = {
	.close_stdin = lx_close_stdin,
	.signal = lx_signal,
	.resize = lx_resize,
	.wait = lx_wait,
	.free = lx_free,
};

/* ---- bubblewrap --------------------------------------------------------- */

/* Resolve `path` (which must exist) into *out. */
static int resolve(char **out, const char *path)
{
	*out = realpath(path, NULL);
	if (!*out)
		return sbx_error_os("isolation: %s", path);
	return 0;
}

/* Bind `dir`/`sub` (resolved) with `how`; mkdir -p it first if `make`. */
static int bind_sub(struct argvb *a, const char *how, const char *dir,
		    const char *sub, bool make)
{
	char *path = sbx_xasprintf("%s/%s", dir, sub), *real = NULL;
	int rc = 0;

	/* 0755 explicitly: the daemon's umask is 0. */
	if (make)
		rc = sbx_paths_mkdir_p(path, 0755);
	if (rc == 0)
		rc = resolve(&real, path);
	if (rc == 0)
		ab_bind(a, how, real);
	free(real);
	free(path);
	return rc;
}

/* Read-only bind of `dir`/`name` when it exists (a file). */
static void ro_file(struct argvb *a, const char *dir, const char *name)
{
	char *path = sbx_xasprintf("%s/%s", dir, name);
	struct stat st;

	if (lstat(path, &st) == 0 && S_ISREG(st.st_mode))
		ab_bind(a, "--ro-bind", path);
	free(path);
}

/*
 * Is the worktree's ".git" file still "gitdir: <priv>"?  It is read-only
 * inside the sandbox, but a command run without isolation could have
 * changed it; binding whatever it names writable would be a hole.
 */
static int check_dotgit(const char *root, const char *priv)
{
	char *path = sbx_xasprintf("%s/.git", root), *text = NULL;
	char *real = NULL;
	size_t len = 0;
	int rc;

	rc = sbx_file_read(path, 4096, &text, &len);
	if (rc < 0)
		goto out;
	while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
		text[--len] = '\0';
	if (strncmp(text, "gitdir: ", 8) == 0)
		real = realpath(text + 8, NULL);
	if (!real || strcmp(real, priv) != 0)
		rc = sbx_error_set(SBX_ERR_STATE, -EPERM,
				   "isolation: %s does not point to the "
				   "sandbox's git directory %s; refusing to "
				   "run (repair it with `git worktree repair`)",
				   path, priv);
out:
	free(real);
	free(text);
	free(path);
	return rc;
}

/*
 * The git side of the sandbox (docs/exec.md, "Isolation and its limits").
 * The repository's common directory is read-only -- config, hooks, info,
 * the user's refs, HEAD and index, the other worktrees -- except what the
 * sandbox's own commits need: new objects, the sbx/ branches and their
 * reflogs, and its worktree's private git directory (minus the files that
 * say where the repository is).  Existing packs, the commit graph and
 * alternates (objects/pack, objects/info) stay read-only too.
 */
static int git_binds(struct argvb *a, struct plocal_sandbox *psb,
		     const char *root)
{
	char *common = NULL, *priv_path = NULL, *priv = NULL, *cfgwt = NULL;
	int rc, fd;

	rc = resolve(&common, psb->gitdir);
	if (rc < 0)
		goto out;
	priv_path = sbx_xasprintf("%s/worktrees/sbx-%s", common,
				  psb->base.session);
	rc = resolve(&priv, priv_path);
	if (rc < 0)
		goto out;
	rc = check_dotgit(root, priv);
	if (rc < 0)
		goto out;
	ab_bind(a, "--ro-bind", common); /* may lie below the worktree */
	if ((rc = bind_sub(a, "--bind", common, "objects", false)) < 0 ||
	    (rc = bind_sub(a, "--ro-bind", common, "objects/pack", true)) < 0 ||
	    (rc = bind_sub(a, "--ro-bind", common, "objects/info", true)) < 0 ||
	    (rc = bind_sub(a, "--bind", common, "refs/heads/sbx", true)) < 0 ||
	    (rc = bind_sub(a, "--bind", common, "logs/refs/heads/sbx",
			   true)) < 0)
		goto out;
	ab_bind(a, "--bind", priv);
	ro_file(a, priv, "commondir");
	ro_file(a, priv, "gitdir");
	/*
	 * config.worktree is read when the repository enables
	 * extensions.worktreeConfig: an empty one keeps the sandbox from
	 * creating it.
	 */
	cfgwt = sbx_xasprintf("%s/config.worktree", priv);
	fd = open(cfgwt, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		  0644);
	if (fd >= 0)
		close(fd);
	ro_file(a, priv, "config.worktree");
	ro_file(a, root, ".git");
out:
	free(cfgwt);
	free(priv);
	free(priv_path);
	free(common);
	return rc;
}

/* Does this bwrap know --disable-userns (0.8.0)?  Asked once. */
static bool bwrap_disable_userns(const char *bwrap)
{
	static int known = -1;
	int v = __atomic_load_n(&known, __ATOMIC_ACQUIRE);

	if (v < 0) {
		char *cmd = sbx_xasprintf("'%s' --version 2>/dev/null", bwrap);
		unsigned maj = 0, min = 0;
		FILE *f = strchr(bwrap, '\'') ? NULL : popen(cmd, "re");

		if (f) {
			if (fscanf(f, "bubblewrap %u.%u", &maj, &min) != 2)
				maj = min = 0;
			pclose(f);
		}
		free(cmd);
		v = maj > 0 || min >= 8;
		__atomic_store_n(&known, v, __ATOMIC_RELEASE);
	}
	return v;
}

/*
 * A private /run (and /var/run when it is not a link to it), keeping
 * /etc/resolv.conf readable when it points there (systemd-resolved).
 */
static void hide_run(struct argvb *a)
{
	struct stat st;
	char *resolv;

	ab_push(a, "--tmpfs");
	ab_push(a, "/run");
	if (lstat("/var/run", &st) == 0 && S_ISDIR(st.st_mode)) {
		ab_push(a, "--tmpfs");
		ab_push(a, "/var/run");
	}
	resolv = realpath("/etc/resolv.conf", NULL);
	if (resolv && (path_within(resolv, "/run") ||
		       path_within(resolv, "/var/run")) &&
	    stat(resolv, &st) == 0 && S_ISREG(st.st_mode))
		ab_bind(a, "--ro-bind", resolv);
	free(resolv);
}

/*
 * bwrap's command line for `prog args...` in `cwd` (docs/exec.md).  The
 * command runs in new user, pid, ipc, uts and cgroup namespaces without
 * any capability and with no_new_privs; as the invoking user, or, when
 * sbx runs as root, as uid/gid 65534 mapped to root outside (so the
 * worktree, owned by root, stays writable).
 */
static int bwrap_argv(struct argvb *a, struct plocal_sandbox *psb,
		      const char *bwrap, const char *cwd, const char *prog,
		      const char *const *argv, int info_fd, bool tty)
{
	char *root = NULL, num[16];
	int rc;

	/* Resolved paths: cwd was resolved too, and a symlink on the way
	 * would otherwise point into the read-only view of /. */
	rc = resolve(&root, psb->root_path);
	if (rc < 0)
		goto out;
	ab_push(a, "bwrap");
	ab_push(a, "--unshare-user");
	if (geteuid() == 0) {
		ab_push(a, "--uid");
		ab_push(a, ISOLATED_ID);
		ab_push(a, "--gid");
		ab_push(a, ISOLATED_ID);
	}
	if (bwrap_disable_userns(bwrap))
		ab_push(a, "--disable-userns");
	ab_push(a, "--cap-drop");
	ab_push(a, "ALL");
	ab_push(a, "--unshare-pid");
	ab_push(a, "--unshare-ipc");
	ab_push(a, "--unshare-uts");
	ab_push(a, "--unshare-cgroup-try");
	if (!psb->network)
		ab_push(a, "--unshare-net");
	ab_push(a, "--die-with-parent");
	ab_push(a, "--new-session");
	ab_bind(a, "--ro-bind", "/");
	ab_push(a, "--dev");
	ab_push(a, "/dev");
	ab_push(a, "--proc");
	ab_push(a, "/proc");
	/*
	 * Outside, the command is the daemon's uid: as root it would own the
	 * kernel's knobs (/proc/sys/kernel/core_pattern, sysrq-trigger) even
	 * without capabilities.  /proc is read-only instead.
	 */
	ab_push(a, "--remount-ro");
	ab_push(a, "/proc");
	ab_push(a, "--tmpfs");
	ab_push(a, "/tmp");
	/* Sockets of the system and of the user's session (D-Bus, systemd,
	 * container engines) would run things outside: hidden. */
	hide_run(a);
	/*
	 * $SBX_HOME holds the control sockets of every session (a command
	 * that reached one of a session without isolation would be out),
	 * their state and their worktrees: hide it, except this worktree.
	 */
	if (psb->state_dir && path_within(root, psb->state_dir) &&
	    !path_within(psb->gitdir, psb->state_dir)) {
		ab_push(a, "--tmpfs");
		ab_push(a, psb->state_dir);
	}
	ab_bind(a, "--bind", root);
	if (psb->gitdir) {
		rc = git_binds(a, psb, root);
		if (rc < 0)
			goto out;
	}
	ab_push(a, "--chdir");
	ab_push(a, cwd);
	ab_push(a, "--info-fd");
	snprintf(num, sizeof(num), "%d", info_fd);
	ab_push(a, num);
	ab_push(a, "--");
	if (tty) {
		ab_push(a, "/usr/bin/setsid");
		ab_push(a, "--ctty");
	}
	/* The program as resolved by the caller: the same file inside, as /
	 * is bound read-only at the same place. */
	ab_push(a, prog);
	for (size_t i = 1; argv[i]; i++)
		ab_push(a, argv[i]);
out:
	free(root);
	return rc;
}

/* Is `path` a set-user-ID executable (a setuid bwrap needs its
 * privilege: no_new_privs would take it away)? */
static bool is_setuid(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 && (st.st_mode & S_ISUID);
}

/* ---- start -------------------------------------------------------------- */

int plocal_exec_start(struct sbx_sandbox *sb, const struct sbx_exec_request *req,
		      struct sbx_exec_handle **out)
{
	struct plocal_sandbox *psb = (struct plocal_sandbox *)sb;
	bool bwrap = psb->isolation && !strcmp(psb->isolation, "bwrap");
	struct sbx_spawn sp = { .in_fd = -1, .out_fd = -1, .err_fd = -1,
				.pty_fd = -1 };
	int info[2] = { -1, -1 }, rc;
	char *cwd = NULL, *prog = NULL, *bwrap_bin = NULL;
	struct argvb bargv = { 0 };
	struct sbx_spawn_opts o;
	struct lexec *x = NULL;

	*out = NULL;
	SBX_ASSERT_ARG(req && req->argv && req->argv[0] && req->cwd);
	SBX_ASSERT_ARG(!req->tty || (req->stdio[0] < 0 && req->stdio[1] < 0 &&
				     req->stdio[2] < 0));
	rc = check_cwd(&cwd, psb, req->cwd);
	if (rc < 0)
		goto out;
	rc = sbx_spawn_find(&prog, req->argv[0],
			    sbx_spawn_env_get(req->envp, "PATH"), AT_FDCWD,
			    cwd);
	if (rc < 0) {
		rc = sbx_spawn_program_error(rc, req->argv[0]);
		goto out;
	}

	sbx_spawn_opts_init(&o);
	if (bwrap) {
		rc = find_bwrap(&bwrap_bin);
		if (rc < 0)
			goto out;
		if (pipe2(info, O_CLOEXEC) < 0) {
			rc = sbx_error_os("pipe");
			goto out;
		}
		rc = bwrap_argv(&bargv, psb, bwrap_bin, cwd, prog,
				req->argv, info[1], req->tty);
		if (rc < 0)
			goto out;
		o.file = bwrap_bin;
		o.argv = (const char *const *)bargv.v;
		o.no_new_privs = !is_setuid(bwrap_bin);
		o.keep_fd = info[1];
	} else {
		o.file = prog;
		o.argv = req->argv;
	}
	o.envp = req->envp;
	o.cwd = cwd;
	o.tty = req->tty;
	o.ctty = req->tty && !bwrap;
	o.rows = req->rows;
	o.cols = req->cols;
	for (int i = 0; i < 3; i++)
		o.stdio[i] = req->stdio[i] >= 0 ? req->stdio[i]
						: SBX_SPAWN_PIPE;
	/* The caller's, not the daemon's umask(0); bwrap passes it on. */
	o.umask = (req->has_umask ? req->umask : SBX_EXEC_DEFAULT_UMASK) &
		  0777;
	o.pipe_size = PIPE_SIZE;
	o.nonblock = true;

	rc = sbx_spawn_start(&sp, &o);
	close(info[1]);
	info[1] = -1;
	if (rc < 0) {
		if (bwrap && sp.child_failed)
			rc = sbx_error_setd(SBX_ERR_OS, rc, 0, "run bwrap: %s",
					    strerror(-rc));
		goto out;
	}

	x = sbx_xcalloc(1, sizeof(*x));
	x->base.ops = &lexec_ops;
	x->base.pid = sp.pid;
	x->tty = req->tty;
	x->bwrap = bwrap;
	x->info_fd = info[0];
	info[0] = -1;
	x->base.exit_fd = pidfd_open(sp.pid, 0);
	if (x->base.exit_fd < 0) {
		rc = sbx_error_os("pidfd_open");
		x->base.stdin_fd = x->base.stdout_fd = x->base.stderr_fd = -1;
		lx_free(&x->base);
		x = NULL;
		goto out;
	}
	if (req->tty) {
		x->base.stdin_fd = x->base.stdout_fd = sp.pty_fd;
		x->base.stderr_fd = -1;
		sp.pty_fd = -1;
	} else {
		/* -1 where the command got a descriptor of the client. */
		x->base.stdin_fd = sp.in_fd;
		x->base.stdout_fd = sp.out_fd;
		x->base.stderr_fd = sp.err_fd;
		sp.in_fd = sp.out_fd = sp.err_fd = -1;
	}
	*out = &x->base;
	rc = 0;
out:
	sbx_spawn_fini(&sp);
	for (int i = 0; i < 2; i++)
		if (info[i] >= 0)
			close(info[i]);
	ab_free(&bargv);
	free(bwrap_bin);
	free(prog);
	free(cwd);
	return rc;
}
