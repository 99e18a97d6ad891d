/*
 * The libcurl layer of the remote provider; see premote_i.h.
 *
 * Pool.  Easy handles are taken from the pool of sbx/http.h for one
 * request and given back after it (created on demand, so there are as
 * many as there are concurrent callers: FUSE workers, the watch thread,
 * exec threads).  They share DNS and TLS sessions; each keeps its own
 * kept-alive connection (libcurl does not support a connection cache
 * shared across threads).  A handle is never shared by two threads at
 * once.  No thread-local state: the daemon forks from the CLI, and each
 * process builds its own pool.
 *
 * Requests are HTTP/1.1 (the agent is libmicrohttpd) with TCP_NODELAY and
 * keep-alive probes.  "Expect: 100-continue" is suppressed for bodies in
 * memory (it would cost a round trip on every large write) and sent for
 * bodies streamed from a descriptor (tar uploads).  The agent may refuse
 * those at their headers (a seed into a busy root) and then closes; a body
 * sent without asking races that answer, and a send into the closed
 * connection ("Broken pipe") hides it.  Asking costs one round trip per
 * upload and sends nothing to an agent that refuses.
 *
 * Bounds.  Every ordinary request has CURLOPT_TIMEOUT_MS (the configured
 * timeout) and CURLOPT_CONNECT_TIMEOUT_MS.  Streams (watch, exec output,
 * bulk) have no total bound but a low-speed limit (the watch stream's
 * heartbeats keep it above it) and an optional cancel descriptor; they run
 * on a private multi handle so that the descriptor can interrupt the wait.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "sbx/buf.h"
#include "sbx/http.h"
#include "sbx/json.h"
#include "sbx/proto.h"
#include "sbx/xmalloc.h"

#include "premote_i.h"

/* How long an upload waits for "100 Continue" before it sends anyway. */
#define PREMOTE_EXPECT_100_MS 5000L

struct premote_http {
	char *base;
	char *token_hdr;   /* "X-Sbx-Token: ..." or NULL; never logged */
	long timeout_ms;
	long connect_timeout_ms;
	char *ca_file;
	bool insecure;
	const struct premote_auth *auth; /* borrowed; NULL: none */
	char *peer;        /* who answers at base (premote_config.peer) */

	struct sbx_http_pool *pool;
	pthread_mutex_t pool_lock; /* the circuit breaker below */

	/*
	 * Circuit breaker: after a request got no answer at all (connect
	 * failure, or a timeout before any header), ordinary requests fail
	 * at once until `down_until` (one timeout later) or until anything
	 * answers, so a vanished agent costs one timeout per period instead
	 * of one per FUSE operation.  Streams are not held back: the watch
	 * stream's reconnects are the probe.  Protected by pool_lock.
	 */
	long long down_until;  /* CLOCK_MONOTONIC ms; 0: up */
	int down_rc;
	char down_msg[256];
};

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void mark_up(struct premote_http *h)
{
	pthread_mutex_lock(&h->pool_lock);
	h->down_until = 0;
	pthread_mutex_unlock(&h->pool_lock);
}

static void mark_down(struct premote_http *h, int rc, const char *msg)
{
	pthread_mutex_lock(&h->pool_lock);
	h->down_until = now_ms() + h->timeout_ms;
	h->down_rc = rc;
	snprintf(h->down_msg, sizeof(h->down_msg), "%s", msg);
	pthread_mutex_unlock(&h->pool_lock);
}

/* 0, or the error to fail with at once while the agent is down. */
static int check_down(struct premote_http *h, const struct premote_req *r)
{
	int rc = 0;

	pthread_mutex_lock(&h->pool_lock);
	if (h->down_until && now_ms() < h->down_until)
		rc = sbx_error_set(SBX_ERR_HTTP, h->down_rc,
				   "%s %s: not sent: %s did not answer the "
				   "last request (%s); trying again in at "
				   "most %lld ms", r->method, r->route,
				   h->peer ? h->peer : "the agent",
				   h->down_msg, h->down_until - now_ms());
	pthread_mutex_unlock(&h->pool_lock);
	return rc;
}

/* ---- construction --------------------------------------------------------- */

int premote_http_new(struct premote_http **out,
		     const struct premote_config *cfg, const char *token)
{
	struct premote_http *h;
	struct sbx_http_pool *pool = NULL;
	int rc;

	*out = NULL;
	rc = sbx_http_pool_new(&pool);
	if (rc < 0)
		return rc;
	h = sbx_xcalloc(1, sizeof(*h));
	h->pool = pool;
	h->base = sbx_xstrdup(cfg->url);
	h->token_hdr = token ? sbx_xasprintf("%s: %s", SBX_HDR_TOKEN, token)
			     : NULL;
	h->timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms
					    : PREMOTE_DEFAULT_TIMEOUT_S * 1000L;
	h->connect_timeout_ms = cfg->connect_timeout_ms > 0
					? cfg->connect_timeout_ms
					: PREMOTE_DEFAULT_CONNECT_TIMEOUT_S *
						  1000L;
	if (h->connect_timeout_ms > h->timeout_ms)
		h->connect_timeout_ms = h->timeout_ms;
	h->ca_file = cfg->ca_file ? sbx_xstrdup(cfg->ca_file) : NULL;
	h->insecure = cfg->insecure;
	h->auth = cfg->auth;
	h->peer = cfg->peer ? sbx_xstrdup(cfg->peer) : NULL;
	pthread_mutex_init(&h->pool_lock, NULL);
	*out = h;
	return 0;
}

void premote_http_free(struct premote_http *h)
{
	if (!h)
		return;
	sbx_http_pool_free(h->pool);
	pthread_mutex_destroy(&h->pool_lock);
	if (h->token_hdr) {
		/* Do not leave the token in freed memory. */
		memset(h->token_hdr, 0, strlen(h->token_hdr));
		free(h->token_hdr);
	}
	free(h->base);
	free(h->ca_file);
	free(h->peer);
	free(h);
}

const char *premote_http_base(const struct premote_http *h)
{
	return h->base;
}

long premote_http_timeout_ms(const struct premote_http *h)
{
	return h->timeout_ms;
}

static CURL *pool_get(struct premote_http *h)
{
	return sbx_http_pool_get(h->pool);
}

static void pool_put(struct premote_http *h, CURL *e)
{
	sbx_http_pool_put(h->pool, e);
}

/* ---- errors --------------------------------------------------------------- */

int premote_errno_from_curl(int code)
{
	return sbx_errno_from_curl(code); /* the one mapping (sbx/http.h) */
}

bool premote_errno_is_transport(int rc)
{
	return rc == -ETIMEDOUT || rc == -ECONNREFUSED ||
	       rc == -EHOSTUNREACH || rc == -ECONNRESET || rc == -EIO;
}

/* ---- URLs and queries ----------------------------------------------------- */

char *premote_url(const char *base, const char *route, const char *query)
{
	if (query && *query)
		return sbx_xasprintf("%s%s?%s", base, route, query);
	return sbx_xasprintf("%s%s", base, route);
}

int premote_url_normalise(char **out, const char *url)
{
	const char *host;
	size_t n;

	*out = NULL;
	if (!strncmp(url, "http://", 7))
		host = url + 7;
	else if (!strncmp(url, "https://", 8))
		host = url + 8;
	else
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: \"url\" must start with "
				     "http:// or https:// (got \"%s\")", url);
	if (!*host || *host == '/')
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: \"url\" has no host "
				     "(\"%s\")", url);
	if (strpbrk(url, "?# \t\r\n"))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "remote provider: \"url\" must be a base "
				     "URL without query, fragment or spaces "
				     "(\"%s\")", url);
	n = strlen(url);
	while (n > (size_t)(host - url) && url[n - 1] == '/')
		n--;
	*out = sbx_xstrndup(url, n);
	return 0;
}

static void q_sep(struct sbx_buf *q)
{
	if (sbx_buf_len(q) && sbx_buf_adds(q, "&") < 0)
		abort(); /* PREMOTE_QUERY_CAP: far beyond any path */
}

void premote_q_str(struct sbx_buf *q, const char *key, const char *value)
{
	char *v = sbx_proto_query_escape(value);

	q_sep(q);
	if (sbx_buf_addf(q, "%s=%s", key, v) < 0)
		abort();
	free(v);
}

void premote_q_u64(struct sbx_buf *q, const char *key, uint64_t value)
{
	q_sep(q);
	if (sbx_buf_addf(q, "%s=%llu", key, (unsigned long long)value) < 0)
		abort();
}

void premote_creds_fini(struct premote_creds *c)
{
	if (!c)
		return;
	free(c->ca_pem);
	free(c->tls_server_name);
	if (c->bearer) {
		memset(c->bearer, 0, strlen(c->bearer));
		free(c->bearer);
	}
	free(c->cert_pem);
	free(c->connect_to);
	if (c->key_pem) {
		memset(c->key_pem, 0, c->key_pem_len);
		free(c->key_pem);
	}
	memset(c, 0, sizeof(*c));
}

/* ---- one transfer --------------------------------------------------------- */

struct xfer {
	struct premote_http *h;
	const struct premote_req *req;
	struct premote_resp *resp;
	CURL *e;
	bool checked;            /* status looked at by the body callback */
	bool ok2xx;              /* the body is the caller's (2xx, agent) */
	struct sbx_frame_parser parser;
	struct premote_creds creds; /* from h->auth, for this attempt */
	int cb_rc;               /* why the body callback stopped us */
	int read_errno;          /* body_fd read failure */
};

static void resp_reset(struct premote_resp *r)
{
	size_t cap = r->body.cap;

	sbx_buf_fini(&r->body);
	sbx_buf_init(&r->body, cap);
	r->status = 0;
	r->agent = false;
	r->out_len = 0;
	r->ended = false;
	r->delivered = false;
	r->hdr_size = -1;
	r->hdr_ino = 0;
	r->retry_after_s = -1;
}

void premote_resp_init(struct premote_resp *r)
{
	memset(r, 0, sizeof(*r));
	sbx_buf_init(&r->body, PREMOTE_MAX_JSON_ANSWER);
	r->hdr_size = -1;
	r->hdr_ino = 0;
	r->retry_after_s = -1;
}

void premote_resp_fini(struct premote_resp *r)
{
	if (r)
		sbx_buf_fini(&r->body);
}

/*
 * The value of header `name` in the header line buf (n bytes) as a string
 * in tmp, when present and shorter than `max` bytes (a number).
 */
static bool header_text(const char *buf, size_t n, const char *name,
			size_t max, char tmp[24])
{
	size_t vl;
	const char *v = sbx_http_header_value(buf, n, name, &vl);

	if (!v || vl >= max)
		return false;
	memcpy(tmp, v, vl);
	tmp[vl] = '\0';
	return true;
}

static size_t on_header(char *buf, size_t size, size_t nitems, void *userp)
{
	struct xfer *x = userp;
	size_t n = size * nitems, vl;
	char tmp[24];

	if (n >= 5 && !strncmp(buf, "HTTP/", 5)) {
		/* A new response (after 1xx or a redirect): start over. */
		x->resp->agent = false;
		x->resp->hdr_size = -1;
		x->resp->hdr_ino = 0;
		return n;
	}
	if (sbx_http_header_value(buf, n, SBX_HDR_AGENT, &vl))
		x->resp->agent = true;
	else if (header_text(buf, n, SBX_HDR_SIZE, 20, tmp))
		x->resp->hdr_size = strtoll(tmp, NULL, 10);
	else if (header_text(buf, n, SBX_HDR_INO, 21, tmp))
		x->resp->hdr_ino = strtoull(tmp, NULL, 10);
	else if (header_text(buf, n, "Retry-After", 12, tmp) &&
		 isdigit((unsigned char)*tmp))
		x->resp->retry_after_s = strtol(tmp, NULL, 10);
	return n;
}

static int frame_trampoline(const cJSON *hdr, const void *data, size_t len,
			    void *payload)
{
	struct xfer *x = payload;

	x->resp->delivered = true;
	if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(hdr, "end")))
		x->resp->ended = true;
	return x->req->frames(hdr, data, len, x->req->payload);
}

static size_t on_body(char *buf, size_t size, size_t nmemb, void *userp)
{
	struct xfer *x = userp;
	size_t n = size * nmemb;
	int rc;

	if (!x->checked) {
		long status = 0;

		curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &status);
		x->resp->status = status;
		x->ok2xx = status >= 200 && status < 300 &&
			   (x->resp->agent || x->req->any_status);
		x->checked = true;
		if (x->resp->agent)
			mark_up(x->h);
	}
	if (!x->ok2xx) {
		/* Error bodies are short; keep what fits for the message. */
		if (sbx_buf_add(&x->resp->body, buf, n) < 0)
			sbx_error_clear();
		return n;
	}
	if (x->req->on_data) {
		rc = x->req->on_data(buf, n, x->req->payload);
		if (rc) {
			x->cb_rc = rc;
			return 0;
		}
		return n;
	}
	if (x->req->frames) {
		rc = sbx_frame_parser_feed(&x->parser, buf, n);
		if (rc) {
			x->cb_rc = rc;
			return 0; /* CURLE_WRITE_ERROR */
		}
		return n;
	}
	if (x->req->out_to_fd) {
		for (size_t done = 0; done < n;) {
			ssize_t w = write(x->req->out_fd, buf + done, n - done);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0) {
				x->cb_rc = sbx_error_os("writing the answer of "
							"%s", x->req->route);
				return 0;
			}
			done += (size_t)w;
		}
		x->resp->out_len += n;
		return n;
	}
	if (x->req->out) {
		if (n > x->req->out_cap - x->resp->out_len) {
			x->cb_rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
						 "agent sent more than the "
						 "%zu bytes asked for",
						 x->req->out_cap);
			return 0;
		}
		memcpy((char *)x->req->out + x->resp->out_len, buf, n);
		x->resp->out_len += n;
		return n;
	}
	rc = sbx_buf_add(&x->resp->body, buf, n);
	if (rc < 0) {
		x->cb_rc = sbx_error_prefix(rc, "answer of the agent");
		return 0;
	}
	return n;
}

/* Request bodies streamed from req->body_fd. */
static size_t on_read(char *buf, size_t size, size_t nitems, void *userp)
{
	struct xfer *x = userp;
	ssize_t r;

	do
		r = read(x->req->body_fd, buf, size * nitems);
	while (r < 0 && errno == EINTR);
	if (r < 0) {
		x->read_errno = errno;
		return CURL_READFUNC_ABORT;
	}
	return (size_t)r;
}

/* Run the easy handle, interruptible through req->cancel_fd. */
static CURLcode perform(CURL *e, int cancel_fd, bool *canceled)
{
	CURLcode res = CURLE_OK;
	CURLM *m;
	int running = 1;

	*canceled = false;
	if (cancel_fd < 0)
		return curl_easy_perform(e);
	m = curl_multi_init();
	if (!m)
		abort();
	curl_multi_add_handle(m, e);
	while (running) {
		struct curl_waitfd wfd = {
			.fd = cancel_fd, .events = CURL_WAIT_POLLIN,
		};
		CURLMcode mc = curl_multi_perform(m, &running);

		if (mc != CURLM_OK) {
			res = CURLE_FAILED_INIT;
			break;
		}
		if (!running)
			break;
		mc = curl_multi_poll(m, &wfd, 1, 1000, NULL);
		if (mc != CURLM_OK) {
			res = CURLE_FAILED_INIT;
			break;
		}
		if (wfd.revents) {
			*canceled = true;
			res = CURLE_ABORTED_BY_CALLBACK;
			break;
		}
	}
	if (!*canceled && res == CURLE_OK) {
		CURLMsg *msg;
		int left;

		while ((msg = curl_multi_info_read(m, &left)))
			if (msg->msg == CURLMSG_DONE && msg->easy_handle == e)
				res = msg->data.result;
	}
	curl_multi_remove_handle(m, e);
	curl_multi_cleanup(m);
	return res;
}

static void setup(struct xfer *x, const char *url, struct curl_slist *hdrs,
		  char *errbuf)
{
	struct premote_http *h = x->h;
	const struct premote_req *r = x->req;
	CURL *e = x->e;

	/* The pool set the share, NOSIGNAL and the User-Agent. */
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 15L);
	curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 5L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, h->connect_timeout_ms);
	if (r->timeout_ms >= 0)
		curl_easy_setopt(e, CURLOPT_TIMEOUT_MS,
				 r->timeout_ms ? r->timeout_ms : h->timeout_ms);
	if (r->low_speed_s > 0) {
		curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, 1L);
		curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, r->low_speed_s);
	}
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
	/* The agent answers JSON/octet-stream only: nothing to decode. */
	curl_easy_setopt(e, CURLOPT_ACCEPT_ENCODING, NULL);
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	if (h->ca_file)
		curl_easy_setopt(e, CURLOPT_CAINFO, h->ca_file);
	if (h->insecure) {
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
	}
	if (x->creds.ca_pem) {
		struct curl_blob b = {x->creds.ca_pem, x->creds.ca_pem_len,
				      CURL_BLOB_COPY};

		curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &b);
	}
	if (x->creds.cert_pem && x->creds.key_pem) {
		struct curl_blob c = {x->creds.cert_pem, x->creds.cert_pem_len,
				      CURL_BLOB_COPY};
		struct curl_blob k = {x->creds.key_pem, x->creds.key_pem_len,
				      CURL_BLOB_COPY};

		curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &c);
		curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
		curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &k);
		curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
	}
	if (x->creds.insecure) {
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
	}
	if (r->body_from_fd) {
		curl_easy_setopt(e, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(e, CURLOPT_READDATA, x);
		/* The agent answers the headers at once; a proxy that drops
		 * the interim answer costs this much once per upload. */
		curl_easy_setopt(e, CURLOPT_EXPECT_100_TIMEOUT_MS,
				 PREMOTE_EXPECT_100_MS);
		if (!strcmp(r->method, "PUT")) {
			curl_easy_setopt(e, CURLOPT_UPLOAD, 1L);
		} else {
			curl_easy_setopt(e, CURLOPT_POST, 1L);
			if (strcmp(r->method, "POST"))
				curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST,
						 r->method);
		}
	} else if (!strcmp(r->method, "GET")) {
		curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
	} else if (r->body || !strcmp(r->method, "POST") ||
		   !strcmp(r->method, "PUT")) {
		/* Any method with a body: DELETE carries DeleteOptions. */
		sbx_http_set_body(e, r->method, r->body,
				  r->body ? r->body_len : 0);
	} else {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, r->method);
	}
}

/* A short, printable excerpt of a proxy's body for messages. */
static void excerpt(char *out, size_t size, const struct sbx_buf *b)
{
	size_t o = 0;
	const char *p = sbx_buf_ptr(b);

	for (size_t i = 0; p[i] && o + 1 < size && i < 200; i++) {
		unsigned char c = (unsigned char)p[i];

		if (c == '<') { /* skip HTML tags */
			while (p[i] && p[i] != '>')
				i++;
			if (!p[i])
				break;
			continue;
		}
		out[o++] = isprint(c) ? (char)c : ' ';
	}
	while (o && out[o - 1] == ' ')
		o--;
	out[o] = '\0';
}

/* The error of a complete non-2xx (or unmarked) answer. */
static int answer_error(struct premote_http *h, const struct premote_req *r,
			struct premote_resp *resp, const char *url)
{
	char ctx[512], text[400];
	cJSON *j;
	int rc;

	if (!resp->agent) {
		const char *smsg;

		/* A Kubernetes Status object: its message, whole. */
		j = cJSON_ParseWithLength(sbx_buf_ptr(&resp->body),
					  sbx_buf_len(&resp->body));
		smsg = cJSON_IsObject(j) ? sbx_json_str(j, "message") : NULL;
		if (smsg)
			snprintf(text, sizeof(text), "%s", smsg);
		else
			excerpt(text, sizeof(text), &resp->body);
		cJSON_Delete(j);
		if (h->peer)
			return sbx_error_setd(SBX_ERR_HTTP, -EIO, resp->status,
					      "%s answered instead of the "
					      "agent: HTTP %ld%s%s (%s %s)",
					      h->peer, resp->status,
					      *text ? ": " : "", text,
					      r->method, r->route);
		return sbx_error_setd(SBX_ERR_HTTP, -EIO, resp->status,
				      "a proxy answered for the agent at %s: "
				      "HTTP %ld%s%s (%s %s)",
				      h->base, resp->status, *text ? ": " : "",
				      text, r->method, r->route);
	}
	snprintf(ctx, sizeof(ctx), "%s %s", r->method, r->route);
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp->body),
				  sbx_buf_len(&resp->body));
	rc = j ? sbx_proto_error_from_json(j, ctx) : 0;
	cJSON_Delete(j);
	if (rc < 0)
		return rc;
	return sbx_error_setd(SBX_ERR_HTTP, resp->status >= 500 ? -EIO : -EPROTO,
			      resp->status,
			      "%s: HTTP %ld from the agent without an error "
			      "object", url, resp->status);
}

static bool retryable(CURLcode c)
{
	return c == CURLE_SEND_ERROR || c == CURLE_RECV_ERROR ||
	       c == CURLE_GOT_NOTHING;
}

int premote_http_do(struct premote_http *h, const struct premote_req *req,
		    struct premote_resp *resp)
{
	char errbuf[CURL_ERROR_SIZE];
	struct curl_slist *hdrs = NULL;
	struct curl_slist *conn_to = NULL;
	char *url, *ct = NULL, *bearer = NULL;
	struct xfer x;
	CURLcode c;
	bool canceled, refreshed = false, want_refresh = false;
	int rc = 0, attempt = 0, throttled = 0;

	if (req->timeout_ms >= 0 && (rc = check_down(h, req)) < 0)
		return rc;
	url = premote_url(h->base, req->route, req->query);
	if (req->max_body)
		resp->body.cap = req->max_body;
	if (h->token_hdr && !req->no_token)
		hdrs = curl_slist_append(hdrs, h->token_hdr);
	hdrs = curl_slist_append(hdrs, "Accept: " SBX_CT_JSON ", " SBX_CT_OCTET);
	if (req->body_from_fd) {
		hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
		hdrs = curl_slist_append(hdrs, "Expect: 100-continue");
	} else {
		hdrs = curl_slist_append(hdrs, "Expect:");
	}
	if (req->body || strcmp(req->method, "GET")) {
		ct = sbx_xasprintf("Content-Type: %s",
				   req->content_type ? req->content_type
						     : SBX_CT_JSON);
		hdrs = curl_slist_append(hdrs, ct);
	}
	if (!hdrs)
		abort();

again:
	memset(&x, 0, sizeof(x));
	x.h = h;
	x.req = req;
	x.resp = resp;
	if (h->auth) {
		rc = h->auth->get(h->auth->ctx, want_refresh, &x.creds);
		want_refresh = false;
		if (rc < 0)
			goto out;
	}
	/* Per attempt: the credentials may have been refreshed. */
	{
		struct curl_slist *hd = hdrs;

		if (x.creds.bearer) {
			free(bearer);
			bearer = sbx_xasprintf("Authorization: Bearer %s",
					       x.creds.bearer);
			/* A private copy of the list with the header. */
			hd = NULL;
			for (struct curl_slist *l = hdrs; l; l = l->next)
				hd = curl_slist_append(hd, l->data);
			hd = curl_slist_append(hd, bearer);
			if (!hd)
				abort();
		}
		curl_slist_free_all(conn_to);
		conn_to = x.creds.connect_to
				  ? curl_slist_append(NULL, x.creds.connect_to)
				  : NULL;
		x.e = pool_get(h);
		resp_reset(resp);
		if (req->frames)
			sbx_frame_parser_init(&x.parser, frame_trampoline, &x);
		errbuf[0] = '\0';
		setup(&x, url, hd, errbuf);
		if (conn_to)
			curl_easy_setopt(x.e, CURLOPT_CONNECT_TO, conn_to);
		c = perform(x.e, req->cancel_fd, &canceled);
		curl_easy_getinfo(x.e, CURLINFO_RESPONSE_CODE, &resp->status);
		if (!x.checked)
			x.ok2xx = resp->status >= 200 && resp->status < 300 &&
				  (resp->agent || req->any_status);
		pool_put(h, x.e);
		if (hd != hdrs)
			curl_slist_free_all(hd);
	}
	premote_creds_fini(&x.creds);
	if (req->frames)
		sbx_frame_parser_fini(&x.parser);
	if (bearer) {
		memset(bearer, 0, strlen(bearer));
		free(bearer);
		bearer = NULL;
	}

	if (c == CURLE_ABORTED_BY_CALLBACK && x.read_errno) {
		rc = sbx_error_setd(SBX_ERR_OS, -x.read_errno, x.read_errno,
				    "%s %s: reading the request body: %s",
				    req->method, url, strerror(x.read_errno));
		goto out;
	}
	/* The server in front of the agent: expired credentials... */
	if (c == CURLE_OK && !resp->agent && resp->status == 401 &&
	    h->auth && !refreshed && !req->body_from_fd) {
		refreshed = want_refresh = true;
		goto again;
	}
	/* ...or "too many requests" (API priority and fairness). */
	if (c == CURLE_OK && !resp->agent && resp->status == 429 &&
	    throttled < 3 && !req->body_from_fd && !resp->delivered &&
	    !resp->out_len) {
		long wait = resp->retry_after_s > 0 ? resp->retry_after_s : 1;

		throttled++;
		sleep((unsigned)(wait > 10 ? 10 : wait));
		goto again;
	}

	if (c == CURLE_WRITE_ERROR && x.cb_rc) {
		rc = x.cb_rc; /* the callback's own error, already recorded */
		goto out;
	}
	if (c != CURLE_OK) {
		if (retryable(c) && req->idempotent && !attempt &&
		    !resp->delivered && !resp->out_len && !canceled) {
			attempt++;
			goto again;
		}
		rc = premote_errno_from_curl(c);
		if (!canceled && !resp->status &&
		    (rc == -ECONNREFUSED || rc == -EHOSTUNREACH ||
		     rc == -ETIMEDOUT))
			mark_down(h, rc, *errbuf ? errbuf
						 : curl_easy_strerror(c));
		if (canceled)
			rc = sbx_error_setd(SBX_ERR_HTTP, -ECANCELED, c,
					    "%s %s: cancelled", req->method,
					    url);
		else if (c == CURLE_OPERATION_TIMEDOUT)
			rc = sbx_error_setd(SBX_ERR_HTTP, rc, c,
					    "%s %s: no answer from %s in time "
					    "(%s)", req->method, url,
					    h->peer ? h->peer : "the agent",
					    *errbuf ? errbuf
						    : curl_easy_strerror(c));
		else if ((rc == -ECONNREFUSED || rc == -EHOSTUNREACH) &&
			 h->peer)
			rc = sbx_error_setd(SBX_ERR_HTTP, rc, c,
					    "cannot reach %s (%s %s): %s",
					    h->peer, req->method, req->route,
					    *errbuf ? errbuf
						    : curl_easy_strerror(c));
		else if (rc == -ECONNREFUSED || rc == -EHOSTUNREACH)
			rc = sbx_error_setd(SBX_ERR_HTTP, rc, c,
					    "cannot reach sbx-agent at %s "
					    "(%s %s): %s; is it running?",
					    h->base, req->method, req->route,
					    *errbuf ? errbuf
						    : curl_easy_strerror(c));
		else if (h->peer)
			rc = sbx_error_setd(SBX_ERR_HTTP, rc, c,
					    "%s %s: %s (talking to %s)",
					    req->method, req->route,
					    *errbuf ? errbuf
						    : curl_easy_strerror(c),
					    h->peer);
		else
			rc = sbx_error_setd(SBX_ERR_HTTP, rc, c, "%s %s: %s",
					    req->method, url,
					    *errbuf ? errbuf
						    : curl_easy_strerror(c));
		goto out;
	}
	if (resp->agent)
		mark_up(h);
	if (req->any_status)
		goto out;
	if (!x.ok2xx) {
		rc = answer_error(h, req, resp, url);
		goto out;
	}
	if (req->frames && !resp->ended)
		rc = sbx_error_setd(SBX_ERR_HTTP, -ECONNRESET, 0,
				    "%s %s: the stream ended early",
				    req->method, url);
out:
	curl_slist_free_all(hdrs);
	curl_slist_free_all(conn_to);
	free(ct);
	free(url);
	return rc;
}

int premote_http_json(struct premote_http *h, const char *method,
		      const char *route, const char *query,
		      const cJSON *body, bool idempotent, cJSON **out)
{
	struct premote_req r = {
		.method = method, .route = route, .query = query,
		.content_type = SBX_CT_JSON, .idempotent = idempotent,
		.cancel_fd = -1,
	};
	struct premote_resp resp;
	char *text = NULL;
	cJSON *j = NULL;
	int rc;

	if (out)
		*out = NULL;
	if (body) {
		text = cJSON_PrintUnformatted(body);
		if (!text)
			abort();
		r.body = text;
		r.body_len = strlen(text);
	}
	premote_resp_init(&resp);
	rc = premote_http_do(h, &r, &resp);
	if (rc < 0 || !out)
		goto out;
	j = cJSON_ParseWithLength(sbx_buf_ptr(&resp.body),
				  sbx_buf_len(&resp.body));
	if (!cJSON_IsObject(j)) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "%s %s: the agent's answer is not a JSON "
				   "object", method, route);
		goto out;
	}
	*out = j;
	j = NULL;
out:
	cJSON_Delete(j);
	if (text)
		cJSON_free(text);
	premote_resp_fini(&resp);
	return rc;
}
