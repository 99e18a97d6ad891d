/*
 * sbx-agent HTTP server: libmicrohttpd setup, request life cycle, replies,
 * streamed frame responses and shutdown.
 *
 * MHD runs one thread per connection, so handlers and stream callbacks may
 * block (a watch stream waits for events, exec output for the process).
 * The listen socket is created here, for TCP and unix sockets alike, and
 * handed to MHD with MHD_OPTION_LISTEN_SOCKET: one code path, any address
 * family, and port 0 works (the bound address is printed on stdout).
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

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
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---- replies ------------------------------------------------------------- */

int agent_reply(struct agent_req *r, unsigned status, struct MHD_Response *resp,
		const char *content_type)
{
	enum MHD_Result ret;

	MHD_add_response_header(resp, SBX_HDR_AGENT, AGENT_ID);
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				content_type);
	MHD_add_response_header(resp, "Cache-Control", "no-store");
	ret = MHD_queue_response(r->conn, status, resp);
	MHD_destroy_response(resp);
	r->answered = true;
	r->status = status;
	return ret;
}

int agent_reply_json(struct agent_req *r, unsigned status, cJSON *take)
{
	char *text = sbx_json_print(take, false);
	size_t len = strlen(text);
	struct MHD_Response *resp;

	cJSON_Delete(take);
	/* A trailing newline makes curl/test output readable; harmless. */
	text = sbx_xrealloc(text, len + 2);
	text[len++] = '\n';
	text[len] = '\0';
	resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		free(text);
		return MHD_NO;
	}
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

static bool content_length(struct MHD_Connection *conn, unsigned long long *out)
{
	const char *v = MHD_lookup_connection_value(
		conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
	char *end;

	if (!v)
		return false;
	errno = 0;
	*out = strtoull(v, &end, 10);
	return !errno && end != v;
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

/* ---- connections ----------------------------------------------------------- */

/* One accepted connection; MHD's socket context. */
struct agent_conn {
	/* In the untrusted list, oldest first: protected by conns->lock. */
	struct agent_conn *prev, *next;
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
	struct agent_conn *head, *tail; /* untrusted, oldest first */
	unsigned n;                     /* entries in the list */
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
	if (c->prev)
		c->prev->next = c->next;
	else
		cs->head = c->next;
	if (c->next)
		c->next->prev = c->prev;
	else
		cs->tail = c->prev;
	c->prev = c->next = NULL;
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
	while (cs->head && now - cs->head->accepted_ns >
				   (uint64_t)UNTRUSTED_TIMEOUT_S * 1000000000ULL)
		cut(cs, cs->head, "no token within the header timeout");
	for (it = cs->head; it; it = it->next) {
		if (same_addr(&it->addr, &c->addr)) {
			if (!oldest)
				oldest = it;
			same++;
		}
	}
	c->prev = cs->tail;
	if (cs->tail)
		cs->tail->next = c;
	else
		cs->head = c;
	cs->tail = c;
	c->listed = true;
	cs->n++;
	if (same + 1 > UNTRUSTED_PER_ADDR)
		cut(cs, oldest, "too many from one address");
	if (cs->n > UNTRUSTED_MAX)
		cut(cs, cs->head, "too many in all");
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

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct agent *a = cls;
	struct agent_req *r = *con_cls;
	unsigned long long clen;
	bool tok;
	int rc;

	if (!r) {
		r = sbx_xcalloc(1, sizeof(*r));
		r->a = a;
		r->conn = conn;
		r->method = method;
		r->url = sbx_xstrdup(url);
		r->start_ns = agent_now_ns();
		sbx_buf_init(&r->body, 0);
		*con_cls = r;
		sbx_error_clear();
		if (atomic_load(&a->stopping)) {
			sbx_error_set(SBX_ERR_STATE, -EIO, "agent shutting down");
			return agent_reply_error(r, MHD_HTTP_SERVICE_UNAVAILABLE,
						 -EIO);
		}
		{
			struct agent_conn *c = conn_of(conn);

			if (c && c->nul_in_url) {
				c->nul_in_url = false;
				sbx_error_set(SBX_ERR_PROTO, -EINVAL,
					      "NUL byte (%%00) in the URL");
				return agent_reply_error(
					r, MHD_HTTP_BAD_REQUEST, -EINVAL);
			}
		}
		tok = token_ok(a, conn);
		if (tok)
			conn_trust(a, conn);
		/* MHD's pool stops headers far beyond the limit (431, its
		 * own answer); this is the protocol's limit. */
		if (header_size(conn, url) > SBX_PROTO_MAX_HEADERS) {
			sbx_error_set(SBX_ERR_PROTO, -E2BIG,
				      "request headers exceed %d bytes",
				      SBX_PROTO_MAX_HEADERS);
			return agent_reply_error(r, MHD_HTTP_CONTENT_TOO_LARGE,
						 -E2BIG);
		}
		rc = agent_route_find(&r->route, &r->id, method, url);
		if (rc == -EOPNOTSUPP)
			return agent_reply_error(
				r, MHD_HTTP_METHOD_NOT_ALLOWED, rc);
		if (rc < 0)
			return agent_reply_error(r, MHD_HTTP_NOT_FOUND, rc);
		if (r->route->auth && !tok) {
			sbx_error_set(SBX_ERR_PROTO, -EACCES,
				      "missing or wrong %s", SBX_HDR_TOKEN);
			return agent_reply_error(r, MHD_HTTP_UNAUTHORIZED,
						 -EACCES);
		}
		if (r->route->upload) {
			/* A streamed body: no size limit, no buffer. */
			rc = r->route->upload(r, NULL, 0);
			return rc < 0 && !r->answered ? MHD_NO : MHD_YES;
		}
		if (content_length(conn, &clen) && clen > r->route->max_body) {
			/* Answer before reading the body; MHD closes. */
			sbx_error_set(SBX_ERR_PROTO, -EFBIG,
				      "request body of %llu bytes exceeds "
				      "%zu",
				      clen, r->route->max_body);
			return agent_reply_error(r, MHD_HTTP_CONTENT_TOO_LARGE,
						 -EFBIG);
		}
		sbx_buf_init(&r->body, r->route->max_body);
		return MHD_YES;
	}
	if (r->answered) {
		/* Answered early (413, 401): drop whatever still comes. */
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size && r->route->upload) {
		rc = r->route->upload(r, upload, *upload_size);
		*upload_size = 0;
		return rc < 0 ? MHD_NO : MHD_YES;
	}
	if (*upload_size) {
		if (!r->body_too_big &&
		    sbx_buf_add(&r->body, upload, *upload_size) < 0) {
			/* Chunked body over the limit: stop reading. */
			r->body_too_big = true;
			sbx_buf_fini(&r->body);
			*upload_size = 0;
			return MHD_NO;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	if (r->body_too_big) {
		sbx_error_set(SBX_ERR_PROTO, -EFBIG,
			      "request body exceeds %zu bytes",
			      r->route->max_body);
		return agent_reply_error(r, MHD_HTTP_CONTENT_TOO_LARGE, -EFBIG);
	}
	rc = r->route->handler(r);
	if (!r->answered) {
		/* A handler that queued nothing is a bug; say so. */
		sbx_error_set(SBX_ERR_INTERNAL, -EIO, "no response");
		return agent_reply_error(r, 500, -EIO);
	}
	return (enum MHD_Result)rc;
}

static void on_completed(void *cls, struct MHD_Connection *conn,
			 void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct agent_req *r = *con_cls;

	if (!r)
		return;
	sbx_debug("%s %s -> %u (%.1f ms)%s", r->method, r->url, r->status,
		  (double)(agent_now_ns() - r->start_ns) / 1e6,
		  toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? ""
							     : " (aborted)");
	if (r->upload_free)
		r->upload_free(r->upload_state);
	sbx_buf_fini(&r->body);
	free(r->url);
	free(r->id);
	free(r);
	*con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
	SBX_PRINTF(2, 0);

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
	char msg[512];
	size_t n;

	vsnprintf(msg, sizeof(msg), fmt, ap);
	n = strlen(msg);
	while (n && msg[n - 1] == '\n')
		msg[--n] = '\0';
	sbx_debug("libmicrohttpd: %s", msg);
}

/* ---- setup ---------------------------------------------------------------- */

static int read_token(struct agent *a, const char *file)
{
	int rc = sbx_token_file_read(&a->token, file);

	if (rc == 0)
		a->token_len = strlen(a->token);
	return rc;
}

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

static int listen_unix(struct agent *a, const char *path)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct stat st;
	int fd;

	if (strlen(path) >= sizeof(sun.sun_path))
		return sbx_error_set(SBX_ERR_CONFIG, -ENAMETOOLONG,
				     "unix socket path too long: %s", path);
	memcpy(sun.sun_path, path, strlen(path) + 1);
	/* A stale socket from a previous run; never remove anything else. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return sbx_error_os("socket");
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 ||
	    listen(fd, 128) < 0) {
		int rc = sbx_error_os("listen on unix:%s", path);

		close(fd);
		return rc;
	}
	a->listen_fd = fd;
	a->unix_path = sbx_xstrdup(path);
	printf("listening on unix:%s\n", path);
	return 0;
}

static int listen_tcp(struct agent *a, const char *spec)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *res = NULL, *ai;
	char *host = NULL, *port;
	const char *colon;
	int fd = -1, rc, one = 1;

	/* HOST:PORT, [V6]:PORT or :PORT (all addresses). */
	if (spec[0] == '[') {
		const char *close_b = strchr(spec, ']');

		if (!close_b || close_b[1] != ':')
			goto bad;
		host = sbx_xstrndup(spec + 1, (size_t)(close_b - spec - 1));
		colon = close_b + 1;
	} else {
		colon = strrchr(spec, ':');
		if (!colon)
			goto bad;
		host = sbx_xstrndup(spec, (size_t)(colon - spec));
	}
	port = (char *)colon + 1;
	if (!*port)
		goto bad;
	rc = getaddrinfo(*host ? host : NULL, port, &hints, &res);
	if (rc) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL, "--listen %s: %s",
				   spec, gai_strerror(rc));
		goto out;
	}
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family,
			    ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
			    ai->ai_protocol);
		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
		    listen(fd, 128) == 0)
			break;
		rc = sbx_error_os("listen on %s", spec);
		close(fd);
		fd = -1;
	}
	if (fd < 0) {
		if (rc == -EADDRNOTAVAIL)
			rc = sbx_error_set(SBX_ERR_CONFIG, rc,
					   "--listen %s: no usable address",
					   spec);
		goto out;
	}
	{
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		char h[NI_MAXHOST], p[NI_MAXSERV];

		if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
		    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), p,
				sizeof(p), NI_NUMERICHOST | NI_NUMERICSERV) ==
			    0)
			printf("listening on %s%s%s:%s\n",
			       ss.ss_family == AF_INET6 ? "[" : "", h,
			       ss.ss_family == AF_INET6 ? "]" : "", p);
	}
	a->listen_fd = fd;
	rc = 0;
out:
	if (res)
		freeaddrinfo(res);
	free(host);
	return rc;
bad:
	free(host);
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "--listen %s: expected HOST:PORT or unix:PATH",
			     spec);
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
	unsigned flags;
	sigset_t set;
	int rc, sig;
	struct stat st;
	struct agent_conns conns = { .lock = PTHREAD_MUTEX_INITIALIZER };

	atomic_init(&a.stopping, false);
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
		rc = read_token(&a, opt->token_file);
	if (rc < 0)
		goto out;
	if ((opt->tls_cert != NULL) != (opt->tls_key != NULL)) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				   "--tls-cert and --tls-key go together");
		goto out;
	}
	if (opt->tls_cert) {
		if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -ENOTSUP,
					   "this libmicrohttpd has no TLS");
			goto out;
		}
		rc = read_file_mem(opt->tls_cert, &cert);
		if (rc == 0)
			rc = read_file_mem(opt->tls_key, &key);
		if (rc < 0)
			goto out;
	}
	if (!strncmp(opt->listen, "unix:", 5))
		rc = listen_unix(&a, opt->listen + 5);
	else
		rc = listen_tcp(&a, opt->listen);
	if (rc < 0)
		goto out;
	fflush(stdout);

	/* Signals: SIGPIPE ignored (writes to gone clients and exited
	 * commands' stdin fail with EPIPE instead); SIGINT/TERM/HUP are
	 * blocked in every thread and taken by sigwait() below.  Children
	 * reset both (handlers_exec.c). */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	rc = agent_exec_init(&a);
	if (rc < 0)
		goto out;
	if (agent_watch_start(&a) < 0) {
		sbx_warn("watch disabled: %s", sbx_error_last()->msg);
		sbx_error_clear();
	}

	flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
		MHD_USE_ERROR_LOG;
	if (cert)
		flags |= MHD_USE_TLS;
	a.mhd = MHD_start_daemon(
		flags, 0, NULL, NULL, on_request, &a,
		/* First, so that MHD's own messages go through it too. */
		MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
		MHD_OPTION_LISTEN_SOCKET, a.listen_fd,
		MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONN_MEMORY,
		/* Until the token is shown; then CONN_TIMEOUT_S. */
		MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)UNTRUSTED_TIMEOUT_S,
		MHD_OPTION_CONNECTION_LIMIT, (unsigned)CONN_LIMIT,
		MHD_OPTION_NOTIFY_CONNECTION, conn_notify, &a,
		MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, &a,
		cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, cert,
		MHD_OPTION_HTTPS_MEM_KEY, key, MHD_OPTION_END);
	if (!a.mhd) {
		rc = sbx_error_set(SBX_ERR_OS, -EIO,
				   "cannot start the HTTP server (SBX_LOG=debug "
				   "shows libmicrohttpd's reason)");
		goto out_stop;
	}
	sbx_info("serving %s on %s (boot %s)", a.root_path, opt->listen,
		 a.boot_id);
	do {
		sig = 0;
		if (sigwait(&set, &sig) != 0)
			break;
	} while (sig == 0);
	sbx_info("signal %d: shutting down", sig);

	/* Refuse new requests, wake blocked streams, then stop MHD (it joins
	 * the connection threads). */
	atomic_store(&a.stopping, true);
	agent_watch_wake(&a);
	agent_exec_wake(&a);
	MHD_stop_daemon(a.mhd);
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
