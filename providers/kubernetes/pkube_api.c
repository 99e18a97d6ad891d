/*
 * The Kubernetes API client of the kubernetes provider: the remote
 * provider's HTTP client (sbx/remote.h) pointed at the API server, with
 * the kubeconfig's credentials as its auth hook; see pkube_i.h.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/xmalloc.h"

#include "kubeconfig.h"
#include "pkube_i.h"

/* ---- the API client -------------------------------------------------------- */

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

int pkube_kauth_init(struct kauth *a, struct sbx_kube_config *kc, bool owns)
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

struct premote_auth *pkube_auth_new(struct kauth *ka)
{
	struct premote_auth *a = sbx_xcalloc(1, sizeof(*a));

	a->get = auth_get;
	a->release = auth_release;
	a->ctx = ka;
	return a;
}

void pkube_api_close(struct kube *k)
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
int pkube_load_kc(struct sbx_kube_config **out, const struct kcfg *c,
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
int pkube_api_open(struct kube *k, const struct kcfg *c,
		   const char *kubeconfig, const char *context,
		   const char *ns)
{
	struct premote_config pc;
	int rc;

	memset(k, 0, sizeof(*k));
	rc = pkube_load_kc(&k->kc, c, kubeconfig, context, ns);
	if (rc < 0)
		return rc;
	rc = pkube_kauth_init(&k->ka, k->kc, false);
	if (rc < 0) {
		pkube_api_close(k);
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
		pkube_api_close(k);
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
int pkube_status_error(const struct kube *k, long status, const cJSON *j,
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
int pkube_call(struct kube *k, const char *method, const char *path,
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
		rc = pkube_status_error(k, resp.status, j, what);
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

char *pkube_pods_path(const struct kube *k)
{
	return sbx_xasprintf("/api/v1/namespaces/%s/pods", k->ns);
}

char *pkube_pod_path(const struct kube *k, const char *pod)
{
	return sbx_xasprintf("/api/v1/namespaces/%s/pods/%s", k->ns, pod);
}

/* The agent's health route through the pod proxy, for the API client. */
char *pkube_proxy_health_route(const struct kube *k, const char *pod,
			       long port)
{
	return sbx_xasprintf("/api/v1/namespaces/%s/pods/%s:%ld/proxy/v1/"
			     "health", k->ns, pod, port);
}

char *pkube_pod_what(const struct kube *k, const char *pod)
{
	return sbx_xasprintf("pod %s in namespace %s (context %s)", pod, k->ns,
			     k->context);
}

int pkube_get_pod(struct kube *k, const char *pod, cJSON **out)
{
	char *path = pkube_pod_path(k, pod), *what = pkube_pod_what(k, pod);
	int rc = pkube_call(k, "GET", path, NULL, NULL, what, out);

	free(path);
	free(what);
	return rc;
}
