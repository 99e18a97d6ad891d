/* sbx ls / sbx status: report sessions from the state store. */
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
#include "cli_i.h"

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
	cJSON *arr = NULL;
	char **names = NULL;
	size_t n = 0;
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
	if (!json && n)
		printf("%-24s %-10s %-8s %-7s %s\n", "NAME", "PROVIDER",
		       "STATE", "MOUNTED", "MOUNTPOINT");
	for (size_t i = 0; i < n; i++) {
		struct sbx_session s;
		cJSON *st;

		/* Lock-free: records are replaced atomically. */
		if (sbx_state_load(&s, names[i]) < 0) {
			fprintf(stderr, "sbx: skipping %s: %s\n", names[i],
				sbx_error_last()->msg);
			sbx_error_clear();
			continue;
		}
		st = sbx_status_new(&s);
		if (!json)
			printf("%-24s %-10s %-8s %-7s %s\n", s.session,
			       or_dash(s.provider),
			       or_dash(sbx_json_str(st, "state")),
			       sbx_json_bool(st, "mounted", false) ? "yes"
								   : "no",
			       or_dash(s.mountpoint));
		cJSON_AddItemToArray(arr, st);
		sbx_session_fini(&s);
	}
	if (json)
		cli_print_json(arr);
	cJSON_Delete(arr);
	sbx_state_names_free(names, n);
	return CLI_EXIT_OK;
}

/*
 * A remote sandbox can die behind our back (a pod deleted or evicted, an
 * agent gone): ask the provider, and report what it says as the state
 * and error.  Failing to ask is not an error of `status`.
 */
static void ask_provider(const struct sbx_session *s, cJSON *st)
{
	struct sbx_provider *p = NULL;
	struct sbx_sandbox_info info;
	const char *err;

	memset(&info, 0, sizeof(info));
	if (cli_session_provider(&p, s) < 0 ||
	    p->ops->get(p, s->session, &info) < 0) {
		sbx_error_clear();
		sbx_provider_free(p);
		return;
	}
	sbx_json_set_str(st, "state", sbx_state_name(info.state));
	err = sbx_json_str(info.extra, "error");
	if (info.state == SBX_STATE_ERROR && err &&
	    !cJSON_GetObjectItem(st, "error")) {
		cJSON *e = cJSON_CreateObject();

		sbx_json_set_str(e, "type", SBX_STATUS_NOTFOUND_ERROR);
		sbx_json_set_str(e, "message", err);
		sbx_json_set_take(st, "error", e);
	}
	if (info.extra) {
		sbx_json_set_take(st, "sandbox", info.extra);
		info.extra = NULL;
	}
	sbx_sandbox_info_fini(&info);
	sbx_provider_free(p);
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
	int opt;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'j': json = true; break;
		default: return cli_common_opt("status", opt);
		}
	}
	if (argc - optind != 1)
		return cli_usage("status", "expected one session NAME");
	if (cli_check_name("status", argv[optind]))
		return CLI_EXIT_USAGE;
	if (sbx_state_load(&s, argv[optind]) < 0)
		return cli_report(CLI_EXIT_FAIL);
	st = sbx_status_new(&s);
	if (s.remote && s.state == SBX_STATE_READY)
		ask_provider(&s, st);
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
		if (err)
			printf("%-11s %s: %s\n", "error",
			       or_dash(sbx_json_str(err, "type")),
			       or_dash(sbx_json_str(err, "message")));
	}
	cJSON_Delete(st);
	sbx_session_fini(&s);
	return CLI_EXIT_OK;
}
