/* The sbx-agent command line; the server is server.c. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sbx/log.h"
#include "sbx/proto.h"

#include "agent_i.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: sbx-agent serve --root DIR --listen HOST:PORT|unix:PATH\n"
		"                       --token-file FILE|--token-env NAME\n"
		"                       [--tls-cert F --tls-key F]\n"
		"       sbx-agent --version\n"
		"       sbx-agent help\n"
		"\n"
		"Serves DIR and the commands run in it over HTTP (protocol %d,\n"
		"docs/protocol.md).  Every route but /v1/health needs the header\n"
		"X-Sbx-Token with the first line of FILE (which only its owner\n"
		"may access: chmod 600), or the value of the environment\n"
		"variable NAME (which is then removed from the environment, so\n"
		"commands run by the agent do not see it).  Connections that do\n"
		"not show the token are closed after 10 s.\n"
		"--listen 127.0.0.1:0 picks a free port; the address is printed\n"
		"on stdout.\n"
		"SBX_LOG=debug logs every request.\n",
		SBX_PROTO_VERSION);
}

static int serve(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "root", required_argument, NULL, 'r' },
		{ "listen", required_argument, NULL, 'l' },
		{ "token-file", required_argument, NULL, 't' },
		{ "token-env", required_argument, NULL, 'e' },
		{ "tls-cert", required_argument, NULL, 'c' },
		{ "tls-key", required_argument, NULL, 'k' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct agent_options opt = { 0 };
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
		switch (c) {
		case 'r':
			opt.root = optarg;
			break;
		case 'l':
			opt.listen = optarg;
			break;
		case 't':
			opt.token_file = optarg;
			break;
		case 'e':
			opt.token_env = optarg;
			break;
		case 'c':
			opt.tls_cert = optarg;
			break;
		case 'k':
			opt.tls_key = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc || !opt.root || !opt.listen ||
	    (!opt.token_file && !opt.token_env)) {
		fprintf(stderr, "sbx-agent serve: --root, --listen and "
				"--token-file or --token-env are required\n");
		usage(stderr);
		return 2;
	}
	if (opt.token_file && opt.token_env) {
		fprintf(stderr, "sbx-agent serve: give either --token-file or "
				"--token-env, not both\n");
		usage(stderr);
		return 2;
	}
	if (opt.token_env && (!*opt.token_env || strchr(opt.token_env, '='))) {
		fprintf(stderr, "sbx-agent serve: --token-env \"%s\": not a "
				"variable name\n",
			opt.token_env);
		return 2;
	}
	rc = agent_server_run(&opt);
	if (rc < 0) {
		fprintf(stderr, "sbx-agent: %s\n", sbx_error_last()->msg);
		return 1;
	}
	return 0;
}

int agent_main(int argc, char **argv)
{
	sbx_log_init("agent");
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
		printf("sbx-agent %s (protocol %d)\n", SBX_VERSION,
		       SBX_PROTO_VERSION);
		return 0;
	}
	if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
	    !strcmp(argv[1], "-h")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(argv[1], "serve"))
		return serve(argc - 1, argv + 1);
	fprintf(stderr, "sbx-agent: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return 2;
}
