/*
 * sbx ls / sbx status: report sessions from the state store, corrected
 * by what their providers and daemons say now (status_ask.c).
 */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "repo_i.h"

static const char *or_dash(const char *s)
{
	return s && *s ? s : "-";
}

int cli_cmd_ls(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	cJSON *arr = NULL, **sts = NULL;
	struct sbx_session *ss = NULL;
	char **names = NULL;
	size_t n = 0, m = 0;
	bool json = false;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'j': json = true; break;
		default: return cli_common_opt("ls", opt);
		}
	}
	if (optind != argc)
		return cli_usage("ls", "unexpected argument '%s'",
				 argv[optind]);
	rc = sbx_state_list(&names, &n);
	if (rc < 0)
		return cli_report(CLI_EXIT_FAIL);
	arr = cJSON_CreateArray();
	ss = sbx_xcalloc(n ? n : 1, sizeof(*ss));
	for (size_t i = 0; i < n; i++) {
		/* Lock-free: records are replaced atomically. */
		if (sbx_state_load(&ss[m], names[i]) < 0) {
			fprintf(stderr, "sbx: skipping %s: %s\n", names[i],
				sbx_error_last()->msg);
			sbx_error_clear();
			sbx_session_fini(&ss[m]);
			continue;
		}
		m++;
	}
	/* The same state as `sbx status`, every provider asked at once. */
	sts = sbx_xcalloc(m ? m : 1, sizeof(*sts));
	cli_status_gather(sts, ss, m, CLI_LS_TIMEOUT_MS);
	if (!json && m)
		printf("%-24s %-10s %-8s %-7s %s\n", "NAME", "PROVIDER",
		       "STATE", "MOUNTED", "MOUNTPOINT");
	for (size_t i = 0; i < m; i++) {
		if (!json)
			printf("%-24s %-10s %-8s %-7s %s\n", ss[i].session,
			       or_dash(ss[i].provider),
			       or_dash(sbx_json_str(sts[i], "state")),
			       sbx_json_bool(sts[i], "mounted", false) ? "yes"
								       : "no",
			       or_dash(ss[i].mountpoint));
		cJSON_AddItemToArray(arr, sts[i]);
		sbx_session_fini(&ss[i]);
	}
	if (json)
		cli_print_json(arr);
	cJSON_Delete(arr);
	free(sts);
	free(ss);
	sbx_state_names_free(names, n);
	return CLI_EXIT_OK;
}

int cli_cmd_status(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	static const char *const keys[] = {
		"session", "provider", "sandbox_id", "state", "mountpoint",
		"workdir", "created_at", "isolation", NULL,
	};
	struct sbx_session s;
	bool json = false;
	cJSON *st;
	int opt, ret;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'j': json = true; break;
		default: return cli_common_opt("status", opt);
		}
	}
	ret = cli_args_name("status", argc, argv, 1, 1,
			    "expected one session NAME");
	if (ret != CLI_EXIT_OK)
		return ret;
	if (sbx_state_load(&s, argv[optind]) < 0)
		return cli_report(CLI_EXIT_FAIL);
	/* The record, the provider, then the daemon (status_ask.c). */
	st = cli_status_object(&s, SBX_STATUS_PING_MS);
	/* The sandbox's sbx/NAME and whether it is pulled (cmd_pull.c). */
	cli_status_branch(st, &s);
	if (json) {
		cli_print_json(st);
	} else {
		const cJSON *err = cJSON_GetObjectItem(st, "error");

		for (size_t i = 0; keys[i]; i++)
			printf("%-11s %s\n", keys[i],
			       or_dash(sbx_json_str(st, keys[i])));
		printf("%-11s %s\n", "remote",
		       sbx_json_bool(st, "remote", false) ? "yes" : "no");
		printf("%-11s %s\n", "mounted",
		       sbx_json_bool(st, "mounted", false) ? "yes" : "no");
		if (sbx_json_bool(st, "mounted", false))
			printf("%-11s %d\n", "pid", (int)s.pid);
		else if (s.pid > 0)
			printf("%-11s the daemon (pid %d) is not running; run "
			       "`sbx mount %s` to re-attach\n", "note",
			       (int)s.pid, s.session);
		else
			printf("%-11s not mounted; run `sbx mount %s`\n", "note",
			       s.session);
		cli_status_branch_print(st);
		if (err)
			printf("%-11s %s: %s\n", "error",
			       or_dash(sbx_json_str(err, "type")),
			       or_dash(sbx_json_str(err, "message")));
	}
	/* A state nobody could tell is not a success. */
	ret = strcmp(or_dash(sbx_json_str(st, "state")),
		     SBX_STATUS_STATE_UNKNOWN) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
	cJSON_Delete(st);
	sbx_session_fini(&s);
	return ret;
}
