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
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
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

#include "sbx/json.h"
#include "sbx/provider.h"
#include "../../providers/remote/premote_i.h"
#include "test_helpers_i.h"

/* ---- a canned HTTP responder ---------------------------------------------- */

struct canned {
	const char *path;     /* request path prefix */
	const char *response; /* raw HTTP response */
};

struct fake {
	int fd;
	int port;
	const struct canned *table;
	bool silent;          /* accept and never answer (timeouts) */
	pthread_t thread;
	int served;
};

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

		for (const struct canned *t = f->table; sp && t && t->path; t++)
			if (!strncmp(sp + 1, t->path, strlen(t->path))) {
				ans = t->response;
				break;
			}
		if (write(c, ans, strlen(ans)) < 0) {
			/* the client went away */
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

static void fake_stop(struct fake *f)
{
	shutdown(f->fd, SHUT_RDWR);
	close(f->fd);
	pthread_join(f->thread, NULL);
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
	th_write(p, "ab\001cd\n");
	assert_int_equal(premote_token_read(&tok, p), -EINVAL);
	assert_null(strstr(sbx_error_last()->msg, "ab"));
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

static void test_unreachable(void **state)
{
	char *dir = th_tmpdir(), *tf = write_token(dir, "tok\n"), *url;
	struct sbx_sandbox_info info;
	struct sbx_create_opts co = { .session = "s1" };
	struct sbx_provider *p;
	struct sbx_sandbox *sb = NULL;
	struct fake f;
	int rc;

	/* A port nobody listens on: refused at once. */
	fake_start(&f, NULL, false);
	fake_stop(&f);
	assert_true(asprintf(&url, "http://127.0.0.1:%d", f.port) > 0);
	p = remote_provider(url, tf, 5);
	rc = p->ops->create(p, &co, &info);
	assert_int_equal(rc, -ECONNREFUSED);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_HTTP);
	assert_non_null(strstr(sbx_error_last()->msg,
			       "cannot reach sbx-agent at http://127.0.0.1"));
	assert_non_null(strstr(sbx_error_last()->msg, "is it running?"));
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
	sbx_error_clear();
	sbx_provider_free(p);
	free(url);
	free(tf);
	th_rmrf(dir);
	free(dir);
}

static void test_timeout_bound(void **state)
{
	char *dir = th_tmpdir(), *tf = write_token(dir, "tok\n"), *url;
	struct sbx_sandbox_info info;
	struct sbx_create_opts co = { .session = "s1" };
	struct sbx_provider *p;
	struct timespec t0, t1;
	struct fake f;
	double el;

	fake_start(&f, NULL, true);
	assert_true(asprintf(&url, "http://127.0.0.1:%d", f.port) > 0);
	p = remote_provider(url, tf, 0.3);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(p->ops->create(p, &co, &info), -ETIMEDOUT);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	el = (double)(t1.tv_sec - t0.tv_sec) +
	     (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	assert_true(el < 1.5); /* the 0.3 s bound, not a hang */
	assert_non_null(strstr(sbx_error_last()->msg, "in time"));
	sbx_error_clear();
	sbx_provider_free(p);
	fake_stop(&f);
	free(url);
	free(tf);
	th_rmrf(dir);
	free(dir);
}

static void test_token_refused(void **state)
{
	char *dir = th_tmpdir(), *tf = write_token(dir, "wrong\n"), *url;
	struct sbx_sandbox_info info;
	struct sbx_create_opts co = { .session = "s1" };
	struct sbx_provider *p;
	struct fake f;

	fake_start(&f, refusing, false);
	assert_true(asprintf(&url, "http://127.0.0.1:%d", f.port) > 0);
	p = remote_provider(url, tf, 5);
	assert_int_equal(p->ops->create(p, &co, &info), -EACCES);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_CONFIG);
	assert_non_null(strstr(sbx_error_last()->msg, "refused the token"));
	assert_non_null(strstr(sbx_error_last()->msg, tf));
	assert_null(strstr(sbx_error_last()->msg, "wrong"));
	sbx_error_clear();
	sbx_provider_free(p);
	fake_stop(&f);
	free(url);
	free(tf);
	th_rmrf(dir);
	free(dir);
}

static void test_proxy_and_agent_errors(void **state)
{
	struct premote_config cfg = { .timeout_ms = 5000,
				      .connect_timeout_ms = 5000 };
	struct premote_http *h = NULL;
	struct fake f;
	cJSON *j = NULL;
	char *url;
	int rc;

	/* A proxy (no X-Sbx-Agent) speaking for an unreachable agent. */
	fake_start(&f, proxy503, false);
	assert_true(asprintf(&url, "http://127.0.0.1:%d/prefix", f.port) > 0);
	cfg.url = url;
	assert_int_equal(premote_http_new(&h, &cfg, "tok"), 0);
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
	free(url);

	/* The agent's error object: its errno and message. */
	fake_start(&f, errors, false);
	assert_true(asprintf(&url, "http://127.0.0.1:%d", f.port) > 0);
	cfg.url = url;
	assert_int_equal(premote_http_new(&h, &cfg, "tok"), 0);
	rc = premote_http_json(h, "GET", "/v1/fs/stat", "path=a%2Fb", NULL,
			       true, &j);
	assert_int_equal(rc, -ENOENT);
	assert_int_equal(sbx_error_last()->klass, SBX_ERR_REMOTE);
	assert_non_null(strstr(sbx_error_last()->msg, "a/b: gone"));
	sbx_error_clear();
	premote_http_free(h);
	fake_stop(&f);
	free(url);
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
		cmocka_unit_test(test_change_from_frame),
		cmocka_unit_test(test_exit_status),
		cmocka_unit_test(test_registry),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
