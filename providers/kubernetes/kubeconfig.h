/*
 * Kubernetes credentials, found the way kubectl finds them.
 *
 * Where the configuration comes from (first that applies):
 *   1. sbx_kube_load_opts.kubeconfig: that one file (it must exist);
 *   2. $KUBECONFIG: a colon-separated list of files, merged as kubectl
 *      merges them: files that do not exist are skipped; for each entry
 *      of clusters, users and contexts (by name) the FIRST file that
 *      defines the name wins; current-context comes from the first file
 *      that sets it;
 *   3. ~/.kube/config ($HOME, else the passwd entry);
 *   4. when none of those files exists and KUBERNETES_SERVICE_HOST is
 *      set: in-cluster, from the pod's service account.
 *
 * kubeconfig keys understood (YAML, parsed with libyaml):
 *   current-context
 *   contexts[].{name, context: {cluster, user, namespace}}
 *   clusters[].{name, cluster: {server, certificate-authority,
 *       certificate-authority-data, insecure-skip-tls-verify,
 *       tls-server-name}}
 *   users[].{name, user: {token, tokenFile, client-certificate,
 *       client-certificate-data, client-key, client-key-data,
 *       exec: {apiVersion, command, args, env[{name, value}],
 *              installHint, interactiveMode}}}
 * Other keys are ignored, except user.auth-provider and
 * user.username/password, which are refused with a message saying what
 * to use instead (sbx does not send them).  Relative file names (and
 * exec commands containing a '/') resolve against the directory of the
 * kubeconfig file that names them.  "-data" values are base64 of PEM.
 *
 * Rules kept as kubectl keeps them:
 *   - certificate-authority-data wins over certificate-authority;
 *     a CA together with insecure-skip-tls-verify is refused; so are
 *     client-certificate together with client-certificate-data (and the
 *     same for the key), and a certificate without a key;
 *   - tokenFile wins over token: the file is re-read (at most every
 *     60 s, or on refresh) and token is used only while the file cannot
 *     be read;
 *   - with exec the plugin provides the bearer token (token and tokenFile
 *     are then ignored) and, when it returns one, the client certificate
 *     (else client-certificate(-data) is used);
 *   - a server without a scheme gets "https://"; a server that is
 *     http:// together with any credential is refused (SBX_ERR_CONFIG,
 *     -EINVAL) rather than sending the credential in clear.
 *
 * Exec credential plugins run with the parent's environment plus exec.env
 * plus KUBERNETES_EXEC_INFO, stdin /dev/null, in their own process group,
 * for at most 30 s (then the group is killed); stdout (at most 1 MiB) is
 * an ExecCredential (client.authentication.k8s.io/v1 or v1beta1, matching
 * exec.apiVersion).  interactiveMode "Always" is refused (plugins never
 * get a terminal).  The plugin runs lazily, from sbx_kube_creds_get().
 *
 * In-cluster: server https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
 * (an IPv6 host is bracketed), token and ca.crt from
 * /var/run/secrets/kubernetes.io/serviceaccount/, namespace from
 * $POD_NAMESPACE, else the "namespace" file there, else "default".  The
 * token is re-read at most every 60 s (bound tokens rotate).  A missing
 * ca.crt means system CAs (as client-go does).
 *
 * Environment overrides for tests (not for users):
 *   SBX_KUBE_SA_DIR            the service-account directory instead of
 *                              /var/run/secrets/kubernetes.io/serviceaccount
 *   SBX_KUBE_EXEC_TIMEOUT_MS   the exec plugin timeout instead of 30000
 *
 * Errors: 0 or a negative errno with detail in sbx_error_last():
 *   -ENOENT  (CONFIG) no kubeconfig and not in a cluster; an explicit
 *            kubeconfig, a referenced file, or an exec command missing;
 *            unknown context / cluster / user (the message lists the
 *            names that exist);
 *   -EINVAL  (CONFIG) YAML syntax error (with line and column), a key of
 *            the wrong type, bad base64, data that is not PEM, http://
 *            with credentials, contradicting keys, no current-context;
 *   -EACCES, -EISDIR, -EFBIG ... (CONFIG) a file that cannot be read;
 *   exec plugin failures, from sbx_kube_creds_get(): -ENOENT/-EACCES
 *            (CONFIG) command missing / not executable; -EIO (CONFIG)
 *            non-zero exit or killed; -ETIMEDOUT (CONFIG) no answer in
 *            time; -EPROTO (SBX_ERR_JSON) output that is not a valid
 *            ExecCredential; -EFBIG (CONFIG) more than 1 MiB of output.
 *            Messages name the command, its exit status, the first line
 *            of its stderr and the installHint.
 * Messages name the file and the key, and never contain tokens or keys.
 *
 * Threads: every function is thread-safe; a config has an internal mutex
 * held while credentials are refreshed (so one plugin run at a time, and
 * concurrent callers wait for its result).
 */
#ifndef SBX_KUBECONFIG_H
#define SBX_KUBECONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "sbx/error.h"

/* A loaded configuration: opaque, thread-safe. */
struct sbx_kube_config;

struct sbx_kube_load_opts {
	/* Explicit file; NULL: $KUBECONFIG, ~/.kube/config, in-cluster. */
	const char *kubeconfig;
	/* Context to use; NULL: current-context.  Must be NULL in-cluster. */
	const char *context;
	/* Namespace; NULL: the context's namespace, else "default". */
	const char *namespace_override;
};

/*
 * Load the configuration described by `o` (NULL: all defaults) and select
 * one context.  Files are read now (certificate authorities, client
 * certificates, the token file); exec plugins run later.  *out is set only
 * on success; release it with sbx_kube_config_free().  Errors above.
 */
SBX_WUR int sbx_kube_config_load(struct sbx_kube_config **out,
				 const struct sbx_kube_load_opts *o);

/* Release a configuration (NULL is fine). */
void sbx_kube_config_free(struct sbx_kube_config *k);

/*
 * Getters; the strings are borrowed from `k` and live as long as it.
 *   server:  "https://10.0.0.1:6443", no trailing '/', may carry a path
 *            prefix ("https://host/k8s/clusters/c-1");
 *   namespace: never NULL;
 *   context_name: the selected context, "in-cluster" in a pod;
 *   source:  the file(s) it came from, for messages (home shown as "~",
 *            several files joined with ':'; in-cluster: the
 *            service-account directory).
 */
const char *sbx_kube_server(const struct sbx_kube_config *k);
const char *sbx_kube_namespace(const struct sbx_kube_config *k);
const char *sbx_kube_context_name(const struct sbx_kube_config *k);
const char *sbx_kube_source(const struct sbx_kube_config *k);

/*
 * A snapshot of the credentials, owned by the caller (release with
 * sbx_kube_creds_fini(), which also wipes the secrets).  The PEM buffers
 * are NUL-terminated and their lengths exclude the NUL.
 */
struct sbx_kube_creds {
	char *ca_pem;           /* CA bundle (PEM); NULL: system CAs */
	size_t ca_pem_len;
	bool insecure;          /* insecure-skip-tls-verify */
	char *tls_server_name;  /* or NULL */
	char *bearer;           /* bearer token; NULL: none */
	char *cert_pem;         /* client certificate (PEM); NULL: none */
	size_t cert_pem_len;
	char *key_pem;          /* its private key (PEM); NULL with cert_pem */
	size_t key_pem_len;
	time_t expires;         /* exec credential expiry; 0: none */
};

/*
 * Current credentials into *out (zeroed first; filled only on success).
 * Runs the exec plugin when it has no credential yet, when the cached one
 * expires within 10 s, or when `refresh` is true (the caller got a 401).
 * Re-reads the token file (tokenFile or in-cluster) when `refresh` is true
 * or at most every 60 s; if re-reading fails, the last good token is kept.
 * May block up to the exec timeout while holding the config's lock.
 * Errors: exec plugin failures (above); token file errors when no token
 * was ever read.
 */
SBX_WUR int sbx_kube_creds_get(struct sbx_kube_config *k, bool refresh,
			       struct sbx_kube_creds *out);

/* Wipe and free the snapshot's contents (NULL is fine); *c is zeroed. */
void sbx_kube_creds_fini(struct sbx_kube_creds *c);

#endif
