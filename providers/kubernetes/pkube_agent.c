/*
 * The agent of a session's pod, reached through the API server's pod
 * proxy (the remote provider's client, sbx/remote.h): open() and the tar
 * snapshots under $SBX_HOME/kubernetes/snapshots/; see pkube_i.h.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "kubeconfig.h"
#include "pcommon.h"
#include "pkube_i.h"

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
	enum pkube_verdict v;
	int rc;

	memset(pc, 0, sizeof(*pc));
	rc = pkube_get_pod(k, pod, &obj);
	if (rc == -ENOENT)
		rc = sbx_error_set(SBX_ERR_STATE, -ENXIO,
				   "pod %s no longer exists in namespace %s "
				   "(deleted or evicted)", pod, k->ns);
	if (rc < 0)
		goto out;
	v = pkube_pod_verdict(obj, stage, sizeof(stage), why, sizeof(why));
	if (v != PKUBE_READY) {
		rc = sbx_error_set(SBX_ERR_STATE, -ENXIO,
				   "pod %s in namespace %s is not ready: %s",
				   pod, k->ns, v == PKUBE_FAILED ? why : stage);
		goto out;
	}
	rc = pkube_pod_token(obj, &pc->token);
	if (rc < 0)
		goto out;
	/* The sandbox's own credentials object, released with it. */
	rc = pkube_load_kc(&kc2, &kp->cfg, k->kubeconfig, k->context, k->ns);
	if (rc < 0)
		goto out;
	{
		struct kauth *ka = sbx_xcalloc(1, sizeof(*ka));

		rc = pkube_kauth_init(ka, kc2, true);
		pc->auth = pkube_auth_new(ka); /* released with pc, kc2 with it */
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

/* A client for the agent of a session's pod, and what it rests on. */
struct kagent {
	struct kube k;
	struct premote_config pc;
	struct premote_http *h;
};

static void agent_close(struct kagent *a)
{
	premote_http_free(a->h);
	premote_config_fini(&a->pc);
	pkube_api_close(&a->k);
	memset(a, 0, sizeof(*a));
}

/* Open *a for the agent of a session's pod (agent_close() it). */
static int agent_open(struct pkube_provider *kp, const char *session,
		      struct kagent *a)
{
	char *pod = NULL;
	long port;
	int rc;

	memset(a, 0, sizeof(*a));
	rc = pkube_session_pod(kp, session, &a->k, &pod, &port);
	if (rc < 0)
		return rc;
	rc = agent_config(kp, &a->k, pod, port, &a->pc);
	if (rc == 0)
		rc = premote_http_new(&a->h, &a->pc, a->pc.token);
	if (rc < 0)
		agent_close(a);
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

int pkube_snapshot(struct sbx_provider *p, const char *session,
		   const char *message, char **id_out)
{
	struct kagent a;
	char id[40], *tar = NULL, *tmp = NULL;
	time_t now = time(NULL);
	int fd = -1, rc;

	*id_out = NULL;
	rc = agent_open(KP(p), session, &a);
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
	rc = premote_archive_get(a.h, "", fd);
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
	agent_close(&a);
	free(tar);
	free(tmp);
	return rc;
}

int pkube_snapshots(struct sbx_provider *p, const char *session,
		    sbx_snapshot_cb cb, void *payload)
{
	return pcommon_snap_list(SECTION, session, cb, payload);
}

int pkube_restore(struct sbx_provider *p, const char *session,
		  const char *id, char **saved_out)
{
	struct kagent a;
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
	rc = pkube_snapshot(p, session, "before restore", &saved);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "restore refused: could not save the "
				      "current state first");
		goto out;
	}
	rc = agent_open(KP(p), session, &a);
	if (rc < 0)
		goto out;
	rc = premote_archive_put(a.h, "", fd, true, &entries);
	agent_close(&a);
	if (rc < 0)
		rc = sbx_error_prefix(rc, "restore of %s into session %s (the "
				      "state before is snapshot %s)", id,
				      session, saved);
	else if (saved_out)
		*saved_out = sbx_xstrdup(saved);
out:
	close(fd);
	free(tar);
	free(saved);
	return rc;
}

int pkube_open(struct sbx_provider *p, const char *session,
	       struct sbx_sandbox **out)
{
	struct pkube_provider *kp = KP(p);
	struct premote_config pc;
	struct kube k;
	char *pod = NULL;
	long port;
	int rc;

	*out = NULL;
	rc = pkube_session_pod(kp, session, &k, &pod, &port);
	if (rc < 0)
		return rc;
	rc = agent_config(kp, &k, pod, port, &pc);
	if (rc < 0)
		goto out;
	rc = premote_sandbox_connect(out, session, &pc);
	if (rc < 0 && sbx_error_last()->detail == 403 &&
	    sbx_error_last()->klass == SBX_ERR_HTTP) {
		/*
		 * The API server refused the pod proxy: ask it again as the
		 * API client, which turns its Status into a short
		 * "forbidden: <message>; grant ... rbac.yaml".
		 */
		struct sbx_error first = *sbx_error_last();
		char *route = pkube_proxy_health_route(&k, pod, port);

		if (pkube_call(&k, "GET", route, NULL, NULL,
			       "pods/proxy of the pod", NULL) != -EACCES)
			sbx_error_set(first.klass, first.code, "%s",
				      first.msg);
		free(route);
	}
	if (rc < 0)
		rc = sbx_error_prefix(rc, "pod %s", pod);
out:
	free(pod);
	pkube_api_close(&k);
	return rc;
}
