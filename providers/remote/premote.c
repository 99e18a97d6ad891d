/*
 * The remote provider: any running sbx-agent reached by URL.
 *
 * There is nothing to create or delete: the agent belongs to whoever
 * started it.  create/get/open "probe" it (GET /v1/health without the
 * token, then GET /v1/info with it) and turn every way that can fail into
 * a message that says what to do.  Sessions live in the state store; list
 * reports nothing of its own.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/token.h"
#include "sbx/xmalloc.h"

#include "../backends.h"
#include "premote_i.h"

struct premote_provider {
	struct sbx_provider base;
	struct premote_config cfg;
};

#define RP(p) ((struct premote_provider *)(p))

/* ---- configuration -------------------------------------------------------- */

void premote_config_fini(struct premote_config *c)
{
	if (!c)
		return;
	free(c->url);
	free(c->token_file);
	free(c->ca_file);
	if (c->token) {
		memset(c->token, 0, strlen(c->token));
		free(c->token);
	}
	if (c->auth && c->auth->release)
		c->auth->release(c->auth->ctx);
	free(c->auth);
	free(c->peer);
	memset(c, 0, sizeof(*c));
}

static int cfg_seconds(long *out_ms, const cJSON *sec, const char *key,
		       long dflt_s)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, key);

	*out_ms = dflt_s * 1000L;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) ||
	    v->valuedouble > 86400.0)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: \"%s\" must be a "
				     "number of seconds between 0 and 86400 "
				     "(got %s)", key,
				     cJSON_IsNumber(v)
					     ? "an out-of-range number"
					     : sbx_json_type_name(v));
	*out_ms = (long)(v->valuedouble * 1000.0);
	if (*out_ms < 1)
		*out_ms = 1;
	return 0;
}

int premote_config_parse(struct premote_config *out, const cJSON *sec)
{
	const char *url = NULL, *tf = NULL, *ca = NULL;
	const char *where = "remote provider";
	struct premote_config c;
	int rc;

	memset(out, 0, sizeof(*out));
	memset(&c, 0, sizeof(c));
	if (sec && !cJSON_IsObject(sec))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: the \"remote\" section "
				     "must be an object");
	if ((rc = sbx_json_get_string(&url, sec, "url", where)) < 0 ||
	    (rc = sbx_json_get_string(&tf, sec, "token_file", where)) < 0 ||
	    (rc = sbx_json_get_string(&ca, sec, "ca_file", where)) < 0 ||
	    (rc = sbx_json_get_bool(&c.insecure, sec, "insecure", false,
				    where)) < 0) {
		/* Type errors come as SBX_ERR_JSON; these are configuration. */
		char msg[sizeof(sbx_error_last()->msg)];

		memcpy(msg, sbx_error_last()->msg, sizeof(msg));
		return sbx_error_set(SBX_ERR_CONFIG, rc, "%s", msg);
	}
	if (!url || !*url)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: \"url\" is not set: "
				     "pass --url http://HOST:PORT or set "
				     "remote.url in the configuration");
	if (!tf || !*tf)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: \"token_file\" is not "
				     "set: pass --token-file FILE (the file "
				     "given to sbx-agent --token-file) or set "
				     "remote.token_file");
	if ((rc = cfg_seconds(&c.timeout_ms, sec, "timeout",
			      PREMOTE_DEFAULT_TIMEOUT_S)) < 0 ||
	    (rc = cfg_seconds(&c.connect_timeout_ms, sec, "connect_timeout",
			      PREMOTE_DEFAULT_CONNECT_TIMEOUT_S)) < 0)
		return rc;
	if (c.connect_timeout_ms > c.timeout_ms)
		c.connect_timeout_ms = c.timeout_ms;
	if ((rc = premote_url_normalise(&c.url, url)) < 0)
		goto fail;
	if ((rc = sbx_path_expand_user(&c.token_file, tf)) < 0) {
		rc = sbx_error_prefix(rc, "remote provider: \"token_file\"");
		goto fail;
	}
	if (ca && *ca && (rc = sbx_path_expand_user(&c.ca_file, ca)) < 0) {
		rc = sbx_error_prefix(rc, "remote provider: \"ca_file\"");
		goto fail;
	}
	*out = c;
	return 0;
fail:
	premote_config_fini(&c);
	return rc;
}

int premote_token_read(char **out, const char *path)
{
	const struct sbx_error *e;
	int rc;

	*out = NULL;
	rc = sbx_token_file_read(out, path);
	if (rc == 0)
		return 0;
	e = sbx_error_last();
	if (e->klass == SBX_ERR_OS) {
		const char *why = rc == -ENOENT ? "it does not exist"
				  : rc == -EACCES ? "permission denied"
						 : strerror(-rc);

		return sbx_error_set(SBX_ERR_CONFIG, rc,
				     "cannot read the agent token from %s: "
				     "%s (use the file given to sbx-agent "
				     "--token-file)", path, why);
	}
	/* Empty, too open (chmod 600), control characters, too big: the
	 * message names the file and says what to do. */
	return rc;
}

/* ---- info ----------------------------------------------------------------- */

void premote_info_fini(struct premote_info *i)
{
	if (!i)
		return;
	free(i->version);
	free(i->root);
	free(i->boot_id);
	memset(i, 0, sizeof(*i));
}

int premote_info_parse(struct premote_info *out, const cJSON *j)
{
	const cJSON *root = cJSON_GetObjectItemCaseSensitive(j, "root");
	const cJSON *boot = cJSON_GetObjectItemCaseSensitive(j, "boot_id");
	const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
	const cJSON *proto = cJSON_GetObjectItemCaseSensitive(j, "protocol");
	const cJSON *seq = cJSON_GetObjectItemCaseSensitive(j, "watch_seq");
	const cJSON *caps = cJSON_GetObjectItemCaseSensitive(j, "capabilities");
	const cJSON *c;

	memset(out, 0, sizeof(*out));
	if (!cJSON_IsString(root) || root->valuestring[0] != '/')
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "/v1/info: \"root\" must be an absolute "
				     "path");
	if (!cJSON_IsString(boot) || !*boot->valuestring)
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "/v1/info: \"boot_id\" missing");
	if (!cJSON_IsNumber(proto))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "/v1/info: \"protocol\" missing");
	if (seq && (!cJSON_IsNumber(seq) || seq->valuedouble < 0))
		return sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				     "/v1/info: bad \"watch_seq\"");
	out->root = sbx_xstrdup(root->valuestring);
	out->boot_id = sbx_xstrdup(boot->valuestring);
	out->version = sbx_xstrdup(cJSON_IsString(ver) ? ver->valuestring
						       : "unknown");
	out->protocol = (long)proto->valuedouble;
	out->watch_seq = seq ? (uint64_t)seq->valuedouble : 0;
	out->has_root_st =
		sbx_proto_stat_from_json(
			cJSON_GetObjectItemCaseSensitive(j, "root_st"),
			&out->root_st) == 0;
	if (!out->has_root_st)
		sbx_error_clear();
	cJSON_ArrayForEach(c, caps)
	{
		if (!cJSON_IsString(c))
			continue;
		if (!strcmp(c->valuestring, "watch"))
			out->cap_watch = true;
		else if (!strcmp(c->valuestring, "exec"))
			out->cap_exec = true;
		else if (!strcmp(c->valuestring, "bulk"))
			out->cap_bulk = true;
		else if (!strcmp(c->valuestring, "bulk_files"))
			out->cap_bulk_files = true;
		else if (!strcmp(c->valuestring, "xattr"))
			out->cap_xattr = true;
		else if (!strcmp(c->valuestring, "pty"))
			out->cap_pty = true;
	}
	return 0;
}

/* ---- probe ---------------------------------------------------------------- */

/*
 * Reword the transport error just set ("GET URL: <curl message>") as
 * "cannot reach sbx-agent at URL: <curl message>; is it running?",
 * keeping its errno and detail.
 */
static int unreachable(int rc, const struct premote_config *cfg)
{
	const struct sbx_error *e = sbx_error_last();
	char msg[sizeof(e->msg)];
	const char *m = strstr(e->msg, ": ");

	/* Said so already by the transport (no "is it running?" twice). */
	if (strstr(e->msg, "cannot reach sbx-agent"))
		return rc;
	snprintf(msg, sizeof(msg), "%s", m ? m + 2 : e->msg);
	return sbx_error_setd(SBX_ERR_HTTP, rc, e->detail,
			      "cannot reach sbx-agent at %s: %s; is it "
			      "running?", cfg->url, msg);
}

/*
 * Reach the agent: token, health, info.  On success *http_out and *info
 * belong to the caller.  Every failure says what to do.
 */
int premote_probe(const struct premote_config *cfg,
		  struct premote_http **http_out, struct premote_info *info)
{
	struct premote_http *h = NULL;
	struct premote_req req = {
		.method = "GET", .route = "/v1/health", .no_token = true,
		.idempotent = true, .cancel_fd = -1,
	};
	struct premote_resp resp;
	char *token = NULL;
	cJSON *j = NULL;
	const cJSON *p;
	int rc = 0;

	*http_out = NULL;
	memset(info, 0, sizeof(*info));
	premote_resp_init(&resp);
	if (cfg->token)
		token = sbx_xstrdup(cfg->token);
	else
		rc = premote_token_read(&token, cfg->token_file);
	if (rc < 0)
		goto out;
	rc = premote_http_new(&h, cfg, token);
	if (rc < 0)
		goto out;

	/*
	 * One round trip when all is well: /v1/info carries the protocol
	 * and proves the token.  Anything else takes the long way below
	 * (health first), whose errors say what is wrong.
	 */
	rc = premote_http_json(h, "GET", "/v1/info", NULL, NULL, true, &j);
	if (rc == 0 && premote_info_parse(info, j) == 0) {
		if (info->protocol == SBX_PROTO_VERSION) {
			*http_out = h;
			h = NULL;
			goto out;
		}
		premote_info_fini(info);
	}
	if (rc < 0 && sbx_error_last()->klass == SBX_ERR_HTTP &&
	    rc != -EIO && premote_errno_is_transport(rc)) {
		/* Nobody there (or nobody answering): asking again for
		 * /v1/health would only wait as long once more. */
		rc = unreachable(rc, cfg);
		goto out;
	}
	cJSON_Delete(j);
	j = NULL;
	sbx_error_clear();
	rc = 0;

	rc = premote_http_do(h, &req, &resp);
	if (rc < 0) {
		const struct sbx_error *e = sbx_error_last();

		if (e->klass == SBX_ERR_HTTP && !resp.status &&
		    strncmp(e->msg, "cannot reach", 12))
			rc = unreachable(rc, cfg);
		goto out;
	}
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
				  sbx_buf_len(&resp.body));
	p = cJSON_GetObjectItemCaseSensitive(j, "protocol");
	if (!cJSON_IsNumber(p)) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "%s/v1/health did not answer like sbx-agent "
				   "(no \"protocol\"); is the URL right?",
				   cfg->url);
		goto out;
	}
	if ((long)p->valuedouble != SBX_PROTO_VERSION) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTONOSUPPORT,
				   "the agent at %s speaks protocol %ld, this "
				   "sbx speaks %d: use matching versions of "
				   "sbx and sbx-agent", cfg->url,
				   (long)p->valuedouble, SBX_PROTO_VERSION);
		goto out;
	}
	cJSON_Delete(j);
	j = NULL;

	rc = premote_http_json(h, "GET", "/v1/info", NULL, NULL, true, &j);
	if (rc < 0) {
		if (sbx_error_last()->klass == SBX_ERR_REMOTE && rc == -EACCES)
			rc = sbx_error_set(SBX_ERR_CONFIG, -EACCES,
					   "the agent at %s refused the token "
					   "%s%s", cfg->url,
					   cfg->token_file ? "from " : "",
					   cfg->token_file
						   ? cfg->token_file
						   : "sbx gave it when it was "
						     "started (was the sandbox "
						     "replaced?)");
		else
			rc = sbx_error_prefix(rc, "sbx-agent at %s", cfg->url);
		goto out;
	}
	rc = premote_info_parse(info, j);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "sbx-agent at %s", cfg->url);
		goto out;
	}
	*http_out = h;
	h = NULL;
out:
	if (token) {
		memset(token, 0, strlen(token));
		free(token);
	}
	cJSON_Delete(j);
	premote_resp_fini(&resp);
	premote_http_free(h);
	return rc;
}

int premote_agent_ping(const struct premote_config *cfg)
{
	struct premote_http *h = NULL;
	struct premote_info info;
	int rc = premote_probe(cfg, &h, &info);

	if (rc == 0) {
		premote_info_fini(&info);
		premote_http_free(h);
	}
	return rc;
}

int premote_sandbox_connect(struct sbx_sandbox **out, const char *session,
			    struct premote_config *cfg)
{
	struct premote_http *h = NULL;
	struct premote_info info;
	int rc;

	*out = NULL;
	rc = premote_probe(cfg, &h, &info);
	if (rc < 0) {
		premote_config_fini(cfg);
		return rc;
	}
	return premote_sandbox_open(out, session, cfg, h, &info);
}

static void fill_info(struct sbx_sandbox_info *out, const char *session,
		      const struct premote_config *cfg,
		      const struct premote_info *i)
{
	memset(out, 0, sizeof(*out));
	out->session = sbx_xstrdup(session);
	out->provider = sbx_xstrdup("remote");
	out->sandbox_id = sbx_xstrdup(cfg->url);
	out->workdir = i && i->root ? sbx_xstrdup(i->root) : NULL;
	out->isolation = sbx_xstrdup("remote");
	out->remote = true;
	out->state = i ? SBX_STATE_READY : SBX_STATE_ERROR;
	out->created_at = 0;
	out->extra = cJSON_CreateObject();
	if (!out->extra)
		abort();
	sbx_json_set_str(out->extra, "url", cfg->url);
	if (i) {
		sbx_json_set_str(out->extra, "agent_version", i->version);
		sbx_json_set_str(out->extra, "boot_id", i->boot_id);
	}
}

/* ---- control plane ops ---------------------------------------------------- */

static int premote_create(struct sbx_provider *p,
			  const struct sbx_create_opts *o,
			  struct sbx_sandbox_info *out)
{
	struct premote_http *h = NULL;
	struct premote_info info;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = premote_probe(&RP(p)->cfg, &h, &info);
	if (rc < 0)
		return rc;
	fill_info(out, o->session, &RP(p)->cfg, &info);
	out->created_at = time(NULL);
	premote_info_fini(&info);
	premote_http_free(h);
	return 0;
}

/* READY when the agent answers; ERROR with the reason otherwise. */
static int premote_get(struct sbx_provider *p, const char *session,
		       struct sbx_sandbox_info *out)
{
	struct premote_http *h = NULL;
	struct premote_info info;
	int rc;

	rc = premote_probe(&RP(p)->cfg, &h, &info);
	if (rc < 0) {
		char msg[sizeof(sbx_error_last()->msg)];

		memcpy(msg, sbx_error_last()->msg, sizeof(msg));
		sbx_error_clear();
		fill_info(out, session, &RP(p)->cfg, NULL);
		sbx_json_set_str(out->extra, "error", msg);
		return 0;
	}
	fill_info(out, session, &RP(p)->cfg, &info);
	premote_info_fini(&info);
	premote_http_free(h);
	return 0;
}

static int premote_list(struct sbx_provider *p, sbx_list_cb cb, void *payload)
{
	return 0; /* sessions are in the state store */
}

static int premote_terminate(struct sbx_provider *p, const char *session,
			     unsigned flags)
{
	return 0; /* the agent belongs to whoever started it */
}

static int no_snapshots(const struct sbx_provider *p)
{
	return sbx_error_set(SBX_ERR_CONFIG, -ENOTSUP,
			     "the remote provider cannot take or restore "
			     "snapshots: it mounts an agent (%s) that sbx "
			     "does not manage; commit inside the sandbox, or "
			     "use the kubernetes or modal provider",
			     RP(p)->cfg.url);
}

static int premote_snapshot(struct sbx_provider *p, const char *session,
			    const char *message, char **id_out)
{
	*id_out = NULL;
	return no_snapshots(p);
}

static int premote_snapshots(struct sbx_provider *p, const char *session,
			     sbx_snapshot_cb cb, void *payload)
{
	return no_snapshots(p);
}

static int premote_restore(struct sbx_provider *p, const char *session,
			   const char *id, char **saved_out)
{
	if (saved_out)
		*saved_out = NULL;
	return no_snapshots(p);
}

static int premote_open(struct sbx_provider *p, const char *session,
			struct sbx_sandbox **out)
{
	struct premote_config cfg;
	int rc;

	*out = NULL;
	/* The sandbox gets its own copy of the configuration. */
	rc = premote_config_parse(&cfg, p->config);
	if (rc < 0)
		return rc;
	return premote_sandbox_connect(out, session, &cfg);
}

static void premote_free(struct sbx_provider *p)
{
	if (!p)
		return;
	premote_config_fini(&RP(p)->cfg);
	cJSON_Delete(p->config);
	free(p);
}

static const struct sbx_provider_ops premote_ops = {
	PBACKEND_OPS(premote, "remote"),
	.free = premote_free,
};

int premote_provider_new(struct sbx_provider **out, const cJSON *config)
{
	struct premote_provider *rp;
	struct premote_config cfg;
	int rc;

	*out = NULL;
	rc = premote_config_parse(&cfg, config);
	if (rc < 0)
		return rc;
	rp = pbackend_new(sizeof(*rp), &premote_ops, config);
	rp->cfg = cfg;
	*out = &rp->base;
	return 0;
}
