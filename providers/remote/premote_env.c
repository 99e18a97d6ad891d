/*
 * The environment of a command in a remote sandbox; see premote_exec_env()
 * in premote_i.h and docs/exec.md ("Environment policy").
 *
 * Sandboxes that sbx starts in a container (kubernetes, modal) have an
 * environment of their own -- the image's ENV plus the pod spec's env --
 * which is what a command there should see: the client's PATH names
 * directories of the client's machine, and the daemon's HOME/USER are the
 * client's user.  The agent runs a command with its own environment when
 * the request has no "env" (docs/protocol.md), so the sandbox's
 * environment is read once by running `env -0` that way; every later
 * command gets it, overlaid with what the client sent (terminal and
 * locale variables, SBX_EXEC_ENV names, SBX_SESSION) minus the
 * client-machine variables, unless the user set those with `-e`.
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "sbx/buf.h"
#include "sbx/ctl.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"

#include "premote_i.h"

#define ENV_MAX (1u << 20)
#define EXEC_SET "SBX_EXEC_SET"

/* Variables that describe the client's machine, not the sandbox. */
static const char *const client_only[] = {
	"PATH", "HOME", "USER", "LOGNAME", "SHELL", NULL,
};

void premote_env_free(char **env)
{
	for (size_t i = 0; env && env[i]; i++)
		free(env[i]);
	free(env);
}

void premote_exec_env_fini(struct premote_sandbox *s)
{
	premote_env_free(s->cenv);
	s->cenv = NULL;
	pthread_mutex_destroy(&s->cenv_lock);
}

/* Length of the name of "NAME=VALUE" (the whole string without '='). */
static size_t name_len(const char *kv)
{
	const char *eq = strchr(kv, '=');

	return eq ? (size_t)(eq - kv) : strlen(kv);
}

static bool named(const char *kv, const char *name, size_t n)
{
	return name_len(kv) == n && !strncmp(kv, name, n);
}

struct collect {
	struct sbx_buf out;
	char *id;
	int exit_code;
	bool exited;
};

static int on_frame(const cJSON *hdr, const void *data, size_t len,
		    void *payload)
{
	struct collect *c = payload;
	const cJSON *ex = cJSON_GetObjectItemCaseSensitive(hdr, "exit");
	const char *stream = sbx_json_str(hdr, "stream");
	const char *id = sbx_json_str(hdr, "id");

	if (id && !c->id)
		c->id = sbx_xstrdup(id);
	if (ex) {
		c->exit_code = (int)cJSON_GetNumberValue(
			cJSON_GetObjectItemCaseSensitive(ex, "code"));
		c->exited = true;
	}
	if (stream && !strcmp(stream, "stdout") && len &&
	    sbx_buf_add(&c->out, data, len) < 0)
		return sbx_error_set(SBX_ERR_PROTO, -EMSGSIZE,
				     "the sandbox's environment is larger than "
				     "%u bytes", ENV_MAX);
	return 0;
}

/* Run argv with the agent's environment; its stdout into c->out. */
static int run_env(struct premote_sandbox *s, const char *const *argv,
		   struct collect *c)
{
	cJSON *b = cJSON_CreateObject(), *a = cJSON_CreateArray();
	struct premote_req r = {
		.method = "POST", .route = "/v1/exec",
		.content_type = SBX_CT_JSON, .cancel_fd = -1,
		.frames = on_frame, .payload = c,
	};
	struct premote_resp resp;
	char *text, *route;
	int rc;

	if (!b || !a)
		abort();
	for (size_t i = 0; argv[i]; i++)
		cJSON_AddItemToArray(a, cJSON_CreateString(argv[i]));
	cJSON_AddItemToObject(b, "argv", a);
	sbx_json_set_str(b, "cwd", "");
	cJSON_AddBoolToObject(b, "attach", true);
	/* No "env": the command gets the agent's (the container's) own. */
	text = sbx_json_print(b, false);
	cJSON_Delete(b);
	r.body = text;
	r.body_len = strlen(text);
	premote_resp_init(&resp);
	rc = premote_http_do(s->http, &r, &resp);
	premote_resp_fini(&resp);
	free(text);
	if (c->id) {
		/* Free the agent's record of it (best effort). */
		route = sbx_xasprintf("/v1/exec/%s", c->id);
		if (premote_http_json(s->http, "DELETE", route, NULL, NULL,
				      true, NULL) < 0)
			sbx_error_clear();
		free(route);
	}
	if (rc == 0 && (!c->exited || c->exit_code != 0))
		rc = sbx_error_set(SBX_ERR_REMOTE, -EIO, "%s exited with %d",
				   argv[0], c->exit_code);
	return rc;
}

/* Split `data` at `sep` into a NULL-terminated list of "K=V" strings. */
static char **split_env(const char *data, size_t len, char sep)
{
	char **v = NULL;
	size_t n = 0;

	for (size_t i = 0; i < len;) {
		const char *p = data + i;
		const char *end = memchr(p, sep, len - i);
		size_t l = end ? (size_t)(end - p) : len - i;

		if (l && memchr(p, '=', l)) {
			v = sbx_xrealloc(v, (n + 2) * sizeof(*v));
			v[n++] = sbx_xstrndup(p, l);
			v[n] = NULL;
		}
		i += l + 1;
	}
	if (!v)
		v = sbx_xcalloc(1, sizeof(*v));
	return v;
}

/* The sandbox's own environment, or NULL when it cannot be read. */
static char **read_cenv(struct premote_sandbox *s)
{
	static const char *const nul[] = {"env", "-0", NULL};
	static const char *const lines[] = {"env", NULL};
	struct collect c;
	char **env = NULL;
	int rc;

	for (int pass = 0; pass < 2 && !env; pass++) {
		memset(&c, 0, sizeof(c));
		sbx_buf_init(&c.out, ENV_MAX);
		rc = run_env(s, pass ? lines : nul, &c);
		if (rc == 0)
			env = split_env(sbx_buf_ptr(&c.out),
					sbx_buf_len(&c.out), pass ? '\n' : '\0');
		else
			sbx_debug("reading the sandbox's environment with %s "
				  "failed: %s", pass ? "env" : "env -0",
				  sbx_error_last()->msg);
		sbx_error_clear();
		sbx_buf_fini(&c.out);
		free(c.id);
	}
	if (!env)
		sbx_warn("could not read the environment of the sandbox at %s "
			 "(does its image have `env`?): commands get the "
			 "client's PATH", s->cfg.url);
	return env;
}

int premote_exec_env(struct premote_sandbox *s, const char *const *envp,
		     char ***out)
{
	const char *set = NULL;
	char **res;
	size_t n = 0, ne = 0, nb = 0;

	*out = NULL;
	for (; envp && envp[ne]; ne++)
		if (named(envp[ne], EXEC_SET, strlen(EXEC_SET)))
			set = envp[ne] + strlen(EXEC_SET) + 1;
	if (s->cfg.container_env) {
		pthread_mutex_lock(&s->cenv_lock);
		if (!s->cenv_tried) {
			s->cenv_tried = true;
			s->cenv = read_cenv(s);
		}
		pthread_mutex_unlock(&s->cenv_lock);
	}
	/* s->cenv is written once, under the lock, before anyone reads it. */
	for (; s->cenv && s->cenv[nb]; nb++)
		;
	res = sbx_xcalloc(nb + ne + 1, sizeof(*res));
	for (size_t i = 0; i < ne; i++) {
		const char *kv = envp[i];
		size_t l = name_len(kv);
		bool drop = named(kv, EXEC_SET, strlen(EXEC_SET));

		for (size_t k = 0; s->cenv && client_only[k] && !drop; k++)
			if (named(kv, client_only[k], strlen(client_only[k])) &&
			    !sbx_ctl_env_listed(set, kv, l))
				drop = true;
		if (!drop)
			res[n++] = sbx_xstrdup(kv);
	}
	/* The sandbox's own, for every name the overlay does not set. */
	for (size_t b = 0; b < nb; b++) {
		const char *kv = s->cenv[b];
		size_t l = name_len(kv);
		bool taken = false;

		for (size_t i = 0; i < n && !taken; i++)
			taken = named(res[i], kv, l);
		if (!taken)
			res[n++] = sbx_xstrdup(kv);
	}
	res[n] = NULL;
	*out = res;
	return 0;
}
