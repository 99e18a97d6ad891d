/*
 * gRPC over libcurl; see mgrpc.h.
 *
 * Pool.  As providers/remote/premote_http.c: easy handles come from the
 * shared pool of sbx/http.h (created on demand, one per concurrent caller;
 * DNS and TLS sessions shared, each handle keeping its own kept-alive
 * HTTP/2 connection: libcurl does not support sharing connections across
 * threads).  A handle is used by one thread at a time.
 *
 * Framing.  The body callback appends to a buffer and takes out every
 * complete frame; a frame header announcing more than MGRPC_MAX_MESSAGE
 * stops the transfer at once, so the buffer stays below that bound plus one
 * write chunk.  grpc-status/grpc-message are read by the header callback,
 * which libcurl also calls for HTTP/2 trailers.
 */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>

#include <curl/curl.h>
#include <protobuf-c/protobuf-c.h>

#include "sbx/http.h"
#include "sbx/xmalloc.h"

#include "mgrpc.h"
#include "mgrpc_i.h"

struct mgrpc {
	char *url;                 /* no trailing '/' */
	struct curl_slist *meta;   /* caller's metadata; wiped on free */
	char *ca_file;
	long connect_timeout_ms;
	bool h2c;                  /* http://: prior knowledge, no reuse */
	struct sbx_http_pool *pool;
};

static __thread int last_status;

int mgrpc_last_status(void)
{
	return last_status;
}

static const char *const code_names[] = {
	"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
	"NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
	"RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
	"UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
	"UNAUTHENTICATED",
};

const char *mgrpc_code_name(int code)
{
	if (code < 0 || code >= (int)(sizeof(code_names) / sizeof(*code_names)))
		return "UNKNOWN_CODE";
	return code_names[code];
}

/* ---- construction --------------------------------------------------------- */

/* "name: value" with a token name and no CR/LF; the name is lowercased
 * (HTTP/2 requires lowercase field names). */
static int check_header(const char *h, char **out)
{
	const char *colon = strchr(h, ':');
	char *copy;

	*out = NULL;
	if (!colon || colon == h || strpbrk(h, "\r\n"))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "modal gRPC: metadata must be one "
				     "\"name: value\" line (got a header of "
				     "%zu bytes starting \"%.*s\")",
				     strlen(h), (int)(colon ? colon - h : 0),
				     h);
	for (const char *p = h; p < colon; p++)
		if (!isalnum((unsigned char)*p) && !strchr("-_.", *p))
			return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
					     "modal gRPC: bad metadata name "
					     "\"%.*s\"", (int)(colon - h), h);
	copy = sbx_xstrdup(h);
	for (char *p = copy; *p != ':'; p++)
		*p = (char)tolower((unsigned char)*p);
	*out = copy;
	return 0;
}

static void wipe_slist(struct curl_slist *l)
{
	for (struct curl_slist *p = l; p; p = p->next)
		memset(p->data, 0, strlen(p->data));
	curl_slist_free_all(l);
}

int mgrpc_new(struct mgrpc **out, const struct mgrpc_opts *o)
{
	struct mgrpc *c = NULL;
	size_t n;
	int rc;

	*out = NULL;
	SBX_ASSERT_ARG(o && o->url);
	rc = sbx_http_global_init();
	if (rc < 0)
		return rc;
	if (strncmp(o->url, "https://", 8) && strncmp(o->url, "http://", 7))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "modal gRPC: server URL must start with "
				     "https:// (got \"%s\")", o->url);
	if (strpbrk(o->url, "?# \t\r\n"))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "modal gRPC: server URL \"%s\" must not "
				     "have a query, fragment or spaces",
				     o->url);

	c = sbx_xcalloc(1, sizeof(*c));
	n = strlen(o->url);
	while (n && o->url[n - 1] == '/')
		n--;
	c->url = sbx_xstrndup(o->url, n);
	c->h2c = !strncmp(c->url, "http://", 7);
	c->ca_file = o->ca_file ? sbx_xstrdup(o->ca_file) : NULL;
	c->connect_timeout_ms = o->connect_timeout_ms > 0
					? o->connect_timeout_ms
					: MGRPC_DEFAULT_CONNECT_TIMEOUT_MS;
	rc = sbx_http_pool_new(&c->pool);
	if (rc < 0)
		goto fail;

	for (size_t i = 0; o->headers && o->headers[i]; i++) {
		char *h;
		struct curl_slist *l;

		rc = check_header(o->headers[i], &h);
		if (rc < 0)
			goto fail;
		l = curl_slist_append(c->meta, h);
		memset(h, 0, strlen(h));
		free(h);
		if (!l)
			abort(); /* out of memory */
		c->meta = l;
	}
	*out = c;
	return 0;
fail:
	mgrpc_free(c);
	return rc;
}

void mgrpc_free(struct mgrpc *c)
{
	if (!c)
		return;
	sbx_http_pool_free(c->pool);
	wipe_slist(c->meta);
	free(c->ca_file);
	free(c->url);
	free(c);
}

/* ---- errors --------------------------------------------------------------- */

int mgrpc_errno_from_code(int code)
{
	switch (code) {
	case MGRPC_OK:
		return 0;
	case MGRPC_NOT_FOUND:
		return -ENOENT;
	case MGRPC_ALREADY_EXISTS:
		return -EEXIST;
	case MGRPC_UNAUTHENTICATED:
	case MGRPC_PERMISSION_DENIED:
		return -EACCES;
	case MGRPC_INVALID_ARGUMENT:
	case MGRPC_FAILED_PRECONDITION:
		return -EINVAL;
	case MGRPC_RESOURCE_EXHAUSTED:
	case MGRPC_UNAVAILABLE:
		return -EAGAIN;
	case MGRPC_DEADLINE_EXCEEDED:
		return -ETIMEDOUT;
	default:
		return -EIO;
	}
}

int mgrpc_class_from_code(int code)
{
	switch (code) {
	case MGRPC_NOT_FOUND:
		return SBX_ERR_NOTFOUND;
	case MGRPC_UNAUTHENTICATED:
	case MGRPC_PERMISSION_DENIED:
		return SBX_ERR_CONFIG;
	default:
		return SBX_ERR_REMOTE;
	}
}

bool mgrpc_code_is_retryable(int code)
{
	return code == MGRPC_DEADLINE_EXCEEDED || code == MGRPC_UNAVAILABLE ||
	       code == MGRPC_CANCELLED || code == MGRPC_INTERNAL ||
	       code == MGRPC_UNKNOWN;
}

/* Failures a gRPC client reports as UNAVAILABLE/DEADLINE_EXCEEDED. */
static bool curl_is_retryable(CURLcode res)
{
	int rc = sbx_errno_from_curl(res);

	return rc == -ETIMEDOUT || rc == -ECONNREFUSED || rc == -ECONNRESET;
}

/* The gRPC code a proxy's HTTP status stands for (gRPC's
 * http-grpc-status-mapping.md). */
int mgrpc_code_from_http(long status)
{
	switch (status) {
	case 400:
		return MGRPC_INTERNAL;
	case 401:
		return MGRPC_UNAUTHENTICATED;
	case 403:
		return MGRPC_PERMISSION_DENIED;
	case 404:
		return MGRPC_UNIMPLEMENTED;
	case 429:
	case 502:
	case 503:
	case 504:
		return MGRPC_UNAVAILABLE;
	default:
		return MGRPC_UNKNOWN;
	}
}

/* ---- one attempt ---------------------------------------------------------- */

struct xfer {
	const char *method;
	const ProtobufCMessageDescriptor *desc;
	CURL *e;

	bool checked;          /* HTTP status looked at by on_body */
	bool ok200;
	bool have_status;      /* grpc-status seen (headers or trailers) */
	int grpc_status;
	char *grpc_message;    /* percent-decoded; NULL: none */

	uint8_t *buf;          /* undelivered frame bytes */
	size_t len, alloc;
	int nmsgs;

	ProtobufCMessage *unary;  /* unary answer (cb == NULL) */
	mgrpc_msg_cb cb;
	void *payload;
	int stop_rc;           /* callback stop or protocol error */
	bool cb_stopped;       /* stop_rc is the callback's value */
};

static int hexval(char ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	ch = (char)tolower((unsigned char)ch);
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	return -1;
}

/* grpc-message is percent-encoded UTF-8; invalid escapes are kept. */
char *mgrpc_percent_decode(const char *s, size_t n)
{
	char *out = sbx_xmalloc(n + 1), *o = out;

	for (size_t i = 0; i < n; i++) {
		int hi, lo;

		if (s[i] == '%' && i + 2 < n && (hi = hexval(s[i + 1])) >= 0 &&
		    (lo = hexval(s[i + 2])) >= 0) {
			*o++ = (char)(hi << 4 | lo);
			i += 2;
		} else {
			*o++ = s[i];
		}
	}
	*o = '\0';
	return out;
}

static size_t on_header(char *line, size_t size, size_t nitems, void *userp)
{
	struct xfer *x = userp;
	size_t n = size * nitems, vl;
	const char *v;

	if (n >= 5 && !strncmp(line, "HTTP/", 5)) {
		/* A new response (after 1xx): start over. */
		x->have_status = false;
		free(x->grpc_message);
		x->grpc_message = NULL;
		return n;
	}
	if ((v = sbx_http_header_value(line, n, "grpc-status", &vl))) {
		char tmp[16];

		if (vl && vl < sizeof(tmp)) {
			memcpy(tmp, v, vl);
			tmp[vl] = '\0';
			x->grpc_status = (int)strtol(tmp, NULL, 10);
			x->have_status = true;
		}
	} else if ((v = sbx_http_header_value(line, n, "grpc-message",
					      &vl))) {
		free(x->grpc_message);
		x->grpc_message = mgrpc_percent_decode(v, vl);
	}
	return n;
}

static int proto_error(struct xfer *x, const char *what)
{
	x->stop_rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "modal gRPC %s: %s", x->method, what);
	return x->stop_rc;
}

/* Deliver one complete message; 0 to go on. */
static int deliver(struct xfer *x, const uint8_t *data, size_t len)
{
	ProtobufCMessage *m;
	int rc;

	if (!x->cb && x->nmsgs) {
		proto_error(x, "more than one message in a unary answer");
		return -1;
	}
	m = protobuf_c_message_unpack(x->desc, NULL, len, data);
	if (!m) {
		x->stop_rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
					   "modal gRPC %s: cannot decode a "
					   "%zu-byte answer as %s (does the "
					   "server speak another API "
					   "revision?)", x->method, len,
					   x->desc->name);
		return -1;
	}
	x->nmsgs++;
	if (!x->cb) {
		x->unary = m;
		return 0;
	}
	rc = x->cb(m, x->payload);
	protobuf_c_message_free_unpacked(m, NULL);
	if (rc) {
		x->stop_rc = rc;
		x->cb_stopped = true;
		return -1;
	}
	return 0;
}

int mgrpc_frame_next(const uint8_t *buf, size_t len, size_t *msg_len)
{
	uint32_t mlen;

	*msg_len = 0;
	if (len < 5)
		return 0;
	mlen = (uint32_t)buf[1] << 24 | (uint32_t)buf[2] << 16 |
	       (uint32_t)buf[3] << 8 | buf[4];
	*msg_len = mlen;
	if (buf[0])
		return -EPROTO; /* compressed (flag 1) or unknown flags */
	if (mlen > MGRPC_MAX_MESSAGE)
		return -EMSGSIZE;
	return len - 5 < mlen ? 0 : 1;
}

uint8_t *mgrpc_frame(const ProtobufCMessage *msg, size_t *len_out)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *body = sbx_xmalloc(5 + len);

	body[0] = 0;
	body[1] = (uint8_t)(len >> 24);
	body[2] = (uint8_t)(len >> 16);
	body[3] = (uint8_t)(len >> 8);
	body[4] = (uint8_t)len;
	protobuf_c_message_pack(msg, body + 5);
	*len_out = 5 + len;
	return body;
}

long mgrpc_deadline_ms(const struct mgrpc_call *call)
{
	return call && call->deadline_ms > 0 ? call->deadline_ms
					     : MGRPC_DEFAULT_DEADLINE_MS;
}

void mgrpc_timeout_header(char *out, size_t size, long deadline_ms)
{
	/* grpc-timeout takes at most 8 digits. */
	snprintf(out, size, "grpc-timeout: %ldm",
		 deadline_ms > 99999999 ? 99999999 : deadline_ms);
}

long mgrpc_retry_delay_ms(int attempt)
{
	long d = MGRPC_RETRY_BASE_MS;

	for (int i = 0; i < attempt && d < MGRPC_RETRY_MAX_MS; i++)
		d *= 2;
	return d > MGRPC_RETRY_MAX_MS ? MGRPC_RETRY_MAX_MS : d;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *userp)
{
	struct xfer *x = userp;
	size_t n = size * nmemb, off = 0;

	if (!x->checked) {
		long status = 0;

		curl_easy_getinfo(x->e, CURLINFO_RESPONSE_CODE, &status);
		x->ok200 = status == 200;
		x->checked = true;
	}
	if (!x->ok200)
		return n; /* a proxy's error page: the status says it all */
	if (x->len + n > x->alloc) {
		x->alloc = x->len + n > 2 * x->alloc ? x->len + n
						       : 2 * x->alloc;
		x->buf = sbx_xrealloc(x->buf, x->alloc);
	}
	memcpy(x->buf + x->len, data, n);
	x->len += n;

	for (;;) {
		const uint8_t *f = x->buf + off;
		size_t mlen;
		int fr = mgrpc_frame_next(f, x->len - off, &mlen);

		if (fr == 0)
			break;
		if (fr == -EPROTO) {
			proto_error(x, f[0] & 1
					       ? "the server sent a compressed "
						 "message; compression is not "
						 "supported (none was offered)"
					       : "bad frame flags");
			return 0;
		}
		if (fr == -EMSGSIZE) {
			x->stop_rc = sbx_error_set(
				SBX_ERR_PROTO, -EMSGSIZE,
				"modal gRPC %s: answer message of %zu bytes "
				"exceeds the %u-byte limit", x->method, mlen,
				MGRPC_MAX_MESSAGE);
			return 0;
		}
		if (deliver(x, f + 5, mlen) < 0)
			return 0;
		off += 5 + mlen;
	}
	if (off) {
		memmove(x->buf, x->buf + off, x->len - off);
		x->len -= off;
	}
	return n;
}

static void uuid4(char out[37])
{
	uint8_t b[16];
	size_t got = 0;

	while (got < sizeof(b)) {
		ssize_t r = getrandom(b + got, sizeof(b) - got, 0);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			abort(); /* getrandom(2) cannot fail for 16 bytes */
		got += (size_t)r;
	}
	b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
	b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
	snprintf(out, 37,
		 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
		 "%02x%02x%02x%02x%02x%02x",
		 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
		 b[10], b[11], b[12], b[13], b[14], b[15]);
}

static struct curl_slist *add_header(struct curl_slist *l, const char *h)
{
	struct curl_slist *r = curl_slist_append(l, h);

	if (!r)
		abort(); /* out of memory */
	return r;
}

struct attempt {
	const uint8_t *body;
	size_t body_len;
	long deadline_ms;
	const char *idem_key;  /* NULL: no retry headers */
	int n;                 /* attempt number, from 0 */
	bool retryable;        /* out: worth another attempt */
	bool delivered;        /* out: a message reached the callback */
	bool stopped;          /* out: the callback stopped the call */
};

static int attempt_once(struct mgrpc *c, const char *method,
			const ProtobufCMessageDescriptor *desc,
			ProtobufCMessage **out, mgrpc_msg_cb cb, void *payload,
			struct attempt *a)
{
	struct xfer x = {.method = method, .desc = desc, .cb = cb,
			 .payload = payload};
	struct curl_slist *hdrs = NULL;
	char errbuf[CURL_ERROR_SIZE] = "", tmp[96];
	char *url = sbx_xasprintf("%s%s", c->url, method);
	CURLcode res;
	long http = 0;
	int rc = 0;

	a->retryable = false;
	x.e = sbx_http_pool_get(c->pool);

	hdrs = add_header(hdrs, "content-type: application/grpc");
	hdrs = add_header(hdrs, "te: trailers");
	mgrpc_timeout_header(tmp, sizeof(tmp), a->deadline_ms);
	hdrs = add_header(hdrs, tmp);
	hdrs = add_header(hdrs, "Expect:");
	hdrs = add_header(hdrs, "Accept:");
	for (struct curl_slist *p = c->meta; p; p = p->next)
		hdrs = add_header(hdrs, p->data);
	if (a->idem_key) {
		snprintf(tmp, sizeof(tmp), "x-idempotency-key: %s",
			 a->idem_key);
		hdrs = add_header(hdrs, tmp);
		snprintf(tmp, sizeof(tmp), "x-retry-attempt: %d", a->n);
		hdrs = add_header(hdrs, tmp);
	}

	curl_easy_setopt(x.e, CURLOPT_URL, url);
	curl_easy_setopt(x.e, CURLOPT_HTTP_VERSION,
			 c->h2c ? (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE
				: (long)CURL_HTTP_VERSION_2TLS);
	if (c->h2c)
		curl_easy_setopt(x.e, CURLOPT_FORBID_REUSE, 1L);
	curl_easy_setopt(x.e, CURLOPT_POST, 1L);
	curl_easy_setopt(x.e, CURLOPT_POSTFIELDS, a->body);
	curl_easy_setopt(x.e, CURLOPT_POSTFIELDSIZE_LARGE,
			 (curl_off_t)a->body_len);
	curl_easy_setopt(x.e, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(x.e, CURLOPT_USERAGENT,
			 "sbx/" SBX_VERSION " (libcurl gRPC)");
	curl_easy_setopt(x.e, CURLOPT_TIMEOUT_MS, a->deadline_ms);
	curl_easy_setopt(x.e, CURLOPT_CONNECTTIMEOUT_MS,
			 c->connect_timeout_ms < a->deadline_ms
				 ? c->connect_timeout_ms
				 : a->deadline_ms);
	curl_easy_setopt(x.e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(x.e, CURLOPT_HEADERDATA, &x);
	curl_easy_setopt(x.e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(x.e, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(x.e, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(x.e, CURLOPT_TCP_KEEPALIVE, 1L);
	if (c->ca_file)
		curl_easy_setopt(x.e, CURLOPT_CAINFO, c->ca_file);

	res = curl_easy_perform(x.e);
	curl_easy_getinfo(x.e, CURLINFO_RESPONSE_CODE, &http);
	a->delivered = cb && x.nmsgs > 0;
	a->stopped = false;

	if (x.stop_rc) {
		/* The callback's own value, or a protocol error set above. */
		rc = x.stop_rc;
		a->stopped = x.cb_stopped;
		goto out;
	}
	if (res != CURLE_OK && !x.have_status) {
		a->retryable = curl_is_retryable(res);
		if (res == CURLE_OPERATION_TIMEDOUT) {
			/* What a gRPC client reports for its own deadline. */
			last_status = MGRPC_DEADLINE_EXCEEDED;
			rc = sbx_error_setd(SBX_ERR_HTTP, -ETIMEDOUT, res,
					    "modal gRPC %s at %s: "
					    "DEADLINE_EXCEEDED: no complete "
					    "answer within the %ld ms deadline",
					    method, c->url, a->deadline_ms);
		} else
			rc = sbx_error_setd(SBX_ERR_HTTP,
					    sbx_errno_from_curl(res),
					    res, "modal gRPC %s at %s: %s%s%s",
					    method, c->url,
					    curl_easy_strerror(res),
					    *errbuf ? ": " : "", errbuf);
		goto out;
	}
	if (!x.have_status && http != 200) {
		int code = mgrpc_code_from_http(http);

		last_status = code;
		a->retryable = mgrpc_code_is_retryable(code);
		rc = sbx_error_setd(mgrpc_class_from_code(code),
				    mgrpc_errno_from_code(code), code,
				    "modal gRPC %s at %s: %s: HTTP %ld without "
				    "grpc-status (not a gRPC server, or a "
				    "proxy's error)", method, c->url,
				    mgrpc_code_name(code), http);
		goto out;
	}
	if (!x.have_status) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "modal gRPC %s at %s: the answer ended "
				   "without grpc-status%s", method, c->url,
				   res != CURLE_OK ? " (connection broken)"
						   : "");
		a->retryable = res != CURLE_OK;
		goto out;
	}
	if (x.grpc_status != MGRPC_OK) {
		int code = x.grpc_status;

		last_status = code;
		a->retryable = mgrpc_code_is_retryable(code);
		rc = sbx_error_setd(
			mgrpc_class_from_code(code), mgrpc_errno_from_code(code), code,
			"modal gRPC %s: %s: %s%s", method,
			mgrpc_code_name(code),
			x.grpc_message && *x.grpc_message ? x.grpc_message
							  : "(no message)",
			mgrpc_errno_from_code(code) == -EACCES
				? "; check MODAL_TOKEN_ID/MODAL_TOKEN_SECRET "
				  "or the profile in ~/.modal.toml (`modal "
				  "token new` creates one)"
				: "");
		goto out;
	}
	if (x.len) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "modal gRPC %s: the answer ended inside a "
				   "message (%zu bytes left over)", method,
				   x.len);
		goto out;
	}
	if (!cb && !x.unary) {
		rc = sbx_error_set(SBX_ERR_PROTO, -EPROTO,
				   "modal gRPC %s: status OK but no message "
				   "in a unary answer", method);
		goto out;
	}
	if (!cb) {
		*out = x.unary;
		x.unary = NULL;
	}
out:
	if (x.unary)
		protobuf_c_message_free_unpacked(x.unary, NULL);
	free(x.grpc_message);
	free(x.buf);
	sbx_http_pool_put(c->pool, x.e);
	wipe_slist(hdrs);
	free(url);
	return rc;
}

/* ---- calls ---------------------------------------------------------------- */

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int do_call(struct mgrpc *c, const char *method,
		   const ProtobufCMessage *req,
		   const ProtobufCMessageDescriptor *resp_desc,
		   ProtobufCMessage **out, mgrpc_msg_cb cb, void *payload,
		   struct mgrpc_call *call)
{
	struct mgrpc_call defaults = {0};
	struct attempt a = {0};
	char key[37];
	uint8_t *body;
	size_t len;
	int rc;

	last_status = 0;
	if (!call)
		call = &defaults;
	call->attempts = 0;
	SBX_ASSERT_ARG(c && method && req && resp_desc);
	if (method[0] != '/')
		return sbx_error_set(SBX_ERR_INTERNAL, -EINVAL,
				     "modal gRPC: method \"%s\" must be a "
				     "path, \"/package.Service/Method\"",
				     method);
	len = protobuf_c_message_get_packed_size(req);
	if (len > MGRPC_MAX_MESSAGE)
		return sbx_error_set(SBX_ERR_INTERNAL, -EMSGSIZE,
				     "modal gRPC %s: request of %zu bytes "
				     "exceeds the %u-byte limit", method, len,
				     MGRPC_MAX_MESSAGE);
	body = mgrpc_frame(req, &a.body_len);
	a.body = body;
	a.deadline_ms = mgrpc_deadline_ms(call);
	if (call->retry) {
		uuid4(key);
		a.idem_key = key;
	}
	for (a.n = 0;; a.n++) {
		last_status = 0;
		rc = attempt_once(c, method, resp_desc, out, cb, payload, &a);
		call->attempts = a.n + 1;
		if (!rc || !call->retry || !a.retryable || a.delivered ||
		    a.n == MGRPC_MAX_RETRIES)
			break;
		sleep_ms(mgrpc_retry_delay_ms(a.n));
	}
	if (rc < 0 && call->attempts > 1 && !a.stopped)
		rc = sbx_error_prefix(rc, "after %d attempts", call->attempts);
	free(body);
	return rc;
}

int mgrpc_unary(struct mgrpc *c, const char *method,
		const ProtobufCMessage *req,
		const ProtobufCMessageDescriptor *resp_desc,
		ProtobufCMessage **out, struct mgrpc_call *call)
{
	SBX_ASSERT_ARG(out);
	*out = NULL;
	return do_call(c, method, req, resp_desc, out, NULL, NULL, call);
}

int mgrpc_stream(struct mgrpc *c, const char *method,
		 const ProtobufCMessage *req,
		 const ProtobufCMessageDescriptor *resp_desc, mgrpc_msg_cb cb,
		 void *payload, struct mgrpc_call *call)
{
	SBX_ASSERT_ARG(cb);
	return do_call(c, method, req, resp_desc, NULL, cb, payload, call);
}
