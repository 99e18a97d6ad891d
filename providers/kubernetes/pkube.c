/* The kubernetes provider; see pkube.h and docs/providers.md. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "kubeconfig.h"
#include "pcommon.h"
#include "pkube.h"
#include "../remote/premote_i.h"

#define LABEL_MANAGED "app.kubernetes.io/managed-by"
#define LABEL_SESSION "sbx.dev/session"
#define LABEL_HOME "sbx.dev/home"
#define MAIN_CONTAINER "sandbox"
#define INSTALL_CONTAINER "sbx-agent-install"
#define START_LOG_LINES 20
#define SSAR_PATH "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
#define TOKEN_ENV "SBX_AGENT_TOKEN"
#define AGENT_DIR "/sbx"
#define DEFAULT_IMAGE "debian:bookworm-slim"
#define DEFAULT_AGENT_IMAGE "ghcr.io/sbx-dev/sbx-agent:0.1"
#define DEFAULT_WORKDIR "/workspace"
#define DEFAULT_PORT 7070
#define DEFAULT_TTL_S 86400L
#define DEFAULT_READY_TIMEOUT_S 300L
#define DELETE_TIMEOUT_S 120L
#define WATCH_CHUNK_S 60L

/* ---- configuration --------------------------------------------------------- */

/* The "kubernetes" section, validated (strings borrowed from the JSON). */
struct kcfg {
	const char *kubeconfig, *context, *ns;
	const char *image, *agent_image, *workdir;
	bool workdir_volume;
	long port, ttl_s, ready_timeout_s, timeout_s;
	const cJSON *resources, *env, *pull_secrets, *node_selector,
		*tolerations;
	const char *service_account, *runtime_class;
};

#define SECTION "kubernetes"

static int bad_key(const char *key, const char *want)
{
	return pcommon_cfg_bad(SECTION, key, want);
}

static int kcfg_parse(struct kcfg *c, const cJSON *sec)
{
	int rc;

	memset(c, 0, sizeof(*c));
	if ((rc = pcommon_cfg_object(SECTION, sec)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "kubeconfig", &c->kubeconfig,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "context", &c->context,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "namespace", &c->ns, NULL)) < 0 ||
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

/* ---- the API client -------------------------------------------------------- */

/*
 * The API credentials as a premote_auth, plus where to connect: with
 * tls-server-name the URL carries that name (libcurl verifies the URL's
 * host) and CURLOPT_CONNECT_TO the real address.
 */
struct kauth {
	struct sbx_kube_config *kc;
	bool owns_kc;
	char *url;        /* the server URL to use */
	char *connect_to; /* NULL unless tls-server-name */
};

struct kube {
	struct sbx_kube_config *kc; /* owned */
	struct kauth ka;            /* over kc */
	struct premote_auth auth;   /* over ka; borrowed by h */
	struct premote_http *h;     /* base: the API server */
	char *kubeconfig;           /* the explicit file, or NULL */
	char *ns;
	char *context;
};

static int auth_get(void *ctx, bool refresh, struct premote_creds *out)
{
	struct kauth *a = ctx;
	struct sbx_kube_creds c;
	int rc = sbx_kube_creds_get(a->kc, refresh, &c);

	if (rc < 0)
		return rc;
	out->ca_pem = c.ca_pem;
	out->ca_pem_len = c.ca_pem_len;
	out->insecure = c.insecure;
	out->tls_server_name = c.tls_server_name;
	out->bearer = c.bearer;
	out->cert_pem = c.cert_pem;
	out->cert_pem_len = c.cert_pem_len;
	out->key_pem = c.key_pem;
	out->key_pem_len = c.key_pem_len;
	out->connect_to = a->connect_to ? sbx_xstrdup(a->connect_to) : NULL;
	return 0;
}

static void kauth_fini(struct kauth *a)
{
	if (a->owns_kc)
		sbx_kube_config_free(a->kc);
	free(a->url);
	free(a->connect_to);
	memset(a, 0, sizeof(*a));
}

static void auth_release(void *ctx)
{
	kauth_fini(ctx);
	free(ctx);
}

/*
 * Fill *a for kc (taken over when `owns`).  Gets the credentials once:
 * an exec plugin that fails says so now, before anything is created.
 */
static int kauth_init(struct kauth *a, struct sbx_kube_config *kc, bool owns)
{
	const char *server = sbx_kube_server(kc);
	struct sbx_kube_creds c;
	int rc;

	memset(a, 0, sizeof(*a));
	a->kc = kc;
	a->owns_kc = owns;
	rc = sbx_kube_creds_get(kc, false, &c);
	if (rc < 0)
		return rc;
	if (c.tls_server_name && !strncmp(server, "https://", 8)) {
		const char *host = server + 8;
		const char *end = host[0] == '['
					  ? strchr(host, ']')
					  : host + strcspn(host, ":/");
		const char *rest;
		char port[8] = "443";

		if (!end)
			end = host + strlen(host);
		else if (host[0] == '[')
			end++;
		rest = end;
		if (*rest == ':') {
			size_t n = strcspn(rest + 1, "/");

			if (n && n < sizeof(port)) {
				memcpy(port, rest + 1, n);
				port[n] = '\0';
			}
			rest += 1 + n;
		}
		a->url = sbx_xasprintf("https://%s:%s%s", c.tls_server_name,
				       port, rest);
		a->connect_to = sbx_xasprintf("%s:%s:%.*s:%s",
					      c.tls_server_name, port,
					      (int)(end - host), host, port);
	} else {
		a->url = sbx_xstrdup(server);
	}
	sbx_kube_creds_fini(&c);
	return 0;
}

static struct premote_auth *auth_new(struct kauth *ka)
{
	struct premote_auth *a = sbx_xcalloc(1, sizeof(*a));

	a->get = auth_get;
	a->release = auth_release;
	a->ctx = ka;
	return a;
}

static void kube_close(struct kube *k)
{
	premote_http_free(k->h);
	kauth_fini(&k->ka);
	sbx_kube_config_free(k->kc);
	free(k->kubeconfig);
	free(k->ns);
	free(k->context);
	memset(k, 0, sizeof(*k));
}

/* Pinned kubeconfig/context/namespace (or NULL) override the section. */
static int load_kc(struct sbx_kube_config **out, const struct kcfg *c,
		   const char *kubeconfig, const char *context,
		   const char *ns)
{
	struct sbx_kube_load_opts o = {
		.kubeconfig = kubeconfig ? kubeconfig : c->kubeconfig,
		.context = context ? context : c->context,
		.namespace_override = ns ? ns : c->ns,
	};

	return sbx_kube_config_load(out, &o);
}

/* Connect to the cluster (kubeconfig/context/namespace: pinned or NULL). */
static int kube_open(struct kube *k, const struct kcfg *c,
		     const char *kubeconfig, const char *context,
		     const char *ns)
{
	struct premote_config pc;
	int rc;

	memset(k, 0, sizeof(*k));
	rc = load_kc(&k->kc, c, kubeconfig, context, ns);
	if (rc < 0)
		return rc;
	rc = kauth_init(&k->ka, k->kc, false);
	if (rc < 0) {
		kube_close(k);
		return rc;
	}
	memset(&pc, 0, sizeof(pc));
	pc.url = k->ka.url;
	pc.timeout_ms = c->timeout_s * 1000;
	pc.connect_timeout_ms = PREMOTE_DEFAULT_CONNECT_TIMEOUT_S * 1000L;
	/* The client borrows k->auth and k->ka: both outlive k->h. */
	k->auth.get = auth_get;
	k->auth.ctx = &k->ka;
	pc.auth = &k->auth;
	/* Failures name the hop: the API server, never "the agent". */
	pc.peer = sbx_xasprintf("the Kubernetes API server at %s", k->ka.url);
	rc = premote_http_new(&k->h, &pc, NULL);
	free(pc.peer);
	if (rc < 0) {
		kube_close(k);
		return rc;
	}
	k->kubeconfig = kubeconfig ? sbx_xstrdup(kubeconfig)
		       : c->kubeconfig ? sbx_xstrdup(c->kubeconfig) : NULL;
	k->ns = sbx_xstrdup(sbx_kube_namespace(k->kc));
	k->context = sbx_xstrdup(sbx_kube_context_name(k->kc));
	return 0;
}

/*
 * Turn an API answer that is not 2xx into an error.  `what` names the
 * object ("pod sbx-x-1 in namespace n").
 */
static int status_error(const struct kube *k, long status, const cJSON *j,
			const char *what)
{
	const char *msg = sbx_json_str(j, "message");
	const char *reason = sbx_json_str(j, "reason");
	char causes[512] = "";
	const cJSON *cs = cJSON_GetObjectItemCaseSensitive(
		cJSON_GetObjectItemCaseSensitive(j, "details"), "causes");
	const cJSON *c;
	size_t o = 0;

	if (!msg)
		msg = "(no Status object in the answer)";
	cJSON_ArrayForEach(c, cs) {
		const char *f = sbx_json_str(c, "field");
		const char *m = sbx_json_str(c, "message");
		int n = snprintf(causes + o, sizeof(causes) - o, "%s%s: %s",
				 o ? "; " : " (", f ? f : "?", m ? m : "?");

		if (n < 0 || (size_t)n >= sizeof(causes) - o)
			break;
		o += (size_t)n;
	}
	if (o && o + 1 < sizeof(causes))
		strcat(causes, ")");
	switch (status) {
	case 401:
		return sbx_error_setd(SBX_ERR_CONFIG, -EACCES, status,
				      "Kubernetes API %s refused the "
				      "credentials of context '%s' (401 "
				      "Unauthorized: %s); renew them (kubectl "
				      "--context %s get pods shows the same)",
				      sbx_kube_server(k->kc), k->context, msg,
				      k->context);
	case 403:
		return sbx_error_setd(SBX_ERR_CONFIG, -EACCES, status,
				      "%s: forbidden: %s; grant the role in "
				      "contrib/kubernetes/rbac.yaml", what,
				      msg);
	case 404:
		return sbx_error_setd(SBX_ERR_NOTFOUND, -ENOENT, status,
				      "%s: not found (%s)", what, msg);
	case 409:
		return sbx_error_setd(SBX_ERR_STATE, -EEXIST, status,
				      "%s: already exists (%s)", what, msg);
	case 410:
		return sbx_error_setd(SBX_ERR_REMOTE, -ESTALE, status,
				      "%s: %s", what, msg);
	case 422:
		return sbx_error_setd(SBX_ERR_CONFIG, -EINVAL, status,
				      "%s: rejected as invalid: %s%s; check "
				      "the \"kubernetes\" configuration",
				      what, msg, causes);
	case 429:
		return sbx_error_setd(SBX_ERR_REMOTE, -EAGAIN, status,
				      "%s: the API server is overloaded (429 "
				      "%s): %s; try again later", what,
				      reason ? reason : "TooManyRequests",
				      msg);
	default:
		return sbx_error_setd(SBX_ERR_REMOTE,
				      status >= 500 ? -EIO : -EPROTO, status,
				      "%s: HTTP %ld %s: %s", what, status,
				      reason ? reason : "", msg);
	}
}

/*
 * One API request.  `body` (may be NULL) is sent as JSON; *out (may be
 * NULL) gets the parsed 2xx answer.
 */
static int kube_call(struct kube *k, const char *method, const char *path,
		     const char *query, const cJSON *body, const char *what,
		     cJSON **out)
{
	struct premote_req r = {
		.method = method, .route = path, .query = query,
		.content_type = SBX_CT_JSON, .cancel_fd = -1,
		.any_status = true,
		.idempotent = !strcmp(method, "GET") ||
			      !strcmp(method, "DELETE"),
	};
	struct premote_resp resp;
	char *text = body ? sbx_json_print(body, false) : NULL;
	cJSON *j = NULL;
	int rc;

	if (out)
		*out = NULL;
	r.body = text;
	r.body_len = text ? strlen(text) : 0;
	premote_resp_init(&resp);
	rc = premote_http_do(k->h, &r, &resp);
	free(text);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "Kubernetes API (context '%s')",
				      k->context);
		goto out;
	}
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
				  sbx_buf_len(&resp.body));
	if (resp.status < 200 || resp.status >= 300) {
		rc = status_error(k, resp.status, j, what);
		goto out;
	}
	if (!cJSON_IsObject(j)) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "%s %s: the API server's answer is not a "
				   "JSON object", method, path);
		goto out;
	}
	if (out) {
		*out = j;
		j = NULL;
	}
out:
	cJSON_Delete(j);
	premote_resp_fini(&resp);
	return rc;
}

static char *pods_path(const struct kube *k)
{
	return sbx_xasprintf("/api/v1/namespaces/%s/pods", k->ns);
}

static char *pod_path(const struct kube *k, const char *pod)
{
	return sbx_xasprintf("/api/v1/namespaces/%s/pods/%s", k->ns, pod);
}

/* The agent's health route through the pod proxy, for the API client. */
static char *proxy_health_route(const struct kube *k, const char *pod,
				long port)
{
	return sbx_xasprintf("/api/v1/namespaces/%s/pods/%s:%ld/proxy/v1/"
			     "health", k->ns, pod, port);
}

static char *pod_what(const struct kube *k, const char *pod)
{
	return sbx_xasprintf("pod %s in namespace %s (context %s)", pod, k->ns,
			     k->context);
}

static int get_pod(struct kube *k, const char *pod, cJSON **out)
{
	char *path = pod_path(k, pod), *what = pod_what(k, pod);
	int rc = kube_call(k, "GET", path, NULL, NULL, what, out);

	free(path);
	free(what);
	return rc;
}

/* ---- identity: labels, names, the pinned state ----------------------------- */

/* The label of pods made from this $SBX_HOME (sbx gc's scope). */
static int home_label(char out[17])
{
	return pcommon_home_id(out);
}

/* A label value: [A-Za-z0-9._-], at most 63, alphanumeric at both ends. */
static void label_value(char *out, size_t size, const char *in)
{
	size_t n = 0;

	for (const char *p = in; *p && n + 1 < size && n < 63; p++) {
		char c = *p;

		out[n++] = (isalnum((unsigned char)c) || c == '.' || c == '_' ||
			    c == '-') ? c : '-';
	}
	while (n && !isalnum((unsigned char)out[n - 1]))
		n--;
	out[n] = '\0';
	if (!isalnum((unsigned char)out[0]))
		out[0] = 'x';
}

/* Pod name: DNS-1123 label, "sbx-<session>-<hash>", unique per home. */
static char *pod_name(const char *session, const char *home)
{
	char base[40], h[17];
	size_t n = 0;

	for (const char *p = session; *p && n < sizeof(base) - 1; p++) {
		char c = (char)tolower((unsigned char)*p);

		base[n++] = isalnum((unsigned char)c) ? c : '-';
	}
	while (n && base[n - 1] == '-')
		n--;
	base[n] = '\0';
	pcommon_hash_hex(h, home, session);
	h[8] = '\0';
	return sbx_xasprintf("sbx-%s%s%s", base, n ? "-" : "", h);
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

struct pkube_provider {
	struct sbx_provider base;
	struct kcfg cfg; /* strings borrowed from base.config */
};

#define KP(p) ((struct pkube_provider *)(p))

/*
 * Connect for an existing session: the pinned context/namespace/pod, or
 * (no pin) the configured ones and the pod found by its labels.  *pod_out
 * is NULL (with 0) when no pod exists.
 */
static int session_open(struct pkube_provider *kp, const char *session,
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
	rc = kube_open(k, &kp->cfg, pin.kubeconfig, pin.context, pin.ns);
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
	label_value(sess, sizeof(sess), session);
	{
		struct sbx_buf q;

		sbx_buf_init(&q, PREMOTE_QUERY_CAP);
		sel = sbx_xasprintf(LABEL_MANAGED "=sbx," LABEL_SESSION "=%s,"
				    LABEL_HOME "=%s", sess, home);
		premote_q_str(&q, "labelSelector", sel);
		path = pods_path(k);
		rc = kube_call(k, "GET", path, sbx_buf_ptr(&q), NULL,
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
		kube_close(k);
	cJSON_Delete(list);
	free(sel);
	free(path);
	return rc;
}

/* session_open() for a session that must have a pod: -ENOENT otherwise. */
static int session_pod(struct pkube_provider *kp, const char *session,
		       struct kube *k, char **pod_out, long *port_out)
{
	int rc = session_open(kp, session, k, pod_out, port_out);

	if (rc < 0 || *pod_out)
		return rc;
	rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
			   "no pod of session %s in namespace %s (context %s)",
			   session, k->ns, k->context);
	kube_close(k);
	return rc;
}

static cJSON *str_array(const char *const *v)
{
	cJSON *a = cJSON_CreateArray();

	if (!a)
		abort();
	for (; *v; v++)
		cJSON_AddItemToArray(a, cJSON_CreateString(*v));
	return a;
}

static cJSON *obj_add(cJSON *parent, const char *key)
{
	cJSON *o = cJSON_AddObjectToObject(parent, key);

	if (!o)
		abort();
	return o;
}

static cJSON *arr_add(cJSON *parent, const char *key)
{
	cJSON *a = cJSON_AddArrayToObject(parent, key);

	if (!a)
		abort();
	return a;
}

static void mount_add(cJSON *mounts, const char *name, const char *path,
		      bool ro)
{
	cJSON *m = cJSON_CreateObject();

	sbx_json_set_str(m, "name", name);
	sbx_json_set_str(m, "mountPath", path);
	if (ro)
		cJSON_AddBoolToObject(m, "readOnly", true);
	cJSON_AddItemToArray(mounts, m);
}

/* The pod of a session (docs/providers.md shows it; contrib/kubernetes). */
static cJSON *pod_manifest(const struct kcfg *c, const char *name,
			   const char *session, const char *home,
			   const char *token)
{
	char listen[32], port[16], sess[64];
	const char *install[] = {"/bin/cp", "-a", "/opt/sbx-agent/.",
				 AGENT_DIR "/", NULL};
	const char *cmd[] = {AGENT_DIR "/lib/ld.so", "--library-path",
			     AGENT_DIR "/lib", AGENT_DIR "/bin/sbx-agent",
			     "serve", "--root", c->workdir, "--listen", listen,
			     "--token-env", TOKEN_ENV, NULL};
	cJSON *pod = cJSON_CreateObject(), *meta, *labels, *spec, *vols, *v,
	      *init, *ic, *ctrs, *ct, *env, *e, *probe, *hg, *mounts;
	const cJSON *it;

	snprintf(listen, sizeof(listen), "0.0.0.0:%ld", c->port);
	snprintf(port, sizeof(port), "%ld", c->port);
	label_value(sess, sizeof(sess), session);
	if (!pod)
		abort();
	sbx_json_set_str(pod, "apiVersion", "v1");
	sbx_json_set_str(pod, "kind", "Pod");
	meta = obj_add(pod, "metadata");
	sbx_json_set_str(meta, "name", name);
	labels = obj_add(meta, "labels");
	sbx_json_set_str(labels, LABEL_MANAGED, "sbx");
	sbx_json_set_str(labels, LABEL_SESSION, sess);
	sbx_json_set_str(labels, LABEL_HOME, home);
	sbx_json_set_str(obj_add(meta, "annotations"), "sbx.dev/session-name",
			 session);

	spec = obj_add(pod, "spec");
	sbx_json_set_str(spec, "restartPolicy", "Never");
	cJSON_AddNumberToObject(spec, "activeDeadlineSeconds", (double)c->ttl_s);
	cJSON_AddNumberToObject(spec, "terminationGracePeriodSeconds", 5);
	if (c->service_account)
		sbx_json_set_str(spec, "serviceAccountName", c->service_account);
	else
		cJSON_AddBoolToObject(spec, "automountServiceAccountToken",
				      false);
	if (c->runtime_class)
		sbx_json_set_str(spec, "runtimeClassName", c->runtime_class);
	if (c->node_selector)
		cJSON_AddItemToObject(spec, "nodeSelector",
				      cJSON_Duplicate(c->node_selector, 1));
	if (c->tolerations)
		cJSON_AddItemToObject(spec, "tolerations",
				      cJSON_Duplicate(c->tolerations, 1));
	if (c->pull_secrets) {
		cJSON *ps = arr_add(spec, "imagePullSecrets");

		cJSON_ArrayForEach(it, c->pull_secrets) {
			cJSON *s = cJSON_CreateObject();

			sbx_json_set_str(s, "name", it->valuestring);
			cJSON_AddItemToArray(ps, s);
		}
	}
	vols = arr_add(spec, "volumes");
	v = cJSON_CreateObject();
	sbx_json_set_str(v, "name", "sbx-agent");
	obj_add(v, "emptyDir");
	cJSON_AddItemToArray(vols, v);
	if (c->workdir_volume) {
		v = cJSON_CreateObject();
		sbx_json_set_str(v, "name", "workspace");
		obj_add(v, "emptyDir");
		cJSON_AddItemToArray(vols, v);
	}

	/* The agent bundle, copied from its image into the shared volume. */
	init = arr_add(spec, "initContainers");
	ic = cJSON_CreateObject();
	sbx_json_set_str(ic, "name", INSTALL_CONTAINER);
	sbx_json_set_str(ic, "image", c->agent_image);
	cJSON_AddItemToObject(ic, "command", str_array(install));
	mount_add(arr_add(ic, "volumeMounts"), "sbx-agent", AGENT_DIR, false);
	cJSON_AddItemToArray(init, ic);

	ctrs = arr_add(spec, "containers");
	ct = cJSON_CreateObject();
	sbx_json_set_str(ct, "name", MAIN_CONTAINER);
	sbx_json_set_str(ct, "image", c->image);
	cJSON_AddItemToObject(ct, "command", str_array(cmd));
	sbx_json_set_str(ct, "workingDir", c->workdir);
	env = arr_add(ct, "env");
	e = cJSON_CreateObject();
	sbx_json_set_str(e, "name", TOKEN_ENV);
	sbx_json_set_str(e, "value", token);
	cJSON_AddItemToArray(env, e);
	if (c->env)
		cJSON_ArrayForEach(it, c->env) {
			e = cJSON_CreateObject();
			sbx_json_set_str(e, "name", it->string);
			sbx_json_set_str(e, "value", it->valuestring);
			cJSON_AddItemToArray(env, e);
		}
	{
		cJSON *ports = arr_add(ct, "ports"), *p = cJSON_CreateObject();

		sbx_json_set_str(p, "name", "sbx-agent");
		cJSON_AddNumberToObject(p, "containerPort", (double)c->port);
		cJSON_AddItemToArray(ports, p);
	}
	probe = obj_add(ct, "readinessProbe");
	hg = obj_add(probe, "httpGet");
	sbx_json_set_str(hg, "path", "/v1/health");
	cJSON_AddNumberToObject(hg, "port", (double)c->port);
	cJSON_AddNumberToObject(probe, "periodSeconds", 1);
	cJSON_AddNumberToObject(probe, "failureThreshold", 3);
	if (c->resources)
		cJSON_AddItemToObject(ct, "resources",
				      cJSON_Duplicate(c->resources, 1));
	mounts = arr_add(ct, "volumeMounts");
	mount_add(mounts, "sbx-agent", AGENT_DIR, true);
	if (c->workdir_volume)
		mount_add(mounts, "workspace", c->workdir, false);
	cJSON_AddItemToArray(ctrs, ct);
	(void)port;
	return pod;
}

/* ---- pod status ------------------------------------------------------------- */

enum verdict { V_WAIT, V_READY, V_FAILED, V_GONE };

static const cJSON *jget(const cJSON *o, const char *k)
{
	return cJSON_GetObjectItemCaseSensitive(o, k);
}

static bool condition(const cJSON *status, const char *type,
		      const char **st, const char **reason, const char **msg)
{
	const cJSON *c;

	cJSON_ArrayForEach(c, jget(status, "conditions")) {
		const char *t = sbx_json_str(c, "type");

		if (t && !strcmp(t, type)) {
			*st = sbx_json_str(c, "status");
			*reason = sbx_json_str(c, "reason");
			*msg = sbx_json_str(c, "message");
			return true;
		}
	}
	return false;
}

static bool fatal_waiting(const char *r)
{
	static const char *const bad[] = {
		"ErrImagePull", "ImagePullBackOff", "CrashLoopBackOff",
		"CreateContainerConfigError", "InvalidImageName",
		"CreateContainerError", "ErrImageNeverPull", NULL,
	};

	for (size_t i = 0; r && bad[i]; i++)
		if (!strcmp(r, bad[i]))
			return true;
	return false;
}

/* A container status list: fatal waiting or terminated states. */
static bool containers_failed(const cJSON *list, bool init, char *why,
			      size_t n)
{
	const cJSON *cs;

	cJSON_ArrayForEach(cs, list) {
		const char *name = sbx_json_str(cs, "name");
		const cJSON *state = jget(cs, "state");
		const cJSON *w = jget(state, "waiting");
		const cJSON *t = jget(state, "terminated");

		if (w && fatal_waiting(sbx_json_str(w, "reason"))) {
			const char *m = sbx_json_str(w, "message");

			snprintf(why, n, "%scontainer %s: %s%s%s",
				 init ? "init " : "", name ? name : "?",
				 sbx_json_str(w, "reason"), m ? ": " : "",
				 m ? m : "");
			return true;
		}
		if (t && (!init || cJSON_GetNumberValue(jget(t, "exitCode")))) {
			const char *r = sbx_json_str(t, "reason");
			const char *m = sbx_json_str(t, "message");

			snprintf(why, n, "%scontainer %s exited with status %d "
				 "(%s)%s%s", init ? "init " : "",
				 name ? name : "?",
				 (int)cJSON_GetNumberValue(jget(t, "exitCode")),
				 r ? r : "terminated", m ? ": " : "",
				 m ? m : "");
			return true;
		}
	}
	return false;
}

/*
 * Where the pod stands.  `stage` gets a short progress text, `why` the
 * reason of a failure.
 */
static enum verdict pod_verdict(const cJSON *pod, char *stage, size_t ns,
				char *why, size_t nw)
{
	const cJSON *st = jget(pod, "status");
	const char *phase = sbx_json_str(st, "phase");
	const char *cst = NULL, *creason = NULL, *cmsg = NULL;

	snprintf(stage, ns, "pending");
	*why = '\0';
	if (jget(jget(pod, "metadata"), "deletionTimestamp")) {
		snprintf(why, nw, "the pod is being deleted");
		return V_FAILED;
	}
	if (phase && (!strcmp(phase, "Failed") || !strcmp(phase, "Succeeded"))) {
		const char *r = sbx_json_str(st, "reason");
		const char *m = sbx_json_str(st, "message");
		char inner[512] = "";

		if (!containers_failed(jget(st, "containerStatuses"), false,
				       inner, sizeof(inner)))
			containers_failed(jget(st, "initContainerStatuses"),
					  true, inner, sizeof(inner));
		snprintf(why, nw, "the pod %s%s%s%s%s%s",
			 !strcmp(phase, "Failed") ? "failed" : "exited",
			 r ? " (" : "", r ? r : "", r ? ")" : "",
			 m ? ": " : "", m ? m : "");
		if (*inner) {
			size_t l = strlen(why);

			snprintf(why + l, nw - l, "%s%s", r || m ? "; " : ": ",
				 inner);
		}
		return V_FAILED;
	}
	if (condition(st, "PodScheduled", &cst, &creason, &cmsg)) {
		if (cst && !strcmp(cst, "False") && creason &&
		    !strcmp(creason, "Unschedulable")) {
			snprintf(why, nw, "the pod cannot be scheduled "
				 "(Unschedulable): %s", cmsg ? cmsg : "");
			return V_FAILED;
		}
		if (cst && !strcmp(cst, "True")) {
			const char *node = sbx_json_str(jget(pod, "spec"),
							"nodeName");

			snprintf(stage, ns, "scheduled%s%s",
				 node ? " on " : "", node ? node : "");
		}
	}
	if (containers_failed(jget(st, "initContainerStatuses"), true, why,
			      nw) ||
	    containers_failed(jget(st, "containerStatuses"), false, why, nw))
		return V_FAILED;
	{
		const cJSON *cs;

		cJSON_ArrayForEach(cs, jget(st, "initContainerStatuses")) {
			const cJSON *w = jget(jget(cs, "state"), "waiting");

			if (w)
				snprintf(stage, ns, "installing the agent (%s)",
					 sbx_json_str(w, "reason")
						 ? sbx_json_str(w, "reason")
						 : "waiting");
		}
		cJSON_ArrayForEach(cs, jget(st, "containerStatuses")) {
			const cJSON *s = jget(cs, "state");
			const cJSON *w = jget(s, "waiting");

			if (w)
				snprintf(stage, ns, "%s",
					 sbx_json_str(w, "reason")
						 ? sbx_json_str(w, "reason")
						 : "waiting");
			else if (jget(s, "running"))
				snprintf(stage, ns, "started, waiting for the "
					 "agent");
		}
	}
	if (phase && !strcmp(phase, "Running") &&
	    condition(st, "Ready", &cst, &creason, &cmsg) && cst &&
	    !strcmp(cst, "True")) {
		snprintf(stage, ns, "ready");
		return V_READY;
	}
	return V_WAIT;
}

/*
 * One word for why a failed pod failed, for `sbx status`: the pod's own
 * reason (Evicted, DeadlineExceeded), else its container's (Error,
 * OOMKilled, ErrImagePull, ...), else Unschedulable / Terminating / the
 * phase.
 */
static const char *pod_reason(const cJSON *pod)
{
	const cJSON *st = jget(pod, "status"), *cs;
	const char *r = sbx_json_str(st, "reason");
	const char *cst = NULL, *creason = NULL, *cmsg = NULL;
	const char *lists[] = {"initContainerStatuses", "containerStatuses"};

	if (jget(jget(pod, "metadata"), "deletionTimestamp"))
		return "Terminating";
	if (r)
		return r;
	for (int i = 0; i < 2; i++)
		cJSON_ArrayForEach(cs, jget(st, lists[i])) {
			const cJSON *s = jget(cs, "state");
			const char *w = sbx_json_str(jget(s, "waiting"),
						     "reason");
			const cJSON *t = jget(s, "terminated");

			if (w && fatal_waiting(w))
				return w;
			if (t && cJSON_GetNumberValue(jget(t, "exitCode")) &&
			    sbx_json_str(t, "reason"))
				return sbx_json_str(t, "reason");
		}
	if (condition(st, "PodScheduled", &cst, &creason, &cmsg) && creason &&
	    !strcmp(creason, "Unschedulable"))
		return "Unschedulable";
	return sbx_json_str(st, "phase") ? sbx_json_str(st, "phase")
					 : "Failed";
}

/* Progress lines on a terminal only. */
static void progress(const char *pod, const char *stage)
{
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "\r\033[Ksbx: pod %s: %s", pod, stage);
}

static void progress_end(void)
{
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "\r\033[K");
}

struct watch_ctx {
	struct sbx_buf line;
	const char *pod;
	bool want_gone;
	enum verdict v;
	char stage[256], why[1024];
	char rv[64];
	bool expired;
};

/* Decide on one pod object. */
static int watch_object(struct watch_ctx *w, const cJSON *pod, bool deleted)
{
	const char *rv = sbx_json_str(jget(pod, "metadata"), "resourceVersion");

	if (rv)
		snprintf(w->rv, sizeof(w->rv), "%s", rv);
	if (deleted) {
		w->v = V_GONE;
		return 1;
	}
	if (w->want_gone)
		return 0;
	w->v = pod_verdict(pod, w->stage, sizeof(w->stage), w->why,
			   sizeof(w->why));
	progress(w->pod, w->stage);
	return w->v == V_WAIT ? 0 : 1;
}

static int watch_line(struct watch_ctx *w, const char *s, size_t n)
{
	cJSON *ev = cJSON_ParseWithLength(s, n);
	const char *type = sbx_json_str(ev, "type");
	const cJSON *obj = jget(ev, "object");
	int rc = 0;

	if (!type) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "watch of pod %s: an event without a type",
				   w->pod);
	} else if (!strcmp(type, "ERROR")) {
		double code = cJSON_GetNumberValue(jget(obj, "code"));

		if (code == 410) {
			w->expired = true; /* relist and watch again */
			rc = 1;
		} else {
			rc = sbx_error_setd(SBX_ERR_REMOTE, -EIO, (long)code,
					    "watch of pod %s: %s", w->pod,
					    sbx_json_str(obj, "message")
						    ? sbx_json_str(obj, "message")
						    : "error event");
		}
	} else if (!strcmp(type, "BOOKMARK")) {
		const char *rv = sbx_json_str(jget(obj, "metadata"),
					      "resourceVersion");

		if (rv)
			snprintf(w->rv, sizeof(w->rv), "%s", rv);
	} else {
		rc = watch_object(w, obj, !strcmp(type, "DELETED"));
	}
	cJSON_Delete(ev);
	return rc;
}

/* Drop the first n bytes of b. */
static void buf_consume(struct sbx_buf *b, size_t n)
{
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
	b->data[b->len] = '\0';
}

static int watch_data(const char *buf, size_t len, void *payload)
{
	struct watch_ctx *w = payload;
	int rc;

	if (sbx_buf_add(&w->line, buf, len) < 0)
		return sbx_error_prefix(-ENOMEM, "watch of pod %s", w->pod);
	for (;;) {
		const char *p = sbx_buf_ptr(&w->line);
		const char *nl = memchr(p, '\n', sbx_buf_len(&w->line));
		size_t n;

		if (!nl)
			return 0;
		n = (size_t)(nl - p);
		rc = n ? watch_line(w, p, n) : 0;
		buf_consume(&w->line, n + 1);
		if (rc)
			return rc;
	}
}

/*
 * Follow pod `pod` with the watch API until it is ready (or failed), or,
 * with want_gone, deleted; at most `timeout_s`.  Returns the verdict (>= 0)
 * or a negative errno.
 */
/*
 * A failure worth trying again while there is time: the API server (or a
 * load balancer in front of it) answered 5xx, or the connection failed,
 * was reset or timed out.  One bad answer must not abort a create that
 * is otherwise going well.
 */
static bool transient(int rc)
{
	const struct sbx_error *e = sbx_error_last();

	if (e->klass == SBX_ERR_HTTP)
		return rc == -ECONNRESET || rc == -ECONNREFUSED ||
		       rc == -EHOSTUNREACH || rc == -ETIMEDOUT || rc == -EIO;
	return e->klass == SBX_ERR_REMOTE && e->detail >= 500 &&
	       e->detail <= 599;
}

/*
 * Follow pod `pod` with the watch API until it is ready (or failed), or,
 * with want_gone, deleted; at most `timeout_s`.  Transient failures of
 * the watch or of the GET (5xx, connection reset) are retried with a
 * backoff of 0.25 s doubling to 4 s while the time lasts.  Returns the
 * verdict (>= 0) or a negative errno.
 */
static int watch_pod(struct kube *k, const char *pod, bool want_gone,
		     long timeout_s, struct watch_ctx *w)
{
	time_t deadline = time(NULL) + timeout_s;
	char *path = pods_path(k), *sel = sbx_xasprintf("metadata.name=%s", pod);
	char last_err[sizeof(sbx_error_last()->msg)] = "";
	long backoff_ms = 250;
	int rc = 0, retries = 0;

	memset(w, 0, sizeof(*w));
	sbx_buf_init(&w->line, 4u << 20);
	w->pod = pod;
	w->want_gone = want_gone;
	while (time(NULL) < deadline) {
		struct sbx_buf q;
		struct premote_req r = {
			.method = "GET", .route = path, .cancel_fd = -1,
			.any_status = true, .on_data = watch_data, .payload = w,
		};
		struct premote_resp resp;
		long chunk = deadline - time(NULL);
		cJSON *cur = NULL;

		if (chunk > WATCH_CHUNK_S)
			chunk = WATCH_CHUNK_S;
		if (chunk < 1)
			chunk = 1;
		/* Start from a fresh GET: its state counts, then the events. */
		if (!w->rv[0] || w->expired) {
			w->expired = false;
			rc = get_pod(k, pod, &cur);
			if (rc == -ENOENT) {
				sbx_error_clear();
				w->v = V_GONE;
				rc = 0;
				break;
			}
			if (rc == 0) {
				rc = watch_object(w, cur, false);
				cJSON_Delete(cur);
				if (rc)
					break;
			}
		}
		if (rc == 0) {
			sbx_buf_init(&q, PREMOTE_QUERY_CAP);
			premote_q_str(&q, "watch", "true");
			premote_q_str(&q, "fieldSelector", sel);
			premote_q_str(&q, "resourceVersion", w->rv);
			premote_q_str(&q, "allowWatchBookmarks", "true");
			premote_q_u64(&q, "timeoutSeconds", (uint64_t)chunk);
			r.query = sbx_buf_ptr(&q);
			r.timeout_ms = (chunk + 15) * 1000;
			premote_resp_init(&resp);
			sbx_buf_reset(&w->line);
			rc = premote_http_do(k->h, &r, &resp);
			sbx_buf_fini(&q);
			if (rc == 0 && (resp.status < 200 || resp.status >= 300)) {
				cJSON *j = cJSON_ParseWithLength(
					sbx_buf_ptr(&resp.body),
					sbx_buf_len(&resp.body));
				char *what = pod_what(k, pod);

				if (resp.status == 410)
					w->expired = true;
				else
					rc = status_error(k, resp.status, j,
							  what);
				free(what);
				cJSON_Delete(j);
			}
			premote_resp_fini(&resp);
		}
		if (rc < 0 && transient(rc) && time(NULL) < deadline) {
			/* Relist after the pause: events may have been lost. */
			snprintf(last_err, sizeof(last_err), "%s",
				 sbx_error_last()->msg);
			sbx_debug("pod %s: %s; retrying in %ld ms", pod, last_err,
				  backoff_ms);
			sbx_error_clear();
			progress(pod, "the API server failed; retrying");
			usleep((useconds_t)backoff_ms * 1000);
			backoff_ms = backoff_ms * 2 > 4000 ? 4000 : backoff_ms * 2;
			w->rv[0] = '\0';
			retries++;
			rc = 0;
			continue;
		}
		if (rc < 0)
			break;
		if (rc > 0 && !w->expired) {
			rc = 0;
			break; /* decided */
		}
		rc = 0; /* the watch timed out or expired: go on */
		backoff_ms = 250;
	}
	progress_end();
	sbx_buf_fini(&w->line);
	free(path);
	free(sel);
	if (rc < 0)
		return rc;
	if (w->v == V_WAIT || (want_gone && w->v != V_GONE))
		return sbx_error_set(SBX_ERR_REMOTE, -ETIMEDOUT,
				     "pod %s in namespace %s: %s after %ld s "
				     "(last state: %s%s%s)", pod, k->ns,
				     want_gone ? "still there" : "not ready",
				     timeout_s, w->stage,
				     *last_err ? "; last API error: " : "",
				     last_err);
	if (retries)
		sbx_debug("pod %s: decided after %d retried API failures", pod,
			  retries);
	return (int)w->v;
}

/* ---- control plane --------------------------------------------------------- */

static void fill_info(struct sbx_sandbox_info *out, const char *session,
		      const struct kube *k, const char *pod,
		      const cJSON *obj, const struct kcfg *c)
{
	char stage[256], why[1024];
	enum verdict v = obj ? pod_verdict(obj, stage, sizeof(stage), why,
					   sizeof(why))
			     : V_GONE;
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
	out->state = v == V_READY ? SBX_STATE_READY
		     : v == V_WAIT ? SBX_STATE_CREATING
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
		if (v == V_FAILED)
			pcommon_info_failed(out, pod_reason(obj), false, why);
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
	char *path = pod_path(k, pod), *what = pod_what(k, pod);
	struct watch_ctx w;
	int rc;

	if (!body)
		abort();
	cJSON_AddNumberToObject(body, "gracePeriodSeconds", 5);
	sbx_json_set_str(body, "propagationPolicy", "Background");
	rc = kube_call(k, "DELETE", path, NULL, body, what, NULL);
	cJSON_Delete(body);
	free(path);
	free(what);
	if (rc == -ENOENT) {
		sbx_error_clear();
		return 0; /* already gone */
	}
	if (rc < 0 || !wait)
		return rc;
	rc = watch_pod(k, pod, true, DELETE_TIMEOUT_S, &w);
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
	char *pp = pod_path(k, pod), *route = sbx_xasprintf("%s/log", pp);
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
	spec = obj_add(b, "spec");
	ra = obj_add(spec, "resourceAttributes");
	sbx_json_set_str(ra, "namespace", k->ns);
	sbx_json_set_str(ra, "verb", verb);
	sbx_json_set_str(ra, "group", "");
	sbx_json_set_str(ra, "resource", resource);
	if (subresource)
		sbx_json_set_str(ra, "subresource", subresource);
	rc = kube_call(k, "POST", SSAR_PATH, NULL, b, "access review", &ans);
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
 * The POST of a pod got no answer (timeout, reset, 5xx): the API server
 * may still carry it out.  Look for the pod by its deterministic name for
 * one more request timeout and delete it if it appears, so a failed
 * `sbx up` leaves nothing behind (a later one would adopt it anyway).
 */
/*
 * Does the pod exist?  1 yes, 0 no (404), < 0 could not tell.  Not held
 * back by the client's circuit breaker (a stream-style request with a
 * low-speed bound instead of a total one): right after a request that got
 * no answer, this is the probe.
 */
static int probe_pod(struct kube *k, const char *pod, long timeout_s)
{
	char *route = pod_path(k, pod);
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
	struct watch_ctx w;
	char home[17], token[65], *name = NULL, *path = NULL, *what = NULL;
	cJSON *manifest = NULL, *made = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = home_label(home);
	if (rc < 0)
		return rc;
	rc = kube_open(&k, &kp->cfg, NULL, NULL, NULL);
	if (rc < 0)
		return rc;
	name = pod_name(o->session, home);
	rc = access_check(&k);
	if (rc < 0)
		goto out;
	random_token(token);
	manifest = pod_manifest(&kp->cfg, name, o->session, home, token);
	explicit_bzero(token, sizeof(token));
	path = pods_path(&k);
	what = pod_what(&k, name);
	rc = kube_call(&k, "POST", path, NULL, manifest, what, &made);
	if (rc < 0 && rc != -EEXIST && transient(rc))
		reap_unanswered_create(&k, name, kp->cfg.timeout_s);
	if (rc < 0)
		goto out; /* -EEXIST: the CLI adopts it through get() */
	rc = pin_save(o->session, &k, k.kubeconfig, name, kp->cfg.port);
	if (rc < 0)
		goto fail;
	progress(name, "created");
	rc = watch_pod(&k, name, false, kp->cfg.ready_timeout_s, &w);
	if (rc < 0)
		goto fail;
	if (rc == V_FAILED || rc == V_GONE) {
		if (rc == V_FAILED)
			report_start_logs(&k, name);
		rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
				   "pod %s in namespace %s did not start: %s",
				   name, k.ns,
				   rc == V_GONE ? "it was deleted" : w.why);
		goto fail;
	}
	cJSON_Delete(made);
	made = NULL;
	rc = get_pod(&k, name, &made);
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
	kube_close(&k);
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
	rc = session_pod(kp, session, &k, &pod, &port);
	if (rc < 0)
		return rc;
	rc = get_pod(&k, pod, &obj);
	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = 0;
	}
	if (rc == 0)
		fill_info(out, session, &k, pod, obj, &kp->cfg);
	cJSON_Delete(obj);
	free(pod);
	kube_close(&k);
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
	path = pods_path(k);
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
		rc = kube_call(k, "GET", path, sbx_buf_ptr(&q), NULL,
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

		rc = kube_open(&k, &kp->cfg, ss.v[i].kubeconfig,
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
			kube_close(&k);
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
		kube_close(&k);
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

/* The agent's token, from the pod spec. */
static int pod_token(const cJSON *pod, char **out)
{
	const cJSON *c, *e;

	*out = NULL;
	cJSON_ArrayForEach(c, jget(jget(pod, "spec"), "containers")) {
		const char *n = sbx_json_str(c, "name");

		if (!n || strcmp(n, MAIN_CONTAINER))
			continue;
		cJSON_ArrayForEach(e, jget(c, "env")) {
			const char *en = sbx_json_str(e, "name");

			if (en && !strcmp(en, TOKEN_ENV) &&
			    sbx_json_str(e, "value")) {
				*out = sbx_xstrdup(sbx_json_str(e, "value"));
				return 0;
			}
		}
	}
	return sbx_error_set(SBX_ERR_STATE, -EINVAL,
			     "pod %s has no %s in container %s: it was not "
			     "made by sbx",
			     sbx_json_str(jget(pod, "metadata"), "name"),
			     TOKEN_ENV, MAIN_CONTAINER);
}

/*
 * A remote-provider configuration for the agent of `pod`, reached through
 * the API server's pod proxy.  Checks that the pod is ready.
 */
static int agent_config(struct pkube_provider *kp, struct kube *k,
			const char *pod, long port, struct premote_config *pc)
{
	struct sbx_kube_config *kc2 = NULL;
	cJSON *obj = NULL;
	char stage[256], why[1024];
	enum verdict v;
	int rc;

	memset(pc, 0, sizeof(*pc));
	rc = get_pod(k, pod, &obj);
	if (rc == -ENOENT)
		rc = sbx_error_set(SBX_ERR_STATE, -ENXIO,
				   "pod %s no longer exists in namespace %s "
				   "(deleted or evicted)", pod, k->ns);
	if (rc < 0)
		goto out;
	v = pod_verdict(obj, stage, sizeof(stage), why, sizeof(why));
	if (v != V_READY) {
		rc = sbx_error_set(SBX_ERR_STATE, -ENXIO,
				   "pod %s in namespace %s is not ready: %s",
				   pod, k->ns, v == V_FAILED ? why : stage);
		goto out;
	}
	rc = pod_token(obj, &pc->token);
	if (rc < 0)
		goto out;
	/* The sandbox's own credentials object, released with it. */
	rc = load_kc(&kc2, &kp->cfg, k->kubeconfig, k->context, k->ns);
	if (rc < 0)
		goto out;
	{
		struct kauth *ka = sbx_xcalloc(1, sizeof(*ka));

		rc = kauth_init(ka, kc2, true);
		pc->auth = auth_new(ka); /* released with pc, kc2 with it */
		if (rc < 0)
			goto out;
	}
	pc->url = sbx_xasprintf("%s/api/v1/namespaces/%s/pods/%s:%ld/proxy",
				k->ka.url, k->ns, pod, port);
	/* Two hops: the API server, then its proxy to the pod. */
	pc->peer = sbx_xasprintf("the Kubernetes API server at %s (pod proxy "
				 "to pod %s in namespace %s)", k->ka.url, pod,
				 k->ns);
	/* Commands get the container's environment (premote_env.c). */
	pc->container_env = true;
	pc->timeout_ms = kp->cfg.timeout_s * 1000;
	pc->connect_timeout_ms = PREMOTE_DEFAULT_CONNECT_TIMEOUT_S * 1000L;
out:
	if (rc < 0)
		premote_config_fini(pc);
	cJSON_Delete(obj);
	return rc;
}

/* A client for the agent of a session's pod (caller frees both). */
static int agent_client(struct pkube_provider *kp, const char *session,
			struct kube *k, struct premote_config *pc,
			struct premote_http **h)
{
	char *pod = NULL;
	long port;
	int rc;

	*h = NULL;
	memset(pc, 0, sizeof(*pc));
	rc = session_pod(kp, session, k, &pod, &port);
	if (rc < 0)
		return rc;
	rc = agent_config(kp, k, pod, port, pc);
	if (rc == 0)
		rc = premote_http_new(h, pc, pc->token);
	if (rc < 0) {
		premote_config_fini(pc);
		kube_close(k);
	}
	free(pod);
	return rc;
}

/* ---- snapshots: tar streams under $SBX_HOME/kubernetes/snapshots/ -------- */

/* A snapshot file (pcommon.h store): <id><ext>, "OTHER/ID" allowed. */
static int snap_file(char **out, const char *session, const char *id,
		     const char *ext, bool create)
{
	return pcommon_snap_file(out, SECTION, session, id, ext, create);
}

static int take_snapshot(struct pkube_provider *kp, const char *session,
			 const char *message, char **id_out)
{
	struct kube k;
	struct premote_config pc;
	struct premote_http *h = NULL;
	char id[40], *tar = NULL, *tmp = NULL;
	time_t now = time(NULL);
	int fd = -1, rc;

	*id_out = NULL;
	rc = agent_client(kp, session, &k, &pc, &h);
	if (rc < 0)
		return rc;
	pcommon_snap_new_id(id, now);
	rc = snap_file(&tar, session, id, ".tar", true);
	if (rc < 0)
		goto out;
	tmp = sbx_xasprintf("%s.part", tar);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		rc = sbx_error_os("snapshot of %s: create %s", session, tmp);
		goto out;
	}
	rc = premote_archive_get(h, "", fd);
	if (rc == 0 && fsync(fd) < 0)
		rc = sbx_error_os("snapshot of %s: fsync %s", session, tmp);
	if (close(fd) < 0 && rc == 0)
		rc = sbx_error_os("snapshot of %s: close %s", session, tmp);
	fd = -1;
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "snapshot of session %s", session);
		goto out;
	}
	rc = pcommon_snap_record(SECTION, session, id, message, now, NULL);
	if (rc == 0 && rename(tmp, tar) < 0) {
		rc = sbx_error_os("snapshot of %s: rename %s", session, tmp);
		{
			char *meta = NULL;

			if (snap_file(&meta, session, id, ".json", false) == 0)
				unlink(meta);
			free(meta);
		}
	}
	if (rc == 0)
		*id_out = sbx_xstrdup(id);
out:
	if (fd >= 0)
		close(fd);
	if (rc < 0 && tmp) {
		struct sbx_error saved = *sbx_error_last();

		unlink(tmp);
		/* Leave no empty directory behind a failed first snapshot. */
		pcommon_snap_prune(SECTION, session);
		sbx_error_set(saved.klass, saved.code, "%s", saved.msg);
	}
	premote_http_free(h);
	premote_config_fini(&pc);
	kube_close(&k);
	free(tar);
	free(tmp);
	return rc;
}

static int pkube_snapshot(struct sbx_provider *p, const char *session,
			  const char *message, char **id_out)
{
	return take_snapshot(KP(p), session, message, id_out);
}

static int pkube_snapshots(struct sbx_provider *p, const char *session,
			   sbx_snapshot_cb cb, void *payload)
{
	return pcommon_snap_list(SECTION, session, cb, payload);
}

static int pkube_restore(struct sbx_provider *p, const char *session,
			 const char *id, char **saved_out)
{
	struct pkube_provider *kp = KP(p);
	struct kube k;
	struct premote_config pc;
	struct premote_http *h = NULL;
	char *tar = NULL, *saved = NULL;
	uint64_t entries = 0;
	int fd = -1, rc;

	if (saved_out)
		*saved_out = NULL;
	rc = snap_file(&tar, session, id, ".tar", false);
	if (rc < 0)
		return rc;
	fd = open(tar, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		rc = errno == ENOENT
			     ? sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
					     "no snapshot '%s' of session %s "
					     "(see `sbx snapshots %s`)", id,
					     session, session)
			     : sbx_error_os("restore: open %s", tar);
		free(tar);
		return rc;
	}
	/* First save what is there now, so a restore loses nothing. */
	rc = take_snapshot(kp, session, "before restore", &saved);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "restore refused: could not save the "
				      "current state first");
		goto out;
	}
	rc = agent_client(kp, session, &k, &pc, &h);
	if (rc < 0)
		goto out;
	rc = premote_archive_put(h, "", fd, true, &entries);
	if (rc < 0)
		rc = sbx_error_prefix(rc, "restore of %s into session %s (the "
				      "state before is snapshot %s)", id,
				      session, saved);
	premote_http_free(h);
	premote_config_fini(&pc);
	kube_close(&k);
	if (rc == 0 && saved_out) {
		*saved_out = saved;
		saved = NULL;
	}
out:
	close(fd);
	free(tar);
	free(saved);
	return rc;
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
		rc = take_snapshot(kp, session, "before sbx down", &saved);
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
	rc = session_open(kp, session, &k, &pod, &port);
	if (rc < 0)
		return rc;
	if (!pod) {
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "no pod of session %s in namespace %s",
				   session, k.ns);
		kube_close(&k);
		pin_remove(session);
		return rc;
	}
	rc = delete_pod(&k, pod, true);
	if (rc == 0)
		pin_remove(session);
	free(pod);
	kube_close(&k);
	return rc;
}

static int pkube_open(struct sbx_provider *p, const char *session,
		      struct sbx_sandbox **out)
{
	struct pkube_provider *kp = KP(p);
	struct kube k;
	struct premote_config pc;
	struct premote_http *h = NULL;
	struct premote_info info;
	char *pod = NULL;
	long port;
	int rc;

	*out = NULL;
	rc = session_pod(kp, session, &k, &pod, &port);
	if (rc < 0)
		return rc;
	rc = agent_config(kp, &k, pod, port, &pc);
	if (rc < 0)
		goto out;
	rc = premote_probe(&pc, &h, &info);
	if (rc < 0) {
		if (sbx_error_last()->detail == 403 &&
		    sbx_error_last()->klass == SBX_ERR_HTTP) {
			/*
			 * The API server refused the pod proxy: ask it again
			 * as the API client, which turns its Status into a
			 * short "forbidden: <message>; grant ... rbac.yaml".
			 */
			struct sbx_error first = *sbx_error_last();
			char *route = proxy_health_route(&k, pod, port);
			int rc2;

			rc2 = kube_call(&k, "GET", route, NULL, NULL,
					"pods/proxy of the pod", NULL);
			free(route);
			if (rc2 != -EACCES)
				sbx_error_set(first.klass, first.code, "%s",
					      first.msg);
			rc = sbx_error_prefix(rc, "pod %s", pod);
		} else {
			rc = sbx_error_prefix(rc, "pod %s", pod);
		}
		premote_config_fini(&pc);
		goto out;
	}
	rc = premote_sandbox_open(out, session, &pc, h, &info);
out:
	free(pod);
	kube_close(&k);
	return rc;
}

static void pkube_free(struct sbx_provider *p)
{
	if (!p)
		return;
	cJSON_Delete(p->config);
	free(p);
}

static const struct sbx_provider_ops pkube_ops = {
	.version = SBX_PROVIDER_OPS_VERSION,
	.name = "kubernetes",
	.create = pkube_create,
	.get = pkube_get,
	.list = pkube_list,
	.terminate = pkube_terminate,
	.snapshot = pkube_snapshot,
	.snapshots = pkube_snapshots,
	.restore = pkube_restore,
	.open = pkube_open,
	.free = pkube_free,
};

int pkube_provider_new(struct sbx_provider **out, const cJSON *config)
{
	struct pkube_provider *kp = sbx_xcalloc(1, sizeof(*kp));
	int rc;

	*out = NULL;
	kp->base.ops = &pkube_ops;
	kp->base.config = config ? cJSON_Duplicate(config, 1)
				 : cJSON_CreateObject();
	if (!kp->base.config)
		abort();
	rc = kcfg_parse(&kp->cfg, kp->base.config);
	if (rc < 0) {
		pkube_free(&kp->base);
		return rc;
	}
	*out = &kp->base;
	return 0;
}
