/*
 * Remote provider pieces that need no agent: URL and query building,
 * configuration and token validation, error mapping (curl, transport,
 * proxies, a refused token) against tiny canned HTTP responders on
 * loopback, watch frame → change conversion, exit statuses.
 * End-to-end behaviour against the real agent is in tests/integration.
 */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "sbx/hashmap.h"
#include "sbx/json.h"
#include "sbx/proto_bulk.h"
#include "sbx/provider.h"
#include "../../providers/remote/premote_fs_i.h"
#include "test_helpers_i.h"

/* ---- a canned HTTP responder ---------------------------------------------- */

struct canned {
	const char *path;     /* request path prefix */
	const char *response; /* raw HTTP response */
	size_t len;           /* its length; 0: strlen (no NUL inside) */
};

struct fake {
	int fd;
	int port;
	const struct canned *table;
	bool silent;          /* accept and never answer (timeouts) */
	bool count_body;      /* after answering, count what still comes */
	pthread_t thread;
	int served;
	size_t body_bytes;    /* with count_body: bytes after the headers */
};

/* Bytes that arrive on `c` within a second, past `already`. */
static size_t drain_for_a_second(int c, size_t already)
{
	struct timeval tv = { .tv_sec = 1 };
	char buf[16384];
	size_t n = already;
	ssize_t r;

	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	while ((r = read(c, buf, sizeof(buf))) > 0)
		n += (size_t)r;
	return n;
}

static void *fake_thread(void *arg)
{
	struct fake *f = arg;

	for (;;) {
		char req[8192];
		size_t n = 0;
		int c = accept(f->fd, NULL, NULL);

		if (c < 0)
			break;
		while (n < sizeof(req) - 1) {
			ssize_t r = read(c, req + n, sizeof(req) - 1 - n);

			if (r <= 0)
				break;
			n += (size_t)r;
			req[n] = '\0';
			if (strstr(req, "\r\n\r\n"))
				break;
		}
		req[n] = '\0';
		if (f->silent) {
			/* Hold the connection open without answering. */
			sleep(2);
			close(c);
			continue;
		}
		const char *sp = strchr(req, ' ');
		const char *ans = "HTTP/1.1 500 Nope\r\nContent-Length: 0\r\n"
				  "Connection: close\r\n\r\n";
		size_t alen = 0;

		for (const struct canned *t = f->table; sp && t && t->path; t++)
			if (!strncmp(sp + 1, t->path, strlen(t->path))) {
				ans = t->response;
				alen = t->len;
				break;
			}
		if (write(c, ans, alen ? alen : strlen(ans)) < 0) {
			/* the client went away */
		}
		if (f->count_body) {
			const char *end = strstr(req, "\r\n\r\n");

			f->body_bytes = drain_for_a_second(
				c, end ? n - (size_t)(end + 4 - req) : 0);
		}
		f->served++;
		close(c);
	}
	return NULL;
}

static void fake_start(struct fake *f, const struct canned *table,
		       bool silent)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t l = sizeof(a);

	memset(f, 0, sizeof(*f));
	f->table = table;
	f->silent = silent;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	f->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(f->fd >= 0);
	assert_int_equal(bind(f->fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(f->fd, 16), 0);
	assert_int_equal(getsockname(f->fd, (struct sockaddr *)&a, &l), 0);
	f->port = ntohs(a.sin_port);
	assert_int_equal(pthread_create(&f->thread, NULL, fake_thread, f), 0);
}

/* Stop serving (the port then refuses connections); idempotent. */
static void fake_stop(struct fake *f)
{
	if (f->fd < 0)
		return;
	/* shutdown() ends the accept() of the thread, which still reads
	 * f->fd: join it before the descriptor is closed and cleared. */
	shutdown(f->fd, SHUT_RDWR);
	pthread_join(f->thread, NULL);
	close(f->fd);
	f->fd = -1;
}

#define AGENT_HDRS                                                             \
	"X-Sbx-Agent: sbx-agent/0.1.0\r\nContent-Type: application/json\r\n"   \
	"Connection: close\r\n"

static const struct canned refusing[] = {
	{"/v1/health", "HTTP/1.1 200 OK\r\n" AGENT_HDRS
		"\r\n"
		       "{\"ok\":true,\"version\":\"0.1.0\",\"protocol\":1}"},
	{"/v1/info", "HTTP/1.1 401 Unauthorized\r\n" AGENT_HDRS
		"\r\n"
		     "{\"error\":{\"errno\":\"EACCES\",\"message\":\"bad token\"}}"},
	{NULL, NULL},
};

static const struct canned proxy503[] = {
	{"/prefix/v1/", "HTTP/1.1 503 Service Unavailable\r\n"
			"Content-Type: text/html\r\nConnection: close\r\n"
		"\r\n"
			"<html><b>no endpoints available</b></html>"},
	{NULL, NULL},
};

static const struct canned errors[] = {
	{"/v1/fs/stat", "HTTP/1.1 404 Not Found\r\n" AGENT_HDRS
		"\r\n"
			"{\"error\":{\"errno\":\"ENOENT\",\"message\":\"a/b: gone\"}}"},
	{NULL, NULL},
};

/* ---- fixtures ------------------------------------------------------------- */

static char *write_token(const char *dir, const char *text)
{
	char *p;

	assert_true(asprintf(&p, "%s/token", dir) > 0);
	th_write(p, text);
	/* Token files open to others are refused (sbx/token.h). */
	assert_int_equal(chmod(p, 0600), 0);
	return p;
}

static cJSON *section(const char *url, const char *token_file)
{
	cJSON *s = cJSON_CreateObject();

	if (url)
		sbx_json_set_str(s, "url", url);
	if (token_file)
		sbx_json_set_str(s, "token_file", token_file);
	return s;
}

/* ---- URLs ------------------------------------------------------------------ */

static void test_url_building(void **state)
{
	char *u, *n = NULL;
	struct sbx_buf q;

	u = premote_url("http://h:8", "/v1/info", NULL);
	assert_string_equal(u, "http://h:8/v1/info");
	free(u);
	/* The Kubernetes pod proxy: the prefix is kept as is. */
	u = premote_url("https://k8s/api/v1/namespaces/ns/pods/p:7070/proxy",
			"/v1/fs/stat", "path=a%2Fb");
	assert_string_equal(u, "https://k8s/api/v1/namespaces/ns/pods/p:7070/"
			       "proxy/v1/fs/stat?path=a%2Fb");
	free(u);
	u = premote_url("http://h", "/v1/health", "");
	assert_string_equal(u, "http://h/v1/health");
	free(u);

	assert_int_equal(premote_url_normalise(&n, "http://h:1/pre/fix///"), 0);
	assert_string_equal(n, "http://h:1/pre/fix");
	free(n);
	assert_int_equal(premote_url_normalise(&n, "https://h"), 0);
	assert_string_equal(n, "https://h");
	free(n);
	assert_int_equal(premote_url_normalise(&n, "ftp://h"), -EINVAL);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, "http://"));
	assert_int_equal(premote_url_normalise(&n, "http:///x"), -EINVAL);
	assert_int_equal(premote_url_normalise(&n, "http://h/?q=1"), -EINVAL);
	assert_null(n);
	sbx_error_clear();

	sbx_buf_init(&q, PREMOTE_QUERY_CAP);
	premote_q_str(&q, "path", "dir with space/ü&x=1");
	premote_q_u64(&q, "offset", 18446744073709551615ull);
	assert_string_equal(sbx_buf_ptr(&q),
			    "path=dir%20with%20space%2F%C3%BC%26x%3D1"
			    "&offset=18446744073709551615");
	sbx_buf_fini(&q);
}

/* ---- configuration ---------------------------------------------------------- */

static void expect_config_error(cJSON *sec, const char *needle)
{
	struct premote_config c;
	int rc = premote_config_parse(&c, sec);

	assert_int_equal(rc, -EINVAL);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	if (!strstr(sbx_error_last()->msg, needle))
		fail_msg("message \"%s\" lacks \"%s\"", sbx_error_last()->msg,
			 needle);
	assert_null(c.url);
	sbx_error_clear();
	cJSON_Delete(sec);
}

static void test_config_validation(void **state)
{
	struct premote_config c;
	cJSON *s;

	expect_config_error(NULL, "--url");
	expect_config_error(section(NULL, "/t"), "\"url\"");
	expect_config_error(section("http://h", NULL), "--token-file");
	expect_config_error(section("gopher://h", "/t"), "http://");
	s = section("http://h", "/t");
	sbx_json_set_str(s, "timeout", "soon");
	expect_config_error(s, "\"timeout\"");
	s = section("http://h", "/t");
	cJSON_AddNumberToObject(s, "timeout", -1);
	expect_config_error(s, "\"timeout\"");
	s = section(NULL, "/t");
	cJSON_AddNumberToObject(s, "url", 3);
	expect_config_error(s, "\"url\"");
	s = section("http://h", "/t");
	sbx_json_set_str(s, "insecure", "yes");
	expect_config_error(s, "\"insecure\"");

	s = section("http://h:9/p/", "/tok");
	assert_int_equal(premote_config_parse(&c, s), 0);
	assert_string_equal(c.url, "http://h:9/p");
	assert_string_equal(c.token_file, "/tok");
	assert_int_equal(c.timeout_ms, 30000);
	assert_int_equal(c.connect_timeout_ms, 10000);
	assert_false(c.insecure);
	premote_config_fini(&c);
	cJSON_AddNumberToObject(s, "timeout", 2.5);
	assert_int_equal(premote_config_parse(&c, s), 0);
	assert_int_equal(c.timeout_ms, 2500);
	assert_int_equal(c.connect_timeout_ms, 2500); /* never above it */
	premote_config_fini(&c);
	cJSON_Delete(s);
}

static void test_token_file(void **state)
{
	char *dir = th_tmpdir(), *p, *tok = NULL, *missing;

	p = write_token(dir, "s3cret  \nsecond line\n");
	assert_int_equal(premote_token_read(&tok, p), 0);
	assert_string_equal(tok, "s3cret");
	free(tok);
	th_write(p, "\n");
	assert_int_equal(premote_token_read(&tok, p), -EINVAL);
	assert_non_null(strstr(sbx_error_last()->msg, "empty"));
	assert_non_null(strstr(sbx_error_last()->msg, p));
	/* The token is not echoed.  (Not "ab": the random part of the
	 * temporary directory's name, in the message, may hold that -- this
	 * check failed 1 run in a few hundred.  '=' is never in it.) */
	th_write(p, "=q=\001cd\n");
	assert_int_equal(premote_token_read(&tok, p), -EINVAL);
	assert_null(strstr(sbx_error_last()->msg, "=q="));
	assert_true(asprintf(&missing, "%s/nope", dir) > 0);
	assert_int_equal(premote_token_read(&tok, missing), -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, missing));
	assert_non_null(strstr(sbx_error_last()->msg, "--token-file"));
	sbx_error_clear();
	free(missing);
	free(p);
	th_rmrf(dir);
	free(dir);
}

/* ---- error mapping ---------------------------------------------------------- */

static void test_errno_mapping(void **state)
{
	assert_int_equal(premote_errno_from_curl(CURLE_OK), 0);
	assert_int_equal(premote_errno_from_curl(CURLE_OPERATION_TIMEDOUT),
			 -ETIMEDOUT);
	assert_int_equal(premote_errno_from_curl(CURLE_COULDNT_CONNECT),
			 -ECONNREFUSED);
	assert_int_equal(premote_errno_from_curl(CURLE_COULDNT_RESOLVE_HOST),
			 -EHOSTUNREACH);
	assert_int_equal(premote_errno_from_curl(CURLE_RECV_ERROR),
			 -ECONNRESET);
	assert_int_equal(premote_errno_from_curl(CURLE_GOT_NOTHING),
			 -ECONNRESET);
	assert_int_equal(premote_errno_from_curl(CURLE_SSL_CONNECT_ERROR),
			 -EIO);
	/* What the mount shows: transport trouble is EIO, timeouts stay. */
	assert_int_equal(premote_fs_errno(-ECONNREFUSED), -EIO);
	assert_int_equal(premote_fs_errno(-ECONNRESET), -EIO);
	assert_int_equal(premote_fs_errno(-EPROTO), -EIO);
	assert_int_equal(premote_fs_errno(-ETIMEDOUT), -ETIMEDOUT);
	assert_int_equal(premote_fs_errno(-ENOENT), -ENOENT);
	assert_true(premote_errno_is_transport(-ECONNRESET));
	assert_false(premote_errno_is_transport(-ENOENT));
}

static struct sbx_provider *remote_provider(const char *url, const char *tf,
					    double timeout)
{
	struct sbx_provider *p = NULL;
	cJSON *s = section(url, tf);

	if (timeout > 0)
		cJSON_AddNumberToObject(s, "timeout", timeout);
	assert_int_equal(sbx_provider_new(&p, "remote", s), 0);
	cJSON_Delete(s);
	return p;
}

/* A remote provider on a fake agent, with its token file in a fresh
 * directory: what the provider-level tests start from. */
struct rfx {
	char *dir, *tf, *url;
	struct fake f;
	struct sbx_provider *p;
};

static struct sbx_provider *rfx_start(struct rfx *x, const char *token,
				      const struct canned *table, bool silent,
				      double timeout)
{
	x->dir = th_tmpdir();
	x->tf = write_token(x->dir, token);
	fake_start(&x->f, table, silent);
	assert_true(asprintf(&x->url, "http://127.0.0.1:%d", x->f.port) > 0);
	x->p = remote_provider(x->url, x->tf, timeout);
	return x->p;
}

static void rfx_stop(struct rfx *x)
{
	sbx_error_clear();
	sbx_provider_free(x->p);
	fake_stop(&x->f);
	free(x->url);
	free(x->tf);
	th_rmrf(x->dir);
	free(x->dir);
}

static void test_unreachable(void **state)
{
	struct sbx_sandbox_info info;
	struct sbx_create_opts co = { .session = "s1" };
	struct rfx x;
	struct sbx_provider *p = rfx_start(&x, "tok\n", NULL, false, 5);
	const char *url = x.url;
	struct sbx_sandbox *sb = NULL;
	int rc;

	/* A port nobody listens on: refused at once. */
	fake_stop(&x.f);
	rc = p->ops->create(p, &co, &info);
	assert_int_equal(rc, -ECONNREFUSED);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_HTTP);
	assert_non_null(strstr(sbx_error_last()->msg,
			       "cannot reach sbx-agent at http://127.0.0.1"));
	assert_non_null(strstr(sbx_error_last()->msg, "is it running?"));
	/* Said once (the transport's words were wrapped again). */
	assert_null(strstr(strstr(sbx_error_last()->msg, "is it running?") + 1,
			   "is it running?"));
	assert_null(strstr(sbx_error_last()->msg, "tok"));
	assert_int_equal(p->ops->open(p, "s1", &sb), -ECONNREFUSED);
	assert_null(sb);
	/* get: an answer, in state ERROR with the reason. */
	sbx_error_clear();
	assert_int_equal(p->ops->get(p, "s1", &info), 0);
	assert_int_equal(info.state, SBX_STATE_ERROR);
	assert_true(info.remote);
	assert_string_equal(info.sandbox_id, url);
	assert_non_null(strstr(sbx_json_str(info.extra, "error"),
			       "is it running?"));
	sbx_sandbox_info_fini(&info);
	/* Nothing to delete; no snapshots. */
	assert_int_equal(p->ops->terminate(p, "s1", 0), 0);
	char *id = (char *)"x";

	assert_int_equal(p->ops->snapshot(p, "s1", "m", &id), -ENOTSUP);
	assert_null(id);
	assert_non_null(strstr(sbx_error_last()->msg, "snapshots"));
	rfx_stop(&x);
}

static void test_timeout_bound(void **state)
{
	struct sbx_sandbox_info info;
	struct sbx_create_opts co = { .session = "s1" };
	struct rfx x;
	struct sbx_provider *p = rfx_start(&x, "tok\n", NULL, true, 0.3);
	struct timespec t0, t1;
	double el;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(p->ops->create(p, &co, &info), -ETIMEDOUT);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	el = (double)(t1.tv_sec - t0.tv_sec) +
	     (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	assert_true(el < 1.5); /* the 0.3 s bound, not a hang */
	assert_non_null(strstr(sbx_error_last()->msg, "in time"));
	rfx_stop(&x);
}

static void test_token_refused(void **state)
{
	struct sbx_sandbox_info info;
	struct sbx_create_opts co = { .session = "s1" };
	struct rfx x;
	struct sbx_provider *p = rfx_start(&x, "wrong\n", refusing, false, 5);

	assert_int_equal(p->ops->create(p, &co, &info), -EACCES);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, "refused the token"));
	assert_non_null(strstr(sbx_error_last()->msg, x.tf));
	assert_null(strstr(sbx_error_last()->msg, "wrong"));
	rfx_stop(&x);
}

/* A client (5 s timeouts) of the canned server f, at its URL + prefix. */
static struct premote_http *client_of(const struct fake *f,
				      const char *prefix)
{
	struct premote_config cfg = { .timeout_ms = 5000,
				      .connect_timeout_ms = 5000 };
	struct premote_http *h = NULL;
	char *url;

	assert_true(asprintf(&url, "http://127.0.0.1:%d%s", f->port, prefix) >
		    0);
	cfg.url = url;
	assert_int_equal(premote_http_new(&h, &cfg, "tok"), 0);
	free(url); /* copied */
	return h;
}

static void test_proxy_and_agent_errors(void **state)
{
	struct premote_http *h;
	struct fake f;
	cJSON *j = NULL;
	int rc;

	/* A proxy (no X-Sbx-Agent) speaking for an unreachable agent. */
	fake_start(&f, proxy503, false);
	h = client_of(&f, "/prefix");
	rc = premote_http_json(h, "GET", "/v1/info", NULL, NULL, true, &j);
	assert_int_equal(rc, -EIO);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_HTTP);
	assert_int_equal(sbx_error_last()->detail, 503);
	assert_non_null(strstr(sbx_error_last()->msg, "a proxy answered"));
	assert_non_null(strstr(sbx_error_last()->msg, "no endpoints"));
	assert_null(strstr(sbx_error_last()->msg, "<b>"));
	assert_null(j);
	premote_http_free(h);
	fake_stop(&f);

	/* The agent's error object: its errno and message. */
	fake_start(&f, errors, false);
	h = client_of(&f, "");
	rc = premote_http_json(h, "GET", "/v1/fs/stat", "path=a%2Fb", NULL,
			       true, &j);
	assert_int_equal(rc, -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_non_null(strstr(sbx_error_last()->msg, "a/b: gone"));
	sbx_error_clear();
	premote_http_free(h);
	fake_stop(&f);
}

/* ---- a streamed upload refused at its headers ------------------------------ */

static const struct canned busy[] = {
	{"/v1/archive", "HTTP/1.1 409 Conflict\r\n" AGENT_HDRS
		"\r\n"
			"{\"error\":{\"errno\":\"ENOTEMPTY\",\"message\":"
			"\"/ is not empty\"}}"},
	{NULL, NULL},
};

struct late_writer {
	int fd;
	pthread_t thread;
};

/* The tar producer is slow (it is still reading objects): nothing for a
 * tenth of a second, then 4 MiB. */
static void *late_writer_run(void *arg)
{
	struct late_writer *w = arg;
	static char chunk[64 * 1024];
	struct timespec pause = { .tv_nsec = 100 * 1000 * 1000 };

	nanosleep(&pause, NULL);
	for (int i = 0; i < 64; i++)
		if (write(w->fd, chunk, sizeof(chunk)) < 0)
			break; /* EPIPE: the client stopped reading */
	close(w->fd);
	return NULL;
}

/*
 * The agent answers a refused upload (a seed into a busy root) as soon as
 * it has the headers, and closes.  The client asks before it sends
 * (Expect: 100-continue): it hears that answer and sends no byte of the
 * body.  Without asking, the body raced the answer, and a send into the
 * closed connection ("Broken pipe") hid the agent's error in CI.
 */
static void test_upload_refused_at_headers(void **state)
{
	struct premote_http *h;
	struct late_writer w;
	struct fake f;
	int fds[2];
	int rc;

	signal(SIGPIPE, SIG_IGN);
	fake_start(&f, busy, false);
	f.count_body = true;
	h = client_of(&f, "");
	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	w.fd = fds[1];
	assert_int_equal(pthread_create(&w.thread, NULL, late_writer_run, &w),
			 0);
	rc = premote_archive_put(h, "", fds[0], false, NULL);
	close(fds[0]);
	pthread_join(w.thread, NULL);
	assert_int_equal(rc, -ENOTEMPTY);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_non_null(strstr(sbx_error_last()->msg, "is not empty"));
	sbx_error_clear();
	premote_http_free(h);
	fake_stop(&f);
	assert_int_equal(f.served, 1);
	assert_int_equal(f.body_bytes, 0);
}

/* ---- watch frames ------------------------------------------------------------ */

static int frame(const char *json, struct sbx_change *c, cJSON **keep)
{
	*keep = cJSON_Parse(json);
	assert_non_null(*keep);
	return premote_change_from_frame(*keep, c);
}

static void test_change_from_frame(void **state)
{
	struct sbx_change c;
	cJSON *j;

	assert_int_equal(frame("{\"seq\":7,\"kind\":\"entry\",\"path\":"
			       "\"src/a.c\"}", &c, &j), 1);
	assert_int_equal(c.kind, SBX_CHANGE_ENTRY);
	assert_int_equal(c.seq, 7);
	assert_string_equal(c.path, "src/a.c");
	assert_string_equal(c.name, "a.c");
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":8,\"kind\":\"entry\",\"path\":\"top\"}",
			       &c, &j), 1);
	assert_string_equal(c.name, "top");
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":9,\"kind\":\"data\",\"path\":\"x/y\"}",
			       &c, &j), 1);
	assert_int_equal(c.kind, SBX_CHANGE_DATA);
	assert_null(c.name);
	assert_string_equal(c.path, "x/y");
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":10,\"kind\":\"attr\",\"path\":\"\"}",
			       &c, &j), 1);
	assert_int_equal(c.kind, SBX_CHANGE_ATTR);
	assert_string_equal(c.path, ""); /* the root */
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":11,\"kind\":\"overflow\"}", &c, &j),
			 1);
	assert_int_equal(c.kind, SBX_CHANGE_OVERFLOW);
	cJSON_Delete(j);
	/* Not changes. */
	assert_int_equal(frame("{\"seq\":3,\"kind\":\"hello\",\"boot_id\":\"b\","
			       "\"watch_seq\":3}", &c, &j), 0);
	cJSON_Delete(j);
	assert_int_equal(frame("{\"kind\":\"heartbeat\",\"watch_seq\":3}", &c,
			       &j), 0);
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":3,\"kind\":\"future\"}", &c, &j), 0);
	cJSON_Delete(j);
	/* Malformed. */
	assert_int_equal(frame("{\"kind\":\"data\",\"path\":\"a\"}", &c, &j),
			 -EPROTO);
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":1,\"kind\":\"entry\",\"path\":\"\"}",
			       &c, &j), -EPROTO);
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":1,\"kind\":\"entry\",\"path\":\"a/\"}",
			       &c, &j), -EPROTO);
	cJSON_Delete(j);
	assert_int_equal(frame("{\"seq\":1,\"kind\":\"data\",\"path\":\"/etc\"}",
			       &c, &j), -EPROTO);
	cJSON_Delete(j);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_PROTO);
	sbx_error_clear();
}

static void test_exit_status(void **state)
{
	cJSON *j;
	int st;

	j = cJSON_Parse("{\"code\":3,\"signal\":0}");
	assert_int_equal(premote_exit_status(j, &st), 0);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 3);
	cJSON_Delete(j);
	j = cJSON_Parse("{\"code\":137,\"signal\":9}");
	assert_int_equal(premote_exit_status(j, &st), 0);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), 9);
	cJSON_Delete(j);
	j = cJSON_Parse("{\"code\":0}");
	assert_int_equal(premote_exit_status(j, &st), 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cJSON_Delete(j);
	j = cJSON_Parse("{\"code\":\"x\"}");
	assert_int_equal(premote_exit_status(j, &st), -EPROTO);
	cJSON_Delete(j);
	j = cJSON_Parse("{\"code\":300}");
	assert_int_equal(premote_exit_status(j, &st), -EPROTO);
	cJSON_Delete(j);
	sbx_error_clear();
}

/* ---- a data plane on a canned agent ------------------------------------------ */

static struct stat mkst(mode_t mode, uint64_t ino, off_t size)
{
	struct stat st;

	memset(&st, 0, sizeof(st));
	st.st_mode = mode;
	st.st_ino = (ino_t)ino;
	st.st_dev = 5;
	st.st_nlink = S_ISDIR(mode) ? 2 : 1;
	st.st_size = size;
	st.st_mtim.tv_sec = 1700000000;
	return st;
}

/* A remote sandbox whose agent is `table` (served by `f`), root ino 1. */
static struct sbx_sandbox *canned_sandbox(struct fake *f,
					  const struct canned *table)
{
	struct premote_config cfg = { .timeout_ms = 5000,
				      .connect_timeout_ms = 5000 };
	struct premote_info info;
	struct premote_http *h = NULL;
	struct sbx_sandbox *sb = NULL;

	fake_start(f, table, false);
	assert_true(asprintf(&cfg.url, "http://127.0.0.1:%d", f->port) > 0);
	assert_int_equal(premote_http_new(&h, &cfg, "tok"), 0);
	memset(&info, 0, sizeof(info));
	info.root = strdup("/srv");
	info.cap_bulk = true;
	info.has_root_st = true;
	info.root_st = mkst(S_IFDIR | 0755, 1, 0);
	assert_int_equal(premote_sandbox_open(&sb, "s1", &cfg, h, &info), 0);
	return sb;
}

static void test_st_dev_from_url(void **state)
{
	static const struct canned none[] = { {NULL, NULL, 0} };
	struct fake f;
	struct sbx_sandbox *sb = canned_sandbox(&f, none);
	struct premote_sandbox *s = PREMOTE_SB(sb);
	uint64_t h = 1469598103934665603ull;
	struct stat st = mkst(S_IFREG | 0644, 42, 0);

	/* The formula st_dev always had (users' tools saw these numbers). */
	for (const char *p = s->cfg.url; *p; p++)
		h = (h ^ (unsigned char)*p) * 1099511628211ull;
	assert_int_equal(s->dev, (dev_t)((mix64(h) & 0xffffffffu) | 1u));
	premote_fix_stat(s, &st);
	assert_int_equal(st.st_dev, s->dev);
	assert_int_equal(st.st_ino, 42);
	sbx_sandbox_free(sb);
	fake_stop(&f);
}

static void test_node_table(void **state)
{
	static const struct canned none[] = { {NULL, NULL, 0} };
	struct fake f;
	struct sbx_sandbox *sb = canned_sandbox(&f, none);
	struct premote_sandbox *s = PREMOTE_SB(sb);
	struct stat d = mkst(S_IFDIR | 0755, 10, 0);
	struct stat r = mkst(S_IFREG | 0644, 11, 0);
	struct stat l = mkst(S_IFREG | 0644, 12, 0);
	struct stat rt = mkst(S_IFDIR | 0755, 1, 0);
	struct premote_node *nd, *nr, *again, *nl, *many[3000];
	char *p;

	/* The root under any name is the root. */
	assert_ptr_equal(premote_node_get(s, "x", &rt), &s->root);
	assert_int_equal(premote_ino_at(s, ""), 1);

	nd = premote_node_get(s, "a", &d);
	nr = premote_node_get(s, "a/f", &r);
	assert_int_equal(premote_ino_at(s, "a"), 10);
	assert_int_equal(premote_ino_at(s, "a/f"), 11);
	assert_int_equal(premote_ino_at(s, "b"), 0);
	/* One node per ino, whatever name it is found under. */
	again = premote_node_get(s, "a", &d);
	assert_ptr_equal(again, nd);
	premote_node_put(s, again);

	/* A directory found under a new name takes its subtree along. */
	again = premote_node_get(s, "b", &d);
	assert_ptr_equal(again, nd);
	premote_node_put(s, again);
	assert_int_equal(premote_ino_at(s, "a"), 0);
	assert_int_equal(premote_ino_at(s, "b/f"), 11);
	p = premote_npath(s, (struct sbx_node *)nr);
	assert_string_equal(p, "b/f");
	free(p);

	/* Two nodes at one path (a stale one): the newest answers. */
	nl = premote_node_get(s, "b/f", &l);
	assert_int_equal(premote_ino_at(s, "b/f"), 12);
	premote_node_put(s, nl);
	assert_int_equal(premote_ino_at(s, "b/f"), 11);

	/* Swap (RENAME_EXCHANGE) through the lock-held mover. */
	nl = premote_node_get(s, "c", &l);
	pthread_mutex_lock(&s->nodes_lock);
	premote_move_locked(s, "b", "c", true);
	pthread_mutex_unlock(&s->nodes_lock);
	assert_int_equal(premote_ino_at(s, "c"), 10);
	assert_int_equal(premote_ino_at(s, "c/f"), 11);
	assert_int_equal(premote_ino_at(s, "b"), 12);

	/* Growth keeps every node findable. */
	for (size_t i = 0; i < 3000; i++) {
		struct stat st = mkst(S_IFREG | 0644, 100 + i, 0);
		char name[32];

		snprintf(name, sizeof(name), "many/%zu", i);
		many[i] = premote_node_get(s, name, &st);
	}
	assert_int_equal(sbx_hashmap_count(&s->by_ino), 3003);
	assert_int_equal(sbx_hashmap_count(&s->by_path), 3003);
	assert_int_equal(premote_ino_at(s, "many/2999"), 3099);
	for (size_t i = 0; i < 3000; i += 2)
		premote_node_put(s, many[i]);
	assert_int_equal(premote_ino_at(s, "many/0"), 0);
	assert_int_equal(premote_ino_at(s, "many/1"), 101);

	/* The references left (odd ones, nd, nr, nl): freed with the
	 * sandbox, as when the daemon exits without forgetting. */
	sbx_sandbox_free(sb);
	fake_stop(&f);
}

struct walk {
	char seen[8][64];
	size_t n;
	size_t nentries[8];
	char data[16];
};

static int walk_cb(const struct sbx_bulk_item *it, void *payload)
{
	struct walk *w = payload;

	assert_true(w->n < 8);
	snprintf(w->seen[w->n], sizeof(w->seen[0]), "%s:%s",
		 it->kind == SBX_BULK_DIR ? "dir" : "file", it->path);
	w->nentries[w->n] = it->nentries;
	if (it->kind == SBX_BULK_FILE)
		snprintf(w->data, sizeof(w->data), "%.*s", (int)it->len,
			 (const char *)it->data);
	w->n++;
	return 0;
}

static void add_frame(struct sbx_buf *b, const struct sbx_bulk_frame *f,
		      const void *data, size_t len)
{
	cJSON *hdr = sbx_bulk_frame_encode(f);

	assert_non_null(hdr);
	assert_int_equal(sbx_frame_encode(b, hdr, data, len), 0);
	cJSON_Delete(hdr);
}

/* A DIR frame for `path` listing n entries (names[i] with sts[i]). */
static void add_dir_frame(struct sbx_buf *b, const char *path,
			  const struct stat *st, size_t n,
			  const char *const *names, const struct stat *sts)
{
	struct sbx_bulk_frame f;
	cJSON *ents = cJSON_CreateArray();

	assert_non_null(ents);
	for (size_t i = 0; i < n; i++)
		cJSON_AddItemToArray(ents,
				     sbx_proto_entry_encode(names[i], &sts[i]));
	memset(&f, 0, sizeof(f));
	f.kind = SBX_BULK_FRAME_DIR;
	f.path = path;
	f.st = *st;
	f.entries = ents;
	add_frame(b, &f, NULL, 0);
	cJSON_Delete(ents);
}

/* The DIR_ERROR frame of an unreadable directory: EACCES. */
static void add_eacces_frame(struct sbx_buf *b, const char *path)
{
	struct sbx_bulk_frame f;

	memset(&f, 0, sizeof(f));
	f.kind = SBX_BULK_FRAME_DIR_ERROR;
	f.path = path;
	f.error = -EACCES;
	f.message = "list locked: Permission denied";
	add_frame(b, &f, NULL, 0);
}

/* The END frame, with the watch sequence number the walk started at. */
static void add_end_frame(struct sbx_buf *b, uint64_t watch_seq)
{
	struct sbx_bulk_frame f;

	memset(&f, 0, sizeof(f));
	f.kind = SBX_BULK_FRAME_END;
	f.watch_seq = watch_seq;
	add_frame(b, &f, NULL, 0);
}

/* An HTTP answer carrying `body` (frames), malloc'd; *len its length. */
static char *frames_answer(struct sbx_buf *body, size_t *len)
{
	char *head, *ans;
	int hl;

	hl = asprintf(&head, "HTTP/1.1 200 OK\r\nX-Sbx-Agent: sbx-agent/0.1.0"
			     "\r\nContent-Type: application/octet-stream\r\n"
			     "Connection: close\r\nContent-Length: %zu\r\n\r\n",
		      sbx_buf_len(body));
	assert_true(hl > 0);
	*len = (size_t)hl + sbx_buf_len(body);
	ans = malloc(*len);
	assert_non_null(ans);
	memcpy(ans, head, (size_t)hl);
	memcpy(ans + hl, sbx_buf_ptr(body), sbx_buf_len(body));
	free(head);
	return ans;
}

/*
 * docs/protocol.md, "Bulk": a subdirectory that cannot be read gives an
 * error frame and the walk goes on.  The client skips that directory (not
 * delivered, so never taken for empty) and delivers the rest; an error
 * frame for the start directory itself is the walk's error.
 */
static void test_bulk_walk_past_unreadable_dir(void **state)
{
	struct stat root = mkst(S_IFDIR | 0755, 1, 0);
	struct stat locked = mkst(S_IFDIR | 0000, 2, 0);
	struct stat z = mkst(S_IFDIR | 0755, 3, 0);
	struct stat zf = mkst(S_IFREG | 0644, 4, 3);
	static const char *const root_names[] = { "locked", "z" };
	static const char *const z_names[] = { "f" };
	const struct stat root_sts[] = { locked, z };
	struct sbx_bulk_opts o = { 0, 0, -1 };
	struct sbx_bulk_frame f;
	struct sbx_buf walk, start;
	struct canned table[3];
	struct fake fk;
	struct walk w;
	char *a1, *a2;
	size_t l1, l2;
	struct sbx_sandbox *sb;

	sbx_buf_init(&walk, SIZE_MAX);
	sbx_buf_init(&start, SIZE_MAX);
	/* The whole tree: "", "locked" (unreadable), "z", "z/f". */
	add_dir_frame(&walk, "", &root, 2, root_names, root_sts);
	add_eacces_frame(&walk, "locked");
	add_dir_frame(&walk, "z", &z, 1, z_names, &zf);
	memset(&f, 0, sizeof(f));
	f.kind = SBX_BULK_FRAME_FILE;
	f.path = "z/f";
	f.st = zf;
	add_frame(&walk, &f, "abc", 3);
	add_end_frame(&walk, 7);
	/* A walk from "locked" itself: its error, then the end. */
	add_eacces_frame(&start, "locked");
	add_end_frame(&start, 0);

	a1 = frames_answer(&walk, &l1);
	a2 = frames_answer(&start, &l2);
	table[0] = (struct canned){ "/v1/fs/bulk?path=locked", a2, l2 };
	table[1] = (struct canned){ "/v1/fs/bulk", a1, l1 };
	table[2] = (struct canned){ NULL, NULL, 0 };
	sb = canned_sandbox(&fk, table);

	memset(&w, 0, sizeof(w));
	assert_int_equal(sb->ops->bulk(sb, "", &o, walk_cb, &w), 0);
	assert_int_equal(w.n, 3);
	assert_string_equal(w.seen[0], "dir:");
	assert_int_equal(w.nentries[0], 2);
	assert_string_equal(w.seen[1], "dir:z");
	assert_int_equal(w.nentries[1], 1);
	assert_string_equal(w.seen[2], "file:z/f");
	assert_string_equal(w.data, "abc");

	memset(&w, 0, sizeof(w));
	assert_int_equal(sb->ops->bulk(sb, "locked", &o, walk_cb, &w),
			 -EACCES);
	assert_int_equal(w.n, 0);
	assert_non_null(strstr(sbx_error_last()->msg, "Permission denied"));
	sbx_error_clear();

	sbx_sandbox_free(sb);
	fake_stop(&fk);
	free(a1);
	free(a2);
	sbx_buf_fini(&walk);
	sbx_buf_fini(&start);
}

static void test_registry(void **state)
{
	const char *const *names = sbx_provider_names();
	struct sbx_provider *p = NULL;
	bool found = false;

	for (size_t i = 0; names[i]; i++)
		found |= !strcmp(names[i], "remote");
	assert_true(found);
	assert_int_equal(sbx_provider_new(&p, "remote", NULL), -EINVAL);
	assert_null(p);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	sbx_error_clear();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_url_building),
		cmocka_unit_test(test_config_validation),
		cmocka_unit_test(test_token_file),
		cmocka_unit_test(test_errno_mapping),
		cmocka_unit_test(test_unreachable),
		cmocka_unit_test(test_timeout_bound),
		cmocka_unit_test(test_token_refused),
		cmocka_unit_test(test_proxy_and_agent_errors),
		cmocka_unit_test(test_upload_refused_at_headers),
		cmocka_unit_test(test_change_from_frame),
		cmocka_unit_test(test_exit_status),
		cmocka_unit_test(test_registry),
		cmocka_unit_test(test_st_dev_from_url),
		cmocka_unit_test(test_node_table),
		cmocka_unit_test(test_bulk_walk_past_unreadable_dir),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
