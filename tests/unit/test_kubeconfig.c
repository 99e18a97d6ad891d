/*
 * Kubernetes credentials (providers/kubernetes/kubeconfig.c): every form
 * a kubeconfig can take, $KUBECONFIG merging, ~/.kube/config, in-cluster,
 * exec credential plugins (small /bin/sh scripts), and the errors.  Each
 * test runs in a fresh temporary $HOME with the Kubernetes variables
 * cleared; nothing touches the network.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "sbx/error.h"
#include "sbx/proto.h"
#include "../../providers/kubernetes/kubeconfig.h"
#include "test_helpers_i.h"

#define CA "-----BEGIN CERTIFICATE-----\nMIIBfakeCA\n-----END CERTIFICATE-----\n"
#define CERT                                                                   \
	"-----BEGIN CERTIFICATE-----\nMIIBfakeCERT\n-----END CERTIFICATE-----\n"
#define KEY                                                                    \
	"-----BEGIN EC PRIVATE KEY-----\nMHcfakeKEY\n-----END EC PRIVATE "    \
	"KEY-----\n"
#define V1 "client.authentication.k8s.io/v1"

static const char *const cleared[] = {
	"KUBECONFIG",       "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
	"POD_NAMESPACE",    "SBX_KUBE_SA_DIR",         "SBX_KUBE_EXEC_TIMEOUT_MS",
	NULL,
};

static char *tmp;      /* this test's directory, also $HOME */
static char *old_home;

TH_HOME_FIXTURE(tmp, old_home, cleared)

/* ---- helpers --------------------------------------------------------------- */

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));

static char *fmt(const char *f, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, f);
	if (vasprintf(&s, f, ap) < 0)
		abort();
	va_end(ap);
	return s;
}

/* Write tmp/<rel> (directories created); returns the path (free it). */
static char *put(const char *rel, const char *text)
{
	char *path = fmt("%s/%s", tmp, rel);

	for (char *p = path + strlen(tmp) + 1; *p; p++) {
		if (*p == '/') {
			*p = '\0';
			mkdir(path, 0700);
			*p = '/';
		}
	}
	th_write(path, text);
	return path;
}

static char *put_script(const char *rel, const char *body)
{
	char *text = fmt("#!/bin/sh\n%s", body);
	char *path = put(rel, text);

	free(text);
	chmod(path, 0755);
	return path;
}

static char *b64(const char *s)
{
	return sbx_proto_base64_encode(s, strlen(s));
}

static char *slurp(const char *rel)
{
	char *path = fmt("%s/%s", tmp, rel), buf[4096];
	FILE *f = fopen(path, "r");
	size_t n = 0;

	free(path);
	if (!f)
		return strdup("");
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	return strdup(buf);
}

static int load(struct sbx_kube_config **k, const char *file,
		const char *ctx, const char *ns)
{
	struct sbx_kube_load_opts o = {
		.kubeconfig = file, .context = ctx, .namespace_override = ns
	};

	sbx_error_clear();
	return sbx_kube_config_load(k, &o);
}

static const char *msg(void)
{
	return sbx_error_last()->msg;
}

#define assert_msg_has(s)                                                      \
	do {                                                                   \
		if (!strstr(msg(), (s)))                                       \
			fail_msg("message \"%s\" lacks \"%s\"", msg(), (s));   \
	} while (0)

#define assert_msg_lacks(s)                                                    \
	do {                                                                   \
		if (strstr(msg(), (s)))                                        \
			fail_msg("message \"%s\" has \"%s\"", msg(), (s));     \
	} while (0)

/* Expect a load failure with `code` and a message containing `want`. */
static void load_fails(const char *yaml, int code, const char *want)
{
	struct sbx_kube_config *k = (void *)1;
	char *path = put("bad.yaml", yaml);

	assert_int_equal(load(&k, path, NULL, NULL), code);
	assert_null(k);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_int_equal(sbx_error_last()->code, code);
	assert_msg_has(want);
	assert_msg_has("bad.yaml");
	free(path);
}

/* A kubeconfig with one cluster, one user and one context "c". */
static char *simple(const char *cluster, const char *user, const char *ctx)
{
	return fmt("apiVersion: v1\nkind: Config\n"
		   "current-context: c\n"
		   "clusters:\n- name: cl\n  cluster:\n%s"
		   "users:\n- name: u\n  user:\n%s"
		   "contexts:\n- name: c\n  context:\n"
		   "    cluster: cl\n    user: u\n%s",
		   cluster, user, ctx);
}

/* ---- static forms ------------------------------------------------------------ */

static void test_token_and_ca_data(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *ca = b64(CA), *cl, *yaml, *path;

	cl = fmt("    server: https://10.0.0.1:6443/\n"
		 "    certificate-authority-data: %s\n"
		 "    tls-server-name: api.example.com\n", ca);
	yaml = simple(cl, "    token: abc.def-ghi\n",
		      "    namespace: team-a\n");
	path = put("k.yaml", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_string_equal(sbx_kube_server(k), "https://10.0.0.1:6443");
	assert_string_equal(sbx_kube_namespace(k), "team-a");
	assert_string_equal(sbx_kube_context_name(k), "c");
	assert_string_equal(sbx_kube_source(k), "~/k.yaml");

	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "abc.def-ghi");
	assert_string_equal(c.ca_pem, CA);
	assert_int_equal(c.ca_pem_len, strlen(CA));
	assert_string_equal(c.tls_server_name, "api.example.com");
	assert_false(c.insecure);
	assert_null(c.cert_pem);
	assert_null(c.key_pem);
	assert_int_equal(c.expires, 0);
	sbx_kube_creds_fini(&c);
	assert_null(c.bearer);
	sbx_kube_creds_fini(NULL);
	sbx_kube_config_free(k);
	sbx_kube_config_free(NULL);
	free(path);
	free(yaml);
	free(cl);
	free(ca);
}

static void test_ca_data_with_line_breaks_and_bare_host(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *ca = b64(CA), *cl, *yaml, *path;

	/* A block scalar keeps the line breaks; they are ignored. */
	cl = fmt("    server: 10.0.0.2:6443\n"
		 "    certificate-authority-data: |\n      %.20s\n      %s\n",
		 ca, ca + 20);
	yaml = simple(cl, "    {}\n", "");
	path = put("k.yaml", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_string_equal(sbx_kube_server(k), "https://10.0.0.2:6443");
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.ca_pem, CA);
	assert_null(c.bearer);
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(cl);
	free(ca);
}

static void test_token_file_and_ca_file_relative(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *yaml, *path, *tok, *ca;

	ca = put("conf/certs/ca.pem", CA);
	tok = put("conf/secret/tok", "  first-token\n");
	yaml = simple("    server: https://k8s.example.com/prefix\n"
		      "    certificate-authority: certs/ca.pem\n",
		      "    tokenFile: secret/tok\n", "");
	path = put("conf/kubeconfig", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_string_equal(sbx_kube_server(k),
			    "https://k8s.example.com/prefix");
	assert_string_equal(sbx_kube_namespace(k), "default");
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "first-token");
	assert_string_equal(c.ca_pem, CA);
	sbx_kube_creds_fini(&c);

	/* Rotated: not re-read within 60 s, re-read on refresh. */
	th_write(tok, "second-token\n");
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "first-token");
	sbx_kube_creds_fini(&c);
	assert_int_equal(sbx_kube_creds_get(k, true, &c), 0);
	assert_string_equal(c.bearer, "second-token");
	sbx_kube_creds_fini(&c);

	/* Unreadable later: the last good token is kept. */
	unlink(tok);
	assert_int_equal(sbx_kube_creds_get(k, true, &c), 0);
	assert_string_equal(c.bearer, "second-token");
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);

	/* Unreadable at load: an error naming the file and the key. */
	assert_int_equal(load(&k, path, NULL, NULL), -ENOENT);
	assert_null(k);
	assert_msg_has("user 'u': tokenFile");
	assert_msg_has("conf/secret/tok");
	free(path);
	free(yaml);
	free(tok);
	free(ca);
}

static void test_token_file_wins_over_token(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *yaml, *path, *tok;

	tok = put("tok", "from-file\n");
	yaml = simple("    server: https://h\n",
		      "    token: static-token\n    tokenFile: tok\n", "");
	path = put("k.yaml", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "from-file");
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);

	/* Without the file, the static token covers for it. */
	unlink(tok);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, true, &c), 0);
	assert_string_equal(c.bearer, "static-token");
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(tok);
}

static void test_client_cert_files_and_data(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *cd = b64(CERT), *kd = b64(KEY), *yaml, *path, *p1, *p2;

	p1 = put("conf/pki/client.crt", CERT);
	p2 = put("conf/pki/client.key", KEY);
	yaml = fmt("clusters:\n"
		   "- name: cl\n  cluster:\n    server: https://h:6443\n"
		   "    insecure-skip-tls-verify: true\n"
		   "users:\n"
		   "- name: files\n  user:\n"
		   "    client-certificate: pki/client.crt\n"
		   "    client-key: pki/client.key\n"
		   "- name: data\n  user:\n"
		   "    client-certificate-data: %s\n"
		   "    client-key-data: %s\n"
		   "contexts:\n"
		   "- name: by-file\n  context: {cluster: cl, user: files}\n"
		   "- name: by-data\n  context: {cluster: cl, user: data}\n",
		   cd, kd);
	path = put("conf/config", yaml);

	assert_int_equal(load(&k, path, "by-file", NULL), 0);
	assert_string_equal(sbx_kube_context_name(k), "by-file");
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_true(c.insecure);
	assert_null(c.ca_pem);
	assert_null(c.bearer);
	assert_string_equal(c.cert_pem, CERT);
	assert_int_equal(c.cert_pem_len, strlen(CERT));
	assert_string_equal(c.key_pem, KEY);
	assert_int_equal(c.key_pem_len, strlen(KEY));
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);

	assert_int_equal(load(&k, path, "by-data", NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.cert_pem, CERT);
	assert_string_equal(c.key_pem, KEY);
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(p1);
	free(p2);
	free(cd);
	free(kd);
}

static void test_context_and_namespace(void **state)
{
	struct sbx_kube_config *k = NULL;
	char *path;

	path = put("k.yaml",
		   "current-context: a\n"
		   "clusters:\n"
		   "- name: one\n  cluster: {server: 'https://one'}\n"
		   "- name: two\n  cluster: {server: \"https://two\"}\n"
		   "contexts:\n"
		   "- name: a\n  context: {cluster: one, namespace: ns-a}\n"
		   "- name: b\n  context: {cluster: two}\n");
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_string_equal(sbx_kube_context_name(k), "a");
	assert_string_equal(sbx_kube_server(k), "https://one");
	assert_string_equal(sbx_kube_namespace(k), "ns-a");
	sbx_kube_config_free(k);

	assert_int_equal(load(&k, path, "b", NULL), 0);
	assert_string_equal(sbx_kube_context_name(k), "b");
	assert_string_equal(sbx_kube_server(k), "https://two");
	assert_string_equal(sbx_kube_namespace(k), "default");
	sbx_kube_config_free(k);

	assert_int_equal(load(&k, path, "a", "override"), 0);
	assert_string_equal(sbx_kube_namespace(k), "override");
	sbx_kube_config_free(k);

	assert_int_equal(load(&k, path, NULL, "Bad/NS"), -EINVAL);
	assert_null(k);
	assert_msg_has("namespace 'Bad/NS'");
	free(path);
}

static void test_unknown_context_lists_names(void **state)
{
	struct sbx_kube_config *k = NULL;
	char *path;

	path = put(".kube/config",
		   "current-context: a\n"
		   "clusters:\n- name: one\n  cluster: {server: https://one}\n"
		   "contexts:\n"
		   "- name: a\n  context: {cluster: one}\n"
		   "- name: b\n  context: {cluster: one}\n");
	assert_int_equal(load(&k, NULL, "x", NULL), -ENOENT);
	assert_null(k);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_string_equal(msg(),
			    "~/.kube/config: context 'x' not found (contexts: "
			    "a, b); use --context or kubectl config "
			    "get-contexts");
	free(path);
}

static void test_home_default(void **state)
{
	struct sbx_kube_config *k = NULL;
	char *path;

	/* Nothing at all: a message saying where it looked. */
	assert_int_equal(sbx_kube_config_load(&k, NULL), -ENOENT);
	assert_null(k);
	assert_msg_has("~/.kube/config does not exist");
	assert_msg_has("KUBERNETES_SERVICE_HOST");

	path = put(".kube/config",
		   "current-context: home\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://home}\n"
		   "contexts:\n- name: home\n  context: {cluster: cl}\n");
	assert_int_equal(sbx_kube_config_load(&k, NULL), 0);
	assert_string_equal(sbx_kube_context_name(k), "home");
	assert_string_equal(sbx_kube_server(k), "https://home");
	assert_string_equal(sbx_kube_source(k), "~/.kube/config");
	sbx_kube_config_free(k);
	free(path);
}

static void test_kubeconfig_env_merge(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *f1, *f2, *tok, *env, *src;

	/* File 1: no current-context; defines "shared" and cluster one. */
	f1 = put("a/first.yaml",
		 "clusters:\n- name: one\n  cluster: {server: https://one}\n"
		 "contexts:\n- name: shared\n"
		 "  context: {cluster: one, namespace: from-first}\n");
	/* File 2: current-context; "shared" and "one" again (ignored). */
	f2 = put("b/second.yaml",
		 "current-context: shared\n"
		 "clusters:\n"
		 "- name: one\n  cluster: {server: https://other}\n"
		 "- name: two\n  cluster: {server: https://two}\n"
		 "users:\n- name: u2\n  user: {tokenFile: tok}\n"
		 "contexts:\n"
		 "- name: shared\n  context: {cluster: two}\n"
		 "- name: only2\n  context: {cluster: two, user: u2}\n");
	tok = put("b/tok", "tok-from-b\n");
	env = fmt("%s/missing.yaml::%s:%s", tmp, f1, f2);
	setenv("KUBECONFIG", env, 1);

	assert_int_equal(sbx_kube_config_load(&k, NULL), 0);
	assert_string_equal(sbx_kube_context_name(k), "shared");
	assert_string_equal(sbx_kube_server(k), "https://one");
	assert_string_equal(sbx_kube_namespace(k), "from-first");
	src = fmt("~/a/first.yaml:~/b/second.yaml");
	assert_string_equal(sbx_kube_source(k), src);
	sbx_kube_config_free(k);

	/* tokenFile resolves against the directory of the file naming it. */
	{
		struct sbx_kube_load_opts o = { .context = "only2" };

		assert_int_equal(sbx_kube_config_load(&k, &o), 0);
	}
	assert_string_equal(sbx_kube_server(k), "https://two");
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "tok-from-b");
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);

	/* None of the listed files exists. */
	setenv("KUBECONFIG", "/nonexistent/x:/nonexistent/y", 1);
	assert_int_equal(sbx_kube_config_load(&k, NULL), -ENOENT);
	assert_msg_has("none of the files in KUBECONFIG");
	free(src);
	free(env);
	free(tok);
	free(f1);
	free(f2);
}

/* ---- in-cluster --------------------------------------------------------------- */

static void test_incluster(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *sa = fmt("%s/sa", tmp), *p1, *p2, *p3;

	p1 = put("sa/token", "sa-token-1\n");
	p2 = put("sa/ca.crt", CA);
	p3 = put("sa/namespace", "pod-ns\n");
	setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	setenv("SBX_KUBE_SA_DIR", sa, 1);

	assert_int_equal(sbx_kube_config_load(&k, NULL), 0);
	assert_string_equal(sbx_kube_server(k), "https://[fd00::1]:443");
	assert_string_equal(sbx_kube_context_name(k), "in-cluster");
	assert_string_equal(sbx_kube_namespace(k), "pod-ns");
	assert_string_equal(sbx_kube_source(k), "~/sa");
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "sa-token-1");
	assert_string_equal(c.ca_pem, CA);
	assert_null(c.cert_pem);
	sbx_kube_creds_fini(&c);

	/* Bound tokens rotate: re-read on refresh. */
	th_write(p1, "sa-token-2");
	assert_int_equal(sbx_kube_creds_get(k, true, &c), 0);
	assert_string_equal(c.bearer, "sa-token-2");
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);

	/* POD_NAMESPACE beats the file, the override beats both. */
	setenv("POD_NAMESPACE", "env-ns", 1);
	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
	assert_int_equal(sbx_kube_config_load(&k, NULL), 0);
	assert_string_equal(sbx_kube_server(k), "https://10.96.0.1:443");
	assert_string_equal(sbx_kube_namespace(k), "env-ns");
	sbx_kube_config_free(k);
	assert_int_equal(load(&k, NULL, NULL, "mine"), 0);
	assert_string_equal(sbx_kube_namespace(k), "mine");
	sbx_kube_config_free(k);

	/* A context cannot be chosen in-cluster. */
	assert_int_equal(load(&k, NULL, "prod", NULL), -ENOENT);
	assert_msg_has("context 'prod'");

	/* No token: a clear error. */
	unlink(p1);
	assert_int_equal(sbx_kube_config_load(&k, NULL), -ENOENT);
	assert_null(k);
	assert_msg_has("in-cluster");
	assert_msg_has("sa/token");

	/* A kubeconfig, when there is one, wins over in-cluster. */
	free(p1);
	p1 = put(".kube/config",
		 "current-context: c\n"
		 "clusters:\n- name: cl\n  cluster: {server: https://kc}\n"
		 "contexts:\n- name: c\n  context: {cluster: cl}\n");
	assert_int_equal(sbx_kube_config_load(&k, NULL), 0);
	assert_string_equal(sbx_kube_server(k), "https://kc");
	sbx_kube_config_free(k);
	free(p1);
	free(p2);
	free(p3);
	free(sa);
}

/* ---- exec plugins -------------------------------------------------------------- */

/* Counts its runs in $CNT, records $1 and its environment, prints a token. */
#define COUNTING_PLUGIN                                                        \
	"n=$(cat \"$CNT\" 2>/dev/null || echo 0)\n"                            \
	"n=$((n+1))\n"                                                         \
	"echo $n > \"$CNT\"\n"                                                 \
	"printf '%s|%s|%s' \"$1\" \"$EXTRA\" \"$KUBERNETES_EXEC_INFO\" "       \
	"> \"$CNT.seen\"\n"                                                    \
	"printf '{\"apiVersion\":\"" V1 "\",\"kind\":\"ExecCredential\","     \
	"\"status\":{\"token\":\"tok-%s\",\"expirationTimestamp\":\"%s\"}}' " \
	"$n \"$EXP\"\n"

static char *exec_config(const char *command, const char *exp,
			 const char *extra)
{
	return fmt("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "users:\n- name: u\n  user:\n    exec:\n"
		   "      apiVersion: " V1 "\n"
		   "      command: %s\n"
		   "      args: [first-arg, second]\n"
		   "      interactiveMode: IfAvailable\n"
		   "      installHint: |\n        Install the plugin from "
		   "example.com\n        and log in.\n"
		   "      env:\n"
		   "      - {name: CNT, value: %s/count}\n"
		   "      - {name: EXP, value: '%s'}\n"
		   "      - {name: EXTRA, value: old}\n"
		   "      - {name: EXTRA, value: new}\n%s"
		   "contexts:\n- name: c\n  context: {cluster: cl, user: u}\n",
		   command, tmp, exp, extra ? extra : "");
}

static void test_exec_expired_reruns(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *plug, *yaml, *path, *s;

	plug = put_script("conf/bin/plug.sh", COUNTING_PLUGIN);
	yaml = exec_config("./bin/plug.sh", "2000-01-01T00:00:00Z", NULL);
	path = put("conf/config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);

	s = slurp("count");
	assert_string_equal(s, ""); /* not run at load */
	free(s);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "tok-1");
	assert_int_equal(c.expires, 946684800);
	sbx_kube_creds_fini(&c);

	/* Already expired: the second get runs the plugin again. */
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "tok-2");
	sbx_kube_creds_fini(&c);
	s = slurp("count");
	assert_string_equal(s, "2\n");
	free(s);

	/* Args, exec.env (the last duplicate wins) and the exec info. */
	s = slurp("count.seen");
	assert_string_equal(s, "first-arg|new|{\"apiVersion\":\"" V1
			       "\",\"kind\":\"ExecCredential\",\"spec\":"
			       "{\"interactive\":false}}");
	free(s);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(plug);
}

static void test_exec_cached_until_refresh(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *plug, *yaml, *path, *s;

	plug = put_script("plug.sh", COUNTING_PLUGIN);
	/* An absolute command; a far expiry with an offset and fraction. */
	yaml = exec_config(plug, "2099-01-01T01:00:00.5+01:00", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "tok-1");
	assert_int_equal(c.expires, 4070908800);
	sbx_kube_creds_fini(&c);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_string_equal(c.bearer, "tok-1");
	sbx_kube_creds_fini(&c);
	s = slurp("count");
	assert_string_equal(s, "1\n");
	free(s);

	/* The caller got a 401: refresh runs it again. */
	assert_int_equal(sbx_kube_creds_get(k, true, &c), 0);
	assert_string_equal(c.bearer, "tok-2");
	sbx_kube_creds_fini(&c);
	s = slurp("count");
	assert_string_equal(s, "2\n");
	free(s);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(plug);
}

/* Concurrent callers share one plugin run and get the same token. */
static void *creds_thread(void *arg)
{
	struct sbx_kube_creds c;
	long ok = 0;

	for (int i = 0; i < 20; i++) {
		if (sbx_kube_creds_get(arg, false, &c) == 0 && c.bearer &&
		    strcmp(c.bearer, "tok-1") == 0)
			ok++;
		sbx_kube_creds_fini(&c);
	}
	return (void *)ok;
}

static void test_exec_threads(void **state)
{
	struct sbx_kube_config *k = NULL;
	pthread_t th[6];
	char *plug, *yaml, *path, *s;

	plug = put_script("plug.sh", COUNTING_PLUGIN);
	yaml = exec_config(plug, "2099-01-01T00:00:00Z", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	for (size_t i = 0; i < 6; i++)
		assert_int_equal(pthread_create(&th[i], NULL, creds_thread, k),
				 0);
	for (size_t i = 0; i < 6; i++) {
		void *ok = NULL;

		pthread_join(th[i], &ok);
		assert_int_equal((long)ok, 20);
	}
	s = slurp("count");
	assert_string_equal(s, "1\n");
	free(s);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(plug);
}

static void test_exec_failures(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *p1, *p2, *p3, *yaml, *path;

	p1 = put_script("fail.sh",
			"echo \"error: run 'foo login' first\" >&2\n"
			"echo 'second line' >&2\n"
			"echo '{\"secret\":\"do-not-show\"}'\n"
			"exit 3\n");
	p2 = put_script("garbage.sh", "echo 'sekrit-output not json'\n");
	p3 = put_script("notoken.sh",
			"echo '{\"apiVersion\":\"" V1 "\","
			"\"kind\":\"ExecCredential\",\"status\":{}}'\n");

	yaml = exec_config(p1, "", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), -EIO);
	assert_null(c.bearer);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_msg_has("user 'u'");
	assert_msg_has("fail.sh");
	assert_msg_has("exit status 3");
	assert_msg_has("error: run 'foo login' first");
	assert_msg_has("Install the plugin from example.com and log in.");
	assert_msg_lacks("second line");
	assert_msg_lacks("do-not-show");
	sbx_kube_config_free(k);
	free(path);
	free(yaml);

	yaml = exec_config(p2, "", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), -EPROTO);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_JSON);
	assert_msg_has("garbage.sh");
	assert_msg_has("not a JSON ExecCredential");
	assert_msg_has("Install the plugin");
	assert_msg_lacks("sekrit");
	sbx_kube_config_free(k);
	free(path);
	free(yaml);

	yaml = exec_config(p3, "", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), -EPROTO);
	assert_msg_has("neither status.token nor");
	sbx_kube_config_free(k);
	free(path);
	free(yaml);

	yaml = exec_config("sbx-no-such-plugin-4711", "", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), -ENOENT);
	assert_msg_has("'sbx-no-such-plugin-4711' was not found in PATH");
	assert_msg_has("Install the plugin from example.com");
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(p1);
	free(p2);
	free(p3);
}

static void test_exec_timeout(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *plug, *yaml, *path;
	time_t t0;

	plug = put_script("slow.sh", "echo 'waiting for login' >&2\n"
				     "sleep 20\n");
	yaml = exec_config(plug, "", NULL);
	path = put("config", yaml);
	setenv("SBX_KUBE_EXEC_TIMEOUT_MS", "300", 1);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	t0 = time(NULL);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), -ETIMEDOUT);
	assert_true(time(NULL) - t0 < 10);
	assert_msg_has("slow.sh");
	assert_msg_has("did not finish");
	assert_msg_has("waiting for login");
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(plug);
}

static void test_exec_client_cert(void **state)
{
	struct sbx_kube_config *k = NULL;
	struct sbx_kube_creds c;
	char *plug, *yaml, *path;

	plug = put_script("cert.sh",
			  "printf '{\"apiVersion\":\"" V1 "\","
			  "\"kind\":\"ExecCredential\",\"status\":{"
			  "\"clientCertificateData\":\"-----BEGIN "
			  "CERTIFICATE-----\\\\nMIIBx\\\\n-----END "
			  "CERTIFICATE-----\\\\n\",\"clientKeyData\":"
			  "\"-----BEGIN PRIVATE KEY-----\\\\nMIGk\\\\n"
			  "-----END PRIVATE KEY-----\\\\n\"}}'\n");
	yaml = exec_config(plug, "", NULL);
	path = put("config", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_int_equal(sbx_kube_creds_get(k, false, &c), 0);
	assert_null(c.bearer);
	assert_string_equal(c.cert_pem, "-----BEGIN CERTIFICATE-----\nMIIBx\n"
					"-----END CERTIFICATE-----\n");
	assert_int_equal(c.cert_pem_len, strlen(c.cert_pem));
	assert_string_equal(c.key_pem, "-----BEGIN PRIVATE KEY-----\nMIGk\n"
				       "-----END PRIVATE KEY-----\n");
	assert_int_equal(c.expires, 0);
	sbx_kube_creds_fini(&c);
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
	free(plug);
}

static void test_exec_config_errors(void **state)
{
	load_fails("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "users:\n- name: u\n  user:\n    exec:\n"
		   "      apiVersion: client.authentication.k8s.io/v1alpha1\n"
		   "      command: x\n"
		   "contexts:\n- name: c\n  context: {cluster: cl, user: u}\n",
		   -EINVAL, "apiVersion 'client.authentication.k8s.io/v1alpha1'");
	load_fails("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "users:\n- name: u\n  user:\n    exec:\n"
		   "      apiVersion: " V1 "\n      command: x\n"
		   "contexts:\n- name: c\n  context: {cluster: cl, user: u}\n",
		   -EINVAL, "'interactiveMode' must be set");
	load_fails("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "users:\n- name: u\n  user:\n    exec:\n"
		   "      apiVersion: " V1 "\n      command: x\n"
		   "      interactiveMode: Always\n"
		   "contexts:\n- name: c\n  context: {cluster: cl, user: u}\n",
		   -EINVAL, "interactiveMode Always needs a terminal");
	load_fails("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "users:\n- name: u\n  user:\n"
		   "    auth-provider: {name: gcp}\n"
		   "contexts:\n- name: c\n  context: {cluster: cl, user: u}\n",
		   -EINVAL, "auth-provider 'gcp' is not supported");
}

/* ---- errors ---------------------------------------------------------------------- */

static void test_http_with_credentials_refused(void **state)
{
	struct sbx_kube_config *k = NULL;
	char *yaml, *path;

	yaml = simple("    server: http://127.0.0.1:8080\n",
		      "    token: super-secret-token\n", "");
	load_fails(yaml, -EINVAL, "http://127.0.0.1:8080 is plain http://");
	assert_msg_has("https");
	assert_msg_lacks("super-secret-token");
	free(yaml);

	/* Without credentials plain http is allowed (kubectl proxy). */
	yaml = simple("    server: http://127.0.0.1:8001\n", "    {}\n", "");
	path = put("ok.yaml", yaml);
	assert_int_equal(load(&k, path, NULL, NULL), 0);
	assert_string_equal(sbx_kube_server(k), "http://127.0.0.1:8001");
	sbx_kube_config_free(k);
	free(path);
	free(yaml);
}

static void test_yaml_syntax_error(void **state)
{
	load_fails("current-context: c\n"
		   "clusters:\n"
		   "  - name: x\n"
		   "   bad: [\n",
		   -EINVAL, "YAML syntax error at line 4");
	load_fails("a: 'unterminated\n", -EINVAL, "YAML syntax error");
	load_fails("just a string\n", -EINVAL, "not a kubeconfig");
}

static void test_bad_entries(void **state)
{
	struct sbx_kube_config *k = NULL;
	char *yaml, *path;

	yaml = simple("    server: https://h\n"
		      "    certificate-authority-data: '!!notbase64!!'\n",
		      "    {}\n", "");
	load_fails(yaml, -EINVAL,
		   "cluster 'cl': certificate-authority-data is not valid "
		   "base64");
	free(yaml);

	yaml = simple("    server: https://h\n"
		      "    certificate-authority: missing-ca.pem\n",
		      "    {}\n", "");
	load_fails(yaml, -ENOENT, "certificate-authority");
	assert_msg_has("missing-ca.pem");
	free(yaml);

	yaml = simple("    server: https://h\n"
		      "    certificate-authority-data: aGVsbG8=\n",
		      "    {}\n", "");
	load_fails(yaml, -EINVAL, "does not decode to PEM");
	free(yaml);

	yaml = simple("    server: https://h\n    insecure-skip-tls-verify: "
		      "maybe\n", "    {}\n", "");
	load_fails(yaml, -EINVAL, "'insecure-skip-tls-verify' must be true");
	free(yaml);

	yaml = simple("    server: [https://h]\n", "    {}\n", "");
	load_fails(yaml, -EINVAL, "cluster 'cl': 'server' must be a string");
	free(yaml);

	yaml = simple("    certificate-authority-data: x\n", "    {}\n", "");
	load_fails(yaml, -EINVAL, "cluster 'cl': 'server' is not set");
	free(yaml);

	yaml = simple("    server: https://h\n",
		      "    client-certificate-data: eA==\n", "");
	load_fails(yaml, -EINVAL, "without client-key");
	free(yaml);

	yaml = simple("    server: https://h\n",
		      "    token: \"has space\"\n", "");
	load_fails(yaml, -EINVAL, "'token' contains spaces");
	assert_msg_lacks("has space");
	free(yaml);

	load_fails("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "contexts:\n- name: c\n  context: {cluster: nope}\n",
		   -ENOENT, "cluster 'nope' not found");
	assert_msg_has("(clusters: cl)");
	load_fails("current-context: c\n"
		   "clusters:\n- name: cl\n  cluster: {server: https://h}\n"
		   "users:\n- name: a\n  user: {}\n"
		   "contexts:\n- name: c\n  context: {cluster: cl, user: z}\n",
		   -ENOENT, "user 'z' not found");
	assert_msg_has("(users: a)");
	load_fails("contexts:\n- name: a\n  context: {cluster: cl}\n", -EINVAL,
		   "current-context is not set (contexts: a)");
	load_fails("", -EINVAL, "current-context is not set (contexts: none)");

	/* An explicit file that is missing. */
	path = fmt("%s/nope.yaml", tmp);
	assert_int_equal(load(&k, path, NULL, NULL), -ENOENT);
	assert_msg_has("~/nope.yaml");
	free(path);
}

/* Odd documents must fail cleanly (no crash, no leak). */
static void test_odd_documents(void **state)
{
	static const char *const docs[] = {
		"clusters: 5\ncurrent-context: c\n",
		"current-context: [a]\n",
		"current-context: c\ncontexts: [1, 2]\n",
		"current-context: c\ncontexts: {a: b}\n",
		"current-context: c\ncontexts:\n- name: c\n  context: [x]\n",
		"current-context: c\ncontexts: &a\n- *a\n",
		"current-context: c\ncontexts:\n- name: c\n  context: &x "
		"{cluster: *x}\n",
		"current-context: \"a\\0b\"\n",
		"current-context: c\n---\nsecond: doc\n",
		"\xff\xfe garbage",
		"current-context: c\ncontexts:\n- name: c\n  context: "
		"{cluster: c}\nclusters:\n- name: c\n  cluster: {server: "
		"'ftp://h'}\n",
		"current-context: c\ncontexts:\n- name: c\n  context: "
		"{cluster: c}\nclusters:\n- name: c\n  cluster: {server: "
		"'https:///path'}\n",
		"current-context: c\ncontexts:\n- name: c\n  context: "
		"{cluster: c, user: u}\nclusters:\n- name: c\n  cluster: "
		"{server: 'https://h'}\nusers:\n- name: u\n  user: {exec: "
		"{command: x, apiVersion: " V1 ", interactiveMode: Never, "
		"args: [[1]]}}\n",
		"current-context: c\ncontexts:\n- name: c\n  context: "
		"{cluster: c, user: u}\nclusters:\n- name: c\n  cluster: "
		"{server: 'https://h'}\nusers:\n- name: u\n  user: {exec: "
		"{command: x, apiVersion: " V1 ", interactiveMode: Never, "
		"env: [{value: 1}]}}\n",
	};

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
		struct sbx_kube_config *k = (void *)1;
		char *path = put("odd.yaml", docs[i]);
		int rc = load(&k, path, NULL, NULL);

		if (rc >= 0)
			fail_msg("document %zu loaded", i);
		assert_null(k);
		assert_int_equal(sbx_error_last()->code, rc);
		assert_true(strlen(msg()) > 0);
		free(path);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
		T(test_token_and_ca_data),
		T(test_ca_data_with_line_breaks_and_bare_host),
		T(test_token_file_and_ca_file_relative),
		T(test_token_file_wins_over_token),
		T(test_client_cert_files_and_data),
		T(test_context_and_namespace),
		T(test_unknown_context_lists_names),
		T(test_home_default),
		T(test_kubeconfig_env_merge),
		T(test_incluster),
		T(test_exec_expired_reruns),
		T(test_exec_cached_until_refresh),
		T(test_exec_threads),
		T(test_exec_failures),
		T(test_exec_timeout),
		T(test_exec_client_cert),
		T(test_exec_config_errors),
		T(test_http_with_credentials_refused),
		T(test_yaml_syntax_error),
		T(test_bad_entries),
		T(test_odd_documents),
#undef T
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
