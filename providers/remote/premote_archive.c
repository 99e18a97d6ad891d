/*
 * Archive transfers (docs/protocol.md, "Archive"): GET /v1/archive into a
 * descriptor and PUT /v1/archive from one, streamed by premote_http.c
 * (out_to_fd / body_from_fd), so a multi-GB tree never sits in memory.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/proto.h"

#include "premote_i.h"

/*
 * Long transfers: no bound on the whole request, but one on silence (the
 * configured timeout, at least 30 s, as a large file's extraction on the
 * agent may keep the upload waiting for a while).
 */
static long stall_s(struct premote_http *h)
{
	long s = (premote_http_timeout_ms(h) + 999) / 1000;

	return s < 30 ? 30 : s;
}

int premote_archive_get(struct premote_http *h, const char *path, int out_fd)
{
	struct premote_req req = {
		.method = "GET", .route = "/v1/archive", .cancel_fd = -1,
		.timeout_ms = -1, .out_to_fd = true, .out_fd = out_fd,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	int rc;

	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", path ? path : "");
	req.query = sbx_buf_ptr(&q);
	req.low_speed_s = stall_s(h);
	premote_resp_init(&resp);
	rc = premote_http_do(h, &req, &resp);
	if (rc < 0)
		sbx_error_prefix(rc, "archive of /%s", path ? path : "");
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	return rc;
}

int premote_archive_put(struct premote_http *h, const char *path, int in_fd,
			bool replace, uint64_t *entries)
{
	struct premote_req req = {
		.method = "PUT", .route = "/v1/archive", .cancel_fd = -1,
		.timeout_ms = -1, .body_from_fd = true, .body_fd = in_fd,
		.content_type = SBX_CT_OCTET,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	cJSON *j = NULL, *n;
	int rc;

	if (entries)
		*entries = 0;
	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", path ? path : "");
	if (replace)
		premote_q_str(&q, "replace", "1");
	req.query = sbx_buf_ptr(&q);
	req.low_speed_s = stall_s(h);
	premote_resp_init(&resp);
	rc = premote_http_do(h, &req, &resp);
	if (rc < 0) {
		sbx_error_prefix(rc, "restore of /%s", path ? path : "");
		goto out;
	}
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
				  sbx_buf_len(&resp.body));
	n = cJSON_GetObjectItemCaseSensitive(j, "entries");
	if (!cJSON_IsNumber(n) || n->valuedouble < 0) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "restore of /%s: the agent's answer has no "
				   "\"entries\"",
				   path ? path : "");
		goto out;
	}
	if (entries)
		*entries = (uint64_t)n->valuedouble;
out:
	cJSON_Delete(j);
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	return rc;
}
