/*
 * sbx exec / sbx shell: run a command in a session's sandbox through its
 * daemon's control socket.  The client is sbx_ctl_run() (lib/ctl.c), the
 * same one the sbx-exec shim uses; see docs/exec.md.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sbx/ctl.h"
#include "sbx/paths.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"

#include "cli_i.h"

extern char **environ;

struct exec_args {
	const char *cmd;     /* "exec" or "shell", for messages */
	const char *name;
	const char *dir;     /* -C */
	char **extra;        /* -e KEY=VALUE, NULL-terminated */
	size_t nextra;
	int tty;             /* -1 auto, 0 -T, 1 -t */
	char **argv;
};

/* The control socket of session `name`: as recorded by the daemon, else
 * the conventional path.  *out malloc'd; *remote_out: a remote session. */
static int session_socket(char **out, bool *remote_out, const char *name)
{
	struct sbx_session s;
	int rc;

	*out = NULL;
	*remote_out = false;
	rc = sbx_state_load(&s, name);
	if (rc < 0) {
		sbx_session_fini(&s);
		return rc;
	}
	if (s.control_socket)
		*out = sbx_xstrdup(s.control_socket);
	*remote_out = s.remote;
	sbx_session_fini(&s);
	if (*out)
		return 0;
	return sbx_paths_session_file(out, "run", name, ".sock");
}

/*
 * -e KEY=VALUE, plus (remote sessions) SBX_EXEC_SET=KEY,... naming them: a
 * sandbox with an environment of its own (kubernetes, modal) keeps its
 * PATH and HOME unless the user set them here; the remote provider reads
 * and drops it (docs/exec.md).  *set_out is freed by the caller; the
 * array is NULL-terminated.
 */
static const char **with_exec_set(const struct exec_args *a, bool remote,
				  char **set_out)
{
	const char **v = sbx_xcalloc(a->nextra + 2, sizeof(*v));
	char *set = sbx_xstrdup("SBX_EXEC_SET=");

	for (size_t i = 0; i < a->nextra; i++) {
		char *next = sbx_xasprintf("%s%s%.*s", set, i ? "," : "",
					   (int)strcspn(a->extra[i], "="),
					   a->extra[i]);

		free(set);
		set = next;
		v[i] = a->extra[i];
	}
	if (a->nextra && remote)
		v[a->nextra] = set;
	*set_out = set;
	return v;
}

static int run_exec(const struct exec_args *a)
{
	char *sock = NULL, **env = NULL, *set = NULL;
	const char **extra;
	bool remote = false;
	int rc, status;

	rc = cli_check_name(a->cmd, a->name);
	if (rc)
		return rc;
	rc = session_socket(&sock, &remote, a->name);
	if (rc < 0)
		return cli_report(SBX_CTL_EXIT_SBX);
	extra = with_exec_set(a, remote, &set);
	sbx_ctl_env_build(&env, environ, NULL, extra);
	free(extra);
	free(set);
	{
		struct sbx_ctl_run_opts o = {
			.socket_path = sock,
			.session = a->name,
			.argv = (const char *const *)a->argv,
			.envp = (const char *const *)env,
			.cwd = a->dir ? a->dir : "",
		};

		sbx_ctl_run_opts_stdio(&o, a->tty);
		rc = sbx_ctl_run(&o, &status);
	}
	sbx_ctl_env_free(env);
	free(sock);
	if (rc < 0) {
		int code = sbx_ctl_error_exit_code(rc);

		fprintf(stderr, "sbx %s: %s\n", a->cmd, sbx_error_last()->msg);
		return code;
	}
	return sbx_ctl_exit_code(status);
}

static int parse(struct exec_args *a, int argc, char **argv, bool want_cmd)
{
	static const struct option lo[] = {
		{ "help", no_argument, NULL, 'h' },
		{ "tty", no_argument, NULL, 't' },
		{ "no-tty", no_argument, NULL, 'T' },
		{ 0 },
	};
	int opt;

	/* '+': options end at the first non-option (NAME or CMD). */
	while ((opt = getopt_long(argc, argv, "+C:e:tTh", lo, NULL)) != -1) {
		switch (opt) {
		case 'C':
			a->dir = optarg;
			break;
		case 'e':
			if (!strchr(optarg, '=') || optarg[0] == '=')
				return cli_usage(a->cmd, "-e wants KEY=VALUE, "
							 "not '%s'", optarg);
			a->extra = sbx_xrealloc(a->extra, (a->nextra + 2) *
								  sizeof(char *));
			a->extra[a->nextra++] = optarg;
			a->extra[a->nextra] = NULL;
			break;
		case 't':
			a->tty = 1;
			break;
		case 'T':
			a->tty = 0;
			break;
		default:
			return cli_common_opt(a->cmd, opt);
		}
		/* NAME may come first, options after it. */
	}
	return -1;
}

int cli_cmd_exec(int argc, char **argv)
{
	struct exec_args a = { .cmd = "exec", .tty = -1 };
	int rc;

	rc = parse(&a, argc, argv, true);
	if (rc >= 0)
		goto out;
	/* sbx exec NAME [OPTIONS] -- CMD...; NAME defaults to $SBX_SESSION
	 * when the command follows "--" directly. */
	if (optind < argc && strcmp(argv[optind - 1], "--") &&
	    argv[optind][0] != '-') {
		a.name = argv[optind++];
		rc = parse(&a, argc, argv, true);
		if (rc >= 0)
			goto out;
	}
	if (!a.name)
		a.name = getenv("SBX_SESSION");
	if (!a.name) {
		rc = cli_usage("exec", "missing session NAME");
		goto out;
	}
	if (optind >= argc) {
		rc = cli_usage("exec", "missing the command to run (after --)");
		goto out;
	}
	a.argv = argv + optind;
	rc = run_exec(&a);
out:
	free(a.extra);
	return rc;
}

int cli_cmd_shell(int argc, char **argv)
{
	struct exec_args a = { .cmd = "shell", .tty = -1 };
	/* The sandbox's idea of a shell: the user's $SHELL when the sandbox
	 * has it, else bash, else sh; as a login shell. */
	char *sh_argv[] = {
		"sh", "-c",
		"s=${SBX_USER_SHELL:-bash}; "
		"command -v \"$s\" >/dev/null 2>&1 || s=bash; "
		"command -v \"$s\" >/dev/null 2>&1 || s=sh; "
		"exec \"$s\" -l",
		NULL,
	};
	char *shell_env = NULL;
	int rc;

	rc = parse(&a, argc, argv, false);
	if (rc >= 0)
		goto out;
	if (optind < argc)
		a.name = argv[optind++];
	else
		a.name = getenv("SBX_SESSION");
	if (!a.name) {
		rc = cli_usage("shell", "missing session NAME");
		goto out;
	}
	if (optind < argc) {
		rc = cli_usage("shell", "unexpected argument '%s' (use `sbx "
					"exec NAME -- CMD` to run a command)",
			       argv[optind]);
		goto out;
	}
	if (getenv("SHELL")) {
		shell_env = sbx_xasprintf("SBX_USER_SHELL=%s", getenv("SHELL"));
		a.extra = sbx_xrealloc(a.extra,
				       (a.nextra + 2) * sizeof(char *));
		a.extra[a.nextra++] = shell_env;
		a.extra[a.nextra] = NULL;
	}
	if (a.tty < 0)
		a.tty = isatty(0) ? 1 : 0;
	a.argv = sh_argv;
	rc = run_exec(&a);
out:
	free(shell_env);
	free(a.extra);
	return rc;
}
