/*
 * The route table (docs/protocol.md, "Routes") and the health and info
 * handlers.  A static table, like OpenSSH sftp-server's handlers[]: the
 * method and path pattern (matched by lib/httpd.c, as `sbx serve`'s are),
 * whether the token is required and how large a body may be.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

#define JSON_BODY SBX_PROTO_MAX_JSON_BODY
#define DATA_BODY SBX_PROTO_MAX_WRITE_BODY

static const struct agent_route routes[] = {
	{ { "GET", "/v1/health" }, agent_h_health, false, 0 },
	{ { "GET", "/v1/info" }, agent_h_info, true, 0 },
	{ { "GET", "/v1/fs/stat" }, agent_h_stat, true, 0 },
	{ { "GET", "/v1/fs/list" }, agent_h_list, true, 0 },
	{ { "GET", "/v1/fs/read" }, agent_h_read, true, 0 },
	{ { "PUT", "/v1/fs/write" }, agent_h_write, true, DATA_BODY },
	{ { "GET", "/v1/fs/readlink" }, agent_h_readlink, true, 0 },
	{ { "GET", "/v1/fs/statfs" }, agent_h_statfs, true, 0 },
	{ { "POST", "/v1/fs/batch" }, agent_h_batch, true, JSON_BODY },
	{ { "GET", "/v1/fs/bulk" }, agent_h_bulk, true, 0 },
	{ { "POST", "/v1/fs/bulk" }, agent_h_bulk_files, true, JSON_BODY },
	{ { "GET", "/v1/watch" }, agent_h_watch, true, 0 },
	{ { "GET", "/v1/archive" }, agent_h_archive_get, true, 0 },
	/* A streamed body of any size (extracted as it arrives). */
	{ { "PUT", "/v1/archive" }, agent_h_archive_put, true, 0,
	  agent_archive_upload },
	/* A repository: streamed like an archive, then the index refreshed. */
	{ { "PUT", "/v1/repo/seed" }, agent_h_repo_seed, true, 0,
	  agent_repo_seed_upload },
	{ { "GET", "/v1/repo/state" }, agent_h_repo_state, true, 0 },
	{ { "POST", "/v1/repo/objects" }, agent_h_repo_objects, true, JSON_BODY },
	{ { "POST", "/v1/exec" }, agent_h_exec_start, true, JSON_BODY },
	{ { "GET", "/v1/exec/*/output" }, agent_h_exec_output, true, 0 },
	{ { "POST", "/v1/exec/*/stdin" }, agent_h_exec_stdin, true, DATA_BODY },
	{ { "POST", "/v1/exec/*/resize" }, agent_h_exec_resize, true, JSON_BODY },
	{ { "POST", "/v1/exec/*/signal" }, agent_h_exec_signal, true, JSON_BODY },
	{ { "GET", "/v1/exec/*" }, agent_h_exec_status, true, 0 },
	{ { "DELETE", "/v1/exec/*" }, agent_h_exec_delete, true, 0 },
};

static const struct sbx_httpd_table table = {
	.routes = routes,
	.n = sizeof(routes) / sizeof(routes[0]),
	.stride = sizeof(routes[0]),
	/* A reverse proxy may prefix anything, including a "/v1/" of its
	 * own (the Kubernetes API server's "/api/v1/namespaces/..."). */
	.anchor = "/v1/",
	.flags = SBX_HTTPD_ROUTE_SLASH,
};

int agent_route_find(const struct agent_route **route_out, char **id_out,
		     const char *method, const char *path)
{
	size_t i;
	int rc;

	*route_out = NULL;
	rc = sbx_httpd_route_find(&i, id_out, &table, method, path);
	if (rc == 0)
		*route_out = &routes[i];
	return rc;
}

/* ---- health and info ------------------------------------------------------ */

int agent_h_health(struct agent_req *r)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddBoolToObject(o, "ok", 1);
	cJSON_AddStringToObject(o, "version", SBX_VERSION);
	cJSON_AddNumberToObject(o, "protocol", SBX_PROTO_VERSION);
	return agent_reply_json(r, 200, o);
}

int agent_h_info(struct agent_req *r)
{
	static const char *const caps[] = {
		"fs",  "bulk",  "bulk_files", "batch", "exec",
		"pty", "xattr", "archive",    "repo",  "alias",
	};
	cJSON *o = cJSON_CreateObject();
	cJSON *l = cJSON_CreateObject();
	cJSON *c;

	cJSON_AddStringToObject(o, "version", SBX_VERSION);
	cJSON_AddNumberToObject(o, "protocol", SBX_PROTO_VERSION);
	cJSON_AddStringToObject(o, "root", r->a->root_path);
	{
		/* The root's attributes: a client that opens a sandbox needs
		 * them, and gets them without another round trip. */
		struct stat st;

		if (fstat(r->a->root_fd, &st) == 0)
			cJSON_AddItemToObject(o, "root_st",
					      sbx_proto_stat_to_json(&st));
	}
	cJSON_AddStringToObject(o, "boot_id", r->a->boot_id);
	c = cJSON_AddArrayToObject(o, "capabilities");
	for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
		cJSON_AddItemToArray(c, cJSON_CreateString(caps[i]));
	/* Without inotify (limit reached, no permission) there is no change
	 * stream: clients fall back to short cache timeouts. */
	if (agent_watch_enabled(r->a))
		cJSON_AddItemToArray(c, cJSON_CreateString("watch"));
	/*
	 * Every change made before this request has a sequence number at
	 * or below it (a barrier: clients wait for the stream to reach it,
	 * premote_watch_sync).  Without the inotify queue drained first, a
	 * rename done just before was not among them (churn test: a push
	 * that met the renamed path asked again before the rename's events).
	 */
	cJSON_AddNumberToObject(o, "watch_seq",
				(double)agent_watch_sync_seq(r->a));
	cJSON_AddNumberToObject(l, "max_headers", SBX_PROTO_MAX_HEADERS);
	cJSON_AddNumberToObject(l, "max_json_body", SBX_PROTO_MAX_JSON_BODY);
	cJSON_AddNumberToObject(l, "max_write_body", SBX_PROTO_MAX_WRITE_BODY);
	cJSON_AddNumberToObject(l, "max_read", SBX_PROTO_MAX_WRITE_BODY);
	cJSON_AddNumberToObject(l, "max_batch", SBX_PROTO_MAX_BATCH);
	cJSON_AddNumberToObject(l, "max_frame_json", SBX_PROTO_MAX_FRAME_JSON);
	cJSON_AddNumberToObject(l, "max_frame_data", SBX_PROTO_MAX_FRAME_DATA);
	cJSON_AddItemToObject(o, "limits", l);
	return agent_reply_json(r, 200, o);
}
