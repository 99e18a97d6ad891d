/*
 * One Modal sandbox of the modal provider: its definition (the agent as
 * entrypoint on an encrypted port), start, task and tunnel, waiting for
 * the agent (sbx/remote.h), end, and filesystem snapshots through the
 * command router; see pmodal_i.h.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/log.h"
#include "sbx/xmalloc.h"

#include "pcommon.h"
#include "pmodal_i.h"
#include "task_command_router.pb-c.h"

#define ROUTER_SNAPSHOT \
	"/modal.task_command_router.TaskCommandRouter/TaskSnapshotFilesystem"
#define TERMINATE_WAIT_S 60L

/* ---- sandboxes -------------------------------------------------------------- */

char **pmodal_entrypoint_args(const struct mcfg *c, const char *token,
			      size_t *n_out)
{
	char listen[32];
	/*
	 * The sandbox definition has no environment: the configured "env"
	 * and the token go in through env(1) (the token last; reserved names
	 * are refused by the configuration check), and the agent unsets the
	 * token before running commands.  The bundle's own loader runs the
	 * agent, so the image needs no particular libc.
	 */
	const char *const tail[] = {
		AGENT_DIR "/lib/ld.so", "--library-path", AGENT_DIR "/lib",
		AGENT_DIR "/bin/sbx-agent", "serve", "--root", c->workdir,
		"--listen", listen, "--token-env", TOKEN_ENV, NULL,
	};
	size_t na = 0, cap = (size_t)cJSON_GetArraySize(c->env) + 16;
	char **args = sbx_xcalloc(cap, sizeof(*args));
	const cJSON *ev;

	snprintf(listen, sizeof(listen), "0.0.0.0:%ld", c->port);
	args[na++] = sbx_xstrdup("env");
	cJSON_ArrayForEach(ev, c->env)
		args[na++] = sbx_xasprintf("%s=%s", ev->string,
					   ev->valuestring);
	args[na++] = sbx_xasprintf(TOKEN_ENV "=%s", token);
	for (size_t i = 0; tail[i]; i++)
		args[na++] = sbx_xstrdup(tail[i]);
	*n_out = na;
	return args;
}

void pmodal_args_free(char **args)
{
	for (size_t i = 0; args && args[i]; i++)
		pcommon_wipe_free(args[i]);
	free(args);
}

char *pmodal_tunnel_url(const Modal__Client__SandboxGetTunnelsResponse *r,
			long port)
{
	for (size_t i = 0; r && i < r->n_tunnels; i++)
		if (r->tunnels[i]->container_port == (uint32_t)port)
			return sbx_xasprintf("https://%s:%u",
					     r->tunnels[i]->host,
					     r->tunnels[i]->port);
	return NULL;
}

/* Create a sandbox running the agent from image_id; *sandbox_id malloc'd. */
static int create_sandbox(struct mchan *m, const struct mcfg *c,
			  const char *session, const char *app_id,
			  const char *image_id, const char *token,
			  char **sandbox_id)
{
	Modal__Client__SandboxCreateRequest req =
		MODAL__CLIENT__SANDBOX_CREATE_REQUEST__INIT;
	Modal__Client__SandboxCreateResponse *resp = NULL;
	Modal__Client__Sandbox def = MODAL__CLIENT__SANDBOX__INIT;
	Modal__Client__Resources res = MODAL__CLIENT__RESOURCES__INIT;
	Modal__Client__PortSpecs ports = MODAL__CLIENT__PORT_SPECS__INIT;
	Modal__Client__PortSpec port = MODAL__CLIENT__PORT_SPEC__INIT;
	Modal__Client__PortSpec *portv[1] = {&port};
	Modal__Client__SandboxTagsSetRequest treq =
		MODAL__CLIENT__SANDBOX_TAGS_SET_REQUEST__INIT;
	Modal__Client__SandboxTag t[3] = {
		MODAL__CLIENT__SANDBOX_TAG__INIT,
		MODAL__CLIENT__SANDBOX_TAG__INIT,
		MODAL__CLIENT__SANDBOX_TAG__INIT,
	};
	Modal__Client__SandboxTag *tv[3] = {&t[0], &t[1], &t[2]};
	ProtobufCMessage *empty = NULL;
	char home[17], **args;
	size_t na;
	int rc;

	*sandbox_id = NULL;
	rc = pcommon_home_id(home);
	if (rc < 0)
		return rc;
	args = pmodal_entrypoint_args(c, token, &na);
	def.n_entrypoint_args = na;
	def.entrypoint_args = args;
	def.image_id = (char *)image_id;
	def.timeout_secs = (uint32_t)c->timeout_s;
	def._workdir_case = MODAL__CLIENT__SANDBOX___WORKDIR_WORKDIR;
	def.workdir = (char *)c->workdir;
	if (c->idle_timeout_s) {
		def._idle_timeout_secs_case =
			MODAL__CLIENT__SANDBOX___IDLE_TIMEOUT_SECS_IDLE_TIMEOUT_SECS;
		def.idle_timeout_secs = (uint32_t)c->idle_timeout_s;
	}
	res.milli_cpu = (uint32_t)(c->cpu * 1000);
	res.memory_mb = (uint32_t)c->memory_mb;
	def.resources = &res;
	port.port = (uint32_t)c->port;
	port.unencrypted = 0; /* TLS terminated by Modal's tunnel */
	ports.n_ports = 1;
	ports.ports = portv;
	def.open_ports_oneof_case =
		MODAL__CLIENT__SANDBOX__OPEN_PORTS_ONEOF_OPEN_PORTS;
	def.open_ports = &ports;
	req.app_id = (char *)app_id;
	req.definition = &def;
	req.environment_name = m->env;
	/* The idempotency key makes a retried create return one sandbox. */
	rc = pmodal_call(m, RPC("SandboxCreate"), &req,
			 &modal__client__sandbox_create_response__descriptor, &resp,
			 true, 0);
	pmodal_args_free(args);
	if (rc < 0)
		return rc;
	*sandbox_id = sbx_xstrdup(resp->sandbox_id);
	FREE_MSG(resp);

	t[0].tag_name = TAG_MANAGED;
	t[0].tag_value = "1";
	t[1].tag_name = TAG_SESSION;
	t[1].tag_value = (char *)session;
	t[2].tag_name = TAG_HOME;
	t[2].tag_value = home;
	treq.environment_name = m->env;
	treq.sandbox_id = *sandbox_id;
	treq.n_tags = 3;
	treq.tags = tv;
	rc = pmodal_call(m, RPC("SandboxTagsSet"), &treq,
			 &google__protobuf__empty__descriptor,
			 &empty, true, 0);
	FREE_MSG(empty);
	return rc;
}

/* The sandbox's result when it has finished (caller frees), else NULL. */
int pmodal_sandbox_result(struct mchan *m, const char *sandbox_id,
			  float wait_s, GResult **out)
{
	Modal__Client__SandboxWaitRequest req =
		MODAL__CLIENT__SANDBOX_WAIT_REQUEST__INIT;
	Modal__Client__SandboxWaitResponse *resp = NULL;
	int rc;

	*out = NULL;
	req.sandbox_id = (char *)sandbox_id;
	req.timeout = wait_s;
	rc = pmodal_call(m, RPC("SandboxWait"), &req,
			 &modal__client__sandbox_wait_response__descriptor, &resp,
			 true, (long)(wait_s * 1000) + m->deadline_ms);
	if (rc == 0 && resp->result && resp->result->status) {
		*out = resp->result;
		resp->result = NULL;
	}
	FREE_MSG(resp);
	return rc;
}

static int fail_finished(const char *sandbox_id, const GResult *r)
{
	/* Its whole account (the error message is bounded). */
	if (r->exception && strchr(r->exception, '\n')) {
		char *what = sbx_xasprintf("Modal sandbox %s", sandbox_id);

		pcommon_report_log_tail(what, r->exception, 20);
		free(what);
	}
	return sbx_error_set(SBX_ERR_REMOTE, -EIO,
			     "Modal sandbox %s ended (%s%s%s)", sandbox_id,
			     pmodal_result_name(r),
			     r->exception && *r->exception ? ": " : "",
			     r->exception ? r->exception : "");
}

/* Wait for the task, then the tunnel of our port; *url malloc'd. */
int pmodal_wait_tunnel(struct mchan *m, const struct mcfg *c,
		       const char *sandbox_id, time_t deadline, char **url,
		       char **task_id)
{
	int rc = 0;

	*url = NULL;
	if (task_id)
		*task_id = NULL;
	while (time(NULL) < deadline) {
		Modal__Client__SandboxGetTaskIdRequest req =
			MODAL__CLIENT__SANDBOX_GET_TASK_ID_REQUEST__INIT;
		Modal__Client__SandboxGetTaskIdResponse *resp = NULL;
		bool have = false;

		req.sandbox_id = (char *)sandbox_id;
		req._timeout_case =
			MODAL__CLIENT__SANDBOX_GET_TASK_ID_REQUEST___TIMEOUT_TIMEOUT;
		req.timeout = POLL_S;
		req.wait_until_ready = 1;
		rc = pmodal_call(m, RPC("SandboxGetTaskId"), &req,
				 &modal__client__sandbox_get_task_id_response__descriptor,
				 &resp, true, (long)(POLL_S * 1000) + m->deadline_ms);
		if (rc < 0)
			return rc;
		if (resp->_task_result_case && resp->task_result &&
		    resp->task_result->status) {
			rc = fail_finished(sandbox_id, resp->task_result);
			FREE_MSG(resp);
			return rc;
		}
		if (resp->_task_id_case && resp->task_id && *resp->task_id) {
			have = true;
			if (task_id)
				*task_id = sbx_xstrdup(resp->task_id);
		}
		FREE_MSG(resp);
		if (have)
			break;
	}
	while (time(NULL) < deadline) {
		Modal__Client__SandboxGetTunnelsRequest req =
			MODAL__CLIENT__SANDBOX_GET_TUNNELS_REQUEST__INIT;
		Modal__Client__SandboxGetTunnelsResponse *resp = NULL;

		req.sandbox_id = (char *)sandbox_id;
		req.timeout = POLL_S;
		rc = pmodal_call(m, RPC("SandboxGetTunnels"), &req,
				 &modal__client__sandbox_get_tunnels_response__descriptor,
				 &resp, true, (long)(POLL_S * 1000) + m->deadline_ms);
		if (rc < 0)
			return rc;
		*url = pmodal_tunnel_url(resp, c->port);
		FREE_MSG(resp);
		if (*url)
			return 0;
	}
	return sbx_error_set(SBX_ERR_REMOTE, -ETIMEDOUT,
			     "Modal sandbox %s: no %s after %ld s",
			     sandbox_id, task_id && *task_id ? "tunnel"
							    : "task",
			     c->ready_timeout_s);
}

/* The agent's configuration at `url` (TLS; the tunnel terminates it). */
void pmodal_agent_cfg(struct premote_config *pc, const struct mcfg *c,
		      const char *url, const char *token)
{
	memset(pc, 0, sizeof(*pc));
	pc->url = sbx_xstrdup(url);
	pc->token = sbx_xstrdup(token);
	pc->ca_file = c->ca_file ? sbx_xstrdup(c->ca_file) : NULL;
	pc->timeout_ms = c->request_s * 1000;
	pc->connect_timeout_ms = PREMOTE_DEFAULT_CONNECT_TIMEOUT_S * 1000L;
	/* Failures name the hop: Modal's tunnel, in front of the agent. */
	pc->peer = sbx_xasprintf("Modal's tunnel at %s (to the sandbox's "
				 "agent)", url);
	/* Commands get the sandbox's environment (premote_env.c). */
	pc->container_env = true;
}

/* Until the agent answers behind the tunnel (it may not listen yet). */
static int wait_agent(struct mchan *m, const struct mcfg *c,
		      const char *sandbox_id, const char *url,
		      const char *token, time_t deadline)
{
	struct premote_config pc;
	int rc = -ETIMEDOUT;

	pmodal_agent_cfg(&pc, c, url, token);
	while (time(NULL) < deadline) {
		GResult *r = NULL;

		rc = premote_agent_ping(&pc);
		if (rc == 0)
			break;
		if (pmodal_sandbox_result(m, sandbox_id, 0, &r) == 0 && r) {
			rc = fail_finished(sandbox_id, r);
			FREE_MSG(r);
			break;
		}
		sbx_error_clear();
		usleep(200 * 1000);
	}
	if (rc == -ETIMEDOUT && time(NULL) >= deadline)
		rc = sbx_error_set(SBX_ERR_REMOTE, -ETIMEDOUT,
				   "Modal sandbox %s: the agent did not answer "
				   "at %s within %ld s", sandbox_id, url,
				   c->ready_timeout_s);
	premote_config_fini(&pc);
	return rc;
}

void pmodal_terminate_quietly(struct mchan *m, const char *sandbox_id)
{
	Modal__Client__SandboxTerminateRequest req =
		MODAL__CLIENT__SANDBOX_TERMINATE_REQUEST__INIT;
	Modal__Client__SandboxTerminateResponse *resp = NULL;
	struct sbx_error saved = *sbx_error_last();

	req.sandbox_id = (char *)sandbox_id;
	if (pmodal_call(m, RPC("SandboxTerminate"), &req,
			&modal__client__sandbox_terminate_response__descriptor, &resp,
			true, 0) < 0)
		sbx_warn("could not terminate Modal sandbox %s: %s", sandbox_id,
			 sbx_error_last()->msg);
	FREE_MSG(resp);
	sbx_error_set(saved.klass, saved.code, "%s", saved.msg);
}

/*
 * Start a sandbox from image_id and wait until its agent answers.  Fills
 * the pin (sandbox id, token).  On failure the sandbox is terminated.
 */
int pmodal_start_sandbox(struct mchan *m, const struct mcfg *c,
			 const char *session, const char *app_id,
			 const char *image_id, struct pin *pin)
{
	char token[65], *url = NULL;
	time_t deadline = time(NULL) + c->ready_timeout_s;
	int rc;

	pcommon_random_hex(token, 32);
	rc = create_sandbox(m, c, session, app_id, image_id, token,
			    &pin->sandbox_id);
	if (rc == 0) {
		if (isatty(STDERR_FILENO))
			fprintf(stderr, "sbx: Modal sandbox %s: waiting for "
				"its task\n", pin->sandbox_id);
		rc = pmodal_wait_tunnel(m, c, pin->sandbox_id, deadline, &url,
					NULL);
	}
	if (rc == 0)
		rc = wait_agent(m, c, pin->sandbox_id, url, token, deadline);
	free(url);
	if (rc < 0) {
		if (pin->sandbox_id)
			pmodal_terminate_quietly(m, pin->sandbox_id);
		memset(token, 0, sizeof(token));
		return rc;
	}
	pin->token = sbx_xstrdup(token);
	pin->app_id = sbx_xstrdup(app_id);
	pin->env = sbx_xstrdup(m->env);
	memset(token, 0, sizeof(token));
	return 0;
}

int pmodal_terminate_and_wait(struct mchan *m, const char *sandbox_id)
{
	Modal__Client__SandboxTerminateRequest req =
		MODAL__CLIENT__SANDBOX_TERMINATE_REQUEST__INIT;
	Modal__Client__SandboxTerminateResponse *resp = NULL;
	time_t deadline = time(NULL) + TERMINATE_WAIT_S;
	int rc;

	req.sandbox_id = (char *)sandbox_id;
	rc = pmodal_call(m, RPC("SandboxTerminate"), &req,
			 &modal__client__sandbox_terminate_response__descriptor,
			 &resp, true, 0);
	FREE_MSG(resp);
	if (rc == -ENOENT) {
		sbx_error_clear();
		return 0;
	}
	while (rc == 0 && time(NULL) < deadline) {
		GResult *r = NULL;

		rc = pmodal_sandbox_result(m, sandbox_id, POLL_S, &r);
		if (rc == -ENOENT) {
			sbx_error_clear();
			return 0;
		}
		if (r) {
			FREE_MSG(r);
			return 0;
		}
	}
	if (rc == 0)
		rc = sbx_error_set(SBX_ERR_REMOTE, -ETIMEDOUT,
				   "Modal sandbox %s did not end within %ld s",
				   sandbox_id, TERMINATE_WAIT_S);
	return rc;
}

/* ---- snapshots: filesystem images, recorded under $SBX_HOME ------------------ */

/* The filesystem snapshot of a running sandbox: an image id. */
int pmodal_snapshot_image(struct mchan *m, const struct mcfg *c,
			  const char *sandbox_id, char **image_id)
{
	Modal__Client__SandboxGetTaskIdRequest treq =
		MODAL__CLIENT__SANDBOX_GET_TASK_ID_REQUEST__INIT;
	Modal__Client__SandboxGetTaskIdResponse *tresp = NULL;
	Modal__Client__TaskGetCommandRouterAccessRequest areq =
		MODAL__CLIENT__TASK_GET_COMMAND_ROUTER_ACCESS_REQUEST__INIT;
	Modal__Client__TaskGetCommandRouterAccessResponse *aresp = NULL;
	Modal__TaskCommandRouter__TaskSnapshotFilesystemRequest sreq =
		MODAL__TASK_COMMAND_ROUTER__TASK_SNAPSHOT_FILESYSTEM_REQUEST__INIT;
	Modal__TaskCommandRouter__TaskSnapshotFilesystemResponse *sresp = NULL;
	struct mgrpc *router = NULL;
	char uuid[33], *auth = NULL;
	int rc;

	*image_id = NULL;
	treq.sandbox_id = (char *)sandbox_id;
	treq._timeout_case =
		MODAL__CLIENT__SANDBOX_GET_TASK_ID_REQUEST___TIMEOUT_TIMEOUT;
	treq.timeout = POLL_S;
	rc = pmodal_call(m, RPC("SandboxGetTaskId"), &treq,
			 &modal__client__sandbox_get_task_id_response__descriptor,
			 &tresp, true, (long)(POLL_S * 1000) + m->deadline_ms);
	if (rc < 0)
		goto out;
	if (!tresp->_task_id_case || !tresp->task_id || !*tresp->task_id) {
		rc = sbx_error_set(SBX_ERR_STATE, -ENXIO,
				   "Modal sandbox %s has no running task",
				   sandbox_id);
		goto out;
	}
	areq.task_id = tresp->task_id;
	rc = pmodal_call(m, RPC("TaskGetCommandRouterAccess"), &areq,
			 &modal__client__task_get_command_router_access_response__descriptor,
			 &aresp, true, 0);
	if (rc == 0) {
		const char *h[2] = {NULL, NULL};
		struct mgrpc_opts o = {0};
		struct mgrpc_call mc = {.deadline_ms = 300000, .retry = true};

		auth = sbx_xasprintf("authorization: Bearer %s", aresp->jwt);
		h[0] = auth;
		o.url = aresp->url;
		o.headers = h;
		o.ca_file = c->ca_file;
		rc = mgrpc_new(&router, &o);
		pcommon_random_hex(uuid, 16);
		sreq.task_id = tresp->task_id;
		sreq.snapshot_id = uuid;
		if (rc == 0)
			rc = mgrpc_unary(router, ROUTER_SNAPSHOT, &sreq.base,
					 &modal__task_command_router__task_snapshot_filesystem_response__descriptor,
					 (ProtobufCMessage **)&sresp, &mc);
		if (rc == 0)
			*image_id = sbx_xstrdup(sresp->image_id);
	}
	if (rc < 0 && rc != -ENXIO) {
		/* The legacy route, for servers without the router. */
		Modal__Client__SandboxSnapshotFsRequest lreq =
			MODAL__CLIENT__SANDBOX_SNAPSHOT_FS_REQUEST__INIT;
		Modal__Client__SandboxSnapshotFsResponse *lresp = NULL;

		sbx_debug("snapshot through the command router failed (%s); "
			  "trying SandboxSnapshotFs", sbx_error_last()->msg);
		sbx_error_clear();
		lreq.sandbox_id = (char *)sandbox_id;
		lreq.timeout = 55;
		rc = pmodal_call(m, RPC("SandboxSnapshotFs"), &lreq,
				 &modal__client__sandbox_snapshot_fs_response__descriptor,
				 &lresp, true, 70000);
		if (rc == 0 && lresp->result && lresp->result->status &&
		    lresp->result->status !=
			    MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_SUCCESS)
			rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
					   "snapshot of Modal sandbox %s failed "
					   "(%s)", sandbox_id,
					   pmodal_result_name(lresp->result));
		else if (rc == 0)
			*image_id = sbx_xstrdup(lresp->image_id);
		FREE_MSG(lresp);
	}
out:
	if (auth) {
		memset(auth, 0, strlen(auth));
		free(auth);
	}
	mgrpc_free(router);
	FREE_MSG(tresp);
	FREE_MSG(aresp);
	FREE_MSG(sresp);
	return rc;
}

