/*
 * sbx serve: the route table, replies, the event stream and the session
 * routes (docs/api.md); the exec stream is serve_exec.c's.
 *
 * Lifecycle routes call the same functions as the CLI (cli_session_up(),
 * cli_session_down(), the provider's snapshot operations through
 * cli_session_lock_load()/cli_session_provider()) under serve->ops_lock.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/httpd.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/provider.h"
#include "sbx/state.h"
#include "sbx/status.h"
#include "sbx/xmalloc.h"
#include "cli_i.h"
#include "serve_i.h"

/* ---- replies --------------------------------------------------------- */

int serve_queue(struct serve_req *r, unsigned status,
		struct MHD_Response *take, const char *content_type)
{
	r->answered = true;
	r->status = status;
	return sbx_httpd_queue(r->conn, status, take, content_type, NULL);
}

int serve_reply_json(struct serve_req *r, unsigned status, const cJSON *j)
{
	struct MHD_Response *resp = sbx_httpd_json_response(j);

	if (!resp)
		return MHD_NO;
	return serve_queue(r, status, resp, "application/json");
}

static int reply_err(struct serve_req *r, unsigned status, const char *type,
		     const char *msg)
{
	cJSON *o = sbx_httpd_error_json("type", type, msg);
	int ret;

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

void serve_pending_set(struct serve_pending *p, char *take)
{
	p->text = take;
	p->len = strlen(take);
	p->off = 0;
}

size_t serve_pending_copy(struct serve_pending *p, char *buf, size_t max)
{
	size_t n = p->len - p->off;

	if (n > max)
		n = max;
	memcpy(buf, p->text + p->off, n);
	p->off += n;
	if (p->off == p->len) {
		free(p->text);
		p->text = NULL;
	}
	return n;
}

struct sse {
	struct serve *srv;
	uint64_t next; /* next event to send */
	struct serve_pending pend;
};

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	struct sse *x = cls;
	struct serve *srv = x->srv;

	if (!x->pend.text) {
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
			serve_pending_set(
				&x->pend,
				sbx_xasprintf(
					"id: %llu\nevent: session\ndata: %s\n\n",
					(unsigned long long)x->next,
					srv->ev_ring[x->next % SERVE_EV_RING]));
			x->next++;
		} else {
			serve_pending_set(&x->pend,
					  sbx_xstrdup(": keep-alive\n\n"));
		}
		pthread_mutex_unlock(&srv->ev_lock);
	}
	return (ssize_t)serve_pending_copy(&x->pend, buf, max);
}

static void sse_free(void *cls)
{
	struct sse *x = cls;

	free(x->pend.text);
	free(x);
}

static int h_events(struct serve_req *r, const char *unused)
{
	struct MHD_Response *resp;
	struct sse *x = sbx_xcalloc(1, sizeof(*x));

	x->srv = r->srv;
	/* Only what happens from now on (no replay of old events). */
	pthread_mutex_lock(&r->srv->ev_lock);
	x->next = r->srv->ev_next;
	pthread_mutex_unlock(&r->srv->ev_lock);
	serve_pending_set(&x->pend, sbx_xstrdup(": sbx events\n\n"));
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096,
						 sse_read, x, sse_free);
	if (!resp) {
		sse_free(x);
		return MHD_NO;
	}
	return serve_queue(r, MHD_HTTP_OK, resp, "text/event-stream");
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

int serve_body_json(cJSON **out, struct serve_req *r)
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

static int h_list(struct serve_req *r, const char *unused)
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
		serve_event(j->srv, j->name,
			    sbx_state_name(SBX_STATE_CREATING), NULL);
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
	if (serve_body_json(&j->body, r) < 0 || body_flags(&j->flags, j->body) < 0) {
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
		serve_event(r->srv, name, sbx_state_name(SBX_STATE_STOPPED), NULL);
	pthread_mutex_unlock(&r->srv->ops_lock);
	if (rc < 0)
		return serve_reply_error(r, SBX_STATUS_FILE_ERROR);
	o = cJSON_CreateObject();
	sbx_json_set_str(o, "session", name);
	sbx_json_set_str(o, "state", sbx_state_name(SBX_STATE_STOPPED));
	ret = serve_reply_json(r, MHD_HTTP_OK, o);
	cJSON_Delete(o);
	return ret;
}

/* ---- snapshots ------------------------------------------------------- */

static int snapshot_or_restore(struct serve_req *r, const char *name,
			       bool restore)
{
	struct sbx_provider *p = NULL;
	struct sbx_session s;
	cJSON *body = NULL, *o = NULL;
	const char *snap = NULL, *msg = NULL;
	char *id = NULL;
	int rc, lock = -1, ret;

	sbx_session_init(&s);
	rc = serve_body_json(&body, r);
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

static int h_snapshot(struct serve_req *r, const char *name)
{
	return snapshot_or_restore(r, name, false);
}

static int h_restore(struct serve_req *r, const char *name)
{
	return snapshot_or_restore(r, name, true);
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

/* ---- routing --------------------------------------------------------- */

/* A route's handler; `name` is the session segment ('+'), or NULL. */
typedef int (*serve_handler)(struct serve_req *r, const char *name);

struct serve_route {
	struct sbx_httpd_route match;
	serve_handler handler;
};

static const struct serve_route routes[] = {
	{ { "GET", "/events" }, h_events },
	{ { "GET", "/session" }, h_list },
	{ { "GET", "/session/" }, h_list },
	{ { "GET", "/session/+/sandbox" }, h_get },
	{ { "POST", "/session/+/sandbox" }, h_up },
	{ { "DELETE", "/session/+/sandbox" }, h_down },
	{ { "POST", "/session/+/sandbox/snapshot" }, h_snapshot },
	{ { "POST", "/session/+/sandbox/restore" }, h_restore },
	{ { "GET", "/session/+/sandbox/snapshots" }, h_snapshots },
	{ { "POST", "/session/+/sandbox/exec" }, serve_h_exec },
};

static const struct sbx_httpd_table table = {
	.routes = routes,
	.n = sizeof(routes) / sizeof(routes[0]),
	.stride = sizeof(routes[0]),
};

/*
 * A session name that is not valid is a 400 whatever path follows it, so
 * a client learns what is wrong with the name rather than "no route".
 */
static int check_name(const char *url)
{
	char name[256];
	const char *rest, *slash;
	size_t n;

	if (strncmp(url, "/session/", 9) != 0)
		return 0;
	rest = url + 9;
	slash = strchr(rest, '/');
	n = slash ? (size_t)(slash - rest) : 0;
	if (n == 0 || n >= sizeof(name))
		return 0; /* no route: 404 */
	memcpy(name, rest, n);
	name[n] = '\0';
	return sbx_name_validate(name);
}

int serve_dispatch(struct serve_req *r)
{
	char *name = NULL;
	size_t i;
	int rc, ret;

	if (check_name(r->url) < 0)
		return serve_reply_error(r, SBX_STATUS_CONFIG_ERROR);
	rc = sbx_httpd_route_find(&i, &name, &table, r->method, r->url);
	if (rc == -EOPNOTSUPP) {
		ret = serve_reply_errorf(r, MHD_HTTP_METHOD_NOT_ALLOWED,
					 SBX_STATUS_CONFIG_ERROR,
					 "%s is not allowed on %s", r->method,
					 r->url);
	} else if (rc < 0) {
		ret = serve_reply_errorf(r, MHD_HTTP_NOT_FOUND,
					 SBX_STATUS_NOTFOUND_ERROR,
					 "no route %s %s", r->method, r->url);
	} else {
		sbx_error_clear();
		ret = routes[i].handler(r, name);
	}
	free(name);
	return ret;
}
