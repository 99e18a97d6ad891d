/* sbx snapshot / snapshots / restore: provider snapshots of a session. */
#include "config.h"

#include <getopt.h>
#include <stdio.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "cli_i.h"

/* A session under its lock, with its provider: what snapshot and restore
 * work on. */
struct locked {
	struct sbx_session s;
	struct sbx_provider *p;
	int lock;
};

static int locked_open(struct locked *l, const char *name)
{
	int rc;

	sbx_session_init(&l->s);
	l->p = NULL;
	l->lock = -1;
	rc = cli_session_lock_load(&l->s, &l->lock, name);
	if (rc == 0)
		rc = cli_session_provider(&l->p, &l->s);
	return rc;
}

/* Report a failure (rc < 0), release everything; the exit code. */
static int locked_close(struct locked *l, int rc)
{
	int ret = rc < 0 ? cli_report(CLI_EXIT_FAIL) : CLI_EXIT_OK;

	sbx_provider_free(l->p);
	sbx_state_unlock(l->lock);
	sbx_session_fini(&l->s);
	return ret;
}

int cli_cmd_snapshot(int argc, char **argv)
{
	static const struct option opts[] = {
		{"message", required_argument, NULL, 'm'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct locked l;
	const char *msg = NULL;
	char *id = NULL;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
		switch (opt) {
		case 'm': msg = optarg; break;
		default: return cli_common_opt("snapshot", opt);
		}
	}
	rc = cli_args_name("snapshot", argc, argv, 1, 1,
			   "expected one session NAME");
	if (rc != CLI_EXIT_OK)
		return rc;
	rc = locked_open(&l, argv[optind]);
	if (rc == 0)
		rc = l.p->ops->snapshot(l.p, l.s.session,
					msg ? msg : "sbx snapshot", &id);
	if (rc == 0)
		printf("%s\n", id);
	free(id);
	return locked_close(&l, rc);
}

struct list_ctx {
	bool json;
	cJSON *arr;
};

static int print_snap(const struct sbx_snapshot_info *snap, void *payload)
{
	struct list_ctx *ctx = payload;
	char when[32];

	sbx_json_time_format(when, sizeof(when), snap->created_at);
	if (ctx->json) {
		cJSON *o = cJSON_CreateObject();

		sbx_json_set_str(o, "id", snap->id);
		sbx_json_set_str(o, "created_at", when);
		sbx_json_set_str(o, "message", snap->message);
		cJSON_AddItemToArray(ctx->arr, o);
	} else {
		printf("%s  %s  %s\n", snap->id, when,
		       snap->message ? snap->message : "");
	}
	return 0;
}

int cli_cmd_snapshots(int argc, char **argv)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct list_ctx ctx = {0};
	struct sbx_provider *p = NULL;
	struct sbx_session s;
	int opt, rc, ret;

	sbx_session_init(&s);
	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (opt) {
		case 'j': ctx.json = true; break;
		default: return cli_common_opt("snapshots", opt);
		}
	}
	ret = cli_args_name("snapshots", argc, argv, 1, 1,
			    "expected one session NAME");
	if (ret != CLI_EXIT_OK)
		return ret;
	ctx.arr = cJSON_CreateArray();
	/* Read-only: listing refs needs no lock. */
	rc = sbx_state_load(&s, argv[optind]);
	if (rc == 0)
		rc = cli_session_provider(&p, &s);
	if (rc == 0)
		rc = p->ops->snapshots(p, s.session, print_snap, &ctx);
	if (rc < 0) {
		ret = cli_report(CLI_EXIT_FAIL);
	} else {
		if (ctx.json)
			cli_print_json(ctx.arr);
		ret = CLI_EXIT_OK;
	}
	cJSON_Delete(ctx.arr);
	sbx_provider_free(p);
	sbx_session_fini(&s);
	return ret;
}

/*
 * Some providers restore by replacing the sandbox (modal: a new sandbox
 * from the snapshot's image).  A mount still serving the old one is then
 * restarted on the new one.
 */
static int remount_if_replaced(struct sbx_provider *p, struct sbx_session *s,
			       int lock)
{
	struct sbx_sandbox_info info;
	bool mounted = s->pid > 0 && sbx_status_daemon_alive(s->pid);
	int rc;

	memset(&info, 0, sizeof(info));
	rc = p->ops->get(p, s->session, &info);
	if (rc < 0 || !info.sandbox_id || !s->sandbox_id ||
	    !strcmp(info.sandbox_id, s->sandbox_id)) {
		sbx_error_clear();
		sbx_sandbox_info_fini(&info);
		return 0;
	}
	free(s->sandbox_id);
	s->sandbox_id = info.sandbox_id;
	info.sandbox_id = NULL;
	sbx_sandbox_info_fini(&info);
	if (mounted) {
		rc = cli_daemon_stop(s, true);
		if (rc == 0)
			rc = cli_daemon_start(s, lock);
		if (rc < 0)
			rc = sbx_error_prefix(rc, "restored, but mounting the "
					      "new sandbox failed (run `sbx "
					      "mount %s`)", s->session);
	}
	if (sbx_state_save(s) < 0 && rc == 0)
		rc = -EIO;
	return rc;
}

int cli_cmd_restore(int argc, char **argv)
{
	static const struct option opts[] = {
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct locked l;
	char *saved = NULL;
	int opt, rc;

	while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1)
		return cli_common_opt("restore", opt);
	rc = cli_args_name("restore", argc, argv, 2, 2,
			   "expected NAME SNAPSHOT");
	if (rc != CLI_EXIT_OK)
		return rc;
	rc = locked_open(&l, argv[optind]);
	if (rc == 0)
		rc = l.p->ops->restore(l.p, l.s.session, argv[optind + 1],
				       &saved);
	if (rc == 0)
		rc = remount_if_replaced(l.p, &l.s, l.lock);
	if (rc == 0 && saved) {
		printf("%s\n", saved);
		fprintf(stderr, "sbx: the previous state was saved as "
				"snapshot %s\n", saved);
	}
	free(saved);
	return locked_close(&l, rc);
}
