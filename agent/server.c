/*
 * sbx-agent HTTP server: the request life cycle, replies, streamed frame
 * responses, the untrusted-connection pool and shutdown.  Listening, the
 * daemon's start, route matching, body accumulation and the request log
 * are lib/httpd.c's (sbx/httpd.h), shared with `sbx serve`.
 *
 * MHD runs one thread per connection, so handlers and stream callbacks may
 * block (a watch stream waits for events, exec output for the process).
 * The listen socket is created here, for TCP and unix sockets alike, and
 * handed to MHD with MHD_OPTION_LISTEN_SOCKET: one code path, any address
 * family, and port 0 works (the bound address is printed on stdout).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/httpd.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/paths.h"
#include "sbx/proto.h"
#include "sbx/token.h"
#include "sbx/xmalloc.h"

#include "agent_i.h"

#define AGENT_ID "sbx-agent/" SBX_VERSION

/*
 * Per-connection memory pool.  It holds the request line and headers (the
 * protocol allows 16 KiB) plus MHD's own bookkeeping and our response
 * headers; a header block that does not fit is refused by MHD (431).
 */
#define CONN_MEMORY (SBX_PROTO_MAX_HEADERS + 8 * 1024)
/*
 * Connections (docs/protocol.md, "Connections").  A connection is
 * *untrusted* until one of its requests carries the right token.  Untrusted
 * connections get UNTRUSTED_TIMEOUT_S, both as MHD's idle timeout and as
 * their whole lifetime, and at most UNTRUSTED_PER_ADDR of them per client
 * address and UNTRUSTED_MAX in all are kept: beyond that the oldest is cut.
 * Cutting the oldest rather than refusing the newest is what keeps a
 * client usable next to someone who holds idle sockets from the same
 * address (loopback, a Kubernetes API server proxy): its new connection
 * shows the token within milliseconds and leaves the untrusted pool.
 * Trusted connections (the client's pool, watch and exec streams) keep
 * CONN_TIMEOUT_S.  UNTRUSTED_MAX stays well below CONN_LIMIT, so untrusted
 * connections alone never bring MHD to its limit (where it stops
 * accepting).
 */
#define CONN_TIMEOUT_S 300
#define CONN_LIMIT 1024
#define UNTRUSTED_TIMEOUT_S 10
#define UNTRUSTED_PER_ADDR 64
#define UNTRUSTED_MAX 256
#define STREAM_BLOCK (64 * 1024)
/* A stream buffer holds one frame at most (see agent_frame()). */
#define STREAM_BUF_CAP                                                         \
	(4 + SBX_PROTO_MAX_FRAME_JSON + SBX_PROTO_MAX_FRAME_DATA + 1024)

uint64_t agent_now_ns(void)
{
	return sbx_httpd_now_ns();
}

/* ---- replies ------------------------------------------------------------- */

int agent_reply(struct agent_req *r, unsigned status, struct MHD_Response *resp,
		const char *content_type)
{
	static const char *const headers[] = { SBX_HDR_AGENT, AGENT_ID, NULL };

	r->answered = true;
	r->status = status;
	return sbx_httpd_queue(r->conn, status, resp, content_type, headers);
}

int agent_reply_json(struct agent_req *r, unsigned status, cJSON *take)
{
	struct MHD_Response *resp = sbx_httpd_json_response(take);

	cJSON_Delete(take);
	if (!resp)
		return MHD_NO;
	return agent_reply(r, status, resp, SBX_CT_JSON);
}

int agent_reply_ok(struct agent_req *r)
{
	cJSON *o = cJSON_CreateObject();

	cJSON_AddBoolToObject(o, "ok", 1);
	return agent_reply_json(r, MHD_HTTP_OK, o);
}

int agent_reply_error(struct agent_req *r, unsigned status, int rc)
{
	const struct sbx_error *e = sbx_error_last();
	const char *msg = e->code == rc && e->msg[0] ? e->msg : NULL;

	if (rc >= 0)
		rc = -EIO;
	if (!status)
		status = (unsigned)sbx_proto_http_status(rc);
	sbx_debug("%s %s: %d %s", r->method, r->url, status,
		  msg ? msg : strerror(-rc));
	return agent_reply_json(r, status, sbx_proto_error_to_json(rc, msg));
}

/* ---- request helpers ----------------------------------------------------- */

const char *agent_arg(struct agent_req *r, const char *key)
{
	return MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, key);
}

int agent_arg_int(struct agent_req *r, const char *key, long long dflt,
		  long long lo, long long hi, long long *out)
{
	const char *v = agent_arg(r, key);
	char *end;
	long long n;

	*out = dflt;
	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtoll(v, &end, 10);
	if (errno || *end || n < lo || n > hi)
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "query argument %s=%s: expected an integer "
				     "in [%lld, %lld]",
				     key, v, lo, hi);
	*out = n;
	return 0;
}

int agent_arg_u64(struct agent_req *r, const char *key, uint64_t *out)
{
	const char *v = agent_arg(r, key);
	char *end;
	unsigned long long n;

	*out = 0;
	if (!v || !*v)
		return 0;
	errno = 0;
	n = strtoull(v, &end, 10);
	/* strtoull takes a sign and blanks: digits only. */
	if (errno || *end || *v < '0' || *v > '9')
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "query argument %s=%s: expected an "
				     "unsigned 64-bit decimal integer",
				     key, v);
	*out = n;
	return 0;
}

int agent_body_json(struct agent_req *r, cJSON **out)
{
	int rc;

	*out = NULL;
	rc = sbx_json_parse(out, sbx_buf_ptr(&r->body), sbx_buf_len(&r->body),
			    "request body");
	if (rc < 0)
		return rc;
	if (!cJSON_IsObject(*out)) {
		cJSON_Delete(*out);
		*out = NULL;
		return sbx_error_set(SBX_ERR_PROTO, -EINVAL,
				     "request body: expected a JSON object");
	}
	return 0;
}

bool agent_conn_alive(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci;
	struct pollfd pfd;

	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (!ci)
		return true;
	pfd.fd = ci->connect_fd;
	pfd.events = POLLRDHUP;
	pfd.revents = 0;
	if (poll(&pfd, 1, 0) <= 0)
		return true;
	return !(pfd.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* ---- streams ------------------------------------------------------------- */

void agent_frame(struct sbx_buf *out, cJSON *take_hdr, const void *data,
		 size_t len)
{
	int rc;

	if (len || cJSON_GetObjectItemCaseSensitive(take_hdr, "len"))
		rc = sbx_frame_encode_data(out, take_hdr, data, len);
	else
		rc = sbx_frame_encode(out, take_hdr, NULL, 0);
	cJSON_Delete(take_hdr);
	if (rc < 0) {
		/* Producers size frames below the limits, so this is a bug;
		 * the frame is left out whole, the stream stays parseable. */
		sbx_error("frame left out: %s", sbx_error_last()->msg);
		sbx_error_clear();
	}
}

struct stream_ctx {
	struct agent_stream *s;
	struct sbx_buf buf;
	size_t off;
	bool done;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *dst, size_t max)
{
	struct stream_ctx *c = cls;
	size_t n;

	while (c->off >= c->buf.len) {
		int rc;

		if (c->done)
			return MHD_CONTENT_READER_END_OF_STREAM;
		sbx_buf_reset(&c->buf);
		c->off = 0;
		rc = c->s->next(c->s, &c->buf);
		if (rc < 0) {
			sbx_debug("stream ended early: %s", strerror(-rc));
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
		if (rc == 1)
			c->done = true;
	}
	n = c->buf.len - c->off;
	if (n > max)
		n = max;
	memcpy(dst, c->buf.data + c->off, n);
	c->off += n;
	return (ssize_t)n;
}

static void stream_free(void *cls)
{
	struct stream_ctx *c = cls;

	c->s->fini(c->s);
	sbx_buf_fini(&c->buf);
	free(c);
}

int agent_reply_stream(struct agent_req *r, struct agent_stream *s)
{
	struct stream_ctx *c = sbx_xcalloc(1, sizeof(*c));
	struct MHD_Response *resp;

	s->a = r->a;
	s->conn = r->conn;
	c->s = s;
	sbx_buf_init(&c->buf, STREAM_BUF_CAP);
	resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK,
						 stream_read, c, stream_free);
	if (!resp) {
		stream_free(c);
		return MHD_NO;
	}
	return agent_reply(r, MHD_HTTP_OK, resp, SBX_CT_OCTET);
}

/* ---- request life cycle -------------------------------------------------- */

static bool token_ok(struct agent *a, struct MHD_Connection *conn)
{
	return sbx_token_equal(a->token, a->token_len,
			       MHD_lookup_connection_value(conn,
							   MHD_HEADER_KIND,
							   SBX_HDR_TOKEN));
}

static enum MHD_Result add_header_size(void *cls, enum MHD_ValueKind kind,
				       const char *key, const char *value)
{
	size_t *total = cls;

	*total += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": ", CRLF */
	return MHD_YES;
}

/* The request line and headers as received, approximately. */
static size_t header_size(struct MHD_Connection *conn, const char *url)
{
	size_t total = strlen(url) + 32;

	MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header_size,
				  &total);
	return total;
}

/* ---- connections --------------------------------------------------------- */

/* One accepted connection; MHD's socket context. */
struct agent_conn {
	/* In the untrusted list, oldest first: protected by conns->lock. */
	TAILQ_ENTRY(agent_conn) link;
	bool listed;
	int fd;
	struct sockaddr_storage addr;
	uint64_t accepted_ns;
	/* The connection's own thread only. */
	bool trusted;
	bool nul_in_url; /* the URL of the request being parsed had %00 */
};

struct agent_conns {
	pthread_mutex_t lock;
	TAILQ_HEAD(, agent_conn) untrusted; /* oldest first */
	unsigned n;                         /* entries in the list */
};

static bool same_addr(const struct sockaddr_storage *x,
		      const struct sockaddr_storage *y)
{
	if (x->ss_family != y->ss_family)
		return false;
	if (x->ss_family == AF_INET)
		return ((const struct sockaddr_in *)x)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)y)->sin_addr.s_addr;
	if (x->ss_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)x)->sin6_addr,
			       &((const struct sockaddr_in6 *)y)->sin6_addr,
			       sizeof(struct in6_addr));
	return true; /* unix sockets: one local "address" */
}

/* Take `c` off the untrusted list.  Called with the lock held. */
static void unlist(struct agent_conns *cs, struct agent_conn *c)
{
	if (!c->listed)
		return;
	TAILQ_REMOVE(&cs->untrusted, c, link);
	c->listed = false;
	cs->n--;
}

/*
 * Cut an untrusted connection: shutdown() wakes its thread, which sees the
 * end of the stream and lets MHD close it.  Called with the lock held; a
 * listed connection's fd is still open, because MHD reports the close
 * (conn_notify) before it closes the fd, and that takes the lock.
 */
static void cut(struct agent_conns *cs, struct agent_conn *c, const char *why)
{
	sbx_debug("closing an unauthenticated connection: %s", why);
	unlist(cs, c);
	shutdown(c->fd, SHUT_RDWR);
}

static void conn_started(struct agent_conns *cs, struct agent_conn *c)
{
	uint64_t now = agent_now_ns();
	struct agent_conn *it, *oldest = NULL;
	unsigned same = 0;

	pthread_mutex_lock(&cs->lock);
	/* The lifetime limit, checked whenever someone new arrives: a
	 * connection that trickles bytes never idles, but cannot stay. */
	while ((it = TAILQ_FIRST(&cs->untrusted)) &&
	       now - it->accepted_ns >
		       (uint64_t)UNTRUSTED_TIMEOUT_S * 1000000000ULL)
		cut(cs, it, "no token within the header timeout");
	TAILQ_FOREACH(it, &cs->untrusted, link) {
		if (same_addr(&it->addr, &c->addr)) {
			if (!oldest)
				oldest = it;
			same++;
		}
	}
	TAILQ_INSERT_TAIL(&cs->untrusted, c, link);
	c->listed = true;
	cs->n++;
	if (same + 1 > UNTRUSTED_PER_ADDR)
		cut(cs, oldest, "too many from one address");
	if (cs->n > UNTRUSTED_MAX)
		cut(cs, TAILQ_FIRST(&cs->untrusted), "too many in all");
	pthread_mutex_unlock(&cs->lock);
}

static void conn_notify(void *cls, struct MHD_Connection *conn,
			void **socket_context,
			enum MHD_ConnectionNotificationCode toe)
{
	struct agent *a = cls;
	struct agent_conn *c = *socket_context;
	const union MHD_ConnectionInfo *ci;

	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		c = sbx_xcalloc(1, sizeof(*c));
		c->fd = -1;
		c->accepted_ns = agent_now_ns();
		ci = MHD_get_connection_info(conn,
					     MHD_CONNECTION_INFO_CONNECTION_FD);
		if (ci)
			c->fd = ci->connect_fd;
		ci = MHD_get_connection_info(conn,
					     MHD_CONNECTION_INFO_CLIENT_ADDRESS);
		if (ci && ci->client_addr) {
			socklen_t len = ci->client_addr->sa_family == AF_INET6
						? sizeof(struct sockaddr_in6)
					: ci->client_addr->sa_family == AF_INET
						? sizeof(struct sockaddr_in)
						: 0;

			if (len)
				memcpy(&c->addr, ci->client_addr, len);
			else
				c->addr.ss_family = ci->client_addr->sa_family;
		} else {
			c->addr.ss_family = AF_UNIX;
		}
		*socket_context = c;
		if (c->fd >= 0)
			conn_started(a->conns, c);
		return;
	}
	if (toe == MHD_CONNECTION_NOTIFY_CLOSED && c) {
		pthread_mutex_lock(&a->conns->lock);
		unlist(a->conns, c);
		pthread_mutex_unlock(&a->conns->lock);
		free(c);
		*socket_context = NULL;
	}
}

static struct agent_conn *conn_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
		MHD_get_connection_info(conn,
					MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* The request showed the token: the connection leaves the untrusted pool
 * and gets the long idle timeout. */
static void conn_trust(struct agent *a, struct MHD_Connection *conn)
{
	struct agent_conn *c = conn_of(conn);

	if (!c || c->trusted)
		return;
	pthread_mutex_lock(&a->conns->lock);
	unlist(a->conns, c);
	pthread_mutex_unlock(&a->conns->lock);
	c->trusted = true;
	MHD_set_connection_option(conn, MHD_CONNECTION_OPTION_TIMEOUT,
				  (unsigned)CONN_TIMEOUT_S);
}

/*
 * MHD's own unescaping, which notes a %00 in the URL or a query argument:
 * the decoded C string would silently end there ("d/f%00x" read "d/f").
 * Runs on the connection's thread while the request line is parsed, before
 * the request's first on_request() call, which answers 400.
 */
static size_t unescape(void *cls, struct MHD_Connection *conn, char *s)
{
	size_t n = MHD_http_unescape(s);

	if (memchr(s, '\0', n)) {
		struct agent_conn *c = conn_of(conn);

		if (c)
			c->nul_in_url = true;
	}
	return n;
}

/* Headers in: refuse, route, authenticate (the `begin` hook, sbx/httpd.h). */
static int req_begin(void **req_out, void *payload, struct MHD_Connection *conn,
		     const char *method, const char *url)
{
	struct agent *a = payload;
	struct agent_req *r = sbx_xcalloc(1, sizeof(*r));
	struct agent_conn *c = conn_of(conn);
	unsigned long long clen;
	bool tok;
	int rc;

	r->a = a;
	r->conn = conn;
	r->method = method;
	r->url = sbx_xstrdup(url);
	r->start_ns = agent_now_ns();
	sbx_buf_init(&r->body, 0);
	*req_out = r;
	if (atomic_load(&a->stopping)) {
		sbx_error_set(SBX_ERR_STATE, -EIO, "agent shutting down");
		return sbx_httpd_answered(agent_reply_error(
			r, MHD_HTTP_SERVICE_UNAVAILABLE, -EIO));
	}
	if (c && c->nul_in_url) {
		c->nul_in_url = false;
		sbx_error_set(SBX_ERR_PROTO, -EINVAL,
			      "NUL byte (%%00) in the URL");
		return sbx_httpd_answered(
			agent_reply_error(r, MHD_HTTP_BAD_REQUEST, -EINVAL));
	}
	tok = token_ok(a, conn);
	if (tok)
		conn_trust(a, conn);
	/* MHD's pool stops headers far beyond the limit (431, its own
	 * answer); this is the protocol's limit. */
	if (header_size(conn, url) > SBX_PROTO_MAX_HEADERS) {
		sbx_error_set(SBX_ERR_PROTO, -E2BIG,
			      "request headers exceed %d bytes",
			      SBX_PROTO_MAX_HEADERS);
		return sbx_httpd_answered(agent_reply_error(
			r, MHD_HTTP_CONTENT_TOO_LARGE, -E2BIG));
	}
	rc = agent_route_find(&r->route, &r->id, method, url);
	if (rc < 0)
		return sbx_httpd_answered(agent_reply_error(
			r,
			rc == -EOPNOTSUPP ? MHD_HTTP_METHOD_NOT_ALLOWED
					  : MHD_HTTP_NOT_FOUND,
			rc));
	if (r->route->auth && !tok) {
		sbx_error_set(SBX_ERR_PROTO, -EACCES, "missing or wrong %s",
			      SBX_HDR_TOKEN);
		return sbx_httpd_answered(
			agent_reply_error(r, MHD_HTTP_UNAUTHORIZED, -EACCES));
	}
	if (r->route->upload) {
		/* A streamed body: no size limit, no buffer. */
		rc = r->route->upload(r, NULL, 0);
		if (r->answered)
			return SBX_HTTPD_ANSWERED;
		return rc < 0 ? SBX_HTTPD_CLOSE : SBX_HTTPD_NEXT;
	}
	if (sbx_httpd_content_length(conn, &clen) &&
	    clen > r->route->max_body) {
		/* Answer before reading the body; MHD closes. */
		sbx_error_set(SBX_ERR_PROTO, -EFBIG,
			      "request body of %llu bytes exceeds %zu", clen,
			      r->route->max_body);
		return sbx_httpd_answered(agent_reply_error(
			r, MHD_HTTP_CONTENT_TOO_LARGE, -EFBIG));
	}
	sbx_buf_init(&r->body, r->route->max_body);
	return SBX_HTTPD_NEXT;
}

static int req_body(void *req, const char *data, size_t len)
{
	struct agent_req *r = req;
	int rc;

	if (r->route->upload) {
		rc = r->route->upload(r, data, len);
		if (rc < 0)
			return SBX_HTTPD_CLOSE;
		return r->answered ? SBX_HTTPD_ANSWERED : SBX_HTTPD_NEXT;
	}
	/* A chunked body over the limit: stop reading. */
	if (sbx_httpd_body_add(&r->body, &r->body_too_big, data, len) < 0)
		return SBX_HTTPD_CLOSE;
	return SBX_HTTPD_NEXT;
}

static int req_end(void *req)
{
	struct agent_req *r = req;
	int rc;

	if (r->body_too_big) {
		sbx_error_set(SBX_ERR_PROTO, -EFBIG,
			      "request body exceeds %zu bytes",
			      r->route->max_body);
		return sbx_httpd_answered(agent_reply_error(
			r, MHD_HTTP_CONTENT_TOO_LARGE, -EFBIG));
	}
	rc = r->route->handler(r);
	if (!r->answered) {
		/* A handler that queued nothing is a bug; say so. */
		sbx_error_set(SBX_ERR_INTERNAL, -EIO, "no response");
		return sbx_httpd_answered(agent_reply_error(r, 500, -EIO));
	}
	return sbx_httpd_answered(rc);
}

static unsigned req_done(void *req, enum MHD_RequestTerminationCode toe)
{
	struct agent_req *r = req;
	unsigned status = r->status;

	if (r->upload_free)
		r->upload_free(r->upload_state);
	sbx_buf_fini(&r->body);
	free(r->url);
	free(r->id);
	free(r);
	return status;
}

/* ---- setup --------------------------------------------------------------- */

/*
 * --token-env NAME: the variable's value without trailing whitespace.  The
 * variable is then wiped and removed, so commands started by exec do not
 * inherit it (and /proc/PID/environ no longer shows it).
 */
static int read_token_env(struct agent *a, const char *name)
{
	char *v = getenv(name);
	size_t n = v ? strlen(v) : 0;

	while (n && (v[n - 1] == ' ' || v[n - 1] == '\t' || v[n - 1] == '\r' ||
		     v[n - 1] == '\n'))
		n--;
	if (n == 0)
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "--token-env %s: the variable is %s", name,
				     v ? "empty" : "not set");
	a->token = sbx_xstrndup(v, n);
	a->token_len = n;
	explicit_bzero(v, strlen(v));
	unsetenv(name);
	return 0;
}

static void random_hex(char *out, size_t bytes)
{
	unsigned char b[64];
	static const char hex[] = "0123456789abcdef";

	if (bytes > sizeof(b))
		bytes = sizeof(b);
	if (getrandom(b, bytes, 0) != (ssize_t)bytes) {
		/* No entropy source: time and pid still differ per start. */
		uint64_t t = agent_now_ns() ^ ((uint64_t)getpid() << 32);

		for (size_t i = 0; i < bytes; i++)
			b[i] = (unsigned char)(t >> ((i % 8) * 8)) ^
			       (unsigned char)i;
	}
	for (size_t i = 0; i < bytes; i++) {
		out[2 * i] = hex[b[i] >> 4];
		out[2 * i + 1] = hex[b[i] & 15];
	}
	out[2 * bytes] = '\0';
}

static int read_file_mem(const char *path, char **out)
{
	return sbx_file_read(path, 1024 * 1024, out, NULL);
}

static void agent_free(struct agent *a)
{
	if (a->root_fd >= 0)
		close(a->root_fd);
	if (a->listen_fd >= 0)
		close(a->listen_fd);
	if (a->unix_path)
		unlink(a->unix_path);
	free(a->unix_path);
	free(a->root_path);
	if (a->token)
		explicit_bzero(a->token, a->token_len);
	free(a->token);
}

int agent_server_run(const struct agent_options *opt)
{
	struct agent a = { .root_fd = -1, .listen_fd = -1 };
	char *cert = NULL, *key = NULL;
	struct sbx_httpd *httpd = NULL;
	sigset_t set;
	int rc, sig;
	struct stat st;
	struct agent_conns conns = { .lock = PTHREAD_MUTEX_INITIALIZER };

	atomic_init(&a.stopping, false);
	TAILQ_INIT(&conns.untrusted);
	a.conns = &conns;
	random_hex(a.boot_id, 16);
	a.root_path = realpath(opt->root, NULL);
	if (!a.root_path) {
		rc = sbx_error_os("--root %s", opt->root);
		goto out;
	}
	a.root_fd = open(a.root_path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (a.root_fd < 0 || fstat(a.root_fd, &st) < 0) {
		rc = sbx_error_os("--root %s", opt->root);
		goto out;
	}
	agent_confine_init(&a);
	if (opt->token_env)
		rc = read_token_env(&a, opt->token_env);
	else
		rc = sbx_token_file_read(&a.token, opt->token_file);
	if (rc < 0)
		goto out;
	a.token_len = strlen(a.token);
	if ((opt->tls_cert != NULL) != (opt->tls_key != NULL)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "--tls-cert and --tls-key go together");
		goto out;
	}
	if (opt->tls_cert &&
	    MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
		/* Before anything is read or bound. */
		rc = sbx_error_set(SBX_ERR_CONFIG, -ENOTSUP,
				   "this libmicrohttpd has no TLS");
		goto out;
	}
	if (opt->tls_cert) {
		rc = read_file_mem(opt->tls_cert, &cert);
		if (rc == 0)
			rc = read_file_mem(opt->tls_key, &key);
		if (rc < 0)
			goto out;
	}
	if (!strncmp(opt->listen, "unix:", 5)) {
		rc = sbx_httpd_listen_unix(&a.listen_fd, opt->listen + 5, 0);
		if (rc == 0)
			a.unix_path = sbx_xstrdup(opt->listen + 5);
	} else {
		rc = sbx_httpd_listen_tcp(&a.listen_fd, NULL, opt->listen, 0);
	}
	if (rc < 0)
		goto out;
	fflush(stdout);

	/* Also the writes to exited commands' stdin fail with EPIPE then;
	 * children reset both (handlers_exec.c). */
	sbx_httpd_block_signals(&set);

	rc = agent_exec_init(&a);
	if (rc < 0)
		goto out;
	if (agent_watch_start(&a) < 0) {
		sbx_warn("watch disabled: %s", sbx_error_last()->msg);
		sbx_error_clear();
	}

	rc = sbx_httpd_start(&httpd, &(const struct sbx_httpd_opts){
		.listen_fd = a.listen_fd,
		.tls_cert = cert,
		.tls_key = key,
		.conn_memory = CONN_MEMORY,
		/* Until the token is shown; then CONN_TIMEOUT_S. */
		.conn_timeout_s = UNTRUSTED_TIMEOUT_S,
		.conn_limit = CONN_LIMIT,
		.begin = req_begin,
		.body = req_body,
		.end = req_end,
		.done = req_done,
		.on_connection = conn_notify,
		.unescape = unescape,
		.payload = &a,
	});
	if (rc < 0)
		goto out_stop;
	a.mhd = sbx_httpd_daemon(httpd);
	sbx_info("serving %s on %s (boot %s)", a.root_path, opt->listen,
		 a.boot_id);
	sig = sbx_httpd_wait_signal(&set);
	sbx_info("signal %d: shutting down", sig);

	/* Refuse new requests, wake blocked streams, then stop MHD (it joins
	 * the connection threads). */
	atomic_store(&a.stopping, true);
	agent_watch_wake(&a);
	agent_exec_wake(&a);
	sbx_httpd_stop(httpd);
	a.mhd = NULL;
	a.listen_fd = -1; /* closed by MHD */
	rc = 0;
out_stop:
	agent_exec_fini(&a);
	agent_watch_stop(&a);
out:
	free(cert);
	if (key)
		explicit_bzero(key, strlen(key));
	free(key);
	agent_free(&a);
	return rc;
}
