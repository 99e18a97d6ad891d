/*
 * Following a pod with the Kubernetes watch API (JSON lines), for the
 * kubernetes provider; see pkube_i.h.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"

#include "pkube_i.h"

#define WATCH_CHUNK_S 60L

/* Progress lines on a terminal only. */
void pkube_progress(const char *pod, const char *stage)
{
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "\r\033[Ksbx: pod %s: %s", pod, stage);
}

void pkube_progress_end(void)
{
	if (isatty(STDERR_FILENO))
		fprintf(stderr, "\r\033[K");
}

/* Decide on one pod object. */
static int watch_object(struct pkube_watch *w, const cJSON *pod, bool deleted)
{
	const char *rv = sbx_json_str(jget(pod, "metadata"), "resourceVersion");

	if (rv)
		snprintf(w->rv, sizeof(w->rv), "%s", rv);
	if (deleted) {
		w->v = PKUBE_GONE;
		return 1;
	}
	if (w->want_gone)
		return 0;
	w->v = pkube_pod_verdict(pod, w->stage, sizeof(w->stage), w->why,
				 sizeof(w->why));
	pkube_progress(w->pod, w->stage);
	return w->v == PKUBE_WAIT ? 0 : 1;
}

static int watch_line(struct pkube_watch *w, const char *s, size_t n)
{
	cJSON *ev = cJSON_ParseWithLength(s, n);
	const char *type = sbx_json_str(ev, "type");
	const cJSON *obj = jget(ev, "object");
	int rc = 0;

	if (!type) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "watch of pod %s: an event without a type",
				   w->pod);
	} else if (!strcmp(type, "ERROR")) {
		double code = cJSON_GetNumberValue(jget(obj, "code"));

		if (code == 410) {
			w->expired = true; /* relist and watch again */
			rc = 1;
		} else {
			rc = sbx_error_setd(SBX_ERR_REMOTE, -EIO, (long)code,
					    "watch of pod %s: %s", w->pod,
					    sbx_json_str(obj, "message")
						    ? sbx_json_str(obj, "message")
						    : "error event");
		}
	} else if (!strcmp(type, "BOOKMARK")) {
		const char *rv = sbx_json_str(jget(obj, "metadata"),
					      "resourceVersion");

		if (rv)
			snprintf(w->rv, sizeof(w->rv), "%s", rv);
	} else {
		rc = watch_object(w, obj, !strcmp(type, "DELETED"));
	}
	cJSON_Delete(ev);
	return rc;
}

/* Drop the first n bytes of b. */
static void buf_consume(struct sbx_buf *b, size_t n)
{
	memmove(b->data, b->data + n, b->len - n);
	b->len -= n;
	b->data[b->len] = '\0';
}

int pkube_watch_data(const char *buf, size_t len, void *payload)
{
	struct pkube_watch *w = payload;
	int rc;

	if (sbx_buf_add(&w->line, buf, len) < 0)
		return sbx_error_prefix(-ENOMEM, "watch of pod %s", w->pod);
	for (;;) {
		const char *p = sbx_buf_ptr(&w->line);
		const char *nl = memchr(p, '\n', sbx_buf_len(&w->line));
		size_t n;

		if (!nl)
			return 0;
		n = (size_t)(nl - p);
		rc = n ? watch_line(w, p, n) : 0;
		buf_consume(&w->line, n + 1);
		if (rc)
			return rc;
	}
}

/*
 * A failure worth trying again while there is time: the API server (or a
 * load balancer in front of it) answered 5xx, or the connection failed,
 * was reset or timed out.  One bad answer must not abort a create that
 * is otherwise going well.
 */
bool pkube_transient(int rc)
{
	const struct sbx_error *e = sbx_error_last();

	if (e->klass == SBX_ERR_HTTP)
		return rc == -ECONNRESET || rc == -ECONNREFUSED ||
		       rc == -EHOSTUNREACH || rc == -ETIMEDOUT || rc == -EIO;
	return e->klass == SBX_ERR_REMOTE && e->detail >= 500 &&
	       e->detail <= 599;
}

/*
 * Follow pod `pod` with the watch API until it is ready (or failed), or,
 * with want_gone, deleted; at most `timeout_s`.  Transient failures of
 * the watch or of the GET (5xx, connection reset) are retried with a
 * backoff of 0.25 s doubling to 4 s while the time lasts.  Returns the
 * verdict (>= 0) or a negative errno.
 */
int pkube_watch_pod(struct kube *k, const char *pod, bool want_gone,
		    long timeout_s, struct pkube_watch *w)
{
	time_t deadline = time(NULL) + timeout_s;
	char *path = pkube_pods_path(k);
	char *sel = sbx_xasprintf("metadata.name=%s", pod);
	char last_err[sizeof(sbx_error_last()->msg)] = "";
	long backoff_ms = 250;
	int rc = 0, retries = 0;

	memset(w, 0, sizeof(*w));
	sbx_buf_init(&w->line, 4u << 20);
	w->pod = pod;
	w->want_gone = want_gone;
	while (time(NULL) < deadline) {
		struct sbx_buf q;
		struct premote_req r = {
			.method = "GET", .route = path, .cancel_fd = -1,
			.any_status = true, .on_data = pkube_watch_data,
			.payload = w,
		};
		struct premote_resp resp;
		long chunk = deadline - time(NULL);
		cJSON *cur = NULL;

		if (chunk > WATCH_CHUNK_S)
			chunk = WATCH_CHUNK_S;
		if (chunk < 1)
			chunk = 1;
		/* Start from a fresh GET: its state counts, then the events. */
		if (!w->rv[0] || w->expired) {
			w->expired = false;
			rc = pkube_get_pod(k, pod, &cur);
			if (rc == -ENOENT) {
				sbx_error_clear();
				w->v = PKUBE_GONE;
				rc = 0;
				break;
			}
			if (rc == 0) {
				rc = watch_object(w, cur, false);
				cJSON_Delete(cur);
				if (rc)
					break;
			}
		}
		if (rc == 0) {
			sbx_buf_init(&q, PREMOTE_QUERY_CAP);
			premote_q_str(&q, "watch", "true");
			premote_q_str(&q, "fieldSelector", sel);
			premote_q_str(&q, "resourceVersion", w->rv);
			premote_q_str(&q, "allowWatchBookmarks", "true");
			premote_q_u64(&q, "timeoutSeconds", (uint64_t)chunk);
			r.query = sbx_buf_ptr(&q);
			r.timeout_ms = (chunk + 15) * 1000;
			premote_resp_init(&resp);
			sbx_buf_reset(&w->line);
			rc = premote_http_do(k->h, &r, &resp);
			sbx_buf_fini(&q);
			if (rc == 0 && (resp.status < 200 || resp.status >= 300)) {
				cJSON *j = cJSON_ParseWithLength(
					sbx_buf_ptr(&resp.body),
					sbx_buf_len(&resp.body));
				char *what = pkube_pod_what(k, pod);

				if (resp.status == 410)
					w->expired = true;
				else
					rc = pkube_status_error(
						k, resp.status, j, what);
				free(what);
				cJSON_Delete(j);
			}
			premote_resp_fini(&resp);
		}
		if (rc < 0 && pkube_transient(rc) && time(NULL) < deadline) {
			/* Relist after the pause: events may have been lost. */
			snprintf(last_err, sizeof(last_err), "%s",
				 sbx_error_last()->msg);
			sbx_debug("pod %s: %s; retrying in %ld ms", pod,
				  last_err, backoff_ms);
			sbx_error_clear();
			pkube_progress(pod, "the API server failed; retrying");
			usleep((useconds_t)backoff_ms * 1000);
			backoff_ms = backoff_ms * 2 > 4000 ? 4000 : backoff_ms * 2;
			w->rv[0] = '\0';
			retries++;
			rc = 0;
			continue;
		}
		if (rc < 0)
			break;
		if (rc > 0 && !w->expired) {
			rc = 0;
			break; /* decided */
		}
		rc = 0; /* the watch timed out or expired: go on */
		backoff_ms = 250;
	}
	pkube_progress_end();
	sbx_buf_fini(&w->line);
	free(path);
	free(sel);
	if (rc < 0)
		return rc;
	if (w->v == PKUBE_WAIT || (want_gone && w->v != PKUBE_GONE))
		return sbx_error_set(SBX_ERR_REMOTE, -ETIMEDOUT,
				     "pod %s in namespace %s: %s after %ld s "
				     "(last state: %s%s%s)", pod, k->ns,
				     want_gone ? "still there" : "not ready",
				     timeout_s, w->stage,
				     *last_err ? "; last API error: " : "",
				     last_err);
	if (retries)
		sbx_debug("pod %s: decided after %d retried API failures", pod,
			  retries);
	return (int)w->v;
}
