/*
 * sbx-exec: run a command in the sandbox of the sbx mount it is started
 * from, or locally outside a mount.  See shim_i.h and docs/exec.md.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "sbx/ctl.h"
#include "sbx/xmalloc.h"

#include "shim_i.h"

extern char **environ;

void shim_mount_fini(struct shim_mount *m)
{
	free(m->session);
	free(m->control);
	free(m->mountpoint);
	free(m->sandbox_root);
	free(m->sandbox_cwd);
	memset(m, 0, sizeof(*m));
}

/* A virtual xattr as a malloc'd string, or NULL with errno set. */
static char *xattr_str(const char *path, const char *name)
{
	char buf[PATH_MAX + 1];
	ssize_t n = getxattr(path, name, buf, sizeof(buf) - 1);

	if (n < 0)
		return NULL;
	buf[n] = '\0';
	return sbx_xstrdup(buf);
}

/* Undo mountinfo's octal escapes (\040 for space) in place. */
static void unescape(char *s)
{
	char *o = s;

	while (*s) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '7' && s[2] &&
		    s[3]) {
			*o++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 +
				      (s[3] - '0'));
			s += 4;
		} else {
			*o++ = *s++;
		}
	}
	*o = '\0';
}

static bool under(const char *path, const char *root)
{
	size_t l = strlen(root);

	if (l == 1 && root[0] == '/')
		return path[0] == '/';
	return !strncmp(path, root, l) && (path[l] == '\0' || path[l] == '/');
}

/*
 * The sbx mount (fstype fuse.sbx, source sbx:NAME) that contains `path`
 * (the deepest one).  `session` NULL: any session.  *mnt_out and
 * *session_out (may be NULL) are malloc'd.  0 when found, -ENOENT if not.
 */
static int mountinfo_find(const char *path, const char *session,
			  char **mnt_out, char **session_out)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL, *best = NULL, *best_sess = NULL;
	size_t cap = 0;

	*mnt_out = NULL;
	if (session_out)
		*session_out = NULL;
	if (!f)
		return -ENOENT;
	while (getline(&line, &cap, f) > 0) {
		char *fields[8] = { 0 }, *sep, *p, *save = NULL;
		char *fstype, *source;
		int i = 0;

		sep = strstr(line, " - ");
		if (!sep)
			continue;
		*sep = '\0';
		for (p = strtok_r(line, " ", &save); p && i < 8;
		     p = strtok_r(NULL, " ", &save))
			fields[i++] = p;
		if (i < 5)
			continue;
		fstype = strtok_r(sep + 3, " ", &save);
		source = strtok_r(NULL, " ", &save);
		if (!fstype || !source || strcmp(fstype, "fuse.sbx") ||
		    strncmp(source, "sbx:", 4))
			continue;
		unescape(source);
		if (session && strcmp(source + 4, session))
			continue;
		unescape(fields[4]);
		if (!under(path, fields[4]))
			continue;
		if (!best || strlen(fields[4]) > strlen(best)) {
			free(best);
			free(best_sess);
			best = sbx_xstrdup(fields[4]);
			best_sess = sbx_xstrdup(source + 4);
		}
	}
	free(line);
	fclose(f);
	if (!best)
		return -ENOENT;
	*mnt_out = best;
	if (session_out)
		*session_out = best_sess;
	else
		free(best_sess);
	return 0;
}

int shim_mount_find(struct shim_mount *m, const char *dir)
{
	char *real = NULL, *sess = NULL, *mnt = NULL;
	int rc = 0;

	memset(m, 0, sizeof(*m));
	m->session = xattr_str(dir, "user.sbx.session");
	if (!m->session) {
		if (errno == ENODATA || errno == ENOTSUP || errno == EPERM ||
		    errno == ENOENT || errno == ENOTDIR || errno == EACCES)
			return 0;
		if (errno == ENOTCONN || errno == ECONNABORTED) {
			/* A FUSE mount without its daemon: name it. */
			char cwd[PATH_MAX];
			const char *p = dir;

			if (!strcmp(dir, ".") && getcwd(cwd, sizeof(cwd)))
				p = cwd;
			if (mountinfo_find(p, NULL, &mnt, &sess) == 0) {
				rc = sbx_error_set(SBX_ERR_STATE, -ENOTCONN,
						   "session %s's daemon is "
						   "not running; run `sbx "
						   "mount %s`", sess, sess);
				free(mnt);
				free(sess);
				return rc;
			}
			return sbx_error_set(SBX_ERR_STATE, -ENOTCONN,
					     "%s is on a FUSE mount whose "
					     "daemon is not running", dir);
		}
		return 0;
	}
	m->control = xattr_str(dir, "user.sbx.control");
	m->sandbox_cwd = xattr_str(dir, "user.sbx.path");
	if (!m->control || !m->sandbox_cwd) {
		rc = sbx_error_os("%s: read the sbx mount's attributes", dir);
		goto fail;
	}
	real = realpath(dir, NULL);
	if (real && mountinfo_find(real, m->session, &mnt, NULL) == 0) {
		m->mountpoint = mnt;
	} else if (real) {
		/* No mountinfo (another mount namespace?): walk up while the
		 * parent is still the same session on the same device. */
		struct stat st, pst;
		char *cur = sbx_xstrdup(real);

		if (stat(cur, &st) == 0) {
			while (strcmp(cur, "/")) {
				char *slash = strrchr(cur, '/');
				char *parent = slash == cur
						       ? sbx_xstrdup("/")
						       : sbx_xstrndup(cur,
							   (size_t)(slash -
								    cur));
				char *ps = xattr_str(parent,
						     "user.sbx.session");
				bool same = ps && !strcmp(ps, m->session) &&
					    stat(parent, &pst) == 0 &&
					    pst.st_dev == st.st_dev;

				free(ps);
				if (!same) {
					free(parent);
					break;
				}
				free(cur);
				cur = parent;
			}
		}
		m->mountpoint = cur;
	}
	free(real);
	if (m->mountpoint)
		m->sandbox_root = xattr_str(m->mountpoint, "user.sbx.path");
	return 1;
fail:
	shim_mount_fini(m);
	return rc;
}

char *shim_translate_arg(const struct shim_mount *m, const char *arg)
{
	const char *path = arg, *eq;
	size_t ml, prefix = 0;

	if (!m->mountpoint || !m->sandbox_root)
		return NULL;
	if (arg[0] == '-' && (eq = strchr(arg, '=')) && eq[1] == '/') {
		path = eq + 1;
		prefix = (size_t)(path - arg);
	}
	if (path[0] != '/' || !under(path, m->mountpoint))
		return NULL;
	ml = strlen(m->mountpoint);
	if (ml == 1)
		ml = 0; /* mounted on "/": every path is under it */
	return sbx_xasprintf("%.*s%s%s", (int)prefix, arg,
			     strcmp(m->sandbox_root, "/") || !path[ml]
				     ? m->sandbox_root : "",
			     path + ml);
}

static bool same_file_as_self(const char *path, const struct stat *self)
{
	struct stat st;

	return stat(path, &st) == 0 && st.st_dev == self->st_dev &&
	       st.st_ino == self->st_ino;
}

char *shim_find_next(const char *name)
{
	const char *path = getenv("PATH"), *p;
	struct stat self;
	bool have_self = stat("/proc/self/exe", &self) == 0;

	if (!path)
		path = "/usr/local/bin:/usr/bin:/bin";
	if (strchr(name, '/'))
		return NULL;
	for (p = path;;) {
		size_t l = strcspn(p, ":");
		char *cand = sbx_xasprintf("%.*s/%s", (int)(l ? l : 1),
					   l ? p : ".", name);
		struct stat st;

		if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) &&
		    access(cand, X_OK) == 0 &&
		    !(have_self && same_file_as_self(cand, &self)))
			return cand;
		free(cand);
		if (!p[l])
			break;
		p += l + 1;
	}
	return NULL;
}

/* Directories on $PATH where `name` is this shim (not forwarded). */
static char **shim_dirs(const char *name)
{
	const char *path = getenv("PATH"), *p;
	struct stat self;
	char **v = NULL;
	size_t n = 0;

	if (!path || stat("/proc/self/exe", &self) < 0)
		return NULL;
	for (p = path;;) {
		size_t l = strcspn(p, ":");
		char *cand = sbx_xasprintf("%.*s/%s", (int)l, p, name);

		if (l && same_file_as_self(cand, &self) &&
		    strcmp(name, "sbx-exec")) {
			v = sbx_xrealloc(v, (n + 2) * sizeof(char *));
			v[n++] = sbx_xstrndup(p, l);
			v[n] = NULL;
		}
		free(cand);
		if (!p[l])
			break;
		p += l + 1;
	}
	return v;
}

static int run_local(const char *name, char **argv, bool multicall)
{
	const char *d = getenv(SHIM_DEPTH_ENV);
	int depth = d ? (int)strtol(d, NULL, 10) : 0;
	char *prog, num[16];

	if (depth >= SHIM_MAX_DEPTH) {
		fprintf(stderr,
			"sbx-exec: %s: shims exec'ing shims %d levels deep; "
			"giving up (a loop? check PATH)\n",
			name, depth);
		return SBX_CTL_EXIT_SBX;
	}
	snprintf(num, sizeof(num), "%d", depth + 1);
	setenv(SHIM_DEPTH_ENV, num, 1);
	if (strchr(name, '/')) {
		execv(name, argv);
		fprintf(stderr, "sbx-exec: %s: %s\n", name, strerror(errno));
		return errno == ENOENT ? SBX_CTL_EXIT_NOTFOUND
				       : SBX_CTL_EXIT_NOEXEC;
	}
	prog = shim_find_next(name);
	if (!prog) {
		fprintf(stderr, "%s%s: command not found%s\n",
			multicall ? "sbx-exec: " : "sbx-exec: ", name,
			multicall ? " (no other one on PATH than this shim)"
				  : "");
		return SBX_CTL_EXIT_NOTFOUND;
	}
	execv(prog, argv);
	fprintf(stderr, "sbx-exec: %s: %s\n", prog, strerror(errno));
	free(prog);
	return errno == ENOENT ? SBX_CTL_EXIT_NOTFOUND : SBX_CTL_EXIT_NOEXEC;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sbx-exec [-C DIR] [-e KEY=VALUE]... [-t|-T] [--] "
		"CMD [ARG...]\n"
		"Runs CMD inside the sandbox when DIR (default: the current "
		"directory) is in an\nsbx mount, else runs it here.  Through "
		"a symlink named X, acts as `sbx-exec X`.\n"
		"  -C DIR        run as if started in DIR\n"
		"  -e KEY=VALUE  set a variable for the command (sandbox "
		"only)\n"
		"  -t / -T       force / refuse a terminal (default: when "
		"stdin and stdout are ttys)\n");
}

int shim_main(int argc, char **argv)
{
	const char *base = strrchr(argv[0], '/');
	const char *dir = NULL, *name;
	char **extra = NULL, **env = NULL, **dirs = NULL, **cargv = NULL;
	size_t nextra = 0;
	int tty = -1, first, rc, status, code;
	bool multicall;
	struct shim_mount m;

	base = base ? base + 1 : argv[0];
	multicall = strcmp(base, "sbx-exec") != 0;
	if (multicall) {
		name = base;
		first = 0; /* argv[0] is the command's own name */
	} else {
		static const struct option lo[] = {
			{ "help", no_argument, NULL, 'h' },
			{ "version", no_argument, NULL, 'V' },
			{ 0 },
		};
		int c;

		/* '+': stop at the first non-option (the command). */
		while ((c = getopt_long(argc, argv, "+C:e:tTh", lo, NULL)) !=
		       -1) {
			switch (c) {
			case 'C':
				dir = optarg;
				break;
			case 'e':
				if (!strchr(optarg, '=')) {
					fprintf(stderr, "sbx-exec: -e wants "
							"KEY=VALUE\n");
					return SBX_CTL_EXIT_SBX;
				}
				extra = sbx_xrealloc(extra, (nextra + 2) *
								   sizeof(char *));
				extra[nextra++] = optarg;
				extra[nextra] = NULL;
				break;
			case 't':
				tty = 1;
				break;
			case 'T':
				tty = 0;
				break;
			case 'h':
				usage(stdout);
				return 0;
			case 'V':
				printf("sbx-exec %s\n", SBX_VERSION);
				return 0;
			default:
				usage(stderr);
				return SBX_CTL_EXIT_SBX;
			}
		}
		if (optind >= argc) {
			usage(stderr);
			return SBX_CTL_EXIT_SBX;
		}
		first = optind;
		name = argv[first];
	}

	rc = shim_mount_find(&m, dir ? dir : ".");
	if (rc < 0) {
		fprintf(stderr, "sbx: %s\n", sbx_error_last()->msg);
		free(extra);
		return SBX_CTL_EXIT_SBX;
	}
	if (rc == 0) {
		free(extra);
		if (dir && chdir(dir) < 0) {
			fprintf(stderr, "sbx-exec: -C %s: %s\n", dir,
				strerror(errno));
			return SBX_CTL_EXIT_SBX;
		}
		if (multicall)
			argv[0] = (char *)name;
		return run_local(name, argv + first, multicall);
	}

	/* Inside a mount: forward. */
	cargv = sbx_xcalloc((size_t)(argc - first) + 1, sizeof(char *));
	cargv[0] = sbx_xstrdup(name);
	for (int i = first + 1; i < argc; i++) {
		char *t = shim_translate_arg(&m, argv[i]);

		cargv[i - first] = t ? t : sbx_xstrdup(argv[i]);
	}
	dirs = shim_dirs(name);
	sbx_ctl_env_build(&env, environ, (const char *const *)dirs,
			  (const char *const *)extra);
	{
		struct sbx_ctl_run_opts o = {
			.socket_path = m.control,
			.session = m.session,
			.argv = (const char *const *)cargv,
			.envp = (const char *const *)env,
			.cwd = m.sandbox_cwd,
		};

		sbx_ctl_run_opts_stdio(&o, tty);
		rc = sbx_ctl_run(&o, &status);
	}
	if (rc < 0) {
		code = sbx_ctl_error_exit_code(rc);
		fprintf(stderr, "sbx: %s\n", sbx_error_last()->msg);
	} else {
		code = sbx_ctl_exit_code(status);
	}
	sbx_ctl_env_free(env);
	sbx_ctl_env_free(dirs);
	sbx_ctl_env_free(cargv);
	free(extra);
	shim_mount_fini(&m);
	return code;
}
