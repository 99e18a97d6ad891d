/*
 * The modal provider: configuration, the pin, the provider ops; see
 * pmodal_i.h and docs/providers.md.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "pcommon.h"
#include "../backends.h"
#include "pmodal_i.h"

/* ---- configuration ---------------------------------------------------------- */

int pmodal_cfg_parse(struct mcfg *c, const cJSON *sec)
{
	double t, idle, port, ready, req, mem;
	int rc;

	memset(c, 0, sizeof(*c));
	if ((rc = pcommon_cfg_object(SECTION, sec)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "image", &c->image,
				  "python:3.11")) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "app", &c->app, "sbx")) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "environment",
				  &c->environment, NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "workdir", &c->workdir,
				  "/workspace")) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "agent_bundle",
				  &c->agent_bundle, NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "ca_file", &c->ca_file,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "timeout", &t, 86400, 60,
				  86400)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "idle_timeout", &idle, 0, 0,
				  86400)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "port", &port, 7070, 1,
				  65535)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "ready_timeout", &ready, 300, 1,
				  3600)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "request_timeout", &req, 30, 1,
				  3600)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "cpu", &c->cpu, 0, 0,
				  512)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "memory", &mem, 0, 0,
				  4 << 20)) < 0 ||
	    (rc = pcommon_cfg_env(SECTION, sec, "env", &c->env)) < 0)
		return rc;
	if (c->workdir[0] != '/')
		return pcommon_cfg_bad(SECTION, "workdir", "an absolute path");
	c->timeout_s = (long)t;
	c->idle_timeout_s = (long)idle;
	c->port = (long)port;
	c->ready_timeout_s = (long)ready;
	c->request_s = (long)req;
	c->memory_mb = (long)mem;
	return 0;
}

/* ---- identity and the pin ---------------------------------------------------- */

void pmodal_pin_fini(struct pin *p)
{
	free(p->sandbox_id);
	free(p->app_id);
	free(p->env);
	pcommon_wipe_free(p->token);
	memset(p, 0, sizeof(*p));
}

/* 0 with p->sandbox_id NULL when there is no pin. */
static int pin_load(struct pin *p, const char *session)
{
	cJSON *j = NULL;
	int rc;

	memset(p, 0, sizeof(*p));
	rc = pcommon_pin_load(&j, SECTION, session);
	if (rc == 0 && j) {
		const char *sid = sbx_json_str(j, "sandbox_id");
		const char *t = sbx_json_str(j, "token");

		if (!sid || !t) {
			rc = sbx_error_set(SBX_ERR_JSON, -EINVAL,
					   "the pin of session %s has no "
					   "\"sandbox_id\"/\"token\"", session);
		} else {
			p->sandbox_id = sbx_xstrdup(sid);
			p->token = sbx_xstrdup(t);
			p->app_id = sbx_xstrdup(sbx_json_str(j, "app_id")
							? sbx_json_str(j, "app_id")
							: "");
			p->env = sbx_xstrdup(sbx_json_str(j, "environment")
						     ? sbx_json_str(j, "environment")
						     : "");
		}
		/* The token was in the tree: wipe it before freeing. */
		{
			cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "token");

			if (cJSON_IsString(tok))
				explicit_bzero(tok->valuestring,
					       strlen(tok->valuestring));
		}
	}
	cJSON_Delete(j);
	return rc;
}

static int pin_save(const char *session, const struct pin *p)
{
	cJSON *j = cJSON_CreateObject();
	cJSON *tok;
	int rc;

	if (!j)
		abort();
	sbx_json_set_str(j, "sandbox_id", p->sandbox_id);
	sbx_json_set_str(j, "app_id", p->app_id);
	sbx_json_set_str(j, "environment", p->env);
	sbx_json_set_str(j, "token", p->token);
	rc = pcommon_pin_save(SECTION, session, j);
	tok = cJSON_GetObjectItemCaseSensitive(j, "token");
	if (cJSON_IsString(tok))
		explicit_bzero(tok->valuestring, strlen(tok->valuestring));
	cJSON_Delete(j);
	return rc;
}

static void pin_remove(const char *session)
{
	pcommon_pin_remove(SECTION, session);
}

/* ---- the provider ------------------------------------------------------------ */

struct pmodal_provider {
	struct sbx_provider base;
	struct mcfg cfg; /* strings borrowed from base.config */
};

#define MP(p) ((struct pmodal_provider *)(p))

void pmodal_fill_info(struct sbx_sandbox_info *out, const char *session,
		      const struct mcfg *c, const char *sandbox_id,
		      const GResult *finished, const char *env, bool gone)
{
	memset(out, 0, sizeof(*out));
	out->session = sbx_xstrdup(session);
	out->provider = sbx_xstrdup("modal");
	out->sandbox_id = sbx_xstrdup(sandbox_id);
	out->workdir = sbx_xstrdup(c->workdir);
	out->isolation = sbx_xstrdup("modal");
	out->remote = true;
	out->state = SBX_STATE_READY;
	out->extra = cJSON_CreateObject();
	if (!out->extra)
		abort();
	sbx_json_set_str(out->extra, "sandbox_id", sandbox_id);
	sbx_json_set_str(out->extra, "environment", env);
	sbx_json_set_str(out->extra, "app", c->app);
	if (finished) {
		char *m = sbx_xasprintf("the Modal sandbox ended (%s%s%s)",
					pmodal_result_name(finished),
					finished->exception &&
							*finished->exception
						? ": "
						: "",
					finished->exception
						? finished->exception
						: "");

		pcommon_info_failed(out, gone ? "NotFound"
					      : pmodal_result_name(finished),
				    gone, m);
		free(m);
	}
}

static int pmodal_create(struct sbx_provider *p,
			 const struct sbx_create_opts *o,
			 struct sbx_sandbox_info *out)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	struct pin pin = {0};
	char *app_id = NULL, *image_id = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = pin_load(&pin, o->session);
	if (rc == 0 && pin.sandbox_id)
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "session %s already has Modal sandbox %s",
				   o->session, pin.sandbox_id);
	pmodal_pin_fini(&pin);
	if (rc < 0)
		return rc;
	rc = pmodal_chan_open(&m, &mp->cfg, NULL);
	if (rc < 0)
		return rc;
	rc = pmodal_get_app(&m, &mp->cfg, &app_id);
	if (rc == 0)
		rc = pmodal_build_image(&m, &mp->cfg, app_id, &image_id);
	if (rc == 0)
		rc = pmodal_start_sandbox(&m, &mp->cfg, o->session, app_id,
					  image_id, &pin);
	if (rc == 0) {
		rc = pin_save(o->session, &pin);
		if (rc < 0)
			pmodal_terminate_quietly(&m, pin.sandbox_id);
	}
	if (rc == 0)
		pmodal_fill_info(out, o->session, &mp->cfg, pin.sandbox_id,
				 NULL, m.env, false);
	pmodal_pin_fini(&pin);
	free(app_id);
	free(image_id);
	pmodal_chan_close(&m);
	return rc;
}

/* A session's sandbox as its pin records it, and a channel to reach it. */
struct msess {
	struct mchan m;
	struct pin pin;
};

static void session_close(struct msess *s)
{
	pmodal_pin_fini(&s->pin);
	pmodal_chan_close(&s->m);
}

/* The session's pinned sandbox; -ENOENT (SBX_ERR_NOTFOUND) without a pin. */
static int session_open(struct pmodal_provider *mp, const char *session,
			struct msess *s)
{
	int rc = pin_load(&s->pin, session);

	memset(&s->m, 0, sizeof(s->m));
	if (rc < 0)
		return rc;
	rc = pmodal_chan_open(&s->m, &mp->cfg,
			      s->pin.sandbox_id ? s->pin.env : NULL);
	if (rc == 0 && !s->pin.sandbox_id)
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "no Modal sandbox is recorded for session "
				   "%s", session);
	if (rc < 0)
		session_close(s);
	return rc;
}

/*
 * The result of the session's sandbox when it has ended (*r, caller
 * frees; *gone when it no longer exists at all), else *r NULL.
 */
static int sandbox_state(struct msess *s, GResult **r, bool *gone)
{
	int rc = pmodal_sandbox_result(&s->m, s->pin.sandbox_id, 0, r);

	*gone = rc == -ENOENT;
	if (*gone) {
		*r = sbx_xcalloc(1, sizeof(**r));
		modal__client__generic_result__init(*r);
		(*r)->status =
			MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_TERMINATED;
		(*r)->exception = sbx_xstrdup("it no longer exists");
		sbx_error_clear();
		rc = 0;
	}
	return rc;
}

static int pmodal_get(struct sbx_provider *p, const char *session,
		      struct sbx_sandbox_info *out)
{
	struct pmodal_provider *mp = MP(p);
	struct msess s;
	GResult *r = NULL;
	bool gone;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = session_open(mp, session, &s);
	if (rc < 0)
		return rc;
	rc = sandbox_state(&s, &r, &gone);
	if (rc == 0)
		pmodal_fill_info(out, session, &mp->cfg, s.pin.sandbox_id, r,
				 s.m.env, gone);
	FREE_MSG(r);
	session_close(&s);
	return rc;
}

/* Every running sandbox tagged with this $SBX_HOME (sbx gc). */
static int pmodal_list(struct sbx_provider *p, sbx_list_cb cb, void *payload)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	char home[17], *app_id = NULL;
	double before = 0;
	int rc;

	rc = pcommon_home_id(home);
	if (rc == 0)
		rc = pmodal_chan_open(&m, &mp->cfg, NULL);
	if (rc < 0)
		return rc;
	rc = pmodal_get_app(&m, &mp->cfg, &app_id);
	while (rc == 0) {
		Modal__Client__SandboxListRequest req =
			MODAL__CLIENT__SANDBOX_LIST_REQUEST__INIT;
		Modal__Client__SandboxListResponse *resp = NULL;
		Modal__Client__SandboxTag tag = MODAL__CLIENT__SANDBOX_TAG__INIT;
		Modal__Client__SandboxTag *tv[1] = {&tag};

		tag.tag_name = TAG_HOME;
		tag.tag_value = home;
		req.app_id = app_id;
		req.environment_name = m.env;
		req.n_tags = 1;
		req.tags = tv;
		req.before_timestamp = before;
		rc = pmodal_call(&m, RPC("SandboxList"), &req,
				 &modal__client__sandbox_list_response__descriptor,
				 &resp, true, 0);
		if (rc < 0)
			break;
		for (size_t i = 0; i < resp->n_sandboxes && rc == 0; i++) {
			const Modal__Client__SandboxInfo *s = resp->sandboxes[i];
			const char *sess = NULL;
			struct sbx_sandbox_info info;

			for (size_t t = 0; t < s->n_tags; t++)
				if (!strcmp(s->tags[t]->tag_name, TAG_SESSION))
					sess = s->tags[t]->tag_value;
			if (!sess)
				continue;
			pmodal_fill_info(&info, sess, &mp->cfg, s->id, NULL,
					 m.env, false);
			rc = cb(&info, payload);
			sbx_sandbox_info_fini(&info);
		}
		if (resp->n_sandboxes == 0 || rc != 0) {
			FREE_MSG(resp);
			break;
		}
		before = resp->sandboxes[resp->n_sandboxes - 1]->created_at;
		FREE_MSG(resp);
	}
	free(app_id);
	pmodal_chan_close(&m);
	return rc < 0 ? rc : 0;
}

struct find_ctx {
	const char *session;
	char *id;
};

static int find_cb(const struct sbx_sandbox_info *info, void *payload)
{
	struct find_ctx *f = payload;

	if (strcmp(info->session, f->session))
		return 0;
	f->id = sbx_xstrdup(info->sandbox_id);
	return 1;
}

/* A sandbox of this home tagged with `session` (gc: no pin). */
static int find_by_tag(struct pmodal_provider *mp, const char *session,
		       char **sandbox_id)
{
	struct find_ctx f = {session, NULL};
	int rc = pmodal_list(&mp->base, find_cb, &f);

	*sandbox_id = f.id;
	return rc;
}

/* Snapshot the session's sandbox (open in *s) into the store. */
static int take_snapshot(struct pmodal_provider *mp, struct msess *s,
			 const char *session, const char *message,
			 char **id_out)
{
	char id[40], *image = NULL;
	time_t now = time(NULL);
	cJSON *f;
	int rc;

	*id_out = NULL;
	rc = pmodal_snapshot_image(&s->m, &mp->cfg, s->pin.sandbox_id, &image);
	if (rc < 0)
		return rc;
	f = cJSON_CreateObject();
	if (!f)
		abort();
	sbx_json_set_str(f, "image_id", image);
	pcommon_snap_new_id(id, now);
	rc = pcommon_snap_record(SECTION, session, id, message, now, f);
	cJSON_Delete(f);
	if (rc == 0)
		*id_out = sbx_xstrdup(id);
	free(image);
	return rc;
}

static int pmodal_snapshot(struct sbx_provider *p, const char *session,
			   const char *message, char **id_out)
{
	struct msess s;
	int rc;

	*id_out = NULL;
	rc = session_open(MP(p), session, &s);
	if (rc == 0) {
		rc = take_snapshot(MP(p), &s, session, message, id_out);
		session_close(&s);
	}
	return rc;
}

static int pmodal_snapshots(struct sbx_provider *p, const char *session,
			    sbx_snapshot_cb cb, void *payload)
{
	return pcommon_snap_list(SECTION, session, cb, payload);
}

/*
 * A Modal filesystem snapshot is an image: restoring starts a new sandbox
 * from it and ends the old one (after saving its state).  The sandbox id
 * changes; `sbx restore` remounts.
 */
static int pmodal_restore(struct sbx_provider *p, const char *session,
			  const char *id, char **saved_out)
{
	struct pmodal_provider *mp = MP(p);
	struct msess s;
	struct pin fresh = {0};
	char *saved = NULL;
	cJSON *j = NULL;
	int rc;

	if (saved_out)
		*saved_out = NULL;
	rc = pcommon_snap_read(&j, SECTION, session, id);
	if (rc < 0)
		return rc;
	if (!sbx_json_str(j, "image_id")) {
		cJSON_Delete(j);
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "snapshot '%s' has no image id", id);
	}
	rc = session_open(mp, session, &s);
	if (rc == 0)
		rc = take_snapshot(mp, &s, session, "before restore", &saved);
	if (rc < 0) {
		session_close(&s);
		cJSON_Delete(j);
		return sbx_error_prefix(rc, "restore refused: could not save "
					"the current state first");
	}
	rc = pmodal_start_sandbox(&s.m, &mp->cfg, session, s.pin.app_id,
				  sbx_json_str(j, "image_id"), &fresh);
	if (rc == 0)
		rc = pin_save(session, &fresh);
	if (rc == 0)
		(void)pmodal_terminate_and_wait(&s.m, s.pin.sandbox_id);
	else if (fresh.sandbox_id)
		pmodal_terminate_quietly(&s.m, fresh.sandbox_id);
	session_close(&s);
	pmodal_pin_fini(&fresh);
	cJSON_Delete(j);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "restore of %s (the state before is "
				      "snapshot %s)", id, saved);
		free(saved);
		return rc;
	}
	if (saved_out)
		*saved_out = saved;
	else
		free(saved);
	return 0;
}

/*
 * Before ending a sandbox, keep its files as a snapshot: 0 when kept, or
 * when there is nothing to keep (it has ended, or is gone: the user is
 * told), else why not.
 */
static int save_before_down(struct pmodal_provider *mp, const char *session)
{
	struct msess s;
	GResult *r = NULL;
	char *saved = NULL;
	bool gone;
	int rc;

	rc = session_open(mp, session, &s);
	if (rc == 0 && sandbox_state(&s, &r, &gone) == 0 && r) {
		/* One that has ended has nothing left to snapshot. */
		char *why;

		if (gone)
			why = sbx_xasprintf("Modal sandbox %s no longer exists",
					    s.pin.sandbox_id);
		else
			why = sbx_xasprintf("Modal sandbox %s ended (%s%s%s)",
					    s.pin.sandbox_id,
					    pmodal_result_name(r),
					    r->exception && *r->exception
						    ? ": "
						    : "",
					    r->exception ? r->exception : "");
		pcommon_report_nothing_saved(session, "the Modal sandbox",
					     why);
		free(why);
		FREE_MSG(r);
		session_close(&s);
		return 0;
	}
	if (rc == 0) {
		/* Whether it ended could not be told: try anyway. */
		sbx_error_clear();
		rc = take_snapshot(mp, &s, session, "before sbx down", &saved);
		session_close(&s);
	}
	if (rc == -ENXIO || rc == -ENOENT) {
		pcommon_report_nothing_saved(session, "the Modal sandbox",
					     sbx_error_last()->msg);
		sbx_error_clear();
		rc = 0;
	} else if (rc == 0) {
		fprintf(stderr, "sbx: saved the files of %s as snapshot %s\n",
			session, saved);
	}
	free(saved);
	return rc;
}

static int pmodal_terminate(struct sbx_provider *p, const char *session,
			    unsigned flags)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	struct pin pin;
	char *tagged = NULL;
	int rc;

	/* The sandbox's files end with it: keep a snapshot unless forced. */
	if (!(flags & SBX_TERMINATE_FORCE) &&
	    (rc = save_before_down(mp, session)) < 0)
		return sbx_error_prefix(rc, "not ending the Modal sandbox of "
					"session %s: could not snapshot it "
					"first (use --force to end it anyway)",
					session);
	rc = pin_load(&pin, session);
	if (rc < 0)
		return rc;
	if (!pin.sandbox_id) {
		rc = find_by_tag(mp, session, &tagged);
		if (rc == 0 && !tagged)
			rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
					   "no Modal sandbox of session %s",
					   session);
	}
	if (rc == 0)
		rc = pmodal_chan_open(&m, &mp->cfg,
				      pin.sandbox_id ? pin.env : NULL);
	if (rc == 0) {
		rc = pmodal_terminate_and_wait(&m, pin.sandbox_id
							   ? pin.sandbox_id
							   : tagged);
		pmodal_chan_close(&m);
	}
	if (rc == 0)
		pin_remove(session);
	free(tagged);
	pmodal_pin_fini(&pin);
	return rc;
}

static int pmodal_open(struct sbx_provider *p, const char *session,
		       struct sbx_sandbox **out)
{
	struct pmodal_provider *mp = MP(p);
	struct premote_config pc;
	struct msess s;
	char *url = NULL;
	int rc;

	*out = NULL;
	rc = session_open(mp, session, &s);
	if (rc < 0)
		return rc;
	rc = pmodal_wait_tunnel(&s.m, &mp->cfg, s.pin.sandbox_id,
				time(NULL) + mp->cfg.request_s, &url, NULL);
	if (rc == 0) {
		pmodal_agent_cfg(&pc, &mp->cfg, url, s.pin.token);
		rc = premote_sandbox_connect(out, session, &pc);
	}
	free(url);
	session_close(&s);
	return rc;
}

static const struct sbx_provider_ops pmodal_ops = {
	PBACKEND_OPS(pmodal, "modal"),
	.free = pbackend_free,
};

int pmodal_provider_new(struct sbx_provider **out, const cJSON *config)
{
	struct pmodal_provider *mp = pbackend_new(sizeof(*mp), &pmodal_ops,
						  config);

	return pbackend_done(out, &mp->base,
			     pmodal_cfg_parse(&mp->cfg, mp->base.config));
}
