/*
 * sbx gc: delete sandboxes a provider still has but no session owns any
 * more (a pod left behind by a lost $SBX_HOME record, a crash between
 * create and record, `rm -r` of the state).  Only sandboxes that the
 * provider attributes to this state directory are considered (the
 * kubernetes provider labels its pods with it).
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/config.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"

struct gc_ctx {
	char **sessions; /* orphans found by list() */
	size_t n;
	size_t live;
};

static int gc_found(const struct sbx_sandbox_info *info, void *payload)
{
	struct gc_ctx *g = payload;

	if (sbx_name_validate(info->session) == 0 &&
	    sbx_state_exists(info->session)) {
		g->live++;
		return 0;
	}
	sbx_error_clear();
	g->sessions = sbx_xrealloc(g->sessions,
				   (g->n + 1) * sizeof(*g->sessions));
	g->sessions[g->n++] = sbx_xstrdup(info->session);
	printf("%s\t%s\n", info->session,
	       info->sandbox_id ? info->sandbox_id : "?");
	return 0;
}

int cli_cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
		{"provider", required_argument, NULL, 'p'},
		{"dry-run", no_argument, NULL, 'n'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct sbx_config_opts copts = {0};
	struct sbx_provider *p = NULL;
	struct gc_ctx g = {0};
	const char *pname = NULL;
	cJSON *cfg = NULL, *flags = NULL;
	bool dry = false;
	int opt, rc, ret = CLI_EXIT_FAIL, failed = 0;

	while ((opt = getopt_long(argc, argv, "nh", opts, NULL)) != -1) {
		switch (opt) {
		case 'p': pname = optarg; break;
		case 'n': dry = true; break;
		default: return cli_common_opt("gc", opt);
		}
	}
	if (optind < argc)
		return cli_usage("gc", "no arguments expected");
	flags = cJSON_CreateObject();
	if (!flags)
		abort();
	if (pname)
		sbx_json_set_str(flags, "provider", pname);
	copts.config_file = cli_g.config_file;
	copts.flags = flags;
	rc = sbx_config_load(&cfg, &copts);
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_CONFIG);
		goto out;
	}
	pname = sbx_config_provider(cfg);
	rc = sbx_provider_new(&p, pname, sbx_config_section(cfg, pname));
	if (rc == 0)
		rc = p->ops->list(p, gc_found, &g);
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_FAIL);
		goto out;
	}
	for (size_t i = 0; i < g.n && !dry; i++) {
		rc = p->ops->terminate(p, g.sessions[i], SBX_TERMINATE_FORCE);
		if (rc < 0) {
			fprintf(stderr, "sbx: gc: %s: %s\n", g.sessions[i],
				sbx_error_last()->msg);
			sbx_error_clear();
			failed++;
		}
	}
	fprintf(stderr, "sbx: gc: %zu orphaned sandbox%s %s, %zu in use%s\n",
		g.n, g.n == 1 ? "" : "es",
		dry ? "found (dry run: nothing deleted)" : "deleted", g.live,
		failed ? " (some deletions failed)" : "");
	ret = failed ? CLI_EXIT_FAIL : CLI_EXIT_OK;
out:
	for (size_t i = 0; i < g.n; i++)
		free(g.sessions[i]);
	free(g.sessions);
	sbx_provider_free(p);
	cJSON_Delete(cfg);
	cJSON_Delete(flags);
	return ret;
}
