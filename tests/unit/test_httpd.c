/* Unit tests: lib/httpd.c (the MHD server layer of sbx-agent and serve). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "sbx/httpd.h"
#include "sbx/json.h"
#include "sbx/xmalloc.h"
#include "test_helpers_i.h"

/* An application route struct: the key first, then its own fields. */
struct app_route {
	struct sbx_httpd_route match;
	int tag;
};

static const struct app_route agent_like[] = {
	{ { "GET", "/v1/health" }, 1 },
	{ { "GET", "/v1/exec/*/output" }, 2 },
	{ { "GET", "/v1/exec/*" }, 3 },
	{ { "DELETE", "/v1/exec/*" }, 4 },
};

static const struct sbx_httpd_table agent_table = {
	.routes = agent_like,
	.n = sizeof(agent_like) / sizeof(agent_like[0]),
	.stride = sizeof(agent_like[0]),
	.anchor = "/v1/",
	.flags = SBX_HTTPD_ROUTE_SLASH,
};

static const struct app_route serve_like[] = {
	{ { "GET", "/session" }, 1 },
	{ { "GET", "/session/+/sandbox" }, 2 },
	{ { "POST", "/session/+/sandbox" }, 3 },
};

static const struct sbx_httpd_table serve_table = {
	.routes = serve_like,
	.n = sizeof(serve_like) / sizeof(serve_like[0]),
	.stride = sizeof(serve_like[0]),
};

/* The route's tag, 0 for 404, -1 for 405; *cap gets the capture. */
static int find(const struct sbx_httpd_table *t, const char *method,
		const char *path, char **cap)
{
	size_t i = 99;
	int rc = sbx_httpd_route_find(&i, cap, t, method, path);

	if (rc == -ENOENT)
		return 0;
	if (rc == -EOPNOTSUPP)
		return -1;
	assert_int_equal(rc, 0);
	return ((const struct app_route *)sbx_httpd_route_at(t, i))->tag;
}

static void test_routes(void **state)
{
	char *cap = NULL;

	assert_int_equal(find(&agent_table, "GET", "/v1/health", &cap), 1);
	assert_null(cap);
	/* a trailing '/' and any proxy prefix, even one with "/v1/" */
	assert_int_equal(find(&agent_table, "GET", "/v1/health/", &cap), 1);
	assert_int_equal(find(&agent_table, "GET",
			      "/api/v1/namespaces/x/pods/y:1/proxy/v1/health",
			      &cap),
			 1);
	assert_int_equal(find(&agent_table, "GET", "/v1/exec/ab-1_Z/output",
			      &cap),
			 2);
	assert_string_equal(cap, "ab-1_Z");
	free(cap);
	assert_int_equal(find(&agent_table, "DELETE", "/v1/exec/abc", &cap), 4);
	assert_string_equal(cap, "abc");
	free(cap);
	cap = NULL;
	/* the path is known for other methods: 405; unknown: 404 */
	assert_int_equal(find(&agent_table, "POST", "/v1/health", &cap), -1);
	assert_null(cap);
	assert_int_equal(find(&agent_table, "GET", "/v1/nothing", &cap), 0);
	/* an id has [A-Za-z0-9_-] only, at most 64 bytes */
	assert_int_equal(find(&agent_table, "GET", "/v1/exec/a.b", &cap), 0);
	{
		char path[128];

		snprintf(path, sizeof(path), "/v1/exec/%065d", 1);
		assert_int_equal(find(&agent_table, "GET", path, &cap), 0);
	}

	/* '+' takes any segment; no anchor, no trailing '/' */
	assert_int_equal(find(&serve_table, "GET", "/session/a.b/sandbox",
			      &cap),
			 2);
	assert_string_equal(cap, "a.b");
	free(cap);
	cap = NULL;
	assert_int_equal(find(&serve_table, "GET", "/session/", &cap), 0);
	assert_int_equal(find(&serve_table, "GET", "/x/session", &cap), 0);
	assert_int_equal(find(&serve_table, "GET", "/session//sandbox", &cap),
			 0);
	assert_int_equal(find(&serve_table, "PUT", "/session/a/sandbox", &cap),
			 -1);
	assert_null(cap);
}

static void test_body(void **state)
{
	struct sbx_buf b;
	bool big = false;

	sbx_buf_init(&b, 8);
	assert_int_equal(sbx_httpd_body_add(&b, &big, "1234", 4), 0);
	assert_int_equal(sbx_httpd_body_add(&b, &big, "5678", 4), 0);
	assert_false(big);
	assert_int_equal(sbx_buf_len(&b), 8);
	assert_int_equal(sbx_httpd_body_add(&b, &big, "9", 1), -EFBIG);
	assert_true(big);
	assert_int_equal(sbx_httpd_body_add(&b, &big, "0", 1), -EFBIG);
	sbx_buf_fini(&b);
}

static void test_error_json(void **state)
{
	cJSON *j = sbx_httpd_error_json("type", "NotFoundError", "no such");
	char *s = sbx_json_print(j, false);

	assert_string_equal(
		s, "{\"error\":{\"type\":\"NotFoundError\",\"message\":\"no such\"}}");
	free(s);
	cJSON_Delete(j);
}

/* The application side of a tiny server: hooks over its own request. */
struct app_req {
	struct MHD_Connection *conn;
	char *url;
	struct sbx_buf body;
	bool too_big;
	int *done;
};

static int reply(struct app_req *r, unsigned status, const char *msg)
{
	static const char *const hdrs[] = { "X-Test", "yes", NULL };
	cJSON *o = sbx_httpd_error_json("errno", "ENOENT", msg);
	struct MHD_Response *resp = sbx_httpd_json_response(o);

	cJSON_Delete(o);
	return sbx_httpd_answered(sbx_httpd_queue(r->conn, status, resp,
						  "application/json", hdrs));
}

static int app_begin(void **req_out, void *payload,
		     struct MHD_Connection *conn, const char *method,
		     const char *url)
{
	struct app_req *r = sbx_xcalloc(1, sizeof(*r));

	r->conn = conn;
	r->url = sbx_xstrdup(url);
	r->done = payload;
	sbx_buf_init(&r->body, 16);
	*req_out = r;
	if (!strcmp(url, "/deny"))
		return reply(r, 401, "denied"); /* the body is dropped */
	return SBX_HTTPD_NEXT;
}

static int app_body(void *req, const char *data, size_t len)
{
	struct app_req *r = req;

	if (sbx_httpd_body_add(&r->body, &r->too_big, data, len) < 0)
		sbx_error_clear();
	return SBX_HTTPD_NEXT;
}

static int app_end(void *req)
{
	struct app_req *r = req;
	char msg[64];

	if (r->too_big)
		return reply(r, 413, "too big");
	snprintf(msg, sizeof(msg), "%s %zu", r->url, sbx_buf_len(&r->body));
	return reply(r, 404, msg);
}

static unsigned app_done(void *req, enum MHD_RequestTerminationCode toe)
{
	struct app_req *r = req;

	/* Connection threads end on their own: two may count at once. */
	__atomic_fetch_add(r->done, 1, __ATOMIC_RELAXED);
	sbx_buf_fini(&r->body);
	free(r->url);
	free(r);
	return 404;
}

/* One request to 127.0.0.1:port; the whole answer (the server closes). */
static char *roundtrip(unsigned port, const char *path, const char *body)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	char req[512], *out = sbx_xcalloc(1, 8192);
	size_t got = 0;
	ssize_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	sin.sin_port = htons((uint16_t)port);
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	snprintf(req, sizeof(req),
		 "PUT %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
		 "Content-Length: %zu\r\n\r\n%s",
		 path, strlen(body), body);
	assert_int_equal(write(fd, req, strlen(req)), (ssize_t)strlen(req));
	while (got < 8191 && (n = read(fd, out + got, 8191 - got)) > 0)
		got += (size_t)n;
	close(fd);
	return out;
}

static void test_serve_tcp(void **state)
{
	struct sbx_httpd_addr addr = { { 0 } };
	struct sbx_httpd_opts o = { 0 };
	struct sbx_httpd *h = NULL;
	int lfd = -1, done = 0;
	char *text;

	assert_int_equal(sbx_httpd_listen_tcp(&lfd, &addr, "localhost:0",
					      SBX_HTTPD_LISTEN_NUMERIC |
						      SBX_HTTPD_LISTEN_LOOPBACK |
						      SBX_HTTPD_LISTEN_QUIET),
			 0);
	assert_string_equal(addr.host, "127.0.0.1");
	assert_true(addr.port > 0);
	o.listen_fd = lfd;
	o.conn_timeout_s = 10;
	o.begin = app_begin;
	o.body = app_body;
	o.end = app_end;
	o.done = app_done;
	o.payload = &done;
	assert_int_equal(sbx_httpd_start(&h, &o), 0);
	assert_non_null(sbx_httpd_daemon(h));

	text = roundtrip(addr.port, "/v1/x", "abc");
	assert_non_null(strstr(text, "HTTP/1.1 404"));
	assert_non_null(strstr(text, "X-Test: yes"));
	assert_non_null(strstr(text, "Cache-Control: no-store"));
	assert_non_null(strstr(text, "Content-Type: application/json"));
	assert_non_null(strstr(
		text,
		"{\"error\":{\"errno\":\"ENOENT\",\"message\":\"/v1/x 3\"}}\n"));
	free(text);
	/* over the body cap: the hooks answer at the end */
	text = roundtrip(addr.port, "/big", "0123456789abcdefXYZ");
	assert_non_null(strstr(text, "HTTP/1.1 413"));
	free(text);
	/* answered by `begin`: the body is dropped, `end` never runs */
	text = roundtrip(addr.port, "/deny", "abc");
	assert_non_null(strstr(text, "HTTP/1.1 401"));
	assert_non_null(strstr(text, "denied"));
	free(text);
	sbx_httpd_stop(h);
	sbx_httpd_stop(NULL);
	assert_int_equal(__atomic_load_n(&done, __ATOMIC_RELAXED), 3);
}

static void test_listen_errors(void **state)
{
	char *dir = th_tmpdir();
	char path[4096];
	struct stat st;
	int fd = -1;

	assert_int_equal(sbx_httpd_listen_tcp(&fd, NULL, "nocolon", 0),
			 -EINVAL);
	assert_int_equal(sbx_httpd_listen_tcp(&fd, NULL, ":0",
					      SBX_HTTPD_LISTEN_NUMERIC),
			 -EINVAL);
	assert_int_equal(sbx_httpd_listen_tcp(&fd, NULL, "0.0.0.0:0",
					      SBX_HTTPD_LISTEN_NUMERIC |
						      SBX_HTTPD_LISTEN_LOOPBACK |
						      SBX_HTTPD_LISTEN_QUIET),
			 -EPERM);
	assert_int_equal(fd, -1);
	assert_int_equal(sbx_httpd_listen_unix(&fd, "", 0), -ENAMETOOLONG);

	/* a private socket; a stale one is replaced */
	snprintf(path, sizeof(path), "%s/s.sock", dir);
	assert_int_equal(sbx_httpd_listen_unix(&fd, path,
					       SBX_HTTPD_LISTEN_PRIVATE |
						       SBX_HTTPD_LISTEN_QUIET),
			 0);
	close(fd);
	assert_int_equal(lstat(path, &st), 0);
	assert_int_equal(st.st_mode & 077, 0);
	assert_int_equal(sbx_httpd_listen_unix(&fd, path,
					       SBX_HTTPD_LISTEN_QUIET), 0);
	close(fd);
	th_rmrf(dir);
	free(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_routes),
		cmocka_unit_test(test_body),
		cmocka_unit_test(test_error_json),
		cmocka_unit_test(test_serve_tcp),
		cmocka_unit_test(test_listen_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
