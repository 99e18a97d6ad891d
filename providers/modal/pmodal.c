/* The modal provider; see pmodal.h and docs/providers.md. */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/buf.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/xmalloc.h"

#include "mgrpc.h"
#include "modal_api.pb-c.h"
#include "modal_creds.h"
#include "pcommon.h"
#include "pmodal.h"
#include "task_command_router.pb-c.h"
#include "../remote/premote_i.h"

#define RPC(name) "/modal.client.ModalClient/" name
#define ROUTER_SNAPSHOT \
	"/modal.task_command_router.TaskCommandRouter/TaskSnapshotFilesystem"
#define CLIENT_VERSION "1.0.0"
#define TOKEN_ENV "SBX_AGENT_TOKEN"
#define AGENT_DIR "/opt/sbx-agent"
#define TAG_MANAGED "sbx"
#define TAG_SESSION "sbx-session"
#define TAG_HOME "sbx-home"
#define POLL_S 10.0f
#define BUILD_TIMEOUT_S 1800L
#define TERMINATE_WAIT_S 60L

typedef Modal__Client__GenericResult GResult;

/* ---- configuration ---------------------------------------------------------- */

#define SECTION "modal"

/* The "modal" section, validated (strings borrowed from the JSON). */
struct mcfg {
	const char *image, *app, *environment, *workdir, *agent_bundle,
		*ca_file;
	long timeout_s, idle_timeout_s, port, ready_timeout_s, request_s;
	long memory_mb;
	double cpu;
	const cJSON *env; /* NAME -> value for the sandbox (validated) */
};

static int mcfg_parse(struct mcfg *c, const cJSON *sec)
{
	double t, idle, port, ready, req, mem;
	int rc;

	memset(c, 0, sizeof(*c));
	if ((rc = pcommon_cfg_object(SECTION, sec)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "image", &c->image,
				  "python:3.11")) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "app", &c->app, "sbx")) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "environment",
				  &c->environment, NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "workdir", &c->workdir,
				  "/workspace")) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "agent_bundle",
				  &c->agent_bundle, NULL)) < 0 ||
	    (rc = pcommon_cfg_str(SECTION, sec, "ca_file", &c->ca_file,
				  NULL)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "timeout", &t, 86400, 60,
				  86400)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "idle_timeout", &idle, 0, 0,
				  86400)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "port", &port, 7070, 1,
				  65535)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "ready_timeout", &ready, 300, 1,
				  3600)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "request_timeout", &req, 30, 1,
				  3600)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "cpu", &c->cpu, 0, 0, 512)) < 0 ||
	    (rc = pcommon_cfg_num(SECTION, sec, "memory", &mem, 0, 0,
				  4 << 20)) < 0 ||
	    (rc = pcommon_cfg_env(SECTION, sec, "env", &c->env)) < 0)
		return rc;
	if (c->workdir[0] != '/')
		return pcommon_cfg_bad(SECTION, "workdir", "an absolute path");
	c->timeout_s = (long)t;
	c->idle_timeout_s = (long)idle;
	c->port = (long)port;
	c->ready_timeout_s = (long)ready;
	c->request_s = (long)req;
	c->memory_mb = (long)mem;
	return 0;
}

/* ---- the API channel ---------------------------------------------------------- */

struct mchan {
	struct sbx_modal_creds creds;
	struct mgrpc *c;
	char *env;    /* environment name ("" = the default one) */
	long deadline_ms;
};

static void mchan_close(struct mchan *m)
{
	mgrpc_free(m->c);
	sbx_modal_creds_fini(&m->creds);
	free(m->env);
	memset(m, 0, sizeof(*m));
}

static int mchan_open(struct mchan *m, const struct mcfg *c, const char *env)
{
	char *h[5] = {NULL};
	struct mgrpc_opts o;
	int rc;

	memset(m, 0, sizeof(*m));
	rc = sbx_modal_creds_load(&m->creds);
	if (rc < 0)
		return rc;
	h[0] = sbx_xasprintf("x-modal-token-id: %s", m->creds.token_id);
	h[1] = sbx_xasprintf("x-modal-token-secret: %s",
			     m->creds.token_secret);
	h[2] = sbx_xasprintf("x-modal-client-type: %d",
			     MODAL__CLIENT__CLIENT_TYPE__CLIENT_TYPE_LIBMODAL);
	h[3] = sbx_xstrdup("x-modal-client-version: " CLIENT_VERSION);
	memset(&o, 0, sizeof(o));
	o.url = m->creds.server_url;
	o.headers = (const char *const *)h;
	o.ca_file = c->ca_file;
	rc = mgrpc_new(&m->c, &o);
	for (int i = 0; i < 4; i++) {
		memset(h[i], 0, strlen(h[i]));
		free(h[i]);
	}
	if (rc < 0) {
		mchan_close(m);
		return rc;
	}
	m->env = sbx_xstrdup(env ? env
			     : c->environment ? c->environment
			     : m->creds.environment ? m->creds.environment
						    : "");
	m->deadline_ms = c->request_s * 1000;
	return 0;
}

/* One unary call; `retry` for calls Modal de-duplicates or that are reads. */
static int call(struct mchan *m, const char *method, const void *req,
		const ProtobufCMessageDescriptor *d, void *out, bool retry,
		long deadline_ms)
{
	struct mgrpc_call mc = {
		.deadline_ms = deadline_ms ? deadline_ms : m->deadline_ms,
		.retry = retry,
	};
	int rc = mgrpc_unary(m->c, method, req, d, out, &mc);

	if (rc < 0)
		rc = sbx_error_prefix(rc, "Modal (%s)", m->creds.source
							? m->creds.source
							: "?");
	return rc;
}

#define FREE_MSG(p) \
	do { \
		if (p) \
			protobuf_c_message_free_unpacked( \
				(ProtobufCMessage *)(p), NULL); \
	} while (0)

static const char *result_name(const GResult *r)
{
	switch (r ? (int)r->status : 0) {
	case 1: return "success";
	case 2: return "failure";
	case 3: return "terminated";
	case 4: return "timeout";
	case 5: return "init failure";
	case 6: return "internal failure";
	case 7: return "idle timeout";
	case 8: return "evicted (memory)";
	default: return "unknown";
	}
}

/* ---- identity and the pin ---------------------------------------------------- */

static int home_tag(char out[17])
{
	return pcommon_home_id(out);
}

static void rand_hex(char *out, size_t bytes)
{
	pcommon_random_hex(out, bytes);
}

/* $SBX_HOME/modal/<session>.json: sandbox id, app, environment, token. */
struct pin {
	char *sandbox_id, *app_id, *env, *token;
};

static void pin_fini(struct pin *p)
{
	free(p->sandbox_id);
	free(p->app_id);
	free(p->env);
	pcommon_wipe_free(p->token);
	memset(p, 0, sizeof(*p));
}

/* 0 with p->sandbox_id NULL when there is no pin. */
static int pin_load(struct pin *p, const char *session)
{
	cJSON *j = NULL;
	int rc;

	memset(p, 0, sizeof(*p));
	rc = pcommon_pin_load(&j, SECTION, session);
	if (rc == 0 && j) {
		const char *sid = sbx_json_str(j, "sandbox_id");
		const char *t = sbx_json_str(j, "token");

		if (!sid || !t) {
			rc = sbx_error_set(SBX_ERR_JSON, -EINVAL,
					   "the pin of session %s has no "
					   "\"sandbox_id\"/\"token\"", session);
		} else {
			p->sandbox_id = sbx_xstrdup(sid);
			p->token = sbx_xstrdup(t);
			p->app_id = sbx_xstrdup(sbx_json_str(j, "app_id")
							? sbx_json_str(j, "app_id")
							: "");
			p->env = sbx_xstrdup(sbx_json_str(j, "environment")
						     ? sbx_json_str(j, "environment")
						     : "");
		}
		/* The token was in the tree: wipe it before freeing. */
		{
			cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "token");

			if (cJSON_IsString(tok))
				explicit_bzero(tok->valuestring,
					       strlen(tok->valuestring));
		}
	}
	cJSON_Delete(j);
	return rc;
}

static int pin_save(const char *session, const struct pin *p)
{
	cJSON *j = cJSON_CreateObject();
	cJSON *tok;
	int rc;

	if (!j)
		abort();
	sbx_json_set_str(j, "sandbox_id", p->sandbox_id);
	sbx_json_set_str(j, "app_id", p->app_id);
	sbx_json_set_str(j, "environment", p->env);
	sbx_json_set_str(j, "token", p->token);
	rc = pcommon_pin_save(SECTION, session, j);
	tok = cJSON_GetObjectItemCaseSensitive(j, "token");
	if (cJSON_IsString(tok))
		explicit_bzero(tok->valuestring, strlen(tok->valuestring));
	cJSON_Delete(j);
	return rc;
}

static void pin_remove(const char *session)
{
	pcommon_pin_remove(SECTION, session);
}

/* ---- the image: the user's image plus the agent bundle ----------------------- */

struct ctx_files {
	Modal__Client__ImageContextFile **v;
	size_t n;
	size_t bytes;
};

static void ctx_files_fini(struct ctx_files *f)
{
	for (size_t i = 0; i < f->n; i++) {
		free(f->v[i]->filename);
		free(f->v[i]->data.data);
		free(f->v[i]);
	}
	free(f->v);
	memset(f, 0, sizeof(*f));
}

/* Add every regular file under dir/rel as "sbx-agent/rel/...". */
static int ctx_walk(struct ctx_files *f, const char *dir, const char *rel)
{
	char *path = sbx_xasprintf("%s%s%s", dir, *rel ? "/" : "", rel);
	DIR *d = opendir(path);
	struct dirent *e;
	int rc = 0;

	if (!d) {
		rc = sbx_error_os("agent bundle: %s", path);
		free(path);
		return rc;
	}
	while (rc == 0 && (e = readdir(d))) {
		char *r, *full;
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		r = sbx_xasprintf("%s%s%s", rel, *rel ? "/" : "", e->d_name);
		full = sbx_xasprintf("%s/%s", dir, r);
		if (stat(full, &st) < 0) {
			rc = sbx_error_os("agent bundle: %s", full);
		} else if (S_ISDIR(st.st_mode)) {
			rc = ctx_walk(f, dir, r);
		} else if (S_ISREG(st.st_mode)) {
			Modal__Client__ImageContextFile *cf =
				sbx_xmalloc(sizeof(*cf));
			char *data = NULL;
			size_t len = 0;

			modal__client__image_context_file__init(cf);
			rc = sbx_file_read(full, 256u << 20, &data, &len);
			if (rc == 0) {
				cf->filename = sbx_xasprintf("sbx-agent/%s", r);
				cf->data.data = (uint8_t *)data;
				cf->data.len = len;
				f->v = sbx_xrealloc(f->v,
						    (f->n + 1) * sizeof(*f->v));
				f->v[f->n++] = cf;
				f->bytes += len;
			} else {
				free(cf);
			}
		}
		free(r);
		free(full);
	}
	closedir(d);
	free(path);
	return rc;
}

/* The agent bundle: configured, $SBX_AGENT_BUNDLE, or next to sbx. */
static int find_bundle(char **out, const struct mcfg *c)
{
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	const char *env = getenv("SBX_AGENT_BUNDLE");
	char *cand[4] = {NULL};
	int rc;

	*out = NULL;
	cand[0] = c->agent_bundle ? sbx_xstrdup(c->agent_bundle) : NULL;
	cand[1] = env && *env ? sbx_xstrdup(env) : NULL;
	if (n > 0) {
		char *slash;

		exe[n] = '\0';
		slash = strrchr(exe, '/');
		if (slash)
			*slash = '\0';
		/* build tree: build/cli/sbx -> build/sbx-agent-bundle */
		cand[2] = sbx_xasprintf("%s/../sbx-agent-bundle", exe);
		cand[3] = sbx_xasprintf("%s/../lib/sbx/sbx-agent-bundle", exe);
	}
	for (int i = 0; i < 4 && !*out; i++) {
		char *probe;
		struct stat st;

		if (!cand[i])
			continue;
		probe = sbx_xasprintf("%s/bin/sbx-agent", cand[i]);
		if (stat(probe, &st) == 0 && S_ISREG(st.st_mode)) {
			*out = cand[i];
			cand[i] = NULL;
		} else if (i < 2) {
			/* Asked for explicitly: say so rather than fall back. */
			rc = sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
					   "%s is not an agent bundle (no "
					   "bin/sbx-agent); build one with "
					   "`ninja -C build agent-bundle`",
					   cand[i]);
			free(probe);
			for (int j = 0; j < 4; j++)
				free(cand[j]);
			return rc;
		}
		free(probe);
	}
	for (int j = 0; j < 4; j++)
		free(cand[j]);
	if (!*out)
		return sbx_error_set(SBX_ERR_CONFIG, -ENOENT,
				     "no sbx-agent bundle found: build it with "
				     "`ninja -C build agent-bundle` and set "
				     "\"modal\": {\"agent_bundle\": DIR} (or "
				     "$SBX_AGENT_BUNDLE)");
	return 0;
}

struct join_ctx {
	char last[128];
	GResult *result; /* owned copy of the final result */
	bool tty;
};

static int on_join(const ProtobufCMessage *msg, void *payload)
{
	const Modal__Client__ImageJoinStreamingResponse *r =
		(const void *)msg;
	struct join_ctx *j = payload;

	if (r->entry_id && *r->entry_id)
		snprintf(j->last, sizeof(j->last), "%s", r->entry_id);
	for (size_t i = 0; i < r->n_task_logs; i++)
		if (j->tty && r->task_logs[i]->data)
			fprintf(stderr, "%s", r->task_logs[i]->data);
	if (r->result && r->result->status) {
		size_t len = protobuf_c_message_get_packed_size(
			&r->result->base);
		uint8_t *buf = sbx_xmalloc(len ? len : 1);

		protobuf_c_message_pack(&r->result->base, buf);
		j->result = modal__client__generic_result__unpack(NULL, len,
								  buf);
		free(buf);
		return 1; /* done */
	}
	return 0;
}

/* Build (or find) the image; *image_id malloc'd. */
static int build_image(struct mchan *m, const struct mcfg *c,
		       const char *app_id, char **image_id)
{
	Modal__Client__EnvironmentGetOrCreateRequest ereq =
		MODAL__CLIENT__ENVIRONMENT_GET_OR_CREATE_REQUEST__INIT;
	Modal__Client__EnvironmentGetOrCreateResponse *eresp = NULL;
	Modal__Client__ImageGetOrCreateRequest ireq =
		MODAL__CLIENT__IMAGE_GET_OR_CREATE_REQUEST__INIT;
	Modal__Client__ImageGetOrCreateResponse *iresp = NULL;
	Modal__Client__Image img = MODAL__CLIENT__IMAGE__INIT;
	struct ctx_files files = {0};
	struct join_ctx j = {.tty = isatty(STDERR_FILENO)};
	char *bundle = NULL, *cmds[3];
	const char *builder = "";
	time_t deadline = time(NULL) + BUILD_TIMEOUT_S;
	int rc;

	*image_id = NULL;
	cmds[0] = sbx_xasprintf("FROM %s", c->image);
	cmds[1] = sbx_xstrdup("COPY sbx-agent " AGENT_DIR);
	cmds[2] = sbx_xasprintf("WORKDIR %s", c->workdir);
	rc = find_bundle(&bundle, c);
	if (rc == 0)
		rc = ctx_walk(&files, bundle, "");
	if (rc < 0)
		goto out;
	ereq.deployment_name = m->env;
	rc = call(m, RPC("EnvironmentGetOrCreate"), &ereq,
		  &modal__client__environment_get_or_create_response__descriptor,
		  &eresp, true, 0);
	if (rc < 0)
		goto out;
	if (eresp->metadata && eresp->metadata->settings &&
	    eresp->metadata->settings->image_builder_version)
		builder = eresp->metadata->settings->image_builder_version;
	img.n_dockerfile_commands = 3;
	img.dockerfile_commands = cmds;
	img.n_context_files = files.n;
	img.context_files = files.v;
	ireq.image = &img;
	ireq.app_id = (char *)app_id;
	ireq.builder_version = (char *)builder;
	rc = call(m, RPC("ImageGetOrCreate"), &ireq,
		  &modal__client__image_get_or_create_response__descriptor,
		  &iresp, true, 120000);
	if (rc < 0)
		goto out;
	if (iresp->result && iresp->result->status) {
		j.result = iresp->result;
		iresp->result = NULL;
	}
	while (!j.result && time(NULL) < deadline) {
		Modal__Client__ImageJoinStreamingRequest jr =
			MODAL__CLIENT__IMAGE_JOIN_STREAMING_REQUEST__INIT;
		struct mgrpc_call mc = {.deadline_ms = 75000, .retry = true};

		jr.image_id = iresp->image_id;
		jr.timeout = 55;
		jr.last_entry_id = j.last;
		rc = mgrpc_stream(m->c, RPC("ImageJoinStreaming"), &jr.base,
				  &modal__client__image_join_streaming_response__descriptor,
				  on_join, &j, &mc);
		if (rc < 0)
			goto out;
	}
	if (!j.result) {
		rc = sbx_error_set(SBX_ERR_REMOTE, -ETIMEDOUT,
				   "image %s: no build result after %ld s",
				   iresp->image_id, BUILD_TIMEOUT_S);
		goto out;
	}
	if (j.result->status !=
	    MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_SUCCESS) {
		rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
				   "building the image from %s failed (%s): %s",
				   c->image, result_name(j.result),
				   j.result->exception && *j.result->exception
					   ? j.result->exception
					   : "no message");
		goto out;
	}
	*image_id = sbx_xstrdup(iresp->image_id);
	rc = 0;
out:
	FREE_MSG(j.result);
	FREE_MSG(eresp);
	FREE_MSG(iresp);
	ctx_files_fini(&files);
	for (int i = 0; i < 3; i++)
		free(cmds[i]);
	free(bundle);
	return rc;
}

static int get_app(struct mchan *m, const struct mcfg *c, char **app_id)
{
	Modal__Client__AppGetOrCreateRequest req =
		MODAL__CLIENT__APP_GET_OR_CREATE_REQUEST__INIT;
	Modal__Client__AppGetOrCreateResponse *resp = NULL;
	int rc;

	req.app_name = (char *)c->app;
	req.environment_name = m->env;
	req.object_creation_type =
		MODAL__CLIENT__OBJECT_CREATION_TYPE__OBJECT_CREATION_TYPE_CREATE_IF_MISSING;
	rc = call(m, RPC("AppGetOrCreate"), &req,
		  &modal__client__app_get_or_create_response__descriptor,
		  &resp, true, 0);
	if (rc == 0)
		*app_id = sbx_xstrdup(resp->app_id);
	FREE_MSG(resp);
	return rc;
}

/* ---- sandboxes -------------------------------------------------------------- */

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
	char listen[32], home[17], *tokarg;
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
	char **args = NULL, **own = NULL;
	size_t na = 0, nown = 0, cap;
	const cJSON *ev;
	int rc;

	*sandbox_id = NULL;
	rc = home_tag(home);
	if (rc < 0)
		return rc;
	snprintf(listen, sizeof(listen), "0.0.0.0:%ld", c->port);
	tokarg = sbx_xasprintf(TOKEN_ENV "=%s", token);
	cap = (size_t)cJSON_GetArraySize(c->env) + 16;
	args = sbx_xcalloc(cap, sizeof(*args));
	own = sbx_xcalloc(cap, sizeof(*own));
	args[na++] = "env";
	cJSON_ArrayForEach(ev, c->env)
		args[na++] = own[nown++] = sbx_xasprintf("%s=%s", ev->string,
							 ev->valuestring);
	args[na++] = tokarg;
	for (size_t i = 0; tail[i]; i++)
		args[na++] = (char *)tail[i];
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
	rc = call(m, RPC("SandboxCreate"), &req,
		  &modal__client__sandbox_create_response__descriptor, &resp,
		  true, 0);
	pcommon_wipe_free(tokarg);
	for (size_t i = 0; i < nown; i++)
		free(own[i]);
	free(own);
	free(args);
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
	rc = call(m, RPC("SandboxTagsSet"), &treq, &google__protobuf__empty__descriptor,
		  &empty, true, 0);
	FREE_MSG(empty);
	return rc;
}

/* The sandbox's result when it has finished (caller frees), else NULL. */
static int sandbox_result(struct mchan *m, const char *sandbox_id,
			  float wait_s, GResult **out)
{
	Modal__Client__SandboxWaitRequest req =
		MODAL__CLIENT__SANDBOX_WAIT_REQUEST__INIT;
	Modal__Client__SandboxWaitResponse *resp = NULL;
	int rc;

	*out = NULL;
	req.sandbox_id = (char *)sandbox_id;
	req.timeout = wait_s;
	rc = call(m, RPC("SandboxWait"), &req,
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
			     result_name(r),
			     r->exception && *r->exception ? ": " : "",
			     r->exception ? r->exception : "");
}

/* Wait for the task, then the tunnel of our port; *url malloc'd. */
static int wait_tunnel(struct mchan *m, const struct mcfg *c,
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
		rc = call(m, RPC("SandboxGetTaskId"), &req,
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
		rc = call(m, RPC("SandboxGetTunnels"), &req,
			  &modal__client__sandbox_get_tunnels_response__descriptor,
			  &resp, true, (long)(POLL_S * 1000) + m->deadline_ms);
		if (rc < 0)
			return rc;
		for (size_t i = 0; i < resp->n_tunnels && !*url; i++)
			if (resp->tunnels[i]->container_port == (uint32_t)c->port)
				*url = sbx_xasprintf("https://%s:%u",
						     resp->tunnels[i]->host,
						     resp->tunnels[i]->port);
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
static void agent_cfg(struct premote_config *pc, const struct mcfg *c,
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

	agent_cfg(&pc, c, url, token);
	while (time(NULL) < deadline) {
		struct premote_http *h = NULL;
		struct premote_info info;
		GResult *r = NULL;

		rc = premote_probe(&pc, &h, &info);
		if (rc == 0) {
			premote_info_fini(&info);
			premote_http_free(h);
			break;
		}
		if (sandbox_result(m, sandbox_id, 0, &r) == 0 && r) {
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

static void terminate_quietly(struct mchan *m, const char *sandbox_id)
{
	Modal__Client__SandboxTerminateRequest req =
		MODAL__CLIENT__SANDBOX_TERMINATE_REQUEST__INIT;
	Modal__Client__SandboxTerminateResponse *resp = NULL;
	struct sbx_error saved = *sbx_error_last();

	req.sandbox_id = (char *)sandbox_id;
	if (call(m, RPC("SandboxTerminate"), &req,
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
static int start_sandbox(struct mchan *m, const struct mcfg *c,
			 const char *session, const char *app_id,
			 const char *image_id, struct pin *pin)
{
	char token[65], *url = NULL;
	time_t deadline = time(NULL) + c->ready_timeout_s;
	int rc;

	rand_hex(token, 32);
	rc = create_sandbox(m, c, session, app_id, image_id, token,
			    &pin->sandbox_id);
	if (rc == 0) {
		if (isatty(STDERR_FILENO))
			fprintf(stderr, "sbx: Modal sandbox %s: waiting for "
				"its task\n", pin->sandbox_id);
		rc = wait_tunnel(m, c, pin->sandbox_id, deadline, &url, NULL);
	}
	if (rc == 0)
		rc = wait_agent(m, c, pin->sandbox_id, url, token, deadline);
	free(url);
	if (rc < 0) {
		if (pin->sandbox_id)
			terminate_quietly(m, pin->sandbox_id);
		memset(token, 0, sizeof(token));
		return rc;
	}
	pin->token = sbx_xstrdup(token);
	pin->app_id = sbx_xstrdup(app_id);
	pin->env = sbx_xstrdup(m->env);
	memset(token, 0, sizeof(token));
	return 0;
}

/* ---- the provider ------------------------------------------------------------ */

struct pmodal_provider {
	struct sbx_provider base;
	struct mcfg cfg; /* strings borrowed from base.config */
};

#define MP(p) ((struct pmodal_provider *)(p))

static void fill_info(struct sbx_sandbox_info *out, const char *session,
		      const struct mcfg *c, const char *sandbox_id,
		      const GResult *finished, const char *env, bool gone)
{
	memset(out, 0, sizeof(*out));
	out->session = sbx_xstrdup(session);
	out->provider = sbx_xstrdup("modal");
	out->sandbox_id = sbx_xstrdup(sandbox_id);
	out->workdir = sbx_xstrdup(c->workdir);
	out->isolation = sbx_xstrdup("modal");
	out->remote = true;
	out->state = SBX_STATE_READY;
	out->extra = cJSON_CreateObject();
	if (!out->extra)
		abort();
	sbx_json_set_str(out->extra, "sandbox_id", sandbox_id);
	sbx_json_set_str(out->extra, "environment", env);
	sbx_json_set_str(out->extra, "app", c->app);
	if (finished) {
		char *m = sbx_xasprintf("the Modal sandbox ended (%s%s%s)",
					result_name(finished),
					finished->exception &&
							*finished->exception
						? ": "
						: "",
					finished->exception
						? finished->exception
						: "");

		pcommon_info_failed(out, gone ? "NotFound"
					      : result_name(finished),
				    gone, m);
		free(m);
	}
}

static int pmodal_create(struct sbx_provider *p,
			 const struct sbx_create_opts *o,
			 struct sbx_sandbox_info *out)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	struct pin pin = {0};
	char *app_id = NULL, *image_id = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = pin_load(&pin, o->session);
	if (rc == 0 && pin.sandbox_id)
		rc = sbx_error_set(SBX_ERR_STATE, -EEXIST,
				   "session %s already has Modal sandbox %s",
				   o->session, pin.sandbox_id);
	pin_fini(&pin);
	if (rc < 0)
		return rc;
	rc = mchan_open(&m, &mp->cfg, NULL);
	if (rc < 0)
		return rc;
	rc = get_app(&m, &mp->cfg, &app_id);
	if (rc == 0)
		rc = build_image(&m, &mp->cfg, app_id, &image_id);
	if (rc == 0)
		rc = start_sandbox(&m, &mp->cfg, o->session, app_id, image_id,
				   &pin);
	if (rc == 0) {
		rc = pin_save(o->session, &pin);
		if (rc < 0)
			terminate_quietly(&m, pin.sandbox_id);
	}
	if (rc == 0)
		fill_info(out, o->session, &mp->cfg, pin.sandbox_id, NULL,
			  m.env, false);
	pin_fini(&pin);
	free(app_id);
	free(image_id);
	mchan_close(&m);
	return rc;
}

/* The session's sandbox: pinned, else (gc) found by tags. */
static int session_sandbox(struct pmodal_provider *mp, const char *session,
			   struct mchan *m, struct pin *pin)
{
	int rc = pin_load(pin, session);

	if (rc < 0)
		return rc;
	rc = mchan_open(m, &mp->cfg, pin->sandbox_id ? pin->env : NULL);
	if (rc < 0) {
		pin_fini(pin);
		return rc;
	}
	if (!pin->sandbox_id) {
		rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
				   "no Modal sandbox is recorded for session "
				   "%s", session);
		mchan_close(m);
	}
	return rc;
}

static int pmodal_get(struct sbx_provider *p, const char *session,
		      struct sbx_sandbox_info *out)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	struct pin pin;
	GResult *r = NULL;
	int rc;

	memset(out, 0, sizeof(*out));
	rc = session_sandbox(mp, session, &m, &pin);
	if (rc < 0)
		return rc;
	rc = sandbox_result(&m, pin.sandbox_id, 0, &r);
	if (rc == -ENOENT) {
		GResult gone = MODAL__CLIENT__GENERIC_RESULT__INIT;

		sbx_error_clear();
		gone.status =
			MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_TERMINATED;
		gone.exception = "it no longer exists";
		fill_info(out, session, &mp->cfg, pin.sandbox_id, &gone, m.env,
			  true);
		rc = 0;
	} else if (rc == 0) {
		fill_info(out, session, &mp->cfg, pin.sandbox_id, r, m.env,
			  false);
	}
	FREE_MSG(r);
	pin_fini(&pin);
	mchan_close(&m);
	return rc;
}

/* Every running sandbox tagged with this $SBX_HOME (sbx gc). */
static int pmodal_list(struct sbx_provider *p, sbx_list_cb cb, void *payload)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	char home[17], *app_id = NULL;
	double before = 0;
	int rc;

	rc = home_tag(home);
	if (rc == 0)
		rc = mchan_open(&m, &mp->cfg, NULL);
	if (rc < 0)
		return rc;
	rc = get_app(&m, &mp->cfg, &app_id);
	while (rc == 0) {
		Modal__Client__SandboxListRequest req =
			MODAL__CLIENT__SANDBOX_LIST_REQUEST__INIT;
		Modal__Client__SandboxListResponse *resp = NULL;
		Modal__Client__SandboxTag tag = MODAL__CLIENT__SANDBOX_TAG__INIT;
		Modal__Client__SandboxTag *tv[1] = {&tag};

		tag.tag_name = TAG_HOME;
		tag.tag_value = home;
		req.app_id = app_id;
		req.environment_name = m.env;
		req.n_tags = 1;
		req.tags = tv;
		req.before_timestamp = before;
		rc = call(&m, RPC("SandboxList"), &req,
			  &modal__client__sandbox_list_response__descriptor,
			  &resp, true, 0);
		if (rc < 0)
			break;
		for (size_t i = 0; i < resp->n_sandboxes && rc == 0; i++) {
			const Modal__Client__SandboxInfo *s = resp->sandboxes[i];
			const char *sess = NULL;
			struct sbx_sandbox_info info;

			for (size_t t = 0; t < s->n_tags; t++)
				if (!strcmp(s->tags[t]->tag_name, TAG_SESSION))
					sess = s->tags[t]->tag_value;
			if (!sess)
				continue;
			fill_info(&info, sess, &mp->cfg, s->id, NULL, m.env,
				  false);
			rc = cb(&info, payload);
			sbx_sandbox_info_fini(&info);
		}
		if (resp->n_sandboxes == 0 || rc != 0) {
			FREE_MSG(resp);
			break;
		}
		before = resp->sandboxes[resp->n_sandboxes - 1]->created_at;
		FREE_MSG(resp);
	}
	free(app_id);
	mchan_close(&m);
	return rc < 0 ? rc : 0;
}

/* A sandbox of this home tagged with `session` (gc: no pin). */
static int find_by_tag(struct pmodal_provider *mp, const char *session,
		       char **sandbox_id);

static int terminate_and_wait(struct mchan *m, const char *sandbox_id)
{
	Modal__Client__SandboxTerminateRequest req =
		MODAL__CLIENT__SANDBOX_TERMINATE_REQUEST__INIT;
	Modal__Client__SandboxTerminateResponse *resp = NULL;
	time_t deadline = time(NULL) + TERMINATE_WAIT_S;
	int rc;

	req.sandbox_id = (char *)sandbox_id;
	rc = call(m, RPC("SandboxTerminate"), &req,
		  &modal__client__sandbox_terminate_response__descriptor,
		  &resp, true, 0);
	FREE_MSG(resp);
	if (rc == -ENOENT) {
		sbx_error_clear();
		return 0;
	}
	while (rc == 0 && time(NULL) < deadline) {
		GResult *r = NULL;

		rc = sandbox_result(m, sandbox_id, POLL_S, &r);
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

struct find_ctx {
	const char *session;
	char *id;
};

static int find_cb(const struct sbx_sandbox_info *info, void *payload)
{
	struct find_ctx *f = payload;

	if (strcmp(info->session, f->session))
		return 0;
	f->id = sbx_xstrdup(info->sandbox_id);
	return 1;
}

static int find_by_tag(struct pmodal_provider *mp, const char *session,
		       char **sandbox_id)
{
	struct find_ctx f = {session, NULL};
	int rc = pmodal_list(&mp->base, find_cb, &f);

	*sandbox_id = f.id;
	return rc;
}

/* ---- snapshots: filesystem images, recorded under $SBX_HOME ------------------ */

/* The filesystem snapshot of a running sandbox: an image id. */
static int snapshot_image(struct mchan *m, const struct mcfg *c,
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
	rc = call(m, RPC("SandboxGetTaskId"), &treq,
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
	rc = call(m, RPC("TaskGetCommandRouterAccess"), &areq,
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
		rand_hex(uuid, 16);
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
		rc = call(m, RPC("SandboxSnapshotFs"), &lreq,
			  &modal__client__sandbox_snapshot_fs_response__descriptor,
			  &lresp, true, 70000);
		if (rc == 0 && lresp->result && lresp->result->status &&
		    lresp->result->status !=
			    MODAL__CLIENT__GENERIC_RESULT__GENERIC_STATUS__GENERIC_STATUS_SUCCESS)
			rc = sbx_error_set(SBX_ERR_REMOTE, -EIO,
					   "snapshot of Modal sandbox %s failed "
					   "(%s)", sandbox_id,
					   result_name(lresp->result));
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

static int take_snapshot(struct pmodal_provider *mp, const char *session,
			 const char *message, char **id_out)
{
	struct mchan m;
	struct pin pin;
	char id[40], *image = NULL;
	time_t now = time(NULL);
	int rc;

	*id_out = NULL;
	rc = session_sandbox(mp, session, &m, &pin);
	if (rc < 0)
		return rc;
	rc = snapshot_image(&m, &mp->cfg, pin.sandbox_id, &image);
	if (rc == 0) {
		cJSON *f = cJSON_CreateObject();

		if (!f)
			abort();
		sbx_json_set_str(f, "image_id", image);
		pcommon_snap_new_id(id, now);
		rc = pcommon_snap_record(SECTION, session, id, message, now, f);
		cJSON_Delete(f);
		if (rc == 0)
			*id_out = sbx_xstrdup(id);
	}
	free(image);
	pin_fini(&pin);
	mchan_close(&m);
	return rc;
}

static int pmodal_snapshot(struct sbx_provider *p, const char *session,
			   const char *message, char **id_out)
{
	return take_snapshot(MP(p), session, message, id_out);
}

static int pmodal_snapshots(struct sbx_provider *p, const char *session,
			    sbx_snapshot_cb cb, void *payload)
{
	return pcommon_snap_list(SECTION, session, cb, payload);
}

/*
 * A Modal filesystem snapshot is an image: restoring starts a new sandbox
 * from it and ends the old one (after saving its state).  The sandbox id
 * changes; `sbx restore` remounts.
 */
static int pmodal_restore(struct sbx_provider *p, const char *session,
			  const char *id, char **saved_out)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	struct pin pin, fresh = {0};
	char *saved = NULL;
	cJSON *j = NULL;
	int rc;

	if (saved_out)
		*saved_out = NULL;
	rc = pcommon_snap_read(&j, SECTION, session, id);
	if (rc < 0)
		return rc;
	if (!sbx_json_str(j, "image_id")) {
		cJSON_Delete(j);
		return sbx_error_set(SBX_ERR_JSON, -EINVAL,
				     "snapshot '%s' has no image id", id);
	}
	rc = take_snapshot(mp, session, "before restore", &saved);
	if (rc < 0) {
		cJSON_Delete(j);
		return sbx_error_prefix(rc, "restore refused: could not save "
					"the current state first");
	}
	rc = session_sandbox(mp, session, &m, &pin);
	if (rc == 0) {
		rc = start_sandbox(&m, &mp->cfg, session, pin.app_id,
				   sbx_json_str(j, "image_id"), &fresh);
		if (rc == 0)
			rc = pin_save(session, &fresh);
		if (rc == 0)
			(void)terminate_and_wait(&m, pin.sandbox_id);
		else if (fresh.sandbox_id)
			terminate_quietly(&m, fresh.sandbox_id);
		pin_fini(&pin);
		mchan_close(&m);
	}
	pin_fini(&fresh);
	cJSON_Delete(j);
	if (rc < 0) {
		rc = sbx_error_prefix(rc, "restore of %s (the state before is "
				      "snapshot %s)", id, saved);
		free(saved);
		return rc;
	}
	if (saved_out)
		*saved_out = saved;
	else
		free(saved);
	return 0;
}

/*
 * 1 (and *why, malloc'd) when the session's sandbox has ended, 0 when it
 * runs, < 0 when that cannot be told.
 */
static int sandbox_ended(struct pmodal_provider *mp, const char *session,
			 char **why)
{
	struct mchan m;
	struct pin pin;
	GResult *r = NULL;
	int rc;

	*why = NULL;
	rc = session_sandbox(mp, session, &m, &pin);
	if (rc < 0)
		return rc;
	rc = sandbox_result(&m, pin.sandbox_id, 0, &r);
	if (rc == -ENOENT) {
		*why = sbx_xasprintf("Modal sandbox %s no longer exists",
				     pin.sandbox_id);
		rc = 1;
	} else if (rc == 0 && r) {
		*why = sbx_xasprintf("Modal sandbox %s ended (%s%s%s)",
				     pin.sandbox_id, result_name(r),
				     r->exception && *r->exception ? ": " : "",
				     r->exception ? r->exception : "");
		rc = 1;
	}
	FREE_MSG(r);
	pin_fini(&pin);
	mchan_close(&m);
	return rc;
}

static int pmodal_terminate(struct sbx_provider *p, const char *session,
			    unsigned flags)
{
	struct pmodal_provider *mp = MP(p);
	struct mchan m;
	struct pin pin;
	char *saved = NULL, *tagged = NULL;
	int rc;

	/* The sandbox's files end with it: keep a snapshot unless forced. */
	if (!(flags & SBX_TERMINATE_FORCE)) {
		char *why = NULL;

		/* One that has ended has nothing left to snapshot. */
		rc = sandbox_ended(mp, session, &why);
		if (rc == 1) {
			pcommon_report_nothing_saved(session,
						     "the Modal sandbox", why);
			free(why);
		} else {
			sbx_error_clear();
			rc = take_snapshot(mp, session, "before sbx down",
					   &saved);
			if (rc == -ENXIO || rc == -ENOENT) {
				pcommon_report_nothing_saved(
					session, "the Modal sandbox",
					sbx_error_last()->msg);
				sbx_error_clear();
			} else if (rc < 0) {
				return sbx_error_prefix(
					rc, "not ending the Modal sandbox of "
					"session %s: could not snapshot it "
					"first (use --force to end it anyway)",
					session);
			} else {
				fprintf(stderr, "sbx: saved the files of %s as "
					"snapshot %s\n", session, saved);
			}
			free(saved);
		}
	}
	rc = pin_load(&pin, session);
	if (rc < 0)
		return rc;
	if (!pin.sandbox_id) {
		rc = find_by_tag(mp, session, &tagged);
		if (rc == 0 && !tagged)
			rc = sbx_error_set(SBX_ERR_NOTFOUND, -ENOENT,
					   "no Modal sandbox of session %s",
					   session);
	}
	if (rc == 0)
		rc = mchan_open(&m, &mp->cfg, pin.sandbox_id ? pin.env : NULL);
	if (rc == 0) {
		rc = terminate_and_wait(&m, pin.sandbox_id ? pin.sandbox_id
							   : tagged);
		mchan_close(&m);
	}
	if (rc == 0)
		pin_remove(session);
	free(tagged);
	pin_fini(&pin);
	return rc;
}

static int pmodal_open(struct sbx_provider *p, const char *session,
		       struct sbx_sandbox **out)
{
	struct pmodal_provider *mp = MP(p);
	struct premote_config pc;
	struct premote_http *h = NULL;
	struct premote_info info;
	struct mchan m;
	struct pin pin;
	char *url = NULL;
	int rc;

	*out = NULL;
	rc = session_sandbox(mp, session, &m, &pin);
	if (rc < 0)
		return rc;
	rc = wait_tunnel(&m, &mp->cfg, pin.sandbox_id,
			 time(NULL) + mp->cfg.request_s, &url, NULL);
	if (rc == 0) {
		agent_cfg(&pc, &mp->cfg, url, pin.token);
		rc = premote_probe(&pc, &h, &info);
		if (rc < 0)
			premote_config_fini(&pc);
		else
			rc = premote_sandbox_open(out, session, &pc, h, &info);
	}
	free(url);
	pin_fini(&pin);
	mchan_close(&m);
	return rc;
}

static void pmodal_free(struct sbx_provider *p)
{
	if (!p)
		return;
	cJSON_Delete(p->config);
	free(p);
}

static const struct sbx_provider_ops pmodal_ops = {
	.version = SBX_PROVIDER_OPS_VERSION,
	.name = "modal",
	.create = pmodal_create,
	.get = pmodal_get,
	.list = pmodal_list,
	.terminate = pmodal_terminate,
	.snapshot = pmodal_snapshot,
	.snapshots = pmodal_snapshots,
	.restore = pmodal_restore,
	.open = pmodal_open,
	.free = pmodal_free,
};

int pmodal_provider_new(struct sbx_provider **out, const cJSON *config)
{
	struct pmodal_provider *mp = sbx_xcalloc(1, sizeof(*mp));
	int rc;

	*out = NULL;
	mp->base.ops = &pmodal_ops;
	mp->base.config = config ? cJSON_Duplicate(config, 1)
				 : cJSON_CreateObject();
	if (!mp->base.config)
		abort();
	rc = mcfg_parse(&mp->cfg, mp->base.config);
	if (rc < 0) {
		pmodal_free(&mp->base);
		return rc;
	}
	*out = &mp->base;
	return 0;
}
