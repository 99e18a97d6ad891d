/*
 * Pure pod logic of the kubernetes provider: names and labels, the pod
 * manifest, the verdict on a pod's status, the agent's token in its spec;
 * see pkube_i.h.  No I/O: tests/unit/test_pkube.c covers it.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/xmalloc.h"

#include "pcommon.h"
#include "pkube_i.h"

/* ---- names -------------------------------------------------------------- */

/* A label value: [A-Za-z0-9._-], at most 63, alphanumeric at both ends. */
void pkube_label_value(char *out, size_t size, const char *in)
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
char *pkube_pod_name(const char *session, const char *home)
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

/* ---- the manifest ---------------------------------------------------------- */

static cJSON *str_array(const char *const *v)
{
	cJSON *a = cJSON_CreateArray();

	if (!a)
		abort();
	for (; *v; v++)
		cJSON_AddItemToArray(a, cJSON_CreateString(*v));
	return a;
}

cJSON *pkube_obj_add(cJSON *parent, const char *key)
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

/* Append {"name": name} to the list `arr`; the new object. */
static cJSON *named_add(cJSON *arr, const char *name)
{
	cJSON *o = cJSON_CreateObject();

	if (!o)
		abort();
	sbx_json_set_str(o, "name", name);
	cJSON_AddItemToArray(arr, o);
	return o;
}

/* Append {"name": name, "value": value} (an env list). */
static void env_add(cJSON *env, const char *name, const char *value)
{
	sbx_json_set_str(named_add(env, name), "value", value);
}

/* Append {"name": name, "emptyDir": {}} (a volume list). */
static void volume_add(cJSON *vols, const char *name)
{
	pkube_obj_add(named_add(vols, name), "emptyDir");
}

static void mount_add(cJSON *mounts, const char *name, const char *path,
		      bool ro)
{
	cJSON *m = named_add(mounts, name);

	sbx_json_set_str(m, "mountPath", path);
	if (ro)
		cJSON_AddBoolToObject(m, "readOnly", true);
}

/* The pod of a session (docs/providers.md shows it; contrib/kubernetes). */
cJSON *pkube_pod_manifest(const struct kcfg *c, const char *name,
			  const char *session, const char *home,
			  const char *token)
{
	char listen[32], sess[64];
	const char *install[] = {"/bin/cp", "-a", "/opt/sbx-agent/.",
				 AGENT_DIR "/", NULL};
	const char *cmd[] = {AGENT_DIR "/lib/ld.so", "--library-path",
			     AGENT_DIR "/lib", AGENT_DIR "/bin/sbx-agent",
			     "serve", "--root", c->workdir, "--listen", listen,
			     "--token-env", TOKEN_ENV, NULL};
	cJSON *pod = cJSON_CreateObject(), *meta, *labels, *spec, *vols, *init,
	      *ic, *ctrs, *ct, *env, *probe, *hg, *mounts;
	const cJSON *it;

	snprintf(listen, sizeof(listen), "0.0.0.0:%ld", c->port);
	pkube_label_value(sess, sizeof(sess), session);
	if (!pod)
		abort();
	sbx_json_set_str(pod, "apiVersion", "v1");
	sbx_json_set_str(pod, "kind", "Pod");
	meta = pkube_obj_add(pod, "metadata");
	sbx_json_set_str(meta, "name", name);
	labels = pkube_obj_add(meta, "labels");
	sbx_json_set_str(labels, LABEL_MANAGED, "sbx");
	sbx_json_set_str(labels, LABEL_SESSION, sess);
	sbx_json_set_str(labels, LABEL_HOME, home);
	sbx_json_set_str(pkube_obj_add(meta, "annotations"),
			 "sbx.dev/session-name",
			 session);

	spec = pkube_obj_add(pod, "spec");
	sbx_json_set_str(spec, "restartPolicy", "Never");
	cJSON_AddNumberToObject(spec, "activeDeadlineSeconds",
				(double)c->ttl_s);
	cJSON_AddNumberToObject(spec, "terminationGracePeriodSeconds", 5);
	if (c->service_account)
		sbx_json_set_str(spec, "serviceAccountName",
				 c->service_account);
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

		cJSON_ArrayForEach(it, c->pull_secrets)
			named_add(ps, it->valuestring);
	}
	vols = arr_add(spec, "volumes");
	volume_add(vols, "sbx-agent");
	if (c->workdir_volume)
		volume_add(vols, "workspace");

	/* The agent bundle, copied from its image into the shared volume. */
	init = arr_add(spec, "initContainers");
	ic = named_add(init, INSTALL_CONTAINER);
	sbx_json_set_str(ic, "image", c->agent_image);
	cJSON_AddItemToObject(ic, "command", str_array(install));
	mount_add(arr_add(ic, "volumeMounts"), "sbx-agent", AGENT_DIR, false);

	ctrs = arr_add(spec, "containers");
	ct = named_add(ctrs, MAIN_CONTAINER);
	sbx_json_set_str(ct, "image", c->image);
	cJSON_AddItemToObject(ct, "command", str_array(cmd));
	sbx_json_set_str(ct, "workingDir", c->workdir);
	env = arr_add(ct, "env");
	env_add(env, TOKEN_ENV, token);
	if (c->env)
		cJSON_ArrayForEach(it, c->env)
			env_add(env, it->string, it->valuestring);
	cJSON_AddNumberToObject(named_add(arr_add(ct, "ports"), "sbx-agent"),
				"containerPort", (double)c->port);
	probe = pkube_obj_add(ct, "readinessProbe");
	hg = pkube_obj_add(probe, "httpGet");
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
	return pod;
}
/* ---- pod status ------------------------------------------------------------- */

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
enum pkube_verdict pkube_pod_verdict(const cJSON *pod, char *stage, size_t ns,
				     char *why, size_t nw)
{
	const cJSON *st = jget(pod, "status");
	const char *phase = sbx_json_str(st, "phase");
	const char *cst = NULL, *creason = NULL, *cmsg = NULL;

	snprintf(stage, ns, "pending");
	*why = '\0';
	if (jget(jget(pod, "metadata"), "deletionTimestamp")) {
		snprintf(why, nw, "the pod is being deleted");
		return PKUBE_FAILED;
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
		return PKUBE_FAILED;
	}
	if (condition(st, "PodScheduled", &cst, &creason, &cmsg)) {
		if (cst && !strcmp(cst, "False") && creason &&
		    !strcmp(creason, "Unschedulable")) {
			snprintf(why, nw, "the pod cannot be scheduled "
				 "(Unschedulable): %s", cmsg ? cmsg : "");
			return PKUBE_FAILED;
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
		return PKUBE_FAILED;
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
		return PKUBE_READY;
	}
	return PKUBE_WAIT;
}

/*
 * One word for why a failed pod failed, for `sbx status`: the pod's own
 * reason (Evicted, DeadlineExceeded), else its container's (Error,
 * OOMKilled, ErrImagePull, ...), else Unschedulable / Terminating / the
 * phase.
 */
const char *pkube_pod_reason(const cJSON *pod)
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

/* The agent's token, from the pod spec. */
int pkube_pod_token(const cJSON *pod, char **out)
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

