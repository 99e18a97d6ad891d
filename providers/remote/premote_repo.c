/*
 * The repository endpoints of the agent (docs/protocol.md, "Repository"):
 * the remote data plane's repo_seed, repo_state and repo_objects, used by
 * `sbx up --repo` and `sbx pull` (cli/repo_*.c) for the remote,
 * kubernetes and modal providers alike.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "premote_i.h"

/* Names per objects request: the JSON body must stay under 1 MiB. */
#define NAMES_PER_REQUEST 16384

/* Transfers: bounded by silence, not in total (as archives). */
static long stall_s(struct premote_http *h)
{
	long s = (premote_http_timeout_ms(h) + 999) / 1000;

	return s < 30 ? 30 : s;
}

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsNumber(v) && v->valuedouble > 0 ? v->valuedouble : 0;
}

int premote_repo_seed(struct sbx_sandbox *sb, const char *path, int tar_fd,
		      struct sbx_repo_seed_result *out)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	struct premote_req req = {
		.method = "PUT", .route = "/v1/repo/seed", .cancel_fd = -1,
		.timeout_ms = -1, .body_from_fd = true, .body_fd = tar_fd,
		.content_type = SBX_CT_OCTET,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	cJSON *j = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", path ? path : "");
	req.query = sbx_buf_ptr(&q);
	req.low_speed_s = stall_s(s->http);
	premote_resp_init(&resp);
	rc = premote_http_do(s->http, &req, &resp);
	if (rc == -ENOENT && strstr(sbx_error_last()->msg, "no such route")) {
		rc = sbx_error_set(SBX_ERR_REMOTE, -ENOSYS,
				   "the agent is too old to receive a "
				   "repository (no /v1/repo/seed); update "
				   "sbx-agent");
	}
	if (rc < 0)
		goto out;
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
				  sbx_buf_len(&resp.body));
	if (!cJSON_IsObject(j)) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "repo/seed: the agent's answer is not a "
				   "JSON object");
		goto out;
	}
	out->entries = (uint64_t)num(j, "entries");
	out->bytes = (uint64_t)num(j, "bytes");
	out->index_entries = (uint64_t)num(j, "index_entries");
	out->index_refreshed = (uint64_t)num(j, "index_refreshed");
out:
	cJSON_Delete(j);
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	return rc;
}

static char *str_or_null(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);

	return cJSON_IsString(v) ? sbx_xstrdup(v->valuestring) : NULL;
}

int premote_repo_state(struct sbx_sandbox *sb, const char *path,
		       const char *ref, struct sbx_repo_state *out)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	const cJSON *loose, *packs, *it;
	struct sbx_buf q;
	cJSON *j = NULL;
	size_t n;
	int rc;

	memset(out, 0, sizeof(*out));
	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", path ? path : "");
	if (ref)
		premote_q_str(&q, "ref", ref);
	rc = premote_http_json(s->http, "GET", "/v1/repo/state",
			       sbx_buf_ptr(&q), NULL, true, &j);
	sbx_buf_fini(&q);
	if (rc < 0)
		return rc;
	loose = cJSON_GetObjectItemCaseSensitive(j, "loose");
	packs = cJSON_GetObjectItemCaseSensitive(j, "packs");
	if (!cJSON_IsArray(loose) || !cJSON_IsArray(packs)) {
		cJSON_Delete(j);
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "repo/state: the answer lacks \"loose\" "
				     "or \"packs\"");
	}
	out->head = str_or_null(j, "head");
	out->oid = str_or_null(j, "oid");
	out->shallow = sbx_json_bool(j, "shallow", false);
	n = (size_t)cJSON_GetArraySize(loose);
	out->loose = sbx_xcalloc(n + 1, sizeof(char *));
	cJSON_ArrayForEach(it, loose)
		if (cJSON_IsString(it) && strlen(it->valuestring) == 40)
			out->loose[out->nloose++] =
				sbx_xstrdup(it->valuestring);
	n = (size_t)cJSON_GetArraySize(packs);
	out->packs = sbx_xcalloc(n + 1, sizeof(*out->packs));
	cJSON_ArrayForEach(it, packs)
	{
		struct sbx_repo_pack *p = &out->packs[out->npacks];

		p->name = str_or_null(it, "name");
		if (!p->name)
			continue;
		p->size = (uint64_t)num(it, "size");
		p->idx_size = (uint64_t)num(it, "idx_size");
		p->keep = str_or_null(it, "keep");
		out->npacks++;
	}
	cJSON_Delete(j);
	return 0;
}

struct objs_ctx {
	sbx_repo_object_cb cb;
	void *payload;
};

static int on_frame(const cJSON *hdr, const void *data, size_t len,
		    void *payload)
{
	struct objs_ctx *c = payload;
	const cJSON *name = cJSON_GetObjectItemCaseSensitive(hdr, "name");
	const cJSON *err = cJSON_GetObjectItemCaseSensitive(hdr, "error");

	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hdr, "end")))
		return 0;
	if (!cJSON_IsString(name))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "repo/objects: a frame without \"name\"");
	if (err) {
		int rc = sbx_proto_error_from_json(hdr, name->valuestring);

		return c->cb(name->valuestring, 0, 0, NULL, 0,
			     rc < 0 ? rc : -EIO, c->payload);
	}
	return c->cb(name->valuestring, (uint64_t)num(hdr, "size"),
		     (uint64_t)num(hdr, "offset"), data, len, 0, c->payload);
}

int premote_repo_objects(struct sbx_sandbox *sb, const char *path,
			 const char *const *names, size_t n,
			 sbx_repo_object_cb cb, void *payload)
{
	struct premote_sandbox *s = PREMOTE_SB(sb);
	struct objs_ctx c = { .cb = cb, .payload = payload };
	int rc = 0;

	for (size_t at = 0; at < n && rc == 0; at += NAMES_PER_REQUEST) {
		size_t k = n - at < NAMES_PER_REQUEST ? n - at
						      : NAMES_PER_REQUEST;
		struct premote_req req = {
			.method = "POST", .route = "/v1/repo/objects",
			.cancel_fd = -1, .timeout_ms = -1,
			.content_type = SBX_CT_JSON, .frames = on_frame,
			.payload = &c,
		};
		struct premote_resp resp;
		cJSON *body = cJSON_CreateObject();
		cJSON *arr = cJSON_AddArrayToObject(body, "names");
		struct sbx_buf q;
		char *text;

		for (size_t i = 0; i < k; i++)
			cJSON_AddItemToArray(arr,
					     cJSON_CreateString(names[at + i]));
		text = sbx_json_print(body, false);
		cJSON_Delete(body);
		sbx_buf_init(&q, PREMOTE_QUERY_CAP);
		premote_q_str(&q, "path", path ? path : "");
		req.query = sbx_buf_ptr(&q);
		req.body = text;
		req.body_len = strlen(text);
		req.low_speed_s = stall_s(s->http);
		premote_resp_init(&resp);
		rc = premote_http_do(s->http, &req, &resp);
		premote_resp_fini(&resp);
		sbx_buf_fini(&q);
		free(text);
	}
	return rc;
}
