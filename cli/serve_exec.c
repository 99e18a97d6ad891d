/*
 * sbx serve: POST /session/NAME/sandbox/exec (docs/api.md, "Exec").  The
 * command runs through the session's control socket exactly as `sbx exec`
 * runs it (sbx_ctl_run()); its output comes back as NDJSON events.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/ctl.h"
#include "sbx/json.h"
#include "sbx/paths.h"
#include "sbx/proto.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "serve_i.h"

/*
 * One streamed command.  A worker thread runs sbx_ctl_run() (the client
 * of `sbx exec`) with its stdout/stderr on two pipes; the response
 * callback turns what the pipes carry into NDJSON events.  Shared by the
 * worker and the response: the last one to let go frees it.
 */
struct exec_job {
	atomic_int refs;
	char *sock;
	char *name;
	char *cwd;
	char **argv;
	char **envp;
	int out_r, err_r; /* response side */
	int out_w, err_w; /* worker side, closed when sbx_ctl_run returns */
	/* Results, written by the worker before closing out_w/err_w. */
	int rc;
	int status;
	int err_exit; /* sbx_ctl_error_exit_code() when rc < 0 */
	char msg[sizeof(((struct sbx_error *)0)->msg)];
	pthread_t thread;
	/* Response side. */
	struct serve_pending pend;
	bool done;
};

static void exec_unref(struct exec_job *x)
{
	if (atomic_fetch_sub(&x->refs, 1) != 1)
		return;
	for (size_t i = 0; x->argv && x->argv[i]; i++)
		free(x->argv[i]);
	free(x->argv);
	sbx_ctl_env_free(x->envp);
	free(x->sock);
	free(x->name);
	free(x->cwd);
	free(x->pend.text);
	free(x);
}

static void *exec_worker(void *payload)
{
	struct exec_job *x = payload;
	struct sbx_ctl_run_opts o = {
		.socket_path = x->sock,
		.session = x->name,
		.argv = (const char *const *)x->argv,
		.envp = (const char *const *)x->envp,
		.cwd = x->cwd ? x->cwd : "",
		.in_fd = -1,
		.out_fd = x->out_w,
		.err_fd = x->err_w,
	};

	x->rc = sbx_ctl_run(&o, &x->status);
	if (x->rc < 0) {
		/* Both read this thread's error: compute them here. */
		x->err_exit = sbx_ctl_error_exit_code(x->rc);
		snprintf(x->msg, sizeof(x->msg), "%s", sbx_error_last()->msg);
	}
	/* The pipes' EOF tells the response that the results are set. */
	close(x->out_w);
	close(x->err_w);
	exec_unref(x);
	return NULL;
}

static void exec_event(struct exec_job *x, const char *stream,
		       const char *data, size_t n)
{
	char *b64 = sbx_proto_base64_encode(data, n);

	serve_pending_set(&x->pend,
			  sbx_xasprintf("{\"stream\":\"%s\",\"data_b64\":"
					"\"%s\"}\n",
					stream, b64));
	free(b64);
}

static void exec_final(struct exec_job *x)
{
	cJSON *o = cJSON_CreateObject();
	char *s;

	pthread_join(x->thread, NULL);
	if (x->rc < 0) {
		cJSON *e = cJSON_CreateObject();

		sbx_json_set_str(e, "type", SBX_STATUS_EXEC_ERROR);
		sbx_json_set_str(e, "message", x->msg);
		sbx_json_set_take(o, "error", e);
		cJSON_AddNumberToObject(o, "exit", x->err_exit);
	} else {
		cJSON_AddNumberToObject(o, "exit",
					sbx_ctl_exit_code(x->status));
	}
	s = sbx_json_print(o, false);
	serve_pending_set(&x->pend, sbx_xasprintf("%s\n", s));
	free(s);
	cJSON_Delete(o);
	x->done = true;
}

static ssize_t exec_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct exec_job *x = cls;

	while (!x->pend.text) {
		struct pollfd pf[2] = {{.fd = x->out_r, .events = POLLIN},
				       {.fd = x->err_r, .events = POLLIN}};
		char data[24 * 1024];

		if (x->done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		if (x->out_r < 0 && x->err_r < 0) {
			exec_final(x);
			break;
		}
		if (poll(pf, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		for (int i = 0; i < 2 && !x->pend.text; i++) {
			int *fd = i == 0 ? &x->out_r : &x->err_r;
			ssize_t got;

			if (*fd < 0 || !pf[i].revents)
				continue;
			got = read(*fd, data, sizeof(data));
			if (got > 0) {
				exec_event(x, i == 0 ? "stdout" : "stderr",
					   data, (size_t)got);
			} else if (got == 0 ||
				   (errno != EINTR && errno != EAGAIN)) {
				close(*fd);
				*fd = -1;
			}
		}
	}
	return (ssize_t)serve_pending_copy(&x->pend, buf, max);
}

static void exec_response_free(void *cls)
{
	struct exec_job *x = cls;

	/* A client gone early: the worker's writes fail with EPIPE. */
	if (x->out_r >= 0)
		close(x->out_r);
	if (x->err_r >= 0)
		close(x->err_r);
	if (!x->done)
		pthread_detach(x->thread);
	exec_unref(x);
}

static int exec_parse(struct exec_job *x, const cJSON *body)
{
	const cJSON *argv = cJSON_GetObjectItemCaseSensitive(body, "argv");
	const cJSON *env = cJSON_GetObjectItemCaseSensitive(body, "env");
	const cJSON *it;
	char **extra = NULL;
	char *const empty[] = {NULL};
	size_t n = 0, ne = 0;
	const char *cwd = NULL;

	if (!cJSON_IsArray(argv) || cJSON_GetArraySize(argv) < 1)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "'argv' must be a non-empty array");
	x->argv = sbx_xcalloc((size_t)cJSON_GetArraySize(argv) + 1,
			      sizeof(char *));
	cJSON_ArrayForEach(it, argv)
	{
		if (!cJSON_IsString(it) || (n == 0 && !*it->valuestring))
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "'argv' must hold strings");
		x->argv[n++] = sbx_xstrdup(it->valuestring);
	}
	if (sbx_json_get_string(&cwd, body, "cwd", "request body") < 0)
		return -EINVAL;
	x->cwd = cwd ? sbx_xstrdup(cwd) : NULL;
	if (env && !cJSON_IsObject(env))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "'env' must be an object");
	extra = sbx_xcalloc((size_t)cJSON_GetArraySize(env) + 1,
			    sizeof(char *));
	cJSON_ArrayForEach(it, env)
	{
		if (!cJSON_IsString(it) || !*it->string ||
		    strchr(it->string, '=')) {
			for (size_t i = 0; i < ne; i++)
				free(extra[i]);
			free(extra);
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "'env' must map names to "
					     "strings");
		}
		extra[ne++] = sbx_xasprintf("%s=%s", it->string,
					    it->valuestring);
	}
	/* Not this server's environment: only what the request gives,
	 * plus the policy's defaults (docs/exec.md). */
	sbx_ctl_env_build(&x->envp, empty, NULL, (const char *const *)extra);
	for (size_t i = 0; i < ne; i++)
		free(extra[i]);
	free(extra);
	return 0;
}

int serve_h_exec(struct serve_req *r, const char *name)
{
	struct MHD_Response *resp;
	struct exec_job *x = NULL;
	struct sbx_session s;
	cJSON *body = NULL;
	int p1[2] = {-1, -1}, p2[2] = {-1, -1};
	enum MHD_Result ret;

	sbx_session_init(&s);
	if (serve_body_json(&body, r) < 0) {
		sbx_session_fini(&s);
		return serve_reply_error(r, SBX_STATUS_CONFIG_ERROR);
	}
	x = sbx_xcalloc(1, sizeof(*x));
	atomic_init(&x->refs, 1);
	x->out_r = x->err_r = x->out_w = x->err_w = -1;
	x->name = sbx_xstrdup(name);
	if (exec_parse(x, body) < 0) {
		ret = (enum MHD_Result)serve_reply_error(
			r, SBX_STATUS_CONFIG_ERROR);
		goto out;
	}
	if (sbx_state_load(&s, name) < 0) {
		ret = (enum MHD_Result)serve_reply_error(
			r, SBX_STATUS_EXEC_ERROR);
		goto out;
	}
	if (!sbx_status_mounted(&s)) {
		ret = (enum MHD_Result)serve_reply_errorf(
			r, MHD_HTTP_CONFLICT, SBX_STATUS_EXEC_ERROR,
			"session %s is not mounted (POST its sandbox first)",
			name);
		goto out;
	}
	if (s.control_socket)
		x->sock = sbx_xstrdup(s.control_socket);
	else if (sbx_paths_session_file(&x->sock, "run", name, ".sock") < 0) {
		ret = (enum MHD_Result)serve_reply_error(
			r, SBX_STATUS_EXEC_ERROR);
		goto out;
	}
	if (pipe2(p1, O_CLOEXEC) < 0 || pipe2(p2, O_CLOEXEC) < 0) {
		sbx_error_os("pipe");
		ret = (enum MHD_Result)serve_reply_error(
			r, SBX_STATUS_EXEC_ERROR);
		goto out;
	}
	x->out_r = p1[0];
	x->out_w = p1[1];
	x->err_r = p2[0];
	x->err_w = p2[1];
	p1[0] = p1[1] = p2[0] = p2[1] = -1;
	atomic_fetch_add(&x->refs, 1); /* the worker's */
	if (pthread_create(&x->thread, NULL, exec_worker, x) != 0) {
		atomic_fetch_sub(&x->refs, 1);
		close(x->out_w);
		close(x->err_w);
		close(x->out_r);
		close(x->err_r);
		ret = (enum MHD_Result)serve_reply_errorf(
			r, 500, SBX_STATUS_EXEC_ERROR, "cannot start a thread");
		goto out;
	}
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024,
						 exec_read, x,
						 exec_response_free);
	x = NULL; /* the response's reference */
	if (!resp) {
		ret = MHD_NO;
		goto out;
	}
	ret = (enum MHD_Result)serve_queue(r, MHD_HTTP_OK, resp,
					   "application/x-ndjson");
out:
	for (int i = 0; i < 2; i++) {
		if (p1[i] >= 0)
			close(p1[i]);
		if (p2[i] >= 0)
			close(p2[i]);
	}
	if (x)
		exec_unref(x);
	cJSON_Delete(body);
	sbx_session_fini(&s);
	return ret;
}
