/* The libmicrohttpd server layer of sbx-agent and `sbx serve`; see
 * sbx/httpd.h. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <microhttpd.h>

#include "sbx/httpd.h"
#include "sbx/json.h"
#include "sbx/log.h"
#include "sbx/xmalloc.h"

/* Longest id a '*' segment matches, and any segment a '+' matches. */
#define MAX_ID 64
#define MAX_SEGMENT 255

/* ---- listening sockets --------------------------------------------------- */

int sbx_httpd_listen_unix(int *fd_out, const char *path, unsigned flags)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old = 0;
	int fd, b;

	*fd_out = -1;
	if (!*path || strlen(path) >= sizeof(sun.sun_path))
		return sbx_error_set(SBX_ERR_CONFIG, -ENAMETOOLONG,
				     "bad unix socket path (empty, or %zu "
				     "bytes or more): '%s'",
				     sizeof(sun.sun_path), path);
	memcpy(sun.sun_path, path, strlen(path) + 1);
	/* A stale socket from a previous run; never remove anything else. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return sbx_error_os("socket");
	/* The socket file's mode is then the access control: owner only. */
	if (flags & SBX_HTTPD_LISTEN_PRIVATE)
		old = umask(077);
	b = bind(fd, (struct sockaddr *)&sun, sizeof(sun));
	if (flags & SBX_HTTPD_LISTEN_PRIVATE)
		umask(old);
	if (b < 0 || listen(fd, 128) < 0) {
		int rc = sbx_error_os("listen on unix:%s", path);

		close(fd);
		return rc;
	}
	if (!(flags & SBX_HTTPD_LISTEN_QUIET))
		printf("listening on unix:%s\n", path);
	*fd_out = fd;
	return 0;
}

static bool is_loopback(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const void *)sa;

		return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const void *)sa;

		return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
	}
	return false;
}

/* Split HOST:PORT, [V6]:PORT or :PORT; *host_out malloc'd. */
static bool split_spec(const char *spec, char **host_out, const char **port)
{
	const char *colon;

	*host_out = NULL;
	if (spec[0] == '[') {
		const char *close_b = strchr(spec, ']');

		if (!close_b || close_b[1] != ':')
			return false;
		*host_out = sbx_xstrndup(spec + 1, (size_t)(close_b - spec - 1));
		colon = close_b + 1;
	} else {
		colon = strrchr(spec, ':');
		if (!colon)
			return false;
		*host_out = sbx_xstrndup(spec, (size_t)(colon - spec));
	}
	*port = colon + 1;
	return **port != '\0';
}

/* Print "listening on ..." (unless quiet) and fill *addr_out from the
 * bound socket. */
static void report_bound(int fd, struct sbx_httpd_addr *addr_out, bool quiet)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char h[NI_MAXHOST], p[NI_MAXSERV];

	if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0 ||
	    getnameinfo((struct sockaddr *)&ss, sl, h, sizeof(h), p, sizeof(p),
			NI_NUMERICHOST | NI_NUMERICSERV) != 0)
		return;
	if (!quiet)
		printf("listening on %s%s%s:%s\n",
		       ss.ss_family == AF_INET6 ? "[" : "", h,
		       ss.ss_family == AF_INET6 ? "]" : "", p);
	if (addr_out) {
		size_t hl = strnlen(h, sizeof(addr_out->host) - 1);

		memcpy(addr_out->host, h, hl);
		addr_out->host[hl] = '\0';
		addr_out->port = (unsigned)strtoul(p, NULL, 10);
	}
}

int sbx_httpd_listen_tcp(int *fd_out, struct sbx_httpd_addr *addr_out,
			 const char *spec, unsigned flags)
{
	bool numeric = flags & SBX_HTTPD_LISTEN_NUMERIC;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE };
	struct addrinfo *res = NULL, *ai;
	char *host = NULL;
	const char *port;
	int fd = -1, rc, one = 1;

	*fd_out = -1;
	if (!split_spec(spec, &host, &port) || (numeric && !*host))
		goto bad;
	if (numeric) {
		hints.ai_flags |= AI_NUMERICHOST | AI_NUMERICSERV;
		if (!strcmp(host, "localhost")) {
			free(host);
			host = sbx_xstrdup("127.0.0.1");
		}
	}
	rc = getaddrinfo(*host ? host : NULL, port, &hints, &res);
	if (rc && numeric)
		goto bad;
	if (rc) {
		rc = sbx_error_set(SBX_ERR_CONFIG, -EINVAL, "--listen %s: %s",
				   spec, gai_strerror(rc));
		goto out;
	}
	rc = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		if ((flags & SBX_HTTPD_LISTEN_LOOPBACK) &&
		    !is_loopback(ai->ai_addr)) {
			rc = sbx_error_set(SBX_ERR_CONFIG, -EPERM,
					   "--listen %s is not a loopback "
					   "address: give --token-file too",
					   spec);
			goto out;
		}
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
	report_bound(fd, addr_out, flags & SBX_HTTPD_LISTEN_QUIET);
	*fd_out = fd;
	rc = 0;
out:
	if (res)
		freeaddrinfo(res);
	free(host);
	return rc;
bad:
	free(host);
	if (res)
		freeaddrinfo(res);
	return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
			     "--listen %s: expected %s:PORT or unix:PATH", spec,
			     numeric ? "IP" : "HOST");
}

/* ---- the daemon ---------------------------------------------------------- */

static void mhd_log(void *cls, const char *fmt, va_list ap) SBX_PRINTF(2, 0);

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

struct sbx_httpd {
	struct MHD_Daemon *d;
	struct sbx_httpd_opts o; /* the hooks and their payload */
};

/* One request: the application's object and where in its life it is. */
struct lreq {
	void *app;
	bool answered; /* drop the rest; `end` was called or is not needed */
	/* For the request log. */
	const char *method; /* MHD's */
	char *url;
	uint64_t start_ns;
};

static enum MHD_Result step(struct lreq *q, int rc)
{
	if (rc == SBX_HTTPD_ANSWERED)
		q->answered = true;
	return rc < 0 ? MHD_NO : MHD_YES;
}

/*
 * MHD's access handler: called once when the headers are in, once per
 * piece of body (*upload_size > 0), and once more at the end.
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload,
				  size_t *upload_size, void **con_cls)
{
	struct sbx_httpd *h = cls;
	struct lreq *q = *con_cls;

	if (!q) {
		q = sbx_xcalloc(1, sizeof(*q));
		q->method = method;
		q->url = sbx_xstrdup(url);
		q->start_ns = sbx_httpd_now_ns();
		*con_cls = q;
		sbx_error_clear();
		return step(q, h->o.begin(&q->app, h->o.payload, conn, method,
					  q->url));
	}
	if (q->answered) {
		/* Answered early (413, 401, ...): drop whatever comes. */
		*upload_size = 0;
		return MHD_YES;
	}
	if (*upload_size) {
		size_t n = *upload_size;

		*upload_size = 0;
		return step(q, h->o.body(q->app, upload, n));
	}
	q->answered = true;
	return h->o.end(q->app) < 0 ? MHD_NO : MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn,
			 void **con_cls, enum MHD_RequestTerminationCode toe)
{
	struct sbx_httpd *h = cls;
	struct lreq *q = *con_cls;
	unsigned status = 0;

	if (!q)
		return;
	if (q->app)
		status = h->o.done(q->app, toe);
	sbx_debug("%s %s -> %u (%.1f ms)%s", q->method, q->url, status,
		  (double)(sbx_httpd_now_ns() - q->start_ns) / 1e6,
		  toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? ""
							     : " (aborted)");
	free(q->url);
	free(q);
	*con_cls = NULL;
}

int sbx_httpd_start(struct sbx_httpd **out, const struct sbx_httpd_opts *o)
{
	struct sbx_httpd *h;
	struct MHD_OptionItem opt[16];
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION |
			 MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
	size_t n = 0;

#define OPT(option, value, ptr)                                                \
	(opt[n++] = (struct MHD_OptionItem){ (option), (intptr_t)(value),      \
					     (void *)(ptr) })
	*out = NULL;
	if ((o->tls_cert != NULL) != (o->tls_key != NULL))
		return sbx_error_set(SBX_ERR_CONFIG, -EINVAL,
				     "--tls-cert and --tls-key go together");
	if (o->tls_cert) {
		if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES)
			return sbx_error_set(SBX_ERR_CONFIG, -ENOTSUP,
					     "this libmicrohttpd has no TLS");
		flags |= MHD_USE_TLS;
	}
	/* First, so that MHD's own messages go through it too. */
	OPT(MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)mhd_log, NULL);
	OPT(MHD_OPTION_LISTEN_SOCKET, o->listen_fd, NULL);
	if (o->conn_memory)
		OPT(MHD_OPTION_CONNECTION_MEMORY_LIMIT, o->conn_memory, NULL);
	OPT(MHD_OPTION_CONNECTION_TIMEOUT, o->conn_timeout_s, NULL);
	if (o->conn_limit)
		OPT(MHD_OPTION_CONNECTION_LIMIT, o->conn_limit, NULL);
	if (o->on_connection)
		OPT(MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)o->on_connection,
		    o->payload);
	if (o->unescape)
		OPT(MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)o->unescape,
		    o->payload);
	h = sbx_xcalloc(1, sizeof(*h));
	h->o = *o;
	OPT(MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, h);
	if (o->tls_cert) {
		OPT(MHD_OPTION_HTTPS_MEM_CERT, 0, o->tls_cert);
		OPT(MHD_OPTION_HTTPS_MEM_KEY, 0, o->tls_key);
	}
	OPT(MHD_OPTION_END, 0, NULL);
#undef OPT
	h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h,
				MHD_OPTION_ARRAY, opt, MHD_OPTION_END);
	if (!h->d) {
		free(h);
		return sbx_error_set(SBX_ERR_OS, -EIO,
				     "cannot start the HTTP server (SBX_LOG="
				     "debug shows libmicrohttpd's reason)");
	}
	*out = h;
	return 0;
}

struct MHD_Daemon *sbx_httpd_daemon(const struct sbx_httpd *h)
{
	return h->d;
}

void sbx_httpd_stop(struct sbx_httpd *h)
{
	if (!h)
		return;
	MHD_stop_daemon(h->d);
	free(h);
}

void sbx_httpd_block_signals(sigset_t *set_out)
{
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(set_out);
	sigaddset(set_out, SIGINT);
	sigaddset(set_out, SIGTERM);
	sigaddset(set_out, SIGHUP);
	pthread_sigmask(SIG_BLOCK, set_out, NULL);
}

int sbx_httpd_wait_signal(const sigset_t *set)
{
	int sig = 0;

	while (sig == 0) {
		if (sigwait(set, &sig) != 0)
			return 0;
	}
	return sig;
}

/* ---- routes -------------------------------------------------------------- */

static bool id_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/*
 * Does `path` match `pattern`?  The wildcard's segment goes to
 * [*cap, *cap + *cap_len).
 */
static bool match(const char *pattern, const char *path, unsigned flags,
		  const char **cap, size_t *cap_len)
{
	const char *p = pattern, *s = path;

	*cap = NULL;
	*cap_len = 0;
	while (*p) {
		if (*p == '*' || *p == '+') {
			const char *start = s;
			size_t max = *p == '*' ? MAX_ID : MAX_SEGMENT;

			while (*s && (*p == '*' ? id_char(*s) : *s != '/'))
				s++;
			if (s == start || (size_t)(s - start) > max)
				return false;
			*cap = start;
			*cap_len = (size_t)(s - start);
			p++;
			continue;
		}
		if (*p != *s)
			return false;
		p++;
		s++;
	}
	return *s == '\0' ||
	       ((flags & SBX_HTTPD_ROUTE_SLASH) && s[0] == '/' && s[1] == '\0');
}

const struct sbx_httpd_route *sbx_httpd_route_at(
	const struct sbx_httpd_table *t, size_t index)
{
	return (const struct sbx_httpd_route *)((const char *)t->routes +
						index * t->stride);
}

/* Match `suffix` against the table: 0, -ENOENT or -EOPNOTSUPP. */
static int find_in(size_t *index_out, char **capture_out,
		   const struct sbx_httpd_table *t, const char *method,
		   const char *suffix)
{
	bool path_known = false;

	for (size_t k = 0; k < t->n; k++) {
		const struct sbx_httpd_route *r = sbx_httpd_route_at(t, k);
		const char *cap;
		size_t cap_len;

		if (!match(r->pattern, suffix, t->flags, &cap, &cap_len))
			continue;
		path_known = true;
		if (strcmp(r->method, method) != 0)
			continue;
		*index_out = k;
		if (cap)
			*capture_out = sbx_xstrndup(cap, cap_len);
		return 0;
	}
	return path_known ? -EOPNOTSUPP : -ENOENT;
}

int sbx_httpd_route_find(size_t *index_out, char **capture_out,
			 const struct sbx_httpd_table *t, const char *method,
			 const char *path)
{
	size_t alen = t->anchor ? strlen(t->anchor) : 0;
	int rc = -ENOENT;

	*index_out = 0;
	*capture_out = NULL;
	if (!t->anchor) {
		rc = find_in(index_out, capture_out, t, method, path);
	} else {
		/* From the last anchor to the first: a proxy's prefix may
		 * hold the anchor too ("/api/v1/namespaces/.../v1/info"). */
		for (size_t i = strlen(path); i-- > 0 && rc == -ENOENT;) {
			if (strncmp(path + i, t->anchor, alen) != 0)
				continue;
			rc = find_in(index_out, capture_out, t, method,
				     path + i);
			if (rc == -EOPNOTSUPP)
				path += i;
		}
	}
	if (rc == -EOPNOTSUPP)
		return sbx_error_set(SBX_ERR_PROTO, rc,
				     "method %s not allowed for %s", method,
				     path);
	if (rc < 0)
		return sbx_error_set(SBX_ERR_PROTO, rc, "no such route: %s",
				     path);
	return 0;
}

/* ---- request bodies ------------------------------------------------------ */

bool sbx_httpd_content_length(struct MHD_Connection *conn,
			      unsigned long long *out)
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

int sbx_httpd_body_add(struct sbx_buf *body, bool *too_big, const char *data,
		       size_t len)
{
	if (!*too_big && sbx_buf_add(body, data, len) == 0)
		return 0;
	if (!*too_big) {
		*too_big = true;
		sbx_buf_fini(body);
	}
	return sbx_error_set(SBX_ERR_PROTO, -EFBIG,
			     "request body over the limit");
}

/* ---- replies ------------------------------------------------------------- */

int sbx_httpd_queue(struct MHD_Connection *conn, unsigned status,
		    struct MHD_Response *take, const char *content_type,
		    const char *const *headers)
{
	enum MHD_Result ret;

	for (size_t i = 0; headers && headers[i] && headers[i + 1]; i += 2)
		MHD_add_response_header(take, headers[i], headers[i + 1]);
	MHD_add_response_header(take, MHD_HTTP_HEADER_CONTENT_TYPE,
				content_type);
	MHD_add_response_header(take, "Cache-Control", "no-store");
	ret = MHD_queue_response(conn, status, take);
	MHD_destroy_response(take);
	return ret;
}

struct MHD_Response *sbx_httpd_json_response(const cJSON *j)
{
	char *text = sbx_json_print(j, false);
	size_t len = strlen(text);
	struct MHD_Response *resp;

	/* A trailing newline makes curl and test output readable. */
	text = sbx_xrealloc(text, len + 2);
	text[len++] = '\n';
	text[len] = '\0';
	resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
	if (!resp)
		free(text);
	return resp;
}

cJSON *sbx_httpd_error_json(const char *kind_key, const char *kind,
			    const char *message)
{
	cJSON *o = cJSON_CreateObject(), *e = cJSON_CreateObject();

	sbx_json_set_str(e, kind_key, kind);
	sbx_json_set_str(e, "message", message);
	sbx_json_set_take(o, "error", e);
	return o;
}

uint64_t sbx_httpd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}
