/*
 * The kubernetes provider: configuration, the pin, and the control plane
 * (create, get, list, terminate); see pkube_i.h and
 * docs/providers.md.
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

#include "kubeconfig.h"
#include "pcommon.h"
#include "../backends.h"
#include "pkube_i.h"

#define START_LOG_LINES 20
#define SSAR_PATH "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
#define DEFAULT_IMAGE "debian:bookworm-slim"
#define DEFAULT_AGENT_IMAGE "ghcr.io/sbx-dev/sbx-agent:0.1"
#define DEFAULT_WORKDIR "/workspace"
#define DEFAULT_TTL_S 86400L
#define DEFAULT_READY_TIMEOUT_S 300L
#define DELETE_TIMEOUT_S 120L

/* ---- configuration --------------------------------------------------------- */

static int bad_key(const char *key, const char *want)
{
	return pcommon_cfg_bad(SECTION, key, want);
}

int pkube_cfg_parse(struct kcfg *c, const cJSON *sec)
{
	int rc;

	memset(c, 0, sizeof(*c));
	if ((rc = pcommon_cfg_object(SECTION, sec)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "kubeconfig", &c->kubeconfig,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "context", &c->context,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "namespace", &c->ns,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "image", &c->image,
				  DEFAULT_IMAGE)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "agent_image", &c->agent_image,
				  DEFAULT_AGENT_IMAGE)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "workdir", &c->workdir,
				  DEFAULT_WORKDIR)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "service_account",
				  &c->service_account, NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "runtime_class",
				  &c->runtime_class, NULL)) < 0 ||
	    (rc = pcommon_cfg_long(SECTION, sec, "port", &c->port, DEFAULT_PORT,
				   1, 65535)) < 0 ||
	    (rc = pcommon_cfg_long(SECTION, sec, "ttl", &c->ttl_s,
				   DEFAULT_TTL_S, 60, 366L * 86400)) < 0 ||
	    (rc = pcommon_cfg_long(SECTION, sec, "ready_timeout",
				   &c->ready_timeout_s, DEFAULT_READY_TIMEOUT_S,
				   1, 3600)) < 0 ||
	    (rc = pcommon_cfg_long(SECTION, sec, "timeout", &c->timeout_s,
				   PREMOTE_DEFAULT_TIMEOUT_S, 1, 86400)) < 0 ||
	    (rc = pcommon_cfg_json(SECTION, sec, "resources", &c->resources,
				   false)) < 0 ||
	    (rc = pcommon_cfg_env(SECTION, sec, "env", &c->env)) < 0 ||
	    (rc = pcommon_cfg_json(SECTION, sec, "node_selector",
				   &c->node_selector, false)) < 0 ||
	    (rc = pcommon_cfg_json(SECTION, sec, "tolerations", &c->tolerations,
				   true)) < 0 ||
	    (rc = pcommon_cfg_strings(SECTION, sec, "image_pull_secrets",
				      &c->pull_secrets)) < 0 ||
	    (rc = pcommon_cfg_bool(SECTION, sec, "workdir_volume",
				   &c->workdir_volume, true)) < 0)
		return rc;
	if (c->workdir[0] != '/')
		return bad_key("workdir", "an absolute path");
	return 0;
}

/* ---- identity: labels, names, the pinned state ----------------------------- */

/* The label of pods made from this $SBX_HOME (sbx gc's scope). */
static int home_label(char out[17])
{
	return pcommon_home_id(out);
}

/*
 * The pin of a session ($SBX_HOME/kubernetes/<s>.json, pcommon.h): the
 * kubeconfig, context, namespace and pod chosen at creation.
 */
struct pin {
	char *kubeconfig, *context, *ns, *pod;
	long port;
};

static void pin_fini(struct pin *p)
{
	free(p->kubeconfig);
	free(p->context);
	free(p->ns);
	free(p->pod);
	memset(p, 0, sizeof(*p));
}

static char *dup_or_null(const char *s)
{
	return s ? sbx_xstrdup(s) : NULL;
}

/* Decode a pin; -EINVAL without pod or namespace. */
static int pin_from_json(struct pin *p, const cJSON *j, const char *session)
{
	const char *n = sbx_json_str(j, "namespace");
	const char *pod = sbx_json_str(j, "pod");
	const cJSON *port = cJSON_GetObjectItemCaseSensitive(j, "port");

	memset(p, 0, sizeof(*p));
	if (!pod || !n)
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "the pin of session %s has no \"pod\"/"
				     "\"namespace\"; remove $SBX_HOME/"
				     "kubernetes/%s.json to find the pod by its "
				     "labels", session, session);
	p->kubeconfig = dup_or_null(sbx_json_str(j, "kubeconfig"));
	p->context = dup_or_null(sbx_json_str(j, "context"));
	p->ns = sbx_xstrdup(n);
	p->pod = sbx_xstrdup(pod);
	p->port = cJSON_IsNumber(port) ? (long)port->valuedouble : DEFAULT_PORT;
	return 0;
}

/* Read the pin; 0 with p->pod NULL when there is none. */
static int pin_load(struct pin *p, const char *session)
{
	cJSON *j = NULL;
	int rc;

	memset(p, 0, sizeof(*p));
	rc = pcommon_pin_load(&j, SECTION, session);
	if (rc == 0 && j)
		rc = pin_from_json(p, j, session);
	cJSON_Delete(j);
	return rc;
}

static int pin_save(const char *session, const struct kube *k,
		    const char *kubeconfig, const char *pod, long port)
{
	cJSON *j = cJSON_CreateObject();
	int rc;

	if (!j)
		abort();
	if (kubeconfig)
		sbx_json_set_str(j, "kubeconfig", kubeconfig);
	sbx_json_set_str(j, "context", k->context);
	sbx_json_set_str(j, "namespace", k->ns);
	sbx_json_set_str(j, "server", sbx_kube_server(k->kc));
	sbx_json_set_str(j, "pod", pod);
	cJSON_AddNumberToObject(j, "port", (double)port);
	rc = pcommon_pin_save(SECTION, session, j);
	cJSON_Delete(j);
	return rc;
}

static void pin_remove(const char *session)
{
	pcommon_pin_remove(SECTION, session);
}

/* ---- the provider ------------------------------------------------------------ */

/*
 * Connect for an existing session: the pinned context/namespace/pod, or
 * (no pin) the configured ones and the pod found by its labels.  *pod_out
 * is NULL (with 0) when no pod exists.
 */
int pkube_session_open(struct pkube_provider *kp, const char *session,
		       struct kube *k, char **pod_out, long *port_out)
{
	struct pin pin;
	char home[17], sess[64], *sel = NULL, *path = NULL;
	cJSON *list = NULL;
	const cJSON *item;
	int rc;

	*pod_out = NULL;
	*port_out = kp->cfg.port;
	rc = pin_load(&pin, session);
	if (rc < 0)
		return rc;
	rc = pkube_api_open(k, &kp->cfg, pin.kubeconfig, pin.context, pin.ns);
	if (rc < 0 || pin.pod) {
		if (rc == 0) {
			*pod_out = pin.pod;
			*port_out = pin.port;
			pin.pod = NULL;
		}
		pin_fini(&pin);
		return rc;
	}
	pin_fini(&pin);
	rc = home_label(home);
	if (rc < 0)
		goto out;
	pkube_label_value(sess, sizeof(sess), session);
	{
		struct sbx_buf q;

		sbx_buf_init(&q, PREMOTE_QUERY_CAP);
		sel = sbx_xasprintf(LABEL_MANAGED "=sbx," LABEL_SESSION "=%s,"
				    LABEL_HOME "=%s", sess, home);
		premote_q_str(&q, "labelSelector", sel);
		path = pkube_pods_path(k);
		rc = pkube_call(k, "GET", path, sbx_buf_ptr(&q), NULL,
				"pods of session", &list);
		sbx_buf_fini(&q);
	}
	if (rc < 0)
		goto out;
	cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(list,
								  "items")) {
		const char *name = sbx_json_str(
			cJSON_GetObjectItemCaseSensitive(item, "metadata"),
			"name");

		if (name && !*pod_out)
			*pod_out = sbx_xstrdup(name);
	}
out:
	if (rc < 0)
		pkube_api_close(k);
	cJSON_Delete(list);
	free(sel);
	free(path);
	return rc;
}

/* pkube_session_open() for a session that must have a pod: -ENOENT otherwise. */
int pkube_session_pod(struct pkube_provider *kp, const char *session,
		      struct kube *k, char **pod_out, long *port_out)
{
	int rc = pkube_session_open(kp, session, k, pod_out, port_out);

	if (rc < 0 || *pod_out)
		return rc;
	rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
			   "no pod of session %s in namespace %s (context %s)",
			   session, k->ns, k->context);
	pkube_api_close(k);
	return rc;
}
/* ---- control plane --------------------------------------------------------- */

static void fill_info(struct sbx_sandbox_info *out, const char *session,
		      const struct kube *k, const char *pod,
		      const cJSON *obj, const struct kcfg *c)
{
	char stage[256], why[1024];
	enum pkube_verdict v = obj ? pkube_pod_verdict(obj, stage,
						       sizeof(stage), why,
						       sizeof(why))
			     : PKUBE_GONE;
	const char *ts = sbx_json_str(jget(obj, "metadata"),
				      "creationTimestamp");

	memset(out, 0, sizeof(*out));
	out->session = sbx_xstrdup(session);
	out->provider = sbx_xstrdup("kubernetes");
	out->sandbox_id = sbx_xasprintf("%s/%s", k->ns, pod);
	out->workdir = sbx_xstrdup(c->workdir);
	out->isolation = sbx_xstrdup(c->runtime_class ? c->runtime_class
						      : "pod");
	out->remote = true;
	out->state = v == PKUBE_READY ? SBX_STATE_READY
		     : v == PKUBE_WAIT ? SBX_STATE_CREATING
				   : SBX_STATE_ERROR;
	if (ts && sbx_json_time_parse(&out->created_at, ts) < 0)
		out->created_at = 0;
	sbx_error_clear();
	out->extra = cJSON_CreateObject();
	if (!out->extra)
		abort();
	sbx_json_set_str(out->extra, "context", k->context);
	sbx_json_set_str(out->extra, "namespace", k->ns);
	sbx_json_set_str(out->extra, "pod", pod);
	if (obj) {
		const cJSON *st = jget(obj, "status");

		if (sbx_json_str(st, "phase"))
			sbx_json_set_str(out->extra, "phase",
					 sbx_json_str(st, "phase"));
		if (sbx_json_str(jget(obj, "spec"), "nodeName"))
			sbx_json_set_str(out->extra, "node",
					 sbx_json_str(jget(obj, "spec"),
						      "nodeName"));
		if (v == PKUBE_FAILED)
			pcommon_info_failed(out, pkube_pod_reason(obj), false,
					    why);
		else
			sbx_json_set_str(out->extra, "stage", stage);
	} else {
		char *m = sbx_xasprintf("pod %s no longer exists in namespace "
					"%s (deleted or evicted); `sbx down "
					"%s` cleans up, `sbx restore` can "
					"bring a snapshot back into a new "
					"session", pod, k->ns, session);

		pcommon_info_failed(out, "NotFound", true, m);
		free(m);
	}
}

static void random_token(char out[65])
{
	pcommon_random_hex(out, 32);
}

static int delete_pod(struct kube *k, const char *pod, bool wait)
{
	cJSON *body = cJSON_CreateObject();
	char *path = pkube_pod_path(k, pod), *what = pkube_pod_what(k, pod);
	struct pkube_watch w;
	int rc;

	if (!body)
		abort();
	cJSON_AddNumberToObject(body, "gracePeriodSeconds", 5);
	sbx_json_set_str(body, "propagationPolicy", "Background");
	rc = pkube_call(k, "DELETE", path, NULL, body, what, NULL);
	cJSON_Delete(body);
	free(path);
	free(what);
	if (rc == -ENOENT) {
		sbx_error_clear();
		return 0; /* already gone */
	}
	if (rc < 0 || !wait)
		return rc;
	rc = pkube_watch_pod(k, pod, true, DELETE_TIMEOUT_S, &w);
	return rc < 0 ? rc : 0;
}

/*
 * The last `lines` lines of a container's log (GET .../pods/P/log), or
 * NULL when there are none or they cannot be had (a container that never
 * started answers 400; pods/log may not be granted).  Never fails.
 */
static char *pod_log_tail(struct kube *k, const char *pod,
			  const char *container, int lines)
{
	char *pp = pkube_pod_path(k, pod), *route = sbx_xasprintf("%s/log", pp);
	struct premote_req r = {
		.method = "GET", .cancel_fd = -1, .any_status = true,
		.idempotent = true, .max_body = 64u << 10,
	};
	struct premote_resp resp;
	struct sbx_buf q;
	char *text = NULL;
	int rc;

	free(pp);
	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "container", container);
	premote_q_u64(&q, "tailLines", (uint64_t)lines);
	r.route = route;
	r.query = sbx_buf_ptr(&q);
	premote_resp_init(&resp);
	rc = premote_http_do(k->h, &r, &resp);
	if (rc == 0 && resp.status >= 200 && resp.status < 300 &&
	    sbx_buf_len(&resp.body))
		text = sbx_xstrndup(sbx_buf_ptr(&resp.body),
				    sbx_buf_len(&resp.body));
	else
		sbx_debug("no log of container %s of pod %s (HTTP %ld)",
			  container, pod, resp.status);
	sbx_error_clear();
	premote_resp_fini(&resp);
	sbx_buf_fini(&q);
	free(route);
	return text;
}

/*
 * A pod that failed to start is about to be deleted, and its logs with
 * it: show the last lines of the container that failed (the agent, else
 * the agent installer), so `kubectl logs` is not needed -- and not too
 * late.  The termination message is already in the error.
 */
static void report_start_logs(struct kube *k, const char *pod)
{
	static const char *const which[] = {MAIN_CONTAINER, INSTALL_CONTAINER,
					    NULL};

	for (int i = 0; which[i]; i++) {
		char *text = pod_log_tail(k, pod, which[i], START_LOG_LINES);

		if (text) {
			char *what = sbx_xasprintf("container %s of pod %s",
						   which[i], pod);

			pcommon_report_log_tail(what, text, START_LOG_LINES);
			free(what);
			free(text);
			return;
		}
	}
}

/* One SelfSubjectAccessReview: 1 allowed, 0 denied, < 0 cannot tell. */
static int can_i(struct kube *k, const char *verb, const char *resource,
		 const char *subresource)
{
	cJSON *b = cJSON_CreateObject(), *spec, *ra, *ans = NULL;
	int rc;

	if (!b)
		abort();
	sbx_json_set_str(b, "apiVersion", "authorization.k8s.io/v1");
	sbx_json_set_str(b, "kind", "SelfSubjectAccessReview");
	spec = pkube_obj_add(b, "spec");
	ra = pkube_obj_add(spec, "resourceAttributes");
	sbx_json_set_str(ra, "namespace", k->ns);
	sbx_json_set_str(ra, "verb", verb);
	sbx_json_set_str(ra, "group", "");
	sbx_json_set_str(ra, "resource", resource);
	if (subresource)
		sbx_json_set_str(ra, "subresource", subresource);
	rc = pkube_call(k, "POST", SSAR_PATH, NULL, b, "access review", &ans);
	cJSON_Delete(b);
	if (rc == 0)
		rc = cJSON_IsTrue(jget(jget(ans, "status"), "allowed")) ? 1 : 0;
	cJSON_Delete(ans);
	return rc;
}

/*
 * Before creating anything: may this user do what a session needs (pods
 * create/get/watch/delete, pods/proxy get/create/update) in this
 * namespace?  One SelfSubjectAccessReview each.  A cluster that does not
 * let us ask (403/404 on the review itself) is not checked; the first
 * real request then says what is missing.  -EACCES (CONFIG) naming every
 * missing verb.
 */
static int access_check(struct kube *k)
{
	static const struct {
		const char *verb, *res, *sub, *why;
	} need[] = {
		{"create", "pods", NULL, "create the pod"},
		{"get", "pods", NULL, "read its state"},
		{"watch", "pods", NULL, "wait until it is ready"},
		{"delete", "pods", NULL, "delete it (sbx down)"},
		{"get", "pods", "proxy", "reach its agent"},
		{"create", "pods", "proxy", "change files, run commands"},
		{"update", "pods", "proxy", "write files"},
	};
	char missing[512] = "";
	size_t o = 0;
	int rc;

	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		rc = can_i(k, need[i].verb, need[i].res, need[i].sub);
		if (rc < 0) {
			const struct sbx_error *e = sbx_error_last();

			if (e->detail == 403 || e->detail == 404) {
				sbx_debug("cannot review access (%s): not "
					  "checked", e->msg);
				sbx_error_clear();
				return 0;
			}
			return rc;
		}
		if (rc == 0) {
			int n = snprintf(missing + o, sizeof(missing) - o,
					 "%s%s %s%s%s (to %s)", o ? ", " : "",
					 need[i].verb, need[i].res,
					 need[i].sub ? "/" : "",
					 need[i].sub ? need[i].sub : "",
					 need[i].why);

			if (n > 0 && (size_t)n < sizeof(missing) - o)
				o += (size_t)n;
		}
	}
	if (!o)
		return 0;
	return sbx_error_set(SBX_ERR_CONFIG, -EACCES,
			     "context '%s' may not %s in namespace %s; grant "
			     "the Role in contrib/kubernetes/rbac.yaml "
			     "(`kubectl auth can-i --list -n %s` shows what "
			     "it may do)", k->context, missing, k->ns, k->ns);
}

/*
 * Does the pod exist?  1 yes, 0 no (404), < 0 could not tell.  Not held
 * back by the client's circuit breaker (a stream-style request with a
 * low-speed bound instead of a total one): right after a request that got
 * no answer, this is the probe.
 */
static int probe_pod(struct kube *k, const char *pod, long timeout_s)
{
	char *route = pkube_pod_path(k, pod);
	struct premote_req r = {
		.method = "GET", .route = route, .cancel_fd = -1,
		.any_status = true, .timeout_ms = -1,
		.low_speed_s = timeout_s > 0 ? timeout_s : 1,
	};
	struct premote_resp resp;
	int rc;

	premote_resp_init(&resp);
	rc = premote_http_do(k->h, &r, &resp);
	if (rc == 0)
		rc = resp.status == 404 ? 0
		     : resp.status >= 200 && resp.status < 300 ? 1
							       : -EIO;
	premote_resp_fini(&resp);
	free(route);
	return rc;
}

/*
 * The POST of a pod got no answer (timeout, reset, 5xx): the API server
 * may still carry it out.  Look for the pod by its deterministic name for
 * one more request timeout and delete it if it appears, so a failed
 * `sbx up` leaves nothing behind (a later one would adopt it anyway).
 */
static void reap_unanswered_create(struct kube *k, const char *pod,
				   long timeout_s)
{
	struct sbx_error saved = *sbx_error_last();
	/* The client holds requests back for one timeout after one got no
	 * answer: look a little longer than that. */
	time_t deadline = time(NULL) + timeout_s + 5;
	bool found = false, deleted = false;

	while (!deleted && time(NULL) < deadline) {
		int rc = probe_pod(k, pod, timeout_s);

		if (rc == 1) {
			found = true;
			deleted = delete_pod(k, pod, false) == 0;
		}
		sbx_error_clear();
		if (!deleted)
			usleep(500 * 1000);
	}
	if (deleted)
		fprintf(stderr, "sbx: pod %s was created after all; deleted "
			"it\n", pod);
	else if (found)
		sbx_warn("pod %s was created after all and could not be "
			 "deleted; `sbx gc` deletes it", pod);
	else
		sbx_debug("pod %s did not appear after the failed create", pod);
	sbx_error_set(saved.klass, saved.code, "%s", saved.msg);
}

static int pkube_create(struct sbx_provider *p, const struct sbx_create_opts *o,
			struct sbx_sandbox_info *out)
{
	struct pkube_provider *kp = KP(p);
	struct kube k;
	struct pkube_watch w;
	char home[17], token[65], *name = NULL, *path = NULL, *what = NULL;
	cJSON *manifest = NULL, *made = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = home_label(home);
	if (rc < 0)
		return rc;
	rc = pkube_api_open(&k, &kp->cfg, NULL, NULL, NULL);
	if (rc < 0)
		return rc;
	name = pkube_pod_name(o->session, home);
	rc = access_check(&k);
	if (rc < 0)
		goto out;
	random_token(token);
	manifest = pkube_pod_manifest(&kp->cfg, name, o->session, home, token);
	explicit_bzero(token, sizeof(token));
	path = pkube_pods_path(&k);
	what = pkube_pod_what(&k, name);
	rc = pkube_call(&k, "POST", path, NULL, manifest, what, &made);
	if (rc < 0 && rc != -EEXIST && pkube_transient(rc))
		reap_unanswered_create(&k, name, kp->cfg.timeout_s);
	if (rc < 0)
		goto out; /* -EEXIST: the CLI adopts it through get() */
	rc = pin_save(o->session, &k, k.kubeconfig, name, kp->cfg.port);
	if (rc < 0)
		goto fail;
	pkube_progress(name, "created");
	rc = pkube_watch_pod(&k, name, false, kp->cfg.ready_timeout_s, &w);
	if (rc < 0)
		goto fail;
	if (rc == PKUBE_FAILED || rc == PKUBE_GONE) {
		if (rc == PKUBE_FAILED)
			report_start_logs(&k, name);
		rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
				   "pod %s in namespace %s did not start: %s",
				   name, k.ns,
				   rc == PKUBE_GONE ? "it was deleted" : w.why);
		goto fail;
	}
	cJSON_Delete(made);
	made = NULL;
	rc = pkube_get_pod(&k, name, &made);
	if (rc < 0)
		goto fail;
	fill_info(out, o->session, &k, name, made, &kp->cfg);
	goto out;
fail:
	/* Nothing of value is in a pod that never became ready. */
	{
		struct sbx_error saved = *sbx_error_last();

		if (delete_pod(&k, name, true) < 0)
			sbx_warn("could not delete pod %s: %s", name,
				 sbx_error_last()->msg);
		pin_remove(o->session);
		sbx_error_set(saved.klass, saved.code, "%s", saved.msg);
	}
out:
	cJSON_Delete(manifest);
	cJSON_Delete(made);
	free(name);
	free(path);
	free(what);
	pkube_api_close(&k);
	return rc;
}

static int pkube_get(struct sbx_provider *p, const char *session,
		     struct sbx_sandbox_info *out)
{
	struct pkube_provider *kp = KP(p);
	struct kube k;
	char *pod = NULL;
	long port;
	cJSON *obj = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = pkube_session_pod(kp, session, &k, &pod, &port);
	if (rc < 0)
		return rc;
	rc = pkube_get_pod(&k, pod, &obj);
	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = 0;
	}
	if (rc == 0)
		fill_info(out, session, &k, pod, obj, &kp->cfg);
	cJSON_Delete(obj);
	free(pod);
	pkube_api_close(&k);
	return rc;
}

/* One place pods of this $SBX_HOME may be: NULLs mean "as configured". */
struct scope {
	char *kubeconfig, *context, *ns;
};

struct scopes {
	struct scope *v;
	size_t n;
};

static bool same_str(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static int add_pinned_scope(const char *session, const cJSON *pin,
			    void *payload)
{
	struct scopes *ss = payload;
	const char *kc = sbx_json_str(pin, "kubeconfig");
	const char *ctx = sbx_json_str(pin, "context");
	const char *ns = sbx_json_str(pin, "namespace");

	if (!ns)
		return 0;
	for (size_t i = 0; i < ss->n; i++)
		if (same_str(ss->v[i].kubeconfig, kc) &&
		    same_str(ss->v[i].context, ctx) &&
		    same_str(ss->v[i].ns, ns))
			return 0;
	ss->v = sbx_xrealloc(ss->v, (ss->n + 1) * sizeof(*ss->v));
	ss->v[ss->n].kubeconfig = kc ? sbx_xstrdup(kc) : NULL;
	ss->v[ss->n].context = ctx ? sbx_xstrdup(ctx) : NULL;
	ss->v[ss->n].ns = sbx_xstrdup(ns);
	ss->n++;
	return 0;
}

/* The labelled pods in one namespace (paged with limit/continue). */
static int list_scope(struct pkube_provider *kp, struct kube *k,
		      const char *home, sbx_list_cb cb, void *payload)
{
	char *sel, *path, *cont = NULL;
	int rc;

	sel = sbx_xasprintf(LABEL_MANAGED "=sbx," LABEL_HOME "=%s", home);
	path = pkube_pods_path(k);
	do {
		struct sbx_buf q;
		cJSON *list = NULL;
		const cJSON *item;
		const char *next;

		sbx_buf_init(&q, PREMOTE_QUERY_CAP);
		premote_q_str(&q, "labelSelector", sel);
		premote_q_u64(&q, "limit", 500);
		if (cont)
			premote_q_str(&q, "continue", cont);
		rc = pkube_call(k, "GET", path, sbx_buf_ptr(&q), NULL,
				"sbx pods", &list);
		sbx_buf_fini(&q);
		free(cont);
		cont = NULL;
		if (rc < 0)
			break;
		cJSON_ArrayForEach(item, jget(list, "items")) {
			const cJSON *meta = jget(item, "metadata");
			const char *name = sbx_json_str(meta, "name");
			const char *sess = sbx_json_str(jget(meta,
							     "annotations"),
							"sbx.dev/session-name");
			struct sbx_sandbox_info info;

			if (!sess)
				sess = sbx_json_str(jget(meta, "labels"),
						    LABEL_SESSION);
			if (!name || !sess)
				continue;
			fill_info(&info, sess, k, name, item, &kp->cfg);
			rc = cb(&info, payload);
			sbx_sandbox_info_fini(&info);
			if (rc)
				break;
		}
		next = sbx_json_str(jget(list, "metadata"), "continue");
		if (!rc && next && *next)
			cont = sbx_xstrdup(next);
		cJSON_Delete(list);
	} while (cont);
	free(cont);
	free(sel);
	free(path);
	return rc;
}

/*
 * Every pod this $SBX_HOME made (sbx gc compares with the sessions): in
 * the configured namespace and in every namespace a session was pinned to
 * (--namespace, --context, --kubeconfig at `sbx up`), each cluster and
 * namespace once.  A scope that cannot be reached is warned about; the
 * listing fails only when none can.
 */
static int pkube_list(struct sbx_provider *p, sbx_list_cb cb, void *payload)
{
	struct pkube_provider *kp = KP(p);
	struct scopes ss = {0};
	char home[17], **done = NULL;
	size_t ndone = 0, ok = 0;
	struct sbx_error first = {0};
	int rc;

	rc = home_label(home);
	if (rc < 0)
		return rc;
	/* The configured scope first, then the pinned ones. */
	ss.v = sbx_xcalloc(1, sizeof(*ss.v));
	ss.n = 1;
	rc = pcommon_pin_each(SECTION, add_pinned_scope, &ss);
	if (rc < 0)
		sbx_error_clear();
	rc = 0;
	for (size_t i = 0; i < ss.n && rc == 0; i++) {
		struct kube k;
		char *key;
		bool seen = false;

		rc = pkube_api_open(&k, &kp->cfg, ss.v[i].kubeconfig,
				    ss.v[i].context, ss.v[i].ns);
		if (rc < 0) {
			if (!first.klass)
				first = *sbx_error_last();
			if (i)
				sbx_warn("gc: cannot list the pods of context "
					 "'%s' namespace %s: %s",
					 ss.v[i].context ? ss.v[i].context : "?",
					 ss.v[i].ns, sbx_error_last()->msg);
			sbx_error_clear();
			rc = 0;
			continue;
		}
		key = sbx_xasprintf("%s|%s", sbx_kube_server(k.kc), k.ns);
		for (size_t d = 0; d < ndone && !seen; d++)
			seen = !strcmp(done[d], key);
		if (seen) {
			free(key);
			pkube_api_close(&k);
			continue;
		}
		done = sbx_xrealloc(done, (ndone + 1) * sizeof(*done));
		done[ndone++] = key;
		rc = list_scope(kp, &k, home, cb, payload);
		if (rc < 0) {
			if (!first.klass)
				first = *sbx_error_last();
			sbx_warn("gc: cannot list the pods of context '%s' "
				 "namespace %s: %s", k.context, k.ns,
				 sbx_error_last()->msg);
			sbx_error_clear();
			rc = 0;
		} else if (rc == 0) {
			ok++;
		}
		pkube_api_close(&k);
	}
	for (size_t i = 0; i < ss.n; i++) {
		free(ss.v[i].kubeconfig);
		free(ss.v[i].context);
		free(ss.v[i].ns);
	}
	free(ss.v);
	for (size_t d = 0; d < ndone; d++)
		free(done[d]);
	free(done);
	if (rc > 0)
		return 0; /* the callback stopped the walk */
	if (rc == 0 && !ok && first.klass)
		return sbx_error_set(first.klass, first.code, "%s", first.msg);
	return rc < 0 ? rc : 0;
}
static int pkube_terminate(struct sbx_provider *p, const char *session,
			   unsigned flags)
{
	struct pkube_provider *kp = KP(p);
	struct kube k;
	char *pod = NULL, *saved = NULL;
	long port;
	int rc;

	/*
	 * The workdir dies with the pod: keep a snapshot unless forced.  A
	 * pod that is not ready has no agent to take it from.
	 */
	if (!(flags & SBX_TERMINATE_FORCE)) {
		rc = pkube_snapshot(p, session, "before sbx down", &saved);
		if (rc == -ENXIO || rc == -ENOENT) {
			/* Nothing to save, and the user is told so. */
			pcommon_report_nothing_saved(session, "the pod",
						     sbx_error_last()->msg);
			sbx_error_clear();
		} else if (rc < 0) {
			return sbx_error_prefix(rc, "not deleting the pod of "
						"session %s: could not save its "
						"workdir first (use --force to "
						"delete it anyway)", session);
		} else {
			fprintf(stderr, "sbx: saved the workdir of %s as "
				"snapshot %s\n", session, saved);
		}
		free(saved);
	}
	rc = pkube_session_open(kp, session, &k, &pod, &port);
	if (rc < 0)
		return rc;
	if (!pod) {
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "no pod of session %s in namespace %s",
				   session, k.ns);
		pkube_api_close(&k);
		pin_remove(session);
		return rc;
	}
	rc = delete_pod(&k, pod, true);
	if (rc == 0)
		pin_remove(session);
	free(pod);
	pkube_api_close(&k);
	return rc;
}

static const struct sbx_provider_ops pkube_ops = {
	PBACKEND_OPS(pkube, "kubernetes"),
	.free = pbackend_free,
};

int pkube_provider_new(struct sbx_provider **out, const cJSON *config)
{
	struct pkube_provider *kp = pbackend_new(sizeof(*kp), &pkube_ops,
						 config);

	return pbackend_done(out, &kp->base,
			     pkube_cfg_parse(&kp->cfg, kp->base.config));
}
