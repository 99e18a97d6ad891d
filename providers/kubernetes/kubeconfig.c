/*
 * Kubernetes credentials the way kubectl finds them; see kubeconfig.h.
 *
 * Loading keeps every kubeconfig file's YAML document alive while one
 * context is resolved: names are looked up file by file (the first file
 * defining a name wins, kubectl's merge rule), so no merged copy of the
 * whole configuration is ever built.  Everything the selected context
 * needs is copied into struct sbx_kube_config before the documents go.
 * The files and their YAML are read in kubeconfig_yaml.c, exec plugins
 * run in kubeconfig_exec.c (kubeconfig_i.h).
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <yaml.h>

#include "sbx/buf.h"
#include "sbx/paths.h"
#include "sbx/xmalloc.h"

#include "kubeconfig_i.h"

/* ---- small helpers ------------------------------------------------------- */

void pk8s_wipe_free(char *p, size_t len)
{
	if (!p)
		return;
	explicit_bzero(p, len);
	free(p);
}

static void wipe_str(char *p)
{
	if (p)
		pk8s_wipe_free(p, strlen(p));
}

char *pk8s_memdup0(const char *p, size_t n)
{
	char *r = sbx_xmalloc(n + 1);

	memcpy(r, p, n);
	r[n] = '\0';
	return r;
}

static void strv_free(char **v)
{
	if (!v)
		return;
	for (char **p = v; *p; p++)
		free(*p);
	free(v);
}

static void kexec_free(struct kexec *x)
{
	if (!x)
		return;
	strv_free(x->argv);
	/* exec.env may carry secrets too. */
	for (char **p = x->env; p && *p; p++)
		explicit_bzero(*p, strlen(*p));
	strv_free(x->env);
	free(x->api_version);
	free(x->hint);
	free(x->where);
	free(x);
}

/* A path for messages: the home directory shown as "~". */
char *pk8s_shown_path(const char *path)
{
	const char *home = getenv("HOME");
	size_t n = home ? strlen(home) : 0;

	while (n > 1 && home[n - 1] == '/')
		n--;
	if (n > 1 && strncmp(path, home, n) == 0 && path[n] == '/')
		return sbx_xasprintf("~%s", path + n);
	return sbx_xstrdup(path);
}

const char *pk8s_why(int rc)
{
	return rc == -EFBIG ? "the file is too large" : strerror(-rc);
}

long long pk8s_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Tokens travel in an HTTP header: no control characters, no spaces. */
bool pk8s_token_ok(const char *t)
{
	if (!*t)
		return false;
	for (const unsigned char *p = (const unsigned char *)t; *p; p++)
		if (*p <= 0x20 || *p == 0x7f)
			return false;
	return true;
}

/* Kubernetes namespace: an RFC 1123 label. */
static bool ns_ok(const char *s)
{
	size_t n = strlen(s);

	if (n < 1 || n > 63 || s[0] == '-' || s[n - 1] == '-')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!(islower((unsigned char)s[i]) ||
		      isdigit((unsigned char)s[i]) || s[i] == '-'))
			return false;
	return true;
}

bool pk8s_has(const char *p, size_t len, const char *needle)
{
	return memmem(p, len, needle, strlen(needle)) != NULL;
}

/* ---- loading a context ----------------------------------------------------- */

static int server_normalise(char **out, const char *s, const char *where)
{
	char *url;
	size_t n, skip;

	*out = NULL;
	if (strncasecmp(s, "https://", 8) == 0) {
		url = sbx_xasprintf("https://%s", s + 8);
		skip = 8;
	} else if (strncasecmp(s, "http://", 7) == 0) {
		url = sbx_xasprintf("http://%s", s + 7);
		skip = 7;
	} else if (strstr(s, "://")) {
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: server '%s' must be an https:// "
				     "URL", where, s);
	} else {
		/* kubectl's default for a bare host:port with TLS. */
		url = sbx_xasprintf("https://%s", s);
		skip = 8;
	}
	n = strlen(url);
	while (n > skip && url[n - 1] == '/')
		url[--n] = '\0';
	for (size_t i = 0; i < n; i++) {
		if ((unsigned char)url[i] <= 0x20 || url[i] == 0x7f) {
			free(url);
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "%s: server '%s' contains spaces "
					     "or control characters", where,
					     s);
		}
	}
	if (n == skip || url[skip] == '/' || url[skip] == '?' ||
	    url[skip] == '#') {
		free(url);
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "%s: server '%s' has no host", where, s);
	}
	*out = url;
	return 0;
}

static int load_cluster(struct sbx_kube_config *k, struct kfile *f,
			const char *name, const yaml_node_t *c)
{
	const char *server, *ca, *ca_data, *sni;
	char *where = sbx_xasprintf("%s: cluster '%s'", f->shown, name);
	int rc;

	if ((rc = pk8s_yget_str(&server, f, where, c, "server")) < 0 ||
	    (rc = pk8s_yget_str(&ca, f, where, c, "certificate-authority")) < 0 ||
	    (rc = pk8s_yget_str(&ca_data, f, where, c,
			   "certificate-authority-data")) < 0 ||
	    (rc = pk8s_yget_str(&sni, f, where, c, "tls-server-name")) < 0 ||
	    (rc = pk8s_yget_bool(&k->st.insecure, f, where, c,
			    "insecure-skip-tls-verify")) < 0)
		goto out;
	if (!server) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: 'server' is not set", where);
		goto out;
	}
	if ((rc = server_normalise(&k->server, server, where)) < 0)
		goto out;
	if (k->st.insecure && (ca || ca_data)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: both a certificate authority and "
				   "insecure-skip-tls-verify are set (kubectl "
				   "refuses this too); remove one", where);
		goto out;
	}
	if (ca_data)
		rc = pk8s_decode_pem_data(&k->st.ca_pem, &k->st.ca_pem_len, where,
				     "certificate-authority-data", ca_data,
				     "-----BEGIN CERTIFICATE-----");
	else if (ca)
		rc = pk8s_read_pem_file(&k->st.ca_pem, &k->st.ca_pem_len, f, where,
				   "certificate-authority", ca,
				   "-----BEGIN CERTIFICATE-----");
	if (rc < 0)
		goto out;
	if (sni)
		k->st.tls_server_name = sbx_xstrdup(sni);
out:
	free(where);
	return rc;
}

static int load_exec(struct sbx_kube_config *k, struct kfile *f,
		     const char *uwhere, const yaml_node_t *e)
{
	const char *cmd, *api, *hint, *mode;
	yaml_node_t *args, *env;
	struct kexec *x = sbx_xcalloc(1, sizeof(*x));
	char *where = sbx_xasprintf("%s: exec", uwhere);
	size_t n = 0;
	int rc;

	x->where = sbx_xstrdup(uwhere);
	if ((rc = pk8s_yget_str(&cmd, f, where, e, "command")) < 0 ||
	    (rc = pk8s_yget_str(&api, f, where, e, "apiVersion")) < 0 ||
	    (rc = pk8s_yget_str(&hint, f, where, e, "installHint")) < 0 ||
	    (rc = pk8s_yget_str(&mode, f, where, e, "interactiveMode")) < 0 ||
	    (rc = pk8s_yget_kind(&args, f, where, e, "args",
			    YAML_SEQUENCE_NODE)) < 0 ||
	    (rc = pk8s_yget_kind(&env, f, where, e, "env", YAML_SEQUENCE_NODE)) < 0)
		goto out;
	rc = -EINVAL;
	if (!cmd) {
		sbx_error_set(SBX_ERR_CONFIG, rc, "%s: 'command' is not set",
			      where);
		goto out;
	}
	if (!api) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: 'apiVersion' is not set (use " API_V1 ")",
			      where);
		goto out;
	}
	if (strcmp(api, API_V1) != 0 && strcmp(api, API_V1BETA1) != 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: apiVersion '%s' is not supported (use "
			      API_V1 " or " API_V1BETA1 ")", where, api);
		goto out;
	}
	if (!mode && strcmp(api, API_V1) == 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: 'interactiveMode' must be set for " API_V1
			      " (use Never or IfAvailable)", where);
		goto out;
	}
	if (mode && strcmp(mode, "Always") == 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: interactiveMode Always needs a terminal, "
			      "and sbx runs credential plugins without one; "
			      "use IfAvailable or Never", where);
		goto out;
	}
	if (mode && strcmp(mode, "Never") != 0 &&
	    strcmp(mode, "IfAvailable") != 0) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: interactiveMode '%s' is not one of Never, "
			      "IfAvailable, Always", where, mode);
		goto out;
	}
	x->api_version = sbx_xstrdup(api);
	x->hint = hint ? sbx_xstrdup(hint) : NULL;

	n = args ? (size_t)(args->data.sequence.items.top -
			    args->data.sequence.items.start)
		 : 0;
	x->argv = sbx_xcalloc(n + 2, sizeof(*x->argv));
	x->argv[0] = strchr(cmd, '/') ? pk8s_resolve(f, cmd) : sbx_xstrdup(cmd);
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *a = pk8s_ynode(f, args->data.sequence.items.start[i]);

		if (!a || a->type != YAML_SCALAR_NODE ||
		    strlen((const char *)a->data.scalar.value) !=
			    a->data.scalar.length) {
			sbx_error_set(SBX_ERR_CONFIG, rc,
				      "%s: args[%zu] must be a string", where,
				      i);
			goto out;
		}
		x->argv[i + 1] = sbx_xstrdup((const char *)a->data.scalar.value);
	}

	n = env ? (size_t)(env->data.sequence.items.top -
			   env->data.sequence.items.start)
		: 0;
	x->env = sbx_xcalloc(n + 1, sizeof(*x->env));
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *item = pk8s_ynode(f, env->data.sequence.items.start[i]);
		const char *en, *ev;

		if (!item || item->type != YAML_MAPPING_NODE) {
			sbx_error_set(SBX_ERR_CONFIG, rc,
				      "%s: env[%zu] must be a mapping with "
				      "'name' and 'value'", where, i);
			goto out;
		}
		if ((rc = pk8s_yget_str(&en, f, where, item, "name")) < 0 ||
		    (rc = pk8s_yget_str(&ev, f, where, item, "value")) < 0)
			goto out;
		rc = -EINVAL;
		if (!en || strchr(en, '=')) {
			sbx_error_set(SBX_ERR_CONFIG, rc,
				      "%s: env[%zu] needs a 'name' without "
				      "'='", where, i);
			goto out;
		}
		x->env[i] = sbx_xasprintf("%s=%s", en, ev ? ev : "");
	}
	k->exec = x;
	x = NULL;
	rc = 0;
out:
	kexec_free(x);
	free(where);
	return rc;
}

static int load_user(struct sbx_kube_config *k, struct kfile *f,
		     const char *name, const yaml_node_t *u)
{
	const char *token, *tfile, *cert, *cert_data, *key, *key_data;
	const char *login, *pass;
	yaml_node_t *exec, *ap;
	char *where = sbx_xasprintf("%s: user '%s'", f->shown, name);
	int rc;

	if ((rc = pk8s_yget_str(&token, f, where, u, "token")) < 0 ||
	    (rc = pk8s_yget_str(&tfile, f, where, u, "tokenFile")) < 0 ||
	    (rc = pk8s_yget_str(&cert, f, where, u, "client-certificate")) < 0 ||
	    (rc = pk8s_yget_str(&cert_data, f, where, u,
			   "client-certificate-data")) < 0 ||
	    (rc = pk8s_yget_str(&key, f, where, u, "client-key")) < 0 ||
	    (rc = pk8s_yget_str(&key_data, f, where, u, "client-key-data")) < 0 ||
	    (rc = pk8s_yget_str(&login, f, where, u, "username")) < 0 ||
	    (rc = pk8s_yget_str(&pass, f, where, u, "password")) < 0 ||
	    (rc = pk8s_yget_kind(&exec, f, where, u, "exec",
			    YAML_MAPPING_NODE)) < 0 ||
	    (rc = pk8s_yget_kind(&ap, f, where, u, "auth-provider",
			    YAML_MAPPING_NODE)) < 0)
		goto out;
	rc = -EINVAL;
	if (ap) {
		const char *apn = NULL;

		if (pk8s_yget_str(&apn, f, where, ap, "name") < 0)
			apn = NULL;
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: auth-provider '%s' is not supported "
			      "(kubectl dropped it too); use an exec "
			      "credential plugin such as "
			      "gke-gcloud-auth-plugin or kubelogin", where,
			      apn ? apn : "?");
		goto out;
	}
	if (login || pass) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: username/password (basic auth) is not "
			      "supported; use a token, a client certificate "
			      "or an exec plugin", where);
		goto out;
	}
	if (cert && cert_data) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: both client-certificate and "
			      "client-certificate-data are set; remove one",
			      where);
		goto out;
	}
	if (key && key_data) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: both client-key and client-key-data are "
			      "set; remove one", where);
		goto out;
	}
	if (!!(cert || cert_data) != !!(key || key_data)) {
		sbx_error_set(SBX_ERR_CONFIG, rc,
			      "%s: %s is set without %s", where,
			      cert || cert_data ? "a client certificate"
						: "a client key",
			      cert || cert_data ? "client-key(-data)"
						: "client-certificate(-data)");
		goto out;
	}
	rc = 0;
	if (cert_data)
		rc = pk8s_decode_pem_data(&k->st.cert_pem, &k->st.cert_pem_len, where,
				     "client-certificate-data", cert_data,
				     "-----BEGIN CERTIFICATE-----");
	else if (cert)
		rc = pk8s_read_pem_file(&k->st.cert_pem, &k->st.cert_pem_len, f, where,
				   "client-certificate", cert,
				   "-----BEGIN CERTIFICATE-----");
	if (rc < 0)
		goto out;
	if (key_data)
		rc = pk8s_decode_pem_data(&k->st.key_pem, &k->st.key_pem_len, where,
				     "client-key-data", key_data,
				     "PRIVATE KEY-----");
	else if (key)
		rc = pk8s_read_pem_file(&k->st.key_pem, &k->st.key_pem_len, f, where,
				   "client-key", key, "PRIVATE KEY-----");
	if (rc < 0)
		goto out;
	if (exec) {
		/* The plugin provides the token; token(File) is ignored. */
		rc = load_exec(k, f, where, exec);
		goto out;
	}
	if (token) {
		if (!pk8s_token_ok(token)) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "%s: 'token' contains spaces or "
					   "control characters", where);
			goto out;
		}
		k->st.bearer = sbx_xstrdup(token);
	}
	if (tfile) {
		k->token_file = pk8s_resolve(f, tfile);
		k->token_where = sbx_xasprintf("%s: tokenFile", where);
		rc = pk8s_token_file_read(&k->file_token, k->token_file,
				     k->token_where);
		if (rc < 0 && k->st.bearer) {
			/* client-go: the static token covers for the file. */
			sbx_error_clear();
			rc = 0;
		}
		clock_gettime(CLOCK_MONOTONIC, &k->file_at);
	}
out:
	free(where);
	return rc;
}

static int load_kubeconfig(struct sbx_kube_config *k, struct kload *L,
			   const struct sbx_kube_load_opts *o)
{
	const char *ctx_name = o->context && *o->context ? o->context : NULL;
	const char *cluster, *user = NULL, *ns;
	yaml_node_t *ctx, *cl, *us;
	struct kfile *cf, *lf, *uf;
	char *names = NULL, *where = NULL;
	int rc;

	for (size_t i = 0; i < L->n; i++)
		if ((rc = pk8s_kfile_parse(&L->f[i])) < 0)
			return rc;
	if (!ctx_name) {
		for (size_t i = 0; i < L->n && !ctx_name; i++) {
			rc = pk8s_yget_str(&ctx_name, &L->f[i], L->f[i].shown,
				      L->f[i].root, "current-context");
			if (rc < 0)
				return rc;
		}
		if (!ctx_name) {
			names = pk8s_list_names(L, "contexts");
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "%s: current-context is not set "
					   "(contexts: %s); use --context or "
					   "kubectl config use-context",
					   k->source, names);
			goto out;
		}
	}
	rc = pk8s_find_named(L, "contexts", "context", ctx_name, &ctx, &cf);
	if (rc < 0)
		goto out;
	if (rc == 0) {
		names = pk8s_list_names(L, "contexts");
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "%s: context '%s' not found (contexts: %s); "
				   "use --context or kubectl config "
				   "get-contexts", k->source, ctx_name, names);
		goto out;
	}
	k->context = sbx_xstrdup(ctx_name);
	where = sbx_xasprintf("%s: context '%s'", cf->shown, ctx_name);
	if ((rc = pk8s_yget_str(&cluster, cf, where, ctx, "cluster")) < 0 ||
	    (rc = pk8s_yget_str(&user, cf, where, ctx, "user")) < 0 ||
	    (rc = pk8s_yget_str(&ns, cf, where, ctx, "namespace")) < 0)
		goto out;
	if (!cluster) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: 'cluster' is not set", where);
		goto out;
	}
	rc = pk8s_find_named(L, "clusters", "cluster", cluster, &cl, &lf);
	if (rc < 0)
		goto out;
	if (rc == 0) {
		names = pk8s_list_names(L, "clusters");
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "%s: cluster '%s' not found in %s "
				   "(clusters: %s)", where, cluster, k->source,
				   names);
		goto out;
	}
	if ((rc = load_cluster(k, lf, cluster, cl)) < 0)
		goto out;
	if (user) {
		rc = pk8s_find_named(L, "users", "user", user, &us, &uf);
		if (rc < 0)
			goto out;
		if (rc == 0) {
			names = pk8s_list_names(L, "users");
			rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
					   "%s: user '%s' not found in %s "
					   "(users: %s)", where, user,
					   k->source, names);
			goto out;
		}
		if ((rc = load_user(k, uf, user, us)) < 0)
			goto out;
	}
	if (strncmp(k->server, "http://", 7) == 0 &&
	    (k->st.bearer || k->token_file || k->exec || k->st.cert_pem)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: server %s is plain http:// but user "
				   "'%s' has credentials; sbx sends "
				   "credentials only over https: use an "
				   "https:// server", where, k->server,
				   user ? user : "");
		goto out;
	}
	if (ns && !ns_ok(ns)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "%s: namespace '%s' is not a valid "
				   "namespace name (lowercase letters, digits "
				   "and '-', at most 63)", where, ns);
		goto out;
	}
	k->ns = sbx_xstrdup(ns ? ns : "default");
	rc = 0;
out:
	free(where);
	free(names);
	return rc;
}

static int load_incluster(struct sbx_kube_config *k,
			  const struct sbx_kube_load_opts *o)
{
	const char *host = getenv("KUBERNETES_SERVICE_HOST");
	const char *port = getenv("KUBERNETES_SERVICE_PORT");
	const char *dir = getenv("SBX_KUBE_SA_DIR");
	const char *pod_ns = getenv("POD_NAMESPACE");
	char *path = NULL, *nsfile = NULL, *shown = NULL;
	int rc;

	if (!dir || !*dir)
		dir = SA_DIR;
	k->source = pk8s_shown_path(dir);
	k->context = sbx_xstrdup("in-cluster");
	if (o->context && *o->context)
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "context '%s' requested but there is no "
				     "kubeconfig (only the in-cluster service "
				     "account); pass --kubeconfig or drop "
				     "--context", o->context);
	if (!port || !*port || strspn(port, "0123456789") != strlen(port) ||
	    strlen(port) > 5)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "in-cluster: KUBERNETES_SERVICE_HOST is "
				     "set but KUBERNETES_SERVICE_PORT is %s",
				     port && *port ? "not a port number"
						   : "not set");
	for (const char *p = host; *p; p++)
		if ((unsigned char)*p <= 0x20 || strchr("/?#@", *p))
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "in-cluster: "
					     "KUBERNETES_SERVICE_HOST '%s' is "
					     "not a host name or address",
					     host);
	if (strchr(host, ':') && host[0] != '[')
		k->server = sbx_xasprintf("https://[%s]:%s", host, port);
	else
		k->server = sbx_xasprintf("https://%s:%s", host, port);

	k->token_file = sbx_xasprintf("%s/token", dir);
	k->token_where = sbx_xstrdup("in-cluster service account");
	rc = pk8s_token_file_read(&k->file_token, k->token_file, k->token_where);
	if (rc < 0)
		return sbx_error_prefix(rc, "in-cluster (is "
				       "automountServiceAccountToken false "
				       "for this pod?)");
	clock_gettime(CLOCK_MONOTONIC, &k->file_at);

	path = sbx_xasprintf("%s/ca.crt", dir);
	rc = sbx_file_read(path, PEM_CAP, &k->st.ca_pem, &k->st.ca_pem_len);
	if (rc == -ENOENT) {
		sbx_error_clear(); /* client-go: system CAs then */
		rc = 0;
	} else if (rc < 0) {
		shown = pk8s_shown_path(path);
		rc = sbx_error_set(SBX_ERR_CONFIG, rc,
				   "in-cluster: %s cannot be read: %s", shown,
				   pk8s_why(rc));
		goto out;
	} else if (!pk8s_has(k->st.ca_pem, k->st.ca_pem_len,
			"-----BEGIN CERTIFICATE-----")) {
		shown = pk8s_shown_path(path);
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "in-cluster: %s is not PEM", shown);
		goto out;
	}

	if (o->namespace_override && *o->namespace_override) {
		k->ns = NULL; /* set by the caller */
	} else if (pod_ns && *pod_ns) {
		k->ns = sbx_xstrdup(pod_ns);
	} else {
		char *text = NULL;

		nsfile = sbx_xasprintf("%s/namespace", dir);
		if (sbx_file_read(nsfile, 4096, &text, NULL) == 0) {
			text[strcspn(text, " \t\r\n")] = '\0';
			if (*text)
				k->ns = sbx_xstrdup(text);
		} else {
			sbx_error_clear();
		}
		free(text);
		if (!k->ns)
			k->ns = sbx_xstrdup("default");
	}
	if (k->ns && !ns_ok(k->ns)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "in-cluster: namespace '%s' (POD_NAMESPACE "
				   "or the namespace file) is not a valid "
				   "namespace name", k->ns);
		goto out;
	}
	rc = 0;
out:
	free(shown);
	free(nsfile);
	free(path);
	return rc;
}

/* ---- public: load / free / getters --------------------------------------- */

void sbx_kube_config_free(struct sbx_kube_config *k)
{
	if (!k)
		return;
	free(k->server);
	free(k->ns);
	free(k->context);
	free(k->source);
	sbx_kube_creds_fini(&k->st);
	free(k->token_file);
	free(k->token_where);
	kexec_free(k->exec);
	wipe_str(k->file_token);
	sbx_kube_creds_fini(&k->ex);
	pthread_mutex_destroy(&k->lock);
	free(k);
}

int sbx_kube_config_load(struct sbx_kube_config **out,
			 const struct sbx_kube_load_opts *o)
{
	static const struct sbx_kube_load_opts defaults;
	const char *over;
	struct sbx_kube_config *k;
	struct kload L;
	int rc;

	SBX_ASSERT_ARG(out);
	*out = NULL;
	if (!o)
		o = &defaults;
	memset(&L, 0, sizeof(L));
	k = sbx_xcalloc(1, sizeof(*k));
	pthread_mutex_init(&k->lock, NULL);

	over = o->namespace_override && *o->namespace_override
		       ? o->namespace_override
		       : NULL;
	if (over && !ns_ok(over)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "namespace '%s' is not a valid namespace "
				   "name (lowercase letters, digits and '-', "
				   "at most 63)", over);
		goto out;
	}
	if ((rc = pk8s_collect_files(&L, o)) < 0)
		goto out;
	if (L.n) {
		struct sbx_buf b;

		sbx_buf_init(&b, 64 * 1024);
		for (size_t i = 0; i < L.n; i++)
			if (sbx_buf_addf(&b, "%s%s", i ? ":" : "",
					 L.f[i].shown) < 0)
				sbx_error_clear();
		k->source = sbx_buf_take(&b, NULL);
		rc = load_kubeconfig(k, &L, o);
	} else if (getenv("KUBERNETES_SERVICE_HOST") &&
		   *getenv("KUBERNETES_SERVICE_HOST")) {
		rc = load_incluster(k, o);
	} else {
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				   "no Kubernetes configuration: %s, and "
				   "KUBERNETES_SERVICE_HOST is not set (not "
				   "in a pod); pass --kubeconfig FILE or set "
				   "KUBECONFIG", L.tried);
	}
	if (rc < 0)
		goto out;
	if (over) {
		free(k->ns);
		k->ns = sbx_xstrdup(over);
	}
	*out = k;
	k = NULL;
out:
	sbx_kube_config_free(k);
	pk8s_kload_fini(&L);
	return rc;
}

const char *sbx_kube_server(const struct sbx_kube_config *k)
{
	return k ? k->server : NULL;
}

const char *sbx_kube_namespace(const struct sbx_kube_config *k)
{
	return k ? k->ns : NULL;
}

const char *sbx_kube_context_name(const struct sbx_kube_config *k)
{
	return k ? k->context : NULL;
}

const char *sbx_kube_source(const struct sbx_kube_config *k)
{
	return k ? k->source : NULL;
}

/* ---- public: credentials -------------------------------------------------- */

int sbx_kube_creds_get(struct sbx_kube_config *k, bool refresh,
		       struct sbx_kube_creds *out)
{
	const char *bearer = NULL, *cert = NULL, *key = NULL;
	size_t cert_len = 0, key_len = 0;
	time_t expires = 0;
	int rc = 0;

	SBX_ASSERT_ARG(out);
	memset(out, 0, sizeof(*out));
	SBX_ASSERT_ARG(k);
	pthread_mutex_lock(&k->lock);
	if (k->exec) {
		time_t now = time(NULL);

		if (!k->ex_have || refresh ||
		    (k->ex.expires && k->ex.expires - now <= EXPIRY_SLACK_S)) {
			rc = pk8s_exec_run(k);
			if (rc < 0)
				goto out;
		}
		bearer = k->ex.bearer;
		expires = k->ex.expires;
		if (k->ex.cert_pem) {
			cert = k->ex.cert_pem;
			cert_len = k->ex.cert_pem_len;
			key = k->ex.key_pem;
			key_len = k->ex.key_pem_len;
		}
	} else if (k->token_file) {
		struct timespec now;

		clock_gettime(CLOCK_MONOTONIC, &now);
		if (refresh || !k->file_token ||
		    now.tv_sec - k->file_at.tv_sec >= TOKEN_REREAD_S) {
			char *t = NULL;

			rc = pk8s_token_file_read(&t, k->token_file,
					     k->token_where);
			if (rc == 0) {
				wipe_str(k->file_token);
				k->file_token = t;
				k->file_at = now;
			} else if (k->file_token || k->st.bearer) {
				/* Keep the last good token (client-go). */
				sbx_error_clear();
				rc = 0;
			} else {
				goto out;
			}
		}
		bearer = k->file_token ? k->file_token : k->st.bearer;
	} else {
		bearer = k->st.bearer;
	}
	if (!cert && k->st.cert_pem) {
		cert = k->st.cert_pem;
		cert_len = k->st.cert_pem_len;
		key = k->st.key_pem;
		key_len = k->st.key_pem_len;
	}
	if (k->st.ca_pem) {
		out->ca_pem = pk8s_memdup0(k->st.ca_pem, k->st.ca_pem_len);
		out->ca_pem_len = k->st.ca_pem_len;
	}
	out->insecure = k->st.insecure;
	if (k->st.tls_server_name)
		out->tls_server_name = sbx_xstrdup(k->st.tls_server_name);
	if (bearer)
		out->bearer = sbx_xstrdup(bearer);
	if (cert) {
		out->cert_pem = pk8s_memdup0(cert, cert_len);
		out->cert_pem_len = cert_len;
		out->key_pem = pk8s_memdup0(key, key_len);
		out->key_pem_len = key_len;
	}
	out->expires = expires;
out:
	pthread_mutex_unlock(&k->lock);
	return rc;
}

void sbx_kube_creds_fini(struct sbx_kube_creds *c)
{
	if (!c)
		return;
	free(c->ca_pem);
	free(c->tls_server_name);
	wipe_str(c->bearer);
	free(c->cert_pem);
	pk8s_wipe_free(c->key_pem, c->key_pem_len);
	memset(c, 0, sizeof(*c));
}
