/* `sbx` dispatch table, global options and error reporting. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "cli_i.h"

struct cli_globals cli_g;

static const struct cli_cmd cmds[] = {
	{"up", cli_cmd_up, "sbx up [NAME] [OPTIONS]",
	 "create (or re-attach) a session's sandbox and mount it",
	 "  --provider NAME   provider (local, remote, ...); default from "
	 "config\n"
	 "  --repo DIR        source repository (default: the one holding "
	 "the cwd)\n"
	 "  --ref REV         start the sandbox branch at REV (default: "
	 "HEAD)\n"
	 "  --carry-changes   copy uncommitted changes of the checkout\n"
	 "  --depth N         remote, kubernetes, modal: only N commits of "
	 "history\n"
	 "  --no-repo         remote, kubernetes, modal: leave the workdir "
	 "as it is\n"
	 "  --mount DIR       mountpoint (default: $SBX_MOUNT_ROOT/NAME, "
	 "~/sbx/NAME)\n"
	 "  --isolate         run commands under bubblewrap "
	 "(local.isolation=bwrap)\n"
	 "  --allow-other     let other users use the mount "
	 "(mount.allow_other)\n"
	 "  --url URL         remote: base URL of a running sbx-agent\n"
	 "  --token-file FILE remote: file holding the agent's token\n"
	 "  --timeout SECONDS remote: bound on every request (default 30)\n"
	 "  --image IMG       kubernetes, modal: the sandbox's image\n"
	 "  --namespace NS    kubernetes: namespace (default: the context's)\n"
	 "  --context CTX     kubernetes: kubeconfig context (default: "
	 "current)\n"
	 "  --kubeconfig FILE kubernetes: kubeconfig (default: $KUBECONFIG, "
	 "~/.kube/config)\n"
	 "  --config FILE     extra configuration file\n"
	 "  --json            print the status object instead of the "
	 "mountpoint\n"
	 "NAME defaults to the repository's name plus a random suffix.\n"
	 "Running it again for a live session just prints it.  For remote,\n"
	 "kubernetes and modal sandboxes the repository (--repo, or the one\n"
	 "holding the cwd) is sent in: the workdir is a checkout of REV on\n"
	 "branch sbx/NAME; `sbx pull NAME` brings the commits back.\n"},
	{"down", cli_cmd_down, "sbx down NAME [OPTIONS]",
	 "unmount and remove a session's sandbox",
	 "  --keep-sandbox    only unmount; keep the sandbox and the session\n"
	 "  --delete-branch   local: also delete the branch sbx/NAME\n"
	 "  --force           discard uncommitted changes; lazy unmount if "
	 "busy\n"
	 "Refuses (exit 4) when the sandbox holds uncommitted work; the "
	 "mount is then restored.\n"},
	{"pull", cli_cmd_pull, "sbx pull NAME [--repo DIR] [--json]",
	 "bring the sandbox's commits on sbx/NAME into the repository",
	 "  --repo DIR        the repository (default: the session's, from "
	 "`up`)\n"
	 "  --json            print what happened as JSON\n"
	 "Receives only the objects the repository lacks, keeps the "
	 "sandbox's head\n"
	 "in refs/sbx/pulled/NAME, then creates or fast-forwards "
	 "sbx/NAME.  A\n"
	 "diverged sbx/NAME is never overwritten (exit 4).  `sbx down` "
	 "pulls\n"
	 "before it removes a sandbox.\n"},
	{"ls", cli_cmd_ls, "sbx ls [--json]", "list sessions",
	 "  --json            print an array of status objects\n"},
	{"status", cli_cmd_status, "sbx status NAME [--json]",
	 "show one session", "  --json            print the status object\n"},
	{"mount", cli_cmd_mount, "sbx mount NAME [DIR] [-f]",
	 "mount an existing session again (after a crash or umount)",
	 "  -f, --foreground  serve in this process until unmounted\n"
	 "  --allow-other     let other users use the mount (remembered)\n"
	 "  --no-allow-other  only this user (remembered)\n"
	 "DIR defaults to the session's previous mountpoint.\n"},
	{"umount", cli_cmd_umount, "sbx umount NAME [--force]",
	 "unmount a session, keeping its sandbox",
	 "  --force           lazy unmount when the mount is busy\n"},
	{"snapshot", cli_cmd_snapshot, "sbx snapshot NAME [-m MSG]",
	 "record the sandbox state; prints the snapshot id",
	 "  -m, --message MSG snapshot message\n"},
	{"snapshots", cli_cmd_snapshots, "sbx snapshots NAME [--json]",
	 "list a session's snapshots, newest first",
	 "  --json            print a JSON array\n"},
	{"restore", cli_cmd_restore, "sbx restore NAME SNAPSHOT",
	 "return the sandbox to a snapshot; prints the id of the safety "
	 "snapshot taken first",
	 ""},
	{"exec", cli_cmd_exec,
	 "sbx exec NAME [-C DIR] [-e KEY=VALUE]... [-t|-T] -- CMD [ARG...]",
	 "run a command inside the sandbox",
	 "  -C DIR            working directory: relative to the sandbox's\n"
	 "                    workdir, or absolute inside the sandbox\n"
	 "  -e KEY=VALUE      set an environment variable (repeatable)\n"
	 "  -t / -T           force / refuse a terminal (default: a terminal\n"
	 "                    when stdin and stdout are terminals)\n"
	 "The exit status is the command's, 128+N for death by signal N,\n"
	 "125 when sbx itself fails.  See docs/exec.md for the environment "
	 "policy.\n"},
	{"shell", cli_cmd_shell, "sbx shell NAME",
	 "interactive shell inside the sandbox",
	 "Runs $SHELL (or bash -l) in a terminal inside the sandbox.\n"},
	{"shim", cli_cmd_shim, "sbx shim install DIR [CMD...]",
	 "install exec-shim symlinks into DIR",
	 "Makes DIR/CMD -> sbx-exec for each CMD (default: sh, bash, make and\n"
	 "common build tools; see docs/exec.md).  Outside a mount a shim runs\n"
	 "the next CMD on PATH, so DIR may stay on PATH.\n"},
	{"env", cli_cmd_env, "sbx env NAME",
	 "print shell lines that put the shims on PATH",
	 "Prints export lines for PATH (the shim directory, installed on\n"
	 "demand under $SBX_HOME/shims) and SBX_SESSION.  Use:\n"
	 "  eval \"$(sbx env NAME)\"\n"},
	{"serve", cli_cmd_serve,
	 "sbx serve [--socket PATH|--listen ADDR] [--token-file FILE]",
	 "serve the session REST API (docs/api.md)",
	 "  --socket PATH     a unix socket (default $SBX_HOME/run/serve.sock\n"
	 "                    when SBX_HOME is set, else\n"
	 "                    $XDG_RUNTIME_DIR/sbx/serve.sock); only this user\n"
	 "                    and root may connect\n"
	 "  --listen ADDR     127.0.0.1:PORT (port 0 picks one), [::1]:PORT,\n"
	 "                    or unix:PATH (= --socket PATH)\n"
	 "  --token-file FILE require this bearer token on every request\n"
	 "                    (mode 0600); on TCP without it a token is\n"
	 "                    generated and its file printed as\n"
	 "                    \"token-file PATH\"; needed for a non-loopback\n"
	 "                    address\n"
	 "Prints \"listening on ADDR\" on stdout once ready; stops on "
	 "SIGINT/SIGTERM.\n"},
	{"gc", cli_cmd_gc, "sbx gc [--provider NAME] [--dry-run]",
	 "delete sandboxes that no session owns any more",
	 "  --provider NAME   provider to clean (default from config)\n"
	 "  -n, --dry-run     only list them (SESSION<TAB>SANDBOX lines)\n"
	 "Only sandboxes made from this $SBX_HOME are considered.\n"},
	{"help", cli_cmd_help, "sbx help [COMMAND]", "show help", ""},
	{"version", cli_cmd_version, "sbx version", "print the version", ""},
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

const struct cli_cmd *cli_cmd_find(const char *name)
{
	for (size_t i = 0; i < NCMDS; i++)
		if (strcmp(cmds[i].name, name) == 0)
			return &cmds[i];
	return NULL;
}

void cli_print_help(const struct cli_cmd *c, FILE *f)
{
	fprintf(f, "usage: %s\n\n%s.\n", c->usage, c->summary);
	if (c->help && *c->help)
		fprintf(f, "\n%s", c->help);
	fprintf(f, "  -h, --help        show this help\n");
}

static void print_overview(FILE *f)
{
	fprintf(f, "usage: sbx [--config FILE] COMMAND [ARGS]\n\n"
		   "Sandboxes mounted as local directories.\n\ncommands:\n");
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  %-10s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\nglobal options:\n"
		   "  --config FILE  extra configuration file (as $SBX_CONFIG)\n"
		   "  --version      print the version\n"
		   "  -h, --help     show this help\n"
		   "\nenvironment: SBX_HOME (state), SBX_MOUNT_ROOT, "
		   "SBX_CONFIG, SBX_LOG.\n"
		   "`sbx help COMMAND` shows a command's options; exit codes "
		   "are listed in docs/cli.md.\n");
}

int cli_report(int fallback)
{
	const struct sbx_error *e = sbx_error_last();

	fprintf(stderr, "sbx: %s\n",
		e->klass != SBX_ERR_NONE ? e->msg : "failed");
	switch (e->klass) {
	case SBX_ERR_NOTFOUND:
		return CLI_EXIT_NOTFOUND;
	case SBX_ERR_STATE:
		return CLI_EXIT_REFUSED;
	case SBX_ERR_CONFIG:
		return CLI_EXIT_CONFIG;
	default:
		break;
	}
	if (e->code == -EBUSY)
		return CLI_EXIT_REFUSED;
	return fallback;
}

int cli_usage(const char *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "sbx %s: ", cmd);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n(see `sbx help %s`)\n", cmd);
	return CLI_EXIT_USAGE;
}

int cli_common_opt(const char *cmd, int opt)
{
	if (opt == 'h') {
		cli_print_help(cli_cmd_find(cmd), stdout);
		return CLI_EXIT_OK;
	}
	/* getopt already printed "unrecognized option". */
	fprintf(stderr, "(see `sbx help %s`)\n", cmd);
	return CLI_EXIT_USAGE;
}

int cli_check_name(const char *cmd, const char *name)
{
	if (sbx_name_validate(name) == 0)
		return 0;
	fprintf(stderr, "sbx %s: %s\n", cmd, sbx_error_last()->msg);
	return CLI_EXIT_USAGE;
}

int cli_args_name(const char *cmd, int argc, char **argv, int min, int max,
		  const char *expected)
{
	int n = argc - optind;

	if (n < min || n > max)
		return cli_usage(cmd, "%s", expected);
	if (cli_check_name(cmd, argv[optind]))
		return CLI_EXIT_USAGE;
	return CLI_EXIT_OK;
}

void cli_print_json(const cJSON *j)
{
	char *s = sbx_json_print(j, true);

	printf("%s\n", s);
	free(s);
}

int cli_cmd_help(int argc, char **argv)
{
	const struct cli_cmd *c;

	if (argc < 2) {
		print_overview(stdout);
		return CLI_EXIT_OK;
	}
	c = cli_cmd_find(argv[1]);
	if (!c)
		return cli_usage("help", "unknown command '%s'", argv[1]);
	cli_print_help(c, stdout);
	return CLI_EXIT_OK;
}

int cli_cmd_version(int argc, char **argv)
{
	printf("sbx %s\n", SBX_VERSION);
	return CLI_EXIT_OK;
}

int cli_main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	/*
	 * getopt prefixes its messages ("unrecognized option", "requires an
	 * argument") with argv[0]: make that "sbx", and "sbx CMD" for a
	 * subcommand, as cli_usage() prints (docs/cli.md: errors are
	 * prefixed `sbx:`).  No command reads its argv[0].
	 */
	static char prog[] = "sbx";
	static char cmd_prog[64];
	const struct cli_cmd *c;
	int opt;

	sbx_log_init("sbx");
	if (argc > 0)
		argv[0] = prog;
	/* "+": stop at the subcommand; its options are its own. */
	while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (opt) {
		case 'c':
			cli_g.config_file = optarg;
			break;
		case 'V':
			return cli_cmd_version(0, NULL);
		case 'h':
			print_overview(stdout);
			return CLI_EXIT_OK;
		default:
			fprintf(stderr, "(see `sbx help`)\n");
			return CLI_EXIT_USAGE;
		}
	}
	if (optind >= argc) {
		print_overview(stderr);
		return CLI_EXIT_USAGE;
	}
	c = cli_cmd_find(argv[optind]);
	if (!c) {
		fprintf(stderr, "sbx: unknown command '%s' (see `sbx help`)\n",
			argv[optind]);
		return CLI_EXIT_USAGE;
	}
	argc -= optind;
	argv += optind;
	snprintf(cmd_prog, sizeof(cmd_prog), "sbx %s", c->name);
	argv[0] = cmd_prog;
	optind = 0; /* full getopt re-initialisation for the subcommand */
	return c->run(argc, argv);
}
