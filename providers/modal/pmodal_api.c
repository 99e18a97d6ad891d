/*
 * The Modal API channel of the modal provider (mgrpc.c with Modal's
 * headers), the app, and the image: the user's image plus the agent bundle
 * as context files; see pmodal_i.h.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/paths.h"
#include "sbx/xmalloc.h"

#include "pmodal_i.h"

#define CLIENT_VERSION "1.0.0"
#define BUILD_TIMEOUT_S 1800L

/* ---- the API channel ---------------------------------------------------------- */

void pmodal_chan_close(struct mchan *m)
{
	mgrpc_free(m->c);
	sbx_modal_creds_fini(&m->creds);
	free(m->env);
	memset(m, 0, sizeof(*m));
}

int pmodal_chan_open(struct mchan *m, const struct mcfg *c, const char *env)
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
		pmodal_chan_close(m);
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
int pmodal_call(struct mchan *m, const char *method, const void *req,
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

const char *pmodal_result_name(const GResult *r)
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
int pmodal_build_image(struct mchan *m, const struct mcfg *c,
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
	rc = pmodal_call(m, RPC("EnvironmentGetOrCreate"), &ereq,
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
	rc = pmodal_call(m, RPC("ImageGetOrCreate"), &ireq,
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
				   c->image, pmodal_result_name(j.result),
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

int pmodal_get_app(struct mchan *m, const struct mcfg *c, char **app_id)
{
	Modal__Client__AppGetOrCreateRequest req =
		MODAL__CLIENT__APP_GET_OR_CREATE_REQUEST__INIT;
	Modal__Client__AppGetOrCreateResponse *resp = NULL;
	int rc;

	req.app_name = (char *)c->app;
	req.environment_name = m->env;
	req.object_creation_type =
		MODAL__CLIENT__OBJECT_CREATION_TYPE__OBJECT_CREATION_TYPE_CREATE_IF_MISSING;
	rc = pmodal_call(m, RPC("AppGetOrCreate"), &req,
			 &modal__client__app_get_or_create_response__descriptor,
			 &resp, true, 0);
	if (rc == 0)
		*app_id = sbx_xstrdup(resp->app_id);
	FREE_MSG(resp);
	return rc;
}

