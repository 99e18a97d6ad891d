/*
 * The kubernetes provider: one pod per session (docs/providers.md,
 * "kubernetes").
 *
 *   kubeconfig.c   credentials as kubectl finds them (kubeconfig.h)
 *
 * Per-session state of its own: $SBX_HOME/kubernetes/<session>.json pins
 * the context, namespace and pod chosen at creation, so later commands
 * reach the same pod whatever the current context is then.  Without it
 * (lost, or `sbx gc` after the session record went) the pod is found by
 * its labels.  The agent's token lives in the pod spec (env), readable by
 * whoever may read pods -- and only usable through pods/proxy, which is
 * the access that matters.
 *
 * Internals:
 *
 *   pkube.c        configuration, the pin, the provider ops of the control
 *                  plane: create (access check, wait for readiness), get,
 *                  list (every pinned scope), terminate, construction
 *   pkube_api.c    the API client: credentials as a premote_auth (the
 *                  remote provider's HTTP client, sbx/remote.h), one call,
 *                  API Status objects turned into errors
 *   pkube_watch.c  following a pod with the watch API (JSON lines parser,
 *                  relist on expiry, retry of transient failures)
 *   pkube_pod.c    pure pod logic: names and labels, the manifest, the
 *                  verdict on a pod's status, the agent token in its spec
 *   pkube_agent.c  the agent through the API server's pod proxy: open()
 *                  and the tar snapshots (snapshot, restore)
 *
 * Nothing here is shared between threads: every operation opens its own
 * API client (struct kube) and closes it.
 *
 * Errors: 0 / negative errno with sbx_error_last(); API Status objects are
 * turned into messages naming the object and what to do.  Functions that
 * return cJSON * or char * cannot fail (out of memory aborts).
 */
#ifndef PKUBE_I_H
#define PKUBE_I_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "sbx/buf.h"
#include "sbx/error.h"
#include "sbx/provider.h"
#include "sbx/remote.h"

#include "kubeconfig.h"

/* The configuration section, pin directory and snapshot store name. */
#define SECTION "kubernetes"
#define LABEL_MANAGED "app.kubernetes.io/managed-by"
#define LABEL_SESSION "sbx.dev/session"
#define LABEL_HOME "sbx.dev/home"
#define MAIN_CONTAINER "sandbox"
#define INSTALL_CONTAINER "sbx-agent-install"
#define TOKEN_ENV "SBX_AGENT_TOKEN"
#define AGENT_DIR "/sbx"
#define DEFAULT_PORT 7070

/* ---- configuration (pkube.c) ---------------------------------------------- */

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

/* Validate `sec` into *c: -EINVAL (SBX_ERR_CONFIG) naming the key. */
SBX_WUR int pkube_cfg_parse(struct kcfg *c, const cJSON *sec);

struct pkube_provider {
	struct sbx_provider base;
	struct kcfg cfg; /* strings borrowed from base.config */
};

#define KP(p) ((struct pkube_provider *)(p))

/*
 * Connect for an existing session: the pinned context/namespace/pod, or
 * (no pin) the configured ones and the pod found by its labels.  *pod_out
 * is NULL (with 0) when no pod exists.  On success *k is open (the caller
 * pkube_api_close()s it) and *pod_out malloc'd.
 */
struct kube;
SBX_WUR int pkube_session_open(struct pkube_provider *kp, const char *session,
			       struct kube *k, char **pod_out,
			       long *port_out);
/* pkube_session_open() for a session that must have a pod: -ENOENT
 * (SBX_ERR_NOTFOUND) otherwise, and *k is closed. */
SBX_WUR int pkube_session_pod(struct pkube_provider *kp, const char *session,
			      struct kube *k, char **pod_out, long *port_out);

/* ---- the API client (pkube_api.c) ----------------------------------------- */

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

/*
 * Fill *a for kc (taken over when `owns`).  Gets the credentials once:
 * an exec plugin that fails says so now, before anything is created.
 */
SBX_WUR int pkube_kauth_init(struct kauth *a, struct sbx_kube_config *kc,
			     bool owns);
/* A premote_auth over `ka` (taken: released with the auth). */
struct premote_auth *pkube_auth_new(struct kauth *ka);

/* The kubeconfig for the section, pinned values (or NULL) overriding it. */
SBX_WUR int pkube_load_kc(struct sbx_kube_config **out, const struct kcfg *c,
			  const char *kubeconfig, const char *context,
			  const char *ns);
/* Connect to the cluster (kubeconfig/context/namespace: pinned or NULL). */
SBX_WUR int pkube_api_open(struct kube *k, const struct kcfg *c,
			   const char *kubeconfig, const char *context,
			   const char *ns);
/* Accepts a zeroed or closed *k. */
void pkube_api_close(struct kube *k);

/*
 * Turn an API answer that is not 2xx into an error: 401/403 -EACCES
 * (SBX_ERR_CONFIG), 404 -ENOENT, 409 -EEXIST, 410 -ESTALE, 422 -EINVAL,
 * 429 -EAGAIN, 5xx -EIO, else -EPROTO; detail = the status.  `what` names
 * the object ("pod sbx-x-1 in namespace n").  Pure but for the error.
 */
int pkube_status_error(const struct kube *k, long status, const cJSON *j,
		       const char *what);
/*
 * One API request.  `body` (may be NULL) is sent as JSON; *out (may be
 * NULL) gets the parsed 2xx answer (caller cJSON_Delete()s).
 */
SBX_WUR int pkube_call(struct kube *k, const char *method, const char *path,
		       const char *query, const cJSON *body, const char *what,
		       cJSON **out);
/* GET the pod (pkube_call()). */
SBX_WUR int pkube_get_pod(struct kube *k, const char *pod, cJSON **out);

/* API paths and names (malloc'd). */
char *pkube_pods_path(const struct kube *k);
char *pkube_pod_path(const struct kube *k, const char *pod);
/* The agent's health route through the pod proxy, for the API client. */
char *pkube_proxy_health_route(const struct kube *k, const char *pod,
			       long port);
char *pkube_pod_what(const struct kube *k, const char *pod);


/* ---- pods (pkube_pod.c) ----------------------------------------------------- */

static inline const cJSON *jget(const cJSON *o, const char *k)
{
	return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* A label value: [A-Za-z0-9._-], at most 63, alphanumeric at both ends. */
void pkube_label_value(char *out, size_t size, const char *in);
/* Pod name: DNS-1123 label, "sbx-<session>-<hash>", unique per home. */
char *pkube_pod_name(const char *session, const char *home);
/* cJSON_AddObjectToObject that aborts on out of memory. */
cJSON *pkube_obj_add(cJSON *parent, const char *key);

/* The pod of a session (docs/providers.md shows it; contrib/kubernetes). */
cJSON *pkube_pod_manifest(const struct kcfg *c, const char *name,
			  const char *session, const char *home,
			  const char *token);

enum pkube_verdict { PKUBE_WAIT, PKUBE_READY, PKUBE_FAILED, PKUBE_GONE };

/*
 * Where the pod stands.  `stage` gets a short progress text, `why` the
 * reason of a failure.  Pure.
 */
enum pkube_verdict pkube_pod_verdict(const cJSON *pod, char *stage,
				     size_t ns, char *why, size_t nw);
/*
 * One word for why a failed pod failed, for `sbx status` (borrowed from
 * `pod`, or a constant).  Pure.
 */
const char *pkube_pod_reason(const cJSON *pod);
/* The agent's token, from the pod spec; -EINVAL (SBX_ERR_STATE) when the
 * pod was not made by sbx.  *out malloc'd. */
SBX_WUR int pkube_pod_token(const cJSON *pod, char **out);

/* ---- watch (pkube_watch.c) -------------------------------------------------- */

/* Progress lines on a terminal only. */
void pkube_progress(const char *pod, const char *stage);
void pkube_progress_end(void);

/* The state of one pkube_watch_pod(). */
struct pkube_watch {
	struct sbx_buf line;   /* a partial JSON line */
	const char *pod;
	bool want_gone;
	enum pkube_verdict v;
	char stage[256], why[1024];
	char rv[64];           /* resourceVersion to resume from */
	bool expired;          /* 410: relist and watch again */
};

/*
 * Feed bytes of a watch answer (JSON lines of {"type","object"}) into `w`
 * (its `line` buffer initialised): 0 to go on, 1 when decided (w->v; or
 * w->expired on an expired resourceVersion), < 0 on a malformed event or
 * an ERROR event.  Exposed for tests (the on_data callback of the watch).
 */
int pkube_watch_data(const char *buf, size_t len, void *payload);

/*
 * A failure worth trying again while there is time: the API server (or a
 * load balancer in front of it) answered 5xx, or the connection failed,
 * was reset or timed out.  Reads sbx_error_last().
 */
bool pkube_transient(int rc);

/*
 * Follow pod `pod` with the watch API until it is ready (or failed), or,
 * with want_gone, deleted; at most `timeout_s`.  Transient failures of
 * the watch or of the GET (5xx, connection reset) are retried with a
 * backoff of 0.25 s doubling to 4 s while the time lasts.  Returns the
 * verdict (>= 0) or a negative errno (-ETIMEDOUT naming the last state).
 */
int pkube_watch_pod(struct kube *k, const char *pod, bool want_gone,
		    long timeout_s, struct pkube_watch *w);

/* ---- the agent (pkube_agent.c) ---------------------------------------------- */

/* The ops of pkube_agent.c (sbx/provider.h). */
int pkube_snapshot(struct sbx_provider *p, const char *session,
		   const char *message, char **id_out);
int pkube_snapshots(struct sbx_provider *p, const char *session,
		    sbx_snapshot_cb cb, void *payload);
int pkube_restore(struct sbx_provider *p, const char *session,
		  const char *id, char **saved_out);
int pkube_open(struct sbx_provider *p, const char *session,
	       struct sbx_sandbox **out);

#endif
