/*
 * sbx serve: routes, the event stream and exec streaming (docs/api.md).
 *
 * Lifecycle routes call the same functions as the CLI (cli_session_up(),
 * cli_session_down(), the provider's snapshot operations through
 * cli_session_lock_load()/cli_session_provider()) under serve->ops_lock.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/ctl.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/proto.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "serve_i.h"

/* ---- replies --------------------------------------------------------- */

static int reply_text(struct serve_req *r, unsigned status, char *text,
		      const char *ctype)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;

	resp = MHD_create_response_from_buffer(strlen(text), text,
					       MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(text);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
	MHD_add_response_header(resp, "Cache-Control", "no-store");
	ret = MHD_queue_response(r->conn, status, resp);
	MHD_destroy_response(resp);
	r->answered = true;
	r->status = status;
	return ret;
}

int serve_reply_json(struct serve_req *r, unsigned status, const cJSON *j)
{
	char *s = sbx_json_print(j, false);
	char *t = sbx_xasprintf("%s\n", s);

	free(s);
	return reply_text(r, status, t, "application/json");
}

static int reply_err(struct serve_req *r, unsigned status, const char *type,
		     const char *msg)
{
	cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateObject();
	int ret;

	sbx_json_set_str(e, "type", type);
	sbx_json_set_str(e, "message", msg);
	sbx_json_set_take(o, "error", e);
	ret = serve_reply_json(r, status, o);
	cJSON_Delete(o);
	return ret;
}

int serve_reply_errorf(struct serve_req *r, unsigned status,
		       const char *type, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return reply_err(r, status, type, msg);
}

int serve_reply_error(struct serve_req *r, const char *fallback_type)
{
	const struct sbx_error *e = sbx_error_last();
	const char *type = sbx_status_error_type(e->klass, fallback_type);
	unsigned status = MHD_HTTP_INTERNAL_SERVER_ERROR;

	if (e->klass == SBX_ERR_NOTFOUND)
		status = MHD_HTTP_NOT_FOUND;
	else if (e->klass == SBX_ERR_STATE || e->code == -EBUSY)
		status = MHD_HTTP_CONFLICT;
	else if (e->klass == SBX_ERR_CONFIG || e->klass == SBX_ERR_JSON)
		status = MHD_HTTP_BAD_REQUEST;
	if (e->klass == SBX_ERR_JSON)
		type = SBX_STATUS_CONFIG_ERROR;
	return reply_err(r, status, type,
			 e->klass != SBX_ERR_NONE ? e->msg : "failed");
}

/* ---- events ------------------------------------------------------------ */

void serve_init(struct serve *srv)
{
	memset(srv, 0, sizeof(*srv));
	atomic_init(&srv->stopping, false);
	pthread_mutex_init(&srv->ops_lock, NULL);
	pthread_mutex_init(&srv->ev_lock, NULL);
	pthread_cond_init(&srv->ev_cond, NULL);
}

void serve_fini(struct serve *srv)
{
	for (size_t i = 0; i < SERVE_EV_RING; i++)
		free(srv->ev_ring[i]);
	if (srv->token)
		explicit_bzero(srv->token, srv->token_len);
	free(srv->token);
	pthread_cond_destroy(&srv->ev_cond);
	pthread_mutex_destroy(&srv->ev_lock);
	pthread_mutex_destroy(&srv->ops_lock);
}

void serve_wake(struct serve *srv)
{
	pthread_mutex_lock(&srv->ev_lock);
	pthread_cond_broadcast(&srv->ev_cond);
	pthread_mutex_unlock(&srv->ev_lock);
}

void serve_event(struct serve *srv, const char *session, const char *state,
		 const cJSON *status)
{
	cJSON *o = cJSON_CreateObject();
	char *s;

	sbx_json_set_str(o, "session", session);
	sbx_json_set_str(o, "state", state);
	sbx_json_set_take(o, "status", status ? cJSON_Duplicate(status, 1)
					      : cJSON_CreateNull());
	s = sbx_json_print(o, false);
	cJSON_Delete(o);
	pthread_mutex_lock(&srv->ev_lock);
	free(srv->ev_ring[srv->ev_next % SERVE_EV_RING]);
	srv->ev_ring[srv->ev_next % SERVE_EV_RING] = s;
	srv->ev_next++;
	pthread_cond_broadcast(&srv->ev_cond);
	pthread_mutex_unlock(&srv->ev_lock);
}

struct sse {
	struct serve *srv;
	uint64_t next; /* next event to send */
	char *pend;    /* formatted, not yet sent */
	size_t plen, poff;
};

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct sse *x = cls;
	struct serve *srv = x->srv;
	size_t n;

	if (!x->pend) {
		struct timespec ts;

		pthread_mutex_lock(&srv->ev_lock);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 15;
		while (x->next == srv->ev_next &&
		       !atomic_load(&srv->stopping)) {
			if (pthread_cond_timedwait(&srv->ev_cond,
						   &srv->ev_lock,
						   &ts) == ETIMEDOUT)
				break;
		}
		if (atomic_load(&srv->stopping)) {
			pthread_mutex_unlock(&srv->ev_lock);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		/* A reader that fell behind the ring skips what is gone. */
		if (srv->ev_next - x->next > SERVE_EV_RING)
			x->next = srv->ev_next - SERVE_EV_RING;
		if (x->next < srv->ev_next) {
			x->pend = sbx_xasprintf(
				"id: %llu\nevent: session\ndata: %s\n\n",
				(unsigned long long)x->next,
				srv->ev_ring[x->next % SERVE_EV_RING]);
			x->next++;
		} else {
			x->pend = sbx_xstrdup(": keep-alive\n\n");
		}
		pthread_mutex_unlock(&srv->ev_lock);
		x->plen = strlen(x->pend);
		x->poff = 0;
	}
	n = x->plen - x->poff;
	if (n > max)
		n = max;
	memcpy(buf, x->pend + x->poff, n);
	x->poff += n;
	if (x->poff == x->plen) {
		free(x->pend);
		x->pend = NULL;
	}
	return (ssize_t)n;
}

static void sse_free(void *cls)
{
	struct sse *x = cls;

	free(x->pend);
	free(x);
}

static int h_events(struct serve_req *r)
{
	struct MHD_Response *resp;
	struct sse *x = sbx_xcalloc(1, sizeof(*x));
	enum MHD_Result ret;

	x->srv = r->srv;
	/* Only what happens from now on (no replay of old events). */
	pthread_mutex_lock(&r->srv->ev_lock);
	x->next = r->srv->ev_next;
	pthread_mutex_unlock(&r->srv->ev_lock);
	x->pend = sbx_xstrdup(": sbx events\n\n");
	x->plen = strlen(x->pend);
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
						 sse_read, x, sse_free);
	if (!resp) {
		sse_free(x);
		return MHD_NO;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				"text/event-stream");
	MHD_add_response_header(resp, "Cache-Control", "no-store");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	r->answered = true;
	r->status = MHD_HTTP_OK;
	return ret;
}

/* ---- helpers ------------------------------------------------------------- */

static const char *arg(struct serve_req *r, const char *key)
{
	return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

static bool arg_true(struct serve_req *r, const char *key, bool dflt)
{
	const char *v = arg(r, key);

	if (!v)
		return dflt;
	return strcmp(v, "false") != 0 && strcmp(v, "0") != 0;
}

/* The body as a JSON object; an empty body is {}. */
static int body_json(cJSON **out, struct serve_req *r)
{
	size_t n = sbx_buf_len(&r->body);
	int rc;

	*out = NULL;
	if (n == 0) {
		*out = cJSON_CreateObject();
		return 0;
	}
	rc = sbx_json_parse(out, sbx_buf_ptr(&r->body), n, "request body");
	if (rc == 0 && !cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		*out = NULL;
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "request body: expected a JSON object");
	}
	return rc;
}

/* ---- sessions -------------------------------------------------------- */

static int h_list(struct serve_req *r)
{
	cJSON *arr = cJSON_CreateArray();
	char **names = NULL;
	size_t n = 0;
	int ret;

	if (sbx_state_list(&names, &n) < 0) {
		cJSON_Delete(arr);
		return serve_reply_error(r, SBX_STATUS_FILE_ERROR);
	}
	for (size_t i = 0; i < n; i++) {
		struct sbx_session s;

		if (sbx_state_load(&s, names[i]) == 0)
			cJSON_AddItemToArray(arr, sbx_status_new(&s));
		else
			sbx_error_clear(); /* removed meanwhile */
		sbx_session_fini(&s);
	}
	sbx_state_names_free(names, n);
	ret = serve_reply_json(r, MHD_HTTP_OK, arr);
	cJSON_Delete(arr);
	return ret;
}

static int h_get(struct serve_req *r, const char *name)
{
	struct sbx_session s;
	cJSON *j;
	int ret;

	if (sbx_state_load(&s, name) < 0) {
		sbx_session_fini(&s);
		return serve_reply_error(r, SBX_STATUS_FILE_ERROR);
	}
	j = sbx_status_new(&s);
	sbx_status_probe(j, &s, SBX_STATUS_PING_MS);
	sbx_session_fini(&s);
	ret = serve_reply_json(r, MHD_HTTP_OK, j);
	cJSON_Delete(j);
	return ret;
}

/* A create request, owned by whoever runs it (handler or worker). */
struct up_job {
	struct serve *srv;
	char *name;
	cJSON *body;  /* the request body */
	cJSON *flags; /* configuration layer built from it */
};

static void up_job_free(struct up_job *j)
{
	if (!j)
		return;
	free(j->name);
	cJSON_Delete(j->body);
	cJSON_Delete(j->flags);
	free(j);
}

/*
 * Run cli_session_up() for the job under ops_lock, with events.  Returns
 * rc; on success *status_out is the status, on failure *type_out the
 * error type for the reply.
 */
static int run_up(cJSON **status_out, const char **type_out,
		  struct up_job *j)
{
	struct cli_up_opts o = {0};
	bool existed;
	int rc, code;

	*type_out = SBX_STATUS_CREATE_ERROR;
	o.name = j->name;
	o.repo = sbx_json_str(j->body, "repo");
	o.ref = sbx_json_str(j->body, "ref");
	o.mount = sbx_json_str(j->body, "mount");
	o.carry = sbx_json_bool(j->body, "carry_changes", false);
	o.no_repo = sbx_json_bool(j->body, "no_repo", false);
	{
		const cJSON *d = cJSON_GetObjectItemCaseSensitive(j->body,
								  "depth");

		o.depth = cJSON_IsNumber(d) ? (int)d->valuedouble : 0;
	}
	o.flags = j->flags;
	o.config_file = cli_g.config_file;
	pthread_mutex_lock(&j->srv->ops_lock);
	if (atomic_load(&j->srv->stopping)) {
		pthread_mutex_unlock(&j->srv->ops_lock);
		return sbx_error_set(SBX_ERR_STATE, -ESHUTDOWN,
				     "sbx serve is shutting down");
	}
	existed = sbx_state_exists(j->name);
	if (!existed)
		serve_event(j->srv, j->name, "creating", NULL);
	rc = cli_session_up(status_out, &code, &o);
	if (rc < 0) {
		if (code == CLI_EXIT_CONFIG || code == CLI_EXIT_USAGE)
			*type_out = SBX_STATUS_CONFIG_ERROR;
		else if (code != CLI_EXIT_CREATE)
			*type_out = SBX_STATUS_FILE_ERROR;
		serve_event(j->srv, j->name, "error", NULL);
	} else {
		serve_event(j->srv, j->name,
			    sbx_json_str(*status_out, "state"), *status_out);
	}
	pthread_mutex_unlock(&j->srv->ops_lock);
	return rc;
}

static void *up_worker(void *payload)
{
	struct up_job *j = payload;
	const char *type;
	cJSON *st = NULL;

	if (run_up(&st, &type, j) < 0)
		sbx_warn("create session %s: %s", j->name,
			 sbx_error_last()->msg);
	cJSON_Delete(st);
	up_job_free(j);
	return NULL;
}

/* The configuration layer of a body: provider and provider sections. */
static int body_flags(cJSON **out, const cJSON *body)
{
	const cJSON *it;
	cJSON *flags = cJSON_CreateObject();

	*out = NULL;
	cJSON_ArrayForEach(it, body)
	{
		if (strcmp(it->string, "provider") == 0) {
			if (!cJSON_IsString(it))
				goto bad;
			sbx_json_set_str(flags, "provider", it->valuestring);
		} else if (cJSON_IsObject(it)) {
			/* "local": {...}, "remote": {...}, ... */
			sbx_json_set_take(flags, it->string,
					  cJSON_Duplicate(it, 1));
		} else if (strcmp(it->string, "carry_changes") == 0 ||
			   strcmp(it->string, "no_repo") == 0) {
			if (!cJSON_IsBool(it))
				goto bad;
		} else if (strcmp(it->string, "depth") == 0) {
			/* commits of history for a sandbox elsewhere; 0: all */
			if (!cJSON_IsNumber(it) || it->valuedouble < 0 ||
			    it->valuedouble > 1e9 ||
			    it->valuedouble != (double)(int)it->valuedouble)
				goto bad;
		} else if (strcmp(it->string, "repo") == 0 ||
			   strcmp(it->string, "ref") == 0 ||
			   strcmp(it->string, "mount") == 0) {
			if (!cJSON_IsString(it))
				goto bad;
		} else {
			cJSON_Delete(flags);
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "request body: unknown key '%s'",
					     it->string);
		}
	}
	*out = flags;
	return 0;
bad:
	cJSON_Delete(flags);
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "request body: '%s' has the wrong type",
			     it->string);
}

static int h_up(struct serve_req *r, const char *name)
{
	struct up_job *j = sbx_xcalloc(1, sizeof(*j));
	const char *type;
	cJSON *st = NULL;
	int ret;

	j->srv = r->srv;
	j->name = sbx_xstrdup(name);
	if (body_json(&j->body, r) < 0 || body_flags(&j->flags, j->body) < 0) {
		up_job_free(j);
		return serve_reply_error(r, SBX_STATUS_CONFIG_ERROR);
	}
	if (!arg_true(r, "wait", true)) {
		struct sbx_session s;
		pthread_attr_t attr;
		pthread_t t;

		/* Live already: nothing to wait for. */
		if (sbx_state_load(&s, name) == 0 && sbx_status_mounted(&s) &&
		    s.state == SBX_STATE_READY) {
			st = sbx_status_new(&s);
			sbx_session_fini(&s);
			up_job_free(j);
			ret = serve_reply_json(r, MHD_HTTP_OK, st);
			cJSON_Delete(st);
			return ret;
		}
		sbx_session_fini(&s);
		sbx_error_clear();
		/* What the record will say while the worker creates it. */
		sbx_session_init(&s);
		s.session = sbx_xstrdup(name);
		s.provider = sbx_xstrdup(sbx_json_str(j->flags, "provider")
						 ? sbx_json_str(j->flags,
								"provider")
						 : "local");
		s.state = SBX_STATE_CREATING;
		st = sbx_status_build(&s, false);
		sbx_session_fini(&s);
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&t, &attr, up_worker, j) != 0) {
			pthread_attr_destroy(&attr);
			up_job_free(j);
			cJSON_Delete(st);
			return serve_reply_errorf(r, 500, "CreateError",
						  "cannot start a thread");
		}
		pthread_attr_destroy(&attr);
		ret = serve_reply_json(r, MHD_HTTP_ACCEPTED, st);
		cJSON_Delete(st);
		return ret;
	}
	if (run_up(&st, &type, j) < 0) {
		up_job_free(j);
		return serve_reply_error(r, type);
	}
	up_job_free(j);
	ret = serve_reply_json(r, MHD_HTTP_OK, st);
	cJSON_Delete(st);
	return ret;
}

static int h_down(struct serve_req *r, const char *name)
{
	unsigned flags = 0;
	cJSON *o;
	int rc, ret;

	if (arg_true(r, "force", false))
		flags |= SBX_TERMINATE_FORCE;
	if (arg_true(r, "delete_branch", false))
		flags |= SBX_TERMINATE_DELETE_BRANCH;
	pthread_mutex_lock(&r->srv->ops_lock);
	rc = cli_session_down(name, flags, false);
	if (rc == 0)
		serve_event(r->srv, name, "stopped", NULL);
	pthread_mutex_unlock(&r->srv->ops_lock);
	if (rc < 0)
		return serve_reply_error(r, SBX_STATUS_FILE_ERROR);
	o = cJSON_CreateObject();
	sbx_json_set_str(o, "session", name);
	sbx_json_set_str(o, "state", "stopped");
	ret = serve_reply_json(r, MHD_HTTP_OK, o);
	cJSON_Delete(o);
	return ret;
}

/* ---- snapshots ------------------------------------------------------- */

static int h_snapshot(struct serve_req *r, const char *name, bool restore)
{
	struct sbx_provider *p = NULL;
	struct sbx_session s;
	cJSON *body = NULL, *o = NULL;
	const char *snap = NULL, *msg = NULL;
	char *id = NULL;
	int rc, lock = -1, ret;

	sbx_session_init(&s);
	rc = body_json(&body, r);
	if (rc == 0 && restore) {
		rc = sbx_json_get_string(&snap, body, "snapshot",
					 "request body");
		if (rc == 0 && (!snap || !*snap))
			rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					   "request body: \"snapshot\" is "
					   "missing");
	} else if (rc == 0) {
		rc = sbx_json_get_string(&msg, body, "message",
					 "request body");
	}
	if (rc < 0) {
		cJSON_Delete(body);
		return serve_reply_error(r, SBX_STATUS_CONFIG_ERROR);
	}
	pthread_mutex_lock(&r->srv->ops_lock);
	rc = cli_session_lock_load(&s, &lock, name);
	if (rc == 0)
		rc = cli_session_provider(&p, &s);
	if (rc == 0 && restore)
		rc = p->ops->restore(p, s.session, snap, &id);
	else if (rc == 0)
		rc = p->ops->snapshot(p, s.session,
				      msg ? msg : "sbx snapshot", &id);
	sbx_provider_free(p);
	sbx_state_unlock(lock);
	sbx_session_fini(&s);
	pthread_mutex_unlock(&r->srv->ops_lock);
	if (rc < 0) {
		ret = serve_reply_error(r, SBX_STATUS_FILE_ERROR);
		goto out;
	}
	o = cJSON_CreateObject();
	if (restore) {
		sbx_json_set_str(o, "restored", snap);
		if (id)
			sbx_json_set_str(o, "saved", id);
		else
			sbx_json_set_take(o, "saved", cJSON_CreateNull());
	} else {
		sbx_json_set_str(o, "id", id);
	}
	ret = serve_reply_json(r, restore ? MHD_HTTP_OK : MHD_HTTP_CREATED, o);
out:
	cJSON_Delete(o);
	cJSON_Delete(body);
	free(id);
	return ret;
}

static int add_snap(const struct sbx_snapshot_info *snap, void *payload)
{
	cJSON *arr = payload, *o = cJSON_CreateObject();
	char when[32];

	sbx_json_time_format(when, sizeof(when), snap->created_at);
	sbx_json_set_str(o, "id", snap->id);
	sbx_json_set_str(o, "created_at", when);
	sbx_json_set_str(o, "message", snap->message);
	cJSON_AddItemToArray(arr, o);
	return 0;
}

static int h_snapshots(struct serve_req *r, const char *name)
{
	struct sbx_provider *p = NULL;
	struct sbx_session s;
	cJSON *arr = cJSON_CreateArray();
	int rc, ret;

	/* Read-only, as `sbx snapshots`: no lock. */
	rc = sbx_state_load(&s, name);
	if (rc == 0)
		rc = cli_session_provider(&p, &s);
	if (rc == 0)
		rc = p->ops->snapshots(p, s.session, add_snap, arr);
	sbx_provider_free(p);
	sbx_session_fini(&s);
	if (rc < 0)
		ret = serve_reply_error(r, SBX_STATUS_FILE_ERROR);
	else
		ret = serve_reply_json(r, MHD_HTTP_OK, arr);
	cJSON_Delete(arr);
	return ret;
}

/* ---- exec ---------------------------------------------------------------- */

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
	char *pend;
	size_t plen, poff;
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
	free(x->pend);
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

	x->pend = sbx_xasprintf("{\"stream\":\"%s\",\"data_b64\":\"%s\"}\n",
				stream, b64);
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
	x->pend = sbx_xasprintf("%s\n", s);
	free(s);
	cJSON_Delete(o);
	x->done = true;
}

static ssize_t exec_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct exec_job *x = cls;
	size_t n;

	while (!x->pend) {
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
		for (int i = 0; i < 2 && !x->pend; i++) {
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
	n = x->plen ? x->plen - x->poff : strlen(x->pend);
	if (!x->plen)
		x->plen = n;
	if (n > max)
		n = max;
	memcpy(buf, x->pend + x->poff, n);
	x->poff += n;
	if (x->poff == x->plen) {
		free(x->pend);
		x->pend = NULL;
		x->plen = x->poff = 0;
	}
	return (ssize_t)n;
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

static int h_exec(struct serve_req *r, const char *name)
{
	struct MHD_Response *resp;
	struct exec_job *x = NULL;
	struct sbx_session s;
	cJSON *body = NULL;
	int p1[2] = {-1, -1}, p2[2] = {-1, -1};
	enum MHD_Result ret;

	sbx_session_init(&s);
	if (body_json(&body, r) < 0) {
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
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				"application/x-ndjson");
	MHD_add_response_header(resp, "Cache-Control", "no-store");
	ret = MHD_queue_response(r->conn, MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	r->answered = true;
	r->status = MHD_HTTP_OK;
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

/* ---- routing --------------------------------------------------------- */

enum verb { V_GET, V_POST, V_DELETE, V_OTHER };

int serve_dispatch(struct serve_req *r)
{
	enum verb v = V_OTHER;
	char name[256];
	const char *rest, *slash;
	size_t n;

	if (strcmp(r->method, "GET") == 0)
		v = V_GET;
	else if (strcmp(r->method, "POST") == 0)
		v = V_POST;
	else if (strcmp(r->method, "DELETE") == 0)
		v = V_DELETE;

	if (strcmp(r->url, "/events") == 0) {
		if (v != V_GET)
			goto method;
		return h_events(r);
	}
	if (strcmp(r->url, "/session") == 0 ||
	    strcmp(r->url, "/session/") == 0) {
		if (v != V_GET)
			goto method;
		return h_list(r);
	}
	if (strncmp(r->url, "/session/", 9) != 0)
		goto notfound;
	rest = r->url + 9;
	slash = strchr(rest, '/');
	if (!slash)
		goto notfound;
	n = (size_t)(slash - rest);
	if (n == 0 || n >= sizeof(name))
		goto notfound;
	memcpy(name, rest, n);
	name[n] = '\0';
	if (sbx_name_validate(name) < 0)
		return serve_reply_error(r, SBX_STATUS_CONFIG_ERROR);
	rest = slash;
	if (strcmp(rest, "/sandbox") == 0) {
		if (v == V_GET)
			return h_get(r, name);
		if (v == V_POST)
			return h_up(r, name);
		if (v == V_DELETE)
			return h_down(r, name);
		goto method;
	}
	if (strcmp(rest, "/sandbox/snapshot") == 0) {
		if (v != V_POST)
			goto method;
		return h_snapshot(r, name, false);
	}
	if (strcmp(rest, "/sandbox/restore") == 0) {
		if (v != V_POST)
			goto method;
		return h_snapshot(r, name, true);
	}
	if (strcmp(rest, "/sandbox/snapshots") == 0) {
		if (v != V_GET)
			goto method;
		return h_snapshots(r, name);
	}
	if (strcmp(rest, "/sandbox/exec") == 0) {
		if (v != V_POST)
			goto method;
		return h_exec(r, name);
	}
notfound:
	return serve_reply_errorf(r, MHD_HTTP_NOT_FOUND,
				  SBX_STATUS_NOTFOUND_ERROR, "no route %s %s",
				  r->method, r->url);
method:
	return serve_reply_errorf(r, MHD_HTTP_METHOD_NOT_ALLOWED,
				  SBX_STATUS_CONFIG_ERROR,
				  "%s is not allowed on %s", r->method,
				  r->url);
}
