/* The kubernetes provider; see pkube.h and docs/providers.md. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "kubeconfig.h"
#include "pkube.h"
#include "../remote/premote_i.h"

#define LABEL_MANAGED "app.kubernetes.io/managed-by"
#define LABEL_SESSION "sbx.dev/session"
#define LABEL_HOME "sbx.dev/home"
#define MAIN_CONTAINER "sandbox"
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

static int bad_key(const char *key, const char *want)
{
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "configuration \"kubernetes\": \"%s\" must be %s",
			     key, want);
}

static int opt_str(const cJSON *sec, const char *key, const char **out,
		   const char *dflt)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, key);

	*out = dflt;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsString(v) || !*v->valuestring)
		return bad_key(key, "a non-empty string");
	*out = v->valuestring;
	return 0;
}

static int opt_long(const cJSON *sec, const char *key, long *out, long dflt,
		    long min, long max)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, key);

	*out = dflt;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (!cJSON_IsNumber(v) || v->valuedouble < (double)min ||
	    v->valuedouble > (double)max ||
	    v->valuedouble != (double)(long)v->valuedouble)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "configuration \"kubernetes\": \"%s\" "
				     "must be a whole number from %ld to %ld",
				     key, min, max);
	*out = (long)v->valuedouble;
	return 0;
}

static int opt_json(const cJSON *sec, const char *key, const cJSON **out,
		    bool array)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(sec, key);

	*out = NULL;
	if (!v || cJSON_IsNull(v))
		return 0;
	if (array ? !cJSON_IsArray(v) : !cJSON_IsObject(v))
		return bad_key(key, array ? "a list" : "an object");
	*out = v;
	return 0;
}

static int kcfg_parse(struct kcfg *c, const cJSON *sec)
{
	const cJSON *v;
	int rc;

	memset(c, 0, sizeof(*c));
	if (sec && !cJSON_IsObject(sec))
		return bad_key("kubernetes", "an object");
	if ((rc = opt_str(sec, "kubeconfig", &c->kubeconfig, NULL)) < 0 ||
	    (rc = opt_str(sec, "context", &c->context, NULL)) < 0 ||
	    (rc = opt_str(sec, "namespace", &c->ns, NULL)) < 0 ||
	    (rc = opt_str(sec, "image", &c->image, DEFAULT_IMAGE)) < 0 ||
	    (rc = opt_str(sec, "agent_image", &c->agent_image,
			  DEFAULT_AGENT_IMAGE)) < 0 ||
	    (rc = opt_str(sec, "workdir", &c->workdir, DEFAULT_WORKDIR)) < 0 ||
	    (rc = opt_str(sec, "service_account", &c->service_account,
			  NULL)) < 0 ||
	    (rc = opt_str(sec, "runtime_class", &c->runtime_class, NULL)) < 0 ||
	    (rc = opt_long(sec, "port", &c->port, DEFAULT_PORT, 1, 65535)) < 0 ||
	    (rc = opt_long(sec, "ttl", &c->ttl_s, DEFAULT_TTL_S, 60,
			   366L * 86400)) < 0 ||
	    (rc = opt_long(sec, "ready_timeout", &c->ready_timeout_s,
			   DEFAULT_READY_TIMEOUT_S, 1, 3600)) < 0 ||
	    (rc = opt_long(sec, "timeout", &c->timeout_s,
			   PREMOTE_DEFAULT_TIMEOUT_S, 1, 86400)) < 0 ||
	    (rc = opt_json(sec, "resources", &c->resources, false)) < 0 ||
	    (rc = opt_json(sec, "env", &c->env, false)) < 0 ||
	    (rc = opt_json(sec, "node_selector", &c->node_selector, false)) < 0 ||
	    (rc = opt_json(sec, "tolerations", &c->tolerations, true)) < 0 ||
	    (rc = opt_json(sec, "image_pull_secrets", &c->pull_secrets,
			   true)) < 0)
		return rc;
	if (c->workdir[0] != '/')
		return bad_key("workdir", "an absolute path");
	c->workdir_volume = sbx_json_bool(sec, "workdir_volume", true);
	v = cJSON_GetObjectItemCaseSensitive(sec, "workdir_volume");
	if (v && !cJSON_IsBool(v))
		return bad_key("workdir_volume", "true or false");
	if (c->env)
		cJSON_ArrayForEach(v, c->env) if (!cJSON_IsString(v))
			return bad_key("env", "an object of strings");
	if (c->pull_secrets)
		cJSON_ArrayForEach(v, c->pull_secrets) if (!cJSON_IsString(v))
			return bad_key("image_pull_secrets",
				       "a list of secret names");
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
	free(k->ns);
	free(k->context);
	memset(k, 0, sizeof(*k));
}

static int load_kc(struct sbx_kube_config **out, const struct kcfg *c,
		   const char *context, const char *ns)
{
	struct sbx_kube_load_opts o = {
		.kubeconfig = c->kubeconfig,
		.context = context ? context : c->context,
		.namespace_override = ns ? ns : c->ns,
	};

	return sbx_kube_config_load(out, &o);
}

/* Connect to the cluster (context/namespace: pinned values or NULL). */
static int kube_open(struct kube *k, const struct kcfg *c,
		     const char *context, const char *ns)
{
	struct premote_config pc;
	int rc;

	memset(k, 0, sizeof(*k));
	rc = load_kc(&k->kc, c, context, ns);
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
	rc = premote_http_new(&k->h, &pc, NULL);
	if (rc < 0) {
		kube_close(k);
		return rc;
	}
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

/* FNV-1a, as hex: short stable ids for labels and names. */
static void hash_hex(char out[17], const char *a, const char *b)
{
	unsigned long long h = 1469598103934665603ULL;

	for (const char *p = a; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ULL;
	h = (h ^ 0) * 1099511628211ULL;
	for (const char *p = b ? b : ""; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ULL;
	snprintf(out, 17, "%016llx", h);
}

/* The label of pods made from this $SBX_HOME (sbx gc's scope). */
static int home_label(char out[17])
{
	char *home = NULL;
	char host[256] = "";
	int rc = sbx_paths_home(&home);

	if (rc < 0)
		return rc;
	gethostname(host, sizeof(host) - 1);
	hash_hex(out, host, home);
	free(home);
	return 0;
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
	hash_hex(h, home, session);
	h[8] = '\0';
	return sbx_xasprintf("sbx-%s%s%s", base, n ? "-" : "", h);
}

/* Where this provider pins a session: $SBX_HOME/kubernetes/<s>.json. */
static int pin_path(char **out, const char *session)
{
	return sbx_paths_session_file(out, "kubernetes", session, ".json");
}

struct pin {
	char *context, *ns, *pod;
	long port;
};

static void pin_fini(struct pin *p)
{
	free(p->context);
	free(p->ns);
	free(p->pod);
	memset(p, 0, sizeof(*p));
}

/* Read the pin; 0 with p->pod NULL when there is none. */
static int pin_load(struct pin *p, const char *session)
{
	char *path = NULL;
	cJSON *j = NULL;
	int rc;

	memset(p, 0, sizeof(*p));
	rc = pin_path(&path, session);
	if (rc < 0)
		return rc;
	rc = sbx_json_parse_file(&j, path, 1 << 20);
	if (rc == -ENOENT) {
		sbx_error_clear();
		rc = 0;
	} else if (rc == 0) {
		const char *c = sbx_json_str(j, "context");
		const char *n = sbx_json_str(j, "namespace");
		const char *pod = sbx_json_str(j, "pod");
		const cJSON *port = cJSON_GetObjectItemCaseSensitive(j, "port");

		if (!pod || !n)
			rc = sbx_error_set(SBX_ERR_JSON, -EINVAL,
					   "%s: no \"pod\"/\"namespace\"; "
					   "remove the file to find the pod "
					   "by its labels", path);
		else {
			p->context = c ? sbx_xstrdup(c) : NULL;
			p->ns = sbx_xstrdup(n);
			p->pod = sbx_xstrdup(pod);
			p->port = cJSON_IsNumber(port) ? (long)port->valuedouble
						       : DEFAULT_PORT;
		}
	}
	cJSON_Delete(j);
	free(path);
	return rc;
}

static int pin_save(const char *session, const struct kube *k,
		    const char *pod, long port)
{
	cJSON *j = cJSON_CreateObject();
	char *path = NULL, *text;
	int rc;

	if (!j)
		abort();
	sbx_json_set_str(j, "context", k->context);
	sbx_json_set_str(j, "namespace", k->ns);
	sbx_json_set_str(j, "server", sbx_kube_server(k->kc));
	sbx_json_set_str(j, "pod", pod);
	cJSON_AddNumberToObject(j, "port", (double)port);
	text = sbx_json_print(j, true);
	cJSON_Delete(j);
	rc = pin_path(&path, session);
	if (rc == 0)
		rc = sbx_file_write_atomic(path, text, strlen(text), 0600);
	free(text);
	free(path);
	return rc;
}

static void pin_remove(const char *session)
{
	char *path = NULL;

	if (pin_path(&path, session) == 0 && unlink(path) < 0 &&
	    errno != ENOENT)
		sbx_warn("could not remove %s: %s", path, strerror(errno));
	sbx_error_clear();
	free(path);
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
	rc = kube_open(k, &kp->cfg, pin.context, pin.ns);
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
	sbx_json_set_str(ic, "name", "sbx-agent-install");
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
			rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
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
static int watch_pod(struct kube *k, const char *pod, bool want_gone,
		     long timeout_s, struct watch_ctx *w)
{
	time_t deadline = time(NULL) + timeout_s;
	char *path = pods_path(k), *sel = sbx_xasprintf("metadata.name=%s", pod);
	int rc = 0;

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
			if (rc < 0)
				break;
			rc = watch_object(w, cur, false);
			cJSON_Delete(cur);
			if (rc)
				break;
		}
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
			cJSON *j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
							 sbx_buf_len(&resp.body));
			char *what = pod_what(k, pod);

			if (resp.status == 410) {
				w->expired = true;
			} else {
				rc = status_error(k, resp.status, j, what);
			}
			free(what);
			cJSON_Delete(j);
		}
		premote_resp_fini(&resp);
		if (rc < 0)
			break;
		if (rc > 0 && !w->expired) {
			rc = 0;
			break; /* decided */
		}
		rc = 0; /* the watch timed out or expired: go on */
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
				     "(last state: %s)", pod, k->ns,
				     want_gone ? "still there" : "not ready",
				     timeout_s, w->stage);
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
			sbx_json_set_str(out->extra, "error", why);
		else
			sbx_json_set_str(out->extra, "stage", stage);
	} else {
		char *m = sbx_xasprintf("pod %s no longer exists in namespace "
					"%s (deleted or evicted); `sbx down "
					"%s` cleans up, `sbx restore` can "
					"bring a snapshot back into a new "
					"session", pod, k->ns, session);

		sbx_json_set_str(out->extra, "error", m);
		free(m);
	}
}

static void random_token(char out[65])
{
	unsigned char r[32];

	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		abort(); /* the kernel's CSPRNG does not fail for 32 bytes */
	for (size_t i = 0; i < sizeof(r); i++)
		snprintf(out + 2 * i, 3, "%02x", r[i]);
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
	rc = kube_open(&k, &kp->cfg, NULL, NULL);
	if (rc < 0)
		return rc;
	name = pod_name(o->session, home);
	random_token(token);
	manifest = pod_manifest(&kp->cfg, name, o->session, home, token);
	memset(token, 0, sizeof(token));
	path = pods_path(&k);
	what = pod_what(&k, name);
	rc = kube_call(&k, "POST", path, NULL, manifest, what, &made);
	if (rc < 0)
		goto out; /* -EEXIST: the CLI adopts it through get() */
	rc = pin_save(o->session, &k, name, kp->cfg.port);
	if (rc < 0)
		goto fail;
	progress(name, "created");
	rc = watch_pod(&k, name, false, kp->cfg.ready_timeout_s, &w);
	if (rc < 0)
		goto fail;
	if (rc == V_FAILED || rc == V_GONE) {
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

/* Every pod this $SBX_HOME made (sbx gc compares with the sessions). */
static int pkube_list(struct sbx_provider *p, sbx_list_cb cb, void *payload)
{
	struct pkube_provider *kp = KP(p);
	struct kube k;
	char home[17], *sel, *path, *cont = NULL;
	int rc;

	rc = home_label(home);
	if (rc < 0)
		return rc;
	rc = kube_open(&k, &kp->cfg, NULL, NULL);
	if (rc < 0)
		return rc;
	sel = sbx_xasprintf(LABEL_MANAGED "=sbx," LABEL_HOME "=%s", home);
	path = pods_path(&k);
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
		rc = kube_call(&k, "GET", path, sbx_buf_ptr(&q), NULL,
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
			fill_info(&info, sess, &k, name, item, &kp->cfg);
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
	kube_close(&k);
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
	rc = load_kc(&kc2, &kp->cfg, k->context, k->ns);
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

static int snap_dir(char **out, const char *session)
{
	char *base = NULL;
	int rc = sbx_paths_subdir(&base, "kubernetes");

	*out = NULL;
	if (rc < 0)
		return rc;
	*out = sbx_xasprintf("%s/snapshots/%s", base, session);
	free(base);
	rc = sbx_paths_mkdir_p(*out, 0700);
	if (rc < 0) {
		free(*out);
		*out = NULL;
	}
	return rc;
}

/* "other/ID" names a snapshot of another session (restore into a new one). */
static int snap_file(char **out, const char *session, const char *id,
		     const char *ext)
{
	const char *slash = strchr(id, '/');
	char *sess = slash ? sbx_xstrndup(id, (size_t)(slash - id))
			   : sbx_xstrdup(session);
	const char *bare = slash ? slash + 1 : id;
	char *dir = NULL;
	int rc;

	*out = NULL;
	if (!*bare || strchr(bare, '/') || bare[0] == '.' ||
	    sbx_name_validate(sess) < 0) {
		sbx_error_clear();
		free(sess);
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "bad snapshot id '%s' (use an id from "
				     "`sbx snapshots`, or SESSION/ID)", id);
	}
	rc = snap_dir(&dir, sess);
	if (rc == 0)
		*out = sbx_xasprintf("%s/%s%s", dir, bare, ext);
	free(dir);
	free(sess);
	return rc;
}

static int take_snapshot(struct pkube_provider *kp, const char *session,
			 const char *message, char **id_out)
{
	struct kube k;
	struct premote_config pc;
	struct premote_http *h = NULL;
	char id[64], stamp[32], *tar = NULL, *tmp = NULL, *meta = NULL;
	unsigned char r[2];
	time_t now = time(NULL);
	struct tm tm;
	int fd = -1, rc;

	*id_out = NULL;
	rc = agent_client(kp, session, &k, &pc, &h);
	if (rc < 0)
		return rc;
	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
	if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
		r[0] = r[1] = 0;
	snprintf(id, sizeof(id), "%s-%02x%02x", stamp, r[0], r[1]);
	rc = snap_file(&tar, session, id, ".tar");
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
		unlink(tmp);
		goto out;
	}
	{
		cJSON *j = cJSON_CreateObject();
		char when[40], *text;

		if (!j)
			abort();
		sbx_json_set_str(j, "id", id);
		sbx_json_set_str(j, "session", session);
		sbx_json_set_str(j, "message", message ? message : "");
		sbx_json_set_str(j, "created_at",
				 sbx_json_time_format(when, sizeof(when), now));
		text = sbx_json_print(j, true);
		cJSON_Delete(j);
		rc = snap_file(&meta, session, id, ".json");
		if (rc == 0)
			rc = sbx_file_write_atomic(meta, text, strlen(text),
						   0600);
		free(text);
	}
	if (rc == 0 && rename(tmp, tar) < 0)
		rc = sbx_error_os("snapshot of %s: rename %s", session, tmp);
	if (rc < 0) {
		unlink(tmp);
		if (meta)
			unlink(meta);
		goto out;
	}
	*id_out = sbx_xstrdup(id);
out:
	if (fd >= 0)
		close(fd);
	premote_http_free(h);
	premote_config_fini(&pc);
	kube_close(&k);
	free(tar);
	free(tmp);
	free(meta);
	return rc;
}

static int pkube_snapshot(struct sbx_provider *p, const char *session,
			  const char *message, char **id_out)
{
	return take_snapshot(KP(p), session, message, id_out);
}

static int by_name_desc(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*b)->d_name, (*a)->d_name);
}

static int pkube_snapshots(struct sbx_provider *p, const char *session,
			   sbx_snapshot_cb cb, void *payload)
{
	struct dirent **ents = NULL;
	char *dir = NULL;
	int n, rc = snap_dir(&dir, session);

	if (rc < 0)
		return rc;
	n = scandir(dir, &ents, NULL, by_name_desc);
	if (n < 0) {
		rc = sbx_error_os("snapshots of %s: %s", session, dir);
		free(dir);
		return rc;
	}
	for (int i = 0; i < n; i++) {
		const char *name = ents[i]->d_name;
		size_t l = strlen(name);

		if (rc == 0 && l > 5 && !strcmp(name + l - 5, ".json")) {
			char *path = sbx_xasprintf("%s/%s", dir, name);
			cJSON *j = NULL;

			if (sbx_json_parse_file(&j, path, 1 << 20) == 0 &&
			    sbx_json_str(j, "id")) {
				struct sbx_snapshot_info si = {
					.id = sbx_json_str(j, "id"),
					.message = sbx_json_str(j, "message"),
				};
				const char *t = sbx_json_str(j, "created_at");

				if (t && sbx_json_time_parse(&si.created_at,
							     t) < 0)
					si.created_at = 0;
				rc = cb(&si, payload);
			}
			sbx_error_clear();
			cJSON_Delete(j);
			free(path);
		}
		free(ents[i]);
	}
	free(ents);
	free(dir);
	return rc < 0 ? rc : 0;
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
	rc = snap_file(&tar, session, id, ".tar");
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
		rc = sbx_error_prefix(rc, "pod %s", pod);
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
